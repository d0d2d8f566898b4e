/*
 * manager.c - version discovery, background loading, atomic swaps and
 * reference-counted unloading (see manager.h).
 *
 * Locking: the model list is guarded by a read-write lock: requests take it
 * for reading while they look a model up; only the thread that applies a
 * config (start, or the polling thread) changes the list, under the write
 * lock, and that same thread is the only one that loads, so it may walk the
 * list without the lock. Each model has one mutex guarding its served
 * versions, policy, labels and version-status list. Loading runs with no
 * lock held, so requests keep flowing on the served versions while a new
 * one imports; adding it is a pointer insert under the lock.
 *
 * Loads found by the polling thread run on loader threads of their own (at
 * most MAX_LOADERS at once, one per model version), so a version that takes
 * minutes to import or warm up holds up neither the polling of other models
 * and config files nor the unloading of versions no longer wanted; the
 * version counts as not served (LOADING) until its loader inserts it, and a
 * finished loader wakes the polling thread to retire what it replaces. A
 * loader holds a reference on its model, so a model leaving the config while
 * one of its versions loads is freed by whichever lets go last. The loads at
 * start and those of kiln_manager_reload (gRPC HandleReloadConfigRequest)
 * stay synchronous: those callers wait for the versions, as TF Serving does.
 */
#include "serve/manager.h"

#include "serve/batch.h"
#include "serve/containers.h"
#include "serve/gate/release.h"
#include "serve/integrity.h"
#include "serve/warmup.h"
#include "serve/compress.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef struct version_record {
    int64_t version;
    kiln_version_state state;
    const char *error_code; /* TF Serving's code name: "OK", "INVALID_ARGUMENT", ... */
    char *error_message;    /* owned; NULL = "" */
    uint64_t fingerprint;   /* of the folder when the load failed */
    int loading_now;        /* a loader thread is loading it */
} version_record;

typedef struct served_model {
    char *name;
    char *base_path;           /* read only under load_mu (the loading thread) */
    pthread_mutex_t mu;
    kiln_model_config cfg;     /* policy and labels (name/base_path unused); under mu */
    kiln_servable **served;    /* the manager's references, highest version first */
    int n_served, cap_served;
    version_record *vr;        /* every version seen, any state */
    int n_vr, cap_vr;
    uint64_t loads_ok, loads_failed;
    int warned_empty;          /* "no versions" logged once */
    atomic_int refs;           /* the manager's list + each loader thread */
    int removed;               /* left the config; under mu */
} served_model;

#define MAX_LOADERS 4 /* loader threads at once */

struct kiln_manager {
    kiln_manager_options opts;
    pthread_rwlock_t list_lock;
    served_model **models;
    int n_models;
    int started;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
    int stopping;
    pthread_mutex_t load_mu;   /* one thread loads at a time: the polling thread, or a
                                  gRPC HandleReloadConfigRequest (kiln_manager_reload) */
    kiln_manager_listener_fn listener_fn[KILN_MANAGER_MAX_LISTENERS];
    void *listener_ctx[KILN_MANAGER_MAX_LISTENERS];
    atomic_int n_listeners;    /* published after the entry is written */
    int async_loads;           /* under load_mu: loads go to loader threads */
    int kick;                  /* under stop_mu: a loader finished, poll now */
    pthread_mutex_t loaders_mu;
    pthread_cond_t loaders_cv; /* n_loaders dropped */
    int n_loaders;             /* under loaders_mu */
};

kiln_status kiln_manager_add_listener(kiln_manager *m, kiln_manager_listener_fn fn, void *ctx)
{
    pthread_mutex_lock(&m->load_mu);
    int n = atomic_load(&m->n_listeners);
    if (n < KILN_MANAGER_MAX_LISTENERS) {
        m->listener_fn[n] = fn;
        m->listener_ctx[n] = ctx;
        atomic_store_explicit(&m->n_listeners, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&m->load_mu);
    return n < KILN_MANAGER_MAX_LISTENERS ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
}

void kiln_manager_clear_listeners(kiln_manager *m)
{
    pthread_mutex_lock(&m->load_mu);
    atomic_store(&m->n_listeners, 0);
    pthread_mutex_unlock(&m->load_mu);
}

/* Tell the listeners (load_mu held). */
static void notify(kiln_manager *m, const kiln_server_config *c)
{
    int n = atomic_load_explicit(&m->n_listeners, memory_order_acquire);
    for (int i = 0; i < n; i++) m->listener_fn[i](m->listener_ctx[i], c);
}

const char *kiln_serve_code_name(kiln_status st)
{
    switch (st) {
    case KILN_OK: return "OK";
    case KILN_ERR_DEADLINE: return "DEADLINE_EXCEEDED";
    case KILN_ERR_INVALID_ARGUMENT:
    case KILN_ERR_INVALID_MODEL: return "INVALID_ARGUMENT";
    case KILN_ERR_UNSUPPORTED: return "UNIMPLEMENTED";
    case KILN_ERR_NOT_FOUND: return "NOT_FOUND";
    case KILN_ERR_OUT_OF_MEMORY: return "RESOURCE_EXHAUSTED";
    case KILN_ERR_IO:
    case KILN_ERR_RUNTIME: return "UNKNOWN";
    default: return "INTERNAL";
    }
}

static const char *state_name(kiln_version_state s)
{
    switch (s) {
    case KILN_VERSION_START: return "START";
    case KILN_VERSION_LOADING: return "LOADING";
    case KILN_VERSION_AVAILABLE: return "AVAILABLE";
    case KILN_VERSION_UNLOADING: return "UNLOADING";
    case KILN_VERSION_END: return "END";
    }
    return "UNKNOWN";
}

/*
 * One line per lifecycle event on stderr, key=value style: ts, event, model
 * and version, then `kv` (more key=value pairs, already formatted, or NULL)
 * and detail as a JSON string (quoted, newlines escaped), so that a line is
 * always one event whatever the texts hold.
 */
static void log_line(const char *event, const char *model, int64_t version, const char *kv,
                     const char *detail)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    kiln_sbuf b = {0};
    kiln_sbuf_printf(&b, "kiln serve: ts=%lld.%03ld event=%s model=", (long long)ts.tv_sec,
                     ts.tv_nsec / 1000000, event);
    kiln_sbuf_json_string(&b, model, strlen(model));
    kiln_sbuf_printf(&b, " version=%" PRId64, version);
    if (kv && *kv) kiln_sbuf_printf(&b, " %s", kv);
    if (detail) {
        kiln_sbuf_puts(&b, " detail=");
        kiln_sbuf_json_string(&b, detail, strlen(detail));
    }
    kiln_sbuf_puts(&b, "\n");
    if (!b.oom && b.p) fwrite(b.p, 1, b.len, stderr);
    kiln_sbuf_free(&b);
}

static void log_event(const char *event, const char *model, int64_t version, const char *detail)
{
    log_line(event, model, version, NULL, detail);
}

kiln_status kiln_manager_create(const kiln_manager_options *opts, kiln_manager **out)
{
    kiln_manager *m = calloc(1, sizeof *m);
    if (!m) return KILN_ERR_OUT_OF_MEMORY;
    m->opts = *opts;
    pthread_rwlock_init(&m->list_lock, NULL);
    pthread_mutex_init(&m->stop_mu, NULL);
    pthread_mutex_init(&m->load_mu, NULL);
    pthread_cond_init(&m->stop_cv, NULL);
    pthread_mutex_init(&m->loaders_mu, NULL);
    pthread_cond_init(&m->loaders_cv, NULL);
    *out = m;
    return KILN_OK;
}

/* ------------------------------------------------------------ model configs */

static void policy_free(kiln_model_config *c)
{
    free(c->specific);
    for (int k = 0; k < c->n_labels; k++) free(c->label_names[k]);
    free(c->label_names);
    free(c->label_versions);
    memset(c, 0, sizeof *c);
}

/* Copy the policy and labels of src into dst (name, base_path, platform not copied). */
static kiln_status policy_copy(kiln_model_config *dst, const kiln_model_config *src)
{
    memset(dst, 0, sizeof *dst);
    dst->policy = src->policy;
    dst->num_versions = src->num_versions > 0 ? src->num_versions : 1;
    if (src->n_specific) {
        dst->specific = malloc((size_t)src->n_specific * sizeof *dst->specific);
        if (!dst->specific) goto err_free;
        memcpy(dst->specific, src->specific, (size_t)src->n_specific * sizeof *dst->specific);
        dst->n_specific = src->n_specific;
    }
    if (src->n_labels) {
        dst->label_names = calloc((size_t)src->n_labels, sizeof *dst->label_names);
        dst->label_versions = calloc((size_t)src->n_labels, sizeof *dst->label_versions);
        if (!dst->label_names || !dst->label_versions) goto err_free;
        for (int k = 0; k < src->n_labels; k++) {
            dst->label_names[k] = strdup(src->label_names[k]);
            if (!dst->label_names[k]) goto err_free;
            dst->label_versions[k] = src->label_versions[k];
            dst->n_labels = k + 1;
        }
    }
    return KILN_OK;
err_free:
    policy_free(dst);
    return KILN_ERR_OUT_OF_MEMORY;
}

static served_model *model_new(const kiln_model_config *c)
{
    served_model *sm = calloc(1, sizeof *sm);
    if (!sm) return NULL;
    sm->name = strdup(c->name);
    sm->base_path = strdup(c->base_path);
    if (!sm->name || !sm->base_path || policy_copy(&sm->cfg, c) != KILN_OK) {
        free(sm->name);
        free(sm->base_path);
        free(sm);
        return NULL;
    }
    pthread_mutex_init(&sm->mu, NULL);
    atomic_init(&sm->refs, 1);
    return sm;
}

/* Drop the manager's references and free the model (no longer listed and
 * no loader thread left on it). */
static void model_destroy(served_model *sm)
{
    for (int i = 0; i < sm->n_served; i++) kiln_servable_release(sm->served[i]);
    free(sm->served);
    for (int k = 0; k < sm->n_vr; k++) free(sm->vr[k].error_message);
    free(sm->vr);
    policy_free(&sm->cfg);
    free(sm->name);
    free(sm->base_path);
    pthread_mutex_destroy(&sm->mu);
    free(sm);
}

/* The model left the list: its loaders (if any) see removed and discard
 * what they load; the last reference frees it. */
static void model_free(served_model *sm)
{
    pthread_mutex_lock(&sm->mu);
    sm->removed = 1;
    pthread_mutex_unlock(&sm->mu);
    if (atomic_fetch_sub(&sm->refs, 1) == 1) model_destroy(sm);
}

/* Caller holds list_lock (either mode) or is the config thread. */
static served_model *find_model(kiln_manager *m, const char *name)
{
    for (int i = 0; i < m->n_models; i++)
        if (strcmp(m->models[i]->name, name) == 0) return m->models[i];
    return NULL;
}

static kiln_status list_append(kiln_manager *m, served_model *sm)
{
    pthread_rwlock_wrlock(&m->list_lock);
    served_model **ms = realloc(m->models, (size_t)(m->n_models + 1) * sizeof *ms);
    if (ms) {
        m->models = ms;
        ms[m->n_models++] = sm;
    }
    pthread_rwlock_unlock(&m->list_lock);
    return ms ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
}

kiln_status kiln_manager_add_model(kiln_manager *m, const char *name, const char *base_path)
{
    kiln_model_config c = {0};
    c.name = (char *)name;
    c.base_path = (char *)base_path;
    c.policy = KILN_POLICY_LATEST;
    c.num_versions = 1;
    served_model *sm = model_new(&c);
    if (!sm) return KILN_ERR_OUT_OF_MEMORY;
    kiln_status st = list_append(m, sm);
    if (st != KILN_OK) model_free(sm);
    return st;
}

static void poll_model(kiln_manager *m, served_model *sm);

kiln_status kiln_manager_apply_config(kiln_manager *m, const kiln_server_config *c)
{
    /* models no longer listed: unlist now, free once no request can find them */
    served_model **gone = calloc((size_t)m->n_models + 1, sizeof *gone);
    if (!gone) return KILN_ERR_OUT_OF_MEMORY;
    int n_gone = 0;
    pthread_rwlock_wrlock(&m->list_lock);
    for (int i = 0; i < m->n_models;) {
        int keep = 0;
        for (int k = 0; k < c->n_models; k++) keep |= strcmp(c->models[k].name, m->models[i]->name) == 0;
        if (keep) {
            i++;
            continue;
        }
        gone[n_gone++] = m->models[i];
        memmove(&m->models[i], &m->models[i + 1], (size_t)(m->n_models - i - 1) * sizeof *m->models);
        m->n_models--;
    }
    pthread_rwlock_unlock(&m->list_lock);
    for (int i = 0; i < n_gone; i++) {
        log_event("model_removed", gone[i]->name, -1, "no longer in the model config");
        for (int k = 0; k < gone[i]->n_served; k++)
            log_event("unload", gone[i]->name, gone[i]->served[k]->version,
                      "freed after in-flight requests finish");
        model_free(gone[i]);
    }
    free(gone);

    kiln_status st = KILN_OK;
    for (int k = 0; k < c->n_models; k++) {
        const kiln_model_config *mc = &c->models[k];
        served_model *sm = find_model(m, mc->name);
        if (!sm) {
            sm = model_new(mc);
            if (!sm || list_append(m, sm) != KILN_OK) {
                if (sm) model_free(sm);
                st = KILN_ERR_OUT_OF_MEMORY;
                continue;
            }
            log_event("model_added", sm->name, -1, sm->base_path);
            continue;
        }
        kiln_model_config fresh;
        if (policy_copy(&fresh, mc) != KILN_OK) {
            st = KILN_ERR_OUT_OF_MEMORY;
            continue;
        }
        if (strcmp(sm->base_path, mc->base_path) != 0) {
            char *bp = strdup(mc->base_path);
            if (bp) {
                free(sm->base_path); /* only this thread reads it */
                sm->base_path = bp;
                log_event("base_path_changed", sm->name, -1, bp);
            }
        }
        pthread_mutex_lock(&sm->mu);
        kiln_model_config old = sm->cfg;
        sm->cfg = fresh;
        pthread_mutex_unlock(&sm->mu);
        policy_free(&old);
    }
    if (m->started)
        for (int i = 0; i < m->n_models; i++) poll_model(m, m->models[i]);
    /* labels naming versions that are not served answer "not found" */
    for (int i = 0; i < m->n_models; i++) {
        served_model *sm = m->models[i];
        pthread_mutex_lock(&sm->mu);
        for (int l = 0; l < sm->cfg.n_labels; l++) {
            int ok = 0;
            for (int v = 0; v < sm->n_served; v++) ok |= sm->served[v]->version == sm->cfg.label_versions[l];
            if (!ok && m->started)
                log_event("label_unavailable", sm->name, sm->cfg.label_versions[l],
                          sm->cfg.label_names[l]);
        }
        pthread_mutex_unlock(&sm->mu);
    }
    if (m->started) notify(m, c);
    return st;
}

kiln_status kiln_manager_reload(kiln_manager *m, const kiln_server_config *c)
{
    pthread_mutex_lock(&m->load_mu);
    kiln_status st = kiln_manager_apply_config(m, c);
    pthread_mutex_unlock(&m->load_mu);
    return st;
}

int kiln_manager_has_model(kiln_manager *m, const char *name)
{
    pthread_rwlock_rdlock(&m->list_lock);
    int has = find_model(m, name) != NULL;
    pthread_rwlock_unlock(&m->list_lock);
    return has;
}

/* ------------------------------------------------------------ servables */

static void servable_free(kiln_servable *s)
{
    if (s->batchers)
        for (int i = 0; i < s->n_sessions; i++) kiln_batcher_free(s->batchers[i]);
    free(s->batchers);
    for (int i = 0; i < s->n_sessions; i++) kiln_session_free(s->sessions[i]);
    free(s->sessions);
    kiln_model_free(s->model);
    free(s->dir);
    free(s->load_log);
    free(s->optimization_log);
    kiln_version_info_free(s->version_info);
    free(s);
}

void kiln_servable_release(kiln_servable *s)
{
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) servable_free(s);
}

int kiln_servable_find_signature(const kiln_servable *s, const char *sig)
{
    const kiln_signature *want = kiln_model_find_signature(s->model, sig && *sig ? sig : NULL);
    if (!want) return -1;
    for (int i = 0; i < s->n_sessions; i++)
        if (kiln_model_signature(s->model, i) == want) return i;
    return -1;
}

kiln_status kiln_servable_run(kiln_servable *s, int si, kiln_tensor *const *in, int n,
                              int64_t deadline_ms, kiln_batch_result *out, char *err,
                              const char **code)
{
    return kiln_servable_run_cancel(s, si, in, n, deadline_ms, NULL, out, err, code);
}

kiln_status kiln_servable_run_cancel(kiln_servable *s, int si, kiln_tensor *const *in, int n,
                                     int64_t deadline_ms, const volatile int *cancel,
                                     kiln_batch_result *out, char *err, const char **code)
{
    memset(out, 0, sizeof *out);
    if (s->batchers && s->batchers[si])
        return kiln_batcher_run_cancel(s->batchers[si], in, n, deadline_ms, cancel, out, err, code);
    const kiln_signature *sig = kiln_model_signature(s->model, si);
    kiln_named_tensor *named = calloc(n > 0 ? (size_t)n : 1, sizeof *named);
    if (!named) {
        *code = "RESOURCE_EXHAUSTED";
        snprintf(err, KILN_JSON_ERR_LEN, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < n; i++) named[i] = (kiln_named_tensor){kiln_signature_input(sig, i)->name, in[i]};
    kiln_run_options ro = {deadline_ms, cancel};
    kiln_outputs *o = NULL;
    kiln_status st = kiln_session_run_opts(s->sessions[si], named, n, &ro, &o);
    free(named);
    if (st != KILN_OK) {
        *code = kiln_serve_code_name(st);
        snprintf(err, KILN_JSON_ERR_LEN, "%s",
                 st == KILN_ERR_DEADLINE ? KILN_DEADLINE_MESSAGE : kiln_last_error());
        return st;
    }
    /* sequence and optional outputs become tensors NAME/i (containers.h) */
    st = kiln_serve_take_outputs(o, out, err, KILN_JSON_ERR_LEN);
    kiln_outputs_free(o);
    if (st != KILN_OK) {
        *code = kiln_serve_code_name(st);
        return st;
    }
    *code = "OK";
    return KILN_OK;
}

/*
 * Replay the warmup requests through kiln_servable_run, each `iterations`
 * times, as TF Serving does before a version becomes available. A request
 * that does not fit the model, or fails, fails the load (err says which).
 */
static kiln_status warmup_replay(kiln_servable *s, const kiln_warmup *w, int iterations,
                                 char *err)
{
    char e[KILN_JSON_ERR_LEN];
    for (int r = 0; r < w->n; r++) {
        const kiln_warmup_request *q = &w->req[r];
        if (q->kind == KILN_WARMUP_SKIPPED) continue;
        const char *signame = q->signature && *q->signature ? q->signature : "serving_default";
        int si = kiln_servable_find_signature(s, q->signature);
        if (si < 0) {
            snprintf(err, KILN_JSON_ERR_LEN, "warmup record %d: signature '%.200s' not found", r,
                     signame);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        const kiln_signature *sig = kiln_model_signature(s->model, si);
        int n = kiln_signature_input_count(sig);
        kiln_tensor **in = calloc(n > 0 ? (size_t)n : 1, sizeof *in);
        if (!in) {
            snprintf(err, KILN_JSON_ERR_LEN, "out of memory");
            return KILN_ERR_OUT_OF_MEMORY;
        }
        kiln_status st = KILN_OK;
        if (q->kind == KILN_WARMUP_PREDICT) {
            /* inputs by alias, in the signature's order; none missing, none extra */
            for (int i = 0; i < n && st == KILN_OK; i++) {
                const char *name = kiln_signature_input(sig, i)->name;
                for (int k = 0; k < q->n_inputs; k++)
                    if (strcmp(q->names[k], name) == 0) in[i] = q->tensors[k];
                if (!in[i]) {
                    snprintf(err, KILN_JSON_ERR_LEN, "warmup record %d: input '%.100s' of signature "
                             "'%.100s' is missing", r, name, signame);
                    st = KILN_ERR_INVALID_ARGUMENT;
                }
            }
            if (st == KILN_OK && q->n_inputs != n) {
                snprintf(err, KILN_JSON_ERR_LEN, "warmup record %d: %d inputs given, signature "
                         "'%.200s' has %d", r, q->n_inputs, signame, n);
                st = KILN_ERR_INVALID_ARGUMENT;
            }
        } else if (n != 1 || kiln_signature_input(sig, 0)->dtype != KILN_DTYPE_STRING) {
            snprintf(err, KILN_JSON_ERR_LEN, "warmup record %d: %s request, but signature "
                     "'%.200s' does not take one string input (serialized tf.Example)", r,
                     q->kind == KILN_WARMUP_CLASSIFY ? "classify" : "regress", signame);
            st = KILN_ERR_INVALID_ARGUMENT;
        } else {
            in[0] = q->tensors[0];
        }
        for (int it = 0; it < iterations && st == KILN_OK; it++) {
            kiln_batch_result res;
            const char *code = "OK";
            st = kiln_servable_run(s, si, in, n, 0, &res, e, &code);
            if (st == KILN_OK) kiln_batch_result_free(&res);
            else snprintf(err, KILN_JSON_ERR_LEN, "warmup record %d (signature '%.100s'): %.300s",
                          r, signame, e);
        }
        free(in);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

static double ms_since(const struct timespec *a)
{
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a->tv_sec) * 1e3 + (double)(b.tv_nsec - a->tv_nsec) / 1e6;
}

/*
 * Load the version folder into a new servable (refs = 1): model, sessions,
 * batchers and precompiled batch sizes, then warmup. On failure err holds
 * the message. kv receives the load log's key=value pairs, opt the
 * optimization log of the default signature's session.
 */
static kiln_status servable_load(kiln_manager *m, const char *name, const char *dir,
                                 int64_t version, kiln_servable **out, char *err, kiln_sbuf *kv,
                                 char **opt)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kiln_warmup *w = NULL;
    kiln_servable *s = calloc(1, sizeof *s);
    if (!s) goto err_oom;
    s->version = version;
    snprintf(s->model_name, sizeof s->model_name, "%s", name);
    s->dir = strdup(dir);
    if (!s->dir) {
        free(s);
        goto err_oom;
    }
    kiln_load_options lo = {KILN_FORMAT_AUTO, m->opts.saved_model_tags, 0};
    if (m->opts.prefer_tflite) { /* TF Serving's --prefer_tflite_model */
        size_t n = strlen(dir) + sizeof "/model.tflite";
        char *tfl = malloc(n);
        struct stat tst;
        if (!tfl) {
            free(s->dir);
            free(s);
            goto err_oom;
        }
        snprintf(tfl, n, "%s/model.tflite", dir);
        if (stat(tfl, &tst) == 0) lo.format = KILN_FORMAT_TFLITE;
        free(tfl);
    }
    /* a blessing by kiln gate that matches the files now (gate/blessing.c),
     * and the version's traceability record (gate/version_info.c) */
    kiln_blessing bl;
    kiln_status st = KILN_OK;
    if (m->opts.require_blessing) {
        st = kiln_blessing_check(dir, &bl, err);
        if (st == KILN_OK) {
            memcpy(s->blessing, bl.digest, sizeof s->blessing);
            kiln_blessing_free(&bl);
        }
    }
    if (st == KILN_OK) st = kiln_version_info_read(dir, &s->version_info, err);
    /* a compiled artifact from the precompilation cache (compress.h), which
     * is not used where signatures or encryption guard the files */
    kiln_compress_state cst;
    kiln_compress_options co = {0, 0, 0.01, NULL};
    if (m->opts.compress) co = *m->opts.compress;
    const kiln_integrity_options *io = m->opts.integrity;
    kiln_sbuf ckv = {0}; /* appended after the format, below */
    if (co.allow_precompilation && io && (io->trusted_keys_file || io->decryption_key_file)) {
        co.allow_precompilation = 0;
        kiln_sbuf_puts(&ckv, " precompilation=off precompilation_reason=\"--trusted_keys or "
                           "--model_decryption_key_file guard this model\"");
    }
    char okey[512];
    snprintf(okey, sizeof okey, "tags=%.200s tflite=%d optimize=%d",
             m->opts.saved_model_tags ? m->opts.saved_model_tags : "serve",
             lo.format == KILN_FORMAT_TFLITE, m->opts.session.optimize);
    if (st == KILN_OK) kiln_compress_lookup(&co, dir, okey, &cst, &s->model, &ckv);
    else memset(&cst, 0, sizeof cst);
    snprintf(s->precision, sizeof s->precision, "fp32");
    /* signature check and decryption when configured (integrity.c) */
    if (st == KILN_OK && !cst.hit)
        st = kiln_integrity_load(m->opts.integrity, dir, &lo, &s->model, err);
    if (st != KILN_OK) {
        kiln_sbuf_free(&ckv);
        kiln_version_info_free(s->version_info);
        free(s->dir);
        free(s);
        return st;
    }
    snprintf(s->precision, sizeof s->precision, "%s", kiln_model_precision(s->model));
    int n = kiln_model_signature_count(s->model);
    s->sessions = calloc(n > 0 ? (size_t)n : 1, sizeof *s->sessions);
    if (!s->sessions) goto err_free_oom;
    for (int i = 0; i < n; i++) {
        const char *sig = kiln_signature_name(kiln_model_signature(s->model, i));
        st = kiln_session_create(s->model, sig, &m->opts.session, &s->sessions[i]);
        if (st != KILN_OK) {
            snprintf(err, KILN_JSON_ERR_LEN, "signature '%.100s': %.380s", sig, kiln_last_error());
            goto err_free;
        }
        s->n_sessions = i + 1;
    }
    if (co.allow_compression || co.allow_precompilation) {
        if (!cst.hit)
            kiln_compress_session(&co, dir, s->model, &m->opts.session, s->sessions, n, &cst, &ckv);
        if (strcmp(cst.precision, "fp32")) /* compressed here; else what the model holds */
            snprintf(s->precision, sizeof s->precision, "%s", cst.precision);
    }
    kiln_sbuf_printf(kv, "format=%s signatures=%d load_ms=%.1f", kiln_model_format(s->model), n,
                     ms_since(&t0));
    if (ckv.p && !ckv.oom) kiln_sbuf_puts(kv, ckv.p);
    kiln_sbuf_free(&ckv);
    if (s->blessing[0]) kiln_sbuf_printf(kv, " blessing=%s", s->blessing);
    if (s->version_info) {
        kiln_sbuf vj = {0};
        kiln_version_info_write_json(&vj, s->version_info);
        kiln_sbuf_puts(kv, " version_info=");
        if (!vj.oom && vj.p) kiln_sbuf_json_string(kv, vj.p, vj.len);
        kiln_sbuf_free(&vj);
    }
    if (m->opts.batching) {
        s->batchers = calloc(n > 0 ? (size_t)n : 1, sizeof *s->batchers);
        if (!s->batchers) goto err_free_oom;
        const kiln_batching_params *bp = m->opts.batching;
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        for (int i = 0; i < n; i++) {
            /* every allowed batch size compiled now, not on the first request */
            if (bp->n_allowed > 0) {
                st = kiln_session_precompile(s->sessions[i], bp->allowed_batch_sizes, bp->n_allowed);
                if (st != KILN_OK) {
                    snprintf(err, KILN_JSON_ERR_LEN, "precompiling allowed_batch_sizes: %.400s",
                             kiln_last_error());
                    goto err_free;
                }
            }
            /* a sequence's items have no batch dimension to split on: unbatched */
            int cout = kiln_serve_container_output(kiln_model_signature(s->model, i));
            if (cout >= 0) {
                kiln_sbuf_printf(kv, " batching_off=%s(sequence_output=%s)",
                                 kiln_signature_name(kiln_model_signature(s->model, i)),
                                 kiln_signature_output(kiln_model_signature(s->model, i), cout)->name);
                continue;
            }
            st = kiln_batcher_create(s->sessions[i], kiln_model_signature(s->model, i),
                                     m->opts.batching, m->opts.batch_stats, name, version,
                                     &s->batchers[i]);
            if (st != KILN_OK) {
                snprintf(err, KILN_JSON_ERR_LEN, "cannot start the batcher: %s",
                         kiln_status_name(st));
                goto err_free;
            }
        }
        if (bp->n_allowed > 0) {
            kiln_sbuf_puts(kv, " precompiled_batch_sizes=");
            for (int k = 0; k < bp->n_allowed; k++)
                kiln_sbuf_printf(kv, "%s%" PRId64, k ? "," : "", bp->allowed_batch_sizes[k]);
            kiln_sbuf_printf(kv, " precompile_ms=%.1f", ms_since(&t1));
        }
    }
    atomic_init(&s->refs, 1);

    if (!m->opts.enable_warmup) {
        kiln_sbuf_puts(kv, " warmup=disabled");
    } else {
        char werr[KILN_WARMUP_ERR_LEN];
        st = kiln_warmup_read(dir, &w, werr);
        if (st != KILN_OK) {
            snprintf(err, KILN_JSON_ERR_LEN, "Failed to read warmup data: %.440s", werr);
            goto err_free;
        }
        if (!w) {
            kiln_sbuf_puts(kv, " warmup=none");
        } else {
            struct timespec t2;
            clock_gettime(CLOCK_MONOTONIC, &t2);
            int iters = m->opts.warmup_iterations > 0 ? m->opts.warmup_iterations : 1;
            st = warmup_replay(s, w, iters, err);
            if (st != KILN_OK) goto err_free;
            s->warmup_records = w->n;
            s->warmup_us = ms_since(&t2) * 1e3;
            kiln_sbuf_printf(kv, " warmup_records=%d warmup_iterations=%d warmup_ms=%.1f", w->n,
                             iters, s->warmup_us / 1e3);
            kiln_warmup_free(w);
            w = NULL;
        }
    }
    int si = kiln_servable_find_signature(s, NULL);
    if (n > 0 && kiln_session_optimization_log(s->sessions[si >= 0 ? si : 0], opt) != KILN_OK)
        *opt = NULL;
    *out = s;
    return KILN_OK;
err_free_oom:
    snprintf(err, KILN_JSON_ERR_LEN, "out of memory");
    st = KILN_ERR_OUT_OF_MEMORY;
err_free:
    kiln_warmup_free(w);
    servable_free(s);
    return st;
err_oom:
    snprintf(err, KILN_JSON_ERR_LEN, "out of memory");
    return KILN_ERR_OUT_OF_MEMORY;
}

/* Caller holds sm->mu. */
static kiln_servable *pick(served_model *sm, int64_t version)
{
    if (sm->n_served == 0) return NULL;
    if (version < 0) return sm->served[0];
    for (int i = 0; i < sm->n_served; i++)
        if (sm->served[i]->version == version) return sm->served[i];
    return NULL;
}

/* Caller holds sm->mu. */
static int find_label(served_model *sm, const char *label, int64_t *version)
{
    for (int l = 0; l < sm->cfg.n_labels; l++)
        if (strcmp(sm->cfg.label_names[l], label) == 0) {
            *version = sm->cfg.label_versions[l];
            return 1;
        }
    return 0;
}

kiln_status kiln_manager_resolve_label(kiln_manager *m, const char *name, const char *label,
                                       int64_t *version, char *err)
{
    int found = 0;
    pthread_rwlock_rdlock(&m->list_lock);
    served_model *sm = find_model(m, name);
    if (sm) {
        pthread_mutex_lock(&sm->mu);
        found = find_label(sm, label, version);
        pthread_mutex_unlock(&sm->mu);
    }
    pthread_rwlock_unlock(&m->list_lock);
    if (found) return KILN_OK;
    snprintf(err, KILN_JSON_ERR_LEN, "Unrecognized servable version label: %.200s", label);
    return KILN_ERR_INVALID_ARGUMENT;
}

kiln_status kiln_manager_set_label(kiln_manager *m, const char *name, const char *label,
                                   int64_t version, char *err)
{
    kiln_status st = KILN_OK;
    pthread_rwlock_rdlock(&m->list_lock);
    served_model *sm = find_model(m, name);
    if (!sm) {
        snprintf(err, KILN_JSON_ERR_LEN, "no model named '%.200s'", name);
        pthread_rwlock_unlock(&m->list_lock);
        return KILN_ERR_NOT_FOUND;
    }
    pthread_mutex_lock(&sm->mu);
    int l = 0;
    while (l < sm->cfg.n_labels && strcmp(sm->cfg.label_names[l], label) != 0) l++;
    if (l == sm->cfg.n_labels) {
        char *nm = strdup(label);
        char **names = realloc(sm->cfg.label_names, (size_t)(l + 1) * sizeof *names);
        if (names) sm->cfg.label_names = names;
        int64_t *vers = names ? realloc(sm->cfg.label_versions, (size_t)(l + 1) * sizeof *vers) : NULL;
        if (vers) sm->cfg.label_versions = vers;
        if (!nm || !names || !vers) {
            free(nm);
            snprintf(err, KILN_JSON_ERR_LEN, "out of memory");
            st = KILN_ERR_OUT_OF_MEMORY;
        } else {
            sm->cfg.label_names[l] = nm;
            sm->cfg.n_labels = l + 1;
        }
    }
    if (st == KILN_OK) sm->cfg.label_versions[l] = version;
    pthread_mutex_unlock(&sm->mu);
    pthread_rwlock_unlock(&m->list_lock);
    if (st == KILN_OK) log_event("label_set", name, version, label);
    return st;
}

kiln_servable *kiln_manager_acquire(kiln_manager *m, const char *name, int64_t version,
                                    const char *label, char *err, const char **code)
{
    kiln_servable *s = NULL;
    int bad_label = 0;
    pthread_rwlock_rdlock(&m->list_lock);
    served_model *sm = find_model(m, name);
    if (label && *label) {
        bad_label = !sm;
        if (sm) {
            pthread_mutex_lock(&sm->mu);
            bad_label = !find_label(sm, label, &version);
            pthread_mutex_unlock(&sm->mu);
        }
    }
    if (sm && !bad_label) {
        pthread_mutex_lock(&sm->mu);
        s = pick(sm, version);
        if (s) atomic_fetch_add(&s->refs, 1);
        pthread_mutex_unlock(&sm->mu);
    }
    pthread_rwlock_unlock(&m->list_lock);
    if (s) return s;
    if (code) *code = bad_label ? "INVALID_ARGUMENT" : "NOT_FOUND";
    if (bad_label)
        snprintf(err, KILN_JSON_ERR_LEN, "Unrecognized servable version label: %.200s", label);
    else if (version < 0)
        snprintf(err, KILN_JSON_ERR_LEN, "Servable not found for request: Latest(%.200s)", name);
    else
        snprintf(err, KILN_JSON_ERR_LEN,
                 "Servable not found for request: Specific(%.200s, %" PRId64 ")", name, version);
    return NULL;
}

int kiln_manager_ready(kiln_manager *m)
{
    int ready = 1;
    pthread_rwlock_rdlock(&m->list_lock);
    for (int i = 0; i < m->n_models; i++) {
        pthread_mutex_lock(&m->models[i]->mu);
        if (m->models[i]->n_served == 0) ready = 0;
        pthread_mutex_unlock(&m->models[i]->mu);
    }
    pthread_rwlock_unlock(&m->list_lock);
    return ready;
}

/* --------------------------------------------------------------- polling */

static version_record *find_record(served_model *sm, int64_t v)
{
    for (int i = 0; i < sm->n_vr; i++)
        if (sm->vr[i].version == v) return &sm->vr[i];
    return NULL;
}

/* The record for v, created (state START) if new. Caller holds sm->mu. */
static version_record *get_record(served_model *sm, int64_t v)
{
    version_record *r = find_record(sm, v);
    if (r) return r;
    if (sm->n_vr == sm->cap_vr) {
        int cap = sm->cap_vr ? sm->cap_vr * 2 : 8;
        version_record *n = realloc(sm->vr, (size_t)cap * sizeof *n);
        if (!n) return NULL;
        sm->vr = n;
        sm->cap_vr = cap;
    }
    r = &sm->vr[sm->n_vr++];
    memset(r, 0, sizeof *r);
    r->version = v;
    r->state = KILN_VERSION_START;
    r->error_code = "OK";
    return r;
}

static void set_record(served_model *sm, int64_t v, kiln_version_state state, const char *code,
                       const char *msg, uint64_t fp)
{
    version_record *r = get_record(sm, v);
    if (!r) return;
    r->state = state;
    r->error_code = code;
    free(r->error_message);
    r->error_message = msg ? strdup(msg) : NULL;
    r->fingerprint = fp;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* A hash of names, sizes and mtimes in the folder and its subfolders (two
 * levels), so that a copy still in progress shows up as a change. */
static uint64_t folder_fingerprint(const char *dir, int depth)
{
    uint64_t h = 1469598103934665603ull;
    DIR *d = opendir(dir);
    if (!d) return h;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0) continue;
        uint64_t x = fnv(1469598103934665603ull, e->d_name, strlen(e->d_name));
        int64_t facts[3] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec,
                            (int64_t)st.st_mtim.tv_nsec};
        x = fnv(x, facts, sizeof facts);
        if (S_ISDIR(st.st_mode) && depth > 0) x ^= folder_fingerprint(path, depth - 1);
        h += x; /* order-independent */
    }
    closedir(d);
    return h;
}

static int parse_version(const char *s, int64_t *out)
{
    if (!*s) return 0;
    int64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return 0;
        if (v > (INT64_MAX - 9) / 10) return 0;
        v = v * 10 + (*p - '0');
    }
    *out = v;
    return 1;
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Numeric subfolders of base, highest first; *n_out entries (malloc'd). */
static int64_t *list_versions(const char *base, int *n_out)
{
    *n_out = 0;
    DIR *d = opendir(base);
    if (!d) return NULL;
    int64_t *v = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        int64_t ver;
        if (!parse_version(e->d_name, &ver)) continue;
        snprintf(path, sizeof path, "%s/%s", base, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        int dup = 0;
        for (int i = 0; i < n; i++) dup |= v[i] == ver;
        if (dup) continue; /* "1" and "01": TF Serving ignores duplicates */
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            int64_t *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) break;
            v = nv;
        }
        v[n++] = ver;
    }
    closedir(d);
    if (n) qsort(v, (size_t)n, sizeof *v, cmp_desc);
    *n_out = n;
    return v;
}

/* Folder of version v ("base/v" as it appears on disk, e.g. "0003"). */
static void version_dir(const char *base, int64_t v, char *out, size_t cap)
{
    DIR *d = opendir(base);
    snprintf(out, cap, "%s/%" PRId64, base, v);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t ver;
        if (parse_version(e->d_name, &ver) && ver == v) {
            snprintf(out, cap, "%s/%s", base, e->d_name);
            break;
        }
    }
    closedir(d);
}

/* Insert s into sm->served, highest version first. Caller holds sm->mu. */
static int served_insert(served_model *sm, kiln_servable *s)
{
    if (sm->n_served == sm->cap_served) {
        int cap = sm->cap_served ? sm->cap_served * 2 : 4;
        kiln_servable **n = realloc(sm->served, (size_t)cap * sizeof *n);
        if (!n) return 0;
        sm->served = n;
        sm->cap_served = cap;
    }
    int i = 0;
    while (i < sm->n_served && sm->served[i]->version > s->version) i++;
    memmove(&sm->served[i + 1], &sm->served[i], (size_t)(sm->n_served - i) * sizeof *sm->served);
    sm->served[i] = s;
    sm->n_served++;
    return 1;
}

static int is_served(served_model *sm, int64_t v)
{
    pthread_mutex_lock(&sm->mu);
    int yes = 0;
    for (int i = 0; i < sm->n_served; i++) yes |= sm->served[i]->version == v;
    pthread_mutex_unlock(&sm->mu);
    return yes;
}

/* Load version v from dir (its record says LOADING) and serve it, or record
 * why not; 1 when v is served afterwards. Runs on the polling thread or on
 * a loader thread, with no lock held; a model removed meanwhile gets nothing. */
static int load_version(kiln_manager *m, served_model *sm, int64_t v, const char *dir,
                        uint64_t fp)
{
    log_event("load_start", sm->name, v, NULL);
    kiln_servable *s = NULL;
    char buf[KILN_JSON_ERR_LEN];
    kiln_sbuf kv = {0};
    char *opt = NULL;
    kiln_status st = servable_load(m, sm->name, dir, v, &s, buf, &kv, &opt);
    if (st != KILN_OK) {
        /* the folder may have changed while loading: fingerprint after */
        uint64_t fp_after = folder_fingerprint(dir, 2);
        pthread_mutex_lock(&sm->mu);
        set_record(sm, v, KILN_VERSION_END, kiln_serve_code_name(st), buf, fp_after);
        sm->loads_failed++;
        pthread_mutex_unlock(&sm->mu);
        char code[64];
        snprintf(code, sizeof code, "status=%s", kiln_serve_code_name(st));
        log_line("load_failed", sm->name, v, code, buf);
        kiln_sbuf_free(&kv);
        free(opt);
        return 0;
    }
    /* kept for the console; set before the servable is shared */
    s->load_log = !kv.oom && kv.p ? strdup(kv.p) : NULL;
    s->optimization_log = opt;
    pthread_mutex_lock(&sm->mu);
    int removed = sm->removed;
    int ok = !removed && served_insert(sm, s);
    if (ok) {
        set_record(sm, v, KILN_VERSION_AVAILABLE, "OK", NULL, 0);
        sm->loads_ok++;
    } else if (!removed) {
        set_record(sm, v, KILN_VERSION_END, "RESOURCE_EXHAUSTED", "out of memory", fp);
    }
    pthread_mutex_unlock(&sm->mu);
    if (!ok) {
        if (removed) log_event("unload", sm->name, v, "loaded after its model left the config");
        kiln_servable_release(s);
        kiln_sbuf_free(&kv);
        return 0;
    }
    /* one line: what was loaded, how long it took, and the optimization log */
    kiln_sbuf_puts(&kv, " state=AVAILABLE optimization_log=");
    const char *ol = opt ? opt : "(none)";
    kiln_sbuf_json_string(&kv, ol, strlen(ol));
    log_line("load", sm->name, v, kv.oom ? "state=AVAILABLE" : kv.p, NULL);
    kiln_sbuf_free(&kv);
    return 1;
}

typedef struct loader_job {
    kiln_manager *m;
    served_model *sm; /* a reference, dropped when done */
    int64_t v;
    uint64_t fp;
    char dir[4096];
} loader_job;

static void *loader_main(void *arg)
{
    loader_job *j = arg;
    served_model *sm = j->sm;
    load_version(j->m, sm, j->v, j->dir, j->fp);
    pthread_mutex_lock(&sm->mu);
    version_record *r = find_record(sm, j->v);
    if (r) r->loading_now = 0;
    pthread_mutex_unlock(&sm->mu);
    if (atomic_fetch_sub(&sm->refs, 1) == 1) model_destroy(sm);
    kiln_manager *m = j->m;
    free(j);
    /* the polling thread retires what this version replaces now, not a poll later */
    pthread_mutex_lock(&m->stop_mu);
    m->kick = 1;
    pthread_cond_broadcast(&m->stop_cv);
    pthread_mutex_unlock(&m->stop_mu);
    pthread_mutex_lock(&m->loaders_mu); /* last: kiln_manager_free waits for this */
    m->n_loaders--;
    pthread_cond_broadcast(&m->loaders_cv);
    pthread_mutex_unlock(&m->loaders_mu);
    return NULL;
}

/* Hand the load of v to a loader thread; 0 when none can start now (too many
 * running, or no thread), and the next poll tries again. */
static int start_loader(kiln_manager *m, served_model *sm, int64_t v, const char *dir,
                        uint64_t fp)
{
    loader_job *j = calloc(1, sizeof *j);
    if (!j) return 0;
    j->m = m;
    j->sm = sm;
    j->v = v;
    j->fp = fp;
    snprintf(j->dir, sizeof j->dir, "%s", dir);
    pthread_mutex_lock(&m->loaders_mu);
    int room = m->n_loaders < MAX_LOADERS;
    if (room) m->n_loaders++;
    pthread_mutex_unlock(&m->loaders_mu);
    if (!room) {
        free(j);
        return 0;
    }
    atomic_fetch_add(&sm->refs, 1);
    pthread_mutex_lock(&sm->mu);
    version_record *r = find_record(sm, v);
    if (r) r->loading_now = 1;
    pthread_mutex_unlock(&sm->mu);
    pthread_attr_t at;
    pthread_t t;
    int started = pthread_attr_init(&at) == 0;
    if (started) {
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        started = pthread_create(&t, &at, loader_main, j) == 0;
        pthread_attr_destroy(&at);
    }
    if (started) return 1;
    pthread_mutex_lock(&sm->mu);
    if (r) r->loading_now = 0;
    pthread_mutex_unlock(&sm->mu);
    atomic_fetch_sub(&sm->refs, 1); /* the list still holds one */
    pthread_mutex_lock(&m->loaders_mu);
    m->n_loaders--;
    pthread_mutex_unlock(&m->loaders_mu);
    free(j);
    return 0;
}

/* Load version v if it is not served, not loading and not a failure that
 * has not changed since: here, or on a loader thread when the polling thread
 * asks. 1 when v is served afterwards. */
static int ensure_loaded(kiln_manager *m, served_model *sm, int64_t v)
{
    if (is_served(sm, v)) return 1;
    char dir[4096];
    version_dir(sm->base_path, v, dir, sizeof dir);
    uint64_t fp = folder_fingerprint(dir, 2);
    pthread_mutex_lock(&sm->mu);
    version_record *r = find_record(sm, v);
    int busy = r && r->loading_now;
    int skip = busy || (r && r->state == KILN_VERSION_END && strcmp(r->error_code, "OK") != 0 &&
                        r->fingerprint == fp);
    if (!skip) set_record(sm, v, KILN_VERSION_LOADING, "OK", NULL, 0);
    pthread_mutex_unlock(&sm->mu);
    if (skip) return 0; /* loading, or failed before and unchanged since */
    if (m->async_loads) {
        start_loader(m, sm, v, dir, fp);
        return 0;
    }
    return load_version(m, sm, v, dir, fp);
}

/*
 * One poll of one model: work out the versions the policy wants, load the
 * missing ones (highest first), then drop served versions no longer wanted.
 * latest{n} walks down from the highest version on disk until n versions
 * are served, so a version that fails leaves the next lower one serving.
 */
static void poll_model(kiln_manager *m, served_model *sm)
{
    int n;
    int64_t *versions = list_versions(sm->base_path, &n);
    pthread_mutex_lock(&sm->mu);
    kiln_version_policy policy = sm->cfg.policy;
    int want = sm->cfg.num_versions > 0 ? sm->cfg.num_versions : 1;
    int n_spec = sm->cfg.n_specific;
    int64_t *spec = n_spec ? malloc((size_t)n_spec * sizeof *spec) : NULL;
    if (spec) memcpy(spec, sm->cfg.specific, (size_t)n_spec * sizeof *spec);
    pthread_mutex_unlock(&sm->mu);
    if (n_spec && !spec) goto out;

    int64_t *kept = malloc(((size_t)n + 1) * sizeof *kept);
    if (!kept) goto out;
    int n_kept = 0;
    for (int i = 0; i < n; i++) {
        int64_t v = versions[i];
        if (policy == KILN_POLICY_LATEST && n_kept == want) break;
        if (policy == KILN_POLICY_SPECIFIC) {
            int listed = 0;
            for (int k = 0; k < n_spec; k++) listed |= spec[k] == v;
            if (!listed) continue;
        }
        if (ensure_loaded(m, sm, v)) kept[n_kept++] = v;
    }

    /* drop what the policy no longer wants, but never the last version */
    kiln_servable *drop[64];
    int n_drop = 0;
    if (n_kept > 0) {
        pthread_mutex_lock(&sm->mu);
        for (int i = 0; i < sm->n_served && n_drop < 64;) {
            int keep = 0;
            for (int k = 0; k < n_kept; k++) keep |= kept[k] == sm->served[i]->version;
            if (keep) {
                i++;
                continue;
            }
            drop[n_drop++] = sm->served[i];
            set_record(sm, sm->served[i]->version, KILN_VERSION_END, "OK", NULL, 0);
            memmove(&sm->served[i], &sm->served[i + 1],
                    (size_t)(sm->n_served - i - 1) * sizeof *sm->served);
            sm->n_served--;
        }
        pthread_mutex_unlock(&sm->mu);
    }
    for (int i = 0; i < n_drop; i++) {
        log_event("unload", sm->name, drop[i]->version, "freed after in-flight requests finish");
        kiln_servable_release(drop[i]);
    }
    free(kept);
    if (n == 0 && !sm->warned_empty) log_event("no_versions", sm->name, -1, sm->base_path);
    sm->warned_empty = n == 0;
out:
    free(spec);
    free(versions);
}

/* Re-read the config file and apply it; on error keep the old config. */
static void reload_config(kiln_manager *m)
{
    kiln_server_config *c;
    char err[KILN_CONFIG_ERR_LEN];
    if (kiln_server_config_load(m->opts.config_file, &c, err) != KILN_OK) {
        log_event("config_error", "-", -1, err);
        return;
    }
    kiln_manager_apply_config(m, c);
    kiln_server_config_free(c);
}

static void add_seconds(struct timespec *t, int s)
{
    clock_gettime(CLOCK_REALTIME, t);
    t->tv_sec += s;
}

static int before(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

static void *poll_thread(void *arg)
{
    kiln_manager *m = arg;
    int fs = m->opts.poll_seconds > 0;
    int cfg = m->opts.config_file && m->opts.config_poll_seconds > 0;
    struct timespec next_fs, next_cfg, now;
    add_seconds(&next_fs, fs ? m->opts.poll_seconds : 1 << 30);
    add_seconds(&next_cfg, cfg ? m->opts.config_poll_seconds : 1 << 30);
    for (;;) {
        pthread_mutex_lock(&m->stop_mu);
        const struct timespec *until = before(&next_cfg, &next_fs) ? &next_cfg : &next_fs;
        while (!m->stopping && !m->kick) {
            if (pthread_cond_timedwait(&m->stop_cv, &m->stop_mu, until) == ETIMEDOUT) break;
        }
        int stop = m->stopping, kick = m->kick;
        m->kick = 0;
        pthread_mutex_unlock(&m->stop_mu);
        if (stop) break;
        clock_gettime(CLOCK_REALTIME, &now);
        if (cfg && !before(&now, &next_cfg)) {
            pthread_mutex_lock(&m->load_mu);
            m->async_loads = 1;
            reload_config(m); /* polls every model too */
            m->async_loads = 0;
            pthread_mutex_unlock(&m->load_mu);
            add_seconds(&next_cfg, m->opts.config_poll_seconds);
            if (fs) add_seconds(&next_fs, m->opts.poll_seconds);
            continue;
        }
        if (kick || (fs && !before(&now, &next_fs))) {
            pthread_mutex_lock(&m->load_mu);
            m->async_loads = 1;
            for (int i = 0; i < m->n_models; i++) poll_model(m, m->models[i]);
            m->async_loads = 0;
            notify(m, NULL);
            pthread_mutex_unlock(&m->load_mu);
            if (!kick) add_seconds(&next_fs, m->opts.poll_seconds);
        }
    }
    return NULL;
}

kiln_status kiln_manager_start(kiln_manager *m)
{
    if (m->opts.poll_seconds >= 0 || m->opts.config_file)
        for (int i = 0; i < m->n_models; i++) poll_model(m, m->models[i]);
    m->started = 1;
    if (m->opts.poll_seconds > 0 || (m->opts.config_file && m->opts.config_poll_seconds > 0)) {
        if (pthread_create(&m->thread, NULL, poll_thread, m) != 0) return KILN_ERR_INTERNAL;
        m->thread_started = 1;
    }
    return KILN_OK;
}

void kiln_manager_free(kiln_manager *m)
{
    if (!m) return;
    if (m->thread_started) {
        pthread_mutex_lock(&m->stop_mu);
        m->stopping = 1;
        pthread_cond_broadcast(&m->stop_cv);
        pthread_mutex_unlock(&m->stop_mu);
        pthread_join(m->thread, NULL);
    }
    /* a loader still running finishes its version first */
    pthread_mutex_lock(&m->loaders_mu);
    while (m->n_loaders > 0) pthread_cond_wait(&m->loaders_cv, &m->loaders_mu);
    pthread_mutex_unlock(&m->loaders_mu);
    for (int i = 0; i < m->n_models; i++) model_free(m->models[i]);
    free(m->models);
    pthread_rwlock_destroy(&m->list_lock);
    pthread_mutex_destroy(&m->stop_mu);
    pthread_mutex_destroy(&m->load_mu);
    pthread_cond_destroy(&m->stop_cv);
    pthread_mutex_destroy(&m->loaders_mu);
    pthread_cond_destroy(&m->loaders_cv);
    free(m);
}

/* ---------------------------------------------------------------- status */

static int cmp_record_desc(const void *a, const void *b)
{
    return cmp_desc(&((const version_record *)a)->version, &((const version_record *)b)->version);
}

kiln_status kiln_manager_status_each(kiln_manager *m, const char *name, int64_t version,
                                     kiln_version_visit fn, void *ctx, char *err)
{
    pthread_rwlock_rdlock(&m->list_lock);
    served_model *sm = find_model(m, name);
    if (!sm) {
        pthread_rwlock_unlock(&m->list_lock);
        snprintf(err, KILN_JSON_ERR_LEN, "Could not find any versions of model %.200s", name);
        return KILN_ERR_NOT_FOUND;
    }
    pthread_mutex_lock(&sm->mu);
    qsort(sm->vr, (size_t)sm->n_vr, sizeof *sm->vr, cmp_record_desc);
    int shown = 0;
    for (int i = 0; i < sm->n_vr; i++) {
        version_record *r = &sm->vr[i];
        if (version >= 0 && r->version != version) continue;
        fn(ctx, shown++, r->version, r->state, r->error_code,
           r->error_message ? r->error_message : "");
    }
    pthread_mutex_unlock(&sm->mu);
    pthread_rwlock_unlock(&m->list_lock);
    if (shown == 0) {
        if (version >= 0)
            snprintf(err, KILN_JSON_ERR_LEN,
                     "Could not find version %" PRId64 " of model %.200s", version, name);
        else
            snprintf(err, KILN_JSON_ERR_LEN, "Could not find any versions of model %.200s", name);
        return KILN_ERR_NOT_FOUND;
    }
    return KILN_OK;
}

/* One version's entry of the status JSON. */
static void write_status_entry(void *ctx, int i, int64_t version, kiln_version_state state,
                               const char *error_code, const char *error_message)
{
    kiln_sbuf *b = ctx;
    kiln_sbuf_puts(b, i ? ",\n  {\n" : "\n  {\n");
    kiln_sbuf_printf(b, "   \"version\": \"%" PRId64 "\",\n   \"state\": \"%s\",\n", version,
                     state_name(state));
    kiln_sbuf_printf(b, "   \"status\": {\n    \"error_code\": \"%s\",\n    \"error_message\": ",
                     error_code);
    kiln_sbuf_json_string(b, error_message, strlen(error_message));
    kiln_sbuf_puts(b, "\n   }\n  }");
}

kiln_status kiln_manager_write_status(kiln_manager *m, const char *name, int64_t version,
                                      kiln_sbuf *b, char *err)
{
    size_t start = b->len;
    kiln_sbuf_puts(b, "{\n \"model_version_status\": [");
    kiln_status st = kiln_manager_status_each(m, name, version, write_status_entry, b, err);
    if (st != KILN_OK) {
        b->len = start;
        return st;
    }
    kiln_sbuf_puts(b, "\n ]\n}\n");
    return KILN_OK;
}

void kiln_manager_write_list(kiln_manager *m, kiln_sbuf *b)
{
    kiln_sbuf_puts(b, "{\"models\": [");
    pthread_rwlock_rdlock(&m->list_lock);
    for (int i = 0; i < m->n_models; i++) {
        served_model *sm = m->models[i];
        pthread_mutex_lock(&sm->mu);
        kiln_sbuf_puts(b, i ? ", {\"name\": " : "{\"name\": ");
        kiln_sbuf_json_string(b, sm->name, strlen(sm->name));
        kiln_sbuf_printf(b, ", \"ready\": %s, \"versions\": [", sm->n_served ? "true" : "false");
        for (int k = 0; k < sm->n_vr; k++)
            kiln_sbuf_printf(b, "%s{\"version\": \"%" PRId64 "\", \"state\": \"%s\"}",
                             k ? ", " : "", sm->vr[k].version, state_name(sm->vr[k].state));
        kiln_sbuf_puts(b, "]}");
        pthread_mutex_unlock(&sm->mu);
    }
    pthread_rwlock_unlock(&m->list_lock);
    kiln_sbuf_puts(b, "]}\n");
}

/* Caller holds sm->mu. */
static const kiln_servable *served_version(served_model *sm, int64_t v)
{
    for (int i = 0; i < sm->n_served; i++)
        if (sm->served[i]->version == v) return sm->served[i];
    return NULL;
}

void kiln_manager_write_console(kiln_manager *m, kiln_sbuf *b)
{
    kiln_sbuf_puts(b, "[");
    pthread_rwlock_rdlock(&m->list_lock);
    for (int i = 0; i < m->n_models; i++) {
        served_model *sm = m->models[i];
        pthread_mutex_lock(&sm->mu);
        kiln_sbuf_puts(b, i ? ",\n {\"name\": " : "\n {\"name\": ");
        kiln_sbuf_json_string(b, sm->name, strlen(sm->name));
        kiln_sbuf_printf(b, ", \"ready\": %s, \"labels\": {", sm->n_served ? "true" : "false");
        for (int l = 0; l < sm->cfg.n_labels; l++) {
            kiln_sbuf_puts(b, l ? ", " : "");
            kiln_sbuf_json_string(b, sm->cfg.label_names[l], strlen(sm->cfg.label_names[l]));
            kiln_sbuf_printf(b, ": \"%" PRId64 "\"", sm->cfg.label_versions[l]);
        }
        kiln_sbuf_puts(b, "}, \"versions\": [");
        qsort(sm->vr, (size_t)sm->n_vr, sizeof *sm->vr, cmp_record_desc);
        for (int k = 0; k < sm->n_vr; k++) {
            const version_record *r = &sm->vr[k];
            const kiln_servable *sv = served_version(sm, r->version);
            const char *msg = r->error_message ? r->error_message : "";
            kiln_sbuf_printf(b, "%s{\"version\": \"%" PRId64 "\", \"state\": \"%s\", "
                                "\"served\": %s, \"error_code\": \"%s\", \"error_message\": ",
                             k ? ", " : "", r->version, state_name(r->state),
                             sv ? "true" : "false", r->error_code);
            kiln_sbuf_json_string(b, msg, strlen(msg));
            if (sv) {
                kiln_sbuf_printf(b, ", \"precision\": \"%s\", \"requests_in_flight\": %d, "
                                    "\"warmup_records\": %d, \"load_log\": ",
                                 sv->precision, atomic_load(&sv->refs) - 1, sv->warmup_records);
                const char *ll = sv->load_log ? sv->load_log : "";
                kiln_sbuf_json_string(b, ll, strlen(ll));
                kiln_sbuf_puts(b, ", \"optimization_log\": ");
                const char *ol = sv->optimization_log ? sv->optimization_log : "";
                kiln_sbuf_json_string(b, ol, strlen(ol));
                if (sv->version_info) { /* assets.extra/kiln_version.json */
                    kiln_sbuf_puts(b, ", \"version_info\": ");
                    kiln_version_info_write_json(b, sv->version_info);
                }
                if (sv->blessing[0]) kiln_sbuf_printf(b, ", \"blessing\": \"%s\"", sv->blessing);
            }
            kiln_sbuf_puts(b, "}");
        }
        kiln_sbuf_puts(b, "]}");
        pthread_mutex_unlock(&sm->mu);
    }
    pthread_rwlock_unlock(&m->list_lock);
    kiln_sbuf_puts(b, "\n]");
}

void kiln_manager_write_metrics(kiln_manager *m, kiln_sbuf *b)
{
    pthread_rwlock_rdlock(&m->list_lock);
    kiln_sbuf_puts(b, "# TYPE kiln_model_version_available gauge\n");
    for (int i = 0; i < m->n_models; i++) {
        served_model *sm = m->models[i];
        pthread_mutex_lock(&sm->mu);
        for (int k = 0; k < sm->n_served; k++)
            kiln_sbuf_printf(b, "kiln_model_version_available{model_name=\"%s\",version=\"%" PRId64
                                "\"} 1\n",
                             sm->name, sm->served[k]->version);
        pthread_mutex_unlock(&sm->mu);
    }
    kiln_sbuf_puts(b, "# TYPE kiln_model_load_count counter\n");
    for (int i = 0; i < m->n_models; i++) {
        served_model *sm = m->models[i];
        pthread_mutex_lock(&sm->mu);
        kiln_sbuf_printf(b, "kiln_model_load_count{model_name=\"%s\",status=\"OK\"} %" PRIu64 "\n",
                         sm->name, sm->loads_ok);
        kiln_sbuf_printf(b, "kiln_model_load_count{model_name=\"%s\",status=\"FAILED\"} %" PRIu64
                            "\n",
                         sm->name, sm->loads_failed);
        pthread_mutex_unlock(&sm->mu);
    }
    /* requests holding each served version (the manager's own reference aside) */
    kiln_sbuf_puts(b, "# TYPE kiln_model_version_requests_in_flight gauge\n");
    for (int i = 0; i < m->n_models; i++) {
        served_model *sm = m->models[i];
        pthread_mutex_lock(&sm->mu);
        for (int k = 0; k < sm->n_served; k++)
            kiln_sbuf_printf(b, "kiln_model_version_requests_in_flight{model_name=\"%s\",version=\"%"
                                PRId64 "\"} %d\n",
                             sm->name, sm->served[k]->version,
                             atomic_load(&sm->served[k]->refs) - 1);
        pthread_mutex_unlock(&sm->mu);
    }
    /* each served version's precision (--allow_compression) */
    kiln_sbuf_puts(b, "# TYPE kiln_model_precision gauge\n");
    for (int i = 0; i < m->n_models; i++) {
        served_model *sm = m->models[i];
        pthread_mutex_lock(&sm->mu);
        for (int k = 0; k < sm->n_served; k++)
            kiln_sbuf_printf(b, "kiln_model_precision{model_name=\"%s\",version=\"%" PRId64
                                "\",precision=\"%s\"} 1\n",
                             sm->name, sm->served[k]->version, sm->served[k]->precision);
        pthread_mutex_unlock(&sm->mu);
    }
    /* TF Serving's warmup counter, for the served versions */
    kiln_sbuf_puts(b, "# TYPE :tensorflow:serving:model_warmup_records_read counter\n");
    for (int i = 0; i < m->n_models; i++) {
        served_model *sm = m->models[i];
        pthread_mutex_lock(&sm->mu);
        for (int k = 0; k < sm->n_served; k++) {
            const kiln_servable *sv = sm->served[k];
            if (sv->warmup_records == 0) continue;
            kiln_sbuf_puts(b, ":tensorflow:serving:model_warmup_records_read{model_path=");
            kiln_sbuf_json_string(b, sv->dir, strlen(sv->dir));
            kiln_sbuf_printf(b, ",status=\"OK\"} %d\n", sv->warmup_records);
        }
        pthread_mutex_unlock(&sm->mu);
    }
    pthread_rwlock_unlock(&m->list_lock);
}
