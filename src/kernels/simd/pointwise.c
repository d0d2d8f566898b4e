/*
 * pointwise.c - f32 1x1 convolution of 1x1 images: Y[n] = act(W X[n] + b),
 * one matrix-vector product per image. EfficientNet-style squeeze-excitation
 * blocks run two per block (channels -> a few -> channels) on the pooled
 * image; oneDNN's convolution takes ~15-30 us for each of these ~50k-MAC
 * products (its generic GEMM path), this kernel 1-3 us.
 *
 * With up to KILN_SKINNY_MAX_M images (batch 1 to 16: the usual case) W is
 * packed once per model in the skinny kernel's panels (skinny.c) and the
 * product is split across threads by output channels: one image alone used
 * to run on one thread, through [C][M] rows read 32 columns at a time (a
 * 960 -> 240 reduction of mobilenet_v3 took 190 us there, 2.4 GFLOP/s).
 * With more images W is packed transposed, [C][M], and the product is the
 * SIMD table's register-tiled GEMM with the images as rows, split by images:
 * Y[N][M] = X[N][C] Wt[C][M]. Bias and activation follow per image (every
 * KilnFusedConv activation). With 1x1 images a channel-blocked value holds
 * each image's C channels contiguously, padded to a multiple of the block:
 * the padding lanes of Y are written as 0.
 */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/simd/pointwise.h"
#include "kernels/simd/simd.h"
#include "kernels/simd/skinny.h"

struct pw_state {
    const struct simd_kernels *k;
    int64_t n, c, m;          /* images, input and output channels */
    int64_t xs, ys;           /* floats per image in X and Y (block padding included) */
    const float *wt;          /* [C][M], owned by the weight cache */
    int skinny;               /* few images: sk runs the product */
    struct kiln_skinny sk;
    int has_bias;
    enum simd_unary act;
    int has_act;
    float alpha, beta;
    char name[40];
};

struct pw_job {
    const struct pw_state *s;
    const float *x, *b;
    float *y;
};

/* Images [begin, end). */
static void pw_range(void *arg, int64_t begin, int64_t end)
{
    const struct pw_job *j = arg;
    const struct pw_state *s = j->s;
    float *y = j->y + begin * s->ys;
    s->k->gemm(end - begin, s->m, s->c, 1.0f, j->x + begin * s->xs, s->xs, s->wt, s->m, y, s->ys);
    for (int64_t i = begin; i < end; i++, y += s->ys) {
        if (j->b) s->k->binary(SIMD_ADD, SIMD_B_VEC, y, j->b, y, s->m);
        if (s->has_act) s->k->unary(s->act, s->alpha, s->beta, y, y, s->m);
        if (s->ys > s->m) memset(y + s->m, 0, (size_t)(s->ys - s->m) * sizeof(float));
    }
}

static kiln_status pw_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct pw_state *s = state;
    struct pw_job j = {s, ctx->in[0]->data, s->has_bias ? ctx->in[2]->data : NULL,
                       ctx->out[0]->data};
    if (s->skinny) {
        kiln_skinny_run(&s->sk, j.x, s->xs, j.b, NULL, 0, j.y, s->ys, ctx->threads);
        if (s->ys > s->m)
            for (int64_t i = 0; i < s->n; i++)
                memset(j.y + i * s->ys + s->m, 0, (size_t)(s->ys - s->m) * sizeof(float));
        return KILN_OK;
    }
    /* chunks of at least ~256k multiply-adds (tens of us) */
    int64_t per_image = s->c * s->m, grain = (262144 + per_image - 1) / per_image;
    kiln_parallel_for(ctx->threads, s->n, grain, pw_range, &j);
    return KILN_OK;
}

struct pw_pack_arg {
    const kiln_tensor *w;
    int64_t c, m;
};

static void pw_pack_free(void *p) { free(p); }

/* [M, C, 1, 1] -> [C][M] */
static kiln_status pw_pack(void *arg, void **packed, size_t *bytes, void (**free_fn)(void *))
{
    const struct pw_pack_arg *a = arg;
    size_t n = (size_t)(a->c * a->m);
    float *out = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!out) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory packing 1x1 weights");
    const float *w = a->w->data;
    for (int64_t o = 0; o < a->m; o++)
        for (int64_t c = 0; c < a->c; c++) out[c * a->m + o] = w[o * a->c + c];
    *packed = out;
    *bytes = n * sizeof(float);
    *free_fn = pw_pack_free;
    return KILN_OK;
}

/* The fused activation of a KilnFusedConv or KilnFusedMatMul as a table op
 * (defaults as the ONNX ops'); false for one the table lacks. */
bool kiln_simd_fused_activation(const struct kiln_node *n, int *has_act, enum simd_unary *op,
                                float *alpha, float *beta)
{
    static const struct {
        const char *name;
        enum simd_unary op;
        float alpha, beta;
    } acts[] = {
        {"Relu", SIMD_RELU, 0, 0},
        {"LeakyRelu", SIMD_LEAKY_RELU, 0.01f, 0},
        {"Clip", SIMD_CLIP, -FLT_MAX, FLT_MAX},
        {"HardSwish", SIMD_HARD_SWISH, 0, 0},
        {"HardSigmoid", SIMD_HARD_SIGMOID, 0.2f, 0.5f},
        {"Sigmoid", SIMD_SIGMOID, 0, 0},
        {"SiLU", SIMD_SILU, 0, 0},
        {"Tanh", SIMD_TANH, 0, 0},
        {"Gelu", SIMD_GELU, 0, 0},
        {"GeluTanh", SIMD_GELU_TANH, 0, 0},
    };
    const char *a = n->op == KILN_OP_KilnFusedConv || n->op == KILN_OP_KilnFusedMatMul
                        ? kiln_attr_str(n, "activation", "") : "";
    *has_act = a[0] != 0;
    if (!*has_act) return true;
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        if (strcmp(a, acts[i].name) != 0) continue;
        *op = acts[i].op;
        *alpha = kiln_attr_float(n, "act_alpha", acts[i].alpha);
        *beta = kiln_attr_float(n, "act_beta", acts[i].beta);
        /* a Clip with lo > hi: the reference clamps in its own order */
        return *op != SIMD_CLIP || *alpha <= *beta;
    }
    return false;
}

kiln_status kiln_simd_pointwise_compile(const struct kiln_compile_ctx *cc,
                                        struct kiln_kernel_inst *inst)
{
    const struct kiln_type *x = cc->in[0], *w = cc->in[1], *y = cc->out[0];
    if (x->rank != 4 || w->rank != 4 || y->rank != 4) return KILN_OK;
    if (x->dims[2] != 1 || x->dims[3] != 1 || y->dims[2] != 1 || y->dims[3] != 1 ||
        w->dims[2] != 1 || w->dims[3] != 1 || w->dims[1] != x->dims[1] ||
        w->dims[0] != y->dims[1] || y->dims[0] != x->dims[0])
        return KILN_OK;
    if (cc->n_in > 3 && cc->in[3]) return KILN_OK; /* residual Sum: oneDNN's sum post-op */
    if (!cc->in_value[1] || !cc->weights) return KILN_OK;
    int lx = cc->in_layout ? cc->in_layout[0] : 0, ly = cc->out_layout ? cc->out_layout[0] : 0;
    struct pw_state st = {
        .k = simd_kernels_for(),
        .n = x->dims[0], .c = x->dims[1], .m = y->dims[1],
        .xs = kiln_layout_channels(x->dims[1], lx), .ys = kiln_layout_channels(y->dims[1], ly),
        .has_bias = cc->n_in > 2 && cc->in[2] != NULL,
    };
    if (!kiln_simd_fused_activation(cc->node, &st.has_act, &st.act, &st.alpha, &st.beta))
        return KILN_OK;
    void *packed = NULL;
    kiln_status rc;
    if (st.n <= KILN_SKINNY_MAX_M && kiln_skinny_enabled()) { /* few images: a stream through W */
        rc = kiln_skinny_init(&st.sk, cc->weights, cc->in_value[1], st.n, st.c, st.m, 1, 1.0f);
        st.skinny = 1;
        kiln_skinny_set_act(&st.sk, st.has_act, st.act, st.alpha, st.beta);
    } else {
        struct pw_pack_arg pa = {cc->in_value[1], st.c, st.m};
        rc = kiln_weight_cache_get(cc->weights, cc->in_value[1], "simd_conv1x1:CM", pw_pack, &pa,
                                   &packed);
    }
    if (rc != KILN_OK) return rc;
    struct pw_state *s = malloc(sizeof *s);
    if (!s) return kiln_node_error(cc->node, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    *s = st;
    s->wt = packed;
    snprintf(s->name, sizeof s->name, "f32_conv1x1_gemv_%s", s->k->isa);
    inst->name = s->name;
    inst->state = s;
    inst->run = pw_run;
    inst->destroy = free;
    inst->packed = 1u << 1;
    return KILN_OK;
}
