/*
 * fuzz_npz.c - libFuzzer target for the .npz reader (src/cli/npz.c), which
 * reads the archives of `kiln profile --data FILE.npz`.
 *
 * Each input is a whole archive given to kiln_npz_parse. A failure must
 * come with a message; a success must hold members with names and
 * tensors. Only crashes, hangs, leaks, sanitizer reports and that abort
 * count. Replayed over tests/corpus/npz by kiln_fuzz_replay_npz.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/npz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_npz *z = NULL;
    if (kiln_npz_parse(data, size, "fuzz.npz", &z) != KILN_OK) {
        if (z || !kiln_npz_last_error()[0]) {
            fprintf(stderr, "fuzz_npz: a failed parse left an archive or no message\n");
            abort();
        }
        return 0;
    }
    for (int i = 0; i < z->n; i++)
        if (!z->names[i] || !z->tensors[i]) {
            fprintf(stderr, "fuzz_npz: member %d is empty\n", i);
            abort();
        }
    kiln_npz_free(z);
    return 0;
}
