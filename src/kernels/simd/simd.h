/*
 * simd.h - Kiln's own f32 kernels, private interface.
 *
 * The loops that do the arithmetic are written once, in simd_body.h, over
 * a small vector vocabulary (load, store, fma, compare, select, ...). Each
 * ISA file (isa_avx512.c, isa_avx2.c, isa_scalar.c) defines that vocabulary
 * for its vector type under its own GCC target pragma, includes the body
 * and exports one struct simd_kernels. The op files hold the compile
 * functions, one kernel per op and table (SIMD_VARIANTS below), declared
 * in their family lists (elementwise.def, norm.def, reduce.def,
 * attention.def; family.h), which choose the table for kiln_cpu_isa(). They
 * check the node's types and attributes and split the work across the
 * run's threads with kiln_parallel_for.
 *
 * Math: exp, tanh, erf/erfc, sigmoid, log1p are polynomial or rational
 * approximations accurate to a few ulp (well within 1e-5 relative of libm)
 * over the whole float range, denormal results included; NaN propagates
 * and +-inf give the limits libm gives. The scalar table uses libm.
 */
#ifndef KILN_KERNELS_SIMD_SIMD_H
#define KILN_KERNELS_SIMD_SIMD_H

#include <stdbool.h>
#include <stdint.h>

#include "core/threadpool.h"

enum simd_unary {
    SIMD_RELU,
    SIMD_LEAKY_RELU,   /* alpha */
    SIMD_CLIP,         /* lo = alpha, hi = beta */
    SIMD_SIGMOID,
    SIMD_TANH,
    SIMD_EXP,
    SIMD_ERF,
    SIMD_GELU,
    SIMD_GELU_TANH,
    SIMD_HARD_SWISH,
    SIMD_HARD_SIGMOID, /* alpha, beta */
    SIMD_SOFTPLUS,
    SIMD_SQRT,
    SIMD_NEG,
    SIMD_SILU,         /* x * sigmoid(x) */
    SIMD_SQUARE,       /* x * x: Pow(x, 2) */
    SIMD_CUBE,         /* x * x * x: Pow(x, 3) */
    SIMD_RECIP,        /* 1 / x: Pow(x, -1) */
    SIMD_RSQRT,        /* Pow(x, -0.5): 1 / sqrt(x), with pow()'s +inf at -0 and +0 at -inf */
    SIMD_POW_HALF,     /* Pow(x, 0.5): sqrt(x), with pow()'s +0 at -0 and +inf at -inf */
    SIMD_SWISH,        /* x * sigmoid(alpha x) */
};

enum simd_binary { SIMD_ADD, SIMD_SUB, SIMD_MUL, SIMD_DIV };

/* How the two inputs of a binary loop advance. */
enum simd_bmode {
    SIMD_B_VEC = 0,     /* a[i] op b[i] */
    SIMD_B_SCALAR_B,    /* a[i] op b[0] */
    SIMD_B_SCALAR_A,    /* a[0] op b[i] */
};

/* ---- Recurrent cells (rnn.c, rnn_body.h) ---- */

/* The activation functions of the ONNX recurrent ops (ONNX names in rnn.c). */
enum simd_rnn_fn {
    SIMD_RNN_RELU,
    SIMD_RNN_TANH,
    SIMD_RNN_SIGMOID,
    SIMD_RNN_AFFINE,           /* alpha x + beta */
    SIMD_RNN_LEAKY_RELU,       /* alpha */
    SIMD_RNN_THRESHOLDED_RELU, /* x > alpha ? x : 0 */
    SIMD_RNN_SCALED_TANH,      /* alpha tanh(beta x) */
    SIMD_RNN_HARD_SIGMOID,     /* clamp(alpha x + beta, 0, 1) */
    SIMD_RNN_ELU,              /* alpha */
    SIMD_RNN_SOFTSIGN,
    SIMD_RNN_SOFTPLUS,
};

struct simd_rnn_act {
    enum simd_rnn_fn fn;
    float alpha, beta;
};

enum simd_rnn_kind { SIMD_RNN_CELL_RNN, SIMD_RNN_CELL_GRU, SIMD_RNN_CELL_LSTM };

/*
 * One direction of a recurrent layer, for the cell function. The hidden
 * units are cut into blocks of `lanes` (the table's vector width); the
 * recurrence weights of a block are packed [H (k)][gates][lanes], so that one
 * step of k feeds gates x rows independent FMAs and a block's gates end in
 * registers, where the cell's arithmetic finishes them. Gate order is ONNX's
 * (GRU z, r, h; LSTM i, o, f, c).
 */
struct simd_rnn {
    enum simd_rnn_kind kind;
    int lbr;                  /* GRU linear_before_reset */
    int input_forget;         /* LSTM: f = 1 - i */
    int64_t H, rows;          /* hidden size, batch rows */
    float clip;               /* 0 = none */
    struct simd_rnn_act act[3];
    const float *rp;          /* [blocks][H][G][lanes]: G = 1 (RNN), 4 (LSTM), 3 (GRU lbr=1),
                                 2 (GRU lbr=0: z and r) */
    const float *rp_h;        /* GRU lbr=0: the h gate's [blocks][H][1][lanes] */
    const float *bias;        /* [G_all][H]: Wb + Rb, except the h gate of GRU lbr=1 (Wb) */
    const float *rb_h;        /* GRU lbr=1: the h gate's Rb [H] */
    const float *peep;        /* LSTM [3][H] (i, o, f) or NULL */
};

/* One time step: rows b < rows of the inputs and outputs, each with its stride. */
struct simd_rnn_step {
    const float *xw;          /* input projections: row b at xw + b * ldx, gate g at + g * H */
    int64_t ldx;
    const float *h, *c;       /* state before the step [rows][H] (c: LSTM) */
    float *h_new, *c_new;     /* state after it (rows past their length copy the old one) */
    float *y;                 /* Y's rows of this step (row b at y + b * ldy; zeros for rows
                                 past their length), or NULL */
    int64_t ldy;
    const unsigned char *active; /* row b is within its sequence length */
    float *z, *rh;            /* GRU lbr=0: z and r * h of the step [rows][H] */
};

/* One output row of a 2-D MaxPool / AveragePool over channels-inner pixels (pool.c,
 * pool_body.h): rows[0..nrows) are the input rows the window covers (each iw pixels of
 * `inner` floats), y gets ow pixels. Window kw taps, stride sw, dilation dw, left pad pw;
 * pr is the declared right pad and rows_counted the window's rows inside the input or its
 * declared padding (AveragePool with count_include_pad). */
enum simd_pool_kind { SIMD_POOL_MAX, SIMD_POOL_AVG };
struct simd_pool_row {
    int64_t iw, ow, kw, sw, dw, pw, pr, inner, rows_counted;
    int kind;        /* enum simd_pool_kind */
    int include_pad; /* AveragePool: the divisor counts the padding taps */
};

/* One output row of a plain stride-1 convolution (conv_direct.c, conv_direct_body.h):
 * y[mi * y_plane + ox] = bias[mi] + sum over ci, ky, kx of
 *     w[((mi * c + ci) * kh + ky) * kw + kx] * x[ci * x_plane + ky * dh * x_row + kx * dw + ox]
 * for mi < m, ox < ow; x the zero-padded input at this row's first tap, each row readable
 * below ow + 8 * lanes + (kw - 1) * dw. bias may be NULL. */
struct simd_conv_row {
    const float *x, *w, *bias;
    float *y;
    int64_t x_plane, x_row, y_plane;
    int64_t c, m, kh, kw, dh, dw, ow;
};

struct simd_kernels {
    const char *isa; /* "avx512", "avx2", "scalar" */
    int lanes;       /* floats per vector */
    /* y[i] = op(x[i]) for i < n; y may be x. */
    void (*unary)(enum simd_unary op, float alpha, float beta, const float *x, float *y,
                  int64_t n);
    /* y[i] = a op b per mode; y may be a or b where they are full. */
    void (*binary)(enum simd_binary op, enum simd_bmode mode, const float *a, const float *b,
                   float *y, int64_t n);
    /* Softmax of rows contiguous rows of n (n >= 1); y may be x. */
    void (*softmax_rows)(const float *x, float *y, int64_t rows, int64_t n);
    /* Softmax along the middle dim of one [n][inner] block (inner > 1). */
    void (*softmax_strided)(const float *x, float *y, int64_t n, int64_t inner);
    /* The same for LogSoftmax. */
    void (*log_softmax_rows)(const float *x, float *y, int64_t rows, int64_t n);
    void (*log_softmax_strided)(const float *x, float *y, int64_t n, int64_t inner);
    /* Layer normalization of rows of n; bias, mean and inv may be NULL. */
    void (*layernorm_rows)(const float *x, float *y, int64_t rows, int64_t n, float eps,
                           const float *scale, const float *bias, float *mean, float *inv);
    /* y[r] = sum(x[r*n .. r*n+n)) / div, accumulated in double. */
    void (*sum_rows)(const float *x, float *y, int64_t rows, int64_t n, double div);
    /* y[r] = max (is_min: min) of each row of n >= 1, NaN if the row holds one. */
    void (*extreme_rows)(const float *x, float *y, int64_t rows, int64_t n, int is_min);
    /* y[i] = max (is_min: min) of y[i] and x[i], NaN if either is. */
    void (*extreme_acc)(float *y, const float *x, int64_t n, int is_min);
    /* C[m][n] = alpha * A[m][k] B[k][n] for small products held in cache (attention's
     * per-head products); row-major, lda / ldb / ldc are row strides. */
    void (*gemm)(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                 const float *b, int64_t ldb, float *c, int64_t ldc);
    /* dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols (no overlap). */
    void (*transpose)(int64_t rows, int64_t cols, const float *src, int64_t lds, float *dst,
                      int64_t ldd);
    /* Independent FMAs from registers for iters steps of fma_loop_flops floating-point
     * operations (the result only keeps the loop alive). */
    float (*fma_loop)(int64_t iters);
    /* One step of a recurrent cell over hidden blocks [b0, b1). phase 0: the whole cell;
     * GRU with linear_before_reset 0 runs phase 1 (z, r and r * h) over every block, then
     * phase 2 (the h gate, whose product reads r * h of all units). */
    void (*rnn_cell)(const struct simd_rnn *r, const struct simd_rnn_step *s, int phase,
                     int64_t b0, int64_t b1);
    /* C[i][j] = alpha * sum over p of A[i][p] B[p][j] for rows i < m and the columns of
     * panels [p0, p1) (j < n), B packed in panels of skinny_cols columns,
     * [panel][k][skinny_cols], zeros past n (skinny.c, skinny_body.h). */
    void (*skinny_gemm)(int64_t m, int64_t k, int64_t n, float alpha, const float *a,
                        int64_t lda, const float *bp, int64_t p0, int64_t p1, float *c,
                        int64_t ldc);
    int skinny_cols;
    /* *mean (rounded to float) and *inv = 1 / sqrt(variance + eps) of x[0..n) (population
     * variance, the sums in double across blocks of floats, as layernorm_rows); *delta (if
     * not NULL) = the exact mean - *mean, for a caller to fold into its shift. */
    void (*row_stats)(const float *x, int64_t n, float eps, float *mean, float *inv,
                      float *delta);
    /* y[i] = (x[i] - mean) * a + b for i < n; y may be x. */
    void (*norm_affine)(const float *x, float *y, int64_t n, float mean, float a, float b);
    /* Channel-blocked data, W lanes (the vector width) of npix pixels, pixel p's lanes at
     * x + p * stride: sum[l] += sum over p of (x - c[l]), or of its square when sq (float over
     * runs of pixels, double across them); and y = (x - m[l]) * a[l] + b[l] (y may be x). */
    void (*lane_sums)(const float *x, int64_t npix, int64_t stride, const float *c, int sq,
                      double *sum);
    void (*lane_affine)(const float *x, float *y, int64_t npix, int64_t stride, const float *m,
                        const float *a, const float *b);
    /* One output row of a plain direct convolution (struct simd_conv_row above). */
    void (*conv_direct_row)(const struct simd_conv_row *r);
    /* 2-D pooling of channels-inner pixels (struct simd_pool_row above). */
    void (*pool_row)(const float *const *rows, int nrows, float *y,
                     const struct simd_pool_row *p);
    /* y[c] for c < n_out <= inner: max (kind SIMD_POOL_MAX) or sum * scale of
     * x[p * inner + c] over pixels p < pixels. */
    void (*pool_global)(const float *x, int64_t pixels, int64_t inner, float *y, int64_t n_out,
                        int kind, float scale);
    int fma_loop_flops;
};

extern const struct simd_kernels kiln_simd_avx512, kiln_simd_avx2, kiln_simd_scalar;

/* The table for the current kiln_cpu_isa(). */
const struct simd_kernels *simd_kernels_for(void);

/* The three kernels of one op of a family list (family.h, KILN_KERNEL_SIMD):
 * kiln_k_<stem>_avx512 / _avx2 / _scalar, each fn(cc, inst, table) on its
 * table. Expand where kernels/fast.h is included. */
/* Strides of x's elements along o's dims (numpy broadcasting: x's dims right-aligned; 0
 * where x has 1 or lacks the dim); false if x does not broadcast to o (broadcast.c). */
struct kiln_type;
bool kiln_simd_bcast_strides(const struct kiln_type *x, const struct kiln_type *o, int64_t *st);

#define SIMD_VARIANTS(stem, fn)                                                             \
    kiln_status kiln_k_##stem##_avx512(const struct kiln_compile_ctx *cc,                  \
                                       struct kiln_kernel_inst *inst)                      \
    {                                                                                       \
        return fn(cc, inst, &kiln_simd_avx512);                                             \
    }                                                                                       \
    kiln_status kiln_k_##stem##_avx2(const struct kiln_compile_ctx *cc,                    \
                                     struct kiln_kernel_inst *inst)                        \
    {                                                                                       \
        return fn(cc, inst, &kiln_simd_avx2);                                               \
    }                                                                                       \
    kiln_status kiln_k_##stem##_scalar(const struct kiln_compile_ctx *cc,                  \
                                       struct kiln_kernel_inst *inst)                      \
    {                                                                                       \
        return fn(cc, inst, &kiln_simd_scalar);                                             \
    }

/* The fp32 FMA throughput of this ISA on `threads` threads of the pool, in GFLOP/s:
 * the best of a few runs of fma_loop on every thread at once (about 0.1 s in all). */
double simd_fma_peak_gflops(int threads);

/* Elements per parallel chunk: below twice this a loop runs on one thread. Each chunk is
 * tens of microseconds of work, so that waking a worker (and, on a host shared with other
 * work, waiting for a preempted one at the join) never costs more than it saves. */
#define SIMD_GRAIN_CHEAP 262144 /* loads and adds: memory bound */
#define SIMD_GRAIN_MATH 32768   /* transcendental functions */
#define SIMD_GRAIN_NORM 131072  /* layer normalization: a few passes over each row */

/* A Concat along C folded into the depthwise 1x1 convolution that is its only reader
 * (concat_affine.c, src/exec/plan.c): n_pieces inputs of chans[k] channels, laid out
 * plain (layout 0) or channel-blocked (8, 16: every piece but the last whole blocks),
 * H * W = HW, y[:, a_k + c] = clamp(x_k[:, c] * scale[a_k + c] + shift[a_k + c], lo, hi)
 * (scale and shift: one per output channel). Fills inst; needs kernels/fast.h. */
struct kiln_kernel_inst;
kiln_status kiln_concat_affine_compile(int n_pieces, const int64_t *chans, int layout, int64_t HW,
                                       const float *scale, const float *shift, float lo,
                                       float hi, struct kiln_kernel_inst *inst);

#endif
