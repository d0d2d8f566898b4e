/*
 * deconv.c - oneDNN fast kernel for ConvTranspose (float32): oneDNN's
 * deconvolution primitive, the one entry of the deconv family (deconv.def).
 *
 * 1-D, 2-D or 3-D; any group count; strides, dilations, pads, auto_pad,
 * output_padding and output_shape (the geometry is the reference kernel's,
 * kiln_convt_window in ref/conv.c: output size and begin pads; the end pads
 * follow from the output size and may be negative where output_padding
 * adds rows the input never reaches, which oneDNN takes); the bias fused,
 * and for KilnFusedConvTranspose (opt/fuse_act.c) the activation as
 * eltwise post-ops.
 * ONNX's weights are [C, M/group, k...] (input channels first); oneDNN's
 * logical order is [group][M/group][C/group][k...], so the constant weights
 * are described by strides and reordered once into the format oneDNN picks
 * (weights that are graph inputs, as in the ONNX node tests, are read in
 * place through the strided descriptor).
 * Activations are plain or, where the layout pass blocked them (2-D only),
 * nChw8c / nChw16c: with blocked data oneDNN runs its JIT deconvolution
 * instead of a GEMM and col2im over plain data. Anything else (other dtypes, empty
 * tensors, a shape oneDNN declines) stays on the reference kernel.
 */
#include "kernels/dnnl/deconv.h"
#include "kernels/dnnl/dnnl_common.h"
#include "kernels/family.h"

#include "kernels/ref/gemm.h"

struct deconv_build {
    const struct kiln_compile_ctx *cc;
    dnnl_memory_desc_t src, wany, wsrc, bias, dst;
    int has_bias;
    int w_const;    /* constant weights: packed once; else read in place (strided) */
    int post_act;   /* kd_deferred_activation: no activation post-op, Kiln applies it */
    dnnl_dims_t strides, dilates, pad_l, pad_r;
};

struct deconv_state {
    struct kd_exec e;
    int post_act;     /* kd_deferred_activation, applied to Y after oneDNN, or 0 */
    size_t dst_bytes; /* Y in its layout */
};

static kiln_status deconv_make(void *arg, struct kd_variant *v, int threads)
{
    struct deconv_build *b = arg;
    const struct kiln_node *n = b->cc->node;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    kiln_status st = KILN_OK;
    dnnl_deconvolution_desc_t dd;
    dnnl_status_t r = dnnl_dilated_deconvolution_forward_desc_init(
        &dd, dnnl_forward_inference, dnnl_deconvolution_direct, &b->src, &b->wany,
        b->has_bias ? &b->bias : NULL, &b->dst, b->strides, b->dilates, b->pad_l, b->pad_r);
    if (r == dnnl_success) r = dnnl_primitive_attr_create(&attr);
    if (r == dnnl_success) r = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (r == dnnl_success) r = dnnl_post_ops_create(&po);
    if (r == dnnl_success && !b->post_act && !kd_append_activation(n, po))
        r = dnnl_unimplemented;
    if (r == dnnl_success) r = dnnl_primitive_attr_set_post_ops(attr, po);
    if (r == dnnl_success) r = kd_pd_create(&pd, &dd, attr);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (r != dnnl_success) return KILN_OK; /* the reference runs it */
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (b->w_const) {
        st = kd_pack_weights(b->cc, b->cc->in_value[1], "deconv", &b->wsrc, wmd, 1.0f,
                             &v->packed);
        if (st != KILN_OK || !v->packed) goto out;
    }
    st = kd_variant_init(n, pd, v);
    if (st != KILN_OK) goto out;
    kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_IN, 0, &b->src);
    kd_variant_arg(v, DNNL_ARG_WEIGHTS, b->w_const ? KD_SRC_PACKED : KD_SRC_IN, 1, wmd);
    if (b->has_bias) kd_variant_arg(v, DNNL_ARG_BIAS, KD_SRC_IN, 2, &b->bias);
    kd_variant_arg(v, DNNL_ARG_DST, KD_SRC_OUT, 0, &b->dst);
out:
    (void)threads;
    dnnl_primitive_desc_destroy(pd);
    return st;
}

static kiln_status deconv_run(void *state, struct kiln_run_ctx *ctx)
{
    struct deconv_state *s = state;
    kiln_status st = kd_exec_run(&s->e, ctx);
    if (st == KILN_OK && s->post_act)
        kd_apply_activation(s->post_act, ctx->out[0]->data, s->dst_bytes / sizeof(float),
                            ctx->threads);
    return st;
}

static void deconv_destroy(void *state)
{
    struct deconv_state *s = state;
    kd_exec_destroy(&s->e);
    free(s);
}

/* The fused node's activation is one oneDNN has (a plain ConvTranspose has none). */
static int act_ok(const struct kiln_node *n)
{
    dnnl_post_ops_t po;
    if (dnnl_post_ops_create(&po) != dnnl_success) return 0;
    int ok = kd_append_activation(n, po);
    dnnl_post_ops_destroy(po);
    if (kiln_attr_check(n) != KILN_OK) { /* reported again when the node runs */
        kiln_error_clear();
        ok = 0;
    }
    return ok;
}

static int is_f32(const struct kiln_type *t) { return t && t->dtype == KILN_DTYPE_F32; }

bool kd_deconv_node_ok(const struct kiln_compile_ctx *cc, int64_t *group_out, int64_t *out,
                       int64_t *pb, int64_t *stride, int64_t *dil)
{
    const struct kiln_node *n = cc->node;
    if (cc->n_in < 2) return false;
    const struct kiln_type *x = cc->in[0], *w = cc->in[1], *y = cc->n_out > 0 ? cc->out[0] : NULL;
    const struct kiln_type *bias = cc->n_in > 2 ? cc->in[2] : NULL;
    if (!is_f32(x) || !is_f32(w) || !is_f32(y)) return false;
    if (n->op == KILN_OP_KilnFusedConvTranspose && !act_ok(n)) return false;
    for (int i = 1; i < cc->n_in; i++)
        if (cc->in_layout && cc->in_layout[i]) return false;
    int rank = x->rank;
    if (rank < 3 || rank > 5 || w->rank != rank || y->rank != rank) return false;
    if (kiln_shape_count(rank, x->dims) <= 0 || kiln_shape_count(rank, y->dims) <= 0 ||
        kiln_shape_count(rank, w->dims) <= 0)
        return false;
    int64_t group = kiln_attr_int(n, "group", 1);
    if (kiln_attr_check(n) != KILN_OK) { /* wrongly typed attributes: the reference reports */
        kiln_error_clear();
        return false;
    }
    const int64_t C = x->dims[1], M = y->dims[1];
    if (group < 1 || C % group || w->dims[0] != C || w->dims[1] * group != M) return false;
    if (bias && (!is_f32(bias) || bias->rank != 1 || bias->dims[0] != M)) return false;
    const int nsp = rank - 2;
    if (kiln_convt_window(n, nsp, x->dims + 2, w->dims + 2, out, pb, stride, dil) != KILN_OK) {
        kiln_attr_check(n);
        kiln_error_clear();
        return false; /* the reference reports it */
    }
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    for (int i = 0; i < nsp; i++)
        if (out[i] != y->dims[i + 2]) return false;
    *group_out = group;
    return true;
}

static kiln_status deconv_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    int64_t group, out[KILN_MAX_RANK], pb[KILN_MAX_RANK], stride[KILN_MAX_RANK],
        dil[KILN_MAX_RANK];
    if (!kd_deconv_node_ok(cc, &group, out, pb, stride, dil)) return KILN_OK;
    const struct kiln_type *x = cc->in[0], *w = cc->in[1], *y = cc->out[0];
    const struct kiln_type *bias = cc->n_in > 2 ? cc->in[2] : NULL;
    const int in_l = cc->in_layout ? cc->in_layout[0] : 0;
    const int out_l = cc->out_layout ? cc->out_layout[0] : 0;
    const int rank = x->rank, nsp = rank - 2;
    const int64_t C = x->dims[1];
    struct deconv_build b;
    memset(&b, 0, sizeof b);
    b.cc = cc;
    b.has_bias = bias != NULL;
    b.w_const = cc->in_value && cc->in_value[1];
    for (int i = 0; i < nsp; i++) {
        int64_t reach = stride[i] * (x->dims[i + 2] - 1) + (w->dims[i + 2] - 1) * dil[i] + 1;
        b.strides[i] = stride[i];
        b.dilates[i] = dil[i] - 1;
        b.pad_l[i] = pb[i];
        b.pad_r[i] = reach - pb[i] - out[i];
    }
    if (kd_md_act(&b.src, rank, x->dims, in_l) != dnnl_success ||
        kd_md_act(&b.dst, rank, y->dims, out_l) != dnnl_success)
        return KILN_OK;
    if (bias && kd_md_plain(&b.bias, 1, bias->dims) != dnnl_success) return KILN_OK;
    /* weights: logical [g][M/g][C/g][k...] (the group dim only when group > 1) over ONNX's
     * [C][M/g][k...] */
    const int64_t cg = C / group, mg = w->dims[1];
    int64_t ksize = 1;
    for (int i = 2; i < rank; i++) ksize *= w->dims[i];
    dnnl_dims_t wd, ws;
    int wr = 0;
    if (group > 1) {
        wd[wr] = group;
        ws[wr++] = cg * mg * ksize;
    }
    wd[wr] = mg;
    ws[wr++] = ksize;
    wd[wr] = cg;
    ws[wr++] = mg * ksize;
    for (int i = 2; i < rank; i++) {
        int64_t inner = 1;
        for (int k = i + 1; k < rank; k++) inner *= w->dims[k];
        wd[wr] = w->dims[i];
        ws[wr++] = inner;
    }
    if (dnnl_memory_desc_init_by_strides(&b.wsrc, wr, wd, dnnl_f32, ws) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&b.wany, wr, wd, dnnl_f32, dnnl_format_tag_any) !=
            dnnl_success)
        return KILN_OK;
    if (!b.w_const) b.wany = b.wsrc; /* weights of each run, read where they are */

    if (n->op == KILN_OP_KilnFusedConvTranspose) b.post_act = kd_deferred_activation(n);
    struct deconv_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    int handled;
    double work = 2.0 * (double)kiln_shape_count(x->rank, x->dims) * (double)mg * (double)ksize;
    kiln_status st = kd_exec_build(&s->e, kd_work_threads(cc, work), deconv_make, &b, &handled);
    if (st != KILN_OK || !handled) {
        free(s);
        return st;
    }
    s->post_act = b.post_act;
    s->dst_bytes = dnnl_memory_desc_get_size(&b.dst);
    inst->name = n->op == KILN_OP_KilnFusedConvTranspose ? "dnnl_fused_deconv" : "dnnl_deconv";
    kd_inst_impl(inst, &s->e);
    inst->state = s;
    inst->run = deconv_run;
    inst->destroy = deconv_destroy;
    inst->scratch_bytes = kd_exec_scratch(&s->e);
    if (b.w_const) inst->packed = 1u << 1; /* every variant runs on the packed weights */
    return KILN_OK;
}

/* The family (deconv.def): oneDNN's deconvolution, the one entry of each op. */
#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/dnnl/deconv.def"
#undef KILN_KERNEL

bool kiln_k_dnnl_deconv_covers(const struct kiln_compile_ctx *cc)
{
    int64_t group, out[KILN_MAX_RANK], pb[KILN_MAX_RANK], stride[KILN_MAX_RANK],
        dil[KILN_MAX_RANK];
    return kd_deconv_node_ok(cc, &group, out, pb, stride, dil);
}

kiln_status kiln_k_dnnl_deconv_compile(const struct kiln_compile_ctx *cc,
                                       struct kiln_kernel_inst *inst)
{
    return deconv_compile(cc, inst);
}

/* Layout pass: X and Y may be blocked (4-D, constant weights: the pass checks). */
int kiln_k_dnnl_deconv_accepts(const struct kiln_node *n, int i, int block)
{
    if (n->op == KILN_OP_KilnFusedConvTranspose && !act_ok(n)) return 0;
    return (block == 8 || block == 16) && (i == 0 || i == -1);
}
