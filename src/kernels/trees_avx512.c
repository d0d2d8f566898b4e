/*
 * trees_avx512.c - the padded level-order forest (trees_levels.h) walked
 * for 64 rows at a time with AVX-512 (compiled for it by a target pragma;
 * trees_fast.c calls it only where kiln_cpu_isa() is KILN_ISA_AVX512).
 *
 * Each tree is walked by four groups of 16 rows, one row per lane, level by
 * level; every lane takes exactly D steps (the tree is complete), so there
 * is no divergence to handle. A step looks up the lanes' nodes in the
 * level: levels 0-4 (at most 16 nodes) with one permute of a register,
 * level 5 with a two-register permute, level 6 with two of them and a
 * blend, deeper levels with a gather; then gathers the 16 rows' features
 * (one gather), compares (`x <= thr` holds: child 2i; NaN: child 2i unless
 * the node's bit 31 says so, as trees_fast.c's scalar step) and moves to
 * 2i or 2i + 1. The four groups of a level are independent, so their
 * gathers overlap. At the last level the index addresses the leaf table,
 * whose weights (doubles) are added to the rows' accumulators in tree
 * order: the same sums, in the same order, as the reference kernel.
 *
 * One row (kiln_tree_levels_row_avx512) turns this around: 16 trees at
 * once, one tree per lane, four groups of 16 trees in lockstep. A step of
 * a group finds the lanes' nodes: on levels 0-2 from the top_thr/top_feat
 * copies (16 trees' node p side by side: one load per candidate node and
 * blends on the index's bits), deeper with two gathers (threshold and
 * feature at lane_node + 2^level - 1 + index); then looks up the row's
 * features (a permute of the row held in registers when it has at most 64
 * features, else a gather), compares as above and moves on; lanes whose
 * tree is shallower than the level are masked off (their index stays on
 * its leaf slot). After the deepest tree of the block, the leaf slots are
 * stored and the weights added tree by tree, in tree order, as the
 * reference does.
 */
#include <immintrin.h>

#include "kernels/trees_levels.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx2,fma")
#endif

#define G 4 /* groups of 16 rows */

#define TL_AI static inline __attribute__((always_inline))

/* One step of group g: t, f are the lanes' thresholds and features. */
TL_AI __m512i tl_step(__m512i idx, __m512 t, __m512i f, __m512i rowoff, const float *x)
{
    const __m512i low31 = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
    __m512 v = _mm512_i32gather_ps(_mm512_add_epi32(rowoff, _mm512_and_si512(f, low31)), x, 4);
    __mmask16 right = _mm512_cmp_ps_mask(v, t, _CMP_NLE_UQ); /* fails, NaN included */
    __mmask16 nan_left = _mm512_mask_cmp_ps_mask(_mm512_movepi32_mask(f), v, v, _CMP_UNORD_Q);
    right = (__mmask16)(right & ~nan_left);
    __m512i twice = _mm512_add_epi32(idx, idx);
    return _mm512_mask_add_epi32(twice, right, twice, one);
}

void kiln_tree_levels_avx512(const struct kiln_tree_levels *lv, const float *x, int64_t nf, int rows,
                             double *acc)
{
    int ng = (rows + 15) / 16;
    __m512i rowoff[G];
    for (int g = 0; g < G; g++) {
        int32_t o[16];
        for (int l = 0; l < 16; l++) {
            int r = g * 16 + l;
            o[l] = (int32_t)((r < rows ? r : rows - 1) * nf); /* spare lanes repeat the last row */
        }
        rowoff[g] = _mm512_loadu_si512(o);
    }
    for (int t = 0; t < lv->n_trees; t++) {
        int depth = lv->depth[t];
        const float *thr = lv->thr + lv->node_off[t];
        const uint32_t *feat = lv->feat + lv->node_off[t];
        __m512i idx[G];
        for (int g = 0; g < G; g++) idx[g] = _mm512_setzero_si512();
        for (int level = 0; level < depth; level++) {
            const float *tb = thr + (1 << level) - 1;
            const uint32_t *fb = feat + (1 << level) - 1;
            if (level <= 4) {
                __m512 t0 = _mm512_loadu_ps(tb);
                __m512i f0 = _mm512_loadu_si512(fb);
                for (int g = 0; g < ng; g++)
                    idx[g] = tl_step(idx[g], _mm512_permutexvar_ps(idx[g], t0),
                                     _mm512_permutexvar_epi32(idx[g], f0), rowoff[g], x);
            } else if (level == 5) {
                __m512 t0 = _mm512_loadu_ps(tb), t1 = _mm512_loadu_ps(tb + 16);
                __m512i f0 = _mm512_loadu_si512(fb), f1 = _mm512_loadu_si512(fb + 16);
                for (int g = 0; g < ng; g++)
                    idx[g] = tl_step(idx[g], _mm512_permutex2var_ps(t0, idx[g], t1),
                                     _mm512_permutex2var_epi32(f0, idx[g], f1), rowoff[g], x);
            } else if (level == 6) {
                __m512 t0 = _mm512_loadu_ps(tb), t1 = _mm512_loadu_ps(tb + 16);
                __m512 t2 = _mm512_loadu_ps(tb + 32), t3 = _mm512_loadu_ps(tb + 48);
                __m512i f0 = _mm512_loadu_si512(fb), f1 = _mm512_loadu_si512(fb + 16);
                __m512i f2 = _mm512_loadu_si512(fb + 32), f3 = _mm512_loadu_si512(fb + 48);
                const __m512i bit5 = _mm512_set1_epi32(32);
                for (int g = 0; g < ng; g++) {
                    __mmask16 hi = _mm512_test_epi32_mask(idx[g], bit5);
                    __m512 tv = _mm512_mask_blend_ps(hi, _mm512_permutex2var_ps(t0, idx[g], t1),
                                                     _mm512_permutex2var_ps(t2, idx[g], t3));
                    __m512i fv = _mm512_mask_blend_epi32(hi, _mm512_permutex2var_epi32(f0, idx[g], f1),
                                                         _mm512_permutex2var_epi32(f2, idx[g], f3));
                    idx[g] = tl_step(idx[g], tv, fv, rowoff[g], x);
                }
            } else {
                for (int g = 0; g < ng; g++)
                    idx[g] = tl_step(idx[g], _mm512_i32gather_ps(idx[g], tb, 4),
                                     _mm512_i32gather_epi32(idx[g], (const int *)fb, 4), rowoff[g], x);
            }
        }
        int64_t width = (int64_t)1 << depth;
        for (int32_t k = lv->tgt_first[t]; k < lv->tgt_first[t + 1]; k++) {
            const double *w = lv->leaf + lv->leaf_off[t] + (k - lv->tgt_first[t]) * width;
            double *a = acc + (int64_t)lv->tgt[k] * KILN_TREE_LEVELS_ROWS;
            for (int g = 0; g < ng; g++) {
                __m512d lo = _mm512_i32gather_pd(_mm512_castsi512_si256(idx[g]), w, 8);
                __m512d hi = _mm512_i32gather_pd(_mm512_extracti64x4_epi64(idx[g], 1), w, 8);
                _mm512_storeu_pd(a + g * 16, _mm512_add_pd(_mm512_loadu_pd(a + g * 16), lo));
                _mm512_storeu_pd(a + g * 16 + 8, _mm512_add_pd(_mm512_loadu_pd(a + g * 16 + 8), hi));
            }
        }
    }
}

/* The row's features at the lanes' feature indexes fi: from registers when
 * the row has at most 64 features (xmode 1: 16, 2: 32, 3: 64), else a gather. */
TL_AI __m512 row_lookup(int xmode, __m512i fi, const __m512 *xr, const float *x, __mmask16 act)
{
    if (xmode == 1) return _mm512_permutexvar_ps(fi, xr[0]);
    if (xmode == 2) return _mm512_permutex2var_ps(xr[0], fi, xr[1]);
    if (xmode == 3)
        return _mm512_mask_blend_ps(_mm512_test_epi32_mask(fi, _mm512_set1_epi32(32)),
                                    _mm512_permutex2var_ps(xr[0], fi, xr[1]),
                                    _mm512_permutex2var_ps(xr[2], fi, xr[3]));
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), act, fi, x, 4);
}

_Static_assert(KILN_TREE_LEVELS_TOP == 3, "row_walk reads levels 0-2 with loads and blends");

TL_AI void row_walk(const struct kiln_tree_levels *lv, const float *x, int64_t nf, double *acc, int xmode)
{
    const __m512i low31 = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
    const __m512i zero = _mm512_setzero_si512();
    const int *feat = (const int *)lv->feat;
    __m512 xr[4];
    for (int k = 0; k < 4; k++) {
        int64_t left = nf - 16 * k;
        __mmask16 m = left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
        xr[k] = _mm512_maskz_loadu_ps(m, x + (left > 0 ? 16 * k : 0));
    }
    const int64_t lanes = lv->n_lanes;
    int32_t slot[KILN_TREE_LEVELS_TREES];
    for (int t0 = 0; t0 < lv->n_trees; t0 += KILN_TREE_LEVELS_TREES) {
        int nt = lv->n_trees - t0 < KILN_TREE_LEVELS_TREES ? lv->n_trees - t0 : KILN_TREE_LEVELS_TREES;
        int ng = (nt + 15) / 16;
        __m512i base[G], dep[G], idx[G];
        __m512i dmax = zero;
        for (int g = 0; g < ng; g++) {
            base[g] = _mm512_loadu_si512(lv->lane_node + t0 + 16 * g);
            dep[g] = _mm512_loadu_si512(lv->lane_depth + t0 + 16 * g);
            idx[g] = zero;
            dmax = _mm512_max_epi32(dmax, dep[g]);
        }
        int depth = _mm512_reduce_max_epi32(dmax);
        for (int level = 0; level < depth; level++) {
            const __m512i lvl = _mm512_set1_epi32(level), first = _mm512_set1_epi32((1 << level) - 1);
            for (int g = 0; g < ng; g++) {
                __mmask16 act = _mm512_cmpgt_epi32_mask(dep[g], lvl);
                __m512i f;
                __m512 t;
                if (level < KILN_TREE_LEVELS_TOP) {
                    /* the top levels' nodes of 16 trees side by side: loads and blends */
                    const float *tt = lv->top_thr + (int64_t)((1 << level) - 1) * lanes + t0 + 16 * g;
                    const int32_t *tf = (const int32_t *)lv->top_feat + (tt - lv->top_thr);
                    if (level == 0) {
                        t = _mm512_loadu_ps(tt);
                        f = _mm512_loadu_si512(tf);
                    } else { /* node idx of the level: blends of the 2 or 4 candidates */
                        __mmask16 b0 = _mm512_test_epi32_mask(idx[g], one);
                        t = _mm512_mask_blend_ps(b0, _mm512_loadu_ps(tt), _mm512_loadu_ps(tt + lanes));
                        f = _mm512_mask_blend_epi32(b0, _mm512_loadu_si512(tf), _mm512_loadu_si512(tf + lanes));
                        if (level == 2) {
                            __mmask16 b1 = _mm512_test_epi32_mask(idx[g], _mm512_set1_epi32(2));
                            __m512 t2 = _mm512_mask_blend_ps(b0, _mm512_loadu_ps(tt + 2 * lanes),
                                                             _mm512_loadu_ps(tt + 3 * lanes));
                            __m512i f2 = _mm512_mask_blend_epi32(b0, _mm512_loadu_si512(tf + 2 * lanes),
                                                                 _mm512_loadu_si512(tf + 3 * lanes));
                            t = _mm512_mask_blend_ps(b1, t, t2);
                            f = _mm512_mask_blend_epi32(b1, f, f2);
                        }
                    }
                } else {
                    __m512i at = _mm512_add_epi32(_mm512_add_epi32(base[g], first), idx[g]);
                    f = _mm512_mask_i32gather_epi32(zero, act, at, feat, 4);
                    t = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), act, at, lv->thr, 4);
                }
                __m512 v = row_lookup(xmode, _mm512_and_si512(f, low31), xr, x, act);
                __mmask16 right = _mm512_cmp_ps_mask(v, t, _CMP_NLE_UQ); /* fails, NaN included */
                __mmask16 nan_left = _mm512_mask_cmp_ps_mask(_mm512_movepi32_mask(f), v, v, _CMP_UNORD_Q);
                right = (__mmask16)(right & ~nan_left & act);
                __m512i twice = _mm512_mask_add_epi32(idx[g], act, idx[g], idx[g]);
                idx[g] = _mm512_mask_add_epi32(twice, right, twice, one);
            }
        }
        for (int g = 0; g < ng; g++) _mm512_storeu_si512(slot + 16 * g, idx[g]);
        for (int i = 0; i < nt; i++) {
            int t = t0 + i;
            int64_t width = (int64_t)1 << lv->depth[t];
            const double *w = lv->leaf + lv->leaf_off[t] + slot[i];
            for (int32_t k = lv->tgt_first[t]; k < lv->tgt_first[t + 1]; k++, w += width) acc[lv->tgt[k]] += *w;
        }
    }
}

void kiln_tree_levels_row_avx512(const struct kiln_tree_levels *lv, const float *x, int64_t nf, double *acc)
{
    if (nf <= 16) row_walk(lv, x, nf, acc, 1);
    else if (nf <= 32) row_walk(lv, x, nf, acc, 2);
    else if (nf <= 64) row_walk(lv, x, nf, acc, 3);
    else row_walk(lv, x, nf, acc, 0);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
