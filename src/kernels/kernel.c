/*
 * kernel.c - helpers shared by every kernel: attributes, common shape
 * functions, broadcast iteration.
 */
#include <stdio.h>

#include "kernels/kernel.h"

/* An attribute of the wrong type is a model error. The getters return the
 * default and remember the problem; the executor and the shape inference
 * call kiln_attr_check after each kernel call and report it. */
static _Thread_local const struct kiln_node *bad_attr_node;
static _Thread_local char bad_attr_name[64];  /* copies: the node may be freed before */
static _Thread_local const char *bad_attr_found; /* the check (names of static strings) */
static _Thread_local const char *bad_attr_want;

static const char *attr_type_name(enum kiln_attr_type t)
{
    switch (t) {
    case KILN_ATTR_FLOAT: return "FLOAT";
    case KILN_ATTR_INT: return "INT";
    case KILN_ATTR_STRING: return "STRING";
    case KILN_ATTR_TENSOR: return "TENSOR";
    case KILN_ATTR_GRAPH: return "GRAPH";
    case KILN_ATTR_FLOATS: return "FLOATS";
    case KILN_ATTR_INTS: return "INTS";
    case KILN_ATTR_STRINGS: return "STRINGS";
    }
    return "?";
}

static const struct kiln_attr *attr_typed(const struct kiln_node *n, const char *name,
                                          enum kiln_attr_type want)
{
    const struct kiln_attr *a = kiln_node_attr(n, name);
    if (!a || a->type == want) return a;
    if (!bad_attr_node) {
        bad_attr_node = n;
        snprintf(bad_attr_name, sizeof bad_attr_name, "%s", a->name ? a->name : "?");
        bad_attr_found = attr_type_name(a->type);
        bad_attr_want = attr_type_name(want);
    }
    return NULL;
}

kiln_status kiln_attr_check(const struct kiln_node *n)
{
    if (!bad_attr_node) return KILN_OK;
    const struct kiln_node *bn = bad_attr_node;
    bad_attr_node = NULL;
    /* A problem remembered for another node was left by a caller that read an attribute
     * without checking (that node may be freed by now: its model failed or was unloaded);
     * it is dropped, and that node's own shape function reports it when it runs. */
    if (bn != n) return KILN_OK;
    return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "attribute '%s' has type %s, expected %s",
                           bad_attr_name, bad_attr_found, bad_attr_want);
}

int64_t kiln_attr_int(const struct kiln_node *n, const char *name, int64_t dflt)
{
    const struct kiln_attr *a = attr_typed(n, name, KILN_ATTR_INT);
    return a ? a->i : dflt;
}

float kiln_attr_float(const struct kiln_node *n, const char *name, float dflt)
{
    const struct kiln_attr *a = attr_typed(n, name, KILN_ATTR_FLOAT);
    return a ? a->f : dflt;
}

const char *kiln_attr_str(const struct kiln_node *n, const char *name, const char *dflt)
{
    const struct kiln_attr *a = attr_typed(n, name, KILN_ATTR_STRING);
    return a ? a->s.data : dflt;
}

int kiln_attr_ints(const struct kiln_node *n, const char *name, const int64_t **vals)
{
    const struct kiln_attr *a = attr_typed(n, name, KILN_ATTR_INTS);
    *vals = a ? a->ints : NULL;
    return a ? a->n : -1;
}

int kiln_attr_floats(const struct kiln_node *n, const char *name, const float **vals)
{
    const struct kiln_attr *a = attr_typed(n, name, KILN_ATTR_FLOATS);
    *vals = a ? a->floats : NULL;
    return a ? a->n : -1;
}

const kiln_tensor *kiln_attr_tensor(const struct kiln_node *n, const char *name)
{
    const struct kiln_attr *a = attr_typed(n, name, KILN_ATTR_TENSOR);
    return a ? a->t : NULL;
}

void kiln_type_set(struct kiln_type *t, kiln_dtype dt, int rank, const int64_t *dims)
{
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->rank = rank;
    for (int i = 0; i < rank && i < KILN_MAX_RANK; i++) t->dims[i] = dims[i];
}

kiln_status kiln_infer_same(struct kiln_infer_ctx *ctx)
{
    if (ctx->n_out > 0 && ctx->out[0] && ctx->n_in > 0 && ctx->in[0]) *ctx->out[0] = *ctx->in[0];
    return KILN_OK;
}

kiln_status kiln_infer_broadcast_types(const struct kiln_node *node, int n,
                                       const struct kiln_type *const *in,
                                       struct kiln_type *out)
{
    int r = 0;
    for (int k = 0; k < n; k++) {
        if (!in[k]) continue;
        if (in[k]->rank < 0) {
            out->rank = -1;
            return KILN_OK;
        }
        if (in[k]->rank > r) r = in[k]->rank;
    }
    out->rank = r;
    for (int i = 0; i < r; i++) {
        int64_t d = 1;
        const char *sym = NULL;
        bool unknown = false;
        for (int k = 0; k < n; k++) {
            if (!in[k]) continue;
            int j = i - (r - in[k]->rank);
            if (j < 0) continue;
            int64_t dk = in[k]->dims[j];
            if (dk < 0) {
                unknown = true;
                if (!sym) sym = in[k]->sym[j];
                continue;
            }
            if (dk == 1) continue;
            if (d != 1 && d != dk)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "inputs cannot be broadcast: dim %d is %lld in one input "
                                       "and %lld in another",
                                       i, (long long)d, (long long)dk);
            d = dk;
        }
        /* a known dim > 1 wins; an unknown one could be 1 or the other value */
        if (d != 1) {
            out->dims[i] = d;
            out->sym[i] = NULL;
        } else if (unknown) {
            out->dims[i] = -1;
            out->sym[i] = sym;
        } else {
            out->dims[i] = 1;
            out->sym[i] = NULL;
        }
    }
    return KILN_OK;
}

kiln_status kiln_infer_broadcast(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    struct kiln_type t;
    kiln_type_unknown(&t);
    t.dtype = ctx->in[0] ? ctx->in[0]->dtype : KILN_DTYPE_UNDEFINED;
    kiln_status st = kiln_infer_broadcast_types(ctx->node, ctx->n_in, ctx->in, &t);
    if (st != KILN_OK) return st;
    *ctx->out[0] = t;
    return KILN_OK;
}

kiln_status kiln_infer_broadcast_bool(struct kiln_infer_ctx *ctx)
{
    kiln_status st = kiln_infer_broadcast(ctx);
    if (st == KILN_OK && ctx->out[0]) ctx->out[0]->dtype = KILN_DTYPE_BOOL;
    return st;
}

kiln_status kiln_norm_axis(const struct kiln_node *n, int64_t axis, int rank, int *out)
{
    int64_t a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= (rank > 0 ? rank : 1))
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "axis %lld is out of range for rank %d",
                               (long long)axis, rank);
    *out = (int)a;
    return KILN_OK;
}

void kiln_bcast_iter_init(struct kiln_bcast_iter *it, const kiln_tensor *out, int n,
                          const kiln_tensor *const *ins)
{
    memset(it, 0, sizeof *it);
    it->rank = out->rank;
    it->n = n;
    for (int i = 0; i < out->rank; i++) it->dims[i] = out->dims[i];
    for (int k = 0; k < n; k++)
        kiln_broadcast_strides(ins[k]->rank, ins[k]->dims, out->rank, out->dims, it->strides[k]);
}
