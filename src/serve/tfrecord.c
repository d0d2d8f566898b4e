/*
 * tfrecord.c - TFRecord framing (see tfrecord.h): writing one record's
 * header and footer in place, and reading records one by one with both
 * CRC-32C checks (src/core/crc32c.c).
 */
#include "serve/tfrecord.h"

#include <stdio.h>

#include "kiln/kiln_util.h"

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A stored CRC against the computed one; fuzzing builds compute but do not enforce. */
static int crc_ok(uint32_t stored, uint32_t computed)
{
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
    (void)stored;
    (void)computed;
    return 1;
#else
    return kiln_crc32c_mask(computed) == stored;
#endif
}

void kiln_tfrecord_frame(uint8_t *buf, size_t n)
{
    uint64_t len = (uint64_t)n;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(len >> (8 * i));
    put_le32(buf + 8, kiln_crc32c_mask(kiln_crc32c(buf, 8)));
    put_le32(buf + 12 + n, kiln_crc32c_mask(kiln_crc32c(buf + 12, n)));
}

kiln_tfrecord_next_result kiln_tfrecord_next(const uint8_t *data, size_t len, size_t *at, int index,
                                             const uint8_t **rec, size_t *n, char *err)
{
    size_t p = *at;
    if (p >= len) return KILN_TFRECORD_END;
    if (len - p < 12) {
        snprintf(err, KILN_TFRECORD_ERR_LEN, "record %d: truncated header (%zu bytes left, a "
                 "record needs 12 before its data)", index, len - p);
        return KILN_TFRECORD_TRUNCATED;
    }
    uint64_t size = 0;
    for (int i = 7; i >= 0; i--) size = (size << 8) | data[p + (size_t)i];
    uint32_t got = kiln_crc32c(data + p, 8);
    if (!crc_ok(le32(data + p + 8), got)) {
        snprintf(err, KILN_TFRECORD_ERR_LEN, "record %d: length CRC mismatch (stored 0x%08x, "
                 "computed 0x%08x): not a TFRecord file, or corrupted", index,
                 le32(data + p + 8), kiln_crc32c_mask(got));
        return KILN_TFRECORD_CORRUPT;
    }
    p += 12;
    if (size > len - p || len - p - size < 4) {
        snprintf(err, KILN_TFRECORD_ERR_LEN, "record %d: length %llu runs past the end of the "
                 "file (%zu bytes left)", index, (unsigned long long)size, len - p);
        return KILN_TFRECORD_TRUNCATED;
    }
    got = kiln_crc32c(data + p, (size_t)size);
    if (!crc_ok(le32(data + p + size), got)) {
        snprintf(err, KILN_TFRECORD_ERR_LEN, "record %d: data CRC mismatch (stored 0x%08x, "
                 "computed 0x%08x)", index, le32(data + p + size), kiln_crc32c_mask(got));
        return KILN_TFRECORD_CORRUPT;
    }
    *rec = data + p;
    *n = (size_t)size;
    *at = p + (size_t)size + 4;
    return KILN_TFRECORD_RECORD;
}
