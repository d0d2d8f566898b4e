/*
 * pad.c - fast kernel for Pad of 4-D float32 tensors in constant mode on
 * the spatial axes (the Pad before DenseNet's and Inception's average
 * pools, UNet's crops padded back), in plain and channel-blocked layouts.
 * Each output row (one image, one channel or block of channels, one row)
 * is a fill, or a fill, a copy of an input row and a fill; rows are split
 * over the run's threads. Blocked, the lanes past the last channel stay
 * zero whatever the fill (kernels reading blocked data rely on it). Other
 * modes, ranks and pads on N or C use the reference kernel; kiln_pad_hw
 * (pad.h) says which, for the layout pass too. Declared in the copy
 * family's list (copy.def, family.h).
 */
#include "kernels/simd/pad.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "kernels/family.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/copy.def"
#undef KILN_KERNEL

bool kiln_pad_hw(const struct kiln_node *n, const kiln_tensor *pads, bool has_axes,
                 const kiln_tensor *value, bool has_value, int64_t amounts[4], float *fill)
{
    if (strcmp(kiln_attr_str(n, "mode", "constant"), "constant")) return false;
    int64_t p[8];
    *fill = 0.0f;
    if (n->opset < 11) {
        const int64_t *a;
        if (kiln_attr_ints(n, "pads", &a) != 8) return false;
        memcpy(p, a, sizeof p);
        *fill = kiln_attr_float(n, "value", 0.0f);
    } else {
        if (has_axes || !pads || pads->dtype != KILN_DTYPE_I64 || pads->rank != 1 ||
            pads->dims[0] != 8)
            return false;
        memcpy(p, pads->data, sizeof p);
        if (has_value) {
            if (!value || value->dtype != KILN_DTYPE_F32 || kiln_tensor_count(value) != 1)
                return false;
            *fill = ((const float *)value->data)[0];
        }
    }
    if (p[0] || p[1] || p[4] || p[5]) return false; /* N and C */
    for (int i = 0; i < 4; i++) {
        amounts[i] = p[2 + (i & 1) + (i >> 1) * 4]; /* top, left, bottom, right */
        if (amounts[i] < 0 || amounts[i] > (1 << 20)) return false;
    }
    return true;
}

struct pad_state {
    int64_t n, units, c, h, w, oh, ow; /* units: channels (plain) or blocks */
    int64_t top, left;
    int l;
    float fill;
    char name[32];
};

struct pad_job {
    const struct pad_state *s;
    const float *x;
    float *y;
};

/* Write `count` pixels of fill at d; blocked, lanes from `live` on get 0. */
static void fill_px(float *d, int64_t count, int l, int live, float v)
{
    if (!l) {
        for (int64_t i = 0; i < count; i++) d[i] = v;
        return;
    }
    for (int64_t i = 0; i < count; i++)
        for (int j = 0; j < l; j++) d[i * l + j] = j < live ? v : 0.0f;
}

static void pad_range(void *arg, int64_t begin, int64_t end)
{
    const struct pad_job *j = arg;
    const struct pad_state *s = j->s;
    int64_t px = s->l ? s->l : 1;
    for (int64_t it = begin; it < end; it++) {
        int64_t r = it % s->oh, u = (it / s->oh) % s->units, n = it / s->oh / s->units;
        int live = s->l ? (int)(s->c - u * s->l < s->l ? s->c - u * s->l : s->l) : 1;
        float *d = j->y + ((n * s->units + u) * s->oh + r) * s->ow * px;
        int64_t ir = r - s->top;
        if (ir < 0 || ir >= s->h) {
            fill_px(d, s->ow, s->l, live, s->fill);
            continue;
        }
        const float *src = j->x + ((n * s->units + u) * s->h + ir) * s->w * px;
        fill_px(d, s->left, s->l, live, s->fill);
        memcpy(d + s->left * px, src, sizeof(float) * (size_t)(s->w * px));
        fill_px(d + (s->left + s->w) * px, s->ow - s->left - s->w, s->l, live, s->fill);
    }
}

static kiln_status pad_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct pad_state *s = state;
    struct pad_job j = {s, ctx->in[0]->data, ctx->out[0]->data};
    int64_t row = s->ow * (s->l ? s->l : 1) * (int64_t)sizeof(float);
    kiln_parallel_for(ctx->threads, s->n * s->units * s->oh, kiln_copy_grain(row), pad_range, &j);
    return KILN_OK;
}

bool kiln_k_pad4_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 1 && cc->in[0] && cc->in[0]->dtype == KILN_DTYPE_F32 &&
           cc->in[0]->rank == 4 && cc->n_out > 0 && cc->out[0];
}

kiln_status kiln_k_pad4_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_type *x = cc->in[0], *y = cc->n_out > 0 ? cc->out[0] : NULL;
    if (!x || !y || x->dtype != KILN_DTYPE_F32 || y->dtype != KILN_DTYPE_F32 || x->rank != 4 ||
        y->rank != 4 || !kiln_type_is_concrete(x) || !kiln_type_is_concrete(y))
        return KILN_OK;
    int lx = cc->in_layout ? cc->in_layout[0] : 0, ly = cc->out_layout ? cc->out_layout[0] : 0;
    if (lx != ly) return KILN_OK;
    int64_t a[4];
    float fill;
    bool has_value = cc->n_in > 2 && cc->in[2], has_axes = cc->n_in > 3 && cc->in[3];
    if (!kiln_pad_hw(cc->node, cc->n_in > 1 && cc->in_value ? cc->in_value[1] : NULL, has_axes,
                     has_value && cc->in_value ? cc->in_value[2] : NULL, has_value, a, &fill))
        return KILN_OK;
    if (y->dims[0] != x->dims[0] || y->dims[1] != x->dims[1] ||
        y->dims[2] != x->dims[2] + a[0] + a[2] || y->dims[3] != x->dims[3] + a[1] + a[3])
        return KILN_OK; /* the reference reports it */
    struct pad_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling Pad");
    s->n = x->dims[0];
    s->c = x->dims[1];
    s->l = ly;
    s->units = ly ? (s->c + ly - 1) / ly : s->c;
    s->h = x->dims[2];
    s->w = x->dims[3];
    s->oh = y->dims[2];
    s->ow = y->dims[3];
    s->top = a[0];
    s->left = a[1];
    s->fill = fill;
    if (ly) snprintf(s->name, sizeof s->name, "pad_blocked%d", ly);
    else snprintf(s->name, sizeof s->name, "pad4");
    inst->name = s->name;
    inst->state = s;
    inst->destroy = free;
    inst->run = pad_run;
    return KILN_OK;
}

/* Layout pass: data input and output may be blocked (src/opt/layout.c checks
 * kiln_pad_hw on the constants). */
int kiln_k_pad4_accepts(const struct kiln_node *n, int i, int block)
{
    (void)n;
    return (i == 0 || i == -1) && (block == 8 || block == 16);
}
