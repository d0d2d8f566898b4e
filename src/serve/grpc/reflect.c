/*
 * reflect.c - gRPC server reflection (grpc.reflection.v1 and v1alpha, same
 * messages): list_services, file_by_filename and file_containing_symbol,
 * answered from the FileDescriptorSet of Kiln's published schemas
 * (src/import/proto/api/, compiled by protoc --descriptor_set_out at build
 * time and embedded as kiln_grpc_descriptor_set, see cmake/embed.cmake).
 *
 * The set is indexed once: each file's serialized FileDescriptorProto, its
 * dependencies, and the fully qualified names it defines (messages, nested
 * messages, enums, services and their methods), read with a small wire-format
 * walker. A file is answered with its transitive dependencies, as gRPC's own
 * reflection service answers, so a client can build its descriptor pool from
 * one response. Requests come from clients: they are checked with
 * kiln_pb_check and fuzzed with the HTTP/2 frames (fuzz/fuzz_grpc_frames.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln_util.h"
#include "serve/grpc/call.h"

#include "grpc_service.pb-c.h"

extern const unsigned char kiln_grpc_descriptor_set[];
extern const size_t kiln_grpc_descriptor_set_len;

#define MAX_FILES 64
#define MAX_SYMBOLS 1024
#define MAX_DEPS 16

typedef struct desc_file {
    char name[128];
    const uint8_t *p;       /* serialized FileDescriptorProto (in the embedded set) */
    size_t len;
    int deps[MAX_DEPS];     /* indices of imported files */
    int n_deps;
} desc_file;

typedef struct desc_symbol {
    char name[160];         /* "tensorflow.serving.PredictRequest" */
    int file;
} desc_symbol;

static desc_file files[MAX_FILES];
static int n_files;
static desc_symbol symbols[MAX_SYMBOLS];
static int n_symbols;
static pthread_once_t index_once = PTHREAD_ONCE_INIT;

static const char *const services[] = {
    "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService",
    "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
};

/* ------------------------------------------------------------ wire walker */

typedef struct field {
    uint32_t num;
    int wire;
    uint64_t v;             /* varint value */
    const uint8_t *p;       /* length-delimited bytes */
    size_t len;
} field;

static int varint(const uint8_t *p, size_t n, size_t *pos, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && *pos < n; shift += 7) {
        uint8_t b = p[(*pos)++];
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 1;
        }
    }
    return 0;
}

/* Next field of p[0..n) at *pos; 0 at the end or on malformed bytes. */
static int next_field(const uint8_t *p, size_t n, size_t *pos, field *f)
{
    uint64_t key;
    if (*pos >= n || !varint(p, n, pos, &key)) return 0;
    f->num = (uint32_t)(key >> 3);
    f->wire = (int)(key & 7);
    switch (f->wire) {
    case 0: return varint(p, n, pos, &f->v);
    case 1: if (n - *pos < 8) return 0; *pos += 8; return 1;
    case 5: if (n - *pos < 4) return 0; *pos += 4; return 1;
    case 2: {
        uint64_t len;
        if (!varint(p, n, pos, &len) || len > n - *pos) return 0;
        f->p = p + *pos;
        f->len = (size_t)len;
        *pos += (size_t)len;
        return 1;
    }
    default: return 0;
    }
}

static void copy_str(char *dst, size_t cap, const uint8_t *p, size_t len)
{
    if (len >= cap) len = cap - 1;
    memcpy(dst, p, len);
    dst[len] = '\0';
}

static void add_symbol(const char *prefix, const uint8_t *name, size_t len, int file, char *out, size_t cap)
{
    char local[128];
    copy_str(local, sizeof local, name, len);
    if (snprintf(out, cap, "%s%s%s", prefix, prefix[0] ? "." : "", local) >= (int)cap)
        out[cap - 1] = '\0'; /* a longer name is cut; descriptors here are Kiln's own */
    if (n_symbols < MAX_SYMBOLS) {
        snprintf(symbols[n_symbols].name, sizeof symbols[n_symbols].name, "%s", out);
        symbols[n_symbols++].file = file;
    }
}

/* Name field (1) of a message. */
static int name_of(const uint8_t *p, size_t n, const uint8_t **name, size_t *len)
{
    size_t pos = 0;
    field f = {0};
    while (next_field(p, n, &pos, &f))
        if (f.num == 1 && f.wire == 2) {
            *name = f.p;
            *len = f.len;
            return 1;
        }
    return 0;
}

/* DescriptorProto: the message, its nested messages (3) and enums (4). */
static void index_message(const uint8_t *p, size_t n, const char *prefix, int file, int depth)
{
    const uint8_t *name;
    size_t len;
    char full[160];
    if (depth > 8 || !name_of(p, n, &name, &len)) return;
    add_symbol(prefix, name, len, file, full, sizeof full);
    size_t pos = 0;
    field f = {0};
    while (next_field(p, n, &pos, &f)) {
        if (f.wire != 2) continue;
        if (f.num == 3) index_message(f.p, f.len, full, file, depth + 1);
        else if (f.num == 4 && name_of(f.p, f.len, &name, &len)) {
            char e[160];
            add_symbol(full, name, len, file, e, sizeof e);
        }
    }
}

static void build_index(void)
{
    const uint8_t *set = kiln_grpc_descriptor_set;
    size_t n = kiln_grpc_descriptor_set_len, pos = 0;
    field f = {0};
    while (next_field(set, n, &pos, &f) && n_files < MAX_FILES) {
        if (f.num != 1 || f.wire != 2) continue;
        desc_file *df = &files[n_files];
        df->p = f.p;
        df->len = f.len;
        char package[128] = "";
        size_t fp = 0;
        field g;
        /* name and package first: symbols need the package */
        while (next_field(f.p, f.len, &fp, &g)) {
            if (g.num == 1 && g.wire == 2) copy_str(df->name, sizeof df->name, g.p, g.len);
            if (g.num == 2 && g.wire == 2) copy_str(package, sizeof package, g.p, g.len);
        }
        fp = 0;
        while (next_field(f.p, f.len, &fp, &g)) {
            if (g.wire != 2) continue;
            const uint8_t *name;
            size_t len;
            char full[160];
            if (g.num == 4) {
                index_message(g.p, g.len, package, n_files, 0);
            } else if (g.num == 5 && name_of(g.p, g.len, &name, &len)) {
                add_symbol(package, name, len, n_files, full, sizeof full);
            } else if (g.num == 6 && name_of(g.p, g.len, &name, &len)) {
                add_symbol(package, name, len, n_files, full, sizeof full);
                size_t sp = 0;
                field m;
                while (next_field(g.p, g.len, &sp, &m))
                    if (m.num == 2 && m.wire == 2 && name_of(m.p, m.len, &name, &len)) {
                        char method[160];
                        add_symbol(full, name, len, n_files, method, sizeof method);
                    }
            }
        }
        n_files++;
    }
    /* dependencies (3), by name; protoc writes imports before importers */
    for (int i = 0; i < n_files; i++) {
        size_t fp = 0;
        field g;
        while (next_field(files[i].p, files[i].len, &fp, &g)) {
            if (g.num != 3 || g.wire != 2) continue;
            char dep[128];
            copy_str(dep, sizeof dep, g.p, g.len);
            for (int k = 0; k < n_files; k++)
                if (strcmp(files[k].name, dep) == 0 && files[i].n_deps < MAX_DEPS)
                    files[i].deps[files[i].n_deps++] = k;
        }
    }
}

/* Mark file i and its transitive dependencies in want[]. */
static void want_file(int i, int *want, int depth)
{
    if (want[i] || depth > MAX_FILES) return;
    want[i] = 1;
    for (int k = 0; k < files[i].n_deps; k++) want_file(files[i].deps[k], want, depth + 1);
}

/* ------------------------------------------------------------ requests */

void kiln_grpc_reflect(const uint8_t *req, size_t n, kiln_bytes *out)
{
    pthread_once(&index_once, build_index);
    KilnGrpc__ServerReflectionResponse resp = KILN_GRPC__SERVER_REFLECTION_RESPONSE__INIT;
    KilnGrpc__ErrorResponse er = KILN_GRPC__ERROR_RESPONSE__INIT;
    KilnGrpc__ListServiceResponse ls = KILN_GRPC__LIST_SERVICE_RESPONSE__INIT;
    KilnGrpc__ServiceResponse sr[sizeof services / sizeof services[0]];
    KilnGrpc__ServiceResponse *srp[sizeof services / sizeof services[0]];
    KilnGrpc__FileDescriptorResponse fd = KILN_GRPC__FILE_DESCRIPTOR_RESPONSE__INIT;
    KilnGrpc__ExtensionNumberResponse ext = KILN_GRPC__EXTENSION_NUMBER_RESPONSE__INIT;
    ProtobufCBinaryData blobs[MAX_FILES];
    int want[MAX_FILES] = {0};
    char msg[300];
    KilnGrpc__ServerReflectionRequest *r = NULL;
    if (kiln_pb_check(&kiln_grpc__server_reflection_request__descriptor, req, n, 8,
                      "ServerReflectionRequest") == KILN_OK)
        r = kiln_grpc__server_reflection_request__unpack(NULL, n, req);
    int file = -1;
    if (!r) {
        er.has_error_code = 1;
        er.error_code = KILN_GRPC_INVALID_ARGUMENT;
        er.error_message = "cannot parse ServerReflectionRequest";
        resp.message_response_case = KILN_GRPC__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
        resp.error_response = &er;
    } else {
        resp.valid_host = r->host;
        resp.original_request = r;
        switch (r->message_request_case) {
        case KILN_GRPC__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
            for (size_t i = 0; i < sizeof services / sizeof services[0]; i++) {
                kiln_grpc__service_response__init(&sr[i]);
                sr[i].name = (char *)services[i];
                srp[i] = &sr[i];
            }
            ls.n_service = sizeof services / sizeof services[0];
            ls.service = srp;
            resp.message_response_case =
                KILN_GRPC__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
            resp.list_services_response = &ls;
            break;
        case KILN_GRPC__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
            for (int i = 0; i < n_files; i++)
                if (strcmp(files[i].name, r->file_by_filename) == 0) file = i;
            if (file < 0) snprintf(msg, sizeof msg, "File not found: %.200s", r->file_by_filename);
            break;
        case KILN_GRPC__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
            for (int i = 0; i < n_symbols; i++)
                if (strcmp(symbols[i].name, r->file_containing_symbol) == 0) file = symbols[i].file;
            if (file < 0) snprintf(msg, sizeof msg, "Symbol not found: %.200s", r->file_containing_symbol);
            break;
        case KILN_GRPC__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
            /* Kiln's schemas declare no extensions */
            ext.base_type_name = r->all_extension_numbers_of_type;
            resp.message_response_case =
                KILN_GRPC__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ALL_EXTENSION_NUMBERS_RESPONSE;
            resp.all_extension_numbers_response = &ext;
            break;
        default:
            snprintf(msg, sizeof msg, "Extension not found");
            break;
        }
        if (file >= 0) {
            want_file(file, want, 0);
            /* the requested file first, then its dependencies */
            blobs[0].data = (uint8_t *)files[file].p;
            blobs[0].len = files[file].len;
            size_t nb = 1;
            for (int i = 0; i < n_files; i++)
                if (want[i] && i != file) {
                    blobs[nb].data = (uint8_t *)files[i].p;
                    blobs[nb++].len = files[i].len;
                }
            fd.n_file_descriptor_proto = nb;
            fd.file_descriptor_proto = blobs;
            resp.message_response_case =
                KILN_GRPC__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
            resp.file_descriptor_response = &fd;
        } else if (resp.message_response_case ==
                   KILN_GRPC__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE__NOT_SET) {
            er.has_error_code = 1;
            er.error_code = KILN_GRPC_NOT_FOUND;
            er.error_message = msg;
            resp.message_response_case = KILN_GRPC__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
            resp.error_response = &er;
        }
    }
    size_t len = protobuf_c_message_get_packed_size(&resp.base);
    out->len = 0;
    kiln_bytes_reserve(out, len ? len : 1);
    if (!out->oom) out->len = protobuf_c_message_pack(&resp.base, out->p);
    if (r) kiln_grpc__server_reflection_request__free_unpacked(r, NULL);
}
