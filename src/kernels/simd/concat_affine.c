/*
 * concat_affine.c - a Concat along C folded into the per-channel affine op that
 * is its only reader (src/exec/plan.c, "Concat folded into its reader"):
 *
 *     y[n, a_k + c, h, w] = clamp(x_k[n, c, h, w] * s[a_k + c] + b[a_k + c], lo, hi)
 *
 * for every piece x_k of the Concat (a_k: its first channel in y). The reader is
 * a depthwise 1x1 convolution (what a BatchNormalization no convolution precedes
 * becomes, opt/conv_bn.c) with none, Relu or Clip fused: DenseNet's and other
 * pre-activation networks' Concat -> BatchNormalization -> Relu. The Concat's
 * output is then never stored: each piece is read once, by the step that had to
 * read the Concat's output anyway, and nothing is copied.
 *
 * Plain layout: any channel counts. Channel-blocked (nChw8c / nChw16c): every piece
 * but the last a whole number of blocks (the plan checks; a piece's blocks are then
 * whole blocks of y), the last one's padding lanes written as zeros. float32 only.
 * Work is split over the run's threads by (image, block or channel).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "kernels/fast.h"
#include "kernels/simd/simd.h"

#define CAFF_GRAIN 32768 /* elements per parallel chunk (a few microseconds of work) */

struct caff_state {
    int n;               /* pieces */
    int layout;          /* 0, 8 or 16 */
    int64_t HW;          /* H * W */
    int64_t y_units;     /* units (blocks, or channels when plain) of one image of y */
    int64_t n_units;     /* units of one image over all pieces */
    int64_t *unit_piece; /* per unit: its piece */
    int64_t *unit_in;    /* its index in the piece's image */
    int64_t *unit_out;   /* its index in y's image */
    int64_t *piece_units;/* per piece: units of one image */
    int64_t pad_from;    /* blocked: first padding lane of y's last block (layout: none) */
    float *s, *b;        /* per stored channel of y (padding lanes: 0) */
    float lo, hi;
    int isa;
    char name[32];
};

static void caff_free(void *p)
{
    struct caff_state *s = p;
    if (!s) return;
    free(s->unit_piece);
    free(s->unit_in);
    free(s->unit_out);
    free(s->piece_units);
    free(s->s);
    free(s->b);
    free(s);
}

/* One unit: hw rows of L lanes (L = 16, 8 or 1), scale and shift per lane. */
#define CAFF_LOOP(L)                                                                         \
    for (int64_t p = 0; p < hw; p++)                                                         \
        for (int l = 0; l < (L); l++) {                                                      \
            float v = x[p * (L) + l] * s[l] + b[l];                                          \
            v = v < lo ? lo : v;                                                             \
            y[p * (L) + l] = v > hi ? hi : v;                                                \
        }

#define CAFF_UNIT(SUFFIX, ATTR)                                                              \
    ATTR static void caff_unit##SUFFIX(const float *restrict x, float *restrict y,           \
                                       const float *restrict s, const float *restrict b,     \
                                       float lo, float hi, int64_t hw, int L)                \
    {                                                                                        \
        if (L == 16) {                                                                       \
            CAFF_LOOP(16)                                                                    \
        } else if (L == 8) {                                                                 \
            CAFF_LOOP(8)                                                                     \
        } else {                                                                             \
            const float s0 = s[0], b0 = b[0];                                                \
            for (int64_t p = 0; p < hw; p++) {                                               \
                float v = x[p] * s0 + b0;                                                    \
                v = v < lo ? lo : v;                                                         \
                y[p] = v > hi ? hi : v;                                                      \
            }                                                                                \
        }                                                                                    \
    }

CAFF_UNIT(_generic, )
#if defined(__x86_64__) || defined(__i386__)
CAFF_UNIT(_avx2, __attribute__((target("avx2,fma"))))
CAFF_UNIT(_avx512, __attribute__((target("avx512f,avx2,fma"))))
#endif

struct caff_job {
    const struct caff_state *s;
    const struct kiln_run_ctx *ctx;
};

static void caff_range(void *arg, int64_t begin, int64_t end)
{
    const struct caff_job *j = arg;
    const struct caff_state *s = j->s;
    int L = s->layout ? s->layout : 1;
    size_t unit = (size_t)(s->HW * L);
    float *yb = j->ctx->out[0]->data;
    for (int64_t t = begin; t < end; t++) {
        int64_t n = t / s->n_units, u = t % s->n_units;
        int64_t k = s->unit_piece[u];
        const float *x = (const float *)j->ctx->in[k]->data +
                         (size_t)(n * s->piece_units[k] + s->unit_in[u]) * unit;
        int64_t uo = s->unit_out[u];
        float *y = yb + (size_t)(n * s->y_units + uo) * unit;
        const float *sc = s->s + uo * L, *sh = s->b + uo * L;
#if defined(__x86_64__) || defined(__i386__)
        if (s->isa >= KILN_ISA_AVX512)
            caff_unit_avx512(x, y, sc, sh, s->lo, s->hi, s->HW, L);
        else if (s->isa >= KILN_ISA_AVX2)
            caff_unit_avx2(x, y, sc, sh, s->lo, s->hi, s->HW, L);
        else
#endif
            caff_unit_generic(x, y, sc, sh, s->lo, s->hi, s->HW, L);
        if (s->layout && uo == s->y_units - 1 && s->pad_from < L) /* y's padding lanes: 0 */
            for (int64_t p = 0; p < s->HW; p++)
                memset(y + p * L + s->pad_from, 0, sizeof(float) * (size_t)(L - s->pad_from));
    }
}

static kiln_status caff_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct caff_state *s = state;
    for (int k = 0; k < s->n; k++)
        if (!ctx->in[k]) return kiln_error(KILN_ERR_INTERNAL, "concat_affine: piece %d absent", k);
    int64_t images = ctx->out[0]->rank > 0 ? ctx->out[0]->dims[0] : 1;
    struct caff_job j = {s, ctx};
    int64_t unit = s->HW * (s->layout ? s->layout : 1);
    int64_t grain = unit >= CAFF_GRAIN ? 1 : CAFF_GRAIN / unit;
    kiln_parallel_for(ctx->threads, images * s->n_units, grain, caff_range, &j);
    return KILN_OK;
}

kiln_status kiln_concat_affine_compile(int n_pieces, const int64_t *chans, int layout, int64_t HW,
                                       const float *scale, const float *shift, float lo,
                                       float hi, struct kiln_kernel_inst *inst)
{
    if (n_pieces < 1 || HW < 1 || (layout != 0 && layout != 8 && layout != 16))
        return kiln_error(KILN_ERR_INTERNAL, "concat_affine: bad arguments");
    int L = layout ? layout : 1;
    int64_t C = 0, units = 0;
    for (int k = 0; k < n_pieces; k++) {
        if (chans[k] < 1 || (layout && k < n_pieces - 1 && chans[k] % L))
            return kiln_error(KILN_ERR_INTERNAL, "concat_affine: piece %d of %lld channels", k,
                              (long long)chans[k]);
        C += chans[k];
        units += (chans[k] + L - 1) / L;
    }
    int64_t y_units = (C + L - 1) / L;
    struct caff_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling a Concat");
    s->n = n_pieces;
    s->layout = layout;
    s->HW = HW;
    s->y_units = y_units;
    s->n_units = units;
    s->pad_from = layout ? C - (y_units - 1) * L : L;
    s->lo = lo;
    s->hi = hi;
    s->isa = (int)kiln_cpu_isa();
    s->unit_piece = malloc(sizeof(int64_t) * (size_t)units);
    s->unit_in = malloc(sizeof(int64_t) * (size_t)units);
    s->unit_out = malloc(sizeof(int64_t) * (size_t)units);
    s->piece_units = malloc(sizeof(int64_t) * (size_t)n_pieces);
    s->s = calloc((size_t)(y_units * L), sizeof(float));
    s->b = calloc((size_t)(y_units * L), sizeof(float));
    if (!s->unit_piece || !s->unit_in || !s->unit_out || !s->piece_units || !s->s || !s->b) {
        caff_free(s);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling a Concat");
    }
    memcpy(s->s, scale, sizeof(float) * (size_t)C);
    memcpy(s->b, shift, sizeof(float) * (size_t)C);
    int64_t u = 0, at = 0;
    for (int k = 0; k < n_pieces; k++) {
        s->piece_units[k] = (chans[k] + L - 1) / L;
        for (int64_t i = 0; i < s->piece_units[k]; i++, u++) {
            s->unit_piece[u] = k;
            s->unit_in[u] = i;
            s->unit_out[u] = at / L + i;
        }
        at += chans[k];
    }
    if (layout) snprintf(s->name, sizeof s->name, "concat_affine_blocked%d", layout);
    else snprintf(s->name, sizeof s->name, "concat_affine");
    inst->name = s->name;
    inst->state = s;
    inst->destroy = caff_free;
    inst->run = caff_run;
    return KILN_OK;
}
