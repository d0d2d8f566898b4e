/*
 * pointwise.h - Kiln's own 1x1 convolution of 1x1 images (pointwise.c), a
 * kernel of the conv family (dnnl/conv.def) tried before oneDNN's.
 */
#ifndef KILN_KERNELS_SIMD_POINTWISE_H
#define KILN_KERNELS_SIMD_POINTWISE_H

#include <stdbool.h>

#include "kernels/fast.h"
#include "kernels/simd/simd.h"

/* The fused activation of a KilnFusedConv or KilnFusedMatMul node as a SIMD
 * table op, its alpha and beta (the ONNX ops' defaults): *has_act 0 when it
 * has none; false when the table lacks it (the node stays on another kernel). */
bool kiln_simd_fused_activation(const struct kiln_node *n, int *has_act, enum simd_unary *op,
                                float *alpha, float *beta);

/* Compile cc's node (a Conv / KilnFusedConv already checked to be f32 with
 * constant weights and a rank-1 bias if any: kiln_k_conv1x1_covers) when its images and kernel are
 * 1x1 and it has one group and no residual Sum: one matrix-vector product
 * per image, as squeeze-excitation blocks have. KILN_OK with inst->run left
 * NULL when it declines. */
kiln_status kiln_simd_pointwise_compile(const struct kiln_compile_ctx *cc,
                                        struct kiln_kernel_inst *inst);

#endif
