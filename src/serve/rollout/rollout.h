/*
 * rollout.h - `kiln serve --rollout_config_file`: traffic splits, sticky
 * routing and canaries with automatic promotion and rollback, read from
 * Kiln's own rollout file (src/import/proto/rollout.proto, protobuf text
 * format; docs/ROLLOUTS.md describes every field).
 *
 * One kiln_rollout per server:
 *   - loads and checks the file (kiln_rollout_config_load: errors name the
 *     file, the line where the text parser stopped or the model's line, the
 *     model, the field and the bad value), and re-reads it every
 *     poll_seconds when it changed; a bad new file is logged and the
 *     running one stays;
 *   - answers the observers' route function (observe.h) for requests that
 *     name no version and no label, from an immutable table swapped
 *     atomically (no lock and no allocation on the request path);
 *   - counts every run of a model it manages (its `after` observer:
 *     atomic counters and fixed latency histograms per version);
 *   - runs a controller thread that evaluates each canary's gates
 *     (gate.h) every evaluation_interval_seconds, advances, holds, promotes
 *     (moving the "stable" label to the candidate) or rolls back, and
 *     persists the state (state_file, written to a temporary file and
 *     renamed) so a restart resumes the step it was on;
 *   - writes the kiln_rollout_* Prometheus metrics and one JSON line on
 *     stderr per transition;
 *   - answers the admin endpoints GET /v1/rollouts, GET /v1/rollouts/MODEL
 *     and POST /v1/rollouts/MODEL:pause|:resume|:promote|:rollback (POSTs
 *     need kiln_server_authorize(.., "admin")).
 *
 * Use from `kiln serve` (src/cli/cmd_serve.c):
 *     kiln_rollout_create(path, poll, mgr, &r, err);  // loads the file
 *     kiln_rollout_attach(r, &observers, &server_options);  // before kiln_server_start
 *     kiln_rollout_start(r);                             // controller thread
 *     ...
 *     kiln_rollout_free(r);                              // after the server stopped
 */
#ifndef KILN_SERVE_ROLLOUT_ROLLOUT_H
#define KILN_SERVE_ROLLOUT_ROLLOUT_H

#include "kiln/kiln.h"
#include "rollout.pb-c.h"
#include "serve/manager.h"
#include "serve/observe.h"
#include "serve/server.h"

#define KILN_ROLLOUT_ERR_LEN 768
#define KILN_ROLLOUT_MAX_MODELS 32   /* model_rollouts entries in one file */
#define KILN_ROLLOUT_MAX_TARGETS 16  /* split targets of one model */

typedef struct kiln_rollout kiln_rollout;

/*
 * Config subscribers: another module (shadow traffic, src/serve/shadow/)
 * is told of each config that takes effect.
 *
 *   static void on_rollout(void *ctx, const KilnRollout__RolloutConfig *cfg) { ... }
 *   kiln_rollout_subscribe(r, on_rollout, my_state);
 *
 * - Called once at subscription with the current config (the file loaded
 *   by kiln_rollout_create), then after every reload that changed it,
 *   from the rollout's controller thread.
 * - cfg has passed kiln_rollout_config_load's checks (so e.g. every
 *   shadow.fraction is in [0, 1]) and is borrowed for the call only: copy
 *   what you keep. Calls are serialized (never two at once); the callback
 *   must not call back into the kiln_rollout.
 * - Subscribe before kiln_rollout_start, from the thread that set up the
 *   server. At most KILN_ROLLOUT_MAX_SUBSCRIBERS.
 */
#define KILN_ROLLOUT_MAX_SUBSCRIBERS 8
typedef void (*kiln_rollout_config_fn)(void *ctx, const KilnRollout__RolloutConfig *cfg);
kiln_status kiln_rollout_subscribe(kiln_rollout *r, kiln_rollout_config_fn fn, void *ctx);

/* The paired gates' source (canary.gates.min_agreement and
 * max_output_divergence): fn fills *out, for a model and its canary's
 * candidate version, with cumulative counts of rows the baseline answered
 * that the candidate also ran (`paired`), of those whose top-1 was the same
 * (`agree`), and of the probability rows among them with the sum of their
 * Jensen-Shannon divergences and of its squares; the controller takes
 * their increase over each step's window. `kiln serve` sets it to the
 * shadow traffic's counts (a shadow of the model on the candidate version).
 * Without a source the gates see no pairs and hold. out is zeroed first. */
typedef struct kiln_rollout_pairs {
    uint64_t agree, paired;   /* top-1 rows equal, top-1 rows compared */
    uint64_t js_rows;         /* probability rows compared */
    double js_sum, js_sq_sum; /* sum of their JS divergences (nats), of the squares */
} kiln_rollout_pairs;
typedef void (*kiln_rollout_pairs_fn)(void *ctx, const char *model, int64_t candidate,
                                      kiln_rollout_pairs *out);
void kiln_rollout_set_pairs(kiln_rollout *r, kiln_rollout_pairs_fn fn, void *ctx);

/* The input drift gate's source (canary.gates.roll_back_on_input_drift):
 * fn answers for a model version how many features drift past their
 * thresholds now (what: the farthest, n bytes), 0 when none, -1 when too
 * few values have been seen to tell (the gate holds), -2 when the version
 * has no reference profile (the gate has nothing to judge and is skipped).
 * `kiln serve` sets it to the model monitor (src/serve/monitor/). */
typedef int (*kiln_rollout_drift_fn)(void *ctx, const char *model, int64_t version, char *what,
                                     size_t n);
void kiln_rollout_set_drift(kiln_rollout *r, kiln_rollout_drift_fn fn, void *ctx);

/* Read and check a rollout file. On success *out owns the message (free it
 * with kiln_rollout__rollout_config__free_unpacked(*out, NULL)); on failure
 * err (KILN_ROLLOUT_ERR_LEN) says what and where. */
kiln_status kiln_rollout_config_load(const char *path, KilnRollout__RolloutConfig **out, char *err);

/* Load the file at path (errors in err) and prepare the state, resuming
 * from the state file when it names the same canaries. poll_seconds > 0:
 * the file is re-read when it changes. mgr is borrowed. */
kiln_status kiln_rollout_create(const char *path, int poll_seconds, kiln_manager *mgr,
                                kiln_rollout **out, char *err);
/* Register the route function, the route key header and the observer on h,
 * and the admin endpoints on the server options so (before the server
 * starts). */
kiln_status kiln_rollout_attach(kiln_rollout *r, kiln_observers *h, kiln_server_options *so);
/* Without a rollout file: GET /v1/rollouts answers an empty list, model paths 404. */
void kiln_rollout_attach_none(kiln_server_options *so);
/* Start the controller thread (evaluates gates, polls the file). */
kiln_status kiln_rollout_start(kiln_rollout *r);
/* Stop the thread and free everything (after the server stopped). */
void kiln_rollout_free(kiln_rollout *r);

/* Every model's rollout state as JSON (the body of GET /v1/rollouts). */
void kiln_rollout_write_json(kiln_rollout *r, kiln_sbuf *b);

#endif
