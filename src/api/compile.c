/*
 * compile.c - compiling a model in a lower precision with an accuracy bound
 * (kiln.h, "Evaluating and compiling with an accuracy bound"): the nodes
 * that have bf16 or int8 kernels (found by profiling one batch), each
 * node's sensitivity (the outputs' SQNR with that node alone in the low
 * precision, on the calibration data), the `auto` policy that moves the
 * most sensitive nodes up until the metric's drop on the eval data is
 * within the bound, static int8 by calibration, and the final check of the
 * compiled session against fp32.
 *
 * One implementation for its two users: `kiln compile` (src/cli/
 * cmd_compile.c, which adds the report's per-output table, latency and the
 * .kiln file) and `kiln serve --allow_compression` (src/serve/compress.c,
 * which compiles each version at load on its warmup data). The data sets,
 * outputs and the metric are compile_eval.c's. Everything here goes through
 * the public API, like its users. Definitions: docs/COMPRESSION.md.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/internal.h"
#include "import/kiln_artifact.h"
#include "ir/graph.h"
#include "kiln/kiln.h"

void kiln_compile_run_free(kiln_compile_run *r)
{
    for (int i = 0; r->o && i < r->n; i++) kiln_eval_output_free(&r->o[i]);
    free(r->o);
    memset(r, 0, sizeof *r);
}

kiln_status kiln_compile_run_all(kiln_session *s, const kiln_dataset *d, int64_t batch,
                                 kiln_compile_run *out, char *err)
{
    const kiln_signature *sig = kiln_session_signature(s);
    memset(out, 0, sizeof *out);
    int n = kiln_signature_output_count(sig);
    out->o = calloc((size_t)(n > 0 ? n : 1), sizeof *out->o);
    if (!out->o) {
        snprintf(err, KILN_EVAL_ERR_LEN, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    out->n = n;
    for (int i = 0; i < n; i++) {
        kiln_status st =
            kiln_eval_collect(s, d, kiln_signature_output(sig, i)->name, batch, &out->o[i], err);
        if (st != KILN_OK) {
            kiln_compile_run_free(out);
            return st;
        }
    }
    return KILN_OK;
}

double kiln_compile_sqnr(const kiln_compile_run *b, const kiln_compile_run *c)
{
    double sig = 0, noise = 0;
    for (int i = 0; i < b->n && i < c->n; i++) {
        if (b->o[i].is_int) continue;
        int64_t n = b->o[i].samples * b->o[i].row_size;
        for (int64_t k = 0; k < n; k++) {
            double x = b->o[i].v[k], y = c->o[i].v[k];
            if (isnan(x) && isnan(y)) continue;
            sig += x * x;
            noise += (y - x) * (y - x);
        }
    }
    if (isnan(noise)) return NAN;
    return noise > 0 ? 10 * log10(sig / noise) : INFINITY;
}

void kiln_compile_nodes_free(kiln_compile_node *nodes, int n)
{
    for (int i = 0; nodes && i < n; i++) {
        free(nodes[i].name);
        free(nodes[i].op);
    }
    free(nodes);
}

static int has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Add node `name` to the list (or find it); NULL when out of memory. */
static kiln_compile_node *node_add(kiln_compile_node **nodes, int *n, const char *name,
                                   const char *op)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp((*nodes)[i].name, name)) return &(*nodes)[i];
    kiln_compile_node *p = realloc(*nodes, (size_t)(*n + 1) * sizeof *p);
    if (!p) return NULL;
    *nodes = p;
    kiln_compile_node *e = &p[*n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    e->op = strdup(op ? op : "");
    if (!e->name || !e->op) {
        free(e->name);
        free(e->op);
        return NULL;
    }
    (*n)++;
    return e;
}

static int by_step(const void *x, const void *y)
{
    const kiln_compile_node *a = x, *b = y;
    return (a->step > b->step) - (a->step < b->step);
}

kiln_status kiln_compile_find_nodes(kiln_model *m, const char *sig, const kiln_session_options *so,
                                    const kiln_dataset *d, int64_t batch,
                                    kiln_compile_node **nodes, int *n_nodes, char *err)
{
    *nodes = NULL;
    *n_nodes = 0;
    int64_t rows_n = d->samples < batch ? d->samples : batch;
    kiln_tensor **rows = calloc((size_t)d->n, sizeof *rows);
    kiln_named_tensor *in = calloc((size_t)d->n, sizeof *in);
    kiln_status st = rows && in ? kiln_dataset_rows(d, 0, rows_n, rows, err) : KILN_ERR_OUT_OF_MEMORY;
    if (!rows || !in) snprintf(err, KILN_EVAL_ERR_LEN, "out of memory");
    for (int i = 0; st == KILN_OK && i < d->n; i++) in[i] = (kiln_named_tensor){d->names[i], rows[i]};
    static const kiln_precision lowp[2] = {KILN_PRECISION_BF16, KILN_PRECISION_INT8};
    static const char *const suffix[2] = {"_bf16", "_int8"};
    for (int p = 0; st == KILN_OK && p < 2; p++) {
        kiln_session_options o = *so;
        o.precision = lowp[p];
        o.profile = 1;
        kiln_session *s = NULL;
        kiln_outputs *out = NULL;
        kiln_profile *prof = NULL;
        st = kiln_session_create(m, sig, &o, &s);
        if (st == KILN_OK) st = kiln_session_profile_reset(s);
        if (st == KILN_OK) st = kiln_session_run(s, in, d->n, &out);
        if (st == KILN_OK) st = kiln_session_profile_get(s, &prof);
        if (st != KILN_OK)
            snprintf(err, KILN_EVAL_ERR_LEN, "profiling the model in %s: %.400s",
                     kiln_precision_name(lowp[p]), kiln_last_error());
        for (int i = 0; st == KILN_OK && i < kiln_profile_step_count(prof); i++) {
            const kiln_profile_entry *e = kiln_profile_step(prof, i);
            if (!e->node || !e->node[0] || !e->kernel || !has_suffix(e->kernel, suffix[p])) continue;
            kiln_compile_node *k = node_add(nodes, n_nodes, e->node, e->op);
            if (!k) {
                snprintf(err, KILN_EVAL_ERR_LEN, "out of memory");
                st = KILN_ERR_OUT_OF_MEMORY;
                break;
            }
            if (!k->kernel_in[1] && !k->kernel_in[2]) k->step = e->step;
            k->kernel_in[lowp[p]] = 1;
            k->weight_elems = kiln_session_node_weight_elems(s, e->node);
        }
        kiln_profile_free(prof);
        kiln_outputs_free(out);
        kiln_session_free(s);
    }
    for (int i = 0; rows && i < d->n; i++) kiln_tensor_free(rows[i]);
    free(rows);
    free(in);
    if (st == KILN_OK && *n_nodes > 1) qsort(*nodes, (size_t)*n_nodes, sizeof **nodes, by_step);
    if (st != KILN_OK) {
        kiln_compile_nodes_free(*nodes, *n_nodes);
        *nodes = NULL;
        *n_nodes = 0;
    }
    return st;
}

kiln_status kiln_compile_node_sensitivity(kiln_model *m, const char *sig,
                                          const kiln_session_options *so, kiln_compile_node *node,
                                          kiln_precision p, const kiln_dataset *d,
                                          int64_t batch, const kiln_compile_run *base, char *err)
{
    kiln_session_options o = *so;
    o.precision = KILN_PRECISION_FP32;
    o.profile = 0;
    kiln_session *s = NULL;
    kiln_node_precision one = {node->name, p};
    kiln_compile_run run = {0};
    kiln_status st = kiln_session_create(m, sig, &o, &s);
    if (st == KILN_OK) st = kiln_session_set_node_precision(s, &one, 1);
    if (st != KILN_OK) {
        snprintf(err, KILN_EVAL_ERR_LEN, "node '%.200s': %.280s", node->name, kiln_last_error());
    } else {
        st = kiln_compile_run_all(s, d, batch, &run, err);
    }
    if (st == KILN_OK) {
        node->measured = 1;
        node->measured_in = p;
        node->sqnr_db = kiln_compile_sqnr(base, &run);
    }
    kiln_compile_run_free(&run);
    kiln_session_free(s);
    return st;
}

kiln_precision kiln_compile_node_effective(const kiln_compile_node *n)
{
    return n->precision != KILN_PRECISION_FP32 && n->kernel_in[n->precision] ? n->precision
                                                                             : KILN_PRECISION_FP32;
}

kiln_status kiln_compile_session(kiln_model *m, const char *sig, const kiln_session_options *base,
                                 kiln_precision prec, const kiln_compile_node *nodes, int n,
                                 kiln_session **out)
{
    kiln_session_options so = *base;
    so.precision = prec;
    *out = NULL;
    kiln_session *s = NULL;
    kiln_status st = kiln_session_create(m, sig, &so, &s);
    if (st != KILN_OK) return st;
    kiln_node_precision *ov = calloc((size_t)n + 1, sizeof *ov);
    if (!ov) {
        kiln_session_free(s);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    int k = 0;
    for (int i = 0; i < n; i++)
        if (nodes[i].precision != prec) ov[k++] = (kiln_node_precision){nodes[i].name, nodes[i].precision};
    st = kiln_session_set_node_precision(s, ov, k);
    free(ov);
    if (st != KILN_OK) kiln_session_free(s);
    else *out = s;
    return st;
}


/* The metric's drop of the candidate (prec + the nodes' precisions) on d. */
static kiln_status candidate_quality(kiln_model *m, const char *sig, const kiln_compile_options *a,
                                     kiln_precision prec, const kiln_compile_node *nodes, int n,
                                     const kiln_dataset *d, int64_t batch, const char *output,
                                     const kiln_eval_output *base, const kiln_tensor *labels,
                                     kiln_eval_quality *q, char *err)
{
    kiln_session *s = NULL;
    kiln_eval_output c = {0};
    kiln_status st = kiln_compile_session(m, sig, &a->session, prec, nodes, n, &s);
    if (st != KILN_OK) snprintf(err, KILN_EVAL_ERR_LEN, "%.400s", kiln_last_error());
    if (st == KILN_OK) st = kiln_eval_collect(s, d, output, batch, &c, err);
    if (st == KILN_OK) st = kiln_eval_compare(base, &c, labels, q, err);
    kiln_eval_output_free(&c);
    kiln_session_free(s);
    return st;
}

static int by_sensitivity(const void *x, const void *y)
{
    const kiln_compile_node *a = *(const kiln_compile_node *const *)x;
    const kiln_compile_node *b = *(const kiln_compile_node *const *)y;
    double sa = a->measured && !isnan(a->sqnr_db) ? a->sqnr_db : -INFINITY;
    double sb = b->measured && !isnan(b->sqnr_db) ? b->sqnr_db : -INFINITY;
    return sa < sb ? -1 : sa > sb ? 1 : strcmp(a->name, b->name);
}

/* A node's measured SQNR for a fallback reason: "12.3 dB", "not finite" or "not measured". */
static void sqnr_text(const kiln_compile_node *n, char *buf, size_t cap)
{
    if (n->measured && isfinite(n->sqnr_db)) snprintf(buf, cap, "%.1f dB", n->sqnr_db);
    else snprintf(buf, cap, "%s", n->measured ? "not finite" : "not measured");
}

/* The auto policy's loop (steps 3-4 above). */
static kiln_status auto_fallback(kiln_model *m, const char *sig, const kiln_compile_options *a,
                                 kiln_precision lowp, kiln_compile_node *nodes, int n,
                                 const kiln_dataset *d, int64_t batch, const char *output,
                                 const kiln_eval_output *base, const kiln_tensor *labels,
                                 char *err)
{
    kiln_compile_node **order = calloc((size_t)n + 1, sizeof *order);
    if (!order) return KILN_ERR_OUT_OF_MEMORY;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (nodes[i].precision == lowp) order[k++] = &nodes[i];
    qsort(order, (size_t)k, sizeof *order, by_sensitivity);
    kiln_status st = KILN_OK;
    for (int pass = 0; pass < 2 && st == KILN_OK; pass++) {
        kiln_precision from = pass == 0 ? lowp : KILN_PRECISION_BF16;
        if (pass == 1 && lowp != KILN_PRECISION_INT8) break;
        for (int i = 0; i < k; i++) {
            kiln_compile_node *e = order[i];
            if (e->precision != from || !e->kernel_in[from]) continue;
            kiln_eval_quality q;
            st = candidate_quality(m, sig, a, lowp, nodes, n, d, batch, output, base, labels, &q,
                                   err);
            if (st != KILN_OK || q.drop <= a->max_drop) goto done;
            e->precision = from == KILN_PRECISION_INT8 && e->kernel_in[KILN_PRECISION_BF16]
                               ? KILN_PRECISION_BF16
                               : KILN_PRECISION_FP32;
            e->fell_back = 1;
            char db[32];
            sqnr_text(e, db, sizeof db);
            snprintf(e->reason, sizeof e->reason,
                     "SQNR %s in %s, the lowest of the nodes still in %s; with it in %s the %s "
                     "was %.3f%% > --max-drop %.3g%%",
                     db, kiln_precision_name(e->measured ? e->measured_in : from),
                     kiln_precision_name(from), kiln_precision_name(from), q.drop_of, 100 * q.drop,
                     100 * a->max_drop);
        }
    }
done:
    free(order);
    return st;
}

/* The bytes of the constants that the nodes of the graph s runs read (the
 * root graph's, kiln_graph_mark_reads; a constant read twice counts once): a static int8 graph's
 * size, its s8 weights at one byte each. 0 when the graph cannot be had. */
static int64_t graph_weight_bytes(kiln_session *s)
{
    const struct kiln_model *m;
    const struct kiln_signature *sig;
    const struct kiln_graph *g;
    int prec;
    if (kiln_session_artifact_view(s, &m, &sig, &g, &prec) != KILN_OK) {
        kiln_error_clear();
        return 0;
    }
    uint8_t *read = calloc((size_t)g->n_values + 1, 1);
    if (!read) return 0;
    kiln_graph_mark_reads(g, read);
    int64_t bytes = 0;
    for (int v = 0; v < g->n_values; v++)
        if (read[v] && g->values[v].kind == KILN_VALUE_CONST && g->values[v].konst)
            bytes += (int64_t)g->values[v].konst->nbytes;
    free(read);
    return bytes;
}

/* An fp32 session of the model and a calibration of it fed the calibration data in batches
 * (kiln_calibration_*, docs/COMPRESSION.md). */
static kiln_status calibrate(kiln_model *m, const char *sig, const kiln_session_options *base,
                             const kiln_dataset *cal, int64_t batch, kiln_session **out,
                             kiln_calibration **cout, char *err)
{
    kiln_session_options so = *base;
    so.precision = KILN_PRECISION_FP32;
    kiln_calibration *c = NULL;
    *cout = NULL;
    kiln_status st = kiln_session_create(m, sig, &so, out);
    if (st == KILN_OK) st = kiln_calibration_begin(*out, &c);
    if (st != KILN_OK) {
        snprintf(err, KILN_EVAL_ERR_LEN, "static int8: %s", kiln_last_error());
        return st;
    }
    kiln_tensor **rows = calloc((size_t)cal->n + 1, sizeof *rows);
    kiln_named_tensor *in = calloc((size_t)cal->n + 1, sizeof *in);
    if (!rows || !in) st = KILN_ERR_OUT_OF_MEMORY;
    for (int64_t s0 = 0; st == KILN_OK && s0 < cal->samples; s0 += batch) {
        int64_t cnt = cal->samples - s0 < batch ? cal->samples - s0 : batch;
        st = kiln_dataset_rows(cal, s0, cnt, rows, err);
        if (st != KILN_OK) break;
        for (int i = 0; i < cal->n; i++) in[i] = (kiln_named_tensor){cal->names[i], rows[i]};
        st = kiln_calibration_feed(c, in, cal->n);
        if (st != KILN_OK) snprintf(err, KILN_EVAL_ERR_LEN, "static int8: %s", kiln_last_error());
        for (int i = 0; i < cal->n; i++) {
            kiln_tensor_free(rows[i]);
            rows[i] = NULL;
        }
    }
    if (st == KILN_ERR_OUT_OF_MEMORY && !err[0]) snprintf(err, KILN_EVAL_ERR_LEN, "out of memory");
    free(rows);
    free(in);
    if (st != KILN_OK) kiln_calibration_free(c);
    else *cout = c;
    return st;
}

/* Finish c into session `into` (fp32 until then), keeping the nodes excl[0..n_excl) in fp32. */
static kiln_status calibrated_finish(kiln_calibration *c, kiln_session *into,
                                     kiln_calibration_method method, const char *const *excl,
                                     int n_excl, char *err)
{
    kiln_status st = kiln_calibration_finish_into(
        c, into, method, method == KILN_CALIBRATION_PERCENTILE ? 99.99 : 0, excl, n_excl);
    if (st != KILN_OK) {
        snprintf(err, KILN_EVAL_ERR_LEN, "static int8: %s", kiln_last_error());
    } else if (kiln_calibration_node_count(c) == 0) {
        snprintf(err, KILN_EVAL_ERR_LEN,
                 "static int8: the model has no Conv, Gemm or MatMul with constant weights "
                 "to quantize");
        st = KILN_ERR_UNSUPPORTED;
    }
    return st;
}

/* Static int8: an fp32 session fed the calibration data in batches, whose
 * Conv, Gemm and MatMul nodes then run on int8 kernels with the activation
 * ranges fixed by `method` (kiln_calibration_*, docs/COMPRESSION.md). */
static kiln_status static_int8_session(kiln_model *m, const char *sig,
                                       const kiln_session_options *base, const kiln_dataset *cal,
                                       int64_t batch, kiln_calibration_method method,
                                       kiln_session **out, char *err)
{
    kiln_calibration *c = NULL;
    kiln_status st = calibrate(m, sig, base, cal, batch, out, &c, err);
    if (st == KILN_OK) st = calibrated_finish(c, *out, method, NULL, 0, err);
    kiln_calibration_free(c);
    return st;
}

void kiln_compile_options_init(kiln_compile_options *o)
{
    memset(o, 0, sizeof *o);
    o->is_auto = 1;
    o->precision = KILN_PRECISION_INT8;
    o->max_drop = 0.01;
    o->cal_method = KILN_CALIBRATION_MINMAX;
    kiln_session_options_init(&o->session);
}

void kiln_compile_result_free(kiln_compile_result *r)
{
    kiln_session_free(r->session);
    kiln_compile_nodes_free(r->nodes, r->n_nodes);
    kiln_compile_run_free(&r->base_eval);
    kiln_compile_run_free(&r->cand_eval);
    memset(r, 0, sizeof *r);
}

/* The one-line summary: precision, nodes by precision, the check, fallbacks. */
static void summarize(kiln_compile_result *r, const kiln_compile_options *o)
{
    char *p = r->summary;
    size_t cap = sizeof r->summary, len = 0;
#define PUT(...)                                                               \
    do {                                                                       \
        if (len < cap) len += (size_t)snprintf(p + len, cap - len, __VA_ARGS__); \
    } while (0)
    PUT("%s: %d int8, %d bf16, %d fp32 node%s", kiln_precision_name(r->precision), r->n_int8,
        r->n_bf16, r->n_fp32, r->n_nodes == 1 ? "" : "s");
    if (r->has_quality) {
        PUT("; %s %.3f%% %s max drop %.3g%% on %lld samples", r->q.drop_of, 100 * r->q.drop,
            r->passed ? "<=" : "exceeds", 100 * o->max_drop, (long long)r->eval_samples);
        if (r->q.has_agreement) PUT("; top-1 agreement %.4f", r->q.agreement);
    } else {
        PUT("; accuracy not checked: no data");
    }
    PUT("; %d fell back", r->n_fell_back);
    int first = 1;
    for (int i = 0; i < r->n_nodes; i++) {
        const kiln_compile_node *n = &r->nodes[i];
        if (!n->fell_back) continue;
        PUT("%s%s->%s", first ? ": " : ", ", n->name, kiln_precision_name(n->precision));
        first = 0;
    }
#undef PUT
}

/* Seconds for two runs of s over d (the faster), for auto's choice; -1 on error. */
static double time_runs(kiln_session *s, const kiln_dataset *d, int64_t batch)
{
    double best = -1;
    for (int k = 0; k < 2; k++) {
        kiln_compile_run run = {0};
        char e[KILN_EVAL_ERR_LEN];
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        kiln_status st = kiln_compile_run_all(s, d, batch, &run, e);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        kiln_compile_run_free(&run);
        if (st != KILN_OK) return -1;
        double t = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (best < 0 || t < best) best = t;
    }
    return best;
}

/* auto with calibration data: static int8 (MinMax) as a candidate (see
 * kiln_compile_result.auto_static). The whole model first; where that exceeds the bound, the
 * same calibration finished again with the 1, 2, 4, ... most sensitive convolutions and
 * products kept in fp32 (their order from the per-node measurements, at most half of them),
 * the first within the bound kept if it runs the evaluation data faster than the per-node
 * mix. Any failure leaves the mix in place. */
static void auto_try_static(kiln_model *mc, const char *sn, const kiln_compile_options *o,
                            const kiln_dataset *cal, const kiln_dataset *ev, int64_t batch,
                            kiln_compile_result *r)
{
    const char *env = getenv("KILN_AUTO_STATIC");
    if (env && !strcmp(env, "0")) return;
    /* convolutional models only: dynamic int8 stays auto's choice for transformers' and
     * MLPs' products (per-run scales follow their activations' ranges) */
    int conv = 0;
    for (int i = 0; i < r->n_nodes && !conv; i++)
        conv = r->nodes[i].kernel_in[KILN_PRECISION_INT8] && r->nodes[i].op &&
               strstr(r->nodes[i].op, "Conv") != NULL;
    if (!conv) return;
    kiln_session *cs = NULL, *ss = NULL;
    kiln_calibration *c = NULL;
    kiln_compile_node **order = calloc((size_t)r->n_nodes + 1, sizeof *order);
    const char **names = calloc((size_t)r->n_nodes + 1, sizeof *names);
    kiln_compile_run run = {0};
    char e[KILN_EVAL_ERR_LEN];
    e[0] = '\0';
    int n_order = 0, kept = -1;
    if (!order || !names || calibrate(mc, sn, &o->session, cal, batch, &cs, &c, e) != KILN_OK)
        goto out;
    for (int i = 0; i < r->n_nodes; i++)
        if (r->nodes[i].kernel_in[KILN_PRECISION_INT8]) order[n_order++] = &r->nodes[i];
    qsort(order, (size_t)n_order, sizeof *order, by_sensitivity); /* lowest SQNR first */
    for (int i = 0; i < n_order; i++) names[i] = order[i]->name;
    for (int k = 0; k <= n_order / 2; k = k ? 2 * k : 1) {
        kiln_session_options so = o->session;
        so.precision = KILN_PRECISION_FP32;
        kiln_eval_quality q;
        kiln_compile_run_free(&run);
        if (kiln_session_create(mc, sn, &so, &ss) != KILN_OK ||
            calibrated_finish(c, ss, KILN_CALIBRATION_MINMAX, names, k, e) != KILN_OK ||
            kiln_compile_run_all(ss, ev, batch, &run, e) != KILN_OK ||
            kiln_eval_compare(&r->base_eval.o[r->metric_index], &run.o[r->metric_index],
                              o->labels, &q, e) != KILN_OK)
            goto out;
        if (k == 0) r->auto_static_drop = q.drop;
        if (q.drop <= o->max_drop) {
            kept = k;
            r->auto_static_kept_drop = q.drop;
            break;
        }
        kiln_session_free(ss);
        ss = NULL;
    }
    if (kept < 0) goto out;
    r->auto_static_kept = kept;
    double t_mix = time_runs(r->session, ev, batch), t_static = time_runs(ss, ev, batch);
    r->auto_ms[0] = t_mix * 1e3;
    r->auto_ms[1] = t_static * 1e3;
    int force = env && !strcmp(env, "force"); /* tests: within the bound is enough */
    if (!force && (t_static < 0 || t_mix < 0 || t_static >= t_mix)) goto out;
    kiln_session_free(r->session);
    r->session = ss;
    ss = NULL;
    r->auto_static = 1;
    r->static_weight_bytes = graph_weight_bytes(r->session);
    /* the nodes now say what runs: every convolution and product int8 (static), but the kept */
    r->auto_mix_fell_back = 0;
    for (int i = 0; i < r->n_nodes; i++) {
        kiln_compile_node *n = &r->nodes[i];
        r->auto_mix_fell_back += n->fell_back;
        n->fell_back = 0;
        n->reason[0] = '\0';
        if (n->kernel_in[KILN_PRECISION_INT8]) n->precision = KILN_PRECISION_INT8;
    }
    for (int i = 0; i < kept; i++) {
        kiln_compile_node *n = order[i];
        char db[32];
        sqnr_text(n, db, sizeof db);
        n->precision = KILN_PRECISION_FP32;
        n->fell_back = 1;
        snprintf(n->reason, sizeof n->reason,
                 "static int8: kept in fp32, one of the %d most sensitive (SQNR %s alone in %s); "
                 "static int8 of the whole model was %.3f%% > --max-drop %.3g%%, with these %d "
                 "in fp32 %.3f%%",
                 kept, db, kiln_precision_name(n->measured ? n->measured_in : KILN_PRECISION_INT8),
                 100 * r->auto_static_drop, 100 * o->max_drop, kept, 100 * r->auto_static_kept_drop);
    }
out:
    kiln_compile_run_free(&run);
    kiln_session_free(ss);
    kiln_session_free(cs);
    kiln_calibration_free(c);
    free(order);
    free(names);
    kiln_error_clear();
}

kiln_status kiln_compile(kiln_model *m, const char *sig_name, const kiln_compile_options *o,
                         const kiln_dataset *cal, const kiln_dataset *eval,
                         kiln_compile_result *r, char *err)
{
    memset(r, 0, sizeof *r);
    err[0] = '\0';
    kiln_status st = KILN_OK;
    kiln_session *base = NULL;
    kiln_compile_run base_cal = {0};
    kiln_model *mc = o->candidate_model ? o->candidate_model : m; /* compressed sessions */
    const kiln_signature *sig = kiln_model_find_signature(m, sig_name);
    if (!sig) {
        snprintf(err, KILN_EVAL_ERR_LEN, "the model has no signature '%.200s'",
                 sig_name ? sig_name : "(default)");
        return KILN_ERR_NOT_FOUND;
    }
    const char *sn = kiln_signature_name(sig);
    if (kiln_signature_output_count(sig) < 1) {
        snprintf(err, KILN_EVAL_ERR_LEN, "the signature has no outputs");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    const char *metric_output = o->metric_output ? o->metric_output : kiln_signature_output(sig, 0)->name;
    r->metric_index = -1;
    for (int i = 0; i < kiln_signature_output_count(sig); i++)
        if (!strcmp(kiln_signature_output(sig, i)->name, metric_output)) r->metric_index = i;
    if (r->metric_index < 0) {
        snprintf(err, KILN_EVAL_ERR_LEN, "metric output '%.200s' is not an output of the signature",
                 metric_output);
        return KILN_ERR_NOT_FOUND;
    }
    if (o->static_int8 && (o->is_auto || o->precision != KILN_PRECISION_INT8 || !cal)) {
        snprintf(err, KILN_EVAL_ERR_LEN, "static int8 needs precision int8 and calibration data");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    /* a fixed batch dimension decides the rows per run */
    int64_t fixed = -1;
    for (int i = 0; i < kiln_signature_input_count(sig); i++) {
        const kiln_value_info *vi = kiln_signature_input(sig, i);
        if (vi->rank > 0 && vi->dims[0] > 0) fixed = vi->dims[0];
    }
    int64_t batch = r->batch = fixed > 0 ? fixed : KILN_COMPILE_EVAL_BATCH;
    const kiln_dataset *sens = cal ? cal : eval, *ev = eval ? eval : cal;

    kiln_session_options so = o->session;
    so.precision = KILN_PRECISION_FP32;
    if ((st = kiln_session_create(m, sn, &so, &base)) != KILN_OK) {
        snprintf(err, KILN_EVAL_ERR_LEN, "cannot create a session: %.400s", kiln_last_error());
        goto err_free;
    }

    /* which nodes have low-precision kernels */
    kiln_precision prec = o->is_auto ? KILN_PRECISION_INT8 : o->precision;
    if (prec != KILN_PRECISION_FP32 && sens) {
        st = kiln_compile_find_nodes(mc, sn, &o->session, sens, batch, &r->nodes, &r->n_nodes, err);
        if (st != KILN_OK) goto err_free;
    }
    if (o->is_auto) {
        int any[3] = {0, 0, 0};
        for (int i = 0; i < r->n_nodes; i++)
            for (int p = 1; p < 3; p++) any[p] |= r->nodes[i].kernel_in[p];
        prec = any[KILN_PRECISION_INT8] ? KILN_PRECISION_INT8
               : any[KILN_PRECISION_BF16] ? KILN_PRECISION_BF16
                                          : KILN_PRECISION_FP32;
    }
    r->precision = prec;
    for (int i = 0; i < r->n_nodes; i++) r->nodes[i].precision = prec;

    /* each node's sensitivity, on the calibration data */
    if (prec != KILN_PRECISION_FP32 && sens) {
        char e2[KILN_EVAL_ERR_LEN];
        if ((st = kiln_compile_run_all(base, sens, batch, &base_cal, e2)) != KILN_OK) {
            snprintf(err, KILN_EVAL_ERR_LEN, "fp32 on the calibration data: %.440s", e2);
            goto err_free;
        }
        for (int i = 0; i < r->n_nodes; i++) {
            if (!r->nodes[i].kernel_in[prec]) continue;
            st = kiln_compile_node_sensitivity(mc, sn, &o->session, &r->nodes[i], prec, sens, batch,
                                               &base_cal, err);
            if (st != KILN_OK) goto err_free;
        }
        r->cal_samples = sens->samples;
    }

    /* the fp32 baseline on the eval data, and auto's fallbacks */
    if (ev) {
        char e2[KILN_EVAL_ERR_LEN];
        if ((st = kiln_compile_run_all(base, ev, batch, &r->base_eval, e2)) != KILN_OK) {
            snprintf(err, KILN_EVAL_ERR_LEN, "fp32 on the evaluation data: %.440s", e2);
            goto err_free;
        }
    }
    if (o->is_auto && prec != KILN_PRECISION_FP32 && ev) {
        st = auto_fallback(mc, sn, o, prec, r->nodes, r->n_nodes, ev, batch, metric_output,
                           &r->base_eval.o[r->metric_index], o->labels, err);
        if (st != KILN_OK) goto err_free;
    }
    if (o->static_int8) {
        st = static_int8_session(mc, sn, &o->session, cal, batch, o->cal_method, &r->session, err);
        if (st != KILN_OK) goto err_free;
        r->static_weight_bytes = graph_weight_bytes(r->session);
    } else if ((st = kiln_compile_session(mc, sn, &o->session, prec, r->nodes, r->n_nodes,
                                          &r->session)) != KILN_OK) {
        snprintf(err, KILN_EVAL_ERR_LEN, "cannot create the compiled session: %.400s",
                 kiln_last_error());
        goto err_free;
    }

    r->auto_static_drop = -1;
    r->auto_static_kept = -1;
    if (o->is_auto && prec == KILN_PRECISION_INT8 && cal && ev)
        auto_try_static(mc, sn, o, cal, ev, batch, r);

    /* the compiled session checked once more against fp32 */
    if (ev) {
        char e2[KILN_EVAL_ERR_LEN];
        if ((st = kiln_compile_run_all(r->session, ev, batch, &r->cand_eval, e2)) != KILN_OK) {
            snprintf(err, KILN_EVAL_ERR_LEN, "%s on the evaluation data: %.440s",
                     kiln_precision_name(prec), e2);
            goto err_free;
        }
        st = kiln_eval_compare(&r->base_eval.o[r->metric_index], &r->cand_eval.o[r->metric_index],
                               o->labels, &r->q, err);
        if (st != KILN_OK) goto err_free;
        r->has_quality = 1;
        r->eval_samples = ev->samples;
        r->passed = r->q.drop <= o->max_drop;
    }
    for (int i = 0; i < r->n_nodes; i++) {
        kiln_precision p = kiln_compile_node_effective(&r->nodes[i]);
        r->n_int8 += p == KILN_PRECISION_INT8;
        r->n_bf16 += p == KILN_PRECISION_BF16;
        r->n_fp32 += p == KILN_PRECISION_FP32;
        r->n_fell_back += r->nodes[i].fell_back;
    }
    summarize(r, o);
    kiln_compile_run_free(&base_cal);
    kiln_session_free(base);
    return KILN_OK;
err_free:
    kiln_compile_run_free(&base_cal);
    kiln_session_free(base);
    kiln_compile_result_free(r);
    return st;
}

static char cpu_features[128];

static void cpu_features_init(void)
{
    static const char *const known[] = {"avx2",     "fma",         "avx512f",    "avx512dq",
                                        "avx512bw", "avx512_bf16", "avx512_vnni"};
    size_t len = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (kiln_artifact_cpu_has(known[i]) == 1 && len < sizeof cpu_features)
            len += (size_t)snprintf(cpu_features + len, sizeof cpu_features - len, "%s%s",
                                    len ? "," : "", known[i]);
}

const char *kiln_cpu_features(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, cpu_features_init);
    return cpu_features;
}
