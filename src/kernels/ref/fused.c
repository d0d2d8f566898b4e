/*
 * fused.c - reference kernels for the optimizer's fused ops (opt/opt.h):
 *
 *   KilnFusedConv(X, W, [B], [Sum])      Y = act(Conv(X, W, B) + Sum)
 *   KilnFusedConvTranspose(X, W, [B])    Y = act(ConvTranspose(X, W, B))
 *   KilnFusedMatMul(A, B, [Bias], [Sum]) Y = act(alpha * opA(A) @ opB(B) + Bias + Sum)
 *   KilnGroupNorm(X, Scale, Bias)        Y = act(GroupNormalization-21(X, Scale, Bias))
 *   KilnMBConv(X, [We], [Be], Wd, [Bd], Wp, [Bp], [Sum], [W1], [B1], [W2], [B2])
 *                                        expand 1x1, depthwise kxk, [squeeze-excitation],
 *                                        project 1x1 (opt.h)
 *
 * Both run the unfused reference code: Conv's and MatMul's own kernels
 * (through kiln_op_impl, with the fused node, whose Conv attributes have
 * Conv's names) do the product, then the epilogue adds Bias and Sum
 * (numpy broadcasting into Y) and applies the activation in double, with
 * the formulas of the activation ops' reference kernels (elementwise.c).
 * KilnMBConv's reference computes its three convolutions directly in
 * double, on plain NCHW tensors.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
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

/* Parse the activation attributes of a fused node (defaults as the ONNX ops'):
 * <prefix>activation, <prefix>act_alpha, <prefix>act_beta. */
static kiln_status act_parse_prefixed(const struct kiln_node *node, const char *prefix,
                                      struct act_params *p)
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
    char an[40], aa[40], ab[40];
    snprintf(an, sizeof an, "%sactivation", prefix);
    snprintf(aa, sizeof aa, "%sact_alpha", prefix);
    snprintf(ab, sizeof ab, "%sact_beta", prefix);
    const char *s = kiln_attr_str(node, an, "");
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        if (strcmp(s, acts[i].name) != 0) continue;
        p->kind = acts[i].kind;
        p->alpha = kiln_attr_float(node, aa, (float)acts[i].alpha);
        p->beta = kiln_attr_float(node, ab, (float)acts[i].beta);
        return KILN_OK;
    }
    return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s '%s' is not known", an, s);
}

static kiln_status act_parse(const struct kiln_node *node, struct act_params *p)
{
    return act_parse_prefixed(node, "", p);
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

/* ---- KilnFusedConvTranspose ---- */

static kiln_status fused_convt_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_op_impl *convt = kiln_op_impl(KILN_OP_ConvTranspose);
    if (!convt) return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "no ConvTranspose kernel");
    struct act_params p;
    kiln_status st = act_parse(ctx->node, &p);
    if (st != KILN_OK) return st;
    return convt->infer(ctx);
}

static kiln_status fused_convt_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_op_impl *convt = kiln_op_impl(KILN_OP_ConvTranspose);
    if (!convt) return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "no ConvTranspose kernel");
    kiln_status st = convt->run(ctx);
    if (st != KILN_OK) return st;
    return epilogue(ctx->node, ctx->out[0], 1.0, NULL, NULL);
}

KILN_REF_OP(KilnFusedConvTranspose, fused_convt_infer, fused_convt_run);

/* ---- KilnGroupNorm ----
 * GroupNormalization with scale and bias per channel (the node is opset 21; num_groups,
 * epsilon), then the activation, as groupnorm_fusion makes it (src/opt/groupnorm.c). */
extern const struct kiln_op_impl kiln_impl_GroupNormalization;

static kiln_status fused_groupnorm_run(struct kiln_run_ctx *ctx)
{
    struct act_params p;
    kiln_status st = act_parse(ctx->node, &p);
    if (st != KILN_OK) return st;
    if (ctx->node->opset < 21)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "KilnGroupNorm takes scale and bias per channel (opset 21), not "
                               "opset %d", ctx->node->opset);
    st = kiln_impl_GroupNormalization.run(ctx);
    if (st != KILN_OK || p.kind == ACT_NONE) return st;
    kiln_tensor *y = ctx->out[0];
    int64_t n = kiln_tensor_count(y);
    for (int64_t i = 0; i < n; i++)
        kiln_set_f64(y->dtype, y->data, i, act_apply(&p, kiln_get_f64(y->dtype, y->data, i)));
    return KILN_OK;
}

KILN_REF_OP(KilnGroupNorm, kiln_infer_same, fused_groupnorm_run);

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
    bool ta = false, tb = false;
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
    bool ta = false, tb = false;
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

/* ---- KilnMatMulT ---- */

/* The perm attribute `name` for rank r into p (identity when absent); an error naming the
 * node when it is not a permutation of r dims. */
static kiln_status matmul_t_perm(const struct kiln_node *node, const char *name, int r, int64_t *p)
{
    const int64_t *v;
    int k = kiln_attr_ints(node, name, &v);
    if (k < 0) {
        for (int i = 0; i < r; i++) p[i] = i;
        return KILN_OK;
    }
    bool seen[KILN_MAX_RANK] = {false};
    if (k != r)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s has %d entries for rank %d",
                               name, k, r);
    for (int i = 0; i < k; i++) {
        if (v[i] < 0 || v[i] >= r || seen[v[i]])
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s is not a permutation", name);
        seen[v[i]] = true;
        p[i] = v[i];
    }
    return KILN_OK;
}

static kiln_status matmul_t_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_op_impl *mm = kiln_op_impl(KILN_OP_MatMul);
    if (!mm) return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "no MatMul kernel");
    if (!ctx->out[0]) return KILN_OK;
    struct kiln_type t[2];
    const struct kiln_type *in[2] = {NULL, NULL};
    static const char *const names[2] = {"permA", "permB"};
    for (int i = 0; i < 2; i++) {
        if (!ctx->in[i]) continue;
        t[i] = *ctx->in[i];
        if (ctx->in[i]->rank >= 0) {
            int64_t p[KILN_MAX_RANK];
            kiln_status st = matmul_t_perm(ctx->node, names[i], ctx->in[i]->rank, p);
            if (st != KILN_OK) return st;
            for (int d = 0; d < ctx->in[i]->rank; d++) {
                t[i].dims[d] = ctx->in[i]->dims[p[d]];
                t[i].sym[d] = ctx->in[i]->sym[p[d]];
            }
        }
        in[i] = &t[i];
    }
    const kiln_tensor *no_values[2] = {NULL, NULL};
    struct kiln_infer_ctx c = *ctx;
    c.n_in = 2;
    c.in = in;
    c.in_value = no_values;
    return mm->infer(&c);
}

/* A copy of x transposed by p, in *out. */
static kiln_status permute_copy(const kiln_tensor *x, const int64_t *p, kiln_tensor **out)
{
    int r = x->rank;
    int64_t dims[KILN_MAX_RANK], xs[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    for (int d = 0; d < r; d++) dims[d] = x->dims[p[d]];
    int64_t acc = 1;
    for (int d = r - 1; d >= 0; d--) {
        xs[d] = acc;
        acc *= x->dims[d];
    }
    kiln_status st = kiln_tensor_new_uninit(x->dtype, r, dims, out);
    if (st != KILN_OK) return st;
    size_t es = kiln_dtype_size(x->dtype);
    int64_t n = kiln_tensor_count(*out);
    const char *src = x->data;
    char *dst = (*out)->data;
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0;
        for (int d = 0; d < r; d++) off += idx[d] * xs[p[d]];
        memcpy(dst + (size_t)i * es, src + (size_t)off * es, es);
        for (int d = r - 1; d >= 0; d--) {
            if (++idx[d] < dims[d]) break;
            idx[d] = 0;
        }
    }
    return KILN_OK;
}

static kiln_status matmul_t_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_op_impl *mm = kiln_op_impl(KILN_OP_MatMul);
    if (!mm) return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "no MatMul kernel");
    kiln_tensor *in[2] = {ctx->in[0], ctx->in[1]}, *tmp[2] = {NULL, NULL};
    static const char *const names[2] = {"permA", "permB"};
    kiln_status st = KILN_OK;
    for (int i = 0; i < 2 && st == KILN_OK; i++) {
        if (!kiln_node_attr(ctx->node, names[i])) continue;
        if (in[i]->dtype == KILN_DTYPE_STRING)
            return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "string inputs");
        int64_t p[KILN_MAX_RANK];
        st = matmul_t_perm(ctx->node, names[i], in[i]->rank, p);
        if (st == KILN_OK) st = permute_copy(in[i], p, &tmp[i]);
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
    double alpha = kiln_attr_float(ctx->node, "alpha", 1.0f);
    if (alpha == 1.0) return KILN_OK;
    if (!kiln_dtype_is_float(ctx->out[0]->dtype))
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "alpha on dtype %s",
                               kiln_dtype_name(ctx->out[0]->dtype));
    return epilogue(ctx->node, ctx->out[0], alpha, NULL, NULL);
}

KILN_REF_OP(KilnMatMulT, matmul_t_infer, matmul_t_run);

/* ---- KilnMBConv ---- */

struct mbconv_geom {
    int64_t n, cin, ce, cout, h, w, ho, wo;
    int64_t cse;              /* squeeze-excitation channels, 0 = none */
    int k, s;
    struct act_params act[4]; /* expand, depthwise, project, squeeze-excitation */
};

/* Check the weights' shapes against X's (x may have unknown dims, < 0) and
 * fill g. We (expand) may be absent (NULL): the depthwise then reads X. */
static kiln_status mbconv_geom(const struct kiln_node *node, const struct kiln_type *x,
                               const struct kiln_type *we, const struct kiln_type *wd,
                               const struct kiln_type *wp, struct mbconv_geom *g)
{
    kiln_status st = act_parse_prefixed(node, "expand_", &g->act[0]);
    if (st == KILN_OK) st = act_parse_prefixed(node, "dw_", &g->act[1]);
    if (st == KILN_OK) st = act_parse_prefixed(node, "", &g->act[2]);
    if (st == KILN_OK) st = act_parse_prefixed(node, "se_", &g->act[3]);
    if (st != KILN_OK) return st;
    int64_t k = kiln_attr_int(node, "dw_kernel", 3), s = kiln_attr_int(node, "dw_stride", 1);
    if (k < 1 || k > 15 || k % 2 == 0 || s < 1 || s > 8)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "dw_kernel %lld / dw_stride %lld: expected an odd kernel of 1-15 "
                               "and a stride of 1-8",
                               (long long)k, (long long)s);
    g->k = (int)k;
    g->s = (int)s;
    if (!x || !wd || !wp || x->rank != 4 || wd->rank != 4 || (we && we->rank != 4) ||
        wp->rank != 4)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "X and the weights must be 4-D");
    g->n = x->dims[0];
    g->ce = wd->dims[0];
    g->cin = we ? we->dims[1] : g->ce;
    g->cout = wp->dims[0];
    g->h = x->dims[2];
    g->w = x->dims[3];
    bool ok = wd->dims[1] == 1 && wd->dims[2] == k && wd->dims[3] == k &&
              (!we || (we->dims[0] == g->ce && we->dims[2] == 1 && we->dims[3] == 1)) &&
              wp->dims[1] == g->ce && wp->dims[2] == 1 && wp->dims[3] == 1 &&
              (x->dims[1] < 0 || x->dims[1] == g->cin);
    if (!ok)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "weights do not chain: X has %lld channels, the depthwise weight "
                               "is [%lld,%lld,%lld,%lld], the project's [%lld,%lld,%lld,%lld], "
                               "expand %s",
                               (long long)x->dims[1], (long long)wd->dims[0],
                               (long long)wd->dims[1], (long long)wd->dims[2],
                               (long long)wd->dims[3], (long long)wp->dims[0],
                               (long long)wp->dims[1], (long long)wp->dims[2],
                               (long long)wp->dims[3], we ? "present" : "absent");
    int64_t p = k / 2;
    g->ho = g->h >= 0 ? (g->h + 2 * p - k) / s + 1 : -1;
    g->wo = g->w >= 0 ? (g->w + 2 * p - k) / s + 1 : -1;
    return KILN_OK;
}

static kiln_status mbconv_check_bias(const struct kiln_node *node, const char *what,
                                     const struct kiln_type *b, int64_t c)
{
    if (!b || b->rank < 0) return KILN_OK;
    if (b->rank != 1 || (b->dims[0] >= 0 && b->dims[0] != c))
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s must be [%lld]", what,
                               (long long)c);
    return KILN_OK;
}

/* The squeeze-excitation weights W1 [Cse, Ce, 1, 1] and W2 [Ce, Cse, 1, 1]:
 * both or neither (sets g->cse, 0 for none). */
static kiln_status mbconv_se_geom(const struct kiln_node *node, const struct kiln_type *w1,
                                  const struct kiln_type *w2, struct mbconv_geom *g)
{
    g->cse = 0;
    if (!w1 && !w2) return KILN_OK;
    if (!w1 || !w2 || w1->rank != 4 || w2->rank != 4 || w1->dims[0] < 1 ||
        w1->dims[1] != g->ce || w1->dims[2] != 1 || w1->dims[3] != 1 || w2->dims[0] != g->ce ||
        w2->dims[1] != w1->dims[0] || w2->dims[2] != 1 || w2->dims[3] != 1)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "squeeze-excitation weights must be W1 [Cse,%lld,1,1] and W2 "
                               "[%lld,Cse,1,1], both present",
                               (long long)g->ce, (long long)g->ce);
    g->cse = w1->dims[0];
    return KILN_OK;
}

static kiln_status mbconv_infer(struct kiln_infer_ctx *ctx)
{
    if (ctx->n_in < 6)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "has %d inputs, expected 6 to 12",
                               ctx->n_in);
    struct mbconv_geom g;
    kiln_status st = mbconv_geom(ctx->node, ctx->in[0], ctx->in[1], ctx->in[3], ctx->in[5], &g);
    if (st == KILN_OK) st = mbconv_se_geom(ctx->node, opt_in(ctx, 8), opt_in(ctx, 10), &g);
    if (st == KILN_OK && !g.cse && (opt_in(ctx, 9) || opt_in(ctx, 11)))
        st = kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                             "B1 / B2 are given without the squeeze-excitation weights");
    if (st == KILN_OK) st = mbconv_check_bias(ctx->node, "B1", opt_in(ctx, 9), g.cse);
    if (st == KILN_OK) st = mbconv_check_bias(ctx->node, "B2", opt_in(ctx, 11), g.ce);
    if (st == KILN_OK && !ctx->in[1] && opt_in(ctx, 2))
        st = kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                             "Be is given for an absent expand");
    if (st == KILN_OK) st = mbconv_check_bias(ctx->node, "Be", opt_in(ctx, 2), g.ce);
    if (st == KILN_OK) st = mbconv_check_bias(ctx->node, "Bd", opt_in(ctx, 4), g.ce);
    if (st == KILN_OK) st = mbconv_check_bias(ctx->node, "Bp", opt_in(ctx, 6), g.cout);
    if (st != KILN_OK || !ctx->out[0]) return st;
    struct kiln_type *y = ctx->out[0];
    kiln_type_unknown(y);
    y->dtype = ctx->in[0]->dtype;
    y->rank = 4;
    y->dims[0] = g.n;
    y->sym[0] = ctx->in[0]->sym[0];
    y->dims[1] = g.cout;
    y->dims[2] = g.ho;
    y->dims[3] = g.wo;
    return infer_check_into(ctx->node, "sum", opt_in(ctx, 7), y);
}

static double mb_bias(const kiln_tensor *b, int64_t c)
{
    return b ? kiln_get_f64(b->dtype, b->data, c) : 0.0;
}

static const kiln_tensor *mb_in(const struct kiln_run_ctx *ctx, int i)
{
    return i < ctx->n_in ? ctx->in[i] : NULL;
}

/* Squeeze-excitation of image n's depthwise output d ([ce][ohw]), in place:
 * each channel times sigmoid(B2 + W2 act(B1 + W1 mean(d))); h has cse + ce room. */
static void mb_se(const struct mbconv_geom *g, const kiln_tensor *w1, const kiln_tensor *b1,
                  const kiln_tensor *w2, const kiln_tensor *b2, double *d, double *h)
{
    const int64_t ohw = g->ho * g->wo;
    double *mean = h + g->cse;
    for (int64_t c = 0; c < g->ce; c++) {
        mean[c] = 0.0;
        for (int64_t i = 0; i < ohw; i++) mean[c] += d[c * ohw + i];
        mean[c] /= (double)ohw;
    }
    for (int64_t j = 0; j < g->cse; j++) {
        double v = mb_bias(b1, j);
        for (int64_t c = 0; c < g->ce; c++)
            v += kiln_get_f64(w1->dtype, w1->data, j * g->ce + c) * mean[c];
        h[j] = act_apply(&g->act[3], v);
    }
    for (int64_t c = 0; c < g->ce; c++) {
        double v = mb_bias(b2, c);
        for (int64_t j = 0; j < g->cse; j++)
            v += kiln_get_f64(w2->dtype, w2->data, c * g->cse + j) * h[j];
        double s = 1.0 / (1.0 + exp(-v));
        for (int64_t i = 0; i < ohw; i++) d[c * ohw + i] *= s;
    }
}

static kiln_status mbconv_run(struct kiln_run_ctx *ctx)
{
    if (ctx->n_in < 6)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "has %d inputs, expected 6 to 12",
                               ctx->n_in);
    const kiln_tensor *x = ctx->in[0], *we = ctx->in[1], *wd = ctx->in[3], *wp = ctx->in[5];
    const kiln_tensor *be = mb_in(ctx, 2), *bd = mb_in(ctx, 4), *bp = mb_in(ctx, 6);
    const kiln_tensor *sum = mb_in(ctx, 7), *w1 = mb_in(ctx, 8), *b1 = mb_in(ctx, 9);
    const kiln_tensor *w2 = mb_in(ctx, 10), *b2 = mb_in(ctx, 11);
    kiln_tensor *y = ctx->out[0];
    struct kiln_type tx, twe, twd, twp, tw1, tw2;
    kiln_type_from_tensor(&tx, x);
    if (we) kiln_type_from_tensor(&twe, we);
    if (w1) kiln_type_from_tensor(&tw1, w1);
    if (w2) kiln_type_from_tensor(&tw2, w2);
    if (!wd || !wp)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "Wd and Wp are required");
    kiln_type_from_tensor(&twd, wd);
    kiln_type_from_tensor(&twp, wp);
    struct mbconv_geom g;
    kiln_status st = mbconv_geom(ctx->node, &tx, we ? &twe : NULL, &twd, &twp, &g);
    if (st == KILN_OK) st = mbconv_se_geom(ctx->node, w1 ? &tw1 : NULL, w2 ? &tw2 : NULL, &g);
    if (st == KILN_OK && ((b1 && kiln_tensor_count(b1) != g.cse) ||
                          (b2 && kiln_tensor_count(b2) != g.ce)))
        st = kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                             "B1 / B2 do not match the squeeze-excitation weights");
    if (st == KILN_OK) st = check_into(ctx->node, "sum", sum, y);
    if (st != KILN_OK) return st;
    if (y->rank != 4 || y->dims[1] != g.cout || y->dims[2] != g.ho || y->dims[3] != g.wo)
        return kiln_node_error(ctx->node, KILN_ERR_INTERNAL, "output shape does not match");
    const int64_t hw = g.h * g.w, ohw = g.ho * g.wo, p = g.k / 2;
    double *e = malloc(sizeof(double) * (size_t)(g.ce * hw + g.ce * ohw + g.cse + g.ce + 1));
    if (!e) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in KilnMBConv");
    double *d = e + g.ce * hw, *h = d + g.ce * ohw;
    kiln_dtype dt = x->dtype;
    struct kiln_bcast_iter it;
    const kiln_tensor *ins[1] = {sum ? sum : y};
    kiln_bcast_iter_init(&it, y, 1, ins);
    for (int64_t n = 0; n < g.n; n++) {
        for (int64_t c = 0; c < g.ce; c++)
            for (int64_t i = 0; i < hw; i++) {
                if (!we) {
                    e[c * hw + i] = kiln_get_f64(dt, x->data, (n * g.cin + c) * hw + i);
                    continue;
                }
                double v = mb_bias(be, c);
                for (int64_t q = 0; q < g.cin; q++)
                    v += kiln_get_f64(dt, we->data, c * g.cin + q) *
                         kiln_get_f64(dt, x->data, (n * g.cin + q) * hw + i);
                e[c * hw + i] = act_apply(&g.act[0], v);
            }
        for (int64_t c = 0; c < g.ce; c++)
            for (int64_t oy = 0; oy < g.ho; oy++)
                for (int64_t ox = 0; ox < g.wo; ox++) {
                    double v = mb_bias(bd, c);
                    for (int ky = 0; ky < g.k; ky++)
                        for (int kx = 0; kx < g.k; kx++) {
                            int64_t iy = oy * g.s - p + ky, ix = ox * g.s - p + kx;
                            if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                            v += kiln_get_f64(dt, wd->data, (c * g.k + ky) * g.k + kx) *
                                 e[c * hw + iy * g.w + ix];
                        }
                    d[c * ohw + oy * g.wo + ox] = act_apply(&g.act[1], v);
                }
        if (g.cse) mb_se(&g, w1, b1, w2, b2, d, h);
        for (int64_t c = 0; c < g.cout; c++)
            for (int64_t i = 0; i < ohw; i++) {
                int64_t yi = (n * g.cout + c) * ohw + i;
                double v = mb_bias(bp, c);
                for (int64_t q = 0; q < g.ce; q++)
                    v += kiln_get_f64(dt, wp->data, c * g.ce + q) * d[q * ohw + i];
                if (sum) v += kiln_get_f64(dt, sum->data, it.off[0]);
                kiln_set_f64(dt, y->data, yi, act_apply(&g.act[2], v));
                kiln_bcast_iter_next(&it);
            }
    }
    free(e);
    return KILN_OK;
}

KILN_REF_OP(KilnMBConv, mbconv_infer, mbconv_run);
