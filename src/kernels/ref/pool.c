/*
 * pool.c - reference kernels for pooling: MaxPool (with the optional
 * Indices output), AveragePool, LpPool, their Global* forms, and
 * MaxUnpool.
 *
 * Windowed pools share kiln_window_resolve (conv.c) for kernel, strides,
 * dilations, pads, auto_pad and ceil_mode. The input is read once into
 * doubles (float and 8-bit integer inputs are exact there); each output
 * position then walks its window, skipping positions outside the input.
 * AveragePool divides by the number of input positions in the window, or
 * with count_include_pad by the positions inside the padded input (not the
 * extra room ceil_mode may add past the end padding).
 */
#include <stdlib.h>

#include "kernels/kernel.h"
#include "kernels/ref/gemm.h"

enum pool_kind { POOL_MAX, POOL_AVG, POOL_LP };

struct pool_op {
    enum pool_kind kind;
    bool count_include_pad; /* AveragePool */
    double p;               /* LpPool exponent */
    bool column_major;      /* MaxPool storage_order = 1: Indices count the first dim fastest */
};

/* The spatial window of a pooling node over input type x (spatial dims may be unknown). */
static kiln_status pool_window(const struct kiln_node *node, const struct kiln_type *x,
                               struct kiln_window *w)
{
    if (x->rank < 3)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "X must have rank >= 3 (N, C, spatial), got %d", x->rank);
    bool ceil_mode = kiln_attr_int(node, "ceil_mode", 0) != 0;
    return kiln_window_resolve(node, x->rank - 2, x->dims + 2, NULL, ceil_mode, w);
}

static kiln_status pool_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    for (int i = 0; i < ctx->n_out; i++)
        if (ctx->out[i]) kiln_type_unknown(ctx->out[i]);
    if (!x) return KILN_OK;
    struct kiln_type t;
    kiln_type_unknown(&t);
    t.dtype = x->dtype;
    if (x->rank >= 0) {
        struct kiln_window w;
        kiln_status st = pool_window(ctx->node, x, &w);
        if (st != KILN_OK) return st;
        t = *x;
        for (int i = 0; i < w.nsp; i++) {
            if (w.out[i] != x->dims[i + 2]) t.sym[i + 2] = NULL;
            t.dims[i + 2] = w.out[i];
        }
    }
    if (ctx->out[0]) *ctx->out[0] = t;
    if (ctx->n_out > 1 && ctx->out[1]) {
        *ctx->out[1] = t;
        ctx->out[1]->dtype = KILN_DTYPE_I64;
    }
    return KILN_OK;
}

/* The input tensor's elements as doubles (malloc'd; NULL on OOM). */
static double *read_f64(const kiln_tensor *x)
{
    int64_t n = kiln_tensor_count(x);
    double *d = malloc(sizeof(double) * (size_t)(n + 1));
    if (!d) return NULL;
    if (x->dtype == KILN_DTYPE_F32)
        for (int64_t i = 0; i < n; i++) d[i] = ((const float *)x->data)[i];
    else
        for (int64_t i = 0; i < n; i++) d[i] = kiln_get_f64(x->dtype, x->data, i);
    return d;
}

/* Ceiling division for a positive divisor. */
static int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -(-a / b); }

/* Per spatial dim and output coordinate: the kernel taps j in [lo, hi) land
 * inside the input; the first n_pad taps land inside the input or its padding. */
struct tap_range {
    int64_t lo, hi, n_pad;
};

/* Fill tab[d][o] for every dim d and output coordinate o (tab[d] = base + offset). */
static void tap_ranges(const struct kiln_window *w, struct tap_range *buf,
                       struct tap_range **tab)
{
    for (int d = 0; d < w->nsp; d++) {
        tab[d] = buf;
        int64_t dil = w->dilation[d], k = w->kernel[d];
        for (int64_t o = 0; o < w->out[d]; o++, buf++) {
            int64_t start = o * w->stride[d] - w->pad_begin[d];
            int64_t lo = start >= 0 ? 0 : ceil_div(-start, dil);
            int64_t hi = ceil_div(w->in[d] - start, dil);
            int64_t n_pad = ceil_div(w->in[d] + w->pad_end[d] - start, dil);
            buf->lo = lo;
            buf->hi = hi > k ? k : hi < lo ? lo : hi;
            buf->n_pad = n_pad < 0 ? 0 : n_pad > k ? k : n_pad;
        }
    }
}

/* Combine one window of one plane: value, and for MAX the argmax's offset in the plane. */
static double pool_window_value(const struct pool_op *op, const struct kiln_window *w,
                                struct tap_range *const *tab, const double *plane,
                                const int64_t *o, const int64_t *rm_stride,
                                const int64_t *cm_stride, int64_t *arg)
{
    int nsp = w->nsp;
    int64_t lo[KILN_MAX_RANK], hi[KILN_MAX_RANK], j[KILN_MAX_RANK];
    int64_t n_valid = 1, n_padded = 1, off = 0, cm = 0;
    for (int d = 0; d < nsp; d++) {
        const struct tap_range *r = &tab[d][o[d]];
        int64_t pos = o[d] * w->stride[d] - w->pad_begin[d] + r->lo * w->dilation[d];
        lo[d] = j[d] = r->lo;
        hi[d] = r->hi;
        n_valid *= r->hi - r->lo;
        n_padded *= r->n_pad;
        off += pos * rm_stride[d];
        cm += pos * cm_stride[d];
    }
    double best = 0, sum = 0;
    *arg = -1;
    for (int64_t t = 0; t < n_valid; t++) {
        double v = plane[off];
        switch (op->kind) {
        case POOL_MAX: /* a NaN anywhere in the window wins, as in PyTorch and the global pool */
            if (t == 0 || v > best || (isnan(v) && !isnan(best))) {
                best = v;
                *arg = op->column_major ? cm : off;
            }
            break;
        case POOL_AVG: sum += v; break;
        case POOL_LP: sum += op->p == 2 ? v * v : pow(fabs(v), op->p); break;
        }
        for (int d = nsp - 1; d >= 0; d--) { /* next valid tap */
            off += w->dilation[d] * rm_stride[d];
            cm += w->dilation[d] * cm_stride[d];
            if (++j[d] < hi[d]) break;
            off -= (hi[d] - lo[d]) * w->dilation[d] * rm_stride[d];
            cm -= (hi[d] - lo[d]) * w->dilation[d] * cm_stride[d];
            j[d] = lo[d];
        }
    }
    switch (op->kind) {
    case POOL_MAX: return best;
    case POOL_AVG: {
        int64_t div = op->count_include_pad ? n_padded : n_valid;
        return div ? sum / (double)div : NAN;
    }
    case POOL_LP: return op->p == 2 ? sqrt(sum) : pow(sum, 1.0 / op->p);
    }
    return 0;
}

/* Run a windowed pool over every (n, c) plane of x into y (and indices, if wanted). */
static kiln_status pool_run_common(struct kiln_run_ctx *ctx, const struct pool_op *op)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    kiln_tensor *ind = ctx->n_out > 1 ? ctx->out[1] : NULL;
    bool int_ok = op->kind == POOL_MAX &&
                  (x->dtype == KILN_DTYPE_I8 || x->dtype == KILN_DTYPE_U8);
    if (!kiln_dtype_is_float(x->dtype) && !int_ok)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "dtype %s is not supported",
                               kiln_dtype_name(x->dtype));
    struct kiln_type xt;
    kiln_type_from_tensor(&xt, x);
    struct kiln_window w;
    kiln_status st = pool_window(node, &xt, &w);
    if (st != KILN_OK) return st;
    int nsp = w.nsp;
    int64_t rm_stride[KILN_MAX_RANK], cm_stride[KILN_MAX_RANK];
    kiln_shape_strides(nsp, w.in, rm_stride);
    int64_t cm = 1;
    for (int d = 0; d < nsp; d++) { /* column-major: first spatial dim fastest */
        cm_stride[d] = cm;
        cm *= w.in[d];
    }
    int64_t planes = x->dims[0] * x->dims[1];
    int64_t in_size = kiln_shape_count(nsp, w.in), out_size = kiln_shape_count(nsp, w.out);
    int64_t n_tab = 0;
    for (int d = 0; d < nsp; d++) n_tab += w.out[d];
    double *xd = read_f64(x);
    struct tap_range *tab_buf = malloc(sizeof(struct tap_range) * (size_t)(n_tab + 1));
    if (!xd || !tab_buf) {
        free(xd);
        free(tab_buf);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", node->op_type);
    }
    struct tap_range *tab[KILN_MAX_RANK];
    tap_ranges(&w, tab_buf, tab);
    int64_t *idx = ind ? ind->data : NULL;
    for (int64_t pl = 0; pl < planes; pl++) {
        const double *plane = xd + pl * in_size;
        int64_t o[KILN_MAX_RANK] = {0};
        for (int64_t i = 0; i < out_size; i++) {
            int64_t arg;
            double v = pool_window_value(op, &w, tab, plane, o, rm_stride, cm_stride, &arg);
            int64_t yi = pl * out_size + i;
            if (y->dtype == KILN_DTYPE_F32) ((float *)y->data)[yi] = (float)v;
            else kiln_set_f64(y->dtype, y->data, yi, v);
            if (idx) idx[yi] = arg < 0 ? -1 : pl * in_size + arg;
            for (int d = nsp - 1; d >= 0; d--) { /* next output position */
                if (++o[d] < w.out[d]) break;
                o[d] = 0;
            }
        }
    }
    free(xd);
    free(tab_buf);
    return KILN_OK;
}

static kiln_status max_pool_run(struct kiln_run_ctx *ctx)
{
    int64_t so = kiln_attr_int(ctx->node, "storage_order", 0);
    if (so != 0 && so != 1)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "storage_order is %lld",
                               (long long)so);
    struct pool_op op = {.kind = POOL_MAX, .column_major = so == 1};
    return pool_run_common(ctx, &op);
}

KILN_REF_OP(MaxPool, pool_infer, max_pool_run);

static kiln_status average_pool_run(struct kiln_run_ctx *ctx)
{
    struct pool_op op = {
        .kind = POOL_AVG,
        .count_include_pad = kiln_attr_int(ctx->node, "count_include_pad", 0) != 0,
    };
    return pool_run_common(ctx, &op);
}

KILN_REF_OP(AveragePool, pool_infer, average_pool_run);

/* The p attribute of LpPool / GlobalLpPool (INT in current opsets, FLOAT in opset 1). */
static kiln_status lp_exponent(const struct kiln_node *node, double *p)
{
    /* p is INT in the ONNX schema; some exporters write FLOAT */
    const struct kiln_attr *pa = kiln_node_attr(node, "p");
    *p = pa && pa->type == KILN_ATTR_FLOAT ? pa->f : (float)kiln_attr_int(node, "p", 2);
    if (!(*p > 0))
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "p is %g, must be > 0", *p);
    return KILN_OK;
}

static kiln_status lp_pool_run(struct kiln_run_ctx *ctx)
{
    struct pool_op op = {.kind = POOL_LP};
    kiln_status st = lp_exponent(ctx->node, &op.p);
    if (st != KILN_OK) return st;
    return pool_run_common(ctx, &op);
}

KILN_REF_OP(LpPool, pool_infer, lp_pool_run);

/* ---- Global pools: [N, C, D...] -> [N, C, 1...] ---- */

static kiln_status global_pool_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    const struct kiln_type *x = ctx->in[0];
    kiln_type_unknown(ctx->out[0]);
    if (!x) return KILN_OK;
    *ctx->out[0] = *x;
    if (x->rank < 0) return KILN_OK;
    if (x->rank < 2)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "X must have rank >= 2 (N, C, ...), got %d", x->rank);
    for (int i = 2; i < x->rank; i++) {
        ctx->out[0]->dims[i] = 1;
        ctx->out[0]->sym[i] = NULL;
    }
    return KILN_OK;
}

/* Reduce each (n, c) plane to one value. */
static kiln_status global_pool_common(struct kiln_run_ctx *ctx, enum pool_kind kind, double p)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    if (!kiln_dtype_is_float(x->dtype))
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "dtype %s is not supported",
                               kiln_dtype_name(x->dtype));
    if (x->rank < 2)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "X must have rank >= 2 (N, C, ...), got %d", x->rank);
    int64_t planes = x->dims[0] * x->dims[1];
    int64_t size = kiln_shape_count(x->rank - 2, x->dims + 2);
    for (int64_t pl = 0; pl < planes; pl++) {
        double acc = kind == POOL_MAX ? -INFINITY : 0;
        for (int64_t i = 0; i < size; i++) {
            int64_t xi = pl * size + i;
            double v = x->dtype == KILN_DTYPE_F32 ? ((const float *)x->data)[xi]
                                                  : kiln_get_f64(x->dtype, x->data, xi);
            if (kind == POOL_MAX) acc = v > acc || isnan(v) ? v : acc;
            else if (kind == POOL_AVG) acc += v;
            else acc += p == 2 ? v * v : pow(fabs(v), p);
        }
        if (kind == POOL_AVG) acc = size ? acc / (double)size : NAN;
        if (kind == POOL_LP) acc = p == 2 ? sqrt(acc) : pow(acc, 1.0 / p);
        kiln_set_f64(y->dtype, y->data, pl, acc);
    }
    return KILN_OK;
}

static kiln_status global_average_pool_run(struct kiln_run_ctx *ctx)
{
    return global_pool_common(ctx, POOL_AVG, 0);
}

static kiln_status global_max_pool_run(struct kiln_run_ctx *ctx)
{
    return global_pool_common(ctx, POOL_MAX, 0);
}

static kiln_status global_lp_pool_run(struct kiln_run_ctx *ctx)
{
    double p;
    kiln_status st = lp_exponent(ctx->node, &p);
    if (st != KILN_OK) return st;
    return global_pool_common(ctx, POOL_LP, p);
}

KILN_REF_OP(GlobalAveragePool, global_pool_infer, global_average_pool_run);
KILN_REF_OP(GlobalMaxPool, global_pool_infer, global_max_pool_run);
KILN_REF_OP(GlobalLpPool, global_pool_infer, global_lp_pool_run);

/* ---- MaxUnpool ---- */

/*
 * Output type of MaxUnpool: the output_shape input when its value is
 * known, else [N, C, (in - 1) * stride + kernel - pad_begin - pad_end ...].
 */
static kiln_status max_unpool_type(const struct kiln_node *node, const struct kiln_type *x,
                                   const kiln_tensor *shape, struct kiln_type *out)
{
    kiln_type_unknown(out);
    out->dtype = x ? x->dtype : KILN_DTYPE_UNDEFINED;
    if (shape) {
        int64_t n = kiln_tensor_count(shape);
        if (shape->rank != 1 || n > KILN_MAX_RANK || (x && x->rank >= 0 && n != x->rank))
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "output_shape must be 1-D with one value per dim of X");
        out->rank = (int)n;
        for (int i = 0; i < out->rank; i++) {
            out->dims[i] = kiln_tensor_i64(shape, i);
            if (out->dims[i] < 0)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "output_shape[%d] is %lld", i, (long long)out->dims[i]);
        }
        return KILN_OK;
    }
    if (!x || x->rank < 0) return KILN_OK;
    if (x->rank < 3)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "X must have rank >= 3 (N, C, spatial), got %d", x->rank);
    int nsp = x->rank - 2;
    const int64_t *ks, *st, *pads;
    int nks = kiln_attr_ints(node, "kernel_shape", &ks);
    int nst = kiln_attr_ints(node, "strides", &st);
    int npd = kiln_attr_ints(node, "pads", &pads);
    if (nks != nsp || (nst > 0 && nst != nsp) || (npd > 0 && npd != 2 * nsp))
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "kernel_shape, strides and pads must match %d spatial dims", nsp);
    *out = *x;
    for (int i = 0; i < nsp; i++) {
        int64_t n = x->dims[i + 2], s = nst > 0 ? st[i] : 1;
        int64_t pb = npd > 0 ? pads[i] : 0, pe = npd > 0 ? pads[nsp + i] : 0;
        int64_t lim = KILN_WINDOW_MAX;
        if (n > lim || ks[i] < 1 || ks[i] > lim || s < 1 || s > lim || pb < 0 || pb > lim ||
            pe < 0 || pe > lim)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "spatial dim %d: size %lld, kernel %lld, stride %lld or pads "
                                   "%lld, %lld out of range",
                                   i, (long long)n, (long long)ks[i], (long long)s, (long long)pb,
                                   (long long)pe);
        out->sym[i + 2] = NULL;
        out->dims[i + 2] = n < 0 ? -1 : (n - 1) * s + ks[i] - pb - pe;
        if (n >= 0 && out->dims[i + 2] < 0)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "output dim %d is negative",
                                   i + 2);
    }
    return KILN_OK;
}

static kiln_status max_unpool_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    bool has_shape = ctx->n_in > 2 && ctx->in[2];
    const kiln_tensor *shape = has_shape ? ctx->in_value[2] : NULL;
    if (has_shape && !shape) { /* shape given but not known yet */
        kiln_type_unknown(ctx->out[0]);
        ctx->out[0]->dtype = ctx->in[0] ? ctx->in[0]->dtype : KILN_DTYPE_UNDEFINED;
        if (ctx->in[0]) ctx->out[0]->rank = ctx->in[0]->rank;
        for (int i = 0; i < ctx->out[0]->rank; i++) ctx->out[0]->dims[i] = -1;
        return KILN_OK;
    }
    return max_unpool_type(ctx->node, ctx->in[0], shape, ctx->out[0]);
}

/* Indices address the default output shape; with output_shape they are
 * re-addressed into the larger output (values land at the same coordinates). */
static kiln_status max_unpool_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0], *ind = ctx->in[1];
    kiln_tensor *y = ctx->out[0];
    if (ind->dtype != KILN_DTYPE_I64)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "I must be int64, got %s",
                               kiln_dtype_name(ind->dtype));
    if (x->dtype == KILN_DTYPE_STRING || y->dtype != x->dtype)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "dtype %s is not supported",
                               kiln_dtype_name(x->dtype));
    int64_t n = kiln_tensor_count(x), ny = kiln_tensor_count(y);
    if (kiln_tensor_count(ind) != n)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "I has %lld values, X has %lld",
                               (long long)kiln_tensor_count(ind), (long long)n);
    struct kiln_type xt, dflt;
    kiln_type_from_tensor(&xt, x);
    kiln_status st = max_unpool_type(node, &xt, NULL, &dflt);
    if (st != KILN_OK) return st;
    if (dflt.rank != y->rank)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "output_shape has rank %d, X has rank %d", y->rank, dflt.rank);
    int64_t n_dflt = kiln_shape_count(dflt.rank, dflt.dims);
    int64_t ystride[KILN_MAX_RANK];
    kiln_shape_strides(y->rank, y->dims, ystride);
    size_t es = kiln_dtype_size(x->dtype);
    memset(y->data, 0, es * (size_t)ny);
    const int64_t *idx = ind->data;
    for (int64_t i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= n_dflt)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "index %lld is out of range for %lld output values",
                                   (long long)idx[i], (long long)n_dflt);
        int64_t rest = idx[i], yi = 0;
        for (int d = dflt.rank - 1; d >= 0; d--) {
            int64_t c = rest % dflt.dims[d];
            rest /= dflt.dims[d];
            if (c >= y->dims[d])
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "index %lld falls outside output_shape",
                                       (long long)idx[i]);
            yi += c * ystride[d];
        }
        memcpy((char *)y->data + (size_t)yi * es, (const char *)x->data + (size_t)i * es, es);
    }
    return KILN_OK;
}

KILN_REF_OP(MaxUnpool, max_unpool_infer, max_unpool_run);
