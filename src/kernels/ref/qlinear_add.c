/*
 * qlinear_add.c - reference kernel for KilnQLinearAdd, the quantized
 * residual Add the qadd_fusion pass (src/opt/qadd.c) makes of
 * Q(Relu(DQ(a) + DQ(b))) in a static int8 graph: inputs a, a_scale, a_zp,
 * b, b_scale, b_zp, y_scale, y_zp (zero points optional, scales and zero
 * points one value each), a and b of the same shape, attribute activation
 * "Relu" or none. The arithmetic is the float32 one of the nodes it
 * replaces, bit for bit:
 *   s = (float(a) - a_zp) * a_scale + (float(b) - b_zp) * b_scale   (float32)
 *   s = max(s, 0)                                                   (Relu)
 *   y = saturate(rint(s / y_scale) + y_zp)      (round half to even, NaN -> 0)
 * Y has y_zp's dtype (a's when y_zp is absent), int8 or uint8. The fast
 * kernel is in src/kernels/simd/quant8.c.
 *
 * Also KilnQLinearConvAdd, what the qconv_sum pass (src/opt/qconv_sum.c)
 * makes of a QLinearConv whose only reader is such an Add: the reference
 * QLinearConv into a temporary, then the Add above (its fast kernel, a
 * oneDNN sum post-op, is in src/kernels/dnnl/qlinear.c).
 */
#include <math.h>
#include <string.h>

#include "core/tensor.h"
#include "kernels/kernel.h"
#include "kiln/kiln.h"

static bool q8(kiln_dtype dt) { return dt == KILN_DTYPE_I8 || dt == KILN_DTYPE_U8; }

static kiln_status qadd_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    const struct kiln_type *a = ctx->in[0], *b = ctx->in[3];
    struct kiln_type *y = ctx->out[0];
    kiln_type_unknown(y);
    y->dtype = ctx->n_in > 7 && ctx->in[7] ? ctx->in[7]->dtype
               : a                         ? a->dtype
                                           : KILN_DTYPE_UNDEFINED;
    if (!a || !b || a->rank < 0) return KILN_OK;
    if (b->rank >= 0) {
        if (a->rank != b->rank)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "a and b must have the same shape, got ranks %d and %d",
                                   a->rank, b->rank);
        for (int d = 0; d < a->rank; d++)
            if (a->dims[d] >= 0 && b->dims[d] >= 0 && a->dims[d] != b->dims[d])
                return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                       "a and b must have the same shape, dim %d is %lld and %lld",
                                       d, (long long)a->dims[d], (long long)b->dims[d]);
    }
    kiln_dtype dt = y->dtype;
    *y = *a;
    y->dtype = dt;
    return KILN_OK;
}

/* The one value of scale input i (required) or zero point input i (absent: 0). */
static kiln_status one(const struct kiln_run_ctx *ctx, int i, bool required, float *out)
{
    const kiln_tensor *t = ctx->n_in > i ? ctx->in[i] : NULL;
    *out = 0.0f;
    if (!t) {
        if (required)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "input %d (a scale) is required", i);
        return KILN_OK;
    }
    if (kiln_tensor_count(t) != 1)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "input %d must hold one value, got %lld", i,
                               (long long)kiln_tensor_count(t));
    *out = (float)kiln_get_f64(t->dtype, t->data, 0);
    return KILN_OK;
}

/* y = Q(act(DQ(a) + DQ(b))) with the parameters at inputs pi (a_scale, a_zp), pi + 3
 * (b_scale, b_zp) and pi + 5 (y_scale, y_zp) of ctx. */
static kiln_status qadd_apply(const struct kiln_run_ctx *ctx, const kiln_tensor *a, int pa,
                              const kiln_tensor *b, int pb, int py, kiln_tensor *y)
{
    const struct kiln_node *node = ctx->node;
    if (!q8(a->dtype) || !q8(b->dtype) || !q8(y->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                               "a, b and y must be int8 or uint8, got %s, %s and %s",
                               kiln_dtype_name(a->dtype), kiln_dtype_name(b->dtype),
                               kiln_dtype_name(y->dtype));
    int64_t n = kiln_tensor_count(a);
    if (kiln_tensor_count(b) != n || kiln_tensor_count(y) != n)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "a, b and y must have the same size, got %lld, %lld and %lld",
                               (long long)n, (long long)kiln_tensor_count(b),
                               (long long)kiln_tensor_count(y));
    const char *act = kiln_attr_str(node, "activation", "");
    if (act[0] && strcmp(act, "Relu"))
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "activation '%s' is not Relu", act);
    bool relu = act[0] != 0;
    float sa, za, sb, zb, sy, zy;
    kiln_status st = one(ctx, pa, true, &sa);
    if (st == KILN_OK) st = one(ctx, pa + 1, false, &za);
    if (st == KILN_OK) st = one(ctx, pb, true, &sb);
    if (st == KILN_OK) st = one(ctx, pb + 1, false, &zb);
    if (st == KILN_OK) st = one(ctx, py, true, &sy);
    if (st == KILN_OK) st = one(ctx, py + 1, false, &zy);
    if (st != KILN_OK) return st;
    double lo = y->dtype == KILN_DTYPE_I8 ? -128 : 0, hi = y->dtype == KILN_DTYPE_I8 ? 127 : 255;
    for (int64_t i = 0; i < n; i++) {
        float fa = ((float)kiln_get_i64(a->dtype, a->data, i) - za) * sa;
        float fb = ((float)kiln_get_i64(b->dtype, b->data, i) - zb) * sb;
        float s = fa + fb;
        if (relu && !(s >= 0.0f)) s = isnan(s) ? s : 0.0f;
        double v = rint((double)(s / sy)) + (double)zy;
        v = isnan(v) ? 0 : v < lo ? lo : v > hi ? hi : v;
        kiln_set_i64(y->dtype, y->data, i, (int64_t)v);
    }
    return KILN_OK;
}

static kiln_status qadd_run(struct kiln_run_ctx *ctx)
{
    return qadd_apply(ctx, ctx->in[0], 1, ctx->in[3], 4, 6, ctx->out[0]);
}

KILN_REF_OP(KilnQLinearAdd, qadd_infer, qadd_run);

/* ---- KilnQLinearConvAdd: QLinearConv (inputs 0-8, its y_scale / y_zp are a's) whose
 * 8-bit output a is added to b (input 9) as KilnQLinearAdd does: b_scale, b_zp,
 * y_scale, y_zp at inputs 10-13. Exactly the two reference kernels one after the other. */

static kiln_status qconv_add_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    const struct kiln_op_impl *conv = kiln_op_impl(KILN_OP_QLinearConv);
    if (!conv || !conv->infer)
        return kiln_node_error(ctx->node, KILN_ERR_INTERNAL, "no QLinearConv shape rule");
    struct kiln_infer_ctx c2 = *ctx;
    c2.n_in = ctx->n_in < 9 ? ctx->n_in : 9;
    kiln_status st = conv->infer(&c2);
    if (st != KILN_OK) return st;
    struct kiln_type *y = ctx->out[0];
    const struct kiln_type *b = ctx->n_in > 9 ? ctx->in[9] : NULL;
    if (ctx->n_in > 13 && ctx->in[13]) y->dtype = ctx->in[13]->dtype;
    if (b && b->rank >= 0 && y->rank >= 0) {
        bool same = b->rank == y->rank;
        for (int d = 0; same && d < y->rank; d++)
            if (y->dims[d] >= 0 && b->dims[d] >= 0 && y->dims[d] != b->dims[d]) same = false;
        if (!same)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "b must have the convolution's output shape");
    }
    return KILN_OK;
}

static kiln_status qconv_add_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_op_impl *conv = kiln_op_impl(KILN_OP_QLinearConv);
    if (ctx->n_in < 14 || !ctx->in[9] || !conv || !conv->run)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "expected 14 inputs, b present");
    const kiln_tensor *y = ctx->out[0];
    kiln_dtype adt = ctx->in[7] ? ctx->in[7]->dtype : ctx->in[0]->dtype; /* QLinearConv's rule */
    kiln_tensor *a = NULL;
    kiln_status st = kiln_tensor_new_uninit(adt, y->rank, y->dims, &a);
    if (st != KILN_OK) return st;
    struct kiln_run_ctx c2 = *ctx;
    c2.n_in = 9;
    c2.n_out = 1;
    c2.out = &a;
    st = conv->run(&c2);
    if (st == KILN_OK) st = qadd_apply(ctx, a, 6, ctx->in[9], 10, 12, ctx->out[0]);
    kiln_tensor_free(a);
    return st;
}

KILN_REF_OP(KilnQLinearConvAdd, qconv_add_infer, qconv_add_run);
