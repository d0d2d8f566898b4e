/*
 * binplan.h - the monitor's fast path for the common case: numeric
 * features that are the columns of one float32 rank-2 input (a tabular
 * model's [batch, F] features). A plan, built once per version from its
 * profile, bins every row of the input in one pass over its columns,
 * without a branch or a division per feature:
 *
 * - A float32 value's bits map to an int32 key whose order is the order of
 *   the values (-0 just below +0); each bin edge e (a double) becomes the
 *   key of the smallest float that is >= e, so for every finite float v,
 *   edges[k] <= v exactly when key(v) >= thr[k]. The bin, the number of
 *   edges <= v, is then a sum of integer comparisons over the padded
 *   edges; NaN and infinities are recognized from the bits, and the range
 *   of the validation rule (or of the reference) is two more comparisons.
 *   Integer keys make the result independent of the FPU's flush-to-zero
 *   and denormals-are-zero modes.
 * - Features are lanes: with AVX-512 16 of them per instruction, with
 *   AVX2 8 (the CPU's, from __builtin_cpu_supports when the plan is
 *   built), else a portable loop over blocks of 16 lanes that compilers
 *   vectorize with the baseline ISA.
 *
 * The result equals kiln_mon_bin on (double)v and the plain path's NaN,
 * infinity and range counts (tests/c/unit_monitor_binplan.c checks both
 * paths on bin edges, their neighbouring floats, signed zeros, subnormals,
 * NaN, infinities and values out of range).
 */
#ifndef KILN_SERVE_MONITOR_BINPLAN_H
#define KILN_SERVE_MONITOR_BINPLAN_H

#include <stdint.h>

/* Anomaly counters per feature, in this order (monitor.c's too). */
enum { KILN_MON_ANOM_MISSING, KILN_MON_ANOM_NAN, KILN_MON_ANOM_INF, KILN_MON_ANOM_RANGE,
       KILN_MON_ANOM_KINDS };

#define KILN_MON_PLAN_LANES 64 /* features per plan at most (KILN_MON_MAX_COLUMNS) */
#define KILN_MON_PLAN_BLOCK 16 /* lanes per block (one AVX-512 register of int32) */

/* The ways to bin a row (kiln_mon_binplan_rows_path). */
enum { KILN_MON_PATH_PORTABLE, KILN_MON_PATH_AVX512, KILN_MON_PATH_AVX2 };

typedef struct kiln_mon_binplan {
    int n;                      /* features (lanes in use) */
    int lanes;                  /* n rounded up to KILN_MON_PLAN_BLOCK */
    int n_thr;                  /* thresholds per lane (the most edges of a feature) */
    int min_width;              /* rows must have at least this many columns */
    int path;                   /* KILN_MON_PATH_*: the best this CPU has */
    int contiguous;             /* col[i] == col[0] + i: a row's values are one copy */
    int32_t col[KILN_MON_PLAN_LANES];   /* column of each lane's feature */
    int32_t feat[KILN_MON_PLAN_LANES];  /* the feature (its index in the profile) */
    int32_t base[KILN_MON_PLAN_LANES];  /* offset of the feature's counts in a slot */
    int32_t lo[KILN_MON_PLAN_LANES];    /* out of range: key < lo or key > hi */
    int32_t hi[KILN_MON_PLAN_LANES];
    int32_t *thr;               /* [n_thr][lanes]; unused thresholds are INT32_MAX */
} kiln_mon_binplan;

/* The int32 key of a float32's bits (ordered as the values, -0 < +0). */
static inline int32_t kiln_mon_key(uint32_t bits)
{
    return (int32_t)(bits ^ ((0u - (bits >> 31)) & 0x7fffffffu)); /* negatives: magnitude flipped */
}
/* Thresholds: for every finite float v, (double)v >= e exactly when
 * key(v) >= kiln_mon_key_ge(e), and (double)v <= e exactly when
 * key(v) <= kiln_mon_key_le(e). e may be infinite (not NaN). */
int32_t kiln_mon_key_ge(double e);
int32_t kiln_mon_key_le(double e);

/* An empty plan (n = 0); 0 when out of memory (thr is allocated for up to
 * max_edges thresholds per lane). */
int kiln_mon_binplan_init(kiln_mon_binplan *bp, int max_edges);
void kiln_mon_binplan_free(kiln_mon_binplan *bp);
/* Add a feature: column col, edges[0..n_edges) (n_edges <= max_edges),
 * range [lo, hi] (doubles, may be infinite), counts at offset base.
 * Returns 0 when the plan is full. */
int kiln_mon_binplan_add(kiln_mon_binplan *bp, int feat, int col, const double *edges,
                         int n_edges, double lo, double hi, int base);
/* Bin rows x[r * width + col] (r < rows; width >= min_width): adds 1 to
 * bins[base + bin] of each finite value and counts NaN, infinities and
 * values out of range in anom[feat * KILN_MON_ANOM_KINDS + kind]. */
void kiln_mon_binplan_rows(const kiln_mon_binplan *bp, const float *x, int64_t rows,
                           int64_t width, int64_t *bins, int64_t *anom);
/* The same with a chosen path (tests, bench/serve/monitor_bins.c): a
 * KILN_MON_PATH_*, only where the CPU has it (kiln_mon_binplan_has_path). */
void kiln_mon_binplan_rows_path(const kiln_mon_binplan *bp, int path, const float *x,
                                int64_t rows, int64_t width, int64_t *bins, int64_t *anom);
int kiln_mon_binplan_has_path(int path);
int kiln_mon_binplan_has_avx512(void); /* kiln_mon_binplan_has_path(KILN_MON_PATH_AVX512) */

#endif
