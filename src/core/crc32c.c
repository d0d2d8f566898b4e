/*
 * crc32c.c - CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78).
 *
 * Two implementations, chosen once at first use: the SSE4.2 crc32
 * instruction on x86-64 CPUs that have it (checkpoints can be gigabytes, and
 * every byte of every tensor is checksummed), and a portable slice-by-8
 * table walk everywhere else. Both are checked against the standard check
 * value (CRC-32C of "123456789" is 0xE3069283) by the tests.
 */
#include "core/crc32c.h"

#include <pthread.h>
#include <string.h>

#define CRC32C_POLY 0x82f63b78u

static uint32_t crc_table[8][256]; /* slice-by-8 tables, filled by crc_init */
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static uint32_t (*crc_impl)(uint32_t, const uint8_t *, size_t);

/* Portable slice-by-8 update of a pre-inverted crc. */
static uint32_t crc_update_table(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= crc;
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
              crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
              crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>

/* The same update with the SSE4.2 crc32 instruction (8 bytes per step). */
__attribute__((target("sse4.2"))) static uint32_t crc_update_sse42(uint32_t crc,
                                                                   const uint8_t *p, size_t n)
{
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
    crc_impl = crc_update_table;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) crc_impl = crc_update_sse42;
#endif
}

uint32_t kiln_crc32c_extend(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&crc_once, crc_init);
    if (n == 0) return crc;
    return ~crc_impl(~crc, data, n);
}
