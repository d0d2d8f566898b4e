/*
 * misc_ops.c - reference kernels for newer ONNX ops that fit no other
 * family: BitCast, TensorScatter, DeformConv, CausalConvWithState and
 * LinearAttention.
 *
 * BitCast reinterprets each element's bits as another type of the same
 * bit width (Kiln keeps 4- and 2-bit types one per byte, so their bits are
 * the low bits of the byte). TensorScatter writes `update` into a copy of
 * `past_cache` along `axis` at each batch row's write index (wrapping with
 * mode "circular"). DeformConv is a 2-D convolution whose kernel taps are
 * moved by per-position offsets and sampled bilinearly (zero outside the
 * image), optionally scaled by a mask. CausalConvWithState is a depthwise
 * causal 1-D convolution that carries its last kernel_size - 1 inputs as
 * state; LinearAttention is the recurrent linear / gated / delta /
 * gated-delta attention of ONNX opset 27, computed step by step in float
 * (as the ONNX reference does) with the state in float32.
 */
#include <stdlib.h>

#include "kernels/kernel.h"

/* ---- BitCast ---- */

/* Bits per element as ONNX counts them (0 for strings). */
static int dtype_bits(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_U4: case KILN_DTYPE_I4: case KILN_DTYPE_F4E2M1: return 4;
    case KILN_DTYPE_U2: case KILN_DTYPE_I2: return 2;
    case KILN_DTYPE_STRING: case KILN_DTYPE_UNDEFINED: return 0;
    default: return (int)kiln_dtype_size(dt) * 8;
    }
}

/* BitCast's target dtype from 'to'. */
static kiln_status bitcast_target(const struct kiln_node *node, kiln_dtype *out)
{
    const struct kiln_attr *a = kiln_node_attr(node, "to");
    if (!a || a->type != KILN_ATTR_INT)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "attribute 'to' is missing");
    *out = kiln_onnx_dtype(a->i);
    if (*out == KILN_DTYPE_UNDEFINED || *out == KILN_DTYPE_STRING)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "'to' is ONNX dtype %lld",
                               (long long)a->i);
    return KILN_OK;
}

static kiln_status bitcast_infer(struct kiln_infer_ctx *ctx)
{
    kiln_dtype to = KILN_DTYPE_UNDEFINED;
    kiln_status st = bitcast_target(ctx->node, &to);
    if (st != KILN_OK) return st;
    const struct kiln_type *x = ctx->in[0];
    if (x && x->dtype != KILN_DTYPE_UNDEFINED && dtype_bits(x->dtype) != dtype_bits(to))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "cannot reinterpret %s (%d bits) as %s (%d bits)",
                               kiln_dtype_name(x->dtype), dtype_bits(x->dtype),
                               kiln_dtype_name(to), dtype_bits(to));
    if (!ctx->out[0]) return KILN_OK;
    if (x) *ctx->out[0] = *x;
    else kiln_type_unknown(ctx->out[0]);
    ctx->out[0]->dtype = to;
    return KILN_OK;
}

static kiln_status bitcast_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    int bits = dtype_bits(x->dtype);
    if (bits == 0 || bits != dtype_bits(y->dtype))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "cannot reinterpret %s as %s", kiln_dtype_name(x->dtype),
                               kiln_dtype_name(y->dtype));
    int64_t n = kiln_tensor_count(x);
    if (bits >= 8) {
        if (n > 0) memcpy(y->data, x->data, (size_t)n * kiln_dtype_size(x->dtype));
        return KILN_OK;
    }
    const uint8_t *src = x->data;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = src[i] & ((1 << bits) - 1);
        if (y->dtype == KILN_DTYPE_F4E2M1) ((uint8_t *)y->data)[i] = (uint8_t)v;
        else kiln_set_i64(y->dtype, y->data, i, v); /* sign-extends int4 / int2 */
    }
    return KILN_OK;
}

KILN_REF_OP(BitCast, bitcast_infer, bitcast_run);

/* ---- TensorScatter ---- */

static kiln_status tensor_scatter_infer(struct kiln_infer_ctx *ctx)
{
    const char *mode = kiln_attr_str(ctx->node, "mode", "linear");
    if (strcmp(mode, "linear") != 0 && strcmp(mode, "circular") != 0)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "mode is '%s', expected 'linear' or 'circular'", mode);
    return kiln_infer_same(ctx);
}

static kiln_status tensor_scatter_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *past = ctx->in[0], *upd = ctx->in[1];
    const kiln_tensor *idx = ctx->n_in > 2 ? ctx->in[2] : NULL;
    kiln_tensor *y = ctx->out[0];
    bool circular = strcmp(kiln_attr_str(node, "mode", "linear"), "circular") == 0;
    char b1[96], b2[96];
    if (upd->dtype != past->dtype)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "update is %s but past_cache is %s",
                               kiln_dtype_name(upd->dtype), kiln_dtype_name(past->dtype));
    if (past->dtype == KILN_DTYPE_STRING)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "string caches are not supported");
    int r = past->rank, axis;
    if (r < 2)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "past_cache has rank %d", r);
    kiln_status st = kiln_norm_axis(node, kiln_attr_int(node, "axis", -2), r, &axis);
    if (st != KILN_OK) return st;
    if (axis == 0)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "axis must not be the batch axis");
    bool ok = upd->rank == r;
    for (int d = 0; ok && d < r; d++)
        ok = d == axis ? upd->dims[d] <= past->dims[d] : upd->dims[d] == past->dims[d];
    if (!ok)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "update shape %s does not fit past_cache %s on axis %d",
                               kiln_shape_str(upd->rank, upd->dims, b1, sizeof b1),
                               kiln_shape_str(r, past->dims, b2, sizeof b2), axis);
    int64_t batch = past->dims[0];
    if (idx && (!kiln_dtype_is_int(idx->dtype) || kiln_tensor_count(idx) != batch))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "write_indices must hold %lld integers", (long long)batch);
    size_t es = kiln_dtype_size(past->dtype);
    int64_t n = kiln_tensor_count(past);
    if (n > 0) memcpy(y->data, past->data, (size_t)n * es);
    int64_t max_seq = past->dims[axis], seq = upd->dims[axis];
    int64_t mid = kiln_shape_count(axis - 1, past->dims + 1);     /* dims between batch and axis */
    int64_t inner = kiln_shape_count(r - axis - 1, past->dims + axis + 1);
    for (int64_t b = 0; b < batch; b++) {
        int64_t w = idx ? kiln_get_i64(idx->dtype, idx->data, b) : 0;
        for (int64_t s = 0; s < seq; s++) {
            int64_t pos = w + s;
            if (circular) pos = ((pos % max_seq) + max_seq) % max_seq;
            if (pos < 0 || pos >= max_seq)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "write index %lld + %lld is outside the cache of %lld "
                                       "(batch %lld)",
                                       (long long)w, (long long)s, (long long)max_seq,
                                       (long long)b);
            for (int64_t m = 0; m < mid; m++) {
                int64_t dst = ((b * mid + m) * max_seq + pos) * inner;
                int64_t src = ((b * mid + m) * seq + s) * inner;
                memcpy((char *)y->data + (size_t)dst * es, (const char *)upd->data + (size_t)src * es,
                       (size_t)inner * es);
            }
        }
    }
    return KILN_OK;
}

KILN_REF_OP(TensorScatter, tensor_scatter_infer, tensor_scatter_run);

/* ---- DeformConv ---- */

/* DeformConv's 2-D geometry from attributes and the X / W shapes. */
struct deform_geom {
    int64_t n, ic, ih, iw, oc, kh, kw, oh, ow;
    int64_t group, offset_group;
    int64_t pads[4], strides[2], dil[2];
};

/* Read attributes; x / w dims may be -1 (unknown) at load, then oh / ow are -1. */
static kiln_status deform_geom(const struct kiln_node *node, const int64_t *xd, const int64_t *wd,
                               struct deform_geom *g)
{
    const int64_t *v;
    g->n = xd[0];
    g->ic = xd[1];
    g->ih = xd[2];
    g->iw = xd[3];
    g->oc = wd[0];
    g->group = kiln_attr_int(node, "group", 1);
    g->offset_group = kiln_attr_int(node, "offset_group", 1);
    if (g->group <= 0 || g->offset_group <= 0)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "group %lld, offset_group %lld",
                               (long long)g->group, (long long)g->offset_group);
    int nk = kiln_attr_ints(node, "kernel_shape", &v);
    if (nk >= 0 && nk != 2)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "kernel_shape has %d values", nk);
    g->kh = nk == 2 ? v[0] : wd[2];
    g->kw = nk == 2 ? v[1] : wd[3];
    int np = kiln_attr_ints(node, "pads", &v);
    if (np >= 0 && np != 4)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "pads has %d values", np);
    for (int i = 0; i < 4; i++) g->pads[i] = np == 4 ? v[i] : 0;
    int ns = kiln_attr_ints(node, "strides", &v);
    if (ns >= 0 && ns != 2)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "strides has %d values", ns);
    for (int i = 0; i < 2; i++) g->strides[i] = ns == 2 ? v[i] : 1;
    int nd = kiln_attr_ints(node, "dilations", &v);
    if (nd >= 0 && nd != 2)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "dilations has %d values", nd);
    for (int i = 0; i < 2; i++) g->dil[i] = nd == 2 ? v[i] : 1;
    for (int i = 0; i < 2; i++)
        if (g->strides[i] <= 0 || g->dil[i] <= 0)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "strides and dilations must be positive");
    /* output size, -1 while unknown, 0 when the kernel does not fit */
    g->oh = g->ow = -1;
    if (g->ih >= 0 && g->kh >= 0) {
        int64_t span = g->ih + g->pads[0] + g->pads[2] - ((g->kh - 1) * g->dil[0] + 1);
        g->oh = span < 0 ? 0 : span / g->strides[0] + 1;
    }
    if (g->iw >= 0 && g->kw >= 0) {
        int64_t span = g->iw + g->pads[1] + g->pads[3] - ((g->kw - 1) * g->dil[1] + 1);
        g->ow = span < 0 ? 0 : span / g->strides[1] + 1;
    }
    return KILN_OK;
}

static kiln_status deform_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0], *w = ctx->in[1];
    if (!ctx->out[0]) return KILN_OK;
    kiln_type_unknown(ctx->out[0]);
    if (!x) return KILN_OK;
    ctx->out[0]->dtype = x->dtype;
    if (x->rank < 0 || !w || w->rank < 0) return KILN_OK;
    if (x->rank != 4 || w->rank != 4)
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED,
                               "only 2-D DeformConv is supported (X rank %d, W rank %d)", x->rank,
                               w->rank);
    struct deform_geom g;
    kiln_status st = deform_geom(ctx->node, x->dims, w->dims, &g);
    if (st != KILN_OK) return st;
    if (g.oh == 0 || g.ow == 0)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "kernel, pads, strides and dilations leave no output positions");
    int64_t dims[4] = {g.n, g.oc, g.oh, g.ow};
    kiln_type_set(ctx->out[0], x->dtype, 4, dims);
    return KILN_OK;
}

/* Bilinear sample of plane img (h x w) at (y, x); zero outside. */
static double bilinear(const kiln_tensor *t, int64_t base, int64_t h, int64_t w, double y, double x)
{
    if (!isfinite(y) || !isfinite(x)) return 0; /* nothing to sample (NaN offsets) */
    double y0 = floor(y), x0 = floor(x);
    double fy = y - y0, fx = x - x0;
    double v = 0;
    for (int dy = 0; dy < 2; dy++) {
        for (int dx = 0; dx < 2; dx++) {
            double yy = y0 + dy, xx = x0 + dx;
            if (yy < 0 || yy >= (double)h || xx < 0 || xx >= (double)w) continue;
            double wt = (dy ? fy : 1 - fy) * (dx ? fx : 1 - fx);
            if (wt == 0) continue;
            v += wt * kiln_get_f64(t->dtype, t->data, base + (int64_t)yy * w + (int64_t)xx);
        }
    }
    return v;
}

static kiln_status deform_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0], *w = ctx->in[1], *off = ctx->in[2];
    const kiln_tensor *b = ctx->n_in > 3 ? ctx->in[3] : NULL;
    const kiln_tensor *mask = ctx->n_in > 4 ? ctx->in[4] : NULL;
    kiln_tensor *y = ctx->out[0];
    char b1[96];
    if (!kiln_dtype_is_float(x->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "dtype %s is not supported",
                               kiln_dtype_name(x->dtype));
    if (x->rank != 4 || w->rank != 4)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "only 2-D DeformConv is supported");
    struct deform_geom g;
    kiln_status st = deform_geom(node, x->dims, w->dims, &g);
    if (st != KILN_OK) return st;
    if (g.ic != w->dims[1] * g.group || g.oc % g.group != 0 || g.ic % g.offset_group != 0 ||
        g.kh != w->dims[2] || g.kw != w->dims[3])
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "W %s does not fit %lld input channels, group %lld, "
                               "offset_group %lld",
                               kiln_shape_str(w->rank, w->dims, b1, sizeof b1), (long long)g.ic,
                               (long long)g.group, (long long)g.offset_group);
    int64_t taps = g.kh * g.kw;
    int64_t od[4] = {g.n, g.offset_group * taps * 2, g.oh, g.ow};
    int64_t md[4] = {g.n, g.offset_group * taps, g.oh, g.ow};
    if (off->rank != 4 || memcmp(off->dims, od, sizeof od) != 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "offset has shape %s, expected %s",
                               kiln_shape_str(off->rank, off->dims, b1, sizeof b1),
                               kiln_shape_str(4, od, b1 + 48, sizeof b1 - 48));
    if (mask && (mask->rank != 4 || memcmp(mask->dims, md, sizeof md) != 0))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "mask has shape %s",
                               kiln_shape_str(mask->rank, mask->dims, b1, sizeof b1));
    if (b && kiln_tensor_count(b) != g.oc)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "B must hold %lld values",
                               (long long)g.oc);
    int64_t icg = g.ic / g.group, ocg = g.oc / g.group, ico = g.ic / g.offset_group;
    int64_t plane = g.oh * g.ow;
    for (int64_t n = 0; n < g.n; n++) {
        for (int64_t o = 0; o < g.oc; o++) {
            for (int64_t i = 0; i < g.oh; i++) {
                for (int64_t j = 0; j < g.ow; j++) {
                    double acc = b ? kiln_get_f64(b->dtype, b->data, o) : 0.0;
                    int64_t grp = o / ocg;
                    for (int64_t cg = 0; cg < icg; cg++) {
                        int64_t c = grp * icg + cg, og = c / ico;
                        for (int64_t ki = 0; ki < g.kh; ki++) {
                            for (int64_t kj = 0; kj < g.kw; kj++) {
                                int64_t tap = ki * g.kw + kj;
                                int64_t oc_h = ((n * g.offset_group + og) * taps + tap) * 2;
                                double dy = kiln_get_f64(off->dtype, off->data,
                                                         oc_h * plane + i * g.ow + j);
                                double dx = kiln_get_f64(off->dtype, off->data,
                                                         (oc_h + 1) * plane + i * g.ow + j);
                                double py = (double)(i * g.strides[0] - g.pads[0] +
                                                     ki * g.dil[0]) + dy;
                                double px = (double)(j * g.strides[1] - g.pads[1] +
                                                     kj * g.dil[1]) + dx;
                                double v = bilinear(x, (n * g.ic + c) * g.ih * g.iw, g.ih, g.iw,
                                                    py, px);
                                if (mask)
                                    v *= kiln_get_f64(mask->dtype, mask->data,
                                                      ((n * g.offset_group + og) * taps + tap) *
                                                              plane + i * g.ow + j);
                                acc += v * kiln_get_f64(w->dtype, w->data,
                                                        ((o * icg + cg) * g.kh + ki) * g.kw + kj);
                            }
                        }
                    }
                    kiln_set_f64(y->dtype, y->data, ((n * g.oc + o) * g.oh + i) * g.ow + j, acc);
                }
            }
        }
    }
    return KILN_OK;
}

KILN_REF_OP(DeformConv, deform_infer, deform_run);

/* ---- CausalConvWithState ---- */

/* 0 none, 1 silu (alias swish). */
static kiln_status causal_activation(const struct kiln_node *node, int *out)
{
    const char *a = kiln_attr_str(node, "activation", "none");
    if (strcmp(a, "none") == 0) *out = 0;
    else if (strcmp(a, "silu") == 0 || strcmp(a, "swish") == 0) *out = 1;
    else
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "activation is '%s', expected none, silu or swish", a);
    return KILN_OK;
}

static kiln_status causal_conv_infer(struct kiln_infer_ctx *ctx)
{
    int act;
    kiln_status st = causal_activation(ctx->node, &act);
    if (st != KILN_OK) return st;
    const struct kiln_type *x = ctx->in[0], *w = ctx->in[1];
    if (x && x->rank >= 0 && x->rank != 3)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "input has rank %d, expected (batch, channels, length)", x->rank);
    if (w && w->rank >= 0 && w->rank != 3)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "weight has rank %d, expected (channels, 1, k)", w->rank);
    if (ctx->out[0]) {
        if (x) *ctx->out[0] = *x;
        else kiln_type_unknown(ctx->out[0]);
    }
    if (ctx->n_out > 1 && ctx->out[1]) {
        kiln_type_unknown(ctx->out[1]);
        if (x) {
            int64_t dims[3] = {-1, -1, -1};
            if (x->rank == 3) {
                dims[0] = x->dims[0];
                dims[1] = x->dims[1];
            }
            if (w && w->rank == 3 && w->dims[2] >= 0) dims[2] = w->dims[2] - 1;
            kiln_type_set(ctx->out[1], x->dtype, 3, dims);
        }
    }
    return KILN_OK;
}

static kiln_status causal_conv_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0], *w = ctx->in[1];
    const kiln_tensor *bias = ctx->n_in > 2 ? ctx->in[2] : NULL;
    const kiln_tensor *past = ctx->n_in > 3 ? ctx->in[3] : NULL;
    kiln_tensor *y = ctx->out[0], *present = ctx->n_out > 1 ? ctx->out[1] : NULL;
    char b1[96];
    int act = 0;
    kiln_status st = causal_activation(node, &act);
    if (st != KILN_OK) return st;
    if (!kiln_dtype_is_float(x->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "dtype %s is not supported",
                               kiln_dtype_name(x->dtype));
    int64_t nb = x->dims[0], c = x->dims[1], len = x->dims[2], k = w->dims[2];
    if (w->dims[0] != c || w->dims[1] != 1 || k < 1)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "weight has shape %s, expected [%lld, 1, k]",
                               kiln_shape_str(w->rank, w->dims, b1, sizeof b1), (long long)c);
    if (bias && kiln_tensor_count(bias) != c)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "bias must hold %lld values",
                               (long long)c);
    int64_t pd[3] = {nb, c, k - 1};
    if (past && (past->rank != 3 || memcmp(past->dims, pd, sizeof pd) != 0))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "past_state has shape %s, expected %s",
                               kiln_shape_str(past->rank, past->dims, b1, sizeof b1),
                               kiln_shape_str(3, pd, b1 + 48, sizeof b1 - 48));
    int64_t plen = len + k - 1;
    double *pad = malloc(sizeof(double) * (size_t)(plen > 0 ? plen : 1));
    if (!pad) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "CausalConvWithState scratch");
    for (int64_t b = 0; b < nb; b++) {
        for (int64_t ch = 0; ch < c; ch++) {
            /* the padded row: past state (or zeros), then the input */
            for (int64_t t = 0; t < k - 1; t++)
                pad[t] = past ? kiln_get_f64(past->dtype, past->data, (b * c + ch) * (k - 1) + t) : 0;
            for (int64_t t = 0; t < len; t++)
                pad[k - 1 + t] = kiln_get_f64(x->dtype, x->data, (b * c + ch) * len + t);
            for (int64_t t = 0; t < len; t++) {
                double acc = bias ? kiln_get_f64(bias->dtype, bias->data, ch) : 0.0;
                for (int64_t j = 0; j < k; j++)
                    acc += kiln_get_f64(w->dtype, w->data, ch * k + j) * pad[t + j];
                int64_t e = (b * c + ch) * len + t;
                kiln_set_f64(y->dtype, y->data, e, acc);
                if (act == 1) { /* silu of the value rounded to the output type */
                    double v = kiln_get_f64(y->dtype, y->data, e);
                    kiln_set_f64(y->dtype, y->data, e, v / (1.0 + exp(-v)));
                }
            }
            if (present)
                for (int64_t t = 0; t < k - 1; t++)
                    kiln_set_f64(present->dtype, present->data, (b * c + ch) * (k - 1) + t,
                                 pad[len + t]);
        }
    }
    free(pad);
    return KILN_OK;
}

KILN_REF_OP(CausalConvWithState, causal_conv_infer, causal_conv_run);

/* ---- LinearAttention ---- */

/* LinearAttention's sizes and options, from attributes and input shapes. */
struct lin_attn {
    int64_t b, t, hq, hkv, dk, dv, group;
    bool gating, delta;
    float scale;
    int64_t decay_last, beta_last;
};

/* Check the inputs' shapes against the attributes; fill a. */
static kiln_status lin_attn_check(const struct kiln_node *node, const kiln_tensor *const *in,
                                  int n_in, struct lin_attn *a)
{
    char b1[96];
    const kiln_tensor *q = in[0], *k = in[1], *v = in[2];
    const kiln_tensor *past = n_in > 3 ? in[3] : NULL, *decay = n_in > 4 ? in[4] : NULL;
    const kiln_tensor *beta = n_in > 5 ? in[5] : NULL, *erase = n_in > 6 ? in[6] : NULL;
    const char *rule = kiln_attr_str(node, "update_rule", "gated_delta");
    if (strcmp(rule, "linear") == 0) a->gating = a->delta = false;
    else if (strcmp(rule, "gated") == 0) a->gating = true, a->delta = false;
    else if (strcmp(rule, "delta") == 0) a->gating = false, a->delta = true;
    else if (strcmp(rule, "gated_delta") == 0) a->gating = a->delta = true;
    else
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "update_rule is '%s', expected linear, gated, delta or gated_delta",
                               rule);
    a->hq = kiln_attr_int(node, "q_num_heads", 0);
    a->hkv = kiln_attr_int(node, "kv_num_heads", 0);
    if (a->hq <= 0 || a->hkv <= 0 || a->hq % a->hkv != 0)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "q_num_heads %lld must be a positive multiple of kv_num_heads %lld",
                               (long long)a->hq, (long long)a->hkv);
    if ((a->gating != (decay != NULL)) || (a->delta != (beta != NULL)) || (erase && !a->delta))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "update_rule '%s' %s decay, %s beta%s", rule,
                               a->gating ? "needs" : "takes no", a->delta ? "needs" : "takes no",
                               a->delta ? "" : " and no erase_gate");
    if (q->rank != 3 || k->rank != 3 || v->rank != 3)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "query, key and value must be rank 3 (B, T, H*D)");
    a->b = q->dims[0];
    a->t = q->dims[1];
    a->group = a->hq / a->hkv;
    if (q->dims[2] % a->hq != 0 || v->dims[2] % a->hkv != 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "query / value last dims are not divisible by the head counts");
    a->dk = q->dims[2] / a->hq;
    a->dv = v->dims[2] / a->hkv;
    int64_t kd[3] = {a->b, a->t, a->hkv * a->dk}, vd[3] = {a->b, a->t, a->hkv * a->dv};
    if (memcmp(k->dims, kd, sizeof kd) != 0 || memcmp(v->dims, vd, sizeof vd) != 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "key must be %s and value [B, T, kv_num_heads * d_v]",
                               kiln_shape_str(3, kd, b1, sizeof b1));
    int64_t sd[4] = {a->b, a->hkv, a->dk, a->dv};
    if (past && (past->rank != 4 || memcmp(past->dims, sd, sizeof sd) != 0))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "past_state must be %s",
                               kiln_shape_str(4, sd, b1, sizeof b1));
    a->decay_last = a->beta_last = 0;
    if (decay) {
        a->decay_last = decay->rank == 3 ? decay->dims[2] : -1;
        if (decay->rank != 3 || decay->dims[0] != a->b || decay->dims[1] != a->t ||
            (a->decay_last != a->hkv && a->decay_last != a->hkv * a->dk))
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "decay must be [B, T, kv_num_heads (* d_k)]");
    }
    if (beta) {
        a->beta_last = beta->rank == 3 ? beta->dims[2] : -1;
        if (beta->rank != 3 || beta->dims[0] != a->b || beta->dims[1] != a->t ||
            (a->beta_last != a->hkv && a->beta_last != 1))
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "beta must be [B, T, kv_num_heads or 1]");
    }
    if (erase && (erase->rank != 3 || memcmp(erase->dims, kd, sizeof kd) != 0))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "erase_gate must be %s",
                               kiln_shape_str(3, kd, b1, sizeof b1));
    float s = kiln_attr_float(node, "scale", 0.0f);
    a->scale = s == 0.0f ? (float)(1.0 / sqrt((double)a->dk)) : s;
    return KILN_OK;
}

static kiln_status lin_attn_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *q = ctx->in[0], *v = ctx->in[2];
    const struct kiln_type *past = ctx->n_in > 3 ? ctx->in[3] : NULL;
    int64_t hq = kiln_attr_int(ctx->node, "q_num_heads", 0);
    int64_t hkv = kiln_attr_int(ctx->node, "kv_num_heads", 0);
    if (hq <= 0 || hkv <= 0 || hq % hkv != 0)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "q_num_heads %lld must be a positive multiple of kv_num_heads %lld",
                               (long long)hq, (long long)hkv);
    bool qk = q && q->rank == 3, vk = v && v->rank == 3;
    int64_t dv = vk && v->dims[2] >= 0 ? v->dims[2] / hkv : -1;
    int64_t dk = qk && q->dims[2] >= 0 ? q->dims[2] / hq : -1;
    if (ctx->out[0]) {
        int64_t dims[3] = {qk ? q->dims[0] : -1, qk ? q->dims[1] : -1, dv >= 0 ? hq * dv : -1};
        kiln_type_set(ctx->out[0], q ? q->dtype : KILN_DTYPE_UNDEFINED, 3, dims);
    }
    if (ctx->n_out > 1 && ctx->out[1]) {
        int64_t dims[4] = {qk ? q->dims[0] : -1, hkv, dk, dv};
        kiln_dtype dt = past ? past->dtype : q ? q->dtype : KILN_DTYPE_UNDEFINED;
        kiln_type_set(ctx->out[1], dt, 4, dims);
    }
    return KILN_OK;
}

/* Element (b, t, h, d) of a (B, T, H*D) tensor, as float. */
static float bthd(const kiln_tensor *x, const struct lin_attn *a, int64_t b, int64_t t,
                  int64_t h, int64_t hd, int64_t d)
{
    int64_t last = x->dims[2];
    return (float)kiln_get_f64(x->dtype, x->data, (b * a->t + t) * last + h * hd + d);
}

static kiln_status lin_attn_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    struct lin_attn a = {0};
    kiln_status st = lin_attn_check(node, (const kiln_tensor *const *)ctx->in, ctx->n_in, &a);
    if (st != KILN_OK) return st;
    const kiln_tensor *q = ctx->in[0], *k = ctx->in[1], *v = ctx->in[2];
    const kiln_tensor *past = ctx->n_in > 3 ? ctx->in[3] : NULL;
    const kiln_tensor *decay = ctx->n_in > 4 ? ctx->in[4] : NULL;
    const kiln_tensor *beta = ctx->n_in > 5 ? ctx->in[5] : NULL;
    const kiln_tensor *erase = ctx->n_in > 6 ? ctx->in[6] : NULL;
    kiln_tensor *y = ctx->out[0], *present = ctx->n_out > 1 ? ctx->out[1] : NULL;
    if (!kiln_dtype_is_float(q->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "dtype %s is not supported",
                               kiln_dtype_name(q->dtype));
    int64_t ssize = a.dk * a.dv;
    float *state = malloc(sizeof(float) * (size_t)(ssize > 0 ? ssize : 1));
    float *vt = malloc(sizeof(float) * (size_t)(a.dv > 0 ? a.dv : 1));
    if (!state || !vt) {
        free(state);
        free(vt);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "LinearAttention scratch");
    }
    for (int64_t b = 0; b < a.b; b++) {
        for (int64_t h = 0; h < a.hkv; h++) {
            for (int64_t i = 0; i < ssize; i++)
                state[i] = past ? (float)kiln_get_f64(past->dtype, past->data,
                                                      (b * a.hkv + h) * ssize + i)
                                : 0.0f;
            for (int64_t t = 0; t < a.t; t++) {
                if (a.gating) { /* state *= exp(decay), per head or per key dim */
                    for (int64_t d = 0; d < a.dk; d++) {
                        float g = a.decay_last == a.hkv ? bthd(decay, &a, b, t, h, 1, 0)
                                                        : bthd(decay, &a, b, t, h, a.dk, d);
                        float e = (float)exp((double)g);
                        for (int64_t m = 0; m < a.dv; m++) state[d * a.dv + m] *= e;
                    }
                }
                for (int64_t m = 0; m < a.dv; m++) vt[m] = bthd(v, &a, b, t, h, a.dv, m);
                if (a.delta) { /* v <- beta * (v - S^T k_erase) */
                    float bt = a.beta_last == 1 ? bthd(beta, &a, b, t, 0, 1, 0)
                                                : bthd(beta, &a, b, t, h, 1, 0);
                    for (int64_t m = 0; m < a.dv; m++) {
                        float r = 0;
                        for (int64_t d = 0; d < a.dk; d++) {
                            float kd = bthd(k, &a, b, t, h, a.dk, d);
                            if (erase) kd *= bthd(erase, &a, b, t, h, a.dk, d);
                            r += state[d * a.dv + m] * kd;
                        }
                        vt[m] = bt * (vt[m] - r);
                    }
                }
                for (int64_t d = 0; d < a.dk; d++) { /* S += k v^T */
                    float kd = bthd(k, &a, b, t, h, a.dk, d);
                    for (int64_t m = 0; m < a.dv; m++) state[d * a.dv + m] += kd * vt[m];
                }
                for (int64_t qh = h * a.group; qh < (h + 1) * a.group; qh++) { /* o = scale q S */
                    for (int64_t m = 0; m < a.dv; m++) {
                        float o = 0;
                        for (int64_t d = 0; d < a.dk; d++)
                            o += bthd(q, &a, b, t, qh, a.dk, d) * state[d * a.dv + m];
                        kiln_set_f64(y->dtype, y->data, (b * a.t + t) * a.hq * a.dv + qh * a.dv + m,
                                     (double)(a.scale * o));
                    }
                }
            }
            if (present)
                for (int64_t i = 0; i < ssize; i++)
                    kiln_set_f64(present->dtype, present->data, (b * a.hkv + h) * ssize + i,
                                 state[i]);
        }
    }
    free(state);
    free(vt);
    return KILN_OK;
}

KILN_REF_OP(LinearAttention, lin_attn_infer, lin_attn_run);
