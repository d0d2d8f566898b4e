/*
 * compile.h - what `kiln compile` measures and reports (compile_report.c);
 * the command itself, its flags and the `auto` policy are cmd_compile.c.
 *
 * The pipeline itself (nodes, sensitivities, the auto policy, the compiled
 * session and its check) is the library's kiln_compile (kiln.h,
 * src/api/compile.c), shared with `kiln serve --allow_compression`.
 * Everything goes through the public API and the release gate's data
 * reader and comparison (gate.h): the data sets are kiln_gate_data, one output over a
 * data set is a kiln_gate_output, the metric and its drop come from
 * kiln_gate_compare, latency from kiln_gate_measure (interleaved).
 *
 * Definitions (docs/COMPRESSION.md states them for users), for a baseline
 * b (fp32) and a candidate c (compressed), elementwise over an output:
 *   abs error  |c - b|;  rel error  |c - b| / max(|b|, 1e-6)
 *   SQNR       10 log10(sum b^2 / sum (c - b)^2) dB, +inf when c == b
 *   top-1 agreement  share of samples whose argmax (first index of the
 *              maximum) is the same, for outputs with several values per
 *              sample, or equal class ids for integer outputs of one
 * A node's SQNR is its sensitivity: the SQNR of the model's floating-point
 * outputs (all of them together) when that node alone runs in the low
 * precision and every other node in fp32.
 */
#ifndef KILN_CLI_COMPILE_H
#define KILN_CLI_COMPILE_H

#include <stdio.h>

#include "cli/gate.h"
#include "kiln/kiln.h"

/* The error of one output of the candidate against the baseline. */
typedef struct kiln_compile_out_stats {
    const char *name;      /* borrowed from the signature */
    int64_t samples, row_size;
    int has_agreement;
    double agreement;
    double max_abs, mean_abs, max_rel, mean_rel;
    double sqnr_db;        /* INFINITY when identical */
} kiln_compile_out_stats;

void kiln_compile_out_compare(const kiln_gate_output *b, const kiln_gate_output *c,
                              kiln_compile_out_stats *st);

/* Sparse kernels and pruning (compile_sparse.c). */
typedef struct kiln_compile_sparse {
    const char *mode;          /* --sparse: "auto" or "off" */
    double prune_ratio;        /* --prune; 0 = not pruned */
    int prune_block;           /* 1 or 4 (--prune-block) */
    kiln_prune_stats prune;
    int n;                     /* nodes on sparse kernels in a batch-1 plan */
    char **node, **kernel;     /* [n], owned */
} kiln_compile_sparse;

/* The nodes of session s that run on sparse kernels (a profiled batch-1 run of zeros). */
kiln_status kiln_compile_sparse_nodes(kiln_session *s, const kiln_signature *sig,
                                      kiln_compile_sparse *sp, char *err);
void kiln_compile_sparse_free(kiln_compile_sparse *sp);
void kiln_compile_sparse_print(const kiln_compile_sparse *sp, FILE *f);
void kiln_compile_sparse_json(const kiln_compile_sparse *sp, FILE *f);

/* Everything the report shows. */
typedef struct kiln_compile_report {
    const char *model, *signature, *out_path;
    const char *precision_asked;  /* fp32, bf16, int8 or auto */
    kiln_precision precision;     /* the compiled session's precision */
    double max_drop;
    const char *cal_path;         /* NULL: none */
    int64_t cal_samples;          /* samples the node sensitivities were measured on */
    const char *cal_static;       /* static int8: the range method ("minmax", "percentile",
                                     "entropy"); NULL: dynamic int8 */
    const char *eval_path, *labels_path;
    int64_t eval_samples;
    int has_quality;
    const char *metric_output;
    kiln_gate_quality q;          /* of metric_output, when has_quality */
    int n_outputs;
    kiln_compile_out_stats *outs; /* [n_outputs] */
    int n_nodes;
    const kiln_compile_node *nodes;
    int64_t fp32_weight_bytes, compressed_weight_bytes;
    int n_latency;
    const kiln_gate_latency *latency;
    const kiln_compile_sparse *sparse; /* NULL: not reported */
    int tables_rounded;           /* --tables s8 applied (kiln_model_quantize_tables) */
    kiln_table_stats tables;
    int passed;                   /* the drop is within max_drop (or nothing to check) */
    const kiln_compile_result *auto_result; /* --precision auto: its static int8 candidates
                                               (the JSON's "auto"); NULL otherwise */
    char verdict[512];
} kiln_compile_report;

/* The report as JSON text (malloc'ed, NUL-terminated), or NULL when out of memory. */
char *kiln_compile_report_json(const kiln_compile_report *r);
/* The report as tables, for people. */
void kiln_compile_report_print(const kiln_compile_report *r, FILE *f);

#endif
