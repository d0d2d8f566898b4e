/*
 * tensor_bundle.c - read TensorFlow TensorBundle checkpoints.
 *
 * The index file is a LevelDB-format table (TF's tensorflow/core/lib/io):
 *
 *   [data block]... [metaindex block] [index block] [footer: 48 bytes]
 *
 * The footer holds two BlockHandles (varint64 offset, varint64 size) padded
 * to 40 bytes, then the magic number 0xdb4775248b80fb57 (little-endian).
 * Each block is followed by a 5-byte trailer: a compression type (0 none,
 * 1 Snappy) and the masked CRC-32C of the block and that type byte. A block
 * is a run of entries (varint32 shared key bytes, varint32 unshared key
 * bytes, varint32 value size, the unshared key bytes, the value), keys
 * prefix-compressed against the previous entry, then restart offsets
 * (fixed32 each) and their count (fixed32). The index block maps a
 * separator key to each data block's handle; the metaindex block is empty
 * in TF's tables and is not read.
 *
 * kiln_bundle_open walks every data block once: keys must be strictly
 * increasing, the first entry is the header (empty key), every other value
 * is a BundleEntryProto, parsed and kept. The data files the entries refer
 * to are mapped then, so reads need no locks and missing files are reported
 * at open. Everything else about an entry (dtype, shape, bounds, CRC) is
 * checked when it is read, so one tensor Kiln cannot read (a variant, a
 * partitioned variable) does not make the others unreadable.
 */
#include "import/tensor_bundle.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32c.h"
#include "core/dtype.h"
#include "core/fileio.h"
#include "core/tensor.h"
#include "import/model.h"
#include "import/pbcheck.h"
#include "tensor_bundle.pb-c.h"

#define TABLE_MAGIC 0xdb4775248b80fb57ull
#define TABLE_FOOTER_BYTES 48
#define BLOCK_TRAILER_BYTES 5
#define BUNDLE_VERSION 1         /* TF's kTensorBundleVersion: the reader version Kiln is */
#define BUNDLE_MAX_PROTO_DEPTH 8 /* the deepest bundle message nests 3 levels */
#define SNAPPY_MAX_RATIO 22      /* a Snappy copy op writes at most 64 bytes from 3 */

/* Fuzzing builds (cmake -DKILN_FUZZ=ON defines this) compute every CRC but
 * do not stop at a mismatch, so that mutated inputs get past the checksums
 * to the parsing behind them. The normal build, and the corpus replay in
 * it, always check. */
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define BUNDLE_CHECK_CRC 0
#else
#define BUNDLE_CHECK_CRC 1
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tensor_bundle.c reads little-endian tensor data in place; big-endian hosts need byte swaps"
#endif

struct bundle_entry {
    char *key;                   /* NUL-terminated tensor name */
    KilnTf__BundleEntryProto *e; /* parsed index value */
};

struct bundle_shard {
    char *path;                  /* <prefix>.data-NNNNN-of-NNNNN */
    struct kiln_file_map map;    /* mapped if some entry refers to this shard */
    bool owned;                  /* unmapped by kiln_bundle_close */
};

struct kiln_bundle {
    char *prefix;
    int num_shards;
    struct bundle_shard *shards;   /* num_shards of them */
    struct bundle_entry *entries;  /* sorted by key, header excluded */
    int n_entries, cap_entries;
};

/* ---- little helpers ---- */

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* LevelDB varints: at most 10 bytes (5 for varint32), value must fit. */
static bool get_varint64(const uint8_t **pp, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    const uint8_t *p = *pp;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
        uint8_t b = *p++;
        if (shift == 63 && b > 1) return false;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            *pp = p;
            return true;
        }
    }
    return false;
}

static bool get_varint32(const uint8_t **pp, const uint8_t *end, uint32_t *out)
{
    uint64_t v;
    const uint8_t *p = *pp;
    if (!get_varint64(&p, end, &v) || v > UINT32_MAX || p - *pp > 5) return false;
    *out = (uint32_t)v;
    *pp = p;
    return true;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static char *str_concat(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    if (!s) return NULL;
    memcpy(s, a, na);
    memcpy(s + na, b, nb + 1);
    return s;
}

/* ---- Snappy (block format), for blocks written by newer TF versions ---- */

/* Decompress a Snappy block into a new buffer; every length and offset is
 * checked against the input and the declared output size. */
static kiln_status snappy_uncompress(const uint8_t *src, size_t n, const char *what,
                                     uint8_t **out, size_t *out_n)
{
    const uint8_t *p = src, *end = src + n;
    uint64_t ulen;
    if (!get_varint64(&p, end, &ulen) || ulen > UINT32_MAX)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: bad Snappy length header", what);
    if (ulen > (uint64_t)(end - p) * SNAPPY_MAX_RATIO)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: Snappy block claims %llu bytes from only %zu compressed bytes", what,
                          (unsigned long long)ulen, (size_t)(end - p));
    uint8_t *o = malloc(ulen ? (size_t)ulen : 1);
    if (!o) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "%s: out of memory decompressing", what);
    size_t op = 0, total = (size_t)ulen;
    while (p < end) {
        uint8_t tag = *p++;
        size_t len, off;
        switch (tag & 3) {
        case 0: /* literal: length-1 in the tag, or in the next 1-4 bytes */
            len = tag >> 2;
            if (len >= 60) {
                size_t nb = len - 59;
                if ((size_t)(end - p) < nb) goto corrupt;
                len = 0;
                for (size_t i = 0; i < nb; i++) len |= (size_t)p[i] << (8 * i);
                p += nb;
            }
            len += 1;
            if (len > (size_t)(end - p) || len > total - op) goto corrupt;
            memcpy(o + op, p, len);
            p += len;
            op += len;
            continue;
        case 1: /* copy, 3-bit length, 11-bit offset */
            if (p >= end) goto corrupt;
            len = 4 + ((tag >> 2) & 7);
            off = (size_t)(tag >> 5) << 8 | *p++;
            break;
        case 2: /* copy, 6-bit length, 16-bit offset */
            if (end - p < 2) goto corrupt;
            len = 1 + (tag >> 2);
            off = (size_t)p[0] | (size_t)p[1] << 8;
            p += 2;
            break;
        default: /* copy, 6-bit length, 32-bit offset */
            if (end - p < 4) goto corrupt;
            len = 1 + (tag >> 2);
            off = le32(p);
            p += 4;
            break;
        }
        if (off == 0 || off > op || len > total - op) goto corrupt;
        for (size_t i = 0; i < len; i++) o[op + i] = o[op + i - off]; /* may overlap */
        op += len;
    }
    if (op != total) goto corrupt;
    *out = o;
    *out_n = total;
    return KILN_OK;
corrupt:
    free(o);
    return kiln_error(KILN_ERR_INVALID_MODEL, "%s: corrupt Snappy-compressed block", what);
}

/* ---- the table ---- */

struct table {
    const char *path;        /* for messages */
    const uint8_t *file;
    size_t size;
};

/* A block's contents, checked and decompressed: data points into the file
 * or into owned (freed by the caller). */
static kiln_status table_read_block(const struct table *t, uint64_t off, uint64_t size,
                                    const char *kind, const uint8_t **data, size_t *n,
                                    uint8_t **owned)
{
    *owned = NULL;
    if (off > t->size || size > t->size - off || t->size - off - size < BLOCK_TRAILER_BYTES)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "'%s': %s block at offset %llu (%llu bytes) runs past the end of the "
                          "file (%zu bytes); truncated?",
                          t->path, kind, (unsigned long long)off, (unsigned long long)size,
                          t->size);
    const uint8_t *b = t->file + off;
    uint8_t type = b[size];
    uint32_t stored = kiln_crc32c_unmask(le32(b + size + 1));
    uint32_t actual = kiln_crc32c(b, (size_t)size + 1);
    if (BUNDLE_CHECK_CRC && stored != actual)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "'%s': %s block at offset %llu: crc32c mismatch (stored %08x, "
                          "computed %08x)",
                          t->path, kind, (unsigned long long)off, stored, actual);
    if (type == 0) {
        *data = b;
        *n = (size_t)size;
        return KILN_OK;
    }
    if (type == 1) {
        char what[64];
        snprintf(what, sizeof what, "%s block at offset %llu", kind, (unsigned long long)off);
        kiln_status st = snappy_uncompress(b, (size_t)size, what, owned, n);
        if (st != KILN_OK) return kiln_error_wrap(st, "'%s'", t->path);
        *data = *owned;
        return KILN_OK;
    }
    return kiln_error(KILN_ERR_INVALID_MODEL,
                      "'%s': %s block at offset %llu has unknown compression type %u", t->path,
                      kind, (unsigned long long)off, type);
}

/* Called for each entry of a block; key is valid only during the call. */
typedef kiln_status (*entry_fn)(void *ctx, const uint8_t *key, size_t klen, const uint8_t *val,
                                size_t vlen);

/* Decode the entries of one block in order, undoing the key prefix compression. */
static kiln_status table_block_each(const struct table *t, const uint8_t *blk, size_t n,
                                    const char *kind, entry_fn fn, void *ctx)
{
    if (n < 4)
        return kiln_error(KILN_ERR_INVALID_MODEL, "'%s': %s block of %zu bytes is too short",
                          t->path, kind, n);
    uint32_t restarts = le32(blk + n - 4);
    if (restarts > (n - 4) / 4)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "'%s': %s block of %zu bytes claims %u restart points", t->path, kind, n,
                          restarts);
    if (restarts == 0) return KILN_OK; /* TF reads a block without restarts as empty */
    const uint8_t *p = blk, *end = blk + n - 4 - 4 * (size_t)restarts;
    uint8_t *key = NULL;
    size_t klen = 0, kcap = 0;
    kiln_status st = KILN_OK;
    while (p < end) {
        size_t at = (size_t)(p - blk);
        uint32_t shared, unshared, vlen;
        if (!get_varint32(&p, end, &shared) || !get_varint32(&p, end, &unshared) ||
            !get_varint32(&p, end, &vlen) || shared > klen || unshared > (size_t)(end - p) ||
            vlen > (size_t)(end - p) - unshared) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "'%s': bad entry at byte %zu of a %s block",
                            t->path, at, kind);
            break;
        }
        if ((size_t)shared + unshared > kcap) {
            size_t cap = kcap ? kcap : 64;
            while (cap < (size_t)shared + unshared) cap *= 2;
            uint8_t *k = realloc(key, cap);
            if (!k) {
                st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", t->path);
                break;
            }
            key = k;
            kcap = cap;
        }
        if (unshared) memcpy(key + shared, p, unshared);
        klen = (size_t)shared + unshared;
        st = fn(ctx, key ? key : (const uint8_t *)"", klen, p + unshared, vlen);
        if (st != KILN_OK) break;
        p += unshared + vlen;
    }
    free(key);
    return st;
}

struct index_walk {
    const struct table *t;
    entry_fn fn;      /* called for every entry of every data block */
    void *ctx;
    uint64_t next_off; /* data blocks come in file order and do not overlap */
};

/* One index entry: read the data block it points to and walk its entries. */
static kiln_status index_entry(void *ctx, const uint8_t *key, size_t klen, const uint8_t *val,
                               size_t vlen)
{
    struct index_walk *w = ctx;
    const uint8_t *p = val, *end = val + vlen;
    uint64_t off, size;
    /* Extra bytes after the handle are allowed (reserved by LevelDB). */
    if (!get_varint64(&p, end, &off) || !get_varint64(&p, end, &size))
        return kiln_error(KILN_ERR_INVALID_MODEL, "'%s': bad block handle in the index block",
                          w->t->path);
    /* Each data block is read once, so the work is linear in the file size. */
    if (off < w->next_off)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "'%s': data block at offset %llu overlaps or precedes the previous one",
                          w->t->path, (unsigned long long)off);
    const uint8_t *data;
    size_t n;
    uint8_t *owned;
    kiln_status st = table_read_block(w->t, off, size, "data", &data, &n, &owned);
    if (st != KILN_OK) return st;
    w->next_off = off + size + BLOCK_TRAILER_BYTES; /* in the file: cannot overflow */
    st = table_block_each(w->t, data, n, "data", w->fn, w->ctx);
    free(owned);
    return st;
}

/* Check the footer and call fn for every key/value pair of the table. */
static kiln_status table_each(const struct table *t, entry_fn fn, void *ctx)
{
    if (t->size < TABLE_FOOTER_BYTES)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "'%s' is %zu bytes, too short to be a TensorBundle index (at least %d)",
                          t->path, t->size, TABLE_FOOTER_BYTES);
    const uint8_t *foot = t->file + t->size - TABLE_FOOTER_BYTES;
    uint64_t magic = (uint64_t)le32(foot + 44) << 32 | le32(foot + 40);
    if (magic != TABLE_MAGIC)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "'%s': bad magic number 0x%016llx (expected 0x%016llx); not a "
                          "TensorBundle index",
                          t->path, (unsigned long long)magic, TABLE_MAGIC);
    const uint8_t *p = foot, *end = foot + 40;
    uint64_t meta_off, meta_size, index_off, index_size;
    if (!get_varint64(&p, end, &meta_off) || !get_varint64(&p, end, &meta_size) ||
        !get_varint64(&p, end, &index_off) || !get_varint64(&p, end, &index_size))
        return kiln_error(KILN_ERR_INVALID_MODEL, "'%s': bad block handles in the footer", t->path);
    const uint8_t *data;
    size_t n;
    uint8_t *owned;
    kiln_status st = table_read_block(t, index_off, index_size, "index", &data, &n, &owned);
    if (st != KILN_OK) return st;
    struct index_walk w = {t, fn, ctx, 0};
    st = table_block_each(t, data, n, "index", index_entry, &w);
    free(owned);
    return st;
}

/* ---- the bundle ---- */

struct open_ctx {
    struct kiln_bundle *b;
    const char *path;                  /* index file, for messages */
    KilnTf__BundleHeaderProto *header; /* the first entry, once seen */
    uint8_t *last;                     /* previous key, for the order check */
    size_t last_len;
    bool any;                          /* an entry was seen */
};

/* One index entry: the header first, then tensor entries in key order. */
static kiln_status open_entry(void *vctx, const uint8_t *key, size_t klen, const uint8_t *val,
                              size_t vlen)
{
    struct open_ctx *c = vctx;
    struct kiln_bundle *b = c->b;
    if (c->any) {
        size_t k = klen < c->last_len ? klen : c->last_len;
        int cmp = memcmp(key, c->last, k);
        if (cmp < 0 || (cmp == 0 && klen <= c->last_len))
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "'%s': key '%.*s' is out of order or repeated (after '%.*s')",
                              c->path, (int)(klen < 200 ? klen : 200), (const char *)key,
                              (int)(c->last_len < 200 ? c->last_len : 200), (const char *)c->last);
    }
    uint8_t *last = realloc(c->last, klen ? klen : 1);
    if (!last) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", c->path);
    if (klen) memcpy(last, key, klen);
    c->last = last;
    c->last_len = klen;
    c->any = true;

    if (klen == 0) { /* the header: sorts first, so this is the first entry */
        kiln_status st = kiln_pb_check(&kiln_tf__bundle_header_proto__descriptor, val, vlen,
                                       BUNDLE_MAX_PROTO_DEPTH, c->path);
        if (st != KILN_OK) return kiln_error_wrap(st, "bundle header");
        c->header = kiln_tf__bundle_header_proto__unpack(NULL, vlen, val);
        if (!c->header)
            return kiln_error(KILN_ERR_INVALID_MODEL, "'%s': the header entry is not a valid "
                              "BundleHeaderProto", c->path);
        return KILN_OK;
    }
    if (!c->header)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "'%s': the first entry is '%.*s', not the bundle header (empty key)",
                          c->path, (int)(klen < 200 ? klen : 200), (const char *)key);
    if (memchr(key, '\0', klen))
        return kiln_error(KILN_ERR_INVALID_MODEL, "'%s': tensor name '%s' contains a NUL byte",
                          c->path, (const char *)key);
    if (b->n_entries == INT32_MAX)
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "'%s': too many entries", c->path);
    if (b->n_entries == b->cap_entries) {
        int cap = b->cap_entries ? (b->cap_entries > INT32_MAX / 2 ? INT32_MAX : b->cap_entries * 2)
                                 : 16;
        struct bundle_entry *e = realloc(b->entries, (size_t)cap * sizeof *e);
        if (!e) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", c->path);
        b->entries = e;
        b->cap_entries = cap;
    }
    struct bundle_entry *e = &b->entries[b->n_entries];
    e->key = malloc(klen + 1);
    if (!e->key) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", c->path);
    memcpy(e->key, key, klen);
    e->key[klen] = '\0';
    kiln_status st = kiln_pb_check(&kiln_tf__bundle_entry_proto__descriptor, val, vlen,
                                   BUNDLE_MAX_PROTO_DEPTH, c->path);
    if (st != KILN_OK) {
        st = kiln_error_wrap(st, "entry for '%s'", e->key);
        free(e->key);
        return st;
    }
    e->e = kiln_tf__bundle_entry_proto__unpack(NULL, vlen, val);
    if (!e->e) {
        st = kiln_error(KILN_ERR_INVALID_MODEL,
                        "'%s': the entry for '%s' is not a valid BundleEntryProto", c->path,
                        e->key);
        free(e->key);
        return st;
    }
    b->n_entries++;
    return KILN_OK;
}

/* Check what the header says: shard count, byte order, format version. */
static kiln_status check_header(const KilnTf__BundleHeaderProto *h, const char *path)
{
    if (h->num_shards <= 0 || h->num_shards > KILN_BUNDLE_MAX_SHARDS)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "'%s': the header says %d data files (expected 1 to %d)", path,
                          (int)h->num_shards, KILN_BUNDLE_MAX_SHARDS);
    if (h->endianness == 1)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "'%s': the checkpoint was written big-endian; Kiln reads only "
                          "little-endian checkpoints",
                          path);
    if (h->endianness != 0)
        return kiln_error(KILN_ERR_INVALID_MODEL, "'%s': unknown endianness %d in the header",
                          path, (int)h->endianness);
    const KilnTf__VersionDef *v = h->version;
    if (v) {
        if (v->producer < 0)
            return kiln_error(KILN_ERR_INVALID_MODEL, "'%s': bad producer version %d", path,
                              (int)v->producer);
        if (v->min_consumer > BUNDLE_VERSION)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "'%s': the checkpoint needs a reader of format version %d or "
                              "newer; Kiln reads version %d",
                              path, (int)v->min_consumer, BUNDLE_VERSION);
        for (size_t i = 0; i < v->n_bad_consumers; i++)
            if (v->bad_consumers[i] == BUNDLE_VERSION)
                return kiln_error(KILN_ERR_UNSUPPORTED,
                                  "'%s': the checkpoint disallows readers of format version %d",
                                  path, BUNDLE_VERSION);
    }
    return KILN_OK;
}

/* Map the data files the entries refer to (partitioned-variable entries
 * carry no data of their own). */
static kiln_status map_shards(struct kiln_bundle *b, const struct kiln_file_source *src)
{
    b->shards = calloc((size_t)b->num_shards, sizeof *b->shards);
    if (!b->shards) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory opening a bundle");
    for (int i = 0; i < b->n_entries; i++) {
        const KilnTf__BundleEntryProto *e = b->entries[i].e;
        if (e->n_slices) continue;
        if (e->shard_id < 0 || e->shard_id >= b->num_shards)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "'%s.index': variable '%s' is in data file %d, but the bundle has "
                              "%d data files",
                              b->prefix, b->entries[i].key, (int)e->shard_id, b->num_shards);
        struct bundle_shard *s = &b->shards[e->shard_id];
        if (s->path) continue;
        size_t n = strlen(b->prefix) + 32;
        if (!(s->path = malloc(n)))
            return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory opening a bundle");
        snprintf(s->path, n, "%s.data-%05d-of-%05d", b->prefix, (int)e->shard_id, b->num_shards);
        kiln_status st = kiln_file_map_from(src, s->path, &s->map);
        if (st != KILN_OK)
            return kiln_error_wrap(st, "TensorBundle data file for variable '%s'",
                                   b->entries[i].key);
        s->owned = true;
    }
    return KILN_OK;
}

kiln_status kiln_bundle_open(const char *prefix, struct kiln_bundle **out)
{
    return kiln_bundle_open_from(prefix, NULL, out);
}

kiln_status kiln_bundle_open_from(const char *prefix, const struct kiln_file_source *src,
                                  struct kiln_bundle **out)
{
    if (out) *out = NULL;
    if (!prefix || !out)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_bundle_open: NULL argument");
    struct kiln_bundle *b = calloc(1, sizeof *b);
    char *index_path = str_concat(prefix, ".index");
    if (!b || !index_path || !(b->prefix = str_concat(prefix, ""))) {
        free(b);
        free(index_path);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory opening a bundle");
    }
    struct kiln_file_map index;
    kiln_status st = kiln_file_map_from(src, index_path, &index);
    if (st != KILN_OK) {
        st = kiln_error_wrap(st, "TensorBundle index");
        goto err_free_bundle;
    }
    struct table t = {index_path, index.data, index.size};
    struct open_ctx c = {.b = b, .path = index_path};
    st = table_each(&t, open_entry, &c);
    if (st == KILN_OK && !c.header)
        st = kiln_error(KILN_ERR_INVALID_MODEL, "'%s': no bundle header (entry with an empty key)",
                        index_path);
    if (st == KILN_OK) st = check_header(c.header, index_path);
    if (st == KILN_OK) {
        b->num_shards = c.header->num_shards;
        st = map_shards(b, src);
    }
    if (c.header) kiln_tf__bundle_header_proto__free_unpacked(c.header, NULL);
    free(c.last);
    kiln_file_unmap(&index);
    if (st != KILN_OK) goto err_free_bundle;
    free(index_path);
    *out = b;
    return KILN_OK;

err_free_bundle:
    kiln_bundle_close(b);
    free(index_path);
    return st;
}

int kiln_bundle_count(const struct kiln_bundle *b) { return b ? b->n_entries : 0; }

const char *kiln_bundle_key(const struct kiln_bundle *b, int i)
{
    return b && i >= 0 && i < b->n_entries ? b->entries[i].key : NULL;
}

/* The entry named key (entries are sorted bytewise, as strcmp compares). */
static const struct bundle_entry *find_entry(const struct kiln_bundle *b, const char *key)
{
    int lo = 0, hi = b->n_entries;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(key, b->entries[mid].key);
        if (c == 0) return &b->entries[mid];
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

/* Kiln's dtype for a TF DataType code, or an error naming it. */
static kiln_status map_dtype(int32_t code, const char *key, kiln_dtype *out)
{
    static const kiln_dtype tf[] = {
        [1] = KILN_DTYPE_F32,   [2] = KILN_DTYPE_F64,   [3] = KILN_DTYPE_I32,
        [4] = KILN_DTYPE_U8,    [5] = KILN_DTYPE_I16,   [6] = KILN_DTYPE_I8,
        [7] = KILN_DTYPE_STRING, [9] = KILN_DTYPE_I64,  [10] = KILN_DTYPE_BOOL,
        [14] = KILN_DTYPE_BF16, [17] = KILN_DTYPE_U16,  [19] = KILN_DTYPE_F16,
        [22] = KILN_DTYPE_U32,  [23] = KILN_DTYPE_U64,
    };
    static const char *const unsupported[] = {
        [8] = "DT_COMPLEX64", [11] = "DT_QINT8",     [12] = "DT_QUINT8",   [13] = "DT_QINT32",
        [15] = "DT_QINT16",   [16] = "DT_QUINT16",   [18] = "DT_COMPLEX128",
        [20] = "DT_RESOURCE", [21] = "DT_VARIANT",
    };
    if (code > 0 && code < (int32_t)(sizeof tf / sizeof tf[0]) && tf[code] != KILN_DTYPE_UNDEFINED) {
        *out = tf[code];
        return KILN_OK;
    }
    if (code > 0 && code < (int32_t)(sizeof unsupported / sizeof unsupported[0]) &&
        unsupported[code])
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "variable '%s': data type %s (%d) is not supported by Kiln", key,
                          unsupported[code], (int)code);
    return kiln_error(KILN_ERR_INVALID_MODEL, "variable '%s': %d is not a valid TensorFlow DataType",
                      key, (int)code);
}

/* Decode TF's string tensor encoding: varint64 lengths of all elements, a
 * masked CRC-32C of those lengths (each as a little-endian uint32, or uint64
 * if it does not fit), then the bytes. The entry's CRC covers the lengths
 * (in that fixed-width form), the length checksum and the bytes. */
static kiln_status read_strings(const char *key, const char *file, const uint8_t *data,
                                size_t size, int rank, const int64_t *dims, int64_t count,
                                uint32_t want_crc, kiln_tensor **out)
{
    if (count > 0 && (uint64_t)count > size)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "variable '%s': %lld strings cannot fit in %zu bytes", key,
                          (long long)count, size);
    uint64_t *lens = malloc((size_t)(count ? count : 1) * sizeof *lens);
    if (!lens) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", key);
    kiln_status st;
    kiln_tensor *t = NULL;
    const uint8_t *p = data, *end = data + size;
    uint32_t crc = 0;
    if (size == 0 && count == 0) goto check_crc; /* nothing was written */
    for (int64_t i = 0; i < count; i++) {
        if (!get_varint64(&p, end, &lens[i])) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "variable '%s': string lengths are truncated "
                            "or malformed in %s", key, file);
            goto err_free_lens;
        }
        uint8_t le[8];
        int w = lens[i] <= UINT32_MAX ? 4 : 8;
        for (int k = 0; k < w; k++) le[k] = (uint8_t)(lens[i] >> (8 * k));
        crc = kiln_crc32c_extend(crc, le, (size_t)w);
    }
    if (end - p < 4) {
        st = kiln_error(KILN_ERR_INVALID_MODEL,
                        "variable '%s': string length checksum is missing in %s", key, file);
        goto err_free_lens;
    }
    if (BUNDLE_CHECK_CRC && kiln_crc32c_unmask(le32(p)) != crc) {
        st = kiln_error(KILN_ERR_INVALID_MODEL,
                        "variable '%s': crc32c mismatch of the string lengths in %s", key, file);
        goto err_free_lens;
    }
    crc = kiln_crc32c_extend(crc, p, 4);
    p += 4;
    size_t left = (size_t)(end - p);
    for (int64_t i = 0; i < count; i++) {
        if (lens[i] > left) {
            st = kiln_error(KILN_ERR_INVALID_MODEL,
                            "variable '%s': string %lld of %llu bytes runs past the entry's %zu "
                            "bytes in %s",
                            key, (long long)i, (unsigned long long)lens[i], size, file);
            goto err_free_lens;
        }
        left -= (size_t)lens[i];
    }
    if (left) {
        st = kiln_error(KILN_ERR_INVALID_MODEL,
                        "variable '%s': %zu bytes after the last string in %s", key, left, file);
        goto err_free_lens;
    }
    crc = kiln_crc32c_extend(crc, p, (size_t)(end - p));
check_crc:
    if (BUNDLE_CHECK_CRC && crc != want_crc) {
        st = kiln_error(KILN_ERR_INVALID_MODEL,
                        "variable '%s': crc32c mismatch in %s (stored %08x, computed %08x)", key,
                        file, want_crc, crc);
        goto err_free_lens;
    }
    if ((st = kiln_tensor_new(KILN_DTYPE_STRING, rank, dims, &t)) != KILN_OK) goto err_free_lens;
    for (int64_t i = 0; i < count; i++) {
        st = kiln_tensor_set_string(t, (size_t)i, (const char *)p, (size_t)lens[i]);
        if (st != KILN_OK) goto err_free_tensor;
        p += lens[i];
    }
    free(lens);
    *out = t;
    return KILN_OK;

err_free_tensor:
    kiln_tensor_free(t);
err_free_lens:
    free(lens);
    return st;
}

kiln_status kiln_bundle_read(struct kiln_bundle *b, const char *key, kiln_tensor **out)
{
    if (out) *out = NULL;
    if (!b || !key || !out)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_bundle_read: NULL argument");
    const struct bundle_entry *be = find_entry(b, key);
    if (!be)
        return kiln_error(KILN_ERR_NOT_FOUND, "no variable '%s' in the checkpoint '%s'", key,
                          b->prefix);
    const KilnTf__BundleEntryProto *e = be->e;
    if (e->n_slices)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "variable '%s' is partitioned into %zu slices; Kiln cannot read "
                          "partitioned variables",
                          key, e->n_slices);
    kiln_dtype dt = KILN_DTYPE_UNDEFINED;
    kiln_status st = map_dtype(e->dtype, key, &dt);
    if (st != KILN_OK) return st;

    int rank = 0;
    int64_t dims[KILN_MAX_RANK];
    char sbuf[160];
    if (e->shape) { /* an absent shape is a scalar */
        if (e->shape->unknown_rank)
            return kiln_error(KILN_ERR_INVALID_MODEL, "variable '%s' has a shape of unknown rank",
                              key);
        if (e->shape->n_dim > KILN_MAX_RANK)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "variable '%s' has rank %zu; Kiln's maximum is %d", key,
                              e->shape->n_dim, KILN_MAX_RANK);
        rank = (int)e->shape->n_dim;
        for (int i = 0; i < rank; i++) dims[i] = e->shape->dim[i]->size;
    }
    int64_t count = kiln_shape_count(rank, dims);
    if (count < 0)
        return kiln_error(KILN_ERR_INVALID_MODEL, "variable '%s': shape %s is negative or too large",
                          key, kiln_shape_str(rank, dims, sbuf, sizeof sbuf));

    const struct bundle_shard *s = &b->shards[e->shard_id]; /* checked at open */
    const char *file = base_name(s->path);
    if (e->offset < 0 || e->size < 0 || (uint64_t)e->offset > s->map.size ||
        (uint64_t)e->size > s->map.size - (uint64_t)e->offset)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "variable '%s': bytes %lld to %lld lie outside %s (%zu bytes)", key,
                          (long long)e->offset, (long long)e->offset + (long long)e->size, file,
                          s->map.size);
    const uint8_t *data = (const uint8_t *)s->map.data + e->offset;
    size_t size = (size_t)e->size;
    uint32_t want_crc = kiln_crc32c_unmask(e->crc32c);

    if (dt == KILN_DTYPE_STRING)
        return read_strings(key, file, data, size, rank, dims, count, want_crc, out);

    size_t es = kiln_dtype_size(dt);
    if ((uint64_t)count * es != size)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "variable '%s': shape %s of %s needs %lld bytes, but the entry has %zu",
                          key, kiln_shape_str(rank, dims, sbuf, sizeof sbuf), kiln_dtype_name(dt),
                          (long long)count * (long long)es, size);
    uint32_t crc = kiln_crc32c(data, size);
    if (BUNDLE_CHECK_CRC && crc != want_crc)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "variable '%s': crc32c mismatch in %s (stored %08x, computed %08x)", key,
                          file, want_crc, crc);
    if (dt != KILN_DTYPE_BOOL && size > 0 && (uintptr_t)data % es == 0)
        return kiln_tensor_wrap(dt, rank, dims, (void *)data, size, out);
    kiln_tensor *t;
    if ((st = kiln_tensor_new(dt, rank, dims, &t)) != KILN_OK) return st;
    if (dt == KILN_DTYPE_BOOL) { /* Kiln bools are exactly 0 or 1 */
        uint8_t *o = t->data;
        for (size_t i = 0; i < size; i++) o[i] = data[i] != 0;
    } else if (size) {
        memcpy(t->data, data, size);
    }
    *out = t;
    return KILN_OK;
}

kiln_status kiln_bundle_keep_maps(struct kiln_bundle *b, struct kiln_model *m)
{
    if (!b || !m) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_bundle_keep_maps: NULL argument");
    for (int i = 0; i < b->num_shards; i++) {
        struct bundle_shard *s = &b->shards[i];
        if (!s->owned) continue;
        kiln_status st = kiln_model_keep_map(m, &s->map);
        if (st != KILN_OK) return st;
        s->owned = false; /* the model unmaps it; the bundle may still read through it */
    }
    return KILN_OK;
}

void kiln_bundle_close(struct kiln_bundle *b)
{
    if (!b) return;
    if (b->shards) {
        for (int i = 0; i < b->num_shards; i++) {
            if (b->shards[i].owned) kiln_file_unmap(&b->shards[i].map);
            free(b->shards[i].path);
        }
        free(b->shards);
    }
    for (int i = 0; i < b->n_entries; i++) {
        free(b->entries[i].key);
        kiln_tf__bundle_entry_proto__free_unpacked(b->entries[i].e, NULL);
    }
    free(b->entries);
    free(b->prefix);
    free(b);
}
