/*
 * loss.c - reference kernels for the ONNX training losses:
 * NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.
 *
 * Both take scores of shape (N, C, d1..dk) and integer targets of shape
 * (N, d1..dk). The loss at each target position is -input[n, t, d] times
 * weight[t] (1 without weights); a target equal to ignore_index contributes
 * 0 and weighs 0. reduction "none" returns the per-position losses, "sum"
 * their sum, "mean" their sum divided by the sum of the weights that
 * applied (a plain mean without weights or ignore_index), as the ONNX
 * reference computes it. SoftmaxCrossEntropyLoss first takes the log
 * softmax over C and can also return it. Arithmetic is in double and is
 * rounded to the input's float type once.
 */
#include <stdlib.h>

#include "kernels/kernel.h"

/* The reduction attribute: 0 none, 1 sum, 2 mean. */
static kiln_status loss_reduction(const struct kiln_node *node, int *out)
{
    const char *r = kiln_attr_str(node, "reduction", "mean");
    if (strcmp(r, "none") == 0) *out = 0;
    else if (strcmp(r, "sum") == 0) *out = 1;
    else if (strcmp(r, "mean") == 0) *out = 2;
    else
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "reduction is '%s', expected 'none', 'sum' or 'mean'", r);
    return KILN_OK;
}

/* Output 0: the target's shape for reduction "none", else a scalar; output 1
 * (SoftmaxCrossEntropyLoss's log_prob) has the scores' type. */
static kiln_status loss_infer(struct kiln_infer_ctx *ctx)
{
    int red = 0;
    kiln_status st = loss_reduction(ctx->node, &red);
    if (st != KILN_OK) return st;
    const struct kiln_type *x = ctx->in[0], *t = ctx->in[1];
    if (x && x->rank >= 0 && x->rank < 2)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "input has rank %d, expected (N, C, ...)", x->rank);
    if (ctx->out[0]) {
        struct kiln_type o;
        kiln_type_unknown(&o);
        if (red != 0) {
            o.rank = 0;
        } else if (t && t->rank >= 0) {
            o = *t;
        } else if (x && x->rank >= 2) { /* (N, C, d...) without C */
            o = *x;
            o.rank = x->rank - 1;
            o.dims[0] = x->dims[0];
            o.sym[0] = x->sym[0];
            for (int d = 1; d < o.rank; d++) {
                o.dims[d] = x->dims[d + 1];
                o.sym[d] = x->sym[d + 1];
            }
        }
        o.dtype = x ? x->dtype : KILN_DTYPE_UNDEFINED;
        *ctx->out[0] = o;
    }
    if (ctx->n_out > 1 && ctx->out[1]) {
        if (x) *ctx->out[1] = *x;
        else kiln_type_unknown(ctx->out[1]);
    }
    return KILN_OK;
}

/* The loss of scores x (log probabilities) against targets t, written to y.
 * Checks shapes and target values. */
static kiln_status nll_compute(const struct kiln_node *node, const kiln_tensor *x,
                               const double *logp, const kiln_tensor *t, const kiln_tensor *w,
                               kiln_tensor *y)
{
    char b1[96], b2[96];
    int red = 0;
    kiln_status st = loss_reduction(node, &red);
    if (st != KILN_OK) return st;
    if (!kiln_dtype_is_int(t->dtype))
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "target has dtype %s, expected int",
                               kiln_dtype_name(t->dtype));
    bool shape_ok = x->rank >= 2 && t->rank == x->rank - 1 && t->dims[0] == x->dims[0];
    for (int d = 1; shape_ok && d < t->rank; d++) shape_ok = t->dims[d] == x->dims[d + 1];
    if (!shape_ok)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "target shape %s does not match input %s (expected (N, d1..dk))",
                               kiln_shape_str(t->rank, t->dims, b1, sizeof b1),
                               kiln_shape_str(x->rank, x->dims, b2, sizeof b2));
    int64_t n = x->dims[0], c = x->dims[1];
    int64_t inner = kiln_shape_count(x->rank - 2, x->dims + 2);
    if (w && (w->rank != 1 || w->dims[0] != c))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "weight has shape %s, expected [%lld]",
                               kiln_shape_str(w->rank, w->dims, b1, sizeof b1), (long long)c);
    bool has_ignore = kiln_node_attr(node, "ignore_index") != NULL;
    int64_t ignore = kiln_attr_int(node, "ignore_index", 0);
    double sum = 0, wsum = 0;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t d = 0; d < inner; d++) {
            int64_t ti = i * inner + d;
            int64_t cls = kiln_get_i64(t->dtype, t->data, ti);
            double loss = 0, wt = 0;
            if (!has_ignore || cls != ignore) {
                if (cls < 0 || cls >= c)
                    return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                           "target %lld at %lld is outside [0, %lld)",
                                           (long long)cls, (long long)ti, (long long)c);
                wt = w ? kiln_get_f64(w->dtype, w->data, cls) : 1.0;
                loss = -logp[(i * c + cls) * inner + d] * wt;
            }
            if (red == 0) kiln_set_f64(y->dtype, y->data, ti, loss);
            sum += loss;
            wsum += wt;
        }
    }
    if (red == 1) kiln_set_f64(y->dtype, y->data, 0, sum);
    if (red == 2) kiln_set_f64(y->dtype, y->data, 0, sum / wsum);
    return KILN_OK;
}

/* Check that x is a float tensor of rank >= 2. */
static kiln_status loss_check_input(const struct kiln_node *node, const kiln_tensor *x)
{
    if (!kiln_dtype_is_float(x->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "input dtype %s is not supported",
                               kiln_dtype_name(x->dtype));
    if (x->rank < 2)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "input has rank %d, expected (N, C, ...)", x->rank);
    return KILN_OK;
}

static kiln_status nll_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_status st = loss_check_input(ctx->node, x);
    if (st != KILN_OK) return st;
    int64_t count = kiln_tensor_count(x);
    double *logp = malloc(sizeof(double) * (size_t)(count > 0 ? count : 1));
    if (!logp) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "NegativeLogLikelihoodLoss scratch");
    for (int64_t i = 0; i < count; i++) logp[i] = kiln_get_f64(x->dtype, x->data, i);
    st = nll_compute(ctx->node, x, logp, ctx->in[1], ctx->n_in > 2 ? ctx->in[2] : NULL,
                     ctx->out[0]);
    free(logp);
    return st;
}

KILN_REF_OP(NegativeLogLikelihoodLoss, loss_infer, nll_run);

/* Log softmax of x over axis 1, in double. */
static void log_softmax_axis1(const kiln_tensor *x, double *out)
{
    int64_t n = x->dims[0], c = x->dims[1];
    int64_t inner = kiln_shape_count(x->rank - 2, x->dims + 2);
    for (int64_t i = 0; i < n; i++) {
        for (int64_t d = 0; d < inner; d++) {
            int64_t base = i * c * inner + d;
            double mx = -INFINITY;
            for (int64_t k = 0; k < c; k++) {
                out[base + k * inner] = kiln_get_f64(x->dtype, x->data, base + k * inner);
                if (out[base + k * inner] > mx) mx = out[base + k * inner];
            }
            double s = 0;
            for (int64_t k = 0; k < c; k++) s += exp(out[base + k * inner] - mx);
            double lse = mx + log(s);
            for (int64_t k = 0; k < c; k++) out[base + k * inner] -= lse;
        }
    }
}

static kiln_status sce_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_status st = loss_check_input(ctx->node, x);
    if (st != KILN_OK) return st;
    int64_t count = kiln_tensor_count(x);
    double *logp = malloc(sizeof(double) * (size_t)(count > 0 ? count : 1));
    if (!logp) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "SoftmaxCrossEntropyLoss scratch");
    log_softmax_axis1(x, logp);
    st = nll_compute(ctx->node, x, logp, ctx->in[1], ctx->n_in > 2 ? ctx->in[2] : NULL,
                     ctx->out[0]);
    if (st == KILN_OK && ctx->n_out > 1 && ctx->out[1])
        for (int64_t i = 0; i < count; i++) kiln_set_f64(x->dtype, ctx->out[1]->data, i, logp[i]);
    free(logp);
    return st;
}

KILN_REF_OP(SoftmaxCrossEntropyLoss, loss_infer, sce_run);
