/*
 * qlinear_fused.c - reference kernel for KilnQLinearMatMul, the quantized
 * product the qdq_fusion pass (src/opt/qdq.c) makes from a QDQ-quantized
 * MatMul or Gemm: QLinearMatMul's eight inputs, with B a 2-D [K, N]
 * matrix, plus an optional int32 bias [N] in the accumulator's scale
 * (a_scale * b_scale[n]), as QLinearConv takes it.
 *
 *   acc[m, n] = sum_k (A[m, k] - a_zp) * (B[k, n] - b_zp[n]) + bias[n]   (exact integers)
 *   Y[m, n]   = saturate(rint(acc * mult[n]) + y_zp),
 *   mult[n]   = float32(float32(a_scale * b_scale[n]) / y_scale)
 *
 * the same multiplier and rounding as the QLinearMatMul and QLinearConv
 * reference kernels (rint rounds half to even). A may have any rank >= 2;
 * its leading dims are rows. b_scale and b_zp hold one value or one per
 * column; a_scale, a_zp, y_scale and y_zp one value. Y has y_zp's dtype
 * (A's when y_zp is absent), int8 or uint8. The fast kernel is in
 * src/kernels/dnnl/qlinear.c.
 */
#include <stdlib.h>

#include "kernels/kernel.h"

static bool q8(kiln_dtype dt) { return dt == KILN_DTYPE_I8 || dt == KILN_DTYPE_U8; }

static kiln_status qmm_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    const struct kiln_type *a = ctx->in[0], *b = ctx->in[3];
    struct kiln_type *y = ctx->out[0];
    kiln_type_unknown(y);
    y->dtype = ctx->n_in > 7 && ctx->in[7] ? ctx->in[7]->dtype
               : a                         ? a->dtype
                                           : KILN_DTYPE_UNDEFINED;
    if (!a || !b || a->rank < 0 || b->rank < 0) return KILN_OK;
    if (a->rank < 2 || b->rank != 2)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "A must have rank >= 2 and B rank 2, got %d and %d", a->rank,
                               b->rank);
    int64_t ka = a->dims[a->rank - 1], kb = b->dims[0];
    if (ka >= 0 && kb >= 0 && ka != kb)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "inner dims differ: A has %lld columns, B has %lld rows",
                               (long long)ka, (long long)kb);
    *y = *a;
    y->dtype = ctx->n_in > 7 && ctx->in[7] ? ctx->in[7]->dtype : a->dtype;
    y->dims[y->rank - 1] = b->dims[1];
    y->sym[y->rank - 1] = b->sym[1];
    return KILN_OK;
}

/* Element i of a parameter with one value or one per column. */
static double param(const kiln_tensor *t, int64_t i)
{
    return kiln_get_f64(t->dtype, t->data, kiln_tensor_count(t) == 1 ? 0 : i);
}

static kiln_status qmm_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *a = ctx->in[0], *as = ctx->in[1], *azp = ctx->in[2];
    const kiln_tensor *b = ctx->in[3], *bs = ctx->in[4], *bzp = ctx->in[5];
    const kiln_tensor *ys = ctx->in[6], *yzp = ctx->in[7];
    const kiln_tensor *bias = ctx->n_in > 8 ? ctx->in[8] : NULL;
    kiln_tensor *y = ctx->out[0];
    if (!as || !bs || !ys)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "scales are required");
    if (!q8(a->dtype) || !q8(b->dtype) || !q8(y->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                               "A, B and Y must be int8 or uint8, got %s, %s and %s",
                               kiln_dtype_name(a->dtype), kiln_dtype_name(b->dtype),
                               kiln_dtype_name(y->dtype));
    int64_t k = b->dims[0], n = b->dims[1], m = k > 0 ? kiln_tensor_count(a) / k : 0;
    if (kiln_tensor_count(as) != 1 || kiln_tensor_count(ys) != 1 ||
        (azp && kiln_tensor_count(azp) != 1) || (yzp && kiln_tensor_count(yzp) != 1) ||
        (kiln_tensor_count(bs) != 1 && kiln_tensor_count(bs) != n) ||
        (bzp && kiln_tensor_count(bzp) != 1 && kiln_tensor_count(bzp) != n))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "scales and zero points must hold one value (b's: or one per "
                               "column of %lld)", (long long)n);
    if (bias && (bias->dtype != KILN_DTYPE_I32 || kiln_tensor_count(bias) != n))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "bias must be int32 with %lld values, got %s with %lld",
                               (long long)n, kiln_dtype_name(bias->dtype),
                               (long long)kiln_tensor_count(bias));
    float mult_a = (float)param(as, 0), fys = (float)param(ys, 0);
    int64_t za = azp ? (int64_t)param(azp, 0) : 0;
    double zy = yzp ? param(yzp, 0) : 0.0;
    double lo = y->dtype == KILN_DTYPE_I8 ? -128 : 0, hi = y->dtype == KILN_DTYPE_I8 ? 127 : 255;
    for (int64_t j = 0; j < n; j++) {
        float mult = (float)(mult_a * (float)param(bs, j)) / fys;
        int64_t zb = bzp ? (int64_t)param(bzp, j) : 0;
        int64_t bj = bias ? ((const int32_t *)bias->data)[j] : 0;
        for (int64_t i = 0; i < m; i++) {
            int64_t acc = bj;
            for (int64_t p = 0; p < k; p++)
                acc += (kiln_get_i64(a->dtype, a->data, i * k + p) - za) *
                       (kiln_get_i64(b->dtype, b->data, p * n + j) - zb);
            double v = rint((double)acc * (double)mult) + zy;
            v = v < lo ? lo : v > hi ? hi : v;
            kiln_set_f64(y->dtype, y->data, i * n + j, v);
        }
    }
    return KILN_OK;
}

KILN_REF_OP(KilnQLinearMatMul, qmm_infer, qmm_run);
