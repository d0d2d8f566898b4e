/*
 * flops.c - the multiply-accumulate work of one node, for the profile's
 * GFLOP/s and share-of-peak columns.
 *
 * Counted: the ops whose time is their products (convolutions, matrix
 * products, attention, recurrent layers and the fused kernels made of them), at 2 floating-point
 * operations per multiply-accumulate; bias, activation, pooling and softmax
 * are not counted. Everything is read from the node's input and output
 * types, so the count is the one of the shape the plan was compiled for.
 * It is the direct algorithm's work: a Winograd convolution multiplies less,
 * so its rate can pass the FMA peak.
 */
#include "exec/flops.h"

#include "ir/ops.h"
#include "kernels/kernel.h"

/* Product of dims [from, to) of t, as a double (no overflow). */
static double dims_product(const struct kiln_type *t, int from, int to)
{
    double p = 1.0;
    for (int i = from; i < to && i < t->rank; i++) p *= (double)t->dims[i];
    return p;
}

static double numel(const struct kiln_type *t) { return dims_product(t, 0, t->rank); }

static const struct kiln_type *input(const struct kiln_type *const *in, int n_in, int k)
{
    return k < n_in ? in[k] : NULL;
}

/* Conv, KilnFusedConv: every output element sums (C / group) * kernel products, which
 * are W's dims after the first. */
static double conv_flops(const struct kiln_type *w, const struct kiln_type *y)
{
    if (!w || w->rank < 3 || y->rank < 3) return 0.0;
    return 2.0 * numel(y) * dims_product(w, 1, w->rank);
}

/* MatMul, KilnFusedMatMul, Gemm: every output element sums K products; K is A's last
 * dim, or its second to last when A is transposed (a 1-D A is [K]). */
static double matmul_flops(const struct kiln_type *a, const struct kiln_type *y, bool trans_a)
{
    if (!a || a->rank < 1) return 0.0;
    int64_t k = a->rank >= 2 && trans_a ? a->dims[a->rank - 2] : a->dims[a->rank - 1];
    return 2.0 * numel(y) * (double)k;
}

/* Attention: Q K^T is SQ x T x E per query head and S V is SQ x T x EV, so the work is
 * 2 T (|Q| + |Y|), with T the keys' sequence length (dim 1 of 3-D K, dim 2 of 4-D K) plus
 * the cached keys' (dim 2 of past_key [B, HK, P, E]) when there are any. */
static double attention_flops(const struct kiln_type *q, const struct kiln_type *k,
                              const struct kiln_type *past_k, const struct kiln_type *y)
{
    if (!q || !k || (k->rank != 3 && k->rank != 4)) return 0.0;
    double t = (double)k->dims[k->rank == 3 ? 1 : 2];
    if (past_k && past_k->rank == 4) t += (double)past_k->dims[2];
    return 2.0 * t * (numel(q) + numel(y));
}

/* KilnMBConv (opt.h): X [N, Cin, H, W] -> expand to Ce at H x W (when We is present),
 * k x k depthwise to Ho x Wo, squeeze-excitation Ce -> Cse -> Ce per image (when W1 is
 * present), project Ce -> Cout at Ho x Wo. */
static double mbconv_flops(const struct kiln_type *const *in, int n_in,
                           const struct kiln_type *y)
{
    const struct kiln_type *x = input(in, n_in, 0), *we = input(in, n_in, 1),
                           *wd = input(in, n_in, 3), *w1 = input(in, n_in, 8);
    if (!x || !wd || x->rank != 4 || wd->rank != 4 || y->rank != 4) return 0.0;
    double n = (double)x->dims[0], ce = (double)wd->dims[0];
    double in_px = (double)x->dims[2] * (double)x->dims[3];
    double out_px = (double)y->dims[2] * (double)y->dims[3];
    double macs = n * out_px * ce * (double)wd->dims[2] * (double)wd->dims[3] /* depthwise */
                  + n * out_px * ce * (double)y->dims[1];                     /* project */
    if (we) macs += n * in_px * (double)x->dims[1] * ce;
    if (w1 && w1->rank >= 1) macs += n * 2.0 * ce * (double)w1->dims[0];
    return 2.0 * macs;
}

double kiln_node_flops(const struct kiln_node *n, const struct kiln_type *const *in, int n_in,
                       const struct kiln_type *out0)
{
    if (!out0 || !kiln_type_is_concrete(out0)) return 0.0;
    for (int k = 0; k < n_in; k++)
        if (in[k] && !kiln_type_is_concrete(in[k])) return 0.0;
    switch (n->op) {
    case KILN_OP_Conv:
    case KILN_OP_KilnFusedConv:
        return conv_flops(input(in, n_in, 1), out0);
    case KILN_OP_ConvTranspose:
    case KILN_OP_KilnFusedConvTranspose: {
        /* every input element scatters into (M / group) * kernel outputs: W [C, M/g, k...] */
        const struct kiln_type *x = input(in, n_in, 0), *w = input(in, n_in, 1);
        if (!x || !w || w->rank < 3) return 0.0;
        return 2.0 * numel(x) * dims_product(w, 1, w->rank);
    }
    case KILN_OP_MatMul:
        return matmul_flops(input(in, n_in, 0), out0, false);
    case KILN_OP_Gemm:
    case KILN_OP_KilnFusedMatMul:
        return matmul_flops(input(in, n_in, 0), out0, kiln_attr_int(n, "transA", 0) != 0);
    case KILN_OP_KilnMatMulT: { /* K is A's stored dim permA[r - 1] */
        const struct kiln_type *a = input(in, n_in, 0);
        const int64_t *p;
        if (!a || a->rank < 2) return 0.0;
        int np = kiln_attr_ints(n, "permA", &p);
        int64_t kd = np == a->rank && p[a->rank - 1] >= 0 && p[a->rank - 1] < a->rank
                         ? p[a->rank - 1]
                         : a->rank - 1;
        return 2.0 * numel(out0) * (double)a->dims[kd];
    }
    case KILN_OP_Attention:
        return attention_flops(input(in, n_in, 0), input(in, n_in, 1), input(in, n_in, 4), out0);
    case KILN_OP_KilnAttention: {
        /* B * SQ * H query rows (Y's rows of EV), each against T keys: E + EV MACs per key */
        const struct kiln_type *k = input(in, n_in, 1);
        int64_t e = kiln_attr_int(n, "head_size", 0), ev = kiln_attr_int(n, "v_head_size", 0);
        if (!k || k->rank != 3 || e <= 0 || ev <= 0) return 0.0;
        double t = (double)k->dims[kiln_attr_int(n, "seq_first", 0) ? 0 : 1];
        return 2.0 * numel(out0) / (double)ev * t * (double)(e + ev);
    }
    case KILN_OP_KilnMBConv:
        return mbconv_flops(in, n_in, out0);
    case KILN_OP_RNN:
    case KILN_OP_GRU:
    case KILN_OP_LSTM: {
        /* every step of every direction: gates x H outputs from I inputs and H state values
         * per batch row; W is [directions, gates * H, I], X has T * batch rows */
        const struct kiln_type *x = input(in, n_in, 0), *w = input(in, n_in, 1),
                               *r = input(in, n_in, 2);
        if (!x || !w || !r || x->rank != 3 || w->rank != 3 || r->rank != 3) return 0.0;
        return 2.0 * dims_product(x, 0, 2) * dims_product(w, 0, 2) *
               ((double)w->dims[2] + (double)r->dims[2]);
    }
    default:
        return 0.0;
    }
}
