/*
 * fuzz_grpc_frames.c - libFuzzer target for `kiln serve`'s gRPC transport
 * (src/serve/grpc/h2.c): raw bytes from a client into the HTTP/2 session
 * (nghttp2: preface, SETTINGS, HPACK headers, flow control, RST_STREAM),
 * then Kiln's side: header checks, grpc-timeout and grpc-encoding, the
 * 5-byte message framing, gzip/deflate inflation under the size limit,
 * trailers, Health.Watch and reflection streams.
 *
 * The server is detached (no sockets, no threads, no models): unary calls
 * are echoed inline, so every path from bytes to a sent answer runs. Each
 * input is fed twice on fresh connections: whole, and in small pieces
 * whose sizes come from the input, so message and frame boundaries fall
 * anywhere. A third connection begins the SIGTERM drain half-way (the
 * GOAWAYs, the PING and its ACK, streams refused above the last id).
 * Only crashes, hangs, leaks and sanitizer reports count.
 */
#include <stdint.h>
#include <stdlib.h>

#include "serve/grpc/h2.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kiln_grpc_server *g;
    if (!g) {
        kiln_grpc_options o;
        kiln_grpc_options_default(&o);
        o.max_recv = 1 << 20;
        g = kiln_grpc_detached_new(&o);
        if (!g) abort();
    }
    kiln_grpc_conn *c = kiln_grpc_detached_conn(g);
    if (!c) return 0;
    kiln_grpc_conn_feed(c, data, size);
    kiln_grpc_conn_free(c);

    c = kiln_grpc_detached_conn(g);
    if (!c) return 0;
    uint32_t seed = (uint32_t)size * 2654435761u;
    for (size_t off = 0; off < size;) {
        seed = seed * 1103515245u + 12345u;
        size_t n = 1 + (seed >> 16) % 61;
        if (n > size - off) n = size - off;
        if (!kiln_grpc_conn_feed(c, data + off, n)) break;
        off += n;
    }
    kiln_grpc_conn_free(c);

    c = kiln_grpc_detached_conn(g);
    if (!c) return 0;
    size_t half = size / 2;
    if (kiln_grpc_conn_feed(c, data, half)) {
        kiln_grpc_conn_drain(c, size > 0 && (data[0] & 1));
        kiln_grpc_conn_feed(c, data + half, size - half);
    }
    kiln_grpc_conn_free(c);
    return 0;
}
