/*
 * layout.c - reference kernel for KilnReorder (opt/opt.h): a 4-D value
 * between plain NCHW storage and channel-blocked storage
 * [N][ceil(C/b)][H][W][b] (b = 8 or 16, padded channels zero) or channels-last
 * storage [N][H][W][C] (layout 1: one block of all C channels), as the
 * layout pass lays out values between blocked kernels (graph.h).
 *
 * The run context carries no value layouts, so the node says both sides:
 * `from` (the input value's layout, written by the layout pass) and `to`.
 * A blocked tensor keeps its logical NCHW dims; its storage must hold the
 * padded channels (the plan allocates it so). Any dtype is moved as bytes.
 */
#include "kernels/kernel.h"

/* A layout attribute: 0, 1 (KILN_LAYOUT_NHWC), 8 or 16. */
static kiln_status layout_attr(const struct kiln_node *n, const char *name, int *out)
{
    int64_t v = kiln_attr_int(n, name, 0);
    if (v != 0 && v != KILN_LAYOUT_NHWC && v != 8 && v != 16)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "%s is %lld, expected 0, 1, 8 or 16", name,
                               (long long)v);
    *out = (int)v;
    return KILN_OK;
}

static kiln_status reorder_infer(struct kiln_infer_ctx *ctx)
{
    int from = 0, to = 0;
    kiln_status st = layout_attr(ctx->node, "from", &from);
    if (st == KILN_OK) st = layout_attr(ctx->node, "to", &to);
    if (st != KILN_OK) return st;
    const struct kiln_type *x = ctx->in[0];
    if (x && x->rank >= 0 && x->rank != 4 && (from || to))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "a blocked value must have rank 4, got rank %d", x->rank);
    return kiln_infer_same(ctx);
}

/* Bytes a value of dims d (rank 4) takes in layout `layout`. */
static int64_t storage_bytes(const int64_t *d, int layout, size_t es)
{
    return d[0] * kiln_layout_channels(d[1], layout) * d[2] * d[3] * (int64_t)es;
}

static kiln_status reorder_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    int from = 0, to = 0;
    kiln_status st = layout_attr(n, "from", &from);
    if (st == KILN_OK) st = layout_attr(n, "to", &to);
    if (st != KILN_OK) return st;
    if (x->dtype == KILN_DTYPE_STRING)
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "string values cannot be reordered");
    size_t es = kiln_dtype_size(x->dtype);
    if (!from && !to) return kiln_tensor_copy_elems(y, 0, x, 0, kiln_tensor_count(x));
    if (x->rank != 4)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "a blocked value must have rank 4, got rank %d", x->rank);
    const int64_t *d = x->dims;
    if ((int64_t)x->nbytes < storage_bytes(d, from, es) ||
        (int64_t)y->nbytes < storage_bytes(d, to, es))
        return kiln_node_error(n, KILN_ERR_INTERNAL,
                               "storage of %zu / %zu bytes is too small for layouts %d -> %d",
                               x->nbytes, y->nbytes, from, to);
    int64_t N = d[0], C = d[1], HW = d[2] * d[3];
    /* channels last is one block of all C channels */
    if (from == KILN_LAYOUT_NHWC) from = C > 0 ? (int)C : 1;
    if (to == KILN_LAYOUT_NHWC) to = C > 0 ? (int)C : 1;
    if (to) memset(y->data, 0, (size_t)storage_bytes(d, to, es)); /* padded channels */
    const char *src = x->data;
    char *dst = y->data;
    int64_t cf = from ? (C + from - 1) / from * from : C, ct = to ? (C + to - 1) / to * to : C;
    for (int64_t b = 0; b < N; b++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t p = 0; p < HW; p++) {
                /* element offsets of (b, c, p) in each layout */
                int64_t si = from ? ((b * cf / from + c / from) * HW + p) * from + c % from
                                  : (b * C + c) * HW + p;
                int64_t di = to ? ((b * ct / to + c / to) * HW + p) * to + c % to
                                : (b * C + c) * HW + p;
                memcpy(dst + di * (int64_t)es, src + si * (int64_t)es, es);
            }
    return KILN_OK;
}

KILN_REF_OP(KilnReorder, reorder_infer, reorder_run);
