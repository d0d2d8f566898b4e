/*
 * console.c - the web console's routes (console.h): /console and /console/
 * answer the page (index.html), /console/NAME one of the embedded assets,
 * and /console/api/stats the JSON the page polls every few seconds.
 *
 * The stats come from the counters and histograms the server already keeps
 * for its Prometheus page (metrics.c per model version and API, batch.c per
 * model version), so the console works without --monitoring_config_file,
 * plus the model manager's view of every version (state, labels, load log,
 * optimization log, precision). Counters are cumulative since start; the
 * page turns two reads into rates and windowed percentiles itself, so the
 * server keeps no per-client state. Rollout and monitoring state, once they
 * exist, belong in the per-model objects of "models".
 */
#include "serve/console.h"

#include <stdio.h>
#include <string.h>

#include "serve/batch.h"

/* The page polls this often (ms); the stats say so, so the page follows. */
#define KILN_CONSOLE_REFRESH_MS 2000

static const char *content_type_of(const char *name)
{
    static const struct {
        const char *ext, *type;
    } types[] = {
        {".html", "text/html; charset=utf-8"}, {".js", "text/javascript; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},   {".svg", "image/svg+xml"},
        {".png", "image/png"},
    };
    const char *dot = strrchr(name, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
        if (strcmp(dot, types[i].ext) == 0) return types[i].type;
    return "application/octet-stream";
}

static const kiln_console_asset *find_asset(const char *name)
{
    for (int i = 0; i < kiln_console_asset_count; i++)
        if (strcmp(kiln_console_assets[i].name, name) == 0) return &kiln_console_assets[i];
    return NULL;
}

static void write_stats(kiln_server *s, kiln_sbuf *b)
{
    kiln_sbuf_printf(b, "{\"kiln_version\": \"%s\", \"time_ms\": %lld, \"refresh_ms\": %d, "
                        "\"http_requests_in_flight\": %d, \"metrics_path\": ",
                     kiln_version(), (long long)kiln_monotonic_ms(), KILN_CONSOLE_REFRESH_MS,
                     atomic_load(&s->in_flight));
    if (s->opt.metrics_path) kiln_sbuf_json_string(b, s->opt.metrics_path, strlen(s->opt.metrics_path));
    else kiln_sbuf_puts(b, "null");
    kiln_sbuf_puts(b, ",\n\"models\": ");
    kiln_manager_write_console(s->manager, b);
    kiln_sbuf_puts(b, ",\n\"requests\": ");
    kiln_metrics_write_json(s->metrics, b);
    kiln_sbuf_puts(b, ",\n\"batching\": ");
    kiln_batch_stats_write_json(s->opt.batch_stats, b);
    kiln_sbuf_puts(b, "}\n");
}

void kiln_console_serve(kiln_server *s, const kiln_http_request *req, kiln_http_reply *rep)
{
    rep->csp = KILN_CONSOLE_CSP;
    const char *rest = req->path + strlen("/console");
    if (*rest == '/') rest++;
    if (strcmp(rest, "api/stats") == 0) {
        write_stats(s, &rep->body);
        return;
    }
    const kiln_console_asset *a = find_asset(*rest ? rest : "index.html");
    if (!a) {
        char msg[600];
        snprintf(msg, sizeof msg, "Not found: %s %.500s", req->method, req->path);
        kiln_reply_error(rep, "NOT_FOUND", msg);
        return;
    }
    rep->content_type = content_type_of(a->name);
    kiln_sbuf_put(&rep->body, (const char *)a->data, a->size);
}
