/*
 * attention.c - fused f32 ONNX Attention (opset 23 semantics, see
 * src/kernels/ref/attention.c): Q/K/V 3-D [B, S, heads * E] (q_num_heads /
 * kv_num_heads) or 4-D [B, heads, S, E], grouped-query heads, the scale
 * attribute, is_causal, and an optional additive f32 or boolean attn_mask
 * broadcasting to [B, HQ, SQ, T] (a shorter last dim pads with -inf).
 *
 * Work is split over (batch, query head, block of 64 queries). For each
 * block: S = scale * Q K^T with the SIMD table's register-tiled GEMM,
 * reading Q in place through its row stride and K^T from a per-thread copy
 * of the head's keys transposed (made once for the consecutive blocks of
 * one head), mask and causal bias added, a row softmax from the SIMD table,
 * then Y = S V with the same GEMM reading V in place and writing straight
 * into Y. Scratch per thread: 64 x T floats for S and E x T for K^T.
 *
 * Declined (the reference runs): past_key/past_value, nonpad_kv_seqlen,
 * softcap, the present_* and qk_matmul outputs, other dtypes.
 *
 * Attention and KilnAttention have a kernel per SIMD table, declared in
 * attention.def (family.h).
 */
#include <stdatomic.h>
#include <stdio.h>

#include "kernels/family.h"
#include "kernels/simd/simd.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/attention.def"
#undef KILN_KERNEL

#define ATTN_QB 64 /* query rows per work unit */

struct attn_state {
    const struct simd_kernels *k;
    bool causal;
    int64_t B, HQ, HK, SQ, T, E, EV;
    /* element strides of batch, head and sequence position, and the base offset, per tensor
     * (0 q, 1 k, 2 v, 3 y): a head's row of E (EV) values is contiguous */
    int64_t bs[4], hs[4], ss[4], base[4];
    float scale;
    int mask;                 /* 0 none, 1 f32, 2 bool */
    int64_t mstride[3], mcols;
    int64_t mperiod;          /* > 0: the mask's batch index is b % mperiod (KilnAttention) */
    int threads;              /* scratch slots */
    char name[40];
};

struct attn_job {
    const struct attn_state *s;
    const float *q, *k, *v;
    const void *mask;
    float *y;
    float *scratch;
    atomic_int next_slot;
};

/* Floats of scratch per thread: S (ATTN_QB x T) and K^T (E x T). */
static size_t attn_slot_floats(const struct attn_state *s)
{
    return ((size_t)(ATTN_QB + s->E) * (size_t)s->T + 15) / 16 * 16;
}

static void attn_range(void *arg, int64_t begin, int64_t end)
{
    struct attn_job *j = arg;
    const struct attn_state *s = j->s;
    int slot = atomic_fetch_add(&j->next_slot, 1);
    float *S = j->scratch + (size_t)slot * attn_slot_floats(s), *Kt = S + ATTN_QB * s->T;
    int64_t blocks = (s->SQ + ATTN_QB - 1) / ATTN_QB, group = s->HQ / s->HK, T = s->T;
    int64_t held = -1; /* (batch, kv head) whose keys Kt holds */
    for (int64_t u = begin; u < end; u++) {
        int64_t b = u / (s->HQ * blocks), h = (u / blocks) % s->HQ, q0 = (u % blocks) * ATTN_QB;
        int64_t m = s->SQ - q0 < ATTN_QB ? s->SQ - q0 : ATTN_QB, hk = h / group;
        const float *qp = j->q + s->base[0] + b * s->bs[0] + h * s->hs[0] + q0 * s->ss[0];
        const float *kp = j->k + s->base[1] + b * s->bs[1] + hk * s->hs[1];
        const float *vp = j->v + s->base[2] + b * s->bs[2] + hk * s->hs[2];
        float *yp = j->y + s->base[3] + b * s->bs[3] + h * s->hs[3] + q0 * s->ss[3];
        int64_t ldq = s->ss[0], ldk = s->ss[1], ldv = s->ss[2], ldy = s->ss[3];
        if (held != b * s->HK + hk) {
            s->k->transpose(T, s->E, kp, ldk, Kt, T);
            held = b * s->HK + hk;
        }
        s->k->gemm(m, T, s->E, s->scale, qp, ldq, Kt, T, S, T);
        for (int64_t r = 0; r < m; r++) {
            float *row = S + r * T;
            int64_t qi = q0 + r;
            if (s->mask) {
                int64_t mb = s->mperiod > 0 ? b % s->mperiod : b;
                int64_t mi = mb * s->mstride[0] + h * s->mstride[1] + qi * s->mstride[2];
                if (s->mask == 1) {
                    s->k->binary(SIMD_ADD, SIMD_B_VEC, row, (const float *)j->mask + mi, row,
                                 s->mcols);
                } else {
                    const uint8_t *mk = (const uint8_t *)j->mask + mi;
                    for (int64_t c = 0; c < s->mcols; c++)
                        if (!mk[c]) row[c] = -INFINITY;
                }
                for (int64_t c = s->mcols; c < T; c++) row[c] = -INFINITY;
            }
            if (s->causal)
                for (int64_t c = qi + 1; c < T; c++) row[c] = -INFINITY;
            s->k->softmax_rows(row, row, 1, T);
        }
        s->k->gemm(m, s->EV, T, 1.0f, S, T, vp, ldv, yp, ldy);
    }
}

static kiln_status attn_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct attn_state *s = state;
    int threads = ctx->threads < 1 ? 1 : ctx->threads > s->threads ? s->threads : ctx->threads;
    float *heap = NULL, *scratch = ctx->scratch;
    if (!scratch) { /* callers without a plan arena (tests, the executor) */
        heap = malloc((size_t)threads * attn_slot_floats(s) * sizeof(float));
        if (!heap) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory for Attention scratch");
        scratch = heap;
    }
    struct attn_job j = {
        .s = s,
        .q = ctx->in[0]->data,
        .k = ctx->in[1]->data,
        .v = ctx->in[2]->data,
        .mask = s->mask ? ctx->in[3]->data : NULL,
        .y = ctx->out[0]->data,
        .scratch = scratch,
    };
    atomic_init(&j.next_slot, 0);
    int64_t units = s->B * s->HQ * ((s->SQ + ATTN_QB - 1) / ATTN_QB);
    kiln_parallel_for(threads, units, 1, attn_range, &j);
    free(heap);
    return KILN_OK;
}

static bool is_f32(const struct kiln_type *t)
{
    return t && t->dtype == KILN_DTYPE_F32 && kiln_type_is_concrete(t);
}

static kiln_status attn_finish(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst,
                               const struct attn_state *from, const struct kiln_type *mask,
                               bool merged);

static kiln_status attention_compile(const struct kiln_compile_ctx *cc,
                                     struct kiln_kernel_inst *inst,
                                     const struct simd_kernels *table)
{
    const struct kiln_node *n = cc->node;
    if (cc->n_in < 3 || !is_f32(cc->in[0]) || !is_f32(cc->in[1]) || !is_f32(cc->in[2]))
        return KILN_OK;
    for (int i = 4; i < cc->n_in; i++)
        if (cc->in[i]) return KILN_OK; /* past_key, past_value, nonpad_kv_seqlen */
    if (cc->n_out < 1 || !is_f32(cc->out[0])) return KILN_OK;
    for (int i = 1; i < cc->n_out; i++)
        if (cc->out[i]) return KILN_OK;
    if (kiln_attr_float(n, "softcap", 0.0f) != 0.0f) return KILN_OK;
    const struct kiln_type *q = cc->in[0], *k = cc->in[1], *v = cc->in[2];
    const struct kiln_type *mask = cc->n_in > 3 ? cc->in[3] : NULL;
    if (q->rank != k->rank || q->rank != v->rank || (q->rank != 3 && q->rank != 4)) return KILN_OK;

    struct attn_state st = {0};
    st.B = q->dims[0];
    if (q->rank == 3) {
        st.HQ = kiln_attr_int(n, "q_num_heads", 0);
        st.HK = kiln_attr_int(n, "kv_num_heads", 0);
        if (st.HQ <= 0 || st.HK <= 0 || q->dims[2] % st.HQ || v->dims[2] % st.HK) return KILN_OK;
        st.SQ = q->dims[1];
        st.T = k->dims[1];
        st.E = q->dims[2] / st.HQ;
        st.EV = v->dims[2] / st.HK;
        if (k->dims[0] != st.B || v->dims[0] != st.B || k->dims[2] != st.HK * st.E ||
            v->dims[1] != st.T)
            return KILN_OK;
    } else {
        st.HQ = q->dims[1];
        st.SQ = q->dims[2];
        st.E = q->dims[3];
        st.HK = k->dims[1];
        st.T = k->dims[2];
        st.EV = v->dims[3];
        if (k->dims[0] != st.B || v->dims[0] != st.B || k->dims[3] != st.E ||
            v->dims[1] != st.HK || v->dims[2] != st.T)
            return KILN_OK;
    }
    if (st.HK <= 0 || st.HQ % st.HK || st.B <= 0 || st.SQ <= 0 || st.T <= 0 || st.E <= 0 ||
        st.EV <= 0)
        return KILN_OK;
    int64_t e[4] = {st.E, st.E, st.EV, st.EV}, seq[4] = {st.SQ, st.T, st.T, st.SQ};
    int64_t heads[4] = {st.HQ, st.HK, st.HK, st.HQ};
    for (int i = 0; i < 4; i++) {
        if (q->rank == 3) { /* [B, S, heads * e] */
            st.hs[i] = e[i];
            st.ss[i] = heads[i] * e[i];
            st.bs[i] = seq[i] * heads[i] * e[i];
        } else { /* [B, heads, S, e] */
            st.ss[i] = e[i];
            st.hs[i] = seq[i] * e[i];
            st.bs[i] = heads[i] * seq[i] * e[i];
        }
    }
    st.causal = kiln_attr_int(n, "is_causal", 0) != 0;
    st.scale = kiln_node_attr(n, "scale") ? kiln_attr_float(n, "scale", 1.0f)
                                          : (float)(1.0 / sqrt((double)st.E));
    st.k = table;
    return attn_finish(cc, inst, &st, mask, false);
}

/* Read the mask's broadcast (merged: its third axis from the end is batch * heads, as the
 * scores of attention computed with heads folded into the batch), then make the instance. */
static kiln_status attn_finish(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst,
                               const struct attn_state *from, const struct kiln_type *mask,
                               bool merged)
{
    struct attn_state st = *from;
    if (mask) {
        if (mask->rank < 1 || mask->rank > 4 || !kiln_type_is_concrete(mask)) return KILN_OK;
        if (mask->dtype == KILN_DTYPE_F32) st.mask = 1;
        else if (mask->dtype == KILN_DTYPE_BOOL) st.mask = 2;
        else return KILN_OK;
        int64_t want[4] = {st.mperiod > 0 ? st.mperiod : st.B, st.HQ, st.SQ, st.T}, stride = 1;
        if (merged && mask->rank > 3) return KILN_OK;
        for (int i = mask->rank - 1; i >= 0; i--) {
            int ax = (merged ? 4 : 4) - mask->rank + i; /* merged: axis 1 is batch * heads */
            int64_t md = mask->dims[i];
            if (ax == 3) {
                if (md > st.T) return KILN_OK;
                st.mcols = md;
            } else if (merged && ax == 1 && md == st.B * st.HQ && md != 1) {
                st.mstride[0] = stride * st.HQ;
                st.mstride[1] = stride;
            } else if (merged && ax < 2) {
                if (md != 1) return KILN_OK;
            } else if (md == want[ax]) {
                st.mstride[ax] = stride;
            } else if (md != 1) {
                return KILN_OK;
            }
            stride *= md;
        }
    }
    struct attn_state *s = malloc(sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling Attention");
    *s = st;
    s->threads = cc->threads < 1 ? 1 : cc->threads;
    snprintf(s->name, sizeof s->name, "f32_attention_%s", s->k->isa);
    inst->state = s;
    inst->destroy = free;
    inst->run = attn_run;
    inst->name = s->name;
    inst->scratch_bytes = (size_t)s->threads * attn_slot_floats(s) * sizeof(float);
    return KILN_OK;
}
SIMD_VARIANTS(attention, attention_compile)

/* KilnAttention (opt/attention_views.c): Q, K and V read in place from their projections,
 * [B, S, N] or [S, B, N] (seq_first) at a column offset each; Y [B, S, H * EV], [S, B, ...]
 * (y_seq_first) or those two axes merged (y_merge_rows). */
static kiln_status kilnattention_compile(const struct kiln_compile_ctx *cc,
                                         struct kiln_kernel_inst *inst,
                                         const struct simd_kernels *k)
{
    const struct kiln_node *n = cc->node;
    if (cc->n_in < 3 || !is_f32(cc->in[0]) || !is_f32(cc->in[1]) || !is_f32(cc->in[2]) ||
        cc->n_out < 1 || !is_f32(cc->out[0]))
        return KILN_OK;
    const struct kiln_type *t[3] = {cc->in[0], cc->in[1], cc->in[2]};
    for (int i = 0; i < 3; i++)
        if (t[i]->rank != 3) return KILN_OK;
    bool sf = kiln_attr_int(n, "seq_first", 0) != 0, ysf = kiln_attr_int(n, "y_seq_first", 0) != 0;
    struct attn_state st = {0};
    st.HQ = kiln_attr_int(n, "num_heads", 0);
    st.HK = kiln_attr_int(n, "kv_heads", st.HQ); /* grouped-query: kv head h / (HQ / HK) */
    st.E = kiln_attr_int(n, "head_size", 0);
    st.EV = kiln_attr_int(n, "v_head_size", 0);
    st.B = t[0]->dims[sf ? 1 : 0];
    st.SQ = t[0]->dims[sf ? 0 : 1];
    st.T = t[1]->dims[sf ? 0 : 1];
    const char *off_name[3] = {"q_offset", "k_offset", "v_offset"};
    int64_t width[3] = {st.HQ * st.E, st.HK * st.E, st.HK * st.EV}, seq[3] = {st.SQ, st.T, st.T};
    if (st.HQ <= 0 || st.HK <= 0 || st.HQ % st.HK || st.E <= 0 || st.EV <= 0 || st.B <= 0 ||
        st.SQ <= 0 || st.T <= 0)
        return KILN_OK;
    for (int i = 0; i < 3; i++) {
        int64_t N = t[i]->dims[2], off = kiln_attr_int(n, off_name[i], 0);
        if (t[i]->dims[sf ? 1 : 0] != st.B || t[i]->dims[sf ? 0 : 1] != seq[i] || off < 0 ||
            off + width[i] > N)
            return KILN_OK;
        st.base[i] = off;
        st.hs[i] = i == 2 ? st.EV : st.E;
        st.ss[i] = sf ? st.B * N : N;
        st.bs[i] = sf ? N : seq[i] * N;
    }
    int64_t ny = st.HQ * st.EV;
    int64_t out_n = 1;
    for (int i = 0; i < cc->out[0]->rank; i++) out_n *= cc->out[0]->dims[i];
    if (out_n != st.B * st.SQ * ny) return KILN_OK;
    st.hs[3] = st.EV;
    st.ss[3] = ysf ? st.B * ny : ny;
    st.bs[3] = ysf ? ny : st.SQ * ny;
    st.scale = kiln_attr_float(n, "scale", 1.0f);
    const struct kiln_type *mask = cc->n_in > 3 ? cc->in[3] : NULL;
    if (mask && (mask->rank < 1 || mask->dims[mask->rank - 1] != st.T))
        return KILN_OK; /* KilnAttention's mask spans the keys (no -inf padding) */
    st.mperiod = kiln_attr_int(n, "mask_period", 0); /* Swin's windows: mask batch b % P */
    if (st.mperiod < 0 || (st.mperiod > 0 && (st.B % st.mperiod ||
                                               kiln_attr_int(n, "mask_merged", 0) != 0)))
        return KILN_OK;
    st.k = k;
    return attn_finish(cc, inst, &st, mask,
                       kiln_attr_int(n, "mask_merged", 0) != 0);
}
SIMD_VARIANTS(kilnattention, kilnattention_compile)
