/*
 * metrics.h - request metrics in Prometheus text format, under TF
 * Serving's names so existing dashboards keep working:
 *
 *   :tensorflow:serving:request_count{model_name,status}          counter
 *   :tensorflow:serving:request_latency{model_name,API,entrypoint} histogram (µs),
 *       buckets Exponential(10, 1.8, 33) as TF Serving's
 *
 * plus kiln_http_requests_in_flight (gauge). Label sets are bounded
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
 * the latency histogram is recorded for successful requests only, as TF
 * Serving does. */
void kiln_metrics_record(kiln_metrics *m, const char *model, const char *api, const char *status,
                         double latency_us);
void kiln_metrics_write(kiln_metrics *m, kiln_sbuf *b, int in_flight);

#endif
