/*
 * cmd_serve.c - `kiln serve`: a model server that takes
 * tensorflow_model_server's flags (same names, `--name=value` syntax and
 * defaults where they mean something for Kiln) and serves TF Serving's REST
 * API plus KServe v2 (src/serve/), and TF Serving's gRPC API on --port
 * (src/serve/grpc/).
 *
 * Startup follows TF Serving: the models' first versions are loaded before
 * the port opens; then a polling thread picks up new versions. SIGTERM and
 * SIGINT turn readiness off, stop accepting, drain in-flight requests for at
 * most KILN_SERVE_DRAIN_MS, and exit 0. Signals are blocked in every thread
 * and taken synchronously with sigwait on the main thread.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "kiln/kiln_util.h"
#include "serve/auth.h"
#include "serve/batch.h"
#include "serve/compress.h"
#include "serve/config.h"
#include "serve/integrity.h"
#include "serve/manager.h"
#include "serve/reqlog/reqlog.h"
#include "serve/monitor/monitor.h"
#include "serve/grpc/grpc.h"
#include "serve/rollout/rollout.h"
#include "serve/server.h"
#include "serve/tls.h"
#include "serve/shadow/shadow.h"

#define KILN_SERVE_DRAIN_MS 10000
#define KILN_SERVE_DRAIN_MIN_MS 500

static const char serve_help[] =
    "usage: kiln serve --model_base_path=DIR [--model_name=NAME] [flags]\n"
    "\n"
    "Serve the numbered versions under DIR (each holding model.onnx, a SavedModel, model.tflite\n"
    "or XGBoost's model.json / model.ubj) over TensorFlow Serving's REST API, KServe v2 and\n"
    "TF Serving's gRPC API. Flags are tensorflow_model_server's:\n"
    "\n"
    "  --rest_api_port=N                  REST port (default 8501)\n"
    "  --rest_api_address=A               Kiln: IPv4 address to listen on (default all)\n"
    "  --rest_api_num_threads=N           HTTP worker threads (default 4 x cores, max 256)\n"
    "  --rest_api_timeout_in_ms=N         per-request deadline, 504 after it (default 30000)\n"
    "  --model_name=NAME                  (default \"default\", or $MODEL_NAME)\n"
    "  --model_base_path=DIR              (default $MODEL_BASE_PATH/$MODEL_NAME)\n"
    "  --model_config_file=FILE           ModelServerConfig text proto: several models,\n"
    "                                     version policies and labels (overrides the two above)\n"
    "  --model_config_file_poll_wait_seconds=N  re-read the config file every N s (0 = never)\n"
    "  --enable_batching[=true|false]     merge concurrent predict requests (dynamic batching)\n"
    "  --batching_parameters_file=FILE    BatchingParameters text proto\n"
    "  --file_system_poll_wait_seconds=N  poll for new versions every N s (default 1;\n"
    "                                     0 = once at startup, <0 = never)\n"
    "  --saved_model_tags=TAGS            SavedModel MetaGraph tags (default serve)\n"
    "  --prefer_tflite_model[=true|false] load a version's model.tflite rather than its SavedModel\n"
    "  --tensorflow_intra_op_parallelism=N  threads per run (0 = all cores)\n"
    "  --disable_optimizer[=true|false]   run graphs as imported (Vertex AI's flag)\n"
    "  --enable_model_warmup[=true|false] replay assets.extra/tf_serving_warmup_requests\n"
    "                                     before a version is served (default true)\n"
    "  --num_request_iterations_for_warmup=N  times each warmup record runs (0 = once)\n"
    "  --monitoring_config_file=FILE      MonitoringConfig text proto; the Prometheus page is\n"
    "                                     served only when it has prometheus_config { enable:\n"
    "                                     true } (path default /monitoring/prometheus/metrics)\n"
    "  --rest_api_enable_cors_support[=true|false]  CORS headers and OPTIONS preflight\n"
    "  --enable_console[=true|false]      Kiln: the web console at /console/ and its stats\n"
    "                                     endpoint /console/api/stats (default true)\n"
    "  --port=N                           gRPC port (default 8500; 0 = none): TF Serving's\n"
    "                                     PredictionService, ModelService, health, reflection\n"
    "  --grpc_socket_path=PATH            also serve gRPC on this Unix socket\n"
    "  --grpc_max_threads=N               gRPC request threads (default 4 x cores, max 256)\n"
    "  --grpc_channel_arguments=K=V,...   grpc.max_receive_message_length (default 64 MiB),\n"
    "                                     grpc.max_send_message_length (default 2 GiB - 1),\n"
    "                                     grpc.max_concurrent_streams (default 256)\n"
    "  --ssl_config_file=FILE             SSLConfig text proto: gRPC over TLS (server_key,\n"
    "                                     server_cert, custom_ca, client_verify); re-read when\n"
    "                                     it changes\n"
    "  --rest_api_ssl_config_file=FILE    Kiln: the same for the REST port (HTTPS)\n"
    "  --ssl_cert_file=F --ssl_key_file=F Kiln: PEM files (chain, key) for TLS on both ports\n"
    "                                     (where no SSLConfig is given); re-read when they\n"
    "                                     change, so rotation needs no restart\n"
    "  --ssl_ca_file=F [--ssl_client_verify]  Kiln: CA for client certificates; mutual TLS\n"
    "  --enable_serialization_as_tensor_content[=true|false]  gRPC answers numeric tensors\n"
    "                                     in tensor_content (default: typed fields, as TF)\n"
    "  --allow_compression[=true|false]   Vertex AI's flag: compile each version at load in\n"
    "                                     int8/bf16 (kiln compile's auto policy), calibrated and\n"
    "                                     checked on its warmup file; served uncompressed when\n"
    "                                     the drop exceeds the bound or there is no data\n"
    "  --compression_max_drop=X           Kiln: that bound, e.g. 1% (default) or 0.01\n"
    "  --allow_precompilation[=true|false]  Vertex AI's flag: cache each version's compiled\n"
    "                                     .kiln so a restart or replica skips import\n"
    "  --precompilation_cache_dir=DIR     Kiln: the cache (default $XDG_CACHE_HOME/kiln/\n"
    "                                     precompiled, else ~/.cache/kiln/precompiled)\n"
    "  --tensorflow_inter_op_parallelism, --use_tfrt  accepted and ignored (the startup log\n"
    "                                     says so)\n"
    "  --rollout_config_file=FILE         Kiln: traffic splits, sticky routing and canaries with\n"
    "                                     automatic promotion and rollback, shadow traffic\n"
    "                                     (docs/ROLLOUTS.md, docs/SHADOW.md)\n"
    "  --rollout_config_file_poll_wait_seconds=N  re-read the rollout file every N s when it\n"
    "                                     changed (default 1; 0 = never)\n"
    "  --trusted_keys=FILE                Kiln: serve only versions signed (kiln sign) by a key\n"
    "                                     in FILE (docs/SECURITY.md)\n"
    "  --model_decryption_key_file=FILE   Kiln: key ring for encrypted models (kiln encrypt),\n"
    "                                     decrypted in memory\n"
    "  --auth_token_file=FILE             Kiln: require bearer tokens (kiln token create) with\n"
    "                                     scopes predict, metadata, admin; FILE is re-read when\n"
    "                                     it changes (docs/SECURITY.md). Without it: open\n"
    "  --require_blessing[=true|false]    Kiln: serve only versions blessed by kiln gate whose\n"
    "                                     files still match (docs/RELEASE_GATE.md)\n"
    "  --request_log_max_file_bytes=N     Kiln: a request log file (logging_config in the model\n"
    "                                     config) is closed past N bytes (default 64M; K/M/G)\n"
    "  --request_log_max_disk_bytes=N     Kiln: all request log files together, oldest deleted\n"
    "                                     first (default 1G)\n"
    "  --request_log_queue_size=N         Kiln: sampled records waiting for the writer; more are\n"
    "                                     dropped and counted (default 1024)\n"
    "  --enable_model_monitoring[=true|false]  Kiln: drift, confidence and validation rules\n"
    "                                     for versions with assets.extra/kiln_profile.json\n"
    "                                     (docs/MONITORING.md; default true)\n"
    "  --version                          print versions and exit\n";

/* Flags accepted for compatibility whose features Kiln lacks so far. */
static const char *const accepted_only[] = {
    "--tensorflow_inter_op_parallelism", "--use_tfrt",
};
/* Of those, the ones that are booleans (may appear without a value). */
static int is_bool_flag(const char *name)
{
    static const char *const b[] = {"--enable_batching", "--enable_model_warmup",
                                    "--rest_api_enable_cors_support", "--enable_console",
                                    "--allow_precompilation",
                                    "--allow_compression", "--use_tfrt", "--disable_optimizer",
                                    "--version", "--prefer_tflite_model", "--require_blessing",
                                    "--enable_serialization_as_tensor_content",
                                    "--ssl_client_verify", "--enable_model_monitoring"};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        if (strcmp(b[i], name) == 0) return 1;
    return 0;
}

/* Parse a TF-style bool value ("true"/"false"/"1"/"0"); -1 if not one. */
static int parse_bool(const char *v)
{
    if (!v || strcmp(v, "true") == 0 || strcmp(v, "1") == 0) return 1;
    if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0) return 0;
    return -1;
}

/* The rollout loader's reload of the rollout file: the shadow blocks apply
 * (a block refused keeps the previous shadows, and says why). */
static void on_rollout_config(void *ctx, const KilnRollout__RolloutConfig *cfg)
{
    char err[KILN_SHADOW_ERR_LEN];
    if (kiln_shadow_apply((kiln_shadow *)ctx, cfg, err) != KILN_OK)
        fprintf(stderr, "kiln serve: rollout file: shadow blocks not applied: %s\n", err);
}

/* The canary's agreement and output divergence gates read the model's
 * shadow on the candidate (the rollout loader checked that the shadow
 * targets it): rows compared since start. */
static void shadow_pairs(void *ctx, const char *model, int64_t candidate, kiln_rollout_pairs *out)
{
    (void)candidate;
    kiln_shadow_stats total;
    memset(out, 0, sizeof *out);
    if (kiln_shadow_get_stats((kiln_shadow *)ctx, model, NULL, &total, NULL) != KILN_OK) return;
    out->agree = total.top1_agree > 0 ? (uint64_t)total.top1_agree : 0;
    out->paired = total.top1_rows > 0 ? (uint64_t)total.top1_rows : 0;
    out->js_rows = total.js_rows > 0 ? (uint64_t)total.js_rows : 0;
    out->js_sum = total.sum_js;
    out->js_sq_sum = total.sum_js2;
}

/* A model config applied while serving (file poll, HandleReloadConfigRequest):
 * its logging_configs take effect. */
static void reqlog_on_models(void *ctx, const kiln_server_config *c)
{
    if (c && kiln_reqlog_apply((kiln_reqlog *)ctx, c) != KILN_OK)
        fprintf(stderr, "kiln serve: request log: out of memory applying the reloaded config\n");
}

/* After each model poll or config reload: changed monitoring profiles. */
static void monitor_on_models(void *ctx, const kiln_server_config *c)
{
    (void)c;
    kiln_monitor_refresh((kiln_monitor *)ctx);
}

/* The canary's input drift gate reads the model monitor. */
static int monitor_drift(void *ctx, const char *model, int64_t version, char *what, size_t n)
{
    return kiln_monitor_drift((kiln_monitor *)ctx, model, version, what, n);
}

int kiln_cmd_serve(int argc, char **argv)
{
    if (kiln_cli_wants_help(argc, argv)) {
        fputs(serve_help, stdout);
        return KILN_CLI_EXIT_OK;
    }
    /* request and batch threads inherit this thread's CPUs: all of them, even
     * where OMP_PROC_BIND pinned it to one */
    kiln_threads_unpin_caller();
    int cores = kiln_cpu_count(); /* cgroup quota and affinity */
    int rest_port = 8501, grpc_port = 8500, threads = (int)(cores * 4 > 256 ? 256 : cores * 4);
    int timeout_ms = 30000, poll = 1, intra = 0, disable_opt = 0, show_version = 0;
    int batching = 0, config_poll = 0, warmup = 1, warmup_iters = 0, cors = 0, console = 1,
        prefer_tflite = 0, require_blessing = 0, rollout_poll = 1;
    int grpc_threads = threads, tensor_content = 0, port_given = 0, monitoring = 1;
    const char *grpc_socket = NULL, *grpc_args = NULL, *ssl_file = NULL;
    const char *model_name = NULL, *base_path = NULL, *tags = NULL, *address = NULL;
    const char *config_file = NULL, *batching_file = NULL, *monitoring_file = NULL;
    const char *token_file = NULL, *rest_ssl_file = NULL;
    const char *cert_file = NULL, *key_file = NULL, *ca_file = NULL;
    int client_verify = 0;
    const char *rollout_file = NULL;
    kiln_integrity_options integrity = {NULL, NULL};
    kiln_compress_options compress = {0, 0, 0.01, NULL};
    kiln_reqlog_options rlo;
    kiln_reqlog_options_default(&rlo);

    for (int i = 0; i < argc; i++) {
        char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0)
            return kiln_cli_usage_error("serve", "unexpected argument '%s'", arg);
        /* split --name[=value] */
        char name[128];
        const char *eq = strchr(arg, '=');
        size_t nl = eq ? (size_t)(eq - arg) : strlen(arg);
        if (nl >= sizeof name) return kiln_cli_usage_error("serve", "unknown flag '%.60s'", arg);
        memcpy(name, arg, nl);
        name[nl] = '\0';
        const char *val = eq ? eq + 1 : NULL;
        if (!val && !is_bool_flag(name)) {
            if (i + 1 >= argc) return kiln_cli_usage_error("serve", "flag '%s' needs a value", name);
            val = argv[++i];
        }
        int ok = 1;
#define INT_FLAG(FLAG, VAR, LO, HI)                                                 \
    if (strcmp(name, FLAG) == 0) {                                                  \
        if (!kiln_cli_parse_int(val, LO, HI, &VAR))                                 \
            return kiln_cli_usage_error("serve", "flag '%s' needs an integer in [%d, %d], got '%s'", \
                                        FLAG, LO, HI, val);                        \
        continue;                                                                   \
    }
        INT_FLAG("--rest_api_port", rest_port, 0, 65535)
        if (strcmp(name, "--port") == 0) port_given = 1;
        INT_FLAG("--port", grpc_port, 0, 65535)
        INT_FLAG("--rest_api_num_threads", threads, 1, 1024)
        INT_FLAG("--grpc_max_threads", grpc_threads, 1, 1024)
        INT_FLAG("--rest_api_timeout_in_ms", timeout_ms, 0, 2147483647)
        INT_FLAG("--file_system_poll_wait_seconds", poll, -2147483647, 2147483647)
        INT_FLAG("--tensorflow_intra_op_parallelism", intra, 0, 4096)
        INT_FLAG("--model_config_file_poll_wait_seconds", config_poll, -2147483647, 2147483647)
        INT_FLAG("--rollout_config_file_poll_wait_seconds", rollout_poll, 0, 86400)
        INT_FLAG("--num_request_iterations_for_warmup", warmup_iters, -2147483647, 2147483647)
        INT_FLAG("--request_log_queue_size", rlo.queue_records, 1, 1048576)
#undef INT_FLAG
        if (strcmp(name, "--request_log_max_file_bytes") == 0 ||
            strcmp(name, "--request_log_max_disk_bytes") == 0) {
            uint64_t *dst = strcmp(name, "--request_log_max_file_bytes") == 0
                                ? &rlo.max_file_bytes : &rlo.max_disk_bytes;
            if (!kiln_reqlog_parse_bytes(val, dst) || *dst == 0)
                return kiln_cli_usage_error("serve", "flag '%s' needs a byte count such as "
                                            "67108864 or 64M, got '%s'", name, val);
            continue;
        }
        if (strcmp(name, "--model_name") == 0) model_name = val;
        else if (strcmp(name, "--model_base_path") == 0) base_path = val;
        else if (strcmp(name, "--saved_model_tags") == 0) tags = val;
        else if (strcmp(name, "--rest_api_address") == 0) address = val;
        else if (strcmp(name, "--model_config_file") == 0) config_file = val;
        else if (strcmp(name, "--batching_parameters_file") == 0) batching_file = val;
        else if (strcmp(name, "--rollout_config_file") == 0) rollout_file = val;
        else if (strcmp(name, "--enable_batching") == 0) ok = (batching = parse_bool(val)) >= 0;
        else if (strcmp(name, "--disable_optimizer") == 0) ok = (disable_opt = parse_bool(val)) >= 0;
        else if (strcmp(name, "--enable_model_warmup") == 0) ok = (warmup = parse_bool(val)) >= 0;
        else if (strcmp(name, "--rest_api_enable_cors_support") == 0) ok = (cors = parse_bool(val)) >= 0;
        else if (strcmp(name, "--enable_console") == 0) ok = (console = parse_bool(val)) >= 0;
        else if (strcmp(name, "--enable_model_monitoring") == 0)
            ok = (monitoring = parse_bool(val)) >= 0;
        else if (strcmp(name, "--monitoring_config_file") == 0) monitoring_file = val;
        else if (strcmp(name, "--trusted_keys") == 0) integrity.trusted_keys_file = *val ? val : NULL;
        else if (strcmp(name, "--model_decryption_key_file") == 0)
            integrity.decryption_key_file = *val ? val : NULL;
        else if (strcmp(name, "--grpc_socket_path") == 0) grpc_socket = val;
        else if (strcmp(name, "--grpc_channel_arguments") == 0) grpc_args = val;
        else if (strcmp(name, "--ssl_config_file") == 0) ssl_file = val;
        else if (strcmp(name, "--auth_token_file") == 0) token_file = *val ? val : NULL;
        else if (strcmp(name, "--rest_api_ssl_config_file") == 0) rest_ssl_file = *val ? val : NULL;
        else if (strcmp(name, "--ssl_cert_file") == 0) cert_file = *val ? val : NULL;
        else if (strcmp(name, "--ssl_key_file") == 0) key_file = *val ? val : NULL;
        else if (strcmp(name, "--ssl_ca_file") == 0) ca_file = *val ? val : NULL;
        else if (strcmp(name, "--ssl_client_verify") == 0) ok = (client_verify = parse_bool(val)) >= 0;
        else if (strcmp(name, "--enable_serialization_as_tensor_content") == 0)
            ok = (tensor_content = parse_bool(val)) >= 0;
        else if (strcmp(name, "--version") == 0) ok = (show_version = parse_bool(val)) >= 0;
        else if (strcmp(name, "--prefer_tflite_model") == 0)
            ok = (prefer_tflite = parse_bool(val)) >= 0;
        else if (strcmp(name, "--require_blessing") == 0)
            ok = (require_blessing = parse_bool(val)) >= 0;
        else if (strcmp(name, "--allow_compression") == 0)
            ok = (compress.allow_compression = parse_bool(val)) >= 0;
        else if (strcmp(name, "--allow_precompilation") == 0)
            ok = (compress.allow_precompilation = parse_bool(val)) >= 0;
        else if (strcmp(name, "--precompilation_cache_dir") == 0)
            compress.cache_dir = *val ? val : NULL;
        else if (strcmp(name, "--compression_max_drop") == 0) {
            char *end;
            double v = strtod(val, &end);
            if (end != val && *end == '%') v /= 100, end++;
            if (end == val || *end || !(v >= 0 && v <= 1e6))
                return kiln_cli_usage_error("serve", "flag '--compression_max_drop' needs a share "
                                            "like 1%% or 0.01, got '%s'", val);
            compress.max_drop = v;
        }
        else {
            int known = 0;
            for (size_t k = 0; k < sizeof accepted_only / sizeof accepted_only[0]; k++)
                known |= strcmp(name, accepted_only[k]) == 0;
            if (!known) return kiln_cli_usage_error("serve", "unknown flag '%s'", name);
            if (is_bool_flag(name)) ok = parse_bool(val) >= 0;
            if (ok && parse_bool(val) != 0)
                fprintf(stderr, "kiln serve: %s is accepted and ignored (not implemented)\n", name);
        }
        if (!ok) return kiln_cli_usage_error("serve", "flag '%s' needs true or false", name);
    }

    if (show_version) {
        printf("TensorFlow ModelServer: kiln-%s\nTensorFlow Library: none (Kiln runtime %s)\n",
               kiln_version(), kiln_version());
        return KILN_CLI_EXIT_OK;
    }
    /* --model_config_file replaces --model_name / --model_base_path, as in TF Serving */
    char cerr[KILN_CONFIG_ERR_LEN];
    kiln_server_config *config = NULL;
    if (config_file && *config_file) {
        if (kiln_server_config_load(config_file, &config, cerr) != KILN_OK)
            return kiln_cli_fail("--model_config_file: %s", cerr);
    } else {
        config_file = NULL;
    }
    kiln_batching_params bparams;
    if (batching && batching_file && *batching_file) {
        if (kiln_batching_params_load(batching_file, &bparams, cerr) != KILN_OK) {
            kiln_server_config_free(config);
            return kiln_cli_fail("--batching_parameters_file: %s", cerr);
        }
    } else {
        kiln_batching_params_default(&bparams);
        if (batching_file && *batching_file)
            fprintf(stderr, "kiln serve: --batching_parameters_file is ignored without "
                            "--enable_batching\n");
    }
    kiln_monitoring_config mon;
    memset(&mon, 0, sizeof mon);
    if (monitoring_file && *monitoring_file &&
        kiln_monitoring_config_load(monitoring_file, &mon, cerr) != KILN_OK) {
        kiln_server_config_free(config);
        return kiln_cli_fail("--monitoring_config_file: %s", cerr);
    }
    /* signed and encrypted models (serve/integrity.c) */
    if (kiln_integrity_check_options(&integrity, cerr) != KILN_OK) {
        kiln_server_config_free(config);
        return kiln_cli_fail("%s", cerr);
    }
    if (integrity.trusted_keys_file)
        fprintf(stderr, "kiln serve: serving only versions signed by a key in %s\n",
                integrity.trusted_keys_file);
    /* bearer tokens (serve/auth.c); static: an early error return leaves it
     * reachable until the process exits */
    static kiln_auth *auth;
    auth = NULL;
    if (token_file) {
        char aerr[KILN_AUTH_ERR_LEN];
        if (kiln_auth_open(token_file, &auth, aerr, sizeof aerr) != KILN_OK) {
            kiln_server_config_free(config);
            return kiln_cli_fail("--auth_token_file: %s", aerr);
        }
        fprintf(stderr, "kiln serve: access control: %d tokens from %s (re-read when it changes); "
                        "open without a token: health, liveness, readiness, metrics\n",
                kiln_auth_count(auth), token_file);
    } else {
        fprintf(stderr, "kiln serve: the server is open (no authentication): any client that "
                        "reaches its ports may predict and read metadata; pass "
                        "--auth_token_file to require tokens\n");
    }
    if (require_blessing)
        fprintf(stderr, "kiln serve: serving only versions blessed by kiln gate "
                        "(assets.extra/kiln_blessing.json)\n");
    /* the TF Serving container: MODEL_NAME, and MODEL_BASE_PATH/MODEL_NAME */
    const char *env_name = getenv("MODEL_NAME"), *env_base = getenv("MODEL_BASE_PATH");
    if (!model_name) model_name = env_name && *env_name ? env_name : "default";
    char env_path[4096];
    if (!base_path && env_base && *env_base) {
        snprintf(env_path, sizeof env_path, "%s/%s", env_base, model_name);
        base_path = env_path;
    }
    if (!config && (!base_path || !*base_path))
        return kiln_cli_usage_error("serve", "--model_base_path (or $MODEL_BASE_PATH) or "
                                             "--model_config_file is required");
    if (rest_port == 0) return kiln_cli_usage_error("serve", "--rest_api_port=0 would serve nothing");
    if (rest_port == grpc_port)
        return kiln_cli_usage_error("serve", "server_options.http_port cannot be same as grpc_port");

    kiln_grpc_options go;
    kiln_grpc_options_default(&go);
    go.address = address;
    go.port = grpc_port;
    go.socket_path = grpc_socket && *grpc_socket ? grpc_socket : NULL;
    go.max_threads = grpc_threads > 256 ? 256 : grpc_threads;
    go.tensor_content = tensor_content;
    if (kiln_grpc_parse_channel_args(grpc_args, &go, cerr, sizeof cerr) != KILN_OK) {
        kiln_server_config_free(config);
        return kiln_cli_usage_error("serve", "%s", cerr);
    }
    /* TLS (serve/tls.c): each port's SSLConfig, else the PEM file flags for
     * both; credentials are re-read when their files change. Static: an
     * early error return leaves them reachable until the process exits. */
    static kiln_tls *files_tls, *grpc_tls, *rest_tls;
    files_tls = grpc_tls = rest_tls = NULL;
    char terr[1024];
    if (cert_file || key_file || ca_file || client_verify) {
        kiln_tls_files f = {NULL, cert_file, key_file, ca_file, client_verify, "--ssl_cert_file"};
        if (kiln_tls_open(&f, &files_tls, terr, sizeof terr) != KILN_OK) {
            kiln_server_config_free(config);
            return kiln_cli_fail("%s", terr);
        }
    }
    grpc_tls = rest_tls = files_tls;
    if (ssl_file && *ssl_file) {
        kiln_tls_files f = {ssl_file, NULL, NULL, NULL, 0, "--ssl_config_file"};
        if (kiln_tls_open(&f, &grpc_tls, terr, sizeof terr) != KILN_OK) {
            kiln_server_config_free(config);
            return kiln_cli_fail("%s", terr);
        }
    }
    if (rest_ssl_file) {
        kiln_tls_files f = {rest_ssl_file, NULL, NULL, NULL, 0, "--rest_api_ssl_config_file"};
        if (kiln_tls_open(&f, &rest_tls, terr, sizeof terr) != KILN_OK) {
            kiln_server_config_free(config);
            return kiln_cli_fail("%s", terr);
        }
    }
    go.tls = grpc_tls;
    if (auth && (!rest_tls || (!grpc_tls && grpc_port > 0)) &&
        (!address || strncmp(address, "127.", 4) != 0))
        fprintf(stderr, "kiln serve: warning: tokens cross the network in clear text on the %s "
                        "port (no TLS); add --ssl_cert_file/--ssl_key_file on networks you do "
                        "not control\n",
                !rest_tls ? "REST" : "gRPC");
    if (rest_tls)
        fprintf(stderr, "kiln serve: REST API over HTTPS (%s; re-read when it changes)\n",
                kiln_tls_describe(rest_tls));
    if (grpc_tls && grpc_port > 0)
        fprintf(stderr, "kiln serve: gRPC over TLS (%s; re-read when it changes)\n",
                kiln_tls_describe(grpc_tls));
    /* which TF Serving / Vertex AI flags take effect, with their values */
    fprintf(stderr,
            "kiln serve: honoured flags: --rest_api_timeout_in_ms=%d --rest_api_num_threads=%d "
            "--tensorflow_intra_op_parallelism=%d (%s) --disable_optimizer=%s (optimizer %s) "
            "--enable_model_warmup=%s --num_request_iterations_for_warmup=%d "
            "--enable_batching=%s --rest_api_enable_cors_support=%s --enable_console=%s "
            "--monitoring_config_file "
            "(prometheus %s%s) --file_system_poll_wait_seconds=%d --prefer_tflite_model=%s "
            "--port=%d --grpc_max_threads=%d "
            "--grpc_channel_arguments (max_receive %lld, max_send %lld, streams %d); accepted and "
            "ignored: --tensorflow_inter_op_parallelism, --use_tfrt\n",
            timeout_ms, threads, intra, intra ? "threads per run" : "all cores",
            disable_opt ? "true" : "false", disable_opt ? "off" : "on", warmup ? "true" : "false",
            warmup_iters > 0 ? warmup_iters : 1, batching ? "true" : "false",
            cors ? "true" : "false", console ? "true" : "false",
            mon.prometheus_enable ? "on at " : "off",
            mon.prometheus_enable ? mon.prometheus_path : "", poll,
            prefer_tflite ? "true" : "false", grpc_port, go.max_threads,
            (long long)go.max_recv, (long long)go.max_send, go.max_streams);
    if (batching)
        fprintf(stderr,
                "kiln serve: batching: max_batch_size=%lld batch_timeout_micros=%lld "
                "max_enqueued_batches=%lld num_batch_threads=%lld allowed_batch_sizes=%d entries "
                "pad_variable_length_inputs=%s\n",
                (long long)bparams.max_batch_size, (long long)bparams.batch_timeout_micros,
                (long long)bparams.max_enqueued_batches, (long long)bparams.num_batch_threads,
                bparams.n_allowed, bparams.pad_variable_length_inputs ? "true" : "false");

    /* Block the shutdown signals before any thread exists; main takes them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    kiln_manager_options mo;
    memset(&mo, 0, sizeof mo);
    mo.poll_seconds = poll;
    mo.saved_model_tags = tags;
    mo.prefer_tflite = prefer_tflite;
    mo.require_blessing = require_blessing;
    kiln_session_options_init(&mo.session);
    mo.session.threads = intra;
    mo.session.optimize = !disable_opt;
    mo.config_file = config_file;
    mo.config_poll_seconds = config_poll;
    mo.enable_warmup = warmup;
    mo.integrity = &integrity;
    char cache_dir[4096];
    if (!compress.cache_dir) kiln_compress_default_cache(cache_dir, sizeof cache_dir);
    else snprintf(cache_dir, sizeof cache_dir, "%s", compress.cache_dir);
    compress.cache_dir = cache_dir;
    mo.compress = &compress;
    fprintf(stderr, "kiln serve: --allow_compression=%s (max drop %.4g%%) --allow_precompilation=%s "
            "(cache %s)\n", compress.allow_compression ? "true" : "false",
            100 * compress.max_drop, compress.allow_precompilation ? "true" : "false",
            compress.allow_precompilation ? cache_dir : "off");
    mo.warmup_iterations = warmup_iters > 0 ? warmup_iters : 1; /* TF: used only if > 0 */
    kiln_batch_stats *bstats = NULL;
    if (batching) {
        bstats = kiln_batch_stats_create();
        mo.batching = &bparams;
        mo.batch_stats = bstats;
    }
    kiln_manager *mgr;
    if (kiln_manager_create(&mo, &mgr) != KILN_OK) {
        kiln_server_config_free(config);
        kiln_batch_stats_free(bstats);
        return kiln_cli_fail("out of memory");
    }
    kiln_status mst = config ? kiln_manager_apply_config(mgr, config)
                             : kiln_manager_add_model(mgr, model_name, base_path);
    /* the request log (logging_config): with a model config file it exists
     * even when no model logs yet, since a reload may add a logging_config */
    kiln_reqlog *reqlog = NULL;
    char rerr[KILN_REQLOG_ERR_LEN];
    if (mst == KILN_OK && kiln_reqlog_create(&rlo, config, &reqlog, rerr) != KILN_OK) {
        kiln_server_config_free(config);
        kiln_manager_free(mgr);
        kiln_batch_stats_free(bstats);
        return kiln_cli_fail("%s", rerr);
    }
    kiln_server_config_free(config);
    if (mst != KILN_OK || kiln_manager_start(mgr) != KILN_OK) {
        kiln_reqlog_free(reqlog);
        kiln_manager_free(mgr);
        kiln_batch_stats_free(bstats);
        return kiln_cli_fail("cannot start the model manager");
    }
    /* gRPC's sockets listen before REST's port opens (connections wait in the
     * backlog until it serves), so REST readiness implies gRPC is reachable */
    kiln_grpc_server *grpc = NULL;
    char gerr[256];
    if (go.port > 0 || go.socket_path) {
        kiln_status gst = kiln_grpc_listen(&go, &grpc, gerr, sizeof gerr);
        if (gst != KILN_OK && go.tls) port_given = 1; /* a TLS setup error is never skipped */
        if (gst != KILN_OK && !port_given) {
            /* the default port is taken (another server on this host): REST
             * still serves; an explicit --port must open or the start fails */
            fprintf(stderr, "kiln serve: %s; gRPC is not served (pass --port to require it)\n", gerr);
            go.port = 0;
            gst = go.socket_path ? kiln_grpc_listen(&go, &grpc, gerr, sizeof gerr) : KILN_OK;
        }
        if (gst != KILN_OK) {
            kiln_reqlog_free(reqlog);
            kiln_manager_free(mgr);
            kiln_batch_stats_free(bstats);
            return kiln_cli_fail("%s", gerr);
        }
    }
    /* rollouts (src/serve/rollout/): loaded after the first versions, so the
     * canaries resolve their candidate and baseline at once */
    kiln_rollout *rollout = NULL;
    if (rollout_file) {
        char oerr[KILN_ROLLOUT_ERR_LEN];
        if (kiln_rollout_create(rollout_file, rollout_poll, mgr, &rollout, oerr) != KILN_OK) {
            kiln_grpc_stop(grpc, 0);
            kiln_reqlog_free(reqlog);
            kiln_manager_free(mgr);
            kiln_batch_stats_free(bstats);
            return kiln_cli_fail("--rollout_config_file: %s", oerr);
        }
    }
    kiln_server server;
    /* the predict path's hooks (serve/observe.h): the request log, shadow
     * traffic, monitoring and rollouts register here */
    static kiln_observers observers;
    kiln_observers_init(&observers);
    kiln_shadow *shadow = NULL;
    kiln_monitor *monitor = NULL;
    char serr[KILN_SHADOW_ERR_LEN] = "out of memory";
    const char *fail = NULL; /* what failed, for the message */
    if (reqlog) {
        kiln_observer ro;
        kiln_reqlog_observer(reqlog, &ro);
        if (kiln_observers_add(&observers, &ro) != KILN_OK)
            fprintf(stderr,
                    "kiln serve: too many predict-path observers; the request log is off\n");
    }
    /* shadow traffic (serve/shadow/): an observer, configured by the rollout
     * file's shadow blocks; checked here (a bad block stops the start), then
     * told of every reload by the rollout loader */
    kiln_observer shadow_obs;
    kiln_status sst = kiln_shadow_create(mgr, &shadow);
    if (sst == KILN_OK) {
        shadow_obs = kiln_shadow_observer(shadow);
        sst = kiln_observers_add(&observers, &shadow_obs);
    }
    if (sst == KILN_OK && rollout_file) sst = kiln_shadow_apply_file(shadow, rollout_file, serr);
    if (sst == KILN_OK && rollout) {
        snprintf(serr, sizeof serr, "cannot follow the rollout file's reloads");
        sst = kiln_rollout_subscribe(rollout, on_rollout_config, shadow);
        if (sst == KILN_OK) kiln_rollout_set_pairs(rollout, shadow_pairs, shadow);
    }
    if (sst != KILN_OK) {
        fail = serr;
        goto fail_start;
    }
    if (monitoring) { /* drift, confidence, validation (serve/monitor/) */
        kiln_observer mobs;
        if (kiln_monitor_create(&monitor) != KILN_OK ||
            (mobs = kiln_monitor_observer(monitor), kiln_observers_add(&observers, &mobs)) != KILN_OK) {
            fail = "cannot start model monitoring";
            goto fail_start;
        }
    }
    if (monitor && rollout) kiln_rollout_set_drift(rollout, monitor_drift, monitor);
    kiln_server_options so = {address, rest_port, threads, timeout_ms, KILN_JSON_MAX_BYTES, bstats,
                              mon.prometheus_enable ? mon.prometheus_path : NULL, cors, batching, console,
                              &observers, auth ? kiln_auth_authorize : NULL, auth, rest_tls, shadow,
                              NULL, NULL, NULL};
    if (rollout && kiln_rollout_attach(rollout, &observers, &so) != KILN_OK) {
        fail = "cannot register the rollout observer";
        goto fail_start;
    }
    if (!rollout) kiln_rollout_attach_none(&so);
    /* reloads reach the request log and the monitor (removed again before
     * either is freed) */
    if ((reqlog && kiln_manager_add_listener(mgr, reqlog_on_models, reqlog) != KILN_OK) ||
        (monitor && kiln_manager_add_listener(mgr, monitor_on_models, monitor) != KILN_OK)) {
        fail = "cannot register the reload listeners";
        goto fail_start;
    }
    if (kiln_server_start(&server, &so, mgr) != KILN_OK) {
        snprintf(serr, sizeof serr, "cannot listen on %s:%d (in use, or not permitted)",
                 address ? address : "0.0.0.0", rest_port);
        fail = serr;
        goto fail_start;
    }
    if (grpc && kiln_grpc_run(grpc, &server, gerr, sizeof gerr) != KILN_OK) {
        kiln_grpc_stop(grpc, 0);
        kiln_server_stop(&server, 0);
        kiln_manager_clear_listeners(mgr);
        kiln_reqlog_free(reqlog);
        kiln_shadow_free(shadow);
        kiln_rollout_free(rollout);
        kiln_manager_free(mgr);
        kiln_batch_stats_free(bstats);
        kiln_monitor_free(monitor);
        return kiln_cli_fail("%s", gerr);
    }
    if (grpc && go.port > 0)
        fprintf(stderr, "kiln serve: Running gRPC ModelServer at %s:%d ...\n",
                address ? address : "0.0.0.0", go.port);
    if (grpc && go.socket_path)
        fprintf(stderr, "kiln serve: Running gRPC ModelServer at UNIX socket %s ...\n",
                go.socket_path);
    fprintf(stderr, "kiln serve: Exporting HTTP/REST API at:%s:%d ...\n",
            address ? address : "0.0.0.0", rest_port);
    if (mon.prometheus_enable)
        fprintf(stderr, "kiln serve: Prometheus metrics at %s\n", mon.prometheus_path);
    if (console) fprintf(stderr, "kiln serve: web console at /console/\n");
    fprintf(stderr, "kiln serve: model monitoring %s\n",
            monitoring ? "on (versions with assets.extra/kiln_profile.json)" : "off");
    if (rollout && kiln_rollout_start(rollout) != KILN_OK)
        fprintf(stderr, "kiln serve: cannot start the rollout controller; splits stay as loaded\n");
    if (rollout)
        fprintf(stderr, "kiln serve: rollouts from %s (admin endpoints at /v1/rollouts)\n",
                rollout_file);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kiln serve: %s: readiness off, draining in-flight requests\n",
            sig == SIGTERM ? "SIGTERM" : "SIGINT");
    atomic_store(&server.shutting_down, 1); /* health and readiness say NOT_SERVING */
    /* one drain time for both ports: gRPC first (its clients are told with
     * GOAWAY and move on at once), the REST port with what is left, at least
     * KILN_SERVE_DRAIN_MIN_MS; REST requests meanwhile are answered, new ones 503 */
    int64_t drain_end = kiln_monotonic_ms() + KILN_SERVE_DRAIN_MS;
    kiln_grpc_stop(grpc, KILN_SERVE_DRAIN_MS);
    int64_t rest_left = drain_end - kiln_monotonic_ms();
    kiln_server_stop(&server, rest_left > KILN_SERVE_DRAIN_MIN_MS ? (int)rest_left : KILN_SERVE_DRAIN_MIN_MS);
    kiln_manager_clear_listeners(mgr);
    kiln_reqlog_free(reqlog); /* writes what is queued */
    kiln_shadow_free(shadow);
    kiln_rollout_free(rollout);
    kiln_manager_free(mgr);
    kiln_batch_stats_free(bstats);
    kiln_auth_free(auth);
    auth = NULL;
    if (rest_tls != files_tls) kiln_tls_free(rest_tls);
    if (grpc_tls != files_tls) kiln_tls_free(grpc_tls);
    kiln_tls_free(files_tls);
    files_tls = grpc_tls = rest_tls = NULL;
    kiln_monitor_free(monitor);
    fprintf(stderr, "kiln serve: stopped\n");
    return KILN_CLI_EXIT_OK;

fail_start: /* before the REST server started */
    kiln_grpc_stop(grpc, 0);
    kiln_manager_clear_listeners(mgr);
    kiln_reqlog_free(reqlog);
    kiln_shadow_free(shadow);
    kiln_rollout_free(rollout);
    kiln_monitor_free(monitor);
    kiln_manager_free(mgr);
    kiln_batch_stats_free(bstats);
    return kiln_cli_fail("%s", fail);
}
