/*
 * version_info.c - a version folder's assets.extra/kiln_version.json, the
 * record of where the version came from (release.h, docs/RELEASE_GATE.md):
 *
 *   {"source_commit": "3f2a9c1", "data_version": "2026-11-30",
 *    "training_run": "run-481", "created": "2026-12-01T22:10:00Z",
 *    "labels": {"team": "search", "owner": "ana"}}
 *
 * Every member is optional; values are UTF-8 strings of at most
 * KILN_VERSION_INFO_MAX_STRING bytes, labels at most
 * KILN_VERSION_INFO_MAX_LABELS. An unknown member is an error naming it,
 * so a misspelt key does not vanish silently. The model manager reads the
 * file at load and shows it in the console, the KServe v2 model metadata
 * and the load log line; TF Serving's own status JSON is left as it is.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "security/security.h"
#include "serve/gate/release.h"

void kiln_version_info_free(kiln_version_info *vi)
{
    if (!vi) return;
    free(vi->source_commit);
    free(vi->data_version);
    free(vi->training_run);
    free(vi->created);
    for (int i = 0; i < vi->n_labels; i++) {
        free(vi->label_keys[i]);
        free(vi->label_values[i]);
    }
    free(vi->label_keys);
    free(vi->label_values);
    free(vi);
}

/* True if s[0..n) is well-formed UTF-8 (no overlong forms, surrogates or
 * code points above U+10FFFF). */
static int utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (len == 0 || n - i < len) return 0;
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        i += len;
    }
    return 1;
}

/* String token t as a new NUL-terminated copy, bounded and free of NULs;
 * NULL with err set otherwise. */
static char *get_string(const kiln_json_doc *d, int t, const char *what, const char *field,
                        char *err)
{
    if (d->tok[t].type != KILN_JSON_STRING) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: '%.100s' must be a string", what, field);
        return NULL;
    }
    size_t n;
    char *s = kiln_json_string_dup(d, t, &n);
    if (!s) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: out of memory", what);
        return NULL;
    }
    if (n > KILN_VERSION_INFO_MAX_STRING || strlen(s) != n) {
        snprintf(err, KILN_JSON_ERR_LEN,
                 "%.200s: '%.100s' is %zu bytes%s (at most %d, no NUL characters)", what, field, n,
                 strlen(s) != n ? " with a NUL character" : "", KILN_VERSION_INFO_MAX_STRING);
        free(s);
        return NULL;
    }
    if (!utf8_valid((const unsigned char *)s, n)) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: '%.100s' is not valid UTF-8", what, field);
        free(s);
        return NULL;
    }
    return s;
}

static kiln_status parse_labels(const kiln_json_doc *d, int obj, const char *what,
                                kiln_version_info *vi, char *err)
{
    if (d->tok[obj].type != KILN_JSON_OBJECT) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: 'labels' must be an object of strings", what);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    uint32_t n = d->tok[obj].size;
    if (n > KILN_VERSION_INFO_MAX_LABELS) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: %u labels, at most %d", what, n,
                 KILN_VERSION_INFO_MAX_LABELS);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    vi->label_keys = calloc(n ? n : 1, sizeof *vi->label_keys);
    vi->label_values = calloc(n ? n : 1, sizeof *vi->label_values);
    if (!vi->label_keys || !vi->label_values) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: out of memory", what);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    int k = obj + 1;
    for (uint32_t m = 0; m < n; m++) {
        int v = (int)d->tok[k].next;
        char *key = get_string(d, k, what, "labels", err);
        if (!key) return KILN_ERR_INVALID_ARGUMENT;
        if (!key[0]) {
            free(key);
            snprintf(err, KILN_JSON_ERR_LEN, "%.200s: a label with an empty name", what);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        for (int i = 0; i < vi->n_labels; i++) {
            if (strcmp(vi->label_keys[i], key) == 0) {
                snprintf(err, KILN_JSON_ERR_LEN, "%.200s: label '%.100s' given twice", what, key);
                free(key);
                return KILN_ERR_INVALID_ARGUMENT;
            }
        }
        char *val = get_string(d, v, what, key, err);
        if (!val) {
            free(key);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        vi->label_keys[vi->n_labels] = key;
        vi->label_values[vi->n_labels] = val;
        vi->n_labels++;
        k = (int)d->tok[v].next;
    }
    return KILN_OK;
}

kiln_status kiln_version_info_parse(const char *text, size_t len, const char *what,
                                    kiln_version_info **out, char *err)
{
    *out = NULL;
    if (len > KILN_VERSION_INFO_MAX_BYTES) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: %zu bytes, more than the limit %u", what, len,
                 KILN_VERSION_INFO_MAX_BYTES);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    kiln_json_doc d;
    char jerr[KILN_JSON_ERR_LEN];
    if (kiln_json_parse(text, len, 8, &d, jerr) != KILN_OK) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: %.300s", what, jerr);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    kiln_status st = KILN_ERR_INVALID_ARGUMENT;
    kiln_version_info *vi = calloc(1, sizeof *vi);
    if (!vi) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: out of memory", what);
        st = KILN_ERR_OUT_OF_MEMORY;
        goto err_free_doc;
    }
    if (d.tok[0].type != KILN_JSON_OBJECT) {
        snprintf(err, KILN_JSON_ERR_LEN, "%.200s: the top level must be an object", what);
        goto err_free_vi;
    }
    int k = 1;
    for (uint32_t m = 0; m < d.tok[0].size; m++) {
        int v = (int)d.tok[k].next;
        char **field = NULL;
        const char *name = NULL;
        if (kiln_json_string_eq(&d, k, "source_commit")) field = &vi->source_commit, name = "source_commit";
        else if (kiln_json_string_eq(&d, k, "data_version")) field = &vi->data_version, name = "data_version";
        else if (kiln_json_string_eq(&d, k, "training_run")) field = &vi->training_run, name = "training_run";
        else if (kiln_json_string_eq(&d, k, "created")) field = &vi->created, name = "created";
        if (field) {
            if (*field) {
                snprintf(err, KILN_JSON_ERR_LEN, "%.200s: '%s' given twice", what, name);
                goto err_free_vi;
            }
            *field = get_string(&d, v, what, name, err);
            if (!*field) goto err_free_vi;
        } else if (kiln_json_string_eq(&d, k, "labels")) {
            if (vi->label_keys) {
                snprintf(err, KILN_JSON_ERR_LEN, "%.200s: 'labels' given twice", what);
                goto err_free_vi;
            }
            st = parse_labels(&d, v, what, vi, err);
            if (st != KILN_OK) goto err_free_vi;
            st = KILN_ERR_INVALID_ARGUMENT;
        } else {
            char *key = kiln_json_string_dup(&d, k, NULL);
            snprintf(err, KILN_JSON_ERR_LEN,
                     "%.200s: unknown member '%.100s' (known: source_commit, data_version, "
                     "training_run, created, labels)",
                     what, key ? key : "?");
            free(key);
            goto err_free_vi;
        }
        k = (int)d.tok[v].next;
    }
    kiln_json_doc_free(&d);
    *out = vi;
    return KILN_OK;
err_free_vi:
    kiln_version_info_free(vi);
err_free_doc:
    kiln_json_doc_free(&d);
    return st;
}

kiln_status kiln_version_info_read(const char *dir, kiln_version_info **out, char *err)
{
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, KILN_VERSION_INFO_FILE);
    uint8_t *data;
    size_t size;
    char rerr[KILN_SEC_ERR_LEN];
    kiln_status st = kiln_sec_read_file(path, KILN_VERSION_INFO_MAX_BYTES, &data, &size, rerr);
    if (st == KILN_ERR_NOT_FOUND) return KILN_OK;
    if (st != KILN_OK) {
        snprintf(err, KILN_JSON_ERR_LEN, "%s: %.400s", KILN_VERSION_INFO_FILE, rerr);
        return st;
    }
    st = kiln_version_info_parse((const char *)data, size, KILN_VERSION_INFO_FILE, out, err);
    free(data);
    return st;
}

static const char *const field_names[4] = {"source_commit", "data_version", "training_run",
                                           "created"};

static const char *field_value(const kiln_version_info *vi, int i)
{
    switch (i) {
    case 0: return vi->source_commit;
    case 1: return vi->data_version;
    case 2: return vi->training_run;
    default: return vi->created;
    }
}

void kiln_version_info_write_json(kiln_sbuf *b, const kiln_version_info *vi)
{
    kiln_sbuf_puts(b, "{");
    int first = 1;
    for (int i = 0; i < 4; i++) {
        const char *v = field_value(vi, i);
        if (!v) continue;
        kiln_sbuf_printf(b, "%s\"%s\": ", first ? "" : ", ", field_names[i]);
        kiln_sbuf_json_string(b, v, strlen(v));
        first = 0;
    }
    if (vi->n_labels > 0) {
        kiln_sbuf_puts(b, first ? "\"labels\": {" : ", \"labels\": {");
        for (int i = 0; i < vi->n_labels; i++) {
            kiln_sbuf_puts(b, i ? ", " : "");
            kiln_sbuf_json_string(b, vi->label_keys[i], strlen(vi->label_keys[i]));
            kiln_sbuf_puts(b, ": ");
            kiln_sbuf_json_string(b, vi->label_values[i], strlen(vi->label_values[i]));
        }
        kiln_sbuf_puts(b, "}");
    }
    kiln_sbuf_puts(b, "}");
}

void kiln_version_info_write_params(kiln_sbuf *b, const kiln_version_info *vi, int *wrote)
{
    int first = 1;
    for (int i = 0; i < 4; i++) {
        const char *v = field_value(vi, i);
        if (!v) continue;
        kiln_sbuf_printf(b, "%s\"%s\": ", first ? "" : ", ", field_names[i]);
        kiln_sbuf_json_string(b, v, strlen(v));
        first = 0;
    }
    for (int i = 0; i < vi->n_labels; i++) {
        char key[KILN_VERSION_INFO_MAX_STRING + 8];
        int n = snprintf(key, sizeof key, "label.%s", vi->label_keys[i]);
        kiln_sbuf_puts(b, first ? "" : ", ");
        kiln_sbuf_json_string(b, key, (size_t)n);
        kiln_sbuf_puts(b, ": ");
        kiln_sbuf_json_string(b, vi->label_values[i], strlen(vi->label_values[i]));
        first = 0;
    }
    *wrote = !first;
}
