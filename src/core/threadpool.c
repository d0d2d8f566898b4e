/*
 * threadpool.c - the process-wide intra-op thread pool and CPU facts.
 *
 * The pool is OpenMP's (libgomp): oneDNN on this platform is built with the
 * OpenMP runtime, so by running Kiln's own kernels in OpenMP parallel
 * regions as well, both share one set of worker threads and never
 * oversubscribe the cores. kiln_parallel_for opens a parallel region of the
 * requested size and splits [0, n) statically, one contiguous chunk per
 * thread; with one thread (or a small n, or when already inside a parallel
 * region) it calls fn inline with no synchronization at all.
 *
 * Leases: libgomp keeps one team of workers per thread that opens parallel
 * regions, so two requests running on two server threads would each bring
 * a full team and fight over the cores. kiln_threads_acquire therefore
 * hands the whole machine to one run at a time: the first run gets
 * min(wanted, cpus) threads, runs that start while it holds the lease get 1
 * (their own thread; their kernels then never open a parallel region). The
 * grant is also written into the calling thread's OpenMP nthreads ICV
 * (omp_set_num_threads), which is what bounds oneDNN's teams on that thread.
 *
 * Idle workers: between parallel regions libgomp's workers wait on a
 * barrier. With OMP_WAIT_POLICY unset they spin for GOMP_SPINCOUNT
 * iterations (300,000 by default, well under a millisecond; libgomp uses
 * 1,000 when there are more threads than CPUs) and then sleep on a futex,
 * so an idle process uses no CPU. OMP_WAIT_POLICY=active (or a huge
 * GOMP_SPINCOUNT) would make them spin for a long time: do not set it for a
 * server. Kiln sets neither. tests/c/unit_simd.c checks that a process idle
 * after parallel work uses ~0 CPU.
 *
 * On a machine shared with other busy processes, spinning itself costs:
 * a worker that spins at a barrier uses up its time slice and is then late
 * for the next region. Measured on 2 cores at load average 10, a 2-thread
 * region over 786k floats took 30-50 ms with the default spin and 0.1 ms
 * with GOMP_SPINCOUNT=0 (OMP_WAIT_POLICY=passive). libgomp reads these
 * once at load, so they can only be set in the environment of the process.
 */
#define _GNU_SOURCE
#include "core/threadpool.h"

#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* CPUs allowed by a cgroup v2 quota ("max 100000" = none), or 0 if unknown. */
static int cgroup_cpu_limit(void)
{
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
    if (!f) return 0;
    char quota[32] = {0};
    long long period = 0;
    int n = fscanf(f, "%31s %lld", quota, &period);
    fclose(f);
    if (n != 2 || strcmp(quota, "max") == 0 || period <= 0) return 0;
    long long q = atoll(quota);
    if (q <= 0) return 0;
    return (int)((q + period - 1) / period);
}

int kiln_cpu_count(void)
{
    static atomic_int cached;
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c > 0) return c;
    /* The CPUs the process may use as libgomp counted them at start-up. The
     * calling thread's own mask is not that: with OMP_PROC_BIND set, libgomp
     * binds the initial thread to its first place (one CPU) before main. */
    c = omp_get_num_procs();
    cpu_set_t set;
    CPU_ZERO(&set);
    if (c <= 0 && sched_getaffinity(0, sizeof set, &set) == 0) c = CPU_COUNT(&set);
    if (c <= 0) c = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int lim = cgroup_cpu_limit();
    if (lim > 0 && lim < c) c = lim;
    if (c <= 0) c = 1;
    atomic_store_explicit(&cached, c, memory_order_relaxed);
    return c;
}

/* The best ISA of the CPU, probed once. */
static enum kiln_isa cpu_isa_hw(void)
{
    static atomic_int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v >= 0) return (enum kiln_isa)v;
    __builtin_cpu_init();
    v = KILN_ISA_SCALAR;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) v = KILN_ISA_AVX2;
    if (v == KILN_ISA_AVX2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512dq"))
        v = KILN_ISA_AVX512;
    atomic_store_explicit(&cached, v, memory_order_relaxed);
    return (enum kiln_isa)v;
}

/* The hardware's ISA, lowered by KILN_ISA. The environment is read on every
 * call (kernels call this at compile time only), so tests can compile the
 * same node once per ISA by setting KILN_ISA in between. */
enum kiln_isa kiln_cpu_isa(void)
{
    enum kiln_isa hw = cpu_isa_hw();
    const char *e = getenv("KILN_ISA");
    if (!e || !*e) return hw;
    enum kiln_isa want = hw;
    if (strcmp(e, "scalar") == 0) want = KILN_ISA_SCALAR;
    else if (strcmp(e, "avx2") == 0) want = KILN_ISA_AVX2;
    else if (strcmp(e, "avx512") == 0) want = KILN_ISA_AVX512;
    return want < hw ? want : hw;
}

void kiln_threads_unpin_caller(void)
{
    if (omp_get_proc_bind() == omp_proc_bind_false) return;
    /* the process's CPUs are the union of OpenMP's places (built from the
     * mask libgomp saw at start-up) */
    cpu_set_t set;
    CPU_ZERO(&set);
    int places = omp_get_num_places();
    for (int p = 0; p < places; p++) {
        int n = omp_get_place_num_procs(p);
        if (n <= 0) continue;
        int *ids = malloc((size_t)n * sizeof *ids);
        if (!ids) return;
        omp_get_place_proc_ids(p, ids);
        for (int i = 0; i < n; i++)
            if (ids[i] >= 0 && ids[i] < CPU_SETSIZE) CPU_SET(ids[i], &set);
        free(ids);
    }
    if (CPU_COUNT(&set) > 0) (void)sched_setaffinity(0, sizeof set, &set);
}

/* 1 while a run holds the pool's lease. */
static atomic_int pool_leased;

int kiln_threads_acquire(int wanted)
{
    int all = kiln_cpu_count();
    int granted = wanted <= 0 || wanted > all ? all : wanted;
    if (granted > 1) {
        int expected = 0;
        if (!atomic_compare_exchange_strong(&pool_leased, &expected, 1)) granted = 1;
    }
    omp_set_num_threads(granted);
    return granted;
}

void kiln_threads_release(int granted)
{
    /* only a grant of more than one thread holds the lease */
    if (granted > 1) atomic_store(&pool_leased, 0);
}

/* One parallel region; thread i of nt runs the i-th of nt equal chunks. */
void kiln_parallel_for(int threads, int64_t n, int64_t grain, kiln_range_fn fn, void *ctx)
{
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t max_chunks = n / grain;
    int t = threads;
    if (t > max_chunks) t = (int)max_chunks;
    if (t <= 1 || omp_in_parallel()) {
        fn(ctx, 0, n);
        return;
    }
#pragma omp parallel num_threads(t)
    {
        int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
        int64_t begin = n * id / nt, end = n * (id + 1) / nt;
        if (begin < end) fn(ctx, begin, end);
    }
}

void kiln_parallel_team(int threads, kiln_team_fn fn, void *ctx)
{
    if (threads <= 1 || omp_in_parallel()) {
        fn(ctx, 0, 1);
        return;
    }
#pragma omp parallel num_threads(threads)
    fn(ctx, omp_get_thread_num(), omp_get_num_threads());
}

void kiln_team_barrier(int nt)
{
    if (nt <= 1) return;
#pragma omp barrier
}
