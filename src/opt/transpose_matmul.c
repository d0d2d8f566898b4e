/*
 * transpose_matmul.c - the transpose_matmul pass: a float32 product that
 * reads a Transpose reads the Transpose's input instead, through strides
 * (KilnMatMulT, opt.h), so the transposed copy is never written.
 *
 * An attention the attention_fusion pass does not recognize still runs its
 * steps: Q, K and V reshaped to [B,S,H,D] and transposed to [B,H,S,D] (K to
 * [B,H,D,S]) before Q K^T and P V. Each of those Transposes is a full copy
 * of its value; oneDNN's matmul reads the untransposed values as they are
 * (batch dims of any stride; dnnl/matmul_t.c). Taken for MatMul, and for a
 * KilnFusedMatMul with no bias, residual, activation or transposes (a
 * scale folded into alpha stays), whose operands are float32 of one rank
 * (>= 2) where at least one is a Transpose's output; the Transpose goes
 * once nothing else reads it (dead code elimination). Runs after
 * attention_fusion (which reads the MatMuls it recognizes) and
 * matmul_fusion (which folds the scale).
 */
#include "kernels/kernel.h"
#include "opt/opt.h"

static bool tm_f32_rank(const struct kiln_graph *g, int v, int r)
{
    const struct kiln_type *t = &g->values[v].type;
    return t->dtype == KILN_DTYPE_F32 && t->rank == r;
}

/* Whether product node m is one this pass rewrites (besides its inputs). */
static bool tm_product(const struct kiln_node *m, float *alpha)
{
    *alpha = 1.0f;
    if (m->n_out != 1 || m->n_in < 2) return false;
    if (m->op == KILN_OP_MatMul) return m->n_in == 2;
    if (m->op != KILN_OP_KilnFusedMatMul || m->n_in != 2) return false;
    const char *act = kiln_attr_str(m, "activation", "");
    bool ok = act[0] == 0 && kiln_attr_int(m, "transA", 0) == 0 &&
              kiln_attr_int(m, "transB", 0) == 0;
    *alpha = kiln_attr_float(m, "alpha", 1.0f);
    if (kiln_attr_check(m) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    return ok;
}

kiln_status kiln_opt_transpose_matmul(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes;
    for (int mi = 0; mi < n_nodes; mi++) {
        const struct kiln_node *m = &g->nodes[mi];
        float alpha;
        if (kiln_opt_node_dead(m) || !tm_product(m, &alpha) || m->in[0] < 0 || m->in[1] < 0)
            continue;
        int r = g->values[m->in[0]].type.rank;
        if (r < 2 || r > KILN_MAX_RANK || !tm_f32_rank(g, m->in[0], r) ||
            !tm_f32_rank(g, m->in[1], r) || !tm_f32_rank(g, m->out[0], r))
            continue;
        int src[2] = {m->in[0], m->in[1]};
        int64_t perm[2][KILN_MAX_RANK];
        bool folded[2] = {false, false};
        for (int k = 0; k < 2; k++) {
            int ti = kiln_opt_producer(g, m->in[k]);
            if (ti < 0 || g->nodes[ti].op != KILN_OP_Transpose || g->nodes[ti].n_in < 1) continue;
            int x = g->nodes[ti].in[0];
            if (x < 0 || !tm_f32_rank(g, x, r) || !kiln_opt_transpose_perm(&g->nodes[ti], r, perm[k])) continue;
            src[k] = x;
            folded[k] = true;
        }
        if (!folded[0] && !folded[1]) continue;
        int ni;
        kiln_status st = kiln_opt_add_node(g, KILN_OP_KilnMatMulT, g->nodes[mi].name, 2, 1, 1,
                                           g->nodes[mi].opset, &ni);
        if (st != KILN_OK) return st;
        kiln_opt_attr_float(g, ni, 0, "alpha", alpha);
        if (folded[0]) st = kiln_opt_set_ints(g, ni, "permA", perm[0], r);
        if (st == KILN_OK && folded[1]) st = kiln_opt_set_ints(g, ni, "permB", perm[1], r);
        if (st != KILN_OK) return st;
        int out = g->nodes[mi].out[0];
        kiln_opt_set_input(g, ni, 0, src[0]);
        kiln_opt_set_input(g, ni, 1, src[1]);
        kiln_opt_remove_node(g, mi);
        kiln_opt_set_output(g, ni, 0, out);
        kiln_opt_count(pl, folded[0] && folded[1] ? "Transpose+Transpose+MatMul"
                                                  : "Transpose+MatMul");
    }
    return KILN_OK;
}
