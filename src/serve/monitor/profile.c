/*
 * profile.c - reference profiles (profile.h): the JSON parser and writer,
 * and the statistics shared by `kiln profile`, the server's monitor and the
 * tests: bins, categories, PSI, Jensen-Shannon, L-infinity and a
 * probability row's confidence.
 *
 * The parser works on the server's bounded JSON tokenizer (json.h) and
 * checks everything the monitor relies on: edges finite and strictly
 * increasing, one count per bin, names that fit, counts in range.
 * Unknown keys are ignored, so newer profiles load in older servers.
 */
#include "serve/monitor/profile.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fill err (KILN_JSON_ERR_LEN bytes); returns KILN_ERR_INVALID_ARGUMENT. */
static kiln_status fail(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static kiln_status fail(char *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, KILN_JSON_ERR_LEN, fmt, ap);
    va_end(ap);
    return KILN_ERR_INVALID_ARGUMENT;
}
#define ERR(...) fail(err, __VA_ARGS__)

kiln_mon_profile *kiln_mon_profile_new(void)
{
    kiln_mon_profile *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->psi_threshold = KILN_MON_DEFAULT_PSI;
    p->js_threshold = KILN_MON_DEFAULT_JS;
    p->linf_threshold = KILN_MON_DEFAULT_LINF;
    p->window_seconds = KILN_MON_DEFAULT_WINDOW_S;
    p->sub_windows = KILN_MON_DEFAULT_SUB_WINDOWS;
    p->min_count = KILN_MON_DEFAULT_MIN_COUNT;
    return p;
}

void kiln_mon_profile_free(kiln_mon_profile *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_features; i++)
        for (int k = 0; k < p->features[i].n_values; k++) free(p->features[i].values[k]);
    free(p->features);
    free(p->outputs);
    free(p->rules);
    free(p);
}

/* ------------------------------------------------------------ parsing */

/* A number token (NaN, Infinity and -Infinity included) as a double. */
static int get_num(const kiln_json_doc *d, int t, double *out)
{
    if (t < 0 || d->tok[t].type != KILN_JSON_NUMBER) return 0;
    const char *s = d->text + d->tok[t].start;
    size_t n = d->tok[t].len;
    if (d->tok[t].special) {
        if (n == 3 && memcmp(s, "NaN", 3) == 0) *out = NAN;
        else if (n == 8 && memcmp(s, "Infinity", 8) == 0) *out = INFINITY;
        else if (n == 9 && memcmp(s, "-Infinity", 9) == 0) *out = -INFINITY;
        else return 0;
        return 1;
    }
    return kiln_json_decimal_to_double(s, n, out);
}

/* An optional non-negative integer member; 0 with err set when malformed. */
static int get_count(const kiln_json_doc *d, int obj, const char *key, int64_t lo, int64_t hi,
                     int64_t *out, const char *where, char *err)
{
    int t = kiln_json_object_get(d, obj, key);
    if (t < 0) return 1;
    int64_t v;
    if (d->tok[t].type != KILN_JSON_NUMBER || !kiln_json_get_int64(d, t, &v) || v < lo || v > hi) {
        ERR("profile: %s: \"%s\" must be an integer in [%lld, %lld], got '%.*s'", where, key,
            (long long)lo, (long long)hi, (int)(d->tok[t].len > 40 ? 40 : d->tok[t].len),
            d->text + d->tok[t].start);
        return 0;
    }
    *out = v;
    return 1;
}

static int get_double(const kiln_json_doc *d, int obj, const char *key, int finite, double *out,
                      const char *where, char *err)
{
    int t = kiln_json_object_get(d, obj, key);
    if (t < 0) return 1;
    double v;
    if (!get_num(d, t, &v) || isnan(v) || (finite && !isfinite(v))) {
        ERR("profile: %s: \"%s\" must be a %snumber, got '%.*s'", where, key,
            finite ? "finite " : "", (int)(d->tok[t].len > 40 ? 40 : d->tok[t].len),
            d->text + d->tok[t].start);
        return 0;
    }
    *out = v;
    return 1;
}

/* 1 when s[0..n) is valid UTF-8 (no overlongs, no surrogates). */
static int utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        unsigned min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            k = 1, min = 0x80, c &= 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            k = 2, min = 0x800, c &= 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            k = 3, min = 0x10000, c &= 0x07;
        } else {
            return 0;
        }
        if (n - i <= k) return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            c = c << 6 | (s[i + j] & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
        i += k + 1;
    }
    return 1;
}

/* Copy string member `key` into dst (cap bytes); required when req. */
static int get_name(const kiln_json_doc *d, int obj, const char *key, int req, char *dst,
                    size_t cap, const char *where, char *err)
{
    int t = kiln_json_object_get(d, obj, key);
    if (t < 0) {
        if (req) ERR("profile: %s: \"%s\" is missing", where, key);
        return !req;
    }
    if (d->tok[t].type != KILN_JSON_STRING) {
        ERR("profile: %s: \"%s\" must be a string", where, key);
        return 0;
    }
    size_t n;
    char *s = kiln_json_string_dup(d, t, &n);
    if (!s) {
        snprintf(err, KILN_JSON_ERR_LEN, "profile: out of memory");
        return 0;
    }
    int ok = n > 0 && n < cap && strlen(s) == n && utf8_valid((const unsigned char *)s, n);
    if (ok) memcpy(dst, s, n + 1);
    else ERR("profile: %s: \"%s\" must be 1 to %zu bytes of UTF-8 without NUL, got %zu bytes",
             where, key, cap - 1, n);
    free(s);
    return ok;
}

/* An array member of numbers into dst[0..max); *n gets the length. */
static int get_counts(const kiln_json_doc *d, int obj, const char *key, int64_t *dst, int max,
                      int *n, const char *where, char *err)
{
    int t = kiln_json_object_get(d, obj, key);
    if (t < 0 || d->tok[t].type != KILN_JSON_ARRAY) {
        ERR("profile: %s: \"%s\" must be an array of counts", where, key);
        return 0;
    }
    if ((int64_t)d->tok[t].size > max) {
        ERR("profile: %s: \"%s\" has %u entries, at most %d allowed", where, key, d->tok[t].size, max);
        return 0;
    }
    int e = t + 1;
    for (uint32_t i = 0; i < d->tok[t].size; i++) {
        int64_t v;
        if (d->tok[e].type != KILN_JSON_NUMBER || !kiln_json_get_int64(d, e, &v) || v < 0 ||
            v > ((int64_t)1 << 52)) {
            ERR("profile: %s: \"%s\"[%u] must be a count (an integer >= 0), got '%.*s'", where,
                key, i, (int)(d->tok[e].len > 40 ? 40 : d->tok[e].len), d->text + d->tok[e].start);
            return 0;
        }
        dst[i] = v;
        e = (int)d->tok[e].next;
    }
    *n = (int)d->tok[t].size;
    return 1;
}

static kiln_status parse_feature(const kiln_json_doc *d, int t, int idx, kiln_mon_feature *f,
                                 char *err)
{
    char where[KILN_MON_NAME_MAX + 32];
    snprintf(where, sizeof where, "features[%d]", idx);
    if (d->tok[t].type != KILN_JSON_OBJECT) return ERR("profile: %s must be an object", where);
    if (!get_name(d, t, "name", 1, f->name, sizeof f->name, where, err)) return KILN_ERR_INVALID_ARGUMENT;
    snprintf(where, sizeof where, "feature '%s'", f->name);
    if (!get_name(d, t, "input", 1, f->input, sizeof f->input, where, err))
        return KILN_ERR_INVALID_ARGUMENT;
    int64_t col = -1;
    if (!get_count(d, t, "column", -1, KILN_MON_MAX_COLUMNS - 1, &col, where, err))
        return KILN_ERR_INVALID_ARGUMENT;
    f->column = (int)col;
    int k = kiln_json_object_get(d, t, "kind");
    if (k >= 0 && kiln_json_string_eq(d, k, "numeric")) f->kind = KILN_MON_NUMERIC;
    else if (k >= 0 && kiln_json_string_eq(d, k, "categorical")) f->kind = KILN_MON_CATEGORICAL;
    else return ERR("profile: %s: \"kind\" must be \"numeric\" or \"categorical\"", where);
    if (!get_count(d, t, "count", 0, INT64_MAX, &f->count, where, err) ||
        !get_count(d, t, "missing", 0, INT64_MAX, &f->missing, where, err) ||
        !get_count(d, t, "nan", 0, INT64_MAX, &f->nan, where, err) ||
        !get_count(d, t, "inf", 0, INT64_MAX, &f->inf, where, err))
        return KILN_ERR_INVALID_ARGUMENT;
    f->min = -INFINITY;
    f->max = INFINITY;
    if (!get_double(d, t, "min", 0, &f->min, where, err) ||
        !get_double(d, t, "max", 0, &f->max, where, err))
        return KILN_ERR_INVALID_ARGUMENT;
    if (!get_counts(d, t, "counts", f->counts, KILN_MON_MAX_BINS + 1, &f->n_counts, where, err))
        return KILN_ERR_INVALID_ARGUMENT;
    if (f->kind == KILN_MON_NUMERIC) {
        int e = kiln_json_object_get(d, t, "edges");
        if (e < 0 || d->tok[e].type != KILN_JSON_ARRAY || d->tok[e].size > KILN_MON_MAX_BINS - 1)
            return ERR("profile: %s: \"edges\" must be an array of at most %d numbers", where,
                       KILN_MON_MAX_BINS - 1);
        int x = e + 1;
        for (uint32_t i = 0; i < d->tok[e].size; i++) {
            double v;
            if (!get_num(d, x, &v) || !isfinite(v) || (i > 0 && !(v > f->edges[i - 1])))
                return ERR("profile: %s: \"edges\"[%u] must be finite and greater than the edge "
                           "before it, got '%.*s'", where, i,
                           (int)(d->tok[x].len > 40 ? 40 : d->tok[x].len), d->text + d->tok[x].start);
            f->edges[i] = v;
            x = (int)d->tok[x].next;
        }
        f->n_edges = (int)d->tok[e].size;
        if (f->n_counts != f->n_edges + 1)
            return ERR("profile: %s: %d edges need %d counts, got %d", where, f->n_edges,
                       f->n_edges + 1, f->n_counts);
        return KILN_OK;
    }
    int ty = kiln_json_object_get(d, t, "value_type");
    f->strings = !(ty >= 0 && kiln_json_string_eq(d, ty, "number"));
    int v = kiln_json_object_get(d, t, "values");
    if (v < 0 || d->tok[v].type != KILN_JSON_ARRAY || d->tok[v].size > KILN_MON_MAX_VALUES)
        return ERR("profile: %s: \"values\" must be an array of at most %d values", where,
                   KILN_MON_MAX_VALUES);
    int x = v + 1;
    for (uint32_t i = 0; i < d->tok[v].size; i++) {
        if (f->strings) {
            int b64 = kiln_json_b64_member(d, x); /* {"b64": ...}: bytes that are not UTF-8 */
            if (b64 >= 0) {
                size_t n;
                char *text = kiln_json_string_dup(d, b64, &n);
                if (!text) return ERR("profile: out of memory");
                unsigned char *raw = kiln_base64_decode(text, n, &f->value_len[i]);
                free(text);
                if (!raw) return ERR("profile: %s: \"values\"[%u] is not base64", where, i);
                f->values[i] = malloc(f->value_len[i] + 1); /* NUL-terminated, as the others */
                if (f->values[i]) {
                    memcpy(f->values[i], raw, f->value_len[i]);
                    f->values[i][f->value_len[i]] = '\0';
                }
                free(raw);
                if (!f->values[i]) return ERR("profile: out of memory");
            } else if (d->tok[x].type == KILN_JSON_STRING) {
                f->values[i] = kiln_json_string_dup(d, x, &f->value_len[i]);
                if (!f->values[i]) return ERR("profile: out of memory");
            } else {
                return ERR("profile: %s: \"values\"[%u] must be a string or {\"b64\": ...}",
                           where, i);
            }
            f->n_values = (int)i + 1;
        } else {
            if (!get_num(d, x, &f->value_num[i]) || !isfinite(f->value_num[i]))
                return ERR("profile: %s: \"values\"[%u] must be a finite number", where, i);
            f->n_values = (int)i + 1;
        }
        x = (int)d->tok[x].next;
    }
    f->n_values = (int)d->tok[v].size;
    if (f->n_counts != f->n_values + 1)
        return ERR("profile: %s: %d values need %d counts (the last for other values), got %d",
                   where, f->n_values, f->n_values + 1, f->n_counts);
    return KILN_OK;
}

static kiln_status parse_output(const kiln_json_doc *d, int t, int idx, kiln_mon_output *o,
                                char *err)
{
    char where[KILN_MON_NAME_MAX + 32];
    snprintf(where, sizeof where, "outputs[%d]", idx);
    if (d->tok[t].type != KILN_JSON_OBJECT) return ERR("profile: %s must be an object", where);
    if (!get_name(d, t, "name", 1, o->name, sizeof o->name, where, err)) return KILN_ERR_INVALID_ARGUMENT;
    snprintf(where, sizeof where, "output '%s'", o->name);
    if (!get_count(d, t, "count", 0, INT64_MAX, &o->count, where, err) ||
        !get_double(d, t, "mean_max_probability", 1, &o->mean_max_probability, where, err))
        return KILN_ERR_INVALID_ARGUMENT;
    if (kiln_json_object_get(d, t, "max_probability") >= 0) {
        int n;
        if (!get_counts(d, t, "max_probability", o->max_probability, KILN_MON_CONF_BUCKETS, &n,
                        where, err))
            return KILN_ERR_INVALID_ARGUMENT;
        if (n != KILN_MON_CONF_BUCKETS)
            return ERR("profile: %s: \"max_probability\" needs %d counts, got %d", where,
                       KILN_MON_CONF_BUCKETS, n);
    }
    return KILN_OK;
}

static kiln_status parse_rule(const kiln_json_doc *d, int t, int idx, kiln_mon_rule *r, char *err)
{
    char where[KILN_MON_NAME_MAX + 32];
    snprintf(where, sizeof where, "rules[%d]", idx);
    if (d->tok[t].type != KILN_JSON_OBJECT) return ERR("profile: %s must be an object", where);
    if (!get_name(d, t, "input", 1, r->input, sizeof r->input, where, err))
        return KILN_ERR_INVALID_ARGUMENT;
    snprintf(where, sizeof where, "rule for input '%s'", r->input);
    r->min = -INFINITY;
    r->max = INFINITY;
    if (!get_double(d, t, "min", 0, &r->min, where, err) ||
        !get_double(d, t, "max", 0, &r->max, where, err))
        return KILN_ERR_INVALID_ARGUMENT;
    if (r->min > r->max) return ERR("profile: %s: min %g is above max %g", where, r->min, r->max);
    int a = kiln_json_object_get(d, t, "allow_nan");
    if (a >= 0 && d->tok[a].type != KILN_JSON_TRUE && d->tok[a].type != KILN_JSON_FALSE)
        return ERR("profile: %s: \"allow_nan\" must be true or false", where);
    r->allow_nan = a >= 0 && d->tok[a].type == KILN_JSON_TRUE;
    int ac = kiln_json_object_get(d, t, "action");
    if (ac < 0 || kiln_json_string_eq(d, ac, "count")) r->reject = 0;
    else if (kiln_json_string_eq(d, ac, "reject")) r->reject = 1;
    else return ERR("profile: %s: \"action\" must be \"reject\" or \"count\"", where);
    return KILN_OK;
}

/* Parse an optional array member with parse_one for each element. */
#define PARSE_ARRAY(KEY, MAX, ARR, N, FN)                                                    \
    do {                                                                                     \
        int a_ = kiln_json_object_get(&doc, 0, KEY);                                         \
        if (a_ < 0) break;                                                                   \
        if (doc.tok[a_].type != KILN_JSON_ARRAY || doc.tok[a_].size > (MAX)) {               \
            st = ERR("profile: \"%s\" must be an array of at most %d entries", KEY, (MAX));  \
            goto err_free;                                                                   \
        }                                                                                    \
        if (doc.tok[a_].size) {                                                              \
            (ARR) = calloc(doc.tok[a_].size, sizeof *(ARR));                                 \
            if (!(ARR)) {                                                                    \
                st = ERR("profile: out of memory");                                          \
                goto err_free;                                                               \
            }                                                                                \
        }                                                                                    \
        int e_ = a_ + 1;                                                                     \
        for (uint32_t i_ = 0; i_ < doc.tok[a_].size; i_++) {                                 \
            (N) = (int)i_ + 1;                                                               \
            st = FN(&doc, e_, (int)i_, &(ARR)[i_], err);                                     \
            if (st != KILN_OK) goto err_free;                                                \
            e_ = (int)doc.tok[e_].next;                                                      \
        }                                                                                    \
    } while (0)

kiln_status kiln_mon_profile_parse(const char *text, size_t len, kiln_mon_profile **out, char *err)
{
    *out = NULL;
    kiln_json_doc doc;
    kiln_status st = kiln_json_parse(text, len, 16, &doc, err);
    if (st != KILN_OK) return st;
    kiln_mon_profile *p = kiln_mon_profile_new();
    if (!p) {
        kiln_json_doc_free(&doc);
        return ERR("profile: out of memory");
    }
    if (doc.tok[0].type != KILN_JSON_OBJECT) {
        st = ERR("profile: the top level must be an object");
        goto err_free;
    }
    int64_t fmt = 0;
    if (!get_count(&doc, 0, "kiln_profile", 1, 1, &fmt, "top level", err)) goto err_inval;
    if (fmt != 1) {
        st = ERR("profile: \"kiln_profile\": 1 (the format version) is missing");
        goto err_free;
    }
    int64_t ws = p->window_seconds, sw = p->sub_windows;
    if (!get_count(&doc, 0, "rows", 0, INT64_MAX, &p->rows, "top level", err) ||
        !get_count(&doc, 0, "window_seconds", 1, 86400, &ws, "top level", err) ||
        !get_count(&doc, 0, "sub_windows", 1, 60, &sw, "top level", err) ||
        !get_count(&doc, 0, "min_count", 1, INT64_MAX, &p->min_count, "top level", err))
        goto err_inval;
    p->window_seconds = (int)ws;
    p->sub_windows = (int)sw;
    int th = kiln_json_object_get(&doc, 0, "thresholds");
    if (th >= 0) {
        if (doc.tok[th].type != KILN_JSON_OBJECT) {
            st = ERR("profile: \"thresholds\" must be an object");
            goto err_free;
        }
        if (!get_double(&doc, th, "psi", 1, &p->psi_threshold, "thresholds", err) ||
            !get_double(&doc, th, "js", 1, &p->js_threshold, "thresholds", err) ||
            !get_double(&doc, th, "linf", 1, &p->linf_threshold, "thresholds", err))
            goto err_inval;
        if (!(p->psi_threshold > 0) || !(p->js_threshold > 0) || !(p->linf_threshold > 0)) {
            st = ERR("profile: \"thresholds\" must be positive");
            goto err_free;
        }
    }
    PARSE_ARRAY("features", KILN_MON_MAX_FEATURES, p->features, p->n_features, parse_feature);
    PARSE_ARRAY("outputs", KILN_MON_MAX_OUTPUTS, p->outputs, p->n_outputs, parse_output);
    PARSE_ARRAY("rules", KILN_MON_MAX_RULES, p->rules, p->n_rules, parse_rule);
    /* names label metric series: one series per name */
    for (int i = 0; i < p->n_features; i++)
        for (int k = 0; k < i; k++)
            if (strcmp(p->features[i].name, p->features[k].name) == 0) {
                st = ERR("profile: feature '%s' is listed twice", p->features[i].name);
                goto err_free;
            }
    for (int i = 0; i < p->n_rules; i++)
        for (int k = 0; k < i; k++)
            if (strcmp(p->rules[i].input, p->rules[k].input) == 0) {
                st = ERR("profile: input '%s' has two rules", p->rules[i].input);
                goto err_free;
            }
    kiln_json_doc_free(&doc);
    *out = p;
    return KILN_OK;

err_inval:
    st = KILN_ERR_INVALID_ARGUMENT;
err_free:
    kiln_json_doc_free(&doc);
    kiln_mon_profile_free(p);
    return st;
}

kiln_status kiln_mon_profile_load(const char *path, kiln_mon_profile **out, char *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, KILN_JSON_ERR_LEN, "%s: %s", path, strerror(errno));
        return KILN_ERR_IO;
    }
    char *buf = malloc(KILN_MON_PROFILE_MAX_BYTES + 1);
    if (!buf) {
        fclose(f);
        snprintf(err, KILN_JSON_ERR_LEN, "%s: out of memory", path);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    size_t n = fread(buf, 1, KILN_MON_PROFILE_MAX_BYTES + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > KILN_MON_PROFILE_MAX_BYTES) {
        free(buf);
        snprintf(err, KILN_JSON_ERR_LEN, "%s: %s", path,
                 bad ? "read error" : "larger than 16 MiB");
        return KILN_ERR_IO;
    }
    char msg[KILN_JSON_ERR_LEN];
    kiln_status st = kiln_mon_profile_parse(buf, n, out, msg);
    free(buf);
    if (st != KILN_OK) snprintf(err, KILN_JSON_ERR_LEN, "%s: %.400s", path, msg);
    return st;
}

/* ------------------------------------------------------------ writing */

static void put_num(kiln_sbuf *b, double v)
{
    if (isnan(v)) kiln_sbuf_puts(b, "NaN");
    else if (isinf(v)) kiln_sbuf_puts(b, v > 0 ? "Infinity" : "-Infinity");
    else {
        char t[32];
        snprintf(t, sizeof t, "%.15g", v); /* the shortest of %.15g and %.17g that reads back */
        if (strtod(t, NULL) != v) snprintf(t, sizeof t, "%.17g", v);
        kiln_sbuf_puts(b, t);
    }
}

static void put_counts(kiln_sbuf *b, const int64_t *c, int n)
{
    kiln_sbuf_puts(b, "[");
    for (int i = 0; i < n; i++) kiln_sbuf_printf(b, "%s%lld", i ? ", " : "", (long long)c[i]);
    kiln_sbuf_puts(b, "]");
}

void kiln_mon_profile_write(const kiln_mon_profile *p, kiln_sbuf *b)
{
    kiln_sbuf_printf(b, "{\n  \"kiln_profile\": 1,\n  \"rows\": %lld,\n", (long long)p->rows);
    kiln_sbuf_printf(b, "  \"window_seconds\": %d,\n  \"sub_windows\": %d,\n  \"min_count\": %lld,\n",
                     p->window_seconds, p->sub_windows, (long long)p->min_count);
    kiln_sbuf_puts(b, "  \"thresholds\": {\"psi\": ");
    put_num(b, p->psi_threshold);
    kiln_sbuf_puts(b, ", \"js\": ");
    put_num(b, p->js_threshold);
    kiln_sbuf_puts(b, ", \"linf\": ");
    put_num(b, p->linf_threshold);
    kiln_sbuf_puts(b, "},\n  \"features\": [");
    for (int i = 0; i < p->n_features; i++) {
        const kiln_mon_feature *f = &p->features[i];
        kiln_sbuf_puts(b, i ? ",\n    {\"name\": " : "\n    {\"name\": ");
        kiln_sbuf_json_string(b, f->name, strlen(f->name));
        kiln_sbuf_puts(b, ", \"input\": ");
        kiln_sbuf_json_string(b, f->input, strlen(f->input));
        kiln_sbuf_printf(b, ", \"column\": %d, \"kind\": \"%s\", \"count\": %lld, \"missing\": %lld, "
                            "\"nan\": %lld, \"inf\": %lld, \"min\": ",
                         f->column, f->kind == KILN_MON_NUMERIC ? "numeric" : "categorical",
                         (long long)f->count, (long long)f->missing, (long long)f->nan,
                         (long long)f->inf);
        put_num(b, f->min);
        kiln_sbuf_puts(b, ", \"max\": ");
        put_num(b, f->max);
        if (f->kind == KILN_MON_NUMERIC) {
            kiln_sbuf_puts(b, ",\n     \"edges\": [");
            for (int k = 0; k < f->n_edges; k++) {
                if (k) kiln_sbuf_puts(b, ", ");
                put_num(b, f->edges[k]);
            }
            kiln_sbuf_puts(b, "]");
        } else {
            kiln_sbuf_printf(b, ", \"value_type\": \"%s\",\n     \"values\": [",
                             f->strings ? "string" : "number");
            for (int k = 0; k < f->n_values; k++) {
                if (k) kiln_sbuf_puts(b, ", ");
                if (f->strings && utf8_valid((const unsigned char *)f->values[k], f->value_len[k]))
                    kiln_sbuf_json_string(b, f->values[k], f->value_len[k]);
                else if (f->strings) {
                    kiln_sbuf_puts(b, "{\"b64\": \"");
                    kiln_sbuf_base64(b, (const unsigned char *)f->values[k], f->value_len[k]);
                    kiln_sbuf_puts(b, "\"}");
                }
                else put_num(b, f->value_num[k]);
            }
            kiln_sbuf_puts(b, "]");
        }
        kiln_sbuf_puts(b, ",\n     \"counts\": ");
        put_counts(b, f->counts, f->n_counts);
        kiln_sbuf_puts(b, "}");
    }
    kiln_sbuf_puts(b, "\n  ],\n  \"outputs\": [");
    for (int i = 0; i < p->n_outputs; i++) {
        const kiln_mon_output *o = &p->outputs[i];
        kiln_sbuf_puts(b, i ? ",\n    {\"name\": " : "\n    {\"name\": ");
        kiln_sbuf_json_string(b, o->name, strlen(o->name));
        kiln_sbuf_printf(b, ", \"count\": %lld, \"mean_max_probability\": ", (long long)o->count);
        put_num(b, o->mean_max_probability);
        kiln_sbuf_puts(b, ", \"max_probability\": ");
        put_counts(b, o->max_probability, KILN_MON_CONF_BUCKETS);
        kiln_sbuf_puts(b, "}");
    }
    kiln_sbuf_puts(b, "\n  ],\n  \"rules\": [");
    for (int i = 0; i < p->n_rules; i++) {
        const kiln_mon_rule *r = &p->rules[i];
        kiln_sbuf_puts(b, i ? ",\n    {\"input\": " : "\n    {\"input\": ");
        kiln_sbuf_json_string(b, r->input, strlen(r->input));
        kiln_sbuf_puts(b, ", \"min\": ");
        put_num(b, r->min);
        kiln_sbuf_puts(b, ", \"max\": ");
        put_num(b, r->max);
        kiln_sbuf_printf(b, ", \"allow_nan\": %s, \"action\": \"%s\"}",
                         r->allow_nan ? "true" : "false", r->reject ? "reject" : "count");
    }
    kiln_sbuf_puts(b, "\n  ]\n}\n");
}

/* --------------------------------------------------------- statistics */

int kiln_mon_bin(const double *edges, int n_edges, double v)
{
    int lo = 0, hi = n_edges; /* the answer is in [lo, hi] */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (edges[mid] <= v) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

int kiln_mon_category_str(const kiln_mon_feature *f, const char *s, size_t n)
{
    for (int k = 0; k < f->n_values; k++)
        if (f->value_len[k] == n && memcmp(f->values[k], s, n) == 0) return k;
    return f->n_values;
}

int kiln_mon_category_num(const kiln_mon_feature *f, double v)
{
    for (int k = 0; k < f->n_values; k++)
        if (f->value_num[k] == v) return k;
    return f->n_values;
}

static int64_t total(const int64_t *c, int n)
{
    int64_t s = 0;
    for (int i = 0; i < n; i++) s += c[i];
    return s;
}

double kiln_mon_psi(const int64_t *ref, const int64_t *cur, int n)
{
    int64_t nr = total(ref, n), nc = total(cur, n);
    if (nr <= 0 || nc <= 0) return 0;
    double s = 0;
    for (int i = 0; i < n; i++) {
        double p = (double)ref[i] / (double)nr, q = (double)cur[i] / (double)nc;
        if (p < KILN_MON_PSI_FLOOR) p = KILN_MON_PSI_FLOOR;
        if (q < KILN_MON_PSI_FLOOR) q = KILN_MON_PSI_FLOOR;
        s += (q - p) * log(q / p);
    }
    return s;
}

double kiln_mon_js(const int64_t *ref, const int64_t *cur, int n)
{
    int64_t nr = total(ref, n), nc = total(cur, n);
    if (nr <= 0 || nc <= 0) return 0;
    double s = 0;
    for (int i = 0; i < n; i++) {
        double p = (double)ref[i] / (double)nr, q = (double)cur[i] / (double)nc, m = (p + q) / 2;
        if (p > 0) s += 0.5 * p * log2(p / m);
        if (q > 0) s += 0.5 * q * log2(q / m);
    }
    return s > 0 ? sqrt(s) : 0;
}

double kiln_mon_linf(const int64_t *ref, const int64_t *cur, int n)
{
    int64_t nr = total(ref, n), nc = total(cur, n);
    if (nr <= 0 || nc <= 0) return 0;
    double m = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)ref[i] / (double)nr - (double)cur[i] / (double)nc);
        if (d > m) m = d;
    }
    return m;
}

#define CONFIDENCE_BODY                                                                      \
    double a = -1, b2 = -1, h = 0;                                                           \
    for (int i = 0; i < c; i++) {                                                            \
        double v = (double)p[i];                                                             \
        if (!isfinite(v)) return 0;                                                          \
        if (v > a) {                                                                         \
            b2 = a;                                                                          \
            a = v;                                                                           \
        } else if (v > b2) {                                                                 \
            b2 = v;                                                                          \
        }                                                                                    \
        if (v > 0) h -= v * log(v);                                                          \
    }                                                                                        \
    *maxp = a;                                                                               \
    *margin = a - b2;                                                                        \
    *entropy = h / log((double)c);                                                           \
    return 1;

int kiln_mon_confidence_f32(const float *p, int c, double *maxp, double *margin, double *entropy)
{
    if (c < 2) return 0;
    CONFIDENCE_BODY
}

int kiln_mon_confidence_f64(const double *p, int c, double *maxp, double *margin, double *entropy)
{
    if (c < 2) return 0;
    CONFIDENCE_BODY
}

int kiln_mon_conf_bucket(double x)
{
    for (int k = 0; k < KILN_MON_CONF_BUCKETS; k++)
        if (x <= (double)(k + 1) / 10.0) return k;
    return KILN_MON_CONF_BUCKETS;
}

double kiln_mon_element(const kiln_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case KILN_DTYPE_F32: return ((const float *)t->data)[i];
    case KILN_DTYPE_F64: return ((const double *)t->data)[i];
    case KILN_DTYPE_F16: return kiln_f16_to_f32(((const uint16_t *)t->data)[i]);
    case KILN_DTYPE_BF16: return kiln_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case KILN_DTYPE_I8: return ((const int8_t *)t->data)[i];
    case KILN_DTYPE_U8: return ((const uint8_t *)t->data)[i];
    case KILN_DTYPE_BOOL: return ((const uint8_t *)t->data)[i] != 0;
    case KILN_DTYPE_I16: return ((const int16_t *)t->data)[i];
    case KILN_DTYPE_U16: return ((const uint16_t *)t->data)[i];
    case KILN_DTYPE_I32: return ((const int32_t *)t->data)[i];
    case KILN_DTYPE_U32: return ((const uint32_t *)t->data)[i];
    case KILN_DTYPE_I64: return (double)((const int64_t *)t->data)[i];
    case KILN_DTYPE_U64: return (double)((const uint64_t *)t->data)[i];
    default: return 0;
    }
}

int kiln_mon_numeric_dtype(kiln_dtype dt)
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
