/*
 * config.h - `kiln serve`'s config files, in TF Serving's protobuf text
 * format: --model_config_file (ModelServerConfig: models, version policies,
 * version labels), --batching_parameters_file (BatchingParameters) and
 * --monitoring_config_file (MonitoringConfig).
 *
 * The text is parsed by src/import/textproto.c against the schema in
 * src/import/proto/serving_config.proto (MonitoringConfig: prediction_log.proto),
 * then copied into the plain structs
 * below and checked, so the rest of the server never sees protobuf-c types.
 * Errors name the file and the problem ("models.config: line 3:5: unknown
 * field 'nmae' in ModelConfig", "model 'm': version_labels 'stable' ...").
 */
#ifndef KILN_SERVE_CONFIG_H
#define KILN_SERVE_CONFIG_H

#include <stdint.h>

#include "kiln/kiln.h"

#define KILN_CONFIG_ERR_LEN 512

/* ServableVersionPolicy's choice. */
typedef enum kiln_version_policy {
    KILN_POLICY_LATEST = 0, /* the num_versions highest versions (default 1) */
    KILN_POLICY_ALL,        /* every version on disk */
    KILN_POLICY_SPECIFIC,   /* the listed versions */
} kiln_version_policy;

/* One ModelConfig. All strings and arrays are owned by the config. */
typedef struct kiln_model_config {
    char *name;
    char *base_path;
    char *platform;            /* model_platform; "" if unset */
    kiln_version_policy policy;
    int num_versions;          /* LATEST: >= 1 */
    int n_specific;
    int64_t *specific;         /* SPECIFIC: the versions */
    int n_labels;
    char **label_names;        /* version_labels keys */
    int64_t *label_versions;   /* ... and their versions */
    /* logging_config (the request log, src/serve/reqlog/): log_rate > 0
     * only when the model has a logging_config with a sampling_rate. */
    double log_rate;           /* sampling_config.sampling_rate, in [0, 1] */
    char *log_prefix;          /* log_collector_config.filename_prefix; NULL if no logging */
    int log_jsonl;             /* log_collector_config.type "kiln_jsonl": JSON lines */
} kiln_model_config;

typedef struct kiln_server_config {
    int n_models;
    kiln_model_config *models;
} kiln_server_config;

/* Read and check a ModelServerConfig text file. On success *out owns a new
 * config (free with kiln_server_config_free); on failure err says why. */
kiln_status kiln_server_config_load(const char *path, kiln_server_config **out, char *err);
void kiln_server_config_free(kiln_server_config *c);
/* The same checks on a decoded ModelServerConfig (gRPC's
 * HandleReloadConfigRequest); `what` names it in messages. */
struct KilnServing__ModelServerConfig;
kiln_status kiln_server_config_from_proto(const struct KilnServing__ModelServerConfig *sc,
                                          const char *what, kiln_server_config **out, char *err);

/* MonitoringConfig (--monitoring_config_file): whether and where the
 * Prometheus page is served. As in TF Serving, without the file (or with
 * enable: false) there is no metrics page; an empty path means
 * KILN_PROMETHEUS_DEFAULT_PATH. */
#define KILN_PROMETHEUS_DEFAULT_PATH "/monitoring/prometheus/metrics"
typedef struct kiln_monitoring_config {
    int prometheus_enable;
    char prometheus_path[512]; /* starts with '/' */
} kiln_monitoring_config;

/* Read and check a MonitoringConfig text file into *out. */
kiln_status kiln_monitoring_config_load(const char *path, kiln_monitoring_config *out, char *err);

/* SSLConfig (--ssl_config_file, gRPC only, as in TF Serving): PEM text of
 * the server's key and certificate chain, an optional CA bundle for client
 * certificates, and whether clients must present one signed by it. */
typedef struct kiln_ssl_config {
    char *server_key;    /* owned */
    char *server_cert;   /* owned */
    char *custom_ca;     /* owned; NULL if unset */
    int client_verify;
} kiln_ssl_config;

/* Read and check an SSLConfig text file (key and certificate present;
 * client_verify needs custom_ca). */
kiln_status kiln_ssl_config_load(const char *path, kiln_ssl_config *out, char *err);
void kiln_ssl_config_free(kiln_ssl_config *c);

/* BatchingParameters, with TF Serving's defaults for unset fields. */
typedef struct kiln_batching_params {
    int64_t max_batch_size;        /* default 1000 */
    int64_t batch_timeout_micros;  /* default 0 */
    int64_t max_enqueued_batches;  /* default 10 */
    int64_t num_batch_threads;     /* default: number of cores */
    int n_allowed;
    int64_t allowed_batch_sizes[64]; /* increasing; last == max_batch_size */
    int pad_variable_length_inputs;
} kiln_batching_params;

void kiln_batching_params_default(kiln_batching_params *p);
/* Read and check a BatchingParameters text file into *p (defaults first). */
kiln_status kiln_batching_params_load(const char *path, kiln_batching_params *p, char *err);

#endif
