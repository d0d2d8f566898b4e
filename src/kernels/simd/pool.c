/*
 * pool.c - SIMD kernels for MaxPool, AveragePool, GlobalAveragePool and
 * GlobalMaxPool on float32 channel-blocked (nChw8c / nChw16c) and
 * channels-last values, where a pixel's channels are consecutive floats and
 * each window tap is a run of vector loads (the loops: pool_body.h, one per
 * SIMD table), 1-D windows over plain [N, C, L] values (stride-1 windows
 * W outputs at a time; non-overlapping windows of 2 or 4 by splitting vector
 * pairs by parity, vdeint), and the global pools, plain NCHW included (a row
 * reduction per channel). A NaN in a max window gives NaN, as in the
 * reference and PyTorch; oneDNN's max pooling, behind these, drops it.
 *
 * Why not only oneDNN's pooling primitive (dnnl/pool.c, below these in the
 * pooling family's list, pool.def): on the small images of a CNN's later
 * stages its fixed cost per call is tens of microseconds, several times the
 * work (squeezenet1_1's three 3x3 max pools took 16% of the model at batch
 * 1), and its plain 1-D pooling is a slow reference loop (1.2 ms of a 1.5 ms
 * audio model). Declined here and left to it: plain 2-D windows, 3-D windows,
 * MaxPool's Indices output, windows with no input element, other dtypes.
 *
 * Geometry is the reference's (kiln_window_resolve): ceil_mode's extra room
 * on the right holds no input and counts in no divisor; count_include_pad
 * counts the declared pads only, as kernels/ref/pool.c does.
 */
#include <stdio.h>

#include "core/threadpool.h"
#include "kernels/family.h"
#include "kernels/ref/gemm.h"
#include "kernels/simd/simd.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/dnnl/pool.def"
#undef KILN_KERNEL

struct spool_state {
    const struct simd_kernels *k;
    int global;
    /* windowed: per outer slice (an image's channel block, or an image) oh rows */
    int64_t outer, ih, oh, kh, sh, dh, ph, pb; /* pb: the declared bottom pad */
    struct simd_pool_row row;
    /* global: outer slices of `pixels` pixels of `inner` floats, one slice per image
     * (channels last) or per image and channel block; y the same slices (blocked or
     * channels last), or plain [N][C] from blocked slices (plain_out: C channels an
     * image, the padding lanes dropped) */
    int64_t pixels, inner, channels, blocks, plain_rows;
    int plain_out;
    int kind;
    char name[40];
};

struct spool_job {
    const struct spool_state *s;
    const float *x;
    float *y;
};

static void window_range(void *arg, int64_t begin, int64_t end)
{
    const struct spool_job *j = arg;
    const struct spool_state *s = j->s;
    const int64_t in = s->row.inner, iw = s->row.iw, ow = s->row.ow;
    for (int64_t t = begin; t < end; t++) {
        int64_t o = t / s->oh, oy = t % s->oh;
        int64_t y0 = oy * s->sh - s->ph;
        const float *rows[64];
        int nrows = 0;
        int64_t counted = 0;
        for (int64_t ky = 0; ky < s->kh; ky++) {
            int64_t iy = y0 + ky * s->dh;
            if (iy < s->ih + s->pb) counted++;
            if (iy < 0 || iy >= s->ih) continue;
            rows[nrows++] = j->x + (o * s->ih + iy) * iw * in;
        }
        struct simd_pool_row r = s->row;
        r.rows_counted = counted;
        s->k->pool_row(rows, nrows, j->y + (o * s->oh + oy) * ow * in, &r);
    }
}

static void global_range(void *arg, int64_t begin, int64_t end)
{
    const struct spool_job *j = arg;
    const struct spool_state *s = j->s;
    float scale = 1.0f / (float)s->pixels;
    for (int64_t o = begin; o < end; o++) {
        float *y = j->y + o * s->inner;
        int64_t keep = s->inner;
        if (s->plain_out) {
            int64_t c0 = o % s->blocks * s->inner;
            y = j->y + o / s->blocks * s->channels + c0;
            if (keep > s->channels - c0) keep = s->channels - c0;
        }
        s->k->pool_global(j->x + o * s->pixels * s->inner, s->pixels, s->inner, y, keep,
                          s->kind, scale);
    }
}

static kiln_status spool_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct spool_state *s = state;
    struct spool_job j = {s, ctx->in[0]->data, ctx->out[0]->data};
    if (s->plain_rows) { /* plain NCHW global pool: one row of pixels per channel */
        if (s->kind == SIMD_POOL_AVG)
            s->k->sum_rows(j.x, j.y, s->plain_rows, s->pixels, (double)s->pixels);
        else
            s->k->extreme_rows(j.x, j.y, s->plain_rows, s->pixels, 0);
        return KILN_OK;
    }
    if (s->global) {
        int64_t per = s->pixels * s->inner;
        int64_t grain = per >= SIMD_GRAIN_CHEAP ? 1 : SIMD_GRAIN_CHEAP / per;
        kiln_parallel_for(ctx->threads, s->outer, grain, global_range, &j);
        return KILN_OK;
    }
    /* a row's element taps; a plain row with stride > 1 takes its taps one by one, about
     * the cost of a vector's each */
    int64_t lanes = s->row.inner == 1 && s->row.sw > 1 ? s->k->lanes : s->row.inner;
    int64_t per = s->row.ow * lanes * s->kh * s->row.kw;
    int64_t grain = per >= SIMD_GRAIN_CHEAP ? 1 : SIMD_GRAIN_CHEAP / (per > 0 ? per : 1);
    kiln_parallel_for(ctx->threads, s->outer * s->oh, grain, window_range, &j);
    return KILN_OK;
}

/* The layout of input or output i (0 plain, 8 / 16 blocked, KILN_LAYOUT_NHWC). */
static int layout_of(const int *layouts, int i)
{
    return layouts ? layouts[i] : 0;
}

static kiln_status spool_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst,
                                 const struct simd_kernels *k)
{
    const struct kiln_node *n = cc->node;
    const struct kiln_type *x = cc->in[0], *y = cc->n_out > 0 ? cc->out[0] : NULL;
    if (!x || !y || x->dtype != KILN_DTYPE_F32 || y->dtype != KILN_DTYPE_F32) return KILN_OK;
    if (cc->n_out > 1 && cc->out[1]) return KILN_OK; /* MaxPool Indices */
    if (kiln_shape_count(x->rank, x->dims) <= 0 || y->rank != x->rank) return KILN_OK;
    int lx = layout_of(cc->in_layout, 0), ly = layout_of(cc->out_layout, 0);
    int global = n->op == KILN_OP_GlobalAveragePool || n->op == KILN_OP_GlobalMaxPool;
    struct spool_state st = {.k = k, .global = global};
    st.kind = n->op == KILN_OP_MaxPool || n->op == KILN_OP_GlobalMaxPool ? SIMD_POOL_MAX
                                                                          : SIMD_POOL_AVG;
    const int64_t N = x->dims[0], C = x->rank > 1 ? x->dims[1] : 0;
    if (global) {
        for (int d = 2; d < y->rank; d++)
            if (y->dims[d] != 1) return KILN_OK;
        if (!lx && !ly) { /* plain: a reduction of each channel's row of pixels */
            st.plain_rows = N * C;
            st.pixels = kiln_shape_count(x->rank - 2, x->dims + 2);
        } else {
            if (x->rank != 4) return KILN_OK;
            st.pixels = x->dims[2] * x->dims[3];
            st.channels = C;
            if (lx == KILN_LAYOUT_NHWC) {
                /* [N][1][1][C] and plain [N][C][1][1] are the same bytes */
                if (ly != KILN_LAYOUT_NHWC && ly != 0) return KILN_OK;
                st.outer = N;
                st.inner = C;
            } else if (lx == 8 || lx == 16) {
                if (ly != lx && ly != 0) return KILN_OK;
                st.blocks = (C + lx - 1) / lx;
                st.outer = N * st.blocks;
                st.inner = lx;
                st.plain_out = !ly;
            } else {
                return KILN_OK;
            }
        }
    } else {
        /* 2-D windows channels-inner; 1-D windows on plain [N, C, L] (oneDNN's plain 1-D
         * pooling is its slow reference loop); plain 2-D stays with oneDNN */
        int nsp = x->rank - 2;
        if (nsp == 2) {
            if (!(lx == KILN_LAYOUT_NHWC || lx == 8 || lx == 16) || ly != lx) return KILN_OK;
        } else if (nsp != 1 || lx || ly) {
            return KILN_OK;
        }
        int ceil_mode = kiln_attr_int(n, "ceil_mode", 0) != 0;
        int include_pad = kiln_attr_int(n, "count_include_pad", 0) != 0;
        int64_t so = kiln_attr_int(n, "storage_order", 0);
        struct kiln_window w;
        kiln_status rs = kiln_window_resolve(n, nsp, x->dims + 2, NULL, ceil_mode, &w);
        if (kiln_attr_check(n) != KILN_OK || rs != KILN_OK || so < 0 || so > 1) {
            kiln_error_clear();
            return KILN_OK; /* the reference reports it */
        }
        for (int i = 0; i < nsp; i++) {
            if (w.out[i] != y->dims[i + 2] || w.kernel[i] < 1 || w.stride[i] < 1 ||
                w.dilation[i] < 1)
                return KILN_OK;
            int64_t span = (w.kernel[i] - 1) * w.dilation[i] + 1;
            int64_t room = (w.out[i] - 1) * w.stride[i] + span - w.in[i] - w.pad_begin[i];
            if (w.pad_begin[i] >= span || room >= span) return KILN_OK; /* an empty window */
        }
        if (nsp == 2 && w.kernel[0] > 64) return KILN_OK; /* window_range's row list */
        if (nsp == 1) { /* one row of one channel per slice */
            st.outer = N * C;
            st.row.inner = 1;
            st.ih = st.oh = st.kh = st.sh = st.dh = 1;
        } else if (lx == KILN_LAYOUT_NHWC) {
            st.outer = N;
            st.row.inner = C;
        } else {
            st.outer = N * ((C + lx - 1) / lx);
            st.row.inner = lx;
        }
        if (nsp == 2) {
            st.ih = w.in[0];
            st.oh = w.out[0];
            st.kh = w.kernel[0];
            st.sh = w.stride[0];
            st.dh = w.dilation[0];
            st.ph = w.pad_begin[0];
            st.pb = w.pad_end[0];
        }
        const int wx = nsp - 1; /* the row's dim */
        st.row.iw = w.in[wx];
        st.row.ow = w.out[wx];
        st.row.kw = w.kernel[wx];
        st.row.sw = w.stride[wx];
        st.row.dw = w.dilation[wx];
        st.row.pw = w.pad_begin[wx];
        st.row.pr = w.pad_end[wx];
        st.row.kind = st.kind;
        st.row.include_pad = n->op == KILN_OP_AveragePool && include_pad;
    }
    struct spool_state *s = malloc(sizeof *s);
    if (!s) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    *s = st;
    static const char *const ops[] = {"max_pool", "avg_pool", "global_avg_pool",
                                      "global_max_pool"};
    int oi = n->op == KILN_OP_MaxPool         ? 0
             : n->op == KILN_OP_AveragePool   ? 1
             : n->op == KILN_OP_GlobalAveragePool ? 2
                                              : 3;
    snprintf(s->name, sizeof s->name, "f32_%s_%s", ops[oi], k->isa);
    inst->name = s->name;
    inst->state = s;
    inst->run = spool_run;
    inst->destroy = free;
    return KILN_OK;
}

SIMD_VARIANTS(max_pool, spool_compile)
SIMD_VARIANTS(avg_pool, spool_compile)
SIMD_VARIANTS(global_avg_pool, spool_compile)
SIMD_VARIANTS(global_max_pool, spool_compile)
