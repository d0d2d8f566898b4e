/*
 * unit_shadow_compare.c - the shadow comparison statistics
 * (src/serve/shadow/compare.c) against references that do not come from
 * Kiln: closed forms of the Jensen-Shannon divergence, and numpy on fixed
 * inputs. The numpy reference, run once with Debian's python3 (numpy
 * only, no scipy), printed the constants used below:
 *
 *   import numpy as np
 *   p = np.array([[0.7, 0.2, 0.1, 0.0], [0.25, 0.25, 0.4, 0.1], [0.1, 0.1, 0.1, 0.7]], np.float32)
 *   q = np.array([[0.6, 0.3, 0.05, 0.05], [0.5, 0.2, 0.2, 0.1], [0.0, 0.2, 0.1, 0.7]], np.float32)
 *   P, Q = p.astype(np.float64), q.astype(np.float64)
 *   agree = np.mean(P.argmax(1) == Q.argmax(1))
 *   d = np.abs(Q - P); mx = np.maximum(np.abs(P), np.abs(Q))
 *   rel = np.where(mx > 0, d / np.where(mx > 0, mx, 1), 0)
 *   Pn, Qn = P / P.sum(1, keepdims=True), Q / Q.sum(1, keepdims=True); M = (Pn + Qn) / 2
 *   def kl(a, m): return np.sum(np.where(a > 0, a * np.log(np.where(a > 0, a, 1) / m), 0), 1)
 *   js = 0.5 * kl(Pn, M) + 0.5 * kl(Qn, M)
 *   print(agree, d.mean(), rel.mean(), d.max(), js.mean())
 *   # -> 0.6666666666666666 0.08333333147068818 0.3896825360141282 0.25 0.037102122326809935
 *   l1 = np.array([[1.0, 3.0, 3.0], [-2.0, 0.5, 0.1]], np.float32).astype(np.float64)
 *   l2 = np.array([[0.0, 3.0, 1.0], [0.7, 0.2, -1.0]], np.float32).astype(np.float64)
 *   (same d, mx, rel) print(np.mean(l1.argmax(1) == l2.argmax(1)), d.mean(), rel.mean())
 *   # -> 0.5 1.183333331098159 0.7861111093726422
 *
 * The end-to-end test (tests/python/test_shadow.py) checks the same
 * statistics through a running server against numpy computed live.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "serve/shadow/compare.h"

#define NEAR(a, b, tol) (fabs((a) - (b)) <= (tol))

static kiln_tensor *wrap(kiln_dtype dt, int rank, const int64_t *dims, void *data, size_t n)
{
    kiln_tensor *t = NULL;
    if (kiln_tensor_wrap(dt, rank, dims, data, n, &t) != KILN_OK) return NULL;
    return t;
}

static void test_closed_forms(void)
{
    double a[2] = {1, 0}, b[2] = {0, 1}, h[2] = {0.5, 0.5};
    CHECK(NEAR(kiln_shadow_js_divergence(a, a, 2), 0.0, 1e-15), "identical rows");
    CHECK(NEAR(kiln_shadow_js_divergence(a, b, 2), log(2.0), 1e-15), "disjoint rows: ln 2");
    /* p = (1,0), q = (1/2,1/2), m = (3/4,1/4): JS = 3/4 ln(4/3) */
    CHECK(NEAR(kiln_shadow_js_divergence(a, h, 2), 0.75 * log(4.0 / 3.0), 1e-15), "%.17g",
          kiln_shadow_js_divergence(a, h, 2));
    /* symmetric */
    CHECK(kiln_shadow_js_divergence(h, a, 2) == kiln_shadow_js_divergence(a, h, 2), "symmetry");
    /* rows are normalized by their sums (within the tolerance) */
    double c[3] = {0.2, 0.3, 0.5}, c2[3] = {0.2002, 0.3, 0.5};
    CHECK(NEAR(kiln_shadow_js_divergence(c, c2, 3), 0.0, 1e-7), "%g",
          kiln_shadow_js_divergence(c, c2, 3));
    CHECK(kiln_shadow_is_probability_row(c, 3), "a probability row");
    CHECK(kiln_shadow_is_probability_row(c2, 3), "sum 1.0002 is within 1e-3");
    double neg[2] = {1.5, -0.5}, big[2] = {0.6, 0.6}, one[1] = {1.0}, nan2[2] = {NAN, 1.0};
    CHECK(!kiln_shadow_is_probability_row(neg, 2), "a negative value");
    CHECK(!kiln_shadow_is_probability_row(big, 2), "sum 1.2");
    CHECK(!kiln_shadow_is_probability_row(one, 1), "one value is not a distribution");
    CHECK(!kiln_shadow_is_probability_row(nan2, 2), "NaN");
}

static void test_probabilities(void)
{
    float p[12] = {0.7f, 0.2f, 0.1f, 0.0f, 0.25f, 0.25f, 0.4f, 0.1f, 0.1f, 0.1f, 0.1f, 0.7f};
    float q[12] = {0.6f, 0.3f, 0.05f, 0.05f, 0.5f, 0.2f, 0.2f, 0.1f, 0.0f, 0.2f, 0.1f, 0.7f};
    int64_t dims[2] = {3, 4};
    kiln_tensor *tp = wrap(KILN_DTYPE_F32, 2, dims, p, sizeof p);
    kiln_tensor *tq = wrap(KILN_DTYPE_F32, 2, dims, q, sizeof q);
    kiln_shadow_stats s;
    char err[256];
    kiln_status st = kiln_shadow_compare(KILN_SHADOW_COMPARE_AUTO, tp, tq, &s, err, sizeof err);
    CHECK(st == KILN_OK, "%s", err);
    CHECK(s.requests == 1 && s.rows == 3 && s.top1_rows == 3 && s.values == 12, "counts");
    CHECK(NEAR((double)s.top1_agree / s.top1_rows, 0.6666666666666666, 1e-12), "agreement");
    CHECK(NEAR(s.sum_abs / s.values, 0.08333333147068818, 1e-12), "%.17g", s.sum_abs / s.values);
    CHECK(NEAR(s.sum_rel / s.values, 0.3896825360141282, 1e-12), "%.17g", s.sum_rel / s.values);
    CHECK(NEAR(s.max_abs, 0.25, 1e-7), "%.17g", s.max_abs);
    CHECK(s.js_rows == 3 && s.nonprob_rows == 0, "js rows %lld", (long long)s.js_rows);
    CHECK(NEAR(s.sum_js / s.js_rows, 0.037102122326809935, 1e-9), "%.17g", s.sum_js / s.js_rows);

    /* modes: class keeps only top-1, values only differences */
    kiln_shadow_compare(KILN_SHADOW_COMPARE_CLASS, tp, tq, &s, err, sizeof err);
    CHECK(s.top1_rows == 3 && s.values == 0 && s.js_rows == 0, "class mode");
    kiln_shadow_compare(KILN_SHADOW_COMPARE_VALUES, tp, tq, &s, err, sizeof err);
    CHECK(s.top1_rows == 0 && s.values == 12 && s.js_rows == 0, "values mode");

    /* against itself: full agreement, zero distance */
    kiln_shadow_compare(KILN_SHADOW_COMPARE_PROBABILITIES, tp, tp, &s, err, sizeof err);
    CHECK(s.top1_agree == 3 && s.sum_abs == 0.0 && s.sum_rel == 0.0 && s.sum_js == 0.0,
          "self comparison");

    /* sums add up; max_abs is the larger */
    kiln_shadow_stats acc, one;
    memset(&acc, 0, sizeof acc);
    kiln_shadow_compare(KILN_SHADOW_COMPARE_AUTO, tp, tq, &one, err, sizeof err);
    kiln_shadow_stats_add(&acc, &one);
    kiln_shadow_stats_add(&acc, &s);
    CHECK(acc.requests == 2 && acc.rows == 6 && acc.top1_agree == 5 && acc.max_abs == one.max_abs,
          "accumulated");

    /* float64 primary against a float32 shadow compares the same values */
    double pd[12];
    for (int i = 0; i < 12; i++) pd[i] = p[i];
    kiln_tensor *tpd = wrap(KILN_DTYPE_F64, 2, dims, pd, sizeof pd);
    kiln_shadow_compare(KILN_SHADOW_COMPARE_AUTO, tpd, tq, &s, err, sizeof err);
    CHECK(NEAR(s.sum_js / s.js_rows, 0.037102122326809935, 1e-9), "f64 vs f32");
    kiln_tensor_free(tpd);
    kiln_tensor_free(tp);
    kiln_tensor_free(tq);
}

static void test_logits_and_ids(void)
{
    float l1[6] = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f, 0.1f};
    float l2[6] = {0.0f, 3.0f, 1.0f, 0.7f, 0.2f, -1.0f};
    int64_t dims[2] = {2, 3};
    kiln_tensor *a = wrap(KILN_DTYPE_F32, 2, dims, l1, sizeof l1);
    kiln_tensor *b = wrap(KILN_DTYPE_F32, 2, dims, l2, sizeof l2);
    kiln_shadow_stats s;
    char err[256];
    CHECK(kiln_shadow_compare(KILN_SHADOW_COMPARE_AUTO, a, b, &s, err, sizeof err) == KILN_OK,
          "%s", err);
    CHECK(s.top1_rows == 2 && s.top1_agree == 1, "argmax with a tie takes the first");
    CHECK(NEAR(s.sum_abs / s.values, 1.183333331098159, 1e-12), "%.17g", s.sum_abs / s.values);
    CHECK(NEAR(s.sum_rel / s.values, 0.7861111093726422, 1e-12), "%.17g", s.sum_rel / s.values);
    CHECK(s.js_rows == 0 && s.nonprob_rows == 2, "logits are never softmaxed");
    kiln_tensor_free(a);
    kiln_tensor_free(b);

    /* class ids (int64 [n]): equal ids agree; a float [n] is a value in auto */
    int64_t i1[4] = {3, 1, 4, 1}, i2[4] = {3, 2, 4, 0}, n4 = 4;
    a = wrap(KILN_DTYPE_I64, 1, &n4, i1, sizeof i1);
    b = wrap(KILN_DTYPE_I64, 1, &n4, i2, sizeof i2);
    kiln_shadow_compare(KILN_SHADOW_COMPARE_AUTO, a, b, &s, err, sizeof err);
    CHECK(s.rows == 4 && s.top1_rows == 4 && s.top1_agree == 2, "class ids");
    kiln_tensor_free(a);
    kiln_tensor_free(b);
    float f1[4] = {1, 2, 3, 4}, f2[4] = {1, 2, 3, 5};
    a = wrap(KILN_DTYPE_F32, 1, &n4, f1, sizeof f1);
    b = wrap(KILN_DTYPE_F32, 1, &n4, f2, sizeof f2);
    kiln_shadow_compare(KILN_SHADOW_COMPARE_AUTO, a, b, &s, err, sizeof err);
    CHECK(s.top1_rows == 0 && s.values == 4 && NEAR(s.sum_abs, 1.0, 0), "regression values");
    kiln_shadow_compare(KILN_SHADOW_COMPARE_CLASS, a, b, &s, err, sizeof err);
    CHECK(s.top1_rows == 4 && s.top1_agree == 3, "class mode: equal values");
    kiln_tensor_free(a);
    kiln_tensor_free(b);
}

static void test_edges(void)
{
    kiln_shadow_stats s;
    char err[256];
    /* NaN and infinities are kept out of the sums */
    float x[4] = {NAN, INFINITY, 1.0f, 2.0f}, y[4] = {NAN, INFINITY, NAN, 4.0f};
    int64_t n4 = 4;
    kiln_tensor *a = wrap(KILN_DTYPE_F32, 1, &n4, x, sizeof x);
    kiln_tensor *b = wrap(KILN_DTYPE_F32, 1, &n4, y, sizeof y);
    kiln_shadow_compare(KILN_SHADOW_COMPARE_VALUES, a, b, &s, err, sizeof err);
    CHECK(s.values == 1 && s.nonfinite == 1 && s.sum_abs == 2.0 && NEAR(s.sum_rel, 0.5, 0),
          "values %lld nonfinite %lld", (long long)s.values, (long long)s.nonfinite);
    kiln_tensor_free(b);
    /* a different shape is an error naming both */
    int64_t d22[2] = {2, 2}, n3 = 3;
    b = wrap(KILN_DTYPE_F32, 1, &n3, y, 3 * sizeof(float));
    CHECK(kiln_shadow_compare(KILN_SHADOW_COMPARE_AUTO, a, b, &s, err, sizeof err) ==
              KILN_ERR_INVALID_ARGUMENT && strstr(err, "4 rows") && strstr(err, "3 rows"),
          "%s", err);
    kiln_tensor_free(b);
    /* [4] against [2, 2]: 4 rows of 1 against 2 rows of 2 */
    b = wrap(KILN_DTYPE_F32, 2, d22, y, sizeof y);
    CHECK(kiln_shadow_compare(KILN_SHADOW_COMPARE_AUTO, a, b, &s, err, sizeof err) != KILN_OK,
          "rows differ");
    kiln_tensor_free(b);
    /* [4] against [4, 1] pairs */
    int64_t d41[2] = {4, 1};
    b = wrap(KILN_DTYPE_F32, 2, d41, y, sizeof y);
    CHECK(kiln_shadow_compare(KILN_SHADOW_COMPARE_AUTO, a, b, &s, err, sizeof err) == KILN_OK,
          "%s", err);
    kiln_tensor_free(b);
    /* strings: equal class names agree; strings against numbers do not pair */
    kiln_tensor *s1 = NULL, *s2 = NULL;
    int64_t n2 = 2;
    kiln_tensor_create(KILN_DTYPE_STRING, 1, &n2, &s1);
    kiln_tensor_create(KILN_DTYPE_STRING, 1, &n2, &s2);
    kiln_tensor_set_string(s1, 0, "cat", 3);
    kiln_tensor_set_string(s1, 1, "dog", 3);
    kiln_tensor_set_string(s2, 0, "cat", 3);
    kiln_tensor_set_string(s2, 1, "do", 2);
    CHECK(kiln_shadow_compare(KILN_SHADOW_COMPARE_AUTO, s1, s2, &s, err, sizeof err) == KILN_OK &&
              s.top1_rows == 2 && s.top1_agree == 1 && s.values == 0,
          "strings");
    int64_t n2b = 2;
    kiln_tensor *f = wrap(KILN_DTYPE_F32, 1, &n2b, x, 2 * sizeof(float));
    CHECK(kiln_shadow_compare(KILN_SHADOW_COMPARE_AUTO, s1, f, &s, err, sizeof err) ==
              KILN_ERR_INVALID_ARGUMENT && strstr(err, "string"),
          "%s", err);
    kiln_tensor_free(f);
    kiln_tensor_free(s1);
    kiln_tensor_free(s2);
    kiln_tensor_free(a);
    /* f16 and bf16 are read as their values: 1.0, 0.5, -2 */
    uint16_t h[3] = {0x3c00, 0x3800, 0xc000}, bf[3] = {0x3f80, 0x3f00, 0xc000};
    float ref[3] = {1.0f, 0.5f, -2.0f};
    a = wrap(KILN_DTYPE_F16, 1, &n3, h, sizeof h);
    b = wrap(KILN_DTYPE_BF16, 1, &n3, bf, sizeof bf);
    kiln_tensor *r = wrap(KILN_DTYPE_F32, 1, &n3, ref, sizeof ref);
    kiln_shadow_compare(KILN_SHADOW_COMPARE_VALUES, a, r, &s, err, sizeof err);
    CHECK(s.values == 3 && s.sum_abs == 0.0, "f16 %g", s.sum_abs);
    kiln_shadow_compare(KILN_SHADOW_COMPARE_VALUES, b, r, &s, err, sizeof err);
    CHECK(s.values == 3 && s.sum_abs == 0.0, "bf16 %g", s.sum_abs);
    kiln_tensor_free(a);
    kiln_tensor_free(b);
    kiln_tensor_free(r);
    /* modes by name */
    CHECK(kiln_shadow_compare_mode_parse("") == KILN_SHADOW_COMPARE_AUTO &&
              kiln_shadow_compare_mode_parse("probabilities") == KILN_SHADOW_COMPARE_PROBABILITIES &&
              kiln_shadow_compare_mode_parse("softmax") == -1,
          "mode names");
}

int main(void)
{
    test_closed_forms();
    test_probabilities();
    test_logits_and_ids();
    test_edges();
    return CHECK_DONE();
}
