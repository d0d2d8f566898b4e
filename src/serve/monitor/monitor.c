/*
 * monitor.c - the monitoring observer of `kiln serve` (monitor.h).
 *
 * State per model version (struct mon_version), built under the monitor's
 * lock the first time a version is observed and published in a fixed
 * table that requests scan without a lock. Each version's window is a
 * ring of sub_windows slots of window_seconds / sub_windows seconds: a
 * slot holds the bin counts of every feature and the confidence sums of
 * the probability output for its time span. The window and the cumulative
 * counters (anomalies, confidence histograms; Prometheus counters and
 * histograms) are kept in MON_SHARDS shards, each with its own lock, slots
 * and stamps on cache lines of its own; a request thread picks a shard
 * once (round robin, thread-local) and adds to the current slot of its
 * shard (clearing it first when its span is new), so the request threads
 * do not contend on one lock or one cache line. The metrics page sums the
 * shards' slots whose span is within the window (a shard whose slot holds
 * an older span adds nothing for it). Rejections (rare) are counted under
 * the version's lock. Every array is sized from the profile at that first
 * observation; requests never allocate. The numeric column features of a
 * float32 rank-2 input are binned a row at a time by a bin plan built
 * then (binplan.h); the rest value by value (observe_feature).
 */
#include "serve/monitor/monitor.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "serve/batch.h"
#include "serve/manager.h"
#include "serve/monitor/binplan.h"
#include "serve/monitor/profile.h"

enum {
    ANOM_MISSING = KILN_MON_ANOM_MISSING, /* the order binplan.c counts in */
    ANOM_NAN = KILN_MON_ANOM_NAN,
    ANOM_INF = KILN_MON_ANOM_INF,
    ANOM_RANGE = KILN_MON_ANOM_RANGE,
    ANOM_KINDS = KILN_MON_ANOM_KINDS
};
static const char *const anom_names[ANOM_KINDS] = {"missing", "nan", "inf", "out_of_range"};
enum { CONF_MAXP, CONF_MARGIN, CONF_ENTROPY, CONF_KINDS };
#define CONF_SLOTS (KILN_MON_CONF_BUCKETS + 1) /* the last is +Inf */
#define MON_SHARDS 8 /* window copies per version: request threads spread over them */
#define MON_LINE 64  /* cache line */
#define MON_MAX_PLANS 64 /* inputs with a bin plan (binplan.h) per version */

/* One request thread's share of a version's window and counters. */
typedef struct mon_shard {
    _Alignas(MON_LINE) pthread_mutex_t mu; /* guards the shard (contended only by the metrics page) */
    int64_t *stamp;             /* [slot] the span (now / sub_len) it holds */
    int64_t *bins;              /* [slot][n_bins] */
    double *conf_sum;           /* [slot] sum of max probability */
    int64_t *conf_n;            /* [slot] rows */
    int64_t *anom;              /* [feature][ANOM_KINDS], cumulative */
    int64_t conf_hist[CONF_KINDS][CONF_SLOTS]; /* cumulative, not cumulative over le */
    double conf_hsum[CONF_KINDS];
    int64_t conf_count;
} mon_shard;

typedef struct mon_version {
    char model[256];
    int64_t version;
    char *profile_path;         /* assets.extra/kiln_profile.json of the version */
    int64_t file_sig[3];        /* its mtime (ns), size, inode when read; all -1: absent */
    atomic_int stale;           /* the file changed: rebuilt at the next request */
    struct mon_version *retired; /* the list of replaced states */
    kiln_mon_profile *p;        /* NULL: the version has no profile (not monitored) */
    int si;                     /* the signature monitored (the default one) */
    int *feat_input;            /* [feature] input index in the signature, -1 = absent */
    int *feat_rule;             /* [feature] rule of its input, -1 = none */
    int *rule_input;            /* [rule] input index, -1 = absent */
    int *bin_off;               /* [feature] offset of its counts in a slot */
    int *feat_plan;             /* [feature] its bin plan, -1 = binned one by one */
    int *unplanned;             /* [n_unplanned] the features in no plan */
    int n_unplanned;
    int n_plans;
    int plan_input[MON_MAX_PLANS]; /* input index of each plan */
    kiln_mon_binplan *plan;     /* [n_plans]: numeric column features of one input */
    int n_bins;                 /* counts per slot */
    int has_reject;             /* any rule with action reject */
    int64_t sub_len;            /* seconds per slot */
    mon_shard *shard;           /* [MON_SHARDS], NULL without a profile */
    pthread_mutex_t mu;         /* guards rejections */
    int64_t *rejections;        /* [rule] */
    /* the metrics page's snapshot, the shards summed (under the monitor's metrics lock) */
    int64_t *snap_bins;         /* [n_bins] */
    double snap_conf_sum;
    int64_t snap_conf_n;
    int64_t *snap_anom;         /* [feature][ANOM_KINDS] */
    int64_t snap_conf_hist[CONF_KINDS][CONF_SLOTS];
    double snap_conf_hsum[CONF_KINDS];
    int64_t snap_conf_count;
} mon_version;

/* The shard of the calling thread: assigned round robin at its first request. */
static atomic_uint shard_next;
static _Thread_local int shard_mine = -1;

static int my_shard(void)
{
    if (shard_mine < 0)
        shard_mine = (int)(atomic_fetch_add_explicit(&shard_next, 1, memory_order_relaxed) % MON_SHARDS);
    return shard_mine;
}

/* Zeroed memory starting on a cache line of its own and filling whole lines. */
static void *line_alloc(size_t bytes)
{
    size_t sz = (bytes + MON_LINE - 1) / MON_LINE * MON_LINE;
    if (sz == 0) sz = MON_LINE;
    void *q = aligned_alloc(MON_LINE, sz);
    if (q) memset(q, 0, sz);
    return q;
}

struct kiln_monitor {
    pthread_mutex_t mu;         /* adding and replacing versions */
    mon_version *retired;       /* replaced states, freed with the monitor (mu) */
    pthread_mutex_t metrics_mu; /* one metrics page at a time (the snapshots) */
    atomic_int n;
    _Atomic(mon_version *) v[KILN_MONITOR_MAX_VERSIONS];
    int full_logged;
};

kiln_status kiln_monitor_create(kiln_monitor **out)
{
    kiln_monitor *m = calloc(1, sizeof *m);
    if (!m) return KILN_ERR_OUT_OF_MEMORY;
    pthread_mutex_init(&m->mu, NULL);
    pthread_mutex_init(&m->metrics_mu, NULL);
    *out = m;
    return KILN_OK;
}

static void version_free(mon_version *v)
{
    if (!v) return;
    kiln_mon_profile_free(v->p);
    free(v->feat_input);
    free(v->feat_rule);
    free(v->rule_input);
    free(v->bin_off);
    free(v->feat_plan);
    free(v->unplanned);
    for (int q = 0; q < v->n_plans; q++) kiln_mon_binplan_free(&v->plan[q]);
    free(v->plan);
    if (v->shard) {
        for (int k = 0; k < MON_SHARDS; k++) {
            mon_shard *sh = &v->shard[k];
            free(sh->stamp);
            free(sh->bins);
            free(sh->conf_sum);
            free(sh->conf_n);
            free(sh->anom);
            pthread_mutex_destroy(&sh->mu);
        }
        free(v->shard);
    }
    free(v->rejections);
    free(v->snap_bins);
    free(v->snap_anom);
    free(v->profile_path);
    pthread_mutex_destroy(&v->mu);
    free(v);
}

/* The file's signature (mtime in ns, size, inode; all -1 when absent). */
static void file_signature(const char *path, int64_t sig[3])
{
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        sig[0] = sig[1] = sig[2] = -1;
        return;
    }
    sig[0] = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    sig[1] = (int64_t)st.st_size;
    sig[2] = (int64_t)st.st_ino;
}

void kiln_monitor_refresh(kiln_monitor *m)
{
    pthread_mutex_lock(&m->mu);
    int n = atomic_load(&m->n);
    for (int i = 0; i < n; i++) {
        mon_version *v = atomic_load(&m->v[i]);
        int64_t sig[3];
        file_signature(v->profile_path, sig);
        if (atomic_load(&v->stale) || memcmp(sig, v->file_sig, sizeof sig) == 0) continue;
        atomic_store(&v->stale, 1);
        fprintf(stderr, "kiln serve: monitoring: %s of version %lld of '%s' %s; it is read at "
                        "the version's next request\n",
                KILN_MON_PROFILE_FILE, (long long)v->version, v->model,
                sig[0] < 0 ? "was removed" : "changed");
    }
    pthread_mutex_unlock(&m->mu);
}

void kiln_monitor_free(kiln_monitor *m)
{
    if (!m) return;
    int n = atomic_load(&m->n);
    for (int i = 0; i < n; i++) version_free(atomic_load(&m->v[i]));
    while (m->retired) {
        mon_version *next = m->retired->retired;
        version_free(m->retired);
        m->retired = next;
    }
    pthread_mutex_destroy(&m->mu);
    pthread_mutex_destroy(&m->metrics_mu);
    free(m);
}

static int input_index(const kiln_signature *sig, const char *name)
{
    int n = kiln_signature_input_count(sig);
    for (int i = 0; i < n; i++)
        if (strcmp(kiln_signature_input(sig, i)->name, name) == 0) return i;
    return -1;
}

/* Group the numeric column features of each input into a bin plan
 * (binplan.h), used when the input is float32 of rank 2; 0 when out of memory. */
static int plan_features(mon_version *v)
{
    const kiln_mon_profile *p = v->p;
    int nf = p->n_features;
    v->feat_plan = malloc(((size_t)nf + 1) * sizeof *v->feat_plan);
    v->plan = calloc(MON_MAX_PLANS, sizeof *v->plan);
    v->unplanned = malloc(((size_t)nf + 1) * sizeof *v->unplanned);
    if (!v->feat_plan || !v->plan || !v->unplanned) return 0;
    for (int i = 0; i < nf; i++) v->feat_plan[i] = -1;
    for (int i = 0; i < nf; i++) {
        const kiln_mon_feature *f = &p->features[i];
        int ii = v->feat_input[i];
        if (ii < 0 || f->kind != KILN_MON_NUMERIC || f->column < 0 || v->feat_plan[i] >= 0 ||
            v->n_plans >= MON_MAX_PLANS)
            continue;
        int q = v->n_plans;
        if (!kiln_mon_binplan_init(&v->plan[q], KILN_MON_MAX_BINS - 1)) return 0;
        v->plan_input[q] = ii;
        v->n_plans++;
        for (int j = i; j < nf; j++) { /* this input's numeric column features */
            const kiln_mon_feature *g = &p->features[j];
            if (v->feat_input[j] != ii || g->kind != KILN_MON_NUMERIC || g->column < 0) continue;
            double lo = g->min, hi = g->max;
            if (v->feat_rule[j] >= 0) {
                lo = p->rules[v->feat_rule[j]].min;
                hi = p->rules[v->feat_rule[j]].max;
            }
            if (kiln_mon_binplan_add(&v->plan[q], j, g->column, g->edges, g->n_edges, lo, hi,
                                     v->bin_off[j]))
                v->feat_plan[j] = q;
        }
    }
    for (int i = 0; i < nf; i++)
        if (v->feat_plan[i] < 0) v->unplanned[v->n_unplanned++] = i;
    return 1;
}

/* Read the version's profile and size its state; NULL only when out of
 * memory. A version without a (valid) profile gets a state with p = NULL. */
static mon_version *version_new(kiln_servable *sv)
{
    mon_version *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    pthread_mutex_init(&v->mu, NULL);
    snprintf(v->model, sizeof v->model, "%s", sv->model_name);
    v->version = sv->version;
    v->si = kiln_servable_find_signature(sv, NULL);
    char path[4096];
    snprintf(path, sizeof path, "%s/assets.extra/%s", sv->dir ? sv->dir : ".",
             KILN_MON_PROFILE_FILE);
    v->profile_path = strdup(path); /* NULL when out of memory: never re-read */
    file_signature(v->profile_path, v->file_sig);
    struct stat stt;
    if (v->si < 0 || stat(path, &stt) != 0) return v; /* no profile: not monitored */
    char err[KILN_JSON_ERR_LEN];
    if (kiln_mon_profile_load(path, &v->p, err) != KILN_OK) {
        fprintf(stderr, "kiln serve: monitoring: %s; version %lld of '%s' is not monitored\n", err,
                (long long)sv->version, sv->model_name);
        return v;
    }
    kiln_mon_profile *p = v->p;
    const kiln_signature *sig = kiln_session_signature(sv->sessions[v->si]);
    int nf = p->n_features, nr = p->n_rules, S = p->sub_windows;
    v->feat_input = calloc((size_t)nf + 1, sizeof *v->feat_input);
    v->feat_rule = calloc((size_t)nf + 1, sizeof *v->feat_rule);
    v->bin_off = calloc((size_t)nf + 1, sizeof *v->bin_off);
    v->rule_input = calloc((size_t)nr + 1, sizeof *v->rule_input);
    v->rejections = calloc((size_t)nr + 1, sizeof *v->rejections);
    for (int i = 0; i < nf; i++) {
        v->bin_off[i] = v->n_bins;
        v->n_bins += p->features[i].n_counts;
    }
    v->snap_bins = calloc((size_t)v->n_bins + 1, sizeof *v->snap_bins);
    v->snap_anom = calloc((size_t)nf * ANOM_KINDS + 1, sizeof *v->snap_anom);
    v->shard = line_alloc(MON_SHARDS * sizeof *v->shard);
    int ok = v->feat_input && v->feat_rule && v->bin_off && v->rule_input && v->rejections &&
             v->snap_bins && v->snap_anom && v->shard;
    for (int k = 0; v->shard && k < MON_SHARDS; k++) pthread_mutex_init(&v->shard[k].mu, NULL);
    for (int k = 0; ok && k < MON_SHARDS; k++) {
        mon_shard *sh = &v->shard[k];
        sh->stamp = line_alloc((size_t)S * sizeof *sh->stamp);
        sh->conf_sum = line_alloc((size_t)S * sizeof *sh->conf_sum);
        sh->conf_n = line_alloc((size_t)S * sizeof *sh->conf_n);
        sh->anom = line_alloc((size_t)nf * ANOM_KINDS * sizeof *sh->anom);
        sh->bins = line_alloc((size_t)S * (size_t)v->n_bins * sizeof *sh->bins);
        if (!sh->stamp || !sh->conf_sum || !sh->conf_n || !sh->anom || !sh->bins) ok = 0;
        else for (int s = 0; s < S; s++) sh->stamp[s] = -1000000000;
    }
    if (!ok) {
        version_free(v);
        return NULL;
    }
    for (int r = 0; r < nr; r++) {
        v->rule_input[r] = input_index(sig, p->rules[r].input);
        if (v->rule_input[r] < 0)
            fprintf(stderr, "kiln serve: monitoring: version %lld of '%s': the profile's rule names "
                            "input '%s', which the signature lacks; the rule is ignored\n",
                    (long long)sv->version, sv->model_name, p->rules[r].input);
        if (p->rules[r].reject && v->rule_input[r] >= 0) v->has_reject = 1;
    }
    for (int i = 0; i < nf; i++) {
        v->feat_input[i] = input_index(sig, p->features[i].input);
        v->feat_rule[i] = -1;
        for (int r = 0; r < nr; r++)
            if (strcmp(p->rules[r].input, p->features[i].input) == 0) v->feat_rule[i] = r;
    }
    if (!plan_features(v)) {
        version_free(v);
        return NULL;
    }
    v->sub_len = p->window_seconds / p->sub_windows;
    if (v->sub_len < 1) v->sub_len = 1;
    fprintf(stderr, "kiln serve: monitoring version %lld of '%s': %d features, %d probability "
                    "outputs, %d rules, window %d s in %d slots\n",
            (long long)sv->version, sv->model_name, nf, p->n_outputs, nr, p->window_seconds, S);
    return v;
}

/* The state of the version that ran, building it on first sight; NULL when
 * the table is full or memory ran out. */
static mon_version *lookup(kiln_monitor *m, kiln_servable *sv)
{
    int n = atomic_load_explicit(&m->n, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        mon_version *v = atomic_load_explicit(&m->v[i], memory_order_acquire);
        if (v->version != sv->version || strcmp(v->model, sv->model_name) != 0) continue;
        if (!atomic_load_explicit(&v->stale, memory_order_relaxed)) return v;
        /* its profile changed (kiln_monitor_refresh): a new state replaces it;
         * the old one stays allocated, as a request may still hold it */
        pthread_mutex_lock(&m->mu);
        mon_version *cur = atomic_load(&m->v[i]);
        if (cur == v) {
            mon_version *nv = version_new(sv);
            if (nv) {
                atomic_store_explicit(&m->v[i], nv, memory_order_release);
                v->retired = m->retired;
                m->retired = v;
                cur = nv;
            }
        }
        pthread_mutex_unlock(&m->mu);
        return cur;
    }
    pthread_mutex_lock(&m->mu);
    mon_version *found = NULL;
    n = atomic_load(&m->n);
    for (int i = 0; i < n && !found; i++) {
        mon_version *v = atomic_load(&m->v[i]);
        if (v->version == sv->version && strcmp(v->model, sv->model_name) == 0) found = v;
    }
    if (!found && n < KILN_MONITOR_MAX_VERSIONS) {
        found = version_new(sv);
        if (found) {
            atomic_store_explicit(&m->v[n], found, memory_order_release);
            atomic_store_explicit(&m->n, n + 1, memory_order_release);
        }
    } else if (!found && !m->full_logged) {
        m->full_logged = 1;
        fprintf(stderr, "kiln serve: monitoring: %d model versions seen; later ones are not "
                        "monitored\n", KILN_MONITOR_MAX_VERSIONS);
    }
    pthread_mutex_unlock(&m->mu);
    return found;
}

/* The state monitor_check found for the request this thread is running,
 * taken by the same request's monitor_after (the REST and gRPC `run`
 * functions call both on the request's thread, the servable held between them), so a request looks
 * its version up once. monitor_after clears it; a request that a later
 * observer's check refuses (no after) leaves it, and the thread's next
 * monitor_check replaces it before any monitor_after can read it. A profile
 * refresh between the two retires the state it points at (retired states
 * stay allocated): that one request is counted in the retired state. */
static _Thread_local struct {
    const kiln_monitor *m;
    const kiln_servable *sv;
    mon_version *v;
} checked;

/* Elements of t a feature reads: rows x stride from offset `col`. */
static int feature_span(const kiln_mon_feature *f, const kiln_tensor *t, int64_t *count,
                        int64_t *stride, int64_t *first)
{
    if (f->column >= 0) {
        if (t->rank != 2 || t->dims[1] <= f->column) return 0;
        *count = t->dims[0];
        *stride = t->dims[1];
        *first = f->column;
    } else {
        *count = kiln_tensor_count(t);
        *stride = 1;
        *first = 0;
    }
    return 1;
}

static void observe_feature(mon_version *v, mon_shard *sh, int fi, const kiln_tensor *t,
                            int64_t *slot_bins)
{
    const kiln_mon_feature *f = &v->p->features[fi];
    int64_t n, stride, first;
    if (!feature_span(f, t, &n, &stride, &first)) return;
    int64_t *bins = slot_bins + v->bin_off[fi], *anom = sh->anom + (size_t)fi * ANOM_KINDS;
    if (t->dtype == KILN_DTYPE_STRING) {
        if (f->kind != KILN_MON_CATEGORICAL || !f->strings) return;
        const kiln_string *s = t->data;
        for (int64_t r = 0; r < n; r++) {
            const kiln_string *e = &s[first + r * stride];
            if (e->len == 0) anom[ANOM_MISSING]++;
            else bins[kiln_mon_category_str(f, e->data, e->len)]++;
        }
        return;
    }
    if (!kiln_mon_numeric_dtype(t->dtype) || (f->kind == KILN_MON_CATEGORICAL && f->strings)) return;
    double lo = f->min, hi = f->max;
    if (v->feat_rule[fi] >= 0) {
        lo = v->p->rules[v->feat_rule[fi]].min;
        hi = v->p->rules[v->feat_rule[fi]].max;
    }
    int numeric = f->kind == KILN_MON_NUMERIC;
    if (t->dtype == KILN_DTYPE_F32 && numeric) { /* the common case, without the dtype switch */
        const float *x = (const float *)t->data + first;
        for (int64_t r = 0; r < n; r++) {
            double e = x[r * stride];
            if (isnan(e)) anom[ANOM_NAN]++;
            else if (isinf(e)) anom[ANOM_INF]++;
            else {
                if (e < lo || e > hi) anom[ANOM_RANGE]++;
                bins[kiln_mon_bin(f->edges, f->n_edges, e)]++;
            }
        }
        return;
    }
    for (int64_t r = 0; r < n; r++) {
        double e = kiln_mon_element(t, first + r * stride);
        if (isnan(e)) anom[ANOM_NAN]++;
        else if (isinf(e)) anom[ANOM_INF]++;
        else {
            if (e < lo || e > hi) anom[ANOM_RANGE]++;
            bins[numeric ? kiln_mon_bin(f->edges, f->n_edges, e) : kiln_mon_category_num(f, e)]++;
        }
    }
}

/* Confidence of the profile's first probability output, when it ran. */
static void observe_output(mon_version *v, mon_shard *sh, const kiln_batch_result *out, int slot)
{
    const kiln_mon_output *po = &v->p->outputs[0];
    const kiln_tensor *t = NULL;
    for (int j = 0; j < out->n && !t; j++)
        if (out->names[j] && strcmp(out->names[j], po->name) == 0) t = out->t[j];
    if (!t || t->rank != 2 || t->dims[1] < 2 || t->dims[1] > INT32_MAX ||
        (t->dtype != KILN_DTYPE_F32 && t->dtype != KILN_DTYPE_F64))
        return;
    int c = (int)t->dims[1];
    for (int64_t r = 0; r < t->dims[0]; r++) {
        double x[CONF_KINDS];
        int ok = t->dtype == KILN_DTYPE_F32
                     ? kiln_mon_confidence_f32((const float *)t->data + r * c, c, &x[0], &x[1], &x[2])
                     : kiln_mon_confidence_f64((const double *)t->data + r * c, c, &x[0], &x[1], &x[2]);
        if (!ok) continue;
        for (int k = 0; k < CONF_KINDS; k++) {
            sh->conf_hist[k][kiln_mon_conf_bucket(x[k])]++;
            sh->conf_hsum[k] += x[k];
        }
        sh->conf_count++;
        sh->conf_sum[slot] += x[CONF_MAXP];
        sh->conf_n[slot]++;
    }
}

/* Seconds on kiln_observe_now_us's clock (CLOCK_MONOTONIC), read from its
 * coarse form where there is one: a slot is at least a second, and the
 * coarse clock (a few ms behind) costs no read of the clock source. */
static int64_t now_s(void)
{
#ifdef CLOCK_MONOTONIC_COARSE
    struct timespec t;
    if (clock_gettime(CLOCK_MONOTONIC_COARSE, &t) == 0) return (int64_t)t.tv_sec;
#endif
    return (int64_t)(kiln_observe_now_us() / 1e6);
}

static void monitor_after(void *ctx, const kiln_observation *o)
{
    kiln_monitor *m = ctx;
    int hit = o->sv && checked.m == m && checked.sv == o->sv;
    mon_version *v = hit ? checked.v : NULL;
    checked.m = NULL;
    checked.sv = NULL;
    if (!o->sv || !o->inputs) return;
    if (!hit) v = lookup(m, o->sv);
    if (!v || !v->p || o->si != v->si) return;
    int64_t span = now_s() / v->sub_len;
    int S = v->p->sub_windows, slot = (int)(span % S);
    mon_shard *sh = &v->shard[my_shard()];
    pthread_mutex_lock(&sh->mu); /* uncontended but for a metrics page summing the shards */
    int64_t *slot_bins = sh->bins + (size_t)slot * (size_t)v->n_bins;
    if (sh->stamp[slot] != span) {
        memset(slot_bins, 0, (size_t)v->n_bins * sizeof *slot_bins);
        sh->conf_sum[slot] = 0;
        sh->conf_n[slot] = 0;
        sh->stamp[slot] = span;
    }
    for (int q = 0; q < v->n_plans; q++) {
        const kiln_mon_binplan *bp = &v->plan[q];
        int ii = v->plan_input[q];
        const kiln_tensor *t = ii < o->n_inputs ? o->inputs[ii] : NULL;
        if (!t) continue;
        if (t->dtype == KILN_DTYPE_F32 && t->rank == 2 && t->dims[1] >= bp->min_width)
            kiln_mon_binplan_rows(bp, t->data, t->dims[0], t->dims[1], slot_bins, sh->anom);
        else /* another dtype or shape than the signature's: value by value */
            for (int j = 0; j < bp->n; j++) observe_feature(v, sh, bp->feat[j], t, slot_bins);
    }
    for (int j = 0; j < v->n_unplanned; j++) {
        int i = v->unplanned[j];
        if (v->feat_input[i] >= 0 && v->feat_input[i] < o->n_inputs && o->inputs[v->feat_input[i]])
            observe_feature(v, sh, i, o->inputs[v->feat_input[i]], slot_bins);
    }
    if (o->out && v->p->n_outputs > 0) observe_output(v, sh, o->out, slot);
    pthread_mutex_unlock(&sh->mu);
}

/* The profile's reject rules, before the run. */
static kiln_status monitor_check(void *ctx, const kiln_observation *o, char *err, const char **code)
{
    kiln_monitor *m = ctx;
    checked.m = NULL;
    checked.sv = NULL;
    if (!o->sv || !o->inputs) return KILN_OK;
    mon_version *v = lookup(m, o->sv);
    checked.m = m;
    checked.sv = o->sv;
    checked.v = v;
    if (!v || !v->p || !v->has_reject || o->si != v->si) return KILN_OK;
    for (int r = 0; r < v->p->n_rules; r++) {
        const kiln_mon_rule *rule = &v->p->rules[r];
        int ii = v->rule_input[r];
        if (!rule->reject || ii < 0 || ii >= o->n_inputs || !o->inputs[ii]) continue;
        const kiln_tensor *t = o->inputs[ii];
        if (!kiln_mon_numeric_dtype(t->dtype)) continue;
        int64_t n = kiln_tensor_count(t);
        for (int64_t i = 0; i < n; i++) {
            double e = kiln_mon_element(t, i);
            int bad_nan = isnan(e) && !rule->allow_nan;
            int bad_range = !isnan(e) && (e < rule->min || e > rule->max);
            if (!bad_nan && !bad_range) continue;
            pthread_mutex_lock(&v->mu);
            v->rejections[r]++;
            pthread_mutex_unlock(&v->mu);
            if (bad_nan)
                snprintf(err, KILN_JSON_ERR_LEN,
                         "input '%s': value NaN at element %lld is not allowed (the model's "
                         "validation rule has allow_nan false)", rule->input, (long long)i);
            else
                snprintf(err, KILN_JSON_ERR_LEN,
                         "input '%s': value %.9g at element %lld is outside the model's "
                         "validation range [%.9g, %.9g]", rule->input, e, (long long)i, rule->min,
                         rule->max);
            *code = "INVALID_ARGUMENT";
            return KILN_ERR_INVALID_ARGUMENT;
        }
    }
    return KILN_OK;
}

/* A Prometheus label value, escaped. */
static void label(kiln_sbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\') kiln_sbuf_puts(b, "\\\\");
        else if (*s == '"') kiln_sbuf_puts(b, "\\\"");
        else if (*s == '\n') kiln_sbuf_puts(b, "\\n");
        else kiln_sbuf_put(b, s, 1);
    }
}

static void labels(kiln_sbuf *b, const mon_version *v)
{
    kiln_sbuf_puts(b, "{model_name=\"");
    label(b, v->model);
    kiln_sbuf_printf(b, "\",version=\"%lld\"", (long long)v->version);
}

/* Sum the shards' slots within the window, and their cumulative counters,
 * into the version's snapshot. */
static void snapshot(mon_version *v)
{
    int64_t span = (int64_t)(kiln_observe_now_us() / 1e6) / v->sub_len;
    int S = v->p->sub_windows, na = v->p->n_features * ANOM_KINDS;
    memset(v->snap_bins, 0, (size_t)v->n_bins * sizeof *v->snap_bins);
    memset(v->snap_anom, 0, (size_t)na * sizeof *v->snap_anom);
    memset(v->snap_conf_hist, 0, sizeof v->snap_conf_hist);
    memset(v->snap_conf_hsum, 0, sizeof v->snap_conf_hsum);
    v->snap_conf_sum = 0;
    v->snap_conf_n = 0;
    v->snap_conf_count = 0;
    for (int h = 0; h < MON_SHARDS; h++) {
        mon_shard *sh = &v->shard[h];
        pthread_mutex_lock(&sh->mu);
        for (int s = 0; s < S; s++) {
            if (sh->stamp[s] <= span - S || sh->stamp[s] > span) continue;
            const int64_t *sb = sh->bins + (size_t)s * (size_t)v->n_bins;
            for (int k = 0; k < v->n_bins; k++) v->snap_bins[k] += sb[k];
            v->snap_conf_sum += sh->conf_sum[s];
            v->snap_conf_n += sh->conf_n[s];
        }
        for (int k = 0; k < na; k++) v->snap_anom[k] += sh->anom[k];
        for (int k = 0; k < CONF_KINDS; k++) {
            for (int q = 0; q < CONF_SLOTS; q++) v->snap_conf_hist[k][q] += sh->conf_hist[k][q];
            v->snap_conf_hsum[k] += sh->conf_hsum[k];
        }
        v->snap_conf_count += sh->conf_count;
        pthread_mutex_unlock(&sh->mu);
    }
}

/* A feature's window count and distances from the version's snapshot;
 * returns 0 when it is not reported (too few values, or no such input). */
typedef struct feature_stats {
    int64_t count;
    double psi, js, linf;
    int alert;
} feature_stats;

static int stats_of(const mon_version *v, int fi, feature_stats *st)
{
    const kiln_mon_feature *f = &v->p->features[fi];
    const int64_t *cur = v->snap_bins + v->bin_off[fi];
    memset(st, 0, sizeof *st);
    for (int k = 0; k < f->n_counts; k++) st->count += cur[k];
    if (st->count < v->p->min_count || v->feat_input[fi] < 0) return 0;
    if (f->kind == KILN_MON_NUMERIC) {
        st->psi = kiln_mon_psi(f->counts, cur, f->n_counts);
        st->js = kiln_mon_js(f->counts, cur, f->n_counts);
        st->alert = st->psi > v->p->psi_threshold || st->js > v->p->js_threshold;
    } else {
        st->linf = kiln_mon_linf(f->counts, cur, f->n_counts);
        st->alert = st->linf > v->p->linf_threshold;
    }
    return 1;
}

/* The monitored versions (with a profile) of `model` (NULL: all) into vs. */
static int monitored(kiln_monitor *m, const char *model, mon_version **vs)
{
    int n = atomic_load_explicit(&m->n, memory_order_acquire), nv = 0;
    for (int i = 0; i < n; i++) {
        mon_version *v = atomic_load_explicit(&m->v[i], memory_order_acquire);
        if (v->p && (!model || strcmp(v->model, model) == 0)) vs[nv++] = v;
    }
    return nv;
}

static void monitor_write_json(void *ctx, const char *model, kiln_sbuf *b)
{
    kiln_monitor *m = ctx;
    mon_version *vs[KILN_MONITOR_MAX_VERSIONS];
    pthread_mutex_lock(&m->metrics_mu);
    int nv = monitored(m, model, vs);
    kiln_sbuf_puts(b, "{\"model_name\": ");
    kiln_sbuf_json_string(b, model, strlen(model));
    kiln_sbuf_puts(b, ", \"versions\": [");
    for (int i = 0; i < nv; i++) {
        mon_version *v = vs[i];
        const kiln_mon_profile *p = v->p;
        snapshot(v);
        kiln_sbuf_printf(b, "%s\n  {\"version\": %lld, \"window_seconds\": %d, \"min_count\": %lld, "
                            "\"thresholds\": {\"psi\": %.17g, \"js\": %.17g, \"linf\": %.17g}, "
                            "\"features\": [",
                         i ? "," : "", (long long)v->version, p->window_seconds,
                         (long long)p->min_count, p->psi_threshold, p->js_threshold,
                         p->linf_threshold);
        pthread_mutex_lock(&v->mu);
        for (int fi = 0; fi < p->n_features; fi++) {
            const kiln_mon_feature *f = &p->features[fi];
            feature_stats st;
            int rep = stats_of(v, fi, &st);
            kiln_sbuf_puts(b, fi ? ",\n    {\"name\": " : "\n    {\"name\": ");
            kiln_sbuf_json_string(b, f->name, strlen(f->name));
            kiln_sbuf_printf(b, ", \"kind\": \"%s\", \"window_count\": %lld",
                             f->kind == KILN_MON_NUMERIC ? "numeric" : "categorical",
                             (long long)st.count);
            if (rep && f->kind == KILN_MON_NUMERIC)
                kiln_sbuf_printf(b, ", \"psi\": %.17g, \"js\": %.17g, \"alert\": %s", st.psi,
                                 st.js, st.alert ? "true" : "false");
            else if (rep)
                kiln_sbuf_printf(b, ", \"linf\": %.17g, \"alert\": %s", st.linf,
                                 st.alert ? "true" : "false");
            const int64_t *an = v->snap_anom + (size_t)fi * ANOM_KINDS;
            kiln_sbuf_puts(b, ", \"anomalies\": {");
            for (int k = 0; k < ANOM_KINDS; k++)
                kiln_sbuf_printf(b, "%s\"%s\": %lld", k ? ", " : "", anom_names[k], (long long)an[k]);
            kiln_sbuf_puts(b, "}}");
        }
        kiln_sbuf_puts(b, "],\n   \"confidence\": ");
        if (p->n_outputs == 0) {
            kiln_sbuf_puts(b, "null");
        } else {
            kiln_sbuf_puts(b, "{\"output\": ");
            kiln_sbuf_json_string(b, p->outputs[0].name, strlen(p->outputs[0].name));
            kiln_sbuf_printf(b, ", \"count\": %lld, \"reference_mean_max_probability\": %.17g, "
                                "\"expected_accuracy\": ",
                             (long long)v->snap_conf_count, p->outputs[0].mean_max_probability);
            if (v->snap_conf_n) kiln_sbuf_printf(b, "%.17g", v->snap_conf_sum / (double)v->snap_conf_n);
            else kiln_sbuf_puts(b, "null");
            static const char *const names[CONF_KINDS] = {"max_probability", "margin", "entropy"};
            for (int k = 0; k < CONF_KINDS; k++) {
                kiln_sbuf_printf(b, ", \"%s\": [", names[k]);
                for (int q = 0; q < CONF_SLOTS; q++)
                    kiln_sbuf_printf(b, "%s%lld", q ? ", " : "", (long long)v->snap_conf_hist[k][q]);
                kiln_sbuf_puts(b, "]");
            }
            kiln_sbuf_puts(b, "}");
        }
        kiln_sbuf_puts(b, ",\n   \"rejections\": {");
        int first = 1;
        for (int r = 0; r < p->n_rules; r++) {
            if (!p->rules[r].reject || v->rule_input[r] < 0) continue;
            kiln_sbuf_puts(b, first ? "" : ", ");
            kiln_sbuf_json_string(b, p->rules[r].input, strlen(p->rules[r].input));
            kiln_sbuf_printf(b, ": %lld", (long long)v->rejections[r]);
            first = 0;
        }
        kiln_sbuf_puts(b, "}}");
        pthread_mutex_unlock(&v->mu);
    }
    kiln_sbuf_puts(b, "\n]}\n");
    pthread_mutex_unlock(&m->metrics_mu);
}

static void monitor_write_metrics(void *ctx, kiln_sbuf *b)
{
    kiln_monitor *m = ctx;
    mon_version *vs[KILN_MONITOR_MAX_VERSIONS];
    pthread_mutex_lock(&m->metrics_mu);
    int nv = monitored(m, NULL, vs);
    if (nv == 0) {
        pthread_mutex_unlock(&m->metrics_mu);
        return;
    }
    for (int i = 0; i < nv; i++) snapshot(vs[i]);

    static const char *const drift[] = {"kiln_drift_psi", "kiln_drift_js", "kiln_drift_linf",
                                        "kiln_drift_alert"};
    static const char *const drift_help[] = {
        "Population stability index of a numeric feature's window against the reference profile",
        "Jensen-Shannon distance (base 2) of a numeric feature's window against the reference",
        "L-infinity distance of a categorical feature's window against the reference",
        "1 when a feature's drift is past the profile's threshold"};
    for (int d = 0; d < 4; d++) {
        kiln_sbuf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", drift[d], drift_help[d], drift[d]);
        for (int i = 0; i < nv; i++) {
            mon_version *v = vs[i];
            for (int fi = 0; fi < v->p->n_features; fi++) {
                const kiln_mon_feature *f = &v->p->features[fi];
                feature_stats st;
                if (!stats_of(v, fi, &st)) continue;
                int num = f->kind == KILN_MON_NUMERIC;
                if ((d < 2 && !num) || (d == 2 && num)) continue;
                double val = d == 0 ? st.psi : d == 1 ? st.js : d == 2 ? st.linf : st.alert;
                kiln_sbuf_puts(b, drift[d]);
                labels(b, v);
                kiln_sbuf_puts(b, ",feature=\"");
                label(b, f->name);
                kiln_sbuf_printf(b, "\"} %.17g\n", val);
            }
        }
    }

    /* every profiled feature, judged or not: with kiln_drift_alert it tells
     * a fleet controller "too few values yet" from "no profile" */
    kiln_sbuf_puts(b, "# HELP kiln_drift_window_values Values of a feature in the monitoring window "
                      "(drift is judged from the profile's min_count)\n"
                      "# TYPE kiln_drift_window_values gauge\n");
    for (int i = 0; i < nv; i++) {
        mon_version *v = vs[i];
        for (int fi = 0; fi < v->p->n_features; fi++) {
            feature_stats st;
            stats_of(v, fi, &st);
            kiln_sbuf_puts(b, "kiln_drift_window_values");
            labels(b, v);
            kiln_sbuf_puts(b, ",feature=\"");
            label(b, v->p->features[fi].name);
            kiln_sbuf_printf(b, "\"} %lld\n", (long long)st.count);
        }
    }

    kiln_sbuf_puts(b, "# HELP kiln_feature_anomalies_total Missing, NaN, infinite and out-of-range "
                      "input values per feature\n# TYPE kiln_feature_anomalies_total counter\n");
    for (int i = 0; i < nv; i++) {
        mon_version *v = vs[i];
        for (int fi = 0; fi < v->p->n_features; fi++) {
            if (v->feat_input[fi] < 0) continue;
            for (int k = 0; k < ANOM_KINDS; k++) {
                kiln_sbuf_puts(b, "kiln_feature_anomalies_total");
                labels(b, v);
                kiln_sbuf_puts(b, ",feature=\"");
                label(b, v->p->features[fi].name);
                kiln_sbuf_printf(b, "\",kind=\"%s\"} %lld\n", anom_names[k],
                                 (long long)v->snap_anom[(size_t)fi * ANOM_KINDS + k]);
            }
        }
    }

    static const char *const conf[] = {"kiln_prediction_max_probability", "kiln_prediction_margin",
                                       "kiln_prediction_entropy"};
    static const char *const conf_help[] = {
        "Largest class probability of each prediction",
        "Difference of the two largest class probabilities of each prediction",
        "Entropy of each prediction's class probabilities divided by ln(classes)"};
    for (int k = 0; k < CONF_KINDS; k++) {
        kiln_sbuf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", conf[k], conf_help[k], conf[k]);
        for (int i = 0; i < nv; i++) {
            mon_version *v = vs[i];
            if (v->p->n_outputs == 0) continue;
            int64_t cum = 0;
            for (int s = 0; s < CONF_SLOTS; s++) {
                cum += v->snap_conf_hist[k][s];
                kiln_sbuf_printf(b, "%s_bucket", conf[k]);
                labels(b, v);
                if (s < KILN_MON_CONF_BUCKETS)
                    kiln_sbuf_printf(b, ",le=\"%g\"} %lld\n", (double)(s + 1) / 10.0, (long long)cum);
                else
                    kiln_sbuf_printf(b, ",le=\"+Inf\"} %lld\n", (long long)cum);
            }
            kiln_sbuf_printf(b, "%s_sum", conf[k]);
            labels(b, v);
            kiln_sbuf_printf(b, "} %.17g\n%s_count", v->snap_conf_hsum[k], conf[k]);
            labels(b, v);
            kiln_sbuf_printf(b, "} %lld\n", (long long)v->snap_conf_count);
        }
    }

    kiln_sbuf_puts(b, "# HELP kiln_expected_accuracy Mean max probability over the window: the "
                      "expected accuracy if the probabilities are calibrated\n"
                      "# TYPE kiln_expected_accuracy gauge\n");
    for (int i = 0; i < nv; i++) {
        mon_version *v = vs[i];
        if (v->p->n_outputs == 0 || v->snap_conf_n == 0) continue;
        kiln_sbuf_puts(b, "kiln_expected_accuracy");
        labels(b, v);
        kiln_sbuf_printf(b, "} %.17g\n", v->snap_conf_sum / (double)v->snap_conf_n);
    }

    kiln_sbuf_puts(b, "# HELP kiln_validation_rejections_total Requests refused by a validation "
                      "rule of the profile\n# TYPE kiln_validation_rejections_total counter\n");
    for (int i = 0; i < nv; i++) {
        mon_version *v = vs[i];
        pthread_mutex_lock(&v->mu);
        for (int r = 0; r < v->p->n_rules; r++) {
            if (!v->p->rules[r].reject || v->rule_input[r] < 0) continue;
            kiln_sbuf_puts(b, "kiln_validation_rejections_total");
            labels(b, v);
            kiln_sbuf_puts(b, ",feature=\"");
            label(b, v->p->rules[r].input);
            kiln_sbuf_printf(b, "\"} %lld\n", (long long)v->rejections[r]);
        }
        pthread_mutex_unlock(&v->mu);
    }
    pthread_mutex_unlock(&m->metrics_mu);
}

kiln_observer kiln_monitor_observer(kiln_monitor *m)
{
    kiln_observer o;
    memset(&o, 0, sizeof o);
    o.name = "monitor";
    o.ctx = m;
    o.check = monitor_check;
    o.after = monitor_after;
    o.write_metrics = monitor_write_metrics;
    o.write_json = monitor_write_json;
    return o;
}

int kiln_monitor_drift(kiln_monitor *m, const char *model, int64_t version, char *what, size_t n)
{
    mon_version *vs[KILN_MONITOR_MAX_VERSIONS];
    int result = -2; /* no profile, until the version is found */
    double worst = -1.0;
    if (what && n) what[0] = '\0';
    pthread_mutex_lock(&m->metrics_mu); /* the snapshot buffers are shared with the metrics page */
    int nv = monitored(m, model, vs);
    for (int i = 0; i < nv; i++) {
        mon_version *v = vs[i];
        if (v->version != version) continue;
        result = -1;
        snapshot(v);
        for (int fi = 0; fi < v->p->n_features; fi++) {
            feature_stats st;
            if (!stats_of(v, fi, &st)) continue;
            if (result < 0) result = 0;
            if (!st.alert) continue;
            result++;
            const kiln_mon_feature *f = &v->p->features[fi];
            int num = f->kind == KILN_MON_NUMERIC;
            /* how far past its threshold, to name the farthest feature */
            double far = num ? fmax(st.psi / v->p->psi_threshold, st.js / v->p->js_threshold)
                             : st.linf / v->p->linf_threshold;
            if (far > worst && what && n) {
                worst = far;
                if (num)
                    snprintf(what, n, "feature '%s': PSI %.3g (threshold %.3g), JS %.3g (threshold "
                             "%.3g) over %lld values", f->name, st.psi, v->p->psi_threshold, st.js,
                             v->p->js_threshold, (long long)st.count);
                else
                    snprintf(what, n, "feature '%s': L-infinity %.3g (threshold %.3g) over %lld "
                             "values", f->name, st.linf, v->p->linf_threshold, (long long)st.count);
            }
        }
        break;
    }
    pthread_mutex_unlock(&m->metrics_mu);
    return result;
}
