/*
 * fromlog.h - request log -> warmup file (`kiln warmup-from-log`).
 *
 * A request log written by `kiln serve` (reqlog.h) is a TFRecord file of
 * PredictionLog records that carry a request, its response and LogMetadata.
 * TF Serving's warmup file (assets.extra/tf_serving_warmup_requests) is the
 * same framing with the request only, at most 1000 records. The log is
 * untrusted input (fuzz/fuzz_request_log.c): each record's framing and CRCs
 * are checked (tfrecord.c), its protobuf walked by kiln_pb_check before
 * protobuf-c unpacks it, and anything else is an error naming the record.
 */
#ifndef KILN_SERVE_REQLOG_FROMLOG_H
#define KILN_SERVE_REQLOG_FROMLOG_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"
#include "serve/json.h"

#define KILN_FROMLOG_ERR_LEN 512

typedef struct kiln_fromlog_stats {
    int written;    /* warmup records appended to out, over every call */
    int skipped;    /* log records of other types (multi_inference, session_run, ...) */
    int truncated;  /* 1 when a log's last record was cut short (it ends the log) */
} kiln_fromlog_stats;

/* Append to out the warmup records (TFRecord-framed PredictionLog with
 * predict_log, classify_log or regress_log holding the request only) of the
 * log in data[0..len), until st->written reaches max. KILN_OK, or
 * KILN_ERR_INVALID_ARGUMENT with err naming the record (a CRC mismatch, a
 * record that is not a PredictionLog, a log without its request), or
 * KILN_ERR_OUT_OF_MEMORY. out may hold partial output after an error. */
kiln_status kiln_fromlog_convert(const uint8_t *data, size_t len, int max, kiln_sbuf *out,
                                 kiln_fromlog_stats *st, char *err);

#endif
