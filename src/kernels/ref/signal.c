/*
 * signal.c - reference kernels for ONNX's signal processing ops: DFT, STFT,
 * HannWindow, HammingWindow, BlackmanWindow and MelWeightMatrix.
 *
 * Complex tensors are real tensors whose last dim is 2 (real, imaginary);
 * a last dim of 1 is a real signal. Transforms are the plain O(n^2) sums in
 * double (what numpy.fft computes, to rounding), with angles reduced
 * modulo n before the cosine so long transforms stay accurate.
 *
 * DFT: along `axis` (an attribute before opset 20, default 1; input 2 from
 * opset 20, default -2), the signal is cut or zero-padded to dft_length
 * (input 1, default the axis length). onesided keeps bins 0..n/2 of a
 * forward transform. inverse divides by n; inverse with onesided is an
 * inverse real transform (numpy.fft.irfft): the input holds bins 0..n/2
 * (n defaults to 2 * (len - 1)) and the output is real, last dim 1.
 *
 * Windows and MelWeightMatrix follow the ONNX reference formulas; their
 * output dtype is the output_datatype attribute (default float).
 */
#include <stdlib.h>

#include "kernels/kernel.h"

#define SIGNAL_PI 3.14159265358979323846

/* ---- helpers ---- */

/* Scalar integer input value (any int dtype, one element); false if absent or not one. */
static bool scalar_int(const kiln_tensor *t, int64_t *out)
{
    if (!t || !kiln_dtype_is_int(t->dtype) || kiln_tensor_count(t) != 1) return false;
    *out = kiln_get_i64(t->dtype, t->data, 0);
    return true;
}

/* Scalar numeric input as double; false if absent or not one element. */
static bool scalar_f64(const kiln_tensor *t, double *out)
{
    if (!t || !kiln_dtype_is_numeric(t->dtype) || kiln_tensor_count(t) != 1) return false;
    *out = kiln_get_f64(t->dtype, t->data, 0);
    return true;
}

/* The known value of input i at shape inference, or NULL. */
static const kiln_tensor *in_value(const struct kiln_infer_ctx *ctx, int i)
{
    return i < ctx->n_in ? ctx->in_value[i] : NULL;
}

/* e^(sign * 2 pi i * k / n) for integer k, reduced mod n first. */
static void twiddle(int64_t k, int64_t n, int sign, double *re, double *im)
{
    double a = 2.0 * SIGNAL_PI * (double)(k % n) / (double)n;
    *re = cos(a);
    *im = sign * sin(a);
}

/* out[k] = sum_t in[t] e^(sign 2 pi i k t / n) for k < n_out, t < n_in; complex as (re, im) pairs. */
static void dft_1d(const double *in, int64_t n_in, double *out, int64_t n_out, int64_t n, int sign)
{
    for (int64_t k = 0; k < n_out; k++) {
        double sr = 0, si = 0;
        for (int64_t t = 0; t < n_in; t++) {
            double wr, wi;
            twiddle(k * t % n, n, sign, &wr, &wi);
            sr += in[2 * t] * wr - in[2 * t + 1] * wi;
            si += in[2 * t] * wi + in[2 * t + 1] * wr;
        }
        out[2 * k] = sr;
        out[2 * k + 1] = si;
    }
}

/* ---- Single-precision transforms, as numpy computes them ----
 *
 * The ONNX reference builds complex input as numpy complex64, which numpy 2
 * transforms in single precision with pocketfft's mixed-radix passes (real
 * input it transforms in double), and its outputs carry that rounding: an
 * inverse transform's imaginary parts come out as float32 noise of about
 * 1e-7 rather than 0. For complex float32 / float16 input and lengths that
 * pocketfft factors into radix-2, 3, 4 and 5 passes (no factor 8, no larger
 * prime), Kiln runs the same passes in float, in the same order, so the
 * results match the reference to the rounding; other lengths use the sum in
 * double above. float, not double, is the point here: every operation
 * below rounds to float as pocketfft's do (Kiln builds with -std=c11, so
 * nothing is contracted into fused multiply-adds).
 */

struct cpx {
    float r, i;
};

static struct cpx cpx_add(struct cpx a, struct cpx b) { return (struct cpx){a.r + b.r, a.i + b.i}; }
static struct cpx cpx_sub(struct cpx a, struct cpx b) { return (struct cpx){a.r - b.r, a.i - b.i}; }

/* v * w backward, v * conj(w) forward (pocketfft's special_mul). */
static struct cpx cpx_twmul(struct cpx v, struct cpx w, bool fwd)
{
    if (fwd) return (struct cpx){v.r * w.r + v.i * w.i, v.i * w.r - v.r * w.i};
    return (struct cpx){v.r * w.r - v.i * w.i, v.r * w.i + v.i * w.r};
}

/* a * -i forward, a * i backward (pocketfft's ROTX90). */
static struct cpx cpx_rot90(struct cpx a, bool fwd)
{
    return fwd ? (struct cpx){a.i, -a.r} : (struct cpx){-a.i, a.r};
}

/* pocketfft's factors of n (radix 4 and 2 first, 2 in front), or 0 if a
 * factor other than 2, 3, 4 or 5 is needed. */
static int fft_factors(int64_t n, int *fct)
{
    int nf = 0;
    int64_t len = n;
    if (len % 8 == 0) return 0; /* pocketfft would use a radix-8 pass */
    while (len % 4 == 0) {
        fct[nf++] = 4;
        len /= 4;
    }
    if (len % 2 == 0) {
        len /= 2;
        fct[nf++] = 2;
        int t = fct[0]; /* the factor 2 goes to the front */
        fct[0] = fct[nf - 1];
        fct[nf - 1] = t;
    }
    while (len % 3 == 0) {
        fct[nf++] = 3;
        len /= 3;
    }
    while (len % 5 == 0) {
        fct[nf++] = 5;
        len /= 5;
    }
    return len == 1 ? nf : 0;
}

/* One radix-ip pass (pocketfft's pass2 / pass3 / pass4 / pass5) from cc to ch;
 * tw[(j - 1) * (ido - 1) + i - 1] is the twiddle of leg j at index i. */
static void fft_pass(int ip, int64_t ido, int64_t l1, const struct cpx *cc, struct cpx *ch,
                     const struct cpx *tw, bool fwd)
{
#define CC(a, b, c) cc[(a) + ido * ((b) + ip * (c))]
#define CH(a, b, c) ch[(a) + ido * ((b) + l1 * (c))]
#define WA(x, i) tw[(i) - 1 + (x) * (ido - 1)]
    const float sgn = fwd ? -1.0f : 1.0f;
    for (int64_t k = 0; k < l1; k++) {
        for (int64_t i = 0; i < ido; i++) {
            if (ip == 2) {
                CH(i, k, 0) = cpx_add(CC(i, 0, k), CC(i, 1, k));
                struct cpx d = cpx_sub(CC(i, 0, k), CC(i, 1, k));
                CH(i, k, 1) = i == 0 ? d : cpx_twmul(d, WA(0, i), fwd);
            } else if (ip == 3) {
                const float tw1r = -0.5f, tw1i = sgn * 0.8660254037844386467637231707529362f;
                struct cpx t0 = CC(i, 0, k);
                struct cpx t1 = cpx_add(CC(i, 1, k), CC(i, 2, k));
                struct cpx t2 = cpx_sub(CC(i, 1, k), CC(i, 2, k));
                CH(i, k, 0) = cpx_add(t0, t1);
                struct cpx ca = {t0.r + t1.r * tw1r, t0.i + t1.i * tw1r};
                struct cpx cb = {-t2.i * tw1i, t2.r * tw1i};
                struct cpx u1 = cpx_add(ca, cb), u2 = cpx_sub(ca, cb);
                CH(i, k, 1) = i == 0 ? u1 : cpx_twmul(u1, WA(0, i), fwd);
                CH(i, k, 2) = i == 0 ? u2 : cpx_twmul(u2, WA(1, i), fwd);
            } else if (ip == 4) {
                struct cpx t2 = cpx_add(CC(i, 0, k), CC(i, 2, k));
                struct cpx t1 = cpx_sub(CC(i, 0, k), CC(i, 2, k));
                struct cpx t3 = cpx_add(CC(i, 1, k), CC(i, 3, k));
                struct cpx t4 = cpx_rot90(cpx_sub(CC(i, 1, k), CC(i, 3, k)), fwd);
                CH(i, k, 0) = cpx_add(t2, t3);
                if (i == 0) {
                    CH(i, k, 2) = cpx_sub(t2, t3);
                    CH(i, k, 1) = cpx_add(t1, t4);
                    CH(i, k, 3) = cpx_sub(t1, t4);
                } else {
                    CH(i, k, 1) = cpx_twmul(cpx_add(t1, t4), WA(0, i), fwd);
                    CH(i, k, 2) = cpx_twmul(cpx_sub(t2, t3), WA(1, i), fwd);
                    CH(i, k, 3) = cpx_twmul(cpx_sub(t1, t4), WA(2, i), fwd);
                }
            } else { /* 5 */
                const float tw1r = 0.3090169943749474241022934171828191f,
                            tw1i = sgn * 0.9510565162951535721164393333793821f,
                            tw2r = -0.8090169943749474241022934171828191f,
                            tw2i = sgn * 0.5877852522924731291687059546390728f;
                struct cpx t0 = CC(i, 0, k);
                struct cpx t1 = cpx_add(CC(i, 1, k), CC(i, 4, k));
                struct cpx t4 = cpx_sub(CC(i, 1, k), CC(i, 4, k));
                struct cpx t2 = cpx_add(CC(i, 2, k), CC(i, 3, k));
                struct cpx t3 = cpx_sub(CC(i, 2, k), CC(i, 3, k));
                CH(i, k, 0) = (struct cpx){t0.r + t1.r + t2.r, t0.i + t1.i + t2.i};
                /* legs (1, 4) with (tw1r, tw2r, +tw1i, +tw2i), legs (2, 3) with
                 * (tw2r, tw1r, +tw2i, -tw1i) */
                const float ar[2] = {tw1r, tw2r}, br[2] = {tw2r, tw1r};
                const float ai[2] = {tw1i, tw2i}, bi[2] = {tw2i, -tw1i};
                for (int s = 0; s < 2; s++) {
                    struct cpx ca = {t0.r + ar[s] * t1.r + br[s] * t2.r,
                                     t0.i + ar[s] * t1.i + br[s] * t2.i};
                    struct cpx cb;
                    cb.i = ai[s] * t4.r + bi[s] * t3.r;
                    cb.r = -(ai[s] * t4.i + bi[s] * t3.i);
                    int u1 = 1 + s, u2 = 4 - s;
                    struct cpx p = cpx_add(ca, cb), m = cpx_sub(ca, cb);
                    CH(i, k, u1) = i == 0 ? p : cpx_twmul(p, WA(u1 - 1, i), fwd);
                    CH(i, k, u2) = i == 0 ? m : cpx_twmul(m, WA(u2 - 1, i), fwd);
                }
            }
        }
    }
#undef CC
#undef CH
#undef WA
}

/* In-place complex transform of c[0..n) in float (pocketfft's cfftp), times fct.
 * False (c untouched) when n needs passes Kiln does not mirror. */
static bool fft_f32(struct cpx *c, int64_t n, bool fwd, float fct)
{
    int fct_list[64];
    int nf = n > 1 ? fft_factors(n, fct_list) : 0;
    if (n > 1 && nf == 0) return false;
    struct cpx *ch = malloc(sizeof(struct cpx) * (size_t)n);
    struct cpx *tw = malloc(sizeof(struct cpx) * (size_t)(4 * n + 1));
    if (!ch || !tw) {
        free(ch);
        free(tw);
        return false;
    }
    struct cpx *p1 = c, *p2 = ch;
    int64_t l1 = 1;
    for (int f = 0; f < nf; f++) {
        int ip = fct_list[f];
        int64_t l2 = ip * l1, ido = n / l2;
        for (int j = 1; j < ip; j++) /* twiddles e^(2 pi i m / n), rounded to float */
            for (int64_t i = 1; i < ido; i++) {
                double a = 2.0 * SIGNAL_PI * (double)((j * l1 * i) % n) / (double)n;
                tw[(j - 1) * (ido - 1) + i - 1] = (struct cpx){(float)cos(a), (float)sin(a)};
            }
        fft_pass(ip, ido, l1, p1, p2, tw, fwd);
        struct cpx *t = p1;
        p1 = p2;
        p2 = t;
        l1 = l2;
    }
    if (p1 != c) {
        for (int64_t i = 0; i < n; i++)
            c[i] = fct != 1.0f ? (struct cpx){ch[i].r * fct, ch[i].i * fct} : ch[i];
    } else if (fct != 1.0f) {
        for (int64_t i = 0; i < n; i++) c[i] = (struct cpx){c[i].r * fct, c[i].i * fct};
    }
    free(ch);
    free(tw);
    return true;
}

/* out = the length-n transform of in[0..used) (zero-padded) in float, scaled by
 * 1/n when inverse; false when fft_f32 does not handle n. */
static bool fft_single(const double *in, int64_t used, double *out, int64_t n, bool fwd)
{
    struct cpx *c = malloc(sizeof(struct cpx) * (size_t)n);
    if (!c) return false;
    for (int64_t t = 0; t < n; t++)
        c[t] = t < used ? (struct cpx){(float)in[2 * t], (float)in[2 * t + 1]} : (struct cpx){0, 0};
    bool ok = fft_f32(c, n, fwd, fwd ? 1.0f : (float)(1.0 / (double)n));
    if (ok)
        for (int64_t t = 0; t < n; t++) {
            out[2 * t] = c[t].r;
            out[2 * t + 1] = c[t].i;
        }
    free(c);
    return ok;
}

/* ---- DFT ---- */

/* The signal axis: the 'axis' attribute before opset 20 (default 1), input 2's
 * value from opset 20 (default -2); *axis is -1 while that value is unknown. */
static kiln_status dft_axis(const struct kiln_node *node, int rank, bool have_axis,
                            const kiln_tensor *axis_t, int *axis)
{
    int64_t a;
    *axis = -1;
    if (node->opset >= 20) {
        a = -2;
        if (have_axis && !scalar_int(axis_t, &a)) {
            if (axis_t)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "axis must be a scalar integer");
            return KILN_OK;
        }
    } else {
        a = kiln_attr_int(node, "axis", 1);
    }
    int64_t norm = a < 0 ? a + rank : a;
    if (norm < 0 || norm > rank - 2)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "axis %lld is out of range for an input of rank %d "
                               "(the last dim holds real / imaginary parts)",
                               (long long)a, rank);
    *axis = (int)norm;
    return KILN_OK;
}

/* The transform length: input 1's value, else from the axis length len (twice
 * len - 1 for an inverse one-sided transform); -1 while unknown. */
static kiln_status dft_length(const struct kiln_node *node, int64_t len, bool have_length,
                              const kiln_tensor *length_t, int64_t *n)
{
    *n = -1;
    if (have_length) {
        if (!scalar_int(length_t, n)) {
            *n = -1;
            if (length_t)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "dft_length must be a scalar integer");
            return KILN_OK;
        }
    } else if (len >= 0) {
        bool irfft = kiln_attr_int(node, "inverse", 0) && kiln_attr_int(node, "onesided", 0);
        *n = irfft ? 2 * (len - 1) : len;
    } else {
        return KILN_OK;
    }
    if (*n <= 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "the transform length is %lld", (long long)*n);
    return KILN_OK;
}

static kiln_status dft_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (!ctx->out[0]) return KILN_OK;
    kiln_type_unknown(ctx->out[0]);
    if (!x) return KILN_OK;
    ctx->out[0]->dtype = x->dtype;
    if (x->rank < 0) return KILN_OK;
    if (x->rank < 2)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "input has rank %d, expected at least 2", x->rank);
    bool inverse = kiln_attr_int(ctx->node, "inverse", 0) != 0;
    bool onesided = kiln_attr_int(ctx->node, "onesided", 0) != 0;
    int axis;
    kiln_status st = dft_axis(ctx->node, x->rank, ctx->n_in > 2 && ctx->in[2], in_value(ctx, 2),
                              &axis);
    if (st != KILN_OK) return st;
    struct kiln_type o = *x;
    o.dims[x->rank - 1] = inverse && onesided ? 1 : 2;
    o.sym[x->rank - 1] = NULL;
    if (axis < 0) { /* any dim but the last may change */
        for (int d = 0; d < x->rank - 1; d++) {
            o.dims[d] = -1;
            o.sym[d] = NULL;
        }
    } else {
        int64_t n;
        st = dft_length(ctx->node, x->dims[axis], ctx->n_in > 1 && ctx->in[1], in_value(ctx, 1),
                        &n);
        if (st != KILN_OK) return st;
        if (n >= 0 && onesided && !inverse) n = n / 2 + 1;
        o.dims[axis] = n;
        o.sym[axis] = NULL;
    }
    *ctx->out[0] = o;
    return KILN_OK;
}

static kiln_status dft_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    const struct kiln_node *node = ctx->node;
    if (!kiln_dtype_is_float(x->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "input dtype %s is not supported",
                               kiln_dtype_name(x->dtype));
    int r = x->rank;
    if (r < 2 || (x->dims[r - 1] != 1 && x->dims[r - 1] != 2))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "input's last dim must be 1 (real) or 2 (complex)");
    int axis;
    kiln_status st = dft_axis(node, r, ctx->n_in > 2 && ctx->in[2],
                              ctx->n_in > 2 ? ctx->in[2] : NULL, &axis);
    if (st != KILN_OK) return st;
    int64_t len = x->dims[axis], n;
    st = dft_length(node, len, ctx->n_in > 1 && ctx->in[1], ctx->n_in > 1 ? ctx->in[1] : NULL,
                    &n);
    if (st != KILN_OK) return st;
    bool inverse = kiln_attr_int(node, "inverse", 0) != 0;
    bool onesided = kiln_attr_int(node, "onesided", 0) != 0;
    bool irfft = inverse && onesided;
    int64_t comp = x->dims[r - 1];
    int64_t n_out = onesided && !inverse ? n / 2 + 1 : n;
    int64_t outer = kiln_shape_count(axis, x->dims);
    int64_t inner = kiln_shape_count(r - 2 - axis, x->dims + axis + 1);
    int64_t ocomp = y->dims[r - 1];
    if (y->dims[axis] != n_out || ocomp != (irfft ? 1 : 2))
        return kiln_node_error(node, KILN_ERR_INTERNAL, "output shape does not match");
    double *in = malloc(sizeof(double) * 2 * (size_t)(n > len ? n : len));
    double *out = malloc(sizeof(double) * 2 * (size_t)n);
    if (!in || !out) {
        free(in);
        free(out);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "DFT scratch");
    }
    int64_t used = len < n ? len : n;
    double scale = inverse ? 1.0 / (double)n : 1.0;
    /* the reference transforms complex float32 input as complex64 (in float) and
     * real input in double */
    bool single = x->dtype != KILN_DTYPE_F64 && comp == 2;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            for (int64_t t = 0; t < used; t++) {
                int64_t e = ((o * len + t) * inner + i) * comp;
                in[2 * t] = kiln_get_f64(x->dtype, x->data, e);
                in[2 * t + 1] = comp == 2 ? kiln_get_f64(x->dtype, x->data, e + 1) : 0.0;
            }
            if (irfft) {
                /* rebuild the full spectrum from bins 0..n/2 by conjugate symmetry */
                int64_t half = n / 2 + 1;
                for (int64_t t = used; t < half; t++) in[2 * t] = in[2 * t + 1] = 0;
                for (int64_t t = half; t < n; t++) {
                    in[2 * t] = in[2 * (n - t)];
                    in[2 * t + 1] = -in[2 * (n - t) + 1];
                }
                dft_1d(in, n, out, n, n, +1);
                for (int64_t k = 0; k < n; k++) out[2 * k] *= scale;
            } else if (single && fft_single(in, used, out, n, !inverse)) {
                /* numpy's float transform, scale included */
            } else {
                dft_1d(in, used, out, n_out, n, inverse ? +1 : -1);
                for (int64_t k = 0; k < n_out; k++) {
                    out[2 * k] *= scale;
                    out[2 * k + 1] *= scale;
                }
            }
            for (int64_t k = 0; k < n_out; k++) {
                int64_t e = ((o * n_out + k) * inner + i) * ocomp;
                kiln_set_f64(y->dtype, y->data, e, out[2 * k]);
                if (ocomp == 2) kiln_set_f64(y->dtype, y->data, e + 1, out[2 * k + 1]);
            }
        }
    }
    free(in);
    free(out);
    return KILN_OK;
}

KILN_REF_OP(DFT, dft_infer, dft_run);

/* ---- STFT ---- */

/* STFT's frame geometry from the signal length and inputs; false if not known yet. */
struct stft_geom {
    int64_t step, frame_len, window_len, frames, bins;
};

static kiln_status stft_geom(const struct kiln_node *node, int64_t sig_len, const kiln_tensor *step_t,
                             const struct kiln_type *window, const kiln_tensor *flen_t,
                             bool have_flen, bool *known, struct stft_geom *g)
{
    *known = false;
    if (!scalar_int(step_t, &g->step)) {
        if (step_t)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "frame_step must be a scalar integer");
        return KILN_OK;
    }
    if (g->step <= 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "frame_step is %lld",
                               (long long)g->step);
    g->window_len = -1;
    if (window) {
        if (window->rank >= 0 && window->rank != 1)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "window must be 1-D");
        if (window->rank != 1 || window->dims[0] < 0) return KILN_OK;
        g->window_len = window->dims[0];
    }
    if (have_flen) {
        if (!scalar_int(flen_t, &g->frame_len)) {
            if (flen_t)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "frame_length must be a scalar integer");
            return KILN_OK;
        }
    } else if (g->window_len >= 0) {
        g->frame_len = g->window_len;
    } else {
        if (sig_len < 0) return KILN_OK;
        g->frame_len = sig_len;
    }
    if (g->window_len < 0) g->window_len = g->frame_len;
    if (g->frame_len <= 0 || g->window_len > g->frame_len)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "frame_length %lld does not fit the window of %lld",
                               (long long)g->frame_len, (long long)g->window_len);
    if (sig_len < 0) return KILN_OK;
    if (sig_len < g->frame_len)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "signal of %lld samples is shorter than a frame (%lld)",
                               (long long)sig_len, (long long)g->frame_len);
    g->frames = 1 + (sig_len - g->frame_len) / g->step;
    g->bins = kiln_attr_int(node, "onesided", 1) ? g->frame_len / 2 + 1 : g->frame_len;
    *known = true;
    return KILN_OK;
}

static kiln_status stft_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (!ctx->out[0]) return KILN_OK;
    kiln_type_unknown(ctx->out[0]);
    if (!x) return KILN_OK;
    ctx->out[0]->dtype = x->dtype;
    if (x->rank < 0) return KILN_OK;
    if (x->rank != 3)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "signal has rank %d, expected [batch, length, 1 or 2]", x->rank);
    struct stft_geom g;
    bool known;
    kiln_status st = stft_geom(ctx->node, x->dims[1], in_value(ctx, 1),
                               ctx->n_in > 2 ? ctx->in[2] : NULL, in_value(ctx, 3),
                               ctx->n_in > 3 && ctx->in[3], &known, &g);
    if (st != KILN_OK) return st;
    int64_t dims[4] = {x->dims[0], -1, -1, 2};
    if (known) {
        dims[1] = g.frames;
        dims[2] = g.bins;
    }
    kiln_type_set(ctx->out[0], x->dtype, 4, dims);
    return KILN_OK;
}

static kiln_status stft_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0], *win = ctx->n_in > 2 ? ctx->in[2] : NULL;
    kiln_tensor *y = ctx->out[0];
    if (!kiln_dtype_is_float(x->dtype))
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "signal dtype %s is not supported",
                               kiln_dtype_name(x->dtype));
    if (x->rank != 3 || (x->dims[2] != 1 && x->dims[2] != 2))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "signal must be [batch, length, 1 or 2]");
    struct kiln_type wt;
    if (win) kiln_type_from_tensor(&wt, win);
    struct stft_geom g;
    bool known;
    kiln_status st = stft_geom(ctx->node, x->dims[1], ctx->in[1], win ? &wt : NULL,
                               ctx->n_in > 3 ? ctx->in[3] : NULL, ctx->n_in > 3 && ctx->in[3],
                               &known, &g);
    if (st != KILN_OK) return st;
    if (!known || y->dims[1] != g.frames || y->dims[2] != g.bins)
        return kiln_node_error(ctx->node, KILN_ERR_INTERNAL, "output shape does not match");
    int64_t n = g.frame_len, comp = x->dims[2], len = x->dims[1];
    double *in = malloc(sizeof(double) * 2 * (size_t)n);
    double *out = malloc(sizeof(double) * 2 * (size_t)g.bins);
    if (!in || !out) {
        free(in);
        free(out);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "STFT scratch");
    }
    for (int64_t b = 0; b < x->dims[0]; b++) {
        for (int64_t f = 0; f < g.frames; f++) {
            for (int64_t t = 0; t < g.window_len; t++) {
                int64_t e = (b * len + f * g.step + t) * comp;
                double w = win ? kiln_get_f64(win->dtype, win->data, t) : 1.0;
                in[2 * t] = kiln_get_f64(x->dtype, x->data, e) * w;
                in[2 * t + 1] = comp == 2 ? kiln_get_f64(x->dtype, x->data, e + 1) * w : 0.0;
            }
            dft_1d(in, g.window_len, out, g.bins, n, -1);
            for (int64_t k = 0; k < g.bins; k++) {
                int64_t e = ((b * g.frames + f) * g.bins + k) * 2;
                kiln_set_f64(y->dtype, y->data, e, out[2 * k]);
                kiln_set_f64(y->dtype, y->data, e + 1, out[2 * k + 1]);
            }
        }
    }
    free(in);
    free(out);
    return KILN_OK;
}

KILN_REF_OP(STFT, stft_infer, stft_run);

/* ---- Windows ---- */

/* The output_datatype attribute as a float dtype. */
static kiln_status output_datatype(const struct kiln_node *node, kiln_dtype *out)
{
    int64_t code = kiln_attr_int(node, "output_datatype", 1);
    *out = kiln_onnx_dtype(code);
    if (!kiln_dtype_is_numeric(*out))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "output_datatype %lld is not supported",
                               (long long)code);
    return KILN_OK;
}

/* A window's length from input 0's value; -1 if unknown. */
static kiln_status window_size(const struct kiln_node *node, const kiln_tensor *t, int64_t *n)
{
    *n = -1;
    if (!t) return KILN_OK;
    if (!scalar_int(t, n))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "size must be a scalar integer");
    if (*n < 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "size is %lld", (long long)*n);
    return KILN_OK;
}

static kiln_status window_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    kiln_dtype dt;
    kiln_status st = output_datatype(ctx->node, &dt);
    if (st != KILN_OK) return st;
    int64_t n;
    st = window_size(ctx->node, in_value(ctx, 0), &n);
    if (st != KILN_OK) return st;
    kiln_type_set(ctx->out[0], dt, 1, &n);
    return KILN_OK;
}

/* Fill a generalized cosine window a0 - a1 cos(2 pi k / N) + a2 cos(4 pi k / N). */
static kiln_status cosine_window(struct kiln_run_ctx *ctx, double a0, double a1, double a2)
{
    kiln_tensor *y = ctx->out[0];
    int64_t size = y->dims[0];
    double period = kiln_attr_int(ctx->node, "periodic", 1) ? (double)size : (double)size - 1;
    for (int64_t k = 0; k < size; k++) {
        double a = period > 0 ? 2.0 * SIGNAL_PI * (double)k / period : 0.0;
        kiln_set_f64(y->dtype, y->data, k, a0 - a1 * cos(a) + a2 * cos(2 * a));
    }
    return KILN_OK;
}

static kiln_status hann_run(struct kiln_run_ctx *ctx) { return cosine_window(ctx, 0.5, 0.5, 0); }
static kiln_status hamming_run(struct kiln_run_ctx *ctx)
{
    return cosine_window(ctx, 25.0 / 46.0, 21.0 / 46.0, 0);
}
static kiln_status blackman_run(struct kiln_run_ctx *ctx)
{
    return cosine_window(ctx, 0.42, 0.5, 0.08);
}

KILN_REF_OP(HannWindow, window_infer, hann_run);
KILN_REF_OP(HammingWindow, window_infer, hamming_run);
KILN_REF_OP(BlackmanWindow, window_infer, blackman_run);

/* ---- MelWeightMatrix ---- */

static kiln_status mel_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    kiln_dtype dt;
    kiln_status st = output_datatype(ctx->node, &dt);
    if (st != KILN_OK) return st;
    int64_t dims[2] = {-1, -1}, v;
    if (scalar_int(in_value(ctx, 1), &v)) {
        if (v <= 0)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT, "dft_length is %lld",
                                   (long long)v);
        dims[0] = v / 2 + 1;
    }
    if (scalar_int(in_value(ctx, 0), &v)) {
        if (v <= 0)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT, "num_mel_bins is %lld",
                                   (long long)v);
        dims[1] = v;
    }
    kiln_type_set(ctx->out[0], dt, 2, dims);
    return KILN_OK;
}

/* Triangular mel filters over the dft_length / 2 + 1 spectrogram bins. */
static kiln_status mel_run(struct kiln_run_ctx *ctx)
{
    int64_t mels, dft_len, rate;
    double lo, hi;
    if (!scalar_int(ctx->in[0], &mels) || !scalar_int(ctx->in[1], &dft_len) ||
        !scalar_int(ctx->in[2], &rate) || !scalar_f64(ctx->in[3], &lo) ||
        !scalar_f64(ctx->in[4], &hi))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "inputs must be scalars (three integers, two floats)");
    if (mels <= 0 || dft_len <= 0 || rate <= 0)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "num_mel_bins %lld, dft_length %lld, sample_rate %lld",
                               (long long)mels, (long long)dft_len, (long long)rate);
    kiln_tensor *y = ctx->out[0];
    int64_t bins = dft_len / 2 + 1;
    int64_t *fb = malloc(sizeof(int64_t) * (size_t)(mels + 2));
    if (!fb) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "MelWeightMatrix scratch");
    double lo_mel = 2595.0 * log10(1.0 + lo / 700.0);
    double hi_mel = 2595.0 * log10(1.0 + hi / 700.0);
    double step = (hi_mel - lo_mel) / (double)(mels + 2);
    kiln_status st = KILN_OK;
    for (int64_t i = 0; i < mels + 2; i++) {
        double hz = 700.0 * (pow(10.0, ((double)i * step + lo_mel) / 2595.0) - 1.0);
        double bin = floor((double)(dft_len + 1) * hz / (double)rate);
        if (!(bin >= 0 && bin <= (double)bins)) { /* NaN too */
            free(fb);
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "mel edge %lld falls at bin %g, outside [0, %lld]",
                                   (long long)i, bin, (long long)bins);
        }
        fb[i] = (int64_t)bin;
    }
    for (int64_t i = 0; i < mels && st == KILN_OK; i++) {
        int64_t left = fb[i], center = fb[i + 1], right = fb[i + 2];
        if (center >= bins || left > center || center > right) {
            st = kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                 "mel filter %lld spans bins %lld..%lld outside [0, %lld)",
                                 (long long)i, (long long)left, (long long)right,
                                 (long long)bins);
            break;
        }
        if (center == left) {
            kiln_set_f64(y->dtype, y->data, center * mels + i, 1.0);
        } else {
            for (int64_t j = left; j <= center; j++)
                kiln_set_f64(y->dtype, y->data, j * mels + i,
                             (double)(j - left) / (double)(center - left));
        }
        for (int64_t j = center; j < right; j++)
            kiln_set_f64(y->dtype, y->data, j * mels + i,
                         (double)(right - j) / (double)(right - center));
    }
    free(fb);
    return st;
}

KILN_REF_OP(MelWeightMatrix, mel_infer, mel_run);
