/*
 * test_tensor_bundle.c - the TensorBundle checkpoint reader
 * (src/import/tensor_bundle.c) and CRC-32C (src/core/crc32c.c).
 *
 * Bundles written here, uncompressed and Snappy-compressed, with every
 * supported dtype, string tensors, unaligned and empty tensors, and one
 * broken file per error the reader reports; then the real checkpoints of
 * the shared test data (KILN_TESTDATA, skipped with a message when absent):
 * known variable values, every key of every bundle readable or reported as
 * unsupported, and corrupted copies of half_plus_two.
 */
#include <dirent.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/crc32c.h"
#include "import/model.h"
#include "import/tensor_bundle.h"
#include "tensor_bundle.pb-c.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

static char tmpdir[256];

/* ---- a byte buffer ---- */

struct buf {
    uint8_t *p;
    size_t n, cap;
};

static void put(struct buf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void put_varint(struct buf *b, uint64_t v)
{
    while (v >= 0x80) {
        uint8_t c = (uint8_t)(v | 0x80);
        put(b, &c, 1);
        v >>= 7;
    }
    uint8_t c = (uint8_t)v;
    put(b, &c, 1);
}

static void put_u32(struct buf *b, uint32_t v)
{
    uint8_t c[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, c, 4);
}

static void write_file(const char *path, const void *d, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(d, 1, n, f);
    fclose(f);
}

static uint8_t *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(len > 0 ? (size_t)len : 1);
    *n = fread(p, 1, (size_t)len, f);
    fclose(f);
    return p;
}

/* ---- a small Snappy compressor (greedy, brute-force matches) ---- */

static void snappy_compress(const uint8_t *s, size_t n, struct buf *out)
{
    put_varint(out, n);
    size_t i = 0, lit = 0;
    while (i < n) {
        size_t best = 0, best_off = 0;
        for (size_t off = 1; off <= i && off < 65536; off++) {
            size_t k = 0;
            while (i + k < n && k < 64 && s[i + k] == s[i + k - off]) k++;
            if (k > best) {
                best = k;
                best_off = off;
            }
        }
        if (best < 4) {
            i++;
            continue;
        }
        while (lit < i) { /* pending literal bytes, up to 60 per op */
            size_t len = i - lit < 60 ? i - lit : 60;
            uint8_t tag = (uint8_t)((len - 1) << 2);
            put(out, &tag, 1);
            put(out, s + lit, len);
            lit += len;
        }
        if (best <= 11 && best_off < 2048) {
            uint8_t c[2] = {(uint8_t)(1 | ((best - 4) << 2) | ((best_off >> 8) << 5)), (uint8_t)best_off};
            put(out, c, 2);
        } else {
            uint8_t c[3] = {(uint8_t)(2 | ((best - 1) << 2)), (uint8_t)best_off, (uint8_t)(best_off >> 8)};
            put(out, c, 3);
        }
        i += best;
        lit = i;
    }
    while (lit < n) {
        size_t len = n - lit < 60 ? n - lit : 60;
        uint8_t tag = (uint8_t)((len - 1) << 2);
        put(out, &tag, 1);
        put(out, s + lit, len);
        lit += len;
    }
}

/* ---- a LevelDB table writer ---- */

struct kv {
    char key[80];
    uint8_t val[512];
    size_t vlen;
};

/* Block of entries kvs[0..n) with prefix-compressed keys, a restart every 4. */
static void block_build(struct buf *blk, const struct kv *kvs, int n)
{
    struct buf restarts = {0};
    const char *prev = "";
    for (int i = 0; i < n; i++) {
        size_t shared = 0;
        if (i % 4 == 0) {
            put_u32(&restarts, (uint32_t)blk->n);
        } else {
            while (prev[shared] && prev[shared] == kvs[i].key[shared]) shared++;
        }
        size_t klen = strlen(kvs[i].key);
        put_varint(blk, shared);
        put_varint(blk, klen - shared);
        put_varint(blk, kvs[i].vlen);
        put(blk, kvs[i].key + shared, klen - shared);
        put(blk, kvs[i].val, kvs[i].vlen);
        prev = kvs[i].key;
    }
    if (n == 0) put_u32(&restarts, 0);
    put(blk, restarts.p, restarts.n);
    put_u32(blk, (uint32_t)(restarts.n / 4));
    free(restarts.p);
}

/* Append a block with its trailer (compression type 0 or 1) to the file. */
static void block_emit(struct buf *file, const struct buf *blk, int type, uint64_t *off, uint64_t *size)
{
    struct buf body = {0};
    if (type == 1) snappy_compress(blk->p, blk->n, &body);
    else put(&body, blk->p, blk->n);
    *off = file->n;
    *size = body.n;
    uint8_t t = (uint8_t)type;
    put(&body, &t, 1);
    uint32_t crc = kiln_crc32c_mask(kiln_crc32c(body.p, body.n));
    put(file, body.p, body.n);
    put_u32(file, crc);
    free(body.p);
}

struct index_opts {
    int compress;          /* 1: Snappy data and index blocks */
    int per_block;         /* entries per data block */
    int bad_type;          /* nonzero: first data block gets this compression type, raw */
    uint64_t index_extra;  /* added to the index block size in the footer */
};

/* Write a TensorBundle index with the entries kvs[0..n) (sorted by the caller). */
static void write_index(const char *path, const struct kv *kvs, int n, const struct index_opts *o)
{
    struct buf file = {0}, index = {0};
    struct kv *ikv = calloc((size_t)n + 1, sizeof *ikv);
    int nblocks = 0;
    for (int i = 0; i < n; i += o->per_block) {
        int m = n - i < o->per_block ? n - i : o->per_block;
        struct buf blk = {0};
        block_build(&blk, kvs + i, m);
        uint64_t off, size;
        if (o->bad_type && i == 0) {
            off = file.n;
            size = blk.n;
            uint8_t t = (uint8_t)o->bad_type;
            put(&blk, &t, 1);
            uint32_t crc = kiln_crc32c_mask(kiln_crc32c(blk.p, blk.n));
            put(&file, blk.p, blk.n);
            put_u32(&file, crc);
        } else {
            block_emit(&file, &blk, o->compress, &off, &size);
        }
        free(blk.p);
        struct kv *h = &ikv[nblocks++];
        snprintf(h->key, sizeof h->key, "%s", kvs[i + m - 1].key);
        struct buf hv = {0};
        put_varint(&hv, off);
        put_varint(&hv, size);
        memcpy(h->val, hv.p, hv.n);
        h->vlen = hv.n;
        free(hv.p);
    }
    struct buf meta = {0};
    block_build(&meta, NULL, 0);
    uint64_t moff, msize, ioff, isize;
    block_emit(&file, &meta, 0, &moff, &msize);
    block_build(&index, ikv, nblocks);
    block_emit(&file, &index, o->compress, &ioff, &isize);
    struct buf foot = {0};
    put_varint(&foot, moff);
    put_varint(&foot, msize);
    put_varint(&foot, ioff);
    put_varint(&foot, isize + o->index_extra);
    while (foot.n < 40) put(&foot, "", 1);
    put_u32(&foot, 0x8b80fb57u);
    put_u32(&foot, 0xdb477524u);
    put(&file, foot.p, foot.n);
    write_file(path, file.p, file.n);
    free(foot.p);
    free(meta.p);
    free(index.p);
    free(file.p);
    free(ikv);
}

static void kv_header(struct kv *kv, int num_shards, int endianness, int min_consumer)
{
    KilnTf__BundleHeaderProto h = KILN_TF__BUNDLE_HEADER_PROTO__INIT;
    KilnTf__VersionDef v = KILN_TF__VERSION_DEF__INIT;
    h.has_num_shards = 1;
    h.num_shards = num_shards;
    h.has_endianness = endianness != 0;
    h.endianness = endianness;
    v.has_producer = 1;
    v.producer = 1;
    v.has_min_consumer = min_consumer != 0;
    v.min_consumer = min_consumer;
    h.version = &v;
    kv->key[0] = '\0';
    kv->vlen = kiln_tf__bundle_header_proto__pack(&h, kv->val);
}

struct spec {
    const char *key;
    int dtype;
    int rank;
    int64_t dims[10];
    int64_t offset, size;
    int shard;
    int n_slices;
    int bad_crc;
    int has_crc;      /* crc below is the entry's CRC (strings), not that of the bytes */
    uint32_t crc;
};

static void kv_entry(struct kv *kv, const struct spec *s, const uint8_t *data, size_t data_n)
{
    KilnTf__BundleEntryProto e = KILN_TF__BUNDLE_ENTRY_PROTO__INIT;
    KilnTf__TensorShapeProto sh = KILN_TF__TENSOR_SHAPE_PROTO__INIT;
    KilnTf__TensorShapeProto__Dim d[10], *dp[10];
    KilnTf__TensorSliceProto sl = KILN_TF__TENSOR_SLICE_PROTO__INIT, *slp[1] = {&sl};
    for (int i = 0; i < s->rank; i++) {
        kiln_tf__tensor_shape_proto__dim__init(&d[i]);
        d[i].has_size = 1;
        d[i].size = s->dims[i];
        dp[i] = &d[i];
    }
    sh.n_dim = (size_t)s->rank;
    sh.dim = dp;
    e.has_dtype = 1;
    e.dtype = s->dtype;
    e.shape = &sh;
    e.has_shard_id = s->shard != 0;
    e.shard_id = s->shard;
    e.has_offset = 1;
    e.offset = s->offset;
    e.has_size = 1;
    e.size = s->size;
    e.has_crc32c = 1;
    uint32_t crc = s->has_crc ? s->crc
                   : s->offset >= 0 && s->size >= 0 && (uint64_t)(s->offset + s->size) <= data_n
                       ? kiln_crc32c(data + s->offset, (size_t)s->size)
                       : 0;
    e.crc32c = kiln_crc32c_mask(crc ^ (uint32_t)s->bad_crc);
    if (s->n_slices) {
        e.n_slices = 1;
        e.slices = slp;
    }
    snprintf(kv->key, sizeof kv->key, "%s", s->key);
    kv->vlen = kiln_tf__bundle_entry_proto__pack(&e, kv->val);
}

/* TF's string tensor encoding of strs[0..n) into data, returning the entry's
 * CRC: over the lengths as little-endian uint32s, the 4 bytes of their masked
 * CRC, and the string bytes. */
static uint32_t put_strings(struct buf *data, const char *const *strs, const size_t *lens, int n,
                            int corrupt_len_crc)
{
    uint32_t crc = 0;
    for (int i = 0; i < n; i++) {
        put_varint(data, lens[i]);
        uint8_t le[4] = {(uint8_t)lens[i], (uint8_t)(lens[i] >> 8), (uint8_t)(lens[i] >> 16), (uint8_t)(lens[i] >> 24)};
        crc = kiln_crc32c_extend(crc, le, 4);
    }
    size_t at = data->n;
    put_u32(data, kiln_crc32c_mask(crc) ^ (uint32_t)corrupt_len_crc);
    crc = kiln_crc32c_extend(crc, data->p + at, 4);
    for (int i = 0; i < n; i++) {
        put(data, strs[i], lens[i]);
        crc = kiln_crc32c_extend(crc, strs[i], lens[i]);
    }
    return crc;
}

static char *path_in(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
    return p[k];
}

/* ---- the tests ---- */

static void test_crc32c(void)
{
    CHECK(kiln_crc32c("123456789", 9) == 0xe3069283u, "check value %08x", kiln_crc32c("123456789", 9));
    CHECK(kiln_crc32c("", 0) == 0, "empty");
    /* 32 zero bytes and 32 0xff bytes: RFC 3720 B.4 test vectors */
    uint8_t z[32] = {0}, f[32];
    memset(f, 0xff, sizeof f);
    CHECK(kiln_crc32c(z, 32) == 0x8a9136aau, "zeros %08x", kiln_crc32c(z, 32));
    CHECK(kiln_crc32c(f, 32) == 0x62a8ab43u, "ones %08x", kiln_crc32c(f, 32));
    /* extending in pieces at every alignment equals one pass */
    uint8_t big[1000];
    for (int i = 0; i < 1000; i++) big[i] = (uint8_t)(i * 131 + 7);
    uint32_t whole = kiln_crc32c(big, sizeof big);
    bool same = true;
    for (size_t cut = 0; cut < 40; cut++) {
        uint32_t c = kiln_crc32c_extend(kiln_crc32c(big, cut), big + cut, sizeof big - cut);
        same = same && c == whole;
        /* against a bitwise reference */
        uint32_t r = 0xffffffffu;
        for (size_t i = cut; i < sizeof big; i++) {
            r ^= big[i];
            for (int k = 0; k < 8; k++) r = (r & 1) ? (r >> 1) ^ 0x82f63b78u : r >> 1;
        }
        same = same && (r ^ 0xffffffffu) == kiln_crc32c(big + cut, sizeof big - cut);
    }
    CHECK(same, "crc32c extend / reference mismatch");
    CHECK(kiln_crc32c_unmask(kiln_crc32c_mask(0x12345678u)) == 0x12345678u, "mask round trip");
    CHECK(kiln_crc32c_mask(0) == 0xa282ead8u, "mask(0)");
}

/* Contents of the good bundle's data file. */
static const float f32_vals[6] = {1, 2, 3, 4, 5, 6};
static const int64_t i64_val = -5;
static const uint8_t bool_vals[3] = {0, 2, 1};
static const uint8_t u8_vals[5] = {1, 2, 3, 4, 5};
static const double f64_vals[2] = {1.5, -2};
static const uint16_t bf16_vals[2] = {0x3f80, 0xc000};
static const char *const str_vals[3] = {"", "ab", "xyz\0w"};
static const size_t str_lens[3] = {0, 2, 5};

/* Write bundle "<tmpdir>/<name>" with every kind of entry; specs[] can be
 * modified by `tweak` to break one thing. */
static void write_good_bundle(const char *name, const struct index_opts *o,
                              void (*tweak)(struct spec *, int, struct kv *), int num_shards)
{
    struct buf data = {0};
    struct spec s[12];
    int n = 0;
    memset(s, 0, sizeof s);
    /* keys in sorted order */
    s[n] = (struct spec){.key = "bf16", .dtype = 14, .rank = 1, .dims = {2}};
    s[n].offset = (int64_t)data.n;
    put(&data, bf16_vals, sizeof bf16_vals);
    s[n++].size = sizeof bf16_vals;
    s[n] = (struct spec){.key = "bool", .dtype = 10, .rank = 1, .dims = {3}};
    s[n].offset = (int64_t)data.n;
    put(&data, bool_vals, sizeof bool_vals);
    s[n++].size = sizeof bool_vals;
    put(&data, "\0\0\0\0\0\0\0\0", 8 - data.n % 8);
    s[n] = (struct spec){.key = "empty", .dtype = 1, .rank = 2, .dims = {0, 4}};
    s[n].offset = (int64_t)data.n;
    s[n++].size = 0;
    s[n] = (struct spec){.key = "f32", .dtype = 1, .rank = 2, .dims = {2, 3}};
    s[n].offset = (int64_t)data.n;
    put(&data, f32_vals, sizeof f32_vals);
    s[n++].size = sizeof f32_vals;
    put(&data, "\0", 1); /* f64 lands at an odd offset: read as a copy */
    s[n] = (struct spec){.key = "f64_unaligned", .dtype = 2, .rank = 1, .dims = {2}};
    s[n].offset = (int64_t)data.n;
    put(&data, f64_vals, sizeof f64_vals);
    s[n++].size = sizeof f64_vals;
    put(&data, "\0\0\0\0\0\0\0\0", 8 - data.n % 8);
    s[n] = (struct spec){.key = "i64", .dtype = 9, .rank = 0, .dims = {0}};
    s[n].offset = (int64_t)data.n;
    put(&data, &i64_val, sizeof i64_val);
    s[n++].size = sizeof i64_val;
    s[n] = (struct spec){.key = "layer/sliced", .dtype = 1, .rank = 1, .dims = {4}, .n_slices = 1};
    n++;
    s[n] = (struct spec){.key = "str", .dtype = 7, .rank = 1, .dims = {3}};
    s[n].offset = (int64_t)data.n;
    s[n].crc = put_strings(&data, str_vals, str_lens, 3, 0);
    s[n].has_crc = 1;
    s[n].size = (int64_t)data.n - s[n].offset;
    n++;
    s[n] = (struct spec){.key = "str_badlen", .dtype = 7, .rank = 0, .dims = {0}};
    s[n].offset = (int64_t)data.n;
    s[n].crc = put_strings(&data, str_vals + 1, str_lens + 1, 1, 1);
    s[n].has_crc = 1;
    s[n].size = (int64_t)data.n - s[n].offset;
    n++;
    s[n] = (struct spec){.key = "u8", .dtype = 4, .rank = 1, .dims = {5}};
    s[n].offset = (int64_t)data.n;
    put(&data, u8_vals, sizeof u8_vals);
    s[n++].size = sizeof u8_vals;
    s[n] = (struct spec){.key = "variant", .dtype = 21, .rank = 0, .dims = {0}};
    s[n].offset = (int64_t)data.n;
    s[n++].size = 0;

    struct kv kvs[14];
    kv_header(&kvs[0], num_shards, 0, 0);
    int nkv = 1;
    for (int i = 0; i < n; i++) {
        if (tweak) tweak(&s[i], i, kvs);
        kv_entry(&kvs[nkv++], &s[i], data.p, data.n);
    }
    if (tweak) tweak(NULL, nkv, kvs);
    char ipath[600], dpath[600];
    snprintf(ipath, sizeof ipath, "%s.index", path_in(name));
    snprintf(dpath, sizeof dpath, "%s.data-00000-of-%05d", path_in(name), num_shards);
    write_index(ipath, kvs, nkv, o);
    write_file(dpath, data.p, data.n);
    free(data.p);
}

static void check_good_bundle(const char *name)
{
    struct kiln_bundle *b = NULL;
    kiln_status st = kiln_bundle_open(path_in(name), &b);
    CHECK(st == KILN_OK && b, "%s: open: %s", name, kiln_last_error());
    if (!b) return;
    CHECK(kiln_bundle_count(b) == 11, "%s: %d keys", name, kiln_bundle_count(b));
    CHECK(kiln_bundle_key(b, 0) && strcmp(kiln_bundle_key(b, 0), "bf16") == 0 &&
              strcmp(kiln_bundle_key(b, 10), "variant") == 0 && !kiln_bundle_key(b, 11) &&
              !kiln_bundle_key(b, -1),
          "%s: keys", name);
    kiln_tensor *t;
    st = kiln_bundle_read(b, "f32", &t);
    CHECK(st == KILN_OK, "%s: f32: %s", name, kiln_last_error());
    if (st == KILN_OK) {
        CHECK(t->dtype == KILN_DTYPE_F32 && t->rank == 2 && t->dims[0] == 2 && t->dims[1] == 3 &&
                  memcmp(t->data, f32_vals, sizeof f32_vals) == 0,
              "f32 values");
        CHECK(t->owns_data == 0, "aligned f32 is zero-copy");
        kiln_tensor_free(t);
    }
    st = kiln_bundle_read(b, "i64", &t);
    CHECK(st == KILN_OK && t->rank == 0 && t->dtype == KILN_DTYPE_I64 && *(int64_t *)t->data == -5,
          "i64: %s", kiln_last_error());
    if (st == KILN_OK) kiln_tensor_free(t);
    st = kiln_bundle_read(b, "bool", &t);
    CHECK(st == KILN_OK && t->dtype == KILN_DTYPE_BOOL && t->owns_data &&
              memcmp(t->data, "\0\1\1", 3) == 0,
          "bool (2 read as 1): %s", kiln_last_error());
    if (st == KILN_OK) kiln_tensor_free(t);
    st = kiln_bundle_read(b, "u8", &t);
    CHECK(st == KILN_OK && t->dtype == KILN_DTYPE_U8 && memcmp(t->data, u8_vals, 5) == 0, "u8: %s",
          kiln_last_error());
    if (st == KILN_OK) kiln_tensor_free(t);
    st = kiln_bundle_read(b, "bf16", &t);
    CHECK(st == KILN_OK && t->dtype == KILN_DTYPE_BF16 && memcmp(t->data, bf16_vals, 4) == 0,
          "bf16: %s", kiln_last_error());
    if (st == KILN_OK) kiln_tensor_free(t);
    st = kiln_bundle_read(b, "f64_unaligned", &t);
    CHECK(st == KILN_OK && t->dtype == KILN_DTYPE_F64 && t->owns_data &&
              ((double *)t->data)[0] == 1.5 && ((double *)t->data)[1] == -2,
          "f64 at an odd offset is copied: %s", kiln_last_error());
    if (st == KILN_OK) kiln_tensor_free(t);
    st = kiln_bundle_read(b, "empty", &t);
    CHECK(st == KILN_OK && t->rank == 2 && t->dims[0] == 0 && t->nbytes == 0, "empty: %s",
          kiln_last_error());
    if (st == KILN_OK) kiln_tensor_free(t);
    st = kiln_bundle_read(b, "str", &t);
    CHECK(st == KILN_OK, "str: %s", kiln_last_error());
    if (st == KILN_OK) {
        const kiln_string *s = t->data;
        CHECK(t->dtype == KILN_DTYPE_STRING && t->dims[0] == 3 && s[0].len == 0 && s[1].len == 2 &&
                  memcmp(s[1].data, "ab", 2) == 0 && s[2].len == 5 && memcmp(s[2].data, "xyz\0w", 5) == 0,
              "string values");
        kiln_tensor_free(t);
    }
    st = kiln_bundle_read(b, "str_badlen", &t);
    CHECK(st == KILN_ERR_INVALID_MODEL && strstr(kiln_last_error(), "string lengths"),
          "bad string length checksum: %s", kiln_last_error());
    st = kiln_bundle_read(b, "variant", &t);
    CHECK(st == KILN_ERR_UNSUPPORTED && strstr(kiln_last_error(), "DT_VARIANT"), "variant: %s",
          kiln_last_error());
    st = kiln_bundle_read(b, "layer/sliced", &t);
    CHECK(st == KILN_ERR_UNSUPPORTED && strstr(kiln_last_error(), "partitioned"), "sliced: %s",
          kiln_last_error());
    st = kiln_bundle_read(b, "nope", &t);
    CHECK(st == KILN_ERR_NOT_FOUND && t == NULL && strstr(kiln_last_error(), "'nope'"), "missing key: %s",
          kiln_last_error());
    st = kiln_bundle_read(b, "", &t);
    CHECK(st == KILN_ERR_NOT_FOUND, "the header is not a tensor: %s", kiln_last_error());

    /* zero-copy tensors outlive the bundle once the model keeps the mappings */
    st = kiln_bundle_read(b, "f32", &t);
    struct kiln_model m;
    memset(&m, 0, sizeof m);
    CHECK(kiln_bundle_keep_maps(b, &m) == KILN_OK && m.n_maps == 1, "keep_maps");
    kiln_bundle_close(b);
    if (st == KILN_OK) {
        CHECK(memcmp(t->data, f32_vals, sizeof f32_vals) == 0, "f32 after close");
        kiln_tensor_free(t);
    }
    for (int i = 0; i < m.n_maps; i++) kiln_file_unmap(&m.maps[i]);
    free(m.maps);
}

/* Expect opening bundle `name` (or reading `key` from it) to fail with st
 * and a message containing `want`. */
static void expect_fail(const char *name, const char *key, kiln_status want_st, const char *want)
{
    struct kiln_bundle *b = NULL;
    kiln_status st = kiln_bundle_open(path_in(name), &b);
    if (key && st == KILN_OK) {
        kiln_tensor *t = NULL;
        st = kiln_bundle_read(b, key, &t);
        if (st == KILN_OK) kiln_tensor_free(t);
        CHECK(st != KILN_OK && t == NULL, "%s/%s: read succeeded", name, key);
    }
    CHECK(st == want_st && strstr(kiln_last_error(), want), "%s%s%s: status %s, want %s: '%s' lacks '%s'",
          name, key ? "/" : "", key ? key : "", kiln_status_name(st), kiln_status_name(want_st),
          kiln_last_error(), want);
    kiln_bundle_close(b);
}

static void tw_offset(struct spec *s, int i, struct kv *kv) { if (s && !strcmp(s->key, "f32")) s->offset = 100000; }
static void tw_size(struct spec *s, int i, struct kv *kv) { if (s && !strcmp(s->key, "f32")) s->size = 20; }
static void tw_negdim(struct spec *s, int i, struct kv *kv) { if (s && !strcmp(s->key, "f32")) s->dims[1] = -3; }
static void tw_bigdim(struct spec *s, int i, struct kv *kv)
{
    if (s && !strcmp(s->key, "f32")) s->dims[0] = s->dims[1] = (int64_t)1 << 40;
}
static void tw_rank(struct spec *s, int i, struct kv *kv)
{
    if (s && !strcmp(s->key, "f32")) {
        s->rank = 10;
        for (int k = 0; k < 10; k++) s->dims[k] = 1;
    }
}
static void tw_dtype(struct spec *s, int i, struct kv *kv) { if (s && !strcmp(s->key, "f32")) s->dtype = 99; }
static void tw_crc(struct spec *s, int i, struct kv *kv) { if (s && !strcmp(s->key, "f32")) s->bad_crc = 1; }
static void tw_shard(struct spec *s, int i, struct kv *kv) { if (s && !strcmp(s->key, "u8")) s->shard = 3; }
static void tw_order(struct spec *s, int i, struct kv *kv) { if (s && !strcmp(s->key, "u8")) s->key = "a_first"; }
static void tw_noheader(struct spec *s, int i, struct kv *kv)
{
    if (!s) { /* drop the header; repeat the last entry to keep the count */
        memmove(&kv[0], &kv[1], sizeof *kv * (size_t)(i - 1));
        kv[i - 1] = kv[i - 2];
    }
}
static void tw_bigendian(struct spec *s, int i, struct kv *kv) { if (!s) kv_header(&kv[0], 1, 1, 0); }
static void tw_version(struct spec *s, int i, struct kv *kv) { if (!s) kv_header(&kv[0], 1, 0, 2); }

static void test_synthetic(void)
{
    struct index_opts plain = {0, 3, 0, 0}, snappy = {1, 4, 0, 0}, one_block = {0, 100, 0, 0};
    write_good_bundle("plain", &plain, NULL, 1);
    check_good_bundle("plain");
    write_good_bundle("snappy", &snappy, NULL, 1);
    check_good_bundle("snappy");
    write_good_bundle("one_block", &one_block, NULL, 1);
    check_good_bundle("one_block");

    expect_fail("does_not_exist", NULL, KILN_ERR_NOT_FOUND, "does_not_exist.index");
    write_good_bundle("two_shards", &plain, NULL, 2); /* shard 0 exists, but names "-of-00002" */
    {
        struct kiln_bundle *b;
        kiln_status st = kiln_bundle_open(path_in("two_shards"), &b);
        CHECK(st == KILN_OK, "two shards, all entries in shard 0: %s", kiln_last_error());
        if (st == KILN_OK) kiln_bundle_close(b);
    }
    write_good_bundle("no_data", &plain, NULL, 1);
    unlink(path_in("no_data.data-00000-of-00001"));
    expect_fail("no_data", NULL, KILN_ERR_NOT_FOUND, "no_data.data-00000-of-00001");

    /* damaged index files */
    size_t n;
    write_good_bundle("magic", &plain, NULL, 1);
    uint8_t *idx = read_file(path_in("magic.index"), &n);
    if (idx) {
        idx[n - 1] ^= 0x40;
        write_file(path_in("magic.index"), idx, n);
        expect_fail("magic", NULL, KILN_ERR_INVALID_MODEL, "bad magic number");
        write_file(path_in("magic.index"), idx, 20);
        expect_fail("magic", NULL, KILN_ERR_INVALID_MODEL, "too short");
        idx[n - 1] ^= 0x40;
        idx[10] ^= 0x01; /* inside the first data block */
        write_file(path_in("magic.index"), idx, n);
        expect_fail("magic", NULL, KILN_ERR_INVALID_MODEL, "crc32c mismatch");
        idx[10] ^= 0x01;
        /* drop 30 bytes before the footer: the index block now runs into it */
        memmove(idx + n - 78, idx + n - 48, 48);
        write_file(path_in("magic.index"), idx, n - 30);
        expect_fail("magic", NULL, KILN_ERR_INVALID_MODEL, "index block");
        free(idx);
    }
    struct index_opts past = {0, 3, 0, 1000}, type2 = {0, 3, 2, 0}, bad_snappy = {0, 3, 1, 0};
    write_good_bundle("past_end", &past, NULL, 1);
    expect_fail("past_end", NULL, KILN_ERR_INVALID_MODEL, "runs past the end");
    write_good_bundle("type2", &type2, NULL, 1);
    expect_fail("type2", NULL, KILN_ERR_INVALID_MODEL, "unknown compression type 2");
    write_good_bundle("bad_snappy", &bad_snappy, NULL, 1); /* a raw block labelled Snappy */
    expect_fail("bad_snappy", NULL, KILN_ERR_INVALID_MODEL, "Snappy");

    /* damaged entries */
    write_good_bundle("offset", &plain, tw_offset, 1);
    expect_fail("offset", "f32", KILN_ERR_INVALID_MODEL, "lie outside offset.data-00000-of-00001");
    write_good_bundle("size", &plain, tw_size, 1);
    expect_fail("size", "f32", KILN_ERR_INVALID_MODEL, "needs 24 bytes, but the entry has 20");
    write_good_bundle("negdim", &plain, tw_negdim, 1);
    expect_fail("negdim", "f32", KILN_ERR_INVALID_MODEL, "negative or too large");
    write_good_bundle("bigdim", &plain, tw_bigdim, 1);
    expect_fail("bigdim", "f32", KILN_ERR_INVALID_MODEL, "negative or too large");
    write_good_bundle("rank", &plain, tw_rank, 1);
    expect_fail("rank", "f32", KILN_ERR_UNSUPPORTED, "rank 10");
    write_good_bundle("dtype", &plain, tw_dtype, 1);
    expect_fail("dtype", "f32", KILN_ERR_INVALID_MODEL, "99 is not a valid TensorFlow DataType");
    write_good_bundle("crc", &plain, tw_crc, 1);
    expect_fail("crc", "f32", KILN_ERR_INVALID_MODEL,
                "variable 'f32': crc32c mismatch in crc.data-00000-of-00001");
    write_good_bundle("shard", &plain, tw_shard, 1);
    expect_fail("shard", NULL, KILN_ERR_INVALID_MODEL, "is in data file 3");
    write_good_bundle("order", &plain, tw_order, 1);
    expect_fail("order", NULL, KILN_ERR_INVALID_MODEL, "out of order");
    write_good_bundle("noheader", &plain, tw_noheader, 1);
    expect_fail("noheader", NULL, KILN_ERR_INVALID_MODEL, "not the bundle header");
    write_good_bundle("bigendian", &plain, tw_bigendian, 1);
    expect_fail("bigendian", NULL, KILN_ERR_UNSUPPORTED, "big-endian");
    write_good_bundle("version", &plain, tw_version, 1);
    expect_fail("version", NULL, KILN_ERR_UNSUPPORTED, "format version 2");

    /* a flipped byte in the data file */
    write_good_bundle("flip", &plain, NULL, 1);
    uint8_t *d = read_file(path_in("flip.data-00000-of-00001"), &n);
    if (d) {
        d[20] ^= 0x10; /* inside f32 */
        write_file(path_in("flip.data-00000-of-00001"), d, n);
        expect_fail("flip", "f32", KILN_ERR_INVALID_MODEL,
                    "variable 'f32': crc32c mismatch in flip.data-00000-of-00001");
        free(d);
    }
}

/* ---- the shared test data ---- */

/* A path under the test data root, formatted (one of four static buffers). */
static const char *tdpath(const char *fmt, ...) KILN_PRINTF(1, 2);
static const char *tdpath(const char *fmt, ...)
{
    static char p[4][4096];
    static int k;
    k = (k + 1) % 4;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p[k], sizeof p[k], fmt, ap);
    va_end(ap);
    return p[k];
}


static const char *testdata(void)
{
    static char root[1024];
    const char *env = getenv("KILN_TESTDATA");
    snprintf(root, sizeof root, "%s", env && *env ? env : KILN_SOURCE_DIR "/../shared/testdata");
    struct stat st;
    return stat(tdpath("%s/savedmodels", root), &st) == 0 && S_ISDIR(st.st_mode) ? root : NULL;
}

/* Read scalar or all-equal float variable `key` of the bundle at prefix. */
static void expect_floats(const char *prefix, const char *key, int rank, const int64_t *dims,
                          float want)
{
    struct kiln_bundle *b;
    kiln_status st = kiln_bundle_open(prefix, &b);
    CHECK(st == KILN_OK, "%s: %s", prefix, kiln_last_error());
    if (st != KILN_OK) return;
    kiln_tensor *t;
    st = kiln_bundle_read(b, key, &t);
    CHECK(st == KILN_OK, "%s '%s': %s", prefix, key, kiln_last_error());
    if (st == KILN_OK) {
        bool ok = t->dtype == KILN_DTYPE_F32 && t->rank == rank;
        for (int i = 0; ok && i < rank; i++) ok = t->dims[i] == dims[i];
        for (int64_t i = 0; ok && i < kiln_tensor_count(t); i++) ok = ((float *)t->data)[i] == want;
        CHECK(ok, "%s '%s': want all %g", prefix, key, want);
        kiln_tensor_free(t);
    }
    kiln_bundle_close(b);
}

static void expect_int(const char *prefix, const char *key, kiln_dtype dt, int64_t want)
{
    struct kiln_bundle *b;
    kiln_status st = kiln_bundle_open(prefix, &b);
    CHECK(st == KILN_OK, "%s: %s", prefix, kiln_last_error());
    if (st != KILN_OK) return;
    kiln_tensor *t;
    st = kiln_bundle_read(b, key, &t);
    CHECK(st == KILN_OK && t->dtype == dt && t->rank == 0, "%s '%s': %s", prefix, key, kiln_last_error());
    if (st == KILN_OK) {
        int64_t v = dt == KILN_DTYPE_I64 ? *(int64_t *)t->data : *(int32_t *)t->data;
        CHECK(v == want, "%s '%s' = %lld, want %lld", prefix, key, (long long)v, (long long)want);
        kiln_tensor_free(t);
    }
    kiln_bundle_close(b);
}

static int bundles_seen, tensors_read, tensors_unsupported;

/* Every .index under dir: open, and read every key (ok or unsupported). */
static void walk_bundles(const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (!d || depth > 16) {
        if (d) closedir(d);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char p[2048];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            walk_bundles(p, depth + 1);
            continue;
        }
        size_t n = strlen(p);
        if (n < 6 || strcmp(p + n - 6, ".index") != 0) continue;
        p[n - 6] = '\0';
        struct kiln_bundle *b;
        kiln_status s = kiln_bundle_open(p, &b);
        CHECK(s == KILN_OK, "%s: %s", p, kiln_last_error());
        if (s != KILN_OK) continue;
        bundles_seen++;
        for (int i = 0; i < kiln_bundle_count(b); i++) {
            kiln_tensor *t;
            s = kiln_bundle_read(b, kiln_bundle_key(b, i), &t);
            CHECK(s == KILN_OK || s == KILN_ERR_UNSUPPORTED, "%s '%s': %s", p,
                  kiln_bundle_key(b, i), kiln_last_error());
            if (s == KILN_OK) {
                tensors_read++;
                kiln_tensor_free(t);
            } else if (s == KILN_ERR_UNSUPPORTED) {
                tensors_unsupported++;
            }
        }
        kiln_bundle_close(b);
    }
    closedir(d);
}

static void copy_file(const char *from, const char *to)
{
    size_t n;
    uint8_t *p = read_file(from, &n);
    if (p) write_file(to, p, n);
    free(p);
}

static void test_real(void)
{
    const char *root = testdata();
    if (!root) {
        CHECK_SKIP("real checkpoints: no savedmodels/ under KILN_TESTDATA or %s/../shared/testdata",
                   KILN_SOURCE_DIR);
        return;
    }
    const char *sv = "savedmodels/serving/tensorflow_serving/servables/tensorflow/testdata";
    char *hp2 = strdup(tdpath("%s/savedmodels/tensorflow/tensorflow/cc/saved_model/testdata/"
                              "half_plus_two/00000123/variables/variables", root));
    expect_floats(hp2, "a", 0, NULL, 0.5f);
    expect_floats(hp2, "b", 0, NULL, 2.0f);
    expect_floats(hp2, "c", 0, NULL, 3.0f);
    const char *p = tdpath("%s/%s/saved_model_half_plus_two_cpu/00000123/variables/variables", root, sv);
    expect_floats(p, "a2", 0, NULL, 0.5f); /* a Snappy-compressed data block */
    expect_floats(p, "c2", 0, NULL, 3.0f);
    p = tdpath("%s/%s/saved_model_half_plus_three/00000123/variables/variables", root, sv);
    expect_floats(p, "b", 0, NULL, 3.0f);
    p = tdpath("%s/%s/saved_model_counter/00000123/variables/variables", root, sv);
    expect_floats(p, "counter", 0, NULL, 0.0f);
    p = tdpath("%s/savedmodels/machinelearning-testdata/Microsoft.ML.TensorFlow.TestModels/"
               "mnist_lr_model/variables/variables", root);
    int64_t w_dims[2] = {784, 10};
    expect_floats(p, "W", 2, w_dims, 0.1f);
    p = tdpath("%s/savedmodels/tfjs/tfjs-node/test_objects/saved_model/int64_multiply/"
               "variables/variables", root);
    expect_int(p, "v1/.ATTRIBUTES/VARIABLE_VALUE", KILN_DTYPE_I64, 3);
    expect_int(p, "v2/.ATTRIBUTES/VARIABLE_VALUE", KILN_DTYPE_I64, 2);
    p = tdpath("%s/savedmodels/tfjs/tfjs-node/test_objects/saved_model/times_two_int/"
               "variables/variables", root);
    expect_int(p, "v/.ATTRIBUTES/VARIABLE_VALUE", KILN_DTYPE_I32, 2);
    {   /* the TF2 object graph: a scalar string tensor */
        struct kiln_bundle *b;
        kiln_tensor *t;
        if (kiln_bundle_open(p, &b) == KILN_OK) {
            kiln_status st = kiln_bundle_read(b, "_CHECKPOINTABLE_OBJECT_GRAPH", &t);
            CHECK(st == KILN_OK && t->dtype == KILN_DTYPE_STRING && t->rank == 0 &&
                      ((kiln_string *)t->data)[0].len > 20,
                  "object graph string: %s", kiln_last_error());
            if (st == KILN_OK) kiln_tensor_free(t);
            kiln_bundle_close(b);
        }
    }

    walk_bundles(tdpath("%s/savedmodels", root), 0);
    printf("real checkpoints: %d bundles, %d tensors read, %d unsupported\n", bundles_seen,
           tensors_read, tensors_unsupported);
    CHECK(bundles_seen >= 25, "only %d bundles found", bundles_seen);

    /* corrupted copies of half_plus_two */
    size_t n;
    copy_file(tdpath("%s.index", hp2), path_in("variables.index"));
    copy_file(tdpath("%s.data-00000-of-00001", hp2), path_in("variables.data-00000-of-00001"));
    uint8_t *d = read_file(path_in("variables.data-00000-of-00001"), &n);
    if (d && n == 12) {
        d[1] ^= 0x01; /* inside 'a' */
        write_file(path_in("variables.data-00000-of-00001"), d, n);
        expect_fail("variables", "a", KILN_ERR_INVALID_MODEL,
                    "variable 'a': crc32c mismatch in variables.data-00000-of-00001");
        expect_floats(path_in("variables"), "b", 0, NULL, 2.0f); /* the others still read */
        write_file(path_in("variables.data-00000-of-00001"), d, 6);
        expect_fail("variables", "b", KILN_ERR_INVALID_MODEL, "lie outside");
    }
    free(d);
    uint8_t *idx = read_file(path_in("variables.index"), &n);
    if (idx && n > 60) {
        write_file(path_in("variables.index"), idx, n - 1);
        expect_fail("variables", NULL, KILN_ERR_INVALID_MODEL, "bad magic number");
        idx[n - 8] = 0;
        write_file(path_in("variables.index"), idx, n);
        expect_fail("variables", NULL, KILN_ERR_INVALID_MODEL, "bad magic number");
        idx[n - 8] = 0x57;
        idx[3] ^= 0x20;
        write_file(path_in("variables.index"), idx, n);
        expect_fail("variables", NULL, KILN_ERR_INVALID_MODEL, "crc32c mismatch");
    }
    free(idx);
    free(hp2);
}

/* Remove the files this test wrote. */
static void cleanup(void)
{
    DIR *d = opendir(tmpdir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (e->d_name[0] != '.') unlink(path_in(e->d_name));
        closedir(d);
    }
    rmdir(tmpdir);
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/kiln_bundle_XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_crc32c();
    test_synthetic();
    test_real();
    cleanup();
    return CHECK_DONE();
}
