/*
 * npy.c - the NumPy .npy reader and writer (see include/kiln/kiln_util.h for the contract).
 *
 * The format: the magic "\x93NUMPY", a major and minor version byte, the
 * header length (uint16 LE for 1.0, uint32 LE for 2.0 and 3.0), then the
 * header, a Python dict literal such as
 *
 *     {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 *
 * padded with spaces and ended by '\n', then the raw elements in C order.
 *
 * Reading goes through one small source that is either a stream (a regular
 * file, read straight into the tensor's storage without a second copy) or
 * bytes in memory, so files, HTTP bodies and the fuzzer share one parser.
 * Writing goes through a matching sink (a FILE or a growing buffer).
 */
#include "kiln/kiln_util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


static _Thread_local char npy_err[512];

/* Record a message for st and return st. */
static kiln_status npy_fail(kiln_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static kiln_status npy_fail(kiln_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(npy_err, sizeof npy_err, fmt, ap);
    va_end(ap);
    return st;
}

const char *kiln_npy_last_error(void)
{
    return npy_err;
}

static bool host_is_little_endian(void)
{
    const uint16_t one = 1;
    uint8_t b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* Reverse the bytes of each of n items of size w, in place. */
static void swap_items(void *data, size_t n, size_t w)
{
    uint8_t *p = data;
    for (size_t i = 0; i < n; i++, p += w)
        for (size_t a = 0, b = w - 1; a < b; a++, b--) {
            uint8_t t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

/* ---------------------------------------------------------------- reading */

typedef struct npy_src {
    const char *what;    /* names the bytes in messages */
    FILE *f;             /* a stream, or NULL when reading mem */
    const uint8_t *mem;  /* the bytes when f is NULL */
    uint64_t size;       /* total bytes */
    uint64_t pos;        /* bytes consumed */
} npy_src;

/* Read exactly n bytes; at a short read, say which part was cut. */
static kiln_status src_read(npy_src *s, void *dst, size_t n, const char *part)
{
    if (n > s->size - s->pos)
        return npy_fail(KILN_ERR_INVALID_ARGUMENT, "%s: truncated in the %s (%llu bytes in all)",
                        s->what, part, (unsigned long long)s->size);
    if (s->f) {
        if (n && fread(dst, 1, n, s->f) != n)
            return npy_fail(KILN_ERR_IO, "%s: read failed in the %s: %s", s->what, part,
                            ferror(s->f) ? strerror(errno) : "unexpected end of file");
    } else if (n) {
        memcpy(dst, s->mem + s->pos, n);
    }
    s->pos += n;
    return KILN_OK;
}

/* The element type a descr names, and how to turn file bytes into it. */
typedef struct npy_dtype {
    kiln_dtype dt;    /* what the tensor holds */
    char kind;        /* 'f', 'i', 'u', 'b', 'S' or 'U' */
    bool swap;        /* file byte order differs from the host's */
    size_t itemsize;  /* bytes per element in the file */
} npy_dtype;

/* What the parsed header said. */
typedef struct npy_header {
    char descr[32];
    int rank;
    int64_t dims[KILN_MAX_RANK];
    bool fortran_order;
} npy_header;

/* A cursor over the header text. */
typedef struct hdr_cursor {
    const char *p;
    const char *end;
    const char *what;
} hdr_cursor;

static void hdr_skip_ws(hdr_cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

/* Consume ch after optional whitespace; false if it is not there. */
static bool hdr_accept(hdr_cursor *c, char ch)
{
    hdr_skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

static kiln_status hdr_error(const hdr_cursor *c, const char *problem)
{
    return npy_fail(KILN_ERR_INVALID_ARGUMENT, "%s: malformed .npy header: %s", c->what, problem);
}

/* A quoted Python string without escapes, into buf (NUL-terminated). */
static kiln_status hdr_string(hdr_cursor *c, char *buf, size_t cap, const char *what_str)
{
    hdr_skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
        return hdr_error(c, "expected a quoted string");
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        unsigned char ch = (unsigned char)*c->p;
        if (ch == '\\' || ch < 0x20 || ch >= 0x7f) /* plain dtypes and keys are ASCII */
            return hdr_error(c, "unsupported character in a string");
        if (n + 1 >= cap)
            return npy_fail(KILN_ERR_UNSUPPORTED, "%s: .npy header %s is too long", c->what,
                            what_str);
        buf[n++] = *c->p++;
    }
    if (c->p >= c->end) return hdr_error(c, "unterminated string");
    c->p++;
    buf[n] = '\0';
    return KILN_OK;
}

/* A non-negative decimal integer (Python 2's "L" suffix allowed). */
static kiln_status hdr_int(hdr_cursor *c, int64_t *out)
{
    hdr_skip_ws(c);
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') {
        if (c->p < c->end && *c->p == '-')
            return npy_fail(KILN_ERR_INVALID_ARGUMENT, "%s: .npy shape has a negative dimension",
                            c->what);
        return hdr_error(c, "expected a dimension in 'shape'");
    }
    int64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        int d = *c->p++ - '0';
        if (v > (INT64_MAX - d) / 10)
            return npy_fail(KILN_ERR_INVALID_ARGUMENT,
                            "%s: .npy shape has a dimension too large for 64 bits", c->what);
        v = v * 10 + d;
    }
    if (c->p < c->end && (*c->p == 'L' || *c->p == 'l')) c->p++;
    *out = v;
    return KILN_OK;
}

/* A shape tuple: (), (n,) or (a, b, ...). */
static kiln_status hdr_shape(hdr_cursor *c, npy_header *h)
{
    if (!hdr_accept(c, '(')) return hdr_error(c, "'shape' is not a tuple");
    h->rank = 0;
    if (hdr_accept(c, ')')) return KILN_OK;
    for (;;) {
        int64_t d = 0;
        kiln_status st = hdr_int(c, &d);
        if (st != KILN_OK) return st;
        if (h->rank == KILN_MAX_RANK)
            return npy_fail(KILN_ERR_UNSUPPORTED,
                            "%s: .npy array has more than %d dimensions, Kiln's maximum",
                            c->what, KILN_MAX_RANK);
        h->dims[h->rank++] = d;
        if (hdr_accept(c, ')')) return KILN_OK;
        if (!hdr_accept(c, ',')) return hdr_error(c, "expected ',' or ')' in 'shape'");
        if (hdr_accept(c, ')')) return KILN_OK;
    }
}

/* Python's True or False. */
static kiln_status hdr_bool(hdr_cursor *c, bool *out)
{
    hdr_skip_ws(c);
    size_t left = (size_t)(c->end - c->p);
    if (left >= 4 && memcmp(c->p, "True", 4) == 0) {
        c->p += 4;
        *out = true;
        return KILN_OK;
    }
    if (left >= 5 && memcmp(c->p, "False", 5) == 0) {
        c->p += 5;
        *out = false;
        return KILN_OK;
    }
    return hdr_error(c, "'fortran_order' is not True or False");
}

/* Parse the header dict; exactly the keys descr, fortran_order, shape. */
static kiln_status hdr_parse(const char *text, size_t len, const char *what, npy_header *h)
{
    hdr_cursor c = {text, text + len, what};
    bool have_descr = false, have_fortran = false, have_shape = false;
    if (!hdr_accept(&c, '{')) return hdr_error(&c, "does not start with '{'");
    for (;;) {
        if (hdr_accept(&c, '}')) break;
        char key[32];
        kiln_status st = hdr_string(&c, key, sizeof key, "key");
        if (st != KILN_OK) return st;
        if (!hdr_accept(&c, ':')) return hdr_error(&c, "expected ':' after a key");
        bool *seen;
        if (strcmp(key, "descr") == 0) {
            seen = &have_descr;
            hdr_skip_ws(&c);
            if (c.p < c.end && *c.p == '[')
                return npy_fail(KILN_ERR_UNSUPPORTED,
                                "%s: structured .npy dtypes are not supported", what);
            st = hdr_string(&c, h->descr, sizeof h->descr, "'descr'");
        } else if (strcmp(key, "fortran_order") == 0) {
            seen = &have_fortran;
            st = hdr_bool(&c, &h->fortran_order);
        } else if (strcmp(key, "shape") == 0) {
            seen = &have_shape;
            st = hdr_shape(&c, h);
        } else {
            return npy_fail(KILN_ERR_INVALID_ARGUMENT, "%s: .npy header has unexpected key '%s'",
                            what, key);
        }
        if (st != KILN_OK) return st;
        if (*seen)
            return npy_fail(KILN_ERR_INVALID_ARGUMENT, "%s: .npy header repeats key '%s'", what,
                            key);
        *seen = true;
        if (hdr_accept(&c, '}')) break;
        if (!hdr_accept(&c, ',')) return hdr_error(&c, "expected ',' or '}'");
    }
    hdr_skip_ws(&c);
    if (c.p != c.end) return hdr_error(&c, "text after the closing '}'");
    if (!have_descr || !have_fortran || !have_shape)
        return npy_fail(KILN_ERR_INVALID_ARGUMENT, "%s: .npy header lacks '%s'", what,
                        !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");
    return KILN_OK;
}

/* Map a descr such as "<f4" or "|S10" to a Kiln dtype. */
static kiln_status dtype_from_descr(const char *descr, const char *what, npy_dtype *out)
{
    const char *p = descr;
    char order = '=';
    if (*p == '<' || *p == '>' || *p == '|' || *p == '=') order = *p++;
    char kind = *p ? *p++ : '\0';
    if (*p < '0' || *p > '9') goto unsupported;
    uint64_t n = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        n = n * 10 + (uint64_t)(*p - '0');
        if (n > (1u << 30)) goto unsupported;
    }
    if (*p) goto unsupported;
    kiln_dtype dt = KILN_DTYPE_UNDEFINED;
    size_t itemsize = (size_t)n;
    switch (kind) {
    case 'f':
        dt = n == 2 ? KILN_DTYPE_F16 : n == 4 ? KILN_DTYPE_F32 : n == 8 ? KILN_DTYPE_F64
                                                                        : KILN_DTYPE_UNDEFINED;
        break;
    case 'i':
        dt = n == 1 ? KILN_DTYPE_I8 : n == 2 ? KILN_DTYPE_I16 : n == 4 ? KILN_DTYPE_I32
             : n == 8 ? KILN_DTYPE_I64 : KILN_DTYPE_UNDEFINED;
        break;
    case 'u':
        dt = n == 1 ? KILN_DTYPE_U8 : n == 2 ? KILN_DTYPE_U16 : n == 4 ? KILN_DTYPE_U32
             : n == 8 ? KILN_DTYPE_U64 : KILN_DTYPE_UNDEFINED;
        break;
    case 'b':
        dt = n == 1 ? KILN_DTYPE_BOOL : KILN_DTYPE_UNDEFINED;
        break;
    case 'S':
        dt = KILN_DTYPE_STRING;
        break;
    case 'U':
        dt = KILN_DTYPE_STRING;
        itemsize = 4 * (size_t)n; /* UTF-32 code units */
        break;
    default:
        break;
    }
    if (dt == KILN_DTYPE_UNDEFINED) goto unsupported;
    if (itemsize == 0) /* else a tiny file could declare any number of elements */
        return npy_fail(KILN_ERR_INVALID_ARGUMENT, "%s: .npy dtype '%s' has zero item size", what,
                        descr);
    /* '|' (no byte order) only makes sense where order cannot matter */
    size_t unit = kind == 'U' ? 4 : kind == 'S' ? 1 : itemsize;
    if (order == '|' && unit > 1)
        return npy_fail(KILN_ERR_INVALID_ARGUMENT, "%s: .npy dtype '%s' lacks a byte order", what,
                        descr);
    bool file_le = order == '<' || (order != '>' && host_is_little_endian());
    out->dt = dt;
    out->kind = kind;
    out->swap = unit > 1 && file_le != host_is_little_endian();
    out->itemsize = itemsize;
    return KILN_OK;

unsupported:
    return npy_fail(KILN_ERR_UNSUPPORTED, "%s: .npy dtype '%s' is not supported", what, descr);
}

/* Format a shape as NumPy does, e.g. "(2, 3)" or "(5,)". */
static const char *shape_repr(int rank, const int64_t *dims, char *buf, size_t cap)
{
    size_t k = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < rank && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, i ? ", %lld" : "%lld", (long long)dims[i]);
    if (k < cap) snprintf(buf + k, cap - k, rank == 1 ? ",)" : ")");
    return buf;
}

/* Append the UTF-8 encoding of code point cp at out; returns bytes written. */
static size_t utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Read count string elements ('S' or 'U') into the string tensor t. */
static kiln_status read_strings(npy_src *s, const npy_dtype *ty, uint64_t count, kiln_tensor *t)
{
    size_t w = ty->itemsize;
    char *item = malloc(w ? w : 1);
    char *utf8 = malloc(w ? w : 1); /* a UTF-32 unit never needs more than 4 UTF-8 bytes */
    kiln_status st = KILN_OK;
    if (!item || !utf8) {
        st = npy_fail(KILN_ERR_OUT_OF_MEMORY, "%s: out of memory reading strings", s->what);
        goto out_free;
    }
    for (uint64_t i = 0; i < count; i++) {
        st = src_read(s, item, w, "data");
        if (st != KILN_OK) goto out_free;
        const char *bytes = item;
        size_t len;
        if (ty->kind == 'S') {
            len = w;
            while (len > 0 && item[len - 1] == '\0') len--;
        } else {
            size_t units = w / 4;
            if (ty->swap) swap_items(item, units, 4);
            while (units > 0) {
                uint32_t last;
                memcpy(&last, item + 4 * (units - 1), 4);
                if (last != 0) break;
                units--;
            }
            len = 0;
            for (size_t u = 0; u < units; u++) {
                uint32_t cp;
                memcpy(&cp, item + 4 * u, 4);
                if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
                    st = npy_fail(KILN_ERR_INVALID_ARGUMENT,
                                  "%s: string element %llu holds U+%X, which is not a valid "
                                  "Unicode scalar value",
                                  s->what, (unsigned long long)i, (unsigned)cp);
                    goto out_free;
                }
                len += utf8_put(cp, utf8 + len);
            }
            bytes = utf8;
        }
        st = kiln_tensor_set_string(t, (size_t)i, bytes, len);
        if (st != KILN_OK) {
            npy_fail(st, "%s: %s", s->what, kiln_last_error());
            goto out_free;
        }
    }
out_free:
    free(utf8);
    free(item);
    return st;
}

/* Parse a whole .npy from s into a new tensor. */
static kiln_status npy_read_src(npy_src *s, kiln_tensor **out)
{
    uint8_t pre[12];
    if (s->size < 10)
        return npy_fail(KILN_ERR_INVALID_ARGUMENT, "%s: not a .npy file (%llu bytes, too short)",
                        s->what, (unsigned long long)s->size);
    kiln_status st = src_read(s, pre, 8, "magic");
    if (st != KILN_OK) return st;
    if (memcmp(pre, "\x93NUMPY", 6) != 0)
        return npy_fail(KILN_ERR_INVALID_ARGUMENT, "%s: not a .npy file (bad magic)", s->what);
    unsigned major = pre[6], minor = pre[7];
    uint32_t hlen;
    if (major == 1 && minor == 0) {
        st = src_read(s, pre + 8, 2, "header length");
        if (st != KILN_OK) return st;
        hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8;
    } else if ((major == 2 || major == 3) && minor == 0) {
        st = src_read(s, pre + 8, 4, "header length");
        if (st != KILN_OK) return st;
        hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8 | (uint32_t)pre[10] << 16 |
               (uint32_t)pre[11] << 24;
    } else {
        return npy_fail(KILN_ERR_UNSUPPORTED, "%s: .npy format version %u.%u is not supported",
                        s->what, major, minor);
    }
    if (hlen > KILN_NPY_MAX_HEADER)
        return npy_fail(KILN_ERR_INVALID_ARGUMENT,
                        "%s: .npy header length %u exceeds the limit of %u bytes", s->what, hlen,
                        KILN_NPY_MAX_HEADER);
    if (hlen > s->size - s->pos)
        return npy_fail(KILN_ERR_INVALID_ARGUMENT,
                        "%s: truncated in the header (header length %u, %llu bytes in all)",
                        s->what, hlen, (unsigned long long)s->size);
    char *text = malloc(hlen ? hlen : 1);
    if (!text) return npy_fail(KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", s->what);
    npy_header h;
    memset(&h, 0, sizeof h);
    st = src_read(s, text, hlen, "header");
    if (st == KILN_OK) st = hdr_parse(text, hlen, s->what, &h);
    free(text);
    if (st != KILN_OK) return st;

    char shape[KILN_MAX_RANK * 22 + 8];
    shape_repr(h.rank, h.dims, shape, sizeof shape);
    if (h.fortran_order)
        return npy_fail(KILN_ERR_UNSUPPORTED,
                        "%s: .npy array is in Fortran order; Kiln reads C order only "
                        "(save np.ascontiguousarray(a))",
                        s->what);
    npy_dtype ty = {KILN_DTYPE_UNDEFINED, 0, false, 0};
    st = dtype_from_descr(h.descr, s->what, &ty);
    if (st != KILN_OK) return st;

    /* element count and data bytes, refusing anything past int64 */
    uint64_t count = 1;
    bool empty = false;
    for (int i = 0; i < h.rank; i++) {
        if (h.dims[i] == 0) empty = true;
        else if (count > (uint64_t)INT64_MAX / (uint64_t)h.dims[i]) count = UINT64_MAX;
        else count *= (uint64_t)h.dims[i];
    }
    if (empty) count = 0;
    uint64_t unit = ty.itemsize ? ty.itemsize : 1;
    if (count > (uint64_t)INT64_MAX / unit)
        return npy_fail(KILN_ERR_INVALID_ARGUMENT, "%s: .npy shape %s of '%s' is too large",
                        s->what, shape, h.descr);
    uint64_t want = count * ty.itemsize;
    uint64_t have = s->size - s->pos;
    if (have != want)
        return npy_fail(KILN_ERR_INVALID_ARGUMENT,
                        "%s: .npy data is %llu bytes but shape %s of '%s' needs %llu", s->what,
                        (unsigned long long)have, shape, h.descr, (unsigned long long)want);

    kiln_tensor *t;
    st = kiln_tensor_create(ty.dt, h.rank, h.dims, &t);
    if (st != KILN_OK) return npy_fail(st, "%s: %s", s->what, kiln_last_error());
    if (ty.dt == KILN_DTYPE_STRING) {
        st = read_strings(s, &ty, count, t);
        if (st != KILN_OK) goto err_free_tensor;
    } else {
        if (t->nbytes != want) { /* defensive: Kiln's size disagrees with NumPy's */
            st = npy_fail(KILN_ERR_INTERNAL, "%s: tensor holds %zu bytes, file %llu", s->what,
                          t->nbytes, (unsigned long long)want);
            goto err_free_tensor;
        }
        st = src_read(s, t->data, (size_t)want, "data");
        if (st != KILN_OK) goto err_free_tensor;
        if (ty.swap) swap_items(t->data, (size_t)count, ty.itemsize);
        if (ty.dt == KILN_DTYPE_BOOL) {
            uint8_t *b = t->data;
            for (uint64_t i = 0; i < count; i++) b[i] = b[i] != 0;
        }
    }
    *out = t;
    return KILN_OK;

err_free_tensor:
    kiln_tensor_free(t);
    return st;
}

kiln_status kiln_npy_parse(const void *data, size_t size, const char *what, kiln_tensor **out)
{
    if (!out || (!data && size))
        return npy_fail(KILN_ERR_INVALID_ARGUMENT, "kiln_npy_parse: NULL argument");
    npy_src s = {what ? what : "npy", NULL, data, size, 0};
    return npy_read_src(&s, out);
}

/* Read all of a non-seekable stream (a pipe) into memory, then parse it. */
static kiln_status npy_read_unsized(FILE *f, const char *path, kiln_tensor **out)
{
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    if (!buf) return npy_fail(KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    for (;;) {
        if (len == cap) {
            uint8_t *bigger = cap < SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!bigger) {
                free(buf);
                return npy_fail(KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
            }
            buf = bigger;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    kiln_status st;
    if (ferror(f))
        st = npy_fail(KILN_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    else
        st = kiln_npy_parse(buf, len, path, out);
    free(buf);
    return st;
}

kiln_status kiln_npy_read(const char *path, kiln_tensor **out)
{
    if (!path || !out) return npy_fail(KILN_ERR_INVALID_ARGUMENT, "kiln_npy_read: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f)
        return npy_fail(errno == ENOENT ? KILN_ERR_NOT_FOUND : KILN_ERR_IO, "%s: cannot open: %s",
                        path, strerror(errno));
    struct stat sb;
    kiln_status st;
    if (fstat(fileno(f), &sb) != 0) {
        st = npy_fail(KILN_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        st = npy_fail(KILN_ERR_INVALID_ARGUMENT, "%s: is a directory, not a .npy file", path);
    } else if (!S_ISREG(sb.st_mode)) {
        st = npy_read_unsized(f, path, out);
    } else {
        npy_src s = {path, f, NULL, (uint64_t)sb.st_size, 0};
        st = npy_read_src(&s, out);
    }
    fclose(f);
    return st;
}

/* ---------------------------------------------------------------- writing */

typedef struct npy_sink {
    FILE *f;       /* the stream, or NULL to collect into buf */
    uint8_t *buf;  /* collected bytes when f is NULL */
    size_t len;    /* bytes in buf */
    size_t cap;    /* bytes allocated at buf */
    bool failed;   /* a write or allocation failed; later writes are skipped */
} npy_sink;

static void sink_put(npy_sink *k, const void *p, size_t n)
{
    if (k->failed || n == 0) return;
    if (k->f) {
        if (fwrite(p, 1, n, k->f) != n) k->failed = true;
        return;
    }
    if (n > k->cap - k->len) {
        size_t cap = k->cap ? k->cap : 256;
        while (cap - k->len < n) {
            if (cap > SIZE_MAX / 2) {
                k->failed = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *bigger = realloc(k->buf, cap);
        if (!bigger) {
            k->failed = true;
            return;
        }
        k->buf = bigger;
        k->cap = cap;
    }
    memcpy(k->buf + k->len, p, n);
    k->len += n;
}

/* Write n zero bytes. */
static void sink_zeros(npy_sink *k, size_t n)
{
    static const uint8_t zeros[256];
    while (n > 0 && !k->failed) {
        size_t m = n < sizeof zeros ? n : sizeof zeros;
        sink_put(k, zeros, m);
        n -= m;
    }
}

/* The descr NumPy uses for a Kiln dtype in host byte order ("" if none). */
static const char *descr_for(kiln_dtype dt)
{
    bool le = host_is_little_endian();
    switch (dt) {
    case KILN_DTYPE_F16: return le ? "<f2" : ">f2";
    case KILN_DTYPE_BF16: /* widened */
    case KILN_DTYPE_F32: return le ? "<f4" : ">f4";
    case KILN_DTYPE_F64: return le ? "<f8" : ">f8";
    case KILN_DTYPE_I8: return "|i1";
    case KILN_DTYPE_U8: return "|u1";
    case KILN_DTYPE_I16: return le ? "<i2" : ">i2";
    case KILN_DTYPE_U16: return le ? "<u2" : ">u2";
    case KILN_DTYPE_I32: return le ? "<i4" : ">i4";
    case KILN_DTYPE_U32: return le ? "<u4" : ">u4";
    case KILN_DTYPE_I64: return le ? "<i8" : ">i8";
    case KILN_DTYPE_U64: return le ? "<u8" : ">u8";
    case KILN_DTYPE_BOOL: return "|b1";
    default: return "";
    }
}

/* Write t to the sink: header, then elements. */
static kiln_status npy_encode_sink(const kiln_tensor *t, npy_sink *k)
{
    if (!t) return npy_fail(KILN_ERR_INVALID_ARGUMENT, "cannot write a NULL tensor as .npy");
    if (t->rank < 0 || t->rank > KILN_MAX_RANK)
        return npy_fail(KILN_ERR_INVALID_ARGUMENT, "cannot write a tensor of rank %d as .npy",
                        t->rank);
    uint64_t count = 1;
    for (int i = 0; i < t->rank; i++) {
        if (t->dims[i] < 0)
            return npy_fail(KILN_ERR_INVALID_ARGUMENT,
                            "cannot write a tensor with dimension %lld as .npy",
                            (long long)t->dims[i]);
        if (t->dims[i] && count > (uint64_t)INT64_MAX / (uint64_t)t->dims[i]) count = UINT64_MAX;
        else count *= (uint64_t)t->dims[i];
    }
    size_t es = kiln_dtype_size(t->dtype);
    if (es == 0 || count > SIZE_MAX / es || count * es != t->nbytes || (t->nbytes && !t->data))
        return npy_fail(KILN_ERR_INVALID_ARGUMENT,
                        "cannot write a %s tensor whose %zu bytes do not match its shape",
                        kiln_dtype_name(t->dtype), t->nbytes);

    char descr[32];
    size_t maxlen = 1; /* 'S0' is not a real NumPy dtype */
    const kiln_string *strs = t->data;
    if (t->dtype == KILN_DTYPE_STRING) {
        for (uint64_t i = 0; i < count; i++)
            if (strs[i].len > maxlen) maxlen = strs[i].len;
        if (count && maxlen > SIZE_MAX / count)
            return npy_fail(KILN_ERR_OUT_OF_MEMORY, "string tensor too large to write as .npy");
        snprintf(descr, sizeof descr, "|S%zu", maxlen);
    } else {
        snprintf(descr, sizeof descr, "%s", descr_for(t->dtype));
        if (!descr[0])
            return npy_fail(KILN_ERR_UNSUPPORTED, "NumPy has no dtype for Kiln's %s",
                            kiln_dtype_name(t->dtype));
    }

    /* header: the dict, spaces, '\n', so that the data starts 64-aligned */
    char shape[KILN_MAX_RANK * 22 + 8];
    char dict[sizeof shape + 96];
    int dlen = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                        descr, shape_repr(t->rank, t->dims, shape, sizeof shape));
    size_t hlen = (size_t)dlen + 1;
    hlen += (64 - (10 + hlen) % 64) % 64;
    uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(hlen & 0xff),
                       (uint8_t)(hlen >> 8)};
    sink_put(k, pre, sizeof pre);
    sink_put(k, dict, (size_t)dlen);
    for (size_t i = (size_t)dlen; i + 1 < hlen; i++) sink_put(k, " ", 1);
    sink_put(k, "\n", 1);

    if (t->dtype == KILN_DTYPE_STRING) {
        for (uint64_t i = 0; i < count; i++) {
            if (strs[i].len) sink_put(k, strs[i].data, strs[i].len);
            sink_zeros(k, maxlen - strs[i].len);
        }
    } else if (t->dtype == KILN_DTYPE_BF16) {
        const uint16_t *src = t->data;
        float chunk[256];
        for (uint64_t i = 0; i < count;) {
            size_t m = 0;
            for (; m < 256 && i < count; m++, i++) chunk[m] = kiln_bf16_to_f32(src[i]);
            sink_put(k, chunk, m * sizeof chunk[0]);
        }
    } else {
        sink_put(k, t->data, t->nbytes);
    }
    if (k->failed)
        return npy_fail(k->f ? KILN_ERR_IO : KILN_ERR_OUT_OF_MEMORY, "writing .npy failed: %s",
                        k->f ? strerror(errno) : "out of memory");
    return KILN_OK;
}

kiln_status kiln_npy_encode(const kiln_tensor *t, void **data_out, size_t *size_out)
{
    if (!data_out || !size_out)
        return npy_fail(KILN_ERR_INVALID_ARGUMENT, "kiln_npy_encode: NULL argument");
    npy_sink k = {0};
    kiln_status st = npy_encode_sink(t, &k);
    if (st != KILN_OK) {
        free(k.buf);
        return st;
    }
    *data_out = k.buf;
    *size_out = k.len;
    return KILN_OK;
}

kiln_status kiln_npy_write(const char *path, const kiln_tensor *t)
{
    if (!path) return npy_fail(KILN_ERR_INVALID_ARGUMENT, "kiln_npy_write: NULL path");
    FILE *f = fopen(path, "wb");
    if (!f) return npy_fail(KILN_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    npy_sink k = {.f = f};
    kiln_status st = npy_encode_sink(t, &k);
    if (st == KILN_OK && fflush(f) != 0)
        st = npy_fail(KILN_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    if (fclose(f) != 0 && st == KILN_OK)
        st = npy_fail(KILN_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    if (st != KILN_OK) {
        /* name the file in messages from the encoder too */
        if (strncmp(npy_err, path, strlen(path)) != 0) {
            char msg[sizeof npy_err];
            snprintf(msg, sizeof msg, "%s", npy_err);
            npy_fail(st, "%s: %s", path, msg);
        }
        remove(path);
    }
    return st;
}
