/*
 * release.h - the two files a release leaves in a model version folder
 * (docs/RELEASE_GATE.md):
 *
 *   assets.extra/kiln_blessing.json  written by `kiln gate` when a candidate
 *       passes: the SHA-256 of every file of the version folder, the digest
 *       of that list, the time, the baseline and the gate's summary.
 *       `kiln serve --require_blessing` serves a version only when its
 *       blessing matches the files as they are now.
 *   assets.extra/kiln_version.json   written by whoever builds the version:
 *       where it came from (source commit, data version, training run, free
 *       labels). The server shows it in the console, the KServe v2 model
 *       metadata and the load log line.
 *
 * Both files are untrusted input: they are read with a size bound, parsed
 * with the server's JSON tokenizer (json.h), every string and count is
 * bounded, and every problem comes back as a kiln_status with a one-line
 * message (KILN_JSON_ERR_LEN bytes) naming the file and the field. The
 * parsers are fuzzed (fuzz/fuzz_release_files.c). Hashing reuses the
 * manifest of src/security/ (kiln sign), so a blessing and a signature list
 * a folder's files the same way.
 *
 * This library is part of the server (kiln_serve) and knows files only;
 * the gate's comparison of two models lives with the CLI (src/cli/gate.h).
 */
#ifndef KILN_SERVE_GATE_RELEASE_H
#define KILN_SERVE_GATE_RELEASE_H

#include <stdint.h>

#include "kiln/kiln.h"
#include "serve/json.h"

#define KILN_BLESSING_FILE "assets.extra/kiln_blessing.json"
#define KILN_VERSION_INFO_FILE "assets.extra/kiln_version.json"
#define KILN_BLESSING_FORMAT "kiln-blessing-v1"
#define KILN_BLESSING_MAX_BYTES (32u << 20)  /* a blessing file read at most */
#define KILN_VERSION_INFO_MAX_BYTES (64u << 10)
#define KILN_VERSION_INFO_MAX_STRING 1024    /* bytes of one value or label */
#define KILN_VERSION_INFO_MAX_LABELS 64

/* ---- traceability: kiln_version.json ---- */

typedef struct kiln_version_info {
    char *source_commit;  /* each NULL when absent; owned */
    char *data_version;
    char *training_run;
    char *created;        /* free text, e.g. an ISO 8601 time */
    int n_labels;
    char **label_keys;    /* [n_labels], owned, in file order */
    char **label_values;
} kiln_version_info;

/* Parse the bytes of a kiln_version.json (what names the file in
 * messages). On success *out is a new record (kiln_version_info_free). */
kiln_status kiln_version_info_parse(const char *text, size_t len, const char *what,
                                    kiln_version_info **out, char *err);
/* Read dir's assets.extra/kiln_version.json: KILN_OK with *out NULL when
 * the file does not exist. */
kiln_status kiln_version_info_read(const char *dir, kiln_version_info **out, char *err);
void kiln_version_info_free(kiln_version_info *vi);
/* {"source_commit": ..., ..., "labels": {...}}: absent fields left out. */
void kiln_version_info_write_json(kiln_sbuf *b, const kiln_version_info *vi);
/* The same as flat string members for KServe v2 "parameters" (no braces):
 * "source_commit": "...", ..., "label.KEY": "...". Writes nothing for an
 * empty record; *wrote says whether a member was written. */
void kiln_version_info_write_params(kiln_sbuf *b, const kiln_version_info *vi, int *wrote);

/* ---- blessings: kiln_blessing.json ---- */

typedef struct kiln_blessing_file {
    char *path;          /* relative, '/'-separated (owned) */
    uint64_t size;
    uint8_t sha256[32];
} kiln_blessing_file;

typedef struct kiln_blessing {
    char digest[72];         /* "sha256:<64 hex>" of the file list */
    char blessed_at[64];     /* as written (UTC, ISO 8601) */
    int n_files;
    kiln_blessing_file *files; /* sorted by path, unique (owned) */
} kiln_blessing;

/* Parse the bytes of a kiln_blessing.json (no check against the folder). */
kiln_status kiln_blessing_parse(const char *text, size_t len, const char *what,
                                kiln_blessing *out, char *err);
void kiln_blessing_free(kiln_blessing *b);

/* The digest of version folder dir as a blessing records it: the SHA-256
 * manifest of every file (the blessing itself and a root kiln.sig
 * excepted), and "sha256:<hex>" of its lines (72 bytes). files_json, when
 * not NULL, receives the list as the blessing's "files" JSON array. */
kiln_status kiln_blessing_digest(const char *dir, char digest[72], kiln_sbuf *files_json,
                                 char *err);
/* Write dir/assets.extra/kiln_blessing.json (creating assets.extra/):
 * the folder's files and digest, blessed_at = now, and the caller's JSON
 * members `extra` (e.g. "\"baseline\": {...}, \"summary\": {...}", may be
 * NULL) verbatim. digest_out (72 bytes, may be NULL) receives the digest. */
kiln_status kiln_blessing_write(const char *dir, const char *extra, char *digest_out, char *err);
/* Check that dir carries a blessing that matches its files now. On
 * failure err says why: no blessing, a malformed one, or the first file
 * that changed, appeared or disappeared since. */
kiln_status kiln_blessing_check(const char *dir, kiln_blessing *out_or_null, char *err);

#endif
