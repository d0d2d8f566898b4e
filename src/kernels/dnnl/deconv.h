/*
 * deconv.h - what the two transposed-convolution kernels (deconv.c: oneDNN's
 * deconvolution; deconv_phase.c: one convolution per output phase) share.
 */
#ifndef KILN_KERNELS_DNNL_DECONV_H
#define KILN_KERNELS_DNNL_DECONV_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/fast.h"

/* The checks before building a ConvTranspose or KilnFusedConvTranspose (float32 X, W and
 * Y of rank 3 to 5, only X blocked, group, bias, an activation oneDNN has, the window);
 * fills the group and, per spatial dim, the output size, begin pad, stride and dilation
 * (kiln_convt_window's geometry). */
bool kd_deconv_node_ok(const struct kiln_compile_ctx *cc, int64_t *group_out, int64_t *out,
                       int64_t *pb, int64_t *stride, int64_t *dil);

#endif
