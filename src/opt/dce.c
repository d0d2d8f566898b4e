/*
 * dce.c - dead-code elimination: nodes none of whose outputs is used (by a
 * node, a subgraph capture or a graph output) are removed, consumers first
 * so that whole dead chains go in one sweep. A write to model state (a
 * STATEFUL op with inputs: TfAssign) stays: its effect is the write.
 */
#include "opt/opt.h"

kiln_status kiln_opt_dce(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    for (int oi = g->n_nodes - 1; oi >= 0; oi--) {
        int ni = g->order ? g->order[oi] : oi;
        struct kiln_node *n = &g->nodes[ni];
        if (kiln_opt_node_dead(n)) continue;
        if ((kiln_op_info(n->op)->flags & KILN_OPF_STATEFUL) && n->n_in > 0) continue;
        bool used = false;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] >= 0 && g->values[n->out[k]].uses > 0) used = true;
        if (used) continue;
        kiln_opt_remove_node(g, ni);
        kiln_opt_count(pl, "dead node");
    }
    return KILN_OK;
}
