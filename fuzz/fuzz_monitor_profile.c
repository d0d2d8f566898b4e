/*
 * fuzz_monitor_profile.c - libFuzzer target for the reference profiles
 * that `kiln serve` reads from a version's assets.extra/kiln_profile.json
 * (src/serve/monitor/profile.c).
 *
 * Each input is parsed; a parse must succeed or fill the error message. A
 * parsed profile must keep profile.h's promises (one count per bin, edges
 * strictly increasing, bounded sizes), must write out as JSON that parses
 * again into the same shape (names, counts and categorical values, bytes
 * that are not UTF-8 included), and its histograms must compare with
 * themselves at distance 0 (PSI, Jensen-Shannon, L-infinity). Anything
 * else aborts.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/monitor/profile.h"

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_monitor_profile: %s\n", what);
        abort();
    }
}

static void check_profile(const kiln_mon_profile *p)
{
    check(p->n_features >= 0 && p->n_features <= KILN_MON_MAX_FEATURES, "feature count");
    check(p->sub_windows >= 1 && p->window_seconds >= 1 && p->min_count >= 1, "window");
    for (int i = 0; i < p->n_features; i++) {
        const kiln_mon_feature *f = &p->features[i];
        check(f->name[0] && f->input[0], "names");
        if (f->kind == KILN_MON_NUMERIC) {
            check(f->n_counts == f->n_edges + 1 && f->n_edges < KILN_MON_MAX_BINS, "bins");
            for (int k = 1; k < f->n_edges; k++) check(f->edges[k] > f->edges[k - 1], "edge order");
            for (int k = 0; k < f->n_edges; k++)
                check(kiln_mon_bin(f->edges, f->n_edges, f->edges[k]) == k + 1, "bin of an edge");
        } else {
            check(f->n_counts == f->n_values + 1 && f->n_values <= KILN_MON_MAX_VALUES, "values");
        }
        check(kiln_mon_psi(f->counts, f->counts, f->n_counts) == 0, "psi of itself");
        check(kiln_mon_js(f->counts, f->counts, f->n_counts) < 1e-6, "js of itself");
        check(kiln_mon_linf(f->counts, f->counts, f->n_counts) == 0, "linf of itself");
    }
    for (int i = 0; i < p->n_rules; i++) check(p->rules[i].min <= p->rules[i].max, "rule range");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[KILN_JSON_ERR_LEN];
    err[0] = '\0';
    kiln_mon_profile *p = NULL;
    if (kiln_mon_profile_parse((const char *)data, size, &p, err) != KILN_OK) {
        check(p == NULL && err[0], "a failed parse left a profile or no message");
        return 0;
    }
    check_profile(p);
    kiln_sbuf b = {0};
    kiln_mon_profile_write(p, &b);
    check(!b.oom, "out of memory writing");
    kiln_mon_profile *q = NULL;
    if (kiln_mon_profile_parse(b.p, b.len, &q, err) != KILN_OK) {
        fprintf(stderr, "fuzz_monitor_profile: the written profile does not parse: %s\n", err);
        abort();
    }
    check(q->n_features == p->n_features && q->n_outputs == p->n_outputs &&
              q->n_rules == p->n_rules && q->rows == p->rows,
          "round trip changed the profile");
    for (int i = 0; i < p->n_features; i++)
        check(q->features[i].n_counts == p->features[i].n_counts &&
                  memcmp(q->features[i].counts, p->features[i].counts,
                         sizeof(int64_t) * (size_t)p->features[i].n_counts) == 0,
              "round trip changed counts");
    for (int i = 0; i < p->n_features; i++) {
        const kiln_mon_feature *a = &p->features[i], *c = &q->features[i];
        check(a->n_values == c->n_values && a->strings == c->strings &&
                  strcmp(a->name, c->name) == 0 && strcmp(a->input, c->input) == 0,
              "round trip changed a feature");
        for (int k = 0; a->strings && k < a->n_values; k++)
            check(a->value_len[k] == c->value_len[k] &&
                      memcmp(a->values[k], c->values[k], a->value_len[k]) == 0,
                  "round trip changed a categorical value");
    }
    kiln_mon_profile_free(q);
    kiln_sbuf_free(&b);
    kiln_mon_profile_free(p);
    return 0;
}
