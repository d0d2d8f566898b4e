/*
 * layernorm.c - decomposed layer normalization -> LayerNormalization.
 *
 * As PyTorch exports nn.LayerNorm (x float32, last axis, keepdims):
 *     m = ReduceMean(x); d = Sub(x, m); v = ReduceMean(Pow(d, 2))   (or Mul(d, d))
 *     n = Div(d, Sqrt(Add(v, eps)))
 *     y = Add(Mul(n, gamma), beta)              gamma / beta constant, optional
 * becomes LayerNormalization(x, gamma, beta, axis=-1, epsilon=eps) writing
 * y's value. gamma and beta must hold one value per element of the last
 * axis; absent ones become constants of ones and zeros.
 */
#include "core/tensor.h"
#include "kernels/kernel.h"
#include "opt/opt.h"

/* ReduceMean node ri reduces only the last axis of its input with keepdims. */
static bool mean_last_axis(const struct kiln_graph *g, int ri)
{
    const struct kiln_node *r = &g->nodes[ri];
    int rank = g->values[r->in[0]].type.rank;
    if (rank < 1 || kiln_attr_int(r, "keepdims", 1) != 1) return false;
    int64_t axis;
    const int64_t *ax;
    int n = kiln_attr_ints(r, "axes", &ax);
    if (kiln_attr_check(r) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    if (n == 1) {
        axis = ax[0];
    } else if (n < 0 && r->n_in > 1 && r->in[1] >= 0) {
        const kiln_tensor *t = kiln_opt_const(g, r->in[1]);
        if (!t || !kiln_dtype_is_int(t->dtype) || kiln_tensor_count(t) != 1) return false;
        axis = kiln_tensor_i64(t, 0);
    } else {
        return false;
    }
    if (r->n_in > 1 && r->in[1] >= 0 && n >= 0) return false;
    return axis == -1 || axis == rank - 1;
}

/* The single consumer of v if it has op `op`, else -1. */
static int next(const struct kiln_graph *g, int v, enum kiln_op op)
{
    int c = kiln_opt_single_consumer(g, v);
    return c >= 0 && g->nodes[c].op == op ? c : -1;
}

/* The operand of binary node ni that is not v (-1 if v is not one of them). */
static int other(const struct kiln_graph *g, int ni, int v)
{
    const struct kiln_node *n = &g->nodes[ni];
    if (n->n_in != 2) return -1;
    return n->in[0] == v ? n->in[1] : n->in[1] == v ? n->in[0] : -1;
}

/* A float32 constant of c elements laid along the last axis ([c] or [1..., c]). */
static bool row_param(const kiln_tensor *t, int64_t c)
{
    if (!t || t->dtype != KILN_DTYPE_F32 || t->rank < 1 || kiln_tensor_count(t) != c) return false;
    return t->dims[t->rank - 1] == c;
}

/* Value id of a [c] constant: v itself when already 1-D, else a copy (fill when v < 0). */
static kiln_status param_const(struct kiln_graph *g, int v, int64_t c, float fill, const char *base,
                               int *out)
{
    const kiln_tensor *t = v >= 0 ? kiln_opt_const(g, v) : NULL;
    if (t && t->rank == 1) {
        *out = v;
        return KILN_OK;
    }
    kiln_tensor *nt;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_F32, 1, &c, &nt);
    if (st != KILN_OK) return st;
    for (int64_t i = 0; i < c; i++) ((float *)nt->data)[i] = t ? ((const float *)t->data)[i] : fill;
    return kiln_opt_add_const(g, base, nt, out);
}

kiln_status kiln_opt_layernorm(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes;
    for (int r1 = 0; r1 < n_nodes; r1++) {
        const struct kiln_node *n = &g->nodes[r1];
        if (kiln_opt_node_dead(n) || n->op != KILN_OP_ReduceMean || n->n_out != 1) continue;
        int x = n->in[0];
        const struct kiln_type *tx = &g->values[x].type;
        if (tx->dtype != KILN_DTYPE_F32 || tx->rank < 1 || tx->dims[tx->rank - 1] <= 0) continue;
        int64_t c = tx->dims[tx->rank - 1];
        if (!mean_last_axis(g, r1)) continue;
        int rm[10], n_rm = 0;
        rm[n_rm++] = r1;
        int mean = n->out[0];
        int sub = next(g, mean, KILN_OP_Sub);
        if (sub < 0 || g->nodes[sub].in[0] != x || g->nodes[sub].in[1] != mean) continue;
        rm[n_rm++] = sub;
        int d = g->nodes[sub].out[0];
        if (kiln_opt_is_graph_output(g, d)) continue;
        /* d is read by the square and the Div, nothing else */
        int sq = -1, div = -1, reads = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const struct kiln_node *m = &g->nodes[i];
            if (kiln_opt_node_dead(m)) continue;
            bool reads_d = false;
            for (int k = 0; k < m->n_in; k++) reads_d |= m->in[k] == d;
            if (!reads_d) continue;
            reads++;
            float e;
            if (m->op == KILN_OP_Pow && m->in[0] == d && kiln_opt_const_scalar(g, m->in[1], &e) &&
                e == 2.0f)
                sq = i;
            else if (m->op == KILN_OP_Mul && m->in[0] == d && m->in[1] == d)
                sq = i;
            else if (m->op == KILN_OP_Div && m->in[0] == d)
                div = i;
        }
        int d_uses = sq >= 0 && g->nodes[sq].op == KILN_OP_Mul ? 3 : 2;
        if (reads != 2 || sq < 0 || div < 0 || g->values[d].uses != d_uses) continue;
        rm[n_rm++] = sq;
        int r2 = next(g, g->nodes[sq].out[0], KILN_OP_ReduceMean);
        if (r2 < 0 || !mean_last_axis(g, r2)) continue;
        rm[n_rm++] = r2;
        int add = next(g, g->nodes[r2].out[0], KILN_OP_Add);
        float eps;
        if (add < 0 || !kiln_opt_const_scalar(g, other(g, add, g->nodes[r2].out[0]), &eps))
            continue;
        rm[n_rm++] = add;
        int sqrt_i = next(g, g->nodes[add].out[0], KILN_OP_Sqrt);
        if (sqrt_i < 0 || next(g, g->nodes[sqrt_i].out[0], KILN_OP_Div) != div ||
            g->nodes[div].in[1] != g->nodes[sqrt_i].out[0])
            continue;
        rm[n_rm++] = sqrt_i;
        rm[n_rm++] = div;
        int y = g->nodes[div].out[0], gamma = -1, beta = -1;
        int mul = next(g, y, KILN_OP_Mul);
        if (mul >= 0 && row_param(kiln_opt_const(g, other(g, mul, y)), c)) {
            gamma = other(g, mul, y);
            rm[n_rm++] = mul;
            y = g->nodes[mul].out[0];
            int badd = next(g, y, KILN_OP_Add);
            if (badd >= 0 && row_param(kiln_opt_const(g, other(g, badd, y)), c)) {
                beta = other(g, badd, y);
                rm[n_rm++] = badd;
                y = g->nodes[badd].out[0];
            }
        }
        /* y must keep x's shape: the parameters broadcast no further */
        if (!kiln_opt_same_shape(&g->values[y].type, tx) && g->values[y].type.rank != tx->rank)
            continue;
        const char *base = g->values[x].name;
        int gv, bv;
        kiln_status st = param_const(g, gamma, c, 1.0f, base, &gv);
        if (st == KILN_OK) st = param_const(g, beta, c, 0.0f, base, &bv);
        if (st != KILN_OK) return st;
        int ni;
        st = kiln_opt_add_node(g, KILN_OP_LayerNormalization, g->nodes[r1].name, 3, 1, 2, 17, &ni);
        if (st != KILN_OK) return st;
        kiln_opt_attr_int(g, ni, 0, "axis", -1);
        kiln_opt_attr_float(g, ni, 1, "epsilon", eps);
        kiln_opt_set_input(g, ni, 0, x);
        kiln_opt_set_input(g, ni, 1, gv);
        kiln_opt_set_input(g, ni, 2, bv);
        for (int k = 0; k < n_rm; k++) kiln_opt_remove_node(g, rm[k]);
        kiln_opt_set_output(g, ni, 0, y);
        kiln_opt_count(pl, "LayerNormalization");
    }
    return KILN_OK;
}
