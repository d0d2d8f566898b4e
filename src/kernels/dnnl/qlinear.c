/*
 * qlinear.c - oneDNN int8 kernels for models that arrive quantized:
 * QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger and Kiln's
 * KilnQLinearMatMul (what the qdq_fusion pass, src/opt/qdq.c, makes of QDQ
 * MatMul / Gemm): the quant family (qlinear.def). Their reference kernels
 * are in src/kernels/ref/ (conv.c, matmul.c, qlinear_fused.c);
 * docs/COMPRESSION.md, "Pre-quantized models".
 *
 * One oneDNN int8 primitive per node, integers in and integers out:
 *   acc = sum (x - x_zp) * w  [+ bias]                         (s32, exact)
 *   QLinear*:  y = saturate(round_half_even(float(acc) * mult[n]) + y_zp)
 *   *Integer:  y = acc                                            (s32)
 * with mult[n] = float32(float32(x_scale * w_scale[n]) / y_scale) as
 * constant output scales (one value, or one per output channel), the
 * zero points as oneDNN run-time zero points (x_zp may be a run-time
 * scalar, as DynamicQuantizeLinear hands it to MatMulInteger), the int32
 * bias as oneDNN's bias (added to the accumulator before the scales in
 * oneDNN 2.x). The reference computes float(acc) * mult in double and adds
 * y_zp after rounding; the float product here can differ from it by one
 * unit in the last place, so a value within about 1e-7 relative of a
 * rounding midpoint may come out one step apart: the int32 results are
 * bit-exact, the 8-bit ones within one step (tests/python/test_qdq.py).
 *
 * Taken: 8-bit x, constant s8 weights whose zero points are all 0 (what
 * PyTorch and ONNX Runtime write: symmetric weights), constant scales and
 * y_zp for the QLinear ops; products with a 2-D B (A's leading dims are
 * rows); 2-D convolutions of any group count. oneDNN's fast int8
 * convolutions want channels-last tensors, so X is transposed from NCHW
 * into scratch and Y back (8-bit copies). A kernel oneDNN would run
 * without VNNI or AMX dot products (whose 16-bit pair sums can saturate)
 * or on its reference code is declined, and the node runs on the
 * reference kernel.
 *
 * KilnQLinearConvAdd (src/opt/qconv_sum.c: a QLinearConv whose output a
 * feeds a KilnQLinearAdd with b): the same convolution with the Add as
 * post-ops after the output scales,
 *   a' = clip(round(acc * mult), lo_a - a_zp, hi_a - a_zp)   (= a - a_zp exactly)
 *   s  = a' * (a_scale / y_scale) + (b - b_zp) * (b_scale / y_scale)  (sum post-op)
 *   y  = saturate(round(max(s, 0) or s) + y_zp)
 * where the sum post-op reads b from Y: b is copied into Y first (or, Y
 * stored NCHW, transposed into the NHWC scratch the convolution writes),
 * unless the plan placed Y over b (inplace_input 9). Against the reference
 * (QLinearConv, then the Add's float32 (a - a_zp) * a_scale + (b - b_zp) *
 * b_scale divided by y_scale) the two scale ratios round differently, so a
 * sum within a float32 ulp of a rounding midpoint may land one step apart:
 * within one step, as the convolution's own requantization.
 * Where oneDNN has no kernel for that chain the convolution writes a into
 * scratch and the run adds b to it in the reference's arithmetic
 * ("dnnl_qlinear_conv_add"; the sum post-op is "dnnl_qlinear_conv_sum").
 */
#include <stdlib.h>

#include "kernels/dnnl/dnnl_common.h"
#include "kernels/family.h"
#include "kernels/ref/gemm.h"

#define Q_ALIGN64(x) (((x) + 63) / 64 * 64)

struct q_state {
    struct kd_exec e;
    struct kd_exec pre_x, post_y; /* conv: oneDNN reorders X NCHW -> NHWC, Y back */
    int conv;                   /* transpose X to NHWC and Y back */
    int x_cl, y_cl;             /* conv: X / Y already stored NHWC (KILN_LAYOUT_NHWC) */
    int has_pre, has_post;      /* conv: pre_x / post_y built (else transpose_cl) */
    int64_t n, c, hw, oc, ohw;  /* conv: batch, channels, pixels in and out */
    size_t ybytes;              /* bytes per Y element (1 or 4) */
    int xzp_index;              /* input holding x's zero point, or -1 (0) */
    int32_t xzp_const;          /* its value when constant */
    int xzp_runtime;            /* read x_zp from the input at each run */
    int32_t yzp;                /* y's zero point (QLinear), used when has_yzp */
    int has_xzp, has_yzp;
    int qsum;                   /* KilnQLinearConvAdd: 1 sum post-op, 2 conv then add here */
    int relu;                   /* qsum: the Add's Relu */
    size_t ybytes_all;          /* qsum: bytes of Y (the copy of b into Y) */
    float qa_scale, qa_zp, qb_scale, qb_zp, qy_scale, qy_zp, qy_lo, qy_hi; /* qsum == 2 */
    int qa_signed, qb_signed, qy_signed;
    size_t base;                /* scratch offset of the kernel's own buffers */
    size_t x_rel, y_rel, zp_rel;
    size_t scratch_total;
};

struct q_build {
    const struct kiln_compile_ctx *cc;
    int conv, widx, bidx;       /* weight input, bias input (-1 none) */
    int x_cl, y_cl;             /* conv: X / Y are the plan's NHWC values themselves */
    dnnl_memory_desc_t src, wplain, bias, dst, zpmd;
    const float *scales;        /* NULL: no output scales (Integer ops) */
    int nscales;
    int has_xzp, has_yzp;
    int sum;                    /* KilnQLinearConvAdd with the sum post-op chain below */
    float clip_lo, clip_hi;     /* sum: a - a_zp's range (a's saturation) */
    float lin, sum_scale;       /* sum: a_scale / y_scale, b_scale / y_scale */
    int32_t sum_zp;             /* sum: b's zero point */
    int relu;
    size_t x_rel, y_rel, zp_rel; /* relative to the kernel's base */
    dnnl_dims_t strides, dilates, pad_l, pad_r;
};

static kiln_status q_make(void *arg, struct kd_variant *v, int threads)
{
    struct q_build *b = arg;
    const struct kiln_node *n = b->cc->node;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    kiln_status st = KILN_OK;
    dnnl_memory_desc_t wany;
    dnnl_status_t r = dnnl_memory_desc_init_by_tag(&wany, b->wplain.ndims, b->wplain.dims, dnnl_s8,
                                                   dnnl_format_tag_any);
    const dnnl_memory_desc_t *bias = b->bidx >= 0 ? &b->bias : NULL;
    union {
        dnnl_matmul_desc_t mm;
        dnnl_convolution_desc_t cv;
    } d;
    if (r == dnnl_success && b->conv)
        r = dnnl_dilated_convolution_forward_desc_init(
            &d.cv, dnnl_forward_inference, dnnl_convolution_direct, &b->src, &wany, bias, &b->dst,
            b->strides, b->dilates, b->pad_l, b->pad_r);
    else if (r == dnnl_success)
        r = dnnl_matmul_desc_init(&d.mm, &b->src, &wany, bias, &b->dst);
    if (r == dnnl_success) r = dnnl_primitive_attr_create(&attr);
    if (r == dnnl_success) r = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (r == dnnl_success && b->scales)
        r = dnnl_primitive_attr_set_output_scales(attr, b->nscales, b->nscales > 1 ? 1 << 1 : 0,
                                                  b->scales);
    if (r == dnnl_success && b->has_xzp)
        r = dnnl_primitive_attr_set_zero_points(attr, DNNL_ARG_SRC, 1, 0, &DNNL_RUNTIME_S32_VAL);
    if (r == dnnl_success && b->has_yzp)
        r = dnnl_primitive_attr_set_zero_points(attr, DNNL_ARG_DST, 1, 0, &DNNL_RUNTIME_S32_VAL);
    if (r == dnnl_success && b->sum) {
        /* after the output scales: a - a_zp = clip(round(acc * m)), then
         * (a - a_zp) * a_scale / y_scale + (b - b_zp) * b_scale / y_scale, Relu, round;
         * the destination's zero point (y_zp) is added after the chain */
        dnnl_post_ops_t po = NULL;
        r = dnnl_post_ops_create(&po);
        if (r == dnnl_success) r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_round, 0, 0);
        if (r == dnnl_success)
            r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_clip, b->clip_lo, b->clip_hi);
        if (r == dnnl_success)
            r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, b->lin, 0.0f);
        if (r == dnnl_success)
            r = dnnl_post_ops_append_sum_v3(po, b->sum_scale, b->sum_zp, dnnl_data_type_undef);
        if (r == dnnl_success && b->relu)
            r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0, 0);
        if (r == dnnl_success) r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_round, 0, 0);
        if (r == dnnl_success) r = dnnl_primitive_attr_set_post_ops(attr, po);
        if (po) dnnl_post_ops_destroy(po);
    }
    if (r == dnnl_success) r = kd_pd_create(&pd, &d, attr);
    if (r != dnnl_success) goto out; /* the reference runs it */
    if (kd_pd_is_ref(pd) || !kd_pd_int8_exact(pd)) goto out;
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    st = kd_pack_weights(b->cc, b->cc->in_value[b->widx], b->conv ? "qconv_s8" : "qmatmul_s8",
                         &b->wplain, wmd, 1.0f, &v->packed);
    if (st != KILN_OK || !v->packed) goto out;
    st = kd_variant_init(n, pd, v);
    if (st != KILN_OK) goto out;
    if (b->conv) {
        if (b->x_cl) kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_IN, 0, &b->src);
        else kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_SCRATCH_AT, (int)b->x_rel, &b->src);
        if (b->y_cl) kd_variant_arg(v, DNNL_ARG_DST, KD_SRC_OUT, 0, &b->dst);
        else kd_variant_arg(v, DNNL_ARG_DST, KD_SRC_SCRATCH_AT, (int)b->y_rel, &b->dst);
    } else {
        kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_IN, 0, &b->src);
        kd_variant_arg(v, DNNL_ARG_DST, KD_SRC_OUT, 0, &b->dst);
    }
    kd_variant_arg(v, DNNL_ARG_WEIGHTS, KD_SRC_PACKED, b->widx, wmd);
    if (bias) kd_variant_arg(v, DNNL_ARG_BIAS, KD_SRC_IN, b->bidx, bias);
    if (b->has_xzp)
        kd_variant_arg(v, DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, KD_SRC_SCRATCH_AT,
                       (int)b->zp_rel, &b->zpmd);
    if (b->has_yzp)
        kd_variant_arg(v, DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, KD_SRC_SCRATCH_AT,
                       (int)b->zp_rel + 64, &b->zpmd);
out:
    (void)threads;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st;
}

/* NCHW -> NHWC (to = 1) or back, of 8-bit or 32-bit elements, in 64 x 64 tiles (typed
 * loads and stores: the per-element copies this replaced cost more than the int8
 * convolutions themselves on large feature maps). */
#define Q_TILE 64
#define Q_TRANSPOSE(T)                                                                    \
    do {                                                                                  \
        const T *sb = (const T *)src + b * c * hw;                                        \
        T *db = (T *)dst + b * c * hw;                                                    \
        for (int64_t c0 = 0; c0 < c; c0 += Q_TILE)                                        \
            for (int64_t p0 = 0; p0 < hw; p0 += Q_TILE) {                                 \
                int64_t c1 = c0 + Q_TILE < c ? c0 + Q_TILE : c;                           \
                int64_t p1 = p0 + Q_TILE < hw ? p0 + Q_TILE : hw;                         \
                if (to)                                                                   \
                    for (int64_t p = p0; p < p1; p++)                                     \
                        for (int64_t ch = c0; ch < c1; ch++) db[p * c + ch] = sb[ch * hw + p]; \
                else                                                                      \
                    for (int64_t ch = c0; ch < c1; ch++)                                  \
                        for (int64_t p = p0; p < p1; p++) db[ch * hw + p] = sb[p * c + ch]; \
            }                                                                             \
    } while (0)

static void transpose_cl(const void *src, void *dst, int64_t n, int64_t c, int64_t hw,
                         size_t es, int to)
{
    for (int64_t b = 0; b < n; b++) {
        if (es == 1) Q_TRANSPOSE(uint8_t);
        else Q_TRANSPOSE(uint32_t);
    }
}

/* qsum == 2 (oneDNN declined the sum post-op chain): y = Q(act(DQ(a) + DQ(b))) in the
 * float32 arithmetic of the reference KilnQLinearAdd (src/kernels/ref/qlinear_add.c). */
static float q_get(const void *p, int64_t i, int is_signed)
{
    return is_signed ? (float)((const int8_t *)p)[i] : (float)((const uint8_t *)p)[i];
}

static void qsum_add(const struct q_state *s, const void *a, const void *b, void *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float fa = (q_get(a, i, s->qa_signed) - s->qa_zp) * s->qa_scale;
        float fb = (q_get(b, i, s->qb_signed) - s->qb_zp) * s->qb_scale;
        float v = fa + fb;
        if (s->relu && !(v >= 0.0f)) v = isnan(v) ? v : 0.0f;
        double r = rint((double)(v / s->qy_scale)) + (double)s->qy_zp;
        r = isnan(r) ? 0 : r < s->qy_lo ? s->qy_lo : r > s->qy_hi ? s->qy_hi : r;
        if (s->qy_signed) ((int8_t *)y)[i] = (int8_t)r;
        else ((uint8_t *)y)[i] = (uint8_t)r;
    }
}

static kiln_status q_run(void *state, struct kiln_run_ctx *ctx)
{
    struct q_state *s = state;
    struct kiln_run_ctx c2 = *ctx;
    void *heap = NULL;
    if (!c2.scratch) { /* callers without a plan arena */
        heap = c2.scratch = aligned_alloc(64, s->scratch_total);
        if (!heap)
            return kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY, "out of memory for scratch");
    }
    char *base = (char *)c2.scratch + s->base;
    if (s->has_xzp) {
        int32_t z = s->xzp_const;
        if (s->xzp_runtime) {
            const kiln_tensor *t = ctx->in[s->xzp_index];
            if (kiln_tensor_count(t) != 1) {
                free(heap);
                return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                       "x zero point has %lld values, expected 1",
                                       (long long)kiln_tensor_count(t));
            }
            z = (int32_t)kiln_get_i64(t->dtype, t->data, 0);
        }
        memcpy(base + s->zp_rel, &z, sizeof z);
    }
    if (s->has_yzp) memcpy(base + s->zp_rel + 64, &s->yzp, sizeof s->yzp);
    kiln_status st = KILN_OK;
    if (s->x_cl) (void)0;
    else if (s->has_pre) st = kd_exec_run(&s->pre_x, &c2);
    else if (s->conv) transpose_cl(ctx->in[0]->data, base + s->x_rel, s->n, s->c, s->hw, 1, 1);
    /* the sum post-op adds to what Y holds: b, unless the plan placed Y over b already */
    if (st == KILN_OK && s->qsum == 1 && !s->y_cl) /* Y is NHWC scratch, b NCHW */
        transpose_cl(ctx->in[9]->data, base + s->y_rel, s->n, s->oc, s->ohw, 1, 1);
    else if (st == KILN_OK && s->qsum == 1 && ctx->out[0]->data != ctx->in[9]->data)
        memcpy(ctx->out[0]->data, ctx->in[9]->data, s->ybytes_all);
    if (st == KILN_OK) st = kd_exec_run(&s->e, &c2);
    if (st == KILN_OK && s->qsum == 2)
        qsum_add(s, base + s->y_rel, ctx->in[9]->data, ctx->out[0]->data, (int64_t)s->ybytes_all);
    if (st != KILN_OK || s->y_cl) (void)0;
    else if (s->has_post) st = kd_exec_run(&s->post_y, &c2);
    else if (s->conv)
        transpose_cl(base + s->y_rel, ctx->out[0]->data, s->n, s->oc, s->ohw, s->ybytes, 0);
    free(heap);
    return st;
}

static void q_destroy(void *state)
{
    struct q_state *s = state;
    kd_exec_destroy(&s->e);
    if (s->has_pre) kd_exec_destroy(&s->pre_x);
    if (s->has_post) kd_exec_destroy(&s->post_y);
    free(s);
}

static dnnl_data_type_t q_dt(kiln_dtype dt)
{
    return dt == KILN_DTYPE_U8 ? dnnl_u8 : dt == KILN_DTYPE_I8 ? dnnl_s8 : dnnl_s32;
}

/* The constant scalar (one element) v of an integer or float tensor. */
static bool const_scalar(const kiln_tensor *t, double *v)
{
    if (!t || kiln_tensor_count(t) != 1) return false;
    *v = kiln_get_f64(t->dtype, t->data, 0);
    return true;
}

static kiln_status q_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    enum kiln_op op = n->op;
    int qsum = op == KILN_OP_KilnQLinearConvAdd;
    int conv = op == KILN_OP_QLinearConv || op == KILN_OP_ConvInteger || qsum;
    int qlin = op != KILN_OP_MatMulInteger && op != KILN_OP_ConvInteger;
    /* input indices: x, x_zp, w, w_zp, and for QLinear the scales, y_zp and bias */
    int widx = qlin ? 3 : 1, xzpi = 2, wzpi = qlin ? 5 : 3;
    int bidx = op == KILN_OP_QLinearConv || op == KILN_OP_KilnQLinearMatMul || qsum ? 8 : -1;
    const struct kiln_type *x = cc->in[0], *y = cc->n_out > 0 ? cc->out[0] : NULL;
    const kiln_tensor *w = cc->n_in > widx && cc->in_value ? cc->in_value[widx] : NULL;
    if (!x || !y || !w || w->dtype != KILN_DTYPE_I8) return KILN_OK;
    if (x->dtype != KILN_DTYPE_U8 && x->dtype != KILN_DTYPE_I8) return KILN_OK;
    if (y->dtype != (qlin ? y->dtype : KILN_DTYPE_I32) ||
        (qlin && y->dtype != KILN_DTYPE_U8 && y->dtype != KILN_DTYPE_I8))
        return KILN_OK;
    if (!kiln_type_is_concrete(x) || !kiln_type_is_concrete(y)) return KILN_OK;
    if (kiln_shape_count(x->rank, x->dims) <= 0 || kiln_shape_count(y->rank, y->dims) <= 0)
        return KILN_OK;
    int64_t nout = conv ? w->dims[0] : w->rank == 2 ? w->dims[1] : -1;
    if (nout <= 0) return KILN_OK;
    /* weight zero points: absent or all zero */
    if (cc->n_in > wzpi && cc->in[wzpi]) {
        const kiln_tensor *z = cc->in_value[wzpi];
        if (!z) return KILN_OK;
        for (int64_t i = 0; i < kiln_tensor_count(z); i++)
            if (kiln_get_i64(z->dtype, z->data, i) != 0) return KILN_OK;
    }
    int lx = cc->in_layout ? cc->in_layout[0] : 0, ly = cc->out_layout ? cc->out_layout[0] : 0;
    if ((lx && (!conv || lx != KILN_LAYOUT_NHWC)) || (ly && (!conv || ly != KILN_LAYOUT_NHWC)))
        return KILN_OK;
    /* KilnQLinearConvAdd: b (input 9) stored as Y is (channels last) and of Y's dtype, the
     * Add's constant scalar parameters; a's zero point (input 7) and dtype bound a */
    float qb_s = 0, qb_z = 0, qy_s = 0, qy_z = 0;
    int relu = 0;
    kiln_dtype adt = KILN_DTYPE_U8;
    if (qsum) {
        const struct kiln_type *bt = cc->n_in > 13 ? cc->in[9] : NULL;
        double v = 0;
        if (!bt || bt->dtype != y->dtype || bt->rank != y->rank || !cc->in[10] || !cc->in[12] ||
            (cc->in_layout ? cc->in_layout[9] : 0) != ly)
            return KILN_OK;
        for (int d = 0; d < y->rank; d++)
            if (bt->dims[d] != y->dims[d]) return KILN_OK;
        if (!const_scalar(cc->in_value[10], &v)) return KILN_OK;
        qb_s = (float)v;
        if (cc->in[11] && !const_scalar(cc->in_value[11], &v)) return KILN_OK;
        qb_z = cc->in[11] ? (float)v : 0.0f;
        if (!const_scalar(cc->in_value[12], &v)) return KILN_OK;
        qy_s = (float)v;
        if (cc->in[13] && !const_scalar(cc->in_value[13], &v)) return KILN_OK;
        qy_z = cc->in[13] ? (float)v : 0.0f;
        if (!(qy_s > 0.0f) || !isfinite(qb_s) || !isfinite(qy_s)) return KILN_OK;
        const char *act = kiln_attr_str(n, "activation", "");
        if (kiln_attr_check(n) != KILN_OK) {
            kiln_error_clear();
            return KILN_OK;
        }
        if (act[0] && strcmp(act, "Relu")) return KILN_OK;
        relu = act[0] != 0;
        adt = cc->in[7] ? cc->in[7]->dtype : x->dtype;
        if (adt != KILN_DTYPE_U8 && adt != KILN_DTYPE_I8) return KILN_OK;
    }
    struct q_build b;
    memset(&b, 0, sizeof b);
    b.cc = cc;
    b.conv = conv;
    b.x_cl = lx == KILN_LAYOUT_NHWC;
    b.y_cl = ly == KILN_LAYOUT_NHWC;
    b.widx = widx;
    b.bidx = bidx >= 0 && cc->n_in > bidx && cc->in[bidx] ? bidx : -1;
    if (b.bidx >= 0 && (cc->in[bidx]->dtype != KILN_DTYPE_I32 ||
                        kiln_shape_count(cc->in[bidx]->rank, cc->in[bidx]->dims) != nout))
        return KILN_OK;
    /* x's zero point: constant, or (Integer ops) a run-time scalar */
    int32_t xzp = 0;
    int xzp_runtime = 0, has_xzp = 0;
    if (cc->n_in > xzpi && cc->in[xzpi]) {
        const kiln_tensor *z = cc->in_value[xzpi];
        double v;
        if (z) {
            if (!const_scalar(z, &v)) return KILN_OK;
            xzp = (int32_t)v;
            has_xzp = xzp != 0;
        } else {
            if (qlin || cc->in[xzpi]->dtype != x->dtype ||
                kiln_shape_count(cc->in[xzpi]->rank, cc->in[xzpi]->dims) != 1)
                return KILN_OK;
            xzp_runtime = has_xzp = 1;
        }
    }
    /* QLinear: the constant output scales and y's zero point */
    float *scales = NULL;
    int nscales = 0;
    int32_t yzp = 0;
    if (qlin) {
        const kiln_tensor *xs = cc->in_value[1], *ws = cc->in_value[4], *ys = cc->in_value[6];
        const kiln_tensor *yz = cc->in[7] ? cc->in_value[7] : NULL;
        double xsv, ysv, yzv = 0;
        if (!const_scalar(xs, &xsv) || !const_scalar(ys, &ysv) || !ws ||
            (cc->in[7] && !const_scalar(yz, &yzv)))
            return KILN_OK;
        if (xs->dtype != KILN_DTYPE_F32 || ws->dtype != KILN_DTYPE_F32 ||
            ys->dtype != KILN_DTYPE_F32)
            return KILN_OK;
        int64_t nws = kiln_tensor_count(ws);
        if (nws != 1 && nws != nout) return KILN_OK;
        nscales = (int)nws;
        scales = malloc(sizeof(float) * (size_t)nws);
        if (!scales) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
        for (int64_t i = 0; i < nws; i++) {
            float m = (float)xsv * ((const float *)ws->data)[i];
            scales[i] = m / (float)ysv;
            if (!isfinite(scales[i])) {
                free(scales);
                return KILN_OK;
            }
        }
        yzp = (int32_t)yzv;
    }
    b.scales = scales;
    b.nscales = nscales;
    b.has_xzp = has_xzp;
    b.has_yzp = yzp != 0;
    int32_t azp = yzp; /* qsum: the convolution's own output zero point is a's */
    float qa_s = 0;
    if (qsum) {
        double asv = 0;
        (void)const_scalar(cc->in_value[6], &asv);
        qa_s = (float)asv;
        b.sum = 1;
        b.clip_lo = (float)((adt == KILN_DTYPE_I8 ? -128 : 0) - azp);
        b.clip_hi = (float)((adt == KILN_DTYPE_I8 ? 127 : 255) - azp);
        b.lin = qa_s / qy_s;
        b.sum_scale = qb_s / qy_s;
        b.sum_zp = (int32_t)qb_z;
        b.relu = relu;
        yzp = (int32_t)qy_z;
        b.has_yzp = yzp != 0;
        if (!isfinite(b.lin) || !isfinite(b.sum_scale)) {
            free(scales);
            return KILN_OK;
        }
    }
    dnnl_dims_t one = {1};
    dnnl_status_t r = dnnl_memory_desc_init_by_tag(&b.zpmd, 1, one, dnnl_s32, dnnl_a);
    int64_t rows = 0, k = 0, ohw = 0, hw = 0;
    int64_t xbytes = kiln_shape_count(x->rank, x->dims);
    int64_t ybytes_all = kiln_shape_count(y->rank, y->dims) * (qlin ? 1 : 4);
    if (r == dnnl_success && conv) {
        int64_t group = kiln_attr_int(n, "group", 1);
        struct kiln_window win;
        if (kiln_attr_check(n) != KILN_OK || x->rank != 4 || w->rank != 4 || y->rank != 4 ||
            group < 1 || x->dims[1] % group || w->dims[0] % group ||
            x->dims[1] / group != w->dims[1] ||
            kiln_window_resolve(n, 2, x->dims + 2, w->dims + 2, false, &win) != KILN_OK ||
            kiln_attr_check(n) != KILN_OK) {
            kiln_error_clear();
            r = dnnl_unimplemented;
        } else {
            for (int i = 0; i < 2; i++) {
                if (win.out[i] != y->dims[i + 2]) r = dnnl_unimplemented;
                b.strides[i] = win.stride[i];
                b.dilates[i] = win.dilation[i] - 1;
                b.pad_l[i] = win.pad_begin[i];
                b.pad_r[i] = win.pad_end[i];
            }
        }
        if (r == dnnl_success) {
            dnnl_dims_t xd = {x->dims[0], x->dims[1], x->dims[2], x->dims[3]};
            dnnl_dims_t yd = {y->dims[0], y->dims[1], y->dims[2], y->dims[3]};
            r = dnnl_memory_desc_init_by_tag(&b.src, 4, xd, q_dt(x->dtype), dnnl_nhwc);
            if (r == dnnl_success)
                r = dnnl_memory_desc_init_by_tag(&b.dst, 4, yd, q_dt(y->dtype), dnnl_nhwc);
            if (r == dnnl_success && group > 1) {
                dnnl_dims_t wd = {group, w->dims[0] / group, w->dims[1], w->dims[2], w->dims[3]};
                r = dnnl_memory_desc_init_by_tag(&b.wplain, 5, wd, dnnl_s8, dnnl_goihw);
            } else if (r == dnnl_success) {
                dnnl_dims_t wd = {w->dims[0], w->dims[1], w->dims[2], w->dims[3]};
                r = dnnl_memory_desc_init_by_tag(&b.wplain, 4, wd, dnnl_s8, dnnl_oihw);
            }
            if (r == dnnl_success && b.bidx >= 0) {
                dnnl_dims_t bd = {nout};
                r = dnnl_memory_desc_init_by_tag(&b.bias, 1, bd, dnnl_s32, dnnl_a);
            }
            hw = x->dims[2] * x->dims[3];
            ohw = y->dims[2] * y->dims[3];
        }
    } else if (r == dnnl_success) {
        k = w->dims[0];
        if (x->rank < 2 || x->dims[x->rank - 1] != k || y->dims[y->rank - 1] != nout) {
            r = dnnl_unimplemented;
        } else {
            rows = kiln_shape_count(x->rank - 1, x->dims);
            dnnl_dims_t ad = {rows, k}, wd = {k, nout}, yd = {rows, nout}, bd = {1, nout};
            r = dnnl_memory_desc_init_by_tag(&b.src, 2, ad, q_dt(x->dtype), dnnl_ab);
            if (r == dnnl_success)
                r = dnnl_memory_desc_init_by_tag(&b.wplain, 2, wd, dnnl_s8, dnnl_ab);
            if (r == dnnl_success)
                r = dnnl_memory_desc_init_by_tag(&b.dst, 2, yd, q_dt(y->dtype), dnnl_ab);
            if (r == dnnl_success && b.bidx >= 0)
                r = dnnl_memory_desc_init_by_tag(&b.bias, 2, bd, dnnl_s32, dnnl_ab);
        }
    }
    if (r != dnnl_success || xbytes > INT32_MAX / 4 || ybytes_all > INT32_MAX / 4) {
        free(scales);
        return KILN_OK;
    }
    /* the kernel's own buffers, from its base: [X NHWC][Y NHWC] (conv), then two zero points */
    b.x_rel = 0;
    b.y_rel = conv && !b.x_cl ? Q_ALIGN64((size_t)xbytes) : 0;
    b.zp_rel = conv && !b.y_cl ? b.y_rel + Q_ALIGN64((size_t)ybytes_all) : b.y_rel;
    struct q_state *s = calloc(1, sizeof *s);
    if (!s) {
        free(scales);
        return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    }
    double work = 2.0 * (double)kiln_shape_count(y->rank, y->dims) *
                  (double)(conv ? w->dims[1] * w->dims[2] * w->dims[3] : k);
    int handled = 0;
    kiln_status st = kd_exec_build(&s->e, kd_work_threads(cc, work), q_make, &b, &handled);
    int qmode = qsum;
    if (qsum && st == KILN_OK && !handled && b.y_cl) {
        /* oneDNN has no kernel for the sum chain: the convolution writes a (a's dtype and
         * zero point) into the kernel's scratch and q_run adds b to it */
        qmode = 2;
        b.sum = 0;
        b.y_cl = 0;
        b.y_rel = b.x_cl ? 0 : Q_ALIGN64((size_t)xbytes);
        b.zp_rel = b.y_rel + Q_ALIGN64((size_t)ybytes_all);
        b.has_yzp = azp != 0;
        dnnl_dims_t yd = {y->dims[0], y->dims[1], y->dims[2], y->dims[3]};
        if (dnnl_memory_desc_init_by_tag(&b.dst, 4, yd, q_dt(adt), dnnl_nhwc) == dnnl_success) {
            memset(&s->e, 0, sizeof s->e);
            st = kd_exec_build(&s->e, kd_work_threads(cc, work), q_make, &b, &handled);
        }
        b.y_cl = 1;
        yzp = azp;
    }
    free(scales);
    if (st != KILN_OK || !handled) {
        free(s);
        return st;
    }
    s->qsum = qmode;
    s->relu = relu;
    s->ybytes_all = (size_t)ybytes_all;
    s->qa_scale = qa_s;
    s->qa_zp = (float)azp;
    s->qb_scale = qb_s;
    s->qb_zp = qb_z;
    s->qy_scale = qy_s;
    s->qy_zp = qy_z;
    s->qy_lo = y->dtype == KILN_DTYPE_I8 ? -128.0f : 0.0f;
    s->qy_hi = y->dtype == KILN_DTYPE_I8 ? 127.0f : 255.0f;
    s->qa_signed = adt == KILN_DTYPE_I8;
    s->qb_signed = s->qy_signed = y->dtype == KILN_DTYPE_I8;
    s->conv = conv;
    s->x_cl = b.x_cl;
    s->y_cl = b.y_cl;
    s->n = conv ? x->dims[0] : 0;
    s->c = conv ? x->dims[1] : 0;
    s->hw = hw;
    s->oc = nout;
    s->ohw = ohw;
    s->ybytes = qlin ? 1 : 4;
    s->xzp_index = xzpi;
    s->xzp_const = xzp;
    s->xzp_runtime = xzp_runtime;
    s->has_xzp = has_xzp;
    s->yzp = yzp;
    s->has_yzp = yzp != 0;
    /* conv: oneDNN's reorders (jit) between the plan's NCHW and the NHWC the
     * convolution wants, in place of the plain-C transposes where they build */
    if (conv) {
        dnnl_memory_desc_t xp, yp;
        dnnl_dims_t xd = {x->dims[0], x->dims[1], x->dims[2], x->dims[3]};
        dnnl_dims_t yd = {y->dims[0], y->dims[1], y->dims[2], y->dims[3]};
        int hx = 0, hy = 0;
        if (dnnl_memory_desc_init_by_tag(&xp, 4, xd, q_dt(x->dtype), dnnl_nchw) == dnnl_success &&
            dnnl_memory_desc_init_by_tag(&yp, 4, yd, q_dt(y->dtype), dnnl_nchw) == dnnl_success) {
            if (!b.x_cl)
                st = kd_reorder_exec_build(cc, &xp, KD_SRC_IN, 0, &b.src, KD_SRC_SCRATCH_AT,
                                           (int)b.x_rel, &s->pre_x, &hx);
            if (st == KILN_OK && !b.y_cl)
                st = kd_reorder_exec_build(cc, &b.dst, KD_SRC_SCRATCH_AT, (int)b.y_rel, &yp,
                                           KD_SRC_OUT, 0, &s->post_y, &hy);
        }
        s->has_pre = hx;
        s->has_post = hy;
        if (st != KILN_OK) {
            if (hx) kd_exec_destroy(&s->pre_x);
            if (hy) kd_exec_destroy(&s->post_y);
            kd_exec_destroy(&s->e);
            free(s);
            return st;
        }
    }
    size_t sbase = kd_exec_scratch(&s->e);
    if (s->has_pre && kd_exec_scratch(&s->pre_x) > sbase) sbase = kd_exec_scratch(&s->pre_x);
    if (s->has_post && kd_exec_scratch(&s->post_y) > sbase) sbase = kd_exec_scratch(&s->post_y);
    s->base = Q_ALIGN64(sbase);
    s->x_rel = b.x_rel;
    s->y_rel = b.y_rel;
    s->zp_rel = b.zp_rel;
    s->scratch_total = s->base + b.zp_rel + 128;
    struct kd_exec *all[3] = {&s->e, s->has_pre ? &s->pre_x : NULL,
                              s->has_post ? &s->post_y : NULL};
    for (int ei = 0; ei < 3; ei++) /* the kernel's buffers after oneDNN's */
        for (int vi = 0; all[ei] && vi < all[ei]->nv; vi++)
            for (int a = 0; a < all[ei]->v[vi].nargs; a++)
                if (all[ei]->v[vi].args[a].src == KD_SRC_SCRATCH_AT)
                    all[ei]->v[vi].args[a].index += (int)s->base;
    kd_inst_impl(inst, &s->e);
    if (qmode) { /* b is copied into Y first (1) or read elementwise (2): Y may be b */
        inst->inplace = 1;
        inst->inplace_input = 9;
    }
    inst->name = qmode == 1                   ? "dnnl_qlinear_conv_sum"
                 : qmode == 2                 ? "dnnl_qlinear_conv_add"
                 : op == KILN_OP_QLinearConv    ? "dnnl_qlinear_conv"
                 : op == KILN_OP_ConvInteger  ? "dnnl_conv_integer"
                 : op == KILN_OP_MatMulInteger ? "dnnl_matmul_integer"
                                              : "dnnl_qlinear_matmul";
    inst->state = s;
    inst->run = q_run;
    inst->destroy = q_destroy;
    inst->scratch_bytes = s->scratch_total;
    inst->packed = 1u << widx;
    return KILN_OK;
}

/* The family (qlinear.def): one entry per op. */
#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/dnnl/qlinear.def"
#undef KILN_KERNEL

/* The cheap part of q_compile's checks: 8-bit x, a constant s8 weight, the output type. */
bool kiln_k_dnnl_q_covers(const struct kiln_compile_ctx *cc)
{
    enum kiln_op op = cc->node->op;
    int qlin = op != KILN_OP_MatMulInteger && op != KILN_OP_ConvInteger;
    int widx = qlin ? 3 : 1;
    const struct kiln_type *x = cc->n_in > 0 ? cc->in[0] : NULL;
    const struct kiln_type *y = cc->n_out > 0 ? cc->out[0] : NULL;
    const kiln_tensor *w = cc->n_in > widx && cc->in_value ? cc->in_value[widx] : NULL;
    if (!x || !y || !w || w->dtype != KILN_DTYPE_I8) return false;
    if (x->dtype != KILN_DTYPE_U8 && x->dtype != KILN_DTYPE_I8) return false;
    if (qlin) return y->dtype == KILN_DTYPE_U8 || y->dtype == KILN_DTYPE_I8;
    return y->dtype == KILN_DTYPE_I32;
}

kiln_status kiln_k_dnnl_q_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    return q_compile(cc, inst);
}
