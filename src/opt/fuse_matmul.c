/*
 * fuse_matmul.c - Gemm, and MatMul + bias Add, with a following residual
 * Add and activation -> KilnFusedMatMul.
 *
 * Gemm (2-D float32, C absent or a constant vector of N) becomes
 * KilnFusedMatMul(A, B, beta * C) with Gemm's alpha / transA / transB. A
 * float32 MatMul of rank >= 2 operands fuses a following Add of a constant
 * [N] or [1, ..., N] bias (the Add's output must keep the MatMul's shape);
 * BERT's 3-D [B, S, K] x [K, N] projections are of this kind. Then, as for
 * Conv, an Add of a value with the output's shape becomes Sum and one
 * activation closes the chain; the last value keeps its id.
 */
#include "core/tensor.h"
#include "kernels/kernel.h"
#include "opt/opt.h"

/* A constant bias for N columns: [N] or [1, ..., 1, N] of rank <= r. */
static bool column_bias(const kiln_tensor *t, int64_t n, int r)
{
    if (!t || t->dtype != KILN_DTYPE_F32 || t->rank < 1 || t->rank > r) return false;
    if (t->dims[t->rank - 1] != n || kiln_tensor_count(t) != n) return false;
    return true;
}

/* A constant vector [N] with bias t scaled by s (ownership to the graph). */
static kiln_status bias_const(struct kiln_graph *g, int v, int64_t n, float s, int *out)
{
    const kiln_tensor *t = kiln_opt_const(g, v);
    if (t->rank == 1 && s == 1.0f) {
        *out = v;
        return KILN_OK;
    }
    kiln_tensor *nb;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_F32, 1, &n, &nb);
    if (st != KILN_OK) return st;
    for (int64_t i = 0; i < n; i++) ((float *)nb->data)[i] = s * ((const float *)t->data)[i];
    return kiln_opt_add_const(g, g->values[v].name, nb, out);
}

kiln_status kiln_opt_fuse_matmul(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes;
    for (int mi = 0; mi < n_nodes; mi++) {
        const struct kiln_node *m = &g->nodes[mi];
        if (kiln_opt_node_dead(m) || (m->op != KILN_OP_MatMul && m->op != KILN_OP_Gemm) ||
            m->n_out != 1 || m->in[0] < 0 || m->in[1] < 0)
            continue;
        bool gemm = m->op == KILN_OP_Gemm;
        int y = m->out[0];
        const struct kiln_type *ty = &g->values[y].type;
        const struct kiln_type *ta = &g->values[m->in[0]].type, *tb = &g->values[m->in[1]].type;
        if (ty->dtype != KILN_DTYPE_F32 || ta->dtype != KILN_DTYPE_F32 ||
            tb->dtype != KILN_DTYPE_F32 || ty->rank < 2 || ta->rank < 2 || tb->rank < 2)
            continue;
        int64_t n = ty->dims[ty->rank - 1];
        float alpha = 1.0f, beta = 1.0f;
        int64_t trans_a = 0, trans_b = 0;
        int bias = -1, sum = -1, cur = y;
        int rm[4], n_rm = 0;
        bool bias_fused = false;
        if (gemm) {
            if (ta->rank != 2 || tb->rank != 2) continue;
            alpha = kiln_attr_float(m, "alpha", 1.0f);
            beta = kiln_attr_float(m, "beta", 1.0f);
            trans_a = kiln_attr_int(m, "transA", 0);
            trans_b = kiln_attr_int(m, "transB", 0);
            if (kiln_attr_check(m) != KILN_OK) {
                kiln_error_clear();
                continue;
            }
            if ((trans_a != 0 && trans_a != 1) || (trans_b != 0 && trans_b != 1)) continue;
            if (m->n_in > 2 && m->in[2] >= 0) {
                if (n <= 0 || !column_bias(kiln_opt_const(g, m->in[2]), n, 2)) continue;
                if (beta != 0.0f) {
                    kiln_status st = bias_const(g, m->in[2], n, beta, &bias);
                    if (st != KILN_OK) return st;
                    m = &g->nodes[mi];
                    bias_fused = true;
                }
            }
        }
        int ai = kiln_opt_single_consumer(g, cur);
        if (!gemm && n > 0 && ai >= 0 && g->nodes[ai].op == KILN_OP_Add) {
            const struct kiln_node *a = &g->nodes[ai];
            int other = a->in[0] == cur ? a->in[1] : a->in[0];
            /* [..., N] + [1.., N] keeps the shape whenever the ranks allow */
            if (column_bias(kiln_opt_const(g, other), n, ty->rank) &&
                g->values[a->out[0]].type.rank == ty->rank) {
                kiln_status st = bias_const(g, other, n, 1.0f, &bias);
                if (st != KILN_OK) return st;
                m = &g->nodes[mi];
                rm[n_rm++] = ai;
                cur = g->nodes[ai].out[0];
                bias_fused = true;
                ai = kiln_opt_single_consumer(g, cur);
            }
        }
        int other = kiln_opt_match_residual(g, ai, cur, ty);
        if (other >= 0) {
            rm[n_rm++] = ai;
            sum = other;
            cur = g->nodes[ai].out[0];
        }
        struct kiln_opt_act act;
        /* an activation keeps its input's shape (kiln_opt_match_act): no check of the
         * types, whose unknown dims the exporter may name differently per value */
        bool has_act = kiln_opt_match_act(g, cur, &act);
        if (has_act) {
            for (int k = 0; k < act.n_nodes; k++) rm[n_rm++] = act.nodes[k];
            cur = act.out;
        }
        if (n_rm == 0 && !gemm) continue;
        if (gemm && m->n_in > 2 && m->in[2] >= 0 && beta == 0.0f) bias = -1;

        int n_in = sum >= 0 ? 4 : bias >= 0 ? 3 : 2;
        int ni;
        kiln_status st = kiln_opt_add_node(g, KILN_OP_KilnFusedMatMul, g->nodes[mi].name, n_in,
                                           1, 6, g->nodes[mi].opset, &ni);
        if (st != KILN_OK) return st;
        m = &g->nodes[mi];
        kiln_opt_attr_int(g, ni, 0, "transA", trans_a);
        kiln_opt_attr_int(g, ni, 1, "transB", trans_b);
        kiln_opt_attr_float(g, ni, 2, "alpha", alpha);
        st = kiln_opt_attr_str(g, ni, 3, "activation", has_act ? act.name : "");
        if (st != KILN_OK) return st;
        kiln_opt_attr_float(g, ni, 4, "act_alpha", has_act ? act.alpha : 0.0f);
        kiln_opt_attr_float(g, ni, 5, "act_beta", has_act ? act.beta : 0.0f);
        kiln_opt_set_input(g, ni, 0, m->in[0]);
        kiln_opt_set_input(g, ni, 1, g->nodes[mi].in[1]);
        if (n_in > 2) kiln_opt_set_input(g, ni, 2, bias);
        if (n_in > 3) kiln_opt_set_input(g, ni, 3, sum);
        for (int k = 0; k < n_rm; k++) kiln_opt_remove_node(g, rm[k]);
        kiln_opt_remove_node(g, mi);
        kiln_opt_set_output(g, ni, 0, cur);
        kiln_opt_count(pl, kiln_opt_fusion_kind(gemm ? "Gemm" : "MatMul", bias_fused, sum >= 0,
                                                has_act ? act.name : ""));
    }
    return KILN_OK;
}
