/*
 * reqlog.h - `kiln serve`'s request log: TF Serving's logging_config, made
 * to work.
 *
 * A model whose ModelConfig has
 *
 *   logging_config {
 *     log_collector_config { type: "kiln_tfrecord"  filename_prefix: "/var/log/kiln/m" }
 *     sampling_config { sampling_rate: 0.01 }
 *   }
 *
 * has that fraction of its successful predict, classify and regress runs
 * (REST, KServe v2 and gRPC alike) written with their responses: as
 * TF Serving's PredictionLog (PredictLog, ClassifyLog or RegressLog, with
 * LogMetadata) in TFRecord framing, or, with type "kiln_jsonl", as one JSON
 * object per line. docs/REQUEST_LOG.md describes the records.
 *
 * The request thread only draws the sample and, when sampled, encodes the
 * record (the observation's tensors are borrowed) and hands it to a bounded
 * queue; one writer thread appends records to files named
 * PREFIX.YYYYMMDD-HHMMSS.NNNNNN.tfrecord (or .jsonl), starts a new file past
 * max_file_bytes, and deletes the oldest log files (of every model,
 * including those of earlier runs) so that all of them together stay within
 * max_disk_bytes. A full queue drops the record (counted, the request never
 * waits); a write that fails (full disk, unwritable folder) drops it too,
 * counted and logged once per model, never fatal.
 *
 * Metrics: kiln_request_log_records_total{model_name},
 * kiln_request_log_dropped_total{model_name,reason} (queue_full, write_error,
 * too_large, encode_error), kiln_request_log_disk_bytes.
 */
#ifndef KILN_SERVE_REQLOG_REQLOG_H
#define KILN_SERVE_REQLOG_REQLOG_H

#include <stdint.h>

#include "kiln/kiln.h"
#include "serve/config.h"
#include "serve/observe.h"

#define KILN_REQLOG_ERR_LEN 512

typedef struct kiln_reqlog_options {
    uint64_t max_file_bytes;   /* a file is closed past this (default 64 MiB) */
    uint64_t max_disk_bytes;   /* all log files together (default 1 GiB); >= max_file_bytes */
    int queue_records;         /* queued records at most (default 1024) */
    uint64_t queue_bytes;      /* queued bytes at most (default 64 MiB) */
} kiln_reqlog_options;

void kiln_reqlog_options_default(kiln_reqlog_options *o);

/* A byte count with an optional binary suffix (K, M, G, T: powers of 1024),
 * e.g. "64M"; 0 when v is not one. */
int kiln_reqlog_parse_bytes(const char *v, uint64_t *out);

typedef struct kiln_reqlog kiln_reqlog;

/* The request log of the models in c that have a logging_config sampling
 * requests; *out is NULL (and KILN_OK returned) when c is NULL (no model
 * config file: nothing to log, now or after a reload). Starts the writer
 * thread; scans the log folders for earlier runs' files (they count toward
 * max_disk_bytes). Errors name the bad option. */
kiln_status kiln_reqlog_create(const kiln_reqlog_options *o, const kiln_server_config *c,
                               kiln_reqlog **out, char *err);
/* A reloaded model config (the file's poll, or gRPC HandleReloadConfigRequest):
 * each model's logging_config takes effect for the next sampled request. A
 * changed prefix or type starts a new file (the old one is closed as it
 * is); a model that lost its logging_config, or left the config, stops
 * being logged; a new one starts. Unchanged models keep their file. Calls
 * are serialized internally; rl NULL is fine. */
kiln_status kiln_reqlog_apply(kiln_reqlog *rl, const kiln_server_config *c);
/* The observer that feeds it (register before the server starts). */
void kiln_reqlog_observer(kiln_reqlog *rl, kiln_observer *obs);
/* Write what is queued, stop the writer, close the files. After the server
 * has stopped calling the observer. NULL is fine. */
void kiln_reqlog_free(kiln_reqlog *rl);

#endif
