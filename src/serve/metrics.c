/*
 * metrics.c - the request counters and latency histograms of metrics.h,
 * kept in small fixed tables under one mutex (a request touches it once).
 */
#include "serve/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_BUCKETS 33

typedef struct count_series {
    char model[128];
    char status[32];
    uint64_t n;
} count_series;

typedef struct latency_series {
    char model[128];
    char api[16];
    char entrypoint[8]; /* "REST" or "GRPC" */
    uint64_t buckets[N_BUCKETS + 1]; /* last: +Inf */
    double sum;
    uint64_t n;
} latency_series;

/* Kiln's: latency per model version and API, all requests that reached a version. */
typedef struct version_series {
    char model[128];
    int64_t version;
    char api[16];
    uint64_t buckets[N_BUCKETS + 1];
    double sum;
    uint64_t n;
    uint64_t errors; /* of n, those that failed (for the console's error rate) */
} version_series;

/* Kiln's: failed requests per model, API and TF code. */
typedef struct error_series {
    char model[128];
    char api[16];
    char code[32];
    uint64_t n;
} error_series;

struct kiln_metrics {
    pthread_mutex_t mu;
    double bounds[N_BUCKETS];
    count_series counts[KILN_METRICS_MAX_SERIES];
    int n_counts;
    latency_series lat[KILN_METRICS_MAX_SERIES];
    int n_lat;
    version_series vlat[KILN_METRICS_MAX_SERIES];
    int n_vlat;
    error_series errs[KILN_METRICS_MAX_SERIES];
    int n_errs;
    atomic_uint_least64_t grpc_closed[KILN_GRPC_CLOSED_N]; /* not under mu */
};

static const char *const grpc_closed_names[KILN_GRPC_CLOSED_N] = {"frame_flood"};

void kiln_metrics_grpc_closed(kiln_metrics *m, kiln_grpc_closed_reason why)
{
    if (m && (unsigned)why < KILN_GRPC_CLOSED_N) atomic_fetch_add(&m->grpc_closed[why], 1);
}

kiln_metrics *kiln_metrics_create(void)
{
    kiln_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    for (int r = 0; r < KILN_GRPC_CLOSED_N; r++) atomic_init(&m->grpc_closed[r], 0);
    for (int i = 0; i < N_BUCKETS; i++) m->bounds[i] = 10.0 * pow(1.8, i);
    return m;
}

void kiln_metrics_free(kiln_metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static void copy_label(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

static int bucket_of(const kiln_metrics *m, double v)
{
    int b = 0;
    while (b < N_BUCKETS && v > m->bounds[b]) b++;
    return b;
}

void kiln_metrics_record(kiln_metrics *m, const char *model, int64_t version, const char *api,
                         const char *status, double latency_us)
{
    kiln_metrics_record_entry(m, "REST", model, version, api, status, latency_us);
}

void kiln_metrics_record_entry(kiln_metrics *m, const char *entrypoint, const char *model,
                               int64_t version, const char *api, const char *status,
                               double latency_us)
{
    pthread_mutex_lock(&m->mu);
    count_series *c = NULL;
    for (int i = 0; i < m->n_counts && !c; i++)
        if (strcmp(m->counts[i].model, model) == 0 && strcmp(m->counts[i].status, status) == 0)
            c = &m->counts[i];
    if (!c && m->n_counts < KILN_METRICS_MAX_SERIES - 1) {
        c = &m->counts[m->n_counts++];
        copy_label(c->model, sizeof c->model, model);
        copy_label(c->status, sizeof c->status, status);
    }
    if (!c) { /* the last slot collects everything else */
        c = &m->counts[KILN_METRICS_MAX_SERIES - 1];
        if (m->n_counts < KILN_METRICS_MAX_SERIES) {
            m->n_counts = KILN_METRICS_MAX_SERIES;
            copy_label(c->model, sizeof c->model, "__other__");
            copy_label(c->status, sizeof c->status, "other");
        }
    }
    c->n++;
    if (strcmp(status, "OK") == 0) {
        latency_series *l = NULL;
        for (int i = 0; i < m->n_lat && !l; i++)
            if (strcmp(m->lat[i].model, model) == 0 && strcmp(m->lat[i].api, api) == 0 &&
                strcmp(m->lat[i].entrypoint, entrypoint) == 0)
                l = &m->lat[i];
        if (!l && m->n_lat < KILN_METRICS_MAX_SERIES) {
            l = &m->lat[m->n_lat++];
            copy_label(l->model, sizeof l->model, model);
            copy_label(l->api, sizeof l->api, api);
            copy_label(l->entrypoint, sizeof l->entrypoint, entrypoint);
        }
        if (l) {
            int b = 0;
            while (b < N_BUCKETS && latency_us > m->bounds[b]) b++;
            l->buckets[b]++;
            l->sum += latency_us;
            l->n++;
        }
    }
    if (version >= 0) { /* Kiln's per-version latency, successful or not */
        version_series *v = NULL;
        for (int i = 0; i < m->n_vlat && !v; i++)
            if (m->vlat[i].version == version && strcmp(m->vlat[i].model, model) == 0 &&
                strcmp(m->vlat[i].api, api) == 0)
                v = &m->vlat[i];
        if (!v && m->n_vlat < KILN_METRICS_MAX_SERIES) {
            v = &m->vlat[m->n_vlat++];
            copy_label(v->model, sizeof v->model, model);
            copy_label(v->api, sizeof v->api, api);
            v->version = version;
        }
        if (v) {
            v->buckets[bucket_of(m, latency_us)]++;
            v->sum += latency_us;
            v->n++;
            v->errors += strcmp(status, "OK") != 0;
        }
    }
    if (strcmp(status, "OK") != 0) {
        error_series *e = NULL;
        for (int i = 0; i < m->n_errs && !e; i++)
            if (strcmp(m->errs[i].model, model) == 0 && strcmp(m->errs[i].api, api) == 0 &&
                strcmp(m->errs[i].code, status) == 0)
                e = &m->errs[i];
        if (!e && m->n_errs < KILN_METRICS_MAX_SERIES) {
            e = &m->errs[m->n_errs++];
            copy_label(e->model, sizeof e->model, model);
            copy_label(e->api, sizeof e->api, api);
            copy_label(e->code, sizeof e->code, status);
        }
        if (e) e->n++;
    }
    pthread_mutex_unlock(&m->mu);
}

/* Resident set size from /proc/self/statm (second field, in pages); -1 if unknown. */
static long long resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    long long size = 0, res = -1;
    if (fscanf(f, "%lld %lld", &size, &res) != 2) res = -1;
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return res < 0 || page <= 0 ? -1 : res * page;
}

/* A label value with \ and " escaped (and newlines dropped). */
static void put_label(kiln_sbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') kiln_sbuf_put(b, "\\", 1);
        if (*s == '\n') continue;
        kiln_sbuf_put(b, s, 1);
    }
}

void kiln_metrics_write(kiln_metrics *m, kiln_sbuf *b, int in_flight)
{
    pthread_mutex_lock(&m->mu);
    kiln_sbuf_puts(b, "# TYPE :tensorflow:serving:request_count counter\n");
    for (int i = 0; i < m->n_counts; i++) {
        kiln_sbuf_puts(b, ":tensorflow:serving:request_count{model_name=\"");
        put_label(b, m->counts[i].model);
        kiln_sbuf_puts(b, "\",status=\"");
        put_label(b, m->counts[i].status);
        kiln_sbuf_printf(b, "\"} %llu\n", (unsigned long long)m->counts[i].n);
    }
    kiln_sbuf_puts(b, "# TYPE :tensorflow:serving:request_latency histogram\n");
    for (int i = 0; i < m->n_lat; i++) {
        latency_series *l = &m->lat[i];
        uint64_t cum = 0;
        for (int k = 0; k <= N_BUCKETS; k++) {
            cum += l->buckets[k];
            kiln_sbuf_puts(b, ":tensorflow:serving:request_latency_bucket{model_name=\"");
            put_label(b, l->model);
            kiln_sbuf_puts(b, "\",API=\"");
            put_label(b, l->api);
            if (k < N_BUCKETS)
                kiln_sbuf_printf(b, "\",entrypoint=\"%s\",le=\"%.10g\"} %llu\n", l->entrypoint,
                                 m->bounds[k], (unsigned long long)cum);
            else
                kiln_sbuf_printf(b, "\",entrypoint=\"%s\",le=\"+Inf\"} %llu\n", l->entrypoint,
                                 (unsigned long long)cum);
        }
        kiln_sbuf_puts(b, ":tensorflow:serving:request_latency_sum{model_name=\"");
        put_label(b, l->model);
        kiln_sbuf_puts(b, "\",API=\"");
        put_label(b, l->api);
        kiln_sbuf_printf(b, "\",entrypoint=\"%s\"} %.17g\n", l->entrypoint, l->sum);
        kiln_sbuf_puts(b, ":tensorflow:serving:request_latency_count{model_name=\"");
        put_label(b, l->model);
        kiln_sbuf_puts(b, "\",API=\"");
        put_label(b, l->api);
        kiln_sbuf_printf(b, "\",entrypoint=\"%s\"} %llu\n", l->entrypoint,
                         (unsigned long long)l->n);
    }
    kiln_sbuf_puts(b, "# TYPE kiln_request_latency_us histogram\n");
    for (int i = 0; i < m->n_vlat; i++) {
        version_series *v = &m->vlat[i];
        kiln_sbuf lab = {0};
        kiln_sbuf_puts(&lab, "model_name=\"");
        put_label(&lab, v->model);
        kiln_sbuf_printf(&lab, "\",version=\"%lld\",API=\"", (long long)v->version);
        put_label(&lab, v->api);
        kiln_sbuf_puts(&lab, "\"");
        const char *l = lab.p && !lab.oom ? lab.p : "";
        uint64_t cum = 0;
        for (int k = 0; k <= N_BUCKETS; k++) {
            cum += v->buckets[k];
            if (k < N_BUCKETS)
                kiln_sbuf_printf(b, "kiln_request_latency_us_bucket{%s,le=\"%.10g\"} %llu\n", l,
                                 m->bounds[k], (unsigned long long)cum);
            else
                kiln_sbuf_printf(b, "kiln_request_latency_us_bucket{%s,le=\"+Inf\"} %llu\n", l,
                                 (unsigned long long)cum);
        }
        kiln_sbuf_printf(b, "kiln_request_latency_us_sum{%s} %.17g\nkiln_request_latency_us_count{%s} "
                            "%llu\n", l, v->sum, l, (unsigned long long)v->n);
        kiln_sbuf_free(&lab);
    }
    kiln_sbuf_puts(b, "# TYPE kiln_request_errors_total counter\n");
    for (int i = 0; i < m->n_errs; i++) {
        kiln_sbuf_puts(b, "kiln_request_errors_total{model_name=\"");
        put_label(b, m->errs[i].model);
        kiln_sbuf_puts(b, "\",API=\"");
        put_label(b, m->errs[i].api);
        kiln_sbuf_puts(b, "\",code=\"");
        put_label(b, m->errs[i].code);
        kiln_sbuf_printf(b, "\"} %llu\n", (unsigned long long)m->errs[i].n);
    }
    pthread_mutex_unlock(&m->mu);
    kiln_sbuf_puts(b, "# HELP kiln_grpc_connections_closed_total gRPC connections the server "
                      "closed itself, by reason.\n# TYPE kiln_grpc_connections_closed_total counter\n");
    for (int r = 0; r < KILN_GRPC_CLOSED_N; r++)
        kiln_sbuf_printf(b, "kiln_grpc_connections_closed_total{reason=\"%s\"} %llu\n", grpc_closed_names[r],
                         (unsigned long long)atomic_load(&m->grpc_closed[r]));
    kiln_sbuf_printf(b, "# TYPE kiln_http_requests_in_flight gauge\nkiln_http_requests_in_flight %d\n",
                     in_flight);
    long long rss = resident_bytes();
    if (rss >= 0)
        kiln_sbuf_printf(b, "# TYPE kiln_process_resident_memory_bytes gauge\n"
                            "kiln_process_resident_memory_bytes %lld\n", rss);
}

void kiln_metrics_write_json(kiln_metrics *m, kiln_sbuf *b)
{
    pthread_mutex_lock(&m->mu);
    kiln_sbuf_puts(b, "{\"latency_bounds_us\": [");
    for (int k = 0; k < N_BUCKETS; k++) kiln_sbuf_printf(b, "%s%.10g", k ? ", " : "", m->bounds[k]);
    kiln_sbuf_puts(b, "], \"series\": [");
    for (int i = 0; i < m->n_vlat; i++) {
        const version_series *v = &m->vlat[i];
        kiln_sbuf_puts(b, i ? ",\n  {\"model\": " : "\n  {\"model\": ");
        kiln_sbuf_json_string(b, v->model, strlen(v->model));
        kiln_sbuf_printf(b, ", \"version\": \"%lld\", \"api\": ", (long long)v->version);
        kiln_sbuf_json_string(b, v->api, strlen(v->api));
        kiln_sbuf_printf(b, ", \"count\": %llu, \"errors\": %llu, \"sum_us\": %.17g, \"buckets\": [",
                         (unsigned long long)v->n, (unsigned long long)v->errors, v->sum);
        for (int k = 0; k <= N_BUCKETS; k++)
            kiln_sbuf_printf(b, "%s%llu", k ? ", " : "", (unsigned long long)v->buckets[k]);
        kiln_sbuf_puts(b, "]}");
    }
    kiln_sbuf_puts(b, "]}");
    pthread_mutex_unlock(&m->mu);
}
