/*
 * shadow.c - shadow traffic (shadow.h): the predict path's observer that
 * copies a sampled fraction of a model's successful requests into a
 * bounded queue, the worker thread that runs them on the shadow target and
 * compares the outputs (compare.c), the statistics kept per model (a
 * sliding window of KILN_SHADOW_WINDOW_S seconds in buckets, and totals
 * since start), the Prometheus lines and the JSON view (GET /v1/shadow).
 *
 * Each shadowed model is an entry with its own queue: `size` slots, a
 * stack of free slots and a ring of ready ones. A request's after hook
 * takes a free slot under the queue mutex, fills it with the lock released
 * (only the configuration's read lock is held, so a reload waits for it),
 * then marks it ready. The worker swaps a ready slot's contents with its
 * own spare slot, so it runs with nothing borrowed from the queue and a
 * reload may free queues at any moment it holds the write lock. A finished
 * comparison is recorded only if the entry it came from still exists with
 * the same generation (the same target, mode and output).
 */
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np: a reload is not starved by readers */
#include "serve/shadow/shadow.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "kiln/kiln_util.h"
#include "serve/shadow/compare.h"

#define SHADOW_NAME_MAX 256      /* model, output, input and signature names */
#define SHADOW_MAX_INPUTS 16     /* inputs copied per request */
#define SHADOW_BUCKET_S 5        /* the window's bucket width */
#define SHADOW_BUCKETS (KILN_SHADOW_WINDOW_S / SHADOW_BUCKET_S)
#define SHADOW_RECENT 16         /* per-request comparisons kept for the JSON view */
#define LAT_BUCKETS 72           /* added latency: 0.05 us * 2^(i/4), then overflow */
#define LAT_BASE_US 0.05
#define SHADOW_ALIGN 64
#define SHADOW_SLOT_BYTES 4096   /* a slot's buffer before any request grows it */
#define SHADOW_WORKER_NICE 10    /* the worker yields the CPU to primary requests */

_Static_assert(KILN_SHADOW_WINDOW_S % SHADOW_BUCKET_S == 0, "window is whole buckets");

/* A tensor copied into a slot: its bytes are at buf + off. Strings are
 * stored as a uint64 length and the bytes, element after element. */
typedef struct shadow_tensor {
    char name[SHADOW_NAME_MAX];
    kiln_dtype dtype;
    int rank;
    int64_t dims[KILN_MAX_RANK];
    size_t off, nbytes;
} shadow_tensor;

/* One queued request: the primary's inputs and compared output. */
typedef struct shadow_slot {
    int n_in;
    shadow_tensor in[SHADOW_MAX_INPUTS];
    shadow_tensor out;
    char signature[SHADOW_NAME_MAX];
    int64_t primary_version;
    unsigned char *buf;            /* owned; grows, never shrinks */
    size_t cap;
} shadow_slot;

typedef struct window_bucket {
    int64_t epoch;                 /* time / SHADOW_BUCKET_S of its data */
    kiln_shadow_stats st;
} window_bucket;

typedef struct recent_result {
    int64_t primary_version, target_version;
    kiln_shadow_stats st;
} recent_result;

/* One shadowed model. Configuration fields are written only under the
 * write lock; queue fields under q_mu; statistics under stats_mu. */
typedef struct shadow_entry {
    char model[SHADOW_NAME_MAX];
    char target_model[SHADOW_NAME_MAX];
    int64_t target_version;        /* -1: by label or the highest served */
    char target_label[SHADOW_NAME_MAX];
    char target_desc[3 * SHADOW_NAME_MAX]; /* "m", "m/versions/2", "m/labels/l" */
    char output[SHADOW_NAME_MAX];  /* "" = the primary's first output */
    kiln_shadow_compare_mode mode;
    double fraction;
    uint64_t generation;
    /* queue (q_mu) */
    int size;
    shadow_slot *slots;
    int *free_idx, n_free;         /* stack of free slots */
    int *ready, ready_head, n_ready; /* ring of ready slots, oldest first */
    int filling;                   /* slots being filled by after hooks */
    atomic_int full;               /* n_free == 0, read without q_mu: a full queue
                                      drops without taking the mutex */
    atomic_llong bytes;            /* capacity of the buffers in the slots */
    /* counters (atomics, since the after hook holds no mutex) */
    atomic_llong seen, sampled, dropped;
    atomic_llong lat[LAT_BUCKETS + 1];
    atomic_llong lat_count;
    /* statistics (stats_mu) */
    int64_t compared, failed;
    kiln_shadow_stats total;
    window_bucket window[SHADOW_BUCKETS];
    recent_result recent[SHADOW_RECENT];
    int64_t n_recent;
    char last_error[KILN_SHADOW_ERR_LEN];
} shadow_entry;

struct kiln_shadow {
    kiln_manager *mgr;
    pthread_rwlock_t cfg;          /* entries and their configuration */
    shadow_entry **entries;
    int n_entries;
    atomic_int any;                /* n_entries > 0: the after hook's fast exit */
    uint64_t next_generation;
    pthread_mutex_t q_mu;          /* every queue, and pending */
    pthread_cond_t q_cv;
    int pending;                   /* ready slots over all entries */
    int stop;
    int rr;                        /* round robin over entries */
    pthread_mutex_t stats_mu;
    pthread_t worker;
    shadow_slot spare;             /* the worker's own slot */
};

/* ------------------------------------------------------------ helpers */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A per-thread xorshift64* generator, seeded from the thread's address
 * space and the clock: the sample is drawn without a lock. */
static double uniform01(void)
{
    static _Thread_local uint64_t s;
    if (s == 0) {
        s = (uint64_t)(uintptr_t)&s ^ (uint64_t)(now_s() * 1e9) ^ 0x9e3779b97f4a7c15ull;
        if (s == 0) s = 1;
    }
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return (double)((s * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

static void copy_name(char *dst, const char *src)
{
    snprintf(dst, SHADOW_NAME_MAX, "%s", src ? src : "");
}

static shadow_entry *find_entry(kiln_shadow *sh, const char *model)
{
    for (int i = 0; i < sh->n_entries; i++) /* NULL: taken over during an apply */
        if (sh->entries[i] && strcmp(sh->entries[i]->model, model) == 0) return sh->entries[i];
    return NULL;
}

static void free_queue(shadow_entry *e)
{
    for (int i = 0; i < e->size; i++) free(e->slots ? e->slots[i].buf : NULL);
    free(e->slots);
    free(e->free_idx);
    free(e->ready);
    e->slots = NULL;
    e->free_idx = e->ready = NULL;
    e->size = e->n_free = e->n_ready = e->ready_head = 0;
    atomic_store(&e->bytes, 0);
}

/* Allocate size empty slots, all free. */
static kiln_status alloc_queue(shadow_entry *e, int size)
{
    e->slots = calloc((size_t)size, sizeof *e->slots);
    e->free_idx = calloc((size_t)size, sizeof *e->free_idx);
    e->ready = calloc((size_t)size, sizeof *e->ready);
    if (!e->slots || !e->free_idx || !e->ready) {
        free(e->slots);
        free(e->free_idx);
        free(e->ready);
        e->slots = NULL;
        e->free_idx = e->ready = NULL;
        return KILN_ERR_OUT_OF_MEMORY;
    }
    e->size = size;
    for (int i = 0; i < size; i++) {
        e->free_idx[i] = size - 1 - i;
        /* room for a small request up front, so the first ones do not
         * allocate on the request path (a failure only defers it) */
        e->slots[i].buf = malloc(SHADOW_SLOT_BYTES);
        e->slots[i].cap = e->slots[i].buf ? SHADOW_SLOT_BYTES : 0;
        atomic_fetch_add(&e->bytes, (long long)e->slots[i].cap);
    }
    e->n_free = size;
    e->n_ready = e->ready_head = 0;
    return KILN_OK;
}

static void free_entry(shadow_entry *e)
{
    if (!e) return;
    free_queue(e);
    free(e);
}

/* ------------------------------------------------------------ the after hook */

#define RESERVE_OOM ((size_t)-1)
#define RESERVE_OVER ((size_t)-2)

/* Make room for n more bytes at *len (aligned), growing the slot's buffer
 * within the model's KILN_SHADOW_QUEUE_BYTES; the offset of the room, or
 * RESERVE_OOM (out of memory) or RESERVE_OVER (past the bound). */
static size_t slot_reserve(shadow_entry *e, shadow_slot *sl, size_t *len, size_t n)
{
    size_t off = (*len + SHADOW_ALIGN - 1) & ~(size_t)(SHADOW_ALIGN - 1);
    if (n > KILN_SHADOW_QUEUE_BYTES || off + n > KILN_SHADOW_QUEUE_BYTES) return RESERVE_OVER;
    if (off + n > sl->cap) {
        size_t cap = sl->cap ? sl->cap : SHADOW_SLOT_BYTES;
        while (cap < off + n) cap *= 2;
        long long grow = (long long)(cap - sl->cap);
        if (atomic_fetch_add(&e->bytes, grow) + grow > (long long)KILN_SHADOW_QUEUE_BYTES) {
            atomic_fetch_sub(&e->bytes, grow);
            return RESERVE_OVER;
        }
        unsigned char *nb = realloc(sl->buf, cap);
        if (!nb) {
            atomic_fetch_sub(&e->bytes, grow);
            return RESERVE_OOM;
        }
        sl->buf = nb;
        sl->cap = cap;
    }
    *len = off + n;
    return off;
}

/* Copy tensor t named name into slot tensor st: 1, 0 on failure, -1 past
 * the model's queue memory bound. */
static int slot_put(shadow_entry *e, shadow_slot *sl, size_t *len, shadow_tensor *st,
                    const char *name, const kiln_tensor *t)
{
    if (strlen(name) >= SHADOW_NAME_MAX || t->rank > KILN_MAX_RANK) return 0;
    copy_name(st->name, name);
    st->dtype = t->dtype;
    st->rank = t->rank;
    memcpy(st->dims, t->dims, sizeof st->dims);
    size_t n = t->nbytes;
    int64_t count = kiln_tensor_count(t);
    if (t->dtype == KILN_DTYPE_STRING) {
        n = 0;
        for (int64_t i = 0; i < count; i++) n += 8 + ((const kiln_string *)t->data)[i].len;
    }
    size_t off = slot_reserve(e, sl, len, n);
    if (off == RESERVE_OVER) return -1;
    if (off == RESERVE_OOM) return 0;
    st->off = off;
    st->nbytes = n;
    if (t->dtype != KILN_DTYPE_STRING) {
        if (n) memcpy(sl->buf + off, t->data, n);
        return 1;
    }
    unsigned char *w = sl->buf + off;
    for (int64_t i = 0; i < count; i++) {
        const kiln_string *s = &((const kiln_string *)t->data)[i];
        uint64_t l = s->len;
        memcpy(w, &l, 8);
        if (l) memcpy(w + 8, s->data, l);
        w += 8 + l;
    }
    return 1;
}

/* Fill slot sl from observation o; the compared output is e->output or the
 * first. 1; 0 (with a reason) when the request cannot be shadowed; -1 when
 * its copy would pass the model's queue memory bound (a drop). */
static int slot_fill(shadow_entry *e, shadow_slot *sl, const kiln_observation *o,
                     const char **why)
{
    const kiln_signature *sig = kiln_model_signature(o->sv->model, o->si);
    if (!sig || o->n_inputs > SHADOW_MAX_INPUTS || o->out->n < 1) {
        *why = "the request has no outputs or more inputs than a shadow copies (16)";
        return 0;
    }
    int oi = 0;
    if (e->output[0]) {
        for (oi = 0; oi < o->out->n; oi++)
            if (strcmp(o->out->names[oi], e->output) == 0) break;
        if (oi == o->out->n) {
            *why = "the primary has no output named by shadow.output";
            return 0;
        }
    }
    size_t len = 0;
    copy_name(sl->signature, kiln_signature_name(sig));
    sl->primary_version = o->sv->version;
    sl->n_in = o->n_inputs;
    for (int i = 0; i < o->n_inputs; i++) {
        const kiln_value_info *vi = kiln_signature_input(sig, i);
        int r = slot_put(e, sl, &len, &sl->in[i], vi ? vi->name : "", o->inputs[i]);
        if (r <= 0) {
            *why = "out of memory, or a name or rank too large, copying an input";
            return r;
        }
    }
    int r = slot_put(e, sl, &len, &sl->out, o->out->names[oi], o->out->t[oi]);
    if (r <= 0) *why = "out of memory, or a name or rank too large, copying the output";
    return r;
}

static void record_failure(kiln_shadow *sh, shadow_entry *e, const char *msg)
{
    pthread_mutex_lock(&sh->stats_mu);
    e->failed++;
    snprintf(e->last_error, sizeof e->last_error, "%s", msg);
    pthread_mutex_unlock(&sh->stats_mu);
}

static int lat_bucket(double us)
{
    if (!(us > LAT_BASE_US)) return 0;
    double b = ceil(4.0 * log2(us / LAT_BASE_US));
    return b >= LAT_BUCKETS ? LAT_BUCKETS : (int)b;
}

static double lat_upper(int i)
{
    return LAT_BASE_US * exp2((double)i / 4.0);
}

static void shadow_after(void *ctx, const kiln_observation *o)
{
    kiln_shadow *sh = ctx;
    if (!atomic_load_explicit(&sh->any, memory_order_relaxed) || !o->out) return;
    double t0 = kiln_observe_now_us();
    pthread_rwlock_rdlock(&sh->cfg);
    shadow_entry *e = find_entry(sh, o->model);
    if (!e) {
        pthread_rwlock_unlock(&sh->cfg);
        return;
    }
    /* a request the target version itself answered has nothing to be
     * compared with (a canary's candidate shadowing its own traffic) */
    if (e->target_version >= 0 && o->sv->version == e->target_version &&
        strcmp(e->target_model[0] ? e->target_model : e->model, o->model) == 0) {
        pthread_rwlock_unlock(&sh->cfg);
        return;
    }
    atomic_fetch_add_explicit(&e->seen, 1, memory_order_relaxed);
    if (e->fraction > 0.0 && (e->fraction >= 1.0 || uniform01() < e->fraction)) {
        atomic_fetch_add_explicit(&e->sampled, 1, memory_order_relaxed);
        int idx = -1;
        if (!atomic_load_explicit(&e->full, memory_order_relaxed)) {
            pthread_mutex_lock(&sh->q_mu);
            if (e->n_free > 0) {
                idx = e->free_idx[--e->n_free];
                e->filling++;
            }
            atomic_store_explicit(&e->full, e->n_free == 0, memory_order_relaxed);
            pthread_mutex_unlock(&sh->q_mu);
        }
        if (idx < 0) {
            atomic_fetch_add_explicit(&e->dropped, 1, memory_order_relaxed);
        } else {
            const char *why = NULL;
            int ok = slot_fill(e, &e->slots[idx], o, &why);
            pthread_mutex_lock(&sh->q_mu);
            e->filling--;
            if (ok > 0) {
                e->ready[(e->ready_head + e->n_ready++) % e->size] = idx;
                sh->pending++;
                pthread_cond_signal(&sh->q_cv);
            } else {
                e->free_idx[e->n_free++] = idx;
                atomic_store_explicit(&e->full, 0, memory_order_relaxed);
            }
            pthread_mutex_unlock(&sh->q_mu);
            if (ok == 0) record_failure(sh, e, why);
            if (ok < 0) atomic_fetch_add_explicit(&e->dropped, 1, memory_order_relaxed);
        }
    }
    double us = kiln_observe_now_us() - t0;
    atomic_fetch_add_explicit(&e->lat[lat_bucket(us)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->lat_count, 1, memory_order_relaxed);
    pthread_rwlock_unlock(&sh->cfg);
}

/* ------------------------------------------------------------ the worker */

/* What the worker needs of an entry, copied under the read lock. */
typedef struct shadow_job {
    char model[SHADOW_NAME_MAX];
    char target_model[SHADOW_NAME_MAX];
    int64_t target_version;
    char target_label[SHADOW_NAME_MAX];
    kiln_shadow_compare_mode mode;
    uint64_t generation;
} shadow_job;

/* A runtime tensor for a slot tensor: numeric ones borrow the slot's
 * bytes, strings are copied. NULL when out of memory. */
static kiln_tensor *slot_tensor(shadow_slot *sl, const shadow_tensor *st)
{
    kiln_tensor *t = NULL;
    if (st->dtype != KILN_DTYPE_STRING) {
        if (kiln_tensor_wrap(st->dtype, st->rank, st->dims, sl->buf + st->off, st->nbytes, &t) !=
            KILN_OK)
            return NULL;
        return t;
    }
    if (kiln_tensor_create(st->dtype, st->rank, st->dims, &t) != KILN_OK) return NULL;
    const unsigned char *r = sl->buf + st->off;
    int64_t count = kiln_tensor_count(t);
    for (int64_t i = 0; i < count; i++) {
        uint64_t l;
        memcpy(&l, r, 8);
        if (kiln_tensor_set_string(t, (size_t)i, (const char *)r + 8, (size_t)l) != KILN_OK) {
            kiln_tensor_free(t);
            return NULL;
        }
        r += 8 + l;
    }
    return t;
}

/* Run job's target on slot sl and compare; KILN_OK with *st, else err. */
static kiln_status run_job(kiln_shadow *sh, const shadow_job *job, shadow_slot *sl,
                           kiln_shadow_stats *st, int64_t *target_version, char *err)
{
    char merr[KILN_JSON_ERR_LEN];
    const char *code = "NOT_FOUND";
    const char *tm = job->target_model[0] ? job->target_model : job->model;
    kiln_servable *tsv = kiln_manager_acquire(sh->mgr, tm, job->target_version,
                                              job->target_label[0] ? job->target_label : NULL,
                                              merr, &code);
    if (!tsv) {
        snprintf(err, KILN_SHADOW_ERR_LEN, "target: %.400s", merr);
        return KILN_ERR_NOT_FOUND;
    }
    *target_version = tsv->version;
    kiln_status rst = KILN_ERR_INVALID_ARGUMENT;
    kiln_tensor *in[SHADOW_MAX_INPUTS] = {0};
    kiln_tensor *primary = NULL;
    kiln_batch_result res = {0, NULL, NULL};
    int have_res = 0;
    int si = kiln_servable_find_signature(tsv, sl->signature);
    if (si < 0) si = kiln_servable_find_signature(tsv, NULL);
    const kiln_signature *sig = si >= 0 ? kiln_model_signature(tsv->model, si) : NULL;
    if (!sig) {
        snprintf(err, KILN_SHADOW_ERR_LEN, "target %.150s version %" PRId64
                 " has neither signature '%.200s' nor a default one", tm, tsv->version,
                 sl->signature);
        goto out;
    }
    int n = kiln_signature_input_count(sig);
    if (n > SHADOW_MAX_INPUTS) {
        snprintf(err, KILN_SHADOW_ERR_LEN, "target %.200s has %d inputs, more than the shadow copies",
                 tm, n);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        const char *name = kiln_signature_input(sig, i)->name;
        int j = 0;
        while (j < sl->n_in && strcmp(sl->in[j].name, name) != 0) j++;
        if (j == sl->n_in && n == sl->n_in) j = i; /* renamed inputs: by position */
        if (j == sl->n_in) {
            snprintf(err, KILN_SHADOW_ERR_LEN,
                     "target %.200s has an input '%.200s' the primary's request lacks", tm, name);
            goto out;
        }
        if (!(in[i] = slot_tensor(sl, &sl->in[j]))) {
            snprintf(err, KILN_SHADOW_ERR_LEN, "out of memory");
            rst = KILN_ERR_OUT_OF_MEMORY;
            goto out;
        }
    }
    rst = kiln_servable_run(tsv, si, in, n, 0, &res, merr, &code);
    if (rst != KILN_OK) {
        snprintf(err, KILN_SHADOW_ERR_LEN, "target %.150s version %" PRId64 " failed (%.40s): %.250s", tm,
                 tsv->version, code, merr);
        goto out;
    }
    have_res = 1;
    int oi = 0;
    while (oi < res.n && strcmp(res.names[oi], sl->out.name) != 0) oi++;
    if (oi == res.n) oi = 0; /* a student's output may be named differently */
    if (res.n < 1 || !(primary = slot_tensor(sl, &sl->out))) {
        snprintf(err, KILN_SHADOW_ERR_LEN, "target %.200s returned no outputs", tm);
        rst = KILN_ERR_INVALID_ARGUMENT;
        goto out;
    }
    rst = kiln_shadow_compare(job->mode, primary, res.t[oi], st, merr, sizeof merr);
    if (rst != KILN_OK)
        snprintf(err, KILN_SHADOW_ERR_LEN, "output '%.80s' against target %.80s's '%.80s': %.200s",
                 sl->out.name, tm, res.names[oi], merr);
out:
    for (int i = 0; i < SHADOW_MAX_INPUTS; i++) kiln_tensor_free(in[i]);
    kiln_tensor_free(primary);
    if (have_res) kiln_batch_result_free(&res);
    kiln_servable_release(tsv);
    return rst;
}

static void record_result(kiln_shadow *sh, shadow_entry *e, const kiln_shadow_stats *st,
                          int64_t primary_version, int64_t target_version)
{
    int64_t epoch = (int64_t)(now_s() / SHADOW_BUCKET_S);
    pthread_mutex_lock(&sh->stats_mu);
    e->compared++;
    kiln_shadow_stats_add(&e->total, st);
    window_bucket *w = &e->window[epoch % SHADOW_BUCKETS];
    if (w->epoch != epoch) {
        memset(&w->st, 0, sizeof w->st);
        w->epoch = epoch;
    }
    kiln_shadow_stats_add(&w->st, st);
    recent_result *r = &e->recent[e->n_recent++ % SHADOW_RECENT];
    r->primary_version = primary_version;
    r->target_version = target_version;
    r->st = *st;
    pthread_mutex_unlock(&sh->stats_mu);
}

static void *worker_main(void *arg)
{
    kiln_shadow *sh = arg;
    /* a shadow run must not take CPU time from the primary's requests: the
     * worker thread (only it) runs at a lower priority; failure is harmless */
    (void)setpriority(PRIO_PROCESS, (id_t)gettid(), SHADOW_WORKER_NICE);
    for (;;) {
        pthread_mutex_lock(&sh->q_mu);
        while (!sh->stop && sh->pending == 0) pthread_cond_wait(&sh->q_cv, &sh->q_mu);
        int stop = sh->stop;
        pthread_mutex_unlock(&sh->q_mu);
        if (stop) break;
        /* take the oldest ready slot of the next entry that has one */
        shadow_job job;
        int found = 0;
        pthread_rwlock_rdlock(&sh->cfg);
        pthread_mutex_lock(&sh->q_mu);
        for (int k = 0; k < sh->n_entries && !found; k++) {
            shadow_entry *e = sh->entries[(sh->rr + k) % sh->n_entries];
            if (e->n_ready == 0) continue;
            int idx = e->ready[e->ready_head];
            e->ready_head = (e->ready_head + 1) % e->size;
            e->n_ready--;
            sh->pending--;
            shadow_slot tmp = e->slots[idx];
            atomic_fetch_add(&e->bytes, (long long)sh->spare.cap - (long long)tmp.cap);
            e->slots[idx] = sh->spare;
            sh->spare = tmp;
            e->free_idx[e->n_free++] = idx;
            atomic_store_explicit(&e->full, 0, memory_order_relaxed);
            sh->rr = (sh->rr + k + 1) % sh->n_entries;
            memcpy(job.model, e->model, sizeof job.model);
            memcpy(job.target_model, e->target_model, sizeof job.target_model);
            memcpy(job.target_label, e->target_label, sizeof job.target_label);
            job.target_version = e->target_version;
            job.mode = e->mode;
            job.generation = e->generation;
            found = 1;
        }
        if (!found) sh->pending = 0; /* a reload dropped them */
        pthread_mutex_unlock(&sh->q_mu);
        pthread_rwlock_unlock(&sh->cfg);
        if (!found) continue;

        kiln_shadow_stats st;
        char err[KILN_SHADOW_ERR_LEN];
        int64_t tv = -1;
        kiln_status rst = run_job(sh, &job, &sh->spare, &st, &tv, err);

        pthread_rwlock_rdlock(&sh->cfg);
        shadow_entry *e = find_entry(sh, job.model);
        if (e && e->generation == job.generation) {
            if (rst == KILN_OK) record_result(sh, e, &st, sh->spare.primary_version, tv);
            else record_failure(sh, e, err);
        }
        pthread_rwlock_unlock(&sh->cfg);
    }
    return NULL;
}

/* ------------------------------------------------------------ lifecycle */

kiln_status kiln_shadow_create(kiln_manager *mgr, kiln_shadow **out)
{
    *out = NULL;
    kiln_shadow *sh = calloc(1, sizeof *sh);
    if (!sh) return KILN_ERR_OUT_OF_MEMORY;
    sh->mgr = mgr;
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&sh->cfg, &ra);
    pthread_rwlockattr_destroy(&ra);
    pthread_mutex_init(&sh->q_mu, NULL);
    pthread_cond_init(&sh->q_cv, NULL);
    pthread_mutex_init(&sh->stats_mu, NULL);
    sh->next_generation = 1;
    if (pthread_create(&sh->worker, NULL, worker_main, sh) != 0) {
        pthread_mutex_destroy(&sh->stats_mu);
        pthread_cond_destroy(&sh->q_cv);
        pthread_mutex_destroy(&sh->q_mu);
        pthread_rwlock_destroy(&sh->cfg);
        free(sh);
        return KILN_ERR_RUNTIME;
    }
    *out = sh;
    return KILN_OK;
}

void kiln_shadow_free(kiln_shadow *sh)
{
    if (!sh) return;
    pthread_mutex_lock(&sh->q_mu);
    sh->stop = 1;
    pthread_cond_broadcast(&sh->q_cv);
    pthread_mutex_unlock(&sh->q_mu);
    pthread_join(sh->worker, NULL);
    for (int i = 0; i < sh->n_entries; i++) free_entry(sh->entries[i]);
    free(sh->entries);
    free(sh->spare.buf);
    pthread_mutex_destroy(&sh->stats_mu);
    pthread_cond_destroy(&sh->q_cv);
    pthread_mutex_destroy(&sh->q_mu);
    pthread_rwlock_destroy(&sh->cfg);
    free(sh);
}

/* ------------------------------------------------------------ configuration */

/* Check one model's shadow block and fill the configuration of e. */
static kiln_status parse_block(const KilnRollout__ModelRollout *mr, shadow_entry *e, char *err)
{
    const KilnRollout__Shadow *s = mr->shadow;
    const char *m = mr->model_name ? mr->model_name : "";
    if (!m[0]) {
        snprintf(err, KILN_SHADOW_ERR_LEN, "model_rollouts: a shadow block needs model_name");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    const char *fields[] = {m, s->target_model, s->target_label, s->output};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (fields[i] && strlen(fields[i]) >= SHADOW_NAME_MAX) {
            snprintf(err, KILN_SHADOW_ERR_LEN, "model_rollouts '%.100s': shadow: the name "
                     "'%.60s...' is longer than %d bytes", m, fields[i], SHADOW_NAME_MAX - 1);
            return KILN_ERR_INVALID_ARGUMENT;
        }
    if (!(s->fraction >= 0.0 && s->fraction <= 1.0)) {
        snprintf(err, KILN_SHADOW_ERR_LEN,
                 "model_rollouts '%.200s': shadow.fraction %g is outside [0, 1]", m, s->fraction);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (s->queue_size < 0 || s->queue_size > KILN_SHADOW_QUEUE_MAX) {
        snprintf(err, KILN_SHADOW_ERR_LEN,
                 "model_rollouts '%.200s': shadow.queue_size %d is outside [0, %d] (0: %d)", m,
                 (int)s->queue_size, KILN_SHADOW_QUEUE_MAX, KILN_SHADOW_QUEUE_DEFAULT);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (s->target_version < 0) {
        snprintf(err, KILN_SHADOW_ERR_LEN,
                 "model_rollouts '%.200s': shadow.target_version %" PRId64 " is negative", m,
                 (int64_t)s->target_version);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (s->target_version > 0 && s->target_label && s->target_label[0]) {
        snprintf(err, KILN_SHADOW_ERR_LEN, "model_rollouts '%.200s': shadow sets both "
                 "target_version and target_label; give one", m);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    int mode = kiln_shadow_compare_mode_parse(s->compare);
    if (mode < 0) {
        snprintf(err, KILN_SHADOW_ERR_LEN, "model_rollouts '%.200s': shadow.compare '%.100s' is "
                 "not one of auto, class, probabilities, values", m, s->compare);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    copy_name(e->model, m);
    copy_name(e->target_model, s->target_model);
    copy_name(e->target_label, s->target_label);
    copy_name(e->output, s->output);
    e->target_version = s->target_version > 0 ? s->target_version : -1;
    e->mode = (kiln_shadow_compare_mode)mode;
    e->fraction = s->fraction;
    e->size = s->queue_size > 0 ? s->queue_size : KILN_SHADOW_QUEUE_DEFAULT;
    const char *tm = e->target_model[0] ? e->target_model : e->model;
    if (e->target_label[0])
        snprintf(e->target_desc, sizeof e->target_desc, "%s/labels/%s", tm, e->target_label);
    else if (e->target_version > 0)
        snprintf(e->target_desc, sizeof e->target_desc, "%s/versions/%" PRId64, tm,
                 e->target_version);
    else snprintf(e->target_desc, sizeof e->target_desc, "%s", tm);
    return KILN_OK;
}

/* The statistics carry over when the target, mode and output stay. */
static int same_comparison(const shadow_entry *a, const shadow_entry *b)
{
    return strcmp(a->target_desc, b->target_desc) == 0 && a->mode == b->mode &&
           strcmp(a->output, b->output) == 0;
}

kiln_status kiln_shadow_apply(kiln_shadow *sh, const KilnRollout__RolloutConfig *cfg, char *err)
{
    int n = 0;
    size_t nm = cfg ? cfg->n_model_rollouts : 0;
    kiln_status st = KILN_OK;
    shadow_entry **next = calloc(nm ? nm : 1, sizeof *next);
    if (!next) goto err_oom;
    /* check everything and build the new entries, each with a queue */
    for (size_t i = 0; i < nm; i++) {
        const KilnRollout__ModelRollout *mr = cfg->model_rollouts[i];
        if (!mr || !mr->shadow) continue;
        shadow_entry *e = calloc(1, sizeof *e);
        if (!e) goto err_oom;
        next[n++] = e;
        st = parse_block(mr, e, err);
        if (st != KILN_OK) goto err_free;
        for (int j = 0; j < n - 1; j++)
            if (strcmp(next[j]->model, e->model) == 0) {
                snprintf(err, KILN_SHADOW_ERR_LEN,
                         "model_rollouts '%.200s' has a shadow block twice", e->model);
                st = KILN_ERR_INVALID_ARGUMENT;
                goto err_free;
            }
        int size = e->size;
        e->size = 0;
        if (alloc_queue(e, size) != KILN_OK) goto err_oom;
    }

    /* swap them in: no after hook and no worker holds the read lock now */
    pthread_rwlock_wrlock(&sh->cfg);
    pthread_mutex_lock(&sh->q_mu);
    for (int i = 0; i < n; i++) {
        shadow_entry *e = next[i], *old = find_entry(sh, e->model);
        if (old && same_comparison(old, e)) {
            /* the same comparison: keep its statistics, and its queue unless
             * the size changes (then what was waiting is dropped) */
            old->fraction = e->fraction;
            if (old->size != e->size) {
                atomic_fetch_add(&old->dropped, old->n_ready);
                sh->pending -= old->n_ready;
                free_queue(old);
                old->slots = e->slots;
                old->free_idx = e->free_idx;
                old->ready = e->ready;
                old->size = e->size;
                old->n_free = e->n_free;
                atomic_store(&old->full, 0);
                atomic_store(&old->bytes, atomic_load(&e->bytes));
                e->slots = NULL;
                e->free_idx = e->ready = NULL;
                e->size = 0;
            }
            free_entry(e);
            next[i] = old;
            for (int j = 0; j < sh->n_entries; j++)
                if (sh->entries[j] == old) sh->entries[j] = NULL; /* kept */
        } else {
            e->generation = sh->next_generation++;
        }
    }
    for (int j = 0; j < sh->n_entries; j++) { /* replaced or no longer configured */
        if (!sh->entries[j]) continue;
        sh->pending -= sh->entries[j]->n_ready;
        free_entry(sh->entries[j]);
    }
    if (sh->pending < 0) sh->pending = 0;
    free(sh->entries);
    sh->entries = next;
    sh->n_entries = n;
    sh->rr = 0;
    atomic_store(&sh->any, n > 0);
    pthread_mutex_unlock(&sh->q_mu);
    pthread_rwlock_unlock(&sh->cfg);
    return KILN_OK;

err_oom:
    snprintf(err, KILN_SHADOW_ERR_LEN, "out of memory applying the shadow configuration");
    st = KILN_ERR_OUT_OF_MEMORY;
err_free:
    for (int i = 0; i < n; i++) free_entry(next[i]);
    free(next);
    return st;
}

kiln_status kiln_shadow_apply_file(kiln_shadow *sh, const char *path, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, KILN_SHADOW_ERR_LEN, "%.300s: cannot open", path);
        return KILN_ERR_IO;
    }
    size_t cap = 4096, len = 0;
    char *text = malloc(cap);
    while (text) {
        if (len == cap) {
            if (cap >= ((size_t)64 << 20)) break; /* a rollout file is small */
            char *nt = realloc(text, cap * 2);
            if (!nt) {
                free(text);
                text = NULL;
                break;
            }
            text = nt;
            cap *= 2;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    int bad = ferror(f) || (text && len == cap);
    fclose(f);
    if (!text || bad) {
        free(text);
        snprintf(err, KILN_SHADOW_ERR_LEN, "%.300s: read error, too large or out of memory", path);
        return KILN_ERR_IO;
    }
    ProtobufCMessage *msg = NULL;
    kiln_status st = kiln_textproto_parse(&kiln_rollout__rollout_config__descriptor, text, len, &msg);
    free(text);
    if (st != KILN_OK) {
        snprintf(err, KILN_SHADOW_ERR_LEN, "%.200s: %.300s", path, kiln_last_error());
        return KILN_ERR_INVALID_ARGUMENT;
    }
    st = kiln_shadow_apply(sh, (const KilnRollout__RolloutConfig *)msg, err);
    protobuf_c_message_free_unpacked(msg, NULL);
    return st;
}

/* ------------------------------------------------------------ reporting */

static void put_label(kiln_sbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') kiln_sbuf_put(b, "\\", 1);
        if (*s == '\n') continue;
        kiln_sbuf_put(b, s, 1);
    }
}

/* The window's sums (stats_mu held). */
static void window_sum(const shadow_entry *e, kiln_shadow_stats *w)
{
    int64_t epoch = (int64_t)(now_s() / SHADOW_BUCKET_S);
    memset(w, 0, sizeof *w);
    for (int i = 0; i < SHADOW_BUCKETS; i++)
        if (e->window[i].epoch > epoch - SHADOW_BUCKETS && e->window[i].epoch <= epoch)
            kiln_shadow_stats_add(w, &e->window[i].st);
}

/* Quantile q of the added latency (us), interpolated within its bucket as
 * Prometheus' histogram_quantile does; NAN without samples. */
static double lat_quantile(shadow_entry *e, double q)
{
    long long counts[LAT_BUCKETS + 1], total = 0;
    for (int i = 0; i <= LAT_BUCKETS; i++) total += counts[i] = atomic_load(&e->lat[i]);
    if (total == 0) return NAN;
    double rank = q * (double)total, cum = 0.0;
    for (int i = 0; i <= LAT_BUCKETS; i++) {
        if (cum + (double)counts[i] >= rank && counts[i] > 0) {
            if (i == LAT_BUCKETS) return lat_upper(LAT_BUCKETS);
            double lo = i ? lat_upper(i - 1) : 0.0, hi = lat_upper(i);
            return lo + (hi - lo) * (rank - cum) / (double)counts[i];
        }
        cum += (double)counts[i];
    }
    return lat_upper(LAT_BUCKETS);
}

static int queue_depth(kiln_shadow *sh, shadow_entry *e)
{
    pthread_mutex_lock(&sh->q_mu);
    int d = e->n_ready + e->filling;
    pthread_mutex_unlock(&sh->q_mu);
    return d;
}

static void metric_head(kiln_sbuf *b, const char *name, const char *type, const char *help)
{
    kiln_sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void metric_labels(kiln_sbuf *b, const char *name, const shadow_entry *e, int target)
{
    kiln_sbuf_printf(b, "%s{model_name=\"", name);
    put_label(b, e->model);
    if (target) {
        kiln_sbuf_puts(b, "\",target=\"");
        put_label(b, e->target_desc);
    }
    kiln_sbuf_puts(b, "\"");
}

static void shadow_write_metrics(void *ctx, kiln_sbuf *b)
{
    kiln_shadow *sh = ctx;
    pthread_rwlock_rdlock(&sh->cfg);
    if (sh->n_entries == 0) {
        pthread_rwlock_unlock(&sh->cfg);
        return;
    }
    /* w[i]: entry i's window, w[n + i]: its totals since start */
    kiln_shadow_stats *w = calloc((size_t)sh->n_entries * 2, sizeof *w);
    int64_t *done = calloc((size_t)sh->n_entries * 2, sizeof *done);
    if (!w || !done) {
        free(w);
        free(done);
        pthread_rwlock_unlock(&sh->cfg);
        return;
    }
    pthread_mutex_lock(&sh->stats_mu);
    for (int i = 0; i < sh->n_entries; i++) {
        window_sum(sh->entries[i], &w[i]);
        w[sh->n_entries + i] = sh->entries[i]->total;
        done[2 * i] = sh->entries[i]->compared;
        done[2 * i + 1] = sh->entries[i]->failed;
    }
    pthread_mutex_unlock(&sh->stats_mu);

    metric_head(b, "kiln_shadow_requests_total", "counter",
                "Sampled requests by what became of their shadow run.");
    for (int i = 0; i < sh->n_entries; i++) {
        shadow_entry *e = sh->entries[i];
        const char *outcome[] = {"compared", "dropped", "failed"};
        long long v[] = {(long long)done[2 * i], (long long)atomic_load(&e->dropped),
                         (long long)done[2 * i + 1]};
        for (int k = 0; k < 3; k++) {
            metric_labels(b, "kiln_shadow_requests_total", e, 1);
            kiln_sbuf_printf(b, ",outcome=\"%s\"} %lld\n", outcome[k], v[k]);
        }
    }
    metric_head(b, "kiln_shadow_queue_depth", "gauge", "Shadow runs waiting in the queue.");
    for (int i = 0; i < sh->n_entries; i++) {
        metric_labels(b, "kiln_shadow_queue_depth", sh->entries[i], 0);
        kiln_sbuf_printf(b, "} %d\n", queue_depth(sh, sh->entries[i]));
    }
    static const struct {
        const char *name, *help;
    } gauges[] = {
        {"kiln_shadow_top1_agreement", "Share of rows whose top-1 class agrees (window)."},
        {"kiln_shadow_mean_abs_diff", "Mean absolute difference of output values (window)."},
        {"kiln_shadow_mean_rel_diff", "Mean of |s-p|/max(|s|,|p|) over output values (window)."},
        {"kiln_shadow_js_divergence",
         "Mean Jensen-Shannon divergence (nats) of probability rows (window)."},
    };
    for (int g = 0; g < 4; g++) {
        metric_head(b, gauges[g].name, "gauge", gauges[g].help);
        for (int i = 0; i < sh->n_entries; i++) {
            const kiln_shadow_stats *s = &w[i];
            int64_t den = g == 0 ? s->top1_rows : g == 3 ? s->js_rows : s->values;
            if (den == 0) continue; /* nothing to say yet: no series */
            double num = g == 0 ? (double)s->top1_agree : g == 1 ? s->sum_abs
                         : g == 2 ? s->sum_rel : s->sum_js;
            metric_labels(b, gauges[g].name, sh->entries[i], 1);
            kiln_sbuf_printf(b, "} %.9g\n", num / (double)den);
        }
    }
    /* Counters of the paired rows, for gates judged across replicas (kiln
     * rollout-controller takes their increase() summed over the fleet). */
    static const struct {
        const char *name, *help;
    } counters[] = {
        {"kiln_shadow_top1_rows_total", "Rows with a top-1 on both sides, since start."},
        {"kiln_shadow_top1_agree_total", "Rows whose top-1 agrees, since start."},
        {"kiln_shadow_js_rows_total", "Probability rows compared, since start."},
        {"kiln_shadow_js_sum_total", "Sum of their Jensen-Shannon divergences (nats), since start."},
        {"kiln_shadow_js_sq_sum_total", "Sum of the squares of those divergences, since start."},
    };
    for (int g = 0; g < 5; g++) {
        metric_head(b, counters[g].name, "counter", counters[g].help);
        for (int i = 0; i < sh->n_entries; i++) {
            const kiln_shadow_stats *s = &w[sh->n_entries + i];
            double v = g == 0 ? (double)s->top1_rows : g == 1 ? (double)s->top1_agree
                       : g == 2 ? (double)s->js_rows : g == 3 ? s->sum_js : s->sum_js2;
            metric_labels(b, counters[g].name, sh->entries[i], 1);
            kiln_sbuf_printf(b, "} %.17g\n", v);
        }
    }
    metric_head(b, "kiln_shadow_added_latency_us", "gauge",
                "p99 of the time the shadow adds to a primary request (us, since start).");
    for (int i = 0; i < sh->n_entries; i++) {
        double p99 = lat_quantile(sh->entries[i], 0.99);
        if (isnan(p99)) continue;
        metric_labels(b, "kiln_shadow_added_latency_us", sh->entries[i], 0);
        kiln_sbuf_printf(b, "} %.6g\n", p99);
    }
    pthread_rwlock_unlock(&sh->cfg);
    free(w);
    free(done);
}

static void json_ratio(kiln_sbuf *b, const char *key, double num, int64_t den)
{
    if (den > 0) kiln_sbuf_printf(b, "\"%s\": %.9g", key, num / (double)den);
    else kiln_sbuf_printf(b, "\"%s\": null", key);
}

static void json_stats(kiln_sbuf *b, const kiln_shadow_stats *s)
{
    kiln_sbuf_printf(b, "{\"requests\": %lld, \"rows\": %lld, \"top1_rows\": %lld, ",
                     (long long)s->requests, (long long)s->rows, (long long)s->top1_rows);
    json_ratio(b, "top1_agreement", (double)s->top1_agree, s->top1_rows);
    kiln_sbuf_printf(b, ", \"values\": %lld, ", (long long)s->values);
    json_ratio(b, "mean_abs_diff", s->sum_abs, s->values);
    kiln_sbuf_puts(b, ", ");
    json_ratio(b, "mean_rel_diff", s->sum_rel, s->values);
    kiln_sbuf_printf(b, ", \"max_abs_diff\": %.9g, \"nonfinite_mismatches\": %lld, "
                        "\"js_rows\": %lld, ",
                     s->max_abs, (long long)s->nonfinite, (long long)s->js_rows);
    json_ratio(b, "js_divergence", s->sum_js, s->js_rows);
    kiln_sbuf_printf(b, ", \"non_probability_rows\": %lld}", (long long)s->nonprob_rows);
}

static void json_entry(kiln_shadow *sh, shadow_entry *e, kiln_sbuf *b)
{
    kiln_sbuf_puts(b, "{\"model_name\": ");
    kiln_sbuf_json_string(b, e->model, strlen(e->model));
    kiln_sbuf_puts(b, ", \"target\": ");
    kiln_sbuf_json_string(b, e->target_desc, strlen(e->target_desc));
    kiln_sbuf_printf(b, ", \"fraction\": %.9g, \"compare\": \"%s\", \"output\": ", e->fraction,
                     kiln_shadow_compare_mode_name(e->mode));
    kiln_sbuf_json_string(b, e->output, strlen(e->output));
    kiln_sbuf_printf(b, ", \"queue_size\": %d, \"queue_depth\": %d, \"window_seconds\": %d",
                     e->size, queue_depth(sh, e), KILN_SHADOW_WINDOW_S);
    double p50 = lat_quantile(e, 0.5), p99 = lat_quantile(e, 0.99);
    kiln_sbuf_printf(b, ", \"added_latency_us\": {\"count\": %lld, ",
                     (long long)atomic_load(&e->lat_count));
    if (isnan(p50)) kiln_sbuf_puts(b, "\"p50\": null, \"p99\": null}");
    else kiln_sbuf_printf(b, "\"p50\": %.6g, \"p99\": %.6g}", p50, p99);
    pthread_mutex_lock(&sh->stats_mu);
    kiln_sbuf_printf(b, ", \"requests\": {\"seen\": %lld, \"sampled\": %lld, \"compared\": %lld, "
                        "\"dropped\": %lld, \"failed\": %lld}",
                     (long long)atomic_load(&e->seen), (long long)atomic_load(&e->sampled),
                     (long long)e->compared, (long long)atomic_load(&e->dropped),
                     (long long)e->failed);
    kiln_shadow_stats w;
    window_sum(e, &w);
    kiln_sbuf_puts(b, ", \"window\": ");
    json_stats(b, &w);
    kiln_sbuf_puts(b, ", \"since_start\": ");
    json_stats(b, &e->total);
    kiln_sbuf_puts(b, ", \"last_error\": ");
    if (e->last_error[0]) kiln_sbuf_json_string(b, e->last_error, strlen(e->last_error));
    else kiln_sbuf_puts(b, "null");
    kiln_sbuf_puts(b, ", \"recent\": [");
    int64_t n = e->n_recent < SHADOW_RECENT ? e->n_recent : SHADOW_RECENT;
    for (int64_t i = 0; i < n; i++) { /* newest first */
        const recent_result *r = &e->recent[(e->n_recent - 1 - i) % SHADOW_RECENT];
        kiln_sbuf_printf(b, "%s{\"primary_version\": %" PRId64 ", \"target_version\": %" PRId64
                            ", \"stats\": ",
                         i ? ", " : "", r->primary_version, r->target_version);
        json_stats(b, &r->st);
        kiln_sbuf_puts(b, "}");
    }
    kiln_sbuf_puts(b, "]}");
    pthread_mutex_unlock(&sh->stats_mu);
}

kiln_status kiln_shadow_write_json(kiln_shadow *sh, const char *model, kiln_sbuf *b, char *err)
{
    pthread_rwlock_rdlock(&sh->cfg);
    if (model) {
        shadow_entry *e = find_entry(sh, model);
        if (!e) {
            pthread_rwlock_unlock(&sh->cfg);
            snprintf(err, KILN_SHADOW_ERR_LEN, "model '%.200s' has no shadow", model);
            return KILN_ERR_NOT_FOUND;
        }
        json_entry(sh, e, b);
        kiln_sbuf_puts(b, "\n");
    } else {
        kiln_sbuf_puts(b, "{\"shadows\": [");
        for (int i = 0; i < sh->n_entries; i++) {
            if (i) kiln_sbuf_puts(b, ",\n ");
            json_entry(sh, sh->entries[i], b);
        }
        kiln_sbuf_puts(b, "]}\n");
    }
    pthread_rwlock_unlock(&sh->cfg);
    return KILN_OK;
}

kiln_status kiln_shadow_get_stats(kiln_shadow *sh, const char *model, kiln_shadow_stats *window,
                                  kiln_shadow_stats *total, int64_t outcomes[3])
{
    pthread_rwlock_rdlock(&sh->cfg);
    shadow_entry *e = find_entry(sh, model);
    if (!e) {
        pthread_rwlock_unlock(&sh->cfg);
        return KILN_ERR_NOT_FOUND;
    }
    pthread_mutex_lock(&sh->stats_mu);
    if (window) window_sum(e, window);
    if (total) *total = e->total;
    if (outcomes) {
        outcomes[0] = e->compared;
        outcomes[1] = atomic_load(&e->dropped);
        outcomes[2] = e->failed;
    }
    pthread_mutex_unlock(&sh->stats_mu);
    pthread_rwlock_unlock(&sh->cfg);
    return KILN_OK;
}

kiln_observer kiln_shadow_observer(kiln_shadow *sh)
{
    kiln_observer o = {"shadow", sh, NULL, shadow_after, shadow_write_metrics, NULL};
    return o;
}
