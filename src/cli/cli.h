/*
 * cli.h - the shape every `kiln` subcommand shares, and the small helpers
 * for argument parsing and error reporting that they all use.
 *
 * A subcommand is data: a name, a one-line summary for `kiln --help`, and a
 * handler `int run(int argc, char **argv)` that receives the arguments after
 * the subcommand name and returns the process exit status. main.c holds the
 * one table of subcommands; adding one means writing cmd_NAME.c and adding a
 * row there.
 *
 * Exit statuses, the same for every subcommand:
 *   0  success (including --help)
 *   1  the command ran and failed (bad model, bad input file, runtime error)
 *   2  the command line itself is wrong (unknown flag, missing argument)
 * Every failure prints exactly one line on stderr, starting with "kiln: ".
 */
#ifndef KILN_CLI_CLI_H
#define KILN_CLI_CLI_H

#include <stdbool.h>
#include <stdio.h>

#include "kiln/kiln.h"

#if defined(__GNUC__)
#define KILN_CLI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KILN_CLI_PRINTF(a, b)
#endif

enum {
    KILN_CLI_EXIT_OK = 0,
    KILN_CLI_EXIT_FAIL = 1,  /* the command ran and failed */
    KILN_CLI_EXIT_USAGE = 2, /* the command line is wrong */
};

typedef struct kiln_cli_command {
    const char *name;               /* as typed: `kiln NAME ...` */
    const char *summary;            /* one line for `kiln --help` */
    int (*run)(int argc, char **argv); /* argv[0] is the first argument after NAME */
} kiln_cli_command;

/* Subcommand handlers (one per cmd_*.c file). */
int kiln_cmd_inspect(int argc, char **argv);
int kiln_cmd_predict(int argc, char **argv);
int kiln_cmd_serve(int argc, char **argv);
int kiln_cmd_rollout_controller(int argc, char **argv);
int kiln_cmd_bench(int argc, char **argv);
/* cmd_security.c: signing and encrypting model folders (docs/SECURITY.md) */
int kiln_cmd_keygen(int argc, char **argv);
int kiln_cmd_sign(int argc, char **argv);
int kiln_cmd_verify(int argc, char **argv);
int kiln_cmd_encrypt(int argc, char **argv);
int kiln_cmd_rekey(int argc, char **argv);
int kiln_cmd_fingerprint(int argc, char **argv); /* cmd_fingerprint.c */
int kiln_cmd_healthcheck(int argc, char **argv); /* cmd_healthcheck.c */
int kiln_cmd_token(int argc, char **argv);       /* cmd_token.c */
int kiln_cmd_gate(int argc, char **argv);        /* cmd_gate.c: release gate */
int kiln_cmd_warmup_from_log(int argc, char **argv); /* cmd_warmup_from_log.c */
int kiln_cmd_profile(int argc, char **argv);     /* cmd_profile.c: reference profiles */
int kiln_cmd_compile(int argc, char **argv);     /* cmd_compile.c: compression + report */
int kiln_cmd_watermark(int argc, char **argv);   /* cmd_watermark.c: keyed weight marks */

/* Print "kiln: <message>\n" on stderr; returns KILN_CLI_EXIT_FAIL. */
int kiln_cli_fail(const char *fmt, ...) KILN_CLI_PRINTF(1, 2);
/* Print "kiln CMD: <message> (see 'kiln CMD --help')\n" on stderr;
 * returns KILN_CLI_EXIT_USAGE. */
int kiln_cli_usage_error(const char *cmd, const char *fmt, ...) KILN_CLI_PRINTF(2, 3);

/* True if -h or --help appears among args before a "--". */
bool kiln_cli_wants_help(int argc, char **argv);

/*
 * Match argv[*i] against the option `name` (e.g. "--input"). Returns:
 *   0  no match (argv[*i] is something else)
 *   1  matched; for a valued option *value is set from "--name=V" or from the
 *      next argument (and *i advanced past it); for a flag (value == NULL)
 *      "--name" alone matched
 *  -1  matched but malformed (value missing, or a value given to a flag);
 *      the usage error has been printed
 */
int kiln_cli_option(const char *cmd, int argc, char **argv, int *i, const char *name,
                    const char **value);

/* Load the model at path (tags: SavedModel tags or NULL); on failure print
 * one "kiln: ..." line naming the path and return NULL. */
kiln_model *kiln_cli_load_model(const char *path, const char *tags);

/* Parse a decimal int in [lo, hi]; false if s is not one. */
bool kiln_cli_parse_int(const char *s, int lo, int hi, int *out);

/* The options choosing how a session runs (predict, bench): --threads N,
 * --disable-optimizer (or --no-optimize), --reference. Returns as
 * kiln_cli_option does; a bad --threads value is a usage error (-1). */
int kiln_cli_run_option(const char *cmd, int argc, char **argv, int *i,
                        kiln_session_options *so);
#define KILN_CLI_RUN_OPTIONS_HELP                                                           \
    "  --threads N        intra-op threads (default 0: all cores)\n"                        \
    "  --disable-optimizer  run the graph as imported, without the optimizer's\n"           \
    "                     passes (still on plans and fast kernels); --no-optimize\n"        \
    "                     is the same\n"                                                    \
    "  --reference        the reference path: imported graph, reference kernels,\n"         \
    "                     no plans (slow; for checking results)\n"                        \
    "  --precision P      fp32 (default), bf16 or int8: matmuls in bfloat16 or\n"          \
    "                     dynamically quantized int8 (lossy; docs/COMPRESSION.md)\n"

#endif
