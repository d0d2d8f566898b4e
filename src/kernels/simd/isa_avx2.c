/*
 * isa_avx2.c - the f32 kernel table for AVX2 with FMA: 8 lanes. The
 * vector vocabulary of simd_body.h over __m256, compiled for avx2/fma by a
 * target pragma; only called after kiln_cpu_isa() reported AVX2.
 */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/simd/simd.h"

#if defined(__clang__) /* clang ignores GCC's target pragma; it has its own form */
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

typedef __m256 vf;
typedef __m256 vm;
#define W 8
#define SIMD_TABLE kiln_simd_avx2
#define SIMD_ISA "avx2"

static inline vf vld(const float *p) { return _mm256_loadu_ps(p); }
static inline void vst(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vset(float x) { return _mm256_set1_ps(x); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vmaxs(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vmins(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vm vlt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
static inline vm vnan(vf a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
static inline vf vsel(vm m, vf a, vf b) { return _mm256_blendv_ps(a, b, m); }
static inline vf vabs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
static inline vf vneg(vf a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
static inline vf vsqrt(vf a) { return _mm256_sqrt_ps(a); }
/* 1 / a for a in [1, 2]: a division. The 12-bit estimate needs two Newton steps here, a
 * chain of 24 cycles against vdivps's 10 (Zen 2: sigmoid 8.6 -> 7.3 ns a vector) */
static inline vf vrecip12(vf a) { return _mm256_div_ps(_mm256_set1_ps(1.0f), a); }
/* even = a0 a2 .. a6 b0 b2 .. b6, odd = a1 a3 .. b7: the lanes of a then b, split by parity */
static inline void vdeint(vf a, vf b, vf *even, vf *odd)
{
    __m256 e = _mm256_shuffle_ps(a, b, 0x88), o = _mm256_shuffle_ps(a, b, 0xDD);
    *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xD8));
    *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), 0xD8));
}
static inline vf vcopysign(vf mag, vf sign)
{
    const vf s = _mm256_set1_ps(-0.0f);
    return _mm256_or_ps(_mm256_andnot_ps(s, mag), _mm256_and_ps(s, sign));
}
/* Lanes [0, n) of p, the others `fill` (vld_part), and lanes [0, n) of v to p (vst_part),
 * through vmaskmovps: no lane at or past n is touched. A stack buffer's scalar stores
 * followed by a vector load stall store forwarding, which dominated short rows. */
#define SIMD_HAVE_PART 1
static inline __m256i vpart_mask(int64_t n)
{
    int c = n < 0 ? 0 : n > W ? W : (int)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vld_part(const float *p, int64_t n, float fill)
{
    __m256i m = vpart_mask(n);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}
static inline void vst_part(float *p, vf v, int64_t n) { _mm256_maskstore_ps(p, vpart_mask(n), v); }
static inline float vhsum(vf a)
{
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
    return _mm_cvtss_f32(v);
}
static inline float vhmax(vf a)
{
    __m128 v = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    v = _mm_max_ps(v, _mm_movehl_ps(v, v));
    v = _mm_max_ss(v, _mm_shuffle_ps(v, v, 1));
    return _mm_cvtss_f32(v);
}
static inline vf vround(vf a)
{
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline vf vpow2i(vf n)
{
    __m256i i = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(i, 23));
}
/* r[i][j] <- r[j][i] for the 8 x 8 floats of r[0..7] */
static inline void vtranspose(vf r[8])
{
    __m256 t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4)
        for (int k = 0; k < 2; k++) {
            r[i + 2 * k] = _mm256_shuffle_ps(t[i + k], t[i + k + 2], 0x44);
            r[i + 2 * k + 1] = _mm256_shuffle_ps(t[i + k], t[i + k + 2], 0xee);
        }
    for (int k = 0; k < 4; k++) {
        t[k] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x20);
        t[k + 4] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x31);
    }
    for (int k = 0; k < 8; k++) r[k] = t[k];
}

#include "kernels/simd/simd_body.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
