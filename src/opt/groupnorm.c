/*
 * groupnorm.c - GroupNorm as exporters write it -> one GroupNormalization node.
 *
 * PyTorch (and exporters following it) write torch.nn.GroupNorm of X [N, C, ...] as
 *
 *     R = Reshape(X, [0 | N, G, -1])
 *     I = InstanceNormalization(R, ones[G], zeros[G], epsilon)
 *     Z = Reshape(I, Shape(X))          (or X's dims as a constant)
 *     Y = Add(Mul(Z, gamma), beta)      (gamma, beta per channel: [C, 1, 1] or [1, C, 1, 1])
 *
 * The two Reshapes hide the channels from the layout pass (a convolution network's
 * channel-blocked values turn plain there, with a reorder on each side of every GroupNorm),
 * and the affine costs two more passes over the tensor. This pass writes one
 * GroupNormalization (opset 21: scale and bias per channel) of X instead, which the layout
 * pass keeps blocked (src/kernels/simd/norm.c). The InstanceNormalization's own scale and
 * bias (per group) fold in: scale_c = s_g * gamma_c, bias_c = b_g * gamma_c + beta_c,
 * which are gamma and beta exactly when s = 1 and b = 0 (what exporters write). The Mul and
 * the Add are optional (affine=False); each intermediate value must have no other reader.
 */
#include <string.h>

#include "core/tensor.h"
#include "kernels/kernel.h"
#include "opt/opt.h"

/* Entries of a constant 1-D int64 / int32 tensor (at most cap), else -1. */
static int const_ints(const struct kiln_graph *g, int v, int64_t *out, int cap)
{
    const kiln_tensor *t = kiln_opt_const(g, v);
    if (!t || t->rank != 1 || t->dims[0] > cap ||
        (t->dtype != KILN_DTYPE_I64 && t->dtype != KILN_DTYPE_I32))
        return -1;
    for (int64_t i = 0; i < t->dims[0]; i++)
        out[i] = t->dtype == KILN_DTYPE_I64 ? ((const int64_t *)t->data)[i]
                                            : ((const int32_t *)t->data)[i];
    return (int)t->dims[0];
}

/* A float32 constant of n elements, else NULL. */
static const float *const_floats(const struct kiln_graph *g, int v, int64_t n)
{
    const kiln_tensor *t = kiln_opt_const(g, v);
    if (!t || t->dtype != KILN_DTYPE_F32 || kiln_shape_count(t->rank, t->dims) != n) return NULL;
    return t->data;
}

/* A float32 constant of x's C entries laid along x's axis 1 when broadcast against x
 * (right-aligned: [C, 1, ...] or [1, C, 1, ...]), else NULL. */
static const float *per_channel(const struct kiln_graph *g, int v, const struct kiln_type *x)
{
    const kiln_tensor *t = kiln_opt_const(g, v);
    if (!t || t->dtype != KILN_DTYPE_F32 || t->rank > x->rank || t->rank < x->rank - 1)
        return NULL;
    int off = x->rank - t->rank; /* x's axis of t's dim 0 */
    for (int d = 0; d < t->rank; d++)
        if (t->dims[d] != (d + off == 1 ? x->dims[1] : 1)) return NULL;
    return t->data;
}

/* Does value s hold x's shape at run time: Shape(x) (whole), or a constant of x's dims? */
static bool shape_of(const struct kiln_graph *g, int s, int x)
{
    const struct kiln_type *t = &g->values[x].type;
    int p = kiln_opt_producer(g, s);
    if (p >= 0) {
        const struct kiln_node *n = &g->nodes[p];
        return n->op == KILN_OP_Shape && n->n_in == 1 && n->in[0] == x &&
               !kiln_node_attr(n, "start") && !kiln_node_attr(n, "end");
    }
    int64_t d[KILN_MAX_RANK];
    if (const_ints(g, s, d, KILN_MAX_RANK) != t->rank) return false;
    for (int i = 0; i < t->rank; i++)
        if (t->dims[i] < 0 || d[i] != t->dims[i]) return false;
    return true;
}

/* The Mul or Add reading only value v with a per-channel constant: its index and the
 * constant, else -1. */
static int affine_step(const struct kiln_graph *g, int v, enum kiln_op op,
                       const struct kiln_type *x, const float **k)
{
    int ni = kiln_opt_single_consumer(g, v);
    if (ni < 0) return -1;
    const struct kiln_node *n = &g->nodes[ni];
    if (n->op != op || n->n_in != 2 || n->n_out != 1 || n->opset < 7) return -1;
    int other = n->in[0] == v ? n->in[1] : n->in[1] == v ? n->in[0] : -1;
    if (other < 0 || !(*k = per_channel(g, other, x))) return -1;
    return ni;
}

/* Per-channel scale and bias constants of C channels in G groups: the group's s and b (per
 * group), times gamma and plus beta (per channel; NULL: 1 and 0). */
static kiln_status channel_consts(struct kiln_graph *g, int64_t C, int64_t G, const float *s,
                                  const float *b, const float *gamma, const float *beta, int *sv,
                                  int *bv)
{
    kiln_tensor *sc = NULL, *bi = NULL;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_F32, 1, &C, &sc);
    if (st == KILN_OK) st = kiln_tensor_new(KILN_DTYPE_F32, 1, &C, &bi);
    if (st != KILN_OK) {
        kiln_tensor_free(sc);
        return st;
    }
    for (int64_t c = 0; c < C; c++) {
        int64_t gi = c / (C / G);
        float ga = gamma ? gamma[c] : 1.0f;
        ((float *)sc->data)[c] = s[gi] * ga;
        ((float *)bi->data)[c] = b[gi] * ga + (beta ? beta[c] : 0.0f);
    }
    st = kiln_opt_add_const(g, "groupnorm_scale", sc, sv);
    if (st == KILN_OK) st = kiln_opt_add_const(g, "groupnorm_bias", bi, bv);
    else kiln_tensor_free(bi);
    return st;
}

/* Activations the fused kernels apply (both map 0 to 0, so blocked padding lanes stay 0). */
static bool act_taken(const struct kiln_opt_act *a)
{
    return !strcmp(a->name, "SiLU") || !strcmp(a->name, "Relu");
}

/* Write the normalization of x (scale sv, bias bv per channel) into value y, the nodes
 * rm[0..n_rm) (-1: none) that computed it before removed once the new node is in place: a GroupNormalization (opset 21), or,
 * where a SiLU or Relu alone reads y, a KilnGroupNorm with it that writes the activation's
 * output instead. kind (may be NULL) is counted in the log. */
static kiln_status emit(struct kiln_graph *g, struct kiln_opt_pass_log *pl, const char *name,
                        int x, int sv, int bv, int64_t G, float eps, int y, const int *rm,
                        int n_rm, const char *kind)
{
    struct kiln_opt_act a;
    bool fuse = kiln_opt_match_act(g, y, &a) && act_taken(&a);
    int ni;
    kiln_status st = kiln_opt_add_node(g, fuse ? KILN_OP_KilnGroupNorm : KILN_OP_GroupNormalization,
                                       name, 3, 1, fuse ? 3 : 2, 21, &ni);
    if (st != KILN_OK) return st;
    kiln_opt_attr_int(g, ni, 0, "num_groups", G);
    kiln_opt_attr_float(g, ni, 1, "epsilon", eps);
    if (fuse && (st = kiln_opt_attr_str(g, ni, 2, "activation", a.name)) != KILN_OK) {
        kiln_opt_remove_node(g, ni); /* nothing else changed yet */
        return st;
    }
    kiln_opt_set_input(g, ni, 0, x);
    kiln_opt_set_input(g, ni, 1, sv);
    kiln_opt_set_input(g, ni, 2, bv);
    for (int k = n_rm - 1; k >= 0; k--)
        if (rm[k] >= 0) kiln_opt_remove_node(g, rm[k]);
    if (fuse) {
        for (int k = a.n_nodes - 1; k >= 0; k--) kiln_opt_remove_node(g, a.nodes[k]);
        y = a.out;
        kiln_opt_count(pl, !strcmp(a.name, "SiLU") ? "KilnGroupNorm+SiLU" : "KilnGroupNorm+Relu");
    }
    kiln_opt_set_output(g, ni, 0, y);
    if (kind) kiln_opt_count(pl, kind);
    return KILN_OK;
}

kiln_status kiln_opt_groupnorm(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes;
    for (int ii = 0; ii < n_nodes; ii++) {
        const struct kiln_node *in = &g->nodes[ii];
        if (kiln_opt_node_dead(in) || in->op != KILN_OP_InstanceNormalization || in->n_in != 3 ||
            in->n_out != 1)
            continue;
        int r = in->in[0], ri = kiln_opt_producer(g, r);
        if (ri < 0 || kiln_opt_single_consumer(g, r) != ii) continue;
        const struct kiln_node *rn = &g->nodes[ri];
        if (rn->op != KILN_OP_Reshape || rn->n_in != 2 || rn->opset < 5) continue;
        int x = rn->in[0];
        const struct kiln_type *xt = &g->values[x].type;
        if (xt->dtype != KILN_DTYPE_F32 || xt->rank < 3 || xt->dims[1] <= 0) continue;
        int64_t C = xt->dims[1], sp = 1, rs[4];
        for (int d = 2; d < xt->rank; d++) sp = xt->dims[d] > 0 && sp > 0 ? sp * xt->dims[d] : -1;
        if (const_ints(g, rn->in[1], rs, 4) != 3) continue;
        int64_t G = rs[1];
        if (G <= 0 || C % G != 0) continue;
        bool zero_ok = kiln_attr_int(rn, "allowzero", 0) == 0;
        if (!((rs[0] == 0 && zero_ok) || (rs[0] > 0 && rs[0] == xt->dims[0]))) continue;
        if (!(rs[2] == -1 || (sp > 0 && rs[2] == C / G * sp))) continue;
        const float *s = const_floats(g, in->in[1], G), *b = const_floats(g, in->in[2], G);
        if (!s || !b) continue;
        /* the Reshape back to X's shape */
        int z = in->out[0], zi = kiln_opt_single_consumer(g, z);
        if (zi < 0) continue;
        const struct kiln_node *zn = &g->nodes[zi];
        if (zn->op != KILN_OP_Reshape || zn->n_in != 2 || zn->in[0] != z ||
            !shape_of(g, zn->in[1], x))
            continue;
        int y = zn->out[0];
        const float *gamma = NULL, *beta = NULL;
        int mi = affine_step(g, y, KILN_OP_Mul, xt, &gamma), ai = -1;
        if (mi >= 0) y = g->nodes[mi].out[0];
        ai = affine_step(g, y, KILN_OP_Add, xt, &beta);
        if (ai >= 0) y = g->nodes[ai].out[0];
        float eps = kiln_attr_float(in, "epsilon", 1e-5f);
        int sv, bv, rm[5] = {ri, ii, zi, mi, ai};
        kiln_status st = channel_consts(g, C, G, s, b, gamma, beta, &sv, &bv);
        if (st == KILN_OK)
            st = emit(g, pl, g->nodes[ii].name, x, sv, bv, G, eps, y, rm, 5,
                      mi >= 0 || ai >= 0 ? "GroupNormalization(+affine)" : "GroupNormalization");
        if (st != KILN_OK) return st;
    }
    /* GroupNormalization as the model wrote it (opset 18: per group, 21: per channel), then
     * SiLU or Relu */
    n_nodes = g->n_nodes;
    for (int i = 0; i < n_nodes; i++) {
        const struct kiln_node *n = &g->nodes[i];
        if (kiln_opt_node_dead(n) || n->op != KILN_OP_GroupNormalization || n->n_in != 3 ||
            n->n_out != 1 || !kiln_node_attr(n, "num_groups"))
            continue;
        const struct kiln_type *xt = &g->values[n->in[0]].type;
        int64_t G = kiln_attr_int(n, "num_groups", 0), C = xt->rank >= 3 ? xt->dims[1] : -1;
        struct kiln_opt_act a;
        if (xt->dtype != KILN_DTYPE_F32 || C <= 0 || G <= 0 || C % G ||
            !kiln_opt_match_act(g, n->out[0], &a) || !act_taken(&a))
            continue;
        int sv = n->in[1], bv = n->in[2];
        if (n->opset < 21) { /* per group: constants made per channel */
            const float *s = const_floats(g, sv, G), *b = const_floats(g, bv, G);
            if (!s || !b) continue;
            kiln_status st = channel_consts(g, C, G, s, b, NULL, NULL, &sv, &bv);
            if (st != KILN_OK) return st;
            n = &g->nodes[i];
        } else if (kiln_shape_count(g->values[sv].type.rank, g->values[sv].type.dims) != C ||
                   kiln_shape_count(g->values[bv].type.rank, g->values[bv].type.dims) != C) {
            continue;
        }
        float eps = kiln_attr_float(n, "epsilon", 1e-5f);
        int x = n->in[0], y = n->out[0];
        kiln_status st = emit(g, pl, g->nodes[i].name, x, sv, bv, G, eps, y, &i, 1, NULL);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}
