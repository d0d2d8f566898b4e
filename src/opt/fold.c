/*
 * fold.c - constant folding.
 *
 * A node whose inputs are all constants runs once, now, through its
 * reference kernel (kiln_op_impl), and its outputs become graph-owned
 * constants. Skipped: ops with subgraphs or data-dependent outputs
 * (SUBGRAPH, DYNOUT), ops on model state (STATEFUL: a variable read has no
 * inputs, so it would otherwise freeze the value the variable has at
 * load), outputs over FOLD_MAX_BYTES, nodes writing a graph
 * output, and any node whose kernel fails (the error is cleared; the node
 * then fails at run time as it would have). Shape of a value whose static
 * type is concrete folds too, and so does Gather of a Shape when the
 * gathered dims are concrete (the sequence length of a BERT whose batch
 * is symbolic).
 */
#include <stdlib.h>

#include "core/tensor.h"
#include "import/model.h"
#include "kernels/kernel.h"
#include "exec/exec.h"
#include "opt/opt.h"

#define FOLD_MAX_BYTES ((int64_t)64 << 20)

/* Turn output k of node ni into constant t (owned by the graph from here on). */
static kiln_status make_const(struct kiln_graph *g, int v, kiln_tensor *t)
{
    kiln_status st = kiln_graph_own_tensor(g, t);
    if (st != KILN_OK) return st;
    struct kiln_value *val = &g->values[v];
    val->kind = KILN_VALUE_CONST;
    val->konst = t;
    val->producer = -1;
    kiln_type_from_tensor(&val->type, t);
    return KILN_OK;
}

/* Replace node ni (one output) by constant t. */
static kiln_status fold_to(struct kiln_graph *g, int ni, kiln_tensor *t)
{
    int v = g->nodes[ni].out[0];
    g->nodes[ni].out[0] = -1;
    kiln_opt_remove_node(g, ni);
    return make_const(g, v, t);
}

/* Run node ni on its constant inputs; on success its outputs become constants
 * (kiln_opt_fold_node in opt.h). */
kiln_status kiln_opt_fold_node(struct kiln_graph *g, int ni, bool *folded)
{
    struct kiln_node *n = &g->nodes[ni];
    *folded = false;
    if (n->n_out > KILN_MAX_IO || n->n_in > KILN_MAX_IO) return KILN_OK;
    kiln_tensor *in[KILN_MAX_IO];
    kiln_tensor *out[KILN_MAX_IO];
    for (int k = 0; k < n->n_in; k++) in[k] = n->in[k] >= 0 ? g->values[n->in[k]].konst : NULL;
    kiln_status st = kiln_exec_node(n, in, out, NULL, FOLD_MAX_BYTES);
    int64_t total = 0;
    for (int k = 0; k < n->n_out && st == KILN_OK; k++) {
        total += (int64_t)out[k]->nbytes;
        if (out[k]->dtype == KILN_DTYPE_STRING || total > FOLD_MAX_BYTES) st = KILN_ERR_UNSUPPORTED;
    }
    if (st != KILN_OK) {
        for (int k = 0; k < n->n_out; k++) kiln_tensor_free(out[k]);
        kiln_error_clear();
        return KILN_OK; /* not folded; the node fails at run time if it must */
    }
    int outs[KILN_MAX_IO];
    for (int k = 0; k < n->n_out; k++) {
        outs[k] = n->out[k];
        n->out[k] = -1;
    }
    int n_out = n->n_out;
    kiln_opt_remove_node(g, ni);
    st = KILN_OK;
    for (int k = 0; k < n_out; k++) {
        if (outs[k] < 0 || st != KILN_OK) {
            kiln_tensor_free(out[k]);
            continue;
        }
        st = make_const(g, outs[k], out[k]);
    }
    if (st == KILN_OK) *folded = true;
    return st;
}

/* Shape of a value with a concrete static type: the dims, as Shape's start/end select. */
static kiln_status fold_shape(struct kiln_graph *g, int ni, bool *folded)
{
    struct kiln_node *n = &g->nodes[ni];
    const struct kiln_type *t = &g->values[n->in[0]].type;
    *folded = false;
    if (t->rank < 0) return KILN_OK;
    int64_t r = t->rank;
    int64_t start = kiln_attr_int(n, "start", 0), end = kiln_attr_int(n, "end", r);
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return KILN_OK;
    }
    if (start < 0) start += r;
    if (end < 0) end += r;
    start = start < 0 ? 0 : start > r ? r : start;
    end = end < 0 ? 0 : end > r ? r : end;
    int64_t len = end > start ? end - start : 0;
    for (int64_t i = start; i < start + len; i++)
        if (t->dims[i] < 0) return KILN_OK;
    kiln_tensor *s;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_I64, 1, &len, &s);
    if (st != KILN_OK) return st;
    for (int64_t i = 0; i < len; i++) ((int64_t *)s->data)[i] = t->dims[start + i];
    *folded = true;
    return fold_to(g, ni, s);
}

/* Gather(Shape(x), const indices) on axis 0 where the gathered dims of x are known. */
static kiln_status fold_gather_shape(struct kiln_graph *g, int ni, bool *folded)
{
    struct kiln_node *n = &g->nodes[ni];
    *folded = false;
    int p = kiln_opt_producer(g, n->in[0]);
    const kiln_tensor *idx = kiln_opt_const(g, n->in[1]);
    if (p < 0 || !idx || g->nodes[p].op != KILN_OP_Shape || !kiln_dtype_is_int(idx->dtype) ||
        idx->rank > 1 || kiln_attr_int(n, "axis", 0) != 0)
        return KILN_OK;
    const struct kiln_node *sn = &g->nodes[p];
    if (kiln_node_attr(sn, "start") || kiln_node_attr(sn, "end")) return KILN_OK;
    const struct kiln_type *t = &g->values[sn->in[0]].type;
    if (t->rank < 0) return KILN_OK;
    int64_t cnt = kiln_tensor_count(idx);
    for (int64_t i = 0; i < cnt; i++) {
        int64_t d = kiln_tensor_i64(idx, i);
        if (d < 0) d += t->rank;
        if (d < 0 || d >= t->rank || t->dims[d] < 0) return KILN_OK;
    }
    kiln_tensor *s;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_I64, idx->rank, idx->dims, &s);
    if (st != KILN_OK) return st;
    for (int64_t i = 0; i < cnt; i++) {
        int64_t d = kiln_tensor_i64(idx, i);
        ((int64_t *)s->data)[i] = t->dims[d < 0 ? d + t->rank : d];
    }
    *folded = true;
    return fold_to(g, ni, s);
}

static kiln_status fold_sweep(struct kiln_graph *g, struct kiln_opt_pass_log *pl, int *n_folded)
{
    int n_order = g->n_nodes;
    int *order = malloc(sizeof(int) * (size_t)(n_order + 1));
    if (!order) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "constant folding: out of memory");
    for (int i = 0; i < n_order; i++) order[i] = g->order ? g->order[i] : i;
    kiln_status st = KILN_OK;
    for (int oi = 0; oi < n_order && st == KILN_OK; oi++) {
        int ni = order[oi];
        struct kiln_node *n = &g->nodes[ni];
        if (kiln_opt_node_dead(n)) continue;
        unsigned flags = kiln_op_info(n->op)->flags;
        if (flags & (KILN_OPF_SUBGRAPH | KILN_OPF_DYNOUT | KILN_OPF_STATEFUL)) continue;
        bool writes_output = false;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] >= 0 && kiln_opt_is_graph_output(g, n->out[k])) writes_output = true;
        if (writes_output) continue;
        bool all_const = true;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] >= 0 && g->values[n->in[k]].kind != KILN_VALUE_CONST) all_const = false;
        bool folded = false;
        const char *kind = kiln_op_name(n->op);
        if (all_const) st = kiln_opt_fold_node(g, ni, &folded);
        else if (n->op == KILN_OP_Shape && n->n_out == 1) st = fold_shape(g, ni, &folded);
        else if (n->op == KILN_OP_Gather && n->n_in == 2) {
            st = fold_gather_shape(g, ni, &folded);
            kind = "Gather(Shape)";
        }
        if (folded) {
            kiln_opt_count(pl, kind);
            (*n_folded)++;
        }
    }
    free(order);
    return st;
}

kiln_status kiln_opt_fold(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    /* folding makes shapes known, which lets more Shape / Gather(Shape) fold */
    for (int round = 0; round < 8; round++) {
        int n = 0;
        kiln_status st = fold_sweep(g, pl, &n);
        if (st == KILN_OK && n) st = kiln_opt_compact(g);
        if (st == KILN_OK && n) st = kiln_graph_infer(g);
        if (st != KILN_OK || n == 0) return st;
    }
    return KILN_OK;
}
