/*
 * rollout.c - the rollout controller of `kiln serve` (rollout.h): the
 * route table for traffic splits and canaries, the per-version counters
 * the gates read, the canary state machine run by a controller thread, its
 * persistence, metrics, structured events and admin endpoints.
 *
 * Request path: the route function and the `after` observer read the
 * current route table through an atomic pointer, guarded by a reader count
 * (a table is freed only once no reader can still see it), and count into
 * fixed per-version slots with atomic adds; a slot is claimed under a mutex
 * only the first time a (model, version) is seen. Everything else (config,
 * canary states) lives under r->mu, taken by the controller thread, the
 * admin endpoints and the metrics page.
 */
#include "serve/rollout/rollout.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "serve/rollout/gate.h"

#define ROLLOUT_SLOTS 64
#define ROLLOUT_MAX_STEPS 16

/* ------------------------------------------------------------ types */

typedef enum rstate { ST_NONE, ST_PROGRESSING, ST_PAUSED, ST_PROMOTED, ST_ROLLED_BACK, ST_N } rstate;
static const char *const state_names[ST_N] = {"none", "progressing", "paused", "promoted",
                                              "rolled_back"};
typedef enum revent { EV_ADVANCE, EV_PROMOTE, EV_ROLLBACK, EV_PAUSE, EV_RESUME, EV_HOLD, EV_N } revent;
static const char *const event_names[EV_N] = {"advance", "promote", "rollback",
                                              "pause",   "resume",  "hold"};

/* Counters of one served version of a managed model. */
typedef struct vslot {
    atomic_int ready;
    char model[128];
    int64_t version;
    atomic_uint_fast64_t ok, err;
    atomic_uint_fast64_t hist[KILN_GATE_LAT_BUCKETS];
} vslot;

typedef struct rentry {
    char model[128];
    int sticky;
    int n;
    int64_t version[KILN_ROLLOUT_MAX_TARGETS];
    uint64_t cum[KILN_ROLLOUT_MAX_TARGETS]; /* cumulative share of 2^32 */
    double weight[KILN_ROLLOUT_MAX_TARGETS];
} rentry;

typedef struct rtable {
    int n;
    rentry e[KILN_ROLLOUT_MAX_MODELS];
} rtable;

/* A window's counts of one arm. */
typedef struct wcount {
    uint64_t ok, err, hist[KILN_GATE_LAT_BUCKETS];
} wcount;

/* One model of the file: its canary's state (split-only models: ST_NONE). */
typedef struct mstate {
    char model[128];
    const KilnRollout__ModelRollout *mr; /* into r->cfg */
    char cand_spec[160];                 /* identity of the canary: "version 2", "label canary" */
    int64_t candidate, baseline;         /* resolved; -1: not yet */
    rstate state;
    int step;                            /* index into steps */
    int n_steps;
    double steps[ROLLOUT_MAX_STEPS];
    int64_t min_requests;
    int min_step_seconds;
    kiln_gate_params gp;
    int window_open, holding;
    int controlled;                      /* the file carries the state (kiln rollout-controller) */
    int label_moved;                     /* controlled and promoted: stable was moved */
    double step_start;                   /* monotonic seconds */
    wcount snap_c, snap_b;
    kiln_rollout_pairs snap_pairs;       /* the pairs source at the window's start */
    int drift_gate;                      /* gates.roll_back_on_input_drift */
    kiln_gate_result last;
    uint64_t win_c, win_b;               /* requests in the last evaluated window */
    char reason[560];
    char status[640];
} mstate;

/* Event counters per model name, and its last events, kept across reloads. */
#define ROLLOUT_RECENT_EVENTS 8
typedef struct recent_event {
    char time[32];                       /* UTC, ISO 8601 */
    int ev;                              /* revent */
    double step_percent;
    char reason[232];                    /* cut to fit */
} recent_event;

typedef struct mevents {
    char model[128];
    uint64_t n[EV_N];
    recent_event recent[ROLLOUT_RECENT_EVENTS]; /* ring, oldest overwritten */
    uint64_t n_recent;                   /* events ever put in the ring */
} mevents;

struct kiln_rollout {
    char *path;
    int poll_seconds;
    kiln_manager *mgr;
    char state_path[4096];
    pthread_mutex_t mu;
    KilnRollout__RolloutConfig *cfg;     /* under mu */
    int n_models;
    mstate models[KILN_ROLLOUT_MAX_MODELS];
    int n_events;
    mevents events[2 * KILN_ROLLOUT_MAX_MODELS];
    int eval_seconds;
    struct stat file_st;
    /* request path */
    _Atomic(rtable *) table;
    atomic_int readers;
    pthread_mutex_t slot_mu;
    atomic_int n_slots;
    vslot slots[ROLLOUT_SLOTS];
    /* subscribers */
    pthread_mutex_t sub_mu;
    int n_subs;
    kiln_rollout_config_fn sub_fn[KILN_ROLLOUT_MAX_SUBSCRIBERS];
    void *sub_ctx[KILN_ROLLOUT_MAX_SUBSCRIBERS];
    /* the agreement gate's pairs (shadow traffic) */
    kiln_rollout_pairs_fn pairs_fn;
    void *pairs_ctx;
    /* the input drift gate's source (model monitoring) */
    kiln_rollout_drift_fn drift_fn;
    void *drift_ctx;
    /* controller thread */
    pthread_t thread;
    int started;
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
    int stop;
};

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* ------------------------------------------------------------ events */

static mevents *events_of(kiln_rollout *r, const char *model)
{
    for (int i = 0; i < r->n_events; i++)
        if (strcmp(r->events[i].model, model) == 0) return &r->events[i];
    if (r->n_events == (int)(sizeof r->events / sizeof r->events[0])) return NULL;
    mevents *e = &r->events[r->n_events++];
    memset(e, 0, sizeof *e);
    snprintf(e->model, sizeof e->model, "%s", model);
    return e;
}

static double step_percent(const mstate *m)
{
    switch (m->state) {
    case ST_PROGRESSING:
    case ST_PAUSED:
        return m->steps[m->step];
    case ST_PROMOTED:
        return 100;
    default:
        return 0;
    }
}

/* One structured line on stderr per transition, and its counter. */
static void emit(kiln_rollout *r, mstate *m, revent ev, const char *reason)
{
    mevents *e = events_of(r, m->model);
    if (e) e->n[ev]++;
    char ts[32];
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    if (e) {
        recent_event *re = &e->recent[e->n_recent++ % ROLLOUT_RECENT_EVENTS];
        snprintf(re->time, sizeof re->time, "%s", ts);
        re->ev = (int)ev;
        re->step_percent = step_percent(m);
        snprintf(re->reason, sizeof re->reason, "%s", reason ? reason : "");
    }
    kiln_sbuf b = {0};
    kiln_sbuf_printf(&b, "{\"time\":\"%s\",\"component\":\"rollout\",\"event\":\"%s\",\"model\":",
                     ts, event_names[ev]);
    kiln_sbuf_json_string(&b, m->model, strlen(m->model));
    kiln_sbuf_printf(&b, ",\"state\":\"%s\",\"step_percent\":%g,\"candidate\":%" PRId64
                         ",\"baseline\":%" PRId64 ",\"reason\":",
                     state_names[m->state], step_percent(m), m->candidate, m->baseline);
    kiln_sbuf_json_string(&b, reason ? reason : "", reason ? strlen(reason) : 0);
    kiln_sbuf_puts(&b, "}\n");
    if (!b.oom) fputs(b.p, stderr);
    kiln_sbuf_free(&b);
}

/* ------------------------------------------------------------ slots */

static vslot *slot_find(kiln_rollout *r, const char *model, int64_t version)
{
    int n = atomic_load(&r->n_slots);
    for (int i = 0; i < n; i++) {
        vslot *s = &r->slots[i];
        if (s->version == version && atomic_load(&s->ready) && strcmp(s->model, model) == 0)
            return s;
    }
    return NULL;
}

static vslot *slot_get(kiln_rollout *r, const char *model, int64_t version)
{
    vslot *s = slot_find(r, model, version);
    if (s) return s;
    pthread_mutex_lock(&r->slot_mu);
    s = slot_find(r, model, version);
    int n = atomic_load(&r->n_slots);
    if (!s && n < ROLLOUT_SLOTS && strlen(model) < sizeof s->model) {
        s = &r->slots[n];
        snprintf(s->model, sizeof s->model, "%s", model);
        s->version = version;
        atomic_store(&s->ready, 1);
        atomic_store(&r->n_slots, n + 1);
    }
    pthread_mutex_unlock(&r->slot_mu);
    return s;
}

static void slot_read(kiln_rollout *r, const char *model, int64_t version, wcount *w)
{
    memset(w, 0, sizeof *w);
    vslot *s = version >= 0 ? slot_find(r, model, version) : NULL;
    if (!s) return;
    w->ok = atomic_load(&s->ok);
    w->err = atomic_load(&s->err);
    for (int i = 0; i < KILN_GATE_LAT_BUCKETS; i++) w->hist[i] = atomic_load(&s->hist[i]);
}

/* ------------------------------------------------------------ route table */

static rtable *table_enter(kiln_rollout *r)
{
    atomic_fetch_add(&r->readers, 1);
    return atomic_load(&r->table);
}

static void table_leave(kiln_rollout *r) { atomic_fetch_sub(&r->readers, 1); }

static const rentry *table_find(const rtable *t, const char *model)
{
    if (!t) return NULL;
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->e[i].model, model) == 0) return &t->e[i];
    return NULL;
}

/* Publish t (owned) and free the previous table once no reader holds it. */
static void table_swap(kiln_rollout *r, rtable *t)
{
    rtable *old = atomic_exchange(&r->table, t);
    if (!old) return;
    while (atomic_load(&r->readers) != 0) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    free(old);
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    /* finalizer (splitmix64) so nearby keys spread */
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

static uint64_t thread_random(void)
{
    static _Thread_local uint64_t x;
    if (!x) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        x = fnv1a("seed") ^ (uint64_t)(uintptr_t)&x ^ (uint64_t)t.tv_nsec ^
            ((uint64_t)t.tv_sec << 32);
        if (!x) x = 1;
    }
    x ^= x << 13; /* xorshift64 */
    x ^= x >> 7;
    x ^= x << 17;
    return x;
}

static int64_t route_fn(void *ctx, const char *model, const char *key)
{
    kiln_rollout *r = ctx;
    int64_t v = -1;
    rtable *t = table_enter(r);
    const rentry *e = table_find(t, model);
    if (e && e->n > 0) {
        uint64_t u = (e->sticky && key ? fnv1a(key) : thread_random()) >> 32;
        v = e->version[e->n - 1];
        for (int i = 0; i < e->n; i++)
            if (u < e->cum[i]) {
                v = e->version[i];
                break;
            }
    }
    table_leave(r);
    return v;
}

static void after_fn(void *ctx, const kiln_observation *o)
{
    kiln_rollout *r = ctx;
    rtable *t = table_enter(r);
    int managed = table_find(t, o->model) != NULL;
    table_leave(r);
    if (!managed || !o->sv) return;
    vslot *s = slot_get(r, o->model, o->sv->version);
    if (!s) return;
    if (o->code && strcmp(o->code, "OK") == 0) atomic_fetch_add(&s->ok, 1);
    else atomic_fetch_add(&s->err, 1);
    atomic_fetch_add(&s->hist[kiln_gate_bucket_of(o->latency_us)], 1);
}

/* ------------------------------------------------------------ resolution */

typedef struct avail_ctx {
    int64_t v[64];
    int n;
} avail_ctx;

static void avail_visit(void *ctx, int i, int64_t version, kiln_version_state state,
                        const char *ec, const char *em)
{
    (void)i;
    (void)ec;
    (void)em;
    avail_ctx *a = ctx;
    if (state == KILN_VERSION_AVAILABLE && a->n < 64) a->v[a->n++] = version;
}

static int available(int64_t version, const avail_ctx *a)
{
    for (int i = 0; i < a->n; i++)
        if (a->v[i] == version) return 1;
    return 0;
}

static void list_available(kiln_rollout *r, const char *model, avail_ctx *a)
{
    char err[KILN_JSON_ERR_LEN];
    a->n = 0;
    kiln_manager_status_each(r->mgr, model, -1, avail_visit, a, err);
}

static int64_t resolve(kiln_rollout *r, const char *model, int64_t version, const char *label)
{
    if (version > 0) return version;
    if (label && label[0]) {
        char err[KILN_JSON_ERR_LEN];
        int64_t v;
        if (kiln_manager_resolve_label(r->mgr, model, label, &v, err) == KILN_OK) return v;
    }
    return -1;
}

/* Resolve a canary's candidate and baseline (once; the baseline stays fixed
 * for the rollout even when "stable" moves). 1 when both are served. */
static int resolve_canary(kiln_rollout *r, mstate *m, avail_ctx *a)
{
    const KilnRollout__Canary *k = m->mr->canary;
    if (m->candidate < 0) m->candidate = resolve(r, m->model, k->candidate_version, k->candidate_label);
    if (m->baseline < 0 && m->candidate >= 0) {
        int64_t b = resolve(r, m->model, k->baseline_version, k->baseline_label);
        if (b < 0 && !k->baseline_version && !(k->baseline_label && k->baseline_label[0])) {
            b = resolve(r, m->model, 0, "stable");
            if (b == m->candidate || (b >= 0 && !available(b, a))) b = -1;
            for (int i = 0; b < 0 && i < a->n; i++) /* status_each: newest first */
                if (a->v[i] != m->candidate) b = a->v[i];
        }
        m->baseline = b;
    }
    if (m->candidate < 0) {
        snprintf(m->status, sizeof m->status, "waiting: the candidate %s is not known", m->cand_spec);
        return 0;
    }
    if (!available(m->candidate, a)) {
        snprintf(m->status, sizeof m->status, "waiting: candidate version %" PRId64 " is not available",
                 m->candidate);
        return 0;
    }
    if (m->baseline < 0 || !available(m->baseline, a)) {
        snprintf(m->status, sizeof m->status, "waiting: no baseline version available");
        return 0;
    }
    return 1;
}

/* Build the route table from the config and the states (under r->mu). */
static rtable *build_table(kiln_rollout *r)
{
    rtable *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    for (int i = 0; i < r->n_models; i++) {
        mstate *m = &r->models[i];
        rentry *e = &t->e[t->n++];
        snprintf(e->model, sizeof e->model, "%s", m->model);
        e->sticky = m->mr->sticky;
        avail_ctx a;
        list_available(r, m->model, &a);
        double w[KILN_ROLLOUT_MAX_TARGETS], sum = 0;
        if (m->mr->canary) {
            if (m->candidate < 0 || m->baseline < 0) continue;
            int64_t c = m->candidate, b = m->baseline;
            double wc = m->state == ST_PROMOTED ? 1.0
                        : m->state == ST_ROLLED_BACK ? 0.0
                        : m->steps[m->step] / 100.0;
            /* the candidate first: a sticky key on it stays there as it grows */
            if (available(c, &a)) {
                e->version[e->n] = c;
                w[e->n++] = wc;
            }
            if (available(b, &a)) {
                e->version[e->n] = b;
                w[e->n++] = 1.0 - wc;
            }
        } else {
            for (size_t k = 0; k < m->mr->n_split && e->n < KILN_ROLLOUT_MAX_TARGETS; k++) {
                const KilnRollout__SplitTarget *st = m->mr->split[k];
                int64_t v = st->target_case == KILN_ROLLOUT__SPLIT_TARGET__TARGET_VERSION
                                ? st->version
                                : resolve(r, m->model, 0, st->label);
                if (v < 0 || !available(v, &a)) continue;
                e->version[e->n] = v;
                w[e->n++] = st->weight;
            }
        }
        int kept = 0; /* zero weights take nothing: leave them out */
        for (int k = 0; k < e->n; k++)
            if (w[k] > 0) {
                e->version[kept] = e->version[k];
                w[kept++] = w[k];
            }
        e->n = kept;
        for (int k = 0; k < e->n; k++) sum += w[k];
        if (!(sum > 0)) {
            e->n = 0;
            continue;
        }
        double acc = 0;
        for (int k = 0; k < e->n; k++) {
            acc += w[k];
            e->weight[k] = w[k] / sum;
            e->cum[k] = k == e->n - 1 ? ((uint64_t)1 << 32)
                                      : (uint64_t)llround(acc / sum * 4294967296.0);
        }
    }
    return t;
}

static void republish(kiln_rollout *r)
{
    rtable *t = build_table(r);
    if (!t) return;
    rtable *cur = atomic_load(&r->table); /* only this thread (under mu) swaps */
    if (cur && memcmp(cur, t, sizeof *t) == 0) {
        free(t);
        return;
    }
    table_swap(r, t);
}

/* ------------------------------------------------------------ persistence */

static void persist(kiln_rollout *r)
{
    int canaries = 0; /* splits alone have no state: write nothing (the file's folder may be read-only) */
    for (int i = 0; i < r->n_models; i++)
        canaries += r->models[i].mr->canary != NULL && !r->models[i].controlled;
    if (!canaries) return;
    kiln_sbuf b = {0};
    kiln_sbuf_puts(&b, "{\"rollouts\": [");
    int first = 1;
    for (int i = 0; i < r->n_models; i++) {
        mstate *m = &r->models[i];
        if (!m->mr->canary || m->controlled) continue;
        kiln_sbuf_puts(&b, first ? "\n  {\"model\": " : ",\n  {\"model\": ");
        first = 0;
        kiln_sbuf_json_string(&b, m->model, strlen(m->model));
        kiln_sbuf_puts(&b, ", \"candidate\": ");
        kiln_sbuf_json_string(&b, m->cand_spec, strlen(m->cand_spec));
        kiln_sbuf_printf(&b, ", \"candidate_version\": %" PRId64 ", \"baseline_version\": %" PRId64
                             ", \"state\": \"%s\", \"step\": %d, \"reason\": ",
                         m->candidate, m->baseline, state_names[m->state], m->step);
        kiln_sbuf_json_string(&b, m->reason, strlen(m->reason));
        kiln_sbuf_puts(&b, "}");
    }
    kiln_sbuf_puts(&b, "\n]}\n");
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", r->state_path);
    FILE *f = b.oom ? NULL : fopen(tmp, "wb");
    int ok = f && fwrite(b.p, 1, b.len, f) == b.len;
    if (f) ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
    if (f && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, r->state_path) != 0) ok = 0;
    if (!ok)
        fprintf(stderr, "kiln serve: rollout: cannot write the state file %s: %s\n", r->state_path,
                strerror(errno));
    kiln_sbuf_free(&b);
}

static void restore(kiln_rollout *r)
{
    FILE *f = fopen(r->state_path, "rb");
    if (!f) return;
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    kiln_json_doc d;
    char err[KILN_JSON_ERR_LEN];
    if (kiln_json_parse(text, n, 8, &d, err) != KILN_OK) {
        fprintf(stderr, "kiln serve: rollout: ignoring the state file %s: %s\n", r->state_path, err);
        return;
    }
    int arr = kiln_json_object_get(&d, 0, "rollouts");
    if (arr < 0 || d.tok[arr].type != KILN_JSON_ARRAY) {
        fprintf(stderr, "kiln serve: rollout: ignoring the state file %s: no \"rollouts\" array\n",
                r->state_path);
        kiln_json_doc_free(&d);
        return;
    }
    for (uint32_t e = (uint32_t)arr + 1, k = 0; k < d.tok[arr].size; k++, e = d.tok[e].next) {
        if (d.tok[e].type != KILN_JSON_OBJECT) continue;
        int tm = kiln_json_object_get(&d, (int)e, "model");
        int tc = kiln_json_object_get(&d, (int)e, "candidate");
        int ts = kiln_json_object_get(&d, (int)e, "state"), tp = kiln_json_object_get(&d, (int)e, "step");
        int tb = kiln_json_object_get(&d, (int)e, "baseline_version");
        int tcv = kiln_json_object_get(&d, (int)e, "candidate_version");
        int tr = kiln_json_object_get(&d, (int)e, "reason");
        if (tm < 0 || tc < 0 || ts < 0 || tp < 0) continue;
        for (int i = 0; i < r->n_models; i++) {
            mstate *m = &r->models[i];
            if (!m->mr->canary || m->controlled || !kiln_json_string_eq(&d, tm, m->model) ||
                !kiln_json_string_eq(&d, tc, m->cand_spec))
                continue;
            int64_t step = -1, bv = -1, cv = -1;
            kiln_json_get_int64(&d, tp, &step);
            if (tb >= 0) kiln_json_get_int64(&d, tb, &bv);
            if (tcv >= 0) kiln_json_get_int64(&d, tcv, &cv);
            rstate st = ST_N;
            for (int s = ST_PROGRESSING; s < ST_N; s++)
                if (kiln_json_string_eq(&d, ts, state_names[s])) st = (rstate)s;
            if (st == ST_N || step < 0 || step >= m->n_steps) continue;
            m->state = st;
            m->step = (int)step;
            if (bv > 0) m->baseline = bv;
            if (cv > 0) m->candidate = cv;
            if (tr >= 0 && d.tok[tr].type == KILN_JSON_STRING) {
                char *s = kiln_json_string_dup(&d, tr, NULL);
                if (s) snprintf(m->reason, sizeof m->reason, "%s", s);
                free(s);
            }
            fprintf(stderr, "kiln serve: rollout: %s resumes %s at step %d (%g%%) from %s\n",
                    m->model, state_names[m->state], m->step, m->steps[m->step], r->state_path);
        }
    }
    kiln_json_doc_free(&d);
}

/* ------------------------------------------------------------ states */

static void state_init(mstate *m, const KilnRollout__ModelRollout *mr)
{
    memset(m, 0, sizeof *m);
    snprintf(m->model, sizeof m->model, "%s", mr->model_name);
    m->mr = mr;
    m->candidate = m->baseline = -1;
    const KilnRollout__Canary *k = mr->canary;
    if (!k) return;
    if (k->candidate_version)
        snprintf(m->cand_spec, sizeof m->cand_spec, "version %" PRId64, k->candidate_version);
    else
        snprintf(m->cand_spec, sizeof m->cand_spec, "label %.140s", k->candidate_label);
    m->state = k->paused ? ST_PAUSED : ST_PROGRESSING;
    m->controlled = k->controlled;
    static const double def_steps[] = {5, 50, 100};
    m->n_steps = k->n_steps ? (int)k->n_steps : 3;
    for (int i = 0; i < m->n_steps; i++) m->steps[i] = k->n_steps ? k->steps[i] : def_steps[i];
    m->min_requests = k->min_requests ? k->min_requests : 100;
    m->min_step_seconds = k->min_step_seconds ? k->min_step_seconds : 60;
    if (k->controlled) { /* the file carries the fleet's state (kiln rollout-controller) */
        for (int s = ST_PROGRESSING; s < ST_N; s++)
            if (k->state && strcmp(k->state, state_names[s]) == 0) m->state = (rstate)s;
        if (k->step >= 0 && k->step < m->n_steps) m->step = k->step;
        snprintf(m->reason, sizeof m->reason, "%s", k->reason ? k->reason : "");
    }
    const KilnRollout__Gates *g = k->gates;
    m->gp.confidence = g && g->confidence ? g->confidence : 0.95;
    m->gp.max_error_rate_increase = g && g->max_error_rate_increase ? g->max_error_rate_increase : 0.01;
    m->gp.max_p99_latency_ratio = g && g->max_p99_latency_ratio ? g->max_p99_latency_ratio : 1.5;
    m->gp.p99_slack_us = g && g->p99_latency_slack_us ? g->p99_latency_slack_us : 200.0;
    m->gp.min_agreement = g ? g->min_agreement : 0.0;
    m->gp.max_output_divergence = g ? g->max_output_divergence : 0.0;
    m->drift_gate = g && g->roll_back_on_input_drift;
}

/* Same canary (model, candidate, steps, baseline spec): the state carries over a reload. */
static int same_canary(const mstate *a, const KilnRollout__ModelRollout *mr)
{
    mstate tmp;
    state_init(&tmp, mr);
    if (!a->mr->canary || !mr->canary || a->controlled || tmp.controlled ||
        strcmp(a->model, tmp.model) != 0 ||
        strcmp(a->cand_spec, tmp.cand_spec) != 0 || a->n_steps != tmp.n_steps)
        return 0;
    for (int i = 0; i < a->n_steps; i++)
        if (a->steps[i] != tmp.steps[i]) return 0;
    return a->mr->canary->baseline_version == mr->canary->baseline_version &&
           strcmp(a->mr->canary->baseline_label ? a->mr->canary->baseline_label : "",
                  mr->canary->baseline_label ? mr->canary->baseline_label : "") == 0;
}

/* The pairs source's cumulative counts for m's candidate (zeros without one). */
static void pairs_read(kiln_rollout *r, const mstate *m, kiln_rollout_pairs *p)
{
    memset(p, 0, sizeof *p);
    if ((m->gp.min_agreement > 0 || m->gp.max_output_divergence > 0) && r->pairs_fn &&
        m->candidate >= 0)
        r->pairs_fn(r->pairs_ctx, m->model, m->candidate, p);
}

static uint64_t u64_since(uint64_t now, uint64_t then)
{
    return now >= then ? now - then : 0;
}

static void open_window(kiln_rollout *r, mstate *m)
{
    slot_read(r, m->model, m->candidate, &m->snap_c);
    slot_read(r, m->model, m->baseline, &m->snap_b);
    pairs_read(r, m, &m->snap_pairs);
    m->step_start = mono_s();
    m->window_open = 1;
    m->holding = 0;
}

static void window(kiln_rollout *r, const mstate *m, wcount *c, wcount *b)
{
    slot_read(r, m->model, m->candidate, c);
    slot_read(r, m->model, m->baseline, b);
    c->ok -= m->snap_c.ok;
    c->err -= m->snap_c.err;
    b->ok -= m->snap_b.ok;
    b->err -= m->snap_b.err;
    for (int i = 0; i < KILN_GATE_LAT_BUCKETS; i++) {
        c->hist[i] -= m->snap_c.hist[i];
        b->hist[i] -= m->snap_b.hist[i];
    }
}

static void do_promote(kiln_rollout *r, mstate *m, const char *why)
{
    m->state = ST_PROMOTED;
    m->step = m->n_steps - 1;
    snprintf(m->reason, sizeof m->reason, "%s", why);
    char err[KILN_JSON_ERR_LEN];
    if (m->candidate >= 0 &&
        kiln_manager_set_label(r->mgr, m->model, "stable", m->candidate, err) != KILN_OK)
        fprintf(stderr, "kiln serve: rollout: %s: cannot move the stable label: %s\n", m->model, err);
    snprintf(m->status, sizeof m->status, "promoted: version %" PRId64 " serves 100%% and is "
             "labelled stable", m->candidate);
    emit(r, m, EV_PROMOTE, why);
}

static void do_rollback(kiln_rollout *r, mstate *m, const char *why)
{
    m->state = ST_ROLLED_BACK;
    snprintf(m->reason, sizeof m->reason, "%s", why);
    snprintf(m->status, sizeof m->status, "rolled back: version %" PRId64 " serves 100%%: %s",
             m->baseline, why);
    emit(r, m, EV_ROLLBACK, why);
}

/* One evaluation of a canary (under r->mu). Returns 1 when the state changed. */
static int evaluate(kiln_rollout *r, mstate *m)
{
    avail_ctx a;
    if (m->controlled) {
        list_available(r, m->model, &a);
        if (!resolve_canary(r, m, &a)) return 0;
        if (m->state == ST_PROMOTED && !m->label_moved) {
            char err[KILN_JSON_ERR_LEN];
            if (kiln_manager_set_label(r->mgr, m->model, "stable", m->candidate, err) == KILN_OK)
                m->label_moved = 1;
        }
        snprintf(m->status, sizeof m->status, "controlled by kiln rollout-controller: %s at step "
                 "%d (%g%%)", state_names[m->state], m->step + 1, step_percent(m));
        return 0;
    }
    if (m->state != ST_PROGRESSING && m->state != ST_PAUSED) return 0;
    list_available(r, m->model, &a);
    if (!resolve_canary(r, m, &a)) return 0;
    if (m->state == ST_PAUSED) {
        snprintf(m->status, sizeof m->status, "paused at step %d (%g%%)", m->step + 1,
                 m->steps[m->step]);
        return 0;
    }
    if (!m->window_open) open_window(r, m);
    wcount c, b;
    window(r, m, &c, &b);
    kiln_gate_arm ac = {c.ok + c.err, c.err, c.hist, NULL, 0}, ab = {b.ok + b.err, b.err, b.hist, NULL, 0};
    m->win_c = ac.requests;
    m->win_b = ab.requests;
    kiln_gate_evaluate(&m->gp, &ac, &ab, &m->last);
    if (m->gp.min_agreement > 0 || m->gp.max_output_divergence > 0) {
        kiln_rollout_pairs p;
        pairs_read(r, m, &p);
        kiln_gate_agreement(&m->gp, u64_since(p.agree, m->snap_pairs.agree),
                            u64_since(p.paired, m->snap_pairs.paired), &m->last);
        uint64_t rows = u64_since(p.js_rows, m->snap_pairs.js_rows);
        double sum = rows ? p.js_sum - m->snap_pairs.js_sum : 0.0;
        double sq = rows ? p.js_sq_sum - m->snap_pairs.js_sq_sum : 0.0;
        kiln_gate_divergence(&m->gp, rows, sum, sq, &m->last);
    }
    if (m->drift_gate && r->drift_fn && m->last.verdict != KILN_GATE_FAIL) {
        char what[256];
        int d = r->drift_fn(r->drift_ctx, m->model, m->candidate, what, sizeof what);
        if (d == -1 && m->last.verdict == KILN_GATE_PASS) {
            m->last.verdict = KILN_GATE_HOLD;
            snprintf(m->last.reason, sizeof m->last.reason,
                     "input drift: too few of version %" PRId64 "'s input values in the "
                     "monitoring window to tell (its profile's min_count)", m->candidate);
        } else if (d > 0) {
            m->last.verdict = KILN_GATE_FAIL;
            int k = snprintf(m->last.reason, sizeof m->last.reason,
                             "input drift: %d feature%s of version %" PRId64 " past the "
                             "profile's thresholds; farthest ", d, d == 1 ? "" : "s", m->candidate);
            if (k > 0 && (size_t)k < sizeof m->last.reason) /* the description, cut to fit */
                memcpy(m->last.reason + k, what,
                       strnlen(what, sizeof m->last.reason - (size_t)k - 1) + 1);
            m->last.reason[sizeof m->last.reason - 1] = '\0';
        }
    }
    double elapsed = mono_s() - m->step_start;
    if (m->last.verdict == KILN_GATE_FAIL) {
        char why[512];
        snprintf(why, sizeof why, "step %g%%: %s", m->steps[m->step], m->last.reason);
        do_rollback(r, m, why);
        return 1;
    }
    int enough = ac.requests >= (uint64_t)m->min_requests &&
                 ab.requests >= (uint64_t)m->min_requests && elapsed >= m->min_step_seconds;
    if (!enough) {
        snprintf(m->status, sizeof m->status,
                 "step %d (%g%%): collecting: %" PRIu64 "/%" PRId64 " candidate and %" PRIu64
                 "/%" PRId64 " baseline requests, %.0f/%d s",
                 m->step + 1, m->steps[m->step], ac.requests, m->min_requests, ab.requests,
                 m->min_requests, elapsed, m->min_step_seconds);
        return 0;
    }
    if (m->last.verdict == KILN_GATE_HOLD) {
        snprintf(m->status, sizeof m->status, "step %d (%g%%): holding: %s", m->step + 1,
                 m->steps[m->step], m->last.reason);
        if (!m->holding) {
            m->holding = 1;
            emit(r, m, EV_HOLD, m->last.reason);
        }
        return 0;
    }
    char why[200];
    snprintf(why, sizeof why,
             "step %g%% passed: error rate %.4f vs %.4f, p99 %.0f vs %.0f us over %" PRIu64
             " and %" PRIu64 " requests",
             m->steps[m->step], m->last.err_candidate, m->last.err_baseline,
             m->last.p99_candidate, m->last.p99_baseline, ac.requests, ab.requests);
    if (m->step + 1 >= m->n_steps - 1) { /* the next step is the last one, 100% */
        do_promote(r, m, why);
        return 1;
    }
    m->step++;
    snprintf(m->reason, sizeof m->reason, "%s", why);
    snprintf(m->status, sizeof m->status, "step %d (%g%%): started", m->step + 1, m->steps[m->step]);
    emit(r, m, EV_ADVANCE, why);
    open_window(r, m);
    return 1;
}

/* ------------------------------------------------------------ config */

static void notify(kiln_rollout *r, const KilnRollout__RolloutConfig *cfg)
{
    pthread_mutex_lock(&r->sub_mu);
    for (int i = 0; i < r->n_subs; i++) r->sub_fn[i](r->sub_ctx[i], cfg);
    pthread_mutex_unlock(&r->sub_mu);
}

/* Install cfg (owned) under r->mu, carrying over the states of unchanged canaries. */
static void install(kiln_rollout *r, KilnRollout__RolloutConfig *cfg)
{
    mstate *fresh = calloc(KILN_ROLLOUT_MAX_MODELS, sizeof *fresh);
    if (!fresh) {
        kiln_rollout__rollout_config__free_unpacked(cfg, NULL);
        return;
    }
    int n = 0;
    for (size_t i = 0; i < cfg->n_model_rollouts && n < KILN_ROLLOUT_MAX_MODELS; i++) {
        const KilnRollout__ModelRollout *mr = cfg->model_rollouts[i];
        mstate *m = &fresh[n++];
        int kept = 0;
        for (int j = 0; j < r->n_models && !kept; j++)
            if (strcmp(r->models[j].model, mr->model_name) == 0 && same_canary(&r->models[j], mr)) {
                *m = r->models[j];
                m->mr = mr;
                kept = 1;
            }
        if (!kept) {
            state_init(m, mr);
            if (mr->canary)
                fprintf(stderr, "kiln serve: rollout: %s: canary of %s starts%s\n", m->model,
                        m->cand_spec, m->state == ST_PAUSED ? " paused" : "");
        }
    }
    memcpy(r->models, fresh, (size_t)n * sizeof *fresh);
    r->n_models = n;
    free(fresh);
    if (r->cfg) kiln_rollout__rollout_config__free_unpacked(r->cfg, NULL);
    r->cfg = cfg;
    r->eval_seconds = cfg->evaluation_interval_seconds > 0 ? cfg->evaluation_interval_seconds : 5;
}

static void set_state_path(kiln_rollout *r)
{
    if (r->cfg->state_file && r->cfg->state_file[0])
        snprintf(r->state_path, sizeof r->state_path, "%s", r->cfg->state_file);
    else
        snprintf(r->state_path, sizeof r->state_path, "%s.state.json", r->path);
}

static void check_reload(kiln_rollout *r)
{
    struct stat st;
    if (stat(r->path, &st) != 0) return;
    if (st.st_mtim.tv_sec == r->file_st.st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == r->file_st.st_mtim.tv_nsec && st.st_size == r->file_st.st_size &&
        st.st_ino == r->file_st.st_ino)
        return;
    r->file_st = st;
    KilnRollout__RolloutConfig *cfg;
    char err[KILN_ROLLOUT_ERR_LEN];
    if (kiln_rollout_config_load(r->path, &cfg, err) != KILN_OK) {
        kiln_sbuf b = {0};
        kiln_sbuf_puts(&b, "{\"component\":\"rollout\",\"event\":\"config_rejected\",\"error\":");
        kiln_sbuf_json_string(&b, err, strlen(err));
        kiln_sbuf_puts(&b, "}\n");
        if (!b.oom) fputs(b.p, stderr);
        kiln_sbuf_free(&b);
        return;
    }
    pthread_mutex_lock(&r->mu);
    install(r, cfg);
    set_state_path(r);
    fprintf(stderr, "kiln serve: rollout: reloaded %s (%zu models)\n", r->path,
            cfg->n_model_rollouts);
    for (int i = 0; i < r->n_models; i++) evaluate(r, &r->models[i]);
    republish(r);
    persist(r);
    pthread_mutex_unlock(&r->mu);
    notify(r, cfg); /* cfg stays alive: only this thread replaces it */
}

/* ------------------------------------------------------------ public */

kiln_status kiln_rollout_create(const char *path, int poll_seconds, kiln_manager *mgr,
                                kiln_rollout **out, char *err)
{
    *out = NULL;
    KilnRollout__RolloutConfig *cfg;
    kiln_status st = kiln_rollout_config_load(path, &cfg, err);
    if (st != KILN_OK) return st;
    kiln_rollout *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path))) {
        free(r);
        kiln_rollout__rollout_config__free_unpacked(cfg, NULL);
        snprintf(err, KILN_ROLLOUT_ERR_LEN, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    r->poll_seconds = poll_seconds;
    r->mgr = mgr;
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->slot_mu, NULL);
    pthread_mutex_init(&r->sub_mu, NULL);
    pthread_mutex_init(&r->stop_mu, NULL);
    pthread_cond_init(&r->stop_cv, NULL);
    stat(path, &r->file_st);
    install(r, cfg);
    set_state_path(r);
    restore(r);
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n_models; i++) {
        mstate *m = &r->models[i];
        if (m->state == ST_PROMOTED && m->candidate >= 0) { /* labels are not persisted by the manager */
            char e[KILN_JSON_ERR_LEN];
            kiln_manager_set_label(mgr, m->model, "stable", m->candidate, e);
        }
        evaluate(r, m);
    }
    republish(r);
    persist(r);
    pthread_mutex_unlock(&r->mu);
    *out = r;
    return KILN_OK;
}

kiln_status kiln_rollout_subscribe(kiln_rollout *r, kiln_rollout_config_fn fn, void *ctx)
{
    pthread_mutex_lock(&r->sub_mu);
    if (r->n_subs == KILN_ROLLOUT_MAX_SUBSCRIBERS) {
        pthread_mutex_unlock(&r->sub_mu);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    r->sub_fn[r->n_subs] = fn;
    r->sub_ctx[r->n_subs++] = ctx;
    pthread_mutex_lock(&r->mu);
    fn(ctx, r->cfg);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_unlock(&r->sub_mu);
    return KILN_OK;
}

static void write_metrics(void *ctx, kiln_sbuf *b);
static void admin(void *ctx, kiln_server *s, const kiln_http_request *req, kiln_http_reply *rep);
static void reply_json(kiln_http_reply *rep, int code);

kiln_status kiln_rollout_attach(kiln_rollout *r, kiln_observers *h, kiln_server_options *so)
{
    kiln_observer o = {"rollout", r, NULL, after_fn, write_metrics, NULL};
    kiln_status st = kiln_observers_add(h, &o);
    if (st != KILN_OK) return st;
    kiln_observers_set_route(h, route_fn, r);
    if (r->cfg->route_key_header && r->cfg->route_key_header[0])
        snprintf(h->route_header, sizeof h->route_header, "%s", r->cfg->route_key_header);
    so->ext_prefix = "/v1/rollouts";
    so->ext_handler = admin;
    so->ext_ctx = r;
    return KILN_OK;
}

/* Without a rollout file the admin path still answers: the list is empty
 * (so a console or script polling it sees "no rollouts", not an error), and
 * every model path is 404 naming the missing flag. */
static void admin_none(void *ctx, kiln_server *s, const kiln_http_request *req,
                       kiln_http_reply *rep)
{
    (void)ctx;
    rep->api = "rollout";
    const char *p = req->path + strlen("/v1/rollouts");
    if (strcmp(req->method, "GET") == 0 && (*p == '\0' || strcmp(p, "/") == 0)) {
        int denied = kiln_server_authorize(s, req, "metadata");
        if (denied) {
            kiln_reply_error(rep, denied == 401 ? "UNAUTHENTICATED" : "PERMISSION_DENIED",
                             "not authorized");
            rep->code = denied;
            return;
        }
        kiln_sbuf_puts(&rep->body, "{\"rollouts\":[]}");
        reply_json(rep, 200);
        return;
    }
    kiln_reply_error(rep, "NOT_FOUND",
                     "no rollouts: this server was started without --rollout_config_file");
}

void kiln_rollout_attach_none(kiln_server_options *so)
{
    so->ext_prefix = "/v1/rollouts";
    so->ext_handler = admin_none;
    so->ext_ctx = NULL;
}

static void *controller(void *arg)
{
    kiln_rollout *r = arg;
    double next_eval = mono_s() + r->eval_seconds, next_poll = mono_s() + r->poll_seconds;
    pthread_mutex_lock(&r->stop_mu);
    while (!r->stop) {
        pthread_mutex_unlock(&r->stop_mu);
        double now = mono_s();
        if (r->poll_seconds > 0 && now >= next_poll) {
            check_reload(r);
            next_poll = now + r->poll_seconds;
        }
        if (now >= next_eval) {
            pthread_mutex_lock(&r->mu);
            int changed = 0;
            for (int i = 0; i < r->n_models; i++) changed |= evaluate(r, &r->models[i]);
            republish(r); /* versions come and go: labels, availability */
            if (changed) persist(r);
            next_eval = now + r->eval_seconds;
            pthread_mutex_unlock(&r->mu);
        }
        double wake = next_eval;
        if (r->poll_seconds > 0 && next_poll < wake) wake = next_poll;
        double wait = wake - mono_s();
        if (wait < 0.01) wait = 0.01;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9 + wait;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        pthread_mutex_lock(&r->stop_mu);
        if (!r->stop) pthread_cond_timedwait(&r->stop_cv, &r->stop_mu, &ts);
    }
    pthread_mutex_unlock(&r->stop_mu);
    return NULL;
}

kiln_status kiln_rollout_start(kiln_rollout *r)
{
    if (pthread_create(&r->thread, NULL, controller, r) != 0) return KILN_ERR_INTERNAL;
    r->started = 1;
    return KILN_OK;
}

void kiln_rollout_free(kiln_rollout *r)
{
    if (!r) return;
    if (r->started) {
        pthread_mutex_lock(&r->stop_mu);
        r->stop = 1;
        pthread_cond_signal(&r->stop_cv);
        pthread_mutex_unlock(&r->stop_mu);
        pthread_join(r->thread, NULL);
    }
    free(atomic_load(&r->table));
    if (r->cfg) kiln_rollout__rollout_config__free_unpacked(r->cfg, NULL);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->slot_mu);
    pthread_mutex_destroy(&r->sub_mu);
    pthread_mutex_destroy(&r->stop_mu);
    pthread_cond_destroy(&r->stop_cv);
    free(r->path);
    free(r);
}

/* ------------------------------------------------------------ JSON, metrics */

/* The last evaluation's gates: the verdict and its reason, and per gate
 * its threshold (null: off) and what it saw. */
static void write_gates_json(const mstate *m, kiln_sbuf *b)
{
    static const char *const verdicts[] = {"pass", "hold", "fail"};
    const kiln_gate_result *l = &m->last;
    const kiln_gate_params *g = &m->gp;
    kiln_sbuf_printf(b, ", \"gates\": {\"evaluated\": %s, \"verdict\": \"%s\", \"reason\": ",
                     m->window_open ? "true" : "false", verdicts[l->verdict]);
    kiln_sbuf_json_string(b, l->reason, strnlen(l->reason, sizeof l->reason));
    kiln_sbuf_printf(b, ", \"confidence\": %.6g", g->confidence);
    if (g->max_error_rate_increase >= 0)
        kiln_sbuf_printf(b, ", \"error_rate\": {\"max_increase\": %.6g, \"bounds\": [%.6g, %.6g]}",
                         g->max_error_rate_increase, l->diff_lo, l->diff_hi);
    else kiln_sbuf_puts(b, ", \"error_rate\": null");
    if (g->max_p99_latency_ratio > 0)
        kiln_sbuf_printf(b, ", \"p99_latency\": {\"max_ratio\": %.6g, \"slack_us\": %.6g}",
                         g->max_p99_latency_ratio, g->p99_slack_us);
    else kiln_sbuf_puts(b, ", \"p99_latency\": null");
    if (g->min_agreement > 0)
        kiln_sbuf_printf(b, ", \"agreement\": {\"min\": %.6g, \"paired\": %" PRIu64
                            ", \"agree\": %" PRIu64 ", \"bounds\": [%.6g, %.6g]}",
                         g->min_agreement, l->paired, l->agree, l->agree_lo, l->agree_hi);
    else kiln_sbuf_puts(b, ", \"agreement\": null");
    if (g->max_output_divergence > 0)
        kiln_sbuf_printf(b, ", \"output_divergence\": {\"max\": %.6g, \"rows\": %" PRIu64
                            ", \"mean\": %.6g, \"bounds\": [%.6g, %.6g]}",
                         g->max_output_divergence, l->js_rows, l->js_mean, l->js_lo, l->js_hi);
    else kiln_sbuf_puts(b, ", \"output_divergence\": null");
    kiln_sbuf_printf(b, ", \"input_drift\": %s}", m->drift_gate ? "true" : "false");
}

/* The model's last events, oldest first (the stderr lines' fields). */
static void write_events_json(kiln_rollout *r, const mstate *m, kiln_sbuf *b)
{
    kiln_sbuf_puts(b, ", \"events\": [");
    const mevents *e = NULL;
    for (int i = 0; i < r->n_events; i++)
        if (strcmp(r->events[i].model, m->model) == 0) e = &r->events[i];
    uint64_t n = e ? e->n_recent : 0, first = n > ROLLOUT_RECENT_EVENTS ? n - ROLLOUT_RECENT_EVENTS : 0;
    for (uint64_t k = first; k < n; k++) {
        const recent_event *re = &e->recent[k % ROLLOUT_RECENT_EVENTS];
        kiln_sbuf_printf(b, "%s{\"time\": \"%s\", \"event\": \"%s\", \"step_percent\": %g, "
                            "\"reason\": ", k > first ? ", " : "", re->time, event_names[re->ev],
                         re->step_percent);
        kiln_sbuf_json_string(b, re->reason, strlen(re->reason));
        kiln_sbuf_puts(b, "}");
    }
    kiln_sbuf_puts(b, "]");
}

static void write_model_json(kiln_rollout *r, const mstate *m, kiln_sbuf *b)
{
    kiln_sbuf_puts(b, "{\"model\": ");
    kiln_sbuf_json_string(b, m->model, strlen(m->model));
    kiln_sbuf_printf(b, ", \"state\": \"%s\", \"kind\": \"%s\"", state_names[m->state],
                     m->mr->canary ? "canary" : "split");
    if (m->mr->canary) {
        kiln_sbuf_printf(b, ", \"controlled\": %s", m->controlled ? "true" : "false");
        kiln_sbuf_puts(b, ", \"candidate\": ");
        kiln_sbuf_json_string(b, m->cand_spec, strlen(m->cand_spec));
        kiln_sbuf_printf(b, ", \"candidate_version\": %" PRId64 ", \"baseline_version\": %" PRId64
                            ", \"step\": %d, \"step_percent\": %g, \"steps\": [",
                         m->candidate, m->baseline, m->step, step_percent(m));
        for (int i = 0; i < m->n_steps; i++) kiln_sbuf_printf(b, "%s%g", i ? ", " : "", m->steps[i]);
        kiln_sbuf_printf(b, "], \"min_requests\": %" PRId64 ", \"min_step_seconds\": %d",
                         m->min_requests, m->min_step_seconds);
        kiln_sbuf_printf(b, ", \"window\": {\"seconds\": %.1f, \"candidate_requests\": %" PRIu64
                            ", \"baseline_requests\": %" PRIu64 ", \"candidate_error_rate\": %.6g"
                            ", \"baseline_error_rate\": %.6g, \"error_rate_increase_bounds\": "
                            "[%.6g, %.6g], \"candidate_p99_us\": %.6g, \"baseline_p99_us\": %.6g}",
                         m->window_open ? mono_s() - m->step_start : 0.0, m->win_c, m->win_b,
                         m->last.err_candidate, m->last.err_baseline, m->last.diff_lo,
                         m->last.diff_hi, m->last.p99_candidate, m->last.p99_baseline);
        write_gates_json(m, b);
        kiln_sbuf_puts(b, ", \"reason\": ");
        kiln_sbuf_json_string(b, m->reason, strlen(m->reason));
        kiln_sbuf_puts(b, ", \"status\": ");
        kiln_sbuf_json_string(b, m->status, strlen(m->status));
        write_events_json(r, m, b);
    }
    kiln_sbuf_printf(b, ", \"sticky\": %s, \"weights\": [", m->mr->sticky ? "true" : "false");
    rtable *t = table_enter(r);
    const rentry *e = table_find(t, m->model);
    for (int k = 0; e && k < e->n; k++)
        kiln_sbuf_printf(b, "%s{\"version\": %" PRId64 ", \"weight\": %.6g}", k ? ", " : "",
                         e->version[k], e->weight[k]);
    table_leave(r);
    kiln_sbuf_puts(b, "]}");
}

void kiln_rollout_write_json(kiln_rollout *r, kiln_sbuf *b)
{
    pthread_mutex_lock(&r->mu);
    kiln_sbuf_puts(b, "{\"rollouts\": [");
    for (int i = 0; i < r->n_models; i++) {
        if (i) kiln_sbuf_puts(b, ", ");
        write_model_json(r, &r->models[i], b);
    }
    kiln_sbuf_puts(b, "]}");
    pthread_mutex_unlock(&r->mu);
}

/* A Prometheus label value: backslash, quote and newline escaped. */
static void label_value(kiln_sbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') kiln_sbuf_printf(b, "\\%c", *s);
        else if (*s == '\n') kiln_sbuf_puts(b, "\\n");
        else kiln_sbuf_put(b, s, 1);
    }
}

static void write_metrics(void *ctx, kiln_sbuf *b)
{
    kiln_rollout *r = ctx;
    int n = atomic_load(&r->n_slots);
    kiln_sbuf_puts(b, "# TYPE kiln_rollout_requests_total counter\n");
    for (int i = 0; i < n; i++) {
        vslot *s = &r->slots[i];
        for (int k = 0; k < 2; k++) {
            kiln_sbuf_puts(b, "kiln_rollout_requests_total{model_name=\"");
            label_value(b, s->model);
            kiln_sbuf_printf(b, "\",version=\"%" PRId64 "\",outcome=\"%s\"} %" PRIu64 "\n",
                             s->version, k ? "error" : "ok",
                             (uint64_t)(k ? atomic_load(&s->err) : atomic_load(&s->ok)));
        }
    }
    pthread_mutex_lock(&r->mu);
    kiln_sbuf_puts(b, "# TYPE kiln_rollout_weight gauge\n");
    rtable *t = table_enter(r);
    for (int i = 0; t && i < t->n; i++)
        for (int k = 0; k < t->e[i].n; k++) {
            kiln_sbuf_puts(b, "kiln_rollout_weight{model_name=\"");
            label_value(b, t->e[i].model);
            kiln_sbuf_printf(b, "\",version=\"%" PRId64 "\"} %.6g\n", t->e[i].version[k],
                             t->e[i].weight[k]);
        }
    table_leave(r);
    kiln_sbuf_puts(b, "# TYPE kiln_rollout_step gauge\n");
    for (int i = 0; i < r->n_models; i++) {
        kiln_sbuf_puts(b, "kiln_rollout_step{model_name=\"");
        label_value(b, r->models[i].model);
        kiln_sbuf_printf(b, "\"} %g\n", step_percent(&r->models[i]));
    }
    kiln_sbuf_puts(b, "# TYPE kiln_rollout_state gauge\n");
    for (int i = 0; i < r->n_models; i++)
        for (int s = 0; s < ST_N; s++) {
            kiln_sbuf_puts(b, "kiln_rollout_state{model_name=\"");
            label_value(b, r->models[i].model);
            kiln_sbuf_printf(b, "\",state=\"%s\"} %d\n", state_names[s], r->models[i].state == (rstate)s);
        }
    kiln_sbuf_puts(b, "# TYPE kiln_rollout_events_total counter\n");
    for (int i = 0; i < r->n_events; i++)
        for (int e = 0; e < EV_N; e++) {
            kiln_sbuf_puts(b, "kiln_rollout_events_total{model_name=\"");
            label_value(b, r->events[i].model);
            kiln_sbuf_printf(b, "\",event=\"%s\"} %" PRIu64 "\n", event_names[e], r->events[i].n[e]);
        }
    pthread_mutex_unlock(&r->mu);
}

/* ------------------------------------------------------------ admin endpoints */

static void reply_json(kiln_http_reply *rep, int code)
{
    rep->code = code;
    rep->status = code == 200 ? "OK" : "FAILED_PRECONDITION";
    rep->content_type = "application/json";
}

static void admin(void *ctx, kiln_server *s, const kiln_http_request *req, kiln_http_reply *rep)
{
    kiln_rollout *r = ctx;
    rep->api = "rollout";
    const char *p = req->path + strlen("/v1/rollouts");
    int get = strcmp(req->method, "GET") == 0, post = strcmp(req->method, "POST") == 0;
    if (!get && !post) {
        kiln_reply_error(rep, "UNIMPLEMENTED", "Method not allowed");
        rep->code = 405;
        return;
    }
    int denied = kiln_server_authorize(s, req, post ? "admin" : "metadata");
    if (denied) {
        kiln_reply_error(rep, denied == 401 ? "UNAUTHENTICATED" : "PERMISSION_DENIED",
                         post ? "rollout control needs the admin scope (a token with it, or a "
                                "request from loopback)"
                              : "not authorized");
        rep->code = denied;
        return;
    }
    if ((*p == '\0' || strcmp(p, "/") == 0) && get) {
        kiln_rollout_write_json(r, &rep->body);
        reply_json(rep, 200);
        return;
    }
    if (*p != '/') {
        kiln_reply_error(rep, "NOT_FOUND", "Not found");
        return;
    }
    p++;
    char model[128];
    size_t n = strcspn(p, ":/");
    if (n == 0 || n >= sizeof model || p[n] == '/') {
        kiln_reply_error(rep, "NOT_FOUND", "Malformed rollout path: /v1/rollouts/MODEL[:action]");
        return;
    }
    memcpy(model, p, n);
    model[n] = '\0';
    snprintf(rep->model, sizeof rep->model, "%s", model);
    const char *action = p[n] == ':' ? p + n + 1 : NULL;
    if ((get && action) || (post && !action)) {
        kiln_reply_error(rep, "INVALID_ARGUMENT",
                         "GET /v1/rollouts/MODEL, or POST /v1/rollouts/MODEL:pause|:resume|"
                         ":promote|:rollback");
        return;
    }
    pthread_mutex_lock(&r->mu);
    mstate *m = NULL;
    for (int i = 0; i < r->n_models; i++)
        if (strcmp(r->models[i].model, model) == 0) m = &r->models[i];
    char msg[600];
    if (!m) {
        pthread_mutex_unlock(&r->mu);
        snprintf(msg, sizeof msg, "no rollout for model '%.128s' in the rollout file", model);
        kiln_reply_error(rep, "NOT_FOUND", msg);
        return;
    }
    if (post) {
        int active = m->state == ST_PROGRESSING || m->state == ST_PAUSED;
        const char *bad = NULL;
        if (!m->mr->canary) bad = "has a static split, not a canary";
        else if (m->controlled) bad = "is controlled by kiln rollout-controller (change it there)";
        else if (strcmp(action, "pause") == 0) {
            if (m->state != ST_PROGRESSING) bad = "is not progressing";
            else {
                m->state = ST_PAUSED;
                snprintf(m->status, sizeof m->status, "paused at step %d (%g%%) by an operator",
                         m->step + 1, m->steps[m->step]);
                emit(r, m, EV_PAUSE, "paused by an operator");
            }
        } else if (strcmp(action, "resume") == 0) {
            if (m->state != ST_PAUSED) bad = "is not paused";
            else {
                m->state = ST_PROGRESSING;
                m->window_open = 0; /* a fresh window */
                emit(r, m, EV_RESUME, "resumed by an operator");
                evaluate(r, m);
            }
        } else if (strcmp(action, "promote") == 0) {
            if (!active) bad = "is neither progressing nor paused";
            else {
                avail_ctx a;
                list_available(r, m->model, &a);
                if (!resolve_canary(r, m, &a)) bad = "has no available candidate";
                else do_promote(r, m, "promoted by an operator");
            }
        } else if (strcmp(action, "rollback") == 0) {
            if (!active) bad = "is neither progressing nor paused";
            else do_rollback(r, m, "rolled back by an operator");
        } else {
            pthread_mutex_unlock(&r->mu);
            snprintf(msg, sizeof msg, "unknown rollout action '%.60s' (pause, resume, promote, "
                                      "rollback)", action);
            kiln_reply_error(rep, "INVALID_ARGUMENT", msg);
            return;
        }
        if (bad) {
            snprintf(msg, sizeof msg, "cannot %.20s: the rollout of '%.128s' %s (state %s)", action,
                     model, bad, state_names[m->state]);
            pthread_mutex_unlock(&r->mu);
            kiln_reply_error(rep, "FAILED_PRECONDITION", msg);
            rep->code = 409;
            return;
        }
        republish(r);
        persist(r);
    }
    write_model_json(r, m, &rep->body);
    pthread_mutex_unlock(&r->mu);
    reply_json(rep, 200);
}

void kiln_rollout_set_pairs(kiln_rollout *r, kiln_rollout_pairs_fn fn, void *ctx)
{
    pthread_mutex_lock(&r->mu);
    r->pairs_fn = fn;
    r->pairs_ctx = ctx;
    pthread_mutex_unlock(&r->mu);
}

void kiln_rollout_set_drift(kiln_rollout *r, kiln_rollout_drift_fn fn, void *ctx)
{
    pthread_mutex_lock(&r->mu);
    r->drift_fn = fn;
    r->drift_ctx = ctx;
    pthread_mutex_unlock(&r->mu);
}
