/*
 * observe.h - the hooks of the predict path that rollouts and monitoring
 * hang on, shared by REST (TF Serving's API and KServe v2) and gRPC.
 *
 * Every request that runs a model goes through three points, in this
 * order, on the request's own thread:
 *
 *   route   which version serves a request that names no version and no
 *           label: a traffic split or a canary answers with a version
 *           (possibly chosen by hashing the request's route key, so one
 *           user keeps one version), or -1 for the default (the highest
 *           served version). A request that names a version or a label
 *           goes where it says and is never routed.
 *   check   before the run, with the decoded inputs: an observer may
 *           refuse the request (input validation rules answer 400 naming
 *           the input) with a TF code name and a message.
 *   after   after the run, with the inputs, the outputs (NULL when the
 *           run failed), the code and the run's latency: windows of the
 *           canary gates, shadow traffic, drift and confidence, the
 *           request log.
 *
 * Observers are registered before the server starts and never removed;
 * each keeps its own state, its own lock and its own configuration
 * reload. The hub itself holds no lock: after start, it is read-only.
 * An observer's `after` must not block and must not allocate per request
 * on the common path (the request's latency is the user's).
 *
 * The route key comes from the request header named route_header (REST)
 * or the gRPC metadata key of the same name in lower case; the
 * Authorization header is carried too, for admin endpoints and tokens.
 */
#ifndef KILN_SERVE_OBSERVE_H
#define KILN_SERVE_OBSERVE_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

struct kiln_servable;
struct kiln_batch_result;
struct kiln_sbuf;

#define KILN_OBSERVERS_MAX 8
#define KILN_ROUTE_KEY_MAX 256

/* One run of a model version, as the observers see it. Everything is
 * borrowed for the duration of the call. */
typedef struct kiln_observation {
    const char *entrypoint;       /* "REST" or "GRPC" */
    const char *api;              /* "predict", "classify", "regress" */
    const char *model;            /* the model's served name */
    struct kiln_servable *sv;     /* the version that ran (sv->version) */
    int si;                       /* signature index in sv */
    kiln_tensor *const *inputs;   /* the signature's inputs, in order */
    int n_inputs;
    const struct kiln_batch_result *out; /* outputs; NULL when the run failed */
    const char *code;             /* TF code name: "OK", "DEADLINE_EXCEEDED", ... */
    double latency_us;            /* the run, from check to after */
    int routed;                   /* 1: the version was chosen by route (a split) */
    const char *route_key;        /* the request's route key, or NULL */
} kiln_observation;

typedef struct kiln_observer {
    const char *name;             /* for logs ("rollout", "monitor", ...) */
    void *ctx;
    /* Before the run; return non-KILN_OK to refuse the request with *code
     * (TF code name, e.g. "INVALID_ARGUMENT") and err (KILN_JSON_ERR_LEN
     * bytes). NULL: no check. */
    kiln_status (*check)(void *ctx, const kiln_observation *o, char *err, const char **code);
    /* After the run (successful or not). NULL: nothing. */
    void (*after)(void *ctx, const kiln_observation *o);
    /* Prometheus lines appended to the metrics page. NULL: none. */
    void (*write_metrics)(void *ctx, struct kiln_sbuf *b);
    /* One JSON value on the observer's view of `model` (GET
     * /v1/models/NAME/<observer name>, e.g. "monitoring"). NULL: none. */
    void (*write_json)(void *ctx, const char *model, struct kiln_sbuf *b);
} kiln_observer;

/* The version for a request to `model` that names none: >= 0 a served
 * version, -1 the default. key is the route key (NULL when the request
 * has none). */
typedef int64_t (*kiln_route_fn)(void *ctx, const char *model, const char *key);

typedef struct kiln_observers {
    kiln_route_fn route;          /* NULL: every request takes the default */
    void *route_ctx;
    char route_header[64];        /* header carrying the route key ("" = none) */
    int n;
    kiln_observer obs[KILN_OBSERVERS_MAX];
} kiln_observers;

/* An empty hub whose route key header is "X-Kiln-Route-Key". */
void kiln_observers_init(kiln_observers *h);
/* Register an observer (before the server starts); KILN_ERR_INVALID_ARGUMENT when
 * the hub is full. */
kiln_status kiln_observers_add(kiln_observers *h, const kiln_observer *o);
/* Set the route function (before the server starts). */
void kiln_observers_set_route(kiln_observers *h, kiln_route_fn fn, void *ctx);

/* The version a request should run on: `version` and `label` as the
 * request gave them (version < 0 and label NULL or "" = neither). When
 * the request names neither and a route function is set, it is asked;
 * *routed is set to 1 when it chose a version. h may be NULL. */
int64_t kiln_observers_route(const kiln_observers *h, const char *model, int64_t version,
                             const char *label, const char *key, int *routed);
/* Every observer's check, in registration order; the first refusal wins. */
kiln_status kiln_observers_check(const kiln_observers *h, const kiln_observation *o, char *err,
                                 const char **code);
/* Every observer's after. */
void kiln_observers_after(const kiln_observers *h, const kiln_observation *o);
/* CLOCK_MONOTONIC in microseconds (the observations' latency clock). */
double kiln_observe_now_us(void);
/* Every observer's metrics. */
void kiln_observers_write_metrics(const kiln_observers *h, struct kiln_sbuf *b);
/* The JSON view of `model` by the observer named `name`; 0 when no such
 * observer has one (nothing written). */
int kiln_observers_write_json(const kiln_observers *h, const char *name, const char *model,
                              struct kiln_sbuf *b);

#endif
