/*
 * main.c - the `kiln` command-line tool: the table of subcommands, the
 * dispatch from argv to a handler, `kiln --help` and `kiln --version`, and
 * the argument and error helpers declared in cli.h.
 *
 * Each subcommand lives in its own cmd_NAME.c and is one row in
 * kiln_cli_commands below; main() only finds the row and hands it the
 * arguments that follow the subcommand's name.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "kiln_revision.h" /* generated: KILN_GIT_REVISION */

static const kiln_cli_command kiln_cli_commands[] = {
    {"inspect", "show a model's signatures, ops and parameters", kiln_cmd_inspect},
    {"predict", "run a model on .npy inputs and write .npy outputs", kiln_cmd_predict},
    {"bench", "time loading and running a model on random inputs", kiln_cmd_bench},
    {"serve", "serve models over TF Serving's REST API and KServe v2", kiln_cmd_serve},
    {"rollout-controller", "judge a fleet's canaries from Prometheus, write the rollout file",
     kiln_cmd_rollout_controller},
    {"keygen", "make a signing key pair or an encryption key", kiln_cmd_keygen},
    {"sign", "sign a model folder (a manifest of its files' SHA-256)", kiln_cmd_sign},
    {"verify", "check a model folder's signature and files", kiln_cmd_verify},
    {"encrypt", "encrypt a model folder's files (XChaCha20-Poly1305)", kiln_cmd_encrypt},
    {"rekey", "re-encrypt a folder's encrypted files under another key", kiln_cmd_rekey},
    {"fingerprint", "a stable identity of a model's weights and ops", kiln_cmd_fingerprint},
    {"watermark", "embed or verify a keyed mark in an ONNX model's weights", kiln_cmd_watermark},
    {"gate", "compare a candidate model with a baseline; bless it if it passes", kiln_cmd_gate},
    {"warmup-from-log", "turn a request log into a TF Serving warmup file",
     kiln_cmd_warmup_from_log},
    {"healthcheck", "exit 0 if a local kiln serve is ready (container probes)", kiln_cmd_healthcheck},
    {"token", "make a bearer token for kiln serve --auth_token_file", kiln_cmd_token},
    {"profile", "write a reference profile of a model's data for monitoring", kiln_cmd_profile},
    {"compile", "compress a model (bf16, int8, auto) with an accuracy report; write a .kiln",
     kiln_cmd_compile},
};

#define KILN_CLI_COMMAND_COUNT (sizeof kiln_cli_commands / sizeof kiln_cli_commands[0])

/* The top-level usage text, listing every subcommand from the table. */
static void print_usage(FILE *f)
{
    fprintf(f,
            "usage: kiln COMMAND [ARGS...]\n"
            "       kiln --help | --version\n"
            "\n"
            "Kiln runs ONNX and TensorFlow SavedModel models.\n"
            "\n"
            "commands:\n");
    for (size_t i = 0; i < KILN_CLI_COMMAND_COUNT; i++)
        fprintf(f, "  %-12s %s\n", kiln_cli_commands[i].name, kiln_cli_commands[i].summary);
    fprintf(f, "\nRun 'kiln COMMAND --help' for a command's arguments.\n");
}

int kiln_cli_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kiln: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return KILN_CLI_EXIT_FAIL;
}

int kiln_cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kiln %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see 'kiln %s --help')\n", cmd);
    va_end(ap);
    return KILN_CLI_EXIT_USAGE;
}

bool kiln_cli_wants_help(int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) return false;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return true;
    }
    return false;
}

int kiln_cli_run_option(const char *cmd, int argc, char **argv, int *i,
                        kiln_session_options *so)
{
    const char *val = NULL;
    int r;
    if ((r = kiln_cli_option(cmd, argc, argv, i, "--threads", &val)) != 0) {
        if (r > 0 && !kiln_cli_parse_int(val, 0, 4096, &so->threads)) {
            kiln_cli_usage_error(cmd, "--threads '%s' is not a number in 0..4096", val);
            return -1;
        }
        return r;
    }
    if ((r = kiln_cli_option(cmd, argc, argv, i, "--no-optimize", NULL)) != 0 ||
        (r = kiln_cli_option(cmd, argc, argv, i, "--disable-optimizer", NULL)) != 0) {
        if (r > 0) so->optimize = 0;
        return r;
    }
    if ((r = kiln_cli_option(cmd, argc, argv, i, "--reference", NULL)) != 0) {
        if (r > 0) so->reference = 1;
        return r;
    }
    if ((r = kiln_cli_option(cmd, argc, argv, i, "--precision", &val)) != 0) {
        kiln_precision p = KILN_PRECISION_FP32;
        if (r > 0 && kiln_precision_parse(val, &p) != KILN_OK) {
            kiln_cli_usage_error(cmd, "--precision '%s' is not one of fp32, bf16, int8", val);
            return -1;
        }
        if (r > 0) so->precision = p;
        return r;
    }
    return 0;
}

int kiln_cli_option(const char *cmd, int argc, char **argv, int *i, const char *name,
                    const char **value)
{
    const char *arg = argv[*i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return 0;
    if (arg[n] == '=') {
        if (!value) {
            kiln_cli_usage_error(cmd, "option '%s' takes no value", name);
            return -1;
        }
        *value = arg + n + 1;
        return 1;
    }
    if (arg[n] != '\0') return 0; /* a longer option sharing the prefix */
    if (!value) return 1;
    if (*i + 1 >= argc) {
        kiln_cli_usage_error(cmd, "option '%s' needs a value", name);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

bool kiln_cli_parse_int(const char *s, int lo, int hi, int *out)
{
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

kiln_model *kiln_cli_load_model(const char *path, const char *tags)
{
    kiln_load_options lo = {KILN_FORMAT_AUTO, tags, 0};
    kiln_model *m = NULL;
    if (kiln_model_load(path, &lo, &m) != KILN_OK) {
        const char *msg = kiln_last_error();
        if (msg && strstr(msg, path)) kiln_cli_fail("%s", msg);
        else kiln_cli_fail("%s: %s", path, msg ? msg : "cannot load the model");
        return NULL;
    }
    return m;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr);
        return KILN_CLI_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        /* `kiln help CMD` is `kiln CMD --help` */
        if (strcmp(name, "help") == 0 && argc > 2) {
            for (size_t i = 0; i < KILN_CLI_COMMAND_COUNT; i++) {
                if (strcmp(argv[2], kiln_cli_commands[i].name) == 0) {
                    char help[] = "--help";
                    char *args[] = {help, NULL};
                    return kiln_cli_commands[i].run(1, args);
                }
            }
            fprintf(stderr, "kiln: unknown command '%s' (see 'kiln --help')\n", argv[2]);
            return KILN_CLI_EXIT_USAGE;
        }
        print_usage(stdout);
        return KILN_CLI_EXIT_OK;
    }
    if (strcmp(name, "--version") == 0 || strcmp(name, "-V") == 0) {
        printf("kiln %s (git %s)\n", kiln_version(), KILN_GIT_REVISION);
        return KILN_CLI_EXIT_OK;
    }
    for (size_t i = 0; i < KILN_CLI_COMMAND_COUNT; i++)
        if (strcmp(name, kiln_cli_commands[i].name) == 0)
            return kiln_cli_commands[i].run(argc - 2, argv + 2);
    if (name[0] == '-')
        fprintf(stderr, "kiln: unknown option '%s' (see 'kiln --help')\n", name);
    else
        fprintf(stderr, "kiln: unknown command '%s' (see 'kiln --help')\n", name);
    return KILN_CLI_EXIT_USAGE;
}
