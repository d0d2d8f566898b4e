/*
 * kernel.h - the contract between the executor and an op's kernels.
 *
 * Each op has one struct kiln_op_impl: a shape function (infer) and a
 * reference kernel (run). Define it in the op family's file with
 *
 *     KILN_REF_OP(Relu, kiln_infer_same, relu_run);
 *
 * infer: given the input types (and, where known, the input values), fill
 * the output types. It is used twice: statically at load (types may be
 * partly unknown: rank -1 or dims -1; input values only for constants) and
 * at run time, where every input is concrete and every input value is known.
 * Then the output types must come out fully concrete. infer never fails
 * because something is unknown; it fails (with kiln_node_error) only for
 * inputs that are wrong whatever the unknowns turn out to be.
 *
 * run: the executor has allocated ctx->out[i] with the shape infer gave
 * (zero-filled) unless the op has the DYNOUT flag, in which case run must
 * create each ctx->out[i] itself (kiln_tensor_new). ctx->in[i] is NULL for
 * an absent optional input. Kernels never keep pointers past the call.
 */
#ifndef KILN_KERNELS_KERNEL_H
#define KILN_KERNELS_KERNEL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "ir/graph.h"

#define KILN_MAX_IO 64 /* most inputs / outputs a node may have at run time */

struct kiln_infer_ctx {
    const struct kiln_node *node;
    int n_in;
    const struct kiln_type *const *in;  /* NULL entry = absent optional input */
    const kiln_tensor *const *in_value; /* known input values (NULL entry = unknown) */
    int n_out;
    struct kiln_type *const *out;       /* NULL entry = output not wanted */
};

struct kiln_exec_frame; /* executor state, for control-flow kernels */

struct kiln_run_ctx {
    const struct kiln_node *node;
    int n_in;
    kiln_tensor *const *in;   /* NULL entry = absent optional input */
    int n_out;
    kiln_tensor **out;        /* preallocated, or to be set by DYNOUT kernels */
    struct kiln_exec_frame *frame;
    void *scratch;            /* plan runs: the kernel's scratch_bytes of arena memory */
    int threads;              /* threads this run may use (>= 1; 0 from old callers = 1) */
};

typedef kiln_status (*kiln_infer_fn)(struct kiln_infer_ctx *ctx);
typedef kiln_status (*kiln_run_fn)(struct kiln_run_ctx *ctx);

struct kiln_op_impl {
    kiln_infer_fn infer;
    kiln_run_fn run;
};

#define KILN_REF_OP(name, infer_fn, run_fn) \
    const struct kiln_op_impl kiln_impl_##name = {infer_fn, run_fn}

/* The implementation of an op, or NULL if Kiln has no kernel for it. */
const struct kiln_op_impl *kiln_op_impl(enum kiln_op op);

/* ---- Attributes (defaults when absent; wrong type is an error) ---- */
int64_t kiln_attr_int(const struct kiln_node *n, const char *name, int64_t dflt);
float kiln_attr_float(const struct kiln_node *n, const char *name, float dflt);
/* NUL-terminated string attribute or dflt. */
const char *kiln_attr_str(const struct kiln_node *n, const char *name, const char *dflt);
/* INTS attribute: returns count (-1 if absent); *vals points into the graph. */
int kiln_attr_ints(const struct kiln_node *n, const char *name, const int64_t **vals);
int kiln_attr_floats(const struct kiln_node *n, const char *name, const float **vals);
const kiln_tensor *kiln_attr_tensor(const struct kiln_node *n, const char *name);
/* Report (and clear) an attribute read with the wrong type since the last
 * check; called by the executor and shape inference after each kernel call. */
kiln_status kiln_attr_check(const struct kiln_node *n);

/* ---- Common shape functions ---- */
/* Output 0 has input 0's type. */
kiln_status kiln_infer_same(struct kiln_infer_ctx *ctx);
/* Every output i < n_in has input i's type (pass-through ops). */
/* Output 0: numpy broadcast of all present inputs; dtype of input 0. */
kiln_status kiln_infer_broadcast(struct kiln_infer_ctx *ctx);
/* Same as kiln_infer_broadcast, output dtype bool (comparisons). */
kiln_status kiln_infer_broadcast_bool(struct kiln_infer_ctx *ctx);
/* Broadcast a set of types (NULL entries skipped) into out (shape only). */
kiln_status kiln_infer_broadcast_types(const struct kiln_node *node, int n,
                                       const struct kiln_type *const *in,
                                       struct kiln_type *out);
/* Set out to a concrete shape. */
void kiln_type_set(struct kiln_type *t, kiln_dtype dt, int rank, const int64_t *dims);

/* Normalize an axis in [-rank, rank) to [0, rank); error names the node. */
kiln_status kiln_norm_axis(const struct kiln_node *n, int64_t axis, int rank, int *out);

/* ---- Element loops over broadcast inputs ----
 * Iterate the output index space of rank r / dims d, keeping a flat offset
 * into each of up to 4 inputs with the given (broadcast) strides. */
struct kiln_bcast_iter {
    int rank;
    int64_t dims[KILN_MAX_RANK];
    int64_t idx[KILN_MAX_RANK];
    int n;
    int64_t strides[4][KILN_MAX_RANK];
    int64_t off[4];
};
void kiln_bcast_iter_init(struct kiln_bcast_iter *it, const kiln_tensor *out, int n,
                          const kiln_tensor *const *ins);
/* Advance to the next output element (call once per element after the first). */
static inline void kiln_bcast_iter_next(struct kiln_bcast_iter *it)
{
    for (int d = it->rank - 1; d >= 0; d--) {
        it->idx[d]++;
        for (int k = 0; k < it->n; k++) it->off[k] += it->strides[k][d];
        if (it->idx[d] < it->dims[d]) return;
        for (int k = 0; k < it->n; k++) it->off[k] -= it->strides[k][d] * it->dims[d];
        it->idx[d] = 0;
    }
}

#endif
