/*
 * sequence.c - reference kernels of ONNX's sequence and optional ops:
 * SequenceEmpty, SequenceConstruct, SequenceAt, SequenceInsert, SequenceErase,
 * SequenceLength, SplitToSequence, ConcatFromSequence, SequenceMap, Optional,
 * OptionalHasElement and OptionalGetElement.
 *
 * A sequence or optional value is a container kiln_tensor (dtype
 * KILN_DTYPE_SEQUENCE / KILN_DTYPE_OPTIONAL, kiln.h): dims[0] owned item
 * pointers. Every op here is DYNOUT and makes new containers holding copies
 * of the items it keeps, so values never share items and the executor frees
 * each container with its items after the last use. Positions follow ONNX:
 * negative counts from the end, and one out of range is an error naming the
 * node, the position and the length, never a read past the end. The ops
 * carry the SEQ flag, so plans refuse graphs holding them and these graphs
 * run in the reference executor (docs/SEQUENCES.md).
 */
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"
#include "kernels/kernel.h"

/* ---- helpers ---- */

static void set_container_type(struct kiln_type *t, kiln_dtype kind)
{
    if (!t) return;
    kiln_type_unknown(t);
    t->dtype = kind;
}

/* Static check: input k, where its type is known, is (or is not) a container of kind. */
static kiln_status want_kind(const struct kiln_infer_ctx *ctx, int k, kiln_dtype kind)
{
    const struct kiln_type *t = k < ctx->n_in ? ctx->in[k] : NULL;
    if (!t || t->dtype == KILN_DTYPE_UNDEFINED) return KILN_OK;
    bool is_kind = kind ? t->dtype == kind : !kiln_dtype_is_container(t->dtype);
    if (is_kind) return KILN_OK;
    return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "input %d must be %s, not %s", k,
                           kind ? kiln_dtype_name(kind) : "a tensor", kiln_dtype_name(t->dtype));
}

static kiln_status need_seq(const struct kiln_node *n, const kiln_tensor *t, int k)
{
    if (t && t->dtype == KILN_DTYPE_SEQUENCE) return KILN_OK;
    return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "input %d must be a sequence, got %s", k,
                           t ? kiln_dtype_name(t->dtype) : "nothing");
}

static kiln_status need_tensor(const struct kiln_node *n, const kiln_tensor *t, int k)
{
    if (t && !kiln_dtype_is_container(t->dtype)) return KILN_OK;
    return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "input %d must be a tensor, got %s", k,
                           t ? kiln_dtype_name(t->dtype) : "nothing");
}

static const kiln_tensor *seq_item(const kiln_tensor *s, int64_t i)
{
    return ((kiln_tensor *const *)s->data)[i];
}

/* The position input (a scalar integer) as a value in [0, n + extra), ONNX's negative
 * positions counting from the end; extra 1 allows the position one past the last. */
static kiln_status position(const struct kiln_node *n, const kiln_tensor *p, int64_t len,
                            int extra, int64_t *out)
{
    if (p->dtype != KILN_DTYPE_I32 && p->dtype != KILN_DTYPE_I64)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "position must be int32 or int64, got %s",
                               kiln_dtype_name(p->dtype));
    if (kiln_tensor_count(p) != 1)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "position must be a scalar, got %lld elements",
                               (long long)kiln_tensor_count(p));
    int64_t v = kiln_tensor_i64(p, 0);
    int64_t hi = len + extra; /* positions in [-len, hi) are valid */
    if (v < -len || v >= hi)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "position %lld is out of range for a sequence of length %lld "
                               "(valid: %lld to %lld)",
                               (long long)v, (long long)len, (long long)-len, (long long)(hi - 1));
    *out = v < 0 ? v + len : v;
    return KILN_OK;
}

/* A new sequence of n slots with copies of src's items [0, n) except skip (or -1),
 * leaving slot `hole` (or -1) empty: the common shape of insert and erase. */
static kiln_status seq_copy(const kiln_tensor *src, int64_t skip, int64_t hole, kiln_tensor **out)
{
    int64_t len = src->dims[0];
    int64_t n = len - (skip >= 0) + (hole >= 0);
    kiln_status st = kiln_tensor_container_create(KILN_DTYPE_SEQUENCE, n, out);
    if (st != KILN_OK) return st;
    int64_t o = 0;
    for (int64_t i = 0; i < len; i++) {
        if (i == skip) continue;
        if (o == hole) o++;
        kiln_tensor *c;
        if ((st = kiln_tensor_clone(seq_item(src, i), &c)) != KILN_OK ||
            (st = kiln_tensor_set_item(*out, o++, c)) != KILN_OK) {
            kiln_tensor_free(*out);
            *out = NULL;
            return st;
        }
    }
    return KILN_OK;
}

/* ---- SequenceEmpty, SequenceConstruct ---- */

static kiln_status seq_out_infer(struct kiln_infer_ctx *ctx)
{
    for (int k = 0; k < ctx->n_out; k++) set_container_type(ctx->out[k], KILN_DTYPE_SEQUENCE);
    return KILN_OK;
}

static kiln_status sequence_empty_run(struct kiln_run_ctx *ctx)
{
    return kiln_tensor_container_create(KILN_DTYPE_SEQUENCE, 0, &ctx->out[0]);
}

static kiln_status construct_infer(struct kiln_infer_ctx *ctx)
{
    for (int k = 0; k < ctx->n_in; k++) {
        kiln_status st = want_kind(ctx, k, 0);
        if (st != KILN_OK) return st;
    }
    return seq_out_infer(ctx);
}

static kiln_status sequence_construct_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    for (int k = 0; k < ctx->n_in; k++) {
        kiln_status st = need_tensor(n, ctx->in[k], k);
        if (st != KILN_OK) return st;
        if (ctx->in[k]->dtype != ctx->in[0]->dtype)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "input %d is %s but input 0 is %s: a sequence holds one dtype",
                                   k, kiln_dtype_name(ctx->in[k]->dtype),
                                   kiln_dtype_name(ctx->in[0]->dtype));
    }
    kiln_status st = kiln_tensor_container_create(KILN_DTYPE_SEQUENCE, ctx->n_in, &ctx->out[0]);
    for (int k = 0; st == KILN_OK && k < ctx->n_in; k++) {
        kiln_tensor *c;
        if ((st = kiln_tensor_clone(ctx->in[k], &c)) == KILN_OK)
            st = kiln_tensor_set_item(ctx->out[0], k, c);
    }
    return st;
}

KILN_REF_OP(SequenceEmpty, seq_out_infer, sequence_empty_run);
KILN_REF_OP(SequenceConstruct, construct_infer, sequence_construct_run);

/* ---- SequenceAt, SequenceLength ---- */

static kiln_status at_infer(struct kiln_infer_ctx *ctx)
{
    kiln_status st = want_kind(ctx, 0, KILN_DTYPE_SEQUENCE);
    if (st != KILN_OK) return st;
    if (ctx->out[0]) kiln_type_unknown(ctx->out[0]); /* the item's type is known at run time */
    return KILN_OK;
}

static kiln_status sequence_at_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    kiln_status st = need_seq(n, ctx->in[0], 0);
    if (st != KILN_OK) return st;
    if ((st = need_tensor(n, ctx->in[1], 1)) != KILN_OK) return st;
    int64_t i;
    if ((st = position(n, ctx->in[1], ctx->in[0]->dims[0], 0, &i)) != KILN_OK) return st;
    return kiln_tensor_clone(seq_item(ctx->in[0], i), &ctx->out[0]);
}

static kiln_status length_infer(struct kiln_infer_ctx *ctx)
{
    kiln_status st = want_kind(ctx, 0, KILN_DTYPE_SEQUENCE);
    if (st != KILN_OK) return st;
    if (ctx->out[0]) kiln_type_set(ctx->out[0], KILN_DTYPE_I64, 0, NULL);
    return KILN_OK;
}

static kiln_status sequence_length_run(struct kiln_run_ctx *ctx)
{
    kiln_status st = need_seq(ctx->node, ctx->in[0], 0);
    if (st != KILN_OK) return st;
    return kiln_tensor_scalar_i64(KILN_DTYPE_I64, ctx->in[0]->dims[0], &ctx->out[0]);
}

KILN_REF_OP(SequenceAt, at_infer, sequence_at_run);
KILN_REF_OP(SequenceLength, length_infer, sequence_length_run);

/* ---- SequenceInsert, SequenceErase ---- */

static kiln_status edit_infer(struct kiln_infer_ctx *ctx)
{
    kiln_status st = want_kind(ctx, 0, KILN_DTYPE_SEQUENCE);
    for (int k = 1; st == KILN_OK && k < ctx->n_in; k++) st = want_kind(ctx, k, 0);
    if (st != KILN_OK) return st;
    return seq_out_infer(ctx);
}

static kiln_status sequence_insert_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *s = ctx->in[0], *x = ctx->in[1];
    kiln_status st = need_seq(n, s, 0);
    if (st == KILN_OK) st = need_tensor(n, x, 1);
    if (st != KILN_OK) return st;
    int64_t len = s->dims[0], at = len;
    if (len > 0 && seq_item(s, 0)->dtype != x->dtype)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "inserting a %s tensor into a sequence of %s",
                               kiln_dtype_name(x->dtype), kiln_dtype_name(seq_item(s, 0)->dtype));
    if (ctx->n_in > 2 && ctx->in[2] && (st = position(n, ctx->in[2], len, 1, &at)) != KILN_OK)
        return st;
    if (len + 1 > KILN_SEQUENCE_MAX_ITEMS)
        return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "the sequence would exceed %lld items",
                               (long long)KILN_SEQUENCE_MAX_ITEMS);
    if ((st = seq_copy(s, -1, at, &ctx->out[0])) != KILN_OK) return st;
    kiln_tensor *c;
    if ((st = kiln_tensor_clone(x, &c)) != KILN_OK) return st;
    return kiln_tensor_set_item(ctx->out[0], at, c);
}

static kiln_status sequence_erase_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *s = ctx->in[0];
    kiln_status st = need_seq(n, s, 0);
    if (st != KILN_OK) return st;
    int64_t len = s->dims[0], at = len - 1;
    if (ctx->n_in > 1 && ctx->in[1]) {
        if ((st = position(n, ctx->in[1], len, 0, &at)) != KILN_OK) return st;
    } else if (len == 0) {
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "cannot erase from an empty sequence");
    }
    return seq_copy(s, at, -1, &ctx->out[0]);
}

KILN_REF_OP(SequenceInsert, edit_infer, sequence_insert_run);
KILN_REF_OP(SequenceErase, edit_infer, sequence_erase_run);

/* ---- SplitToSequence ---- */

/* Copy the slab [off, off + len) along axis of x (outer x dim x inner elements) into a
 * new tensor of shape odims (rank orank). */
static kiln_status slab(const kiln_tensor *x, int64_t outer, int64_t dim, int64_t inner,
                        int64_t off, int64_t len, int orank, const int64_t *odims,
                        kiln_tensor **out)
{
    kiln_status st = kiln_tensor_new(x->dtype, orank, odims, out);
    if (st != KILN_OK) return st;
    for (int64_t o = 0; o < outer && len * inner > 0; o++) {
        st = kiln_tensor_copy_elems(*out, o * len * inner, x, (o * dim + off) * inner, len * inner);
        if (st != KILN_OK) {
            kiln_tensor_free(*out);
            *out = NULL;
            return st;
        }
    }
    return KILN_OK;
}

static kiln_status split_to_sequence_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    const kiln_tensor *sp = ctx->n_in > 1 ? ctx->in[1] : NULL;
    kiln_status st = need_tensor(n, x, 0);
    if (st == KILN_OK && sp) st = need_tensor(n, sp, 1);
    if (st != KILN_OK) return st;
    if (x->rank == 0)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "cannot split a scalar");
    int axis;
    if ((st = kiln_norm_axis(n, kiln_attr_int(n, "axis", 0), x->rank, &axis)) != KILN_OK)
        return st;
    bool keepdims = kiln_attr_int(n, "keepdims", 1) != 0;
    int64_t dim = x->dims[axis], outer = 1, inner = 1;
    for (int i = 0; i < axis; i++) outer *= x->dims[i];
    for (int i = axis + 1; i < x->rank; i++) inner *= x->dims[i];
    /* chunk lengths: from split, or 1 each */
    int64_t count, chunk = 1;
    const kiln_tensor *lens = NULL;
    if (sp) {
        if (sp->dtype != KILN_DTYPE_I32 && sp->dtype != KILN_DTYPE_I64)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "split must be int32 or int64, got %s",
                                   kiln_dtype_name(sp->dtype));
        if (sp->rank == 0) {
            chunk = kiln_tensor_i64(sp, 0);
            if (chunk <= 0)
                return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                       "split %lld must be positive", (long long)chunk);
            count = (dim + chunk - 1) / chunk;
        } else if (sp->rank == 1) {
            lens = sp;
            count = sp->dims[0];
            int64_t sum = 0;
            for (int64_t i = 0; i < count; i++) {
                int64_t v = kiln_tensor_i64(sp, i);
                if (v < 0 || v > dim - sum)
                    return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                           "split[%lld] = %lld: the lengths must be >= 0 and sum "
                                           "to the axis dim %lld",
                                           (long long)i, (long long)v, (long long)dim);
                sum += v;
            }
            if (sum != dim)
                return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                       "split lengths sum to %lld, not the axis dim %lld",
                                       (long long)sum, (long long)dim);
        } else {
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "split must be a scalar or 1-D, got rank %d", sp->rank);
        }
    } else {
        count = dim;
    }
    if ((st = kiln_tensor_container_create(KILN_DTYPE_SEQUENCE, count, &ctx->out[0])) != KILN_OK)
        return st;
    bool squeeze = !sp && !keepdims;
    int64_t off = 0;
    for (int64_t i = 0; i < count; i++) {
        int64_t len = lens ? kiln_tensor_i64(lens, i) : (dim - off < chunk ? dim - off : chunk);
        int64_t odims[KILN_MAX_RANK];
        int orank = 0;
        for (int d = 0; d < x->rank; d++) {
            if (d == axis && squeeze) continue;
            odims[orank++] = d == axis ? len : x->dims[d];
        }
        kiln_tensor *part;
        if ((st = slab(x, outer, dim, inner, off, len, orank, odims, &part)) != KILN_OK ||
            (st = kiln_tensor_set_item(ctx->out[0], i, part)) != KILN_OK)
            return st; /* the executor frees out[0] */
        off += len;
    }
    return KILN_OK;
}

static kiln_status split_infer(struct kiln_infer_ctx *ctx)
{
    kiln_status st = want_kind(ctx, 0, 0);
    if (st == KILN_OK) st = want_kind(ctx, 1, 0);
    if (st != KILN_OK) return st;
    return seq_out_infer(ctx);
}

KILN_REF_OP(SplitToSequence, split_infer, split_to_sequence_run);

/* ---- ConcatFromSequence ---- */

static kiln_status concat_infer(struct kiln_infer_ctx *ctx)
{
    kiln_status st = want_kind(ctx, 0, KILN_DTYPE_SEQUENCE);
    if (st != KILN_OK) return st;
    if (!kiln_node_attr(ctx->node, "axis"))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "needs attribute axis");
    if (ctx->out[0]) kiln_type_unknown(ctx->out[0]);
    return KILN_OK;
}

static kiln_status concat_from_sequence_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *s = ctx->in[0];
    kiln_status st = need_seq(n, s, 0);
    if (st != KILN_OK) return st;
    if (!kiln_node_attr(n, "axis"))
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "needs attribute axis");
    int64_t len = s->dims[0];
    if (len == 0)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "cannot concatenate an empty sequence");
    const kiln_tensor *f = seq_item(s, 0);
    bool new_axis = kiln_attr_int(n, "new_axis", 0) != 0;
    int r = f->rank + (new_axis ? 1 : 0);
    if (r > KILN_MAX_RANK)
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "rank %d exceeds Kiln's maximum of %d", r,
                               KILN_MAX_RANK);
    if (r == 0)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "cannot concatenate scalars without new_axis");
    int axis;
    if ((st = kiln_norm_axis(n, kiln_attr_int(n, "axis", 0), r, &axis)) != KILN_OK) return st;
    /* every item seen with rank r (new_axis: a 1 inserted at axis) */
    int64_t odims[KILN_MAX_RANK];
    for (int64_t i = 0; i < len; i++) {
        const kiln_tensor *t = seq_item(s, i);
        int64_t d[KILN_MAX_RANK];
        for (int k = 0, j = 0; k < r; k++) d[k] = new_axis && k == axis ? 1 : t->dims[j++];
        if (t->dtype != f->dtype || t->rank != f->rank)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "item %lld is %s of rank %d, item 0 %s of rank %d",
                                   (long long)i, kiln_dtype_name(t->dtype), t->rank,
                                   kiln_dtype_name(f->dtype), f->rank);
        for (int k = 0; k < r; k++) {
            if (i == 0) odims[k] = d[k];
            else if (k == axis) odims[k] += d[k];
            else if (odims[k] != d[k])
                return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                       "item %lld has dim %d = %lld, item 0 has %lld",
                                       (long long)i, k, (long long)d[k], (long long)odims[k]);
        }
    }
    if (kiln_shape_count(r, odims) < 0)
        return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "the result would be too large");
    if ((st = kiln_tensor_new(f->dtype, r, odims, &ctx->out[0])) != KILN_OK) return st;
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < axis; k++) outer *= odims[k];
    for (int k = axis + 1; k < r; k++) inner *= odims[k];
    int64_t off = 0;
    for (int64_t i = 0; i < len; i++) {
        const kiln_tensor *t = seq_item(s, i);
        int64_t a = new_axis ? 1 : t->dims[axis];
        for (int64_t o = 0; o < outer && a * inner > 0; o++) {
            st = kiln_tensor_copy_elems(ctx->out[0], (o * odims[axis] + off) * inner, t,
                                        o * a * inner, a * inner);
            if (st != KILN_OK) return st;
        }
        off += a;
    }
    return KILN_OK;
}

KILN_REF_OP(ConcatFromSequence, concat_infer, concat_from_sequence_run);

/* ---- SequenceMap ---- */

static const struct kiln_graph *body_attr(const struct kiln_node *n)
{
    const struct kiln_attr *a = kiln_node_attr(n, "body");
    return a && a->type == KILN_ATTR_GRAPH ? a->g : NULL;
}

static kiln_status map_check(const struct kiln_node *n, int n_in, int n_out,
                             const struct kiln_graph **out)
{
    const struct kiln_graph *b = body_attr(n);
    if (!b) return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "needs graph attribute body");
    if (b->n_inputs != n_in || b->n_outputs != n_out)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "body has %d inputs and %d outputs; the node has %d and %d",
                               b->n_inputs, b->n_outputs, n_in, n_out);
    *out = b;
    return KILN_OK;
}

static kiln_status map_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_graph *b = NULL;
    kiln_status st = map_check(ctx->node, ctx->n_in, ctx->n_out, &b);
    if (st == KILN_OK) st = want_kind(ctx, 0, KILN_DTYPE_SEQUENCE);
    if (st != KILN_OK) return st;
    return seq_out_infer(ctx);
}

static kiln_status sequence_map_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_graph *b = NULL;
    kiln_status st = map_check(n, ctx->n_in, ctx->n_out, &b);
    if (st == KILN_OK) st = need_seq(n, ctx->in[0], 0);
    if (st != KILN_OK) return st;
    int64_t len = ctx->in[0]->dims[0];
    for (int k = 1; k < ctx->n_in; k++) {
        const kiln_tensor *t = ctx->in[k];
        if (!t) return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "input %d is absent", k);
        if (t->dtype == KILN_DTYPE_OPTIONAL)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "input %d is an optional; SequenceMap takes sequences and "
                                   "tensors", k);
        if (t->dtype == KILN_DTYPE_SEQUENCE && t->dims[0] != len)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "input %d has %lld items but input 0 has %lld", k,
                                   (long long)t->dims[0], (long long)len);
    }
    for (int k = 0; k < ctx->n_out; k++)
        if ((st = kiln_tensor_container_create(KILN_DTYPE_SEQUENCE, len, &ctx->out[k])) != KILN_OK)
            return st;
    kiln_tensor *bin[KILN_MAX_IO], *bout[KILN_MAX_IO];
    for (int64_t i = 0; i < len; i++) {
        if (ctx->frame && (st = kiln_exec_check_deadline(ctx->frame->ro)) != KILN_OK) return st;
        for (int k = 0; k < ctx->n_in; k++) {
            kiln_tensor *t = ctx->in[k];
            bin[k] = t->dtype == KILN_DTYPE_SEQUENCE ? ((kiln_tensor **)t->data)[i] : t;
        }
        if ((st = kiln_exec_run(b, ctx->frame, bin, bout)) != KILN_OK)
            return kiln_error_wrap(st, "%s node '%s' item %lld", n->op_type, n->name,
                                   (long long)i);
        for (int k = 0; k < ctx->n_out; k++) {
            kiln_status sst = kiln_tensor_set_item(ctx->out[k], i, bout[k]); /* takes bout[k] */
            if (sst != KILN_OK && st == KILN_OK) st = sst;
        }
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

KILN_REF_OP(SequenceMap, map_infer, sequence_map_run);

/* ---- Optional, OptionalHasElement, OptionalGetElement ---- */

static kiln_status optional_infer(struct kiln_infer_ctx *ctx)
{
    if (ctx->n_in > 0 && ctx->in[0] && ctx->in[0]->dtype == KILN_DTYPE_OPTIONAL)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "input 0 is an optional; an optional cannot hold an optional");
    set_container_type(ctx->out[0], KILN_DTYPE_OPTIONAL);
    return KILN_OK;
}

static kiln_status optional_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->n_in > 0 ? ctx->in[0] : NULL;
    if (x && x->dtype == KILN_DTYPE_OPTIONAL)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "input 0 is an optional; an optional cannot hold an optional");
    if (!x && !kiln_node_attr(n, "type"))
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "without an input it needs attribute type");
    kiln_status st = kiln_tensor_container_create(KILN_DTYPE_OPTIONAL, x ? 1 : 0, &ctx->out[0]);
    if (st != KILN_OK || !x) return st;
    kiln_tensor *c;
    if ((st = kiln_tensor_clone(x, &c)) != KILN_OK) return st;
    return kiln_tensor_set_item(ctx->out[0], 0, c);
}

static kiln_status has_infer(struct kiln_infer_ctx *ctx)
{
    if (ctx->out[0]) kiln_type_set(ctx->out[0], KILN_DTYPE_BOOL, 0, NULL);
    return KILN_OK;
}

static kiln_status optional_has_element_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->n_in > 0 ? ctx->in[0] : NULL;
    /* an absent input is an empty optional; a tensor or sequence always has its value */
    bool has = x && (x->dtype != KILN_DTYPE_OPTIONAL || x->dims[0] > 0);
    return kiln_tensor_scalar_i64(KILN_DTYPE_BOOL, has, &ctx->out[0]);
}

static kiln_status get_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *t = ctx->n_in > 0 ? ctx->in[0] : NULL;
    if (!ctx->out[0]) return KILN_OK;
    if (t && t->dtype != KILN_DTYPE_OPTIONAL && t->dtype != KILN_DTYPE_UNDEFINED) *ctx->out[0] = *t;
    else kiln_type_unknown(ctx->out[0]);
    return KILN_OK;
}

static kiln_status optional_get_element_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    if (!x)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "the optional input is absent: it has no value to get");
    if (x->dtype != KILN_DTYPE_OPTIONAL) return kiln_tensor_clone(x, &ctx->out[0]);
    if (x->dims[0] == 0)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "the optional is empty: it has no value to get");
    return kiln_tensor_clone(seq_item(x, 0), &ctx->out[0]);
}

KILN_REF_OP(Optional, optional_infer, optional_run);
KILN_REF_OP(OptionalHasElement, has_infer, optional_has_element_run);
KILN_REF_OP(OptionalGetElement, get_infer, optional_get_element_run);
