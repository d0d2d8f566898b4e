/*
 * console.h - the web console that `kiln serve` serves at /console/ (off with
 * --enable_console=false): a page of static assets (src/serve/console/assets/,
 * built into the binary by src/serve/console/embed.cmake) that shows the
 * models, their versions and signatures, live request and batching charts,
 * and a form to try a prediction, plus the JSON stats endpoint
 * GET /console/api/stats that the page polls. See docs/CONSOLE.md.
 *
 * Every console reply carries KILN_CONSOLE_CSP: the page loads scripts,
 * styles, images and data from its own origin only, and no inline script.
 */
#ifndef KILN_SERVE_CONSOLE_H
#define KILN_SERVE_CONSOLE_H

#include <stddef.h>

#include "serve/server.h"

#define KILN_CONSOLE_CSP                                                                   \
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "            \
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "         \
    "frame-ancestors 'none'"

/* One embedded file (the generated console_assets.c holds the table). */
typedef struct kiln_console_asset {
    const char *name;           /* file name under assets/, e.g. "console.js" */
    const unsigned char *data;  /* its bytes */
    size_t size;
} kiln_console_asset;

extern const kiln_console_asset kiln_console_assets[];
extern const int kiln_console_asset_count;

/* Answer a GET under /console (the route table sends every such path here
 * when the console is on): the page, its assets, or the stats JSON. */
void kiln_console_serve(kiln_server *s, const kiln_http_request *req, kiln_http_reply *rep);

#endif
