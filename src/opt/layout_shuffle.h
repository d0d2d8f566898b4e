/*
 * layout_shuffle.h - recognizes the channel shuffle (Reshape, Transpose,
 * Reshape) as one Gather of channels before the layout pass decides
 * (layout_shuffle.c); called by kiln_opt_layout (layout.c).
 */
#ifndef KILN_OPT_LAYOUT_SHUFFLE_H
#define KILN_OPT_LAYOUT_SHUFFLE_H

#include "opt/opt.h"

kiln_status kiln_opt_layout_shuffle(struct kiln_graph *g, struct kiln_opt_pass_log *pl);

#endif
