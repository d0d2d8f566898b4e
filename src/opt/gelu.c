/*
 * gelu.c - decomposed GELU -> Gelu (opset 20).
 *
 * Erf form (PyTorch's exact GELU):
 *     0.5 * x * (1 + Erf(x / sqrt2))      x / sqrt2 also as x * (1/sqrt2)
 * Tanh form (approximate="tanh"):
 *     0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
 *                                           x^3 as Pow(x, 3) or (x * x) * x
 * The final product may be ((x * (1 + t)) * 0.5) or ((x * 0.5) * (1 + t)),
 * operands in either order. Every intermediate must have one consumer.
 */
#include <math.h>

#include "kernels/kernel.h"
#include "opt/opt.h"

#define MAX_RM 10

struct match {
    int rm[MAX_RM];
    int n_rm;
};

static bool near(float v, double want) { return fabs(v - want) <= 1e-3 * fabs(want); }

/* Node producing v with op `op`, read only by its consumer (v has one use), or -1. */
static int inner(const struct kiln_graph *g, int v, enum kiln_op op)
{
    int p = kiln_opt_producer(g, v);
    if (p < 0 || g->nodes[p].op != op || kiln_opt_single_consumer(g, v) < 0) return -1;
    return p;
}

/* Binary node ni has one operand a constant near `c`: the other operand, or -1. */
static int other_than_const(const struct kiln_graph *g, int ni, double c)
{
    const struct kiln_node *n = &g->nodes[ni];
    if (n->n_in != 2) return -1;
    float f;
    if (kiln_opt_const_scalar(g, n->in[1], &f) && near(f, c)) return n->in[0];
    if (n->op != KILN_OP_Div && kiln_opt_const_scalar(g, n->in[0], &f) && near(f, c))
        return n->in[1];
    return -1;
}

/* The binary node's operand that is not v, or -1. */
static int other_operand(const struct kiln_node *n, int v)
{
    if (n->n_in != 2) return -1;
    if (n->in[0] == v) return n->in[1];
    if (n->in[1] == v) return n->in[0];
    return -1;
}

/* The tail after t = Erf(..) or Tanh(..): 0.5 * x * (1 + t). The output value or -1. */
static int match_tail(const struct kiln_graph *g, int t, int x, struct match *m)
{
    int ai = kiln_opt_single_consumer(g, t);
    if (ai < 0 || g->nodes[ai].op != KILN_OP_Add || other_than_const(g, ai, 1.0) != t) return -1;
    int a1 = g->nodes[ai].out[0];
    int mi = kiln_opt_single_consumer(g, a1);
    if (mi < 0 || g->nodes[mi].op != KILN_OP_Mul) return -1;
    int o = other_operand(&g->nodes[mi], a1);
    m->rm[m->n_rm++] = ai;
    m->rm[m->n_rm++] = mi;
    if (o == x) { /* (x * (1 + t)) * 0.5 */
        int m1 = g->nodes[mi].out[0];
        int hi = kiln_opt_single_consumer(g, m1);
        if (hi < 0 || g->nodes[hi].op != KILN_OP_Mul || other_than_const(g, hi, 0.5) != m1)
            return -1;
        m->rm[m->n_rm++] = hi;
        return g->nodes[hi].out[0];
    }
    /* ((x * 0.5) * (1 + t)) */
    int hi = inner(g, o, KILN_OP_Mul);
    if (hi < 0 || other_than_const(g, hi, 0.5) != x) return -1;
    m->rm[m->n_rm++] = hi;
    return g->nodes[mi].out[0];
}

/* Erf node ei: x and the output, or -1. */
static int match_erf(const struct kiln_graph *g, int ei, int *x, struct match *m)
{
    int pi = inner(g, g->nodes[ei].in[0], KILN_OP_Div);
    int xv = -1;
    if (pi >= 0) xv = other_than_const(g, pi, M_SQRT2);
    else if ((pi = inner(g, g->nodes[ei].in[0], KILN_OP_Mul)) >= 0)
        xv = other_than_const(g, pi, M_SQRT1_2);
    if (xv < 0) return -1;
    m->rm[m->n_rm++] = pi;
    m->rm[m->n_rm++] = ei;
    *x = xv;
    return match_tail(g, g->nodes[ei].out[0], xv, m);
}

/* Tanh node ti: x and the output, or -1. */
static int match_tanh(const struct kiln_graph *g, int ti, int *x, struct match *m)
{
    int si = inner(g, g->nodes[ti].in[0], KILN_OP_Mul);
    if (si < 0) return -1;
    int s_in = other_than_const(g, si, 0.7978845608028654);
    int ai = inner(g, s_in, KILN_OP_Add);
    if (ai < 0) return -1;
    const struct kiln_node *a = &g->nodes[ai];
    /* one operand is x, the other 0.044715 * x^3 */
    for (int side = 0; side < 2; side++) {
        int xv = a->in[side], q = a->in[1 - side];
        int qi = inner(g, q, KILN_OP_Mul);
        if (qi < 0) continue;
        int cube = other_than_const(g, qi, 0.044715);
        int pi = inner(g, cube, KILN_OP_Pow);
        int n_extra = 0, extra[2];
        if (pi >= 0) {
            float e;
            if (g->nodes[pi].in[0] != xv || !kiln_opt_const_scalar(g, g->nodes[pi].in[1], &e) ||
                e != 3.0f)
                continue;
            extra[n_extra++] = pi;
        } else if ((pi = inner(g, cube, KILN_OP_Mul)) >= 0) {
            int sq = other_operand(&g->nodes[pi], xv);
            int qi2 = inner(g, sq, KILN_OP_Mul);
            if (qi2 < 0 || g->nodes[qi2].in[0] != xv || g->nodes[qi2].in[1] != xv) continue;
            extra[n_extra++] = pi;
            extra[n_extra++] = qi2;
        } else {
            continue;
        }
        m->rm[m->n_rm++] = si;
        m->rm[m->n_rm++] = ai;
        m->rm[m->n_rm++] = qi;
        for (int k = 0; k < n_extra; k++) m->rm[m->n_rm++] = extra[k];
        m->rm[m->n_rm++] = ti;
        *x = xv;
        return match_tail(g, g->nodes[ti].out[0], xv, m);
    }
    return -1;
}

kiln_status kiln_opt_gelu(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes;
    for (int i = 0; i < n_nodes; i++) {
        const struct kiln_node *n = &g->nodes[i];
        if (kiln_opt_node_dead(n) || (n->op != KILN_OP_Erf && n->op != KILN_OP_Tanh)) continue;
        if (g->values[n->out[0]].type.dtype != KILN_DTYPE_F32) continue;
        bool tanh_form = n->op == KILN_OP_Tanh;
        struct match m = {.n_rm = 0};
        int x = -1;
        int out = tanh_form ? match_tanh(g, i, &x, &m) : match_erf(g, i, &x, &m);
        if (out < 0 || x < 0 || g->values[x].type.dtype != KILN_DTYPE_F32) continue;
        /* the constants have one element each: the same rank means the same shape */
        if (g->values[x].type.rank < 0 || g->values[out].type.rank != g->values[x].type.rank)
            continue;
        int ni;
        kiln_status st = kiln_opt_add_node(g, KILN_OP_Gelu, g->nodes[m.rm[m.n_rm - 1]].name, 1, 1,
                                           tanh_form ? 1 : 0, 20, &ni);
        if (st != KILN_OK) return st;
        if (tanh_form) {
            st = kiln_opt_attr_str(g, ni, 0, "approximate", "tanh");
            if (st != KILN_OK) return st;
        }
        kiln_opt_set_input(g, ni, 0, x);
        for (int k = 0; k < m.n_rm; k++) kiln_opt_remove_node(g, m.rm[k]);
        kiln_opt_set_output(g, ni, 0, out);
        kiln_opt_count(pl, tanh_form ? "Gelu(tanh)" : "Gelu(erf)");
    }
    return KILN_OK;
}
