/*
 * quant.c - reference kernels for linear quantization: QuantizeLinear,
 * DequantizeLinear and DynamicQuantizeLinear.
 *
 * Scales and zero points are per tensor (one value), per axis (1-D along
 * `axis`) or blocked (same rank as x, `block_size` elements of x per value
 * along `axis`). Quantized types are int2, int4, int8, int16, int32, their
 * unsigned kin (but uint32), the float8 types and float4e2m1. Arithmetic
 * follows the ONNX reference: x / scale in the input's float precision,
 * rounded half to even, plus the zero point, saturated to the integer
 * type; for float8 / float4 x / scale + zero_point is cast without the
 * integer rounding (round to nearest even in the target type, saturating
 * unless the 'saturate' attribute is 0). Dequantizing computes
 * (x - zero_point) * scale in float32 (double when an int32 zero point
 * promotes it) and rounds to the scale's dtype.
 */
#include "kernels/kernel.h"

/* The Kiln dtype for an ONNX TensorProto.DataType code among those quantization uses. */
static kiln_dtype quant_onnx_dtype(int64_t code)
{
    kiln_dtype dt = kiln_onnx_dtype(code);
    switch (dt) {
    case KILN_DTYPE_I64: case KILN_DTYPE_U32: case KILN_DTYPE_U64: case KILN_DTYPE_STRING:
    case KILN_DTYPE_BOOL: case KILN_DTYPE_F8E8M0:
        return KILN_DTYPE_UNDEFINED;
    default:
        return dt;
    }
}

/* True for the float8 / float4 types Kiln quantizes to / dequantizes from. */
static bool is_quant_float(kiln_dtype dt)
{
    return dt == KILN_DTYPE_F8E4M3FN || dt == KILN_DTYPE_F8E4M3FNUZ || dt == KILN_DTYPE_F8E5M2 ||
           dt == KILN_DTYPE_F8E5M2FNUZ || dt == KILN_DTYPE_F4E2M1;
}

/* True for the types Kiln quantizes to / dequantizes from. */
static bool is_quant_type(kiln_dtype dt)
{
    return dt == KILN_DTYPE_I8 || dt == KILN_DTYPE_U8 || dt == KILN_DTYPE_I16 ||
           dt == KILN_DTYPE_U16 || dt == KILN_DTYPE_I32 || dt == KILN_DTYPE_I4 ||
           dt == KILN_DTYPE_U4 || dt == KILN_DTYPE_I2 || dt == KILN_DTYPE_U2 || is_quant_float(dt);
}

/* Saturation range of a quantized type. */
static void quant_range(kiln_dtype dt, double *lo, double *hi)
{
    switch (dt) {
    case KILN_DTYPE_I8: *lo = -128; *hi = 127; break;
    case KILN_DTYPE_U8: *lo = 0; *hi = 255; break;
    case KILN_DTYPE_I16: *lo = -32768; *hi = 32767; break;
    case KILN_DTYPE_U16: *lo = 0; *hi = 65535; break;
    case KILN_DTYPE_I4: *lo = -8; *hi = 7; break;
    case KILN_DTYPE_U4: *lo = 0; *hi = 15; break;
    case KILN_DTYPE_I2: *lo = -2; *hi = 1; break;
    case KILN_DTYPE_U2: *lo = 0; *hi = 3; break;
    default: *lo = -2147483648.0; *hi = 2147483647.0; break;
    }
}

/* Round a float to a float dtype's precision (numpy arithmetic in that dtype). */
static float round_to(kiln_dtype dt, float v)
{
    if (dt == KILN_DTYPE_F16) return kiln_f16_to_f32(kiln_f32_to_f16(v));
    if (dt == KILN_DTYPE_BF16) return kiln_bf16_to_f32(kiln_f32_to_bf16(v));
    return v;
}

/* How the elements of x map to scale / zero-point elements. */
struct quant_layout {
    enum { Q_TENSOR, Q_AXIS, Q_BLOCK } mode;
    int64_t axis_len;   /* x.dims[axis] */
    int64_t inner;      /* product of x dims after axis */
    int64_t block;      /* block_size (Q_BLOCK) */
    int64_t scale_axis; /* scale.dims[axis] (Q_BLOCK) */
};

/* The scale / zero-point element for x element i. */
static int64_t quant_param_index(const struct quant_layout *q, int64_t i)
{
    switch (q->mode) {
    case Q_TENSOR: return 0;
    case Q_AXIS: return (i / q->inner) % q->axis_len;
    case Q_BLOCK: {
        int64_t in = i % q->inner, a = (i / q->inner) % q->axis_len;
        int64_t outer = i / (q->inner * q->axis_len);
        return (outer * q->scale_axis + a / q->block) * q->inner + in;
    }
    }
    return 0;
}

/* Check scale (and zero point, same shape) against x and the axis / block_size attributes. */
static kiln_status quant_layout_init(const struct kiln_node *node, const kiln_tensor *x,
                                     const kiln_tensor *scale, const kiln_tensor *zp,
                                     struct quant_layout *q)
{
    memset(q, 0, sizeof *q);
    char b1[96], b2[96];
    if (zp && (zp->rank != scale->rank ||
               memcmp(zp->dims, scale->dims, sizeof(int64_t) * (size_t)zp->rank) != 0) &&
        !(kiln_tensor_count(zp) == 1 && kiln_tensor_count(scale) == 1))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "zero point shape %s differs from scale shape %s",
                               kiln_shape_str(zp->rank, zp->dims, b1, sizeof b1),
                               kiln_shape_str(scale->rank, scale->dims, b2, sizeof b2));
    int64_t block = kiln_attr_int(node, "block_size", 0);
    if (kiln_tensor_count(scale) == 1 && scale->rank <= 1 && block <= 0) {
        q->mode = Q_TENSOR;
        return KILN_OK;
    }
    if (x->rank == 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "a scalar input needs a single scale");
    int axis;
    kiln_status st = kiln_norm_axis(node, kiln_attr_int(node, "axis", 1), x->rank, &axis);
    if (st != KILN_OK) return st;
    q->axis_len = x->dims[axis];
    q->inner = kiln_shape_count(x->rank - axis - 1, x->dims + axis + 1);
    if (block < 0)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "block_size is %lld",
                               (long long)block);
    if (block == 0) {
        if (scale->rank != 1 || scale->dims[0] != q->axis_len)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "per-axis scale must be 1-D with %lld values (axis %d), got %s",
                                   (long long)q->axis_len, axis,
                                   kiln_shape_str(scale->rank, scale->dims, b1, sizeof b1));
        q->mode = Q_AXIS;
        return KILN_OK;
    }
    bool ok = scale->rank == x->rank;
    for (int d = 0; ok && d < x->rank; d++) {
        int64_t want = d == axis ? x->dims[d] / block + (x->dims[d] % block != 0) : x->dims[d];
        if (scale->dims[d] != want) ok = false;
    }
    if (!ok)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "blocked scale shape %s does not fit x %s with block_size %lld "
                               "on axis %d",
                               kiln_shape_str(scale->rank, scale->dims, b1, sizeof b1),
                               kiln_shape_str(x->rank, x->dims, b2, sizeof b2), (long long)block,
                               axis);
    q->mode = Q_BLOCK;
    q->block = block;
    q->scale_axis = scale->dims[axis];
    return KILN_OK;
}

/* ---- QuantizeLinear ---- */

/* Output dtype: the zero point's, else output_dtype, else uint8. */
static kiln_status quantize_out_dtype(const struct kiln_node *node, const struct kiln_type *zp,
                                      kiln_dtype *out)
{
    int64_t code = kiln_attr_int(node, "output_dtype", 0);
    if (zp) {
        *out = zp->dtype;
    } else if (code) {
        *out = quant_onnx_dtype(code);
        if (*out == KILN_DTYPE_UNDEFINED)
            return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                                   "output_dtype %lld is not supported", (long long)code);
    } else {
        *out = KILN_DTYPE_U8;
    }
    if (*out != KILN_DTYPE_UNDEFINED && !is_quant_type(*out))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "quantizing to %s is not supported",
                               kiln_dtype_name(*out));
    return KILN_OK;
}

static kiln_status quantize_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    const struct kiln_type *zp = ctx->n_in > 2 ? ctx->in[2] : NULL;
    kiln_dtype dt;
    kiln_status st = quantize_out_dtype(ctx->node, zp, &dt);
    if (st != KILN_OK) return st;
    if (ctx->in[0]) *ctx->out[0] = *ctx->in[0];
    else kiln_type_unknown(ctx->out[0]);
    ctx->out[0]->dtype = dt;
    return KILN_OK;
}

static kiln_status quantize_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0], *scale = ctx->in[1];
    const kiln_tensor *zp = ctx->n_in > 2 ? ctx->in[2] : NULL;
    kiln_tensor *y = ctx->out[0];
    if (!is_quant_type(y->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "quantizing to %s is not supported",
                               kiln_dtype_name(y->dtype));
    if (!kiln_dtype_is_float(x->dtype) && x->dtype != KILN_DTYPE_I32)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "input dtype %s is not supported",
                               kiln_dtype_name(x->dtype));
    if (!kiln_dtype_is_float(scale->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "scale dtype %s is not supported",
                               kiln_dtype_name(scale->dtype));
    struct quant_layout q;
    kiln_status st = quant_layout_init(node, x, scale, zp, &q);
    if (st != KILN_OK) return st;
    /* the precision of x / scale: the precision attribute, else x's float type;
     * an int32 x is divided in double, as numpy promotes it */
    kiln_dtype work = kiln_dtype_is_float(x->dtype) ? x->dtype : KILN_DTYPE_F64;
    int64_t prec = kiln_attr_int(node, "precision", 0);
    if (prec) {
        work = quant_onnx_dtype(prec);
        if (!kiln_dtype_is_float(work))
            return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "precision %lld is not supported",
                                   (long long)prec);
    }
    bool to_float = is_quant_float(y->dtype);
    bool saturate = kiln_attr_int(node, "saturate", 1) != 0;
    double lo, hi;
    quant_range(y->dtype, &lo, &hi);
    int64_t n = kiln_tensor_count(x);
    for (int64_t i = 0; i < n; i++) {
        int64_t pi = quant_param_index(&q, i);
        double xv = kiln_get_f64(x->dtype, x->data, i);
        double sv = kiln_get_f64(scale->dtype, scale->data, pi);
        double r;
        if (work == KILN_DTYPE_F64)
            r = xv / sv;
        else
            r = round_to(work, round_to(work, (float)xv) / round_to(work, (float)sv));
        if (to_float) {
            double zf = zp ? kiln_get_f64(zp->dtype, zp->data, pi) : 0.0;
            kiln_set_f64_sat(y->dtype, y->data, i, r + zf, saturate);
            continue;
        }
        double v = rint(r) + (zp ? (double)kiln_get_i64(zp->dtype, zp->data, pi) : 0.0);
        v = isnan(v) ? 0 : v < lo ? lo : v > hi ? hi : v;
        kiln_set_i64(y->dtype, y->data, i, (int64_t)v);
    }
    return KILN_OK;
}

KILN_REF_OP(QuantizeLinear, quantize_infer, quantize_run);

/* ---- DequantizeLinear ---- */

static kiln_status dequantize_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    kiln_dtype dt = ctx->in[1] ? ctx->in[1]->dtype : KILN_DTYPE_UNDEFINED;
    int64_t code = kiln_attr_int(ctx->node, "output_dtype", 0);
    if (code) {
        dt = quant_onnx_dtype(code);
        if (!kiln_dtype_is_float(dt))
            return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED,
                                   "output_dtype %lld is not supported", (long long)code);
    }
    if (ctx->in[0]) *ctx->out[0] = *ctx->in[0];
    else kiln_type_unknown(ctx->out[0]);
    ctx->out[0]->dtype = dt;
    return KILN_OK;
}

static kiln_status dequantize_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0], *scale = ctx->in[1];
    const kiln_tensor *zp = ctx->n_in > 2 ? ctx->in[2] : NULL;
    kiln_tensor *y = ctx->out[0];
    if (!is_quant_type(x->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "dequantizing %s is not supported",
                               kiln_dtype_name(x->dtype));
    if (zp && zp->dtype != x->dtype)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "zero point is %s but x is %s",
                               kiln_dtype_name(zp->dtype), kiln_dtype_name(x->dtype));
    if (!kiln_dtype_is_float(scale->dtype) || !kiln_dtype_is_float(y->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "scale dtype %s is not supported",
                               kiln_dtype_name(scale->dtype));
    struct quant_layout q;
    kiln_status st = quant_layout_init(node, x, scale, zp, &q);
    if (st != KILN_OK) return st;
    /* numpy: float32(x) - zp stays float32 for 8/16-bit zero points, becomes double
     * for int32 ones; the product with the scale follows */
    bool wide = zp && zp->dtype == KILN_DTYPE_I32;
    bool f64 = scale->dtype == KILN_DTYPE_F64;
    int64_t n = kiln_tensor_count(x);
    for (int64_t i = 0; i < n; i++) {
        int64_t pi = quant_param_index(&q, i);
        float xf = (float)kiln_get_f64(x->dtype, x->data, i);
        double zv = zp ? kiln_get_f64(zp->dtype, zp->data, pi) : 0.0;
        double sv = kiln_get_f64(scale->dtype, scale->data, pi);
        double v;
        if (wide || f64) v = ((double)xf - zv) * sv;
        else v = (double)((xf - (float)zv) * (float)sv);
        kiln_set_f64(y->dtype, y->data, i, v);
    }
    return KILN_OK;
}

KILN_REF_OP(DequantizeLinear, dequantize_infer, dequantize_run);

/* ---- DynamicQuantizeLinear ---- */

static kiln_status dynamic_quantize_infer(struct kiln_infer_ctx *ctx)
{
    if (ctx->out[0]) {
        if (ctx->in[0]) *ctx->out[0] = *ctx->in[0];
        else kiln_type_unknown(ctx->out[0]);
        ctx->out[0]->dtype = KILN_DTYPE_U8;
    }
    if (ctx->n_out > 1 && ctx->out[1]) kiln_type_set(ctx->out[1], KILN_DTYPE_F32, 0, NULL);
    if (ctx->n_out > 2 && ctx->out[2]) kiln_type_set(ctx->out[2], KILN_DTYPE_U8, 0, NULL);
    return KILN_OK;
}

/* uint8 quantization with scale and zero point chosen from x's range (widened to hold 0). */
static kiln_status dynamic_quantize_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    if (x->dtype != KILN_DTYPE_F32)
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "dtype %s is not supported",
                               kiln_dtype_name(x->dtype));
    const float *xd = x->data;
    int64_t n = kiln_tensor_count(x);
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        if (xd[i] < lo) lo = xd[i];
        if (xd[i] > hi) hi = xd[i];
    }
    float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
    float zp = 0.0f - lo / scale;
    zp = rintf(zp < 0.0f ? 0.0f : zp > 255.0f ? 255.0f : zp);
    uint8_t *y = ctx->out[0]->data;
    for (int64_t i = 0; i < n; i++) {
        float v = rintf(xd[i] / scale) + zp;
        y[i] = (uint8_t)(isnan(v) ? 0 : v < 0.0f ? 0 : v > 255.0f ? 255 : v);
    }
    if (ctx->n_out > 1 && ctx->out[1]) ((float *)ctx->out[1]->data)[0] = scale;
    if (ctx->n_out > 2 && ctx->out[2]) ((uint8_t *)ctx->out[2]->data)[0] = (uint8_t)zp;
    return KILN_OK;
}

KILN_REF_OP(DynamicQuantizeLinear, dynamic_quantize_infer, dynamic_quantize_run);
