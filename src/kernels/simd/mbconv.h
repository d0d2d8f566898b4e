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
    int act[3];                 /* per stage (expand, depthwise, project): KILN_MB_* */
    float lo[3], hi[3];         /* KILN_MB_CLAMP's bounds */
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
 * res (the residual, laid out as y) may be NULL. Call only on AVX-512 CPUs. */
void kiln_mbconv_rows(const struct kiln_mbconv *m, const float *x, const float *res, float *y,
                      int64_t r0, int64_t r1, float *scratch);

#endif
