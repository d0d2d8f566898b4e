/*
 * conv_split.c - a 1x1 convolution of one image with few output pixels and a
 * large weight, split by output channels over the run's threads: one oneDNN
 * convolution per half of the output channels, each on one thread.
 *
 * Why: oneDNN 2.7's AVX2 1x1 convolution (jit_1x1:avx2) parallelizes over
 * the batch and blocks of output pixels only, and loops over every output
 * channel block inside each. On a 2x2 or 4x4 image at batch 1 that is one
 * unit of work, so a second thread does nothing, and the convolution, which
 * is bound by reading its weight (2048 x 1024 floats: 8 MB read for 16.8
 * MFLOP), reads it on one core: resnext50's last stage at batch 1 took the
 * same 0.45-0.53 ms per convolution on one thread and on two, where ONNX
 * Runtime's GEMM went from 0.35 to 0.18 ms (2048 -> 1024 on 2x2). Its
 * direct kernel (jit:avx2, the next implementation) splits by channels but
 * ran 3x slower, and Kiln's skinny product streams the weight at 11 GB/s
 * against oneDNN's 17 on one core. Here each thread reads its half of the
 * weight with oneDNN's own 1x1 kernel.
 *
 * Each half is an ordinary oneDNN convolution of X into its channels of Y
 * (for one image, in any layout where the half is a multiple of Y's channel
 * block, a dense tensor of its own, half Y's bytes in: kd_variant_arg_at; as a
 * submemory of Y oneDNN offered only its reference code on 2x2 images) with
 * its half of the weight (packed through the weight cache under its own name)
 * and of the bias, and the activation as its post-op, or applied over Y after
 * both where kd_deferred_activation says so. A residual Sum is added over Y
 * after both halves and the activation applied after it, by the SIMD table
 * (with Sum as a sum post-op the halves got the reference code too). The
 * halves run in one parallel region of two threads; a run granted one thread
 * runs them one after the other, as fast as one convolution.
 *
 * Taken below AVX-512 (whose 1x1 kernel splits output channels itself) for
 * Conv and KilnFusedConv of float32, 2-D, one group, batch 1, a 1x1 kernel, at
 * most SPLIT_MAX_PIXELS output pixels, a weight of at least SPLIT_MIN_WEIGHT
 * bytes, and output channels a multiple of the channel block, at least two blocks
 * (halves of whole blocks, the first one block larger where their count is odd).
 * KILN_CONV_SPLIT=0 in the environment turns it off.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "kernels/dnnl/conv.h"
#include "kernels/dnnl/dnnl_common.h"
#include "kernels/family.h"
#include "kernels/simd/pointwise.h"
#include "kernels/simd/simd.h"

#define SPLIT_MAX_PIXELS 16
#define SPLIT_MIN_WEIGHT (512 * 1024)

struct split_state {
    struct kd_exec half[2];
    int has_sum;            /* Y = act(Y + Sum) after the halves (see split_compile) */
    const struct simd_kernels *k;
    int has_act;
    enum simd_unary act;
    float act_alpha, act_beta;
    int post_act;
    size_t dst_bytes;
    size_t sum_at;          /* scratch copy of a Sum that shares Y's memory */
    size_t scratch_total;
};

struct split_build {
    const struct kiln_compile_ctx *cc;
    dnnl_memory_desc_t src, wany, wplain, bias, dst;
    int has_bias, no_act, post_act;
    dnnl_dims_t strides, dilates, pad_l, pad_r;
    const float *wdata;             /* the half's rows of the weight */
    size_t y_off, b_off;            /* the half's bytes into Y and into the bias */
    char what[32];
};

/* The shapes this kernel takes (the section comment). */
static bool split_geometry(const struct kiln_compile_ctx *cc, struct kiln_window *win)
{
    int64_t group;
    const char *env = getenv("KILN_CONV_SPLIT");
    if (kiln_cpu_isa() >= KILN_ISA_AVX512 || (env && !strcmp(env, "0"))) return false;
    if (!kd_conv_node_ok(cc, &group, win) || group != 1) return false;
    const struct kiln_type *x = cc->in[0], *w = cc->in[1], *y = cc->out[0];
    if (x->rank != 4 || x->dims[0] != 1 || w->dims[2] != 1 || w->dims[3] != 1) return false;
    if (win->out[0] != y->dims[2] || win->out[1] != y->dims[3]) return false;
    if (y->dims[2] * y->dims[3] > SPLIT_MAX_PIXELS) return false;
    if ((double)w->dims[0] * (double)w->dims[1] * sizeof(float) < SPLIT_MIN_WEIGHT) return false;
    int lx = kd_layout_of(cc->in_layout, 0), ly = kd_layout_of(cc->out_layout, 0);
    if ((lx && lx != 8 && lx != 16) || (ly && ly != 8 && ly != 16)) return false;
    int64_t blk = ly ? ly : 1;
    return w->dims[0] % blk == 0 && w->dims[0] >= 2 * blk;
}

static kiln_status split_make(void *arg, struct kd_variant *v, int threads)
{
    struct split_build *b = arg;
    const struct kiln_node *n = b->cc->node;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_convolution_desc_t cd;
    kiln_status st = KILN_OK;
    (void)threads;
    dnnl_status_t r = dnnl_dilated_convolution_forward_desc_init(
        &cd, dnnl_forward_inference, dnnl_convolution_direct, &b->src, &b->wany,
        b->has_bias ? &b->bias : NULL, &b->dst, b->strides, b->dilates, b->pad_l, b->pad_r);
    if (r == dnnl_success) r = dnnl_primitive_attr_create(&attr);
    if (r == dnnl_success) r = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (r == dnnl_success) r = dnnl_post_ops_create(&po);
    if (r == dnnl_success && !b->no_act && !b->post_act && !kd_append_activation(n, po))
        r = dnnl_unimplemented;
    if (r == dnnl_success) r = dnnl_primitive_attr_set_post_ops(attr, po);
    if (r == dnnl_success) r = kd_pd_create(&pd, &cd, attr);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (r != dnnl_success) return KILN_OK; /* declined: dnnl/conv.c runs the node */
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
        !impl || !strstr(impl, "jit_1x1"))
        goto out; /* the case this kernel was measured on only */
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    st = kd_pack_weights_from(b->cc, b->cc->in_value[1], b->wdata, b->what, &b->wplain, wmd,
                              1.0f, &v->packed);
    if (st != KILN_OK || !v->packed) goto out;
    st = kd_variant_init(n, pd, v);
    if (st != KILN_OK) goto out;
    kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_IN, 0, &b->src);
    kd_variant_arg(v, DNNL_ARG_WEIGHTS, KD_SRC_PACKED, 1, wmd);
    if (b->has_bias) kd_variant_arg_at(v, DNNL_ARG_BIAS, KD_SRC_IN, 2, b->b_off, &b->bias);
    kd_variant_arg_at(v, DNNL_ARG_DST, KD_SRC_OUT, 0, b->y_off, &b->dst);
out:
    dnnl_primitive_desc_destroy(pd);
    return st;
}

struct split_job {
    struct split_state *s;
    struct kiln_run_ctx *ctx;
    kiln_status st[2];
};

static void split_team(void *arg, int tid, int nt)
{
    struct split_job *j = arg;
    struct kiln_run_ctx c = *j->ctx;
    c.threads = 1;
    for (int h = tid; h < 2; h += nt) j->st[h] = kd_exec_run(&j->s->half[h], &c);
}

static kiln_status split_run(void *state, struct kiln_run_ctx *ctx)
{
    struct split_state *s = state;
    struct kiln_run_ctx c2 = *ctx;
    void *heap = NULL;
    if (!c2.scratch && s->scratch_total) { /* callers without a plan arena */
        heap = c2.scratch = aligned_alloc(64, s->scratch_total);
        if (!heap) return kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY, "out of memory for scratch");
    }
    const float *sum = s->has_sum ? ctx->in[3]->data : NULL;
    if (sum && sum == ctx->out[0]->data) { /* the halves write over it */
        float *copy = (float *)((char *)c2.scratch + s->sum_at);
        memcpy(copy, sum, s->dst_bytes);
        sum = copy;
    }
    struct split_job j = {s, &c2, {KILN_OK, KILN_OK}};
    kiln_parallel_team(ctx->threads < 2 ? 1 : 2, split_team, &j);
    kiln_status st = j.st[0] != KILN_OK ? j.st[0] : j.st[1];
    if (st == KILN_OK && sum) { /* no padding channels: M is a multiple of the block */
        float *y = ctx->out[0]->data;
        int64_t count = (int64_t)(s->dst_bytes / sizeof(float));
        s->k->binary(SIMD_ADD, SIMD_B_VEC, y, sum, y, count);
        if (s->has_act) s->k->unary(s->act, s->act_alpha, s->act_beta, y, y, count);
    }
    if (st == KILN_OK && s->post_act)
        kd_apply_activation(s->post_act, ctx->out[0]->data, s->dst_bytes / sizeof(float),
                            ctx->threads);
    free(heap);
    return st;
}

static void split_destroy(void *state)
{
    struct split_state *s = state;
    kd_exec_destroy(&s->half[0]);
    kd_exec_destroy(&s->half[1]);
    free(s);
}

static kiln_status split_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    struct kiln_window win;
    if (!split_geometry(cc, &win)) return KILN_OK;
    const struct kiln_node *n = cc->node;
    const struct kiln_type *x = cc->in[0], *w = cc->in[1], *y = cc->out[0];
    int fused = n->op == KILN_OP_KilnFusedConv;
    int lx = kd_layout_of(cc->in_layout, 0), ly = kd_layout_of(cc->out_layout, 0);
    /* the halves: whole channel blocks, the first one block more where their count is odd
     * (regnet_y_400mf's 440 channels: 224 and 216) */
    const int64_t blk = ly ? ly : 1, M = w->dims[0], C = w->dims[1];
    const int64_t m0 = (M / blk + 1) / 2 * blk, mh[2] = {m0, M - m0}, at[2] = {0, m0};
    struct split_build b;
    memset(&b, 0, sizeof b);
    b.cc = cc;
    b.has_bias = cc->n_in > 2 && cc->in[2] != NULL;
    /* A residual Sum is added after the halves, and the activation after it (with the Sum
     * as oneDNN's sum post-op into a submemory of Y, oneDNN offers only its reference
     * code); the activation then has to be one of the SIMD table's. */
    int has_sum = fused && cc->n_in > 3 && cc->in[3] != NULL;
    int has_act = 0;
    enum simd_unary act = SIMD_RELU;
    float act_alpha = 0, act_beta = 0;
    if (has_sum && !kiln_simd_fused_activation(n, &has_act, &act, &act_alpha, &act_beta))
        return KILN_OK;
    b.no_act = has_sum;
    b.post_act = fused && !has_sum ? kd_deferred_activation(n) : 0;
    for (int i = 0; i < 2; i++) {
        b.strides[i] = win.stride[i];
        b.dilates[i] = win.dilation[i] - 1;
        b.pad_l[i] = win.pad_begin[i];
        b.pad_r[i] = win.pad_end[i];
    }
    dnnl_memory_desc_t yfull;
    if (kd_md_act(&b.src, 4, x->dims, lx) != dnnl_success ||
        kd_md_act(&yfull, 4, y->dims, ly) != dnnl_success)
        return KILN_OK;
    struct split_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    /* the halves are packed from their rows of the weight: its data must be here (a plan
     * that packed it before may have let the cache release the copy) */
    kiln_status ast = cc->weights ? kiln_weight_cache_acquire(cc->weights, cc->in_value[1], 0)
                                  : KILN_OK;
    if (ast != KILN_OK) {
        free(s);
        return ast;
    }
    const float *wdata = cc->in_value[1]->data;
    if (!wdata) {
        free(s);
        return KILN_OK;
    }
    size_t base = 0;
    int built = 0;
    kiln_status st = KILN_OK;
    for (int h = 0; h < 2 && st == KILN_OK; h++) {
        /* for one image, each half of Y's channels is a dense tensor of its own in Y's layout
         * (whole blocks), its first channel's bytes in */
        dnnl_dims_t wd = {mh[h], C, 1, 1}, yd = {1, mh[h], y->dims[2], y->dims[3]}, bd = {mh[h]};
        if (kd_md_act(&b.dst, 4, (const int64_t *)yd, ly) != dnnl_success ||
            dnnl_memory_desc_init_by_tag(&b.bias, 1, bd, dnnl_f32, dnnl_a) != dnnl_success ||
            dnnl_memory_desc_init_by_tag(&b.wany, 4, wd, dnnl_f32, dnnl_format_tag_any) !=
                dnnl_success ||
            kd_md_plain(&b.wplain, 4, (const int64_t *)wd) != dnnl_success)
            break;
        b.y_off = (size_t)(at[h] * y->dims[2] * y->dims[3]) * sizeof(float);
        b.b_off = (size_t)at[h] * sizeof(float);
        b.wdata = wdata + (size_t)(at[h] * C);
        snprintf(b.what, sizeof b.what, "conv_split%d", h);
        int handled = 0;
        st = kd_exec_build(&s->half[h], 1, split_make, &b, &handled);
        if (st != KILN_OK || !handled) break;
        built++;
        /* each half's scratchpad its own: the second's after the first's */
        struct kd_exec *e = &s->half[h];
        for (int vi = 0; vi < e->nv && h == 1; vi++)
            for (int k = 0; k < e->v[vi].nargs; k++)
                if (e->v[vi].args[k].src == KD_SRC_SCRATCH) {
                    e->v[vi].args[k].src = KD_SRC_SCRATCH_AT;
                    e->v[vi].args[k].index = (int)base;
                }
        base += (kd_exec_scratch(e) + 63) / 64 * 64;
    }
    if (st != KILN_OK || built < 2) {
        for (int h = 0; h < built; h++) kd_exec_destroy(&s->half[h]);
        free(s);
        return st;
    }
    s->has_sum = has_sum;
    s->k = simd_kernels_for();
    s->has_act = has_act;
    s->act = act;
    s->act_alpha = act_alpha;
    s->act_beta = act_beta;
    s->post_act = b.post_act;
    s->dst_bytes = dnnl_memory_desc_get_size(&yfull);
    s->sum_at = base;
    s->scratch_total = base + (has_sum ? (s->dst_bytes + 63) / 64 * 64 : 0);
    inst->name = fused ? "dnnl_fused_conv_split" : "dnnl_conv_split";
    kd_inst_impl(inst, &s->half[0]);
    inst->state = s;
    inst->run = split_run;
    inst->destroy = split_destroy;
    inst->scratch_bytes = s->scratch_total;
    inst->packed = 1u << 1;
    return KILN_OK;
}

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/dnnl/conv.def"
#undef KILN_KERNEL

bool kiln_k_dnnl_conv_split_covers(const struct kiln_compile_ctx *cc)
{
    struct kiln_window win;
    return split_geometry(cc, &win);
}

kiln_status kiln_k_dnnl_conv_split_compile(const struct kiln_compile_ctx *cc,
                                           struct kiln_kernel_inst *inst)
{
    return split_compile(cc, inst);
}
