/*
 * json.c - the bounded JSON tokenizer, output buffer and tensor codec
 * pieces declared in json.h. See json.h for the contract; the request-level
 * formats (TF Serving predict, KServe v2 infer) live in codec.c.
 */
#include "serve/json.h"

#include "kiln/kiln_util.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ tokenizer */

typedef struct json_parser {
    const char *s;
    size_t n, i;
    int max_depth;
    kiln_json_doc *doc;
    char *err;
} json_parser;

static int parse_fail(json_parser *p, const char *what)
{
    snprintf(p->err, KILN_JSON_ERR_LEN, "JSON Parse error: %s at offset: %zu", what, p->i);
    return -1;
}

static void skip_ws(json_parser *p)
{
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->i++;
    }
}

/* Append a token; returns its index or -1 (out of memory). */
static int push_token(json_parser *p, kiln_json_type type)
{
    kiln_json_doc *d = p->doc;
    if (d->n == d->cap) {
        uint32_t cap = d->cap ? d->cap * 2 : 64;
        kiln_json_token *t = realloc(d->tok, (size_t)cap * sizeof *t);
        if (!t) return -1;
        d->tok = t;
        d->cap = cap;
    }
    kiln_json_token *t = &d->tok[d->n];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->start = (uint32_t)p->i;
    return (int)d->n++;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int match_word(json_parser *p, const char *w)
{
    size_t k = strlen(w);
    if (p->n - p->i < k || memcmp(p->s + p->i, w, k) != 0) return 0;
    p->i += k;
    return 1;
}

static int parse_string(json_parser *p, int t)
{
    p->i++; /* opening quote */
    p->doc->tok[t].start = (uint32_t)p->i;
    while (p->i < p->n) {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') {
            p->doc->tok[t].len = (uint32_t)(p->i - p->doc->tok[t].start);
            p->i++;
            return 0;
        }
        if (c < 0x20) return parse_fail(p, "Invalid encoding in string");
        if (c == '\\') {
            p->doc->tok[t].special = 1;
            if (++p->i >= p->n) break;
            char e = p->s[p->i];
            if (e == 'u') {
                if (p->n - p->i < 5) break;
                for (int k = 1; k <= 4; k++)
                    if (hexval(p->s[p->i + k]) < 0)
                        return parse_fail(p, "Incorrect hex digit after \\u escape in string");
                p->i += 4;
            } else if (!strchr("\"\\/bfnrt", e) || e == '\0') {
                return parse_fail(p, "Invalid escape character in string");
            }
        }
        p->i++;
    }
    return parse_fail(p, "Missing a closing quotation mark in string");
}

static int parse_number(json_parser *p, int t)
{
    size_t st = p->i;
    if (p->s[p->i] == '-') {
        p->i++;
        if (match_word(p, "Infinity")) {
            p->doc->tok[t].special = 1;
            p->doc->tok[t].len = (uint32_t)(p->i - st);
            return 0;
        }
    }
    if (p->i >= p->n || !is_digit(p->s[p->i])) return parse_fail(p, "Invalid value");
    if (p->s[p->i] == '0') p->i++;
    else
        while (p->i < p->n && is_digit(p->s[p->i])) p->i++;
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (p->i >= p->n || !is_digit(p->s[p->i]))
            return parse_fail(p, "Missing fraction part in number");
        while (p->i < p->n && is_digit(p->s[p->i])) p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (p->i >= p->n || !is_digit(p->s[p->i]))
            return parse_fail(p, "Missing exponent in number");
        while (p->i < p->n && is_digit(p->s[p->i])) p->i++;
    }
    p->doc->tok[t].len = (uint32_t)(p->i - st);
    return 0;
}

/* Parse one value at p->i (whitespace skipped); depth = enclosing containers. */
static int parse_value(json_parser *p, int depth)
{
    skip_ws(p);
    if (p->i >= p->n) return parse_fail(p, "The document is empty or ends early");
    char c = p->s[p->i];
    int t;
    if (c == '{' || c == '[') {
        if (depth >= p->max_depth) {
            snprintf(p->err, KILN_JSON_ERR_LEN,
                     "JSON Parse error: nesting deeper than %d levels at offset: %zu",
                     p->max_depth, p->i);
            return -1;
        }
        int obj = c == '{';
        t = push_token(p, obj ? KILN_JSON_OBJECT : KILN_JSON_ARRAY);
        if (t < 0) return parse_fail(p, "out of memory");
        p->i++;
        skip_ws(p);
        char close = obj ? '}' : ']';
        uint32_t count = 0;
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
        } else {
            for (;;) {
                if (obj) {
                    skip_ws(p);
                    if (p->i >= p->n || p->s[p->i] != '"')
                        return parse_fail(p, "Missing a name for object member");
                    int k = push_token(p, KILN_JSON_STRING);
                    if (k < 0) return parse_fail(p, "out of memory");
                    if (parse_string(p, k) < 0) return -1;
                    p->doc->tok[k].next = p->doc->n;
                    skip_ws(p);
                    if (p->i >= p->n || p->s[p->i] != ':')
                        return parse_fail(p, "Missing a colon after a name of object member");
                    p->i++;
                }
                if (parse_value(p, depth + 1) < 0) return -1;
                count++;
                skip_ws(p);
                if (p->i < p->n && p->s[p->i] == ',') {
                    p->i++;
                    continue;
                }
                if (p->i < p->n && p->s[p->i] == close) {
                    p->i++;
                    break;
                }
                return parse_fail(p, obj ? "Missing a comma or '}' after an object member"
                                         : "Missing a comma or ']' after an array element");
            }
        }
        p->doc->tok[t].size = count;
        p->doc->tok[t].len = (uint32_t)(p->i - p->doc->tok[t].start);
    } else if (c == '"') {
        t = push_token(p, KILN_JSON_STRING);
        if (t < 0) return parse_fail(p, "out of memory");
        if (parse_string(p, t) < 0) return -1;
    } else if (c == '-' || is_digit(c)) {
        t = push_token(p, KILN_JSON_NUMBER);
        if (t < 0) return parse_fail(p, "out of memory");
        if (parse_number(p, t) < 0) return -1;
    } else {
        kiln_json_type ty;
        int special = 0;
        size_t st = p->i;
        if (match_word(p, "true")) ty = KILN_JSON_TRUE;
        else if (match_word(p, "false")) ty = KILN_JSON_FALSE;
        else if (match_word(p, "null")) ty = KILN_JSON_NULL;
        else if (match_word(p, "NaN") || match_word(p, "Infinity")) ty = KILN_JSON_NUMBER, special = 1;
        else return parse_fail(p, "Invalid value");
        size_t end = p->i;
        p->i = st;
        t = push_token(p, ty);
        if (t < 0) return parse_fail(p, "out of memory");
        p->i = end;
        p->doc->tok[t].special = (uint8_t)special;
        p->doc->tok[t].len = (uint32_t)(end - st);
    }
    p->doc->tok[t].next = p->doc->n;
    return 0;
}

kiln_status kiln_json_parse(const char *text, size_t len, int max_depth, kiln_json_doc *doc,
                            char *err)
{
    memset(doc, 0, sizeof *doc);
    if (len > KILN_JSON_MAX_BYTES) {
        snprintf(err, KILN_JSON_ERR_LEN, "JSON Parse error: document of %zu bytes exceeds %u",
                 len, KILN_JSON_MAX_BYTES);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    json_parser p = {text, len, 0, max_depth > 0 ? max_depth : KILN_JSON_MAX_DEPTH, doc, err};
    doc->text = text;
    doc->len = len;
    if (parse_value(&p, 0) == 0) {
        skip_ws(&p);
        if (p.i == p.n) return KILN_OK;
        parse_fail(&p, "The document root must not be followed by other values");
    }
    kiln_json_doc_free(doc);
    return KILN_ERR_INVALID_ARGUMENT;
}

void kiln_json_doc_free(kiln_json_doc *doc)
{
    free(doc->tok);
    memset(doc, 0, sizeof *doc);
}

/* ------------------------------------------------------------- accessors */

/* Decode the escapes of string token t into dst (at least len bytes); returns
 * the decoded length. The tokenizer already validated the escapes. */
static size_t unescape(const kiln_json_doc *d, int t, char *dst)
{
    const char *s = d->text + d->tok[t].start;
    size_t n = d->tok[t].len, o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\') {
            dst[o++] = s[i];
            continue;
        }
        char e = s[++i];
        switch (e) {
        case 'b': dst[o++] = '\b'; break;
        case 'f': dst[o++] = '\f'; break;
        case 'n': dst[o++] = '\n'; break;
        case 'r': dst[o++] = '\r'; break;
        case 't': dst[o++] = '\t'; break;
        case 'u': {
            uint32_t cp = 0;
            for (int k = 1; k <= 4; k++) cp = cp * 16 + (uint32_t)hexval(s[i + k]);
            i += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && i + 6 < n && s[i + 1] == '\\' &&
                s[i + 2] == 'u') {
                uint32_t lo = 0;
                int ok = 1;
                for (int k = 3; k <= 6; k++) {
                    int h = hexval(s[i + k]);
                    if (h < 0) ok = 0;
                    else lo = lo * 16 + (uint32_t)h;
                }
                if (ok && lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                }
            }
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* lone surrogate */
            if (cp < 0x80) dst[o++] = (char)cp;
            else if (cp < 0x800) {
                dst[o++] = (char)(0xC0 | (cp >> 6));
                dst[o++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                dst[o++] = (char)(0xE0 | (cp >> 12));
                dst[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                dst[o++] = (char)(0x80 | (cp & 0x3F));
            } else {
                dst[o++] = (char)(0xF0 | (cp >> 18));
                dst[o++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                dst[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                dst[o++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: dst[o++] = e; break; /* \" \\ \/ */
        }
    }
    return o;
}

char *kiln_json_string_dup(const kiln_json_doc *d, int t, size_t *len_out)
{
    /* \uXXXX (6 bytes) decodes to at most 3 bytes, a surrogate pair (12) to
     * 4, so the decoded text is never longer than the raw text. */
    char *buf = malloc((size_t)d->tok[t].len + 1);
    if (!buf) return NULL;
    size_t n;
    if (d->tok[t].special) n = unescape(d, t, buf);
    else {
        n = d->tok[t].len;
        memcpy(buf, d->text + d->tok[t].start, n);
    }
    buf[n] = '\0';
    if (len_out) *len_out = n;
    return buf;
}

int kiln_json_string_eq(const kiln_json_doc *d, int t, const char *key)
{
    if (d->tok[t].type != KILN_JSON_STRING) return 0;
    size_t kl = strlen(key);
    if (!d->tok[t].special)
        return d->tok[t].len == kl && memcmp(d->text + d->tok[t].start, key, kl) == 0;
    size_t n;
    char *s = kiln_json_string_dup(d, t, &n);
    int eq = s && n == kl && memcmp(s, key, kl) == 0;
    free(s);
    return eq;
}

int kiln_json_object_get(const kiln_json_doc *d, int obj, const char *key)
{
    if (obj < 0 || d->tok[obj].type != KILN_JSON_OBJECT) return -1;
    int k = obj + 1;
    for (uint32_t m = 0; m < d->tok[obj].size; m++) {
        int v = (int)d->tok[k].next;
        if (kiln_json_string_eq(d, k, key)) return v;
        k = (int)d->tok[v].next;
    }
    return -1;
}

int kiln_json_b64_member(const kiln_json_doc *d, int t)
{
    if (d->tok[t].type != KILN_JSON_OBJECT || d->tok[t].size != 1) return -1;
    if (!kiln_json_string_eq(d, t + 1, "b64")) return -1;
    int v = t + 2;
    return d->tok[v].type == KILN_JSON_STRING ? v : -1;
}

/* --------------------------------------------------------------- base64 */

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

unsigned char *kiln_base64_decode(const char *s, size_t n, size_t *len_out)
{
    while (n > 0 && s[n - 1] == '=') n--;
    if (n % 4 == 1) return NULL;
    unsigned char *out = malloc(n / 4 * 3 + 3);
    if (!out) return NULL;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64_value((unsigned char)s[i]);
        if (v < 0) {
            free(out);
            return NULL;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
        }
    }
    *len_out = o;
    return out;
}

/* ---------------------------------------------------------- output buffer */

void kiln_sbuf_put(kiln_sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void kiln_sbuf_puts(kiln_sbuf *b, const char *s) { kiln_sbuf_put(b, s, strlen(s)); }

void kiln_sbuf_printf(kiln_sbuf *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        kiln_sbuf_put(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    kiln_sbuf_put(b, big, (size_t)n);
    free(big);
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t k;
    uint32_t min;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) k = 2, min = 0x80;
    else if ((c & 0xF0) == 0xE0) k = 3, min = 0x800;
    else if ((c & 0xF8) == 0xF0) k = 4, min = 0x10000;
    else return 0;
    if (n < k) return 0;
    uint32_t cp = c & (0x7F >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return k;
}

void kiln_sbuf_json_string(kiln_sbuf *b, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    kiln_sbuf_put(b, "\"", 1);
    size_t i = 0;
    while (i < n) {
        unsigned char c = u[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            kiln_sbuf_put(b, e, 2);
            i++;
        } else if (c < 0x20 || c == 0x7F) {
            kiln_sbuf_printf(b, "\\u%04x", c);
            i++;
        } else {
            size_t k = utf8_seq(u + i, n - i);
            if (k == 0) {
                kiln_sbuf_puts(b, "\\ufffd");
                i++;
            } else {
                kiln_sbuf_put(b, s + i, k);
                i += k;
            }
        }
    }
    kiln_sbuf_put(b, "\"", 1);
}

void kiln_sbuf_base64(kiln_sbuf *b, const unsigned char *s, size_t n)
{
    char q[4];
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16;
        if (i + 1 < n) v |= (uint32_t)s[i + 1] << 8;
        if (i + 2 < n) v |= s[i + 2];
        q[0] = b64_alphabet[(v >> 18) & 63];
        q[1] = b64_alphabet[(v >> 12) & 63];
        q[2] = i + 1 < n ? b64_alphabet[(v >> 6) & 63] : '=';
        q[3] = i + 2 < n ? b64_alphabet[v & 63] : '=';
        kiln_sbuf_put(b, q, 4);
    }
}

void kiln_sbuf_free(kiln_sbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ------------------------------------------------------ scalar conversion */

const char *kiln_json_tf_type_name(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_F32: return "float";
    case KILN_DTYPE_F64: return "double";
    case KILN_DTYPE_F16: return "half";
    case KILN_DTYPE_BF16: return "bfloat16";
    case KILN_DTYPE_I8: return "int8";
    case KILN_DTYPE_U8: return "uint8";
    case KILN_DTYPE_I16: return "int16";
    case KILN_DTYPE_U16: return "uint16";
    case KILN_DTYPE_I32: return "int32";
    case KILN_DTYPE_U32: return "uint32";
    case KILN_DTYPE_I64: return "int64";
    case KILN_DTYPE_U64: return "uint64";
    case KILN_DTYPE_BOOL: return "bool";
    case KILN_DTYPE_STRING: return "string";
    default: return kiln_dtype_name(dt);
    }
}

static const char *json_type_name(const kiln_json_token *t)
{
    switch ((kiln_json_type)t->type) {
    case KILN_JSON_NULL: return "Null";
    case KILN_JSON_FALSE: return "False";
    case KILN_JSON_TRUE: return "True";
    case KILN_JSON_NUMBER: return "Number";
    case KILN_JSON_STRING: return "String";
    case KILN_JSON_ARRAY: return "Array";
    case KILN_JSON_OBJECT: return "Object";
    }
    return "?";
}

/* TF Serving's conversion error, naming the input. */
static kiln_status leaf_error(const kiln_json_doc *d, int t, kiln_dtype dt, const char *input,
                              char *err)
{
    const kiln_json_token *k = &d->tok[t];
    size_t start = k->start, len = k->len;
    if (k->type == KILN_JSON_STRING) start--, len += 2; /* show the quotes */
    char shown[68];
    size_t m = len < 64 ? len : 64, o = 0;
    for (size_t i = 0; i < m; i++) {
        unsigned char c = (unsigned char)d->text[start + i];
        shown[o++] = (c >= 0x20 && c < 0x7F) ? (char)c : '?';
    }
    if (len > 64) shown[o++] = '.', shown[o++] = '.', shown[o++] = '.';
    shown[o] = '\0';
    snprintf(err, KILN_JSON_ERR_LEN,
             "JSON Value: %s Type: %s is not of expected type: %s (input '%s')", shown,
             json_type_name(k), kiln_json_tf_type_name(dt), input);
    return KILN_ERR_INVALID_ARGUMENT;
}

/* The fast path of kiln_json_decimal_to_double: a literal with at most 19
 * significant digits and a decimal exponent within +-27 is m * 10^e with m and
 * 10^e both exact in x87 extended precision (64-bit significand; 5^27 < 2^63),
 * so one extended multiply or divide rounds the exact value once. Rounding that
 * again to double is correct unless the extended result lies within one of its
 * own ulps of a double rounding midpoint (low 11 of its 64 significand bits
 * near 0x400); those rare literals, and everything else, take strtod. Returns 0
 * when the fast path does not apply. */
static int decimal_fast(const char *s, size_t n, double *out)
{
#if defined(__x86_64__) && LDBL_MANT_DIG == 64
    static const long double pow10[28] = {
        1e0L,  1e1L,  1e2L,  1e3L,  1e4L,  1e5L,  1e6L,  1e7L,  1e8L,  1e9L,
        1e10L, 1e11L, 1e12L, 1e13L, 1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L,
        1e20L, 1e21L, 1e22L, 1e23L, 1e24L, 1e25L, 1e26L, 1e27L};
    size_t i = 0;
    int neg = 0;
    if (i < n && s[i] == '-') {
        neg = 1;
        i++;
    }
    uint64_t m = 0;
    int digits = 0, exp10 = 0;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        if (m == 0 && s[i] == '0') continue; /* leading zeros are not significant */
        if (++digits > 19) return 0;
        m = m * 10 + (uint64_t)(s[i] - '0');
    }
    if (i < n && s[i] == '.') {
        for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
            if (m == 0 && s[i] == '0') {
                exp10--;
                continue;
            }
            if (++digits > 19) return 0;
            m = m * 10 + (uint64_t)(s[i] - '0');
            exp10--;
        }
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        int eneg = 0, e = 0;
        if (i < n && (s[i] == '+' || s[i] == '-')) eneg = s[i++] == '-';
        for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
            if (e > 10000) return 0;
            e = e * 10 + (s[i] - '0');
        }
        exp10 += eneg ? -e : e;
    }
    if (i != n) return 0;
    if (m == 0) {
        *out = neg ? -0.0 : 0.0;
        return 1;
    }
    if (exp10 < -27 || exp10 > 27) return 0;
    long double v = (long double)m; /* exact: m < 10^19 < 2^64 */
    v = exp10 < 0 ? v / pow10[-exp10] : v * pow10[exp10];
    uint64_t sig;
    memcpy(&sig, &v, sizeof sig); /* x87 layout: the 64-bit significand comes first */
    uint64_t low = sig & 0x7FF;
    if (low >= 0x3FF && low <= 0x401) return 0; /* maybe a double-rounding midpoint */
    double d = (double)v;
    *out = neg ? -d : d;
    return 1;
#else
    (void)s;
    (void)n;
    (void)out;
    return 0;
#endif
}

int kiln_json_decimal_to_double(const char *s, size_t n, double *out)
{
    if (decimal_fast(s, n, out)) return 1;
    char buf[128];
    if (n >= sizeof buf) {
        /* very long literals: strtod needs a NUL-terminated copy */
        char *big = malloc(n + 1);
        if (!big) return 0;
        memcpy(big, s, n);
        big[n] = '\0';
        *out = strtod(big, NULL);
        free(big);
        return 1;
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    *out = strtod(buf, NULL);
    return 1;
}

/* The number token t as a double (NaN and infinities included). */
static int number_to_double(const kiln_json_doc *d, int t, double *out)
{
    const kiln_json_token *k = &d->tok[t];
    const char *s = d->text + k->start;
    if (k->special) {
        if (s[0] == 'N') *out = NAN;
        else *out = s[0] == '-' ? -INFINITY : INFINITY;
        return 1;
    }
    return kiln_json_decimal_to_double(s, k->len, out);
}

/* The number token t as an integer in [lo, hi] (no fraction or exponent). */
static int number_to_int(const kiln_json_doc *d, int t, int is_unsigned, int64_t lo, uint64_t hi,
                         int64_t *si, uint64_t *ui)
{
    const kiln_json_token *k = &d->tok[t];
    if (k->special || k->len >= 32) return 0;
    char buf[32];
    memcpy(buf, d->text + k->start, k->len);
    buf[k->len] = '\0';
    if (strpbrk(buf, ".eE")) return 0;
    errno = 0;
    if (is_unsigned) {
        if (buf[0] == '-') return 0;
        unsigned long long v = strtoull(buf, NULL, 10);
        if (errno || v > hi) return 0;
        *ui = v;
    } else {
        long long v = strtoll(buf, NULL, 10);
        if (errno || v < lo || (v > 0 && (uint64_t)v > hi)) return 0;
        *si = v;
    }
    return 1;
}

int kiln_json_get_int64(const kiln_json_doc *d, int t, int64_t *out)
{
    uint64_t u;
    if (d->tok[t].type != KILN_JSON_NUMBER) return 0;
    return number_to_int(d, t, 0, INT64_MIN, INT64_MAX, out, &u);
}

/* Convert leaf token t to dt and store it as element i of x. */
static kiln_status store_leaf(const kiln_json_doc *d, int t, kiln_tensor *x, size_t i,
                              const char *input, char *err)
{
    const kiln_json_token *k = &d->tok[t];
    kiln_dtype dt = x->dtype;
    if (dt == KILN_DTYPE_STRING) {
        int s = t;
        int b64 = 0;
        if (k->type != KILN_JSON_STRING) {
            s = kiln_json_b64_member(d, t);
            if (s < 0) return leaf_error(d, t, dt, input, err);
            b64 = 1;
        }
        size_t n;
        char *raw = kiln_json_string_dup(d, s, &n);
        if (!raw) goto oom;
        kiln_status st;
        if (b64) {
            size_t bn;
            unsigned char *bytes = kiln_base64_decode(raw, n, &bn);
            free(raw);
            if (!bytes) {
                snprintf(err, KILN_JSON_ERR_LEN, "Unable to base64 decode (input '%s')", input);
                return KILN_ERR_INVALID_ARGUMENT;
            }
            st = kiln_tensor_set_string(x, i, (const char *)bytes, bn);
            free(bytes);
        } else {
            st = kiln_tensor_set_string(x, i, raw, n);
            free(raw);
        }
        if (st != KILN_OK) goto oom;
        return KILN_OK;
    }
    if (dt == KILN_DTYPE_BOOL) {
        if (k->type != KILN_JSON_TRUE && k->type != KILN_JSON_FALSE)
            return leaf_error(d, t, dt, input, err);
        ((uint8_t *)x->data)[i] = k->type == KILN_JSON_TRUE;
        return KILN_OK;
    }
    if (k->type != KILN_JSON_NUMBER) return leaf_error(d, t, dt, input, err);
    double v;
    int64_t si = 0;
    uint64_t ui = 0;
    switch (dt) {
    case KILN_DTYPE_F32:
        if (!number_to_double(d, t, &v)) goto oom;
        ((float *)x->data)[i] = (float)v;
        return KILN_OK;
    case KILN_DTYPE_F64:
        if (!number_to_double(d, t, &v)) goto oom;
        ((double *)x->data)[i] = v;
        return KILN_OK;
    case KILN_DTYPE_F16:
        if (!number_to_double(d, t, &v)) goto oom;
        ((uint16_t *)x->data)[i] = kiln_f32_to_f16((float)v);
        return KILN_OK;
    case KILN_DTYPE_BF16:
        if (!number_to_double(d, t, &v)) goto oom;
        ((uint16_t *)x->data)[i] = kiln_f32_to_bf16((float)v);
        return KILN_OK;
#define INT_CASE(DT, CT, U, LO, HI, VAR)                                      \
    case DT:                                                                  \
        if (!number_to_int(d, t, U, LO, HI, &si, &ui))                        \
            return leaf_error(d, t, dt, input, err);                          \
        ((CT *)x->data)[i] = (CT)VAR;                                         \
        return KILN_OK;
        INT_CASE(KILN_DTYPE_I8, int8_t, 0, INT8_MIN, INT8_MAX, si)
        INT_CASE(KILN_DTYPE_U8, uint8_t, 1, 0, UINT8_MAX, ui)
        INT_CASE(KILN_DTYPE_I16, int16_t, 0, INT16_MIN, INT16_MAX, si)
        INT_CASE(KILN_DTYPE_U16, uint16_t, 1, 0, UINT16_MAX, ui)
        INT_CASE(KILN_DTYPE_I32, int32_t, 0, INT32_MIN, INT32_MAX, si)
        INT_CASE(KILN_DTYPE_U32, uint32_t, 1, 0, UINT32_MAX, ui)
        INT_CASE(KILN_DTYPE_I64, int64_t, 0, INT64_MIN, INT64_MAX, si)
        INT_CASE(KILN_DTYPE_U64, uint64_t, 1, 0, UINT64_MAX, ui)
#undef INT_CASE
    default:
        snprintf(err, KILN_JSON_ERR_LEN, "input '%s' has dtype %s, which JSON cannot carry",
                 input, kiln_dtype_name(dt));
        return KILN_ERR_UNSUPPORTED;
    }
oom:
    snprintf(err, KILN_JSON_ERR_LEN, "out of memory decoding input '%s'", input);
    return KILN_ERR_OUT_OF_MEMORY;
}

/* --------------------------------------------------------- tensor filling */

/* A leaf is anything that is not an array (a {"b64"} object is a leaf). */
static int is_leaf(const kiln_json_doc *d, int t) { return d->tok[t].type != KILN_JSON_ARRAY; }

typedef struct fill_ctx {
    const kiln_json_doc *d;
    kiln_tensor *x;
    size_t next;      /* next element index */
    int rank;         /* dims of each root (excluding the stacked dim) */
    const int64_t *dims;
    const char *input;
    char *err;
} fill_ctx;

/* Fill from token t, which sits `depth` levels into a root; element path is
 * reported in messages. */
static kiln_status fill_rec(fill_ctx *c, int t, int depth)
{
    const kiln_json_doc *d = c->d;
    if (depth == c->rank) {
        if (!is_leaf(d, t)) {
            snprintf(c->err, KILN_JSON_ERR_LEN,
                     "input '%s': ragged or inconsistent nesting: found a list %d levels deep "
                     "where the first element has scalars (shape rank %d)",
                     c->input, depth + 1, c->rank);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        return store_leaf(d, t, c->x, c->next++, c->input, c->err);
    }
    if (d->tok[t].type != KILN_JSON_ARRAY || (int64_t)d->tok[t].size != c->dims[depth]) {
        if (d->tok[t].type != KILN_JSON_ARRAY)
            snprintf(c->err, KILN_JSON_ERR_LEN,
                     "input '%s': ragged or inconsistent nesting: found a scalar at depth %d "
                     "where a list of %" PRId64 " was expected",
                     c->input, depth + 1, c->dims[depth]);
        else
            snprintf(c->err, KILN_JSON_ERR_LEN,
                     "input '%s': ragged or inconsistent nesting: a list at depth %d has %u "
                     "elements, expected %" PRId64,
                     c->input, depth + 1, d->tok[t].size, c->dims[depth]);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    int k = t + 1;
    for (uint32_t i = 0; i < d->tok[t].size; i++) {
        kiln_status st = fill_rec(c, k, depth + 1);
        if (st != KILN_OK) return st;
        k = (int)d->tok[k].next;
    }
    return KILN_OK;
}

kiln_status kiln_json_fill_tensor(const kiln_json_doc *d, const int *roots, int nroots, int stacked,
                                  kiln_dtype dt, const char *input, kiln_tensor **out, char *err)
{
    int64_t dims[KILN_MAX_RANK];
    int rank = 0;
    if (nroots < 1 || (stacked && nroots > INT32_MAX)) {
        snprintf(err, KILN_JSON_ERR_LEN, "input '%s': no values", input);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (stacked) dims[rank++] = nroots;
    else if (nroots != 1) {
        snprintf(err, KILN_JSON_ERR_LEN, "input '%s': expected one value", input);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    /* the shape of the first root, following first elements */
    int t = roots[0];
    const int root_rank_start = rank;
    while (d->tok[t].type == KILN_JSON_ARRAY) {
        if (rank == KILN_MAX_RANK) {
            snprintf(err, KILN_JSON_ERR_LEN, "input '%s': more than %d dimensions", input,
                     KILN_MAX_RANK);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        dims[rank++] = d->tok[t].size;
        if (d->tok[t].size == 0) break;
        t++;
    }
    kiln_tensor *x;
    kiln_status st = kiln_tensor_create(dt, rank, dims, &x);
    if (st != KILN_OK) {
        snprintf(err, KILN_JSON_ERR_LEN, "input '%s': cannot create a %s tensor: %s", input,
                 kiln_json_tf_type_name(dt), kiln_last_error());
        return st == KILN_ERR_OUT_OF_MEMORY ? KILN_ERR_OUT_OF_MEMORY : KILN_ERR_INVALID_ARGUMENT;
    }
    fill_ctx c = {d, x, 0, rank - root_rank_start, dims + root_rank_start, input, err};
    for (int r = 0; r < nroots; r++) {
        st = fill_rec(&c, roots[r], 0);
        if (st != KILN_OK) {
            kiln_tensor_free(x);
            return st;
        }
    }
    *out = x;
    return KILN_OK;
}

/* Count the leaves under t, failing past `limit`. */
static int64_t count_leaves(const kiln_json_doc *d, int t, int64_t limit)
{
    if (is_leaf(d, t)) return 1;
    int64_t n = 0;
    int k = t + 1;
    for (uint32_t i = 0; i < d->tok[t].size; i++) {
        n += count_leaves(d, k, limit - n);
        if (n > limit) return n;
        k = (int)d->tok[k].next;
    }
    return n;
}

static kiln_status fill_flat_rec(const kiln_json_doc *d, int t, kiln_tensor *x, size_t *next,
                                 const char *input, char *err)
{
    if (is_leaf(d, t)) return store_leaf(d, t, x, (*next)++, input, err);
    int k = t + 1;
    for (uint32_t i = 0; i < d->tok[t].size; i++) {
        kiln_status st = fill_flat_rec(d, k, x, next, input, err);
        if (st != KILN_OK) return st;
        k = (int)d->tok[k].next;
    }
    return KILN_OK;
}

kiln_status kiln_json_fill_flat(const kiln_json_doc *d, int root, kiln_dtype dt, int rank,
                                const int64_t *dims, const char *input, kiln_tensor **out,
                                char *err)
{
    /* the data must fill the shape before anything the shape asks for is
     * allocated: a small body must not make the server allocate gigabytes */
    int64_t want = kiln_shape_count(rank, dims);
    int64_t have = want >= 0 ? count_leaves(d, root, want) : 0;
    if (want >= 0 && have != want) {
        snprintf(err, KILN_JSON_ERR_LEN,
                 "input '%s': data has %s%" PRId64 " elements but the shape needs %" PRId64, input,
                 have > want ? "more than " : "", have > want ? want : have, want);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    kiln_tensor *x;
    kiln_status st = kiln_tensor_create(dt, rank, dims, &x);
    if (st != KILN_OK) {
        snprintf(err, KILN_JSON_ERR_LEN, "input '%s': cannot create a tensor of that shape: %s",
                 input, kiln_last_error());
        return st == KILN_ERR_OUT_OF_MEMORY ? KILN_ERR_OUT_OF_MEMORY : KILN_ERR_INVALID_ARGUMENT;
    }
    size_t next = 0;
    st = fill_flat_rec(d, root, x, &next, input, err);
    if (st != KILN_OK) {
        kiln_tensor_free(x);
        return st;
    }
    *out = x;
    return KILN_OK;
}

/* ---------------------------------------------------------- tensor writer */

static void write_float(kiln_sbuf *b, double v, int digits)
{
    if (isnan(v)) kiln_sbuf_puts(b, "NaN");
    else if (isinf(v)) kiln_sbuf_puts(b, v < 0 ? "-Infinity" : "Infinity");
    else kiln_sbuf_printf(b, "%.*g", digits, v);
}

static void write_elem(kiln_sbuf *b, const kiln_tensor *t, size_t i, int b64)
{
    const void *p = t->data;
    switch (t->dtype) {
    case KILN_DTYPE_F32: write_float(b, ((const float *)p)[i], 9); break;
    case KILN_DTYPE_F64: write_float(b, ((const double *)p)[i], 17); break;
    case KILN_DTYPE_F16: write_float(b, kiln_f16_to_f32(((const uint16_t *)p)[i]), 5); break;
    case KILN_DTYPE_BF16: write_float(b, kiln_bf16_to_f32(((const uint16_t *)p)[i]), 4); break;
    case KILN_DTYPE_I8: kiln_sbuf_printf(b, "%d", ((const int8_t *)p)[i]); break;
    case KILN_DTYPE_U8: kiln_sbuf_printf(b, "%u", ((const uint8_t *)p)[i]); break;
    case KILN_DTYPE_I16: kiln_sbuf_printf(b, "%d", ((const int16_t *)p)[i]); break;
    case KILN_DTYPE_U16: kiln_sbuf_printf(b, "%u", ((const uint16_t *)p)[i]); break;
    case KILN_DTYPE_I32: kiln_sbuf_printf(b, "%" PRId32, ((const int32_t *)p)[i]); break;
    case KILN_DTYPE_U32: kiln_sbuf_printf(b, "%" PRIu32, ((const uint32_t *)p)[i]); break;
    case KILN_DTYPE_I64: kiln_sbuf_printf(b, "%" PRId64, ((const int64_t *)p)[i]); break;
    case KILN_DTYPE_U64: kiln_sbuf_printf(b, "%" PRIu64, ((const uint64_t *)p)[i]); break;
    case KILN_DTYPE_BOOL: kiln_sbuf_puts(b, ((const uint8_t *)p)[i] ? "true" : "false"); break;
    case KILN_DTYPE_STRING: {
        const kiln_string *s = &((const kiln_string *)p)[i];
        if (b64) {
            kiln_sbuf_puts(b, "{\"b64\": \"");
            kiln_sbuf_base64(b, (const unsigned char *)s->data, s->len);
            kiln_sbuf_puts(b, "\"}");
        } else {
            kiln_sbuf_json_string(b, s->data, s->len);
        }
        break;
    }
    default: kiln_sbuf_puts(b, "null"); break; /* sub-byte and float8 types */
    }
}

static void write_nested(kiln_sbuf *b, const kiln_tensor *t, int dim, size_t *next, int b64)
{
    if (dim == t->rank) {
        write_elem(b, t, (*next)++, b64);
        return;
    }
    kiln_sbuf_put(b, "[", 1);
    for (int64_t i = 0; i < t->dims[dim]; i++) {
        if (i) kiln_sbuf_put(b, ", ", 2);
        write_nested(b, t, dim + 1, next, b64);
    }
    /* an empty inner dimension still consumes no elements */
    kiln_sbuf_put(b, "]", 1);
}

void kiln_json_write_tensor(kiln_sbuf *b, const kiln_tensor *t, int64_t row, int b64, int flat)
{
    int64_t count = kiln_tensor_count(t);
    if (flat) {
        kiln_sbuf_put(b, "[", 1);
        for (int64_t i = 0; i < count; i++) {
            if (i) kiln_sbuf_put(b, ", ", 2);
            write_elem(b, t, (size_t)i, b64);
        }
        kiln_sbuf_put(b, "]", 1);
        return;
    }
    if (row < 0) {
        size_t next = 0;
        write_nested(b, t, 0, &next, b64);
        return;
    }
    /* t[row]: the elements after the first `row` rows */
    size_t per_row = t->dims[0] ? (size_t)(count / t->dims[0]) : 0;
    size_t next = (size_t)row * per_row;
    write_nested(b, t, 1, &next, b64);
}
