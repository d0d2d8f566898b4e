/*
 * batch.c - dynamic batching (see batch.h): a queue of open batches per
 * (servable, signature), worker threads that close and run them, and the
 * merge / pad / split of tensors along dimension 0.
 *
 * A caller's task points at its input tensors and its result slot; it sits
 * in one batch until a worker has run the batch and filled every task's
 * result, then the worker wakes the callers. A new task joins the oldest
 * queued batch it fits (rows left, same non-batch dimensions); one that fits
 * none opens a new batch at the tail, which closes the batches before it
 * (a worker takes the head at once when another batch waits behind it).
 * Locking: one mutex per batcher guards the queue and the tasks' done
 * flags; tensors are copied and runs happen with no lock held.
 */
#include "serve/batch.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ statistics */

#define SIZE_BUCKETS 15      /* 1, 2, 4, ... 16384 rows: Exponential(1, 2, 15) */
#define LATENCY_BUCKETS 52   /* µs: Exponential(100, 1.2, 52), TF's queuing_latency */

typedef struct histogram {
    uint64_t bucket[LATENCY_BUCKETS + 1]; /* last one is +Inf */
    double sum;
    uint64_t count;
} histogram;

/* Kiln's per model version batching series. */
#define VERSION_SERIES 64
typedef struct version_series {
    char model[128];
    int64_t version;
    histogram queuing;        /* µs from enqueue to the batch's run */
    histogram size;           /* rows per run, padding included */
    histogram padding;        /* padding rows per run */
    uint64_t padded_elements; /* elements added by pad_variable_length_inputs */
    uint64_t expired;         /* requests dropped: deadline passed while queued */
    uint64_t cancelled;       /* requests dropped: cancelled by their caller while queued */
} version_series;

struct kiln_batch_stats {
    pthread_mutex_t mu;
    version_series series[VERSION_SERIES]; /* the last one collects any overflow */
    int n_series;
    histogram input_size;     /* rows per request */
    histogram processed_size; /* rows per run, padding included */
    histogram padding;        /* padding rows per run */
    histogram queuing;        /* µs from enqueue to the batch's run */
    uint64_t runs;            /* batches run */
    uint64_t queue_full;      /* requests refused with UNAVAILABLE */
};

static double size_limit(int i) { return ldexp(1.0, i); }
static double latency_limit(int i) { return 100.0 * pow(1.2, i); }

static void hist_add(histogram *h, int n, double (*limit)(int), double v)
{
    int i = 0;
    while (i < n && v > limit(i)) i++;
    h->bucket[i]++;
    h->sum += v;
    h->count++;
}

static void hist_write(kiln_sbuf *b, const char *name, const char *labels, const histogram *h,
                       int n, double (*limit)(int), int type_line)
{
    if (type_line) kiln_sbuf_printf(b, "# TYPE %s histogram\n", name);
    uint64_t cum = 0;
    for (int i = 0; i < n; i++) {
        cum += h->bucket[i];
        kiln_sbuf_printf(b, "%s_bucket{%s%sle=\"%.9g\"} %" PRIu64 "\n", name, labels,
                         *labels ? "," : "", limit(i), cum);
    }
    cum += h->bucket[n];
    kiln_sbuf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %" PRIu64 "\n", name, labels,
                     *labels ? "," : "", cum);
    kiln_sbuf_printf(b, "%s_sum{%s} %.17g\n%s_count{%s} %" PRIu64 "\n", name, labels, h->sum, name,
                     labels, h->count);
}

kiln_batch_stats *kiln_batch_stats_create(void)
{
    kiln_batch_stats *s = calloc(1, sizeof *s);
    if (s) pthread_mutex_init(&s->mu, NULL);
    return s;
}

void kiln_batch_stats_free(kiln_batch_stats *s)
{
    if (!s) return;
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void kiln_batch_stats_write(kiln_batch_stats *s, kiln_sbuf *b)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    const char *p = ":tensorflow:serving:batching_session:";
    char name[128];
    snprintf(name, sizeof name, "%squeuing_latency", p);
    hist_write(b, name, "thread_pool_name=\"model_server_batch_threads\"", &s->queuing,
               LATENCY_BUCKETS, latency_limit, 1);
    snprintf(name, sizeof name, "%sinput_batch_size", p);
    hist_write(b, name, "", &s->input_size, SIZE_BUCKETS, size_limit, 1);
    snprintf(name, sizeof name, "%sprocessed_batch_size", p);
    hist_write(b, name, "", &s->processed_size, SIZE_BUCKETS, size_limit, 1);
    snprintf(name, sizeof name, "%spadding_size", p);
    hist_write(b, name, "", &s->padding, SIZE_BUCKETS, size_limit, 1);
    kiln_sbuf_printf(b, "# TYPE %swrapped_run_count counter\n%swrapped_run_count %" PRIu64 "\n",
                     p, p, s->runs);
    kiln_sbuf_printf(b, "# TYPE kiln_batch_queue_full_count counter\n"
                        "kiln_batch_queue_full_count %" PRIu64 "\n", s->queue_full);
    static const char *const names[3] = {"kiln_batch_queue_latency_us", "kiln_batch_size",
                                         "kiln_batch_padding_rows"};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < s->n_series; i++) {
            version_series *v = &s->series[i];
            char labels[300];
            snprintf(labels, sizeof labels, "model_name=\"%s\",version=\"%" PRId64 "\"",
                     v->model, v->version);
            const histogram *h = k == 0 ? &v->queuing : k == 1 ? &v->size : &v->padding;
            hist_write(b, names[k], labels, h, k == 0 ? LATENCY_BUCKETS : SIZE_BUCKETS,
                       k == 0 ? latency_limit : size_limit, i == 0);
        }
    }
    kiln_sbuf_puts(b, "# TYPE kiln_batch_padded_elements_total counter\n");
    for (int i = 0; i < s->n_series; i++)
        kiln_sbuf_printf(b, "kiln_batch_padded_elements_total{model_name=\"%s\",version=\"%" PRId64
                            "\"} %" PRIu64 "\n", s->series[i].model, s->series[i].version,
                         s->series[i].padded_elements);
    kiln_sbuf_puts(b, "# TYPE kiln_batch_deadline_expired_total counter\n");
    for (int i = 0; i < s->n_series; i++)
        kiln_sbuf_printf(b, "kiln_batch_deadline_expired_total{model_name=\"%s\",version=\"%" PRId64
                            "\"} %" PRIu64 "\n", s->series[i].model, s->series[i].version,
                         s->series[i].expired);
    kiln_sbuf_puts(b, "# TYPE kiln_batch_cancelled_total counter\n");
    for (int i = 0; i < s->n_series; i++)
        kiln_sbuf_printf(b, "kiln_batch_cancelled_total{model_name=\"%s\",version=\"%" PRId64
                            "\"} %" PRIu64 "\n", s->series[i].model, s->series[i].version,
                         s->series[i].cancelled);
    pthread_mutex_unlock(&s->mu);
}

static void hist_json(kiln_sbuf *b, const char *key, const histogram *h, int n)
{
    kiln_sbuf_printf(b, ", \"%s\": {\"count\": %" PRIu64 ", \"sum\": %.17g, \"buckets\": [", key,
                     h->count, h->sum);
    for (int i = 0; i <= n; i++) kiln_sbuf_printf(b, "%s%" PRIu64, i ? ", " : "", h->bucket[i]);
    kiln_sbuf_puts(b, "]}");
}

void kiln_batch_stats_write_json(kiln_batch_stats *s, kiln_sbuf *b)
{
    if (!s) {
        kiln_sbuf_puts(b, "null");
        return;
    }
    kiln_sbuf_puts(b, "{\"size_bounds\": [");
    for (int i = 0; i < SIZE_BUCKETS; i++) kiln_sbuf_printf(b, "%s%.9g", i ? ", " : "", size_limit(i));
    kiln_sbuf_puts(b, "], \"queue_bounds_us\": [");
    for (int i = 0; i < LATENCY_BUCKETS; i++)
        kiln_sbuf_printf(b, "%s%.9g", i ? ", " : "", latency_limit(i));
    pthread_mutex_lock(&s->mu);
    kiln_sbuf_printf(b, "], \"runs\": %" PRIu64 ", \"queue_full\": %" PRIu64 ", \"series\": [",
                     s->runs, s->queue_full);
    for (int i = 0; i < s->n_series; i++) {
        const version_series *v = &s->series[i];
        kiln_sbuf_puts(b, i ? ",\n  {\"model\": " : "\n  {\"model\": ");
        kiln_sbuf_json_string(b, v->model, strlen(v->model));
        kiln_sbuf_printf(b, ", \"version\": \"%" PRId64 "\", \"expired\": %" PRIu64, v->version,
                         v->expired);
        hist_json(b, "queue_us", &v->queuing, LATENCY_BUCKETS);
        hist_json(b, "batch_size", &v->size, SIZE_BUCKETS);
        hist_json(b, "padding_rows", &v->padding, SIZE_BUCKETS);
        kiln_sbuf_puts(b, "}");
    }
    kiln_sbuf_puts(b, "]}");
    pthread_mutex_unlock(&s->mu);
}

/* The series of (model, version), created if new; caller holds s->mu. */
static version_series *series_for(kiln_batch_stats *s, const char *model, int64_t version)
{
    for (int i = 0; i < s->n_series; i++)
        if (s->series[i].version == version && strcmp(s->series[i].model, model) == 0)
            return &s->series[i];
    if (s->n_series == VERSION_SERIES) return &s->series[VERSION_SERIES - 1];
    version_series *v = &s->series[s->n_series++];
    snprintf(v->model, sizeof v->model, "%s", s->n_series == VERSION_SERIES ? "__other__" : model);
    v->version = s->n_series == VERSION_SERIES ? -1 : version;
    return v;
}

/* ------------------------------------------------------------ queue */

typedef struct task {
    kiln_tensor *const *in;   /* borrowed from the caller */
    int64_t rows;
    int64_t deadline_ms;      /* kiln_monotonic_ms clock; 0 = none */
    const volatile int *cancel; /* the caller's cancel flag (a gRPC call's RST_STREAM), or NULL */
    kiln_batch_result *out;
    kiln_status st;
    char *err;                /* caller's buffer, KILN_JSON_ERR_LEN */
    const char *code;
    int done;
    struct timespec enqueued;
    struct task *next;
} task;

typedef struct batch {
    task *head, *tail;
    task *expired;            /* dropped before the run: deadline passed or cancelled */
    int n_tasks;
    int64_t rows;
    struct timespec opened;   /* when its first task arrived */
    struct batch *next;
} batch;

struct kiln_batcher {
    kiln_session *sess;
    const kiln_signature *sig;
    kiln_batching_params p;
    kiln_batch_stats *stats;
    version_series *series;   /* this version's series in stats (under stats->mu) */
    int n_in;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;   /* a batch was queued or grew, or stopping */
    pthread_cond_t done_cv;   /* some tasks finished */
    batch *head, *tail;       /* queued, not yet taken by a worker */
    int n_batches;
    int stopping;
    pthread_t *threads;
    int n_threads;
};

static double us_between(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) * 1e6 + (double)(b->tv_nsec - a->tv_nsec) / 1e3;
}

/* Whether in can join a batch whose first task is a: same dtypes and ranks,
 * and the same non-batch dimensions unless pad_variable_length_inputs. */
static int compatible(const kiln_batcher *b, const task *a, kiln_tensor *const *in)
{
    for (int i = 0; i < b->n_in; i++) {
        const kiln_tensor *x = a->in[i], *y = in[i];
        if (x->dtype != y->dtype || x->rank != y->rank) return 0;
        if (b->p.pad_variable_length_inputs) continue;
        for (int d = 1; d < x->rank; d++)
            if (x->dims[d] != y->dims[d]) return 0;
    }
    return 1;
}

const char *kiln_serve_code_for(kiln_status st)
{
    switch (st) {
    case KILN_OK: return "OK";
    case KILN_ERR_OUT_OF_MEMORY: return "RESOURCE_EXHAUSTED";
    case KILN_ERR_UNSUPPORTED: return "UNIMPLEMENTED";
    case KILN_ERR_INTERNAL: return "INTERNAL";
    case KILN_ERR_DEADLINE: return "DEADLINE_EXCEEDED";
    default: return "INVALID_ARGUMENT";
    }
}

/* Elements of one row (dimension 0 slice) of t. */
static size_t row_elems(const kiln_tensor *t)
{
    size_t n = 1;
    for (int d = 1; d < t->rank; d++) n *= (size_t)t->dims[d];
    return n;
}

/* dst[di] = src[si] (same dtype). */
static kiln_status copy_elem(kiln_tensor *dst, size_t di, const kiln_tensor *src, size_t si)
{
    if (src->dtype == KILN_DTYPE_STRING) {
        const kiln_string *e = &((const kiln_string *)src->data)[si];
        return kiln_tensor_set_string(dst, di, e->data, e->len);
    }
    size_t es = kiln_dtype_size(src->dtype);
    memcpy((char *)dst->data + di * es, (const char *)src->data + si * es, es);
    return KILN_OK;
}

/*
 * pad_variable_length_inputs: copy all rows of src to row `at` of dst, whose
 * non-batch dimensions are each >= src's. Elements outside src's extent get
 * src's first element, as TF Serving's PadTensor does ("using existing values
 * in padding"). Adds the number of padding elements to *padded.
 */
static kiln_status copy_padded(kiln_tensor *dst, int64_t at, const kiln_tensor *src,
                               uint64_t *padded)
{
    size_t dre = row_elems(dst), sre = row_elems(src);
    size_t rows = (size_t)src->dims[0];
    int same = 1;
    for (int d = 1; d < src->rank; d++) same &= src->dims[d] == dst->dims[d];
    if (same) return kiln_tensor_copy_rows(dst, at, src, 0, src->dims[0]);
    if (sre == 0) return KILN_ERR_INVALID_ARGUMENT; /* nothing to pad with */
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < rows * dre && st == KILN_OK; i++)
        st = copy_elem(dst, (size_t)at * dre + i, src, 0);
    for (size_t i = 0; i < rows * sre && st == KILN_OK; i++) {
        size_t rem = i, off = 0, stride = 1;
        for (int d = src->rank - 1; d >= 1; d--) {
            off += (rem % (size_t)src->dims[d]) * stride;
            rem /= (size_t)src->dims[d];
            stride *= (size_t)dst->dims[d];
        }
        st = copy_elem(dst, ((size_t)at + rem) * dre + off, src, i);
    }
    *padded += rows * (dre - sre);
    return st;
}

/* Finish every task of bt with an error. */
static void fail_all(batch *bt, kiln_status st, const char *code, const char *msg)
{
    for (task *t = bt->head; t; t = t->next) {
        t->st = st;
        t->code = code;
        snprintf(t->err, KILN_JSON_ERR_LEN, "%s", msg);
    }
}

/* Move the tasks whose deadline has passed (answered DEADLINE_EXCEEDED) or
 * whose caller cancelled them (CANCELLED) out of the batch, and release their
 * callers at once: they do not wait for the batch's run. A task cancelled
 * after this point runs with its batch (the run is shared). */
static void drop_expired(kiln_batcher *b, batch *bt)
{
    int64_t now = kiln_monotonic_ms();
    task **pp = &bt->head, *last = NULL;
    uint64_t n_expired = 0, n_cancelled = 0;
    while (*pp) {
        task *t = *pp;
        int cancelled = t->cancel && *t->cancel;
        if (cancelled || (t->deadline_ms > 0 && now >= t->deadline_ms)) {
            *pp = t->next;
            t->next = bt->expired;
            bt->expired = t;
            t->st = KILN_ERR_DEADLINE; /* the runtime's status for both (kiln.h) */
            t->code = cancelled ? "CANCELLED" : "DEADLINE_EXCEEDED";
            snprintf(t->err, KILN_JSON_ERR_LEN, "%s", cancelled ? KILN_CANCELLED_MESSAGE
                                                                : KILN_DEADLINE_MESSAGE);
            bt->n_tasks--;
            bt->rows -= t->rows;
            if (cancelled) n_cancelled++;
            else n_expired++;
            continue;
        }
        last = t;
        pp = &t->next;
    }
    bt->tail = last;
    if (!bt->expired) return;
    if (b->stats) {
        pthread_mutex_lock(&b->stats->mu);
        b->series->expired += n_expired;
        b->series->cancelled += n_cancelled;
        pthread_mutex_unlock(&b->stats->mu);
    }
    /* a caller may return (its task is on its stack) once done is set */
    pthread_mutex_lock(&b->mu);
    for (task *t = bt->expired; t; t = t->next) t->done = 1;
    bt->expired = NULL;
    pthread_cond_broadcast(&b->done_cv);
    pthread_mutex_unlock(&b->mu);
}

/* Merge, pad, run and split one batch; fills every task's result. */
static void run_batch(kiln_batcher *b, batch *bt)
{
    drop_expired(b, bt);
    if (!bt->head) return;
    int64_t rows = bt->rows, padded = rows;
    for (int i = 0; i < b->p.n_allowed; i++)
        if (b->p.allowed_batch_sizes[i] >= rows) {
            padded = b->p.allowed_batch_sizes[i];
            break;
        }
    /* the batch runs until the latest of its requests' deadlines */
    int64_t deadline = 0;
    for (task *t = bt->head; t; t = t->next) {
        if (t->deadline_ms == 0) {
            deadline = 0;
            break;
        }
        if (t->deadline_ms > deadline) deadline = t->deadline_ms;
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);

    /* merged inputs: the task's own tensors when it is alone and unpadded */
    int own = bt->n_tasks == 1 && padded == rows;
    kiln_tensor **merged = calloc((size_t)b->n_in + 1, sizeof *merged);
    kiln_named_tensor *named = calloc((size_t)b->n_in + 1, sizeof *named);
    kiln_outputs *out = NULL;
    char msg[KILN_JSON_ERR_LEN];
    kiln_status st = KILN_OK;
    uint64_t padded_elems = 0;
    if (!merged || !named) {
        fail_all(bt, KILN_ERR_OUT_OF_MEMORY, "RESOURCE_EXHAUSTED", "out of memory");
        goto err_free;
    }
    for (int i = 0; i < b->n_in && !own; i++) {
        const kiln_tensor *first = bt->head->in[i];
        int64_t dims[KILN_MAX_RANK];
        memcpy(dims, first->dims, sizeof dims);
        for (task *t = bt->head; t; t = t->next) /* the largest of each dimension */
            for (int d = 1; d < first->rank; d++)
                if (t->in[i]->dims[d] > dims[d]) dims[d] = t->in[i]->dims[d];
        dims[0] = padded;
        st = kiln_tensor_create(first->dtype, first->rank, dims, &merged[i]);
        if (st != KILN_OK) {
            fail_all(bt, st, kiln_serve_code_for(st), "out of memory merging a batch");
            goto err_free;
        }
        int64_t at = 0;
        for (task *t = bt->head; t && st == KILN_OK; t = t->next) {
            st = copy_padded(merged[i], at, t->in[i], &padded_elems);
            at += t->rows;
        }
        /* pad up to the allowed batch size by repeating the last row */
        for (; at < padded && st == KILN_OK; at++) st = kiln_tensor_copy_rows(merged[i], at, merged[i], at - 1, 1);
        if (st != KILN_OK) {
            fail_all(bt, st, kiln_serve_code_for(st),
                     st == KILN_ERR_OUT_OF_MEMORY ? "out of memory merging a batch"
                                                  : "Got empty tensor in batch of non-empty "
                                                    "tensors."); /* TF Serving's message */
            goto err_free;
        }
    }
    if (b->stats) {
        pthread_mutex_lock(&b->stats->mu);
        for (task *t = bt->head; t; t = t->next) {
            double q = us_between(&t->enqueued, &now);
            hist_add(&b->stats->queuing, LATENCY_BUCKETS, latency_limit, q);
            hist_add(&b->series->queuing, LATENCY_BUCKETS, latency_limit, q);
            hist_add(&b->stats->input_size, SIZE_BUCKETS, size_limit, (double)t->rows);
        }
        hist_add(&b->stats->processed_size, SIZE_BUCKETS, size_limit, (double)padded);
        hist_add(&b->stats->padding, SIZE_BUCKETS, size_limit, (double)(padded - rows));
        hist_add(&b->series->size, SIZE_BUCKETS, size_limit, (double)padded);
        hist_add(&b->series->padding, SIZE_BUCKETS, size_limit, (double)(padded - rows));
        b->series->padded_elements += padded_elems;
        b->stats->runs++;
        pthread_mutex_unlock(&b->stats->mu);
    }
    for (int i = 0; i < b->n_in; i++)
        named[i] = (kiln_named_tensor){kiln_signature_input(b->sig, i)->name,
                                       own ? bt->head->in[i] : merged[i]};
    kiln_run_options ro = {deadline, NULL};
    st = kiln_session_run_opts(b->sess, named, b->n_in, &ro, &out);
    if (st != KILN_OK) {
        fail_all(bt, st, kiln_serve_code_for(st),
                 st == KILN_ERR_DEADLINE ? KILN_DEADLINE_MESSAGE : kiln_last_error());
        goto err_free;
    }
    int no = kiln_outputs_count(out);
    for (int o = 0; o < no; o++) {
        const kiln_tensor *y = kiln_outputs_get(out, o);
        if (y->dtype == KILN_DTYPE_SEQUENCE || y->dtype == KILN_DTYPE_OPTIONAL) {
            snprintf(msg, sizeof msg, "output '%s' is a %s value; the serving APIs carry "
                     "tensors only", kiln_outputs_name(out, o), kiln_dtype_name(y->dtype));
            fail_all(bt, KILN_ERR_UNSUPPORTED, "UNIMPLEMENTED", msg);
            goto err_free;
        }
        if (y->rank < 1 || y->dims[0] != padded) {
            snprintf(msg, sizeof msg, "Batched output '%s' has %" PRId64 " rows, expected %"
                     PRId64 ": the model does not keep dimension 0 as the batch",
                     kiln_outputs_name(out, o), y->rank < 1 ? (int64_t)0 : y->dims[0], padded);
            fail_all(bt, KILN_ERR_RUNTIME, "INVALID_ARGUMENT", msg);
            goto err_free;
        }
    }
    /* split back: each task gets its rows of every output */
    int64_t at = 0;
    for (task *t = bt->head; t; t = t->next) {
        kiln_batch_result *r = t->out;
        r->names = calloc((size_t)no + 1, sizeof *r->names);
        r->t = calloc((size_t)no + 1, sizeof *r->t);
        if (!r->names || !r->t) {
            t->st = KILN_ERR_OUT_OF_MEMORY;
            t->code = "RESOURCE_EXHAUSTED";
            snprintf(t->err, KILN_JSON_ERR_LEN, "out of memory");
            at += t->rows;
            continue;
        }
        r->n = no;
        for (int o = 0; o < no && t->st == KILN_OK; o++) {
            const kiln_tensor *y = kiln_outputs_get(out, o);
            int64_t dims[KILN_MAX_RANK];
            memcpy(dims, y->dims, sizeof dims);
            dims[0] = t->rows;
            char *nm = strdup(kiln_outputs_name(out, o));
            kiln_status s2 = nm ? kiln_tensor_create(y->dtype, y->rank, dims, &r->t[o])
                                : KILN_ERR_OUT_OF_MEMORY;
            r->names[o] = nm;
            if (s2 == KILN_OK) s2 = kiln_tensor_copy_rows(r->t[o], 0, y, at, t->rows);
            if (s2 != KILN_OK) {
                t->st = s2;
                t->code = "RESOURCE_EXHAUSTED";
                snprintf(t->err, KILN_JSON_ERR_LEN, "out of memory splitting a batch");
            }
        }
        at += t->rows;
    }
err_free:
    kiln_outputs_free(out);
    if (merged)
        for (int i = 0; i < b->n_in; i++) kiln_tensor_free(merged[i]);
    free(merged);
    free(named);
}

static void *worker(void *arg)
{
    kiln_batcher *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->stopping && !b->head) pthread_cond_wait(&b->work_cv, &b->mu);
        if (!b->head) break; /* stopping with nothing queued */
        batch *bt = b->head;
        /* closed: full, followed by another batch, timed out, or stopping */
        if (!b->stopping && bt->rows < b->p.max_batch_size && !bt->next &&
            b->p.batch_timeout_micros > 0) {
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            double left = (double)b->p.batch_timeout_micros - us_between(&bt->opened, &now);
            if (left > 0) {
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                long long ns = until.tv_nsec + (long long)(left * 1000.0);
                until.tv_sec += ns / 1000000000;
                until.tv_nsec = ns % 1000000000;
                pthread_cond_timedwait(&b->work_cv, &b->mu, &until);
                continue; /* re-check: it may have filled, or another worker took it */
            }
        }
        b->head = bt->next;
        if (!b->head) b->tail = NULL;
        b->n_batches--;
        pthread_mutex_unlock(&b->mu);
        run_batch(b, bt);
        pthread_mutex_lock(&b->mu);
        for (task *t = bt->head; t; t = t->next) t->done = 1;
        pthread_cond_broadcast(&b->done_cv);
        free(bt);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

kiln_status kiln_batcher_create(kiln_session *sess, const kiln_signature *sig,
                                const kiln_batching_params *p, kiln_batch_stats *stats,
                                const char *model, int64_t version, kiln_batcher **out)
{
    kiln_batcher *b = calloc(1, sizeof *b);
    if (!b) return KILN_ERR_OUT_OF_MEMORY;
    b->sess = sess;
    b->sig = sig;
    b->p = *p;
    b->stats = stats;
    if (stats) {
        pthread_mutex_lock(&stats->mu);
        b->series = series_for(stats, model, version);
        pthread_mutex_unlock(&stats->mu);
    }
    b->n_in = kiln_signature_input_count(sig);
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->work_cv, NULL);
    pthread_cond_init(&b->done_cv, NULL);
    int n = (int)(p->num_batch_threads > 0 ? p->num_batch_threads : 1);
    b->threads = calloc((size_t)n, sizeof *b->threads);
    if (!b->threads) {
        kiln_batcher_free(b);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < n; i++) {
        if (pthread_create(&b->threads[i], NULL, worker, b) != 0) {
            kiln_batcher_free(b);
            return KILN_ERR_INTERNAL;
        }
        b->n_threads = i + 1;
    }
    *out = b;
    return KILN_OK;
}

void kiln_batcher_free(kiln_batcher *b)
{
    if (!b) return;
    pthread_mutex_lock(&b->mu);
    b->stopping = 1;
    pthread_cond_broadcast(&b->work_cv);
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->n_threads; i++) pthread_join(b->threads[i], NULL);
    free(b->threads);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->work_cv);
    pthread_cond_destroy(&b->done_cv);
    free(b);
}

void kiln_batch_result_free(kiln_batch_result *r)
{
    for (int i = 0; i < r->n; i++) {
        if (r->t) kiln_tensor_free(r->t[i]);
        if (r->names) free((char *)r->names[i]);
    }
    free(r->t);
    free(r->names);
    memset(r, 0, sizeof *r);
}

kiln_status kiln_batcher_run(kiln_batcher *b, kiln_tensor *const *in, int n, int64_t deadline_ms,
                             kiln_batch_result *out, char *err, const char **code)
{
    return kiln_batcher_run_cancel(b, in, n, deadline_ms, NULL, out, err, code);
}

kiln_status kiln_batcher_run_cancel(kiln_batcher *b, kiln_tensor *const *in, int n,
                                    int64_t deadline_ms, const volatile int *cancel,
                                    kiln_batch_result *out, char *err, const char **code)
{
    memset(out, 0, sizeof *out);
    *code = "INVALID_ARGUMENT";
    if (n != b->n_in) {
        snprintf(err, KILN_JSON_ERR_LEN, "expected %d inputs, got %d", b->n_in, n);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    int64_t rows = -1;
    for (int i = 0; i < n; i++) {
        if (in[i]->rank < 1) {
            snprintf(err, KILN_JSON_ERR_LEN,
                     "Batching session Run() input tensors must have at least one dimension");
            return KILN_ERR_INVALID_ARGUMENT;
        }
        if (rows >= 0 && in[i]->dims[0] != rows) {
            snprintf(err, KILN_JSON_ERR_LEN,
                     "Batching Run() input tensors must have equal 0th-dimension size");
            return KILN_ERR_INVALID_ARGUMENT;
        }
        rows = in[i]->dims[0];
    }
    if (rows == 0 && n > 0) {
        snprintf(err, KILN_JSON_ERR_LEN, "Batching Run() input tensors have no rows");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (rows > b->p.max_batch_size) {
        snprintf(err, KILN_JSON_ERR_LEN,
                 "Task size %" PRId64 " is larger than maximum input batch size %" PRId64, rows,
                 b->p.max_batch_size);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (deadline_ms > 0 && kiln_monotonic_ms() >= deadline_ms) {
        *code = "DEADLINE_EXCEEDED";
        snprintf(err, KILN_JSON_ERR_LEN, "%s", KILN_DEADLINE_MESSAGE);
        return KILN_ERR_DEADLINE;
    }
    if (cancel && *cancel) {
        *code = "CANCELLED";
        snprintf(err, KILN_JSON_ERR_LEN, "%s", KILN_CANCELLED_MESSAGE);
        return KILN_ERR_DEADLINE;
    }
    task t = {0};
    t.in = in;
    t.rows = rows;
    t.deadline_ms = deadline_ms;
    t.cancel = cancel;
    t.out = out;
    t.err = err;
    t.code = "OK";
    clock_gettime(CLOCK_MONOTONIC, &t.enqueued);

    pthread_mutex_lock(&b->mu);
    /* join the oldest waiting batch this request fits; a worker has not
     * taken any batch still on the list */
    batch *bt = b->head;
    while (bt && (bt->rows + rows > b->p.max_batch_size || !compatible(b, bt->head, in)))
        bt = bt->next;
    if (!bt) {
        if (b->n_batches >= b->p.max_enqueued_batches) {
            pthread_mutex_unlock(&b->mu);
            if (b->stats) {
                pthread_mutex_lock(&b->stats->mu);
                b->stats->queue_full++;
                pthread_mutex_unlock(&b->stats->mu);
            }
            *code = "UNAVAILABLE";
            snprintf(err, KILN_JSON_ERR_LEN,
                     "The batch scheduling queue to which this task was submitted is full");
            return KILN_ERR_RUNTIME;
        }
        bt = calloc(1, sizeof *bt);
        if (!bt) {
            pthread_mutex_unlock(&b->mu);
            *code = "RESOURCE_EXHAUSTED";
            snprintf(err, KILN_JSON_ERR_LEN, "out of memory");
            return KILN_ERR_OUT_OF_MEMORY;
        }
        bt->opened = t.enqueued;
        if (b->tail) b->tail->next = bt;
        else b->head = bt;
        b->tail = bt;
        b->n_batches++;
    }
    if (bt->tail) bt->tail->next = &t;
    else bt->head = &t;
    bt->tail = &t;
    bt->n_tasks++;
    bt->rows += rows;
    pthread_cond_broadcast(&b->work_cv);
    while (!t.done) pthread_cond_wait(&b->done_cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
    *code = t.code;
    if (t.st != KILN_OK) kiln_batch_result_free(out);
    return t.st;
}
