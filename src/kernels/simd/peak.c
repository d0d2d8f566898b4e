/*
 * peak.c - the measured fp32 FMA throughput that the profile reports shares of.
 *
 * Every thread of one kiln_parallel_for runs the SIMD table's register-only FMA loop for
 * about 20 ms; the total work over the region's wall time, best of three, is the peak.
 * Measured rather than computed from a clock and a port count, so that it holds under a
 * hypervisor and frequency scaling. It is the peak of the SIMD table in use: with KILN_ISA
 * lowered, oneDNN's kernels (which do not follow it) can show shares above 100%, and the
 * scalar table's "FMA" rounds through double, so only the native ISA's shares mean much.
 */
#include <stdatomic.h>
#include <time.h>

#include "core/threadpool.h"
#include "kernels/simd/simd.h"

struct peak_job {
    const struct simd_kernels *k;
    int64_t iters;
    _Atomic float sink;
};

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void peak_range(void *arg, int64_t begin, int64_t end)
{
    struct peak_job *j = arg;
    for (int64_t u = begin; u < end; u++) atomic_store(&j->sink, j->k->fma_loop(j->iters));
}

double simd_fma_peak_gflops(int threads)
{
    if (threads < 1) threads = 1;
    struct peak_job j = {.k = simd_kernels_for(), .iters = 1 << 14};
    atomic_init(&j.sink, 0.0f);
    /* calibrate on one thread: double until a loop takes 2 ms, then aim at 20 ms */
    double t;
    for (;;) {
        double t0 = seconds();
        peak_range(&j, 0, 1);
        t = seconds() - t0;
        if (t >= 2e-3 || j.iters >= (int64_t)1 << 40) break;
        j.iters *= 2;
    }
    j.iters = (int64_t)((double)j.iters * (20e-3 / (t > 0 ? t : 1e-3)));
    if (j.iters < 1) j.iters = 1;
    double best = 0.0;
    for (int r = 0; r < 3; r++) {
        double t0 = seconds();
        kiln_parallel_for(threads, threads, 1, peak_range, &j);
        double dt = seconds() - t0;
        double g = (double)threads * (double)j.iters * j.k->fma_loop_flops / dt * 1e-9;
        if (g > best) best = g;
    }
    return best;
}
