/*
 * observe.c - the predict path's hooks (observe.h): a fixed table of
 * observers and one route function, read without a lock once the server
 * has started.
 */
#include "serve/observe.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "serve/json.h"

void kiln_observers_init(kiln_observers *h)
{
    memset(h, 0, sizeof *h);
    snprintf(h->route_header, sizeof h->route_header, "%s", "X-Kiln-Route-Key");
}

kiln_status kiln_observers_add(kiln_observers *h, const kiln_observer *o)
{
    if (h->n >= KILN_OBSERVERS_MAX) return KILN_ERR_INVALID_ARGUMENT;
    h->obs[h->n++] = *o;
    return KILN_OK;
}

void kiln_observers_set_route(kiln_observers *h, kiln_route_fn fn, void *ctx)
{
    h->route = fn;
    h->route_ctx = ctx;
}

int64_t kiln_observers_route(const kiln_observers *h, const char *model, int64_t version,
                             const char *label, const char *key, int *routed)
{
    if (routed) *routed = 0;
    if (!h || !h->route || version >= 0 || (label && label[0])) return version;
    int64_t v = h->route(h->route_ctx, model, key && key[0] ? key : NULL);
    if (v >= 0 && routed) *routed = 1;
    return v >= 0 ? v : version;
}

kiln_status kiln_observers_check(const kiln_observers *h, const kiln_observation *o, char *err,
                                 const char **code)
{
    if (!h) return KILN_OK;
    for (int i = 0; i < h->n; i++) {
        if (!h->obs[i].check) continue;
        const char *c = "INVALID_ARGUMENT";
        kiln_status st = h->obs[i].check(h->obs[i].ctx, o, err, &c);
        if (st != KILN_OK) {
            if (code) *code = c;
            return st;
        }
    }
    return KILN_OK;
}

void kiln_observers_after(const kiln_observers *h, const kiln_observation *o)
{
    if (!h) return;
    for (int i = 0; i < h->n; i++)
        if (h->obs[i].after) h->obs[i].after(h->obs[i].ctx, o);
}

void kiln_observers_write_metrics(const kiln_observers *h, kiln_sbuf *b)
{
    if (!h) return;
    for (int i = 0; i < h->n; i++)
        if (h->obs[i].write_metrics) h->obs[i].write_metrics(h->obs[i].ctx, b);
}

int kiln_observers_write_json(const kiln_observers *h, const char *name, const char *model,
                              kiln_sbuf *b)
{
    if (!h) return 0;
    for (int i = 0; i < h->n; i++)
        if (h->obs[i].write_json && h->obs[i].name && strcmp(h->obs[i].name, name) == 0) {
            h->obs[i].write_json(h->obs[i].ctx, model, b);
            return 1;
        }
    return 0;
}

double kiln_observe_now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}
