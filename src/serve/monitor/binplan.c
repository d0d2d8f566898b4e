/*
 * binplan.c - binning the columns of a float32 input in one pass
 * (binplan.h): integer keys, thresholds per lane, AVX-512, AVX2 or a
 * portable loop over blocks of 16 lanes.
 */
#include "serve/monitor/binplan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BINPLAN_X86 1
#endif

static int32_t key_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return kiln_mon_key(u);
}

int32_t kiln_mon_key_ge(double e)
{
    /* the smallest float f with (double)f >= e; of the two zeros, -0 (the lower key) */
    float f = (float)e;
    while ((double)f < e) f = nextafterf(f, INFINITY);
    while (f > -INFINITY && (double)nextafterf(f, -INFINITY) >= e) f = nextafterf(f, -INFINITY);
    if (f == 0.0f) f = -0.0f;
    return key_of(f);
}

int32_t kiln_mon_key_le(double e)
{
    /* the largest float f with (double)f <= e; of the two zeros, +0 (the higher key) */
    float f = (float)e;
    while ((double)f > e) f = nextafterf(f, -INFINITY);
    while (f < INFINITY && (double)nextafterf(f, INFINITY) <= e) f = nextafterf(f, INFINITY);
    if (f == 0.0f) f = 0.0f;
    return key_of(f);
}

int kiln_mon_binplan_init(kiln_mon_binplan *bp, int max_edges)
{
    memset(bp, 0, sizeof *bp);
    size_t n = (size_t)(max_edges > 0 ? max_edges : 1) * KILN_MON_PLAN_LANES;
    bp->thr = malloc(n * sizeof *bp->thr);
    if (!bp->thr) return 0;
    for (size_t i = 0; i < n; i++) bp->thr[i] = INT32_MAX;
    bp->path = kiln_mon_binplan_has_path(KILN_MON_PATH_AVX512) ? KILN_MON_PATH_AVX512
               : kiln_mon_binplan_has_path(KILN_MON_PATH_AVX2) ? KILN_MON_PATH_AVX2
                                                               : KILN_MON_PATH_PORTABLE;
    return 1;
}

void kiln_mon_binplan_free(kiln_mon_binplan *bp)
{
    free(bp->thr);
    bp->thr = NULL;
}

int kiln_mon_binplan_add(kiln_mon_binplan *bp, int feat, int col, const double *edges,
                         int n_edges, double lo, double hi, int base)
{
    if (bp->n >= KILN_MON_PLAN_LANES) return 0;
    int i = bp->n++;
    /* thr is laid out [k][KILN_MON_PLAN_LANES] while filling; lanes is the used width */
    bp->lanes = (bp->n + KILN_MON_PLAN_BLOCK - 1) / KILN_MON_PLAN_BLOCK * KILN_MON_PLAN_BLOCK;
    bp->col[i] = col;
    bp->feat[i] = feat;
    bp->base[i] = base;
    bp->lo[i] = kiln_mon_key_ge(lo); /* v < lo exactly when key(v) < lo */
    bp->hi[i] = kiln_mon_key_le(hi); /* v > hi exactly when key(v) > hi */
    for (int k = 0; k < n_edges; k++) bp->thr[(size_t)k * KILN_MON_PLAN_LANES + i] = kiln_mon_key_ge(edges[k]);
    if (n_edges > bp->n_thr) bp->n_thr = n_edges;
    if (col + 1 > bp->min_width) bp->min_width = col + 1;
    bp->contiguous = i == 0 || (bp->contiguous && col == bp->col[0] + i);
    /* padding lanes (i < lanes, unused): a zero value, never out of range, never counted */
    for (int j = bp->n; j < bp->lanes; j++) {
        bp->lo[j] = INT32_MIN;
        bp->hi[j] = INT32_MAX;
        bp->base[j] = 0;
    }
    return 1;
}

int kiln_mon_binplan_has_path(int path)
{
    switch (path) {
    case KILN_MON_PATH_PORTABLE: return 1;
#ifdef BINPLAN_X86
    case KILN_MON_PATH_AVX512: return __builtin_cpu_supports("avx512f") ? 1 : 0;
    case KILN_MON_PATH_AVX2: return __builtin_cpu_supports("avx2") ? 1 : 0;
#endif
    default: return 0;
    }
}

int kiln_mon_binplan_has_avx512(void)
{
    return kiln_mon_binplan_has_path(KILN_MON_PATH_AVX512);
}

/* One block of 16 lanes: the slot index of each lane (base + bin) and the
 * masks of the lanes holding a NaN or infinity, and out of range. */
static void block_portable(const kiln_mon_binplan *bp, int b, const uint32_t *u, int32_t *idx,
                           uint32_t *nf, uint32_t *rg)
{
    int32_t key[KILN_MON_PLAN_BLOCK], cnt[KILN_MON_PLAN_BLOCK];
    for (int i = 0; i < KILN_MON_PLAN_BLOCK; i++) {
        key[i] = kiln_mon_key(u[b + i]);
        cnt[i] = bp->base[b + i];
    }
    for (int k = 0; k < bp->n_thr; k++) {
        const int32_t *t = bp->thr + (size_t)k * KILN_MON_PLAN_LANES + b;
        for (int i = 0; i < KILN_MON_PLAN_BLOCK; i++) cnt[i] += key[i] >= t[i];
    }
    uint32_t mn = 0, mr = 0;
    for (int i = 0; i < KILN_MON_PLAN_BLOCK; i++) {
        idx[b + i] = cnt[i];
        mn |= (uint32_t)((u[b + i] & 0x7fffffffu) >= 0x7f800000u) << i;
        mr |= (uint32_t)((key[i] < bp->lo[b + i]) | (key[i] > bp->hi[b + i])) << i;
    }
    *nf = mn;
    *rg = mr;
}

#ifdef BINPLAN_X86
static inline __attribute__((target("avx512f"))) void block_avx512(const kiln_mon_binplan *bp, int b,
                                                             const uint32_t *u, int32_t *idx,
                                                             uint32_t *nf, uint32_t *rg)
{
    __m512i v = _mm512_loadu_si512((const void *)(u + b));
    __m512i mag = _mm512_set1_epi32(0x7fffffff);
    __m512i key = _mm512_xor_si512(v, _mm512_and_si512(_mm512_srai_epi32(v, 31), mag));
    __m512i cnt = _mm512_loadu_si512((const void *)(bp->base + b)), one = _mm512_set1_epi32(1);
    for (int k = 0; k < bp->n_thr; k++) {
        __m512i t = _mm512_loadu_si512((const void *)(bp->thr + (size_t)k * KILN_MON_PLAN_LANES + b));
        cnt = _mm512_mask_add_epi32(cnt, _mm512_cmpge_epi32_mask(key, t), cnt, one);
    }
    _mm512_storeu_si512((void *)(idx + b), cnt);
    *nf = _mm512_cmpge_epi32_mask(_mm512_and_si512(v, mag), _mm512_set1_epi32(0x7f800000));
    *rg = (uint32_t)_mm512_cmplt_epi32_mask(key, _mm512_loadu_si512((const void *)(bp->lo + b))) |
          (uint32_t)_mm512_cmpgt_epi32_mask(key, _mm512_loadu_si512((const void *)(bp->hi + b)));
}

/* The same as two halves of 8 lanes, both in each pass over the thresholds.
 * A lane's count is base + n_thr minus the thresholds above its key (cmpgt
 * gives -1 for each), the portable path's count of thresholds <= key. */
static inline __attribute__((target("avx2"))) void block_avx2(const kiln_mon_binplan *bp, int b,
                                                          const uint32_t *u, int32_t *idx,
                                                          uint32_t *nf, uint32_t *rg)
{
    const __m256i mag = _mm256_set1_epi32(0x7fffffff), big = _mm256_set1_epi32(0x7f7fffff);
    const __m256i n_thr = _mm256_set1_epi32(bp->n_thr);
    __m256i v0 = _mm256_loadu_si256((const __m256i *)(u + b));
    __m256i v1 = _mm256_loadu_si256((const __m256i *)(u + b + 8));
    __m256i key0 = _mm256_xor_si256(v0, _mm256_and_si256(_mm256_srai_epi32(v0, 31), mag));
    __m256i key1 = _mm256_xor_si256(v1, _mm256_and_si256(_mm256_srai_epi32(v1, 31), mag));
    __m256i cnt0 = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(bp->base + b)), n_thr);
    __m256i cnt1 = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(bp->base + b + 8)), n_thr);
    const int32_t *t = bp->thr + b;
    for (int k = 0; k < bp->n_thr; k++, t += KILN_MON_PLAN_LANES) {
        cnt0 = _mm256_add_epi32(cnt0, _mm256_cmpgt_epi32(_mm256_loadu_si256((const __m256i *)t), key0));
        cnt1 = _mm256_add_epi32(cnt1, _mm256_cmpgt_epi32(_mm256_loadu_si256((const __m256i *)(t + 8)), key1));
    }
    _mm256_storeu_si256((__m256i *)(idx + b), cnt0);
    _mm256_storeu_si256((__m256i *)(idx + b + 8), cnt1);
    __m256i nf0 = _mm256_cmpgt_epi32(_mm256_and_si256(v0, mag), big);
    __m256i nf1 = _mm256_cmpgt_epi32(_mm256_and_si256(v1, mag), big);
    __m256i out0 = _mm256_or_si256(
        _mm256_cmpgt_epi32(_mm256_loadu_si256((const __m256i *)(bp->lo + b)), key0),
        _mm256_cmpgt_epi32(key0, _mm256_loadu_si256((const __m256i *)(bp->hi + b))));
    __m256i out1 = _mm256_or_si256(
        _mm256_cmpgt_epi32(_mm256_loadu_si256((const __m256i *)(bp->lo + b + 8)), key1),
        _mm256_cmpgt_epi32(key1, _mm256_loadu_si256((const __m256i *)(bp->hi + b + 8))));
    *nf = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(nf0)) |
          (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(nf1)) << 8;
    *rg = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(out0)) |
          (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(out1)) << 8;
}
#endif

/* The rows, with BLOCK (block_portable, block_avx512 or block_avx2) for each block of lanes. */
#define BINPLAN_ROWS(BLOCK)                                                                      \
    uint32_t u[KILN_MON_PLAN_LANES];                                                             \
    int32_t idx[KILN_MON_PLAN_LANES];                                                            \
    memset(u, 0, sizeof u);                                                                      \
    for (int64_t r = 0; r < rows; r++) {                                                         \
        const float *row = x + r * width;                                                        \
        if (bp->contiguous) { /* whole blocks in fixed-size copies (inlined), then the rest */ \
            int full = bp->n / KILN_MON_PLAN_BLOCK * KILN_MON_PLAN_BLOCK;                          \
            for (int i = 0; i < full; i += KILN_MON_PLAN_BLOCK)                                    \
                memcpy(&u[i], row + bp->col[0] + i, KILN_MON_PLAN_BLOCK * sizeof *u);              \
            if (full < bp->n)                                                                      \
                memcpy(&u[full], row + bp->col[0] + full, (size_t)(bp->n - full) * sizeof *u);    \
        } else                                                                                   \
            for (int i = 0; i < bp->n; i++) memcpy(&u[i], &row[bp->col[i]], sizeof u[i]);        \
        uint64_t nf = 0, rg = 0;                                                                 \
        for (int b = 0; b < bp->lanes; b += KILN_MON_PLAN_BLOCK) {                               \
            uint32_t mn, mr;                                                                     \
            BLOCK(bp, b, u, idx, &mn, &mr);                                                      \
            nf |= (uint64_t)mn << b;                                                             \
            rg |= (uint64_t)mr << b;                                                             \
        }                                                                                        \
        if (!(nf | rg)) { /* the common row: every value finite and in range */                  \
            int i = 0;                                                                           \
            for (; i + 4 <= bp->n; i += 4) {                                                     \
                bins[idx[i]]++;                                                                  \
                bins[idx[i + 1]]++;                                                              \
                bins[idx[i + 2]]++;                                                              \
                bins[idx[i + 3]]++;                                                              \
            }                                                                                    \
            for (; i < bp->n; i++) bins[idx[i]]++;                                               \
            continue;                                                                            \
        }                                                                                        \
        for (int i = 0; i < bp->n; i++) {                                                        \
            int64_t *an = anom + (size_t)bp->feat[i] * KILN_MON_ANOM_KINDS;                      \
            if (nf >> i & 1) {                                                                   \
                an[(u[i] & 0x7fffffffu) == 0x7f800000u ? KILN_MON_ANOM_INF : KILN_MON_ANOM_NAN]++; \
                continue;                                                                        \
            }                                                                                    \
            if (rg >> i & 1) an[KILN_MON_ANOM_RANGE]++;                                          \
            bins[idx[i]]++;                                                                      \
        }                                                                                        \
    }

static void rows_portable(const kiln_mon_binplan *bp, const float *x, int64_t rows, int64_t width,
                          int64_t *bins, int64_t *anom)
{
    BINPLAN_ROWS(block_portable)
}

#ifdef BINPLAN_X86
__attribute__((target("avx512f"))) static void rows_avx512(const kiln_mon_binplan *bp,
                                                            const float *x, int64_t rows,
                                                            int64_t width, int64_t *bins,
                                                            int64_t *anom)
{
    BINPLAN_ROWS(block_avx512)
}

__attribute__((target("avx2"))) static void rows_avx2(const kiln_mon_binplan *bp, const float *x,
                                                      int64_t rows, int64_t width, int64_t *bins,
                                                      int64_t *anom)
{
    BINPLAN_ROWS(block_avx2)
}
#endif

void kiln_mon_binplan_rows_path(const kiln_mon_binplan *bp, int path, const float *x,
                                int64_t rows, int64_t width, int64_t *bins, int64_t *anom)
{
#ifdef BINPLAN_X86
    if (path == KILN_MON_PATH_AVX512) {
        rows_avx512(bp, x, rows, width, bins, anom);
        return;
    }
    if (path == KILN_MON_PATH_AVX2) {
        rows_avx2(bp, x, rows, width, bins, anom);
        return;
    }
#else
    (void)path;
#endif
    rows_portable(bp, x, rows, width, bins, anom);
}

void kiln_mon_binplan_rows(const kiln_mon_binplan *bp, const float *x, int64_t rows,
                           int64_t width, int64_t *bins, int64_t *anom)
{
    kiln_mon_binplan_rows_path(bp, bp->path, x, rows, width, bins, anom);
}
