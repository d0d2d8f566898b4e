/*
 * deconv_phase.c - ConvTranspose as one convolution over its output phases
 * (float32, 1-D and 2-D, group 1, no dilation, constant weights).
 *
 * A transposed convolution of stride s writes output o from the taps t with
 * o + p = i * s + t (p the begin pad, i an input position). Writing
 * o + p = q * s + r (the phase r in [0, s)), the taps are t = r + j * s and
 * the inputs i = q - j:
 *
 *     y[o] = sum_j x[q - j] * w[r + j * s],  j < kk = ceil(k / s)
 *
 * which is, for each phase r, an ordinary stride-1 convolution of x with kk
 * taps (the phase's taps, reversed; zero where r + j * s >= k) evaluated at
 * q. Every phase reads the same input window x[q - kk + 1 .. q], so all of
 * them are one convolution with s^d * M output channels (d spatial dims),
 * weights rearranged once at compile time, computed over the q that reach the
 * output: Z[n][(r, m)][q] = conv(X). Y is then Z's channels interleaved back
 * into space (a depth-to-space with the begin pad as offset): one copy of
 * channel blocks, fused with nothing else.
 *
 * Why: oneDNN 2.6 runs a deconvolution as its convolution's backward data
 * pass, which on AVX2 reached 17-24% of the FMA peak on UNet's upsampling
 * shapes (2x2 and 3x3 kernels of stride 2, 16 to 64 channels), where its
 * direct forward convolution on the same data runs at 60-95%. The rearranged
 * kernel has kk * s taps per dim where the original has k: for k a multiple of
 * s (2x2 and 4x4 kernels of stride 2, the usual upsamplings) nothing is
 * wasted; a 3x3 of stride 2 computes 16 products for 9 (zero weights). The
 * kernel is taken where that waste is at most PH_MAX_WASTE and oneDNN gives
 * the convolution a direct (not GEMM or reference) implementation; otherwise
 * deconv.c's oneDNN deconvolution runs it.
 *
 * Layout: Z is blocked by the channel block B (Y's when the layout pass
 * blocked Y, else 8, or 16 with AVX-512), with M padded to a multiple of B so
 * that every block of Z belongs to one phase; the padded channels have zero
 * weights and bias. X is read in its layout where oneDNN has a direct kernel
 * for it, else reordered first into B-blocks in the scratch. The interleave
 * copies B floats per output pixel into Y (blocked) or into a blocked Y in the
 * scratch that a reorder then writes to the plain Y. The bias (per phase and
 * channel) sits in the scratch, copied there each run; the activation of
 * KilnFusedConvTranspose is the convolution's post-op, or applied to Y after
 * the interleave where kd_deferred_activation says so.
 */
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "kernels/dnnl/deconv.h"
#include "kernels/dnnl/dnnl_common.h"
#include "kernels/family.h"

#define PH_MAX_WASTE 2.0

/* Per spatial dim, index 0 = H and 1 = W; a 1-D node has H = 1 (s = k = kk = 1). */
struct ph_geom {
    int nsp, rank;
    int64_t n, c, m, mp, blk, mb; /* batch, channels in / out, out padded to blk, its blocks */
    int64_t s[2], k[2], kk[2], p[2], o[2], q[2], qlo[2], h[2], padl[2], padr[2];
    int64_t phases;
};

/* The geometry, or false where this kernel does not apply (the cheap checks). */
static bool ph_geometry(const struct kiln_compile_ctx *cc, struct ph_geom *g)
{
    int64_t group, out[KILN_MAX_RANK], pb[KILN_MAX_RANK], stride[KILN_MAX_RANK],
        dil[KILN_MAX_RANK];
    if (!kd_deconv_node_ok(cc, &group, out, pb, stride, dil)) return false;
    const struct kiln_type *x = cc->in[0], *w = cc->in[1], *y = cc->out[0];
    if (group != 1 || !cc->in_value || !cc->in_value[1] || x->rank > 4) return false;
    const int in_l = cc->in_layout ? cc->in_layout[0] : 0;
    const int out_l = cc->out_layout ? cc->out_layout[0] : 0;
    if ((in_l != 0 && in_l != 8 && in_l != 16) || (out_l != 0 && out_l != 8 && out_l != 16))
        return false;
    memset(g, 0, sizeof *g);
    g->rank = x->rank;
    g->nsp = x->rank - 2;
    g->n = x->dims[0];
    g->c = x->dims[1];
    g->m = y->dims[1];
    g->blk = out_l ? out_l : kiln_cpu_isa() == KILN_ISA_AVX512 ? 16 : 8;
    g->mp = (g->m + g->blk - 1) / g->blk * g->blk;
    g->mb = g->mp / g->blk;
    g->phases = 1;
    double waste = 1.0;
    int strided = 0;
    for (int d = 0; d < 2; d++) {
        int sd = d - (2 - g->nsp); /* the node's spatial dim, or < 0: the 1-D H */
        if (sd < 0) {
            g->s[d] = g->k[d] = g->kk[d] = g->o[d] = g->q[d] = g->h[d] = 1;
            continue;
        }
        if (dil[sd] != 1 || pb[sd] < 0) return false;
        g->s[d] = stride[sd];
        g->k[d] = w->dims[2 + sd];
        g->p[d] = pb[sd];
        g->o[d] = out[sd];
        g->h[d] = x->dims[2 + sd];
        g->kk[d] = (g->k[d] + g->s[d] - 1) / g->s[d];
        g->qlo[d] = g->p[d] / g->s[d];
        int64_t qhi = (g->o[d] - 1 + g->p[d]) / g->s[d];
        g->q[d] = qhi - g->qlo[d] + 1;
        g->padl[d] = g->kk[d] - 1 - g->qlo[d];
        g->padr[d] = qhi - (g->h[d] - 1);
        if (g->padl[d] < 0 || g->padr[d] < 0 || g->q[d] < 1) return false;
        strided |= g->s[d] > 1;
        waste *= (double)(g->kk[d] * g->s[d]) / (double)g->k[d];
        g->phases *= g->s[d];
    }
    return strided && waste <= PH_MAX_WASTE;
}

struct ph_state {
    struct ph_geom g;
    struct kd_exec pre, conv, post; /* X -> blocked X (has_pre); the convolution; Yb -> Y */
    int has_pre, has_post;
    float *bias;                    /* phases * mp floats, copied to the scratch each run */
    size_t bias_at, z_at, yb_at;    /* scratch offsets */
    size_t scratch_total, dst_bytes;
    int post_act;
};

struct ph_build {
    const struct kiln_compile_ctx *cc;
    const struct ph_geom *g;
    dnnl_memory_desc_t src, wplain, wany, bias, zmd;
    const float *wdata;
    char what[48];
    int post_act, src_scratch; /* X read from the scratch (at offset 0: the blocked copy) */
    size_t bias_rel, z_rel;
};

static dnnl_format_tag_t ph_tag(int rank, int64_t blk)
{
    if (rank == 3) return blk == 16 ? dnnl_aBc16b : dnnl_aBc8b;
    return blk == 16 ? dnnl_aBcd16b : dnnl_aBcd8b;
}

static kiln_status ph_make(void *arg, struct kd_variant *v, int threads)
{
    struct ph_build *b = arg;
    const struct kiln_node *n = b->cc->node;
    const struct ph_geom *g = b->g;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_convolution_desc_t cd;
    dnnl_dims_t st = {1, 1}, dl = {0, 0}, pl, pr;
    for (int i = 0; i < g->nsp; i++) {
        pl[i] = g->padl[2 - g->nsp + i];
        pr[i] = g->padr[2 - g->nsp + i];
    }
    kiln_status st_k = KILN_OK;
    (void)threads;
    dnnl_status_t r = dnnl_dilated_convolution_forward_desc_init(
        &cd, dnnl_forward_inference, dnnl_convolution_direct, &b->src, &b->wany, &b->bias,
        &b->zmd, st, dl, pl, pr);
    if (r == dnnl_success) r = dnnl_primitive_attr_create(&attr);
    if (r == dnnl_success) r = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (r == dnnl_success) r = dnnl_post_ops_create(&po);
    if (r == dnnl_success && n->op == KILN_OP_KilnFusedConvTranspose && !b->post_act &&
        !kd_append_activation(n, po))
        r = dnnl_unimplemented;
    if (r == dnnl_success) r = dnnl_primitive_attr_set_post_ops(attr, po);
    if (r == dnnl_success) r = kd_pd_create(&pd, &cd, attr);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (r != dnnl_success) return KILN_OK;
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
        !impl || strncmp(impl, "ref", 3) == 0 || strstr(impl, "gemm"))
        goto out; /* no direct kernel: oneDNN's deconvolution is the better fallback */
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    st_k = kd_pack_weights_from(b->cc, b->cc->in_value[1], b->wdata, b->what, &b->wplain, wmd,
                                1.0f, &v->packed);
    if (st_k != KILN_OK || !v->packed) goto out;
    st_k = kd_variant_init(n, pd, v);
    if (st_k != KILN_OK) goto out;
    if (b->src_scratch) kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_SCRATCH_AT, 0, &b->src);
    else kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_IN, 0, &b->src);
    kd_variant_arg(v, DNNL_ARG_WEIGHTS, KD_SRC_PACKED, 1, wmd);
    kd_variant_arg(v, DNNL_ARG_BIAS, KD_SRC_SCRATCH_AT, (int)b->bias_rel, &b->bias);
    kd_variant_arg(v, DNNL_ARG_DST, KD_SRC_SCRATCH_AT, (int)b->z_rel, &b->zmd);
out:
    dnnl_primitive_desc_destroy(pd);
    return st_k;
}

/* ---- the interleave: Z's phase blocks into Y's pixels ---- */

struct ph_job {
    const struct ph_geom *g;
    const float *z;
    float *y; /* blocked by g->blk */
};

static void ph_range(void *arg, int64_t begin, int64_t end)
{
    const struct ph_job *j = arg;
    const struct ph_geom *g = j->g;
    const int64_t B = g->blk, O0 = g->o[0], O1 = g->o[1], Q0 = g->q[0], Q1 = g->q[1];
    const int64_t zb = g->phases * g->mb, tail = g->m % B;
    for (int64_t u = begin; u < end; u++) {
        int64_t n = u / (g->mb * O0), mb = u / O0 % g->mb, oh = u % O0;
        int64_t th = oh + g->p[0], qh = th / g->s[0] - g->qlo[0], rh = th % g->s[0];
        float *dst = j->y + ((n * g->mb + mb) * O0 + oh) * O1 * B;
        for (int64_t rw = 0; rw < g->s[1]; rw++) {
            /* the outputs of phase (rh, rw) in this row: ow = q * s - p + rw */
            int64_t ow0 = ((rw - g->p[1]) % g->s[1] + g->s[1]) % g->s[1];
            int64_t ph = rh * g->s[1] + rw;
            const float *src = j->z + ((n * zb + ph * g->mb + mb) * Q0 + qh) * Q1 * B;
            int64_t qw = (ow0 + g->p[1]) / g->s[1] - g->qlo[1];
            if (B == 8) {
                for (int64_t ow = ow0; ow < O1; ow += g->s[1], qw++)
                    memcpy(dst + ow * 8, src + qw * 8, 8 * sizeof(float));
            } else {
                for (int64_t ow = ow0; ow < O1; ow += g->s[1], qw++)
                    memcpy(dst + ow * 16, src + qw * 16, 16 * sizeof(float));
            }
        }
        if (tail && mb == g->mb - 1) /* Y's padding lanes stay zero (an activation moved them) */
            for (int64_t ow = 0; ow < O1; ow++)
                memset(dst + ow * B + tail, 0, (size_t)(B - tail) * sizeof(float));
    }
}

static kiln_status ph_run(void *state, struct kiln_run_ctx *ctx)
{
    struct ph_state *s = state;
    struct kiln_run_ctx c2 = *ctx;
    void *heap = NULL;
    if (!c2.scratch) { /* callers without a plan arena */
        heap = c2.scratch = aligned_alloc(64, s->scratch_total);
        if (!heap) return kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY, "out of memory for scratch");
    }
    char *sc = c2.scratch;
    memcpy(sc + s->bias_at, s->bias, (size_t)(s->g.phases * s->g.mp) * sizeof(float));
    kiln_status st = KILN_OK;
    if (s->has_pre) st = kd_exec_run(&s->pre, &c2);
    if (st == KILN_OK) st = kd_exec_run(&s->conv, &c2);
    if (st == KILN_OK) {
        struct ph_job j = {&s->g, (const float *)(sc + s->z_at),
                           s->has_post ? (float *)(sc + s->yb_at) : ctx->out[0]->data};
        int64_t units = s->g.n * s->g.mb * s->g.o[0], per = s->g.o[1] * s->g.blk;
        kiln_parallel_for(ctx->threads, units, kiln_copy_grain(per * 4), ph_range, &j);
        if (s->has_post) st = kd_exec_run(&s->post, &c2);
    }
    if (st == KILN_OK && s->post_act)
        kd_apply_activation(s->post_act, ctx->out[0]->data, s->dst_bytes / sizeof(float),
                            ctx->threads);
    free(heap);
    return st;
}

static void ph_destroy(void *state)
{
    struct ph_state *s = state;
    kd_exec_destroy(&s->conv);
    if (s->has_pre) kd_exec_destroy(&s->pre);
    if (s->has_post) kd_exec_destroy(&s->post);
    free(s->bias);
    free(s);
}

/* Wc[(rh, rw, m)][c][j0][j1] = W[c][m][rh + (kk0 - 1 - j0) s0][rw + (kk1 - 1 - j1) s1], zero
 * outside the kernel and for the padding channels m >= M. */
static float *ph_weights(const struct ph_geom *g, const float *w)
{
    int64_t kk = g->kk[0] * g->kk[1], ks = g->k[0] * g->k[1];
    size_t count = (size_t)(g->phases * g->mp * g->c * kk);
    float *wc = calloc(count, sizeof *wc);
    if (!wc) return NULL;
    for (int64_t rh = 0; rh < g->s[0]; rh++)
        for (int64_t rw = 0; rw < g->s[1]; rw++)
            for (int64_t m = 0; m < g->m; m++)
                for (int64_t c = 0; c < g->c; c++)
                    for (int64_t j0 = 0; j0 < g->kk[0]; j0++)
                        for (int64_t j1 = 0; j1 < g->kk[1]; j1++) {
                            int64_t t0 = rh + (g->kk[0] - 1 - j0) * g->s[0];
                            int64_t t1 = rw + (g->kk[1] - 1 - j1) * g->s[1];
                            if (t0 >= g->k[0] || t1 >= g->k[1]) continue;
                            int64_t row = (rh * g->s[1] + rw) * g->mp + m;
                            wc[((row * g->c + c) * g->kk[0] + j0) * g->kk[1] + j1] =
                                w[(c * g->m + m) * ks + t0 * g->k[1] + t1];
                        }
    return wc;
}

static kiln_status ph_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    struct ph_geom g;
    if (!ph_geometry(cc, &g)) return KILN_OK;
    const struct kiln_type *x = cc->in[0], *y = cc->out[0];
    const kiln_tensor *bias_t = cc->n_in > 2 && cc->in_value ? cc->in_value[2] : NULL;
    if (cc->n_in > 2 && cc->in[2] && !bias_t) return KILN_OK; /* a bias computed at run time */
    const int in_l = cc->in_layout ? cc->in_layout[0] : 0;
    const int out_l = cc->out_layout ? cc->out_layout[0] : 0;
    const int rank = g.rank;
    struct ph_build b;
    memset(&b, 0, sizeof b);
    b.cc = cc;
    b.g = &g;
    if (n->op == KILN_OP_KilnFusedConvTranspose) b.post_act = kd_deferred_activation(n);
    dnnl_dims_t wd, zd, bd = {g.phases * g.mp};
    int64_t zdims[4] = {g.n, g.phases * g.mp, g.q[0], g.q[1]};
    wd[0] = g.phases * g.mp;
    wd[1] = g.c;
    for (int i = 0; i < g.nsp; i++) wd[2 + i] = g.kk[2 - g.nsp + i];
    zd[0] = zdims[0];
    zd[1] = zdims[1];
    for (int i = 0; i < g.nsp; i++) zd[2 + i] = zdims[2 + 2 - g.nsp + i];
    if (kd_md_act(&b.src, rank, x->dims, in_l) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&b.zmd, rank, zd, dnnl_f32, ph_tag(rank, g.blk)) !=
            dnnl_success ||
        dnnl_memory_desc_init_by_tag(&b.wany, rank, wd, dnnl_f32, dnnl_format_tag_any) !=
            dnnl_success ||
        kd_md_plain(&b.wplain, rank, (const int64_t *)wd) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&b.bias, 1, bd, dnnl_f32, dnnl_a) != dnnl_success)
        return KILN_OK;
    snprintf(b.what, sizeof b.what, "deconv_phase_s%lldx%lld_b%lld", (long long)g.s[0],
             (long long)g.s[1], (long long)g.blk);
    /* the phase weights are made from W's floats: W may be a reloadable weight an earlier
     * plan packed and released (a second precision's plan of the same model) */
    kiln_status ast = cc->weights ? kiln_weight_cache_acquire(cc->weights, cc->in_value[1], 0)
                                  : KILN_OK;
    if (ast != KILN_OK || !cc->in_value[1]->data) return ast;
    float *wc = ph_weights(&g, cc->in_value[1]->data);
    struct ph_state *s = calloc(1, sizeof *s);
    if (s) s->bias = calloc((size_t)(g.phases * g.mp), sizeof(float));
    if (!wc || !s || !s->bias) {
        free(wc);
        if (s) free(s->bias);
        free(s);
        return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    }
    b.wdata = wc;
    s->g = g;
    for (int64_t ph = 0; ph < g.phases; ph++)
        for (int64_t m = 0; m < g.m && bias_t; m++)
            s->bias[ph * g.mp + m] = ((const float *)bias_t->data)[m];
    /* scratch, before oneDNN's scratchpad is added: [X blocked][bias][Z][Y blocked] */
    dnnl_memory_desc_t xb;
    size_t xb_bytes = 0;
    double work = 2.0 * (double)(g.n * g.q[0] * g.q[1]) * (double)(g.phases * g.mp) *
                  (double)(g.c * g.kk[0] * g.kk[1]);
    int threads = kd_work_threads(cc, work), h = 0, hp = 0, hq = 0;
    kiln_status st = KILN_OK;
    for (int attempt = 0; attempt < 2 && st == KILN_OK && !h; attempt++) {
        if (attempt == 1) { /* X reordered into blocks first */
            if (in_l) break;
            dnnl_dims_t xd;
            for (int i = 0; i < rank; i++) xd[i] = x->dims[i];
            if (dnnl_memory_desc_init_by_tag(&xb, rank, xd, dnnl_f32, ph_tag(rank, g.blk)) !=
                dnnl_success)
                break;
            b.src = xb;
            b.src_scratch = 1;
            xb_bytes = (dnnl_memory_desc_get_size(&xb) + 63) / 64 * 64;
        }
        b.bias_rel = xb_bytes;
        b.z_rel = b.bias_rel + ((size_t)(g.phases * g.mp) * sizeof(float) + 63) / 64 * 64;
        st = kd_exec_build(&s->conv, threads, ph_make, &b, &h);
    }
    free(wc);
    size_t z_bytes = (dnnl_memory_desc_get_size(&b.zmd) + 63) / 64 * 64;
    size_t yb_rel = b.z_rel + z_bytes;
    dnnl_memory_desc_t ymd, ybmd;
    if (st == KILN_OK && h && b.src_scratch) {
        dnnl_memory_desc_t xmd;
        if (kd_md_act(&xmd, rank, x->dims, 0) == dnnl_success)
            st = kd_reorder_exec_build(cc, &xmd, KD_SRC_IN, 0, &xb, KD_SRC_SCRATCH_AT, 0,
                                       &s->pre, &hp);
        if (st == KILN_OK && !hp) {
            kd_exec_destroy(&s->conv);
            h = 0;
        }
    }
    if (st == KILN_OK && h && !out_l) { /* Y plain: interleave into blocks, then reorder */
        dnnl_dims_t yd;
        for (int i = 0; i < rank; i++) yd[i] = y->dims[i];
        if (kd_md_act(&ymd, rank, y->dims, 0) == dnnl_success &&
            dnnl_memory_desc_init_by_tag(&ybmd, rank, yd, dnnl_f32, ph_tag(rank, g.blk)) ==
                dnnl_success)
            st = kd_reorder_exec_build(cc, &ybmd, KD_SRC_SCRATCH_AT, (int)yb_rel, &ymd,
                                       KD_SRC_OUT, 0, &s->post, &hq);
        if (st == KILN_OK && !hq) {
            kd_exec_destroy(&s->conv);
            if (hp) kd_exec_destroy(&s->pre);
            h = hp = 0;
        }
    }
    size_t own = yb_rel + (hq ? (dnnl_memory_desc_get_size(&ybmd) + 63) / 64 * 64 : 0);
    size_t base = 0;
    if (st == KILN_OK && h) {
        base = kd_exec_scratch(&s->conv);
        if (hp && kd_exec_scratch(&s->pre) > base) base = kd_exec_scratch(&s->pre);
        if (hq && kd_exec_scratch(&s->post) > base) base = kd_exec_scratch(&s->post);
        base = (base + 63) / 64 * 64;
        if (base + own > (size_t)INT32_MAX) { /* scratch offsets are ints */
            kd_exec_destroy(&s->conv);
            if (hp) kd_exec_destroy(&s->pre);
            if (hq) kd_exec_destroy(&s->post);
            h = 0;
        }
    }
    if (st != KILN_OK || !h) {
        free(s->bias);
        free(s);
        return st;
    }
    kd_exec_shift_scratch(&s->conv, base);
    if (hp) kd_exec_shift_scratch(&s->pre, base);
    if (hq) kd_exec_shift_scratch(&s->post, base);
    s->has_pre = hp;
    s->has_post = hq;
    s->bias_at = base + b.bias_rel;
    s->z_at = base + b.z_rel;
    s->yb_at = base + yb_rel;
    s->scratch_total = base + own;
    s->post_act = b.post_act;
    dnnl_memory_desc_t dmd;
    s->dst_bytes = kd_md_act(&dmd, rank, y->dims, out_l) == dnnl_success
                       ? dnnl_memory_desc_get_size(&dmd)
                       : 0;
    inst->name = n->op == KILN_OP_KilnFusedConvTranspose ? "dnnl_fused_deconv_phase"
                                                         : "dnnl_deconv_phase";
    kd_inst_impl(inst, &s->conv);
    inst->state = s;
    inst->run = ph_run;
    inst->destroy = ph_destroy;
    inst->scratch_bytes = s->scratch_total;
    inst->packed = 1u << 1;
    return KILN_OK;
}

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/dnnl/deconv.def"
#undef KILN_KERNEL

bool kiln_k_dnnl_deconv_phase_covers(const struct kiln_compile_ctx *cc)
{
    struct ph_geom g;
    return ph_geometry(cc, &g);
}

kiln_status kiln_k_dnnl_deconv_phase_compile(const struct kiln_compile_ctx *cc,
                                             struct kiln_kernel_inst *inst)
{
    return ph_compile(cc, inst);
}
