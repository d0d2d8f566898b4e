/*
 * skinny.h - Kiln's own product of a few rows by a large constant matrix
 * (skinny.c), tried by the matrix-product family (dnnl/matmul.c) before
 * oneDNN's product.
 */
#ifndef KILN_KERNELS_SIMD_SKINNY_H
#define KILN_KERNELS_SIMD_SKINNY_H

#include "kernels/fast.h"

/* Rows of A (the product of its leading dims) up to which the kernel is taken. */
#define KILN_SKINNY_MAX_M 16

/* Compile cc's node (MatMul, Gemm or KilnFusedMatMul) when it is an fp32
 * product of at most KILN_SKINNY_MAX_M rows by a constant 2-D B (Gemm's
 * transB read at packing), A not transposed, plain layouts, a bias of N
 * values if any, a Sum of Y's shape and any activation the SIMD table has.
 * KILN_OK with inst->run left NULL when it declines (also when
 * KILN_SKINNY=0 is in the environment). */
kiln_status kiln_simd_skinny_compile(const struct kiln_compile_ctx *cc,
                                     struct kiln_kernel_inst *inst);

/* B (w: [k][n], or [n][k] with tb) packed in panels of cols columns for the
 * table's skinny_gemm, through the weight cache (shared by every kernel that
 * asks for the same tb and cols). */
kiln_status kiln_simd_skinny_pack(struct kiln_weight_cache *cache, const kiln_tensor *w,
                                  int64_t k, int64_t n, int tb, int64_t cols, const float **packed);

#endif
