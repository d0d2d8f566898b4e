/*
 * conv_slice.c - a Slice of a Conv's spatial axes becomes the Conv's padding.
 *
 * A causal 1-D convolution is exported from PyTorch as a Conv padded on both
 * sides followed by a Slice that drops the outputs the right padding made
 * (TCN's "chomp", WaveNet-style models): Conv(pads [p, p]) -> Slice(0 : L).
 * Keeping outputs [a, a + n) of a spatial axis of stride s is the same Conv
 * with a * s less padding at the start and (O - a - n) * s less at the end
 * (O the Conv's output size there): output j of the new Conv reads the window
 * of output j + a of the old one, and the padded length shrinks by exactly
 * (O - n) * s, so the new Conv makes n outputs. So the Slice goes, and with it
 * the copy and the reference kernel it ran on, and the Conv stays next to the
 * BatchNormalization and activation that follow it, which conv_bn_fold and
 * conv_fusion then fold and fuse.
 *
 * Taken where: the Slice (opset 10+) has constant starts, ends, axes and steps,
 * slices only spatial axes (2 and up) with step 1, and reads a Conv's only
 * output that nothing else reads; the Conv has explicit pads (auto_pad NOTSET)
 * and both new pads stay non-negative. The Slice's output value keeps its id:
 * the Conv writes it. Runs before conv_bn_fold.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernel.h"
#include "opt/opt.h"

/* Entries of a constant 1-D int32 / int64 tensor into out (at most KILN_MAX_RANK); -1 if
 * v is not such a constant. */
static int const_ints(const struct kiln_graph *g, int v, int64_t *out)
{
    const kiln_tensor *t = v >= 0 ? kiln_opt_const(g, v) : NULL;
    if (!t || (t->dtype != KILN_DTYPE_I64 && t->dtype != KILN_DTYPE_I32) || t->rank != 1 ||
        t->dims[0] > KILN_MAX_RANK)
        return -1;
    for (int64_t i = 0; i < t->dims[0]; i++)
        out[i] = t->dtype == KILN_DTYPE_I64 ? ((const int64_t *)t->data)[i]
                                            : ((const int32_t *)t->data)[i];
    return (int)t->dims[0];
}

/* ONNX Slice's clamping for step 1 on an axis of size d: the first index kept and how
 * many. */
static void clamp_step1(int64_t d, int64_t start, int64_t end, int64_t *first, int64_t *count)
{
    if (start < 0) start += d;
    if (end < 0) end += d;
    start = start < 0 ? 0 : start > d ? d : start;
    end = end < 0 ? 0 : end > d ? d : end;
    *first = start;
    *count = end > start ? end - start : 0;
}

/* Fold Slice node si into the Conv ci that produces its data input. */
static kiln_status fold_one(struct kiln_graph *g, int ci, int si, bool *done)
{
    *done = false;
    const struct kiln_node *c = &g->nodes[ci], *s = &g->nodes[si];
    if (c->n_out != 1 || c->n_in < 2 || s->opset < 10 || s->n_in < 3 || s->n_out != 1 ||
        s->out[0] < 0)
        return KILN_OK;
    const struct kiln_type *y = &g->values[c->out[0]].type;
    int rank = y->rank, nsp = rank - 2;
    if (rank < 3 || rank > KILN_MAX_RANK) return KILN_OK;
    const char *ap = kiln_attr_str(c, "auto_pad", "NOTSET");
    const int64_t *pads = NULL, *strides = NULL;
    int np = kiln_attr_ints(c, "pads", &pads), ns = kiln_attr_ints(c, "strides", &strides);
    if (kiln_attr_check(c) != KILN_OK) {
        kiln_error_clear();
        return KILN_OK;
    }
    if (strcmp(ap, "NOTSET") != 0 || (np != 0 && np != 2 * nsp) || (ns != 0 && ns != nsp))
        return KILN_OK;
    int64_t starts[KILN_MAX_RANK], ends[KILN_MAX_RANK], axes[KILN_MAX_RANK],
        steps[KILN_MAX_RANK];
    int n = const_ints(g, s->in[1], starts);
    if (n <= 0 || const_ints(g, s->in[2], ends) != n) return KILN_OK;
    if (s->n_in > 3 && s->in[3] >= 0) {
        if (const_ints(g, s->in[3], axes) != n) return KILN_OK;
    } else {
        for (int i = 0; i < n; i++) axes[i] = i;
    }
    if (s->n_in > 4 && s->in[4] >= 0) {
        if (const_ints(g, s->in[4], steps) != n) return KILN_OK;
    } else {
        for (int i = 0; i < n; i++) steps[i] = 1;
    }
    int64_t np2[2 * KILN_MAX_RANK];
    for (int i = 0; i < 2 * nsp; i++) np2[i] = np ? pads[i] : 0;
    int seen = 0;
    for (int i = 0; i < n; i++) {
        int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
        if (a < 2 || a >= rank || (seen >> a & 1) || steps[i] != 1) return KILN_OK;
        seen |= 1 << a;
        int64_t o = y->dims[a];
        if (o <= 0 || y->sym[a]) return KILN_OK; /* the Conv's output size must be known */
        int64_t first, count, st = ns ? strides[a - 2] : 1;
        clamp_step1(o, starts[i], ends[i], &first, &count);
        if (count <= 0 || st < 1) return KILN_OK;
        int64_t pb = np2[a - 2] - first * st, pe = np2[a - 2 + nsp] - (o - first - count) * st;
        if (pb < 0 || pe < 0) return KILN_OK;
        np2[a - 2] = pb;
        np2[a - 2 + nsp] = pe;
    }
    kiln_status st = kiln_opt_set_ints(g, ci, "pads", np2, 2 * nsp);
    if (st != KILN_OK) return st;
    int old = g->nodes[ci].out[0], out = g->nodes[si].out[0];
    kiln_opt_remove_node(g, si);
    kiln_opt_set_output(g, ci, 0, out);
    g->values[old].producer = -1;
    *done = true;
    return KILN_OK;
}

kiln_status kiln_opt_conv_slice(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes;
    for (int i = 0; i < n_nodes; i++) {
        const struct kiln_node *s = &g->nodes[i];
        if (kiln_opt_node_dead(s) || s->op != KILN_OP_Slice || s->n_in < 1 || s->in[0] < 0)
            continue;
        int v = s->in[0], ci = kiln_opt_producer(g, v);
        if (ci < 0 || g->nodes[ci].op != KILN_OP_Conv || kiln_opt_single_consumer(g, v) != i ||
            kiln_opt_is_graph_output(g, v))
            continue;
        bool done;
        kiln_status st = fold_one(g, ci, i, &done);
        if (st != KILN_OK) return st;
        if (done) kiln_opt_count(pl, "Conv+Slice");
    }
    return KILN_OK;
}
