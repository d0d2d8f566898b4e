/*
 * pad.h - what the fast Pad kernel (pad.c) covers, shared with the layout
 * pass (src/opt/layout.c) so that a Pad is blocked only where that kernel
 * surely runs.
 */
#ifndef KILN_KERNELS_SIMD_PAD_H
#define KILN_KERNELS_SIMD_PAD_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernel.h"

/* A constant-mode Pad of a 4-D tensor on H and W only, by non-negative amounts:
 * pads from the attribute (before opset 11) or the constant input `pads` (1-D
 * int64, 8 entries, no axes input), the fill from the attribute `value` or the
 * constant scalar `value` (float32; NULL = 0). Sets the amounts (top, left,
 * bottom, right) and the fill. */
bool kiln_pad_hw(const struct kiln_node *n, const kiln_tensor *pads, bool has_axes,
                 const kiln_tensor *value, bool has_value, int64_t amounts[4], float *fill);

#endif
