/*
 * matmul.c - oneDNN fast kernels for MatMul, Gemm and KilnFusedMatMul
 * (float32, operands of rank >= 2), and the matmul family's entries
 * (matmul.def: the sparse selection first, then this product).
 *
 * One oneDNN matmul primitive per node. A product whose B is one matrix
 * (rank 2, or all batch dims 1) and whose A is not transposed folds A's
 * batch into its rows: [B, S, K] x [K, N] runs as one [B*S, K] x [K, N]
 * product, as BERT's projections want. Otherwise the product is batched
 * with numpy broadcasting of the batch dims. Transposed operands are
 * strided memory descriptors. A constant B is reordered once into the
 * format oneDNN picks, with alpha folded in; with a B known only at run
 * time alpha is an eltwise_linear post-op (declined when a bias would be
 * scaled with it).
 *
 * Epilogue: a bias that broadcasts along Y's rows becomes oneDNN's bias; a
 * bias of Y's full shape (Gemm's C of shape [M, N], say) becomes a sum
 * post-op, as does KilnFusedMatMul's Sum (copied into Y before the run,
 * unless the plan puts Y in place over it);
 * the activation is eltwise post-ops. Gemm's beta scales the sum; a
 * broadcast C with beta != 1 stays on the reference.
 *
 * Low precision (a plan compiled for KILN_PRECISION_BF16 or INT8, with a
 * constant B; docs/COMPRESSION.md). bf16: B is packed as bfloat16 (alpha
 * folded in), A is rounded to bfloat16 (nearest even) into scratch at the
 * start of each run, and oneDNN multiplies them with fp32 accumulation into
 * the fp32 Y, bias and post-ops as in fp32. int8 (dynamic quantization): B
 * is packed as symmetric s8 with one scale per output column
 * (kd_pack_weights_s8); each run measures A's range (min(0, min A) ..
 * max(0, max A), finite values only), quantizes A to u8 with
 *     scale_a = (max - min) / 255 (1 when the range is empty),
 *     zp = clamp(nearbyint(-min / scale_a), 0, 255),
 *     q = clamp(nearbyint(a / scale_a) + zp, 0, 255)   (NaN -> zp)
 * and runs oneDNN's int8 matmul: s32 accumulation of (q - zp) * w, then
 *     Y = (float(acc) * (scale_w[n] * alpha)) * scale_a + bias + Sum,
 * then the activation: scale_w * alpha are constant per-column output
 * scales (oneDNN's brgemm kernels take no run-time per-column scales),
 * scale_a a binary-mul post-op read at run time, bias a binary-add post-op,
 * Sum a sum post-op.
 * A product oneDNN cannot make in the asked precision runs in fp32.
 */
#include <math.h>

#include "kernels/dnnl/dnnl_common.h"
#include "kernels/family.h"
#include "kernels/sparse/sparse.h"
#include "kernels/simd/skinny.h"

#define MM_ALIGN64(x) (((x) + 63) / 64 * 64)

struct mm_state {
    struct kd_exec e;
    int sum_index;          /* input copied into Y before the run, or -1 */
    size_t dst_bytes;
    int prec;               /* KILN_PRECISION_* the node runs in (0 = fp32) */
    int64_t a_count;        /* elements of A (converted per run) */
    size_t base;            /* scratch offset of the kernel's own buffers */
    size_t sa_rel, zp_rel;  /* int8: A's scale and zero point, from base */
    size_t scratch_total;
    int post_act;           /* kd_deferred_activation: applied to Y after oneDNN, or 0 */
};

struct mm_build {
    const struct kiln_compile_ctx *cc;
    dnnl_memory_desc_t src, wei, bias, dst;
    int has_bias, b_const;
    float alpha;            /* folded into packed B, or a linear post-op */
    float sum_scale;        /* 0 = no sum post-op */
    int prec;               /* precision this build tries (0 fp32, 1 bf16, 2 int8) */
    size_t sa_rel, zp_rel;  /* int8 scratch offsets (relative to the kernel's base) */
    const float *oscales;   /* int8: scale_w[n] * alpha, the constant output scales */
    dnnl_memory_desc_t one; /* int8: A's scale as a binary-mul operand (all dims 1) */
    int post_act;           /* kd_deferred_activation: no activation post-op */
};

static kiln_status mm_make(void *arg, struct kd_variant *v, int threads)
{
    struct mm_build *b = arg;
    const struct kiln_node *n = b->cc->node;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    kiln_status st = KILN_OK;
    dnnl_memory_desc_t wany, src = b->src;
    dnnl_status_t r = dnnl_success;
    dnnl_data_type_t wdt = b->prec == 1 ? dnnl_bf16 : b->prec == 2 ? dnnl_s8 : dnnl_f32;
    if (b->prec) src.data_type = b->prec == 1 ? dnnl_bf16 : dnnl_u8;
    if (b->b_const)
        r = dnnl_memory_desc_init_by_tag(&wany, b->wei.ndims, b->wei.dims, wdt,
                                         dnnl_format_tag_any);
    else
        wany = b->wei;
    int q8 = b->prec == 2;
    dnnl_matmul_desc_t d;
    if (r == dnnl_success)
        r = dnnl_matmul_desc_init(&d, &src, &wany, b->has_bias && !q8 ? &b->bias : NULL, &b->dst);
    if (r == dnnl_success) r = dnnl_primitive_attr_create(&attr);
    if (r == dnnl_success) r = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (r == dnnl_success && q8) {
        int nd = b->dst.ndims; /* one constant scale per output column */
        r = dnnl_primitive_attr_set_output_scales(attr, b->dst.dims[nd - 1], 1 << (nd - 1),
                                                  b->oscales);
        if (r == dnnl_success)
            r = dnnl_primitive_attr_set_zero_points(attr, DNNL_ARG_SRC, 1, 0,
                                                    &DNNL_RUNTIME_S32_VAL);
    }
    if (r == dnnl_success) r = dnnl_post_ops_create(&po);
    if (r == dnnl_success && q8) /* after the output scales: A's scale, then the bias */
        r = dnnl_post_ops_append_binary(po, dnnl_binary_mul, &b->one);
    if (r == dnnl_success && q8 && b->has_bias)
        r = dnnl_post_ops_append_binary(po, dnnl_binary_add, &b->bias);
    if (r == dnnl_success && !b->b_const && b->alpha != 1.0f)
        r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, b->alpha, 0.0f);
    if (r == dnnl_success && b->sum_scale != 0.0f) r = dnnl_post_ops_append_sum(po, b->sum_scale);
    if (r == dnnl_success && n->op == KILN_OP_KilnFusedMatMul && !b->post_act &&
        !kd_append_activation(n, po))
        goto out;
    if (r == dnnl_success) r = dnnl_primitive_attr_set_post_ops(attr, po);
    if (r == dnnl_success) r = kd_pd_create(&pd, &d, attr);
    if (r != dnnl_success) goto out; /* the reference runs it */
    if (b->prec && kd_pd_is_ref(pd)) goto out; /* fp32 is faster than oneDNN's reference */
    if (q8 && !kd_pd_int8_exact(pd)) goto out; /* no VNNI: 16-bit sums could saturate */
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_memory_desc_t wpad;
    if (b->b_const && !b->prec && kd_md_pad_rows(wmd, &wpad)) {
        /* oneDNN's GEMM takes B plain; rows 4 KB apart cost it 2.5-3x (128 x 768 by
         * 768 x N on one thread, AVX2: 32-35 GFLOP/s at N = 1024, 2048 and 3072 against
         * 84-97 at 768, 1280 and 1536), so B is packed with padded rows */
        dnnl_matmul_desc_t d2;
        dnnl_primitive_desc_t pd2 = NULL;
        if (dnnl_matmul_desc_init(&d2, &src, &wpad, b->has_bias ? &b->bias : NULL, &b->dst) ==
                dnnl_success &&
            kd_pd_create(&pd2, &d2, attr) == dnnl_success &&
            !kd_pd_is_ref(pd2)) {
            dnnl_primitive_desc_destroy(pd);
            pd = pd2;
            wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        } else if (pd2) {
            dnnl_primitive_desc_destroy(pd2);
        }
    }
    if (b->b_const && q8) {
        size_t sc_bytes = 0;
        void *base = NULL;
        st = kd_pack_weights_s8(b->cc, b->cc->in_value[1], "matmul", &b->wei, b->wei.ndims - 1,
                                wmd, &base, &sc_bytes);
        if (st != KILN_OK || !base) goto out;
        v->packed = (char *)base + sc_bytes;
    } else if (b->b_const) {
        st = kd_pack_weights(b->cc, b->cc->in_value[1], b->prec == 1 ? "matmul_bf16" : "matmul",
                             &b->wei, wmd, b->alpha, &v->packed);
        if (st != KILN_OK || !v->packed) goto out;
    }
    st = kd_variant_init(n, pd, v);
    if (st != KILN_OK) goto out;
    if (b->prec) /* A converted into the kernel's scratch (offsets from base, fixed after the build) */
        kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_SCRATCH_AT, 0, &src);
    else
        kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_IN, 0, &b->src);
    kd_variant_arg(v, DNNL_ARG_WEIGHTS, b->b_const ? KD_SRC_PACKED : KD_SRC_IN, 1, wmd);
    if (b->has_bias)
        kd_variant_arg(v, q8 ? DNNL_ARG_ATTR_MULTIPLE_POST_OP(1) | DNNL_ARG_SRC_1 : DNNL_ARG_BIAS,
                       KD_SRC_IN, 2, &b->bias);
    kd_variant_arg(v, DNNL_ARG_DST, KD_SRC_OUT, 0, &b->dst);
    if (q8) {
        dnnl_memory_desc_t zmd;
        dnnl_dims_t one = {1};
        if (dnnl_memory_desc_init_by_tag(&zmd, 1, one, dnnl_s32, dnnl_a) != dnnl_success) {
            dnnl_primitive_destroy(v->prim);
            memset(v, 0, sizeof *v);
            goto out;
        }
        kd_variant_arg(v, DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, KD_SRC_SCRATCH_AT,
                       (int)b->sa_rel, &b->one);
        kd_variant_arg(v, DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, KD_SRC_SCRATCH_AT,
                       (int)b->zp_rel, &zmd);
    }
out:
    (void)threads;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st;
}

static kiln_status mm_run(void *state, struct kiln_run_ctx *ctx)
{
    struct mm_state *s = state;
    struct kiln_run_ctx c2 = *ctx;
    void *heap = NULL;
    if (s->prec) {
        if (!c2.scratch) { /* callers without a plan arena */
            heap = c2.scratch = aligned_alloc(64, s->scratch_total);
            if (!heap)
                return kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY, "out of memory for scratch");
        }
        char *base = (char *)c2.scratch + s->base;
        const float *a = ctx->in[0]->data;
        if (s->prec == 1) {
            uint16_t *h = (uint16_t *)base;
            kd_to_bf16(a, s->a_count, h, ctx->threads);
        } else {
            float sa;
            int32_t zp;
            kd_quantize_u8(a, s->a_count, (uint8_t *)base, ctx->threads, &sa, &zp);
            memcpy(base + s->sa_rel, &sa, sizeof sa);
            memcpy(base + s->zp_rel, &zp, sizeof zp);
        }
    }
    if (s->sum_index >= 0 && ctx->in[s->sum_index]->data != ctx->out[0]->data)
        memcpy(ctx->out[0]->data, ctx->in[s->sum_index]->data, s->dst_bytes);
    kiln_status st = kd_exec_run(&s->e, &c2);
    free(heap);
    if (st == KILN_OK && s->post_act)
        kd_apply_activation(s->post_act, ctx->out[0]->data, s->dst_bytes / sizeof(float),
                            ctx->threads);
    return st;
}

static void mm_destroy(void *state)
{
    struct mm_state *s = state;
    kd_exec_destroy(&s->e);
    free(s);
}

/* md of an operand stored with dims `stored` (rank r, row-major), seen with its last two
 * dims swapped when trans. */
static dnnl_status_t md_operand(dnnl_memory_desc_t *md, int r, const int64_t *stored, int trans)
{
    dnnl_dims_t d, s;
    int64_t acc = 1;
    for (int i = r - 1; i >= 0; i--) {
        d[i] = stored[i];
        s[i] = acc;
        acc *= stored[i] > 0 ? stored[i] : 1;
    }
    if (trans) {
        dnnl_dim_t t = d[r - 2];
        d[r - 2] = d[r - 1];
        d[r - 1] = t;
        t = s[r - 2];
        s[r - 2] = s[r - 1];
        s[r - 1] = t;
    }
    return dnnl_memory_desc_init_by_strides(md, r, d, dnnl_f32, s);
}

/* dims of t padded with leading 1s to rank r. */
static void pad_dims(const struct kiln_type *t, int r, int64_t *out)
{
    int k = r - t->rank;
    for (int i = 0; i < r; i++) out[i] = i < k ? 1 : t->dims[i - k];
}

static int same_dims(const struct kiln_type *a, const struct kiln_type *b)
{
    if (a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    return 1;
}

/* The checks every dense product makes before building (types, ranks, transposes, the
 * fused activation); fills the attributes. */
static bool mm_node_ok(const struct kiln_compile_ctx *cc, int64_t *ta_out, int64_t *tb_out,
                       float *alpha_out, float *beta_out)
{
    const struct kiln_node *n = cc->node;
    enum kiln_op op = n->op;
    if (cc->n_in < 2) return false;
    const struct kiln_type *a = cc->in[0], *bt = cc->in[1], *y = cc->n_out > 0 ? cc->out[0] : NULL;
    const struct kiln_type *bias = cc->n_in > 2 ? cc->in[2] : NULL;
    const struct kiln_type *sum = op == KILN_OP_KilnFusedMatMul && cc->n_in > 3 ? cc->in[3] : NULL;
    if (!a || !bt || !y || a->dtype != KILN_DTYPE_F32 || bt->dtype != KILN_DTYPE_F32 ||
        y->dtype != KILN_DTYPE_F32)
        return false;
    if ((bias && bias->dtype != KILN_DTYPE_F32) || (sum && sum->dtype != KILN_DTYPE_F32))
        return false;
    int64_t ta = 0, tb = 0;
    float alpha = 1.0f, beta = 1.0f;
    if (op != KILN_OP_MatMul) {
        ta = kiln_attr_int(n, "transA", 0);
        tb = kiln_attr_int(n, "transB", 0);
        alpha = kiln_attr_float(n, "alpha", 1.0f);
        if (op == KILN_OP_Gemm) beta = kiln_attr_float(n, "beta", 1.0f);
    }
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    if ((ta != 0 && ta != 1) || (tb != 0 && tb != 1)) return false;
    if (a->rank < 2 || bt->rank < 2 || (op == KILN_OP_Gemm && (a->rank != 2 || bt->rank != 2)))
        return false;
    int R = a->rank > bt->rank ? a->rank : bt->rank;
    if (R > 12 || y->rank != R) return false;
    if (kiln_shape_count(a->rank, a->dims) <= 0 || kiln_shape_count(bt->rank, bt->dims) <= 0 ||
        kiln_shape_count(y->rank, y->dims) <= 0)
        return false;
    if (sum && !same_dims(sum, y)) return false;
    if (op == KILN_OP_KilnFusedMatMul) {
        dnnl_post_ops_t po;
        if (dnnl_post_ops_create(&po) != dnnl_success) return false;
        int ok = kd_append_activation(n, po);
        dnnl_post_ops_destroy(po);
        if (kiln_attr_check(n) != KILN_OK) {
            kiln_error_clear();
            ok = 0;
        }
        if (!ok) return false;
    }
    *ta_out = ta;
    *tb_out = tb;
    *alpha_out = alpha;
    *beta_out = beta;
    return true;
}

static kiln_status mm_compile_dense(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    enum kiln_op op = n->op;
    int64_t ta, tb;
    float alpha, beta;
    if (!mm_node_ok(cc, &ta, &tb, &alpha, &beta)) return KILN_OK;
    const struct kiln_type *a = cc->in[0], *bt = cc->in[1], *y = cc->out[0];
    const struct kiln_type *bias = cc->n_in > 2 ? cc->in[2] : NULL;
    const struct kiln_type *sum = op == KILN_OP_KilnFusedMatMul && cc->n_in > 3 ? cc->in[3] : NULL;
    int R = a->rank > bt->rank ? a->rank : bt->rank;
    if (op == KILN_OP_Gemm && bias && beta == 0.0f) bias = NULL;

    struct mm_build b;
    memset(&b, 0, sizeof b);
    b.cc = cc;
    b.b_const = cc->in_value && cc->in_value[1];
    b.alpha = alpha;
    b.post_act = op == KILN_OP_KilnFusedMatMul ? kd_deferred_activation(n) : 0;
    int sum_index = -1;
    if (sum) {
        sum_index = 3;
        b.sum_scale = 1.0f;
    }
    int64_t yd[KILN_MAX_RANK];
    pad_dims(y, R, yd);
    /* bias: Y-shaped and no Sum -> the sum post-op; else oneDNN's broadcasting bias */
    int bias_rows = 0; /* the bias varies along some dim other than the last */
    int64_t bd[KILN_MAX_RANK];
    if (bias) {
        if (bias->rank > R) return KILN_OK;
        pad_dims(bias, R, bd);
        for (int i = 0; i < R; i++) {
            if (bd[i] != 1 && bd[i] != yd[i]) return KILN_OK;
            if (i < R - 1 && bd[i] != 1) bias_rows = 1;
        }
        int full = 1;
        for (int i = 0; i < R; i++) full = full && bd[i] == yd[i];
        if (full && !sum && bias->rank == R) {
            sum_index = 2;
            b.sum_scale = beta;
            bias = NULL;
            bias_rows = 0;
        } else if (beta != 1.0f) {
            return KILN_OK;
        }
    }
    b.has_bias = bias != NULL;
    if (bias && !b.b_const && alpha != 1.0f) return KILN_OK; /* linear would scale the bias */

    int64_t ad[KILN_MAX_RANK], bdm[KILN_MAX_RANK];
    pad_dims(a, R, ad);
    pad_dims(bt, R, bdm);
    int b_single = 1; /* B is one matrix */
    for (int i = 0; i < R - 2; i++) b_single = b_single && bdm[i] == 1;
    int fold = b_single && !ta && R > 2 && !bias_rows;
    dnnl_status_t r;
    if (fold) {
        int64_t rows = kiln_shape_count(R - 1, ad);
        int64_t a2[2] = {rows, ad[R - 1]};
        int64_t b2[2] = {bdm[R - 2], bdm[R - 1]};
        int64_t y2[2] = {rows, yd[R - 1]};
        r = md_operand(&b.src, 2, a2, 0);
        if (r == dnnl_success) r = md_operand(&b.wei, 2, b2, (int)tb);
        if (r == dnnl_success) r = kd_md_plain(&b.dst, 2, y2);
        if (r == dnnl_success && bias) {
            int64_t bb[2] = {1, bd[R - 1]};
            r = kd_md_plain(&b.bias, 2, bb);
        }
    } else {
        r = md_operand(&b.src, R, ad, (int)ta);
        if (r == dnnl_success) r = md_operand(&b.wei, R, bdm, (int)tb);
        if (r == dnnl_success) r = kd_md_plain(&b.dst, R, yd);
        if (r == dnnl_success && bias) r = kd_md_plain(&b.bias, R, bd);
    }
    if (r != dnnl_success) return KILN_OK;

    struct mm_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    int handled = 0;
    double work = 2.0 * (double)kiln_shape_count(R, yd) * (double)(ta ? ad[R - 2] : ad[R - 1]);
    kiln_status st = KILN_OK;
    /* low precision first when asked (constant B only; int8: B one matrix), else fp32 */
    int64_t a_count = kiln_shape_count(a->rank, a->dims), ncols = yd[R - 1];
    int prec = cc->precision == 1 || cc->precision == 2 ? cc->precision : 0;
    if (prec && (!b.b_const || (prec == 2 && !b_single))) prec = 0;
    if ((uint64_t)a_count * 2 > (uint64_t)INT32_MAX / 2) prec = 0; /* scratch offsets are ints */
    float *oscales = NULL;
    if (prec == 2) { /* the constant output scales: scale_w[n] * alpha */
        dnnl_dims_t ones = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
        oscales = malloc(sizeof(float) * (size_t)ncols);
        if (!oscales) {
            free(s);
            return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
        }
        /* B may be a reloadable weight released by an earlier plan: make it resident first */
        st = cc->weights ? kiln_weight_cache_acquire(cc->weights, cc->in_value[1], 0) : KILN_OK;
        if (st != KILN_OK || !cc->in_value[1]->data) {
            free(oscales);
            free(s);
            return st;
        }
        kd_channel_scales_s8(cc->in_value[1]->data, &b.wei, b.wei.ndims - 1, oscales);
        for (int64_t j = 0; j < ncols; j++) oscales[j] *= alpha;
        b.oscales = oscales;
        if (dnnl_memory_desc_init_by_strides(&b.one, b.dst.ndims, ones, dnnl_f32, NULL) !=
            dnnl_success)
            prec = 0;
    }
    if (prec) {
        size_t conv = MM_ALIGN64((size_t)a_count * (prec == 1 ? 2u : 1u));
        b.prec = prec;
        b.sa_rel = conv;
        b.zp_rel = conv + 64;
        st = kd_exec_build(&s->e, kd_work_threads(cc, work), mm_make, &b, &handled);
        if (st != KILN_OK) {
            free(oscales);
            free(s);
            return st;
        }
        if (handled) {
            s->prec = prec;
            s->a_count = a_count;
            s->sa_rel = b.sa_rel;
            s->zp_rel = b.zp_rel;
            s->base = MM_ALIGN64(kd_exec_scratch(&s->e));
            s->scratch_total = s->base + (prec == 2 ? b.zp_rel + 64 : conv);
            for (int vi = 0; vi < s->e.nv; vi++) /* place the kernel's buffers after oneDNN's */
                for (int k = 0; k < s->e.v[vi].nargs; k++)
                    if (s->e.v[vi].args[k].src == KD_SRC_SCRATCH_AT)
                        s->e.v[vi].args[k].index += (int)s->base;
        }
        b.prec = 0;
    }
    free(oscales);
    b.oscales = NULL;
    if (!handled) st = kd_exec_build(&s->e, kd_work_threads(cc, work), mm_make, &b, &handled);
    if (st != KILN_OK || !handled) {
        free(s);
        return st;
    }
    s->sum_index = sum_index;
    s->post_act = b.post_act;
    s->dst_bytes = (size_t)kiln_shape_count(R, yd) * sizeof(float);
    kd_inst_impl(inst, &s->e);
    static const char *const names[3][3] = {
        {"dnnl_matmul", "dnnl_gemm", "dnnl_fused_matmul"},
        {"dnnl_matmul_bf16", "dnnl_gemm_bf16", "dnnl_fused_matmul_bf16"},
        {"dnnl_matmul_int8", "dnnl_gemm_int8", "dnnl_fused_matmul_int8"}};
    inst->name = names[s->prec][op == KILN_OP_MatMul ? 0 : op == KILN_OP_Gemm ? 1 : 2];
    inst->state = s;
    inst->run = mm_run;
    inst->destroy = mm_destroy;
    inst->scratch_bytes = s->prec ? s->scratch_total : kd_exec_scratch(&s->e);
    if (b.b_const) inst->packed = 1u << 1; /* B runs packed in every variant */
    if (sum_index >= 0) { /* Y may be written over the summed input: no copy before the run */
        inst->inplace = 1;
        inst->inplace_input = sum_index;
    }
    return KILN_OK;
}

/* The family (matmul.def): the sparse entry first, then oneDNN's product. */
#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/dnnl/matmul.def"
#undef KILN_KERNEL

bool kiln_k_dnnl_matmul_covers(const struct kiln_compile_ctx *cc)
{
    int64_t ta, tb;
    float alpha, beta;
    return mm_node_ok(cc, &ta, &tb, &alpha, &beta);
}

/* A product of a few rows by a large constant B runs on Kiln's streaming kernel
 * (simd/skinny.c), every other one on oneDNN's. */
static kiln_status mm_compile_dense_any(const struct kiln_compile_ctx *cc,
                                        struct kiln_kernel_inst *inst)
{
    kiln_status st = kiln_simd_skinny_compile(cc, inst);
    if (st != KILN_OK || inst->run) return st;
    return mm_compile_dense(cc, inst);
}

kiln_status kiln_k_dnnl_matmul_compile(const struct kiln_compile_ctx *cc,
                                       struct kiln_kernel_inst *inst)
{
    return mm_compile_dense_any(cc, inst);
}

/* The sparse entry: a node the sparse kernel handles (a constant, 2-D B; sparse.h). Where
 * B is mostly zero, the sparse kernel and oneDNN's are both compiled and timed on the
 * node's shape, and the faster one runs (src/kernels/sparse/matmul.c); otherwise oneDNN's,
 * as if this entry were not there. */
bool kiln_k_sparse_matmul_covers(const struct kiln_compile_ctx *cc)
{
    return kiln_sparse_matmul_candidate(cc);
}

kiln_status kiln_k_sparse_matmul_compile(const struct kiln_compile_ctx *cc,
                                         struct kiln_kernel_inst *inst)
{
    return kiln_sparse_matmul_select(cc, inst, mm_compile_dense_any);
}
