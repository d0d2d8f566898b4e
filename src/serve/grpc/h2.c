/*
 * h2.c - the gRPC transport of grpc.h: HTTP/2 with libnghttp2, gRPC's
 * length-prefixed messages, deadlines, compression and status trailers.
 *
 * One loop thread owns every socket and nghttp2 session (nghttp2 is not
 * thread-safe): it accepts on --port and --grpc_socket_path, feeds what it
 * reads to nghttp2_session_mem_recv, and writes what nghttp2_session_mem_send
 * produces in one write() per turn. A stream's DATA is cut into gRPC
 * messages as it arrives (the 5-byte prefix first, so a message over
 * grpc.max_receive_message_length is refused with RESOURCE_EXHAUSTED before
 * any of it is buffered, and buffers grow only with the bytes that came).
 * A complete unary request goes to the request threads (--grpc_max_threads)
 * as a job; the handler's answer comes back through an eventfd and the loop
 * sends it. The hand-off is what a small request costs most (a wakeup is a
 * context switch), so it is batched both ways: the jobs of one loop turn are
 * queued under one lock; a sleeping thread is woken only while fewer than
 * max_awake are awake (without batching one per core, since a handler only
 * computes; while queued jobs wait a whole tick on awake threads that took
 * none, one more is allowed), and an awake thread takes the next job without
 * a wakeup; a thread writes the eventfd only when the loop has not been told
 * since it last took the answers, and the loop takes them all and writes
 * each connection once. An answer is HEADERS, one DATA message, and
 * trailers with grpc-status and grpc-message (an error before any message
 * is a Trailers-Only HEADERS).
 * Health.Watch and ServerReflectionInfo are streams the loop answers itself.
 *
 * Deadlines: grpc-timeout becomes the job's deadline (kiln_monotonic_ms) and
 * the run's; requests still arriving at their deadline are answered
 * DEADLINE_EXCEEDED by the loop's tick. A stream the client resets
 * (RST_STREAM) cancels its job: a queued one never runs, a running one stops
 * between steps (unbatched) and its answer is dropped.
 *
 * TLS (--ssl_config_file, --ssl_cert_file): GnuTLS under the same loop. A
 * connection takes the current credentials at accept (serve/tls.c re-reads
 * them when their files change, so a rotated certificate reaches new
 * connections without a restart), first completes its non-blocking
 * handshake (ALPN "h2"; with client_verify the client's certificate must
 * chain to the CA), then reads and writes go through gnutls_record_recv/send
 * instead of recv/send.
 *
 * Limits (grpc.h, docs/GRPC.md): concurrent streams and header list size
 * per connection, message sizes both ways, a connection count, an idle
 * timeout; nghttp2 itself polices SETTINGS/PING floods, rapid reset,
 * CONTINUATION floods and HPACK state; calm_meter adds a budget for frames
 * that carry nothing for a call (empty DATA, WINDOW_UPDATE, PRIORITY, ...).
 * Flow-control windows are 8 MiB per
 * stream and 32 MiB per connection, so large tensors do not stall on the
 * 64 KiB default; windows reopen only as request bytes are handed over, and
 * once a connection holds more than its budget (CONN_BUFFER, or max_recv
 * plus a window) they reopen only as its requests finish, so a client
 * cannot make the server buffer more than that per connection.
 */
#define _GNU_SOURCE /* accept4 */
#include "serve/grpc/h2.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <nghttp2/nghttp2.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <gnutls/gnutls.h>
#include <zlib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <linux/filter.h>
#include <sys/un.h>

#include "serve/config.h"
#include "serve/grpc/call.h"
#include "serve/tls.h"

#define STREAM_WINDOW (8 << 20)
#define CONN_WINDOW (32 << 20)
#define WRITE_BATCH (1 << 20)   /* bytes pulled from nghttp2 per write */
#define TICK_MS 100
#define CONN_BUFFER ((size_t)256 << 20) /* request bytes a connection may hold before its
                                           window stops opening (at least max_recv + a window) */
/* The budget of frames that carry nothing for a call (calm_meter below) */
#define CALM_BURST 1000         /* such frames a connection may send at once ... */
#define CALM_RATE 500           /* ... and per second after that */
#define CALM_SENT_CREDIT 2      /* given back per HEADERS or DATA frame the server sends */
#define CALM_ONE 1000           /* one frame, in the budget's unit (a thousandth of a frame) */
/* The drain (DRAIN below) */
#define DRAIN_PING_MS 1000      /* the final GOAWAY goes out without the PING's ACK after this */
#define DRAIN_LINGER_MS 500     /* a connection shut for writing waits this long for the client's close */
#define DRAIN_REFUSE_MAX 16     /* HEADERS above the last stream id refused per read */
static const uint8_t DRAIN_PING[8] = {'k', 'i', 'l', 'n', 'd', 'r', 'a', 'n'};

enum { ENC_IDENTITY = 0, ENC_GZIP, ENC_DEFLATE, ENC_UNKNOWN };
enum { ST_RECV = 0, ST_QUEUED, ST_STREAMING, ST_DONE };
enum { TAG_LISTEN = 1, TAG_EVENT, TAG_CONN };
/* A connection's drain: none; GOAWAY(2^31-1) and a PING sent; the GOAWAY with
 * the last stream id sent; shut for writing, waiting for the client's close. */
enum { DRAIN_NONE = 0, DRAIN_NOTICE, DRAIN_FINAL, DRAIN_SHUT };

typedef struct job job;
typedef struct stream stream;
typedef struct worker worker;

struct kiln_grpc_conn {
    int tag;                     /* TAG_CONN (first: epoll's data.ptr) */
    kiln_grpc_server *g;
    int fd;                      /* -1: detached (fuzzing) */
    nghttp2_session *s;
    kiln_bytes wbuf;             /* bytes to write */
    size_t woff;
    int epollout;                /* EPOLLOUT is registered */
    int dead;                    /* close at the end of this turn */
    gnutls_session_t tls;        /* NULL: plaintext */
    int handshake_done;
    stream *streams;             /* open streams (list) */
    size_t held;                 /* request bytes its streams hold (messages, requests) */
    int64_t last_active_ms;
    /* calm_meter: the client's frames as they arrive, seen before nghttp2 */
    uint32_t calm_preface;       /* bytes of the client magic passed (24 when done) */
    uint8_t calm_hd[9];          /* the frame header being read */
    uint32_t calm_hd_have;
    uint32_t calm_skip;          /* payload bytes left of the current frame */
    int64_t calm;                /* budget left, in CALM_ONE per frame */
    int64_t calm_ms;             /* when it was last refilled */
    int calm_over;               /* spent: GOAWAY ENHANCE_YOUR_CALM submitted */
    uint64_t calm_frames;        /* frame headers read (for the log line when it is spent) */
    uint64_t calm_charged;       /* of those, frames charged to the budget */
    int64_t born_ms;             /* accepted at (kiln_monotonic_ms) */
    /* the drain (DRAIN below) */
    int drain;                   /* DRAIN_* */
    int drain_acked;             /* the client acknowledged the drain PING */
    int64_t drain_ms;            /* when the current drain step began */
    int32_t drain_last_id;       /* the final GOAWAY's last stream id */
    int32_t refuse[DRAIN_REFUSE_MAX]; /* streams above it the client opened: REFUSED_STREAM */
    int n_refuse;
    char peer[80];               /* "address:port", "[v6]:port" or "unix:pid=..,uid=.." */
    int flush_queued;            /* on the server's flush list (answers to send) */
    kiln_grpc_conn *flush_next;
    kiln_grpc_conn *next, *prev;
};

struct stream {
    int32_t id;
    kiln_grpc_conn *c;
    char path[256];
    int post, content_type_ok, path_too_long;
    size_t header_bytes;
    int64_t deadline_ms;         /* 0 = none */
    int enc;                     /* request grpc-encoding */
    char route_key[KILN_ROUTE_KEY_MAX]; /* the observers' route key metadata ("" = none) */
    char authorization[512];     /* the authorization metadata ("" = none) */
    const kiln_grpc_method *m;
    int state;
    struct timespec start;
    /* framing of incoming DATA */
    uint8_t pfx[5];
    int pfx_have, in_msg;
    uint32_t msg_len;
    kiln_bytes msg;
    int n_msgs;
    kiln_bytes req;              /* the unary request message */
    size_t held;                 /* DATA bytes counted in c->held until released */
    size_t owed;                 /* DATA bytes not yet given back to flow control */
    job *job;                    /* queued or running; NULL otherwise */
    /* response */
    int headers_sent;
    kiln_bytes out;              /* framed messages not yet given to nghttp2 */
    size_t out_off;
    int out_eof;                 /* after out: trailers */
    int deferred;                /* the data provider is waiting for out */
    int code;
    char message[KILN_GRPC_MESSAGE_MAX + 16];
    /* Health.Watch */
    char watch_service[256];
    int watch_last;
    stream *next, *prev;
};

struct job {
    kiln_grpc_call call;
    const kiln_grpc_method *m;
    volatile int cancel;
    stream *st;                  /* loop thread only: NULL once the stream is gone */
    kiln_bytes req;              /* the request bytes call.req points into, once the stream
                                    is gone (stream_free hands them over: the request thread
                                    may still be reading them) */
    job *next;
};

/* A request thread: it sleeps on its own condition variable while on the
 * server's idle stack, so the loop wakes exactly the one it picks. */
struct worker {
    kiln_grpc_server *g;
    pthread_t t;
    pthread_cond_t cv;
    int woken;                   /* under mu: taken off the idle stack */
    worker *next_idle;
};

struct kiln_grpc_server {
    kiln_grpc_options opt;
    kiln_grpc_ctx ctx;
    int detached;
    int epfd, evfd;
    int listen_fd[2];
    int listen_tag[2];
    int ev_tag;
    char socket_path[108];
    pthread_t loop;
    int loop_started;
    worker *workers;
    int n_workers;               /* set before the loop starts */
    int workers_joined;          /* the stopping thread only */
    int base_awake;              /* request threads that may run at once: one per core
                                    without batching, all with batching (kiln_grpc_run) */
    int max_awake;               /* under mu: base_awake, raised while queued jobs wait on
                                    threads that are all blocked (tick) */
    uint64_t taken, taken_at_tick; /* under mu: jobs request threads have taken */
    pthread_mutex_t mu;
    job *pend_head, *pend_tail;  /* loop thread only: jobs of this turn, not yet queued */
    int n_pend;
    job *q_head, *q_tail;        /* under mu: jobs for the request threads */
    job *done_head;              /* under mu: answered jobs for the loop */
    int loop_notified;           /* under mu: the eventfd was written since the loop took done_head */
    worker *idle;                /* under mu: sleeping request threads (a stack: the last to
                                    sleep is woken first, its caches still warm) */
    int n_awake;                 /* under mu: request threads not on the idle stack */
    int stop_workers;            /* under mu */
    kiln_grpc_conn *flush_head;  /* loop thread only: connections with answers to send */
    atomic_int stop_loop;
    atomic_int draining;
    atomic_int drained;          /* the loop: draining, and no connection or call left */
    atomic_int in_flight;        /* unary calls between headers and answer */
    kiln_grpc_conn *conns;
    int n_conns;
    int64_t last_tick;
    kiln_tls *tls;               /* TLS credentials (borrowed), or NULL */
    gnutls_priority_t prio;
    size_t conn_budget;          /* CONN_BUFFER, or more for a large max_recv */
    /* loop thread only: the log of connections ended by calm_meter (flood_closed) */
    int64_t flood_logged_ms;     /* when the last line was written (0: never) */
    uint64_t flood_unlogged;     /* closings since then that got no line of their own */
};

/* ------------------------------------------------------------ options */

void kiln_grpc_options_default(kiln_grpc_options *o)
{
    memset(o, 0, sizeof *o);
    o->port = 8500;
    o->max_threads = 4;
    o->max_recv = KILN_GRPC_DEFAULT_MAX_RECV;
    o->max_send = KILN_GRPC_DEFAULT_MAX_SEND;
    o->max_streams = KILN_GRPC_MAX_STREAMS;
}

kiln_status kiln_grpc_parse_channel_args(const char *spec, kiln_grpc_options *o, char *err,
                                         size_t err_len)
{
    const char *p = spec ? spec : "";
    while (*p) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char kv[256];
        if (n >= sizeof kv) {
            snprintf(err, err_len, "--grpc_channel_arguments: argument '%.60s...' is too long", p);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        memcpy(kv, p, n);
        kv[n] = '\0';
        p += n + (end ? 1 : 0);
        if (n == 0) continue;
        char *eq = strchr(kv, '=');
        if (!eq) {
            snprintf(err, err_len, "--grpc_channel_arguments: '%s' is not key=value", kv);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        *eq = '\0';
        const char *key = kv, *val = eq + 1;
        char *e = NULL;
        errno = 0;
        long long v = strtoll(val, &e, 10);
        int is_int = *val && e && *e == '\0' && errno == 0;
        int64_t *lim = NULL;
        if (strcmp(key, "grpc.max_receive_message_length") == 0) lim = &o->max_recv;
        else if (strcmp(key, "grpc.max_send_message_length") == 0) lim = &o->max_send;
        if (lim) {
            if (!is_int || v < -1) {
                snprintf(err, err_len, "--grpc_channel_arguments: %s needs an integer >= -1, got '%s'",
                         key, val);
                return KILN_ERR_INVALID_ARGUMENT;
            }
            *lim = v < 0 || v > KILN_GRPC_MAX_MESSAGE ? KILN_GRPC_MAX_MESSAGE : v;
        } else if (strcmp(key, "grpc.max_concurrent_streams") == 0) {
            if (!is_int || v < 1 || v > 65536) {
                snprintf(err, err_len, "--grpc_channel_arguments: %s needs an integer in [1, 65536], "
                         "got '%s'", key, val);
                return KILN_ERR_INVALID_ARGUMENT;
            }
            o->max_streams = (int)v;
        } else {
            fprintf(stderr, "kiln serve: --grpc_channel_arguments: %s is accepted and ignored\n", key);
        }
    }
    return KILN_OK;
}

/* ------------------------------------------------------------ helpers */

static int64_t now_ms(void) { return kiln_monotonic_ms(); }

/* grpc-timeout: 1-8 digits and a unit; milliseconds (rounded up), or -1. */
static int64_t parse_timeout(const char *v, size_t n)
{
    if (n < 2 || n > 9) return -1;
    int64_t x = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if (v[i] < '0' || v[i] > '9') return -1;
        x = x * 10 + (v[i] - '0');
    }
    switch (v[n - 1]) {
    case 'H': return x * 3600000;
    case 'M': return x * 60000;
    case 'S': return x * 1000;
    case 'm': return x;
    case 'u': return (x + 999) / 1000;
    case 'n': return (x + 999999) / 1000000;
    default: return -1;
    }
}

/* Percent-encode a grpc-message value (gRPC: outside 0x20-0x7e, and '%'). */
static void percent_encode(const char *s, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (; *s && o + 4 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch < 0x20 || ch > 0x7e || ch == '%') {
            out[o++] = '%';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        } else {
            out[o++] = (char)ch;
        }
    }
    out[o] = '\0';
}

/* Inflate gzip or zlib (gRPC's "deflate") bytes under limit. 0 ok, 1 too big, -1 bad. */
static int inflate_bytes(const uint8_t *in, size_t n, int enc, int64_t limit, kiln_bytes *out)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, enc == ENC_GZIP ? 16 + MAX_WBITS : MAX_WBITS) != Z_OK) return -1;
    z.next_in = (Bytef *)(uintptr_t)in;
    z.avail_in = (uInt)n;
    uint8_t chunk[65536];
    int rc, result = 0;
    do {
        z.next_out = chunk;
        z.avail_out = sizeof chunk;
        rc = inflate(&z, Z_NO_FLUSH);
        if (rc != Z_OK && rc != Z_STREAM_END) {
            result = -1;
            break;
        }
        size_t got = sizeof chunk - z.avail_out;
        if ((int64_t)(out->len + got) > limit) {
            result = 1;
            break;
        }
        kiln_bytes_put(out, chunk, got);
        if (out->oom) {
            result = 1;
            break;
        }
        if (rc == Z_OK && got == 0 && z.avail_in == 0) {
            result = -1;
            break;
        }
    } while (rc != Z_STREAM_END);
    inflateEnd(&z);
    return result;
}

/* Compress for a response (gzip or zlib); 0 on failure. */
static int deflate_bytes(const uint8_t *in, size_t n, int enc, kiln_bytes *out)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, enc == ENC_GZIP ? 16 + MAX_WBITS : MAX_WBITS,
                     8, Z_DEFAULT_STRATEGY) != Z_OK)
        return 0;
    size_t bound = deflateBound(&z, (uLong)n);
    kiln_bytes_reserve(out, bound);
    if (out->oom || n > UINT32_MAX) {
        deflateEnd(&z);
        return 0;
    }
    z.next_in = (Bytef *)(uintptr_t)in;
    z.avail_in = (uInt)n;
    z.next_out = out->p + out->len;
    z.avail_out = (uInt)(out->cap - out->len);
    int rc = deflate(&z, Z_FINISH);
    if (rc == Z_STREAM_END) out->len += z.total_out;
    deflateEnd(&z);
    return rc == Z_STREAM_END;
}

/* ------------------------------------------------------------ streams */

/* Give back to flow control what st owes while the connection is within
 * its budget (the window then opens again: WINDOW_UPDATE). */
static void conn_repay(kiln_grpc_conn *c)
{
    for (stream *st = c->streams; st && c->held <= c->g->conn_budget; st = st->next)
        if (st->owed) {
            nghttp2_session_consume(c->s, st->id, st->owed);
            st->owed = 0;
        }
}

/* st's buffers are gone: the bytes no longer count against the connection. */
static void stream_release(stream *st)
{
    kiln_grpc_conn *c = st->c;
    c->held -= st->held < c->held ? st->held : c->held;
    st->held = 0;
    if (st->owed) {
        if (nghttp2_session_consume(c->s, st->id, st->owed) != 0)
            nghttp2_session_consume_connection(c->s, st->owed); /* the stream is closed */
        st->owed = 0;
    }
    conn_repay(c);
}

static void stream_unlink(stream *st)
{
    kiln_grpc_conn *c = st->c;
    if (st->prev) st->prev->next = st->next;
    else c->streams = st->next;
    if (st->next) st->next->prev = st->prev;
}

static void stream_free(stream *st)
{
    st->c->held -= st->held < st->c->held ? st->held : st->c->held;
    if (st->job) { /* the client went away: the job is cancelled, its answer dropped */
        st->job->cancel = 1;
        st->job->st = NULL;
        st->job->req = st->req; /* its request thread may be reading them: freed with the job */
        memset(&st->req, 0, sizeof st->req);
    }
    kiln_bytes_free(&st->msg);
    kiln_bytes_free(&st->req);
    kiln_bytes_free(&st->out);
    free(st);
}

static ssize_t data_read(nghttp2_session *s, int32_t id, uint8_t *buf, size_t length,
                         uint32_t *flags, nghttp2_data_source *src, void *ud);

static int submit_trailers(stream *st)
{
    char code[16], msg[3 * sizeof st->message + 1];
    snprintf(code, sizeof code, "%d", st->code);
    percent_encode(st->message, msg, sizeof msg);
    nghttp2_nv nv[2] = {
        {(uint8_t *)"grpc-status", (uint8_t *)code, 11, strlen(code), NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"grpc-message", (uint8_t *)msg, 12, strlen(msg), NGHTTP2_NV_FLAG_NONE},
    };
    return nghttp2_submit_trailer(st->c->s, st->id, nv, msg[0] ? 2 : 1);
}

/* Send response HEADERS with a data provider (messages follow in st->out). */
static void start_response(stream *st, int enc)
{
    nghttp2_nv nv[4];
    size_t n = 0;
#define NV(NAME, VALUE)                                                                        \
    nv[n++] = (nghttp2_nv){(uint8_t *)(NAME), (uint8_t *)(VALUE), sizeof(NAME) - 1, strlen(VALUE), \
                           NGHTTP2_NV_FLAG_NONE}
    NV(":status", "200");
    NV("content-type", "application/grpc");
    NV("grpc-accept-encoding", "identity,deflate,gzip");
    if (enc == ENC_GZIP) NV("grpc-encoding", "gzip");
    else if (enc == ENC_DEFLATE) NV("grpc-encoding", "deflate");
#undef NV
    nghttp2_data_provider prd;
    prd.source.ptr = st;
    prd.read_callback = data_read;
    if (nghttp2_submit_response(st->c->s, st->id, nv, n, &prd) == 0) st->headers_sent = 1;
}

/* Finish a stream with a status: trailers after messages already started,
 * else a Trailers-Only HEADERS frame. */
static void stream_finish(stream *st, int code, const char *message)
{
    if (st->state == ST_DONE) return;
    if (!st->job) { /* nothing will read the request any more */
        kiln_bytes_free(&st->msg);
        kiln_bytes_free(&st->req);
        stream_release(st);
    }
    st->code = code;
    snprintf(st->message, sizeof st->message, "%s", message ? message : "");
    st->state = ST_DONE;
    if (st->headers_sent) {
        st->out_eof = 1;
        if (st->deferred) {
            st->deferred = 0;
            nghttp2_session_resume_data(st->c->s, st->id);
        }
        return;
    }
    char cs[16], msg[3 * sizeof st->message + 1];
    snprintf(cs, sizeof cs, "%d", code);
    percent_encode(st->message, msg, sizeof msg);
    nghttp2_nv nv[4] = {
        {(uint8_t *)":status", (uint8_t *)"200", 7, 3, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"content-type", (uint8_t *)"application/grpc", 12, 16, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"grpc-status", (uint8_t *)cs, 11, strlen(cs), NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"grpc-message", (uint8_t *)msg, 12, strlen(msg), NGHTTP2_NV_FLAG_NONE},
    };
    nghttp2_submit_response(st->c->s, st->id, nv, msg[0] ? 4 : 3, NULL);
    st->headers_sent = 1;
}

/* Queue one message (prefix + bytes, compressed like the request) on st. */
static int stream_send_message(stream *st, const uint8_t *p, size_t n)
{
    kiln_bytes z = {0};
    int enc = st->enc == ENC_GZIP || st->enc == ENC_DEFLATE ? st->enc : ENC_IDENTITY;
    if (enc != ENC_IDENTITY) {
        if (!deflate_bytes(p, n, enc, &z)) {
            kiln_bytes_free(&z);
            return 0;
        }
        p = z.p;
        n = z.len;
    }
    if (n > UINT32_MAX) {
        kiln_bytes_free(&z);
        return 0;
    }
    /* drop what nghttp2 has already taken */
    if (st->out_off == st->out.len) st->out.len = st->out_off = 0;
    uint8_t pfx[5] = {enc != ENC_IDENTITY, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8),
                      (uint8_t)n};
    kiln_bytes_put(&st->out, pfx, 5);
    kiln_bytes_put(&st->out, p, n);
    kiln_bytes_free(&z);
    if (st->out.oom) return 0;
    if (!st->headers_sent) start_response(st, enc);
    if (st->deferred) {
        st->deferred = 0;
        nghttp2_session_resume_data(st->c->s, st->id);
    }
    return 1;
}

static ssize_t data_read(nghttp2_session *s, int32_t id, uint8_t *buf, size_t length,
                         uint32_t *flags, nghttp2_data_source *src, void *ud)
{
    stream *st = src->ptr;
    size_t left = st->out.len - st->out_off;
    if (left > 0) {
        size_t n = left < length ? left : length;
        memcpy(buf, st->out.p + st->out_off, n);
        st->out_off += n;
        return (ssize_t)n;
    }
    if (st->out_eof) {
        *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        if (submit_trailers(st) != 0) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        return 0;
    }
    st->deferred = 1;
    return NGHTTP2_ERR_DEFERRED;
}

/* ------------------------------------------------------------ jobs */

static void echo_handler(kiln_grpc_call *c)
{
    kiln_bytes_put(&c->resp, c->req, c->req_len);
    c->code = KILN_GRPC_OK;
}

static void job_answer(job *j)
{
    kiln_grpc_call *c = &j->call;
    if (j->cancel) kiln_grpc_fail(c, KILN_GRPC_CANCELLED, "Cancelled");
    else if (c->deadline_ms > 0 && now_ms() > c->deadline_ms)
        kiln_grpc_fail(c, KILN_GRPC_DEADLINE_EXCEEDED, "Deadline Exceeded");
    else if (!kiln_grpc_refuse_unauthorized(c, j->m)) j->m->fn(c);
    if (c->code == KILN_GRPC_OK && c->resp.oom)
        kiln_grpc_fail(c, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory writing the response");
}

static void job_free(job *j)
{
    kiln_bytes_free(&j->call.resp);
    kiln_bytes_free(&j->req);
    free(j);
}

/* The loop: send a job's answer on its stream (if the stream is still there). */
static void job_complete(kiln_grpc_server *g, job *j)
{
    stream *st = j->st;
    atomic_fetch_sub(&g->in_flight, 1);
    if (st) {
        st->job = NULL;
        kiln_grpc_call *c = &j->call;
        if (c->code == KILN_GRPC_OK) {
            if (!stream_send_message(st, c->resp.p ? c->resp.p : (const uint8_t *)"", c->resp.len))
                stream_finish(st, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory writing the response");
            else stream_finish(st, KILN_GRPC_OK, "");
        } else {
            stream_finish(st, c->code, c->message);
        }
        kiln_bytes_free(&st->req);
        stream_release(st);
    }
    job_free(j);
}

/* Under mu: wake sleeping request threads for the queued jobs, while fewer
 * than max_awake are awake (an awake thread takes the next job itself when
 * it finishes one, so it needs no wakeup). */
static void wake_workers(kiln_grpc_server *g, int jobs)
{
    while (jobs-- > 0 && g->idle && g->n_awake < g->max_awake) {
        worker *w = g->idle;
        g->idle = w->next_idle;
        w->woken = 1;
        g->n_awake++;
        pthread_cond_signal(&w->cv);
    }
}

/* A request thread: answer queued jobs while there are any, then sleep
 * until the loop wakes it. One lock per job hands the answer back and takes
 * the next; the loop's eventfd is written only when the loop has not been
 * told yet (it takes every answer at once). */
static void *worker_main(void *arg)
{
    worker *w = arg;
    kiln_grpc_server *g = w->g;
    pthread_setname_np(pthread_self(), "grpc-req"); /* for top, perf, bench/serve/cpu_per_request.py */
    pthread_mutex_lock(&g->mu);
    for (;;) {
        job *j = g->q_head;
        if (!j && g->stop_workers) break;
        if (!g->stop_workers && (!j || g->n_awake > g->max_awake)) {
            /* nothing to do, or more awake than may run: sleep until woken */
            w->next_idle = g->idle;
            g->idle = w;
            g->n_awake--;
            w->woken = 0;
            while (!w->woken) pthread_cond_wait(&w->cv, &g->mu);
            continue;
        }
        g->q_head = j->next;
        if (!g->q_head) g->q_tail = NULL;
        g->taken++;
        pthread_mutex_unlock(&g->mu);
        job_answer(j);
        pthread_mutex_lock(&g->mu);
        j->next = g->done_head;
        g->done_head = j;
        if (!g->loop_notified) {
            g->loop_notified = 1;
            pthread_mutex_unlock(&g->mu);
            uint64_t one = 1;
            ssize_t wr = write(g->evfd, &one, sizeof one);
            (void)wr;
            pthread_mutex_lock(&g->mu);
        }
    }
    g->n_awake--;
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* The loop, once per turn: queue this turn's jobs with one lock and wake
 * the request threads they need. */
static void hand_over(kiln_grpc_server *g)
{
    if (!g->pend_head) return;
    pthread_mutex_lock(&g->mu);
    if (g->q_tail) g->q_tail->next = g->pend_head;
    else g->q_head = g->pend_head;
    g->q_tail = g->pend_tail;
    wake_workers(g, g->n_pend);
    pthread_mutex_unlock(&g->mu);
    g->pend_head = g->pend_tail = NULL;
    g->n_pend = 0;
}

/* Hand a complete unary request to a request thread (inline when detached). */
static void dispatch(stream *st)
{
    kiln_grpc_server *g = st->c->g;
    job *j = calloc(1, sizeof *j);
    if (!j) {
        stream_finish(st, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    j->m = st->m;
    j->st = st;
    j->call.ctx = &g->ctx;
    j->call.req = st->req.p ? st->req.p : (const uint8_t *)"";
    j->call.req_len = st->req.len;
    j->call.deadline_ms = st->deadline_ms;
    j->call.route_key = st->route_key[0] ? st->route_key : NULL;
    j->call.authorization = st->authorization[0] ? st->authorization : NULL;
    j->call.cancel = &j->cancel;
    j->call.start = st->start;
    j->call.code = KILN_GRPC_UNKNOWN;
    st->job = j;
    st->state = ST_QUEUED;
    atomic_fetch_add(&g->in_flight, 1);
    if (g->detached) {
        kiln_grpc_call *c = &j->call;
        if (j->cancel) kiln_grpc_fail(c, KILN_GRPC_CANCELLED, "Cancelled");
        else echo_handler(c);
        job_complete(g, j);
        return;
    }
    j->next = NULL; /* queued for the request threads at the end of the loop's turn */
    if (g->pend_tail) g->pend_tail->next = j;
    else g->pend_head = j;
    g->pend_tail = j;
    g->n_pend++;
}

/* ------------------------------------------------------------ messages in */

static void watch_update(stream *st, int force)
{
    int s = kiln_grpc_health_status(&st->c->g->ctx, st->watch_service);
    if (s < 0) s = 3; /* SERVICE_UNKNOWN */
    if (!force && s == st->watch_last) return;
    st->watch_last = s;
    kiln_bytes b = {0};
    kiln_grpc_health_encode(s, &b);
    if (b.oom || !stream_send_message(st, b.p ? b.p : (const uint8_t *)"", b.len))
        stream_finish(st, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    kiln_bytes_free(&b);
}

/* A complete message arrived on st (in st->msg). */
static void message_complete(stream *st, int compressed)
{
    kiln_grpc_server *g = st->c->g;
    kiln_bytes plain = {0};
    const kiln_bytes *m = &st->msg;
    char err[160];
    if (compressed) {
        if (st->enc != ENC_GZIP && st->enc != ENC_DEFLATE) {
            stream_finish(st, KILN_GRPC_INTERNAL,
                          "Compressed message without a supported grpc-encoding");
            return;
        }
        int r = inflate_bytes(m->p ? m->p : (const uint8_t *)"", m->len, st->enc, g->opt.max_recv, &plain);
        if (r != 0) {
            if (r > 0)
                snprintf(err, sizeof err, "Received message larger than max (more than %" PRId64
                         " bytes after decompression)", g->opt.max_recv);
            else snprintf(err, sizeof err, "Failed to decompress the message");
            stream_finish(st, r > 0 ? KILN_GRPC_RESOURCE_EXHAUSTED : KILN_GRPC_INTERNAL, err);
            kiln_bytes_free(&plain);
            return;
        }
        m = &plain;
    }
    st->n_msgs++;
    const uint8_t *p = m->p ? m->p : (const uint8_t *)"";
    switch (st->m->kind) {
    case KILN_GRPC_UNARY:
        if (st->n_msgs > 1) {
            stream_finish(st, KILN_GRPC_UNIMPLEMENTED, "more than one request message on a unary call");
        } else if (m == &plain) {
            st->req = plain;
            memset(&plain, 0, sizeof plain);
        } else {
            st->req = st->msg;
            memset(&st->msg, 0, sizeof st->msg);
        }
        break;
    case KILN_GRPC_HEALTH_WATCH:
        if (st->n_msgs > 1 || !kiln_grpc_health_decode(p, m->len, st->watch_service,
                                                       sizeof st->watch_service)) {
            stream_finish(st, KILN_GRPC_INVALID_ARGUMENT, "cannot parse HealthCheckRequest");
            break;
        }
        st->state = ST_STREAMING;
        watch_update(st, 1);
        break;
    case KILN_GRPC_REFLECTION: {
        kiln_bytes out = {0};
        kiln_grpc_reflect(p, m->len, &out);
        if (out.oom || !stream_send_message(st, out.p ? out.p : (const uint8_t *)"", out.len))
            stream_finish(st, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        kiln_bytes_free(&out);
        break;
    }
    }
    kiln_bytes_free(&plain);
    st->msg.len = 0;
    if (st->m->kind != KILN_GRPC_UNARY && st->state != ST_DONE) stream_release(st); /* answered */
}

/* DATA bytes of st: cut into messages. */
static void stream_data(stream *st, const uint8_t *d, size_t n)
{
    kiln_grpc_server *g = st->c->g;
    char err[160];
    while (n > 0 && st->state == ST_RECV) {
        if (!st->in_msg) {
            size_t k = 5 - (size_t)st->pfx_have;
            if (k > n) k = n;
            memcpy(st->pfx + st->pfx_have, d, k);
            st->pfx_have += (int)k;
            d += k;
            n -= k;
            if (st->pfx_have < 5) return;
            st->pfx_have = 0;
            st->msg_len = (uint32_t)st->pfx[1] << 24 | (uint32_t)st->pfx[2] << 16 |
                          (uint32_t)st->pfx[3] << 8 | st->pfx[4];
            if (st->pfx[0] > 1) {
                stream_finish(st, KILN_GRPC_INTERNAL, "bad compressed-flag in message prefix");
                return;
            }
            if ((int64_t)st->msg_len > g->opt.max_recv) {
                snprintf(err, sizeof err, "Received message larger than max (%" PRIu32 " vs. %" PRId64 ")",
                         st->msg_len, g->opt.max_recv);
                stream_finish(st, KILN_GRPC_RESOURCE_EXHAUSTED, err);
                return;
            }
            st->in_msg = 1;
            st->msg.len = 0;
        }
        size_t want = st->msg_len - st->msg.len;
        size_t k = want < n ? want : n;
        kiln_bytes_put(&st->msg, d, k); /* grows with the bytes that arrived */
        if (st->msg.oom) {
            stream_finish(st, KILN_GRPC_RESOURCE_EXHAUSTED, "out of memory reading the message");
            return;
        }
        d += k;
        n -= k;
        if (st->msg.len == st->msg_len) {
            st->in_msg = 0;
            message_complete(st, st->pfx[0]);
        }
    }
}

/* The client half-closed st. */
static void stream_end(stream *st)
{
    if (st->state != ST_RECV && st->state != ST_STREAMING) return;
    if (st->in_msg || st->pfx_have) {
        stream_finish(st, KILN_GRPC_INTERNAL, "the request ended inside a message");
        return;
    }
    switch (st->m->kind) {
    case KILN_GRPC_UNARY:
        if (st->n_msgs != 1) stream_finish(st, KILN_GRPC_UNIMPLEMENTED, "a unary call needs one request message");
        else dispatch(st);
        break;
    case KILN_GRPC_HEALTH_WATCH:
        if (st->n_msgs == 0) stream_finish(st, KILN_GRPC_INVALID_ARGUMENT, "no HealthCheckRequest");
        break;
    case KILN_GRPC_REFLECTION:
        stream_finish(st, KILN_GRPC_OK, "");
        break;
    }
}

/* ------------------------------------------------------------ nghttp2 callbacks */

static int on_begin_headers(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
    kiln_grpc_conn *c = ud;
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    if (c->drain >= DRAIN_FINAL && f->hd.stream_id > c->drain_last_id) {
        /* above the final GOAWAY's last stream id, arrived while that GOAWAY
         * still waited in the write buffer (nghttp2 opens such a stream):
         * refused here, whatever calm_meter's list could hold, never served */
        for (int i = 0; i < c->n_refuse; i++)
            if (c->refuse[i] == f->hd.stream_id) c->refuse[i--] = c->refuse[--c->n_refuse];
        nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, f->hd.stream_id, NGHTTP2_REFUSED_STREAM);
        return 0;
    }
    stream *st = calloc(1, sizeof *st);
    if (!st) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    st->id = f->hd.stream_id;
    st->c = c;
    clock_gettime(CLOCK_MONOTONIC, &st->start);
    st->watch_last = -1;
    st->next = c->streams;
    if (c->streams) c->streams->prev = st;
    c->streams = st;
    nghttp2_session_set_stream_user_data(s, st->id, st);
    return 0;
}

/* Is name (lower case, as HTTP/2 sends it) the observers' route key header? */
static int is_route_header(const stream *st, const char *name, size_t namelen)
{
    const kiln_server *rest = st->c->g->ctx.rest;
    const char *h = rest && rest->opt.observers ? rest->opt.observers->route_header : "";
    return h[0] && strlen(h) == namelen && strncasecmp(h, name, namelen) == 0;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *ud)
{
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    stream *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
    if (!st) return 0;
    st->header_bytes += namelen + valuelen + 32; /* RFC 7540's accounting */
    if (st->header_bytes > KILN_GRPC_MAX_HEADER_LIST) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    const char *n = (const char *)name, *v = (const char *)value;
#define IS(LIT) (namelen == sizeof(LIT) - 1 && memcmp(n, LIT, namelen) == 0)
    if (IS(":method")) {
        st->post = valuelen == 4 && memcmp(v, "POST", 4) == 0;
    } else if (IS(":path")) {
        if (valuelen >= sizeof st->path) st->path_too_long = 1;
        else {
            memcpy(st->path, v, valuelen);
            st->path[valuelen] = '\0';
        }
    } else if (IS("content-type")) {
        st->content_type_ok = valuelen >= 16 && memcmp(v, "application/grpc", 16) == 0 &&
                              (valuelen == 16 || v[16] == '+' || v[16] == ';');
    } else if (IS("grpc-timeout")) {
        int64_t ms = parse_timeout(v, valuelen);
        if (ms >= 0) st->deadline_ms = now_ms() + (ms > 0 ? ms : 0) + (ms == 0);
    } else if (IS("authorization")) {
        if (valuelen < sizeof st->authorization) {
            memcpy(st->authorization, v, valuelen);
            st->authorization[valuelen] = '\0';
        }
    } else if (is_route_header(st, n, namelen)) {
        if (valuelen < sizeof st->route_key) {
            memcpy(st->route_key, v, valuelen);
            st->route_key[valuelen] = '\0';
        }
    } else if (IS("grpc-encoding")) {
        if (valuelen == 8 && memcmp(v, "identity", 8) == 0) st->enc = ENC_IDENTITY;
        else if (valuelen == 4 && memcmp(v, "gzip", 4) == 0) st->enc = ENC_GZIP;
        else if (valuelen == 7 && memcmp(v, "deflate", 7) == 0) st->enc = ENC_DEFLATE;
        else st->enc = ENC_UNKNOWN;
    }
#undef IS
    return 0;
}

/* The request's headers are complete: check them and pick the method. */
static void headers_done(stream *st)
{
    kiln_grpc_server *g = st->c->g;
    if (!st->post || !st->content_type_ok) {
        /* not gRPC: HTTP 415 (gRPC's PROTOCOL-HTTP2) or 405 */
        const char *code = st->post ? "415" : "405";
        nghttp2_nv nv[1] = {{(uint8_t *)":status", (uint8_t *)code, 7, 3, NGHTTP2_NV_FLAG_NONE}};
        nghttp2_submit_response(st->c->s, st->id, nv, 1, NULL);
        st->headers_sent = 1;
        st->state = ST_DONE;
        return;
    }
    char msg[400];
    st->m = st->path_too_long ? NULL : kiln_grpc_method_find(st->path);
    if (!st->m) {
        snprintf(msg, sizeof msg, "Method not found: %.300s", st->path_too_long ? "(too long)" : st->path);
        stream_finish(st, KILN_GRPC_UNIMPLEMENTED, msg);
        return;
    }
    if (st->enc == ENC_UNKNOWN) {
        stream_finish(st, KILN_GRPC_UNIMPLEMENTED, "Unsupported grpc-encoding; supported: identity, deflate, gzip");
        return;
    }
    /* draining: a stream the client opened before the final GOAWAY is served
     * (those after it are refused before they get here, DRAIN below) */
    if (st->m->scope && g->ctx.rest && g->ctx.rest->opt.authorize) {
        /* no valid token: answered now, its message never buffered */
        kiln_grpc_call probe;
        memset(&probe, 0, sizeof probe);
        probe.ctx = &g->ctx;
        probe.authorization = st->authorization[0] ? st->authorization : NULL;
        if (kiln_grpc_refuse_unauthorized(&probe, st->m)) stream_finish(st, probe.code, probe.message);
    }
}

static int on_frame_recv(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
    kiln_grpc_conn *c = ud;
    if (f->hd.type == NGHTTP2_PING && (f->hd.flags & NGHTTP2_FLAG_ACK) && c->drain == DRAIN_NOTICE &&
        memcmp(f->ping.opaque_data, DRAIN_PING, 8) == 0)
        c->drain_acked = 1; /* every stream it opened before our first GOAWAY has arrived */
    stream *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
    if (!st) return 0;
    if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_REQUEST) headers_done(st);
    if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) &&
        (f->hd.flags & NGHTTP2_FLAG_END_STREAM))
        stream_end(st);
    return 0;
}

static int on_data_chunk(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data,
                         size_t len, void *ud)
{
    stream *st = nghttp2_session_get_stream_user_data(s, id);
    if (!st || !st->m || st->state != ST_RECV) { /* dropped: the window opens at once */
        nghttp2_session_consume(s, id, len);
        return 0;
    }
    kiln_grpc_conn *c = st->c;
    st->held += len;
    c->held += len;
    if (c->held <= c->g->conn_budget) nghttp2_session_consume(s, id, len);
    else st->owed += len; /* over budget: this stream's window stays closed for now */
    stream_data(st, data, len);
    return 0;
}

static void calm_credit(kiln_grpc_conn *c, int64_t frames);

static int on_frame_send(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
    /* an answer: the client may acknowledge it (WINDOW_UPDATEs, a BDP PING) */
    if (f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) calm_credit(ud, CALM_SENT_CREDIT);
    /* answered before the client finished sending: tell it to stop (gRPC's
     * PROTOCOL-HTTP2: RST_STREAM NO_ERROR after the trailers) */
    if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) &&
        (f->hd.flags & NGHTTP2_FLAG_END_STREAM) &&
        nghttp2_session_get_stream_remote_close(s, f->hd.stream_id) == 0)
        nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, f->hd.stream_id, NGHTTP2_NO_ERROR);
    return 0;
}

static kiln_grpc_conn *c_of(void *ud) { return ud; }

static int on_stream_close(nghttp2_session *s, int32_t id, uint32_t error_code, void *ud)
{
    stream *st = nghttp2_session_get_stream_user_data(s, id);
    if (!st) return 0;
    nghttp2_session_set_stream_user_data(s, id, NULL);
    stream_unlink(st);
    if (st->owed) nghttp2_session_consume_connection(s, st->owed);
    st->owed = 0;
    stream_free(st);
    conn_repay(c_of(ud));
    return 0;
}

/* ------------------------------------------------------------ frames that carry nothing */

/*
 * nghttp2 itself ends a connection that floods SETTINGS or PING without
 * reading the acknowledgements, resets streams too fast or sends endless
 * CONTINUATIONs; it does not limit frames it can process cheaply but that
 * carry nothing for a call: empty DATA frames (CVE-2019-9518), WINDOW_UPDATEs
 * (of 1 byte, say), PRIORITY, PINGs and SETTINGS from a client that reads the
 * acknowledgements, frames of unknown types (ignored). One attacker sending
 * them keeps the loop thread busy forever on one connection. calm_meter reads
 * the frame headers of what the client sends, before nghttp2 does, and
 * charges each such frame to a per-connection token bucket: CALM_BURST at
 * once, CALM_RATE a second after that; each HEADERS or DATA frame the server
 * sends gives CALM_SENT_CREDIT back (a client acknowledges answers with
 * WINDOW_UPDATEs and BDP PINGs, a stream and a connection one per DATA frame
 * at most), and a DATA frame with a payload gives one back. DATA with
 * END_STREAM (a half-close), HEADERS, CONTINUATION and RST_STREAM are not
 * charged (the last two are nghttp2's). When the budget is spent the server
 * sends GOAWAY ENHANCE_YOUR_CALM and closes the connection. The numbers for
 * real clients are in docs/GRPC.md ("Frame floods").
 */
static void calm_credit(kiln_grpc_conn *c, int64_t frames)
{
    c->calm += frames * CALM_ONE;
    if (c->calm > (int64_t)CALM_BURST * CALM_ONE) c->calm = (int64_t)CALM_BURST * CALM_ONE;
}

/* Charge one frame (after refilling for the time passed); 0 when the budget is spent. */
static int calm_charge(kiln_grpc_conn *c)
{
    int64_t now = now_ms();
    if (now > c->calm_ms) {
        int64_t room = (int64_t)CALM_BURST * CALM_ONE - c->calm;
        int64_t add = (now - c->calm_ms) * CALM_RATE * CALM_ONE / 1000;
        c->calm += add < room ? add : room;
        c->calm_ms = now;
    }
    if (c->calm < CALM_ONE) return 0;
    c->calm -= CALM_ONE;
    return 1;
}

/* Does this frame header carry nothing for a call? Also gives back for DATA with a payload. */
static int calm_frame(kiln_grpc_conn *c, const uint8_t *hd)
{
    uint32_t len = (uint32_t)hd[0] << 16 | (uint32_t)hd[1] << 8 | hd[2];
    uint8_t type = hd[3], flags = hd[4];
    switch (type) {
    case NGHTTP2_DATA:
        if (flags & NGHTTP2_FLAG_END_STREAM) return 0;
        /* a padded frame's payload is len - 1 - its pad length, which is in
         * the payload: one byte of length means no payload at all */
        if (len == 0 || ((flags & NGHTTP2_FLAG_PADDED) && len == 1)) return 1;
        calm_credit(c, 1);
        return 0;
    case NGHTTP2_HEADERS:
    case NGHTTP2_RST_STREAM:
    case NGHTTP2_PUSH_PROMISE: /* a client's is a connection error */
    case NGHTTP2_GOAWAY:
    case NGHTTP2_CONTINUATION:
        return 0;
    case NGHTTP2_SETTINGS:
    case NGHTTP2_PING:
        return !(flags & NGHTTP2_FLAG_ACK); /* an ACK answers the server (its one SETTINGS, the drain PING) */
    default: /* PRIORITY, WINDOW_UPDATE, unknown types */
        return 1;
    }
}

/* Meter n bytes the client sent; how many of them may go to nghttp2 (n, or
 * up to the end of the header that spent the budget, which then also submits
 * the GOAWAY). */
static size_t calm_meter(kiln_grpc_conn *c, const uint8_t *d, size_t n)
{
    static const size_t magic = 24; /* "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" */
    size_t i = 0;
    if (c->calm_over) return n;
    while (i < n) {
        if (c->calm_preface < magic) {
            size_t k = magic - c->calm_preface < n - i ? magic - c->calm_preface : n - i;
            c->calm_preface += (uint32_t)k;
            i += k;
        } else if (c->calm_skip) {
            size_t k = c->calm_skip < n - i ? c->calm_skip : n - i;
            c->calm_skip -= (uint32_t)k;
            i += k;
        } else {
            c->calm_hd[c->calm_hd_have++] = d[i++];
            if (c->calm_hd_have < 9) continue;
            c->calm_hd_have = 0;
            c->calm_skip = (uint32_t)c->calm_hd[0] << 16 | (uint32_t)c->calm_hd[1] << 8 | c->calm_hd[2];
            c->calm_frames++;
            if (c->calm_hd[3] == NGHTTP2_HEADERS && c->drain >= DRAIN_FINAL) {
                /* a new stream after the final GOAWAY: nghttp2 ignores it
                 * silently; conn_input refuses it (REFUSED_STREAM) */
                int32_t id = (int32_t)(((uint32_t)c->calm_hd[5] << 24 | (uint32_t)c->calm_hd[6] << 16 |
                                        (uint32_t)c->calm_hd[7] << 8 | c->calm_hd[8]) & 0x7fffffffu);
                if (id > c->drain_last_id && (id & 1) && c->n_refuse < DRAIN_REFUSE_MAX)
                    c->refuse[c->n_refuse++] = id;
            }
            if (calm_frame(c, c->calm_hd)) {
                c->calm_charged++;
                if (!calm_charge(c)) {
                    c->calm_over = 1; /* calm_hd keeps the header that spent it */
                    return i;
                }
            }
        }
    }
    return n;
}

/*
 * A connection ended by calm_meter is counted (kiln_grpc_connections_closed_total
 * {reason="frame_flood"}) and logged as one key=value line on stderr, in the
 * style of the model manager's lifecycle lines:
 *
 *   kiln serve: ts=... event=grpc_frame_flood peer="127.0.0.1:50312" frame=window_update
 *     frame_type=8 frames=1010 charged=1001 after_ms=3 suppressed=0
 *
 * (frame: the kind of the frame that spent the budget; frames: the frames the
 * connection sent; charged: those that carried nothing; suppressed: closings
 * since the last line that got none). A flood of connections must not flood
 * the log, so at most one line is written a second: closings in between are
 * only counted, and reported by the next line, or, when none follows within
 * the second, by tick's event=grpc_frame_flood_suppressed line with their count.
 * The counter always counts them all.
 */
static const char *calm_frame_name(uint8_t type, uint8_t flags)
{
    switch (type) {
    case NGHTTP2_DATA: return (flags & NGHTTP2_FLAG_PADDED) ? "padded_empty_data" : "empty_data";
    case NGHTTP2_PRIORITY: return "priority";
    case NGHTTP2_SETTINGS: return "settings";
    case NGHTTP2_PING: return "ping";
    case NGHTTP2_WINDOW_UPDATE: return "window_update";
    default: return "unknown_type";
    }
}

static void flood_log_write(const char *event, const kiln_grpc_conn *c, uint64_t suppressed)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    kiln_sbuf b = {0};
    kiln_sbuf_printf(&b, "kiln serve: ts=%lld.%03ld event=%s", (long long)ts.tv_sec, ts.tv_nsec / 1000000,
                     event);
    if (c) {
        kiln_sbuf_puts(&b, " peer=");
        kiln_sbuf_json_string(&b, c->peer, strlen(c->peer));
        kiln_sbuf_printf(&b, " frame=%s frame_type=%u frames=%" PRIu64 " charged=%" PRIu64
                             " after_ms=%" PRId64, calm_frame_name(c->calm_hd[3], c->calm_hd[4]),
                         (unsigned)c->calm_hd[3], c->calm_frames, c->calm_charged,
                         now_ms() - c->born_ms);
    }
    kiln_sbuf_printf(&b, " suppressed=%" PRIu64 "\n", suppressed);
    if (!b.oom && b.p) fwrite(b.p, 1, b.len, stderr);
    kiln_sbuf_free(&b);
}

/* calm_meter ended c: count it, and log it unless a line was written less than a second ago. */
static void flood_closed(kiln_grpc_conn *c)
{
    kiln_grpc_server *g = c->g;
    if (g->ctx.rest) kiln_metrics_grpc_closed(g->ctx.rest->metrics, KILN_GRPC_CLOSED_FRAME_FLOOD);
    if (g->detached) return; /* fuzzing: no log */
    int64_t now = now_ms();
    if (g->flood_logged_ms && now - g->flood_logged_ms < 1000) {
        g->flood_unlogged++;
        return;
    }
    flood_log_write("grpc_frame_flood", c, g->flood_unlogged);
    g->flood_logged_ms = now;
    g->flood_unlogged = 0;
}

/* From tick: closings left unlogged for a second get their count written. */
static void flood_log_flush(kiln_grpc_server *g, int64_t now)
{
    if (!g->flood_unlogged || now - g->flood_logged_ms < 1000) return;
    flood_log_write("grpc_frame_flood_suppressed", NULL, g->flood_unlogged);
    g->flood_logged_ms = now;
    g->flood_unlogged = 0;
}

/* The peer's address for the log: "a.b.c.d:port", "[v6]:port", or a Unix
 * socket's "unix:pid=P,uid=U" (SO_PEERCRED); "?" when unknown. */
static void peer_name(int fd, char *out, size_t cap)
{
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    char host[INET6_ADDRSTRLEN];
    snprintf(out, cap, "?");
    if (getpeername(fd, (struct sockaddr *)&sa, &len) != 0) return;
    if (sa.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&sa;
        if (inet_ntop(AF_INET, &in->sin_addr, host, sizeof host))
            snprintf(out, cap, "%s:%u", host, (unsigned)ntohs(in->sin_port));
    } else if (sa.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&sa;
        if (inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host))
            snprintf(out, cap, "[%s]:%u", host, (unsigned)ntohs(in6->sin6_port));
    } else if (sa.ss_family == AF_UNIX) {
        struct ucred cr;
        socklen_t cl = sizeof cr;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0)
            snprintf(out, cap, "unix:pid=%ld,uid=%lu", (long)cr.pid, (unsigned long)cr.uid);
        else
            snprintf(out, cap, "unix");
    }
}

/* ------------------------------------------------------------ connections */

static void conn_over(kiln_grpc_conn *c);
static void drain_notice(kiln_grpc_conn *c);
static void drain_final(kiln_grpc_conn *c);

static kiln_grpc_conn *conn_new(kiln_grpc_server *g, int fd)
{
    kiln_grpc_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->tag = TAG_CONN;
    c->g = g;
    c->fd = fd;
    c->last_active_ms = now_ms();
    c->born_ms = c->last_active_ms;
    snprintf(c->peer, sizeof c->peer, "?");
    c->calm = (int64_t)CALM_BURST * CALM_ONE;
    c->calm_ms = c->last_active_ms;
    nghttp2_session_callbacks *cb;
    if (nghttp2_session_callbacks_new(&cb) != 0) {
        free(c);
        return NULL;
    }
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_option *opt;
    int rc = nghttp2_option_new(&opt);
    if (rc == 0) {
        nghttp2_option_set_max_send_header_block_length(opt, 65536);
        nghttp2_option_set_no_auto_window_update(opt, 1); /* consumed as buffers are freed */
        rc = nghttp2_session_server_new2(&c->s, cb, c, opt);
        nghttp2_option_del(opt);
    }
    nghttp2_session_callbacks_del(cb);
    if (rc != 0) {
        free(c);
        return NULL;
    }
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, (uint32_t)g->opt.max_streams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, KILN_GRPC_MAX_HEADER_LIST},
    };
    nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, iv, sizeof iv / sizeof iv[0]);
    nghttp2_session_set_local_window_size(c->s, NGHTTP2_FLAG_NONE, 0, CONN_WINDOW);
    c->next = g->conns;
    if (g->conns) g->conns->prev = c;
    g->conns = c;
    g->n_conns++;
    return c;
}

static void conn_close(kiln_grpc_conn *c)
{
    kiln_grpc_server *g = c->g;
    while (c->streams) {
        stream *st = c->streams;
        stream_unlink(st);
        nghttp2_session_set_stream_user_data(c->s, st->id, NULL);
        stream_free(st);
    }
    nghttp2_session_del(c->s);
    if (c->tls) gnutls_deinit(c->tls);
    if (c->fd >= 0) {
        epoll_ctl(g->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    kiln_bytes_free(&c->wbuf);
    if (c->prev) c->prev->next = c->next;
    else g->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    g->n_conns--;
    free(c);
}

static void set_epollout(kiln_grpc_conn *c, int on)
{
    if (c->fd < 0 || c->epollout == on) return;
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(c->g->epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->epollout = on;
}

/* Write what is pending and what nghttp2 has to send; marks c dead on error
 * or when the session is over. */
static void conn_flush(kiln_grpc_conn *c)
{
    for (;;) {
        while (c->woff < c->wbuf.len) {
            if (c->fd < 0) {
                c->woff = c->wbuf.len;
                break;
            }
            ssize_t n;
            if (c->tls) {
                n = gnutls_record_send(c->tls, c->wbuf.p + c->woff, c->wbuf.len - c->woff);
                if (n == GNUTLS_E_INTERRUPTED) continue;
                if (n == GNUTLS_E_AGAIN) {
                    set_epollout(c, 1);
                    return;
                }
            } else {
                n = send(c->fd, c->wbuf.p + c->woff, c->wbuf.len - c->woff, MSG_NOSIGNAL);
                if (n < 0 && errno == EINTR) continue;
            }
            if (!c->tls && n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                set_epollout(c, 1); /* a slow reader: nothing more is pulled until it drains */
                return;
            }
            if (n <= 0) {
                c->dead = 1;
                return;
            }
            c->woff += (size_t)n;
        }
        c->wbuf.len = c->woff = 0;
        size_t pulled = 0;
        while (pulled < WRITE_BATCH) {
            const uint8_t *d;
            ssize_t n = nghttp2_session_mem_send(c->s, &d);
            if (n < 0) {
                c->dead = 1;
                return;
            }
            if (n == 0) break;
            kiln_bytes_put(&c->wbuf, d, (size_t)n);
            if (c->wbuf.oom) {
                c->dead = 1;
                return;
            }
            pulled += (size_t)n;
        }
        if (c->wbuf.len == 0) break;
    }
    set_epollout(c, 0);
    if (!nghttp2_session_want_read(c->s) && !nghttp2_session_want_write(c->s)) conn_over(c);
}

/* Feed bytes to the session, then flush; 0 when the connection is over. */
static int conn_input(kiln_grpc_conn *c, const uint8_t *d, size_t n)
{
    c->last_active_ms = now_ms();
    if (c->calm_over) return 1; /* the GOAWAY is on its way: nothing more is read */
    size_t ok = calm_meter(c, d, n);
    ssize_t r = nghttp2_session_mem_recv(c->s, d, ok);
    if (r < 0) {
        c->dead = 1;
        return 0;
    }
    if (c->calm_over) {
        nghttp2_session_terminate_session(c->s, NGHTTP2_ENHANCE_YOUR_CALM);
        flood_closed(c);
    }
    for (int i = 0; i < c->n_refuse; i++)
        nghttp2_submit_rst_stream(c->s, NGHTTP2_FLAG_NONE, c->refuse[i], NGHTTP2_REFUSED_STREAM);
    c->n_refuse = 0;
    if (c->drain == DRAIN_NOTICE && c->drain_acked) drain_final(c);
    conn_flush(c);
    return !c->dead;
}

/* TLS: advance the handshake; 1 once it is done. */
static int tls_handshake(kiln_grpc_conn *c)
{
    int rc = gnutls_handshake(c->tls);
    if (rc == GNUTLS_E_SUCCESS) {
        gnutls_datum_t alpn;
        if (gnutls_alpn_get_selected_protocol(c->tls, &alpn) != 0 || alpn.size != 2 ||
            memcmp(alpn.data, "h2", 2) != 0) {
            c->dead = 1; /* gRPC needs HTTP/2 */
            return 0;
        }
        c->handshake_done = 1;
        return 1;
    }
    if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED) {
        set_epollout(c, gnutls_record_get_direction(c->tls) == 1);
        return 0;
    }
    c->dead = 1; /* a failed handshake: bad or missing client certificate, ... */
    return 0;
}

static void conn_read(kiln_grpc_conn *c)
{
    uint8_t buf[65536];
    /* after the drain's shutdown everything is said: what arrives is read
     * and dropped (TLS records unopened) until the client closes */
    int discard = c->drain == DRAIN_SHUT;
    if (!discard && c->tls && !c->handshake_done) {
        if (!tls_handshake(c)) return;
        conn_flush(c);
    }
    if (!discard && c->tls) {
        for (int turn = 0; turn < 16 || gnutls_record_check_pending(c->tls) > 0; turn++) {
            ssize_t n = gnutls_record_recv(c->tls, buf, sizeof buf);
            if (n == GNUTLS_E_INTERRUPTED) continue;
            if (n == GNUTLS_E_AGAIN) return;
            if (n <= 0) {
                c->dead = 1;
                return;
            }
            if (!conn_input(c, buf, (size_t)n)) return;
        }
        return;
    }
    /* at most 1 MiB per turn, so one busy client cannot starve the others
     * (epoll is level-triggered: the rest is read next turn) */
    for (int turn = 0; turn < 16; turn++) {
        ssize_t n = recv(c->fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) {
            c->dead = 1;
            return;
        }
        if (!discard && !conn_input(c, buf, (size_t)n)) return;
    }
}

/* ------------------------------------------------------------ loop */

static void accept_all(kiln_grpc_server *g, int lfd)
{
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        if (g->n_conns >= KILN_GRPC_MAX_CONNECTIONS) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails harmlessly on Unix sockets */
        kiln_grpc_conn *c = conn_new(g, fd);
        if (!c) {
            close(fd);
            continue;
        }
        peer_name(fd, c->peer, sizeof c->peer);
        if (atomic_load(&g->draining)) drain_notice(c); /* from the backlog (drain_begin) */
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(g->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            c->fd = -1;
            close(fd);
            conn_close(c);
            continue;
        }
        if (g->tls) {
            static const gnutls_datum_t h2 = {(unsigned char *)"h2", 2};
            const kiln_tls_gen *cred = kiln_tls_current(g->tls); /* lives until kiln_tls_free */
            if (gnutls_init(&c->tls, GNUTLS_SERVER | GNUTLS_NONBLOCK) != GNUTLS_E_SUCCESS) {
                c->tls = NULL;
                conn_close(c);
                continue;
            }
            gnutls_priority_set(c->tls, g->prio);
            gnutls_credentials_set(c->tls, GNUTLS_CRD_CERTIFICATE, cred->cred);
            gnutls_alpn_set_protocols(c->tls, &h2, 1, GNUTLS_ALPN_MANDATORY);
            if (cred->client_verify) {
                gnutls_certificate_server_set_request(c->tls, GNUTLS_CERT_REQUIRE);
                gnutls_session_set_verify_cert(c->tls, NULL, 0);
            }
            gnutls_transport_set_int(c->tls, fd);
            tls_handshake(c); /* SETTINGS go out once it is done */
            continue;
        }
        conn_flush(c); /* our SETTINGS */
    }
}

static void take_completions(kiln_grpc_server *g)
{
    uint64_t v;
    ssize_t r = read(g->evfd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&g->mu);
    job *j = g->done_head;
    g->done_head = NULL;
    g->loop_notified = 0;
    pthread_mutex_unlock(&g->mu);
    while (j) { /* each connection is written once, after all of its answers */
        job *next = j->next;
        kiln_grpc_conn *c = j->st ? j->st->c : NULL;
        job_complete(g, j);
        if (c && !c->flush_queued) {
            c->flush_queued = 1;
            c->flush_next = g->flush_head;
            g->flush_head = c;
        }
        j = next;
    }
    while (g->flush_head) {
        kiln_grpc_conn *c = g->flush_head;
        g->flush_head = c->flush_next;
        c->flush_queued = 0;
        conn_flush(c);
    }
}

/* Every TICK_MS: jobs queued while the awake request threads took none for
 * a whole tick (they are all blocked: a config reload, a slow observer, a
 * long model) get one more thread, up to --grpc_max_threads; once the queue
 * is empty the limit returns to base_awake (the extra threads sleep again
 * as they finish their jobs). */
static void unblock_queue(kiln_grpc_server *g)
{
    pthread_mutex_lock(&g->mu);
    if (g->q_head && g->taken == g->taken_at_tick) {
        if (g->max_awake < g->n_workers) g->max_awake++;
        wake_workers(g, 1);
    } else if (!g->q_head) {
        g->max_awake = g->base_awake;
    }
    g->taken_at_tick = g->taken;
    pthread_mutex_unlock(&g->mu);
}

/* Every TICK_MS: deadlines of requests still arriving, Watch updates, idle connections. */
static void tick(kiln_grpc_server *g)
{
    int64_t now = now_ms();
    if (g->n_workers > 0) unblock_queue(g);
    flood_log_flush(g, now);
    for (kiln_grpc_conn *c = g->conns; c; c = c->next) {
        int touched = 0;
        for (stream *st = c->streams; st; st = st->next) {
            if (st->state == ST_RECV && st->deadline_ms > 0 && now > st->deadline_ms && st->m) {
                stream_finish(st, KILN_GRPC_DEADLINE_EXCEEDED, "Deadline Exceeded");
                touched = 1;
            } else if (st->state == ST_STREAMING && st->m->kind == KILN_GRPC_HEALTH_WATCH) {
                watch_update(st, 0);
                touched = 1;
            }
        }
        if (!c->streams && now - c->last_active_ms > (int64_t)KILN_GRPC_IDLE_SECONDS * 1000) {
            nghttp2_session_terminate_session(c->s, NGHTTP2_NO_ERROR); /* GOAWAY, then close */
            touched = 1;
        }
        if (touched) conn_flush(c);
    }
}

static void close_dead(kiln_grpc_server *g)
{
    for (kiln_grpc_conn *c = g->conns, *next; c; c = next) {
        next = c->next;
        if (c->dead) conn_close(c);
    }
}

/* ------------------------------------------------------------ DRAIN
 *
 * On SIGTERM (kiln_grpc_stop), as gRPC servers drain (grpc-go's
 * GracefulStop, the C core's shutdown; RFC 9113 section 6.8):
 *
 * 1. Stop accepting, as the REST port does (server.c, DRAIN): a filter on the
 *    TCP listening socket drops new SYNs (such a client is refused on its
 *    retry: UNAVAILABLE, nothing processed), the connections the kernel
 *    already completed are accepted and drained like the others, then the
 *    socket is closed, so none is reset in the backlog. The Unix socket's
 *    path is unlinked first (connect then fails), then its backlog taken.
 * 2. Every connection gets GOAWAY NO_ERROR with last-stream-id 2^31-1 and a
 *    PING: the client opens no new stream on it, and streams it opened before
 *    it read the GOAWAY are still served. When the PING's ACK arrives, every
 *    such stream has arrived too (the client sent them before the ACK), and
 *    the final GOAWAY says the real last stream id (at most DRAIN_PING_MS
 *    after the first without the ACK). A stream above it is refused with
 *    RST_STREAM REFUSED_STREAM and never served: gRPC clients retry it
 *    transparently, on another connection.
 * 3. Calls below the last id run to their answer, requests still arriving
 *    included. Health.Watch streams get NOT_SERVING, and with reflection
 *    streams are ended UNAVAILABLE between messages at the final GOAWAY.
 * 4. A connection with no stream left is shut for writing once everything is
 *    written (a FIN, not a reset that could destroy the last answer still
 *    unread at the client), and closed when the client closes it, at most
 *    DRAIN_LINGER_MS later.
 * All of it within the drain time: kiln_grpc_stop then closes what is left.
 */

/* nghttp2 has nothing more to do on c: during the drain shut it for
 * writing and wait for the client's close, else close it now. */
static void conn_over(kiln_grpc_conn *c)
{
    if (c->fd < 0 || c->drain == DRAIN_NONE || c->calm_over) {
        c->dead = 1;
        return;
    }
    if (c->drain == DRAIN_SHUT) return;
    /* close_notify, best effort: on the non-blocking socket it may return
     * GNUTLS_E_AGAIN with the alert partly written, and the shutdown below
     * then cuts it; every answer was written before, so the client sees at
     * worst a TLS error after its last answer, not a lost one */
    if (c->tls) (void)gnutls_bye(c->tls, GNUTLS_SHUT_WR);
    if (shutdown(c->fd, SHUT_WR) != 0) {
        c->dead = 1;
        return;
    }
    c->drain = DRAIN_SHUT;
    c->drain_ms = now_ms();
}

/* Step 2's first GOAWAY and the PING (sent by the caller's flush). */
static void drain_notice(kiln_grpc_conn *c)
{
    if (c->drain != DRAIN_NONE) return;
    c->drain = DRAIN_NOTICE;
    c->drain_ms = now_ms();
    if (nghttp2_submit_shutdown_notice(c->s) != 0 ||
        nghttp2_submit_ping(c->s, NGHTTP2_FLAG_NONE, DRAIN_PING) != 0)
        drain_final(c);
}

/* Step 2's final GOAWAY, and step 3's end of the long-lived streams. */
static void drain_final(kiln_grpc_conn *c)
{
    c->drain = DRAIN_FINAL;
    c->drain_ms = now_ms();
    c->drain_last_id = nghttp2_session_get_last_proc_stream_id(c->s);
    nghttp2_submit_goaway(c->s, NGHTTP2_FLAG_NONE, c->drain_last_id, NGHTTP2_NO_ERROR, NULL, 0);
    for (stream *st = c->streams; st; st = st->next)
        if (st->m && st->m->kind != KILN_GRPC_UNARY && st->state != ST_DONE && !st->in_msg &&
            !st->pfx_have)
            stream_finish(st, KILN_GRPC_UNAVAILABLE, "the server is shutting down");
}

/* Flush c unless its TLS handshake is still going (it flushes when done). */
static void drain_flush(kiln_grpc_conn *c)
{
    if (!c->dead && (!c->tls || c->handshake_done)) conn_flush(c);
}

/* Step 1 on listening socket k (0: TCP, 1: Unix); accept_all gives its connections step 2. */
static void drain_listener(kiln_grpc_server *g, int k)
{
    int fd = g->listen_fd[k];
    if (fd < 0) return;
    epoll_ctl(g->epfd, EPOLL_CTL_DEL, fd, NULL);
    if (k == 0) {
        /* as server.c's take_backlog: drop segments with SYN set (TCP header
         * byte 13, bit 0x02), keep the rest, so handshakes already answered
         * complete into the backlog and are taken below */
        struct sock_filter no_syn[] = {
            BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 13),
            BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x02, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, 0),
            BPF_STMT(BPF_RET | BPF_K, 0xffffffffu),
        };
        struct sock_fprog prog = {4, no_syn};
        (void)setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog); /* best effort */
    } else if (g->socket_path[0]) {
        unlink(g->socket_path); /* connect() fails from here on */
        g->socket_path[0] = '\0';
    }
    accept_all(g, fd);
    if (k == 0) {
        usleep(20 * 1000); /* handshakes answered before the filter: their ACKs */
        accept_all(g, fd);
    }
    close(fd);
    g->listen_fd[k] = -1;
}

static void drain_begin(kiln_grpc_server *g)
{
    tick(g); /* Watch streams learn NOT_SERVING before the GOAWAY */
    for (kiln_grpc_conn *c = g->conns; c; c = c->next) {
        drain_notice(c);
        drain_flush(c);
    }
    for (int k = 0; k < 2; k++) drain_listener(g, k); /* its connections get the notice at accept */
}

/* Each loop turn while draining: final GOAWAYs without an ACK, lingering
 * connections; then whether the drain is over. */
static void drain_step(kiln_grpc_server *g)
{
    int64_t now = now_ms();
    for (kiln_grpc_conn *c = g->conns; c; c = c->next) {
        if (c->dead) continue;
        if (c->drain == DRAIN_NOTICE && now - c->drain_ms >= DRAIN_PING_MS) {
            if (c->tls && !c->handshake_done) c->dead = 1; /* it sent no call */
            else drain_final(c);
            drain_flush(c);
        } else if (c->drain == DRAIN_FINAL) {
            /* reflection streams that were inside a message at the final GOAWAY;
             * flushed once after the walk: a flush can close and free streams */
            int finished = 0;
            for (stream *st = c->streams; st; st = st->next)
                if (st->m && st->m->kind != KILN_GRPC_UNARY && st->state != ST_DONE && !st->in_msg &&
                    !st->pfx_have) {
                    stream_finish(st, KILN_GRPC_UNAVAILABLE, "the server is shutting down");
                    finished = 1;
                }
            if (finished) drain_flush(c);
        } else if (c->drain == DRAIN_SHUT && now - c->drain_ms >= DRAIN_LINGER_MS) {
            c->dead = 1;
        }
    }
}

static void *loop_main(void *arg)
{
    kiln_grpc_server *g = arg;
    pthread_setname_np(pthread_self(), "grpc-loop");
    struct epoll_event evs[64];
    int drain_started = 0;
    while (!atomic_load(&g->stop_loop)) {
        int n = epoll_wait(g->epfd, evs, 64, TICK_MS);
        for (int i = 0; i < n; i++) {
            int *tag = evs[i].data.ptr;
            if (*tag == TAG_LISTEN) {
                accept_all(g, tag == &g->listen_tag[0] ? g->listen_fd[0] : g->listen_fd[1]);
            } else if (*tag == TAG_EVENT) {
                take_completions(g);
            } else {
                kiln_grpc_conn *c = (kiln_grpc_conn *)tag;
                if (c->dead) continue;
                if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) conn_read(c);
                if (!c->dead && (evs[i].events & EPOLLOUT)) {
                    if (c->tls && !c->handshake_done) {
                        if (tls_handshake(c)) conn_flush(c);
                    } else {
                        conn_flush(c);
                    }
                }
            }
        }
        hand_over(g);
        int64_t now = now_ms();
        if (now - g->last_tick >= TICK_MS) {
            g->last_tick = now;
            tick(g);
        }
        if (atomic_load(&g->draining)) {
            if (!drain_started) {
                drain_started = 1;
                drain_begin(g);
            }
            drain_step(g);
        }
        close_dead(g);
        if (drain_started && !g->conns && atomic_load(&g->in_flight) == 0 && !g->pend_head)
            atomic_store(&g->drained, 1);
    }
    /* answers that arrived while stopping: send what can be sent */
    take_completions(g);
    if (g->flood_unlogged) flood_log_write("grpc_frame_flood_suppressed", NULL, g->flood_unlogged);
    for (kiln_grpc_conn *c = g->conns; c; c = c->next)
        if (!c->dead) conn_flush(c);
    return NULL;
}

static void wake_loop(kiln_grpc_server *g)
{
    uint64_t one = 1;
    ssize_t w = write(g->evfd, &one, sizeof one);
    (void)w;
}

/* ------------------------------------------------------------ start / stop */

static int listen_tcp(const char *address, int port, char *err, size_t err_len)
{
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (address && inet_pton(AF_INET, address, &a.sin_addr) != 1) {
        snprintf(err, err_len, "'%s' is not an IPv4 address", address);
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 1024) != 0) {
        snprintf(err, err_len, "cannot listen on %s:%d for gRPC: %s", address ? address : "0.0.0.0", port,
                 strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

static int listen_unix(const char *path, char *err, size_t err_len)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a.sun_path) {
        snprintf(err, err_len, "--grpc_socket_path '%.100s' is too long", path);
        return -1;
    }
    strcpy(a.sun_path, path);
    unlink(path); /* a stale socket from an earlier run */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 1024) != 0) {
        snprintf(err, err_len, "cannot listen on Unix socket %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

static void server_free(kiln_grpc_server *g)
{
    while (g->conns) conn_close(g->conns);
    for (int k = 0; k < 2; k++)
        if (g->listen_fd[k] >= 0) close(g->listen_fd[k]);
    if (g->socket_path[0]) unlink(g->socket_path);
    if (g->evfd >= 0) close(g->evfd);
    if (g->epfd >= 0) close(g->epfd);
    /* jobs whose streams are gone: answered, or never taken */
    job *lists[3] = {g->done_head, g->q_head, g->pend_head};
    for (int k = 0; k < 3; k++)
        for (job *j = lists[k], *next; j; j = next) {
            next = j->next;
            job_free(j);
        }
    pthread_mutex_destroy(&g->mu);
    if (g->prio) gnutls_priority_deinit(g->prio);
    free(g->workers);
    free(g);
}

static kiln_grpc_server *server_alloc(const kiln_grpc_options *o)
{
    kiln_grpc_server *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->opt = *o;
    if (g->opt.max_threads < 1) g->opt.max_threads = 1;
    if (g->opt.max_streams < 1) g->opt.max_streams = KILN_GRPC_MAX_STREAMS;
    g->ctx.max_send = g->opt.max_send;
    g->conn_budget = CONN_BUFFER;
    if ((uint64_t)g->opt.max_recv + STREAM_WINDOW > g->conn_budget)
        g->conn_budget = (size_t)g->opt.max_recv + STREAM_WINDOW;
    g->ctx.tensor_content = g->opt.tensor_content;
    g->epfd = g->evfd = g->listen_fd[0] = g->listen_fd[1] = -1;
    g->listen_tag[0] = g->listen_tag[1] = TAG_LISTEN;
    g->ev_tag = TAG_EVENT;
    pthread_mutex_init(&g->mu, NULL);
    return g;
}

/* TLS: the credentials (loaded and checked by kiln_tls_open) and the priorities. */
static kiln_status tls_setup(kiln_grpc_server *g, kiln_tls *tls, char *err, size_t err_len)
{
    g->tls = tls;
    int rc = gnutls_priority_init(&g->prio, "NORMAL", NULL);
    if (rc != GNUTLS_E_SUCCESS) {
        g->prio = NULL;
        snprintf(err, err_len, "TLS: %s", gnutls_strerror(rc));
        return KILN_ERR_RUNTIME;
    }
    return KILN_OK;
}

kiln_status kiln_grpc_listen(const kiln_grpc_options *o, kiln_grpc_server **out, char *err,
                             size_t err_len)
{
    kiln_grpc_server *g = server_alloc(o);
    if (!g) {
        snprintf(err, err_len, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    if (o->tls && tls_setup(g, o->tls, err, err_len) != KILN_OK) goto err_free;
    g->epfd = epoll_create1(EPOLL_CLOEXEC);
    g->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (g->epfd < 0 || g->evfd < 0) {
        snprintf(err, err_len, "epoll/eventfd: %s", strerror(errno));
        goto err_free;
    }
    if (o->port > 0 && (g->listen_fd[0] = listen_tcp(o->address, o->port, err, err_len)) < 0)
        goto err_free;
    if (o->socket_path && *o->socket_path) {
        if ((g->listen_fd[1] = listen_unix(o->socket_path, err, err_len)) < 0) goto err_free;
        snprintf(g->socket_path, sizeof g->socket_path, "%s", o->socket_path);
    }
    for (int k = 0; k < 2; k++) {
        if (g->listen_fd[k] < 0) continue;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &g->listen_tag[k]};
        epoll_ctl(g->epfd, EPOLL_CTL_ADD, g->listen_fd[k], &ev);
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &g->ev_tag};
    epoll_ctl(g->epfd, EPOLL_CTL_ADD, g->evfd, &ev);
    *out = g;
    return KILN_OK;
err_free:
    server_free(g);
    return KILN_ERR_IO;
}

/* Wake every request thread to finish what is queued and end; join them. */
static void stop_workers(kiln_grpc_server *g)
{
    pthread_mutex_lock(&g->mu);
    g->stop_workers = 1;
    while (g->idle) {
        worker *w = g->idle;
        g->idle = w->next_idle;
        w->woken = 1;
        g->n_awake++;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < g->n_workers && !g->workers_joined; i++) {
        pthread_join(g->workers[i].t, NULL);
        pthread_cond_destroy(&g->workers[i].cv);
    }
    g->workers_joined = 1;
}

kiln_status kiln_grpc_run(kiln_grpc_server *g, kiln_server *rest, char *err, size_t err_len)
{
    g->ctx.rest = rest;
    /* Without batching a handler runs on the CPU from start to end, so more
     * request threads running than there are cores would only take turns on
     * them (a context switch and a lock handover each time); the others stay
     * asleep until the queue needs them. With batching a call waits for its
     * batch, and every thread may wait in one. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    g->base_awake = g->opt.max_threads;
    if (!(rest && rest->opt.offload) && cores >= 1 && cores < g->base_awake) g->base_awake = (int)cores;
    g->max_awake = g->base_awake;
    g->workers = calloc((size_t)g->opt.max_threads, sizeof *g->workers);
    pthread_mutex_lock(&g->mu);
    for (int i = 0; g->workers && i < g->opt.max_threads; i++) {
        worker *w = &g->workers[i];
        w->g = g;
        pthread_cond_init(&w->cv, NULL);
        if (pthread_create(&w->t, NULL, worker_main, w) != 0) {
            pthread_cond_destroy(&w->cv);
            break;
        }
        g->n_workers++;
        g->n_awake++; /* until it first finds the queue empty */
    }
    pthread_mutex_unlock(&g->mu);
    if (g->n_workers == 0 || pthread_create(&g->loop, NULL, loop_main, g) != 0) {
        snprintf(err, err_len, "cannot start the gRPC threads");
        stop_workers(g);
        return KILN_ERR_RUNTIME; /* the caller stops (frees) g */
    }
    g->loop_started = 1;
    return KILN_OK;
}

void kiln_grpc_stop(kiln_grpc_server *g, int drain_ms)
{
    if (!g) return;
    int64_t end = now_ms() + (drain_ms > 0 ? drain_ms : 0);
    atomic_store(&g->draining, 1); /* the loop drains (DRAIN above) */
    wake_loop(g);
    while (g->loop_started && !atomic_load(&g->drained) && now_ms() < end)
        usleep(5 * 1000);
    /* past the drain time: request threads finish what is queued (cancelled
     * jobs end at once), then every connection left is closed */
    pthread_mutex_lock(&g->mu);
    for (job *j = g->q_head; j; j = j->next) j->cancel = 1;
    pthread_mutex_unlock(&g->mu);
    stop_workers(g);
    atomic_store(&g->stop_loop, 1);
    wake_loop(g);
    if (g->loop_started) pthread_join(g->loop, NULL);
    server_free(g);
}

/* ------------------------------------------------------------ detached (fuzzing) */

kiln_grpc_server *kiln_grpc_detached_new(const kiln_grpc_options *o)
{
    kiln_grpc_server *g = server_alloc(o);
    if (g) g->detached = 1;
    return g;
}

void kiln_grpc_detached_free(kiln_grpc_server *g)
{
    if (g) server_free(g);
}

kiln_grpc_conn *kiln_grpc_detached_conn(kiln_grpc_server *g)
{
    return conn_new(g, -1);
}

int kiln_grpc_conn_feed(kiln_grpc_conn *c, const uint8_t *data, size_t len)
{
    if (c->dead) return 0;
    int ok = conn_input(c, data, len);
    /* the tick's work too, so the fuzzer reaches it */
    for (stream *st = c->streams; st; st = st->next)
        if (st->state == ST_STREAMING && st->m->kind == KILN_GRPC_HEALTH_WATCH) watch_update(st, 0);
    conn_flush(c);
    return ok && !c->dead;
}

void kiln_grpc_conn_drain(kiln_grpc_conn *c, int final)
{
    if (c->dead) return;
    drain_notice(c);
    if (final && c->drain == DRAIN_NOTICE) drain_final(c);
    conn_flush(c);
}

void kiln_grpc_conn_free(kiln_grpc_conn *c)
{
    conn_close(c);
}
