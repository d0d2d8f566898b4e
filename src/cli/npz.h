/*
 * npz.h - NumPy .npz archives (np.savez, np.savez_compressed) as named
 * Kiln tensors, for `kiln gate` (gate_data.c).
 *
 * An .npz is a ZIP archive of .npy files. The reader walks the central
 * directory (ZIP64 included, which NumPy writes for every member), takes
 * each member's sizes and offset from it, and decodes stored (method 0) or
 * deflated (method 8, zlib) data, checking the CRC-32; each member is then
 * read by the .npy parser (npy.h). The archive is untrusted: every offset
 * and size is checked against the buffer, the members and the inflated
 * bytes are bounded (KILN_NPZ_MAX_MEMBERS, KILN_NPZ_MAX_BYTES in all), and
 * encrypted or otherwise compressed members are errors. Every error names
 * the archive and the member. The parser is fuzzed (fuzz/fuzz_npz.c).
 */
#ifndef KILN_CLI_NPZ_H
#define KILN_CLI_NPZ_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#define KILN_NPZ_MAX_MEMBERS 4096
#define KILN_NPZ_MAX_BYTES ((uint64_t)4 << 30) /* uncompressed bytes of all members */
#define KILN_NPZ_ERR_LEN 512

typedef struct kiln_npz {
    int n;
    char **names;           /* [n] member names without ".npy" (owned) */
    kiln_tensor **tensors;  /* [n] (owned) */
} kiln_npz;

/* Parse an archive's bytes (what names it in messages). On success *out
 * owns everything (kiln_npz_free). */
kiln_status kiln_npz_parse(const uint8_t *data, size_t size, const char *what, kiln_npz **out,
                           char *err);
/* Read and parse the archive at path. */
kiln_status kiln_npz_read(const char *path, kiln_npz **out, char *err);
void kiln_npz_free(kiln_npz *z);

#endif
