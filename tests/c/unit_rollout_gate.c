/*
 * unit_rollout_gate.c - the canary gates' statistics (src/serve/rollout/gate.c)
 * against textbook and independently computed values:
 *   - normal quantiles (Abramowitz & Stegun's tables: 1.959964, 1.644854, ...);
 *   - Wilson score intervals and Newcombe's hybrid score intervals for a
 *     difference of proportions: the worked examples of Newcombe (1998),
 *     "Two-sided confidence intervals for the single proportion" (81/263,
 *     15/148, 0/20, 1/29) and "Interval estimation for the difference
 *     between independent proportions", method 10 (56/70 - 48/80,
 *     9/10 - 3/10, 5/56 - 0/29);
 *   - order-statistic ranks bounding a quantile: the textbook 95% interval
 *     of the median of 20 samples (X(6), X(15)), and p99 ranks computed
 *     exactly with Python's math.comb (binomial sums) for n = 298..1000;
 *   - histogram ranks and the window verdicts on windows built by hand.
 */
#include <stdio.h>
#include <string.h>
#include <math.h>

#include "check.h"
#include "serve/rollout/gate.h"

static int near(double a, double b, double tol) { return fabs(a - b) <= tol; }

int main(void)
{
    /* normal quantiles */
    CHECK(near(kiln_gate_norm_quantile(0.975), 1.959963984540054, 1e-9), "%.12f",
          kiln_gate_norm_quantile(0.975));
    CHECK(near(kiln_gate_norm_quantile(0.95), 1.6448536269514722, 1e-9), "%.12f",
          kiln_gate_norm_quantile(0.95));
    CHECK(near(kiln_gate_norm_quantile(0.99), 2.3263478740408408, 1e-9), "%.12f",
          kiln_gate_norm_quantile(0.99));
    CHECK(near(kiln_gate_norm_quantile(0.5), 0.0, 1e-12), "%.12f", kiln_gate_norm_quantile(0.5));
    CHECK(near(kiln_gate_norm_quantile(1e-6), -4.753424308822899, 1e-8), "%.12f",
          kiln_gate_norm_quantile(1e-6));

    /* Wilson score intervals, z = 1.96 (Newcombe 1998a, table I, method 3) */
    double z = kiln_gate_norm_quantile(0.975), lo, hi;
    static const struct { uint64_t x, n; double lo, hi; } w[] = {
        {81, 263, 0.2553, 0.3662}, {15, 148, 0.0624, 0.1605}, {0, 20, 0.0, 0.1611},
        {1, 29, 0.0061, 0.1718}};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        kiln_gate_wilson(w[i].x, w[i].n, z, &lo, &hi);
        CHECK(near(lo, w[i].lo, 5e-5) && near(hi, w[i].hi, 5e-5), "%llu/%llu: %.4f %.4f",
              (unsigned long long)w[i].x, (unsigned long long)w[i].n, lo, hi);
    }
    kiln_gate_wilson(0, 0, z, &lo, &hi);
    CHECK(lo == 0.0 && hi == 1.0, "no data: %g %g", lo, hi);

    /* Newcombe's method 10 (Newcombe 1998b, table II) */
    static const struct { uint64_t x1, n1, x2, n2; double lo, hi; } d[] = {
        {56, 70, 48, 80, 0.0524, 0.3339}, {9, 10, 3, 10, 0.1705, 0.8090},
        {5, 56, 0, 29, -0.0381, 0.1926}};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        kiln_gate_newcombe(d[i].x1, d[i].n1, d[i].x2, d[i].n2, z, &lo, &hi);
        CHECK(near(lo, d[i].lo, 5e-5) && near(hi, d[i].hi, 5e-5), "case %zu: %.4f %.4f", i, lo, hi);
    }

    /* quantile ranks */
    uint64_t rl, rh;
    kiln_gate_quantile_ranks(20, 0.5, 0.975, &rl, &rh);
    CHECK(rl == 6 && rh == 15, "median of 20: %llu %llu", (unsigned long long)rl, (unsigned long long)rh);
    static const struct { uint64_t n, lo, hi; } q[] = {
        {298, 292, 299}, {299, 293, 299}, {300, 294, 300}, {1000, 985, 996}};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        kiln_gate_quantile_ranks(q[i].n, 0.99, 0.95, &rl, &rh);
        CHECK(rl == q[i].lo && rh == q[i].hi, "p99 of %llu: %llu %llu", (unsigned long long)q[i].n,
              (unsigned long long)rl, (unsigned long long)rh);
    }
    /* the normal approximation above 20000 stays close to the exact ranks' scale */
    kiln_gate_quantile_ranks(100000, 0.99, 0.95, &rl, &rh);
    CHECK(rl >= 98940 && rl <= 98960 && rh >= 99040 && rh <= 99060, "p99 of 1e5: %llu %llu",
          (unsigned long long)rl, (unsigned long long)rh);

    /* buckets and histogram ranks */
    CHECK(kiln_gate_bucket_of(5) == 0 && kiln_gate_bucket_of(10) == 0, "small");
    CHECK(kiln_gate_bucket_of(20) == 4, "20 us: %d", kiln_gate_bucket_of(20));
    CHECK(kiln_gate_bucket_of(20.01) == 5, "20.01 us: %d", kiln_gate_bucket_of(20.01));
    CHECK(kiln_gate_bucket_of(1e12) == KILN_GATE_LAT_BUCKETS - 1, "overflow");
    for (double v = 1; v < 1e8; v *= 1.37) {
        int b = kiln_gate_bucket_of(v);
        CHECK(v <= kiln_gate_bucket_bound(b) && (b == 0 || v > kiln_gate_bucket_bound(b - 1)),
              "%g in bucket %d", v, b);
    }
    uint64_t h[KILN_GATE_LAT_BUCKETS] = {0};
    h[4] = 10; /* (16.8, 20] */
    h[8] = 10; /* (33.6, 40] */
    CHECK(near(kiln_gate_hist_rank(h, 10), 20.0, 1e-9), "%g", kiln_gate_hist_rank(h, 10));
    CHECK(near(kiln_gate_hist_rank(h, 15), kiln_gate_bucket_bound(7) + 0.5 * (40 - kiln_gate_bucket_bound(7)), 1e-9),
          "%g", kiln_gate_hist_rank(h, 15));
    CHECK(isinf(kiln_gate_hist_rank(h, 21)), "past the end");

    /* verdicts */
    kiln_gate_params gp = {0.01, 1.5, 0.95, 0.0, 0.0, 0.0};
    uint64_t hc[KILN_GATE_LAT_BUCKETS] = {0}, hb[KILN_GATE_LAT_BUCKETS] = {0};
    hc[20] = 1000;
    hb[20] = 1000;
    kiln_gate_arm c = {1000, 0, hc, NULL, 0}, b = {1000, 0, hb, NULL, 0};
    kiln_gate_result r;
    kiln_gate_evaluate(&gp, &c, &b, &r);
    CHECK(r.verdict == KILN_GATE_PASS, "equal arms: %d %s", r.verdict, r.reason);
    c.errors = 100; /* 10% vs 0% */
    kiln_gate_evaluate(&gp, &c, &b, &r);
    CHECK(r.verdict == KILN_GATE_FAIL && strstr(r.reason, "error rate"), "errors: %d %s", r.verdict,
          r.reason);
    c.requests = 20;
    c.errors = 0; /* too few to tell */
    kiln_gate_evaluate(&gp, &c, &b, &r);
    CHECK(r.verdict == KILN_GATE_HOLD, "few: %d %s", r.verdict, r.reason);
    c.requests = 1000;
    c.errors = 0;
    hc[20] = 0;
    hc[40] = 1000; /* 32x slower */
    kiln_gate_evaluate(&gp, &c, &b, &r);
    CHECK(r.verdict == KILN_GATE_FAIL && strstr(r.reason, "p99"), "slow: %d %s", r.verdict, r.reason);
    gp.p99_slack_us = 20000; /* 10 ms vs 0.3 ms is within 20 ms of slack: passes */
    kiln_gate_evaluate(&gp, &c, &b, &r);
    CHECK(r.verdict == KILN_GATE_PASS, "slack: %d %s", r.verdict, r.reason);
    gp.p99_slack_us = 0;
    gp.max_p99_latency_ratio = -1; /* gate off */
    kiln_gate_evaluate(&gp, &c, &b, &r);
    CHECK(r.verdict == KILN_GATE_PASS, "gate off: %d %s", r.verdict, r.reason);

    /* the agreement gate: Wilson bounds of 81/263 at z = 1.96 are
     * [0.2553, 0.3662] (Newcombe 1998a, table I, as above) */
    kiln_gate_params ga = {0.01, 1.5, 0.975, 0.0, 0.0, 0.0};
    kiln_gate_result ar;
    memset(&ar, 0, sizeof ar);
    ar.verdict = KILN_GATE_PASS;
    kiln_gate_agreement(&ga, 81, 263, &ar); /* off */
    CHECK(ar.verdict == KILN_GATE_PASS && ar.paired == 0, "off: %d", ar.verdict);
    ga.min_agreement = 0.4; /* above the upper bound: fails */
    kiln_gate_agreement(&ga, 81, 263, &ar);
    CHECK(ar.verdict == KILN_GATE_FAIL && strstr(ar.reason, "agreement: top-1 equal on 81 of 263") &&
              near(ar.agree_lo, 0.2553, 5e-5) && near(ar.agree_hi, 0.3662, 5e-5),
          "fail: %d %s %.4f %.4f", ar.verdict, ar.reason, ar.agree_lo, ar.agree_hi);
    memset(&ar, 0, sizeof ar);
    ga.min_agreement = 0.3; /* between the bounds: holds */
    kiln_gate_agreement(&ga, 81, 263, &ar);
    CHECK(ar.verdict == KILN_GATE_HOLD && strstr(ar.reason, "more pairs needed"), "hold: %d %s",
          ar.verdict, ar.reason);
    memset(&ar, 0, sizeof ar);
    ga.min_agreement = 0.25; /* below the lower bound: passes */
    kiln_gate_agreement(&ga, 81, 263, &ar);
    CHECK(ar.verdict == KILN_GATE_PASS, "pass: %d %s", ar.verdict, ar.reason);
    memset(&ar, 0, sizeof ar);
    ar.verdict = KILN_GATE_FAIL; /* another gate failed first: its reason stays */
    snprintf(ar.reason, sizeof ar.reason, "error rate: ...");
    ga.min_agreement = 0.4;
    kiln_gate_agreement(&ga, 81, 263, &ar);
    CHECK(ar.verdict == KILN_GATE_FAIL && strcmp(ar.reason, "error rate: ...") == 0, "kept: %s",
          ar.reason);
    memset(&ar, 0, sizeof ar);
    kiln_gate_agreement(&ga, 0, 0, &ar); /* no pairs yet: holds */
    CHECK(ar.verdict == KILN_GATE_HOLD, "no pairs: %d %s", ar.verdict, ar.reason);

    /* the output divergence gate: 100 rows, half at 0.1 nats and half at
     * 0.3: mean 0.2, sample variance 100 * 0.01 / 99, so at confidence 0.95
     * (z = 1.644854) the bounds are 0.2 -+ 1.644854 * sqrt(1/99) / 10 =
     * [0.183468, 0.216532] */
    kiln_gate_params gd = {0.01, 1.5, 0.95, 0.0, 0.0, 0.0};
    kiln_gate_result dr;
    double js_sum = 50 * 0.1 + 50 * 0.3, js_sq = 50 * 0.01 + 50 * 0.09;
    memset(&dr, 0, sizeof dr);
    kiln_gate_divergence(&gd, 100, js_sum, js_sq, &dr); /* off */
    CHECK(dr.verdict == KILN_GATE_PASS && dr.js_rows == 0, "off: %d", dr.verdict);
    gd.max_output_divergence = 0.15; /* below the lower bound: fails */
    kiln_gate_divergence(&gd, 100, js_sum, js_sq, &dr);
    CHECK(dr.verdict == KILN_GATE_FAIL && strstr(dr.reason, "output divergence: mean Jensen-Shannon") &&
              near(dr.js_mean, 0.2, 1e-12) && near(dr.js_lo, 0.183468, 1e-6) &&
              near(dr.js_hi, 0.216532, 1e-6),
          "fail: %d %s %.6f %.6f", dr.verdict, dr.reason, dr.js_lo, dr.js_hi);
    memset(&dr, 0, sizeof dr);
    gd.max_output_divergence = 0.2; /* between the bounds: holds */
    kiln_gate_divergence(&gd, 100, js_sum, js_sq, &dr);
    CHECK(dr.verdict == KILN_GATE_HOLD && strstr(dr.reason, "more pairs needed"), "hold: %d %s",
          dr.verdict, dr.reason);
    memset(&dr, 0, sizeof dr);
    gd.max_output_divergence = 0.25; /* above the upper bound: passes */
    kiln_gate_divergence(&gd, 100, js_sum, js_sq, &dr);
    CHECK(dr.verdict == KILN_GATE_PASS, "pass: %d %s", dr.verdict, dr.reason);
    memset(&dr, 0, sizeof dr);
    /* 29 identical rows (variance 0) are still too few to judge */
    kiln_gate_divergence(&gd, KILN_GATE_MIN_DIVERGENCE_ROWS - 1, 0.0, 0.0, &dr);
    CHECK(dr.verdict == KILN_GATE_HOLD && strstr(dr.reason, "needed before"), "few: %d %s",
          dr.verdict, dr.reason);
    memset(&dr, 0, sizeof dr);
    kiln_gate_divergence(&gd, KILN_GATE_MIN_DIVERGENCE_ROWS, 0.0, 0.0, &dr);
    CHECK(dr.verdict == KILN_GATE_PASS && dr.js_hi == 0.0, "equal: %d %s", dr.verdict, dr.reason);
    memset(&dr, 0, sizeof dr);
    dr.verdict = KILN_GATE_FAIL; /* a failure already there stays */
    snprintf(dr.reason, sizeof dr.reason, "error rate: ...");
    gd.max_output_divergence = 0.15;
    kiln_gate_divergence(&gd, 100, js_sum, js_sq, &dr);
    CHECK(dr.verdict == KILN_GATE_FAIL && strcmp(dr.reason, "error rate: ...") == 0, "kept: %s",
          dr.reason);

    /* another bucket layout (Prometheus' le bounds): the same ranks */
    static const double le[] = {100, 200, 400, INFINITY};
    uint64_t hp[4] = {50, 40, 9, 1};
    kiln_gate_arm pa = {100, 0, hp, le, 4};
    CHECK(near(kiln_gate_arm_rank(&pa, 50), 100.0, 1e-9), "%g", kiln_gate_arm_rank(&pa, 50));
    CHECK(near(kiln_gate_arm_rank(&pa, 70), 150.0, 1e-9), "%g", kiln_gate_arm_rank(&pa, 70));
    CHECK(near(kiln_gate_arm_rank(&pa, 100), 400.0, 1e-9), "overflow: %g", kiln_gate_arm_rank(&pa, 100));
    return CHECK_DONE();
}
