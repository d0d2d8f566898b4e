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

#define KILN_GATE_ERR_LEN KILN_EVAL_ERR_LEN

/* The data set, outputs and quality comparison are the library's (kiln.h,
 * src/api/compile_eval.c), shared with `kiln compile` and the server. */

/* The evaluation inputs: one tensor per signature input, stacked on dim 0. */
typedef kiln_dataset kiln_gate_data;

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

static inline kiln_status kiln_gate_data_rows(const kiln_gate_data *d, int64_t start,
                                              int64_t count, kiln_tensor **rows, char *err)
{
    return kiln_dataset_rows(d, start, count, rows, err);
}

/* The two signatures have the same inputs and outputs (names, dtypes,
 * ranks where both know them); err names the first difference. */
kiln_status kiln_gate_check_signatures(const kiln_signature *cand, const kiln_signature *base,
                                       char *err);

typedef kiln_eval_output kiln_gate_output;

static inline double kiln_gate_top1(const kiln_gate_output *o, int64_t i)
{
    return kiln_eval_top1(o, i);
}
static inline kiln_status kiln_gate_collect(kiln_session *s, const kiln_gate_data *d,
                                            const char *output, int64_t batch,
                                            kiln_gate_output *out, char *err)
{
    return kiln_eval_collect(s, d, output, batch, out, err);
}
static inline void kiln_gate_output_free(kiln_gate_output *o)
{
    kiln_eval_output_free(o);
}

typedef kiln_eval_kind kiln_gate_kind;
#define KILN_GATE_CLASS_IDS KILN_EVAL_CLASS_IDS
#define KILN_GATE_SCORES KILN_EVAL_SCORES
#define KILN_GATE_VALUES KILN_EVAL_VALUES
typedef kiln_eval_quality kiln_gate_quality;

static inline kiln_status kiln_gate_compare(const kiln_gate_output *b, const kiln_gate_output *c,
                                            const kiln_tensor *labels, kiln_gate_quality *q,
                                            char *err)
{
    return kiln_eval_compare(b, c, labels, q, err);
}

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
