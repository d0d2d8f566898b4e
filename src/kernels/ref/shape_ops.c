/*
 * shape_ops.c - reference kernels for ops that make values or move data
 * without arithmetic: Identity, Dropout (inference), Constant, Shape, Size,
 * ConstantOfShape, Range, EyeLike, Reshape, Flatten, Transpose, Squeeze,
 * Unsqueeze, Concat, Split, Slice, Expand, Tile, Pad, DepthToSpace,
 * SpaceToDepth, Trilu and CenterCropPad.
 *
 * Most of them copy a strided view of the input out in row-major order
 * (copy_view): Transpose permutes the strides, Slice offsets and scales them,
 * Expand zeroes them, and Tile and DepthToSpace view the output with extra
 * dims. Every dtype moves, strings included (their bytes are duplicated).
 * Each shape function works from whatever is known at the time: a dim or an
 * input value it cannot see yet becomes -1 (or rank -1), and the result is
 * concrete once the inputs and the shape-carrying input values are.
 * Gather, Scatter and the data-dependent ops live in gather_scatter.c.
 */
#include <stdlib.h>

#include "kernels/kernel.h"
#include "kernels/ref/pad.h"

#define VIEW_MAX (2 * KILN_MAX_RANK) /* most dims of a strided view (Tile doubles the rank) */

/* ---- Small helpers shared by the ops below ---- */

/* True if optional input k is present. */
static bool has_in(const struct kiln_infer_ctx *ctx, int k)
{
    return k < ctx->n_in && ctx->in[k] != NULL;
}

/* The known value of input k, or NULL if absent or not known yet. */
static const kiln_tensor *in_value(const struct kiln_infer_ctx *ctx, int k)
{
    if (!has_in(ctx, k) || !ctx->in_value) return NULL;
    return ctx->in_value[k];
}

/* Store t as output i's type if that output is wanted. */
static void set_out(struct kiln_infer_ctx *ctx, int i, const struct kiln_type *t)
{
    if (i < ctx->n_out && ctx->out[i]) *ctx->out[i] = *t;
}

/* A type of dtype dt and the given rank with every dim unknown. */
static void type_unknown_dims(struct kiln_type *t, kiln_dtype dt, int rank)
{
    kiln_type_unknown(t);
    t->dtype = dt;
    t->rank = rank;
    for (int i = 0; i < rank && i < KILN_MAX_RANK; i++) t->dims[i] = -1;
}

/* Read a rank-0 or rank-1 integer tensor into vals[0..*n), at most max values. */
static kiln_status read_ints(const struct kiln_node *node, const kiln_tensor *t, const char *what,
                             int64_t *vals, int max, int *n)
{
    if (!kiln_dtype_is_int(t->dtype))
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s must be an integer tensor, got %s",
                               what, kiln_dtype_name(t->dtype));
    if (t->rank > 1)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "%s must be 1-D, got rank %d",
                               what, t->rank);
    int64_t c = kiln_tensor_count(t);
    if (c > max)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "%s has %lld values; at most %d supported",
                               what, (long long)c, max);
    for (int64_t i = 0; i < c; i++) vals[i] = kiln_tensor_i64(t, i);
    *n = (int)c;
    return KILN_OK;
}

/* Copy the whole of in into out, which must hold as many elements of the same dtype. */
static kiln_status copy_all(const struct kiln_node *node, kiln_tensor *out, const kiln_tensor *in)
{
    int64_t n = kiln_tensor_count(in);
    if (out->dtype != in->dtype || kiln_tensor_count(out) != n)
        return kiln_node_error(node, KILN_ERR_INTERNAL,
                               "output holds %lld %s elements but the input has %lld %s",
                               (long long)kiln_tensor_count(out), kiln_dtype_name(out->dtype),
                               (long long)n, kiln_dtype_name(in->dtype));
    if (out->data == in->data) return KILN_OK;
    return kiln_tensor_copy_elems(out, 0, in, 0, n);
}

/* Typed gather of one row: dst[k] = src[k * stride] for k < n (elements of es bytes). */
static void copy_row_strided(char *dst, const char *src, int64_t n, int64_t stride, size_t es)
{
    switch (es) {
    case 1:
        for (int64_t k = 0; k < n; k++) ((uint8_t *)dst)[k] = ((const uint8_t *)src)[k * stride];
        break;
    case 2:
        for (int64_t k = 0; k < n; k++) ((uint16_t *)dst)[k] = ((const uint16_t *)src)[k * stride];
        break;
    case 4:
        for (int64_t k = 0; k < n; k++) ((uint32_t *)dst)[k] = ((const uint32_t *)src)[k * stride];
        break;
    case 8:
        for (int64_t k = 0; k < n; k++) ((uint64_t *)dst)[k] = ((const uint64_t *)src)[k * stride];
        break;
    default:
        for (int64_t k = 0; k < n; k++)
            memcpy(dst + (size_t)k * es, src + (size_t)(k * stride) * es, es);
        break;
    }
}

/*
 * Copy a strided view of in to out[0..) in row-major order: the view has
 * dims[0..rank) and its element at index idx is in[base + sum idx[d] * strides[d]].
 * Strides may be negative (reversed slices) or zero (broadcast).
 */
static kiln_status copy_view(kiln_tensor *out, const kiln_tensor *in, int rank, const int64_t *dims,
                             int64_t base, const int64_t *strides)
{
    int64_t n = kiln_shape_count(rank, dims);
    if (n <= 0) return KILN_OK;
    if (rank == 0) return kiln_tensor_copy_elems(out, 0, in, base, 1);
    int last = rank - 1;
    int64_t row = dims[last], rstride = strides[last];
    int64_t idx[VIEW_MAX] = {0};
    int64_t off = base;
    size_t es = kiln_dtype_size(in->dtype);
    bool is_str = in->dtype == KILN_DTYPE_STRING;
    for (int64_t o = 0; o < n; o += row) {
        if (rstride == 1) {
            kiln_status st = kiln_tensor_copy_elems(out, o, in, off, row);
            if (st != KILN_OK) return st;
        } else if (is_str) {
            for (int64_t k = 0; k < row; k++) {
                kiln_status st = kiln_tensor_copy_elems(out, o + k, in, off + k * rstride, 1);
                if (st != KILN_OK) return st;
            }
        } else {
            copy_row_strided((char *)out->data + (size_t)o * es,
                             (const char *)in->data + (size_t)off * es, row, rstride, es);
        }
        for (int d = last - 1; d >= 0; d--) {
            idx[d]++;
            off += strides[d];
            if (idx[d] < dims[d]) break;
            off -= strides[d] * dims[d];
            idx[d] = 0;
        }
    }
    return KILN_OK;
}


/* Product of dims[from..to) of a type, or -1 if one is unknown or it is too large. */
static int64_t type_dims_product(const struct kiln_type *t, int from, int to)
{
    return to > from ? kiln_shape_count(to - from, t->dims + from) : 1;
}

/* a * b for sizes, or -1 past KILN_TENSOR_MAX_BYTES (a, b >= 0). */
static int64_t size_mul(int64_t a, int64_t b)
{
    if (b != 0 && a > KILN_TENSOR_MAX_BYTES / b) return -1;
    return a * b;
}

/* Product of dims[from..to) of a tensor. */
static int64_t dims_product(const int64_t *dims, int from, int to)
{
    int64_t p = 1;
    for (int i = from; i < to; i++) p *= dims[i];
    return p;
}

/* ---- Identity, Dropout ---- */

static kiln_status identity_run(struct kiln_run_ctx *ctx)
{
    return copy_all(ctx->node, ctx->out[0], ctx->in[0]);
}

KILN_REF_OP(Identity, kiln_infer_same, identity_run);

/* Dropout: output 0 like the input, the optional mask the same shape in bool. */
static kiln_status dropout_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->in[0]) return KILN_OK;
    struct kiln_type t = *ctx->in[0];
    set_out(ctx, 0, &t);
    t.dtype = KILN_DTYPE_BOOL;
    set_out(ctx, 1, &t);
    return KILN_OK;
}

/* Inference Dropout is the identity with an all-true mask; training with a ratio is random. */
static kiln_status dropout_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    bool training = false;
    if (node->opset >= 12 && ctx->n_in > 2 && ctx->in[2]) {
        if (kiln_tensor_count(ctx->in[2]) != 1)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "training_mode must be a scalar, got %lld elements",
                                   (long long)kiln_tensor_count(ctx->in[2]));
        training = kiln_tensor_i64(ctx->in[2], 0) != 0;
    }
    if (training) {
        double ratio = 0.5;
        if (ctx->n_in > 1 && ctx->in[1]) {
            if (kiln_tensor_count(ctx->in[1]) != 1)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "ratio must be a scalar, got %lld elements",
                                       (long long)kiln_tensor_count(ctx->in[1]));
            ratio = kiln_tensor_f64(ctx->in[1], 0);
        }
        if (ratio != 0)
            return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                                   "training_mode is true with ratio %g: random dropout is not "
                                   "supported (Kiln runs Dropout for inference)",
                                   ratio);
    }
    kiln_status st = copy_all(node, ctx->out[0], ctx->in[0]);
    if (st != KILN_OK) return st;
    if (ctx->n_out > 1 && ctx->out[1]) {
        kiln_tensor *mask = ctx->out[1];
        if (mask->dtype != KILN_DTYPE_BOOL)
            return kiln_node_error(node, KILN_ERR_INTERNAL, "mask output is %s, not bool",
                                   kiln_dtype_name(mask->dtype));
        memset(mask->data, 1, (size_t)kiln_tensor_count(mask));
    }
    return KILN_OK;
}

KILN_REF_OP(Dropout, dropout_infer, dropout_run);

/* ---- Constant ---- */

/* Find the one attribute holding a Constant's value and check its type. */
static kiln_status constant_attr(const struct kiln_node *node, const struct kiln_attr **out)
{
    static const struct {
        const char *name;
        enum kiln_attr_type type;
    } kinds[] = {
        {"value", KILN_ATTR_TENSOR},       {"value_float", KILN_ATTR_FLOAT},
        {"value_floats", KILN_ATTR_FLOATS}, {"value_int", KILN_ATTR_INT},
        {"value_ints", KILN_ATTR_INTS},     {"value_string", KILN_ATTR_STRING},
        {"value_strings", KILN_ATTR_STRINGS},
    };
    if (kiln_node_attr(node, "sparse_value"))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "sparse_value is not supported");
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        const struct kiln_attr *a = kiln_node_attr(node, kinds[k].name);
        if (!a) continue;
        if (a->type != kinds[k].type || (a->type == KILN_ATTR_TENSOR && !a->t))
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "attribute %s has the wrong type", kinds[k].name);
        *out = a;
        return KILN_OK;
    }
    return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                           "no value, value_float(s), value_int(s) or value_string(s) attribute");
}

/* Constant's type is the type of the value it carries. */
static kiln_status constant_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_attr *a = NULL;
    kiln_status st = constant_attr(ctx->node, &a);
    if (st != KILN_OK) return st;
    struct kiln_type t;
    int64_t n = a->n;
    switch (a->type) {
    case KILN_ATTR_TENSOR: kiln_type_from_tensor(&t, a->t); break;
    case KILN_ATTR_FLOAT: kiln_type_set(&t, KILN_DTYPE_F32, 0, NULL); break;
    case KILN_ATTR_FLOATS: kiln_type_set(&t, KILN_DTYPE_F32, 1, &n); break;
    case KILN_ATTR_INT: kiln_type_set(&t, KILN_DTYPE_I64, 0, NULL); break;
    case KILN_ATTR_INTS: kiln_type_set(&t, KILN_DTYPE_I64, 1, &n); break;
    case KILN_ATTR_STRING: kiln_type_set(&t, KILN_DTYPE_STRING, 0, NULL); break;
    default: kiln_type_set(&t, KILN_DTYPE_STRING, 1, &n); break;
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/* Write the attribute's value into the preallocated output. */
static kiln_status constant_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_attr *a = NULL;
    kiln_status st = constant_attr(ctx->node, &a);
    if (st != KILN_OK) return st;
    kiln_tensor *out = ctx->out[0];
    switch (a->type) {
    case KILN_ATTR_TENSOR: return copy_all(ctx->node, out, a->t);
    case KILN_ATTR_FLOAT: ((float *)out->data)[0] = a->f; break;
    case KILN_ATTR_FLOATS:
        if (a->n) memcpy(out->data, a->floats, (size_t)a->n * sizeof(float));
        break;
    case KILN_ATTR_INT: ((int64_t *)out->data)[0] = a->i; break;
    case KILN_ATTR_INTS:
        if (a->n) memcpy(out->data, a->ints, (size_t)a->n * sizeof(int64_t));
        break;
    case KILN_ATTR_STRING: return kiln_tensor_set_string(out, 0, a->s.data, a->s.len);
    default:
        for (int i = 0; i < a->n; i++) {
            st = kiln_tensor_set_string(out, (size_t)i, a->strings[i].data, a->strings[i].len);
            if (st != KILN_OK) return st;
        }
        break;
    }
    return KILN_OK;
}

KILN_REF_OP(Constant, constant_infer, constant_run);

/* ---- Shape, Size ---- */

/* Shape's [start, end) over a rank-`rank` input, clamped to [0, rank]. */
static void shape_range(const struct kiln_node *node, int rank, int64_t *start, int64_t *end)
{
    int64_t s = kiln_attr_int(node, "start", 0);
    int64_t e = kiln_attr_int(node, "end", rank);
    if (s < 0) s += rank;
    if (e < 0) e += rank;
    s = s < 0 ? 0 : s > rank ? rank : s;
    e = e < 0 ? 0 : e > rank ? rank : e;
    *start = s;
    *end = e < s ? s : e;
}

/* Shape: a 1-D int64 of the (sliced) rank. */
static kiln_status shape_infer(struct kiln_infer_ctx *ctx)
{
    struct kiln_type t;
    type_unknown_dims(&t, KILN_DTYPE_I64, 1);
    if (ctx->in[0] && ctx->in[0]->rank >= 0) {
        int64_t s, e;
        shape_range(ctx->node, ctx->in[0]->rank, &s, &e);
        t.dims[0] = e - s;
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

static kiln_status shape_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    int64_t s, e;
    shape_range(ctx->node, x->rank, &s, &e);
    int64_t *o = ctx->out[0]->data;
    for (int64_t i = s; i < e; i++) o[i - s] = x->dims[i];
    return KILN_OK;
}

KILN_REF_OP(Shape, shape_infer, shape_run);

static kiln_status size_infer(struct kiln_infer_ctx *ctx)
{
    struct kiln_type t;
    kiln_type_set(&t, KILN_DTYPE_I64, 0, NULL);
    set_out(ctx, 0, &t);
    return KILN_OK;
}

static kiln_status size_run(struct kiln_run_ctx *ctx)
{
    ((int64_t *)ctx->out[0]->data)[0] = kiln_tensor_count(ctx->in[0]);
    return KILN_OK;
}

KILN_REF_OP(Size, size_infer, size_run);

/* ---- ConstantOfShape, Range, EyeLike ---- */

/* The fill value of ConstantOfShape: its one-element value attribute, or NULL for float 0. */
static kiln_status constant_of_shape_value(const struct kiln_node *node, const kiln_tensor **out)
{
    const kiln_tensor *v = kiln_attr_tensor(node, "value");
    if (v && kiln_tensor_count(v) != 1)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "value must hold one element, got %lld",
                               (long long)kiln_tensor_count(v));
    *out = v;
    return KILN_OK;
}

/* Output type from the shape input's value (or just its length when the value is unknown). */
static kiln_status constant_of_shape_infer(struct kiln_infer_ctx *ctx)
{
    const kiln_tensor *v = NULL;
    kiln_status st = constant_of_shape_value(ctx->node, &v);
    if (st != KILN_OK) return st;
    kiln_dtype dt = v ? v->dtype : KILN_DTYPE_F32;
    struct kiln_type t;
    const kiln_tensor *shape = in_value(ctx, 0);
    if (shape) {
        int64_t dims[KILN_MAX_RANK];
        int n;
        st = read_ints(ctx->node, shape, "input shape", dims, KILN_MAX_RANK, &n);
        if (st != KILN_OK) return st;
        for (int i = 0; i < n; i++)
            if (dims[i] < 0)
                return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                       "input shape has negative dim %lld at %d",
                                       (long long)dims[i], i);
        kiln_type_set(&t, dt, n, dims);
    } else if (ctx->in[0] && ctx->in[0]->rank == 1 && ctx->in[0]->dims[0] >= 0) {
        if (ctx->in[0]->dims[0] > KILN_MAX_RANK)
            return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED,
                                   "output rank %lld exceeds Kiln's maximum of %d",
                                   (long long)ctx->in[0]->dims[0], KILN_MAX_RANK);
        type_unknown_dims(&t, dt, (int)ctx->in[0]->dims[0]);
    } else {
        type_unknown_dims(&t, dt, -1);
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

static kiln_status constant_of_shape_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *v = NULL;
    kiln_status st = constant_of_shape_value(ctx->node, &v);
    if (st != KILN_OK) return st;
    if (!v) return KILN_OK; /* float zeros: the output starts zero-filled */
    return kiln_tensor_fill_elems(ctx->out[0], 0, kiln_tensor_count(ctx->out[0]), v, 0);
}

KILN_REF_OP(ConstantOfShape, constant_of_shape_infer, constant_of_shape_run);

/* Check that Range's input k is a one-element numeric tensor. */
static kiln_status range_check_scalar(const struct kiln_node *node, const kiln_tensor *t,
                                      const char *what)
{
    if (kiln_tensor_count(t) != 1)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "%s must be a scalar, got %lld elements", what,
                               (long long)kiln_tensor_count(t));
    if (!kiln_dtype_is_float(t->dtype) && !kiln_dtype_is_int(t->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "%s of type %s is not supported", what,
                               kiln_dtype_name(t->dtype));
    return KILN_OK;
}

/* Number of elements of Range(start, limit, delta): max(ceil((limit - start) / delta), 0). */
static kiln_status range_count(const struct kiln_node *node, const kiln_tensor *start,
                               const kiln_tensor *limit, const kiln_tensor *delta, int64_t *n)
{
    kiln_status st;
    if ((st = range_check_scalar(node, start, "start")) != KILN_OK ||
        (st = range_check_scalar(node, limit, "limit")) != KILN_OK ||
        (st = range_check_scalar(node, delta, "delta")) != KILN_OK)
        return st;
    if (kiln_dtype_is_float(start->dtype)) {
        double s = kiln_tensor_f64(start, 0), l = kiln_tensor_f64(limit, 0);
        double d = kiln_tensor_f64(delta, 0);
        if (d == 0 || isnan(d) || isnan(s) || isnan(l))
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "start %g, limit %g, delta %g do not make a range", s, l, d);
        double c = ceil((l - s) / d);
        if (c > (double)KILN_TENSOR_MAX_BYTES)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "start %g, limit %g, delta %g make too many elements", s, l, d);
        *n = c > 0 ? (int64_t)c : 0;
        return KILN_OK;
    }
    int64_t s = kiln_tensor_i64(start, 0), l = kiln_tensor_i64(limit, 0);
    int64_t d = kiln_tensor_i64(delta, 0);
    if (d == 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "delta is 0");
    if ((d > 0 && l <= s) || (d < 0 && l >= s)) {
        *n = 0;
        return KILN_OK;
    }
    uint64_t diff = d > 0 ? (uint64_t)l - (uint64_t)s : (uint64_t)s - (uint64_t)l;
    uint64_t ad = d > 0 ? (uint64_t)d : (uint64_t)0 - (uint64_t)d;
    uint64_t c = diff / ad + (diff % ad != 0);
    if (c > (uint64_t)KILN_TENSOR_MAX_BYTES)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "start %lld, limit %lld, delta %lld make too many elements",
                               (long long)s, (long long)l, (long long)d);
    *n = (int64_t)c;
    return KILN_OK;
}

static kiln_status range_infer(struct kiln_infer_ctx *ctx)
{
    struct kiln_type t;
    type_unknown_dims(&t, ctx->in[0] ? ctx->in[0]->dtype : KILN_DTYPE_UNDEFINED, 1);
    const kiln_tensor *s = in_value(ctx, 0), *l = in_value(ctx, 1), *d = in_value(ctx, 2);
    if (s && l && d) {
        kiln_status st = range_count(ctx->node, s, l, d, &t.dims[0]);
        if (st != KILN_OK) return st;
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/* Like numpy.arange: the step is (start + delta) - start in the output type. */
static kiln_status range_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *start = ctx->in[0], *delta = ctx->in[2];
    kiln_tensor *out = ctx->out[0];
    int64_t n = kiln_tensor_count(out);
    kiln_dtype dt = out->dtype;
    if (dt == KILN_DTYPE_F64) {
        double s = kiln_tensor_f64(start, 0), step = (s + kiln_tensor_f64(delta, 0)) - s;
        for (int64_t i = 0; i < n; i++) ((double *)out->data)[i] = s + (double)i * step;
    } else if (dt == KILN_DTYPE_F32) {
        float s = (float)kiln_tensor_f64(start, 0);
        float step = (s + (float)kiln_tensor_f64(delta, 0)) - s;
        for (int64_t i = 0; i < n; i++) ((float *)out->data)[i] = s + (float)i * step;
    } else if (kiln_dtype_is_float(dt)) {
        /* f16 / bf16: the second element is rounded to the type, then filled in float */
        float s = (float)kiln_tensor_f64(start, 0);
        uint16_t next;
        kiln_set_f64(dt, &next, 0, (double)(s + (float)kiln_tensor_f64(delta, 0)));
        float step = (float)kiln_get_f64(dt, &next, 0) - s;
        for (int64_t i = 0; i < n; i++) kiln_set_f64(dt, out->data, i, s + (float)i * step);
    } else {
        uint64_t s = (uint64_t)kiln_tensor_i64(start, 0), d = (uint64_t)kiln_tensor_i64(delta, 0);
        for (int64_t i = 0; i < n; i++) kiln_set_i64(dt, out->data, i, (int64_t)(s + (uint64_t)i * d));
    }
    return KILN_OK;
}

KILN_REF_OP(Range, range_infer, range_run);

/* EyeLike's output dtype: the dtype attribute (an ONNX type number) or the input's. */
static kiln_status eyelike_dtype(const struct kiln_node *node, kiln_dtype in_dt, kiln_dtype *out)
{
    const struct kiln_attr *a = kiln_node_attr(node, "dtype");
    if (!a) {
        *out = in_dt;
        return KILN_OK;
    }
    kiln_dtype dt = kiln_onnx_dtype(a->i);
    if (dt == KILN_DTYPE_UNDEFINED || dt == KILN_DTYPE_STRING)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "dtype %lld is not supported",
                               (long long)a->i);
    *out = dt;
    return KILN_OK;
}

static kiln_status eyelike_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->in[0]) return KILN_OK;
    struct kiln_type t = *ctx->in[0];
    if (t.rank >= 0 && t.rank != 2)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "input must be 2-D, got rank %d", t.rank);
    kiln_status st = eyelike_dtype(ctx->node, t.dtype, &t.dtype);
    if (st != KILN_OK) return st;
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/* Ones on diagonal k (j - i == k), zeros elsewhere. */
static kiln_status eyelike_run(struct kiln_run_ctx *ctx)
{
    kiln_tensor *out = ctx->out[0];
    if (!kiln_dtype_is_numeric(out->dtype))
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "output dtype %s is not supported",
                               kiln_dtype_name(out->dtype));
    int64_t k = kiln_attr_int(ctx->node, "k", 0);
    int64_t rows = out->dims[0], cols = out->dims[1];
    for (int64_t i = 0; i < rows; i++) {
        if (k < -rows || k > cols) break;
        int64_t j = i + k;
        if (j >= 0 && j < cols) kiln_set_i64(out->dtype, out->data, i * cols + j, 1);
    }
    return KILN_OK;
}

KILN_REF_OP(EyeLike, eyelike_infer, eyelike_run);

/* ---- Reshape, Flatten, Transpose, Squeeze, Unsqueeze ---- */

/* Reshape's output type from the input type and (when known) the shape value. */
static kiln_status reshape_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    struct kiln_type t;
    const kiln_tensor *shape = in_value(ctx, 1);
    if (!shape) {
        const struct kiln_type *s = ctx->in[1];
        int r = s && s->rank == 1 && s->dims[0] >= 0 && s->dims[0] <= KILN_MAX_RANK
                    ? (int)s->dims[0]
                    : -1;
        type_unknown_dims(&t, x->dtype, r);
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    int64_t v[KILN_MAX_RANK];
    int n;
    kiln_status st = read_ints(node, shape, "shape", v, KILN_MAX_RANK, &n);
    if (st != KILN_OK) return st;
    bool allowzero = node->opset >= 14 && kiln_attr_int(node, "allowzero", 0) != 0;
    kiln_type_unknown(&t);
    t.dtype = x->dtype;
    t.rank = n;
    int infer_at = -1;
    for (int i = 0; i < n; i++) {
        if (v[i] == 0 && !allowzero) {
            if (x->rank >= 0 && i >= x->rank)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "shape[%d] is 0 (copy the input dim) but the input has "
                                       "rank %d",
                                       i, x->rank);
            t.dims[i] = x->rank >= 0 ? x->dims[i] : -1;
            t.sym[i] = x->rank >= 0 ? x->sym[i] : NULL;
        } else if (v[i] == -1) {
            if (infer_at >= 0)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "shape has more than one -1 (at %d and %d)", infer_at, i);
            infer_at = i;
            t.dims[i] = -1;
        } else if (v[i] < 0) {
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "shape[%d] is %lld; dims must be >= -1", i, (long long)v[i]);
        } else {
            t.dims[i] = v[i];
        }
    }
    int64_t total = x->rank >= 0 ? type_dims_product(x, 0, x->rank) : -1;
    int64_t known = 1;
    bool all_known = true;
    for (int i = 0; i < n; i++) {
        if (i == infer_at) continue;
        if (t.dims[i] < 0) all_known = false;
        else known = known < 0 ? -1 : size_mul(known, t.dims[i]);
    }
    char buf[160];
    if (known < 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "shape %s is too large",
                               kiln_shape_str(n, v, buf, sizeof buf));
    if (infer_at >= 0 && total >= 0 && all_known) {
        if (known == 0 || total % known != 0)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "cannot reshape %lld elements to %s",
                                   (long long)total, kiln_shape_str(n, v, buf, sizeof buf));
        t.dims[infer_at] = total / known;
    } else if (infer_at < 0 && total >= 0 && all_known && known != total) {
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "cannot reshape %lld elements to %s", (long long)total,
                               kiln_shape_str(n, t.dims, buf, sizeof buf));
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/* Reshape, Flatten, Squeeze, Unsqueeze: the data is unchanged, only the shape. */
static kiln_status reshape_run(struct kiln_run_ctx *ctx)
{
    return copy_all(ctx->node, ctx->out[0], ctx->in[0]);
}

KILN_REF_OP(Reshape, reshape_infer, reshape_run);

/* Flatten to 2-D: dims before axis and dims from axis on. */
static kiln_status flatten_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    struct kiln_type t;
    type_unknown_dims(&t, x->dtype, 2);
    if (x->rank >= 0) {
        int64_t axis = kiln_attr_int(ctx->node, "axis", 1);
        if (axis < 0) axis += x->rank;
        if (axis < 0 || axis > x->rank)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                                   "axis %lld is out of range for rank %d",
                                   (long long)kiln_attr_int(ctx->node, "axis", 1), x->rank);
        t.dims[0] = type_dims_product(x, 0, (int)axis);
        t.dims[1] = type_dims_product(x, (int)axis, x->rank);
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

KILN_REF_OP(Flatten, flatten_infer, reshape_run);

/* Transpose's permutation: the perm attribute or reversed dims; checked. */
static kiln_status transpose_perm(const struct kiln_node *node, int rank, int *perm)
{
    const int64_t *p;
    int n = kiln_attr_ints(node, "perm", &p);
    if (n < 0) {
        for (int i = 0; i < rank; i++) perm[i] = rank - 1 - i;
        return KILN_OK;
    }
    if (n != rank)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "perm has %d entries but the input has rank %d", n, rank);
    bool seen[KILN_MAX_RANK] = {false};
    for (int i = 0; i < n; i++) {
        int64_t a = p[i]; /* ONNX: a permutation of 0..rank-1, no negative axes */
        if (a < 0 || a >= rank || seen[a])
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "perm[%d] = %lld is out of range or repeated", i,
                                   (long long)p[i]);
        seen[a] = true;
        perm[i] = (int)a;
    }
    return KILN_OK;
}

static kiln_status transpose_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    struct kiln_type t;
    int rank = x->rank;
    if (rank < 0) {
        const int64_t *p;
        int n = kiln_attr_ints(ctx->node, "perm", &p);
        if (n > KILN_MAX_RANK)
            return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "perm has %d entries", n);
        if (n >= 0) { /* the rank is unknown, but perm must still be a permutation */
            int perm[KILN_MAX_RANK];
            kiln_status pst = transpose_perm(ctx->node, n, perm);
            if (pst != KILN_OK) return pst;
        }
        type_unknown_dims(&t, x->dtype, n >= 0 ? n : -1);
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    int perm[KILN_MAX_RANK];
    kiln_status st = transpose_perm(ctx->node, rank, perm);
    if (st != KILN_OK) return st;
    t = *x;
    for (int i = 0; i < rank; i++) {
        t.dims[i] = x->dims[perm[i]];
        t.sym[i] = x->sym[perm[i]];
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/* Output dim i walks input dim perm[i]. */
static kiln_status transpose_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    int perm[KILN_MAX_RANK];
    kiln_status st = transpose_perm(ctx->node, x->rank, perm);
    if (st != KILN_OK) return st;
    int64_t in_strides[KILN_MAX_RANK], strides[KILN_MAX_RANK], dims[KILN_MAX_RANK];
    kiln_shape_strides(x->rank, x->dims, in_strides);
    for (int i = 0; i < x->rank; i++) {
        dims[i] = x->dims[perm[i]];
        strides[i] = in_strides[perm[i]];
    }
    return copy_view(ctx->out[0], x, x->rank, dims, 0, strides);
}

KILN_REF_OP(Transpose, transpose_infer, transpose_run);

/*
 * Squeeze/Unsqueeze axes: the attribute before opset 13, input 1 from 13.
 * *given is false when there are no axes at all; *known is false when input
 * 1 exists but its value is not known yet.
 */
static kiln_status squeeze_axes(const struct kiln_node *node, bool present,
                                const kiln_tensor *value, int64_t *axes, int *n, bool *given,
                                bool *known)
{
    *given = false;
    *known = true;
    *n = 0;
    if (node->opset < 13) {
        const int64_t *a;
        int c = kiln_attr_ints(node, "axes", &a);
        if (c < 0) return KILN_OK;
        if (c > KILN_MAX_RANK)
            return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "axes has %d entries; at most %d",
                                   c, KILN_MAX_RANK);
        for (int i = 0; i < c; i++) axes[i] = a[i];
        *n = c;
        *given = true;
        return KILN_OK;
    }
    if (!present) return KILN_OK;
    *given = true;
    if (!value) {
        *known = false;
        return KILN_OK;
    }
    return read_ints(node, value, "axes", axes, KILN_MAX_RANK, n);
}

/* Normalize n axes against rank into a mask; duplicates are an error. */
static kiln_status axes_mask(const struct kiln_node *node, const int64_t *axes, int n, int rank,
                             bool *mask)
{
    for (int i = 0; i < rank; i++) mask[i] = false;
    for (int i = 0; i < n; i++) {
        int a;
        kiln_status st = kiln_norm_axis(node, axes[i], rank, &a);
        if (st != KILN_OK) return st;
        if (rank == 0 || mask[a])
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "axes has %lld out of range or twice", (long long)axes[i]);
        mask[a] = true;
    }
    return KILN_OK;
}

/* Squeeze: drop the listed dims (which must be 1), or every dim of 1. */
static kiln_status squeeze_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    int64_t axes[KILN_MAX_RANK];
    int n;
    bool given, known;
    kiln_status st = squeeze_axes(node, has_in(ctx, 1), in_value(ctx, 1), axes, &n, &given,
                                  &known);
    if (st != KILN_OK) return st;
    if (given && known && n == 0) given = false; /* empty axes squeeze every 1, as in ORT */
    struct kiln_type t;
    if (x->rank < 0 || !known) {
        int r = -1;
        if (x->rank >= 0 && ctx->in[1] && ctx->in[1]->rank == 1 && ctx->in[1]->dims[0] > 0 &&
            ctx->in[1]->dims[0] <= x->rank)
            r = x->rank - (int)ctx->in[1]->dims[0];
        type_unknown_dims(&t, x->dtype, r);
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    bool mask[KILN_MAX_RANK];
    if (given) {
        st = axes_mask(node, axes, n, x->rank, mask);
        if (st != KILN_OK) return st;
        for (int i = 0; i < x->rank; i++)
            if (mask[i] && x->dims[i] >= 0 && x->dims[i] != 1)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "cannot squeeze dim %d of size %lld", i,
                                       (long long)x->dims[i]);
    } else {
        for (int i = 0; i < x->rank; i++) {
            if (x->dims[i] < 0) { /* could be 1: the rank is unknown */
                type_unknown_dims(&t, x->dtype, -1);
                set_out(ctx, 0, &t);
                return KILN_OK;
            }
            mask[i] = x->dims[i] == 1;
        }
    }
    kiln_type_unknown(&t);
    t.dtype = x->dtype;
    t.rank = 0;
    for (int i = 0; i < x->rank; i++) {
        if (mask[i]) continue;
        t.dims[t.rank] = x->dims[i];
        t.sym[t.rank] = x->sym[i];
        t.rank++;
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

KILN_REF_OP(Squeeze, squeeze_infer, reshape_run);

/* Unsqueeze: insert dims of 1 at the listed positions of the output. */
static kiln_status unsqueeze_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    int64_t axes[KILN_MAX_RANK];
    int n;
    bool given, known;
    kiln_status st = squeeze_axes(node, has_in(ctx, 1), in_value(ctx, 1), axes, &n, &given,
                                  &known);
    if (st != KILN_OK) return st;
    if (!given) return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "axes is missing");
    struct kiln_type t;
    if (!known) {
        int r = -1;
        if (x->rank >= 0 && ctx->in[1] && ctx->in[1]->rank == 1 && ctx->in[1]->dims[0] >= 0 &&
            x->rank + ctx->in[1]->dims[0] <= KILN_MAX_RANK)
            r = x->rank + (int)ctx->in[1]->dims[0];
        type_unknown_dims(&t, x->dtype, r);
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    if (x->rank < 0) {
        type_unknown_dims(&t, x->dtype, -1);
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    int r = x->rank + n;
    if (r > KILN_MAX_RANK)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                               "output rank %d exceeds Kiln's maximum of %d", r, KILN_MAX_RANK);
    bool mask[KILN_MAX_RANK];
    st = axes_mask(node, axes, n, r, mask);
    if (st != KILN_OK) return st;
    kiln_type_unknown(&t);
    t.dtype = x->dtype;
    t.rank = r;
    for (int i = 0, j = 0; i < r; i++) {
        if (mask[i]) {
            t.dims[i] = 1;
        } else {
            t.dims[i] = x->dims[j];
            t.sym[i] = x->sym[j];
            j++;
        }
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

KILN_REF_OP(Unsqueeze, unsqueeze_infer, reshape_run);

/* ---- Concat, Split ---- */

/* Concat's axis attribute (default 1 before opset 4, required after). */
static kiln_status concat_axis(const struct kiln_node *node, int64_t *axis)
{
    const struct kiln_attr *a = kiln_node_attr(node, "axis");
    if (!a && node->opset >= 4)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "axis attribute is missing");
    *axis = kiln_attr_int(node, "axis", 1);
    return KILN_OK;
}

/* Concat: every input has the output's rank and dims except along axis, where they add up. */
static kiln_status concat_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    int64_t axis_attr = 0;
    kiln_status st = concat_axis(node, &axis_attr);
    if (st != KILN_OK) return st;
    struct kiln_type t;
    kiln_type_unknown(&t);
    const struct kiln_type *first = NULL;
    for (int k = 0; k < ctx->n_in; k++) {
        const struct kiln_type *x = ctx->in[k];
        if (!x) continue;
        if (!first) {
            first = x;
            t.dtype = x->dtype;
        }
        if (x->rank < 0) continue;
        if (t.rank >= 0 && x->rank != t.rank)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "input %d has rank %d but an earlier one has rank %d", k,
                                   x->rank, t.rank);
        t.rank = x->rank;
    }
    if (!first) return KILN_OK;
    if (t.rank < 0) {
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    if (t.rank == 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "cannot concatenate scalars");
    int axis;
    st = kiln_norm_axis(node, axis_attr, t.rank, &axis);
    if (st != KILN_OK) return st;
    for (int i = 0; i < t.rank; i++) t.dims[i] = i == axis ? 0 : -1;
    bool axis_known = true;
    for (int k = 0; k < ctx->n_in; k++) {
        const struct kiln_type *x = ctx->in[k];
        if (!x) continue;
        if (x->rank < 0) {
            axis_known = false;
            continue;
        }
        for (int i = 0; i < t.rank; i++) {
            int64_t d = x->dims[i];
            if (i == axis) {
                if (d < 0 || d > KILN_TENSOR_MAX_BYTES) axis_known = false;
                else t.dims[i] += d;
            } else if (d >= 0) {
                if (t.dims[i] >= 0 && t.dims[i] != d)
                    return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                           "input %d has dim %d = %lld but another input has "
                                           "%lld",
                                           k, i, (long long)d, (long long)t.dims[i]);
                t.dims[i] = d;
                t.sym[i] = NULL;
            } else if (t.dims[i] < 0 && !t.sym[i]) {
                t.sym[i] = x->sym[i];
            }
        }
    }
    if (!axis_known) t.dims[axis] = -1;
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/* Copy each input's block of every outer index into its place along axis. */
static kiln_status concat_run(struct kiln_run_ctx *ctx)
{
    kiln_tensor *out = ctx->out[0];
    int64_t axis_attr = 0;
    kiln_status st = concat_axis(ctx->node, &axis_attr);
    if (st != KILN_OK) return st;
    int axis;
    st = kiln_norm_axis(ctx->node, axis_attr, out->rank, &axis);
    if (st != KILN_OK) return st;
    int64_t outer = dims_product(out->dims, 0, axis);
    int64_t inner = dims_product(out->dims, axis + 1, out->rank);
    int64_t out_block = out->dims[axis] * inner, at = 0;
    for (int k = 0; k < ctx->n_in; k++) {
        const kiln_tensor *x = ctx->in[k];
        if (!x) continue;
        if (x->rank != out->rank || x->dtype != out->dtype || at + x->dims[axis] > out->dims[axis])
            return kiln_node_error(ctx->node, KILN_ERR_INTERNAL,
                                   "input %d does not fit the inferred output", k);
        int64_t block = x->dims[axis] * inner;
        for (int64_t o = 0; o < outer; o++) {
            st = kiln_tensor_copy_elems(out, o * out_block + at * inner, x, o * block, block);
            if (st != KILN_OK) return st;
        }
        at += x->dims[axis];
    }
    return KILN_OK;
}

KILN_REF_OP(Concat, concat_infer, concat_run);

/*
 * The sizes of Split's n outputs along an axis of size dim (-1 if unknown):
 * from the split attribute (before opset 13) or input 1, else equal parts
 * (from opset 18 the last part may be smaller). sizes[i] = -1 if unknown.
 */
static kiln_status split_sizes(const struct kiln_node *node, int n, int64_t dim, bool present,
                               const kiln_tensor *value, int64_t *sizes)
{
    int64_t split[KILN_MAX_IO];
    int c = -1;
    kiln_status st;
    if (node->opset < 13) {
        const int64_t *a;
        c = kiln_attr_ints(node, "split", &a);
        if (c > KILN_MAX_IO)
            return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "split has %d entries; at most %d",
                                   c, KILN_MAX_IO);
        for (int i = 0; i < c; i++) split[i] = a[i];
    }
    if (c < 0 && present) { /* the split input: from opset 13, and optional in opset 1 */
        if (!value) {
            for (int i = 0; i < n; i++) sizes[i] = -1;
            return KILN_OK;
        }
        st = read_ints(node, value, "split", split, KILN_MAX_IO, &c);
        if (st != KILN_OK) return st;
    }
    if (c >= 0) {
        if (c != n)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "split has %d entries for %d outputs", c, n);
        int64_t sum = 0;
        for (int i = 0; i < n; i++) {
            if (split[i] < 0)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "split[%d] is %lld", i,
                                       (long long)split[i]);
            sum += split[i];
            sizes[i] = split[i];
        }
        if (dim >= 0 && sum != dim)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "split sums to %lld but the axis has %lld", (long long)sum,
                                   (long long)dim);
        return KILN_OK;
    }
    int64_t parts = n;
    if (node->opset >= 18 && kiln_node_attr(node, "num_outputs")) {
        parts = kiln_attr_int(node, "num_outputs", n);
        if (parts != n)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "num_outputs is %lld but the node has %d outputs",
                                   (long long)parts, n);
    }
    for (int i = 0; i < n; i++) sizes[i] = -1;
    if (dim < 0) return KILN_OK;
    int64_t chunk = dim / parts;
    if (dim % parts != 0) {
        if (node->opset < 18)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "axis of size %lld does not split into %d equal parts",
                                   (long long)dim, n);
        chunk = (dim + parts - 1) / parts;
    }
    int64_t rest = dim - chunk * (parts - 1);
    if (rest < 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "axis of size %lld does not split into %d parts of %lld",
                               (long long)dim, n, (long long)chunk);
    for (int i = 0; i < n; i++) sizes[i] = i == n - 1 ? rest : chunk;
    return KILN_OK;
}

static kiln_status split_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    if (ctx->n_out > KILN_MAX_IO)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "%d outputs; at most %d", ctx->n_out,
                               KILN_MAX_IO);
    struct kiln_type t = *x;
    if (x->rank < 0) {
        for (int i = 0; i < ctx->n_out; i++) set_out(ctx, i, &t);
        return KILN_OK;
    }
    int axis;
    kiln_status st = kiln_norm_axis(node, kiln_attr_int(node, "axis", 0), x->rank, &axis);
    if (st != KILN_OK) return st;
    if (x->rank == 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "cannot split a scalar");
    int64_t sizes[KILN_MAX_IO];
    st = split_sizes(node, ctx->n_out, x->dims[axis], has_in(ctx, 1), in_value(ctx, 1), sizes);
    if (st != KILN_OK) return st;
    for (int i = 0; i < ctx->n_out; i++) {
        t.dims[axis] = sizes[i];
        t.sym[axis] = NULL;
        set_out(ctx, i, &t);
    }
    return KILN_OK;
}

/* Each output takes its run of the axis from every outer index. */
static kiln_status split_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    int axis;
    kiln_status st = kiln_norm_axis(ctx->node, kiln_attr_int(ctx->node, "axis", 0), x->rank, &axis);
    if (st != KILN_OK) return st;
    int64_t outer = dims_product(x->dims, 0, axis);
    int64_t inner = dims_product(x->dims, axis + 1, x->rank);
    int64_t in_block = x->dims[axis] * inner, at = 0;
    for (int i = 0; i < ctx->n_out; i++) {
        kiln_tensor *y = ctx->out[i];
        if (!y) continue;
        if (y->rank != x->rank || at + y->dims[axis] > x->dims[axis])
            return kiln_node_error(ctx->node, KILN_ERR_INTERNAL,
                                   "output %d does not fit the input", i);
        int64_t block = y->dims[axis] * inner;
        for (int64_t o = 0; o < outer; o++) {
            st = kiln_tensor_copy_elems(y, o * block, x, o * in_block + at * inner, block);
            if (st != KILN_OK) return st;
        }
        at += y->dims[axis];
    }
    return KILN_OK;
}

KILN_REF_OP(Split, split_infer, split_run);

/* ---- Slice ---- */

/* Slice's arguments: starts, ends, axes, steps, one entry per sliced axis. */
struct slice_args {
    int n;
    int64_t starts[KILN_MAX_RANK], ends[KILN_MAX_RANK], axes[KILN_MAX_RANK],
        steps[KILN_MAX_RANK];
};

/*
 * Gather Slice's arguments from the attributes (before opset 10) or inputs
 * 1..4 (vals[k], NULL when absent or unknown; present[k] says which exist).
 * *known is false if a present input's value is not known yet.
 */
static kiln_status slice_args_get(const struct kiln_node *node, const bool *present,
                                  const kiln_tensor *const *vals, struct slice_args *s,
                                  bool *known)
{
    *known = true;
    int n_axes = -1, n_steps = -1, n_ends;
    kiln_status st;
    if (node->opset < 10) {
        const int64_t *a;
        int c = kiln_attr_ints(node, "starts", &a);
        if (c < 0 || c > KILN_MAX_RANK)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "starts attribute is missing or too long");
        for (int i = 0; i < c; i++) s->starts[i] = a[i];
        s->n = c;
        n_ends = kiln_attr_ints(node, "ends", &a);
        for (int i = 0; i < n_ends && i < KILN_MAX_RANK; i++) s->ends[i] = a[i];
        n_axes = kiln_attr_ints(node, "axes", &a);
        for (int i = 0; i < n_axes && i < KILN_MAX_RANK; i++) s->axes[i] = a[i];
    } else {
        for (int k = 1; k <= 4; k++)
            if (present[k] && !vals[k]) *known = false;
        if (!present[1] || !present[2])
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "starts and ends are required");
        if (!*known) return KILN_OK;
        if ((st = read_ints(node, vals[1], "starts", s->starts, KILN_MAX_RANK, &s->n)) != KILN_OK ||
            (st = read_ints(node, vals[2], "ends", s->ends, KILN_MAX_RANK, &n_ends)) != KILN_OK)
            return st;
        if (present[3] &&
            (st = read_ints(node, vals[3], "axes", s->axes, KILN_MAX_RANK, &n_axes)) != KILN_OK)
            return st;
        if (present[4] &&
            (st = read_ints(node, vals[4], "steps", s->steps, KILN_MAX_RANK, &n_steps)) != KILN_OK)
            return st;
    }
    if (n_ends != s->n || (n_axes >= 0 && n_axes != s->n) || (n_steps >= 0 && n_steps != s->n))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "starts has %d entries but ends, axes or steps differ", s->n);
    for (int i = 0; i < s->n; i++) {
        if (n_axes < 0) s->axes[i] = i;
        if (n_steps < 0) s->steps[i] = 1;
        if (s->steps[i] == 0)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "steps[%d] is 0", i);
    }
    return KILN_OK;
}

/* Normalize the sliced axes against rank; out[i] is the dim of entry i. */
static kiln_status slice_axes(const struct kiln_node *node, const struct slice_args *s, int rank,
                              int *out)
{
    bool seen[KILN_MAX_RANK] = {false};
    for (int i = 0; i < s->n; i++) {
        kiln_status st = kiln_norm_axis(node, s->axes[i], rank, &out[i]);
        if (st != KILN_OK) return st;
        if (rank == 0 || seen[out[i]])
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "axes has %lld out of range or twice", (long long)s->axes[i]);
        seen[out[i]] = true;
    }
    return KILN_OK;
}

/* Clamp one axis's start/end to a dim of size d; return the first index and the count. */
static void slice_clamp(int64_t d, int64_t start, int64_t end, int64_t step, int64_t *first,
                        int64_t *count)
{
    if (start < 0) start += d;
    if (end < 0) end += d;
    uint64_t diff, astep;
    if (step > 0) {
        start = start < 0 ? 0 : start > d ? d : start;
        end = end < 0 ? 0 : end > d ? d : end;
        diff = end > start ? (uint64_t)(end - start) : 0;
        astep = (uint64_t)step;
    } else {
        start = start < 0 ? 0 : start > d - 1 ? d - 1 : start;
        end = end < -1 ? -1 : end > d - 1 ? d - 1 : end;
        diff = start > end ? (uint64_t)(start - end) : 0;
        astep = (uint64_t)0 - (uint64_t)step;
    }
    *first = start;
    *count = d == 0 || diff == 0 ? 0 : (int64_t)((diff - 1) / astep + 1);
}

static kiln_status slice_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    bool present[5] = {true};
    const kiln_tensor *vals[5] = {NULL};
    for (int k = 1; k < 5; k++) {
        present[k] = has_in(ctx, k);
        vals[k] = in_value(ctx, k);
    }
    struct slice_args s;
    bool known;
    kiln_status st = slice_args_get(node, present, vals, &s, &known);
    if (st != KILN_OK) return st;
    struct kiln_type t;
    if (x->rank < 0 || !known) {
        type_unknown_dims(&t, x->dtype, x->rank);
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    int axes[KILN_MAX_RANK];
    st = slice_axes(node, &s, x->rank, axes);
    if (st != KILN_OK) return st;
    t = *x;
    for (int i = 0; i < s.n; i++) {
        int a = axes[i];
        t.sym[a] = NULL;
        if (x->dims[a] < 0) continue;
        int64_t first = 0;
        slice_clamp(x->dims[a], s.starts[i], s.ends[i], s.steps[i], &first, &t.dims[a]);
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/* A strided view: offset by the starts, strides scaled by the steps. */
static kiln_status slice_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    bool present[5] = {true};
    const kiln_tensor *vals[5] = {NULL};
    for (int k = 1; k < 5; k++) {
        present[k] = k < ctx->n_in && ctx->in[k];
        vals[k] = present[k] ? ctx->in[k] : NULL;
    }
    struct slice_args s;
    bool known;
    kiln_status st = slice_args_get(node, present, vals, &s, &known);
    if (st != KILN_OK) return st;
    int axes[KILN_MAX_RANK];
    st = slice_axes(node, &s, x->rank, axes);
    if (st != KILN_OK) return st;
    int64_t strides[KILN_MAX_RANK], vstrides[KILN_MAX_RANK], dims[KILN_MAX_RANK];
    kiln_shape_strides(x->rank, x->dims, strides);
    for (int i = 0; i < x->rank; i++) {
        dims[i] = x->dims[i];
        vstrides[i] = strides[i];
    }
    int64_t base = 0;
    for (int i = 0; i < s.n; i++) {
        int a = axes[i];
        int64_t first = 0;
        slice_clamp(x->dims[a], s.starts[i], s.ends[i], s.steps[i], &first, &dims[a]);
        if (dims[a] > 0) base += first * strides[a];
        vstrides[a] = strides[a] * s.steps[i];
    }
    if (kiln_shape_count(x->rank, dims) != kiln_tensor_count(ctx->out[0]))
        return kiln_node_error(node, KILN_ERR_INTERNAL, "slice does not match the inferred output");
    return copy_view(ctx->out[0], x, x->rank, dims, base, vstrides);
}

KILN_REF_OP(Slice, slice_infer, slice_run);

/* ---- Expand, Tile ---- */

/* Expand: the input broadcast with the shape value. */
static kiln_status expand_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    struct kiln_type shape_t, t;
    const kiln_tensor *shape = in_value(ctx, 1);
    if (shape) {
        int64_t dims[KILN_MAX_RANK];
        int n;
        kiln_status st = read_ints(ctx->node, shape, "shape", dims, KILN_MAX_RANK, &n);
        if (st != KILN_OK) return st;
        for (int i = 0; i < n; i++)
            if (dims[i] < 0)
                return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                       "shape[%d] is %lld", i, (long long)dims[i]);
        kiln_type_set(&shape_t, x->dtype, n, dims);
    } else if (ctx->in[1] && ctx->in[1]->rank == 1 && ctx->in[1]->dims[0] >= 0 &&
               ctx->in[1]->dims[0] <= KILN_MAX_RANK) {
        type_unknown_dims(&shape_t, x->dtype, (int)ctx->in[1]->dims[0]);
    } else {
        type_unknown_dims(&t, x->dtype, -1);
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    const struct kiln_type *both[2] = {x, &shape_t};
    kiln_type_unknown(&t);
    t.dtype = x->dtype;
    kiln_status st = kiln_infer_broadcast_types(ctx->node, 2, both, &t);
    if (st != KILN_OK) return st;
    set_out(ctx, 0, &t);
    return KILN_OK;
}

static kiln_status expand_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *out = ctx->out[0];
    if (x->rank > out->rank)
        return kiln_node_error(ctx->node, KILN_ERR_INTERNAL, "output rank below input rank");
    int64_t strides[KILN_MAX_RANK];
    kiln_broadcast_strides(x->rank, x->dims, out->rank, out->dims, strides);
    return copy_view(out, x, out->rank, out->dims, 0, strides);
}

KILN_REF_OP(Expand, expand_infer, expand_run);

/* Tile's repeats (one per input dim, none negative). */
static kiln_status tile_repeats(const struct kiln_node *node, const kiln_tensor *value, int rank,
                                int64_t *reps)
{
    int n;
    kiln_status st = read_ints(node, value, "repeats", reps, KILN_MAX_RANK, &n);
    if (st != KILN_OK) return st;
    if (n != rank)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "repeats has %d entries but the input has rank %d", n, rank);
    for (int i = 0; i < n; i++)
        if (reps[i] < 0)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "repeats[%d] is %lld", i,
                                   (long long)reps[i]);
    return KILN_OK;
}

static kiln_status tile_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    struct kiln_type t;
    const kiln_tensor *reps_v = in_value(ctx, 1);
    if (x->rank < 0 || !reps_v) {
        type_unknown_dims(&t, x->dtype, x->rank);
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    int64_t reps[KILN_MAX_RANK];
    kiln_status st = tile_repeats(ctx->node, reps_v, x->rank, reps);
    if (st != KILN_OK) return st;
    t = *x;
    for (int i = 0; i < x->rank; i++) {
        if (reps[i] == 1) continue;
        t.sym[i] = NULL;
        if (reps[i] == 0) {
            t.dims[i] = 0;
        } else if (x->dims[i] >= 0) {
            t.dims[i] = size_mul(x->dims[i], reps[i]);
            if (t.dims[i] < 0)
                return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                       "repeats[%d] = %lld makes dim %d too large", i,
                                       (long long)reps[i], i);
        }
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/* Output dim i viewed as [repeats[i], dims[i]]: stride 0 over the repeats. */
static kiln_status tile_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    int64_t reps[KILN_MAX_RANK];
    kiln_status st = tile_repeats(ctx->node, ctx->in[1], x->rank, reps);
    if (st != KILN_OK) return st;
    int64_t strides[KILN_MAX_RANK], vdims[VIEW_MAX], vstrides[VIEW_MAX];
    kiln_shape_strides(x->rank, x->dims, strides);
    for (int i = 0; i < x->rank; i++) {
        vdims[2 * i] = reps[i];
        vstrides[2 * i] = 0;
        vdims[2 * i + 1] = x->dims[i];
        vstrides[2 * i + 1] = strides[i];
    }
    if (kiln_shape_count(2 * x->rank, vdims) != kiln_tensor_count(ctx->out[0]))
        return kiln_node_error(ctx->node, KILN_ERR_INTERNAL, "tile does not match the output");
    return copy_view(ctx->out[0], x, 2 * x->rank, vdims, 0, vstrides);
}

KILN_REF_OP(Tile, tile_infer, tile_run);

/* ---- Pad, CenterCropPad ---- */

static kiln_status pad_mode_get(const struct kiln_node *node, enum pad_mode *mode)
{
    const char *m = kiln_attr_str(node, "mode", "constant");
    if (!pad_mode_parse(m, mode))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "mode '%s' is not supported", m);
    return KILN_OK;
}

/*
 * Pad's begin/end amounts for every dim of a rank-`rank` input: from the
 * pads (or opset-1 paddings) attribute before opset 11, else from input 1
 * over the axes of input 3. *known is false while those values are unknown.
 */
static kiln_status pad_amounts(const struct kiln_node *node, int rank, const kiln_tensor *pads_v,
                               bool axes_present, const kiln_tensor *axes_v, int64_t *pb,
                               int64_t *pe, bool *known)
{
    int64_t pads[2 * KILN_MAX_RANK], axes[KILN_MAX_RANK];
    int n, n_axes = rank;
    *known = true;
    for (int i = 0; i < rank; i++) pb[i] = pe[i] = 0;
    if (node->opset < 11) {
        const int64_t *a;
        n = kiln_attr_ints(node, "pads", &a);
        if (n < 0) n = kiln_attr_ints(node, "paddings", &a);
        if (n < 0)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "pads attribute is missing");
        if (n > 2 * KILN_MAX_RANK)
            return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "pads has %d entries", n);
        for (int i = 0; i < n; i++) pads[i] = a[i];
    } else {
        if (!pads_v || (axes_present && !axes_v)) {
            *known = false;
            return KILN_OK;
        }
        kiln_status st = read_ints(node, pads_v, "pads", pads, 2 * KILN_MAX_RANK, &n);
        if (st != KILN_OK) return st;
        if (axes_present) {
            st = read_ints(node, axes_v, "axes", axes, KILN_MAX_RANK, &n_axes);
            if (st != KILN_OK) return st;
        }
    }
    if (!axes_present || node->opset < 11)
        for (int i = 0; i < rank; i++) axes[i] = i;
    if (n != 2 * n_axes)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "pads has %d entries; expected %d (two per axis)", n, 2 * n_axes);
    for (int i = 0; i < n; i++)
        if (pads[i] > KILN_TENSOR_MAX_BYTES || pads[i] < -KILN_TENSOR_MAX_BYTES)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "pads[%d] = %lld is too large",
                                   i, (long long)pads[i]);
    bool mask[KILN_MAX_RANK];
    kiln_status st = axes_mask(node, axes, n_axes, rank, mask);
    if (st != KILN_OK) return st;
    for (int i = 0; i < n_axes; i++) {
        int a = (int)(axes[i] < 0 ? axes[i] + rank : axes[i]);
        pb[a] = pads[i];
        pe[a] = pads[n_axes + i];
    }
    return KILN_OK;
}

static kiln_status pad_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    enum pad_mode mode;
    kiln_status st = pad_mode_get(ctx->node, &mode);
    if (st != KILN_OK) return st;
    struct kiln_type t;
    if (x->rank < 0) {
        type_unknown_dims(&t, x->dtype, -1);
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    int64_t pb[KILN_MAX_RANK], pe[KILN_MAX_RANK];
    bool known;
    st = pad_amounts(ctx->node, x->rank, in_value(ctx, 1), has_in(ctx, 3), in_value(ctx, 3), pb,
                     pe, &known);
    if (st != KILN_OK) return st;
    if (!known) {
        type_unknown_dims(&t, x->dtype, x->rank);
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    t = *x;
    for (int i = 0; i < x->rank; i++) {
        if (pb[i] == 0 && pe[i] == 0) continue;
        t.sym[i] = NULL;
        if (x->dims[i] < 0) continue;
        t.dims[i] = x->dims[i] + pb[i] + pe[i];
        if (t.dims[i] < 0 || x->dims[i] > KILN_TENSOR_MAX_BYTES)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "pads %lld, %lld make dim %d of size %lld negative",
                                   (long long)pb[i], (long long)pe[i], i, (long long)x->dims[i]);
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/*
 * Fill out from in padded by pb[d] before each dim (negative = cropped):
 * in constant mode elements outside the input are cval (a one-element
 * tensor of out's dtype, or NULL for zero); other modes map them inside.
 */
static kiln_status pad_fill(const struct kiln_node *node, kiln_tensor *out, const kiln_tensor *in,
                            const int64_t *pb, enum pad_mode mode, const kiln_tensor *cval)
{
    int64_t total = kiln_tensor_count(out);
    int r = out->rank;
    kiln_status st = KILN_OK;
    if (total == 0) return KILN_OK;
    if (mode == PAD_CONSTANT && cval) {
        st = kiln_tensor_fill_elems(out, 0, total, cval, 0);
        if (st != KILN_OK) return st;
    }
    if (kiln_tensor_count(in) == 0) {
        if (mode != PAD_CONSTANT)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "cannot pad an empty input in %s mode",
                                   kiln_attr_str(node, "mode", "constant"));
        return KILN_OK;
    }
    if (r == 0) return kiln_tensor_copy_elems(out, 0, in, 0, 1);
    int64_t strides[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    kiln_shape_strides(r, in->dims, strides);
    int64_t row = out->dims[r - 1], n = in->dims[r - 1], b = pb[r - 1];
    for (int64_t o = 0; o < total; o += row) {
        int64_t off = 0;
        bool inside = true;
        for (int d = 0; d < r - 1 && inside; d++) {
            int64_t c = 0;
            inside = pad_map(idx[d] - pb[d], in->dims[d], mode, &c);
            off += c * strides[d];
        }
        if (inside && mode == PAD_CONSTANT) {
            int64_t lo = b > 0 ? b : 0, hi = b + n < row ? b + n : row;
            if (hi > lo) st = kiln_tensor_copy_elems(out, o + lo, in, off + lo - b, hi - lo);
            if (st != KILN_OK) return st;
        } else if (inside) {
            for (int64_t j = 0; j < row; j++) {
                int64_t c = 0;
                pad_map(j - b, n, mode, &c);
                st = kiln_tensor_copy_elems(out, o + j, in, off + c, 1);
                if (st != KILN_OK) return st;
            }
        }
        for (int d = r - 2; d >= 0; d--) {
            if (++idx[d] < out->dims[d]) break;
            idx[d] = 0;
        }
    }
    return KILN_OK;
}

static kiln_status pad_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *out = ctx->out[0];
    enum pad_mode mode;
    kiln_status st = pad_mode_get(node, &mode);
    if (st != KILN_OK) return st;
    int64_t pb[KILN_MAX_RANK], pe[KILN_MAX_RANK];
    bool known;
    bool axes_present = ctx->n_in > 3 && ctx->in[3];
    st = pad_amounts(node, x->rank, ctx->n_in > 1 ? ctx->in[1] : NULL, axes_present,
                     axes_present ? ctx->in[3] : NULL, pb, pe, &known);
    if (st != KILN_OK) return st;
    if (!known) return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "pads input is missing");
    for (int i = 0; i < x->rank; i++)
        if (out->dims[i] != x->dims[i] + pb[i] + pe[i])
            return kiln_node_error(node, KILN_ERR_INTERNAL, "pads do not match the output");
    /* the constant: a one-element tensor of the output's dtype on the stack */
    union {
        uint64_t u;
        kiln_string s;
    } cbuf;
    memset(&cbuf, 0, sizeof cbuf);
    kiln_tensor cval = {.dtype = out->dtype, .rank = 0, .data = &cbuf,
                        .nbytes = kiln_dtype_size(out->dtype)};
    const kiln_tensor *cv = NULL;
    if (mode == PAD_CONSTANT && node->opset < 11) {
        if (out->dtype == KILN_DTYPE_STRING)
            return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "constant padding of strings");
        kiln_set_f64(out->dtype, &cbuf, 0, kiln_attr_float(node, "value", 0.0f));
        cv = &cval;
    } else if (mode == PAD_CONSTANT && ctx->n_in > 2 && ctx->in[2]) {
        const kiln_tensor *c = ctx->in[2];
        if (kiln_tensor_count(c) != 1)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "constant_value must hold one element, got %lld",
                                   (long long)kiln_tensor_count(c));
        if (c->dtype == out->dtype) {
            cv = c;
        } else if (kiln_dtype_is_numeric(c->dtype) && kiln_dtype_is_numeric(out->dtype)) {
            kiln_convert_elem(out->dtype, &cbuf, 0, c->dtype, c->data, 0);
            cv = &cval;
        } else {
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "constant_value is %s but the data is %s",
                                   kiln_dtype_name(c->dtype), kiln_dtype_name(out->dtype));
        }
    }
    return pad_fill(node, out, x, pb, mode, cv);
}

KILN_REF_OP(Pad, pad_infer, pad_run);

/*
 * CenterCropPad's target sizes for every dim: the shape value over the axes
 * attribute (all dims by default); dims not listed keep target -1.
 */
static kiln_status center_crop_targets(const struct kiln_node *node, int rank,
                                       const kiln_tensor *shape, int64_t *target)
{
    int64_t vals[KILN_MAX_RANK], axes[KILN_MAX_RANK];
    int n;
    kiln_status st = read_ints(node, shape, "shape", vals, KILN_MAX_RANK, &n);
    if (st != KILN_OK) return st;
    const int64_t *a;
    int n_axes = kiln_attr_ints(node, "axes", &a);
    if (n_axes > KILN_MAX_RANK)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "axes has %d entries", n_axes);
    if (n_axes < 0) {
        n_axes = rank;
        for (int i = 0; i < rank; i++) axes[i] = i;
    } else {
        for (int i = 0; i < n_axes; i++) axes[i] = a[i];
    }
    if (n != n_axes)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "shape has %d entries for %d axes", n, n_axes);
    bool mask[KILN_MAX_RANK];
    st = axes_mask(node, axes, n_axes, rank, mask);
    if (st != KILN_OK) return st;
    for (int i = 0; i < rank; i++) target[i] = -1;
    for (int i = 0; i < n; i++) {
        if (vals[i] < 0)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "shape[%d] is %lld", i,
                                   (long long)vals[i]);
        target[axes[i] < 0 ? axes[i] + rank : axes[i]] = vals[i];
    }
    return KILN_OK;
}

static kiln_status center_crop_pad_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    struct kiln_type t;
    const kiln_tensor *shape = in_value(ctx, 1);
    if (x->rank < 0 || !shape) {
        type_unknown_dims(&t, x->dtype, x->rank);
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    int64_t target[KILN_MAX_RANK];
    kiln_status st = center_crop_targets(ctx->node, x->rank, shape, target);
    if (st != KILN_OK) return st;
    t = *x;
    for (int i = 0; i < x->rank; i++) {
        if (target[i] < 0) continue;
        t.dims[i] = target[i];
        t.sym[i] = NULL;
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/* A centred window: crops start at floor((in - target) / 2), pads put the floor half before. */
static kiln_status center_crop_pad_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *out = ctx->out[0];
    int64_t target[KILN_MAX_RANK], pb[KILN_MAX_RANK];
    kiln_status st = center_crop_targets(ctx->node, x->rank, ctx->in[1], target);
    if (st != KILN_OK) return st;
    for (int i = 0; i < x->rank; i++) {
        int64_t tg = target[i] < 0 ? x->dims[i] : target[i];
        if (out->dims[i] != tg)
            return kiln_node_error(ctx->node, KILN_ERR_INTERNAL, "shape does not match the output");
        pb[i] = tg >= x->dims[i] ? (tg - x->dims[i]) / 2 : -((x->dims[i] - tg) / 2);
    }
    return pad_fill(ctx->node, out, x, pb, PAD_CONSTANT, NULL);
}

KILN_REF_OP(CenterCropPad, center_crop_pad_infer, center_crop_pad_run);

/* ---- DepthToSpace, SpaceToDepth, Trilu ---- */

/* The blocksize attribute (required, positive). */
static kiln_status blocksize_get(const struct kiln_node *node, int64_t *b)
{
    *b = kiln_attr_int(node, "blocksize", 0);
    if (*b <= 0 || *b > 65536)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "blocksize is %lld; it must be in [1, 65536]", (long long)*b);
    return KILN_OK;
}

/* DepthToSpace (to_space) or SpaceToDepth: NCHW with C and H, W traded by blocksize^2. */
static kiln_status space_depth_infer(struct kiln_infer_ctx *ctx, bool to_space)
{
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    int64_t b;
    kiln_status st = blocksize_get(ctx->node, &b);
    if (st != KILN_OK) return st;
    if (to_space) {
        const char *mode = kiln_attr_str(ctx->node, "mode", "DCR");
        if (strcmp(mode, "DCR") != 0 && strcmp(mode, "CRD") != 0)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "mode '%s' is not DCR or CRD",
                                   mode);
    }
    struct kiln_type t;
    type_unknown_dims(&t, x->dtype, 4);
    if (x->rank < 0) {
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    if (x->rank != 4)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "input must be 4-D (NCHW), got rank %d", x->rank);
    t.dims[0] = x->dims[0];
    t.sym[0] = x->sym[0];
    if (to_space) {
        if (x->dims[1] >= 0 && x->dims[1] % (b * b) != 0)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "channels %lld are not divisible by blocksize^2 = %lld",
                                   (long long)x->dims[1], (long long)(b * b));
        t.dims[1] = x->dims[1] >= 0 ? x->dims[1] / (b * b) : -1;
        for (int i = 2; i < 4; i++) {
            if (x->dims[i] < 0) continue;
            t.dims[i] = size_mul(x->dims[i], b);
            if (t.dims[i] < 0)
                return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                       "dim %d of size %lld times blocksize is too large", i,
                                       (long long)x->dims[i]);
        }
    } else {
        for (int i = 2; i < 4; i++)
            if (x->dims[i] >= 0 && x->dims[i] % b != 0)
                return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                       "dim %d of size %lld is not divisible by blocksize %lld",
                                       i, (long long)x->dims[i], (long long)b);
        t.dims[1] = x->dims[1] >= 0 ? size_mul(x->dims[1], b * b) : -1;
        if (x->dims[1] >= 0 && t.dims[1] < 0)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "channels %lld times blocksize^2 are too many",
                                   (long long)x->dims[1]);
        t.dims[2] = x->dims[2] >= 0 ? x->dims[2] / b : -1;
        t.dims[3] = x->dims[3] >= 0 ? x->dims[3] / b : -1;
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

static kiln_status depth_to_space_infer(struct kiln_infer_ctx *ctx)
{
    return space_depth_infer(ctx, true);
}

static kiln_status space_to_depth_infer(struct kiln_infer_ctx *ctx)
{
    return space_depth_infer(ctx, false);
}

/*
 * The output [N, C/b^2, H*b, W*b] viewed as [N, C', H, b(i), W, b(j)] reads
 * channel (i*b + j)*C' + c in DCR mode and c*b^2 + i*b + j in CRD mode.
 */
static kiln_status depth_to_space_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    int64_t b;
    kiln_status st = blocksize_get(ctx->node, &b);
    if (st != KILN_OK) return st;
    bool crd = strcmp(kiln_attr_str(ctx->node, "mode", "DCR"), "CRD") == 0;
    int64_t s[4];
    kiln_shape_strides(4, x->dims, s);
    int64_t c2 = x->dims[1] / (b * b);
    int64_t dims[6] = {x->dims[0], c2, x->dims[2], b, x->dims[3], b};
    int64_t strides[6] = {s[0], crd ? b * b * s[1] : s[1], s[2], crd ? b * s[1] : b * c2 * s[1],
                          s[3], crd ? s[1] : c2 * s[1]};
    return copy_view(ctx->out[0], x, 6, dims, 0, strides);
}

/* The output [N, C*b^2, H/b, W/b] viewed as [N, b(i), b(j), C, H', W'] reads x[n, c, h*b+i, w*b+j]. */
static kiln_status space_to_depth_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    int64_t b;
    kiln_status st = blocksize_get(ctx->node, &b);
    if (st != KILN_OK) return st;
    int64_t s[4];
    kiln_shape_strides(4, x->dims, s);
    int64_t dims[6] = {x->dims[0], b, b, x->dims[1], x->dims[2] / b, x->dims[3] / b};
    int64_t strides[6] = {s[0], s[2], s[3], s[1], b * s[2], b * s[3]};
    return copy_view(ctx->out[0], x, 6, dims, 0, strides);
}

KILN_REF_OP(DepthToSpace, depth_to_space_infer, depth_to_space_run);
KILN_REF_OP(SpaceToDepth, space_to_depth_infer, space_to_depth_run);

static kiln_status trilu_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    if (x->rank >= 0 && x->rank < 2)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "input must have rank >= 2, got %d", x->rank);
    set_out(ctx, 0, x);
    return KILN_OK;
}

/* Keep j - i >= k (upper) or j - i <= k (lower) in each matrix; the rest stays zero. */
static kiln_status trilu_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *out = ctx->out[0];
    int64_t k = 0;
    if (ctx->n_in > 1 && ctx->in[1]) {
        if (kiln_tensor_count(ctx->in[1]) != 1 || !kiln_dtype_is_int(ctx->in[1]->dtype))
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "k must be an integer scalar");
        k = kiln_tensor_i64(ctx->in[1], 0);
    }
    bool upper = kiln_attr_int(ctx->node, "upper", 1) != 0;
    int64_t rows = x->dims[x->rank - 2], cols = x->dims[x->rank - 1];
    int64_t lim = rows + cols;
    k = k < -lim ? -lim : k > lim ? lim : k;
    int64_t mats = dims_product(x->dims, 0, x->rank - 2);
    for (int64_t m = 0; m < mats; m++) {
        for (int64_t i = 0; i < rows; i++) {
            int64_t lo = upper ? i + k : 0, hi = upper ? cols : i + k + 1;
            lo = lo < 0 ? 0 : lo;
            hi = hi > cols ? cols : hi;
            int64_t at = (m * rows + i) * cols;
            kiln_status st = kiln_tensor_copy_elems(out, at + lo, x, at + lo, hi - lo);
            if (st != KILN_OK) return st;
        }
    }
    return KILN_OK;
}

KILN_REF_OP(Trilu, trilu_infer, trilu_run);
