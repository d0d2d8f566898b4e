/*
 * test_profile.c - the public profile API (kiln_session_profile_*): a
 * profiled session of the digits model (Gemm, Relu, Gemm, Softmax) counts
 * one call per step per run, including runs from several threads at once;
 * the op types of the steps are the graph's (from the model's own op
 * histogram, kiln_model_op_kind); a Gemm's work is 2 x batch x N x K, known
 * from the model's shapes; shares sum to 1; reset clears the counters; a
 * session without profiling returns an empty profile, and the reference
 * executor refuses to profile with a status.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kiln/kiln.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif
#define DIGITS KILN_SOURCE_DIR "/models/digits/1/model.onnx"
#define BATCH 4
#define THREADS 4
#define RUNS_PER_THREAD 25

static kiln_tensor *pixels;

static int run_once(kiln_session *s)
{
    kiln_named_tensor in = {"pixels", pixels};
    kiln_outputs *o = NULL;
    if (kiln_session_run(s, &in, 1, &o) != KILN_OK) return 0;
    kiln_outputs_free(o);
    return 1;
}

static void *worker(void *arg)
{
    kiln_session *s = arg;
    intptr_t fails = 0;
    for (int i = 0; i < RUNS_PER_THREAD; i++) fails += !run_once(s);
    return (void *)fails;
}

/* Every step ran `runs` times with positive time; shares sum to 1 over steps and over ops. */
static void check_counts(const kiln_profile *p, int64_t runs, const char *what)
{
    int n = kiln_profile_step_count(p);
    CHECK(n > 0, "%s: %d steps", what, n);
    double share = 0;
    int64_t prev = INT64_MAX;
    for (int i = 0; i < n; i++) {
        const kiln_profile_entry *e = kiln_profile_step(p, i);
        CHECK(e->calls == runs, "%s: step %d (%s %s) ran %lld times, not %lld", what, e->step,
              e->op, e->node, (long long)e->calls, (long long)runs);
        CHECK(e->total_ns > 0, "%s: step %d time %lld", what, e->step, (long long)e->total_ns);
        CHECK(e->total_ns <= prev, "%s: steps not slowest first at %d", what, i);
        CHECK(e->node != NULL && e->kernel && e->kernel[0] && e->nodes == 1 && e->plan == 0,
              "%s: step %d fields", what, i);
        prev = e->total_ns;
        share += e->share;
    }
    CHECK(fabs(share - 1.0) < 1e-9, "%s: step shares sum to %g", what, share);
    share = 0;
    int nodes = 0;
    for (int i = 0; i < kiln_profile_op_count(p); i++) {
        const kiln_profile_entry *e = kiln_profile_op(p, i);
        CHECK(e->node == NULL && e->step == -1 && e->calls == runs * e->nodes,
              "%s: op %s has %d nodes and %lld calls", what, e->op, e->nodes, (long long)e->calls);
        share += e->share;
        nodes += e->nodes;
    }
    CHECK(nodes == n, "%s: op entries cover %d of %d steps", what, nodes, n);
    CHECK(fabs(share - 1.0) < 1e-9, "%s: op shares sum to %g", what, share);
}

int main(void)
{
    kiln_model *m = NULL;
    kiln_status st = kiln_model_load(DIGITS, NULL, &m);
    CHECK(st == KILN_OK, "load: %s", kiln_last_error());
    if (st != KILN_OK) return CHECK_DONE();
    int64_t dims[2] = {BATCH, 64};
    kiln_tensor_create(KILN_DTYPE_F32, 2, dims, &pixels);
    for (int i = 0; i < BATCH * 64; i++) ((float *)pixels->data)[i] = (float)(i % 17);

    /* the imported graph (optimize = 0): one step per node, op types as in the file */
    kiln_session_options o;
    kiln_session_options_init(&o);
    CHECK(o.profile == 0, "profiling is off by default");
    o.optimize = 0;
    o.profile = 1;
    kiln_session *s = NULL;
    st = kiln_session_create(m, NULL, &o, &s);
    CHECK(st == KILN_OK, "session: %s", kiln_last_error());
    for (int i = 0; i < 3; i++) CHECK(run_once(s), "run: %s", kiln_last_error());
    kiln_profile *p = NULL;
    st = kiln_session_profile_get(s, &p);
    CHECK(st == KILN_OK && p, "profile: %s", kiln_last_error());
    check_counts(p, 3, "imported graph");
    for (int k = 0; k < kiln_model_op_kinds(m); k++) {
        const char *op;
        int count, found = 0;
        kiln_model_op_kind(m, k, &op, &count);
        for (int i = 0; i < kiln_profile_op_count(p); i++)
            if (strcmp(kiln_profile_op(p, i)->op, op) == 0) found += kiln_profile_op(p, i)->nodes;
        CHECK(found == count, "op %s: %d nodes in the graph, %d in the profile", op, count, found);
    }
    CHECK(kiln_profile_step_count(p) == 4, "4 nodes, %d steps", kiln_profile_step_count(p));
    int gemms = 0;
    for (int i = 0; i < kiln_profile_step_count(p); i++) {
        const kiln_profile_entry *e = kiln_profile_step(p, i);
        if (strcmp(e->op, "Gemm") != 0) {
            CHECK(e->flops == 0, "%s counts no work: %g", e->op, e->flops);
            continue;
        }
        /* fc1: 64 -> 32, fc2: 32 -> 10 */
        double want1 = 2.0 * BATCH * 32 * 64, want2 = 2.0 * BATCH * 10 * 32;
        CHECK(e->flops == want1 || e->flops == want2, "Gemm %s: %g FLOP", e->node, e->flops);
        gemms++;
    }
    CHECK(gemms == 2, "%d Gemm steps", gemms);
    CHECK(kiln_profile_step(p, -1) == NULL && kiln_profile_step(p, 99) == NULL &&
          kiln_profile_op(p, 99) == NULL, "out of range entries are NULL");
    kiln_profile_free(p);

    /* reset, then runs from several threads at once: the counts are exact */
    CHECK(kiln_session_profile_reset(s) == KILN_OK, "reset");
    kiln_session_profile_get(s, &p);
    CHECK(kiln_profile_step_count(p) == 0 && kiln_profile_op_count(p) == 0,
          "after reset: %d steps", kiln_profile_step_count(p));
    kiln_profile_free(p);
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, s);
    intptr_t fails = 0;
    for (int t = 0; t < THREADS; t++) {
        void *r;
        pthread_join(th[t], &r);
        fails += (intptr_t)r;
    }
    CHECK(fails == 0, "%ld runs failed", (long)fails);
    kiln_session_profile_get(s, &p);
    check_counts(p, THREADS * RUNS_PER_THREAD, "threads");
    kiln_profile_free(p);

    /* turned off: runs are not counted and the profile is empty */
    CHECK(kiln_session_profile_enable(s, 0) == KILN_OK, "disable");
    run_once(s);
    kiln_session_profile_get(s, &p);
    CHECK(kiln_profile_step_count(p) == 0, "off: %d steps", kiln_profile_step_count(p));
    kiln_profile_free(p);
    kiln_session_free(s);

    /* the optimized graph, profiling turned on after creation */
    kiln_session *opt = NULL;
    kiln_session_create(m, NULL, NULL, &opt);
    kiln_session_profile_get(opt, &p);
    CHECK(p && kiln_profile_step_count(p) == 0, "a session without profiling: empty profile");
    kiln_profile_free(p);
    CHECK(kiln_session_profile_enable(opt, 1) == KILN_OK, "enable");
    for (int i = 0; i < 5; i++) run_once(opt);
    kiln_session_profile_get(opt, &p);
    check_counts(p, 5, "optimized graph");
    kiln_profile_free(p);
    kiln_session_free(opt);

    /* the reference executor keeps no profile */
    kiln_session_options_init(&o);
    o.reference = 1;
    o.profile = 1;
    kiln_session *ref = NULL;
    st = kiln_session_create(m, NULL, &o, &ref);
    CHECK(st == KILN_ERR_UNSUPPORTED && !ref, "reference and profile options: %s",
          kiln_status_name(st));
    o.profile = 0;
    kiln_session_create(m, NULL, &o, &ref);
    st = kiln_session_profile_enable(ref, 1);
    CHECK(st == KILN_ERR_UNSUPPORTED && strstr(kiln_last_error(), "reference"),
          "reference executor: %s", kiln_status_name(st));
    kiln_session_free(ref);

    kiln_tensor_free(pixels);
    kiln_model_free(m);
    return CHECK_DONE();
}
