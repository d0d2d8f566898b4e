/*
 * crc32c.h - CRC-32C (Castagnoli), as used by TensorFlow checkpoints.
 *
 * TensorFlow's TensorBundle format (and the LevelDB table under its .index
 * file) checksums every block and every tensor with CRC-32C, and stores the
 * value "masked" (rotated and offset) so that a CRC of data that itself
 * contains CRCs does not degenerate. kiln_crc32c_extend continues a running
 * CRC the way TF's crc32c::Extend does: kiln_crc32c_extend(0, p, n) is the
 * CRC of p[0..n), and extending it with q gives the CRC of p followed by q.
 */
#ifndef KILN_CORE_CRC32C_H
#define KILN_CORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of data[0..n) appended to a message whose CRC-32C is crc. Uses the
 * SSE4.2 crc32 instruction when the CPU has it, tables otherwise. */
uint32_t kiln_crc32c_extend(uint32_t crc, const void *data, size_t n);

/* CRC-32C of data[0..n). */
static inline uint32_t kiln_crc32c(const void *data, size_t n)
{
    return kiln_crc32c_extend(0, data, n);
}

#define KILN_CRC32C_MASK_DELTA 0xa282ead8u

/* The stored ("masked") form of a CRC, as TF's crc32c::Mask. */
static inline uint32_t kiln_crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + KILN_CRC32C_MASK_DELTA;
}

/* Inverse of kiln_crc32c_mask. */
static inline uint32_t kiln_crc32c_unmask(uint32_t masked)
{
    uint32_t rot = masked - KILN_CRC32C_MASK_DELTA;
    return (rot >> 17) | (rot << 15);
}

#endif
