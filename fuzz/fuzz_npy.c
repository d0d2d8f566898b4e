/*
 * fuzz_npy.c - libFuzzer target for the .npy reader (src/core/npy.c), which
 * reads the files of `kiln predict --input name=file.npy`.
 *
 * Each input is a whole .npy file given to kiln_npy_parse. A failure must
 * come with a message. A tensor that parses may not have more elements
 * than the file has bytes (else a tiny file could demand any amount of
 * memory and time: see tests/corpus/npy/crash-*). It is then encoded with
 * kiln_npy_encode and parsed back, and the round trip must give the same
 * dtype, shape and elements (bytes for numbers and bools, which the reader
 * has already normalized to 0/1; byte strings for strings); a mismatch
 * aborts. Only crashes, hangs, leaks, sanitizer reports and that abort
 * count.
 *
 * Built with clang and -fsanitize=fuzzer as fuzz/fuzz_npy (cmake
 * -DKILN_FUZZ=ON), and with fuzz/replay_main.c as kiln_fuzz_replay_npy,
 * which the test suite runs over tests/corpus/npy.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/npy.h"

/* True if a and b hold the same dtype, shape and elements. */
static int same_tensor(const kiln_tensor *a, const kiln_tensor *b)
{
    if (a->dtype != b->dtype || a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    int64_t n = kiln_tensor_count(a);
    if (n != kiln_tensor_count(b)) return 0;
    if (a->dtype == KILN_DTYPE_STRING) {
        const kiln_string *sa = a->data, *sb = b->data;
        for (int64_t i = 0; i < n; i++)
            if (sa[i].len != sb[i].len || (sa[i].len && memcmp(sa[i].data, sb[i].data, sa[i].len)))
                return 0;
        return 1;
    }
    return a->nbytes == b->nbytes && (a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_tensor *t = NULL;
    if (kiln_npy_parse(data, size, "fuzz.npy", &t) != KILN_OK) {
        /* A failure must come with a message; reading it checks it is a string. */
        const char *msg = kiln_npy_last_error();
        if (!msg || !*msg) abort();
        (void)*(volatile const char *)msg;
        return 0;
    }
    /* Every element must be backed by at least one byte of the file, or a
     * few bytes could demand any amount of memory and time. */
    if (kiln_tensor_count(t) > (int64_t)size) {
        fprintf(stderr, "fuzz_npy: %lld elements from a %zu-byte file\n",
                (long long)kiln_tensor_count(t), size);
        abort();
    }
    void *enc = NULL;
    size_t enc_size = 0;
    if (kiln_npy_encode(t, &enc, &enc_size) == KILN_OK) {
        kiln_tensor *back = NULL;
        if (kiln_npy_parse(enc, enc_size, "re-encoded", &back) != KILN_OK) {
            fprintf(stderr, "fuzz_npy: re-encoded tensor does not parse: %s\n",
                    kiln_npy_last_error());
            abort();
        }
        if (!same_tensor(t, back)) {
            fprintf(stderr, "fuzz_npy: the .npy round trip changed the tensor\n");
            abort();
        }
        kiln_tensor_free(back);
        free(enc);
    }
    kiln_tensor_free(t);
    return 0;
}
