/*
 * lut8.c - fast KilnLut8 (the qlut_fusion pass, src/opt/qlut.c): y[i] =
 * table[x[i]] (x + 128 for int8 x), the same table reads as the reference
 * kernel (ref/lut8.c), so bit for bit the same. 8-bit tables with AVX-512
 * VBMI: two vpermi2b lookups of 128 entries each, chosen by the index's top
 * bit, 64 elements at a time; float tables with AVX-512 gathers, 16 at a
 * time; other CPUs in plain C. Rows
 * split across the run's threads. Storage order does not matter to an
 * elementwise table read: plain or channels last on both sides, or either
 * on each side when the value has one pixel (N, C, 1, 1: the same bytes).
 * Declared in the 8-bit family (quant8.def, family.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "core/threadpool.h"
#include "kernels/fast.h"
#include "kernels/family.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/quant8.def"
#undef KILN_KERNEL

struct lut_state {
    union {
        uint8_t b[256];
        float f[256];
    } t;
    int f32, off, vbmi, avx512;
};

struct lut_job {
    const struct lut_state *s;
    const uint8_t *x;
    void *y;
};

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vbmi")
#endif

static int64_t lut_vbmi(const struct lut_state *s, const uint8_t *x, uint8_t *y, int64_t b, int64_t e)
{
    __m512i t0 = _mm512_loadu_si512(s->t.b), t1 = _mm512_loadu_si512(s->t.b + 64);
    __m512i t2 = _mm512_loadu_si512(s->t.b + 128), t3 = _mm512_loadu_si512(s->t.b + 192);
    __m512i flip = _mm512_set1_epi8((char)(s->off ? 0x80 : 0));
    int64_t i = b;
    for (; i + 64 <= e; i += 64) {
        __m512i k = _mm512_xor_si512(_mm512_loadu_si512(x + i), flip); /* int8: + 128 */
        __m512i lo = _mm512_permutex2var_epi8(t0, k, t1), hi = _mm512_permutex2var_epi8(t2, k, t3);
        __mmask64 top = _mm512_movepi8_mask(k);
        _mm512_storeu_si512(y + i, _mm512_mask_blend_epi8(top, lo, hi));
    }
    return i;
}

static int64_t lut_gather(const struct lut_state *s, const uint8_t *x, float *y, int64_t b, int64_t e)
{
    __m128i flip = _mm_set1_epi8((char)(s->off ? 0x80 : 0));
    int64_t i = b;
    for (; i + 16 <= e; i += 16) {
        __m128i k = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(x + i)), flip);
        _mm512_storeu_ps(y + i, _mm512_i32gather_ps(_mm512_cvtepu8_epi32(k), s->t.f, 4));
    }
    return i;
}

/* A float table as four byte planes (plane j: byte j of each entry), for lut64_f32. */
struct f32_planes {
    uint8_t b[4][256];
};

/* The byte order into which lut64_f32 permutes its codes so that its unpacks put the 64
 * floats back in order: code i of d_r (lane L = i / 4, m = i % 4) sits at byte
 * L * 16 + r * 4 + m after the unpacks, and must be element r * 16 + i. */
static __m512i lut64_perm(void)
{
    uint8_t idx[64];
    for (int l = 0; l < 4; l++)
        for (int r = 0; r < 4; r++)
            for (int m = 0; m < 4; m++) idx[l * 16 + r * 4 + m] = (uint8_t)(r * 16 + l * 4 + m);
    return _mm512_loadu_si512(idx);
}

/* 64 float table entries without gathers (AVX-512 VBMI): each byte plane by two vpermi2b
 * and a blend on the code's top bit, then bytes to dwords by unpacks; out[r] holds the
 * entries of codes 16 r .. 16 r + 15. */
static inline void lut64_f32(const __m512i *tb, __m512i perm, __m512i codes, __m512 out[4])
{
    __m512i c = _mm512_permutexvar_epi8(perm, codes), b[4];
    __mmask64 top = _mm512_movepi8_mask(c);
    for (int j = 0; j < 4; j++)
        b[j] = _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(tb[4 * j], c, tb[4 * j + 1]),
                                      _mm512_permutex2var_epi8(tb[4 * j + 2], c, tb[4 * j + 3]));
    __m512i wl = _mm512_unpacklo_epi8(b[0], b[1]), wh = _mm512_unpackhi_epi8(b[0], b[1]);
    __m512i vl = _mm512_unpacklo_epi8(b[2], b[3]), vh = _mm512_unpackhi_epi8(b[2], b[3]);
    out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(wl, vl));
    out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(wl, vl));
    out[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(wh, vh));
    out[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(wh, vh));
}

static void load_planes(const struct f32_planes *p, __m512i tb[16])
{
    for (int j = 0; j < 4; j++)
        for (int h = 0; h < 4; h++) tb[4 * j + h] = _mm512_loadu_si512(p->b[j] + 64 * h);
}

/* KilnLut8Pool, channels last, with VBMI: nc (at most 64) channels from x, plane pixels
 * `stride` apart; out[k] = sum of table[x] in double, each channel's pixels in order. */
static void lutpool_vbmi(const struct f32_planes *pl, uint8_t off, const uint8_t *x,
                         int64_t stride, int64_t plane, int nc, double *out)
{
    __m512i tb[16], perm = lut64_perm(), flip = _mm512_set1_epi8((char)off);
    load_planes(pl, tb);
    __m512d acc[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm512_setzero_pd();
    __mmask64 m = nc >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << nc) - 1);
    int nv = (nc + 15) / 16;
    for (int64_t p = 0; p < plane; p++, x += stride) {
        __m512 f[4];
        lut64_f32(tb, perm, _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, x), flip), f);
        for (int r = 0; r < nv; r++) {
            __m256 lo = _mm512_castps512_ps256(f[r]);
            __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f[r]), 1));
            acc[2 * r] = _mm512_add_pd(acc[2 * r], _mm512_cvtps_pd(lo));
            acc[2 * r + 1] = _mm512_add_pd(acc[2 * r + 1], _mm512_cvtps_pd(hi));
        }
    }
    double tmp[64];
    for (int j = 0; j < 8; j++) _mm512_storeu_pd(tmp + 8 * j, acc[j]);
    memcpy(out, tmp, sizeof(double) * (size_t)nc);
}

/* KilnLut8Mul over len elements: y = Q(table[x] * g[i * gstride]). */
struct lutmul_state {
    float t[256], sy, zy, lo, hi;
    struct f32_planes pl;
    int off, is_signed, avx512, vbmi, nhwc;
    int64_t n, c, plane, ns;
};

/* Units b .. e of KilnLut8Mul (rows of c channels last, or planes), the tables loaded once. */
static void lutmul_vbmi(const struct lutmul_state *s, const uint8_t *x0, uint8_t *y0,
                        const float *g0, int64_t b, int64_t e)
{
    __m512i tb[16], perm = lut64_perm(), flip = _mm512_set1_epi8((char)s->off);
    load_planes(&s->pl, tb);
    __m512 sy = _mm512_set1_ps(s->sy), zy = _mm512_set1_ps(s->zy), zero = _mm512_setzero_ps();
    __m512 vlo = _mm512_set1_ps(s->lo), vhi = _mm512_set1_ps(s->hi);
    int64_t len = s->nhwc ? s->c : s->plane;
    int gstride = s->nhwc;
    for (int64_t u = b; u < e; u++) {
        const uint8_t *x = x0 + u * len;
        uint8_t *y = y0 + u * len;
        const float *g = s->nhwc ? g0 + (s->ns == s->c ? 0 : u / s->plane * s->c)
                                 : g0 + (s->ns == s->c ? u % s->c : u);
        __m512 gb = _mm512_set1_ps(g[0]);
        for (int64_t i = 0; i < len; i += 64) {
            __mmask64 m = len - i >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (len - i)) - 1);
            __m512 f[4];
            lut64_f32(tb, perm, _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, x + i), flip), f);
            for (int r = 0; r < 4; r++) {
                __mmask16 mr = (__mmask16)(m >> (16 * r));
                if (!mr) break;
                __m512 gv = gstride ? _mm512_maskz_loadu_ps(mr, g + i + 16 * r) : gb;
                __m512 q = _mm512_div_ps(_mm512_mul_ps(f[r], gv), sy);
                q = _mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                q = _mm512_add_ps(q, zy);
                __mmask16 nan = _mm512_cmp_ps_mask(q, q, _CMP_UNORD_Q);
                q = _mm512_min_ps(_mm512_max_ps(q, vlo), vhi);
                q = _mm512_mask_mov_ps(q, nan, zero);
                __m512i qi = _mm512_cvtps_epi32(q);
                __m128i packed =
                    s->is_signed ? _mm512_cvtsepi32_epi8(qi) : _mm512_cvtusepi32_epi8(qi);
                _mm_mask_storeu_epi8(y + i + 16 * r, mr, packed);
            }
        }
    }
}

static void lutmul_avx512(const struct lutmul_state *s, const uint8_t *x, uint8_t *y, int64_t len,
                          const float *g, int gstride)
{
    __m512 sy = _mm512_set1_ps(s->sy), zy = _mm512_set1_ps(s->zy), zero = _mm512_setzero_ps();
    __m512 vlo = _mm512_set1_ps(s->lo), vhi = _mm512_set1_ps(s->hi), gb = _mm512_set1_ps(g[0]);
    __m128i flip = _mm_set1_epi8((char)(s->off ? 0x80 : 0));
    for (int64_t i = 0; i < len; i += 16) {
        __mmask16 m = len - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (len - i)) - 1);
        __m128i k = _mm_xor_si128(_mm_maskz_loadu_epi8(m, x + i), flip);
        __m512 tv = _mm512_mask_i32gather_ps(zero, m, _mm512_cvtepu8_epi32(k), s->t, 4);
        __m512 v = _mm512_mul_ps(tv, gstride ? _mm512_maskz_loadu_ps(m, g + i) : gb);
        __m512 r = _mm512_div_ps(v, sy);
        r = _mm512_add_ps(_mm512_roundscale_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zy);
        __mmask16 nan = _mm512_cmp_ps_mask(r, r, _CMP_UNORD_Q);
        r = _mm512_min_ps(_mm512_max_ps(r, vlo), vhi);
        r = _mm512_mask_mov_ps(r, nan, zero);
        __m512i q = _mm512_cvtps_epi32(r);
        __m128i packed = s->is_signed ? _mm512_cvtsepi32_epi8(q) : _mm512_cvtusepi32_epi8(q);
        _mm_mask_storeu_epi8(y + i, m, packed);
    }
}

/* KilnLut8Pool, channels last: for nc (a multiple of 8, at most 64) channels from x, plane
 * pixels C apart, acc[k] += table[x] in double, each channel's pixels in order (the
 * reference's order). */
static void lutpool_avx512(const float *t, uint8_t off, const uint8_t *x, int64_t stride,
                           int64_t plane, int nc, double *out)
{
    __m512d acc[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm512_setzero_pd();
    __m128i flip = _mm_set1_epi8((char)off);
    for (int64_t p = 0; p < plane; p++, x += stride)
        for (int j = 0; j < nc / 8; j++) {
            __m128i k = _mm_xor_si128(_mm_loadl_epi64((const __m128i *)(x + 8 * j)), flip);
            __m256 v = _mm256_i32gather_ps(t, _mm256_cvtepu8_epi32(k), 4);
            acc[j] = _mm512_add_pd(acc[j], _mm512_cvtps_pd(v));
        }
    for (int j = 0; j < nc / 8; j++) _mm512_storeu_pd(out + 8 * j, acc[j]);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* (outside the AVX-512 region: it runs at compile time on any CPU) */
static void planes_of(const float *t, struct f32_planes *p)
{
    for (int k = 0; k < 256; k++) {
        uint8_t v[4];
        memcpy(v, &t[k], 4);
        for (int j = 0; j < 4; j++) p->b[j][k] = v[j];
    }
}

static void lut_range(void *arg, int64_t b, int64_t e)
{
    const struct lut_job *j = arg;
    const struct lut_state *s = j->s;
    const uint8_t *x = j->x;
    if (s->f32) {
        float *y = j->y;
        for (int64_t i = s->avx512 ? lut_gather(s, x, y, b, e) : b; i < e; i++) y[i] = s->t.f[(uint8_t)(x[i] ^ s->off)];
        return;
    }
    uint8_t *y = j->y;
    int64_t i = s->vbmi ? lut_vbmi(s, x, y, b, e) : b;
    for (; i < e; i++) y[i] = s->t.b[(uint8_t)(x[i] ^ s->off)];
}

static kiln_status lut_run(void *state, struct kiln_run_ctx *ctx)
{
    struct lut_job j = {state, ctx->in[0]->data, ctx->out[0]->data};
    kiln_parallel_for(ctx->threads, kiln_tensor_count(ctx->out[0]), 65536, lut_range, &j);
    return KILN_OK;
}

kiln_status kiln_k_lut8_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    if (cc->n_in < 2 || cc->n_out < 1 || !cc->in_value || !cc->in_value[1]) return KILN_OK;
    const struct kiln_type *x = cc->in[0], *y = cc->out[0];
    const kiln_tensor *t = cc->in_value[1];
    if (!x || !y || (x->dtype != KILN_DTYPE_U8 && x->dtype != KILN_DTYPE_I8) ||
        kiln_tensor_count(t) != 256 || t->dtype != y->dtype ||
        (t->dtype != KILN_DTYPE_U8 && t->dtype != KILN_DTYPE_I8 && t->dtype != KILN_DTYPE_F32))
        return KILN_OK;
    int li = cc->in_layout ? cc->in_layout[0] : 0, lo = cc->out_layout ? cc->out_layout[0] : 0;
    if ((li && li != KILN_LAYOUT_NHWC) || (lo && lo != KILN_LAYOUT_NHWC)) return KILN_OK;
    if (li != lo && (x->rank != 4 || x->dims[2] != 1 || x->dims[3] != 1)) return KILN_OK;
    struct lut_state *s = malloc(sizeof *s);
    if (!s) return kiln_node_error(cc->node, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    memset(s, 0, sizeof *s);
    s->f32 = t->dtype == KILN_DTYPE_F32;
    memcpy(&s->t, t->data, s->f32 ? 1024 : 256);
    s->off = x->dtype == KILN_DTYPE_I8 ? 0x80 : 0; /* int8 v + 128 = (uint8)v ^ 0x80 */
    __builtin_cpu_init();
    const char *isa = getenv("KILN_ISA");
    s->avx512 = !(isa && (!strcmp(isa, "scalar") || !strcmp(isa, "avx2"))) &&
                __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl");
    s->vbmi = !s->f32 && s->avx512 && __builtin_cpu_supports("avx512vbmi");
    inst->state = s;
    inst->destroy = free;
    inst->run = lut_run;
    inst->inplace = !s->f32 && li == lo; /* y[i] reads x[i] only */
    inst->name = s->f32 ? (s->avx512 ? "avx512_lut8_f32" : "c_lut8_f32")
                        : s->vbmi ? "avx512vbmi_lut8" : "c_lut8";
    return KILN_OK;
}


/* ---- KilnLut8Mul: y = Q(table[x] * s[n, c]), the float32 arithmetic of the reference ---- */

static void lutmul_span(const struct lutmul_state *s, const uint8_t *x, uint8_t *y, int64_t len,
                        const float *g, int gstride)
{
    if (s->avx512) {
        lutmul_avx512(s, x, y, len, g, gstride);
        return;
    }
    for (int64_t i = 0; i < len; i++) {
        float v = s->t[(uint8_t)(x[i] ^ s->off)] * g[gstride ? i : 0];
        float r = rintf(v / s->sy) + s->zy;
        r = isnan(r) ? 0.0f : r < s->lo ? s->lo : r > s->hi ? s->hi : r;
        if (s->is_signed) ((int8_t *)y)[i] = (int8_t)r;
        else y[i] = (uint8_t)r;
    }
}

struct lutmul_job {
    const struct lutmul_state *s;
    const uint8_t *x;
    const float *g;
    uint8_t *y;
};

/* units: planes (n, c) of `plane` elements, or channels-last rows (n, pixel) of c */
static void lutmul_range(void *arg, int64_t b, int64_t e)
{
    const struct lutmul_job *j = arg;
    const struct lutmul_state *s = j->s;
    if (s->vbmi) {
        lutmul_vbmi(s, j->x, j->y, j->g, b, e);
        return;
    }
    for (int64_t u = b; u < e; u++) {
        if (s->nhwc) {
            const float *g = j->g + (s->ns == s->c ? 0 : u / s->plane * s->c);
            lutmul_span(s, j->x + u * s->c, j->y + u * s->c, s->c, g, 1);
        } else {
            const float *g = j->g + (s->ns == s->c ? u % s->c : u);
            lutmul_span(s, j->x + u * s->plane, j->y + u * s->plane, s->plane, g, 0);
        }
    }
}

static kiln_status lutmul_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct lutmul_state *s = state;
    struct lutmul_job j = {s, ctx->in[0]->data, ctx->in[2]->data, ctx->out[0]->data};
    int64_t units = s->nhwc ? s->n * s->plane : s->n * s->c;
    int64_t len = s->nhwc ? s->c : s->plane;
    kiln_parallel_for(ctx->threads, units, len > 0 && len < 32768 ? 32768 / len : 1, lutmul_range, &j);
    return KILN_OK;
}

/* A 4-D 8-bit x of static C, H, W, a float table of 256 and the layouts that keep each
 * element where the reference has it, or say which order (channels last) it is in. */
static bool lut_float_x(const struct kiln_compile_ctx *cc, int *nhwc)
{
    const struct kiln_type *x = cc->in[0];
    if (cc->n_in < 2 || cc->n_out < 1 || !cc->in_value || !cc->in_value[1] || !x ||
        (x->dtype != KILN_DTYPE_U8 && x->dtype != KILN_DTYPE_I8) || x->rank != 4)
        return false;
    for (int d = 0; d < 4; d++)
        if (x->dims[d] < 1) return false;
    const kiln_tensor *t = cc->in_value[1];
    if (t->dtype != KILN_DTYPE_F32 || kiln_tensor_count(t) != 256) return false;
    int li = cc->in_layout ? cc->in_layout[0] : 0;
    if (li && li != KILN_LAYOUT_NHWC) return false;
    *nhwc = li == KILN_LAYOUT_NHWC && x->dims[2] * x->dims[3] > 1;
    return true;
}

kiln_status kiln_k_lut8_mul_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    int nhwc;
    if (cc->n_in < 4 || !lut_float_x(cc, &nhwc) || !cc->in[2] || !cc->in_value[3]) return KILN_OK;
    const struct kiln_type *x = cc->in[0], *g = cc->in[2], *y = cc->out[0];
    const kiln_tensor *sc = cc->in_value[3];
    const kiln_tensor *zp = cc->n_in > 4 && cc->in[4] ? cc->in_value[4] : NULL;
    int li = cc->in_layout ? cc->in_layout[0] : 0, lo = cc->out_layout ? cc->out_layout[0] : 0;
    int64_t ns = kiln_shape_count(g->rank, g->dims);
    if (li != lo || !y || (y->dtype != KILN_DTYPE_U8 && y->dtype != KILN_DTYPE_I8) ||
        g->dtype != KILN_DTYPE_F32 || (ns != x->dims[1] && ns != x->dims[0] * x->dims[1]) ||
        sc->dtype != KILN_DTYPE_F32 || kiln_tensor_count(sc) != 1 ||
        (cc->n_in > 4 && cc->in[4] && (!zp || zp->dtype != y->dtype || kiln_tensor_count(zp) != 1)))
        return KILN_OK;
    struct lutmul_state *s = malloc(sizeof *s);
    if (!s) return kiln_node_error(cc->node, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    memset(s, 0, sizeof *s);
    memcpy(s->t, cc->in_value[1]->data, sizeof s->t);
    s->sy = ((const float *)sc->data)[0];
    s->zy = zp ? (float)kiln_get_i64(zp->dtype, zp->data, 0) : 0.0f;
    s->is_signed = y->dtype == KILN_DTYPE_I8;
    s->lo = s->is_signed ? -128.0f : 0.0f;
    s->hi = s->is_signed ? 127.0f : 255.0f;
    s->off = x->dtype == KILN_DTYPE_I8 ? 0x80 : 0;
    s->nhwc = nhwc;
    s->n = x->dims[0];
    s->c = x->dims[1];
    s->plane = x->dims[2] * x->dims[3];
    s->ns = ns;
    __builtin_cpu_init();
    const char *isa = getenv("KILN_ISA");
    s->avx512 = !(isa && (!strcmp(isa, "scalar") || !strcmp(isa, "avx2"))) &&
                __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl");
    s->vbmi = s->avx512 && __builtin_cpu_supports("avx512vbmi");
    planes_of(s->t, &s->pl);
    inst->state = s;
    inst->destroy = free;
    inst->run = lutmul_run;
    inst->name = s->vbmi ? "avx512vbmi_lut8_mul" : s->avx512 ? "avx512_lut8_mul" : "c_lut8_mul";
    return KILN_OK;
}


/* ---- KilnLut8Pool: the mean of table[x] per (n, c), summed in double in the reference's
 * order (each channel's pixels in turn), so bit for bit the reference ---- */

struct lutpool_state {
    float t[256];
    struct f32_planes pl;
    int off, nhwc, avx512, vbmi;
    int64_t n, c, plane;
};

struct lutpool_job {
    const struct lutpool_state *s;
    const uint8_t *x;
    float *y;
};

#define LUTPOOL_CH 64 /* channels per unit, channels last */

static void lutpool_range(void *arg, int64_t b, int64_t e)
{
    const struct lutpool_job *j = arg;
    const struct lutpool_state *s = j->s;
    const uint8_t off = (uint8_t)s->off;
    for (int64_t u = b; u < e; u++) {
        if (!s->nhwc) { /* a plane */
            const uint8_t *x = j->x + u * s->plane;
            double acc = 0;
            for (int64_t i = 0; i < s->plane; i++) acc += s->t[(uint8_t)(x[i] ^ off)];
            j->y[u] = (float)(acc / (double)s->plane);
            continue;
        }
        int64_t chunks = (s->c + LUTPOOL_CH - 1) / LUTPOOL_CH, n = u / chunks;
        int64_t c0 = u % chunks * LUTPOOL_CH, nc = s->c - c0 < LUTPOOL_CH ? s->c - c0 : LUTPOOL_CH;
        double acc[LUTPOOL_CH] = {0};
        const uint8_t *x = j->x + n * s->plane * s->c + c0;
        int64_t k0 = 0;
        if (s->vbmi) {
            k0 = nc;
            lutpool_vbmi(&s->pl, off, x, s->c, s->plane, (int)nc, acc);
        } else if (s->avx512 && nc >= 8) {
            k0 = nc / 8 * 8;
            lutpool_avx512(s->t, off, x, s->c, s->plane, (int)k0, acc);
        }
        for (int64_t p = 0; p < s->plane && k0 < nc; p++, x += s->c)
            for (int64_t k = k0; k < nc; k++) acc[k] += s->t[(uint8_t)(x[k] ^ off)];
        for (int64_t k = 0; k < nc; k++) j->y[n * s->c + c0 + k] = (float)(acc[k] / (double)s->plane);
    }
}

static kiln_status lutpool_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct lutpool_state *s = state;
    struct lutpool_job j = {s, ctx->in[0]->data, ctx->out[0]->data};
    int64_t units = s->nhwc ? s->n * ((s->c + LUTPOOL_CH - 1) / LUTPOOL_CH) : s->n * s->c;
    int64_t per = s->nhwc ? s->plane * LUTPOOL_CH : s->plane;
    kiln_parallel_for(ctx->threads, units, per > 0 && per < 32768 ? 32768 / per : 1, lutpool_range, &j);
    return KILN_OK;
}

kiln_status kiln_k_lut8_pool_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    int nhwc;
    if (!lut_float_x(cc, &nhwc) || !cc->out[0] || cc->out[0]->dtype != KILN_DTYPE_F32) return KILN_OK;
    int lo = cc->out_layout ? cc->out_layout[0] : 0;
    if (lo && lo != KILN_LAYOUT_NHWC) return KILN_OK; /* [N, C, 1, 1]: either is the same */
    const struct kiln_type *x = cc->in[0];
    struct lutpool_state *s = malloc(sizeof *s);
    if (!s) return kiln_node_error(cc->node, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    memset(s, 0, sizeof *s);
    memcpy(s->t, cc->in_value[1]->data, sizeof s->t);
    s->off = x->dtype == KILN_DTYPE_I8 ? 0x80 : 0;
    s->nhwc = nhwc;
    s->n = x->dims[0];
    s->c = x->dims[1];
    s->plane = x->dims[2] * x->dims[3];
    __builtin_cpu_init();
    const char *isa = getenv("KILN_ISA");
    s->avx512 = !(isa && (!strcmp(isa, "scalar") || !strcmp(isa, "avx2"))) &&
                __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl");
    s->vbmi = s->avx512 && __builtin_cpu_supports("avx512vbmi");
    planes_of(s->t, &s->pl);
    inst->state = s;
    inst->destroy = free;
    inst->run = lutpool_run;
    inst->name = !nhwc ? "c_lut8_pool" : s->vbmi ? "avx512vbmi_lut8_pool" : s->avx512 ? "avx512_lut8_pool" : "c_lut8_pool";
    return KILN_OK;
}

