/*
 * rnn.c - reference kernels for the ONNX recurrent ops: RNN, GRU and LSTM.
 *
 * The three ops share one driver. Inputs are read once into double scratch
 * arrays (any float dtype), each direction runs its time loop over those,
 * and the outputs are written back in the input's dtype. Supported: forward,
 * reverse and bidirectional directions; layout 0 ([seq, batch, ...]) and 1
 * ([batch, seq, ...]); the activations / activation_alpha / activation_beta
 * attributes; clip; sequence_lens (steps past a batch entry's length keep the
 * previous state and write zeros to Y); initial_h / initial_c; GRU's
 * linear_before_reset; LSTM peepholes (P) and input_forget. Every output is
 * optional: ctx->out[i] is NULL when the model does not want it.
 *
 * Gate order in W, R and B follows ONNX: GRU z, r, h; LSTM i, o, f, c;
 * B is [Wb, Rb] per direction; LSTM's P is [Pi, Po, Pf].
 */
#include <strings.h>

#include "kernels/kernel.h"

enum rnn_kind { KIND_RNN, KIND_GRU, KIND_LSTM };

/* Per-kind constants: gates in W/R/B and activations per direction. */
static const int kind_gates[] = {1, 3, 4};
static const int kind_acts[] = {1, 2, 3};

enum act_fn {
    ACT_RELU,
    ACT_TANH,
    ACT_SIGMOID,
    ACT_AFFINE,
    ACT_LEAKY_RELU,
    ACT_THRESHOLDED_RELU,
    ACT_SCALED_TANH,
    ACT_HARD_SIGMOID,
    ACT_ELU,
    ACT_SOFTSIGN,
    ACT_SOFTPLUS,
};

struct act {
    enum act_fn fn;
    double alpha, beta;
};

/* Name, whether it takes alpha / beta, and their defaults. */
static const struct {
    const char *name;
    enum act_fn fn;
    bool has_alpha, has_beta;
    double alpha, beta;
} act_table[] = {
    {"Relu", ACT_RELU, false, false, 0, 0},
    {"Tanh", ACT_TANH, false, false, 0, 0},
    {"Sigmoid", ACT_SIGMOID, false, false, 0, 0},
    {"Affine", ACT_AFFINE, true, true, 1.0, 0.0},
    {"LeakyRelu", ACT_LEAKY_RELU, true, false, 0.01, 0},
    {"ThresholdedRelu", ACT_THRESHOLDED_RELU, true, false, 1.0, 0},
    {"ScaledTanh", ACT_SCALED_TANH, true, true, 1.0, 1.0},
    {"HardSigmoid", ACT_HARD_SIGMOID, true, true, 0.2, 0.5},
    {"Elu", ACT_ELU, true, false, 1.0, 0},
    {"Softsign", ACT_SOFTSIGN, false, false, 0, 0},
    {"Softplus", ACT_SOFTPLUS, false, false, 0, 0},
};

/* Apply one activation function. */
static double act_apply(const struct act *a, double x)
{
    switch (a->fn) {
    case ACT_RELU: return x > 0 ? x : 0;
    case ACT_TANH: return tanh(x);
    case ACT_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case ACT_AFFINE: return a->alpha * x + a->beta;
    case ACT_LEAKY_RELU: return x >= 0 ? x : a->alpha * x;
    case ACT_THRESHOLDED_RELU: return x > a->alpha ? x : 0;
    case ACT_SCALED_TANH: return a->alpha * tanh(a->beta * x);
    case ACT_HARD_SIGMOID: {
        double v = a->alpha * x + a->beta;
        return v < 0 ? 0 : v > 1 ? 1 : v;
    }
    case ACT_ELU: return x >= 0 ? x : a->alpha * (exp(x) - 1.0);
    case ACT_SOFTSIGN: return x / (1.0 + fabs(x));
    case ACT_SOFTPLUS: return log1p(exp(x));
    }
    return x;
}

/* Everything the time loop needs, parsed from attributes and inputs. */
struct rnn_cfg {
    enum rnn_kind kind;
    int64_t seq, batch, input, hidden;
    int ndir;
    bool reverse_only;      /* direction == "reverse" */
    int layout;
    double clip;            /* 0 = no clip */
    bool linear_before_reset;
    bool input_forget;
    struct act acts[2][3];  /* [direction][activation] */
};

/* Parse the direction attribute into a direction count. */
static kiln_status parse_direction(const struct kiln_node *n, int *ndir, bool *reverse)
{
    const char *dir = kiln_attr_str(n, "direction", "forward");
    *reverse = false;
    if (strcmp(dir, "forward") == 0) *ndir = 1;
    else if (strcmp(dir, "reverse") == 0) {
        *ndir = 1;
        *reverse = true;
    } else if (strcmp(dir, "bidirectional") == 0) *ndir = 2;
    else
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "direction '%s' is not forward, reverse or bidirectional", dir);
    return KILN_OK;
}

/* Fill cfg->acts from the activations / activation_alpha / activation_beta attributes. */
static kiln_status parse_activations(const struct kiln_node *n, struct rnn_cfg *cfg)
{
    static const enum act_fn defaults[3][3] = {
        {ACT_TANH},
        {ACT_SIGMOID, ACT_TANH},
        {ACT_SIGMOID, ACT_TANH, ACT_TANH},
    };
    int per_dir = kind_acts[cfg->kind];
    const struct kiln_attr *names = kiln_node_attr(n, "activations");
    const float *alphas, *betas;
    int n_alpha = kiln_attr_floats(n, "activation_alpha", &alphas);
    int n_beta = kiln_attr_floats(n, "activation_beta", &betas);
    int ia = 0, ib = 0;

    if (names && names->type != KILN_ATTR_STRINGS)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "activations is not a list of strings");
    int count = names ? names->n : 0;
    if (names && count != per_dir && count != per_dir * cfg->ndir)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "activations has %d entries, expected %d per direction", count,
                               per_dir);
    for (int d = 0; d < cfg->ndir; d++) {
        /* one list for both directions shares its alphas and betas too */
        if (count == per_dir) ia = ib = 0;
        for (int k = 0; k < per_dir; k++) {
            struct act *a = &cfg->acts[d][k];
            if (!names) {
                a->fn = defaults[cfg->kind][k];
                a->alpha = a->beta = 0;
                continue;
            }
            /* a list of per_dir names is shared by both directions */
            const kiln_string *s = &names->strings[(d * per_dir + k) % count];
            size_t t;
            for (t = 0; t < sizeof act_table / sizeof act_table[0]; t++)
                if (strlen(act_table[t].name) == s->len &&
                    strncasecmp(act_table[t].name, s->data, s->len) == 0)
                    break;
            if (t == sizeof act_table / sizeof act_table[0])
                return kiln_node_error(n, KILN_ERR_UNSUPPORTED,
                                       "activation '%.*s' is not supported", (int)s->len, s->data);
            a->fn = act_table[t].fn;
            a->alpha = act_table[t].alpha;
            a->beta = act_table[t].beta;
            /* alphas and betas are consumed in order by the functions that take them */
            if (act_table[t].has_alpha && ia < n_alpha) a->alpha = alphas[ia++];
            if (act_table[t].has_beta && ib < n_beta) a->beta = betas[ib++];
        }
    }
    return KILN_OK;
}

/* Shape function shared by RNN, GRU and LSTM. */
static kiln_status rnn_infer(struct kiln_infer_ctx *ctx, enum rnn_kind kind)
{
    const struct kiln_node *n = ctx->node;
    int ndir = 0;
    bool rev;
    kiln_status st = parse_direction(n, &ndir, &rev);
    if (st != KILN_OK) return st;
    int layout = (int)kiln_attr_int(n, "layout", 0);
    if (layout != 0 && layout != 1)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "layout %d is not 0 or 1", layout);

    const struct kiln_type *x = ctx->in[0];
    const struct kiln_type *r = ctx->n_in > 2 ? ctx->in[2] : NULL;
    int64_t seq = -1, batch = -1;
    kiln_dtype dt = x ? x->dtype : KILN_DTYPE_UNDEFINED;
    if (x && x->rank >= 0) {
        if (x->rank != 3)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "X has rank %d, expected 3",
                                   x->rank);
        seq = x->dims[layout ? 1 : 0];
        batch = x->dims[layout ? 0 : 1];
    }
    int64_t hidden = kiln_attr_int(n, "hidden_size", -1);
    int64_t r_hidden = r && r->rank == 3 ? r->dims[2] : -1;
    if (kiln_node_attr(n, "hidden_size") &&
        (hidden <= 0 || (r_hidden >= 0 && hidden != r_hidden)))
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "hidden_size %lld does not match R's last dim %lld",
                               (long long)hidden, (long long)r_hidden);
    if (hidden < 0) hidden = r_hidden;

    if (ctx->n_out > 0 && ctx->out[0]) {
        int64_t d[4] = {seq, ndir, batch, hidden};
        if (layout) {
            d[0] = batch;
            d[1] = seq;
            d[2] = ndir;
        }
        kiln_type_set(ctx->out[0], dt, 4, d);
    }
    for (int i = 1; i < ctx->n_out && i < (kind == KIND_LSTM ? 3 : 2); i++) {
        if (!ctx->out[i]) continue;
        int64_t d[3] = {ndir, batch, hidden};
        if (layout) {
            d[0] = batch;
            d[1] = ndir;
        }
        kiln_type_set(ctx->out[i], dt, 3, d);
    }
    return KILN_OK;
}

/* Check that an input has exactly the given shape. */
static kiln_status check_shape(const struct kiln_node *n, const char *what, const kiln_tensor *t,
                               int rank, const int64_t *dims)
{
    bool ok = t->rank == rank;
    for (int i = 0; ok && i < rank; i++) ok = t->dims[i] == dims[i];
    if (ok) return KILN_OK;
    char got[96], want[96];
    return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "%s has shape %s, expected %s", what,
                           kiln_shape_str(t->rank, t->dims, got, sizeof got),
                           kiln_shape_str(rank, dims, want, sizeof want));
}

/* Read a whole tensor into a new double array (NULL and *st set on failure). */
static double *to_doubles(const kiln_tensor *t, kiln_status *st)
{
    int64_t count = kiln_shape_count(t->rank, t->dims);
    double *v = malloc((size_t)(count > 0 ? count : 1) * sizeof *v);
    if (!v) {
        *st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory for RNN scratch");
        return NULL;
    }
    for (int64_t i = 0; i < count; i++) v[i] = kiln_get_f64(t->dtype, t->data, i);
    return v;
}

/* Clamp a gate's pre-activation to [-clip, clip] when clip is set. */
static double clipv(const struct rnn_cfg *c, double v)
{
    if (c->clip > 0) {
        if (v > c->clip) return c->clip;
        if (v < -c->clip) return -c->clip;
    }
    return v;
}

/* dot(a, b) over n elements. */
static double dot(const double *a, const double *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/*
 * One time step of one batch entry for one direction: reads x (input), h and
 * c (previous state), writes the new state to h_new / c_new. W, R: this
 * direction's [gates*H, I] and [gates*H, H]; wb, rb: biases; p: peepholes.
 */
static void rnn_cell(const struct rnn_cfg *c, const struct act *acts, const double *x,
                     const double *h, const double *cs, const double *W, const double *R,
                     const double *wb, const double *rb, const double *p, double *gates,
                     double *h_new, double *c_new)
{
    int64_t H = c->hidden, I = c->input;
    switch (c->kind) {
    case KIND_RNN:
        for (int64_t j = 0; j < H; j++) {
            double v = dot(x, W + j * I, I) + dot(h, R + j * H, H) + wb[j] + rb[j];
            h_new[j] = act_apply(&acts[0], clipv(c, v));
        }
        break;
    case KIND_GRU: {
        double *z = gates, *r = gates + H;
        for (int64_t j = 0; j < 2 * H; j++) {
            double v = dot(x, W + j * I, I) + dot(h, R + j * H, H) + wb[j] + rb[j];
            gates[j] = act_apply(&acts[0], clipv(c, v));
        }
        for (int64_t j = 0; j < H; j++) {
            int64_t g = 2 * H + j;
            double v = dot(x, W + g * I, I) + wb[g];
            if (c->linear_before_reset) {
                v += r[j] * (dot(h, R + g * H, H) + rb[g]);
            } else {
                double s = 0;
                for (int64_t k = 0; k < H; k++) s += r[k] * h[k] * R[g * H + k];
                v += s + rb[g];
            }
            double hh = act_apply(&acts[1], clipv(c, v));
            h_new[j] = (1.0 - z[j]) * hh + z[j] * h[j];
        }
        break;
    }
    case KIND_LSTM:
        for (int64_t j = 0; j < 4 * H; j++)
            gates[j] = dot(x, W + j * I, I) + dot(h, R + j * H, H) + wb[j] + rb[j];
        for (int64_t j = 0; j < H; j++) {
            double gi = gates[j], go = gates[H + j], gf = gates[2 * H + j],
                   gc = gates[3 * H + j];
            double pi = p ? p[j] : 0, po = p ? p[H + j] : 0, pf = p ? p[2 * H + j] : 0;
            double i = act_apply(&acts[0], clipv(c, gi + pi * cs[j]));
            double f = c->input_forget ? 1.0 - i : act_apply(&acts[0], clipv(c, gf + pf * cs[j]));
            double cc = act_apply(&acts[1], clipv(c, gc));
            double cn = f * cs[j] + i * cc;
            double o = act_apply(&acts[0], clipv(c, go + po * cn));
            c_new[j] = cn;
            h_new[j] = o * act_apply(&acts[2], cn);
        }
        break;
    }
}

/* Run one of RNN / GRU / LSTM. */
static kiln_status rnn_run(struct kiln_run_ctx *ctx, enum rnn_kind kind)
{
    const struct kiln_node *n = ctx->node;
    struct rnn_cfg c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    kiln_status st = parse_direction(n, &c.ndir, &c.reverse_only);
    if (st != KILN_OK) return st;
    c.layout = (int)kiln_attr_int(n, "layout", 0);
    if (c.layout != 0 && c.layout != 1)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "layout %d is not 0 or 1", c.layout);
    c.clip = kiln_node_attr(n, "clip") ? kiln_attr_float(n, "clip", 0) : 0;
    if (kiln_node_attr(n, "clip") && !(c.clip > 0))
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "clip %g is not positive", c.clip);
    c.linear_before_reset = kiln_attr_int(n, "linear_before_reset", 0) != 0;
    c.input_forget = kiln_attr_int(n, "input_forget", 0) != 0;
    st = parse_activations(n, &c);
    if (st != KILN_OK) return st;

    const kiln_tensor *X = ctx->in[0], *W = ctx->in[1], *R = ctx->in[2];
    const kiln_tensor *B = ctx->n_in > 3 ? ctx->in[3] : NULL;
    const kiln_tensor *L = ctx->n_in > 4 ? ctx->in[4] : NULL;
    const kiln_tensor *H0 = ctx->n_in > 5 ? ctx->in[5] : NULL;
    const kiln_tensor *C0 = kind == KIND_LSTM && ctx->n_in > 6 ? ctx->in[6] : NULL;
    const kiln_tensor *P = kind == KIND_LSTM && ctx->n_in > 7 ? ctx->in[7] : NULL;

    if (!kiln_dtype_is_float(X->dtype))
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "X dtype %s is not supported",
                               kiln_dtype_name(X->dtype));
    if (X->rank != 3)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "X has rank %d, expected 3", X->rank);
    c.seq = X->dims[c.layout ? 1 : 0];
    c.batch = X->dims[c.layout ? 0 : 1];
    c.input = X->dims[2];
    if (R->rank != 3)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "R has rank %d, expected 3", R->rank);
    c.hidden = kiln_attr_int(n, "hidden_size", R->dims[2]);
    if (c.hidden <= 0 || c.hidden != R->dims[2])
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "hidden_size %lld does not match R's last dim %lld",
                               (long long)c.hidden, (long long)R->dims[2]);

    int G = kind_gates[kind];
    int64_t H = c.hidden, T = c.seq, NB = c.batch, I = c.input, ND = c.ndir;
    int64_t dw[3] = {ND, G * H, I}, dr[3] = {ND, G * H, H}, db[2] = {ND, 2 * G * H};
    int64_t dl[1] = {NB}, dh[3] = {ND, NB, H}, dp[2] = {ND, 3 * H};
    if (c.layout) {
        dh[0] = NB;
        dh[1] = ND;
    }
    if ((st = check_shape(n, "W", W, 3, dw)) != KILN_OK) return st;
    if ((st = check_shape(n, "R", R, 3, dr)) != KILN_OK) return st;
    if (B && (st = check_shape(n, "B", B, 2, db)) != KILN_OK) return st;
    if (L && (st = check_shape(n, "sequence_lens", L, 1, dl)) != KILN_OK) return st;
    if (H0 && (st = check_shape(n, "initial_h", H0, 3, dh)) != KILN_OK) return st;
    if (C0 && (st = check_shape(n, "initial_c", C0, 3, dh)) != KILN_OK) return st;
    if (P && (st = check_shape(n, "P", P, 2, dp)) != KILN_OK) return st;
    if (L && !kiln_dtype_is_int(L->dtype))
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "sequence_lens has dtype %s",
                               kiln_dtype_name(L->dtype));
    for (int64_t b = 0; L && b < NB; b++) {
        int64_t len = kiln_tensor_i64(L, b);
        if (len < 0 || len > T)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "sequence_lens[%lld] = %lld is outside [0, %lld]",
                                   (long long)b, (long long)len, (long long)T);
    }

    kiln_tensor *Y = ctx->n_out > 0 ? ctx->out[0] : NULL;
    kiln_tensor *YH = ctx->n_out > 1 ? ctx->out[1] : NULL;
    kiln_tensor *YC = kind == KIND_LSTM && ctx->n_out > 2 ? ctx->out[2] : NULL;

    st = KILN_OK;
    double *x = NULL, *w = NULL, *r = NULL, *bias = NULL, *p = NULL, *h = NULL, *cs = NULL;
    double *scratch = NULL, *h_new, *c_new, *gates;
    if (!(x = to_doubles(X, &st)) || !(w = to_doubles(W, &st)) || !(r = to_doubles(R, &st)))
        goto out_free;
    if (B && !(bias = to_doubles(B, &st))) goto out_free;
    if (P && !(p = to_doubles(P, &st))) goto out_free;
    if (!B) bias = calloc((size_t)(ND * 2 * G * H), sizeof *bias); /* absent B: zero biases */
    /* state h and c [batch, H]; the new state and the gates of one step */
    h = calloc((size_t)(NB * H + 1), sizeof *h);
    cs = calloc((size_t)(NB * H + 1), sizeof *cs);
    scratch = calloc((size_t)(2 * H + G * H), sizeof *scratch);
    if (!bias || !h || !cs || !scratch) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory for RNN state");
        goto out_free;
    }
    h_new = scratch;
    c_new = scratch + H;
    gates = scratch + 2 * H;

    for (int64_t d = 0; d < ND; d++) {
        bool reverse = c.reverse_only || d == 1;
        const double *wd = w + d * G * H * I, *rd = r + d * G * H * H;
        const double *wbd = bias + d * 2 * G * H, *rbd = wbd + G * H;
        const double *pd = p ? p + d * 3 * H : NULL;

        /* initial state */
        for (int64_t b = 0; b < NB; b++)
            for (int64_t j = 0; j < H; j++) {
                int64_t hi = c.layout ? (b * ND + d) * H + j : (d * NB + b) * H + j;
                h[b * H + j] = H0 ? kiln_get_f64(H0->dtype, H0->data, hi) : 0;
                cs[b * H + j] = C0 ? kiln_get_f64(C0->dtype, C0->data, hi) : 0;
            }

        for (int64_t s = 0; s < T; s++) {
            int64_t t = reverse ? T - 1 - s : s;
            for (int64_t b = 0; b < NB; b++) {
                int64_t len = L ? kiln_tensor_i64(L, b) : T;
                double *hb = h + b * H, *cb = cs + b * H;
                if (t < len) {
                    const double *xt = x + (c.layout ? (b * T + t) * I : (t * NB + b) * I);
                    rnn_cell(&c, c.acts[d], xt, hb, cb, wd, rd, wbd, rbd, pd, gates, h_new,
                             c_new);
                    memcpy(hb, h_new, (size_t)H * sizeof *hb);
                    if (kind == KIND_LSTM) memcpy(cb, c_new, (size_t)H * sizeof *cb);
                }
                if (Y) {
                    int64_t yi =
                        c.layout ? ((b * T + t) * ND + d) * H : ((t * ND + d) * NB + b) * H;
                    for (int64_t j = 0; j < H; j++)
                        kiln_set_f64(Y->dtype, Y->data, yi + j, t < len ? hb[j] : 0.0);
                }
            }
        }

        for (int64_t b = 0; b < NB; b++) {
            int64_t oi = c.layout ? (b * ND + d) * H : (d * NB + b) * H;
            for (int64_t j = 0; j < H; j++) {
                if (YH) kiln_set_f64(YH->dtype, YH->data, oi + j, h[b * H + j]);
                if (YC) kiln_set_f64(YC->dtype, YC->data, oi + j, cs[b * H + j]);
            }
        }
    }

out_free:
    free(x);
    free(w);
    free(r);
    free(bias);
    free(p);
    free(h);
    free(cs);
    free(scratch);
    return st;
}

/* Entry points of the three ops. */
static kiln_status rnn_infer_rnn(struct kiln_infer_ctx *ctx) { return rnn_infer(ctx, KIND_RNN); }
static kiln_status rnn_infer_gru(struct kiln_infer_ctx *ctx) { return rnn_infer(ctx, KIND_GRU); }
static kiln_status rnn_infer_lstm(struct kiln_infer_ctx *ctx) { return rnn_infer(ctx, KIND_LSTM); }
static kiln_status rnn_run_rnn(struct kiln_run_ctx *ctx) { return rnn_run(ctx, KIND_RNN); }
static kiln_status rnn_run_gru(struct kiln_run_ctx *ctx) { return rnn_run(ctx, KIND_GRU); }
static kiln_status rnn_run_lstm(struct kiln_run_ctx *ctx) { return rnn_run(ctx, KIND_LSTM); }

KILN_REF_OP(RNN, rnn_infer_rnn, rnn_run_rnn);
KILN_REF_OP(GRU, rnn_infer_gru, rnn_run_gru);
KILN_REF_OP(LSTM, rnn_infer_lstm, rnn_run_lstm);
