/*
 * onnx_import.c - ONNX ModelProto to Kiln IR.
 *
 * The file's bytes are first walked by kiln_pb_check (framing and nesting
 * depth), then parsed by protobuf-c into the schema in proto/onnx.proto.
 * The parsed message is kept alive with the model: initializers stored as
 * little-endian raw_data are used in place (the parse is the one copy), and
 * external data files are mapped, not read. Every value of the file is
 * checked before use; errors name the node, tensor or field.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "import/model.h"
#include "import/pbcheck.h"
#include "kernels/kernel.h"
#include "onnx.pb-c.h"

#define ONNX_MAX_PROTO_DEPTH 256 /* message nesting; ~80 levels of nested graphs */
#define ONNX_MAX_MODEL_BYTES ((size_t)1 << 31)

/* ---- dtypes ---- */

static const char *onnx_dtype_code_name(int64_t code)
{
    switch (code) {
    case 0: return "UNDEFINED";
    case 14: return "COMPLEX64";
    case 15: return "COMPLEX128";
    case 17: return "FLOAT8E4M3FN";
    case 18: return "FLOAT8E4M3FNUZ";
    case 19: return "FLOAT8E5M2";
    case 20: return "FLOAT8E5M2FNUZ";
    case 21: return "UINT4";
    case 22: return "INT4";
    case 23: return "FLOAT4E2M1";
    case 24: return "FLOAT8E8M0";
    case 25: return "UINT2";
    case 26: return "INT2";
    default: return NULL;
    }
}

/* Map a dtype code or explain why not. what names the tensor or value. */
static kiln_status map_dtype(int64_t code, const char *what, kiln_dtype *out)
{
    kiln_dtype dt = kiln_onnx_dtype(code);
    if (dt != KILN_DTYPE_UNDEFINED) {
        *out = dt;
        return KILN_OK;
    }
    const char *name = onnx_dtype_code_name(code);
    if (name && code != 0)
        return kiln_error(KILN_ERR_UNSUPPORTED, "'%s': data type %s (%lld) is not supported by Kiln",
                          what, name, (long long)code);
    return kiln_error(KILN_ERR_INVALID_MODEL, "'%s': data_type %lld is not a valid ONNX data type",
                      what, (long long)code);
}

/* ---- import context ---- */

struct name_map {
    char **keys;
    int *vals;
    size_t cap, n;
};

/* Copies of misaligned weights at least this big are reloadable (see
 * kiln_weight_cache_add_reloadable); smaller ones are not worth tracking.
 * KILN_RELOAD_MIN_BYTES in the environment overrides it (the fuzz target
 * lowers it so that small inputs exercise reloading). */
static size_t reloadable_min_bytes(void)
{
    const char *e = getenv("KILN_RELOAD_MIN_BYTES"); /* read per load: models load concurrently */
    long long v = e ? atoll(e) : 0;
    return v > 0 ? (size_t)v : 16384;
}

struct onnx_ctx {
    struct kiln_model *m;
    const unsigned char *file;  /* the mapped model file, when raw_data lies in it */
    size_t file_size;
    bool in_place;              /* tensors may borrow from file (it outlives the model) */
    bool file_used;             /* some tensor borrows from the mapping */
    bool file_mapped;           /* file is a kept mmap (not read into memory): copies of
                                   its weights can be dropped and copied again */
    const void *copy_src;       /* set by tensor_from_proto: the mapped bytes its tensor
                                   is a reloadable copy of, else NULL */
    const char *dir;           /* external data folder, or NULL */
    int dir_fd;                /* open folder for openat, -1 if none */
    int64_t opset_onnx;        /* ai.onnx opset version */
    int depth;                 /* graph nesting */
};

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}

static void map_free(struct name_map *mp)
{
    free(mp->keys);
    free(mp->vals);
    memset(mp, 0, sizeof *mp);
}

static int map_get(const struct name_map *mp, const char *k)
{
    if (!mp->cap) return -1;
    size_t i = hash_str(k) & (mp->cap - 1);
    while (mp->keys[i]) {
        if (strcmp(mp->keys[i], k) == 0) return mp->vals[i];
        i = (i + 1) & (mp->cap - 1);
    }
    return -1;
}

/* Insert or overwrite. Keys are arena strings (not copied). */
static kiln_status map_put(struct name_map *mp, char *k, int v)
{
    if ((mp->n + 1) * 2 > mp->cap) {
        size_t cap = mp->cap ? mp->cap * 2 : 64;
        char **keys = calloc(cap, sizeof *keys);
        int *vals = calloc(cap, sizeof *vals);
        if (!keys || !vals) {
            free(keys);
            free(vals);
            return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory building the name map");
        }
        for (size_t i = 0; i < mp->cap; i++) {
            if (!mp->keys[i]) continue;
            size_t j = hash_str(mp->keys[i]) & (cap - 1);
            while (keys[j]) j = (j + 1) & (cap - 1);
            keys[j] = mp->keys[i];
            vals[j] = mp->vals[i];
        }
        free(mp->keys);
        free(mp->vals);
        mp->keys = keys;
        mp->vals = vals;
        mp->cap = cap;
    }
    size_t i = hash_str(k) & (mp->cap - 1);
    while (mp->keys[i]) {
        if (strcmp(mp->keys[i], k) == 0) {
            mp->vals[i] = v;
            return KILN_OK;
        }
        i = (i + 1) & (mp->cap - 1);
    }
    mp->keys[i] = k;
    mp->vals[i] = v;
    mp->n++;
    return KILN_OK;
}

/* Per-graph import scope: the graph and its name map, linked to the parent's. */
struct scope {
    struct kiln_graph *g;
    struct name_map names;
    struct scope *parent;
};

/* Find a name in this scope or an enclosing one; an enclosing value becomes
 * an OUTER capture in every scope in between. -1 if not found. */
static kiln_status scope_resolve(struct scope *s, const char *name, int *id)
{
    int v = map_get(&s->names, name);
    if (v >= 0) {
        *id = v;
        return KILN_OK;
    }
    if (!s->parent) {
        *id = -1;
        return KILN_OK;
    }
    int pv;
    kiln_status st = scope_resolve(s->parent, name, &pv);
    if (st != KILN_OK || pv < 0) {
        *id = -1;
        return st;
    }
    st = kiln_graph_value_add(s->g, name, KILN_VALUE_OUTER, &v);
    if (st != KILN_OK) return st;
    s->g->values[v].outer = pv;
    s->g->values[v].type = s->parent->g->values[pv].type;
    st = map_put(&s->names, (char *)s->g->values[v].name, v);
    *id = v;
    return st;
}

/* ---- tensors ---- */

/* Check a path from external_data 'location' and open it inside dir. */
static kiln_status open_external(struct onnx_ctx *c, const char *tname, const char *loc, int *fd_out)
{
    if (c->dir_fd < 0)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "tensor '%s': external data '%s' cannot be used for a model loaded from "
                          "memory",
                          tname, loc);
    if (loc[0] == '\0')
        return kiln_error(KILN_ERR_INVALID_MODEL, "tensor '%s': external data location is empty",
                          tname);
    if (loc[0] == '/')
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "tensor '%s': external data location '%s' is an absolute path; only "
                          "paths inside the model's folder are allowed",
                          tname, loc);
    /* reject any '..' component and backslash tricks */
    const char *p = loc;
    while (*p) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "tensor '%s': external data location '%s' contains '..'; only "
                              "paths inside the model's folder are allowed",
                              tname, loc);
        if (!e) break;
        p = e + 1;
    }
    if (strchr(loc, '\\'))
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "tensor '%s': external data location '%s' contains a backslash", tname,
                          loc);
    /* O_NONBLOCK: a FIFO planted as "data" must not block the load */
    int fd = openat(c->dir_fd, loc, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "tensor '%s': cannot open external data '%s' in '%s': %s", tname, loc,
                          c->dir, strerror(errno));
    /* the file opened must lie inside the model folder even through symlinks:
     * compare the real path of what we opened with the folder's real path */
    char proc[64], real[PATH_MAX], realdir[PATH_MAX];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(proc, real, sizeof real - 1);
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", c->dir_fd);
    ssize_t nd = readlink(proc, realdir, sizeof realdir - 1);
    if (n < 0 || nd < 0) {
        close(fd);
        return kiln_error(KILN_ERR_IO, "tensor '%s': cannot resolve external data '%s'", tname,
                          loc);
    }
    real[n] = '\0';
    realdir[nd] = '\0';
    size_t ld = strlen(realdir);
    bool inside = strncmp(real, realdir, ld) == 0 && (real[ld] == '/' || (ld == 1 && realdir[0] == '/'));
    if (!inside) {
        close(fd);
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "tensor '%s': external data '%s' resolves to '%s', outside the model's "
                          "folder '%s'",
                          tname, loc, real, realdir);
    }
    *fd_out = fd;
    return KILN_OK;
}

static kiln_status parse_i64(const char *tname, const char *key, const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < 0)
        return kiln_error(KILN_ERR_INVALID_MODEL, "tensor '%s': external data %s '%s' is not a "
                          "non-negative integer", tname, key, s);
    *out = v;
    return KILN_OK;
}

/* Bits per element of the types ONNX packs several to a byte (low bits
 * first), else 0. Kiln keeps them one per byte. */
static int packed_bits(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_U4: case KILN_DTYPE_I4: case KILN_DTYPE_F4E2M1: return 4;
    case KILN_DTYPE_U2: case KILN_DTYPE_I2: return 2;
    default: return 0;
    }
}

/* Unpack t's elements from packed bytes: bytes[k], or the low byte of
 * words[k] (int32_data holds one packed byte per entry). */
static void unpack_elems(kiln_tensor *t, const uint8_t *bytes, const int32_t *words)
{
    int bits = packed_bits(t->dtype), per = 8 / bits;
    int64_t n = kiln_tensor_count(t);
    for (int64_t i = 0; i < n; i++) {
        uint8_t b = bytes ? bytes[i / per] : (uint8_t)words[i / per];
        int64_t v = (b >> (i % per * bits)) & ((1 << bits) - 1);
        if (t->dtype == KILN_DTYPE_F4E2M1) ((uint8_t *)t->data)[i] = (uint8_t)v; /* the bits */
        else kiln_set_i64(t->dtype, t->data, i, v); /* sign-extends int4 / int2 */
    }
}

/* Make a tensor from external data: everything about the reference is
 * checked before anything the shape asks for is allocated; aligned data is
 * used in place (the model keeps the mapping), the rest is copied once. */
static kiln_status load_external(struct onnx_ctx *c, const KilnOnnx__TensorProto *tp,
                                 const char *tname, kiln_dtype dt, int rank, const int64_t *dims,
                                 size_t need, kiln_tensor **out)
{
    const char *loc = NULL;
    int64_t offset = 0, length = -1;
    kiln_status st;
    for (size_t i = 0; i < tp->n_external_data; i++) {
        const KilnOnnx__StringStringEntryProto *e = tp->external_data[i];
        if (!e->key || !e->value) continue;
        if (strcmp(e->key, "location") == 0) loc = e->value;
        else if (strcmp(e->key, "offset") == 0) {
            if ((st = parse_i64(tname, "offset", e->value, &offset)) != KILN_OK) return st;
        } else if (strcmp(e->key, "length") == 0) {
            if ((st = parse_i64(tname, "length", e->value, &length)) != KILN_OK) return st;
        }
    }
    if (!loc)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "tensor '%s': data_location is EXTERNAL but no 'location' is given",
                          tname);
    if (dt == KILN_DTYPE_STRING)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "tensor '%s': string tensors cannot use external data", tname);
    if (length >= 0 && (uint64_t)length != need)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "tensor '%s': external data length %lld does not match the %zu bytes "
                          "its shape needs",
                          tname, (long long)length, need);
    int fd;
    if ((st = open_external(c, tname, loc, &fd)) != KILN_OK) return st;
    struct kiln_file_map map;
    st = kiln_file_map_fd(fd, loc, &map);
    close(fd);
    if (st != KILN_OK) return kiln_error_wrap(st, "tensor '%s'", tname);
    if ((uint64_t)offset > map.size || need > map.size - (size_t)offset) {
        kiln_file_unmap(&map);
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "tensor '%s': external data '%s' has %zu bytes; offset %lld + %zu "
                          "bytes runs past its end",
                          tname, loc, map.size, (long long)offset, need);
    }
    const unsigned char *src = (const unsigned char *)map.data + offset;
    size_t es = kiln_dtype_size(dt);
    if (!packed_bits(dt) && need > 0 && ((uintptr_t)src % es) == 0) {
        /* zero copy: the tensor borrows the mapping, which the model keeps */
        st = kiln_tensor_wrap(dt, rank, dims, (void *)src, need, out);
        if (st == KILN_OK) st = kiln_model_keep_map(c->m, &map);
        else kiln_file_unmap(&map);
        return st;
    }
    kiln_tensor *t;
    st = packed_bits(dt) ? kiln_tensor_new(dt, rank, dims, &t)
                         : kiln_tensor_new_uninit(dt, rank, dims, &t);
    if (st == KILN_OK) {
        if (packed_bits(dt)) unpack_elems(t, src, NULL);
        else if (need) memcpy(t->data, src, need);
        *out = t;
    }
    kiln_file_unmap(&map);
    return st;
}


/* Convert a TensorProto. If the tensor's bytes can be used in place (raw_data
 * of the parsed message) the tensor borrows them; the message must outlive it. */
static kiln_status tensor_from_proto(struct onnx_ctx *c, const KilnOnnx__TensorProto *tp,
                                     const char *what, kiln_tensor **out)
{
    const char *tname = tp->name && tp->name[0] ? tp->name : what;
    kiln_dtype dt;
    kiln_status st = map_dtype(tp->has_data_type ? tp->data_type : 0, tname, &dt);
    if (st != KILN_OK) return st;
    if (tp->n_dims > KILN_MAX_RANK)
        return kiln_error(KILN_ERR_UNSUPPORTED, "tensor '%s': rank %zu exceeds Kiln's maximum %d",
                          tname, tp->n_dims, KILN_MAX_RANK);
    if (tp->segment)
        return kiln_error(KILN_ERR_UNSUPPORTED, "tensor '%s': segmented tensors are not supported",
                          tname);
    int64_t dims[KILN_MAX_RANK];
    for (size_t i = 0; i < tp->n_dims; i++) {
        dims[i] = tp->dims[i];
        if (dims[i] < 0)
            return kiln_error(KILN_ERR_INVALID_MODEL, "tensor '%s': dim %zu is negative (%lld)",
                              tname, i, (long long)dims[i]);
    }
    int rank = (int)tp->n_dims;
    int64_t n = kiln_shape_count(rank, dims);
    char sbuf[160];
    if (n < 0 || n * (int64_t)kiln_dtype_size(dt) > KILN_TENSOR_MAX_BYTES)
        return kiln_error(KILN_ERR_INVALID_MODEL, "tensor '%s': shape %s is too large", tname,
                          kiln_shape_str(rank, dims, sbuf, sizeof sbuf));
    size_t es = kiln_dtype_size(dt);
    size_t need = (size_t)n * es;
    int bits = packed_bits(dt);
    if (bits) need = ((size_t)n * (size_t)bits + 7) / 8; /* bytes of packed data */
    if (tp->has_data_location && tp->data_location != 0 && tp->data_location != 1)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "tensor '%s': data_location %d is neither DEFAULT (0) nor EXTERNAL (1)",
                          tname, tp->data_location);
    bool external = tp->has_data_location && tp->data_location == 1;

    /* raw_data left in the mapped file by strip_raw_data: use it in place */
    if (!external && tp->has_kiln_raw_offset) {
        if (!c->file || tp->kiln_raw_offset > c->file_size ||
            tp->kiln_raw_length > c->file_size - tp->kiln_raw_offset)
            return kiln_error(KILN_ERR_INTERNAL, "tensor '%s': bad raw_data reference", tname);
        if (dt == KILN_DTYPE_STRING)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "tensor '%s': string tensors cannot use raw_data", tname);
        if (tp->kiln_raw_length != need)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "tensor '%s': raw_data has %llu bytes but shape %s of %s needs %zu",
                              tname, (unsigned long long)tp->kiln_raw_length,
                              kiln_shape_str(rank, dims, sbuf, sizeof sbuf), kiln_dtype_name(dt),
                              need);
        const unsigned char *src = c->file + tp->kiln_raw_offset;
        if (c->in_place && !bits && ((uintptr_t)src % es) == 0) {
            st = kiln_tensor_wrap(dt, rank, dims, (void *)src, need, out);
            if (st == KILN_OK) c->file_used = true;
            return st;
        }
        /* misaligned in the file, or the caller's memory: the one copy */
        kiln_tensor *t;
        st = bits ? kiln_tensor_new(dt, rank, dims, &t) : kiln_tensor_new_uninit(dt, rank, dims, &t);
        if (st != KILN_OK) return kiln_error_wrap(st, "tensor '%s'", tname);
        if (bits) unpack_elems(t, src, NULL);
        else memcpy(t->data, src, need);
        if (c->file_mapped && !bits && dt != KILN_DTYPE_STRING && need >= reloadable_min_bytes()) {
            c->copy_src = src;
            kiln_file_release_range(src, need); /* copied: its file pages need not stay */
        }
        *out = t;
        return KILN_OK;
    }
    /* Check counts before allocating anything the shape asks for. */
    if (!external && tp->has_raw_data) {
        if (dt == KILN_DTYPE_STRING)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "tensor '%s': string tensors cannot use raw_data", tname);
        if (tp->raw_data.len != need)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "tensor '%s': raw_data has %zu bytes but shape %s of %s needs %zu",
                              tname, tp->raw_data.len, kiln_shape_str(rank, dims, sbuf, sizeof sbuf),
                              kiln_dtype_name(dt), need);
        if (need > 0 && !bits && ((uintptr_t)tp->raw_data.data % es) == 0) {
            st = kiln_tensor_wrap(dt, rank, dims, tp->raw_data.data, need, out);
            return st;
        }
    }
    size_t have = 0;
    const char *field = "";
    if (!external && !tp->has_raw_data) {
        switch (dt) {
        case KILN_DTYPE_F32: have = tp->n_float_data; field = "float_data"; break;
        case KILN_DTYPE_F64: have = tp->n_double_data; field = "double_data"; break;
        case KILN_DTYPE_I64: have = tp->n_int64_data; field = "int64_data"; break;
        case KILN_DTYPE_U32: case KILN_DTYPE_U64: have = tp->n_uint64_data; field = "uint64_data"; break;
        case KILN_DTYPE_STRING: have = tp->n_string_data; field = "string_data"; break;
        default: have = tp->n_int32_data; field = "int32_data"; break;
        }
        if (bits ? have != need : (int64_t)have != n)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "tensor '%s': %s has %zu elements but shape %s needs %lld", tname,
                              field, have, kiln_shape_str(rank, dims, sbuf, sizeof sbuf),
                              bits ? (long long)need : (long long)n);
    }
    kiln_tensor *t;
    if (external) return load_external(c, tp, tname, dt, rank, dims, need, out);
    st = kiln_tensor_new(dt, rank, dims, &t);
    if (st != KILN_OK) return kiln_error_wrap(st, "tensor '%s'", tname);
    if (tp->has_raw_data) {
        if (bits) unpack_elems(t, tp->raw_data.data, NULL);
        else if (need) memcpy(t->data, tp->raw_data.data, need);
        *out = t;
        return KILN_OK;
    }
    if (bits) {
        unpack_elems(t, NULL, tp->int32_data);
        *out = t;
        return KILN_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case KILN_DTYPE_F32: ((float *)t->data)[i] = tp->float_data[i]; break;
        case KILN_DTYPE_F64: ((double *)t->data)[i] = tp->double_data[i]; break;
        case KILN_DTYPE_I64: ((int64_t *)t->data)[i] = tp->int64_data[i]; break;
        case KILN_DTYPE_U32: ((uint32_t *)t->data)[i] = (uint32_t)tp->uint64_data[i]; break;
        case KILN_DTYPE_U64: ((uint64_t *)t->data)[i] = tp->uint64_data[i]; break;
        case KILN_DTYPE_F16: case KILN_DTYPE_BF16:
            ((uint16_t *)t->data)[i] = (uint16_t)tp->int32_data[i];
            break;
        case KILN_DTYPE_F8E4M3FN: case KILN_DTYPE_F8E4M3FNUZ: case KILN_DTYPE_F8E5M2:
        case KILN_DTYPE_F8E5M2FNUZ: case KILN_DTYPE_F8E8M0:
            ((uint8_t *)t->data)[i] = (uint8_t)tp->int32_data[i]; /* the bits */
            break;
        case KILN_DTYPE_STRING:
            st = kiln_tensor_set_string(t, (size_t)i, (const char *)tp->string_data[i].data,
                                        tp->string_data[i].len);
            if (st != KILN_OK) {
                kiln_tensor_free(t);
                return st;
            }
            break;
        default: kiln_set_i64(dt, t->data, i, tp->int32_data[i]); break;
        }
    }
    *out = t;
    return KILN_OK;
}

/* ---- types ---- */

/* sequence(T) and optional(T) (docs/SEQUENCES.md): the value's type is the container
 * kind, its items' types are known at run time. Kiln's containers hold tensors, an
 * optional also a sequence of tensors; maps and sparse tensors inside are refused. */
static kiln_status container_type(const KilnOnnx__TypeProto *tp, const char *vname,
                                  struct kiln_type *out)
{
    kiln_type_unknown(out);
    out->dtype = tp->value_case == KILN_ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE
                     ? KILN_DTYPE_SEQUENCE
                     : KILN_DTYPE_OPTIONAL;
    const KilnOnnx__TypeProto *t = tp;
    for (int depth = 0; t; depth++) {
        const KilnOnnx__TypeProto *inner = NULL;
        if (t->value_case == KILN_ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE)
            inner = t->sequence_type->elem_type;
        else if (t->value_case == KILN_ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE)
            inner = t->optional_type->elem_type;
        else if (t->value_case == KILN_ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
            break;
        else if (t->value_case != KILN_ONNX__TYPE_PROTO__VALUE__NOT_SET)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "value '%s': sequences and optionals of maps or sparse tensors "
                              "are not supported", vname);
        if (depth >= 2 && inner)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "value '%s': sequence and optional types nest more than 2 deep",
                              vname);
        t = inner;
    }
    return KILN_OK;
}

static kiln_status type_from_proto(struct kiln_graph *g, const KilnOnnx__TypeProto *tp,
                                   const char *vname, struct kiln_type *out)
{
    kiln_type_unknown(out);
    if (!tp) return KILN_OK;
    if (tp->value_case == KILN_ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE ||
        tp->value_case == KILN_ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE)
        return container_type(tp, vname, out);
    if (tp->value_case == KILN_ONNX__TYPE_PROTO__VALUE_MAP_TYPE)
        return kiln_error(KILN_ERR_UNSUPPORTED, "value '%s': map types are not supported", vname);
    if (tp->value_case == KILN_ONNX__TYPE_PROTO__VALUE_SPARSE_TENSOR_TYPE)
        return kiln_error(KILN_ERR_UNSUPPORTED, "value '%s': sparse tensors are not supported",
                          vname);
    if (tp->value_case != KILN_ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE) return KILN_OK;
    const KilnOnnx__TypeProto__Tensor *tt = tp->tensor_type;
    if (tt->has_elem_type && tt->elem_type != 0) {
        kiln_status st = map_dtype(tt->elem_type, vname, &out->dtype);
        if (st != KILN_OK) return st;
    }
    if (!tt->shape) return KILN_OK;
    if (tt->shape->n_dim > KILN_MAX_RANK)
        return kiln_error(KILN_ERR_UNSUPPORTED, "value '%s': rank %zu exceeds Kiln's maximum %d",
                          vname, tt->shape->n_dim, KILN_MAX_RANK);
    out->rank = (int)tt->shape->n_dim;
    for (size_t i = 0; i < tt->shape->n_dim; i++) {
        const KilnOnnx__TensorShapeProto__Dimension *d = tt->shape->dim[i];
        out->dims[i] = -1;
        out->sym[i] = NULL;
        if (d->value_case == KILN_ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
            if (d->dim_value < 0)
                return kiln_error(KILN_ERR_INVALID_MODEL, "value '%s': dim %zu is negative (%lld)",
                                  vname, i, (long long)d->dim_value);
            if (d->dim_value > ((int64_t)1 << 40))
                return kiln_error(KILN_ERR_INVALID_MODEL, "value '%s': dim %zu is too large (%lld)",
                                  vname, i, (long long)d->dim_value);
            out->dims[i] = d->dim_value;
        } else if (d->value_case == KILN_ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
                   d->dim_param && d->dim_param[0]) {
            out->sym[i] = kiln_arena_strdup(g->mem, d->dim_param);
            if (!out->sym[i]) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        }
    }
    return KILN_OK;
}

/* ---- graphs ---- */

static kiln_status import_graph(struct onnx_ctx *c, const KilnOnnx__GraphProto *gp,
                                struct scope *s);

static int64_t domain_opset(const KilnOnnx__ModelProto *mp, const char *domain)
{
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const char *d = mp->opset_import[i]->domain ? mp->opset_import[i]->domain : "";
        if (strcmp(d, domain) == 0) return mp->opset_import[i]->version;
    }
    return -1;
}

static kiln_status import_attr(struct onnx_ctx *c, struct scope *s, const struct kiln_node *n,
                               const KilnOnnx__AttributeProto *ap, struct kiln_attr *a)
{
    struct kiln_graph *g = s->g;
    const char *aname = ap->name ? ap->name : "";
    a->name = kiln_arena_strdup(g->mem, aname);
    if (!a->name) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if (ap->ref_attr_name && ap->ref_attr_name[0])
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "attribute '%s' refers to a function attribute outside a function",
                               aname);
    int type = ap->has_type ? ap->type : 0;
    if (type == 0) {
        /* IR < 3 files may omit the type: infer it from what is set */
        if (ap->g) type = 5;
        else if (ap->t) type = 4;
        else if (ap->n_floats) type = 6;
        else if (ap->n_ints) type = 7;
        else if (ap->n_strings) type = 8;
        else if (ap->has_s) type = 3;
        else if (ap->has_i) type = 2;
        else if (ap->has_f) type = 1;
    }
    kiln_status st;
    switch (type) {
    case 1: a->type = KILN_ATTR_FLOAT; a->f = ap->f; break;
    case 2: a->type = KILN_ATTR_INT; a->i = ap->i; break;
    case 3:
        a->type = KILN_ATTR_STRING;
        a->s.len = ap->s.len;
        a->s.data = kiln_arena_strndup(g->mem, (const char *)ap->s.data, ap->s.len);
        if (!a->s.data) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        break;
    case 4: {
        if (!ap->t)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "tensor attribute '%s' has no tensor",
                                   aname);
        a->type = KILN_ATTR_TENSOR;
        st = tensor_from_proto(c, ap->t, aname, &a->t);
        if (st != KILN_OK)
            return kiln_error_wrap(st, "%s node '%s' attribute '%s'", n->op_type, n->name, aname);
        st = kiln_graph_own_tensor(g, a->t);
        if (st != KILN_OK) return st;
        break;
    }
    case 5: {
        if (!ap->g)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "graph attribute '%s' has no graph",
                                   aname);
        a->type = KILN_ATTR_GRAPH;
        st = kiln_graph_new_sub(g, &a->g);
        if (st != KILN_OK) return st;
        struct scope sub = {a->g, {0}, s};
        c->depth++;
        st = import_graph(c, ap->g, &sub);
        c->depth--;
        map_free(&sub.names);
        if (st != KILN_OK)
            return kiln_error_wrap(st, "%s node '%s' attribute '%s'", n->op_type, n->name, aname);
        break;
    }
    case 6:
        a->type = KILN_ATTR_FLOATS;
        a->n = (int)ap->n_floats;
        a->floats = kiln_arena_alloc(g->mem, sizeof(float) * (ap->n_floats + 1));
        if (!a->floats) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        if (ap->n_floats) memcpy(a->floats, ap->floats, sizeof(float) * ap->n_floats);
        break;
    case 7:
        a->type = KILN_ATTR_INTS;
        a->n = (int)ap->n_ints;
        a->ints = kiln_arena_alloc(g->mem, sizeof(int64_t) * (ap->n_ints + 1));
        if (!a->ints) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        if (ap->n_ints) memcpy(a->ints, ap->ints, sizeof(int64_t) * ap->n_ints);
        break;
    case 8:
        a->type = KILN_ATTR_STRINGS;
        a->n = (int)ap->n_strings;
        a->strings = kiln_arena_alloc(g->mem, sizeof(kiln_string) * (ap->n_strings + 1));
        if (!a->strings) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        for (size_t i = 0; i < ap->n_strings; i++) {
            a->strings[i].len = ap->strings[i].len;
            a->strings[i].data =
                kiln_arena_strndup(g->mem, (const char *)ap->strings[i].data, ap->strings[i].len);
            if (!a->strings[i].data) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        }
        break;
    case 13: { /* TYPE_PROTO (Optional's type): kept as an INT, the kiln_dtype of the
                  type: a tensor's element type, or KILN_DTYPE_SEQUENCE / OPTIONAL */
        struct kiln_type ty;
        if (!ap->tp)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "type attribute '%s' has no type",
                                   aname);
        st = type_from_proto(g, ap->tp, aname, &ty);
        if (st != KILN_OK)
            return kiln_error_wrap(st, "%s node '%s' attribute '%s'", n->op_type, n->name, aname);
        a->type = KILN_ATTR_INT;
        a->i = ty.dtype;
        break;
    }
    case 9: case 10: case 11: case 12: case 14:
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED,
                               "attribute '%s' has type %d (tensors/graphs/sparse/type protos), "
                               "which Kiln does not support",
                               aname, type);
    default:
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "attribute '%s' has invalid type %d",
                               aname, type);
    }
    return KILN_OK;
}

/* Attribute names whose type is the same in every ai.onnx op that has them.
 * A mismatch is caught at load even where no shape function reads the
 * attribute. */
static const struct {
    const char *name;
    enum kiln_attr_type type;
} common_attr_types[] = {
    {"alpha", KILN_ATTR_FLOAT},     {"beta", KILN_ATTR_FLOAT},      {"gamma", KILN_ATTR_FLOAT},
    {"epsilon", KILN_ATTR_FLOAT},   {"momentum", KILN_ATTR_FLOAT},  {"bias", KILN_ATTR_FLOAT},
    {"lambd", KILN_ATTR_FLOAT},     {"ratio", KILN_ATTR_FLOAT},     {"axis", KILN_ATTR_INT},
    {"axes", KILN_ATTR_INTS},       {"perm", KILN_ATTR_INTS},       {"keepdims", KILN_ATTR_INT},
    {"transA", KILN_ATTR_INT},      {"transB", KILN_ATTR_INT},      {"group", KILN_ATTR_INT},
    {"kernel_shape", KILN_ATTR_INTS}, {"strides", KILN_ATTR_INTS},  {"pads", KILN_ATTR_INTS},
    {"dilations", KILN_ATTR_INTS},  {"output_padding", KILN_ATTR_INTS},
    {"auto_pad", KILN_ATTR_STRING}, {"to", KILN_ATTR_INT},          {"ceil_mode", KILN_ATTR_INT},
    {"count_include_pad", KILN_ATTR_INT}, {"storage_order", KILN_ATTR_INT},
    {"then_branch", KILN_ATTR_GRAPH}, {"else_branch", KILN_ATTR_GRAPH}, {"body", KILN_ATTR_GRAPH},
    {"noop_with_empty_axes", KILN_ATTR_INT}, {"select_last_index", KILN_ATTR_INT},
    {"largest", KILN_ATTR_INT},     {"sorted", KILN_ATTR_INT},      {"exclusive", KILN_ATTR_INT},
    {"reverse", KILN_ATTR_INT},     {"batch_dims", KILN_ATTR_INT},  {"blocksize", KILN_ATTR_INT},
    {"hidden_size", KILN_ATTR_INT}, {"direction", KILN_ATTR_STRING}, {"num_scan_inputs", KILN_ATTR_INT},
};

static kiln_status check_attr_type(const struct kiln_node *n, const struct kiln_attr *a)
{
    for (size_t i = 0; i < sizeof common_attr_types / sizeof common_attr_types[0]; i++) {
        if (strcmp(common_attr_types[i].name, a->name) != 0) continue;
        if (common_attr_types[i].type == a->type) return KILN_OK;
        static const char *names[] = {"?", "FLOAT", "INT", "STRING", "TENSOR", "GRAPH",
                                      "FLOATS", "INTS", "STRINGS"};
        unsigned t = (unsigned)a->type < 9 ? (unsigned)a->type : 0;
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "attribute '%s' has type %s, expected %s",
                               a->name, names[t], names[common_attr_types[i].type]);
    }
    return KILN_OK;
}

static kiln_status add_named_value(struct scope *s, const char *name, enum kiln_value_kind kind,
                                   int *id)
{
    kiln_status st = kiln_graph_value_add(s->g, name, kind, id);
    if (st != KILN_OK) return st;
    return map_put(&s->names, (char *)s->g->values[*id].name, *id);
}

/* ONNX node names are optional (onnx.helper, many converters leave them empty), but
 * Kiln keys per-node precision (kiln_session_set_node_precision, kiln compile's
 * report, the .kiln file's _kiln_precision) and profiles by node name. An unnamed
 * node is named "<op_type>_<i>", i its position among the graph's nodes in the
 * file, with "_2", "_3", ... appended when a named node already has that name: the
 * same file always gives the same names. */
static kiln_status name_unnamed_nodes(struct kiln_graph *g)
{
    struct name_map taken = {0};
    kiln_status st = KILN_OK;
    int unnamed = 0;
    for (int i = 0; i < g->n_nodes && st == KILN_OK; i++) {
        if (g->nodes[i].name && g->nodes[i].name[0])
            st = map_put(&taken, (char *)g->nodes[i].name, i);
        else
            unnamed++;
    }
    for (int i = 0; i < g->n_nodes && st == KILN_OK && unnamed; i++) {
        struct kiln_node *n = &g->nodes[i];
        if (n->name && n->name[0]) continue;
        char buf[96];
        snprintf(buf, sizeof buf, "%s_%d", n->op_type ? n->op_type : "node", i);
        size_t len = strlen(buf);
        for (int k = 2; map_get(&taken, buf) >= 0; k++)
            snprintf(buf + len, sizeof buf - len, "_%d", k);
        char *name = kiln_arena_strdup(g->mem, buf);
        if (!name) {
            st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory naming nodes");
            break;
        }
        n->name = name;
        st = map_put(&taken, name, i);
    }
    map_free(&taken);
    return st;
}

static kiln_status import_graph(struct onnx_ctx *c, const KilnOnnx__GraphProto *gp,
                                struct scope *s)
{
    struct kiln_graph *g = s->g;
    const KilnOnnx__ModelProto *mp = c->m->proto;
    kiln_status st;
    g->name = kiln_arena_strdup(g->mem, gp->name ? gp->name : "");
    if (gp->n_sparse_initializer)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "graph '%s': sparse initializers are not supported (%zu found)",
                          g->name, gp->n_sparse_initializer);
    if (gp->n_node > (size_t)INT32_MAX / 4 || gp->n_input > (size_t)INT32_MAX / 4)
        return kiln_error(KILN_ERR_INVALID_MODEL, "graph '%s' is too large", g->name);

    /* initializers */
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const KilnOnnx__TensorProto *tp = gp->initializer[i];
        if (!tp->name || !tp->name[0])
            return kiln_error(KILN_ERR_INVALID_MODEL, "graph '%s': initializer %zu has no name",
                              g->name, i);
        if (map_get(&s->names, tp->name) >= 0)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "graph '%s': initializer '%s' is defined twice", g->name, tp->name);
        kiln_tensor *t;
        c->copy_src = NULL;
        st = tensor_from_proto(c, tp, tp->name, &t);
        if (st != KILN_OK) return kiln_error_wrap(st, "initializer '%s'", tp->name);
        if ((st = kiln_graph_own_tensor(g, t)) != KILN_OK) return st;
        if (c->copy_src) {
            /* the mapping stays, so the plans may drop this copy once packed
             * (initializers only: attribute tensors are read by their nodes) */
            if ((st = kiln_model_note_copy(c->m, t, c->copy_src)) != KILN_OK) return st;
            c->file_used = true;
        }
        int id;
        if ((st = add_named_value(s, tp->name, KILN_VALUE_CONST, &id)) != KILN_OK) return st;
        g->values[id].konst = t;
        kiln_type_from_tensor(&g->values[id].type, t);
    }
    /* inputs (an input that is also an initializer is a constant: not fed) */
    g->inputs = kiln_arena_alloc(g->mem, sizeof(int) * (gp->n_input + 1));
    if (!g->inputs) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < gp->n_input; i++) {
        const KilnOnnx__ValueInfoProto *vi = gp->input[i];
        const char *name = vi->name ? vi->name : "";
        if (!name[0])
            return kiln_error(KILN_ERR_INVALID_MODEL, "graph '%s': input %zu has no name", g->name, i);
        int id = map_get(&s->names, name);
        if (id >= 0) {
            if (g->values[id].kind == KILN_VALUE_CONST && !g->parent) continue;
            return kiln_error(KILN_ERR_INVALID_MODEL, "graph '%s': input '%s' is defined twice",
                              g->name, name);
        }
        if ((st = add_named_value(s, name, KILN_VALUE_INPUT, &id)) != KILN_OK) return st;
        if ((st = type_from_proto(g, vi->type, name, &g->values[id].type)) != KILN_OK) return st;
        g->inputs[g->n_inputs++] = id;
    }
    /* node outputs first, so node order in the file does not matter */
    struct kiln_node **nodes = calloc(gp->n_node + 1, sizeof *nodes);
    if (!nodes) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < gp->n_node; i++) {
        const KilnOnnx__NodeProto *np = gp->node[i];
        const char *op_type = np->op_type ? np->op_type : "";
        const char *domain = np->domain ? np->domain : "";
        const char *nname = np->name ? np->name : "";
        if (strcmp(domain, "ai.onnx") == 0) domain = "";
        /* ai.onnx ops come from the default domain, ai.onnx.ml ops from theirs */
        bool ml_domain = strcmp(domain, "ai.onnx.ml") == 0;
        enum kiln_op op = domain[0] && !ml_domain ? KILN_OP_COUNT : kiln_op_find(op_type);
        if (op != KILN_OP_COUNT && (kiln_op_info(op)->flags & KILN_OPF_INTERNAL)) op = KILN_OP_COUNT;
        if (op != KILN_OP_COUNT && ml_domain != !!(kiln_op_info(op)->flags & KILN_OPF_ONNXML))
            op = KILN_OP_COUNT;
        if (op == KILN_OP_COUNT) {
            st = kiln_error(KILN_ERR_UNSUPPORTED,
                            "node '%s': op '%s'%s%s%s is not supported by Kiln", nname, op_type,
                            domain[0] ? " (domain '" : "", domain, domain[0] ? "')" : "");
            goto fail;
        }
        if (!kiln_op_impl(op)) {
            st = kiln_error(KILN_ERR_UNSUPPORTED, "node '%s': op '%s' has no kernel in Kiln yet",
                            nname, op_type);
            goto fail;
        }
        if (np->n_input > KILN_MAX_IO || np->n_output > KILN_MAX_IO) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "%s node '%s': %zu inputs and %zu outputs "
                            "exceed Kiln's limit of %d", op_type, nname, np->n_input,
                            np->n_output, KILN_MAX_IO);
            goto fail;
        }
        /* trailing empty outputs are dropped; interior empty ones stay absent */
        int n_out = (int)np->n_output;
        while (n_out > 0 && (!np->output[n_out - 1] || !np->output[n_out - 1][0])) n_out--;
        int n_in = (int)np->n_input;
        while (n_in > 0 && (!np->input[n_in - 1] || !np->input[n_in - 1][0])) n_in--;
        struct kiln_node *n;
        st = kiln_graph_node_add(g, op, nname, n_in, n_out, (int)np->n_attribute, &n);
        if (st != KILN_OK) goto fail;
        int64_t ver = domain_opset(mp, ml_domain ? "ai.onnx.ml" : "");
        n->opset = ver > 0 && ver < INT32_MAX ? (int)ver : 1;
        for (int k = 0; k < n_out; k++) {
            const char *oname = np->output[k];
            if (!oname || !oname[0]) continue;
            if (map_get(&s->names, oname) >= 0) {
                st = kiln_error(KILN_ERR_INVALID_MODEL,
                                "%s node '%s': output '%s' is already defined elsewhere in the "
                                "graph",
                                op_type, nname, oname);
                goto fail;
            }
            int id;
            if ((st = add_named_value(s, oname, KILN_VALUE_NODE, &id)) != KILN_OK) goto fail;
            g->values[id].producer = g->n_nodes - 1;
            g->nodes[g->n_nodes - 1].out[k] = id;
        }
    }
    /* inputs and attributes */
    for (size_t i = 0; i < gp->n_node; i++) {
        const KilnOnnx__NodeProto *np = gp->node[i];
        struct kiln_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++) {
            const char *iname = np->input[k];
            if (!iname || !iname[0]) continue;
            int id;
            if ((st = scope_resolve(s, iname, &id)) != KILN_OK) goto fail;
            if (id < 0) {
                st = kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                                     "input '%s' is not a graph input, initializer or output of "
                                     "any node",
                                     iname);
                goto fail;
            }
            /* the scope lookup may have grown g->nodes? no: only values */
            n->in[k] = id;
        }
        for (size_t k = 0; k < np->n_attribute; k++) {
            const char *an = np->attribute[k]->name ? np->attribute[k]->name : "";
            for (size_t j = 0; j < k; j++)
                if (np->attribute[j]->name && strcmp(np->attribute[j]->name, an) == 0) {
                    st = kiln_node_error(n, KILN_ERR_INVALID_MODEL, "attribute '%s' is given twice",
                                         an);
                    goto fail;
                }
            st = import_attr(c, s, n, np->attribute[k], &n->attr[k]);
            if (st == KILN_OK) st = check_attr_type(n, &n->attr[k]);
            if (st != KILN_OK) goto fail;
            n = &g->nodes[i]; /* subgraph import does not touch g->nodes, but stay safe */
        }
    }
    free(nodes);
    nodes = NULL;
    if ((st = name_unnamed_nodes(g)) != KILN_OK) return st;
    /* value_info: declared types of intermediate values */
    for (size_t i = 0; i < gp->n_value_info; i++) {
        const KilnOnnx__ValueInfoProto *vi = gp->value_info[i];
        if (!vi->name) continue;
        int id = map_get(&s->names, vi->name);
        if (id < 0 || g->values[id].kind != KILN_VALUE_NODE) continue;
        struct kiln_type t;
        st = type_from_proto(g, vi->type, vi->name, &t);
        if (st == KILN_ERR_UNSUPPORTED) continue; /* a type we can't use is not fatal here */
        if (st != KILN_OK) return st;
        g->values[id].type = t;
    }
    /* outputs */
    g->outputs = kiln_arena_alloc(g->mem, sizeof(int) * (gp->n_output + 1));
    if (!g->outputs) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < gp->n_output; i++) {
        const KilnOnnx__ValueInfoProto *vi = gp->output[i];
        const char *name = vi->name ? vi->name : "";
        int id;
        if ((st = scope_resolve(s, name, &id)) != KILN_OK) return st;
        if (id < 0)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "graph '%s': output '%s' is not produced by any node, input or "
                              "initializer",
                              g->name, name);
        struct kiln_type t;
        st = type_from_proto(g, vi->type, name, &t);
        if (st == KILN_ERR_UNSUPPORTED && g->values[id].kind == KILN_VALUE_NODE &&
            g->nodes[g->values[id].producer].op == KILN_OP_ZipMap) {
            /* ZipMap's seq(map) output is carried as its probability tensor,
             * the labels kept on the node (docs/TABULAR.md) */
            kiln_error_clear();
            kiln_type_unknown(&t);
            st = KILN_OK;
        }
        if (st != KILN_OK) return st;
        if (g->values[id].kind == KILN_VALUE_NODE || g->values[id].kind == KILN_VALUE_OUTER)
            g->values[id].type = t;
        g->outputs[g->n_outputs++] = id;
    }
    return KILN_OK;
fail:
    free(nodes);
    return st;
}

/* ---- zero-copy weights ----
 *
 * protobuf-c copies every bytes field it parses. To use a mapped file's
 * weights in place, the wire bytes are first re-encoded without the large
 * raw_data payloads of TensorProto messages: each becomes a reference
 * (kiln_raw_offset, kiln_raw_length) into the file. The re-encoded message
 * holds only the graph's structure, so parsing it is cheap. */

#define RAW_INLINE_MAX 64 /* smaller payloads stay inline */

struct wbuf {
    unsigned char *p;
    size_t n, cap;
};

static bool wbuf_put(struct wbuf *b, const void *src, size_t n)
{
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n) cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
    return true;
}

static bool wbuf_varint(struct wbuf *b, uint64_t v)
{
    unsigned char tmp[10];
    size_t k = 0;
    do {
        tmp[k++] = (unsigned char)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return wbuf_put(b, tmp, k);
}

static bool get_varint(const unsigned char *p, size_t len, size_t *pos, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && *pos < len; shift += 7) {
        unsigned char byte = p[(*pos)++];
        v |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false;
}

static const ProtobufCFieldDescriptor *field_of(const ProtobufCMessageDescriptor *d, uint32_t id)
{
    for (unsigned i = 0; i < d->n_fields; i++)
        if (d->fields[i].id == id) return &d->fields[i];
    return NULL;
}

/* Re-encode message bytes p[0..len) (at file offset base) into out. The
 * framing was validated by kiln_pb_check, including the depth bound. */
static bool strip_raw_data(const ProtobufCMessageDescriptor *d, const unsigned char *p, size_t len,
                           size_t base, struct wbuf *out)
{
    bool is_tensor = d == &kiln_onnx__tensor_proto__descriptor;
    size_t pos = 0;
    while (pos < len) {
        size_t start = pos;
        uint64_t key, v = 0;
        if (!get_varint(p, len, &pos, &key)) return false;
        uint32_t id = (uint32_t)(key >> 3);
        unsigned wt = key & 7;
        switch (wt) {
        case 0: if (!get_varint(p, len, &pos, &v)) return false; break;
        case 1: pos += 8; break;
        case 5: pos += 4; break;
        case 2: {
            if (!get_varint(p, len, &pos, &v) || v > len - pos) return false;
            const ProtobufCFieldDescriptor *f = field_of(d, id);
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                struct wbuf child = {0};
                bool ok = strip_raw_data(f->descriptor, p + pos, (size_t)v, base + pos, &child);
                ok = ok && wbuf_varint(out, key) && wbuf_varint(out, child.n) &&
                     (child.n == 0 || wbuf_put(out, child.p, child.n));
                free(child.p);
                if (!ok) return false;
                pos += (size_t)v;
                continue;
            }
            if (is_tensor && id == 9 && v > RAW_INLINE_MAX) {
                uint64_t ref[2] = {base + pos, v};
                if (!wbuf_varint(out, (9001u << 3) | 1) || !wbuf_put(out, &ref[0], 8) ||
                    !wbuf_varint(out, (9002u << 3) | 1) || !wbuf_put(out, &ref[1], 8))
                    return false;
                pos += (size_t)v;
                continue;
            }
            pos += (size_t)v;
            break;
        }
        default: return false;
        }
        if (pos > len) return false;
        if (is_tensor && (id == 9001 || id == 9002)) continue; /* never trusted from a file */
        if (!wbuf_put(out, p + start, pos - start)) return false;
    }
    return true;
}

/* ---- model ---- */

static void proto_free(void *p) { kiln_onnx__model_proto__free_unpacked(p, NULL); }

static kiln_status onnx_load(const void *data, size_t size, const char *dir, bool in_place,
                             bool mapped, struct kiln_model *m, bool *file_used)
{
    kiln_status st;
    if (size > ONNX_MAX_MODEL_BYTES)
        return kiln_error(KILN_ERR_UNSUPPORTED, "model file of %zu bytes exceeds the 2 GiB "
                          "protobuf limit; use external data", size);
    st = kiln_pb_check(&kiln_onnx__model_proto__descriptor, data, size, ONNX_MAX_PROTO_DEPTH,
                       "ONNX model");
    if (st != KILN_OK) return st;
    struct wbuf stripped = {0};
    if (!strip_raw_data(&kiln_onnx__model_proto__descriptor, data, size, 0, &stripped)) {
        free(stripped.p);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "ONNX model: out of memory re-encoding the graph");
    }
    KilnOnnx__ModelProto *mp = kiln_onnx__model_proto__unpack(NULL, stripped.n,
                                                              stripped.p ? stripped.p : (const uint8_t *)"");
    free(stripped.p);
    if (!mp)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "ONNX model: the file is not a valid ModelProto (protobuf parse failed: "
                          "wrong field types or bad strings)");
    m->proto = mp;
    m->proto_free = proto_free;
    m->format = "onnx";
    if (!mp->graph) return kiln_error(KILN_ERR_INVALID_MODEL, "ONNX model: ModelProto has no graph");
    if (mp->n_functions) {
        /* model-local functions are only a problem if a node uses one; the
         * node will then fail as an unknown op in that domain */
    }
    struct onnx_ctx c = {.m = m, .dir = dir, .dir_fd = -1, .file = data, .file_size = size,
                         .in_place = in_place, .file_mapped = in_place && mapped};
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        int64_t ver = mp->opset_import[i]->version;
        const char *d = mp->opset_import[i]->domain ? mp->opset_import[i]->domain : "";
        if (ver < 1 || ver > 1000)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "ONNX model: opset_import for domain '%s' has version %lld",
                              d[0] ? d : "ai.onnx", (long long)ver);
    }
    int64_t v = domain_opset(mp, "");
    if (v < 0 && mp->n_opset_import == 0) v = 1; /* IR v1/v2 files had no opset imports */
    c.opset_onnx = v;
    if (dir) {
        c.dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (c.dir_fd < 0)
            return kiln_error(KILN_ERR_IO, "cannot open model folder '%s': %s", dir,
                              strerror(errno));
    }
    st = kiln_graph_new(&m->graph);
    if (st != KILN_OK) goto out;
    struct scope root = {m->graph, {0}, NULL};
    st = import_graph(&c, mp->graph, &root);
    map_free(&root.names);
    if (st != KILN_OK) goto out;
    st = kiln_graph_verify(m->graph);
    if (st != KILN_OK) goto out;
    st = kiln_graph_infer(m->graph);
    if (st != KILN_OK) goto out;

    /* opsets */
    m->n_opsets = (int)mp->n_opset_import;
    m->opset_domain = kiln_arena_alloc(m->graph->mem, sizeof(char *) * (mp->n_opset_import + 1));
    m->opset_version = kiln_arena_alloc(m->graph->mem, sizeof(int64_t) * (mp->n_opset_import + 1));
    if (!m->opset_domain || !m->opset_version) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        m->opset_domain[i] = mp->opset_import[i]->domain ? mp->opset_import[i]->domain : "";
        m->opset_version[i] = mp->opset_import[i]->version;
    }
    m->stats.ir_version = mp->ir_version;
    m->stats.producer = mp->producer_name ? mp->producer_name : "";

    /* one signature over the main graph */
    m->n_signatures = 1;
    m->signatures = kiln_arena_alloc(m->graph->mem, sizeof *m->signatures);
    if (!m->signatures) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    struct kiln_signature *sig = &m->signatures[0];
    sig->name = "serving_default";
    sig->method = "tensorflow/serving/predict";
    sig->graph = m->graph;
    sig->n_inputs = m->graph->n_inputs;
    sig->input_values = m->graph->inputs;
    sig->n_outputs = m->graph->n_outputs;
    sig->output_values = m->graph->outputs;
    st = kiln_signature_describe(m, sig);
    if (st != KILN_OK) goto out;
    st = kiln_model_finish(m);
out:
    if (c.dir_fd >= 0) close(c.dir_fd);
    *file_used = c.file_used;
    return st;
}

kiln_status kiln_onnx_load(const void *data, size_t size, const char *dir, struct kiln_model *m)
{
    /* the caller keeps its bytes: weights are copied out of them */
    bool used = false;
    return onnx_load(data, size, dir, false, false, m, &used);
}

kiln_status kiln_onnx_load_file(struct kiln_file_map *map, const char *dir, struct kiln_model *m)
{
    bool used = false;
    kiln_status st = onnx_load(map->data, map->size, dir, true, map->mapped, m, &used);
    if (used) {
        kiln_status kst = kiln_model_keep_map(m, map); /* weights live in the mapping */
        if (kst != KILN_OK) {
            kiln_file_unmap(map);
            return kst;
        }
        memset(map, 0, sizeof *map);
    } else {
        kiln_file_unmap(map);
    }
    return st;
}

kiln_status kiln_onnx_read_tensor(const void *data, size_t size, kiln_tensor **out,
                                  char **name_out)
{
    kiln_status st = kiln_pb_check(&kiln_onnx__tensor_proto__descriptor, data, size, 8,
                                   "TensorProto");
    if (st != KILN_OK) return st;
    KilnOnnx__TensorProto *tp = kiln_onnx__tensor_proto__unpack(NULL, size, data);
    if (!tp) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "not a valid TensorProto");
    struct kiln_model dummy = {0};
    struct onnx_ctx c = {.m = &dummy, .dir_fd = -1};
    kiln_tensor *t;
    st = tensor_from_proto(&c, tp, "tensor", &t);
    if (st == KILN_OK && !t->owns_data) {
        /* borrowed from tp: copy before tp goes */
        kiln_tensor *copy;
        st = kiln_tensor_clone(t, &copy);
        kiln_tensor_free(t);
        t = copy;
    }
    if (st == KILN_OK) {
        *out = t;
        if (name_out) *name_out = tp->name ? strdup(tp->name) : NULL;
    }
    kiln_onnx__tensor_proto__free_unpacked(tp, NULL);
    return st;
}

/* ---- sequence and optional values (test data; docs/SEQUENCES.md) ---- */

static kiln_status value_from_tensor_proto(const KilnOnnx__TensorProto *tp, kiln_tensor **out)
{
    struct kiln_model dummy = {0};
    struct onnx_ctx c = {.m = &dummy, .dir_fd = -1};
    kiln_tensor *t;
    kiln_status st = tensor_from_proto(&c, tp, "tensor", &t);
    if (st == KILN_OK && !t->owns_data) { /* borrowed from tp: copy before tp goes */
        kiln_tensor *copy;
        st = kiln_tensor_clone(t, &copy);
        kiln_tensor_free(t);
        t = copy;
    }
    if (st == KILN_OK) *out = t;
    return st;
}

static kiln_status value_from_optional_proto(const KilnOnnx__OptionalProto *op, int depth,
                                             kiln_tensor **out);

static kiln_status value_from_sequence_proto(const KilnOnnx__SequenceProto *sp, int depth,
                                             kiln_tensor **out)
{
    if (depth > 2)
        return kiln_error(KILN_ERR_UNSUPPORTED, "sequence values nest more than 2 deep");
    if (sp->n_optional_values)
        return kiln_error(KILN_ERR_UNSUPPORTED, "sequences of optionals are not supported");
    if (sp->n_tensor_values && sp->n_sequence_values)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "a SequenceProto holds both tensors and "
                          "sequences");
    size_t n = sp->n_tensor_values + sp->n_sequence_values;
    if (sp->has_elem_type && sp->elem_type != 1 && sp->elem_type != 3 && n)
        return kiln_error(KILN_ERR_UNSUPPORTED, "sequences of elem_type %d are not supported",
                          (int)sp->elem_type);
    *out = NULL;
    if (n > (size_t)KILN_SEQUENCE_MAX_ITEMS)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "a sequence of %zu items is too long", n);
    kiln_status st = kiln_tensor_container_create(KILN_DTYPE_SEQUENCE, (int64_t)n, out);
    for (size_t i = 0; st == KILN_OK && i < n; i++) {
        kiln_tensor *item = NULL;
        st = sp->n_tensor_values ? value_from_tensor_proto(sp->tensor_values[i], &item)
                                 : value_from_sequence_proto(sp->sequence_values[i], depth + 1,
                                                             &item);
        if (st == KILN_OK) st = kiln_tensor_set_item(*out, (int64_t)i, item);
    }
    if (st != KILN_OK) {
        kiln_tensor_free(*out);
        *out = NULL;
    }
    return st;
}

static kiln_status value_from_optional_proto(const KilnOnnx__OptionalProto *op, int depth,
                                             kiln_tensor **out)
{
    if (op->optional_value)
        return kiln_error(KILN_ERR_UNSUPPORTED, "an optional cannot hold an optional");
    kiln_tensor *item = NULL;
    kiln_status st = KILN_OK;
    if (op->tensor_value) st = value_from_tensor_proto(op->tensor_value, &item);
    else if (op->sequence_value) st = value_from_sequence_proto(op->sequence_value, depth + 1, &item);
    if (st != KILN_OK) return st;
    if ((st = kiln_tensor_container_create(KILN_DTYPE_OPTIONAL, item ? 1 : 0, out)) != KILN_OK) {
        kiln_tensor_free(item);
        return st;
    }
    if (item && (st = kiln_tensor_set_item(*out, 0, item)) != KILN_OK) {
        kiln_tensor_free(*out);
        *out = NULL;
    }
    return st;
}

kiln_status kiln_onnx_read_value(const void *data, size_t size, kiln_dtype kind,
                                 kiln_tensor **out)
{
    *out = NULL;
    if (kind != KILN_DTYPE_SEQUENCE && kind != KILN_DTYPE_OPTIONAL)
        return kiln_onnx_read_tensor(data, size, out, NULL);
    const ProtobufCMessageDescriptor *desc = kind == KILN_DTYPE_SEQUENCE
                                                 ? &kiln_onnx__sequence_proto__descriptor
                                                 : &kiln_onnx__optional_proto__descriptor;
    const char *what = kind == KILN_DTYPE_SEQUENCE ? "SequenceProto" : "OptionalProto";
    kiln_status st = kiln_pb_check(desc, data, size, 8, what);
    if (st != KILN_OK) return st;
    ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, size, data);
    if (!msg) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "not a valid %s", what);
    if (kind == KILN_DTYPE_SEQUENCE)
        st = value_from_sequence_proto((const KilnOnnx__SequenceProto *)msg, 0, out);
    else
        st = value_from_optional_proto((const KilnOnnx__OptionalProto *)msg, 0, out);
    protobuf_c_message_free_unpacked(msg, NULL);
    return st;
}
