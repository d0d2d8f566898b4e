/*
 * tf_lower_array.c - TensorFlow shape and indexing ops to Kiln IR: concat,
 * pack/unpack, split, reshape, squeeze, transpose, shape queries, fill and
 * broadcast, pad, slice, reverse, StridedSlice (masks become Slice + Squeeze +
 * Unsqueeze), gathers, Range, OneHot and Where. Inputs TensorFlow passes as
 * tensors but ONNX wants as attributes (perm, axis, ...) must be constants.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "import/tf_lower.h"
#include "kernels/kernel.h"

/* ---- shapes and layout ---- */

kiln_status tfo_lw_concat(L_t *L, const struct tf_op *e)
{
    /* ConcatV2: values..., axis; Concat: axis, values... */
    bool v2 = e->arg != TFV_CONCAT_V1;
    if (L->n_in < 2) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "has %d inputs", L->n_in);
    int64_t axis;
    int n = -1;
    kiln_status st = tfo_need_const_ints(L, v2 ? L->n_in - 1 : 0, &axis, 1, &n, "axis");
    if (st != KILN_OK) return st;
    if (n != 1) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "axis must be a single value");
    int nv = L->n_in - 1;
    int *in = kiln_arena_alloc(L->g->mem, sizeof(int) * (size_t)(nv + 1));
    if (!in) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int k = 0; k < nv; k++)
        if ((st = tfo_in_value(L, v2 ? k : k + 1, &in[k])) != KILN_OK) return st;
    if (nv == 1) return tfo_out1(L, in[0]);
    struct emit em;
    int y = -1;
    if ((st = tfo_node_begin(L, KILN_OP_Concat, nv, in, 1, 1, &em)) != KILN_OK) return st;
    tfo_a_int(&em, "axis", axis);
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_pack(L_t *L, const struct tf_op *e)
{
    (void)e;
    if (L->n_in < 1) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "has no inputs");
    int64_t axis = tfo_attr_int(L, "axis", 0);
    int *in = kiln_arena_alloc(L->g->mem, sizeof(int) * (size_t)(L->n_in + 1));
    if (!in) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kiln_status st;
    for (int k = 0; k < L->n_in; k++) {
        int x = -1;
        if ((st = tfo_in_value(L, k, &x)) != KILN_OK) return st;
        if ((st = tfo_axes_node(L, KILN_OP_Unsqueeze, x, 1, &axis, &in[k])) != KILN_OK) return st;
    }
    if (L->n_in == 1) return tfo_out1(L, in[0]);
    struct emit em;
    int y = -1;
    if ((st = tfo_node_begin(L, KILN_OP_Concat, L->n_in, in, 1, 1, &em)) != KILN_OK) return st;
    tfo_a_int(&em, "axis", axis);
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

static kiln_status split_equal(L_t *L, int x, int64_t axis, int num, int *outs)
{
    if (num < 1 || num > KILN_MAX_IO) return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "splits into %d parts", num);
    struct emit em;
    kiln_status st = tfo_node_begin(L, KILN_OP_Split, 1, &x, num, 2, &em);
    if (st != KILN_OK) return st;
    tfo_a_int(&em, "axis", axis);
    tfo_a_int(&em, "num_outputs", num);
    return tfo_node_end(&em, outs);
}

kiln_status tfo_lw_unpack(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st != KILN_OK) return st;
    int64_t num = tfo_attr_int(L, "num", -1), axis = tfo_attr_int(L, "axis", 0);
    if (num < 1 || num > KILN_MAX_IO)
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "num is %lld", (long long)num);
    int parts[KILN_MAX_IO];
    if (num == 1) parts[0] = x;
    else if ((st = split_equal(L, x, axis, (int)num, parts)) != KILN_OK) return st;
    if ((st = tfo_set_outputs(L, (int)num)) != KILN_OK) return st;
    for (int k = 0; k < num; k++)
        if ((st = tfo_axes_node(L, KILN_OP_Squeeze, parts[k], 1, &axis, &L->out[k].v)) != KILN_OK)
            return st;
    return KILN_OK;
}

kiln_status tfo_lw_split(L_t *L, const struct tf_op *e)
{
    int x = -1, n = -1;
    int64_t axis = 0;
    bool v = e->arg == TFV_SPLIT_V; /* SplitV(value, size_splits, axis) */
    kiln_status st = tfo_need_const_ints(L, v ? 2 : 0, &axis, 1, &n, "split_dim");
    if (st == KILN_OK) st = tfo_in_value(L, v ? 0 : 1, &x);
    if (st != KILN_OK) return st;
    if (n != 1) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "split_dim must be a single value");
    int64_t num = tfo_attr_int(L, v ? "num_split" : "num_split", -1);
    int parts[KILN_MAX_IO];
    if (!v) {
        if (num < 1 || num > KILN_MAX_IO) return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "num_split is %lld", (long long)num);
        if (num == 1) parts[0] = x;
        else if ((st = split_equal(L, x, axis, (int)num, parts)) != KILN_OK) return st;
    } else {
        int64_t sizes[KILN_MAX_IO];
        int ns = -1;
        if ((st = tfo_need_const_ints(L, 1, sizes, KILN_MAX_IO, &ns, "size_splits")) != KILN_OK) return st;
        num = ns;
        int unknown = -1;
        int64_t known = 0;
        for (int i = 0; i < ns; i++) {
            if (sizes[i] == -1 && unknown < 0) unknown = i;
            else if (sizes[i] < 0) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "size_splits has %lld", (long long)sizes[i]);
            else known += sizes[i];
        }
        if (unknown >= 0) {
            const struct kiln_type *xt = tfo_vtype(L, x);
            int64_t ax = axis < 0 ? axis + xt->rank : axis;
            if (xt->rank < 0 || ax < 0 || ax >= xt->rank || xt->dims[ax] < 0)
                return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "size_splits of -1 needs a known dim");
            sizes[unknown] = xt->dims[ax] - known;
        }
        if (ns == 1) {
            parts[0] = x;
        } else {
            int sv = -1;
            if ((st = tfo_const_i64(L, 1, ns, sizes, &sv)) != KILN_OK) return st;
            struct emit em;
            int in[2] = {x, sv};
            if ((st = tfo_node_begin(L, KILN_OP_Split, 2, in, ns, 1, &em)) != KILN_OK) return st;
            tfo_a_int(&em, "axis", axis);
            if ((st = tfo_node_end(&em, parts)) != KILN_OK) return st;
        }
    }
    if ((st = tfo_set_outputs(L, (int)num)) != KILN_OK) return st;
    for (int k = 0; k < num; k++) L->out[k].v = parts[k];
    return KILN_OK;
}

kiln_status tfo_lw_reshape(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1, s = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &s);
    if (st == KILN_OK) st = tfo_i64_vector(L, s, &s);
    if (st != KILN_OK) return st;
    struct emit em;
    int in[2] = {x, s};
    if ((st = tfo_node_begin(L, KILN_OP_Reshape, 2, in, 1, 1, &em)) != KILN_OK) return st;
    tfo_a_int(&em, "allowzero", 1);
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_squeeze(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st != KILN_OK) return st;
    const int64_t *dims;
    int n = tfo_attr_ints(L, "squeeze_dims", &dims);
    if (n < 0) n = tfo_attr_ints(L, "axis", &dims);
    if (n > 0) st = tfo_axes_node(L, KILN_OP_Squeeze, x, n, dims, &y);
    else st = tfo_un(L, KILN_OP_Squeeze, x, &y);
    if (st != KILN_OK) return st;
    return tfo_out1(L, y);
}

/* ExpandDims(x, axis) and Tile(x, multiples): e->op with the second input
 * as an int64 vector (Unsqueeze axes, Tile repeats). */
kiln_status tfo_lw_with_i64_vector(L_t *L, const struct tf_op *e)
{
    int x = -1, d = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &d);
    if (st == KILN_OK) st = tfo_i64_vector(L, d, &d);
    if (st == KILN_OK) st = tfo_bin(L, e->op, x, d, &y);
    if (st == KILN_OK) st = tfo_out1(L, y);
    return st;
}

kiln_status tfo_lw_transpose(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1, y = -1, n = -1;
    int64_t perm[KILN_MAX_RANK];
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_need_const_ints(L, 1, perm, KILN_MAX_RANK, &n, "perm");
    if (st == KILN_OK) st = tfo_transpose(L, x, n, perm, &y);
    if (st == KILN_OK) st = tfo_out1(L, y);
    return st;
}

kiln_status tfo_lw_shape(L_t *L, const struct tf_op *e)
{
    kiln_dtype ot = tfo_attr_dtype(L, "out_type");
    if (ot == KILN_DTYPE_UNDEFINED) ot = KILN_DTYPE_I32;
    kiln_status st;
    int n = e->arg == TFV_SHAPE_N ? L->n_in : 1;
    if ((st = tfo_set_outputs(L, n)) != KILN_OK) return st;
    for (int k = 0; k < n; k++) {
        int x = -1, y = -1;
        if ((st = tfo_in_value(L, k, &x)) != KILN_OK) return st;
        const struct kiln_type *t = tfo_vtype(L, x);
        if (e->arg == TFV_SIZE) {
            if ((st = tfo_un(L, KILN_OP_Size, x, &y)) != KILN_OK) return st;
        } else if (e->arg == TFV_RANK) {
            if (t->rank >= 0) {
                int64_t r = t->rank;
                if ((st = tfo_const_i64(L, 0, 1, &r, &y)) != KILN_OK) return st;
            } else {
                int s = -1;
                if ((st = tfo_un(L, KILN_OP_Shape, x, &s)) != KILN_OK) return st;
                if ((st = tfo_un(L, KILN_OP_Size, s, &y)) != KILN_OK) return st;
            }
            ot = KILN_DTYPE_I32;
        } else if (kiln_type_is_concrete(t)) {
            if ((st = tfo_const_i64(L, 1, t->rank, t->dims, &y)) != KILN_OK) return st;
        } else {
            if ((st = tfo_un(L, KILN_OP_Shape, x, &y)) != KILN_OK) return st;
        }
        if ((st = tfo_cast_to(L, y, ot, &y)) != KILN_OK) return st;
        L->out[k].v = y;
    }
    return KILN_OK;
}

kiln_status tfo_lw_fill(L_t *L, const struct tf_op *e)
{
    int a = -1, b = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &a);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &b);
    if (st != KILN_OK) return st;
    /* Fill(dims, value) and BroadcastTo(input, shape) are both Expand */
    bool fill = e->arg != TFV_BROADCAST_TO;
    int x = fill ? b : a, s = fill ? a : b;
    if ((st = tfo_i64_vector(L, s, &s)) != KILN_OK) return st;
    if ((st = tfo_bin(L, KILN_OP_Expand, x, s, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

/* Pad, PadV2, MirrorPad: paddings [rank, 2] -> ONNX pads [begins..., ends...]. */
kiln_status tfo_lw_pad(L_t *L, const struct tf_op *e)
{
    int x = -1, p = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &p);
    if (st == KILN_OK) st = tfo_cast_to(L, p, KILN_DTYPE_I64, &p);
    if (st != KILN_OK) return st;
    static const int64_t T10[2] = {1, 0};
    int64_t m1 = -1;
    if ((st = tfo_transpose(L, p, 2, T10, &p)) != KILN_OK) return st;
    if ((st = tfo_reshape_to(L, p, 1, &m1, &p)) != KILN_OK) return st;
    const char *mode = "constant";
    int nin = 2;
    int in[3] = {x, p, -1};
    if (e->arg == TFV_PAD_V2 && L->n_in > 2) {
        if ((st = tfo_in_value(L, 2, &in[2])) != KILN_OK) return st;
        nin = 3;
    } else if (e->arg == TFV_MIRROR_PAD) {
        const char *m = tfo_attr_str(L, "mode", "REFLECT");
        if (strcmp(m, "REFLECT") != 0)
            return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "mode '%s' is not supported (only REFLECT)", m);
        mode = "reflect";
    }
    struct emit em;
    if ((st = tfo_node_begin(L, KILN_OP_Pad, nin, in, 1, 1, &em)) != KILN_OK) return st;
    if ((st = tfo_a_str(&em, "mode", mode, strlen(mode))) != KILN_OK) return st;
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_slice(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1, b = -1, s = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &b);
    if (st == KILN_OK) st = tfo_in_value(L, 2, &s);
    if (st == KILN_OK) st = tfo_i64_vector(L, b, &b);
    if (st == KILN_OK) st = tfo_i64_vector(L, s, &s);
    if (st != KILN_OK) return st;
    /* ends = size == -1 ? INT64_MAX : begin + size */
    int m1 = -1, big = -1, isall = -1, sum = -1, ends = -1;
    const int64_t minus1 = -1, maxv = INT64_MAX;
    if ((st = tfo_const_i64(L, 0, 1, &minus1, &m1)) != KILN_OK) return st;
    if ((st = tfo_const_i64(L, 0, 1, &maxv, &big)) != KILN_OK) return st;
    if ((st = tfo_bin(L, KILN_OP_Equal, s, m1, &isall)) != KILN_OK) return st;
    if ((st = tfo_bin(L, KILN_OP_Add, b, s, &sum)) != KILN_OK) return st;
    int in3[3] = {isall, big, sum};
    if ((st = tfo_op1(L, KILN_OP_Where, 3, in3, &ends)) != KILN_OK) return st;
    int in[3] = {x, b, ends};
    if ((st = tfo_op1(L, KILN_OP_Slice, 3, in, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

/* ReverseV2(x, axes): Slice with step -1 over each (constant) axis, as Keras'
 * go_backwards and Bidirectional layers reverse their sequences. */
kiln_status tfo_lw_reverse(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1, y = -1, n = 0;
    int64_t axes[KILN_MAX_RANK];
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_need_const_ints(L, 1, axes, KILN_MAX_RANK, &n, "axis");
    if (st != KILN_OK) return st;
    if (n == 0) return tfo_out1(L, x);
    int64_t starts[KILN_MAX_RANK], ends[KILN_MAX_RANK], steps[KILN_MAX_RANK];
    for (int i = 0; i < n; i++) {
        starts[i] = -1;
        ends[i] = INT64_MIN;
        steps[i] = -1;
    }
    int in[5] = {x, -1, -1, -1, -1};
    if ((st = tfo_const_i64(L, 1, n, starts, &in[1])) != KILN_OK) return st;
    if ((st = tfo_const_i64(L, 1, n, ends, &in[2])) != KILN_OK) return st;
    if ((st = tfo_const_i64(L, 1, n, axes, &in[3])) != KILN_OK) return st;
    if ((st = tfo_const_i64(L, 1, n, steps, &in[4])) != KILN_OK) return st;
    if ((st = tfo_op1(L, KILN_OP_Slice, 5, in, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

/* StridedSlice with constant begin/end/strides: the sparse spec (with its
 * masks) expanded over the input's dims, then Slice + Squeeze (shrunk dims)
 * + Unsqueeze (new axes). */
kiln_status tfo_lw_strided_slice(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1, nb = -1, ne = -1, ns = -1;
    int64_t b[KILN_MAX_RANK * 2], en[KILN_MAX_RANK * 2], s[KILN_MAX_RANK * 2];
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_need_const_ints(L, 1, b, 2 * KILN_MAX_RANK, &nb, "begin");
    if (st == KILN_OK) st = tfo_need_const_ints(L, 2, en, 2 * KILN_MAX_RANK, &ne, "end");
    if (st == KILN_OK) st = tfo_need_const_ints(L, 3, s, 2 * KILN_MAX_RANK, &ns, "strides");
    if (st != KILN_OK) return st;
    if (nb != ne || nb != ns)
        return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "begin, end and strides have %d, %d and %d values",
                    nb, ne, ns);
    int64_t bm = tfo_attr_int(L, "begin_mask", 0), em_ = tfo_attr_int(L, "end_mask", 0);
    int64_t ell = tfo_attr_int(L, "ellipsis_mask", 0), na = tfo_attr_int(L, "new_axis_mask", 0);
    int64_t sh = tfo_attr_int(L, "shrink_axis_mask", 0);
    int rank = tfo_vtype(L, x)->rank;
    int n_ell = 0, n_real = 0;
    for (int i = 0; i < nb; i++) {
        if (ell >> i & 1) n_ell++;
        else if (!(na >> i & 1)) n_real++;
    }
    if (n_ell > 1) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "has more than one ellipsis");
    if (n_ell && rank < 0) return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "an ellipsis needs an input of known rank");
    /* dense spec over input dims: dims not mentioned are taken whole */
    int64_t starts[KILN_MAX_RANK], ends[KILN_MAX_RANK], steps[KILN_MAX_RANK], axes[KILN_MAX_RANK];
    int64_t squeeze[KILN_MAX_RANK], newax[KILN_MAX_RANK * 2];
    int n_sl = 0, n_sq = 0, n_new = 0;
    int d = 0;     /* input dim */
    int od = 0;    /* output dim after squeeze and unsqueeze */
    for (int i = 0; i < nb; i++) {
        if (ell >> i & 1) {
            int cover = rank - n_real;
            if (cover < 0) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "indexes more dims than the input has");
            d += cover;
            od += cover;
            continue;
        }
        if (na >> i & 1) {
            newax[n_new++] = od++;
            continue;
        }
        if (d >= KILN_MAX_RANK || (rank >= 0 && d >= rank))
            return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "indexes more dims than the input has");
        if (s[i] == 0) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "stride %d is 0", i);
        bool shrink = sh >> i & 1;
        int64_t st0, en0, step = s[i];
        if (shrink) {
            st0 = b[i];
            en0 = b[i] == -1 ? INT64_MAX : b[i] + 1;
            step = 1;
            squeeze[n_sq++] = d;
        } else {
            st0 = (bm >> i & 1) ? (step > 0 ? 0 : INT64_MAX) : b[i];
            en0 = (em_ >> i & 1) ? (step > 0 ? INT64_MAX : INT64_MIN) : en[i];
            od++;
        }
        bool whole = !shrink && step == 1 && st0 == 0 && en0 == INT64_MAX;
        if (!whole) {
            starts[n_sl] = st0;
            ends[n_sl] = en0;
            steps[n_sl] = step;
            axes[n_sl] = d;
            n_sl++;
        }
        d++;
    }
    int y = x;
    if (n_sl > 0) {
        int cs = -1, ce = -1, ca = -1, cst = -1;
        if ((st = tfo_const_i64(L, 1, n_sl, starts, &cs)) != KILN_OK) return st;
        if ((st = tfo_const_i64(L, 1, n_sl, ends, &ce)) != KILN_OK) return st;
        if ((st = tfo_const_i64(L, 1, n_sl, axes, &ca)) != KILN_OK) return st;
        if ((st = tfo_const_i64(L, 1, n_sl, steps, &cst)) != KILN_OK) return st;
        int in[5] = {x, cs, ce, ca, cst};
        if ((st = tfo_op1(L, KILN_OP_Slice, 5, in, &y)) != KILN_OK) return st;
    }
    if (n_sq > 0 && (st = tfo_axes_node(L, KILN_OP_Squeeze, y, n_sq, squeeze, &y)) != KILN_OK) return st;
    if (n_new > 0 && (st = tfo_axes_node(L, KILN_OP_Unsqueeze, y, n_new, newax, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_gather(L_t *L, const struct tf_op *e)
{
    int p = -1, i = -1, y = -1, n = -1;
    int64_t axis = 0;
    kiln_status st = tfo_in_value(L, 0, &p);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &i);
    if (st != KILN_OK) return st;
    if (e->arg == TFV_GATHER_V2) {
        if ((st = tfo_need_const_ints(L, 2, &axis, 1, &n, "axis")) != KILN_OK) return st;
        if (n != 1) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "axis must be a single value");
        if (tfo_attr_int(L, "batch_dims", 0) != 0)
            return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "batch_dims other than 0 is not supported");
    }
    if (e->arg == TFV_GATHER_ND) {
        st = tfo_bin(L, KILN_OP_GatherND, p, i, &y);
    } else {
        struct emit em;
        int in[2] = {p, i};
        if ((st = tfo_node_begin(L, KILN_OP_Gather, 2, in, 1, 1, &em)) != KILN_OK) return st;
        tfo_a_int(&em, "axis", axis);
        st = tfo_node_end(&em, &y);
    }
    if (st != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_range(L_t *L, const struct tf_op *e)
{
    (void)e;
    int a = -1, b = -1, c = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &a);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &b);
    if (st == KILN_OK) st = tfo_in_value(L, 2, &c);
    if (st != KILN_OK) return st;
    int in[3] = {a, b, c};
    if ((st = tfo_op1(L, KILN_OP_Range, 3, in, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}
/* OneHot: along the last axis as Equal(indices, range) (TF's rule that
 * out-of-range indices, -1 included, give an all-off row); other axes
 * through ONNX OneHot. */
kiln_status tfo_lw_one_hot(L_t *L, const struct tf_op *e)
{
    (void)e;
    int idx = -1, depth = -1, on = -1, off = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &idx);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &depth);
    if (st == KILN_OK) st = tfo_in_value(L, 2, &on);
    if (st == KILN_OK) st = tfo_in_value(L, 3, &off);
    if (st != KILN_OK) return st;
    int64_t axis = tfo_attr_int(L, "axis", -1);
    int r = tfo_vtype(L, idx)->rank;
    if (axis == -1 || (r >= 0 && axis == r)) {
        int zero = -1, one = -1, rng = -1, ix = -1, eq = -1;
        kiln_dtype it = tfo_vtype(L, idx)->dtype != KILN_DTYPE_UNDEFINED ? tfo_vtype(L, idx)->dtype : KILN_DTYPE_I64;
        int64_t m1 = -1;
        if ((st = tfo_cast_to(L, depth, it, &depth)) != KILN_OK) return st;
        if ((st = tfo_const_scalar(L, it, 0, &zero)) != KILN_OK) return st;
        if ((st = tfo_const_scalar(L, it, 1, &one)) != KILN_OK) return st;
        int in3[3] = {zero, depth, one};
        if ((st = tfo_op1(L, KILN_OP_Range, 3, in3, &rng)) != KILN_OK) return st;
        if ((st = tfo_axes_node(L, KILN_OP_Unsqueeze, idx, 1, &m1, &ix)) != KILN_OK) return st;
        if ((st = tfo_bin(L, KILN_OP_Equal, ix, rng, &eq)) != KILN_OK) return st;
        int in[3] = {eq, on, off};
        if ((st = tfo_op1(L, KILN_OP_Where, 3, in, &y)) != KILN_OK) return st;
        return tfo_out1(L, y);
    }
    int64_t one = 1;
    int offv = -1, onv = -1, vals = -1;
    if ((st = tfo_reshape_to(L, off, 1, &one, &offv)) != KILN_OK) return st;
    if ((st = tfo_reshape_to(L, on, 1, &one, &onv)) != KILN_OK) return st;
    struct emit em;
    int cin[2] = {offv, onv};
    if ((st = tfo_node_begin(L, KILN_OP_Concat, 2, cin, 1, 1, &em)) != KILN_OK) return st;
    tfo_a_int(&em, "axis", 0);
    if ((st = tfo_node_end(&em, &vals)) != KILN_OK) return st;
    int in[3] = {idx, depth, vals};
    if ((st = tfo_node_begin(L, KILN_OP_OneHot, 3, in, 1, 1, &em)) != KILN_OK) return st;
    tfo_a_int(&em, "axis", axis);
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_where1(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1, nz = -1, y = -1;
    if (L->n_in != 1) return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "with %d inputs is not supported", L->n_in);
    static const int64_t T10[2] = {1, 0};
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_un(L, KILN_OP_NonZero, x, &nz);
    if (st == KILN_OK) st = tfo_transpose(L, nz, 2, T10, &y);
    if (st == KILN_OK) st = tfo_out1(L, y);
    return st;
}
