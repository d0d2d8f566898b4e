/*
 * norm.c - reference kernels for the softmax family and normalizations:
 * Softmax, LogSoftmax, Hardmax, BatchNormalization, InstanceNormalization,
 * LayerNormalization, RMSNormalization, GroupNormalization,
 * LpNormalization, MeanVarianceNormalization and LRN.
 *
 * The softmax family works along one axis from opset 13; before that the
 * input is coerced to 2-D at the axis and each row [axis..rank) is one
 * group. Statistics (means, variances, sums of exponentials) are
 * accumulated in double whatever the dtype; float32 has typed loops for the
 * ops whole models lean on (Softmax, LayerNormalization, BatchNormalization)
 * and every other dtype goes through the generic element accessors.
 */
#include "kernels/kernel.h"

/* Product of dims[lo..hi). */
static int64_t dims_product(const int64_t *dims, int lo, int hi)
{
    int64_t p = 1;
    for (int d = lo; d < hi; d++) p *= dims[d];
    return p;
}

static kiln_status unsupported_dtype(const struct kiln_node *node, kiln_dtype dt)
{
    return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "input dtype %s is not supported",
                           kiln_dtype_name(dt));
}

/* ---- Softmax, LogSoftmax, Hardmax ---- */

/* Groups of a softmax-family op: outer groups of n elements spaced inner apart. */
struct axis_layout {
    int64_t outer, n, inner;
};

/* Layout of a softmax-family op over x: along "axis" from opset 13 (default
 * -1), over the 2-D coercion at "axis" before (default 1). */
static kiln_status softmax_layout(const struct kiln_node *node, const kiln_tensor *x,
                                  struct axis_layout *l)
{
    l->outer = l->n = l->inner = 1;
    if (x->rank == 0) return KILN_OK;
    bool legacy = node->opset > 0 && node->opset < 13;
    int64_t attr = kiln_attr_int(node, "axis", legacy ? 1 : -1);
    int axis = x->rank; /* the 2-D coercion also allows axis == rank: rows of one element */
    if (!legacy || attr != x->rank) {
        kiln_status st = kiln_norm_axis(node, attr, x->rank, &axis);
        if (st != KILN_OK) return st;
    }
    l->outer = dims_product(x->dims, 0, axis);
    if (legacy) {
        l->n = dims_product(x->dims, axis, x->rank);
    } else {
        l->n = x->dims[axis];
        l->inner = dims_product(x->dims, axis + 1, x->rank);
    }
    return KILN_OK;
}

/* Float32 softmax (or log-softmax) of every group, typed loops. */
static void softmax_f32(const float *x, float *y, const struct axis_layout *l, bool log_out)
{
    int64_t n = l->n, inner = l->inner;
    for (int64_t o = 0; o < l->outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            const float *xs = x + o * n * inner + i;
            float *ys = y + o * n * inner + i;
            float mx = -INFINITY;
            for (int64_t k = 0; k < n; k++)
                if (xs[k * inner] > mx) mx = xs[k * inner];
            double sum = 0.0;
            if (log_out) {
                for (int64_t k = 0; k < n; k++) sum += expf(xs[k * inner] - mx);
                float lse = mx + (float)log(sum);
                for (int64_t k = 0; k < n; k++) ys[k * inner] = xs[k * inner] - lse;
            } else {
                for (int64_t k = 0; k < n; k++) {
                    float e = expf(xs[k * inner] - mx);
                    ys[k * inner] = e;
                    sum += e;
                }
                float inv = (float)(1.0 / sum);
                for (int64_t k = 0; k < n; k++) ys[k * inner] *= inv;
            }
        }
    }
}

/* Softmax (or log-softmax) of every group through the generic accessors. */
static void softmax_any(kiln_dtype dt, const void *x, void *y, const struct axis_layout *l,
                        bool log_out)
{
    int64_t n = l->n, inner = l->inner;
    for (int64_t o = 0; o < l->outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * n * inner + i;
            double mx = -INFINITY;
            for (int64_t k = 0; k < n; k++) {
                double v = kiln_get_f64(dt, x, base + k * inner);
                if (v > mx) mx = v;
            }
            double sum = 0.0;
            for (int64_t k = 0; k < n; k++) sum += exp(kiln_get_f64(dt, x, base + k * inner) - mx);
            for (int64_t k = 0; k < n; k++) {
                int64_t off = base + k * inner;
                double v = kiln_get_f64(dt, x, off) - mx;
                kiln_set_f64(dt, y, off, log_out ? v - log(sum) : exp(v) / sum);
            }
        }
    }
}

/* Softmax or LogSoftmax of float inputs. */
static kiln_status softmax_common(struct kiln_run_ctx *ctx, bool log_out)
{
    const kiln_tensor *x = ctx->in[0];
    if (!kiln_dtype_is_float(x->dtype)) return unsupported_dtype(ctx->node, x->dtype);
    struct axis_layout l;
    kiln_status st = softmax_layout(ctx->node, x, &l);
    if (st != KILN_OK) return st;
    if (x->dtype == KILN_DTYPE_F32) softmax_f32(x->data, ctx->out[0]->data, &l, log_out);
    else softmax_any(x->dtype, x->data, ctx->out[0]->data, &l, log_out);
    return KILN_OK;
}

static kiln_status softmax_run(struct kiln_run_ctx *ctx) { return softmax_common(ctx, false); }
static kiln_status log_softmax_run(struct kiln_run_ctx *ctx) { return softmax_common(ctx, true); }

/* 1 at the first maximum of each group, 0 elsewhere. */
static kiln_status hardmax_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    kiln_dtype dt = x->dtype;
    if (!kiln_dtype_is_numeric(dt) || dt == KILN_DTYPE_BOOL)
        return unsupported_dtype(ctx->node, dt);
    struct axis_layout l;
    kiln_status st = softmax_layout(ctx->node, x, &l);
    if (st != KILN_OK) return st;
    for (int64_t o = 0; o < l.outer; o++) {
        for (int64_t i = 0; i < l.inner; i++) {
            int64_t base = o * l.n * l.inner + i;
            int64_t best = 0;
            double bv = -INFINITY;
            for (int64_t k = 0; k < l.n; k++) {
                double v = kiln_get_f64(dt, x->data, base + k * l.inner);
                if (k == 0 || v > bv) {
                    bv = v;
                    best = k;
                }
            }
            for (int64_t k = 0; k < l.n; k++)
                kiln_set_f64(dt, y->data, base + k * l.inner, k == best ? 1.0 : 0.0);
        }
    }
    return KILN_OK;
}

/* Output type = input type; the axis is checked as soon as the rank is known. */
static kiln_status softmax_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (x && x->rank >= 0) {
        int axis;
        int64_t dflt = ctx->node->opset < 13 ? 1 : -1;
        kiln_status st = kiln_norm_axis(ctx->node, kiln_attr_int(ctx->node, "axis", dflt),
                                        x->rank, &axis);
        if (st != KILN_OK) return st;
    }
    return kiln_infer_same(ctx);
}

KILN_REF_OP(Softmax, softmax_infer, softmax_run);
KILN_REF_OP(LogSoftmax, softmax_infer, log_softmax_run);
KILN_REF_OP(Hardmax, softmax_infer, hardmax_run);

/* ---- BatchNormalization ---- */

/* Y like X; in training, running mean and variance like the inputs they update. */
static kiln_status batchnorm_infer(struct kiln_infer_ctx *ctx)
{
    if (ctx->out[0] && ctx->in[0]) *ctx->out[0] = *ctx->in[0];
    /* training outputs: running mean and variance, typed like the inputs they update */
    for (int k = 1; k < ctx->n_out && k < 3; k++)
        if (ctx->out[k] && ctx->in[2 + k]) *ctx->out[k] = *ctx->in[2 + k];
    return KILN_OK;
}

/* Check that an input is present and has n elements. */
static kiln_status check_count(const struct kiln_node *node, const kiln_tensor *t,
                               const char *what, int64_t n)
{
    if (!t) return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "input %s is missing", what);
    int64_t c = kiln_shape_count(t->rank, t->dims);
    if (c != n)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "%s has %lld elements, expected %lld", what, (long long)c,
                               (long long)n);
    return KILN_OK;
}

/* Per-channel affine normalization with the given statistics, or in
 * training mode with the batch's own (and updated running statistics). */

/* The channel-normalizing ops take a float N x C x ... input. */
static kiln_status check_nc_input(const struct kiln_node *node, const kiln_tensor *x)
{
    if (!kiln_dtype_is_float(x->dtype)) return unsupported_dtype(node, x->dtype);
    if (x->rank < 2)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "input has rank %d, expected at least 2 (N x C x ...)", x->rank);
    return KILN_OK;
}

static kiln_status batchnorm_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    kiln_dtype dt = x->dtype;
    kiln_status cst = check_nc_input(node, x);
    if (cst != KILN_OK) return cst;
    double eps = kiln_attr_float(node, "epsilon", 1e-5f);
    double momentum = kiln_attr_float(node, "momentum", 0.9f);
    /* training: training_mode from opset 14, the optional outputs before */
    bool training = node->opset >= 14 ? kiln_attr_int(node, "training_mode", 0) != 0
                                      : ctx->n_out > 1;
    /* spatial = 0 (before opset 9): one statistic per element of a sample */
    bool per_element = node->opset < 9 && kiln_attr_int(node, "spatial", 1) == 0;
    int64_t n = x->dims[0];
    int64_t ch = per_element ? dims_product(x->dims, 1, x->rank) : x->dims[1];
    int64_t sp = per_element ? 1 : dims_product(x->dims, 2, x->rank);
    static const char *const names[] = {"scale", "B", "input_mean", "input_var"};
    for (int k = 1; k < 5; k++) {
        kiln_status st = check_count(node, ctx->in[k], names[k - 1], ch);
        if (st != KILN_OK) return st;
    }
    const kiln_tensor *scale = ctx->in[1], *bias = ctx->in[2], *mean = ctx->in[3],
                      *var = ctx->in[4];
    for (int64_t c = 0; c < ch; c++) {
        double m = kiln_tensor_f64(mean, c), v = kiln_tensor_f64(var, c);
        if (training) {
            /* batch statistics over N and the spatial dims (population variance) */
            double sum = 0.0, sq = 0.0;
            int64_t cnt = n * sp;
            for (int64_t b = 0; b < n; b++)
                for (int64_t s = 0; s < sp; s++)
                    sum += kiln_get_f64(dt, x->data, (b * ch + c) * sp + s);
            double bm = cnt > 0 ? sum / (double)cnt : 0.0;
            for (int64_t b = 0; b < n; b++)
                for (int64_t s = 0; s < sp; s++) {
                    double d = kiln_get_f64(dt, x->data, (b * ch + c) * sp + s) - bm;
                    sq += d * d;
                }
            double bv = cnt > 0 ? sq / (double)cnt : 0.0;
            if (ctx->n_out > 1 && ctx->out[1])
                kiln_set_f64(ctx->out[1]->dtype, ctx->out[1]->data, c,
                             m * momentum + bm * (1.0 - momentum));
            if (ctx->n_out > 2 && ctx->out[2])
                kiln_set_f64(ctx->out[2]->dtype, ctx->out[2]->data, c,
                             v * momentum + bv * (1.0 - momentum));
            m = bm;
            v = bv;
        }
        /* y = x * a + b with a = scale / sqrt(var + eps), b = B - mean * a */
        double a = kiln_tensor_f64(scale, c) / sqrt(v + eps);
        double b0 = kiln_tensor_f64(bias, c) - m * a;
        for (int64_t b = 0; b < n; b++) {
            int64_t base = (b * ch + c) * sp;
            if (dt == KILN_DTYPE_F32) {
                const float *xs = (const float *)x->data + base;
                float *ys = (float *)y->data + base;
                for (int64_t s = 0; s < sp; s++) ys[s] = (float)(xs[s] * a + b0);
            } else {
                for (int64_t s = 0; s < sp; s++)
                    kiln_set_f64(dt, y->data, base + s,
                                 kiln_get_f64(dt, x->data, base + s) * a + b0);
            }
        }
    }
    return KILN_OK;
}

KILN_REF_OP(BatchNormalization, batchnorm_infer, batchnorm_run);

/* ---- InstanceNormalization, GroupNormalization ---- */

/* Normalize count contiguous elements at x[base..] to zero mean and unit
 * variance (population, plus eps); element j is then scaled by
 * kiln_tensor_f64(scale, ci) and shifted by bias, where ci = c0 + j / per_c. */
static void normalize_block(kiln_dtype dt, const void *x, void *y, int64_t base, int64_t count,
                            double eps, const kiln_tensor *scale, const kiln_tensor *bias,
                            int64_t c0, int64_t per_c)
{
    double sum = 0.0, sq = 0.0;
    for (int64_t j = 0; j < count; j++) sum += kiln_get_f64(dt, x, base + j);
    double mean = count > 0 ? sum / (double)count : 0.0;
    for (int64_t j = 0; j < count; j++) {
        double d = kiln_get_f64(dt, x, base + j) - mean;
        sq += d * d;
    }
    double inv = 1.0 / sqrt((count > 0 ? sq / (double)count : 0.0) + eps);
    for (int64_t j = 0; j < count; j++) {
        int64_t ci = c0 + (per_c > 0 ? j / per_c : 0);
        double v = (kiln_get_f64(dt, x, base + j) - mean) * inv;
        kiln_set_f64(dt, y, base + j, v * kiln_tensor_f64(scale, ci) + kiln_tensor_f64(bias, ci));
    }
}

/* Normalize each (sample, channel) over its spatial dims. */
static kiln_status instancenorm_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_dtype dt = x->dtype;
    kiln_status cst = check_nc_input(node, x);
    if (cst != KILN_OK) return cst;
    int64_t ch = x->dims[1], sp = dims_product(x->dims, 2, x->rank);
    kiln_status st = check_count(node, ctx->in[1], "scale", ch);
    if (st == KILN_OK) st = check_count(node, ctx->in[2], "B", ch);
    if (st != KILN_OK) return st;
    double eps = kiln_attr_float(node, "epsilon", 1e-5f);
    for (int64_t b = 0; b < x->dims[0]; b++)
        for (int64_t c = 0; c < ch; c++)
            normalize_block(dt, x->data, ctx->out[0]->data, (b * ch + c) * sp, sp, eps,
                            ctx->in[1], ctx->in[2], c, 0);
    return KILN_OK;
}

KILN_REF_OP(InstanceNormalization, kiln_infer_same, instancenorm_run);

/* Scale and bias are per group before opset 21 and per channel from 21. */
static kiln_status groupnorm_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_dtype dt = x->dtype;
    kiln_status cst = check_nc_input(node, x);
    if (cst != KILN_OK) return cst;
    if (!kiln_node_attr(node, "num_groups"))
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "attribute num_groups is missing");
    int64_t groups = kiln_attr_int(node, "num_groups", 0);
    int64_t ch = x->dims[1], sp = dims_product(x->dims, 2, x->rank);
    if (groups <= 0 || ch % groups != 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "num_groups = %lld does not divide the %lld channels",
                               (long long)groups, (long long)ch);
    int64_t cpg = ch / groups;
    bool per_group = node->opset < 21;
    int64_t want = per_group ? groups : ch;
    kiln_status st = check_count(node, ctx->in[1], "scale", want);
    if (st == KILN_OK) st = check_count(node, ctx->in[2], "bias", want);
    if (st != KILN_OK) return st;
    double eps = kiln_attr_float(node, "epsilon", 1e-5f);
    for (int64_t b = 0; b < x->dims[0]; b++)
        for (int64_t g = 0; g < groups; g++)
            normalize_block(dt, x->data, ctx->out[0]->data, (b * ch + g * cpg) * sp, cpg * sp,
                            eps, ctx->in[1], ctx->in[2], per_group ? g : g * cpg,
                            per_group ? 0 : sp);
    return KILN_OK;
}

KILN_REF_OP(GroupNormalization, kiln_infer_same, groupnorm_run);

/* ---- LayerNormalization, RMSNormalization ---- */

/* The dtype named by a stash_type attribute (an ONNX TensorProto type). */
static bool stash_dtype(int64_t stash, kiln_dtype *dt)
{
    switch (stash) {
    case 1: *dt = KILN_DTYPE_F32; return true;
    case 10: *dt = KILN_DTYPE_F16; return true;
    case 11: *dt = KILN_DTYPE_F64; return true;
    case 16: *dt = KILN_DTYPE_BF16; return true;
    default: return false;
    }
}

/* Y like X; Mean and InvStdDev of the stash type, shaped X[:axis] + [1...]. */
static kiln_status layernorm_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (ctx->out[0] && x) *ctx->out[0] = *x;
    if (ctx->n_out < 2) return KILN_OK;
    kiln_dtype sdt;
    int64_t stash = kiln_attr_int(ctx->node, "stash_type", 1);
    if (!stash_dtype(stash, &sdt))
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "stash_type %lld is not supported",
                               (long long)stash);
    struct kiln_type t;
    kiln_type_unknown(&t);
    t.dtype = sdt;
    if (x && x->rank >= 0) {
        int axis;
        kiln_status st =
            kiln_norm_axis(ctx->node, kiln_attr_int(ctx->node, "axis", -1), x->rank, &axis);
        if (st != KILN_OK) return st;
        t.rank = x->rank;
        for (int d = 0; d < x->rank; d++) {
            t.dims[d] = d < axis ? x->dims[d] : 1;
            t.sym[d] = d < axis ? x->sym[d] : NULL;
        }
    }
    for (int k = 1; k < ctx->n_out && k < 3; k++)
        if (ctx->out[k]) *ctx->out[k] = t;
    return KILN_OK;
}

/* Whether p (broadcast against x) is laid out like x's trailing dims from
 * axis on: then the element for x's inner index j is p[j]. */
static bool trails_from(const kiln_tensor *p, const kiln_tensor *x, int axis)
{
    if (p->rank > x->rank) return false;
    for (int d = 0; d < p->rank; d++) {
        int xd = d + x->rank - p->rank;
        int64_t want = xd < axis ? 1 : x->dims[xd];
        if (p->dims[d] != want) return false;
    }
    return true;
}

/* Float32 layer / RMS normalization of rows of length inner; scale and
 * bias (may be NULL) are indexed by position in the row. */
static void rownorm_f32(const float *x, float *y, int64_t rows, int64_t inner, double eps,
                        bool rms, const float *scale, const float *bias, const kiln_tensor *mo,
                        const kiln_tensor *io)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * inner;
        float *yr = y + r * inner;
        double mean = 0.0, sq = 0.0;
        if (!rms) {
            for (int64_t j = 0; j < inner; j++) mean += xr[j];
            mean /= (double)inner;
        }
        for (int64_t j = 0; j < inner; j++) {
            double d = xr[j] - mean;
            sq += d * d;
        }
        double inv = 1.0 / sqrt(sq / (double)inner + eps);
        for (int64_t j = 0; j < inner; j++) {
            double v = (xr[j] - mean) * inv * scale[j];
            yr[j] = (float)(bias ? v + bias[j] : v);
        }
        if (mo) kiln_set_f64(mo->dtype, mo->data, r, mean);
        if (io) kiln_set_f64(io->dtype, io->data, r, inv);
    }
}

/* LayerNormalization (rms = false) or RMSNormalization (rms = true):
 * normalize over dims [axis, rank), then scale (and shift), with scale and
 * bias broadcast against x. */
static kiln_status rownorm_run(struct kiln_run_ctx *ctx, bool rms)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    const kiln_tensor *scale = ctx->in[1];
    const kiln_tensor *bias = !rms && ctx->n_in > 2 ? ctx->in[2] : NULL;
    kiln_tensor *y = ctx->out[0];
    kiln_tensor *mo = !rms && ctx->n_out > 1 ? ctx->out[1] : NULL;
    kiln_tensor *io = !rms && ctx->n_out > 2 ? ctx->out[2] : NULL;
    kiln_dtype dt = x->dtype;
    if (!kiln_dtype_is_float(dt)) return unsupported_dtype(node, dt);
    if (!scale) return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "input scale is missing");
    if (!kiln_dtype_is_float(scale->dtype) || (bias && !kiln_dtype_is_float(bias->dtype)))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "scale and bias must be floats");
    int axis;
    kiln_status st = kiln_norm_axis(node, kiln_attr_int(node, "axis", -1), x->rank, &axis);
    if (st != KILN_OK) return st;
    double eps = kiln_attr_float(node, "epsilon", 1e-5f);
    int64_t rows = dims_product(x->dims, 0, axis);
    int64_t inner = dims_product(x->dims, axis, x->rank);

    /* scale and bias must broadcast to x's shape */
    const kiln_tensor *params[2] = {scale, bias};
    for (int k = 0; k < 2; k++) {
        const kiln_tensor *p = params[k];
        if (!p) continue;
        int rr;
        int64_t bd[KILN_MAX_RANK];
        bool ok = p->rank <= x->rank &&
                  kiln_shape_broadcast(x->rank, x->dims, p->rank, p->dims, &rr, bd);
        for (int d = 0; ok && d < rr; d++) ok = bd[d] == x->dims[d];
        if (!ok) {
            char ps[96], xs[96];
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "%s of shape %s does not broadcast to the input shape %s",
                                   k == 0 ? "scale" : "bias",
                                   kiln_shape_str(p->rank, p->dims, ps, sizeof ps),
                                   kiln_shape_str(x->rank, x->dims, xs, sizeof xs));
        }
    }

    bool trail = trails_from(scale, x, axis) && (!bias || trails_from(bias, x, axis));
    if (dt == KILN_DTYPE_F32 && scale->dtype == KILN_DTYPE_F32 &&
        (!bias || bias->dtype == KILN_DTYPE_F32) && trail && inner > 0) {
        rownorm_f32(x->data, y->data, rows, inner, eps, rms, scale->data,
                    bias ? bias->data : NULL, mo, io);
        return KILN_OK;
    }

    /* generic: walk x in order with scale and bias offsets alongside */
    struct kiln_bcast_iter it;
    const kiln_tensor *ins[2] = {scale, bias};
    kiln_bcast_iter_init(&it, x, bias ? 2 : 1, ins);
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = r * inner;
        double mean = 0.0, sq = 0.0;
        if (!rms) {
            for (int64_t j = 0; j < inner; j++) mean += kiln_get_f64(dt, x->data, base + j);
            mean /= (double)inner;
        }
        for (int64_t j = 0; j < inner; j++) {
            double d = kiln_get_f64(dt, x->data, base + j) - mean;
            sq += d * d;
        }
        double inv = 1.0 / sqrt(sq / (double)inner + eps);
        for (int64_t j = 0; j < inner; j++) {
            double v = (kiln_get_f64(dt, x->data, base + j) - mean) * inv *
                       kiln_get_f64(scale->dtype, scale->data, it.off[0]);
            if (bias) v += kiln_get_f64(bias->dtype, bias->data, it.off[1]);
            kiln_set_f64(dt, y->data, base + j, v);
            kiln_bcast_iter_next(&it);
        }
        if (mo) kiln_set_f64(mo->dtype, mo->data, r, mean);
        if (io) kiln_set_f64(io->dtype, io->data, r, inv);
    }
    return KILN_OK;
}

static kiln_status layernorm_run(struct kiln_run_ctx *ctx) { return rownorm_run(ctx, false); }
static kiln_status rmsnorm_run(struct kiln_run_ctx *ctx) { return rownorm_run(ctx, true); }

KILN_REF_OP(LayerNormalization, layernorm_infer, layernorm_run);
KILN_REF_OP(RMSNormalization, kiln_infer_same, rmsnorm_run);

/* ---- LpNormalization ---- */

/* x divided by its L1 or L2 norm along axis; a zero norm gives zeros. */
static kiln_status lpnorm_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_dtype dt = x->dtype;
    if (!kiln_dtype_is_float(dt)) return unsupported_dtype(node, dt);
    int64_t p = kiln_attr_int(node, "p", 2);
    if (p != 1 && p != 2)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "p = %lld, expected 1 or 2",
                               (long long)p);
    int64_t outer = 1, n = 1, inner = 1;
    if (x->rank > 0) {
        int axis;
        kiln_status st = kiln_norm_axis(node, kiln_attr_int(node, "axis", -1), x->rank, &axis);
        if (st != KILN_OK) return st;
        outer = dims_product(x->dims, 0, axis);
        n = x->dims[axis];
        inner = dims_product(x->dims, axis + 1, x->rank);
    }
    void *y = ctx->out[0]->data;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * n * inner + i;
            double norm = 0.0;
            for (int64_t k = 0; k < n; k++) {
                double v = kiln_get_f64(dt, x->data, base + k * inner);
                norm += p == 1 ? fabs(v) : v * v;
            }
            if (p == 2) norm = sqrt(norm);
            for (int64_t k = 0; k < n; k++) {
                int64_t off = base + k * inner;
                kiln_set_f64(dt, y, off, norm != 0.0 ? kiln_get_f64(dt, x->data, off) / norm : 0.0);
            }
        }
    }
    return KILN_OK;
}

KILN_REF_OP(LpNormalization, kiln_infer_same, lpnorm_run);

/* ---- MeanVarianceNormalization ---- */

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

/* (x - mean) / (std + 1e-9) with mean and population std over "axes"
 * (default [0, 2, 3]). */
static kiln_status mvn_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_dtype dt = x->dtype;
    if (!kiln_dtype_is_float(dt)) return unsupported_dtype(node, dt);
    static const int64_t default_axes[] = {0, 2, 3};
    const int64_t *axes;
    int n_axes = kiln_attr_ints(node, "axes", &axes);
    if (n_axes < 0) {
        axes = default_axes;
        n_axes = 3;
    }
    bool reduced[KILN_MAX_RANK] = {false};
    for (int k = 0; k < n_axes; k++) {
        int a;
        kiln_status st = kiln_norm_axis(node, axes[k], x->rank, &a);
        if (st != KILN_OK) return st;
        reduced[a] = true;
    }
    int64_t strides[KILN_MAX_RANK];
    kiln_shape_strides(x->rank, x->dims, strides);
    struct sub_walk kept = {0}, red = {0};
    for (int d = 0; d < x->rank; d++) {
        struct sub_walk *w = reduced[d] ? &red : &kept;
        w->dims[w->n] = x->dims[d];
        w->strides[w->n] = strides[d];
        w->n++;
    }
    int64_t n_kept = dims_product(kept.dims, 0, kept.n);
    int64_t n_red = dims_product(red.dims, 0, red.n);
    void *y = ctx->out[0]->data;
    sub_walk_start(&kept, 0);
    for (int64_t o = 0; o < n_kept; o++, sub_walk_next(&kept)) {
        double sum = 0.0, sq = 0.0;
        sub_walk_start(&red, kept.off);
        for (int64_t k = 0; k < n_red; k++, sub_walk_next(&red))
            sum += kiln_get_f64(dt, x->data, red.off);
        double mean = n_red > 0 ? sum / (double)n_red : 0.0;
        sub_walk_start(&red, kept.off);
        for (int64_t k = 0; k < n_red; k++, sub_walk_next(&red)) {
            double d = kiln_get_f64(dt, x->data, red.off) - mean;
            sq += d * d;
        }
        double sd = sqrt(n_red > 0 ? sq / (double)n_red : 0.0) + 1e-9;
        sub_walk_start(&red, kept.off);
        for (int64_t k = 0; k < n_red; k++, sub_walk_next(&red))
            kiln_set_f64(dt, y, red.off, (kiln_get_f64(dt, x->data, red.off) - mean) / sd);
    }
    return KILN_OK;
}

KILN_REF_OP(MeanVarianceNormalization, kiln_infer_same, mvn_run);

/* ---- LRN ---- */

/* y = x / (bias + alpha / size * sum of x^2 over a window of channels)^beta. */
static kiln_status lrn_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_dtype dt = x->dtype;
    kiln_status cst = check_nc_input(node, x);
    if (cst != KILN_OK) return cst;
    if (!kiln_node_attr(node, "size"))
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "attribute size is missing");
    int64_t size = kiln_attr_int(node, "size", 0);
    if (size <= 0)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "size = %lld, expected > 0",
                               (long long)size);
    double alpha = kiln_attr_float(node, "alpha", 1e-4f);
    double beta = kiln_attr_float(node, "beta", 0.75f);
    double bias = kiln_attr_float(node, "bias", 1.0f);
    int64_t before = (size - 1) / 2, after = size / 2; /* floor and ceil of (size-1)/2 */
    int64_t ch = x->dims[1], sp = dims_product(x->dims, 2, x->rank);
    void *y = ctx->out[0]->data;
    for (int64_t b = 0; b < x->dims[0]; b++) {
        for (int64_t c = 0; c < ch; c++) {
            int64_t lo = c - before < 0 ? 0 : c - before;
            int64_t hi = c + after >= ch ? ch - 1 : c + after;
            for (int64_t s = 0; s < sp; s++) {
                double sq = 0.0;
                for (int64_t cc = lo; cc <= hi; cc++) {
                    double v = kiln_get_f64(dt, x->data, (b * ch + cc) * sp + s);
                    sq += v * v;
                }
                int64_t off = (b * ch + c) * sp + s;
                kiln_set_f64(dt, y, off,
                             kiln_get_f64(dt, x->data, off) /
                                 pow(bias + alpha / (double)size * sq, beta));
            }
        }
    }
    return KILN_OK;
}

KILN_REF_OP(LRN, kiln_infer_same, lrn_run);
