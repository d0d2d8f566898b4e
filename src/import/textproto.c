/*
 * textproto.c - protobuf text format to protobuf-c messages.
 *
 * A one-token-lookahead tokenizer feeds a recursive-descent parser that
 * walks the message descriptors: each field is looked up by name, its value
 * checked against the field's type (integer ranges, enum names, string
 * escapes) and written in binary wire format to one growing buffer, which
 * protobuf_c_message_unpack then turns into the message. Writing the wire
 * format keeps this parser generic (it never touches the generated C
 * structs) and leaves all memory management of the result to protobuf-c.
 *
 * A nested message's length is only known after its body is written, so 5
 * bytes are reserved for it; a body under 128 bytes is then moved down 4
 * bytes to use a 1-byte length, a larger one keeps a 5-byte varint (a
 * valid, non-minimal encoding that every protobuf parser accepts). No byte
 * is ever moved far, so writing is linear in the text size. Nesting is
 * bounded by KILN_TEXTPROTO_MAX_DEPTH, which also bounds the recursion here
 * and in protobuf-c.
 */
#include "import/textproto.h"

#include <float.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The binary form may be larger than the text (a negative int32 such as "-1"
 * takes 10 bytes); 5-byte nested lengths must also fit in 32 bits. */
#define TP_MAX_BINARY ((size_t)1 << 31)

enum tok_kind { TOK_END, TOK_IDENT, TOK_INT, TOK_FLOAT, TOK_STRING, TOK_SYMBOL };

struct tok {
    enum tok_kind kind;
    const char *s;  /* first byte in the text */
    size_t n;       /* bytes in the text (strings include their quotes) */
    int line, col;  /* 1-based position of s */
};

struct tp {
    const char *text;
    size_t len;
    size_t pos;         /* next byte to tokenize */
    int line;           /* line of pos */
    size_t line_start;  /* offset of the first byte of that line */
    struct tok tok;     /* current token */
    uint8_t *out;       /* wire format being written */
    size_t out_n, out_cap;
    char *str;          /* decoded value of the current string field */
    size_t str_n, str_cap;
    int depth;          /* nested messages open */
};

/* ---- errors ---- */

/* Record "line L:C: <message>" for token t and return st. */
static kiln_status tp_fail(const struct tok *t, kiln_status st, const char *fmt, ...)
    KILN_PRINTF(3, 4);
static kiln_status tp_fail(const struct tok *t, kiln_status st, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_error(st, "line %d:%d: %s", t->line, t->col, msg);
}

/* A token as it appears in the text, quoted and shortened, for messages. */
static const char *tok_show(const struct tok *t, char *buf, size_t n)
{
    if (t->kind == TOK_END) return "end of input";
    int k = (int)(t->n < 40 ? t->n : 40);
    snprintf(buf, n, "'%.*s%s'", k, t->s, t->n > 40 ? "..." : "");
    return buf;
}

/* A message type's name without Kiln's package ("TensorShapeProto.Dim"). */
static const char *msg_name(const ProtobufCMessageDescriptor *d)
{
    size_t k = d->package_name ? strlen(d->package_name) : 0;
    if (k && strncmp(d->name, d->package_name, k) == 0 && d->name[k] == '.') return d->name + k + 1;
    return d->name;
}

static const char *type_name(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT32: return "int32";
    case PROTOBUF_C_TYPE_SINT32: return "sint32";
    case PROTOBUF_C_TYPE_SFIXED32: return "sfixed32";
    case PROTOBUF_C_TYPE_INT64: return "int64";
    case PROTOBUF_C_TYPE_SINT64: return "sint64";
    case PROTOBUF_C_TYPE_SFIXED64: return "sfixed64";
    case PROTOBUF_C_TYPE_UINT32: return "uint32";
    case PROTOBUF_C_TYPE_FIXED32: return "fixed32";
    case PROTOBUF_C_TYPE_UINT64: return "uint64";
    case PROTOBUF_C_TYPE_FIXED64: return "fixed64";
    case PROTOBUF_C_TYPE_FLOAT: return "float";
    case PROTOBUF_C_TYPE_DOUBLE: return "double";
    case PROTOBUF_C_TYPE_BOOL: return "bool";
    case PROTOBUF_C_TYPE_ENUM: return "enum";
    case PROTOBUF_C_TYPE_STRING: return "string";
    case PROTOBUF_C_TYPE_BYTES: return "bytes";
    case PROTOBUF_C_TYPE_MESSAGE: return "message";
    }
    return "unknown";
}

/* ---- tokenizer ---- */

static int peek(const struct tp *p, size_t i) { return i < p->len ? (unsigned char)p->text[i] : -1; }
static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_xdigit(int c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static bool is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_alnum(int c) { return is_alpha(c) || is_digit(c); }

static bool is_symbol(const struct tok *t, char c) { return t->kind == TOK_SYMBOL && t->s[0] == c; }

static bool tok_is(const struct tok *t, const char *word)
{
    size_t k = strlen(word);
    return t->kind == TOK_IDENT && t->n == k && memcmp(t->s, word, k) == 0;
}

/* A position in the text as a token, for errors found while tokenizing. */
static struct tok tok_at(const struct tp *p, size_t pos)
{
    struct tok t = {TOK_SYMBOL, p->text + pos, pos < p->len ? 1 : 0, p->line,
                    (int)(pos - p->line_start) + 1};
    return t;
}

/* Advance p->tok to the next token, skipping whitespace and # comments. */
static kiln_status lex(struct tp *p)
{
    for (;;) {
        int c = peek(p, p->pos);
        if (c == '\n') {
            p->pos++;
            p->line++;
            p->line_start = p->pos;
        } else if (c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f') {
            p->pos++;
        } else if (c == '#') {
            while (p->pos < p->len && p->text[p->pos] != '\n') p->pos++;
        } else {
            break;
        }
    }
    struct tok *t = &p->tok;
    size_t start = p->pos;
    *t = tok_at(p, start);
    int c = peek(p, start);
    if (c < 0) {
        t->kind = TOK_END;
        t->n = 0;
        return KILN_OK;
    }
    if (is_alpha(c)) {
        while (is_alnum(peek(p, p->pos))) p->pos++;
        t->kind = TOK_IDENT;
    } else if (is_digit(c) || (c == '.' && is_digit(peek(p, start + 1)))) {
        t->kind = TOK_INT;
        if (c == '0' && (peek(p, start + 1) == 'x' || peek(p, start + 1) == 'X')) {
            p->pos += 2;
            if (!is_xdigit(peek(p, p->pos)))
                return tp_fail(t, KILN_ERR_INVALID_MODEL, "'0x' must be followed by hex digits");
            while (is_xdigit(peek(p, p->pos))) p->pos++;
        } else {
            while (is_digit(peek(p, p->pos))) p->pos++;
            if (peek(p, p->pos) == '.') {
                t->kind = TOK_FLOAT;
                p->pos++;
                while (is_digit(peek(p, p->pos))) p->pos++;
            }
            if (peek(p, p->pos) == 'e' || peek(p, p->pos) == 'E') {
                t->kind = TOK_FLOAT;
                p->pos++;
                if (peek(p, p->pos) == '+' || peek(p, p->pos) == '-') p->pos++;
                if (!is_digit(peek(p, p->pos))) {
                    struct tok e = tok_at(p, p->pos);
                    return tp_fail(&e, KILN_ERR_INVALID_MODEL, "exponent of '%.*s' has no digits",
                                   (int)(p->pos - start), t->s);
                }
                while (is_digit(peek(p, p->pos))) p->pos++;
            }
            if (peek(p, p->pos) == 'f' || peek(p, p->pos) == 'F') {
                t->kind = TOK_FLOAT;
                p->pos++;
            }
        }
        if (is_alnum(peek(p, p->pos)) || peek(p, p->pos) == '.') {
            while (is_alnum(peek(p, p->pos)) || peek(p, p->pos) == '.') p->pos++;
            int k = (int)(p->pos - start < 40 ? p->pos - start : 40);
            return tp_fail(t, KILN_ERR_INVALID_MODEL, "'%.*s' is not a valid number", k, t->s);
        }
    } else if (c == '"' || c == '\'') {
        p->pos++;
        for (;;) {
            int ch = peek(p, p->pos);
            if (ch < 0 || ch == '\n')
                return tp_fail(t, KILN_ERR_INVALID_MODEL, "string is not closed before the end of %s",
                               ch < 0 ? "the input" : "the line");
            p->pos++;
            if (ch == c) break;
            if (ch == '\\') {
                int e = peek(p, p->pos);
                if (e < 0 || e == '\n')
                    return tp_fail(t, KILN_ERR_INVALID_MODEL,
                                   "string is not closed before the end of %s",
                                   e < 0 ? "the input" : "the line");
                p->pos++;
            }
        }
        t->kind = TOK_STRING;
    } else if (c > 0x20 && c < 0x7f) {
        p->pos++;
        t->kind = TOK_SYMBOL;
    } else {
        return tp_fail(t, KILN_ERR_INVALID_MODEL, "unexpected byte 0x%02x", (unsigned)c);
    }
    t->n = p->pos - start;
    return KILN_OK;
}

/* ---- output ---- */

/* Make room for `more` bytes of wire format. */
static kiln_status out_reserve(struct tp *p, size_t more)
{
    if (more > TP_MAX_BINARY - p->out_n)
        return tp_fail(&p->tok, KILN_ERR_OUT_OF_MEMORY,
                       "the message would exceed %zu bytes in binary form", TP_MAX_BINARY);
    if (p->out_n + more <= p->out_cap) return KILN_OK;
    size_t cap = p->out_cap ? p->out_cap : 256;
    while (cap < p->out_n + more) cap *= 2;
    uint8_t *b = realloc(p->out, cap);
    if (!b) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory parsing protobuf text");
    p->out = b;
    p->out_cap = cap;
    return KILN_OK;
}

static kiln_status put_varint(struct tp *p, uint64_t v)
{
    kiln_status st = out_reserve(p, 10);
    if (st != KILN_OK) return st;
    while (v >= 0x80) {
        p->out[p->out_n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p->out[p->out_n++] = (uint8_t)v;
    return KILN_OK;
}

/* Little-endian fixed-width value of `bytes` (4 or 8) bytes. */
static kiln_status put_fixed(struct tp *p, uint64_t v, int bytes)
{
    kiln_status st = out_reserve(p, (size_t)bytes);
    if (st != KILN_OK) return st;
    for (int i = 0; i < bytes; i++) p->out[p->out_n++] = (uint8_t)(v >> (8 * i));
    return KILN_OK;
}

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

static kiln_status put_tag(struct tp *p, const ProtobufCFieldDescriptor *f, int wire)
{
    return put_varint(p, ((uint64_t)f->id << 3) | (unsigned)wire);
}

/* ---- scalar values ---- */

/* Value of an INT token (decimal, 0x hex or 0 octal) into *mag. */
static kiln_status int_token_value(const struct tok *t, const char *field, uint64_t *mag)
{
    uint64_t v = 0;
    const char *s = t->s;
    size_t n = t->n;
    unsigned base = 10;
    size_t i = 0;
    if (n > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        i = 2;
    } else if (n > 1 && s[0] == '0') {
        base = 8;
        i = 1;
    }
    for (; i < n; i++) {
        int c = (unsigned char)s[i];
        unsigned d = is_digit(c) ? (unsigned)(c - '0')
                     : (c >= 'a' && c <= 'f') ? (unsigned)(c - 'a' + 10)
                                              : (unsigned)(c - 'A' + 10);
        if (d >= base)
            return tp_fail(t, KILN_ERR_INVALID_MODEL,
                           "'%.*s' for field '%s' is not a valid octal number (it starts with 0)",
                           (int)(n < 40 ? n : 40), s, field);
        if (v > (UINT64_MAX - d) / base)
            return tp_fail(t, KILN_ERR_INVALID_MODEL,
                           "integer '%.*s' for field '%s' does not fit in 64 bits",
                           (int)(n < 40 ? n : 40), s, field);
        v = v * base + d;
    }
    *mag = v;
    return KILN_OK;
}

/* Read an integer: an optional '-' and an INT token. */
static kiln_status read_integer(struct tp *p, const ProtobufCMessageDescriptor *d,
                                const ProtobufCFieldDescriptor *f, bool *neg, uint64_t *mag)
{
    char buf[64];
    *neg = false;
    if (is_symbol(&p->tok, '-')) {
        *neg = true;
        kiln_status st = lex(p);
        if (st != KILN_OK) return st;
    }
    if (p->tok.kind != TOK_INT)
        return tp_fail(&p->tok, KILN_ERR_INVALID_MODEL,
                       "expected an integer for field '%s' (%s) in %s, found %s", f->name,
                       type_name(f->type), msg_name(d), tok_show(&p->tok, buf, sizeof buf));
    kiln_status st = int_token_value(&p->tok, f->name, mag);
    if (st != KILN_OK) return st;
    return KILN_OK;
}

/* Encode an integer field after checking the value fits its type. */
static kiln_status parse_integer(struct tp *p, const ProtobufCMessageDescriptor *d,
                                 const ProtobufCFieldDescriptor *f)
{
    bool neg;
    uint64_t mag;
    kiln_status st = read_integer(p, d, f, &neg, &mag);
    if (st != KILN_OK) return st;
    if (neg && mag == 0) neg = false;
    uint64_t lim_pos, lim_neg; /* largest magnitudes allowed */
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        lim_pos = INT32_MAX;
        lim_neg = (uint64_t)INT32_MAX + 1;
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        lim_pos = INT64_MAX;
        lim_neg = (uint64_t)INT64_MAX + 1;
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        lim_pos = UINT32_MAX;
        lim_neg = 0;
        break;
    default:
        lim_pos = UINT64_MAX;
        lim_neg = 0;
        break;
    }
    if (neg ? mag > lim_neg : mag > lim_pos)
        return tp_fail(&p->tok, KILN_ERR_INVALID_MODEL,
                       "value %s%.*s is out of range for field '%s' (%s) in %s", neg ? "-" : "",
                       (int)(p->tok.n < 40 ? p->tok.n : 40), p->tok.s, f->name,
                       type_name(f->type), msg_name(d));
    uint64_t bits = neg ? 0 - mag : mag; /* two's complement, sign-extended to 64 bits */
    uint64_t zigzag = neg ? 2 * mag - 1 : 2 * mag;
    switch (f->type) {
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SINT64:
        st = put_tag(p, f, WIRE_VARINT);
        if (st == KILN_OK) st = put_varint(p, zigzag);
        break;
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FIXED32:
        st = put_tag(p, f, WIRE_FIXED32);
        if (st == KILN_OK) st = put_fixed(p, bits, 4);
        break;
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_FIXED64:
        st = put_tag(p, f, WIRE_FIXED64);
        if (st == KILN_OK) st = put_fixed(p, bits, 8);
        break;
    default:
        st = put_tag(p, f, WIRE_VARINT);
        if (st == KILN_OK) st = put_varint(p, bits);
        break;
    }
    if (st != KILN_OK) return st;
    return lex(p);
}

/* Case-insensitive match of an identifier token. */
static bool tok_is_nocase(const struct tok *t, const char *word)
{
    size_t k = strlen(word);
    if (t->kind != TOK_IDENT || t->n != k) return false;
    for (size_t i = 0; i < k; i++) {
        int c = (unsigned char)t->s[i];
        if (c >= 'A' && c <= 'Z') c += 'a' - 'A';
        if (c != word[i]) return false;
    }
    return true;
}

/* Convert a decimal FLOAT or INT token with strtod, independent of the locale. */
static kiln_status decimal_value(const struct tok *t, const char *field, double *out)
{
    size_t n = t->n;
    if (n && (t->s[n - 1] == 'f' || t->s[n - 1] == 'F')) n--;
    char small[128];
    char *buf = n < sizeof small ? small : malloc(n + 1);
    if (!buf) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory parsing protobuf text");
    memcpy(buf, t->s, n);
    buf[n] = '\0';
    /* strtod follows LC_NUMERIC; the text format always uses '.' */
    const char *dp = localeconv()->decimal_point;
    if (dp && dp[0] && dp[0] != '.' && !dp[1])
        for (size_t i = 0; i < n; i++)
            if (buf[i] == '.') buf[i] = dp[0];
    char *end;
    double v = strtod(buf, &end);
    bool ok = end == buf + n && n > 0;
    if (buf != small) free(buf);
    if (!ok)
        return tp_fail(t, KILN_ERR_INVALID_MODEL, "'%.*s' for field '%s' is not a valid number",
                       (int)(t->n < 40 ? t->n : 40), t->s, field);
    *out = v; /* out-of-range values are +-inf, as in protobuf's own parser */
    return KILN_OK;
}

/* Encode a float or double field: a number, inf, infinity or nan, with an optional '-'. */
static kiln_status parse_floating(struct tp *p, const ProtobufCMessageDescriptor *d,
                                  const ProtobufCFieldDescriptor *f)
{
    char buf[64];
    bool neg = false;
    kiln_status st;
    if (is_symbol(&p->tok, '-')) {
        neg = true;
        if ((st = lex(p)) != KILN_OK) return st;
    }
    double v = 0;
    const struct tok *t = &p->tok;
    if (tok_is_nocase(t, "inf") || tok_is_nocase(t, "infinity")) {
        v = INFINITY;
    } else if (tok_is_nocase(t, "nan")) {
        v = NAN;
    } else if (t->kind == TOK_INT && t->n > 1 && t->s[0] == '0') {
        uint64_t mag; /* hex or octal integer */
        if ((st = int_token_value(t, f->name, &mag)) != KILN_OK) return st;
        v = (double)mag;
    } else if (t->kind == TOK_INT || t->kind == TOK_FLOAT) {
        if ((st = decimal_value(t, f->name, &v)) != KILN_OK) return st;
    } else {
        return tp_fail(t, KILN_ERR_INVALID_MODEL,
                       "expected a number for field '%s' (%s) in %s, found %s", f->name,
                       type_name(f->type), msg_name(d), tok_show(t, buf, sizeof buf));
    }
    if (neg) v = -v;
    if (f->type == PROTOBUF_C_TYPE_FLOAT) {
        float x;
        if (v > FLT_MAX) x = INFINITY;
        else if (v < -FLT_MAX) x = -INFINITY;
        else x = (float)v;
        uint32_t bits;
        memcpy(&bits, &x, 4);
        st = put_tag(p, f, WIRE_FIXED32);
        if (st == KILN_OK) st = put_fixed(p, bits, 4);
    } else {
        uint64_t bits;
        memcpy(&bits, &v, 8);
        st = put_tag(p, f, WIRE_FIXED64);
        if (st == KILN_OK) st = put_fixed(p, bits, 8);
    }
    if (st != KILN_OK) return st;
    return lex(p);
}

/* Encode a bool field: true/false/True/False/t/f/1/0. */
static kiln_status parse_bool(struct tp *p, const ProtobufCMessageDescriptor *d,
                              const ProtobufCFieldDescriptor *f)
{
    char buf[64];
    const struct tok *t = &p->tok;
    int v = -1;
    if (tok_is(t, "true") || tok_is(t, "True") || tok_is(t, "t")) v = 1;
    else if (tok_is(t, "false") || tok_is(t, "False") || tok_is(t, "f")) v = 0;
    else if (t->kind == TOK_INT && t->n == 1 && (t->s[0] == '0' || t->s[0] == '1')) v = t->s[0] - '0';
    if (v < 0)
        return tp_fail(t, KILN_ERR_INVALID_MODEL,
                       "expected true or false for field '%s' (bool) in %s, found %s", f->name,
                       msg_name(d), tok_show(t, buf, sizeof buf));
    kiln_status st = put_tag(p, f, WIRE_VARINT);
    if (st == KILN_OK) st = put_varint(p, (uint64_t)v);
    if (st != KILN_OK) return st;
    return lex(p);
}

/* Encode an enum field: a value name of the enum, or a number in int32 range. */
static kiln_status parse_enum(struct tp *p, const ProtobufCMessageDescriptor *d,
                              const ProtobufCFieldDescriptor *f)
{
    const ProtobufCEnumDescriptor *ed = f->descriptor;
    const struct tok *t = &p->tok;
    kiln_status st;
    if (t->kind == TOK_IDENT) {
        for (unsigned i = 0; i < ed->n_values; i++) {
            const char *name = ed->values[i].name;
            if (strlen(name) == t->n && memcmp(name, t->s, t->n) == 0) {
                st = put_tag(p, f, WIRE_VARINT);
                if (st == KILN_OK) st = put_varint(p, (uint64_t)(int64_t)ed->values[i].value);
                if (st != KILN_OK) return st;
                return lex(p);
            }
        }
        return tp_fail(t, KILN_ERR_INVALID_MODEL, "unknown value '%.*s' for enum field '%s' (%s) in %s",
                       (int)(t->n < 60 ? t->n : 60), t->s, f->name, ed->short_name, msg_name(d));
    }
    /* By number: any int32 (enums are open in proto3; protobuf-c keeps the number). */
    bool neg;
    uint64_t mag;
    if ((st = read_integer(p, d, f, &neg, &mag)) != KILN_OK) return st;
    if (neg ? mag > (uint64_t)INT32_MAX + 1 : mag > INT32_MAX)
        return tp_fail(t, KILN_ERR_INVALID_MODEL,
                       "value %s%.*s is out of range for enum field '%s' (%s) in %s",
                       neg ? "-" : "", (int)(t->n < 40 ? t->n : 40), t->s, f->name, ed->short_name,
                       msg_name(d));
    st = put_tag(p, f, WIRE_VARINT);
    if (st == KILN_OK) st = put_varint(p, neg ? 0 - mag : mag);
    if (st != KILN_OK) return st;
    return lex(p);
}

static kiln_status str_push(struct tp *p, const void *bytes, size_t n)
{
    if (p->str_n + n > p->str_cap) {
        size_t cap = p->str_cap ? p->str_cap : 64;
        while (cap < p->str_n + n) cap *= 2;
        char *b = realloc(p->str, cap);
        if (!b) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory parsing protobuf text");
        p->str = b;
        p->str_cap = cap;
    }
    memcpy(p->str + p->str_n, bytes, n);
    p->str_n += n;
    return KILN_OK;
}

/* Append code point cp as UTF-8. */
static kiln_status str_push_utf8(struct tp *p, uint32_t cp)
{
    uint8_t b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (uint8_t)(0xc0 | (cp >> 6));
        b[1] = (uint8_t)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (uint8_t)(0xe0 | (cp >> 12));
        b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        b[2] = (uint8_t)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        b[0] = (uint8_t)(0xf0 | (cp >> 18));
        b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
        b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        b[3] = (uint8_t)(0x80 | (cp & 0x3f));
        n = 4;
    }
    return str_push(p, b, n);
}

static int hex_val(int c)
{
    if (is_digit(c)) return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Read exactly `digits` hex digits at s (before end) into *cp; false if not there. */
static bool hex_digits(const char *s, const char *end, int digits, uint32_t *cp)
{
    uint32_t v = 0;
    if (end - s < digits) return false;
    for (int i = 0; i < digits; i++) {
        int h = hex_val((unsigned char)s[i]);
        if (h < 0) return false;
        v = v << 4 | (uint32_t)h;
    }
    *cp = v;
    return true;
}

/* Append the value of string token t (quotes removed, escapes decoded). */
static kiln_status decode_string(struct tp *p, const struct tok *t)
{
    const char *s = t->s + 1, *end = t->s + t->n - 1;
    kiln_status st;
    while (s < end) {
        const char *run = s;
        while (s < end && *s != '\\') s++;
        if (s > run && (st = str_push(p, run, (size_t)(s - run))) != KILN_OK) return st;
        if (s >= end) break;
        struct tok at = *t; /* the escape's position, for messages */
        at.col += (int)(s - t->s);
        s++; /* the tokenizer guarantees a character after the backslash */
        int c = (unsigned char)*s++;
        uint8_t byte;
        switch (c) {
        case 'a': byte = '\a'; break;
        case 'b': byte = '\b'; break;
        case 'f': byte = '\f'; break;
        case 'n': byte = '\n'; break;
        case 'r': byte = '\r'; break;
        case 't': byte = '\t'; break;
        case 'v': byte = '\v'; break;
        case '\\': case '\'': case '"': case '?': byte = (uint8_t)c; break;
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
            unsigned v = (unsigned)(c - '0');
            for (int k = 0; k < 2 && s < end && *s >= '0' && *s <= '7'; k++) v = v * 8 + (unsigned)(*s++ - '0');
            if (v > 255)
                return tp_fail(&at, KILN_ERR_INVALID_MODEL, "octal escape \\%o is larger than \\377", v);
            byte = (uint8_t)v;
            break;
        }
        case 'x': case 'X': {
            int h = s < end ? hex_val((unsigned char)*s) : -1;
            if (h < 0)
                return tp_fail(&at, KILN_ERR_INVALID_MODEL, "'\\x' must be followed by hex digits");
            s++;
            unsigned v = (unsigned)h;
            if (s < end && (h = hex_val((unsigned char)*s)) >= 0) {
                v = v * 16 + (unsigned)h;
                s++;
            }
            byte = (uint8_t)v;
            break;
        }
        case 'u': case 'U': {
            uint32_t cp;
            int digits = c == 'u' ? 4 : 8;
            if (!hex_digits(s, end, digits, &cp))
                return tp_fail(&at, KILN_ERR_INVALID_MODEL, "'\\%c' must be followed by %d hex digits",
                               c, digits);
            s += digits;
            if (cp >= 0xd800 && cp <= 0xdbff) { /* a high surrogate needs its low half */
                uint32_t lo;
                if (end - s >= 6 && s[0] == '\\' && s[1] == 'u' && hex_digits(s + 2, end, 4, &lo) &&
                    lo >= 0xdc00 && lo <= 0xdfff) {
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    s += 6;
                } else {
                    return tp_fail(&at, KILN_ERR_INVALID_MODEL,
                                   "unpaired surrogate \\u%04x in string", (unsigned)cp);
                }
            } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                return tp_fail(&at, KILN_ERR_INVALID_MODEL, "unpaired surrogate \\u%04x in string",
                               (unsigned)cp);
            } else if (cp > 0x10ffff) {
                return tp_fail(&at, KILN_ERR_INVALID_MODEL,
                               "\\U%08x is beyond the last Unicode code point", (unsigned)cp);
            }
            if ((st = str_push_utf8(p, cp)) != KILN_OK) return st;
            continue;
        }
        default:
            return tp_fail(&at, KILN_ERR_INVALID_MODEL, "unknown escape '\\%c' in string", c);
        }
        if ((st = str_push(p, &byte, 1)) != KILN_OK) return st;
    }
    return KILN_OK;
}

/* Encode a string or bytes field: one or more adjacent string literals. */
static kiln_status parse_string(struct tp *p, const ProtobufCMessageDescriptor *d,
                                const ProtobufCFieldDescriptor *f)
{
    char buf[64];
    if (p->tok.kind != TOK_STRING)
        return tp_fail(&p->tok, KILN_ERR_INVALID_MODEL,
                       "expected a string for field '%s' (%s) in %s, found %s", f->name,
                       type_name(f->type), msg_name(d), tok_show(&p->tok, buf, sizeof buf));
    p->str_n = 0;
    kiln_status st;
    while (p->tok.kind == TOK_STRING) {
        if ((st = decode_string(p, &p->tok)) != KILN_OK) return st;
        if ((st = lex(p)) != KILN_OK) return st;
    }
    if ((st = put_tag(p, f, WIRE_LEN)) != KILN_OK) return st;
    if ((st = put_varint(p, p->str_n)) != KILN_OK) return st;
    if ((st = out_reserve(p, p->str_n)) != KILN_OK) return st;
    if (p->str_n) memcpy(p->out + p->out_n, p->str, p->str_n);
    p->out_n += p->str_n;
    return KILN_OK;
}

static kiln_status parse_scalar(struct tp *p, const ProtobufCMessageDescriptor *d,
                                const ProtobufCFieldDescriptor *f)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE: return parse_floating(p, d, f);
    case PROTOBUF_C_TYPE_BOOL: return parse_bool(p, d, f);
    case PROTOBUF_C_TYPE_ENUM: return parse_enum(p, d, f);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_BYTES: return parse_string(p, d, f);
    default: return parse_integer(p, d, f);
    }
}

/* ---- messages ---- */

static kiln_status parse_fields(struct tp *p, const ProtobufCMessageDescriptor *d, char close);

/* Binary search of the fields by name (protoc-c sorts them with strcmp). */
static const ProtobufCFieldDescriptor *field_by_name(const ProtobufCMessageDescriptor *d,
                                                     const char *s, size_t n)
{
    unsigned lo = 0, hi = d->n_fields;
    while (lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        const ProtobufCFieldDescriptor *f = &d->fields[d->fields_sorted_by_name[mid]];
        int c = strncmp(s, f->name, n);
        if (c == 0 && f->name[n] != '\0') c = -1;
        if (c == 0) return f;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

/* Encode one message value: { fields } or < fields >. */
static kiln_status parse_message_value(struct tp *p, const ProtobufCMessageDescriptor *d,
                                       const ProtobufCFieldDescriptor *f)
{
    char buf[64];
    const ProtobufCMessageDescriptor *sub = f->descriptor;
    char close;
    if (is_symbol(&p->tok, '{')) close = '}';
    else if (is_symbol(&p->tok, '<')) close = '>';
    else
        return tp_fail(&p->tok, KILN_ERR_INVALID_MODEL,
                       "expected '{' to open field '%s' (%s) in %s, found %s", f->name,
                       msg_name(sub), msg_name(d), tok_show(&p->tok, buf, sizeof buf));
    if (p->depth >= KILN_TEXTPROTO_MAX_DEPTH)
        return tp_fail(&p->tok, KILN_ERR_INVALID_MODEL,
                       "messages are nested more than %d levels deep (at field '%s' in %s)",
                       KILN_TEXTPROTO_MAX_DEPTH, f->name, msg_name(d));
    kiln_status st = put_tag(p, f, WIRE_LEN);
    if (st == KILN_OK) st = out_reserve(p, 5);
    if (st != KILN_OK) return st;
    size_t len_at = p->out_n;
    p->out_n += 5;
    if ((st = lex(p)) != KILN_OK) return st;
    p->depth++;
    st = parse_fields(p, sub, close);
    p->depth--;
    if (st != KILN_OK) return st;
    size_t body = p->out_n - len_at - 5;
    if (body < 0x80) {
        p->out[len_at] = (uint8_t)body;
        memmove(p->out + len_at + 1, p->out + len_at + 5, body);
        p->out_n -= 4;
    } else {
        for (int i = 0; i < 5; i++) p->out[len_at + i] = (uint8_t)(((body >> (7 * i)) & 0x7f) | (i < 4 ? 0x80 : 0));
    }
    return lex(p); /* past the closing bracket */
}

/* Values of a repeated field written as a list: [a, b, c] (p->tok is '['). */
static kiln_status parse_list(struct tp *p, const ProtobufCMessageDescriptor *d,
                              const ProtobufCFieldDescriptor *f)
{
    char buf[64];
    kiln_status st = lex(p);
    if (st != KILN_OK) return st;
    if (is_symbol(&p->tok, ']')) return lex(p);
    for (;;) {
        st = f->type == PROTOBUF_C_TYPE_MESSAGE ? parse_message_value(p, d, f) : parse_scalar(p, d, f);
        if (st != KILN_OK) return st;
        if (is_symbol(&p->tok, ']')) return lex(p);
        if (!is_symbol(&p->tok, ','))
            return tp_fail(&p->tok, KILN_ERR_INVALID_MODEL,
                           "expected ',' or ']' in the list for field '%s' in %s, found %s", f->name,
                           msg_name(d), tok_show(&p->tok, buf, sizeof buf));
        if ((st = lex(p)) != KILN_OK) return st;
    }
}

/* Report "[...]" where a field name should be: an extension or an Any expansion. */
static kiln_status reject_bracket_name(struct tp *p, const ProtobufCMessageDescriptor *d)
{
    const char *s = p->tok.s;
    size_t max = (size_t)(p->text + p->len - s), n = 1;
    while (n < max && n < 120 && s[n] != ']' && s[n] != '\n') n++;
    if (n < max && s[n] == ']') n++;
    return tp_fail(&p->tok, KILN_ERR_UNSUPPORTED,
                   "extension or Any field '%.*s' in %s is not supported", (int)n, s, msg_name(d));
}

/* Parse fields of message type d until the `close` symbol (left as the
 * current token) or, for close == 0, the end of the input. */
static kiln_status parse_fields(struct tp *p, const ProtobufCMessageDescriptor *d, char close)
{
    char buf[64];
    kiln_status st = KILN_OK;
    unsigned char *seen = calloc(d->n_fields ? d->n_fields : 1, 1);
    if (!seen) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory parsing protobuf text");
    for (;;) {
        const struct tok *t = &p->tok;
        if (t->kind == TOK_END) {
            if (!close) break;
            st = tp_fail(t, KILN_ERR_INVALID_MODEL, "expected '%c' to close %s, found end of input",
                         close, msg_name(d));
            goto out;
        }
        if (close && is_symbol(t, close)) break;
        if (is_symbol(t, '[')) {
            st = reject_bracket_name(p, d);
            goto out;
        }
        if (t->kind != TOK_IDENT) {
            st = tp_fail(t, KILN_ERR_INVALID_MODEL, "expected a field name in %s, found %s",
                         msg_name(d), tok_show(t, buf, sizeof buf));
            goto out;
        }
        const ProtobufCFieldDescriptor *f = field_by_name(d, t->s, t->n);
        if (!f) {
            st = tp_fail(t, KILN_ERR_INVALID_MODEL, "unknown field '%.*s' in %s",
                         (int)(t->n < 100 ? t->n : 100), t->s, msg_name(d));
            goto out;
        }
        unsigned idx = (unsigned)(f - d->fields);
        bool repeated = f->label == PROTOBUF_C_LABEL_REPEATED;
        if (!repeated && seen[idx]) {
            st = tp_fail(t, KILN_ERR_INVALID_MODEL,
                         "field '%s' in %s is given more than once but is not repeated", f->name,
                         msg_name(d));
            goto out;
        }
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            for (unsigned j = 0; j < d->n_fields; j++) {
                const ProtobufCFieldDescriptor *g = &d->fields[j];
                if (j != idx && seen[j] && (g->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                    g->quantifier_offset == f->quantifier_offset) {
                    st = tp_fail(t, KILN_ERR_INVALID_MODEL,
                                 "fields '%s' and '%s' in %s belong to one oneof; only one may be given",
                                 g->name, f->name, msg_name(d));
                    goto out;
                }
            }
        }
        seen[idx] = 1;
        if ((st = lex(p)) != KILN_OK) goto out;
        bool colon = is_symbol(&p->tok, ':');
        if (colon && (st = lex(p)) != KILN_OK) goto out;
        if (f->type != PROTOBUF_C_TYPE_MESSAGE && !colon) {
            st = tp_fail(&p->tok, KILN_ERR_INVALID_MODEL,
                         "expected ':' after field '%s' in %s, found %s", f->name, msg_name(d),
                         tok_show(&p->tok, buf, sizeof buf));
            goto out;
        }
        if (is_symbol(&p->tok, '[')) {
            if (!repeated) {
                st = tp_fail(&p->tok, KILN_ERR_INVALID_MODEL,
                             "field '%s' in %s is not repeated, so it cannot take a list", f->name,
                             msg_name(d));
                goto out;
            }
            st = parse_list(p, d, f);
        } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            st = parse_message_value(p, d, f);
        } else {
            st = parse_scalar(p, d, f);
        }
        if (st != KILN_OK) goto out;
        if ((is_symbol(&p->tok, ';') || is_symbol(&p->tok, ',')) && (st = lex(p)) != KILN_OK)
            goto out;
    }
    for (unsigned j = 0; j < d->n_fields; j++) {
        if (d->fields[j].label == PROTOBUF_C_LABEL_REQUIRED && !seen[j]) {
            st = tp_fail(&p->tok, KILN_ERR_INVALID_MODEL, "missing required field '%s' in %s",
                         d->fields[j].name, msg_name(d));
            goto out;
        }
    }
out:
    free(seen);
    return st;
}

kiln_status kiln_textproto_parse(const ProtobufCMessageDescriptor *desc, const char *text,
                                 size_t len, ProtobufCMessage **out)
{
    if (out) *out = NULL;
    if (!desc || !out || (!text && len))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_textproto_parse: NULL argument");
    if (len > KILN_TEXTPROTO_MAX_BYTES)
        return kiln_error(KILN_ERR_OUT_OF_MEMORY,
                          "protobuf text of %zu bytes exceeds Kiln's limit of %zu bytes", len,
                          KILN_TEXTPROTO_MAX_BYTES);
    struct tp p = {.text = text ? text : "", .len = len, .line = 1};
    kiln_status st = lex(&p);
    if (st == KILN_OK) st = parse_fields(&p, desc, 0);
    free(p.str);
    if (st != KILN_OK) {
        free(p.out);
        return st;
    }
    ProtobufCMessage *msg =
        protobuf_c_message_unpack(desc, NULL, p.out_n, p.out ? p.out : (const uint8_t *)"");
    free(p.out);
    if (!msg)
        return kiln_error(KILN_ERR_INTERNAL,
                          "protobuf text parsed, but protobuf-c could not unpack the %s it encodes",
                          msg_name(desc));
    *out = msg;
    return KILN_OK;
}
