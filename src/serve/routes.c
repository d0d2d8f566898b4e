/*
 * routes.c - the route table and handlers: TF Serving's REST API
 * (/v1/models/...), Kiln's model list, KServe v2 (/v2/...), the
 * Prometheus page, and the web console (/console/..., answered by console.c).
 *
 * A path is first parsed into a route kind and its parameters (model name,
 * version, label) following TF Serving's URL grammar, case-insensitively;
 * the table then maps method + kind to a handler. Every handler has one
 * shape: parse, validate, call the runtime, write the reply, and return
 * right after an error reply.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "serve/batch.h"
#include "serve/codec.h"
#include "serve/console.h"
#include "serve/example.h"
#include "serve/gate/release.h"
#include "serve/results.h"
#include "serve/server.h"
#include "serve/shadow/shadow.h"

typedef enum route_kind {
    ROUTE_NONE = 0,
    ROUTE_V1_LIST,
    ROUTE_V1_STATUS,
    ROUTE_V1_METADATA,
    ROUTE_V1_PREDICT,
    ROUTE_V1_CLASSIFY,
    ROUTE_V1_REGRESS,
    ROUTE_V1_MALFORMED, /* under /v1/ but matching neither TF Serving regex */
    ROUTE_V2_SERVER,
    ROUTE_V2_LIVE,
    ROUTE_V2_READY,
    ROUTE_V2_MODEL,
    ROUTE_V2_MODEL_READY,
    ROUTE_V2_INFER,
    ROUTE_METRICS,
    ROUTE_CORS_PREFLIGHT, /* OPTIONS, with --rest_api_enable_cors_support */
    ROUTE_CONSOLE,        /* /console and below, unless --enable_console=false (console.c) */
    ROUTE_V1_SHADOW,      /* /v1/shadow[/MODEL]: shadow comparisons (shadow/shadow.h) */
    ROUTE_V1_MONITORING,  /* GET /v1/models/NAME/monitoring (serve/monitor/) */
} route_kind;

typedef struct route_params {
    char name[256];
    int64_t version; /* -1 = latest */
    char label[256]; /* "" = none */
} route_params;

typedef void (*route_handler)(kiln_server *s, const kiln_http_request *req,
                              const route_params *p, kiln_http_reply *rep);

/* ------------------------------------------------------------ replies */

static int http_code(const char *code)
{
    static const struct {
        const char *name;
        int http;
    } map[] = {
        {"OK", 200},          {"CANCELLED", 499},          {"UNKNOWN", 500},
        {"INVALID_ARGUMENT", 400}, {"DEADLINE_EXCEEDED", 504}, {"NOT_FOUND", 404},
        {"ALREADY_EXISTS", 409},   {"PERMISSION_DENIED", 403}, {"RESOURCE_EXHAUSTED", 429},
        {"FAILED_PRECONDITION", 400}, {"ABORTED", 409},       {"OUT_OF_RANGE", 400},
        {"UNIMPLEMENTED", 501},    {"INTERNAL", 500},          {"UNAVAILABLE", 503},
        {"DATA_LOSS", 500},        {"UNAUTHENTICATED", 401},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(map[i].name, code) == 0) return map[i].http;
    return 500;
}

void kiln_reply_error(kiln_http_reply *rep, const char *code, const char *msg)
{
    rep->code = http_code(code);
    rep->status = code;
    rep->content_type = "application/json";
    rep->body.len = 0;
    kiln_sbuf_puts(&rep->body, "{ \"error\": ");
    kiln_sbuf_json_string(&rep->body, msg, strlen(msg));
    kiln_sbuf_puts(&rep->body, " }");
}

/* ------------------------------------------------------------ path parsing */

static int prefix(const char **p, const char *lit)
{
    size_t n = strlen(lit);
    if (strncasecmp(*p, lit, n) != 0) return 0;
    *p += n;
    return 1;
}

/* Copy a [^/:]+ segment (or [^/]+ with colon_ok) into out; 0 if empty/too long. */
static int segment(const char **p, char *out, size_t cap, int colon_ok)
{
    size_t n = 0;
    while ((*p)[n] && (*p)[n] != '/' && (colon_ok || (*p)[n] != ':')) n++;
    if (n == 0 || n >= cap) return 0;
    memcpy(out, *p, n);
    out[n] = '\0';
    *p += n;
    return 1;
}

static int digits(const char **p, int64_t *out)
{
    int64_t v = 0;
    const char *s = *p;
    if (*s < '0' || *s > '9') return 0;
    while (*s >= '0' && *s <= '9') {
        if (v > (INT64_MAX - 9) / 10) return 0;
        v = v * 10 + (*s++ - '0');
    }
    *p = s;
    *out = v;
    return 1;
}

/* Optional /versions/N or /labels/L. 0 on a malformed suffix. */
static int version_part(const char **p, route_params *rp)
{
    if (prefix(p, "/versions/")) return digits(p, &rp->version);
    if (prefix(p, "/labels/")) return segment(p, rp->label, sizeof rp->label, 0);
    return 1;
}

/* metrics_path: the Prometheus page's path, or NULL when it is not served;
 * console: the web console is served. */
static route_kind parse_path(const char *method, const char *path, const char *metrics_path,
                             int console, route_params *rp)
{
    memset(rp, 0, sizeof *rp);
    rp->version = -1;
    const char *p = path;
    int post = strcmp(method, "POST") == 0;
    if (strcmp(method, "OPTIONS") == 0) return ROUTE_CORS_PREFLIGHT;
    if (metrics_path && strcmp(path, metrics_path) == 0) return ROUTE_METRICS;
    if (console && (strcmp(path, "/console") == 0 || strncmp(path, "/console/", 9) == 0))
        return ROUTE_CONSOLE;
    if (prefix(&p, "/v1/")) {
        if (prefix(&p, "shadow") &&
            (*p == '\0' || (prefix(&p, "/") && segment(&p, rp->name, sizeof rp->name, 0) && !*p)))
            return ROUTE_V1_SHADOW;
        p = path;
        if (!prefix(&p, "/v1/models")) return ROUTE_V1_MALFORMED;
        if (*p == '\0') return post ? ROUTE_V1_MALFORMED : ROUTE_V1_LIST;
        if (!prefix(&p, "/") || !segment(&p, rp->name, sizeof rp->name, 0) ||
            !version_part(&p, rp))
            return ROUTE_V1_MALFORMED;
        if (post) {
            if (strcasecmp(p, ":predict") == 0) return ROUTE_V1_PREDICT;
            if (strcasecmp(p, ":classify") == 0) return ROUTE_V1_CLASSIFY;
            if (strcasecmp(p, ":regress") == 0) return ROUTE_V1_REGRESS;
            return ROUTE_V1_MALFORMED;
        }
        if (*p == '\0') return ROUTE_V1_STATUS;
        if (strcasecmp(p, "/metadata") == 0) return ROUTE_V1_METADATA;
        if (strcmp(p, "/monitoring") == 0 && rp->version < 0 && !rp->label[0])
            return ROUTE_V1_MONITORING;
        return ROUTE_V1_MALFORMED;
    }
    if (strcmp(p, "/v2") == 0) return ROUTE_V2_SERVER;
    if (strcmp(p, "/v2/health/live") == 0) return ROUTE_V2_LIVE;
    if (strcmp(p, "/v2/health/ready") == 0) return ROUTE_V2_READY;
    if (prefix(&p, "/v2/models/")) {
        if (!segment(&p, rp->name, sizeof rp->name, 1)) return ROUTE_NONE;
        if (prefix(&p, "/versions/") && !digits(&p, &rp->version)) return ROUTE_NONE;
        if (*p == '\0') return ROUTE_V2_MODEL;
        if (strcmp(p, "/ready") == 0) return ROUTE_V2_MODEL_READY;
        if (strcmp(p, "/infer") == 0) return ROUTE_V2_INFER;
    }
    return ROUTE_NONE;
}

/* ------------------------------------------------------------ helpers */

/* The servable named by the path, or NULL after an error reply. A request
 * that names no version and no label goes where the observers' route sends
 * it (a traffic split; observe.h). */
static kiln_servable *acquire(kiln_server *s, const kiln_http_request *req, const route_params *p,
                              kiln_http_reply *rep)
{
    char err[KILN_JSON_ERR_LEN];
    const char *code = "NOT_FOUND";
    int routed = 0;
    int64_t version = kiln_observers_route(s->opt.observers, p->name, p->version, p->label,
                                           req->route_key, &routed);
    kiln_servable *sv = kiln_manager_acquire(s->manager, p->name, version, p->label, err, &code);
    if (!sv && routed) /* the split's version is gone: the default serves */
        sv = kiln_manager_acquire(s->manager, p->name, p->version, p->label, err, &code);
    else rep->routed = routed;
    if (!sv) kiln_reply_error(rep, code, err);
    else rep->version = sv->version;
    return sv;
}

/* Signature index by name (NULL = default), or -1. */
static int find_signature(const kiln_servable *sv, const char *name)
{
    const kiln_signature *sig = kiln_model_find_signature(sv->model, name);
    if (!sig) return -1;
    for (int i = 0; i < sv->n_sessions; i++)
        if (kiln_model_signature(sv->model, i) == sig) return i;
    return -1;
}

static kiln_value_info *input_specs(const kiln_signature *sig, int *n)
{
    *n = kiln_signature_input_count(sig);
    kiln_value_info *v = calloc(*n > 0 ? (size_t)*n : 1, sizeof *v);
    if (!v) return NULL;
    for (int i = 0; i < *n; i++) v[i] = *kiln_signature_input(sig, i);
    return v;
}

/* Run signature si of sv (batched or not, with the request's deadline),
 * between the observers' check and after (observe.h); replies on error. */
static int run(kiln_server *s, kiln_servable *sv, int si, const kiln_http_request *req,
               kiln_tensor **in, int n, kiln_batch_result *out, kiln_http_reply *rep)
{
    char err[KILN_JSON_ERR_LEN];
    const char *code = "OK";
    const kiln_observers *obs = s->opt.observers;
    kiln_observation o = {"REST", rep->api, rep->model, sv, si, in, n, NULL, "OK", 0.0,
                          rep->routed, req->route_key};
    if (obs && obs->n > 0 && kiln_observers_check(obs, &o, err, &code) != KILN_OK) {
        kiln_reply_error(rep, code, err);
        return 0;
    }
    double t0 = obs && obs->n > 0 ? kiln_observe_now_us() : 0.0;
    kiln_status st = kiln_servable_run(sv, si, in, n, req->deadline_ms, out, err, &code);
    if (obs && obs->n > 0) {
        o.latency_us = kiln_observe_now_us() - t0;
        o.out = st == KILN_OK ? out : NULL;
        o.code = st == KILN_OK ? "OK" : code;
        kiln_observers_after(obs, &o);
    }
    if (st != KILN_OK) {
        kiln_reply_error(rep, code, err);
        return 0;
    }
    return 1;
}

static void free_tensors(kiln_tensor **t, int n)
{
    for (int i = 0; i < n; i++) kiln_tensor_free(t[i]);
    free(t);
}

/* ------------------------------------------------------------ handlers */

static void h_v1_list(kiln_server *s, const kiln_http_request *req, const route_params *p,
                      kiln_http_reply *rep)
{
    kiln_manager_write_list(s->manager, &rep->body);
}

static void h_v1_malformed(kiln_server *s, const kiln_http_request *req, const route_params *p,
                           kiln_http_reply *rep)
{
    char msg[600];
    snprintf(msg, sizeof msg, "Malformed request: %s %.500s", req->method, req->path);
    kiln_reply_error(rep, "INVALID_ARGUMENT", msg);
}

static void h_v1_status(kiln_server *s, const kiln_http_request *req, const route_params *p,
                        kiln_http_reply *rep)
{
    char err[KILN_JSON_ERR_LEN];
    snprintf(rep->model, sizeof rep->model, "%s", p->name);
    rep->api = "status";
    int64_t version = p->version;
    if (p->label[0] &&
        kiln_manager_resolve_label(s->manager, p->name, p->label, &version, err) != KILN_OK) {
        kiln_reply_error(rep, "INVALID_ARGUMENT", err);
        return;
    }
    if (kiln_manager_write_status(s->manager, p->name, version, &rep->body, err) != KILN_OK)
        kiln_reply_error(rep, "NOT_FOUND", err);
}

static void write_tensor_info(kiln_sbuf *b, const kiln_value_info *v, int last)
{
    kiln_sbuf_puts(b, "      ");
    kiln_sbuf_json_string(b, v->name, strlen(v->name));
    kiln_sbuf_printf(b, ": {\"dtype\": \"%s\", \"tensor_shape\": {\"dim\": [",
                     kiln_tf_dtype_enum(v->dtype));
    for (int d = 0; d < v->rank; d++)
        kiln_sbuf_printf(b, "%s{\"size\": \"%" PRId64 "\", \"name\": \"\"}", d ? ", " : "",
                         v->dims[d]);
    kiln_sbuf_printf(b, "], \"unknown_rank\": %s}, \"name\": ", v->rank < 0 ? "true" : "false");
    kiln_sbuf_json_string(b, v->name, strlen(v->name));
    kiln_sbuf_puts(b, last ? "}\n" : "},\n");
}

static void h_v1_metadata(kiln_server *s, const kiln_http_request *req, const route_params *p,
                          kiln_http_reply *rep)
{
    snprintf(rep->model, sizeof rep->model, "%s", p->name);
    rep->api = "metadata";
    kiln_servable *sv = acquire(s, req, p, rep);
    if (!sv) return;
    kiln_sbuf *b = &rep->body;
    kiln_sbuf_puts(b, "{\n\"model_spec\": {\"name\": ");
    kiln_sbuf_json_string(b, p->name, strlen(p->name));
    kiln_sbuf_printf(b, ", \"signature_name\": \"\", \"version\": \"%" PRId64 "\"},\n", sv->version);
    kiln_sbuf_puts(b, "\"metadata\": {\"signature_def\": {\n \"signature_def\": {\n");
    int n = kiln_model_signature_count(sv->model);
    for (int i = 0; i < n; i++) {
        const kiln_signature *sig = kiln_model_signature(sv->model, i);
        const char *name = kiln_signature_name(sig);
        kiln_sbuf_puts(b, "  ");
        kiln_sbuf_json_string(b, name, strlen(name));
        kiln_sbuf_puts(b, ": {\n   \"inputs\": {\n");
        int ni = kiln_signature_input_count(sig), no = kiln_signature_output_count(sig);
        for (int k = 0; k < ni; k++) write_tensor_info(b, kiln_signature_input(sig, k), k + 1 == ni);
        kiln_sbuf_puts(b, "   },\n   \"outputs\": {\n");
        for (int k = 0; k < no; k++)
            write_tensor_info(b, kiln_signature_output(sig, k), k + 1 == no);
        const char *method = kiln_signature_method(sig);
        kiln_sbuf_puts(b, "   },\n   \"method_name\": ");
        method = method ? method : "tensorflow/serving/predict";
        kiln_sbuf_json_string(b, method, strlen(method));
        kiln_sbuf_puts(b, i + 1 < n ? "\n  },\n" : "\n  }\n");
    }
    kiln_sbuf_puts(b, " }\n}");
    /* the version's assets.extra/kiln_version.json, as gRPC's metadata map carries it */
    if (sv->version_info) {
        kiln_sbuf_puts(b, ",\n\"kiln_version_info\": ");
        kiln_version_info_write_json(b, sv->version_info);
    }
    /* the precision it runs in (--allow_compression, docs/COMPRESSION.md) */
    kiln_sbuf_printf(b, ",\n\"kiln_precision\": \"%s\"", sv->precision);
    kiln_sbuf_puts(b, "\n}\n}\n");
    kiln_servable_release(sv);
}

static void h_v1_predict(kiln_server *s, const kiln_http_request *req, const route_params *p,
                         kiln_http_reply *rep)
{
    char err[KILN_JSON_ERR_LEN];
    snprintf(rep->model, sizeof rep->model, "%s", p->name);
    rep->api = "predict";
    kiln_servable *sv = acquire(s, req, p, rep);
    if (!sv) return;
    kiln_json_doc doc;
    kiln_predict_request pr;
    kiln_value_info *specs = NULL;
    kiln_tensor **in = NULL;
    char *sig_name = NULL;
    int n = 0;
    if (kiln_json_parse(req->body, req->body_len, KILN_JSON_MAX_DEPTH, &doc, err) != KILN_OK) {
        kiln_reply_error(rep, "INVALID_ARGUMENT", err);
        goto err_release;
    }
    kiln_status st = kiln_predict_parse(&doc, &pr, err);
    if (st != KILN_OK) {
        kiln_reply_error(rep, kiln_serve_code_for(st), err);
        goto err_free_doc;
    }
    if (pr.signature >= 0) sig_name = kiln_json_string_dup(&doc, pr.signature, NULL);
    int si = find_signature(sv, sig_name);
    if (si < 0) {
        snprintf(err, sizeof err, "Serving signature name: \"%.200s\" not found in signature def",
                 sig_name ? sig_name : "serving_default");
        kiln_reply_error(rep, "INVALID_ARGUMENT", err);
        goto err_free_doc;
    }
    specs = input_specs(kiln_model_signature(sv->model, si), &n);
    in = calloc(n > 0 ? (size_t)n : 1, sizeof *in);
    if (!specs || !in) {
        kiln_reply_error(rep, "RESOURCE_EXHAUSTED", "out of memory");
        goto err_free_doc;
    }
    st = kiln_predict_decode(&doc, &pr, specs, n, in, err);
    if (st != KILN_OK) {
        kiln_reply_error(rep, kiln_serve_code_for(st), err);
        goto err_free_doc;
    }
    /* with --enable_batching, merged with concurrent requests and split back */
    kiln_batch_result br;
    if (!run(s, sv, si, req, in, n, &br, rep)) goto err_free_doc;
    st = kiln_predict_encode(&rep->body, pr.columnar, br.n, br.names,
                             (const kiln_tensor *const *)br.t, err);
    if (st != KILN_OK) kiln_reply_error(rep, kiln_serve_code_for(st), err);
    kiln_batch_result_free(&br);
err_free_doc:
    if (in) free_tensors(in, n);
    free(specs);
    free(sig_name);
    kiln_json_doc_free(&doc);
err_release:
    kiln_servable_release(sv);
}

/* Write {"results": ...} for a classify (classes and/or scores, [n, k]) or
 * regress (outputs, [n] or [n, 1]) run over n examples. */
static kiln_status write_results(kiln_sbuf *b, int classify, const kiln_batch_result *out, int64_t n,
                                 char *err)
{
    if (!classify) {
        const float *y;
        kiln_status st = kiln_results_regress(out, n, &y, err);
        if (st != KILN_OK) return st;
        kiln_sbuf_puts(b, "{\n    \"results\": [");
        for (int64_t i = 0; i < n; i++) kiln_sbuf_printf(b, "%s%.9g", i ? ", " : "", y[i]);
        kiln_sbuf_puts(b, "]\n}\n");
        return KILN_OK;
    }
    kiln_class_results r;
    kiln_status st = kiln_results_classify(out, n, &r, err);
    if (st != KILN_OK) return st;
    int64_t k = r.k;
    kiln_sbuf_puts(b, "{\n    \"results\": [");
    for (int64_t i = 0; i < n; i++) {
        kiln_sbuf_puts(b, i ? ", [" : "[");
        for (int64_t c = 0; c < k; c++) {
            kiln_sbuf_puts(b, c ? ", [" : "[");
            if (r.classes) {
                const kiln_string *sv = &((const kiln_string *)r.classes->data)[i * k + c];
                kiln_sbuf_json_string(b, sv->data ? sv->data : "", sv->len);
            } else {
                kiln_sbuf_puts(b, "\"\"");
            }
            kiln_sbuf_printf(b, ", %.9g]", r.scores ? ((const float *)r.scores->data)[i * k + c] : 0.0);
        }
        kiln_sbuf_puts(b, "]");
    }
    kiln_sbuf_puts(b, "]\n}\n");
    return KILN_OK;
}

/* :classify and :regress: examples -> serialized tf.Example -> the
 * signature's string input -> {"results": ...}. */
static void h_v1_classify(kiln_server *s, const kiln_http_request *req, const route_params *p,
                          kiln_http_reply *rep)
{
    char err[KILN_JSON_ERR_LEN];
    int classify = strcasecmp(strrchr(req->path, ':'), ":classify") == 0;
    snprintf(rep->model, sizeof rep->model, "%s", p->name);
    rep->api = classify ? "classify" : "regress";
    kiln_servable *sv = acquire(s, req, p, rep);
    if (!sv) return;
    kiln_json_doc doc;
    char *sig_name = NULL;
    kiln_tensor *examples = NULL;
    if (kiln_json_parse(req->body, req->body_len, KILN_JSON_MAX_DEPTH, &doc, err) != KILN_OK) {
        kiln_reply_error(rep, "INVALID_ARGUMENT", err);
        goto err_release;
    }
    if (doc.tok[0].type != KILN_JSON_OBJECT) {
        kiln_reply_error(rep, "INVALID_ARGUMENT", "Is not object");
        goto err_free_doc;
    }
    int sn = kiln_json_object_get(&doc, 0, "signature_name");
    if (sn >= 0) {
        if (doc.tok[sn].type != KILN_JSON_STRING) {
            kiln_reply_error(rep, "INVALID_ARGUMENT", "'signature_name' key must be a string value.");
            goto err_free_doc;
        }
        sig_name = kiln_json_string_dup(&doc, sn, NULL);
    }
    int si = find_signature(sv, sig_name);
    if (si < 0) {
        snprintf(err, sizeof err, "Serving signature name: \"%.200s\" not found in signature def",
                 sig_name ? sig_name : "serving_default");
        kiln_reply_error(rep, "INVALID_ARGUMENT", err);
        goto err_free_doc;
    }
    const kiln_signature *sig = kiln_model_signature(sv->model, si);
    if (kiln_results_check_signature(sig, classify, err) != KILN_OK) {
        kiln_reply_error(rep, "INVALID_ARGUMENT", err);
        goto err_free_doc;
    }
    kiln_status st = kiln_examples_encode(&doc, 0, &examples, err);
    if (st != KILN_OK) {
        kiln_reply_error(rep, kiln_serve_code_for(st), err);
        goto err_free_doc;
    }
    kiln_batch_result out;
    if (!run(s, sv, si, req, &examples, 1, &out, rep)) goto err_free_doc;
    st = write_results(&rep->body, classify, &out, examples->dims[0], err);
    if (st != KILN_OK) kiln_reply_error(rep, kiln_serve_code_for(st), err);
    kiln_batch_result_free(&out);
err_free_doc:
    kiln_tensor_free(examples);
    free(sig_name);
    kiln_json_doc_free(&doc);
err_release:
    kiln_servable_release(sv);
}

static void h_v2_server(kiln_server *s, const kiln_http_request *req, const route_params *p,
                        kiln_http_reply *rep)
{
    kiln_sbuf_printf(&rep->body, "{\"name\": \"kiln\", \"version\": \"%s\", \"extensions\": []}\n",
                     kiln_version());
}

static void h_v2_live(kiln_server *s, const kiln_http_request *req, const route_params *p,
                      kiln_http_reply *rep)
{
    kiln_sbuf_puts(&rep->body, "{\"live\": true}\n");
}

static void h_v2_ready(kiln_server *s, const kiln_http_request *req, const route_params *p,
                       kiln_http_reply *rep)
{
    int ready = !atomic_load(&s->shutting_down) && kiln_manager_ready(s->manager);
    rep->code = ready ? 200 : 503;
    kiln_sbuf_printf(&rep->body, "{\"ready\": %s}\n", ready ? "true" : "false");
}

static void h_v2_model_ready(kiln_server *s, const kiln_http_request *req, const route_params *p,
                             kiln_http_reply *rep)
{
    char err[KILN_JSON_ERR_LEN];
    if (!kiln_manager_has_model(s->manager, p->name)) {
        snprintf(err, sizeof err, "Could not find any versions of model %.200s", p->name);
        kiln_reply_error(rep, "NOT_FOUND", err);
        return;
    }
    kiln_servable *sv = kiln_manager_acquire(s->manager, p->name, p->version, NULL, err, NULL);
    int ready = sv != NULL && !atomic_load(&s->shutting_down);
    kiln_servable_release(sv);
    rep->code = ready ? 200 : 503;
    kiln_sbuf_puts(&rep->body, "{\"name\": ");
    kiln_sbuf_json_string(&rep->body, p->name, strlen(p->name));
    kiln_sbuf_printf(&rep->body, ", \"ready\": %s}\n", ready ? "true" : "false");
}

static void write_v2_tensors(kiln_sbuf *b, const kiln_signature *sig, int outputs)
{
    int n = outputs ? kiln_signature_output_count(sig) : kiln_signature_input_count(sig);
    kiln_sbuf_puts(b, "[");
    for (int i = 0; i < n; i++) {
        const kiln_value_info *v = outputs ? kiln_signature_output(sig, i)
                                           : kiln_signature_input(sig, i);
        kiln_sbuf_puts(b, i ? ", {\"name\": " : "{\"name\": ");
        kiln_sbuf_json_string(b, v->name, strlen(v->name));
        kiln_sbuf_printf(b, ", \"datatype\": \"%s\", \"shape\": [", kiln_kserve_datatype(v->dtype));
        for (int d = 0; d < v->rank; d++)
            kiln_sbuf_printf(b, "%s%" PRId64, d ? ", " : "", v->dims[d]);
        kiln_sbuf_puts(b, "]}");
    }
    kiln_sbuf_puts(b, "]");
}

static void h_v2_model(kiln_server *s, const kiln_http_request *req, const route_params *p,
                       kiln_http_reply *rep)
{
    snprintf(rep->model, sizeof rep->model, "%s", p->name);
    rep->api = "metadata";
    kiln_servable *sv = acquire(s, req, p, rep);
    if (!sv) return;
    const kiln_signature *sig = kiln_model_find_signature(sv->model, NULL);
    const char *fmt = kiln_model_format(sv->model);
    kiln_sbuf *b = &rep->body;
    kiln_sbuf_puts(b, "{\"name\": ");
    kiln_sbuf_json_string(b, p->name, strlen(p->name));
    kiln_sbuf_printf(b, ", \"versions\": [\"%" PRId64 "\"], \"platform\": \"%s\", \"inputs\": ",
                     sv->version,
                     fmt && strcasecmp(fmt, "onnx") == 0 ? "onnx_onnxv1" : "tensorflow_savedmodel");
    if (sig) write_v2_tensors(b, sig, 0);
    else kiln_sbuf_puts(b, "[]");
    kiln_sbuf_puts(b, ", \"outputs\": ");
    if (sig) write_v2_tensors(b, sig, 1);
    else kiln_sbuf_puts(b, "[]");
    if (sv->version_info) { /* assets.extra/kiln_version.json as string parameters */
        int wrote = 0;
        kiln_sbuf_puts(b, ", \"parameters\": {");
        kiln_version_info_write_params(b, sv->version_info, &wrote);
        kiln_sbuf_puts(b, "}");
    }
    kiln_sbuf_puts(b, "}\n");
    kiln_servable_release(sv);
}

static void h_v2_infer(kiln_server *s, const kiln_http_request *req, const route_params *p,
                       kiln_http_reply *rep)
{
    char err[KILN_JSON_ERR_LEN];
    snprintf(rep->model, sizeof rep->model, "%s", p->name);
    rep->api = "predict";
    kiln_servable *sv = acquire(s, req, p, rep);
    if (!sv) return;
    kiln_json_doc doc;
    kiln_value_info *specs = NULL;
    kiln_tensor **in = NULL;
    int n = 0;
    if (kiln_json_parse(req->body, req->body_len, KILN_JSON_MAX_DEPTH, &doc, err) != KILN_OK) {
        kiln_reply_error(rep, "INVALID_ARGUMENT", err);
        goto err_release;
    }
    int si = find_signature(sv, NULL);
    if (si < 0) {
        kiln_reply_error(rep, "INVALID_ARGUMENT", "the model has no default signature");
        goto err_free_doc;
    }
    specs = input_specs(kiln_model_signature(sv->model, si), &n);
    in = calloc(n > 0 ? (size_t)n : 1, sizeof *in);
    if (!specs || !in) {
        kiln_reply_error(rep, "RESOURCE_EXHAUSTED", "out of memory");
        goto err_free_doc;
    }
    kiln_status st = kiln_infer_decode(&doc, specs, n, in, err);
    if (st != KILN_OK) {
        kiln_reply_error(rep, kiln_serve_code_for(st), err);
        goto err_free_doc;
    }
    kiln_batch_result out;
    if (!run(s, sv, si, req, in, n, &out, rep)) goto err_free_doc;
    kiln_infer_encode(&rep->body, p->name, sv->version, &doc, out.n, out.names,
                      (const kiln_tensor *const *)out.t);
    kiln_batch_result_free(&out);
err_free_doc:
    if (in) free_tensors(in, n);
    free(specs);
    kiln_json_doc_free(&doc);
err_release:
    kiln_servable_release(sv);
}

static void h_metrics(kiln_server *s, const kiln_http_request *req, const route_params *p,
                      kiln_http_reply *rep)
{
    rep->content_type = "text/plain; version=0.0.4";
    kiln_metrics_write(s->metrics, &rep->body, atomic_load(&s->in_flight));
    kiln_manager_write_metrics(s->manager, &rep->body);
    kiln_batch_stats_write(s->opt.batch_stats, &rep->body);
    kiln_observers_write_metrics(s->opt.observers, &rep->body);
}

/* Model monitoring's view of a model's versions (docs/MONITORING.md). */
static void h_v1_monitoring(kiln_server *s, const kiln_http_request *req, const route_params *p,
                            kiln_http_reply *rep)
{
    char err[KILN_JSON_ERR_LEN];
    snprintf(rep->model, sizeof rep->model, "%s", p->name);
    rep->api = "monitoring";
    if (!kiln_manager_has_model(s->manager, p->name)) {
        snprintf(err, sizeof err, "Servable not found for request: Latest(%.400s)", p->name);
        kiln_reply_error(rep, "NOT_FOUND", err);
        return;
    }
    if (!kiln_observers_write_json(s->opt.observers, "monitor", p->name, &rep->body))
        kiln_reply_error(rep, "NOT_FOUND", "model monitoring is off (--enable_model_monitoring)");
}

/* TF Serving's CORS preflight: OK when the Origin header is an http(s) URL;
 * the CORS headers themselves are added to every reply by server.c. */
static void h_cors_preflight(kiln_server *s, const kiln_http_request *req, const route_params *p,
                             kiln_http_reply *rep)
{
    const char *o = req->origin ? req->origin : "";
    if (strncasecmp(o, "http://", 7) != 0 && strncasecmp(o, "https://", 8) != 0)
        kiln_reply_error(rep, "FAILED_PRECONDITION", "Origin header is missing in CORS preflight");
}

static void h_console(kiln_server *s, const kiln_http_request *req, const route_params *p,
                      kiln_http_reply *rep)
{
    kiln_console_serve(s, req, rep);
}

/* GET /v1/shadow[/MODEL]: the shadow comparisons' aggregates. */
static void h_v1_shadow(kiln_server *s, const kiln_http_request *req, const route_params *p,
                        kiln_http_reply *rep)
{
    char err[KILN_SHADOW_ERR_LEN];
    rep->api = "shadow";
    int deny = kiln_server_authorize(s, req, "metadata");
    if (deny == 401) {
        kiln_reply_error(rep, "UNAUTHENTICATED", "not authorized to read shadow statistics");
        return;
    }
    if (deny) {
        kiln_reply_error(rep, "PERMISSION_DENIED", "not authorized to read shadow statistics");
        return;
    }
    if (!s->opt.shadow) {
        kiln_reply_error(rep, "NOT_FOUND", "no shadow is configured (--rollout_config_file)");
        return;
    }
    if (kiln_shadow_write_json(s->opt.shadow, p->name[0] ? p->name : NULL, &rep->body, err) !=
        KILN_OK)
        kiln_reply_error(rep, "NOT_FOUND", err);
}

static const struct route {
    const char *method;
    route_kind kind;
    route_handler fn;
} kiln_routes[] = {
    {"GET", ROUTE_V1_LIST, h_v1_list},
    {"GET", ROUTE_V1_STATUS, h_v1_status},
    {"GET", ROUTE_V1_METADATA, h_v1_metadata},
    {"POST", ROUTE_V1_PREDICT, h_v1_predict},
    {"POST", ROUTE_V1_CLASSIFY, h_v1_classify},
    {"POST", ROUTE_V1_REGRESS, h_v1_classify},
    {NULL, ROUTE_V1_MALFORMED, h_v1_malformed}, /* any method */
    {"GET", ROUTE_V2_SERVER, h_v2_server},
    {"GET", ROUTE_V2_LIVE, h_v2_live},
    {"GET", ROUTE_V2_READY, h_v2_ready},
    {"GET", ROUTE_V2_MODEL, h_v2_model},
    {"GET", ROUTE_V2_MODEL_READY, h_v2_model_ready},
    {"POST", ROUTE_V2_INFER, h_v2_infer},
    {"GET", ROUTE_METRICS, h_metrics},
    {"OPTIONS", ROUTE_CORS_PREFLIGHT, h_cors_preflight},
    {"GET", ROUTE_CONSOLE, h_console},
    {"GET", ROUTE_V1_SHADOW, h_v1_shadow},
    {"GET", ROUTE_V1_MONITORING, h_v1_monitoring},
};

/* Access control (--auth_token_file, docs/SECURITY.md): the routes anyone
 * may call (probes, the Prometheus page, CORS preflights, which browsers
 * send without credentials), and the scope the others need; NULL for any
 * valid token (unknown paths, malformed /v1/ paths, and routes whose
 * handlers check a finer scope themselves, such as admin actions). */
static int route_open(route_kind kind)
{
    return kind == ROUTE_V2_LIVE || kind == ROUTE_V2_READY || kind == ROUTE_METRICS ||
           kind == ROUTE_CORS_PREFLIGHT;
}

static const char *route_scope(route_kind kind, const char *method)
{
    switch (kind) {
    case ROUTE_V1_PREDICT:
    case ROUTE_V1_CLASSIFY:
    case ROUTE_V1_REGRESS:
    case ROUTE_V2_INFER:
        return "predict";
    case ROUTE_V1_LIST:
    case ROUTE_V1_STATUS:
    case ROUTE_V1_METADATA:
    case ROUTE_V2_SERVER:
    case ROUTE_V2_MODEL:
    case ROUTE_V2_MODEL_READY:
    case ROUTE_V1_SHADOW:
    case ROUTE_V1_MONITORING:
        return "metadata";
    case ROUTE_CONSOLE: /* views are GETs; anything else is an action */
        return strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0 ? "metadata" : "admin";
    default:
        return NULL;
    }
}

/* Answer 401 / 403 when the request may not use its route; 1 if refused. */
static int refuse_unauthorized(kiln_server *s, const kiln_http_request *req, route_kind kind,
                               kiln_http_reply *rep)
{
    if (route_open(kind)) return 0;
    const char *scope = route_scope(kind, req->method);
    int code = kiln_server_authorize(s, req, scope);
    if (code == 0) return 0;
    char msg[200];
    if (code == 401) {
        kiln_reply_error(rep, "UNAUTHENTICATED",
                         "a valid token is required: send Authorization: Bearer TOKEN");
        /* browsers on the console get a password prompt (the token as password) */
        rep->www_authenticate = kind == ROUTE_CONSOLE ? "Basic realm=\"kiln console\", charset=\"UTF-8\""
                                                      : "Bearer realm=\"kiln\"";
    } else {
        snprintf(msg, sizeof msg, "the token does not grant the '%s' scope",
                 scope ? scope : "required");
        kiln_reply_error(rep, "PERMISSION_DENIED", msg);
    }
    return 1;
}

int kiln_routes_refuse_unauthorized(kiln_server *s, const kiln_http_request *req,
                                    kiln_http_reply *rep)
{
    route_params p;
    route_kind kind = parse_path(req->method, req->path, s->opt.metrics_path, s->opt.console, &p);
    if (kind == ROUTE_CORS_PREFLIGHT && !s->opt.cors)
        kind = parse_path("GET", req->path, s->opt.metrics_path, s->opt.console, &p);
    return refuse_unauthorized(s, req, kind, rep);
}

void kiln_routes_dispatch(kiln_server *s, const kiln_http_request *req, kiln_http_reply *rep)
{
    route_params p;
    route_kind kind = parse_path(req->method, req->path, s->opt.metrics_path, s->opt.console, &p);
    rep->code = 200;
    rep->status = "OK";
    rep->version = -1;
    if (s->opt.ext_handler && s->opt.ext_prefix && strcmp(req->method, "OPTIONS") != 0 &&
        strncmp(req->path, s->opt.ext_prefix, strlen(s->opt.ext_prefix)) == 0) {
        s->opt.ext_handler(s->opt.ext_ctx, s, req, rep);
        return;
    }
    /* without --rest_api_enable_cors_support OPTIONS is routed like any method */
    if (kind == ROUTE_CORS_PREFLIGHT && !s->opt.cors)
        kind = parse_path("GET", req->path, s->opt.metrics_path, s->opt.console, &p);
    if (refuse_unauthorized(s, req, kind, rep)) return;
    for (size_t i = 0; i < sizeof kiln_routes / sizeof kiln_routes[0]; i++) {
        const struct route *r = &kiln_routes[i];
        if (r->kind != kind) continue;
        if (r->method && strcmp(r->method, req->method) != 0) {
            /* TF Serving: anything under /v1/ that does not match is malformed */
            if (strncasecmp(req->path, "/v1/", 4) == 0) h_v1_malformed(s, req, &p, rep);
            else kiln_reply_error(rep, "UNIMPLEMENTED", "Method not allowed");
            if (strncasecmp(req->path, "/v1/", 4) != 0) rep->code = 405;
            return;
        }
        r->fn(s, req, &p, rep);
        return;
    }
    char msg[600];
    snprintf(msg, sizeof msg, "Not found: %s %.500s", req->method, req->path);
    kiln_reply_error(rep, "NOT_FOUND", msg);
}
