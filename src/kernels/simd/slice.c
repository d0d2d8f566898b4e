/*
 * slice.c - fast kernel for Slice of float32 tensors of rank 1 to 4, in
 * plain and channel-blocked layouts: starts, ends, axes and steps must be
 * known when the plan is compiled (constants, as exporters write them:
 * ShuffleNet's channel split, UNet's crops). The slice becomes one gather4
 * copy (gather4.h) of the picked channels, rows and columns, so the layout
 * pass (src/opt/layout.c) can keep the value blocked through it, on any axis
 * and at any start (a slice of a blocked value along C need not start on a
 * block). Input and output take the same layout. Tensors of rank 1 to 3
 * (plain: the layout pass blocks 4-D values only) are sliced as 4-D ones
 * with leading axes of size 1, so a rank-3 tensor's first axis is gather4's
 * channel axis and may be sliced too (a sequence's positions, a 1-D
 * convolution's time axis). Rank 5 and up, other dtypes or arguments known
 * only at run time use the reference kernel. Declared in the copy family's
 * list (copy.def, family.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/family.h"
#include "kernels/simd/gather4.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/copy.def"
#undef KILN_KERNEL

struct slice_state {
    struct kiln_gather4 g;
    char name[32];
};

static void slice_free(void *p)
{
    struct slice_state *s = p;
    kiln_gather4_free(&s->g);
    free(s);
}

static kiln_status slice_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct slice_state *s = state;
    kiln_gather4_run(&s->g, ctx->in[0]->data, ctx->out[0]->data, ctx->threads);
    return KILN_OK;
}

/* Entries of a constant 1-D int32 / int64 tensor, at most 4; -1 if unusable. */
static int read_ints(const kiln_tensor *t, int64_t *out)
{
    if (!t || (t->dtype != KILN_DTYPE_I64 && t->dtype != KILN_DTYPE_I32) || t->rank != 1 ||
        t->dims[0] > 4)
        return -1;
    for (int64_t i = 0; i < t->dims[0]; i++)
        out[i] = t->dtype == KILN_DTYPE_I64 ? ((const int64_t *)t->data)[i]
                                            : ((const int32_t *)t->data)[i];
    return (int)t->dims[0];
}

/* ONNX's clamping of one axis: the first index picked and how many. */
static void clamp_axis(int64_t d, int64_t start, int64_t end, int64_t step, int64_t *first,
                       int64_t *count)
{
    if (start < 0) start += d;
    if (end < 0) end += d;
    int64_t diff, astep;
    if (step > 0) {
        start = start < 0 ? 0 : start > d ? d : start;
        end = end < 0 ? 0 : end > d ? d : end;
        diff = end > start ? end - start : 0;
        astep = step;
    } else {
        start = start < 0 ? 0 : start > d - 1 ? d - 1 : start;
        end = end < -1 ? -1 : end > d - 1 ? d - 1 : end;
        diff = start > end ? start - end : 0;
        astep = -step;
    }
    *first = start;
    *count = d == 0 || diff == 0 ? 0 : (diff - 1) / astep + 1;
}

bool kiln_k_slice4_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 3 && cc->in[0] && cc->in[0]->dtype == KILN_DTYPE_F32 &&
           cc->in[0]->rank >= 1 && cc->in[0]->rank <= 4 && cc->n_out > 0 && cc->out[0];
}

kiln_status kiln_k_slice4_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    const struct kiln_type *x = cc->in[0], *y = cc->n_out > 0 ? cc->out[0] : NULL;
    if (n->opset < 10 || cc->n_in < 3 || !x || !y || x->dtype != KILN_DTYPE_F32 ||
        y->dtype != KILN_DTYPE_F32 || x->rank < 1 || x->rank > 4 || y->rank != x->rank ||
        !kiln_type_is_concrete(x) || !kiln_type_is_concrete(y) || !cc->in_value)
        return KILN_OK;
    int lx = cc->in_layout ? cc->in_layout[0] : 0, ly = cc->out_layout ? cc->out_layout[0] : 0;
    if (lx != ly || (lx && x->rank != 4)) return KILN_OK;
    /* x and y as 4-D: rank r's axes are the last r of four, the others of size 1 */
    int r = x->rank, lead = 4 - r;
    int64_t xd[4] = {1, 1, 1, 1}, yd[4] = {1, 1, 1, 1};
    for (int i = 0; i < r; i++) {
        xd[lead + i] = x->dims[i];
        yd[lead + i] = y->dims[i];
    }
    int64_t starts[4], ends[4], axes[4] = {0, 1, 2, 3}, steps[4] = {1, 1, 1, 1};
    int ns = read_ints(cc->in_value[1], starts), ne = read_ints(cc->in_value[2], ends);
    if (ns < 0 || ne != ns) return KILN_OK;
    for (int k = 3; k <= 4; k++) {
        if (k >= cc->n_in || !cc->in[k]) continue;
        if (read_ints(cc->in_value[k], k == 3 ? axes : steps) != ns) return KILN_OK;
    }
    int64_t first[4] = {0, 0, 0, 0}, step[4] = {1, 1, 1, 1}, count[4];
    memcpy(count, xd, sizeof count);
    int seen = 0;
    for (int i = 0; i < ns; i++) {
        int64_t a = axes[i] < 0 ? axes[i] + r : axes[i];
        if (a < 0 || a >= r || (seen >> a & 1) || steps[i] == 0) return KILN_OK;
        seen |= 1 << a;
        a += lead;
        clamp_axis(xd[a], starts[i], ends[i], steps[i], &first[a], &count[a]);
        step[a] = steps[i];
    }
    for (int d = 0; d < 4; d++)
        if (count[d] != yd[d]) return KILN_OK; /* the reference reports it */
    if (first[0] != 0 || step[0] != 1 || count[0] != xd[0]) return KILN_OK;
    struct slice_state *s = calloc(1, sizeof *s);
    int64_t *chan = malloc(sizeof(int64_t) * (size_t)(count[1] + 1));
    if (!s || !chan) {
        free(s);
        free(chan);
        return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    }
    for (int64_t c = 0; c < count[1]; c++) chan[c] = first[1] + c * step[1];
    kiln_status st = kiln_gather4_init(&s->g, xd, lx, yd[1], yd[2], yd[3], ly, 0, count[1], chan,
                                       first[2], step[2], first[3], step[3]);
    free(chan);
    if (st != KILN_OK) {
        free(s);
        return st;
    }
    if (ly) snprintf(s->name, sizeof s->name, "slice_blocked%d", ly);
    else if (r == 4) snprintf(s->name, sizeof s->name, "slice4");
    else snprintf(s->name, sizeof s->name, "slice%dd", r);
    inst->name = s->name;
    inst->state = s;
    inst->destroy = slice_free;
    inst->run = slice_run;
    return KILN_OK;
}

/* Layout pass: data input and output may be blocked (src/opt/layout.c checks that
 * the arguments are constants and the batch is not sliced). */
int kiln_k_slice4_accepts(const struct kiln_node *n, int i, int block)
{
    (void)n;
    return (i == 0 || i == -1) && (block == 8 || block == 16);
}
