/*
 * reorder.c - oneDNN fast kernel for KilnReorder: a 4-D float32 value
 * between plain NCHW and channel-blocked nChw8c / nChw16c storage (the
 * padded channels of a blocked output are written as zeros), or a 4-D
 * float32 or 8-bit value between NCHW and channels-last NHWC (layout 1,
 * int8 convolution chains: src/opt/layout_nhwc.c). The source
 * layout is the input value's, the target the output value's (which the
 * layout pass also records in the node's `to` attribute).
 *
 * kd_reorder_exec_build makes the same primitive between any two memory
 * descriptors as an exec of its own, for kernels that reorder at their
 * edges (conv.c runs a convolution whose plain-layout implementation is a
 * fallback in the format oneDNN prefers, with a reorder on each side).
 * Declared in the copy family's list (simd/copy.def, family.h).
 */
#include "kernels/dnnl/dnnl_common.h"
#include "kernels/family.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/copy.def"
#undef KILN_KERNEL

struct reorder_build {
    const struct kiln_node *node;
    dnnl_memory_desc_t src, dst;
    enum kd_src from, to;  /* where the source and destination live */
    int from_index, to_index;
};

static kiln_status reorder_make(void *arg, struct kd_variant *v, int threads)
{
    struct reorder_build *b = arg;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    kiln_status st = KILN_OK;
    dnnl_engine_t eng = kd_engine();
    dnnl_status_t r = dnnl_primitive_attr_create(&attr);
    if (r == dnnl_success) r = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (r == dnnl_success) r = dnnl_reorder_primitive_desc_create(&pd, &b->src, eng, &b->dst, eng, attr);
    if (r == dnnl_success) {
        st = kd_variant_init(b->node, pd, v);
        if (st == KILN_OK) {
            kd_variant_arg(v, DNNL_ARG_FROM, b->from, b->from_index, &b->src);
            kd_variant_arg(v, DNNL_ARG_TO, b->to, b->to_index, &b->dst);
        }
    }
    (void)threads;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st;
}

static kiln_status reorder_run(void *state, struct kiln_run_ctx *ctx)
{
    return kd_exec_run(state, ctx);
}

static void reorder_destroy(void *state)
{
    kd_exec_destroy(state);
    free(state);
}

kiln_status kiln_k_reorder_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    const struct kiln_type *x = cc->in[0], *y = cc->n_out > 0 ? cc->out[0] : NULL;
    if (!x || !y || x->dtype != y->dtype || x->rank != 4 || y->rank != 4 ||
        kiln_shape_count(4, x->dims) <= 0)
        return KILN_OK;
    for (int i = 0; i < 4; i++)
        if (x->dims[i] != y->dims[i]) return KILN_OK;
    int from = cc->in_layout ? cc->in_layout[0] : 0;
    int to = cc->out_layout ? cc->out_layout[0] : 0;
    struct reorder_build b = {.node = n, .from = KD_SRC_IN, .to = KD_SRC_OUT};
    if (from == KILN_LAYOUT_NHWC || to == KILN_LAYOUT_NHWC) {
        dnnl_data_type_t dt = x->dtype == KILN_DTYPE_F32  ? dnnl_f32
                              : x->dtype == KILN_DTYPE_U8 ? dnnl_u8
                              : x->dtype == KILN_DTYPE_I8 ? dnnl_s8
                                                          : dnnl_data_type_undef;
        if (dt == dnnl_data_type_undef || (from && from != KILN_LAYOUT_NHWC) ||
            (to && to != KILN_LAYOUT_NHWC))
            return KILN_OK;
        dnnl_dims_t d = {x->dims[0], x->dims[1], x->dims[2], x->dims[3]};
        if (dnnl_memory_desc_init_by_tag(&b.src, 4, d, dt, from ? dnnl_nhwc : dnnl_nchw) !=
                dnnl_success ||
            dnnl_memory_desc_init_by_tag(&b.dst, 4, d, dt, to ? dnnl_nhwc : dnnl_nchw) !=
                dnnl_success)
            return KILN_OK;
    } else if (x->dtype != KILN_DTYPE_F32 || kd_md_act(&b.src, 4, x->dims, from) != dnnl_success ||
               kd_md_act(&b.dst, 4, y->dims, to) != dnnl_success) {
        return KILN_OK;
    }
    struct kd_exec *e = calloc(1, sizeof *e);
    if (!e) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    int handled;
    double work = 4.0 * (double)kiln_shape_count(4, x->dims);
    kiln_status st = kd_exec_build(e, kd_work_threads(cc, work), reorder_make, &b, &handled);
    if (st != KILN_OK || !handled) {
        free(e);
        return st;
    }
    inst->name = "dnnl_reorder";
    kd_inst_impl(inst, e);
    inst->state = e;
    inst->run = reorder_run;
    inst->destroy = reorder_destroy;
    inst->scratch_bytes = kd_exec_scratch(e);
    return KILN_OK;
}

kiln_status kd_reorder_exec_build(const struct kiln_compile_ctx *cc, const dnnl_memory_desc_t *src,
                                  enum kd_src from, int from_index, const dnnl_memory_desc_t *dst,
                                  enum kd_src to, int to_index, struct kd_exec *e, int *handled)
{
    struct reorder_build b = {.node = cc->node, .src = *src, .dst = *dst, .from = from,
                              .to = to, .from_index = from_index, .to_index = to_index};
    double work = 4.0 * (double)dnnl_memory_desc_get_size(src) / sizeof(float);
    return kd_exec_build(e, kd_work_threads(cc, work), reorder_make, &b, handled);
}

