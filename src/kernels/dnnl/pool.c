/*
 * pool.c - oneDNN fast kernels for MaxPool, AveragePool, GlobalAveragePool
 * and GlobalMaxPool (float32, 1-D to 3-D windows).
 *
 * The window comes from kiln_window_resolve (the reference's geometry);
 * ceil_mode becomes extra right padding, which oneDNN's max and
 * exclude-padding average ignore. Left to the reference: MaxPool with its
 * Indices output, AveragePool counting pads whose ceil_mode window reaches
 * past the end padding (ONNX does not count that room), other dtypes and
 * empty tensors. Activations may be blocked (nChw8c / nChw16c). MaxPool also
 * takes 8-bit values (a static int8 graph's, src/opt/qadd.c), NCHW or
 * channels-last (KILN_LAYOUT_NHWC: src/opt/layout_nhwc.c). Declared in
 * the pooling family's list (pool.def, family.h).
 */
#include "kernels/dnnl/dnnl_common.h"

#include "kernels/family.h"
#include "kernels/ref/gemm.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/dnnl/pool.def"
#undef KILN_KERNEL

struct pool_build {
    const struct kiln_node *node;
    dnnl_alg_kind_t alg;
    dnnl_memory_desc_t src, dst;
    dnnl_dims_t strides, kernel, dilation, pad_l, pad_r;
};

static kiln_status pool_make(void *arg, struct kd_variant *v, int threads)
{
    struct pool_build *b = arg;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    kiln_status st = KILN_OK;
    dnnl_pooling_v2_desc_t d;
    dnnl_status_t r = dnnl_pooling_v2_forward_desc_init(&d, dnnl_forward_inference, b->alg,
                                                        &b->src, &b->dst, b->strides, b->kernel,
                                                        b->dilation, b->pad_l, b->pad_r);
    if (r == dnnl_success) r = dnnl_primitive_attr_create(&attr);
    if (r == dnnl_success) r = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (r == dnnl_success) r = kd_pd_create(&pd, &d, attr);
    if (r == dnnl_success) {
        st = kd_variant_init(b->node, pd, v);
        if (st == KILN_OK) {
            kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_IN, 0, &b->src);
            kd_variant_arg(v, DNNL_ARG_DST, KD_SRC_OUT, 0, &b->dst);
        }
    }
    (void)threads;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st;
}

static kiln_status pool_run(void *state, struct kiln_run_ctx *ctx)
{
    return kd_exec_run(state, ctx);
}

static void pool_destroy(void *state)
{
    kd_exec_destroy(state);
    free(state);
}

/* An 8-bit MaxPool (a static int8 graph's, src/opt/qadd.c): x and y both uint8 or int8. */
static bool max_pool_8bit(const struct kiln_compile_ctx *cc, const struct kiln_type *x,
                          const struct kiln_type *y)
{
    return cc->node->op == KILN_OP_MaxPool && x->dtype == y->dtype &&
           (x->dtype == KILN_DTYPE_U8 || x->dtype == KILN_DTYPE_I8);
}

/* Every pooling kernel: input 0 and output 0 concrete float32 (or 8-bit, MaxPool). */
bool kiln_k_pool_covers(const struct kiln_compile_ctx *cc)
{
    const struct kiln_type *x = cc->n_in > 0 ? cc->in[0] : NULL;
    const struct kiln_type *y = cc->n_out > 0 ? cc->out[0] : NULL;
    return x && y &&
           ((x->dtype == KILN_DTYPE_F32 && y->dtype == KILN_DTYPE_F32) ||
            max_pool_8bit(cc, x, y)) &&
           kiln_type_is_concrete(x) && kiln_type_is_concrete(y);
}

kiln_status kiln_k_dnnl_pool_compile(const struct kiln_compile_ctx *cc,
                                     struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    const struct kiln_type *x = cc->in[0], *y = cc->n_out > 0 ? cc->out[0] : NULL;
    if (!x || !y) return KILN_OK;
    int q8 = max_pool_8bit(cc, x, y);
    if (!q8 && (x->dtype != KILN_DTYPE_F32 || y->dtype != KILN_DTYPE_F32)) return KILN_OK;
    if (cc->n_out > 1 && cc->out[1]) return KILN_OK; /* MaxPool Indices */
    int rank = x->rank;
    if (rank < 3 || rank > 5 || y->rank != rank) return KILN_OK;
    if (kiln_shape_count(rank, x->dims) <= 0 || kiln_shape_count(rank, y->dims) <= 0)
        return KILN_OK;
    int nsp = rank - 2;
    struct pool_build b;
    memset(&b, 0, sizeof b);
    b.node = n;
    int global = n->op == KILN_OP_GlobalAveragePool || n->op == KILN_OP_GlobalMaxPool;
    if (global) {
        b.alg = n->op == KILN_OP_GlobalMaxPool ? dnnl_pooling_max : dnnl_pooling_avg_exclude_padding;
        for (int i = 0; i < nsp; i++) {
            if (y->dims[i + 2] != 1) return KILN_OK;
            b.kernel[i] = x->dims[i + 2];
            b.strides[i] = 1;
        }
    } else {
        int ceil_mode = kiln_attr_int(n, "ceil_mode", 0) != 0;
        int include_pad = kiln_attr_int(n, "count_include_pad", 0) != 0;
        int64_t so = kiln_attr_int(n, "storage_order", 0);
        struct kiln_window w;
        kiln_status st = kiln_window_resolve(n, nsp, x->dims + 2, NULL, ceil_mode, &w);
        if (kiln_attr_check(n) != KILN_OK || st != KILN_OK || so < 0 || so > 1) {
            kiln_error_clear();
            return KILN_OK; /* the reference reports it */
        }
        b.alg = n->op == KILN_OP_MaxPool ? dnnl_pooling_max
                : include_pad           ? dnnl_pooling_avg_include_padding
                                        : dnnl_pooling_avg_exclude_padding;
        for (int i = 0; i < nsp; i++) {
            if (w.out[i] != y->dims[i + 2]) return KILN_OK;
            int64_t span = (w.kernel[i] - 1) * w.dilation[i] + 1;
            int64_t pr = (w.out[i] - 1) * w.stride[i] + span - w.in[i] - w.pad_begin[i];
            if (pr < w.pad_end[i]) pr = w.pad_end[i];
            if (pr > w.pad_end[i] && b.alg == dnnl_pooling_avg_include_padding) return KILN_OK;
            /* every window must hold an input element */
            if (w.pad_begin[i] >= span || pr >= span) return KILN_OK;
            b.kernel[i] = w.kernel[i];
            b.strides[i] = w.stride[i];
            b.dilation[i] = w.dilation[i] - 1;
            b.pad_l[i] = w.pad_begin[i];
            b.pad_r[i] = pr;
        }
    }
    const int *il = cc->in_layout, *ol = cc->out_layout;
    int lx = il ? il[0] : 0, ly = ol ? ol[0] : 0;
    if (q8 || lx == KILN_LAYOUT_NHWC || ly == KILN_LAYOUT_NHWC) {
        /* 8-bit (exact: max commutes with the monotonic Q/DQ it replaced), NCHW or NHWC */
        dnnl_data_type_t dt = x->dtype == KILN_DTYPE_U8   ? dnnl_u8
                              : x->dtype == KILN_DTYPE_I8 ? dnnl_s8
                                                          : dnnl_f32;
        /* a float GlobalAveragePool may read channels last and write its [N, C, 1, 1] plain */
        int gap_cl = !q8 && n->op == KILN_OP_GlobalAveragePool && lx == KILN_LAYOUT_NHWC && !ly;
        if (rank != 4 || (lx != ly && !gap_cl) || (lx && lx != KILN_LAYOUT_NHWC)) return KILN_OK;
        dnnl_dims_t xd = {x->dims[0], x->dims[1], x->dims[2], x->dims[3]};
        dnnl_dims_t yd = {y->dims[0], y->dims[1], y->dims[2], y->dims[3]};
        if (dnnl_memory_desc_init_by_tag(&b.src, 4, xd, dt, lx ? dnnl_nhwc : dnnl_nchw) !=
                dnnl_success ||
            dnnl_memory_desc_init_by_tag(&b.dst, 4, yd, dt,
                                         ly || (gap_cl && y->dims[2] == 1 && y->dims[3] == 1)
                                             ? dnnl_nhwc /* [N, C, 1, 1]: the same bytes */
                                             : dnnl_nchw) != dnnl_success)
            return KILN_OK;
    } else if (kd_md_act(&b.src, rank, x->dims, lx) != dnnl_success ||
               kd_md_act(&b.dst, rank, y->dims, ly) != dnnl_success) {
        return KILN_OK;
    }
    struct kd_exec *e = calloc(1, sizeof *e);
    if (!e) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    int handled;
    double work = 4.0 * (double)kiln_shape_count(x->rank, x->dims);
    kiln_status st = kd_exec_build(e, kd_work_threads(cc, work), pool_make, &b, &handled);
    if (st != KILN_OK || !handled) {
        free(e);
        return st;
    }
    kd_inst_impl(inst, e);
    inst->name = n->op == KILN_OP_MaxPool           ? "dnnl_max_pool"
                 : n->op == KILN_OP_AveragePool     ? "dnnl_avg_pool"
                 : n->op == KILN_OP_GlobalMaxPool   ? "dnnl_global_max_pool"
                                                    : "dnnl_global_avg_pool";
    inst->state = e;
    inst->run = pool_run;
    inst->destroy = pool_destroy;
    inst->scratch_bytes = kd_exec_scratch(e);
    return KILN_OK;
}

/* Layout pass: X and Y may be blocked, except where the reference must run. */
int kiln_k_dnnl_pool_accepts(const struct kiln_node *n, int i, int block)
{
    if ((block != 8 && block != 16) || i > 0) return 0;
    int ok = 1;
    if (n->op == KILN_OP_MaxPool && n->n_out > 1 && n->out[1] >= 0) ok = 0;
    if (n->op == KILN_OP_AveragePool && kiln_attr_int(n, "ceil_mode", 0) &&
        kiln_attr_int(n, "count_include_pad", 0))
        ok = 0;
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        ok = 0;
    }
    return ok;
}
