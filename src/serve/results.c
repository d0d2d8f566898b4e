/*
 * results.c - the checks and output readers of results.h, shared by the
 * REST (routes.c) and gRPC (grpc/service.c) classify and regress handlers.
 */
#include "serve/results.h"

#include <stdio.h>
#include <string.h>

#include "serve/json.h"

kiln_status kiln_results_check_signature(const kiln_signature *sig, int classify, char *err)
{
    const char *want = classify ? "tensorflow/serving/classify" : "tensorflow/serving/regress";
    const char *method = kiln_signature_method(sig);
    if (!method || strcmp(method, want) != 0) {
        snprintf(err, KILN_JSON_ERR_LEN, "Expected %s signature method_name to be %s. Was: %.200s",
                 classify ? "classification" : "regression", want,
                 method ? method : "tensorflow/serving/predict");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (kiln_signature_input_count(sig) != 1 ||
        kiln_signature_input(sig, 0)->dtype != KILN_DTYPE_STRING) {
        snprintf(err, KILN_JSON_ERR_LEN, "Expected one string input (serialized tf.Example) in "
                 "signature '%.200s'", kiln_signature_name(sig));
        return KILN_ERR_INVALID_ARGUMENT;
    }
    return KILN_OK;
}

/* The output named `name` in out, or NULL. */
static const kiln_tensor *output_named(const kiln_batch_result *out, const char *name)
{
    for (int i = 0; i < out->n; i++)
        if (strcmp(out->names[i], name) == 0) return out->t[i];
    return NULL;
}

kiln_status kiln_results_regress(const kiln_batch_result *out, int64_t n, const float **values,
                                 char *err)
{
    const kiln_tensor *y = output_named(out, "outputs");
    if (!y || y->dtype != KILN_DTYPE_F32 || kiln_tensor_count(y) != n || y->rank < 1 ||
        y->dims[0] != n) {
        snprintf(err, KILN_JSON_ERR_LEN, "Expected output tensor 'outputs' of type float with "
                 "one value per example (%lld)", (long long)n);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    *values = y->data;
    return KILN_OK;
}

kiln_status kiln_results_classify(const kiln_batch_result *out, int64_t n, kiln_class_results *r,
                                  char *err)
{
    const kiln_tensor *classes = output_named(out, "classes");
    const kiln_tensor *scores = output_named(out, "scores");
    if (!classes && !scores) {
        snprintf(err, KILN_JSON_ERR_LEN, "Expected classification signature outputs to contain "
                 "at least one of classes and scores");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    const kiln_tensor *shape = classes ? classes : scores;
    if (shape->rank != 2 || shape->dims[0] != n ||
        (classes && classes->dtype != KILN_DTYPE_STRING) ||
        (scores && (scores->dtype != KILN_DTYPE_F32 || scores->rank != 2 ||
                    scores->dims[0] != n || scores->dims[1] != shape->dims[1]))) {
        snprintf(err, KILN_JSON_ERR_LEN, "Expected classes (string) and scores (float) outputs "
                 "of shape [%lld, classes]", (long long)n);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    r->n = n;
    r->k = shape->dims[1];
    r->classes = classes;
    r->scores = scores;
    return KILN_OK;
}
