/*
 * cmd_inspect.c - `kiln inspect MODEL [--json]`: what a model is, without
 * running it.
 *
 * Prints the format, producer and IR version, the opset imports (the
 * default ONNX domain "" shown as "ai.onnx"), every signature with its
 * inputs and outputs (dtype and shape; symbolic dims by name, unknown dims
 * as "?"), the op histogram, the node count and the parameter count and
 * bytes. --json prints the same facts as one JSON object:
 *
 *     {"format": "onnx", "producer": "...", "ir_version": 8,
 *      "opsets": [{"domain": "ai.onnx", "version": 17}],
 *      "signatures": [{"name": "serving_default", "method": "...",
 *                      "inputs": [{"name": "x", "dtype": "float32",
 *                                  "shape": ["N", 3, null]}],
 *                      "outputs": [...]}],
 *      "ops": {"Add": 1}, "param_count": 0, "param_bytes": 0,
 *      "node_count": 1}
 *
 * where a shape lists ints for known dims, strings for named dims and null
 * for unknown ones, and is null itself when even the rank is unknown.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "kiln/kiln_util.h"
#include "cli/json_out.h"

static const char inspect_usage[] =
    "usage: kiln inspect MODEL [--json] [--tags TAGS] [--optimized [--batch N]]\n"
    "\n"
    "Show a model's format, opsets, signatures (inputs and outputs with dtype\n"
    "and shape), op histogram, node count and parameter count.\n"
    "\n"
    "  MODEL          an .onnx file or a SavedModel directory\n"
    "  --json         print one JSON object instead of text\n"
    "  --tags TAGS    SavedModel MetaGraph tags, comma-separated (default: serve)\n"
    "  --optimized    also print, per signature, the optimization log (what each\n"
    "                 pass changed) and the plan for batch 1 (steps, fast kernels,\n"
    "                 arena bytes); with --json, an \"optimization\" member\n"
    "  --batch N      with --optimized: the plan for batch N instead (axis 0 of\n"
    "                 the inputs; its Concat-in-place line too)\n"
    "  -h, --help     show this help\n";

/* The opset domain as shown: "" is the default ONNX domain. */
static const char *domain_shown(const char *domain)
{
    return domain && domain[0] ? domain : "ai.onnx";
}

/* ------------------------------------------------------------------- text */

/* "float32[N,3,?]", or "float32 (rank unknown)". */
static void text_value(const kiln_value_info *v)
{
    printf("    ");
    kiln_text_write(stdout, v->name);
    printf(": %s", kiln_dtype_name(v->dtype));
    if (v->rank < 0) {
        printf(" (rank unknown)\n");
        return;
    }
    putchar('[');
    for (int d = 0; d < v->rank && d < KILN_MAX_RANK; d++) {
        if (d) putchar(',');
        if (v->dims[d] >= 0) printf("%lld", (long long)v->dims[d]);
        else if (v->dim_names[d] && v->dim_names[d][0]) kiln_text_write(stdout, v->dim_names[d]);
        else putchar('?');
    }
    printf("]\n");
}

/* The batch the optimization report plans for (--batch). */
static int plan_batch = 1;

/* The optimization log of signature s and a summary of its plan for plan_batch. */
static int optimization_report(const kiln_model *m, const kiln_signature *s, char **log,
                               char *summary, size_t n)
{
    kiln_session *session = NULL;
    if (kiln_session_create((kiln_model *)m, kiln_signature_name(s), NULL, &session) != KILN_OK)
        return kiln_cli_fail("signature '%s': %s", kiln_signature_name(s), kiln_last_error());
    int64_t batch = plan_batch;
    if (kiln_session_precompile(session, &batch, 1) != KILN_OK) {
        snprintf(summary, n, "compiling the batch-%d plan failed: %s", plan_batch,
                 kiln_last_error());
    } else {
        kiln_session_plan_summary(session, summary, n);
    }
    if (kiln_session_optimization_log(session, log) != KILN_OK) {
        kiln_session_free(session);
        return kiln_cli_fail("%s", kiln_last_error());
    }
    kiln_session_free(session);
    return KILN_CLI_EXIT_OK;
}

static int print_text(const kiln_model *m, int optimized)
{
    kiln_model_stats stats;
    kiln_model_get_stats(m, &stats);

    printf("format: %s\n", kiln_model_format(m));
    printf("producer: ");
    kiln_text_write(stdout, stats.producer && stats.producer[0] ? stats.producer : "(none)");
    printf("\nir_version: %lld\n", (long long)stats.ir_version);

    printf("opsets:");
    int n_opsets = kiln_model_opset_count(m);
    for (int i = 0; i < n_opsets; i++) {
        const char *domain = NULL;
        int64_t version = 0;
        kiln_model_opset(m, i, &domain, &version);
        printf(i ? ", " : " ");
        kiln_text_write(stdout, domain_shown(domain));
        printf(" %lld", (long long)version);
    }
    printf(n_opsets ? "\n" : " (none)\n");

    int n_sigs = kiln_model_signature_count(m);
    for (int i = 0; i < n_sigs; i++) {
        const kiln_signature *s = kiln_model_signature(m, i);
        const char *method = kiln_signature_method(s);
        printf("signature ");
        kiln_text_write(stdout, kiln_signature_name(s));
        printf(":\n  method: ");
        kiln_text_write(stdout, method && method[0] ? method : "(none)");
        int n_in = kiln_signature_input_count(s), n_out = kiln_signature_output_count(s);
        printf("\n  inputs:%s\n", n_in ? "" : " (none)");
        for (int j = 0; j < n_in; j++) text_value(kiln_signature_input(s, j));
        printf("  outputs:%s\n", n_out ? "" : " (none)");
        for (int j = 0; j < n_out; j++) text_value(kiln_signature_output(s, j));
    }

    int n_kinds = kiln_model_op_kinds(m);
    int width = 0;
    for (int i = 0; i < n_kinds; i++) {
        const char *op = NULL;
        int count = 0;
        kiln_model_op_kind(m, i, &op, &count);
        int len = op ? (int)strlen(op) : 0;
        if (len > width) width = len;
    }
    printf("ops:%s\n", n_kinds ? "" : " (none)");
    for (int i = 0; i < n_kinds; i++) {
        const char *op = NULL;
        int count = 0;
        kiln_model_op_kind(m, i, &op, &count);
        printf("  ");
        kiln_text_write(stdout, op);
        printf("%*s %d\n", width - (op ? (int)strlen(op) : 0), "", count);
    }
    printf("nodes: %d\n", stats.node_count);
    printf("parameters: %lld (%lld bytes)\n", (long long)stats.param_count,
           (long long)stats.param_bytes);
    kiln_model_artifact_print(m, stdout); /* a .kiln file: sections, precisions, report */
    for (int i = 0; optimized && i < kiln_model_signature_count(m); i++) {
        const kiln_signature *s = kiln_model_signature(m, i);
        char *log = NULL, summary[512];
        int rc = optimization_report(m, s, &log, summary, sizeof summary);
        if (rc != KILN_CLI_EXIT_OK) return rc;
        printf("optimization of signature ");
        kiln_text_write(stdout, kiln_signature_name(s));
        printf(":\n");
        for (char *line = log, *nl; line && *line; line = nl + 1) {
            nl = strchr(line, '\n');
            if (!nl) nl = line + strlen(line) - 1;
            printf("  %.*s\n", (int)(nl - line + (*nl == '\n' ? 0 : 1)), line);
        }
        printf("  plan (batch %d): %s\n", plan_batch, summary);
        free(log);
    }
    return KILN_CLI_EXIT_OK;
}

/* ------------------------------------------------------------------- JSON */

/* {"name": ..., "dtype": ..., "shape": [...] | null} */
static void json_value(const kiln_value_info *v)
{
    printf("{\"name\": ");
    kiln_json_write_string(stdout, v->name);
    printf(", \"dtype\": ");
    if (v->dtype == KILN_DTYPE_UNDEFINED) printf("null");
    else kiln_json_write_string(stdout, kiln_dtype_name(v->dtype));
    printf(", \"shape\": ");
    if (v->rank < 0) {
        printf("null}");
        return;
    }
    putchar('[');
    for (int d = 0; d < v->rank && d < KILN_MAX_RANK; d++) {
        if (d) printf(", ");
        if (v->dims[d] >= 0) printf("%lld", (long long)v->dims[d]);
        else if (v->dim_names[d] && v->dim_names[d][0]) kiln_json_write_string(stdout, v->dim_names[d]);
        else printf("null");
    }
    printf("]}");
}

/* A list of value infos, one per line at the given indent. */
static void json_values(const kiln_signature *s, int outputs)
{
    int n = outputs ? kiln_signature_output_count(s) : kiln_signature_input_count(s);
    if (n == 0) {
        printf("[]");
        return;
    }
    printf("[\n");
    for (int j = 0; j < n; j++) {
        printf("        ");
        json_value(outputs ? kiln_signature_output(s, j) : kiln_signature_input(s, j));
        printf(j + 1 < n ? ",\n" : "\n");
    }
    printf("      ]");
}

static int print_json(const kiln_model *m, int optimized)
{
    kiln_model_stats stats;
    kiln_model_get_stats(m, &stats);

    printf("{\n  \"format\": ");
    kiln_json_write_string(stdout, kiln_model_format(m));
    printf(",\n  \"producer\": ");
    kiln_json_write_string(stdout, stats.producer);
    printf(",\n  \"ir_version\": %lld,\n  \"opsets\": [", (long long)stats.ir_version);
    int n_opsets = kiln_model_opset_count(m);
    for (int i = 0; i < n_opsets; i++) {
        const char *domain = NULL;
        int64_t version = 0;
        kiln_model_opset(m, i, &domain, &version);
        printf(i ? ", {\"domain\": " : "{\"domain\": ");
        kiln_json_write_string(stdout, domain_shown(domain));
        printf(", \"version\": %lld}", (long long)version);
    }
    printf("],\n  \"signatures\": [");
    int n_sigs = kiln_model_signature_count(m);
    for (int i = 0; i < n_sigs; i++) {
        const kiln_signature *s = kiln_model_signature(m, i);
        printf(i ? ",\n    {\n      \"name\": " : "\n    {\n      \"name\": ");
        kiln_json_write_string(stdout, kiln_signature_name(s));
        printf(",\n      \"method\": ");
        kiln_json_write_string(stdout, kiln_signature_method(s));
        printf(",\n      \"inputs\": ");
        json_values(s, 0);
        printf(",\n      \"outputs\": ");
        json_values(s, 1);
        if (optimized) {
            char *log = NULL, summary[512];
            int rc = optimization_report(m, s, &log, summary, sizeof summary);
            if (rc != KILN_CLI_EXIT_OK) return rc;
            printf(",\n      \"optimization\": {\"log\": ");
            kiln_json_write_string(stdout, log);
            printf(", \"plan\": ");
            kiln_json_write_string(stdout, summary);
            printf("}");
            free(log);
        }
        printf("\n    }");
    }
    printf(n_sigs ? "\n  ],\n  \"ops\": {" : "],\n  \"ops\": {");
    int n_kinds = kiln_model_op_kinds(m);
    for (int i = 0; i < n_kinds; i++) {
        const char *op = NULL;
        int count = 0;
        kiln_model_op_kind(m, i, &op, &count);
        if (i) printf(", ");
        kiln_json_write_string(stdout, op);
        printf(": %d", count);
    }
    printf("},\n  \"param_count\": %lld,\n  \"param_bytes\": %lld,\n  \"node_count\": %d\n}\n",
           (long long)stats.param_count, (long long)stats.param_bytes, stats.node_count);
    return KILN_CLI_EXIT_OK;
}

int kiln_cmd_inspect(int argc, char **argv)
{
    static const char cmd[] = "inspect";
    if (kiln_cli_wants_help(argc, argv)) {
        fputs(inspect_usage, stdout);
        return KILN_CLI_EXIT_OK;
    }
    const char *path = NULL, *tags = NULL, *batch = NULL;
    int json = 0, optimized = 0;
    bool positional_only = false;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        int r;
        if (!positional_only && strcmp(arg, "--") == 0) {
            positional_only = true;
            continue;
        }
        if (!positional_only && arg[0] == '-' && arg[1] != '\0') {
            if ((r = kiln_cli_option(cmd, argc, argv, &i, "--json", NULL)) != 0) {
                if (r < 0) return KILN_CLI_EXIT_USAGE;
                json = 1;
            } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--tags", &tags)) != 0) {
                if (r < 0) return KILN_CLI_EXIT_USAGE;
            } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--optimized", NULL)) != 0) {
                if (r < 0) return KILN_CLI_EXIT_USAGE;
                optimized = 1;
            } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--batch", &batch)) != 0) {
                if (r < 0) return KILN_CLI_EXIT_USAGE;
                if (!kiln_cli_parse_int(batch, 1, 1 << 20, &plan_batch))
                    return kiln_cli_usage_error(cmd, "--batch: '%s' is not a batch size (1 to "
                                                "1048576)", batch);
            } else {
                return kiln_cli_usage_error(cmd, "unknown option '%s'", arg);
            }
            continue;
        }
        if (path) return kiln_cli_usage_error(cmd, "unexpected argument '%s'", arg);
        path = arg;
    }
    if (!path) return kiln_cli_usage_error(cmd, "missing MODEL");

    kiln_model *m = kiln_cli_load_model(path, tags);
    if (!m) return KILN_CLI_EXIT_FAIL;
    int rc = KILN_CLI_EXIT_OK;
    if (json) rc = print_json(m, optimized);
    else rc = print_text(m, optimized);
    kiln_model_free(m);
    if (rc != KILN_CLI_EXIT_OK) return rc;
    if (fflush(stdout) != 0 || ferror(stdout)) return kiln_cli_fail("writing to stdout failed");
    return KILN_CLI_EXIT_OK;
}
