/*
 * xgb_doc.c - the JSON and UBJSON readers behind xgb_doc.h.
 *
 * JSON: RFC 8259 values; strings with the standard escapes (\uXXXX written
 * as UTF-8; an unpaired surrogate becomes U+FFFD). UBJSON: the markers
 * XGBoost writes (objects, arrays, strings, i U I l L integers, d D floats,
 * T F Z N, C chars, H high-precision numbers) and the optimized containers
 * ($type and #count), integers big-endian as the format says.
 */
#include "import/xgb_doc.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define XD_MAX_DEPTH 64

struct rd {
    const unsigned char *p, *end;
    struct kiln_arena *a;
    const unsigned char *start;
};

static kiln_status perr(const struct rd *r, const char *what)
{
    return kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: %s at byte %lld", what,
                      (long long)(r->p - r->start));
}

/* Growable list used while an array or object is read (heap), copied to the arena. */
struct list {
    struct xd *items;
    const char **keys;
    size_t n, cap;
    int all_num;
};

static kiln_status list_push(struct list *l, const struct xd *v, const char *key)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        struct xd *ni = realloc(l->items, cap * sizeof *ni);
        if (!ni) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        l->items = ni;
        const char **nk = realloc(l->keys, cap * sizeof *nk);
        if (!nk) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        l->keys = nk;
        l->cap = cap;
    }
    l->items[l->n] = *v;
    l->keys[l->n] = key;
    l->n++;
    if (v->t != XD_NUM && v->t != XD_BOOL) l->all_num = 0;
    return KILN_OK;
}

/* Move a finished list into v (arena copies); numbers become NUMS. */
static kiln_status list_finish(struct rd *r, struct list *l, int obj, struct xd *v)
{
    memset(v, 0, sizeof *v);
    v->len = l->n;
    kiln_status st = KILN_OK;
    if (!obj && l->all_num && l->n > 0) {
        v->t = XD_NUMS;
        v->nums = kiln_arena_alloc(r->a, sizeof(double) * l->n);
        if (!v->nums) st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        else
            for (size_t i = 0; i < l->n; i++) v->nums[i] = l->items[i].num;
    } else {
        v->t = obj ? XD_OBJ : XD_ARR;
        v->items = kiln_arena_alloc(r->a, sizeof(struct xd) * (l->n + 1));
        if (obj) v->keys = kiln_arena_alloc(r->a, sizeof(char *) * (l->n + 1));
        if (!v->items || (obj && !v->keys)) st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        else {
            if (l->n) memcpy(v->items, l->items, sizeof(struct xd) * l->n);
            if (obj && l->n) memcpy(v->keys, l->keys, sizeof(char *) * l->n);
        }
    }
    free(l->items);
    free(l->keys);
    memset(l, 0, sizeof *l);
    return st;
}

static void list_drop(struct list *l)
{
    free(l->items);
    free(l->keys);
    memset(l, 0, sizeof *l);
}

/* ---- JSON ---- */

static void skip_ws(struct rd *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static kiln_status json_string(struct rd *r, const char **out, size_t *len_out)
{
    if (r->p >= r->end || *r->p != '"') return perr(r, "expected a string");
    r->p++;
    /* the decoded string is never longer than the encoded one */
    const unsigned char *q = r->p;
    while (q < r->end && *q != '"') q += *q == '\\' && q + 1 < r->end ? 2 : 1;
    if (q >= r->end) return perr(r, "unterminated string");
    char *buf = kiln_arena_alloc(r->a, (size_t)(q - r->p) + 1);
    if (!buf) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    size_t n = 0;
    while (*r->p != '"') {
        unsigned c = *r->p++;
        if (c < 0x20) return perr(r, "control character in a string");
        if (c != '\\') {
            buf[n++] = (char)c;
            continue;
        }
        c = *r->p++;
        switch (c) {
        case '"': case '\\': case '/': buf[n++] = (char)c; break;
        case 'b': buf[n++] = '\b'; break;
        case 'f': buf[n++] = '\f'; break;
        case 'n': buf[n++] = '\n'; break;
        case 'r': buf[n++] = '\r'; break;
        case 't': buf[n++] = '\t'; break;
        case 'u': {
            if (r->end - r->p < 4) return perr(r, "short \\u escape");
            unsigned u = 0;
            for (int k = 0; k < 4; k++) {
                int h = hexval(r->p[k]);
                if (h < 0) return perr(r, "bad \\u escape");
                u = u * 16 + (unsigned)h;
            }
            r->p += 4;
            if (u >= 0xd800 && u <= 0xdfff) u = 0xfffd; /* 6 encoded bytes: room for 3 */
            if (u < 0x80) buf[n++] = (char)u;
            else if (u < 0x800) {
                buf[n++] = (char)(0xc0 | (u >> 6));
                buf[n++] = (char)(0x80 | (u & 0x3f));
            } else {
                buf[n++] = (char)(0xe0 | (u >> 12));
                buf[n++] = (char)(0x80 | ((u >> 6) & 0x3f));
                buf[n++] = (char)(0x80 | (u & 0x3f));
            }
            break;
        }
        default: return perr(r, "bad escape in a string");
        }
    }
    r->p++;
    buf[n] = '\0';
    *out = buf;
    *len_out = n;
    return KILN_OK;
}

static kiln_status json_value(struct rd *r, struct xd *v, int depth);

static kiln_status json_container(struct rd *r, struct xd *v, int depth, int obj)
{
    struct list l = {.all_num = 1};
    r->p++; /* [ or { */
    skip_ws(r);
    char close = obj ? '}' : ']';
    if (r->p < r->end && *r->p == close) {
        r->p++;
        return list_finish(r, &l, obj, v);
    }
    for (;;) {
        const char *key = NULL;
        size_t klen;
        kiln_status st;
        if (obj) {
            skip_ws(r);
            if ((st = json_string(r, &key, &klen)) != KILN_OK) goto fail;
            skip_ws(r);
            if (r->p >= r->end || *r->p != ':') {
                st = perr(r, "expected ':'");
                goto fail;
            }
            r->p++;
        }
        struct xd item;
        if ((st = json_value(r, &item, depth + 1)) != KILN_OK) goto fail;
        if ((st = list_push(&l, &item, key)) != KILN_OK) goto fail;
        skip_ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            continue;
        }
        if (r->p < r->end && *r->p == close) {
            r->p++;
            return list_finish(r, &l, obj, v);
        }
        st = perr(r, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    fail:
        list_drop(&l);
        return st;
    }
}

static kiln_status json_value(struct rd *r, struct xd *v, int depth)
{
    memset(v, 0, sizeof *v);
    if (depth > XD_MAX_DEPTH) return perr(r, "nesting too deep");
    skip_ws(r);
    if (r->p >= r->end) return perr(r, "unexpected end");
    unsigned char c = *r->p;
    if (c == '{' || c == '[') return json_container(r, v, depth, c == '{');
    if (c == '"') {
        v->t = XD_STR;
        return json_string(r, &v->s, &v->len);
    }
    static const struct { const char *w; enum xd_type t; double num; } words[] = {
        {"true", XD_BOOL, 1}, {"false", XD_BOOL, 0}, {"null", XD_NULL, 0},
        {"NaN", XD_NUM, NAN}, {"Infinity", XD_NUM, INFINITY}, {"-Infinity", XD_NUM, -INFINITY}};
    for (size_t k = 0; k < sizeof words / sizeof words[0]; k++) {
        size_t wl = strlen(words[k].w);
        if ((size_t)(r->end - r->p) >= wl && memcmp(r->p, words[k].w, wl) == 0) {
            r->p += wl;
            v->t = words[k].t;
            v->num = words[k].num;
            return KILN_OK;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        char buf[64];
        size_t n = 0;
        while (r->p + n < r->end && n < sizeof buf - 1 &&
               strchr("+-0123456789.eE", r->p[n]) && r->p[n])
            n++;
        memcpy(buf, r->p, n);
        buf[n] = '\0';
        char *e;
        v->num = strtod(buf, &e);
        if (e == buf) return perr(r, "bad number");
        r->p += e - buf;
        v->t = XD_NUM;
        return KILN_OK;
    }
    return perr(r, "unexpected character");
}

/* ---- UBJSON ---- */

static kiln_status ubj_need(struct rd *r, size_t n)
{
    return (size_t)(r->end - r->p) >= n ? KILN_OK : perr(r, "unexpected end");
}

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* A scalar of type marker m into v. */
static kiln_status ubj_scalar(struct rd *r, unsigned char m, struct xd *v, int depth);

static kiln_status ubj_int(struct rd *r, unsigned char m, int64_t *out)
{
    int n = m == 'i' || m == 'U' ? 1 : m == 'I' ? 2 : m == 'l' ? 4 : m == 'L' ? 8 : 0;
    if (!n) return perr(r, "expected an integer marker");
    kiln_status st = ubj_need(r, (size_t)n);
    if (st != KILN_OK) return st;
    uint64_t u = be(r->p, n);
    r->p += n;
    if (m == 'i') *out = (int8_t)u;
    else if (m == 'U') *out = (uint8_t)u;
    else if (m == 'I') *out = (int16_t)u;
    else if (m == 'l') *out = (int32_t)u;
    else *out = (int64_t)u;
    return KILN_OK;
}

static kiln_status ubj_length(struct rd *r, int64_t *n)
{
    kiln_status st = ubj_need(r, 1);
    if (st != KILN_OK) return st;
    unsigned char m = *r->p++;
    if ((st = ubj_int(r, m, n)) != KILN_OK) return st;
    if (*n < 0) return perr(r, "negative length");
    return KILN_OK;
}

static kiln_status ubj_str(struct rd *r, const char **out, size_t *len)
{
    int64_t n;
    kiln_status st = ubj_length(r, &n);
    if (st != KILN_OK) return st;
    if ((st = ubj_need(r, (size_t)n)) != KILN_OK) return st;
    char *s = kiln_arena_strndup(r->a, (const char *)r->p, (size_t)n);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    r->p += n;
    *out = s;
    *len = (size_t)n;
    return KILN_OK;
}

static size_t ubj_fixed_size(unsigned char m)
{
    switch (m) {
    case 'i': case 'U': case 'C': return 1;
    case 'I': return 2;
    case 'l': case 'd': return 4;
    case 'L': case 'D': return 8;
    default: return 0;
    }
}

static kiln_status ubj_container(struct rd *r, struct xd *v, int depth, int obj)
{
    unsigned char type = 0;
    int64_t count = -1;
    kiln_status st;
    if (r->p < r->end && *r->p == '$') {
        r->p++;
        if ((st = ubj_need(r, 1)) != KILN_OK) return st;
        type = *r->p++;
        if (r->p >= r->end || *r->p != '#') return perr(r, "a typed container needs a count");
    }
    if (r->p < r->end && *r->p == '#') {
        r->p++;
        if ((st = ubj_length(r, &count)) != KILN_OK) return st;
        /* every element takes at least a byte (a typed fixed-size one its size) */
        size_t per = type ? ubj_fixed_size(type) : 1;
        if (per == 0) per = 1;
        if ((uint64_t)count > (uint64_t)(r->end - r->p) / per) return perr(r, "count exceeds the file");
    }
    memset(v, 0, sizeof *v);
    if (!obj && type && ubj_fixed_size(type) && type != 'C') {
        /* a typed numeric array: straight into doubles */
        v->t = XD_NUMS;
        v->len = (size_t)count;
        v->nums = kiln_arena_alloc(r->a, sizeof(double) * ((size_t)count + 1));
        if (!v->nums) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        for (int64_t i = 0; i < count; i++) {
            if (type == 'd') {
                uint32_t u = (uint32_t)be(r->p, 4);
                float f;
                memcpy(&f, &u, 4);
                v->nums[i] = f;
                r->p += 4;
            } else if (type == 'D') {
                uint64_t u = be(r->p, 8);
                double d;
                memcpy(&d, &u, 8);
                v->nums[i] = d;
                r->p += 8;
            } else {
                int64_t iv;
                if ((st = ubj_int(r, type, &iv)) != KILN_OK) return st;
                v->nums[i] = (double)iv;
            }
        }
        return KILN_OK;
    }
    struct list l = {.all_num = 1};
    for (int64_t i = 0; count < 0 || i < count; i++) {
        if (count < 0) {
            if ((st = ubj_need(r, 1)) != KILN_OK) goto fail;
            if (*r->p == (obj ? '}' : ']')) {
                r->p++;
                break;
            }
            if (*r->p == 'N') { /* no-op */
                r->p++;
                i--;
                continue;
            }
        }
        const char *key = NULL;
        size_t klen;
        if (obj && (st = ubj_str(r, &key, &klen)) != KILN_OK) goto fail;
        struct xd item;
        unsigned char m = type;
        if (!m) {
            if ((st = ubj_need(r, 1)) != KILN_OK) goto fail;
            m = *r->p++;
        }
        if ((st = ubj_scalar(r, m, &item, depth + 1)) != KILN_OK) goto fail;
        if ((st = list_push(&l, &item, key)) != KILN_OK) goto fail;
    }
    return list_finish(r, &l, obj, v);
fail:
    list_drop(&l);
    return st;
}

static kiln_status ubj_scalar(struct rd *r, unsigned char m, struct xd *v, int depth)
{
    memset(v, 0, sizeof *v);
    if (depth > XD_MAX_DEPTH) return perr(r, "nesting too deep");
    kiln_status st;
    switch (m) {
    case '{': return ubj_container(r, v, depth, 1);
    case '[': return ubj_container(r, v, depth, 0);
    case 'Z': v->t = XD_NULL; return KILN_OK;
    case 'T': v->t = XD_BOOL; v->num = 1; return KILN_OK;
    case 'F': v->t = XD_BOOL; v->num = 0; return KILN_OK;
    case 'S': v->t = XD_STR; return ubj_str(r, &v->s, &v->len);
    case 'H': {
        const char *s;
        size_t n;
        if ((st = ubj_str(r, &s, &n)) != KILN_OK) return st;
        char *e;
        v->num = strtod(s, &e);
        if (e == s) return perr(r, "bad high-precision number");
        v->t = XD_NUM;
        return KILN_OK;
    }
    case 'C': {
        if ((st = ubj_need(r, 1)) != KILN_OK) return st;
        char *s = kiln_arena_strndup(r->a, (const char *)r->p, 1);
        if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        r->p++;
        v->t = XD_STR;
        v->s = s;
        v->len = 1;
        return KILN_OK;
    }
    case 'd': case 'D': {
        size_t n = m == 'd' ? 4 : 8;
        if ((st = ubj_need(r, n)) != KILN_OK) return st;
        uint64_t u = be(r->p, (int)n);
        r->p += n;
        if (m == 'd') {
            uint32_t u32 = (uint32_t)u;
            float f;
            memcpy(&f, &u32, 4);
            v->num = f;
        } else {
            memcpy(&v->num, &u, 8);
        }
        v->t = XD_NUM;
        return KILN_OK;
    }
    default: {
        int64_t iv;
        if ((st = ubj_int(r, m, &iv)) != KILN_OK) return perr(r, "unknown UBJSON marker");
        v->t = XD_NUM;
        v->num = (double)iv;
        return KILN_OK;
    }
    }
}

/* ---- the document ---- */

kiln_status xd_parse(const void *data, size_t size, int ubj, struct xd_doc *doc)
{
    memset(doc, 0, sizeof *doc);
    struct rd r = {data, (const unsigned char *)data + size, &doc->arena, data};
    kiln_status st;
    if (ubj) {
        st = ubj_need(&r, 1);
        if (st == KILN_OK) {
            unsigned char m = *r.p++;
            st = ubj_scalar(&r, m, &doc->root, 0);
        }
    } else {
        st = json_value(&r, &doc->root, 0);
        if (st == KILN_OK) {
            skip_ws(&r);
            if (r.p != r.end) st = perr(&r, "trailing bytes after the document");
        }
    }
    if (st != KILN_OK) xd_free(doc);
    return st;
}

void xd_free(struct xd_doc *doc)
{
    kiln_arena_free(&doc->arena);
    memset(doc, 0, sizeof *doc);
}

const struct xd *xd_get(const struct xd *obj, const char *key)
{
    if (!obj || obj->t != XD_OBJ) return NULL;
    for (size_t i = 0; i < obj->len; i++)
        if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
    return NULL;
}

long long xd_count(const struct xd *v)
{
    if (!v || (v->t != XD_ARR && v->t != XD_NUMS)) return -1;
    return (long long)v->len;
}

double xd_num_at(const struct xd *v, size_t i, int *ok)
{
    if (v && v->t == XD_NUMS && i < v->len) return v->nums[i];
    if (v && v->t == XD_ARR && i < v->len &&
        (v->items[i].t == XD_NUM || v->items[i].t == XD_BOOL))
        return v->items[i].num;
    *ok = 0;
    return 0;
}
