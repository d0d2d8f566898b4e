/*
 * vocab_avx512.h - the vector vocabulary of simd_body.h over __m512 (16
 * lanes), for files compiled under an AVX-512 target pragma: the kernel
 * table (isa_avx512.c) and the fused block kernel (mbconv_avx512.c).
 */
#ifndef KILN_KERNELS_SIMD_VOCAB_AVX512_H
#define KILN_KERNELS_SIMD_VOCAB_AVX512_H

#include <immintrin.h>

typedef __m512 vf;
typedef __mmask16 vm;
#define W 16

static inline vf vld(const float *p) { return _mm512_loadu_ps(p); }
static inline void vst(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vset(float x) { return _mm512_set1_ps(x); }
/* lanes [0, n) of p, the others `fill`; lanes [0, n) of v to p (masked: nothing past n) */
#define SIMD_HAVE_PART 1
static inline __mmask16 vpart_mask(int64_t n)
{
    return n <= 0 ? 0 : n >= W ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}
static inline vf vld_part(const float *p, int64_t n, float fill)
{
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), vpart_mask(n), p);
}
static inline void vst_part(float *p, vf v, int64_t n) { _mm512_mask_storeu_ps(p, vpart_mask(n), v); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vmaxs(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vmins(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vm vlt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
static inline vm vnan(vf a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
static inline vf vsel(vm m, vf a, vf b) { return _mm512_mask_blend_ps(m, a, b); }
static inline vf vabs(vf a) { return _mm512_abs_ps(a); }
static inline vf vneg(vf a) { return _mm512_xor_ps(a, _mm512_set1_ps(-0.0f)); }
static inline vf vsqrt(vf a) { return _mm512_sqrt_ps(a); }
/* 1 / a for a in [1, 2]: the 14-bit estimate and one Newton step (within 3 ulp) */
static inline vf vrecip12(vf a)
{
    vf r = _mm512_rcp14_ps(a);
    return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(a, r, _mm512_set1_ps(1.0f)), r);
}
static inline vf vcopysign(vf mag, vf sign)
{
    const vf s = _mm512_set1_ps(-0.0f);
    return _mm512_or_ps(_mm512_andnot_ps(s, mag), _mm512_and_ps(s, sign));
}
static inline float vhsum(vf a) { return _mm512_reduce_add_ps(a); }
static inline float vhmax(vf a) { return _mm512_reduce_max_ps(a); }
static inline vf vround(vf a)
{
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* a * 2^floor(n), rounded once (overflow to inf, gradual underflow) */
#define KILN_V_SCALEF 1
static inline vf vscalef(vf a, vf n) { return _mm512_scalef_ps(a, n); }
static inline vf vpow2i(vf n)
{
    __m512i i = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(i, 23));
}
/* r[i][j] <- r[j][i] for the 16 x 16 floats of r[0..15]: 32-bit, 64-bit and
 * 128-bit interleaves, then the 256-bit halves */
/* even = a0 a2 .. a14 b0 b2 .. b14, odd = a1 a3 .. b15: the lanes of a then b by parity */
static inline void vdeint(vf a, vf b, vf *even, vf *odd)
{
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    *even = _mm512_permutex2var_ps(a, ie, b);
    *odd = _mm512_permutex2var_ps(a, io, b);
}
static inline void vtranspose(vf r[16])
{
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int k = 0; k < 2; k++) {
            __m512d a = _mm512_castps_pd(t[i + k]), b = _mm512_castps_pd(t[i + k + 2]);
            r[i + 2 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[i + 2 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int i = 0; i < 16; i += 8)
        for (int k = 0; k < 4; k++) {
            t[i + k] = _mm512_shuffle_f32x4(r[i + k], r[i + k + 4], 0x88);
            t[i + k + 4] = _mm512_shuffle_f32x4(r[i + k], r[i + k + 4], 0xdd);
        }
    for (int k = 0; k < 8; k++) {
        r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
        r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
    }
}

#endif
