/*
 * controller.h - `kiln rollout-controller`: judges the canaries of a fleet
 * of `kiln serve` replicas from Prometheus and writes the decisions into
 * the rollout file every replica re-reads (rollout.proto's Canary.controlled,
 * state, step, reason, step_started_unix), so the fleet moves as one.
 *
 * Each round: read the rollout file; for every canary, take the window
 * since its step began from Prometheus (increase() of
 * kiln_rollout_requests_total by version and outcome, and of
 * kiln_request_latency_us_bucket by version and le, summed over every
 * replica; for the paired gates the increase of the shadow's
 * kiln_shadow_top1_*_total and kiln_shadow_js_*_total counters; for input
 * drift the replicas' kiln_drift_alert gauges of the candidate), evaluate
 * the same gates as the in-process controller (gate.c),
 * and on a transition rewrite the file (temporary file and rename). The
 * controller needs explicit versions (candidate_version, baseline_version):
 * labels live in the replicas.
 */
#ifndef KILN_SERVE_ROLLOUT_CONTROLLER_H
#define KILN_SERVE_ROLLOUT_CONTROLLER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "kiln/kiln.h"

typedef struct kiln_rollout_controller_options {
    const char *prometheus;      /* base URL, http://host:port */
    const char *rollout_file;
    int interval_seconds;        /* between rounds (>= 1) */
    int once;                    /* one round, then return */
} kiln_rollout_controller_options;

/* Run rounds until *stop becomes non-zero (or once). KILN_OK, or an error
 * with err (512 bytes) set when the file cannot be used at all. */
kiln_status kiln_rollout_controller_run(const kiln_rollout_controller_options *o,
                                        volatile sig_atomic_t *stop, char *err);

/* One sample of a Prometheus instant vector: the labels the controller
 * reads (version, outcome, le, feature; -1, "", NaN, "" when absent) and
 * the value. */
typedef struct kiln_prom_sample {
    int64_t version;
    char outcome[16];
    char feature[64];            /* cut to fit */
    double le;
    double value;                /* >= 0 and finite (others read as 0) */
} kiln_prom_sample;
/* Parse the JSON body of Prometheus' /api/v1/query answer (a vector):
 * at most cap samples into out, *n of them. Samples of another shape are
 * skipped; KILN_ERR_IO with err (512 bytes) when the body is not such an
 * answer at all. */
kiln_status kiln_prom_parse_vector(const char *body, size_t len, kiln_prom_sample *out, int cap,
                                   int *n, char *err);

/* The protobuf text format of msg (fields in declaration order; proto3
 * fields at their zero value are left out), appended to b. For the
 * rollout file's types: integers, doubles, bools, strings, messages,
 * repeated and oneof fields. */
struct kiln_sbuf;
void kiln_textproto_write(const ProtobufCMessage *msg, struct kiln_sbuf *b, int indent);

#endif
