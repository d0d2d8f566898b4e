/*
 * monitor_bins.c - CPU time of the monitor's numeric binning per row of 64
 * float32 features (the tabular MLP's input) with 9 edges each (deciles):
 * the per-value path (monitor.c's observe_feature: isnan / isinf, the
 * range test, kiln_mon_bin's binary search) against the bin plan
 * (src/serve/monitor/binplan.c), portable, AVX-512 and AVX2 (where the CPU
 * has them). Thread CPU time, so a loaded machine inflates it less than the wall
 * clock; the rows are standard normal, as in monitoring_overhead.py.
 *
 *   gcc -O2 -Isrc -Iinclude -Ibuild/gen bench/serve/monitor_bins.c src/serve/monitor/binplan.c \
 *       src/serve/monitor/profile.c src/serve/json.c -Lbuild -lkiln -Wl,-rpath,$PWD/build -lm \
 *       -o /tmp/monitor_bins && /tmp/monitor_bins [rows]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "serve/monitor/binplan.h"
#include "serve/monitor/profile.h"

#define F 64
#define E 9

static double edges[F][E];
static int64_t bins[F * (E + 1)], anom[F * KILN_MON_ANOM_KINDS];

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

__attribute__((noinline)) static void per_value(const float *x, double lo, double hi)
{
    for (int f = 0; f < F; f++) {
        double e = x[f];
        int64_t *an = anom + f * KILN_MON_ANOM_KINDS;
        if (isnan(e)) an[KILN_MON_ANOM_NAN]++;
        else if (isinf(e)) an[KILN_MON_ANOM_INF]++;
        else {
            if (e < lo || e > hi) an[KILN_MON_ANOM_RANGE]++;
            bins[f * (E + 1) + kiln_mon_bin(edges[f], E, e)]++;
        }
    }
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    enum { POOL = 4096 };
    static float rows[POOL * F];
    srand(1);
    for (int i = 0; i < POOL * F; i++) {
        double u1 = (rand() + 1.0) / ((double)RAND_MAX + 1), u2 = rand() / (double)RAND_MAX;
        rows[i] = (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
    }
    static const double dec[E] = {-1.2816, -0.8416, -0.5244, -0.2533, 0, 0.2533, 0.5244, 0.8416, 1.2816};
    kiln_mon_binplan bp;
    if (!kiln_mon_binplan_init(&bp, E)) return 1;
    for (int f = 0; f < F; f++) {
        for (int k = 0; k < E; k++) edges[f][k] = dec[k] + 0.001 * f;
        kiln_mon_binplan_add(&bp, f, f, edges[f], E, -3.5, 3.5, f * (E + 1));
    }
    double t0 = cpu_now();
    for (long i = 0; i < n; i++) per_value(rows + (i % POOL) * F, -3.5, 3.5);
    double t1 = cpu_now();
    for (long i = 0; i < n; i++) kiln_mon_binplan_rows_path(&bp, 0, rows + (i % POOL) * F, 1, F, bins, anom);
    double t2 = cpu_now();
    printf("per row of %d features, %d edges: per value %.1f ns, plan (portable) %.1f ns", F, E,
           (t1 - t0) / (double)n * 1e9, (t2 - t1) / (double)n * 1e9);
    static const char *const names[] = {"portable", "AVX-512", "AVX2"};
    for (int path = KILN_MON_PATH_AVX512; path <= KILN_MON_PATH_AVX2; path++) {
        if (!kiln_mon_binplan_has_path(path)) continue;
        double t3 = cpu_now();
        for (long i = 0; i < n; i++) kiln_mon_binplan_rows_path(&bp, path, rows + (i % POOL) * F, 1, F, bins, anom);
        printf(", plan (%s) %.1f ns", names[path], (cpu_now() - t3) / (double)n * 1e9);
    }
    printf("\n");
    kiln_mon_binplan_free(&bp);
    return bins[0] < 0; /* keeps the counts live */
}
