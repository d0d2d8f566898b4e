/*
 * reduce.c - reference kernels for reductions, arg-reductions, scans and
 * sorting: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd,
 * ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceSumSquare,
 * ArgMax, ArgMin, TopK, CumSum and CumProd. (Hardmax lives in norm.c with
 * the softmax family, whose axis handling it shares.)
 *
 * Reduce* take their axes from the attribute (ReduceSum before opset 13,
 * the others before 18) or from the optional second input; an empty axes
 * list reduces everything unless noop_with_empty_axes is set, in which case
 * each element is reduced on its own (so ReduceSumSquare still squares).
 * Reducing an empty set gives the reduction's identity: 0 for sums, 1 for
 * products, -inf / +inf (or the integer type's limits) for max / min, -inf
 * for the log reductions and NaN for the mean.
 *
 * Floats are accumulated in double and integers in 64-bit wrapping
 * arithmetic, so every dtype goes through one generic loop; float32
 * reductions over trailing axes (ReduceMean in LayerNorm-style graphs) take
 * a typed fast path.
 */
#include <float.h>

#include "kernels/kernel.h"

/* ---- index walks over a subset of a tensor's dims ---- */

/* Visits every index of dims[0..n) in row-major order, keeping the flat
 * offset (sum of idx * strides) into the tensor the dims came from. */
struct sub_walk {
    int n;
    int64_t dims[KILN_MAX_RANK];
    int64_t strides[KILN_MAX_RANK];
    int64_t idx[KILN_MAX_RANK];
    int64_t off;
};

static void sub_walk_start(struct sub_walk *w, int64_t base)
{
    for (int d = 0; d < w->n; d++) w->idx[d] = 0;
    w->off = base;
}

static void sub_walk_next(struct sub_walk *w)
{
    for (int d = w->n - 1; d >= 0; d--) {
        w->idx[d]++;
        w->off += w->strides[d];
        if (w->idx[d] < w->dims[d]) return;
        w->off -= w->strides[d] * w->dims[d];
        w->idx[d] = 0;
    }
}

/* Product of dims[lo..hi). */
static int64_t dims_product(const int64_t *dims, int lo, int hi)
{
    int64_t p = 1;
    for (int d = lo; d < hi; d++) p *= dims[d];
    return p;
}

/* The known value of input i at infer time, or NULL. */
static const kiln_tensor *infer_value(const struct kiln_infer_ctx *ctx, int i)
{
    if (i >= ctx->n_in || !ctx->in[i] || !ctx->in_value) return NULL;
    return ctx->in_value[i];
}

/* Lowest and highest value of an integer (or bool) dtype, as int64; U64's
 * highest is returned as its bit pattern (-1). */
static int64_t int_lowest(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_I8: return INT8_MIN;
    case KILN_DTYPE_I16: return INT16_MIN;
    case KILN_DTYPE_I32: return INT32_MIN;
    case KILN_DTYPE_I64: return INT64_MIN;
    default: return 0;
    }
}

static int64_t int_highest(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_I8: return INT8_MAX;
    case KILN_DTYPE_U8: return UINT8_MAX;
    case KILN_DTYPE_I16: return INT16_MAX;
    case KILN_DTYPE_U16: return UINT16_MAX;
    case KILN_DTYPE_I32: return INT32_MAX;
    case KILN_DTYPE_U32: return UINT32_MAX;
    case KILN_DTYPE_I64: return INT64_MAX;
    case KILN_DTYPE_U64: return -1;
    case KILN_DTYPE_BOOL: return 1;
    default: return 0;
    }
}

/* a < b for two integer elements read with kiln_get_i64 (U64 compares unsigned). */
static bool int_less(kiln_dtype dt, int64_t a, int64_t b)
{
    if (dt == KILN_DTYPE_U64) return (uint64_t)a < (uint64_t)b;
    return a < b;
}

/* ---- Reduce* ---- */

enum reduce_kind {
    RED_SUM,
    RED_MEAN,
    RED_MAX,
    RED_MIN,
    RED_PROD,
    RED_L1,
    RED_L2,
    RED_LOG_SUM,
    RED_LOG_SUM_EXP,
    RED_SUM_SQUARE,
};

/* Which axes a Reduce node reduces, and whether it keeps them. */
struct reduce_plan {
    bool reduced[KILN_MAX_RANK];
    bool keepdims;
};

/* Build the plan of a Reduce node over an input of the given rank. Axes
 * come from input 1 when the node has it (axes_value NULL = not known yet,
 * then *known is false) or else from the "axes" attribute. */
static kiln_status reduce_plan_make(const struct kiln_node *node, bool has_axes_input,
                                    const kiln_tensor *axes_value, int rank,
                                    struct reduce_plan *p, bool *known)
{
    memset(p, 0, sizeof *p);
    p->keepdims = kiln_attr_int(node, "keepdims", 1) != 0;
    bool noop = kiln_attr_int(node, "noop_with_empty_axes", 0) != 0;
    *known = true;

    const int64_t *attr_axes = NULL;
    int64_t n_axes;
    if (has_axes_input) {
        if (!axes_value) {
            *known = false;
            return KILN_OK;
        }
        if (!kiln_dtype_is_int(axes_value->dtype) || axes_value->rank > 1)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "axes input must be a 1-D integer tensor, got %s of rank %d",
                                   kiln_dtype_name(axes_value->dtype), axes_value->rank);
        n_axes = kiln_shape_count(axes_value->rank, axes_value->dims);
    } else {
        n_axes = kiln_attr_ints(node, "axes", &attr_axes);
        if (n_axes < 0) n_axes = 0;
    }

    if (n_axes == 0) {
        if (!noop)
            for (int d = 0; d < rank; d++) p->reduced[d] = true;
        return KILN_OK;
    }
    for (int64_t k = 0; k < n_axes; k++) {
        int64_t a = has_axes_input ? kiln_tensor_i64(axes_value, k) : attr_axes[k];
        if (a < -rank || a >= rank)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "axes[%lld] = %lld is out of range for an input of rank %d",
                                   (long long)k, (long long)a, rank);
        p->reduced[a < 0 ? a + rank : a] = true;
    }
    return KILN_OK;
}

/* Output type of a Reduce node: reduced dims become 1 or go away. */
static kiln_status reduce_infer(struct kiln_infer_ctx *ctx)
{
    struct kiln_type *out = ctx->out[0];
    const struct kiln_type *x = ctx->in[0];
    if (!out) return KILN_OK;
    struct kiln_type t;
    kiln_type_unknown(&t);
    t.dtype = x ? x->dtype : KILN_DTYPE_UNDEFINED;
    if (!x || x->rank < 0) {
        *out = t;
        return KILN_OK;
    }
    bool has_axes = ctx->n_in > 1 && ctx->in[1];
    struct reduce_plan p;
    bool known;
    kiln_status st =
        reduce_plan_make(ctx->node, has_axes, infer_value(ctx, 1), x->rank, &p, &known);
    if (st != KILN_OK) return st;

    if (!known) {
        /* with keepdims the rank stays; each dim is itself or 1 */
        if (p.keepdims) {
            t.rank = x->rank;
            for (int d = 0; d < x->rank; d++) t.dims[d] = x->dims[d] == 1 ? 1 : -1;
        }
        *out = t;
        return KILN_OK;
    }
    int r = 0;
    for (int d = 0; d < x->rank; d++) {
        if (p.reduced[d]) {
            if (!p.keepdims) continue;
            t.dims[r] = 1;
            t.sym[r] = NULL;
        } else {
            t.dims[r] = x->dims[d];
            t.sym[r] = x->sym[d];
        }
        r++;
    }
    t.rank = r;
    *out = t;
    return KILN_OK;
}

/* Reduce one group of float values (n of them, visited by w from base). */
static double reduce_group_f64(enum reduce_kind kind, kiln_dtype dt, const void *data,
                               struct sub_walk *w, int64_t base, int64_t n)
{
    double acc;
    switch (kind) {
    case RED_PROD: acc = 1.0; break;
    case RED_MAX: acc = -INFINITY; break;
    case RED_MIN: acc = INFINITY; break;
    default: acc = 0.0; break;
    }
    double shift = 0.0;
    if (kind == RED_LOG_SUM_EXP) {
        double mx = -INFINITY;
        sub_walk_start(w, base);
        for (int64_t k = 0; k < n; k++, sub_walk_next(w)) {
            double v = kiln_get_f64(dt, data, w->off);
            if (v > mx || isnan(v)) mx = v;
        }
        shift = isfinite(mx) ? mx : 0.0;
    }
    sub_walk_start(w, base);
    for (int64_t k = 0; k < n; k++, sub_walk_next(w)) {
        double v = kiln_get_f64(dt, data, w->off);
        switch (kind) {
        case RED_SUM:
        case RED_MEAN:
        case RED_LOG_SUM: acc += v; break;
        case RED_PROD: acc *= v; break;
        case RED_MAX:
            if (v > acc || isnan(v)) acc = v;
            break;
        case RED_MIN:
            if (v < acc || isnan(v)) acc = v;
            break;
        case RED_L1: acc += fabs(v); break;
        case RED_L2:
        case RED_SUM_SQUARE: acc += v * v; break;
        case RED_LOG_SUM_EXP: acc += exp(v - shift); break;
        }
    }
    switch (kind) {
    case RED_MEAN: return acc / (double)n; /* NaN for an empty set */
    case RED_L2: return sqrt(acc);
    case RED_LOG_SUM: return log(acc);
    case RED_LOG_SUM_EXP: return log(acc) + shift;
    default: return acc;
    }
}

/* Reduce one group of integer values; sums and products wrap like the
 * dtype's own arithmetic, the result is written to y[yi]. */
static void reduce_group_int(enum reduce_kind kind, kiln_dtype dt, const void *data,
                             struct sub_walk *w, int64_t base, int64_t n, void *y, int64_t yi)
{
    if (kind == RED_L2 || kind == RED_LOG_SUM || kind == RED_LOG_SUM_EXP) {
        /* defined through floats: compute in double, truncate on store */
        double acc = 0.0, shift = 0.0;
        if (kind == RED_LOG_SUM_EXP) {
            double mx = -INFINITY;
            sub_walk_start(w, base);
            for (int64_t k = 0; k < n; k++, sub_walk_next(w)) {
                int64_t v = kiln_get_i64(dt, data, w->off);
                double dv = dt == KILN_DTYPE_U64 ? (double)(uint64_t)v : (double)v;
                if (dv > mx) mx = dv;
            }
            shift = isfinite(mx) ? mx : 0.0;
        }
        sub_walk_start(w, base);
        for (int64_t k = 0; k < n; k++, sub_walk_next(w)) {
            int64_t v = kiln_get_i64(dt, data, w->off);
            double dv = dt == KILN_DTYPE_U64 ? (double)(uint64_t)v : (double)v;
            if (kind == RED_L2) acc += dv * dv;
            else if (kind == RED_LOG_SUM) acc += dv;
            else acc += exp(dv - shift);
        }
        double r = kind == RED_L2 ? sqrt(acc) : kind == RED_LOG_SUM ? log(acc) : log(acc) + shift;
        kiln_set_f64(dt, y, yi, r);
        return;
    }
    uint64_t acc;
    switch (kind) {
    case RED_PROD: acc = 1; break;
    case RED_MAX: acc = (uint64_t)int_lowest(dt); break;
    case RED_MIN: acc = (uint64_t)int_highest(dt); break;
    default: acc = 0; break;
    }
    sub_walk_start(w, base);
    for (int64_t k = 0; k < n; k++, sub_walk_next(w)) {
        int64_t v = kiln_get_i64(dt, data, w->off);
        switch (kind) {
        case RED_SUM:
        case RED_MEAN: acc += (uint64_t)v; break;
        case RED_PROD: acc *= (uint64_t)v; break;
        case RED_MAX:
            if (int_less(dt, (int64_t)acc, v)) acc = (uint64_t)v;
            break;
        case RED_MIN:
            if (int_less(dt, v, (int64_t)acc)) acc = (uint64_t)v;
            break;
        case RED_L1:
            acc += v < 0 && dt != KILN_DTYPE_U64 ? -(uint64_t)v : (uint64_t)v;
            break;
        case RED_SUM_SQUARE: acc += (uint64_t)v * (uint64_t)v; break;
        default: break;
        }
    }
    if (kind == RED_MEAN) {
        if (n == 0) acc = 0;
        else if (dt == KILN_DTYPE_U64) acc = acc / (uint64_t)n;
        else acc = (uint64_t)((int64_t)acc / n);
    }
    kiln_set_i64(dt, y, yi, (int64_t)acc);
}

/* Float32 reduction of contiguous rows: y[o] = reduce(x[o*n .. o*n+n)). */
static void reduce_rows_f32(enum reduce_kind kind, const float *x, float *y, int64_t rows,
                            int64_t n)
{
    for (int64_t o = 0; o < rows; o++) {
        const float *row = x + o * n;
        double acc;
        switch (kind) {
        case RED_MAX:
            acc = -INFINITY;
            for (int64_t k = 0; k < n; k++)
                if (row[k] > acc || isnan(row[k])) acc = row[k];
            break;
        case RED_MIN:
            acc = INFINITY;
            for (int64_t k = 0; k < n; k++)
                if (row[k] < acc || isnan(row[k])) acc = row[k];
            break;
        case RED_SUM_SQUARE:
            acc = 0.0;
            for (int64_t k = 0; k < n; k++) acc += (double)row[k] * row[k];
            break;
        default: /* RED_SUM, RED_MEAN */
            acc = 0.0;
            for (int64_t k = 0; k < n; k++) acc += row[k];
            if (kind == RED_MEAN) acc /= (double)n;
            break;
        }
        y[o] = (float)acc;
    }
}

/* Run a Reduce node: one group of reduced elements per output element. */
static kiln_status reduce_run(struct kiln_run_ctx *ctx, enum reduce_kind kind)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    const struct kiln_node *node = ctx->node;
    kiln_dtype dt = x->dtype;
    if (!kiln_dtype_is_numeric(dt) ||
        (dt == KILN_DTYPE_BOOL && kind != RED_MAX && kind != RED_MIN))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "input dtype %s is not supported",
                               kiln_dtype_name(dt));
    bool has_axes = ctx->n_in > 1 && ctx->in[1];
    struct reduce_plan p;
    bool known;
    kiln_status st = reduce_plan_make(node, has_axes, has_axes ? ctx->in[1] : NULL, x->rank,
                                      &p, &known);
    if (st != KILN_OK) return st;

    /* split the input dims into kept (output order) and reduced */
    int64_t strides[KILN_MAX_RANK];
    kiln_shape_strides(x->rank, x->dims, strides);
    struct sub_walk kept = {0}, red = {0};
    int last_kept = -1;
    for (int d = 0; d < x->rank; d++) {
        struct sub_walk *w = p.reduced[d] ? &red : &kept;
        w->dims[w->n] = x->dims[d];
        w->strides[w->n] = strides[d];
        w->n++;
        if (!p.reduced[d]) last_kept = d;
    }
    int64_t n_out = dims_product(kept.dims, 0, kept.n);
    int64_t n_red = dims_product(red.dims, 0, red.n);
    if (n_out != kiln_shape_count(y->rank, y->dims))
        return kiln_node_error(node, KILN_ERR_INTERNAL, "output has %lld elements, expected %lld",
                               (long long)kiln_shape_count(y->rank, y->dims), (long long)n_out);

    /* float32 over trailing axes: contiguous rows */
    bool trailing = true;
    for (int d = 0; d <= last_kept; d++)
        if (p.reduced[d] && x->dims[d] != 1) trailing = false;
    if (dt == KILN_DTYPE_F32 && trailing && n_red > 0 &&
        (kind == RED_SUM || kind == RED_MEAN || kind == RED_MAX || kind == RED_MIN ||
         kind == RED_SUM_SQUARE)) {
        reduce_rows_f32(kind, x->data, y->data, n_out, n_red);
        return KILN_OK;
    }

    bool is_float = kiln_dtype_is_float(dt);
    sub_walk_start(&kept, 0);
    for (int64_t o = 0; o < n_out; o++, sub_walk_next(&kept)) {
        if (is_float)
            kiln_set_f64(dt, y->data, o,
                         reduce_group_f64(kind, dt, x->data, &red, kept.off, n_red));
        else
            reduce_group_int(kind, dt, x->data, &red, kept.off, n_red, y->data, o);
    }
    return KILN_OK;
}

static kiln_status reduce_sum_run(struct kiln_run_ctx *ctx) { return reduce_run(ctx, RED_SUM); }
static kiln_status reduce_mean_run(struct kiln_run_ctx *ctx) { return reduce_run(ctx, RED_MEAN); }
static kiln_status reduce_max_run(struct kiln_run_ctx *ctx) { return reduce_run(ctx, RED_MAX); }
static kiln_status reduce_min_run(struct kiln_run_ctx *ctx) { return reduce_run(ctx, RED_MIN); }
static kiln_status reduce_prod_run(struct kiln_run_ctx *ctx) { return reduce_run(ctx, RED_PROD); }
static kiln_status reduce_l1_run(struct kiln_run_ctx *ctx) { return reduce_run(ctx, RED_L1); }
static kiln_status reduce_l2_run(struct kiln_run_ctx *ctx) { return reduce_run(ctx, RED_L2); }
static kiln_status reduce_log_sum_run(struct kiln_run_ctx *ctx)
{
    return reduce_run(ctx, RED_LOG_SUM);
}
static kiln_status reduce_log_sum_exp_run(struct kiln_run_ctx *ctx)
{
    return reduce_run(ctx, RED_LOG_SUM_EXP);
}
static kiln_status reduce_sum_square_run(struct kiln_run_ctx *ctx)
{
    return reduce_run(ctx, RED_SUM_SQUARE);
}

KILN_REF_OP(ReduceSum, reduce_infer, reduce_sum_run);
KILN_REF_OP(ReduceMean, reduce_infer, reduce_mean_run);
KILN_REF_OP(ReduceMax, reduce_infer, reduce_max_run);
KILN_REF_OP(ReduceMin, reduce_infer, reduce_min_run);
KILN_REF_OP(ReduceProd, reduce_infer, reduce_prod_run);
KILN_REF_OP(ReduceL1, reduce_infer, reduce_l1_run);
KILN_REF_OP(ReduceL2, reduce_infer, reduce_l2_run);
KILN_REF_OP(ReduceLogSum, reduce_infer, reduce_log_sum_run);
KILN_REF_OP(ReduceLogSumExp, reduce_infer, reduce_log_sum_exp_run);
KILN_REF_OP(ReduceSumSquare, reduce_infer, reduce_sum_square_run);

/* ---- ArgMax, ArgMin ---- */

/* Output of ArgMax / ArgMin: int64, the axis kept as 1 or dropped. */
static kiln_status arg_infer(struct kiln_infer_ctx *ctx)
{
    struct kiln_type *out = ctx->out[0];
    const struct kiln_type *x = ctx->in[0];
    if (!out) return KILN_OK;
    struct kiln_type t;
    kiln_type_unknown(&t);
    t.dtype = KILN_DTYPE_I64;
    if (!x || x->rank < 0) {
        *out = t;
        return KILN_OK;
    }
    int axis;
    kiln_status st = kiln_norm_axis(ctx->node, kiln_attr_int(ctx->node, "axis", 0), x->rank, &axis);
    if (st != KILN_OK) return st;
    bool keepdims = kiln_attr_int(ctx->node, "keepdims", 1) != 0;
    int r = 0;
    for (int d = 0; d < x->rank; d++) {
        if (d == axis) {
            if (!keepdims) continue;
            t.dims[r] = 1;
            t.sym[r] = NULL;
        } else {
            t.dims[r] = x->dims[d];
            t.sym[r] = x->sym[d];
        }
        r++;
    }
    t.rank = r;
    *out = t;
    return KILN_OK;
}

/* Index of the max (or min) along the axis for every (outer, inner) line. */
static kiln_status arg_run(struct kiln_run_ctx *ctx, bool want_max)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    kiln_dtype dt = x->dtype;
    if (!kiln_dtype_is_numeric(dt))
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "input dtype %s is not supported",
                               kiln_dtype_name(dt));
    int axis;
    kiln_status st =
        kiln_norm_axis(ctx->node, kiln_attr_int(ctx->node, "axis", 0), x->rank, &axis);
    if (st != KILN_OK) return st;
    bool last = kiln_attr_int(ctx->node, "select_last_index", 0) != 0;
    int64_t outer = dims_product(x->dims, 0, axis);
    int64_t n = x->rank > 0 ? x->dims[axis] : 1;
    int64_t inner = dims_product(x->dims, axis + 1, x->rank);
    if (n == 0 && outer * inner > 0)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "cannot take the index over axis %d of size 0", axis);
    int64_t *out = y->data;
    bool is_float = kiln_dtype_is_float(dt);
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * n * inner + i;
            int64_t best = 0;
            if (is_float) {
                double bv = kiln_get_f64(dt, x->data, base);
                for (int64_t k = 1; k < n; k++) {
                    double v = kiln_get_f64(dt, x->data, base + k * inner);
                    bool better = want_max ? v > bv : v < bv;
                    if (better || (last && v == bv)) {
                        bv = v;
                        best = k;
                    }
                }
            } else {
                int64_t bv = kiln_get_i64(dt, x->data, base);
                for (int64_t k = 1; k < n; k++) {
                    int64_t v = kiln_get_i64(dt, x->data, base + k * inner);
                    bool better = want_max ? int_less(dt, bv, v) : int_less(dt, v, bv);
                    if (better || (last && v == bv)) {
                        bv = v;
                        best = k;
                    }
                }
            }
            out[o * inner + i] = best;
        }
    }
    return KILN_OK;
}

static kiln_status argmax_run(struct kiln_run_ctx *ctx) { return arg_run(ctx, true); }
static kiln_status argmin_run(struct kiln_run_ctx *ctx) { return arg_run(ctx, false); }

KILN_REF_OP(ArgMax, arg_infer, argmax_run);
KILN_REF_OP(ArgMin, arg_infer, argmin_run);

/* ---- TopK ---- */

/* k of a TopK node: the "k" attribute before opset 10, else input 1 (a
 * one-element int64 tensor; NULL value = not known yet, *known false). */
static kiln_status topk_k(const struct kiln_node *node, bool has_k_input, const kiln_tensor *kv,
                          int64_t *k, bool *known)
{
    *known = true;
    if (!has_k_input) {
        if (!kiln_node_attr(node, "k"))
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "has neither input K nor "
                                                                 "attribute k");
        *k = kiln_attr_int(node, "k", 0);
    } else {
        if (!kv) {
            *known = false;
            return KILN_OK;
        }
        if (!kiln_dtype_is_int(kv->dtype) || kiln_shape_count(kv->rank, kv->dims) != 1)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "K must be a one-element integer tensor, got %s of rank %d",
                                   kiln_dtype_name(kv->dtype), kv->rank);
        *k = kiln_tensor_i64(kv, 0);
    }
    if (*k < 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "k = %lld is negative",
                               (long long)*k);
    return KILN_OK;
}

/* Outputs of TopK: values and int64 indices, axis resized to k. */
static kiln_status topk_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    struct kiln_type t;
    kiln_type_unknown(&t);
    t.dtype = x ? x->dtype : KILN_DTYPE_UNDEFINED;
    if (x && x->rank >= 0) {
        if (x->rank == 0)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "input must have rank >= 1");
        int axis;
        kiln_status st =
            kiln_norm_axis(ctx->node, kiln_attr_int(ctx->node, "axis", -1), x->rank, &axis);
        if (st != KILN_OK) return st;
        bool has_k = ctx->n_in > 1 && ctx->in[1];
        int64_t k = -1;
        bool known;
        st = topk_k(ctx->node, has_k, infer_value(ctx, 1), &k, &known);
        if (st != KILN_OK) return st;
        if (known && x->dims[axis] >= 0 && k > x->dims[axis])
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "k = %lld is larger than axis %d of size %lld", (long long)k,
                                   axis, (long long)x->dims[axis]);
        t = *x;
        t.dims[axis] = known ? k : -1;
        t.sym[axis] = NULL;
    }
    if (ctx->out[0]) *ctx->out[0] = t;
    if (ctx->n_out > 1 && ctx->out[1]) {
        t.dtype = KILN_DTYPE_I64;
        *ctx->out[1] = t;
    }
    return KILN_OK;
}

/* A sort key: one element read in a type that orders it exactly. */
union sort_key {
    double f;
    int64_t i;
    uint64_t u;
};

enum key_kind { KEY_FLOAT, KEY_INT, KEY_UINT };

/* Three-way compare of two keys; NaN is greater than every number. */
static int key_cmp(enum key_kind kind, union sort_key a, union sort_key b)
{
    switch (kind) {
    case KEY_FLOAT:
        if (isnan(a.f) || isnan(b.f)) return isnan(a.f) - isnan(b.f);
        return (a.f > b.f) - (a.f < b.f);
    case KEY_INT: return (a.i > b.i) - (a.i < b.i);
    default: return (a.u > b.u) - (a.u < b.u);
    }
}

/* Stable merge sort of idx[0..n) by keys[idx] (descending if largest);
 * tmp has room for n entries. Stability keeps equal keys in index order. */
static void merge_sort_idx(int64_t *idx, int64_t *tmp, int64_t n, const union sort_key *keys,
                           enum key_kind kind, bool largest)
{
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n;
            int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            int64_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi) {
                int c = key_cmp(kind, keys[idx[b]], keys[idx[a]]);
                bool take_b = largest ? c > 0 : c < 0;
                tmp[o++] = take_b ? idx[b++] : idx[a++];
            }
            while (a < mid) tmp[o++] = idx[a++];
            while (b < hi) tmp[o++] = idx[b++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof *idx);
    }
}

/* The k largest (or smallest) elements of every line along axis, sorted,
 * ties broken by the lower index. */
static kiln_status topk_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *vals = ctx->out[0];
    kiln_tensor *inds = ctx->n_out > 1 ? ctx->out[1] : NULL;
    kiln_dtype dt = x->dtype;
    if (!kiln_dtype_is_numeric(dt) || dt == KILN_DTYPE_BOOL)
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "input dtype %s is not supported",
                               kiln_dtype_name(dt));
    if (x->rank == 0)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT, "input must have rank >= 1");
    int axis;
    kiln_status st =
        kiln_norm_axis(ctx->node, kiln_attr_int(ctx->node, "axis", -1), x->rank, &axis);
    if (st != KILN_OK) return st;
    bool has_k = ctx->n_in > 1 && ctx->in[1];
    int64_t k;
    bool known;
    st = topk_k(ctx->node, has_k, has_k ? ctx->in[1] : NULL, &k, &known);
    if (st != KILN_OK) return st;
    int64_t n = x->dims[axis];
    if (k > n)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "k = %lld is larger than axis %d of size %lld", (long long)k, axis,
                               (long long)n);
    bool largest = kiln_attr_int(ctx->node, "largest", 1) != 0;
    int64_t outer = dims_product(x->dims, 0, axis);
    int64_t inner = dims_product(x->dims, axis + 1, x->rank);
    if (k == 0 || outer * inner == 0) return KILN_OK;

    enum key_kind kind = kiln_dtype_is_float(dt)  ? KEY_FLOAT
                         : dt == KILN_DTYPE_U64 ? KEY_UINT
                                                  : KEY_INT;
    size_t nb = (size_t)n;
    union sort_key *keys = malloc(nb * sizeof *keys);
    int64_t *idx = malloc(nb * sizeof *idx);
    int64_t *tmp = malloc(nb * sizeof *tmp);
    if (!keys || !idx || !tmp) {
        st = kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY,
                             "out of memory sorting %lld elements", (long long)n);
        goto out_free;
    }
    size_t esz = kiln_dtype_size(dt);
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * n * inner + i;
            for (int64_t j = 0; j < n; j++) {
                int64_t off = base + j * inner;
                if (kind == KEY_FLOAT) keys[j].f = kiln_get_f64(dt, x->data, off);
                else keys[j].i = kiln_get_i64(dt, x->data, off);
                idx[j] = j;
            }
            merge_sort_idx(idx, tmp, n, keys, kind, largest);
            int64_t obase = o * k * inner + i;
            for (int64_t j = 0; j < k; j++) {
                int64_t oo = obase + j * inner;
                memcpy((char *)vals->data + (size_t)oo * esz,
                       (const char *)x->data + (size_t)(base + idx[j] * inner) * esz, esz);
                if (inds) ((int64_t *)inds->data)[oo] = idx[j];
            }
        }
    }
out_free:
    free(keys);
    free(idx);
    free(tmp);
    return st;
}

KILN_REF_OP(TopK, topk_infer, topk_run);

/* ---- CumSum, CumProd ---- */

/* The axis of a scan: input 1, a scalar (or one-element) integer tensor. */
static kiln_status scan_axis(const struct kiln_node *node, const kiln_tensor *a, int rank,
                             int *axis)
{
    if (!kiln_dtype_is_int(a->dtype) || kiln_shape_count(a->rank, a->dims) != 1)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "axis must be a one-element integer tensor, got %s of rank %d",
                               kiln_dtype_name(a->dtype), a->rank);
    int64_t v = kiln_tensor_i64(a, 0);
    if (v < -rank || v >= rank)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "axis %lld is out of range for rank %d", (long long)v, rank);
    *axis = (int)(v < 0 ? v + rank : v);
    return KILN_OK;
}

/* CumSum / CumProd keep the input type; a known axis is checked early. */
static kiln_status scan_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    const kiln_tensor *a = infer_value(ctx, 1);
    if (x && x->rank >= 0 && a) {
        int axis;
        kiln_status st = scan_axis(ctx->node, a, x->rank, &axis);
        if (st != KILN_OK) return st;
    }
    return kiln_infer_same(ctx);
}

/* Running sum or product along the axis, optionally exclusive / reversed. */
static kiln_status scan_run(struct kiln_run_ctx *ctx, bool product)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    kiln_dtype dt = x->dtype;
    if (!kiln_dtype_is_numeric(dt) || dt == KILN_DTYPE_BOOL)
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "input dtype %s is not supported",
                               kiln_dtype_name(dt));
    if (x->rank == 0)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT, "input must have rank >= 1");
    int axis;
    kiln_status st = scan_axis(ctx->node, ctx->in[1], x->rank, &axis);
    if (st != KILN_OK) return st;
    bool exclusive = kiln_attr_int(ctx->node, "exclusive", 0) != 0;
    bool reverse = kiln_attr_int(ctx->node, "reverse", 0) != 0;
    int64_t outer = dims_product(x->dims, 0, axis);
    int64_t n = x->dims[axis];
    int64_t inner = dims_product(x->dims, axis + 1, x->rank);
    bool is_float = kiln_dtype_is_float(dt);
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * n * inner + i;
            double facc = product ? 1.0 : 0.0;
            uint64_t iacc = product ? 1 : 0;
            for (int64_t j = 0; j < n; j++) {
                int64_t off = base + (reverse ? n - 1 - j : j) * inner;
                if (is_float) {
                    double v = kiln_get_f64(dt, x->data, off);
                    if (!exclusive) facc = product ? facc * v : facc + v;
                    kiln_set_f64(dt, y->data, off, facc);
                    if (exclusive) facc = product ? facc * v : facc + v;
                } else {
                    uint64_t v = (uint64_t)kiln_get_i64(dt, x->data, off);
                    if (!exclusive) iacc = product ? iacc * v : iacc + v;
                    kiln_set_i64(dt, y->data, off, (int64_t)iacc);
                    if (exclusive) iacc = product ? iacc * v : iacc + v;
                }
            }
        }
    }
    return KILN_OK;
}

static kiln_status cumsum_run(struct kiln_run_ctx *ctx) { return scan_run(ctx, false); }
static kiln_status cumprod_run(struct kiln_run_ctx *ctx) { return scan_run(ctx, true); }

KILN_REF_OP(CumSum, scan_infer, cumsum_run);
KILN_REF_OP(CumProd, scan_infer, cumprod_run);
