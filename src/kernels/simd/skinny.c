/*
 * skinny.c - the product of a few rows by a large constant matrix, Y =
 * act(alpha * A B + bias + Sum), for MatMul, Gemm and KilnFusedMatMul with
 * m <= KILN_SKINNY_MATMUL_MAX_M rows of A (all its leading dims together).
 *
 * Such a product streams B: every weight is used m times, so it is bound by
 * B's bytes. oneDNN's matmul on plain B (its GEMM path, which is what it
 * takes for these shapes) reached 13-17 GB/s on a 9.4 MB B at m = 4, where
 * the machine streams 27 GB/s from memory with 2 threads (convnext_tiny's
 * last stage at batch 1, AVX2). Here B is packed once, through the weight
 * cache, in panels of the table's skinny_cols columns ([panel][k][cols],
 * skinny_body.h), so that each thread reads its panels as one contiguous
 * stream; the run splits the panels across threads, and each chunk then adds
 * the bias and Sum and applies the activation to its columns while they are
 * in cache (the table's binary and unary ops, as the reference computes
 * them).
 *
 * Results differ from oneDNN's in the order of the sums only: every output
 * is one chain over k, its four quarters interleaved (the panel is read as
 * four streams, skinny_body.h). KILN_SKINNY=0 turns the kernel off.
 */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernel.h"
#include "kernels/simd/pointwise.h"
#include "kernels/simd/simd.h"
#include "kernels/simd/skinny.h"

struct sk_state {
    struct kiln_skinny sk;
    int has_bias, has_sum;
    char name[40];
};

struct sk_job {
    const struct kiln_skinny *s;
    const float *a, *bias, *sum;
    int64_t lda, lds, ldy;
    float *y;
};

static void sk_range(void *arg, int64_t p0, int64_t p1)
{
    const struct sk_job *j = arg;
    const struct kiln_skinny *s = j->s;
    s->k->skinny_gemm(s->m, s->kk, s->n, s->alpha, j->a, j->lda, s->bp, p0, p1, j->y, j->ldy);
    if (!j->bias && !j->sum && !s->has_act) return;
    int64_t c0 = p0 * s->cols, c1 = p1 * s->cols < s->n ? p1 * s->cols : s->n;
    for (int64_t i = 0; i < s->m; i++) {
        float *y = j->y + i * j->ldy + c0;
        if (j->bias) s->k->binary(SIMD_ADD, SIMD_B_VEC, y, j->bias + c0, y, c1 - c0);
        if (j->sum) s->k->binary(SIMD_ADD, SIMD_B_VEC, y, j->sum + i * j->lds + c0, y, c1 - c0);
        if (s->has_act) s->k->unary(s->act, s->act_alpha, s->act_beta, y, y, c1 - c0);
    }
}

void kiln_skinny_run(const struct kiln_skinny *s, const float *a, int64_t lda, const float *bias,
                     const float *sum, int64_t lds, float *y, int64_t ldy, int threads)
{
    struct sk_job j = {s, a, bias, sum, lda, lds, ldy, y};
    kiln_parallel_for(threads, s->panels, s->grain, sk_range, &j);
}

static kiln_status sk_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct sk_state *s = state;
    kiln_skinny_run(&s->sk, ctx->in[0]->data, s->sk.kk, s->has_bias ? ctx->in[2]->data : NULL,
                    s->has_sum ? ctx->in[3]->data : NULL, s->sk.n, ctx->out[0]->data, s->sk.n,
                    ctx->threads);
    return KILN_OK;
}

struct sk_pack_arg {
    const kiln_tensor *w;
    int64_t k, n, cols, panels;
    int tb;
};

static void sk_pack_free(void *p) { free(p); }

/* B [k][n] (or [n][k] with transB) -> [panel][k][cols], zeros past n */
static kiln_status sk_pack(void *arg, void **packed, size_t *bytes, void (**free_fn)(void *))
{
    const struct sk_pack_arg *a = arg;
    size_t count = (size_t)(a->panels * a->k * a->cols);
    float *out = aligned_alloc(64, (count * sizeof(float) + 63) / 64 * 64);
    if (!out) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory packing a matrix product's weights");
    const float *w = a->w->data;
    for (int64_t pn = 0; pn < a->panels; pn++)
        for (int64_t p = 0; p < a->k; p++) {
            float *o = out + (pn * a->k + p) * a->cols;
            for (int64_t c = 0; c < a->cols; c++) {
                int64_t j = pn * a->cols + c;
                o[c] = j >= a->n ? 0.0f : a->tb ? w[j * a->k + p] : w[p * a->n + j];
            }
        }
    *packed = out;
    *bytes = count * sizeof(float);
    *free_fn = sk_pack_free;
    return KILN_OK;
}

bool kiln_skinny_enabled(void)
{
    const char *env = getenv("KILN_SKINNY");
    return !(env && !strcmp(env, "0"));
}

kiln_status kiln_skinny_init(struct kiln_skinny *s, struct kiln_weight_cache *cache,
                             const kiln_tensor *w, int64_t m, int64_t k, int64_t n, int tb,
                             float alpha)
{
    memset(s, 0, sizeof *s);
    s->k = simd_kernels_for();
    s->m = m;
    s->kk = k;
    s->n = n;
    s->alpha = alpha;
    s->cols = s->k->skinny_cols;
    s->panels = (n + s->cols - 1) / s->cols;
    /* chunks of at least ~64k multiply-adds (a few us), so that small products stay on
     * one thread */
    int64_t per_panel = m * k * s->cols;
    s->grain = (65536 + per_panel - 1) / per_panel;
    struct sk_pack_arg pa = {w, k, n, s->cols, s->panels, tb};
    char tag[48];
    snprintf(tag, sizeof tag, "simd_skinny:%d:%lld", tb, (long long)s->cols);
    void *p = NULL;
    kiln_status rc = kiln_weight_cache_get(cache, w, tag, sk_pack, &pa, &p);
    s->bp = p;
    return rc;
}

kiln_status kiln_simd_skinny_compile(const struct kiln_compile_ctx *cc,
                                     struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    if (!kiln_skinny_enabled()) return KILN_OK;
    if (cc->precision != 0 || cc->n_in < 2 || cc->n_out < 1 || !cc->in_value ||
        !cc->in_value[1] || !cc->weights)
        return KILN_OK;
    const struct kiln_type *a = cc->in[0], *b = cc->in[1], *y = cc->out[0];
    if (!a || !b || !y || a->dtype != KILN_DTYPE_F32 || b->dtype != KILN_DTYPE_F32 ||
        y->dtype != KILN_DTYPE_F32 || cc->in_value[1]->dtype != KILN_DTYPE_F32 || a->rank < 2 ||
        b->rank != 2 || y->rank != a->rank)
        return KILN_OK;
    for (int i = 0; i < cc->n_in; i++)
        if (cc->in_layout && cc->in_layout[i]) return KILN_OK;
    if (cc->out_layout && cc->out_layout[0]) return KILN_OK;
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return KILN_OK;
    }
    int64_t ta = 0, tb = 0;
    float alpha = 1.0f, beta = 1.0f;
    if (n->op != KILN_OP_MatMul) {
        ta = kiln_attr_int(n, "transA", 0);
        tb = kiln_attr_int(n, "transB", 0);
        alpha = kiln_attr_float(n, "alpha", 1.0f);
        if (n->op == KILN_OP_Gemm) beta = kiln_attr_float(n, "beta", 1.0f);
    }
    if (ta != 0 || (tb != 0 && tb != 1)) return KILN_OK;
    struct sk_state st;
    memset(&st, 0, sizeof st);
    const int64_t kk = tb ? b->dims[1] : b->dims[0], nn = tb ? b->dims[0] : b->dims[1];
    if (kk <= 0 || nn <= 0 || a->dims[a->rank - 1] != kk || y->dims[y->rank - 1] != nn)
        return KILN_OK;
    int64_t ac = kiln_shape_count(a->rank, a->dims);
    if (ac <= 0 || ac % kk) return KILN_OK;
    const int64_t mm = ac / kk;
    if (mm > KILN_SKINNY_MATMUL_MAX_M || kiln_shape_count(y->rank, y->dims) != mm * nn)
        return KILN_OK;
    for (int i = 0; i < a->rank - 1; i++) /* A's leading dims are Y's: no broadcasting */
        if (a->dims[i] != y->dims[i]) return KILN_OK;
    const struct kiln_type *bias = cc->n_in > 2 ? cc->in[2] : NULL;
    if (n->op == KILN_OP_Gemm && beta == 0.0f) bias = NULL;
    if (bias) {
        if (beta != 1.0f || bias->dtype != KILN_DTYPE_F32 || bias->rank < 1 ||
            bias->dims[bias->rank - 1] != nn || kiln_shape_count(bias->rank, bias->dims) != nn)
            return KILN_OK;
        st.has_bias = 1;
    }
    if (n->op == KILN_OP_KilnFusedMatMul) {
        const struct kiln_type *sum = cc->n_in > 3 ? cc->in[3] : NULL;
        if (sum) {
            if (sum->dtype != KILN_DTYPE_F32 || kiln_shape_count(sum->rank, sum->dims) != mm * nn ||
                sum->dims[sum->rank - 1] != nn)
                return KILN_OK;
            st.has_sum = 1;
        }
    }
    int has_act = 0;
    enum simd_unary act = SIMD_RELU;
    float act_alpha = 0, act_beta = 0;
    if (n->op == KILN_OP_KilnFusedMatMul &&
        !kiln_simd_fused_activation(n, &has_act, &act, &act_alpha, &act_beta))
        return KILN_OK;
    kiln_status rc = kiln_skinny_init(&st.sk, cc->weights, cc->in_value[1], mm, kk, nn, (int)tb,
                                      alpha);
    if (rc != KILN_OK) return rc;
    kiln_skinny_set_act(&st.sk, has_act, act, act_alpha, act_beta);
    struct sk_state *s = malloc(sizeof *s);
    if (!s) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    *s = st;
    snprintf(s->name, sizeof s->name, "f32_skinny_%s_%s",
             n->op == KILN_OP_MatMul ? "matmul" : n->op == KILN_OP_Gemm ? "gemm" : "fused_matmul",
             s->sk.k->isa);
    inst->name = s->name;
    inst->state = s;
    inst->run = sk_run;
    inst->destroy = free;
    inst->packed = 1u << 1;
    return KILN_OK;
}
