/*
 * mbconv_avx512.c - the arithmetic of the fused inverted-residual block
 * (mbconv.h), for AVX-512 (compiled for it by a target pragma; called only
 * where kiln_mbconv_cpu_ok() holds).
 *
 * Both 1x1 convolutions are one register-tiled product over rows of blocked
 * pixels: up to 28 zmm accumulators (6 pixels x 4 blocks of 16 output
 * channels, 8 x 3, 14 x 2 or 28 x 1), the input channel broadcast from the
 * blocked row, the weights' vectors loaded per input channel. Bias starts the
 * accumulators; the clamp (and the residual) are applied before the single
 * store, SiLU in a second pass over the stored tile. The depthwise rows run 8
 * output pixels of one channel block at a time over the band's expanded
 * rows, whose pad columns are zero.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/simd/mbconv.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx2,fma")
#endif

#include "kernels/simd/vocab_avx512.h"
#include "kernels/simd/simd_math.h"

/* The product and depthwise tiles are not instrumented by UBSan (sanitizer
 * builds): its checks on every unrolled load made clang take minutes on this
 * file. AddressSanitizer still checks them. */
#define MB_NOUB __attribute__((no_sanitize("undefined")))
#define MB_AI static inline __attribute__((always_inline)) MB_NOUB
#define MB_PARTIAL (-1) /* act of a product slice that more input channels follow */
#define MB_MR 28 /* most pixels per tile (with one output block) */
#define MB_NR 4  /* most output channel blocks per tile */

/* x / (1 + e^-x) over n vectors of 16, each vs apart (just written, in L1).
 * Not inlined: its constants would take registers from the product loops.
 * Cheaper than x * v_sigmoid(x) (EfficientNet applies it to every expanded
 * value), and kept off the FMA ports where it can be: x is clamped to
 * [-80, 80] (e^80 and its reciprocal stay normal floats; sigmoid is 1 in
 * float beyond 17); n = round(-x log2(e)) comes from adding and subtracting
 * 1.5 * 2^23, which leaves n in the low bits of the sum; 2^f for f in
 * [-1/2, 1/2] is 1 + f q(f) with q a degree-4 minimax fit (9.1e-8 relative);
 * 2^n is added to its exponent bits as an integer (|n| <= 116: no overflow);
 * and the quotient is one division, which runs beside the FMAs (5.9 cycles a
 * vector here against 8.6 for scalef and the reciprocal estimate with a
 * Newton step). Below -80 the result is 0 (SiLU is under 1e-32 there; the
 * clamped quotient would not be for |x| near FLT_MAX), -inf included; NaN
 * stays NaN. */
static __attribute__((noinline)) void mb_silu(float *p, int64_t n, ptrdiff_t vs)
{
    const vf lo = vset(-80.0f), hi = vset(80.0f), nl2e = vset(-1.44269504088896341f);
    const vf c1 = vset(0.6931470036506653f), c2 = vset(0.24022242426872253f);
    const vf c3 = vset(0.05550733581185341f), c4 = vset(0.009671512991189957f);
    const vf c5 = vset(0.001326472731307149f);
    const vf one = vset(1.0f), magic = vset(12582912.0f); /* 1.5 * 2^23 */
    for (int64_t i = 0; i < n; i++) {
        vf x = vld(p + i * vs);
        vf xc = vmins(hi, vmaxs(lo, x));
        vf r = vfma(xc, nl2e, magic);
        vf nn = r - magic;
        vf f = _mm512_fmsub_ps(xc, nl2e, nn); /* -x log2(e) - n, in [-1/2, 1/2] */
        vf q = vfma(vfma(vfma(vfma(c5, f, c4), f, c3), f, c2), f, c1);
        __m512i e = _mm512_add_epi32(_mm512_castps_si512(vfma(q, f, one)),
                                     _mm512_slli_epi32(_mm512_castps_si512(r), 23));
        __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ); /* x >= -80 or NaN */
        vst(p + i * vs, _mm512_maskz_div_ps(keep, x, one + _mm512_castsi512_ps(e)));
    }
}

/* One product tile (see the file comment): pixel i's input channel k is at
 * a[(k / 16) * a_kbs + i * 16 + k % 16], weight row k at b + k * ldb, output
 * block j of pixel i at c[j * c_bs + i * 16] (the residual likewise). The
 * sums start from bias, or from c where bias is NULL (a later slice of the
 * input channels); res and clamp apply to the last slice only. */
MB_AI void mb_tile(const int mr, const int nr, int kb_n, const float *a, ptrdiff_t a_kbs,
                   const float *b, ptrdiff_t ldb, const float *bias, float *c, ptrdiff_t c_bs,
                   const float *res, int act, float lo_f, float hi_f)
{
    __m512 acc[MB_MR][MB_NR];
    if (bias) {
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            __m512 bj = _mm512_loadu_ps(bias + j * 16);
#pragma GCC unroll 28
            for (int i = 0; i < mr; i++) acc[i][j] = bj;
        }
    } else { /* a later slice of the input channels: continue the stored sums */
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++)
#pragma GCC unroll 28
            for (int i = 0; i < mr; i++) acc[i][j] = _mm512_loadu_ps(c + j * c_bs + i * 16);
    }
    for (int kb = 0; kb < kb_n; kb++) {
        const float *ak = a + kb * a_kbs;
        const float *bk = b + (ptrdiff_t)kb * 16 * ldb;
#pragma GCC unroll 4
        for (int kk = 0; kk < 16; kk++) {
            __m512 wv[MB_NR];
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++) wv[j] = _mm512_loadu_ps(bk + kk * ldb + j * 16);
#pragma GCC unroll 28
            for (int i = 0; i < mr; i++) {
                __m512 av = _mm512_set1_ps(ak[i * 16 + kk]);
#pragma GCC unroll 4
                for (int j = 0; j < nr; j++) acc[i][j] = _mm512_fmadd_ps(av, wv[j], acc[i][j]);
            }
        }
    }
    const __m512 lo = _mm512_set1_ps(lo_f), hi = _mm512_set1_ps(hi_f);
#pragma GCC unroll 4
    for (int j = 0; j < nr; j++)
#pragma GCC unroll 28
        for (int i = 0; i < mr; i++) {
            __m512 v = acc[i][j];
            if (res) v = _mm512_add_ps(v, _mm512_loadu_ps(res + j * c_bs + i * 16));
            /* x as the second operand: a NaN passes through; act < 0: the
             * sums are partial (more input channels follow), stored as they are */
            if (act == KILN_MB_CLAMP) v = _mm512_min_ps(hi, _mm512_max_ps(lo, v));
            _mm512_storeu_ps(c + j * c_bs + i * 16, v);
        }
}

#define MB_TILE_CASE(MR, NR)                                                                  \
    case (MR) * 8 + (NR):                                                                     \
        mb_tile(MR, NR, kb_n, a, a_kbs, b, ldb, bias, c, c_bs, res, act, lo, hi);           \
        break;
#define MB_TILE_ROW(MR) MB_TILE_CASE(MR, 1) MB_TILE_CASE(MR, 2) MB_TILE_CASE(MR, 3) MB_TILE_CASE(MR, 4)

MB_NOUB static void mb_tile_any(int mr, int nr, int kb_n, const float *a, ptrdiff_t a_kbs, const float *b,
                        ptrdiff_t ldb, const float *bias, float *c, ptrdiff_t c_bs,
                        const float *res, int act, float lo, float hi)
{
    switch (mr * 8 + nr) {
        MB_TILE_ROW(1) MB_TILE_ROW(2) MB_TILE_ROW(3) MB_TILE_ROW(4) MB_TILE_ROW(5)
        MB_TILE_ROW(6) MB_TILE_CASE(7, 1) MB_TILE_CASE(7, 2) MB_TILE_CASE(7, 3)
        MB_TILE_CASE(8, 1) MB_TILE_CASE(8, 2) MB_TILE_CASE(8, 3)
        MB_TILE_CASE(9, 1) MB_TILE_CASE(9, 2)
        MB_TILE_CASE(10, 1) MB_TILE_CASE(10, 2) MB_TILE_CASE(11, 1) MB_TILE_CASE(11, 2)
        MB_TILE_CASE(12, 1) MB_TILE_CASE(12, 2) MB_TILE_CASE(13, 1) MB_TILE_CASE(13, 2)
        MB_TILE_CASE(14, 1) MB_TILE_CASE(14, 2)
        MB_TILE_CASE(16, 1) MB_TILE_CASE(20, 1) MB_TILE_CASE(24, 1) MB_TILE_CASE(28, 1)
    default: /* 15..27 pixels of one block: two halves, each a case above */
        mb_tile_any(mr / 2, nr, kb_n, a, a_kbs, b, ldb, bias, c, c_bs, res, act, lo, hi);
        mb_tile_any(mr - mr / 2, nr, kb_n, a + mr / 2 * 16, a_kbs, b, ldb, bias,
                    c + mr / 2 * 16, c_bs, res ? res + mr / 2 * 16 : NULL, act, lo, hi);
        break;
    }
}

/* Where the rows of a product lie: row r is row r % per_img of image
 * r / per_img; a's rows are a_rs apart within an image and a_is between
 * images, c's (and res's) c_rs and c_is. */
struct mb_rowmap {
    int64_t per_img;
    ptrdiff_t a_is, c_is;
};

/* A 1x1 convolution over nrows rows of npix pixels: kb_n input blocks, nb
 * output blocks. Pixel stride 16 everywhere; a's row stride a_rs and
 * input-block stride a_kbs; b's row stride ldb; c's (and res's) row stride
 * c_rs and output-block stride c_bs; rows of several images as rm says (NULL:
 * one image). The rows share each panel of weights (the block group's
 * columns), which stays in L1 across them. */
static void mb_gemm_rows_map(int64_t nrows, int64_t npix, int kb_n, const float *a,
                             ptrdiff_t a_rs, ptrdiff_t a_kbs, const float *b, ptrdiff_t ldb,
                             int nb, const float *bias, float *c, ptrdiff_t c_rs,
                             ptrdiff_t c_bs, const float *res, int act, float lo, float hi,
                             const struct mb_rowmap *rm)
{
    const int64_t per_img = rm ? rm->per_img : nrows;
    const ptrdiff_t a_is = rm ? rm->a_is : 0, c_is = rm ? rm->c_is : 0;
    /* output blocks in equal groups of at most 4, pixels in near-equal tiles
     * of at most mr_for_nr[nr]: the accumulators, the weight vectors and one
     * broadcast fit the 32 registers, and no tile is left with a pixel or two
     * (too few accumulators to cover the FMA latency) */
    int groups = (nb + MB_NR - 1) / MB_NR, nr0 = (nb + groups - 1) / groups;
    static const int mr_for_nr[5] = {0, 28, 14, 8, 6};
    /* input channels in slices whose weight panel (16 kc rows of nr0 blocks)
     * stays within 24 KiB of L1 while every row of the band uses it */
    int kc = 24 / nr0 > 0 ? 24 / nr0 : 1, slices = (kb_n + kc - 1) / kc;
    kc = (kb_n + slices - 1) / slices;
    for (int jb = 0; jb < nb; jb += nr0) {
        int nr = nb - jb < nr0 ? nb - jb : nr0;
        int64_t tiles = (npix + mr_for_nr[nr] - 1) / mr_for_nr[nr];
        for (int k0 = 0; k0 < kb_n; k0 += kc) {
            int kn = kb_n - k0 < kc ? kb_n - k0 : kc, last = k0 + kn == kb_n;
            const float *bj = b + (ptrdiff_t)k0 * 16 * ldb + jb * 16;
            for (int64_t row = 0; row < nrows; row++) {
                const int64_t img = row / per_img, ri = row % per_img;
                const ptrdiff_t c_off = img * c_is + ri * c_rs + jb * c_bs;
                const float *ar = a + img * a_is + ri * a_rs + k0 * a_kbs;
                float *cr = c + c_off;
                const float *rr = res && last ? res + c_off : NULL;
                for (int64_t t = 0; t < tiles; t++) {
                    int64_t i0 = t * npix / tiles, i1 = (t + 1) * npix / tiles;
                    mb_tile_any((int)(i1 - i0), nr, kn, ar + i0 * 16, a_kbs, bj, ldb,
                                k0 == 0 ? bias + jb * 16 : NULL, cr + i0 * 16, c_bs,
                                rr ? rr + i0 * 16 : NULL, last ? act : MB_PARTIAL, lo, hi);
                    if (last && act == KILN_MB_SILU)
                        for (int j = 0; j < nr; j++) mb_silu(cr + j * c_bs + i0 * 16, i1 - i0, 16);
                }
            }
        }
    }
}

static void mb_gemm_rows(int64_t nrows, int64_t npix, int kb_n, const float *a, ptrdiff_t a_rs,
                         ptrdiff_t a_kbs, const float *b, ptrdiff_t ldb, int nb,
                         const float *bias, float *c, ptrdiff_t c_rs, ptrdiff_t c_bs,
                         const float *res, int act, float lo, float hi)
{
    mb_gemm_rows_map(nrows, npix, kb_n, a, a_rs, a_kbs, b, ldb, nb, bias, c, c_rs, c_bs, res, act,
                     lo, hi, NULL);
}

/* T (<= 8) depthwise outputs of one channel block for a KxK kernel (3 or 5)
 * with stride S (1 or 2): each input vector of a row is loaded once and used
 * by every tap that reads it (at most 7 * 2 + 5 = 19 vectors). */
MB_AI void mb_dw_tile(const int K, const int S, const int T, const float *const *rows,
                      ptrdiff_t off, const float *wk, __m512 bias, float *out, int act,
                      __m512 lo, __m512 hi)
{
    __m512 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t] = bias;
#pragma GCC unroll 5
    for (int ky = 0; ky < K; ky++) {
        if (!rows[ky]) continue;
        const float *r = rows[ky] + off;
        __m512 in[20];
#pragma GCC unroll 20
        for (int q = 0; q < (T - 1) * S + K; q++) in[q] = _mm512_loadu_ps(r + q * 16);
#pragma GCC unroll 5
        for (int kx = 0; kx < K; kx++) {
            __m512 wv = _mm512_loadu_ps(wk + (ky * K + kx) * 16);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) acc[t] = _mm512_fmadd_ps(wv, in[t * S + kx], acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        __m512 v = acc[t];
        if (act == KILN_MB_CLAMP) v = _mm512_min_ps(hi, _mm512_max_ps(lo, v));
        _mm512_storeu_ps(out + t * 16, v);
    }
}

/* Depthwise output row: rows[ky] is the padded band row of input row
 * oy * stride - pad + ky, or NULL where that row is outside the image;
 * channel block cb of the output row goes to d + cb * d_bs (block cb of a
 * band row is e_bs after block 0). */
MB_NOUB static void mb_dw_row(const struct kiln_mbconv *m, const float *const *rows_b0, ptrdiff_t e_bs,
                      float *d, ptrdiff_t d_bs, int cb0, int cb1)
{
    const int k = m->k, s = m->stride, act = m->act[1];
    const int64_t wo = m->wo;
    const __m512 lo = _mm512_set1_ps(m->lo[1]), hi = _mm512_set1_ps(m->hi[1]);
    for (int cb = cb0; cb < cb1; cb++) { /* rows_b0 and d hold block cb0 first */
        const float *rows[16];
        for (int ky = 0; ky < k; ky++)
            rows[ky] = rows_b0[ky] ? rows_b0[ky] + (cb - cb0) * e_bs : NULL;
        const float *wk = m->wd + (ptrdiff_t)cb * k * k * 16;
        const __m512 bias = _mm512_loadu_ps(m->bd + cb * 16);
        float *dcb = d + (cb - cb0) * d_bs;
        int64_t ox = 0;
#define MB_DW_TAIL(K, S, T)                                                                   \
    case T:                                                                                   \
        mb_dw_tile(K, S, T, rows, ox * (S) * 16, wk, bias, dcb + ox * 16, act, lo, hi);       \
        break;
#define MB_DW_CASE(K, S)                                                                      \
    if (k == (K) && s == (S)) {                                                               \
        for (; ox + 8 <= wo; ox += 8)                                                         \
            mb_dw_tile(K, S, 8, rows, ox * (S) * 16, wk, bias, dcb + ox * 16, act, lo, hi);   \
        switch (wo - ox) {                                                                    \
            MB_DW_TAIL(K, S, 1) MB_DW_TAIL(K, S, 2) MB_DW_TAIL(K, S, 3) MB_DW_TAIL(K, S, 4)   \
            MB_DW_TAIL(K, S, 5) MB_DW_TAIL(K, S, 6) MB_DW_TAIL(K, S, 7)                       \
        default: break;                                                                       \
        }                                                                                     \
        ox = wo;                                                                              \
    }
        MB_DW_CASE(3, 1)
        MB_DW_CASE(3, 2)
        MB_DW_CASE(5, 1)
        MB_DW_CASE(5, 2)
#undef MB_DW_CASE
#undef MB_DW_TAIL
        /* other kernels and strides (the pass makes none): one output at a time */
        for (; ox < wo; ox++) {
            __m512 acc = bias;
            for (int ky = 0; ky < k; ky++) {
                if (!rows[ky]) continue;
                const float *r = rows[ky] + ox * s * 16;
                for (int kx = 0; kx < k; kx++)
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(wk + (ky * k + kx) * 16),
                                          _mm512_loadu_ps(r + kx * 16), acc);
            }
            if (act == KILN_MB_CLAMP) acc = _mm512_min_ps(hi, _mm512_max_ps(lo, acc));
            _mm512_storeu_ps(dcb + ox * 16, acc);
        }
        if (act == KILN_MB_SILU) mb_silu(dcb, wo, 16);
    }
}

/* Input rows a band of m->band output rows reads at most. */
static int64_t mb_band_in_rows(const struct kiln_mbconv *m)
{
    return (m->band - 1) * m->stride + m->k;
}

int64_t kiln_mbconv_band(const struct kiln_mbconv *m)
{
    /* the band's expanded rows within 512 KiB (half the L2 of the CPUs this
     * kernel targets), then bands of near-equal height */
    int64_t row_bytes = (int64_t)m->ce_b * (m->w + 2 * m->pad) * 64;
    int64_t in_rows = (512 * 1024) / (row_bytes > 0 ? row_bytes : 1);
    int64_t band = in_rows > m->k ? (in_rows - m->k) / m->stride + 1 : 1;
    if (band > m->ho) band = m->ho;
    int64_t bands = (m->ho + band - 1) / band;
    return (m->ho + bands - 1) / bands;
}

size_t kiln_mbconv_scratch_floats(const struct kiln_mbconv *m)
{
    size_t in = (size_t)m->ce_b * (size_t)mb_band_in_rows(m) * (size_t)(m->w + 2 * m->pad) * 16;
    /* the band's depthwise output (with a squeeze-excitation it goes to dimg) */
    return in + (m->cse ? 0 : (size_t)m->ce_b * (size_t)(m->band * m->wo) * 16);
}

/* Zero the lanes past c channels in the last block of one output row
 * (blocks of wo pixels, block stride bs), so blocked padding stays zero. */
static void mb_zero_pad_lanes(float *row, int64_t c, int64_t blocks, ptrdiff_t bs, int64_t wo)
{
    if (c % 16 == 0) return;
    __mmask16 live = (__mmask16)((1u << (c % 16)) - 1);
    float *yl = row + (blocks - 1) * bs;
    for (int64_t ox = 0; ox < wo; ox++)
        _mm512_storeu_ps(yl + ox * 16, _mm512_maskz_mov_ps(live, _mm512_loadu_ps(yl + ox * 16)));
}

/* Output rows [r0, r1) of channel blocks [cb0, cb1) of the expanded
 * activation. Without dimg: the band's depthwise rows go to scratch and are
 * projected into y (all blocks). With dimg (one image; r0 and r1 in that
 * image): the depthwise rows go there and are summed into sums. */
static void mb_rows(const struct kiln_mbconv *m, const float *x, const float *res, float *y,
                    int64_t r0, int64_t r1, int cb0, int cb1, float *scratch, float *dimg,
                    float *sums)
{
    const int k = m->k, s = m->stride, pad = m->pad, nb = cb1 - cb0;
    const int64_t h = m->h, w = m->w, ho = m->ho, wo = m->wo, wp = w + 2 * pad;
    const int64_t in_rows = mb_band_in_rows(m);
    /* the band's expanded input rows: [nb][in_rows][wp][16], pad columns zero */
    const ptrdiff_t e_rs = wp * 16, e_bs = in_rows * e_rs;
    float *e = scratch, *d = scratch + (ptrdiff_t)m->ce_b * e_bs;
    const ptrdiff_t d_bs = dimg ? (ptrdiff_t)ho * wo * 16 : (ptrdiff_t)m->band * wo * 16;
    for (int cb = 0; cb < nb; cb++)
        for (int64_t row = 0; row < in_rows; row++) {
            float *r = e + cb * e_bs + row * e_rs;
            memset(r, 0, sizeof(float) * 16 * (size_t)pad);
            memset(r + (pad + w) * 16, 0, sizeof(float) * 16 * (size_t)pad);
        }
    const ptrdiff_t x_img = (ptrdiff_t)m->cin_b * h * w * 16, x_bs = (ptrdiff_t)h * w * 16;
    const ptrdiff_t y_img = (ptrdiff_t)m->cout_b * ho * wo * 16, y_bs = (ptrdiff_t)ho * wo * 16;
    int64_t cur_n = -1, first = 0, held = 0; /* e holds input rows first .. first + held - 1 */
    for (int64_t r = r0; r < r1;) {
        int64_t n = r / ho, oy0 = r % ho, nbr = m->band;
        if (nbr > ho - oy0) nbr = ho - oy0;
        if (nbr > r1 - r) nbr = r1 - r;
        int64_t top = oy0 * s - pad, lo_in = top > 0 ? top : 0;
        int64_t hi_in = top + (nbr - 1) * s + k - 1 < h - 1 ? top + (nbr - 1) * s + k - 1 : h - 1;
        if (n != cur_n || lo_in >= first + held) {
            cur_n = n;
            first = lo_in;
            held = 0;
        } else if (lo_in > first) { /* keep the rows this band reads again */
            int64_t drop = lo_in - first;
            for (int cb = 0; cb < nb; cb++)
                memmove(e + cb * e_bs, e + cb * e_bs + drop * e_rs,
                        sizeof(float) * (size_t)((held - drop) * e_rs));
            first = lo_in;
            held -= drop;
        }
        const float *xi = x + n * x_img;
        int64_t new_rows = hi_in - (first + held) + 1;
        if (new_rows > 0) {
            float *dst = e + held * e_rs;
            const float *src = xi + (first + held) * w * 16;
            if (m->we) {
                mb_gemm_rows(new_rows, w, m->cin_b, src, w * 16, x_bs, m->we + cb0 * 16,
                             (ptrdiff_t)m->ce_b * 16, nb, m->be + cb0 * 16, dst + pad * 16, e_rs,
                             e_bs, NULL, m->act[0], m->lo[0], m->hi[0]);
            } else { /* no expand: the band holds X's rows */
                for (int cb = 0; cb < nb; cb++)
                    for (int64_t row = 0; row < new_rows; row++)
                        memcpy(dst + cb * e_bs + row * e_rs + pad * 16,
                               src + (cb0 + cb) * x_bs + row * w * 16,
                               sizeof(float) * 16 * (size_t)w);
            }
            held += new_rows;
        }
        for (int64_t i = 0; i < nbr; i++) {
            const float *rows[16];
            for (int ky = 0; ky < k; ky++) {
                int64_t iy = (oy0 + i) * s - pad + ky;
                rows[ky] = iy >= 0 && iy < h ? e + (iy - first) * e_rs : NULL;
            }
            float *dr = dimg ? dimg + cb0 * d_bs + (oy0 + i) * wo * 16 : d + i * wo * 16;
            mb_dw_row(m, rows, e_bs, dr, d_bs, cb0, cb1);
            for (int cb = 0; sums && cb < nb; cb++) {
                vf acc = vld(sums + (cb0 + cb) * 16);
                for (int64_t ox = 0; ox < wo; ox++) acc += vld(dr + cb * d_bs + ox * 16);
                vst(sums + (cb0 + cb) * 16, acc);
            }
        }
        r += nbr;
        if (dimg) continue;
        float *yr = y + n * y_img + oy0 * wo * 16;
        mb_gemm_rows(1, nbr * wo, m->ce_b, d, 0, d_bs, m->wp, (ptrdiff_t)m->cout_b * 16,
                     m->cout_b, m->bp, yr, 0, y_bs, res ? res + (yr - y) : NULL, m->act[2],
                     m->lo[2], m->hi[2]);
        mb_zero_pad_lanes(yr, m->cout, m->cout_b, y_bs, nbr * wo);
    }
}

void kiln_mbconv_rows(const struct kiln_mbconv *m, const float *x, const float *res, float *y,
                      int64_t r0, int64_t r1, float *scratch)
{
    mb_rows(m, x, res, y, r0, r1, 0, m->ce_b, scratch, NULL, NULL);
}

void kiln_mbconv_se_dw(const struct kiln_mbconv *m, const float *x, int64_t n, int cb0, int cb1,
                       float *scratch, float *dimg, float *sums)
{
    memset(sums + cb0 * 16, 0, sizeof(float) * 16 * (size_t)(cb1 - cb0));
    mb_rows(m, x, NULL, NULL, n * m->ho, (n + 1) * m->ho, cb0, cb1, scratch, dimg, sums);
}

/* Blocks [cb, cb + NC) of NI images' gates from their hidden vectors (cse
 * floats apart); the gates are ce_b * 16 floats apart. */
MB_AI void mb_se_gate_blocks(const struct kiln_mbconv *m, const int NI, const int NC, int cb,
                             const float *hidden, float *gate)
{
    const ptrdiff_t cep = (ptrdiff_t)m->ce_b * 16;
    vf acc[4][4];
#pragma GCC unroll 4
    for (int t = 0; t < NI; t++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) acc[t][c] = vld(m->b2 + (cb + c) * 16);
    for (int q = 0; q < m->cse; q++) {
        vf wv[4];
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) wv[c] = vld(m->w2 + q * cep + (cb + c) * 16);
#pragma GCC unroll 4
        for (int t = 0; t < NI; t++) {
            vf h = vset(hidden[t * m->cse + q]);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) acc[t][c] = vfma(h, wv[c], acc[t][c]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NI; t++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) vst(gate + t * cep + (cb + c) * 16, v_sigmoid(acc[t][c]));
}

/* The gates of NI (1 or 4) images, each vector of W1 and W2 loaded once for
 * all of them: their sums and gates are ce_b * 16 floats apart, their
 * hidden vectors cse. Four rows of W1 at a time (its rows are padded with
 * zeros to a multiple of 4): four independent sums per image, as one chain
 * would wait on the FMA latency. */
MB_AI void mb_se_gates_n(const struct kiln_mbconv *m, const int NI, const float *sums,
                         float *gate, float *hidden)
{
    const ptrdiff_t cep = (ptrdiff_t)m->ce_b * 16;
    const float inv = 1.0f / (float)(m->ho * m->wo);
    for (int j = 0; j < m->cse; j += 4) {
        vf acc[4][4];
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
#pragma GCC unroll 4
            for (int t = 0; t < NI; t++) acc[q][t] = vset(0.0f);
        for (int cb = 0; cb < m->ce_b; cb++) {
            vf sv[4];
#pragma GCC unroll 4
            for (int t = 0; t < NI; t++) sv[t] = vld(sums + t * cep + cb * 16);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                vf wv = vld(m->w1 + (j + q) * cep + cb * 16);
#pragma GCC unroll 4
                for (int t = 0; t < NI; t++) acc[q][t] = vfma(wv, sv[t], acc[q][t]);
            }
        }
        for (int q = 0; q < 4 && j + q < m->cse; q++)
            for (int t = 0; t < NI; t++) {
                float v = m->b1[j + q] + _mm512_reduce_add_ps(acc[q][t]) * inv;
                if (m->act[3] == KILN_MB_CLAMP)
                    v = v < m->lo[3] ? m->lo[3] : v > m->hi[3] ? m->hi[3] : v;
                else if (m->act[3] == KILN_MB_SILU)
                    v = v / (1.0f + expf(-v));
                hidden[t * m->cse + j + q] = v;
            }
    }
    int cb = 0;
    for (; cb + 4 <= m->ce_b; cb += 4) mb_se_gate_blocks(m, NI, 4, cb, hidden, gate);
    for (; cb < m->ce_b; cb++) mb_se_gate_blocks(m, NI, 1, cb, hidden, gate);
}

void kiln_mbconv_se_gate(const struct kiln_mbconv *m, const float *sums, float *gate,
                         float *hidden)
{
    mb_se_gates_n(m, 1, sums, gate, hidden);
}

void kiln_mbconv_se_project(const struct kiln_mbconv *m, float *dimg, const float *gate,
                            int64_t n, int64_t p0, int64_t p1, int ob0, int ob1,
                            const float *res, float *y, float *work)
{
    const ptrdiff_t plane = (ptrdiff_t)m->ho * m->wo * 16, cop = (ptrdiff_t)m->cout_b * 16;
    const float *wp = m->wp, *a = dimg + p0 * 16;
    ptrdiff_t a_bs = plane;
    if (m->se_scale == KILN_MB_SE_SCALE_W) { /* row q of the weights times gate q */
        for (ptrdiff_t q = 0; q < (ptrdiff_t)m->ce_b * 16; q++) {
            vf g = vset(gate[q]);
            for (ptrdiff_t o = ob0 * 16; o < ob1 * 16; o += 16)
                vst(work + q * cop + o, vld(wp + q * cop + o) * g);
        }
        wp = work;
    } else {
        float *dst = m->se_scale == KILN_MB_SE_COPY_D ? work : dimg + p0 * 16;
        ptrdiff_t dst_bs = m->se_scale == KILN_MB_SE_COPY_D ? (p1 - p0) * 16 : plane;
        for (int cb = 0; cb < m->ce_b; cb++) {
            vf g = vld(gate + cb * 16);
            for (int64_t i = 0; i < p1 - p0; i++)
                vst(dst + cb * dst_bs + i * 16, vld(dimg + cb * plane + (p0 + i) * 16) * g);
        }
        a = dst;
        a_bs = dst_bs;
    }
    float *yp = y + n * (ptrdiff_t)m->cout_b * plane + ob0 * plane + p0 * 16;
    mb_gemm_rows(1, p1 - p0, m->ce_b, a, 0, a_bs, wp + ob0 * 16, cop, ob1 - ob0,
                 m->bp + ob0 * 16, yp, 0, plane, res ? res + (yp - y) : NULL, m->act[2],
                 m->lo[2], m->hi[2]);
    if (ob1 == m->cout_b) /* the last block's lanes past cout */
        mb_zero_pad_lanes(yp, m->cout - ob0 * 16, ob1 - ob0, plane, p1 - p0);
}

size_t kiln_mbconv_group_floats(const struct kiln_mbconv *m, int64_t g)
{
    const size_t blk = (size_t)m->ce_b * 16, wp = (size_t)(m->w + 2 * m->pad);
    /* per image: E and D; per image rounded up to 4 (mb_se_gates_n): the
     * sums, the gate and the hidden vector */
    const size_t g4 = (size_t)(g + 3) / 4 * 4;
    return (size_t)g * blk * ((size_t)m->h * wp + (size_t)(m->ho * m->wo)) +
           g4 * (2 * blk + (size_t)(m->cse + 15) / 16 * 16);
}

void kiln_mbconv_group(const struct kiln_mbconv *m, const float *x, const float *res, float *y,
                       int64_t n0, int64_t g, float *scratch)
{
    const int k = m->k, s = m->stride, pad = m->pad, ce_b = m->ce_b;
    const int64_t h = m->h, w = m->w, wo = m->wo, pix = m->ho * m->wo, wp = w + 2 * pad;
    const ptrdiff_t e_rs = wp * 16, e_bs = (ptrdiff_t)g * h * e_rs, d_bs = pix * 16;
    const ptrdiff_t d_img = (ptrdiff_t)ce_b * d_bs;
    const ptrdiff_t x_img = (ptrdiff_t)m->cin_b * h * w * 16, x_bs = (ptrdiff_t)h * w * 16;
    const ptrdiff_t y_img = (ptrdiff_t)m->cout_b * d_bs;
    float *e = scratch, *d = e + (ptrdiff_t)ce_b * e_bs, *sums = d + g * d_img;
    const int64_t g4 = (g + 3) / 4 * 4;
    float *gate = sums + g4 * ce_b * 16, *hidden = gate + g4 * ce_b * 16;
    const float *xg = x + n0 * x_img;
    /* E: [ce_b][g * h][wp][16], the images' rows one after another, pad columns zero */
    if (pad > 0)
        for (int cb = 0; cb < ce_b; cb++)
            for (int64_t row = 0; row < g * h; row++) {
                float *r = e + cb * e_bs + row * e_rs;
                memset(r, 0, sizeof(float) * 16 * (size_t)pad);
                memset(r + (pad + w) * 16, 0, sizeof(float) * 16 * (size_t)pad);
            }
    if (m->we) { /* one product over all the images' rows: each weight panel serves all */
        const struct mb_rowmap rm = {h, x_img, h * e_rs};
        mb_gemm_rows_map(g * h, w, m->cin_b, xg, w * 16, x_bs, m->we, (ptrdiff_t)ce_b * 16, ce_b,
                         m->be, e + pad * 16, e_rs, e_bs, NULL, m->act[0], m->lo[0], m->hi[0],
                         &rm);
    } else {
        for (int64_t i = 0; i < g; i++)
            for (int cb = 0; cb < ce_b; cb++)
                for (int64_t row = 0; row < h; row++)
                    memcpy(e + cb * e_bs + (i * h + row) * e_rs + pad * 16,
                           xg + i * x_img + cb * x_bs + row * w * 16, sizeof(float) * 16 * (size_t)w);
    }
    /* D: [g][ce_b][pix][16]; with a squeeze-excitation, each image's sums */
    if (m->cse) memset(sums, 0, sizeof(float) * 16 * (size_t)(g4 * ce_b));
    for (int64_t i = 0; i < g; i++)
        for (int64_t oy = 0; oy < m->ho; oy++) {
            const float *rows[16];
            for (int ky = 0; ky < k; ky++) {
                int64_t iy = oy * s - pad + ky;
                rows[ky] = iy >= 0 && iy < h ? e + (i * h + iy) * e_rs : NULL;
            }
            float *dr = d + i * d_img + oy * wo * 16;
            mb_dw_row(m, rows, e_bs, dr, d_bs, 0, ce_b);
            for (int cb = 0; m->cse && cb < ce_b; cb++) {
                vf acc = vld(sums + (i * ce_b + cb) * 16);
                for (int64_t ox = 0; ox < wo; ox++) acc += vld(dr + cb * d_bs + ox * 16);
                vst(sums + (i * ce_b + cb) * 16, acc);
            }
        }
    /* each image's D times its gate, in place */
    for (int64_t i = 0; m->cse && i < g; i += 4) { /* the sums of images past g are zero */
        const ptrdiff_t o = i * ce_b * 16;
        mb_se_gates_n(m, 4, sums + o, gate + o, hidden + i * m->cse);
    }
    for (int64_t i = 0; m->cse && i < g; i++) {
        for (int cb = 0; cb < ce_b; cb++) {
            vf gv = vld(gate + (i * ce_b + cb) * 16);
            float *dc = d + i * d_img + cb * d_bs;
            for (int64_t p = 0; p < pix; p++) vst(dc + p * 16, vld(dc + p * 16) * gv);
        }
    }
    /* one product over all the images (a row per image) */
    float *yg = y + n0 * y_img;
    mb_gemm_rows(g, pix, ce_b, d, d_img, d_bs, m->wp, (ptrdiff_t)m->cout_b * 16, m->cout_b, m->bp,
                 yg, y_img, d_bs, res ? res + n0 * y_img : NULL, m->act[2], m->lo[2], m->hi[2]);
    for (int64_t i = 0; i < g; i++)
        mb_zero_pad_lanes(yg + i * y_img, m->cout, m->cout_b, d_bs, pix);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
