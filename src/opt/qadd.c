/*
 * qadd.c - the qadd_fusion pass: in a static int8 graph, the residual Add
 * between quantized convolutions, Q(Relu(DQ(a) + DQ(b))) (Relu optional),
 * becomes one KilnQLinearAdd of the 8-bit a and b (reference kernel
 * src/kernels/ref/qlinear_add.c, fast kernel src/kernels/simd/quant8.c):
 * one pass over 8-bit data instead of five over float32, with the same
 * float32 arithmetic, so the result is bit for bit that of the nodes it
 * replaces.
 *
 * Also Q(MaxPool(DQ(a))) whose Q and DQ have the same scale and zero point
 * becomes MaxPool(a) on the 8-bit values (exact: DQ is increasing and
 * Q(DQ(v)) = v), which oneDNN pools as bytes (src/kernels/dnnl/pool.c).
 *
 * Taken: DequantizeLinear / QuantizeLinear with one constant float32 scale
 * and one constant 8-bit zero point (the Q's present, or a uint8 a), no
 * block_size / precision / saturate changes; an Add (opset 7+) of two
 * float32 values of the same static shape as its output; each intermediate
 * value read only by the next node and not a graph output.
 */
#include <string.h>

#include "core/tensor.h"
#include "kernels/kernel.h"
#include "opt/opt.h"

/* A node input that is absent, or a constant with one element of dtype d (0: any). */
static bool one_const(const struct kiln_graph *g, const struct kiln_node *n, int i, int d, bool need)
{
    if (i >= n->n_in || n->in[i] < 0) return !need;
    const kiln_tensor *t = kiln_opt_const(g, n->in[i]);
    return t && kiln_tensor_count(t) == 1 && t->rank <= 1 && (!d || (int)t->dtype == d);
}

static bool q8(kiln_dtype d) { return d == KILN_DTYPE_U8 || d == KILN_DTYPE_I8; }

/* A per-tensor Q or DQ node (q: QuantizeLinear) whose 8-bit side has dtype *dt. */
static bool per_tensor(const struct kiln_graph *g, const struct kiln_node *n, bool q)
{
    if (n->op != (q ? KILN_OP_QuantizeLinear : KILN_OP_DequantizeLinear) || n->n_out != 1 ||
        n->n_in < 2 || n->in[0] < 0 || n->out[0] < 0)
        return false;
    const struct kiln_type *x = &g->values[n->in[0]].type, *y = &g->values[n->out[0]].type;
    const struct kiln_type *i8 = q ? y : x, *f = q ? x : y;
    if (!q8(i8->dtype) || f->dtype != KILN_DTYPE_F32) return false;
    int64_t prec = kiln_attr_int(n, "precision", 0), sat = kiln_attr_int(n, "saturate", 1);
    int64_t block = kiln_attr_int(n, "block_size", 0);
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    if ((prec != 0 && prec != 1) || sat != 1 || block != 0) return false;
    return one_const(g, n, 1, KILN_DTYPE_F32, true) && one_const(g, n, 2, (int)i8->dtype, false);
}

/* The DequantizeLinear producing v, read only by its consumer; -1 if not one. */
static int dq_of(const struct kiln_graph *g, int v, int consumer)
{
    int p = kiln_opt_producer(g, v);
    if (p < 0 || kiln_opt_single_consumer(g, v) != consumer) return -1;
    return per_tensor(g, &g->nodes[p], false) ? p : -1;
}

/* Whether the Q or DQ nodes p and q have the same constant scale and zero point. */
static bool same_params(const struct kiln_graph *g, const struct kiln_node *p,
                        const struct kiln_node *q)
{
    for (int i = 1; i < 3; i++) {
        int a = i < p->n_in ? p->in[i] : -1, b = i < q->n_in ? q->in[i] : -1;
        if (a < 0 || b < 0) {
            if (a != b) return false;
            continue;
        }
        const kiln_tensor *ta = kiln_opt_const(g, a), *tb = kiln_opt_const(g, b);
        if (!ta || !tb || ta->dtype != tb->dtype || ta->nbytes != tb->nbytes ||
            memcmp(ta->data, tb->data, ta->nbytes))
            return false;
    }
    return true;
}

/* Q(MaxPool(DQ(a))) with the same parameters on both sides -> MaxPool(a) on the 8-bit
 * values: exact, as DQ is increasing and Q(DQ(v)) = v. */
static void maxpool_8bit(struct kiln_graph *g, int qi, struct kiln_opt_pass_log *pl)
{
    const struct kiln_node *q = &g->nodes[qi];
    int pi = kiln_opt_producer(g, q->in[0]);
    if (pi < 0 || kiln_opt_single_consumer(g, q->in[0]) != qi) return;
    const struct kiln_node *mp = &g->nodes[pi];
    if (mp->op != KILN_OP_MaxPool || mp->n_in != 1 || (mp->n_out > 1 && mp->out[1] >= 0)) return;
    int dq = dq_of(g, mp->in[0], pi);
    if (dq < 0 || !same_params(g, &g->nodes[dq], q)) return;
    int a = g->nodes[dq].in[0], y = q->out[0];
    if (g->values[a].type.dtype != g->values[y].type.dtype) return;
    kiln_opt_set_input(g, pi, 0, a);
    kiln_opt_remove_node(g, qi);
    kiln_opt_remove_node(g, dq);
    kiln_opt_set_output(g, pi, 0, y);
    if (pl) kiln_opt_count(pl, "8-bit MaxPool (DQ, Q removed)");
}

kiln_status kiln_opt_qadd(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes;
    for (int qi = 0; qi < n_nodes; qi++)
        if (!kiln_opt_node_dead(&g->nodes[qi]) && per_tensor(g, &g->nodes[qi], true))
            maxpool_8bit(g, qi, pl);
    for (int qi = 0; qi < n_nodes; qi++) {
        const struct kiln_node *q = &g->nodes[qi];
        if (kiln_opt_node_dead(q) || !per_tensor(g, q, true)) continue;
        int prev = kiln_opt_producer(g, q->in[0]);
        if (prev < 0 || kiln_opt_single_consumer(g, q->in[0]) != qi) continue;
        int relu = -1, ai = prev;
        if (g->nodes[prev].op == KILN_OP_Relu && g->nodes[prev].n_in == 1) {
            relu = prev;
            ai = kiln_opt_producer(g, g->nodes[prev].in[0]);
            if (ai < 0 || kiln_opt_single_consumer(g, g->nodes[prev].in[0]) != relu) continue;
        }
        const struct kiln_node *add = &g->nodes[ai];
        if (add->op != KILN_OP_Add || add->opset < 7 || add->n_in != 2 || add->n_out != 1 ||
            add->in[0] < 0 || add->in[1] < 0)
            continue;
        const struct kiln_type *ty = &g->values[add->out[0]].type;
        if (ty->rank < 0 || !kiln_opt_same_shape(&g->values[add->in[0]].type, ty) ||
            !kiln_opt_same_shape(&g->values[add->in[1]].type, ty))
            continue;
        int da = dq_of(g, add->in[0], ai), db = dq_of(g, add->in[1], ai);
        if (da < 0 || db < 0 || da == db) continue;
        const struct kiln_node *dqa = &g->nodes[da], *dqb = &g->nodes[db];
        kiln_dtype yt = g->values[q->out[0]].type.dtype;
        if ((q->n_in < 3 || q->in[2] < 0) && g->values[dqa->in[0]].type.dtype != yt) continue;
        int in[8] = {dqa->in[0], dqa->in[1], dqa->n_in > 2 ? dqa->in[2] : -1,
                     dqb->in[0], dqb->in[1], dqb->n_in > 2 ? dqb->in[2] : -1,
                     q->in[1],   q->n_in > 2 ? q->in[2] : -1};
        int y = q->out[0];
        const char *name = add->name;
        int ni;
        kiln_status st = kiln_opt_add_node(g, KILN_OP_KilnQLinearAdd, name, 8, 1, relu >= 0 ? 1 : 0, 1, &ni);
        if (st != KILN_OK) return st;
        if (relu >= 0 && (st = kiln_opt_attr_str(g, ni, 0, "activation", "Relu")) != KILN_OK)
            return st;
        /* remove the old nodes from the output end, then wire the new one */
        int olds[5] = {qi, relu, ai, da, db};
        kiln_opt_set_output(g, ni, 0, y);
        for (int k = 0; k < 8; k++) kiln_opt_set_input(g, ni, k, in[k]);
        for (int k = 0; k < 5; k++)
            if (olds[k] >= 0) kiln_opt_remove_node(g, olds[k]);
        g->values[y].producer = ni;
        if (pl) kiln_opt_count(pl, relu >= 0 ? "KilnQLinearAdd+Relu" : "KilnQLinearAdd");
    }
    return KILN_OK;
}
