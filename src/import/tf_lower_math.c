/*
 * tf_lower_math.c - TensorFlow linear algebra, reductions and scans to Kiln IR:
 * MatMul and BatchMatMul (transpose flags become Transposes), Einsum, the
 * reductions (keep_dims, constant axes), ArgMax/ArgMin, Cumsum/Cumprod and
 * TopKV2.
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

/* MatMul and BatchMatMul: transpose flags become Transposes of the last two dims. */
kiln_status tfo_lw_matmul(L_t *L, const struct tf_op *e)
{
    int a = -1, b = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &a);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &b);
    if (st != KILN_OK) return st;
    bool batch = e->arg == TFV_BATCH;
    bool ta = batch ? tfo_attr_bool(L, "adj_x", false) : tfo_attr_bool(L, "transpose_a", false);
    bool tb = batch ? tfo_attr_bool(L, "adj_y", false) : tfo_attr_bool(L, "transpose_b", false);
    for (int k = 0; k < 2; k++) {
        if (!(k == 0 ? ta : tb)) continue;
        int *v = k == 0 ? &a : &b;
        int r = batch ? tfo_vtype(L, *v)->rank : 2;
        if (r < 2) return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "transposing an input of unknown rank");
        int64_t perm[KILN_MAX_RANK];
        for (int i = 0; i < r; i++) perm[i] = i;
        perm[r - 2] = r - 1;
        perm[r - 1] = r - 2;
        if ((st = tfo_transpose(L, *v, r, perm, v)) != KILN_OK) return st;
    }
    if ((st = tfo_bin(L, KILN_OP_MatMul, a, b, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}
/* ---- reductions ---- */

kiln_status tfo_lw_reduce(L_t *L, const struct tf_op *e)
{
    int x = -1, axes = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &axes);
    if (st == KILN_OK) st = tfo_i64_vector(L, axes, &axes);
    if (st != KILN_OK) return st;
    bool keep = tfo_attr_bool(L, "keep_dims", false);
    bool logical = e->arg == TFV_LOGICAL; /* All / Any over bools: Min / Max over 0/1 */
    if (logical && (st = tfo_cast_to(L, x, KILN_DTYPE_I32, &x)) != KILN_OK) return st;
    struct emit em;
    int in[2] = {x, axes};
    if ((st = tfo_node_begin(L, e->op, 2, in, 1, 2, &em)) != KILN_OK) return st;
    tfo_a_int(&em, "keepdims", keep);
    tfo_a_int(&em, "noop_with_empty_axes", 1);
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    if (logical && (st = tfo_cast_to(L, y, KILN_DTYPE_BOOL, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_argmax(L_t *L, const struct tf_op *e)
{
    int x = -1, y = -1;
    int64_t axis = 0;
    int n = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_need_const_ints(L, 1, &axis, 1, &n, "dimension");
    if (st != KILN_OK) return st;
    if (n != 1) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "dimension must be a single value");
    struct emit em;
    if ((st = tfo_node_begin(L, e->op, 1, &x, 1, 2, &em)) != KILN_OK) return st;
    tfo_a_int(&em, "axis", axis);
    tfo_a_int(&em, "keepdims", 0);
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    kiln_dtype ot = tfo_attr_dtype(L, "output_type");
    if (ot != KILN_DTYPE_UNDEFINED && (st = tfo_cast_to(L, y, ot, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}
kiln_status tfo_lw_cumsum(L_t *L, const struct tf_op *e)
{
    int x = -1, a = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &a);
    if (st != KILN_OK) return st;
    struct emit em;
    int in[2] = {x, a};
    if ((st = tfo_node_begin(L, e->op, 2, in, 1, 2, &em)) != KILN_OK) return st;
    tfo_a_int(&em, "exclusive", tfo_attr_bool(L, "exclusive", false));
    tfo_a_int(&em, "reverse", tfo_attr_bool(L, "reverse", false));
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_einsum(L_t *L, const struct tf_op *e)
{
    (void)e;
    if (L->n_in < 1 || L->n_in > KILN_MAX_IO) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "has %d inputs", L->n_in);
    int in[KILN_MAX_IO], y;
    kiln_status st;
    for (int k = 0; k < L->n_in; k++)
        if ((st = tfo_in_value(L, k, &in[k])) != KILN_OK) return st;
    const char *eq = tfo_attr_str(L, "equation", NULL);
    if (!eq) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "has no equation");
    struct emit em;
    if ((st = tfo_node_begin(L, KILN_OP_Einsum, L->n_in, in, 1, 1, &em)) != KILN_OK) return st;
    if ((st = tfo_a_str(&em, "equation", eq, strlen(eq))) != KILN_OK) return st;
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_topk(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1, k = -1, outs[2];
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &k);
    if (st == KILN_OK) st = tfo_i64_vector(L, k, &k);
    if (st != KILN_OK) return st;
    struct emit em;
    int in[2] = {x, k};
    if ((st = tfo_node_begin(L, KILN_OP_TopK, 2, in, 2, 3, &em)) != KILN_OK) return st;
    tfo_a_int(&em, "axis", -1);
    tfo_a_int(&em, "largest", 1);
    tfo_a_int(&em, "sorted", tfo_attr_bool(L, "sorted", true));
    if ((st = tfo_node_end(&em, outs)) != KILN_OK) return st;
    kiln_dtype it = tfo_attr_dtype(L, "index_type");
    if ((st = tfo_cast_to(L, outs[1], it != KILN_DTYPE_UNDEFINED ? it : KILN_DTYPE_I32, &outs[1])) != KILN_OK)
        return st;
    if ((st = tfo_set_outputs(L, 2)) != KILN_OK) return st;
    L->out[0].v = outs[0];
    L->out[1].v = outs[1];
    return KILN_OK;
}
