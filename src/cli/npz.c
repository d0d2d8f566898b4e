/*
 * npz.c - NumPy .npz archives (npz.h): a small zip reader (central
 * directory, stored and deflated members, zip64 sizes and offsets) over
 * zlib's raw inflate, handing each member to the .npy reader.
 */
#include "cli/npz.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "cli/npy.h"

static _Thread_local char npz_err[640];

const char *kiln_npz_last_error(void)
{
    return npz_err;
}

static kiln_status npz_fail(kiln_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static kiln_status npz_fail(kiln_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(npz_err, sizeof npz_err, fmt, ap);
    va_end(ap);
    return st;
}

static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const unsigned char *p) { return (uint32_t)rd16(p) | (uint32_t)rd16(p + 2) << 16; }
static uint64_t rd64(const unsigned char *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

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

/* The zip64 extra field's values replace those that are 0xFFFFFFFF, in
 * the order uncompressed size, compressed size, local header offset. */
static int zip64_extra(const unsigned char *x, size_t n, uint64_t *usize, uint64_t *csize,
                       uint64_t *off)
{
    while (n >= 4) {
        uint16_t id = rd16(x), len = rd16(x + 2);
        if ((size_t)len + 4 > n) return 0;
        if (id == 1) {
            const unsigned char *v = x + 4;
            size_t left = len;
            uint64_t *f[3] = {usize, csize, off};
            for (int k = 0; k < 3; k++) {
                if (*f[k] != 0xFFFFFFFFu) continue;
                if (left < 8) return 0;
                *f[k] = rd64(v);
                v += 8;
                left -= 8;
            }
            return 1;
        }
        x += 4 + len;
        n -= 4 + (size_t)len;
    }
    return 1;
}

/* Inflate or copy one member into a new buffer of exactly usize bytes. */
static kiln_status member_bytes(const unsigned char *src, uint64_t csize, uint64_t usize, int method,
                                uint32_t crc, const char *what, const char *name, unsigned char **out)
{
    if (usize > KILN_NPZ_MAX_MEMBER)
        return npz_fail(KILN_ERR_INVALID_ARGUMENT, "%s: member '%s' declares %llu bytes, more than "
                        "the %zu allowed", what, name, (unsigned long long)usize, KILN_NPZ_MAX_MEMBER);
    /* deflate expands at most 1032:1, so a larger claim is a lie (and would
     * make a tiny file allocate gigabytes) */
    if (method == 8 && usize / 1032 > csize + 1)
        return npz_fail(KILN_ERR_INVALID_ARGUMENT, "%s: member '%s' declares %llu bytes from %llu "
                        "deflated bytes, more than deflate can expand", what, name,
                        (unsigned long long)usize, (unsigned long long)csize);
    if (method == 0 && csize != usize)
        return npz_fail(KILN_ERR_INVALID_ARGUMENT, "%s: member '%s' is stored with %llu bytes but "
                        "declares %llu", what, name, (unsigned long long)csize, (unsigned long long)usize);
    unsigned char *buf = malloc(usize ? (size_t)usize : 1);
    if (!buf) return npz_fail(KILN_ERR_OUT_OF_MEMORY, "%s: member '%s': out of memory", what, name);
    if (method == 0) {
        if (usize) memcpy(buf, src, (size_t)usize);
    } else {
        z_stream zs;
        memset(&zs, 0, sizeof zs);
        if (inflateInit2(&zs, -15) != Z_OK) {
            free(buf);
            return npz_fail(KILN_ERR_OUT_OF_MEMORY, "%s: member '%s': zlib failed", what, name);
        }
        uint64_t in_done = 0, out_done = 0;
        int zr = Z_OK;
        while (zr == Z_OK) {
            uInt in_chunk = (uInt)(csize - in_done > (1u << 30) ? (1u << 30) : csize - in_done);
            uInt out_chunk = (uInt)(usize - out_done > (1u << 30) ? (1u << 30) : usize - out_done);
            zs.next_in = (Bytef *)(src + in_done);
            zs.avail_in = in_chunk;
            zs.next_out = buf + out_done;
            zs.avail_out = out_chunk;
            zr = inflate(&zs, Z_NO_FLUSH);
            in_done += in_chunk - zs.avail_in;
            out_done += out_chunk - zs.avail_out;
            if (zr == Z_OK && in_chunk == zs.avail_in && out_chunk == zs.avail_out) zr = Z_BUF_ERROR;
            if (zr == Z_OK && out_done == usize && zs.avail_out == 0 && in_done == csize) zr = Z_BUF_ERROR;
        }
        inflateEnd(&zs);
        if (zr != Z_STREAM_END || out_done != usize) {
            free(buf);
            return npz_fail(KILN_ERR_INVALID_ARGUMENT, "%s: member '%s': the deflated data is "
                            "corrupt or not %llu bytes long", what, name, (unsigned long long)usize);
        }
    }
    uLong c = crc32(0L, Z_NULL, 0);
    for (uint64_t done = 0; done < usize;) {
        uInt chunk = (uInt)(usize - done > (1u << 30) ? (1u << 30) : usize - done);
        c = crc32(c, buf + done, chunk);
        done += chunk;
    }
    if ((uint32_t)c != crc) {
        free(buf);
        return npz_fail(KILN_ERR_INVALID_ARGUMENT, "%s: member '%s': CRC-32 mismatch (stored 0x%08x, "
                        "computed 0x%08x)", what, name, crc, (uint32_t)c);
    }
    *out = buf;
    return KILN_OK;
}

kiln_status kiln_npz_parse(const unsigned char *data, size_t size, const char *what, kiln_npz **out)
{
    *out = NULL;
    /* the end of central directory record, within the last 64 KiB + 22 bytes */
    size_t eocd = SIZE_MAX;
    for (size_t back = 22; back <= size && back <= 22 + 65535; back++)
        if (rd32(data + size - back) == 0x06054b50u) {
            eocd = size - back;
            break;
        }
    if (eocd == SIZE_MAX)
        return npz_fail(KILN_ERR_INVALID_ARGUMENT, "%s: not a zip archive (no end of central "
                        "directory record)", what);
    uint64_t count = rd16(data + eocd + 10), cd_size = rd32(data + eocd + 12),
             cd_off = rd32(data + eocd + 16);
    if ((count == 0xFFFF || cd_off == 0xFFFFFFFFu || cd_size == 0xFFFFFFFFu) && eocd >= 20 &&
        rd32(data + eocd - 20) == 0x07064b50u) { /* zip64 locator, then the zip64 end record */
        uint64_t z64 = rd64(data + eocd - 20 + 8);
        if (z64 > size || size - z64 < 56 || rd32(data + z64) != 0x06064b50u)
            return npz_fail(KILN_ERR_INVALID_ARGUMENT, "%s: bad zip64 end of central directory", what);
        count = rd64(data + z64 + 32);
        cd_size = rd64(data + z64 + 40);
        cd_off = rd64(data + z64 + 48);
    }
    if (cd_off > size || cd_size > size - cd_off)
        return npz_fail(KILN_ERR_INVALID_ARGUMENT, "%s: the central directory lies outside the file", what);
    if (count > KILN_NPZ_MAX_MEMBERS)
        return npz_fail(KILN_ERR_INVALID_ARGUMENT, "%s: %llu members, at most %d allowed", what,
                        (unsigned long long)count, KILN_NPZ_MAX_MEMBERS);
    kiln_npz *z = calloc(1, sizeof *z);
    if (z) {
        z->names = calloc((size_t)count + 1, sizeof *z->names);
        z->tensors = calloc((size_t)count + 1, sizeof *z->tensors);
    }
    if (!z || !z->names || !z->tensors) {
        kiln_npz_free(z);
        return npz_fail(KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    }
    kiln_status st = KILN_OK;
    size_t p = (size_t)cd_off, end = (size_t)(cd_off + cd_size);
    for (uint64_t i = 0; i < count && st == KILN_OK; i++) {
        if (end - p < 46 || rd32(data + p) != 0x02014b50u) {
            st = npz_fail(KILN_ERR_INVALID_ARGUMENT, "%s: central directory entry %llu is malformed",
                          what, (unsigned long long)i + 1);
            break;
        }
        int flags = rd16(data + p + 8), method = rd16(data + p + 10);
        uint32_t crc = rd32(data + p + 16);
        uint64_t csize = rd32(data + p + 20), usize = rd32(data + p + 24);
        size_t nlen = rd16(data + p + 28), xlen = rd16(data + p + 30), clen = rd16(data + p + 32);
        uint64_t loff = rd32(data + p + 42);
        if (end - p - 46 < nlen + xlen + clen) {
            st = npz_fail(KILN_ERR_INVALID_ARGUMENT, "%s: central directory entry %llu overruns",
                          what, (unsigned long long)i + 1);
            break;
        }
        char name[512];
        snprintf(name, sizeof name, "%.*s", (int)(nlen < 500 ? nlen : 500), (const char *)data + p + 46);
        if (!zip64_extra(data + p + 46 + nlen, xlen, &usize, &csize, &loff)) {
            st = npz_fail(KILN_ERR_INVALID_ARGUMENT, "%s: member '%s': bad zip64 extra field", what, name);
            break;
        }
        p += 46 + nlen + xlen + clen;
        size_t nl = strlen(name);
        if (nl != nlen || nl < 5 || strcmp(name + nl - 4, ".npy") != 0) continue; /* not an array */
        if (flags & 1) {
            st = npz_fail(KILN_ERR_UNSUPPORTED, "%s: member '%s' is encrypted", what, name);
            break;
        }
        if (method != 0 && method != 8) {
            st = npz_fail(KILN_ERR_UNSUPPORTED, "%s: member '%s' uses compression method %d (only "
                          "stored and deflated are read)", what, name, method);
            break;
        }
        if (loff > size || size - loff < 30 || rd32(data + loff) != 0x04034b50u) {
            st = npz_fail(KILN_ERR_INVALID_ARGUMENT, "%s: member '%s': bad local header", what, name);
            break;
        }
        uint64_t dstart = loff + 30 + rd16(data + loff + 26) + rd16(data + loff + 28);
        if (dstart > size || csize > size - dstart) {
            st = npz_fail(KILN_ERR_INVALID_ARGUMENT, "%s: member '%s' runs past the end of the file",
                          what, name);
            break;
        }
        unsigned char *bytes = NULL;
        st = member_bytes(data + dstart, csize, usize, method, crc, what, name, &bytes);
        if (st != KILN_OK) break;
        name[nl - 4] = '\0';
        char member[600];
        snprintf(member, sizeof member, "%s, member '%s.npy'", what, name);
        kiln_tensor *t = NULL;
        st = kiln_npy_parse(bytes, (size_t)usize, member, &t);
        free(bytes);
        if (st != KILN_OK) {
            npz_fail(st, "%s", kiln_npy_last_error());
            break;
        }
        z->names[z->n] = strdup(name);
        z->tensors[z->n] = t;
        z->n++;
        if (!z->names[z->n - 1]) st = npz_fail(KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    }
    if (st != KILN_OK) {
        kiln_npz_free(z);
        return st;
    }
    *out = z;
    return KILN_OK;
}

kiln_status kiln_npz_read(const char *path, kiln_npz **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return npz_fail(KILN_ERR_IO, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 20, len = 0;
    unsigned char *buf = malloc(cap);
    while (buf) {
        if (len == cap) {
            unsigned char *nb = cap < ((size_t)1 << 40) ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf) return npz_fail(KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    if (bad) {
        free(buf);
        return npz_fail(KILN_ERR_IO, "%s: read error", path);
    }
    kiln_status st = kiln_npz_parse(buf, len, path, out);
    free(buf);
    return st;
}
