/*
 * tf_list.c - reference kernel for TfListSetItem, the one TensorList op
 * that has no ONNX equivalent.
 *
 * The SavedModel importer (src/import/tf_control.c) represents a TensorFlow
 * TensorList as a dense tensor [n, ...element]: TensorListFromTensor is the
 * tensor itself, GetItem a Gather on axis 0, Stack the tensor again. A list
 * made by TensorListReserve whose element shape is not fully known when the
 * graph is loaded (Keras reserves [-1, units]: the batch is unknown) starts
 * as zeros [n, ...] with 0 for each unknown dim, so it holds no elements,
 * and takes its element shape from the first item set into it.
 *
 * TfListSetItem (TensorListSetItem, and TensorListPushBack as a SetItem at
 * the list's length)
 *   inputs  [0] list: [n, ...element], any dtype
 *           [1] index: integer scalar in [0, n) (without "resize")
 *           [2] item: the element, of the list's dtype
 *   attrs   "resize" INT (default 0): an index >= n grows the list to
 *           index + 1 elements, the new ones zeros (TF's
 *           resize_if_index_out_of_bounds, and PushBack).
 *   output  a copy of list with element `index` replaced by item. When the
 *           list holds no elements (a dim is 0) and item's shape differs
 *           from its element shape, the output is zeros [n, ...item.shape]
 *           with item at `index`. Any other shape mismatch, a dtype mismatch
 *           or an index out of range is an error naming the node.
 */
#include <string.h>

#include "core/tensor.h"
#include "kernels/kernel.h"

static kiln_status list_set_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *list = ctx->in[0], *item = ctx->in[2];
    struct kiln_type *out = ctx->out[0];
    if (!out) return KILN_OK;
    kiln_type_unknown(out);
    out->dtype = list->dtype ? list->dtype : item->dtype;
    if (list->dtype && item->dtype && list->dtype != item->dtype)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "item has dtype %s, the list %s", kiln_dtype_name(item->dtype),
                               kiln_dtype_name(list->dtype));
    if (list->rank == 0)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "the list is a scalar");
    if (item->rank >= 0 && item->rank + 1 <= KILN_MAX_RANK) {
        out->rank = item->rank + 1;
        /* "resize" may grow the list: its length is known only at run time */
        out->dims[0] = list->rank >= 1 && !kiln_attr_int(ctx->node, "resize", 0) ? list->dims[0] : -1;
        for (int i = 0; i < item->rank; i++) out->dims[i + 1] = item->dims[i];
    }
    return KILN_OK;
}

static kiln_status list_set_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *list = ctx->in[0], *index = ctx->in[1], *item = ctx->in[2];
    const struct kiln_node *n = ctx->node;
    if (list->dtype != item->dtype)
        return kiln_node_error(n, KILN_ERR_RUNTIME, "item has dtype %s, the list %s",
                               kiln_dtype_name(item->dtype), kiln_dtype_name(list->dtype));
    if (list->rank < 1 || item->rank + 1 > KILN_MAX_RANK)
        return kiln_node_error(n, KILN_ERR_RUNTIME, "the list has rank %d and the item %d",
                               list->rank, item->rank);
    if (!kiln_dtype_is_int(index->dtype) || kiln_tensor_count(index) != 1)
        return kiln_node_error(n, KILN_ERR_RUNTIME, "the index must be one integer");
    int64_t len = list->dims[0], i = kiln_tensor_i64(index, 0);
    bool resize = kiln_attr_int(n, "resize", 0) != 0;
    int64_t new_len = resize && i >= len ? i + 1 : len;
    if (i < 0 || i >= new_len)
        return kiln_node_error(n, KILN_ERR_RUNTIME, "index %lld is out of range for a list of %lld",
                               (long long)i, (long long)len);
    bool same = list->rank == item->rank + 1;
    for (int d = 0; same && d < item->rank; d++) same = list->dims[d + 1] == item->dims[d];
    kiln_status st;
    if (same && new_len == len) {
        st = kiln_tensor_clone(list, &ctx->out[0]);
    } else if (same || kiln_tensor_count(list) == 0) {
        int64_t dims[KILN_MAX_RANK];
        dims[0] = new_len;
        for (int d = 0; d < item->rank; d++) dims[d + 1] = item->dims[d];
        if (kiln_shape_count(item->rank + 1, dims) < 0)
            return kiln_node_error(n, KILN_ERR_RUNTIME, "a list of %lld such items is too large",
                                   (long long)new_len);
        st = kiln_tensor_new(list->dtype, item->rank + 1, dims, &ctx->out[0]);
        if (st == KILN_OK && same && kiln_tensor_count(list) > 0) /* grown: keep the old ones */
            st = kiln_tensor_copy_elems(ctx->out[0], 0, list, 0, kiln_tensor_count(list));
        if (st != KILN_OK) {
            kiln_tensor_free(ctx->out[0]);
            ctx->out[0] = NULL;
            return st;
        }
    } else {
        char a[96], b[96];
        return kiln_node_error(n, KILN_ERR_RUNTIME, "item of shape %s does not fit a list of shape %s",
                               kiln_shape_str(item->rank, item->dims, a, sizeof a),
                               kiln_shape_str(list->rank, list->dims, b, sizeof b));
    }
    if (st != KILN_OK) return st;
    int64_t per = kiln_tensor_count(item);
    st = kiln_tensor_copy_elems(ctx->out[0], i * per, item, 0, per);
    if (st != KILN_OK) {
        kiln_tensor_free(ctx->out[0]);
        ctx->out[0] = NULL;
    }
    return st;
}

KILN_REF_OP(TfListSetItem, list_set_infer, list_set_run);
