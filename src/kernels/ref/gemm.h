/*
 * gemm.h - helpers shared by the reference linear-algebra, convolution and
 * pooling kernels (matmul.c, conv.c, pool.c).
 *
 * kiln_f32_gemm_ref is the one float32 matrix multiply behind MatMul, Gemm,
 * Conv and ConvTranspose: packed, cache-blocked, with a fixed-size inner
 * tile that gcc vectorizes at -O2. kiln_window_resolve turns the window
 * attributes of a Conv or pooling node (kernel_shape, strides, dilations,
 * pads, auto_pad) into per-dimension numbers and the output size.
 */
#ifndef KILN_KERNELS_REF_GEMM_H
#define KILN_KERNELS_REF_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernel.h"

/*
 * C = alpha * op(A) * op(B) + beta * C, row-major. op(A) is m x k: A is
 * stored m x k (lda >= k), or k x m when trans_a (lda >= m); likewise op(B)
 * is k x n: B is k x n (ldb >= n), or n x k when trans_b (ldb >= k). C is
 * m x n (ldc >= n). beta == 0 means C is only written, never read. The
 * packing buffers are allocated per call: KILN_ERR_OUT_OF_MEMORY if that
 * fails, else KILN_OK.
 */
kiln_status kiln_f32_gemm_ref(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                              float alpha, const float *a, int64_t lda, const float *b,
                              int64_t ldb, float beta, float *c, int64_t ldc);

/* Largest spatial size, kernel size, stride, dilation, pad or group the
 * window code accepts: products of two such values, and sums of a few
 * products, stay far from int64 overflow whatever a model declares. */
#define KILN_WINDOW_MAX ((int64_t)1 << 30)

/* A sliding window over the spatial dims of an N x C x D1 x ... tensor. */
struct kiln_window {
    int nsp;                            /* number of spatial dims */
    int64_t in[KILN_MAX_RANK];          /* input size (-1 = unknown) */
    int64_t kernel[KILN_MAX_RANK];      /* kernel size (-1 = unknown) */
    int64_t stride[KILN_MAX_RANK];
    int64_t dilation[KILN_MAX_RANK];
    int64_t pad_begin[KILN_MAX_RANK];   /* valid once in and kernel are known */
    int64_t pad_end[KILN_MAX_RANK];
    int64_t out[KILN_MAX_RANK];         /* output size (-1 = unknown) */
};

/*
 * Resolve a Conv / pooling node's window over nsp spatial dims. in and
 * kernel give the sizes (-1 = unknown; kernel NULL = take kernel_shape
 * from the attribute, required then). ceil_mode selects the pooling
 * output rule (last window must start inside the input or left padding).
 * Errors (bad attribute counts or values, empty output) name the node.
 */
kiln_status kiln_window_resolve(const struct kiln_node *node, int nsp, const int64_t *in,
                                const int64_t *kernel, bool ceil_mode, struct kiln_window *w);

/*
 * ConvTranspose's geometry over nsp spatial dims (conv.c; also used by the
 * oneDNN deconvolution kernel): for input sizes in and kernel sizes ker (-1 =
 * unknown), the output size, begin pad, stride and dilation per dim from
 * the node's attributes (pads, output_padding, output_shape, auto_pad).
 */
kiln_status kiln_convt_window(const struct kiln_node *node, int nsp, const int64_t *in,
                              const int64_t *ker, int64_t *out, int64_t *pad_begin,
                              int64_t *stride, int64_t *dil);

#endif
