/*
 * conv.h - what the convolution kernels of dnnl/ share: conv.c's checks, used
 * by conv_split.c (one 1x1 convolution per half of the output channels).
 */
#ifndef KILN_KERNELS_DNNL_CONV_H
#define KILN_KERNELS_DNNL_CONV_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/fast.h"
#include "kernels/kernel.h"
#include "kernels/ref/gemm.h"

/* The checks every kernel of the conv family makes first (float32 types, constant
 * weights, a rank-1 bias, a residual Sum like Y, an activation oneDNN has, groups and a
 * window that resolve); fills the group and the window. */
/* The layout of input or output i from a compile context's layout array (0 where none). */
static inline int kd_layout_of(const int *layouts, int i) { return layouts ? layouts[i] : 0; }

bool kd_conv_node_ok(const struct kiln_compile_ctx *cc, int64_t *group_out,
                     struct kiln_window *win);

#endif
