/*
 * warmup.h - TF Serving's model warmup file: a version folder's
 * assets.extra/tf_serving_warmup_requests, a TFRecord file (per record:
 * uint64 length, masked CRC-32C of the length, the bytes, masked CRC-32C of
 * the bytes; little-endian) whose records are serialized
 * tensorflow.serving.PredictionLog messages.
 *
 * kiln_warmup_parse checks the framing and both CRCs of every record, decodes
 * each PredictionLog (schema: src/import/proto/prediction_log.proto) and turns
 * it into a request the server can replay: a predict request (signature name
 * and named input tensors, from TensorProto), or a classify / regress request
 * (signature name and a string tensor [n] of serialized tf.Examples, the
 * context's bytes in front of each example's, which protobuf reads as the
 * merged message). As in TF Serving, at most 1000 records are allowed, and a
 * record of another log type (session_run_log, predict_streamed_log) is an
 * error; multi_inference_log records are accepted and skipped (Kiln has no
 * MultiInference). Replaying is the manager's job (manager.c), through the
 * same run path as requests.
 *
 * Every error names the file's record and the problem ("record 3: data CRC
 * mismatch (stored 0x..., computed 0x...)"). Nothing in the bytes can make
 * these functions abort: they are fuzzed (fuzz/fuzz_warmup.c).
 *
 * Ownership: *out owns everything in it; kiln_warmup_free frees it.
 */
#ifndef KILN_SERVE_WARMUP_H
#define KILN_SERVE_WARMUP_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#define KILN_WARMUP_FILE "assets.extra/tf_serving_warmup_requests"
#define KILN_WARMUP_MAX_RECORDS 1000           /* TF Serving's kMaxNumRecords */
#define KILN_WARMUP_MAX_BYTES ((size_t)1 << 30) /* bound on the file read into memory */
#define KILN_WARMUP_ERR_LEN 512

typedef enum kiln_warmup_kind {
    KILN_WARMUP_PREDICT = 0,
    KILN_WARMUP_CLASSIFY,
    KILN_WARMUP_REGRESS,
    KILN_WARMUP_SKIPPED,    /* multi_inference_log: not replayed */
} kiln_warmup_kind;

typedef struct kiln_warmup_request {
    kiln_warmup_kind kind;
    char *signature;        /* ModelSpec.signature_name; "" = the default signature */
    int n_inputs;           /* predict: named inputs; classify/regress: 1 */
    char **names;           /* [i] input alias (predict), NULL for classify/regress */
    kiln_tensor **tensors;  /* [i] owned; classify/regress: string [n] of tf.Examples */
} kiln_warmup_request;

typedef struct kiln_warmup {
    int n;
    kiln_warmup_request *req;
} kiln_warmup;

/* Parse a whole warmup file's bytes. On failure err says which record and why. */
kiln_status kiln_warmup_parse(const uint8_t *data, size_t len, kiln_warmup **out, char *err);

/*
 * Read <version_dir>/assets.extra/tf_serving_warmup_requests. *out is NULL
 * and KILN_OK is returned when the file does not exist (no warmup); a file
 * that is not a regular file, is too big or does not parse is an error.
 */
kiln_status kiln_warmup_read(const char *version_dir, kiln_warmup **out, char *err);

void kiln_warmup_free(kiln_warmup *w);

/* A ClassificationRequest / RegressionRequest Input (example_list or
 * example_list_with_context) as a string tensor [n] of serialized
 * tf.Examples, the context's bytes in front of each example's: shared with
 * the gRPC Classify, Regress and MultiInference handlers. INVALID_ARGUMENT
 * when it holds no examples, OUT_OF_MEMORY; *out is new (caller frees). */
struct KilnTfs__Input;
kiln_status kiln_warmup_examples(const struct KilnTfs__Input *in, kiln_tensor **out);

#endif
