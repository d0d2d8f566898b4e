/*
 * gate.c - the canary gates' statistics (gate.h): Wilson and Newcombe
 * intervals for error rates, binomial order-statistic bounds of the p99
 * latency read from fixed histograms, and the window's verdict. Pure
 * functions over counts: no allocation, no locks, no server types.
 */
#include "serve/rollout/gate.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define GATE_FIRST_BOUND_US 10.0
#define GATE_PER_OCTAVE 4

double kiln_gate_bucket_bound(int i)
{
    if (i >= KILN_GATE_LAT_BUCKETS - 1) return INFINITY;
    return GATE_FIRST_BOUND_US * exp2((double)i / GATE_PER_OCTAVE);
}

int kiln_gate_bucket_of(double us)
{
    if (!(us > GATE_FIRST_BOUND_US)) return 0; /* NaN and small values */
    double b = ceil(GATE_PER_OCTAVE * log2(us / GATE_FIRST_BOUND_US) - 1e-9);
    if (b >= KILN_GATE_LAT_BUCKETS - 1) return KILN_GATE_LAT_BUCKETS - 1;
    int i = (int)b;
    /* guard the rounding at an exact bound */
    while (i > 0 && us <= kiln_gate_bucket_bound(i - 1)) i--;
    while (i < KILN_GATE_LAT_BUCKETS - 1 && us > kiln_gate_bucket_bound(i)) i++;
    return i;
}

/* Acklam's rational approximation, refined by one Halley step on erfc. */
double kiln_gate_norm_quantile(double p)
{
    static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                               -2.759285104469687e+02, 1.383577518672690e+02,
                               -3.066479806614716e+01, 2.506628277459239e+00};
    static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                               -1.556989798598866e+02, 6.680131188771972e+01,
                               -1.328068155288572e+01};
    static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                               -2.400758277161838e+00, -2.549732539343734e+00,
                               4.374664141464968e+00,  2.938163982698783e+00};
    static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                               2.445134137142996e+00, 3.754408661907416e+00};
    if (!(p > 0.0)) return -INFINITY;
    if (!(p < 1.0)) return INFINITY;
    double x;
    if (p < 0.02425) {
        double q = sqrt(-2 * log(p));
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    } else if (p > 1 - 0.02425) {
        double q = sqrt(-2 * log(1 - p));
        x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    } else {
        double q = p - 0.5, r = q * q;
        x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
            (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
    }
    double e = 0.5 * erfc(-x / sqrt(2.0)) - p;
    double u = e * 2.5066282746310002 /* sqrt(2 pi) */ * exp(x * x / 2);
    return x - u / (1 + x * u / 2);
}

void kiln_gate_wilson(uint64_t x, uint64_t n, double z, double *lo, double *hi)
{
    if (n == 0) {
        *lo = 0.0;
        *hi = 1.0;
        return;
    }
    double nn = (double)n, p = (double)x / nn, z2 = z * z;
    double centre = (p + z2 / (2 * nn)) / (1 + z2 / nn);
    double half = z / (1 + z2 / nn) * sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn));
    *lo = x == 0 ? 0.0 : fmax(0.0, centre - half);
    *hi = x == n ? 1.0 : fmin(1.0, centre + half);
}

void kiln_gate_newcombe(uint64_t x1, uint64_t n1, uint64_t x2, uint64_t n2, double z, double *lo,
                        double *hi)
{
    double l1, u1, l2, u2;
    kiln_gate_wilson(x1, n1, z, &l1, &u1);
    kiln_gate_wilson(x2, n2, z, &l2, &u2);
    double p1 = n1 ? (double)x1 / (double)n1 : 0.0, p2 = n2 ? (double)x2 / (double)n2 : 0.0;
    if (!n1) p1 = 0.5 * (l1 + u1);
    if (!n2) p2 = 0.5 * (l2 + u2);
    double d = p1 - p2;
    *lo = d - sqrt((p1 - l1) * (p1 - l1) + (u2 - p2) * (u2 - p2));
    *hi = d + sqrt((u1 - p1) * (u1 - p1) + (p2 - l2) * (p2 - l2));
}

/* P(Bin(n, p) <= k) for k = 0..n, visited in order; exact in log space. */
void kiln_gate_quantile_ranks(uint64_t n, double p, double conf, uint64_t *lo, uint64_t *hi)
{
    double alpha = 1.0 - conf;
    *lo = 0;
    *hi = n + 1;
    if (n == 0) return;
    if (n > 20000) {
        /* normal approximation with continuity correction */
        double z = kiln_gate_norm_quantile(conf), m = (double)n * p,
               s = sqrt((double)n * p * (1 - p));
        double r = floor(m - z * s + 0.5), t = ceil(m + z * s + 0.5);
        *lo = r < 1 ? 0 : (uint64_t)r;
        *hi = t > (double)n ? n + 1 : (uint64_t)t;
        return;
    }
    double lg = lgamma((double)n + 1), lp = log(p), lq = log1p(-p), cdf = 0.0;
    int lo_done = 0;
    for (uint64_t k = 0; k < n; k++) {
        double lpmf = lg - lgamma((double)k + 1) - lgamma((double)(n - k) + 1) + (double)k * lp +
                      (double)(n - k) * lq;
        cdf += exp(lpmf); /* now P(X <= k) */
        /* rank k + 1 is a lower bound while P(X <= k) <= alpha */
        if (!lo_done) {
            if (cdf <= alpha) *lo = k + 1;
            else lo_done = 1;
        }
        if (cdf >= conf) {
            *hi = k + 1;
            return;
        }
    }
}

static double bound_of(const kiln_gate_arm *a, int i)
{
    return a->bounds ? a->bounds[i] : kiln_gate_bucket_bound(i);
}

static int buckets_of(const kiln_gate_arm *a)
{
    return a->bounds ? a->n_buckets : KILN_GATE_LAT_BUCKETS;
}

double kiln_gate_arm_rank(const kiln_gate_arm *a, uint64_t r)
{
    if (r == 0) return 0.0;
    uint64_t cum = 0;
    int n = buckets_of(a);
    for (int i = 0; i < n; i++) {
        if (a->hist[i] == 0) continue;
        if (cum + a->hist[i] >= r) {
            double lo = i == 0 ? 0.0 : bound_of(a, i - 1);
            double hi = bound_of(a, i);
            if (!isfinite(hi)) return lo;
            return lo + (hi - lo) * (double)(r - cum) / (double)a->hist[i];
        }
        cum += a->hist[i];
    }
    return INFINITY;
}

double kiln_gate_hist_rank(const uint64_t *hist, uint64_t r)
{
    kiln_gate_arm a = {0, 0, hist, NULL, 0};
    return kiln_gate_arm_rank(&a, r);
}

static uint64_t hist_total(const kiln_gate_arm *a)
{
    uint64_t n = 0;
    for (int i = 0; i < buckets_of(a); i++) n += a->hist[i];
    return n;
}

void kiln_gate_evaluate(const kiln_gate_params *p, const kiln_gate_arm *c, const kiln_gate_arm *b,
                        kiln_gate_result *out)
{
    memset(out, 0, sizeof *out);
    double conf = p->confidence > 0.5 && p->confidence < 1.0 ? p->confidence : 0.95;
    double z = kiln_gate_norm_quantile(conf);
    int fail = 0, hold = 0;
    char hold_why[160] = "";
    out->err_candidate = c->requests ? (double)c->errors / (double)c->requests : 0.0;
    out->err_baseline = b->requests ? (double)b->errors / (double)b->requests : 0.0;
    kiln_gate_newcombe(c->errors, c->requests, b->errors, b->requests, z, &out->diff_lo,
                       &out->diff_hi);
    if (p->max_error_rate_increase >= 0) {
        if (out->diff_lo > p->max_error_rate_increase) {
            fail = 1;
            snprintf(out->reason, sizeof out->reason,
                     "error rate: candidate %.4f (%llu/%llu) vs baseline %.4f (%llu/%llu); the "
                     "increase is at least %.4f with confidence %.3g, above the allowed %.4f",
                     out->err_candidate, (unsigned long long)c->errors,
                     (unsigned long long)c->requests, out->err_baseline,
                     (unsigned long long)b->errors, (unsigned long long)b->requests, out->diff_lo,
                     conf, p->max_error_rate_increase);
        } else if (out->diff_hi > p->max_error_rate_increase) {
            hold = 1;
            snprintf(hold_why, sizeof hold_why,
                     "error rate: the increase may be up to %.4f (allowed %.4f); more requests "
                     "needed", out->diff_hi, p->max_error_rate_increase);
        }
    }
    if (c->hist && b->hist) {
        uint64_t nc = hist_total(c), nb = hist_total(b);
        uint64_t mid_c = (uint64_t)ceil(0.99 * (double)nc), mid_b = (uint64_t)ceil(0.99 * (double)nb);
        out->p99_candidate = nc ? kiln_gate_arm_rank(c, mid_c) : 0.0;
        out->p99_baseline = nb ? kiln_gate_arm_rank(b, mid_b) : 0.0;
        if (p->max_p99_latency_ratio > 0 && !fail) {
            uint64_t cl, ch, bl, bh;
            kiln_gate_quantile_ranks(nc, 0.99, conf, &cl, &ch);
            kiln_gate_quantile_ranks(nb, 0.99, conf, &bl, &bh);
            double c_lo = kiln_gate_arm_rank(c, cl);
            double c_hi = ch > nc ? INFINITY : kiln_gate_arm_rank(c, ch);
            double b_lo = kiln_gate_arm_rank(b, bl);
            double b_hi = bh > nb ? INFINITY : kiln_gate_arm_rank(b, bh);
            double r = p->max_p99_latency_ratio;
            double slack = p->p99_slack_us > 0 ? p->p99_slack_us : 0.0;
            if (cl > 0 && isfinite(b_hi) && c_lo > r * b_hi && c_lo - b_hi > slack) {
                fail = 1;
                snprintf(out->reason, sizeof out->reason,
                         "p99 latency: candidate at least %.0f us vs baseline at most %.0f us "
                         "(ratio >= %.2f, allowed %.2f with %.0f us slack, confidence %.3g; "
                         "point estimates %.0f and %.0f us)",
                         c_lo, b_hi, c_lo / b_hi, r, slack, conf, out->p99_candidate,
                         out->p99_baseline);
            } else if (!(isfinite(c_hi) && ((bl > 0 && c_hi <= r * b_lo) || c_hi - b_lo <= slack))) {
                hold = 1;
                if (!hold_why[0])
                    snprintf(hold_why, sizeof hold_why,
                             "p99 latency: the ratio cannot be bounded by %.2f yet (%llu "
                             "candidate and %llu baseline requests)",
                             r, (unsigned long long)nc, (unsigned long long)nb);
            }
        }
    }
    if (fail) out->verdict = KILN_GATE_FAIL;
    else if (hold) {
        out->verdict = KILN_GATE_HOLD;
        snprintf(out->reason, sizeof out->reason, "%s", hold_why);
    } else out->verdict = KILN_GATE_PASS;
}

void kiln_gate_agreement(const kiln_gate_params *p, uint64_t agree, uint64_t paired,
                         kiln_gate_result *out)
{
    if (p->min_agreement <= 0) return;
    if (agree > paired) agree = paired;
    double conf = p->confidence > 0.5 && p->confidence < 1.0 ? p->confidence : 0.95;
    double z = kiln_gate_norm_quantile(conf);
    out->paired = paired;
    out->agree = agree;
    kiln_gate_wilson(agree, paired, z, &out->agree_lo, &out->agree_hi);
    if (out->verdict == KILN_GATE_FAIL) return;
    double rate = paired ? (double)agree / (double)paired : 0.0;
    if (paired > 0 && out->agree_hi < p->min_agreement) {
        out->verdict = KILN_GATE_FAIL;
        snprintf(out->reason, sizeof out->reason,
                 "agreement: top-1 equal on %llu of %llu paired rows (%.4f); at most %.4f with "
                 "confidence %.3g, below the required %.4f",
                 (unsigned long long)agree, (unsigned long long)paired, rate, out->agree_hi, conf,
                 p->min_agreement);
    } else if (out->agree_lo < p->min_agreement && out->verdict == KILN_GATE_PASS) {
        out->verdict = KILN_GATE_HOLD;
        snprintf(out->reason, sizeof out->reason,
                 "agreement: %.4f on %llu paired rows, at least %.4f with confidence %.3g "
                 "(required %.4f); more pairs needed",
                 rate, (unsigned long long)paired, out->agree_lo, conf, p->min_agreement);
    }
}

void kiln_gate_divergence(const kiln_gate_params *p, uint64_t rows, double sum_js, double sum_js2,
                          kiln_gate_result *out)
{
    if (p->max_output_divergence <= 0) return;
    double conf = p->confidence > 0.5 && p->confidence < 1.0 ? p->confidence : 0.95;
    double z = kiln_gate_norm_quantile(conf), ln2 = log(2.0);
    out->js_rows = rows;
    out->js_mean = 0.0;
    out->js_lo = 0.0;
    out->js_hi = ln2;
    if (rows > 0 && isfinite(sum_js) && isfinite(sum_js2)) {
        double n = (double)rows, mean = fmin(fmax(sum_js / n, 0.0), ln2);
        double var = rows > 1 ? (sum_js2 - n * mean * mean) / (n - 1) : 0.0;
        double half = z * sqrt(var > 0 ? var : 0.0) / sqrt(n);
        out->js_mean = mean;
        if (rows >= KILN_GATE_MIN_DIVERGENCE_ROWS) {
            out->js_lo = fmax(0.0, mean - half);
            out->js_hi = fmin(ln2, mean + half);
        }
    }
    if (out->verdict == KILN_GATE_FAIL) return;
    double thr = p->max_output_divergence;
    if (rows >= KILN_GATE_MIN_DIVERGENCE_ROWS && out->js_lo > thr) {
        out->verdict = KILN_GATE_FAIL;
        snprintf(out->reason, sizeof out->reason,
                 "output divergence: mean Jensen-Shannon divergence %.4f nats over %llu paired "
                 "probability rows; at least %.4f with confidence %.3g, above the allowed %.4f",
                 out->js_mean, (unsigned long long)rows, out->js_lo, conf, thr);
    } else if (out->verdict == KILN_GATE_PASS && (rows < KILN_GATE_MIN_DIVERGENCE_ROWS ||
                                                  out->js_hi > thr)) {
        out->verdict = KILN_GATE_HOLD;
        if (rows < KILN_GATE_MIN_DIVERGENCE_ROWS)
            snprintf(out->reason, sizeof out->reason,
                     "output divergence: %llu paired probability rows, %d needed before the mean "
                     "divergence is judged", (unsigned long long)rows,
                     KILN_GATE_MIN_DIVERGENCE_ROWS);
        else
            snprintf(out->reason, sizeof out->reason,
                     "output divergence: mean %.4f nats over %llu paired rows, up to %.4f with "
                     "confidence %.3g (allowed %.4f); more pairs needed",
                     out->js_mean, (unsigned long long)rows, out->js_hi, conf, thr);
    }
}
