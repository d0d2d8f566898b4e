/*
 * server.h - `kiln serve`'s HTTP server: libmicrohttpd with a worker-thread
 * pool, request bodies read with a size bound (gzip bodies inflated under
 * the same bound), one route table (routes.c) for TF Serving's REST API,
 * KServe v2 and Prometheus, TF Serving's CORS support
 * (--rest_api_enable_cors_support: Access-Control-Allow-Origin: *,
 * -Methods: POST, GET, -Headers: Content-Type on every reply; an OPTIONS
 * preflight is answered 200 when its Origin is an http(s) URL, else 400
 * "Origin header is missing in CORS preflight"), per-request deadlines
 * (--rest_api_timeout_in_ms, passed to the model run; 504), and graceful
 * shutdown (readiness off, stop
 * accepting, drain in-flight requests, bounded). With opt.tls the port
 * speaks HTTPS (libmicrohttpd over GnuTLS), its certificate chosen per
 * handshake from the current credentials so that rotation needs no restart,
 * and with client_verify the client's certificate is required and checked
 * during the handshake.
 */
#ifndef KILN_SERVE_SERVER_H
#define KILN_SERVE_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "serve/json.h"
#include "serve/manager.h"
#include "serve/metrics.h"
#include "serve/observe.h"

/* Access control (tokens with scopes): 0 when `authorization` (the
 * request's Authorization header, or NULL) grants `scope` ("predict",
 * "metadata", "admin", ...), else the HTTP status to answer: 401 (no or
 * unknown token) or 403 (a token without the scope). */
typedef int (*kiln_authorize_fn)(void *ctx, const char *authorization, const char *scope);

struct kiln_tls;
struct kiln_server;
struct kiln_http_request;
struct kiln_http_reply;

typedef struct kiln_server_options {
    const char *address;   /* listen address (NULL = all interfaces) */
    int rest_port;         /* --rest_api_port */
    int num_threads;       /* --rest_api_num_threads */
    int timeout_ms;        /* --rest_api_timeout_in_ms: runs stop there, 504 (0 = none) */
    size_t max_body;       /* request body limit after decompression */
    struct kiln_batch_stats *batch_stats; /* batching counters for /metrics, or NULL */
    const char *metrics_path; /* Prometheus page (--monitoring_config_file), NULL = off */
    int cors;              /* --rest_api_enable_cors_support */
    int offload;           /* run POST requests on the server's own request threads (batching) */
    int console;           /* serve the web console at /console/ (--enable_console) */
    const kiln_observers *observers; /* the predict path's hooks (observe.h); NULL = none */
    kiln_authorize_fn authorize;     /* NULL: open, as TF Serving; admin needs loopback */
    void *authorize_ctx;
    struct kiln_tls *tls;  /* HTTPS with these credentials (tls.h: re-read when their files
                              change), or NULL for plain HTTP; borrowed until stop */
    struct kiln_shadow *shadow;      /* GET /v1/shadow (shadow/shadow.h); NULL = none */
    /* Extra REST routes owned by another module (the rollout admin
     * endpoints, src/serve/rollout/): every request whose path starts with
     * ext_prefix goes to ext_handler, which fills the reply. NULL: none. */
    const char *ext_prefix;
    void (*ext_handler)(void *ctx, struct kiln_server *s, const struct kiln_http_request *req,
                        struct kiln_http_reply *rep);
    void *ext_ctx;
} kiln_server_options;

typedef struct kiln_server {
    kiln_server_options opt;
    kiln_manager *manager;      /* borrowed */
    kiln_metrics *metrics;      /* owned */
    struct MHD_Daemon *daemon;
    atomic_int in_flight;       /* requests between first byte and reply sent */
    atomic_int shutting_down;   /* readiness false, new requests refused */
    /* opt.offload: request threads taking suspended connections' requests */
    pthread_t *workers;
    int n_workers;
    pthread_mutex_t jobs_mu;
    pthread_cond_t jobs_cv;
    void *jobs_head, *jobs_tail; /* conn_state queue (server.c) */
    int jobs_stop;               /* under jobs_mu: workers exit once the queue is empty,
                                    and no request is queued any more */
    atomic_int jobs_refuse;      /* queued requests are answered UNAVAILABLE (stopping) */
    /* open REST connections (server.c's conn_track list), for the drain */
    pthread_mutex_t conns_mu;
    void *conns;                 /* under conns_mu */
    atomic_int open_conns;
} kiln_server;

/* A request as the route handlers see it. */
typedef struct kiln_http_request {
    const char *method;
    const char *path;
    const char *body;           /* NUL-terminated copy; may be empty */
    size_t body_len;
    int64_t deadline_ms;        /* kiln_monotonic_ms() clock; 0 = none */
    const char *origin;         /* the Origin header, or NULL */
    const char *route_key;      /* the observers' route key header, or NULL */
    const char *authorization;  /* the Authorization header, or NULL */
    int loopback;               /* the peer is on this host (127.0.0.0/8, ::1) */
} kiln_http_request;

/* The reply a handler fills. */
typedef struct kiln_http_reply {
    int code;                   /* HTTP status */
    const char *content_type;   /* default application/json */
    kiln_sbuf body;
    char model[256];            /* for metrics: the model named, or "" */
    int64_t version;            /* for metrics: the version that served it, or -1 */
    const char *api;            /* "predict", "metadata", ... */
    const char *status;         /* TF code name for metrics ("OK", ...) */
    const char *csp;            /* Content-Security-Policy (the console's replies), or NULL */
    int routed;                 /* the version was chosen by a traffic split (observe.h) */
    const char *www_authenticate; /* a 401's WWW-Authenticate challenge, or NULL */
} kiln_http_reply;

kiln_status kiln_server_start(kiln_server *s, const kiln_server_options *opt, kiln_manager *mgr);
/* Readiness off, stop accepting (connections already completed by the
 * kernel are still taken and answered), wait up to drain_ms until every
 * connection's request has been answered (replies then say Connection:
 * close; a new connection gets a moment to send its first request), close
 * idle keep-alive connections gracefully, stop the daemon. */
void kiln_server_stop(kiln_server *s, int drain_ms);

/* May this request use `scope`? 0 yes, else the HTTP status to answer (401
 * or 403). With opt.authorize its answer; without, every scope is open
 * except "admin", which only loopback peers get. */
int kiln_server_authorize(const kiln_server *s, const kiln_http_request *req, const char *scope);

/* The access check alone, from the method, path and headers (routes.c):
 * 1 with rep holding the 401/403 answer, else 0. The server asks it when a
 * POST's headers arrive, so a client without a valid token cannot make it
 * read, buffer and inflate a body. */
int kiln_routes_refuse_unauthorized(kiln_server *s, const kiln_http_request *req,
                                    kiln_http_reply *rep);
/* Route a complete request (routes.c). */
void kiln_routes_dispatch(kiln_server *s, const kiln_http_request *req, kiln_http_reply *rep);
/* Fill rep with {"error": msg} and the HTTP code for TF code name `code`. */
void kiln_reply_error(kiln_http_reply *rep, const char *code, const char *msg);

#endif
