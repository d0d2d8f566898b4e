/*
 * opt.h - the graph optimizer: passes over a kiln_graph, in place.
 *
 * kiln_optimize runs the pipeline (opt.c lists the passes in order; each
 * pass is its own file). Passes work on the root graph only (subgraphs of
 * If/Loop/Scan run as imported) and follow three rules:
 *  - value ids are never renumbered (subgraphs capture outer values by id):
 *    passes add values and nodes, rewire inputs, and mark nodes dead
 *    (op = KILN_OP_COUNT is not allowed; use kiln_opt_remove_node), and the
 *    pipeline compacts the node array and re-verifies at the end;
 *  - a graph input or output value keeps its id, name and type;
 *  - results are numerically equivalent to the imported graph within 1e-4
 *    of output scale (tests/c/test_opt.c checks each pass that way).
 *
 * Fused ops (ops.def, INTERNAL; reference kernels in kernels/ref/fused.c):
 *
 *  KilnFusedConv(X, W, [B], [Sum]) -> Y
 *      Y = act(Conv(X, W, B) + Sum). Attributes: Conv's (auto_pad,
 *      dilations, group, kernel_shape, pads, strides) plus
 *      activation  STRING  "" (none), "Relu", "Clip", "LeakyRelu",
 *                          "HardSwish", "HardSigmoid", "Sigmoid", "SiLU",
 *                          "Tanh", "Gelu" (erf), "GeluTanh"
 *      act_alpha   FLOAT   Clip min / LeakyRelu alpha / HardSigmoid alpha
 *      act_beta    FLOAT   Clip max / HardSigmoid beta
 *      Sum has Y's shape (the residual input of ResNet-style blocks).
 *
 *  KilnFusedMatMul(A, B, [Bias], [Sum]) -> Y
 *      Y = act(alpha * (opA(A) @ opB(B)) + Bias + Sum) with MatMul's N-D
 *      broadcasting; opX transposes the last two dims when transX = 1.
 *      Attributes: transA INT, transB INT, alpha FLOAT (default 1),
 *      activation / act_alpha / act_beta as above. Bias broadcasts to Y
 *      (usually [N]); Sum has Y's shape. Replaces Gemm, MatMul + Add, and
 *      the bias/activation/residual that follow them.
 *
 *  KilnReorder(X) -> Y
 *      Y is X with layout attribute `to` (INT: 0 plain, 8 or 16 blocked);
 *      X's layout is X's value's. Inserted by the layout pass at the edges
 *      of blocked regions.
 */
#ifndef KILN_OPT_OPT_H
#define KILN_OPT_OPT_H

#include <stddef.h>

#include "ir/graph.h"

#define KILN_OPT_MAX_PASSES 32
#define KILN_OPT_MAX_KINDS 24

struct kiln_opt_pass_log {
    const char *pass;          /* "constant_folding", "conv_bn_fold", ... */
    int nodes_before, nodes_after;
    int n_kinds;
    struct {
        const char *kind;      /* "Conv+BatchNormalization", "MatMul+Add+Gelu", ... */
        int count;
    } kinds[KILN_OPT_MAX_KINDS];
    double ms;
};

struct kiln_opt_log {
    int n_passes;
    struct kiln_opt_pass_log passes[KILN_OPT_MAX_PASSES];
    int nodes_before, nodes_after;
    size_t arena_bytes;        /* filled by the plan compiler, for the biggest plan */
    size_t packed_weight_bytes;/* filled by the plan compiler */
};

struct kiln_opt_options {
    int layout;                /* 1 = run the layout pass (blocked convolution chains) */
};

/* Optimize g in place. On error g is left valid (the pipeline verifies it). */
kiln_status kiln_optimize(struct kiln_graph *g, const struct kiln_opt_options *o,
                          struct kiln_opt_log *log);
/* Print the log as text lines (kiln inspect --optimized, the server's load log). */
void kiln_opt_log_print(const struct kiln_opt_log *log, void (*line)(void *ctx, const char *s),
                        void *ctx);

/* ---- Helpers for passes (opt.c) ---- */
/* Count a fusion of `kind` in the pass's log entry (kind must be static). */
void kiln_opt_count(struct kiln_opt_pass_log *pl, const char *kind);
/* Remove a node: its outputs must have no remaining uses. */
void kiln_opt_remove_node(struct kiln_graph *g, int node_index);
/* Replace every use of value `from` (node inputs, graph outputs) by `to`. */
void kiln_opt_replace_uses(struct kiln_graph *g, int from, int to);
/* The only consumer node of value v, or -1 (v has 0 or >1 uses, or is a graph output). */
int kiln_opt_single_consumer(const struct kiln_graph *g, int v);

#endif
