/*
 * broadcast.c - fast f32 Add, Sub, Mul and Div of any two broadcasting
 * shapes (numpy rules, ranks up to KILN_MAX_RANK) in plain layouts: the
 * general kernels of the elementwise family (elementwise.def), tried after
 * the specialised ones of elementwise.c (same shape, scalar, trailing row,
 * per channel), so they take what those decline: a layer scale [C,1,1]
 * against [N,C,H,W], an outer product [M,1] op [1,N], a [B,1,1,S] mask
 * against [B,H,S,S], a middle axis [1,C,1] against [N,C,L].
 *
 * At compile time the output's dims are reduced to runs: dims of 1 are
 * dropped and neighbouring dims merged where both inputs step through them
 * alike (each input's stride in elements, 0 where it broadcasts). The
 * innermost run is one call of the table's binary loop (simd.h), vector by
 * vector or with one input fixed; the outer runs are counted through, split
 * across the run's threads.
 */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/family.h"
#include "kernels/simd/simd.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/elementwise.def"
#undef KILN_KERNEL

struct bcast_state {
    const struct simd_kernels *k;
    enum simd_binary op;
    enum simd_bmode mode;      /* of the innermost run */
    int rank;                  /* runs, the innermost last (>= 1) */
    int64_t dims[KILN_MAX_RANK];
    int64_t sa[KILN_MAX_RANK], sb[KILN_MAX_RANK]; /* strides in elements, 0 = broadcast */
    int64_t rows;              /* product of the outer runs */
    char name[40];
};

struct bcast_job {
    const struct bcast_state *s;
    const float *a, *b;
    float *y;
};

static void bcast_range(void *arg, int64_t begin, int64_t end)
{
    const struct bcast_job *j = arg;
    const struct bcast_state *s = j->s;
    int r = s->rank - 1;
    int64_t inner = s->dims[r];
    for (int64_t row = begin; row < end; row++) {
        int64_t oa = 0, ob = 0, rem = row;
        for (int d = r - 1; d >= 0; d--) {
            int64_t i = rem % s->dims[d];
            rem /= s->dims[d];
            oa += i * s->sa[d];
            ob += i * s->sb[d];
        }
        s->k->binary(s->op, s->mode, j->a + oa, j->b + ob, j->y + row * inner, inner);
    }
}

static kiln_status bcast_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct bcast_state *s = state;
    struct bcast_job j = {s, ctx->in[0]->data, ctx->in[1]->data, ctx->out[0]->data};
    int64_t inner = s->dims[s->rank - 1];
    int64_t grain = inner >= SIMD_GRAIN_CHEAP ? 1 : SIMD_GRAIN_CHEAP / inner;
    kiln_parallel_for(ctx->threads, s->rows, grain, bcast_range, &j);
    return KILN_OK;
}

static bool concrete_f32(const struct kiln_type *t)
{
    return t && t->dtype == KILN_DTYPE_F32 && kiln_type_is_concrete(t);
}

bool kiln_simd_bcast_strides(const struct kiln_type *x, const struct kiln_type *o, int64_t *st)
{
    if (x->rank > o->rank) return false;
    int64_t step = 1;
    for (int d = o->rank - 1; d >= 0; d--) {
        int xd = d - (o->rank - x->rank);
        int64_t n = xd >= 0 ? x->dims[xd] : 1;
        if (n != 1 && n != o->dims[d]) return false;
        st[d] = n == 1 ? 0 : step;
        step *= n;
    }
    return true;
}

static kiln_status bcast_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst,
                                 const struct simd_kernels *k, enum simd_binary op,
                                 const char *opname)
{
    if (cc->node->opset < 7 && kiln_node_attr(cc->node, "broadcast")) return KILN_OK;
    if (cc->n_in < 2 || cc->n_out < 1 || !concrete_f32(cc->in[0]) || !concrete_f32(cc->in[1]) ||
        !concrete_f32(cc->out[0]))
        return KILN_OK;
    for (int i = 0; i < 2; i++)
        if (cc->in_layout && cc->in_layout[i]) return KILN_OK;
    if (cc->out_layout && cc->out_layout[0]) return KILN_OK;
    const struct kiln_type *a = cc->in[0], *b = cc->in[1], *o = cc->out[0];
    int64_t sa[KILN_MAX_RANK], sb[KILN_MAX_RANK];
    if (o->rank > KILN_MAX_RANK || !kiln_simd_bcast_strides(a, o, sa) ||
        !kiln_simd_bcast_strides(b, o, sb))
        return KILN_OK;
    int64_t n = kiln_shape_count(o->rank, o->dims);
    if (n <= 0) return KILN_OK; /* nothing to compute: the reference's loop is free */
    struct bcast_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling %s", opname);
    /* runs: drop dims of 1, merge d into the run before it where both inputs step alike */
    int r = 0;
    for (int d = 0; d < o->rank; d++) {
        if (o->dims[d] == 1) continue;
        if (r > 0 && s->sa[r - 1] == sa[d] * o->dims[d] && s->sb[r - 1] == sb[d] * o->dims[d]) {
            s->dims[r - 1] *= o->dims[d];
            s->sa[r - 1] = sa[d];
            s->sb[r - 1] = sb[d];
            continue;
        }
        s->dims[r] = o->dims[d];
        s->sa[r] = sa[d];
        s->sb[r] = sb[d];
        r++;
    }
    if (r == 0) { /* one element */
        s->dims[0] = 1;
        s->sa[0] = s->sb[0] = 1;
        r = 1;
    }
    s->rank = r;
    s->rows = n / s->dims[r - 1];
    /* the innermost run: both inputs step by 1, or one is fixed (stride 0) */
    if (s->sa[r - 1] == s->sb[r - 1]) s->mode = SIMD_B_VEC;
    else if (s->sb[r - 1] == 0) s->mode = SIMD_B_SCALAR_B;
    else s->mode = SIMD_B_SCALAR_A;
    s->k = k;
    s->op = op;
    snprintf(s->name, sizeof s->name, "f32_%s_bcast_%s", opname, k->isa);
    inst->state = s;
    inst->destroy = free;
    inst->run = bcast_run;
    inst->name = s->name;
    /* y[i] reads a at i only when a has every element of y */
    inst->inplace = kiln_shape_count(a->rank, a->dims) == n;
    return KILN_OK;
}

#define BCAST_FAST(stem, op)                                                                \
    static kiln_status stem##_bcast_compile(const struct kiln_compile_ctx *cc,              \
                                            struct kiln_kernel_inst *inst,                  \
                                            const struct simd_kernels *k)                   \
    {                                                                                       \
        return bcast_compile(cc, inst, k, op, #stem);                                       \
    }                                                                                       \
    SIMD_VARIANTS(stem##_bcast, stem##_bcast_compile)

BCAST_FAST(add, SIMD_ADD)
BCAST_FAST(sub, SIMD_SUB)
BCAST_FAST(mul, SIMD_MUL)
BCAST_FAST(div, SIMD_DIV)
