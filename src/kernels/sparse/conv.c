/*
 * conv.c - the sparse fast kernel for 1x1 Conv / KilnFusedConv with a
 * constant, mostly-zero weight, and the per-node choice between it and the
 * dense (oneDNN) kernel (kiln_sparse_conv_select, sparse.h), which the
 * oneDNN conv file (src/kernels/dnnl/conv.c) calls as its compile.
 *
 * Handled: 2-D, kernel 1x1, stride 1, no padding, group 1; X f32
 * [N, Cin, H, W], W constant [Cout, Cin, 1, 1], an optional bias of Cout
 * values, KilnFusedConv without a residual Sum and with no activation or
 * Relu; fp32, or int8 in a plan compiled for KILN_PRECISION_INT8 on a CPU
 * with AVX-512 VNNI (dynamic quantization, as the dense int8 conv: one
 * scale and zero point for the whole X, symmetric s8 weights per output
 * channel). Everything else is the dense kernel's.
 *
 * Per image n, NCHW makes the convolution the SpMM of sparse.h with no
 * transpose at all: Y[n][co][p] = sum over ci of W[co][ci] * X[n][ci][p],
 * W^T[N = Cout][K = Cin] packed as MatMul's B and the pixels p = h * W + w
 * as the 16-lane dimension. The SpMM runs over (image, output channel)
 * ranges on kiln_parallel_for.
 *
 * Layouts: the layout pass decides before plans are compiled, and may have
 * blocked X or Y (nChw8c / nChw16c). Rather than keep such convolutions
 * dense or teach the pass about sparsity, the kernel takes any layout: a
 * blocked X is first copied to plain NCHW in scratch, and a blocked Y is
 * computed plain in scratch and then blocked (padding channels written 0).
 * Those copies are part of what is timed against the dense kernel, so the
 * choice stays measured on what really runs.
 *
 * The choice: as kiln_sparse_matmul_select (matmul.c): candidate nodes are
 * compiled both ways and timed on the node's real shape and layouts; the
 * result is kept in the weight cache under (weight, "sparse_conv_choice:...").
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/dnnl/dnnl_common.h"
#include "core/threadpool.h"
#include "kernels/ref/gemm.h"
#include "kernels/sparse/sparse.h"

#define SPC_ALIGN64(x) (((x) + 63) / 64 * 64)

struct spc_geom {
    int64_t batch, cin, cout, P;
    int lin, lout; /* layouts of X and Y: 0, 8, 16 */
    int has_bias, relu, is_int8;
};

struct spc_state {
    const struct kiln_sparse_w *w;
    struct kiln_sparse_w *own_w;
    struct spc_geom g;
    int isa, isa_f32; /* of the SpMM; of the fp32 copies */
    int64_t K4;
    size_t x_off, q_off, i_off, y_off, total; /* plain X; u8 X; interleaved u8; plain Y */
};

/* Whether the node is one the sparse conv handles; fills g. */
static int spc_geometry(const struct kiln_compile_ctx *cc, struct spc_geom *g)
{
    const struct kiln_node *n = cc->node;
    memset(g, 0, sizeof *g);
    if (cc->n_in < 2 || cc->n_out < 1 || !cc->in_value || !cc->in_value[1]) return 0;
    const struct kiln_type *x = cc->in[0], *w = cc->in[1], *y = cc->out[0];
    const struct kiln_type *bias = cc->n_in > 2 ? cc->in[2] : NULL;
    if (!x || !w || !y || x->dtype != KILN_DTYPE_F32 || w->dtype != KILN_DTYPE_F32 ||
        y->dtype != KILN_DTYPE_F32 || x->rank != 4 || w->rank != 4 || y->rank != 4)
        return 0;
    if (cc->in_value[1]->dtype != KILN_DTYPE_F32) return 0;
    if (w->dims[2] != 1 || w->dims[3] != 1 || w->dims[1] != x->dims[1] || w->dims[0] <= 0 ||
        w->dims[1] <= 0)
        return 0;
    if (y->dims[0] != x->dims[0] || y->dims[1] != w->dims[0] || y->dims[2] != x->dims[2] ||
        y->dims[3] != x->dims[3] || x->dims[0] <= 0 || x->dims[2] <= 0 || x->dims[3] <= 0)
        return 0;
    if (n->op == KILN_OP_KilnFusedConv) {
        if (cc->n_in > 3 && cc->in[3]) return 0; /* a residual Sum stays dense */
        const char *act = kiln_attr_str(n, "activation", "");
        if (act && act[0] && strcmp(act, "Relu")) return 0;
        g->relu = act && !strcmp(act, "Relu");
    }
    if (kiln_attr_int(n, "group", 1) != 1) return 0;
    struct kiln_window win;
    if (kiln_attr_check(n) != KILN_OK ||
        kiln_window_resolve(n, 2, x->dims + 2, w->dims + 2, false, &win) != KILN_OK ||
        kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return 0;
    }
    for (int i = 0; i < 2; i++)
        if (win.stride[i] != 1 || win.pad_begin[i] != 0 || win.pad_end[i] != 0 ||
            win.out[i] != y->dims[i + 2])
            return 0;
    if (bias) {
        if (bias->dtype != KILN_DTYPE_F32 || bias->rank != 1 || bias->dims[0] != w->dims[0]) return 0;
        g->has_bias = 1;
    }
    g->lin = cc->in_layout ? cc->in_layout[0] : 0;
    g->lout = cc->out_layout ? cc->out_layout[0] : 0;
    if ((g->lin && g->lin != 8 && g->lin != 16) || (g->lout && g->lout != 8 && g->lout != 16))
        return 0;
    if (cc->precision == 1) return 0; /* bf16 is dense */
    g->is_int8 = cc->precision == 2;
    if (g->is_int8 && kiln_sparse_isa(1) < 2) return 0; /* as the dense int8 path: VNNI only */
    g->batch = x->dims[0];
    g->cin = x->dims[1];
    g->cout = w->dims[0];
    g->P = x->dims[2] * x->dims[3];
    if ((uint64_t)g->batch * (uint64_t)(g->cin + 4) * (uint64_t)g->P > (uint64_t)INT32_MAX ||
        (uint64_t)g->batch * (uint64_t)(g->cout + 16) * (uint64_t)g->P > (uint64_t)INT32_MAX)
        return 0;
    return 1;
}

/* ---- packing: W [Cout, Cin] is W^T [N = Cout][K = Cin] of sparse.h ---- */

struct spc_pack_arg {
    const kiln_tensor *w;
    const struct spc_geom *g;
    int block;
};

static kiln_status spc_pack(void *arg, void **packed, size_t *bytes, void (**free_fn)(void *))
{
    struct spc_pack_arg *p = arg;
    struct kiln_sparse_w *s = NULL;
    kiln_status st = kiln_sparse_pack(p->w->data, p->g->cin, p->g->cout, 1, p->g->cin, p->block,
                                      p->g->is_int8, 1.0f, &s);
    if (st != KILN_OK) return st;
    *packed = s;
    *bytes = s->bytes;
    *free_fn = free;
    return KILN_OK;
}

/* ---- running ---- */

struct spc_job {
    const struct spc_state *s;
    const float *x;    /* X as given */
    float *y;          /* Y as given */
    const float *xp;   /* plain X */
    float *yp;         /* plain Y */
    const uint8_t *q;  /* u8 X, plain */
    uint8_t *qi;       /* u8 X interleaved by 4 along Cin, per image */
    int32_t zp;
    float sa;
    struct kiln_sparse_epi epi;
};

/* Channel blocks (n, cb) of a blocked X into plain X: each pixel's b channels are
 * read as one contiguous run and written to b rows (b sequential write streams). */
static void unblock_chunk(void *ctx, int64_t r0, int64_t r1)
{
    struct spc_job *j = ctx;
    const struct spc_geom *g = &j->s->g;
    int64_t b = g->lin, cb = kiln_layout_channels(g->cin, g->lin) / b, P = g->P;
    float *xp = (float *)j->xp;
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / cb, c0 = (r % cb) * b, nc = g->cin - c0 < b ? g->cin - c0 : b;
        const float *src = j->x + r * P * b;
        float *dst = xp + (n * g->cin + c0) * P;
        if (b == 16) { /* 16x16 tiles of (pixel, channel), the pixels' tail one by one */
            int64_t p0 = 0;
            for (; p0 + 16 <= P; p0 += 16)
                kiln_sparse_tr16(j->s->isa_f32, src + p0 * 16, 16, 16, dst + p0, P, (int)nc);
            for (int64_t l = 0; l < nc; l++)
                for (int64_t p = p0; p < P; p++) dst[l * P + p] = src[p * 16 + l];
            continue;
        }
        for (int64_t p0 = 0; p0 < P; p0 += 64) {
            int64_t p1 = p0 + 64 < P ? p0 + 64 : P;
            for (int64_t l = 0; l < nc; l++)
                for (int64_t p = p0; p < p1; p++) dst[l * P + p] = src[p * b + l];
        }
    }
}

/* Channel blocks (n, cb) of Y from plain Y (padding channels 0). */
static void block_chunk(void *ctx, int64_t r0, int64_t r1)
{
    struct spc_job *j = ctx;
    const struct spc_geom *g = &j->s->g;
    int64_t b = g->lout, cb = kiln_layout_channels(g->cout, g->lout) / b, P = g->P;
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / cb, c0 = (r % cb) * b, nc = g->cout - c0 < b ? g->cout - c0 : b;
        float *dst = j->y + r * P * b;
        const float *src = j->yp + (n * g->cout + c0) * P;
        if (b == 16) { /* 16x16 tiles of (channel, pixel), the pixels' tail one by one */
            int64_t p0 = 0;
            for (; p0 + 16 <= P; p0 += 16)
                kiln_sparse_tr16(j->s->isa_f32, src + p0, P, (int)nc, dst + p0 * 16, 16, 16);
            for (int64_t p = p0; p < P; p++)
                for (int64_t l = 0; l < 16; l++) dst[p * 16 + l] = l < nc ? src[l * P + p] : 0.0f;
            continue;
        }
        for (int64_t p0 = 0; p0 < P; p0 += 64) {
            int64_t p1 = p0 + 64 < P ? p0 + 64 : P;
            for (int64_t l = 0; l < nc; l++)
                for (int64_t p = p0; p < p1; p++) dst[p * b + l] = src[l * P + p];
            for (int64_t l = nc; l < b; l++)
                for (int64_t p = p0; p < p1; p++) dst[p * b + l] = 0.0f;
        }
    }
}

static void interleave_chunk(void *ctx, int64_t r0, int64_t r1) /* (n, k / 4) groups */
{
    struct spc_job *j = ctx;
    const struct spc_state *s = j->s;
    int64_t P = s->g.P, K = s->g.cin, kb4 = s->K4 / 4;
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / kb4, kb = r % kb4;
        uint8_t *o = j->qi + (n * kb4 + kb) * P * 4;
        for (int b = 0; b < 4; b++) {
            int64_t k = kb * 4 + b;
            const uint8_t *src = k < K ? j->q + (n * K + k) * P : NULL;
            for (int64_t p = 0; p < P; p++) o[p * 4 + b] = src ? src[p] : 0;
        }
    }
}

static void spmm_chunk(void *ctx, int64_t i0, int64_t i1) /* (image, output channel) ranges */
{
    struct spc_job *j = ctx;
    const struct spc_state *s = j->s;
    int64_t C = s->g.cout, P = s->g.P;
    while (i0 < i1) {
        int64_t n = i0 / C, c0 = i0 % C, c1 = n * C + C < i1 ? C : i1 - n * C;
        float *out = j->yp + n * C * P;
        if (s->g.is_int8)
            kiln_sparse_i8(s->isa, s->w, j->qi + n * s->K4 * P, P, j->zp, j->sa, out, P, c0, c1, &j->epi);
        else
            kiln_sparse_f32(s->isa, s->w, j->xp + n * s->g.cin * P, P, P, out, P, c0, c1, &j->epi);
        i0 = n * C + c1;
    }
}

static kiln_status spc_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct spc_state *s = state;
    const struct spc_geom *g = &s->g;
    int threads = ctx->threads > 0 ? ctx->threads : 1;
    void *heap = NULL;
    char *scratch = ctx->scratch;
    if (!scratch && s->total) {
        heap = scratch = aligned_alloc(64, s->total);
        if (!heap) return kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY, "out of memory for scratch");
    }
    struct spc_job j;
    memset(&j, 0, sizeof j);
    j.s = s;
    j.x = ctx->in[0]->data;
    j.y = ctx->out[0]->data;
    j.epi.bias = g->has_bias ? ctx->in[2]->data : NULL;
    j.epi.relu = g->relu;
    j.xp = j.x;
    if (g->lin) {
        j.xp = (const float *)(scratch + s->x_off);
        kiln_parallel_for(threads, g->batch * (kiln_layout_channels(g->cin, g->lin) / g->lin), 1,
                          unblock_chunk, &j);
    }
    j.yp = g->lout ? (float *)(scratch + s->y_off) : j.y;
    if (g->is_int8) {
        uint8_t *q = (uint8_t *)(scratch + s->q_off);
        kd_quantize_u8(j.xp, g->batch * g->cin * g->P, q, threads, &j.sa, &j.zp);
        j.q = q;
        j.qi = (uint8_t *)(scratch + s->i_off);
        kiln_parallel_for(threads, g->batch * (s->K4 / 4), 4, interleave_chunk, &j);
    }
    int64_t total = g->batch * g->cout;
    int64_t grain = total / (threads * 8) > 4 ? total / (threads * 8) : 4;
    kiln_parallel_for(threads, total, grain, spmm_chunk, &j);
    if (g->lout)
        kiln_parallel_for(threads, g->batch * (kiln_layout_channels(g->cout, g->lout) / g->lout), 1,
                          block_chunk, &j);
    free(heap);
    return KILN_OK;
}

static void spc_destroy(void *state)
{
    struct spc_state *s = state;
    free(s->own_w);
    free(s);
}

static kiln_status spc_compile(const struct kiln_compile_ctx *cc, const struct spc_geom *g, int block,
                               struct kiln_kernel_inst *inst)
{
    struct spc_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_node_error(cc->node, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    struct spc_pack_arg pa = {cc->in_value[1], g, block};
    kiln_status st;
    void *p = NULL;
    if (cc->weights) {
        char tag[160]; /* the tag of matmul.c's packing of the same matrix: shareable */
        snprintf(tag, sizeof tag, "sparse_%s_b%d:%lldx%lld:%lld,%lld:a%.9g", g->is_int8 ? "s8" : "f32",
                 g->is_int8 ? 4 : block, (long long)g->cin, (long long)g->cout, 1LL,
                 (long long)g->cin, 1.0);
        st = kiln_weight_cache_get(cc->weights, cc->in_value[1], tag, spc_pack, &pa, &p);
        s->w = p;
    } else {
        size_t bytes;
        void (*fr)(void *);
        st = spc_pack(&pa, &p, &bytes, &fr);
        s->w = s->own_w = p;
    }
    if (st != KILN_OK) {
        free(s);
        return st;
    }
    s->g = *g;
    s->isa = kiln_sparse_isa(g->is_int8);
    s->isa_f32 = kiln_sparse_isa(0);
    s->K4 = (g->cin + 3) / 4 * 4;
    size_t nx = (size_t)(g->batch * g->cin * g->P), ny = (size_t)(g->batch * g->cout * g->P);
    s->x_off = 0;
    s->q_off = s->x_off + (g->lin ? SPC_ALIGN64(sizeof(float) * nx) : 0);
    s->i_off = s->q_off + (g->is_int8 ? SPC_ALIGN64(nx) : 0);
    s->y_off = s->i_off + (g->is_int8 ? SPC_ALIGN64((size_t)(g->batch * s->K4 * g->P)) : 0);
    s->total = s->y_off + (g->lout ? SPC_ALIGN64(sizeof(float) * ny) : 0);
    int fused = cc->node->op == KILN_OP_KilnFusedConv;
    inst->name = g->is_int8 ? (fused ? "sparse_fused_conv_int8" : "sparse_conv_int8")
                            : (fused ? "sparse_fused_conv" : "sparse_conv");
    snprintf(inst->impl, sizeof inst->impl, "%s:block%d", s->isa == 2 ? "avx512_vnni" : s->isa ? "avx512" : "scalar",
             s->w->block);
    inst->state = s;
    inst->run = spc_run;
    inst->destroy = spc_destroy;
    inst->scratch_bytes = s->total;
    inst->packed = 1u << 1;
    return KILN_OK;
}

kiln_status kiln_sparse_conv_select(const struct kiln_compile_ctx *cc,
                                    struct kiln_kernel_inst *inst, kiln_fast_compile_fn dense)
{
    enum kiln_sparse_mode mode = kiln_sparse_mode();
    struct spc_geom g;
    if (mode == KILN_SPARSE_OFF || !spc_geometry(cc, &g)) return dense(cc, inst);
    const kiln_tensor *w = cc->in_value[1];
    char ctag[128];
    snprintf(ctag, sizeof ctag, "sparse_conv_choice:%lldx%lldx%lldx%lld:%d:%d:l%d,%d:t%d",
             (long long)g.batch, (long long)g.cin, (long long)g.cout, (long long)g.P, g.is_int8,
             g.relu, g.lin, g.lout, cc->threads);
    int choice = -1; /* 0 dense, 1 sparse (block 1), 4 sparse (block 4) */
    int *slot = NULL;
    if (cc->weights && mode == KILN_SPARSE_AUTO) {
        kiln_status st = kiln_sparse_choice_slot(cc, w, ctag, &slot);
        if (st != KILN_OK) return st;
        choice = *slot;
        if (choice == 0) return dense(cc, inst);
    }
    int block = choice > 0 ? choice : 1;
    if (choice < 0) { /* is the weight sparse enough? W [Cout, Cin]: k = ci at stride 1 */
        kiln_status st = cc->weights ? kiln_weight_cache_acquire(cc->weights, w, 0) : KILN_OK;
        if (st != KILN_OK) return st;
        if (!w->data) return dense(cc, inst);
        double d1 = kiln_sparse_density(w->data, g.cin, g.cout, 1, g.cin, 1);
        double d4 = kiln_sparse_density(w->data, g.cin, g.cout, 1, g.cin, 4);
        double d = g.is_int8 ? d4 : d1;
        if (d > KILN_SPARSE_MAX_DENSITY)
            choice = 0;
        else
            block = !g.is_int8 && g.cin % 4 == 0 && d4 <= d1 * 1.2 ? 4 : 1;
    }
    if (choice == 0) {
        kiln_status st = dense(cc, inst);
        if (st == KILN_OK && slot) *slot = 0;
        return st;
    }
    struct kiln_kernel_inst sp;
    memset(&sp, 0, sizeof sp);
    kiln_status st = spc_compile(cc, &g, block, &sp);
    if (st != KILN_OK) return st;
    if (choice > 0 || mode == KILN_SPARSE_FORCE) {
        *inst = sp;
        return KILN_OK;
    }
    st = dense(cc, inst);
    int wins = 1;
    if (st == KILN_OK && inst->run) st = kiln_sparse_measure(cc, &sp, inst, &wins);
    if (st != KILN_OK) {
        kiln_kernel_inst_destroy(&sp);
        return st;
    }
    if (wins) {
        kiln_kernel_inst_destroy(inst);
        *inst = sp;
    } else {
        kiln_kernel_inst_destroy(&sp);
    }
    if (slot) *slot = wins ? block : 0;
    return KILN_OK;
}
