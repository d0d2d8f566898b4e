/*
 * sparse.h - sparse weights and the kernels that multiply by them
 * (docs/COMPRESSION.md, "Sparse weights").
 *
 * A product Y[M, N] = A[M, K] x W[K, N] whose constant W is mostly zero is
 * computed as its transpose, Y^T[N, M] = W^T[N, K] x A^T[K, M]: W^T is
 * stored compressed by rows (one row per output column n), each stored
 * entry a block of `block` consecutive k (1 = unstructured, 4 = 1x4 blocks
 * along the reduction, the shape VNNI's 4-byte dot products want), and
 * the dense operand A^T is read 16 lanes at a time along M. So every
 * stored weight is one broadcast and one FMA (fp32) or a quarter of one
 * VPDPBUSD (int8) over 16 rows of A, whatever the sparsity pattern; a 1x1
 * convolution over NCHW has the same shape with pixels as M and needs no
 * transpose. The fast kernel (matmul.c here) transposes A into scratch,
 * runs the SpMM over ranges of output columns on kiln_parallel_for, and
 * transposes Y^T back, fusing bias and Relu.
 *
 * int8 has the dense dynamic path's semantics (src/kernels/dnnl/matmul.c):
 * W symmetric s8 per output column, scale_w = max|w| / 127; A quantized to
 * u8 per run by kd_quantize_u8 (scale_a, zero point zp); s32 accumulation
 * of q_a * q_w minus zp * sum(q_w), then
 *     Y = (float(acc) * (scale_w[n] * alpha)) * scale_a + bias,  Relu last,
 * in that float order, so it equals an integer reference bit for bit.
 *
 * Packed matrices live in one allocation (free()) and are shared through
 * the weight cache like oneDNN's packs.
 */
#ifndef KILN_KERNELS_SPARSE_H
#define KILN_KERNELS_SPARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/fast.h"

/* A weight is a sparse candidate when at most this share of its blocks is nonzero. */
#define KILN_SPARSE_MAX_DENSITY 0.5

struct kiln_sparse_w {
    int64_t K, N;
    int block;           /* k per stored entry: 1 or 4 */
    int is_int8;         /* values are qval (s8) with scale / wsum, else val (f32) */
    int64_t nnzb;        /* stored blocks */
    int64_t *row_ptr;    /* [N + 1]: blocks of output column n are row_ptr[n] .. row_ptr[n+1] */
    int32_t *kidx;       /* [nnzb]: the block's first k (a multiple of block) */
    float *val;          /* f32: [nnzb * block], alpha folded in */
    int8_t *qval;        /* int8: [nnzb * 4] */
    float *scale;        /* int8: [N] scale_w[n] * alpha */
    int32_t *wsum;       /* int8: [N] sum of column n's q_w (for the zero point) */
    size_t bytes;        /* of the whole allocation */
};

/* Share of nonzero blocks of `block` consecutive k in W (elements
 * w[k * ldk + n * ldn], k < K, n < N); 1 for an empty matrix. */
double kiln_sparse_density(const float *w, int64_t K, int64_t N, int64_t ldk, int64_t ldn, int block);

/* Pack W (as above) for fp32 (block 1 or 4, values times alpha) or int8
 * (block 4 always; scales times alpha). *out is one malloc'ed block. */
kiln_status kiln_sparse_pack(const float *w, int64_t K, int64_t N, int64_t ldk, int64_t ldn,
                             int block, int is_int8, float alpha, struct kiln_sparse_w **out);

/* Epilogue of an SpMM: Out[n][p] (+ bias[n]) (then max(0, .) when relu). */
struct kiln_sparse_epi {
    const float *bias;   /* [N] or NULL */
    int relu;
};

/* fp32: Out[n * ldo + p] = sum over k of W^T[n][k] * In[k * ldi + p], for
 * n in [n0, n1), p in [0, P). isa: 0 scalar, 1 AVX-512 (the caller checks
 * the CPU: kiln_sparse_isa). */
void kiln_sparse_f32(int isa, const struct kiln_sparse_w *w, const float *in, int64_t ldi,
                     int64_t P, float *out, int64_t ldo, int64_t n0, int64_t n1,
                     const struct kiln_sparse_epi *e);
/* int8: In is u8 interleaved by 4 along k: In[((k / 4) * P + p) * 4 + k % 4]
 * (k padded to a multiple of 4 with zeros); zp and scale_a from
 * kd_quantize_u8. isa: 0 scalar, 2 AVX-512 VNNI. */
void kiln_sparse_i8(int isa, const struct kiln_sparse_w *w, const uint8_t *in, int64_t P,
                    int32_t zp, float scale_a, float *out, int64_t ldo, int64_t n0, int64_t n1,
                    const struct kiln_sparse_epi *e);

/* Transpose a 16x16 tile: dst[c * ldd + i] = src[i * lds + c] for c < nc, i < 16, with
 * rows i >= nr of src read as 0 (the blocked-layout copies of conv.c). isa as for f32. */
void kiln_sparse_tr16(int isa, const float *src, int64_t lds, int nr, float *dst, int64_t ldd, int nc);

/* The best ISA this CPU runs: for fp32 1 (AVX-512F) or 0; for int8 2
 * (AVX-512 VNNI) or 0. KILN_SPARSE_ISA=scalar in the environment forces 0. */
int kiln_sparse_isa(int is_int8);

/* Sparse mode from the environment: KILN_SPARSE=off (or 0) never uses
 * sparse kernels, =force uses them for every candidate without measuring
 * (tests), anything else (default) is auto: per node, measured against the
 * dense kernel on the node's real shape. */
enum kiln_sparse_mode { KILN_SPARSE_AUTO = 0, KILN_SPARSE_OFF = 1, KILN_SPARSE_FORCE = 2 };
enum kiln_sparse_mode kiln_sparse_mode(void);

/* The MatMul / Gemm / KilnFusedMatMul fast kernel with sparse selection:
 * for a candidate node (constant 2-D W of density <= KILN_SPARSE_MAX_DENSITY,
 * fp32 or int8 precision, row bias, Relu or no activation), compile both
 * the sparse kernel and `dense`, time each on the node's real shape, and
 * keep the faster (sparse only when 10% faster; the choice is kept in the
 * weight cache, so every plan of a model decides the same for a weight and
 * shape). Anything else is dense(cc, inst). */
kiln_status kiln_sparse_matmul_select(const struct kiln_compile_ctx *cc,
                                      struct kiln_kernel_inst *inst, kiln_fast_compile_fn dense);
/* Whether kiln_sparse_matmul_select would consider the sparse kernel for the node (the
 * covers of the matmul family's sparse entries, dnnl/matmul.def): the shape and type
 * checks above, and KILN_SPARSE not off. */
bool kiln_sparse_matmul_candidate(const struct kiln_compile_ctx *cc);

/* The Conv / KilnFusedConv fast kernel with sparse selection (conv.c): a
 * 1x1 convolution (2-D, stride 1, no padding, one group) with a constant
 * [Cout, Cin, 1, 1] weight of density <= KILN_SPARSE_MAX_DENSITY, an
 * optional bias, no residual Sum, no activation or Relu, fp32 or int8, in
 * plain or blocked activation layouts, is chosen between the sparse kernel
 * and `dense` as kiln_sparse_matmul_select chooses. */
kiln_status kiln_sparse_conv_select(const struct kiln_compile_ctx *cc,
                                    struct kiln_kernel_inst *inst, kiln_fast_compile_fn dense);

/* Shared by the selections (matmul.c): time sp against dn on cc's shapes and
 * layouts (random non-constant inputs; warm-ups, then the best of five
 * samples of each, interleaved, a sample repeating the run to about 200 us); *sparse_wins = sparse at least 10% faster. */
kiln_status kiln_sparse_measure(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *sp,
                                struct kiln_kernel_inst *dn, int *sparse_wins);
/* The decision slot (an int, -1 until decided) of weight w under tag in cc's
 * weight cache (which must exist). */
kiln_status kiln_sparse_choice_slot(const struct kiln_compile_ctx *cc, const kiln_tensor *w,
                                    const char *tag, int **slot);

#endif
