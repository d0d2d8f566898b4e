/*
 * fuzz_token_file.c - libFuzzer target for the bearer token file parser
 * and the Authorization header check (src/serve/auth.c).
 *
 * The input is parsed as a token file; a failure must come with a message,
 * and a file that parses must hold entries with at least one scope and no
 * two alike. Then the input, cut at its first newline, is checked as an
 * Authorization header against the parsed set (or an empty one): the answer
 * must be 0, 401 or 403, and 0 only with a parsed set. Only crashes, hangs,
 * leaks, sanitizer reports and those aborts count.
 *
 * Built with clang and -fsanitize=fuzzer as fuzz/fuzz_token_file (cmake
 * -DKILN_FUZZ=ON), and with fuzz/replay_main.c as
 * kiln_fuzz_replay_token_file, which the test suite runs over
 * tests/corpus/token_file.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/auth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[KILN_AUTH_ERR_LEN];
    err[0] = '\0';
    kiln_token_set set;
    int parsed = kiln_token_file_parse((const char *)data, size, "fuzz", &set, err, sizeof err) ==
                 KILN_OK;
    if (!parsed && !err[0]) abort();
    for (int i = 0; parsed && i < set.n; i++) {
        if (!set.e[i].scopes) abort();
        for (int j = 0; j < i; j++)
            if (memcmp(set.e[i].hash, set.e[j].hash, 32) == 0) abort();
    }
    size_t n = 0;
    while (n < size && data[n] != '\n') n++;
    char *hdr = malloc(n + 1);
    if (hdr) {
        memcpy(hdr, data, n);
        hdr[n] = '\0';
        static const char *const scopes[] = {"predict", "metadata", "admin", NULL};
        kiln_token_set empty = {NULL, 0};
        for (int k = 0; k < 4; k++) {
            int r = kiln_token_set_check(parsed ? &set : &empty, hdr, scopes[k]);
            if (r != 0 && r != 401 && r != 403) abort();
            if (r == 0 && !parsed) abort();
        }
        free(hdr);
    }
    if (parsed) kiln_token_set_free(&set);
    return 0;
}
