/*
 * fuzz_request_log.c - libFuzzer target for request logs as
 * `kiln warmup-from-log` reads them (src/serve/reqlog/fromlog.c over
 * tfrecord.c): TFRecord framing with CRC-32C, then PredictionLog records
 * (requests, responses, LogMetadata) re-packed as warmup records.
 *
 * A conversion must succeed or fill the error buffer; it never writes more
 * than the maximum asked for; what it writes is well-formed TFRecord
 * framing and is handed to the server's warmup reader (src/serve/warmup.c),
 * which must parse it or fail cleanly. Anything else aborts. In fuzzing
 * builds the CRCs are computed but not enforced.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "serve/reqlog/fromlog.h"
#include "serve/tfrecord.h"
#include "serve/warmup.h"

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_request_log: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_sbuf out = {0};
    kiln_fromlog_stats st = {0};
    char err[KILN_FROMLOG_ERR_LEN];
    err[0] = '\0';
    int max = size > 0 ? 1 + data[0] % 8 : 1;
    kiln_status s = kiln_fromlog_convert(data, size, max, &out, &st, err);
    if (s == KILN_ERR_INVALID_ARGUMENT && !err[0]) fail("a conversion failed without a message");
    if (st.written > max) fail("more records than the maximum");
    if (s == KILN_OK && !out.oom) {
        /* the output is whole records, each one converted */
        size_t at = 0;
        int n = 0;
        const uint8_t *rec;
        size_t len;
        char ferr[KILN_TFRECORD_ERR_LEN];
        kiln_tfrecord_next_result r;
        while ((r = kiln_tfrecord_next((const uint8_t *)out.p, out.len, &at, n, &rec, &len,
                                       ferr)) == KILN_TFRECORD_RECORD)
            n++;
        if (r != KILN_TFRECORD_END || n != st.written) fail("the output is not whole records");
        kiln_warmup *w = NULL;
        char werr[KILN_WARMUP_ERR_LEN];
        werr[0] = '\0';
        if (kiln_warmup_parse((const uint8_t *)out.p, out.len, &w, werr) == KILN_OK)
            kiln_warmup_free(w);
        else if (!werr[0])
            fail("the warmup reader failed without a message");
    }
    kiln_sbuf_free(&out);
    return 0;
}
