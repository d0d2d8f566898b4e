/*
 * silu.c - x * Sigmoid(x) -> Swish (opset 24; alpha 1), wherever x comes from.
 *
 * conv_fusion and matmul_fusion take a SiLU that follows a convolution or a
 * product into the fused node. What is left follows something else: a
 * normalization (GroupNorm's affine in diffusion UNets, LayerNorm in gated
 * MLPs), an Add, a Resize. Two passes over the tensor and a Mul node become
 * one pass: the Sigmoid's output stays in registers. The Mul may take its
 * operands in either order; the Sigmoid's output must have no other reader
 * (else it is computed anyway). Runs after qlut_fusion, which turns
 * DequantizeLinear -> Sigmoid -> Mul into an 8-bit table first.
 */
#include "kernels/kernel.h"
#include "opt/opt.h"

kiln_status kiln_opt_silu(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes;
    for (int i = 0; i < n_nodes; i++) {
        const struct kiln_node *s = &g->nodes[i];
        if (kiln_opt_node_dead(s) || s->op != KILN_OP_Sigmoid || s->n_in != 1 || s->n_out != 1)
            continue;
        int x = s->in[0], t = s->out[0];
        if (x < 0 || g->values[x].type.dtype != KILN_DTYPE_F32 || kiln_opt_is_graph_output(g, t))
            continue;
        int mi = kiln_opt_single_consumer(g, t);
        if (mi < 0) continue;
        const struct kiln_node *m = &g->nodes[mi];
        if (m->op != KILN_OP_Mul || m->n_in != 2 || m->n_out != 1 ||
            !((m->in[0] == x && m->in[1] == t) || (m->in[0] == t && m->in[1] == x)))
            continue;
        int y = m->out[0]; /* x's shape: Sigmoid keeps it, and so does a Mul of two equals */
        int ni;
        kiln_status st = kiln_opt_add_node(g, KILN_OP_Swish, m->name, 1, 1, 0, 24, &ni);
        if (st != KILN_OK) return st;
        kiln_opt_set_input(g, ni, 0, x);
        kiln_opt_remove_node(g, i);
        kiln_opt_remove_node(g, mi);
        kiln_opt_set_output(g, ni, 0, y);
        kiln_opt_count(pl, "Swish(SiLU)");
    }
    return KILN_OK;
}
