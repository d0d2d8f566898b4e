/*
 * flops.h - the multiply-accumulate work of one node (see flops.c).
 */
#ifndef KILN_EXEC_FLOPS_H
#define KILN_EXEC_FLOPS_H

#include "ir/graph.h"

/* Floating-point operations (2 per multiply-accumulate) of node n for these input types
 * (in[k] NULL where input k is absent) and first output type; 0 for ops whose work is not
 * counted (elementwise, pooling, data movement, quantized ops) or unknown shapes. */
double kiln_node_flops(const struct kiln_node *n, const struct kiln_type *const *in, int n_in,
                       const struct kiln_type *out0);

#endif
