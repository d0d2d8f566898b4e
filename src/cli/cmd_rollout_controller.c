/*
 * cmd_rollout_controller.c - `kiln rollout-controller`: the canary judge
 * for a fleet of `kiln serve` replicas (src/serve/rollout/controller.c).
 * It reads Prometheus, evaluates the same gates as a single server's
 * in-process controller, and writes its decisions into the rollout file
 * that every replica re-reads (docs/ROLLOUTS.md, "Several replicas").
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "serve/rollout/controller.h"

static const char help[] =
    "usage: kiln rollout-controller --prometheus=URL --rollout_config_file=FILE [flags]\n"
    "\n"
    "Judge the canaries of FILE for every replica at once: every INTERVAL seconds, query\n"
    "Prometheus (kiln_rollout_requests_total and kiln_request_latency_us_bucket summed over\n"
    "the replicas; the shadow's kiln_shadow_top1_*_total and kiln_shadow_js_*_total for the\n"
    "agreement and output divergence gates; kiln_drift_alert for the input drift gate) for\n"
    "each canary's window, evaluate its gates, and write the new state\n"
    "(controlled: true, state, step, reason) into FILE, which the replicas re-read\n"
    "(--rollout_config_file_poll_wait_seconds). Canaries need candidate_version and\n"
    "baseline_version. Rewriting FILE drops its comments.\n"
    "\n"
    "  --prometheus=URL            http://host:port of the Prometheus that scrapes the replicas\n"
    "  --rollout_config_file=FILE  the rollout file the replicas read\n"
    "  --interval_seconds=N        between evaluations (default 5)\n"
    "  --once                      evaluate once and exit\n";

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

int kiln_cmd_rollout_controller(int argc, char **argv)
{
    if (kiln_cli_wants_help(argc, argv)) {
        fputs(help, stdout);
        return KILN_CLI_EXIT_OK;
    }
    kiln_rollout_controller_options o = {NULL, NULL, 5, 0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *eq = strchr(a, '=');
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : NULL);
#define IS(NAME) (nl == strlen(NAME) && strncmp(a, NAME, nl) == 0)
        if (IS("--once")) {
            o.once = 1;
            continue;
        }
        if (!IS("--prometheus") && !IS("--rollout_config_file") && !IS("--interval_seconds"))
            return kiln_cli_usage_error("rollout-controller", "unknown argument '%.60s'", a);
        if (!v) return kiln_cli_usage_error("rollout-controller", "'%.60s' needs a value", a);
        if (!eq) i++;
        if (IS("--prometheus")) o.prometheus = v;
        else if (IS("--rollout_config_file")) o.rollout_file = v;
        else if (!kiln_cli_parse_int(v, 1, 86400, &o.interval_seconds))
            return kiln_cli_usage_error("rollout-controller",
                                        "--interval_seconds needs an integer in [1, 86400], got '%s'", v);
#undef IS
    }
    if (!o.prometheus || !o.rollout_file)
        return kiln_cli_usage_error("rollout-controller",
                                    "--prometheus and --rollout_config_file are required");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    char err[512];
    if (kiln_rollout_controller_run(&o, &stop_flag, err) != KILN_OK)
        return kiln_cli_fail("%s", err);
    return KILN_CLI_EXIT_OK;
}
