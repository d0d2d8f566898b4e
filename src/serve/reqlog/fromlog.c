/*
 * fromlog.c - turning request-log records into warmup records (see
 * fromlog.h): each PredictionLog is checked, unpacked, and packed again as
 * a PredictionLog of the same type that holds only its request (no
 * response, no log_metadata), which is what TF Serving's warmup reads and
 * what src/serve/warmup.c replays.
 */
#include "serve/reqlog/fromlog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln_util.h"
#include "prediction_log.pb-c.h"
#include "serve/tfrecord.h"

/* Pack msg into out, framed as one TFRecord. */
static kiln_status append_record(const ProtobufCMessage *msg, kiln_sbuf *out)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(n + KILN_TFRECORD_OVERHEAD);
    if (!buf) return KILN_ERR_OUT_OF_MEMORY;
    protobuf_c_message_pack(msg, buf + 12);
    kiln_tfrecord_frame(buf, n);
    kiln_sbuf_put(out, (const char *)buf, n + KILN_TFRECORD_OVERHEAD);
    free(buf);
    return out->oom ? KILN_ERR_OUT_OF_MEMORY : KILN_OK;
}

/* One log record -> at most one warmup record. */
static kiln_status convert_record(const uint8_t *p, size_t n, int index, kiln_sbuf *out,
                                  kiln_fromlog_stats *st, char *err)
{
    if (kiln_pb_check(&kiln_tfs__prediction_log__descriptor, p, n, 64, "PredictionLog") !=
        KILN_OK) {
        snprintf(err, KILN_FROMLOG_ERR_LEN, "record %d: %s", index, kiln_last_error());
        return KILN_ERR_INVALID_ARGUMENT;
    }
    KilnTfs__PredictionLog *log = kiln_tfs__prediction_log__unpack(NULL, n, p);
    if (!log) {
        snprintf(err, KILN_FROMLOG_ERR_LEN, "record %d: not a valid PredictionLog", index);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    KilnTfs__PredictionLog w = KILN_TFS__PREDICTION_LOG__INIT;
    KilnTfs__PredictLog pl = KILN_TFS__PREDICT_LOG__INIT;
    KilnTfs__ClassifyLog cl = KILN_TFS__CLASSIFY_LOG__INIT;
    KilnTfs__RegressLog rl = KILN_TFS__REGRESS_LOG__INIT;
    const void *request = NULL;
    const char *what = "";
    w.log_type_case = log->log_type_case;
    switch (log->log_type_case) {
    case KILN_TFS__PREDICTION_LOG__LOG_TYPE_PREDICT_LOG:
        what = "predict_log";
        request = pl.request = log->predict_log->request;
        w.predict_log = &pl;
        break;
    case KILN_TFS__PREDICTION_LOG__LOG_TYPE_CLASSIFY_LOG:
        what = "classify_log";
        request = cl.request = log->classify_log->request;
        w.classify_log = &cl;
        break;
    case KILN_TFS__PREDICTION_LOG__LOG_TYPE_REGRESS_LOG:
        what = "regress_log";
        request = rl.request = log->regress_log->request;
        w.regress_log = &rl;
        break;
    default: /* multi_inference_log, session_run_log, none: not replayed */
        st->skipped++;
        kiln_tfs__prediction_log__free_unpacked(log, NULL);
        return KILN_OK;
    }
    kiln_status s = KILN_OK;
    if (!request) {
        snprintf(err, KILN_FROMLOG_ERR_LEN, "record %d: %s has no request", index, what);
        s = KILN_ERR_INVALID_ARGUMENT;
    } else {
        s = append_record(&w.base, out);
        if (s == KILN_OK) st->written++;
        else snprintf(err, KILN_FROMLOG_ERR_LEN, "record %d: out of memory", index);
    }
    kiln_tfs__prediction_log__free_unpacked(log, NULL);
    return s;
}

kiln_status kiln_fromlog_convert(const uint8_t *data, size_t len, int max, kiln_sbuf *out,
                                 kiln_fromlog_stats *st, char *err)
{
    size_t at = 0;
    char ferr[KILN_TFRECORD_ERR_LEN];
    for (int index = 0; st->written < max; index++) {
        const uint8_t *rec;
        size_t n;
        switch (kiln_tfrecord_next(data, len, &at, index, &rec, &n, ferr)) {
        case KILN_TFRECORD_END:
            return KILN_OK;
        case KILN_TFRECORD_TRUNCATED:
            st->truncated = 1;
            return KILN_OK;
        case KILN_TFRECORD_CORRUPT:
            snprintf(err, KILN_FROMLOG_ERR_LEN, "%s", ferr);
            return KILN_ERR_INVALID_ARGUMENT;
        case KILN_TFRECORD_RECORD:
            break;
        }
        kiln_status s = convert_record(rec, n, index, out, st, err);
        if (s != KILN_OK) return s;
    }
    return KILN_OK;
}
