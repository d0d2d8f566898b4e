/*
 * fuzz_npz.c - libFuzzer target for the .npz reader (src/core/npz.c): a ZIP
 * central directory with ZIP64 fields, stored and deflated members, each
 * parsed as .npy (src/core/npy.c).
 *
 * A failure must come with a message; an archive that parses must hold
 * distinct member names and tensors whose element count matches their
 * shape (a mismatch aborts). Only crashes, hangs, leaks, sanitizer reports
 * and that abort count.
 *
 * Built with clang and -fsanitize=fuzzer as fuzz/fuzz_npz (cmake
 * -DKILN_FUZZ=ON), and with fuzz/replay_main.c as kiln_fuzz_replay_npz_archive,
 * which the test suite runs over tests/corpus/npz.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/npz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[KILN_NPZ_ERR_LEN];
    err[0] = '\0';
    kiln_npz *z = NULL;
    if (kiln_npz_parse(data, size, "fuzz", &z, err) == KILN_OK) {
        for (int i = 0; i < z->n; i++) {
            int64_t n = 1;
            for (int k = 0; k < z->tensors[i]->rank; k++) n *= z->tensors[i]->dims[k];
            if (n != kiln_tensor_count(z->tensors[i])) abort();
            for (int k = 0; k < i; k++)
                if (strcmp(z->names[k], z->names[i]) == 0) abort();
        }
        kiln_npz_free(z);
    } else if (!err[0]) {
        abort();
    }
    return 0;
}
