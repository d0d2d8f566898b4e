/*
 * example.c - JSON examples to serialized tf.Example protos (see example.h).
 *
 * Wire format written (field numbers from tensorflow/core/example/
 * example.proto and feature.proto):
 *   Example  { Features features = 1; }
 *   Features { map<string, Feature> feature = 1; }   entry { key = 1; value = 2; }
 *   Feature  { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; }
 *   *List    { repeated value = 1; }                  floats and int64s packed
 */
#include "serve/example.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KIND_NONE = 0, KIND_BYTES = 1, KIND_FLOAT = 2, KIND_INT64 = 3 };

static void put_varint(kiln_sbuf *b, uint64_t v)
{
    char buf[10];
    int n = 0;
    do {
        buf[n++] = (char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    kiln_sbuf_put(b, buf, (size_t)n);
}

/* Field `field` as length-delimited bytes. */
static void put_bytes(kiln_sbuf *b, int field, const char *p, size_t n)
{
    put_varint(b, (uint64_t)field << 3 | 2);
    put_varint(b, n);
    kiln_sbuf_put(b, p, n);
}

/* The kind of scalar token t, or KIND_NONE if it cannot be a feature value. */
static int scalar_kind(const kiln_json_doc *d, int t)
{
    const kiln_json_token *k = &d->tok[t];
    switch (k->type) {
    case KILN_JSON_TRUE:
    case KILN_JSON_FALSE: return KIND_INT64;
    case KILN_JSON_STRING: return KIND_BYTES;
    case KILN_JSON_OBJECT: return kiln_json_b64_member(d, t) >= 0 ? KIND_BYTES : KIND_NONE;
    case KILN_JSON_NUMBER:
        if (k->special) return KIND_FLOAT;
        for (uint32_t i = 0; i < k->len; i++) {
            char c = d->text[k->start + i];
            if (c == '.' || c == 'e' || c == 'E') return KIND_FLOAT;
        }
        return KIND_INT64;
    default: return KIND_NONE;
    }
}

/* Append value token t of kind to the list being built in b. */
static kiln_status put_value(const kiln_json_doc *d, int t, int kind, kiln_sbuf *b,
                             const char *feature, char *err)
{
    const kiln_json_token *k = &d->tok[t];
    if (kind == KIND_INT64) {
        int64_t v = k->type == KILN_JSON_TRUE;
        if (k->type == KILN_JSON_NUMBER && !kiln_json_get_int64(d, t, &v)) {
            snprintf(err, KILN_JSON_ERR_LEN, "Feature '%.200s': Only int64_t is supported", feature);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        put_varint(b, (uint64_t)v);
        return KILN_OK;
    }
    if (kind == KIND_FLOAT) {
        char num[64];
        size_t n = k->len < sizeof num - 1 ? k->len : sizeof num - 1;
        memcpy(num, d->text + k->start, n);
        num[n] = '\0';
        float f = strcmp(num, "NaN") == 0 ? __builtin_nanf("")
                  : strcmp(num, "Infinity") == 0 ? __builtin_inff()
                  : strcmp(num, "-Infinity") == 0 ? -__builtin_inff()
                                                  : strtof(num, NULL);
        kiln_sbuf_put(b, (const char *)&f, 4); /* little-endian hosts only */
        return KILN_OK;
    }
    int s = k->type == KILN_JSON_OBJECT ? kiln_json_b64_member(d, t) : t;
    size_t len;
    char *str = kiln_json_string_dup(d, s, &len);
    if (!str) return KILN_ERR_OUT_OF_MEMORY;
    if (k->type == KILN_JSON_OBJECT) {
        size_t dl;
        unsigned char *raw = kiln_base64_decode(str, len, &dl);
        free(str);
        if (!raw) {
            snprintf(err, KILN_JSON_ERR_LEN, "Feature '%.200s': Unable to base64 decode", feature);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        put_bytes(b, 1, (const char *)raw, dl);
        free(raw);
        return KILN_OK;
    }
    put_bytes(b, 1, str, len);
    free(str);
    return KILN_OK;
}

/* Encode one Features map entry (key token kt, value token vt) into ex. */
static kiln_status put_feature(const kiln_json_doc *d, int kt, int vt, kiln_sbuf *ex, char *err)
{
    char *key = kiln_json_string_dup(d, kt, NULL);
    if (!key) return KILN_ERR_OUT_OF_MEMORY;
    kiln_status st = KILN_ERR_INVALID_ARGUMENT;
    kiln_sbuf list = {0}, feat = {0}, entry = {0};
    int kind = KIND_NONE;
    const kiln_json_token *v = &d->tok[vt];
    if (v->type == KILN_JSON_ARRAY) {
        int e = vt + 1;
        for (uint32_t i = 0; i < v->size; i++, e = (int)d->tok[e].next) {
            int k = scalar_kind(d, e);
            if (k == KIND_FLOAT && kind == KIND_INT64 && i > 0) {
                snprintf(err, KILN_JSON_ERR_LEN, "Feature '%.200s': mixes integers and floats; "
                         "write every value with a decimal point", key);
                goto err_free;
            }
            if (k == KIND_INT64 && kind == KIND_FLOAT) k = KIND_FLOAT;
            if (k == KIND_NONE || (kind != KIND_NONE && k != kind)) {
                snprintf(err, KILN_JSON_ERR_LEN, "Feature '%.200s': values must all be numbers, "
                         "all booleans or all strings (no null, objects or nested lists)", key);
                goto err_free;
            }
            kind = k;
        }
        /* second pass now that the kind is known */
        e = vt + 1;
        for (uint32_t i = 0; i < v->size; i++, e = (int)d->tok[e].next) {
            st = put_value(d, e, kind, &list, key, err);
            if (st != KILN_OK) goto err_free;
        }
        if (kind == KIND_NONE) kind = KIND_FLOAT; /* [] : an empty float_list */
    } else {
        kind = scalar_kind(d, vt);
        if (kind == KIND_NONE) {
            snprintf(err, KILN_JSON_ERR_LEN, "Feature '%.200s': null or an object is not a "
                     "feature value", key);
            goto err_free;
        }
        st = put_value(d, vt, kind, &list, key, err);
        if (st != KILN_OK) goto err_free;
    }
    kiln_sbuf packed = {0};
    if (kind == KIND_BYTES) {
        put_bytes(&feat, KIND_BYTES, list.p ? list.p : "", list.len);
    } else {
        put_bytes(&packed, 1, list.p ? list.p : "", list.len); /* packed repeated field 1 */
        put_bytes(&feat, kind, packed.p ? packed.p : "", packed.len);
        kiln_sbuf_free(&packed);
    }
    put_bytes(&entry, 1, key, strlen(key));
    put_bytes(&entry, 2, feat.p ? feat.p : "", feat.len);
    put_bytes(ex, 1, entry.p, entry.len);
    st = ex->oom || entry.oom || feat.oom || list.oom ? KILN_ERR_OUT_OF_MEMORY : KILN_OK;
err_free:
    kiln_sbuf_free(&list);
    kiln_sbuf_free(&feat);
    kiln_sbuf_free(&entry);
    free(key);
    return st;
}

/* Append every member of object token obj as a feature; skip keys also in `except`. */
static kiln_status put_object(const kiln_json_doc *d, int obj, int except, kiln_sbuf *ex,
                              char *err)
{
    int kt = obj + 1;
    for (uint32_t i = 0; i < d->tok[obj].size; i++) {
        int vt = (int)d->tok[kt].next;
        if (except >= 0) {
            char *key = kiln_json_string_dup(d, kt, NULL);
            if (!key) return KILN_ERR_OUT_OF_MEMORY;
            int dup = kiln_json_object_get(d, except, key) >= 0;
            if (dup) {
                snprintf(err, KILN_JSON_ERR_LEN,
                         "Feature '%.200s' is in both the context and an example", key);
                free(key);
                return KILN_ERR_INVALID_ARGUMENT;
            }
            free(key);
        }
        kiln_status st = put_feature(d, kt, vt, ex, err);
        if (st != KILN_OK) return st;
        kt = (int)d->tok[vt].next;
    }
    return KILN_OK;
}

kiln_status kiln_examples_encode(const kiln_json_doc *d, int root, kiln_tensor **out, char *err)
{
    *out = NULL;
    if (d->tok[root].type != KILN_JSON_OBJECT) {
        snprintf(err, KILN_JSON_ERR_LEN, "Is not object");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    int exs = kiln_json_object_get(d, root, "examples");
    int ctx = kiln_json_object_get(d, root, "context");
    if (exs < 0) {
        snprintf(err, KILN_JSON_ERR_LEN, "Missing 'examples' key");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (d->tok[exs].type != KILN_JSON_ARRAY) {
        snprintf(err, KILN_JSON_ERR_LEN, "Expecting 'examples' to be an list/array");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (d->tok[exs].size == 0) {
        snprintf(err, KILN_JSON_ERR_LEN, "No values in 'examples' array");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (ctx >= 0 && d->tok[ctx].type != KILN_JSON_OBJECT) {
        snprintf(err, KILN_JSON_ERR_LEN, "'context' must be an object of features");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    int64_t n = d->tok[exs].size;
    kiln_tensor *t;
    kiln_status st = kiln_tensor_create(KILN_DTYPE_STRING, 1, &n, &t);
    if (st != KILN_OK) return st;
    int e = exs + 1;
    for (int64_t i = 0; i < n; i++, e = (int)d->tok[e].next) {
        if (d->tok[e].type != KILN_JSON_OBJECT) {
            snprintf(err, KILN_JSON_ERR_LEN, "Example %lld is not an object of features",
                     (long long)i);
            st = KILN_ERR_INVALID_ARGUMENT;
            goto err_free;
        }
        kiln_sbuf features = {0}, example = {0};
        st = put_object(d, e, -1, &features, err);
        if (st == KILN_OK && ctx >= 0) st = put_object(d, ctx, e, &features, err);
        if (st == KILN_OK) {
            put_bytes(&example, 1, features.p ? features.p : "", features.len);
            st = example.oom ? KILN_ERR_OUT_OF_MEMORY
                             : kiln_tensor_set_string(t, (size_t)i, example.p ? example.p : "",
                                                      example.len);
        }
        kiln_sbuf_free(&features);
        kiln_sbuf_free(&example);
        if (st != KILN_OK) goto err_free;
    }
    *out = t;
    return KILN_OK;
err_free:
    if (st == KILN_ERR_OUT_OF_MEMORY) snprintf(err, KILN_JSON_ERR_LEN, "out of memory");
    kiln_tensor_free(t);
    return st;
}
