/*
 * gather_scatter.c - reference kernels for ops that move elements by index
 * or by data: Gather, GatherElements, GatherND, ScatterND, ScatterElements
 * (and Scatter, its deprecated name), OneHot, ReverseSequence, and the
 * data-dependent ops whose output shape is only known after running them:
 * NonZero, Compress and Unique (DYNOUT: they create their outputs).
 *
 * Every index read from a tensor is checked against the dim it indexes
 * (negative values count from the end) and an out-of-range index is an
 * INVALID_ARGUMENT error naming the value, never a wild read or write.
 * Pure data movement works for every dtype, strings included; the Scatter
 * reductions (add, mul, max, min) for numeric dtypes.
 */
#include <stdlib.h>

#include "kernels/kernel.h"

/* ---- Small helpers (as in shape_ops.c) ---- */

/* The known value of input k, or NULL if absent or not known yet. */
static const kiln_tensor *in_value(const struct kiln_infer_ctx *ctx, int k)
{
    if (k >= ctx->n_in || !ctx->in[k] || !ctx->in_value) return NULL;
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

/* Copy the whole of in into out (same dtype and element count). */
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

/* Product of dims[from..to). */
static int64_t dims_product(const int64_t *dims, int from, int to)
{
    int64_t p = 1;
    for (int i = from; i < to; i++) p *= dims[i];
    return p;
}

/* Check that an indices input has an integer dtype. */
static kiln_status check_index_dtype(const struct kiln_node *node, kiln_dtype dt, const char *what)
{
    if (dt != KILN_DTYPE_UNDEFINED && !kiln_dtype_is_int(dt))
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s must be int32 or int64, got %s",
                               what, kiln_dtype_name(dt));
    return KILN_OK;
}

/* Element i of an indices tensor, made non-negative against a dim of size n; checked. */
static kiln_status index_at(const struct kiln_node *node, const kiln_tensor *indices, int64_t i,
                            int64_t n, int64_t *out)
{
    int64_t v = kiln_tensor_i64(indices, i);
    int64_t w = v < 0 ? v + n : v;
    if (w < 0 || w >= n)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "index %lld is out of range for a dim of size %lld", (long long)v,
                               (long long)n);
    *out = w;
    return KILN_OK;
}

/* The DYNOUT outputs a node wants: output i is wanted unless the model left it out. */
static bool out_wanted(const struct kiln_run_ctx *ctx, int i)
{
    return i < ctx->n_out && ctx->node->out[i] >= 0;
}

/* ---- Gather, GatherElements, GatherND ---- */

/* Gather: data dims before axis, then the indices dims, then data dims after axis. */
static kiln_status gather_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *data = ctx->in[0], *ind = ctx->in[1];
    if (!data || !ind) return KILN_OK;
    kiln_status st = check_index_dtype(ctx->node, ind->dtype, "indices");
    if (st != KILN_OK) return st;
    struct kiln_type t;
    if (data->rank < 0 || ind->rank < 0) {
        type_unknown_dims(&t, data->dtype, -1);
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    if (data->rank == 0)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT, "data must have rank >= 1");
    int axis;
    st = kiln_norm_axis(ctx->node, kiln_attr_int(ctx->node, "axis", 0), data->rank, &axis);
    if (st != KILN_OK) return st;
    int r = data->rank + ind->rank - 1;
    if (r > KILN_MAX_RANK)
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED,
                               "output rank %d exceeds Kiln's maximum of %d", r, KILN_MAX_RANK);
    kiln_type_unknown(&t);
    t.dtype = data->dtype;
    t.rank = r;
    int j = 0;
    for (int i = 0; i < axis; i++, j++) {
        t.dims[j] = data->dims[i];
        t.sym[j] = data->sym[i];
    }
    for (int i = 0; i < ind->rank; i++, j++) {
        t.dims[j] = ind->dims[i];
        t.sym[j] = ind->sym[i];
    }
    for (int i = axis + 1; i < data->rank; i++, j++) {
        t.dims[j] = data->dims[i];
        t.sym[j] = data->sym[i];
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/* For every outer index and every index value, copy the inner block it selects. */
static kiln_status gather_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *data = ctx->in[0], *ind = ctx->in[1];
    kiln_tensor *out = ctx->out[0];
    int axis;
    kiln_status st =
        kiln_norm_axis(ctx->node, kiln_attr_int(ctx->node, "axis", 0), data->rank, &axis);
    if (st != KILN_OK) return st;
    int64_t outer = dims_product(data->dims, 0, axis), n = data->dims[axis];
    int64_t inner = dims_product(data->dims, axis + 1, data->rank);
    int64_t nidx = kiln_tensor_count(ind);
    if (kiln_tensor_count(out) != outer * nidx * inner)
        return kiln_node_error(ctx->node, KILN_ERR_INTERNAL, "output size does not match");
    for (int64_t k = 0; k < nidx; k++) {
        int64_t i = 0;
        st = index_at(ctx->node, ind, k, n, &i);
        if (st != KILN_OK) return st;
        for (int64_t o = 0; o < outer; o++) {
            st = kiln_tensor_copy_elems(out, (o * nidx + k) * inner, data, (o * n + i) * inner, inner);
            if (st != KILN_OK) return st;
        }
    }
    return KILN_OK;
}

KILN_REF_OP(Gather, gather_infer, gather_run);

/* GatherElements and ScatterElements: check ranks and the axis; indices of the data's rank. */
static kiln_status elements_check(const struct kiln_node *node, const struct kiln_type *data,
                                  const struct kiln_type *ind)
{
    kiln_status st = check_index_dtype(node, ind->dtype, "indices");
    if (st != KILN_OK) return st;
    if (data->rank < 0 || ind->rank < 0) return KILN_OK;
    if (data->rank != ind->rank || data->rank == 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "data has rank %d and indices rank %d; they must match and be >= 1",
                               data->rank, ind->rank);
    int axis;
    return kiln_norm_axis(node, kiln_attr_int(node, "axis", 0), data->rank, &axis);
}

static kiln_status gather_elements_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *data = ctx->in[0], *ind = ctx->in[1];
    if (!data || !ind) return KILN_OK;
    kiln_status st = elements_check(ctx->node, data, ind);
    if (st != KILN_OK) return st;
    struct kiln_type t = *ind;
    t.dtype = data->dtype;
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/*
 * Walk the indices tensor in order and give, for each element e, the flat
 * offset in data of the element it names (its own coordinates, with the
 * axis coordinate replaced by the index value). Used by GatherElements and
 * ScatterElements; visit(e, offset) does the work.
 */
struct elements_walk {
    const struct kiln_node *node;
    const kiln_tensor *data, *ind;
    int axis;
};

typedef kiln_status (*elements_visit_fn)(void *arg, int64_t e, int64_t off);

static kiln_status elements_walk(const struct elements_walk *w, elements_visit_fn visit, void *arg)
{
    const kiln_tensor *data = w->data, *ind = w->ind;
    int r = data->rank;
    for (int d = 0; d < r; d++)
        if (d != w->axis && ind->dims[d] > data->dims[d])
            return kiln_node_error(w->node, KILN_ERR_INVALID_ARGUMENT,
                                   "indices dim %d is %lld but data's is %lld", d,
                                   (long long)ind->dims[d], (long long)data->dims[d]);
    int64_t strides[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    kiln_shape_strides(r, data->dims, strides);
    int64_t n = kiln_tensor_count(ind), base = 0; /* base: offset of idx without the axis */
    for (int64_t e = 0; e < n; e++) {
        int64_t i = 0;
        kiln_status st = index_at(w->node, ind, e, data->dims[w->axis], &i);
        if (st != KILN_OK) return st;
        st = visit(arg, e, base + i * strides[w->axis]);
        if (st != KILN_OK) return st;
        for (int d = r - 1; d >= 0; d--) {
            idx[d]++;
            if (d != w->axis) base += strides[d];
            if (idx[d] < ind->dims[d]) break;
            if (d != w->axis) base -= strides[d] * ind->dims[d];
            idx[d] = 0;
        }
    }
    return KILN_OK;
}

struct gather_elements_arg {
    kiln_tensor *out;
    const kiln_tensor *data;
};

static kiln_status gather_elements_visit(void *arg, int64_t e, int64_t off)
{
    struct gather_elements_arg *a = arg;
    return kiln_tensor_copy_elems(a->out, e, a->data, off, 1);
}

static kiln_status gather_elements_run(struct kiln_run_ctx *ctx)
{
    struct elements_walk w = {ctx->node, ctx->in[0], ctx->in[1], 0};
    kiln_status st = kiln_norm_axis(ctx->node, kiln_attr_int(ctx->node, "axis", 0),
                                    w.data->rank, &w.axis);
    if (st != KILN_OK) return st;
    if (w.ind->rank != w.data->rank)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "data has rank %d and indices rank %d", w.data->rank,
                               w.ind->rank);
    struct gather_elements_arg a = {ctx->out[0], w.data};
    return elements_walk(&w, gather_elements_visit, &a);
}

KILN_REF_OP(GatherElements, gather_elements_infer, gather_elements_run);

/* GatherND: indices dims but the last, then the data dims past batch_dims + k. */
static kiln_status gather_nd_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const struct kiln_type *data = ctx->in[0], *ind = ctx->in[1];
    if (!data || !ind) return KILN_OK;
    kiln_status st = check_index_dtype(node, ind->dtype, "indices");
    if (st != KILN_OK) return st;
    int64_t b = kiln_attr_int(node, "batch_dims", 0);
    struct kiln_type t;
    if (data->rank < 0 || ind->rank < 0 || ind->rank == 0 || ind->dims[ind->rank - 1] < 0) {
        type_unknown_dims(&t, data->dtype, -1);
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    int64_t k = ind->dims[ind->rank - 1];
    if (b < 0 || b >= ind->rank || b >= data->rank || k < 1 || b + k > data->rank)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "batch_dims %lld and index length %lld do not fit data of rank %d "
                               "and indices of rank %d",
                               (long long)b, (long long)k, data->rank, ind->rank);
    kiln_type_unknown(&t);
    t.dtype = data->dtype;
    t.rank = ind->rank - 1 + data->rank - (int)(b + k);
    int j = 0;
    for (int i = 0; i < ind->rank - 1; i++, j++) {
        t.dims[j] = ind->dims[i];
        t.sym[j] = ind->sym[i];
        if (i < b && t.dims[j] < 0) t.dims[j] = data->dims[i];
    }
    for (int i = (int)(b + k); i < data->rank; i++, j++) {
        t.dims[j] = data->dims[i];
        t.sym[j] = data->sym[i];
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/*
 * Flat offset in data (of rank r, strides) named by the k-tuple at
 * indices[at..at+k) over dims first..first+k.
 */
static kiln_status nd_offset(const struct kiln_node *node, const kiln_tensor *data,
                             const int64_t *strides, int first, const kiln_tensor *ind, int64_t at,
                             int64_t k, int64_t *off)
{
    int64_t o = 0;
    for (int64_t l = 0; l < k; l++) {
        int64_t i = 0;
        kiln_status st = index_at(node, ind, at + l, data->dims[first + l], &i);
        if (st != KILN_OK) return st;
        o += i * strides[first + l];
    }
    *off = o;
    return KILN_OK;
}

static kiln_status gather_nd_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *data = ctx->in[0], *ind = ctx->in[1];
    kiln_tensor *out = ctx->out[0];
    int b = (int)kiln_attr_int(node, "batch_dims", 0);
    int q = ind->rank;
    int64_t k = q > 0 ? ind->dims[q - 1] : 0;
    if (q < 1 || b < 0 || b >= q || k < 1 || b + k > data->rank)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "indices of rank %d do not fit data of rank %d", q, data->rank);
    for (int i = 0; i < b; i++)
        if (ind->dims[i] != data->dims[i])
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "batch dim %d is %lld in indices but %lld in data", i,
                                   (long long)ind->dims[i], (long long)data->dims[i]);
    int64_t strides[KILN_MAX_RANK];
    kiln_shape_strides(data->rank, data->dims, strides);
    int64_t batches = dims_product(data->dims, 0, b);
    int64_t per_batch = dims_product(ind->dims, b, q - 1);
    int64_t slice = dims_product(data->dims, b + (int)k, data->rank);
    int64_t batch_stride = dims_product(data->dims, b, data->rank);
    if (kiln_tensor_count(out) != batches * per_batch * slice)
        return kiln_node_error(node, KILN_ERR_INTERNAL, "output size does not match");
    for (int64_t bi = 0; bi < batches; bi++) {
        for (int64_t j = 0; j < per_batch; j++) {
            int64_t t = bi * per_batch + j, off;
            kiln_status st = nd_offset(node, data, strides, b, ind, t * k, k, &off);
            if (st != KILN_OK) return st;
            st = kiln_tensor_copy_elems(out, t * slice, data, bi * batch_stride + off, slice);
            if (st != KILN_OK) return st;
        }
    }
    return KILN_OK;
}

KILN_REF_OP(GatherND, gather_nd_infer, gather_nd_run);

/* ---- ScatterND, ScatterElements, Scatter ---- */

enum reduction { RED_NONE, RED_ADD, RED_MUL, RED_MAX, RED_MIN };

/* The reduction attribute, checked against the data dtype. */
static kiln_status reduction_get(const struct kiln_node *node, kiln_dtype dt, enum reduction *r)
{
    const char *s = kiln_attr_str(node, "reduction", "none");
    if (strcmp(s, "none") == 0) *r = RED_NONE;
    else if (strcmp(s, "add") == 0) *r = RED_ADD;
    else if (strcmp(s, "mul") == 0) *r = RED_MUL;
    else if (strcmp(s, "max") == 0) *r = RED_MAX;
    else if (strcmp(s, "min") == 0) *r = RED_MIN;
    else return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "reduction '%s' is not known", s);
    if (*r != RED_NONE && !kiln_dtype_is_numeric(dt))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "reduction '%s' on %s is not supported",
                               s, kiln_dtype_name(dt));
    return KILN_OK;
}

/* out[o..o+n) = reduce(out[o..], upd[u..]) elementwise, or a plain copy for no reduction. */
static kiln_status scatter_apply(kiln_tensor *out, int64_t o, const kiln_tensor *upd, int64_t u,
                                 int64_t n, enum reduction red)
{
    if (red == RED_NONE) return kiln_tensor_copy_elems(out, o, upd, u, n);
    kiln_dtype dt = out->dtype;
    for (int64_t k = 0; k < n; k++) {
        if (kiln_dtype_is_float(dt)) {
            double a = kiln_get_f64(dt, out->data, o + k), b = kiln_get_f64(dt, upd->data, u + k);
            double v = red == RED_ADD ? a + b
                       : red == RED_MUL ? a * b
                       : red == RED_MAX ? (b > a ? b : a)
                                        : (b < a ? b : a);
            kiln_set_f64(dt, out->data, o + k, v);
        } else if (dt == KILN_DTYPE_U64) {
            uint64_t a = ((uint64_t *)out->data)[o + k], b = ((const uint64_t *)upd->data)[u + k];
            ((uint64_t *)out->data)[o + k] = red == RED_ADD   ? a + b
                                             : red == RED_MUL ? a * b
                                             : red == RED_MAX ? (b > a ? b : a)
                                                              : (b < a ? b : a);
        } else {
            int64_t a = kiln_get_i64(dt, out->data, o + k), b = kiln_get_i64(dt, upd->data, u + k);
            int64_t v = red == RED_ADD   ? (int64_t)((uint64_t)a + (uint64_t)b)
                        : red == RED_MUL ? (int64_t)((uint64_t)a * (uint64_t)b)
                        : red == RED_MAX ? (b > a ? b : a)
                                         : (b < a ? b : a);
            kiln_set_i64(dt, out->data, o + k, v);
        }
    }
    return KILN_OK;
}

/* ScatterND, ScatterElements: the output is the data's type. */
static kiln_status scatter_nd_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->in[0]) return KILN_OK;
    if (ctx->in[1]) {
        kiln_status st = check_index_dtype(ctx->node, ctx->in[1]->dtype, "indices");
        if (st != KILN_OK) return st;
    }
    set_out(ctx, 0, ctx->in[0]);
    return KILN_OK;
}

/* Copy data, then apply each update slice at the offset its index tuple names. */
static kiln_status scatter_nd_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *data = ctx->in[0], *ind = ctx->in[1], *upd = ctx->in[2];
    kiln_tensor *out = ctx->out[0];
    enum reduction red;
    kiln_status st = reduction_get(node, data->dtype, &red);
    if (st != KILN_OK) return st;
    int q = ind->rank;
    int64_t k = q > 0 ? ind->dims[q - 1] : 0;
    if (q < 1 || k > data->rank)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "indices of rank %d do not fit data of rank %d", q, data->rank);
    if (upd->dtype != data->dtype)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "updates are %s but data is %s",
                               kiln_dtype_name(upd->dtype), kiln_dtype_name(data->dtype));
    int64_t m = dims_product(ind->dims, 0, q - 1);
    int64_t slice = dims_product(data->dims, (int)k, data->rank);
    bool shape_ok = upd->rank == q - 1 + data->rank - (int)k;
    for (int i = 0; shape_ok && i < upd->rank; i++)
        shape_ok = upd->dims[i] == (i < q - 1 ? ind->dims[i] : data->dims[k + i - (q - 1)]);
    if (!shape_ok)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "updates must have shape indices.shape[:-1] + data.shape[%lld:]",
                               (long long)k);
    st = copy_all(node, out, data);
    if (st != KILN_OK) return st;
    int64_t strides[KILN_MAX_RANK];
    kiln_shape_strides(data->rank, data->dims, strides);
    for (int64_t j = 0; j < m; j++) {
        int64_t off;
        st = nd_offset(node, data, strides, 0, ind, j * k, k, &off);
        if (st != KILN_OK) return st;
        st = scatter_apply(out, off, upd, j * slice, slice, red);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

KILN_REF_OP(ScatterND, scatter_nd_infer, scatter_nd_run);

static kiln_status scatter_elements_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *data = ctx->in[0], *ind = ctx->in[1];
    if (!data) return KILN_OK;
    if (ind) {
        kiln_status st = elements_check(ctx->node, data, ind);
        if (st != KILN_OK) return st;
    }
    set_out(ctx, 0, data);
    return KILN_OK;
}

struct scatter_elements_arg {
    kiln_tensor *out;
    const kiln_tensor *upd;
    enum reduction red;
};

static kiln_status scatter_elements_visit(void *arg, int64_t e, int64_t off)
{
    struct scatter_elements_arg *a = arg;
    return scatter_apply(a->out, off, a->upd, e, 1, a->red);
}

/* Copy data, then apply updates[e] at the element indices[e] names along axis. */
static kiln_status scatter_elements_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    struct elements_walk w = {node, ctx->in[0], ctx->in[1], 0};
    const kiln_tensor *upd = ctx->in[2];
    kiln_status st = kiln_norm_axis(node, kiln_attr_int(node, "axis", 0), w.data->rank, &w.axis);
    if (st != KILN_OK) return st;
    struct scatter_elements_arg a = {ctx->out[0], upd, RED_NONE};
    if (node->op != KILN_OP_Scatter) {
        st = reduction_get(node, w.data->dtype, &a.red);
        if (st != KILN_OK) return st;
    }
    bool shape_ok = w.ind->rank == w.data->rank && upd->rank == w.ind->rank &&
                    upd->dtype == w.data->dtype;
    for (int i = 0; shape_ok && i < upd->rank; i++) shape_ok = upd->dims[i] == w.ind->dims[i];
    if (!shape_ok)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "indices and updates must have the same shape and data's rank, "
                               "updates data's dtype");
    st = copy_all(node, a.out, w.data);
    if (st != KILN_OK) return st;
    return elements_walk(&w, scatter_elements_visit, &a);
}

KILN_REF_OP(ScatterElements, scatter_elements_infer, scatter_elements_run);
KILN_REF_OP(Scatter, scatter_elements_infer, scatter_elements_run);

/* ---- OneHot, ReverseSequence ---- */

/* OneHot's depth: a one-element numeric tensor, at least 1. */
static kiln_status onehot_depth(const struct kiln_node *node, const kiln_tensor *t, int64_t *depth)
{
    if (kiln_tensor_count(t) != 1 || !kiln_dtype_is_numeric(t->dtype))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "depth must be a numeric scalar, got %lld elements of %s",
                               (long long)kiln_tensor_count(t), kiln_dtype_name(t->dtype));
    *depth = kiln_tensor_i64(t, 0);
    if (*depth < 1 || *depth > KILN_TENSOR_MAX_BYTES)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "depth is %lld", (long long)*depth);
    return KILN_OK;
}

/* OneHot: the indices' shape with a dim of size depth inserted at axis; values' dtype. */
static kiln_status onehot_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const struct kiln_type *ind = ctx->in[0];
    if (!ind || !ctx->in[2]) return KILN_OK;
    struct kiln_type t;
    kiln_dtype dt = ctx->in[2]->dtype;
    if (ind->rank < 0) {
        type_unknown_dims(&t, dt, -1);
        set_out(ctx, 0, &t);
        return KILN_OK;
    }
    int r = ind->rank + 1;
    if (r > KILN_MAX_RANK)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                               "output rank %d exceeds Kiln's maximum of %d", r, KILN_MAX_RANK);
    int axis;
    kiln_status st = kiln_norm_axis(node, kiln_attr_int(node, "axis", -1), r, &axis);
    if (st != KILN_OK) return st;
    int64_t depth = -1;
    const kiln_tensor *dv = in_value(ctx, 1);
    if (dv) {
        st = onehot_depth(node, dv, &depth);
        if (st != KILN_OK) return st;
    }
    kiln_type_unknown(&t);
    t.dtype = dt;
    t.rank = r;
    for (int i = 0, j = 0; i < r; i++) {
        if (i == axis) {
            t.dims[i] = depth;
        } else {
            t.dims[i] = ind->dims[j];
            t.sym[i] = ind->sym[j];
            j++;
        }
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/* Fill with the off value, then put the on value where each valid index points. */
static kiln_status onehot_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *ind = ctx->in[0], *values = ctx->in[2];
    kiln_tensor *out = ctx->out[0];
    int64_t depth;
    kiln_status st = onehot_depth(node, ctx->in[1], &depth);
    if (st != KILN_OK) return st;
    if (kiln_tensor_count(values) != 2 || values->dtype != out->dtype)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "values must hold two elements [off, on]");
    if (!kiln_dtype_is_numeric(ind->dtype))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "indices of type %s",
                               kiln_dtype_name(ind->dtype));
    int axis;
    st = kiln_norm_axis(node, kiln_attr_int(node, "axis", -1), out->rank, &axis);
    if (st != KILN_OK) return st;
    int64_t outer = dims_product(ind->dims, 0, axis);
    int64_t inner = dims_product(ind->dims, axis, ind->rank);
    if (kiln_tensor_count(out) != outer * depth * inner)
        return kiln_node_error(node, KILN_ERR_INTERNAL, "output size does not match");
    st = kiln_tensor_fill_elems(out, 0, kiln_tensor_count(out), values, 0);
    if (st != KILN_OK) return st;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t in = 0; in < inner; in++) {
            int64_t v = kiln_tensor_i64(ind, o * inner + in);
            if (v < 0) v += depth;
            if (v < 0 || v >= depth) continue; /* out of range: all off */
            st = kiln_tensor_copy_elems(out, (o * depth + v) * inner + in, values, 1, 1);
            if (st != KILN_OK) return st;
        }
    }
    return KILN_OK;
}

KILN_REF_OP(OneHot, onehot_infer, onehot_run);

/* ReverseSequence's time and batch axes: 0 and 1 in some order. */
static kiln_status reverse_axes(const struct kiln_node *node, int *time, int *batch)
{
    int64_t t = kiln_attr_int(node, "time_axis", 0), b = kiln_attr_int(node, "batch_axis", 1);
    if ((t != 0 && t != 1) || (b != 0 && b != 1) || t == b)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "time_axis %lld and batch_axis %lld must be 0 and 1", (long long)t,
                               (long long)b);
    *time = (int)t;
    *batch = (int)b;
    return KILN_OK;
}

static kiln_status reverse_sequence_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    int time, batch;
    kiln_status st = reverse_axes(ctx->node, &time, &batch);
    if (st != KILN_OK) return st;
    if (x->rank >= 0 && x->rank < 2)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "input must have rank >= 2, got %d", x->rank);
    set_out(ctx, 0, x);
    return KILN_OK;
}

/* Element at time t < len[b] comes from time len[b] - 1 - t; the rest is copied. */
static kiln_status reverse_sequence_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0], *lens = ctx->in[1];
    kiln_tensor *out = ctx->out[0];
    int time = 0, batch = 0;
    kiln_status st = reverse_axes(node, &time, &batch);
    if (st != KILN_OK) return st;
    int64_t nb = x->dims[batch], nt = x->dims[time];
    if (kiln_tensor_count(lens) != nb || !kiln_dtype_is_int(lens->dtype))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "sequence_lens must hold %lld integers, one per batch", (long long)nb);
    for (int64_t b = 0; b < nb; b++) {
        int64_t l = kiln_tensor_i64(lens, b);
        if (l < 0 || l > nt)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "sequence_lens[%lld] is %lld; the time axis has %lld",
                                   (long long)b, (long long)l, (long long)nt);
    }
    int64_t strides[KILN_MAX_RANK];
    kiln_shape_strides(x->rank, x->dims, strides);
    int64_t st_t = strides[time], st_b = strides[batch], n = kiln_tensor_count(x);
    for (int64_t i = 0; i < n; i++) {
        int64_t t = (i / st_t) % nt, b = (i / st_b) % nb;
        int64_t l = kiln_tensor_i64(lens, b);
        int64_t src = t < l ? i + (l - 1 - 2 * t) * st_t : i;
        st = kiln_tensor_copy_elems(out, i, x, src, 1);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

KILN_REF_OP(ReverseSequence, reverse_sequence_infer, reverse_sequence_run);

/* ---- NonZero, Compress, Unique (DYNOUT) ---- */

/* True if element i of a numeric tensor is not zero (NaN counts as nonzero). */
static bool elem_nonzero(const kiln_tensor *x, int64_t i)
{
    if (kiln_dtype_is_float(x->dtype)) return kiln_get_f64(x->dtype, x->data, i) != 0;
    return kiln_get_i64(x->dtype, x->data, i) != 0;
}

/* NonZero: int64 [rank, count] (a scalar counts as rank 1). */
static kiln_status nonzero_infer(struct kiln_infer_ctx *ctx)
{
    struct kiln_type t;
    type_unknown_dims(&t, KILN_DTYPE_I64, 2);
    if (ctx->in[0] && ctx->in[0]->rank >= 0) t.dims[0] = ctx->in[0]->rank ? ctx->in[0]->rank : 1;
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/* Count the nonzeros, then write their coordinates column by column. */
static kiln_status nonzero_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    if (!kiln_dtype_is_numeric(x->dtype))
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "input of type %s",
                               kiln_dtype_name(x->dtype));
    int64_t n = kiln_tensor_count(x), nnz = 0;
    for (int64_t i = 0; i < n; i++) nnz += elem_nonzero(x, i);
    int r = x->rank ? x->rank : 1;
    int64_t one = 1;
    const int64_t *dims = x->rank ? x->dims : &one;
    int64_t odims[2] = {r, nnz};
    kiln_tensor *y;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_I64, 2, odims, &y);
    if (st != KILN_OK) return st;
    int64_t *o = y->data, idx[KILN_MAX_RANK] = {0}, col = 0;
    for (int64_t i = 0; i < n; i++) {
        if (elem_nonzero(x, i)) {
            for (int d = 0; d < r; d++) o[d * nnz + col] = idx[d];
            col++;
        }
        for (int d = r - 1; d >= 0; d--) {
            if (++idx[d] < dims[d]) break;
            idx[d] = 0;
        }
    }
    ctx->out[0] = y;
    return KILN_OK;
}

KILN_REF_OP(NonZero, nonzero_infer, nonzero_run);

/* Compress: the axis dim (or the flattened input) becomes unknown. */
static kiln_status compress_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    struct kiln_type t;
    if (!kiln_node_attr(ctx->node, "axis")) {
        type_unknown_dims(&t, x->dtype, 1);
    } else if (x->rank < 0) {
        type_unknown_dims(&t, x->dtype, -1);
    } else {
        int axis;
        kiln_status st = kiln_norm_axis(ctx->node, kiln_attr_int(ctx->node, "axis", 0), x->rank,
                                        &axis);
        if (st != KILN_OK) return st;
        t = *x;
        t.dims[axis] = -1;
        t.sym[axis] = NULL;
    }
    set_out(ctx, 0, &t);
    return KILN_OK;
}

/* Keep the slices along axis (or the flat elements) whose condition entry is true. */
static kiln_status compress_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0], *cond = ctx->in[1];
    if (cond->rank != 1 || !kiln_dtype_is_numeric(cond->dtype))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "condition must be a 1-D bool tensor");
    bool has_axis = kiln_node_attr(node, "axis") != NULL;
    int axis = 0;
    int64_t outer = 1, n = kiln_tensor_count(x), inner = 1;
    if (has_axis) {
        kiln_status st = kiln_norm_axis(node, kiln_attr_int(node, "axis", 0), x->rank, &axis);
        if (st != KILN_OK) return st;
        if (x->rank == 0)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "cannot compress a scalar");
        outer = dims_product(x->dims, 0, axis);
        n = x->dims[axis];
        inner = dims_product(x->dims, axis + 1, x->rank);
    }
    int64_t len = cond->dims[0], kept = 0;
    for (int64_t i = 0; i < len; i++) {
        if (!elem_nonzero(cond, i)) continue;
        if (i >= n)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "condition[%lld] is true but the axis has %lld entries",
                                   (long long)i, (long long)n);
        kept++;
    }
    int64_t dims[KILN_MAX_RANK];
    int rank = 1;
    dims[0] = kept;
    if (has_axis) {
        rank = x->rank;
        for (int i = 0; i < rank; i++) dims[i] = i == axis ? kept : x->dims[i];
    }
    kiln_tensor *y;
    kiln_status st = kiln_tensor_new(x->dtype, rank, dims, &y);
    if (st != KILN_OK) return st;
    for (int64_t o = 0; o < outer; o++) {
        int64_t at = 0;
        for (int64_t i = 0; i < len && i < n; i++) {
            if (!elem_nonzero(cond, i)) continue;
            st = kiln_tensor_copy_elems(y, (o * kept + at) * inner, x, (o * n + i) * inner, inner);
            if (st != KILN_OK) {
                kiln_tensor_free(y);
                return st;
            }
            at++;
        }
    }
    ctx->out[0] = y;
    return KILN_OK;
}

KILN_REF_OP(Compress, compress_infer, compress_run);

/*
 * Unique views the input as n slices along axis (or n single elements when
 * there is no axis): slice i is the elements x[o, i, in] for every outer o
 * and inner in, compared lexicographically in that order.
 */
struct unique_view {
    const kiln_tensor *x;
    int64_t outer, n, inner;
};

/* Compare two elements of x: -1, 0 or 1 (NaNs equal each other and sort last). */
static int elem_cmp(const kiln_tensor *x, int64_t a, int64_t b)
{
    kiln_dtype dt = x->dtype;
    if (dt == KILN_DTYPE_STRING) {
        const kiln_string *sa = (const kiln_string *)x->data + a;
        const kiln_string *sb = (const kiln_string *)x->data + b;
        size_t m = sa->len < sb->len ? sa->len : sb->len;
        int c = m ? memcmp(sa->data, sb->data, m) : 0;
        if (c) return c < 0 ? -1 : 1;
        return sa->len < sb->len ? -1 : sa->len > sb->len;
    }
    if (kiln_dtype_is_float(dt)) {
        double va = kiln_get_f64(dt, x->data, a), vb = kiln_get_f64(dt, x->data, b);
        if (isnan(va) || isnan(vb)) return isnan(va) - isnan(vb);
        return va < vb ? -1 : va > vb;
    }
    if (dt == KILN_DTYPE_U64) {
        uint64_t va = ((const uint64_t *)x->data)[a], vb = ((const uint64_t *)x->data)[b];
        return va < vb ? -1 : va > vb;
    }
    int64_t va = kiln_get_i64(dt, x->data, a), vb = kiln_get_i64(dt, x->data, b);
    return va < vb ? -1 : va > vb;
}

/* Compare slices i and j of the view. */
static int slice_cmp(const struct unique_view *u, int64_t i, int64_t j)
{
    for (int64_t o = 0; o < u->outer; o++) {
        for (int64_t in = 0; in < u->inner; in++) {
            int c = elem_cmp(u->x, (o * u->n + i) * u->inner + in, (o * u->n + j) * u->inner + in);
            if (c) return c;
        }
    }
    return 0;
}

/* Stable merge sort of slice numbers a[0..n) by slice_cmp, with scratch tmp[0..n). */
static void slice_sort(const struct unique_view *u, int64_t *a, int64_t *tmp, int64_t n)
{
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n;
            int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = slice_cmp(u, a[j], a[i]) < 0 ? a[j++] : a[i++];
            while (i < mid) tmp[k++] = a[i++];
            while (j < hi) tmp[k++] = a[j++];
        }
        memcpy(a, tmp, (size_t)n * sizeof *a);
    }
}

/* Y: the input with the axis dim (or the flattened input) unknown; the rest int64 1-D. */
static kiln_status unique_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (!x) return KILN_OK;
    struct kiln_type y, idx, inv;
    int64_t n = -1;
    type_unknown_dims(&idx, KILN_DTYPE_I64, 1);
    if (!kiln_node_attr(ctx->node, "axis")) {
        type_unknown_dims(&y, x->dtype, 1);
        if (x->rank >= 0) n = kiln_shape_count(x->rank, x->dims);
    } else if (x->rank < 0) {
        type_unknown_dims(&y, x->dtype, -1);
    } else {
        int axis;
        kiln_status st =
            kiln_norm_axis(ctx->node, kiln_attr_int(ctx->node, "axis", 0), x->rank, &axis);
        if (st != KILN_OK) return st;
        y = *x;
        n = x->dims[axis];
        y.dims[axis] = -1;
        y.sym[axis] = NULL;
    }
    inv = idx;
    inv.dims[0] = n;
    set_out(ctx, 0, &y);
    set_out(ctx, 1, &idx);
    set_out(ctx, 2, &inv);
    set_out(ctx, 3, &idx);
    return KILN_OK;
}

/*
 * Sort the slices (stably, so each group starts with its first occurrence),
 * group equal neighbours, and order the groups by value (sorted=1) or by
 * first occurrence (sorted=0). Outputs: the unique slices, the index of each
 * one's first occurrence, each input slice's group, and the group sizes.
 */
static kiln_status unique_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    struct unique_view u = {x, 1, kiln_tensor_count(x), 1};
    bool has_axis = kiln_node_attr(node, "axis") != NULL;
    int axis = 0;
    kiln_status st;
    if (has_axis) {
        st = kiln_norm_axis(node, kiln_attr_int(node, "axis", 0), x->rank, &axis);
        if (st != KILN_OK) return st;
        if (x->rank == 0)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "axis given for a scalar");
        u.outer = kiln_shape_count(axis, x->dims);
        u.n = x->dims[axis];
        u.inner = kiln_shape_count(x->rank - axis - 1, x->dims + axis + 1);
    }
    int64_t n = u.n;
    /* scratch: sorted order, merge buffer, group of each slice, first index and size per group */
    int64_t *buf = malloc((size_t)(5 * n + 1) * sizeof *buf);
    if (!buf) return kiln_node_error(node, KILN_ERR_OUT_OF_MEMORY, "out of memory in Unique");
    int64_t *order = buf, *tmp = buf + n, *group = buf + 2 * n, *first = buf + 3 * n,
            *count = buf + 4 * n;
    for (int64_t i = 0; i < n; i++) order[i] = i;
    slice_sort(&u, order, tmp, n);
    int64_t ng = 0;
    for (int64_t p = 0; p < n; p++) {
        if (p == 0 || slice_cmp(&u, order[p - 1], order[p]) != 0) {
            first[ng] = order[p];
            count[ng] = 0;
            ng++;
        }
        group[order[p]] = ng - 1;
        count[ng - 1]++;
    }
    /* rank[g]: output position of group g */
    int64_t *rank = tmp;
    if (kiln_attr_int(node, "sorted", 1) != 0) {
        for (int64_t g = 0; g < ng; g++) rank[g] = g;
    } else {
        int64_t pos = 0;
        for (int64_t i = 0; i < n; i++)
            if (first[group[i]] == i) rank[group[i]] = pos++;
    }
    kiln_tensor *outs[4] = {NULL};
    int64_t ydims[KILN_MAX_RANK];
    int yrank = 1;
    ydims[0] = ng;
    if (has_axis) {
        yrank = x->rank;
        for (int i = 0; i < yrank; i++) ydims[i] = i == axis ? ng : x->dims[i];
    }
    st = kiln_tensor_new(x->dtype, yrank, ydims, &outs[0]);
    for (int i = 1; i < 4 && st == KILN_OK; i++) {
        int64_t d = i == 2 ? n : ng;
        if (out_wanted(ctx, i)) st = kiln_tensor_new(KILN_DTYPE_I64, 1, &d, &outs[i]);
    }
    for (int64_t g = 0; g < ng && st == KILN_OK; g++) {
        int64_t r = rank[g];
        for (int64_t o = 0; o < u.outer && st == KILN_OK; o++)
            st = kiln_tensor_copy_elems(outs[0], (o * ng + r) * u.inner, x, (o * n + first[g]) * u.inner,
                            u.inner);
        if (outs[1]) ((int64_t *)outs[1]->data)[r] = first[g];
        if (outs[3]) ((int64_t *)outs[3]->data)[r] = count[g];
    }
    if (outs[2] && st == KILN_OK)
        for (int64_t i = 0; i < n; i++) ((int64_t *)outs[2]->data)[i] = rank[group[i]];
    free(buf);
    if (st != KILN_OK) {
        for (int i = 0; i < 4; i++) kiln_tensor_free(outs[i]);
        return st;
    }
    for (int i = 0; i < 4; i++) {
        if (out_wanted(ctx, i)) ctx->out[i] = outs[i];
        else kiln_tensor_free(outs[i]);
    }
    return KILN_OK;
}

KILN_REF_OP(Unique, unique_infer, unique_run);
