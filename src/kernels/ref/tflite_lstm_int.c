/*
 * tflite_lstm_int.c - TFLite's fully integer LSTM ("8x8_16": int8 input,
 * weights and output state, int16 gates and cell state), the Tfl op
 * TflLstmInt created by the TFLite importer for LSTM and
 * UNIDIRECTIONAL_SEQUENCE_LSTM whose input is int8. It computes what
 * lstm_eval.cc's EvalInteger8x8_16 / LstmStepInteger8x8_16 compute with the
 * portable tensor_utils and gemmlowp's fixed point, rounding for rounding:
 *
 *   - each gate g starts at 0 (int16) and accumulates, saturating to int16
 *     after each term, MultiplyByQuantizedMultiplier(bias' + x . W_g) and
 *     MultiplyByQuantizedMultiplier(bias'' + h . R_g), int32 sums, where
 *     bias' folds -input_zp * row_sum(W_g) into the gate bias (no gate bias
 *     with layer norm) and bias'' folds -state_zp * row_sum(R_g); then the
 *     peephole MultiplyByQuantizedMultiplier(p_g * c) (i, f read the
 *     previous c, o the new one); then the integer layer norm (mean and
 *     variance in int64 with a 2^10 factor, gemmlowp's inverse square root,
 *     coefficient and gate bias, rounding /1024, the coefficient scale); then
 *     gemmlowp's int16 logistic (Q3.12 in, Q0.15 out) or, for the cell gate,
 *     tanh of Q3.12;
 *   - c = rdbpot(f * c, 15) + rdbpot(i * g, 30 + cell_scale) (CIFG: i =
 *     32767 - f), saturated, clipped to +-cell_clip;
 *   - hidden = clamp8(MultiplyByQuantizedMultiplier(o * tanh(c), hidden
 *     scale) - hidden_zp), tanh of c with 15 + cell_scale integer bits; the
 *     output state is hidden, or clamp8(MultiplyByQuantizedMultiplier(
 *     proj_bias + hidden_zp * row_sum(P) + hidden . P) + state_zp) clipped to
 *     +-proj_clip.
 *
 * Batch rows are independent; the output state starts at its zero point
 * and the cell state at 0 (TFLite's reset variable tensors), on every run.
 * Inputs are TFLite's, by index (see tflite_lstm.c); the parameters are
 * the "params" attribute (tflite_lstm.h), prepared by the importer exactly
 * as lstm.cc's PopulateQuantizedLstmParams8x8_16 prepares them. The int32
 * sums wrap where TFLite's would overflow (never undefined behaviour here).
 */
#include <stdlib.h>

#include "kernels/kernel.h"
#include "kernels/ref/tflite_lstm.h"
#include "kernels/ref/tflite_q.h"

enum { I_X = 0, I_W = 1, I_R = 5, I_P = 9, I_B = 12, I_PROJ = 16, I_PROJB = 17, I_LN = 20 };

static int32_t wadd(int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }
static int32_t wsub(int32_t a, int32_t b) { return (int32_t)((uint32_t)a - (uint32_t)b); }
static int32_t wmul(int32_t a, int32_t b) { return (int32_t)((uint32_t)a * (uint32_t)b); }
static int16_t w16(int32_t v) { return (int16_t)(uint16_t)(uint32_t)v; }
static int16_t sat16(int32_t v) { return (int16_t)(v > 32767 ? 32767 : v < -32768 ? -32768 : v); }
static int8_t sat8(int32_t v) { return (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v); }

/* ---- gemmlowp fixed point on int16 (FixedPoint<int16_t, IntegerBits>) ----
 * Additions and negations wrap as int16 arithmetic does in C++. */

static int16_t g_mul(int16_t a, int16_t b) /* SaturatingRoundingDoublingHighMul */
{
    if (a == INT16_MIN && b == INT16_MIN) return INT16_MAX;
    int32_t ab = (int32_t)a * (int32_t)b;
    int32_t nudge = ab >= 0 ? (1 << 14) : (1 - (1 << 14));
    return (int16_t)((ab + nudge) / (1 << 15));
}
static int16_t g_rdiv(int16_t x, int e) /* RoundingDivideByPOT, 0 <= e < 15 */
{
    int16_t mask = (int16_t)((1 << e) - 1);
    int16_t rem = (int16_t)(x & mask);
    int16_t thr = (int16_t)((mask >> 1) + (x < 0 ? 1 : 0));
    return (int16_t)((x >> e) + (rem > thr ? 1 : 0));
}
static int16_t g_shl(int16_t x, int e) /* SaturatingRoundingMultiplyByPOT<e>, 0 < e < 15 */
{
    int32_t thr = (1 << (15 - e)) - 1;
    return x > thr ? INT16_MAX : x < -thr ? INT16_MIN : (int16_t)(x * (1 << e));
}
/* A 32-bit fixed-point constant in 16 bits (RescaleConstantInitializer). */
static int16_t g_const(int32_t v) { return (int16_t)tfl_rdbpot(v, 16); }

/* exp(a) for a in [-1/4, 0), Q0.15 in and out. */
static int16_t g_exp_interval(int16_t a)
{
    const int16_t ct = g_const(1895147668), third = g_const(715827883);
    int16_t x = w16(a + (1 << 12)); /* a + 1/8 */
    int16_t x2 = g_mul(x, x), x3 = g_mul(x2, x), x4 = g_mul(x2, x2);
    int16_t poly = g_rdiv(w16(g_mul(w16(g_rdiv(x4, 2) + x3), third) + x2), 1);
    return sat16(ct + g_mul(ct, w16(x + poly))); /* AddSaturatingIf16Bit */
}

/* exp(a) for a <= 0 with ib integer bits (1 .. 7); Q0.15 out. */
static int16_t g_exp_neg(int16_t a, int ib)
{
    static const int32_t mult[7] = {1672461947, 1302514674, 790015084, 290630308,
                                    39332535,   720401,     242};
    int frac = 15 - ib;
    int16_t quarter = (int16_t)(1 << (frac - 2)), mask = (int16_t)(quarter - 1);
    int16_t amod = w16((a & mask) - quarter);
    int16_t r = g_exp_interval(g_shl(amod, ib));
    int16_t rem = w16(amod - a);
    for (int e = -2; e <= 4; e++)
        if (ib > e && (rem & (int16_t)(1 << (frac + e)))) r = g_mul(r, g_const(mult[e + 2]));
    if (ib > 5 && a < g_const(-(1 << (36 - ib)))) r = 0; /* below -32 */
    return a == 0 ? INT16_MAX : r;
}

/* The Newton-Raphson iterations of 1 / (1 + a) and (1 - a) / (1 + a), a in
 * [0, 1) Q0.15, the result in Q2.13. */
static int16_t g_recip_x(int16_t a)
{
    int32_t sum = (int32_t)a + INT16_MAX;
    int16_t hd = (int16_t)((sum + (sum >= 0 ? 1 : -1)) / 2); /* RoundingHalfSum */
    int16_t x = w16(g_const(1515870810) + g_mul(hd, g_const(-1010580540)));
    for (int i = 0; i < 3; i++) {
        int16_t one_minus = w16((1 << 13) - g_mul(hd, x));
        x = w16(x + g_shl(g_mul(x, one_minus), 2));
    }
    return x;
}

static int16_t g_logistic(int16_t a, int ib)
{
    if (a == 0) return g_const(1 << 30);
    int16_t abs_a = a > 0 ? a : w16(-a);
    int16_t pos = g_shl(g_recip_x(g_exp_neg(w16(-abs_a), ib)), 1);
    return a > 0 ? pos : w16(INT16_MAX - pos);
}

static int16_t g_tanh(int16_t a, int ib)
{
    if (a == 0) return 0;
    int16_t n = a < 0 ? a : w16(-a);
    int16_t t = g_shl(w16(g_recip_x(g_exp_neg(n, ib + 1)) - (1 << 13)), 2);
    return a < 0 ? w16(-t) : t;
}

/* ---- TFLite's GetInvSqrtQuantizedMultiplierExp (reverse_shift -1), int32 ---- */
static void inv_sqrt(int32_t input, int32_t *mult, int *shift)
{
    if (input <= 1) {
        *mult = INT32_MAX;
        *shift = 0;
        return;
    }
    int s = 11;
    while (input >= (1 << 29)) {
        input /= 4;
        s++;
    }
    int pairs = (__builtin_clz((uint32_t)input) - 1) / 2 - 1;
    s -= pairs;
    input = (int32_t)((uint32_t)input << (2 * pairs));
    int32_t half_input = tfl_rdbpot(input >> 1, 1);   /* F3 */
    const int32_t half_three = (1 << 28) + (1 << 27); /* 1.5 in F3 */
    int32_t x = 1 << 28;                              /* 1 in F3 */
    for (int i = 0; i < 5; i++) {
        int32_t x3 = tfl_sat_shl(tfl_srdhm(tfl_srdhm(x, x), x), 6);
        x = tfl_sat_shl(wsub(tfl_srdhm(half_three, x), tfl_srdhm(half_input, x3)), 3);
    }
    x = tfl_srdhm(x, 1518500250); /* sqrt(2) / 2 */
    if (s < 0) {
        x = (int32_t)((uint32_t)x << -s);
        s = 0;
    }
    *mult = x;
    *shift = -s;
}

/* TFLite's integer ApplyLayerNorm over one row of n values, in place. */
static void layer_norm(int16_t *v, int64_t n, const int16_t *coef, const int32_t *bias,
                       int32_t m, int s, int32_t guard)
{
    int64_t sum = 0, sum_sq = 0;
    for (int64_t j = 0; j < n; j++) {
        sum += v[j];
        sum_sq += (int32_t)v[j] * v[j];
    }
    int32_t mean = (int32_t)(sum * 1024 / n);
    int32_t temp = (int32_t)((1 << 20) / n);
    int64_t variance = sum_sq * temp - (int64_t)mean * mean;
    int32_t var2 = (int32_t)(variance / (1 << 20));
    if (var2 < 1) var2 = guard;
    int32_t im;
    int is;
    inv_sqrt(var2, &im, &is);
    for (int64_t j = 0; j < n; j++) {
        int32_t shifted = 1024 * (int32_t)v[j] - mean;
        int32_t rescaled = tfl_mul_by_qm(shifted, im, is);
        int64_t v3 = wadd(wmul(rescaled, coef[j]), bias[j]); /* an int32 sum in TFLite */
        int32_t v4 = (int32_t)((v3 > 0 ? v3 + 512 : v3 - 512) / 1024);
        v[j] = sat16(tfl_mul_by_qm(v4, m, s + 12));
    }
}

/* out[r] = sat16(out[r] + MultiplyByQuantizedMultiplier(bias[r] + w[r] . v)), r < rows. */
static void matvec16(const int8_t *w, const int32_t *bias, int64_t rows, int64_t cols,
                     const int8_t *v, int32_t m, int s, int16_t *out)
{
    for (int64_t r = 0; r < rows; r++) {
        const int8_t *row = w + r * cols;
        int32_t acc = bias[r];
        for (int64_t c = 0; c < cols; c++) acc = wadd(acc, (int32_t)row[c] * v[c]);
        out[r] = sat16(wadd(tfl_mul_by_qm(acc, m, s), out[r]));
    }
}

/* bias (or 0) + zp * row_sum(w), TFLite's PrecomputeZeroPointTimesWeightWithBias. */
static void fold_bias(const int8_t *w, int64_t rows, int64_t cols, const int32_t *bias,
                      int32_t zp, int32_t *out)
{
    for (int64_t r = 0; r < rows; r++) {
        int32_t rs = 0;
        for (int64_t c = 0; c < cols; c++) rs = wadd(rs, w[r * cols + c]);
        out[r] = wadd(bias ? bias[r] : 0, zp ? wmul(rs, zp) : 0);
    }
}

static kiln_status lint_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_type *x = ctx->in[I_X];
    const struct kiln_type *ro = ctx->n_in > I_R + 3 ? ctx->in[I_R + 3] : NULL;
    const struct kiln_type *pj = ctx->n_in > I_PROJ ? ctx->in[I_PROJ] : NULL;
    bool seq = kiln_attr_int(n, "sequence", 0) != 0;
    if (ctx->n_in != 24 || !ro || ro->rank != 2 || (pj && pj->rank != 2) ||
        (x->dtype != KILN_DTYPE_UNDEFINED && x->dtype != KILN_DTYPE_I8) ||
        (x->rank >= 0 && x->rank != (seq ? 3 : 2)))
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "an int8 input of rank %d and 24 "
                               "LSTM inputs with 2-D recurrent weights expected", seq ? 3 : 2);
    if (!ctx->out[0]) return KILN_OK;
    struct kiln_type *o = ctx->out[0];
    kiln_type_unknown(o);
    o->dtype = KILN_DTYPE_I8;
    o->rank = seq ? 3 : 2;
    for (int i = 0; i < o->rank - 1; i++) {
        o->dims[i] = x->rank == o->rank ? x->dims[i] : -1;
        o->sym[i] = x->rank == o->rank ? x->sym[i] : NULL;
    }
    o->dims[o->rank - 1] = pj ? pj->dims[0] : ro->dims[1];
    return KILN_OK;
}

/* A present input k has dtype dt and count elements. */
static bool fits(kiln_tensor *const *in, int k, kiln_dtype dt, int64_t count)
{
    return !in[k] || (in[k]->dtype == dt && kiln_tensor_count(in[k]) == count);
}

static kiln_status lint_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    kiln_tensor *const *in = ctx->in;
    const int64_t *p;
    int n_p = kiln_attr_ints(n, "params", &p);
    bool seq = kiln_attr_int(n, "sequence", 0) != 0;
    bool tm = kiln_attr_int(n, "time_major", 0) != 0;
    const kiln_tensor *x = in[I_X];
    if (ctx->n_in != 24 || n_p != TLI_COUNT || !in[I_W + 1] || !in[I_R + 3] ||
        x->dtype != KILN_DTYPE_I8 || x->rank != (seq ? 3 : 2) || in[I_W + 1]->rank != 2 ||
        in[I_R + 3]->rank != 2)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "operands or parameters do not fit");
    int32_t q[TLI_COUNT];
    for (int i = 0; i < TLI_COUNT; i++) {
        bool shift = i < TLI_GUARD && (i & 1);
        int64_t lo = shift ? -31 : INT32_MIN, hi = shift ? 30 : INT32_MAX;
        if (p[i] < lo || p[i] > hi)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "parameter %d is %lld", i,
                                   (long long)p[i]);
        q[i] = (int32_t)p[i];
    }
    int cs = q[TLI_CELL_SCALE];
    if (cs < -15 || cs > -9 || q[TLI_LN + 1] > 18 || q[TLI_LN + 3] > 18 || q[TLI_LN + 5] > 18 ||
        q[TLI_LN + 7] > 18)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "cell scale 2^%d or a layer norm "
                               "shift out of range", cs);
    int64_t C = in[I_W + 1]->dims[0], I = in[I_W + 1]->dims[1], O = in[I_R + 3]->dims[1];
    int64_t T = seq ? x->dims[tm ? 0 : 1] : 1, B = seq ? x->dims[tm ? 1 : 0] : x->dims[0];
    bool cifg = !in[I_W], ln = in[I_LN + 1] != NULL, proj = in[I_PROJ] != NULL;
    bool fit = x->dims[x->rank - 1] == I && I > 0 && C > 0 && O > 0 && (proj || O == C) &&
               (!in[I_P + 2] || O == C);
    for (int g = cifg ? 1 : 0; g < 4 && fit; g++) {
        fit = in[I_W + g] && fits(in, I_W + g, KILN_DTYPE_I8, C * I) && in[I_R + g] &&
              fits(in, I_R + g, KILN_DTYPE_I8, C * O) && in[I_B + g] &&
              fits(in, I_B + g, KILN_DTYPE_I32, C) && (!ln || in[I_LN + g]) &&
              fits(in, I_LN + g, KILN_DTYPE_I16, C);
        if (fit && g != 2)
            fit = fits(in, I_P + (g == 3 ? 2 : g), KILN_DTYPE_I16, C) &&
                  (!in[I_P + 2] || in[I_P + (g == 3 ? 2 : g)]);
    }
    fit = fit && fits(in, I_PROJ, KILN_DTYPE_I8, O * C) && fits(in, I_PROJB, KILN_DTYPE_I32, O) &&
          (proj || !in[I_PROJB]) && kiln_tensor_count(ctx->out[0]) == T * B * O;
    if (!fit)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "LSTM operands of %lld cells, %lld "
                               "inputs and %lld outputs do not fit", (long long)C, (long long)I,
                               (long long)O);
    if (B == 0 || T == 0) return KILN_OK;
    const int64_t lim = (int64_t)1 << 36; /* scratch sizes below cannot overflow */
    if (B < 1 || T < 0 || C > lim / B || O > lim / B || I > lim / C || O > lim / C)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "LSTM of batch %lld, %lld cells, %lld "
                               "inputs and %lld outputs is too large", (long long)B,
                               (long long)C, (long long)I, (long long)O);
    /* folded biases: 4 input, 4 recurrent [C], projection [O]; gates 4 x [C],
     * tanh(c) [C], cell state [B, C]; hidden [C], output state [B, O] */
    int32_t *fb = malloc(sizeof(int32_t) * (size_t)(8 * C + O));
    int16_t *sb = calloc((size_t)(5 * C + B * C), sizeof(int16_t));
    int8_t *hb = malloc((size_t)(C + B * O));
    if (!fb || !sb || !hb) {
        free(fb), free(sb), free(hb);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    int32_t *bx = fb, *bh = fb + 4 * C, *bp = fb + 8 * C;
    int16_t *gate[4] = {sb, sb + C, sb + 2 * C, sb + 3 * C}, *tc = sb + 4 * C, *cell = sb + 5 * C;
    int8_t *hidden = hb, *state = hb + C;
    for (int g = cifg ? 1 : 0; g < 4; g++) {
        fold_bias(in[I_W + g]->data, C, I, ln ? NULL : in[I_B + g]->data,
                  wsub(0, q[TLI_INPUT_ZP]), bx + g * C);
        fold_bias(in[I_R + g]->data, C, O, NULL, wsub(0, q[TLI_STATE_ZP]), bh + g * C);
    }
    if (proj)
        fold_bias(in[I_PROJ]->data, O, C, in[I_PROJB] ? in[I_PROJB]->data : NULL,
                  q[TLI_HIDDEN_ZP], bp);
    memset(state, (int8_t)sat8(q[TLI_STATE_ZP]), (size_t)(B * O));
    const int8_t *xd = x->data;
    int8_t *yd = ctx->out[0]->data;
    int16_t cclip = (int16_t)q[TLI_CELL_CLIP];
    int8_t pclip = (int8_t)q[TLI_PROJ_CLIP];
    for (int64_t t = 0; t < T; t++) {
        for (int64_t b = 0; b < B; b++) {
            const int8_t *xr = xd + (!seq ? b * I : tm ? (t * B + b) * I : (b * T + t) * I);
            int8_t *h = state + b * O;
            int16_t *c = cell + b * C;
            for (int g = cifg ? 1 : 0; g < 4; g++) {
                if (g == 3) { /* UpdateLstmCellInteger, before the output gate */
                    for (int64_t k = 0; k < C; k++) {
                        int16_t fc = w16(tfl_rdbpot((int32_t)gate[1][k] * c[k], 15));
                        int16_t ig = cifg ? w16(32767 - gate[1][k]) : gate[0][k];
                        int16_t gi = w16(tfl_rdbpot((int32_t)ig * gate[2][k], 30 + cs));
                        int16_t v = sat16((int32_t)fc + gi);
                        if (cclip > 0) v = v > cclip ? cclip : v < -cclip ? (int16_t)-cclip : v;
                        c[k] = v;
                    }
                }
                int16_t *z = gate[g];
                memset(z, 0, sizeof(int16_t) * (size_t)C);
                matvec16(in[I_W + g]->data, bx + g * C, C, I, xr, q[TLI_X + 2 * g],
                         q[TLI_X + 2 * g + 1], z);
                matvec16(in[I_R + g]->data, bh + g * C, C, O, h, q[TLI_H + 2 * g],
                         q[TLI_H + 2 * g + 1], z);
                const kiln_tensor *pw = g == 2 ? NULL : in[I_P + (g == 3 ? 2 : g)];
                if (pw) {
                    const int16_t *pd = pw->data;
                    for (int64_t k = 0; k < C; k++)
                        z[k] = sat16(wadd(tfl_mul_by_qm((int32_t)pd[k] * c[k], q[TLI_C + 2 * g],
                                                        q[TLI_C + 2 * g + 1]), z[k]));
                }
                if (ln)
                    layer_norm(z, C, in[I_LN + g]->data, in[I_B + g]->data, q[TLI_LN + 2 * g],
                               q[TLI_LN + 2 * g + 1], q[TLI_GUARD + g]);
                for (int64_t k = 0; k < C; k++)
                    z[k] = g == 2 ? g_tanh(z[k], 3) : g_logistic(z[k], 3);
            }
            /* CalculateLstmOutputInteger8x8_16 */
            for (int64_t k = 0; k < C; k++) {
                tc[k] = g_tanh(c[k], 15 + cs);
                int32_t v = tfl_mul_by_qm((int32_t)gate[3][k] * tc[k], q[TLI_HIDDEN],
                                          q[TLI_HIDDEN + 1]);
                hidden[k] = sat8(wsub(v, q[TLI_HIDDEN_ZP]));
            }
            if (!proj) {
                memcpy(h, hidden, (size_t)O);
            } else {
                const int8_t *pw = in[I_PROJ]->data;
                for (int64_t j = 0; j < O; j++) {
                    int32_t acc = bp[j];
                    for (int64_t k = 0; k < C; k++)
                        acc = wadd(acc, (int32_t)pw[j * C + k] * hidden[k]);
                    int8_t v = sat8(wadd(tfl_mul_by_qm(acc, q[TLI_PROJ], q[TLI_PROJ + 1]),
                                         q[TLI_STATE_ZP]));
                    if (pclip > 0) v = v > pclip ? pclip : v < -pclip ? (int8_t)-pclip : v;
                    h[j] = v;
                }
            }
            int64_t yo = !seq ? b * O : tm ? (t * B + b) * O : (b * T + t) * O;
            memcpy(yd + yo, h, (size_t)O);
        }
    }
    free(fb), free(sb), free(hb);
    return KILN_OK;
}
KILN_REF_OP(TflLstmInt, lint_infer, lint_run);
