/*
 * auth.h - bearer tokens with scopes for `kiln serve --auth_token_file`
 * (docs/SECURITY.md, "Tokens").
 *
 * A token file lists the SHA-256 of each token (never the token itself)
 * with the scopes it grants and an optional name, one line per token:
 *
 *     # comment
 *     sha256:<64 hex> scopes=predict,metadata name=ci-client
 *
 * Scopes are "predict" (predict, classify, regress, infer, MultiInference),
 * "metadata" (model status, metadata, lists, the console's views) and
 * "admin" (config reload, rollout control, the console's actions). A request
 * presents a token as `Authorization: Bearer TOKEN` (REST, or the gRPC
 * `authorization` metadata), or, for browsers on the console, as HTTP Basic
 * with the token as the password (any user name).
 *
 * kiln_auth is the server's kiln_authorize_fn (server.h): it holds the parsed
 * file and re-reads it when its modification time, size or inode changes
 * (checked at most once a second, on requests), so a token is revoked by
 * deleting its line, without a restart. A file that no longer parses keeps
 * the last good set in force and says so on stderr.
 */
#ifndef KILN_SERVE_AUTH_H
#define KILN_SERVE_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#define KILN_AUTH_ERR_LEN 256
#define KILN_AUTH_NAME_MAX 64
#define KILN_AUTH_TOKEN_MAX 512 /* longer presented tokens are refused unhashed */

enum {
    KILN_SCOPE_PREDICT = 1u << 0,
    KILN_SCOPE_METADATA = 1u << 1,
    KILN_SCOPE_ADMIN = 1u << 2,
};

typedef struct kiln_token_entry {
    uint8_t hash[32];                  /* SHA-256 of the token's bytes */
    unsigned scopes;                   /* KILN_SCOPE_* bits */
    char name[KILN_AUTH_NAME_MAX + 1]; /* "" when the line has none */
} kiln_token_entry;

typedef struct kiln_token_set {
    kiln_token_entry *e; /* owned */
    int n;
} kiln_token_set;

/* The scope bit for a name ("predict", ...), or 0 for an unknown name. */
unsigned kiln_scope_bit(const char *name, size_t len);

/* Parse a token file's bytes (untrusted: fuzz/fuzz_token_file.c). On error
 * err names `path`, the line and the bad value; *out is left empty. */
kiln_status kiln_token_file_parse(const char *text, size_t len, const char *path,
                                  kiln_token_set *out, char *err, size_t err_len);
void kiln_token_set_free(kiln_token_set *s);

/* 0 when `authorization` (an Authorization header value, or NULL) carries a
 * token of `set` whose scopes include `scope`; 401 for no or an unknown
 * token; 403 for a known token without the scope. Hashes are compared in
 * constant time, and every entry is compared. */
int kiln_token_set_check(const kiln_token_set *set, const char *authorization, const char *scope);

/* Write the file line for a new token: "sha256:<hex> scopes=... [name=...]". */
kiln_status kiln_token_line(const char *token, const char *scopes, const char *name, char *out,
                            size_t out_len, char *err, size_t err_len);

/* The server's token check, re-reading its file when it changes. */
typedef struct kiln_auth kiln_auth;
kiln_status kiln_auth_open(const char *path, kiln_auth **out, char *err, size_t err_len);
/* kiln_authorize_fn: ctx is a kiln_auth. Thread-safe. */
int kiln_auth_authorize(void *ctx, const char *authorization, const char *scope);
/* How many tokens are in force (startup log, tests). */
int kiln_auth_count(kiln_auth *a);
void kiln_auth_free(kiln_auth *a);

#endif
