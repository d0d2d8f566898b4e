/*
 * compile.h - what `kiln compile` measures and reports (compile_report.c);
 * the command itself, its flags and the `auto` policy are cmd_compile.c.
 *
 * Everything goes through the public API (kiln.h, including the per-node
 * precision calls at its end) and the release gate's data reader and
 * comparison (gate.h): the data sets are kiln_gate_data, one output over a
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

#define KILN_COMPILE_MIN_SAMPLES 10   /* fewer samples measure no accuracy worth the name */
#define KILN_COMPILE_EVAL_BATCH 64    /* rows per run when measuring (one batch size for
                                         every session, since dynamic int8 depends on it) */

/* Every output of one session over a data set. */
typedef struct kiln_compile_run {
    int n;                 /* signature outputs */
    kiln_gate_output *o;   /* [n] */
} kiln_compile_run;

kiln_status kiln_compile_run_all(kiln_session *s, const kiln_gate_data *d, int64_t batch,
                                 kiln_compile_run *out, char *err);
void kiln_compile_run_free(kiln_compile_run *r);

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
/* SQNR over every non-integer output of two runs together. */
double kiln_compile_sqnr(const kiln_compile_run *b, const kiln_compile_run *c);

/* A node that has a low-precision kernel (found by profiling one batch in
 * bf16 and in int8), with what was measured and decided for it. */
typedef struct kiln_compile_node {
    char *name, *op;         /* owned */
    int64_t weight_elems;    /* kiln_session_node_weight_elems */
    int kernel_in[3];        /* [KILN_PRECISION_BF16], [KILN_PRECISION_INT8]: has a kernel */
    int measured;            /* sqnr_db holds its sensitivity */
    kiln_precision measured_in;
    double sqnr_db;
    kiln_precision precision; /* the precision it runs in, as compiled */
    int fell_back;           /* auto moved it to a higher precision */
    char reason[384];        /* why it fell back */
    int step;                /* its step in the profiled plan (the report's order) */
} kiln_compile_node;

/* The nodes of signature `sig` of m that run in bf16 or int8 when asked
 * (so gives threads and optimize; sample rows: one batch of d). */
kiln_status kiln_compile_find_nodes(kiln_model *m, const char *sig, const kiln_session_options *so,
                                    const kiln_gate_data *d, int64_t batch,
                                    kiln_compile_node **nodes, int *n_nodes, char *err);
void kiln_compile_nodes_free(kiln_compile_node *nodes, int n);

/* Sensitivity of node k: an fp32 session with node k alone in `p`, run on d,
 * compared with base (the fp32 outputs on d). */
kiln_status kiln_compile_node_sensitivity(kiln_model *m, const char *sig,
                                          const kiln_session_options *so, kiln_compile_node *node,
                                          kiln_precision p, const kiln_gate_data *d,
                                          int64_t batch, const kiln_compile_run *base, char *err);

/* The precision a node really runs in (its asked precision if it has a
 * kernel for it, else fp32). */
kiln_precision kiln_compile_node_effective(const kiln_compile_node *n);

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
    int passed;                   /* the drop is within max_drop (or nothing to check) */
    char verdict[512];
} kiln_compile_report;

/* The report as JSON text (malloc'ed, NUL-terminated), or NULL when out of memory. */
char *kiln_compile_report_json(const kiln_compile_report *r);
/* The report as tables, for people. */
void kiln_compile_report_print(const kiln_compile_report *r, FILE *f);

#endif
