/*
 * h2.h - the HTTP/2 side of the gRPC server (h2.c), exposed for the fuzz
 * target: a server object without sockets or threads, whose connections
 * are fed raw bytes and answer unary calls inline with an echo handler.
 */
#ifndef KILN_SERVE_GRPC_H2_H
#define KILN_SERVE_GRPC_H2_H

#include <stddef.h>
#include <stdint.h>

#include "serve/grpc/grpc.h"

typedef struct kiln_grpc_conn kiln_grpc_conn;

/* A server with no listener and no threads (fuzzing): unary calls are echoed. */
kiln_grpc_server *kiln_grpc_detached_new(const kiln_grpc_options *o);
void kiln_grpc_detached_free(kiln_grpc_server *g);
/* A connection with no socket: what it would send is dropped. */
kiln_grpc_conn *kiln_grpc_detached_conn(kiln_grpc_server *g);
/* Feed bytes as if read from the socket; 0 once the connection is closed. */
int kiln_grpc_conn_feed(kiln_grpc_conn *c, const uint8_t *data, size_t len);
void kiln_grpc_conn_free(kiln_grpc_conn *c);
/* Begin the SIGTERM drain on c as the loop does (h2.c, DRAIN): GOAWAY with
 * last-stream-id 2^31-1 and a PING; with final, the GOAWAY with the last
 * stream id at once (else it follows the client's PING ACK). */
void kiln_grpc_conn_drain(kiln_grpc_conn *c, int final);

#endif
