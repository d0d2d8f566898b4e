/*
 * batch.h - dynamic batching for `kiln serve --enable_batching`, after TF
 * Serving's BatchingSession: concurrent requests (predict, classify, regress,
 * KServe infer, and warmup replays) to one model
 * version and signature are queued, merged along dimension 0 up to
 * max_batch_size, padded up to the next allowed_batch_sizes entry (by
 * repeating the last row), run once, and split back so each caller gets
 * exactly its rows. With pad_variable_length_inputs, requests whose
 * non-batch dimensions differ are merged too: each input is padded to the
 * largest size of each dimension in the batch, with the request's own first
 * element (TF Serving's PadTensor), and outputs keep the padded size.
 *
 * One batcher per (servable, signature), with its own queue and
 * num_batch_threads worker threads. A batch closes when it holds
 * max_batch_size rows, or when its oldest request has waited
 * batch_timeout_micros. Without pad_variable_length_inputs, requests whose
 * non-batch dimensions (or dtypes) differ from the open batch's are not
 * merged into it: they start the next batch (so they run separately). When
 * max_enqueued_batches batches are already waiting, a request is refused at
 * once: UNAVAILABLE "The batch scheduling queue to which this task
 * was submitted is full" (HTTP 503). A request larger than max_batch_size
 * is refused as TF Serving refuses it: INVALID_ARGUMENT "Task size N is
 * larger than maximum input batch size M".
 *
 * Ownership: kiln_batcher_run borrows the inputs for the call and returns
 * new output tensors owned by the caller. The batcher borrows the session
 * and signature; kiln_batcher_free (when the servable's last reference
 * goes, so no request is queued) joins its threads.
 */
#ifndef KILN_SERVE_BATCH_H
#define KILN_SERVE_BATCH_H

#include <stdint.h>

#include "kiln/kiln.h"
#include "serve/config.h"
#include "serve/json.h"

/* The message of a request stopped by --rest_api_timeout_in_ms (HTTP 504). */
#define KILN_DEADLINE_MESSAGE "Deadline Exceeded"
#define KILN_CANCELLED_MESSAGE "Cancelled"

typedef struct kiln_batcher kiln_batcher;
typedef struct kiln_batch_stats kiln_batch_stats;

/* Counters shared by every batcher: batch sizes, padding, queueing time
 * (TF Serving's names), and the same per model version (Kiln's names). */
kiln_batch_stats *kiln_batch_stats_create(void);
void kiln_batch_stats_free(kiln_batch_stats *s);
/* Prometheus text under TF Serving's batching_session names. */
void kiln_batch_stats_write(kiln_batch_stats *s, kiln_sbuf *b);
/* The per-version batching histograms as JSON for the web console
 * (console.c): {"size_bounds", "queue_bounds_us", "runs", "queue_full",
 * "series": [{"model", "version", "expired", "queue_us", "batch_size",
 * "padding_rows"}]}, each histogram {"count", "sum", "buckets" (last +Inf)};
 * "null" when s is NULL (batching off). */
void kiln_batch_stats_write_json(kiln_batch_stats *s, kiln_sbuf *b);

kiln_status kiln_batcher_create(kiln_session *sess, const kiln_signature *sig,
                                const kiln_batching_params *p, kiln_batch_stats *stats,
                                const char *model, int64_t version, kiln_batcher **out);
void kiln_batcher_free(kiln_batcher *b);

/* The outputs of one request. */
typedef struct kiln_batch_result {
    int n;
    const char **names;  /* [i] output name (owned, as is the array) */
    kiln_tensor **t;     /* [i] owned */
} kiln_batch_result;

/*
 * Run in[0..n) (the signature's inputs, in order) as part of a batch; blocks
 * until the batch has run. deadline_ms (kiln_monotonic_ms clock, 0 = none):
 * a request already past it when its batch is formed is answered
 * DEADLINE_EXCEEDED and dropped before the run; the batch's run stops at the
 * latest deadline of its requests. On error err holds the message and *code
 * TF's code name ("UNAVAILABLE" for a full queue, "DEADLINE_EXCEEDED",
 * "INVALID_ARGUMENT", ...).
 */
kiln_status kiln_batcher_run(kiln_batcher *b, kiln_tensor *const *in, int n, int64_t deadline_ms,
                             kiln_batch_result *out, char *err, const char **code);
/* kiln_batcher_run with the caller's cancel flag (NULL = none): a request
 * whose *cancel is non-zero when its batch is formed is dropped before the
 * run and answered CANCELLED (KILN_CANCELLED_MESSAGE, KILN_ERR_DEADLINE),
 * as a request past its deadline is; both return as soon as the batch is
 * formed, without waiting for its run. A request already inside a running
 * batch is not stopped: the run is shared with the batch's other requests. */
kiln_status kiln_batcher_run_cancel(kiln_batcher *b, kiln_tensor *const *in, int n,
                                    int64_t deadline_ms, const volatile int *cancel,
                                    kiln_batch_result *out, char *err, const char **code);
void kiln_batch_result_free(kiln_batch_result *r);

/* TF Serving's code name for a runtime status ("DEADLINE_EXCEEDED", ...), as
 * error replies and failed batches report it. */
const char *kiln_serve_code_for(kiln_status st);

#endif
