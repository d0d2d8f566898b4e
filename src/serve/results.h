/*
 * results.h - the classify and regress request path that TF Serving's REST
 * (:classify, :regress) and gRPC (Classify, Regress, MultiInference) APIs
 * share: checking that a signature takes serialized tf.Examples and has the
 * right method_name, and reading its outputs as TF Serving's classifier and
 * regressor do (classes and/or scores of shape [n, k]; outputs of n floats).
 * Messages are the REST ones, so both APIs word their errors alike.
 */
#ifndef KILN_SERVE_RESULTS_H
#define KILN_SERVE_RESULTS_H

#include <stdint.h>

#include "kiln/kiln.h"
#include "serve/batch.h"

/* Check that sig is a classification (classify = 1) or regression
 * signature with one string input; INVALID_ARGUMENT with err
 * (KILN_JSON_ERR_LEN bytes) otherwise. */
kiln_status kiln_results_check_signature(const kiln_signature *sig, int classify, char *err);

/* A classify run over n examples: classes (string) and/or scores (float),
 * either may be NULL, both [n, k]. */
typedef struct kiln_class_results {
    int64_t n, k;
    const kiln_tensor *classes;
    const kiln_tensor *scores;
} kiln_class_results;

kiln_status kiln_results_classify(const kiln_batch_result *out, int64_t n, kiln_class_results *r,
                                  char *err);
/* A regress run over n examples: its n values. */
kiln_status kiln_results_regress(const kiln_batch_result *out, int64_t n, const float **values,
                                 char *err);

#endif
