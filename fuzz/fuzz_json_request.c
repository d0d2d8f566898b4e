/*
 * fuzz_json_request.c - libFuzzer target for the server's request decoder
 * (src/serve/json.c, src/serve/codec.c).
 *
 * Each input is a request body. It is tokenized with the server's limits,
 * decoded as a TF Serving predict body against a fixed three-input
 * signature (float32 [-1,3], string [-1], int64 any rank) and against a
 * one-input float signature, and as a KServe v2 infer body; whatever
 * decodes is encoded back in both response formats. Only crashes, hangs,
 * leaks and sanitizer reports count; every error must come back as a
 * status.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/codec.h"
#include "serve/json.h"

static void encode_all(kiln_tensor **t, const kiln_value_info *specs, int n)
{
    const char *names[3];
    const kiln_tensor *ts[3];
    for (int i = 0; i < n; i++) {
        names[i] = specs[i].name;
        ts[i] = t[i];
    }
    char err[KILN_JSON_ERR_LEN];
    for (int columnar = 0; columnar < 2; columnar++) {
        kiln_sbuf b = {0};
        kiln_predict_encode(&b, columnar, n, names, ts, err);
        kiln_sbuf_free(&b);
    }
    kiln_sbuf b = {0};
    kiln_infer_encode(&b, "m", 1, NULL, n, names, ts);
    kiln_sbuf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const kiln_value_info three[3] = {
        {"x", KILN_DTYPE_F32, 2, {-1, 3}, {NULL}},
        {"s_bytes", KILN_DTYPE_STRING, 1, {-1}, {NULL}},
        {"i", KILN_DTYPE_I64, -1, {0}, {NULL}},
    };
    static const kiln_value_info one[1] = {{"x", KILN_DTYPE_F32, -1, {0}, {NULL}}};
    char err[KILN_JSON_ERR_LEN];
    kiln_json_doc doc;
    if (kiln_json_parse((const char *)data, size, KILN_JSON_MAX_DEPTH, &doc, err) != KILN_OK)
        return 0;
    kiln_predict_request r;
    if (kiln_predict_parse(&doc, &r, err) == KILN_OK) {
        if (r.signature >= 0) free(kiln_json_string_dup(&doc, r.signature, NULL));
        kiln_tensor *t[3] = {NULL, NULL, NULL};
        if (kiln_predict_decode(&doc, &r, three, 3, t, err) == KILN_OK) {
            encode_all(t, three, 3);
            for (int i = 0; i < 3; i++) kiln_tensor_free(t[i]);
        }
        if (kiln_predict_decode(&doc, &r, one, 1, t, err) == KILN_OK) {
            encode_all(t, one, 1);
            kiln_tensor_free(t[0]);
        }
    }
    kiln_tensor *t[3] = {NULL, NULL, NULL};
    if (kiln_infer_decode(&doc, three, 3, t, err) == KILN_OK) {
        encode_all(t, three, 3);
        for (int i = 0; i < 3; i++) kiln_tensor_free(t[i]);
    }
    kiln_json_doc_free(&doc);
    return 0;
}
