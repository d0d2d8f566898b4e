/*
 * internal.h - API extras for Kiln's own tools (not part of the public,
 * stable API in include/kiln/kiln.h).
 */
#ifndef KILN_API_INTERNAL_H
#define KILN_API_INTERNAL_H

#include <stdio.h>

#include "kiln/kiln.h"

/* Per-op time of the session's cached plans (profiling must have been
 * enabled with kiln_plan_profile_enable before the runs). */
void kiln_session_profile_print(kiln_session *s, FILE *f);
/* The share of the profiled run time spent on reference code (kiln_plan_cache_reference_share):
 * 1 on the reference executor, -1 when nothing was profiled. */
double kiln_session_reference_share(kiln_session *s);
/* One line about the session's plans: count, steps, fast kernels, arena bytes. */
void kiln_session_plan_summary(kiln_session *s, char *buf, size_t n);
/* Stream the canonical form of the model's imported graph and weights
 * (api/fingerprint.c) to write(ctx, bytes, n): names and file encoding do
 * not enter it. `kiln fingerprint` hashes it. */
kiln_status kiln_model_canonical_write(const kiln_model *m,
                                       void (*write)(void *ctx, const void *p, size_t n),
                                       void *ctx);

/* What kiln_session_save (api/artifact.c) writes: the session's model,
 * signature, the graph it runs and its precision. Makes every constant of the
 * model resident (the weight cache may have released packed ones). */
struct kiln_model;
struct kiln_signature;
struct kiln_graph;
kiln_status kiln_session_artifact_view(kiln_session *s, const struct kiln_model **m,
                                       const struct kiln_signature **sig,
                                       const struct kiln_graph **g, int *precision);
/* For a .kiln model, write what `kiln inspect` shows of the file (format and
 * Kiln versions, precision, CPU features, batch sizes, section sizes, the
 * precision of every node and the stored report) to f; 0 for another model. */
int kiln_model_artifact_print(const kiln_model *m, FILE *f);
/* From now on s runs g (an optimized graph it owns; static int8 after calibration) through
 * its own fp32 plan cache. */
struct kiln_graph;
struct kiln_weight_cache;
kiln_status kiln_session_adopt_graph(kiln_session *s, struct kiln_graph *g);
/* Static int8 (calibration.c): the targets and ranges (by value id of the imported graph)
 * kiln_sq_rewrite made s's graph from; s takes ownership of both. The getter returns the
 * target count, -1 when s was not statically quantized (kiln_session_write_onnx). */
struct kiln_sq_target;
void kiln_session_set_static_quant(kiln_session *s, struct kiln_sq_target *t, int n,
                                   float (*range)[2]);
int kiln_session_static_quant(const kiln_session *s, const struct kiln_sq_target **t,
                              const float (**range)[2]);
/* The imported graph of s's signature, its model's weight cache, and the session options. */
const struct kiln_graph *kiln_session_graph(const kiln_session *s);
struct kiln_weight_cache *kiln_session_weights(const kiln_session *s);
const kiln_session_options *kiln_session_opts(const kiln_session *s);

#endif
