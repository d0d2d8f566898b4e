/*
 * static_quant.c - static int8 quantization: calibration histograms, the
 * three range methods, and the rewrite of a float graph into ONNX's QDQ form
 * (static_quant.h; docs/COMPRESSION.md, "Static calibration").
 *
 * Ranges. Each activation keeps its min and max and a histogram of |x| over
 * [0, R] in KILN_CALIB_BINS bins, R the largest |x| so far (a batch with a
 * larger one re-bins the counts by their bin centres into the wider range).
 *   MinMax:     lo = min(0, min x), hi = max(0, max x).
 *   Percentile: T = the upper edge of the first bin where the cumulative
 *               count reaches percentile% of all values; lo = max(min(0, min x), -T),
 *               hi = min(max(0, max x), T).
 *   Entropy:    TensorRT's KL-divergence calibration on the |x| histogram:
 *               for each i in [128, bins], P = the first i bins with the
 *               count beyond them added to bin i-1; Q = the first i bins
 *               merged into 128 groups (group j covers bins [floor(j*i/128),
 *               floor((j+1)*i/128))), each group's count spread evenly over
 *               its non-empty bins; both normalized, KL(P||Q) = sum P log(P/Q)
 *               over P > 0 (Q = 0 there counts as 1e-10). T = i * bin width
 *               for the i with the smallest KL (the first on ties); lo, hi
 *               as for percentile.
 *
 * Rewrite. For each Conv (4-D float input, constant 4-D weights), Gemm
 * (alpha 1, transA 0, beta 1 or no C, constant 2-D B, C a constant vector)
 * and MatMul (constant 2-D B) of the graph, with u8 activation parameters
 * scale = (hi - lo) / 255 (1 for an empty range), zp = clamp(rint(-lo /
 * scale), 0, 255):
 *   - the output (or the output of the Relu, or Clip with constant bounds
 *     lo <= 0 <= hi (ReLU6), that alone reads it) goes
 *     through QuantizeLinear -> DequantizeLinear with its range, the
 *     DequantizeLinear writing the original value id;
 *   - the input does too, unless it already is such a DequantizeLinear's
 *     output (the previous quantized op's): then the two ops chain in int8;
 *   - the weights become DequantizeLinear(s8, per output channel scale
 *     max |w| / 127 (1 for an all-zero channel), zero points 0), with
 *     q = clamp(rint(w / scale), -127, 127);
 *   - the bias becomes DequantizeLinear(int32 rint(b / (x_scale * w_scale[n])),
 *     x_scale * w_scale[n]).
 * Residual Adds of two same-shape 4-D float values are quantized too: the
 * output (or its Relu's) as above, each input not already a
 * DequantizeLinear's output through Q -> DQ with its own range.
 * The qdq_fusion pass then makes QLinearConv / KilnQLinearMatMul of each,
 * qadd_fusion a KilnQLinearAdd of each Add. A target whose output a node kept in fp32 reads
 * (float_out: calibration's exclusions) leaves its output float, so the kept node sees
 * unrounded values; its other quantized readers wrap their inputs themselves.
 */
#include "opt/static_quant.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "kernels/kernel.h"
#include "opt/opt.h"

void kiln_calib_hist_init(struct kiln_calib_hist *h)
{
    memset(h, 0, sizeof *h);
    h->min = 0.0;
    h->max = 0.0;
}

void kiln_calib_hist_add(struct kiln_calib_hist *h, const float *x, int64_t n)
{
    double amax = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        if (!isfinite(v)) continue;
        if (v < h->min) h->min = v;
        if (v > h->max) h->max = v;
        if (fabs(v) > amax) amax = fabs(v);
    }
    if (amax > h->range) { /* widen: move the counts by their bin centres */
        double old_w = h->range / KILN_CALIB_BINS, bins[KILN_CALIB_BINS] = {0};
        for (int b = 0; b < KILN_CALIB_BINS && h->range > 0; b++) {
            if (h->bins[b] == 0) continue;
            int nb = (int)((b + 0.5) * old_w / amax * KILN_CALIB_BINS);
            bins[nb < KILN_CALIB_BINS ? nb : KILN_CALIB_BINS - 1] += h->bins[b];
        }
        memcpy(h->bins, bins, sizeof bins);
        h->range = amax;
    }
    if (h->range <= 0) {
        for (int64_t i = 0; i < n; i++)
            if (isfinite(x[i])) h->bins[0] += 1, h->seen++;
        return;
    }
    double scale = KILN_CALIB_BINS / h->range;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) continue;
        int b = (int)(fabs((double)x[i]) * scale);
        h->bins[b < KILN_CALIB_BINS ? b : KILN_CALIB_BINS - 1] += 1;
        h->seen++;
    }
}

/* KL(P || Q) of the first i bins (TensorRT's candidate i). */
static double kl_at(const double *hist, int i)
{
    enum { QB = 128 };
    double p[KILN_CALIB_BINS], q[KILN_CALIB_BINS];
    double outliers = 0.0;
    for (int b = i; b < KILN_CALIB_BINS; b++) outliers += hist[b];
    for (int b = 0; b < i; b++) {
        p[b] = hist[b];
        q[b] = 0.0;
    }
    p[i - 1] += outliers;
    for (int j = 0; j < QB; j++) {
        int start = (int)floor((double)j * i / QB), end = (int)floor((double)(j + 1) * i / QB);
        if (j == QB - 1) end = i;
        double total = 0.0;
        int nz = 0;
        for (int b = start; b < end; b++) {
            total += hist[b];
            nz += hist[b] != 0;
        }
        for (int b = start; b < end && nz; b++)
            if (hist[b] != 0) q[b] = total / nz;
    }
    double sp = 0.0, sq = 0.0;
    for (int b = 0; b < i; b++) {
        sp += p[b];
        sq += q[b];
    }
    if (sp <= 0) return 0.0;
    double kl = 0.0;
    for (int b = 0; b < i; b++) {
        if (p[b] <= 0) continue;
        double pn = p[b] / sp, qn = sq > 0 ? q[b] / sq : 0.0;
        if (qn <= 0) qn = 1e-10;
        kl += pn * log(pn / qn);
    }
    return kl;
}

void kiln_calib_hist_range(const struct kiln_calib_hist *h, int method, double percentile,
                           float *lo, float *hi)
{
    double l = h->min < 0 ? h->min : 0.0, u = h->max > 0 ? h->max : 0.0;
    double w = h->range / KILN_CALIB_BINS, t = h->range;
    if (method == 1 && h->seen > 0 && h->range > 0) {
        double want = percentile / 100.0 * (double)h->seen, c = 0.0;
        for (int b = 0; b < KILN_CALIB_BINS; b++) {
            c += h->bins[b];
            if (c >= want) {
                t = (b + 1) * w;
                break;
            }
        }
    } else if (method == 2 && h->seen > 0 && h->range > 0) {
        double best = DBL_MAX;
        for (int i = 128; i <= KILN_CALIB_BINS; i++) {
            double kl = kl_at(h->bins, i);
            if (kl < best) {
                best = kl;
                t = i * w;
            }
        }
    }
    if (method == 1 || method == 2) {
        if (l < -t) l = -t;
        if (u > t) u = t;
    }
    *lo = (float)l;
    *hi = (float)u;
}

/* ---- the rewrite ---- */

/* A constant float vector of n values (rank 1, or [1, n]). */
/* The constant behind value v: v itself, or what a chain of Identity nodes
 * passes on (PyTorch's exporter writes Identity(initializer) for tensors it
 * deduplicated, such as the all-zero biases of freshly initialized
 * squeeze-and-excitation convolutions). NULL for anything else. */
static const kiln_tensor *sq_const(const struct kiln_graph *g, int v)
{
    for (int hop = 0; hop < 8 && v >= 0 && v < g->n_values; hop++) {
        const kiln_tensor *t = kiln_opt_const(g, v);
        if (t) return t;
        int p = kiln_opt_producer(g, v);
        if (p < 0 || g->nodes[p].op != KILN_OP_Identity || g->nodes[p].n_in < 1 ||
            g->nodes[p].n_implicit)
            return NULL;
        v = g->nodes[p].in[0];
    }
    return NULL;
}

static bool bias_vector(const kiln_tensor *t, int64_t n)
{
    return t && t->dtype == KILN_DTYPE_F32 && kiln_tensor_count(t) == n &&
           (t->rank == 1 || (t->rank == 2 && t->dims[0] == 1));
}

/* v's float32 scalar when constant: an initializer, or a Constant node's value (the imported
 * graph calibration reads is not folded yet; qdq_fusion folds it before it matches). */
static bool scalar_of(const struct kiln_graph *g, int v, float *out)
{
    if (kiln_opt_const_scalar(g, v, out)) return true;
    int p = kiln_opt_producer(g, v);
    if (p < 0 || g->nodes[p].op != KILN_OP_Constant) return false;
    const struct kiln_attr *a = kiln_node_attr(&g->nodes[p], "value");
    if (a && a->type == KILN_ATTR_TENSOR && a->t && a->t->dtype == KILN_DTYPE_F32 &&
        kiln_tensor_count(a->t) == 1) {
        *out = ((const float *)a->t->data)[0];
        return true;
    }
    a = kiln_node_attr(&g->nodes[p], "value_float");
    if (a && a->type == KILN_ATTR_FLOAT) {
        *out = a->f;
        return true;
    }
    return false;
}

/* A Clip with constant bounds lo <= 0 <= hi (ReLU6): a range calibrated on its output then
 * lies within them, so qdq_fusion can drop it (Q(lo), Q(hi) saturate). */
static bool fusable_clip(const struct kiln_graph *g, const struct kiln_node *n)
{
    float lo = -FLT_MAX, hi = FLT_MAX;
    if (n->op != KILN_OP_Clip) return false;
    if (n->opset < 11) {
        if (!kiln_opt_clip_bounds(g, n, &lo, &hi)) return false;
    } else if ((n->n_in > 1 && n->in[1] >= 0 && !scalar_of(g, n->in[1], &lo)) ||
               (n->n_in > 2 && n->in[2] >= 0 && !scalar_of(g, n->in[2], &hi))) {
        return false;
    }
    return lo <= 0.0f && hi >= 0.0f;
}

kiln_status kiln_sq_targets(const struct kiln_graph *g, struct kiln_sq_target **out, int *n)
{
    *out = NULL;
    *n = 0;
    struct kiln_sq_target *t = calloc((size_t)g->n_nodes * 2 + 1, sizeof *t);
    if (!t) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const struct kiln_node *c = &g->nodes[ni];
        if ((c->op != KILN_OP_Conv && c->op != KILN_OP_Gemm && c->op != KILN_OP_MatMul) ||
            c->n_out != 1 || c->out[0] < 0 || c->n_in < 2 || c->in[0] < 0 || c->in[1] < 0)
            continue;
        const struct kiln_type *tx = &g->values[c->in[0]].type;
        const kiln_tensor *w = sq_const(g, c->in[1]);
        const kiln_tensor *b = c->n_in > 2 && c->in[2] >= 0 ? sq_const(g, c->in[2]) : NULL;
        if (tx->dtype != KILN_DTYPE_F32 || !w || w->dtype != KILN_DTYPE_F32) continue;
        if (c->n_in > 2 && c->in[2] >= 0 && !b) continue;
        if (c->op == KILN_OP_Conv) {
            if (tx->rank != 4 || w->rank != 4 || (b && !bias_vector(b, w->dims[0]))) continue;
        } else if (c->op == KILN_OP_Gemm) {
            float alpha = kiln_attr_float(c, "alpha", 1.0f), beta = kiln_attr_float(c, "beta", 1.0f);
            int64_t ta = kiln_attr_int(c, "transA", 0), tb = kiln_attr_int(c, "transB", 0);
            if (kiln_attr_check(c) != KILN_OK) {
                kiln_error_clear();
                continue;
            }
            if (alpha != 1.0f || ta != 0 || (tb != 0 && tb != 1) || w->rank != 2 ||
                (b && (beta != 1.0f || !bias_vector(b, w->dims[tb ? 0 : 1]))))
                continue;
        } else if (w->rank != 2 || tx->rank < 2) {
            continue;
        }
        int y = c->out[0], relu = -1;
        int ri = kiln_opt_single_consumer(g, y);
        if (ri >= 0 && (g->nodes[ri].op == KILN_OP_Relu || fusable_clip(g, &g->nodes[ri])) &&
            g->nodes[ri].n_out == 1 && g->nodes[ri].out[0] >= 0) {
            relu = ri;
            y = g->nodes[ri].out[0];
        }
        t[*n] = (struct kiln_sq_target){ni, c->in[0], y, relu, -1, 0};
        (*n)++;
    }
    /* residual Adds of two same-shape 4-D float values (ResNet, MobileNetV2): quantized in and
     * out, so qadd_fusion makes a KilnQLinearAdd of each and the 8-bit chain goes on */
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const struct kiln_node *c = &g->nodes[ni];
        if (c->op != KILN_OP_Add || c->opset < 7 || c->n_in != 2 || c->n_out != 1 ||
            c->in[0] < 0 || c->in[1] < 0 || c->in[0] == c->in[1] || c->out[0] < 0)
            continue;
        const struct kiln_type *ty = &g->values[c->out[0]].type;
        if (ty->dtype != KILN_DTYPE_F32 || ty->rank != 4 || kiln_opt_const(g, c->in[0]) ||
            kiln_opt_const(g, c->in[1]) ||
            !kiln_opt_same_shape(&g->values[c->in[0]].type, ty) ||
            !kiln_opt_same_shape(&g->values[c->in[1]].type, ty) ||
            g->values[c->in[0]].type.dtype != KILN_DTYPE_F32 ||
            g->values[c->in[1]].type.dtype != KILN_DTYPE_F32)
            continue;
        int y = c->out[0], relu = -1;
        int ri = kiln_opt_single_consumer(g, y);
        if (ri >= 0 && g->nodes[ri].op == KILN_OP_Relu && g->nodes[ri].n_out == 1 &&
            g->nodes[ri].out[0] >= 0) {
            relu = ri;
            y = g->nodes[ri].out[0];
        }
        t[*n] = (struct kiln_sq_target){ni, c->in[0], y, relu, c->in[1], 0};
        (*n)++;
    }
    *out = t;
    return KILN_OK;
}

static void act_params(const float r[2], float *scale, uint8_t *zp)
{
    float s = (r[1] - r[0]) / 255.0f;
    if (!(s > 0.0f) || !isfinite(s)) s = 1.0f;
    double z = rint(-(double)r[0] / s);
    *scale = s;
    *zp = (uint8_t)(z < 0 ? 0 : z > 255 ? 255 : z);
}

static kiln_status scalar_const(struct kiln_graph *g, kiln_dtype dt, double v, int *id)
{
    kiln_tensor *t;
    kiln_status st = kiln_tensor_new(dt, 0, NULL, &t);
    if (st != KILN_OK) return st;
    kiln_set_f64(dt, t->data, 0, v);
    return kiln_opt_add_const(g, "calib", t, id);
}

/* Add Q or DQ node (x, scale, zp[, axis]) -> out. */
static kiln_status qdq_node(struct kiln_graph *g, enum kiln_op op, int x, int s, int z, int axis,
                            int out)
{
    int ni;
    kiln_status st = kiln_opt_add_node(g, op, "calib", 3, 1, axis >= 0 ? 1 : 0, 13, &ni);
    if (st != KILN_OK) return st;
    if (axis >= 0) kiln_opt_attr_int(g, ni, 0, "axis", axis);
    kiln_opt_set_input(g, ni, 0, x);
    kiln_opt_set_input(g, ni, 1, s);
    kiln_opt_set_input(g, ni, 2, z);
    kiln_opt_set_output(g, ni, 0, out);
    return KILN_OK;
}

/* Put value v through Q -> DQ with parameters (s, z): v's producer writes a new value, and
 * the DequantizeLinear writes v. */
static kiln_status wrap_output(struct kiln_graph *g, int v, float scale, uint8_t zp)
{
    int prod = kiln_opt_producer(g, v), v0, qv, s, z;
    struct kiln_type t = g->values[v].type, tq = t;
    tq.dtype = KILN_DTYPE_U8;
    kiln_status st = kiln_opt_add_value(g, g->values[v].name, &t, &v0);
    if (st == KILN_OK) st = kiln_opt_add_value(g, g->values[v].name, &tq, &qv);
    if (st == KILN_OK) st = scalar_const(g, KILN_DTYPE_F32, scale, &s);
    if (st == KILN_OK) st = scalar_const(g, KILN_DTYPE_U8, zp, &z);
    if (st != KILN_OK) return st;
    int k = 0;
    while (g->nodes[prod].out[k] != v) k++;
    kiln_opt_set_output(g, prod, k, v0);
    st = qdq_node(g, KILN_OP_QuantizeLinear, v0, s, z, -1, qv);
    if (st == KILN_OK) st = qdq_node(g, KILN_OP_DequantizeLinear, qv, s, z, -1, v);
    return st;
}

/* Input k of node ni through Q -> DQ (a new DequantizeLinear output feeds it). */
static kiln_status wrap_input(struct kiln_graph *g, int ni, int k, float scale, uint8_t zp)
{
    int x = g->nodes[ni].in[k], qv, dv, s, z;
    struct kiln_type t = g->values[x].type, tq = t;
    tq.dtype = KILN_DTYPE_U8;
    kiln_status st = kiln_opt_add_value(g, g->values[x].name, &tq, &qv);
    if (st == KILN_OK) st = kiln_opt_add_value(g, g->values[x].name, &t, &dv);
    if (st == KILN_OK) st = scalar_const(g, KILN_DTYPE_F32, scale, &s);
    if (st == KILN_OK) st = scalar_const(g, KILN_DTYPE_U8, zp, &z);
    if (st == KILN_OK) st = qdq_node(g, KILN_OP_QuantizeLinear, x, s, z, -1, qv);
    if (st == KILN_OK) st = qdq_node(g, KILN_OP_DequantizeLinear, qv, s, z, -1, dv);
    if (st == KILN_OK) kiln_opt_set_input(g, ni, k, dv);
    return st;
}

/* Weights (input 1) -> DQ(s8 per channel along axis), bias (input 2) -> DQ(int32). */
static kiln_status wrap_weights(struct kiln_graph *g, int ni, int axis, float xs)
{
    const kiln_tensor *w = sq_const(g, g->nodes[ni].in[1]);
    int64_t nch = w->dims[axis], count = kiln_tensor_count(w), inner = 1;
    for (int d = axis + 1; d < w->rank; d++) inner *= w->dims[d];
    kiln_tensor *wq = NULL, *ws = NULL, *wz = NULL;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_I8, w->rank, w->dims, &wq);
    if (st == KILN_OK) st = kiln_tensor_new(KILN_DTYPE_F32, 1, &nch, &ws);
    if (st == KILN_OK) st = kiln_tensor_new(KILN_DTYPE_I8, 1, &nch, &wz);
    if (st != KILN_OK) {
        kiln_tensor_free(wq);
        kiln_tensor_free(ws);
        return st;
    }
    const float *wd = w->data;
    float *sc = ws->data;
    for (int64_t c = 0; c < nch; c++) sc[c] = 0.0f;
    for (int64_t i = 0; i < count; i++) {
        int64_t c = (i / inner) % nch;
        float a = fabsf(wd[i]);
        if (isfinite(a) && a > sc[c]) sc[c] = a;
    }
    for (int64_t c = 0; c < nch; c++) sc[c] = sc[c] > 0 ? sc[c] / 127.0f : 1.0f;
    int8_t *q = wq->data;
    for (int64_t i = 0; i < count; i++) {
        double v = rint((double)(wd[i] / sc[(i / inner) % nch]));
        q[i] = (int8_t)(v < -127 ? -127 : v > 127 ? 127 : isnan(v) ? 0 : v);
    }
    int bv = g->nodes[ni].n_in > 2 ? g->nodes[ni].in[2] : -1;
    kiln_tensor *bq = NULL, *bs = NULL, *bz = NULL;
    if (bv >= 0) {
        const kiln_tensor *b = sq_const(g, bv);
        st = kiln_tensor_new(KILN_DTYPE_I32, 1, &nch, &bq);
        if (st == KILN_OK) st = kiln_tensor_new(KILN_DTYPE_F32, 1, &nch, &bs);
        if (st == KILN_OK) st = kiln_tensor_new(KILN_DTYPE_I32, 1, &nch, &bz);
        if (st == KILN_OK)
            for (int64_t c = 0; c < nch; c++) {
                float s = xs * sc[c];
                double v = rint((double)((const float *)b->data)[c] / (double)s);
                ((float *)bs->data)[c] = s;
                ((int32_t *)bq->data)[c] =
                    (int32_t)(v < -2147483647.0 ? -2147483647.0 : v > 2147483647.0 ? 2147483647.0
                                                                                    : v);
            }
    }
    int ids[6] = {-1, -1, -1, -1, -1, -1};
    kiln_tensor *ts[6] = {wq, ws, wz, bq, bs, bz};
    for (int k = 0; k < 6; k++) {
        if (!ts[k]) continue;
        kiln_status s2 = st == KILN_OK ? kiln_opt_add_const(g, "calib_w", ts[k], &ids[k])
                                       : (kiln_tensor_free(ts[k]), st);
        if (st == KILN_OK) st = s2;
    }
    if (st != KILN_OK) return st;
    struct kiln_type tw = g->values[g->nodes[ni].in[1]].type;
    int dw, db;
    st = kiln_opt_add_value(g, "calib_w", &tw, &dw);
    if (st == KILN_OK) st = qdq_node(g, KILN_OP_DequantizeLinear, ids[0], ids[1], ids[2], axis, dw);
    if (st == KILN_OK) kiln_opt_set_input(g, ni, 1, dw);
    if (st == KILN_OK && bv >= 0) {
        struct kiln_type tb;
        kiln_type_set(&tb, KILN_DTYPE_F32, 1, &nch);
        st = kiln_opt_add_value(g, "calib_b", &tb, &db);
        if (st == KILN_OK) st = qdq_node(g, KILN_OP_DequantizeLinear, ids[3], ids[4], ids[5], 0, db);
        if (st == KILN_OK) kiln_opt_set_input(g, ni, 2, db);
    }
    return st;
}

kiln_status kiln_sq_rewrite(struct kiln_graph *g, const struct kiln_sq_target *t, int n,
                            const float (*range)[2])
{
    kiln_status st = KILN_OK;
    for (int i = 0; i < n && st == KILN_OK; i++) {
        if (t[i].float_out) continue;
        float s;
        uint8_t z;
        act_params(range[t[i].y], &s, &z);
        st = wrap_output(g, t[i].y, s, z);
    }
    for (int i = 0; i < n && st == KILN_OK; i++) {
        int ni = t[i].node;
        if (t[i].x2 >= 0) { /* an Add: each input not already a DequantizeLinear's output */
            for (int k = 0; k < 2 && st == KILN_OK; k++) {
                int pk = kiln_opt_producer(g, g->nodes[ni].in[k]);
                if (pk >= 0 && g->nodes[pk].op == KILN_OP_DequantizeLinear) continue;
                float s;
                uint8_t z;
                act_params(range[k ? t[i].x2 : t[i].x], &s, &z);
                st = wrap_input(g, ni, k, s, z);
            }
            continue;
        }
        int x = g->nodes[ni].in[0];
        int pi = kiln_opt_producer(g, x);
        float s;
        uint8_t z;
        act_params(range[t[i].x], &s, &z);
        bool chained = false;
        if (pi >= 0 && g->nodes[pi].op == KILN_OP_DequantizeLinear) { /* a wrapped output */
            const kiln_tensor *ps = kiln_opt_const(g, g->nodes[pi].in[1]);
            if (ps && ps->dtype == KILN_DTYPE_F32 && kiln_tensor_count(ps) == 1) {
                s = ((const float *)ps->data)[0];
                chained = true;
            }
        }
        if (!chained) st = wrap_input(g, ni, 0, s, z);
        if (st != KILN_OK) break;
        const struct kiln_node *c = &g->nodes[ni];
        int axis = c->op == KILN_OP_Conv ? 0 : c->op == KILN_OP_Gemm && kiln_attr_int(c, "transB", 0) ? 0 : 1;
        st = wrap_weights(g, ni, axis, s);
    }
    if (st == KILN_OK) st = kiln_opt_compact(g);
    return st;
}
