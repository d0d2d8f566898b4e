/*
 * compare.h - the statistics that compare a shadow target's outputs with
 * the primary's (docs/SHADOW.md): top-1 agreement for class outputs, mean
 * absolute and mean relative difference, and the Jensen-Shannon divergence
 * of probability outputs, per request and summed over many requests.
 *
 * A compared output is seen as rows: its first dimension is the batch and
 * each row holds the product of the other dimensions (k values; a rank-1
 * output has k = 1, a scalar is one row of one value). Per row:
 *
 *   top-1      k > 1: the index of the largest value (the first one on
 *              ties, a NaN counting as largest, as numpy.argmax); k = 1 in
 *              an integer, bool or string output: the value itself (a
 *              class id). The row agrees when both sides have the same.
 *   |diff|     per element |s - p| (s: shadow, p: primary).
 *   rel diff   per element |s - p| / max(|s|, |p|), 0 when both are 0: a
 *              symmetric relative difference in [0, 2], defined at zero.
 *   JS         when both rows are probability vectors (k >= 2, every value
 *              finite and >= 0, the sum within KILN_SHADOW_PROB_TOL of 1),
 *              each divided by its sum, m = (p + s) / 2:
 *              JS = 1/2 sum p ln(p/m) + 1/2 sum s ln(s/m), in nats, in
 *              [0, ln 2], 0 ln 0 = 0. Rows that are not probability vectors
 *              (logits, scores) are counted, never softmaxed.
 *
 * Elements where either side is NaN or infinite are not summed into the
 * differences: equal ones (both NaN, or the same infinity) count as equal,
 * others as non-finite mismatches.
 */
#ifndef KILN_SERVE_SHADOW_COMPARE_H
#define KILN_SERVE_SHADOW_COMPARE_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#define KILN_SHADOW_PROB_TOL 1e-3 /* |row sum - 1| for a probability row */

typedef enum kiln_shadow_compare_mode {
    KILN_SHADOW_COMPARE_AUTO = 0,      /* top-1 where it applies, differences, JS on
                                          probability rows */
    KILN_SHADOW_COMPARE_CLASS,         /* top-1 only (k = 1: equal values) */
    KILN_SHADOW_COMPARE_PROBABILITIES, /* top-1, differences and JS */
    KILN_SHADOW_COMPARE_VALUES,        /* differences only */
} kiln_shadow_compare_mode;

/* Sums over compared rows and elements; ratios are taken when reported. */
typedef struct kiln_shadow_stats {
    int64_t requests;       /* comparisons summed */
    int64_t rows;           /* rows compared */
    int64_t top1_rows;      /* rows with a top-1 on both sides */
    int64_t top1_agree;     /* ... of which the top-1 agrees */
    int64_t values;         /* element pairs in the differences */
    double sum_abs;         /* sum of |s - p| */
    double sum_rel;         /* sum of |s - p| / max(|s|, |p|) */
    double max_abs;         /* largest |s - p| */
    int64_t nonfinite;      /* element pairs NaN or infinite on one side only */
    int64_t js_rows;        /* rows that are probability vectors on both sides */
    double sum_js;          /* sum of their JS divergences (nats) */
    double sum_js2;         /* sum of their squares (the canary's divergence gate) */
    int64_t nonprob_rows;   /* rows with k >= 2 not probability vectors on both sides */
} kiln_shadow_stats;

/* Parse a mode name ("" and "auto", "class", "probabilities", "values");
 * -1 if unknown. */
int kiln_shadow_compare_mode_parse(const char *name);
const char *kiln_shadow_compare_mode_name(kiln_shadow_compare_mode m);

/*
 * Compare one request's outputs: primary p and shadow s, row by row, into
 * *out (cleared first; out->requests = 1). Fails with KILN_ERR_INVALID_ARGUMENT
 * and a message in err (errlen bytes) when the two cannot be paired: a
 * different number of rows or of values per row, a string output against a
 * numeric one, or a dtype that is not compared (float8, float4, int4/int2).
 */
kiln_status kiln_shadow_compare(kiln_shadow_compare_mode mode, const kiln_tensor *p,
                                const kiln_tensor *s, kiln_shadow_stats *out, char *err,
                                size_t errlen);

/* acc += s (max_abs: the larger). */
void kiln_shadow_stats_add(kiln_shadow_stats *acc, const kiln_shadow_stats *s);

/* Jensen-Shannon divergence (nats) of two probability vectors of k values,
 * each normalized by its sum; the caller checks they are probability rows. */
double kiln_shadow_js_divergence(const double *p, const double *q, int64_t k);

/* 1 when the k values are a probability vector as defined above. */
int kiln_shadow_is_probability_row(const double *v, int64_t k);

#endif
