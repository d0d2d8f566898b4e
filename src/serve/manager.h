/*
 * manager.h - the model manager: which versions of which models are
 * served, loaded off the request path, swapped atomically, freed when the
 * last request using them finishes.
 *
 * Each served model has a base path whose numeric subfolders are versions
 * (TF Serving's layout; each holds model.onnx or a SavedModel), a version
 * policy (TF Serving's latest{num_versions} (default 1), all, or
 * specific{versions}) and version labels (name -> version). A background
 * thread polls the base paths every poll_seconds; a new version is loaded
 * (kiln_model_load, one session per signature; with batching, every
 * allowed batch size precompiled; then the version's warmup file replayed,
 * see warmup.h) while the served ones keep serving, then added under the
 * model's lock, so a version is AVAILABLE only after its warmup; versions
 * the policy no longer wants are dropped after that, so there is no gap in
 * serving. A version that fails to load (a malformed warmup file or a failed
 * warmup request included, as in TF Serving) is never served: its status
 * records the error, the
 * previous version keeps serving, and the load is retried only when the
 * folder's contents change (a copy that was still in progress). The last
 * served version of a model is never dropped for want of a replacement.
 * Versions the polling thread finds load on loader threads of their own
 * (up to four at once), so one slow load (minutes of import or warmup)
 * holds up neither the polling of other models nor config reloads nor
 * unloads; the loads at start and kiln_manager_reload's wait for their
 * versions.
 *
 * Models come from kiln_manager_add_model / kiln_manager_add_config before
 * start, and, with a config file and config_poll_seconds > 0, from the
 * polling thread, which re-reads the file and applies it: new models are
 * added, changed policies and labels replace the old ones, models no longer
 * listed are unloaded (TF Serving: the new config fully supersedes the old).
 *
 * Ownership: a kiln_servable is reference-counted. The manager holds one
 * reference to each served version; kiln_manager_acquire gives the caller
 * another, which kiln_servable_release drops. The last release frees the
 * sessions and the model, on whichever thread releases it.
 */
#ifndef KILN_SERVE_MANAGER_H
#define KILN_SERVE_MANAGER_H

#include <stdatomic.h>
#include <stdint.h>

#include "kiln/kiln.h"
#include "serve/batch.h"
#include "serve/config.h"
#include "serve/json.h"

/* TF Serving's ManagerState values, as printed in status JSON. */
typedef enum kiln_version_state {
    KILN_VERSION_START = 10,
    KILN_VERSION_LOADING = 20,
    KILN_VERSION_AVAILABLE = 30,
    KILN_VERSION_UNLOADING = 40,
    KILN_VERSION_END = 50,
} kiln_version_state;

/* One loaded model version: the model and a session per signature. */
typedef struct kiln_servable {
    int64_t version;
    kiln_model *model;        /* owned */
    int n_sessions;
    kiln_session **sessions;  /* [i] runs signature i; owned */
    struct kiln_batcher **batchers; /* [i] batches signature i; NULL without batching; owned */
    char model_name[256];     /* for logs and metrics */
    char *dir;                /* the version folder (owned); model_path in warmup metrics */
    int warmup_records;       /* records replayed at load (0: no warmup file) */
    double warmup_us;         /* time the warmup took */
    char *load_log;           /* the load line's key=value pairs (owned; NULL if none) */
    char *optimization_log;   /* the default signature's optimization log (owned; NULL if none) */
    struct kiln_version_info *version_info; /* assets.extra/kiln_version.json (owned; NULL if none) */
    char blessing[72];        /* with require_blessing: the blessing's digest; else "" */
    char precision[8];        /* fp32, bf16 or int8: the lowest precision its nodes run in
                                 (--allow_compression, compress.h) */
    atomic_int refs;
} kiln_servable;

typedef struct kiln_manager kiln_manager;

typedef struct kiln_manager_options {
    int poll_seconds;               /* >0 poll every N s; 0 poll once; <0 never poll */
    const char *saved_model_tags;   /* NULL = "serve" */
    kiln_session_options session;
    const char *config_file;        /* --model_config_file, re-read when ... */
    int config_poll_seconds;        /* ... this is > 0 */
    const kiln_batching_params *batching; /* non-NULL: batch every signature (borrowed) */
    struct kiln_batch_stats *batch_stats; /* where batchers count (borrowed) */
    int enable_warmup;              /* --enable_model_warmup: replay assets.extra/ requests */
    const struct kiln_integrity_options *integrity; /* signatures, decryption (borrowed; NULL: none) */
    int warmup_iterations;          /* --num_request_iterations_for_warmup (>= 1) */
    int prefer_tflite;              /* --prefer_tflite_model: a version folder's model.tflite
                                       over its SavedModel */
    int require_blessing;           /* --require_blessing: load only versions whose
                                       kiln_blessing.json matches their files (gate/release.h) */
    const struct kiln_compress_options *compress; /* --allow_compression,
                                       --allow_precompilation (borrowed; NULL: off) */
} kiln_manager_options;

kiln_status kiln_manager_create(const kiln_manager_options *opts, kiln_manager **out);
/* Add a model before kiln_manager_start (policy latest{1}, no labels);
 * name and base_path are copied. */
kiln_status kiln_manager_add_model(kiln_manager *m, const char *name, const char *base_path);
/* Apply a whole config (copied): before start, or on the polling thread. */
kiln_status kiln_manager_apply_config(kiln_manager *m, const kiln_server_config *c);
/* Apply a whole config (copied) while serving, from any thread, loading
 * new models and versions on this thread before returning (gRPC's
 * HandleReloadConfigRequest; a config file, if polled, applies again at
 * its next poll). */
kiln_status kiln_manager_reload(kiln_manager *m, const kiln_server_config *c);
/* Listeners of the loading thread: fn(ctx, c) after a config was applied
 * while serving (c: the new config, from the file's poll or
 * kiln_manager_reload) and after each poll of the base paths (c NULL). The
 * request log takes a reloaded logging_config from it, the model monitor
 * re-reads changed profiles. Calls are serialized (under the load lock);
 * fn must not call back into the manager's config functions. At most
 * KILN_MANAGER_MAX_LISTENERS; may be added while serving. */
#define KILN_MANAGER_MAX_LISTENERS 4
typedef void (*kiln_manager_listener_fn)(void *ctx, const kiln_server_config *c);
kiln_status kiln_manager_add_listener(kiln_manager *m, kiln_manager_listener_fn fn, void *ctx);
/* Remove every listener; when it returns no call is in progress (so their
 * contexts may be freed while the manager still runs). */
void kiln_manager_clear_listeners(kiln_manager *m);
/* Poll every base path once (loading what is there, on this thread), then
 * start the polling thread. */
kiln_status kiln_manager_start(kiln_manager *m);
/* Stop polling and drop the manager's references; then free everything. */
void kiln_manager_free(kiln_manager *m);

/*
 * The servable for a request: by label when label is non-NULL and non-empty,
 * else by version (< 0: the highest served one). Returns NULL when there is
 * none, with an HTTP-ready message in err and TF's code name in *code:
 * NOT_FOUND "Servable not found for request: Latest(name)" /
 * "Specific(name, v)", or INVALID_ARGUMENT "Unrecognized servable version
 * label: l" (TF Serving answers 400 for an unknown label).
 */
kiln_servable *kiln_manager_acquire(kiln_manager *m, const char *name, int64_t version,
                                    const char *label, char *err, const char **code);
/* The version a label names; INVALID_ARGUMENT with err set if unknown. */
kiln_status kiln_manager_resolve_label(kiln_manager *m, const char *name, const char *label,
                                       int64_t *version, char *err);
void kiln_servable_release(kiln_servable *s);
/* Point `label` of model `name` at `version` (added when the model has no
 * such label): a rollout's promotion moves "stable" to its candidate. A
 * later --model_config_file apply replaces the model's labels with the
 * file's. KILN_ERR_NOT_FOUND with err set when the model is unknown. */
kiln_status kiln_manager_set_label(kiln_manager *m, const char *name, const char *label,
                                   int64_t version, char *err);

/*
 * Run signature si of s on in[0..n) (the signature's inputs, in order): the
 * one run path of requests and warmup replays. Through the version's batcher
 * when batching is on, else straight on its session; the run stops at
 * deadline_ms (kiln_monotonic_ms clock, 0 = none) with KILN_ERR_DEADLINE.
 * On success out holds every output (owned by the caller, free with
 * kiln_batch_result_free); on error err holds the message and *code TF's
 * code name ("DEADLINE_EXCEEDED", "INVALID_ARGUMENT", ...).
 */
kiln_status kiln_servable_run(kiln_servable *s, int si, kiln_tensor *const *in, int n,
                              int64_t deadline_ms, kiln_batch_result *out, char *err,
                              const char **code);
/* kiln_servable_run, also stopping between steps once *cancel (when non-NULL)
 * becomes non-zero (a cancelled gRPC call; KILN_ERR_DEADLINE). With batching,
 * a request cancelled while queued is dropped when its batch is formed
 * (code "CANCELLED"); a batched run is shared with other requests and is not
 * stopped. */
kiln_status kiln_servable_run_cancel(kiln_servable *s, int si, kiln_tensor *const *in, int n,
                                     int64_t deadline_ms, const volatile int *cancel,
                                     kiln_batch_result *out, char *err, const char **code);
/* Index of the signature named sig (NULL or "" = the default one), or -1. */
int kiln_servable_find_signature(const kiln_servable *s, const char *sig);
/* TF's code name for a runtime status ("OK", "INVALID_ARGUMENT", ...). */
const char *kiln_serve_code_name(kiln_status st);

/* True when every model has a version AVAILABLE. */
int kiln_manager_ready(kiln_manager *m);
/* 1 if the model is known. */
int kiln_manager_has_model(kiln_manager *m, const char *name);

/* Call fn for each version record of a model (all versions, or the one with
 * version >= 0), newest first, under the model's lock; i counts the calls.
 * error_code is TF's code name. Returns KILN_ERR_NOT_FOUND with err set when
 * the model or version is unknown (the REST and gRPC status share this). */
typedef void (*kiln_version_visit)(void *ctx, int i, int64_t version, kiln_version_state state,
                                   const char *error_code, const char *error_message);
kiln_status kiln_manager_status_each(kiln_manager *m, const char *name, int64_t version,
                                     kiln_version_visit fn, void *ctx, char *err);
/* Write TF Serving's GetModelStatusResponse JSON for a model (all versions,
 * or one with version >= 0). Returns KILN_ERR_NOT_FOUND with err set when
 * the model or version is unknown. */
kiln_status kiln_manager_write_status(kiln_manager *m, const char *name, int64_t version,
                                      kiln_sbuf *b, char *err);
/* {"models": [{"name":..., "versions": [{"version","state"}...]}...]} */
void kiln_manager_write_list(kiln_manager *m, kiln_sbuf *b);
/* The web console's view of every model (console.c): name, readiness,
 * labels, and every version seen with its state, error, and for served
 * versions the load log, optimization log and precision, as a JSON array. */
void kiln_manager_write_console(kiln_manager *m, kiln_sbuf *b);
/* Prometheus lines for kiln_model_* metrics, TF Serving's warmup counter and
 * the requests in flight per served version. */
void kiln_manager_write_metrics(kiln_manager *m, kiln_sbuf *b);

#endif
