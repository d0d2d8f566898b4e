/*
 * conv_bn.c - fold an inference BatchNormalization into the Conv or Gemm
 * that feeds it: with s = scale / sqrt(var + eps),
 *   W'[m] = W[m] * s[m],  B'[m] = (B[m] - mean[m]) * s[m] + bias[m]
 * (for Gemm, W's output column m; its C must be a vector of N or absent).
 * Everything float32 and constant, the BN's parameters 1-D with one value
 * per output channel, the Conv/Gemm output read only by the BN, and the
 * BN with one output and training_mode off. The BN's output value keeps
 * its id: the new Conv/Gemm writes it.
 *
 * A BatchNormalization no Conv or Gemm feeds (pre-activation blocks) is
 * folded into the Conv that reads it where that Conv pads nothing (the
 * algebra breaks at zero padding, and through any activation in between);
 * otherwise it becomes a depthwise 1x1 Conv computing x * s + shift, which
 * the conv fusion fuses with a following activation and the layout pass
 * may store blocked (standalone_bn below).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "kernels/kernel.h"
#include "opt/opt.h"

/* The BN's per-channel s and shift (bias - mean * s) for m channels, or false. */
static bool bn_params(const struct kiln_graph *g, const struct kiln_node *bn, int64_t m, float *s,
                      float *shift)
{
    if (bn->n_in != 5 || bn->n_out < 1) return false;
    for (int k = 1; k < bn->n_out; k++)
        if (bn->out[k] >= 0 && g->values[bn->out[k]].uses > 0) return false;
    if (kiln_attr_int(bn, "training_mode", 0) != 0) return false;
    float eps = kiln_attr_float(bn, "epsilon", 1e-5f);
    if (kiln_attr_check(bn) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    const kiln_tensor *p[4];
    for (int k = 0; k < 4; k++) {
        p[k] = kiln_opt_const(g, bn->in[k + 1]);
        if (!p[k] || p[k]->dtype != KILN_DTYPE_F32 || p[k]->rank != 1 || p[k]->dims[0] != m)
            return false;
    }
    const float *scale = p[0]->data, *bias = p[1]->data, *mean = p[2]->data, *var = p[3]->data;
    for (int64_t c = 0; c < m; c++) {
        double sc = (double)scale[c] / sqrt((double)var[c] + (double)eps);
        s[c] = (float)sc;
        shift[c] = (float)((double)bias[c] - (double)mean[c] * sc);
    }
    return true;
}

/* The shared start of a fold: the BN's per-channel s (caller frees), a new
 * bias tensor holding its shift, and a copy of w to scale. *ok false (and
 * nothing allocated) when the BN does not fold. */
static kiln_status fold_begin(const struct kiln_graph *g, const struct kiln_node *bn, int64_t m,
                              const kiln_tensor *w, float **s, kiln_tensor **nb,
                              kiln_tensor **nw, bool *ok)
{
    *ok = false;
    *s = malloc(sizeof(float) * (size_t)m);
    if (!*s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory folding a BatchNormalization");
    kiln_status st = kiln_tensor_new(KILN_DTYPE_F32, 1, &m, nb);
    if (st != KILN_OK) goto fail;
    if (!bn_params(g, bn, m, *s, (*nb)->data)) {
        kiln_tensor_free(*nb);
        goto fail;
    }
    st = kiln_tensor_clone(w, nw);
    if (st != KILN_OK) {
        kiln_tensor_free(*nb);
        goto fail;
    }
    *ok = true;
    return KILN_OK;
fail:
    free(*s);
    *s = NULL;
    return st;
}

/* Hand the folded weight and bias to the graph as constants named after w. */
static kiln_status fold_consts(struct kiln_graph *g, int w_value, kiln_tensor *nw, kiln_tensor *nb,
                               int *wv, int *bv)
{
    kiln_status st = kiln_opt_add_const(g, g->values[w_value].name, nw, wv);
    if (st != KILN_OK) {
        kiln_tensor_free(nb);
        return st;
    }
    return kiln_opt_add_const(g, g->values[w_value].name, nb, bv);
}

/* Fold BN node bi into Conv node ci. */
static kiln_status fold_conv(struct kiln_graph *g, int ci, int bi, bool *done)
{
    *done = false;
    const struct kiln_node *c = &g->nodes[ci], *bn = &g->nodes[bi];
    const kiln_tensor *w = kiln_opt_const(g, c->in[1]);
    const kiln_tensor *b = c->n_in > 2 && c->in[2] >= 0 ? kiln_opt_const(g, c->in[2]) : NULL;
    if (!w || w->dtype != KILN_DTYPE_F32 || w->rank < 3 || w->dims[0] <= 0) return KILN_OK;
    int64_t m = w->dims[0];
    if (c->n_in > 2 && c->in[2] >= 0 &&
        (!b || b->dtype != KILN_DTYPE_F32 || b->rank != 1 || b->dims[0] != m))
        return KILN_OK;
    if (g->values[c->in[0]].type.dtype != KILN_DTYPE_F32) return KILN_OK;
    kiln_tensor *nb, *nw;
    float *s;
    bool ok;
    kiln_status st = fold_begin(g, bn, m, w, &s, &nb, &nw, &ok);
    if (st != KILN_OK || !ok) return st;
    float *bias = nb->data;
    int64_t per = kiln_tensor_count(w) / m;
    float *wd = nw->data;
    for (int64_t o = 0; o < m; o++) {
        for (int64_t i = 0; i < per; i++) wd[o * per + i] *= s[o];
        if (b) bias[o] += ((const float *)b->data)[o] * s[o];
    }
    free(s);
    int wv, bv;
    st = fold_consts(g, c->in[1], nw, nb, &wv, &bv);
    if (st != KILN_OK) return st;

    /* a new Conv with three inputs and the same attributes writes the BN's output */
    int ni;
    st = kiln_opt_add_node(g, KILN_OP_Conv, g->nodes[ci].name, 3, 1, 0, g->nodes[ci].opset, &ni);
    if (st != KILN_OK) return st;
    struct kiln_node *n = &g->nodes[ni];
    c = &g->nodes[ci];
    n->attr = c->attr;
    n->n_attr = c->n_attr;
    kiln_opt_set_input(g, ni, 0, c->in[0]);
    kiln_opt_set_input(g, ni, 1, wv);
    kiln_opt_set_input(g, ni, 2, bv);
    int y = g->nodes[bi].out[0];
    kiln_opt_remove_node(g, bi);
    kiln_opt_remove_node(g, ci);
    kiln_opt_set_output(g, ni, 0, y);
    *done = true;
    return KILN_OK;
}

/* Fold BN node bi into Gemm node gi (output [M, N], BN over N). */
static kiln_status fold_gemm(struct kiln_graph *g, int gi, int bi, bool *done)
{
    *done = false;
    const struct kiln_node *gm = &g->nodes[gi], *bn = &g->nodes[bi];
    const kiln_tensor *w = kiln_opt_const(g, gm->in[1]);
    if (!w || w->dtype != KILN_DTYPE_F32 || w->rank != 2) return KILN_OK;
    if (g->values[gm->in[0]].type.dtype != KILN_DTYPE_F32) return KILN_OK;
    if (g->values[bn->out[0]].type.rank != 2) return KILN_OK;
    int64_t trans_b = kiln_attr_int(gm, "transB", 0);
    float alpha = kiln_attr_float(gm, "alpha", 1.0f), beta = kiln_attr_float(gm, "beta", 1.0f);
    int64_t trans_a = kiln_attr_int(gm, "transA", 0);
    if (kiln_attr_check(gm) != KILN_OK) {
        kiln_error_clear();
        return KILN_OK;
    }
    int64_t n = trans_b ? w->dims[0] : w->dims[1], k = trans_b ? w->dims[1] : w->dims[0];
    if (n <= 0) return KILN_OK;
    const kiln_tensor *c = gm->n_in > 2 && gm->in[2] >= 0 ? kiln_opt_const(g, gm->in[2]) : NULL;
    if (gm->n_in > 2 && gm->in[2] >= 0) {
        if (!c || c->dtype != KILN_DTYPE_F32 || kiln_tensor_count(c) != n ||
            (c->rank == 2 && c->dims[0] != 1) || c->rank > 2 || c->rank < 1)
            return KILN_OK;
    }
    kiln_tensor *nb, *nw;
    float *s;
    bool ok;
    kiln_status st = fold_begin(g, bn, n, w, &s, &nb, &nw, &ok);
    if (st != KILN_OK || !ok) return st;
    float *bias = nb->data;
    float *wd = nw->data;
    for (int64_t o = 0; o < n; o++) {
        for (int64_t i = 0; i < k; i++) {
            if (trans_b) wd[o * k + i] *= s[o];
            else wd[i * n + o] *= s[o];
        }
        if (c) bias[o] += beta * ((const float *)c->data)[o] * s[o];
    }
    free(s);
    int wv, bv;
    st = fold_consts(g, gm->in[1], nw, nb, &wv, &bv);
    if (st != KILN_OK) return st;
    int ni;
    st = kiln_opt_add_node(g, KILN_OP_Gemm, g->nodes[gi].name, 3, 1, 4, g->nodes[gi].opset, &ni);
    if (st != KILN_OK) return st;
    kiln_opt_attr_float(g, ni, 0, "alpha", alpha);
    kiln_opt_attr_float(g, ni, 1, "beta", 1.0f);
    kiln_opt_attr_int(g, ni, 2, "transA", trans_a);
    kiln_opt_attr_int(g, ni, 3, "transB", trans_b);
    kiln_opt_set_input(g, ni, 0, g->nodes[gi].in[0]);
    kiln_opt_set_input(g, ni, 1, wv);
    kiln_opt_set_input(g, ni, 2, bv);
    int y = g->nodes[bi].out[0];
    kiln_opt_remove_node(g, bi);
    kiln_opt_remove_node(g, gi);
    kiln_opt_set_output(g, ni, 0, y);
    *done = true;
    return KILN_OK;
}

/* ---- standalone BatchNormalization (no Conv or Gemm before it) ---- */

/* Conv node ci reads zero padding nowhere: every pad 0 and auto_pad NOTSET or VALID (a
 * padded position would see the BN's shift there, not 0). */
static bool conv_unpadded(const struct kiln_node *c)
{
    const char *ap = kiln_attr_str(c, "auto_pad", "NOTSET");
    const int64_t *pads;
    int np = kiln_attr_ints(c, "pads", &pads);
    bool ok = !strcmp(ap, "NOTSET") || !strcmp(ap, "VALID");
    for (int i = 0; ok && i < np; i++) ok = pads[i] == 0;
    if (kiln_attr_check(c) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    return ok;
}

/* Fold BN node bi into the Conv ci that reads its output (unpadded, constant f32 weights):
 *   W'[m][c'][k] = W[m][c'][k] * s[c],  B'[m] = B[m] + sum over c', k of W[m][c'][k] * shift[c]
 * with c = the input channel c' of m's group. The Conv's output keeps its id. */
static kiln_status fold_into_next(struct kiln_graph *g, int bi, int ci, int64_t C, bool *done)
{
    *done = false;
    const struct kiln_node *c = &g->nodes[ci];
    if (c->n_in < 2 || c->n_out != 1 || !conv_unpadded(c)) return KILN_OK;
    const kiln_tensor *w = kiln_opt_const(g, c->in[1]);
    const kiln_tensor *b = c->n_in > 2 && c->in[2] >= 0 ? kiln_opt_const(g, c->in[2]) : NULL;
    int64_t group = kiln_attr_int(c, "group", 1);
    if (kiln_attr_check(c) != KILN_OK) {
        kiln_error_clear();
        return KILN_OK;
    }
    if (!w || w->dtype != KILN_DTYPE_F32 || w->rank < 3 || group < 1 || w->dims[0] % group ||
        w->dims[1] * group != C)
        return KILN_OK;
    int64_t m = w->dims[0], cg = w->dims[1], per = kiln_tensor_count(w) / (m * cg);
    if (c->n_in > 2 && c->in[2] >= 0 &&
        (!b || b->dtype != KILN_DTYPE_F32 || b->rank != 1 || b->dims[0] != m))
        return KILN_OK;
    float *s = malloc(sizeof(float) * (size_t)C), *shift = malloc(sizeof(float) * (size_t)C);
    kiln_tensor *nw = NULL, *nb = NULL;
    kiln_status st = KILN_OK;
    if (!s || !shift) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory folding a BatchNormalization");
        goto out;
    }
    if (!bn_params(g, &g->nodes[bi], C, s, shift)) goto out;
    if ((st = kiln_tensor_clone(w, &nw)) != KILN_OK) goto out;
    if ((st = kiln_tensor_new(KILN_DTYPE_F32, 1, &m, &nb)) != KILN_OK) goto out;
    float *wd = nw->data, *bd = nb->data;
    const float *w0 = w->data;
    for (int64_t o = 0; o < m; o++) {
        int64_t c0 = o / (m / group) * cg; /* first input channel of o's group */
        double acc = b ? ((const float *)b->data)[o] : 0.0;
        for (int64_t i = 0; i < cg; i++)
            for (int64_t k = 0; k < per; k++) {
                int64_t at = (o * cg + i) * per + k;
                acc += (double)w0[at] * shift[c0 + i];
                wd[at] = w0[at] * s[c0 + i];
            }
        bd[o] = (float)acc;
    }
    int wv, bv;
    st = fold_consts(g, c->in[1], nw, nb, &wv, &bv);
    nw = nb = NULL; /* the graph owns them now (or freed them) */
    if (st != KILN_OK) goto out;
    int ni;
    st = kiln_opt_add_node(g, KILN_OP_Conv, g->nodes[ci].name, 3, 1, 0, g->nodes[ci].opset, &ni);
    if (st != KILN_OK) goto out;
    struct kiln_node *n = &g->nodes[ni];
    n->attr = g->nodes[ci].attr;
    n->n_attr = g->nodes[ci].n_attr;
    kiln_opt_set_input(g, ni, 0, g->nodes[bi].in[0]);
    kiln_opt_set_input(g, ni, 1, wv);
    kiln_opt_set_input(g, ni, 2, bv);
    int y = g->nodes[ci].out[0];
    kiln_opt_remove_node(g, ci);
    kiln_opt_remove_node(g, bi);
    kiln_opt_set_output(g, ni, 0, y);
    *done = true;
out:
    kiln_tensor_free(nw);
    kiln_tensor_free(nb);
    free(s);
    free(shift);
    return st;
}

/* BN node bi as a depthwise 1x1 Conv (group C, W[c] = s[c], B[c] = shift[c]): one
 * per-channel affine pass on oneDNN's depthwise kernels, which the conv fusion then fuses
 * with the activation that follows and the layout pass may block. The BN's output keeps
 * its id. */
static kiln_status bn_as_conv(struct kiln_graph *g, int bi, int64_t C, int rank, bool *done)
{
    *done = false;
    int64_t wd[KILN_MAX_RANK] = {C, 1, 1, 1, 1, 1};
    kiln_tensor *nw = NULL, *nb = NULL;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_F32, rank, wd, &nw);
    if (st == KILN_OK) st = kiln_tensor_new(KILN_DTYPE_F32, 1, &C, &nb);
    if (st != KILN_OK || !bn_params(g, &g->nodes[bi], C, nw->data, nb->data)) {
        kiln_tensor_free(nw);
        kiln_tensor_free(nb);
        return st;
    }
    int wv, bv;
    st = fold_consts(g, g->nodes[bi].in[1], nw, nb, &wv, &bv);
    if (st != KILN_OK) return st;
    int ni;
    st = kiln_opt_add_node(g, KILN_OP_Conv, g->nodes[bi].name, 3, 1, 1, 11, &ni);
    if (st != KILN_OK) return st;
    kiln_opt_attr_int(g, ni, 0, "group", C);
    kiln_opt_set_input(g, ni, 0, g->nodes[bi].in[0]);
    kiln_opt_set_input(g, ni, 1, wv);
    kiln_opt_set_input(g, ni, 2, bv);
    int y = g->nodes[bi].out[0];
    kiln_opt_remove_node(g, bi);
    kiln_opt_set_output(g, ni, 0, y);
    *done = true;
    return KILN_OK;
}

/* Every BatchNormalization left after the folds above: folded into a following unpadded
 * Conv where one reads it alone, else a depthwise 1x1 Conv. Float32 [N, C, spatial...]
 * input, constant parameters, inference mode. */
static kiln_status standalone_bn(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes;
    for (int i = 0; i < n_nodes; i++) {
        const struct kiln_node *bn = &g->nodes[i];
        if (kiln_opt_node_dead(bn) || bn->op != KILN_OP_BatchNormalization) continue;
        if (bn->n_in != 5 || bn->n_out < 1 || bn->in[0] < 0 || bn->out[0] < 0) continue;
        const struct kiln_type *x = &g->values[bn->in[0]].type;
        if (x->dtype != KILN_DTYPE_F32 || x->rank < 3 || x->rank > 5 || x->dims[1] <= 0) continue;
        int64_t C = x->dims[1];
        bool done = false;
        kiln_status st;
        int ci = kiln_opt_single_consumer(g, bn->out[0]);
        if (ci >= 0 && g->nodes[ci].op == KILN_OP_Conv && g->nodes[ci].in[0] == bn->out[0] &&
            !kiln_opt_is_graph_output(g, bn->out[0])) {
            st = fold_into_next(g, i, ci, C, &done);
            if (st != KILN_OK) return st;
            if (done) {
                kiln_opt_count(pl, "BatchNormalization+Conv");
                continue;
            }
        }
        st = bn_as_conv(g, i, C, x->rank, &done);
        if (st != KILN_OK) return st;
        if (done) kiln_opt_count(pl, "BatchNormalization as depthwise Conv");
    }
    return KILN_OK;
}

kiln_status kiln_opt_conv_bn(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes; /* nodes added here are already folded */
    for (int i = 0; i < n_nodes; i++) {
        struct kiln_node *n = &g->nodes[i];
        if (kiln_opt_node_dead(n) || (n->op != KILN_OP_Conv && n->op != KILN_OP_Gemm)) continue;
        if (n->n_out != 1 || n->n_in < 2) continue;
        int bi = kiln_opt_single_consumer(g, n->out[0]);
        if (bi < 0 || g->nodes[bi].op != KILN_OP_BatchNormalization ||
            g->nodes[bi].in[0] != n->out[0])
            continue;
        bool done;
        kiln_status st = n->op == KILN_OP_Conv ? fold_conv(g, i, bi, &done)
                                               : fold_gemm(g, i, bi, &done);
        if (st != KILN_OK) return st;
        if (done)
            kiln_opt_count(pl, g->nodes[i].op == KILN_OP_Conv ? "Conv+BatchNormalization"
                                                              : "Gemm+BatchNormalization");
    }
    return standalone_bn(g, pl);
}
