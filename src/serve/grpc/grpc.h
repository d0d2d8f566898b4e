/*
 * grpc.h - `kiln serve`'s gRPC endpoint: TF Serving's gRPC API
 * (tensorflow.serving.PredictionService and ModelService, grpc.health.v1,
 * grpc.reflection v1 and v1alpha) over HTTP/2 on --port (default 8500) and,
 * with --grpc_socket_path, on a Unix socket.
 *
 * The transport (h2.c) is libnghttp2 driven by one epoll thread that owns
 * every connection; complete request messages go to a pool of
 * --grpc_max_threads request threads that run the handlers (service.c).
 * The handlers share the REST server's request path: the same model manager
 * (routing, version policies, labels), the same batching queues and run
 * (kiln_servable_run), deadlines, and metrics (the REST server's
 * kiln_metrics, with TF Serving's entrypoint="GRPC" label). See
 * docs/GRPC.md for the methods, flags, limits and error table.
 *
 * Ownership: the gRPC server borrows the REST server (its manager and
 * metrics) from kiln_grpc_run on; stop it before the REST server.
 */
#ifndef KILN_SERVE_GRPC_H
#define KILN_SERVE_GRPC_H

#include <stddef.h>
#include <stdint.h>

#include "serve/server.h"

/* Defaults and limits (docs/GRPC.md). TF Serving lets messages reach
 * 2 GiB - 1 each way; Kiln bounds what one request can make it buffer. */
#define KILN_GRPC_DEFAULT_MAX_RECV ((int64_t)64 << 20)   /* grpc.max_receive_message_length */
#define KILN_GRPC_DEFAULT_MAX_SEND ((int64_t)2147483647) /* grpc.max_send_message_length */
#define KILN_GRPC_MAX_MESSAGE ((int64_t)2147483647)
#define KILN_GRPC_MAX_STREAMS 256          /* SETTINGS_MAX_CONCURRENT_STREAMS per connection */
#define KILN_GRPC_MAX_HEADER_LIST 16384    /* bytes of request headers per stream */
#define KILN_GRPC_MAX_CONNECTIONS 1024     /* connections beyond are closed at accept */
#define KILN_GRPC_IDLE_SECONDS 300         /* a connection with no open stream is closed after */

typedef struct kiln_grpc_options {
    const char *address;       /* IPv4 listen address (NULL = all interfaces) */
    int port;                  /* --port; 0 = no TCP listener */
    const char *socket_path;   /* --grpc_socket_path, or NULL */
    int max_threads;           /* --grpc_max_threads: request threads */
    int64_t max_recv;          /* grpc.max_receive_message_length, after decompression */
    int64_t max_send;          /* grpc.max_send_message_length */
    int max_streams;           /* grpc.max_concurrent_streams */
    int tensor_content;        /* answer numeric tensors in tensor_content, not typed fields */
    struct kiln_tls *tls;      /* --ssl_config_file / --ssl_cert_file: TLS (GnuTLS) on every
                                  listener, credentials re-read when their files change
                                  (serve/tls.h); NULL = plaintext (borrowed until kiln_grpc_stop) */
} kiln_grpc_options;

typedef struct kiln_grpc_server kiln_grpc_server;

/* Fill the defaults: port 8500, max_threads 4, the limits above. */
void kiln_grpc_options_default(kiln_grpc_options *o);

/*
 * Parse --grpc_channel_arguments ("k=v,k=v"): grpc.max_receive_message_length,
 * grpc.max_send_message_length (-1 = the maximum, 2 GiB - 1) and
 * grpc.max_concurrent_streams are applied; other keys are accepted and
 * logged as ignored. On error err says which argument and why.
 */
kiln_status kiln_grpc_parse_channel_args(const char *spec, kiln_grpc_options *o, char *err,
                                         size_t err_len);

/* Bind and listen (and set up TLS) without serving yet: connections wait in
 * the backlog, so a client that sees the REST port ready finds gRPC too.
 * On error err says why. */
kiln_status kiln_grpc_listen(const kiln_grpc_options *o, kiln_grpc_server **out, char *err,
                             size_t err_len);
/* Start the loop and request threads, answering with rest's manager and
 * metrics. On error stop g with kiln_grpc_stop. */
kiln_status kiln_grpc_run(kiln_grpc_server *g, kiln_server *rest, char *err, size_t err_len);
/* Stop accepting, tell clients (GOAWAY), wait up to drain_ms for calls in
 * flight, then close everything and free the server. */
void kiln_grpc_stop(kiln_grpc_server *g, int drain_ms);

#endif
