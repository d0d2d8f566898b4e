/*
 * fuzz_watermark.c - libFuzzer target for the watermark's ONNX walker
 * (src/security/watermark.c): the input is taken as an ONNX file, verified
 * under a fixed key, and marked in place on a copy. A failure must come
 * with a message; a verify that succeeds must report 8..64 bits with at most
 * that many matched. Only crashes, hangs, leaks, sanitizer reports and those
 * aborts count.
 *
 * Built with clang and -fsanitize=fuzzer as fuzz/fuzz_watermark (cmake
 * -DKILN_FUZZ=ON), and with fuzz/replay_main.c as kiln_fuzz_replay_watermark,
 * which the test suite runs over tests/corpus/watermark.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "security/security.h"
#include "security/watermark.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t key[32] = {1, 2, 3, 4, 5, 6, 7, 8};
    char err[KILN_SEC_ERR_LEN];
    kiln_wm_report rep;
    err[0] = '\0';
    kiln_status st = kiln_wm_verify(data, size, key, "fuzz", 8, 0.02, &rep, err);
    if (st != KILN_OK && !err[0]) abort();
    if (st == KILN_OK && (rep.bits != 8 || rep.matched < 0 || rep.matched > 8)) abort();
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    err[0] = '\0';
    st = kiln_wm_embed(copy, size, key, "fuzz", 8, 0.02, &rep, err);
    if (st != KILN_OK && !err[0]) abort();
    free(copy);
    return 0;
}
