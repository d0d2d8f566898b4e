/*
 * conv.c - oneDNN fast kernels for Conv and KilnFusedConv (float32).
 *
 * One oneDNN convolution primitive per node: 1-D, 2-D or 3-D, any group
 * count (depthwise included), strides, dilations, explicit or auto pads,
 * bias. KilnFusedConv's Sum input becomes a sum post-op (Sum is copied
 * into Y first unless the plan already placed it there) and its
 * activation one or two eltwise post-ops. The weights are constant and
 * reordered once into the format oneDNN picks ("any"); activations are
 * plain NCHW or, where the layout pass blocked the value (4-D only),
 * nChw8c / nChw16c. Anything else (other dtypes, weights computed at run
 * time, empty tensors) stays on the reference kernel. 1x1 convolutions of
 * 1x1 images (squeeze-excitation) go to Kiln's own matrix-vector kernel
 * (src/kernels/simd/pointwise.c) instead: both are kernels of the conv
 * family (conv.def, family.h), which tries that one first.
 *
 * Layouts oneDNN is slow on: where the primitive made for the layouts the
 * plan gives is one of oneDNN's fallbacks (its reference code, or the
 * im2col GEMM it uses for plain layouts, depthwise convolutions and
 * channel counts off the block), the convolution is made again with its
 * activations in format "any", and when oneDNN then picks a direct or
 * Winograd kernel and the estimate in conv_try_any says the reorders pay,
 * the node runs that one between a reorder of X (and Sum) into the chosen
 * format and one of Y back, in the kernel's scratch. So a convolution
 * anywhere in a graph (after a channel shuffle, a Slice, a Concat the
 * layout pass left plain) runs on a fast kernel. A 1-D convolution (the
 * layout pass leaves rank 3 plain) asks for 16-channel blocks (nCw16c)
 * first, then 8 (nCw8c, AVX2's block), and "any" only where those are
 * fallbacks too: for nCw16c oneDNN's direct kernel sums in the same order
 * on 1 and 2 threads, where its brgemm kernel for the nwc layout "any"
 * picks did not once dilated. Where every format is a fallback because of
 * the pads (conv_try_pad: a dilated 1-D convolution, pads wider than the
 * direct kernel's unroll), X is padded explicitly into the scratch and the
 * convolution made again without pads. KILN_CONV_ANY=0 in the environment
 * turns all this off.
 *
 * bf16 (a plan compiled for KILN_PRECISION_BF16; docs/COMPRESSION.md): the
 * weights are packed as bfloat16, X is rounded to bfloat16 (nearest even)
 * into the kernel's scratch at the start of each run, in whatever layout it
 * is stored (padding included), and oneDNN's direct bf16 convolution
 * accumulates in fp32 into the fp32 Y with bias, Sum and activation as in
 * fp32. Where oneDNN has no bf16 convolution the node runs in fp32.
 *
 * int8 (KILN_PRECISION_INT8; groups of 1): dynamic quantization on
 * oneDNN's int8 convolution, whose fast (VNNI) kernels want channels-last
 * activations. Each run: a reorder brings X (plain or blocked) to
 * channels-last fp32 in scratch, X is quantized there to u8 with a scale
 * and zero point measured on it (kd_quantize_u8), the convolution
 * accumulates (q - zp) * w_s8 in int32 and writes
 *     Y' = (float(acc) * scale_w[m]) * scale_x + bias [+ Sum], then the
 * activation (scale_w as constant per-channel output scales, scale_x as a
 * binary-mul post-op read at run time, bias as a binary-add post-op,
 * KilnFusedConv's residual Sum as a sum post-op) to a channels-last fp32
 * buffer, and a second reorder writes it to Y in Y's layout. The Sum stays
 * fp32 (no second quantization): a reorder copies it, from Y's layout, into
 * that channels-last buffer before the convolution adds to it. The weights
 * are symmetric s8 per output channel (kd_pack_weights_s8).
 */
#include <math.h>

#include "kernels/dnnl/conv.h"
#include "kernels/dnnl/dnnl_common.h"
#include "kernels/simd/skinny.h"

#include "kernels/ref/gemm.h"
#include "kernels/family.h"
#include "kernels/simd/pointwise.h"
#include "kernels/sparse/sparse.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/dnnl/conv.def"
#undef KILN_KERNEL

struct conv_state {
    struct kd_exec e;
    int has_sum;
    size_t dst_bytes;       /* bytes of Y in its layout (the Sum copy) */
    int bf16;               /* X converted to bfloat16 at scratch + base each run */
    size_t src_elems;       /* stored elements of X (blocked padding included) */
    size_t base, scratch_total;
    int any;                /* runs any_e between the reorders below (conv_try_any) */
    int merged;             /* any_e is the convolution with groups merged (conv_try_merge) */
    struct kd_exec any_e, pre_x, pre_sum, post_y;
    int has_pre_x, has_pre_sum, has_post_y;
    int post_act;           /* kd_deferred_activation: applied to Y after oneDNN, or 0 */
    /* X padded explicitly (conv_try_pad): pre_x writes the interior of the buffer of
     * layout xpad_md at scratch + xpad_at, whose border is zeroed first */
    int pad_explicit;
    size_t xpad_at;
    dnnl_memory_desc_t xpad_md;
    int64_t xpad_lo[3], xpad_hi[3];
};

/* Everything make needs to build one variant. */
struct conv_build {
    const struct kiln_compile_ctx *cc;
    dnnl_memory_desc_t src, wany, wplain, bias, dst;
    int has_bias, has_sum;
    int winograd; /* try oneDNN's Winograd algorithm first (conv_use_winograd) */
    int bf16;     /* this build tries bfloat16 X and weights */
    int post_act; /* kd_deferred_activation: no activation post-op, Kiln applies it */
    dnnl_dims_t strides, dilates, pad_l, pad_r;
    /* format "any" (conv_try_any): X and Y in src_any / dst_any, format_tag_any until
     * variant 0 fixes them to oneDNN's choice; each lives in the scratch (at x_rel /
     * y_rel, before the scratchpad base is added) when it differs from the plan's */
    int any, any_fixed, x_scratch, y_scratch;
    int want_amx; /* conv_try_any of a bf16 convolution: only an AMX implementation will do */
    int base_ref; /* the plan's layouts got oneDNN's reference code: its GEMM path is better */
    /* conv_try_merge: the weights of merged groups (block diagonal, f32, wplain) and the
     * name of their packing; NULL: the constant itself */
    const float *wdata;
    char wwhat[32];
    dnnl_memory_desc_t src_any, dst_any;
    size_t x_rel, y_rel;
    /* conv_try_pad: src_any is X with its pads added to the spatial dims, the convolution
     * has none, and pre_x writes X into src_pad_sub (the interior of src_any) */
    int pad_explicit;
    dnnl_memory_desc_t src_pad_sub;
};

/* Whether oneDNN's implementation `impl` of a convolution is one of its fallbacks. */
static int conv_impl_slow(const char *impl)
{
    return strncmp(impl, "ref", 3) == 0 || strstr(impl, "gemm") != NULL;
}

/* The primitive descriptor of b's convolution with algorithm alg, or NULL
 * where oneDNN has no implementation of it. */
static dnnl_primitive_desc_t conv_pd(const struct conv_build *b, dnnl_alg_kind_t alg)
{
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_convolution_desc_t cd;
    dnnl_memory_desc_t src = b->any ? b->src_any : b->src, wany = b->wany;
    dnnl_memory_desc_t dst = b->any ? b->dst_any : b->dst;
    if (b->bf16) src.data_type = wany.data_type = dnnl_bf16;
    dnnl_status_t r = dnnl_dilated_convolution_forward_desc_init(
        &cd, dnnl_forward_inference, alg, &src, &wany, b->has_bias ? &b->bias : NULL,
        &dst, b->strides, b->dilates, b->pad_l, b->pad_r);
    if (r == dnnl_success) r = dnnl_primitive_attr_create(&attr);
    if (r == dnnl_success) r = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (r == dnnl_success) r = dnnl_post_ops_create(&po);
    if (r == dnnl_success && b->has_sum) r = dnnl_post_ops_append_sum(po, 1.0f);
    if (r == dnnl_success && !b->post_act && !kd_append_activation(b->cc->node, po))
        r = dnnl_unimplemented;
    if (r == dnnl_success) r = dnnl_primitive_attr_set_post_ops(attr, po);
    if (r == dnnl_success) r = kd_pd_create(&pd, &cd, attr);
    if (r != dnnl_success) pd = NULL;
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return pd;
}

/* conv_winograd_pays: F(2x2,3x3) is declined below this many products of output pixels
 * (batch included), input and output channels (N * OH * OW * C * M; direct flops / 18). */
#define WINO_MIN_PRODUCTS 2e6

/* Whether the Winograd primitive pd (oneDNN's F(m x m, 3x3) for the m its name gives)
 * is expected to beat the direct algorithm on b's shape. Measured per primitive on the zoo
 * (googlenet, densenet121, squeezenet1_1, alexnet, wide_resnet50_2; batch 1 and 8), it loses
 * in two cases. Few channels on small images: its input and output transforms (per channel,
 * so in proportion to C + M) outweigh the multiplications it saves (in proportion to
 * C * M) where there are too few tiles for its products to run well: googlenet's 6x6
 * convolutions of 16 to 32 input channels ran 1.3-2x slower than direct at batch 1 and 8,
 * densenet121's 128 -> 32 channels on 8x8 1.3x, where squeezenet's 16 -> 64 on 23x23 and
 * densenet121's on 16x16 still ran faster with Winograd. And tiles that cover much more
 * than the image, where the padding of the last tile is computed for nothing: 6x6 outputs
 * in oneDNN's tiles of 4 (1.78x the area) ran 1.15-1.3x slower than direct at batch 8 on
 * every channel count, 5x5 in tiles of 4 (2.56x) 1.6x slower, where 5x5 in tiles of 2
 * (1.44x) was about even. So Winograd is declined where C * M / (C + M) < 32 on images of
 * at most 64 outputs, or where the tiles cover 1.5x the output or more, or (measured later,
 * below) in tiles of 2 on fewer than WINO_MIN_PRODUCTS. */
static int conv_winograd_pays(const struct conv_build *b, const_dnnl_primitive_desc_t pd)
{
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
        !impl)
        return 0;
    int64_t m = strstr(impl, "4x3") ? 4 : strstr(impl, "2x3") ? 2 : 0;
    if (!m) return 1; /* a variant this rule was not measured on: oneDNN's choice */
    double c = (double)b->src.dims[1], oc = (double)b->dst.dims[1];
    int64_t oh = b->dst.dims[2], ow = b->dst.dims[3];
    if (c * oc / (c + oc) < 32.0 && oh * ow <= 64) return 0;
    double tiled = (double)((oh + m - 1) / m * m) * (double)((ow + m - 1) / m * m);
    if (tiled >= 1.5 * (double)oh * (double)ow) return 0;
    /* F(2x2,3x3), oneDNN's tile for small images, measured per primitive at batch 1 on 2
     * threads (40 shapes, images 5x5 to 28x28, 16 to 512 channels; Winograd / direct time):
     * under 1.2M products of output pixels, C and M it lost everywhere (squeezenet's 48 ->
     * 192 on 5x5 1.4x, 32 -> 128 on 11x11 1.4-1.6x, 16 -> 64 on 14x14 2x, 64 -> 64 on 14x14
     * and 128 -> 128 on 7x7 1.1x): too few tiles for its three phases; from 1.2M to 2M it
     * won by 6-14% on most channel counts (256 -> 256 on 5x5, 192 -> 192 and 128 -> 256 on
     * 7x7, 64 -> 256 on 11x11) but lost 1.3-2.1x on others (alexnet's 192 -> 384 on 5x5,
     * 1.84M: 0.2 ms against 0.1; 112 -> 224 on 7x7), its blocking for those channel counts;
     * above 2M it won but for 384 -> 192 and 192 -> 384 (1.2-1.4x up to 14x14) and was even
     * on 160 -> 320 (28x28 and up take F(4x4,3x3)). Declined under WINO_MIN_PRODUCTS (2M),
     * which keeps the large losses out for small gains given up. */
    if (m == 2 && (double)b->dst.dims[0] * (double)(oh * ow) * c * oc < WINO_MIN_PRODUCTS) return 0;
    return 1;
}

static kiln_status conv_make(void *arg, struct kd_variant *v, int threads)
{
    struct conv_build *b = arg;
    const struct kiln_node *n = b->cc->node;
    kiln_status st = KILN_OK;
    /* Winograd first where it applies (3x3, stride 1, blocked layout); oneDNN
     * answers unimplemented for every other shape, and then the direct
     * algorithm runs. */
    dnnl_primitive_desc_t pd = b->winograd && !b->bf16 ? conv_pd(b, dnnl_convolution_winograd)
                                                       : NULL;
    if (pd && !conv_winograd_pays(b, pd)) {
        dnnl_primitive_desc_destroy(pd);
        pd = NULL;
    }
    if (!pd) pd = conv_pd(b, dnnl_convolution_direct);
    if (!pd) goto out; /* unimplemented here: the reference runs it */
    if (b->bf16 && kd_pd_is_ref(pd)) goto out; /* fp32 is faster than oneDNN's reference */
    if (b->any) {
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
            !impl || strncmp(impl, "ref", 3) == 0 || (conv_impl_slow(impl) && !b->base_ref) ||
            (b->want_amx && !strstr(impl, "amx")))
            goto out; /* no better than the plan's layouts */
        if (!b->any_fixed) { /* variant 1 uses variant 0's formats */
            b->src_any = *dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
            b->dst_any = *dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
            b->any_fixed = 1;
            b->x_scratch = !dnnl_memory_desc_equal(&b->src_any, &b->src);
            b->y_scratch = !dnnl_memory_desc_equal(&b->dst_any, &b->dst);
            b->x_rel = 0;
            b->y_rel = b->x_scratch ? (dnnl_memory_desc_get_size(&b->src_any) + 63) / 64 * 64 : 0;
        }
    }
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    const kiln_tensor *wt = b->cc->in_value[1];
    st = kd_pack_weights_from(b->cc, wt, b->wdata ? (const void *)b->wdata : NULL,
                              b->wdata ? b->wwhat : b->bf16 ? "conv_bf16" : "conv", &b->wplain,
                              wmd, 1.0f, &v->packed);
    if (st != KILN_OK || !v->packed) goto out;
    st = kd_variant_init(n, pd, v);
    if (st != KILN_OK) goto out;
    if (b->any && b->x_scratch) { /* (bf16: the reorder before converts X too) */
        kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_SCRATCH_AT, (int)b->x_rel, &b->src_any);
    } else if (b->bf16) { /* X in bfloat16 at the kernel's scratch (offset fixed after the build) */
        dnnl_memory_desc_t src = b->src;
        src.data_type = dnnl_bf16;
        kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_SCRATCH_AT, 0, &src);
    } else {
        kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_IN, 0, &b->src);
    }
    kd_variant_arg(v, DNNL_ARG_WEIGHTS, KD_SRC_PACKED, 1, wmd);
    if (b->has_bias) kd_variant_arg(v, DNNL_ARG_BIAS, KD_SRC_IN, 2, &b->bias);
    if (b->any && b->y_scratch)
        kd_variant_arg(v, DNNL_ARG_DST, KD_SRC_SCRATCH_AT, (int)b->y_rel, &b->dst_any);
    else
        kd_variant_arg(v, DNNL_ARG_DST, KD_SRC_OUT, 0, &b->dst);
out:
    (void)threads;
    if (pd) dnnl_primitive_desc_destroy(pd);
    return st;
}

/* ---- int8 ---- */

struct conv8_state {
    struct kd_exec pre, conv, post; /* X -> fp32 channels-last; the int8 conv; -> Y */
    struct kd_exec pre_sum;         /* Sum -> the channels-last Y buffer (has_sum) */
    int has_sum;
    size_t base;                    /* scratch offset of the buffers below */
    size_t x_rel, q_rel, sx_rel, zp_rel, y_rel;
    int64_t x_count;
    size_t scratch_total;
};

struct conv8_build {
    const struct conv_build *b;
    dnnl_memory_desc_t x_cl, q_cl, y_cl; /* channels-last fp32 X, u8 X, fp32 Y */
    dnnl_memory_desc_t one, bias_po, zp_md;
    const float *w_scales;             /* per output channel, for the attr */
    size_t x_rel, q_rel, sx_rel, zp_rel, y_rel;
    int stage;                         /* 0 pre reorder, 1 conv, 2 post reorder, 3 Sum reorder */
};

static kiln_status conv8_make(void *arg, struct kd_variant *v, int threads)
{
    struct conv8_build *c = arg;
    const struct conv_build *b = c->b;
    const struct kiln_node *n = b->cc->node;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    kiln_status st = KILN_OK;
    dnnl_status_t r = dnnl_primitive_attr_create(&attr);
    if (r == dnnl_success) r = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    (void)threads;
    if (c->stage != 1) { /* a layout reorder (Sum is stored as Y is: conv_node_ok) */
        const dnnl_memory_desc_t *from = c->stage == 0 ? &b->src : c->stage == 3 ? &b->dst
                                                                                  : &c->y_cl;
        const dnnl_memory_desc_t *to = c->stage == 0 ? &c->x_cl : c->stage == 3 ? &c->y_cl
                                                                                : &b->dst;
        if (r == dnnl_success)
            r = dnnl_reorder_primitive_desc_create(&pd, from, kd_engine(), to, kd_engine(), attr);
        if (r != dnnl_success) goto out;
        st = kd_variant_init(n, pd, v);
        if (st != KILN_OK) goto out;
        if (c->stage == 0) {
            kd_variant_arg(v, DNNL_ARG_FROM, KD_SRC_IN, 0, from);
            kd_variant_arg(v, DNNL_ARG_TO, KD_SRC_SCRATCH_AT, (int)c->x_rel, to);
        } else if (c->stage == 3) {
            kd_variant_arg(v, DNNL_ARG_FROM, KD_SRC_IN, 3, from);
            kd_variant_arg(v, DNNL_ARG_TO, KD_SRC_SCRATCH_AT, (int)c->y_rel, to);
        } else {
            kd_variant_arg(v, DNNL_ARG_FROM, KD_SRC_SCRATCH_AT, (int)c->y_rel, from);
            kd_variant_arg(v, DNNL_ARG_TO, KD_SRC_OUT, 0, to);
        }
        goto out;
    }
    dnnl_memory_desc_t wany = b->wany;
    wany.data_type = dnnl_s8;
    dnnl_convolution_desc_t cd;
    int64_t m = b->dst.dims[1];
    if (r == dnnl_success)
        r = dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference,
                                                       dnnl_convolution_direct, &c->q_cl, &wany,
                                                       NULL, &c->y_cl, b->strides, b->dilates,
                                                       b->pad_l, b->pad_r);
    if (r == dnnl_success) r = dnnl_primitive_attr_set_output_scales(attr, m, 1 << 1, c->w_scales);
    if (r == dnnl_success)
        r = dnnl_primitive_attr_set_zero_points(attr, DNNL_ARG_SRC, 1, 0, &DNNL_RUNTIME_S32_VAL);
    if (r == dnnl_success) r = dnnl_post_ops_create(&po);
    if (r == dnnl_success) r = dnnl_post_ops_append_binary(po, dnnl_binary_mul, &c->one);
    if (r == dnnl_success && b->has_bias)
        r = dnnl_post_ops_append_binary(po, dnnl_binary_add, &c->bias_po);
    if (r == dnnl_success && b->has_sum) r = dnnl_post_ops_append_sum(po, 1.0f);
    if (r == dnnl_success && !kd_append_activation(n, po)) r = dnnl_unimplemented;
    if (r == dnnl_success) r = dnnl_primitive_attr_set_post_ops(attr, po);
    if (r == dnnl_success) r = kd_pd_create(&pd, &cd, attr);
    if (r != dnnl_success) {
        pd = NULL;
        goto out;
    }
    if (kd_pd_is_ref(pd)) goto out; /* fp32 is faster than oneDNN's reference */
    if (!kd_pd_int8_exact(pd)) goto out; /* no VNNI: 16-bit sums could saturate */
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    size_t sc_bytes = 0;
    void *packed = NULL;
    st = kd_pack_weights_s8(b->cc, b->cc->in_value[1], "conv", &b->wplain, 0, wmd, &packed,
                            &sc_bytes);
    if (st != KILN_OK || !packed) goto out;
    v->packed = (char *)packed + sc_bytes;
    st = kd_variant_init(n, pd, v);
    if (st != KILN_OK) goto out;
    kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_SCRATCH_AT, (int)c->q_rel, &c->q_cl);
    kd_variant_arg(v, DNNL_ARG_WEIGHTS, KD_SRC_PACKED, 1, wmd);
    kd_variant_arg(v, DNNL_ARG_DST, KD_SRC_SCRATCH_AT, (int)c->y_rel, &c->y_cl);
    kd_variant_arg(v, DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, KD_SRC_SCRATCH_AT,
                   (int)c->sx_rel, &c->one);
    if (b->has_bias)
        kd_variant_arg(v, DNNL_ARG_ATTR_MULTIPLE_POST_OP(1) | DNNL_ARG_SRC_1, KD_SRC_IN, 2,
                       &c->bias_po);
    kd_variant_arg(v, DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, KD_SRC_SCRATCH_AT, (int)c->zp_rel,
                   &c->zp_md);
out:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st;
}

static kiln_status conv8_run(void *state, struct kiln_run_ctx *ctx)
{
    struct conv8_state *s = state;
    struct kiln_run_ctx c2 = *ctx;
    void *heap = NULL;
    if (!c2.scratch) { /* callers without a plan arena */
        heap = c2.scratch = aligned_alloc(64, s->scratch_total);
        if (!heap) return kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY, "out of memory for scratch");
    }
    char *base = (char *)c2.scratch + s->base;
    kiln_status st = kd_exec_run(&s->pre, &c2);
    if (st == KILN_OK) {
        float sx;
        int32_t zp;
        kd_quantize_u8((const float *)(base + s->x_rel), s->x_count, (uint8_t *)(base + s->q_rel),
                       ctx->threads, &sx, &zp);
        memcpy(base + s->sx_rel, &sx, sizeof sx);
        memcpy(base + s->zp_rel, &zp, sizeof zp);
        if (s->has_sum) st = kd_exec_run(&s->pre_sum, &c2); /* Sum into the conv's Y */
        if (st == KILN_OK) st = kd_exec_run(&s->conv, &c2);
    }
    if (st == KILN_OK) st = kd_exec_run(&s->post, &c2);
    free(heap);
    return st;
}

static void conv8_destroy(void *state)
{
    struct conv8_state *s = state;
    kd_exec_destroy(&s->pre);
    kd_exec_destroy(&s->conv);
    kd_exec_destroy(&s->post);
    if (s->has_sum) kd_exec_destroy(&s->pre_sum);
    free(s);
}

/* Channels-last md of dims (rank 3..5) in dtype dt. */
static dnnl_status_t md_channels_last(dnnl_memory_desc_t *md, int rank, const dnnl_dims_t dims,
                                      dnnl_data_type_t dt)
{
    dnnl_format_tag_t tag = rank == 3 ? dnnl_acb : rank == 4 ? dnnl_acdb : dnnl_acdeb;
    return dnnl_memory_desc_init_by_tag(md, rank, dims, dt, tag);
}

/* Try the int8 kernel for b's convolution; inst->run stays NULL when it declines. */
static kiln_status conv8_compile(const struct conv_build *b, const kiln_tensor *w, double work,
                                 struct kiln_kernel_inst *inst)
{
    const struct kiln_compile_ctx *cc = b->cc;
    const struct kiln_node *n = cc->node;
    int rank = b->src.ndims;
    int64_t m = b->dst.dims[1];
    struct conv8_build c;
    memset(&c, 0, sizeof c);
    c.b = b;
    dnnl_dims_t one = {1, 1, 1, 1, 1}, bd = {1, m, 1, 1, 1}, z = {1};
    dnnl_format_tag_t plain = rank == 3 ? dnnl_abc : rank == 4 ? dnnl_abcd : dnnl_abcde;
    if (md_channels_last(&c.x_cl, rank, b->src.dims, dnnl_f32) != dnnl_success ||
        md_channels_last(&c.q_cl, rank, b->src.dims, dnnl_u8) != dnnl_success ||
        md_channels_last(&c.y_cl, rank, b->dst.dims, dnnl_f32) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&c.one, rank, one, dnnl_f32, plain) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&c.bias_po, rank, bd, dnnl_f32, plain) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&c.zp_md, 1, z, dnnl_s32, dnnl_a) != dnnl_success)
        return KILN_OK;
    /* the channel scales, as kd_pack_weights_s8 computes them (w is plain [M, C, k...]); w
     * may be a reloadable weight released by an earlier plan: make it resident first */
    kiln_status st = cc->weights ? kiln_weight_cache_acquire(cc->weights, w, 0) : KILN_OK;
    if (st != KILN_OK || !w->data) return st;
    float *ws = malloc(sizeof(float) * (size_t)m);
    struct conv8_state *s = calloc(1, sizeof *s);
    if (!ws || !s) {
        free(ws);
        free(s);
        return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    }
    kd_channel_scales_s8(w->data, &b->wplain, 0, ws);
    c.w_scales = ws;
    int64_t xc = 1, yc = 1;
    for (int i = 0; i < rank; i++) {
        xc *= b->src.dims[i];
        yc *= b->dst.dims[i];
    }
    c.x_rel = 0;
    c.q_rel = c.x_rel + ((size_t)xc * 4 + 63) / 64 * 64;
    c.sx_rel = c.q_rel + ((size_t)xc + 63) / 64 * 64;
    c.zp_rel = c.sx_rel + 64;
    c.y_rel = c.zp_rel + 64;
    size_t own = c.y_rel + ((size_t)yc * 4 + 63) / 64 * 64;
    if (own > (size_t)INT32_MAX / 2) { /* scratch offsets are ints: such a node runs fp32 */
        free(ws);
        free(s);
        return KILN_OK;
    }
    int h0 = 0, h1 = 0, h2 = 0, h3 = !b->has_sum;
    c.stage = 1;
    st = kd_exec_build(&s->conv, kd_work_threads(cc, work), conv8_make, &c, &h1);
    if (st == KILN_OK && h1) {
        c.stage = 0;
        st = kd_exec_build(&s->pre, kd_work_threads(cc, (double)xc), conv8_make, &c, &h0);
    }
    if (st == KILN_OK && h1 && h0) {
        c.stage = 2;
        st = kd_exec_build(&s->post, kd_work_threads(cc, (double)yc), conv8_make, &c, &h2);
    }
    if (st == KILN_OK && h1 && h0 && h2 && b->has_sum) {
        c.stage = 3;
        st = kd_exec_build(&s->pre_sum, kd_work_threads(cc, (double)yc), conv8_make, &c, &h3);
    }
    free(ws);
    if (st != KILN_OK || !h0 || !h1 || !h2 || !h3) {
        if (h0) kd_exec_destroy(&s->pre);
        if (h1) kd_exec_destroy(&s->conv);
        if (h2) kd_exec_destroy(&s->post);
        if (h3 && b->has_sum) kd_exec_destroy(&s->pre_sum);
        free(s);
        return st;
    }
    s->has_sum = b->has_sum;
    size_t sp = kd_exec_scratch(&s->pre), sc = kd_exec_scratch(&s->conv);
    size_t so = kd_exec_scratch(&s->post);
    size_t scratch = sp > sc ? sp : sc;
    if (so > scratch) scratch = so;
    if (s->has_sum && kd_exec_scratch(&s->pre_sum) > scratch) scratch = kd_exec_scratch(&s->pre_sum);
    s->base = scratch;
    s->x_rel = c.x_rel;
    s->q_rel = c.q_rel;
    s->sx_rel = c.sx_rel;
    s->zp_rel = c.zp_rel;
    s->y_rel = c.y_rel;
    s->x_count = xc;
    s->scratch_total = s->base + own;
    struct kd_exec *all[4] = {&s->pre, &s->conv, &s->post, &s->pre_sum};
    for (int e = 0; e < 3 + s->has_sum; e++) /* the kernel's buffers after the largest scratchpad */
        for (int vi = 0; vi < all[e]->nv; vi++)
            for (int k = 0; k < all[e]->v[vi].nargs; k++)
                if (all[e]->v[vi].args[k].src == KD_SRC_SCRATCH_AT)
                    all[e]->v[vi].args[k].index += (int)s->base;
    inst->name = n->op == KILN_OP_KilnFusedConv ? "dnnl_fused_conv_int8" : "dnnl_conv_int8";
    kd_inst_impl(inst, &s->conv);
    inst->state = s;
    inst->run = conv8_run;
    inst->destroy = conv8_destroy;
    inst->scratch_bytes = s->scratch_total;
    inst->packed = 1u << 1;
    if (s->has_sum) { /* Sum is copied into scratch before Y is written: Y may be Sum's buffer */
        inst->inplace = 1;
        inst->inplace_input = 3;
    }
    return KILN_OK;
}

/* conv_run for a convolution in oneDNN's formats: reorders around any_e. */
static kiln_status conv_any_run(struct conv_state *s, struct kiln_run_ctx *ctx)
{
    struct kiln_run_ctx c2 = *ctx;
    void *heap = NULL;
    if (!c2.scratch) { /* callers without a plan arena */
        heap = c2.scratch = aligned_alloc(64, s->scratch_total);
        if (!heap) return kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY, "out of memory for scratch");
    }
    kiln_status st = KILN_OK;
    if (s->pad_explicit)
        kd_zero_border((char *)c2.scratch + s->xpad_at, &s->xpad_md, s->xpad_lo, s->xpad_hi);
    if (s->has_pre_x) st = kd_exec_run(&s->pre_x, &c2);
    if (st == KILN_OK && s->has_sum) {
        if (s->has_pre_sum) st = kd_exec_run(&s->pre_sum, &c2);
        else if (ctx->in[3]->data != ctx->out[0]->data)
            memcpy(ctx->out[0]->data, ctx->in[3]->data, s->dst_bytes);
    }
    if (st == KILN_OK) st = kd_exec_run(&s->any_e, &c2);
    if (st == KILN_OK && s->has_post_y) st = kd_exec_run(&s->post_y, &c2);
    free(heap);
    return st;
}

/* conv_run for oneDNN in the plan's layouts (bf16 X converted first). */
static kiln_status conv_plain_run(struct conv_state *s, struct kiln_run_ctx *ctx)
{
    struct kiln_run_ctx c2 = *ctx;
    void *heap = NULL;
    if (s->bf16) {
        if (!c2.scratch) { /* callers without a plan arena */
            heap = c2.scratch = aligned_alloc(64, s->scratch_total);
            if (!heap)
                return kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY, "out of memory for scratch");
        }
        uint16_t *h = (uint16_t *)((char *)c2.scratch + s->base);
        const float *x = ctx->in[0]->data;
        kd_to_bf16(x, (int64_t)s->src_elems, h, ctx->threads);
    }
    if (s->has_sum && ctx->in[3]->data != ctx->out[0]->data)
        memcpy(ctx->out[0]->data, ctx->in[3]->data, s->dst_bytes);
    kiln_status st = kd_exec_run(&s->e, &c2);
    free(heap);
    return st;
}

static kiln_status conv_run(void *state, struct kiln_run_ctx *ctx)
{
    struct conv_state *s = state;
    kiln_status st = s->any ? conv_any_run(s, ctx) : conv_plain_run(s, ctx);
    if (st == KILN_OK && s->post_act)
        kd_apply_activation(s->post_act, ctx->out[0]->data, s->dst_bytes / sizeof(float),
                            ctx->threads);
    return st;
}

static void conv_destroy(void *state)
{
    struct conv_state *s = state;
    kd_exec_destroy(&s->e);
    if (s->any) kd_exec_destroy(&s->any_e);
    if (s->has_pre_x) kd_exec_destroy(&s->pre_x);
    if (s->has_pre_sum) kd_exec_destroy(&s->pre_sum);
    if (s->has_post_y) kd_exec_destroy(&s->post_y);
    free(s);
}

/* oneDNN's direct kernels refuse some padded convolutions their unpadded twins run: on
 * AVX2 (oneDNN 2.6), a 1-D convolution dilated and padded at all, or a 2-D one padded by
 * more than its kernel's unroll along W (a causal TCN's pad of 2 * dilation on one side,
 * an atrous 3x3 of rate 6 and up, a 9x9 of pad 4), which then run on the im2col GEMM at a
 * third of the peak or on the reference code. Where the formats conv_try_any found (any_e,
 * when *h) are such a fallback, make the convolution again without pads, on X with its
 * pads added to the spatial dims: pre_x writes X into that buffer's interior (the
 * submemory src_pad_sub) and conv_any_run zeroes the border first (kd_zero_border), a
 * copy of X that conv_try_any's estimate already pays for. Keeps any_e (or nothing) where
 * no direct kernel takes that either. */
static kiln_status conv_try_pad(struct conv_build *b, struct kd_exec *any_e, int *h,
                                double work)
{
    int rank = b->src.ndims, nsp = rank - 2, padded = 0;
    for (int i = 0; i < nsp; i++) padded |= b->pad_l[i] || b->pad_r[i];
    if (!padded || (*h && !conv_impl_slow(any_e->v[0].impl))) return KILN_OK;
    struct conv_build save = *b;
    dnnl_dims_t pdims, offs = {0};
    for (int i = 0; i < rank; i++) pdims[i] = b->src.dims[i];
    for (int i = 0; i < nsp; i++) {
        pdims[2 + i] += b->pad_l[i] + b->pad_r[i];
        offs[2 + i] = b->pad_l[i];
        b->pad_l[i] = b->pad_r[i] = 0;
    }
    /* 1-D: channel blocks of 16 or 8 first (oneDNN's direct kernels), then its choice */
    const dnnl_format_tag_t tags[3] = {dnnl_aBc16b, dnnl_aBc8b, dnnl_format_tag_any};
    struct kd_exec e;
    int he = 0;
    kiln_status st = KILN_OK;
    for (int t = rank == 3 ? 0 : 2; t < 3 && st == KILN_OK && !he; t++) {
        if (dnnl_memory_desc_init_by_tag(&b->src_any, rank, pdims, dnnl_f32, tags[t]) !=
                dnnl_success ||
            dnnl_memory_desc_init_by_tag(&b->dst_any, rank, b->dst.dims, dnnl_f32, tags[t]) !=
                dnnl_success)
            continue;
        b->any = 1;
        b->any_fixed = 0;
        b->winograd = 0;
        b->base_ref = 0; /* a direct kernel or nothing */
        st = kd_exec_build(&e, kd_work_threads(b->cc, work), conv_make, b, &he);
    }
    if (st == KILN_OK && he &&
        dnnl_memory_desc_init_submemory(&b->src_pad_sub, &b->src_any, b->src.dims, offs) !=
            dnnl_success) {
        kd_exec_destroy(&e);
        he = 0;
    }
    if (st != KILN_OK || !he) {
        *b = save;
        return st;
    }
    if (*h) kd_exec_destroy(any_e);
    *any_e = e;
    *h = 1;
    for (int i = 0; i < nsp; i++) {
        b->pad_l[i] = save.pad_l[i];
        b->pad_r[i] = save.pad_r[i];
    }
    b->any = 0;
    b->winograd = save.winograd;
    b->pad_explicit = 1;
    return KILN_OK;
}

/* Where s's primitive (made for the plan's layouts) is a oneDNN fallback, make
 * the convolution again in the formats oneDNN prefers, with reorders of X (and
 * Sum) in and Y out (the file comment). It pays when the convolution's work
 * outweighs the reorders: oneDNN's reference code always loses; its GEMM path
 * runs at a fraction of the direct kernels' rate, so the switch is made when
 * the convolution does at least 4 flops per element the reorders move (a
 * depthwise 3x3 does 9, a 1x1 from C channels C). On success s runs any_e. */
static kiln_status conv_try_any(struct conv_build *b, struct conv_state *s, double work)
{
    const struct kiln_compile_ctx *cc = b->cc;
    const char *impl = s->e.v[0].impl, *env = getenv("KILN_CONV_ANY");
    /* bf16 on a CPU with AMX: oneDNN's AMX convolutions read channels-last data only, so
     * in the plan's channel blocks a bf16 convolution runs on AVX512-BF16 dot products at
     * a fraction of the tiles' rate; try oneDNN's formats, X converted to bfloat16 by the
     * reorder before, and keep them only where an AMX kernel takes them */
    int amx = s->bf16 && !strstr(impl, "amx") && kd_cpu_amx_bf16();
    if ((s->bf16 && !amx) || s->merged || (!amx && !conv_impl_slow(impl)) ||
        (env && !strcmp(env, "0")))
        return KILN_OK;
    double moved = (double)(dnnl_memory_desc_get_size(&b->src) +
                            dnnl_memory_desc_get_size(&b->dst) * (b->has_sum ? 2 : 1)) /
                   sizeof(float);
    if (strncmp(impl, "ref", 3) != 0 && work < 4.0 * moved) return KILN_OK;
    int rank = b->src.ndims;
    /* the direct algorithm only: Winograd's extra rounding stays where it was measured
     * (blocked chains), and tipped inception_v3 over the zoo's 1e-4 bound here */
    int winograd = b->winograd;
    int h = 0, hx = 0, hs = 0, hy = 0;
    kiln_status st = KILN_OK;
    /* 1-D: channel blocks of 16 or 8 first (oneDNN's direct kernels), then its choice */
    const dnnl_format_tag_t tags[3] = {dnnl_aBc16b, dnnl_aBc8b, dnnl_format_tag_any};
    for (int t = rank == 3 ? 0 : 2; t < 3 && st == KILN_OK && !h; t++) {
        if (dnnl_memory_desc_init_by_tag(&b->src_any, rank, b->src.dims, dnnl_f32, tags[t]) !=
                dnnl_success ||
            dnnl_memory_desc_init_by_tag(&b->dst_any, rank, b->dst.dims, dnnl_f32, tags[t]) !=
                dnnl_success)
            continue;
        b->any = 1;
        b->any_fixed = 0;
        b->winograd = 0;
        b->base_ref = strncmp(impl, "ref", 3) == 0;
        b->bf16 = b->want_amx = amx;
        st = kd_exec_build(&s->any_e, kd_work_threads(cc, work), conv_make, b, &h);
        b->any = b->bf16 = b->want_amx = 0;
        b->winograd = winograd;
    }
    if (st == KILN_OK && !amx) st = conv_try_pad(b, &s->any_e, &h, work);
    if (st != KILN_OK || !h) return st;
    if (!b->x_scratch && !b->y_scratch) { /* the plan's layouts after all */
        kd_exec_destroy(&s->any_e);
        return KILN_OK;
    }
    if (b->x_scratch)
        st = kd_reorder_exec_build(cc, &b->src, KD_SRC_IN, 0,
                                   b->pad_explicit ? &b->src_pad_sub : &b->src_any,
                                   KD_SRC_SCRATCH_AT, (int)b->x_rel, &s->pre_x, &hx);
    if (st == KILN_OK && b->y_scratch && (!b->x_scratch || hx)) {
        st = kd_reorder_exec_build(cc, &b->dst_any, KD_SRC_SCRATCH_AT, (int)b->y_rel, &b->dst,
                                   KD_SRC_OUT, 0, &s->post_y, &hy);
        if (st == KILN_OK && hy && b->has_sum)
            st = kd_reorder_exec_build(cc, &b->dst, KD_SRC_IN, 3, &b->dst_any,
                                       KD_SRC_SCRATCH_AT, (int)b->y_rel, &s->pre_sum, &hs);
    }
    if (st != KILN_OK || (b->x_scratch && !hx) || (b->y_scratch && !hy) ||
        (b->y_scratch && b->has_sum && !hs)) {
        kd_exec_destroy(&s->any_e);
        if (hx) kd_exec_destroy(&s->pre_x);
        if (hy) kd_exec_destroy(&s->post_y);
        if (hs) kd_exec_destroy(&s->pre_sum);
        return st;
    }
    size_t own = b->y_rel + (b->y_scratch ? dnnl_memory_desc_get_size(&b->dst_any) : 0);
    size_t base = kd_exec_scratch(&s->any_e);
    struct kd_exec *all[4] = {&s->any_e, &s->pre_x, &s->pre_sum, &s->post_y};
    int built[4] = {1, hx, hs, hy};
    for (int i = 1; i < 4; i++)
        if (built[i] && kd_exec_scratch(all[i]) > base) base = kd_exec_scratch(all[i]);
    if (base + own > (size_t)INT32_MAX) { /* scratch offsets are ints: keep the plan's layouts */
        for (int i = 0; i < 4; i++)
            if (built[i]) kd_exec_destroy(all[i]);
        return KILN_OK;
    }
    for (int i = 0; i < 4; i++)
        if (built[i]) kd_exec_shift_scratch(all[i], base);
    kd_exec_destroy(&s->e);
    s->any = 1;
    s->has_pre_x = hx;
    s->has_pre_sum = hs;
    s->has_post_y = hy;
    s->scratch_total = (base + own + 63) / 64 * 64;
    if (b->pad_explicit) {
        s->pad_explicit = 1;
        s->xpad_md = b->src_any;
        s->xpad_at = base + b->x_rel;
        for (int i = 0; i < rank - 2; i++) {
            s->xpad_lo[i] = b->pad_l[i];
            s->xpad_hi[i] = b->pad_r[i];
        }
    }
    return KILN_OK;
}

/* conv_try_merge merges at most this many groups into one (its work grows by as much) */
#define CONV_MERGE_MAX 4

/* A grouped convolution whose groups are narrower than oneDNN's channel block (8 channels
 * with AVX2, 16 with AVX-512) has no direct kernel in the blocked layouts: resnext50_32x4d's
 * 32 groups of 4 channels ran on oneDNN's reference code at 0.1% of the FMA peak on an AVX2
 * CPU, 93% of the model's time, and its GEMM path (conv_try_any) is still far from the
 * direct kernels. Where s's primitive is such a fallback, merge k adjacent groups into one
 * (the smallest k up to CONV_MERGE_MAX that divides the groups and gives whole 8-channel
 * blocks, whose convolution oneDNN runs on a direct kernel): the merged group's weights are
 * block diagonal, zero between the original groups, so the result is the same sums with
 * zeros added, at k times the multiplications. The merged weights are packed under a tag of
 * their own ("conv_gmK"), keyed by the constant as every packing is. Depthwise convolutions
 * (one channel per group) have oneDNN's own kernels and are left alone. On success s runs
 * any_e (no reorders). KILN_CONV_MERGE=0 in the environment turns it off. */
static kiln_status conv_try_merge(struct conv_build *b, struct conv_state *s, int64_t group,
                                  double work)
{
    const char *env = getenv("KILN_CONV_MERGE");
    if (s->bf16 || group < 2 || !conv_impl_slow(s->e.v[0].impl) || (env && !strcmp(env, "0")))
        return KILN_OK;
    const struct kiln_compile_ctx *cc = b->cc;
    const kiln_tensor *w = cc->in_value[1];
    int64_t M = w->dims[0], icg = w->dims[1], ocg = M / group, sp = 1;
    if (icg == 1 && ocg == 1) return KILN_OK;
    /* the merged weights are made from w's floats: w may be a reloadable weight an earlier
     * plan packed and released (a second precision's plan of the same model) */
    kiln_status ast = cc->weights ? kiln_weight_cache_acquire(cc->weights, w, 0) : KILN_OK;
    if (ast != KILN_OK || !w->data) return ast;
    for (int i = 2; i < w->rank; i++) sp *= w->dims[i];
    for (int64_t k = 2; k <= CONV_MERGE_MAX && k <= group; k++) {
        if (group % k || (icg * k) % 8 || (ocg * k) % 8) continue;
        int64_t g2 = group / k, icg2 = icg * k, ocg2 = ocg * k;
        size_t n = (size_t)(M * icg2 * sp);
        float *e = calloc(n, sizeof *e);
        if (!e) return kiln_node_error(cc->node, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
        const float *src = w->data;
        for (int64_t o = 0; o < M; o++) { /* output o's group sits at slot (o % ocg2) / ocg */
            int64_t slot = (o % ocg2) / ocg;
            memcpy(e + (o * icg2 + slot * icg) * sp, src + o * icg * sp,
                   (size_t)(icg * sp) * sizeof *e);
        }
        struct conv_build m = *b;
        int64_t wd[KILN_MAX_RANK + 1];
        int wr = 0;
        if (g2 > 1) wd[wr++] = g2;
        wd[wr++] = ocg2;
        wd[wr++] = icg2;
        for (int i = 2; i < w->rank; i++) wd[wr++] = w->dims[i];
        dnnl_dims_t wdd;
        for (int i = 0; i < wr; i++) wdd[i] = wd[i];
        int h = 0;
        kiln_status st = KILN_OK;
        if (kd_md_plain(&m.wplain, wr, wd) == dnnl_success &&
            dnnl_memory_desc_init_by_tag(&m.wany, wr, wdd, dnnl_f32, dnnl_format_tag_any) ==
                dnnl_success) {
            m.wdata = e;
            snprintf(m.wwhat, sizeof m.wwhat, "conv_gm%lld", (long long)k);
            m.winograd = 0;
            st = kd_exec_build(&s->any_e, kd_work_threads(cc, work * (double)k), conv_make, &m,
                               &h);
        }
        free(e);
        if (st != KILN_OK) return st;
        if (!h) continue;
        if (conv_impl_slow(s->any_e.v[0].impl)) {
            kd_exec_destroy(&s->any_e);
            continue;
        }
        kd_exec_destroy(&s->e);
        s->any = 1;
        s->merged = (int)k;
        s->scratch_total = (kd_exec_scratch(&s->any_e) + 64) / 64 * 64; /* never 0 */
        return KILN_OK;
    }
    return KILN_OK;
}

/* Whether to try oneDNN's Winograd convolution: 2-D 3x3, stride 1, no dilation,
 * no groups (oneDNN itself then requires a blocked layout and AVX-512). It does
 * 2.25x (F(2x2,3x3)) to 4x (F(4x4,3x3)) fewer multiplications than the direct
 * algorithm, which makes resnet18's 3x3 convolutions about 30% faster here, at
 * a rounding error that stays near 1e-6 of the output scale on the model set
 * (tests/python/test_models.py checks 1e-4 against PyTorch). Not on outputs smaller
 * than 4 in H or W: a tile of F(4x4,3x3) then computes mostly padding, and the direct
 * algorithm was measured 2.5x faster on inception_v3's 3x3 convolutions of 2x2 images
 * (0.8-1.0 against 2.4-2.6 ms at batch 8). Where oneDNN then offers its Winograd
 * kernel, conv_winograd_pays still declines it for few channels, tiles much larger than
 * the image, or too little work for tiles of 2. KILN_WINOGRAD=0 in the environment turns it off (the direct algorithm
 * everywhere). */
static int conv_use_winograd(int rank, const int64_t *wdims, const int64_t *ydims,
                             int64_t group, const struct conv_build *b)
{
    const char *e = getenv("KILN_WINOGRAD");
    if (e && !strcmp(e, "0")) return 0;
    if (rank != 4 || group != 1 || wdims[2] != 3 || wdims[3] != 3) return 0;
    if (ydims[2] < 4 || ydims[3] < 4) return 0;
    for (int i = 0; i < 2; i++)
        if (b->strides[i] != 1 || b->dilates[i] != 0) return 0;
    return 1;
}

static int is_f32(const struct kiln_type *t) { return t && t->dtype == KILN_DTYPE_F32; }


/* The checks every kernel of the conv family makes first: f32 types, constant weights, a
 * rank-1 bias, a residual Sum like Y, an activation oneDNN has, groups and a window that
 * resolve (wrongly typed or bad attributes: declined, the reference reports them). */
static bool conv_node_ok(const struct kiln_compile_ctx *cc, int64_t *group_out,
                         struct kiln_window *win)
{
    const struct kiln_node *n = cc->node;
    int fused = n->op == KILN_OP_KilnFusedConv;
    const struct kiln_type *x = cc->in[0], *w = cc->in[1], *y = cc->n_out > 0 ? cc->out[0] : NULL;
    const struct kiln_type *bias = cc->n_in > 2 ? cc->in[2] : NULL;
    const struct kiln_type *sum = fused && cc->n_in > 3 ? cc->in[3] : NULL;
    if (!is_f32(x) || !is_f32(w) || !is_f32(y) || !cc->in_value || !cc->in_value[1]) return false;
    if (bias && (!is_f32(bias) || bias->rank != 1 || bias->dims[0] != w->dims[0])) return false;
    int rank = x->rank;
    if (rank < 3 || rank > 5 || w->rank != rank || y->rank != rank) return false;
    if (kiln_shape_count(rank, x->dims) <= 0 || kiln_shape_count(rank, y->dims) <= 0 ||
        kiln_shape_count(rank, w->dims) <= 0)
        return false;
    if (sum) {
        if (!is_f32(sum) || sum->rank != rank) return false;
        for (int i = 0; i < rank; i++)
            if (sum->dims[i] != y->dims[i]) return false;
        if (kd_layout_of(cc->in_layout, 3) != kd_layout_of(cc->out_layout, 0)) return false;
    }
    /* the activation must be one oneDNN has */
    dnnl_post_ops_t po;
    if (dnnl_post_ops_create(&po) != dnnl_success) return false;
    int act_ok = !fused || kd_append_activation(n, po);
    dnnl_post_ops_destroy(po);
    if (!act_ok) return false;

    int64_t group = kiln_attr_int(n, "group", 1);
    if (kiln_attr_check(n) != KILN_OK) { /* wrongly typed attributes: the reference reports */
        kiln_error_clear();
        return false;
    }
    if (group < 1 || x->dims[1] % group || w->dims[0] % group || x->dims[1] / group != w->dims[1])
        return false;
    if (kiln_window_resolve(n, rank - 2, x->dims + 2, w->dims + 2, false, win) != KILN_OK) {
        kiln_attr_check(n);
        kiln_error_clear();
        return false; /* the reference reports it */
    }
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    *group_out = group;
    return true;
}

bool kd_conv_node_ok(const struct kiln_compile_ctx *cc, int64_t *group_out,
                     struct kiln_window *win)
{
    return conv_node_ok(cc, group_out, win);
}

bool kiln_k_dnnl_conv_covers(const struct kiln_compile_ctx *cc)
{
    int64_t group;
    struct kiln_window win;
    return conv_node_ok(cc, &group, &win);
}

/* Kiln's matrix-vector kernel (simd/pointwise.c) is offered 2-D convolutions of one group
 * with no padding before (it checks the 1x1 images itself). */
bool kiln_k_conv1x1_covers(const struct kiln_compile_ctx *cc)
{
    int64_t group;
    struct kiln_window win;
    return conv_node_ok(cc, &group, &win) && cc->in[0]->rank == 4 && group == 1 &&
           win.pad_begin[0] == 0 && win.pad_begin[1] == 0;
}

/* ---- small images: im2col and a oneDNN matmul ----
 *
 * Where a convolution's output is a few pixels and its weights are large (Inception's
 * last modules on 2x2 and 3x3 images, wide ResNets' 1024-channel 3x3 convolutions on 2x2),
 * the work is reading the weights once, and oneDNN's direct kernels read them at a
 * fraction of the memory bandwidth (inception_v3's 1x3 convolutions of 384 channels on 2x2
 * images: 10 GB/s on one thread, where a matmul of the same weights streamed 42 GB/s).
 * There the node runs as im2col into the kernel's scratch (rows: the batch's output
 * pixels; columns: (c, ky, kx), as the OIHW weight is stored, padding taps 0), one oneDNN
 * matmul with the weight packed once (format "any" from its [K, M] transpose), bias and
 * activation as post-ops, and a copy of the [pixels, M] result into Y's layout (blocked
 * padding channels 0). Taken for 2-D convolutions of one group with no Sum input, a
 * kernel larger than 1x1, at most CGEMM_MAX_PIXELS output pixels per image and
 * CGEMM_MAX_ROWS in the batch, whose weight is at least CGEMM_MIN_WEIGHT_BYTES. Measured
 * one thread, batch 1, per node against the direct kernel (busy machine): 3x3, 1x3 and 3x1
 * convolutions on 2x2 and 3x3 images 1.2-3.9x faster (wide_resnet50_2's 1024-channel 3x3
 * on 2x2: 2.2-2.7 -> 1.5 ms), but 1x1 convolutions 1.2-2x slower (the direct kernel reads
 * their weights well) and 3x3 convolutions of 512 channels on 4x4 images 1.1-1.2x slower.
 * The product runs on Kiln's skinny kernel (simd/skinny.c: B streamed once from panels,
 * bias and activation after, split by output channels) where the SIMD table has the
 * activation, else on the oneDNN matmul (KILN_SKINNY=0 forces that): wide_resnet50_2's
 * 3x3 convolutions of 1024 channels on 2x2 images went from 2.9 to 2.0 ms (2 threads,
 * AVX2). On the skinny kernel the path also takes 10 to CGEMM_SKINNY_MAX_PIXELS output
 * pixels where the weight is at least CGEMM_SKINNY_MIN_WEIGHT_BYTES: wide_resnet50_2's 3x3
 * convolutions of 512 channels on 4x4 images (9.4 MB of weights each, batch 1) went from
 * 0.61-0.68 to 0.53-0.57 ms (2 threads, AVX-512, quiet machine), the model about 3% and
 * inception_v3 4-10%; oneDNN's matmul stays slower there than the direct kernel, and so
 * does the skinny kernel on weights that stay in cache (densenet121's 147 KB 3x3
 * convolutions on 4x4 images: the model 25% slower).
 * KILN_CONV_GEMM=0 in the environment turns the whole path off. */
#define CGEMM_MAX_PIXELS 9
#define CGEMM_SKINNY_MAX_PIXELS 16
#define CGEMM_SKINNY_MIN_WEIGHT_BYTES (1024 * 1024)
#define CGEMM_MAX_ROWS 16
#define CGEMM_MIN_WEIGHT_BYTES (128 * 1024)

struct cgemm_state {
    struct kd_exec e;
    int skinny;             /* the product on Kiln's streaming kernel (sk), not oneDNN's */
    struct kiln_skinny sk;
    int64_t n, c, h, w, m, oh, ow, kh, kw, sh, sw, dh, dw, ph, pw;
    int64_t xb, yb, xc, yc; /* channel blocks (0: plain) and stored channels of X and Y */
    size_t col_off, dst_off, total;
};

struct cgemm_build {
    const struct kiln_compile_ctx *cc;
    dnnl_memory_desc_t src, wplain, bias, dst;
    int has_bias;
};

static kiln_status cgemm_make(void *arg, struct kd_variant *v, int threads)
{
    struct cgemm_build *b = arg;
    const struct kiln_node *n = b->cc->node;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    kiln_status st = KILN_OK;
    dnnl_memory_desc_t wany;
    dnnl_matmul_desc_t d;
    dnnl_status_t r = dnnl_memory_desc_init_by_tag(&wany, 2, b->wplain.dims, dnnl_f32,
                                                   dnnl_format_tag_any);
    if (r == dnnl_success)
        r = dnnl_matmul_desc_init(&d, &b->src, &wany, b->has_bias ? &b->bias : NULL, &b->dst);
    if (r == dnnl_success) r = dnnl_primitive_attr_create(&attr);
    if (r == dnnl_success) r = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (r == dnnl_success) r = dnnl_post_ops_create(&po);
    if (r == dnnl_success && n->op == KILN_OP_KilnFusedConv && !kd_append_activation(n, po))
        goto out;
    if (r == dnnl_success) r = dnnl_primitive_attr_set_post_ops(attr, po);
    if (r == dnnl_success) r = kd_pd_create(&pd, &d, attr);
    if (r != dnnl_success || kd_pd_is_ref(pd)) goto out; /* the direct convolution runs it */
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_memory_desc_t wpad;
    if (kd_md_pad_rows(wmd, &wpad)) { /* output channels a multiple of 1024: as matmul.c */
        dnnl_matmul_desc_t d2;
        dnnl_primitive_desc_t pd2 = NULL;
        if (dnnl_matmul_desc_init(&d2, &b->src, &wpad, b->has_bias ? &b->bias : NULL,
                                  &b->dst) == dnnl_success &&
            kd_pd_create(&pd2, &d2, attr) == dnnl_success &&
            !kd_pd_is_ref(pd2)) {
            dnnl_primitive_desc_destroy(pd);
            pd = pd2;
            wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        } else if (pd2) {
            dnnl_primitive_desc_destroy(pd2);
        }
    }
    st = kd_pack_weights(b->cc, b->cc->in_value[1], "conv_gemm", &b->wplain, wmd, 1.0f,
                         &v->packed);
    if (st != KILN_OK || !v->packed) goto out;
    st = kd_variant_init(n, pd, v);
    if (st != KILN_OK) goto out;
    /* the columns and the product live in the kernel's scratch after oneDNN's scratchpad
     * (offsets relative until cgemm_compile adds the base) */
    kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_SCRATCH_AT, 0, &b->src);
    kd_variant_arg(v, DNNL_ARG_WEIGHTS, KD_SRC_PACKED, 1, wmd);
    if (b->has_bias) kd_variant_arg(v, DNNL_ARG_BIAS, KD_SRC_IN, 2, &b->bias);
    kd_variant_arg(v, DNNL_ARG_DST, KD_SRC_SCRATCH_AT,
                   (int)((dnnl_memory_desc_get_size(&b->src) + 63) / 64 * 64), &b->dst);
out:
    (void)threads;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st;
}

static kiln_status cgemm_run(void *state, struct kiln_run_ctx *ctx)
{
    struct cgemm_state *s = state;
    struct kiln_run_ctx c2 = *ctx;
    void *heap = NULL;
    if (!c2.scratch) { /* callers without a plan arena */
        heap = c2.scratch = aligned_alloc(64, s->total);
        if (!heap) return kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY, "out of memory for scratch");
    }
    const float *x = ctx->in[0]->data;
    float *col = (float *)((char *)c2.scratch + s->col_off);
    const float *dst = (const float *)((char *)c2.scratch + s->dst_off);
    int64_t P = s->oh * s->ow, K = s->c * s->kh * s->kw;
    /* im2col: col[n * P + p][(c * kh + ky) * kw + kx] */
    for (int64_t n = 0; n < s->n; n++)
        for (int64_t oy = 0; oy < s->oh; oy++)
            for (int64_t ox = 0; ox < s->ow; ox++) {
                float *row = col + (n * P + oy * s->ow + ox) * K;
                for (int64_t c = 0; c < s->c; c++) {
                    const float *xc;
                    int64_t step;
                    if (s->xb) {
                        xc = x + ((n * (s->xc / s->xb) + c / s->xb) * s->h * s->w) * s->xb + c % s->xb;
                        step = s->xb;
                    } else {
                        xc = x + (n * s->c + c) * s->h * s->w;
                        step = 1;
                    }
                    for (int64_t ky = 0; ky < s->kh; ky++) {
                        int64_t iy = oy * s->sh - s->ph + ky * s->dh;
                        float *o = row + (c * s->kh + ky) * s->kw;
                        if (iy < 0 || iy >= s->h) {
                            memset(o, 0, (size_t)s->kw * sizeof(float));
                            continue;
                        }
                        for (int64_t kx = 0; kx < s->kw; kx++) {
                            int64_t ix = ox * s->sw - s->pw + kx * s->dw;
                            o[kx] = ix >= 0 && ix < s->w ? xc[(iy * s->w + ix) * step] : 0.0f;
                        }
                    }
                }
            }
    kiln_status st = KILN_OK;
    if (s->skinny)
        kiln_skinny_run(&s->sk, col, K, ctx->n_in > 2 && ctx->in[2] ? ctx->in[2]->data : NULL,
                        NULL, 0, (float *)dst, s->m, ctx->threads);
    else
        st = kd_exec_run(&s->e, &c2);
    if (st == KILN_OK) { /* [n * P + p][m] -> Y */
        float *y = ctx->out[0]->data;
        for (int64_t n = 0; n < s->n; n++) {
            const float *dn = dst + n * P * s->m;
            if (!s->yb) {
                float *yn = y + n * s->m * P;
                for (int64_t p = 0; p < P; p++)
                    for (int64_t m = 0; m < s->m; m++) yn[m * P + p] = dn[p * s->m + m];
                continue;
            }
            for (int64_t cb = 0; cb < s->yc / s->yb; cb++) {
                float *yb = y + (n * (s->yc / s->yb) + cb) * P * s->yb;
                int64_t m0 = cb * s->yb, nm = s->m - m0 < s->yb ? s->m - m0 : s->yb;
                for (int64_t p = 0; p < P; p++) {
                    memcpy(yb + p * s->yb, dn + p * s->m + m0, (size_t)nm * sizeof(float));
                    if (nm < s->yb) memset(yb + p * s->yb + nm, 0, (size_t)(s->yb - nm) * sizeof(float));
                }
            }
        }
    }
    free(heap);
    return st;
}

static void cgemm_destroy(void *state)
{
    struct cgemm_state *s = state;
    if (!s->skinny) kd_exec_destroy(&s->e);
    free(s);
}

/* The im2col matmul for cc's convolution where the section comment says it applies;
 * inst->run stays NULL otherwise. */
static kiln_status cgemm_compile(const struct kiln_compile_ctx *cc, int64_t group,
                                 const struct kiln_window *win, struct kiln_kernel_inst *inst)
{
    const char *env = getenv("KILN_CONV_GEMM");
    const struct kiln_type *x = cc->in[0], *w = cc->in[1], *y = cc->out[0];
    int fused = cc->node->op == KILN_OP_KilnFusedConv;
    if ((env && !strcmp(env, "0")) || x->rank != 4 || group != 1) return KILN_OK;
    if (fused && cc->n_in > 3 && cc->in[3]) return KILN_OK; /* residual Sum */
    if (cc->precision != KILN_PRECISION_FP32) return KILN_OK;
    int64_t P = y->dims[2] * y->dims[3], R = y->dims[0] * P;
    int64_t K = w->dims[1] * w->dims[2] * w->dims[3], M = w->dims[0];
    if (w->dims[2] * w->dims[3] == 1 || P > CGEMM_SKINNY_MAX_PIXELS || R > CGEMM_MAX_ROWS ||
        (double)K * (double)M * sizeof(float) < CGEMM_MIN_WEIGHT_BYTES)
        return KILN_OK;
    int lx = kd_layout_of(cc->in_layout, 0), ly = kd_layout_of(cc->out_layout, 0);
    if ((lx && lx != 8 && lx != 16) || (ly && ly != 8 && ly != 16)) return KILN_OK;
    struct cgemm_build b;
    memset(&b, 0, sizeof b);
    b.cc = cc;
    b.has_bias = cc->n_in > 2 && cc->in[2] != NULL;
    int64_t sd[2] = {R, K}, dd[2] = {R, M}, bd[2] = {1, M};
    dnnl_dims_t wd = {K, M};
    if (kd_md_plain(&b.src, 2, sd) != dnnl_success || kd_md_plain(&b.dst, 2, dd) != dnnl_success ||
        (b.has_bias && kd_md_plain(&b.bias, 2, bd) != dnnl_success) ||
        dnnl_memory_desc_init_by_tag(&b.wplain, 2, wd, dnnl_f32, dnnl_ba) != dnnl_success)
        return KILN_OK;
    struct cgemm_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_node_error(cc->node, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    /* up to KILN_SKINNY_MAX_M rows (CGEMM_MAX_ROWS is no more): the product on Kiln's
     * streaming kernel (simd/skinny.c) where the SIMD table has the activation */
    int has_act = 0;
    enum simd_unary act = SIMD_RELU;
    float act_alpha = 0, act_beta = 0;
    size_t base = 0;
    int skinny = R <= KILN_SKINNY_MAX_M && kiln_skinny_enabled() &&
                 kiln_simd_fused_activation(cc->node, &has_act, &act, &act_alpha, &act_beta);
    /* 10-16 pixels: only where the skinny kernel runs and the weights are large */
    if (P > CGEMM_MAX_PIXELS &&
        (!skinny || (double)K * (double)M * sizeof(float) < CGEMM_SKINNY_MIN_WEIGHT_BYTES)) {
        free(s);
        return KILN_OK;
    }
    if (skinny) {
        kiln_status st = kiln_skinny_init(&s->sk, cc->weights, cc->in_value[1], R, K, M, 1, 1.0f);
        if (st != KILN_OK) {
            free(s);
            return st;
        }
        s->skinny = 1;
        kiln_skinny_set_act(&s->sk, has_act, act, act_alpha, act_beta);
    } else {
        int handled = 0;
        kiln_status st = kd_exec_build(&s->e, kd_work_threads(cc, 2.0 * (double)R * (double)K * (double)M),
                                       cgemm_make, &b, &handled);
        if (st != KILN_OK || !handled) {
            free(s);
            return st;
        }
        base = (kd_exec_scratch(&s->e) + 63) / 64 * 64;
        kd_exec_shift_scratch(&s->e, base);
    }
    s->col_off = base;
    s->dst_off = base + (dnnl_memory_desc_get_size(&b.src) + 63) / 64 * 64;
    s->total = s->dst_off + (dnnl_memory_desc_get_size(&b.dst) + 63) / 64 * 64;
    s->n = x->dims[0];
    s->c = x->dims[1];
    s->h = x->dims[2];
    s->w = x->dims[3];
    s->m = M;
    s->oh = y->dims[2];
    s->ow = y->dims[3];
    s->kh = w->dims[2];
    s->kw = w->dims[3];
    s->sh = win->stride[0];
    s->sw = win->stride[1];
    s->dh = win->dilation[0];
    s->dw = win->dilation[1];
    s->ph = win->pad_begin[0];
    s->pw = win->pad_begin[1];
    s->xb = lx;
    s->yb = ly;
    s->xc = kiln_layout_channels(s->c, lx);
    s->yc = kiln_layout_channels(M, ly);
    if (s->skinny) {
        inst->name = fused ? "f32_skinny_fused_conv" : "f32_skinny_conv";
    } else {
        inst->name = fused ? "dnnl_fused_conv_gemm" : "dnnl_conv_gemm";
        kd_inst_impl(inst, &s->e);
        char impl[sizeof inst->impl];
        snprintf(impl, sizeof impl, "matmul:%.39s", inst->impl);
        snprintf(inst->impl, sizeof inst->impl, "%s", impl);
    }
    inst->state = s;
    inst->run = cgemm_run;
    inst->destroy = cgemm_destroy;
    inst->scratch_bytes = s->total;
    inst->packed = 1u << 1;
    return KILN_OK;
}

static kiln_status conv_compile_dense(const struct kiln_compile_ctx *cc,
                                      struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    int fused = n->op == KILN_OP_KilnFusedConv;
    const struct kiln_type *x = cc->in[0], *w = cc->in[1], *y = cc->n_out > 0 ? cc->out[0] : NULL;
    const struct kiln_type *bias = cc->n_in > 2 ? cc->in[2] : NULL;
    const struct kiln_type *sum = fused && cc->n_in > 3 ? cc->in[3] : NULL;
    int64_t group;
    struct kiln_window win;
    if (!conv_node_ok(cc, &group, &win)) return KILN_OK;
    int rank = x->rank, nsp = rank - 2;
    for (int i = 0; i < nsp; i++)
        if (win.out[i] != y->dims[i + 2]) return KILN_OK;
    kiln_status gst = cgemm_compile(cc, group, &win, inst);
    if (gst != KILN_OK || inst->run) return gst;
    struct conv_build b;
    memset(&b, 0, sizeof b);
    b.cc = cc;
    b.has_bias = bias != NULL;
    b.has_sum = sum != NULL;
    for (int i = 0; i < nsp; i++) {
        if (win.out[i] != y->dims[i + 2]) return KILN_OK;
        b.strides[i] = win.stride[i];
        b.dilates[i] = win.dilation[i] - 1;
        b.pad_l[i] = win.pad_begin[i];
        b.pad_r[i] = win.pad_end[i];
    }
    if (kd_md_act(&b.src, rank, x->dims, kd_layout_of(cc->in_layout, 0)) != dnnl_success ||
        kd_md_act(&b.dst, rank, y->dims, kd_layout_of(cc->out_layout, 0)) != dnnl_success)
        return KILN_OK;
    /* weights: [M, C/g, k...], or [g, M/g, C/g, k...] for grouped convs */
    int64_t wd[KILN_MAX_RANK + 1];
    int wr = 0;
    if (group > 1) wd[wr++] = group;
    wd[wr++] = w->dims[0] / group;
    for (int i = 1; i < rank; i++) wd[wr++] = w->dims[i];
    dnnl_dims_t wdd;
    for (int i = 0; i < wr; i++) wdd[i] = wd[i];
    if (kd_md_plain(&b.wplain, wr, wd) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&b.wany, wr, wdd, dnnl_f32, dnnl_format_tag_any) !=
            dnnl_success)
        return KILN_OK;
    if (bias && kd_md_plain(&b.bias, 1, bias->dims) != dnnl_success) return KILN_OK;
    b.winograd = conv_use_winograd(rank, w->dims, y->dims, group, &b);
    double work = 2.0 * (double)kiln_shape_count(y->rank, y->dims) *
                  (double)kiln_shape_count(w->rank, w->dims) / (double)w->dims[0];
    if (cc->precision == KILN_PRECISION_INT8 && group == 1) {
        kiln_status st = conv8_compile(&b, cc->in_value[1], work, inst);
        if (st != KILN_OK || inst->run) return st;
    }

    b.post_act = fused ? kd_deferred_activation(n) : 0;
    struct conv_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    s->post_act = b.post_act;
    int handled = 0;
    kiln_status st = KILN_OK;
    if (cc->precision == KILN_PRECISION_BF16 &&
        dnnl_memory_desc_get_size(&b.src) / 2 < (size_t)INT32_MAX / 2) { /* int offsets */
        b.bf16 = 1;
        st = kd_exec_build(&s->e, kd_work_threads(cc, work), conv_make, &b, &handled);
        if (st != KILN_OK) {
            free(s);
            return st;
        }
        if (handled) {
            s->bf16 = 1;
            s->src_elems = dnnl_memory_desc_get_size(&b.src) / sizeof(float);
            s->base = (kd_exec_scratch(&s->e) + 63) / 64 * 64;
            s->scratch_total = s->base + (s->src_elems * 2 + 63) / 64 * 64;
            for (int vi = 0; vi < s->e.nv; vi++) /* the bf16 X after oneDNN's scratchpad */
                for (int k = 0; k < s->e.v[vi].nargs; k++)
                    if (s->e.v[vi].args[k].src == KD_SRC_SCRATCH_AT)
                        s->e.v[vi].args[k].index += (int)s->base;
        }
        b.bf16 = 0;
    }
    if (!handled) st = kd_exec_build(&s->e, kd_work_threads(cc, work), conv_make, &b, &handled);
    if (st != KILN_OK || !handled) {
        free(s);
        return st;
    }
    s->has_sum = b.has_sum;
    s->dst_bytes = dnnl_memory_desc_get_size(&b.dst);
    st = conv_try_merge(&b, s, group, work);
    if (st == KILN_OK) st = conv_try_any(&b, s, work);
    if (st != KILN_OK) {
        conv_destroy(s);
        return st;
    }
    inst->name = s->bf16     ? (fused ? "dnnl_fused_conv_bf16" : "dnnl_conv_bf16")
                 : s->merged ? (fused ? "dnnl_fused_conv_merged" : "dnnl_conv_merged")
                 : s->any    ? (fused ? "dnnl_fused_conv_any" : "dnnl_conv_any")
                          : (fused ? "dnnl_fused_conv" : "dnnl_conv");
    kd_inst_impl(inst, s->any ? &s->any_e : &s->e);
    inst->state = s;
    inst->run = conv_run;
    inst->destroy = conv_destroy;
    inst->scratch_bytes = s->bf16 || s->any ? s->scratch_total : kd_exec_scratch(&s->e);
    inst->packed = 1u << 1; /* every variant runs on the packed weights */
    if (s->has_sum) { /* Y may be written over Sum: the sum post-op then needs no copy */
        inst->inplace = 1;
        inst->inplace_input = 3;
    }
    return KILN_OK;
}

kiln_status kiln_k_dnnl_conv_compile(const struct kiln_compile_ctx *cc,
                                     struct kiln_kernel_inst *inst)
{
    return conv_compile_dense(cc, inst);
}

/* The dense kernel the family would choose after the sparse one: the matrix-vector
 * kernel where it covers the node, then the split by output channels (conv_split.c),
 * else oneDNN's convolution. */
static kiln_status conv_compile_dense_best(const struct kiln_compile_ctx *cc,
                                           struct kiln_kernel_inst *inst)
{
    if (kiln_k_conv1x1_covers(cc)) {
        kiln_status st = kiln_simd_pointwise_compile(cc, inst);
        if (st != KILN_OK || inst->run) return st;
    }
    if (kiln_k_dnnl_conv_split_covers(cc)) {
        kiln_status st = kiln_k_dnnl_conv_split_compile(cc, inst);
        if (st != KILN_OK || inst->run) return st;
    }
    return conv_compile_dense(cc, inst);
}

/* The sparse entry of the family (conv.def, first): a 1x1 convolution of one group.
 * Where its constant weight is mostly zero, the sparse kernel and the best dense one
 * are both compiled and timed on the node's shape and layouts, and the faster one
 * runs (src/kernels/sparse/conv.c); otherwise the dense one, as if this entry were
 * not there. */
bool kiln_k_sparse_conv_covers(const struct kiln_compile_ctx *cc)
{
    int64_t group;
    struct kiln_window win;
    if (!conv_node_ok(cc, &group, &win) || group != 1) return false;
    const struct kiln_type *w = cc->in[1];
    for (int i = 2; i < w->rank; i++)
        if (w->dims[i] != 1) return false;
    return true;
}

kiln_status kiln_k_sparse_conv_compile(const struct kiln_compile_ctx *cc,
                                       struct kiln_kernel_inst *inst)
{
    return kiln_sparse_conv_select(cc, inst, conv_compile_dense_best);
}

/* Layout pass: X, Sum and Y may be blocked (the plan then passes their layouts). */
int kiln_k_dnnl_conv_accepts(const struct kiln_node *n, int i, int block)
{
    if (block != 8 && block != 16) return 0;
    if (i == 1 || i == 2) return 0;
    if (i == 3 && n->op != KILN_OP_KilnFusedConv) return 0;
    if (n->op == KILN_OP_KilnFusedConv) {
        dnnl_post_ops_t po;
        if (dnnl_post_ops_create(&po) != dnnl_success) return 0;
        int ok = kd_append_activation(n, po);
        dnnl_post_ops_destroy(po);
        if (kiln_attr_check(n) != KILN_OK) { /* reported again when the node runs */
            kiln_error_clear();
            ok = 0;
        }
        if (!ok) return 0;
    }
    return 1;
}


