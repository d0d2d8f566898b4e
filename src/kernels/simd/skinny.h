/*
 * skinny.h - Kiln's own product of a few rows by a large constant matrix
 * (skinny.c): the matrix-product family (dnnl/matmul.c) tries it before
 * oneDNN's product; pointwise.c (1x1 convolutions of 1x1 images) and the
 * convolutions of a few output pixels (dnnl/conv.c, after im2col) run it
 * through struct kiln_skinny.
 */
#ifndef KILN_KERNELS_SIMD_SKINNY_H
#define KILN_KERNELS_SIMD_SKINNY_H

#include "kernels/fast.h"
#include "kernels/simd/simd.h"

/* Rows of A (the product of its leading dims) up to which the kernel is taken: by the
 * convolutions of few pixels and of 1x1 images (dnnl/conv.c, pointwise.c) ... */
#define KILN_SKINNY_MAX_M 16
/* ... and by MatMul, Gemm and KilnFusedMatMul. From about 16 rows a weight is used often
 * enough that the product is no longer bound by B's bytes, and oneDNN's register-blocked
 * product wins: convnext_tiny's stage-3 MLP (16 rows by 384 x 1536 and back) ran 0.45 ms
 * here against 0.37 on oneDNN, so the model took 18.3 ms on one thread with 16 rows here,
 * 17.0 with 8 (Zen 2); on two threads 11.5 and 11.1 ms, 4 and 0 rows no better. */
#define KILN_SKINNY_MATMUL_MAX_M 8

/* Y = act(alpha * A B + bias + Sum) for m rows, with B packed once. */
struct kiln_skinny {
    const struct simd_kernels *k;
    int64_t m, kk, n;         /* rows, depth, columns */
    int64_t cols, panels, grain;
    float alpha;
    const float *bp;          /* B in panels, owned by the weight cache */
    int has_act;
    enum simd_unary act;
    float act_alpha, act_beta;
};

/* Fill s for m rows by B = w ([k][n], or [n][k] with tb), B packed through the
 * weight cache (shared by every kernel that packs the same w the same way);
 * the activation none (set has_act / act / act_alpha / act_beta after). */
kiln_status kiln_skinny_init(struct kiln_skinny *s, struct kiln_weight_cache *cache,
                             const kiln_tensor *w, int64_t m, int64_t k, int64_t n, int tb,
                             float alpha);

/* The fused activation (from kiln_simd_fused_activation) s applies after the sums. */
static inline void kiln_skinny_set_act(struct kiln_skinny *s, int has_act, enum simd_unary act,
                                       float alpha, float beta)
{
    s->has_act = has_act;
    s->act = act;
    s->act_alpha = alpha;
    s->act_beta = beta;
}

/* Y (rows ldy apart) = act(alpha * A B + bias + Sum) with A's rows lda apart, the
 * bias ([n]) and Sum (rows lds apart) optional, split across up to `threads`
 * threads by panels of columns. */
void kiln_skinny_run(const struct kiln_skinny *s, const float *a, int64_t lda, const float *bias,
                     const float *sum, int64_t lds, float *y, int64_t ldy, int threads);

/* Compile cc's node (MatMul, Gemm or KilnFusedMatMul) when it is an fp32
 * product of at most KILN_SKINNY_MATMUL_MAX_M rows by a constant 2-D B (Gemm's
 * transB read at packing), A not transposed, plain layouts, a bias of N
 * values if any, a Sum of Y's shape and any activation the SIMD table has.
 * KILN_OK with inst->run left NULL when it declines (also when
 * KILN_SKINNY=0 is in the environment). */
kiln_status kiln_simd_skinny_compile(const struct kiln_compile_ctx *cc,
                                     struct kiln_kernel_inst *inst);

/* Whether KILN_SKINNY=0 is not in the environment. */
bool kiln_skinny_enabled(void);

#endif
