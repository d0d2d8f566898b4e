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

/* kiln_crc32c_extend and the inline kiln_crc32c, kiln_crc32c_mask (the stored,
 * "masked" form of a CRC, as TF's crc32c::Mask) and kiln_crc32c_unmask are
 * declared in include/kiln/kiln_util.h: the server's TFRecord code uses them too. */
#include "kiln/kiln_util.h"

#endif
