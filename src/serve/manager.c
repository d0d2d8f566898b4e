/*
 * manager.c - version discovery, background loading, atomic swaps and
 * reference-counted unloading (see manager.h).
 *
 * Locking: each model has one mutex guarding its current servable pointer
 * and its version-status list. Loading runs with no lock held, so requests
 * keep flowing on the old version while a new one imports; the swap is a
 * pointer exchange under the lock. Only the polling thread (or start) ever
 * loads, so two loads of one model never overlap.
 */
#include "serve/manager.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
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
} version_record;

typedef struct served_model {
    char *name;
    char *base_path;
    pthread_mutex_t mu;
    kiln_servable *current; /* the served version (the manager's reference); NULL if none */
    version_record *vr;     /* every version seen, any state */
    int n_vr, cap_vr;
    uint64_t loads_ok, loads_failed;
} served_model;

struct kiln_manager {
    kiln_manager_options opts;
    served_model *models;
    int n_models;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
    int stopping;
};

static const char *status_code_name(kiln_status st)
{
    switch (st) {
    case KILN_OK: return "OK";
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

/* One line per lifecycle event on stderr, key=value style. */
static void log_event(const char *event, const char *model, int64_t version, const char *detail)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    fprintf(stderr, "kiln serve: ts=%lld.%03ld event=%s model=%s version=%" PRId64 "%s%s\n",
            (long long)ts.tv_sec, ts.tv_nsec / 1000000, event, model, version,
            detail ? " detail=" : "", detail ? detail : "");
}

kiln_status kiln_manager_create(const kiln_manager_options *opts, kiln_manager **out)
{
    kiln_manager *m = calloc(1, sizeof *m);
    if (!m) return KILN_ERR_OUT_OF_MEMORY;
    m->opts = *opts;
    pthread_mutex_init(&m->stop_mu, NULL);
    pthread_cond_init(&m->stop_cv, NULL);
    *out = m;
    return KILN_OK;
}

kiln_status kiln_manager_add_model(kiln_manager *m, const char *name, const char *base_path)
{
    served_model *ms = realloc(m->models, (size_t)(m->n_models + 1) * sizeof *ms);
    if (!ms) return KILN_ERR_OUT_OF_MEMORY;
    m->models = ms;
    served_model *sm = &ms[m->n_models];
    memset(sm, 0, sizeof *sm);
    sm->name = strdup(name);
    sm->base_path = strdup(base_path);
    if (!sm->name || !sm->base_path) {
        free(sm->name);
        free(sm->base_path);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    pthread_mutex_init(&sm->mu, NULL);
    m->n_models++;
    return KILN_OK;
}

static served_model *find_model(kiln_manager *m, const char *name)
{
    for (int i = 0; i < m->n_models; i++)
        if (strcmp(m->models[i].name, name) == 0) return &m->models[i];
    return NULL;
}

int kiln_manager_has_model(kiln_manager *m, const char *name) { return find_model(m, name) != NULL; }

/* ------------------------------------------------------------ servables */

static void servable_free(kiln_servable *s)
{
    for (int i = 0; i < s->n_sessions; i++) kiln_session_free(s->sessions[i]);
    free(s->sessions);
    kiln_model_free(s->model);
    free(s);
}

void kiln_servable_release(kiln_servable *s)
{
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) servable_free(s);
}

/* Load the version folder into a new servable (refs = 1). */
static kiln_status servable_load(kiln_manager *m, const char *dir, int64_t version,
                                 kiln_servable **out)
{
    kiln_servable *s = calloc(1, sizeof *s);
    if (!s) return KILN_ERR_OUT_OF_MEMORY;
    s->version = version;
    kiln_load_options lo = {KILN_FORMAT_AUTO, m->opts.saved_model_tags};
    kiln_status st = kiln_model_load(dir, &lo, &s->model);
    if (st != KILN_OK) {
        free(s);
        return st;
    }
    int n = kiln_model_signature_count(s->model);
    s->sessions = calloc(n > 0 ? (size_t)n : 1, sizeof *s->sessions);
    if (!s->sessions) {
        kiln_model_free(s->model);
        free(s);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < n; i++) {
        const char *sig = kiln_signature_name(kiln_model_signature(s->model, i));
        st = kiln_session_create(s->model, sig, &m->opts.session, &s->sessions[i]);
        if (st != KILN_OK) {
            s->n_sessions = i;
            servable_free(s);
            return st;
        }
        s->n_sessions = i + 1;
    }
    atomic_init(&s->refs, 1);
    *out = s;
    return KILN_OK;
}

kiln_servable *kiln_manager_acquire(kiln_manager *m, const char *name, int64_t version, char *err)
{
    served_model *sm = find_model(m, name);
    kiln_servable *s = NULL;
    if (sm) {
        pthread_mutex_lock(&sm->mu);
        s = sm->current;
        if (s && version >= 0 && s->version != version) s = NULL;
        if (s) atomic_fetch_add(&s->refs, 1);
        pthread_mutex_unlock(&sm->mu);
    }
    if (!s) {
        if (version < 0)
            snprintf(err, KILN_JSON_ERR_LEN, "Servable not found for request: Latest(%.200s)", name);
        else
            snprintf(err, KILN_JSON_ERR_LEN,
                     "Servable not found for request: Specific(%.200s, %" PRId64 ")", name, version);
    }
    return s;
}

int kiln_manager_ready(kiln_manager *m)
{
    int ready = 1;
    for (int i = 0; i < m->n_models; i++) {
        pthread_mutex_lock(&m->models[i].mu);
        if (!m->models[i].current) ready = 0;
        pthread_mutex_unlock(&m->models[i].mu);
    }
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

/* One poll of one model: load the highest version worth trying. */
static void poll_model(kiln_manager *m, served_model *sm)
{
    int n;
    int64_t *versions = list_versions(sm->base_path, &n);
    pthread_mutex_lock(&sm->mu);
    int64_t cur = sm->current ? sm->current->version : -1;
    pthread_mutex_unlock(&sm->mu);
    int cur_on_disk = 0;
    for (int i = 0; i < n; i++) cur_on_disk |= versions[i] == cur;

    for (int i = 0; i < n; i++) {
        int64_t v = versions[i];
        if (v == cur) break;
        if (cur >= 0 && v < cur && cur_on_disk) break; /* never downgrade while current exists */
        char dir[4096];
        version_dir(sm->base_path, v, dir, sizeof dir);
        uint64_t fp = folder_fingerprint(dir, 2);
        pthread_mutex_lock(&sm->mu);
        version_record *r = find_record(sm, v);
        int skip = r && r->state == KILN_VERSION_END && strcmp(r->error_code, "OK") != 0 &&
                   r->fingerprint == fp;
        if (!skip) set_record(sm, v, KILN_VERSION_LOADING, "OK", NULL, 0);
        pthread_mutex_unlock(&sm->mu);
        if (skip) continue; /* failed before, unchanged since */

        log_event("load_start", sm->name, v, NULL);
        kiln_servable *s = NULL;
        kiln_status st = servable_load(m, dir, v, &s);
        if (st != KILN_OK) {
            const char *msg = kiln_last_error();
            char buf[KILN_JSON_ERR_LEN];
            snprintf(buf, sizeof buf, "%s", msg && *msg ? msg : kiln_status_name(st));
            /* the folder may have changed while loading: fingerprint after */
            uint64_t fp_after = folder_fingerprint(dir, 2);
            pthread_mutex_lock(&sm->mu);
            set_record(sm, v, KILN_VERSION_END, status_code_name(st), buf, fp_after);
            sm->loads_failed++;
            pthread_mutex_unlock(&sm->mu);
            log_event("load_failed", sm->name, v, buf);
            continue; /* try the next lower version if nothing better is served */
        }
        pthread_mutex_lock(&sm->mu);
        kiln_servable *old = sm->current;
        sm->current = s;
        set_record(sm, v, KILN_VERSION_AVAILABLE, "OK", NULL, 0);
        if (old) set_record(sm, old->version, KILN_VERSION_END, "OK", NULL, 0);
        sm->loads_ok++;
        pthread_mutex_unlock(&sm->mu);
        log_event("available", sm->name, v, NULL);
        if (old) {
            log_event("unload", sm->name, old->version, "freed after in-flight requests finish");
            kiln_servable_release(old);
        }
        break;
    }
    if (n == 0) {
        static _Thread_local int warned;
        if (!warned) log_event("no_versions", sm->name, -1, sm->base_path);
        warned = 1;
    }
    free(versions);
}

static void *poll_thread(void *arg)
{
    kiln_manager *m = arg;
    for (;;) {
        pthread_mutex_lock(&m->stop_mu);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += m->opts.poll_seconds;
        while (!m->stopping) {
            if (pthread_cond_timedwait(&m->stop_cv, &m->stop_mu, &until) == ETIMEDOUT) break;
        }
        int stop = m->stopping;
        pthread_mutex_unlock(&m->stop_mu);
        if (stop) break;
        for (int i = 0; i < m->n_models; i++) poll_model(m, &m->models[i]);
    }
    return NULL;
}

kiln_status kiln_manager_start(kiln_manager *m)
{
    if (m->opts.poll_seconds >= 0)
        for (int i = 0; i < m->n_models; i++) poll_model(m, &m->models[i]);
    if (m->opts.poll_seconds > 0) {
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
    for (int i = 0; i < m->n_models; i++) {
        served_model *sm = &m->models[i];
        kiln_servable_release(sm->current);
        for (int k = 0; k < sm->n_vr; k++) free(sm->vr[k].error_message);
        free(sm->vr);
        free(sm->name);
        free(sm->base_path);
        pthread_mutex_destroy(&sm->mu);
    }
    free(m->models);
    pthread_mutex_destroy(&m->stop_mu);
    pthread_cond_destroy(&m->stop_cv);
    free(m);
}

/* ---------------------------------------------------------------- status */

static int cmp_record_desc(const void *a, const void *b)
{
    return cmp_desc(&((const version_record *)a)->version, &((const version_record *)b)->version);
}

kiln_status kiln_manager_write_status(kiln_manager *m, const char *name, int64_t version,
                                      kiln_sbuf *b, char *err)
{
    served_model *sm = find_model(m, name);
    if (!sm) {
        snprintf(err, KILN_JSON_ERR_LEN, "Could not find any versions of model %.200s", name);
        return KILN_ERR_NOT_FOUND;
    }
    pthread_mutex_lock(&sm->mu);
    qsort(sm->vr, (size_t)sm->n_vr, sizeof *sm->vr, cmp_record_desc);
    int shown = 0;
    kiln_sbuf_puts(b, "{\n \"model_version_status\": [");
    for (int i = 0; i < sm->n_vr; i++) {
        version_record *r = &sm->vr[i];
        if (version >= 0 && r->version != version) continue;
        kiln_sbuf_puts(b, shown ? ",\n  {\n" : "\n  {\n");
        kiln_sbuf_printf(b, "   \"version\": \"%" PRId64 "\",\n   \"state\": \"%s\",\n", r->version,
                         state_name(r->state));
        kiln_sbuf_printf(b, "   \"status\": {\n    \"error_code\": \"%s\",\n    \"error_message\": ",
                         r->error_code);
        const char *msg = r->error_message ? r->error_message : "";
        kiln_sbuf_json_string(b, msg, strlen(msg));
        kiln_sbuf_puts(b, "\n   }\n  }");
        shown++;
    }
    kiln_sbuf_puts(b, shown ? "\n ]\n}\n" : "]\n}\n");
    pthread_mutex_unlock(&sm->mu);
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

void kiln_manager_write_list(kiln_manager *m, kiln_sbuf *b)
{
    kiln_sbuf_puts(b, "{\"models\": [");
    for (int i = 0; i < m->n_models; i++) {
        served_model *sm = &m->models[i];
        pthread_mutex_lock(&sm->mu);
        kiln_sbuf_puts(b, i ? ", {\"name\": " : "{\"name\": ");
        kiln_sbuf_json_string(b, sm->name, strlen(sm->name));
        kiln_sbuf_printf(b, ", \"ready\": %s, \"versions\": [", sm->current ? "true" : "false");
        for (int k = 0; k < sm->n_vr; k++)
            kiln_sbuf_printf(b, "%s{\"version\": \"%" PRId64 "\", \"state\": \"%s\"}",
                             k ? ", " : "", sm->vr[k].version, state_name(sm->vr[k].state));
        kiln_sbuf_puts(b, "]}");
        pthread_mutex_unlock(&sm->mu);
    }
    kiln_sbuf_puts(b, "]}\n");
}

void kiln_manager_write_metrics(kiln_manager *m, kiln_sbuf *b)
{
    kiln_sbuf_puts(b, "# TYPE kiln_model_version_available gauge\n");
    for (int i = 0; i < m->n_models; i++) {
        served_model *sm = &m->models[i];
        pthread_mutex_lock(&sm->mu);
        if (sm->current)
            kiln_sbuf_printf(b, "kiln_model_version_available{model_name=\"%s\",version=\"%" PRId64
                                "\"} 1\n",
                             sm->name, sm->current->version);
        pthread_mutex_unlock(&sm->mu);
    }
    kiln_sbuf_puts(b, "# TYPE kiln_model_load_count counter\n");
    for (int i = 0; i < m->n_models; i++) {
        served_model *sm = &m->models[i];
        pthread_mutex_lock(&sm->mu);
        kiln_sbuf_printf(b, "kiln_model_load_count{model_name=\"%s\",status=\"OK\"} %" PRIu64 "\n",
                         sm->name, sm->loads_ok);
        kiln_sbuf_printf(b, "kiln_model_load_count{model_name=\"%s\",status=\"FAILED\"} %" PRIu64
                            "\n",
                         sm->name, sm->loads_failed);
        pthread_mutex_unlock(&sm->mu);
    }
}
