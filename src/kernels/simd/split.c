/*
 * split.c - fast kernel for Split of plain tensors of any rank and any
 * fixed-size element type: each output is `outer` runs of contiguous bytes
 * (its slice of the split axis times everything after it), copied with
 * memcpy; the (output, run) pairs are shared among the run's threads. The
 * pieces' sizes are the output types', known when the plan is compiled.
 * Strings, outputs that are not wanted, and sizes that do not add up use the
 * reference kernel (which reports the latter). A Split of a 4-D float32
 * value in a blocked layout never reaches this kernel: the layout pass
 * rewrites it as Slices first (src/opt/layout_shuffle.c). Declared in the
 * copy family's list (copy.def, family.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "kernels/family.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/copy.def"
#undef KILN_KERNEL

#define SPLIT_MAX_OUT 256

struct split_state {
    int n_out;
    int64_t outer;              /* runs per output */
    size_t in_run;              /* bytes between runs in the input */
    size_t run[SPLIT_MAX_OUT];  /* bytes per run of output k */
    size_t at[SPLIT_MAX_OUT];   /* byte offset of output k within an input run */
};

struct split_job {
    const struct split_state *s;
    const char *x;
    char *const *y;
};

/* Work items [b, e) of n_out * outer: item i copies run i % outer of output i / outer. */
static void split_items(void *ctx, int64_t b, int64_t e)
{
    const struct split_job *j = ctx;
    const struct split_state *s = j->s;
    for (int64_t i = b; i < e; i++) {
        int k = (int)(i / s->outer);
        int64_t o = i % s->outer;
        memcpy(j->y[k] + (size_t)o * s->run[k], j->x + (size_t)o * s->in_run + s->at[k],
               s->run[k]);
    }
}

static kiln_status split_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct split_state *s = state;
    char *y[SPLIT_MAX_OUT];
    size_t bytes = 0;
    for (int k = 0; k < s->n_out; k++) {
        y[k] = ctx->out[k]->data;
        bytes += s->run[k];
    }
    struct split_job j = {s, ctx->in[0]->data, y};
    int64_t items = (int64_t)s->n_out * s->outer;
    size_t per_item = bytes / (size_t)s->n_out + 1;
    kiln_parallel_for(ctx->threads, items, kiln_copy_grain((int64_t)per_item), split_items, &j);
    return KILN_OK;
}

bool kiln_k_split_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 1 && cc->in[0] && cc->in[0]->dtype != KILN_DTYPE_STRING;
}

kiln_status kiln_k_split_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    const struct kiln_type *x = cc->in[0];
    if (!x || !kiln_type_is_concrete(x) || x->dtype == KILN_DTYPE_STRING || x->rank < 1 ||
        cc->n_out < 1 || cc->n_out > SPLIT_MAX_OUT)
        return KILN_OK;
    if ((cc->in_layout && cc->in_layout[0]) || (cc->out_layout && cc->out_layout[0]))
        return KILN_OK;
    int64_t axis = kiln_attr_int(n, "axis", 0);
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return KILN_OK;
    }
    if (axis < 0) axis += x->rank;
    if (axis < 0 || axis >= x->rank) return KILN_OK;
    size_t esize = kiln_dtype_size(x->dtype);
    if (esize == 0) return KILN_OK;
    int64_t outer = 1, inner = 1, at = 0;
    for (int d = 0; d < axis; d++) outer *= x->dims[d];
    for (int d = (int)axis + 1; d < x->rank; d++) inner *= x->dims[d];
    struct split_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    s->n_out = cc->n_out;
    s->outer = outer;
    s->in_run = (size_t)(x->dims[axis] * inner) * esize;
    for (int k = 0; k < cc->n_out; k++) {
        const struct kiln_type *y = cc->out[k];
        int ok = y && kiln_type_is_concrete(y) && y->dtype == x->dtype && y->rank == x->rank &&
                 (!cc->out_layout || !cc->out_layout[k]);
        for (int d = 0; ok && d < x->rank; d++)
            if (d != axis && y->dims[d] != x->dims[d]) ok = 0;
        if (!ok) {
            free(s);
            return KILN_OK;
        }
        s->at[k] = (size_t)(at * inner) * esize;
        s->run[k] = (size_t)(y->dims[axis] * inner) * esize;
        at += y->dims[axis];
    }
    if (at != x->dims[axis] || outer == 0) {
        free(s);
        return KILN_OK;
    }
    inst->name = "split_memcpy";
    inst->state = s;
    inst->destroy = free;
    inst->run = split_run;
    return KILN_OK;
}
