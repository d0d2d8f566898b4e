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
 *    of output scale (tests/c/unit_opt.c checks each pass that way).
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
 *  KilnFusedConvTranspose(X, W, [B]) -> Y
 *      Y = act(ConvTranspose(X, W, B)). Attributes: ConvTranspose's plus
 *      activation / act_alpha / act_beta as above. Replaces ConvTranspose,
 *      a per-channel bias Add when it has no B, and the activation.
 *
 *  KilnFusedMatMul(A, B, [Bias], [Sum]) -> Y
 *      Y = act(alpha * (opA(A) @ opB(B)) + Bias + Sum) with MatMul's N-D
 *      broadcasting; opX transposes the last two dims when transX = 1.
 *      Attributes: transA INT, transB INT, alpha FLOAT (default 1),
 *      activation / act_alpha / act_beta as above. Bias broadcasts to Y
 *      (usually [N]); Sum has Y's shape. Replaces Gemm, MatMul + Add, and
 *      the bias/activation/residual that follow them.
 *
 *  KilnMatMulT(A, B) -> Y
 *      Y = alpha * (Transpose(A, permA) @ Transpose(B, permB)), the two
 *      operands of equal rank (>= 2) and batch dims equal or 1. Attributes:
 *      permA, permB INTS (absent: no transpose), alpha FLOAT (default 1).
 *      Made by the transpose_matmul pass from the Transposes an unfused
 *      attention feeds its products (src/opt/transpose_matmul.c): the
 *      product reads the untransposed values through strides.
 *
 *  KilnReorder(X) -> Y
 *      Y is X with layout attribute `to` (INT: 0 plain, 8 or 16 blocked);
 *      X's layout is X's value's. Inserted by the layout pass at the edges
 *      of blocked regions.
 *
 *  KilnMBConv(X, [We], [Be], Wd, [Bd], Wp, [Bp], [Sum], [W1], [B1], [W2], [B2]) -> Y
 *      An inverted-residual block (MobileNetV2 / EfficientNet style), made
 *      by the mbconv_fusion pass from three channel-blocked convolutions:
 *        E = act_e(Conv1x1(X, We, Be))             We [Ce, Cin, 1, 1]
 *        D = act_d(DepthwiseConv(E, Wd, Bd))       Wd [Ce, 1, k, k], group Ce,
 *                                                  stride s, pads k / 2
 *        Y = act(Conv1x1(D, Wp, Bp) + Sum)         Wp [Cout, Ce, 1, 1]
 *      Without We (and Be), E is X (MobileNetV2's first block). With W1
 *      (and W2) a squeeze-excitation scales D before the project:
 *        D = D * sigmoid(Conv1x1(act_se(Conv1x1(mean_hw(D), W1, B1)), W2, B2))
 *                                                  W1 [Cse, Ce, 1, 1], W2 [Ce, Cse, 1, 1]
 *      Attributes: dw_kernel INT (k), dw_stride INT (s); expand_activation /
 *      expand_act_alpha / expand_act_beta, dw_activation / dw_act_alpha /
 *      dw_act_beta, activation / act_alpha / act_beta, se_activation /
 *      se_act_alpha / se_act_beta ("", "Relu", "Clip" or "SiLU", as for
 *      KilnFusedConv). E is never stored whole; D only with the
 *      squeeze-excitation (one image at a time).
 *
 *  KilnGroupNorm(X, Scale, Bias) -> Y
 *      Y = act(GroupNormalization(X, Scale, Bias)) with Scale and Bias per
 *      channel (the node is opset 21). Attributes: num_groups INT, epsilon
 *      FLOAT, activation STRING as above. Made by groupnorm_fusion
 *      (groupnorm.c) where a SiLU or Relu alone reads a GroupNorm.
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
    int plans;                 /* plans compiled so far (filled with the two above) */
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
/* Clip node n's bounds when constant (inputs from opset 11, attributes before; an absent
 * bound is -FLT_MAX / FLT_MAX); false otherwise (fuse_act.c). */
bool kiln_opt_clip_bounds(const struct kiln_graph *g, const struct kiln_node *n, float *lo,
                          float *hi);

/* ---- More helpers (opt.c) ---- */
/* True for a node removed by kiln_opt_remove_node (skipped until compaction). */
bool kiln_opt_node_dead(const struct kiln_node *n);
/* Is value v one of g's outputs? */
bool kiln_opt_is_graph_output(const struct kiln_graph *g, int v);
/* Set input k of node ni to value v (-1 = absent), keeping use counts. */
void kiln_opt_set_input(struct kiln_graph *g, int ni, int k, int v);
/* Add a node of op with n_in inputs (all -1), n_out outputs and room for
 * n_attr attributes; *ni is its index (node pointers move when nodes are
 * added). The op_type is the op's name, opset `opset`. */
kiln_status kiln_opt_add_node(struct kiln_graph *g, enum kiln_op op, const char *name, int n_in,
                              int n_out, int n_attr, int opset, int *ni);
/* Make value v an output of node ni (slot k): v's producer becomes ni. */
void kiln_opt_set_output(struct kiln_graph *g, int ni, int k, int v);
/* Add a node-output value with the given type (NULL: unknown); name from base. */
kiln_status kiln_opt_add_value(struct kiln_graph *g, const char *base, const struct kiln_type *t,
                               int *id);
/* Add a constant value holding t (ownership passes to the graph, also on error). */
kiln_status kiln_opt_add_const(struct kiln_graph *g, const char *base, kiln_tensor *t, int *id);
/* The constant tensor of v, or NULL when v is not a constant. */
const kiln_tensor *kiln_opt_const(const struct kiln_graph *g, int v);
/* A float32 constant with one element: its value in *out. */
bool kiln_opt_const_scalar(const struct kiln_graph *g, int v, float *out);
/* Producer node index of value v, or -1 (not a node output or dead). */
int kiln_opt_producer(const struct kiln_graph *g, int v);
/* Attribute setters on attribute slot k of node ni (name must be static or arena). */
void kiln_opt_attr_int(struct kiln_graph *g, int ni, int k, const char *name, int64_t v);
void kiln_opt_attr_float(struct kiln_graph *g, int ni, int k, const char *name, float v);
kiln_status kiln_opt_attr_str(struct kiln_graph *g, int ni, int k, const char *name, const char *v);
/* Replace node ni's INTS attribute `name` (static or arena) with n values v, adding it when
 * the node has none; the attribute list and the values are copied into the graph's arena. */
kiln_status kiln_opt_set_ints(struct kiln_graph *g, int ni, const char *name, const int64_t *v,
                              int n);
/* Two static types provably equal at run time (same rank; each dim the same
 * known size or the same symbolic name)? */
bool kiln_opt_same_shape(const struct kiln_type *a, const struct kiln_type *b);
/* Remove node ni whose output out_v equals its input in_v: every use of
 * out_v reads in_v instead (or, when out_v is a graph output, in_v's
 * producer writes out_v). False (nothing changed) when that is impossible. */
bool kiln_opt_bypass(struct kiln_graph *g, int ni, int in_v, int out_v);
/* Fold node ni, whose inputs are all constants, into constants now (fold.c); *folded is
 * false (and nothing changed) when its kernel fails or its outputs are too big. */
kiln_status kiln_opt_fold_node(struct kiln_graph *g, int ni, bool *folded);
/* Compact the node array (drop removed nodes, fix producers), then verify. */
kiln_status kiln_opt_compact(struct kiln_graph *g);

/* An activation that can close a fused op (fuse_act.c). */
struct kiln_opt_act {
    const char *name;      /* the fused ops' activation attribute: "Relu", "SiLU", ... */
    float alpha, beta;     /* act_alpha / act_beta */
    int out;               /* the activation's output value */
    int n_nodes;           /* nodes it spans (SiLU: Sigmoid and Mul) */
    int nodes[2];
};
/* The residual input of Add node ai (-1 = none) that adds a float32 value of
 * shape ty to value cur without changing the shape (fuse_act.c). */
int kiln_opt_match_residual(const struct kiln_graph *g, int ai, int cur,
                            const struct kiln_type *ty);
/* Match an activation reading float32 value y and nothing else reading y
 * (SiLU: exactly Sigmoid(y) and Mul(y, Sigmoid(y))). Its output has y's shape
 * by the ops' semantics, whatever names the model gives unknown dims. */
bool kiln_opt_match_act(const struct kiln_graph *g, int y, struct kiln_opt_act *a);
/* A static name for a fusion "<base>[+Bias][+Add][+<act>]" (log kinds). */
const char *kiln_opt_fusion_kind(const char *base, bool bias, bool sum, const char *act);

/* ---- Passes (one file each, in pipeline order; see opt.c) ---- */
kiln_status kiln_opt_qdq(struct kiln_graph *g, struct kiln_opt_pass_log *pl);        /* qdq.c */
kiln_status kiln_opt_identity(struct kiln_graph *g, struct kiln_opt_pass_log *pl);   /* identity.c */
kiln_status kiln_opt_fold(struct kiln_graph *g, struct kiln_opt_pass_log *pl);       /* fold.c */
kiln_status kiln_opt_dce(struct kiln_graph *g, struct kiln_opt_pass_log *pl);        /* dce.c */
kiln_status kiln_opt_cse(struct kiln_graph *g, struct kiln_opt_pass_log *pl);        /* cse.c */
kiln_status kiln_opt_gelu(struct kiln_graph *g, struct kiln_opt_pass_log *pl);       /* gelu.c */
kiln_status kiln_opt_layernorm(struct kiln_graph *g, struct kiln_opt_pass_log *pl);  /* layernorm.c */
kiln_status kiln_opt_groupnorm(struct kiln_graph *g, struct kiln_opt_pass_log *pl);  /* groupnorm.c */
kiln_status kiln_opt_attention(struct kiln_graph *g, struct kiln_opt_pass_log *pl);  /* attention.c */
/* attention_views.c: attention behind any view ops -> KilnAttention (run by attention.c) */
kiln_status kiln_opt_attention_views(struct kiln_graph *g, struct kiln_opt_pass_log *pl);
kiln_status kiln_opt_transpose(struct kiln_graph *g, struct kiln_opt_pass_log *pl);  /* transpose.c */
kiln_status kiln_opt_conv_slice(struct kiln_graph *g, struct kiln_opt_pass_log *pl); /* conv_slice.c */
kiln_status kiln_opt_conv_taps(struct kiln_graph *g, struct kiln_opt_pass_log *pl); /* conv_taps.c */
kiln_status kiln_opt_conv_bn(struct kiln_graph *g, struct kiln_opt_pass_log *pl);    /* conv_bn.c */
kiln_status kiln_opt_fuse_conv(struct kiln_graph *g, struct kiln_opt_pass_log *pl);  /* fuse_act.c */
kiln_status kiln_opt_fuse_matmul(struct kiln_graph *g, struct kiln_opt_pass_log *pl);/* fuse_matmul.c */
/* The perm of Transpose node n for rank r (default: reversed); false if invalid (transpose.c). */
bool kiln_opt_transpose_perm(const struct kiln_node *n, int r, int64_t *p);
kiln_status kiln_opt_transpose_matmul(struct kiln_graph *g,
                                      struct kiln_opt_pass_log *pl); /* transpose_matmul.c */
kiln_status kiln_opt_qadd(struct kiln_graph *g, struct kiln_opt_pass_log *pl);       /* qadd.c */
kiln_status kiln_opt_qlut(struct kiln_graph *g, struct kiln_opt_pass_log *pl);       /* qlut.c */
kiln_status kiln_opt_silu(struct kiln_graph *g, struct kiln_opt_pass_log *pl);       /* silu.c */
/* The layout pass (layout.c, another file's owner): run last when o->layout. */
kiln_status kiln_opt_layout(struct kiln_graph *g, struct kiln_opt_pass_log *pl) __attribute__((weak));
/* After the layout pass: blocked expand / depthwise / [squeeze-excitation] / project
 * chains -> KilnMBConv (mbconv.c) */
kiln_status kiln_opt_mbconv(struct kiln_graph *g, struct kiln_opt_pass_log *pl);
kiln_status kiln_opt_qconv_sum(struct kiln_graph *g, struct kiln_opt_pass_log *pl); /* qconv_sum.c */

#endif
