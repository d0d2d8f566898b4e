/*
 * layout_shuffle.h - recognizes the channel shuffle (Reshape, Transpose,
 * Reshape) as one Gather of channels, a Split as Slices, and Slices of such
 * a Gather as Gathers, before the
 * layout pass decides (layout_shuffle.c); called by kiln_opt_layout (layout.c).
 */
#ifndef KILN_OPT_LAYOUT_SHUFFLE_H
#define KILN_OPT_LAYOUT_SHUFFLE_H

#include "opt/opt.h"

kiln_status kiln_opt_layout_shuffle(struct kiln_graph *g, struct kiln_opt_pass_log *pl);
/* Split of a 4-D float32 value along C, H or W into pieces of known sizes as one
 * Slice per piece (the layout pass keeps Slices blocked). */
kiln_status kiln_opt_split_as_slices(struct kiln_graph *g, struct kiln_opt_pass_log *pl);
/* Slice of a Gather by constant 1-D indices, on the Gather's axis, as one Gather of the
 * sliced indices (the first Gather dropped when nothing else reads it). */
kiln_status kiln_opt_slice_of_gather(struct kiln_graph *g, struct kiln_opt_pass_log *pl);

#endif
