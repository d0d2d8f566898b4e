/*
 * fuzz_warmup.c - libFuzzer target for TF Serving warmup files as
 * `kiln serve` reads them (src/serve/warmup.c): TFRecord framing with
 * CRC-32C, then PredictionLog records into replayable requests.
 *
 * A parse must succeed or fill the error buffer (and leave *out NULL); a
 * parsed file must keep warmup.h's promises: at most 1000 records; predict
 * requests hold a name and a tensor per input; classify / regress requests
 * hold one string tensor [n] with n >= 1; every signature string exists.
 * Anything else aborts. In fuzzing builds the CRCs are computed but not
 * enforced, so the fuzzer reaches the protobuf parser.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "serve/warmup.h"

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_warmup: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[KILN_WARMUP_ERR_LEN];
    err[0] = '\0';
    kiln_warmup *w = (kiln_warmup *)1;
    if (kiln_warmup_parse(data, size, &w, err) != KILN_OK) {
        if (w) fail("*out is not NULL after a failed parse");
        if (!err[0]) fail("a parse failed without a message");
        return 0;
    }
    if (!w || w->n < 0 || w->n > KILN_WARMUP_MAX_RECORDS) fail("bad record count");
    for (int i = 0; i < w->n; i++) {
        const kiln_warmup_request *r = &w->req[i];
        if (r->kind == KILN_WARMUP_SKIPPED) continue;
        if (!r->signature) fail("a request without a signature string");
        if (r->kind == KILN_WARMUP_PREDICT) {
            for (int k = 0; k < r->n_inputs; k++)
                if (!r->names[k] || !r->tensors[k]) fail("a predict input without name or tensor");
        } else if (r->kind == KILN_WARMUP_CLASSIFY || r->kind == KILN_WARMUP_REGRESS) {
            const kiln_tensor *t = r->n_inputs == 1 ? r->tensors[0] : NULL;
            if (!t || t->dtype != KILN_DTYPE_STRING || t->rank != 1 || t->dims[0] < 1)
                fail("examples are not a string tensor [n >= 1]");
        } else {
            fail("unknown request kind");
        }
    }
    kiln_warmup_free(w);
    return 0;
}
