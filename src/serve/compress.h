/*
 * compress.h - Vertex AI's --allow_compression and --allow_precompilation
 * for `kiln serve` (docs/COMPRESSION.md, "In kiln serve").
 *
 * The manager (manager.c) calls these while it loads a version, off the
 * request path:
 *   - kiln_compress_lookup, before import: with precompilation on, the
 *     version's cache key (SHA-256 of the version's files, Kiln's version,
 *     this CPU's features and the options that change what is compiled)
 *     names a .kiln file in the cache folder; a hit loads it instead of
 *     importing and optimizing the source. An entry that does not load
 *     (truncated, corrupted, foreign) is logged, removed and rebuilt.
 *   - kiln_compress_session, after import: with compression on, the
 *     version's single signature is compiled by the library's `auto`
 *     policy (kiln_compile), calibrated and checked on the rows of the
 *     version's warmup file (assets.extra/tf_serving_warmup_requests); the
 *     compressed session is served only when the check passes. Then, with
 *     precompilation on, the served session is written to the cache
 *     (kiln_session_save writes beside the target and renames, so two
 *     replicas filling the same entry never expose half a file).
 * Both append key=value pairs to the version's load log line, saying what
 * was done and, when a version is served uncompressed, why. They never
 * fail a load that would succeed without them: every problem is a reason
 * in the log and the version is served as imported.
 *
 * Only the public API (kiln.h) is used, like the rest of the server.
 */
#ifndef KILN_SERVE_COMPRESS_H
#define KILN_SERVE_COMPRESS_H

#include "kiln/kiln.h"
#include "serve/json.h"

typedef struct kiln_compress_options {
    int allow_compression;      /* --allow_compression */
    int allow_precompilation;   /* --allow_precompilation */
    double max_drop;            /* --compression_max_drop, a fraction (default 0.01) */
    const char *cache_dir;      /* --precompilation_cache_dir; NULL: kiln_compress_default_cache */
} kiln_compress_options;

/* The default cache folder: $XDG_CACHE_HOME/kiln/precompiled, else
 * $HOME/.cache/kiln/precompiled, else /tmp/kiln-precompiled-<uid>. */
void kiln_compress_default_cache(char *buf, size_t cap);

/* What one version load decided (filled by the calls below). */
typedef struct kiln_compress_state {
    char cache_file[4096];      /* the entry's path; "" when precompilation is off */
    int hit;                    /* the model came from the cache */
    char precision[8];          /* served precision: fp32, bf16 or int8 (the lowest any
                                   compiled node runs in) */
    char summary[1024];         /* the compile summary, for the cache entry */
} kiln_compress_state;

/* Before import. *model is the cached artifact on a hit (st->hit = 1),
 * else NULL. options_text: the loader's options that change the result
 * (tags, format preference, optimizer), part of the key. */
void kiln_compress_lookup(const kiln_compress_options *o, const char *dir,
                          const char *options_text, kiln_compress_state *st, kiln_model **model,
                          kiln_sbuf *kv);

/* After import (not on a hit): compress and/or store. sessions[0..n) are
 * the model's sessions, one per signature; with compression on and one
 * signature, sessions[0] may be replaced by the compressed session (the old
 * one freed). so: the sessions' options. */
void kiln_compress_session(const kiln_compress_options *o, const char *dir, kiln_model *m,
                           const kiln_session_options *so, kiln_session **sessions, int n,
                           kiln_compress_state *st, kiln_sbuf *kv);

#endif
