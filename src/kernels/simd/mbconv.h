/*
 * mbconv.h - the fused inverted-residual block kernel (AVX-512), private
 * interface between its compile function and its arithmetic.
 *
 * One KilnMBConv node (opt/mbconv.c) is a 1x1 expand convolution, a KxK
 * depthwise convolution and a 1x1 project convolution, each with its bias
 * and an activation (none, Relu, Clip or SiLU), plus an optional residual
 * added before the project's activation. The expand may be absent (we
 * NULL): then the depthwise reads X.
 *
 * The kernel walks bands of output rows. For each band it expands the input
 * rows the band reads (keeping those the previous band already expanded)
 * into a buffer with zero pad columns, runs the depthwise rows from it, and
 * projects the whole band at once. Bands are as tall as fits about half the
 * L2 cache, so on small planes (14x14, 7x7) a band is the whole image and
 * every weight panel is reused across all of its pixels. Activations are stored with
 * channels blocked by 16 ([N][C/16][H][W][16]). The kernel walks output
 * rows: it computes each expanded input row once into a ring of K rows,
 * the depthwise row from the ring, and the projected output row from
 * that, so the expanded activation (6x the block's input) never leaves
 * the core's cache.
 */
#ifndef KILN_KERNELS_SIMD_MBCONV_H
#define KILN_KERNELS_SIMD_MBCONV_H

#include <stddef.h>
#include <stdint.h>

enum {
    KILN_MB_NONE = 0,
    KILN_MB_CLAMP = 1, /* min(hi, max(lo, x)): Relu, Clip */
    KILN_MB_SILU = 2,  /* x * sigmoid(x) */
};

struct kiln_mbconv {
    int64_t n;                  /* batch */
    int cin_b, ce_b, cout_b;    /* channel blocks of 16: input, expanded, output */
    int cout;                   /* real output channels (padding lanes are written 0) */
    int64_t h, w, ho, wo;       /* input and output plane */
    int k, stride, pad;         /* depthwise kernel (square), stride, symmetric pad */
    int64_t band;               /* output rows computed together (kiln_mbconv_band) */
    const float *we;            /* [cin_b*16][ce_b*16] expand weights, k-major; NULL = none */
    const float *be;            /* [ce_b*16] */
    const float *wd;            /* [ce_b][k*k][16] depthwise weights */
    const float *bd;            /* [ce_b*16] */
    const float *wp;            /* [ce_b*16][cout_b*16] project weights, k-major */
    const float *bp;            /* [cout_b*16] */
    int act[4];                 /* per stage (expand, depthwise, project, the
                                 * squeeze-excitation's first product): KILN_MB_* */
    float lo[4], hi[4];         /* KILN_MB_CLAMP's bounds */
    /* squeeze-excitation (cse > 0): D *= sigmoid(b2 + W2 act(b1 + W1 mean(D))) */
    int cse;                    /* its hidden channels */
    const float *w1;            /* [cse][ce_b*16], then zero rows up to a multiple of 4 */
    const float *b1;            /* [cse] */
    const float *w2;            /* [cse][ce_b*16]: W2 transposed */
    const float *b2;            /* [ce_b*16] */
    int se_scale;               /* how the project applies the gate: KILN_MB_SE_* */
};

enum {
    KILN_MB_SE_SCALE_D = 0, /* D's pixels, in place (threads split the pixels) */
    KILN_MB_SE_SCALE_W = 1, /* the project's weights, into work (fewer products than D) */
    KILN_MB_SE_COPY_D = 2,  /* D, into work (threads split the output channels, so each
                             * reads every pixel and half the weights: small planes) */
};

/* Whether this CPU runs the kernel (AVX-512 F and DQ, FMA), whatever
 * KILN_ISA says: the pass fuses only where kiln_cpu_isa() is AVX-512 when the
 * model is optimized, and a later KILN_ISA must not leave a fused node
 * without its kernel. */
int kiln_mbconv_cpu_ok(void);
/* Output rows per band for the geometry in m (set everything else first). */
int64_t kiln_mbconv_band(const struct kiln_mbconv *m);
/* Floats of scratch one call of kiln_mbconv_rows needs (m->band set). */
size_t kiln_mbconv_scratch_floats(const struct kiln_mbconv *m);
/* Output rows [r0, r1) of the whole batch, row r = image r / ho, row r % ho.
 * res (the residual, laid out as y) may be NULL. Call only on AVX-512 CPUs.
 * Blocks without a squeeze-excitation (cse 0) only. */
void kiln_mbconv_rows(const struct kiln_mbconv *m, const float *x, const float *res, float *y,
                      int64_t r0, int64_t r1, float *scratch);

/* With a squeeze-excitation, a block runs in three steps per image n, the
 * first two split between threads by channel blocks and pixels:
 *   kiln_mbconv_se_dw       channel blocks [cb0, cb1) of the depthwise output
 *                           into dimg ([ce_b][ho * wo][16]), their sums over
 *                           the image into sums[cb0 * 16 .. cb1 * 16)
 *   kiln_mbconv_se_gate     the gate ([ce_b * 16]) from all the sums; hidden
 *                           holds cse floats
 *   kiln_mbconv_se_project  pixels [p0, p1) and output blocks [ob0, ob1) of
 *                           the image: D times the gate (per m->se_scale;
 *                           work holds the scaled weights, [ce_b * 16]
 *                           [cout_b * 16], or the scaled D, [ce_b][p1 - p0]
 *                           [16]), projected into y (plus res) */
void kiln_mbconv_se_dw(const struct kiln_mbconv *m, const float *x, int64_t n, int cb0, int cb1,
                       float *scratch, float *dimg, float *sums);
void kiln_mbconv_se_gate(const struct kiln_mbconv *m, const float *sums, float *gate,
                         float *hidden);
void kiln_mbconv_se_project(const struct kiln_mbconv *m, float *dimg, const float *gate,
                            int64_t n, int64_t p0, int64_t p1, int ob0, int ob1,
                            const float *res, float *y, float *work);

/* Small planes (the weights outweigh an image's activations): images
 * [n0, n0 + g) together, with or without a squeeze-excitation. One product
 * expands all their rows and one projects all their pixels, so each panel of
 * weights is read once for the g images, not once per image. scratch holds
 * kiln_mbconv_group_floats(m, g) floats. */
size_t kiln_mbconv_group_floats(const struct kiln_mbconv *m, int64_t g);
void kiln_mbconv_group(const struct kiln_mbconv *m, const float *x, const float *res, float *y,
                       int64_t n0, int64_t g, float *scratch);

#endif
