/*
 * call.h - what the HTTP/2 transport (h2.c) and the gRPC method handlers
 * (service.c, reflect.c) share: the method table, one unary call as a
 * handler sees it, gRPC status codes, and the message buffers.
 *
 * A unary call is decoded by the transport into one complete request
 * message (already length-checked and decompressed); a handler fills the
 * serialized response message or a status code and message. Handlers never
 * see HTTP/2: the same functions are driven by the fuzz targets.
 */
#ifndef KILN_SERVE_GRPC_CALL_H
#define KILN_SERVE_GRPC_CALL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "kiln/kiln.h"
#include "serve/server.h"

/* gRPC status codes (equal to TensorFlow's error codes). */
enum {
    KILN_GRPC_OK = 0,
    KILN_GRPC_CANCELLED = 1,
    KILN_GRPC_UNKNOWN = 2,
    KILN_GRPC_INVALID_ARGUMENT = 3,
    KILN_GRPC_DEADLINE_EXCEEDED = 4,
    KILN_GRPC_NOT_FOUND = 5,
    KILN_GRPC_PERMISSION_DENIED = 7,
    KILN_GRPC_FAILED_PRECONDITION = 9,
    KILN_GRPC_RESOURCE_EXHAUSTED = 8,
    KILN_GRPC_UNIMPLEMENTED = 12,
    KILN_GRPC_INTERNAL = 13,
    KILN_GRPC_UNAVAILABLE = 14,
    KILN_GRPC_UNAUTHENTICATED = 16,
};

/* TF Serving truncates status messages to this many characters (plus
 * "...TRUNCATED"). */
#define KILN_GRPC_MESSAGE_MAX 1024

/* A growable byte buffer (response messages). */
typedef struct kiln_bytes {
    uint8_t *p;
    size_t len, cap;
    int oom;
} kiln_bytes;
void kiln_bytes_reserve(kiln_bytes *b, size_t extra);
void kiln_bytes_put(kiln_bytes *b, const void *s, size_t n);
void kiln_bytes_free(kiln_bytes *b);

/* What the server-wide handlers need. */
typedef struct kiln_grpc_ctx {
    kiln_server *rest;      /* manager, metrics, shutting_down (borrowed) */
    int64_t max_send;       /* response messages beyond are RESOURCE_EXHAUSTED */
    int tensor_content;     /* numeric outputs in tensor_content */
} kiln_grpc_ctx;

/* One unary call. */
typedef struct kiln_grpc_call {
    const kiln_grpc_ctx *ctx;
    const uint8_t *req;         /* the request message (borrowed) */
    size_t req_len;
    int64_t deadline_ms;        /* kiln_monotonic_ms clock; 0 = none */
    const char *route_key;      /* the observers' route key metadata, or NULL */
    const char *authorization;  /* the authorization metadata, or NULL */
    const volatile int *cancel; /* set when the client cancels (RST_STREAM) */
    struct timespec start;      /* when the request's headers arrived (metrics) */
    kiln_bytes resp;            /* out: the response message (no gRPC prefix) */
    int code;                   /* out: gRPC status code */
    char message[KILN_GRPC_MESSAGE_MAX + 16]; /* out: status message */
} kiln_grpc_call;

typedef void (*kiln_grpc_handler)(kiln_grpc_call *c);

typedef enum kiln_grpc_kind {
    KILN_GRPC_UNARY = 0,        /* run on a request thread */
    KILN_GRPC_HEALTH_WATCH,     /* server streaming, driven by the loop */
    KILN_GRPC_REFLECTION,       /* bidirectional streaming, answered on the loop */
} kiln_grpc_kind;

typedef struct kiln_grpc_method {
    const char *path;           /* "/tensorflow.serving.PredictionService/Predict" */
    kiln_grpc_kind kind;
    kiln_grpc_handler fn;       /* unary handlers */
    const char *scope;          /* the token scope it needs with --auth_token_file; NULL: open */
} kiln_grpc_method;

/* The access check (--auth_token_file): 0 when c may call m, else c's
 * status is set (UNAUTHENTICATED or PERMISSION_DENIED) and 1. */
int kiln_grpc_refuse_unauthorized(kiln_grpc_call *c, const kiln_grpc_method *m);

/* The method for an HTTP/2 :path, or NULL (UNIMPLEMENTED). */
const kiln_grpc_method *kiln_grpc_method_find(const char *path);

/* Set c's status: code and a printf message (truncated as TF Serving does). */
void kiln_grpc_fail(kiln_grpc_call *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* gRPC code for TF's code name ("NOT_FOUND" -> 5); unknown names -> UNKNOWN. */
int kiln_grpc_code_of(const char *name);
const char *kiln_grpc_code_name(int code);

/* grpc.health.v1: the status of `service` (1 SERVING, 2 NOT_SERVING), or -1
 * for a service the server does not have. */
int kiln_grpc_health_status(const kiln_grpc_ctx *ctx, const char *service);
/* Serialize a HealthCheckResponse{status} into out. */
void kiln_grpc_health_encode(int status, kiln_bytes *out);
/* Decode a HealthCheckRequest's service name into buf; 0 if malformed. */
int kiln_grpc_health_decode(const uint8_t *p, size_t n, char *buf, size_t cap);

/* grpc.reflection: answer one ServerReflectionRequest (reflect.c) with a
 * serialized ServerReflectionResponse. */
void kiln_grpc_reflect(const uint8_t *req, size_t n, kiln_bytes *out);

#endif
