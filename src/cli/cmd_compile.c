/*
 * cmd_compile.c - `kiln compile MODEL -o OUT.kiln`: compile a model in a
 * chosen precision, measure what the compression costs on the user's data,
 * and write the compiled artifact (kiln_session_save) with the report in it.
 *
 * --precision fp32|bf16|int8 compiles every node that has a kernel for the
 * precision in it. --precision auto is accuracy-aware mixed precision: the
 * most sensitive nodes stay in bf16 or fp32 until the metric's drop is
 * within --max-drop. The pipeline (nodes, sensitivities, the auto policy,
 * static int8, the compiled session and its check) is the library's
 * kiln_compile (kiln.h, src/api/compile.c), shared with `kiln serve
 * --allow_compression`; this command reads the data, adds the report's
 * per-output table and latency, and writes the artifact.
 *
 * The report (table and JSON) is compile_report.c;
 * the data reader and the metric are the release gate's (gate.h), so a
 * compile and a `kiln gate` of its artifact measure the same way. A drop
 * beyond --max-drop exits 1 naming it and writes no artifact.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/compile.h"
#include "cli/npy.h"

#define COMPILE_MAX_BATCH_SIZES 16

static const char compile_help[] =
    "usage: kiln compile MODEL -o OUT.kiln [options]\n"
    "\n"
    "Compile MODEL (ONNX or SavedModel) in a lower precision, measure the accuracy\n"
    "it costs on your data against fp32, and write a .kiln artifact that loads\n"
    "without import or optimization (docs/COMPRESSION.md, docs/KILN_FORMAT.md).\n"
    "\n"
    "  -o, --output FILE    the .kiln file to write\n"
    "  --precision P        fp32, bf16, int8 (dynamic quantization) or auto (default):\n"
    "                       int8 where it keeps the metric within --max-drop, the most\n"
    "                       sensitive nodes in bf16 or fp32\n"
    "  --calibration DATA   data to measure each node's sensitivity on (auto)\n"
    "  --calibration-method M  static int8 (with --precision int8 --calibration DATA):\n"
    "                       activation ranges fixed from DATA by minmax, percentile\n"
    "                       (99.99%) or entropy (KL); without it int8 is dynamic\n"
    "  --eval DATA          data to measure accuracy on (default: the calibration data)\n"
    "  --labels FILE.npy    expected outputs of --eval: class ids or values\n"
    "  --max-drop X         largest relative drop of the metric, e.g. 1%% (default) or\n"
    "                       0.01; without labels: 1 - top-1 agreement with fp32\n"
    "  --metric-output NAME the output the metric is computed on (default: the first)\n"
    "  --batch-sizes LIST   batch sizes to time and precompile at load (default 1,8,32)\n"
    "  --runs N             timed runs per batch size and model (default 20)\n"
    "  --report FILE.json   also write the report as JSON (it is stored in the .kiln too)\n"
    "  --signature NAME     signature to compile (default: the default one)\n"
    "  --tags TAGS          SavedModel MetaGraph tags (default serve)\n"
    "  --threads N          intra-op threads (default 0: all cores)\n"
    "  --tables MODE        s8 (default with --precision int8 and no --emit-onnx): the\n"
    "                       embedding tables (a Gather's constant f32 matrix) rounded to s8\n"
    "                       per row, stored so; f32: left as they are\n"
    "  --sparse MODE        auto (default): MatMul/Gemm and 1x1 Conv nodes with mostly-zero\n"
    "                       weights run on sparse kernels where that measures faster;\n"
    "                       off: never\n"
    "  --prune RATIO        zero that share (0 < RATIO < 1) of each MatMul, Gemm and 1x1\n"
    "                       convolution weight by magnitude first (one shot; the report\n"
    "                       shows what it costs against the unpruned fp32 model)\n"
    "  --prune-block N      1 (default): single weights; 4: 1x4 blocks along the reduction\n"
    "  --emit-onnx FILE     also write the static int8 model as ONNX QDQ (ONNX sources;\n"
    "                       needs --precision int8 --calibration DATA; minmax unless\n"
    "                       --calibration-method says otherwise)\n"
    "\n"
    "DATA is a folder of NAME.npy files (one per input, first dimension = samples),\n"
    "an .npz archive of them, a TF Serving warmup file (tf_serving_warmup_requests),\n"
    "or a JSON-lines file of TF Serving predict request bodies; at least 10 samples,\n"
    "no NaN or infinity.\n";

typedef struct compile_args {
    const char *model, *out, *cal, *eval, *labels, *report, *signature, *tags, *metric_output;
    const char *precision;   /* as given */
    const char *cal_method;  /* --calibration-method, NULL = minmax */
    const char *sparse;      /* --sparse: "auto" or "off" */
    const char *tables;      /* --tables: "s8", "f32", or NULL (s8 for dynamic or static int8) */
    double prune;            /* --prune RATIO, 0 = none */
    int prune_block;         /* --prune-block: 1 or 4 */
    const char *emit_onnx;   /* --emit-onnx FILE.onnx, or NULL */
    int is_auto;
    kiln_precision prec;
    double max_drop;
    int64_t batch[COMPILE_MAX_BATCH_SIZES];
    int n_batch, runs;
    kiln_session_options so;
} compile_args;

/* "1%", "0.5 %" or "0.01" as a fraction; false if not one in [0, 1e6]. */
static int parse_fraction(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v < 0) return 0;
    while (*end == ' ') end++;
    if (*end == '%') {
        v /= 100;
        end++;
    }
    if (*end || v > 1e6) return 0;
    *out = v;
    return 1;
}

static int parse_batch_sizes(const char *s, compile_args *a)
{
    a->n_batch = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 1 || v > 1 << 20 || a->n_batch == COMPILE_MAX_BATCH_SIZES) return 0;
        a->batch[a->n_batch++] = v;
        if (*end == ',') end++;
        else if (*end) return 0;
        p = end;
    }
    return a->n_batch > 0;
}

/* Returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, compile_args *a)
{
    const char *cmd = "compile";
    for (int i = 0; i < argc; i++) {
        const char *val = NULL;
        int r;
        if (argv[i][0] != '-') {
            if (a->model) return kiln_cli_usage_error(cmd, "unexpected argument '%s'", argv[i]);
            a->model = argv[i];
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "-o", &a->out)) != 0 ||
                   (r = kiln_cli_option(cmd, argc, argv, &i, "--output", &a->out)) != 0 ||
                   (r = kiln_cli_option(cmd, argc, argv, &i, "--calibration", &a->cal)) != 0 ||
                   (r = kiln_cli_option(cmd, argc, argv, &i, "--calibration-method",
                                        &a->cal_method)) != 0 ||
                   (r = kiln_cli_option(cmd, argc, argv, &i, "--eval", &a->eval)) != 0 ||
                   (r = kiln_cli_option(cmd, argc, argv, &i, "--labels", &a->labels)) != 0 ||
                   (r = kiln_cli_option(cmd, argc, argv, &i, "--report", &a->report)) != 0 ||
                   (r = kiln_cli_option(cmd, argc, argv, &i, "--signature", &a->signature)) != 0 ||
                   (r = kiln_cli_option(cmd, argc, argv, &i, "--tags", &a->tags)) != 0 ||
                   (r = kiln_cli_option(cmd, argc, argv, &i, "--emit-onnx", &a->emit_onnx)) != 0 ||
                   (r = kiln_cli_option(cmd, argc, argv, &i, "--metric-output",
                                        &a->metric_output)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--precision", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            a->precision = val;
            a->is_auto = !strcmp(val, "auto");
            if (!a->is_auto && kiln_precision_parse(val, &a->prec) != KILN_OK)
                return kiln_cli_usage_error(cmd, "--precision '%s' is not fp32, bf16, int8 or auto",
                                            val);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--max-drop", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!parse_fraction(val, &a->max_drop))
                return kiln_cli_usage_error(cmd, "--max-drop '%s' is not a share like 1%% or 0.01",
                                            val);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--batch-sizes", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!parse_batch_sizes(val, a))
                return kiln_cli_usage_error(cmd, "--batch-sizes '%s' is not a list like 1,8,32 "
                                            "(at most %d sizes)",
                                            val, COMPILE_MAX_BATCH_SIZES);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--runs", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!kiln_cli_parse_int(val, 1, 100000, &a->runs))
                return kiln_cli_usage_error(cmd, "--runs '%s' is not a count from 1 to 100000", val);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--tables", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (strcmp(val, "s8") && strcmp(val, "f32"))
                return kiln_cli_usage_error(cmd, "--tables '%s' is not s8 or f32", val);
            a->tables = val;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--sparse", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (strcmp(val, "auto") && strcmp(val, "off"))
                return kiln_cli_usage_error(cmd, "--sparse '%s' is not auto or off", val);
            a->sparse = val;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--prune", &val)) != 0) {
            char *end = NULL;
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            a->prune = strtod(val, &end);
            if (end == val || *end || !(a->prune > 0.0 && a->prune < 1.0))
                return kiln_cli_usage_error(cmd, "--prune '%s' is not a ratio between 0 and 1 "
                                            "(exclusive), e.g. 0.5", val);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--prune-block", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (strcmp(val, "1") && strcmp(val, "4"))
                return kiln_cli_usage_error(cmd, "--prune-block '%s' is not 1 or 4", val);
            a->prune_block = val[0] - '0';
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--threads", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!kiln_cli_parse_int(val, 0, 4096, &a->so.threads))
                return kiln_cli_usage_error(cmd, "--threads '%s' is not a count from 0 to 4096", val);
        } else {
            return kiln_cli_usage_error(cmd, "unknown option '%s'", argv[i]);
        }
    }
    if (!a->model) return kiln_cli_usage_error(cmd, "missing MODEL");
    if (!a->out) return kiln_cli_usage_error(cmd, "missing -o OUT.kiln");
    if (a->emit_onnx && (a->is_auto || a->prec != KILN_PRECISION_INT8 || !a->cal))
        return kiln_cli_usage_error(cmd, "--emit-onnx writes static int8 as ONNX QDQ: give "
                                    "--precision int8 and --calibration DATA (dynamic int8 "
                                    "measures activation scales on every run, which QDQ's fixed "
                                    "scales cannot express)");
    if (a->labels && !a->eval && !a->cal)
        return kiln_cli_usage_error(cmd, "--labels needs --eval DATA (the samples they label)");
    if (a->labels && !a->eval)
        return kiln_cli_usage_error(cmd, "--labels belong to --eval DATA; give --eval");
    if (a->is_auto && !a->cal && !a->eval)
        return kiln_cli_usage_error(cmd, "--precision auto needs data to measure accuracy on: "
                                    "--calibration DATA and/or --eval DATA");
    if (a->emit_onnx && !a->cal_method) a->cal_method = "minmax";
    if (a->cal_method && strcmp(a->cal_method, "minmax") && strcmp(a->cal_method, "percentile") &&
        strcmp(a->cal_method, "entropy"))
        return kiln_cli_usage_error(cmd, "--calibration-method '%s' is not minmax, percentile or "
                                    "entropy", a->cal_method);
    if (a->cal_method && (a->is_auto || a->prec != KILN_PRECISION_INT8 || !a->cal))
        return kiln_cli_usage_error(cmd, "--calibration-method is for static int8: give "
                                    "--precision int8 and --calibration DATA");
    return -1;
}

/* Load and check one data set; prints the error. */
static int load_data(const char *what, const char *path, const kiln_signature *sig,
                     kiln_gate_data *d)
{
    char err[KILN_GATE_ERR_LEN];
    if (kiln_gate_data_load(path, sig, d, err) != KILN_OK ||
        kiln_gate_data_check(d, path, KILN_COMPILE_MIN_SAMPLES, err) != KILN_OK) {
        kiln_cli_fail("%s: %s", what, err);
        return 0;
    }
    return 1;
}

int kiln_cmd_compile(int argc, char **argv)
{
    if (kiln_cli_wants_help(argc, argv)) {
        fputs(compile_help, stdout);
        return KILN_CLI_EXIT_OK;
    }
    compile_args a;
    memset(&a, 0, sizeof a);
    kiln_session_options_init(&a.so);
    a.precision = "auto";
    a.is_auto = 1;
    a.max_drop = 0.01;
    a.batch[0] = 1, a.batch[1] = 8, a.batch[2] = 32, a.n_batch = 3;
    a.runs = 20;
    a.sparse = "auto";
    a.prune_block = 1;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    if (!strcmp(a.sparse, "off")) setenv("KILN_SPARSE", "off", 1); /* read by the kernels */
    const char *cal_method_name = a.cal_method ? a.cal_method : "";
    kiln_calibration_method cal_method = !strcmp(cal_method_name, "entropy")
                                             ? KILN_CALIBRATION_ENTROPY
                                         : !strcmp(cal_method_name, "percentile")
                                             ? KILN_CALIBRATION_PERCENTILE
                                             : KILN_CALIBRATION_MINMAX;
    rc = KILN_CLI_EXIT_FAIL;

    char err[KILN_GATE_ERR_LEN];
    kiln_model *m = NULL;
    kiln_gate_data cal = {0}, eval = {0};
    kiln_tensor *labels = NULL;
    kiln_compile_result cr;
    memset(&cr, 0, sizeof cr);
    kiln_compile_out_stats *outs = NULL;
    kiln_gate_latency lat[COMPILE_MAX_BATCH_SIZES];
    char *json = NULL;
    kiln_compile_report r;
    memset(&r, 0, sizeof r);
    kiln_model *mc = NULL; /* the model compiled: m, or m pruned (--prune) */
    kiln_compile_sparse sp = {a.sparse, a.prune, a.prune_block, {0, 0, 0}, 0, NULL, NULL};

    m = kiln_cli_load_model(a.model, a.tags);
    if (!m) goto out;
    const kiln_signature *sig = kiln_model_find_signature(m, a.signature);
    if (!sig) {
        kiln_cli_fail("the model has no signature '%s'", a.signature ? a.signature : "(default)");
        goto out;
    }
    const char *sig_name = kiln_signature_name(sig);
    mc = m;
    /* int8: embedding tables in s8 per row, as the file stores them (not with --emit-onnx,
     * whose QDQ model keeps the source's tables: ONNX Runtime must compute what Kiln does) */
    int round_tables = a.tables ? !strcmp(a.tables, "s8")
                                : !a.is_auto && a.prec == KILN_PRECISION_INT8 && !a.emit_onnx;
    if (a.prune > 0 || round_tables) { /* a second copy; the fp32 baseline stays as loaded */
        if (!(mc = kiln_cli_load_model(a.model, a.tags))) goto out;
        if (a.prune > 0 && kiln_model_prune(mc, a.prune, a.prune_block, &sp.prune) != KILN_OK) {
            kiln_cli_fail("--prune: %s", kiln_last_error());
            goto out;
        }
        if (round_tables && kiln_model_quantize_tables(mc, &r.tables) != KILN_OK) {
            kiln_cli_fail("--tables s8: %s", kiln_last_error());
            goto out;
        }
        r.tables_rounded = round_tables;
    }
    if (a.cal && !load_data("--calibration", a.cal, sig, &cal)) goto out;
    if (a.eval && !load_data("--eval", a.eval, sig, &eval)) goto out;
    const kiln_gate_data *sens_data = a.cal ? &cal : a.eval ? &eval : NULL;
    const kiln_gate_data *eval_data = a.eval ? &eval : a.cal ? &cal : NULL;
    const char *eval_path = a.eval ? a.eval : a.cal;
    if (a.labels) {
        if (kiln_npy_read(a.labels, &labels) != KILN_OK) {
            kiln_cli_fail("--labels: %s", kiln_npy_last_error());
            goto out;
        }
        if (labels->rank < 1 || labels->dims[0] != eval.samples) {
            kiln_cli_fail("--labels '%s' holds %lld rows; --eval '%s' has %lld samples", a.labels,
                          labels->rank ? (long long)labels->dims[0] : 0LL, a.eval,
                          (long long)eval.samples);
            goto out;
        }
    }
    /* a fixed batch dimension decides the batch sizes */
    int64_t fixed = -1;
    for (int i = 0; i < kiln_signature_input_count(sig); i++) {
        const kiln_value_info *vi = kiln_signature_input(sig, i);
        if (vi->rank > 0 && vi->dims[0] > 0) fixed = vi->dims[0];
    }
    if (fixed > 0) {
        a.batch[0] = fixed, a.n_batch = 1;
        for (int k = 0; k < 2; k++) {
            const kiln_gate_data *d = k ? &eval : &cal;
            if (d->samples % fixed) {
                kiln_cli_fail("the model's batch dimension is fixed at %lld; %s '%s' has %lld "
                              "samples, not a multiple of it",
                              (long long)fixed, k ? "--eval" : "--calibration", k ? a.eval : a.cal,
                              (long long)d->samples);
                goto out;
            }
        }
    }
    if (kiln_signature_output_count(sig) < 1) {
        kiln_cli_fail("the signature has no outputs");
        goto out;
    }
    const char *metric_output = a.metric_output ? a.metric_output : kiln_signature_output(sig, 0)->name;
    int metric_index = -1;
    for (int i = 0; i < kiln_signature_output_count(sig); i++)
        if (!strcmp(kiln_signature_output(sig, i)->name, metric_output)) metric_index = i;
    if (metric_index < 0) {
        kiln_cli_fail("--metric-output '%s' is not an output of the signature", metric_output);
        goto out;
    }
    kiln_compile_options co;
    kiln_compile_options_init(&co);
    co.is_auto = a.is_auto;
    co.precision = a.prec;
    co.max_drop = a.max_drop;
    co.metric_output = metric_output;
    co.labels = labels;
    co.static_int8 = a.cal_method != NULL; /* checked: --precision int8 and --calibration */
    co.cal_method = cal_method;
    co.session = a.so;
    co.candidate_model = mc; /* --prune: the pruned copy, measured against m */
    if (kiln_compile(m, sig_name, &co, sens_data, eval_data, &cr, err) != KILN_OK) {
        kiln_cli_fail("%s", err);
        goto out;
    }
    kiln_precision prec = cr.precision;
    kiln_compile_node *nodes = cr.nodes;
    int n_nodes = cr.n_nodes;
    kiln_session *cand = cr.session, *base = NULL;
    int static_int8 = co.static_int8 || cr.auto_static; /* auto may choose static int8 */
    const char *cal_method_used = co.static_int8 ? cal_method_name : "minmax";

    if (kiln_compile_sparse_nodes(cand, sig, &sp, err) != KILN_OK) {
        kiln_cli_fail("%s", err);
        goto out;
    }

    /* the report */
    r.sparse = &sp;
    r.model = a.model;
    r.signature = sig_name;
    r.out_path = a.out;
    r.precision_asked = a.precision;
    r.precision = prec;
    r.max_drop = a.max_drop;
    r.cal_path = a.cal;
    r.cal_samples = cr.cal_samples;
    r.cal_static = static_int8 ? cal_method_used : NULL;
    r.eval_path = eval_data ? eval_path : NULL;
    r.labels_path = a.labels;
    r.eval_samples = eval_data ? eval_data->samples : 0;
    r.nodes = nodes;
    r.n_nodes = n_nodes;
    r.auto_result = a.is_auto ? &cr : NULL;
    r.passed = 1;
    if (eval_data) {
        const kiln_compile_run *be = &cr.base_eval, *ce = &cr.cand_eval;
        outs = calloc((size_t)be->n + 1, sizeof *outs);
        if (!outs) {
            kiln_cli_fail("out of memory");
            goto out;
        }
        for (int i = 0; i < be->n; i++) {
            kiln_compile_out_compare(&be->o[i], &ce->o[i], &outs[i]);
            outs[i].name = kiln_signature_output(sig, i)->name;
        }
        r.outs = outs;
        r.n_outputs = be->n;
        r.q = cr.q;
        r.has_quality = 1;
        r.metric_output = metric_output;
        r.passed = cr.passed;
        kiln_session_options so = a.so;
        so.precision = KILN_PRECISION_FP32;
        if (kiln_session_create(m, sig_name, &so, &base) != KILN_OK) {
            kiln_cli_fail("cannot create a session: %s", kiln_last_error());
            goto out;
        }
        for (int i = 0; i < a.n_batch; i++) {
            kiln_status mst = kiln_gate_measure(cand, base, eval_data, a.batch[i], a.runs, &lat[i], err);
            if (mst != KILN_OK) {
                kiln_session_free(base);
                kiln_cli_fail("%s", err);
                goto out;
            }
        }
        kiln_session_free(base);
        r.latency = lat;
        r.n_latency = a.n_batch;
    }
    kiln_model_stats ms;
    kiln_model_get_stats(m, &ms);
    r.fp32_weight_bytes = ms.param_bytes;
    r.compressed_weight_bytes = ms.param_bytes;
    for (int i = 0; i < n_nodes; i++) {
        kiln_precision p = kiln_compile_node_effective(&nodes[i]);
        int64_t w = nodes[i].weight_elems > 0 ? nodes[i].weight_elems : 0;
        r.compressed_weight_bytes -= w * (p == KILN_PRECISION_INT8 ? 3 : p == KILN_PRECISION_BF16 ? 2 : 0);
    }
    /* static int8: the quantized graph's own constants (its per-node list is dynamic int8's) */
    if (static_int8 && cr.static_weight_bytes > 0) r.compressed_weight_bytes = cr.static_weight_bytes;
    /* s8 tables: a byte an element (and a scale a row, left out) */
    if (r.tables_rounded) r.compressed_weight_bytes -= 3 * r.tables.elements;
    int fell = 0;
    for (int i = 0; i < n_nodes; i++) fell += nodes[i].fell_back;
    if (!r.has_quality)
        snprintf(r.verdict, sizeof r.verdict,
                 "accuracy not checked: no --eval or --calibration data was given");
    else if (r.passed)
        snprintf(r.verdict, sizeof r.verdict, "passed: %s %.4f%% <= --max-drop %.4g%%", r.q.drop_of,
                 100 * r.q.drop, 100 * a.max_drop);
    else
        snprintf(r.verdict, sizeof r.verdict,
                 "FAILED: %s %.4f%% exceeds --max-drop %.4g%% (output '%.100s'); no artifact written",
                 r.q.drop_of, 100 * r.q.drop, 100 * a.max_drop, metric_output);
    if (a.is_auto) {
        size_t len = strlen(r.verdict);
        if (cr.auto_static && cr.auto_static_kept == 0)
            snprintf(r.verdict + len, sizeof r.verdict - len,
                     "; auto: static int8 of the whole model (MinMax), within the bound and "
                     "faster than the per-node mix (%.1f ms against %.1f ms on the evaluation "
                     "data), which had %d of %d node%s fall back",
                     cr.auto_ms[1], cr.auto_ms[0], cr.auto_mix_fell_back, n_nodes,
                     n_nodes == 1 ? "" : "s");
        else if (cr.auto_static)
            snprintf(r.verdict + len, sizeof r.verdict - len,
                     "; auto: static int8 (MinMax) with the %d most sensitive node%s kept in fp32 "
                     "(the whole model: drop %.4f%%, beyond the bound; with them kept %.4f%%), "
                     "faster than the per-node mix (%.1f ms against %.1f ms on the evaluation "
                     "data), which had %d of %d node%s fall back",
                     cr.auto_static_kept, cr.auto_static_kept == 1 ? "" : "s",
                     100 * cr.auto_static_drop, 100 * cr.auto_static_kept_drop, cr.auto_ms[1],
                     cr.auto_ms[0], cr.auto_mix_fell_back, n_nodes, n_nodes == 1 ? "" : "s");
        else if (cr.auto_static_drop >= 0 && cr.auto_static_kept > 0)
            snprintf(r.verdict + len, sizeof r.verdict - len,
                     "; auto: %d of %d node%s fell back (static int8 of the whole model: drop "
                     "%.4f%%, beyond the bound; with the %d most sensitive kept in fp32 %.4f%%, "
                     "not faster)", fell, n_nodes, n_nodes == 1 ? "" : "s",
                     100 * cr.auto_static_drop, cr.auto_static_kept,
                     100 * cr.auto_static_kept_drop);
        else if (cr.auto_static_drop >= 0)
            snprintf(r.verdict + len, sizeof r.verdict - len,
                     "; auto: %d of %d node%s fell back (static int8 of the whole model: drop "
                     "%.4f%%, %s)", fell, n_nodes, n_nodes == 1 ? "" : "s",
                     100 * cr.auto_static_drop,
                     cr.auto_static_drop > a.max_drop
                         ? "beyond the bound, also with up to half the nodes kept in fp32"
                         : "not faster");
        else
            snprintf(r.verdict + len, sizeof r.verdict - len, "; auto: %d of %d node%s fell back",
                     fell, n_nodes, n_nodes == 1 ? "" : "s");
    }
    json = kiln_compile_report_json(&r);
    if (!json) {
        kiln_cli_fail("out of memory writing the report");
        goto out;
    }
    kiln_compile_report_print(&r, stdout);
    if (a.report) {
        FILE *f = fopen(a.report, "w");
        if (!f || fputs(json, f) < 0 || fclose(f) != 0) {
            kiln_cli_fail("cannot write the report to '%s'", a.report);
            goto out;
        }
    }
    if (!r.passed) {
        kiln_cli_fail("%s", r.verdict);
        goto out;
    }
    kiln_save_options sv = {a.batch, a.n_batch, json};
    if (kiln_session_save(cand, a.out, &sv) != KILN_OK) {
        kiln_cli_fail("cannot write '%s': %s", a.out, kiln_last_error());
        goto out;
    }
    printf("wrote %s\n", a.out);
    if (a.emit_onnx) {
        if (kiln_session_write_onnx(cand, a.model, a.emit_onnx) != KILN_OK) {
            kiln_cli_fail("--emit-onnx '%s': %s", a.emit_onnx, kiln_last_error());
            goto out;
        }
        printf("wrote %s\n", a.emit_onnx);
    }
    rc = KILN_CLI_EXIT_OK;
out:
    free(json);
    free(outs);
    kiln_compile_result_free(&cr);
    kiln_tensor_free(labels);
    kiln_gate_data_free(&cal);
    kiln_gate_data_free(&eval);
    kiln_compile_sparse_free(&sp);
    if (mc != m) kiln_model_free(mc);
    kiln_model_free(m);
    return rc;
}
