/* layout_nhwc.h - channels-last storage of int8 convolution chains (layout_nhwc.c). */
#ifndef KILN_OPT_LAYOUT_NHWC_H
#define KILN_OPT_LAYOUT_NHWC_H

#include "opt/opt.h"

/* Mark the values of int8 convolution chains KILN_LAYOUT_NHWC (on CPUs with
 * AVX-512 VNNI). When any is marked, *role is a malloc'ed array of the roles of
 * the graph's first g->n_nodes nodes (0 none, 1 source, 2 follower), for
 * kiln_opt_nhwc_wanted; else NULL. */
kiln_status kiln_opt_nhwc_mark(struct kiln_graph *g, const unsigned char *captured,
                              struct kiln_opt_pass_log *pl, unsigned char **role);
/* The layout node c (of role `role`) wants for its input i: KILN_LAYOUT_NHWC or 0. */
int kiln_opt_nhwc_wanted(const struct kiln_graph *g, int c, int role, int i);

#endif
