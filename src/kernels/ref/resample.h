/*
 * resample.h - what the reference Resize / Upsample (resample.c) shares with
 * the fast kernel (src/kernels/simd/resize.c) and the layout pass: the
 * per-axis taps of the resize of the two spatial axes of a 4-D tensor,
 * computed by the reference's own code, so both paths map output
 * coordinates to input indices and weights identically.
 */
#ifndef KILN_KERNELS_REF_RESAMPLE_H
#define KILN_KERNELS_REF_RESAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "ir/graph.h"

/* One axis: output coordinate o reads input indices idx[o * ntap + k] (clamped into the
 * input) with weights w[o * ntap + k]. */
/* The most taps per coordinate the fast kernel takes (nearest 1, linear 2, cubic 4;
 * antialiased downscales more). */
#define KILN_RESIZE_FAST_TAPS 16

struct kiln_resize_axis {
    int64_t in, out;
    int ntap;
    int64_t *idx;
    float *w;
};

/* Whether node n's attributes (Resize, or Upsample when `upsample`) describe a
 * resize the fast kernel computes: any mode and coordinate mapping except
 * tf_crop_and_resize (its extrapolated points), an `axes` attribute naming
 * axes 2 and 3 at most. The values decide the rest (kiln_resize_hw). */
bool kiln_resize_attrs_hw(const struct kiln_node *n, bool upsample);

/* The taps of a resize of a 4-D input of dims xd that leaves N and C alone.
 * roi / scales / sizes are the node's constant inputs (NULL when absent; for
 * Upsample-7 the scales attribute is read). Returns false, with nothing
 * allocated, when N or C changes, the values are unusable (the reference then
 * reports the problem), or a tap table would exceed max_taps per coordinate;
 * else true with *h and *w filled (kiln_resize_axis_free them) and od the
 * output dims. */
bool kiln_resize_hw(const struct kiln_node *n, bool upsample, const int64_t *xd,
                    const kiln_tensor *roi, const kiln_tensor *scales, const kiln_tensor *sizes,
                    int max_taps, int64_t od[4], struct kiln_resize_axis *h,
                    struct kiln_resize_axis *w);
void kiln_resize_axis_free(struct kiln_resize_axis *a);

#endif
