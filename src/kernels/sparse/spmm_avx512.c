/*
 * spmm_avx512.c - the AVX-512 sparse x dense products of sparse.h: fp32
 * (AVX-512F: one broadcast weight times 64 lanes of A^T per stored value,
 * four 16-lane accumulators) and int8 (AVX-512 VNNI: one 4-byte block of
 * s8 weights broadcast and VPDPBUSD'd with 16 lanes x 4 u8 of A^T per
 * vector, exact s32 sums). Compiled for those ISAs by a target pragma and
 * called only after kiln_sparse_isa() saw them; tested against spmm.c.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/sparse/sparse.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vnni")
#endif

static __mmask16 lane_mask(int64_t left)
{
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

void kiln_sparse_f32_avx512(const struct kiln_sparse_w *w, const float *in, int64_t ldi, int64_t P,
                            float *out, int64_t ldo, int64_t n0, int64_t n1,
                            const struct kiln_sparse_epi *e);
void kiln_sparse_i8_vnni(const struct kiln_sparse_w *w, const uint8_t *in, int64_t P, int32_t zp,
                         float scale_a, float *out, int64_t ldo, int64_t n0, int64_t n1,
                         const struct kiln_sparse_epi *e);

void kiln_sparse_f32_avx512(const struct kiln_sparse_w *w, const float *in, int64_t ldi, int64_t P,
                            float *out, int64_t ldo, int64_t n0, int64_t n1,
                            const struct kiln_sparse_epi *e)
{
    const int B = w->block;
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t p0 = 0; p0 < P; p0 += 64) {
        __mmask16 m0 = lane_mask(P - p0), m1 = lane_mask(P - p0 - 16), m2 = lane_mask(P - p0 - 32),
                  m3 = lane_mask(P - p0 - 48);
        for (int64_t n = n0; n < n1; n++) {
            __m512 a0 = zero, a1 = zero, a2 = zero, a3 = zero;
            for (int64_t j = w->row_ptr[n]; j < w->row_ptr[n + 1]; j++) {
                const float *row = in + (int64_t)w->kidx[j] * ldi + p0;
                for (int b = 0; b < B; b++, row += ldi) {
                    __m512 v = _mm512_set1_ps(w->val[j * B + b]);
                    a0 = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(m0, row), a0);
                    if (m1) a1 = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(m1, row + 16), a1);
                    if (m2) a2 = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(m2, row + 32), a2);
                    if (m3) a3 = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(m3, row + 48), a3);
                }
            }
            if (e->bias) {
                __m512 bv = _mm512_set1_ps(e->bias[n]);
                a0 = _mm512_add_ps(a0, bv), a1 = _mm512_add_ps(a1, bv);
                a2 = _mm512_add_ps(a2, bv), a3 = _mm512_add_ps(a3, bv);
            }
            if (e->relu) {
                a0 = _mm512_max_ps(zero, a0), a1 = _mm512_max_ps(zero, a1);
                a2 = _mm512_max_ps(zero, a2), a3 = _mm512_max_ps(zero, a3);
            }
            float *o = out + n * ldo + p0;
            _mm512_mask_storeu_ps(o, m0, a0);
            _mm512_mask_storeu_ps(o + 16, m1, a1);
            _mm512_mask_storeu_ps(o + 32, m2, a2);
            _mm512_mask_storeu_ps(o + 48, m3, a3);
        }
    }
}

void kiln_sparse_i8_vnni(const struct kiln_sparse_w *w, const uint8_t *in, int64_t P, int32_t zp,
                         float scale_a, float *out, int64_t ldo, int64_t n0, int64_t n1,
                         const struct kiln_sparse_epi *e)
{
    const __m512 fzero = _mm512_setzero_ps(), sa = _mm512_set1_ps(scale_a);
    for (int64_t p0 = 0; p0 < P; p0 += 64) {
        __mmask16 m[4] = {lane_mask(P - p0), lane_mask(P - p0 - 16), lane_mask(P - p0 - 32),
                          lane_mask(P - p0 - 48)};
        for (int64_t n = n0; n < n1; n++) {
            __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t j = w->row_ptr[n]; j < w->row_ptr[n + 1]; j++) {
                const int32_t *row = (const int32_t *)(in + (((int64_t)w->kidx[j] / 4) * P + p0) * 4);
                int32_t q4;
                memcpy(&q4, w->qval + j * 4, 4);
                __m512i q = _mm512_set1_epi32(q4);
                a0 = _mm512_dpbusd_epi32(a0, _mm512_maskz_loadu_epi32(m[0], row), q);
                if (m[1]) a1 = _mm512_dpbusd_epi32(a1, _mm512_maskz_loadu_epi32(m[1], row + 16), q);
                if (m[2]) a2 = _mm512_dpbusd_epi32(a2, _mm512_maskz_loadu_epi32(m[2], row + 32), q);
                if (m[3]) a3 = _mm512_dpbusd_epi32(a3, _mm512_maskz_loadu_epi32(m[3], row + 48), q);
            }
            __m512i zs = _mm512_set1_epi32(zp * w->wsum[n]);
            __m512 sc = _mm512_set1_ps(w->scale[n]);
            __m512i acc[4] = {a0, a1, a2, a3};
            for (int v = 0; v < 4; v++) {
                if (!m[v]) break;
                __m512 y = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[v], zs));
                y = _mm512_mul_ps(y, sc);
                y = _mm512_mul_ps(y, sa);
                if (e->bias) y = _mm512_add_ps(y, _mm512_set1_ps(e->bias[n]));
                if (e->relu) y = _mm512_max_ps(fzero, y);
                _mm512_mask_storeu_ps(out + n * ldo + p0 + 16 * v, m[v], y);
            }
        }
    }
}

void kiln_sparse_tr16_avx512(const float *src, int64_t lds, int nr, float *dst, int64_t ldd, int nc);

/* The 16x16 transpose (sparse.h, kiln_sparse_tr16): unpack pairs of rows, shuffle
 * quadruples within 128-bit lanes, then gather the lanes. */
void kiln_sparse_tr16_avx512(const float *src, int64_t lds, int nr, float *dst, int64_t ldd, int nc)
{
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = i < nr ? _mm512_loadu_ps(src + i * lds) : _mm512_setzero_ps();
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* r[4i + m], lane j: column 4j + m of rows 4i .. 4i + 3 */
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int m = 0; m < 4; m++) {
        __m512 s0 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88);
        __m512 s1 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xDD);
        __m512 s2 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88);
        __m512 s3 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xDD);
        __m512 o[4] = {_mm512_shuffle_f32x4(s0, s2, 0x88), _mm512_shuffle_f32x4(s1, s3, 0x88),
                       _mm512_shuffle_f32x4(s0, s2, 0xDD), _mm512_shuffle_f32x4(s1, s3, 0xDD)};
        for (int j = 0; j < 4; j++)
            if (4 * j + m < nc) _mm512_storeu_ps(dst + (4 * j + m) * ldd, o[j]);
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
