/*
 * qdq.c - the qdq_fusion pass: quantized models written in ONNX's QDQ form
 * (QuantizeLinear / DequantizeLinear pairs around float ops, as ONNX
 * Runtime's quantize_static and PyTorch's exporter write them) become
 * integer ops that run on oneDNN's int8 kernels (src/kernels/dnnl/qlinear.c)
 * instead of being executed literally in float.
 *
 * It runs first in the pipeline, before constant folding would turn the
 * DequantizeLinear of each int8 weight into a float constant. Patterns, with
 * every scale and zero point a constant:
 *
 *   DQ(xq, xs, xzp) --+
 *   DQ(wq, ws, wzp) --+-> Conv [+ Relu] -> Q(ys, yzp)        -> QLinearConv
 *   [DQ(bq, bs, 0)] --+
 *
 *   DQ(xq) --+
 *   DQ(wq) --+-> MatMul / Gemm [+ Relu] -> Q(ys, yzp)        -> KilnQLinearMatMul
 *   [bias] --+
 *
 * xq is int8 or uint8 with one scale and zero point; wq a constant int8 or
 * uint8 weight with one scale, or one per output channel (Conv's axis 0,
 * MatMul's [K, N] axis 1, Gemm's B per its transB); ys / yzp one value. A
 * Gemm must have alpha 1, transA 0 and beta 1 (or no C); its B is stored
 * transposed into [K, N] when transB = 1, and MatMul's B must be 2-D. The
 * bias (Conv's B, Gemm's C: a DequantizeLinear of int32 or a float
 * constant) becomes int32 in the accumulator's scale,
 * rint(bias / (xs * ws[n])): exact for the int32 bias that quantizers write
 * with scale xs * ws[n]; a float bias moves by at most half an accumulator
 * step. A Relu between the op and the Q is dropped when yzp is the lowest
 * value of its type (0 for uint8, -128 for int8): then Q(Relu(v)) = Q(v)
 * exactly, as the quantized result saturates at yzp already. A Clip with
 * constant bounds (ReLU6) is dropped likewise when Q(min) and Q(max) already
 * saturate to the lowest and highest value (clip_saturates; a range
 * calibrated on the Clip's output always does). Anything else (a Relu with
 * another zero point, a Clip narrower than the range, several consumers of
 * the float result) is left alone and runs as imported.
 *
 * The result feeds the next quantized op without a float round trip: in
 * Q -> DQ -> Conv -> Q -> DQ -> Conv, each Conv reads the previous int8
 * tensor directly, and the DQ nodes nothing reads any more are removed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "kernels/kernel.h"
#include "opt/opt.h"

/* A DequantizeLinear / QuantizeLinear node's constant parameters. */
struct qparams {
    const kiln_tensor *scale, *zp; /* zp may be NULL (zero of xq's type) */
    int scale_v, zp_v;             /* value ids (zp_v -1 when absent) */
    int axis;                      /* normalized axis of a per-channel scale */
};

static bool q8(kiln_dtype dt) { return dt == KILN_DTYPE_U8 || dt == KILN_DTYPE_I8; }

/* The constant scale (float32, positive, finite) and zero point of Q/DQ node n whose
 * quantized side has type qt; per-channel only when allowed (count == channels). */
static bool node_params(const struct kiln_graph *g, const struct kiln_node *n,
                        const struct kiln_type *qt, bool per_channel_ok, struct qparams *p)
{
    memset(p, 0, sizeof *p);
    if (n->n_in < 2 || n->in[1] < 0) return false;
    p->scale_v = n->in[1];
    p->zp_v = n->n_in > 2 ? n->in[2] : -1;
    p->scale = kiln_opt_const(g, p->scale_v);
    p->zp = p->zp_v >= 0 ? kiln_opt_const(g, p->zp_v) : NULL;
    if (!p->scale || p->scale->dtype != KILN_DTYPE_F32 || (p->zp_v >= 0 && !p->zp)) return false;
    int64_t cnt = kiln_tensor_count(p->scale);
    if (p->zp && (p->zp->dtype != qt->dtype || kiln_tensor_count(p->zp) != cnt)) return false;
    for (int64_t i = 0; i < cnt; i++) {
        float s = ((const float *)p->scale->data)[i];
        if (!(s > 0.0f) || !isfinite(s)) return false;
    }
    if (cnt != 1) {
        if (!per_channel_ok || p->scale->rank != 1 || qt->rank < 1) return false;
        int64_t axis = kiln_attr_int(n, "axis", 1);
        if (kiln_attr_check(n) != KILN_OK) {
            kiln_error_clear();
            return false;
        }
        if (axis < 0) axis += qt->rank;
        if (axis < 0 || axis >= qt->rank || qt->dims[axis] != cnt) return false;
        p->axis = (int)axis;
    } else {
        p->axis = -1;
    }
    return true;
}

/* The live DequantizeLinear node producing v, or -1. */
static int dq_of(const struct kiln_graph *g, int v)
{
    int pi = v >= 0 ? kiln_opt_producer(g, v) : -1;
    if (pi < 0 || g->nodes[pi].op != KILN_OP_DequantizeLinear || g->nodes[pi].in[0] < 0) return -1;
    return pi;
}

/* A scalar zero constant of dtype dt (for an absent zero point). */
static kiln_status zero_const(struct kiln_graph *g, kiln_dtype dt, int *id)
{
    kiln_tensor *t;
    kiln_status st = kiln_tensor_new(dt, 0, NULL, &t);
    if (st != KILN_OK) return st;
    return kiln_opt_add_const(g, "qdq_zero_point", t, id);
}

/* Element i of a tensor holding one value or one per channel. */
static double at(const kiln_tensor *t, int64_t i)
{
    return kiln_get_f64(t->dtype, t->data, kiln_tensor_count(t) == 1 ? 0 : i);
}

/* The float bias of value v (a constant, or a DequantizeLinear of one) for n channels:
 * *out receives n doubles (caller frees). */
static bool float_bias(const struct kiln_graph *g, int v, int64_t n, double **out)
{
    *out = NULL;
    const kiln_tensor *c = kiln_opt_const(g, v);
    const kiln_tensor *s = NULL, *z = NULL;
    int di = c ? -1 : dq_of(g, v);
    if (di >= 0) {
        const struct kiln_node *d = &g->nodes[di];
        c = kiln_opt_const(g, d->in[0]);
        s = d->n_in > 1 && d->in[1] >= 0 ? kiln_opt_const(g, d->in[1]) : NULL;
        z = d->n_in > 2 && d->in[2] >= 0 ? kiln_opt_const(g, d->in[2]) : NULL;
        if (!c || !s || (d->n_in > 2 && d->in[2] >= 0 && !z)) return false;
        if (s->dtype != KILN_DTYPE_F32 || (kiln_tensor_count(s) != 1 && kiln_tensor_count(s) != n))
            return false;
        if (z && kiln_tensor_count(z) != 1 && kiln_tensor_count(z) != n) return false;
        if (c->dtype != KILN_DTYPE_I32 && !q8(c->dtype)) return false;
    } else if (!c || c->dtype != KILN_DTYPE_F32) {
        return false;
    }
    if (kiln_tensor_count(c) != n) return false;
    double *b = malloc(sizeof(double) * (size_t)(n + 1));
    if (!b) return false;
    for (int64_t i = 0; i < n; i++) {
        double x = kiln_get_f64(c->dtype, c->data, i);
        if (s) x = (double)((float)(x - (z ? at(z, i) : 0.0)) * (float)at(s, i));
        b[i] = x;
    }
    *out = b;
    return true;
}

/* The int32 bias rint(bias / (xs * ws[n])); false when one does not fit. */
static kiln_status int_bias(struct kiln_graph *g, const double *b, int64_t n, float xs,
                            const kiln_tensor *ws, int *id, bool *ok)
{
    *ok = false;
    kiln_tensor *t;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_I32, 1, &n, &t);
    if (st != KILN_OK) return st;
    for (int64_t i = 0; i < n; i++) {
        double q = rint(b[i] / (double)(xs * (float)at(ws, i)));
        if (!(fabs(q) <= 2147483647.0)) {
            kiln_tensor_free(t);
            return KILN_OK;
        }
        ((int32_t *)t->data)[i] = (int32_t)q;
    }
    *ok = true;
    return kiln_opt_add_const(g, "qdq_bias", t, id);
}

/* B [N, K] stored as [K, N] (Gemm's transB = 1). */
static kiln_status transposed(struct kiln_graph *g, const kiln_tensor *w, int *id)
{
    int64_t nn = w->dims[0], k = w->dims[1], d[2] = {k, nn};
    kiln_tensor *t;
    kiln_status st = kiln_tensor_new(w->dtype, 2, d, &t);
    if (st != KILN_OK) return st;
    const uint8_t *src = w->data;
    uint8_t *dst = t->data;
    for (int64_t i = 0; i < nn; i++)
        for (int64_t j = 0; j < k; j++) dst[j * nn + i] = src[i * k + j];
    return kiln_opt_add_const(g, "qdq_weight_t", t, id);
}

static bool is_zero_point_min(const kiln_tensor *zp, kiln_dtype dt)
{
    double z = zp ? at(zp, 0) : 0.0;
    return z == (dt == KILN_DTYPE_I8 ? -128.0 : 0.0);
}

/* Whether Q(Clip(v, lo, hi)) == Q(v) for every v, Q being QuantizeLinear with p's one
 * scale and zero point into dt: when Q(lo) and Q(hi), computed as the kernels do (float32
 * division, round half to even, plus the zero point), already saturate to the lowest and
 * highest value, the clip changes nothing Q can see (Q is monotonic). ReLU6 before a
 * calibrated [0, max <= 6] range is such a Clip. */
static bool clip_saturates(float lo, float hi, const struct qparams *p, kiln_dtype dt)
{
    float s = ((const float *)p->scale->data)[0];
    float z = p->zp ? (float)at(p->zp, 0) : 0.0f;
    float qmin = dt == KILN_DTYPE_I8 ? -128.0f : 0.0f, qmax = dt == KILN_DTYPE_I8 ? 127.0f : 255.0f;
    return rintf(lo / s) + z <= qmin && rintf(hi / s) + z >= qmax;
}

/* Try to fuse the pattern that ends in QuantizeLinear node qi; *done when it did. */
static kiln_status fuse_one(struct kiln_graph *g, int qi, struct kiln_opt_pass_log *pl, bool *done)
{
    *done = false;
    const struct kiln_node *q = &g->nodes[qi];
    if (q->n_out != 1 || q->in[0] < 0) return KILN_OK;
    int yq = q->out[0];
    const struct kiln_type *tyq = &g->values[yq].type;
    if (!q8(tyq->dtype)) return KILN_OK;
    struct qparams qp;
    if (!node_params(g, q, tyq, false, &qp) || !qp.zp) return KILN_OK;
    int cur = q->in[0];
    int ci = kiln_opt_producer(g, cur), ri = -1;
    if (ci < 0 || kiln_opt_single_consumer(g, cur) != qi) return KILN_OK;
    float clo, chi;
    if (g->nodes[ci].op == KILN_OP_Relu || g->nodes[ci].op == KILN_OP_Clip) {
        if (g->nodes[ci].op == KILN_OP_Relu ? !is_zero_point_min(qp.zp, tyq->dtype)
                                           : !kiln_opt_clip_bounds(g, &g->nodes[ci], &clo, &chi) ||
                                                 !clip_saturates(clo, chi, &qp, tyq->dtype))
            return KILN_OK;
        ri = ci;
        cur = g->nodes[ri].in[0];
        ci = cur >= 0 ? kiln_opt_producer(g, cur) : -1;
        if (ci < 0 || kiln_opt_single_consumer(g, cur) != ri) return KILN_OK;
    }
    const struct kiln_node *c = &g->nodes[ci];
    enum kiln_op op = c->op;
    if ((op != KILN_OP_Conv && op != KILN_OP_MatMul && op != KILN_OP_Gemm) || c->n_out != 1 ||
        c->n_in < 2)
        return KILN_OK;
    int dxi = dq_of(g, c->in[0]), dwi = dq_of(g, c->in[1]);
    if (dxi < 0 || dwi < 0) return KILN_OK;
    const struct kiln_node *dx = &g->nodes[dxi], *dw = &g->nodes[dwi];
    int xq = dx->in[0], wq = dw->in[0];
    const struct kiln_type *txq = &g->values[xq].type;
    const kiln_tensor *w = kiln_opt_const(g, wq);
    if (!q8(txq->dtype) || !w || !q8(w->dtype)) return KILN_OK;
    struct qparams xp, wp;
    struct kiln_type tw;
    kiln_type_from_tensor(&tw, w);
    if (!node_params(g, dx, txq, false, &xp) || !node_params(g, dw, &tw, true, &wp))
        return KILN_OK;

    int64_t trans_b = 0, nout;
    int bias_v = -1;
    if (op == KILN_OP_Conv) {
        if (w->rank < 3 || txq->rank != w->rank) return KILN_OK;
        if (wp.axis > 0) return KILN_OK;
        nout = w->dims[0];
        bias_v = c->n_in > 2 ? c->in[2] : -1;
    } else {
        if (w->rank != 2 || txq->rank < 2) return KILN_OK;
        if (op == KILN_OP_Gemm) {
            float alpha = kiln_attr_float(c, "alpha", 1.0f), beta = kiln_attr_float(c, "beta", 1.0f);
            int64_t ta = kiln_attr_int(c, "transA", 0);
            trans_b = kiln_attr_int(c, "transB", 0);
            if (kiln_attr_check(c) != KILN_OK) {
                kiln_error_clear();
                return KILN_OK;
            }
            bias_v = c->n_in > 2 ? c->in[2] : -1;
            if (alpha != 1.0f || ta != 0 || (trans_b != 0 && trans_b != 1) ||
                (bias_v >= 0 && beta != 1.0f) || txq->rank != 2)
                return KILN_OK;
        }
        nout = w->dims[trans_b ? 0 : 1];
        /* a per-channel scale must run along the output columns */
        if (wp.axis >= 0 && wp.axis != (trans_b ? 0 : 1)) return KILN_OK;
    }
    if (nout <= 0) return KILN_OK;
    float xs = ((const float *)xp.scale->data)[0];

    /* everything matched: build the new inputs */
    kiln_status st = KILN_OK;
    int bias_i = -1;
    if (bias_v >= 0) {
        double *bf;
        if (!float_bias(g, bias_v, nout, &bf)) return KILN_OK;
        bool ok;
        st = int_bias(g, bf, nout, xs, wp.scale, &bias_i, &ok);
        free(bf);
        if (st != KILN_OK || !ok) return st;
    }
    int w_in = wq;
    if (trans_b) {
        st = transposed(g, w, &w_in);
        if (st != KILN_OK) return st;
    }
    int xzp = xp.zp_v, wzp = wp.zp_v;
    if (xzp < 0) st = zero_const(g, txq->dtype, &xzp);
    if (st == KILN_OK && wzp < 0) st = zero_const(g, w->dtype, &wzp);
    if (st != KILN_OK) return st;

    c = &g->nodes[ci];
    int n_in = bias_i >= 0 ? 9 : 8, ni;
    bool conv = op == KILN_OP_Conv;
    st = kiln_opt_add_node(g, conv ? KILN_OP_QLinearConv : KILN_OP_KilnQLinearMatMul,
                           g->nodes[ci].name, n_in, 1, conv ? g->nodes[ci].n_attr : 0,
                           conv ? 10 : 1, &ni);
    if (st != KILN_OK) return st;
    c = &g->nodes[ci];
    if (conv) {
        for (int k = 0; k < c->n_attr; k++) g->nodes[ni].attr[k] = c->attr[k];
        g->nodes[ni].n_attr = c->n_attr;
    }
    int ins[9] = {xq,
                  xp.scale_v,
                  xzp,
                  w_in,
                  wp.scale_v,
                  wzp,
                  g->nodes[qi].in[1],
                  g->nodes[qi].in[2],
                  bias_i};
    for (int k = 0; k < n_in; k++) kiln_opt_set_input(g, ni, k, ins[k]);
    bool clip = ri >= 0 && g->nodes[ri].op == KILN_OP_Clip;
    int rm[3] = {qi, ri, ci};
    for (int k = 0; k < 3; k++)
        if (rm[k] >= 0) kiln_opt_remove_node(g, rm[k]);
    kiln_opt_set_output(g, ni, 0, yq);
    /* the dequantized x and w, when nothing else reads them */
    int dqs[2] = {dwi, dxi};
    for (int k = 0; k < 2; k++) {
        int v = g->nodes[dqs[k]].out[0];
        if (!kiln_opt_node_dead(&g->nodes[dqs[k]]) && v >= 0 && g->values[v].uses == 0 &&
            !kiln_opt_is_graph_output(g, v))
            kiln_opt_remove_node(g, dqs[k]);
    }
    if (bias_v >= 0) {
        int dbi = dq_of(g, bias_v);
        if (dbi >= 0 && g->values[bias_v].uses == 0 && !kiln_opt_is_graph_output(g, bias_v))
            kiln_opt_remove_node(g, dbi);
    }
    static const char *const kinds[3][3] = {
        {"DQ+Conv+Q", "DQ+MatMul+Q", "DQ+Gemm+Q"},
        {"DQ+Conv+Relu+Q", "DQ+MatMul+Relu+Q", "DQ+Gemm+Relu+Q"},
        {"DQ+Conv+Clip+Q", "DQ+MatMul+Clip+Q", "DQ+Gemm+Clip+Q"}};
    kiln_opt_count(pl, kinds[ri < 0 ? 0 : clip ? 2 : 1][conv ? 0 : op == KILN_OP_MatMul ? 1 : 2]);
    *done = true;
    return KILN_OK;
}

/* The parameter plumbing exporters put around Q/DQ before folding has run: Constant
 * nodes, and Cast / ConstantOfShape / Identity / Reshape / (Un)Squeeze of constants (PyTorch
 * writes a bias zero point as Cast(ConstantOfShape)), fold now; a Cast to the type a value
 * already has (PyTorch's Cast of each QuantizeLinear to uint8) is bypassed. */
static kiln_status prepare(struct kiln_graph *g)
{
    for (int oi = 0; oi < g->n_nodes; oi++) {
        int ni = g->order ? g->order[oi] : oi;
        struct kiln_node *n = &g->nodes[ni];
        if (kiln_opt_node_dead(n) || n->n_out != 1 || n->out[0] < 0 ||
            kiln_opt_is_graph_output(g, n->out[0]))
            continue;
        enum kiln_op op = n->op;
        if (op != KILN_OP_Constant && op != KILN_OP_Cast && op != KILN_OP_ConstantOfShape &&
            op != KILN_OP_Identity && op != KILN_OP_Reshape && op != KILN_OP_Squeeze &&
            op != KILN_OP_Unsqueeze)
            continue;
        bool all_const = true;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] >= 0 && g->values[n->in[k]].kind != KILN_VALUE_CONST) all_const = false;
        if (all_const) {
            bool folded;
            kiln_status st = kiln_opt_fold_node(g, ni, &folded);
            if (st != KILN_OK) return st;
        } else if (op == KILN_OP_Cast && n->n_in == 1 && n->in[0] >= 0) {
            int64_t to = kiln_attr_int(n, "to", -1);
            if (kiln_attr_check(n) != KILN_OK) {
                kiln_error_clear();
                continue;
            }
            kiln_dtype dt = g->values[n->in[0]].type.dtype;
            if (q8(dt) && to == (dt == KILN_DTYPE_U8 ? 2 : 3))
                kiln_opt_bypass(g, ni, n->in[0], n->out[0]);
        }
    }
    return KILN_OK;
}

kiln_status kiln_opt_qdq(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    bool any_q = false;
    for (int i = 0; i < g->n_nodes && !any_q; i++)
        any_q = !kiln_opt_node_dead(&g->nodes[i]) && g->nodes[i].op == KILN_OP_QuantizeLinear;
    if (!any_q) return KILN_OK; /* nothing quantized: leave the graph to the other passes */
    kiln_status pst = prepare(g);
    if (pst != KILN_OK) return pst;
    int n_nodes = g->n_nodes;
    for (int qi = 0; qi < n_nodes; qi++) {
        if (kiln_opt_node_dead(&g->nodes[qi]) || g->nodes[qi].op != KILN_OP_QuantizeLinear)
            continue;
        bool done;
        kiln_status st = fuse_one(g, qi, pl, &done);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}
