/*
 * exec.h - the reference executor: runs a graph node by node.
 *
 * Every node's output shape is computed by its shape function on the
 * concrete inputs, the outputs are allocated, and the reference kernel
 * runs. Values are freed after their last use. All state lives in a
 * frame on the caller's stack, so concurrent runs share nothing mutable.
 * Subgraphs (If, Loop, Scan) run in child frames that read captured
 * values through their parent frame.
 */
#ifndef KILN_EXEC_EXEC_H
#define KILN_EXEC_EXEC_H

#include "ir/graph.h"
#include "kernels/kernel.h"
#include "kiln/kiln.h"

struct kiln_exec_frame {
    const struct kiln_graph *g;
    struct kiln_exec_frame *parent;
    kiln_tensor **vals;      /* current value of each value id, or NULL */
    unsigned char *owned;    /* vals[i] is owned by this frame */
    int *remaining;          /* uses left before vals[i] can be freed */
    int depth;               /* subgraph nesting, bounded */
    int64_t max_tensor_bytes; /* largest tensor a node may produce (inherited by subgraphs) */
    const struct kiln_run_options *ro; /* deadline / cancel flag, or NULL (inherited) */
    int profile;             /* a plan's run: time every step, the bodies' plans' too */
};

/* Default bound on one tensor produced at run time. */
#define KILN_EXEC_DEFAULT_MAX_TENSOR_BYTES ((int64_t)16 << 30)

/* Run g with the given inputs (borrowed; one per graph input, in order).
 * outputs[i] receives an owned tensor for each graph output. */
kiln_status kiln_exec_run(const struct kiln_graph *g, struct kiln_exec_frame *parent,
                          kiln_tensor *const *inputs, kiln_tensor **outputs);
/* Top-level run with a bound on each tensor a node produces (0 = default). */
kiln_status kiln_exec_run_limited(const struct kiln_graph *g, kiln_tensor *const *inputs,
                                  kiln_tensor **outputs, int64_t max_tensor_bytes,
                                  const struct kiln_run_options *ro);
/* KILN_ERR_DEADLINE (with a message) once ro's deadline passed or its cancel
 * flag is set; KILN_OK otherwise or when ro is NULL. */
kiln_status kiln_exec_check_deadline(const struct kiln_run_options *ro);

/* Evaluate one node on concrete inputs (in[k] NULL for an absent optional
 * input) with its reference kernel: shapes inferred from the input values,
 * outputs allocated zeroed (DYNOUT kernels make their own) and bounded by
 * max_tensor_bytes each. out[0..n_out) receives owned tensors, or all NULL on
 * error. f is the frame control-flow kernels run their bodies in (NULL
 * outside a run). Used by the executor, constant folding and plan compilation. */
kiln_status kiln_exec_node(const struct kiln_node *n, kiln_tensor *const *in, kiln_tensor **out,
                           struct kiln_exec_frame *f, int64_t max_tensor_bytes);

/* A Loop's optional inputs M and cond (in[0], in[1]), read the same way by the reference
 * Loop and the Loop step of a plan: each must have one element (an error naming n
 * otherwise); M present sets *max_trip (negative counts as 0) and *bounded, else both stay
 * as the caller set them; *cond is cond's truth, true when absent. */
kiln_status kiln_loop_inputs(const struct kiln_node *n, kiln_tensor *const *in, int64_t *max_trip,
                             bool *bounded, bool *cond);

/* The current value of id in frame f (following captures to parents). */
kiln_tensor *kiln_exec_value(struct kiln_exec_frame *f, int id);

#endif
