/*
 * unit_simd.c - Kiln's thread pool (core/threadpool.c) and the SIMD
 * tables' own GEMM, transpose and tanh (src/kernels/simd/) against double
 * references. The ops' fast kernels (the kernel families) are tested by
 * unit_kernels.c from their lists.
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

/* A team passes 50 times: in pass p each thread writes its slot of p's row,
 * then, after the barrier, reads every slot of that row; a missing barrier or
 * a thread that runs ahead reads a slot not yet written. */
#define TEAM_PASSES 50
struct team_ctx {
    atomic_int vals[TEAM_PASSES][8];
    atomic_int bad, calls, nt_seen;
};

static void team_fn(void *arg, int tid, int nt)
{
    struct team_ctx *c = arg;
    atomic_fetch_add(&c->calls, 1);
    atomic_store(&c->nt_seen, nt);
    for (int p = 0; p < TEAM_PASSES; p++) {
        atomic_store(&c->vals[p][tid], p * 10 + tid + 1);
        kiln_team_barrier(nt);
        for (int t = 0; t < nt; t++)
            if (atomic_load(&c->vals[p][t]) != p * 10 + t + 1) atomic_fetch_add(&c->bad, 1);
    }
}

static void team_outer_fn(void *arg, int64_t begin, int64_t end)
{
    for (int64_t i = begin; i < end; i++) kiln_parallel_team(2, team_fn, (struct team_ctx *)arg + i);
}

static void test_parallel_team(void)
{
    const int threads[] = {0, 1, 2, 4};
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        struct team_ctx *c = calloc(1, sizeof *c);
        kiln_parallel_team(threads[t], team_fn, c);
        int want = threads[t] < 1 ? 1 : threads[t];
        CHECK(atomic_load(&c->bad) == 0, "parallel_team %d threads: %d reads before the barrier",
              threads[t], atomic_load(&c->bad));
        CHECK(atomic_load(&c->calls) == atomic_load(&c->nt_seen) && atomic_load(&c->calls) >= 1 &&
              atomic_load(&c->calls) <= want,
              "parallel_team %d threads: %d calls, nt %d", threads[t], atomic_load(&c->calls),
              atomic_load(&c->nt_seen));
        if (threads[t] == 2 && kiln_cpu_count() >= 2)
            CHECK(atomic_load(&c->nt_seen) == 2, "parallel_team 2 threads: a team of %d",
                  atomic_load(&c->nt_seen));
        free(c);
    }
    /* inside another region each team is its caller alone, and its barriers do not
     * wait on the outer region's threads (two teams, different pass counts would hang) */
    struct team_ctx *c2 = calloc(2, sizeof *c2);
    kiln_parallel_for(2, 2, 1, team_outer_fn, c2);
    for (int i = 0; i < 2; i++)
        CHECK(atomic_load(&c2[i].calls) == 1 && atomic_load(&c2[i].nt_seen) == 1 &&
              atomic_load(&c2[i].bad) == 0, "parallel_team in a region: calls %d nt %d",
              atomic_load(&c2[i].calls), atomic_load(&c2[i].nt_seen));
    free(c2);
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


/* ---- The tables' GEMM and transpose ---- */

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

/* ---- Benchmark ---- */

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
                                  layouts, NULL, threads, 0, 0};
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

/* The tables' tanh (a rational function on AVX2 and AVX-512, tools/fit_tanh.py; libm on the
 * scalar table) within 6 ulp of double tanh over every 7th float of [2^-30, 10], both signs,
 * and right on the special values (+-0 keep their sign, +-inf within 1 ulp of +-1). */
static void test_table_tanh(void)
{
    const struct simd_kernels *tables[3] = {&kiln_simd_scalar, &kiln_simd_avx2, &kiln_simd_avx512};
    enum { N = 1 << 16 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    float lo_f = ldexpf(1.0f, -30), hi_f = 10.0f;
    uint32_t lo, hi;
    memcpy(&lo, &lo_f, 4);
    memcpy(&hi, &hi_f, 4);
    for (int t = 0; t < isa_levels(); t++) {
        double worst = 0;
        float worst_x = 0;
        for (int sign = 0; sign < 2; sign++)
            for (uint64_t u = lo; u <= hi;) {
                int n = 0;
                for (; n < N && u <= hi; n++, u += 7) {
                    uint32_t v = (uint32_t)u | (sign ? 0x80000000u : 0);
                    memcpy(&x[n], &v, 4);
                }
                tables[t]->unary(SIMD_TANH, 0, 0, x, y, n);
                for (int i = 0; i < n; i++) {
                    double r = tanh((double)x[i]);
                    float rf = fabsf((float)r);
                    double ulp = (double)(nextafterf(rf, INFINITY) - rf);
                    double e = fabs((double)y[i] - r) / ulp;
                    if (e > worst) {
                        worst = e;
                        worst_x = x[i];
                    }
                }
            }
        CHECK(worst <= 6.0, "tanh %s: %.2f ulp at x = %.9g", tables[t]->isa, worst,
              (double)worst_x);
        float sx[6] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 30.0f}, sy[6];
        tables[t]->unary(SIMD_TANH, 0, 0, sx, sy, 6);
        CHECK(sy[0] == 0.0f && !signbit(sy[0]) && sy[1] == 0.0f && signbit(sy[1]) &&
                  sy[2] >= 0.9999999f && sy[2] <= 1.0f && sy[3] <= -0.9999999f && sy[3] >= -1.0f && isnan(sy[4]) && sy[5] >= 0.9999999f && sy[5] <= 1.0f,
              "tanh %s special values: %g %g %g %g %g %g", tables[t]->isa, (double)sy[0],
              (double)sy[1], (double)sy[2], (double)sy[3], (double)sy[4], (double)sy[5]);
        printf("tanh %s: at most %.2f ulp\n", tables[t]->isa, worst);
    }
    free(x);
    free(y);
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
    test_parallel_team();
    test_lease();
    test_gemm();
    test_table_transpose();
    test_table_tanh();
    test_idle();
    kiln_threads_release(g);
    return CHECK_DONE();
}
