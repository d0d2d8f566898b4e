/*
 * pointwise.h - Kiln's own 1x1 convolution of 1x1 images (pointwise.c), a
 * kernel of the conv family (dnnl/conv.def) tried before oneDNN's.
 */
#ifndef KILN_KERNELS_SIMD_POINTWISE_H
#define KILN_KERNELS_SIMD_POINTWISE_H

#include "kernels/fast.h"

/* Compile cc's node (a Conv / KilnFusedConv already checked to be f32 with
 * constant weights and a rank-1 bias if any: kiln_k_conv1x1_covers) when its images and kernel are
 * 1x1 and it has one group and no residual Sum: one matrix-vector product
 * per image, as squeeze-excitation blocks have. KILN_OK with inst->run left
 * NULL when it declines. */
kiln_status kiln_simd_pointwise_compile(const struct kiln_compile_ctx *cc,
                                        struct kiln_kernel_inst *inst);

#endif
