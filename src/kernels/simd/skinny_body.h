/*
 * skinny_body.h - the product of a few rows by a large constant matrix,
 * C = alpha * A B with A [m][k] (m up to a few tens) and B packed in panels
 * of SK_U vectors of columns ([panel][k][SK_U * W], zeros past n), over the
 * vector vocabulary of simd_body.h, which includes it once per ISA (the
 * table's skinny_gemm). skinny.c drives it.
 *
 * With few rows a product is a stream through B: each weight is used m
 * times, so B's bytes, not the FMAs, bound it (a classifier head, the last
 * stages of a CNN or a transformer at batch 1). The panels make that stream
 * contiguous: a panel's k rows follow each other, SK_U vectors wide, and the
 * tile of up to SK_R rows keeps SK_R x SK_U sums in registers. A panel is
 * streamed once for the first tile of rows and read from cache by the next
 * ones (a panel of k = 3072 is 288 KB at 24 columns). The first tile reads
 * its panel as SK_NS streams, which one core draws from memory faster than
 * one stream.
 */

#define SK_U 3                /* vectors per panel */
#define SK_R (W >= 16 ? 8 : 4) /* rows per tile: 8 x 3 of 32 zmm, 4 x 3 of 16 ymm */
#define SK_PC (SK_U * W)       /* columns per panel */
#ifndef SK_PF
#define SK_PF 16
#endif
#ifndef SK_NS
#define SK_NS 4 /* streams a tile reads its panel in, from SK_NS_MIN rows of k */
#endif
#define SK_NS_MIN 64

/* The first n < W lanes of v to p (vst_part, with the bound W in the loop for the
 * compiler's array-bounds check, which cannot see n < W through the tile's unrolling). */
static inline void sk_st_part(float *p, vf v, int64_t n)
{
    float buf[W];
    vst(buf, v);
    for (int t = 0; t < W && t < n; t++) p[t] = buf[t];
}

/* Rows [0, R) of one panel: acc[i][u] over all of k, then stored (alpha applied) to
 * the panel's columns below n. */
static inline __attribute__((always_inline)) void
sk_tile(int64_t k, float alpha, const float *a, int64_t lda, const float *bp, float *c,
        int64_t ldc, int64_t ncols, const int R)
{
    vf acc[SK_R * SK_U];
#pragma GCC unroll 24
    for (int i = 0; i < R * SK_U; i++) acc[i] = vset(0.0f);
    /* The panel in SK_NS streams, its SK_NS quarters of k side by side, the rest of k
     * after them: one core reads about 16 GB/s from memory in one stream, 23 in two and
     * 25 in four (Zen 2), and the panel comes from memory for the first tile of rows.
     * 100 MB of B at m = 4 (k 4032, n 384) on one thread: 8.2-9.2 ms in one stream,
     * 5.6-6.3 in two, 4.3-5.3 in four, 6.7-7.5 in eight. */
    const int64_t h = k >= SK_NS_MIN ? k / SK_NS : 0;
    for (int64_t p = 0; p < h; p++) {
#pragma GCC unroll 4
        for (int st = 0; st < SK_NS; st++) {
            const float *bk = bp + (p + st * h) * SK_PC;
            if (SK_PF) {
                __builtin_prefetch(bk + SK_PF * SK_PC);
                __builtin_prefetch(bk + SK_PF * SK_PC + 16);
                if (W >= 16) __builtin_prefetch(bk + SK_PF * SK_PC + 32);
            }
            vf w[SK_U];
#pragma GCC unroll 3
            for (int u = 0; u < SK_U; u++) w[u] = vld(bk + u * W);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                const vf av = vset(a[i * lda + p + st * h]);
#pragma GCC unroll 3
                for (int u = 0; u < SK_U; u++)
                    acc[i * SK_U + u] = vfma(av, w[u], acc[i * SK_U + u]);
            }
        }
    }
    for (int64_t p = SK_NS * h; p < k; p++) {
        const float *bk = bp + p * SK_PC;
        if (SK_PF) { /* the stream ahead: a panel row is 1.5 (AVX2) or 3 cache lines */
            __builtin_prefetch(bk + SK_PF * SK_PC);
            __builtin_prefetch(bk + SK_PF * SK_PC + 16);
            if (W >= 16) __builtin_prefetch(bk + SK_PF * SK_PC + 32);
        }
        vf w[SK_U];
#pragma GCC unroll 3
        for (int u = 0; u < SK_U; u++) w[u] = vld(bk + u * W);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const vf av = vset(a[i * lda + p]);
#pragma GCC unroll 3
            for (int u = 0; u < SK_U; u++) acc[i * SK_U + u] = vfma(av, w[u], acc[i * SK_U + u]);
        }
    }
    const vf al = vset(alpha);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 3
        for (int u = 0; u < SK_U; u++) {
            int64_t left = ncols - u * W;
            if (left >= W) vst(c + i * ldc + u * W, acc[i * SK_U + u] * al);
            else if (left > 0)
                sk_st_part(c + i * ldc + u * W, acc[i * SK_U + u] * al, left);
        }
}

static void k_skinny_gemm(int64_t m, int64_t k, int64_t n, float alpha, const float *a,
                          int64_t lda, const float *bp, int64_t p0, int64_t p1, float *c,
                          int64_t ldc)
{
    for (int64_t pn = p0; pn < p1; pn++) {
        const float *panel = bp + pn * k * SK_PC;
        const int64_t j = pn * SK_PC, ncols = n - j < SK_PC ? n - j : SK_PC;
        int64_t i = 0;
        for (; i + SK_R <= m; i += SK_R)
            sk_tile(k, alpha, a + i * lda, lda, panel, c + i * ldc + j, ldc, ncols, SK_R);
        switch (m - i) {
#if SK_R > 4
        case 7: sk_tile(k, alpha, a + i * lda, lda, panel, c + i * ldc + j, ldc, ncols, 7); break;
        case 6: sk_tile(k, alpha, a + i * lda, lda, panel, c + i * ldc + j, ldc, ncols, 6); break;
        case 5: sk_tile(k, alpha, a + i * lda, lda, panel, c + i * ldc + j, ldc, ncols, 5); break;
        case 4: sk_tile(k, alpha, a + i * lda, lda, panel, c + i * ldc + j, ldc, ncols, 4); break;
#endif
        case 3: sk_tile(k, alpha, a + i * lda, lda, panel, c + i * ldc + j, ldc, ncols, 3); break;
        case 2: sk_tile(k, alpha, a + i * lda, lda, panel, c + i * ldc + j, ldc, ncols, 2); break;
        case 1: sk_tile(k, alpha, a + i * lda, lda, panel, c + i * ldc + j, ldc, ncols, 1); break;
        default: break;
        }
    }
}
#undef SK_R
#undef SK_PC
