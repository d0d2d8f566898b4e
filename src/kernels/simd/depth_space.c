/*
 * depth_space.c - fast kernels for DepthToSpace (DCR and CRD) and
 * SpaceToDepth of plain 4-D tensors of 4-byte elements, in the copy family's
 * list (copy.def, family.h).
 *
 * A super-resolution network ends in DepthToSpace (PixelShuffle): each output
 * row interleaves blocksize input rows of different channels. The reference
 * walks a 6-D strided view one element at a time; here a unit is one input
 * row group (image, channel, row), whose blocksize^2 channel rows are
 * interleaved into blocksize output rows, or the reverse for SpaceToDepth.
 * Other element sizes and layouts stay with the reference.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "kernels/family.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/copy.def"
#undef KILN_KERNEL

struct ds_state {
    int to_space, crd;
    int64_t n, c, h, w, b; /* the space side's channels c, rows h and columns w */
};

struct ds_job {
    const struct ds_state *s;
    const uint32_t *x;
    uint32_t *y;
};

/* The depth side's channel holding (channel ch, row phase i, column phase j). */
static inline int64_t ds_channel(const struct ds_state *s, int64_t ch, int64_t i, int64_t j)
{
    return s->crd ? (ch * s->b + i) * s->b + j : (i * s->b + j) * s->c + ch;
}

/* Units (image, space channel, depth-side row) [begin, end). */
static void ds_range(void *arg, int64_t begin, int64_t end)
{
    const struct ds_job *j = arg;
    const struct ds_state *s = j->s;
    const int64_t b = s->b, hd = s->h / b, wd = s->w / b; /* the depth side's rows, cols */
    const int64_t cd = s->c * b * b;
    for (int64_t u = begin; u < end; u++) {
        int64_t r = u % hd, ch = (u / hd) % s->c, img = u / (hd * s->c);
        for (int64_t i = 0; i < b; i++) {
            /* space row r * b + i of channel ch */
            int64_t srow = ((img * s->c + ch) * s->h + r * b + i) * s->w;
            for (int64_t jj = 0; jj < b; jj++) {
                int64_t drow = ((img * cd + ds_channel(s, ch, i, jj)) * hd + r) * wd;
                if (s->to_space) {
                    const uint32_t *src = j->x + drow;
                    uint32_t *dst = j->y + srow + jj;
                    for (int64_t q = 0; q < wd; q++) dst[q * b] = src[q];
                } else {
                    const uint32_t *src = j->x + srow + jj;
                    uint32_t *dst = j->y + drow;
                    for (int64_t q = 0; q < wd; q++) dst[q] = src[q * b];
                }
            }
        }
    }
}

static kiln_status ds_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct ds_state *s = state;
    struct ds_job j = {s, ctx->in[0]->data, ctx->out[0]->data};
    int64_t units = s->n * s->c * (s->h / s->b), per = s->b * s->w;
    kiln_parallel_for(ctx->threads, units, kiln_copy_grain(per * 4), ds_range, &j);
    return KILN_OK;
}

bool kiln_k_depth_space_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 1 && cc->in[0] && cc->in[0]->rank == 4 && cc->n_out >= 1 && cc->out[0] &&
           kiln_dtype_size(cc->in[0]->dtype) == 4;
}

kiln_status kiln_k_depth_space_compile(const struct kiln_compile_ctx *cc,
                                       struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    const struct kiln_type *x = cc->in[0], *y = cc->out[0];
    if (!kiln_type_is_concrete(x) || !kiln_type_is_concrete(y) || y->rank != 4 ||
        y->dtype != x->dtype || kiln_dtype_size(x->dtype) != 4)
        return KILN_OK;
    if ((cc->in_layout && cc->in_layout[0]) || (cc->out_layout && cc->out_layout[0]))
        return KILN_OK;
    int64_t b = kiln_attr_int(n, "blocksize", 0);
    const char *mode = kiln_attr_str(n, "mode", "DCR");
    if (kiln_attr_check(n) != KILN_OK) { /* the reference reports */
        kiln_error_clear();
        return KILN_OK;
    }
    int to_space = n->op == KILN_OP_DepthToSpace;
    int crd = to_space && strcmp(mode, "CRD") == 0;
    if (b < 1 || b > 65536 || (to_space && !crd && strcmp(mode, "DCR") != 0)) return KILN_OK;
    const struct kiln_type *sp = to_space ? y : x, *dp = to_space ? x : y;
    if (sp->dims[0] != dp->dims[0] || sp->dims[1] * b * b != dp->dims[1] ||
        sp->dims[2] != dp->dims[2] * b || sp->dims[3] != dp->dims[3] * b ||
        kiln_shape_count(4, x->dims) <= 0)
        return KILN_OK;
    struct ds_state *s = malloc(sizeof *s);
    if (!s) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    *s = (struct ds_state){.to_space = to_space, .crd = crd, .n = sp->dims[0], .c = sp->dims[1],
                           .h = sp->dims[2], .w = sp->dims[3], .b = b};
    inst->name = to_space ? "depth_to_space" : "space_to_depth";
    inst->state = s;
    inst->run = ds_run;
    inst->destroy = free;
    return KILN_OK;
}
