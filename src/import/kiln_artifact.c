/*
 * kiln_artifact.c - the reader of compiled artifacts (.kiln files,
 * docs/KILN_FORMAT.md), behind kiln_model_load.
 *
 * A .kiln file holds a graph that Kiln's optimizer already rewrote, so
 * loading one is reading, not importing: the header, the section table and
 * every section's CRC-32C are checked, the graph and signature are rebuilt
 * in a fresh IR graph, and constant tensors point into the mapped weight
 * section (64-byte aligned, used in place; the model keeps the mapping). The
 * bytes are untrusted: every count, length, offset and id is checked against
 * what is left before it is used, and the first problem becomes an error
 * naming the file, the section, the byte offset and the bad value
 * (fuzz/fuzz_kiln_artifact.c feeds it hostile bytes). A file whose kernels
 * need a CPU feature this machine lacks is refused, naming the feature.
 */
#define _GNU_SOURCE
#include "import/kiln_artifact.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/crc32c.h"
#include "core/dtype.h"
#include "core/tensor.h"

#define MAX_GRAPH_DEPTH 64

/* Fuzzing builds (cmake -DKILN_FUZZ=ON defines this) compute every CRC but
 * do not stop at a mismatch, so that mutated inputs reach the parsing behind
 * the checksums. The normal build, and the corpus replay in it, always check. */
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define ART_CHECK_CRC 0
#else
#define ART_CHECK_CRC 1
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kiln_artifact.c reads little-endian tensor data in place; big-endian hosts need byte swaps"
#endif

/* A bounds-checked cursor over one section. */
struct rd {
    const uint8_t *p;
    size_t n, off;
    const char *file;
    uint32_t sec;
    kiln_status st;
    struct kiln_graph *root;
    const uint8_t *wbase;  /* the weight section */
    size_t wsize;
    int depth;
    uint32_t version;      /* the file's format version */
};

static const char *sec_name(uint32_t kind, char buf[8])
{
    for (int i = 0; i < 4; i++) {
        char c = (char)(kind >> (8 * i));
        buf[i] = c >= 32 && c < 127 ? c : '?';
    }
    buf[4] = '\0';
    return buf;
}

/* GRPZ (format version 3): u64 the inflated length, then a zlib stream of
 * exactly that many bytes. The length is bounded before anything is
 * allocated: at most KILN_ART_GRPZ_MAX, and at most what deflate's best
 * ratio (1032 : 1) can give from the stream's bytes, so a small file cannot
 * ask for a large buffer. */
static kiln_status inflate_graph(const char *name, const uint8_t *p, size_t n, uint8_t **out,
                                 size_t *out_n)
{
    *out = NULL;
    *out_n = 0;
    uint64_t raw;
    if (n < 8)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: section GRPZ: %zu bytes, fewer than its "
                          "8-byte length", name, n);
    memcpy(&raw, p, 8); /* little-endian hosts only, as the rest of the reader */
    if (raw == 0 || raw > KILN_ART_GRPZ_MAX || raw / 1032 > (uint64_t)(n - 8))
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: section GRPZ: an inflated graph of %llu "
                          "bytes from %zu deflated ones is not possible (at most %llu, and 1032 "
                          "per deflated byte): the file is corrupted", name,
                          (unsigned long long)raw, n - 8, (unsigned long long)KILN_ART_GRPZ_MAX);
    uint8_t *buf = malloc((size_t)raw);
    if (!buf) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "%s: out of memory for the graph (%llu "
                                "bytes)", name, (unsigned long long)raw);
    uLongf got = (uLongf)raw;
    int zr = uncompress(buf, &got, p + 8, (uLong)(n - 8));
    if (zr != Z_OK || got != raw) {
        free(buf);
        if (zr == Z_OK)
            return kiln_error(KILN_ERR_INVALID_MODEL, "%s: section GRPZ: the deflated graph "
                              "inflates to %llu bytes, not the %llu its length says: the file is "
                              "corrupted", name, (unsigned long long)got, (unsigned long long)raw);
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: section GRPZ: the deflated graph does not "
                          "inflate to its %llu bytes (zlib: %s): the file is corrupted", name,
                          (unsigned long long)raw,
                          zr == Z_BUF_ERROR ? "the stream is longer than that, or cut short"
                          : zr == Z_DATA_ERROR ? "invalid or incomplete data"
                          : zr == Z_MEM_ERROR ? "out of memory" : "error");
    }
    *out = buf;
    *out_n = (size_t)raw;
    return KILN_OK;
}

/* Record the first failure: "FILE: section SECT at byte N: message". */
static void KILN_PRINTF(3, 4) rd_fail(struct rd *r, kiln_status st, const char *fmt, ...)
{
    if (r->st != KILN_OK) return;
    char msg[512], sb[8];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->st = kiln_error(st, "%s: section %s at byte %zu: %s", r->file, sec_name(r->sec, sb), r->off,
                       msg);
}

static int rd_need(struct rd *r, size_t k, const char *what)
{
    if (r->st != KILN_OK) return 0;
    if (k > r->n - r->off) {
        rd_fail(r, KILN_ERR_INVALID_MODEL, "%s needs %zu bytes, %zu left in the section", what, k,
                r->n - r->off);
        return 0;
    }
    return 1;
}

static uint32_t rd_u32(struct rd *r, const char *what)
{
    uint32_t v = 0;
    if (rd_need(r, 4, what)) memcpy(&v, r->p + r->off, 4), r->off += 4;
    return v;
}

static int32_t rd_i32(struct rd *r, const char *what) { return (int32_t)rd_u32(r, what); }

static int64_t rd_i64(struct rd *r, const char *what)
{
    int64_t v = 0;
    if (rd_need(r, 8, what)) memcpy(&v, r->p + r->off, 8), r->off += 8;
    return v;
}

static uint8_t rd_u8(struct rd *r, const char *what)
{
    uint8_t v = 0;
    if (rd_need(r, 1, what)) v = r->p[r->off++];
    return v;
}

static float rd_f32(struct rd *r, const char *what)
{
    float v = 0;
    if (rd_need(r, 4, what)) memcpy(&v, r->p + r->off, 4), r->off += 4;
    return v;
}

/* A count of records each at least `min_bytes` long: bounded by what is left. */
static int rd_count(struct rd *r, size_t min_bytes, int limit, const char *what)
{
    uint32_t v = rd_u32(r, what);
    if (r->st != KILN_OK) return 0;
    if (v > (uint32_t)limit || (uint64_t)v * min_bytes > r->n - r->off) {
        r->off -= 4;
        rd_fail(r, KILN_ERR_INVALID_MODEL, "%s %u is more than the section can hold", what, v);
        return 0;
    }
    return (int)v;
}

/* A string into the graph arena (NUL-terminated); NULL for the null string. */
static char *rd_str(struct rd *r, const char *what, int *is_null)
{
    uint32_t len = rd_u32(r, what);
    if (is_null) *is_null = 0;
    if (r->st != KILN_OK) return NULL;
    if (len == KILN_ART_NULL_STR) {
        if (is_null) *is_null = 1;
        return NULL;
    }
    if (!rd_need(r, len, what)) return NULL;
    char *s = kiln_arena_strndup(r->root->mem, (const char *)r->p + r->off, len);
    if (!s) {
        rd_fail(r, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    r->off += len;
    return s;
}

/* A string that must be present ("" allowed). */
static char *rd_name(struct rd *r, const char *what)
{
    int null;
    char *s = rd_str(r, what, &null);
    if (r->st == KILN_OK && null) {
        r->off -= 4;
        rd_fail(r, KILN_ERR_INVALID_MODEL, "%s is missing", what);
    }
    return r->st == KILN_OK ? s : NULL;
}

static int rd_dtype(struct rd *r, int allow_undefined, const char *what)
{
    int32_t dt = rd_i32(r, what);
    if (r->st == KILN_OK && (dt < (allow_undefined ? 0 : 1) || dt >= KILN_DTYPE_COUNT)) {
        r->off -= 4;
        rd_fail(r, KILN_ERR_INVALID_MODEL, "%s %d is not a Kiln dtype", what, dt);
    }
    return dt;
}

static void rd_type(struct rd *r, struct kiln_type *t)
{
    kiln_type_unknown(t);
    t->dtype = (kiln_dtype)rd_dtype(r, 1, "value dtype");
    int32_t rank = rd_i32(r, "value rank");
    if (r->st != KILN_OK) return;
    if (rank < -1 || rank > KILN_MAX_RANK) {
        r->off -= 4;
        rd_fail(r, KILN_ERR_INVALID_MODEL, "value rank %d is not -1..%d", rank, KILN_MAX_RANK);
        return;
    }
    t->rank = rank;
    for (int i = 0; i < rank && r->st == KILN_OK; i++) {
        t->dims[i] = rd_i64(r, "dim");
        if (r->st == KILN_OK && t->dims[i] < -1) {
            r->off -= 8;
            rd_fail(r, KILN_ERR_INVALID_MODEL, "dim %d is %lld", i, (long long)t->dims[i]);
        }
        t->sym[i] = rd_str(r, "dim symbol", NULL);
    }
}

/* A tensor: inline strings, or bytes in the weight section (fp32 and the
 * rest used in place; bf16-stored f32 weights widened, and (version 2)
 * s8-stored ones dequantized as q * scale, into an owned copy). */
static kiln_tensor *rd_tensor(struct rd *r)
{
    kiln_dtype dt = (kiln_dtype)rd_dtype(r, 0, "tensor dtype");
    int32_t rank = rd_i32(r, "tensor rank");
    if (r->st != KILN_OK) return NULL;
    if (rank < 0 || rank > KILN_MAX_RANK) {
        r->off -= 4;
        rd_fail(r, KILN_ERR_INVALID_MODEL, "tensor rank %d is not 0..%d", rank, KILN_MAX_RANK);
        return NULL;
    }
    int64_t dims[KILN_MAX_RANK] = {0};
    for (int i = 0; i < rank; i++) dims[i] = rd_i64(r, "tensor dim");
    if (r->st != KILN_OK) return NULL;
    int64_t count = kiln_shape_count(rank, dims);
    char sb[160];
    if (count < 0) {
        rd_fail(r, KILN_ERR_INVALID_MODEL, "tensor shape %s is not valid",
                kiln_shape_str(rank, dims, sb, sizeof sb));
        return NULL;
    }
    kiln_tensor *t = NULL;
    kiln_status st;
    if (dt == KILN_DTYPE_STRING) {
        if ((uint64_t)count > (r->n - r->off) / 4) {
            rd_fail(r, KILN_ERR_INVALID_MODEL, "string tensor of %lld elements is more than the "
                    "section can hold", (long long)count);
            return NULL;
        }
        if ((st = kiln_tensor_new(dt, rank, dims, &t)) != KILN_OK) {
            rd_fail(r, st, "%s", kiln_last_error());
            return NULL;
        }
        for (int64_t i = 0; i < count && r->st == KILN_OK; i++) {
            uint32_t len = rd_u32(r, "string length");
            if (rd_need(r, len, "string") &&
                (st = kiln_tensor_set_string(t, (size_t)i, (const char *)r->p + r->off, len)) !=
                    KILN_OK)
                rd_fail(r, st, "%s", kiln_last_error());
            r->off += r->st == KILN_OK ? len : 0;
        }
    } else {
        int32_t stored = rd_dtype(r, 0, "stored dtype");
        int64_t off = rd_i64(r, "weight offset");
        int64_t nbytes = rd_i64(r, "weight bytes");
        if (r->st != KILN_OK) return NULL;
        int widen = stored == KILN_DTYPE_BF16 && dt == KILN_DTYPE_F32;
        int s8 = stored == KILN_DTYPE_I8 && dt == KILN_DTYPE_F32 && r->version >= 2;
        if (stored != (int32_t)dt && !widen && !s8) {
            rd_fail(r, KILN_ERR_INVALID_MODEL, "tensor of %s stored as %s%s", kiln_dtype_name(dt),
                    kiln_dtype_name((kiln_dtype)stored),
                    stored == KILN_DTYPE_I8 && dt == KILN_DTYPE_F32 ? " in a format version 1 file"
                                                                   : "");
            return NULL;
        }
        int32_t axis = -1;
        int64_t soff = 0, sbytes = 0;
        if (s8) { /* s8 per output channel: the channel axis and the scales */
            axis = rd_i32(r, "s8 channel axis");
            soff = rd_i64(r, "s8 scales offset");
            sbytes = rd_i64(r, "s8 scales bytes");
            if (r->st != KILN_OK) return NULL;
            if (axis < 0 || axis >= rank || sbytes < 0 || sbytes % 4 || sbytes / 4 != dims[axis] ||
                soff < 0 ||
                soff % KILN_ART_ALIGN || (uint64_t)soff > r->wsize ||
                (uint64_t)sbytes > r->wsize - (uint64_t)soff) {
                rd_fail(r, KILN_ERR_INVALID_MODEL,
                        "s8 tensor %s: channel axis %d with %lld bytes of scales at weight offset "
                        "%lld; expected an axis 0..%d, 4 bytes per channel, aligned, within the "
                        "%zu-byte weight section", kiln_shape_str(rank, dims, sb, sizeof sb),
                        axis, (long long)sbytes, (long long)soff, rank - 1, r->wsize);
                return NULL;
            }
        }
        int64_t want = count * (int64_t)kiln_dtype_size((kiln_dtype)stored);
        if (nbytes != want || off < 0 || off % KILN_ART_ALIGN ||
            (uint64_t)off > r->wsize || (uint64_t)nbytes > r->wsize - (uint64_t)off) {
            rd_fail(r, KILN_ERR_INVALID_MODEL,
                    "tensor %s of %s: %lld bytes at weight offset %lld, expected %lld aligned "
                    "bytes within the %zu-byte weight section",
                    kiln_shape_str(rank, dims, sb, sizeof sb), kiln_dtype_name(dt),
                    (long long)nbytes, (long long)off, (long long)want, r->wsize);
            return NULL;
        }
        const uint8_t *src = r->wbase + off;
        if (s8) { /* dequantized: q * scale, what the int8 kernels quantize back to q exactly */
            const uint8_t *sp = r->wbase + soff;
            int64_t nch = dims[axis], inner = 1;
            for (int i = axis + 1; i < rank && count > 0; i++) /* count > 0: no overflow */
                inner *= dims[i];
            for (int64_t c = 0; c < nch; c++) {
                float sc;
                memcpy(&sc, sp + 4 * c, 4);
                if (!(sc > 0.0f) || !isfinite(sc)) {
                    rd_fail(r, KILN_ERR_INVALID_MODEL, "s8 tensor %s: the scale of channel %lld "
                            "is %g, not a positive finite number",
                            kiln_shape_str(rank, dims, sb, sizeof sb), (long long)c, (double)sc);
                    return NULL;
                }
            }
            if ((st = kiln_tensor_new_uninit(dt, rank, dims, &t)) != KILN_OK) {
                rd_fail(r, st, "%s", kiln_last_error());
                return NULL;
            }
            float *d = t->data;
            for (int64_t i = 0; i < count; i++) {
                float sc;
                memcpy(&sc, sp + 4 * ((i / inner) % nch), 4);
                d[i] = (float)(int8_t)src[i] * sc;
            }
        } else if (widen) {
            if ((st = kiln_tensor_new_uninit(dt, rank, dims, &t)) != KILN_OK) {
                rd_fail(r, st, "%s", kiln_last_error());
                return NULL;
            }
            float *d = t->data;
            for (int64_t i = 0; i < count; i++) {
                uint16_t h;
                memcpy(&h, src + 2 * i, 2);
                uint32_t u = (uint32_t)h << 16;
                memcpy(&d[i], &u, 4);
            }
        } else if ((st = kiln_tensor_wrap(dt, rank, dims, (void *)src, (size_t)nbytes, &t)) !=
                   KILN_OK) {
            rd_fail(r, st, "%s", kiln_last_error());
            return NULL;
        }
    }
    if (r->st == KILN_OK && (st = kiln_graph_own_tensor(r->root, t)) != KILN_OK)
        rd_fail(r, st, "%s", kiln_last_error());
    if (r->st != KILN_OK) {
        /* own_tensor failing left t unowned; otherwise the graph frees it */
        int owned = 0;
        for (int i = 0; i < r->root->n_owned; i++) owned |= r->root->owned[i] == t;
        if (!owned) kiln_tensor_free(t);
        return NULL;
    }
    return t;
}

static void rd_graph(struct rd *r, struct kiln_graph *g);

static void rd_attr(struct rd *r, struct kiln_graph *g, struct kiln_attr *a)
{
    a->name = rd_name(r, "attribute name");
    uint8_t type = rd_u8(r, "attribute type");
    if (r->st != KILN_OK) return;
    struct kiln_arena *mem = r->root->mem;
    switch (type) {
    case KILN_ATTR_FLOAT: a->f = rd_f32(r, "float attribute"); break;
    case KILN_ATTR_INT: a->i = rd_i64(r, "int attribute"); break;
    case KILN_ATTR_STRING: {
        uint32_t len = rd_u32(r, "string attribute");
        if (!rd_need(r, len, "string attribute")) return;
        a->s.data = kiln_arena_strndup(mem, (const char *)r->p + r->off, len);
        a->s.len = len;
        r->off += len;
        if (!a->s.data) rd_fail(r, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        break;
    }
    case KILN_ATTR_TENSOR: a->t = rd_tensor(r); break;
    case KILN_ATTR_GRAPH: {
        if (r->depth >= MAX_GRAPH_DEPTH) {
            rd_fail(r, KILN_ERR_INVALID_MODEL, "subgraphs nest deeper than %d", MAX_GRAPH_DEPTH);
            return;
        }
        struct kiln_graph *sub = NULL;
        kiln_status st = kiln_graph_new_sub(g, &sub);
        if (st != KILN_OK) {
            rd_fail(r, st, "%s", kiln_last_error());
            return;
        }
        a->g = sub; /* held by the node from now on: freed with the root */
        a->type = KILN_ATTR_GRAPH;
        r->depth++;
        rd_graph(r, sub);
        r->depth--;
        break;
    }
    case KILN_ATTR_FLOATS:
    case KILN_ATTR_INTS:
    case KILN_ATTR_STRINGS: {
        size_t esz = type == KILN_ATTR_INTS ? 8 : 4;
        int n = rd_count(r, esz, INT32_MAX / 16, "attribute element count");
        if (r->st != KILN_OK) return;
        a->n = n;
        if (type == KILN_ATTR_FLOATS) {
            a->floats = kiln_arena_alloc(mem, sizeof(float) * ((size_t)n + 1));
            if (!a->floats) break;
            for (int i = 0; i < n; i++) a->floats[i] = rd_f32(r, "float");
        } else if (type == KILN_ATTR_INTS) {
            a->ints = kiln_arena_alloc(mem, sizeof(int64_t) * ((size_t)n + 1));
            if (!a->ints) break;
            for (int i = 0; i < n; i++) a->ints[i] = rd_i64(r, "int");
        } else {
            a->strings = kiln_arena_alloc(mem, sizeof(kiln_string) * ((size_t)n + 1));
            if (!a->strings) break;
            for (int i = 0; i < n && r->st == KILN_OK; i++) {
                uint32_t len = rd_u32(r, "string");
                if (!rd_need(r, len, "string")) break;
                a->strings[i].data = kiln_arena_strndup(mem, (const char *)r->p + r->off, len);
                a->strings[i].len = len;
                r->off += len;
                if (!a->strings[i].data) rd_fail(r, KILN_ERR_OUT_OF_MEMORY, "out of memory");
            }
        }
        if ((type == KILN_ATTR_FLOATS && !a->floats) || (type == KILN_ATTR_INTS && !a->ints) ||
            (type == KILN_ATTR_STRINGS && !a->strings))
            rd_fail(r, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        break;
    }
    default:
        r->off -= 1;
        rd_fail(r, KILN_ERR_INVALID_MODEL, "attribute '%s' has type %u, not a Kiln attribute type",
                a->name, type);
        return;
    }
    if (r->st == KILN_OK) a->type = (enum kiln_attr_type)type;
}

/* Value ids: -1 (absent) allowed where `optional`. */
static int rd_value_id(struct rd *r, const struct kiln_graph *g, int optional, const char *what)
{
    int32_t v = rd_i32(r, what);
    if (r->st == KILN_OK && (v < (optional ? -1 : 0) || v >= g->n_values)) {
        r->off -= 4;
        rd_fail(r, KILN_ERR_INVALID_MODEL, "%s %d is not a value id (the graph has %d)", what, v,
                g->n_values);
    }
    return v;
}

static void rd_graph(struct rd *r, struct kiln_graph *g)
{
    kiln_status st;
    g->name = rd_name(r, "graph name");
    int nv = rd_count(r, 21, INT32_MAX / 64, "value count");
    for (int v = 0; v < nv && r->st == KILN_OK; v++) {
        const char *name = rd_name(r, "value name");
        uint8_t kind = rd_u8(r, "value kind");
        if (r->st != KILN_OK) return;
        if (kind > KILN_VALUE_OUTER || (kind == KILN_VALUE_OUTER && !g->parent)) {
            r->off -= 1;
            rd_fail(r, KILN_ERR_INVALID_MODEL, "value '%s' has kind %u", name, kind);
            return;
        }
        int id;
        if ((st = kiln_graph_value_add(g, name, (enum kiln_value_kind)kind, &id)) != KILN_OK) {
            rd_fail(r, st, "%s", kiln_last_error());
            return;
        }
        struct kiln_value *val = &g->values[id];
        rd_type(r, &val->type);
        val->outer = rd_i32(r, "outer value id");
        val->layout = rd_i32(r, "value layout");
        if (r->st != KILN_OK) return;
        if (kind == KILN_VALUE_OUTER && (val->outer < 0 || val->outer >= g->parent->n_values)) {
            rd_fail(r, KILN_ERR_INVALID_MODEL, "value '%s' captures outer value %d of %d", name,
                    val->outer, g->parent->n_values);
            return;
        }
        if (kind != KILN_VALUE_OUTER) val->outer = -1;
        if (val->layout != 0 && val->layout != KILN_LAYOUT_NHWC && val->layout != 8 &&
            val->layout != 16) {
            rd_fail(r, KILN_ERR_INVALID_MODEL, "value '%s' has layout %d (0, 1, 8 or 16)", name,
                    val->layout);
            return;
        }
        if (val->layout == KILN_LAYOUT_NHWC &&
            (val->type.rank != 4 ||
             (val->type.dtype != KILN_DTYPE_F32 && val->type.dtype != KILN_DTYPE_U8 &&
              val->type.dtype != KILN_DTYPE_I8))) {
            rd_fail(r, KILN_ERR_INVALID_MODEL,
                    "value '%s' is channels-last but not a 4-D f32 or 8-bit value", name);
            return;
        }
        if (val->layout > KILN_LAYOUT_NHWC &&
            (val->type.rank != 4 || val->type.dtype != KILN_DTYPE_F32)) {
            rd_fail(r, KILN_ERR_INVALID_MODEL, "value '%s' is blocked but not a 4-D f32 value",
                    name);
            return;
        }
        if (kind == KILN_VALUE_CONST) {
            val->konst = rd_tensor(r);
            if (r->st != KILN_OK) return;
            if (val->layout) {
                rd_fail(r, KILN_ERR_INVALID_MODEL, "constant '%s' has a blocked layout", name);
                return;
            }
            kiln_type_from_tensor(&val->type, val->konst); /* the type is the tensor's */
        }
    }
    int nn = rd_count(r, 24, INT32_MAX / 256, "node count");
    for (int i = 0; i < nn && r->st == KILN_OK; i++) {
        const char *op_name = rd_name(r, "op");
        const char *op_type = rd_name(r, "op_type");
        const char *name = rd_name(r, "node name");
        int32_t opset = rd_i32(r, "opset");
        int n_in = rd_count(r, 4, 1 << 20, "node input count");
        if (r->st != KILN_OK) return;
        enum kiln_op op = kiln_op_find(op_name);
        if (op == KILN_OP_COUNT) {
            rd_fail(r, KILN_ERR_UNSUPPORTED, "node '%s' has op '%s', which this Kiln does not have",
                    name, op_name);
            return;
        }
        size_t at_in = r->off;
        r->off += (size_t)n_in * 4;
        int n_out = rd_count(r, 4, 1 << 20, "node output count");
        size_t at_out = r->off;
        if (r->st != KILN_OK) return;
        r->off += (size_t)n_out * 4;
        int n_attr = rd_count(r, 5, 1 << 20, "attribute count");
        if (r->st != KILN_OK) return;
        struct kiln_node *n;
        if ((st = kiln_graph_node_add(g, op, name, n_in, n_out, n_attr, &n)) != KILN_OK) {
            rd_fail(r, st, "%s", kiln_last_error());
            return;
        }
        n->op_type = op_type;
        n->opset = opset;
        size_t after = r->off;
        r->off = at_in;
        for (int k = 0; k < n_in; k++) n->in[k] = rd_value_id(r, g, 1, "node input");
        r->off = at_out;
        for (int k = 0; k < n_out && r->st == KILN_OK; k++) {
            int v = n->out[k] = rd_value_id(r, g, 1, "node output");
            if (v < 0 || r->st != KILN_OK) continue;
            struct kiln_value *val = &g->values[v];
            if (val->kind != KILN_VALUE_NODE || val->producer >= 0) {
                r->off -= 4;
                rd_fail(r, KILN_ERR_INVALID_MODEL,
                        "node '%s' output '%s' is not a node value or has two producers", name,
                        val->name);
                return;
            }
            val->producer = g->n_nodes - 1;
        }
        r->off = after;
        for (int k = 0; k < n_attr && r->st == KILN_OK; k++) rd_attr(r, g, &n->attr[k]);
    }
    int ni = rd_count(r, 4, INT32_MAX / 64, "graph input count");
    if (r->st != KILN_OK) return;
    g->inputs = kiln_arena_alloc(r->root->mem, sizeof(int) * ((size_t)ni + 1));
    if (!g->inputs) {
        rd_fail(r, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        return;
    }
    g->n_inputs = ni;
    for (int i = 0; i < ni && r->st == KILN_OK; i++) {
        g->inputs[i] = rd_value_id(r, g, 0, "graph input");
        if (r->st == KILN_OK && g->values[g->inputs[i]].kind != KILN_VALUE_INPUT) {
            r->off -= 4;
            rd_fail(r, KILN_ERR_INVALID_MODEL, "graph input '%s' is not an input value",
                    g->values[g->inputs[i]].name);
        }
    }
    int no = rd_count(r, 4, INT32_MAX / 64, "graph output count");
    if (r->st != KILN_OK) return;
    g->outputs = kiln_arena_alloc(r->root->mem, sizeof(int) * ((size_t)no + 1));
    if (!g->outputs) {
        rd_fail(r, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        return;
    }
    g->n_outputs = no;
    for (int i = 0; i < no && r->st == KILN_OK; i++) g->outputs[i] = rd_value_id(r, g, 0, "graph output");
}

static void rd_value_info(struct rd *r, const struct kiln_graph *g, kiln_value_info *vi, int *value)
{
    memset(vi, 0, sizeof *vi);
    vi->name = rd_name(r, "signature name");
    vi->dtype = (kiln_dtype)rd_dtype(r, 1, "signature dtype");
    vi->rank = rd_i32(r, "signature rank");
    if (r->st == KILN_OK && (vi->rank < -1 || vi->rank > KILN_MAX_RANK)) {
        r->off -= 4;
        rd_fail(r, KILN_ERR_INVALID_MODEL, "signature rank %d is not -1..%d", vi->rank,
                KILN_MAX_RANK);
    }
    for (int i = 0; i < vi->rank && r->st == KILN_OK; i++) {
        vi->dims[i] = rd_i64(r, "signature dim");
        vi->dim_names[i] = rd_str(r, "signature dim symbol", NULL);
        if (r->st == KILN_OK && vi->dims[i] < -1)
            rd_fail(r, KILN_ERR_INVALID_MODEL, "signature dim %lld", (long long)vi->dims[i]);
    }
    *value = rd_value_id(r, g, 0, "signature value");
}

static void rd_signature(struct rd *r, struct kiln_model *m, struct kiln_signature *sig)
{
    struct kiln_graph *g = m->graph;
    struct kiln_arena *mem = g->mem;
    sig->name = rd_name(r, "signature name");
    sig->method = rd_name(r, "signature method");
    sig->graph = g;
    for (int io = 0; io < 2 && r->st == KILN_OK; io++) {
        int n = rd_count(r, 16, KILN_ART_MAX_SECTIONS * 1024, io ? "output count" : "input count");
        if (r->st != KILN_OK) return;
        kiln_value_info *vi = kiln_arena_alloc(mem, sizeof *vi * ((size_t)n + 1));
        int *ids = kiln_arena_alloc(mem, sizeof *ids * ((size_t)n + 1));
        if (!vi || !ids) {
        rd_fail(r, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        return;
    }
        for (int i = 0; i < n && r->st == KILN_OK; i++) {
            rd_value_info(r, g, &vi[i], &ids[i]);
            if (r->st != KILN_OK) return;
            const int *list = io ? g->outputs : g->inputs;
            int nl = io ? g->n_outputs : g->n_inputs, found = 0;
            for (int k = 0; k < nl; k++) found |= list[k] == ids[i];
            if (!found)
                rd_fail(r, KILN_ERR_INVALID_MODEL, "signature %s '%s' is not a graph %s",
                        io ? "output" : "input", vi[i].name, io ? "output" : "input");
        }
        if (io) sig->n_outputs = n, sig->outputs = vi, sig->output_values = ids;
        else sig->n_inputs = n, sig->inputs = vi, sig->input_values = ids;
    }
}

static void rd_meta(struct rd *r, struct kiln_model *m, struct kiln_artifact_info *info)
{
    uint32_t prec = rd_u32(r, "precision");
    if (r->st == KILN_OK && prec > KILN_PRECISION_INT8) {
        r->off -= 4;
        rd_fail(r, KILN_ERR_INVALID_MODEL, "precision %u is not fp32 (0), bf16 (1) or int8 (2)",
                prec);
    }
    info->precision = (int)prec;
    char *cpu = rd_name(r, "CPU features");
    char *src = rd_name(r, "source format");
    m->stats.producer = rd_name(r, "producer");
    m->stats.ir_version = rd_i64(r, "IR version");
    int nb = rd_count(r, 8, 1024, "batch size count");
    if (r->st != KILN_OK) return;
    info->cpu_features = strdup(cpu);
    info->source_format = strdup(src);
    info->batch_sizes = calloc((size_t)nb + 1, sizeof *info->batch_sizes);
    if (!info->cpu_features || !info->source_format || !info->batch_sizes)
        {
        rd_fail(r, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        return;
    }
    info->n_batch_sizes = nb;
    for (int i = 0; i < nb && r->st == KILN_OK; i++) {
        info->batch_sizes[i] = rd_i64(r, "batch size");
        if (r->st == KILN_OK && (info->batch_sizes[i] < 1 || info->batch_sizes[i] > (1 << 24))) {
            r->off -= 8;
            rd_fail(r, KILN_ERR_INVALID_MODEL, "batch size %lld is not 1..%d",
                    (long long)info->batch_sizes[i], 1 << 24);
        }
    }
    int no = rd_count(r, 12, 4096, "opset count");
    if (r->st != KILN_OK) return;
    m->opset_domain = kiln_arena_alloc(m->graph->mem, sizeof(char *) * ((size_t)no + 1));
    m->opset_version = kiln_arena_alloc(m->graph->mem, sizeof(int64_t) * ((size_t)no + 1));
    if (!m->opset_domain || !m->opset_version)
        {
        rd_fail(r, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        return;
    }
    m->n_opsets = no;
    for (int i = 0; i < no && r->st == KILN_OK; i++) {
        m->opset_domain[i] = rd_name(r, "opset domain");
        m->opset_version[i] = rd_i64(r, "opset version");
    }
}

/* PACK: packed weights, each bound to a constant of the root graph. */
static void rd_packs(struct rd *r, struct kiln_graph *g, struct kiln_artifact_info *info)
{
    char *env = rd_name(r, "packing environment");
    int n = rd_count(r, 24, 1 << 20, "packed weight count");
    if (r->st != KILN_OK) return;
    info->pack_env = strdup(env);
    info->packs = calloc((size_t)n + 1, sizeof *info->packs);
    if (!info->pack_env || !info->packs) {
        rd_fail(r, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        return;
    }
    for (int i = 0; i < n && r->st == KILN_OK; i++) {
        int v = rd_value_id(r, g, 0, "packed weight value");
        char *tag = rd_name(r, "packed weight tag");
        int64_t off = rd_i64(r, "packed weight offset");
        int64_t bytes = rd_i64(r, "packed weight bytes");
        if (r->st != KILN_OK) return;
        if (g->values[v].kind != KILN_VALUE_CONST || !g->values[v].konst) {
            rd_fail(r, KILN_ERR_INVALID_MODEL, "packed weight of value '%s', not a constant",
                    g->values[v].name);
            return;
        }
        if (off < 0 || off % KILN_ART_ALIGN || bytes <= 0 || (uint64_t)off > r->wsize ||
            (uint64_t)bytes > r->wsize - (uint64_t)off) {
            rd_fail(r, KILN_ERR_INVALID_MODEL, "packed weight of '%s': %lld bytes at weight offset "
                    "%lld lie outside the %zu-byte weight section or are not aligned",
                    g->values[v].name, (long long)bytes, (long long)off, r->wsize);
            return;
        }
        if (strncmp(tag, "dnnl_", 5) || strstr(tag, "_s8_")) {
            rd_fail(r, KILN_ERR_INVALID_MODEL, "packed weight of '%s' has tag '%.60s', not a "
                    "oneDNN reorder's", g->values[v].name, tag);
            return;
        }
        struct kiln_artifact_pack *pk = &info->packs[info->n_packs];
        pk->tag = strdup(tag);
        if (!pk->tag) {
            rd_fail(r, KILN_ERR_OUT_OF_MEMORY, "out of memory");
            return;
        }
        pk->key = g->values[v].konst;
        pk->data = r->wbase + off;
        pk->bytes = (uint64_t)bytes;
        info->n_packs++;
    }
}

/* SPRS: the sparse kernels' choices, each bound to a constant of the root graph. */
static void rd_sparse(struct rd *r, struct kiln_graph *g, struct kiln_artifact_info *info)
{
    int n = rd_count(r, 12, 1 << 20, "sparse choice count");
    if (r->st != KILN_OK) return;
    info->sparse = calloc((size_t)n + 1, sizeof *info->sparse);
    if (!info->sparse) {
        rd_fail(r, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        return;
    }
    for (int i = 0; i < n && r->st == KILN_OK; i++) {
        int v = rd_value_id(r, g, 0, "sparse choice value");
        char *tag = rd_name(r, "sparse choice tag");
        int32_t choice = rd_i32(r, "sparse choice");
        if (r->st != KILN_OK) return;
        if (g->values[v].kind != KILN_VALUE_CONST || !g->values[v].konst) {
            rd_fail(r, KILN_ERR_INVALID_MODEL, "sparse choice of value '%s', not a constant",
                    g->values[v].name);
            return;
        }
        if (!kiln_artifact_sparse_choice_tag(tag)) {
            rd_fail(r, KILN_ERR_INVALID_MODEL, "sparse choice of '%s' has tag '%.60s', not "
                    "'sparse_choice:...' or 'sparse_conv_choice:...'", g->values[v].name, tag);
            return;
        }
        if (choice != 0 && choice != 1 && choice != 4) {
            r->off -= 4;
            rd_fail(r, KILN_ERR_INVALID_MODEL, "sparse choice of '%s' is %d, not 0 (dense), 1 or "
                    "4 (sparse with that block)", g->values[v].name, choice);
            return;
        }
        struct kiln_artifact_sparse *sc = &info->sparse[info->n_sparse];
        sc->tag = strdup(tag);
        if (!sc->tag) {
            rd_fail(r, KILN_ERR_OUT_OF_MEMORY, "out of memory");
            return;
        }
        sc->key = g->values[v].konst;
        sc->choice = choice;
        info->n_sparse++;
    }
}

static void get_u32(const uint8_t *p, uint32_t *v) { memcpy(v, p, 4); }
static void get_u64(const uint8_t *p, uint64_t *v) { memcpy(v, p, 8); }

int kiln_artifact_detect(const void *data, size_t size)
{
    return size >= KILN_ART_MAGIC_LEN && memcmp(data, KILN_ART_MAGIC, KILN_ART_MAGIC_LEN) == 0;
}

void kiln_artifact_info_free(struct kiln_artifact_info *info)
{
    if (!info) return;
    for (int i = 0; i < info->n_packs; i++) free(info->packs[i].tag);
    free(info->packs);
    for (int i = 0; i < info->n_sparse; i++) free(info->sparse[i].tag);
    free(info->sparse);
    free(info->pack_env);
    free(info->cpu_features);
    free(info->source_format);
    free(info->batch_sizes);
    free(info->report);
    free(info);
}

int kiln_artifact_cpu_has(const char *f)
{
    if (!strcmp(f, "avx2")) return __builtin_cpu_supports("avx2") != 0;
    if (!strcmp(f, "fma")) return __builtin_cpu_supports("fma") != 0;
    if (!strcmp(f, "avx512f")) return __builtin_cpu_supports("avx512f") != 0;
    if (!strcmp(f, "avx512dq")) return __builtin_cpu_supports("avx512dq") != 0;
    if (!strcmp(f, "avx512bw")) return __builtin_cpu_supports("avx512bw") != 0;
    if (!strcmp(f, "avx512_bf16")) return __builtin_cpu_supports("avx512bf16") != 0;
    if (!strcmp(f, "avx512_vnni")) return __builtin_cpu_supports("avx512vnni") != 0;
    return -1;
}

void kiln_artifact_cpu_features(const struct kiln_graph *g, int precision, char *buf, size_t n)
{
    int layout = 0, nhwc = 0;
    for (int v = 0; v < g->n_values; v++) {
        if (g->values[v].layout > layout) layout = g->values[v].layout;
        if (g->values[v].layout == KILN_LAYOUT_NHWC) nhwc = 1;
    }
    const char *f = "";
    if (precision == KILN_PRECISION_BF16) f = nhwc ? "avx512f,avx512bw,avx512_bf16,avx512_vnni"
                                                   : "avx512f,avx512bw,avx512_bf16";
    else if (precision == KILN_PRECISION_INT8) f = "avx512f,avx512bw,avx512_vnni";
    else if (nhwc) f = "avx512f,avx512dq,avx512bw,avx512_vnni"; /* int8 convs in fp32 */
    else if (layout == 16) f = "avx512f,avx512dq";
    /* The kernels that made the file ran here: it cannot need what this CPU lacks. A bf16
     * or int8 compile on a CPU without AVX-512 ran those nodes in fp32 (8-channel blocks on
     * AVX2), so its file needs AVX2 at most, not the features of the precision's kernels. */
    char all[256], *save = NULL;
    snprintf(all, sizeof all, "%s,%s", f, layout == 8 ? "avx2,fma" : "");
    size_t len = 0;
    if (n) buf[0] = '\0';
    for (char *t = strtok_r(all, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (kiln_artifact_cpu_has(t) <= 0) continue;
        int w = snprintf(buf + len, len < n ? n - len : 0, "%s%s", len ? "," : "", t);
        if (w > 0) len += (size_t)w;
    }
}

/* Refuse a file needing a feature this CPU lacks (or one Kiln does not know). */
static kiln_status check_cpu(const char *file, const char *features)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", features);
    for (char *save = NULL, *f = strtok_r(buf, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
        int has = kiln_artifact_cpu_has(f);
        if (has < 0)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: its kernels need the CPU feature '%s', which this Kiln does "
                              "not know; compile the model again for this machine", file, f);
        if (!has)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: its kernels need the CPU feature '%s', which this CPU lacks; "
                              "compile the model again on (or for) this machine", file, f);
    }
    return KILN_OK;
}

kiln_status kiln_artifact_load(struct kiln_file_map *map, const char *name, struct kiln_model *m)
{
    const uint8_t *p = map->data;
    size_t size = map->size;
    kiln_status st;
    struct kiln_artifact_info *info = calloc(1, sizeof *info);
    if (!info) {
        kiln_file_unmap(map);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if ((st = kiln_model_keep_map(m, map)) != KILN_OK) {
        kiln_file_unmap(map);
        free(info);
        return st;
    }
    m->artifact = info;
    if (!kiln_artifact_detect(p, size))
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: not a .kiln file (its first bytes are not "
                          "the .kiln magic)", name);
    if (size < KILN_ART_HEADER_BYTES)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: truncated: %zu bytes, the header alone is "
                          "%d", name, size, KILN_ART_HEADER_BYTES);
    uint32_t version, hbytes, nsec, table_crc, hcrc;
    uint64_t fsize;
    get_u32(p + 8, &version);
    if (version < KILN_ART_FORMAT_VERSION_MIN || version > KILN_ART_FORMAT_VERSION)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: .kiln format version %u; this Kiln (%s) reads "
                          "versions %u to %u: compile the model again with this Kiln", name,
                          version, KILN_VERSION_STRING, KILN_ART_FORMAT_VERSION_MIN,
                          KILN_ART_FORMAT_VERSION);
    get_u32(p + 60, &hcrc);
    if (kiln_crc32c(p, 60) != hcrc && ART_CHECK_CRC)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: header checksum mismatch (stored 0x%08x, "
                          "computed 0x%08x): the file is corrupted", name, hcrc,
                          kiln_crc32c(p, 60));
    get_u32(p + 12, &hbytes);
    get_u64(p + 16, &fsize);
    get_u32(p + 24, &nsec);
    get_u32(p + 28, &table_crc);
    memcpy(info->kiln_version, p + 32, 16);
    info->kiln_version[16] = '\0';
    info->format_version = version;
    info->file_size = fsize;
    if (hbytes != KILN_ART_HEADER_BYTES)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: header size %u, expected %d", name, hbytes,
                          KILN_ART_HEADER_BYTES);
    if (fsize != size)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: %s: the header says %llu bytes, the file "
                          "has %zu", name, fsize > size ? "truncated" : "trailing bytes",
                          (unsigned long long)fsize, size);
    if (nsec == 0 || nsec > KILN_ART_MAX_SECTIONS)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: %u sections, expected 1..%d", name, nsec,
                          KILN_ART_MAX_SECTIONS);
    size_t table_end = KILN_ART_HEADER_BYTES + (size_t)nsec * 32;
    if (table_end > size)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: truncated in the section table", name);
    if (kiln_crc32c(p + KILN_ART_HEADER_BYTES, (size_t)nsec * 32) != table_crc && ART_CHECK_CRC)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: section table checksum mismatch: the file "
                          "is corrupted", name);
    const uint8_t *sec_data[8] = {0};
    size_t sec_size[8] = {0};
    static const uint32_t kinds[8] = {KILN_ART_SEC_META, KILN_ART_SEC_SIGN, KILN_ART_SEC_GRPH,
                                      KILN_ART_SEC_WGHT, KILN_ART_SEC_REPT, KILN_ART_SEC_PACK,
                                      KILN_ART_SEC_SPRS, KILN_ART_SEC_GRPZ};
    /* SPRS is version 2's, GRPZ version 3's: an older reader skipped them */
    int known = version >= 3 ? 8 : version >= 2 ? 7 : 6;
    info->n_sections = (int)nsec;
    uint64_t prev_end = table_end;
    for (uint32_t i = 0; i < nsec; i++) {
        const uint8_t *e = p + KILN_ART_HEADER_BYTES + 32 * (size_t)i;
        uint32_t kind, crc;
        uint64_t off, len;
        char sb[8];
        get_u32(e, &kind);
        get_u32(e + 4, &crc);
        get_u64(e + 8, &off);
        get_u64(e + 16, &len);
        info->sections[i].kind = kind;
        info->sections[i].offset = off;
        info->sections[i].size = len;
        if (off % KILN_ART_ALIGN || off < table_end || off > size || len > size - off)
            return kiln_error(KILN_ERR_INVALID_MODEL, "%s: section %s: %llu bytes at offset %llu "
                              "lie outside the %zu-byte file or are not 64-byte aligned", name,
                              sec_name(kind, sb), (unsigned long long)len,
                              (unsigned long long)off, size);
        /* sections in file order, the bytes between them zero: no byte goes unchecked */
        for (uint64_t k = prev_end; k < off; k++)
            if (p[k])
                return kiln_error(KILN_ERR_INVALID_MODEL, "%s: byte %llu, padding before section "
                                  "%s, is 0x%02x, not zero: the file is corrupted", name,
                                  (unsigned long long)k, sec_name(kind, sb), p[k]);
        if (off < prev_end)
            return kiln_error(KILN_ERR_INVALID_MODEL, "%s: section %s at offset %llu overlaps the "
                              "one before it", name, sec_name(kind, sb), (unsigned long long)off);
        prev_end = off + len;
        if (kiln_crc32c(p + off, len) != crc && ART_CHECK_CRC)
            return kiln_error(KILN_ERR_INVALID_MODEL, "%s: section %s checksum mismatch (stored "
                              "0x%08x, computed 0x%08x): the file is corrupted", name,
                              sec_name(kind, sb), crc, kiln_crc32c(p + off, len));
        for (int k = 0; k < known; k++)
            if (kind == kinds[k]) {
                if (sec_data[k])
                    return kiln_error(KILN_ERR_INVALID_MODEL, "%s: section %s appears twice", name,
                                      sec_name(kind, sb));
                sec_data[k] = p + off;
                sec_size[k] = len;
            }
        /* other kinds: sections a later version adds that this one may skip */
    }
    if (prev_end != size)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: %llu bytes after the last section",
                          name, (unsigned long long)(size - prev_end));
    for (int k = 0; k < 4; k++)
        if (!sec_data[k] && !(k == 2 && sec_data[7])) {
            char sb[8];
            return kiln_error(KILN_ERR_INVALID_MODEL, "%s: section %s%s is missing", name,
                              sec_name(kinds[k], sb), k == 2 && version >= 3 ? " (or GRPZ)" : "");
        }
    if (sec_data[2] && sec_data[7])
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: sections GRPH and GRPZ both hold a graph; "
                          "a file has one", name);
    if ((st = kiln_graph_new(&m->graph)) != KILN_OK) return st;
    struct rd r = {.file = name, .root = m->graph, .wbase = sec_data[3], .wsize = sec_size[3],
                   .version = version};
    /* META first: the CPU check comes before anything else is built */
    r.p = sec_data[0], r.n = sec_size[0], r.off = 0, r.sec = KILN_ART_SEC_META;
    rd_meta(&r, m, info);
    if (r.st != KILN_OK) return r.st;
    if ((st = check_cpu(name, info->cpu_features)) != KILN_OK) return st;
    r.p = sec_data[2], r.n = sec_size[2], r.off = 0, r.sec = KILN_ART_SEC_GRPH;
    uint8_t *inflated = NULL;
    if (sec_data[7]) { /* GRPZ: the graph's length, then its zlib stream; read as GRPH */
        if ((st = inflate_graph(name, sec_data[7], sec_size[7], &inflated, &r.n)) != KILN_OK)
            return st;
        r.p = inflated, r.sec = KILN_ART_SEC_GRPZ;
    }
    rd_graph(&r, m->graph);
    free(inflated); /* the graph copied what it keeps (strings into its arena) */
    r.p = NULL;
    if (r.st != KILN_OK) return r.st;
    m->signatures = kiln_arena_alloc(m->graph->mem, sizeof *m->signatures);
    if (!m->signatures) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    r.p = sec_data[1], r.n = sec_size[1], r.off = 0, r.sec = KILN_ART_SEC_SIGN;
    rd_signature(&r, m, &m->signatures[0]);
    if (r.st != KILN_OK) return r.st;
    m->n_signatures = 1;
    m->default_signature = 0;
    if (sec_data[4]) {
        info->report = malloc(sec_size[4] + 1);
        if (!info->report) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        memcpy(info->report, sec_data[4], sec_size[4]);
        info->report[sec_size[4]] = '\0';
    }
    if (sec_data[5]) {
        r.p = sec_data[5], r.n = sec_size[5], r.off = 0, r.sec = KILN_ART_SEC_PACK;
        rd_packs(&r, m->graph, info);
        if (r.st != KILN_OK) return r.st;
    }
    if (sec_data[6]) {
        r.p = sec_data[6], r.n = sec_size[6], r.off = 0, r.sec = KILN_ART_SEC_SPRS;
        rd_sparse(&r, m->graph, info);
        if (r.st != KILN_OK) return r.st;
    }
    if ((st = kiln_graph_verify(m->graph)) != KILN_OK)
        return kiln_error_wrap(st, "%s: section %s", name, sec_data[7] ? "GRPZ" : "GRPH");
    m->format = "kiln";
    return kiln_model_finish(m);
}
