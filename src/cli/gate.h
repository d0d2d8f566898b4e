/*
 * gate.h - the comparison behind `kiln gate` (cmd_gate.c): an evaluation
 * data set read for a signature, both models run on it, their outputs
 * compared (with labels: a quality metric each and the relative drop;
 * without: agreement and output distance), and latency measured
 * interleaved. docs/RELEASE_GATE.md states every metric and default.
 *
 * The CLI stays thin: it parses flags, calls these, prints the report and
 * writes the blessing (serve/gate/release.h). Everything here goes through
 * the public API (kiln.h) and the CLI's .npy reader (npy.h); nothing keeps
 * state between calls. Errors come back as a kiln_status with a one-line
 * message in err (KILN_GATE_ERR_LEN bytes) naming the file, input or
 * output concerned.
 */
#ifndef KILN_CLI_GATE_H
#define KILN_CLI_GATE_H

#include <stdint.h>

#include "kiln/kiln.h"

#define KILN_GATE_ERR_LEN 512

/* The evaluation inputs: one tensor per signature input, stacked on dim 0. */
typedef struct kiln_gate_data {
    int n;             /* signature inputs */
    char **names;      /* [n] input names (owned) */
    kiln_tensor **t;   /* [n] tensors, dims[0] = samples (owned) */
    int64_t samples;
} kiln_gate_data;

/* Read DATA for signature sig: a folder of <input>.npy files, a TF Serving
 * warmup file (named tf_serving_warmup_requests or *.tfrecord; its predict
 * records), or a JSON-lines file of TF Serving predict request bodies (one
 * per line, "instances" or "inputs"). Checks each input's dtype, rank and fixed
 * dimensions against sig and that all inputs have the same sample count. */
kiln_status kiln_gate_data_load(const char *path, const kiln_signature *sig, kiln_gate_data *out,
                                char *err);
void kiln_gate_data_free(kiln_gate_data *d);
/* Stricter checks for data that measures accuracy (`kiln compile`): at least
 * min_samples samples, and no NaN or infinity in a floating-point input;
 * err names `path`, the input and the first bad sample. */
kiln_status kiln_gate_data_check(const kiln_gate_data *d, const char *path, int64_t min_samples,
                                 char *err);

/* rows[0..d->n): new tensors holding `count` samples starting at `start`,
 * wrapping around the end of the data (owned by the caller). */
kiln_status kiln_gate_data_rows(const kiln_gate_data *d, int64_t start, int64_t count,
                                kiln_tensor **rows, char *err);

/* The two signatures have the same inputs and outputs (names, dtypes,
 * ranks where both know them); err names the first difference. */
kiln_status kiln_gate_check_signatures(const kiln_signature *cand, const kiln_signature *base,
                                       char *err);

/* One output of one model over the whole data set, as doubles. */
typedef struct kiln_gate_output {
    double *v;         /* [samples * row_size] (owned) */
    int64_t samples;
    int64_t row_size;  /* elements per sample */
    int is_int;        /* the output's dtype is an integer or bool type */
} kiln_gate_output;

/* The class of sample i of o: the value itself for one value per sample, else
 * the first index of the maximum (a NaN counts as the largest). */
double kiln_gate_top1(const kiln_gate_output *o, int64_t i);

/* Run s over all samples, `batch` at a time, and collect output `output`. */
kiln_status kiln_gate_collect(kiln_session *s, const kiln_gate_data *d, const char *output,
                              int64_t batch, kiln_gate_output *out, char *err);
void kiln_gate_output_free(kiln_gate_output *o);

typedef enum kiln_gate_kind {
    KILN_GATE_CLASS_IDS, /* integer output, one per sample: the class */
    KILN_GATE_SCORES,    /* float output, several per sample: class scores (argmax) */
    KILN_GATE_VALUES,    /* anything else: regression values */
} kiln_gate_kind;

typedef struct kiln_gate_quality {
    kiln_gate_kind kind;
    int64_t samples, row_size;
    int has_agreement;    /* class outputs only */
    double agreement;     /* share of samples whose top-1 class is the same */
    double mean_abs_diff; /* mean |c - b| over every element */
    double mean_rel_diff; /* mean |c - b| / max(|b|, 1e-6) */
    double max_abs_diff;
    int has_labels;
    const char *metric;   /* with labels: "accuracy" (higher is better) or "rmse" (lower) */
    double base_metric, cand_metric;
    double base_mae, cand_mae; /* regression only */
    const char *drop_of;  /* what `drop` measures, for the report */
    double drop;          /* relative drop of quality, compared with --max-drop (>= 0 is worse) */
} kiln_gate_quality;

/* Compare candidate c with baseline b (same shape); labels (may be NULL)
 * holds label_row_size values per sample. */
kiln_status kiln_gate_compare(const kiln_gate_output *b, const kiln_gate_output *c,
                              const kiln_tensor *labels, kiln_gate_quality *q, char *err);

/* Latency at one batch size: `runs` timed runs of each model, alternated
 * (candidate first on even runs, baseline first on odd ones) after a few
 * untimed warmup runs, each on the next `batch` samples of the data. */
typedef struct kiln_gate_latency {
    int64_t batch;
    int runs;
    double cand_p50_ms, cand_p99_ms, base_p50_ms, base_p99_ms;
    double cand_mean_ms, base_mean_ms;
} kiln_gate_latency;

kiln_status kiln_gate_measure(kiln_session *cand, kiln_session *base, const kiln_gate_data *d,
                              int64_t batch, int runs, kiln_gate_latency *out, char *err);

/* The nearest-rank percentile p (0..100) of v[0..n) (sorted in place). */
double kiln_gate_percentile(double *v, int n, double p);

#endif
