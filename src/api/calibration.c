/*
 * calibration.c - the public static-quantization API (kiln_calibration_* in
 * kiln.h; docs/COMPRESSION.md, "Static calibration").
 *
 * begin clones the session's imported graph and makes the activations to
 * observe (the inputs and outputs of the Conv / Gemm / MatMul nodes that
 * kiln_sq_targets finds, src/opt/static_quant.c) its outputs; feed runs that
 * clone in fp32 (through a plan, or the reference executor when it cannot be
 * planned) and adds each observed tensor to its histogram; finish turns the
 * histograms into ranges, rewrites a second clone into QDQ form
 * (kiln_sq_rewrite), optimizes it (the qdq_fusion pass makes the int8
 * kernels' ops) and hands it to the session (kiln_session_adopt_graph),
 * with the targets and ranges (kiln_session_write_onnx redoes the rewrite
 * from them to write the same quantization as an ONNX file).
 */
#include <stdlib.h>
#include <string.h>

#include "api/internal.h"
#include "core/tensor.h"
#include "exec/exec.h"
#include "exec/plan.h"
#include "import/model.h"
#include "kernels/fast.h"
#include "opt/opt.h"
#include "opt/static_quant.h"

struct kiln_calibration {
    kiln_session *s;
    struct kiln_graph *obs;          /* the clone whose outputs are the observed values */
    struct kiln_sq_target *targets;
    int n_targets;
    int n_obs;
    int *obs_values;                 /* value ids, parallel to obs->outputs */
    struct kiln_calib_hist *hist;    /* one per observed value */
    int64_t batches;
    int quantized;                   /* nodes quantized by finish */
    unsigned char *excluded;         /* per target: kept in fp32 (kiln_calibration_exclude) */
};

static int add_obs(int *vals, int n, int v)
{
    for (int i = 0; i < n; i++)
        if (vals[i] == v) return n;
    vals[n] = v;
    return n + 1;
}

kiln_status kiln_calibration_begin(kiln_session *s, kiln_calibration **out)
{
    if (!s || !out) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_calibration_begin: NULL argument");
    *out = NULL;
    const kiln_session_options *o = kiln_session_opts(s);
    if (o->reference || !o->optimize)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "static calibration needs a session with the optimizer on and "
                          "reference = 0 (its int8 graph is an optimized one)");
    struct kiln_calibration *c = calloc(1, sizeof *c);
    if (!c) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    c->s = s;
    const struct kiln_graph *g = kiln_session_graph(s);
    kiln_status st = kiln_sq_targets(g, &c->targets, &c->n_targets);
    if (st == KILN_OK) st = kiln_graph_clone(g, &c->obs);
    if (st == KILN_OK && c->n_targets == 0)
        st = kiln_error(KILN_ERR_UNSUPPORTED,
                        "the model has no Conv, Gemm or MatMul with constant weights to quantize");
    if (st != KILN_OK) {
        kiln_calibration_free(c);
        return st;
    }
    c->obs_values = calloc((size_t)c->n_targets * 3 + 1, sizeof(int));
    c->excluded = calloc((size_t)c->n_targets + 1, 1);
    if (!c->obs_values || !c->excluded) {
        kiln_calibration_free(c);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < c->n_targets; i++) {
        c->n_obs = add_obs(c->obs_values, c->n_obs, c->targets[i].x);
        c->n_obs = add_obs(c->obs_values, c->n_obs, c->targets[i].y);
        if (c->targets[i].x2 >= 0) c->n_obs = add_obs(c->obs_values, c->n_obs, c->targets[i].x2);
    }
    c->hist = malloc(sizeof *c->hist * (size_t)c->n_obs);
    int *outs = kiln_arena_alloc(c->obs->mem, sizeof(int) * (size_t)c->n_obs);
    if (!c->hist || !outs) {
        kiln_calibration_free(c);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < c->n_obs; i++) {
        kiln_calib_hist_init(&c->hist[i]);
        outs[i] = c->obs_values[i];
    }
    c->obs->outputs = outs;
    c->obs->n_outputs = c->n_obs;
    st = kiln_graph_verify(c->obs);
    if (st != KILN_OK) {
        kiln_calibration_free(c);
        return st;
    }
    *out = c;
    return KILN_OK;
}

kiln_status kiln_calibration_feed(kiln_calibration *c, const kiln_named_tensor *inputs,
                                  int n_inputs)
{
    if (!c || (n_inputs > 0 && !inputs))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_calibration_feed: NULL argument");
    const kiln_signature *sig = kiln_session_signature(c->s);
    const struct kiln_graph *g = c->obs;
    kiln_tensor **gin = calloc((size_t)g->n_inputs + 1, sizeof *gin);
    kiln_tensor **gout = calloc((size_t)g->n_outputs + 1, sizeof *gout);
    kiln_status st = KILN_OK;
    if (!gin || !gout) st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < n_inputs && st == KILN_OK; i++) {
        const char *name = inputs[i].name ? inputs[i].name : "";
        int slot = -1;
        for (int k = 0; k < sig->n_inputs; k++)
            if (strcmp(sig->inputs[k].name, name) == 0)
                for (int j = 0; j < g->n_inputs; j++)
                    if (g->inputs[j] == sig->input_values[k]) slot = j;
        if (slot < 0)
            st = kiln_error(KILN_ERR_INVALID_ARGUMENT,
                            "calibration input '%s' is not an input of signature '%s'", name,
                            sig->name);
        else if (gin[slot])
            st = kiln_error(KILN_ERR_INVALID_ARGUMENT, "calibration input '%s' is given twice",
                            name);
        else if (!inputs[i].tensor)
            st = kiln_error(KILN_ERR_INVALID_ARGUMENT, "calibration input '%s' is NULL", name);
        else
            gin[slot] = (kiln_tensor *)inputs[i].tensor;
    }
    for (int j = 0; j < g->n_inputs && st == KILN_OK; j++)
        if (!gin[j])
            st = kiln_error(KILN_ERR_INVALID_ARGUMENT, "calibration input '%s' is missing",
                            g->values[g->inputs[j]].name);
    if (st == KILN_OK) {
        const kiln_session_options *o = kiln_session_opts(c->s);
        struct kiln_plan *p = NULL;
        st = kiln_plan_compile(g, (const kiln_tensor *const *)gin, kiln_session_weights(c->s),
                               o->threads, &p);
        if (st == KILN_OK) {
            st = kiln_plan_run(p, gin, gout, o->threads, NULL);
            kiln_plan_free(p);
        } else if (st == KILN_ERR_UNSUPPORTED) {
            kiln_error_clear();
            st = kiln_weight_cache_pin_all(kiln_session_weights(c->s));
            if (st == KILN_OK)
                st = kiln_exec_run_limited(g, gin, gout, o->max_tensor_bytes, NULL);
        }
    }
    for (int i = 0; i < g->n_outputs && st == KILN_OK; i++) {
        const kiln_tensor *t = gout[i];
        if (!t || t->dtype != KILN_DTYPE_F32)
            st = kiln_error(KILN_ERR_INTERNAL, "calibration value '%s' was not produced as float",
                            g->values[g->outputs[i]].name);
        else
            kiln_calib_hist_add(&c->hist[i], t->data, kiln_tensor_count(t));
    }
    if (gout)
        for (int i = 0; i < g->n_outputs; i++) kiln_tensor_free(gout[i]);
    free(gin);
    free(gout);
    if (st == KILN_OK) c->batches++;
    return st;
}

kiln_status kiln_calibration_exclude(kiln_calibration *c, const char *node)
{
    if (!c || !node)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_calibration_exclude: NULL argument");
    const struct kiln_graph *g = kiln_session_graph(c->s);
    int found = 0;
    for (int i = 0; i < c->n_targets; i++) {
        const struct kiln_node *n = &g->nodes[c->targets[i].node];
        if (c->targets[i].x2 < 0 && n->name && strcmp(n->name, node) == 0) {
            c->excluded[i] = 1;
            found = 1;
        }
    }
    if (!found)
        return kiln_error(KILN_ERR_NOT_FOUND,
                          "node '%s' is not a Conv, Gemm or MatMul that calibration quantizes",
                          node);
    return KILN_OK;
}

/* The targets to quantize: those not excluded (by c, or by name in excl), each with
 * float_out set where an excluded node reads its output. */
static kiln_status kept_targets(const kiln_calibration *c, const char *const *excl, int n_excl,
                                struct kiln_sq_target **out, int *n_out)
{
    const struct kiln_graph *g = kiln_session_graph(c->s);
    struct kiln_sq_target *t = malloc(sizeof *t * ((size_t)c->n_targets + 1));
    unsigned char *drop = calloc((size_t)c->n_targets + 1, 1);
    if (!t || !drop) {
        free(t);
        free(drop);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < c->n_targets; i++) {
        drop[i] = c->excluded[i];
        const char *name = g->nodes[c->targets[i].node].name;
        for (int k = 0; k < n_excl && !drop[i] && c->targets[i].x2 < 0; k++)
            drop[i] = name && excl[k] && strcmp(name, excl[k]) == 0;
    }
    int n = 0;
    for (int i = 0; i < c->n_targets; i++) {
        if (drop[i]) continue;
        t[n] = c->targets[i];
        t[n].float_out = 0;
        for (int j = 0; j < c->n_targets; j++)
            if (drop[j] && c->targets[j].x == t[n].y) t[n].float_out = 1;
        n++;
    }
    free(drop);
    *out = t;
    *n_out = n;
    return KILN_OK;
}

kiln_status kiln_calibration_finish(kiln_calibration *c, kiln_calibration_method method,
                                    double percentile)
{
    if (!c) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_calibration_finish: NULL argument");
    return kiln_calibration_finish_into(c, c->s, method, percentile, NULL, 0);
}

kiln_status kiln_calibration_finish_into(kiln_calibration *c, kiln_session *into,
                                         kiln_calibration_method method, double percentile,
                                         const char *const *excl, int n_excl)
{
    if (!c || !into)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_calibration_finish: NULL argument");
    if (into != c->s && kiln_session_graph(into) != kiln_session_graph(c->s))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "kiln_calibration_finish_into: the session runs another graph");
    if (method < KILN_CALIBRATION_MINMAX || method > KILN_CALIBRATION_ENTROPY)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "calibration method %d is not MINMAX, PERCENTILE or ENTROPY", method);
    if (method == KILN_CALIBRATION_PERCENTILE && !(percentile > 0.0 && percentile <= 100.0))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "calibration percentile %g is not in (0, 100]", percentile);
    if (c->batches == 0)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "no calibration batches: call kiln_calibration_feed first");
    const struct kiln_graph *g = kiln_session_graph(c->s);
    float (*range)[2] = calloc((size_t)g->n_values + 1, sizeof *range);
    struct kiln_graph *q = NULL;
    struct kiln_sq_target *t = NULL;
    int n_t = 0;
    kiln_status st = range ? KILN_OK : kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < c->n_obs && st == KILN_OK; i++)
        kiln_calib_hist_range(&c->hist[i], (int)method, percentile, &range[c->obs_values[i]][0],
                              &range[c->obs_values[i]][1]);
    if (st == KILN_OK) st = kept_targets(c, excl, n_excl, &t, &n_t);
    /* the rewrite reads the float weights: make every released one resident again */
    if (st == KILN_OK) st = kiln_weight_cache_pin_all(kiln_session_weights(into));
    if (st == KILN_OK) st = kiln_graph_clone(g, &q);
    if (st == KILN_OK) st = kiln_sq_rewrite(q, t, n_t, (const float(*)[2])range);
    if (st == KILN_OK) st = kiln_graph_infer(q);
    if (st == KILN_OK) {
        struct kiln_opt_options oo = {.layout = 1};
        st = kiln_optimize(q, &oo, NULL);
    }
    if (st != KILN_OK) {
        free(range);
        free(t);
        kiln_graph_free(q);
        return st;
    }
    st = kiln_session_adopt_graph(into, q);
    if (st != KILN_OK) {
        free(range);
        free(t);
        return st;
    }
    /* kept for kiln_session_write_onnx (emit_onnx.c), which redoes this rewrite */
    kiln_session_set_static_quant(into, t, n_t, range);
    int nodes = 0;
    for (int i = 0; i < n_t; i++) nodes += t[i].x2 < 0;
    c->quantized = nodes;
    return st;
}

int kiln_calibration_node_count(const kiln_calibration *c) { return c ? c->quantized : 0; }

void kiln_calibration_free(kiln_calibration *c)
{
    if (!c) return;
    kiln_graph_free(c->obs);
    free(c->targets);
    free(c->excluded);
    free(c->obs_values);
    free(c->hist);
    free(c);
}

kiln_status kiln_calibration_range(const float *x, int64_t n, kiln_calibration_method method,
                                   double percentile, float *lo, float *hi)
{
    if ((!x && n > 0) || n < 0 || !lo || !hi)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_calibration_range: bad argument");
    if (method < KILN_CALIBRATION_MINMAX || method > KILN_CALIBRATION_ENTROPY)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "calibration method %d is not MINMAX, PERCENTILE or ENTROPY", method);
    struct kiln_calib_hist *h = malloc(sizeof *h);
    if (!h) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kiln_calib_hist_init(h);
    kiln_calib_hist_add(h, x, n);
    kiln_calib_hist_range(h, (int)method, percentile, lo, hi);
    free(h);
    return KILN_OK;
}
