/*
 * resample.c - reference kernels for spatial resampling: Resize, Upsample,
 * GridSample, AffineGrid, and Col2Im (the inverse of an im2col unfold).
 *
 * Resize is separable: for every resized axis we compute, per output
 * coordinate, a small set of (input index, weight) taps, then apply the axes
 * one at a time over a double buffer. The taps follow
 * onnx/reference/ops/op_resize.py: an output coordinate maps to x_original
 * by coordinate_transformation_mode; the taps sit at the n input indices
 * nearest to it (ties toward the smaller index, the edge value repeated
 * outside the input); nearest mode puts all the weight on one tap by
 * nearest_mode; linear and cubic use their kernels, widened and normalized
 * when antialias downsamples; exclude_outside drops taps outside the input
 * and renormalizes; tf_crop_and_resize maps through roi and writes
 * extrapolation_value for coordinates outside the input. Resize-10 and
 * Upsample use the asymmetric mapping and floor (ceil when shrinking) for
 * nearest. Integer outputs are rounded to nearest.
 *
 * GridSample follows onnx/reference/ops/op_grid_sample.py (N-D, nearest /
 * linear / cubic, zeros / border / reflection padding); AffineGrid builds the
 * normalized base grid and applies theta.
 */
#include "kernels/ref/resample.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/kernel.h"

/* ---- Resize / Upsample ---- */

enum rs_mode { RS_NEAREST, RS_LINEAR, RS_CUBIC };
enum rs_coord {
    RS_HALF_PIXEL,
    RS_HALF_PIXEL_SYMMETRIC,
    RS_PYTORCH_HALF_PIXEL,
    RS_ALIGN_CORNERS,
    RS_ASYMMETRIC,
    RS_TF_HALF_PIXEL_FOR_NN,
    RS_TF_CROP_AND_RESIZE,
};
enum rs_nearest { RS_ROUND_PREFER_FLOOR, RS_ROUND_PREFER_CEIL, RS_FLOOR, RS_CEIL, RS_SIMPLE };

/* Attributes of one Resize / Upsample node. */
struct rs_attrs {
    enum rs_mode mode;
    enum rs_coord coord;
    enum rs_nearest nearest;
    double cubic_a;
    bool exclude_outside;
    bool antialias;
    double extrapolation;
    int policy;            /* 0 stretch, 1 not_larger, 2 not_smaller */
    int n_axes;            /* -1: all axes */
    int64_t axes[KILN_MAX_RANK];
};

/* Per-axis resize plan: output size, scale, and the float output size used by the mappings. */
struct rs_plan {
    int rank;
    int64_t in[KILN_MAX_RANK];
    int64_t out[KILN_MAX_RANK];
    double scale[KILN_MAX_RANK];
    double out_f[KILN_MAX_RANK];     /* scale * in (not rounded) */
    bool resized[KILN_MAX_RANK];     /* false: axis not in axes, copied as is */
    double roi_start[KILN_MAX_RANK], roi_end[KILN_MAX_RANK];
};

/* Look a string attribute up in a table of names; -1 if not found. */
static int str_pick(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

/* Parse Resize's (or Upsample's) attributes, with the defaults of the node's opset. */
static kiln_status rs_parse_attrs(const struct kiln_node *n, bool upsample, int rank,
                                  struct rs_attrs *a)
{
    static const char *const modes[] = {"nearest", "linear", "cubic"};
    static const char *const coords[] = {"half_pixel",    "half_pixel_symmetric",
                                         "pytorch_half_pixel", "align_corners",
                                         "asymmetric",    "tf_half_pixel_for_nn",
                                         "tf_crop_and_resize"};
    static const char *const nearests[] = {"round_prefer_floor", "round_prefer_ceil", "floor",
                                           "ceil"};
    static const char *const policies[] = {"stretch", "not_larger", "not_smaller"};
    bool legacy = upsample || n->opset < 11; /* Upsample and Resize-10 */
    memset(a, 0, sizeof *a);

    const char *m = kiln_attr_str(n, "mode", "nearest");
    int v = str_pick(m, modes, 3);
    if (v < 0 && (strcmp(m, "bilinear") == 0 || strcmp(m, "trilinear") == 0)) v = RS_LINEAR;
    if (v < 0 || (legacy && v == RS_CUBIC))
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "mode '%s' is not supported", m);
    a->mode = (enum rs_mode)v;

    if (legacy) {
        a->coord = RS_ASYMMETRIC;
        a->nearest = RS_SIMPLE;
        a->cubic_a = -0.75;
        a->policy = 0;
        a->n_axes = -1;
        return KILN_OK;
    }
    const char *c = kiln_attr_str(n, "coordinate_transformation_mode", "half_pixel");
    v = str_pick(c, coords, 7);
    if (v < 0)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "coordinate_transformation_mode '%s' is not supported", c);
    a->coord = (enum rs_coord)v;
    const char *nm = kiln_attr_str(n, "nearest_mode", "round_prefer_floor");
    v = str_pick(nm, nearests, 4);
    if (v < 0)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "nearest_mode '%s' is not supported",
                               nm);
    a->nearest = (enum rs_nearest)v;
    a->cubic_a = kiln_attr_float(n, "cubic_coeff_a", -0.75f);
    a->exclude_outside = kiln_attr_int(n, "exclude_outside", 0) != 0;
    a->antialias = kiln_attr_int(n, "antialias", 0) != 0;
    a->extrapolation = kiln_attr_float(n, "extrapolation_value", 0.0f);
    const char *p = kiln_attr_str(n, "keep_aspect_ratio_policy", "stretch");
    a->policy = str_pick(p, policies, 3);
    if (a->policy < 0)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "keep_aspect_ratio_policy '%s' is not supported", p);
    const int64_t *axes;
    int na = kiln_attr_ints(n, "axes", &axes);
    a->n_axes = -1;
    if (na >= 0) {
        if (na > rank && rank >= 0)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "axes has %d entries for rank %d",
                                   na, rank);
        if (na > KILN_MAX_RANK)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "axes has %d entries", na);
        a->n_axes = na;
        for (int i = 0; i < na; i++) {
            if (rank < 0) {
                a->axes[i] = axes[i];
                continue;
            }
            int ax;
            kiln_status st = kiln_norm_axis(n, axes[i], rank, &ax);
            if (st != KILN_OK) return st;
            for (int j = 0; j < i; j++)
                if (a->axes[j] == ax)
                    return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "axes repeats axis %d", ax);
            a->axes[i] = ax;
        }
    }
    return KILN_OK;
}

/* Which axis of the input entry i of scales / sizes / roi refers to. */
static int rs_axis_of(const struct rs_attrs *a, int i)
{
    return a->n_axes >= 0 ? (int)a->axes[i] : i;
}

/*
 * Build the plan from the input shape and the scales or sizes values (roi may
 * be NULL). Exactly one of scales / sizes is used: a non-empty scales wins.
 */
static kiln_status rs_make_plan(const struct kiln_node *n, const struct rs_attrs *a, int rank,
                                const int64_t *in_dims, const kiln_tensor *roi,
                                const kiln_tensor *scales, const kiln_tensor *sizes,
                                struct rs_plan *p)
{
    int nax = a->n_axes >= 0 ? a->n_axes : rank;
    memset(p, 0, sizeof *p);
    p->rank = rank;
    for (int d = 0; d < rank; d++) {
        p->in[d] = in_dims[d];
        p->out[d] = in_dims[d];
        p->out_f[d] = (double)in_dims[d];
        p->scale[d] = 1.0;
        p->resized[d] = a->n_axes < 0;
        p->roi_start[d] = 0.0;
        p->roi_end[d] = 1.0;
    }
    for (int i = 0; i < nax; i++) p->resized[rs_axis_of(a, i)] = true;

    if (scales && kiln_shape_count(scales->rank, scales->dims) == 0) scales = NULL;
    if (sizes && kiln_shape_count(sizes->rank, sizes->dims) == 0) sizes = NULL;
    if (!scales && !sizes)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "neither scales nor sizes is given");
    const kiln_tensor *src = scales ? scales : sizes;
    if (src->rank != 1 || src->dims[0] != nax)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "%s has %lld entries, expected %d",
                               scales ? "scales" : "sizes",
                               (long long)(src->rank == 1 ? src->dims[0] : -1), nax);
    if (scales) {
        if (!kiln_dtype_is_float(scales->dtype))
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "scales has dtype %s",
                                   kiln_dtype_name(scales->dtype));
        for (int i = 0; i < nax; i++) {
            int d = rs_axis_of(a, i);
            double s = kiln_tensor_f64(scales, i);
            if (!(s > 0) || !isfinite(s))
                return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                       "scales[%d] = %g is not positive", i, s);
            double o = s * (double)in_dims[d];
            if (o > (double)((int64_t)1 << 40))
                return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                       "scales[%d] = %g makes dim %d too large", i, s, d);
            p->scale[d] = s;
            p->out_f[d] = o;
            p->out[d] = (int64_t)floor(o);
        }
    } else {
        if (!kiln_dtype_is_int(sizes->dtype))
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "sizes has dtype %s",
                                   kiln_dtype_name(sizes->dtype));
        for (int i = 0; i < nax; i++) {
            int d = rs_axis_of(a, i);
            int64_t o = kiln_tensor_i64(sizes, i);
            if (o <= 0 || in_dims[d] <= 0)
                return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                       "sizes[%d] = %lld for an input dim of %lld", i,
                                       (long long)o, (long long)in_dims[d]);
            p->out[d] = o;
            p->out_f[d] = (double)o;
            p->scale[d] = (double)o / (double)in_dims[d];
        }
        if (a->policy != 0) {
            /* one scale for every axis: the smallest (not_larger) or largest (not_smaller) */
            double s = p->scale[rs_axis_of(a, 0)];
            for (int i = 1; i < nax; i++) {
                double si = p->scale[rs_axis_of(a, i)];
                s = a->policy == 1 ? fmin(s, si) : fmax(s, si);
            }
            for (int i = 0; i < nax; i++) {
                int d = rs_axis_of(a, i);
                p->scale[d] = s;
                p->out_f[d] = s * (double)in_dims[d];
                p->out[d] = (int64_t)(p->out_f[d] + 0.5);
            }
        }
    }
    if (roi && a->coord == RS_TF_CROP_AND_RESIZE) {
        int64_t cnt = kiln_shape_count(roi->rank, roi->dims);
        if (cnt != 2 * nax && cnt != 2 * rank)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "roi has %lld entries, expected %d", (long long)cnt, 2 * nax);
        if (!kiln_dtype_is_float(roi->dtype))
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "roi has dtype %s",
                                   kiln_dtype_name(roi->dtype));
        int m = (int)(cnt / 2);
        for (int i = 0; i < m; i++) {
            int d = m == rank ? i : rs_axis_of(a, i);
            p->roi_start[d] = kiln_tensor_f64(roi, i);
            p->roi_end[d] = kiln_tensor_f64(roi, m + i);
        }
    }
    return KILN_OK;
}

/* Upsample-7's scales attribute as a 1-D float32 tensor viewing the node's floats
 * (*t is filled; false when the attribute is missing). */
static bool rs_attr_scales(const struct kiln_node *n, kiln_tensor *t)
{
    const float *fs;
    int cnt = kiln_attr_floats(n, "scales", &fs);
    if (cnt < 0) return false;
    memset(t, 0, sizeof *t);
    t->dtype = KILN_DTYPE_F32;
    t->rank = 1;
    t->dims[0] = cnt;
    t->data = (void *)fs;
    return true;
}

/* Shared shape function of Resize and Upsample: needs the scales / sizes values. */
static kiln_status rs_infer(struct kiln_infer_ctx *ctx, bool upsample)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_type *x = ctx->in[0];
    if (!ctx->out[0] || !x) return KILN_OK;
    struct rs_attrs a;
    kiln_status st = rs_parse_attrs(n, upsample, x->rank, &a);
    if (st != KILN_OK) return st;
    struct kiln_type t;
    kiln_type_unknown(&t);
    t.dtype = x->dtype;
    if (x->rank < 0) {
        *ctx->out[0] = t;
        return KILN_OK;
    }
    t.rank = x->rank;
    for (int d = 0; d < x->rank; d++) t.dims[d] = -1;

    /* where scales / sizes / roi come from in this opset */
    int i_roi = -1, i_scales = 1, i_sizes = -1;
    if (!upsample && n->opset >= 11) {
        i_roi = 1;
        i_scales = 2;
        i_sizes = 3;
    }
    const kiln_tensor *scales = NULL, *sizes = NULL, *roi = NULL;
    bool known = kiln_type_is_concrete(x);
    kiln_tensor attr_scales;
    if (upsample && ctx->n_in < 2) {
        /* Upsample-7: scales is an attribute */
        if (!rs_attr_scales(n, &attr_scales))
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "scales is missing");
        scales = &attr_scales;
    } else {
        if (i_scales < ctx->n_in && ctx->in[i_scales]) {
            if (ctx->in_value[i_scales]) scales = ctx->in_value[i_scales];
            else known = false;
        }
        bool have_scales = scales && kiln_shape_count(scales->rank, scales->dims) > 0;
        if (i_sizes >= 0 && i_sizes < ctx->n_in && ctx->in[i_sizes]) {
            if (ctx->in_value[i_sizes]) sizes = ctx->in_value[i_sizes];
            else if (!have_scales) known = false;
        }
        /* roi does not change the shape; an unknown one is left out */
        if (i_roi >= 0 && i_roi < ctx->n_in && ctx->in[i_roi]) roi = ctx->in_value[i_roi];
    }
    if (!known && scales && !sizes && kiln_shape_count(scales->rank, scales->dims) > 0 &&
        (upsample || !ctx->in[i_scales] || ctx->in_value[i_scales]) &&
        (i_roi < 0 || i_roi >= ctx->n_in || !ctx->in[i_roi] || roi)) {
        /* constant scales, some input dims unknown (a symbolic batch): each axis's size
         * depends on its own input size and scale only, so the known ones are computed
         * (the unknown ones as 1) and an unknown one that is not resized keeps its name */
        int64_t d1[KILN_MAX_RANK];
        for (int d = 0; d < x->rank; d++) d1[d] = x->dims[d] >= 0 ? x->dims[d] : 1;
        struct rs_plan p;
        st = rs_make_plan(n, &a, x->rank, d1, roi, scales, NULL, &p);
        if (st != KILN_OK) return st;
        for (int d = 0; d < x->rank; d++) {
            if (x->dims[d] >= 0) {
                t.dims[d] = p.out[d];
            } else if (!p.resized[d] || (p.scale[d] == 1.0 && p.out[d] == 1 &&
                                         a.coord != RS_TF_CROP_AND_RESIZE)) {
                t.dims[d] = -1;
                t.sym[d] = x->sym[d];
            }
        }
        *ctx->out[0] = t;
        return KILN_OK;
    }
    if (!known) {
        if (a.n_axes >= 0) {
            for (int d = 0; d < x->rank; d++) t.dims[d] = x->dims[d];
            for (int i = 0; i < a.n_axes; i++)
                if (a.axes[i] >= 0 && a.axes[i] < x->rank) t.dims[a.axes[i]] = -1;
        }
        *ctx->out[0] = t;
        return KILN_OK;
    }
    struct rs_plan p;
    st = rs_make_plan(n, &a, x->rank, x->dims, roi, scales, sizes, &p);
    if (st != KILN_OK) return st;
    kiln_type_set(ctx->out[0], x->dtype, x->rank, p.out);
    return KILN_OK;
}

/* Map output coordinate xo of axis d to the input coordinate; *oob for crop-and-resize misses. */
static double rs_original(const struct rs_attrs *a, const struct rs_plan *p, int d, double xo,
                          bool *oob)
{
    double in = (double)p->in[d], s = p->scale[d], of = p->out_f[d];
    double x;
    *oob = false;
    switch (a->coord) {
    case RS_ALIGN_CORNERS: x = of == 1 ? 0.0 : xo * (in - 1) / (of - 1); break;
    case RS_ASYMMETRIC: x = xo / s; break;
    case RS_TF_HALF_PIXEL_FOR_NN: x = (xo + 0.5) / s; break;
    case RS_TF_CROP_AND_RESIZE: {
        double r0 = p->roi_start[d], r1 = p->roi_end[d];
        if (of == 1) x = (r1 - r0) * (in - 1) / 2;
        else x = xo * (r1 - r0) * (in - 1) / (of - 1);
        x += r0 * (in - 1);
        if (x < 0 || x > in - 1) *oob = true;
        break;
    }
    case RS_PYTORCH_HALF_PIXEL: x = of == 1 ? -0.5 : (xo + 0.5) / s - 0.5; break;
    case RS_HALF_PIXEL_SYMMETRIC: {
        double adjustment = (double)p->out[d] / of;
        double center = in / 2;
        x = center * (1 - adjustment) + (xo + 0.5) / s - 0.5;
        break;
    }
    case RS_HALF_PIXEL:
    default: x = (xo + 0.5) / s - 0.5; break;
    }
    return x;
}

/* Cubic convolution kernel with coefficient A at distance t. */
static double cubic_kernel(double t, double A)
{
    t = fabs(t);
    if (t <= 1) return ((A + 2) * t - (A + 3)) * t * t + 1;
    if (t < 2) return ((A * t - 5 * A) * t + 8 * A) * t - 4 * A;
    return 0;
}

/* Taps of one axis: for each output coordinate, ntap input indices and weights. */
struct rs_taps {
    int64_t out;
    int ntap;
    int64_t *idx;  /* [out * ntap], clamped into the input */
    double *w;     /* [out * ntap] */
    bool *oob;     /* [out]: write extrapolation_value */
    bool identity; /* every output picks its own input index */
};

/* Number of taps per output coordinate on axis d. */
static double rs_ntap(const struct rs_attrs *a, double scale)
{
    if (a->mode == RS_NEAREST) return 2;
    double s = a->antialias ? fmin(scale, 1.0) : 1.0;
    double reach = a->mode == RS_LINEAR ? 1.0 : 2.0;
    return 2 - 2 * (floor(-reach / s) + 1);
}

/* Compute the taps of axis d into t (arrays allocated here, freed by the caller). */
static kiln_status rs_axis_taps(const struct kiln_node *n, const struct rs_attrs *a,
                                const struct rs_plan *p, int d, struct rs_taps *t)
{
    int64_t O = p->out[d], in = p->in[d];
    double ntd = rs_ntap(a, p->scale[d]);
    memset(t, 0, sizeof *t);
    /* a bound on the tap table (antialias widens it by 1 / scale) */
    if (ntd * (double)(O + 1) > (double)((int64_t)1 << 31))
        return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY,
                               "resizing axis %d from %lld to %lld needs too many taps", d,
                               (long long)in, (long long)O);
    int nt = (int)ntd;
    int start = 1 - nt / 2;
    double s = a->antialias ? fmin(p->scale[d], 1.0) : 1.0;
    t->out = O;
    t->ntap = nt;
    t->idx = malloc((size_t)(O * nt + 1) * sizeof *t->idx);
    t->w = malloc((size_t)(O * nt + 1) * sizeof *t->w);
    t->oob = malloc((size_t)(O + 1) * sizeof *t->oob);
    t->identity = O == in;
    if (!t->idx || !t->w || !t->oob)
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory for Resize taps");
    for (int64_t o = 0; o < O; o++) {
        bool oob;
        double x = rs_original(a, p, d, (double)o, &oob);
        /* keep x (even NaN from a bad roi) where the index arithmetic is defined */
        if (!(x >= -(double)nt - 2)) x = -(double)nt - 2;
        if (!(x <= (double)in + nt + 2)) x = (double)in + nt + 2;
        /* base = ceil(x) - 1, so ratio = x - base lies in (0, 1] */
        double base = ceil(x) - 1;
        double ratio = x - base;
        int64_t *idx = t->idx + o * nt;
        double *w = t->w + o * nt, sum = 0;
        for (int k = 0; k < nt; k++) {
            int64_t i = (int64_t)base + start + k;
            double wk;
            if (a->mode == RS_NEAREST) {
                bool hi; /* pick base + 1 (else base) */
                if (ratio == 1.0) hi = true;
                else {
                    switch (a->nearest) {
                    case RS_ROUND_PREFER_FLOOR: hi = ratio > 0.5; break;
                    case RS_ROUND_PREFER_CEIL: hi = ratio >= 0.5; break;
                    case RS_FLOOR: hi = false; break;
                    case RS_CEIL: hi = true; break;
                    case RS_SIMPLE:
                    default: hi = p->scale[d] < 1.0; break;
                    }
                }
                wk = (k == 1) == hi ? 1.0 : 0.0;
            } else {
                double dist = ((double)(start + k) - ratio) * s;
                wk = a->mode == RS_LINEAR ? fmax(0.0, 1.0 - fabs(dist))
                                          : cubic_kernel(dist, a->cubic_a);
            }
            if (a->exclude_outside && (i < 0 || i >= in)) wk = 0;
            w[k] = wk;
            sum += wk;
            idx[k] = i < 0 ? 0 : i >= in ? in - 1 : i;
        }
        if ((a->antialias || a->exclude_outside) && a->mode != RS_NEAREST && sum != 0)
            for (int k = 0; k < nt; k++) w[k] /= sum;
        t->oob[o] = oob;
        /* identity: one weight of 1 on index o (checked exactly) */
        if (t->identity) {
            bool id = !oob;
            for (int k = 0; k < nt && id; k++)
                id = w[k] == 0 || (w[k] == 1.0 && idx[k] == o);
            t->identity = id;
        }
    }
    return KILN_OK;
}

/* Resize along axis d: src has dims cur[], dst gets cur with cur[d] = taps->out. */
static void rs_apply_axis(const double *src, double *dst, int rank, const int64_t *cur, int d,
                          const struct rs_taps *t, double extrapolation)
{
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < d; i++) outer *= cur[i];
    for (int i = d + 1; i < rank; i++) inner *= cur[i];
    int64_t in = cur[d], O = t->out;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t x = 0; x < O; x++) {
            double *dr = dst + (o * O + x) * inner;
            if (t->oob[x]) {
                for (int64_t i = 0; i < inner; i++) dr[i] = extrapolation;
                continue;
            }
            for (int64_t i = 0; i < inner; i++) dr[i] = 0;
            for (int k = 0; k < t->ntap; k++) {
                double w = t->w[x * t->ntap + k];
                if (w == 0) continue;
                const double *sr = src + (o * in + t->idx[x * t->ntap + k]) * inner;
                for (int64_t i = 0; i < inner; i++) dr[i] += w * sr[i];
            }
        }
}

/* Resize X into Y by the plan, one resized axis at a time. */
static kiln_status rs_execute(const struct kiln_node *n, const struct rs_attrs *a,
                              const struct rs_plan *p, const kiln_tensor *X, kiln_tensor *Y)
{
    int r = p->rank;
    int64_t cur[KILN_MAX_RANK];
    for (int d = 0; d < r; d++) cur[d] = p->in[d];
    int64_t cnt = kiln_shape_count(r, cur);
    double *buf = malloc((size_t)(cnt + 1) * sizeof *buf);
    if (!buf) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory for Resize");
    for (int64_t i = 0; i < cnt; i++) buf[i] = kiln_get_f64(X->dtype, X->data, i);

    for (int d = 0; d < r; d++) {
        if (!p->resized[d]) continue;
        struct rs_taps t;
        kiln_status st = rs_axis_taps(n, a, p, d, &t);
        if (st != KILN_OK) {
            free(t.idx);
            free(t.w);
            free(t.oob);
            free(buf);
            return st;
        }
        if (!t.identity) {
            int64_t nxt[KILN_MAX_RANK];
            for (int i = 0; i < r; i++) nxt[i] = cur[i];
            nxt[d] = t.out;
            int64_t ncnt = kiln_shape_count(r, nxt);
            double *nb = ncnt >= 0 ? malloc((size_t)(ncnt + 1) * sizeof *nb) : NULL;
            if (!nb) {
                free(t.idx);
                free(t.w);
                free(t.oob);
                free(buf);
                return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory for Resize");
            }
            rs_apply_axis(buf, nb, r, cur, d, &t, a->extrapolation);
            free(buf);
            buf = nb;
            cur[d] = t.out;
        }
        free(t.idx);
        free(t.w);
        free(t.oob);
    }
    cnt = kiln_shape_count(r, cur);
    if (cnt != kiln_shape_count(Y->rank, Y->dims)) {
        free(buf);
        return kiln_node_error(n, KILN_ERR_INTERNAL, "output size mismatch");
    }
    bool is_int = kiln_dtype_is_int(Y->dtype);
    for (int64_t i = 0; i < cnt; i++)
        kiln_set_f64(Y->dtype, Y->data, i, is_int ? nearbyint(buf[i]) : buf[i]);
    free(buf);
    return KILN_OK;
}

/* ---- what the fast kernel and the layout pass share (resample.h) ---- */

/* Parsed attributes the fast kernel computes: no tf_crop_and_resize, axes within H, W. */
static bool rs_attrs_hw(const struct kiln_node *n, bool upsample, struct rs_attrs *a)
{
    if (rs_parse_attrs(n, upsample, 4, a) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    if (a->coord == RS_TF_CROP_AND_RESIZE) return false;
    for (int i = 0; i < a->n_axes; i++)
        if (a->axes[i] < 2) return false;
    return true;
}

bool kiln_resize_attrs_hw(const struct kiln_node *n, bool upsample)
{
    struct rs_attrs a;
    return rs_attrs_hw(n, upsample, &a);
}

void kiln_resize_axis_free(struct kiln_resize_axis *a)
{
    free(a->idx);
    free(a->w);
    a->idx = NULL;
    a->w = NULL;
}

/* Axis d's taps in single precision, zero-weight taps dropped where every
 * coordinate has fewer (nearest: one tap). */
static bool rs_axis_hw(const struct kiln_node *n, const struct rs_attrs *a,
                       const struct rs_plan *p, int d, int max_taps, struct kiln_resize_axis *out)
{
    struct rs_taps t;
    if (rs_axis_taps(n, a, p, d, &t) != KILN_OK) {
        kiln_error_clear();
        free(t.idx);
        free(t.w);
        free(t.oob);
        return false;
    }
    int used = 1;
    for (int64_t o = 0; o < t.out; o++) {
        if (t.oob[o]) used = max_taps + 1;
        int k_used = 0;
        for (int k = 0; k < t.ntap; k++)
            if (t.w[o * t.ntap + k] != 0) k_used++;
        if (k_used > used) used = k_used;
    }
    bool ok = used <= max_taps;
    if (ok) {
        out->in = p->in[d];
        out->out = t.out;
        out->ntap = used;
        out->idx = malloc((size_t)(t.out * used + 1) * sizeof *out->idx);
        out->w = malloc((size_t)(t.out * used + 1) * sizeof *out->w);
        ok = out->idx && out->w;
        for (int64_t o = 0; ok && o < t.out; o++) {
            int j = 0;
            for (int k = 0; k < t.ntap; k++) {
                double wk = t.w[o * t.ntap + k];
                if (wk == 0) continue;
                out->idx[o * used + j] = t.idx[o * t.ntap + k];
                out->w[o * used + j] = (float)wk;
                j++;
            }
            for (; j < used; j++) { /* padding taps: weight 0 on a valid index */
                out->idx[o * used + j] = t.idx[o * t.ntap];
                out->w[o * used + j] = 0.0f;
            }
        }
        if (!ok) kiln_resize_axis_free(out);
    }
    free(t.idx);
    free(t.w);
    free(t.oob);
    return ok;
}

bool kiln_resize_hw(const struct kiln_node *n, bool upsample, const int64_t *xd,
                    const kiln_tensor *roi, const kiln_tensor *scales, const kiln_tensor *sizes,
                    int max_taps, int64_t od[4], struct kiln_resize_axis *h,
                    struct kiln_resize_axis *w)
{
    memset(h, 0, sizeof *h);
    memset(w, 0, sizeof *w);
    struct rs_attrs a;
    if (!rs_attrs_hw(n, upsample, &a)) return false;
    kiln_tensor attr_scales;
    if (upsample && !scales) {
        if (!rs_attr_scales(n, &attr_scales)) return false;
        scales = &attr_scales;
    }
    struct rs_plan p;
    if (rs_make_plan(n, &a, 4, xd, roi, scales, sizes, &p) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    if (p.out[0] != xd[0] || p.out[1] != xd[1] || p.out[2] <= 0 || p.out[3] <= 0 ||
        xd[2] <= 0 || xd[3] <= 0)
        return false;
    /* N and C keep their size, but a coordinate mapping can still move them (with
     * tf_half_pixel_for_nn, output index i reads input i + 1 at scale 1) */
    for (int d = 0; d < 2; d++) {
        if (!p.resized[d]) continue;
        struct rs_taps t;
        bool id = rs_axis_taps(n, &a, &p, d, &t) == KILN_OK && t.identity;
        kiln_error_clear();
        free(t.idx);
        free(t.w);
        free(t.oob);
        if (!id) return false;
    }
    if (!rs_axis_hw(n, &a, &p, 2, max_taps, h)) return false;
    if (!rs_axis_hw(n, &a, &p, 3, max_taps, w)) {
        kiln_resize_axis_free(h);
        return false;
    }
    for (int d = 0; d < 4; d++) od[d] = p.out[d];
    return true;
}

/* Shared run of Resize and Upsample. */
static kiln_status rs_run(struct kiln_run_ctx *ctx, bool upsample)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *X = ctx->in[0];
    if (X->dtype == KILN_DTYPE_STRING)
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "string input is not supported");
    struct rs_attrs a;
    kiln_status st = rs_parse_attrs(n, upsample, X->rank, &a);
    if (st != KILN_OK) return st;
    const kiln_tensor *roi = NULL, *scales = NULL, *sizes = NULL;
    kiln_tensor attr_scales;
    if (upsample && ctx->n_in < 2) {
        if (!rs_attr_scales(n, &attr_scales))
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "scales is missing");
        scales = &attr_scales;
    } else if (upsample || n->opset < 11) {
        scales = ctx->in[1];
    } else {
        roi = ctx->n_in > 1 ? ctx->in[1] : NULL;
        scales = ctx->n_in > 2 ? ctx->in[2] : NULL;
        sizes = ctx->n_in > 3 ? ctx->in[3] : NULL;
    }
    struct rs_plan p;
    st = rs_make_plan(n, &a, X->rank, X->dims, roi, scales, sizes, &p);
    if (st != KILN_OK) return st;
    if (kiln_shape_count(X->rank, X->dims) == 0 || 
        kiln_shape_count(ctx->out[0]->rank, ctx->out[0]->dims) == 0)
        return KILN_OK;
    return rs_execute(n, &a, &p, X, ctx->out[0]);
}

/* Entry points of Resize and Upsample. */
static kiln_status resize_infer(struct kiln_infer_ctx *ctx) { return rs_infer(ctx, false); }
static kiln_status resize_run(struct kiln_run_ctx *ctx) { return rs_run(ctx, false); }
static kiln_status upsample_infer(struct kiln_infer_ctx *ctx) { return rs_infer(ctx, true); }
static kiln_status upsample_run(struct kiln_run_ctx *ctx) { return rs_run(ctx, true); }

KILN_REF_OP(Resize, resize_infer, resize_run);
KILN_REF_OP(Upsample, upsample_infer, upsample_run);

/* ---- GridSample ---- */

enum gs_pad { GS_ZEROS, GS_BORDER, GS_REFLECTION };

/* Shape function: [N, C, grid's spatial dims...]. */
static kiln_status gridsample_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0], *g = ctx->in[1];
    if (!ctx->out[0] || !x) return KILN_OK;
    struct kiln_type t;
    kiln_type_unknown(&t);
    t.dtype = x->dtype;
    int rank = x->rank >= 0 ? x->rank : g && g->rank >= 0 ? g->rank : -1;
    if (x->rank >= 0 && x->rank < 3)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT, "X has rank %d", x->rank);
    if (x->rank >= 0 && g && g->rank >= 0 && g->rank != x->rank)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "grid has rank %d but X has rank %d", g->rank, x->rank);
    if (rank >= 0) {
        t.rank = rank;
        for (int i = 0; i < rank; i++) t.dims[i] = -1;
        if (x->rank >= 0) {
            t.dims[0] = x->dims[0];
            t.dims[1] = x->dims[1];
        }
        if (g && g->rank >= 0)
            for (int i = 1; i < rank - 1; i++) t.dims[i + 1] = g->dims[i];
    }
    *ctx->out[0] = t;
    return KILN_OK;
}

/* Reflect x into [lo, hi] by bouncing off the nearer border (as PyTorch does). */
static double gs_reflect(double x, double lo, double hi)
{
    double rng = hi - lo;
    if (rng <= 0) return lo;
    /* m: distance past the border, modulo the period of two bounces */
    if (x < lo) {
        double m = fmod(lo - x, 2 * rng);
        return m < rng ? lo + m : hi - (m - rng);
    }
    if (x > hi) {
        double m = fmod(x - hi, 2 * rng);
        return m < rng ? hi - m : lo + (m - rng);
    }
    return x;
}

/* Map an integer index through the padding mode; -1 means "outside, reads 0". */
static int64_t gs_index(int64_t i, int64_t len, enum gs_pad pad, double lo, double hi)
{
    switch (pad) {
    case GS_ZEROS: return i >= 0 && i < len ? i : -1;
    case GS_BORDER: return i < 0 ? 0 : i >= len ? len - 1 : i;
    case GS_REFLECTION:
    default: {
        int64_t r = (int64_t)gs_reflect((double)i, lo, hi);
        return r < 0 ? 0 : r >= len ? len - 1 : r;
    }
    }
}

/* Run GridSample over any number of spatial dims. */
static kiln_status gridsample_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *X = ctx->in[0], *G = ctx->in[1];
    kiln_tensor *Y = ctx->out[0];
    const char *mode = kiln_attr_str(n, "mode", n->opset >= 20 ? "linear" : "bilinear");
    const char *pad_s = kiln_attr_str(n, "padding_mode", "zeros");
    bool align = kiln_attr_int(n, "align_corners", 0) != 0;
    int m; /* 0 nearest, 1 linear, 2 cubic */
    if (strcmp(mode, "nearest") == 0) m = 0;
    else if (strcmp(mode, "linear") == 0 || strcmp(mode, "bilinear") == 0) m = 1;
    else if (strcmp(mode, "cubic") == 0 || strcmp(mode, "bicubic") == 0) m = 2;
    else return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "mode '%s' is not supported", mode);
    enum gs_pad pad;
    if (strcmp(pad_s, "zeros") == 0) pad = GS_ZEROS;
    else if (strcmp(pad_s, "border") == 0) pad = GS_BORDER;
    else if (strcmp(pad_s, "reflection") == 0) pad = GS_REFLECTION;
    else
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "padding_mode '%s' is not supported",
                               pad_s);
    if (!kiln_dtype_is_numeric(X->dtype) || !kiln_dtype_is_float(G->dtype))
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "dtypes %s / %s are not supported",
                               kiln_dtype_name(X->dtype), kiln_dtype_name(G->dtype));
    int k = X->rank - 2;
    if (k < 1 || G->rank != X->rank || G->dims[0] != X->dims[0] || G->dims[X->rank - 1] != k)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "grid must be [N, spatial..., %d] for X of rank %d", k, X->rank);

    int64_t N = X->dims[0], C = X->dims[1];
    const int64_t *D = X->dims + 2;
    int64_t in_sp = kiln_shape_count(k, D), out_sp = kiln_shape_count(k, G->dims + 1);
    int nt = m == 0 ? 1 : m == 1 ? 2 : 4;
    if (in_sp == 0) return KILN_OK; /* nothing to sample: the output stays zero */
    int64_t idx[KILN_MAX_RANK][4];
    double w[KILN_MAX_RANK][4];
    bool is_int = kiln_dtype_is_int(Y->dtype);

    for (int64_t b = 0; b < N; b++)
        for (int64_t p = 0; p < out_sp; p++) {
            const int64_t gbase = (b * out_sp + p) * k;
            for (int d = 0; d < k; d++) {
                double len = (double)D[d];
                double lo = align ? 0.0 : -0.5, hi = align ? len - 1 : len - 0.5;
                /* the grid lists coordinates innermost dim first */
                double g = kiln_get_f64(G->dtype, G->data, gbase + (k - 1 - d));
                double x = align ? (g + 1) / 2.0 * (len - 1) : ((g + 1) * len - 1) / 2.0;
                /* NaN and huge values read as outside; zeros padding needs no more than a
                   little outside */
                if (!(fabs(x) < 1e30)) x = lo - 8;
                else x = (double)(float)x; /* the ONNX reference keeps these in float32 */
                if (pad == GS_ZEROS && x < lo - 8) x = lo - 8;
                if (pad == GS_ZEROS && x > hi + 8) x = hi + 8;
                if (m == 0) x = nearbyint(x); /* half to even, as the test data has it */
                if (x < lo || x > hi) {
                    if (pad == GS_BORDER) x = x < 0 ? 0 : x > len - 1 ? len - 1 : x;
                    else if (pad == GS_REFLECTION) x = gs_reflect(x, lo, hi);
                }
                if (m == 0) {
                    idx[d][0] = gs_index((int64_t)x, D[d], pad, lo, hi);
                    w[d][0] = 1.0;
                    continue;
                }
                double x0 = floor(x), t = x - x0;
                for (int j = 0; j < nt; j++) {
                    int64_t off = m == 1 ? j : j - 1;
                    idx[d][j] = gs_index((int64_t)x0 + off, D[d], pad, lo, hi);
                    w[d][j] = m == 1 ? (j == 0 ? 1 - t : t) : cubic_kernel((double)off - t, -0.75);
                }
            }
            for (int64_t c = 0; c < C; c++) {
                const int64_t xbase = (b * C + c) * in_sp;
                double acc = 0;
                int tap[KILN_MAX_RANK] = {0};
                for (;;) {
                    double wt = 1;
                    int64_t off = 0;
                    bool zero = false;
                    for (int d = 0; d < k; d++) {
                        int64_t i = idx[d][tap[d]];
                        if (i < 0) zero = true;
                        off = off * D[d] + (i < 0 ? 0 : i);
                        wt *= w[d][tap[d]];
                    }
                    if (!zero && wt != 0) acc += wt * kiln_get_f64(X->dtype, X->data, xbase + off);
                    int d = k - 1;
                    while (d >= 0 && ++tap[d] == nt) tap[d--] = 0;
                    if (d < 0) break;
                }
                kiln_set_f64(Y->dtype, Y->data, (b * C + c) * out_sp + p,
                             is_int ? nearbyint(acc) : acc);
            }
        }
    return KILN_OK;
}

KILN_REF_OP(GridSample, gridsample_infer, gridsample_run);

/* ---- AffineGrid ---- */

/* Shape function: size [N, C, H, W] gives [N, H, W, 2]; [N, C, D, H, W] gives [N, D, H, W, 3]. */
static kiln_status affinegrid_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_type *theta = ctx->in[0], *size = ctx->in[1];
    if (!ctx->out[0] || !theta) return KILN_OK;
    struct kiln_type t;
    kiln_type_unknown(&t);
    t.dtype = theta->dtype;
    const kiln_tensor *sv = ctx->in_value[1];
    int64_t cnt = -1;
    if (sv) cnt = kiln_shape_count(sv->rank, sv->dims);
    else if (size && size->rank == 1) cnt = size->dims[0];
    if (cnt >= 0) {
        if (cnt != 4 && cnt != 5)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "size has %lld entries, expected 4 or 5", (long long)cnt);
        int k = (int)cnt - 2;
        t.rank = k + 2;
        for (int i = 0; i < t.rank; i++) t.dims[i] = -1;
        t.dims[k + 1] = k;
        if (theta->rank >= 1) t.dims[0] = theta->dims[0];
        if (sv) {
            for (int i = 0; i < (int)cnt; i++)
                if (kiln_tensor_i64(sv, i) < 0)
                    return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "size[%d] is negative",
                                           i);
            t.dims[0] = kiln_tensor_i64(sv, 0);
            for (int i = 0; i < k; i++) t.dims[i + 1] = kiln_tensor_i64(sv, i + 2);
        }
    }
    *ctx->out[0] = t;
    return KILN_OK;
}

/* Normalized base-grid coordinate of index i along a dim of length len. */
static double ag_coord(int64_t i, int64_t len, bool align)
{
    if (align) return len == 1 ? -1.0 : -1.0 + 2.0 * (double)i / (double)(len - 1);
    return -1.0 + (2.0 * (double)i + 1.0) / (double)len;
}

/* Run AffineGrid: grid[n, ..., :] = theta[n] @ [x, y, (z,) 1]. */
static kiln_status affinegrid_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *theta = ctx->in[0];
    kiln_tensor *Y = ctx->out[0];
    bool align = kiln_attr_int(n, "align_corners", 0) != 0;
    if (!kiln_dtype_is_float(theta->dtype))
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "theta dtype %s",
                               kiln_dtype_name(theta->dtype));
    int k = Y->rank - 2; /* 2 or 3 spatial dims */
    int64_t N = Y->dims[0];
    if (theta->rank != 3 || theta->dims[0] != N || theta->dims[1] != k || theta->dims[2] != k + 1)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "theta must be [%lld, %d, %d]",
                               (long long)N, k, k + 1);
    const int64_t *S = Y->dims + 1; /* spatial sizes, outermost first */
    int64_t sp = kiln_shape_count(k, S);
    for (int64_t b = 0; b < N; b++)
        for (int64_t p = 0; p < sp; p++) {
            /* base point: (x, y[, z], 1) with x along the innermost dim */
            double pt[4];
            int64_t rem = p;
            for (int d = k - 1; d >= 0; d--) {
                pt[k - 1 - d] = ag_coord(rem % S[d], S[d], align);
                rem /= S[d];
            }
            pt[k] = 1.0;
            for (int r = 0; r < k; r++) {
                double v = 0;
                for (int c = 0; c <= k; c++)
                    v += kiln_get_f64(theta->dtype, theta->data, (b * k + r) * (k + 1) + c) * pt[c];
                kiln_set_f64(Y->dtype, Y->data, (b * sp + p) * k + r, v);
            }
        }
    return KILN_OK;
}

KILN_REF_OP(AffineGrid, affinegrid_infer, affinegrid_run);

/* ---- Col2Im ---- */

/* Col2Im's spatial attributes for k dims, with defaults. */
struct c2i_attrs {
    int64_t dil[KILN_MAX_RANK], pad_b[KILN_MAX_RANK], pad_e[KILN_MAX_RANK], stride[KILN_MAX_RANK];
};

/* Parse dilations, strides and pads (begins then ends) for k spatial dims. */
static kiln_status c2i_parse(const struct kiln_node *n, int k, struct c2i_attrs *a)
{
    const int64_t *v;
    int cnt;
    for (int i = 0; i < k; i++) {
        a->dil[i] = a->stride[i] = 1;
        a->pad_b[i] = a->pad_e[i] = 0;
    }
    if ((cnt = kiln_attr_ints(n, "dilations", &v)) >= 0) {
        if (cnt != k)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                                   "dilations has %d entries, expected %d", cnt, k);
        for (int i = 0; i < k; i++)
            a->dil[i] = v[i];
    }
    if ((cnt = kiln_attr_ints(n, "strides", &v)) >= 0) {
        if (cnt != k)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "strides has %d entries, expected %d",
                                   cnt, k);
        for (int i = 0; i < k; i++)
            a->stride[i] = v[i];
    }
    if ((cnt = kiln_attr_ints(n, "pads", &v)) >= 0) {
        if (cnt != 2 * k)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "pads has %d entries, expected %d",
                                   cnt, 2 * k);
        for (int i = 0; i < k; i++) {
            a->pad_b[i] = v[i];
            a->pad_e[i] = v[k + i];
        }
    }
    const int64_t lim = (int64_t)1 << 31;
    for (int i = 0; i < k; i++)
        if (a->dil[i] <= 0 || a->stride[i] <= 0 || a->pad_b[i] < 0 || a->pad_e[i] < 0 ||
            a->dil[i] > lim || a->stride[i] > lim || a->pad_b[i] > lim || a->pad_e[i] > lim)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                                   "dim %d: dilation %lld, stride %lld, pads %lld/%lld", i,
                                   (long long)a->dil[i], (long long)a->stride[i],
                                   (long long)a->pad_b[i], (long long)a->pad_e[i]);
    return KILN_OK;
}

/* Read image_shape / block_shape (1-D int tensors of length k, positive entries). */
static kiln_status c2i_shape(const struct kiln_node *n, const char *what, const kiln_tensor *t,
                             int64_t *out, int *k)
{
    if (t->rank != 1 || !kiln_dtype_is_int(t->dtype) || t->dims[0] < 1 ||
        t->dims[0] > KILN_MAX_RANK - 2)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "%s must be a 1-D int tensor of 1..%d entries", what,
                               KILN_MAX_RANK - 2);
    *k = (int)t->dims[0];
    for (int i = 0; i < *k; i++) {
        out[i] = kiln_tensor_i64(t, i);
        if (out[i] <= 0 || out[i] > ((int64_t)1 << 31))
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "%s[%d] = %lld is not positive",
                                   what, i, (long long)out[i]);
    }
    return KILN_OK;
}

/* Shape function: [N, C, image_shape...] with C = input dim 1 / prod(block_shape). */
static kiln_status col2im_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_type *x = ctx->in[0];
    if (!ctx->out[0] || !x) return KILN_OK;
    struct kiln_type t;
    kiln_type_unknown(&t);
    t.dtype = x->dtype;
    const kiln_tensor *img = ctx->in_value[1], *blk = ctx->in_value[2];
    int k = -1;
    int64_t idims[KILN_MAX_RANK], bdims[KILN_MAX_RANK];
    kiln_status st;
    if (img) {
        if ((st = c2i_shape(n, "image_shape", img, idims, &k)) != KILN_OK) return st;
    } else if (ctx->in[1] && ctx->in[1]->rank == 1 && ctx->in[1]->dims[0] > 0 &&
               ctx->in[1]->dims[0] <= KILN_MAX_RANK - 2) {
        k = (int)ctx->in[1]->dims[0];
    }
    if (k > 0) {
        t.rank = k + 2;
        for (int i = 0; i < t.rank; i++) t.dims[i] = img ? (i >= 2 ? idims[i - 2] : -1) : -1;
        if (x->rank == 3) {
            t.dims[0] = x->dims[0];
            if (blk && x->dims[1] >= 0) {
                int kb;
                if ((st = c2i_shape(n, "block_shape", blk, bdims, &kb)) != KILN_OK) return st;
                int64_t prod = kiln_shape_count(kb, bdims);
                if (kb != k || prod <= 0 || x->dims[1] % prod)
                    return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                           "input dim 1 (%lld) is not a multiple of the block "
                                           "size %lld",
                                           (long long)x->dims[1], (long long)prod);
                t.dims[1] = x->dims[1] / prod;
            }
        }
    }
    *ctx->out[0] = t;
    return KILN_OK;
}

/* Run Col2Im: sum each column's block back into the (padded) image. */
static kiln_status col2im_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *X = ctx->in[0];
    kiln_tensor *Y = ctx->out[0];
    int64_t img[KILN_MAX_RANK], blk[KILN_MAX_RANK], nb[KILN_MAX_RANK];
    int k, kb;
    kiln_status st;
    if ((st = c2i_shape(n, "image_shape", ctx->in[1], img, &k)) != KILN_OK) return st;
    if ((st = c2i_shape(n, "block_shape", ctx->in[2], blk, &kb)) != KILN_OK) return st;
    if (kb != k)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "image_shape has %d entries but block_shape %d", k, kb);
    struct c2i_attrs a;
    if ((st = c2i_parse(n, k, &a)) != KILN_OK) return st;
    if (!kiln_dtype_is_numeric(X->dtype))
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "dtype %s", kiln_dtype_name(X->dtype));
    int64_t bsize = kiln_shape_count(k, blk);
    for (int i = 0; i < k; i++) {
        int64_t span = a.dil[i] * (blk[i] - 1) + 1;
        int64_t padded = img[i] + a.pad_b[i] + a.pad_e[i];
        nb[i] = padded >= span ? (padded - span) / a.stride[i] + 1 : 0;
    }
    int64_t L = kiln_shape_count(k, nb);
    if (X->rank != 3 || bsize <= 0 || L < 0 || X->dims[1] % bsize || X->dims[2] != L) {
        char buf[96];
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "input has shape %s, expected [N, C*%lld, %lld]",
                               kiln_shape_str(X->rank, X->dims, buf, sizeof buf),
                               (long long)bsize, (long long)L);
    }
    int64_t N = X->dims[0], C = X->dims[1] / bsize, isz = kiln_shape_count(k, img);
    bool y_ok = Y->rank == k + 2 && Y->dims[0] == N && Y->dims[1] == C && isz >= 0;
    for (int i = 0; y_ok && i < k; i++) y_ok = Y->dims[i + 2] == img[i];
    if (!y_ok) return kiln_node_error(n, KILN_ERR_INTERNAL, "output shape mismatch");
    double *acc = calloc((size_t)(isz + 1), sizeof *acc);
    if (!acc) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory for Col2Im");
    for (int64_t b = 0; b < N; b++)
        for (int64_t c = 0; c < C; c++) {
            memset(acc, 0, (size_t)isz * sizeof *acc);
            for (int64_t e = 0; e < bsize; e++) {
                int64_t bo[KILN_MAX_RANK], rem = e;
                for (int d = k - 1; d >= 0; d--) {
                    bo[d] = rem % blk[d];
                    rem /= blk[d];
                }
                const int64_t row = ((b * C + c) * bsize + e) * L;
                for (int64_t l = 0; l < L; l++) {
                    int64_t off = 0, r2 = l;
                    int64_t pos[KILN_MAX_RANK];
                    for (int d = k - 1; d >= 0; d--) {
                        pos[d] = r2 % nb[d];
                        r2 /= nb[d];
                    }
                    bool inside = true;
                    for (int d = 0; d < k; d++) {
                        int64_t y = pos[d] * a.stride[d] - a.pad_b[d] + bo[d] * a.dil[d];
                        if (y < 0 || y >= img[d]) inside = false;
                        off = off * img[d] + y;
                    }
                    if (inside) acc[off] += kiln_get_f64(X->dtype, X->data, row + l);
                }
            }
            for (int64_t i = 0; i < isz; i++)
                kiln_set_f64(Y->dtype, Y->data, (b * C + c) * isz + i, acc[i]);
        }
    free(acc);
    return KILN_OK;
}

KILN_REF_OP(Col2Im, col2im_infer, col2im_run);
