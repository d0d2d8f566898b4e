/*
 * conv.c - reference kernels for convolutions: Conv, ConvTranspose,
 * ConvInteger and QLinearConv, plus kiln_window_resolve, the window
 * geometry (kernel, strides, dilations, pads, auto_pad) shared with pool.c.
 *
 * float32 Conv is im2col + kiln_f32_gemm_ref per image and group; a 1x1
 * conv with unit strides and no padding skips im2col, and a depthwise conv
 * (one input and one output channel per group) accumulates shifted input
 * rows directly. float32 ConvTranspose is the adjoint: a GEMM with the
 * weights transposed, then col2im. Every other dtype, and the integer
 * convs (exact in double: 8-bit products summed), convert to double and
 * run the same direct accumulation.
 *
 * A conv_geom describes both directions: the "image" side is the conv's
 * input (ConvTranspose's output) and the "column" side the conv's output
 * (ConvTranspose's input); image position = column position * stride -
 * pad + kernel offset * dilation.
 */
#include <stdlib.h>

#include "kernels/kernel.h"
#include "kernels/ref/gemm.h"

/* ---- window attributes ---- */

enum auto_pad { AUTO_PAD_NOTSET, AUTO_PAD_SAME_UPPER, AUTO_PAD_SAME_LOWER, AUTO_PAD_VALID };

/* The auto_pad attribute ("NOTSET" when absent). */
static kiln_status parse_auto_pad(const struct kiln_node *node, enum auto_pad *out)
{
    const char *s = kiln_attr_str(node, "auto_pad", "NOTSET");
    if (!strcmp(s, "NOTSET") || !s[0]) *out = AUTO_PAD_NOTSET;
    else if (!strcmp(s, "SAME_UPPER")) *out = AUTO_PAD_SAME_UPPER;
    else if (!strcmp(s, "SAME_LOWER")) *out = AUTO_PAD_SAME_LOWER;
    else if (!strcmp(s, "VALID")) *out = AUTO_PAD_VALID;
    else
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "auto_pad '%s' is not valid", s);
    return KILN_OK;
}

/* An INTS attribute with n values in [min, KILN_WINDOW_MAX] (absent or empty: all dflt). */
static kiln_status ints_attr(const struct kiln_node *node, const char *name, int n, int64_t min,
                             int64_t dflt, int64_t *out)
{
    const int64_t *v;
    int count = kiln_attr_ints(node, name, &v);
    if (count <= 0) {
        for (int i = 0; i < n; i++) out[i] = dflt;
        return KILN_OK;
    }
    if (count != n)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s has %d values, expected %d",
                               name, count, n);
    for (int i = 0; i < n; i++) {
        if (v[i] < min || v[i] > KILN_WINDOW_MAX)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "%s[%d] is %lld, must be in [%lld, %lld]", name, i,
                                   (long long)v[i], (long long)min, (long long)KILN_WINDOW_MAX);
        out[i] = v[i];
    }
    return KILN_OK;
}

/* Check a spatial size or kernel size (-1 = unknown) against KILN_WINDOW_MAX. */
static kiln_status check_size(const struct kiln_node *node, const char *what, int dim, int64_t v)
{
    if (v > KILN_WINDOW_MAX)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "%s %lld in spatial dim %d is too large",
                               what, (long long)v, dim);
    return KILN_OK;
}

/* The group attribute, in [1, KILN_WINDOW_MAX]. */
static kiln_status group_attr(const struct kiln_node *node, int64_t *group)
{
    *group = kiln_attr_int(node, "group", 1);
    if (*group < 1 || *group > KILN_WINDOW_MAX)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "group is %lld", (long long)*group);
    return KILN_OK;
}

/* Floor division for a possibly negative numerator and a positive divisor. */
static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

kiln_status kiln_window_resolve(const struct kiln_node *node, int nsp, const int64_t *in,
                                const int64_t *kernel, bool ceil_mode, struct kiln_window *w)
{
    memset(w, 0, sizeof *w);
    if (nsp < 1 || nsp > KILN_MAX_RANK - 2)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "input must have 1 to %d spatial dims, got %d", KILN_MAX_RANK - 2,
                               nsp);
    w->nsp = nsp;
    const int64_t *ks;
    int nks = kiln_attr_ints(node, "kernel_shape", &ks);
    if (nks >= 0 && nks != nsp)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "kernel_shape has %d values, expected %d", nks, nsp);
    for (int i = 0; i < nsp; i++) {
        int64_t k = kernel ? kernel[i] : -1;
        if (nks >= 0) {
            if (ks[i] < 1)
                return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "kernel_shape[%d] is %lld",
                                       i, (long long)ks[i]);
            if (k >= 0 && k != ks[i])
                return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                       "kernel_shape[%d] is %lld but the weights have %lld", i,
                                       (long long)ks[i], (long long)k);
            k = ks[i];
        } else if (!kernel) {
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "kernel_shape is required");
        }
        if (k == 0 || k < -1)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "kernel size %lld in dim %d",
                                   (long long)k, i);
        kiln_status st = check_size(node, "kernel size", i, k);
        if (st == KILN_OK) st = check_size(node, "input size", i, in[i]);
        if (st != KILN_OK) return st;
        w->kernel[i] = k;
        w->in[i] = in[i];
    }
    kiln_status st = ints_attr(node, "strides", nsp, 1, 1, w->stride);
    if (st == KILN_OK) st = ints_attr(node, "dilations", nsp, 1, 1, w->dilation);
    if (st != KILN_OK) return st;
    int64_t pads[2 * KILN_MAX_RANK];
    st = ints_attr(node, "pads", 2 * nsp, 0, 0, pads);
    if (st != KILN_OK) return st;
    enum auto_pad ap;
    st = parse_auto_pad(node, &ap);
    if (st != KILN_OK) return st;

    for (int i = 0; i < nsp; i++) {
        int64_t n = w->in[i], s = w->stride[i];
        w->pad_begin[i] = ap == AUTO_PAD_NOTSET ? pads[i] : 0;
        w->pad_end[i] = ap == AUTO_PAD_NOTSET ? pads[nsp + i] : 0;
        w->out[i] = -1;
        if (n < 0 || w->kernel[i] < 0) continue;
        int64_t span = (w->kernel[i] - 1) * w->dilation[i] + 1; /* dilated kernel extent */
        if (ap == AUTO_PAD_SAME_UPPER || ap == AUTO_PAD_SAME_LOWER) {
            int64_t out = (n + s - 1) / s;
            int64_t total = (out - 1) * s + span - n;
            if (total < 0) total = 0;
            w->pad_begin[i] = ap == AUTO_PAD_SAME_UPPER ? total / 2 : total - total / 2;
            w->pad_end[i] = total - w->pad_begin[i];
            w->out[i] = out;
            continue;
        }
        int64_t room = n + w->pad_begin[i] + w->pad_end[i] - span;
        if (room < 0)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "dim %d: window of %lld does not fit the padded input of %lld",
                                   i, (long long)span, (long long)(room + span));
        int64_t out = (ceil_mode ? (room + s - 1) / s : room / s) + 1;
        /* with ceil_mode the last window must start inside the input or left pad */
        if (ceil_mode && (out - 1) * s >= n + w->pad_begin[i]) out--;
        w->out[i] = out;
    }
    return KILN_OK;
}

/* ---- geometry of one convolution ---- */

struct conv_geom {
    int nsp;                     /* spatial dims */
    int64_t img[KILN_MAX_RANK];  /* image side: Conv input / ConvTranspose output */
    int64_t col[KILN_MAX_RANK];  /* column side: Conv output / ConvTranspose input */
    int64_t kernel[KILN_MAX_RANK];
    int64_t stride[KILN_MAX_RANK];
    int64_t dilation[KILN_MAX_RANK];
    int64_t pad[KILN_MAX_RANK];  /* padding before each image dim */
    int64_t img_size, col_size, kernel_size; /* element counts of one plane / kernel */
    int64_t batch, group;
    int64_t img_ch, col_ch;      /* channels on each side (all groups) */
};

/* Fill the element counts of g from its dims. */
static void geom_finish(struct conv_geom *g)
{
    g->img_size = kiln_shape_count(g->nsp, g->img);
    g->col_size = kiln_shape_count(g->nsp, g->col);
    g->kernel_size = kiln_shape_count(g->nsp, g->kernel);
}

/* Split a kernel index into per-dim offsets. */
static void kernel_offsets(const struct conv_geom *g, int64_t kidx, int64_t *kp)
{
    for (int d = g->nsp - 1; d >= 0; d--) {
        kp[d] = kidx % g->kernel[d];
        kidx /= g->kernel[d];
    }
}

/*
 * For kernel offset kp and column-side row r (a position over all column
 * dims but the last), the image-plane offset of the image row it reads, or
 * -1 if that row lies in the padding.
 */
static int64_t image_row(const struct conv_geom *g, const int64_t *kp, int64_t r)
{
    int64_t off = 0, scale = g->img[g->nsp - 1];
    for (int d = g->nsp - 2; d >= 0; d--) {
        int64_t o = r % g->col[d];
        r /= g->col[d];
        int64_t i = o * g->stride[d] - g->pad[d] + kp[d] * g->dilation[d];
        if (i < 0 || i >= g->img[d]) return -1;
        off += i * scale;
        scale *= g->img[d];
    }
    return off;
}

/*
 * Along the last dim, column position o reads image position o * stride +
 * shift. Set [lo, hi) to the column positions whose image position is
 * inside the image.
 */
static void last_dim_range(const struct conv_geom *g, int64_t shift, int64_t *lo, int64_t *hi)
{
    int L = g->nsp - 1;
    int64_t s = g->stride[L], n_img = g->img[L], n_col = g->col[L];
    int64_t a = shift >= 0 ? 0 : (-shift + s - 1) / s;
    int64_t b = n_img - shift <= 0 ? 0 : (n_img - shift - 1) / s + 1;
    if (b > n_col) b = n_col;
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

/* Shift of the last dim for kernel offsets kp (see last_dim_range). */
static int64_t last_dim_shift(const struct conv_geom *g, const int64_t *kp)
{
    int L = g->nsp - 1;
    return kp[L] * g->dilation[L] - g->pad[L];
}

/* im2col for one group: col[(c * kernel_size + kidx) * col_size + pos] = image value or 0. */
static void im2col_f32(const struct conv_geom *g, const float *img, int64_t channels, float *col)
{
    if (!g->col_size) return; /* an empty output: nothing to gather or scatter */
    int64_t rows = g->col_size / g->col[g->nsp - 1], width = g->col[g->nsp - 1];
    int64_t s = g->stride[g->nsp - 1];
    int64_t kp[KILN_MAX_RANK];
    for (int64_t c = 0; c < channels; c++) {
        const float *plane = img + c * g->img_size;
        for (int64_t kidx = 0; kidx < g->kernel_size; kidx++) {
            kernel_offsets(g, kidx, kp);
            int64_t shift = last_dim_shift(g, kp), lo, hi;
            last_dim_range(g, shift, &lo, &hi);
            float *dst = col + (c * g->kernel_size + kidx) * g->col_size;
            for (int64_t r = 0; r < rows; r++, dst += width) {
                int64_t base = image_row(g, kp, r);
                if (base < 0) {
                    memset(dst, 0, sizeof(float) * (size_t)width);
                    continue;
                }
                const float *src = plane + base + shift;
                for (int64_t o = 0; o < lo; o++) dst[o] = 0.0f;
                if (s == 1)
                    memcpy(dst + lo, src + lo, sizeof(float) * (size_t)(hi - lo));
                else
                    for (int64_t o = lo; o < hi; o++) dst[o] = src[o * s];
                for (int64_t o = hi; o < width; o++) dst[o] = 0.0f;
            }
        }
    }
}

/* col_plane += wv * (image plane shifted by kernel offset kidx), one column-side plane. */
static void accum_f32(const struct conv_geom *g, const float *img, int64_t kidx, float wv,
                      float *col)
{
    if (!g->col_size) return; /* an empty output: nothing to gather or scatter */
    int64_t rows = g->col_size / g->col[g->nsp - 1], width = g->col[g->nsp - 1];
    int64_t s = g->stride[g->nsp - 1];
    int64_t kp[KILN_MAX_RANK];
    kernel_offsets(g, kidx, kp);
    int64_t shift = last_dim_shift(g, kp), lo, hi;
    last_dim_range(g, shift, &lo, &hi);
    for (int64_t r = 0; r < rows; r++, col += width) {
        int64_t base = image_row(g, kp, r);
        if (base < 0) continue;
        const float *src = img + base + shift;
        for (int64_t o = lo; o < hi; o++) col[o] += wv * src[o * s];
    }
}

/* Double version of accum_f32. */
static void accum_f64(const struct conv_geom *g, const double *img, int64_t kidx, double wv,
                      double *col)
{
    if (!g->col_size) return; /* an empty output: nothing to gather or scatter */
    int64_t rows = g->col_size / g->col[g->nsp - 1], width = g->col[g->nsp - 1];
    int64_t s = g->stride[g->nsp - 1];
    int64_t kp[KILN_MAX_RANK];
    kernel_offsets(g, kidx, kp);
    int64_t shift = last_dim_shift(g, kp), lo, hi;
    last_dim_range(g, shift, &lo, &hi);
    for (int64_t r = 0; r < rows; r++, col += width) {
        int64_t base = image_row(g, kp, r);
        if (base < 0) continue;
        const double *src = img + base + shift;
        for (int64_t o = lo; o < hi; o++) col[o] += wv * src[o * s];
    }
}

/* The adjoint of accum_f32: image plane (shifted by kidx) += wv * column-side plane. */
static void accum_t_f32(const struct conv_geom *g, const float *col, int64_t kidx, float wv,
                        float *img)
{
    if (!g->col_size) return; /* an empty output: nothing to gather or scatter */
    int64_t rows = g->col_size / g->col[g->nsp - 1], width = g->col[g->nsp - 1];
    int64_t s = g->stride[g->nsp - 1];
    int64_t kp[KILN_MAX_RANK];
    kernel_offsets(g, kidx, kp);
    int64_t shift = last_dim_shift(g, kp), lo, hi;
    last_dim_range(g, shift, &lo, &hi);
    for (int64_t r = 0; r < rows; r++, col += width) {
        int64_t base = image_row(g, kp, r);
        if (base < 0) continue;
        float *dst = img + base + shift;
        for (int64_t o = lo; o < hi; o++) dst[o * s] += wv * col[o];
    }
}

/* Double version of accum_t_f32. */
static void accum_t_f64(const struct conv_geom *g, const double *col, int64_t kidx, double wv,
                        double *img)
{
    if (!g->col_size) return; /* an empty output: nothing to gather or scatter */
    int64_t rows = g->col_size / g->col[g->nsp - 1], width = g->col[g->nsp - 1];
    int64_t s = g->stride[g->nsp - 1];
    int64_t kp[KILN_MAX_RANK];
    kernel_offsets(g, kidx, kp);
    int64_t shift = last_dim_shift(g, kp), lo, hi;
    last_dim_range(g, shift, &lo, &hi);
    for (int64_t r = 0; r < rows; r++, col += width) {
        int64_t base = image_row(g, kp, r);
        if (base < 0) continue;
        double *dst = img + base + shift;
        for (int64_t o = lo; o < hi; o++) dst[o * s] += wv * col[o];
    }
}

/* ---- Conv geometry from a node ---- */

/*
 * Shape rule shared by Conv, ConvInteger and QLinearConv: X [N, C, D...],
 * W [M, C/group, K...] -> [N, M, O...]. Unknown parts stay unknown.
 */
static kiln_status conv_infer_type(const struct kiln_node *node, const struct kiln_type *x,
                                   const struct kiln_type *w, struct kiln_type *out)
{
    int rank = x && x->rank >= 0 ? x->rank : w && w->rank >= 0 ? w->rank : -1;
    out->rank = -1;
    if (rank < 0) return KILN_OK;
    if (rank < 3)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "X must have rank >= 3 (N, C, spatial), got %d", rank);
    if (x && w && x->rank >= 0 && w->rank >= 0 && x->rank != w->rank)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "X has rank %d but W has rank %d",
                               x->rank, w->rank);
    int64_t group;
    kiln_status st = group_attr(node, &group);
    if (st != KILN_OK) return st;
    bool xk = x && x->rank >= 0, wk = w && w->rank >= 0;
    int64_t in[KILN_MAX_RANK], ker[KILN_MAX_RANK];
    for (int i = 0; i < rank - 2; i++) {
        in[i] = xk ? x->dims[i + 2] : -1;
        ker[i] = wk ? w->dims[i + 2] : -1;
    }
    if (xk && wk && x->dims[1] >= 0 && w->dims[1] >= 0 &&
        (x->dims[1] % group != 0 || x->dims[1] / group != w->dims[1]))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "X has %lld channels but W expects %lld x group %lld",
                               (long long)x->dims[1], (long long)w->dims[1], (long long)group);
    if (wk && w->dims[0] >= 0 && w->dims[0] % group != 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "W has %lld output channels, not a multiple of group %lld",
                               (long long)w->dims[0], (long long)group);
    struct kiln_window win;
    st = kiln_window_resolve(node, rank - 2, in, ker, false, &win);
    if (st != KILN_OK) return st;
    out->rank = rank;
    out->dims[0] = xk ? x->dims[0] : -1;
    out->sym[0] = xk ? x->sym[0] : NULL;
    out->dims[1] = wk ? w->dims[0] : -1;
    out->sym[1] = NULL;
    for (int i = 0; i < rank - 2; i++) {
        out->dims[i + 2] = win.out[i];
        out->sym[i + 2] = NULL;
        if (xk && win.out[i] >= 0 && win.out[i] == x->dims[i + 2] && x->sym[i + 2])
            out->sym[i + 2] = x->sym[i + 2];
    }
    return KILN_OK;
}

/* Build the geometry of a concrete Conv-like node (X image side, Y column side). */
static kiln_status conv_geom_init(const struct kiln_node *node, const kiln_tensor *x,
                                  const kiln_tensor *w, struct conv_geom *g)
{
    memset(g, 0, sizeof *g);
    if (x->rank < 3 || w->rank != x->rank)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "X (rank %d) and W (rank %d) must have the same rank >= 3",
                               x->rank, w->rank);
    kiln_status st = group_attr(node, &g->group);
    if (st != KILN_OK) return st;
    g->nsp = x->rank - 2;
    g->batch = x->dims[0];
    g->img_ch = x->dims[1];
    g->col_ch = w->dims[0];
    if (g->img_ch % g->group != 0 || g->img_ch / g->group != w->dims[1] ||
        g->col_ch % g->group != 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "channels do not fit: X has %lld, W is [%lld, %lld, ...], group "
                               "%lld",
                               (long long)g->img_ch, (long long)w->dims[0],
                               (long long)w->dims[1], (long long)g->group);
    struct kiln_window win;
    st = kiln_window_resolve(node, g->nsp, x->dims + 2, w->dims + 2, false, &win);
    if (st != KILN_OK) return st;
    for (int i = 0; i < g->nsp; i++) {
        g->img[i] = x->dims[i + 2];
        g->col[i] = win.out[i];
        g->kernel[i] = win.kernel[i];
        g->stride[i] = win.stride[i];
        g->dilation[i] = win.dilation[i];
        g->pad[i] = win.pad_begin[i];
    }
    geom_finish(g);
    return KILN_OK;
}

/* Check an optional bias: 1-D with one value per output channel. */
static kiln_status check_bias(const struct kiln_node *node, const kiln_tensor *b, int64_t m)
{
    if (b && (b->rank != 1 || b->dims[0] != m))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "bias must be 1-D with %lld values", (long long)m);
    return KILN_OK;
}

/* ---- float32 Conv ---- */

/* Y = conv(X, W) + B for float32, by im2col + GEMM (direct for depthwise). */
static kiln_status conv_f32(const struct conv_geom *g, const float *x, const float *w,
                            const float *bias, float *y)
{
    int64_t cg = g->img_ch / g->group, mg = g->col_ch / g->group;
    int64_t kdim = cg * g->kernel_size;
    bool depthwise = cg == 1 && mg == 1;
    bool pointwise = true;
    for (int i = 0; i < g->nsp; i++)
        if (g->kernel[i] != 1 || g->stride[i] != 1 || g->pad[i] != 0 || g->img[i] != g->col[i])
            pointwise = false;
    float *col = NULL;
    if (!depthwise && !pointwise) {
        col = malloc(sizeof(float) * (size_t)(kdim * g->col_size + 1));
        if (!col) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "Conv: out of memory for im2col");
    }
    kiln_status st = KILN_OK;
    for (int64_t n = 0; n < g->batch && st == KILN_OK; n++) {
        for (int64_t gi = 0; gi < g->group && st == KILN_OK; gi++) {
            const float *xg = x + (n * g->img_ch + gi * cg) * g->img_size;
            const float *wg = w + gi * mg * kdim;
            float *yg = y + (n * g->col_ch + gi * mg) * g->col_size;
            if (depthwise) {
                for (int64_t i = 0; i < g->col_size; i++) yg[i] = 0.0f;
                for (int64_t kidx = 0; kidx < g->kernel_size; kidx++)
                    accum_f32(g, xg, kidx, wg[kidx], yg);
                continue;
            }
            const float *b = xg;
            if (!pointwise) {
                im2col_f32(g, xg, cg, col);
                b = col;
            }
            st = kiln_f32_gemm_ref(false, false, mg, g->col_size, kdim, 1.0f, wg, kdim, b,
                                   g->col_size, 0.0f, yg, g->col_size);
        }
    }
    free(col);
    if (st == KILN_OK && bias)
        for (int64_t n = 0; n < g->batch; n++)
            for (int64_t m = 0; m < g->col_ch; m++) {
                float *ym = y + (n * g->col_ch + m) * g->col_size;
                for (int64_t i = 0; i < g->col_size; i++) ym[i] += bias[m];
            }
    return st;
}

/* Y = conv(X, W) in double by direct accumulation (bias not included). */
static void conv_f64(const struct conv_geom *g, const double *x, const double *w, double *y)
{
    int64_t cg = g->img_ch / g->group, mg = g->col_ch / g->group;
    memset(y, 0, sizeof(double) * (size_t)(g->batch * g->col_ch * g->col_size));
    for (int64_t n = 0; n < g->batch; n++)
        for (int64_t m = 0; m < g->col_ch; m++) {
            int64_t gi = m / mg;
            double *ym = y + (n * g->col_ch + m) * g->col_size;
            for (int64_t c = 0; c < cg; c++) {
                const double *xc = x + (n * g->img_ch + gi * cg + c) * g->img_size;
                const double *wc = w + (m * cg + c) * g->kernel_size;
                for (int64_t kidx = 0; kidx < g->kernel_size; kidx++)
                    if (wc[kidx] != 0.0) accum_f64(g, xc, kidx, wc[kidx], ym);
            }
        }
}

/* A tensor's elements as doubles, minus an optional zero point (malloc'd; NULL on OOM).
 * zp holds one value, or one per index of dim 0 (per output channel of W). */
static double *to_f64(const kiln_tensor *t, const kiln_tensor *zp)
{
    int64_t count = kiln_tensor_count(t);
    double *d = malloc(sizeof(double) * (size_t)(count + 1));
    if (!d) return NULL;
    int64_t nzp = zp ? kiln_tensor_count(zp) : 0;
    int64_t per = t->rank > 0 && t->dims[0] > 0 ? count / t->dims[0] : 1;
    for (int64_t i = 0; i < count; i++) {
        double v = kiln_get_f64(t->dtype, t->data, i);
        if (nzp == 1) v -= kiln_get_f64(zp->dtype, zp->data, 0);
        else if (nzp > 1) v -= kiln_get_f64(zp->dtype, zp->data, i / per);
        d[i] = v;
    }
    return d;
}

static kiln_status conv_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    kiln_type_unknown(ctx->out[0]);
    kiln_dtype dt = ctx->in[0] ? ctx->in[0]->dtype : KILN_DTYPE_UNDEFINED;
    kiln_status st = conv_infer_type(ctx->node, ctx->in[0], ctx->in[1], ctx->out[0]);
    ctx->out[0]->dtype = dt;
    return st;
}

static kiln_status conv_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0], *w = ctx->in[1];
    const kiln_tensor *b = ctx->n_in > 2 ? ctx->in[2] : NULL;
    kiln_tensor *y = ctx->out[0];
    if (!kiln_dtype_is_float(x->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "dtype %s is not supported",
                               kiln_dtype_name(x->dtype));
    if (w->dtype != x->dtype || (b && b->dtype != x->dtype))
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "X, W and B differ in dtype");
    struct conv_geom g;
    kiln_status st = conv_geom_init(node, x, w, &g);
    if (st == KILN_OK) st = check_bias(node, b, g.col_ch);
    if (st != KILN_OK) return st;
    if (x->dtype == KILN_DTYPE_F32)
        return conv_f32(&g, x->data, w->data, b ? b->data : NULL, y->data);

    double *xd = to_f64(x, NULL), *wd = to_f64(w, NULL);
    int64_t ny = kiln_tensor_count(y);
    double *yd = malloc(sizeof(double) * (size_t)(ny + 1));
    if (!xd || !wd || !yd) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "Conv: out of memory");
        goto out;
    }
    conv_f64(&g, xd, wd, yd);
    for (int64_t i = 0; i < ny; i++) {
        double v = yd[i];
        if (b) v += kiln_get_f64(b->dtype, b->data, (i / g.col_size) % g.col_ch);
        kiln_set_f64(y->dtype, y->data, i, v);
    }
out:
    free(xd);
    free(wd);
    free(yd);
    return st;
}

KILN_REF_OP(Conv, conv_infer, conv_run);

/* ---- ConvTranspose ---- */

/*
 * ConvTranspose geometry for input dims in (-1 = unknown) and kernel ker:
 * output size and begin pads per dim, following the ONNX reference: explicit
 * pads (default 0) unless auto_pad is SAME_*, where output = input * stride
 * (or output_shape) and the pads split the total (SAME_UPPER: less before).
 */
kiln_status kiln_convt_window(const struct kiln_node *node, int nsp, const int64_t *in,
                              const int64_t *ker, int64_t *out, int64_t *pad_begin,
                              int64_t *stride, int64_t *dil)
{
    if (nsp < 1 || nsp > KILN_MAX_RANK - 2)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "input must have 1 to %d spatial dims, got %d", KILN_MAX_RANK - 2,
                               nsp);
    int64_t k[KILN_MAX_RANK], opad[KILN_MAX_RANK], pads[2 * KILN_MAX_RANK];
    const int64_t *ks;
    int nks = kiln_attr_ints(node, "kernel_shape", &ks);
    if (nks >= 0 && nks != nsp)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "kernel_shape has %d values, expected %d", nks, nsp);
    for (int i = 0; i < nsp; i++) {
        if (nks >= 0 && ks[i] < 1)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "kernel_shape[%d] is %lld", i,
                                   (long long)ks[i]);
        k[i] = ker[i] >= 0 ? ker[i] : nks >= 0 ? ks[i] : -1;
        kiln_status st = check_size(node, "kernel size", i, k[i]);
        if (st == KILN_OK) st = check_size(node, "input size", i, in[i]);
        if (st != KILN_OK) return st;
        if (k[i] == 0 || k[i] < -1)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "kernel size %lld in dim %d",
                                   (long long)k[i], i);
        if (nks >= 0 && ker[i] >= 0 && ks[i] != ker[i])
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "kernel_shape[%d] is %lld but the weights have %lld", i,
                                   (long long)ks[i], (long long)ker[i]);
    }
    kiln_status st = ints_attr(node, "strides", nsp, 1, 1, stride);
    if (st == KILN_OK) st = ints_attr(node, "dilations", nsp, 1, 1, dil);
    if (st == KILN_OK) st = ints_attr(node, "output_padding", nsp, 0, 0, opad);
    if (st == KILN_OK) st = ints_attr(node, "pads", 2 * nsp, 0, 0, pads);
    if (st != KILN_OK) return st;
    enum auto_pad ap;
    st = parse_auto_pad(node, &ap);
    if (st != KILN_OK) return st;
    const int64_t *os;
    int nos = kiln_attr_ints(node, "output_shape", &os);
    if (nos > 0 && nos != nsp && nos != nsp + 2)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "output_shape has %d values, expected %d", nos, nsp);
    if (nos == nsp + 2) os += 2;
    bool same = ap == AUTO_PAD_SAME_UPPER || ap == AUTO_PAD_SAME_LOWER;
    for (int i = 0; i < nsp; i++) {
        out[i] = -1;
        pad_begin[i] = same ? 0 : pads[i];
        if (nos > 0 && (os[i] < 0 || os[i] > KILN_WINDOW_MAX))
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "output_shape[%d] is %lld", i,
                                   (long long)os[i]);
        if (in[i] < 0 || k[i] < 0) {
            if (nos > 0) out[i] = os[i];
            continue;
        }
        int64_t natural = stride[i] * (in[i] - 1) + opad[i] + (k[i] - 1) * dil[i] + 1;
        if (same) {
            out[i] = nos > 0 ? os[i] : in[i] * stride[i];
            int64_t total = natural - out[i];
            pad_begin[i] = ap == AUTO_PAD_SAME_UPPER ? floor_div(total, 2)
                                                     : total - floor_div(total, 2);
        } else {
            out[i] = nos > 0 ? os[i] : natural - pads[i] - pads[nsp + i];
        }
        if (out[i] < 0)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "dim %d: output size %lld is negative", i, (long long)out[i]);
    }
    return KILN_OK;
}

static kiln_status convt_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    const struct kiln_node *node = ctx->node;
    const struct kiln_type *x = ctx->in[0], *w = ctx->in[1];
    struct kiln_type *out = ctx->out[0];
    kiln_type_unknown(out);
    out->dtype = x ? x->dtype : KILN_DTYPE_UNDEFINED;
    int rank = x && x->rank >= 0 ? x->rank : w && w->rank >= 0 ? w->rank : -1;
    if (rank < 0) return KILN_OK;
    if (rank < 3)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "X must have rank >= 3 (N, C, spatial), got %d", rank);
    bool xk = x && x->rank >= 0, wk = w && w->rank >= 0;
    if (xk && wk && x->rank != w->rank)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "X has rank %d but W has rank %d",
                               x->rank, w->rank);
    int64_t group;
    kiln_status st = group_attr(node, &group);
    if (st != KILN_OK) return st;
    if (xk && wk && x->dims[1] >= 0 && w->dims[0] >= 0 && x->dims[1] != w->dims[0])
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "X has %lld channels but W has %lld", (long long)x->dims[1],
                               (long long)w->dims[0]);
    int64_t in[KILN_MAX_RANK], ker[KILN_MAX_RANK], o[KILN_MAX_RANK], pb[KILN_MAX_RANK];
    int64_t s[KILN_MAX_RANK], d[KILN_MAX_RANK];
    for (int i = 0; i < rank - 2; i++) {
        in[i] = xk ? x->dims[i + 2] : -1;
        ker[i] = wk ? w->dims[i + 2] : -1;
    }
    st = kiln_convt_window(node, rank - 2, in, ker, o, pb, s, d);
    if (st != KILN_OK) return st;
    out->rank = rank;
    out->dims[0] = xk ? x->dims[0] : -1;
    out->sym[0] = xk ? x->sym[0] : NULL;
    bool m_known = wk && w->dims[1] >= 0 && w->dims[1] <= KILN_WINDOW_MAX;
    out->dims[1] = m_known ? w->dims[1] * group : -1;
    for (int i = 0; i < rank - 2; i++) out->dims[i + 2] = o[i];
    return KILN_OK;
}

static kiln_status convt_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0], *w = ctx->in[1];
    const kiln_tensor *b = ctx->n_in > 2 ? ctx->in[2] : NULL;
    kiln_tensor *y = ctx->out[0];
    if (!kiln_dtype_is_float(x->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "dtype %s is not supported",
                               kiln_dtype_name(x->dtype));
    if (w->dtype != x->dtype || (b && b->dtype != x->dtype))
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "X, W and B differ in dtype");
    if (x->rank < 3 || w->rank != x->rank)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "X (rank %d) and W (rank %d) must have the same rank >= 3",
                               x->rank, w->rank);
    /* the conv geometry with sides swapped: Y is the image, X the columns */
    struct conv_geom g;
    memset(&g, 0, sizeof g);
    g.nsp = x->rank - 2;
    kiln_status st = group_attr(node, &g.group);
    if (st != KILN_OK) return st;
    g.batch = x->dims[0];
    int64_t c = x->dims[1];
    if (w->dims[0] != c || c % g.group != 0 || w->dims[1] > KILN_WINDOW_MAX)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "channels do not fit: X has %lld, W is [%lld, %lld, ...], group "
                               "%lld",
                               (long long)c, (long long)w->dims[0], (long long)w->dims[1],
                               (long long)g.group);
    g.col_ch = c;
    g.img_ch = w->dims[1] * g.group;
    st = kiln_convt_window(node, g.nsp, x->dims + 2, w->dims + 2, g.img, g.pad, g.stride,
                           g.dilation);
    if (st == KILN_OK) st = check_bias(node, b, g.img_ch);
    if (st != KILN_OK) return st;
    for (int i = 0; i < g.nsp; i++) {
        g.col[i] = x->dims[i + 2];
        g.kernel[i] = w->dims[i + 2];
        if (y->dims[i + 2] != g.img[i])
            return kiln_node_error(node, KILN_ERR_INTERNAL, "output dim %d is %lld, expected %lld",
                                   i, (long long)y->dims[i + 2], (long long)g.img[i]);
    }
    geom_finish(&g);
    int64_t cg = c / g.group, mg = g.img_ch / g.group;
    int64_t rows = mg * g.kernel_size; /* rows of the column matrix of one group */

    if (x->dtype == KILN_DTYPE_F32) {
        const float *xd = x->data, *wd = w->data;
        float *yd = y->data;
        float *col = malloc(sizeof(float) * (size_t)(rows * g.col_size + 1));
        if (!col) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "ConvTranspose: out of memory");
        memset(yd, 0, sizeof(float) * (size_t)kiln_tensor_count(y));
        for (int64_t n = 0; n < g.batch && st == KILN_OK; n++)
            for (int64_t gi = 0; gi < g.group && st == KILN_OK; gi++) {
                /* col[rows x positions] = W_g^T [rows x cg] * X_g [cg x positions] */
                st = kiln_f32_gemm_ref(true, false, rows, g.col_size, cg, 1.0f,
                                       wd + gi * cg * rows, rows,
                                       xd + (n * c + gi * cg) * g.col_size, g.col_size, 0.0f,
                                       col, g.col_size);
                if (st != KILN_OK) break;
                for (int64_t r = 0; r < rows; r++) {
                    int64_t m = gi * mg + r / g.kernel_size;
                    accum_t_f32(&g, col + r * g.col_size, r % g.kernel_size, 1.0f,
                                yd + (n * g.img_ch + m) * g.img_size);
                }
            }
        free(col);
        if (st == KILN_OK && b)
            for (int64_t i = 0; i < kiln_tensor_count(y); i++)
                yd[i] += ((const float *)b->data)[(i / g.img_size) % g.img_ch];
        return st;
    }

    double *xd = to_f64(x, NULL), *wd = to_f64(w, NULL);
    int64_t ny = kiln_tensor_count(y);
    double *yd = calloc((size_t)ny + 1, sizeof(double));
    if (!xd || !wd || !yd) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "ConvTranspose: out of memory");
        goto out;
    }
    for (int64_t n = 0; n < g.batch; n++)
        for (int64_t ci = 0; ci < c; ci++) {
            int64_t gi = ci / cg;
            const double *xc = xd + (n * c + ci) * g.col_size;
            for (int64_t mi = 0; mi < mg; mi++) {
                const double *wk = wd + (ci * mg + mi) * g.kernel_size;
                double *ym = yd + (n * g.img_ch + gi * mg + mi) * g.img_size;
                for (int64_t kidx = 0; kidx < g.kernel_size; kidx++)
                    if (wk[kidx] != 0.0) accum_t_f64(&g, xc, kidx, wk[kidx], ym);
            }
        }
    for (int64_t i = 0; i < ny; i++) {
        double v = yd[i];
        if (b) v += kiln_get_f64(b->dtype, b->data, (i / g.img_size) % g.img_ch);
        kiln_set_f64(y->dtype, y->data, i, v);
    }
out:
    free(xd);
    free(wd);
    free(yd);
    return st;
}

KILN_REF_OP(ConvTranspose, convt_infer, convt_run);

/* ---- ConvInteger and QLinearConv ---- */

static kiln_status conv_integer_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    kiln_type_unknown(ctx->out[0]);
    kiln_status st = conv_infer_type(ctx->node, ctx->in[0], ctx->in[1], ctx->out[0]);
    ctx->out[0]->dtype = KILN_DTYPE_I32;
    return st;
}

static kiln_status qlinear_conv_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    kiln_type_unknown(ctx->out[0]);
    kiln_status st = conv_infer_type(ctx->node, ctx->in[0], ctx->in[3], ctx->out[0]);
    ctx->out[0]->dtype = ctx->in[7]   ? ctx->in[7]->dtype
                         : ctx->in[0] ? ctx->in[0]->dtype
                                      : KILN_DTYPE_UNDEFINED;
    return st;
}

/* Check a zero point or scale: one value, or (when per_channel) one per output channel m. */
static kiln_status check_quant_param(const struct kiln_node *node, const char *what,
                                     const kiln_tensor *t, bool per_channel, int64_t m)
{
    if (!t) return KILN_OK;
    int64_t n = kiln_tensor_count(t);
    if (n == 1 || (per_channel && t->rank == 1 && n == m)) return KILN_OK;
    return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                           "%s has %lld values, expected 1%s", what, (long long)n,
                           per_channel ? " or one per output channel" : "");
}

/* The exact integer conv of (x - x_zp) and (w - w_zp) in double, plus an int32 bias. */
static kiln_status conv_integer_acc(const struct kiln_node *node, const kiln_tensor *x,
                                    const kiln_tensor *xzp, const kiln_tensor *w,
                                    const kiln_tensor *wzp, const kiln_tensor *b,
                                    struct conv_geom *g, double **acc)
{
    *acc = NULL;
    if ((x->dtype != KILN_DTYPE_U8 && x->dtype != KILN_DTYPE_I8) ||
        (w->dtype != KILN_DTYPE_U8 && w->dtype != KILN_DTYPE_I8))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                               "x and w must be int8 or uint8, got %s and %s",
                               kiln_dtype_name(x->dtype), kiln_dtype_name(w->dtype));
    kiln_status st = conv_geom_init(node, x, w, g);
    if (st == KILN_OK) st = check_quant_param(node, "x zero point", xzp, false, g->col_ch);
    if (st == KILN_OK) st = check_quant_param(node, "w zero point", wzp, true, g->col_ch);
    if (st == KILN_OK) st = check_bias(node, b, g->col_ch);
    if (st != KILN_OK) return st;
    double *xd = to_f64(x, xzp), *wd = to_f64(w, wzp);
    double *yd = malloc(sizeof(double) * (size_t)(g->batch * g->col_ch * g->col_size + 1));
    if (!xd || !wd || !yd) {
        free(xd);
        free(wd);
        free(yd);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    conv_f64(g, xd, wd, yd);
    if (b)
        for (int64_t i = 0; i < g->batch * g->col_ch * g->col_size; i++)
            yd[i] += (double)kiln_get_i64(b->dtype, b->data, (i / g->col_size) % g->col_ch);
    free(xd);
    free(wd);
    *acc = yd;
    return KILN_OK;
}

static kiln_status conv_integer_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *xzp = ctx->n_in > 2 ? ctx->in[2] : NULL;
    const kiln_tensor *wzp = ctx->n_in > 3 ? ctx->in[3] : NULL;
    struct conv_geom g;
    double *acc;
    kiln_status st = conv_integer_acc(ctx->node, ctx->in[0], xzp, ctx->in[1], wzp, NULL, &g, &acc);
    if (st != KILN_OK) return st;
    int32_t *y = ctx->out[0]->data;
    for (int64_t i = 0; i < kiln_tensor_count(ctx->out[0]); i++)
        y[i] = (int32_t)(uint32_t)(int64_t)acc[i];
    free(acc);
    return KILN_OK;
}

KILN_REF_OP(ConvInteger, conv_integer_infer, conv_integer_run);

static kiln_status qlinear_conv_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x_scale = ctx->in[1], *w_scale = ctx->in[4], *y_scale = ctx->in[6];
    const kiln_tensor *yzp = ctx->in[7], *b = ctx->n_in > 8 ? ctx->in[8] : NULL;
    kiln_tensor *y = ctx->out[0];
    if (!x_scale || !w_scale || !y_scale)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "scales are required");
    if (y->dtype != KILN_DTYPE_U8 && y->dtype != KILN_DTYPE_I8)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "output dtype %s is not supported",
                               kiln_dtype_name(y->dtype));
    if (b && b->dtype != KILN_DTYPE_I32)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "bias must be int32, got %s",
                               kiln_dtype_name(b->dtype));
    struct conv_geom g;
    double *acc;
    kiln_status st = conv_integer_acc(node, ctx->in[0], ctx->in[2], ctx->in[3], ctx->in[5], b, &g,
                                      &acc);
    if (st == KILN_OK) st = check_quant_param(node, "x_scale", x_scale, false, g.col_ch);
    if (st == KILN_OK) st = check_quant_param(node, "w_scale", w_scale, true, g.col_ch);
    if (st == KILN_OK) st = check_quant_param(node, "y_scale", y_scale, false, g.col_ch);
    if (st == KILN_OK) st = check_quant_param(node, "y zero point", yzp, false, g.col_ch);
    if (st != KILN_OK) {
        free(acc);
        return st;
    }
    /* y = saturate(round_half_even(acc * (x_scale * w_scale / y_scale)) + y_zp); the
     * multiplier in float32 as the reference computes it */
    float xs = (float)kiln_get_f64(x_scale->dtype, x_scale->data, 0);
    float ys = (float)kiln_get_f64(y_scale->dtype, y_scale->data, 0);
    double zp = yzp ? kiln_get_f64(yzp->dtype, yzp->data, 0) : 0.0;
    double lo = y->dtype == KILN_DTYPE_I8 ? -128 : 0, hi = y->dtype == KILN_DTYPE_I8 ? 127 : 255;
    bool per_ch = kiln_tensor_count(w_scale) > 1;
    int64_t ny = kiln_tensor_count(y);
    for (int64_t i = 0; i < ny; i++) {
        int64_t m = (i / g.col_size) % g.col_ch;
        float ws = (float)kiln_get_f64(w_scale->dtype, w_scale->data, per_ch ? m : 0);
        float mult = xs * ws / ys;
        double v = rint(acc[i] * (double)mult) + zp;
        v = v < lo ? lo : v > hi ? hi : v;
        kiln_set_f64(y->dtype, y->data, i, v);
    }
    free(acc);
    return KILN_OK;
}

KILN_REF_OP(QLinearConv, qlinear_conv_infer, qlinear_conv_run);
