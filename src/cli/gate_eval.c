/*
 * gate_eval.c - what `kiln gate` measures beyond the library's comparison
 * (gate.h): the signature check and interleaved latency. One output of a
 * model over the whole data set and the quality comparison of candidate and
 * baseline are the library's (kiln_eval_*, src/api/compile_eval.c), shared
 * with `kiln compile` and `kiln serve --allow_compression`.
 *
 * Quality rules: src/api/compile_eval.c and docs/RELEASE_GATE.md.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/gate.h"

#define WARMUP_RUNS 3

kiln_status kiln_gate_check_signatures(const kiln_signature *c, const kiln_signature *b,
                                       char *err)
{
    for (int io = 0; io < 2; io++) {
        const char *what = io ? "output" : "input";
        int nc = io ? kiln_signature_output_count(c) : kiln_signature_input_count(c);
        int nb = io ? kiln_signature_output_count(b) : kiln_signature_input_count(b);
        for (int i = 0; i < nc; i++) {
            const kiln_value_info *vc = io ? kiln_signature_output(c, i) : kiln_signature_input(c, i);
            const kiln_value_info *vb = NULL;
            for (int k = 0; k < nb && !vb; k++) {
                const kiln_value_info *x = io ? kiln_signature_output(b, k) : kiln_signature_input(b, k);
                if (strcmp(x->name, vc->name) == 0) vb = x;
            }
            if (!vb) {
                snprintf(err, KILN_GATE_ERR_LEN,
                         "signature mismatch: the candidate's %s '%.150s' is not in the baseline",
                         what, vc->name);
                return KILN_ERR_INVALID_ARGUMENT;
            }
            if (vc->dtype != vb->dtype) {
                snprintf(err, KILN_GATE_ERR_LEN,
                         "signature mismatch: %s '%.150s' is %s in the candidate, %s in the baseline",
                         what, vc->name, kiln_dtype_name(vc->dtype), kiln_dtype_name(vb->dtype));
                return KILN_ERR_INVALID_ARGUMENT;
            }
            if (vc->rank >= 0 && vb->rank >= 0 && vc->rank != vb->rank) {
                snprintf(err, KILN_GATE_ERR_LEN,
                         "signature mismatch: %s '%.150s' has rank %d in the candidate, %d in the "
                         "baseline",
                         what, vc->name, vc->rank, vb->rank);
                return KILN_ERR_INVALID_ARGUMENT;
            }
        }
        if (nc != nb) {
            snprintf(err, KILN_GATE_ERR_LEN,
                     "signature mismatch: the candidate has %d %ss, the baseline %d", nc, what, nb);
            return KILN_ERR_INVALID_ARGUMENT;
        }
    }
    return KILN_OK;
}


static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kiln_gate_percentile(double *v, int n, double p)
{
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int k = (int)ceil(p / 100.0 * n) - 1;
    if (k < 0) k = 0;
    if (k >= n) k = n - 1;
    return v[k];
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* One timed run of s on rows; *ms receives its wall time. */
static kiln_status timed_run(kiln_session *s, const kiln_gate_data *d, kiln_tensor **rows,
                             kiln_named_tensor *in, double *ms, const char *who, char *err)
{
    for (int i = 0; i < d->n; i++) in[i] = (kiln_named_tensor){d->names[i], rows[i]};
    kiln_outputs *o = NULL;
    double t0 = now_ms();
    kiln_status st = kiln_session_run(s, in, d->n, &o);
    *ms = now_ms() - t0;
    if (st != KILN_OK)
        snprintf(err, KILN_GATE_ERR_LEN, "the %s failed at batch size %lld: %.400s", who,
                 (long long)rows[0]->dims[0], kiln_last_error());
    kiln_outputs_free(o);
    return st;
}

kiln_status kiln_gate_measure(kiln_session *cand, kiln_session *base, const kiln_gate_data *d,
                              int64_t batch, int runs, kiln_gate_latency *out, char *err)
{
    memset(out, 0, sizeof *out);
    out->batch = batch;
    out->runs = runs;
    double *tc = calloc((size_t)runs + 1, sizeof *tc), *tb = calloc((size_t)runs + 1, sizeof *tb);
    kiln_tensor **rows = calloc((size_t)d->n, sizeof *rows);
    kiln_named_tensor *in = calloc((size_t)d->n, sizeof *in);
    kiln_status st = KILN_OK;
    if (!tc || !tb || !rows || !in) {
        snprintf(err, KILN_GATE_ERR_LEN, "out of memory");
        st = KILN_ERR_OUT_OF_MEMORY;
        goto out;
    }
    for (int r = -WARMUP_RUNS; r < runs && st == KILN_OK; r++) {
        int64_t start = ((int64_t)(r + WARMUP_RUNS) * batch) % d->samples;
        st = kiln_gate_data_rows(d, start, batch, rows, err);
        if (st != KILN_OK) break;
        double mc = 0, mb = 0;
        if ((r & 1) == 0) { /* alternate who goes first: caches and noise hit both alike */
            st = timed_run(cand, d, rows, in, &mc, "candidate", err);
            if (st == KILN_OK) st = timed_run(base, d, rows, in, &mb, "baseline", err);
        } else {
            st = timed_run(base, d, rows, in, &mb, "baseline", err);
            if (st == KILN_OK) st = timed_run(cand, d, rows, in, &mc, "candidate", err);
        }
        for (int i = 0; i < d->n; i++) kiln_tensor_free(rows[i]);
        if (r >= 0) {
            tc[r] = mc;
            tb[r] = mb;
            out->cand_mean_ms += mc / runs;
            out->base_mean_ms += mb / runs;
        }
    }
    if (st == KILN_OK) {
        out->cand_p50_ms = kiln_gate_percentile(tc, runs, 50);
        out->cand_p99_ms = kiln_gate_percentile(tc, runs, 99);
        out->base_p50_ms = kiln_gate_percentile(tb, runs, 50);
        out->base_p99_ms = kiln_gate_percentile(tb, runs, 99);
    }
out:
    free(tc);
    free(tb);
    free(rows);
    free(in);
    return st;
}
