/*
 * shadow.h - shadow traffic: a sampled fraction of a model's successful
 * requests also runs on a shadow target (another model, or a version or
 * label of the same one), off the request path, and the two outputs are
 * compared (compare.h). This is how a distilled student is checked against
 * its teacher on live traffic before it takes any (docs/SHADOW.md).
 *
 * The shadow is an observer of the predict path (observe.h). Its `after`
 * hook runs on the request's thread after the primary's run: it draws the
 * sample, takes a free slot of the model's bounded queue (preallocated; a
 * slot's buffers grow only when a larger request comes, so steady traffic
 * allocates nothing), copies the inputs and the primary's compared output
 * into it, and returns; when the queue is full the request is dropped and
 * counted; so is a request whose copy would take the model's queue past
 * KILN_SHADOW_QUEUE_BYTES of buffers. The time the hook takes is the latency the shadow adds to the
 * primary; it is kept in a histogram (p50, p99). The primary's response is
 * never touched.
 *
 * One worker thread takes queued requests in arrival order, acquires the
 * target through the model manager, runs it, compares the outputs and adds
 * the result to the model's statistics: a sliding window (the last
 * KILN_SHADOW_WINDOW_S seconds) and since start. A target that is missing or
 * fails, or whose output cannot be paired with the primary's, is counted as
 * failed, with the last error kept for the JSON view.
 *
 * Configuration is the `shadow` block of each model in Kiln's rollout file
 * (KilnRollout__Shadow, src/import/proto/rollout.proto), applied with
 * kiln_shadow_apply at start and again on every reload. Statistics survive a
 * reload that keeps a model's target, compare mode and output; a change of
 * any of those starts them afresh.
 *
 * Threads: the after hook and the worker read the configuration under a
 * read lock, which kiln_shadow_apply takes for writing; the queues and the
 * statistics have their own short mutexes. Nothing is held while a model
 * runs.
 */
#ifndef KILN_SERVE_SHADOW_SHADOW_H
#define KILN_SERVE_SHADOW_SHADOW_H

#include "kiln/kiln.h"
#include "rollout.pb-c.h"
#include "serve/shadow/compare.h"
#include "serve/manager.h"
#include "serve/observe.h"

#define KILN_SHADOW_ERR_LEN 512        /* err buffers of this API */
#define KILN_SHADOW_WINDOW_S 60        /* the sliding window */
#define KILN_SHADOW_QUEUE_DEFAULT 64   /* queue_size when 0 */
#define KILN_SHADOW_QUEUE_MAX 65536
#define KILN_SHADOW_QUEUE_BYTES ((size_t)256 << 20) /* a model's queued copies; past it, drops */

typedef struct kiln_shadow kiln_shadow;

/* A shadow runner with no shadows configured and its worker thread
 * started; targets are acquired from mgr (borrowed; it must outlive the
 * shadow). */
kiln_status kiln_shadow_create(kiln_manager *mgr, kiln_shadow **out);
/* Stop the worker (the run in progress finishes) and free everything. */
void kiln_shadow_free(kiln_shadow *sh);

/*
 * Apply a rollout configuration's shadow blocks (cfg NULL: none), at start
 * or at any time while serving. Every block is checked first; on an error
 * (KILN_ERR_INVALID_ARGUMENT, err holds KILN_SHADOW_ERR_LEN bytes naming the
 * model, the field and the bad value) nothing changes. Queued requests of a
 * model whose queue size or target changes are dropped (and counted).
 */
kiln_status kiln_shadow_apply(kiln_shadow *sh, const KilnRollout__RolloutConfig *cfg, char *err);

/* Read a rollout file (text proto), parse it and apply it: `kiln serve
 * --rollout_config_file` at start. */
kiln_status kiln_shadow_apply_file(kiln_shadow *sh, const char *path, char *err);

/* What a model's shadow has compared, for the canary gates (agreement, JS
 * divergence): sums over the sliding window and since start (either may be
 * NULL), and the requests compared, dropped and failed since start (NULL:
 * not wanted). KILN_ERR_NOT_FOUND when the model has no shadow. */
kiln_status kiln_shadow_get_stats(kiln_shadow *sh, const char *model, kiln_shadow_stats *window,
                                  kiln_shadow_stats *total, int64_t outcomes[3]);

/* The observer to register in the predict path's hub (ctx is sh). */
kiln_observer kiln_shadow_observer(kiln_shadow *sh);

/* JSON for GET /v1/shadow (model NULL: every shadowed model) or
 * /v1/shadow/MODEL; KILN_ERR_NOT_FOUND with err set when the model has no
 * shadow. */
kiln_status kiln_shadow_write_json(kiln_shadow *sh, const char *model, kiln_sbuf *b, char *err);

#endif
