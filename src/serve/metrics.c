/*
 * metrics.c - the request counters and latency histograms of metrics.h,
 * kept in small fixed tables under one mutex (a request touches it once).
 */
#include "serve/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_BUCKETS 33

typedef struct count_series {
    char model[128];
    char status[32];
    uint64_t n;
} count_series;

typedef struct latency_series {
    char model[128];
    char api[16];
    uint64_t buckets[N_BUCKETS + 1]; /* last: +Inf */
    double sum;
    uint64_t n;
} latency_series;

struct kiln_metrics {
    pthread_mutex_t mu;
    double bounds[N_BUCKETS];
    count_series counts[KILN_METRICS_MAX_SERIES];
    int n_counts;
    latency_series lat[KILN_METRICS_MAX_SERIES];
    int n_lat;
};

kiln_metrics *kiln_metrics_create(void)
{
    kiln_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
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

void kiln_metrics_record(kiln_metrics *m, const char *model, const char *api, const char *status,
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
            if (strcmp(m->lat[i].model, model) == 0 && strcmp(m->lat[i].api, api) == 0)
                l = &m->lat[i];
        if (!l && m->n_lat < KILN_METRICS_MAX_SERIES) {
            l = &m->lat[m->n_lat++];
            copy_label(l->model, sizeof l->model, model);
            copy_label(l->api, sizeof l->api, api);
        }
        if (l) {
            int b = 0;
            while (b < N_BUCKETS && latency_us > m->bounds[b]) b++;
            l->buckets[b]++;
            l->sum += latency_us;
            l->n++;
        }
    }
    pthread_mutex_unlock(&m->mu);
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
                kiln_sbuf_printf(b, "\",entrypoint=\"REST\",le=\"%.10g\"} %llu\n", m->bounds[k],
                                 (unsigned long long)cum);
            else
                kiln_sbuf_printf(b, "\",entrypoint=\"REST\",le=\"+Inf\"} %llu\n",
                                 (unsigned long long)cum);
        }
        kiln_sbuf_puts(b, ":tensorflow:serving:request_latency_sum{model_name=\"");
        put_label(b, l->model);
        kiln_sbuf_puts(b, "\",API=\"");
        put_label(b, l->api);
        kiln_sbuf_printf(b, "\",entrypoint=\"REST\"} %.17g\n", l->sum);
        kiln_sbuf_puts(b, ":tensorflow:serving:request_latency_count{model_name=\"");
        put_label(b, l->model);
        kiln_sbuf_puts(b, "\",API=\"");
        put_label(b, l->api);
        kiln_sbuf_printf(b, "\",entrypoint=\"REST\"} %llu\n", (unsigned long long)l->n);
    }
    pthread_mutex_unlock(&m->mu);
    kiln_sbuf_printf(b, "# TYPE kiln_http_requests_in_flight gauge\nkiln_http_requests_in_flight %d\n",
                     in_flight);
}
