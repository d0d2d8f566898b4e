/*
 * json.h - the server's JSON: a bounded tokenizer for request bodies, a
 * growable output buffer, and the tensor-level pieces the REST codecs share
 * (scalar conversion checked against a signature dtype, nested-array shape
 * discovery with ragged detection, and tensor writers).
 *
 * Request bodies are untrusted. kiln_json_parse makes one pass over the
 * bytes and records a flat array of tokens (jsmn style: each token knows the
 * index just past its subtree, so skipping a value is O(1)); it never
 * recurses deeper than KILN_JSON_MAX_DEPTH, never allocates more than one
 * token per input byte, and accepts TF Serving's extensions NaN, Infinity
 * and -Infinity. Numbers and strings are converted only when a tensor is
 * filled, straight into the tensor's buffer.
 *
 * Errors: functions returning kiln_status write a one-line message into the
 * caller's buffer `err` (KILN_JSON_ERR_LEN bytes).
 */
#ifndef KILN_SERVE_JSON_H
#define KILN_SERVE_JSON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#define KILN_JSON_MAX_DEPTH 64          /* nesting of arrays and objects */
#define KILN_JSON_MAX_BYTES (64u << 20) /* request body limit (after gzip) */
#define KILN_JSON_ERR_LEN 512

typedef enum kiln_json_type {
    KILN_JSON_NULL = 0,
    KILN_JSON_FALSE,
    KILN_JSON_TRUE,
    KILN_JSON_NUMBER,
    KILN_JSON_STRING,
    KILN_JSON_ARRAY,
    KILN_JSON_OBJECT,
} kiln_json_type;

typedef struct kiln_json_token {
    uint8_t type;    /* kiln_json_type */
    uint8_t special; /* number: 1 = NaN/Infinity/-Infinity token; string: 1 = has escapes */
    uint32_t start;  /* offset of the value (string: first byte after the quote) */
    uint32_t len;    /* raw bytes (string: between the quotes, escapes undecoded) */
    uint32_t size;   /* array: elements; object: members (key and value tokens follow) */
    uint32_t next;   /* index of the first token after this value's subtree */
} kiln_json_token;

typedef struct kiln_json_doc {
    const char *text;     /* borrowed: the parsed bytes, alive as long as the doc */
    size_t len;
    kiln_json_token *tok; /* tok[0] is the top-level value; owned */
    uint32_t n, cap;
} kiln_json_doc;

/* The JSON number literal s[0..n) (already validated by the tokenizer) as the
 * correctly rounded double, as strtod gives it; a fast exact path covers the
 * literals clients send (up to 19 significant digits, exponent within +-27).
 * Returns 0 only when out of memory. */
int kiln_json_decimal_to_double(const char *s, size_t n, double *out);

/* Parse text[0..len). On success *doc owns its tokens (kiln_json_doc_free);
 * on failure nothing is left to free and err says "JSON Parse error: ...". */
kiln_status kiln_json_parse(const char *text, size_t len, int max_depth, kiln_json_doc *doc,
                            char *err);
void kiln_json_doc_free(kiln_json_doc *doc);

/* Value token of member `key` of object token obj, or -1 (first match wins). */
int kiln_json_object_get(const kiln_json_doc *d, int obj, const char *key);
/* True if string token t equals the NUL-terminated key (escapes decoded). */
int kiln_json_string_eq(const kiln_json_doc *d, int t, const char *key);
/* Decode string token t into a new malloc'd buffer (NUL-terminated; *len_out
 * excludes the NUL). NULL when out of memory. */
char *kiln_json_string_dup(const kiln_json_doc *d, int t, size_t *len_out);
/* Number token t as an int64 (no fraction or exponent); 0 if it is not one. */
int kiln_json_get_int64(const kiln_json_doc *d, int t, int64_t *out);
/* If t is an object {"b64": "..."}: the string token index, else -1. */
int kiln_json_b64_member(const kiln_json_doc *d, int t);

/* Decode standard base64 (padding optional, whitespace not allowed).
 * Returns a malloc'd buffer or NULL when the text is not base64. */
unsigned char *kiln_base64_decode(const char *s, size_t n, size_t *len_out);

/* A growable output buffer. Appends never fail visibly: after an allocation
 * failure `oom` is set and further appends are ignored. */
typedef struct kiln_sbuf {
    char *p;
    size_t len, cap;
    int oom;
} kiln_sbuf;
void kiln_sbuf_put(kiln_sbuf *b, const char *s, size_t n);
void kiln_sbuf_puts(kiln_sbuf *b, const char *s);
void kiln_sbuf_printf(kiln_sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* s as a quoted JSON string (invalid UTF-8 replaced by U+FFFD). */
void kiln_sbuf_json_string(kiln_sbuf *b, const char *s, size_t n);
void kiln_sbuf_base64(kiln_sbuf *b, const unsigned char *s, size_t n);
void kiln_sbuf_free(kiln_sbuf *b);

/* TF Serving's name for a dtype in messages ("float", "int64", "string"). */
const char *kiln_json_tf_type_name(kiln_dtype dt);

/*
 * Filling tensors from JSON. A "source" is a list of value tokens that are
 * stacked along a new leading dimension (row format: one token per
 * instance), or a single token that is the whole tensor (columnar). `input`
 * names the input in messages.
 *
 *   stacked = 1: shape = [nroots] + shape of roots[0]; every root must have it
 *   stacked = 0: nroots must be 1; shape = shape of roots[0]
 *
 * Ragged nesting, leaves that do not convert to dt, and ranks above
 * KILN_MAX_RANK are errors. On success *out is a new tensor owned by the
 * caller.
 */
kiln_status kiln_json_fill_tensor(const kiln_json_doc *d, const int *roots, int nroots, int stacked,
                                  kiln_dtype dt, const char *input, kiln_tensor **out, char *err);

/* Fill a tensor of the given shape from any nesting of arrays whose leaves,
 * in order, number exactly the shape's element count (KServe v2 "data"). */
kiln_status kiln_json_fill_flat(const kiln_json_doc *d, int root, kiln_dtype dt, int rank,
                                const int64_t *dims, const char *input, kiln_tensor **out,
                                char *err);

/* Write tensor t (or, with row >= 0, its sub-tensor t[row]) as nested JSON
 * arrays; strings as {"b64": ...} when b64 is set. flat = 1 writes one flat
 * array of all elements (KServe v2). Floats round-trip (%.9g for float32,
 * %.17g for float64); NaN and infinities as NaN, Infinity, -Infinity. */
void kiln_json_write_tensor(kiln_sbuf *b, const kiln_tensor *t, int64_t row, int b64, int flat);

#endif
