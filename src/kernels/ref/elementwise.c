/*
 * elementwise.c - reference kernels for ONNX's elementwise ops: unary math
 * and activations (Abs .. Swish, IsNaN, IsInf, Not, BitwiseNot, Clip) and
 * the binary and variadic ops with numpy broadcasting (Add .. Mean, Where).
 * Cast and CastLike live in cast.c.
 *
 * Each op is written once per value domain rather than once per dtype:
 * floats are computed in double, signed integers (and bool) in int64,
 * unsigned integers in uint64, and results are stored back with the
 * generic accessors of core/dtype.h, which truncate integers to their width
 * (so integer overflow wraps as it does in numpy). Float32, the dtype whole
 * models run in, has typed loops: unary ops go element by element over the
 * contiguous input, binary ops walk the output in rows of its (merged)
 * innermost dims so that each row is a plain C loop with a fixed stride of
 * 0 or 1 per input.
 */
#include <float.h>

#include "kernels/kernel.h"

/* ---- Value domains ---- */

/* The domain an op computes in for a given dtype. */
enum domain { DOM_NONE, DOM_F64, DOM_I64, DOM_U64 };

static enum domain domain_of(kiln_dtype dt)
{
    if (kiln_dtype_is_float(dt)) return DOM_F64;
    switch (dt) {
    case KILN_DTYPE_U8: case KILN_DTYPE_U16: case KILN_DTYPE_U32: case KILN_DTYPE_U64:
        return DOM_U64;
    case KILN_DTYPE_I8: case KILN_DTYPE_I16: case KILN_DTYPE_I32: case KILN_DTYPE_I64:
    case KILN_DTYPE_BOOL:
        return DOM_I64;
    default:
        return DOM_NONE;
    }
}

static uint64_t get_u64(const kiln_tensor *t, int64_t i)
{
    return (uint64_t)kiln_get_i64(t->dtype, t->data, i);
}

static void set_u64(kiln_tensor *t, int64_t i, uint64_t v)
{
    kiln_set_i64(t->dtype, t->data, i, (int64_t)v);
}

/* Error for an input dtype the op does not take. */
static kiln_status dtype_unsupported(const struct kiln_node *node, int input, kiln_dtype dt)
{
    return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "input %d has dtype %s, which this op "
                           "does not support", input, kiln_dtype_name(dt));
}

/* ---- Row iteration over a broadcast output ----
 * The output is walked in rows: the innermost dims are merged while every
 * input stays either contiguous (stride 1) or constant (stride 0) across
 * them, and a broadcast iterator steps over the remaining outer dims. */
struct row_iter {
    struct kiln_bcast_iter it; /* over the outer dims; off[k] = row start of input k */
    int64_t inner;             /* elements per row */
    int64_t step[4];           /* stride of input k within a row: 0 or 1 */
    int64_t rows;              /* number of rows */
};

static void row_iter_init(struct row_iter *r, const kiln_tensor *out, int n,
                          const kiln_tensor *const *ins)
{
    kiln_bcast_iter_init(&r->it, out, n, ins);
    int rank = out->rank;
    int64_t count = kiln_shape_count(out->rank, out->dims);
    r->inner = 1;
    for (int k = 0; k < n; k++) r->step[k] = rank > 0 ? r->it.strides[k][rank - 1] : 0;
    bool ok = true;
    for (int k = 0; k < n; k++) ok = ok && (r->step[k] == 0 || r->step[k] == 1);
    if (!ok) { /* strides that are neither 0 nor 1 cannot occur; fall back to rows of 1 */
        for (int k = 0; k < n; k++) r->step[k] = 0;
        r->rows = count;
        return;
    }
    while (rank > 0) {
        int d = rank - 1;
        bool merge = true; /* a dim of 1 adds no offset and always merges */
        for (int k = 0; k < n && out->dims[d] != 1; k++)
            merge = merge && r->it.strides[k][d] == r->step[k] * r->inner;
        if (!merge) break;
        r->inner *= out->dims[d];
        rank--;
    }
    r->it.rank = rank;
    r->rows = r->inner > 0 ? count / r->inner : 0;
}

/* ---- Unary ops ---- */

struct unary_params {
    double alpha, beta, gamma;
};

typedef double (*unary_f64_fn)(double x, const struct unary_params *p);
/* Integer form: x read as int64 (uint64 bits when uns). */
typedef int64_t (*unary_i64_fn)(int64_t x, bool uns, const struct unary_params *p);

/* Apply f (floats) or fi (integers; NULL = floats only) to every element. */
static kiln_status unary_run(struct kiln_run_ctx *ctx, unary_f64_fn f, unary_i64_fn fi,
                             const struct unary_params *p)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    int64_t n = kiln_shape_count(x->rank, x->dims);
    enum domain dom = domain_of(x->dtype);
    if (x->dtype == KILN_DTYPE_F32) {
        const float *xs = x->data;
        float *ys = y->data;
        for (int64_t i = 0; i < n; i++) ys[i] = (float)f(xs[i], p);
    } else if (x->dtype == KILN_DTYPE_F64) {
        const double *xs = x->data;
        double *ys = y->data;
        for (int64_t i = 0; i < n; i++) ys[i] = f(xs[i], p);
    } else if (dom == DOM_F64) {
        for (int64_t i = 0; i < n; i++)
            kiln_set_f64(y->dtype, y->data, i, f(kiln_get_f64(x->dtype, x->data, i), p));
    } else if ((dom == DOM_I64 || dom == DOM_U64) && fi && x->dtype != KILN_DTYPE_BOOL) {
        bool uns = dom == DOM_U64;
        for (int64_t i = 0; i < n; i++)
            kiln_set_i64(y->dtype, y->data, i, fi(kiln_get_i64(x->dtype, x->data, i), uns, p));
    } else {
        return dtype_unsupported(ctx->node, 0, x->dtype);
    }
    return KILN_OK;
}

static double f_abs(double x, const struct unary_params *p) { return fabs(x); }
static double f_neg(double x, const struct unary_params *p) { return -x; }
static double f_reciprocal(double x, const struct unary_params *p) { return 1.0 / x; }
static double f_floor(double x, const struct unary_params *p) { return floor(x); }
static double f_ceil(double x, const struct unary_params *p) { return ceil(x); }
static double f_round(double x, const struct unary_params *p) { return nearbyint(x); }
static double f_sqrt(double x, const struct unary_params *p) { return sqrt(x); }
static double f_exp(double x, const struct unary_params *p) { return exp(x); }
static double f_log(double x, const struct unary_params *p) { return log(x); }
static double f_sin(double x, const struct unary_params *p) { return sin(x); }
static double f_cos(double x, const struct unary_params *p) { return cos(x); }
static double f_tan(double x, const struct unary_params *p) { return tan(x); }
static double f_asin(double x, const struct unary_params *p) { return asin(x); }
static double f_acos(double x, const struct unary_params *p) { return acos(x); }
static double f_atan(double x, const struct unary_params *p) { return atan(x); }
static double f_sinh(double x, const struct unary_params *p) { return sinh(x); }
static double f_cosh(double x, const struct unary_params *p) { return cosh(x); }
static double f_asinh(double x, const struct unary_params *p) { return asinh(x); }
static double f_acosh(double x, const struct unary_params *p) { return acosh(x); }
static double f_atanh(double x, const struct unary_params *p) { return atanh(x); }
static double f_erf(double x, const struct unary_params *p) { return erf(x); }
static double f_tanh(double x, const struct unary_params *p) { return tanh(x); }

static double f_sign(double x, const struct unary_params *p)
{
    return x > 0 ? 1.0 : x < 0 ? -1.0 : x; /* 0 and NaN map to themselves */
}

/* 1 / (1 + e^-x), computed without overflow for large |x|. */
static double sigmoid(double x)
{
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

/* log(1 + e^x) without overflow. */
static double softplus(double x)
{
    return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}

static double f_sigmoid(double x, const struct unary_params *p) { return sigmoid(x); }
static double f_relu(double x, const struct unary_params *p) { return x < 0 ? 0.0 : x; }
static double f_leaky_relu(double x, const struct unary_params *p)
{
    return x < 0 ? p->alpha * x : x;
}
static double f_elu(double x, const struct unary_params *p)
{
    return x < 0 ? p->alpha * expm1(x) : x;
}
static double f_selu(double x, const struct unary_params *p)
{
    return x <= 0 ? p->gamma * (p->alpha * exp(x) - p->alpha) : p->gamma * x;
}
static double f_celu(double x, const struct unary_params *p)
{
    return fmax(0.0, x) + fmin(0.0, p->alpha * expm1(x / p->alpha));
}
static double f_hard_sigmoid(double x, const struct unary_params *p)
{
    return fmax(0.0, fmin(1.0, p->alpha * x + p->beta));
}
static double f_hard_swish(double x, const struct unary_params *p)
{
    return x * fmax(0.0, fmin(1.0, x / 6.0 + 0.5));
}
static double f_softplus(double x, const struct unary_params *p) { return softplus(x); }
static double f_softsign(double x, const struct unary_params *p) { return x / (1.0 + fabs(x)); }
static double f_thresholded_relu(double x, const struct unary_params *p)
{
    return x > p->alpha ? x : 0.0;
}
/* Shrink: alpha = lambd, beta = bias. */
static double f_shrink(double x, const struct unary_params *p)
{
    return x < -p->alpha ? x + p->beta : x > p->alpha ? x - p->beta : 0.0;
}
static double f_mish(double x, const struct unary_params *p) { return x * tanh(softplus(x)); }
static double f_gelu(double x, const struct unary_params *p)
{
    return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
}
static double f_gelu_tanh(double x, const struct unary_params *p)
{
    const double k = 0.7978845608028654; /* sqrt(2 / pi) */
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}
static double f_swish(double x, const struct unary_params *p) { return x * sigmoid(p->alpha * x); }

/* Integer forms, with wrap-around where numpy wraps (abs and neg of the minimum). */
static int64_t i_abs(int64_t x, bool uns, const struct unary_params *p)
{
    return uns || x >= 0 ? x : (int64_t)(0 - (uint64_t)x);
}
static int64_t i_neg(int64_t x, bool uns, const struct unary_params *p)
{
    return (int64_t)(0 - (uint64_t)x);
}
static int64_t i_sign(int64_t x, bool uns, const struct unary_params *p)
{
    if (uns) return x != 0;
    return x > 0 ? 1 : x < 0 ? -1 : 0;
}
static int64_t i_relu(int64_t x, bool uns, const struct unary_params *p)
{
    return uns || x > 0 ? x : 0;
}
static int64_t i_identity(int64_t x, bool uns, const struct unary_params *p) { return x; }
/* Shrink on integers; alpha (lambd) and beta (bias) are applied as in double. */
static int64_t i_shrink(int64_t x, bool uns, const struct unary_params *p)
{
    double v = uns ? (double)(uint64_t)x : (double)x;
    double r = f_shrink(v, p);
    return (int64_t)r;
}

/* Define a unary op without attributes: Name_run calls unary_run with f and fi. */
#define UNARY_OP(Name, f, fi)                                         \
    static kiln_status Name##_run(struct kiln_run_ctx *ctx)           \
    {                                                                 \
        return unary_run(ctx, f, fi, NULL);                           \
    }                                                                 \
    KILN_REF_OP(Name, kiln_infer_same, Name##_run)

UNARY_OP(Abs, f_abs, i_abs);
UNARY_OP(Neg, f_neg, i_neg);
UNARY_OP(Reciprocal, f_reciprocal, NULL);
UNARY_OP(Floor, f_floor, i_identity);
UNARY_OP(Ceil, f_ceil, i_identity);
UNARY_OP(Round, f_round, i_identity);
UNARY_OP(Sqrt, f_sqrt, NULL);
UNARY_OP(Exp, f_exp, NULL);
UNARY_OP(Log, f_log, NULL);
UNARY_OP(Sin, f_sin, NULL);
UNARY_OP(Cos, f_cos, NULL);
UNARY_OP(Tan, f_tan, NULL);
UNARY_OP(Asin, f_asin, NULL);
UNARY_OP(Acos, f_acos, NULL);
UNARY_OP(Atan, f_atan, NULL);
UNARY_OP(Sinh, f_sinh, NULL);
UNARY_OP(Cosh, f_cosh, NULL);
UNARY_OP(Asinh, f_asinh, NULL);
UNARY_OP(Acosh, f_acosh, NULL);
UNARY_OP(Atanh, f_atanh, NULL);
UNARY_OP(Erf, f_erf, NULL);
UNARY_OP(Sign, f_sign, i_sign);
UNARY_OP(Softplus, f_softplus, NULL);
UNARY_OP(Softsign, f_softsign, NULL);
UNARY_OP(HardSwish, f_hard_swish, NULL);
UNARY_OP(Mish, f_mish, NULL);

/* Relu, Sigmoid and Tanh: typed float32 loops, the rest through unary_run. */
static kiln_status Relu_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    if (x->dtype != KILN_DTYPE_F32) return unary_run(ctx, f_relu, i_relu, NULL);
    int64_t n = kiln_shape_count(x->rank, x->dims);
    const float *xs = x->data;
    float *ys = ctx->out[0]->data;
    for (int64_t i = 0; i < n; i++) ys[i] = xs[i] < 0.0f ? 0.0f : xs[i];
    return KILN_OK;
}
KILN_REF_OP(Relu, kiln_infer_same, Relu_run);

static float sigmoid_f32(float v)
{
    if (v >= 0.0f) return 1.0f / (1.0f + expf(-v));
    float e = expf(v);
    return e / (1.0f + e);
}

static kiln_status Sigmoid_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    if (x->dtype != KILN_DTYPE_F32) return unary_run(ctx, f_sigmoid, NULL, NULL);
    int64_t n = kiln_shape_count(x->rank, x->dims);
    const float *xs = x->data;
    float *ys = ctx->out[0]->data;
    for (int64_t i = 0; i < n; i++) ys[i] = sigmoid_f32(xs[i]);
    return KILN_OK;
}
KILN_REF_OP(Sigmoid, kiln_infer_same, Sigmoid_run);

static kiln_status Tanh_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    if (x->dtype != KILN_DTYPE_F32) return unary_run(ctx, f_tanh, NULL, NULL);
    int64_t n = kiln_shape_count(x->rank, x->dims);
    const float *xs = x->data;
    float *ys = ctx->out[0]->data;
    for (int64_t i = 0; i < n; i++) ys[i] = tanhf(xs[i]);
    return KILN_OK;
}
KILN_REF_OP(Tanh, kiln_infer_same, Tanh_run);

static kiln_status LeakyRelu_run(struct kiln_run_ctx *ctx)
{
    struct unary_params p = {.alpha = kiln_attr_float(ctx->node, "alpha", 0.01f)};
    return unary_run(ctx, f_leaky_relu, NULL, &p);
}
KILN_REF_OP(LeakyRelu, kiln_infer_same, LeakyRelu_run);

static kiln_status Elu_run(struct kiln_run_ctx *ctx)
{
    struct unary_params p = {.alpha = kiln_attr_float(ctx->node, "alpha", 1.0f)};
    return unary_run(ctx, f_elu, NULL, &p);
}
KILN_REF_OP(Elu, kiln_infer_same, Elu_run);

static kiln_status Selu_run(struct kiln_run_ctx *ctx)
{
    struct unary_params p = {
        .alpha = kiln_attr_float(ctx->node, "alpha", 1.67326319217681884765625f),
        .gamma = kiln_attr_float(ctx->node, "gamma", 1.05070102214813232421875f),
    };
    return unary_run(ctx, f_selu, NULL, &p);
}
KILN_REF_OP(Selu, kiln_infer_same, Selu_run);

static kiln_status Celu_run(struct kiln_run_ctx *ctx)
{
    struct unary_params p = {.alpha = kiln_attr_float(ctx->node, "alpha", 1.0f)};
    if (p.alpha == 0)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "attribute alpha must not be 0");
    return unary_run(ctx, f_celu, NULL, &p);
}
KILN_REF_OP(Celu, kiln_infer_same, Celu_run);

static kiln_status HardSigmoid_run(struct kiln_run_ctx *ctx)
{
    struct unary_params p = {
        .alpha = kiln_attr_float(ctx->node, "alpha", 0.2f),
        .beta = kiln_attr_float(ctx->node, "beta", 0.5f),
    };
    return unary_run(ctx, f_hard_sigmoid, NULL, &p);
}
KILN_REF_OP(HardSigmoid, kiln_infer_same, HardSigmoid_run);

static kiln_status ThresholdedRelu_run(struct kiln_run_ctx *ctx)
{
    struct unary_params p = {.alpha = kiln_attr_float(ctx->node, "alpha", 1.0f)};
    return unary_run(ctx, f_thresholded_relu, NULL, &p);
}
KILN_REF_OP(ThresholdedRelu, kiln_infer_same, ThresholdedRelu_run);

static kiln_status Shrink_run(struct kiln_run_ctx *ctx)
{
    struct unary_params p = {
        .alpha = kiln_attr_float(ctx->node, "lambd", 0.5f),
        .beta = kiln_attr_float(ctx->node, "bias", 0.0f),
    };
    return unary_run(ctx, f_shrink, i_shrink, &p);
}
KILN_REF_OP(Shrink, kiln_infer_same, Shrink_run);

static kiln_status Gelu_run(struct kiln_run_ctx *ctx)
{
    const char *approx = kiln_attr_str(ctx->node, "approximate", "none");
    if (strcmp(approx, "none") == 0) return unary_run(ctx, f_gelu, NULL, NULL);
    if (strcmp(approx, "tanh") == 0) return unary_run(ctx, f_gelu_tanh, NULL, NULL);
    return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                           "attribute approximate is '%s', expected 'none' or 'tanh'", approx);
}
KILN_REF_OP(Gelu, kiln_infer_same, Gelu_run);

/* float32: x * sigmoid(alpha x) in float arithmetic, the Sigmoid's: with alpha 1 bit for bit
 * the Sigmoid and Mul that silu_fusion (src/opt/silu.c) replaces */
static kiln_status Swish_run(struct kiln_run_ctx *ctx)
{
    struct unary_params p = {.alpha = kiln_attr_float(ctx->node, "alpha", 1.0f)};
    const kiln_tensor *x = ctx->in[0];
    if (x->dtype != KILN_DTYPE_F32 || kiln_attr_check(ctx->node) != KILN_OK)
        return unary_run(ctx, f_swish, NULL, &p);
    int64_t n = kiln_shape_count(x->rank, x->dims);
    const float *xs = x->data;
    float *ys = ctx->out[0]->data;
    for (int64_t i = 0; i < n; i++) ys[i] = xs[i] * sigmoid_f32(p.alpha * xs[i]);
    return KILN_OK;
}
KILN_REF_OP(Swish, kiln_infer_same, Swish_run);

/* Output 0 has input 0's shape and dtype bool. */
static kiln_status infer_same_bool(struct kiln_infer_ctx *ctx)
{
    kiln_status st = kiln_infer_same(ctx);
    if (st == KILN_OK && ctx->out[0]) ctx->out[0]->dtype = KILN_DTYPE_BOOL;
    return st;
}

static kiln_status IsNaN_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    if (!kiln_dtype_is_numeric(x->dtype)) return dtype_unsupported(ctx->node, 0, x->dtype);
    uint8_t *y = ctx->out[0]->data;
    int64_t n = kiln_shape_count(x->rank, x->dims);
    for (int64_t i = 0; i < n; i++) y[i] = isnan(kiln_get_f64(x->dtype, x->data, i)) != 0;
    return KILN_OK;
}
KILN_REF_OP(IsNaN, infer_same_bool, IsNaN_run);

static kiln_status IsInf_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    if (!kiln_dtype_is_numeric(x->dtype)) return dtype_unsupported(ctx->node, 0, x->dtype);
    bool pos = kiln_attr_int(ctx->node, "detect_positive", 1) != 0;
    bool neg = kiln_attr_int(ctx->node, "detect_negative", 1) != 0;
    uint8_t *y = ctx->out[0]->data;
    int64_t n = kiln_shape_count(x->rank, x->dims);
    for (int64_t i = 0; i < n; i++) {
        double v = kiln_get_f64(x->dtype, x->data, i);
        y[i] = isinf(v) && ((v > 0 && pos) || (v < 0 && neg));
    }
    return KILN_OK;
}
KILN_REF_OP(IsInf, infer_same_bool, IsInf_run);

static kiln_status Not_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    if (x->dtype != KILN_DTYPE_BOOL) return dtype_unsupported(ctx->node, 0, x->dtype);
    const uint8_t *xs = x->data;
    uint8_t *y = ctx->out[0]->data;
    int64_t n = kiln_shape_count(x->rank, x->dims);
    for (int64_t i = 0; i < n; i++) y[i] = !xs[i];
    return KILN_OK;
}
KILN_REF_OP(Not, kiln_infer_same, Not_run);

static kiln_status BitwiseNot_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    if (!kiln_dtype_is_int(x->dtype)) return dtype_unsupported(ctx->node, 0, x->dtype);
    kiln_tensor *y = ctx->out[0];
    int64_t n = kiln_shape_count(x->rank, x->dims);
    for (int64_t i = 0; i < n; i++)
        kiln_set_i64(y->dtype, y->data, i, ~kiln_get_i64(x->dtype, x->data, i));
    return KILN_OK;
}
KILN_REF_OP(BitwiseNot, kiln_infer_same, BitwiseNot_run);

/* ---- Clip ---- */

/* Read Clip's bound input `which` (1 = min, 2 = max); it must hold one element. */
static kiln_status clip_bound(struct kiln_run_ctx *ctx, int which, const kiln_tensor **out)
{
    *out = which < ctx->n_in ? ctx->in[which] : NULL;
    const kiln_tensor *b = *out;
    if (!b) return KILN_OK;
    if (kiln_shape_count(b->rank, b->dims) != 1)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "input %s must be a scalar, got %lld elements",
                               which == 1 ? "min" : "max",
                               (long long)kiln_shape_count(b->rank, b->dims));
    if (b->dtype != ctx->in[0]->dtype)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "input %s has dtype %s, input has %s", which == 1 ? "min" : "max",
                               kiln_dtype_name(b->dtype), kiln_dtype_name(ctx->in[0]->dtype));
    return KILN_OK;
}

/* Clip: bounds from inputs 1 and 2 (opset 11+) or attributes min and max (before). */
static kiln_status Clip_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    int64_t n = kiln_shape_count(x->rank, x->dims);
    enum domain dom = domain_of(x->dtype);
    if (dom == DOM_NONE || x->dtype == KILN_DTYPE_BOOL)
        return dtype_unsupported(ctx->node, 0, x->dtype);

    const kiln_tensor *lo_t = NULL, *hi_t = NULL;
    double lo_f = -INFINITY, hi_f = INFINITY;
    if (ctx->node->opset < 11) {
        lo_f = kiln_attr_float(ctx->node, "min", -FLT_MAX);
        hi_f = kiln_attr_float(ctx->node, "max", FLT_MAX);
    } else {
        kiln_status st = clip_bound(ctx, 1, &lo_t);
        if (st == KILN_OK) st = clip_bound(ctx, 2, &hi_t);
        if (st != KILN_OK) return st;
    }

    if (dom == DOM_F64) {
        double lo = lo_t ? kiln_get_f64(lo_t->dtype, lo_t->data, 0) : lo_f;
        double hi = hi_t ? kiln_get_f64(hi_t->dtype, hi_t->data, 0) : hi_f;
        if (x->dtype == KILN_DTYPE_F32) {
            float lo32 = (float)lo, hi32 = (float)hi;
            const float *xs = x->data;
            float *ys = y->data;
            for (int64_t i = 0; i < n; i++) {
                float v = xs[i] < lo32 ? lo32 : xs[i];
                ys[i] = v > hi32 ? hi32 : v;
            }
            return KILN_OK;
        }
        for (int64_t i = 0; i < n; i++) {
            double v = kiln_get_f64(x->dtype, x->data, i);
            v = v < lo ? lo : v;
            kiln_set_f64(y->dtype, y->data, i, v > hi ? hi : v);
        }
    } else if (dom == DOM_I64) {
        int64_t lo = lo_t ? kiln_get_i64(lo_t->dtype, lo_t->data, 0)
                          : lo_f <= -9.2e18 ? INT64_MIN : (int64_t)lo_f;
        int64_t hi = hi_t ? kiln_get_i64(hi_t->dtype, hi_t->data, 0)
                          : hi_f >= 9.2e18 ? INT64_MAX : (int64_t)hi_f;
        for (int64_t i = 0; i < n; i++) {
            int64_t v = kiln_get_i64(x->dtype, x->data, i);
            v = v < lo ? lo : v;
            kiln_set_i64(y->dtype, y->data, i, v > hi ? hi : v);
        }
    } else {
        uint64_t lo = lo_t ? get_u64(lo_t, 0) : lo_f <= 0 ? 0 : (uint64_t)lo_f;
        uint64_t hi = hi_t ? get_u64(hi_t, 0) : hi_f >= 1.8e19 ? UINT64_MAX : (uint64_t)hi_f;
        for (int64_t i = 0; i < n; i++) {
            uint64_t v = get_u64(x, i);
            v = v < lo ? lo : v;
            set_u64(y, i, v > hi ? hi : v);
        }
    }
    return KILN_OK;
}
KILN_REF_OP(Clip, kiln_infer_same, Clip_run);

/* ---- Binary ops ---- */

/* The f32 row loops written out by hand; others call the op's f. */
enum f32_kind { F32_GENERIC, F32_ADD, F32_SUB, F32_MUL, F32_DIV, F32_MIN, F32_MAX };

/* An op in each domain. A NULL entry means the op rejects that domain. */
struct binop {
    enum f32_kind f32;
    double (*f)(double a, double b);
    int64_t (*i)(int64_t a, int64_t b);
    uint64_t (*u)(uint64_t a, uint64_t b);
    bool int_div;   /* integer form divides by b: b == 0 is an error */
    bool bool_ok;   /* bool inputs allowed (in the int64 domain) */
};

static double b_add(double a, double b) { return a + b; }
static double b_sub(double a, double b) { return a - b; }
static double b_mul(double a, double b) { return a * b; }
static double b_div(double a, double b) { return a / b; }
/* numpy-style min and max: NaN in either operand gives NaN. */
static double b_min(double a, double b) { return a < b || isnan(a) ? a : b; }
static double b_max(double a, double b) { return a > b || isnan(a) ? a : b; }
/* Python-style remainder: the sign of the divisor. */
static double b_mod(double a, double b)
{
    double r = fmod(a, b);
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}
static double b_fmod(double a, double b) { return fmod(a, b); }
static double b_prelu(double a, double b) { return a < 0 ? a * b : a; }
static double b_eq(double a, double b) { return a == b; }
static double b_lt(double a, double b) { return a < b; }
static double b_gt(double a, double b) { return a > b; }
static double b_le(double a, double b) { return a <= b; }
static double b_ge(double a, double b) { return a >= b; }

/* Signed integer forms; + - * wrap through uint64 like numpy's fixed widths. */
static int64_t i_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static int64_t i_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static int64_t i_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
/* Division truncates toward zero (ONNX's test_div_int32_trunc). */
static int64_t i_div(int64_t a, int64_t b)
{
    if (b == -1) return i_neg(a, false, NULL); /* INT64_MIN / -1 wraps */
    return a / b;
}
static int64_t i_min(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t i_max(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t i_mod(int64_t a, int64_t b)
{
    if (b == -1) return 0;
    int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}
static int64_t i_fmod(int64_t a, int64_t b) { return b == -1 ? 0 : a % b; }
static int64_t i_prelu(int64_t a, int64_t b) { return a < 0 ? i_mul(a, b) : a; }
static int64_t i_eq(int64_t a, int64_t b) { return a == b; }
static int64_t i_lt(int64_t a, int64_t b) { return a < b; }
static int64_t i_gt(int64_t a, int64_t b) { return a > b; }
static int64_t i_le(int64_t a, int64_t b) { return a <= b; }
static int64_t i_ge(int64_t a, int64_t b) { return a >= b; }
static int64_t i_and(int64_t a, int64_t b) { return a & b; }
static int64_t i_or(int64_t a, int64_t b) { return a | b; }
static int64_t i_xor(int64_t a, int64_t b) { return a ^ b; }
static int64_t i_land(int64_t a, int64_t b) { return a && b; }
static int64_t i_lor(int64_t a, int64_t b) { return a || b; }
static int64_t i_lxor(int64_t a, int64_t b) { return !a != !b; }

static uint64_t u_add(uint64_t a, uint64_t b) { return a + b; }
static uint64_t u_sub(uint64_t a, uint64_t b) { return a - b; }
static uint64_t u_mul(uint64_t a, uint64_t b) { return a * b; }
static uint64_t u_div(uint64_t a, uint64_t b) { return a / b; }
static uint64_t u_mod(uint64_t a, uint64_t b) { return a % b; }
static uint64_t u_min(uint64_t a, uint64_t b) { return a < b ? a : b; }
static uint64_t u_max(uint64_t a, uint64_t b) { return a > b ? a : b; }
static uint64_t u_prelu(uint64_t a, uint64_t b) { return a; }
static uint64_t u_eq(uint64_t a, uint64_t b) { return a == b; }
static uint64_t u_lt(uint64_t a, uint64_t b) { return a < b; }
static uint64_t u_gt(uint64_t a, uint64_t b) { return a > b; }
static uint64_t u_le(uint64_t a, uint64_t b) { return a <= b; }
static uint64_t u_ge(uint64_t a, uint64_t b) { return a >= b; }
static uint64_t u_and(uint64_t a, uint64_t b) { return a & b; }
static uint64_t u_or(uint64_t a, uint64_t b) { return a | b; }
static uint64_t u_xor(uint64_t a, uint64_t b) { return a ^ b; }
static uint64_t u_shl(uint64_t a, uint64_t b) { return b >= 64 ? 0 : a << b; }
static uint64_t u_shr(uint64_t a, uint64_t b) { return b >= 64 ? 0 : a >> b; }

static const struct binop op_add = {F32_ADD, b_add, i_add, u_add, false, false};
static const struct binop op_sub = {F32_SUB, b_sub, i_sub, u_sub, false, false};
static const struct binop op_mul = {F32_MUL, b_mul, i_mul, u_mul, false, false};
static const struct binop op_div = {F32_DIV, b_div, i_div, u_div, true, false};
static const struct binop op_min = {F32_MIN, b_min, i_min, u_min, false, false};
static const struct binop op_max = {F32_MAX, b_max, i_max, u_max, false, false};
static const struct binop op_mod = {F32_GENERIC, b_mod, i_mod, u_mod, true, false};
static const struct binop op_fmod = {F32_GENERIC, b_fmod, i_fmod, u_mod, true, false};
static const struct binop op_prelu = {F32_GENERIC, b_prelu, i_prelu, u_prelu, false, false};
static const struct binop op_eq = {F32_GENERIC, b_eq, i_eq, u_eq, false, true};
static const struct binop op_lt = {F32_GENERIC, b_lt, i_lt, u_lt, false, false};
static const struct binop op_gt = {F32_GENERIC, b_gt, i_gt, u_gt, false, false};
static const struct binop op_le = {F32_GENERIC, b_le, i_le, u_le, false, false};
static const struct binop op_ge = {F32_GENERIC, b_ge, i_ge, u_ge, false, false};
static const struct binop op_bit_and = {F32_GENERIC, NULL, i_and, u_and, false, false};
static const struct binop op_bit_or = {F32_GENERIC, NULL, i_or, u_or, false, false};
static const struct binop op_bit_xor = {F32_GENERIC, NULL, i_xor, u_xor, false, false};
static const struct binop op_shl = {F32_GENERIC, NULL, NULL, u_shl, false, false};
static const struct binop op_shr = {F32_GENERIC, NULL, NULL, u_shr, false, false};

/* out = a op b over float32 rows; out may be a itself (variadic folds). */
static void f32_binary_rows(const struct binop *op, const kiln_tensor *a, const kiln_tensor *b,
                            kiln_tensor *out)
{
    const kiln_tensor *ins[2] = {a, b};
    struct row_iter r;
    row_iter_init(&r, out, 2, ins);
    const float *as = a->data, *bs = b->data;
    float *os = out->data;
    const int64_t sa = r.step[0], sb = r.step[1], inner = r.inner;
    for (int64_t row = 0; row < r.rows; row++) {
        const float *pa = as + r.it.off[0], *pb = bs + r.it.off[1];
        float *po = os + row * inner;
        switch (op->f32) {
        case F32_ADD:
            for (int64_t j = 0; j < inner; j++) po[j] = pa[j * sa] + pb[j * sb];
            break;
        case F32_SUB:
            for (int64_t j = 0; j < inner; j++) po[j] = pa[j * sa] - pb[j * sb];
            break;
        case F32_MUL:
            for (int64_t j = 0; j < inner; j++) po[j] = pa[j * sa] * pb[j * sb];
            break;
        case F32_DIV:
            for (int64_t j = 0; j < inner; j++) po[j] = pa[j * sa] / pb[j * sb];
            break;
        case F32_MIN:
            for (int64_t j = 0; j < inner; j++) {
                float x = pa[j * sa], y = pb[j * sb];
                po[j] = x < y || isnan(x) ? x : y;
            }
            break;
        case F32_MAX:
            for (int64_t j = 0; j < inner; j++) {
                float x = pa[j * sa], y = pb[j * sb];
                po[j] = x > y || isnan(x) ? x : y;
            }
            break;
        case F32_GENERIC:
            for (int64_t j = 0; j < inner; j++) po[j] = (float)op->f(pa[j * sa], pb[j * sb]);
            break;
        }
        kiln_bcast_iter_next(&r.it);
    }
}

/* out = a op b with broadcasting, in the domain of a's dtype (a and b share it). The result
 * is stored in out's dtype, which is a's dtype or bool for comparisons. */
static kiln_status binary_apply(const struct kiln_node *node, const struct binop *op,
                                const kiln_tensor *a, const kiln_tensor *b, kiln_tensor *out)
{
    enum domain dom = domain_of(a->dtype);
    if (a->dtype == KILN_DTYPE_BOOL && !op->bool_ok) dom = DOM_NONE;
    if ((dom == DOM_F64 && !op->f) || (dom == DOM_I64 && !op->i) || (dom == DOM_U64 && !op->u) ||
        dom == DOM_NONE)
        return dtype_unsupported(node, 0, a->dtype);
    if (a->dtype == KILN_DTYPE_F32 && out->dtype == KILN_DTYPE_F32) {
        f32_binary_rows(op, a, b, out);
        return KILN_OK;
    }
    const kiln_tensor *ins[2] = {a, b};
    struct kiln_bcast_iter it;
    kiln_bcast_iter_init(&it, out, 2, ins);
    int64_t n = kiln_shape_count(out->rank, out->dims);
    for (int64_t i = 0; i < n; i++, kiln_bcast_iter_next(&it)) {
        int64_t ia = it.off[0], ib = it.off[1];
        if (dom == DOM_F64) {
            double v = op->f(kiln_get_f64(a->dtype, a->data, ia),
                             kiln_get_f64(b->dtype, b->data, ib));
            kiln_set_f64(out->dtype, out->data, i, v);
        } else if (dom == DOM_I64) {
            int64_t y = kiln_get_i64(b->dtype, b->data, ib);
            if (op->int_div && y == 0)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "integer division by zero at element %lld", (long long)i);
            kiln_set_i64(out->dtype, out->data, i,
                         op->i(kiln_get_i64(a->dtype, a->data, ia), y));
        } else {
            uint64_t y = get_u64(b, ib);
            if (op->int_div && y == 0)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "integer division by zero at element %lld", (long long)i);
            set_u64(out, i, op->u(get_u64(a, ia), y));
        }
    }
    return KILN_OK;
}

/* Check that inputs 0..n-1 (those present) share one dtype. */
static kiln_status check_same_dtype(const struct kiln_node *node, int n,
                                    const kiln_tensor *const *in)
{
    for (int k = 1; k < n; k++)
        if (in[k] && in[0] && in[k]->dtype != in[0]->dtype)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "input %d has dtype %s but input 0 has %s", k,
                                   kiln_dtype_name(in[k]->dtype), kiln_dtype_name(in[0]->dtype));
    return KILN_OK;
}

/* Shape inference for ops whose inputs share a dtype: that check, then broadcast. */
static kiln_status infer_bcast_same(struct kiln_infer_ctx *ctx)
{
    for (int k = 1; k < ctx->n_in; k++) {
        const struct kiln_type *t = ctx->in[k], *t0 = ctx->in[0];
        if (t && t0 && t->dtype != KILN_DTYPE_UNDEFINED && t0->dtype != KILN_DTYPE_UNDEFINED &&
            t->dtype != t0->dtype)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                                   "input %d has dtype %s but input 0 has %s", k,
                                   kiln_dtype_name(t->dtype), kiln_dtype_name(t0->dtype));
    }
    return kiln_infer_broadcast(ctx);
}

static kiln_status infer_bcast_same_bool(struct kiln_infer_ctx *ctx)
{
    kiln_status st = infer_bcast_same(ctx);
    if (st == KILN_OK && ctx->out[0]) ctx->out[0]->dtype = KILN_DTYPE_BOOL;
    return st;
}

/* Pre-opset-7 broadcasting (attributes broadcast and axis) is numpy's only when B aligns
 * with A's trailing dims; other alignments are not supported. */
static kiln_status check_legacy_broadcast(struct kiln_run_ctx *ctx)
{
    if (ctx->node->opset >= 7 || !kiln_node_attr(ctx->node, "axis")) return KILN_OK;
    int64_t axis = kiln_attr_int(ctx->node, "axis", 0);
    int ra = ctx->in[0]->rank, rb = ctx->in[1]->rank;
    if (axis < 0) axis += ra;
    if (axis == ra - rb) return KILN_OK;
    return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED,
                           "legacy broadcast with axis %lld (not aligned to the trailing dims) "
                           "is not supported", (long long)axis);
}

/* Run a two-input op whose inputs share a dtype. */
static kiln_status binary_run(struct kiln_run_ctx *ctx, const struct binop *op)
{
    kiln_status st = check_same_dtype(ctx->node, 2, (const kiln_tensor *const *)ctx->in);
    if (st == KILN_OK) st = check_legacy_broadcast(ctx);
    if (st != KILN_OK) return st;
    return binary_apply(ctx->node, op, ctx->in[0], ctx->in[1], ctx->out[0]);
}

/* Define a binary op Name with the given binop and shape function. */
#define BINARY_OP(Name, binop, infer)                                 \
    static kiln_status Name##_run(struct kiln_run_ctx *ctx)           \
    {                                                                 \
        return binary_run(ctx, &binop);                               \
    }                                                                 \
    KILN_REF_OP(Name, infer, Name##_run)

BINARY_OP(Add, op_add, infer_bcast_same);
BINARY_OP(Sub, op_sub, infer_bcast_same);
BINARY_OP(Mul, op_mul, infer_bcast_same);
BINARY_OP(Div, op_div, infer_bcast_same);
BINARY_OP(PRelu, op_prelu, infer_bcast_same);
BINARY_OP(Less, op_lt, infer_bcast_same_bool);
BINARY_OP(Greater, op_gt, infer_bcast_same_bool);
BINARY_OP(LessOrEqual, op_le, infer_bcast_same_bool);
BINARY_OP(GreaterOrEqual, op_ge, infer_bcast_same_bool);
BINARY_OP(BitwiseAnd, op_bit_and, infer_bcast_same);
BINARY_OP(BitwiseOr, op_bit_or, infer_bcast_same);
BINARY_OP(BitwiseXor, op_bit_xor, infer_bcast_same);

static kiln_status Mod_run(struct kiln_run_ctx *ctx)
{
    bool c_style = kiln_attr_int(ctx->node, "fmod", 0) != 0;
    return binary_run(ctx, c_style ? &op_fmod : &op_mod);
}
KILN_REF_OP(Mod, infer_bcast_same, Mod_run);

static kiln_status BitShift_run(struct kiln_run_ctx *ctx)
{
    const char *dir = kiln_attr_str(ctx->node, "direction", "");
    if (strcmp(dir, "LEFT") == 0) return binary_run(ctx, &op_shl);
    if (strcmp(dir, "RIGHT") == 0) return binary_run(ctx, &op_shr);
    return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                           "attribute direction is '%s', expected 'LEFT' or 'RIGHT'", dir);
}
KILN_REF_OP(BitShift, infer_bcast_same, BitShift_run);

/* Logical ops: bool inputs only. */
static kiln_status logical_run(struct kiln_run_ctx *ctx, int64_t (*f)(int64_t, int64_t))
{
    for (int k = 0; k < 2; k++)
        if (ctx->in[k]->dtype != KILN_DTYPE_BOOL)
            return dtype_unsupported(ctx->node, k, ctx->in[k]->dtype);
    struct binop op = {F32_GENERIC, NULL, f, NULL, false, true};
    return binary_run(ctx, &op);
}

static kiln_status And_run(struct kiln_run_ctx *ctx) { return logical_run(ctx, i_land); }
static kiln_status Or_run(struct kiln_run_ctx *ctx) { return logical_run(ctx, i_lor); }
static kiln_status Xor_run(struct kiln_run_ctx *ctx) { return logical_run(ctx, i_lxor); }
KILN_REF_OP(And, infer_bcast_same_bool, And_run);
KILN_REF_OP(Or, infer_bcast_same_bool, Or_run);
KILN_REF_OP(Xor, infer_bcast_same_bool, Xor_run);

/* Equal: numbers, bools and strings (byte-wise). */
static kiln_status Equal_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *a = ctx->in[0], *b = ctx->in[1];
    kiln_status st = check_same_dtype(ctx->node, 2, (const kiln_tensor *const *)ctx->in);
    if (st != KILN_OK) return st;
    if (a->dtype != KILN_DTYPE_STRING) return binary_apply(ctx->node, &op_eq, a, b, ctx->out[0]);
    kiln_tensor *out = ctx->out[0];
    const kiln_string *as = a->data, *bs = b->data;
    uint8_t *os = out->data;
    struct kiln_bcast_iter it;
    kiln_bcast_iter_init(&it, out, 2, (const kiln_tensor *const *)ctx->in);
    int64_t n = kiln_shape_count(out->rank, out->dims);
    for (int64_t i = 0; i < n; i++, kiln_bcast_iter_next(&it)) {
        const kiln_string *x = &as[it.off[0]], *y = &bs[it.off[1]];
        os[i] = x->len == y->len && (x->len == 0 || memcmp(x->data, y->data, x->len) == 0);
    }
    return KILN_OK;
}
KILN_REF_OP(Equal, infer_bcast_same_bool, Equal_run);

/* Integer power by squaring; negative exponents give 1, -1 or 0 as integer division would. */
static int64_t ipow(int64_t base, int64_t e)
{
    if (e < 0) {
        if (base == 1) return 1;
        if (base == -1) return (e & 1) ? -1 : 1;
        return 0;
    }
    uint64_t r = 1, b = (uint64_t)base;
    while (e) {
        if (e & 1) r *= b;
        b *= b;
        e >>= 1;
    }
    return (int64_t)r;
}

/* Pow: the exponent may have another dtype; the output has the base's. */
static kiln_status Pow_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *a = ctx->in[0], *b = ctx->in[1];
    kiln_tensor *out = ctx->out[0];
    enum domain da = domain_of(a->dtype), db = domain_of(b->dtype);
    if (da == DOM_NONE || a->dtype == KILN_DTYPE_BOOL) return dtype_unsupported(ctx->node, 0, a->dtype);
    if (db == DOM_NONE || b->dtype == KILN_DTYPE_BOOL) return dtype_unsupported(ctx->node, 1, b->dtype);
    kiln_status st = check_legacy_broadcast(ctx);
    if (st != KILN_OK) return st;
    if (a->dtype == KILN_DTYPE_F32 && b->dtype == KILN_DTYPE_F32) {
        static const struct binop op_pow = {F32_GENERIC, pow, NULL, NULL, false, false};
        f32_binary_rows(&op_pow, a, b, out);
        return KILN_OK;
    }
    struct kiln_bcast_iter it;
    kiln_bcast_iter_init(&it, out, 2, (const kiln_tensor *const *)ctx->in);
    int64_t n = kiln_shape_count(out->rank, out->dims);
    for (int64_t i = 0; i < n; i++, kiln_bcast_iter_next(&it)) {
        int64_t ia = it.off[0], ib = it.off[1];
        if (da != DOM_F64 && db != DOM_F64) {
            /* uint64 exponents beyond int64 behave like huge positive ones */
            int64_t e = kiln_get_i64(b->dtype, b->data, ib);
            if (db == DOM_U64 && e < 0) e = INT64_MAX;
            kiln_set_i64(out->dtype, out->data, i, ipow(kiln_get_i64(a->dtype, a->data, ia), e));
        } else {
            double x = kiln_get_f64(a->dtype, a->data, ia);
            double e = kiln_get_f64(b->dtype, b->data, ib);
            kiln_set_f64(out->dtype, out->data, i, pow(x, e));
        }
    }
    return KILN_OK;
}
KILN_REF_OP(Pow, kiln_infer_broadcast, Pow_run);

/* ---- Where ---- */

/* Output: broadcast of all three inputs, dtype of X (input 1). */
static kiln_status Where_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *c = ctx->in[0], *x = ctx->in[1], *y = ctx->in[2];
    if (c && c->dtype != KILN_DTYPE_UNDEFINED && c->dtype != KILN_DTYPE_BOOL)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "condition has dtype %s, expected bool", kiln_dtype_name(c->dtype));
    if (x && y && x->dtype != KILN_DTYPE_UNDEFINED && y->dtype != KILN_DTYPE_UNDEFINED &&
        x->dtype != y->dtype)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "X has dtype %s but Y has %s", kiln_dtype_name(x->dtype),
                               kiln_dtype_name(y->dtype));
    if (!ctx->out[0]) return KILN_OK;
    struct kiln_type t;
    kiln_type_unknown(&t);
    t.dtype = x ? x->dtype : y ? y->dtype : KILN_DTYPE_UNDEFINED;
    kiln_status st = kiln_infer_broadcast_types(ctx->node, ctx->n_in, ctx->in, &t);
    if (st != KILN_OK) return st;
    *ctx->out[0] = t;
    return KILN_OK;
}

static kiln_status Where_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *c = ctx->in[0], *x = ctx->in[1], *y = ctx->in[2];
    kiln_tensor *out = ctx->out[0];
    if (c->dtype != KILN_DTYPE_BOOL) return dtype_unsupported(ctx->node, 0, c->dtype);
    if (x->dtype != y->dtype || out->dtype != x->dtype)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "X has dtype %s but Y has %s",
                               kiln_dtype_name(x->dtype), kiln_dtype_name(y->dtype));
    struct kiln_bcast_iter it;
    kiln_bcast_iter_init(&it, out, 3, (const kiln_tensor *const *)ctx->in);
    int64_t n = kiln_shape_count(out->rank, out->dims);
    const uint8_t *cs = c->data;
    size_t es = kiln_dtype_size(x->dtype);
    for (int64_t i = 0; i < n; i++, kiln_bcast_iter_next(&it)) {
        const kiln_tensor *src = cs[it.off[0]] ? x : y;
        int64_t si = cs[it.off[0]] ? it.off[1] : it.off[2];
        if (x->dtype == KILN_DTYPE_STRING) {
            const kiln_string *s = &((const kiln_string *)src->data)[si];
            kiln_status st = kiln_tensor_set_string(out, (size_t)i, s->data ? s->data : "", s->len);
            if (st != KILN_OK) return st;
        } else {
            memcpy((char *)out->data + (size_t)i * es, (const char *)src->data + (size_t)si * es,
                   es);
        }
    }
    return KILN_OK;
}
KILN_REF_OP(Where, Where_infer, Where_run);

/* ---- Variadic: Min, Max, Sum, Mean ---- */

/* out = broadcast of in[0]; then out = out op in[k] for each further input. */
static kiln_status variadic_fold(struct kiln_run_ctx *ctx, const struct binop *op)
{
    kiln_tensor *out = ctx->out[0];
    kiln_status st = check_same_dtype(ctx->node, ctx->n_in, (const kiln_tensor *const *)ctx->in);
    if (st != KILN_OK) return st;
    for (int k = 0; k < ctx->n_in; k++)
        if (!ctx->in[k])
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "input %d is missing", k);
    const kiln_tensor *first = ctx->in[0];
    if (domain_of(first->dtype) == DOM_NONE || first->dtype == KILN_DTYPE_BOOL)
        return dtype_unsupported(ctx->node, 0, first->dtype);

    struct kiln_bcast_iter it;
    kiln_bcast_iter_init(&it, out, 1, &first);
    int64_t n = kiln_shape_count(out->rank, out->dims);
    size_t es = kiln_dtype_size(first->dtype);
    for (int64_t i = 0; i < n; i++, kiln_bcast_iter_next(&it))
        memcpy((char *)out->data + (size_t)i * es, (const char *)first->data + (size_t)it.off[0] * es,
               es);
    for (int k = 1; k < ctx->n_in; k++) {
        st = binary_apply(ctx->node, op, out, ctx->in[k], out);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

static kiln_status Min_run(struct kiln_run_ctx *ctx) { return variadic_fold(ctx, &op_min); }
static kiln_status Max_run(struct kiln_run_ctx *ctx) { return variadic_fold(ctx, &op_max); }
static kiln_status Sum_run(struct kiln_run_ctx *ctx) { return variadic_fold(ctx, &op_add); }
KILN_REF_OP(Min, infer_bcast_same, Min_run);
KILN_REF_OP(Max, infer_bcast_same, Max_run);
KILN_REF_OP(Sum, infer_bcast_same, Sum_run);

/* Mean: the sum, divided by the input count in the output's dtype. */
static kiln_status Mean_run(struct kiln_run_ctx *ctx)
{
    kiln_status st = variadic_fold(ctx, &op_add);
    if (st != KILN_OK) return st;
    kiln_tensor *out = ctx->out[0];
    int64_t n = kiln_shape_count(out->rank, out->dims);
    int count = ctx->n_in;
    if (out->dtype == KILN_DTYPE_F32) {
        float *o = out->data;
        for (int64_t i = 0; i < n; i++) o[i] /= (float)count;
    } else if (domain_of(out->dtype) == DOM_F64) {
        for (int64_t i = 0; i < n; i++)
            kiln_set_f64(out->dtype, out->data, i, kiln_get_f64(out->dtype, out->data, i) / count);
    } else if (domain_of(out->dtype) == DOM_I64) {
        for (int64_t i = 0; i < n; i++)
            kiln_set_i64(out->dtype, out->data, i, kiln_get_i64(out->dtype, out->data, i) / count);
    } else {
        for (int64_t i = 0; i < n; i++) set_u64(out, i, get_u64(out, i) / (uint64_t)count);
    }
    return KILN_OK;
}
KILN_REF_OP(Mean, infer_bcast_same, Mean_run);
