/*
 * tfrecord.h - TFRecord framing, as TensorFlow's RecordWriter writes it and
 * TF Serving's warmup and request logs use it:
 *
 *   uint64 length          little-endian
 *   uint32 masked_crc32c(length's 8 bytes)
 *   byte   data[length]
 *   uint32 masked_crc32c(data)
 *
 * The request log (reqlog/reqlog.c) frames each PredictionLog with
 * kiln_tfrecord_frame; warmup files (warmup.c) and `kiln warmup-from-log`
 * (reqlog/fromlog.c) are read with kiln_tfrecord_next, which checks both CRCs and every length against
 * the bytes that are there (the file is untrusted).
 */
#ifndef KILN_SERVE_TFRECORD_H
#define KILN_SERVE_TFRECORD_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#define KILN_TFRECORD_OVERHEAD 16 /* 12 bytes before the data, 4 after */
#define KILN_TFRECORD_ERR_LEN 256

/* Fill the 12-byte header and the 4-byte footer around buf[12 .. 12 + n):
 * buf holds n + KILN_TFRECORD_OVERHEAD bytes, the data already in place. */
void kiln_tfrecord_frame(uint8_t *buf, size_t n);

/* The result of kiln_tfrecord_next. */
typedef enum kiln_tfrecord_next_result {
    KILN_TFRECORD_RECORD = 0, /* *rec / *n: the next record's data */
    KILN_TFRECORD_END,        /* no bytes left */
    KILN_TFRECORD_TRUNCATED,  /* the last record is cut short (a log being written); err says so */
    KILN_TFRECORD_CORRUPT,    /* a CRC does not match; err says which */
} kiln_tfrecord_next_result;

/* The record at data[*at ..]: on KILN_TFRECORD_RECORD, *rec and *n point
 * into data and *at moves past the record. `index` (0-based) names the
 * record in err (KILN_TFRECORD_ERR_LEN bytes). */
kiln_tfrecord_next_result kiln_tfrecord_next(const uint8_t *data, size_t len, size_t *at, int index,
                                             const uint8_t **rec, size_t *n, char *err);

#endif
