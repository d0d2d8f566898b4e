/*
 * infer.c - static shape and dtype inference over a graph.
 *
 * Walks nodes in topological order and calls each op's shape function
 * (kernels/kernel.h) with what is known at load time: declared input types
 * and the values of constants. Inferred facts refine declared ones; a
 * declared dtype that contradicts the inferred one is a model error.
 */
#include <string.h>

#include "ir/graph.h"
#include "kernels/kernel.h"

/* Merge inferred type b into declared type a. */
static kiln_status merge_type(const struct kiln_node *n, struct kiln_value *v,
                              const struct kiln_type *b)
{
    struct kiln_type *a = &v->type;
    if (a->dtype != KILN_DTYPE_UNDEFINED && b->dtype != KILN_DTYPE_UNDEFINED &&
        a->dtype != b->dtype)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "output '%s' is declared %s but the node produces %s", v->name,
                               kiln_dtype_name(a->dtype), kiln_dtype_name(b->dtype));
    struct kiln_type r = *b;
    if (r.dtype == KILN_DTYPE_UNDEFINED) r.dtype = a->dtype;
    if (r.rank < 0) {
        r = *a;
        if (r.dtype == KILN_DTYPE_UNDEFINED) r.dtype = b->dtype;
    } else if (a->rank == r.rank) {
        for (int i = 0; i < r.rank; i++) {
            if (r.dims[i] < 0 && a->dims[i] >= 0) r.dims[i] = a->dims[i];
            if (!r.sym[i]) r.sym[i] = a->sym[i];
        }
    }
    *a = r;
    return KILN_OK;
}

/* strict: errors fail the load. Subgraphs are inferred leniently: a branch
 * of an If that would never run for these shapes may not type-check, and
 * that is not an error in the model. */
static kiln_status graph_infer(struct kiln_graph *g, bool strict)
{
    const struct kiln_type *in[KILN_MAX_IO];
    const kiln_tensor *in_value[KILN_MAX_IO];
    struct kiln_type outt[KILN_MAX_IO];
    struct kiln_type *out[KILN_MAX_IO];
    for (int oi = 0; oi < g->n_nodes; oi++) {
        struct kiln_node *n = &g->nodes[g->order ? g->order[oi] : oi];
        /* subgraphs see the current types of what they capture */
        for (int k = 0; k < n->n_attr; k++) {
            struct kiln_graph *sub = n->attr[k].type == KILN_ATTR_GRAPH ? n->attr[k].g : NULL;
            if (!sub) continue;
            for (int v = 0; v < sub->n_values; v++)
                if (sub->values[v].kind == KILN_VALUE_OUTER)
                    sub->values[v].type = g->values[sub->values[v].outer].type;
            kiln_status st = graph_infer(sub, false);
            if (st != KILN_OK)
                return kiln_error_wrap(st, "%s node '%s' attribute '%s'", n->op_type, n->name,
                                       n->attr[k].name);
        }
        const struct kiln_op_impl *impl = kiln_op_impl(n->op);
        if (!impl || !impl->infer) continue;
        for (int k = 0; k < n->n_in; k++) {
            int v = n->in[k];
            in[k] = v >= 0 ? &g->values[v].type : NULL;
            in_value[k] = v >= 0 && g->values[v].kind == KILN_VALUE_CONST ? g->values[v].konst : NULL;
        }
        for (int k = 0; k < n->n_out; k++) {
            kiln_type_unknown(&outt[k]);
            out[k] = n->out[k] >= 0 ? &outt[k] : NULL;
        }
        struct kiln_infer_ctx ctx = {n, n->n_in, in, in_value, n->n_out, out};
        kiln_status st = impl->infer(&ctx);
        {
            kiln_status ast = kiln_attr_check(n); /* a mistyped attribute is the root cause */
            if (ast != KILN_OK) st = ast;
        }
        if (st != KILN_OK) {
            if (strict) return st;
            kiln_error_clear();
            continue;
        }
        for (int k = 0; k < n->n_out; k++) {
            if (n->out[k] < 0) continue;
            st = merge_type(n, &g->values[n->out[k]], &outt[k]);
            if (st != KILN_OK) return st;
        }
    }
    return KILN_OK;
}

kiln_status kiln_graph_infer(struct kiln_graph *g) { return graph_infer(g, true); }
