/*
 * lut8.c - reference kernel for KilnLut8, an elementwise function of an
 * 8-bit value read from a 256-entry table (made by the qlut_fusion pass,
 * src/opt/qlut.c, from DQ -> float elementwise ops [-> Q] chains such as
 * SiLU's DQ -> Sigmoid -> Mul -> Q): inputs x (uint8 or int8) and table
 * (256 values, uint8, int8 or float32), y[i] = table[x[i]] for uint8 x,
 * table[x[i] + 128] for int8 x; y has x's shape and the table's dtype. The
 * fast kernel is in src/kernels/simd/lut8.c.
 *
 * KilnLut8Mul and KilnLut8Pool read such a float table too, for the
 * squeeze-and-excitation that reads a float KilnLut8's output (EfficientNet's
 * SiLU after the depthwise convolution), in the float32 arithmetic of the
 * nodes they replace:
 *   KilnLut8Mul(x, table, s, y_scale[, y_zp]): x [N, C, ...], s [N or 1, C, 1...]:
 *     v = table[x] * s[n, c]; y = saturate(rint(v / y_scale) + y_zp)  (float32
 *     product and quotient, round half to even, NaN -> 0), y_zp's dtype (uint8
 *     when absent): the per-channel Mul and the QuantizeLinear after it;
 *   KilnLut8Pool(x, table): y[n, c] = (sum of table[x] over the plane, in order,
 *     in double) / plane size, as float32: GlobalAveragePool of the table's values.
 */
#include "kernels/kernel.h"

static bool lut_dtype(kiln_dtype d)
{
    return d == KILN_DTYPE_U8 || d == KILN_DTYPE_I8 || d == KILN_DTYPE_F32;
}

static kiln_status lut_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    const struct kiln_type *x = ctx->in[0], *t = ctx->in[1];
    struct kiln_type *y = ctx->out[0];
    kiln_type_unknown(y);
    if (t && t->dtype != KILN_DTYPE_UNDEFINED && !lut_dtype(t->dtype))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "table must be uint8, int8 or float32, got %s",
                               kiln_dtype_name(t->dtype));
    if (t && t->rank >= 0 && kiln_shape_count(t->rank, t->dims) >= 0 &&
        kiln_shape_count(t->rank, t->dims) != 256)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "table must hold 256 values, got %lld",
                               (long long)kiln_shape_count(t->rank, t->dims));
    if (x) *y = *x;
    y->dtype = t ? t->dtype : KILN_DTYPE_UNDEFINED;
    return KILN_OK;
}

static kiln_status lut_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0], *t = ctx->in[1];
    kiln_tensor *y = ctx->out[0];
    if ((x->dtype != KILN_DTYPE_U8 && x->dtype != KILN_DTYPE_I8) || !lut_dtype(t->dtype) ||
        kiln_tensor_count(t) != 256 || y->dtype != t->dtype)
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED,
                               "x must be uint8 or int8 and table 256 uint8, int8 or float32 "
                               "values, got %s and %lld %s",
                               kiln_dtype_name(x->dtype), (long long)kiln_tensor_count(t),
                               kiln_dtype_name(t->dtype));
    int64_t n = kiln_tensor_count(x);
    size_t es = t->dtype == KILN_DTYPE_F32 ? 4 : 1;
    int off = x->dtype == KILN_DTYPE_I8 ? 128 : 0;
    for (int64_t i = 0; i < n; i++) {
        int k = (int)kiln_get_i64(x->dtype, x->data, i) + off;
        memcpy((char *)y->data + (size_t)i * es, (const char *)t->data + (size_t)k * es, es);
    }
    return KILN_OK;
}

KILN_REF_OP(KilnLut8, lut_infer, lut_run);

/* x's shape, dtype d */
static void like_x(struct kiln_type *y, const struct kiln_type *x, kiln_dtype d)
{
    kiln_type_unknown(y);
    if (x) *y = *x;
    y->dtype = d;
}

static kiln_status lut_mul_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    const struct kiln_type *zp = ctx->n_in > 4 ? ctx->in[4] : NULL;
    like_x(ctx->out[0], ctx->in[0], zp ? zp->dtype : KILN_DTYPE_U8);
    return KILN_OK;
}

static kiln_status lut_pool_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    const struct kiln_type *x = ctx->in[0];
    like_x(ctx->out[0], x, KILN_DTYPE_F32);
    if (x && x->rank >= 0) {
        if (x->rank < 3)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "x must have rank >= 3 (N, C, ...), got %d", x->rank);
        for (int d = 2; d < x->rank; d++) ctx->out[0]->dims[d] = 1;
    }
    return KILN_OK;
}

/* x 8-bit of rank >= 3 and a float table of 256 values */
static kiln_status lut_float_args(const struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0], *t = ctx->in[1];
    if ((x->dtype != KILN_DTYPE_U8 && x->dtype != KILN_DTYPE_I8) || x->rank < 3 ||
        t->dtype != KILN_DTYPE_F32 || kiln_tensor_count(t) != 256)
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED,
                               "x must be uint8 or int8 of rank >= 3 and table 256 float32 "
                               "values, got %s rank %d and %lld %s",
                               kiln_dtype_name(x->dtype), x->rank,
                               (long long)kiln_tensor_count(t), kiln_dtype_name(t->dtype));
    return KILN_OK;
}

static kiln_status lut_mul_run(struct kiln_run_ctx *ctx)
{
    kiln_status st = lut_float_args(ctx);
    if (st != KILN_OK) return st;
    const kiln_tensor *x = ctx->in[0], *t = ctx->in[1], *s = ctx->in[2], *sc = ctx->in[3];
    const kiln_tensor *zp = ctx->n_in > 4 ? ctx->in[4] : NULL;
    kiln_tensor *y = ctx->out[0];
    int64_t n = x->dims[0], c = x->dims[1], ns = kiln_tensor_count(s);
    int64_t plane = n > 0 && c > 0 ? kiln_tensor_count(x) / (n * c) : 0;
    if (s->dtype != KILN_DTYPE_F32 || (ns != c && ns != n * c) || sc->dtype != KILN_DTYPE_F32 ||
        kiln_tensor_count(sc) != 1 || (zp && kiln_tensor_count(zp) != 1) ||
        (y->dtype != KILN_DTYPE_U8 && y->dtype != KILN_DTYPE_I8))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "s must be float32 with one value per channel (%lld or %lld, got "
                               "%lld), y_scale one float32, y_zp one 8-bit value",
                               (long long)c, (long long)(n * c), (long long)ns);
    const float *tf = t->data, *sf = s->data;
    float sy = ((const float *)sc->data)[0];
    double zy = zp ? (double)kiln_get_i64(zp->dtype, zp->data, 0) : 0.0;
    double lo = y->dtype == KILN_DTYPE_I8 ? -128 : 0, hi = y->dtype == KILN_DTYPE_I8 ? 127 : 255;
    int off = x->dtype == KILN_DTYPE_I8 ? 128 : 0;
    for (int64_t p = 0; p < n * c; p++) {
        float g = sf[ns == c ? p % c : p];
        for (int64_t i = p * plane; i < (p + 1) * plane; i++) {
            float v = tf[kiln_get_i64(x->dtype, x->data, i) + off] * g;
            double q = rint((double)(v / sy)) + zy;
            q = isnan(q) ? 0 : q < lo ? lo : q > hi ? hi : q;
            kiln_set_i64(y->dtype, y->data, i, (int64_t)q);
        }
    }
    return KILN_OK;
}

static kiln_status lut_pool_run(struct kiln_run_ctx *ctx)
{
    kiln_status st = lut_float_args(ctx);
    if (st != KILN_OK) return st;
    const kiln_tensor *x = ctx->in[0], *t = ctx->in[1];
    int64_t planes = x->dims[0] * x->dims[1];
    int64_t plane = planes ? kiln_tensor_count(x) / planes : 0;
    const float *tf = t->data;
    float *y = ctx->out[0]->data;
    int off = x->dtype == KILN_DTYPE_I8 ? 128 : 0;
    for (int64_t p = 0; p < planes; p++) {
        double acc = 0;
        for (int64_t i = p * plane; i < (p + 1) * plane; i++)
            acc += tf[kiln_get_i64(x->dtype, x->data, i) + off];
        y[p] = (float)(plane ? acc / (double)plane : NAN);
    }
    return KILN_OK;
}

KILN_REF_OP(KilnLut8Mul, lut_mul_infer, lut_mul_run);
KILN_REF_OP(KilnLut8Pool, lut_pool_infer, lut_pool_run);
