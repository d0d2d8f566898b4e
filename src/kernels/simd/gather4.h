/*
 * gather4.h - copy a 4-D float32 tensor's elements picked per axis, in plain
 * or channel-blocked layouts (graph.h: nChw8c / nChw16c).
 *
 * y[n, c, h, w] = x[n, chan[c], row[h], col[w]] for c in [c_lo, c_hi) of y's
 * c_total channels: Slice (any starts and steps on C, H and W), Gather of
 * channels along axis 1 (a channel shuffle, src/opt/layout_shuffle.c) and
 * the pieces of a Concat along C whose offsets are not whole blocks are all
 * this one copy, so the layout pass (src/opt/layout.c) can keep values
 * blocked through them. Input and output layouts may differ. Where both are
 * blocked alike and an output block is a whole input block, rows are
 * copied with memcpy; otherwise lane by lane. The lanes of the last block of
 * a blocked output beyond c_total are written as zeros when c_hi is
 * c_total (kernels reading blocked data rely on zero padding).
 */
#ifndef KILN_KERNELS_SIMD_GATHER4_H
#define KILN_KERNELS_SIMD_GATHER4_H

#include <stdint.h>

#include "kernels/fast.h"

struct kiln_gather4 {
    int64_t n, c_total, h, w; /* output dims (images, all its channels, rows, columns) */
    int64_t c_lo, c_hi;       /* the channels this copy writes */
    int ly, lx;               /* output and input layouts (0, 8, 16) */
    int64_t x_image;          /* input floats per image as stored */
    int64_t *coff;            /* [c_hi - c_lo]: input offset of channel c (within an image) */
    int64_t *roff, *woff;     /* [h], [w]: input offsets of row h and column w */
    int w_contig;             /* woff[w] == woff[0] + w * max(lx, 1) */
    unsigned char *whole;     /* per output block: a whole input block, same layout */
};

/* Make the copy from an input of dims xd (N, C, H, W) in layout lx into an output of
 * c_total x h x w in layout ly, writing channels [c_lo, c_lo + nc): chan[k] is the
 * input channel of output channel c_lo + k, rows start r0 step rs, columns start c0
 * step cs. Every index must lie in xd (the caller checks). */
kiln_status kiln_gather4_init(struct kiln_gather4 *g, const int64_t *xd, int lx, int64_t c_total,
                              int64_t h, int64_t w, int ly, int64_t c_lo, int64_t nc,
                              const int64_t *chan, int64_t r0, int64_t rs, int64_t c0, int64_t cs);
void kiln_gather4_free(struct kiln_gather4 *g);
void kiln_gather4_run(const struct kiln_gather4 *g, const float *x, float *y, int threads);

#endif
