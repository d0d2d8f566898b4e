/*
 * config.c - reading and checking the rollout file (rollout.h,
 * src/import/proto/rollout.proto): the text is parsed by the generic
 * text-proto parser into KilnRollout__RolloutConfig, then every field is
 * checked so that the controller and the route table can trust it. An
 * error names the file, the line (the parser's, or the line of the
 * model's model_name), the model, the field and the bad value.
 */
#include <inttypes.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln_util.h"
#include "serve/rollout/rollout.h"

#define ROLLOUT_FILE_MAX_BYTES ((size_t)1 << 20)

static kiln_status read_text(const char *path, char **out, size_t *len, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, KILN_ROLLOUT_ERR_LEN, "%s: %s", path, strerror(errno));
        return KILN_ERR_IO;
    }
    char *buf = malloc(ROLLOUT_FILE_MAX_BYTES + 1);
    if (!buf) {
        fclose(f);
        snprintf(err, KILN_ROLLOUT_ERR_LEN, "%s: out of memory", path);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    size_t n = fread(buf, 1, ROLLOUT_FILE_MAX_BYTES + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > ROLLOUT_FILE_MAX_BYTES) {
        free(buf);
        snprintf(err, KILN_ROLLOUT_ERR_LEN, "%s: %s", path,
                 bad ? "read error" : "larger than 1 MiB");
        return KILN_ERR_IO;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return KILN_OK;
}

/* The 1-based line of `model_name: "name"` in text, or 0. */
static int model_line(const char *text, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = strstr(text, "model_name"); p; p = strstr(p + 1, "model_name")) {
        const char *q = p + 10;
        while (*q == ' ' || *q == '\t' || *q == ':') q++;
        if ((*q == '"' || *q == '\'') && strncmp(q + 1, name, nl) == 0 && q[1 + nl] == *q) {
            int line = 1;
            for (const char *s = text; s < p; s++) line += *s == '\n';
            return line;
        }
    }
    return 0;
}

typedef struct check_ctx {
    const char *path, *text;
    char *err;
} check_ctx;

static kiln_status fail(const check_ctx *c, const char *model, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static kiln_status fail(const check_ctx *c, const char *model, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int line = model ? model_line(c->text, model) : 0;
    if (model && line)
        snprintf(c->err, KILN_ROLLOUT_ERR_LEN, "%s:%d: model_rollouts '%.128s': %s", c->path, line,
                 model, what);
    else if (model)
        snprintf(c->err, KILN_ROLLOUT_ERR_LEN, "%s: model_rollouts '%.128s': %s", c->path, model,
                 what);
    else
        snprintf(c->err, KILN_ROLLOUT_ERR_LEN, "%s: %s", c->path, what);
    return KILN_ERR_INVALID_ARGUMENT;
}

static int header_token(const char *s)
{
    for (; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
              *s == '-' || *s == '_'))
            return 0;
    return 1;
}

static kiln_status check_canary(const check_ctx *c, const char *m,
                                const KilnRollout__ModelRollout *mr)
{
    const KilnRollout__Canary *k = mr->canary;
    int has_cv = k->candidate_version != 0, has_cl = k->candidate_label && k->candidate_label[0];
    if (k->candidate_version < 0)
        return fail(c, m, "canary.candidate_version = %lld: versions are positive",
                    (long long)k->candidate_version);
    if (has_cv == has_cl)
        return fail(c, m, "canary needs exactly one of candidate_version and candidate_label "
                          "(got %s)", has_cv ? "both" : "neither");
    if (k->baseline_version < 0)
        return fail(c, m, "canary.baseline_version = %lld: versions are positive",
                    (long long)k->baseline_version);
    if (k->baseline_version && k->baseline_label && k->baseline_label[0])
        return fail(c, m, "canary: baseline_version and baseline_label are exclusive");
    if (has_cv && k->baseline_version == k->candidate_version)
        return fail(c, m, "canary: baseline_version = candidate_version = %lld",
                    (long long)k->candidate_version);
    if (has_cl && k->baseline_label && strcmp(k->baseline_label, k->candidate_label) == 0)
        return fail(c, m, "canary: baseline_label = candidate_label = '%.64s'", k->candidate_label);
    if (k->n_steps > 16) return fail(c, m, "canary.steps: %zu steps, at most 16", k->n_steps);
    for (size_t i = 0; i < k->n_steps; i++) {
        double s = k->steps[i];
        if (!(s > 0 && s <= 100))
            return fail(c, m, "canary.steps[%zu] = %g: a percentage in (0, 100]", i, s);
        if (i > 0 && !(s > k->steps[i - 1]))
            return fail(c, m, "canary.steps[%zu] = %g is not greater than the step before it (%g)",
                        i, s, k->steps[i - 1]);
    }
    if (k->n_steps == 1)
        return fail(c, m, "canary.steps: one step (%g); give at least one step below 100, then 100",
                    k->steps[0]);
    if (k->n_steps && k->steps[k->n_steps - 1] != 100)
        return fail(c, m, "canary.steps: the last step is %g, it must be 100",
                    k->steps[k->n_steps - 1]);
    if (k->min_requests < 0)
        return fail(c, m, "canary.min_requests = %lld: must be >= 0", (long long)k->min_requests);
    if (k->min_step_seconds < 0)
        return fail(c, m, "canary.min_step_seconds = %d: must be >= 0", k->min_step_seconds);
    if (k->controlled) {
        static const char *const states[] = {"", "progressing", "paused", "promoted", "rolled_back"};
        int ok = 0;
        for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
            ok |= k->state && strcmp(k->state, states[i]) == 0;
        if (!ok)
            return fail(c, m, "canary.state = '%.40s': progressing, paused, promoted or rolled_back",
                        k->state ? k->state : "");
        int n = k->n_steps ? (int)k->n_steps : 3;
        if (k->step < 0 || k->step >= n)
            return fail(c, m, "canary.step = %d: an index into the %d steps", k->step, n);
    }
    const KilnRollout__Gates *g = k->gates;
    if (g) {
        if (g->confidence != 0 && !(g->confidence > 0.5 && g->confidence < 1))
            return fail(c, m, "canary.gates.confidence = %g: must be in (0.5, 1)", g->confidence);
        if (!isfinite(g->max_error_rate_increase) || g->max_error_rate_increase > 1)
            return fail(c, m, "canary.gates.max_error_rate_increase = %g: must be <= 1 (negative "
                              "turns the gate off)", g->max_error_rate_increase);
        if (!isfinite(g->max_p99_latency_ratio) ||
            (g->max_p99_latency_ratio > 0 && g->max_p99_latency_ratio < 1))
            return fail(c, m, "canary.gates.max_p99_latency_ratio = %g: must be >= 1 (negative "
                              "turns the gate off)", g->max_p99_latency_ratio);
        if (!isfinite(g->p99_latency_slack_us))
            return fail(c, m, "canary.gates.p99_latency_slack_us = %g: must be finite",
                        g->p99_latency_slack_us);
        if (!(g->min_agreement >= 0 && g->min_agreement <= 1))
            return fail(c, m, "canary.gates.min_agreement = %g: must be in [0, 1]",
                        g->min_agreement);
        if (!(g->max_output_divergence >= 0 && g->max_output_divergence <= 0.6931471805599453))
            return fail(c, m, "canary.gates.max_output_divergence = %g: a Jensen-Shannon "
                              "divergence in nats, in [0, ln 2 = 0.693]",
                        g->max_output_divergence);
        if (g->min_agreement > 0 || g->max_output_divergence > 0) {
            /* the pairs come from a shadow of this model on the candidate */
            const KilnRollout__Shadow *sh = mr->shadow;
            int same_model = sh && (!sh->target_model || !sh->target_model[0] ||
                                    strcmp(sh->target_model, mr->model_name) == 0);
            const char *field = g->min_agreement > 0 ? "min_agreement" : "max_output_divergence";
            double v = g->min_agreement > 0 ? g->min_agreement : g->max_output_divergence;
            if (k->candidate_version <= 0 || !same_model ||
                sh->target_version != k->candidate_version)
                return fail(c, m, "canary.gates.%s = %g needs canary.candidate_version "
                                  "and a shadow of this model on that version (shadow { "
                                  "target_version: %" PRId64 " fraction: ... })",
                            field, v, k->candidate_version);
        }
    }
    return KILN_OK;
}

static kiln_status check(const check_ctx *c, const KilnRollout__RolloutConfig *cfg)
{
    if (cfg->route_key_header && cfg->route_key_header[0] &&
        (strlen(cfg->route_key_header) >= 64 || !header_token(cfg->route_key_header)))
        return fail(c, NULL, "route_key_header = '%.80s': a header name (letters, digits, '-', "
                             "'_'; under 64 bytes)", cfg->route_key_header);
    if (cfg->evaluation_interval_seconds < 0 || cfg->evaluation_interval_seconds > 86400)
        return fail(c, NULL, "evaluation_interval_seconds = %d: must be in [0, 86400] (0 = 5)",
                    cfg->evaluation_interval_seconds);
    if (cfg->n_model_rollouts > KILN_ROLLOUT_MAX_MODELS)
        return fail(c, NULL, "%zu model_rollouts, at most %d", cfg->n_model_rollouts,
                    KILN_ROLLOUT_MAX_MODELS);
    for (size_t i = 0; i < cfg->n_model_rollouts; i++) {
        const KilnRollout__ModelRollout *mr = cfg->model_rollouts[i];
        const char *m = mr->model_name;
        if (!m || !m[0]) return fail(c, NULL, "model_rollouts[%zu] has no model_name", i);
        if (strlen(m) >= 128)
            return fail(c, NULL, "model_rollouts[%zu]: model_name longer than 127 bytes", i);
        for (size_t j = 0; j < i; j++)
            if (strcmp(cfg->model_rollouts[j]->model_name, m) == 0)
                return fail(c, m, "model_name given twice (model_rollouts[%zu] and [%zu])", j, i);
        if (mr->n_split && mr->canary)
            return fail(c, m, "has both split and canary; a canary sets the split itself");
        if (mr->n_split > KILN_ROLLOUT_MAX_TARGETS)
            return fail(c, m, "split has %zu targets, at most %d", mr->n_split,
                        KILN_ROLLOUT_MAX_TARGETS);
        double sum = 0;
        for (size_t k = 0; k < mr->n_split; k++) {
            const KilnRollout__SplitTarget *t = mr->split[k];
            if (t->target_case == KILN_ROLLOUT__SPLIT_TARGET__TARGET_VERSION && t->version <= 0)
                return fail(c, m, "split[%zu].version = %lld: versions are positive", k,
                            (long long)t->version);
            if (t->target_case == KILN_ROLLOUT__SPLIT_TARGET__TARGET_LABEL &&
                (!t->label || !t->label[0]))
                return fail(c, m, "split[%zu].label is empty", k);
            if (t->target_case != KILN_ROLLOUT__SPLIT_TARGET__TARGET_VERSION &&
                t->target_case != KILN_ROLLOUT__SPLIT_TARGET__TARGET_LABEL)
                return fail(c, m, "split[%zu] names neither a version nor a label", k);
            if (!(t->weight >= 0 && isfinite(t->weight)))
                return fail(c, m, "split[%zu].weight = %g: must be a finite number >= 0", k,
                            t->weight);
            sum += t->weight;
        }
        if (mr->n_split && !(sum > 0)) return fail(c, m, "split: the weights sum to 0");
        if (mr->canary) {
            kiln_status st = check_canary(c, m, mr);
            if (st != KILN_OK) return st;
        }
        if (mr->shadow) {
            double f = mr->shadow->fraction;
            if (!(f >= 0 && f <= 1))
                return fail(c, m, "shadow.fraction = %g: must be in [0, 1]", f);
            if (mr->shadow->queue_size < 0)
                return fail(c, m, "shadow.queue_size = %d: must be >= 0", mr->shadow->queue_size);
        }
    }
    return KILN_OK;
}

kiln_status kiln_rollout_config_load(const char *path, KilnRollout__RolloutConfig **out, char *err)
{
    *out = NULL;
    char *text;
    size_t len;
    kiln_status st = read_text(path, &text, &len, err);
    if (st != KILN_OK) return st;
    ProtobufCMessage *msg = NULL;
    if (kiln_textproto_parse(&kiln_rollout__rollout_config__descriptor, text, len, &msg) != KILN_OK) {
        snprintf(err, KILN_ROLLOUT_ERR_LEN, "%s: %s", path, kiln_last_error());
        free(text);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    KilnRollout__RolloutConfig *cfg = (KilnRollout__RolloutConfig *)msg;
    check_ctx c = {path, text, err};
    st = check(&c, cfg);
    free(text);
    if (st != KILN_OK) {
        kiln_rollout__rollout_config__free_unpacked(cfg, NULL);
        return st;
    }
    *out = cfg;
    return KILN_OK;
}
