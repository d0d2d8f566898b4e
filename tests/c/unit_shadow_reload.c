/*
 * unit_shadow_reload.c - the shadow observer's configuration life cycle
 * (src/serve/shadow/shadow.c) without an HTTP server: kiln_shadow_apply at
 * start and again while requests are observed, as the rollout file's reload
 * calls it.
 *
 * models/digits (in the repository) is served by a real model manager; the
 * test runs it and hands each run to the observer's after hook, as the
 * predict path does, then reads the JSON view. It checks that a refused
 * configuration changes nothing, that a reload keeping the comparison keeps
 * the counters and statistics while a new compare mode starts afresh, that
 * a missing target is counted as failed, and that applying configurations
 * over and over while other threads observe requests is safe (the
 * sanitizer build runs this too).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "import/textproto.h"
#include "serve/manager.h"
#include "serve/shadow/shadow.h"

static kiln_manager *mgr;
static kiln_shadow *sh;
static kiln_observer obs;

/* Parse text as a rollout file and apply it; the status, err filled. */
static kiln_status apply_text(const char *text, char *err)
{
    ProtobufCMessage *msg = NULL;
    err[0] = '\0';
    if (kiln_textproto_parse(&kiln_rollout__rollout_config__descriptor, text, strlen(text), &msg) !=
        KILN_OK) {
        snprintf(err, KILN_SHADOW_ERR_LEN, "%s", kiln_last_error());
        return KILN_ERR_INVALID_MODEL;
    }
    kiln_status st = kiln_shadow_apply(sh, (const KilnRollout__RolloutConfig *)msg, err);
    protobuf_c_message_free_unpacked(msg, NULL);
    return st;
}

/* The JSON view of model m (or of all with m NULL), malloc'd; NULL if none. */
static char *view(const char *m)
{
    kiln_sbuf b = {0};
    char err[KILN_SHADOW_ERR_LEN];
    if (kiln_shadow_write_json(sh, m, &b, err) != KILN_OK) {
        kiln_sbuf_free(&b);
        return NULL;
    }
    kiln_sbuf_put(&b, "", 1);
    return b.p;
}

static int has(const char *m, const char *needle)
{
    char *v = view(m);
    int r = v && strstr(v, needle) != NULL;
    free(v);
    return r;
}

/* Run digits once on zeros and show the run to the observer. */
static int observe_one(void)
{
    char err[KILN_JSON_ERR_LEN];
    const char *code = NULL;
    kiln_servable *sv = kiln_manager_acquire(mgr, "digits", -1, NULL, err, &code);
    if (!sv) return 0;
    const kiln_signature *sig = kiln_model_signature(sv->model, 0);
    int n = kiln_signature_input_count(sig);
    kiln_tensor *in[8] = {0};
    int ok = n <= 8;
    for (int i = 0; ok && i < n; i++) {
        const kiln_value_info *vi = kiln_signature_input(sig, i);
        int64_t dims[KILN_MAX_RANK];
        for (int d = 0; d < vi->rank; d++) dims[d] = vi->dims[d] > 0 ? vi->dims[d] : 2;
        ok = kiln_tensor_create(vi->dtype, vi->rank, dims, &in[i]) == KILN_OK;
    }
    kiln_batch_result out;
    if (ok) ok = kiln_servable_run(sv, 0, in, n, 0, &out, err, &code) == KILN_OK;
    if (ok) {
        kiln_observation o = {"REST", "predict", "digits", sv, 0, in, n, &out, "OK", 10.0, 0, NULL};
        obs.after(obs.ctx, &o);
        kiln_batch_result_free(&out);
    }
    for (int i = 0; i < n && i < 8; i++) kiln_tensor_free(in[i]);
    kiln_servable_release(sv);
    return ok;
}

/* A run of digits shown to the observer with a 257 MiB input in place of
 * its own (never touched: the copy is refused before it starts). */
static int observe_huge(void)
{
    char err[KILN_JSON_ERR_LEN];
    const char *code = NULL;
    kiln_servable *sv = kiln_manager_acquire(mgr, "digits", -1, NULL, err, &code);
    if (!sv) return 0;
    const kiln_signature *sig = kiln_model_signature(sv->model, 0);
    const kiln_value_info *vi = kiln_signature_input(sig, 0);
    int64_t dims[KILN_MAX_RANK];
    for (int d = 0; d < vi->rank; d++) dims[d] = vi->dims[d] > 0 ? vi->dims[d] : 2;
    kiln_tensor *in = NULL, *huge = NULL;
    int64_t n = (int64_t)(KILN_SHADOW_QUEUE_BYTES + (1 << 20)) / 8;
    int ok = kiln_tensor_create(vi->dtype, vi->rank, dims, &in) == KILN_OK &&
             kiln_tensor_create(KILN_DTYPE_I64, 1, &n, &huge) == KILN_OK;
    kiln_batch_result out;
    if (ok) ok = kiln_servable_run(sv, 0, &in, 1, 0, &out, err, &code) == KILN_OK;
    if (ok) {
        kiln_observation o = {"REST", "predict", "digits", sv, 0, &huge, 1, &out, "OK", 10.0, 0, NULL};
        obs.after(obs.ctx, &o);
        kiln_batch_result_free(&out);
    }
    kiln_tensor_free(in);
    kiln_tensor_free(huge);
    kiln_servable_release(sv);
    return ok;
}

/* Wait (bounded) until the view of digits contains needle. */
static int wait_view(const char *needle)
{
    for (int i = 0; i < 500; i++) {
        if (has("digits", needle)) return 1;
        struct timespec t = {0, 10 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    char *v = view("digits");
    fprintf(stderr, "view: %s\n", v ? v : "(none)");
    free(v);
    return 0;
}

static volatile int stop_observers;

static void *observer_thread(void *arg)
{
    while (!stop_observers) observe_one();
    return NULL;
}

int main(void)
{
    char err[KILN_SHADOW_ERR_LEN];
    kiln_manager_options mo;
    memset(&mo, 0, sizeof mo);
    mo.poll_seconds = 0; /* load once, then no polling thread */
    kiln_session_options_init(&mo.session);
    mo.session.threads = 1;
    if (kiln_manager_create(&mo, &mgr) != KILN_OK ||
        kiln_manager_add_model(mgr, "digits", KILN_SOURCE_DIR "/models/digits") != KILN_OK ||
        kiln_manager_start(mgr) != KILN_OK || !kiln_manager_ready(mgr)) {
        fprintf(stderr, "cannot serve models/digits\n");
        return 1;
    }
    CHECK(kiln_shadow_create(mgr, &sh) == KILN_OK, "create");
    obs = kiln_shadow_observer(sh);
    CHECK(strcmp(obs.name, "shadow") == 0 && obs.after && obs.write_metrics, "observer");

    /* nothing configured: the view is empty, a model has none */
    CHECK(has(NULL, "{\"shadows\": []}"), "empty view");
    CHECK(view("digits") == NULL, "no shadow yet");
    CHECK(observe_one(), "a run with no shadow");

    /* digits shadowed by itself */
    CHECK(apply_text("model_rollouts { model_name: 'digits' shadow { fraction: 1 } }", err) ==
              KILN_OK, "%s", err);
    for (int i = 0; i < 5; i++) CHECK(observe_one(), "run");
    CHECK(wait_view("\"compared\": 5,"), "5 compared");
    CHECK(has("digits", "\"top1_agreement\": 1,") && has("digits", "\"mean_abs_diff\": 0,"),
          "a model agrees with itself");

    /* the same numbers for the canary gates */
    kiln_shadow_stats win, tot;
    int64_t outcomes[3];
    CHECK(kiln_shadow_get_stats(sh, "digits", &win, &tot, outcomes) == KILN_OK, "get_stats");
    CHECK(outcomes[0] == 5 && outcomes[1] == 0 && outcomes[2] == 0, "outcomes");
    CHECK(tot.requests == 5 && tot.top1_rows > 0 && tot.top1_agree == tot.top1_rows &&
              tot.sum_abs == 0.0 && win.requests == 5,
          "stats: %lld requests, %lld/%lld agree", (long long)tot.requests,
          (long long)tot.top1_agree, (long long)tot.top1_rows);
    CHECK(kiln_shadow_get_stats(sh, "nope", NULL, NULL, NULL) == KILN_ERR_NOT_FOUND, "no shadow");

    /* refused configurations change nothing, and say what is wrong */
    CHECK(apply_text("model_rollouts { model_name: 'digits' shadow { fraction: 2 } }", err) ==
              KILN_ERR_INVALID_ARGUMENT && strstr(err, "'digits'") && strstr(err, "fraction 2"),
          "%s", err);
    CHECK(apply_text("model_rollouts { model_name: 'digits' shadow { fraction: 1 } }\n"
                     "model_rollouts { model_name: 'digits' shadow { fraction: 1 } }", err) ==
              KILN_ERR_INVALID_ARGUMENT && strstr(err, "twice"), "%s", err);
    CHECK(apply_text("model_rollouts { model_name: 'digits' shadow { compare: 'softmax' } }", err) ==
              KILN_ERR_INVALID_ARGUMENT && strstr(err, "softmax"), "%s", err);
    CHECK(apply_text("model_rollouts { shadow { fraction: 1 } }", err) ==
              KILN_ERR_INVALID_ARGUMENT && strstr(err, "model_name"), "%s", err);
    CHECK(has("digits", "\"fraction\": 1,") && has("digits", "\"compared\": 5,"), "unchanged");

    /* a reload keeping the comparison keeps the statistics; fraction 0 stops sampling */
    CHECK(apply_text("model_rollouts { model_name: 'digits' shadow { fraction: 0 queue_size: 4 } }",
                     err) == KILN_OK, "%s", err);
    CHECK(has("digits", "\"compared\": 5,") && has("digits", "\"queue_size\": 4,"), "kept");
    CHECK(observe_one(), "run");
    CHECK(has("digits", "\"seen\": 6, \"sampled\": 5,"), "not sampled at fraction 0");

    /* a new compare mode starts afresh */
    CHECK(apply_text("model_rollouts { model_name: 'digits' shadow { fraction: 1 compare: "
                     "'values' } }", err) == KILN_OK, "%s", err);
    CHECK(has("digits", "\"compared\": 0,") && has("digits", "\"compare\": \"values\""), "fresh");
    CHECK(observe_one(), "run");
    CHECK(wait_view("\"compared\": 1,"), "compared after the change");
    CHECK(has("digits", "\"top1_rows\": 0,"), "values mode has no top-1");

    /* a target that does not exist: failed, with the reason */
    CHECK(apply_text("model_rollouts { model_name: 'digits' shadow { target_model: 'nope' "
                     "fraction: 1 } }", err) == KILN_OK, "%s", err);
    CHECK(observe_one(), "run");
    CHECK(wait_view("\"failed\": 1}"), "failed");
    CHECK(has("digits", "nope"), "the error names the target");

    /* a copy past the queue's memory bound is dropped, not failed */
    CHECK(apply_text("model_rollouts { model_name: 'digits' shadow { fraction: 1 } }", err) ==
              KILN_OK, "%s", err);
    CHECK(observe_huge(), "run");
    CHECK(has("digits", "\"sampled\": 1, \"compared\": 0, \"dropped\": 1, \"failed\": 0}"),
          "dropped past the bound");

    /* reloads racing with observed requests */
    pthread_t th[3];
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, observer_thread, NULL);
    static const char *const cfgs[] = {
        "model_rollouts { model_name: 'digits' shadow { fraction: 1 queue_size: 2 } }",
        "model_rollouts { model_name: 'digits' shadow { fraction: 0.5 queue_size: 3 } }",
        "model_rollouts { model_name: 'digits' shadow { fraction: 1 compare: 'class' } }",
        "model_rollouts { model_name: 'other' shadow { fraction: 1 } }",
        "",
    };
    for (int i = 0; i < 200; i++) {
        CHECK(apply_text(cfgs[i % 5], err) == KILN_OK, "%s", err);
        kiln_sbuf b = {0};
        obs.write_metrics(obs.ctx, &b);
        kiln_sbuf_free(&b);
        struct timespec t = {0, 1000 * 1000};
        nanosleep(&t, NULL);
    }
    stop_observers = 1;
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    CHECK(apply_text(cfgs[0], err) == KILN_OK, "%s", err);
    kiln_sbuf b = {0};
    CHECK(observe_one(), "run");
    obs.write_metrics(obs.ctx, &b);
    kiln_sbuf_put(&b, "", 1);
    CHECK(b.p && strstr(b.p, "# TYPE kiln_shadow_requests_total counter") &&
              strstr(b.p, "kiln_shadow_queue_depth{model_name=\"digits\"}") &&
              strstr(b.p, "kiln_shadow_added_latency_us{model_name=\"digits\"}"),
          "metrics: %s", b.p ? b.p : "");
    kiln_sbuf_free(&b);
    CHECK(apply_text("", err) == KILN_OK && view("digits") == NULL, "cleared");

    kiln_shadow_free(sh);
    kiln_manager_free(mgr);
    return CHECK_DONE();
}
