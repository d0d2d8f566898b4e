/*
 * conv_taps.c - kernel taps of a Conv that only ever read padding are dropped.
 *
 * A dilated convolution on a small image reads mostly padding: DeepLab's ASPP
 * convolutions (3x3, dilations 12, 24 and 36, padding equal to the dilation) on
 * a 6x6 feature map read the image only through their centre tap, so 8 of their
 * 9 taps multiply zeros, and three such convolutions took 58% of
 * deeplabv3_mobilenet_v3's time. In general, tap t of a spatial axis (stride s,
 * dilation d, padding pb, input size I, output size O) reads input
 * o * s - pb + t * d for the outputs o in [0, O); where none of those is inside
 * [0, I), the tap adds products with zero only. The taps that do read the image
 * form a range [t0, t1] (the reads move by d per tap), so the same Conv with the
 * kernel cut to [t0, t1] and the padding cut by t0 * d at the start and
 * (K - 1 - t1) * d at the end makes the same outputs from the same products:
 * its padded length shrinks by exactly the kernel extent it loses.
 *
 * Taken where: a Conv (not yet fused; groups any) with constant f32 weights,
 * explicit pads (auto_pad NOTSET), static input and output sizes on the
 * spatial axes, both new pads non-negative, and every weight finite (an
 * infinite or NaN weight times a padding zero is NaN, which the cut would
 * drop). The weights become a new constant (the old one goes when nothing
 * else reads it); kernel_shape follows. Runs after conv_slice_fold, whose
 * smaller padding it sees, and before conv_bn_fold.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "kernels/kernel.h"
#include "opt/opt.h"

/* The range [t0, t1] of taps of one axis that read the image; false if none does. */
static bool live_taps(int64_t in, int64_t out, int64_t k, int64_t s, int64_t d, int64_t pb,
                      int64_t *t0, int64_t *t1)
{
    *t0 = -1;
    *t1 = -1;
    for (int64_t t = 0; t < k; t++) {
        /* the first output whose read o * s - pb + t * d is >= 0 */
        int64_t need = pb - t * d, o = need <= 0 ? 0 : (need + s - 1) / s;
        if (o < out && o * s - pb + t * d < in) {
            if (*t0 < 0) *t0 = t;
            *t1 = t;
        }
    }
    return *t0 >= 0;
}

/* Cut the dead taps of Conv node ci. */
static kiln_status cut_one(struct kiln_graph *g, int ci, bool *done)
{
    *done = false;
    const struct kiln_node *c = &g->nodes[ci];
    if (c->n_in < 2 || c->n_out != 1 || c->in[0] < 0 || c->in[1] < 0 || c->out[0] < 0)
        return KILN_OK;
    const kiln_tensor *w = kiln_opt_const(g, c->in[1]);
    const struct kiln_type *x = &g->values[c->in[0]].type, *y = &g->values[c->out[0]].type;
    int rank = x->rank, nsp = rank - 2;
    if (!w || w->dtype != KILN_DTYPE_F32 || rank < 3 || rank > KILN_MAX_RANK ||
        w->rank != rank || y->rank != rank)
        return KILN_OK;
    const char *ap = kiln_attr_str(c, "auto_pad", "NOTSET");
    const int64_t *pads = NULL, *strides = NULL, *dil = NULL, *ks = NULL;
    int np = kiln_attr_ints(c, "pads", &pads), ns = kiln_attr_ints(c, "strides", &strides);
    int nd = kiln_attr_ints(c, "dilations", &dil), nk = kiln_attr_ints(c, "kernel_shape", &ks);
    if (kiln_attr_check(c) != KILN_OK) {
        kiln_error_clear();
        return KILN_OK;
    }
    if (strcmp(ap, "NOTSET") != 0 || (np != 0 && np != 2 * nsp) || (ns != 0 && ns != nsp) ||
        (nd != 0 && nd != nsp) || (nk != 0 && nk != nsp))
        return KILN_OK;
    int64_t lo[KILN_MAX_RANK], hi[KILN_MAX_RANK], np2[2 * KILN_MAX_RANK];
    bool cut = false;
    for (int a = 0; a < nsp; a++) {
        int64_t in = x->dims[a + 2], out = y->dims[a + 2], k = w->dims[a + 2];
        int64_t s = ns ? strides[a] : 1, d = nd ? dil[a] : 1;
        int64_t pb = np ? pads[a] : 0, pe = np ? pads[a + nsp] : 0;
        if (x->sym[a + 2] || y->sym[a + 2] || in <= 0 || out <= 0 || k <= 0 || s < 1 || d < 1 ||
            (nk && ks[a] != k))
            return KILN_OK;
        if (!live_taps(in, out, k, s, d, pb, &lo[a], &hi[a])) return KILN_OK;
        np2[a] = pb - lo[a] * d;
        np2[a + nsp] = pe - (k - 1 - hi[a]) * d;
        if (np2[a] < 0 || np2[a + nsp] < 0) return KILN_OK;
        if (lo[a] > 0 || hi[a] < k - 1) cut = true;
    }
    if (!cut) return KILN_OK;
    const float *wd = w->data;
    int64_t total = kiln_shape_count(w->rank, w->dims);
    for (int64_t i = 0; i < total; i++)
        if (!isfinite(wd[i])) return KILN_OK;

    int64_t nwd[KILN_MAX_RANK];
    nwd[0] = w->dims[0];
    nwd[1] = w->dims[1];
    for (int a = 0; a < nsp; a++) nwd[a + 2] = hi[a] - lo[a] + 1;
    kiln_tensor *nw;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_F32, rank, nwd, &nw);
    if (st != KILN_OK) return st;
    /* copy the kept taps: walk the new tensor's elements in order */
    float *dst = nw->data;
    int64_t n_new = kiln_shape_count(rank, nwd), idx[KILN_MAX_RANK] = {0};
    for (int64_t e = 0; e < n_new; e++) {
        int64_t off = 0;
        for (int i = 0; i < rank; i++)
            off = off * w->dims[i] + idx[i] + (i >= 2 ? lo[i - 2] : 0);
        dst[e] = wd[off];
        for (int i = rank - 1; i >= 0; i--) {
            if (++idx[i] < nwd[i]) break;
            idx[i] = 0;
        }
    }
    int wv;
    st = kiln_opt_add_const(g, g->values[c->in[1]].name, nw, &wv);
    if (st != KILN_OK) return st;
    if ((st = kiln_opt_set_ints(g, ci, "pads", np2, 2 * nsp)) != KILN_OK) return st;
    if ((st = kiln_opt_set_ints(g, ci, "kernel_shape", nwd + 2, nsp)) != KILN_OK) return st;
    kiln_opt_set_input(g, ci, 1, wv);
    *done = true;
    return KILN_OK;
}

kiln_status kiln_opt_conv_taps(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes;
    for (int i = 0; i < n_nodes; i++) {
        const struct kiln_node *c = &g->nodes[i];
        if (kiln_opt_node_dead(c) || c->op != KILN_OP_Conv) continue;
        bool done;
        kiln_status st = cut_one(g, i, &done);
        if (st != KILN_OK) return st;
        if (done) kiln_opt_count(pl, "Conv taps cut");
    }
    return KILN_OK;
}
