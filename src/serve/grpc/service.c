/*
 * service.c - the gRPC method table and the unary handlers of TF Serving's
 * PredictionService and ModelService, plus grpc.health.v1's answers.
 *
 * Each handler has the REST handlers' shape (routes.c): decode, validate,
 * call the runtime, encode, and return right after an error. Requests are
 * checked with kiln_pb_check (depth and wire format) before protobuf-c
 * unpacks them into Kiln's wire-compatible schemas
 * (src/import/proto/prediction_log.proto, grpc_service.proto). The request
 * path is the REST one: kiln_manager_acquire (model, version, label),
 * kiln_servable_find_signature, TensorProto -> tensor through the same
 * converter as SavedModel constants and warmup files (TF's rules: typed
 * fields or tensor_content, half_val for fp16/bf16, the last value
 * repeating), kiln_servable_run (the same batching queue and deadline), and
 * the REST server's metrics with entrypoint="GRPC". Classify, Regress and
 * MultiInference share the REST :classify/:regress checks and output
 * readers (results.h) and the warmup file's Input -> tf.Example tensor
 * (warmup.h); HandleReloadConfigRequest applies a ModelServerConfig as a
 * config-file reload does. Status codes and messages are TF Serving's
 * (docs/GRPC.md).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln_util.h"
#include "serve/batch.h"
#include "serve/grpc/call.h"
#include "serve/grpc/grpc_tensor.h"
#include "serve/config.h"
#include "serve/gate/release.h"
#include "serve/manager.h"
#include "serve/results.h"
#include "serve/warmup.h"

#include "grpc_service.pb-c.h"
#include "prediction_log.pb-c.h"

#define PB_MAX_DEPTH 64
#define SIGNATURE_DEF_TYPE_URL "type.googleapis.com/tensorflow.serving.SignatureDefMap"
/* GetModelMetadata's Kiln entry: assets.extra/kiln_version.json as JSON in a
 * google.protobuf.StringValue, under the key "kiln_version_info" */
#define VERSION_INFO_KEY "kiln_version_info"
#define STRING_VALUE_TYPE_URL "type.googleapis.com/google.protobuf.StringValue"

/* ------------------------------------------------------------ buffers, status */

void kiln_bytes_reserve(kiln_bytes *b, size_t extra)
{
    if (b->oom || b->len + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) {
        if (cap > SIZE_MAX / 2) {
            b->oom = 1;
            return;
        }
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

void kiln_bytes_put(kiln_bytes *b, const void *s, size_t n)
{
    kiln_bytes_reserve(b, n);
    if (b->oom || n == 0) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

void kiln_bytes_free(kiln_bytes *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

static const char *const code_names[17] = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
};

int kiln_grpc_code_of(const char *name)
{
    for (int i = 0; name && i < 17; i++)
        if (strcmp(code_names[i], name) == 0) return i;
    return KILN_GRPC_UNKNOWN;
}

const char *kiln_grpc_code_name(int code)
{
    return code >= 0 && code < 17 ? code_names[code] : "UNKNOWN";
}

void kiln_grpc_fail(kiln_grpc_call *c, int code, const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    c->code = code;
    size_t n = strlen(buf);
    _Static_assert(sizeof c->message >= KILN_GRPC_MESSAGE_MAX + sizeof "...TRUNCATED", "message size");
    if (n > KILN_GRPC_MESSAGE_MAX) { /* TF Serving's ToGRPCStatus */
        memcpy(c->message, buf, KILN_GRPC_MESSAGE_MAX);
        memcpy(c->message + KILN_GRPC_MESSAGE_MAX, "...TRUNCATED", sizeof "...TRUNCATED");
    } else {
        memcpy(c->message, buf, n + 1);
    }
    c->resp.len = 0;
}

/* What a call records in the shared metrics. */
typedef struct call_rec {
    char model[256];   /* "" until a ModelSpec named one */
    int64_t version;   /* the version that served it, or -1 */
    const char *api;   /* TF Serving's API label: "predict", "metadata", ... */
    int routed;        /* the version was chosen by a traffic split (observe.h) */
} call_rec;

static double elapsed_us(const struct timespec *a)
{
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a->tv_sec) * 1e6 + (double)(b.tv_nsec - a->tv_nsec) / 1e3;
}

static void record(kiln_grpc_call *c, const call_rec *r)
{
    if (!r->model[0] || !c->ctx->rest || !c->ctx->rest->metrics) return;
    kiln_metrics_record_entry(c->ctx->rest->metrics, "GRPC", r->model, r->version, r->api,
                              kiln_grpc_code_name(c->code), elapsed_us(&c->start));
}

/* Check and unpack a request message; NULL after failing the call. */
static ProtobufCMessage *unpack(kiln_grpc_call *c, const ProtobufCMessageDescriptor *d,
                                const char *what)
{
    if (kiln_pb_check(d, c->req, c->req_len, PB_MAX_DEPTH, what) != KILN_OK) {
        kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "%s", kiln_last_error());
        return NULL;
    }
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, c->req_len, c->req);
    if (!m) kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "cannot parse %s", what);
    return m;
}

/* Serialize msg as the call's response, within max_send. */
static void pack(kiln_grpc_call *c, const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    if ((int64_t)n > c->ctx->max_send) {
        kiln_grpc_fail(c, KILN_GRPC_RESOURCE_EXHAUSTED, "Sent message larger than max (%zu vs. %" PRId64 ")",
                       n, c->ctx->max_send);
        return;
    }
    c->resp.len = 0;
    kiln_bytes_reserve(&c->resp, n);
    if (c->resp.oom) {
        kiln_grpc_fail(c, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory packing the response");
        return;
    }
    c->resp.len = protobuf_c_message_pack(msg, c->resp.p);
    c->code = KILN_GRPC_OK;
}

/* The servable a ModelSpec names, or NULL after failing the call. */
static kiln_servable *acquire(kiln_grpc_call *c, const KilnTfs__ModelSpec *ms, call_rec *r)
{
    if (!ms) {
        kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "Missing ModelSpec");
        return NULL;
    }
    if (!ms->name || !ms->name[0]) {
        kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "ModelSpec has no name specified.");
        return NULL;
    }
    snprintf(r->model, sizeof r->model, "%s", ms->name);
    int64_t version = ms->version ? ms->version->value : -1;
    char err[KILN_JSON_ERR_LEN];
    const char *code = "NOT_FOUND";
    /* a request naming no version and no label goes where a split sends it */
    int routed = 0;
    int64_t routed_version = kiln_observers_route(c->ctx->rest->opt.observers, ms->name, version,
                                                  ms->version_label, c->route_key, &routed);
    kiln_servable *sv = kiln_manager_acquire(c->ctx->rest->manager, ms->name, routed_version,
                                             ms->version_label, err, &code);
    if (!sv && routed) /* the split's version is gone: the default serves */
        sv = kiln_manager_acquire(c->ctx->rest->manager, ms->name, version, ms->version_label, err,
                                  &code);
    else r->routed = routed;
    if (!sv) {
        kiln_grpc_fail(c, kiln_grpc_code_of(code), "%s", err);
        return NULL;
    }
    r->version = sv->version;
    return sv;
}

/* ModelSpec of a response: name, version, and (when non-NULL) the signature. */
typedef struct spec_out {
    KilnTfs__ModelSpec ms;
    KilnTfs__Int64Value v;
} spec_out;

static KilnTfs__ModelSpec *spec_fill(spec_out *o, const char *name, int64_t version, const char *sig)
{
    kiln_tfs__model_spec__init(&o->ms);
    kiln_tfs__int64_value__init(&o->v);
    o->ms.name = (char *)name;
    o->v.has_value = 1;
    o->v.value = version;
    o->ms.version = &o->v;
    o->ms.signature_name = (char *)sig;
    return &o->ms;
}

/* ------------------------------------------------------------ Predict */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Append the sorted, comma-joined names to s (TF's absl::StrJoin of a std::set). */
static void join_sorted(kiln_sbuf *s, const char **names, int n)
{
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 0; i < n; i++) {
        if (i && strcmp(names[i], names[i - 1]) == 0) continue;
        if (i) kiln_sbuf_puts(s, ",");
        kiln_sbuf_puts(s, names[i]);
    }
}

/* TF Serving's "input size does not match signature" message. */
static void fail_input_set(kiln_grpc_call *c, const KilnTfs__PredictRequest *r,
                           const kiln_signature *sig, int distinct)
{
    int ni = kiln_signature_input_count(sig);
    const char **req = calloc(r->n_inputs + 1, sizeof *req);
    const char **want = calloc((size_t)ni + 1, sizeof *want);
    const char **extra = calloc(r->n_inputs + 1, sizeof *extra);
    const char **missing = calloc((size_t)ni + 1, sizeof *missing);
    if (!req || !want || !extra || !missing) {
        kiln_grpc_fail(c, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    int ne = 0, nm = 0;
    for (size_t i = 0; i < r->n_inputs; i++) {
        req[i] = r->inputs[i]->key ? r->inputs[i]->key : "";
        int known = 0;
        for (int k = 0; k < ni; k++) known |= strcmp(kiln_signature_input(sig, k)->name, req[i]) == 0;
        if (!known) extra[ne++] = req[i];
    }
    for (int k = 0; k < ni; k++) {
        want[k] = kiln_signature_input(sig, k)->name;
        int sent = 0;
        for (size_t i = 0; i < r->n_inputs; i++) sent |= strcmp(want[k], req[i]) == 0;
        if (!sent) missing[nm++] = want[k];
    }
    kiln_sbuf s = {0};
    kiln_sbuf_printf(&s, "input size does not match signature: %d!=%d len({", distinct, ni);
    join_sorted(&s, req, (int)r->n_inputs);
    kiln_sbuf_puts(&s, "}) != len({");
    join_sorted(&s, want, ni);
    kiln_sbuf_puts(&s, "}). Sent extra: {");
    join_sorted(&s, extra, ne);
    kiln_sbuf_puts(&s, "}. Missing but required: {");
    join_sorted(&s, missing, nm);
    kiln_sbuf_puts(&s, "}.");
    kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "%s", s.p && !s.oom ? s.p : "input size does not match signature");
    kiln_sbuf_free(&s);
out:
    free(req);
    free(want);
    free(extra);
    free(missing);
}

/* The request's tensors in signature order (new tensors in in[]); 0 after
 * failing the call. */
static int decode_inputs(kiln_grpc_call *c, const KilnTfs__PredictRequest *r,
                         const kiln_signature *sig, kiln_tensor **in)
{
    int ni = kiln_signature_input_count(sig);
    /* a map: a repeated key means its last value */
    int distinct = 0;
    for (size_t i = 0; i < r->n_inputs; i++) {
        int later = 0;
        const char *k = r->inputs[i]->key ? r->inputs[i]->key : "";
        for (size_t j = i + 1; j < r->n_inputs; j++)
            later |= strcmp(k, r->inputs[j]->key ? r->inputs[j]->key : "") == 0;
        distinct += !later;
    }
    int all_known = 1;
    for (size_t i = 0; i < r->n_inputs; i++) {
        int known = 0;
        for (int k = 0; k < ni; k++)
            known |= strcmp(kiln_signature_input(sig, k)->name,
                            r->inputs[i]->key ? r->inputs[i]->key : "") == 0;
        all_known &= known;
    }
    if (distinct != ni || !all_known) {
        fail_input_set(c, r, sig, distinct);
        return 0;
    }
    for (int k = 0; k < ni; k++) {
        const kiln_value_info *spec = kiln_signature_input(sig, k);
        const KilnSm__TensorProto *tp = NULL;
        for (size_t i = 0; i < r->n_inputs; i++)
            if (strcmp(spec->name, r->inputs[i]->key ? r->inputs[i]->key : "") == 0)
                tp = r->inputs[i]->value;
        KilnSm__TensorProto empty = KILN_SM__TENSOR_PROTO__INIT;
        if (!tp) tp = &empty;
        if (kiln_tf_tensor_from_proto(tp, spec->name, &in[k]) != KILN_OK) {
            kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "tensor parsing error: %s (%s)",
                           spec->name, kiln_last_error());
            return 0;
        }
        if (spec->dtype != KILN_DTYPE_UNDEFINED && in[k]->dtype != spec->dtype) {
            kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "Expected input %s to be %s but get %s.",
                           spec->name, kiln_grpc_tf_dtype_name(spec->dtype),
                           kiln_grpc_tf_dtype_name(in[k]->dtype));
            return 0;
        }
        int bad = spec->rank >= 0 && in[k]->rank != spec->rank;
        for (int d = 0; !bad && spec->rank >= 0 && d < spec->rank; d++)
            bad = spec->dims[d] >= 0 && in[k]->dims[d] != spec->dims[d];
        if (bad) {
            char got[160], want[160];
            kiln_grpc_shape_str(in[k]->rank, in[k]->dims, got, sizeof got);
            kiln_grpc_shape_str(spec->rank, spec->dims, want, sizeof want);
            kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT,
                           "input %s has shape %s, the signature expects %s", spec->name, got, want);
            return 0;
        }
    }
    return 1;
}

/* Which outputs to answer: keep[i] for out->names[i]; 0 after failing the call. */
static int select_outputs(kiln_grpc_call *c, const KilnTfs__PredictRequest *r,
                          const kiln_batch_result *out, int *keep)
{
    for (int i = 0; i < out->n; i++) keep[i] = r->n_output_filter == 0;
    for (size_t f = 0; f < r->n_output_filter; f++) {
        const char *want = r->output_filter[f] ? r->output_filter[f] : "";
        int found = -1, dup = 0;
        size_t wl = strlen(want);
        for (int i = 0; i < out->n; i++) {
            /* a sequence output NAME answers as NAME/0, NAME/1, ... (serve/containers.h) */
            if (strcmp(out->names[i], want) != 0 &&
                !(strncmp(out->names[i], want, wl) == 0 && out->names[i][wl] == '/'))
                continue;
            if (keep[i]) dup = 1;
            keep[i] = 1;
            found = i;
        }
        if (found < 0) {
            kiln_sbuf s = {0};
            const char **names = calloc((size_t)out->n + 1, sizeof *names);
            for (int i = 0; names && i < out->n; i++) names[i] = out->names[i];
            if (names) join_sorted(&s, names, out->n);
            kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT,
                           "output tensor alias not found in signature: %s Outputs expected to be "
                           "in the set {%s}.", want, s.p && !s.oom ? s.p : "");
            free(names);
            kiln_sbuf_free(&s);
            return 0;
        }
        if (dup) {
            kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "duplicate output tensor alias: %s", want);
            return 0;
        }
    }
    return 1;
}

/* Run signature si of sv with the call's deadline and cancel flag, between
 * the observers' check and after (observe.h); 0 after failing the call. */
static int run(kiln_grpc_call *c, const call_rec *r, kiln_servable *sv, int si, kiln_tensor **in,
               int n, kiln_batch_result *out)
{
    char err[KILN_JSON_ERR_LEN];
    const char *code = "OK";
    const kiln_observers *obs = c->ctx->rest ? c->ctx->rest->opt.observers : NULL;
    kiln_observation o = {"GRPC", r->api, r->model, sv, si, in, n, NULL, "OK", 0.0,
                          r->routed, c->route_key};
    if (obs && obs->n > 0 && kiln_observers_check(obs, &o, err, &code) != KILN_OK) {
        kiln_grpc_fail(c, kiln_grpc_code_of(code), "%s", err);
        return 0;
    }
    double t0 = obs && obs->n > 0 ? kiln_observe_now_us() : 0.0;
    kiln_status st = kiln_servable_run_cancel(sv, si, in, n, c->deadline_ms, c->cancel, out, err, &code);
    if (obs && obs->n > 0) {
        o.latency_us = kiln_observe_now_us() - t0;
        o.out = st == KILN_OK ? out : NULL;
        o.code = st == KILN_OK ? "OK" : code;
        kiln_observers_after(obs, &o);
    }
    if (st != KILN_OK) {
        if (c->cancel && *c->cancel) kiln_grpc_fail(c, KILN_GRPC_CANCELLED, "Cancelled");
        else kiln_grpc_fail(c, kiln_grpc_code_of(code), "%s", err);
        return 0;
    }
    if (c->deadline_ms > 0 && kiln_monotonic_ms() > c->deadline_ms) {
        kiln_batch_result_free(out);
        kiln_grpc_fail(c, KILN_GRPC_DEADLINE_EXCEEDED, KILN_DEADLINE_MESSAGE);
        return 0;
    }
    return 1;
}

static void h_predict(kiln_grpc_call *c)
{
    call_rec rec = {"", -1, "predict", 0};
    KilnTfs__PredictRequest *r =
        (KilnTfs__PredictRequest *)unpack(c, &kiln_tfs__predict_request__descriptor, "PredictRequest");
    if (!r) return;
    kiln_servable *sv = acquire(c, r->model_spec, &rec);
    if (!sv) goto err_free_request;
    const char *sig_name = r->model_spec->signature_name;
    int si = kiln_servable_find_signature(sv, sig_name);
    if (si < 0) {
        kiln_grpc_fail(c, KILN_GRPC_FAILED_PRECONDITION, "Serving signature key \"%s\" not found.",
                       sig_name && sig_name[0] ? sig_name : "serving_default");
        goto err_release;
    }
    const kiln_signature *sig = kiln_model_signature(sv->model, si);
    int n = kiln_signature_input_count(sig);
    kiln_tensor **in = calloc((size_t)n + 1, sizeof *in);
    if (!in) {
        kiln_grpc_fail(c, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        goto err_release;
    }
    if (!decode_inputs(c, r, sig, in)) goto err_free_inputs;
    kiln_batch_result out;
    if (!run(c, &rec, sv, si, in, n, &out)) goto err_free_inputs;
    int *keep = calloc((size_t)out.n + 1, sizeof *keep);
    kiln_grpc_tensor_set set;
    kiln_grpc_tensor_set_init(&set);
    if (!keep) {
        kiln_grpc_fail(c, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    } else if (select_outputs(c, r, &out, keep)) {
        KilnGrpc__PredictResponse resp = KILN_GRPC__PREDICT_RESPONSE__INIT;
        spec_out so;
        resp.model_spec = spec_fill(&so, r->model_spec->name, sv->version, kiln_signature_name(sig));
        int ok = 1;
        for (int i = 0; i < out.n && ok; i++)
            if (keep[i]) ok = kiln_grpc_tensor_set_add(&set, out.names[i], out.t[i], c->ctx->tensor_content);
        if (!ok) {
            kiln_grpc_fail(c, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory encoding the outputs");
        } else {
            resp.n_outputs = (size_t)set.n;
            resp.outputs = set.entries;
            pack(c, &resp.base);
        }
    }
    kiln_grpc_tensor_set_free(&set);
    free(keep);
    kiln_batch_result_free(&out);
err_free_inputs:
    for (int i = 0; i < n; i++) kiln_tensor_free(in[i]);
    free(in);
err_release:
    kiln_servable_release(sv);
err_free_request:
    record(c, &rec);
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

/* ------------------------------------------------------------ GetModelMetadata */

/* TensorInfo map entries for a signature's inputs or outputs. */
static KilnGrpc__TensorInfoEntry **tensor_infos(const kiln_signature *sig, int outputs, size_t *n_out)
{
    int n = outputs ? kiln_signature_output_count(sig) : kiln_signature_input_count(sig);
    KilnGrpc__TensorInfoEntry **e = calloc((size_t)n + 1, sizeof *e);
    if (!e) return NULL;
    for (int i = 0; i < n; i++) {
        const kiln_value_info *v = outputs ? kiln_signature_output(sig, i) : kiln_signature_input(sig, i);
        struct {
            KilnGrpc__TensorInfoEntry e;
            KilnGrpc__TensorInfo ti;
            KilnGrpc__TensorShape sh;
            KilnGrpc__TensorShape__Dim d[KILN_MAX_RANK];
            KilnGrpc__TensorShape__Dim *dp[KILN_MAX_RANK];
        } *b = calloc(1, sizeof *b);
        if (!b) {
            for (int k = 0; k < i; k++) free(e[k]);
            free(e);
            return NULL;
        }
        kiln_grpc__tensor_info_entry__init(&b->e);
        kiln_grpc__tensor_info__init(&b->ti);
        kiln_grpc__tensor_shape__init(&b->sh);
        b->e.key = (char *)v->name;
        b->e.value = &b->ti;
        b->ti.name = (char *)v->name;
        b->ti.has_dtype = 1;
        /* a sequence or optional is a DT_VARIANT (21), as TF's TensorList is */
        b->ti.dtype = v->dtype == KILN_DTYPE_SEQUENCE || v->dtype == KILN_DTYPE_OPTIONAL
                          ? 21 : kiln_grpc_tf_dtype(v->dtype);
        b->ti.tensor_shape = &b->sh;
        if (v->rank < 0) {
            b->sh.has_unknown_rank = 1;
            b->sh.unknown_rank = 1;
        }
        for (int d = 0; d < v->rank && d < KILN_MAX_RANK; d++) {
            kiln_grpc__tensor_shape__dim__init(&b->d[d]);
            b->d[d].has_size = 1;
            b->d[d].size = v->dims[d];
            b->dp[d] = &b->d[d];
        }
        b->sh.n_dim = v->rank > 0 ? (size_t)v->rank : 0;
        b->sh.dim = b->dp;
        e[i] = &b->e; /* the entry is the allocation's first member */
    }
    *n_out = (size_t)n;
    return e;
}

static void free_infos(KilnGrpc__TensorInfoEntry **e, size_t n)
{
    for (size_t i = 0; e && i < n; i++) free(e[i]);
    free(e);
}

/* Serialize the servable's SignatureDefMap into out; 0 when out of memory. */
static int signature_def_map(const kiln_servable *sv, kiln_bytes *out)
{
    int n = kiln_model_signature_count(sv->model);
    KilnGrpc__SignatureDefEntry *ent = calloc((size_t)n + 1, sizeof *ent);
    KilnGrpc__SignatureDefEntry **entp = calloc((size_t)n + 1, sizeof *entp);
    KilnGrpc__SignatureDef *defs = calloc((size_t)n + 1, sizeof *defs);
    int ok = ent && entp && defs;
    for (int i = 0; ok && i < n; i++) {
        const kiln_signature *sig = kiln_model_signature(sv->model, i);
        kiln_grpc__signature_def_entry__init(&ent[i]);
        kiln_grpc__signature_def__init(&defs[i]);
        ent[i].key = (char *)kiln_signature_name(sig);
        ent[i].value = &defs[i];
        entp[i] = &ent[i];
        const char *method = kiln_signature_method(sig);
        defs[i].method_name = (char *)(method ? method : "tensorflow/serving/predict");
        defs[i].inputs = tensor_infos(sig, 0, &defs[i].n_inputs);
        defs[i].outputs = tensor_infos(sig, 1, &defs[i].n_outputs);
        ok = defs[i].inputs && defs[i].outputs;
    }
    if (ok) {
        KilnGrpc__SignatureDefMap map = KILN_GRPC__SIGNATURE_DEF_MAP__INIT;
        map.n_signature_def = (size_t)n;
        map.signature_def = entp;
        size_t len = protobuf_c_message_get_packed_size(&map.base);
        kiln_bytes_reserve(out, len);
        ok = !out->oom;
        if (ok) out->len = protobuf_c_message_pack(&map.base, out->p);
    }
    for (int i = 0; defs && i < n; i++) {
        free_infos(defs[i].inputs, defs[i].n_inputs);
        free_infos(defs[i].outputs, defs[i].n_outputs);
    }
    free(ent);
    free(entp);
    free(defs);
    return ok;
}

static void h_metadata(kiln_grpc_call *c)
{
    call_rec rec = {"", -1, "metadata", 0};
    KilnGrpc__GetModelMetadataRequest *r = (KilnGrpc__GetModelMetadataRequest *)unpack(
        c, &kiln_grpc__get_model_metadata_request__descriptor, "GetModelMetadataRequest");
    if (!r) return;
    if (!r->model_spec) {
        kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "Missing ModelSpec");
        goto err_free_request;
    }
    if (r->n_metadata_field == 0) {
        kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT,
                       "GetModelMetadataRequest must specify at least one metadata_field");
        goto err_free_request;
    }
    int want_sdm = 0;
    for (size_t i = 0; i < r->n_metadata_field; i++) {
        if (strcmp(r->metadata_field[i], "signature_def") == 0) want_sdm = 1;
        else if (strcmp(r->metadata_field[i], VERSION_INFO_KEY) != 0) {
            kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "Metadata field %s is not supported",
                           r->metadata_field[i]);
            goto err_free_request;
        }
    }
    kiln_servable *sv = acquire(c, r->model_spec, &rec);
    if (!sv) goto err_free_request;
    kiln_bytes sdm = {0}, vib = {0};
    /* The version's traceability record rides along whenever it has one, under
     * a key of Kiln's own: TF Serving's clients look up "signature_def" and
     * never see it. */
    kiln_sbuf vj = {0};
    if (sv->version_info) {
        kiln_version_info_write_json(&vj, sv->version_info);
        kiln_bytes_reserve(&vib, vj.len + 11);
        if (!vj.oom && !vib.oom) { /* StringValue: field 1, length-delimited */
            vib.p[vib.len++] = 0x0a;
            for (uint64_t n = vj.len; ; n >>= 7) {
                vib.p[vib.len++] = (uint8_t)((n & 0x7f) | (n > 0x7f ? 0x80 : 0));
                if (n <= 0x7f) break;
            }
            memcpy(vib.p + vib.len, vj.p, vj.len);
            vib.len += vj.len;
        }
    }
    if ((want_sdm && !signature_def_map(sv, &sdm)) || vj.oom || vib.oom) {
        kiln_grpc_fail(c, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        KilnGrpc__Any any[2] = {KILN_GRPC__ANY__INIT, KILN_GRPC__ANY__INIT};
        KilnGrpc__AnyEntry entry[2] = {KILN_GRPC__ANY_ENTRY__INIT, KILN_GRPC__ANY_ENTRY__INIT};
        KilnGrpc__AnyEntry *entp[2];
        size_t n = 0;
        if (want_sdm) {
            any[n].type_url = SIGNATURE_DEF_TYPE_URL;
            any[n].has_value = 1;
            any[n].value.data = sdm.p;
            any[n].value.len = sdm.len;
            entry[n].key = "signature_def";
            entry[n].value = &any[n];
            entp[n] = &entry[n];
            n++;
        }
        if (sv->version_info) {
            any[n].type_url = STRING_VALUE_TYPE_URL;
            any[n].has_value = 1;
            any[n].value.data = vib.p;
            any[n].value.len = vib.len;
            entry[n].key = VERSION_INFO_KEY;
            entry[n].value = &any[n];
            entp[n] = &entry[n];
            n++;
        }
        KilnGrpc__GetModelMetadataResponse resp = KILN_GRPC__GET_MODEL_METADATA_RESPONSE__INIT;
        spec_out so;
        resp.model_spec = spec_fill(&so, r->model_spec->name, sv->version, NULL);
        resp.n_metadata = n;
        resp.metadata = entp;
        pack(c, &resp.base);
    }
    kiln_sbuf_free(&vj);
    kiln_bytes_free(&vib);
    kiln_bytes_free(&sdm);
    kiln_servable_release(sv);
err_free_request:
    record(c, &rec);
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

/* ------------------------------------------------------------ GetModelStatus */

typedef struct status_list {
    KilnGrpc__ModelVersionStatus *v;
    KilnGrpc__StatusProto *st;
    KilnGrpc__ModelVersionStatus **vp;
    char **msgs;
    int n, cap, oom;
} status_list;

static void add_status(void *ctx, int i, int64_t version, kiln_version_state state,
                       const char *error_code, const char *error_message)
{
    status_list *l = ctx;
    if (l->oom || l->n >= l->cap) {
        int cap = l->cap ? l->cap * 2 : 8;
        void *a = realloc(l->v, (size_t)cap * sizeof *l->v), *b = a ? realloc(l->st, (size_t)cap * sizeof *l->st) : NULL;
        if (a) l->v = a;
        if (b) l->st = b;
        void *d = b ? realloc(l->msgs, (size_t)cap * sizeof *l->msgs) : NULL;
        if (d) l->msgs = d;
        if (!a || !b || !d) {
            l->oom = 1;
            return;
        }
        l->cap = cap;
    }
    KilnGrpc__ModelVersionStatus *v = &l->v[l->n];
    KilnGrpc__StatusProto *st = &l->st[l->n];
    kiln_grpc__model_version_status__init(v);
    kiln_grpc__status_proto__init(st);
    l->msgs[l->n] = strdup(error_message);
    if (!l->msgs[l->n]) {
        l->oom = 1;
        return;
    }
    v->has_version = v->has_state = 1;
    v->version = version;
    v->state = (int32_t)state;
    int code = kiln_grpc_code_of(error_code);
    if (code) { /* proto3 leaves defaults off the wire */
        st->has_error_code = 1;
        st->error_code = code;
    }
    if (error_message[0]) st->error_message = l->msgs[l->n];
    v->status = st;
    l->n++;
}

static void h_model_status(kiln_grpc_call *c)
{
    call_rec rec = {"", -1, "status", 0};
    KilnGrpc__GetModelStatusRequest *r = (KilnGrpc__GetModelStatusRequest *)unpack(
        c, &kiln_grpc__get_model_status_request__descriptor, "GetModelStatusRequest");
    if (!r) return;
    const KilnTfs__ModelSpec *ms = r->model_spec;
    char err[KILN_JSON_ERR_LEN];
    status_list l;
    memset(&l, 0, sizeof l);
    if (!ms) {
        kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "Missing ModelSpec");
        goto out;
    }
    if (!ms->name || !ms->name[0]) {
        kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "ModelSpec has no name specified.");
        goto out;
    }
    snprintf(rec.model, sizeof rec.model, "%s", ms->name);
    int64_t version = ms->version ? ms->version->value : -1;
    kiln_manager *m = c->ctx->rest->manager;
    if (ms->version_label && ms->version_label[0] &&
        kiln_manager_resolve_label(m, ms->name, ms->version_label, &version, err) != KILN_OK) {
        kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "%s", err);
        goto out;
    }
    if (kiln_manager_status_each(m, ms->name, version, add_status, &l, err) != KILN_OK) {
        kiln_grpc_fail(c, KILN_GRPC_NOT_FOUND, "%s", err);
        goto out;
    }
    l.vp = calloc((size_t)l.n + 1, sizeof *l.vp);
    if (l.oom || !l.vp) {
        kiln_grpc_fail(c, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (int i = 0; i < l.n; i++) l.vp[i] = &l.v[i];
    KilnGrpc__GetModelStatusResponse resp = KILN_GRPC__GET_MODEL_STATUS_RESPONSE__INIT;
    resp.n_model_version_status = (size_t)l.n;
    resp.model_version_status = l.vp;
    pack(c, &resp.base);
out:
    for (int i = 0; i < l.n; i++) free(l.msgs[i]);
    free(l.msgs);
    free(l.v);
    free(l.st);
    free(l.vp);
    record(c, &rec);
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

/* ------------------------------------------------------------ Classify, Regress, MultiInference */

/* Results of one classify or regress run, owned by the block. */
typedef struct result_block {
    KilnGrpc__ClassificationResult cr;
    KilnGrpc__RegressionResult rr;
    KilnGrpc__Classifications *cls;
    KilnGrpc__Classifications **clsp;
    KilnGrpc__Class *classes;
    KilnGrpc__Class **classp;
    KilnGrpc__Regression *reg;
    KilnGrpc__Regression **regp;
    char **labels;          /* NUL-terminated copies of the class labels */
    size_t n_labels;
} result_block;

static void result_block_free(result_block *b)
{
    free(b->cls);
    free(b->clsp);
    free(b->classes);
    free(b->classp);
    free(b->reg);
    free(b->regp);
    for (size_t i = 0; i < b->n_labels; i++) free(b->labels[i]);
    free(b->labels);
}

/* Run the examples through signature si and read its results into b; 0
 * after failing the call. The results point into out's tensors. */
static int run_examples(kiln_grpc_call *c, const call_rec *rec, kiln_servable *sv, int si, int classify,
                        kiln_tensor *examples, kiln_batch_result *out, result_block *b)
{
    char err[KILN_JSON_ERR_LEN];
    memset(b, 0, sizeof *b);
    memset(out, 0, sizeof *out);
    const kiln_signature *sig = kiln_model_signature(sv->model, si);
    if (kiln_results_check_signature(sig, classify, err) != KILN_OK) {
        kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "%s", err);
        return 0;
    }
    if (!run(c, rec, sv, si, &examples, 1, out)) return 0;
    int64_t n = examples->dims[0];
    if (!classify) {
        const float *y;
        if (kiln_results_regress(out, n, &y, err) != KILN_OK) {
            kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "%s", err);
            return 0;
        }
        kiln_grpc__regression_result__init(&b->rr);
        b->reg = calloc((size_t)n + 1, sizeof *b->reg);
        b->regp = calloc((size_t)n + 1, sizeof *b->regp);
        if (!b->reg || !b->regp) goto err_oom;
        for (int64_t i = 0; i < n; i++) {
            kiln_grpc__regression__init(&b->reg[i]);
            b->reg[i].has_value = 1;
            b->reg[i].value = y[i];
            b->regp[i] = &b->reg[i];
        }
        b->rr.n_regressions = (size_t)n;
        b->rr.regressions = b->regp;
        return 1;
    }
    kiln_class_results r;
    if (kiln_results_classify(out, n, &r, err) != KILN_OK) {
        kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "%s", err);
        return 0;
    }
    kiln_grpc__classification_result__init(&b->cr);
    size_t total = (size_t)(n * r.k);
    b->cls = calloc((size_t)n + 1, sizeof *b->cls);
    b->clsp = calloc((size_t)n + 1, sizeof *b->clsp);
    b->classes = calloc(total + 1, sizeof *b->classes);
    b->classp = calloc(total + 1, sizeof *b->classp);
    b->labels = r.classes ? calloc(total + 1, sizeof *b->labels) : NULL;
    if (!b->cls || !b->clsp || !b->classes || !b->classp || (r.classes && !b->labels)) goto err_oom;
    for (int64_t i = 0; i < n; i++) {
        kiln_grpc__classifications__init(&b->cls[i]);
        for (int64_t k = 0; k < r.k; k++) {
            size_t j = (size_t)(i * r.k + k);
            KilnGrpc__Class *cl = &b->classes[j];
            kiln_grpc__class__init(cl);
            if (r.classes) {
                const kiln_string *str = &((const kiln_string *)r.classes->data)[j];
                if (str->len && str->data) {
                    b->labels[b->n_labels] = strndup(str->data, str->len);
                    if (!b->labels[b->n_labels]) goto err_oom;
                    cl->label = b->labels[b->n_labels++];
                }
            }
            if (r.scores) {
                cl->score = ((const float *)r.scores->data)[j];
                cl->has_score = 1;
            }
            b->classp[j] = cl;
        }
        b->cls[i].n_classes = (size_t)r.k;
        b->cls[i].classes = &b->classp[i * r.k];
        b->clsp[i] = &b->cls[i];
    }
    b->cr.n_classifications = (size_t)n;
    b->cr.classifications = b->clsp;
    return 1;
err_oom:
    kiln_grpc_fail(c, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    return 0;
}

/* Input -> the string tensor of serialized examples; NULL after failing the call. */
static kiln_tensor *examples_of(kiln_grpc_call *c, const KilnTfs__Input *in)
{
    kiln_tensor *t;
    kiln_status st = kiln_warmup_examples(in, &t);
    if (st == KILN_ERR_INVALID_ARGUMENT) kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "Input is empty.");
    else if (st != KILN_OK) kiln_grpc_fail(c, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    return st == KILN_OK ? t : NULL;
}

/* Classify and Regress: the same request shape (model_spec = 1, input = 2). */
static void classify_or_regress(kiln_grpc_call *c, int classify)
{
    call_rec rec = {"", -1, classify ? "classify" : "regress", 0};
    KilnTfs__ClassificationRequest *r = (KilnTfs__ClassificationRequest *)unpack(
        c, &kiln_tfs__classification_request__descriptor,
        classify ? "ClassificationRequest" : "RegressionRequest");
    if (!r) return;
    kiln_tensor *examples = NULL;
    kiln_servable *sv = acquire(c, r->model_spec, &rec);
    if (!sv) goto err_free_request;
    const char *sig_name = r->model_spec->signature_name;
    int si = kiln_servable_find_signature(sv, sig_name);
    if (si < 0) {
        kiln_grpc_fail(c, KILN_GRPC_FAILED_PRECONDITION, "Serving signature key \"%s\" not found.",
                       sig_name && sig_name[0] ? sig_name : "serving_default");
        goto err_release;
    }
    examples = examples_of(c, r->input);
    if (!examples) goto err_release;
    kiln_batch_result out;
    result_block b;
    if (run_examples(c, &rec, sv, si, classify, examples, &out, &b)) {
        spec_out so;
        KilnTfs__ModelSpec *ms = spec_fill(&so, r->model_spec->name, sv->version,
                                           kiln_signature_name(kiln_model_signature(sv->model, si)));
        if (classify) {
            KilnGrpc__ClassificationResponse resp = KILN_GRPC__CLASSIFICATION_RESPONSE__INIT;
            resp.model_spec = ms;
            resp.result = &b.cr;
            pack(c, &resp.base);
        } else {
            KilnGrpc__RegressionResponse resp = KILN_GRPC__REGRESSION_RESPONSE__INIT;
            resp.model_spec = ms;
            resp.result = &b.rr;
            pack(c, &resp.base);
        }
    }
    result_block_free(&b);
    kiln_batch_result_free(&out);
err_release:
    kiln_servable_release(sv);
err_free_request:
    kiln_tensor_free(examples);
    record(c, &rec);
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void h_classify(kiln_grpc_call *c) { classify_or_regress(c, 1); }
static void h_regress(kiln_grpc_call *c) { classify_or_regress(c, 0); }

/* MultiInference: several classify / regress signatures of one model over
 * the same examples (TF Serving's checks and messages). */
static void h_multi_inference(kiln_grpc_call *c)
{
    call_rec rec = {"", -1, "multi_inference", 0};
    KilnGrpc__MultiInferenceRequest *r = (KilnGrpc__MultiInferenceRequest *)unpack(
        c, &kiln_grpc__multi_inference_request__descriptor, "MultiInferenceRequest");
    if (!r) return;
    size_t nt = r->n_tasks;
    kiln_servable *sv = NULL;
    kiln_tensor *examples = NULL;
    kiln_batch_result *outs = calloc(nt + 1, sizeof *outs);
    result_block *blocks = calloc(nt + 1, sizeof *blocks);
    KilnGrpc__InferenceResult *res = calloc(nt + 1, sizeof *res);
    KilnGrpc__InferenceResult **resp_p = calloc(nt + 1, sizeof *resp_p);
    spec_out *specs = calloc(nt + 1, sizeof *specs);
    if (!outs || !blocks || !res || !resp_p || !specs) {
        kiln_grpc_fail(c, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    if (nt == 0) {
        kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "Expected at least one task");
        goto out;
    }
    for (size_t i = 0; i < nt; i++) {
        const KilnTfs__ModelSpec *ms = r->tasks[i]->model_spec;
        if (!ms) {
            kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "Missing ModelSpec");
            goto out;
        }
        const char *n0 = r->tasks[0]->model_spec->name ? r->tasks[0]->model_spec->name : "";
        if (strcmp(ms->name ? ms->name : "", n0) != 0) {
            kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT,
                           "All ModelSpecs in a MultiInferenceRequest must access the same model name.");
            goto out;
        }
        for (size_t k = 0; k < i; k++) {
            const char *a = ms->signature_name ? ms->signature_name : "";
            const char *b = r->tasks[k]->model_spec->signature_name ? r->tasks[k]->model_spec->signature_name : "";
            if (strcmp(a, b) == 0) {
                kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "Duplicate evaluation of signature: %s", a);
                goto out;
            }
        }
    }
    sv = acquire(c, r->tasks[0]->model_spec, &rec);
    if (!sv) goto out;
    examples = examples_of(c, r->input);
    if (!examples) goto out;
    for (size_t i = 0; i < nt; i++) {
        const KilnTfs__ModelSpec *ms = r->tasks[i]->model_spec;
        const char *method = r->tasks[i]->method_name ? r->tasks[i]->method_name : "";
        int classify = strcmp(method, "tensorflow/serving/classify") == 0;
        if (!classify && strcmp(method, "tensorflow/serving/regress") != 0) {
            kiln_grpc_fail(c, KILN_GRPC_UNIMPLEMENTED, "Unsupported signature method_name: %s", method);
            goto out;
        }
        int si = kiln_servable_find_signature(sv, ms->signature_name);
        if (si < 0) {
            kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "Requested signature not found in model graph: %s",
                           ms->signature_name && ms->signature_name[0] ? ms->signature_name : "serving_default");
            goto out;
        }
        if (!run_examples(c, &rec, sv, si, classify, examples, &outs[i], &blocks[i])) goto out;
        kiln_grpc__inference_result__init(&res[i]);
        res[i].model_spec = spec_fill(&specs[i], ms->name, sv->version,
                                      kiln_signature_name(kiln_model_signature(sv->model, si)));
        if (classify) {
            res[i].result_case = KILN_GRPC__INFERENCE_RESULT__RESULT_CLASSIFICATION_RESULT;
            res[i].classification_result = &blocks[i].cr;
        } else {
            res[i].result_case = KILN_GRPC__INFERENCE_RESULT__RESULT_REGRESSION_RESULT;
            res[i].regression_result = &blocks[i].rr;
        }
        resp_p[i] = &res[i];
    }
    KilnGrpc__MultiInferenceResponse resp = KILN_GRPC__MULTI_INFERENCE_RESPONSE__INIT;
    resp.n_results = nt;
    resp.results = resp_p;
    pack(c, &resp.base);
out:
    for (size_t i = 0; outs && blocks && i < nt; i++) {
        result_block_free(&blocks[i]);
        kiln_batch_result_free(&outs[i]);
    }
    free(outs);
    free(blocks);
    free(res);
    free(resp_p);
    free(specs);
    kiln_tensor_free(examples);
    kiln_servable_release(sv);
    record(c, &rec);
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

/* ------------------------------------------------------------ HandleReloadConfigRequest */

static void h_reload_config(kiln_grpc_call *c)
{
    KilnGrpc__ReloadConfigRequest *r = (KilnGrpc__ReloadConfigRequest *)unpack(
        c, &kiln_grpc__reload_config_request__descriptor, "ReloadConfigRequest");
    if (!r) return;
    char err[KILN_CONFIG_ERR_LEN];
    kiln_server_config *cfg = NULL;
    KilnServing__ModelServerConfig empty = KILN_SERVING__MODEL_SERVER_CONFIG__INIT;
    kiln_status st = kiln_server_config_from_proto(r->config ? r->config : &empty,
                                                   "ReloadConfigRequest.config", &cfg, err);
    if (st != KILN_OK) {
        kiln_grpc_fail(c, st == KILN_ERR_OUT_OF_MEMORY ? KILN_GRPC_RESOURCE_EXHAUSTED
                                                       : KILN_GRPC_INVALID_ARGUMENT, "%s", err);
        goto out;
    }
    st = kiln_manager_reload(c->ctx->rest->manager, cfg);
    if (st != KILN_OK) {
        kiln_grpc_fail(c, kiln_grpc_code_of(kiln_serve_code_name(st)), "applying the config failed: %s",
                       kiln_serve_code_name(st));
        goto out;
    }
    KilnGrpc__ReloadConfigResponse resp = KILN_GRPC__RELOAD_CONFIG_RESPONSE__INIT;
    KilnGrpc__StatusProto ok = KILN_GRPC__STATUS_PROTO__INIT;
    resp.status = &ok;
    pack(c, &resp.base);
out:
    kiln_server_config_free(cfg);
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

/* ------------------------------------------------------------ health */

int kiln_grpc_health_status(const kiln_grpc_ctx *ctx, const char *service)
{
    static const char *const known[] = {
        "", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService",
        "PredictionService", "ModelService", /* TF Serving's own registration */
    };
    int found = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        found |= strcmp(known[i], service) == 0;
    if (!found) return -1;
    kiln_server *s = ctx->rest;
    if (!s) return 1; /* a transport without models (the fuzz target) */
    int ready = !atomic_load(&s->shutting_down) && kiln_manager_ready(s->manager);
    return ready ? 1 : 2;
}

void kiln_grpc_health_encode(int status, kiln_bytes *out)
{
    KilnGrpc__HealthCheckResponse resp = KILN_GRPC__HEALTH_CHECK_RESPONSE__INIT;
    resp.has_status = status != 0;
    resp.status = status;
    uint8_t buf[16];
    size_t n = protobuf_c_message_pack(&resp.base, buf);
    out->len = 0;
    kiln_bytes_put(out, buf, n);
}

int kiln_grpc_health_decode(const uint8_t *p, size_t n, char *buf, size_t cap)
{
    if (kiln_pb_check(&kiln_grpc__health_check_request__descriptor, p, n, 4, "HealthCheckRequest") !=
        KILN_OK)
        return 0;
    KilnGrpc__HealthCheckRequest *r = kiln_grpc__health_check_request__unpack(NULL, n, p);
    if (!r) return 0;
    snprintf(buf, cap, "%s", r->service ? r->service : "");
    kiln_grpc__health_check_request__free_unpacked(r, NULL);
    return 1;
}

static void h_health_check(kiln_grpc_call *c)
{
    char service[512];
    if (!kiln_grpc_health_decode(c->req, c->req_len, service, sizeof service)) {
        kiln_grpc_fail(c, KILN_GRPC_INVALID_ARGUMENT, "cannot parse HealthCheckRequest");
        return;
    }
    int st = kiln_grpc_health_status(c->ctx, service);
    if (st < 0) {
        kiln_grpc_fail(c, KILN_GRPC_NOT_FOUND, "unknown service %.200s", service);
        return;
    }
    kiln_grpc_health_encode(st, &c->resp);
    c->code = c->resp.oom ? KILN_GRPC_RESOURCE_EXHAUSTED : KILN_GRPC_OK;
}

/* ------------------------------------------------------------ method table */

static const kiln_grpc_method methods[] = {
    {"/tensorflow.serving.PredictionService/Predict", KILN_GRPC_UNARY, h_predict, "predict"},
    {"/tensorflow.serving.PredictionService/Classify", KILN_GRPC_UNARY, h_classify, "predict"},
    {"/tensorflow.serving.PredictionService/Regress", KILN_GRPC_UNARY, h_regress, "predict"},
    {"/tensorflow.serving.PredictionService/MultiInference", KILN_GRPC_UNARY, h_multi_inference, "predict"},
    {"/tensorflow.serving.PredictionService/GetModelMetadata", KILN_GRPC_UNARY, h_metadata, "metadata"},
    {"/tensorflow.serving.ModelService/GetModelStatus", KILN_GRPC_UNARY, h_model_status, "metadata"},
    {"/tensorflow.serving.ModelService/HandleReloadConfigRequest", KILN_GRPC_UNARY, h_reload_config, "admin"},
    {"/grpc.health.v1.Health/Check", KILN_GRPC_UNARY, h_health_check, NULL},
    {"/grpc.health.v1.Health/Watch", KILN_GRPC_HEALTH_WATCH, NULL, NULL},
    {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", KILN_GRPC_REFLECTION, NULL, NULL},
    {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", KILN_GRPC_REFLECTION, NULL, NULL},
};

int kiln_grpc_refuse_unauthorized(kiln_grpc_call *c, const kiln_grpc_method *m)
{
    const kiln_server *s = c->ctx ? c->ctx->rest : NULL;
    if (!m->scope || !s || !s->opt.authorize) return 0; /* open, as TF Serving */
    int code = s->opt.authorize(s->opt.authorize_ctx, c->authorization, m->scope);
    if (code == 0) return 0;
    if (code == 401)
        kiln_grpc_fail(c, KILN_GRPC_UNAUTHENTICATED,
                       "a valid token is required: send the metadata authorization: Bearer TOKEN");
    else
        kiln_grpc_fail(c, KILN_GRPC_PERMISSION_DENIED, "the token does not grant the '%s' scope",
                       m->scope);
    return 1;
}

const kiln_grpc_method *kiln_grpc_method_find(const char *path)
{
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (strcmp(methods[i].path, path) == 0) return &methods[i];
    return NULL;
}
