/*
 * concat.c - fast kernel for Concat, in plain and channel-blocked layouts.
 *
 * A Concat is, for every index of the dims before its axis ("outer"), one
 * contiguous copy per input into its place in the output row. Stored in a
 * channel-blocked layout (nChw8c / nChw16c: [N][C/b][H][W][b], graph.h) the
 * same holds with the blocked dims: along C when every input but the last
 * has a whole number of blocks (each input's blocks then follow the
 * previous input's, and the last one's zero padding becomes the output's),
 * and along N, H or W always (the block is part of the copied row). Along C
 * at offsets that are not whole blocks (ShuffleNet's 58 + 58 channels with
 * blocks of 16), each input is copied lane by lane into its channels of the
 * output blocks (gather4.h), one input after the other. So the
 * layout pass (src/opt/layout.c) can keep a convolution chain blocked
 * through the Concats of fire modules, inception branches, dense blocks
 * and channel shuffles. Every input must be in the output's layout. Rows
 * are split over the run's threads. Any fixed-size dtype in plain layout;
 * float32 when blocked. Anything else runs on the reference kernel.
 * An input the plan passes as NULL is already in its place in the output
 * (src/exec/plan.c, Concat in place): it is skipped. Compiled for a channel
 * slice of a larger tensor (cc->out_host_channels, a Concat placed in a later
 * Concat's output at batch > 1: inception's nested Concats), the rows along
 * axis 1 are written one host row apart (inst->out_strided); not with the
 * lane-by-lane copy.
 * Declared in the copy family's list (copy.def, family.h).
 */
#include <stdio.h>
#include <string.h>

#include "core/threadpool.h"
#include "kernels/family.h"
#include "kernels/simd/gather4.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/copy.def"
#undef KILN_KERNEL

#define CONCAT_MAX_IN 256

struct concat_state {
    int n_in;
    int64_t outer;                 /* copies per input */
    size_t out_row;                /* bytes of one output row (all inputs' pieces) */
    size_t out_stride;             /* bytes from one row to the next (out_row, or the host's
                                      row when written into a channel slice) */
    size_t piece[CONCAT_MAX_IN];   /* bytes of input k's piece of a row */
    size_t at[CONCAT_MAX_IN];      /* its offset in the row */
    struct kiln_gather4 *g4;       /* blocked along C off the blocks: one copy per input */
    char name[32];
};

static void concat_free(void *p)
{
    struct concat_state *s = p;
    for (int k = 0; s->g4 && k < s->n_in; k++) kiln_gather4_free(&s->g4[k]);
    free(s->g4);
    free(s);
}

static kiln_status concat_g4_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct concat_state *s = state;
    for (int k = 0; k < s->n_in; k++)
        if (ctx->in[k]) kiln_gather4_run(&s->g4[k], ctx->in[k]->data, ctx->out[0]->data, ctx->threads);
    return KILN_OK;
}

/* Blocked along C with an input off the blocks: a gather4 copy per input. */
static kiln_status concat_offblock(const struct kiln_compile_ctx *cc, struct concat_state *s,
                                   int lo)
{
    const struct kiln_type *y = cc->out[0];
    s->g4 = calloc((size_t)cc->n_in, sizeof *s->g4);
    int64_t *chan = malloc(sizeof(int64_t) * (size_t)(y->dims[1] + 1));
    if (!s->g4 || !chan) {
        free(chan);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling Concat");
    }
    for (int64_t c = 0; c <= y->dims[1]; c++) chan[c] = c;
    int64_t at = 0;
    kiln_status st = KILN_OK;
    for (int k = 0; k < cc->n_in && st == KILN_OK; k++) {
        const struct kiln_type *x = cc->in[k];
        if (!x) continue;
        st = kiln_gather4_init(&s->g4[k], x->dims, lo, y->dims[1], y->dims[2], y->dims[3], lo, at,
                               x->dims[1], chan, 0, 1, 0, 1);
        at += x->dims[1];
    }
    free(chan);
    return st;
}

struct concat_job {
    const struct concat_state *s;
    const struct kiln_run_ctx *ctx;
};

static void concat_range(void *arg, int64_t begin, int64_t end)
{
    const struct concat_job *j = arg;
    const struct concat_state *s = j->s;
    char *y = j->ctx->out[0]->data;
    for (int64_t o = begin; o < end; o++)
        for (int k = 0; k < s->n_in; k++)
            if (s->piece[k] && j->ctx->in[k]) /* NULL: written in place by its producer */
                memcpy(y + (size_t)o * s->out_stride + s->at[k],
                       (const char *)j->ctx->in[k]->data + (size_t)o * s->piece[k], s->piece[k]);
}

static kiln_status concat_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct concat_state *s = state;
    struct concat_job j = {s, ctx};
    kiln_parallel_for(ctx->threads, s->outer, kiln_copy_grain((int64_t)s->out_row), concat_range,
                      &j);
    return KILN_OK;
}

static int fixed_size_dtype(int dt)
{
    return dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16 ||
           dt == KILN_DTYPE_F64 || dt == KILN_DTYPE_I8 || dt == KILN_DTYPE_U8 ||
           dt == KILN_DTYPE_I16 || dt == KILN_DTYPE_U16 || dt == KILN_DTYPE_I32 ||
           dt == KILN_DTYPE_U32 || dt == KILN_DTYPE_I64 || dt == KILN_DTYPE_U64 ||
           dt == KILN_DTYPE_BOOL;
}

/* The stored dims of a type in layout l (rank 4 blocked: N, C/b, H, W, b). *rank_out. */
static void stored_dims(const struct kiln_type *t, int l, int64_t *d, int *rank_out)
{
    if (!l) {
        memcpy(d, t->dims, sizeof(int64_t) * (size_t)t->rank);
        *rank_out = t->rank;
        return;
    }
    d[0] = t->dims[0];
    d[1] = kiln_layout_channels(t->dims[1], l) / l;
    d[2] = t->dims[2];
    d[3] = t->dims[3];
    d[4] = l;
    *rank_out = 5;
}

bool kiln_k_concat_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_out > 0 && cc->out[0] && cc->n_in >= 1 && cc->n_in <= CONCAT_MAX_IN;
}

kiln_status kiln_k_concat_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    const struct kiln_type *y = cc->n_out > 0 ? cc->out[0] : NULL;
    if (!y || !kiln_type_is_concrete(y) || y->rank < 1 || !fixed_size_dtype(y->dtype) ||
        cc->n_in < 1 || cc->n_in > CONCAT_MAX_IN)
        return KILN_OK;
    int64_t axis_attr = kiln_attr_int(n, "axis", 1);
    int axis;
    if (kiln_attr_check(n) != KILN_OK || kiln_norm_axis(n, axis_attr, y->rank, &axis) != KILN_OK) {
        kiln_error_clear();
        return KILN_OK; /* the reference reports it */
    }
    int lo = cc->out_layout ? cc->out_layout[0] : 0;
    if (lo && (y->rank != 4 || y->dtype != KILN_DTYPE_F32)) return KILN_OK;
    size_t es = kiln_dtype_size(y->dtype);
    int64_t yd[KILN_MAX_RANK + 1];
    int yr;
    stored_dims(y, lo, yd, &yr);
    int64_t outer = 1, inner = 1, sum = 0;
    int offblock = 0;
    for (int i = 0; i < axis; i++) outer *= yd[i];
    for (int i = axis + 1; i < yr; i++) inner *= yd[i];
    struct concat_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    s->n_in = cc->n_in;
    s->outer = outer;
    s->out_row = (size_t)(yd[axis] * inner) * es;
    s->out_stride = s->out_row;
    int64_t host = cc->out_host_channels;
    if (host > 0) { /* a channel slice of a larger output: rows along axis 1 only */
        if (axis != 1 || y->rank != 4 || kiln_layout_channels(host, lo ? lo : 1) != host ||
            host < yd[1] * (lo ? lo : 1))
            goto decline;
        s->out_stride = (size_t)(host / (lo ? lo : 1) * inner) * es;
    }
    for (int k = 0; k < cc->n_in; k++) {
        const struct kiln_type *x = cc->in[k];
        int lk = cc->in_layout ? cc->in_layout[k] : 0;
        if (!x) continue; /* an absent optional input contributes nothing */
        if (x->dtype != y->dtype || x->rank != y->rank || !kiln_type_is_concrete(x) || lk != lo)
            goto decline;
        for (int i = 0; i < y->rank; i++)
            if (i != axis && x->dims[i] != y->dims[i]) goto decline;
        /* blocked along C off the blocks: copied lane by lane */
        if (lo && axis == 1 && k < cc->n_in - 1 && x->dims[1] % lo) offblock = 1;
        int64_t xd[KILN_MAX_RANK + 1];
        int xr;
        stored_dims(x, lk, xd, &xr);
        s->at[k] = (size_t)(sum * inner) * es;
        s->piece[k] = (size_t)(xd[axis] * inner) * es;
        sum += xd[axis];
    }
    if (offblock && host > 0) goto decline;
    if (offblock) {
        int64_t c = 0;
        for (int k = 0; k < cc->n_in; k++) c += cc->in[k] ? cc->in[k]->dims[1] : 0;
        if (c != y->dims[1]) goto decline;
        kiln_status st = concat_offblock(cc, s, lo);
        if (st != KILN_OK) {
            concat_free(s);
            return st;
        }
        snprintf(s->name, sizeof s->name, "concat_blocked%d_lanes", lo);
    } else {
        if (sum != yd[axis]) goto decline;
        if (lo) snprintf(s->name, sizeof s->name, "concat_blocked%d", lo);
        else snprintf(s->name, sizeof s->name, "concat");
    }
    inst->name = s->name;
    inst->state = s;
    inst->destroy = concat_free;
    inst->run = offblock ? concat_g4_run : concat_run;
    inst->out_strided = host > 0;
    inst->can_out_strided = !host && !offblock && axis == 1 && y->rank == 4;
    return KILN_OK;
decline:
    concat_free(s);
    return KILN_OK;
}

/* Layout pass: inputs and output may be blocked; src/opt/layout.c checks the axis
 * and the channel counts (whole blocks along C). */
int kiln_k_concat_accepts(const struct kiln_node *n, int i, int block)
{
    (void)n, (void)i;
    return block == 8 || block == 16;
}
