/*
 * quant8.c - fast QuantizeLinear (float32 -> uint8 / int8) and
 * DequantizeLinear (uint8 / int8 -> float32) with one constant scale and
 * zero point: the pairs a static int8 graph keeps around the ops that have
 * no int8 kernel (residual Adds, Clip, pooling; docs/COMPRESSION.md), which
 * ran on the element-by-element reference kernels (ref/quant.c) before.
 *
 * Same arithmetic as the reference, bit for bit:
 *   Q:  r = x / scale (float32 division), y = saturate(rint(r) + zp),
 *       round half to even, NaN -> 0;
 *   DQ: y = (float(x) - float(zp)) * scale in float32.
 * AVX-512 (F, BW, VL) 16 lanes at a time where the CPU has it, plain C
 * otherwise; rows split across the run's threads. Per-axis and blocked
 * scales, other types, and the precision / saturate / output_dtype
 * attributes stay on the reference kernel. Declared in the 8-bit family
 * (quant8.def, family.h): generated cases against the reference kernel, and
 * tests/python/test_qdq.py (test_fast_quantize_dequantize).
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

struct q8_state {
    float scale, zp, lo, hi;
    int is_signed, avx512;
};

struct q8_job {
    const struct q8_state *s;
    const void *x;
    void *y;
};

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
#endif

static void quant_avx512(const struct q8_state *s, const float *x, void *y, int64_t b, int64_t e)
{
    __m512 vs = _mm512_set1_ps(s->scale), vz = _mm512_set1_ps(s->zp);
    __m512 vlo = _mm512_set1_ps(s->lo), vhi = _mm512_set1_ps(s->hi), zero = _mm512_setzero_ps();
    int8_t *out = y;
    for (int64_t i = b; i < e; i += 16) {
        __mmask16 m = e - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (e - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 r = _mm512_div_ps(v, vs);
        r = _mm512_add_ps(_mm512_roundscale_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
        __mmask16 nan = _mm512_cmp_ps_mask(r, r, _CMP_UNORD_Q);
        r = _mm512_min_ps(_mm512_max_ps(r, vlo), vhi);
        r = _mm512_mask_mov_ps(r, nan, zero);
        __m512i q = _mm512_cvtps_epi32(r); /* already integral and in range */
        __m128i packed = s->is_signed ? _mm512_cvtsepi32_epi8(q) : _mm512_cvtusepi32_epi8(q);
        _mm_mask_storeu_epi8(out + i, m, packed);
    }
}

static void dequant_avx512(const struct q8_state *s, const void *x, float *y, int64_t b, int64_t e)
{
    __m512 vs = _mm512_set1_ps(s->scale), vz = _mm512_set1_ps(s->zp);
    const int8_t *in = x;
    for (int64_t i = b; i < e; i += 16) {
        __mmask16 m = e - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (e - i)) - 1);
        __m128i q = _mm_maskz_loadu_epi8(m, in + i);
        __m512i w = s->is_signed ? _mm512_cvtepi8_epi32(q) : _mm512_cvtepu8_epi32(q);
        __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(w), vz), vs);
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

/* KilnQLinearAdd: y = Q(act(DQ_a(a) + DQ_b(b))), the float32 operations of the nodes it
 * replaced in their order. */
struct qadd_state {
    struct q8_state a, b, y;
    int relu, avx512;
};

static void qadd_avx512(const struct qadd_state *s, const void *a, const void *b, void *y,
                        int64_t lo_i, int64_t e)
{
    __m512 sa = _mm512_set1_ps(s->a.scale), za = _mm512_set1_ps(s->a.zp);
    __m512 sb = _mm512_set1_ps(s->b.scale), zb = _mm512_set1_ps(s->b.zp);
    __m512 sy = _mm512_set1_ps(s->y.scale), zy = _mm512_set1_ps(s->y.zp);
    __m512 vlo = _mm512_set1_ps(s->y.lo), vhi = _mm512_set1_ps(s->y.hi), zero = _mm512_setzero_ps();
    const int8_t *pa = a, *pb = b;
    int8_t *out = y;
    for (int64_t i = lo_i; i < e; i += 16) {
        __mmask16 m = e - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (e - i)) - 1);
        __m128i qa = _mm_maskz_loadu_epi8(m, pa + i), qb = _mm_maskz_loadu_epi8(m, pb + i);
        __m512i wa = s->a.is_signed ? _mm512_cvtepi8_epi32(qa) : _mm512_cvtepu8_epi32(qa);
        __m512i wb = s->b.is_signed ? _mm512_cvtepi8_epi32(qb) : _mm512_cvtepu8_epi32(qb);
        __m512 fa = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(wa), za), sa);
        __m512 fb = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(wb), zb), sb);
        __m512 v = _mm512_add_ps(fa, fb);
        if (s->relu) v = _mm512_max_ps(v, zero);
        __m512 r = _mm512_div_ps(v, sy);
        r = _mm512_add_ps(_mm512_roundscale_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zy);
        __mmask16 nan = _mm512_cmp_ps_mask(r, r, _CMP_UNORD_Q);
        r = _mm512_min_ps(_mm512_max_ps(r, vlo), vhi);
        r = _mm512_mask_mov_ps(r, nan, zero);
        __m512i q = _mm512_cvtps_epi32(r);
        __m128i packed = s->y.is_signed ? _mm512_cvtsepi32_epi8(q) : _mm512_cvtusepi32_epi8(q);
        _mm_mask_storeu_epi8(out + i, m, packed);
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

static void quant_range(void *arg, int64_t b, int64_t e)
{
    const struct q8_job *j = arg;
    const struct q8_state *s = j->s;
    const float *x = j->x;
    if (s->avx512) {
        quant_avx512(s, x, j->y, b, e);
        return;
    }
    for (int64_t i = b; i < e; i++) {
        float r = rintf(x[i] / s->scale) + s->zp;
        r = isnan(r) ? 0.0f : r < s->lo ? s->lo : r > s->hi ? s->hi : r;
        if (s->is_signed) ((int8_t *)j->y)[i] = (int8_t)r;
        else ((uint8_t *)j->y)[i] = (uint8_t)r;
    }
}

static void dequant_range(void *arg, int64_t b, int64_t e)
{
    const struct q8_job *j = arg;
    const struct q8_state *s = j->s;
    float *y = j->y;
    if (s->avx512) {
        dequant_avx512(s, j->x, y, b, e);
        return;
    }
    for (int64_t i = b; i < e; i++) {
        float v = s->is_signed ? (float)((const int8_t *)j->x)[i] : (float)((const uint8_t *)j->x)[i];
        y[i] = (v - s->zp) * s->scale;
    }
}

static kiln_status q8_run(void *state, struct kiln_run_ctx *ctx, kiln_range_fn fn)
{
    struct q8_job j = {state, ctx->in[0]->data, ctx->out[0]->data};
    int64_t n = kiln_tensor_count(ctx->in[0]);
    kiln_parallel_for(ctx->threads, n, 32768, fn, &j);
    return KILN_OK;
}

static kiln_status quant_run(void *state, struct kiln_run_ctx *ctx)
{
    return q8_run(state, ctx, quant_range);
}

static kiln_status dequant_run(void *state, struct kiln_run_ctx *ctx)
{
    return q8_run(state, ctx, dequant_range);
}

/* The node's constant scalar float32 scale and 8-bit zero point (absent: 0 of dtype q);
 * false when they are not that. */
static bool scalar_params(const struct kiln_compile_ctx *cc, kiln_dtype q, struct q8_state *s)
{
    if (cc->n_in < 2 || !cc->in[1] || !cc->in_value || !cc->in_value[1]) return false;
    const kiln_tensor *sc = cc->in_value[1];
    if (sc->dtype != KILN_DTYPE_F32 || kiln_tensor_count(sc) != 1 || sc->rank > 1) return false;
    s->scale = ((const float *)sc->data)[0];
    s->zp = 0.0f;
    if (cc->n_in > 2 && cc->in[2]) {
        const kiln_tensor *z = cc->in_value[2];
        if (!z || z->dtype != q || kiln_tensor_count(z) != 1 || z->rank > 1) return false;
        s->zp = q == KILN_DTYPE_I8 ? (float)((const int8_t *)z->data)[0]
                                   : (float)((const uint8_t *)z->data)[0];
    }
    s->is_signed = q == KILN_DTYPE_I8;
    s->lo = s->is_signed ? -128.0f : 0.0f;
    s->hi = s->is_signed ? 127.0f : 255.0f;
    __builtin_cpu_init();
    const char *isa = getenv("KILN_ISA");
    s->avx512 = !(isa && (!strcmp(isa, "scalar") || !strcmp(isa, "avx2"))) &&
                __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl");
    return true;
}

/* Plain, or channels last on both sides (one scale and zero point: elementwise in any
 * storage order without padding; src/opt/layout_nhwc.c). */
static bool plain_layouts(const struct kiln_compile_ctx *cc)
{
    int li = cc->in_layout ? cc->in_layout[0] : 0, lo = cc->out_layout ? cc->out_layout[0] : 0;
    return li == lo && (li == 0 || li == KILN_LAYOUT_NHWC);
}

static kiln_status q8_finish(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst,
                             const struct q8_state *s, int quant)
{
    struct q8_state *st = malloc(sizeof *st);
    if (!st) return kiln_node_error(cc->node, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    *st = *s;
    inst->state = st;
    inst->destroy = free;
    inst->run = quant ? quant_run : dequant_run;
    inst->name = quant ? (s->avx512 ? "avx512_quantize_8" : "c_quantize_8")
                       : (s->avx512 ? "avx512_dequantize_8" : "c_dequantize_8");
    return KILN_OK;
}

kiln_status kiln_k_quantize8_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    const struct kiln_type *x = cc->in[0], *y = cc->n_out > 0 ? cc->out[0] : NULL;
    if (!x || !y || x->dtype != KILN_DTYPE_F32 ||
        (y->dtype != KILN_DTYPE_U8 && y->dtype != KILN_DTYPE_I8) || !plain_layouts(cc))
        return KILN_OK;
    int64_t prec = kiln_attr_int(n, "precision", 0), sat = kiln_attr_int(n, "saturate", 1);
    int64_t block = kiln_attr_int(n, "block_size", 0);
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return KILN_OK;
    }
    if ((prec != 0 && prec != 1) || sat != 1 || block != 0) return KILN_OK;
    struct q8_state s;
    if (!scalar_params(cc, y->dtype, &s)) return KILN_OK;
    return q8_finish(cc, inst, &s, 1);
}

kiln_status kiln_k_dequantize8_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    const struct kiln_type *x = cc->in[0], *y = cc->n_out > 0 ? cc->out[0] : NULL;
    if (!x || !y || y->dtype != KILN_DTYPE_F32 ||
        (x->dtype != KILN_DTYPE_U8 && x->dtype != KILN_DTYPE_I8) || !plain_layouts(cc))
        return KILN_OK;
    int64_t block = kiln_attr_int(n, "block_size", 0);
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return KILN_OK;
    }
    if (block != 0) return KILN_OK;
    struct q8_state s;
    if (!scalar_params(cc, x->dtype, &s)) return KILN_OK;
    return q8_finish(cc, inst, &s, 0);
}

struct qadd_job {
    const struct qadd_state *s;
    const void *a, *b;
    void *y;
};

static float q8_get(const struct q8_state *s, const void *p, int64_t i)
{
    return s->is_signed ? (float)((const int8_t *)p)[i] : (float)((const uint8_t *)p)[i];
}

static void qadd_range(void *arg, int64_t b, int64_t e)
{
    const struct qadd_job *j = arg;
    const struct qadd_state *s = j->s;
    if (s->avx512) {
        qadd_avx512(s, j->a, j->b, j->y, b, e);
        return;
    }
    for (int64_t i = b; i < e; i++) {
        float v = (q8_get(&s->a, j->a, i) - s->a.zp) * s->a.scale +
                  (q8_get(&s->b, j->b, i) - s->b.zp) * s->b.scale;
        if (s->relu && v < 0.0f) v = 0.0f;
        float r = rintf(v / s->y.scale) + s->y.zp;
        r = isnan(r) ? 0.0f : r < s->y.lo ? s->y.lo : r > s->y.hi ? s->y.hi : r;
        if (s->y.is_signed) ((int8_t *)j->y)[i] = (int8_t)r;
        else ((uint8_t *)j->y)[i] = (uint8_t)r;
    }
}

static kiln_status qadd_run(void *state, struct kiln_run_ctx *ctx)
{
    struct qadd_job j = {state, ctx->in[0]->data, ctx->in[3]->data, ctx->out[0]->data};
    kiln_parallel_for(ctx->threads, kiln_tensor_count(ctx->out[0]), 32768, qadd_range, &j);
    return KILN_OK;
}

/* scalar_params for the scale at input i and the zero point at i + 1 */
static bool params_at(const struct kiln_compile_ctx *cc, int i, kiln_dtype q, struct q8_state *s)
{
    const struct kiln_type *in[3] = {NULL, cc->in[i], cc->n_in > i + 1 ? cc->in[i + 1] : NULL};
    const kiln_tensor *val[3] = {NULL, cc->in_value[i], cc->n_in > i + 1 ? cc->in_value[i + 1] : NULL};
    struct kiln_compile_ctx c2 = *cc;
    c2.n_in = 3;
    c2.in = in;
    c2.in_value = val;
    return scalar_params(&c2, q, s);
}

kiln_status kiln_k_qlinear_add8_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    if (cc->n_in < 8 || cc->n_out < 1 || !cc->in_value) return KILN_OK;
    const struct kiln_type *a = cc->in[0], *b = cc->in[3], *y = cc->out[0];
    if (!a || !b || !y || !cc->in[1] || !cc->in[4] || !cc->in[6]) return KILN_OK;
    for (const struct kiln_type *const *t = (const struct kiln_type *const[]){a, b, y, NULL}; *t; t++)
        if ((*t)->dtype != KILN_DTYPE_U8 && (*t)->dtype != KILN_DTYPE_I8) return KILN_OK;
    int64_t n = kiln_shape_count(y->rank, y->dims);
    if (n < 0 || kiln_shape_count(a->rank, a->dims) != n || kiln_shape_count(b->rank, b->dims) != n)
        return KILN_OK;
    int la = cc->in_layout ? cc->in_layout[0] : 0, lb = cc->in_layout ? cc->in_layout[3] : 0;
    int ly = cc->out_layout ? cc->out_layout[0] : 0;
    if (la != ly || lb != ly || (ly != 0 && ly != KILN_LAYOUT_NHWC)) return KILN_OK;
    const char *act = kiln_attr_str(cc->node, "activation", "");
    if (act[0] && strcmp(act, "Relu")) return KILN_OK;
    struct qadd_state s;
    memset(&s, 0, sizeof s);
    if (!params_at(cc, 1, a->dtype, &s.a) || !params_at(cc, 4, b->dtype, &s.b) ||
        !params_at(cc, 6, y->dtype, &s.y))
        return KILN_OK;
    s.relu = act[0] != 0;
    s.avx512 = s.y.avx512;
    struct qadd_state *st = malloc(sizeof *st);
    if (!st) return kiln_node_error(cc->node, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    *st = s;
    inst->state = st;
    inst->destroy = free;
    inst->run = qadd_run;
    inst->name = s.avx512 ? "avx512_qlinear_add" : "c_qlinear_add";
    return KILN_OK;
}

