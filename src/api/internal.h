/*
 * internal.h - API extras inside libkiln (not part of the public, stable API
 * in include/kiln/kiln.h, and not exported: the few that Kiln's own tool
 * uses are in include/kiln/kiln_util.h).
 */
#ifndef KILN_API_INTERNAL_H
#define KILN_API_INTERNAL_H

#include <stdio.h>

#include "kiln/kiln.h"
#include "kiln/kiln_util.h"

/* The extras `kiln bench`, `kiln inspect` and `kiln fingerprint` use
 * (kiln_session_profile_print, kiln_session_reference_share,
 * kiln_session_plan_summary, kiln_model_canonical_write,
 * kiln_model_artifact_print) are exported: include/kiln/kiln_util.h. */

/* What kiln_session_save (api/artifact.c) writes: the session's model,
 * signature, the graph it runs and its precision. Makes every constant of the
 * model resident (the weight cache may have released packed ones). */
struct kiln_model;
struct kiln_signature;
struct kiln_graph;
kiln_status kiln_session_artifact_view(kiln_session *s, const struct kiln_model **m,
                                       const struct kiln_signature **sig,
                                       const struct kiln_graph **g, int *precision);
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
/* kiln_calibration_finish for session `into` (into may be c's own session, or another of the
 * same model and signature, which then runs the int8 graph), keeping also the nodes named in
 * excl[0..n_excl) in fp32 (names that are no target are ignored): auto's trials of static
 * int8 with the most sensitive nodes kept, from one feed (compile.c). */
kiln_status kiln_calibration_finish_into(kiln_calibration *c, kiln_session *into,
                                         kiln_calibration_method method, double percentile,
                                         const char *const *excl, int n_excl);
/* The imported graph of s's signature, its model's weight cache, and the session options. */
const struct kiln_graph *kiln_session_graph(const kiln_session *s);
struct kiln_weight_cache *kiln_session_weights(const kiln_session *s);
const kiln_session_options *kiln_session_opts(const kiln_session *s);

/* Constants a model edit replaced (prune.c, tables.c): each old tensor with its new one, so
 * that every graph of the model holding the old one is pointed at the same new one. */
struct kiln_const_swap {
    const kiln_tensor *from;
    kiln_tensor *to;
};
struct kiln_const_swaps {
    struct kiln_const_swap *v;
    int n, cap;
};
/* The replacement of t (t itself when it is one already), or NULL. */
kiln_tensor *kiln_const_swaps_find(const struct kiln_const_swaps *s, const kiln_tensor *t);
/* g owns `to` from now on (freed here if that fails), recorded as from's replacement. */
kiln_status kiln_const_swaps_add(struct kiln_const_swaps *s, struct kiln_graph *g,
                                 const kiln_tensor *from, kiln_tensor *to);

#endif
