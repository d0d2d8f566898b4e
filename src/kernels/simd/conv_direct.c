/*
 * conv_direct.c - Kiln's direct convolution for few output channels on plain
 * (NCHW) storage, a kernel of the conv family (dnnl/conv.def) tried before
 * oneDNN's.
 *
 * An image-to-image network ends in a convolution to its 3 colours (style
 * transfer, super-resolution, denoising) or 1 channel (depth, a mask); the
 * value is plain there (the graph's output). oneDNN has no direct kernel for
 * fewer output channels than its channel block, blocked or not: it runs its
 * im2col GEMM, which for a 9x9 convolution of 32 channels to 3 on a 96x96
 * image builds a 96 MB column matrix and ran at 10 GFLOP/s (13.8 ms, half of
 * a style-transfer network). Here each image is copied once into a
 * zero-padded buffer in the kernel's scratch, and each output row runs up to
 * four output channels times 3 to 8 vectors of pixels in registers
 * (conv_direct_body.h): every tap is a load per pixel vector and one broadcast
 * weight per output channel.
 *
 * Taken where: rank 4, float32, plain input and output, one group, stride 1
 * and dilation 1, constant weights, output channels that oneDNN's blocks would pad by
 * more than 40% (cd_channels_ok: up to 7, and 9, which fills 9 of 16 lanes), a constant
 * rank-1 bias or none, no residual Sum, and a fused activation the SIMD
 * tables compute (kiln_simd_fused_activation).
 */
#include <stdio.h>
#include <string.h>

#include "core/threadpool.h"
#include "kernels/family.h"
#include "kernels/ref/gemm.h"
#include "kernels/simd/pointwise.h"
#include "kernels/simd/simd.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/dnnl/conv.def"
#undef KILN_KERNEL

#define CD_MAX_M 9

/* oneDNN pads the output channels to its block (8, or 16 with AVX-512) and runs at 70-85%
 * of the FMA peak; this kernel at about half of it (style transfer's 9x9 to 3 channels:
 * 46%; ESPCN's 3x3 from 32 to 9 channels: 48%, against oneDNN's 32 on 16 padded lanes).
 * It takes the counts whose padding wastes more than 40% on either block: 1 to 7, and 9
 * (not 8: one whole AVX2 block). */
static bool cd_channels_ok(int64_t m)
{
    return m >= 1 && m <= CD_MAX_M && m != 8;
}

struct cd_state {
    const struct simd_kernels *k;
    int64_t n, c, h, w, m, kh, kw, dh, dw, pt, pl, oh, ow;
    int64_t ph, pw;   /* the padded image: ph rows of pw floats (slack included) */
    int has_act;
    enum simd_unary act;
    float alpha, beta;
    char name[48];
};

struct cd_job {
    const struct cd_state *s;
    const float *x, *w, *bias;
    float *y, *pad;
};

/* Planes (image, channel) [begin, end) into the padded buffer: zeros around the image. */
static void cd_pad_range(void *arg, int64_t begin, int64_t end)
{
    const struct cd_job *j = arg;
    const struct cd_state *s = j->s;
    for (int64_t p = begin; p < end; p++) {
        float *dst = j->pad + p * s->ph * s->pw;
        const float *src = j->x + p * s->h * s->w;
        memset(dst, 0, sizeof(float) * (size_t)(s->pt * s->pw));
        for (int64_t r = 0; r < s->h; r++) {
            float *row = dst + (s->pt + r) * s->pw;
            memset(row, 0, sizeof(float) * (size_t)s->pl);
            memcpy(row + s->pl, src + r * s->w, sizeof(float) * (size_t)s->w);
            memset(row + s->pl + s->w, 0, sizeof(float) * (size_t)(s->pw - s->pl - s->w));
        }
        memset(dst + (s->pt + s->h) * s->pw, 0,
               sizeof(float) * (size_t)((s->ph - s->pt - s->h) * s->pw));
    }
}

/* Output rows (image, oy) [begin, end). */
static void cd_row_range(void *arg, int64_t begin, int64_t end)
{
    const struct cd_job *j = arg;
    const struct cd_state *s = j->s;
    for (int64_t t = begin; t < end; t++) {
        int64_t img = t / s->oh, oy = t % s->oh;
        struct simd_conv_row r = {
            .x = j->pad + (img * s->c * s->ph + oy) * s->pw,
            .w = j->w,
            .bias = j->bias,
            .y = j->y + (img * s->m * s->oh + oy) * s->ow,
            .x_plane = s->ph * s->pw,
            .x_row = s->pw,
            .y_plane = s->oh * s->ow,
            .c = s->c, .m = s->m, .kh = s->kh, .kw = s->kw, .dh = s->dh, .dw = s->dw,
            .ow = s->ow,
        };
        s->k->conv_direct_row(&r);
        if (s->has_act)
            for (int64_t mi = 0; mi < s->m; mi++) {
                float *y = r.y + mi * r.y_plane;
                s->k->unary(s->act, s->alpha, s->beta, y, y, s->ow);
            }
    }
}

static kiln_status cd_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct cd_state *s = state;
    struct cd_job j = {s, ctx->in[0]->data, ctx->in[1]->data,
                       ctx->n_in > 2 && ctx->in[2] ? ctx->in[2]->data : NULL,
                       ctx->out[0]->data, ctx->scratch};
    int64_t plane = s->ph * s->pw;
    kiln_parallel_for(ctx->threads, s->n * s->c, plane >= SIMD_GRAIN_CHEAP ? 1
                                                                          : SIMD_GRAIN_CHEAP / plane,
                      cd_pad_range, &j);
    /* a row's multiply-adds: m * ow * c * kh * kw */
    int64_t per = s->m * s->ow * s->c * s->kh * s->kw;
    kiln_parallel_for(ctx->threads, s->n * s->oh, per >= 65536 ? 1 : 65536 / per, cd_row_range,
                      &j);
    return KILN_OK;
}

static kiln_status cd_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst,
                              const struct simd_kernels *k)
{
    const struct kiln_node *n = cc->node;
    const struct kiln_type *x = cc->in[0], *y = cc->n_out > 0 ? cc->out[0] : NULL;
    const kiln_tensor *w = cc->n_in > 1 && cc->in_value ? cc->in_value[1] : NULL;
    if (!x || !y || !w || x->rank != 4 || y->rank != 4 || w->rank != 4 ||
        x->dtype != KILN_DTYPE_F32 || y->dtype != KILN_DTYPE_F32 || w->dtype != KILN_DTYPE_F32 ||
        !kiln_type_is_concrete(x) || !kiln_type_is_concrete(y))
        return KILN_OK;
    if ((cc->in_layout && cc->in_layout[0]) || (cc->out_layout && cc->out_layout[0]))
        return KILN_OK;
    if (cc->precision != KILN_PRECISION_FP32) return KILN_OK; /* bf16 / int8: oneDNN's */
    if (cc->n_in > 3 && cc->in[3]) return KILN_OK; /* residual Sum */
    if (cc->n_in > 2 && cc->in[2]) {
        const kiln_tensor *b = cc->in_value ? cc->in_value[2] : NULL;
        if (!b || b->dtype != KILN_DTYPE_F32 || kiln_tensor_count(b) != w->dims[0]) return KILN_OK;
    }
    if (kiln_attr_int(n, "group", 1) != 1) return KILN_OK;
    int64_t m = w->dims[0];
    if (!cd_channels_ok(m) || w->dims[1] != x->dims[1] || y->dims[1] != m) return KILN_OK;
    struct kiln_window win;
    kiln_status rs = kiln_window_resolve(n, 2, x->dims + 2, w->dims + 2, 0, &win);
    if (kiln_attr_check(n) != KILN_OK || rs != KILN_OK) {
        kiln_error_clear();
        return KILN_OK;
    }
    if (win.stride[0] != 1 || win.stride[1] != 1 || win.dilation[0] != 1 ||
        win.dilation[1] != 1 || win.pad_begin[0] < 0 ||
        win.pad_begin[1] < 0 || win.pad_end[0] < 0 || win.pad_end[1] < 0 ||
        win.out[0] != y->dims[2] || win.out[1] != y->dims[3] || win.out[0] < 1 || win.out[1] < 1)
        return KILN_OK;
    int has_act = 0;
    enum simd_unary act = SIMD_RELU;
    float alpha = 0, beta = 0;
    if (n->op == KILN_OP_KilnFusedConv &&
        !kiln_simd_fused_activation(n, &has_act, &act, &alpha, &beta))
        return KILN_OK;
    struct cd_state st = {.k = k, .n = x->dims[0], .c = x->dims[1], .h = x->dims[2],
                          .w = x->dims[3], .m = m, .kh = w->dims[2], .kw = w->dims[3],
                          .dh = win.dilation[0], .dw = win.dilation[1], .pt = win.pad_begin[0],
                          .pl = win.pad_begin[1], .oh = win.out[0], .ow = win.out[1],
                          .has_act = has_act, .act = act, .alpha = alpha, .beta = beta};
    st.ph = st.h + win.pad_begin[0] + win.pad_end[0];
    /* the row's last block of NV <= 8 vectors (conv_direct_body.h, CD_MAX_NV) starts below
     * ow, so it reads below ow + 8 lanes, and (kw - 1) dw further */
    int64_t need = st.ow + 8 * k->lanes + (st.kw - 1) * st.dw;
    st.pw = st.w + win.pad_begin[1] + win.pad_end[1];
    if (st.pw < need) st.pw = need;
    double bytes = 4.0 * (double)st.n * (double)st.c * (double)st.ph * (double)st.pw;
    if (bytes > 1e9) return KILN_OK;
    struct cd_state *s = malloc(sizeof *s);
    if (!s) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    *s = st;
    snprintf(s->name, sizeof s->name, "f32_direct_plain_conv_%s", k->isa);
    inst->name = s->name;
    inst->state = s;
    inst->run = cd_run;
    inst->destroy = free;
    inst->scratch_bytes = ((size_t)bytes + 63) / 64 * 64;
    return KILN_OK;
}

SIMD_VARIANTS(conv_direct, cd_compile)
SIMD_VARIANTS(fused_conv_direct, cd_compile)

/* The cheap part of the test: plain f32 rank 4 with constant 4-D weights of one group and at
 * output channels cd_channels_ok takes. */
bool kiln_k_conv_direct_covers(const struct kiln_compile_ctx *cc)
{
    const kiln_tensor *w = cc->n_in > 1 && cc->in_value ? cc->in_value[1] : NULL;
    return cc->n_in >= 2 && cc->in[0] && cc->in[0]->rank == 4 && w && w->rank == 4 &&
           cd_channels_ok(w->dims[0]) && cc->n_out >= 1 && cc->out[0];
}
