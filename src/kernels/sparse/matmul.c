/*
 * matmul.c - the sparse fast kernel for MatMul, Gemm and KilnFusedMatMul
 * with a constant, mostly-zero 2-D weight, and the per-node choice between
 * it and the dense kernel (kiln_sparse_matmul_select, sparse.h), which the
 * matmul family (src/kernels/dnnl/matmul.def) lists before oneDNN's product.
 *
 * Handled: A f32 of rank >= 2 (not transposed; its batch dims fold into
 * rows M), B constant [K, N] (Gemm's transB read through strides), alpha,
 * a bias of N values (Gemm's C with beta 1, or KilnFusedMatMul's bias),
 * no activation or Relu; fp32, or int8 in a plan compiled for
 * KILN_PRECISION_INT8 on a CPU with AVX-512 VNNI (dynamic quantization,
 * as the dense int8 path). Everything else is the dense kernel's.
 *
 * A run: A^T into scratch (fp32), or A quantized to u8 and interleaved by
 * 4 along k (int8); the SpMM into Y^T in scratch over ranges of output
 * columns on kiln_parallel_for; Y^T transposed into Y (rows in parallel).
 * With M = 1 A and Y are their own transposes: no copies.
 *
 * The choice: a candidate node is compiled both ways and each is timed on
 * the node's real shape (random A; one warm-up and five interleaved samples,
 * each repeating the run to about 200 us, the best of each); sparse wins
 * only when 10% faster. The result is kept
 * in the weight cache under (weight, "sparse_choice:<M>x<K>x<N>:..."), a
 * 0-byte entry holding an int, so later plans of the model take the same
 * decision without timing again.
 * KILN_SPARSE=off / force (sparse.h) skip the timing.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/dnnl/dnnl_common.h"
#include "core/threadpool.h"
#include "kernels/sparse/sparse.h"

#define SP_ALIGN64(x) (((x) + 63) / 64 * 64)

struct sp_state {
    const struct kiln_sparse_w *w; /* packed (weight cache, or own_w) */
    struct kiln_sparse_w *own_w;   /* packed without a weight cache */
    int is_int8, isa, relu, has_bias;
    int64_t M, K, N, K4;
    size_t in_off, q_off, yt_off, total; /* scratch: A^T or interleaved u8; u8 A; Y^T */
};

struct sp_geom {
    int64_t M, K, N, ldk, ldn;
    float alpha;
    int has_bias, relu, is_int8;
};

/* Whether the node is one the sparse kernel handles; fills g. */
static int sp_geometry(const struct kiln_compile_ctx *cc, struct sp_geom *g)
{
    const struct kiln_node *n = cc->node;
    enum kiln_op op = n->op;
    memset(g, 0, sizeof *g);
    if (cc->n_in < 2 || cc->n_out < 1 || !cc->in_value || !cc->in_value[1]) return 0;
    const struct kiln_type *a = cc->in[0], *b = cc->in[1], *y = cc->out[0];
    if (!a || !b || !y || a->dtype != KILN_DTYPE_F32 || b->dtype != KILN_DTYPE_F32 ||
        y->dtype != KILN_DTYPE_F32 || a->rank < 2 || b->rank != 2 || y->rank != a->rank)
        return 0;
    if (cc->in_layout && cc->in_layout[0]) return 0;
    if (cc->out_layout && cc->out_layout[0]) return 0;
    if (cc->in_value[1]->dtype != KILN_DTYPE_F32) return 0;
    int64_t tb = 0, ta = 0;
    float beta = 1.0f;
    g->alpha = 1.0f;
    if (op != KILN_OP_MatMul) {
        ta = kiln_attr_int(n, "transA", 0);
        tb = kiln_attr_int(n, "transB", 0);
        g->alpha = kiln_attr_float(n, "alpha", 1.0f);
        if (op == KILN_OP_Gemm) beta = kiln_attr_float(n, "beta", 1.0f);
    }
    if (op == KILN_OP_KilnFusedMatMul) {
        if (cc->n_in > 3 && cc->in[3]) return 0; /* a fused Sum stays dense */
        const char *act = kiln_attr_str(n, "activation", "");
        if (act && act[0] && strcmp(act, "Relu")) return 0;
        g->relu = act && !strcmp(act, "Relu");
    }
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return 0;
    }
    if (ta != 0 || (tb != 0 && tb != 1)) return 0;
    g->K = tb ? b->dims[1] : b->dims[0];
    g->N = tb ? b->dims[0] : b->dims[1];
    g->ldk = tb ? 1 : g->N;
    g->ldn = tb ? g->K : 1;
    if (g->K <= 0 || g->N <= 0 || a->dims[a->rank - 1] != g->K || y->dims[y->rank - 1] != g->N)
        return 0;
    int64_t ac = kiln_shape_count(a->rank, a->dims);
    if (ac <= 0 || ac % g->K) return 0;
    g->M = ac / g->K;
    if (kiln_shape_count(y->rank, y->dims) != g->M * g->N) return 0;
    const struct kiln_type *bias = cc->n_in > 2 ? cc->in[2] : NULL;
    if (op == KILN_OP_Gemm && beta == 0.0f) bias = NULL;
    if (bias) {
        if (beta != 1.0f || bias->dtype != KILN_DTYPE_F32 || bias->rank < 1 ||
            bias->dims[bias->rank - 1] != g->N || kiln_shape_count(bias->rank, bias->dims) != g->N)
            return 0;
        g->has_bias = 1;
    }
    if (cc->precision == 1) return 0; /* bf16 is dense */
    g->is_int8 = cc->precision == 2;
    if (g->is_int8 && kiln_sparse_isa(1) < 2) return 0; /* as the dense int8 path: VNNI only */
    if ((uint64_t)g->M * (uint64_t)(g->K + 4) > (uint64_t)INT32_MAX) return 0;
    return 1;
}

/* ---- packing through the weight cache ---- */

struct sp_pack_arg {
    const kiln_tensor *w;
    const struct sp_geom *g;
    int block;
};

static kiln_status sp_pack(void *arg, void **packed, size_t *bytes, void (**free_fn)(void *))
{
    struct sp_pack_arg *p = arg;
    struct kiln_sparse_w *s = NULL;
    kiln_status st = kiln_sparse_pack(p->w->data, p->g->K, p->g->N, p->g->ldk, p->g->ldn, p->block,
                                      p->g->is_int8, p->g->alpha, &s);
    if (st != KILN_OK) return st;
    *packed = s;
    *bytes = s->bytes;
    *free_fn = free;
    return KILN_OK;
}

/* ---- running ---- */

struct sp_job {
    const struct sp_state *s;
    const float *a;
    float *y;
    const void *in;  /* A^T (f32) or interleaved u8 */
    float *yt;
    int64_t ld;      /* leading dim of in (f32) / yt */
    int32_t zp;
    float sa;
    struct kiln_sparse_epi epi;
};

static void tr_a_chunk(void *ctx, int64_t k0, int64_t k1) /* A [M, K] -> A^T [K, M] */
{
    struct sp_job *j = ctx;
    int64_t M = j->s->M, K = j->s->K;
    float *at = (float *)j->in;
    for (int64_t m0 = 0; m0 < M; m0 += 16)
        for (int64_t k = k0; k < k1; k++)
            for (int64_t m = m0; m < M && m < m0 + 16; m++) at[k * M + m] = j->a[m * K + k];
}

static void interleave_chunk(void *ctx, int64_t b0, int64_t b1) /* u8 A -> [K4/4][M][4] */
{
    struct sp_job *j = ctx;
    const struct sp_state *s = j->s;
    const uint8_t *q = (const uint8_t *)j->a; /* the quantized A */
    uint8_t *o = (uint8_t *)j->in;
    for (int64_t kb = b0; kb < b1; kb++)
        for (int64_t m = 0; m < s->M; m++)
            for (int b = 0; b < 4; b++) {
                int64_t k = kb * 4 + b;
                o[(kb * s->M + m) * 4 + b] = k < s->K ? q[m * s->K + k] : 0;
            }
}

static void spmm_chunk(void *ctx, int64_t n0, int64_t n1)
{
    struct sp_job *j = ctx;
    const struct sp_state *s = j->s;
    if (s->is_int8)
        kiln_sparse_i8(s->isa, s->w, j->in, s->M, j->zp, j->sa, j->yt, j->ld, n0, n1, &j->epi);
    else
        kiln_sparse_f32(s->isa, s->w, j->in, j->ld, s->M, j->yt, j->ld, n0, n1, &j->epi);
}

static void tr_y_chunk(void *ctx, int64_t m0, int64_t m1) /* Y^T [N, M] -> Y [M, N] */
{
    struct sp_job *j = ctx;
    int64_t M = j->s->M, N = j->s->N;
    for (int64_t n0 = 0; n0 < N; n0 += 16)
        for (int64_t m = m0; m < m1; m++)
            for (int64_t n = n0; n < N && n < n0 + 16; n++) j->y[m * N + n] = j->yt[n * M + m];
}

static kiln_status sp_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct sp_state *s = state;
    int threads = ctx->threads > 0 ? ctx->threads : 1;
    void *heap = NULL;
    char *scratch = ctx->scratch;
    if (!scratch && s->total) {
        heap = scratch = aligned_alloc(64, s->total);
        if (!heap) return kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY, "out of memory for scratch");
    }
    struct sp_job j;
    memset(&j, 0, sizeof j);
    j.s = s;
    j.a = ctx->in[0]->data;
    j.y = ctx->out[0]->data;
    j.epi.bias = s->has_bias ? ctx->in[2]->data : NULL;
    j.epi.relu = s->relu;
    int direct = s->M == 1; /* A and Y are their own transposes */
    j.ld = s->M;
    j.yt = direct ? j.y : (float *)(scratch + s->yt_off);
    if (s->is_int8) {
        uint8_t *q = (uint8_t *)(scratch + s->q_off);
        kd_quantize_u8(j.a, s->M * s->K, q, threads, &j.sa, &j.zp);
        j.in = scratch + s->in_off;
        const float *a = j.a;
        j.a = (const float *)q;
        kiln_parallel_for(threads, s->K4 / 4, 16, interleave_chunk, &j);
        j.a = a;
    } else if (direct) {
        j.in = j.a;
    } else {
        j.in = scratch + s->in_off;
        kiln_parallel_for(threads, s->K, 64, tr_a_chunk, &j);
    }
    int64_t grain = s->N / (threads * 8) > 4 ? s->N / (threads * 8) : 4;
    kiln_parallel_for(threads, s->N, grain, spmm_chunk, &j);
    if (!direct) kiln_parallel_for(threads, s->M, 16, tr_y_chunk, &j);
    free(heap);
    return KILN_OK;
}

static void sp_destroy(void *state)
{
    struct sp_state *s = state;
    free(s->own_w);
    free(s);
}

/* Compile the sparse kernel for a candidate (g filled by sp_geometry). */
static kiln_status sp_compile(const struct kiln_compile_ctx *cc, const struct sp_geom *g, int block,
                              struct kiln_kernel_inst *inst)
{
    struct sp_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_node_error(cc->node, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    struct sp_pack_arg pa = {cc->in_value[1], g, block};
    kiln_status st;
    if (cc->weights) {
        char tag[160];
        snprintf(tag, sizeof tag, "sparse_%s_b%d:%lldx%lld:%lld,%lld:a%.9g", g->is_int8 ? "s8" : "f32",
                 g->is_int8 ? 4 : block, (long long)g->K, (long long)g->N, (long long)g->ldk,
                 (long long)g->ldn, (double)g->alpha);
        void *p = NULL;
        st = kiln_weight_cache_get(cc->weights, cc->in_value[1], tag, sp_pack, &pa, &p);
        s->w = p;
    } else {
        void *p = NULL;
        size_t bytes;
        void (*fr)(void *);
        st = sp_pack(&pa, &p, &bytes, &fr);
        s->w = s->own_w = p;
    }
    if (st != KILN_OK) {
        free(s);
        return st;
    }
    s->is_int8 = g->is_int8;
    s->isa = kiln_sparse_isa(g->is_int8);
    s->relu = g->relu;
    s->has_bias = g->has_bias;
    s->M = g->M, s->K = g->K, s->N = g->N;
    s->K4 = (g->K + 3) / 4 * 4;
    int direct = g->M == 1;
    size_t in_bytes = s->is_int8 ? (size_t)(s->K4 * s->M) : direct ? 0 : sizeof(float) * (size_t)(s->K * s->M);
    s->in_off = 0;
    s->q_off = SP_ALIGN64(in_bytes);
    s->yt_off = s->q_off + (s->is_int8 ? SP_ALIGN64((size_t)(s->K * s->M)) : 0);
    s->total = s->yt_off + (direct ? 0 : SP_ALIGN64(sizeof(float) * (size_t)(s->N * s->M)));
    static const char *const names[2][3] = {
        {"sparse_matmul", "sparse_gemm", "sparse_fused_matmul"},
        {"sparse_matmul_int8", "sparse_gemm_int8", "sparse_fused_matmul_int8"}};
    enum kiln_op op = cc->node->op;
    inst->name = names[s->is_int8][op == KILN_OP_MatMul ? 0 : op == KILN_OP_Gemm ? 1 : 2];
    snprintf(inst->impl, sizeof inst->impl, "%s:block%d", s->isa == 2 ? "avx512_vnni" : s->isa ? "avx512" : "scalar",
             s->w->block);
    inst->state = s;
    inst->run = sp_run;
    inst->destroy = sp_destroy;
    inst->scratch_bytes = s->total;
    inst->packed = 1u << 1;
    return KILN_OK;
}

/* ---- choosing ---- */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A tensor of type t stored in `layout` (a blocked 4-D value has its channels padded). */
static kiln_status new_stored(const struct kiln_type *t, int layout, kiln_tensor **out)
{
    int64_t d[KILN_MAX_RANK];
    for (int i = 0; i < t->rank; i++) d[i] = t->dims[i];
    if (layout > 0 && t->rank == 4) d[1] = kiln_layout_channels(d[1], layout);
    return kiln_tensor_new(t->dtype, t->rank, d, out);
}

/* Best of five timed samples of each instance (after one warm-up each), interleaved.
 * *sparse_wins = 1 when the sparse one is at least 10% faster. */
kiln_status kiln_sparse_measure(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *sp,
                                struct kiln_kernel_inst *dn, int *sparse_wins)
{
    kiln_status st = KILN_OK;
    kiln_tensor *t[4] = {NULL, NULL, NULL, NULL}, *y = NULL;
    kiln_tensor *in[4] = {NULL, NULL, NULL, NULL};
    int n_in = cc->n_in < 4 ? cc->n_in : 4;
    size_t scratch_bytes = sp->scratch_bytes > dn->scratch_bytes ? sp->scratch_bytes : dn->scratch_bytes;
    void *scratch = aligned_alloc(64, SP_ALIGN64(scratch_bytes ? scratch_bytes : 64));
    if (!scratch) return kiln_node_error(cc->node, KILN_ERR_OUT_OF_MEMORY, "out of memory timing");
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n_in && st == KILN_OK; i++) {
        if (!cc->in[i]) continue;
        if (cc->in_value && cc->in_value[i]) {
            in[i] = (kiln_tensor *)cc->in_value[i];
            continue;
        }
        st = new_stored(cc->in[i], cc->in_layout ? cc->in_layout[i] : 0, &t[i]);
        if (st != KILN_OK) break;
        if (t[i]->dtype == KILN_DTYPE_F32) {
            float *d = t[i]->data;
            for (int64_t k = 0; k < kiln_tensor_count(t[i]); k++) {
                r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                d[k] = (float)(r >> 40) * (1.0f / 8388608.0f) - 1.0f;
            }
        }
        in[i] = t[i];
    }
    if (st == KILN_OK) st = new_stored(cc->out[0], cc->out_layout ? cc->out_layout[0] : 0, &y);
    /* A sample repeats the run until it lasts about 200 us (a small node takes a
     * few us, where one run's time is mostly noise); the best of five samples. */
    double best[2] = {1e30, 1e30};
    int reps[2] = {1, 1};
    for (int it = 0; it < 7 && st == KILN_OK; it++)
        for (int k = 0; k < 2 && st == KILN_OK; k++) {
            struct kiln_kernel_inst *x = k ? dn : sp;
            kiln_tensor *outs[1] = {y};
            struct kiln_run_ctx rc = {cc->node, n_in, in, 1, outs, NULL, scratch, cc->threads};
            double t0 = now_s();
            for (int rep = 0; rep < reps[k] && st == KILN_OK; rep++) st = x->run(x->state, &rc);
            double dt = (now_s() - t0) / reps[k];
            if (it == 1) { /* after a cold warm-up run */
                double n = dt > 0 ? 200e-6 / dt : 64;
                reps[k] = n < 1 ? 1 : n > 64 ? 64 : (int)n;
            } else if (it > 1 && dt < best[k]) {
                best[k] = dt;
            }
        }
    *sparse_wins = st == KILN_OK && best[0] * 1.1 < best[1];
    for (int i = 0; i < 4; i++) kiln_tensor_free(t[i]);
    kiln_tensor_free(y);
    free(scratch);
    return st;
}

/* The decision slot of a (weight, shape): an int in the weight cache, -1 until
 * decided; 0 bytes, so the cache's packed-bytes count is unchanged. */
static kiln_status choice_pack(void *arg, void **packed, size_t *bytes, void (**free_fn)(void *))
{
    (void)arg;
    int *c = malloc(sizeof *c);
    if (!c) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    *c = -1;
    *packed = c;
    *bytes = 0;
    *free_fn = free;
    return KILN_OK;
}

kiln_status kiln_sparse_choice_slot(const struct kiln_compile_ctx *cc, const kiln_tensor *w,
                                    const char *tag, int **slot)
{
    void *p = NULL;
    kiln_status st = kiln_weight_cache_get(cc->weights, w, tag, choice_pack, NULL, &p);
    *slot = st == KILN_OK ? p : NULL;
    return st;
}

bool kiln_sparse_matmul_candidate(const struct kiln_compile_ctx *cc)
{
    struct sp_geom g;
    return kiln_sparse_mode() != KILN_SPARSE_OFF && sp_geometry(cc, &g);
}

kiln_status kiln_sparse_matmul_select(const struct kiln_compile_ctx *cc,
                                      struct kiln_kernel_inst *inst, kiln_fast_compile_fn dense)
{
    enum kiln_sparse_mode mode = kiln_sparse_mode();
    struct sp_geom g;
    if (mode == KILN_SPARSE_OFF || !sp_geometry(cc, &g)) return dense(cc, inst);
    const kiln_tensor *w = cc->in_value[1];
    char ctag[128];
    snprintf(ctag, sizeof ctag, "sparse_choice:%lldx%lldx%lld:%d:%d:t%d", (long long)g.M,
             (long long)g.K, (long long)g.N, g.is_int8, g.relu, cc->threads);
    int choice = -1; /* 0 dense, 1 sparse (block 1), 4 sparse (block 4) */
    int *slot = NULL;
    if (cc->weights && mode == KILN_SPARSE_AUTO) {
        void *p = NULL;
        kiln_status st = kiln_weight_cache_get(cc->weights, w, ctag, choice_pack, NULL, &p);
        if (st != KILN_OK) return st;
        slot = p;
        choice = *slot;
        if (choice == 0) return dense(cc, inst);
    }
    int block = choice > 0 ? choice : 1;
    if (choice < 0) { /* is the weight sparse enough? */
        kiln_status st = cc->weights ? kiln_weight_cache_acquire(cc->weights, w, 0) : KILN_OK;
        if (st != KILN_OK) return st;
        if (!w->data) return dense(cc, inst);
        double d1 = kiln_sparse_density(w->data, g.K, g.N, g.ldk, g.ldn, 1);
        double d4 = kiln_sparse_density(w->data, g.K, g.N, g.ldk, g.ldn, 4);
        double d = g.is_int8 ? d4 : d1;
        if (d > KILN_SPARSE_MAX_DENSITY) {
            choice = 0;
        } else {
            block = !g.is_int8 && g.K % 4 == 0 && d4 <= d1 * 1.2 ? 4 : 1;
        }
    }
    struct kiln_kernel_inst sp;
    memset(&sp, 0, sizeof sp);
    kiln_status st = KILN_OK;
    if (choice != 0) st = sp_compile(cc, &g, block, &sp);
    if (st != KILN_OK) return st;
    if (choice > 0 || (choice < 0 && mode == KILN_SPARSE_FORCE)) {
        *inst = sp;
        return KILN_OK;
    }
    if (choice == 0) {
        st = dense(cc, inst);
    } else { /* measure */
        st = dense(cc, inst);
        int wins = 1;
        if (st == KILN_OK && inst->run) st = kiln_sparse_measure(cc, &sp, inst, &wins);
        if (st != KILN_OK) {
            kiln_kernel_inst_destroy(&sp);
            return st;
        }
        if (wins) {
            kiln_kernel_inst_destroy(inst);
            *inst = sp;
        } else {
            kiln_kernel_inst_destroy(&sp);
        }
        choice = wins ? block : 0;
    }
    if (st == KILN_OK && slot) *slot = choice;
    return st;
}
