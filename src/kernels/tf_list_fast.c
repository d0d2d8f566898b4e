/*
 * tf_list_fast.c - TfListSetItem on plans (a TensorFlow TensorList's SetItem, the
 * write of every Keras recurrent loop that runs as written; src/kernels/ref/tf_list.c
 * is the reference).
 *
 * Taken when the output's type is known at compile time (no "resize": the list keeps
 * its length; its element shape is the item's) and no dim of the list is 0 unless the
 * list is one the item's shape fixes (then its output is zeros with the item in
 * place). The plan may give the output the list's own memory (inplace, input 0): the
 * run then writes only the item, instead of copying the whole list on every
 * iteration; otherwise it copies the list (or zeroes the output) first. The index is
 * checked on every run, with the reference's message. Declared in the copy family's
 * list (simd/copy.def, family.h).
 */
#include <string.h>

#include "core/tensor.h"
#include "kernels/family.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/copy.def"
#undef KILN_KERNEL

struct list_set {
    int fresh; /* the list holds no elements: the output starts as zeros */
};

static kiln_status list_set_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct list_set *ls = state;
    const kiln_tensor *list = ctx->in[0], *index = ctx->in[1], *item = ctx->in[2];
    kiln_tensor *out = ctx->out[0];
    if (!kiln_dtype_is_int(index->dtype) || kiln_tensor_count(index) != 1)
        return kiln_node_error(ctx->node, KILN_ERR_RUNTIME, "the index must be one integer");
    int64_t len = out->dims[0], i = kiln_tensor_i64(index, 0);
    if (i < 0 || i >= len)
        return kiln_node_error(ctx->node, KILN_ERR_RUNTIME,
                               "index %lld is out of range for a list of %lld", (long long)i,
                               (long long)len);
    if (ls->fresh) {
        if (out->nbytes) memset(out->data, 0, out->nbytes);
    } else if (out->data != list->data && out->nbytes) {
        memcpy(out->data, list->data, out->nbytes);
    }
    size_t per = item->nbytes;
    if (per) memcpy((char *)out->data + (size_t)i * per, item->data, per);
    return KILN_OK;
}

kiln_status kiln_k_list_set_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_type *list = cc->in[0], *item = cc->in[2], *out = cc->out[0];
    if (!out || !list || !item || kiln_attr_int(cc->node, "resize", 0) != 0) return KILN_OK;
    if (list->dtype != item->dtype || list->dtype == KILN_DTYPE_STRING || out->dtype != list->dtype ||
        out->rank != item->rank + 1 || list->rank < 1 || out->dims[0] != list->dims[0])
        return KILN_OK;
    for (int d = 0; d < item->rank; d++)
        if (out->dims[d + 1] != item->dims[d]) return KILN_OK;
    bool same = list->rank == out->rank;
    for (int d = 1; same && d < out->rank; d++) same = list->dims[d] == out->dims[d];
    int64_t count = kiln_shape_count(list->rank, list->dims);
    if (!same && count != 0) return KILN_OK; /* the reference's shape error, at run time */
    static const struct list_set fresh = {1}, keep = {0};
    inst->name = "list_set_item";
    inst->state = (void *)(same ? &keep : &fresh);
    inst->run = list_set_run;
    inst->destroy = NULL;
    inst->inplace = same;
    inst->inplace_input = 0;
    return KILN_OK;
}

