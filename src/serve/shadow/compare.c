/*
 * compare.c - the shadow comparison statistics (compare.h): one request's
 * primary and shadow outputs compared row by row into sums, which the
 * shadow observer (shadow.c) adds up over a sliding window and since start.
 *
 * Elements are read in place through a small typed view (any integer,
 * bool, f16, bf16, f32 or f64 as a double); nothing is allocated, so a
 * comparison costs a few passes over the two outputs and no more.
 */
#include "serve/shadow/compare.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* A row of a tensor: element i is at data[(off + i) * size]. */
typedef struct row_view {
    kiln_dtype dtype;
    const unsigned char *data;
    int64_t off;
} row_view;

/* Element i of the row as a double (the dtype was checked by numeric_ok). */
static double get(const row_view *r, int64_t i)
{
    int64_t j = r->off + i;
    switch (r->dtype) {
    case KILN_DTYPE_F32: { float v; memcpy(&v, r->data + j * 4, 4); return v; }
    case KILN_DTYPE_F64: { double v; memcpy(&v, r->data + j * 8, 8); return v; }
    case KILN_DTYPE_F16: { uint16_t v; memcpy(&v, r->data + j * 2, 2); return kiln_f16_to_f32(v); }
    case KILN_DTYPE_BF16: { uint16_t v; memcpy(&v, r->data + j * 2, 2); return kiln_bf16_to_f32(v); }
    case KILN_DTYPE_I8: return ((const int8_t *)r->data)[j];
    case KILN_DTYPE_U8: return r->data[j];
    case KILN_DTYPE_BOOL: return r->data[j] != 0;
    case KILN_DTYPE_I16: { int16_t v; memcpy(&v, r->data + j * 2, 2); return v; }
    case KILN_DTYPE_U16: { uint16_t v; memcpy(&v, r->data + j * 2, 2); return v; }
    case KILN_DTYPE_I32: { int32_t v; memcpy(&v, r->data + j * 4, 4); return v; }
    case KILN_DTYPE_U32: { uint32_t v; memcpy(&v, r->data + j * 4, 4); return v; }
    case KILN_DTYPE_I64: { int64_t v; memcpy(&v, r->data + j * 8, 8); return (double)v; }
    case KILN_DTYPE_U64: { uint64_t v; memcpy(&v, r->data + j * 8, 8); return (double)v; }
    default: return NAN;
    }
}

static int numeric_ok(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_F32: case KILN_DTYPE_F64: case KILN_DTYPE_F16: case KILN_DTYPE_BF16:
    case KILN_DTYPE_I8: case KILN_DTYPE_U8: case KILN_DTYPE_BOOL: case KILN_DTYPE_I16:
    case KILN_DTYPE_U16: case KILN_DTYPE_I32: case KILN_DTYPE_U32: case KILN_DTYPE_I64:
    case KILN_DTYPE_U64:
        return 1;
    default:
        return 0;
    }
}

static int is_integer(kiln_dtype dt)
{
    return numeric_ok(dt) && dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F64 &&
           dt != KILN_DTYPE_F16 && dt != KILN_DTYPE_BF16;
}

int kiln_shadow_compare_mode_parse(const char *name)
{
    if (!name || !name[0] || strcmp(name, "auto") == 0) return KILN_SHADOW_COMPARE_AUTO;
    if (strcmp(name, "class") == 0) return KILN_SHADOW_COMPARE_CLASS;
    if (strcmp(name, "probabilities") == 0) return KILN_SHADOW_COMPARE_PROBABILITIES;
    if (strcmp(name, "values") == 0) return KILN_SHADOW_COMPARE_VALUES;
    return -1;
}

const char *kiln_shadow_compare_mode_name(kiln_shadow_compare_mode m)
{
    static const char *const names[] = {"auto", "class", "probabilities", "values"};
    return (unsigned)m < 4 ? names[m] : "auto";
}

/* numpy.argmax: the first largest value; the first NaN if there is one. */
static int64_t argmax(const row_view *r, int64_t k)
{
    int64_t best = 0;
    double bv = get(r, 0);
    if (isnan(bv)) return 0;
    for (int64_t i = 1; i < k; i++) {
        double v = get(r, i);
        if (isnan(v)) return i;
        if (v > bv) {
            bv = v;
            best = i;
        }
    }
    return best;
}

/* The row's sum when it is a probability vector, else -1. */
static double probability_sum(const row_view *r, int64_t k)
{
    if (k < 2) return -1.0;
    double sum = 0.0;
    for (int64_t i = 0; i < k; i++) {
        double v = get(r, i);
        if (!isfinite(v) || v < 0.0) return -1.0;
        sum += v;
    }
    return fabs(sum - 1.0) <= KILN_SHADOW_PROB_TOL ? sum : -1.0;
}

/* JS divergence of rows p and q with sums sp and sq. */
static double js_rows(const row_view *p, double sp, const row_view *q, double sq, int64_t k)
{
    double kl_p = 0.0, kl_q = 0.0;
    for (int64_t i = 0; i < k; i++) {
        double a = get(p, i) / sp, b = get(q, i) / sq, m = 0.5 * (a + b);
        if (a > 0.0) kl_p += a * log(a / m);
        if (b > 0.0) kl_q += b * log(b / m);
    }
    double js = 0.5 * kl_p + 0.5 * kl_q;
    return js < 0.0 ? 0.0 : js; /* rounding */
}

double kiln_shadow_js_divergence(const double *p, const double *q, int64_t k)
{
    row_view a = {KILN_DTYPE_F64, (const unsigned char *)p, 0};
    row_view b = {KILN_DTYPE_F64, (const unsigned char *)q, 0};
    double sp = 0.0, sq = 0.0;
    for (int64_t i = 0; i < k; i++) {
        sp += p[i];
        sq += q[i];
    }
    return js_rows(&a, sp, &b, sq, k);
}

int kiln_shadow_is_probability_row(const double *v, int64_t k)
{
    row_view r = {KILN_DTYPE_F64, (const unsigned char *)v, 0};
    return probability_sum(&r, k) >= 0.0;
}

/* Rows and values per row of an output. */
static void row_shape(const kiln_tensor *t, int64_t *rows, int64_t *k)
{
    int64_t n = kiln_tensor_count(t);
    *rows = t->rank == 0 ? 1 : t->dims[0];
    *k = *rows > 0 ? n / *rows : 0;
}

static int string_eq(const kiln_tensor *a, const kiln_tensor *b, int64_t i)
{
    const kiln_string *x = &((const kiln_string *)a->data)[i];
    const kiln_string *y = &((const kiln_string *)b->data)[i];
    return x->len == y->len && (x->len == 0 || memcmp(x->data, y->data, x->len) == 0);
}

kiln_status kiln_shadow_compare(kiln_shadow_compare_mode mode, const kiln_tensor *p,
                                const kiln_tensor *s, kiln_shadow_stats *out, char *err,
                                size_t errlen)
{
    memset(out, 0, sizeof *out);
    int64_t rows, k, srows, sk;
    row_shape(p, &rows, &k);
    row_shape(s, &srows, &sk);
    if (rows != srows || k != sk) {
        snprintf(err, errlen,
                 "outputs differ in shape: the primary has %lld rows of %lld values, the shadow "
                 "%lld rows of %lld",
                 (long long)rows, (long long)k, (long long)srows, (long long)sk);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    int pstr = p->dtype == KILN_DTYPE_STRING, sstr = s->dtype == KILN_DTYPE_STRING;
    if (pstr != sstr || (!pstr && (!numeric_ok(p->dtype) || !numeric_ok(s->dtype)))) {
        snprintf(err, errlen, "outputs of dtype %s (primary) and %s (shadow) are not compared",
                 kiln_dtype_name(p->dtype), kiln_dtype_name(s->dtype));
        return KILN_ERR_INVALID_ARGUMENT;
    }
    out->requests = 1;
    out->rows = rows;
    int want_top1 = mode != KILN_SHADOW_COMPARE_VALUES;
    int want_diff = mode != KILN_SHADOW_COMPARE_CLASS && !pstr;
    int want_js = (mode == KILN_SHADOW_COMPARE_AUTO || mode == KILN_SHADOW_COMPARE_PROBABILITIES) &&
                  !pstr;
    for (int64_t r = 0; r < rows; r++) {
        if (pstr) { /* class names: equal strings (k = 1) */
            if (want_top1 && k == 1) {
                out->top1_rows++;
                out->top1_agree += string_eq(p, s, r);
            }
            continue;
        }
        row_view a = {p->dtype, p->data, r * k}, b = {s->dtype, s->data, r * k};
        if (want_top1 && k > 1) {
            out->top1_rows++;
            out->top1_agree += argmax(&a, k) == argmax(&b, k);
        } else if (want_top1 && k == 1 &&
                   (mode == KILN_SHADOW_COMPARE_CLASS ||
                    (is_integer(p->dtype) && is_integer(s->dtype)))) {
            out->top1_rows++;
            out->top1_agree += get(&a, 0) == get(&b, 0);
        }
        if (want_diff) {
            for (int64_t i = 0; i < k; i++) {
                double x = get(&a, i), y = get(&b, i);
                if (!isfinite(x) || !isfinite(y)) {
                    int same = (isnan(x) && isnan(y)) || x == y;
                    if (!same) out->nonfinite++;
                    continue;
                }
                double d = fabs(y - x), m = fmax(fabs(x), fabs(y));
                out->values++;
                out->sum_abs += d;
                out->sum_rel += m > 0.0 ? d / m : 0.0;
                if (d > out->max_abs) out->max_abs = d;
            }
        }
        if (want_js && k >= 2) {
            double sp = probability_sum(&a, k), sq = probability_sum(&b, k);
            if (sp >= 0.0 && sq >= 0.0) {
                double js = js_rows(&a, sp, &b, sq, k);
                out->js_rows++;
                out->sum_js += js;
                out->sum_js2 += js * js;
            } else {
                out->nonprob_rows++;
            }
        }
    }
    return KILN_OK;
}

void kiln_shadow_stats_add(kiln_shadow_stats *acc, const kiln_shadow_stats *s)
{
    acc->requests += s->requests;
    acc->rows += s->rows;
    acc->top1_rows += s->top1_rows;
    acc->top1_agree += s->top1_agree;
    acc->values += s->values;
    acc->sum_abs += s->sum_abs;
    acc->sum_rel += s->sum_rel;
    if (s->max_abs > acc->max_abs) acc->max_abs = s->max_abs;
    acc->nonfinite += s->nonfinite;
    acc->js_rows += s->js_rows;
    acc->sum_js += s->sum_js;
    acc->sum_js2 += s->sum_js2;
    acc->nonprob_rows += s->nonprob_rows;
}
