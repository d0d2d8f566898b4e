/*
 * codec.h - the REST request and response bodies: TF Serving's predict
 * (row "instances" and columnar "inputs" formats) and KServe v2's infer.
 *
 * Decoding works on a parsed kiln_json_doc (json.h) and a signature's
 * inputs given as plain kiln_value_info records, so the decoders can be
 * fuzzed without a model. Every error is INVALID_ARGUMENT (HTTP 400) or
 * OUT_OF_MEMORY with a one-line message in err (KILN_JSON_ERR_LEN bytes)
 * naming the input and the problem.
 */
#ifndef KILN_SERVE_CODEC_H
#define KILN_SERVE_CODEC_H

#include "kiln/kiln.h"
#include "serve/json.h"

/* The top level of a predict body. */
typedef struct kiln_predict_request {
    int columnar;  /* 1: "inputs" (columnar), 0: "instances" (row) */
    int value;     /* token of the "inputs" / "instances" value */
    int signature; /* token of "signature_name" (a string), or -1 */
} kiln_predict_request;

/* Find the format, the tensors' value and the signature name. */
kiln_status kiln_predict_parse(const kiln_json_doc *d, kiln_predict_request *r, char *err);

/* Decode the tensors for specs[0..n) into out[0..n) (new tensors, owned by
 * the caller), checking dtype, nesting, rank and fixed dimensions. On error
 * nothing is left in out. */
kiln_status kiln_predict_decode(const kiln_json_doc *d, const kiln_predict_request *r,
                                const kiln_value_info *specs, int n, kiln_tensor **out, char *err);

/* Write {"predictions": ...} (row) or {"outputs": ...} (columnar) for the
 * outputs names[i] / t[i], shaped as TF Serving shapes them. */
kiln_status kiln_predict_encode(kiln_sbuf *b, int columnar, int n, const char *const *names,
                                const kiln_tensor *const *t, char *err);

/* KServe v2 infer: decode {"inputs": [{"name","shape","datatype","data"}]}. */
kiln_status kiln_infer_decode(const kiln_json_doc *d, const kiln_value_info *specs, int n,
                              kiln_tensor **out, char *err);
/* Write the infer response; request (may be NULL) supplies "id". */
void kiln_infer_encode(kiln_sbuf *b, const char *model, int64_t version,
                       const kiln_json_doc *request, int n, const char *const *names,
                       const kiln_tensor *const *t);

/* KServe v2 datatype name ("FP32", "BYTES", ...) and TF's ("DT_FLOAT"). */
const char *kiln_kserve_datatype(kiln_dtype dt);
const char *kiln_tf_dtype_enum(kiln_dtype dt);

#endif
