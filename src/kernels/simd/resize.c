/*
 * resize.c - fast kernel for Resize and Upsample of 4-D float32 tensors on
 * their spatial axes (the upsampling of UNets, FPNs and segmentation heads),
 * in plain and channel-blocked layouts.
 *
 * The taps of each axis (input rows / columns and their weights) come from
 * the reference kernel's own code (src/kernels/ref/resample.h), computed
 * once when the plan is compiled, so every mode and coordinate mapping the
 * reference knows maps coordinates identically here: nearest with its
 * rounding modes, linear, cubic, antialias, exclude_outside, sizes with a
 * keep_aspect_ratio_policy. Only tf_crop_and_resize (extrapolated points)
 * and resizes of N or C stay on the reference kernel. Weights are applied in
 * single precision (the reference accumulates in double: results agree to a
 * few ulps; nearest is a copy and bit-exact).
 *
 * Each output row (one image, one channel or block of channels, one row) is
 * a weighted sum of ntap_h input rows, each resampled along W; rows are split
 * over the run's threads. Upsampling along H keeps the resampled input rows
 * in a small ring (RESIZE_CACHED), so each is resampled once, not once per
 * output row that reads it. Blocked (nChw8c / nChw16c), the lanes of a pixel
 * are contiguous and the sums run over whole blocks, lanes past the last
 * channel included (they are zero in, and stay zero out). Declared in the
 * copy family's list (copy.def, family.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "kernels/family.h"
#include "kernels/ref/resample.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/copy.def"
#undef KILN_KERNEL

#define RESIZE_MAX_TAPS KILN_RESIZE_FAST_TAPS

struct resize_state {
    int64_t planes;          /* N * C (plain) or N * blocks (blocked) */
    int64_t ih, iw, oh, ow;
    int l;                   /* lanes per pixel: 1 plain, 8 or 16 blocked */
    struct kiln_resize_axis th, tw;
    int nearest;             /* one tap of weight 1 on both axes: a gather */
    int cached;              /* upsampling along H: input rows resampled once (RESIZE_CACHED) */
    char name[40];
};

struct resize_job {
    const struct resize_state *s;
    const float *x;
    float *y;
};

static void resize_free(void *p)
{
    struct resize_state *s = p;
    kiln_resize_axis_free(&s->th);
    kiln_resize_axis_free(&s->tw);
    free(s);
}

/* Rows [b, e) of planes * oh, plain layout. */
static void resize_rows_plain(void *ctx, int64_t b, int64_t e)
{
    const struct resize_job *j = ctx;
    const struct resize_state *s = j->s;
    const int nh = s->th.ntap, nw = s->tw.ntap;
    for (int64_t r = b; r < e; r++) {
        int64_t p = r / s->oh, oy = r % s->oh;
        const float *xp = j->x + p * s->ih * s->iw;
        float *yr = j->y + r * s->ow;
        if (s->nearest) {
            const float *xr = xp + s->th.idx[oy] * s->iw;
            for (int64_t ox = 0; ox < s->ow; ox++) yr[ox] = xr[s->tw.idx[ox]];
            continue;
        }
        for (int64_t ox = 0; ox < s->ow; ox++) yr[ox] = 0.0f;
        for (int i = 0; i < nh; i++) {
            float wh = s->th.w[oy * nh + i];
            if (wh == 0.0f) continue;
            const float *xr = xp + s->th.idx[oy * nh + i] * s->iw;
            for (int64_t ox = 0; ox < s->ow; ox++) {
                const int64_t *ix = s->tw.idx + ox * nw;
                const float *ww = s->tw.w + ox * nw;
                float acc = 0.0f;
                for (int k = 0; k < nw; k++) acc += ww[k] * xr[ix[k]];
                yr[ox] += wh * acc;
            }
        }
    }
}

/* Rows [b, e) of planes * oh, blocked layout with L lanes (a compile-time constant in
 * each instance, so the lane loops vectorize). */
#define RESIZE_BLOCKED(L)                                                                  \
    static void resize_rows_b##L(void *ctx, int64_t b, int64_t e)                          \
    {                                                                                      \
        const struct resize_job *j = ctx;                                                  \
        const struct resize_state *s = j->s;                                               \
        const int nh = s->th.ntap, nw = s->tw.ntap;                                        \
        for (int64_t r = b; r < e; r++) {                                                  \
            int64_t p = r / s->oh, oy = r % s->oh;                                         \
            const float *xp = j->x + p * s->ih * s->iw * (L);                              \
            float *yr = j->y + r * s->ow * (L);                                            \
            if (s->nearest) {                                                              \
                const float *xr = xp + s->th.idx[oy] * s->iw * (L);                        \
                for (int64_t ox = 0; ox < s->ow; ox++)                                     \
                    memcpy(yr + ox * (L), xr + s->tw.idx[ox] * (L), sizeof(float) * (L));  \
                continue;                                                                  \
            }                                                                              \
            for (int64_t ox = 0; ox < s->ow; ox++) {                                       \
                float acc[L];                                                              \
                for (int l = 0; l < (L); l++) acc[l] = 0.0f;                               \
                for (int i = 0; i < nh; i++) {                                             \
                    float wh = s->th.w[oy * nh + i];                                       \
                    if (wh == 0.0f) continue;                                              \
                    const float *xr = xp + s->th.idx[oy * nh + i] * s->iw * (L);           \
                    for (int k = 0; k < nw; k++) {                                         \
                        float wk = wh * s->tw.w[ox * nw + k];                              \
                        const float *xv = xr + s->tw.idx[ox * nw + k] * (L);               \
                        for (int l = 0; l < (L); l++) acc[l] += wk * xv[l];                \
                    }                                                                      \
                }                                                                          \
                memcpy(yr + ox * (L), acc, sizeof acc);                                    \
            }                                                                              \
        }                                                                                  \
    }
RESIZE_BLOCKED(8)
RESIZE_BLOCKED(16)

/* Upsampling along H (oh >= ih): consecutive output rows read the same input rows, so
 * each input row is resampled along W once into a ring of RESIZE_RING rows on the
 * stack (at most RESIZE_RING_FLOATS floats), and an output row is then the weighted sum
 * of its ntap_h cached rows: contiguous and vectorizable. Before, every output row
 * resampled its input rows again (a 4x bilinear upsampling of 21 planes of 24 x 24,
 * lraspp's head, took 0.6 ms). */
#define RESIZE_RING (KILN_RESIZE_FAST_TAPS + 1)

/* y = sum of w[i] * h[i] over n rows (0 + the first term, as the per-pixel loops add). */
static void resize_blend(float *restrict y, int64_t len, const float *const *h, const float *w,
                         int n)
{
    if (n == 0) {
        memset(y, 0, (size_t)len * sizeof(float));
        return;
    }
    const float *restrict h0 = h[0];
    const float w0 = w[0];
    if (n == 2) { /* linear: the common case in one pass */
        const float *restrict h1 = h[1];
        const float w1 = w[1];
        for (int64_t x = 0; x < len; x++) y[x] = w0 * h0[x] + w1 * h1[x];
        return;
    }
    for (int64_t x = 0; x < len; x++) y[x] = w0 * h0[x];
    for (int i = 1; i < n; i++) {
        const float *restrict hi = h[i];
        const float wi = w[i];
        for (int64_t x = 0; x < len; x++) y[x] += wi * hi[x];
    }
}
#define RESIZE_RING_FLOATS 16384
#define RESIZE_CACHED(L)                                                                   \
    static void resize_rows_c##L(void *ctx, int64_t b, int64_t e)                          \
    {                                                                                      \
        const struct resize_job *j = ctx;                                                  \
        const struct resize_state *s = j->s;                                               \
        const int nh = s->th.ntap, nw = s->tw.ntap;                                        \
        const int64_t row = s->ow * (L);                                                   \
        float ring[RESIZE_RING_FLOATS];                                                    \
        int64_t key[RESIZE_RING]; /* plane * ih + input row held by each slot, or -1 */    \
        for (int i = 0; i < RESIZE_RING; i++) key[i] = -1;                                 \
        int next = 0;                                                                      \
        for (int64_t r = b; r < e; r++) {                                                  \
            int64_t p = r / s->oh, oy = r % s->oh;                                         \
            const float *xp = j->x + p * s->ih * s->iw * (L);                              \
            float *yr = j->y + r * row;                                                    \
            const float *hr[KILN_RESIZE_FAST_TAPS];                                        \
            float wh[KILN_RESIZE_FAST_TAPS];                                               \
            int n = 0;                                                                     \
            for (int i = 0; i < nh; i++) {                                                 \
                float w = s->th.w[oy * nh + i];                                            \
                if (w == 0.0f) continue;                                                   \
                int64_t iy = s->th.idx[oy * nh + i], k = p * s->ih + iy;                   \
                int slot = -1;                                                             \
                for (int q = 0; q < RESIZE_RING && slot < 0; q++)                          \
                    if (key[q] == k) slot = q;                                             \
                if (slot < 0) { /* resample input row iy along W into the oldest slot */   \
                    slot = next;                                                           \
                    next = (next + 1) % (nh + 1);                                          \
                    key[slot] = k;                                                         \
                    const float *xr = xp + iy * s->iw * (L);                               \
                    float *h = ring + slot * row;                                          \
                    for (int64_t ox = 0; ox < s->ow; ox++) {                               \
                        float acc[L];                                                      \
                        for (int l = 0; l < (L); l++) acc[l] = 0.0f;                       \
                        for (int t = 0; t < nw; t++) {                                     \
                            float wk = s->tw.w[ox * nw + t];                               \
                            const float *xv = xr + s->tw.idx[ox * nw + t] * (L);           \
                            for (int l = 0; l < (L); l++) acc[l] += wk * xv[l];            \
                        }                                                                  \
                        memcpy(h + ox * (L), acc, sizeof acc);                             \
                    }                                                                      \
                }                                                                          \
                hr[n] = ring + slot * row;                                                 \
                wh[n++] = w;                                                               \
            }                                                                              \
            resize_blend(yr, row, hr, wh, n);                                              \
        }                                                                                  \
    }
RESIZE_CACHED(1)
RESIZE_CACHED(8)
RESIZE_CACHED(16)

static kiln_status resize_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct resize_state *s = state;
    struct resize_job j = {s, ctx->in[0]->data, ctx->out[0]->data};
    int64_t rows = s->planes * s->oh;
    int64_t per_row = s->ow * s->l * (s->nearest ? 1 : s->th.ntap * s->tw.ntap);
    int64_t grain = per_row >= 4096 ? 1 : 4096 / (per_row + 1) + 1;
    kiln_range_fn fn = s->l == 16 ? resize_rows_b16 : s->l == 8 ? resize_rows_b8
                                                                : resize_rows_plain;
    if (s->cached)
        fn = s->l == 16 ? resize_rows_c16 : s->l == 8 ? resize_rows_c8 : resize_rows_c1;
    kiln_parallel_for(ctx->threads, rows, grain, fn, &j);
    return KILN_OK;
}

/* Where scales / sizes / roi are among the inputs, by op and opset. */
static void resize_inputs(const struct kiln_compile_ctx *cc, bool upsample,
                          const kiln_tensor **roi, const kiln_tensor **scales,
                          const kiln_tensor **sizes, bool *unknown)
{
    const struct kiln_node *n = cc->node;
    *roi = *scales = *sizes = NULL;
    *unknown = false;
    int i_roi = -1, i_scales = 1, i_sizes = -1;
    if (!upsample && n->opset >= 11) {
        i_roi = 1;
        i_scales = 2;
        i_sizes = 3;
    }
    const int idx[3] = {i_roi, i_scales, i_sizes};
    const kiln_tensor **dst[3] = {roi, scales, sizes};
    for (int k = 0; k < 3; k++) {
        int i = idx[k];
        if (i < 0 || i >= cc->n_in || !cc->in[i]) continue;
        if (!cc->in_value || !cc->in_value[i]) *unknown = true;
        else *dst[k] = cc->in_value[i];
    }
}

static kiln_status resize_compile_as(const struct kiln_compile_ctx *cc,
                                     struct kiln_kernel_inst *inst, bool upsample)
{
    const struct kiln_node *n = cc->node;
    const struct kiln_type *x = cc->in[0], *y = cc->n_out > 0 ? cc->out[0] : NULL;
    int lx = cc->in_layout ? cc->in_layout[0] : 0, ly = cc->out_layout ? cc->out_layout[0] : 0;
    if (!x || !y || x->dtype != KILN_DTYPE_F32 || y->dtype != KILN_DTYPE_F32 || x->rank != 4 ||
        y->rank != 4 || !kiln_type_is_concrete(x) || !kiln_type_is_concrete(y) || lx != ly)
        goto decline;
    const kiln_tensor *roi, *scales, *sizes;
    bool unknown;
    resize_inputs(cc, upsample, &roi, &scales, &sizes, &unknown);
    if (unknown) goto decline;
    struct resize_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    int64_t od[4];
    if (!kiln_resize_hw(n, upsample, x->dims, roi, scales, sizes, RESIZE_MAX_TAPS, od, &s->th,
                        &s->tw)) {
        free(s);
        goto decline;
    }
    for (int d = 0; d < 4; d++)
        if (od[d] != y->dims[d]) {
            resize_free(s);
            goto decline; /* the reference reports it */
        }
    int l = lx ? lx : 1;
    int64_t units = lx ? (x->dims[1] + lx - 1) / lx : x->dims[1];
    s->planes = x->dims[0] * units;
    s->ih = x->dims[2];
    s->iw = x->dims[3];
    s->oh = od[2];
    s->ow = od[3];
    s->l = l;
    s->nearest = s->th.ntap == 1 && s->tw.ntap == 1;
    for (int64_t o = 0; s->nearest && o < s->oh; o++) s->nearest = s->th.w[o] == 1.0f;
    for (int64_t o = 0; s->nearest && o < s->ow; o++) s->nearest = s->tw.w[o] == 1.0f;
    /* the ring of rows: nh + 1 slots, the nh rows of one output row and the next one's */
    s->cached = !s->nearest && s->oh >= s->ih &&
                (int64_t)(s->th.ntap + 1) * s->ow * l <= RESIZE_RING_FLOATS;
    snprintf(s->name, sizeof s->name, "resize_%s%s%d", s->nearest ? "nearest" : "taps",
             lx ? "_blocked" : "", lx ? lx : 4);
    inst->name = s->name;
    inst->state = s;
    inst->destroy = resize_free;
    inst->run = resize_run;
    return KILN_OK;
decline:
    /* the reference kernel reads plain data only: a blocked node must be taken here
     * (the layout pass asked kiln_resize_attrs_hw and checked the inputs are constant) */
    if (lx || ly)
        return kiln_node_error(n, KILN_ERR_INTERNAL,
                               "blocked %s the fast kernel cannot compute",
                               upsample ? "Upsample" : "Resize");
    return KILN_OK;
}

bool kiln_k_resize_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 1 && cc->in[0] && cc->in[0]->dtype == KILN_DTYPE_F32 &&
           cc->in[0]->rank == 4 && cc->n_out > 0 && cc->out[0];
}

kiln_status kiln_k_resize_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    return resize_compile_as(cc, inst, false);
}

kiln_status kiln_k_upsample_compile(const struct kiln_compile_ctx *cc,
                                    struct kiln_kernel_inst *inst)
{
    return resize_compile_as(cc, inst, true);
}

/* Layout pass: the data input and the output may be blocked; layout.c checks the
 * shapes (N and C unchanged) and that scales / sizes are constants. */
int kiln_k_resize_accepts(const struct kiln_node *n, int i, int block)
{
    return (i == 0 || i == -1) && (block == 8 || block == 16) &&
           kiln_resize_attrs_hw(n, n->op == KILN_OP_Upsample);
}
