/*
 * simd_body.h - the f32 kernel loops, written once over a vector
 * vocabulary and included by each ISA file (isa_*.c) after it defines:
 *
 *   vf, vm, W              vector type, compare-mask type, lanes
 *   vld vst vset           load, store (unaligned), broadcast
 *   vfma(a, b, c)          a * b + c, one rounding
 *   vmaxs(a, b)            a > b ? a : b   (x86 MAXPS; NaN in b passes)
 *   vmins(a, b)            a < b ? a : b
 *   vlt(a, b), vsel(m, a, b)   mask of a < b; m ? b : a per lane
 *   vnan(a)                mask of the NaN lanes of a
 *   vabs vneg vsqrt vcopysign(mag, sign) vhsum vhmax
 *   vrecip12(a)            1 / a for a in [1, 2], within 3 ulp (estimate + Newton,
 *                          or a division where that is the shorter chain: AVX2)
 *   vtranspose(r)          r[i][j] <- r[j][i] for the W x W floats of vf r[W]
 *   vdeint(a, b, &e, &o)   the 2W lanes of a then b split into even and odd ones
 *   SIMD_TABLE, SIMD_ISA   the exported table's name and its ISA string
 * and, unless SIMD_SCALAR (which takes its math from libm instead):
 *   vround(a)              to nearest integer value (ties even)
 *   vpow2i(n)              2^n for integer-valued n in [-126, 127]
 * Arithmetic + - * / uses the C operators (GCC vector extensions).
 * Tails shorter than W: vld_part and vst_part, masked where the ISA defines
 * SIMD_HAVE_PART (a W-float stack buffer otherwise).
 */
#include <float.h>
#include <string.h>

#ifndef SIMD_HAVE_PART /* the ISA's masked loads and stores, where it has them */
static inline vf vld_part(const float *p, int64_t n, float fill)
{
    float buf[W];
    for (int i = 0; i < W; i++) buf[i] = i < n ? p[i] : fill;
    return vld(buf);
}

static inline void vst_part(float *p, vf v, int64_t n)
{
    float buf[W];
    vst(buf, v);
    memcpy(p, buf, (size_t)n * sizeof(float));
}
#endif

/* ---- Math ---- */
#ifndef SIMD_SCALAR

#include "kernels/simd/simd_math.h"

/* tanh: x P(x^2) / Q(x^2) on x clamped to [-9, 9] (tanh(9) rounds to 1 - 2^-24), P and Q
 * of degree 4, fitted for relative error by tools/fit_tanh.py (2.1e-8 in exact arithmetic;
 * in float at most 5.4 ulp, 0.3 on average over every float in [2^-30, 10]). Thirteen
 * operations and a division: the earlier polynomial-or-exponential form took 40 cycles a
 * vector on a Zen 2, this one 9. NaN passes the clamp; -0 stays -0. */
static inline vf v_tanh(vf x)
{
    x = vmins(vset(9.0f), vmaxs(vset(-9.0f), x));
    vf t = x * x;
    vf p = vset(1.3353719907627237e-08f);
    p = vfma(p, t, vset(2.0608355043805204e-05f));
    p = vfma(p, t, vset(3.495542099699378e-03f));
    p = vfma(p, t, vset(1.338098645210266e-01f));
    p = vfma(p, t, vset(1.0f));
    vf q = vset(7.776158668093558e-07f);
    q = vfma(q, t, vset(3.285560815129429e-04f));
    q = vfma(q, t, vset(2.5876805186271667e-02f));
    q = vfma(q, t, vset(4.671430289745331e-01f));
    q = vfma(q, t, vset(1.0f));
    return (x * p) / q;
}

/* erf for |x| < 1: Taylor series to x^19 (error < 2e-8). */
static inline vf v_erf_small(vf x)
{
    vf x2 = x * x;
    vf p = vset(-1.6365844691e-07f);
    p = vfma(p, x2, vset(1.6462114366e-06f));
    p = vfma(p, x2, vset(-1.4925650358e-05f));
    p = vfma(p, x2, vset(1.2055332982e-04f));
    p = vfma(p, x2, vset(-8.5483270235e-04f));
    p = vfma(p, x2, vset(5.2239776254e-03f));
    p = vfma(p, x2, vset(-2.6866170645e-02f));
    p = vfma(p, x2, vset(1.1283791671e-01f));
    p = vfma(p, x2, vset(-3.7612638903e-01f));
    p = vfma(p, x2, vset(1.1283791671e+00f));
    return p * x;
}

/* erfc(z) * 2^shift for z >= 0 (meant for z >= 1), z^2 = z2hi + z2lo
 * exactly: Numerical Recipes' erfcc Chebyshev fit (relative error < 1.2e-7),
 * with exp(-z^2 + poly) taken as one exp of a two-part argument. */
static inline vf v_erfc_big(vf z, vf z2hi, vf z2lo, float shift)
{
    vf t = vset(1.0f) / vfma(z, vset(0.5f), vset(1.0f));
    vf p = vset(0.17087277f);
    p = vfma(p, t, vset(-0.82215223f));
    p = vfma(p, t, vset(1.48851587f));
    p = vfma(p, t, vset(-1.13520398f));
    p = vfma(p, t, vset(0.27886807f));
    p = vfma(p, t, vset(-0.18628806f));
    p = vfma(p, t, vset(0.09678418f));
    p = vfma(p, t, vset(0.37409196f));
    p = vfma(p, t, vset(1.00002368f));
    p = vfma(p, t, vset(-1.26551223f));
    return t * v_exp2s(vneg(z2hi), p - z2lo, shift);
}

static inline vf v_erf(vf x)
{
    vf a = vmins(vset(10.5f), vabs(x)); /* erfc(10.5) underflows to 0 */
    vf hi = a * a, lo = vfma(a, a, vneg(hi));
    vf big = vcopysign(vset(1.0f) - v_erfc_big(a, hi, lo, 0.0f), x);
    return vsel(vlt(a, vset(1.0f)), big, v_erf_small(x));
}

/* Non-finite x: the reference's 0.5 x (1 + erf(..)) gives inf for +inf and
 * NaN (-inf * 0) for -inf; y for finite x. */
static inline vf v_gelu_nonfinite(vf x, vm neg, vf y)
{
    vf keep = vsel(neg, vset(1.0f), vset(0.0f));
    return vsel(vlt(vabs(x), vset(INFINITY)), x * keep, y);
}

/* Gelu: 0.5 x (1 + erf(x / sqrt 2)) = x - 0.5 x erfc(z) for x >= 0 and
 * 0.5 x erfc(|z|) for x < 0, z = |x| / sqrt 2: no cancellation, and the
 * tiny results of large negative x are formed at 2^32 scale and rounded
 * into the denormals once. */
static inline vf v_gelu(vf x)
{
    vf ax = vmins(vset(14.849242f), vabs(x)); /* z <= 10.5 */
    vf z = ax * vset(0.70710678118654752f);
    vf hi = ax * ax, lo = vfma(ax, ax, vneg(hi)); /* x^2 exactly; z^2 = half of it */
    hi = hi * vset(0.5f);
    lo = lo * vset(0.5f);
    const vf m = x * vset(0.5f), down = vset(0x1p-32f);
    vf core = v_erfc_big(z, hi, lo, 32.0f);                /* erfc(z) 2^32 */
    core = vsel(vlt(vabs(x), vset(14.849242f)), vset(0.0f), core); /* |y| < 1e-48 past the clamp */
    vm small = vlt(z, vset(1.0f));
    vf ec = vsel(small, core * down, vset(1.0f) - v_erf_small(z));
    vf ecm = vsel(small, (core * m) * down, m * ec);      /* 0.5 x erfc(z) */
    vm neg = vlt(x, vset(0.0f));
    return v_gelu_nonfinite(x, neg, vsel(neg, x - m * ec, ecm));
}

/* Gelu, tanh form: 0.5 x (1 + tanh(u)) = x sigmoid(v), v = 2u = x (c1 +
 * c2 x^2). v reaches ~100 before the result underflows, so it is formed as
 * a double-float (hi + lo) to keep e^-|v| within a few ulp, and the small
 * side is again formed at 2^32 scale. */
static inline vf v_gelu_tanh(vf x)
{
    const vf c1h = vset(1.5957691669464111f), c1l = vset(-4.534068054340423e-08f);
    const vf c2h = vset(0.07135481387376785f), c2l = vset(2.3988324659995897e-09f);
    vf x2 = x * x, x2l = vfma(x, x, vneg(x2));
    vf th = c2h * x2;
    vf tl = vfma(c2h, x2, vneg(th)) + vfma(c2h, x2l, c2l * x2);
    vf ih = c1h + th, bb = ih - c1h; /* two-sum c1h + th */
    vf il = ((c1h - (ih - bb)) + (th - bb)) + tl + c1l;
    vf vh = x * ih, vl = vfma(x, ih, vneg(vh)) + x * il;
    vm neg = vlt(vh, vset(0.0f));
    vf eh = vsel(neg, vneg(vh), vh), el = vsel(neg, vneg(vl), vl); /* -|v| */
    vf es = v_exp2s(eh, el, 32.0f);                          /* e^-|v| 2^32 */
    es = vsel(vlt(eh, vset(-120.0f)), es, vset(0.0f));        /* past exp's clamp: |y| < 1e-48 */
    const vf down = vset(0x1p-32f);
    vf r = vset(1.0f) / (vset(1.0f) + es * down);
    vf y = vsel(neg, x * r, ((x * r) * es) * down);
    return v_gelu_nonfinite(x, vlt(x, vset(0.0f)), y);
}

/* log1p(u) for u in [0, 1]: Cephes logf on w = 1 + u, corrected by u / (w - 1). */
static inline vf v_log1p01(vf u)
{
    vf w = vset(1.0f) + u;
    vm big = vlt(vset(1.41421356f), w);
    vf m = vsel(big, w, w * vset(0.5f));
    vf e = vsel(big, vset(0.0f), vset(1.0f));
    vf f = m - vset(1.0f);
    vf z = f * f;
    vf p = vset(7.0376836292e-2f);
    p = vfma(p, f, vset(-1.1514610310e-1f));
    p = vfma(p, f, vset(1.1676998740e-1f));
    p = vfma(p, f, vset(-1.2420140846e-1f));
    p = vfma(p, f, vset(1.4249322787e-1f));
    p = vfma(p, f, vset(-1.6668057665e-1f));
    p = vfma(p, f, vset(2.0000714765e-1f));
    p = vfma(p, f, vset(-2.4999993993e-1f));
    p = vfma(p, f, vset(3.3333331174e-1f));
    vf y = p * f * z;
    y = vfma(e, vset(-2.12194440e-4f), y);
    y = vfma(z, vset(-0.5f), y);
    vf lg = vfma(e, vset(0.693359375f), f + y);
    vf wm1 = w - vset(1.0f);
    vm exact = vlt(wm1, vset(1e-30f)); /* w == 1: log1p(u) = u */
    return vsel(exact, lg * (u / wm1), u);
}

static inline vf v_softplus(vf x)
{
    vf e = v_exp(vneg(vabs(x)));
    return vmaxs(x, vset(0.0f)) + v_log1p01(e);
}

#endif /* SIMD_SCALAR */

/* ---- Elementwise ---- */

#define UNARY_LOOP(EXPR)                                        \
    do {                                                        \
        int64_t i = 0;                                          \
        for (; i + W <= n; i += W) {                            \
            vf x = vld(xs + i);                                 \
            vst(ys + i, EXPR);                                  \
        }                                                       \
        if (i < n) {                                            \
            vf x = vld_part(xs + i, n - i, 0.0f);               \
            vst_part(ys + i, EXPR, n - i);                      \
        }                                                       \
    } while (0)

static void k_unary(enum simd_unary op, float alpha, float beta, const float *xs, float *ys,
                    int64_t n)
{
    const vf zero = vset(0.0f), one = vset(1.0f), va = vset(alpha), vb = vset(beta);
    switch (op) {
    case SIMD_RELU: UNARY_LOOP(vmaxs(zero, x)); break;
    case SIMD_LEAKY_RELU: UNARY_LOOP(vsel(vlt(x, zero), x, x * va)); break;
    case SIMD_CLIP: {
        /* v = x < lo ? lo : x; y = v > hi ? hi : v (NaN passes, as in the reference) */
        UNARY_LOOP(vsel(vlt(vb, vsel(vlt(x, va), x, va)), vsel(vlt(x, va), x, va), vb));
        break;
    }
    case SIMD_SIGMOID: UNARY_LOOP(v_sigmoid(x)); break;
    case SIMD_TANH: UNARY_LOOP(v_tanh(x)); break;
    case SIMD_EXP: UNARY_LOOP(v_exp(x)); break;
    case SIMD_ERF: UNARY_LOOP(v_erf(x)); break;
    case SIMD_GELU: UNARY_LOOP(v_gelu(x)); break;
    case SIMD_GELU_TANH: UNARY_LOOP(v_gelu_tanh(x)); break;
    case SIMD_HARD_SWISH: {
        /* x * clamp((x + 3) / 6): x + 3 is exact near -3, where the result is tiny */
        const vf three = vset(3.0f), sixth = vset(1.0f / 6.0f);
        UNARY_LOOP(x * vmaxs(vmins((x + three) * sixth, one), zero));
        break;
    }
    case SIMD_HARD_SIGMOID:
        /* fmax(0, fmin(1, alpha x + beta)): NaN gives 1, as fmin does */
        UNARY_LOOP(vmaxs(vmins(vfma(va, x, vb), one), zero));
        break;
    case SIMD_SOFTPLUS: UNARY_LOOP(v_softplus(x)); break;
    case SIMD_SQRT: UNARY_LOOP(vsqrt(x)); break;
    case SIMD_NEG: UNARY_LOOP(vneg(x)); break;
    case SIMD_SILU: UNARY_LOOP(x * v_sigmoid(x)); break;
    case SIMD_SWISH: UNARY_LOOP(x * v_sigmoid(x * va)); break;
    case SIMD_SQUARE: UNARY_LOOP(x * x); break;
    case SIMD_CUBE: UNARY_LOOP(x * x * x); break;
    case SIMD_RECIP: UNARY_LOOP(vset(1.0f) / x); break;
    case SIMD_RSQRT: /* x + 0: -0 becomes +0 */
        UNARY_LOOP(vsel(vlt(x, vset(-FLT_MAX)), vset(1.0f) / vsqrt(x + zero), zero));
        break;
    case SIMD_POW_HALF:
        UNARY_LOOP(vsel(vlt(x, vset(-FLT_MAX)), vsqrt(x + zero), vset(INFINITY)));
        break;
    }
}

#define BINARY_LOOP(OP)                                                        \
    do {                                                                       \
        int64_t i = 0;                                                         \
        if (mode == SIMD_B_VEC) {                                              \
            for (; i + W <= n; i += W) vst(y + i, vld(a + i) OP vld(b + i));   \
            if (i < n)                                                         \
                vst_part(y + i, vld_part(a + i, n - i, 1.0f) OP                \
                                    vld_part(b + i, n - i, 1.0f), n - i);      \
        } else if (mode == SIMD_B_SCALAR_B) {                                  \
            const vf bv = vset(b[0]);                                          \
            for (; i + W <= n; i += W) vst(y + i, vld(a + i) OP bv);           \
            if (i < n) vst_part(y + i, vld_part(a + i, n - i, 1.0f) OP bv, n - i); \
        } else {                                                               \
            const vf av = vset(a[0]);                                          \
            for (; i + W <= n; i += W) vst(y + i, av OP vld(b + i));           \
            if (i < n) vst_part(y + i, av OP vld_part(b + i, n - i, 1.0f), n - i); \
        }                                                                      \
    } while (0)

static void k_binary(enum simd_binary op, enum simd_bmode mode, const float *a, const float *b,
                     float *y, int64_t n)
{
    switch (op) {
    case SIMD_ADD: BINARY_LOOP(+); break;
    case SIMD_SUB: BINARY_LOOP(-); break;
    case SIMD_MUL: BINARY_LOOP(*); break;
    case SIMD_DIV: BINARY_LOOP(/); break;
    }
}

/* ---- Row statistics ---- */

/* Sum of x[0..n) and of (x - shift)^2 when sq, in float vectors per block of
 * 8 W elements and double across blocks. */
static double k_row_sum(const float *x, int64_t n, bool sq, float shift)
{
    const vf s = vset(shift);
    double total = 0.0;
    int64_t i = 0;
    while (i < n) {
        vf acc0 = vset(0.0f), acc1 = vset(0.0f);
        int64_t end = i + 8 * W < n ? i + 8 * W : n;
        for (; i + 2 * W <= end; i += 2 * W) {
            vf a = vld(x + i), b = vld(x + i + W);
            if (sq) {
                a = a - s;
                b = b - s;
                acc0 = vfma(a, a, acc0);
                acc1 = vfma(b, b, acc1);
            } else {
                acc0 = acc0 + a;
                acc1 = acc1 + b;
            }
        }
        for (; i < end; i += W) {
            int64_t m = end - i < W ? end - i : W;
            vf a = vld_part(x + i, m, sq ? shift : 0.0f);
            if (sq) {
                a = a - s;
                acc0 = vfma(a, a, acc0);
            } else {
                acc0 = acc0 + a;
            }
        }
        total += (double)vhsum(acc0 + acc1);
    }
    return total;
}

static void k_sum_rows(const float *x, float *y, int64_t rows, int64_t n, double div)
{
    for (int64_t r = 0; r < rows; r++) y[r] = (float)(k_row_sum(x + r * n, n, false, 0.0f) / div);
}

/* y[r] = max (min when is_min) of x[r*n .. r*n+n), n >= 1; NaN if any is NaN. The minimum is
 * the negated maximum of the negated row. vmaxs keeps the running maximum; a second vector
 * keeps any NaN seen, which the maximum alone could drop. */
static void k_extreme_rows(const float *x, float *y, int64_t rows, int64_t n, int is_min)
{
    const float fill = is_min ? INFINITY : -INFINITY;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        vf m0 = vset(-INFINITY), m1 = m0, nan = vset(0.0f);
        int64_t i = 0;
        for (; i + 2 * W <= n; i += 2 * W) {
            vf a = vld(xr + i), b = vld(xr + i + W);
            if (is_min) {
                a = vneg(a);
                b = vneg(b);
            }
            m0 = vmaxs(m0, a);
            m1 = vmaxs(m1, b);
            nan = vsel(vnan(a), nan, a);
            nan = vsel(vnan(b), nan, b);
        }
        for (; i < n; i += W) {
            vf a = n - i >= W ? vld(xr + i) : vld_part(xr + i, n - i, fill);
            if (is_min) a = vneg(a);
            m0 = vmaxs(m0, a);
            nan = vsel(vnan(a), nan, a);
        }
        /* a NaN lane in m0 or m1 means a NaN was seen, and then nan holds one too */
        float best = isnan(vhsum(nan)) ? NAN : vhmax(vmaxs(m0, m1));
        y[r] = is_min ? -best : best;
    }
}

/* y[i] = max (min) of y[i] and x[i] for i < n; NaN if either is NaN. */
static void k_extreme_acc(float *y, const float *x, int64_t n, int is_min)
{
    int64_t i = 0;
    for (; i < n; i += W) {
        int64_t m = n - i < W ? n - i : W;
        vf a = m == W ? vld(y + i) : vld_part(y + i, m, 0.0f);
        vf b = m == W ? vld(x + i) : vld_part(x + i, m, 0.0f);
        vf r = is_min ? vmins(a, b) : vmaxs(a, b);
        r = vsel(vnan(b), r, b);
        r = vsel(vnan(a), r, a);
        if (m == W) vst(y + i, r);
        else vst_part(y + i, r, m);
    }
}

/* ---- Small GEMM (attention's products) ----
 *
 * C[m][n] = alpha * A[m][k] B[k][n], row-major, each operand with its own
 * row stride. Register tiles of R rows x C vectors: per step of k, C
 * vectors of B and one broadcast of A per row feed R * C independent
 * FMAs. Columns past the last whole vector are summed one by one.
 * With 32 registers, 4 x 4 tiles (16 accumulators; with 6 rows GCC 12
 * spills B vectors to the stack), or 8 x 2 where n is at most 4 vectors:
 * attention's S V, whose B rows (a head's values) sit a whole token apart,
 * so that few L1 sets hold them; the taller tile reads each of them half as
 * often (64 x 64 x 128 on one thread: 7.2 -> 5.4 us). */
#define GM_TALL_R 8 /* rows of the tall tile */
#if W >= 16
#define GM_R 4
#define GM_C 4
#define GM_TALL 1
#else /* 16 ymm registers: 8 accumulators, 2 of B, 1 broadcast */
#define GM_R 4
#define GM_C 2
#define GM_TALL 0
#endif

static inline __attribute__((always_inline)) void
gm_tile(int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
        float *c, int64_t ldc, const int R, const int C)
{
    vf acc[GM_TALL_R][GM_C];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < C; j++) acc[i][j] = vset(0.0f);
    for (int64_t p = 0; p < k; p++) {
        vf bv[GM_C];
#pragma GCC unroll 4
        for (int j = 0; j < C; j++) bv[j] = vld(b + p * ldb + j * W);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const vf av = vset(a[i * lda + p]);
#pragma GCC unroll 4
            for (int j = 0; j < C; j++) acc[i][j] = vfma(av, bv[j], acc[i][j]);
        }
    }
    const vf al = vset(alpha);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < C; j++) vst(c + i * ldc + j * W, acc[i][j] * al);
}

/* One row by one vector: four partial sums over k, so that a long k (a squeeze-excitation
 * reduction: k = 1152, n = 48) is not one chain of dependent FMAs. */
static inline void gm_row_vec(int64_t k, float alpha, const float *a, const float *b, int64_t ldb,
                              float *c)
{
    vf s0 = vset(0.0f), s1 = s0, s2 = s0, s3 = s0;
    int64_t p = 0;
    for (; p + 4 <= k; p += 4) {
        s0 = vfma(vset(a[p]), vld(b + p * ldb), s0);
        s1 = vfma(vset(a[p + 1]), vld(b + (p + 1) * ldb), s1);
        s2 = vfma(vset(a[p + 2]), vld(b + (p + 2) * ldb), s2);
        s3 = vfma(vset(a[p + 3]), vld(b + (p + 3) * ldb), s3);
    }
    for (; p < k; p++) s0 = vfma(vset(a[p]), vld(b + p * ldb), s0);
    vst(c, ((s0 + s1) + (s2 + s3)) * vset(alpha));
}

/* Rows 0..m of one column group of C vectors at column j: tiles of TR rows, then (TR of 8)
 * one of 4, then single rows. */
static inline __attribute__((always_inline)) void
gm_rows(int64_t m, int64_t j, int64_t k, float alpha, const float *a, int64_t lda,
        const float *b, int64_t ldb, float *c, int64_t ldc, const int TR, const int C)
{
    int64_t i = 0;
    for (; i + TR <= m; i += TR)
        gm_tile(k, alpha, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, TR, C);
    if (TR > 4) /* 4 to 7 rows left of the tall tile */
        for (; i + 4 <= m; i += 4)
            gm_tile(k, alpha, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, 4, C);
    for (; i < m; i++)
        if (C == 1)
            gm_row_vec(k, alpha, a + i * lda, b + j, ldb, c + i * ldc + j);
        else
            gm_tile(k, alpha, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, 1, C);
}

static inline __attribute__((always_inline)) void
gm_run(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b,
       int64_t ldb, float *c, int64_t ldc, const int TR, const int TC)
{
    const int64_t nv = n / W * W;
    int64_t j = 0;
    for (; j + TC * W <= nv; j += TC * W) gm_rows(m, j, k, alpha, a, lda, b, ldb, c, ldc, TR, TC);
    for (; j < nv; j += W) gm_rows(m, j, k, alpha, a, lda, b, ldb, c, ldc, TR, 1);
    for (; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            float sum = 0.0f;
            for (int64_t p = 0; p < k; p++) sum += a[i * lda + p] * b[p * ldb + j];
            c[i * ldc + j] = alpha * sum;
        }
}

static void k_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                   const float *b, int64_t ldb, float *c, int64_t ldc)
{
    if (GM_TALL && n <= 4 * W)
        gm_run(m, n, k, alpha, a, lda, b, ldb, c, ldc, GM_TALL_R, 2);
    else
        gm_run(m, n, k, alpha, a, lda, b, ldb, c, ldc, GM_R, GM_C);
}
#undef GM_R
#undef GM_TALL
#undef GM_TALL_R
#undef GM_C

/* ---- Softmax ---- */

/* The largest of the row's n values (-inf for none). */
static float k_row_max(const float *xr, int64_t n)
{
    vf m = vset(-INFINITY);
    int64_t i = 0;
    for (; i + W <= n; i += W) m = vmaxs(m, vld(xr + i));
    if (i < n) m = vmaxs(m, vld_part(xr + i, n - i, -INFINITY));
    return vhmax(m);
}

static void k_softmax_rows(const float *x, float *y, int64_t rows, int64_t n)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        int64_t i;
        const vf mx = vset(k_row_max(xr, n));
        double sum = 0.0;
        vf acc = vset(0.0f);
        for (i = 0; i + W <= n; i += W) {
            vf e = v_exp(vld(xr + i) - mx);
            vst(yr + i, e);
            acc = acc + e;
            if (((i / W) & 63) == 63) { /* double across blocks of 64 vectors */
                sum += (double)vhsum(acc);
                acc = vset(0.0f);
            }
        }
        if (i < n) {
            vf e = v_exp(vld_part(xr + i, n - i, -INFINITY) - mx);
            vst_part(yr + i, e, n - i);
            acc = acc + e; /* padding lanes add exp(-inf) = 0 */
        }
        sum += (double)vhsum(acc);
        const vf inv = vset((float)(1.0 / sum));
        for (i = 0; i + W <= n; i += W) vst(yr + i, vld(yr + i) * inv);
        if (i < n) vst_part(yr + i, vld_part(yr + i, n - i, 0.0f) * inv, n - i);
    }
}

/* Softmax over k of x[k * inner + j], W lanes of j at a time. */
static void k_softmax_strided(const float *x, float *y, int64_t n, int64_t inner)
{
    for (int64_t j = 0; j < inner; j += W) {
        int64_t m = inner - j < W ? inner - j : W;
#define LD(p) (m == W ? vld(p) : vld_part((p), m, 0.0f))
#define ST(p, v) (m == W ? vst((p), (v)) : vst_part((p), (v), m))
        vf mx = vset(-INFINITY);
        for (int64_t k = 0; k < n; k++) mx = vmaxs(mx, LD(x + k * inner + j));
        vf acc = vset(0.0f);
        for (int64_t k = 0; k < n; k++) {
            vf e = v_exp(LD(x + k * inner + j) - mx);
            ST(y + k * inner + j, e);
            acc = acc + e;
        }
        vf inv = vset(1.0f) / acc;
        for (int64_t k = 0; k < n; k++) ST(y + k * inner + j, LD(y + k * inner + j) * inv);
#undef LD
#undef ST
    }
}

/* LogSoftmax of rows: x - (max + log(sum of exp(x - max))), the sum in double
 * across blocks of 64 vectors as in k_softmax_rows (the reference's order of
 * operations: its lse is max + (float)log(sum)). */
static void k_log_softmax_rows(const float *x, float *y, int64_t rows, int64_t n)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        int64_t i;
        const float mxs = k_row_max(xr, n);
        const vf mx = vset(mxs);
        double sum = 0.0;
        vf acc = vset(0.0f);
        for (i = 0; i + W <= n; i += W) {
            acc = acc + v_exp(vld(xr + i) - mx);
            if (((i / W) & 63) == 63) {
                sum += (double)vhsum(acc);
                acc = vset(0.0f);
            }
        }
        if (i < n) acc = acc + v_exp(vld_part(xr + i, n - i, -INFINITY) - mx);
        sum += (double)vhsum(acc);
        const vf lse = vset(mxs + (float)log(sum));
        for (i = 0; i + W <= n; i += W) vst(yr + i, vld(xr + i) - lse);
        if (i < n) vst_part(yr + i, vld_part(xr + i, n - i, 0.0f) - lse, n - i);
    }
}

/* LogSoftmax over k of x[k * inner + j], W lanes of j at a time. */
static void k_log_softmax_strided(const float *x, float *y, int64_t n, int64_t inner)
{
    for (int64_t j = 0; j < inner; j += W) {
        int64_t m = inner - j < W ? inner - j : W;
#define LD(p) (m == W ? vld(p) : vld_part((p), m, 0.0f))
#define ST(p, v) (m == W ? vst((p), (v)) : vst_part((p), (v), m))
        vf mx = vset(-INFINITY);
        for (int64_t k = 0; k < n; k++) mx = vmaxs(mx, LD(x + k * inner + j));
        vf acc = vset(0.0f);
        for (int64_t k = 0; k < n; k++) acc = acc + v_exp(LD(x + k * inner + j) - mx);
        float ms[W], ss[W];
        vst(ms, mx);
        vst(ss, acc);
        for (int l = 0; l < W; l++) ms[l] += (float)log((double)ss[l]);
        const vf lse = vld(ms);
        for (int64_t k = 0; k < n; k++) ST(y + k * inner + j, LD(x + k * inner + j) - lse);
#undef LD
#undef ST
    }
}

/* ---- LayerNormalization ---- */

static void k_layernorm_rows(const float *x, float *y, int64_t rows, int64_t n, float eps,
                             const float *scale, const float *bias, float *mean_out,
                             float *inv_out)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        double mean = k_row_sum(xr, n, false, 0.0f) / (double)n;
        float meanf = (float)mean;
        double var = k_row_sum(xr, n, true, meanf) / (double)n;
        double invd = 1.0 / sqrt(var + (double)eps);
        const vf mv = vset(meanf), iv = vset((float)invd);
        const vf zero = vset(0.0f);
        int64_t i = 0;
        for (; i + W <= n; i += W) {
            vf d = (vld(xr + i) - mv) * iv;
            vst(yr + i, vfma(d, vld(scale + i), bias ? vld(bias + i) : zero));
        }
        if (i < n) {
            int64_t m = n - i;
            vf d = (vld_part(xr + i, m, 0.0f) - mv) * iv;
            vst_part(yr + i, vfma(d, vld_part(scale + i, m, 0.0f),
                                  bias ? vld_part(bias + i, m, 0.0f) : zero), m);
        }
        if (mean_out) mean_out[r] = meanf;
        if (inv_out) inv_out[r] = (float)invd;
    }
}

static void k_row_stats(const float *x, int64_t n, float eps, float *mean, float *inv,
                        float *delta)
{
    double m = k_row_sum(x, n, false, 0.0f) / (double)n;
    float mf = (float)m;
    double d = m - (double)mf; /* the float mean's rounding, which the caller may fold in */
    double var = k_row_sum(x, n, true, mf) / (double)n - d * d;
    *mean = mf;
    *inv = (float)(1.0 / sqrt((var > 0 ? var : 0) + (double)eps));
    if (delta) *delta = (float)d;
}

static void k_norm_affine(const float *x, float *y, int64_t n, float mean, float a, float b)
{
    const vf mv = vset(mean), av = vset(a), bv = vset(b);
    int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        vf x0 = vld(x + i), x1 = vld(x + i + W);
        vst(y + i, vfma(x0 - mv, av, bv));
        vst(y + i + W, vfma(x1 - mv, av, bv));
    }
    for (; i < n; i += W) {
        int64_t m = n - i < W ? n - i : W;
        vst_part(y + i, vfma(vld_part(x + i, m, 0.0f) - mv, av, bv), m);
    }
}

/* ---- per-lane statistics and affine of channel-blocked data (GroupNormalization) ----
 *
 * W lanes of npix pixels, pixel p's lanes at x + p * stride. k_lane_sums adds to sum[l] the
 * sum over p of (x - c[l]) (sq false) or of its square (sq true), in float over runs of 16
 * pixels and in double across runs, as k_row_sum does along a row. */
static void k_lane_sums(const float *x, int64_t npix, int64_t stride, const float *c, int sq,
                        double *sum)
{
    const vf cv = vld(c);
    float part[W];
    for (int64_t p = 0; p < npix;) {
        vf acc0 = vset(0.0f), acc1 = vset(0.0f);
        int64_t end = p + 16 < npix ? p + 16 : npix;
        for (; p + 2 <= end; p += 2) {
            vf a = vld(x + p * stride) - cv, b = vld(x + (p + 1) * stride) - cv;
            if (sq) {
                acc0 = vfma(a, a, acc0);
                acc1 = vfma(b, b, acc1);
            } else {
                acc0 = acc0 + a;
                acc1 = acc1 + b;
            }
        }
        if (p < end) {
            vf a = vld(x + p * stride) - cv;
            if (sq)
                acc0 = vfma(a, a, acc0);
            else
                acc0 = acc0 + a;
            p++;
        }
        vst(part, acc0 + acc1);
        for (int l = 0; l < W; l++) sum[l] += (double)part[l];
    }
}

/* y[p * stride + l] = (x[p * stride + l] - m[l]) * a[l] + b[l] for p < npix, l < W; y may be
 * x. */
static void k_lane_affine(const float *x, float *y, int64_t npix, int64_t stride, const float *m,
                          const float *a, const float *b)
{
    const vf mv = vld(m), av = vld(a), bv = vld(b);
    for (int64_t p = 0; p < npix; p++) vst(y + p * stride, vfma(vld(x + p * stride) - mv, av, bv));
}

/* ---- Transpose ----
 *
 * dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols: W x W tiles transposed in
 * registers (vtranspose), the ragged edges one float at a time. */
static void k_transpose(int64_t rows, int64_t cols, const float *src, int64_t lds, float *dst,
                        int64_t ldd)
{
    int64_t rv = rows / W * W, cv = cols / W * W;
    for (int64_t r0 = 0; r0 < rv; r0 += W)
        for (int64_t c0 = 0; c0 < cv; c0 += W) {
            vf t[W];
            for (int i = 0; i < W; i++) t[i] = vld(src + (r0 + i) * lds + c0);
            vtranspose(t);
            for (int i = 0; i < W; i++) vst(dst + (c0 + i) * ldd + r0, t[i]);
        }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = r < rv ? cv : 0; c < cols; c++) dst[c * ldd + r] = src[r * lds + c];
}

/* ---- FMA throughput (the profile's peak) ----
 *
 * iters steps of FMA_CHAINS independent chains of one vector FMA each, enough to cover the
 * FMA latency times the FMA ports of current x86 cores, from registers only. */
#define FMA_CHAINS 12
static float k_fma_loop(int64_t iters)
{
    vf acc[FMA_CHAINS];
#pragma GCC unroll 12
    for (int j = 0; j < FMA_CHAINS; j++) acc[j] = vset((float)j * 1e-3f);
    const vf m = vset(0.999f), c = vset(1e-3f);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 12
        for (int j = 0; j < FMA_CHAINS; j++) acc[j] = vfma(acc[j], m, c);
    vf s = acc[0];
#pragma GCC unroll 12
    for (int j = 1; j < FMA_CHAINS; j++) s = s + acc[j];
    return vhsum(s);
}

#include "kernels/simd/rnn_body.h"
#include "kernels/simd/skinny_body.h"
#include "kernels/simd/pool_body.h"
#include "kernels/simd/conv_direct_body.h"

const struct simd_kernels SIMD_TABLE = {
    .isa = SIMD_ISA,
    .lanes = W,
    .unary = k_unary,
    .binary = k_binary,
    .softmax_rows = k_softmax_rows,
    .softmax_strided = k_softmax_strided,
    .log_softmax_rows = k_log_softmax_rows,
    .log_softmax_strided = k_log_softmax_strided,
    .layernorm_rows = k_layernorm_rows,
    .sum_rows = k_sum_rows,
    .extreme_rows = k_extreme_rows,
    .extreme_acc = k_extreme_acc,
    .gemm = k_gemm,
    .transpose = k_transpose,
    .fma_loop = k_fma_loop,
    .fma_loop_flops = 2 * FMA_CHAINS * W,
    .rnn_cell = k_rnn_cell,
    .skinny_gemm = k_skinny_gemm,
    .skinny_cols = SK_U * W,
    .pool_row = k_pool_row,
    .conv_direct_row = k_conv_direct_row,
    .row_stats = k_row_stats,
    .norm_affine = k_norm_affine,
    .lane_sums = k_lane_sums,
    .lane_affine = k_lane_affine,
    .pool_global = k_pool_global,
};
#undef SK_U
#undef FMA_CHAINS
