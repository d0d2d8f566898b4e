/*
 * fused.c - reference kernels for the optimizer's fused ops (opt/opt.h):
 *
 *   KilnFusedConv(X, W, [B], [Sum])      Y = act(Conv(X, W, B) + Sum)
 *   KilnFusedMatMul(A, B, [Bias], [Sum]) Y = act(alpha * opA(A) @ opB(B) + Bias + Sum)
 *
 * Both run the unfused reference code: Conv's and MatMul's own kernels
 * (through kiln_op_impl, with the fused node, whose Conv attributes have
 * Conv's names) do the product, then the epilogue adds Bias and Sum
 * (numpy broadcasting into Y) and applies the activation in double, with
 * the formulas of the activation ops' reference kernels (elementwise.c).
 */
#include <float.h>
#include <stdlib.h>

#include "core/tensor.h"
#include "kernels/kernel.h"

/* ---- activations ---- */

enum fused_act {
    ACT_NONE, ACT_RELU, ACT_CLIP, ACT_LEAKY_RELU, ACT_HARD_SWISH, ACT_HARD_SIGMOID, ACT_SIGMOID,
    ACT_SILU, ACT_TANH, ACT_GELU, ACT_GELU_TANH,
};

struct act_params {
    enum fused_act kind;
    double alpha, beta;
};

/* Parse the activation attributes of a fused node (defaults as the ONNX ops'). */
static kiln_status act_parse(const struct kiln_node *node, struct act_params *p)
{
    static const struct {
        const char *name;
        enum fused_act kind;
        double alpha, beta;
    } acts[] = {
        {"", ACT_NONE, 0, 0},
        {"Relu", ACT_RELU, 0, 0},
        {"Clip", ACT_CLIP, -FLT_MAX, FLT_MAX},
        {"LeakyRelu", ACT_LEAKY_RELU, 0.01, 0},
        {"HardSwish", ACT_HARD_SWISH, 0, 0},
        {"HardSigmoid", ACT_HARD_SIGMOID, 0.2, 0.5},
        {"Sigmoid", ACT_SIGMOID, 0, 0},
        {"SiLU", ACT_SILU, 0, 0},
        {"Tanh", ACT_TANH, 0, 0},
        {"Gelu", ACT_GELU, 0, 0},
        {"GeluTanh", ACT_GELU_TANH, 0, 0},
    };
    const char *s = kiln_attr_str(node, "activation", "");
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        if (strcmp(s, acts[i].name) != 0) continue;
        p->kind = acts[i].kind;
        p->alpha = kiln_attr_float(node, "act_alpha", (float)acts[i].alpha);
        p->beta = kiln_attr_float(node, "act_beta", (float)acts[i].beta);
        return KILN_OK;
    }
    return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "activation '%s' is not known", s);
}

static double sigmoid(double x)
{
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

static double act_apply(const struct act_params *p, double x)
{
    switch (p->kind) {
    case ACT_NONE: return x;
    case ACT_RELU: return x < 0 ? 0.0 : x;
    case ACT_CLIP: {
        /* Clip on float32 compares against the bounds rounded to float32 */
        double lo = (float)p->alpha, hi = (float)p->beta;
        x = x < lo ? lo : x;
        return x > hi ? hi : x;
    }
    case ACT_LEAKY_RELU: return x < 0 ? p->alpha * x : x;
    case ACT_HARD_SWISH: return x * fmax(0.0, fmin(1.0, x / 6.0 + 0.5));
    case ACT_HARD_SIGMOID: return fmax(0.0, fmin(1.0, p->alpha * x + p->beta));
    case ACT_SIGMOID: return sigmoid(x);
    case ACT_SILU: return x * sigmoid(x);
    case ACT_TANH: return tanh(x);
    case ACT_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case ACT_GELU_TANH: {
        const double k = 0.7978845608028654; /* sqrt(2 / pi) */
        return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
    }
    }
    return x;
}

/* Check that t (may be NULL) broadcasts into y's shape without growing it. */
static kiln_status check_into(const struct kiln_node *node, const char *what, const kiln_tensor *t,
                              const kiln_tensor *y)
{
    if (!t) return KILN_OK;
    if (t->dtype != y->dtype)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s is %s but the output is %s",
                               what, kiln_dtype_name(t->dtype), kiln_dtype_name(y->dtype));
    bool ok = t->rank <= y->rank;
    for (int i = 0; ok && i < t->rank; i++) {
        int64_t d = t->dims[t->rank - 1 - i], o = y->dims[y->rank - 1 - i];
        if (d != 1 && d != o) ok = false;
    }
    if (!ok) {
        char a[96], b[96];
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "%s of shape %s does not broadcast to the output shape %s", what,
                               kiln_shape_str(t->rank, t->dims, a, sizeof a),
                               kiln_shape_str(y->rank, y->dims, b, sizeof b));
    }
    return KILN_OK;
}

/* y = act(scale * y + bias + sum); bias and sum (may be NULL) broadcast into y. */
static kiln_status epilogue(const struct kiln_node *node, kiln_tensor *y, double scale,
                            const kiln_tensor *bias, const kiln_tensor *sum)
{
    struct act_params p;
    kiln_status st = act_parse(node, &p);
    if (st == KILN_OK) st = check_into(node, "bias", bias, y);
    if (st == KILN_OK) st = check_into(node, "sum", sum, y);
    if (st != KILN_OK) return st;
    int64_t n = kiln_tensor_count(y);
    if (n <= 0) return KILN_OK;
    const kiln_tensor *ins[2] = {bias ? bias : y, sum ? sum : y};
    struct kiln_bcast_iter it;
    kiln_bcast_iter_init(&it, y, 2, ins);
    kiln_dtype dt = y->dtype;
    for (int64_t i = 0; i < n; i++) {
        double v = kiln_get_f64(dt, y->data, i) * scale;
        if (bias) v += kiln_get_f64(dt, bias->data, it.off[0]);
        if (sum) v += kiln_get_f64(dt, sum->data, it.off[1]);
        kiln_set_f64(dt, y->data, i, act_apply(&p, v));
        if (i + 1 < n) kiln_bcast_iter_next(&it);
    }
    return KILN_OK;
}

/* Static check that an optional input's type broadcasts into the output type. */
static kiln_status infer_check_into(const struct kiln_node *node, const char *what,
                                    const struct kiln_type *t, const struct kiln_type *y)
{
    if (!t || t->rank < 0 || y->rank < 0) return KILN_OK;
    if (t->rank > y->rank)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "%s has rank %d, more than the output's %d", what, t->rank,
                               y->rank);
    for (int i = 0; i < t->rank; i++) {
        int64_t d = t->dims[t->rank - 1 - i], o = y->dims[y->rank - 1 - i];
        if (d >= 0 && o >= 0 && d != 1 && d != o)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "%s dim %d is %lld but the output's is %lld", what,
                                   t->rank - 1 - i, (long long)d, (long long)o);
    }
    return KILN_OK;
}

static const struct kiln_type *opt_in(const struct kiln_infer_ctx *ctx, int i)
{
    return i < ctx->n_in ? ctx->in[i] : NULL;
}

/* ---- KilnFusedConv ---- */

static kiln_status fused_conv_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_op_impl *conv = kiln_op_impl(KILN_OP_Conv);
    if (!conv) return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "no Conv kernel");
    struct act_params p;
    kiln_status st = act_parse(ctx->node, &p);
    if (st != KILN_OK || !ctx->out[0]) return st;
    struct kiln_infer_ctx c = *ctx;
    c.n_in = ctx->n_in < 3 ? ctx->n_in : 3;
    st = conv->infer(&c); /* B is Conv's: one value per output channel */
    const struct kiln_type *b = opt_in(ctx, 2);
    if (st == KILN_OK && b && b->rank >= 0 && b->rank != 1)
        st = kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT, "B has rank %d, expected 1",
                             b->rank);
    if (st == KILN_OK) st = infer_check_into(ctx->node, "sum", opt_in(ctx, 3), ctx->out[0]);
    return st;
}

static kiln_status fused_conv_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_op_impl *conv = kiln_op_impl(KILN_OP_Conv);
    if (!conv) return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "no Conv kernel");
    struct kiln_run_ctx c = *ctx;
    c.n_in = ctx->n_in < 3 ? ctx->n_in : 3;
    kiln_status st = conv->run(&c);
    if (st != KILN_OK) return st;
    const kiln_tensor *sum = ctx->n_in > 3 ? ctx->in[3] : NULL;
    return epilogue(ctx->node, ctx->out[0], 1.0, NULL, sum);
}

KILN_REF_OP(KilnFusedConv, fused_conv_infer, fused_conv_run);

/* ---- KilnFusedMatMul ---- */

/* The type of opX(X): the last two dims swapped when trans (rank >= 2). */
static void trans_type(const struct kiln_type *in, bool trans, struct kiln_type *out)
{
    *out = *in;
    if (!trans || in->rank < 2) return;
    int r = in->rank;
    out->dims[r - 2] = in->dims[r - 1];
    out->dims[r - 1] = in->dims[r - 2];
    out->sym[r - 2] = in->sym[r - 1];
    out->sym[r - 1] = in->sym[r - 2];
}

static kiln_status trans_attrs(const struct kiln_node *node, bool *ta, bool *tb)
{
    int64_t a = kiln_attr_int(node, "transA", 0), b = kiln_attr_int(node, "transB", 0);
    if ((a != 0 && a != 1) || (b != 0 && b != 1))
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "transA %lld / transB %lld must be 0 or 1",
                               (long long)a, (long long)b);
    *ta = a;
    *tb = b;
    return KILN_OK;
}

static kiln_status fused_matmul_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_op_impl *mm = kiln_op_impl(KILN_OP_MatMul);
    if (!mm) return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "no MatMul kernel");
    struct act_params p;
    bool ta, tb;
    kiln_status st = act_parse(ctx->node, &p);
    if (st == KILN_OK) st = trans_attrs(ctx->node, &ta, &tb);
    if (st != KILN_OK || !ctx->out[0]) return st;
    struct kiln_type a, b;
    const struct kiln_type *in[2] = {NULL, NULL};
    if (ctx->in[0]) {
        trans_type(ctx->in[0], ta, &a);
        in[0] = &a;
    }
    if (ctx->in[1]) {
        trans_type(ctx->in[1], tb, &b);
        in[1] = &b;
    }
    const kiln_tensor *no_values[2] = {NULL, NULL};
    struct kiln_infer_ctx c = *ctx;
    c.n_in = 2;
    c.in = in;
    c.in_value = no_values;
    st = mm->infer(&c);
    if (st == KILN_OK) st = infer_check_into(ctx->node, "bias", opt_in(ctx, 2), ctx->out[0]);
    if (st == KILN_OK) st = infer_check_into(ctx->node, "sum", opt_in(ctx, 3), ctx->out[0]);
    return st;
}

/* A copy of x with its last two dims swapped (rank >= 2), in *out. */
static kiln_status transpose_last2(const kiln_tensor *x, kiln_tensor **out)
{
    *out = NULL;
    int r = x->rank;
    int64_t dims[KILN_MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    dims[r - 2] = x->dims[r - 1];
    dims[r - 1] = x->dims[r - 2];
    kiln_tensor *t;
    kiln_status st = kiln_tensor_new_uninit(x->dtype, r, dims, &t);
    if (st != KILN_OK) return st;
    int64_t rows = x->dims[r - 2], cols = x->dims[r - 1];
    int64_t mats = rows > 0 && cols > 0 ? kiln_tensor_count(x) / (rows * cols) : 0;
    size_t es = kiln_dtype_size(x->dtype);
    const char *src = x->data;
    char *dst = t->data;
    for (int64_t m = 0; m < mats; m++)
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                memcpy(dst + (size_t)(m * rows * cols + j * rows + i) * es,
                       src + (size_t)(m * rows * cols + i * cols + j) * es, es);
    *out = t;
    return KILN_OK;
}

static kiln_status fused_matmul_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_op_impl *mm = kiln_op_impl(KILN_OP_MatMul);
    if (!mm) return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "no MatMul kernel");
    bool ta, tb;
    kiln_status st = trans_attrs(ctx->node, &ta, &tb);
    if (st != KILN_OK) return st;
    kiln_tensor *in[2] = {ctx->in[0], ctx->in[1]}, *tmp[2] = {NULL, NULL};
    bool trans[2] = {ta, tb};
    for (int i = 0; i < 2 && st == KILN_OK; i++) {
        if (!trans[i] || in[i]->rank < 2) continue;
        if (in[i]->dtype == KILN_DTYPE_STRING)
            st = kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "string inputs");
        else
            st = transpose_last2(in[i], &tmp[i]);
        if (st == KILN_OK) in[i] = tmp[i];
    }
    if (st == KILN_OK) {
        struct kiln_run_ctx c = *ctx;
        c.n_in = 2;
        c.in = in;
        st = mm->run(&c);
    }
    kiln_tensor_free(tmp[0]);
    kiln_tensor_free(tmp[1]);
    if (st != KILN_OK) return st;
    if (!kiln_dtype_is_float(ctx->out[0]->dtype))
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "dtype %s is not supported",
                               kiln_dtype_name(ctx->out[0]->dtype));
    double alpha = kiln_attr_float(ctx->node, "alpha", 1.0f);
    const kiln_tensor *bias = ctx->n_in > 2 ? ctx->in[2] : NULL;
    const kiln_tensor *sum = ctx->n_in > 3 ? ctx->in[3] : NULL;
    return epilogue(ctx->node, ctx->out[0], alpha, bias, sum);
}

KILN_REF_OP(KilnFusedMatMul, fused_matmul_infer, fused_matmul_run);
