/*
 * unit_sparse.c - the sparse kernels (src/kernels/sparse/) against plain
 * references written here.
 *
 * 1. The SpMM kernels alone (kiln_sparse_f32 / kiln_sparse_i8, scalar and
 *    AVX-512 / VNNI where the CPU has them) on packed weights of every
 *    pattern: unstructured at 90% and 60% zeros, 1x4 blocks along k, empty
 *    output columns, all zero, fully dense; P (the vector dimension) of 1,
 *    15, 16, 17, 64, 65, 130; bias and Relu. fp32 against a double
 *    product (relative 1e-5 of the output's scale); int8 bit for bit
 *    against an integer reference (s32 sums, then the float steps in the
 *    order sparse.h states).
 * 2. Whole nodes through the MatMul / Gemm / KilnFusedMatMul fast kernel
 *    with KILN_SPARSE=force (the sparse kernel for every candidate):
 *    batch 1, rank-3 A, N not a multiple of 16, K not a multiple of 4,
 *    transB, alpha, bias, Relu, with 1 and 2 threads; fp32 against the
 *    double product; int8 (plans compiled for KILN_PRECISION_INT8, CPUs
 *    with VNNI) bit for bit against the dense int8 path's formulas
 *    (docs/COMPRESSION.md) computed here.
 * 3. The choice: KILN_SPARSE=off and a dense weight give the dense
 *    kernel; in auto mode a 90%-zero weight is measured and either kernel
 *    may win, but the result must match the reference and a second plan
 *    must make the same choice (kept in the weight cache).
 * 4. 1x1 Conv / KilnFusedConv through the conv fast kernel with
 *    KILN_SPARSE=force: 50%, 90% and 97% zeros, unstructured, 1x4 blocks
 *    (along Cin) and 4x1 blocks (along Cout); Cin and Cout off multiples of
 *    16 (and of 4), HW = 1, odd HW, batch 1 to 3, bias, Relu, X and Y plain
 *    or blocked by 16 or 8 (padding channels of Y must be written 0); 1 and
 *    2 threads. fp32 against the reference conv kernel (relative 1e-5 of the
 *    output's scale), int8 (VNNI) bit for bit against the dense int8 conv's
 *    formulas computed here. A stride-2 conv is not a candidate; in auto
 *    mode a 256->256 conv at 90% zeros is measured, matches the reference,
 *    and a second plan makes the same choice; KILN_SPARSE=off runs dense.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "one_node.h"
#include "kernels/fast.h"
#include "kernels/kernel.h"
#include "kernels/sparse/sparse.h"
#include "kiln/kiln.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) /* in [-1, 1) */
{
    return (float)((check_xorshift(&rng) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

enum pattern { P_UNSTR90, P_UNSTR60, P_BLOCK4, P_EMPTY_COLS, P_ZERO, P_DENSE };
static const char *const pattern_name[] = {"unstructured 90%", "unstructured 60%", "1x4 blocks",
                                           "empty columns", "all zero", "dense"};

/* W [K, N] row-major with the pattern. */
static void fill_w(float *w, int64_t K, int64_t N, enum pattern p)
{
    for (int64_t k = 0; k < K; k++)
        for (int64_t n = 0; n < N; n++) {
            float v = frand();
            int keep = 1;
            float u = (frand() + 1.0f) * 0.5f;
            switch (p) {
            case P_UNSTR90: keep = u < 0.1f; break;
            case P_UNSTR60: keep = u < 0.4f; break;
            case P_BLOCK4: keep = 0; break; /* set below */
            case P_EMPTY_COLS: keep = n % 3 != 1 && u < 0.2f; break;
            case P_ZERO: keep = 0; break;
            case P_DENSE: keep = 1; break;
            }
            w[k * N + n] = keep ? v : 0.0f;
        }
    if (p == P_BLOCK4)
        for (int64_t n = 0; n < N; n++)
            for (int64_t k0 = 0; k0 < K; k0 += 4)
                if ((frand() + 1.0f) * 0.5f < 0.15f)
                    for (int64_t k = k0; k < k0 + 4 && k < K; k++) w[k * N + n] = frand();
}

static int g_avx512, g_vnni;

/* ---- 1. the kernels alone ---- */

static void test_kernels(void)
{
    static const int64_t Ps[] = {1, 15, 16, 17, 64, 65, 130};
    static const int64_t Ks[] = {1, 4, 7, 32};
    static const int64_t Ns[] = {1, 5, 17};
    int cases = 0;
    for (int pat = 0; pat <= P_DENSE; pat++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
                for (size_t pi = 0; pi < sizeof Ps / sizeof *Ps; pi++) {
                    int64_t K = Ks[ki], N = Ns[ni], P = Ps[pi];
                    int bias = (int)(pi % 2), relu = (int)((pi / 2) % 2);
                    float *w = malloc(sizeof(float) * (size_t)(K * N));
                    float *in = malloc(sizeof(float) * (size_t)(K * P));
                    float *b = malloc(sizeof(float) * (size_t)N);
                    float *out = malloc(sizeof(float) * (size_t)(N * P));
                    fill_w(w, K, N, (enum pattern)pat);
                    for (int64_t i = 0; i < K * P; i++) in[i] = frand();
                    for (int64_t i = 0; i < N; i++) b[i] = frand();
                    struct kiln_sparse_epi e = {bias ? b : NULL, relu};
                    /* fp32, block 1 and (K % 4 == 0) block 4, scalar and AVX-512 */
                    for (int block = 1; block <= 4; block += 3) {
                        if (block == 4 && K % 4) continue;
                        struct kiln_sparse_w *s = NULL;
                        float alpha = 0.5f;
                        CHECK(kiln_sparse_pack(w, K, N, N, 1, block, 0, alpha, &s) == KILN_OK, "pack");
                        if (!s) continue;
                        for (int isa = 0; isa <= (g_avx512 ? 1 : 0); isa++) {
                            for (int64_t i = 0; i < N * P; i++) out[i] = NAN;
                            kiln_sparse_f32(isa, s, in, P, P, out, P, 0, N, &e);
                            double worst = 0.0, scale = 1e-30;
                            for (int64_t n = 0; n < N; n++)
                                for (int64_t p = 0; p < P; p++) {
                                    double r = bias ? b[n] : 0.0;
                                    for (int64_t k = 0; k < K; k++)
                                        r += (double)(w[k * N + n] * alpha) * in[k * P + p];
                                    if (relu && r < 0) r = 0;
                                    double d = fabs(r - out[n * P + p]);
                                    if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
                                    if (fabs(r) > scale) scale = fabs(r);
                                }
                            CHECK(worst <= 1e-5 * (scale > 1 ? scale : 1),
                                  "f32 %s K=%lld N=%lld P=%lld block %d isa %d: error %g",
                                  pattern_name[pat], (long long)K, (long long)N, (long long)P, block,
                                  isa, worst);
                            cases++;
                        }
                        free(s);
                    }
                    /* int8 */
                    struct kiln_sparse_w *s = NULL;
                    CHECK(kiln_sparse_pack(w, K, N, N, 1, 4, 1, 1.0f, &s) == KILN_OK, "pack s8");
                    int64_t K4 = (K + 3) / 4 * 4;
                    uint8_t *qa = malloc((size_t)(K4 * P));
                    int32_t zp = (int32_t)(check_xorshift(&rng) % 256);
                    float sa = 0.013f;
                    for (int64_t k = 0; k < K4; k++)
                        for (int64_t p = 0; p < P; p++)
                            qa[((k / 4) * P + p) * 4 + k % 4] =
                                k < K ? (uint8_t)(check_xorshift(&rng) % 256) : 0;
                    for (int isa = 0; s && isa <= (g_vnni ? 2 : 0); isa += 2) {
                        for (int64_t i = 0; i < N * P; i++) out[i] = NAN;
                        kiln_sparse_i8(isa, s, qa, P, zp, sa, out, P, 0, N, &e);
                        int bad = 0;
                        for (int64_t n = 0; n < N && !bad; n++) {
                            float mx = 0.0f;
                            for (int64_t k = 0; k < K; k++) mx = fmaxf(mx, fabsf(w[k * N + n]));
                            float sw = mx > 0.0f ? mx / 127.0f : 1.0f;
                            for (int64_t p = 0; p < P && !bad; p++) {
                                int32_t acc = 0;
                                for (int64_t k = 0; k < K; k++) {
                                    float q = nearbyintf(w[k * N + n] / sw);
                                    int32_t qw = q < -127 ? -127 : q > 127 ? 127 : (int32_t)q;
                                    acc += ((int32_t)qa[((k / 4) * P + p) * 4 + k % 4] - zp) * qw;
                                }
                                float v = (float)acc * sw;
                                v = v * sa;
                                if (bias) v = v + b[n];
                                if (relu && v < 0.0f) v = 0.0f;
                                if (memcmp(&v, &out[n * P + p], sizeof v)) {
                                    bad = 1;
                                    CHECK(0, "int8 %s K=%lld N=%lld P=%lld isa %d: [%lld,%lld] %.9g != %.9g",
                                          pattern_name[pat], (long long)K, (long long)N, (long long)P,
                                          isa, (long long)n, (long long)p, (double)out[n * P + p],
                                          (double)v);
                                }
                            }
                        }
                        if (!bad) CHECK(1, "int8");
                        cases++;
                    }
                    free(s);
                    free(qa);
                    free(w);
                    free(in);
                    free(b);
                    free(out);
                }
    printf("kernels: %d cases\n", cases);
}

/* ---- 2. and 3. whole nodes ---- */

struct mm_case {
    enum kiln_op op;
    int a_rank;      /* 2, or 3: [2, M, K] */
    int64_t m, k, n;
    int trans_b, bias, relu;
    float alpha;
    enum pattern pat;
};

static kiln_tensor *tensor(int rank, const int64_t *dims)
{
    kiln_tensor *t;
    if (kiln_tensor_new(KILN_DTYPE_F32, rank, dims, &t) != KILN_OK) abort();
    return t;
}

static void build(struct one_node *t, const struct mm_case *c)
{
    memset(t, 0, sizeof *t);
    struct kiln_node *n;
    t->n_in = c->bias ? 3 : 2;
    if (kiln_graph_new(&t->g) != KILN_OK ||
        kiln_graph_node_add(t->g, c->op, "node", t->n_in, 1, 4, &n) != KILN_OK)
        abort();
    n->n_attr = 0;
    int id;
    if (kiln_graph_value_add(t->g, "y", KILN_VALUE_NODE, &id) != KILN_OK) abort();
    t->g->values[id].producer = 0;
    t->g->nodes[0].out[0] = id;
    int64_t ad[3] = {2, c->m, c->k}, a2[2] = {c->m, c->k};
    kiln_tensor *a = c->a_rank == 3 ? tensor(3, ad) : tensor(2, a2);
    for (int64_t i = 0; i < kiln_tensor_count(a); i++) ((float *)a->data)[i] = frand() * 2.0f + 0.3f;
    add_in(t, 0, a, 0);
    float *w = malloc(sizeof(float) * (size_t)(c->k * c->n));
    fill_w(w, c->k, c->n, c->pat);
    int64_t bd[2] = {c->trans_b ? c->n : c->k, c->trans_b ? c->k : c->n};
    kiln_tensor *b = tensor(2, bd);
    float *bb = b->data;
    for (int64_t k = 0; k < c->k; k++)
        for (int64_t j = 0; j < c->n; j++)
            bb[c->trans_b ? j * c->k + k : k * c->n + j] = w[k * c->n + j];
    free(w);
    add_in(t, 1, b, 1);
    if (c->bias) {
        int64_t d[1] = {c->n};
        kiln_tensor *x = tensor(1, d);
        for (int64_t i = 0; i < c->n; i++) ((float *)x->data)[i] = frand();
        add_in(t, 2, x, 1);
    }
    if (c->op != KILN_OP_MatMul) {
        add_attr(t, "transB", KILN_ATTR_INT)->i = c->trans_b;
        add_attr(t, "alpha", KILN_ATTR_FLOAT)->f = c->alpha;
    }
    if (c->op == KILN_OP_KilnFusedMatMul) {
        struct kiln_attr *a2a = add_attr(t, "activation", KILN_ATTR_STRING);
        const char *s = c->relu ? "Relu" : "";
        a2a->s.len = strlen(s);
        a2a->s.data = kiln_arena_strdup(t->g->mem, s);
    }
}

static int64_t rows(const struct mm_case *c) { return c->a_rank == 3 ? 2 * c->m : c->m; }
static float b_at(const struct mm_case *c, const float *b, int64_t k, int64_t j)
{
    return c->trans_b ? b[j * c->k + k] : b[k * c->n + j];
}

/* fp32 reference (double sums), or int8 with the dense dynamic path's formulas. */
static void reference(const struct mm_case *c, const struct one_node *t, int int8, double *y)
{
    const float *a = t->in[0]->data, *b = t->in[1]->data, *e = c->bias ? t->in[2]->data : NULL;
    int64_t R = rows(c), K = c->k, N = c->n;
    float alpha = c->op == KILN_OP_MatMul ? 1.0f : c->alpha;
    float sa = 1.0f;
    int32_t zp = 0;
    int32_t *qa = NULL;
    if (int8) {
        float lo = 0.0f, hi = 0.0f;
        for (int64_t i = 0; i < R * K; i++) lo = fminf(lo, a[i]), hi = fmaxf(hi, a[i]);
        sa = (hi - lo) / 255.0f;
        if (!(sa > 0.0f)) sa = 1.0f;
        float zf = nearbyintf(-lo / sa);
        zp = zf < 0 ? 0 : zf > 255 ? 255 : (int32_t)zf;
        qa = malloc(sizeof(int32_t) * (size_t)(R * K));
        for (int64_t i = 0; i < R * K; i++) {
            float q = nearbyintf(a[i] * (1.0f / sa)) + (float)zp;
            qa[i] = q < 0 ? 0 : q > 255 ? 255 : (int32_t)q;
        }
    }
    for (int64_t j = 0; j < N; j++) {
        float mx = 0.0f;
        for (int64_t k = 0; k < K; k++) mx = fmaxf(mx, fabsf(b_at(c, b, k, j)));
        float sw = mx > 0.0f ? mx / 127.0f : 1.0f;
        for (int64_t r = 0; r < R; r++) {
            if (int8) {
                int32_t acc = 0;
                for (int64_t k = 0; k < K; k++) {
                    float q = nearbyintf(b_at(c, b, k, j) / sw);
                    acc += (qa[r * K + k] - zp) * (q < -127 ? -127 : q > 127 ? 127 : (int32_t)q);
                }
                float v = (float)acc * (sw * alpha);
                v = v * sa;
                if (e) v = v + e[j];
                if (c->relu && v < 0.0f) v = 0.0f;
                y[r * N + j] = v;
            } else {
                double s = 0.0;
                for (int64_t k = 0; k < K; k++) s += (double)a[r * K + k] * (b_at(c, b, k, j) * alpha);
                if (e) s += e[j];
                if (c->relu && s < 0) s = 0;
                y[r * N + j] = s;
            }
        }
    }
    free(qa);
}

/* Compile node t with the fast kernel in (precision, threads) into inst using cache wc
 * (NULL: a fresh one), run it; the output, or NULL when not handled. */
static kiln_tensor *run_node(struct one_node *t, int precision, int threads, struct kiln_weight_cache *wc,
                             char *name, size_t cap)
{
    struct kiln_node *n = &t->g->nodes[0];
    struct kiln_type types[3], yt;
    const struct kiln_type *ins[3] = {0};
    const kiln_tensor *vals[3] = {0};
    int layouts[3] = {0}, out_layouts[1] = {0};
    for (int i = 0; i < t->n_in; i++) {
        kiln_type_from_tensor(&types[i], t->in[i]);
        ins[i] = &types[i];
        if (i > 0) vals[i] = t->in[i];
    }
    struct kiln_type *outs_w[1] = {&yt};
    struct kiln_infer_ctx ic = {n, t->n_in, ins, vals, 1, outs_w};
    enum kiln_op op = n->op;
    if (op == KILN_OP_KilnFusedMatMul) n->op = t->in[0]->rank == 2 ? KILN_OP_Gemm : KILN_OP_MatMul;
    kiln_status st = kiln_op_impl(n->op)->infer(&ic);
    n->op = op;
    if (st != KILN_OK) return NULL;
    struct kiln_weight_cache *own = NULL;
    if (!wc && kiln_weight_cache_new(&own) != KILN_OK) abort();
    const struct kiln_type *outs[1] = {&yt};
    struct kiln_compile_ctx cc = {n, t->n_in, ins, vals, layouts, 1, outs, out_layouts,
                                  wc ? wc : own, threads, precision, 0};
    struct kiln_kernel_inst inst;
    memset(&inst, 0, sizeof inst);
    kiln_tensor *y = NULL;
    st = kiln_fast_op(op)->compile(&cc, &inst);
    if (st != KILN_OK) fprintf(stderr, "compile: %s\n", kiln_last_error());
    if (st == KILN_OK && inst.run) {
        snprintf(name, cap, "%s", inst.name);
        if (kiln_tensor_new(KILN_DTYPE_F32, yt.rank, yt.dims, &y) != KILN_OK) abort();
        for (int64_t i = 0; i < kiln_tensor_count(y); i++) ((float *)y->data)[i] = NAN;
        void *scratch = inst.scratch_bytes ? aligned_alloc(64, (inst.scratch_bytes + 63) / 64 * 64) : NULL;
        struct kiln_run_ctx rc = {.node = n, .n_in = t->n_in, .in = t->in, .n_out = 1,
                                  .out = &y, .scratch = scratch, .threads = threads};
        if (inst.run(inst.state, &rc) != KILN_OK) {
            fprintf(stderr, "run: %s\n", kiln_last_error());
            kiln_tensor_free(y);
            y = NULL;
        }
        free(scratch);
    }
    kiln_kernel_inst_destroy(&inst);
    kiln_weight_cache_free(own);
    return y;
}

static void describe(const struct mm_case *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s a_rank=%d m=%lld k=%lld n=%lld transB=%d alpha=%g bias=%d relu=%d %s",
             kiln_op_name(c->op), c->a_rank, (long long)c->m, (long long)c->k, (long long)c->n,
             c->trans_b, (double)c->alpha, c->bias, c->relu, pattern_name[c->pat]);
}

/* Compare y with the reference: fp32 within 1e-5 of the output's scale, int8 exactly. */
static int compare(const struct mm_case *c, const struct one_node *t, int int8, const kiln_tensor *y,
                   const char *what)
{
    int64_t cnt = rows(c) * c->n;
    double *ref = malloc(sizeof(double) * (size_t)cnt);
    reference(c, t, int8, ref);
    double worst = 0.0, scale = 1.0;
    int64_t bad_at = -1;
    const float *yd = y->data;
    for (int64_t i = 0; i < cnt; i++) {
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
        double d = fabs(ref[i] - yd[i]);
        if (isnan(yd[i])) d = INFINITY;
        if (int8 && (float)ref[i] != yd[i] && bad_at < 0) bad_at = i;
        if (d > worst) worst = d;
    }
    int ok = int8 ? bad_at < 0 : worst <= 1e-5 * scale;
    CHECK(ok, "%s: %s error %g (scale %g)%s", what, int8 ? "int8" : "fp32", worst, scale,
          int8 && bad_at >= 0 ? " not bit-exact" : "");
    free(ref);
    return ok;
}

static void test_nodes(void)
{
    static const struct mm_case cases[] = {
        {KILN_OP_MatMul, 2, 1, 64, 48, 0, 0, 0, 1.0f, P_UNSTR90},        /* batch 1 */
        {KILN_OP_MatMul, 2, 17, 33, 70, 0, 0, 0, 1.0f, P_UNSTR90},       /* K % 4, N % 16 */
        {KILN_OP_MatMul, 3, 9, 32, 17, 0, 0, 0, 1.0f, P_BLOCK4},         /* rank-3 A */
        {KILN_OP_Gemm, 2, 65, 40, 33, 1, 1, 0, 0.75f, P_EMPTY_COLS},     /* transB, alpha, bias */
        {KILN_OP_Gemm, 2, 16, 24, 16, 0, 1, 0, 1.0f, P_ZERO},            /* all zero */
        {KILN_OP_KilnFusedMatMul, 2, 130, 64, 20, 0, 1, 1, 1.0f, P_UNSTR60}, /* Relu */
        {KILN_OP_KilnFusedMatMul, 3, 5, 16, 31, 0, 1, 1, 1.0f, P_BLOCK4},
    };
    char what[256], name[64];
    setenv("KILN_SPARSE", "force", 1);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const struct mm_case *c = &cases[i];
        struct one_node t;
        build(&t, c);
        describe(c, what, sizeof what);
        for (int prec = 0; prec <= 2; prec += 2)
            for (int threads = 1; threads <= 2; threads++) {
                if (prec == 2 && !g_vnni) continue;
                name[0] = '\0';
                kiln_tensor *y = run_node(&t, prec, threads, NULL, name, sizeof name);
                CHECK(y != NULL, "%s: not handled", what);
                if (!y) continue;
                /* 60% zeros leave most 1x4 blocks nonzero: not an int8 candidate */
                int want_sparse = !(prec == 2 && c->pat == P_UNSTR60);
                CHECK((strncmp(name, "sparse_", 7) == 0) == want_sparse, "%s: ran on %s", what, name);
                CHECK((prec == 2) == (strstr(name, "_int8") != NULL), "%s: %s in precision %d", what,
                      name, prec);
                char w2[300];
                snprintf(w2, sizeof w2, "%s threads=%d", what, threads);
                compare(c, &t, prec == 2, y, w2);
                kiln_tensor_free(y);
            }
        kiln_graph_free(t.g);
    }

    /* the choice */
    struct mm_case dense = {KILN_OP_MatMul, 2, 32, 64, 64, 0, 0, 0, 1.0f, P_DENSE};
    struct mm_case sparse = {KILN_OP_MatMul, 2, 64, 256, 512, 0, 0, 0, 1.0f, P_UNSTR90};
    struct one_node td, ts;
    build(&td, &dense);
    build(&ts, &sparse);
    unsetenv("KILN_SPARSE");
    kiln_tensor *y = run_node(&td, 0, 1, NULL, name, sizeof name);
    CHECK(y && strncmp(name, "sparse_", 7), "a dense weight ran on %s", name);
    if (y) compare(&dense, &td, 0, y, "dense weight, auto");
    kiln_tensor_free(y);
    setenv("KILN_SPARSE", "off", 1);
    y = run_node(&ts, 0, 1, NULL, name, sizeof name);
    CHECK(y && strncmp(name, "sparse_", 7), "KILN_SPARSE=off ran on %s", name);
    kiln_tensor_free(y);
    unsetenv("KILN_SPARSE");
    struct kiln_weight_cache *wc;
    if (kiln_weight_cache_new(&wc) != KILN_OK) abort();
    char first[64];
    y = run_node(&ts, 0, 2, wc, first, sizeof first);
    CHECK(y != NULL, "auto: not handled");
    if (y) compare(&sparse, &ts, 0, y, "90% zeros, auto");
    kiln_tensor_free(y);
    y = run_node(&ts, 0, 2, wc, name, sizeof name);
    CHECK(y && !strcmp(name, first), "a second plan chose %s, the first %s", name, first);
    printf("auto on a 256x512 weight with 90%% zeros, M=64, 2 threads: %s\n", first);
    kiln_tensor_free(y);
    kiln_weight_cache_free(wc);
    kiln_graph_free(td.g);
    kiln_graph_free(ts.g);
}

/* ---- 4. 1x1 convolutions ---- */

enum cpat { C_UNSTR, C_1X4, C_4X1 }; /* 1x4: 4 consecutive Cin; 4x1: 4 consecutive Cout */
static const char *const cpat_name[] = {"unstructured", "1x4 blocks", "4x1 blocks"};

struct conv_case {
    int64_t n, cin, cout, h, w;
    double zeros; /* share of zero blocks */
    enum cpat pat;
    int fused, bias, relu;
    int layout;   /* of X and Y: 0, or 16 (blocked as the layout pass stores them) */
};

/* W [Cout, Cin, 1, 1] with the pattern and exactly that share of zero blocks (rounded
 * down), the nonzero ones at random. */
static void fill_conv_w(float *w, int64_t co, int64_t ci, double zeros, enum cpat p)
{
    for (int64_t i = 0; i < co * ci; i++) w[i] = 0.0f;
    int64_t bo = p == C_4X1 ? 4 : 1, bi = p == C_1X4 ? 4 : 1;
    int64_t no = (co + bo - 1) / bo, ni = (ci + bi - 1) / bi, nb = no * ni;
    int64_t keep = nb - (int64_t)(zeros * (double)nb);
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)nb);
    for (int64_t i = 0; i < nb; i++) ids[i] = i;
    for (int64_t i = 0; i < keep; i++) { /* a random prefix of a Fisher-Yates shuffle */
        int64_t j = i + (int64_t)(check_xorshift(&rng) % (uint64_t)(nb - i));
        int64_t tmp = ids[i];
        ids[i] = ids[j];
        ids[j] = tmp;
        int64_t o0 = ids[i] / ni * bo, i0 = ids[i] % ni * bi;
        for (int64_t o = o0; o < o0 + bo && o < co; o++)
            for (int64_t k = i0; k < i0 + bi && k < ci; k++) w[o * ci + k] = frand();
    }
    free(ids);
}

static void build_conv(struct one_node *t, const struct conv_case *c)
{
    memset(t, 0, sizeof *t);
    struct kiln_node *n;
    t->n_in = c->bias ? 3 : 2;
    if (kiln_graph_new(&t->g) != KILN_OK ||
        kiln_graph_node_add(t->g, c->fused ? KILN_OP_KilnFusedConv : KILN_OP_Conv, "conv", t->n_in, 1,
                            4, &n) != KILN_OK)
        abort();
    n->n_attr = 0;
    int id;
    if (kiln_graph_value_add(t->g, "y", KILN_VALUE_NODE, &id) != KILN_OK) abort();
    t->g->values[id].producer = 0;
    t->g->nodes[0].out[0] = id;
    int64_t xd[4] = {c->n, c->cin, c->h, c->w}, wd[4] = {c->cout, c->cin, 1, 1};
    kiln_tensor *x = tensor(4, xd);
    for (int64_t i = 0; i < kiln_tensor_count(x); i++) ((float *)x->data)[i] = frand() * 2.0f + 0.3f;
    add_in(t, 0, x, 0);
    kiln_tensor *w = tensor(4, wd);
    fill_conv_w(w->data, c->cout, c->cin, c->zeros, c->pat);
    add_in(t, 1, w, 1);
    if (c->bias) {
        int64_t d[1] = {c->cout};
        kiln_tensor *b = tensor(1, d);
        for (int64_t i = 0; i < c->cout; i++) ((float *)b->data)[i] = frand();
        add_in(t, 2, b, 1);
    }
    if (c->fused) {
        struct kiln_attr *a = add_attr(t, "activation", KILN_ATTR_STRING);
        const char *s = c->relu ? "Relu" : "";
        a->s.len = strlen(s);
        a->s.data = kiln_arena_strdup(t->g->mem, s);
    }
}

/* x [N, C, H, W] plain -> blocked by b (padding channels 0), or back (to_plain). */
static void reblock(const float *src, float *dst, int64_t n, int64_t c, int64_t P, int b, int to_plain)
{
    int64_t cb = (c + b - 1) / b;
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < cb * b; k++)
            for (int64_t p = 0; p < P; p++) {
                int64_t bi = ((i * cb + k / b) * P + p) * b + k % b;
                if (to_plain) {
                    if (k < c) dst[(i * c + k) * P + p] = src[bi];
                } else {
                    dst[bi] = k < c ? src[(i * c + k) * P + p] : 0.0f;
                }
            }
}

/* Run the conv node's fast kernel (layouts c->layout); Y plain in y (count floats), or 0
 * when not handled. Padding channels of a blocked Y must come out 0. */
static int run_conv(struct one_node *t, const struct conv_case *c, int precision, int threads,
                    struct kiln_weight_cache *wc, float *y, char *name, size_t cap)
{
    struct kiln_node *n = &t->g->nodes[0];
    struct kiln_type types[3], yt;
    const struct kiln_type *ins[3] = {0};
    const kiln_tensor *vals[3] = {0};
    int layouts[3] = {c->layout, 0, 0}, out_layouts[1] = {c->layout};
    for (int i = 0; i < t->n_in; i++) {
        kiln_type_from_tensor(&types[i], t->in[i]);
        ins[i] = &types[i];
        if (i > 0) vals[i] = t->in[i];
    }
    int64_t yd[4] = {c->n, c->cout, c->h, c->w};
    yt = types[0];
    for (int i = 0; i < 4; i++) yt.dims[i] = yd[i];
    struct kiln_weight_cache *own = NULL;
    if (!wc && kiln_weight_cache_new(&own) != KILN_OK) abort();
    const struct kiln_type *outs[1] = {&yt};
    struct kiln_compile_ctx cc = {n, t->n_in, ins, vals, layouts, 1, outs, out_layouts,
                                  wc ? wc : own, threads, precision, 0};
    struct kiln_kernel_inst inst;
    memset(&inst, 0, sizeof inst);
    int ok = 0, b = c->layout;
    int64_t P = c->h * c->w;
    kiln_status st = kiln_fast_op(n->op)->compile(&cc, &inst);
    if (st != KILN_OK) fprintf(stderr, "compile: %s\n", kiln_last_error());
    if (st == KILN_OK && inst.run) {
        snprintf(name, cap, "%s", inst.name);
        int64_t xs[4] = {c->n, b ? (c->cin + b - 1) / b * b : c->cin, c->h, c->w};
        int64_t ys[4] = {c->n, b ? (c->cout + b - 1) / b * b : c->cout, c->h, c->w};
        kiln_tensor *xb = tensor(4, xs), *yb = tensor(4, ys);
        if (b)
            reblock(t->in[0]->data, xb->data, c->n, c->cin, P, b, 0);
        else
            memcpy(xb->data, t->in[0]->data, t->in[0]->nbytes);
        for (int64_t i = 0; i < kiln_tensor_count(yb); i++) ((float *)yb->data)[i] = NAN;
        kiln_tensor *in[3] = {xb, t->n_in > 1 ? t->in[1] : NULL, t->n_in > 2 ? t->in[2] : NULL};
        void *scratch = inst.scratch_bytes ? aligned_alloc(64, (inst.scratch_bytes + 63) / 64 * 64) : NULL;
        struct kiln_run_ctx rc = {.node = n, .n_in = t->n_in, .in = in, .n_out = 1,
                                  .out = &yb, .scratch = scratch, .threads = threads};
        if (inst.run(inst.state, &rc) != KILN_OK) {
            fprintf(stderr, "run: %s\n", kiln_last_error());
        } else {
            ok = 1;
            const float *yy = yb->data;
            if (b) {
                reblock(yy, y, c->n, c->cout, P, b, 1);
                int64_t cb = ys[1] / b;
                for (int64_t i = 0; i < c->n; i++)
                    for (int64_t k = c->cout; k < cb * b; k++)
                        for (int64_t p = 0; p < P; p++)
                            if (yy[((i * cb + k / b) * P + p) * b + k % b] != 0.0f) ok = -1;
            } else {
                memcpy(y, yy, sizeof(float) * (size_t)kiln_tensor_count(yb));
            }
        }
        free(scratch);
        kiln_tensor_free(xb);
        kiln_tensor_free(yb);
    }
    kiln_kernel_inst_destroy(&inst);
    kiln_weight_cache_free(own);
    return ok;
}

/* The reference conv kernel (src/kernels/ref) on the node. */
static kiln_tensor *ref_conv(struct one_node *t, const struct conv_case *c)
{
    int64_t yd[4] = {c->n, c->cout, c->h, c->w};
    kiln_tensor *y = tensor(4, yd);
    struct kiln_run_ctx rc = {.node = &t->g->nodes[0], .n_in = t->n_in, .in = t->in, .n_out = 1,
                              .out = &y, .threads = 1};
    if (kiln_op_impl(t->g->nodes[0].op)->run(&rc) != KILN_OK) abort();
    return y;
}

/* int8 with the dense dynamic path's formulas: X quantized as a whole, W per Cout. */
static void ref_conv_int8(const struct one_node *t, const struct conv_case *c, float *y)
{
    const float *x = t->in[0]->data, *w = t->in[1]->data, *e = c->bias ? t->in[2]->data : NULL;
    int64_t P = c->h * c->w, nx = c->n * c->cin * P;
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < nx; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    float sa = (hi - lo) / 255.0f;
    if (!(sa > 0.0f)) sa = 1.0f;
    float zf = nearbyintf(-lo / sa);
    int32_t zp = zf < 0 ? 0 : zf > 255 ? 255 : (int32_t)zf;
    int32_t *qx = malloc(sizeof(int32_t) * (size_t)nx), *qw = malloc(sizeof(int32_t) * (size_t)c->cin);
    for (int64_t i = 0; i < nx; i++) {
        float q = nearbyintf(x[i] * (1.0f / sa)) + (float)zp;
        qx[i] = q < 0 ? 0 : q > 255 ? 255 : (int32_t)q;
    }
    for (int64_t o = 0; o < c->cout; o++) {
        float mx = 0.0f;
        for (int64_t i = 0; i < c->cin; i++) mx = fmaxf(mx, fabsf(w[o * c->cin + i]));
        float sw = mx > 0.0f ? mx / 127.0f : 1.0f;
        for (int64_t i = 0; i < c->cin; i++) {
            float q = nearbyintf(w[o * c->cin + i] / sw);
            qw[i] = q < -127 ? -127 : q > 127 ? 127 : (int32_t)q;
        }
        for (int64_t n = 0; n < c->n; n++)
            for (int64_t p = 0; p < P; p++) {
                int32_t acc = 0;
                for (int64_t i = 0; i < c->cin; i++) acc += (qx[(n * c->cin + i) * P + p] - zp) * qw[i];
                float v = (float)acc * sw;
                v = v * sa;
                if (e) v = v + e[o];
                if (c->relu && v < 0.0f) v = 0.0f;
                y[(n * c->cout + o) * P + p] = v;
            }
    }
    free(qx);
    free(qw);
}

static void describe_conv(const struct conv_case *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s 1x1 n=%lld cin=%lld cout=%lld %lldx%lld %s %.0f%% zeros bias=%d relu=%d layout=%d",
             c->fused ? "KilnFusedConv" : "Conv", (long long)c->n, (long long)c->cin,
             (long long)c->cout, (long long)c->h, (long long)c->w, cpat_name[c->pat], c->zeros * 100,
             c->bias, c->relu, c->layout);
}

/* fp32 within 1e-5 of the output's scale of the reference conv; int8 bit for bit. */
static void compare_conv(struct one_node *t, const struct conv_case *c, int int8, const float *y,
                         const char *what)
{
    int64_t cnt = c->n * c->cout * c->h * c->w;
    float *want = malloc(sizeof(float) * (size_t)cnt);
    if (int8) {
        ref_conv_int8(t, c, want);
    } else {
        kiln_tensor *r = ref_conv(t, c);
        memcpy(want, r->data, sizeof(float) * (size_t)cnt);
        kiln_tensor_free(r);
    }
    double worst = 0.0, scale = 1.0;
    int64_t bad = -1;
    for (int64_t i = 0; i < cnt; i++) {
        if (fabs(want[i]) > scale) scale = fabs(want[i]);
        double d = isnan(y[i]) ? INFINITY : fabs((double)want[i] - y[i]);
        if (int8 && want[i] != y[i] && bad < 0) bad = i;
        if (d > worst) worst = d;
    }
    CHECK(int8 ? bad < 0 : worst <= 1e-5 * scale, "%s: %s error %g (scale %g)%s", what,
          int8 ? "int8" : "fp32", worst, scale, int8 && bad >= 0 ? " not bit-exact" : "");
    free(want);
}

static void test_convs(void)
{
    static const struct conv_case cases[] = {
        {1, 64, 48, 8, 8, 0.9, C_UNSTR, 0, 0, 0, 0},
        {2, 33, 70, 5, 7, 0.9, C_UNSTR, 0, 1, 0, 0},    /* Cin, Cout % 16, odd HW, batch 2 */
        {3, 17, 5, 1, 1, 0.97, C_UNSTR, 0, 1, 0, 0},    /* HW = 1 */
        {1, 20, 31, 3, 3, 0.5, C_UNSTR, 1, 1, 1, 0},    /* 50% zeros, Relu */
        {2, 64, 40, 9, 9, 0.9, C_1X4, 1, 1, 1, 0},
        {1, 30, 36, 6, 11, 0.97, C_1X4, 0, 0, 0, 0},    /* Cin % 4 */
        {2, 48, 44, 7, 5, 0.9, C_4X1, 1, 1, 1, 0},
        {1, 32, 32, 1, 17, 0.5, C_4X1, 0, 1, 0, 0},
        {2, 40, 33, 5, 6, 0.9, C_UNSTR, 1, 1, 1, 16},   /* blocked X and Y */
        {1, 64, 64, 4, 4, 0.97, C_1X4, 0, 0, 0, 16},
        {2, 16, 50, 7, 7, 0.9, C_UNSTR, 1, 1, 1, 16},   /* whole 16-pixel tiles and a tail */
        {1, 24, 8, 3, 1, 0.9, C_4X1, 1, 1, 0, 8},
    };
    char what[256], name[64];
    setenv("KILN_SPARSE", "force", 1);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const struct conv_case *c = &cases[i];
        struct one_node t;
        build_conv(&t, c);
        describe_conv(c, what, sizeof what);
        int64_t cnt = c->n * c->cout * c->h * c->w;
        float *y = malloc(sizeof(float) * (size_t)cnt);
        for (int prec = 0; prec <= 2; prec += 2)
            for (int threads = 1; threads <= 2; threads++) {
                if (prec == 2 && !g_vnni) continue;
                name[0] = '\0';
                int ok = run_conv(&t, c, prec, threads, NULL, y, name, sizeof name);
                CHECK(ok != 0, "%s: not handled", what);
                CHECK(ok >= 0, "%s: padding channels of blocked Y not 0", what);
                if (!ok) continue;
                /* candidates: at most half the weights nonzero (int8: half the 1x4 blocks;
                 * 50% unstructured zeros leave most of them nonzero) */
                double d4 = kiln_sparse_density(t.in[1]->data, c->cin, c->cout, 1, c->cin, 4);
                int want_sparse = prec == 0 || d4 <= KILN_SPARSE_MAX_DENSITY;
                CHECK((strncmp(name, "sparse_", 7) == 0) == want_sparse, "%s prec=%d: ran on %s", what,
                      prec, name);
                if (want_sparse)
                    CHECK((prec == 2) == (strstr(name, "_int8") != NULL), "%s: %s in precision %d",
                          what, name, prec);
                char w2[400];
                snprintf(w2, sizeof w2, "%s threads=%d on %s", what, threads, name);
                if (want_sparse) compare_conv(&t, c, prec == 2, y, w2);
                else if (prec == 0) compare_conv(&t, c, 0, y, w2);
            }
        free(y);
        kiln_graph_free(t.g);
    }

    /* not candidates: a 3x3 kernel, stride 2 */
    struct conv_case c3 = {1, 16, 16, 6, 6, 0.9, C_UNSTR, 0, 0, 0, 0}; /* given stride 2 */
    struct one_node t3;
    build_conv(&t3, &c3);
    add_attr(&t3, "strides", KILN_ATTR_INTS);
    struct kiln_attr *a = &t3.g->nodes[0].attr[t3.g->nodes[0].n_attr - 1];
    a->n = 2;
    a->ints = kiln_arena_alloc(t3.g->mem, sizeof(int64_t) * 2);
    a->ints[0] = a->ints[1] = 2;
    {
        struct kiln_node *n = &t3.g->nodes[0];
        struct kiln_type types[2], yt;
        const struct kiln_type *ins[2];
        const kiln_tensor *vals[2] = {NULL, t3.in[1]};
        for (int i = 0; i < 2; i++) kiln_type_from_tensor(&types[i], t3.in[i]), ins[i] = &types[i];
        yt = types[0];
        yt.dims[2] = yt.dims[3] = 3;
        const struct kiln_type *outs[1] = {&yt};
        struct kiln_weight_cache *wc3;
        if (kiln_weight_cache_new(&wc3) != KILN_OK) abort();
        struct kiln_compile_ctx cc = {n, 2, ins, vals, NULL, 1, outs, NULL, wc3, 1, 0, 0};
        struct kiln_kernel_inst inst;
        memset(&inst, 0, sizeof inst);
        kiln_status st = kiln_fast_op(n->op)->compile(&cc, &inst);
        CHECK(st == KILN_OK, "stride 2: compile failed: %s", kiln_last_error());
        CHECK(!inst.name || strncmp(inst.name, "sparse_", 7), "a stride-2 conv ran on %s", inst.name);
        kiln_kernel_inst_destroy(&inst);
        kiln_weight_cache_free(wc3);
    }
    kiln_graph_free(t3.g);

    /* the choice, measured: 256 -> 256 on 28x28 at 90% zeros; the same in a second plan */
    unsetenv("KILN_SPARSE");
    struct conv_case cm = {1, 256, 256, 28, 28, 0.9, C_UNSTR, 1, 1, 1, 0};
    struct one_node tm;
    build_conv(&tm, &cm);
    int64_t cnt = cm.n * cm.cout * cm.h * cm.w;
    float *y = malloc(sizeof(float) * (size_t)cnt);
    struct kiln_weight_cache *wc;
    if (kiln_weight_cache_new(&wc) != KILN_OK) abort();
    char first[64];
    CHECK(run_conv(&tm, &cm, 0, 2, wc, y, first, sizeof first) == 1, "auto conv: not handled");
    describe_conv(&cm, what, sizeof what);
    compare_conv(&tm, &cm, 0, y, what);
    CHECK(run_conv(&tm, &cm, 0, 2, wc, y, name, sizeof name) == 1 && !strcmp(name, first),
          "conv: a second plan chose %s, the first %s", name, first);
    printf("auto on a 1x1 conv 256->256 28x28 with 90%% zeros, 2 threads: %s\n", first);
    setenv("KILN_SPARSE", "off", 1);
    CHECK(run_conv(&tm, &cm, 0, 1, NULL, y, name, sizeof name) == 1 && strncmp(name, "sparse_", 7),
          "conv: KILN_SPARSE=off ran on %s", name);
    unsetenv("KILN_SPARSE");
    kiln_weight_cache_free(wc);
    free(y);
    kiln_graph_free(tm.g);
}

int main(void)
{
    g_avx512 = kiln_sparse_isa(0) >= 1;
    g_vnni = kiln_sparse_isa(1) >= 2;
    printf("AVX-512: %s, VNNI: %s\n", g_avx512 ? "yes" : "no", g_vnni ? "yes" : "no");
    test_kernels();
    test_nodes();
    test_convs();
    return CHECK_DONE();
}
