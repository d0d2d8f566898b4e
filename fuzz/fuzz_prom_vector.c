/*
 * fuzz_prom_vector.c - libFuzzer target for the Prometheus answers that
 * `kiln rollout-controller` reads (src/serve/rollout/controller.c,
 * kiln_prom_parse_vector): any bytes must parse into samples or fail with a
 * message; every sample's value must be finite and non-negative (the gates
 * turn them into counts). Anything else aborts.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "serve/rollout/controller.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_prom_sample s[64];
    int n = -1;
    char err[512];
    err[0] = '\0';
    kiln_status st = kiln_prom_parse_vector((const char *)data, size, s, 64, &n, err);
    if (st != KILN_OK && !err[0]) {
        fprintf(stderr, "fuzz_prom_vector: a parse failed without a message\n");
        abort();
    }
    if (st == KILN_OK) {
        if (n < 0 || n > 64) abort();
        for (int i = 0; i < n; i++)
            if (!isfinite(s[i].value) || s[i].value < 0) {
                fprintf(stderr, "fuzz_prom_vector: sample %d has value %g\n", i, s[i].value);
                abort();
            }
    }
    return 0;
}
