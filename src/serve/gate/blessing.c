/*
 * blessing.c - a version folder's assets.extra/kiln_blessing.json: written
 * by `kiln gate` when a candidate passes, checked by the model manager
 * under `kiln serve --require_blessing` (release.h, docs/RELEASE_GATE.md).
 *
 *   {"format": "kiln-blessing-v1",
 *    "digest": "sha256:<hex of SHA-256 over the manifest lines>",
 *    "blessed_at": "2026-12-02T00:30:00Z",
 *    "files": [{"path": "model.onnx", "size": 1234, "sha256": "<hex>"}, ...],
 *    ...the gate's "kiln_version", "baseline" and "summary" members}
 *
 * The file list is the manifest of `kiln sign` (src/security/manifest.c):
 * every regular file at any depth, sorted by path, except a root kiln.sig
 * and the blessing itself; the digest hashes its lines
 * "sha256 <hex> <size> <path>\n". A blessing is valid for a folder when the
 * folder's manifest now is exactly the listed one, so editing, adding or
 * removing any file (a kiln_version.json or a warmup file included) makes
 * it stale. Signing comes after blessing: kiln.sig then covers the blessing.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "security/security.h"
#include "serve/gate/release.h"

void kiln_blessing_free(kiln_blessing *b)
{
    for (int i = 0; i < b->n_files; i++) free(b->files[i].path);
    free(b->files);
    b->files = NULL;
    b->n_files = 0;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* 64 lower-case hex digits into 32 bytes; 0 if s is not that. */
static int parse_hex32(const char *s, size_t n, uint8_t out[32])
{
    if (n != 64) return 0;
    for (int i = 0; i < 32; i++) {
        int hi = hex_value(s[2 * i]), lo = hex_value(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return 0;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 1;
}

static void to_hex(const uint8_t *p, size_t n, char *out)
{
    static const char h[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = h[p[i] >> 4];
        out[2 * i + 1] = h[p[i] & 15];
    }
    out[2 * n] = '\0';
}

/* "sha256:<hex>" of the manifest lines of files[0..n). */
static kiln_status digest_files(const kiln_blessing_file *files, int n, char digest[72],
                                char *err)
{
    kiln_status st = kiln_sec_init(err);
    if (st != KILN_OK) return st;
    crypto_hash_sha256_state h;
    crypto_hash_sha256_init(&h);
    for (int i = 0; i < n; i++) {
        char hex[65], head[128];
        to_hex(files[i].sha256, 32, hex);
        int k = snprintf(head, sizeof head, "sha256 %s %" PRIu64 " ", hex, files[i].size);
        crypto_hash_sha256_update(&h, (const unsigned char *)head, (unsigned long long)k);
        crypto_hash_sha256_update(&h, (const unsigned char *)files[i].path,
                                  strlen(files[i].path));
        crypto_hash_sha256_update(&h, (const unsigned char *)"\n", 1);
    }
    uint8_t d[32];
    crypto_hash_sha256_final(&h, d);
    memcpy(digest, "sha256:", 7);
    to_hex(d, 32, digest + 7);
    return KILN_OK;
}

/* One entry of "files". */
static kiln_status parse_file(const kiln_json_doc *d, int t, int i, const char *what,
                              kiln_blessing_file *f, char *err)
{
    int p = kiln_json_object_get(d, t, "path"), s = kiln_json_object_get(d, t, "size"),
        h = kiln_json_object_get(d, t, "sha256");
    int64_t size;
    if (p < 0 || s < 0 || h < 0 || d->tok[p].type != KILN_JSON_STRING ||
        d->tok[h].type != KILN_JSON_STRING || d->tok[s].type != KILN_JSON_NUMBER ||
        !kiln_json_get_int64(d, s, &size) || size < 0) {
        snprintf(err, KILN_JSON_ERR_LEN,
                 "%.200s: files[%d] must be {\"path\": string, \"size\": integer >= 0, "
                 "\"sha256\": hex}",
                 what, i);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    size_t n;
    f->path = kiln_json_string_dup(d, p, &n);
    if (!f->path) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: out of memory", what);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    if (n == 0 || n >= 4096 || strlen(f->path) != n) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: files[%d] has an empty, overlong or NUL path",
                 what, i);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    f->size = (uint64_t)size;
    if (d->tok[h].special || !parse_hex32(d->text + d->tok[h].start, d->tok[h].len, f->sha256)) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: files[%d] ('%.200s'): sha256 is not 64 hex digits",
                 what, i, f->path);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    return KILN_OK;
}

kiln_status kiln_blessing_parse(const char *text, size_t len, const char *what,
                                kiln_blessing *out, char *err)
{
    memset(out, 0, sizeof *out);
    if (len > KILN_BLESSING_MAX_BYTES) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: %zu bytes, more than the limit %u", what, len,
                 KILN_BLESSING_MAX_BYTES);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    kiln_json_doc d;
    char jerr[KILN_JSON_ERR_LEN];
    if (kiln_json_parse(text, len, 16, &d, jerr) != KILN_OK) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: %.300s", what, jerr);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    kiln_status st = KILN_ERR_INVALID_ARGUMENT;
    int fmt = kiln_json_object_get(&d, 0, "format");
    if (fmt < 0 || !kiln_json_string_eq(&d, fmt, KILN_BLESSING_FORMAT)) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: \"format\" is not \"%s\"", what,
                 KILN_BLESSING_FORMAT);
        goto err_free;
    }
    int dg = kiln_json_object_get(&d, 0, "digest");
    if (dg < 0 || d.tok[dg].type != KILN_JSON_STRING || d.tok[dg].special ||
        d.tok[dg].len != 71 || memcmp(d.text + d.tok[dg].start, "sha256:", 7) != 0) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: \"digest\" is not \"sha256:<64 hex>\"", what);
        goto err_free;
    }
    memcpy(out->digest, d.text + d.tok[dg].start, 71);
    out->digest[71] = '\0';
    int at = kiln_json_object_get(&d, 0, "blessed_at");
    if (at >= 0 && d.tok[at].type == KILN_JSON_STRING && !d.tok[at].special &&
        d.tok[at].len < sizeof out->blessed_at) {
        memcpy(out->blessed_at, d.text + d.tok[at].start, d.tok[at].len);
        out->blessed_at[d.tok[at].len] = '\0';
    }
    int fl = kiln_json_object_get(&d, 0, "files");
    if (fl < 0 || d.tok[fl].type != KILN_JSON_ARRAY) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: \"files\" must be an array", what);
        goto err_free;
    }
    uint32_t n = d.tok[fl].size;
    if (n > KILN_MANIFEST_MAX_FILES) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: %u files, at most %d", what, n,
                 KILN_MANIFEST_MAX_FILES);
        goto err_free;
    }
    out->files = calloc(n ? n : 1, sizeof *out->files);
    if (!out->files) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: out of memory", what);
        st = KILN_ERR_OUT_OF_MEMORY;
        goto err_free;
    }
    int t = fl + 1;
    for (uint32_t i = 0; i < n; i++) {
        if (d.tok[t].type != KILN_JSON_OBJECT) {
            snprintf(err, KILN_JSON_ERR_LEN, "%.200s: files[%u] is not an object", what, i);
            goto err_free;
        }
        st = parse_file(&d, t, (int)i, what, &out->files[i], err);
        out->n_files = (int)i + 1;
        if (st != KILN_OK) goto err_free;
        st = KILN_ERR_INVALID_ARGUMENT;
        if (i > 0 && strcmp(out->files[i - 1].path, out->files[i].path) >= 0) {
            snprintf(err, KILN_JSON_ERR_LEN,
                     "%.200s: files are not sorted by path without repeats at '%.200s'", what,
                     out->files[i].path);
            goto err_free;
        }
        t = (int)d.tok[t].next;
    }
    char check[72];
    st = digest_files(out->files, out->n_files, check, err);
    if (st != KILN_OK) goto err_free;
    st = KILN_ERR_INVALID_ARGUMENT;
    if (strcmp(check, out->digest) != 0) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: \"digest\" does not match its \"files\"", what);
        goto err_free;
    }
    kiln_json_doc_free(&d);
    return KILN_OK;
err_free:
    kiln_json_doc_free(&d);
    kiln_blessing_free(out);
    return st;
}

/* The folder's manifest as blessing files (the blessing itself left out). */
static kiln_status folder_files(const char *dir, kiln_blessing *cur, char *err)
{
    memset(cur, 0, sizeof *cur);
    kiln_manifest m;
    char serr[KILN_SEC_ERR_LEN];
    kiln_status st = kiln_manifest_build(dir, &m, serr);
    if (st != KILN_OK) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.500s", serr);
        return st;
    }
    cur->files = calloc(m.n ? (size_t)m.n : 1, sizeof *cur->files);
    if (!cur->files) {
        kiln_manifest_free(&m);
        snprintf(err, KILN_JSON_ERR_LEN, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < m.n; i++) {
        if (strcmp(m.files[i].path, KILN_BLESSING_FILE) == 0) continue;
        kiln_blessing_file *f = &cur->files[cur->n_files++];
        f->path = m.files[i].path; /* moved */
        m.files[i].path = NULL;
        f->size = m.files[i].size;
        memcpy(f->sha256, m.files[i].sha256, 32);
    }
    for (int i = 0; i < m.n; i++) free(m.files[i].path);
    free(m.files);
    return KILN_OK;
}

kiln_status kiln_blessing_digest(const char *dir, char digest[72], kiln_sbuf *files_json,
                                 char *err)
{
    kiln_blessing cur;
    kiln_status st = folder_files(dir, &cur, err);
    if (st != KILN_OK) return st;
    st = digest_files(cur.files, cur.n_files, digest, err);
    if (st == KILN_OK && files_json) {
        kiln_sbuf_puts(files_json, "[");
        for (int i = 0; i < cur.n_files; i++) {
            char hex[65];
            to_hex(cur.files[i].sha256, 32, hex);
            kiln_sbuf_puts(files_json, i ? ",\n    {\"path\": " : "\n    {\"path\": ");
            kiln_sbuf_json_string(files_json, cur.files[i].path, strlen(cur.files[i].path));
            kiln_sbuf_printf(files_json, ", \"size\": %" PRIu64 ", \"sha256\": \"%s\"}",
                             cur.files[i].size, hex);
        }
        kiln_sbuf_puts(files_json, "]");
    }
    kiln_blessing_free(&cur);
    return st;
}

kiln_status kiln_blessing_write(const char *dir, const char *extra, char *digest_out, char *err)
{
    char digest[72];
    kiln_sbuf files = {0}, doc = {0};
    kiln_status st = kiln_blessing_digest(dir, digest, &files, err);
    if (st != KILN_OK) goto out;
    time_t now = time(NULL);
    struct tm tm;
    char at[64];
    gmtime_r(&now, &tm);
    strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%SZ", &tm);
    kiln_sbuf_printf(&doc, "{\n  \"format\": \"%s\",\n  \"digest\": \"%s\",\n  \"blessed_at\": \"%s\",\n",
                     KILN_BLESSING_FORMAT, digest, at);
    if (extra && *extra) kiln_sbuf_printf(&doc, "  %s,\n", extra);
    kiln_sbuf_puts(&doc, "  \"files\": ");
    if (files.p) kiln_sbuf_put(&doc, files.p, files.len);
    kiln_sbuf_puts(&doc, "\n}\n");
    if (doc.oom || files.oom) {
        snprintf(err, KILN_JSON_ERR_LEN, "out of memory");
        st = KILN_ERR_OUT_OF_MEMORY;
        goto out;
    }
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/assets.extra", dir);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        snprintf(err, KILN_JSON_ERR_LEN, "cannot create '%.300s': %s", path, strerror(errno));
        st = KILN_ERR_IO;
        goto out;
    }
    snprintf(path, sizeof path, "%s/%s", dir, KILN_BLESSING_FILE);
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(doc.p, 1, doc.len, f) == doc.len;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, KILN_JSON_ERR_LEN, "cannot write '%.300s': %s", path, strerror(errno));
        unlink(tmp);
        st = KILN_ERR_IO;
        goto out;
    }
    if (digest_out) memcpy(digest_out, digest, 72);
out:
    kiln_sbuf_free(&files);
    kiln_sbuf_free(&doc);
    return st;
}

kiln_status kiln_blessing_check(const char *dir, kiln_blessing *out_or_null, char *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, KILN_BLESSING_FILE);
    uint8_t *data;
    size_t size;
    char rerr[KILN_SEC_ERR_LEN];
    kiln_status st = kiln_sec_read_file(path, KILN_BLESSING_MAX_BYTES, &data, &size, rerr);
    if (st == KILN_ERR_NOT_FOUND) {
        snprintf(err, KILN_JSON_ERR_LEN,
                 "not blessed: the version has no %s (--require_blessing serves only versions "
                 "that passed kiln gate)",
                 KILN_BLESSING_FILE);
        return KILN_ERR_INVALID_MODEL;
    }
    if (st != KILN_OK) {
        snprintf(err, KILN_JSON_ERR_LEN, "not blessed: %.450s", rerr);
        return KILN_ERR_INVALID_MODEL;
    }
    kiln_blessing b;
    char perr[KILN_JSON_ERR_LEN];
    st = kiln_blessing_parse((const char *)data, size, KILN_BLESSING_FILE, &b, perr);
    free(data);
    if (st != KILN_OK) {
        snprintf(err, KILN_JSON_ERR_LEN, "not blessed: %.450s", perr);
        return KILN_ERR_INVALID_MODEL;
    }
    kiln_blessing cur;
    st = folder_files(dir, &cur, perr);
    if (st != KILN_OK) {
        snprintf(err, KILN_JSON_ERR_LEN, "not blessed: %.450s", perr);
        kiln_blessing_free(&b);
        return st;
    }
    /* both lists are sorted by path: one merge walk finds the first difference */
    int i = 0, j = 0;
    const char *why = NULL, *file = NULL;
    while (!why && (i < b.n_files || j < cur.n_files)) {
        int c = i == b.n_files ? 1 : j == cur.n_files ? -1 : strcmp(b.files[i].path, cur.files[j].path);
        if (c < 0) why = "was blessed but is missing now", file = b.files[i].path;
        else if (c > 0) why = "was added after the blessing", file = cur.files[j].path;
        else if (b.files[i].size != cur.files[j].size ||
                 memcmp(b.files[i].sha256, cur.files[j].sha256, 32) != 0)
            why = "changed since the blessing (its SHA-256 differs)", file = b.files[i].path;
        else i++, j++;
    }
    if (why) {
        snprintf(err, KILN_JSON_ERR_LEN, "stale blessing (%s, %s): '%.300s' %s", b.digest,
                 b.blessed_at[0] ? b.blessed_at : "no time", file, why);
        st = KILN_ERR_INVALID_MODEL;
    }
    kiln_blessing_free(&cur);
    if (st == KILN_OK && out_or_null) *out_or_null = b;
    else kiln_blessing_free(&b);
    return st;
}
