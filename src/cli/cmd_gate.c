/*
 * cmd_gate.c - `kiln gate CANDIDATE --baseline BASELINE --data DATA ...`:
 * a release gate for a new model version. Both models run on the same
 * data; quality (a metric with labels, agreement and output distance
 * without) and latency (p50/p99 per batch size, measured interleaved) are
 * compared; a readable report goes to stdout and a JSON one to --report.
 * On a pass the candidate's version folder receives
 * assets.extra/kiln_blessing.json (serve/gate/release.h), which
 * `kiln serve --require_blessing` checks before it serves the version.
 *
 * This file only parses flags, prints and decides; data, runs and
 * metrics are in gate_data.c and gate_eval.c (gate.h). Exit status: 0 the
 * candidate passed (and was blessed unless --no-bless), 1 it failed the
 * gate or could not be evaluated (one "kiln: ..." line says why), 2 usage.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/gate.h"
#include "cli/npy.h"
#include "serve/gate/release.h"
#include "serve/json.h"

#define GATE_MAX_BATCH_SIZES 16
#define GATE_EVAL_BATCH 64

static const char gate_usage[] =
    "usage: kiln gate CANDIDATE --baseline BASELINE --data DATA [options]\n"
    "\n"
    "Compare a candidate model version with a baseline on the same data: quality\n"
    "(with --labels: accuracy or RMSE and its relative drop; without: top-1\n"
    "agreement and output distance) and latency (p50/p99 per batch size, runs of\n"
    "the two models interleaved). Exit 0 and bless the candidate's version folder\n"
    "(assets.extra/kiln_blessing.json) when it passes; exit 1 naming why when not.\n"
    "\n"
    "  CANDIDATE, BASELINE  model files or version folders (ONNX, SavedModel, TFLite)\n"
    "  --data DATA        a folder of <input>.npy files (first dimension = samples), an\n"
    "                     .npz archive of them,\n"
    "                     a JSON-lines file of TF Serving predict request bodies, or a\n"
    "                     TF Serving warmup file (tf_serving_warmup_requests, *.tfrecord)\n"
    "  --labels FILE.npy  expected outputs: class ids (one per sample) or regression\n"
    "                     targets (as many values per sample as the output)\n"
    "  --max-drop X       largest relative quality drop allowed: 1% or 0.01 (default 1%)\n"
    "  --max-p99-ms N     largest candidate p99 latency allowed at every batch size\n"
    "                     (default: latency is reported, not gated)\n"
    "  --batch-sizes L    batch sizes to time, e.g. 1,8,32 (the default)\n"
    "  --runs N           timed runs per model and batch size (default 50)\n"
    "  --output NAME      the output to compare (default: the signature's first)\n"
    "  --signature NAME   the signature to run (default: the model's default)\n"
    "  --tags TAGS        SavedModel tags (default \"serve\")\n"
    "  --report FILE      write the JSON report there\n"
    "  --no-bless         decide only; write no blessing\n" KILN_CLI_RUN_OPTIONS_HELP
    "\n"
    "Metrics, defaults and the blessing format: docs/RELEASE_GATE.md.\n";

typedef struct gate_args {
    const char *candidate, *baseline, *data, *labels, *output, *signature, *tags, *report;
    double max_drop, max_p99_ms; /* max_p99_ms < 0: not gated */
    int64_t batch[GATE_MAX_BATCH_SIZES];
    int n_batch, runs, no_bless;
    kiln_session_options so;
} gate_args;

/* "1%", "0.5 %" or "0.01" as a fraction; false if not one in [0, 1e6]. */
static bool parse_fraction(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v < 0) return false;
    while (*end == ' ') end++;
    if (*end == '%') {
        v /= 100;
        end++;
    }
    if (*end || v > 1e6) return false;
    *out = v;
    return true;
}

static bool parse_batch_sizes(const char *s, gate_args *a)
{
    a->n_batch = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 1 || v > 1 << 20 || a->n_batch == GATE_MAX_BATCH_SIZES) return false;
        a->batch[a->n_batch++] = v;
        if (*end == ',') end++;
        else if (*end) return false;
        p = end;
    }
    return a->n_batch > 0;
}

static int parse_args(int argc, char **argv, gate_args *a)
{
    const char *cmd = "gate";
    for (int i = 0; i < argc; i++) {
        const char *val = NULL;
        int r;
        if (argv[i][0] != '-') {
            if (a->candidate) return kiln_cli_usage_error(cmd, "unexpected argument '%s'", argv[i]);
            a->candidate = argv[i];
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--baseline", &a->baseline)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--data", &a->data)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--labels", &a->labels)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--output", &a->output)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--signature", &a->signature)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--tags", &a->tags)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--report", &a->report)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--no-bless", NULL)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            a->no_bless = 1;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--max-drop", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!parse_fraction(val, &a->max_drop))
                return kiln_cli_usage_error(cmd, "--max-drop '%s' is not a share like 1%% or 0.01",
                                            val);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--max-p99-ms", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            char *end;
            a->max_p99_ms = strtod(val, &end);
            if (end == val || *end || !(a->max_p99_ms > 0) || !isfinite(a->max_p99_ms))
                return kiln_cli_usage_error(cmd, "--max-p99-ms '%s' is not a positive number", val);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--batch-sizes", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!parse_batch_sizes(val, a))
                return kiln_cli_usage_error(cmd, "--batch-sizes '%s' is not a list like 1,8,32 "
                                                 "(at most %d sizes)",
                                            val, GATE_MAX_BATCH_SIZES);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--runs", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!kiln_cli_parse_int(val, 1, 100000, &a->runs))
                return kiln_cli_usage_error(cmd, "--runs '%s' is not an integer in 1..100000", val);
        } else if ((r = kiln_cli_run_option(cmd, argc, argv, &i, &a->so)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
        } else {
            return kiln_cli_usage_error(cmd, "unknown option '%s'", argv[i]);
        }
    }
    if (!a->candidate) return kiln_cli_usage_error(cmd, "no CANDIDATE model given");
    if (!a->baseline) return kiln_cli_usage_error(cmd, "--baseline is required");
    if (!a->data) return kiln_cli_usage_error(cmd, "--data is required");
    return -1;
}

/* A finite number, or null (JSON has no NaN or infinity). */
static void jnum(kiln_sbuf *b, double x)
{
    if (isfinite(x)) kiln_sbuf_printf(b, "%.9g", x);
    else kiln_sbuf_puts(b, "null");
}

static void jstr(kiln_sbuf *b, const char *s)
{
    kiln_sbuf_json_string(b, s, strlen(s));
}

static const char *kind_name(kiln_gate_kind k)
{
    return k == KILN_GATE_CLASS_IDS ? "class_ids" : k == KILN_GATE_SCORES ? "class_scores" : "values";
}

/* The report's body (also the blessing's "summary"). */
static void write_summary(kiln_sbuf *b, const gate_args *a, const char *output, int64_t samples,
                          const kiln_gate_quality *q, const kiln_gate_latency *lat, int n_lat,
                          int pass, char reasons[][KILN_GATE_ERR_LEN], int n_reasons)
{
    kiln_sbuf_printf(b, "{\"verdict\": \"%s\", \"reasons\": [", pass ? "pass" : "fail");
    for (int i = 0; i < n_reasons; i++) {
        kiln_sbuf_puts(b, i ? ", " : "");
        jstr(b, reasons[i]);
    }
    kiln_sbuf_puts(b, "], \"output\": ");
    jstr(b, output);
    kiln_sbuf_printf(b, ", \"samples\": %lld, \"thresholds\": {\"max_drop\": ", (long long)samples);
    jnum(b, a->max_drop);
    kiln_sbuf_puts(b, ", \"max_p99_ms\": ");
    if (a->max_p99_ms > 0) jnum(b, a->max_p99_ms);
    else kiln_sbuf_puts(b, "null");
    kiln_sbuf_printf(b, "}, \"quality\": {\"kind\": \"%s\", \"values_per_sample\": %lld, "
                        "\"top1_agreement\": ",
                     kind_name(q->kind), (long long)q->row_size);
    if (q->has_agreement) jnum(b, q->agreement);
    else kiln_sbuf_puts(b, "null");
    kiln_sbuf_puts(b, ", \"mean_abs_diff\": ");
    jnum(b, q->mean_abs_diff);
    kiln_sbuf_puts(b, ", \"mean_rel_diff\": ");
    jnum(b, q->mean_rel_diff);
    kiln_sbuf_puts(b, ", \"max_abs_diff\": ");
    jnum(b, q->max_abs_diff);
    if (q->has_labels) {
        kiln_sbuf_printf(b, ", \"metric\": \"%s\", \"baseline\": ", q->metric);
        jnum(b, q->base_metric);
        kiln_sbuf_puts(b, ", \"candidate\": ");
        jnum(b, q->cand_metric);
        if (strcmp(q->metric, "rmse") == 0) {
            kiln_sbuf_puts(b, ", \"baseline_mae\": ");
            jnum(b, q->base_mae);
            kiln_sbuf_puts(b, ", \"candidate_mae\": ");
            jnum(b, q->cand_mae);
        }
    } else {
        kiln_sbuf_puts(b, ", \"metric\": null");
    }
    kiln_sbuf_puts(b, ", \"drop_of\": ");
    jstr(b, q->drop_of);
    kiln_sbuf_puts(b, ", \"drop\": ");
    jnum(b, q->drop);
    kiln_sbuf_puts(b, "}, \"latency\": [");
    for (int i = 0; i < n_lat; i++) {
        const kiln_gate_latency *l = &lat[i];
        kiln_sbuf_printf(b, "%s{\"batch_size\": %lld, \"runs\": %d, \"candidate\": {\"p50_ms\": ",
                         i ? ", " : "", (long long)l->batch, l->runs);
        jnum(b, l->cand_p50_ms);
        kiln_sbuf_puts(b, ", \"p99_ms\": ");
        jnum(b, l->cand_p99_ms);
        kiln_sbuf_puts(b, ", \"mean_ms\": ");
        jnum(b, l->cand_mean_ms);
        kiln_sbuf_puts(b, "}, \"baseline\": {\"p50_ms\": ");
        jnum(b, l->base_p50_ms);
        kiln_sbuf_puts(b, ", \"p99_ms\": ");
        jnum(b, l->base_p99_ms);
        kiln_sbuf_puts(b, ", \"mean_ms\": ");
        jnum(b, l->base_mean_ms);
        kiln_sbuf_puts(b, "}}");
    }
    kiln_sbuf_puts(b, "]}");
}

static void print_report(const gate_args *a, const char *output, int64_t samples,
                         const kiln_gate_quality *q, const kiln_gate_latency *lat, int n_lat,
                         int pass, char reasons[][KILN_GATE_ERR_LEN], int n_reasons)
{
    printf("kiln gate: candidate %s vs baseline %s\n", a->candidate, a->baseline);
    printf("data: %s, %lld samples; output '%s' (%s, %lld values per sample)\n", a->data,
           (long long)samples, output, kind_name(q->kind), (long long)q->row_size);
    printf("quality:\n");
    if (q->has_labels) {
        if (strcmp(q->metric, "rmse") == 0)
            printf("  rmse       baseline %.6g  candidate %.6g  (mae %.6g / %.6g)\n", q->base_metric,
                   q->cand_metric, q->base_mae, q->cand_mae);
        else
            printf("  accuracy   baseline %.4f  candidate %.4f\n", q->base_metric, q->cand_metric);
    }
    if (q->has_agreement) printf("  top-1 agreement  %.4f\n", q->agreement);
    printf("  output diff      mean abs %.6g  mean rel %.6g  max abs %.6g\n", q->mean_abs_diff,
           q->mean_rel_diff, q->max_abs_diff);
    printf("  %s: %.4f%% (max %.4f%%)\n", q->drop_of, q->drop * 100, a->max_drop * 100);
    printf("latency (ms, %d runs each, interleaved):\n", n_lat ? lat[0].runs : 0);
    printf("  batch  candidate p50      p99  baseline p50      p99\n");
    for (int i = 0; i < n_lat; i++)
        printf("  %5lld  %13.4f %8.4f  %12.4f %8.4f\n", (long long)lat[i].batch, lat[i].cand_p50_ms,
               lat[i].cand_p99_ms, lat[i].base_p50_ms, lat[i].base_p99_ms);
    if (a->max_p99_ms > 0) printf("  candidate p99 limit: %.3f ms\n", a->max_p99_ms);
    printf("verdict: %s\n", pass ? "PASS" : "FAIL");
    for (int i = 0; i < n_reasons; i++) printf("  - %s\n", reasons[i]);
}

/* The version folder of a model path: itself, or the folder of a file. */
static char *version_dir(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return strdup(path);
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

int kiln_cmd_gate(int argc, char **argv)
{
    if (kiln_cli_wants_help(argc, argv)) {
        fputs(gate_usage, stdout);
        return KILN_CLI_EXIT_OK;
    }
    gate_args a;
    memset(&a, 0, sizeof a);
    a.max_drop = 0.01;
    a.max_p99_ms = -1;
    a.runs = 50;
    a.batch[0] = 1, a.batch[1] = 8, a.batch[2] = 32, a.n_batch = 3;
    int batch_given = 0;
    kiln_session_options_init(&a.so);
    for (int i = 0; i < argc; i++)
        if (strncmp(argv[i], "--batch-sizes", 13) == 0) batch_given = 1;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;

    char err[KILN_GATE_ERR_LEN], reasons[4 + GATE_MAX_BATCH_SIZES][KILN_GATE_ERR_LEN];
    int n_reasons = 0;
    kiln_model *mc = NULL, *mb = NULL;
    kiln_session *sc = NULL, *sb = NULL;
    kiln_gate_data data = {0};
    kiln_tensor *labels = NULL;
    kiln_gate_output oc = {0}, ob = {0};
    kiln_gate_quality q;
    kiln_gate_latency lat[GATE_MAX_BATCH_SIZES];
    kiln_sbuf summary = {0}, extra = {0};
    char *cdir = NULL;
    rc = KILN_CLI_EXIT_FAIL;

    mc = kiln_cli_load_model(a.candidate, a.tags);
    if (!mc) goto out;
    mb = kiln_cli_load_model(a.baseline, a.tags);
    if (!mb) goto out;
    const kiln_signature *sigc = kiln_model_find_signature(mc, a.signature);
    const kiln_signature *sigb = kiln_model_find_signature(mb, a.signature);
    if (!sigc || !sigb) {
        kiln_cli_fail("the %s has no signature '%s'", sigc ? "baseline" : "candidate",
                      a.signature ? a.signature : "(default)");
        goto out;
    }
    if (kiln_gate_check_signatures(sigc, sigb, err) != KILN_OK) {
        kiln_cli_fail("gate failed: %s", err);
        goto out;
    }
    if (kiln_gate_data_load(a.data, sigc, &data, err) != KILN_OK) {
        kiln_cli_fail("%s", err);
        goto out;
    }
    /* a fixed batch dimension decides the batch sizes */
    int64_t fixed = -1;
    for (int i = 0; i < kiln_signature_input_count(sigc); i++) {
        const kiln_value_info *vi = kiln_signature_input(sigc, i);
        if (vi->rank > 0 && vi->dims[0] > 0) fixed = vi->dims[0];
    }
    int64_t eval_batch = fixed > 0 ? fixed : GATE_EVAL_BATCH;
    if (fixed > 0) {
        if (!batch_given) a.batch[0] = fixed, a.n_batch = 1;
        for (int i = 0; i < a.n_batch; i++)
            if (a.batch[i] != fixed) {
                kiln_cli_fail("the model's batch dimension is fixed at %lld; --batch-sizes %lld "
                              "cannot run",
                              (long long)fixed, (long long)a.batch[i]);
                goto out;
            }
        if (data.samples % fixed) {
            kiln_cli_fail("the model's batch dimension is fixed at %lld; the data's %lld samples "
                          "are not a multiple of it",
                          (long long)fixed, (long long)data.samples);
            goto out;
        }
    }
    if (a.labels && kiln_npy_read(a.labels, &labels) != KILN_OK) {
        kiln_cli_fail("--labels: %s", kiln_npy_last_error());
        goto out;
    }
    const char *sig_name = kiln_signature_name(sigc);
    if (kiln_session_create(mc, sig_name, &a.so, &sc) != KILN_OK ||
        kiln_session_create(mb, sig_name, &a.so, &sb) != KILN_OK) {
        kiln_cli_fail("the %s: cannot create a session: %s", sc ? "baseline" : "candidate",
                      kiln_last_error());
        goto out;
    }
    if (kiln_signature_output_count(sigc) < 1) {
        kiln_cli_fail("the signature has no outputs to compare");
        goto out;
    }
    const char *output = a.output ? a.output : kiln_signature_output(sigc, 0)->name;
    if (kiln_gate_collect(sc, &data, output, eval_batch, &oc, err) != KILN_OK) {
        kiln_cli_fail("the candidate: %s", err);
        goto out;
    }
    if (kiln_gate_collect(sb, &data, output, eval_batch, &ob, err) != KILN_OK) {
        kiln_cli_fail("the baseline: %s", err);
        goto out;
    }
    if (kiln_gate_compare(&ob, &oc, labels, &q, err) != KILN_OK) {
        kiln_cli_fail("%s", err);
        goto out;
    }
    for (int i = 0; i < a.n_batch; i++) {
        if (kiln_gate_measure(sc, sb, &data, a.batch[i], a.runs, &lat[i], err) != KILN_OK) {
            kiln_cli_fail("%s", err);
            goto out;
        }
    }
    /* the verdict */
    if (!(q.drop <= a.max_drop)) {
        if (q.has_labels)
            snprintf(reasons[n_reasons++], KILN_GATE_ERR_LEN,
                     "%s: %.4f%% (%s %.6g -> %.6g), more than --max-drop %.4g%%", q.drop_of,
                     q.drop * 100, q.metric, q.base_metric, q.cand_metric, a.max_drop * 100);
        else
            snprintf(reasons[n_reasons++], KILN_GATE_ERR_LEN,
                     "%s: %.4f%%, more than --max-drop %.4g%%", q.drop_of, q.drop * 100,
                     a.max_drop * 100);
    }
    for (int i = 0; i < a.n_batch && a.max_p99_ms > 0; i++)
        if (!(lat[i].cand_p99_ms <= a.max_p99_ms))
            snprintf(reasons[n_reasons++], KILN_GATE_ERR_LEN,
                     "p99 latency at batch size %lld: %.3f ms, more than --max-p99-ms %.4g",
                     (long long)lat[i].batch, lat[i].cand_p99_ms, a.max_p99_ms);
    int pass = n_reasons == 0;
    print_report(&a, output, data.samples, &q, lat, a.n_batch, pass, reasons, n_reasons);
    write_summary(&summary, &a, output, data.samples, &q, lat, a.n_batch, pass, reasons,
                  n_reasons);

    char digest[72] = "";
    const char *bless_state = pass ? (a.no_bless ? "skipped (--no-bless)" : "written") : "none";
    if (pass && !a.no_bless) {
        cdir = version_dir(a.candidate);
        char *bdir = version_dir(a.baseline);
        char bdigest[72] = "";
        if (!cdir || !bdir) {
            free(bdir);
            kiln_cli_fail("out of memory");
            goto out;
        }
        if (kiln_blessing_digest(bdir, bdigest, NULL, err) != KILN_OK) bdigest[0] = '\0';
        kiln_sbuf_printf(&extra, "\"kiln_version\": \"%s\",\n  \"candidate\": ", kiln_version());
        jstr(&extra, a.candidate);
        kiln_sbuf_puts(&extra, ",\n  \"baseline\": {\"path\": ");
        jstr(&extra, a.baseline);
        kiln_sbuf_puts(&extra, ", \"digest\": ");
        if (bdigest[0]) jstr(&extra, bdigest);
        else kiln_sbuf_puts(&extra, "null");
        kiln_version_info *bvi = NULL; /* the baseline's traceability record, if any */
        if (kiln_version_info_read(bdir, &bvi, err) == KILN_OK && bvi) {
            kiln_sbuf_puts(&extra, ", \"version_info\": ");
            kiln_version_info_write_json(&extra, bvi);
            kiln_version_info_free(bvi);
        }
        kiln_sbuf_puts(&extra, "},\n  \"data\": ");
        jstr(&extra, a.data);
        kiln_sbuf_puts(&extra, ",\n  \"summary\": ");
        if (summary.p) kiln_sbuf_put(&extra, summary.p, summary.len);
        free(bdir);
        if (extra.oom || summary.oom) {
            kiln_cli_fail("out of memory");
            goto out;
        }
        if (kiln_blessing_write(cdir, extra.p, digest, err) != KILN_OK) {
            kiln_cli_fail("cannot bless %s: %s", cdir, err);
            goto out;
        }
        printf("blessed: %s/%s (%s)\n", cdir, KILN_BLESSING_FILE, digest);
    }
    if (a.report) {
        kiln_sbuf rep = {0};
        kiln_sbuf_puts(&rep, "{\"candidate\": ");
        jstr(&rep, a.candidate);
        kiln_sbuf_puts(&rep, ", \"baseline\": ");
        jstr(&rep, a.baseline);
        kiln_sbuf_puts(&rep, ", \"data\": ");
        jstr(&rep, a.data);
        kiln_sbuf_printf(&rep, ", \"blessing\": {\"state\": \"%s\", \"digest\": ", bless_state);
        if (digest[0]) jstr(&rep, digest);
        else kiln_sbuf_puts(&rep, "null");
        kiln_sbuf_puts(&rep, "}, \"result\": ");
        if (summary.p) kiln_sbuf_put(&rep, summary.p, summary.len);
        kiln_sbuf_puts(&rep, "}\n");
        FILE *f = fopen(a.report, "wb");
        int ok = f && !rep.oom && fwrite(rep.p, 1, rep.len, f) == rep.len;
        if (f && fclose(f) != 0) ok = 0;
        kiln_sbuf_free(&rep);
        if (!ok) {
            kiln_cli_fail("cannot write the report %s", a.report);
            goto out;
        }
    }
    if (pass) {
        rc = KILN_CLI_EXIT_OK;
    } else {
        kiln_sbuf line = {0};
        for (int i = 0; i < n_reasons; i++) kiln_sbuf_printf(&line, "%s%s", i ? "; " : "", reasons[i]);
        kiln_cli_fail("gate failed: %s", line.p ? line.p : "?");
        kiln_sbuf_free(&line);
    }
out:
    free(cdir);
    kiln_sbuf_free(&summary);
    kiln_sbuf_free(&extra);
    kiln_gate_output_free(&oc);
    kiln_gate_output_free(&ob);
    kiln_tensor_free(labels);
    kiln_gate_data_free(&data);
    kiln_session_free(sc);
    kiln_session_free(sb);
    kiln_model_free(mc);
    kiln_model_free(mb);
    return rc;
}
