/*
 * fuzz_tensor_bundle.c - libFuzzer target for the TensorBundle checkpoint reader.
 *
 * A SavedModel's variables/variables.index is untrusted input. Each fuzz
 * input is written as "<tmp>/b.index" next to a fixed data file
 * "<tmp>/b.data-00000-of-00001", then the bundle is opened and every key
 * read (and one that is not there); each must end in a tensor or a status
 * with a message: never a crash, a hang, unbounded memory or a leak.
 *
 * The data file (FUZZ_DATA_BYTES bytes) is: byte i = i for i < 128, then at
 * offset 128 a string tensor {"kiln", "fuzz"} in TF's encoding (14 bytes),
 * then zeros. Seeds in tests/corpus/tensor_bundle refer to these bytes with
 * matching CRCs. In the libFuzzer build (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)
 * the reader computes CRCs but does not stop at a mismatch, so that mutated
 * blocks reach the parsing behind the checksums; the replay build checks
 * them as always.
 *
 * Built two ways: with clang and -fsanitize=fuzzer as fuzz/fuzz_tensor_bundle
 * (cmake -DKILN_FUZZ=ON), and with fuzz/replay_main.c as the plain
 * kiln_fuzz_replay_tensor_bundle that the test suite runs over
 * tests/corpus/tensor_bundle.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "import/tensor_bundle.h"

#define FUZZ_DATA_BYTES 192

static char fuzz_dir[256];
static char fuzz_prefix[300], fuzz_index[320], fuzz_data[340];

static void fuzz_cleanup(void)
{
    unlink(fuzz_index);
    unlink(fuzz_data);
    rmdir(fuzz_dir);
}

static int write_all(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = n ? fwrite(p, 1, n, f) : 0;
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* Create the folder and the data file once per process. */
static int fuzz_setup(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/kiln_fuzz_bundle_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(fuzz_dir)) return -1;
    snprintf(fuzz_prefix, sizeof fuzz_prefix, "%s/b", fuzz_dir);
    snprintf(fuzz_index, sizeof fuzz_index, "%s.index", fuzz_prefix);
    snprintf(fuzz_data, sizeof fuzz_data, "%s.data-00000-of-00001", fuzz_prefix);
    atexit(fuzz_cleanup);

    uint8_t d[FUZZ_DATA_BYTES] = {0};
    for (int i = 0; i < 128; i++) d[i] = (uint8_t)i;
    /* {"kiln", "fuzz"}: varint lengths, masked CRC of the lengths as uint32s, bytes */
    uint8_t *s = d + 128;
    s[0] = 4;
    s[1] = 4;
    uint8_t lens[8] = {4, 0, 0, 0, 4, 0, 0, 0};
    uint32_t m = kiln_crc32c_mask(kiln_crc32c(lens, sizeof lens));
    for (int k = 0; k < 4; k++) s[2 + k] = (uint8_t)(m >> (8 * k));
    memcpy(s + 6, "kilnfuzz", 8);
    return write_all(fuzz_data, d, sizeof d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready; /* 1: set up, -1: setup failed */
    if (!ready) ready = fuzz_setup() == 0 ? 1 : -1;
    if (ready < 0 || write_all(fuzz_index, data, size) != 0) return 0;

    struct kiln_bundle *b = NULL;
    if (kiln_bundle_open(fuzz_prefix, &b) != KILN_OK) {
        /* A failure must come with a message; reading it checks it is a string. */
        (void)*(volatile const char *)kiln_last_error();
        return 0;
    }
    int n = kiln_bundle_count(b);
    for (int i = 0; i < n; i++) {
        kiln_tensor *t = NULL;
        if (kiln_bundle_read(b, kiln_bundle_key(b, i), &t) != KILN_OK) continue;
        /* Touch the first and last byte so that a bad pointer or size shows. */
        if (t->dtype == KILN_DTYPE_STRING) {
            int64_t k = kiln_tensor_count(t);
            const kiln_string *s = t->data;
            for (int64_t j = 0; j < k; j++)
                if (s[j].len) (void)*(volatile const char *)&s[j].data[s[j].len - 1];
        } else if (t->nbytes) {
            (void)*(volatile const uint8_t *)t->data;
            (void)*(volatile const uint8_t *)((const uint8_t *)t->data + t->nbytes - 1);
        }
        kiln_tensor_free(t);
    }
    kiln_tensor *t = NULL;
    if (kiln_bundle_read(b, "\x01 not a key", &t) == KILN_OK) kiln_tensor_free(t);
    kiln_bundle_close(b);
    return 0;
}
