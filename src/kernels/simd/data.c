/*
 * data.c - fast data-movement and reduction kernels: Gather along axis 0
 * (embedding lookup; any fixed-size dtype, int32 or int64 indices, every
 * index checked before anything is copied), Gather of channels (axis 1 of a
 * 4-D float32 tensor, constant 1-D indices: a channel permutation such as the
 * channel shuffle src/opt/layout_shuffle.c makes; plain or blocked layouts,
 * through gather4.h), Transpose (any permutation of
 * a fixed-size dtype: dims of 1 dropped and dims that stay together
 * merged, then a row copy when the innermost dim stays innermost -- e.g.
 * [0,2,1,3] --, a 32x32-tiled copy for (batched) 2-D swaps, and an
 * odometer walk otherwise) and ReduceSum / ReduceMean of f32 over trailing
 * axes (sums in double, as the reference does). Gather's two kernels and
 * Transpose are declared in the copy family's list (copy.def, family.h),
 * the reductions (one kernel per SIMD table) in reduce.def.
 */
#include <math.h>
#include <stdio.h>

#include "kernels/family.h"
#include "kernels/simd/gather4.h"
#include "kernels/simd/simd.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/copy.def"
#include "kernels/simd/reduce.def"
#undef KILN_KERNEL

static bool concrete(const struct kiln_type *t)
{
    return t && kiln_type_is_concrete(t);
}

static int64_t dims_product(const int64_t *dims, int lo, int hi)
{
    int64_t p = 1;
    for (int d = lo; d < hi; d++) p *= dims[d];
    return p;
}

/* Element sizes the copy kernels handle: plain bytes, no strings. */
static size_t plain_size(kiln_dtype dt)
{
    if (dt == KILN_DTYPE_STRING || dt == KILN_DTYPE_UNDEFINED) return 0;
    size_t es = kiln_dtype_size(dt);
    return es == 1 || es == 2 || es == 4 || es == 8 ? es : 0;
}

/* ---- Gather ---- */

struct gather_state {
    int64_t outer;   /* product of the data dims before the axis (1 for axis 0) */
    int64_t n;       /* data dim `axis` */
    int64_t inner;   /* elements per row */
    int64_t nidx;
    int axis;
    size_t es;
    bool idx64;
};

struct gather_job {
    const struct gather_state *s;
    const char *data;
    const void *idx;
    char *out;
};

static int64_t gather_index(const struct gather_state *s, const void *idx, int64_t k)
{
    int64_t v = s->idx64 ? ((const int64_t *)idx)[k] : ((const int32_t *)idx)[k];
    return v < 0 ? v + s->n : v;
}

static void gather_range(void *arg, int64_t begin, int64_t end)
{
    const struct gather_job *j = arg;
    const struct gather_state *s = j->s;
    size_t row = (size_t)s->inner * s->es;
    for (int64_t u = begin; u < end; u++) { /* u: (outer index, index k) */
        int64_t o = u / s->nidx, k = u % s->nidx;
        memcpy(j->out + (size_t)u * row,
               j->data + (size_t)(o * s->n + gather_index(s, j->idx, k)) * row, row);
    }
}

static kiln_status gather_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct gather_state *s = state;
    struct gather_job j = {s, ctx->in[0]->data, ctx->in[1]->data, ctx->out[0]->data};
    for (int64_t k = 0; k < s->nidx; k++) {
        int64_t w = gather_index(s, j.idx, k);
        if (w < 0 || w >= s->n) {
            int64_t v = s->idx64 ? ((const int64_t *)j.idx)[k] : ((const int32_t *)j.idx)[k];
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "indices[%lld] = %lld is out of range for data dim %d of "
                                   "size %lld",
                                   (long long)k, (long long)v, s->axis, (long long)s->n);
        }
    }
    int64_t row_bytes = s->inner * (int64_t)s->es;
    kiln_parallel_for(ctx->threads, s->outer * s->nidx, kiln_copy_grain(row_bytes), gather_range,
                      &j);
    return KILN_OK;
}

/* Gather of channels: axis 1 of a 4-D float32 tensor, constant 1-D indices. */
struct gather_chan_state {
    struct kiln_gather4 g;
    char name[32];
};

static void gather_chan_free(void *p)
{
    struct gather_chan_state *s = p;
    kiln_gather4_free(&s->g);
    free(s);
}

static kiln_status gather_chan_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct gather_chan_state *s = state;
    kiln_gather4_run(&s->g, ctx->in[0]->data, ctx->out[0]->data, ctx->threads);
    return KILN_OK;
}

static bool gather_is_channels(const struct kiln_node *n, int rank)
{
    int64_t axis = kiln_attr_int(n, "axis", 0);
    return rank == 4 && (axis == 1 || axis == -3);
}

/* Both Gather kernels: data, indices and output concrete, data of rank >= 1. */
static bool gather_concrete(const struct kiln_compile_ctx *cc)
{
    return cc->n_in > 1 && concrete(cc->in[0]) && concrete(cc->in[1]) && cc->in[0]->rank >= 1 &&
           cc->n_out >= 1 && concrete(cc->out[0]);
}

bool kiln_k_gather_channels_covers(const struct kiln_compile_ctx *cc)
{
    return gather_concrete(cc) && gather_is_channels(cc->node, cc->in[0]->rank);
}

kiln_status kiln_k_gather_channels_compile(const struct kiln_compile_ctx *cc,
                                           struct kiln_kernel_inst *inst)
{
    const struct kiln_type *d = cc->in[0], *y = cc->out[0];
    const kiln_tensor *ind = cc->in_value ? cc->in_value[1] : NULL;
    int lx = cc->in_layout ? cc->in_layout[0] : 0, ly = cc->out_layout ? cc->out_layout[0] : 0;
    if (d->dtype != KILN_DTYPE_F32 || y->dtype != KILN_DTYPE_F32 || y->rank != 4 || lx != ly ||
        !ind || ind->rank != 1 || ind->dims[0] != y->dims[1] ||
        (ind->dtype != KILN_DTYPE_I64 && ind->dtype != KILN_DTYPE_I32))
        return KILN_OK;
    int64_t k = ind->dims[0];
    int64_t *chan = malloc(sizeof(int64_t) * (size_t)(k + 1));
    if (!chan) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling Gather");
    for (int64_t i = 0; i < k; i++) {
        int64_t v = ind->dtype == KILN_DTYPE_I64 ? ((const int64_t *)ind->data)[i]
                                                 : ((const int32_t *)ind->data)[i];
        if (v < 0) v += d->dims[1];
        if (v < 0 || v >= d->dims[1]) {
            free(chan);
            return KILN_OK; /* the reference reports the index */
        }
        chan[i] = v;
    }
    struct gather_chan_state *s = calloc(1, sizeof *s);
    kiln_status st = s ? kiln_gather4_init(&s->g, d->dims, lx, k, d->dims[2], d->dims[3], ly, 0, k,
                                           chan, 0, 1, 0, 1)
                       : kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling Gather");
    free(chan);
    if (st != KILN_OK) {
        free(s);
        return st;
    }
    if (ly) snprintf(s->name, sizeof s->name, "gather_channels_blocked%d", ly);
    else snprintf(s->name, sizeof s->name, "gather_channels");
    inst->name = s->name;
    inst->state = s;
    inst->destroy = gather_chan_free;
    inst->run = gather_chan_run;
    return KILN_OK;
}

/* Rows: along axis 0. */
bool kiln_k_gather_rows_covers(const struct kiln_compile_ctx *cc)
{
    if (!gather_concrete(cc)) return false;
    int64_t axis = kiln_attr_int(cc->node, "axis", 0);
    return axis == 0 || axis == -cc->in[0]->rank;
}

/* Gather along `axis` (covers checked the types): rows of the dims after it, per
 * index and per position in the dims before it. */
static kiln_status gather_compile_axis(const struct kiln_compile_ctx *cc,
                                       struct kiln_kernel_inst *inst, int axis, const char *name)
{
    const struct kiln_type *d = cc->in[0], *ind = cc->in[1];
    if (ind->dtype != KILN_DTYPE_I64 && ind->dtype != KILN_DTYPE_I32) return KILN_OK;
    size_t es = plain_size(d->dtype);
    if (!es || cc->out[0]->dtype != d->dtype) return KILN_OK;
    struct gather_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling Gather");
    s->outer = dims_product(d->dims, 0, axis);
    s->n = d->dims[axis];
    s->inner = dims_product(d->dims, axis + 1, d->rank);
    s->nidx = kiln_shape_count(ind->rank, ind->dims);
    s->axis = axis;
    s->es = es;
    s->idx64 = ind->dtype == KILN_DTYPE_I64;
    inst->state = s;
    inst->destroy = free;
    inst->run = gather_run;
    inst->name = name;
    return KILN_OK;
}

kiln_status kiln_k_gather_rows_compile(const struct kiln_compile_ctx *cc,
                                       struct kiln_kernel_inst *inst)
{
    return gather_compile_axis(cc, inst, 0, "gather_rows");
}

/* Any axis (the last time step of a recurrent layer's [B,T,H] output, axis 1), plain
 * layouts only (accepts none). */
bool kiln_k_gather_axis_covers(const struct kiln_compile_ctx *cc)
{
    if (!gather_concrete(cc)) return false;
    int64_t axis = kiln_attr_int(cc->node, "axis", 0), r = cc->in[0]->rank;
    return axis >= -r && axis < r;
}

kiln_status kiln_k_gather_axis_compile(const struct kiln_compile_ctx *cc,
                                       struct kiln_kernel_inst *inst)
{
    if ((cc->in_layout && cc->in_layout[0]) || (cc->out_layout && cc->out_layout[0]))
        return KILN_OK;
    int64_t axis = kiln_attr_int(cc->node, "axis", 0);
    if (axis < 0) axis += cc->in[0]->rank;
    return gather_compile_axis(cc, inst, (int)axis, "gather_axis");
}
/* Layout pass: a Gather of channels may read and write blocked data (src/opt/layout.c
 * checks the rank and that the indices are constant). */
int kiln_k_gather_channels_accepts(const struct kiln_node *n, int i, int block)
{
    return (i == 0 || i == -1) && (block == 8 || block == 16) && gather_is_channels(n, 4);
}

/* ---- Transpose ---- */

enum transpose_kind { TR_COPY, TR_ROWS, TR_TILED, TR_WALK };

struct transpose_state {
    enum transpose_kind kind;
    size_t es;
    int rank;                      /* of the simplified permutation */
    int64_t odims[KILN_MAX_RANK];  /* output dims */
    int64_t istr[KILN_MAX_RANK];   /* input stride (elements) of each output dim */
    int64_t total;
    /* TR_ROWS: rows of `row` elements; TR_TILED: batches of rows x cols */
    int64_t row, batch, rows, cols;
    char name[32];
};

struct transpose_job {
    const struct transpose_state *s;
    const char *x;
    char *y;
};

/* Offset in the input of the output element (or row) with linear index i
 * over the first `r` output dims. */
static int64_t walk_offset(const struct transpose_state *s, int r, int64_t i, int64_t *idx)
{
    int64_t off = 0;
    for (int d = r - 1; d >= 0; d--) {
        idx[d] = i % s->odims[d];
        i /= s->odims[d];
        off += idx[d] * s->istr[d];
    }
    return off;
}

/* Advance idx over the first r dims by one; returns the new offset. */
static int64_t walk_next(const struct transpose_state *s, int r, int64_t *idx, int64_t off)
{
    for (int d = r - 1; d >= 0; d--) {
        idx[d]++;
        off += s->istr[d];
        if (idx[d] < s->odims[d]) return off;
        off -= s->istr[d] * s->odims[d];
        idx[d] = 0;
    }
    return off;
}

#define COPY_ELEM(es, dst, src)                                                   \
    do {                                                                          \
        switch (es) {                                                             \
        case 1: *(uint8_t *)(dst) = *(const uint8_t *)(src); break;               \
        case 2: memcpy((dst), (src), 2); break;                                   \
        case 4: memcpy((dst), (src), 4); break;                                   \
        default: memcpy((dst), (src), 8); break;                                  \
        }                                                                         \
    } while (0)

static void transpose_range(void *arg, int64_t begin, int64_t end)
{
    const struct transpose_job *j = arg;
    const struct transpose_state *s = j->s;
    size_t es = s->es;
    int64_t idx[KILN_MAX_RANK];
    switch (s->kind) {
    case TR_COPY:
        memcpy(j->y + (size_t)begin * es, j->x + (size_t)begin * es, (size_t)(end - begin) * es);
        break;
    case TR_ROWS: { /* unit: one row of s->row contiguous elements */
        size_t rb = (size_t)s->row * es;
        int64_t off = walk_offset(s, s->rank - 1, begin, idx);
        for (int64_t i = begin; i < end; i++) {
            memcpy(j->y + (size_t)i * rb, j->x + (size_t)off * es, rb);
            off = walk_next(s, s->rank - 1, idx, off);
        }
        break;
    }
    case TR_TILED: { /* unit: one 32-row band of one batch; y[c][r] = x[r][c] */
        int64_t bands = (s->rows + 31) / 32;
        if (es == 4) {
            for (int64_t u = begin; u < end; u++) {
                int64_t b = u / bands, r0 = (u % bands) * 32;
                int64_t r1 = r0 + 32 < s->rows ? r0 + 32 : s->rows;
                const float *x = (const float *)j->x + b * s->rows * s->cols;
                float *y = (float *)j->y + b * s->rows * s->cols;
                for (int64_t c0 = 0; c0 < s->cols; c0 += 32) {
                    int64_t c1 = c0 + 32 < s->cols ? c0 + 32 : s->cols;
                    for (int64_t c = c0; c < c1; c++)
                        for (int64_t r = r0; r < r1; r++) y[c * s->rows + r] = x[r * s->cols + c];
                }
            }
            break;
        }
        for (int64_t u = begin; u < end; u++) {
            int64_t b = u / bands, r0 = (u % bands) * 32;
            int64_t r1 = r0 + 32 < s->rows ? r0 + 32 : s->rows;
            const char *x = j->x + (size_t)(b * s->rows * s->cols) * es;
            char *y = j->y + (size_t)(b * s->rows * s->cols) * es;
            for (int64_t c0 = 0; c0 < s->cols; c0 += 32) {
                int64_t c1 = c0 + 32 < s->cols ? c0 + 32 : s->cols;
                for (int64_t c = c0; c < c1; c++)
                    for (int64_t r = r0; r < r1; r++)
                        COPY_ELEM(es, y + (size_t)(c * s->rows + r) * es,
                                  x + (size_t)(r * s->cols + c) * es);
            }
        }
        break;
    }
    case TR_WALK: {
        int64_t off = walk_offset(s, s->rank, begin, idx);
        for (int64_t i = begin; i < end; i++) {
            COPY_ELEM(es, j->y + (size_t)i * es, j->x + (size_t)off * es);
            off = walk_next(s, s->rank, idx, off);
        }
        break;
    }
    }
}

static kiln_status transpose_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct transpose_state *s = state;
    struct transpose_job j = {s, ctx->in[0]->data, ctx->out[0]->data};
    int64_t units = s->total, grain = 65536;
    if (s->kind == TR_ROWS) {
        units = s->total / s->row;
        grain = s->row >= 65536 ? 1 : 65536 / s->row;
    } else if (s->kind == TR_TILED) {
        units = s->batch * ((s->rows + 31) / 32);
        int64_t per = 32 * s->cols;
        grain = per >= 65536 ? 1 : 65536 / per;
    }
    kiln_parallel_for(ctx->threads, units, grain, transpose_range, &j);
    return KILN_OK;
}

bool kiln_k_transpose_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 1 && concrete(cc->in[0]) && cc->n_out >= 1 && concrete(cc->out[0]);
}

kiln_status kiln_k_transpose_compile(const struct kiln_compile_ctx *cc,
                                     struct kiln_kernel_inst *inst)
{
    const struct kiln_type *x = cc->in[0];
    if (!concrete(x) || cc->n_out < 1 || !concrete(cc->out[0])) return KILN_OK;
    size_t es = plain_size(x->dtype);
    if (!es || cc->out[0]->dtype != x->dtype) return KILN_OK;
    int rank = x->rank, perm[KILN_MAX_RANK];
    const int64_t *p;
    int np = kiln_attr_ints(cc->node, "perm", &p);
    if (np < 0) {
        for (int i = 0; i < rank; i++) perm[i] = rank - 1 - i;
    } else {
        if (np != rank) return KILN_OK;
        bool seen[KILN_MAX_RANK] = {false};
        for (int i = 0; i < np; i++) {
            if (p[i] < 0 || p[i] >= rank || seen[p[i]]) return KILN_OK; /* reference reports */
            seen[p[i]] = true;
            perm[i] = (int)p[i];
        }
    }
    int64_t total = kiln_shape_count(x->rank, x->dims);
    if (total <= 0) return KILN_OK;

    /* simplify: drop dims of 1 and merge neighbouring output dims that walk
     * the input contiguously (outer stride = inner stride * inner size) */
    int64_t in_str[KILN_MAX_RANK];
    kiln_shape_strides(rank, x->dims, in_str);
    struct transpose_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling Transpose");
    int r = 0;
    for (int i = 0; i < rank; i++) {
        int a = perm[i];
        if (x->dims[a] == 1) continue;
        if (r > 0 && s->istr[r - 1] == in_str[a] * x->dims[a]) {
            s->odims[r - 1] *= x->dims[a];
            s->istr[r - 1] = in_str[a];
        } else {
            s->odims[r] = x->dims[a];
            s->istr[r] = in_str[a];
            r++;
        }
    }
    s->rank = r;
    s->es = es;
    s->total = total;
    if (r <= 1) {
        s->kind = TR_COPY;
    } else if (s->istr[r - 1] == 1) {
        s->kind = TR_ROWS;
        s->row = s->odims[r - 1];
    } else if (s->istr[r - 2] == 1 && s->istr[r - 1] == s->odims[r - 2]) {
        /* [.., C, R] from input [.., R, C]: leading dims must be in order */
        bool batched = true;
        int64_t expect = s->odims[r - 1] * s->odims[r - 2];
        for (int d = r - 3; d >= 0; d--) {
            if (s->istr[d] != expect) batched = false;
            expect *= s->odims[d];
        }
        s->kind = batched ? TR_TILED : TR_WALK;
        s->rows = s->odims[r - 1];
        s->cols = s->odims[r - 2];
        s->batch = total / (s->rows * s->cols);
    } else {
        s->kind = TR_WALK;
    }
    static const char *const names[] = {"transpose_copy", "transpose_rows", "transpose_tiled",
                                        "transpose_walk"};
    snprintf(s->name, sizeof s->name, "%s", names[s->kind]);
    inst->state = s;
    inst->destroy = free;
    inst->run = transpose_run;
    inst->name = s->name;
    return KILN_OK;
}


/* ---- Reductions over any axes ----
 *
 * The input's dims, size-1 dims dropped, are merged into runs that are all
 * reduced or all kept. One run of reduced dims is one pass over [rows, n,
 * inner] (inner = the kept dims after it: summed vector by vector, as in
 * embedding bags); several runs take one pass each, innermost first, the
 * intermediate results in the kernel's scratch (reduced axes that are not
 * neighbours, as in a mean over H and N of [N,C,H]). A mean is the mean of
 * the passes' means: every group has the same count. ReduceSumSquare, L1 and
 * L2 first map x (square, absolute value) into scratch and sum that; L2 and
 * LogSum finish each output (sqrt, log). Max and Min keep a NaN anywhere in
 * the group, as the reference does. */

enum reduce_kind {
    REDUCE_SUM, REDUCE_MEAN, REDUCE_MAX, REDUCE_MIN, REDUCE_SUM_SQUARE, REDUCE_L1, REDUCE_L2,
    REDUCE_LOG_SUM
};

#define REDUCE_MAX_PASSES (KILN_MAX_RANK / 2 + 1)

struct reduce_pass {
    int64_t rows, n, inner; /* inner > 1: the reduced run is followed by kept dims */
};

struct reduce_state {
    const struct simd_kernels *k;
    enum reduce_kind kind;
    int passes;
    struct reduce_pass pass[REDUCE_MAX_PASSES];
    int64_t count;          /* elements of x */
    size_t buf_floats;      /* each intermediate buffer (two, alternating) */
    char name[48];
};

struct reduce_job {
    const struct reduce_state *s;
    const struct reduce_pass *p;
    int op;                 /* REDUCE_SUM, REDUCE_MEAN, REDUCE_MAX or REDUCE_MIN */
    const float *x;
    float *y;
};

static void reduce_range(void *arg, int64_t begin, int64_t end)
{
    const struct reduce_job *j = arg;
    const struct simd_kernels *k = j->s->k;
    const int64_t n = j->p->n;
    bool extreme = j->op == REDUCE_MAX || j->op == REDUCE_MIN;
    if (j->p->inner > 1) { /* y[o, :] = sum (max, min) over r of x[o, r, :] (then / n: mean) */
        int64_t in = j->p->inner;
        for (int64_t o = begin; o < end; o++) {
            const float *x = j->x + o * n * in;
            float *y = j->y + o * in;
            memcpy(y, x, sizeof(float) * (size_t)in);
            for (int64_t r = 1; r < n; r++) {
                if (extreme)
                    k->extreme_acc(y, x + r * in, in, j->op == REDUCE_MIN);
                else
                    k->binary(SIMD_ADD, SIMD_B_VEC, y, x + r * in, y, in);
            }
            if (j->op == REDUCE_MEAN) {
                float inv = 1.0f / (float)n;
                k->binary(SIMD_MUL, SIMD_B_SCALAR_B, y, &inv, y, in);
            }
        }
        return;
    }
    if (extreme)
        k->extreme_rows(j->x + begin * n, j->y + begin, end - begin, n, j->op == REDUCE_MIN);
    else
        k->sum_rows(j->x + begin * n, j->y + begin, end - begin, n,
                    j->op == REDUCE_MEAN ? (double)n : 1.0);
}

/* x mapped for the sums of ReduceSumSquare, L1 and L2: [begin, end) of y = x * x or |x| */
struct reduce_map_job {
    const struct reduce_state *s;
    const float *x;
    float *y;
};

static void reduce_map_range(void *arg, int64_t begin, int64_t end)
{
    const struct reduce_map_job *j = arg;
    if (j->s->kind == REDUCE_L1) {
        for (int64_t i = begin; i < end; i++) j->y[i] = fabsf(j->x[i]);
        return;
    }
    j->s->k->unary(SIMD_SQUARE, 0.0f, 0.0f, j->x + begin, j->y + begin, end - begin);
}

static kiln_status reduce_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct reduce_state *s = state;
    const float *src = ctx->in[0]->data;
    float *y = ctx->out[0]->data, *buf = ctx->scratch;
    float *pre = buf + 2 * s->buf_floats; /* the mapped x */
    int op = s->kind;
    if (s->kind == REDUCE_SUM_SQUARE || s->kind == REDUCE_L1 || s->kind == REDUCE_L2) {
        struct reduce_map_job mj = {s, src, pre};
        kiln_parallel_for(ctx->threads, s->count, SIMD_GRAIN_CHEAP, reduce_map_range, &mj);
        src = pre;
        op = REDUCE_SUM;
    } else if (s->kind == REDUCE_LOG_SUM) {
        op = REDUCE_SUM;
    }
    for (int p = 0; p < s->passes; p++) {
        const struct reduce_pass *ps = &s->pass[p];
        float *dst = p == s->passes - 1 ? y : buf + (size_t)(p % 2) * s->buf_floats;
        struct reduce_job j = {s, ps, op, src, dst};
        int64_t per = ps->n * (ps->inner > 1 ? ps->inner : 1);
        int64_t grain = per >= SIMD_GRAIN_CHEAP ? 1 : SIMD_GRAIN_CHEAP / per;
        kiln_parallel_for(ctx->threads, ps->rows, grain, reduce_range, &j);
        src = dst;
    }
    int64_t outs = s->pass[s->passes - 1].rows * s->pass[s->passes - 1].inner;
    if (s->kind == REDUCE_L2) s->k->unary(SIMD_SQRT, 0.0f, 0.0f, y, y, outs);
    if (s->kind == REDUCE_LOG_SUM)
        for (int64_t i = 0; i < outs; i++) y[i] = logf(y[i]);
    return KILN_OK;
}

bool kiln_k_reduce_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 1 && concrete(cc->in[0]) && cc->in[0]->dtype == KILN_DTYPE_F32 &&
           cc->n_out >= 1 && concrete(cc->out[0]) && cc->out[0]->dtype == KILN_DTYPE_F32;
}

static kiln_status reduce_compile(const struct kiln_compile_ctx *cc,
                                  struct kiln_kernel_inst *inst,
                                  const struct simd_kernels *table, enum reduce_kind kind)
{
    const struct kiln_type *x = cc->in[0];
    if (!concrete(x) || x->dtype != KILN_DTYPE_F32 || cc->n_out < 1 || !concrete(cc->out[0]) ||
        cc->out[0]->dtype != KILN_DTYPE_F32)
        return KILN_OK;
    int rank = x->rank;
    bool reduced[KILN_MAX_RANK] = {false};
    int64_t n_axes;
    const int64_t *attr_axes = NULL;
    const kiln_tensor *axes_t = NULL;
    if (cc->n_in > 1 && cc->in[1]) {
        axes_t = cc->in_value ? cc->in_value[1] : NULL;
        if (!axes_t || (axes_t->dtype != KILN_DTYPE_I64 && axes_t->dtype != KILN_DTYPE_I32))
            return KILN_OK;
        n_axes = kiln_tensor_count(axes_t);
    } else {
        n_axes = kiln_attr_ints(cc->node, "axes", &attr_axes);
        if (n_axes < 0) n_axes = 0;
    }
    if (n_axes == 0) {
        if (kiln_attr_int(cc->node, "noop_with_empty_axes", 0)) return KILN_OK;
        for (int d = 0; d < rank; d++) reduced[d] = true;
    }
    for (int64_t k = 0; k < n_axes; k++) {
        int64_t a = axes_t ? kiln_tensor_i64(axes_t, k) : attr_axes[k];
        if (a < -rank || a >= rank) return KILN_OK;
        reduced[a < 0 ? a + rank : a] = true;
    }
    /* runs: dims of 1 dropped, neighbours of one kind merged */
    int64_t run[KILN_MAX_RANK + 1];
    bool red[KILN_MAX_RANK + 1];
    int runs = 0;
    for (int d = 0; d < rank; d++) {
        if (x->dims[d] == 1) continue;
        if (runs > 0 && red[runs - 1] == reduced[d]) {
            run[runs - 1] *= x->dims[d];
            continue;
        }
        run[runs] = x->dims[d];
        red[runs++] = reduced[d];
    }
    int64_t count = kiln_shape_count(rank, x->dims);
    if (count <= 0) return KILN_OK; /* empty groups: the reference gives the identities */
    bool any = false;
    for (int r = 0; r < runs; r++) any = any || red[r];
    if (!any) { /* every reduced dim has size 1: one pass over groups of one */
        run[runs] = 1;
        red[runs++] = true;
        any = true;
    }
    struct reduce_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling a Reduce node");
    /* passes: the innermost reduced run first, removed from the runs each time */
    int64_t cur = count, biggest = 0;
    while (any) { /* r >= 0: some run is reduced */
        int r = runs - 1;
        while (!red[r]) r--;
        struct reduce_pass *p = &s->pass[s->passes++];
        p->rows = 1;
        p->inner = 1;
        for (int q = 0; q < r; q++) p->rows *= run[q];
        for (int q = r + 1; q < runs; q++) p->inner *= run[q];
        p->n = run[r];
        cur /= run[r];
        for (int q = r; q + 1 < runs; q++) {
            run[q] = run[q + 1];
            red[q] = red[q + 1];
        }
        runs--;
        if (r > 0 && r < runs && !red[r - 1] && !red[r]) { /* kept runs now neighbours */
            run[r - 1] *= run[r];
            for (int q = r; q + 1 < runs; q++) {
                run[q] = run[q + 1];
                red[q] = red[q + 1];
            }
            runs--;
        }
        any = false;
        for (int q = 0; q < runs; q++) any = any || red[q];
        if (any && cur > biggest) biggest = cur; /* an intermediate result */
    }
    if (cur != kiln_shape_count(cc->out[0]->rank, cc->out[0]->dims)) {
        free(s);
        return KILN_OK;
    }
    s->k = table;
    s->kind = kind;
    s->count = count;
    s->buf_floats = (size_t)(biggest + 15) / 16 * 16;
    bool mapped = kind == REDUCE_SUM_SQUARE || kind == REDUCE_L1 || kind == REDUCE_L2;
    inst->scratch_bytes = (2 * s->buf_floats + (mapped ? (size_t)count : 0)) * sizeof(float);
    static const char *const names[] = {"sum", "mean", "max", "min", "sumsquare", "l1", "l2",
                                        "logsum"};
    snprintf(s->name, sizeof s->name, "f32_reduce%s%s_%s", names[kind],
             s->passes > 1 ? "_passes" : s->pass[0].inner > 1 ? "_mid" : "", s->k->isa);
    inst->state = s;
    inst->destroy = free;
    inst->run = reduce_run;
    inst->name = s->name;
    return KILN_OK;
}

#define REDUCE_OP(stem, KIND)                                                                \
    static kiln_status stem##_compile(const struct kiln_compile_ctx *cc,                     \
                                      struct kiln_kernel_inst *inst,                         \
                                      const struct simd_kernels *k)                          \
    {                                                                                        \
        return reduce_compile(cc, inst, k, KIND);                                            \
    }                                                                                        \
    SIMD_VARIANTS(stem, stem##_compile)
REDUCE_OP(reducesum, REDUCE_SUM)
REDUCE_OP(reducemean, REDUCE_MEAN)
REDUCE_OP(reducemax, REDUCE_MAX)
REDUCE_OP(reducemin, REDUCE_MIN)
REDUCE_OP(reducesumsquare, REDUCE_SUM_SQUARE)
REDUCE_OP(reducel1, REDUCE_L1)
REDUCE_OP(reducel2, REDUCE_L2)
REDUCE_OP(reducelogsum, REDUCE_LOG_SUM)
