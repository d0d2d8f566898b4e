/*
 * gate.h - the statistics of a canary's gates, in one place, with no
 * dependency on the server: the in-process controller (rollout.c) feeds it
 * windows of its own counters; a controller reading Prometheus could feed
 * it the same numbers from a fleet.
 *
 * A window has, for each arm (the candidate and the baseline), a count of
 * requests, a count of errors and a latency histogram with fixed
 * log-spaced buckets (KILN_GATE_LAT_BUCKETS; bucket i holds latencies up to
 * kiln_gate_bucket_bound(i) microseconds, the last one everything above).
 * Each gate answers PASS (the candidate is good with the configured
 * confidence), FAIL (it is worse with that confidence) or HOLD (the data
 * cannot tell yet: more requests are needed), and the window's verdict is
 * FAIL if any gate fails, PASS if all pass, else HOLD (Argo Rollouts'
 * "inconclusive").
 *
 *   error rate   Newcombe's hybrid score interval for the difference of two
 *                proportions (Newcombe 1998, method 10), built from the two
 *                arms' Wilson score intervals, one-sided at `confidence`:
 *                FAIL when its lower bound exceeds max_error_rate_increase,
 *                PASS when its upper bound does not. Well defined with no
 *                errors at all (unlike the Wald test).
 *   p99 latency  distribution-free confidence bounds of each arm's 99th
 *                percentile: order statistics whose ranks come from the
 *                binomial distribution (exact up to 20000 requests, the
 *                normal approximation above), read from the histogram by
 *                linear interpolation within a bucket. FAIL when the
 *                candidate's lower bound exceeds max_p99_latency_ratio times
 *                the baseline's upper bound and exceeds it by more than
 *                p99_slack_us; PASS when the candidate's upper bound is
 *                within the ratio, or within the slack, of the baseline's
 *                lower bound.
 *
 * Two gates need paired outputs (a shadow of the baseline's traffic on the
 * candidate) and are folded in afterwards: agreement (kiln_gate_agreement)
 * and output divergence (kiln_gate_divergence).
 */
#ifndef KILN_SERVE_ROLLOUT_GATE_H
#define KILN_SERVE_ROLLOUT_GATE_H

#include <stdint.h>

#define KILN_GATE_LAT_BUCKETS 100 /* 96 log buckets 10 us .. ~140 s, 4 per octave, then overflow */

typedef enum kiln_gate_verdict { KILN_GATE_PASS = 0, KILN_GATE_HOLD = 1, KILN_GATE_FAIL = 2 } kiln_gate_verdict;

typedef struct kiln_gate_arm {
    uint64_t requests;                    /* every run, failed or not */
    uint64_t errors;                      /* runs whose code was not OK */
    const uint64_t *hist;                 /* n_buckets counts, or NULL */
    /* The histogram's bucket upper bounds (us, increasing; the last may be
     * +inf) and their number: NULL / 0 for Kiln's own layout
     * (KILN_GATE_LAT_BUCKETS, kiln_gate_bucket_bound), or another layout,
     * e.g. Prometheus' le bounds of kiln_request_latency_us_bucket. */
    const double *bounds;
    int n_buckets;
} kiln_gate_arm;

typedef struct kiln_gate_params {
    double max_error_rate_increase;       /* < 0: gate off */
    double max_p99_latency_ratio;         /* <= 0: gate off */
    double confidence;                    /* one-sided, in (0.5, 1) */
    double p99_slack_us;                  /* absolute slack of the p99 gate (>= 0) */
    double min_agreement;                 /* top-1 agreement gate (kiln_gate_agreement);
                                             <= 0: off */
    double max_output_divergence;         /* mean JS divergence gate (nats,
                                             kiln_gate_divergence); <= 0: off */
} kiln_gate_params;

/* Pairs fewer than this never decide the divergence gate (it holds): the
 * normal approximation of the mean needs them. */
#define KILN_GATE_MIN_DIVERGENCE_ROWS 30

typedef struct kiln_gate_result {
    kiln_gate_verdict verdict;
    char reason[320];                     /* why it failed or holds ("" on pass) */
    double err_candidate, err_baseline;   /* observed error rates */
    double diff_lo, diff_hi;              /* one-sided bounds of candidate - baseline */
    double p99_candidate, p99_baseline;   /* point estimates (us), 0 without data */
    uint64_t paired, agree;               /* agreement gate: rows compared, top-1 equal */
    double agree_lo, agree_hi;            /* one-sided Wilson bounds of the agreement */
    uint64_t js_rows;                     /* divergence gate: probability rows paired */
    double js_mean, js_lo, js_hi;         /* their mean JS divergence (nats) and its
                                             one-sided bounds (0, 0, ln 2 without rows) */
} kiln_gate_result;

/* Upper bound (us) of bucket i (the overflow bucket: +inf). */
double kiln_gate_bucket_bound(int i);
/* The bucket a latency falls in. */
int kiln_gate_bucket_of(double latency_us);
/* The standard normal quantile (inverse CDF) at p in (0, 1). */
double kiln_gate_norm_quantile(double p);
/* Wilson score interval of x successes in n at normal quantile z ([0, 1]
 * when n is 0). */
void kiln_gate_wilson(uint64_t x, uint64_t n, double z, double *lo, double *hi);
/* Newcombe's hybrid score interval for p1 - p2 at normal quantile z. */
void kiln_gate_newcombe(uint64_t x1, uint64_t n1, uint64_t x2, uint64_t n2, double z, double *lo,
                        double *hi);
/* Ranks (1-based) of the order statistics bounding the p-quantile of n
 * samples, each one-sided with confidence conf: *lo = the largest r with
 * P(X_(r) <= q_p) >= conf (0: no lower bound), *hi = the smallest s with
 * P(X_(s) >= q_p) >= conf (n + 1: no upper bound). */
void kiln_gate_quantile_ranks(uint64_t n, double p, double conf, uint64_t *lo, uint64_t *hi);
/* The value of rank r (1-based) of a histogram with n samples, interpolated
 * linearly within its bucket (0 for r = 0, +inf past the last sample; the
 * overflow bucket's lower edge for a rank in it). */
double kiln_gate_hist_rank(const uint64_t *hist, uint64_t r);
/* The same over an arm's own bucket layout. */
double kiln_gate_arm_rank(const kiln_gate_arm *a, uint64_t r);
/* The window's verdict. */
void kiln_gate_evaluate(const kiln_gate_params *p, const kiln_gate_arm *candidate,
                        const kiln_gate_arm *baseline, kiln_gate_result *out);
/*
 * The agreement gate, folded into a verdict kiln_gate_evaluate made: of
 * `paired` rows the baseline answered and the candidate also ran (a shadow
 * of the baseline's traffic on the candidate), `agree` had the same top-1.
 * With the Wilson score interval of agree/paired, one-sided at the
 * confidence: FAIL when its upper bound is below min_agreement, HOLD
 * while its lower bound is (more pairs needed), else it passes. Off when
 * p->min_agreement <= 0. A FAIL already in out stays, with its reason.
 */
void kiln_gate_agreement(const kiln_gate_params *p, uint64_t agree, uint64_t paired,
                         kiln_gate_result *out);

/*
 * The output divergence gate, folded in the same way: of `rows` probability
 * rows the baseline answered and the candidate also ran, the JS divergences
 * (nats, in [0, ln 2]) sum to sum_js and their squares to sum_js2. The
 * mean's one-sided bounds at the confidence come from the normal
 * approximation with the sample variance, mean -+ z s / sqrt(rows), clamped
 * to [0, ln 2]: FAIL when the lower bound exceeds max_output_divergence,
 * PASS when the upper bound does not, else HOLD; below
 * KILN_GATE_MIN_DIVERGENCE_ROWS rows it holds. Off when
 * p->max_output_divergence <= 0. A FAIL already in out stays.
 */
void kiln_gate_divergence(const kiln_gate_params *p, uint64_t rows, double sum_js, double sum_js2,
                          kiln_gate_result *out);

#endif
