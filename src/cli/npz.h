/*
 * npz.h - NumPy .npz archives (np.savez, np.savez_compressed) for `kiln
 * profile --data`: a zip file whose members are NAME.npy files.
 *
 * The reader walks the zip's central directory (found through its end
 * record; the zip64 forms numpy writes for large members are read too),
 * takes each member that is stored (method 0) or deflated (method 8),
 * checks its CRC-32 and declared size, and parses it with the .npy reader
 * (npy.h). Archives are untrusted: every offset and size is checked
 * against the file, a member may not inflate past its declared size, nor
 * declare more than deflate's 1032:1 ratio allows or KILN_NPZ_MAX_MEMBER,
 * and the number of members is bounded. Errors name
 * the archive, the member and the problem (kiln_npz_last_error()).
 * Fuzzed by fuzz/fuzz_npz.c.
 */
#ifndef KILN_CLI_NPZ_H
#define KILN_CLI_NPZ_H

#include <stddef.h>

#include "kiln/kiln.h"

#define KILN_NPZ_MAX_MEMBERS 4096
#define KILN_NPZ_MAX_MEMBER ((size_t)1 << 32) /* bytes of one inflated member */

typedef struct kiln_npz {
    int n;
    char **names;          /* [i] member name without ".npy" (owned) */
    kiln_tensor **tensors; /* [i] owned */
} kiln_npz;

/* Parse an archive's bytes (what names it in messages). On success *out is
 * owned by the caller (kiln_npz_free); members not named *.npy are skipped. */
kiln_status kiln_npz_parse(const unsigned char *data, size_t size, const char *what,
                           kiln_npz **out);
/* Read and parse the file at path. */
kiln_status kiln_npz_read(const char *path, kiln_npz **out);
void kiln_npz_free(kiln_npz *z);
/* The message for the last failing kiln_npz_* call on this thread. */
const char *kiln_npz_last_error(void);

#endif
