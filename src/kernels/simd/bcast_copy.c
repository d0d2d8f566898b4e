/*
 * bcast_copy.c - fast kernels for the broadcasting copies Where and Expand,
 * of any fixed-size element type (1, 2, 4 or 8 bytes) in plain layouts:
 * attention masks (Where(mask, scores, -inf) with a [B,1,1,S] or [1,1,S,S]
 * condition), causal masks, and Expand of position ids or masks to the
 * batch. Declared in the copy family's list (copy.def, family.h).
 *
 * At compile time the output's dims are reduced to runs as broadcast.c does
 * for the arithmetic ops: dims of 1 dropped, neighbouring dims merged where
 * every input steps through them alike (each input's stride in elements, 0
 * where it broadcasts). The innermost run is one tight loop, specialised by
 * element size; the outer runs are counted through and split across the
 * run's threads. Where's condition is a bool tensor (any nonzero byte is
 * true, as the reference reads it). Strings, blocked layouts and shapes
 * unknown at compile time stay on the reference kernels.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "kernels/family.h"
#include "kernels/simd/simd.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/copy.def"
#undef KILN_KERNEL

#define BC_MAX_IN 3

struct bc_state {
    int n_in;                            /* 3: Where (cond, x, y); 1: Expand (x) */
    int es;                              /* element bytes of the data inputs and output */
    int rank;                            /* runs, the innermost last (>= 1) */
    int64_t dims[KILN_MAX_RANK];
    int64_t st[BC_MAX_IN][KILN_MAX_RANK]; /* strides in elements, 0 = broadcast */
    int64_t rows;                        /* product of the outer runs */
    char name[32];
};

struct bc_job {
    const struct bc_state *s;
    const void *in[BC_MAX_IN];
    void *y;
};

/* The innermost run of Where for elements of type T: sc, sx, sy are 0 or 1. */
#define BC_WHERE_RUN(T)                                                                       \
    static void where_run_##T(const uint8_t *c, const void *xv, const void *yv, void *ov,      \
                              int64_t n, int64_t sc, int64_t sx, int64_t sy)                   \
    {                                                                                         \
        const T *x = xv, *y = yv;                                                              \
        T *o = ov;                                                                            \
        if (sc == 1 && sx == 1 && sy == 1) {                                                  \
            for (int64_t i = 0; i < n; i++) o[i] = c[i] ? x[i] : y[i];                        \
        } else if (sc == 1 && sx == 1 && sy == 0) {                                           \
            const T yy = y[0];                                                                \
            for (int64_t i = 0; i < n; i++) o[i] = c[i] ? x[i] : yy;                          \
        } else if (sc == 1 && sx == 0 && sy == 1) {                                           \
            const T xx = x[0];                                                                \
            for (int64_t i = 0; i < n; i++) o[i] = c[i] ? xx : y[i];                          \
        } else if (sc == 0) {                                                                 \
            const T *src = c[0] ? x : y;                                                      \
            const int64_t ss = c[0] ? sx : sy;                                                \
            if (ss == 1) memcpy(o, src, (size_t)n * sizeof(T));                               \
            else for (int64_t i = 0; i < n; i++) o[i] = src[0];                               \
        } else {                                                                              \
            for (int64_t i = 0; i < n; i++) o[i] = c[i * sc] ? x[i * sx] : y[i * sy];         \
        }                                                                                     \
    }
BC_WHERE_RUN(uint8_t)
BC_WHERE_RUN(uint16_t)
BC_WHERE_RUN(uint32_t)
BC_WHERE_RUN(uint64_t)

/* The innermost run of Expand for elements of type T: sx is 0 (a fill) or 1 (a copy). */
#define BC_EXPAND_RUN(T)                                                                      \
    static void expand_run_##T(const void *xv, void *ov, int64_t n, int64_t sx)                \
    {                                                                                         \
        const T *x = xv;                                                                      \
        T *o = ov;                                                                            \
        if (sx == 1) {                                                                        \
            memcpy(o, x, (size_t)n * sizeof(T));                                              \
        } else {                                                                              \
            const T v = x[0];                                                                 \
            for (int64_t i = 0; i < n; i++) o[i] = v;                                         \
        }                                                                                     \
    }
BC_EXPAND_RUN(uint8_t)
BC_EXPAND_RUN(uint16_t)
BC_EXPAND_RUN(uint32_t)
BC_EXPAND_RUN(uint64_t)

static void bc_range(void *arg, int64_t begin, int64_t end)
{
    const struct bc_job *j = arg;
    const struct bc_state *s = j->s;
    const int r = s->rank - 1, es = s->es;
    const int64_t inner = s->dims[r];
    for (int64_t row = begin; row < end; row++) {
        int64_t off[BC_MAX_IN] = {0, 0, 0}, rem = row;
        for (int d = r - 1; d >= 0; d--) {
            int64_t i = rem % s->dims[d];
            rem /= s->dims[d];
            for (int k = 0; k < s->n_in; k++) off[k] += i * s->st[k][d];
        }
        char *o = (char *)j->y + (size_t)(row * inner) * (size_t)es;
        if (s->n_in == 1) {
            const char *x = (const char *)j->in[0] + (size_t)off[0] * (size_t)es;
            switch (es) {
            case 1: expand_run_uint8_t(x, o, inner, s->st[0][r]); break;
            case 2: expand_run_uint16_t(x, o, inner, s->st[0][r]); break;
            case 4: expand_run_uint32_t(x, o, inner, s->st[0][r]); break;
            default: expand_run_uint64_t(x, o, inner, s->st[0][r]); break;
            }
            continue;
        }
        const uint8_t *c = (const uint8_t *)j->in[0] + off[0];
        const char *x = (const char *)j->in[1] + (size_t)off[1] * (size_t)es;
        const char *y = (const char *)j->in[2] + (size_t)off[2] * (size_t)es;
        const int64_t sc = s->st[0][r], sx = s->st[1][r], sy = s->st[2][r];
        switch (es) {
        case 1: where_run_uint8_t(c, x, y, o, inner, sc, sx, sy); break;
        case 2: where_run_uint16_t(c, x, y, o, inner, sc, sx, sy); break;
        case 4: where_run_uint32_t(c, x, y, o, inner, sc, sx, sy); break;
        default: where_run_uint64_t(c, x, y, o, inner, sc, sx, sy); break;
        }
    }
}

static kiln_status bc_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct bc_state *s = state;
    struct bc_job j = {.s = s, .y = ctx->out[0]->data};
    for (int k = 0; k < s->n_in; k++) j.in[k] = ctx->in[s->n_in == 3 ? k : 0]->data;
    int64_t inner = s->dims[s->rank - 1];
    /* about 16 KiB of output per work item */
    int64_t bytes = inner * s->es, grain = bytes >= 16384 ? 1 : 16384 / (bytes > 0 ? bytes : 1);
    kiln_parallel_for(ctx->threads, s->rows, grain, bc_range, &j);
    return KILN_OK;
}

static bool bc_plain_concrete(const struct kiln_compile_ctx *cc, int i)
{
    return cc->in[i] && kiln_type_is_concrete(cc->in[i]) && !(cc->in_layout && cc->in_layout[i]);
}

static int bc_elem_size(kiln_dtype dt)
{
    if (dt == KILN_DTYPE_STRING || dt == KILN_DTYPE_UNDEFINED) return 0;
    size_t es = kiln_dtype_size(dt);
    return es == 1 || es == 2 || es == 4 || es == 8 ? (int)es : 0;
}

/* The runs of out for the data inputs ins (n of them, their cc input indices). */
static kiln_status bc_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst,
                              const int *ins, int n, const char *name)
{
    const struct kiln_type *o = cc->out[0];
    int64_t st[BC_MAX_IN][KILN_MAX_RANK];
    if (o->rank > KILN_MAX_RANK) return KILN_OK;
    for (int k = 0; k < n; k++)
        if (!kiln_simd_bcast_strides(cc->in[ins[k]], o, st[k])) return KILN_OK;
    int64_t count = kiln_shape_count(o->rank, o->dims);
    if (count <= 0) return KILN_OK; /* nothing to copy: the reference's loop is free */
    struct bc_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling %s", name);
    s->n_in = n;
    s->es = bc_elem_size(o->dtype);
    int r = 0;
    for (int d = 0; d < o->rank; d++) {
        if (o->dims[d] == 1) continue;
        bool merge = r > 0;
        for (int k = 0; merge && k < n; k++) merge = s->st[k][r - 1] == st[k][d] * o->dims[d];
        if (merge) {
            s->dims[r - 1] *= o->dims[d];
            for (int k = 0; k < n; k++) s->st[k][r - 1] = st[k][d];
            continue;
        }
        s->dims[r] = o->dims[d];
        for (int k = 0; k < n; k++) s->st[k][r] = st[k][d];
        r++;
    }
    if (r == 0) { /* one element */
        s->dims[0] = 1;
        for (int k = 0; k < n; k++) s->st[k][0] = 1;
        r = 1;
    }
    s->rank = r;
    s->rows = count / s->dims[r - 1];
    snprintf(s->name, sizeof s->name, "%s", name);
    inst->state = s;
    inst->destroy = free;
    inst->run = bc_run;
    inst->name = s->name;
    return KILN_OK;
}

bool kiln_k_where_covers(const struct kiln_compile_ctx *cc)
{
    if (cc->n_in != 3 || cc->n_out < 1 || !cc->out[0] || !kiln_type_is_concrete(cc->out[0]) ||
        (cc->out_layout && cc->out_layout[0]))
        return false;
    for (int i = 0; i < 3; i++)
        if (!bc_plain_concrete(cc, i)) return false;
    return cc->in[0]->dtype == KILN_DTYPE_BOOL && cc->in[1]->dtype == cc->out[0]->dtype &&
           cc->in[2]->dtype == cc->out[0]->dtype && bc_elem_size(cc->out[0]->dtype) > 0;
}

kiln_status kiln_k_where_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    if (!kiln_k_where_covers(cc)) return KILN_OK;
    static const int ins[3] = {0, 1, 2};
    return bc_compile(cc, inst, ins, 3, "where_bcast");
}

bool kiln_k_expand_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 1 && cc->n_out >= 1 && cc->out[0] && kiln_type_is_concrete(cc->out[0]) &&
           !(cc->out_layout && cc->out_layout[0]) && bc_plain_concrete(cc, 0) &&
           cc->in[0]->dtype == cc->out[0]->dtype && bc_elem_size(cc->out[0]->dtype) > 0;
}

kiln_status kiln_k_expand_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    if (!kiln_k_expand_covers(cc)) return KILN_OK;
    static const int ins[1] = {0};
    return bc_compile(cc, inst, ins, 1, "expand_bcast");
}
