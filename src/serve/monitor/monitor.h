/*
 * monitor.h - model monitoring on live traffic for `kiln serve`: an
 * observer (observe.h) that, for every served version whose folder holds
 * assets.extra/kiln_profile.json (profile.h), bins the live inputs of its
 * default signature over a sliding window and compares them with the
 * reference (PSI and Jensen-Shannon for numeric features, L-infinity for
 * categorical ones), counts missing, NaN, infinite and out-of-range
 * values, histograms the confidence of probability outputs (max
 * probability, margin, entropy), estimates the expected accuracy as the
 * window's mean max probability, and applies the profile's validation
 * rules (a reject rule answers 400 naming the input and the value).
 *
 * A version's state (the profile, its window of fixed-size counters and a
 * lock) is built the first time the version is observed and kept until the
 * server stops (or, when its profile file changes, replaced by a new one:
 * kiln_monitor_refresh); after that a request costs a lookup in a fixed table, one
 * uncontended lock (the window is sharded per request thread), and no allocation. Results go out as Prometheus
 * lines (the observer's write_metrics) and as JSON at GET
 * /v1/models/NAME/monitoring (write_json).
 * docs/MONITORING.md describes the statistics and their defaults.
 */
#ifndef KILN_SERVE_MONITOR_MONITOR_H
#define KILN_SERVE_MONITOR_MONITOR_H

#include "serve/json.h"
#include "serve/observe.h"

#define KILN_MONITOR_MAX_VERSIONS 256 /* model versions tracked (the rest are not monitored) */

typedef struct kiln_monitor kiln_monitor;

kiln_status kiln_monitor_create(kiln_monitor **out);
/* After the server has stopped (no observer call in progress). */
void kiln_monitor_free(kiln_monitor *m);
/* The observer to register with kiln_observers_add (ctx = m). */
kiln_observer kiln_monitor_observer(kiln_monitor *m);
/* Input drift of one version now (the canary's drift gate): the number of
 * its features past their threshold over the current window, with the
 * farthest one described in what (n bytes: "feature 'x[0]': PSI 0.71 >
 * 0.25"); 0 when none is; -1 when no feature has the profile's minimum
 * count of values in the window yet; -2 when the version has no profile. */
int kiln_monitor_drift(kiln_monitor *m, const char *model, int64_t version, char *what, size_t n);
/* Check every tracked version's assets.extra/kiln_profile.json (mtime,
 * size, inode): a version whose file changed, appeared or went away gets a
 * new state, with the file read again and an empty window, at its next
 * request. `kiln serve` calls it after each model poll and config reload
 * (kiln_manager_add_listener). */
void kiln_monitor_refresh(kiln_monitor *m);

#endif
