/*
 * profile.h - reference profiles for model monitoring: what a model's
 * inputs and probability outputs looked like on reference data, as written
 * by `kiln profile` and read by `kiln serve` from a version folder's
 * assets.extra/kiln_profile.json (docs/MONITORING.md has the format).
 *
 * A profile lists features (one per column of a rank-2 input with at most
 * KILN_MON_MAX_COLUMNS columns, else one per input pooling all its
 * elements), each numeric (fixed bins: edges from the reference deciles,
 * with the reference count in each bin) or categorical (the reference's
 * top-k values and their counts, plus one "other" count); the reference
 * distribution of the max probability of each probability output; drift
 * thresholds and the sliding window; and optional validation rules per
 * input (range, NaN allowed, reject or count).
 *
 * The statistics comparing a live histogram with the reference (PSI,
 * Jensen-Shannon distance, L-infinity) and a probability row's confidence
 * (max probability, margin, normalized entropy) are here too, so the CLI,
 * the server and the tests share one definition.
 *
 * Profiles are untrusted bytes (a version folder is data): the parser
 * bounds every count and length, and every error names the field and the
 * bad value (fuzz/fuzz_monitor_profile.c).
 */
#ifndef KILN_SERVE_MONITOR_PROFILE_H
#define KILN_SERVE_MONITOR_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"
#include "serve/json.h"

#define KILN_MON_PROFILE_FILE "kiln_profile.json" /* in a version's assets.extra/ */
#define KILN_MON_PROFILE_MAX_BYTES (16u << 20)
#define KILN_MON_NAME_MAX 128      /* input, output and feature names, with the NUL */
#define KILN_MON_MAX_BINS 64       /* numeric bins (edges + 1) */
#define KILN_MON_MAX_VALUES 64     /* categorical values kept (plus "other") */
#define KILN_MON_MAX_FEATURES 4096
#define KILN_MON_MAX_OUTPUTS 64
#define KILN_MON_MAX_RULES 256
#define KILN_MON_MAX_COLUMNS 64    /* rank-2 inputs wider than this are pooled */
#define KILN_MON_CONF_BUCKETS 10   /* confidence histograms: le 0.1, 0.2, ..., 1.0 */

/* Defaults (docs/MONITORING.md gives their sources). */
#define KILN_MON_DEFAULT_PSI 0.25
#define KILN_MON_DEFAULT_JS 0.1
#define KILN_MON_DEFAULT_LINF 0.1
#define KILN_MON_DEFAULT_WINDOW_S 300
#define KILN_MON_DEFAULT_SUB_WINDOWS 5
#define KILN_MON_DEFAULT_MIN_COUNT 500

typedef enum kiln_mon_kind {
    KILN_MON_NUMERIC = 0,
    KILN_MON_CATEGORICAL = 1,
} kiln_mon_kind;

typedef struct kiln_mon_feature {
    char name[KILN_MON_NAME_MAX];  /* "x" (pooled) or "x[3]" (column 3) */
    char input[KILN_MON_NAME_MAX]; /* the signature input it reads */
    int column;                    /* column of a rank-2 input, -1 = every element */
    int kind;                      /* kiln_mon_kind */
    int strings;                   /* categorical: values are byte strings (else numbers) */
    int64_t count;                 /* reference values in the histogram */
    int64_t missing, nan, inf;     /* reference anomalies (not in the histogram) */
    double min, max;               /* of the finite reference values */
    int n_edges;                   /* numeric: bin i holds edges[i-1] <= v < edges[i] */
    double edges[KILN_MON_MAX_BINS - 1];
    int n_values;                  /* categorical: values kept */
    char *values[KILN_MON_MAX_VALUES]; /* owned, NUL-terminated (may hold NULs: see len) */
    size_t value_len[KILN_MON_MAX_VALUES];
    double value_num[KILN_MON_MAX_VALUES]; /* numeric categories parsed */
    int n_counts;                  /* n_edges + 1, or n_values + 1 (the last is "other") */
    int64_t counts[KILN_MON_MAX_BINS + 1];
} kiln_mon_feature;

typedef struct kiln_mon_output {
    char name[KILN_MON_NAME_MAX];  /* a probability output of the signature */
    int64_t count;                 /* reference rows */
    double mean_max_probability;   /* of the reference rows */
    int64_t max_probability[KILN_MON_CONF_BUCKETS]; /* rows per bucket (not cumulative) */
} kiln_mon_output;

typedef struct kiln_mon_rule {
    char input[KILN_MON_NAME_MAX];
    double min, max;               /* allowed range (-inf / +inf when absent) */
    int allow_nan;                 /* default 0 */
    int reject;                    /* 1: answer 400; 0: count only */
} kiln_mon_rule;

typedef struct kiln_mon_profile {
    int64_t rows;                  /* reference samples */
    double psi_threshold, js_threshold, linf_threshold;
    int window_seconds, sub_windows;
    int64_t min_count;             /* window values needed before drift is reported */
    int n_features;
    kiln_mon_feature *features;    /* owned */
    int n_outputs;
    kiln_mon_output *outputs;      /* owned */
    int n_rules;
    kiln_mon_rule *rules;          /* owned */
} kiln_mon_profile;

/* A new empty profile with the defaults above (NULL when out of memory). */
kiln_mon_profile *kiln_mon_profile_new(void);
void kiln_mon_profile_free(kiln_mon_profile *p);
/* Parse the JSON of a profile. On success *out is owned by the caller; on
 * failure err (KILN_JSON_ERR_LEN bytes) names the field and the value. */
kiln_status kiln_mon_profile_parse(const char *text, size_t len, kiln_mon_profile **out, char *err);
/* Read and parse the file at path (at most KILN_MON_PROFILE_MAX_BYTES). */
kiln_status kiln_mon_profile_load(const char *path, kiln_mon_profile **out, char *err);
/* The profile as JSON (what the parser reads). */
void kiln_mon_profile_write(const kiln_mon_profile *p, kiln_sbuf *b);

/* The numeric bin of v (finite): the number of edges <= v. */
int kiln_mon_bin(const double *edges, int n_edges, double v);
/* The categorical slot of a value: its index among the kept values, or
 * n_values ("other"). */
int kiln_mon_category_str(const kiln_mon_feature *f, const char *s, size_t n);
int kiln_mon_category_num(const kiln_mon_feature *f, double v);

/* Distances between a reference histogram ref[0..n) and a live one
 * cur[0..n) (counts; each normalized to proportions). PSI floors each
 * proportion at KILN_MON_PSI_FLOOR; JS is the Jensen-Shannon distance in
 * base 2 (the square root of the divergence, in [0, 1]); L-infinity is the
 * largest difference of a proportion. Empty histograms give 0. */
#define KILN_MON_PSI_FLOOR 1e-4
double kiln_mon_psi(const int64_t *ref, const int64_t *cur, int n);
double kiln_mon_js(const int64_t *ref, const int64_t *cur, int n);
double kiln_mon_linf(const int64_t *ref, const int64_t *cur, int n);

/* Confidence of one probability row p[0..c) (c >= 2): the max probability,
 * the margin between the two largest, and the entropy divided by ln(c) (in
 * [0, 1]). Returns 0 when a value is not finite (the row is skipped). */
int kiln_mon_confidence_f32(const float *p, int c, double *maxp, double *margin, double *entropy);
int kiln_mon_confidence_f64(const double *p, int c, double *maxp, double *margin, double *entropy);
/* The confidence bucket of x: the smallest k with x <= (k + 1) / 10, or
 * KILN_MON_CONF_BUCKETS (+Inf) above 1. */
int kiln_mon_conf_bucket(double x);

/* Element i of a numeric tensor as a double (bool, integers, f16, bf16, f32,
 * f64); 0 for other dtypes. */
double kiln_mon_element(const kiln_tensor *t, int64_t i);
/* True for the dtypes kiln_mon_element reads. */
int kiln_mon_numeric_dtype(kiln_dtype dt);

#endif
