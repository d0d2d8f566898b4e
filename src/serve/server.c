/*
 * server.c - libmicrohttpd plumbing for server.h: per-connection body
 * accumulation with the size bound, gzip inflation, handing the complete
 * request to the route table, metrics per request, and shutdown.
 *
 * Each request is read on one of MHD's pool threads. Without batching it
 * also runs there, first byte to reply. With --enable_batching a POST
 * request's connection is suspended once its body is complete and the
 * request goes to one of the server's own request threads, which waits for
 * its rows to run in a batch (batch.c) and then resumes the connection; the
 * MHD thread meanwhile serves its other connections. (MHD's threads accept
 * several connections at a time, so a thread that waited inside a request
 * would hold up requests on its other connections for up to the batch
 * timeout, and they would miss the batch.) --rest_api_num_threads sets both
 * pools, and so bounds how many requests can join one batch.
 *
 * With a token check (opt.authorize, auth.c) a POST is checked when its
 * headers arrive and refused before its body is read; routes.c checks every
 * request again with its route's scope. With opt.tls the daemon speaks
 * HTTPS and takes its certificate per handshake from tls.c (HTTPS below).
 */
#define _GNU_SOURCE /* accept4 */
#include "serve/server.h"

#include "serve/batch.h"
#include "serve/tls.h"

#include <gnutls/gnutls.h>

#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

/* One open REST connection, from MHD's NOTIFY_CONNECTION started to closed
 * (its socket context), on the server's list for the drain (DRAIN below). */
typedef struct conn_track {
    struct MHD_Connection *conn;
    int fd;
    int64_t opened_ms;   /* kiln_monotonic_ms() at accept */
    atomic_int busy;     /* a request between its headers and its reply sent */
    atomic_int requests; /* requests begun on it */
    int shut;            /* drain: shut for writing (idle), under conns_mu */
    struct conn_track *prev, *next;
} conn_track;

/* Per-request state, from MHD's first call to its completion callback. */
typedef struct conn_state {
    kiln_sbuf body;
    int too_big;     /* the body passed the limit; the rest is discarded */
    int refused;     /* arrived after shutdown began */
    struct timespec start;
    int64_t deadline_ms; /* first byte + --rest_api_timeout_in_ms (kiln_monotonic_ms); 0 = none */
    /* offloaded requests: queued to a request thread with the connection suspended */
    int done;        /* rep holds the reply; the connection was resumed to send it */
    int loopback;    /* the peer is on this host */
    int answered;    /* refused (401/403) at its headers; the body is discarded */
    conn_track *track; /* its connection's, or NULL */
    struct MHD_Connection *conn;
    char *method, *url, *enc, *origin, *route_key, *authorization; /* copies: MHD's are not
                                                                      ours to read off its thread */
    kiln_http_reply rep;
    struct conn_state *next;
} conn_state;

static double elapsed_us(const struct timespec *a)
{
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a->tv_sec) * 1e6 + (double)(b.tv_nsec - a->tv_nsec) / 1e3;
}

/* Inflate a gzip body into out under `limit` bytes. 0 ok, 1 too big, -1 bad. */
static int gunzip(const char *in, size_t n, size_t limit, kiln_sbuf *out)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return -1;
    z.next_in = (Bytef *)(uintptr_t)in;
    z.avail_in = (uInt)n;
    char chunk[65536];
    int rc, result = 0;
    do {
        z.next_out = (Bytef *)chunk;
        z.avail_out = sizeof chunk;
        rc = inflate(&z, Z_NO_FLUSH);
        if (rc != Z_OK && rc != Z_STREAM_END) {
            result = -1;
            break;
        }
        size_t got = sizeof chunk - z.avail_out;
        if (out->len + got > limit) {
            result = 1;
            break;
        }
        kiln_sbuf_put(out, chunk, got);
        if (rc == Z_OK && got == 0 && z.avail_in == 0) {
            result = -1; /* truncated stream */
            break;
        }
    } while (rc != Z_STREAM_END);
    inflateEnd(&z);
    return result;
}

/* True if a Content-Encoding value names gzip (any case). */
static int contains_gzip(const char *v)
{
    for (; *v; v++)
        if (strncasecmp(v, "gzip", 4) == 0) return 1;
    return 0;
}

static enum MHD_Result send_reply(kiln_server *s, struct MHD_Connection *c, kiln_http_reply *rep)
{
    if (rep->body.oom) {
        kiln_sbuf_free(&rep->body);
        kiln_reply_error(rep, "RESOURCE_EXHAUSTED", "out of memory writing the response");
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(
        rep->body.len, rep->body.p ? rep->body.p : (void *)"", MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type",
                            rep->content_type ? rep->content_type : "application/json");
    if (rep->csp) { /* the web console: same-origin only, never sniffed, not cached stale */
        MHD_add_response_header(r, "Content-Security-Policy", rep->csp);
        MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
        MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
    }
    if (rep->www_authenticate) MHD_add_response_header(r, "WWW-Authenticate", rep->www_authenticate);
    if (atomic_load(&s->shutting_down)) /* draining: the client must not reuse the connection */
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    if (s->opt.cors) { /* TF Serving's AddCORSHeaders */
        MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "POST, GET");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Content-Type");
    }
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)rep->code, r);
    MHD_destroy_response(r);
    return ret;
}

/* The headers a request's handling reads. */
typedef struct req_headers {
    const char *enc, *origin, *route_key, *authorization;
    int loopback;
} req_headers;

/* Is the connection's peer on this host? */
static int peer_is_loopback(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr) return 0;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return 1;
        return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
    }
    return sa->sa_family == AF_UNIX;
}

/* libmicrohttpd's own connection limit (FD_SETSIZE - 4), which held on
 * epoll too: that many connections trickling their headers (slowloris)
 * blocked every other client. */
#define KILN_MHD_SELECT_LIMIT 1020u
#define KILN_MAX_CONNECTIONS 16384u

/* How many REST connections to allow: the open-file limit, raised to its
 * hard limit (as servers do), less a reserve for model files, gRPC and
 * logs, within [KILN_MHD_SELECT_LIMIT, KILN_MAX_CONNECTIONS]. At 16 KiB of
 * memory pool each, the top is 256 MiB. */
static unsigned connection_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return KILN_MHD_SELECT_LIMIT;
    rlim_t want = KILN_MAX_CONNECTIONS + 1024;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        struct rlimit up = rl;
        up.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
    }
    rlim_t n = rl.rlim_cur == RLIM_INFINITY ? want : rl.rlim_cur;
    n = n > 1024 ? n - 1024 : 0;
    if (n < KILN_MHD_SELECT_LIMIT) return KILN_MHD_SELECT_LIMIT;
    return n > KILN_MAX_CONNECTIONS ? KILN_MAX_CONNECTIONS : (unsigned)n;
}

int kiln_server_authorize(const kiln_server *s, const kiln_http_request *req, const char *scope)
{
    if (s->opt.authorize) return s->opt.authorize(s->opt.authorize_ctx, req->authorization, scope);
    if (scope && strcmp(scope, "admin") == 0 && !req->loopback) return 403;
    return 0;
}

/* The route key header's name (observe.h), or NULL. */
static const char *route_header(const kiln_server *s)
{
    return s->opt.observers && s->opt.observers->route_header[0] ? s->opt.observers->route_header
                                                                 : NULL;
}

static const char *header(struct MHD_Connection *c, const char *name)
{
    return name ? MHD_lookup_connection_value(c, MHD_HEADER_KIND, name) : NULL;
}

/* Answer the complete request in cs (its headers in h) into rep, and record
 * it in the metrics. */
static void handle(kiln_server *s, conn_state *cs, const char *method, const char *url,
                   const req_headers *h, kiln_http_reply *rep)
{
    const char *enc = h->enc;
    char msg[160];
    memset(rep, 0, sizeof *rep);
    rep->code = 200;
    rep->version = -1;
    if (cs->refused) {
        kiln_reply_error(rep, "UNAVAILABLE", "the server is shutting down");
    } else if (cs->too_big || cs->body.oom) {
        snprintf(msg, sizeof msg, "Request body exceeds the limit of %zu bytes", s->opt.max_body);
        kiln_reply_error(rep, "RESOURCE_EXHAUSTED", msg);
        rep->code = 413;
    } else {
        kiln_sbuf body = cs->body;
        kiln_sbuf inflated = {0};
        int bad = 0;
        if (enc && contains_gzip(enc) && body.len > 0) {
            int g = gunzip(body.p, body.len, s->opt.max_body, &inflated);
            if (g != 0 || inflated.oom) {
                bad = 1;
                if (g == 1 || inflated.oom) {
                    snprintf(msg, sizeof msg,
                             "Request body exceeds the limit of %zu bytes after gzip decompression",
                             s->opt.max_body);
                    kiln_reply_error(rep, "RESOURCE_EXHAUSTED", msg);
                    rep->code = 413;
                } else {
                    kiln_reply_error(rep, "INVALID_ARGUMENT", "Failed to decompress the gzip body");
                }
            }
            body = inflated;
        }
        if (!bad) {
            kiln_http_request req = {method,    url,         body.p ? body.p : "", body.len,
                                     cs->deadline_ms, h->origin, h->route_key, h->authorization,
                                     h->loopback};
            kiln_routes_dispatch(s, &req, rep);
            if (cs->deadline_ms > 0 && kiln_monotonic_ms() > cs->deadline_ms && rep->code == 200 &&
                rep->api && (strcmp(rep->api, "predict") == 0 || strcmp(rep->api, "classify") == 0 ||
                             strcmp(rep->api, "regress") == 0)) {
                /* finished after the deadline (a batch that ran for a later
                 * request's deadline, or the last node): still a timeout */
                kiln_sbuf_free(&rep->body);
                kiln_reply_error(rep, "DEADLINE_EXCEEDED", KILN_DEADLINE_MESSAGE);
            }
        }
        kiln_sbuf_free(&inflated);
    }
    if (rep->model[0])
        kiln_metrics_record(s->metrics, rep->model, rep->version, rep->api ? rep->api : "",
                            rep->status ? rep->status : "OK", elapsed_us(&cs->start));
}

/* The request threads (opt.offload): take a queued request, answer it, resume
 * its connection so that MHD sends the reply. */
static void *request_thread(void *arg)
{
    kiln_server *s = arg;
    pthread_mutex_lock(&s->jobs_mu);
    for (;;) {
        while (!s->jobs_head && !s->jobs_stop) pthread_cond_wait(&s->jobs_cv, &s->jobs_mu);
        conn_state *cs = s->jobs_head;
        if (!cs) break; /* stopping, queue empty */
        s->jobs_head = cs->next;
        if (!s->jobs_head) s->jobs_tail = NULL;
        pthread_mutex_unlock(&s->jobs_mu);
        if (atomic_load(&s->jobs_refuse)) cs->refused = 1; /* answered UNAVAILABLE */
        req_headers h = {cs->enc, cs->origin, cs->route_key, cs->authorization, cs->loopback};
        handle(s, cs, cs->method, cs->url, &h, &cs->rep);
        cs->done = 1;
        MHD_resume_connection(cs->conn);
        pthread_mutex_lock(&s->jobs_mu);
    }
    pthread_mutex_unlock(&s->jobs_mu);
    return NULL;
}

static char *dup_or_null(const char *v, int *oom)
{
    if (!v) return NULL;
    char *d = strdup(v);
    if (!d) *oom = 1;
    return d;
}

/* Queue cs's request for a request thread and suspend its connection; 0 when
 * out of memory (the caller then answers it inline). */
static int offload(kiln_server *s, struct MHD_Connection *c, conn_state *cs, const char *method,
                   const char *url)
{
    int oom = 0;
    cs->method = dup_or_null(method, &oom);
    cs->url = dup_or_null(url, &oom);
    cs->enc = dup_or_null(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Encoding"), &oom);
    cs->origin = dup_or_null(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"), &oom);
    cs->route_key = dup_or_null(header(c, route_header(s)), &oom);
    cs->authorization = dup_or_null(header(c, "Authorization"), &oom);
    cs->loopback = peer_is_loopback(c);
    if (oom) return 0;
    cs->conn = c;
    pthread_mutex_lock(&s->jobs_mu);
    if (s->jobs_stop) { /* shutting down: no thread would resume it */
        pthread_mutex_unlock(&s->jobs_mu);
        return 0;
    }
    MHD_suspend_connection(c); /* before a request thread can resume it */
    cs->next = NULL;
    if (s->jobs_tail) ((conn_state *)s->jobs_tail)->next = cs;
    else s->jobs_head = cs;
    s->jobs_tail = cs;
    pthread_cond_signal(&s->jobs_cv);
    pthread_mutex_unlock(&s->jobs_mu);
    return 1;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    kiln_server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) {
        cs = calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        clock_gettime(CLOCK_MONOTONIC, &cs->start);
        if (s->opt.timeout_ms > 0) cs->deadline_ms = kiln_monotonic_ms() + s->opt.timeout_ms;
        atomic_fetch_add(&s->in_flight, 1);
        const union MHD_ConnectionInfo *ti =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        cs->track = ti ? ti->socket_context : NULL;
        if (cs->track) {
            atomic_store(&cs->track->busy, 1);
            atomic_fetch_add(&cs->track->requests, 1);
        }
        *con_cls = cs;
        cs->refused = atomic_load(&s->shutting_down);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->opt.max_body) cs->too_big = 1;
        if (s->opt.authorize && !cs->refused && strcmp(method, "POST") == 0) {
            /* no valid token: answer now, before any of the body is read */
            kiln_http_request req = {method, url, "", 0, 0, NULL, NULL, header(c, "Authorization"),
                                     peer_is_loopback(c)};
            kiln_http_reply rep;
            memset(&rep, 0, sizeof rep);
            rep.version = -1;
            if (kiln_routes_refuse_unauthorized(s, &req, &rep)) {
                cs->answered = 1;
                enum MHD_Result r = send_reply(s, c, &rep);
                kiln_sbuf_free(&rep.body);
                return r;
            }
            kiln_sbuf_free(&rep.body);
        }
        return MHD_YES;
    }
    if (cs->answered) { /* refused at its headers: drop whatever body still comes */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cs->too_big) {
            if (cs->body.len + *upload_size > s->opt.max_body) {
                cs->too_big = 1;
                kiln_sbuf_free(&cs->body);
            } else {
                kiln_sbuf_put(&cs->body, upload, *upload_size);
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }

    if (cs->done) { /* an offloaded request's reply, after the resume */
        enum MHD_Result r = send_reply(s, c, &cs->rep);
        kiln_sbuf_free(&cs->rep.body);
        return r;
    }
    if (s->opt.offload && !cs->refused && !cs->too_big && !cs->body.oom &&
        strcmp(method, "POST") == 0 && offload(s, c, cs, method, url)) {
        (void)version;
        return MHD_YES;
    }
    kiln_http_reply rep;
    req_headers h = {header(c, "Content-Encoding"), header(c, "Origin"), header(c, route_header(s)),
                     header(c, "Authorization"), peer_is_loopback(c)};
    handle(s, cs, method, url, &h, &rep);
    enum MHD_Result r = send_reply(s, c, &rep);
    kiln_sbuf_free(&rep.body);
    (void)version;
    return r;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    kiln_server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) return;
    kiln_sbuf_free(&cs->body);
    kiln_sbuf_free(&cs->rep.body); /* an offloaded reply MHD never sent */
    free(cs->method);
    free(cs->url);
    free(cs->enc);
    free(cs->origin);
    free(cs->route_key);
    free(cs->authorization);
    if (cs->track) atomic_store(&cs->track->busy, 0);
    free(cs);
    *con_cls = NULL;
    atomic_fetch_sub(&s->in_flight, 1);
}

/* MHD_OPTION_NOTIFY_CONNECTION: keep the list of open connections. MHD
 * calls "closed" before it closes the socket, so under conns_mu a listed
 * connection's fd is open. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    kiln_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_track *t = calloc(1, sizeof *t);
        *socket_context = t;
        if (!t) return; /* untracked: the drain does not wait for it */
        t->conn = c;
        t->opened_ms = kiln_monotonic_ms();
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        t->fd = ci ? (int)ci->connect_fd : -1;
        pthread_mutex_lock(&s->conns_mu);
        t->next = s->conns;
        if (t->next) t->next->prev = t;
        s->conns = t;
        pthread_mutex_unlock(&s->conns_mu);
        atomic_fetch_add(&s->open_conns, 1);
        return;
    }
    conn_track *t = *socket_context;
    if (!t) return;
    pthread_mutex_lock(&s->conns_mu);
    if (t->prev) t->prev->next = t->next;
    else s->conns = t->next;
    if (t->next) t->next->prev = t->prev;
    pthread_mutex_unlock(&s->conns_mu);
    atomic_fetch_sub(&s->open_conns, 1);
    free(t);
    *socket_context = NULL;
}

/* ------------------------------------------------------------ DRAIN
 *
 * On SIGTERM, as production HTTP servers drain (Go's Server.Shutdown, nginx's
 * graceful quit): stop accepting, answer every request a connection has
 * begun, close the connections that are idle, then stop.
 *
 * 1. Quiesce and take the backlog: connections whose handshake the kernel
 *    already completed are accepted and handed to MHD (their requests are
 *    answered 503), with a filter on the listening socket that drops every
 *    new SYN while the backlog is emptied, so none completes after the last
 *    accept. Closing the socket then resets nothing; a client whose SYN was
 *    dropped is refused on its retry.
 * 2. Wait (up to drain_ms) until no connection is busy: a request between its
 *    headers and its reply sent, bytes the kernel holds unread, or a new
 *    connection (no request yet) younger than KILN_DRAIN_NEW_MS, which
 *    gets that long to send its first request (Go allows 5 s). Replies sent
 *    meanwhile say "Connection: close".
 * 3. Idle keep-alive connections are shut for writing (a FIN: the client
 *    reads EOF) rather than closed, so a request the client sends in that
 *    moment is read, not answered with a reset; once the clients have closed
 *    (at most KILN_DRAIN_LINGER_MS) MHD_stop_daemon closes what is left. */
#define KILN_DRAIN_NEW_MS 2000
#define KILN_DRAIN_LINGER_MS 500

/* Bytes the kernel holds for the connection that MHD has not read yet. */
static int has_unread(int fd)
{
    char b;
    if (fd < 0) return 0;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0;
}

/* How many connections still owe or may still be sent a request (step 2);
 * with shut_idle, the others are shut for writing (step 3). */
static int drain_busy(kiln_server *s, int64_t now, int shut_idle)
{
    int busy = 0;
    pthread_mutex_lock(&s->conns_mu);
    for (conn_track *t = s->conns; t; t = t->next) {
        if (atomic_load(&t->busy) || has_unread(t->fd) ||
            (atomic_load(&t->requests) == 0 && now - t->opened_ms < KILN_DRAIN_NEW_MS)) {
            busy++;
        } else if (shut_idle && !t->shut && t->fd >= 0) {
            shutdown(t->fd, SHUT_WR);
            t->shut = 1;
        }
    }
    pthread_mutex_unlock(&s->conns_mu);
    return busy;
}

/* Step 1 on the quiesced listening socket fd: accept its backlog into MHD,
 * then close it. */
static void take_backlog(kiln_server *s, int fd)
{
    /* A TCP socket's filter sees the TCP header: drop segments with SYN set
     * (byte 13, bit 0x02), keep the rest, so handshakes already answered
     * still complete into the backlog and are taken below. */
    struct sock_filter no_syn[] = {
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 13),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x02, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, 0),
        BPF_STMT(BPF_RET | BPF_K, 0xffffffffu), /* all of it (accepted sockets inherit this) */
    };
    struct sock_fprog prog = {4, no_syn};
    (void)setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog); /* best effort */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    for (int n = 0, pass = 0; n < 65536; n++) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        int c = accept4(fd, (struct sockaddr *)&sa, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) break;
            if (pass++ == 1) break; /* empty twice */
            usleep(20 * 1000); /* handshakes answered before the filter: their ACKs */
            continue;
        }
        /* MHD closes c itself if it cannot take it */
        (void)MHD_add_connection(s->daemon, c, (const struct sockaddr *)&sa, len);
    }
    close(fd);
}

/* ------------------------------------------------------------ HTTPS */

/* libmicrohttpd's certificate callback takes no context pointer, so the
 * REST port's credentials are process-wide: one HTTPS server per process
 * (kiln_server_start refuses a second). */
static kiln_tls *https_tls;
static atomic_int https_in_use;

/* The handshake's check of a client certificate (client_verify): the chain
 * must verify against the current credentials' CA. */
static int https_verify_client(gnutls_session_t session)
{
    unsigned n = 0;
    const gnutls_datum_t *peers = gnutls_certificate_get_peers(session, &n);
    return kiln_tls_verify_peers(kiln_tls_current(https_tls), peers, n) ? 0
                                                                         : GNUTLS_E_CERTIFICATE_ERROR;
}

/* GnuTLS asks for the server's certificate during each handshake: the
 * current generation's (tls.c re-reads the files when they change). The
 * generation outlives every session that uses it. */
static int https_retrieve_cert(gnutls_session_t session, const gnutls_datum_t *req_ca_dn, int nreqs,
                               const gnutls_pk_algorithm_t *pk_algos, int pk_algos_length,
                               gnutls_pcert_st **pcert, unsigned int *pcert_length,
                               gnutls_privkey_t *privkey)
{
    const kiln_tls_gen *g = kiln_tls_current(https_tls);
    *pcert = (gnutls_pcert_st *)g->pcert;
    *pcert_length = g->n_pcert;
    *privkey = g->key;
    if (g->client_verify) { /* before the CertificateRequest goes out, in TLS 1.2 and 1.3 */
        gnutls_certificate_server_set_request(session, GNUTLS_CERT_REQUIRE);
        gnutls_session_set_verify_function(session, https_verify_client);
    }
    return 0;
}

/* Stop the request threads: queued requests are answered first (UNAVAILABLE
 * when refuse_queued), running ones finish. From here on offload() declines,
 * so no connection is suspended again. The lock and condition stay until
 * request_threads_free, after MHD's threads are gone. */
static void stop_request_threads(kiln_server *s, int refuse_queued)
{
    if (refuse_queued) atomic_store(&s->jobs_refuse, 1);
    pthread_mutex_lock(&s->jobs_mu);
    s->jobs_stop = 1;
    pthread_cond_broadcast(&s->jobs_cv);
    pthread_mutex_unlock(&s->jobs_mu);
    for (int i = 0; i < s->n_workers; i++) pthread_join(s->workers[i], NULL);
    free(s->workers);
    s->workers = NULL;
    s->n_workers = 0;
}

static void request_threads_free(kiln_server *s)
{
    pthread_cond_destroy(&s->jobs_cv);
    pthread_mutex_destroy(&s->jobs_mu);
}

static kiln_status start_request_threads(kiln_server *s, int n)
{
    pthread_mutex_init(&s->jobs_mu, NULL);
    pthread_cond_init(&s->jobs_cv, NULL);
    s->workers = calloc((size_t)n, sizeof *s->workers);
    for (int i = 0; s->workers && i < n; i++) {
        if (pthread_create(&s->workers[i], NULL, request_thread, s) != 0) break;
        s->n_workers++;
    }
    if (s->n_workers > 0) return KILN_OK;
    kiln_status st = s->workers ? KILN_ERR_RUNTIME : KILN_ERR_OUT_OF_MEMORY;
    free(s->workers);
    s->workers = NULL;
    request_threads_free(s);
    return st;
}

kiln_status kiln_server_start(kiln_server *s, const kiln_server_options *opt, kiln_manager *mgr)
{
    memset(s, 0, sizeof *s);
    s->opt = *opt;
    s->manager = mgr;
    s->metrics = kiln_metrics_create();
    if (!s->metrics) return KILN_ERR_OUT_OF_MEMORY;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)opt->rest_port);
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    if (opt->address && inet_pton(AF_INET, opt->address, &addr.sin_addr) != 1) {
        fprintf(stderr, "kiln serve: '%s' is not an IPv4 address\n", opt->address);
        kiln_metrics_free(s->metrics);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    /* Bodies go to the connection's own buffer (on_request), so MHD's per-connection pool only
     * holds headers and read buffers: 16 KiB (request headers up to about 8 KiB, as most HTTP
     * servers allow). A larger pool costs CPU on every keep-alive request (MHD clears it between
     * requests: 256 KiB was 6.5% of a small model's profile, 64 KiB 4.4%). */
    unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_AUTO;
    struct MHD_OptionItem tls_opts[] = {{MHD_OPTION_END, 0, NULL}, {MHD_OPTION_END, 0, NULL}};
    if (opt->tls) {
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES ||
            MHD_is_feature_supported(MHD_FEATURE_HTTPS_CERT_CALLBACK) != MHD_YES) {
            fprintf(stderr, "kiln serve: this libmicrohttpd was built without TLS (GnuTLS) or "
                            "its certificate callback, so the REST port cannot serve HTTPS; "
                            "install a libmicrohttpd built with GnuTLS (Debian's is)\n");
            kiln_metrics_free(s->metrics);
            s->metrics = NULL;
            return KILN_ERR_UNSUPPORTED;
        }
        if (atomic_exchange(&https_in_use, 1)) {
            fprintf(stderr, "kiln serve: one HTTPS REST server per process\n");
            kiln_metrics_free(s->metrics);
            s->metrics = NULL;
            return KILN_ERR_UNSUPPORTED;
        }
        https_tls = opt->tls;
        flags |= MHD_USE_TLS;
        tls_opts[0].option = MHD_OPTION_HTTPS_CERT_CALLBACK;
        tls_opts[0].ptr_value = (void *)https_retrieve_cert;
    }
    if (opt->offload) {
        flags |= MHD_ALLOW_SUSPEND_RESUME;
        kiln_status st = start_request_threads(s, opt->num_threads);
        if (st != KILN_OK) {
            if (opt->tls) atomic_store(&https_in_use, 0);
            kiln_metrics_free(s->metrics);
            s->metrics = NULL;
            return st;
        }
    }
    unsigned conn_limit = connection_limit();
    pthread_mutex_init(&s->conns_mu, NULL);
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)opt->rest_port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&addr, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)opt->num_threads,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)120, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(16 * 1024),
        MHD_OPTION_CONNECTION_LIMIT, conn_limit, MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
        MHD_OPTION_ARRAY, tls_opts, MHD_OPTION_END);
    if (!s->daemon && conn_limit > KILN_MHD_SELECT_LIMIT) /* a libmicrohttpd on select() */
        s->daemon = MHD_start_daemon(
            flags, (uint16_t)opt->rest_port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
            (struct sockaddr *)&addr, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)opt->num_threads,
            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
            on_connection, s, MHD_OPTION_CONNECTION_TIMEOUT,
            (unsigned)120, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(16 * 1024),
            MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_ARRAY, tls_opts,
            MHD_OPTION_END);
    if (!s->daemon) {
        pthread_mutex_destroy(&s->conns_mu);
        if (opt->tls) atomic_store(&https_in_use, 0);
        if (opt->offload) {
            stop_request_threads(s, 0);
            request_threads_free(s);
        }
        kiln_metrics_free(s->metrics);
        s->metrics = NULL;
        return KILN_ERR_IO;
    }
    return KILN_OK;
}

void kiln_server_stop(kiln_server *s, int drain_ms)
{
    atomic_store(&s->shutting_down, 1);
    if (!s->daemon) return;
    /* stop accepting, and close the listening socket now: left open through
     * the drain, the kernel would keep completing connections into its
     * backlog that nobody accepts, all reset at the end */
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd != MHD_INVALID_SOCKET) take_backlog(s, fd);
    int64_t end = kiln_monotonic_ms() + drain_ms;
    for (;;) { /* step 2 */
        int64_t now = kiln_monotonic_ms();
        if ((drain_busy(s, now, 0) == 0 && atomic_load(&s->in_flight) == 0) || now >= end) break;
        usleep(5 * 1000);
    }
    int64_t linger_end = kiln_monotonic_ms() + KILN_DRAIN_LINGER_MS;
    if (linger_end > end) linger_end = end;
    for (;;) { /* step 3 */
        int64_t now = kiln_monotonic_ms();
        int busy = drain_busy(s, now, 1);
        if ((busy == 0 && atomic_load(&s->open_conns) == 0) || now >= linger_end) break;
        usleep(5 * 1000);
    }
    if (s->opt.offload) {
        /* MHD must not stop with a connection suspended: answer what is still
         * queued (UNAVAILABLE), let running requests finish, and give MHD a
         * moment to send those replies */
        stop_request_threads(s, 1);
        for (int extra = 0; atomic_load(&s->in_flight) > 0 && extra < 1000; extra += 10)
            usleep(10 * 1000);
    }
    MHD_stop_daemon(s->daemon);
    pthread_mutex_destroy(&s->conns_mu);
    if (s->opt.offload) request_threads_free(s);
    s->daemon = NULL;
    if (s->opt.tls) atomic_store(&https_in_use, 0);
    kiln_metrics_free(s->metrics);
    s->metrics = NULL;
}
