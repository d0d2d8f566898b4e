/*
 * npz.c - the .npz reader (include/kiln/kiln_util.h): a ZIP central-directory walk (with
 * ZIP64), stored and deflated members, CRC-32 checked, each member parsed
 * as .npy. Only what NumPy's savez and savez_compressed write is needed,
 * and only that is accepted; see include/kiln/kiln_util.h for the limits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <zlib.h>

#include "kiln/kiln_util.h"

#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define SIG_CEN 0x02014b50u
#define SIG_LOCAL 0x04034b50u

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

void kiln_npz_free(kiln_npz *z)
{
    if (!z) return;
    for (int i = 0; i < z->n; i++) {
        free(z->names[i]);
        kiln_tensor_free(z->tensors[i]);
    }
    free(z->names);
    free(z->tensors);
    free(z);
}

/* Find the central directory: *cd_off, *cd_size, *entries. */
static int find_directory(const uint8_t *d, size_t n, uint64_t *cd_off, uint64_t *cd_size,
                          uint64_t *entries)
{
    if (n < 22) return 0;
    size_t lo = n - 22 > 65535 ? n - 22 - 65535 : 0;
    for (size_t i = n - 22 + 1; i-- > lo;) {
        if (rd32(d + i) != SIG_EOCD) continue;
        if ((size_t)rd16(d + i + 20) != n - 22 - i) continue; /* the comment reaches the end */
        *entries = rd16(d + i + 10);
        *cd_size = rd32(d + i + 12);
        *cd_off = rd32(d + i + 16);
        if (*entries == 0xFFFF || *cd_size == 0xFFFFFFFFu || *cd_off == 0xFFFFFFFFu) {
            if (i < 20 || rd32(d + i - 20) != SIG_LOC64) return 0;
            uint64_t e64 = rd64(d + i - 20 + 8);
            if (e64 > n || n - e64 < 56 || rd32(d + e64) != SIG_EOCD64) return 0;
            *entries = rd64(d + e64 + 32);
            *cd_size = rd64(d + e64 + 40);
            *cd_off = rd64(d + e64 + 48);
        }
        return *cd_off <= n && *cd_size <= n - *cd_off;
    }
    return 0;
}

/* Apply a ZIP64 extra field to the sizes and offset that overflowed. */
static int zip64_extra(const uint8_t *x, size_t xl, uint64_t *usize, uint64_t *csize,
                       uint64_t *off)
{
    while (xl >= 4) {
        uint16_t id = rd16(x), len = rd16(x + 2);
        if ((size_t)len > xl - 4) return 0;
        if (id == 0x0001) {
            const uint8_t *p = x + 4;
            size_t left = len;
            uint64_t *f[3] = {usize, csize, off};
            for (int k = 0; k < 3; k++) {
                if (*f[k] != 0xFFFFFFFFu) continue;
                if (left < 8) return 0;
                *f[k] = rd64(p);
                p += 8;
                left -= 8;
            }
        }
        x += 4 + len;
        xl -= 4 + (size_t)len;
    }
    return 1;
}

/* Inflate raw deflate data into exactly usize bytes. */
static int inflate_exact(const uint8_t *src, uint64_t csize, uint8_t *dst, uint64_t usize)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) return 0;
    uint64_t in_left = csize, out_left = usize;
    zs.next_in = (Bytef *)(uintptr_t)src;
    zs.next_out = dst;
    int rc;
    for (;;) {
        if (zs.avail_in == 0 && in_left) {
            uInt k = in_left > 1u << 30 ? 1u << 30 : (uInt)in_left;
            zs.avail_in = k;
            in_left -= k;
        }
        if (zs.avail_out == 0 && out_left) {
            uInt k = out_left > 1u << 30 ? 1u << 30 : (uInt)out_left;
            zs.avail_out = k;
            out_left -= k;
        }
        rc = inflate(&zs, Z_NO_FLUSH);
        if (rc == Z_OK) continue; /* progress was made */
        if (rc == Z_BUF_ERROR && ((zs.avail_in == 0 && in_left) || (zs.avail_out == 0 && out_left)))
            continue;
        break; /* the end, an error, or stuck: more output than usize, or truncated input */
    }
    int ok = rc == Z_STREAM_END && zs.avail_out == 0 && out_left == 0;
    inflateEnd(&zs);
    return ok;
}

static uint32_t crc32_of(const uint8_t *p, uint64_t n)
{
    uLong c = crc32(0L, Z_NULL, 0);
    while (n) {
        uInt k = n > 1u << 30 ? 1u << 30 : (uInt)n;
        c = crc32(c, p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)c;
}

kiln_status kiln_npz_parse(const uint8_t *d, size_t n, const char *what, kiln_npz **out,
                           char *err)
{
    *out = NULL;
    uint64_t cd_off, cd_size, entries;
    if (!find_directory(d, n, &cd_off, &cd_size, &entries)) {
        snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: not a ZIP archive (no valid end of central "
                 "directory)", what);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (entries > KILN_NPZ_MAX_MEMBERS) {
        snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: %llu members, at most %d", what,
                 (unsigned long long)entries, KILN_NPZ_MAX_MEMBERS);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    kiln_npz *z = calloc(1, sizeof *z);
    if (z) {
        z->names = calloc(entries ? entries : 1, sizeof *z->names);
        z->tensors = calloc(entries ? entries : 1, sizeof *z->tensors);
    }
    if (!z || !z->names || !z->tensors) {
        kiln_npz_free(z);
        snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: out of memory", what);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    kiln_status st = KILN_ERR_INVALID_ARGUMENT;
    uint64_t p = cd_off, end = cd_off + cd_size, total = 0;
    for (uint64_t e = 0; e < entries; e++) {
        if (end - p < 46 || rd32(d + p) != SIG_CEN) {
            snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: central directory entry %llu is malformed",
                     what, (unsigned long long)e);
            goto err_free;
        }
        const uint8_t *c = d + p;
        uint16_t flags = rd16(c + 8), method = rd16(c + 10);
        uint32_t crc = rd32(c + 16);
        uint64_t csize = rd32(c + 20), usize = rd32(c + 24), loff = rd32(c + 42);
        size_t nl = rd16(c + 28), xl = rd16(c + 30), cl = rd16(c + 32);
        if (end - p - 46 < (uint64_t)nl + xl + cl) {
            snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: central directory entry %llu overruns it",
                     what, (unsigned long long)e);
            goto err_free;
        }
        char name[1024];
        size_t keep = nl < sizeof name - 1 ? nl : sizeof name - 1;
        memcpy(name, c + 46, keep);
        name[keep] = '\0';
        if (nl == 0 || nl >= sizeof name || strlen(name) != nl) {
            snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: member %llu has an empty, overlong or NUL "
                     "name", what, (unsigned long long)e);
            goto err_free;
        }
        if (!zip64_extra(c + 46 + nl, xl, &usize, &csize, &loff)) {
            snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: member '%.200s': malformed extra field", what,
                     name);
            goto err_free;
        }
        p += 46 + nl + xl + cl;
        if (flags & 1) {
            snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: member '%.200s' is encrypted", what, name);
            st = KILN_ERR_UNSUPPORTED;
            goto err_free;
        }
        if (method != 0 && method != 8) {
            snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: member '%.200s' uses compression method %u "
                     "(stored and deflate are read)", what, name, method);
            st = KILN_ERR_UNSUPPORTED;
            goto err_free;
        }
        /* deflate expands at most 1032:1, so a larger claimed size is a lie
         * (and must not become an allocation) */
        if (usize > KILN_NPZ_MAX_BYTES - total || (method == 0 && csize != usize) ||
            (method == 8 && usize / 1032 > csize + 1)) {
            snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: member '%.200s': size %llu is inconsistent "
                     "or beyond the limit", what, name, (unsigned long long)usize);
            goto err_free;
        }
        total += usize;
        if (loff > n || n - loff < 30 || rd32(d + loff) != SIG_LOCAL) {
            snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: member '%.200s': bad local header offset",
                     what, name);
            goto err_free;
        }
        uint64_t data_off = loff + 30 + (uint64_t)rd16(d + loff + 26) + rd16(d + loff + 28);
        if (data_off > n || n - data_off < csize) {
            snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: member '%.200s' runs past the end", what,
                     name);
            goto err_free;
        }
        const uint8_t *bytes = d + data_off;
        uint8_t *plain = NULL;
        if (method == 8) {
            plain = malloc(usize ? usize : 1);
            if (!plain) {
                snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: out of memory for '%.200s'", what, name);
                st = KILN_ERR_OUT_OF_MEMORY;
                goto err_free;
            }
            if (!inflate_exact(bytes, csize, plain, usize)) {
                free(plain);
                snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: member '%.200s' does not inflate to its "
                         "size", what, name);
                goto err_free;
            }
            bytes = plain;
        }
        if (crc32_of(bytes, usize) != crc) {
            free(plain);
            snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: member '%.200s': CRC-32 mismatch", what, name);
            goto err_free;
        }
        if (nl > 4 && strcmp(name + nl - 4, ".npy") == 0) name[nl - 4] = '\0';
        kiln_tensor *t = NULL;
        st = kiln_npy_parse(bytes, (size_t)usize, name, &t);
        free(plain);
        if (st != KILN_OK) {
            snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: %.200s", what, kiln_npy_last_error());
            goto err_free;
        }
        for (int k = 0; k < z->n; k++) {
            if (strcmp(z->names[k], name) == 0) {
                kiln_tensor_free(t);
                snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: member '%.200s' appears twice", what, name);
                st = KILN_ERR_INVALID_ARGUMENT;
                goto err_free;
            }
        }
        z->names[z->n] = strdup(name);
        if (!z->names[z->n]) {
            kiln_tensor_free(t);
            snprintf(err, KILN_NPZ_ERR_LEN, "%.200s: out of memory", what);
            st = KILN_ERR_OUT_OF_MEMORY;
            goto err_free;
        }
        z->tensors[z->n++] = t;
        st = KILN_ERR_INVALID_ARGUMENT;
    }
    *out = z;
    return KILN_OK;
err_free:
    kiln_npz_free(z);
    return st;
}

kiln_status kiln_npz_read(const char *path, kiln_npz **out, char *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    struct stat sb;
    if (!f || fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (f) fclose(f);
        snprintf(err, KILN_NPZ_ERR_LEN, "cannot read '%.400s' (not a regular file)", path);
        return KILN_ERR_NOT_FOUND;
    }
    if ((uint64_t)sb.st_size > KILN_NPZ_MAX_BYTES) {
        fclose(f);
        snprintf(err, KILN_NPZ_ERR_LEN, "'%.400s' is larger than the limit", path);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    size_t n = (size_t)sb.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        fclose(f);
        snprintf(err, KILN_NPZ_ERR_LEN, "out of memory reading '%.400s'", path);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) {
        free(buf);
        snprintf(err, KILN_NPZ_ERR_LEN, "'%.400s' changed while it was read", path);
        return KILN_ERR_IO;
    }
    kiln_status st = kiln_npz_parse(buf, n, path, out, err);
    free(buf);
    return st;
}
