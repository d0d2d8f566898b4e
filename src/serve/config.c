/*
 * config.c - reading --model_config_file and --batching_parameters_file
 * (see config.h): file -> text-proto parser -> protobuf-c message -> checked
 * plain structs.
 */
#include "serve/config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln_util.h"
#include "prediction_log.pb-c.h"
#include "serving_config.pb-c.h"

#define KILN_CONFIG_MAX_BYTES ((size_t)16 << 20) /* config files are small */

/* Read a whole file; *out is malloc'd (NUL-terminated). */
static kiln_status read_file(const char *path, char **out, size_t *len, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: %s", path, strerror(errno));
        return KILN_ERR_IO;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 4096;
            if (cap > KILN_CONFIG_MAX_BYTES + 1) {
                snprintf(err, KILN_CONFIG_ERR_LEN, "%s: larger than %zu bytes", path,
                         KILN_CONFIG_MAX_BYTES);
                goto err_free;
            }
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                snprintf(err, KILN_CONFIG_ERR_LEN, "%s: out of memory", path);
                goto err_free;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: read error", path);
        goto err_free;
    }
    fclose(f);
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return KILN_OK;
err_free:
    free(buf);
    fclose(f);
    return KILN_ERR_IO;
}

/* Parse path as a message of type desc. */
static kiln_status parse_file(const char *path, const ProtobufCMessageDescriptor *desc,
                              ProtobufCMessage **msg, char *err)
{
    char *text;
    size_t len;
    kiln_status st = read_file(path, &text, &len, err);
    if (st != KILN_OK) return st;
    st = kiln_textproto_parse(desc, text, len, msg);
    free(text);
    if (st != KILN_OK) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: %s", path, kiln_last_error());
        return KILN_ERR_INVALID_ARGUMENT;
    }
    return KILN_OK;
}

void kiln_server_config_free(kiln_server_config *c)
{
    if (!c) return;
    for (int i = 0; i < c->n_models; i++) {
        kiln_model_config *m = &c->models[i];
        free(m->name);
        free(m->base_path);
        free(m->platform);
        free(m->specific);
        for (int k = 0; k < m->n_labels; k++) free(m->label_names[k]);
        free(m->label_names);
        free(m->label_versions);
        free(m->log_prefix);
    }
    free(c->models);
    free(c);
}

/* Copy and check a ModelConfig's logging_config (the request log). The
 * collector types are Kiln's: "" or "kiln_tfrecord" (PredictionLog
 * TFRecords, TF Serving's format) and "kiln_jsonl" (JSON lines). */
static kiln_status copy_logging(const KilnServing__LoggingConfig *lc, kiln_model_config *m,
                                const char *path, char *err)
{
    if (!lc) return KILN_OK;
    double rate = lc->sampling_config ? lc->sampling_config->sampling_rate : 0.0;
    if (!(rate >= 0.0 && rate <= 1.0)) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: model '%s': logging_config.sampling_config."
                 "sampling_rate must be in [0, 1], got %g", path, m->name, rate);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    const KilnServing__LogCollectorConfig *cc = lc->log_collector_config;
    const char *type = cc && cc->type ? cc->type : "";
    const char *prefix = cc && cc->filename_prefix ? cc->filename_prefix : "";
    int jsonl = strcmp(type, "kiln_jsonl") == 0;
    if (!jsonl && *type && strcmp(type, "kiln_tfrecord") != 0) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: model '%s': logging_config.log_collector_config."
                 "type '%.100s' is not a log collector Kiln has (\"kiln_tfrecord\", the default: "
                 "PredictionLog TFRecords; \"kiln_jsonl\": JSON lines)", path, m->name, type);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (rate > 0.0 && !*prefix) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: model '%s': logging_config samples requests "
                 "(sampling_rate %g) but log_collector_config.filename_prefix is empty", path,
                 m->name, rate);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (rate == 0.0) return KILN_OK;
    m->log_prefix = strdup(prefix);
    if (!m->log_prefix) return KILN_ERR_OUT_OF_MEMORY;
    m->log_rate = rate;
    m->log_jsonl = jsonl;
    return KILN_OK;
}

/* Copy and check one ModelConfig. */
static kiln_status copy_model(const KilnServing__ModelConfig *mc, kiln_model_config *m,
                              const char *path, char *err)
{
    if (!mc->name || !*mc->name) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: a model config has no name", path);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (!mc->base_path || !*mc->base_path) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: model '%s' has no base_path", path, mc->name);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    m->name = strdup(mc->name);
    m->base_path = strdup(mc->base_path);
    m->platform = strdup(mc->model_platform ? mc->model_platform : "");
    m->policy = KILN_POLICY_LATEST;
    m->num_versions = 1;
    const KilnServing__ServableVersionPolicy *p = mc->model_version_policy;
    if (p && p->policy_choice_case == KILN_SERVING__SERVABLE_VERSION_POLICY__POLICY_CHOICE_ALL) {
        m->policy = KILN_POLICY_ALL;
    } else if (p && p->policy_choice_case ==
                        KILN_SERVING__SERVABLE_VERSION_POLICY__POLICY_CHOICE_SPECIFIC) {
        m->policy = KILN_POLICY_SPECIFIC;
        size_t n = p->specific->n_versions;
        if (n == 0) {
            snprintf(err, KILN_CONFIG_ERR_LEN,
                     "%s: model '%s': the specific version policy lists no versions", path,
                     mc->name);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        m->specific = malloc(n * sizeof *m->specific);
        if (!m->specific) return KILN_ERR_OUT_OF_MEMORY;
        for (size_t i = 0; i < n; i++) {
            if (p->specific->versions[i] < 0) {
                snprintf(err, KILN_CONFIG_ERR_LEN, "%s: model '%s': version %" PRId64
                         " is negative", path, mc->name, p->specific->versions[i]);
                return KILN_ERR_INVALID_ARGUMENT;
            }
            m->specific[i] = p->specific->versions[i];
        }
        m->n_specific = (int)n;
    } else if (p && p->policy_choice_case ==
                        KILN_SERVING__SERVABLE_VERSION_POLICY__POLICY_CHOICE_LATEST) {
        uint32_t nv = p->latest->num_versions;
        m->num_versions = nv == 0 ? 1 : nv > 1000000 ? 1000000 : (int)nv;
    }
    size_t nl = mc->n_version_labels;
    if (nl) {
        m->label_names = calloc(nl, sizeof *m->label_names);
        m->label_versions = calloc(nl, sizeof *m->label_versions);
        if (!m->label_names || !m->label_versions) return KILN_ERR_OUT_OF_MEMORY;
        for (size_t i = 0; i < nl; i++) {
            const KilnServing__ModelConfig__VersionLabelsEntry *e = mc->version_labels[i];
            const char *key = e->key ? e->key : "";
            if (!*key || strpbrk(key, "/:")) {
                snprintf(err, KILN_CONFIG_ERR_LEN, "%s: model '%s': version label '%s' is not a "
                         "valid label (must be non-empty, without '/' or ':')", path, mc->name, key);
                return KILN_ERR_INVALID_ARGUMENT;
            }
            for (size_t k = 0; k < i; k++)
                if (strcmp(m->label_names[k], key) == 0) { /* map: the last entry wins */
                    m->label_versions[k] = e->value;
                    goto next_label;
                }
            m->label_names[m->n_labels] = strdup(key);
            if (!m->label_names[m->n_labels]) return KILN_ERR_OUT_OF_MEMORY;
            m->label_versions[m->n_labels++] = e->value;
        next_label:;
        }
    }
    if (!m->name || !m->base_path || !m->platform) return KILN_ERR_OUT_OF_MEMORY;
    return copy_logging(mc->logging_config, m, path, err);
}

kiln_status kiln_server_config_from_proto(const KilnServing__ModelServerConfig *sc,
                                          const char *what, kiln_server_config **out, char *err)
{
    *out = NULL;
    kiln_status st;
    kiln_server_config *c = calloc(1, sizeof *c);
    if (!c) {
        st = KILN_ERR_OUT_OF_MEMORY;
        goto err_free_config;
    }
    if (sc->config_case != KILN_SERVING__MODEL_SERVER_CONFIG__CONFIG_MODEL_CONFIG_LIST ||
        sc->model_config_list->n_config == 0) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: no model_config_list { config { ... } } entries",
                 what);
        st = KILN_ERR_INVALID_ARGUMENT;
        goto err_free_config;
    }
    size_t n = sc->model_config_list->n_config;
    c->models = calloc(n, sizeof *c->models);
    if (!c->models) {
        st = KILN_ERR_OUT_OF_MEMORY;
        goto err_free_config;
    }
    for (size_t i = 0; i < n; i++) {
        c->n_models = (int)i + 1;
        st = copy_model(sc->model_config_list->config[i], &c->models[i], what, err);
        if (st != KILN_OK) goto err_free_config;
        for (size_t k = 0; k < i; k++)
            if (strcmp(c->models[k].name, c->models[i].name) == 0) {
                snprintf(err, KILN_CONFIG_ERR_LEN, "%s: model name '%s' appears twice", what,
                         c->models[i].name);
                st = KILN_ERR_INVALID_ARGUMENT;
                goto err_free_config;
            }
    }
    *out = c;
    return KILN_OK;
err_free_config:
    if (st == KILN_ERR_OUT_OF_MEMORY) snprintf(err, KILN_CONFIG_ERR_LEN, "%s: out of memory", what);
    kiln_server_config_free(c);
    return st;
}

kiln_status kiln_server_config_load(const char *path, kiln_server_config **out, char *err)
{
    *out = NULL;
    ProtobufCMessage *msg;
    kiln_status st = parse_file(path, &kiln_serving__model_server_config__descriptor, &msg, err);
    if (st != KILN_OK) return st;
    KilnServing__ModelServerConfig *sc = (KilnServing__ModelServerConfig *)msg;
    st = kiln_server_config_from_proto(sc, path, out, err);
    kiln_serving__model_server_config__free_unpacked(sc, NULL);
    return st;
}

void kiln_batching_params_default(kiln_batching_params *p)
{
    memset(p, 0, sizeof *p);
    int cores = kiln_cpu_count();
    p->max_batch_size = 1000;
    p->batch_timeout_micros = 0;
    p->max_enqueued_batches = 10;
    p->num_batch_threads = cores > 0 ? cores : 1;
}

kiln_status kiln_batching_params_load(const char *path, kiln_batching_params *p, char *err)
{
    kiln_batching_params_default(p);
    ProtobufCMessage *msg;
    kiln_status st = parse_file(path, &kiln_serving__batching_parameters__descriptor, &msg, err);
    if (st != KILN_OK) return st;
    KilnServing__BatchingParameters *bp = (KilnServing__BatchingParameters *)msg;
    st = KILN_ERR_INVALID_ARGUMENT;
    if (bp->max_batch_size) p->max_batch_size = bp->max_batch_size->value;
    if (bp->batch_timeout_micros) p->batch_timeout_micros = bp->batch_timeout_micros->value;
    if (bp->max_enqueued_batches) p->max_enqueued_batches = bp->max_enqueued_batches->value;
    if (bp->num_batch_threads) p->num_batch_threads = bp->num_batch_threads->value;
    p->pad_variable_length_inputs = bp->pad_variable_length_inputs;
    if (p->max_batch_size < 1 || p->max_batch_size > 1000000) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: max_batch_size must be in [1, 1000000], got %" PRId64,
                 path, p->max_batch_size);
        goto err_free_msg;
    }
    if (p->batch_timeout_micros < 0) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: batch_timeout_micros must be >= 0", path);
        goto err_free_msg;
    }
    if (p->max_enqueued_batches < 1) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: max_enqueued_batches must be >= 1", path);
        goto err_free_msg;
    }
    if (p->num_batch_threads < 1 || p->num_batch_threads > 1024) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: num_batch_threads must be in [1, 1024]", path);
        goto err_free_msg;
    }
    size_t na = bp->n_allowed_batch_sizes;
    if (na > sizeof p->allowed_batch_sizes / sizeof p->allowed_batch_sizes[0]) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: more than 64 allowed_batch_sizes", path);
        goto err_free_msg;
    }
    for (size_t i = 0; i < na; i++) {
        int64_t v = bp->allowed_batch_sizes[i];
        if (v < 1 || (i > 0 && v <= p->allowed_batch_sizes[i - 1])) {
            snprintf(err, KILN_CONFIG_ERR_LEN,
                     "%s: allowed_batch_sizes entries must be monotonically increasing", path);
            goto err_free_msg;
        }
        p->allowed_batch_sizes[i] = v;
    }
    p->n_allowed = (int)na;
    if (na && p->allowed_batch_sizes[na - 1] != p->max_batch_size) {
        snprintf(err, KILN_CONFIG_ERR_LEN,
                 "%s: Last entry in allowed_batch_sizes must match max_batch_size; last entry was "
                 "%" PRId64 "; expected %" PRId64, path, p->allowed_batch_sizes[na - 1],
                 p->max_batch_size);
        goto err_free_msg;
    }
    st = KILN_OK;
err_free_msg:
    kiln_serving__batching_parameters__free_unpacked(bp, NULL);
    return st;
}

kiln_status kiln_monitoring_config_load(const char *path, kiln_monitoring_config *out, char *err)
{
    memset(out, 0, sizeof *out);
    ProtobufCMessage *msg;
    kiln_status st = parse_file(path, &kiln_tfs__monitoring_config__descriptor, &msg, err);
    if (st != KILN_OK) return st;
    KilnTfs__MonitoringConfig *mc = (KilnTfs__MonitoringConfig *)msg;
    const KilnTfs__PrometheusConfig *pc = mc->prometheus_config;
    const char *p = pc && pc->path && *pc->path ? pc->path : KILN_PROMETHEUS_DEFAULT_PATH;
    st = KILN_ERR_INVALID_ARGUMENT;
    if (p[0] != '/' || strlen(p) >= sizeof out->prometheus_path || strpbrk(p, " ?#\t\r\n")) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: prometheus_config.path '%.200s' is not a URL path "
                 "(it must start with '/', without spaces, '?' or '#', under %zu bytes)", path, p,
                 sizeof out->prometheus_path);
        goto err_free_msg;
    }
    out->prometheus_enable = pc && pc->has_enable && pc->enable;
    snprintf(out->prometheus_path, sizeof out->prometheus_path, "%s", p);
    st = KILN_OK;
err_free_msg:
    kiln_tfs__monitoring_config__free_unpacked(mc, NULL);
    return st;
}

kiln_status kiln_ssl_config_load(const char *path, kiln_ssl_config *out, char *err)
{
    memset(out, 0, sizeof *out);
    ProtobufCMessage *msg;
    kiln_status st = parse_file(path, &kiln_serving__sslconfig__descriptor, &msg, err);
    if (st != KILN_OK) return st;
    KilnServing__SSLConfig *sc = (KilnServing__SSLConfig *)msg;
    st = KILN_ERR_INVALID_ARGUMENT;
    if (!sc->server_key || !*sc->server_key || !sc->server_cert || !*sc->server_cert) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: server_key and server_cert (PEM text) are required",
                 path);
        goto out;
    }
    if (sc->client_verify && (!sc->custom_ca || !*sc->custom_ca)) {
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: client_verify needs custom_ca (the CA that signs "
                 "client certificates)", path);
        goto out;
    }
    out->server_key = strdup(sc->server_key);
    out->server_cert = strdup(sc->server_cert);
    out->custom_ca = sc->custom_ca && *sc->custom_ca ? strdup(sc->custom_ca) : NULL;
    out->client_verify = sc->client_verify;
    if (!out->server_key || !out->server_cert || (sc->custom_ca && *sc->custom_ca && !out->custom_ca)) {
        kiln_ssl_config_free(out);
        snprintf(err, KILN_CONFIG_ERR_LEN, "%s: out of memory", path);
        st = KILN_ERR_OUT_OF_MEMORY;
        goto out;
    }
    st = KILN_OK;
out:
    kiln_serving__sslconfig__free_unpacked(sc, NULL);
    return st;
}

void kiln_ssl_config_free(kiln_ssl_config *c)
{
    free(c->server_key);
    free(c->server_cert);
    free(c->custom_ca);
    memset(c, 0, sizeof *c);
}
