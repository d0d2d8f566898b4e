/*
 * unit_simd.c - Kiln's thread pool (core/threadpool.c) and the SIMD f32
 * kernels outside the kernel families (src/kernels/simd/: attention,
 * recurrent layers, the tables' GEMM and transpose),
 * differentially against the reference kernels (kernel_case.h). The
 * families' kernels (elementwise, norm, copy, reduce) are tested by unit_kernels.c
 * from their lists.
 *
 * `unit_simd --bench` times fast vs reference kernels on BERT-base shapes.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernel_case.h"

/* ---- Thread pool ---- */

struct cover_ctx {
    atomic_int *hits;
    int64_t grain, n;
    atomic_int short_chunks, calls;
};

static void cover_fn(void *arg, int64_t begin, int64_t end)
{
    struct cover_ctx *c = arg;
    atomic_fetch_add(&c->calls, 1);
    if (end - begin < c->grain && end - begin != c->n) atomic_fetch_add(&c->short_chunks, 1);
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void test_parallel_for(void)
{
    const int64_t ns[] = {0, 1, 7, 1000, 100003};
    const int64_t grains[] = {1, 100, 1 << 20};
    const int threads[] = {1, 2, 4};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof grains / sizeof grains[0]; b++)
            for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
                int64_t n = ns[a];
                struct cover_ctx c = {.hits = calloc((size_t)n + 1, sizeof(atomic_int)), .grain = grains[b], .n = n};
                kiln_parallel_for(threads[t], n, grains[b], cover_fn, &c);
                int64_t bad = -1;
                for (int64_t i = 0; i < n && bad < 0; i++)
                    if (atomic_load(&c.hits[i]) != 1) bad = i;
                CHECK(bad < 0, "parallel_for n=%lld grain=%lld threads=%d: element %lld hit %d "
                      "times", (long long)n, (long long)grains[b], threads[t], (long long)bad,
                      bad >= 0 ? atomic_load(&c.hits[bad]) : 0);
                CHECK(atomic_load(&c.short_chunks) == 0, "parallel_for: chunk below grain");
                CHECK(atomic_load(&c.calls) <= threads[t], "parallel_for: %d calls for %d threads",
                      atomic_load(&c.calls), threads[t]);
                free(c.hits);
            }
}

struct lease_arg {
    int granted;
};
static void *lease_thread(void *p)
{
    struct lease_arg *a = p;
    a->granted = kiln_threads_acquire(0);
    kiln_threads_release(a->granted);
    return NULL;
}

static void test_lease(void)
{
    int cpus = kiln_cpu_count();
    CHECK(cpus >= 1, "kiln_cpu_count = %d", cpus);
    int g = kiln_threads_acquire(0);
    CHECK(g == cpus, "first lease: granted %d of %d cpus", g, cpus);
    struct lease_arg a = {0};
    pthread_t th;
    pthread_create(&th, NULL, lease_thread, &a);
    pthread_join(th, NULL);
    CHECK(a.granted == 1, "concurrent lease granted %d threads, expected 1", a.granted);
    kiln_threads_release(g);
    pthread_create(&th, NULL, lease_thread, &a);
    pthread_join(th, NULL);
    CHECK(a.granted == cpus, "lease after release granted %d, expected %d", a.granted, cpus);
    g = kiln_threads_acquire(1);
    CHECK(g == 1, "acquire(1) granted %d", g);
    kiln_threads_release(g);
    g = kiln_threads_acquire(cpus + 100);
    CHECK(g == cpus, "acquire(cpus + 100) granted %d", g);
    kiln_threads_release(g);

    /* ISA: KILN_ISA only lowers */
    unsetenv("KILN_ISA");
    enum kiln_isa hw = kiln_cpu_isa();
    setenv("KILN_ISA", "scalar", 1);
    CHECK(kiln_cpu_isa() == KILN_ISA_SCALAR, "KILN_ISA=scalar ignored");
    setenv("KILN_ISA", "avx512", 1);
    CHECK(kiln_cpu_isa() <= hw, "KILN_ISA raised the ISA");
    unsetenv("KILN_ISA");
}

static void spin_fn(void *arg, int64_t begin, int64_t end)
{
    volatile double *acc = arg;
    double s = 0;
    for (int64_t i = begin; i < end; i++) s += sqrt((double)i);
    if (begin == 0) *acc = s;
}

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* After parallel work, an idle process must not burn CPU (workers sleep). */
static void test_idle(void)
{
    const char *policy = getenv("OMP_WAIT_POLICY");
    if (policy && (policy[0] == 'a' || policy[0] == 'A')) {
        printf("idle check skipped: OMP_WAIT_POLICY=%s\n", policy);
        return;
    }
    volatile double acc = 0;
    for (int r = 0; r < 20; r++) kiln_parallel_for(2, 1 << 20, 1024, spin_fn, (void *)&acc);
    struct timespec nap = {0, 50 * 1000 * 1000};
    nanosleep(&nap, NULL); /* let the spin phase end */
    double c0 = cpu_seconds();
    nap.tv_nsec = 300 * 1000 * 1000;
    nanosleep(&nap, NULL);
    double used = cpu_seconds() - c0;
    printf("idle: %.1f ms of CPU in 300 ms asleep after parallel work\n", used * 1e3);
    CHECK(used < 0.03, "idle process used %.1f ms of CPU in 300 ms", used * 1e3);
}


/* ---- Attention ---- */

/* mask_kind: 0 none, 1 f32 [SQ, mcols], 2 bool [B, 1, SQ, T], 3 causal. */
static void attention_case(bool four_d, int64_t B, int64_t SQ, int64_t T, int64_t HQ, int64_t HK,
                           int64_t E, int mask_kind, int64_t mcols)
{
    struct case_node c;
    cn_init(&c, KILN_OP_Attention, 23, mask_kind == 1 || mask_kind == 2 ? 4 : 3, 1);
    if (!four_d) {
        attr_int(&c, "q_num_heads", HQ);
        attr_int(&c, "kv_num_heads", HK);
    }
    if (mask_kind == 3) attr_int(&c, "is_causal", 1);
    if (E == 16) attr_float(&c, "scale", 0.3f);
    kiln_tensor *t[3];
    for (int i = 0; i < 3; i++) {
        int64_t S = i == 0 ? SQ : T, H = i == 0 ? HQ : HK;
        int64_t d3[3] = {B, S, H * E}, d4[4] = {B, H, S, E};
        t[i] = four_d ? tensor_f32(4, d4) : tensor_f32(3, d3);
        for (size_t k = 0; k < t[i]->nbytes / 4; k++) ((float *)t[i]->data)[k] = rng_normal();
        cn_input(&c, i, t[i], false);
    }
    if (mask_kind == 1) {
        int64_t dm[2] = {SQ, mcols};
        kiln_tensor *m = tensor_f32(2, dm);
        for (size_t k = 0; k < m->nbytes / 4; k++)
            ((float *)m->data)[k] = rng_next() % 5 == 0 ? -INFINITY : rng_uniform(-2, 2);
        for (int64_t r = 0; r < SQ; r++) ((float *)m->data)[r * mcols] = 0.0f; /* no empty row */
        cn_input(&c, 3, m, false);
    } else if (mask_kind == 2) {
        int64_t dm[4] = {B, 1, SQ, T};
        kiln_tensor *m;
        if (kiln_tensor_new(KILN_DTYPE_BOOL, 4, dm, &m) != KILN_OK) abort();
        uint8_t *pm = m->data;
        for (size_t k = 0; k < m->nbytes; k++) pm[k] = rng_next() % 3 != 0;
        for (int64_t r = 0; r < B * SQ; r++) pm[r * T] = 1;
        cn_input(&c, 3, m, false);
    }
    char label[160];
    snprintf(label, sizeof label, "Attention %s B%lld SQ%lld T%lld HQ%lld HK%lld E%lld mask %d",
             four_d ? "4-D" : "3-D", (long long)B, (long long)SQ, (long long)T, (long long)HQ,
             (long long)HK, (long long)E, mask_kind);
    check_case(&c, label, 1e-4, 1e-5, 1);
    cn_free(&c);
}

/* KilnAttention (opt/attention_views.c): Q, K and V read in place from [B, S, N] or [S, B, N]
 * (seq_first) at column offsets (packed: N = 3 * H * E); Y [B, S, .] / [S, B, .] / rows merged.
 * mask_kind: 0 none, 1 [B, 1, 1, T], 2 [SQ, T], 3 [B * H, SQ, T] merged, 4 [B * H, 1, T] merged. */
static void kiln_attention_case(bool seq_first, bool packed, int ysf, int merge, int64_t B,
                                int64_t SQ, int64_t T, int64_t H, int64_t E, int mask_kind)
{
    struct case_node c;
    cn_init(&c, KILN_OP_KilnAttention, 1, mask_kind ? 4 : 3, 1);
    attr_int(&c, "num_heads", H);
    attr_int(&c, "head_size", E);
    attr_int(&c, "v_head_size", E);
    attr_float(&c, "scale", 0.35f);
    attr_int(&c, "seq_first", seq_first);
    attr_int(&c, "y_seq_first", ysf);
    attr_int(&c, "y_merge_rows", merge);
    attr_int(&c, "mask_merged", mask_kind >= 3);
    int64_t N = packed ? 3 * H * E + 5 : H * E;
    static const char *off[3] = {"q_offset", "k_offset", "v_offset"};
    for (int i = 0; i < 3; i++) {
        int64_t S = i == 0 ? SQ : T;
        int64_t d[3] = {seq_first ? S : B, seq_first ? B : S, N};
        kiln_tensor *t = tensor_f32(3, d);
        for (size_t k = 0; k < t->nbytes / 4; k++) ((float *)t->data)[k] = rng_normal();
        cn_input(&c, i, t, false);
        attr_int(&c, off[i], packed ? i * H * E + 1 : 0);
    }
    if (mask_kind) {
        int64_t dm[4][4] = {{B, 1, 1, T}, {SQ, T}, {B * H, SQ, T}, {B * H, 1, T}};
        int rank[4] = {4, 2, 3, 3};
        kiln_tensor *m = tensor_f32(rank[mask_kind - 1], dm[mask_kind - 1]);
        for (size_t k = 0; k < m->nbytes / 4; k++)
            ((float *)m->data)[k] = rng_next() % 5 == 0 ? -INFINITY : rng_uniform(-2, 2);
        for (size_t k = 0; k < m->nbytes / 4; k += (size_t)T) ((float *)m->data)[k] = 0.0f;
        cn_input(&c, 3, m, false);
    }
    char label[160];
    snprintf(label, sizeof label, "KilnAttention sf%d packed%d ysf%d merge%d B%lld SQ%lld T%lld "
             "H%lld E%lld mask %d", seq_first, packed, ysf, merge, (long long)B, (long long)SQ,
             (long long)T, (long long)H, (long long)E, mask_kind);
    check_case(&c, label, 1e-4, 1e-5, 1);
    cn_free(&c);
}

/* The tables' small GEMM (attention's products) against a double reference: sizes below,
 * at and above the register tiles (4 rows x 4 vectors; 8 x 2 where n is at most 4 vectors)
 * and the vector width, row strides wider than the rows. */
static void test_gemm(void)
{
    const struct simd_kernels *tables[3] = {&kiln_simd_scalar, &kiln_simd_avx2, &kiln_simd_avx512};
    static const int64_t ms[] = {1, 3, 4, 5, 7, 8, 9, 17, 64},
                         ns[] = {1, 7, 8, 16, 17, 48, 64, 65, 128}, ks[] = {1, 8, 64, 129};
    for (int t = 0; t < isa_levels(); t++)
        for (int im = 0; im < 9; im++)
            for (int in = 0; in < 9; in++)
                for (int ik = 0; ik < 4; ik++) {
                    int64_t m = ms[im], n = ns[in], k = ks[ik];
                    int64_t lda = k + 3, ldb = n + 5, ldc = n + 2;
                    float *a = malloc(sizeof(float) * (size_t)(m * lda));
                    float *b = malloc(sizeof(float) * (size_t)(k * ldb));
                    float *c = malloc(sizeof(float) * (size_t)(m * ldc));
                    for (int64_t i = 0; i < m * lda; i++) a[i] = rng_normal();
                    for (int64_t i = 0; i < k * ldb; i++) b[i] = rng_normal();
                    for (int64_t i = 0; i < m * ldc; i++) c[i] = NAN;
                    tables[t]->gemm(m, n, k, 0.5f, a, lda, b, ldb, c, ldc);
                    double worst = 0.0;
                    int untouched = 0;
                    for (int64_t i = 0; i < m; i++) {
                        for (int64_t j = 0; j < n; j++) {
                            double ref = 0.0, mag = 0.0;
                            for (int64_t p = 0; p < k; p++) {
                                ref += (double)a[i * lda + p] * b[p * ldb + j];
                                mag += fabs((double)a[i * lda + p] * b[p * ldb + j]);
                            }
                            double e = fabs(c[i * ldc + j] - 0.5 * ref) / (0.5 * mag + 1e-30);
                            if (!(e <= worst)) worst = e; /* NaN counts as worst */
                        }
                        for (int64_t j = n; j < ldc; j++) untouched += isnan(c[i * ldc + j]) != 0;
                    }
                    CHECK(worst <= 1e-5, "gemm %s m%lld n%lld k%lld: error %g of the magnitude",
                          tables[t]->isa, (long long)m, (long long)n, (long long)k, worst);
                    CHECK(untouched == (int)(m * (ldc - n)), "gemm %s m%lld n%lld k%lld wrote "
                          "past its columns", tables[t]->isa, (long long)m, (long long)n,
                          (long long)k);
                    free(a);
                    free(b);
                    free(c);
                }
}

/* The tables' transpose (attention's keys) against the definition: sizes below, at and
 * above the register tile (W x W) on both axes, strides wider than the rows, and nothing
 * written outside the destination's rows. */
static void test_table_transpose(void)
{
    const struct simd_kernels *tables[3] = {&kiln_simd_scalar, &kiln_simd_avx2, &kiln_simd_avx512};
    static const int64_t sizes[] = {1, 5, 8, 15, 16, 17, 33, 64, 128};
    for (int t = 0; t < isa_levels(); t++)
        for (int ir = 0; ir < 9; ir++)
            for (int ic = 0; ic < 9; ic++) {
                int64_t rows = sizes[ir], cols = sizes[ic], lds = cols + 3, ldd = rows + 2;
                float *src = malloc(sizeof(float) * (size_t)(rows * lds));
                float *dst = malloc(sizeof(float) * (size_t)(cols * ldd));
                for (int64_t i = 0; i < rows * lds; i++) src[i] = (float)i;
                for (int64_t i = 0; i < cols * ldd; i++) dst[i] = NAN;
                tables[t]->transpose(rows, cols, src, lds, dst, ldd);
                int64_t wrong = 0, touched = 0;
                for (int64_t c = 0; c < cols; c++) {
                    for (int64_t r = 0; r < rows; r++) wrong += dst[c * ldd + r] != src[r * lds + c];
                    for (int64_t r = rows; r < ldd; r++) touched += !isnan(dst[c * ldd + r]);
                }
                CHECK(wrong == 0 && touched == 0, "transpose %s %lldx%lld: %lld wrong, %lld "
                      "written past the rows", tables[t]->isa, (long long)rows, (long long)cols,
                      (long long)wrong, (long long)touched);
                free(src);
                free(dst);
            }
}

static void test_attention(void)
{
    /* BERT's shape: 64-wide heads, 128 positions, an additive mask (full register tiles) */
    attention_case(false, 1, 128, 128, 2, 2, 64, 1, 128);
    const int64_t seqs[] = {1, 7, 17, 70};
    for (int s = 0; s < 4; s++) {
        int64_t S = seqs[s];
        attention_case(false, 2, S, S, 4, 2, 8, 0, 0);
        attention_case(false, 1, S, S + 3, 4, 4, 16, 1, S + 3);
        attention_case(false, 1, S, S + 3, 2, 1, 8, 1, S);       /* short mask: -inf padding */
        attention_case(false, 2, S, S, 4, 2, 8, 2, 0);
        attention_case(false, 2, S, S, 4, 2, 8, 3, 0);
        attention_case(true, 2, S, S + 1, 4, 2, 8, 0, 0);
    }
    /* declined: softcap */
    struct case_node c;
    cn_init(&c, KILN_OP_Attention, 23, 3, 1);
    attr_float(&c, "softcap", 5.0f);
    int64_t d4[4] = {1, 2, 3, 4};
    for (int i = 0; i < 3; i++) cn_input(&c, i, tensor_f32(4, d4), false);
    check_case(&c, "Attention softcap (declined)", 1e-4, 1e-5, 0);
    cn_free(&c);
    for (int s = 0; s < 4; s++) {
        int64_t S = seqs[s];
        for (int mk = 0; mk <= 4; mk++) {
            kiln_attention_case(mk % 2, mk != 2, mk % 2, 0, 2, S, S, 4, 8, mk);
            kiln_attention_case(mk % 2 == 0, true, 0, 1, 3, S, S + 2, 2, 16, mk == 2 ? 0 : mk);
        }
        kiln_attention_case(true, true, 1, 1, 2, S, S, 1, 32, 0); /* one head */
    }
}

/* ---- Benchmark ---- */

/* ---- Recurrent layers (rnn.c) ---- */

static void attr_strs(struct case_node *c, const char *name, const char *const *v, int n)
{
    struct kiln_attr *a = cn_attr(c, name, KILN_ATTR_STRINGS);
    a->n = n;
    a->strings = kiln_arena_alloc(c->g->mem, sizeof(kiln_string) * (size_t)n);
    for (int i = 0; i < n; i++) {
        a->strings[i].data = kiln_arena_strdup(c->g->mem, v[i]);
        a->strings[i].len = strlen(v[i]);
    }
}
static void attr_floats(struct case_node *c, const char *name, const float *v, int n)
{
    struct kiln_attr *a = cn_attr(c, name, KILN_ATTR_FLOATS);
    a->n = n;
    a->floats = kiln_arena_alloc(c->g->mem, sizeof(float) * (size_t)n);
    memcpy(a->floats, v, sizeof(float) * (size_t)n);
}

static kiln_tensor *rnn_random(int rank, const int64_t *dims, float scale)
{
    kiln_tensor *t = tensor_f32(rank, dims);
    for (size_t k = 0; k < t->nbytes / 4; k++) ((float *)t->data)[k] = scale * rng_uniform(-1, 1);
    return t;
}

enum { RNN_LENS = 1, RNN_INIT = 2, RNN_LAYOUT1 = 4, RNN_PEEP = 8, RNN_YH_ONLY = 16,
       RNN_NO_BIAS = 32, RNN_W_INPUT = 64 };

struct rnn_extra {
    const char *const *acts; /* NULL = the defaults */
    int n_acts;
    const float *alpha, *beta;
    int n_alpha, n_beta;
    float clip;              /* 0 = none */
    int input_forget;
};

/* One RNN / GRU / LSTM node against the reference. gates: 1, 3 or 4. */
static void rnn_case(enum kiln_op op, const char *dir, int lbr, int64_t T, int64_t B, int64_t I,
                     int64_t H, int flags, const struct rnn_extra *x)
{
    const int lstm = op == KILN_OP_LSTM, G = op == KILN_OP_RNN ? 1 : op == KILN_OP_GRU ? 3 : 4;
    const int64_t ND = strcmp(dir, "bidirectional") == 0 ? 2 : 1;
    const int layout = flags & RNN_LAYOUT1 ? 1 : 0;
    int n_in = lstm ? 8 : 6, n_out = lstm ? 3 : 2;
    struct case_node c;
    cn_init(&c, op, 14, n_in, n_out);
    attr_str(&c, "direction", dir);
    attr_int(&c, "hidden_size", H);
    if (layout) attr_int(&c, "layout", 1);
    if (op == KILN_OP_GRU) attr_int(&c, "linear_before_reset", lbr);
    if (x && x->acts) attr_strs(&c, "activations", x->acts, x->n_acts);
    if (x && x->n_alpha) attr_floats(&c, "activation_alpha", x->alpha, x->n_alpha);
    if (x && x->n_beta) attr_floats(&c, "activation_beta", x->beta, x->n_beta);
    if (x && x->clip > 0) attr_float(&c, "clip", x->clip);
    if (x && x->input_forget) attr_int(&c, "input_forget", 1);
    float ws = 1.0f / sqrtf((float)H);
    int64_t dx[3] = {layout ? B : T, layout ? T : B, I}, dw[3] = {ND, G * H, I},
            dr[3] = {ND, G * H, H}, db[2] = {ND, 2 * G * H}, dh[3] = {layout ? B : ND,
                                                                       layout ? ND : B, H},
            dp[2] = {ND, 3 * H};
    kiln_tensor *X = tensor_f32(3, dx);
    for (size_t k = 0; k < X->nbytes / 4; k++) ((float *)X->data)[k] = rng_normal();
    cn_input(&c, 0, X, false);
    cn_input(&c, 1, rnn_random(3, dw, ws), !(flags & RNN_W_INPUT));
    cn_input(&c, 2, rnn_random(3, dr, ws), !(flags & RNN_W_INPUT));
    cn_input(&c, 3, flags & RNN_NO_BIAS ? NULL : rnn_random(2, db, 0.5f), !(flags & RNN_W_INPUT));
    kiln_tensor *L = NULL;
    if (flags & RNN_LENS) {
        int64_t dl[1] = {B};
        if (kiln_tensor_new(KILN_DTYPE_I32, 1, dl, &L) != KILN_OK) abort();
        for (int64_t b = 0; b < B; b++) /* every length from 0 to T, T first */
            ((int32_t *)L->data)[b] = (int32_t)((T - b % (T + 1) + T + 1) % (T + 1));
    }
    cn_input(&c, 4, L, false);
    cn_input(&c, 5, flags & RNN_INIT ? rnn_random(3, dh, 1.0f) : NULL, false);
    if (lstm) {
        cn_input(&c, 6, flags & RNN_INIT ? rnn_random(3, dh, 1.0f) : NULL, false);
        cn_input(&c, 7, flags & RNN_PEEP ? rnn_random(2, dp, 0.5f) : NULL, !(flags & RNN_W_INPUT));
    }
    for (int k = 0; k < n_out; k++) c.out_wanted[k] = !(flags & RNN_YH_ONLY) || k == 1;
    char label[200];
    snprintf(label, sizeof label, "%s %s%s T%lld B%lld I%lld H%lld flags %#x%s%s", kiln_op_name(op),
             dir, op == KILN_OP_GRU ? (lbr ? " lbr1" : " lbr0") : "", (long long)T, (long long)B,
             (long long)I, (long long)H, flags, x && x->acts ? " acts " : "",
             x && x->acts ? x->acts[0] : "");
    check_case(&c, label, 1e-4, 2e-5, 1);
    cn_free(&c);
}

/* Every direction and cell (GRU with both linear_before_reset values), with and without
 * sequence lengths (every length from 0 to T) and initial states, both layouts, batch 1 and
 * more, hidden sizes below, at and above the vector widths, and a size large enough that
 * two threads split the GEMM and the steps; then peepholes, input_forget, clip, every
 * activation function, per-direction activation lists, and weights known only at run time. */
static void test_rnn(void)
{
    static const char *const dirs[] = {"forward", "reverse", "bidirectional"};
    static const struct {
        int64_t T, B, I, H;
        int flags;
    } shapes[] = {
        {5, 1, 3, 7, 0},
        {4, 3, 5, 8, RNN_LENS | RNN_INIT},
        {3, 5, 8, 17, RNN_LENS | RNN_INIT | RNN_LAYOUT1},
        {6, 2, 4, 16, RNN_INIT | RNN_NO_BIAS},
        {2, 4, 6, 33, RNN_LENS | RNN_YH_ONLY},
        {3, 8, 20, 260, RNN_LENS | RNN_INIT},
    };
    static const struct {
        enum kiln_op op;
        int lbr;
    } cells[] = {{KILN_OP_RNN, 0}, {KILN_OP_GRU, 0}, {KILN_OP_GRU, 1}, {KILN_OP_LSTM, 0}};
    for (size_t ci = 0; ci < sizeof cells / sizeof cells[0]; ci++)
        for (int d = 0; d < 3; d++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                rnn_case(cells[ci].op, dirs[d], cells[ci].lbr, shapes[si].T, shapes[si].B,
                         shapes[si].I, shapes[si].H, shapes[si].flags, NULL);

    rnn_case(KILN_OP_LSTM, "bidirectional", 0, 4, 3, 5, 17, RNN_LENS | RNN_INIT | RNN_PEEP, NULL);
    struct rnn_extra fg = {.input_forget = 1};
    rnn_case(KILN_OP_LSTM, "forward", 0, 4, 2, 5, 9, RNN_INIT | RNN_PEEP, &fg);
    struct rnn_extra clip = {.clip = 0.4f};
    rnn_case(KILN_OP_LSTM, "reverse", 0, 4, 2, 5, 9, RNN_INIT, &clip);
    rnn_case(KILN_OP_GRU, "bidirectional", 1, 4, 2, 5, 9, RNN_INIT, &clip);
    rnn_case(KILN_OP_GRU, "forward", 0, 4, 2, 5, 9, RNN_INIT, &clip);

    static const char *const fns[] = {"Relu",      "Tanh",     "Sigmoid",    "Affine",
                                      "LeakyRelu", "ThresholdedRelu",        "ScaledTanh",
                                      "HardSigmoid", "Elu",    "Softsign",   "Softplus"};
    static const float al[] = {0.7f, 0.3f}, be[] = {0.2f, 0.6f};
    for (int f = 0; f < 11; f++) {
        struct rnn_extra e = {.acts = &fns[f], .n_acts = 1, .alpha = al, .n_alpha = 1,
                              .beta = be, .n_beta = 1};
        rnn_case(KILN_OP_RNN, "forward", 0, 3, 2, 4, 9, RNN_INIT, &e);
    }
    static const char *const gru_acts[] = {"HardSigmoid", "Softsign", "Sigmoid", "ScaledTanh"};
    struct rnn_extra ge = {.acts = gru_acts, .n_acts = 4, .alpha = al, .n_alpha = 2,
                           .beta = be, .n_beta = 2};
    rnn_case(KILN_OP_GRU, "bidirectional", 1, 3, 2, 4, 9, RNN_INIT, &ge);
    rnn_case(KILN_OP_GRU, "bidirectional", 0, 3, 2, 4, 9, RNN_INIT, &ge);
    static const char *const lstm_acts[] = {"Sigmoid", "Elu", "Softplus"};
    struct rnn_extra le = {.acts = lstm_acts, .n_acts = 3, .alpha = al, .n_alpha = 1};
    rnn_case(KILN_OP_LSTM, "bidirectional", 0, 3, 2, 4, 9, RNN_INIT, &le);
    /* weights that are graph inputs (as in the ONNX node tests): packed by each run */
    rnn_case(KILN_OP_LSTM, "bidirectional", 0, 3, 2, 4, 9, RNN_W_INPUT | RNN_PEEP | RNN_LENS, NULL);
    rnn_case(KILN_OP_GRU, "forward", 0, 3, 2, 4, 17, RNN_W_INPUT | RNN_INIT, NULL);
    rnn_case(KILN_OP_GRU, "reverse", 1, 3, 2, 4, 17, RNN_W_INPUT | RNN_INIT, NULL);
    rnn_case(KILN_OP_RNN, "forward", 0, 3, 2, 4, 5, RNN_W_INPUT | RNN_NO_BIAS, NULL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Median-free simple timing: best of reps. */
static double time_ref(struct case_node *c, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        kiln_tensor *out[MAX_IO];
        double t0 = now_s();
        run_ref(c, out);
        double t = now_s() - t0;
        free_outs(out, c->n_out);
        if (t < best) best = t;
    }
    return best;
}

static double time_fast(struct case_node *c, int threads, int reps, char *name)
{
    const struct kiln_fast_op *f = kiln_fast_op(c->node->op);
    struct kiln_type types[MAX_IO], in_t[MAX_IO];
    cn_infer(c, types);
    const struct kiln_type *in_p[MAX_IO], *out_p[MAX_IO];
    const kiln_tensor *in_v[MAX_IO];
    int layouts[MAX_IO] = {0};
    for (int i = 0; i < c->n_in; i++) {
        in_v[i] = c->is_const[i] ? c->in[i] : NULL;
        in_p[i] = NULL;
        if (c->in[i]) {
            kiln_type_from_tensor(&in_t[i], c->in[i]);
            in_p[i] = &in_t[i];
        }
    }
    for (int k = 0; k < c->n_out; k++) out_p[k] = c->out_wanted[k] ? &types[k] : NULL;
    struct kiln_compile_ctx cc = {c->node, c->n_in, in_p, in_v, layouts, c->n_out, out_p,
                                  layouts, NULL, threads, 0};
    struct kiln_kernel_inst inst = {0};
    if (f->compile(&cc, &inst) != KILN_OK || !inst.run) return -1;
    snprintf(name, 64, "%s", inst.name);
    kiln_tensor *out[MAX_IO] = {0};
    for (int k = 0; k < c->n_out; k++)
        if (c->out_wanted[k])
            kiln_tensor_new_uninit(types[k].dtype, types[k].rank, types[k].dims, &out[k]);
    void *scratch = inst.scratch_bytes ? aligned_alloc(64, (inst.scratch_bytes + 63) / 64 * 64)
                                       : NULL;
    struct kiln_run_ctx rc = {.node = c->node, .n_in = c->n_in, .in = c->in, .n_out = c->n_out,
                              .out = out, .scratch = scratch, .threads = threads};
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        inst.run(inst.state, &rc);
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    free(scratch);
    free_outs(out, c->n_out);
    kiln_kernel_inst_destroy(&inst);
    return best;
}

static void bench_one(struct case_node *c, const char *label)
{
    double tr = time_ref(c, 3);
    char name[64] = "";
    int cpus = kiln_cpu_count();
    double t1 = time_fast(c, 1, 20, name), tn = time_fast(c, cpus, 20, name);
    printf("%-34s ref %8.3f ms | %-28s 1 thread %7.3f ms (x%5.1f) | %d threads %7.3f ms "
           "(x%5.1f)\n",
           label, tr * 1e3, name, t1 * 1e3, tr / t1, cpus, tn * 1e3, tr / tn);
}

static void bench(void)
{
    int64_t d[3] = {8, 128, 768}, h = 768;
    struct case_node c;
    cn_init(&c, KILN_OP_Gelu, 20, 1, 1);
    kiln_tensor *x = tensor_f32(3, d);
    for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal();
    cn_input(&c, 0, x, false);
    bench_one(&c, "Gelu [8,128,768]");
    cn_free(&c);

    cn_init(&c, KILN_OP_Softmax, 13, 1, 1);
    x = tensor_f32(3, d);
    for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal();
    cn_input(&c, 0, x, false);
    bench_one(&c, "Softmax [8,128,768] axis -1");
    cn_free(&c);

    cn_init(&c, KILN_OP_LayerNormalization, 17, 3, 1);
    x = tensor_f32(3, d);
    for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal();
    kiln_tensor *sc = tensor_f32(1, &h), *bi = tensor_f32(1, &h);
    for (int i = 0; i < 768; i++) ((float *)sc->data)[i] = 1.0f;
    cn_input(&c, 0, x, false);
    cn_input(&c, 1, sc, true);
    cn_input(&c, 2, bi, true);
    bench_one(&c, "LayerNormalization [8,128,768]");
    cn_free(&c);

    cn_init(&c, KILN_OP_Add, 14, 2, 1);
    x = tensor_f32(3, d);
    cn_input(&c, 0, x, false);
    cn_input(&c, 1, tensor_f32(1, &h), true);
    bench_one(&c, "Add [8,128,768] + [768]");
    cn_free(&c);

    cn_init(&c, KILN_OP_Attention, 23, 3, 1);
    attr_int(&c, "q_num_heads", 12);
    attr_int(&c, "kv_num_heads", 12);
    int64_t dq[3] = {1, 128, 768};
    for (int i = 0; i < 3; i++) {
        kiln_tensor *t = tensor_f32(3, dq);
        for (size_t k = 0; k < t->nbytes / 4; k++) ((float *)t->data)[k] = rng_normal();
        cn_input(&c, i, t, false);
    }
    bench_one(&c, "Attention B1 S128 12x64");
    cn_free(&c);

    cn_init(&c, KILN_OP_Attention, 23, 4, 1);
    attr_int(&c, "q_num_heads", 4);
    attr_int(&c, "kv_num_heads", 4);
    int64_t db[3] = {8, 128, 256}, dm[4] = {8, 1, 1, 128};
    for (int i = 0; i < 3; i++) {
        kiln_tensor *t = tensor_f32(3, db);
        for (size_t k = 0; k < t->nbytes / 4; k++) ((float *)t->data)[k] = rng_normal();
        cn_input(&c, i, t, false);
    }
    cn_input(&c, 3, tensor_f32(4, dm), false);
    bench_one(&c, "Attention B8 S128 4x64 mask");
    cn_free(&c);
}

int main(int argc, char **argv)
{
    /* this thread's OpenMP (and oneDNN) team: one thread unless a test asks for more */
    int g = kiln_threads_acquire(1);
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        kiln_threads_release(g);
        g = kiln_threads_acquire(1);
        bench();
        return 0;
    }
    printf("cpus %d, isa %s\n", kiln_cpu_count(), isa_names[isa_levels() - 1]);
    test_parallel_for();
    test_lease();
    test_gemm();
    test_table_transpose();
    test_attention();
    test_rnn();
    test_idle();
    printf("%d fast-kernel runs in place\n", inplace_runs);
    kiln_threads_release(g);
    return CHECK_DONE();
}
