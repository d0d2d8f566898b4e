/*
 * layout_shuffle.c - the channel shuffle of ShuffleNet as one channel
 * permutation, so the layout pass (layout.c) can keep it blocked.
 *
 * PyTorch writes the shuffle as x.view(N, g, C/g, H, W).transpose(1, 2)
 * .view(N, -1, H, W): Reshape, Transpose(perm 0,2,1,3,4), Reshape. On a
 * [N, C, H, W] tensor that is y[:, b*g + a] = x[:, a*(C/g) + b]: a Gather
 * along axis 1 with constant indices, whose fast kernel (simd/data.c through
 * simd/gather4.h) reads and writes plain or blocked memory, where the
 * Reshapes and the 5-D Transpose need plain memory and a reorder on each
 * side. The shape tensors are usually computed from the input's Shape (a
 * dynamic batch), so they are read element by element (shape_elem): a
 * constant, or dim d of a value (Shape, Gather of a Shape, Unsqueeze, Cast,
 * Concat). The match needs C, H and W known, the first shape to be
 * [N, g, any, H, W] and the second [N, any, H, W] (the element count forces
 * the free one), and neither intermediate value read by anything else.
 * Each rewrite makes the next unit's types known; the shape computations
 * that read them are folded again (fold.c) and the graph rescanned.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "import/model.h"
#include "kernels/kernel.h"
#include "opt/layout_shuffle.h"

/* One element of a shape tensor: unknown, a constant, or dim d of value v. */
struct elem {
    int kind; /* 0 unknown, 1 constant, 2 dim */
    int64_t c;
    int v, d;
};

static struct elem shape_elem(const struct kiln_graph *g, int v, int64_t k, int depth)
{
    struct elem none = {0, 0, -1, -1};
    if (v < 0 || v >= g->n_values || depth > 8 || k < 0) return none;
    const struct kiln_value *val = &g->values[v];
    if (val->kind == KILN_VALUE_CONST && val->konst) {
        const kiln_tensor *t = val->konst;
        if ((t->dtype != KILN_DTYPE_I64 && t->dtype != KILN_DTYPE_I32) || t->rank > 1 ||
            k >= kiln_tensor_count(t))
            return none;
        int64_t x = t->dtype == KILN_DTYPE_I64 ? ((const int64_t *)t->data)[k]
                                               : ((const int32_t *)t->data)[k];
        return (struct elem){1, x, -1, -1};
    }
    int p = kiln_opt_producer(g, v);
    if (p < 0) return none;
    const struct kiln_node *n = &g->nodes[p];
    if (n->n_in < 1 || n->in[0] < 0) return none;
    const struct kiln_type *x = &g->values[n->in[0]].type;
    switch (n->op) {
    case KILN_OP_Cast:
        return shape_elem(g, n->in[0], k, depth + 1);
    case KILN_OP_Unsqueeze:
    case KILN_OP_Squeeze:
    case KILN_OP_Reshape:
        /* of one element */
        if (k != 0 || x->rank < 0 || kiln_shape_count(x->rank, x->dims) != 1) return none;
        return shape_elem(g, n->in[0], 0, depth + 1);
    case KILN_OP_Shape:
        if (n->n_attr > 0 || k >= x->rank || x->rank < 0) return none;
        if (x->dims[k] >= 0) return (struct elem){1, x->dims[k], -1, -1};
        return (struct elem){2, 0, n->in[0], (int)k};
    case KILN_OP_Gather: {
        if (kiln_attr_int(n, "axis", 0) != 0 || n->n_in != 2) return none;
        struct elem i = shape_elem(g, n->in[1], k, depth + 1);
        int sp = kiln_opt_producer(g, n->in[0]);
        if (i.kind != 1 || (x->rank != 1)) return none;
        if (i.c < 0) i.c += x->dims[0];
        if (sp >= 0 && g->nodes[sp].op == KILN_OP_Shape) return shape_elem(g, n->in[0], i.c, depth + 1);
        return none;
    }
    case KILN_OP_Concat: {
        if (kiln_attr_int(n, "axis", 0) != 0) return none;
        int64_t at = 0;
        for (int j = 0; j < n->n_in; j++) {
            if (n->in[j] < 0) continue;
            const struct kiln_type *t = &g->values[n->in[j]].type;
            if (t->rank != 1 || t->dims[0] < 0) return none;
            if (k < at + t->dims[0]) return shape_elem(g, n->in[j], k - at, depth + 1);
            at += t->dims[0];
        }
        return none;
    }
    default:
        return none;
    }
}

/* Whether e is dim d of value v, knowing that dim's size (>= 0) or not (-1). */
static int elem_is(const struct elem *e, const int *vs, const int *ds, int nv, int64_t size)
{
    if (e->kind == 1) return size >= 0 && e->c == size;
    if (e->kind != 2) return 0;
    for (int i = 0; i < nv; i++)
        if (e->v == vs[i] && e->d == ds[i]) return 1;
    return 0;
}

/* The batch element of a shape: 0 (copy the dim; allowzero unset), or dim 0 of x, r1 or t. */
static int elem_batch(const struct elem *e, int x, int r1, int t, int64_t n)
{
    if (e->kind == 1 && e->c == 0) return 1;
    int vs[3] = {x, r1, t}, ds[3] = {0, 0, 0};
    return elem_is(e, vs, ds, 3, n);
}

static int shape_len(const struct kiln_graph *g, int v)
{
    if (v < 0) return -1;
    const struct kiln_type *t = &g->values[v].type;
    return t->rank == 1 && t->dims[0] >= 0 ? (int)t->dims[0] : -1;
}

static int single_use(const struct kiln_graph *g, int v)
{
    return v >= 0 && g->values[v].uses == 1 && !kiln_opt_is_graph_output(g, v);
}

/* Rewrite the shuffle ending at Reshape node i2, if it is one. */
static kiln_status try_shuffle(struct kiln_graph *g, int i2, int *done)
{
    const struct kiln_node *n2 = &g->nodes[i2];
    if (n2->op != KILN_OP_Reshape || n2->n_in != 2 || n2->n_out != 1 ||
        kiln_attr_int(n2, "allowzero", 0) != 0)
        return KILN_OK;
    int t = n2->in[0], it = kiln_opt_producer(g, t);
    if (it < 0 || !single_use(g, t) || g->nodes[it].op != KILN_OP_Transpose) return KILN_OK;
    const int64_t *perm;
    if (kiln_attr_ints(&g->nodes[it], "perm", &perm) != 5 || perm[0] != 0 || perm[1] != 2 ||
        perm[2] != 1 || perm[3] != 3 || perm[4] != 4)
        return KILN_OK;
    int r1 = g->nodes[it].in[0], i1 = kiln_opt_producer(g, r1);
    if (i1 < 0 || !single_use(g, r1) || g->nodes[i1].op != KILN_OP_Reshape ||
        g->nodes[i1].n_in != 2 || kiln_attr_int(&g->nodes[i1], "allowzero", 0) != 0)
        return KILN_OK;
    int x = g->nodes[i1].in[0], y = n2->out[0];
    if (x < 0 || y < 0) return KILN_OK;
    const struct kiln_type *xt = &g->values[x].type;
    if (xt->rank != 4 || xt->dims[1] <= 0 || xt->dims[2] < 0 || xt->dims[3] < 0) return KILN_OK;
    int64_t c = xt->dims[1], h = xt->dims[2], w = xt->dims[3];
    struct kiln_type x_type = *xt; /* adding values below may move g->values */
    int s1 = g->nodes[i1].in[1], s2 = n2->in[1];
    if (shape_len(g, s1) != 5 || shape_len(g, s2) != 4) return KILN_OK;
    struct elem e[5];
    for (int k = 0; k < 5; k++) e[k] = shape_elem(g, s1, k, 0);
    int hv[3] = {x, r1, t}, hd[3] = {2, 3, 3}, wd[3] = {3, 4, 4};
    if (!elem_batch(&e[0], x, r1, t, xt->dims[0]) || e[1].kind != 1 || e[1].c < 2 ||
        c % e[1].c || !elem_is(&e[3], hv, hd, 3, h) || !elem_is(&e[4], hv, wd, 3, w))
        return KILN_OK;
    int64_t grp = e[1].c, per = c / grp;
    struct elem f[4];
    for (int k = 0; k < 4; k++) f[k] = shape_elem(g, s2, k, 0);
    if (!elem_batch(&f[0], x, r1, t, xt->dims[0]) || !elem_is(&f[2], hv, hd, 3, h) ||
        !elem_is(&f[3], hv, wd, 3, w))
        return KILN_OK;
    /* y[:, b*g + a] = x[:, a*per + b] */
    char name[256];
    snprintf(name, sizeof name, "%.200s/channel_shuffle", n2->name ? n2->name : "");
    kiln_tensor *idx;
    int64_t dims[1] = {c};
    kiln_status st = kiln_tensor_new(KILN_DTYPE_I64, 1, dims, &idx);
    if (st != KILN_OK) return st;
    for (int64_t a = 0; a < grp; a++)
        for (int64_t b = 0; b < per; b++) ((int64_t *)idx->data)[b * grp + a] = a * per + b;
    int iv, ni;
    st = kiln_opt_add_const(g, g->values[y].name, idx, &iv);
    if (st != KILN_OK) return st;
    st = kiln_opt_add_node(g, KILN_OP_Gather, name, 2, 1, 1, 13, &ni);
    if (st != KILN_OK) return st;
    g->nodes[ni].op_type = "Gather";
    kiln_opt_attr_int(g, ni, 0, "axis", 1);
    kiln_opt_set_input(g, ni, 0, x);
    kiln_opt_set_input(g, ni, 1, iv);
    kiln_opt_remove_node(g, i2);
    kiln_opt_remove_node(g, it);
    kiln_opt_remove_node(g, i1);
    kiln_opt_set_output(g, ni, 0, y);
    g->values[y].type = x_type; /* [N, C, H, W], the batch as x names it */
    (*done)++;
    return KILN_OK;
}

kiln_status kiln_opt_layout_shuffle(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    /* a shuffle's output type is known only once the one before it is rewritten
     * (the Reshapes' shapes come from the graph): rewrite, retype, rescan */
    for (int round = 0; round < 64; round++) {
        int done = 0, n = g->n_nodes;
        kiln_status st = KILN_OK;
        for (int i = 0; i < n && st == KILN_OK; i++)
            if (!kiln_opt_node_dead(&g->nodes[i])) st = try_shuffle(g, i, &done);
        for (int i = 0; i < done; i++) kiln_opt_count(pl, "channel shuffle as Gather");
        if (st != KILN_OK || !done) return st;
        /* drop the shape computations the Reshapes read, retype what follows, and
         * fold the shape computations that now read known dims (the Slices of the
         * next unit split its channels at C/2, computed from its Shape) */
        for (int k = 0; k < 2 && st == KILN_OK; k++) {
            st = kiln_opt_compact(g);
            if (st == KILN_OK) st = kiln_opt_dce(g, NULL);
            if (st == KILN_OK) st = kiln_opt_compact(g);
            if (st == KILN_OK) st = kiln_graph_infer(g);
            if (st == KILN_OK && k == 0) st = kiln_opt_fold(g, NULL);
        }
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

/* ---- Split as Slices ----
 * A Split of a 4-D float32 value along C, H or W, with every piece's size known,
 * becomes one Slice per piece (constant starts, ends and axes), which the layout
 * pass keeps blocked like any Slice (simd/slice.c), where the Split would read
 * plain memory: the same bytes copied, no reorder on either side. */
static kiln_status add_i64(struct kiln_graph *g, const char *base, int64_t v, int *id)
{
    kiln_tensor *t;
    int64_t dims[1] = {1};
    kiln_status st = kiln_tensor_new(KILN_DTYPE_I64, 1, dims, &t);
    if (st != KILN_OK) return st;
    ((int64_t *)t->data)[0] = v;
    return kiln_opt_add_const(g, base, t, id);
}

static kiln_status try_split(struct kiln_graph *g, int i, int *done)
{
    const struct kiln_node *n = &g->nodes[i];
    if (n->op != KILN_OP_Split || n->n_in < 1 || n->in[0] < 0 || n->n_out < 1 ||
        n->n_implicit > 0)
        return KILN_OK;
    const struct kiln_type *xt = &g->values[n->in[0]].type;
    if (xt->dtype != KILN_DTYPE_F32 || xt->rank != 4) return KILN_OK;
    int64_t axis = kiln_attr_int(n, "axis", 0);
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return KILN_OK;
    }
    if (axis < 0) axis += 4;
    if (axis < 1 || axis > 3 || xt->dims[axis] < 0) return KILN_OK;
    int n_out = n->n_out, x = n->in[0];
    int64_t off[64], len[64], total = 0;
    if (n_out > 64) return KILN_OK;
    for (int k = 0; k < n_out; k++) {
        int y = n->out[k];
        if (y < 0) return KILN_OK;
        const struct kiln_type *yt = &g->values[y].type;
        if (yt->rank != 4 || yt->dtype != KILN_DTYPE_F32 || yt->dims[axis] < 0) return KILN_OK;
        off[k] = total;
        len[k] = yt->dims[axis];
        total += len[k];
    }
    if (total != xt->dims[axis]) return KILN_OK;
    int outs[64];
    for (int k = 0; k < n_out; k++) outs[k] = g->nodes[i].out[k];
    char name[256];
    for (int k = 0; k < n_out; k++) {
        const char *yname = g->values[outs[k]].name;
        int vs, ve, va, ni;
        kiln_status st = add_i64(g, yname, off[k], &vs);
        if (st == KILN_OK) st = add_i64(g, yname, off[k] + len[k], &ve);
        if (st == KILN_OK) st = add_i64(g, yname, axis, &va);
        snprintf(name, sizeof name, "%.200s/slice%d", g->nodes[i].name ? g->nodes[i].name : "", k);
        if (st == KILN_OK) st = kiln_opt_add_node(g, KILN_OP_Slice, name, 4, 1, 0, 13, &ni);
        if (st != KILN_OK) return st;
        g->nodes[ni].op_type = "Slice";
        kiln_opt_set_input(g, ni, 0, x);
        kiln_opt_set_input(g, ni, 1, vs);
        kiln_opt_set_input(g, ni, 2, ve);
        kiln_opt_set_input(g, ni, 3, va);
        outs[k] = -1 - ni; /* the Slice to own output k, once the Split is gone */
    }
    int ys[64];
    for (int k = 0; k < n_out; k++) ys[k] = g->nodes[i].out[k];
    kiln_opt_remove_node(g, i);
    for (int k = 0; k < n_out; k++) kiln_opt_set_output(g, -1 - outs[k], 0, ys[k]);
    (*done)++;
    return KILN_OK;
}

kiln_status kiln_opt_split_as_slices(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int done = 0, n = g->n_nodes;
    kiln_status st = KILN_OK;
    for (int i = 0; i < n && st == KILN_OK; i++)
        if (!kiln_opt_node_dead(&g->nodes[i])) st = try_split(g, i, &done);
    for (int i = 0; i < done; i++) kiln_opt_count(pl, "Split as Slices");
    if (st == KILN_OK && done) st = kiln_opt_compact(g);
    return st;
}

/* ---- Slices of a Gather as Gathers ----
 * Slice(Gather(x, idx, axis a)) with constant 1-D indices and one constant range on axis a
 * is Gather(x, idx[range]): ShuffleNet's halves of a channel shuffle (the next unit's
 * chunk(2)) read x once instead of the shuffled copy being made and copied again. The
 * Gather goes when nothing else reads it (DCE). Slices from opset 10 (inputs), axes and
 * steps optional, any step. */
static bool const_ints1(const struct kiln_graph *g, int v, int64_t *out)
{
    if (v < 0) return false;
    const kiln_tensor *t = kiln_opt_const(g, v);
    if (!t || kiln_tensor_count(t) != 1 || t->rank > 1) return false;
    if (t->dtype == KILN_DTYPE_I64) *out = ((const int64_t *)t->data)[0];
    else if (t->dtype == KILN_DTYPE_I32) *out = ((const int32_t *)t->data)[0];
    else return false;
    return true;
}

static kiln_status try_slice_gather(struct kiln_graph *g, int si, int *done)
{
    const struct kiln_node *sl = &g->nodes[si];
    if (sl->op != KILN_OP_Slice || sl->opset < 10 || sl->n_in < 3 || sl->n_out != 1 ||
        sl->in[0] < 0 || sl->out[0] < 0 || sl->n_implicit > 0)
        return KILN_OK;
    int gi = kiln_opt_producer(g, sl->in[0]);
    if (gi < 0) return KILN_OK;
    const struct kiln_node *ga = &g->nodes[gi];
    if (ga->op != KILN_OP_Gather || ga->n_in != 2 || ga->in[0] < 0 || ga->in[1] < 0 ||
        ga->n_implicit > 0)
        return KILN_OK;
    const kiln_tensor *idx = kiln_opt_const(g, ga->in[1]);
    const struct kiln_type *yt = &g->values[sl->in[0]].type;
    if (!idx || idx->rank != 1 || (idx->dtype != KILN_DTYPE_I64 && idx->dtype != KILN_DTYPE_I32) ||
        yt->rank < 1)
        return KILN_OK;
    int64_t gaxis = kiln_attr_int(ga, "axis", 0);
    if (kiln_attr_check(ga) != KILN_OK) {
        kiln_error_clear();
        return KILN_OK;
    }
    if (gaxis < 0) gaxis += yt->rank;
    int64_t start, end, axis = 0, step = 1, c = kiln_tensor_count(idx);
    if (!const_ints1(g, sl->in[1], &start) || !const_ints1(g, sl->in[2], &end) ||
        (sl->n_in > 3 && sl->in[3] >= 0 && !const_ints1(g, sl->in[3], &axis)) ||
        (sl->n_in > 4 && sl->in[4] >= 0 && !const_ints1(g, sl->in[4], &step)) || step == 0)
        return KILN_OK;
    if (axis < 0) axis += yt->rank;
    if (axis != gaxis || gaxis < 0 || gaxis >= yt->rank) return KILN_OK;
    /* ONNX's clamping of start and end to the axis of c entries */
    if (start < 0) start += c;
    if (end < 0) end += c;
    int64_t count;
    if (step > 0) {
        start = start < 0 ? 0 : start > c ? c : start;
        end = end < 0 ? 0 : end > c ? c : end;
        count = end > start ? (end - start - 1) / step + 1 : 0;
    } else {
        start = start < 0 ? 0 : start > c - 1 ? c - 1 : start;
        end = end < -1 ? -1 : end > c - 1 ? c - 1 : end;
        count = start > end ? (start - end - 1) / -step + 1 : 0;
    }
    if (count <= 0) return KILN_OK;
    kiln_tensor *ni_idx;
    int64_t dims[1] = {count};
    kiln_status st = kiln_tensor_new(KILN_DTYPE_I64, 1, dims, &ni_idx);
    if (st != KILN_OK) return st;
    for (int64_t k = 0; k < count; k++) {
        int64_t j = start + k * step;
        ((int64_t *)ni_idx->data)[k] = idx->dtype == KILN_DTYPE_I64
                                           ? ((const int64_t *)idx->data)[j]
                                           : ((const int32_t *)idx->data)[j];
    }
    int x = ga->in[0], y = sl->out[0], iv, ni;
    char name[256];
    snprintf(name, sizeof name, "%.200s/gather", sl->name ? sl->name : "");
    st = kiln_opt_add_const(g, g->values[y].name, ni_idx, &iv);
    if (st == KILN_OK) st = kiln_opt_add_node(g, KILN_OP_Gather, name, 2, 1, 1, 13, &ni);
    if (st != KILN_OK) return st;
    g->nodes[ni].op_type = "Gather";
    kiln_opt_attr_int(g, ni, 0, "axis", gaxis);
    kiln_opt_set_input(g, ni, 0, x);
    kiln_opt_set_input(g, ni, 1, iv);
    kiln_opt_remove_node(g, si);
    kiln_opt_set_output(g, ni, 0, y);
    (*done)++;
    return KILN_OK;
}

kiln_status kiln_opt_slice_of_gather(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int done = 0, n = g->n_nodes;
    kiln_status st = KILN_OK;
    for (int i = 0; i < n && st == KILN_OK; i++)
        if (!kiln_opt_node_dead(&g->nodes[i])) st = try_slice_gather(g, i, &done);
    for (int i = 0; i < done; i++) kiln_opt_count(pl, "Slice of Gather as Gather");
    if (st == KILN_OK && done) st = kiln_opt_compact(g);
    if (st == KILN_OK && done) st = kiln_opt_dce(g, NULL);
    if (st == KILN_OK && done) st = kiln_opt_compact(g);
    return st;
}
