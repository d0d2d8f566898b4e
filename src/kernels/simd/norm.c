/*
 * norm.c - fast f32 Softmax (any axis; contiguous rows when the axis is
 * innermost, W lanes across the inner dims otherwise; the pre-13 2-D
 * coercion too) and LayerNormalization (normalization over the trailing
 * dims from axis, scale and optional bias laid out like those dims, Mean
 * and InvStdDev produced when wanted in f32). Rows are split across the
 * run's threads. Statistics accumulate in double across blocks of floats.
 * Each has a kernel per SIMD table, declared in norm.def (family.h).
 */
#include <stdio.h>

#include "kernels/family.h"
#include "kernels/simd/simd.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/norm.def"
#undef KILN_KERNEL


static bool is_f32(const struct kiln_type *t)
{
    return t && t->dtype == KILN_DTYPE_F32 && kiln_type_is_concrete(t);
}

static int64_t dims_product(const int64_t *dims, int lo, int hi)
{
    int64_t p = 1;
    for (int d = lo; d < hi; d++) p *= dims[d];
    return p;
}

/* ---- Softmax and LogSoftmax ---- */

struct softmax_state {
    const struct simd_kernels *k;
    int64_t outer, n, inner;
    int log; /* LogSoftmax */
    char name[40];
};

struct softmax_job {
    const struct softmax_state *s;
    const float *x;
    float *y;
};

static void softmax_range(void *arg, int64_t begin, int64_t end)
{
    const struct softmax_job *j = arg;
    const struct softmax_state *s = j->s;
    if (s->inner == 1) {
        (s->log ? s->k->log_softmax_rows : s->k->softmax_rows)(
            j->x + begin * s->n, j->y + begin * s->n, end - begin, s->n);
        return;
    }
    for (int64_t o = begin; o < end; o++)
        (s->log ? s->k->log_softmax_strided : s->k->softmax_strided)(
            j->x + o * s->n * s->inner, j->y + o * s->n * s->inner, s->n, s->inner);
}

static kiln_status softmax_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct softmax_state *s = state;
    struct softmax_job j = {s, ctx->in[0]->data, ctx->out[0]->data};
    int64_t per = s->n * s->inner, grain = per >= SIMD_GRAIN_MATH ? 1 : SIMD_GRAIN_MATH / per;
    kiln_parallel_for(ctx->threads, s->outer, grain, softmax_range, &j);
    return KILN_OK;
}

bool kiln_k_softmax_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 1 && is_f32(cc->in[0]) && cc->n_out >= 1 && is_f32(cc->out[0]);
}

static kiln_status softmax_compile(const struct kiln_compile_ctx *cc,
                                   struct kiln_kernel_inst *inst, const struct simd_kernels *k)
{
    const struct kiln_type *x = cc->in[0];
    if (!is_f32(x) || cc->n_out < 1 || !is_f32(cc->out[0])) return KILN_OK;
    int64_t outer = 1, n = 1, inner = 1;
    if (x->rank > 0) {
        bool legacy = cc->node->opset > 0 && cc->node->opset < 13;
        int64_t attr = kiln_attr_int(cc->node, "axis", legacy ? 1 : -1);
        if (attr < 0) attr += x->rank;
        if (attr < 0 || attr > x->rank || (attr == x->rank && !legacy)) return KILN_OK;
        int axis = (int)attr;
        outer = dims_product(x->dims, 0, axis);
        if (legacy) {
            n = dims_product(x->dims, axis, x->rank);
        } else {
            n = x->dims[axis];
            inner = dims_product(x->dims, axis + 1, x->rank);
        }
    }
    if (n <= 0 || inner <= 0) return KILN_OK;
    struct softmax_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling Softmax");
    s->k = k;
    s->outer = outer;
    s->n = n;
    s->inner = inner;
    s->log = cc->node->op == KILN_OP_LogSoftmax;
    snprintf(s->name, sizeof s->name, "f32_%ssoftmax_%s", s->log ? "log_" : "", s->k->isa);
    inst->state = s;
    inst->destroy = free;
    inst->run = softmax_run;
    inst->name = s->name;
    inst->inplace = 1;
    return KILN_OK;
}
SIMD_VARIANTS(softmax, softmax_compile)
SIMD_VARIANTS(log_softmax, softmax_compile)

/* ---- LayerNormalization ---- */

struct layernorm_state {
    const struct simd_kernels *k;
    int64_t rows, n;
    float eps;
    bool want_mean, want_inv;
    char name[40];
};

struct layernorm_job {
    const struct layernorm_state *s;
    const float *x, *scale, *bias;
    float *y, *mean, *inv;
};

static void layernorm_range(void *arg, int64_t begin, int64_t end)
{
    const struct layernorm_job *j = arg;
    int64_t n = j->s->n;
    j->s->k->layernorm_rows(j->x + begin * n, j->y + begin * n, end - begin, n, j->s->eps,
                            j->scale, j->bias, j->mean ? j->mean + begin : NULL,
                            j->inv ? j->inv + begin : NULL);
}

static kiln_status layernorm_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct layernorm_state *s = state;
    struct layernorm_job j = {
        .s = s,
        .x = ctx->in[0]->data,
        .scale = ctx->in[1]->data,
        .bias = ctx->n_in > 2 && ctx->in[2] ? ctx->in[2]->data : NULL,
        .y = ctx->out[0]->data,
        .mean = s->want_mean ? ctx->out[1]->data : NULL,
        .inv = s->want_inv ? ctx->out[2]->data : NULL,
    };
    int64_t grain = s->n >= SIMD_GRAIN_NORM ? 1 : SIMD_GRAIN_NORM / s->n;
    kiln_parallel_for(ctx->threads, s->rows, grain, layernorm_range, &j);
    return KILN_OK;
}

/* Whether p is laid out like x's dims from axis on (leading dims of 1). */
static bool trails_from(const struct kiln_type *p, const struct kiln_type *x, int axis)
{
    if (p->rank > x->rank) return false;
    for (int d = 0; d < p->rank; d++) {
        int xd = d + x->rank - p->rank;
        int64_t want = xd < axis ? 1 : x->dims[xd];
        if (p->dims[d] != want) return false;
    }
    return true;
}

bool kiln_k_layernorm_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 2 && is_f32(cc->in[0]) && is_f32(cc->in[1]) && cc->in[0]->rank >= 1 &&
           cc->n_out >= 1 && is_f32(cc->out[0]);
}

static kiln_status layernorm_compile(const struct kiln_compile_ctx *cc,
                                     struct kiln_kernel_inst *inst, const struct simd_kernels *k)
{
    const struct kiln_type *x = cc->in[0], *scale = cc->n_in > 1 ? cc->in[1] : NULL;
    const struct kiln_type *bias = cc->n_in > 2 ? cc->in[2] : NULL;
    if (!is_f32(x) || !is_f32(scale) || (bias && !is_f32(bias)) || x->rank < 1) return KILN_OK;
    if (cc->n_out < 1 || !is_f32(cc->out[0])) return KILN_OK;
    bool want_mean = cc->n_out > 1 && cc->out[1], want_inv = cc->n_out > 2 && cc->out[2];
    if ((want_mean && !is_f32(cc->out[1])) || (want_inv && !is_f32(cc->out[2]))) return KILN_OK;
    int64_t attr = kiln_attr_int(cc->node, "axis", -1);
    if (attr < 0) attr += x->rank;
    if (attr < 0 || attr >= x->rank) return KILN_OK;
    int axis = (int)attr;
    if (!trails_from(scale, x, axis) || (bias && !trails_from(bias, x, axis))) return KILN_OK;
    int64_t rows = dims_product(x->dims, 0, axis), n = dims_product(x->dims, axis, x->rank);
    if (n <= 0) return KILN_OK;
    struct layernorm_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling LayerNormalization");
    s->k = k;
    s->rows = rows;
    s->n = n;
    s->eps = kiln_attr_float(cc->node, "epsilon", 1e-5f);
    s->want_mean = want_mean;
    s->want_inv = want_inv;
    snprintf(s->name, sizeof s->name, "f32_layernorm_%s", s->k->isa);
    inst->state = s;
    inst->destroy = free;
    inst->run = layernorm_run;
    inst->name = s->name;
    inst->inplace = 1; /* each row's statistics are taken before the row is written */
    return KILN_OK;
}
SIMD_VARIANTS(layernorm, layernorm_compile)

/* ---- InstanceNormalization, GroupNormalization ----
 *
 * Plain [N, C, ...] storage: each (image, group) is one contiguous row of (C / G) * sp
 * floats (sp: the spatial size; InstanceNormalization is G = C), normalized by the row's
 * statistics, then each channel's run of sp floats scaled and shifted by its own scale and
 * bias (GroupNormalization before opset 21: the group's). Scale and bias are read at run
 * time (they need not be constants).
 *
 * Channel-blocked 4-D storage (the layout pass's [N][C/b][H][W][b], padding lanes zero; b a
 * multiple of the vector width): a group's channels are lanes of one or more blocks, so
 * three passes run over (image, block) units: per-lane sums, per-lane sums of squares about
 * the lane's group mean (rounded to float, as the plain rows), and the affine, each lane
 * with its own group's mean and its channel's scale and shift; padding lanes are written 0.
 * The statistics are the plain path's (float runs summed in double, the float mean's
 * rounding folded into the shift). */

struct groupnorm_state {
    const struct simd_kernels *k;
    int64_t rows, groups, cpg, sp; /* rows = N * groups; cpg channels a group */
    bool per_group;                /* scale and bias per group (GroupNormalization < 21) */
    float eps;
    int act;                       /* KilnGroupNorm's activation: -1 none, else a simd_unary */
    int blk;                       /* 0 plain, else the channel block */
    int64_t C, cb;                 /* blocked: channels, blocks an image */
    char name[48];
};

struct groupnorm_job {
    const struct groupnorm_state *s;
    const float *x, *scale, *bias;
    float *y;
    /* blocked: per (image, channel) the pass's double sums, then per (image, group) the
     * statistics; per (image, channel) the lane's mean, multiplier and shift */
    double *csum, *gsum;
    float *m, *a, *b;
    int pass;
};

static void groupnorm_range(void *arg, int64_t begin, int64_t end)
{
    const struct groupnorm_job *j = arg;
    const struct groupnorm_state *s = j->s;
    const int64_t len = s->cpg * s->sp;
    for (int64_t r = begin; r < end; r++) {
        const float *x = j->x + r * len;
        float *y = j->y + r * len;
        float mean, inv, delta;
        s->k->row_stats(x, len, s->eps, &mean, &inv, &delta);
        int64_t g = r % s->groups;
        for (int64_t c = 0; c < s->cpg; c++) { /* (x - mean) a + bias, mean exact */
            int64_t pi = s->per_group ? g : g * s->cpg + c;
            float a = inv * j->scale[pi];
            s->k->norm_affine(x + c * s->sp, y + c * s->sp, s->sp, mean, a,
                              j->bias[pi] - delta * a);
        }
        if (s->act >= 0) s->k->unary((enum simd_unary)s->act, 0, 0, y, y, len); /* cache-hot */
    }
}

/* One pass over (image, block) units of blocked data: lane sums (pass 0: about 0; pass 1:
 * squares about the lane's mean in j->m) into j->csum, or the affine (pass 2). */
static void groupnorm_blocked_range(void *arg, int64_t begin, int64_t end)
{
    const struct groupnorm_job *j = arg;
    const struct groupnorm_state *s = j->s;
    const int blk = s->blk, lanes = s->k->lanes;
    static const float zeros[64];
    for (int64_t u = begin; u < end; u++) {
        const float *x = j->x + u * s->sp * blk;
        if (j->pass == 2 && s->act >= 0) { /* the unit's affine, then its activation (cache-hot) */
            for (int l0 = 0; l0 < blk; l0 += lanes)
                s->k->lane_affine(x + l0, j->y + u * s->sp * blk + l0, s->sp, blk,
                                  j->m + u * blk + l0, j->a + u * blk + l0, j->b + u * blk + l0);
            float *yu = j->y + u * s->sp * blk;
            s->k->unary((enum simd_unary)s->act, 0, 0, yu, yu, s->sp * blk); /* pads: act(0) = 0 */
            continue;
        }
        for (int l0 = 0; l0 < blk; l0 += lanes) {
            int64_t c = u * blk + l0; /* (image, channel) index, padding lanes included */
            if (j->pass == 2)
                s->k->lane_affine(x + l0, j->y + u * s->sp * blk + l0, s->sp, blk, j->m + c,
                                  j->a + c, j->b + c);
            else
                s->k->lane_sums(x + l0, s->sp, blk, j->pass ? j->m + c : zeros, j->pass == 1,
                                j->csum + c);
        }
    }
}

/* Blocked GroupNormalization / InstanceNormalization: the statistics of each (image, group)
 * from the lanes' sums, then each lane's mean, multiplier and shift. */
static kiln_status groupnorm_blocked(const struct groupnorm_state *s, struct groupnorm_job *j,
                                     struct kiln_run_ctx *ctx)
{
    const int64_t N = s->rows / s->groups, lanes_all = N * s->cb * s->blk;
    const int64_t units = N * s->cb, len = s->cpg * s->sp;
    size_t bytes = (size_t)lanes_all * (sizeof(double) + 3 * sizeof(float)) +
                   (size_t)s->rows * 2 * sizeof(double);
    void *heap = NULL, *mem = ctx->scratch;
    if (!mem && !(mem = heap = malloc(bytes)))
        return kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY, "out of memory for GroupNorm");
    j->csum = mem;
    j->gsum = j->csum + lanes_all;
    j->m = (float *)(j->gsum + 2 * s->rows);
    j->a = j->m + lanes_all;
    j->b = j->a + lanes_all;
    int64_t grain = s->sp * s->blk >= SIMD_GRAIN_NORM ? 1 : SIMD_GRAIN_NORM / (s->sp * s->blk);
    for (int pass = 0; pass < 2; pass++) {
        memset(j->csum, 0, (size_t)lanes_all * sizeof(double));
        j->pass = pass;
        kiln_parallel_for(ctx->threads, units, grain, groupnorm_blocked_range, j);
        for (int64_t r = 0; r < s->rows; r++) {
            int64_t n = r / s->groups, c0 = (r % s->groups) * s->cpg;
            double t = 0.0;
            for (int64_t c = c0; c < c0 + s->cpg; c++) t += j->csum[n * s->cb * s->blk + c];
            j->gsum[2 * r + pass] = t;
            if (pass == 0) {
                float mf = (float)(t / (double)len);
                for (int64_t c = c0; c < c0 + s->cpg; c++) j->m[n * s->cb * s->blk + c] = mf;
            }
        }
        if (pass == 0) /* padding lanes: about 0, and written 0 */
            for (int64_t n = 0; n < N; n++)
                for (int64_t c = s->C; c < s->cb * s->blk; c++) j->m[n * s->cb * s->blk + c] = 0;
    }
    for (int64_t r = 0; r < s->rows; r++) {
        int64_t n = r / s->groups, g = r % s->groups;
        double mean = j->gsum[2 * r] / (double)len;
        float mf = (float)mean;
        double d = mean - (double)mf;
        double var = j->gsum[2 * r + 1] / (double)len - d * d;
        float inv = (float)(1.0 / sqrt((var > 0 ? var : 0) + (double)s->eps));
        float delta = (float)d;
        for (int64_t c = g * s->cpg; c < (g + 1) * s->cpg; c++) {
            int64_t pi = s->per_group ? g : c, at = n * s->cb * s->blk + c;
            float a = inv * j->scale[pi];
            j->a[at] = a;
            j->b[at] = j->bias[pi] - delta * a;
        }
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = s->C; c < s->cb * s->blk; c++) {
            j->a[n * s->cb * s->blk + c] = 0;
            j->b[n * s->cb * s->blk + c] = 0;
        }
    j->pass = 2;
    kiln_parallel_for(ctx->threads, units, grain, groupnorm_blocked_range, j);
    free(heap);
    return KILN_OK;
}

static size_t groupnorm_blocked_scratch(const struct groupnorm_state *s)
{
    size_t lanes_all = (size_t)(s->rows / s->groups * s->cb * s->blk);
    size_t b = lanes_all * (sizeof(double) + 3 * sizeof(float)) + (size_t)s->rows * 2 * sizeof(double);
    return (b + 63) / 64 * 64;
}

static kiln_status groupnorm_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct groupnorm_state *s = state;
    struct groupnorm_job j = {.s = s, .x = ctx->in[0]->data, .scale = ctx->in[1]->data,
                              .bias = ctx->in[2]->data, .y = ctx->out[0]->data};
    if (s->blk) return groupnorm_blocked(s, &j, ctx);
    int64_t len = s->cpg * s->sp, grain = len >= SIMD_GRAIN_NORM ? 1 : SIMD_GRAIN_NORM / len;
    kiln_parallel_for(ctx->threads, s->rows, grain, groupnorm_range, &j);
    return KILN_OK;
}

/* Layout pass: a 4-D data input and the output may be channel-blocked; scale and bias are
 * per-channel (or per-group) vectors read plain. */
int kiln_k_groupnorm_accepts(const struct kiln_node *n, int i, int block)
{
    (void)n;
    return (i == 0 || i == -1) && (block == 8 || block == 16);
}

bool kiln_k_groupnorm_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 3 && is_f32(cc->in[0]) && is_f32(cc->in[1]) && is_f32(cc->in[2]) &&
           cc->in[0]->rank >= 2 && cc->n_out >= 1 && is_f32(cc->out[0]);
}

static kiln_status groupnorm_compile(const struct kiln_compile_ctx *cc,
                                     struct kiln_kernel_inst *inst, const struct simd_kernels *k)
{
    const struct kiln_node *n = cc->node;
    const struct kiln_type *x = cc->in[0];
    if (!kiln_k_groupnorm_covers(cc)) return KILN_OK;
    int blk = cc->in_layout ? cc->in_layout[0] : 0;
    if ((cc->out_layout ? cc->out_layout[0] : 0) != blk) return KILN_OK;
    if (blk && (x->rank != 4 || blk % k->lanes != 0 || blk > 64)) return KILN_OK;
    int64_t C = x->dims[1], sp = dims_product(x->dims, 2, x->rank);
    int64_t groups = C;
    bool per_group = false;
    int act = -1;
    if (n->op == KILN_OP_GroupNormalization || n->op == KILN_OP_KilnGroupNorm) {
        if (!kiln_node_attr(n, "num_groups")) return KILN_OK; /* the reference reports it */
        groups = kiln_attr_int(n, "num_groups", 0);
        if (groups <= 0 || C % groups != 0) return KILN_OK;
        per_group = n->opset < 21;
    }
    if (n->op == KILN_OP_KilnGroupNorm) { /* activations that map 0 to 0 (padding lanes) */
        const char *a = kiln_attr_str(n, "activation", "");
        if (kiln_attr_check(n) != KILN_OK) {
            kiln_error_clear();
            return KILN_OK;
        }
        if (!strcmp(a, "SiLU")) act = SIMD_SILU;
        else if (!strcmp(a, "Relu")) act = SIMD_RELU;
        else if (a[0] || per_group) return KILN_OK; /* the reference runs it */
    }
    int64_t want = per_group ? groups : C;
    if (kiln_shape_count(cc->in[1]->rank, cc->in[1]->dims) != want ||
        kiln_shape_count(cc->in[2]->rank, cc->in[2]->dims) != want)
        return KILN_OK; /* the reference names the bad count */
    if (x->dims[0] <= 0 || C <= 0 || sp <= 0) return KILN_OK;
    struct groupnorm_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    s->k = k;
    s->groups = groups;
    s->rows = x->dims[0] * groups;
    s->cpg = C / groups;
    s->sp = sp;
    s->per_group = per_group;
    s->eps = kiln_attr_float(n, "epsilon", 1e-5f);
    s->act = act;
    s->blk = blk;
    s->C = C;
    s->cb = blk ? (C + blk - 1) / blk : 0;
    snprintf(s->name, sizeof s->name, "f32_%s%s%s_%s",
             n->op == KILN_OP_InstanceNormalization ? "instancenorm" : "groupnorm",
             act == SIMD_SILU ? "_silu" : act == SIMD_RELU ? "_relu" : "", blk ? "_blocked" : "",
             k->isa);
    inst->state = s;
    inst->destroy = free;
    inst->run = groupnorm_run;
    inst->name = s->name;
    inst->inplace = 1; /* each row's statistics are taken before the row is written */
    if (blk) inst->scratch_bytes = groupnorm_blocked_scratch(s);
    return KILN_OK;
}
SIMD_VARIANTS(instancenorm, groupnorm_compile)
SIMD_VARIANTS(groupnorm, groupnorm_compile)
SIMD_VARIANTS(groupnorm_act, groupnorm_compile)
