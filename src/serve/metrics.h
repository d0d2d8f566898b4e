/*
 * metrics.h - request metrics in Prometheus text format, under TF
 * Serving's names so existing dashboards keep working:
 *
 *   :tensorflow:serving:request_count{model_name,status}          counter
 *   :tensorflow:serving:request_latency{model_name,API,entrypoint} histogram (µs),
 *       buckets Exponential(10, 1.8, 33) as TF Serving's
 *
 * plus Kiln's own:
 *
 *   kiln_request_latency_us{model_name,version,API}   histogram (µs), every
 *       request that reached a model version, failed ones included
 *   kiln_request_errors_total{model_name,API,code}    counter, by TF code name
 *   kiln_http_requests_in_flight                       gauge
 *   kiln_process_resident_memory_bytes                 gauge (/proc/self/statm)
 *   kiln_grpc_connections_closed_total{reason}         counter, gRPC connections the server
 *       ended itself (reason "frame_flood": its budget of frames that carry nothing,
 *       grpc/h2.c); every reason is written, 0 until it happens
 *
 * (batching and model metrics come from batch.c and manager.c). Label sets are bounded
 * (KILN_METRICS_MAX_SERIES each); requests beyond that are counted under
 * model_name="__other__", so unknown model names cannot grow memory.
 */
#ifndef KILN_SERVE_METRICS_H
#define KILN_SERVE_METRICS_H

#include <stdint.h>

#include "serve/json.h"

#define KILN_METRICS_MAX_SERIES 128

typedef struct kiln_metrics kiln_metrics;

kiln_metrics *kiln_metrics_create(void);
void kiln_metrics_free(kiln_metrics *m);
/* Count one request: status is TF's code name ("OK", "NOT_FOUND", ...);
 * version is the model version that served it (-1: none). TF Serving's
 * latency histogram is recorded for successful requests only, as TF Serving
 * does. */
void kiln_metrics_record(kiln_metrics *m, const char *model, int64_t version, const char *api,
                         const char *status, double latency_us);
/* The same for a request that came in through `entrypoint`: "REST" (what
 * kiln_metrics_record records) or "GRPC" (TF Serving's label values). */
void kiln_metrics_record_entry(kiln_metrics *m, const char *entrypoint, const char *model,
                               int64_t version, const char *api, const char *status,
                               double latency_us);
/* Why the gRPC server ended a connection itself (kiln_grpc_connections_closed_total). */
typedef enum {
    KILN_GRPC_CLOSED_FRAME_FLOOD = 0, /* GOAWAY ENHANCE_YOUR_CALM: frames that carry nothing */
    KILN_GRPC_CLOSED_N
} kiln_grpc_closed_reason;
/* Count one connection the gRPC server closed (any thread, lock-free). */
void kiln_metrics_grpc_closed(kiln_metrics *m, kiln_grpc_closed_reason why);
void kiln_metrics_write(kiln_metrics *m, kiln_sbuf *b, int in_flight);
/* The per-version series (kiln_request_latency_us, with the failed requests
 * among them) as JSON for the web console (console.c):
 * {"latency_bounds_us": [33 upper bounds], "series": [{"model", "version",
 * "api", "count", "errors", "sum_us", "buckets": [34 counts, last +Inf]}]}.
 * Counts are cumulative since start; the page diffs two reads. */
void kiln_metrics_write_json(kiln_metrics *m, kiln_sbuf *b);

#endif
