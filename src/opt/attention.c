/*
 * attention.c - scaled dot-product attention -> Attention (opset 23, 3-D).
 *
 * The pattern, as PyTorch exports multi-head attention (BERT):
 *   q4 = Transpose(Reshape(q3, [B, S, H, d]), perm 0,2,1,3)        [B, H, S, d]
 *   k4 = Transpose(Reshape(k3, [B, T, Hk, d]), perm 0,2,3,1)       [B, Hk, d, T]
 *   v4 = Transpose(Reshape(v3, [B, T, Hk, dv]), perm 0,2,1,3)      [B, Hk, T, dv]
 *   p  = Softmax(MatMul(q4, k4) / c  (or * c)  [+ mask], axis -1)
 *   y  = Reshape(Transpose(MatMul(p, v4), perm 0,2,1,3), [B, S, H * dv])
 * becomes y = Attention(q3, k3, v3, [mask]) with q_num_heads H, kv_num_heads
 * Hk and scale 1/c (or c). Each reshape target must provably split (or
 * merge) only the last axis: its batch and sequence entries are 0, the
 * known size, or Gather(Shape(t), i) of a tensor t with the same dim i;
 * the head entries are constants. The mask (float32, last dim T known) is
 * added to the scaled scores, as Attention adds its attn_mask. Shape nodes
 * reading the pre-reshape context (for the final reshape's target) are
 * moved to q3, whose batch and sequence dims are the same.
 */
#include "core/tensor.h"
#include "kernels/kernel.h"
#include "opt/opt.h"

#define MAX_RM 16

/* A reshape-target entry: a known constant, or dim `dim` of value `src`. */
struct entry {
    bool is_const;
    int64_t c;
    int src, dim;
};

/* Entry i of shape vector v: a constant, or Unsqueeze(Gather(Shape(t), j)) / Gather(Shape(t), [j]). */
static bool shape_entry(const struct kiln_graph *g, int v, int i, struct entry *e)
{
    memset(e, 0, sizeof *e);
    const kiln_tensor *t = kiln_opt_const(g, v);
    if (t) {
        if (!kiln_dtype_is_int(t->dtype) || t->rank != 1 || i >= t->dims[0]) return false;
        e->is_const = true;
        e->c = kiln_tensor_i64(t, i);
        return true;
    }
    int p = kiln_opt_producer(g, v);
    if (p < 0) return false;
    const struct kiln_node *n = &g->nodes[p];
    if (n->op == KILN_OP_Concat) {
        if (kiln_attr_int(n, "axis", 0) != 0) return false;
        int off = 0;
        for (int k = 0; k < n->n_in; k++) {
            const struct kiln_type *pt = &g->values[n->in[k]].type;
            if (pt->rank != 1 || pt->dims[0] < 0) return false;
            if (i < off + pt->dims[0]) return shape_entry(g, n->in[k], i - off, e);
            off += (int)pt->dims[0];
        }
        return false;
    }
    int gi = -1;
    if (n->op == KILN_OP_Unsqueeze && i == 0) {
        gi = kiln_opt_producer(g, n->in[0]);
        if (gi < 0 || g->nodes[gi].op != KILN_OP_Gather) return false;
        if (g->values[g->nodes[gi].out[0]].type.rank != 0) return false;
    } else if (n->op == KILN_OP_Gather && i == 0) {
        gi = p;
    } else {
        return false;
    }
    const struct kiln_node *gn = &g->nodes[gi];
    const kiln_tensor *idx = kiln_opt_const(g, gn->in[1]);
    int si = kiln_opt_producer(g, gn->in[0]);
    if (!idx || kiln_tensor_count(idx) != 1 || !kiln_dtype_is_int(idx->dtype) || si < 0 ||
        g->nodes[si].op != KILN_OP_Shape || kiln_attr_int(gn, "axis", 0) != 0 ||
        kiln_node_attr(&g->nodes[si], "start") || kiln_node_attr(&g->nodes[si], "end"))
        return false;
    e->src = g->nodes[si].in[0];
    e->dim = (int)kiln_tensor_i64(idx, 0);
    int r = g->values[e->src].type.rank;
    if (e->dim < 0 && r > 0) e->dim += r;
    return e->dim >= 0;
}

/* Entry e provably equals dim d of x (whose equal-dim aliases are `alias`). */
static bool entry_is_dim(const struct kiln_graph *g, const struct entry *e, int x, int d,
                         const int *alias, int n_alias, bool zero_ok)
{
    const struct kiln_type *t = &g->values[x].type;
    if (e->is_const) return (zero_ok && e->c == 0) || (t->dims[d] >= 0 && e->c == t->dims[d]);
    if (e->dim != d) return false;
    if (e->src == x) return true;
    for (int k = 0; k < n_alias; k++)
        if (e->src == alias[k]) return true;
    return false;
}

/* Reshape node ri turns rank-3 x into [B, S, h, dh] with h, dh constants: h and dh. */
static bool split_heads(const struct kiln_graph *g, int ri, int64_t *h, int64_t *dh)
{
    const struct kiln_node *r = &g->nodes[ri];
    int x = r->in[0];
    const struct kiln_type *t = &g->values[x].type;
    if (t->rank != 3 || t->dims[2] <= 0 || kiln_attr_int(r, "allowzero", 0) != 0) return false;
    struct entry e[4];
    for (int i = 0; i < 4; i++)
        if (!shape_entry(g, r->in[1], i, &e[i])) return false;
    if (!entry_is_dim(g, &e[0], x, 0, NULL, 0, true) || !entry_is_dim(g, &e[1], x, 1, NULL, 0, true))
        return false;
    if (!e[2].is_const || !e[3].is_const || e[2].c <= 0 || e[3].c <= 0 ||
        e[2].c * e[3].c != t->dims[2])
        return false;
    *h = e[2].c;
    *dh = e[3].c;
    return true;
}

/* Transpose node ti has exactly perm p (rank 4). */
static bool has_perm(const struct kiln_graph *g, int ti, const int64_t *p)
{
    const int64_t *v;
    if (ti < 0 || g->nodes[ti].op != KILN_OP_Transpose) return false;
    if (kiln_attr_ints(&g->nodes[ti], "perm", &v) != 4) return false;
    for (int i = 0; i < 4; i++)
        if (v[i] != p[i]) return false;
    return true;
}

/* v4 = Transpose(Reshape(x3), perm) with single consumers: the Reshape, Transpose and x3. */
static bool heads_input(const struct kiln_graph *g, int v4, const int64_t *perm, int *x3,
                        int64_t *h, int64_t *dh, int *rm, int *n_rm)
{
    int ti = kiln_opt_producer(g, v4);
    if (!has_perm(g, ti, perm) || kiln_opt_single_consumer(g, v4) < 0) return false;
    int ri = kiln_opt_producer(g, g->nodes[ti].in[0]);
    if (ri < 0 || g->nodes[ri].op != KILN_OP_Reshape ||
        kiln_opt_single_consumer(g, g->nodes[ti].in[0]) != ti || !split_heads(g, ri, h, dh))
        return false;
    *x3 = g->nodes[ri].in[0];
    rm[(*n_rm)++] = ti;
    rm[(*n_rm)++] = ri;
    return true;
}

/* Dim i of a and dim j of b are provably equal (same size, or the same symbol). */
static bool same_dim(const struct kiln_type *a, int i, const struct kiln_type *b, int j)
{
    if (a->rank <= i || b->rank <= j) return false;
    if (a->dims[i] >= 0) return a->dims[i] == b->dims[j];
    return b->dims[j] < 0 && a->sym[i] && b->sym[j] && strcmp(a->sym[i], b->sym[j]) == 0;
}

/* Value v's producer if it has op `op` and v has a single consumer. */
static int producer_op(const struct kiln_graph *g, int v, enum kiln_op op)
{
    int p = kiln_opt_producer(g, v);
    return p >= 0 && g->nodes[p].op == op && kiln_opt_single_consumer(g, v) >= 0 ? p : -1;
}

static kiln_status fuse_one(struct kiln_graph *g, int smi, bool *done)
{
    static const int64_t p0213[4] = {0, 2, 1, 3}, p0231[4] = {0, 2, 3, 1};
    *done = false;
    const struct kiln_node *sm = &g->nodes[smi];
    int rm[MAX_RM], n_rm = 0;
    const struct kiln_type *ts = &g->values[sm->out[0]].type;
    if (ts->dtype != KILN_DTYPE_F32 || ts->rank != 4) return KILN_OK;
    int64_t axis = kiln_attr_int(sm, "axis", -1);
    if (axis != -1 && axis != 3) return KILN_OK;
    if (sm->opset < 13) return KILN_OK; /* older Softmax flattens from axis */
    rm[n_rm++] = smi;
    /* optional mask Add */
    int s = sm->in[0], mask = -1;
    int ai = producer_op(g, s, KILN_OP_Add);
    if (ai >= 0) {
        const struct kiln_node *a = &g->nodes[ai];
        /* the scores: read only here, made by the scale (Div before Mul: masks are often
         * Mul too) or by the MatMul itself */
        static const enum kiln_op score_ops[3] = {KILN_OP_Div, KILN_OP_MatMul, KILN_OP_Mul};
        int pick = -1;
        for (int o = 0; o < 3 && pick < 0; o++)
            for (int k = 0; k < 2 && pick < 0; k++)
                if (producer_op(g, a->in[k], score_ops[o]) >= 0) pick = k;
        if (pick < 0) return KILN_OK;
        s = a->in[pick];
        mask = a->in[1 - pick];
        rm[n_rm++] = ai;
    }
    /* optional scale */
    double scale = 1.0;
    int di = producer_op(g, s, KILN_OP_Div), mi = -1;
    if (di < 0) mi = producer_op(g, s, KILN_OP_Mul);
    if (di >= 0 || mi >= 0) {
        const struct kiln_node *d = &g->nodes[di >= 0 ? di : mi];
        float c;
        int k = -1;
        if (kiln_opt_const_scalar(g, d->in[1], &c)) k = 0;
        else if (mi >= 0 && kiln_opt_const_scalar(g, d->in[0], &c)) k = 1;
        if (k < 0 || c == 0.0f) return KILN_OK;
        scale = di >= 0 ? 1.0 / c : c;
        s = d->in[k];
        rm[n_rm++] = di >= 0 ? di : mi;
    }
    int m1 = producer_op(g, s, KILN_OP_MatMul);
    if (m1 < 0) return KILN_OK;
    rm[n_rm++] = m1;
    int q3, k3, v3;
    int64_t hq, dq, hk, dk, hv, dv;
    if (!heads_input(g, g->nodes[m1].in[0], p0213, &q3, &hq, &dq, rm, &n_rm) ||
        !heads_input(g, g->nodes[m1].in[1], p0231, &k3, &hk, &dk, rm, &n_rm))
        return KILN_OK;
    /* softmax output -> MatMul(p, v4) */
    int m2 = kiln_opt_single_consumer(g, sm->out[0]);
    if (m2 < 0 || g->nodes[m2].op != KILN_OP_MatMul || g->nodes[m2].in[0] != sm->out[0]) return KILN_OK;
    rm[n_rm++] = m2;
    if (!heads_input(g, g->nodes[m2].in[1], p0213, &v3, &hv, &dv, rm, &n_rm)) return KILN_OK;
    if (dq != dk || hk != hv || hq % hk != 0) return KILN_OK;
    const struct kiln_type *tq = &g->values[q3].type, *tk = &g->values[k3].type;
    if (tq->dtype != KILN_DTYPE_F32 || g->values[k3].type.dtype != KILN_DTYPE_F32 ||
        g->values[v3].type.dtype != KILN_DTYPE_F32)
        return KILN_OK;
    /* Q, K and V share the batch, K and V the sequence (no MatMul broadcasting) */
    const struct kiln_type *tv = &g->values[v3].type;
    if (!same_dim(tq, 0, tk, 0) || !same_dim(tq, 0, tv, 0) || !same_dim(tk, 1, tv, 1))
        return KILN_OK;
    if (mask >= 0) {
        /* the mask broadcasts into the scores [B, H, S, T] without growing them */
        const struct kiln_type *tm = &g->values[mask].type;
        int64_t t_len = tk->rank == 3 ? tk->dims[1] : -1;
        if (tm->dtype != KILN_DTYPE_F32 || tm->rank < 1 || tm->rank > 4 || t_len < 0 ||
            tm->dims[tm->rank - 1] != t_len)
            return KILN_OK;
        for (int i = 0; i < tm->rank - 1; i++) {
            int ax = 4 - tm->rank + i;
            int64_t md = tm->dims[i];
            if (md == 1) continue;
            if (ax == 1 ? md != hq : !same_dim(tm, i, tq, ax == 0 ? 0 : 1)) return KILN_OK;
        }
    }
    /* MatMul out -> Transpose(0,2,1,3) -> Reshape to [B, S, H * dv]; Shape readers allowed */
    int c4 = g->nodes[m2].out[0];
    int ti = kiln_opt_single_consumer(g, c4);
    if (!has_perm(g, ti, p0213)) return KILN_OK;
    rm[n_rm++] = ti;
    int t3 = g->nodes[ti].out[0], ri = -1, shapes[8], n_shapes = 0;
    if (kiln_opt_is_graph_output(g, t3)) return KILN_OK;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct kiln_node *n = &g->nodes[i];
        if (kiln_opt_node_dead(n)) continue;
        for (int k = 0; k < n->n_in; k++) {
            if (n->in[k] != t3) continue;
            if (n->op == KILN_OP_Reshape && k == 0 && ri < 0) ri = i;
            else if (n->op == KILN_OP_Shape && n_shapes < 8 && !kiln_node_attr(n, "start") &&
                     !kiln_node_attr(n, "end"))
                shapes[n_shapes++] = i;
            else
                return KILN_OK;
        }
    }
    if (ri < 0 || g->values[t3].uses != 1 + n_shapes) return KILN_OK;
    /* Shape(t3) may only feed Gathers of dims 0 and 1 (B, S: the same in q3) */
    for (int k = 0; k < n_shapes; k++) {
        int sv = g->nodes[shapes[k]].out[0];
        for (int i = 0; i < g->n_nodes; i++) {
            const struct kiln_node *n = &g->nodes[i];
            if (kiln_opt_node_dead(n)) continue;
            for (int j = 0; j < n->n_in; j++) {
                if (n->in[j] != sv) continue;
                const kiln_tensor *idx = n->n_in == 2 ? kiln_opt_const(g, n->in[1]) : NULL;
                if (n->op != KILN_OP_Gather || j != 0 || !idx || !kiln_dtype_is_int(idx->dtype) ||
                    kiln_attr_int(n, "axis", 0) != 0)
                    return KILN_OK;
                for (int64_t x = 0; x < kiln_tensor_count(idx); x++) {
                    int64_t d = kiln_tensor_i64(idx, x);
                    if (d != 0 && d != 1 && d != -4 && d != -3) return KILN_OK;
                }
            }
        }
        if (kiln_opt_is_graph_output(g, sv)) return KILN_OK;
    }
    const struct kiln_node *r = &g->nodes[ri];
    if (kiln_attr_int(r, "allowzero", 0) != 0) return KILN_OK;
    struct entry e[3];
    for (int i = 0; i < 3; i++)
        if (!shape_entry(g, r->in[1], i, &e[i])) return KILN_OK;
    /* the reshape's own input is t3 [B, S, H, dv]: 0 means "copy", aliases of dims 0/1 */
    int alias[4] = {t3, q3, -1, -1};
    if (!entry_is_dim(g, &e[0], q3, 0, alias, 2, true) ||
        !entry_is_dim(g, &e[1], q3, 1, alias, 2, true))
        return KILN_OK;
    if (!e[2].is_const || (e[2].c != -1 && e[2].c != hq * dv)) return KILN_OK;
    if (e[0].is_const && e[0].c == -1) return KILN_OK;
    int y = r->out[0];
    rm[n_rm++] = ri;

    int ni;
    kiln_status st = kiln_opt_add_node(g, KILN_OP_Attention, g->nodes[smi].name, mask >= 0 ? 4 : 3,
                                       1, 3, 23, &ni);
    if (st != KILN_OK) return st;
    kiln_opt_attr_int(g, ni, 0, "q_num_heads", hq);
    kiln_opt_attr_int(g, ni, 1, "kv_num_heads", hk);
    kiln_opt_attr_float(g, ni, 2, "scale", (float)scale);
    kiln_opt_set_input(g, ni, 0, q3);
    kiln_opt_set_input(g, ni, 1, k3);
    kiln_opt_set_input(g, ni, 2, v3);
    if (mask >= 0) kiln_opt_set_input(g, ni, 3, mask);
    for (int k = 0; k < n_shapes; k++) kiln_opt_set_input(g, shapes[k], 0, q3);
    for (int k = 0; k < n_rm; k++) kiln_opt_remove_node(g, rm[k]);
    kiln_opt_set_output(g, ni, 0, y);
    if (!kiln_opt_is_graph_output(g, y)) {
        /* y is q3 with the heads merged back: keep q3's batch and sequence symbols */
        struct kiln_type ty = *tq;
        ty.dims[2] = hq * dv;
        ty.sym[2] = NULL;
        g->values[y].type = ty;
    }
    *done = true;
    return KILN_OK;
}

kiln_status kiln_opt_attention(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes;
    for (int i = 0; i < n_nodes; i++) {
        const struct kiln_node *n = &g->nodes[i];
        if (kiln_opt_node_dead(n) || n->op != KILN_OP_Softmax || n->n_out != 1) continue;
        bool done;
        kiln_status st = fuse_one(g, i, &done);
        if (kiln_attr_check(&g->nodes[i]) != KILN_OK) kiln_error_clear();
        if (st != KILN_OK) return st;
        if (done) kiln_opt_count(pl, "Attention");
    }
    /* what this spelling did not match: by what it computes (attention_views.c) */
    return kiln_opt_attention_views(g, pl);
}
