/*
 * elementwise.c - fast f32 kernels for unary activations and math (Relu,
 * LeakyRelu, Clip, Sigmoid, Tanh, Exp, Erf, Gelu, HardSwish, HardSigmoid,
 * Softplus, Swish, Sqrt, Neg; Pow by a constant 2, 3, 0.5, -1 or -0.5) and the binary ops Add,
 * Sub, Mul, Div.
 *
 * Each op has three kernels, one per SIMD table (simd.h), declared in the
 * family list elementwise.def (family.h): kiln_k_<op>_avx512 / _avx2 /
 * _scalar. compile checks the node's concrete types and attributes for its
 * table and returns run NULL for what it
 * does not cover (other dtypes; broadcasts other than same shape, a scalar,
 * one input repeating as a trailing row like [B,S,H] + [H], or one value per
 * channel), so the general broadcast kernels (broadcast.c) run those. Large tensors are split across the run's
 * threads in contiguous element ranges.
 *
 * Channel-blocked values (the layout pass, src/opt/layout.c): a unary op,
 * and a binary op of two same-shape inputs, run on the stored elements of
 * nChw8c / nChw16c data as on plain data when every input and the output
 * share the layout; the padded channels are written as zeros again
 * afterwards (f(0) need not be 0). The channel broadcast reads its big
 * input and writes its output blocked.
 */
#include <float.h>
#include <stdio.h>

#include "kernels/family.h"
#include "kernels/simd/simd.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/elementwise.def"
#undef KILN_KERNEL

const struct simd_kernels *simd_kernels_for(void)
{
    switch (kiln_cpu_isa()) {
    case KILN_ISA_AVX512: return &kiln_simd_avx512;
    case KILN_ISA_AVX2: return &kiln_simd_avx2;
    default: return &kiln_simd_scalar;
    }
}

/* Broadcast shapes of a binary node. */
enum bcast_kind {
    BC_SAME,       /* both inputs have the output's elements */
    BC_B_ROW,      /* a full, b repeats every `row` elements (row 1 = scalar) */
    BC_A_ROW,      /* b full, a repeats */
    BC_B_CHAN,     /* a is [N,C,H,W], b is [N or 1,C,1,1] or [C,1,1]: one value per channel */
    BC_A_CHAN,     /* the same with a and b swapped */
};

struct ew_state {
    const struct simd_kernels *k;
    bool binary;
    enum simd_unary uop;
    enum simd_binary bop;
    enum bcast_kind bc;
    float alpha, beta;
    bool clip_inputs;  /* Clip opset 11+: bounds from inputs 1 and 2 at run time */
    int64_t n;         /* output elements */
    int64_t row;       /* repeat length of the broadcast input */
    int64_t grain;
    /* channel broadcasts: the big input's dims, whether the small one has a batch
     * dim, and the channel block of the big input and the output (0 = plain) */
    int64_t cn, cc, chw;
    bool small_batched;
    int block;
    bool zero_pad;     /* blocked with C % block != 0: zero the padded channels after */
    char name[40];
};

struct ew_job {
    const struct ew_state *s;
    const float *a, *b;
    float *y;
    float alpha, beta;
};

static void unary_range(void *arg, int64_t begin, int64_t end)
{
    const struct ew_job *j = arg;
    j->s->k->unary(j->s->uop, j->alpha, j->beta, j->a + begin, j->y + begin, end - begin);
}

/* Channel broadcast over units of (n, channel) in plain layouts, (n, channel
 * block) in blocked ones. */
static void chan_range(void *arg, int64_t begin, int64_t end)
{
    const struct ew_job *j = arg;
    const struct ew_state *s = j->s;
    const struct simd_kernels *k = s->k;
    bool b_small = s->bc == BC_B_CHAN;
    const float *big = b_small ? j->a : j->b, *small = b_small ? j->b : j->a;
    if (!s->block) {
        for (int64_t u = begin; u < end; u++) {
            int64_t n = u / s->cc, c = u % s->cc;
            const float *x = big + u * s->chw;
            const float *v = small + (s->small_batched ? n * s->cc : 0) + c;
            if (b_small) k->binary(s->bop, SIMD_B_SCALAR_B, x, v, j->y + u * s->chw, s->chw);
            else k->binary(s->bop, SIMD_B_SCALAR_A, v, x, j->y + u * s->chw, s->chw);
        }
        return;
    }
    /* blocked: [N][ceil(C/b)][H][W][b]; a row of the small values, tiled, then one
     * vector op per row of at most SIMD_CHAN_TILE elements */
    enum { SIMD_CHAN_TILE = 2048 };
    float tile[SIMD_CHAN_TILE];
    int64_t b = s->block, nb = (s->cc + b - 1) / b, plane = s->chw * b;
    int64_t per = SIMD_CHAN_TILE / b * b;
    if (per > plane) per = plane; /* a multiple of b as well */
    for (int64_t u = begin; u < end; u++) {
        int64_t n = u / nb, cb = u % nb;
        const float *v = small + (s->small_batched ? n * s->cc : 0) + cb * b;
        int64_t valid = s->cc - cb * b < b ? s->cc - cb * b : b;
        for (int64_t c = 0; c < b; c++) /* padded channels stay 0 in x; keep them 0 */
            tile[c] = c < valid ? v[c] : 0.0f;
        for (int64_t have = b; have < per;) { /* repeat the block, doubling */
            int64_t len = have < per - have ? have : per - have;
            memcpy(tile + have, tile, (size_t)len * sizeof *tile);
            have += len;
        }
        const float *x = big + u * plane;
        float *y = j->y + u * plane;
        for (int64_t off = 0; off < plane; off += per) {
            int64_t len = plane - off < per ? plane - off : per;
            if (b_small) k->binary(s->bop, SIMD_B_VEC, x + off, tile, y + off, len);
            else k->binary(s->bop, SIMD_B_VEC, tile, x + off, y + off, len);
        }
        for (int64_t p = 0; valid < b && p < s->chw; p++) /* padding stays 0 (not 0/0) */
            for (int64_t c = valid; c < b; c++) y[p * b + c] = 0.0f;
    }
}

static void binary_range(void *arg, int64_t begin, int64_t end)
{
    const struct ew_job *j = arg;
    const struct ew_state *s = j->s;
    const struct simd_kernels *k = s->k;
    if (s->bc == BC_B_CHAN || s->bc == BC_A_CHAN) {
        chan_range(arg, begin, end);
        return;
    }
    if (s->bc == BC_SAME) {
        k->binary(s->bop, SIMD_B_VEC, j->a + begin, j->b + begin, j->y + begin, end - begin);
        return;
    }
    if (s->row == 1) {
        if (s->bc == BC_B_ROW)
            k->binary(s->bop, SIMD_B_SCALAR_B, j->a + begin, j->b, j->y + begin, end - begin);
        else
            k->binary(s->bop, SIMD_B_SCALAR_A, j->a, j->b + begin, j->y + begin, end - begin);
        return;
    }
    for (int64_t i = begin; i < end;) {
        int64_t off = i % s->row, len = s->row - off;
        if (len > end - i) len = end - i;
        const float *a = s->bc == BC_B_ROW ? j->a + i : j->a + off;
        const float *b = s->bc == BC_B_ROW ? j->b + off : j->b + i;
        k->binary(s->bop, SIMD_B_VEC, a, b, j->y + i, len);
        i += len;
    }
}

/* Read a Clip bound input (a one-element f32 tensor) or keep dflt. */
static float clip_bound(const struct kiln_run_ctx *ctx, int i, float dflt)
{
    const kiln_tensor *t = i < ctx->n_in ? ctx->in[i] : NULL;
    return t ? ((const float *)t->data)[0] : dflt;
}

static kiln_status ew_run_elems(void *state, struct kiln_run_ctx *ctx)
{
    const struct ew_state *s = state;
    struct ew_job j = {s, ctx->in[0]->data, NULL, ctx->out[0]->data, s->alpha, s->beta};
    if (s->binary) {
        j.b = ctx->in[1]->data;
        if (s->bc == BC_B_CHAN || s->bc == BC_A_CHAN) {
            int64_t b = s->block ? s->block : 1;
            int64_t units = s->cn * ((s->cc + b - 1) / b), per = s->chw * b;
            int64_t grain = per >= SIMD_GRAIN_CHEAP ? 1 : SIMD_GRAIN_CHEAP / per;
            kiln_parallel_for(ctx->threads, units, grain, binary_range, &j);
            return KILN_OK;
        }
        kiln_parallel_for(ctx->threads, s->n, s->grain, binary_range, &j);
        return KILN_OK;
    }
    if (s->clip_inputs) {
        j.alpha = clip_bound(ctx, 1, -INFINITY);
        j.beta = clip_bound(ctx, 2, INFINITY);
    }
    kiln_parallel_for(ctx->threads, s->n, s->grain, unary_range, &j);
    return KILN_OK;
}

/* Zero the padded channels of a blocked output (the last block of each image). */
static void zero_padding(const struct ew_state *s, float *y)
{
    int64_t b = s->block, nb = (s->cc + b - 1) / b, valid = s->cc - (nb - 1) * b;
    for (int64_t n = 0; n < s->cn; n++) {
        float *p = y + ((n * nb) + nb - 1) * s->chw * b;
        for (int64_t q = 0; q < s->chw; q++)
            for (int64_t c = valid; c < b; c++) p[q * b + c] = 0.0f;
    }
}

static kiln_status ew_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct ew_state *s = state;
    kiln_status st = ew_run_elems(state, ctx);
    if (st == KILN_OK && s->zero_pad) zero_padding(s, ctx->out[0]->data);
    return st;
}

static bool is_f32(const struct kiln_type *t)
{
    return t && t->dtype == KILN_DTYPE_F32 && kiln_type_is_concrete(t);
}

static int64_t type_count(const struct kiln_type *t)
{
    return kiln_shape_count(t->rank, t->dims);
}

/* Set up inst with a fresh ew_state for the given node; *out NULL = declined. */
static kiln_status ew_begin(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst,
                            const struct simd_kernels *k, int n_inputs, const char *opname,
                            struct ew_state **out)
{
    *out = NULL;
    if (cc->n_out < 1 || !is_f32(cc->out[0]) || cc->n_in < n_inputs) return KILN_OK;
    for (int i = 0; i < n_inputs; i++)
        if (!is_f32(cc->in[i])) return KILN_OK;
    struct ew_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling %s", opname);
    s->k = k;
    s->n = type_count(cc->out[0]);
    s->grain = SIMD_GRAIN_MATH;
    snprintf(s->name, sizeof s->name, "f32_%s_%s", opname, s->k->isa);
    inst->state = s;
    inst->destroy = free;
    inst->run = ew_run;
    inst->name = s->name;
    inst->inplace = 1;
    *out = s;
    return KILN_OK;
}

/* For inputs and the output all stored blocked by l (4-D, same dims): run on the stored
 * elements, and zero the padding afterwards where C is not a whole number of blocks. */
static void ew_set_blocked(struct ew_state *s, const struct kiln_type *o, int l)
{
    s->cn = o->dims[0];
    s->cc = o->dims[1];
    s->chw = o->dims[2] * o->dims[3];
    s->block = l;
    s->n = s->cn * kiln_layout_channels(s->cc, l) * s->chw;
    s->zero_pad = s->cc % l != 0;
    char name[40];
    snprintf(name, sizeof name, "%s", s->name);
    snprintf(s->name, sizeof s->name, "%.24s_blocked%d", name, l);
}

/* Whether a and b have the same 4-D dims. */
static bool same_4d(const struct kiln_type *a, const struct kiln_type *b)
{
    return a->rank == 4 && b->rank == 4 && !memcmp(a->dims, b->dims, sizeof(int64_t) * 4);
}

/* Compile a unary op; cheap ops get the larger parallel grain. */
static kiln_status unary_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst,
                                 const struct simd_kernels *k, enum simd_unary op,
                                 const char *opname, float alpha, float beta)
{
    if (cc->n_in < 1 || !is_f32(cc->in[0]) || cc->n_out < 1 || !is_f32(cc->out[0]) ||
        type_count(cc->in[0]) != type_count(cc->out[0]))
        return KILN_OK;
    int li = cc->in_layout ? cc->in_layout[0] : 0, lo = cc->out_layout ? cc->out_layout[0] : 0;
    if (li != lo || (lo && !same_4d(cc->in[0], cc->out[0]))) return KILN_OK;
    struct ew_state *s;
    kiln_status st = ew_begin(cc, inst, k, 1, opname, &s);
    if (st != KILN_OK || !s) return st;
    if (lo) ew_set_blocked(s, cc->out[0], lo);
    s->uop = op;
    s->alpha = alpha;
    s->beta = beta;
    if (op == SIMD_RELU || op == SIMD_LEAKY_RELU || op == SIMD_CLIP || op == SIMD_NEG ||
        op == SIMD_SQRT || op == SIMD_HARD_SIGMOID || op == SIMD_HARD_SWISH)
        s->grain = SIMD_GRAIN_CHEAP;
    return KILN_OK;
}


#define UNARY_FAST(stem, op)                                                                \
    static kiln_status stem##_compile(const struct kiln_compile_ctx *cc,                    \
                                      struct kiln_kernel_inst *inst,                        \
                                      const struct simd_kernels *k)                         \
    {                                                                                       \
        return unary_compile(cc, inst, k, op, #stem, 0.0f, 0.0f);                           \
    }                                                                                       \
    SIMD_VARIANTS(stem, stem##_compile)

/* What every unary kernel needs: input 0 and output 0 f32 and concrete. */
bool kiln_k_unary_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 1 && is_f32(cc->in[0]) && cc->n_out >= 1 && is_f32(cc->out[0]);
}

/* The layout pass asks whether a unary node may read and write blocked data. */
int kiln_k_unary_accepts(const struct kiln_node *n, int i, int block)
{
    (void)n;
    return i <= 0 && (block == 8 || block == 16);
}

UNARY_FAST(relu, SIMD_RELU)
UNARY_FAST(sigmoid, SIMD_SIGMOID)
UNARY_FAST(tanh, SIMD_TANH)
UNARY_FAST(exp, SIMD_EXP)
UNARY_FAST(erf, SIMD_ERF)
UNARY_FAST(hardswish, SIMD_HARD_SWISH)
UNARY_FAST(softplus, SIMD_SOFTPLUS)
UNARY_FAST(sqrt, SIMD_SQRT)
UNARY_FAST(neg, SIMD_NEG)

/* Pow with a constant scalar exponent the table computes as products, a quotient or a
 * square root: 2, 3, 0.5, -1, -0.5 (x * x for the variance of a decomposed LayerNorm or
 * RMSNorm, which ran on the reference's pow() in double: 14% of an MLP-Mixer's time).
 * Others stay with the reference. */
bool kiln_k_pow_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 2 && cc->in_value && cc->in_value[1] &&
           kiln_tensor_count(cc->in_value[1]) == 1 && kiln_k_unary_covers(cc);
}

static kiln_status pow_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst,
                               const struct simd_kernels *k)
{
    if (!kiln_k_pow_covers(cc)) return KILN_OK;
    const kiln_tensor *e = cc->in_value[1];
    double v;
    switch (e->dtype) {
    case KILN_DTYPE_F32: v = ((const float *)e->data)[0]; break;
    case KILN_DTYPE_F64: v = ((const double *)e->data)[0]; break;
    case KILN_DTYPE_I32: v = ((const int32_t *)e->data)[0]; break;
    case KILN_DTYPE_I64: v = (double)((const int64_t *)e->data)[0]; break;
    default: return KILN_OK;
    }
    enum simd_unary op;
    const char *name;
    if (v == 2.0) op = SIMD_SQUARE, name = "pow2";
    else if (v == 3.0) op = SIMD_CUBE, name = "pow3";
    else if (v == 0.5) op = SIMD_POW_HALF, name = "pow_half";
    else if (v == -1.0) op = SIMD_RECIP, name = "pow_m1";
    else if (v == -0.5) op = SIMD_RSQRT, name = "pow_m_half";
    else return KILN_OK;
    kiln_status st = unary_compile(cc, inst, k, op, name, 0.0f, 0.0f);
    if (st == KILN_OK && inst->run && op != SIMD_RSQRT && op != SIMD_RECIP) {
        struct ew_state *s = inst->state;
        s->grain = SIMD_GRAIN_CHEAP;
    }
    return st;
}
SIMD_VARIANTS(pow, pow_compile)

static kiln_status leakyrelu_compile(const struct kiln_compile_ctx *cc,
                                     struct kiln_kernel_inst *inst, const struct simd_kernels *k)
{
    return unary_compile(cc, inst, k, SIMD_LEAKY_RELU, "leakyrelu",
                         kiln_attr_float(cc->node, "alpha", 0.01f), 0.0f);
}
SIMD_VARIANTS(leakyrelu, leakyrelu_compile)

static kiln_status hardsigmoid_compile(const struct kiln_compile_ctx *cc,
                                       struct kiln_kernel_inst *inst, const struct simd_kernels *k)
{
    return unary_compile(cc, inst, k, SIMD_HARD_SIGMOID, "hardsigmoid",
                         kiln_attr_float(cc->node, "alpha", 0.2f),
                         kiln_attr_float(cc->node, "beta", 0.5f));
}
SIMD_VARIANTS(hardsigmoid, hardsigmoid_compile)

static kiln_status gelu_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst,
                                const struct simd_kernels *k)
{
    const char *approx = kiln_attr_str(cc->node, "approximate", "none");
    if (strcmp(approx, "none") == 0) return unary_compile(cc, inst, k, SIMD_GELU, "gelu", 0, 0);
    if (strcmp(approx, "tanh") == 0)
        return unary_compile(cc, inst, k, SIMD_GELU_TANH, "gelu_tanh", 0, 0);
    return KILN_OK; /* the reference reports the bad attribute */
}
SIMD_VARIANTS(gelu, gelu_compile)

/* Swish (opset 24): x * sigmoid(alpha x); alpha 1 is SiLU, which silu_fusion
 * (src/opt/silu.c) makes of x * Sigmoid(x) */
static kiln_status swish_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst,
                                 const struct simd_kernels *k)
{
    float alpha = kiln_attr_float(cc->node, "alpha", 1.0f);
    if (alpha == 1.0f) return unary_compile(cc, inst, k, SIMD_SILU, "silu", 0, 0);
    return unary_compile(cc, inst, k, SIMD_SWISH, "swish", alpha, 0);
}
SIMD_VARIANTS(swish, swish_compile)

/* Clip: attributes min/max before opset 11, optional one-element inputs from 11. */
static kiln_status clip_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst,
                                const struct simd_kernels *k)
{
    if (cc->node->opset < 11)
        return unary_compile(cc, inst, k, SIMD_CLIP, "clip",
                             kiln_attr_float(cc->node, "min", -FLT_MAX),
                             kiln_attr_float(cc->node, "max", FLT_MAX));
    for (int i = 1; i < cc->n_in && i < 3; i++)
        if (cc->in[i] && (!is_f32(cc->in[i]) || type_count(cc->in[i]) != 1)) return KILN_OK;
    kiln_status st = unary_compile(cc, inst, k, SIMD_CLIP, "clip", -INFINITY, INFINITY);
    if (st == KILN_OK && inst->run) ((struct ew_state *)inst->state)->clip_inputs = true;
    return st;
}
SIMD_VARIANTS(clip, clip_compile)

/* Whether `small` is [N or 1, C, 1, 1] or [C, 1, 1] (a layer scale) against a
 * 4-D out [N, C, H, W]. */
static bool chan_small(const struct kiln_type *small, const struct kiln_type *out)
{
    if (out->rank != 4 || out->dims[2] * out->dims[3] <= 1 || out->dims[1] <= 0 ||
        out->dims[0] <= 0)
        return false;
    if (small->rank == 3)
        return small->dims[0] == out->dims[1] && small->dims[1] == 1 && small->dims[2] == 1;
    return small->rank == 4 && small->dims[1] == out->dims[1] && small->dims[2] == 1 &&
           small->dims[3] == 1 && (small->dims[0] == 1 || small->dims[0] == out->dims[0]);
}

/* Whether `small` broadcasts against `out` as a repeated trailing row: its
 * dims, leading 1s dropped, are out's last dims. *row = its element count. */
static bool trailing_row(const struct kiln_type *small, const struct kiln_type *out, int64_t *row)
{
    int lead = 0;
    while (lead < small->rank && small->dims[lead] == 1) lead++;
    int k = small->rank - lead;
    if (k > out->rank) return false;
    int64_t n = 1;
    for (int i = 0; i < k; i++) {
        if (small->dims[lead + i] != out->dims[out->rank - k + i]) return false;
        n *= small->dims[lead + i];
    }
    *row = n;
    return n > 0;
}

static kiln_status binary_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst,
                                  const struct simd_kernels *k, enum simd_binary op,
                                  const char *opname)
{
    if (cc->node->opset < 7 && kiln_node_attr(cc->node, "broadcast")) return KILN_OK;
    if (cc->n_in < 2 || !is_f32(cc->in[0]) || !is_f32(cc->in[1]) || cc->n_out < 1 ||
        !is_f32(cc->out[0]))
        return KILN_OK;
    const struct kiln_type *a = cc->in[0], *b = cc->in[1], *o = cc->out[0];
    int64_t n = type_count(o), na = type_count(a), nb = type_count(b), row = 0;
    int la = cc->in_layout ? cc->in_layout[0] : 0, lb = cc->in_layout ? cc->in_layout[1] : 0;
    int lo = cc->out_layout ? cc->out_layout[0] : 0;
    enum bcast_kind bc;
    if (na == n && chan_small(b, o) && la == lo && !lb) bc = BC_B_CHAN;
    else if (nb == n && chan_small(a, o) && lb == lo && !la) bc = BC_A_CHAN;
    else if (la && la == lb && la == lo && same_4d(a, o) && same_4d(b, o)) bc = BC_SAME;
    else if (la || lb || lo) return KILN_OK; /* blocked data: the cases above only */
    else if (na == n && nb == n) bc = BC_SAME;
    else if (na == n && trailing_row(b, o, &row)) bc = BC_B_ROW;
    else if (nb == n && trailing_row(a, o, &row)) bc = BC_A_ROW;
    else return KILN_OK;
    /* channels last (src/opt/layout_nhwc.c) is one block of all C channels: chan_range's
     * tile holds at most 2048 */
    if (lo == KILN_LAYOUT_NHWC && (bc == BC_B_CHAN || bc == BC_A_CHAN) &&
        (o->rank != 4 || o->dims[1] < 1 || o->dims[1] > 2048))
        return KILN_OK;
    struct ew_state *s;
    kiln_status st = ew_begin(cc, inst, k, 2, opname, &s);
    if (st != KILN_OK || !s) return st;
    s->binary = true;
    s->bop = op;
    s->bc = bc;
    s->row = row;
    s->grain = SIMD_GRAIN_CHEAP;
    inst->inplace = na == n; /* y[i] reads a[i] only */
    if (bc == BC_SAME && lo) ew_set_blocked(s, o, lo);
    if (bc == BC_B_CHAN || bc == BC_A_CHAN) {
        const struct kiln_type *small = bc == BC_B_CHAN ? b : a;
        s->cn = o->dims[0];
        s->cc = o->dims[1];
        s->chw = o->dims[2] * o->dims[3];
        s->small_batched = small->rank == 4 && small->dims[0] != 1;
        s->block = lo;
        if (lo == KILN_LAYOUT_NHWC) s->block = (int)o->dims[1]; /* one block of all C */
        inst->inplace = bc == BC_B_CHAN;
        if (lo) snprintf(s->name, sizeof s->name, "f32_%s_chan%d_%s", opname, lo, s->k->isa);
    }
    return KILN_OK;
}

/* The layout pass asks whether a channel-broadcast node may read (the big
 * input) and write blocked data, or a same-shape one both inputs; it has
 * checked the shapes (src/opt/layout.c). */
int kiln_k_binary_accepts(const struct kiln_node *n, int i, int block)
{
    (void)n, (void)i;
    return block == 8 || block == 16;
}

/* What every binary kernel needs: two f32 inputs and an f32 output, concrete. */
bool kiln_k_binary_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 2 && is_f32(cc->in[0]) && is_f32(cc->in[1]) && cc->n_out >= 1 &&
           is_f32(cc->out[0]);
}

#define BINARY_FAST(stem, op)                                                               \
    static kiln_status stem##_compile(const struct kiln_compile_ctx *cc,                    \
                                      struct kiln_kernel_inst *inst,                        \
                                      const struct simd_kernels *k)                         \
    {                                                                                       \
        return binary_compile(cc, inst, k, op, #stem);                                      \
    }                                                                                       \
    SIMD_VARIANTS(stem, stem##_compile)

BINARY_FAST(add, SIMD_ADD)
BINARY_FAST(sub, SIMD_SUB)
BINARY_FAST(mul, SIMD_MUL)
BINARY_FAST(div, SIMD_DIV)
