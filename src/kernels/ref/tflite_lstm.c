/*
 * tflite_lstm.c - TFLite's hybrid LSTM (float activations, int8 weights),
 * the Tfl op TflLstmHybrid created by the TFLite importer for LSTM and
 * UNIDIRECTIONAL_SEQUENCE_LSTM whose weights are int8 and whose input is
 * float32. It computes what lstm_eval.cc's EvalHybrid / LstmStepHybrid and
 * the portable tensor_utils compute, in the same order and precision:
 *
 *   - before each step, every batch row of the input and of the output
 *     state h is quantized to int8 on its own (BatchQuantizeFloats):
 *     symmetric (asymmetric=0): scale = max|v| / 127, q = round(v * 127 /
 *     max|v|) clamped to +-127; asymmetric: TFLite's nudged zero point from
 *     the row's [min(0, v), max(0, v)] in double, q = round(zp + v / scale)
 *     in float, clamped to [-128, 127]. A row that is all zeros is skipped
 *     (TFLite's IsZeroVector: its products contribute nothing);
 *   - each gate starts from its bias (0 with layer norm) and accumulates
 *     float(int32 dot(w_row, q) - row_sum(w) * zp) * (row_scale * w_scale)
 *     for the input and the recurrent weights, then the peephole
 *     (int8 weight * its scale, in float) times the cell state, layer norm
 *     ((z - mean) / sqrt(var + 1e-8) * coefficient + bias, float sums in
 *     order), and sigmoid 1 / (1 + exp(-z)) or the fused activation;
 *   - gates i, f, g; c = f * c + g * i (CIFG: g * (1 - f)), clipped to
 *     +-cell_clip; gate o (its peephole reads the new c); h = o * act(c),
 *     projected by the int8 projection (h quantized per row like the input)
 *     onto the projection bias and clipped to +-proj_clip.
 *
 * Inputs are TFLite's, by index: 0 x (float32 [batch, in], or [time, batch,
 * in] / [batch, time, in]), 1-4 input weights (int8 [cell, in]; 1 absent for
 * CIFG), 5-8 recurrent weights (int8 [cell, out]), 9-11 peepholes (int8
 * [cell]), 12-15 gate biases (float32 [cell]), 16 projection (int8 [out,
 * cell]), 17 projection bias (float32 [out]), 18-19 absent (the state
 * starts at zero on every run), 20-23 layer norm coefficients (float32
 * [cell]). Attributes: scales (24 floats: the scale of each int8 input, by
 * index), act (TFLite ActivationFunctionType: 1 RELU, 2 RELU_N1_TO_1,
 * 3 RELU6, 4 TANH), cell_clip, proj_clip, asymmetric, sequence (x has a time
 * axis), time_major. The importer checks shapes, types and scales; the
 * kernel checks again what it indexes with.
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/kernel.h"

enum { H_X = 0, H_WI = 1, H_WR = 5, H_P = 9, H_B = 12, H_PROJ = 16, H_PROJB = 17, H_LN = 20 };

static float h_act(int act, float v)
{
    switch (act) {
    case 1: return v > 0.0f ? v : 0.0f;
    case 2: return v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
    case 3: return v < 0.0f ? 0.0f : v > 6.0f ? 6.0f : v;
    case 4: return tanhf(v);
    default: return 1.0f / (1.0f + expf(-v)); /* 6: SIGMOID, the gates' own */
    }
}

/* One row of n floats quantized the TFLite way; *zero when all are 0. */
static void h_quantize(const float *v, int64_t n, bool asym, int8_t *q, float *sf, int32_t *zp,
                       bool *zero)
{
    float lo = v[0], hi = v[0];
    *zero = true;
    for (int64_t i = 0; i < n; i++) {
        if (v[i] != 0.0f) *zero = false;
        if (v[i] < lo) lo = v[i];
        if (v[i] > hi) hi = v[i];
    }
    *zp = 0;
    *sf = 1.0f;
    if (*zero) return;
    if (!asym) { /* SymmetricQuantizeFloats */
        float range = fmaxf(fabsf(lo), fabsf(hi));
        *sf = range / 127.0f;
        float inv = 127.0f / range;
        for (int64_t i = 0; i < n; i++) {
            float r = roundf(v[i] * inv);
            int32_t x = r != r ? 0 : r > 127.0f ? 127 : r < -127.0f ? -127 : (int32_t)r; /* NaN: 0 */
            q[i] = (int8_t)x;
        }
        return;
    }
    /* AsymmetricQuantizeFloats */
    double rmin = fmin(0.0, (double)lo), rmax = fmax(0.0, (double)hi);
    double scale = (rmax - rmin) / 255.0;
    double zmin = -128.0 - rmin / scale, zmax = 127.0 - rmax / scale;
    double emin = 128.0 + fabs(rmin / scale), emax = 127.0 + fabs(rmax / scale);
    double z = emin < emax ? zmin : zmax;
    int32_t nz = z != z ? 0 : z <= -128.0 ? -128 : z >= 127.0 ? 127 : (int32_t)round(z);
    *sf = (float)scale;
    *zp = nz;
    float inv = (float)(1.0 / (double)*sf);
    for (int64_t i = 0; i < n; i++) {
        float r = roundf((float)nz + v[i] * inv);
        int32_t x = r != r ? 0 : r > 127.0f ? 127 : r < -128.0f ? -128 : (int32_t)r;
        q[i] = (int8_t)x;
    }
}

/* out[r] += float(dot(w[r], q) - row_sum[r] * zp) * (sf * wscale), r < rows. */
static void h_matvec(const int8_t *w, int64_t rows, int64_t cols, const int8_t *q, float sf,
                     int32_t zp, float wscale, float *out)
{
    float scale = sf * wscale;
    for (int64_t r = 0; r < rows; r++) {
        const int8_t *row = w + r * cols;
        uint32_t acc = 0, rs = 0; /* TFLite's int32 sums (wrapping here, never UB) */
        for (int64_t c = 0; c < cols; c++) {
            acc += (uint32_t)((int32_t)row[c] * (int32_t)q[c]);
            rs += (uint32_t)(int32_t)row[c];
        }
        int32_t dot = (int32_t)acc, sum = (int32_t)rs;
        if (zp != 0) { /* TFLite: dotprod -= row_sums[row] * (float)offset, in float */
            float d = (float)dot - (float)sum * (float)zp;
            dot = d >= 2147483520.0f ? INT32_MAX : d <= -2147483648.0f ? INT32_MIN : (int32_t)d;
        }
        out[r] += (float)dot * scale;
    }
}

static kiln_status hyb_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_type *x = ctx->in[H_X];
    const struct kiln_type *ro = ctx->n_in > H_WR + 3 ? ctx->in[H_WR + 3] : NULL;
    const struct kiln_type *pj = ctx->n_in > H_PROJ ? ctx->in[H_PROJ] : NULL;
    bool seq = kiln_attr_int(n, "sequence", 0) != 0;
    bool tm = kiln_attr_int(n, "time_major", 0) != 0;
    if (ctx->n_in != 24 || !ro || ro->rank != 2 || (pj && pj->rank != 2) ||
        (x->dtype != KILN_DTYPE_UNDEFINED && x->dtype != KILN_DTYPE_F32) ||
        (x->rank >= 0 && x->rank != (seq ? 3 : 2)))
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "a float32 input of rank %d and 24 "
                               "LSTM inputs with 2-D recurrent weights expected", seq ? 3 : 2);
    if (!ctx->out[0]) return KILN_OK;
    struct kiln_type *o = ctx->out[0];
    kiln_type_unknown(o);
    o->dtype = KILN_DTYPE_F32;
    o->rank = seq ? 3 : 2;
    for (int i = 0; i < o->rank - 1; i++) {
        o->dims[i] = x->rank == o->rank ? x->dims[i] : -1;
        o->sym[i] = x->rank == o->rank ? x->sym[i] : NULL;
    }
    o->dims[o->rank - 1] = pj ? pj->dims[0] : ro->dims[1];
    (void)tm;
    return KILN_OK;
}

/* Checks a present input k: dtype and element count. */
static bool h_ok(kiln_tensor *const *in, int k, kiln_dtype dt, int64_t count)
{
    return !in[k] || (in[k]->dtype == dt && kiln_tensor_count(in[k]) == count);
}

static kiln_status hyb_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    kiln_tensor *const *in = ctx->in;
    const float *scales;
    int n_sc = kiln_attr_floats(n, "scales", &scales);
    int act = (int)kiln_attr_int(n, "act", 4);
    float cell_clip = kiln_attr_float(n, "cell_clip", 0.0f);
    float proj_clip = kiln_attr_float(n, "proj_clip", 0.0f);
    bool asym = kiln_attr_int(n, "asymmetric", 0) != 0;
    bool seq = kiln_attr_int(n, "sequence", 0) != 0;
    bool tm = kiln_attr_int(n, "time_major", 0) != 0;
    const kiln_tensor *x = in[H_X];
    if (ctx->n_in != 24 || n_sc != 24 || !in[H_WI + 1] || !in[H_WR + 3] || !in[H_B + 1] ||
        x->dtype != KILN_DTYPE_F32 || x->rank != (seq ? 3 : 2) || act < 1 || act > 4 ||
        in[H_WI + 1]->rank != 2 || in[H_WR + 3]->rank != 2)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "operands or parameters do not fit");
    int64_t C = in[H_WI + 1]->dims[0], I = in[H_WI + 1]->dims[1], O = in[H_WR + 3]->dims[1];
    int64_t T = seq ? x->dims[tm ? 0 : 1] : 1, B = seq ? x->dims[tm ? 1 : 0] : x->dims[0];
    bool cifg = !in[H_WI], peep = in[H_P + 2] != NULL, ln = in[H_LN + 1] != NULL;
    bool proj = in[H_PROJ] != NULL;
    bool fit = x->dims[x->rank - 1] == I && I > 0 && C > 0 && O > 0 && (proj || O == C);
    for (int g = cifg ? 1 : 0; g < 4 && fit; g++) {
        fit = h_ok(in, H_WI + g, KILN_DTYPE_I8, C * I) && in[H_WI + g] &&
              h_ok(in, H_WR + g, KILN_DTYPE_I8, C * O) && in[H_WR + g] &&
              h_ok(in, H_B + g, KILN_DTYPE_F32, C) && in[H_B + g] &&
              h_ok(in, H_LN + g, KILN_DTYPE_F32, C) && (!ln || in[H_LN + g]);
        if (fit && g != 2)
            fit = h_ok(in, H_P + (g == 3 ? 2 : g), KILN_DTYPE_I8, C) &&
                  (!peep || in[H_P + (g == 3 ? 2 : g)]);
    }
    fit = fit && h_ok(in, H_PROJ, KILN_DTYPE_I8, O * C) && h_ok(in, H_PROJB, KILN_DTYPE_F32, O) &&
          (proj || !in[H_PROJB]) && kiln_tensor_count(ctx->out[0]) == T * B * O;
    if (!fit)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "LSTM operands of %lld cells, %lld "
                               "inputs and %lld outputs do not fit", (long long)C, (long long)I,
                               (long long)O);
    if (B == 0 || T == 0) return KILN_OK;
    int64_t K = I > O ? I : O;
    K = K > C ? K : C;
    const int64_t lim = (int64_t)1 << 36; /* scratch sizes below cannot overflow */
    if (B < 1 || T < 0 || K > lim / B || C > lim / B || I > lim / C || O > lim / C)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "LSTM of batch %lld, %lld cells, %lld "
                               "inputs and %lld outputs is too large", (long long)B,
                               (long long)C, (long long)I, (long long)O);
    /* gates 4 x [B, C], c [B, C], h [B, O], s [B, C], peephole weights 3 x [C];
     * quantized rows [B, K] for x and h, plus per-row scale, zero point, zero flags */
    size_t nf = (size_t)(4 * B * C + B * C + B * O + B * C + 3 * C + 2 * B);
    float *fb = calloc(nf, sizeof(float));
    int8_t *qx = malloc((size_t)(2 * B * K + 1));
    int32_t *zp = malloc(sizeof(int32_t) * (size_t)(2 * B));
    bool *zero = malloc(sizeof(bool) * (size_t)(2 * B));
    if (!fb || !qx || !zp || !zero) {
        free(fb), free(qx), free(zp), free(zero);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    float *gate[4], *c = fb + 4 * B * C, *h = c + B * C, *s = h + B * O, *pw = s + B * C;
    float *sf = pw + 3 * C;
    int8_t *qh = qx + B * K;
    for (int g = 0; g < 4; g++) gate[g] = fb + g * B * C;
    for (int j = 0; j < 3 && peep; j++) /* VectorScalarMultiply: the recovered weights */
        if (in[H_P + j] && !(cifg && j == 0)) /* CIFG: no input gate, input 9 unchecked */
            for (int64_t k = 0; k < C; k++)
                pw[j * C + k] = scales[H_P + j] * (float)((const int8_t *)in[H_P + j]->data)[k];
    const float *xd = x->data;
    float *yd = ctx->out[0]->data;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t b = 0; b < B; b++) {
            /* row b of x at step t */
            int64_t xo = !seq ? b * I : tm ? (t * B + b) * I : (b * T + t) * I;
            h_quantize(xd + xo, I, asym, qx + b * K, &sf[b], &zp[b], &zero[b]);
            h_quantize(h + b * O, O, asym, qh + b * K, &sf[B + b], &zp[B + b], &zero[B + b]);
        }
        for (int g = cifg ? 1 : 0; g < 4; g++) { /* i, f, g; o after the cell update */
            if (g == 3) { /* UpdateLstmCellFloat */
                for (int64_t k = 0; k < B * C; k++) {
                    c[k] = gate[1][k] * c[k];
                    float ig = cifg ? 1.0f - gate[1][k] : gate[0][k];
                    c[k] += gate[2][k] * ig;
                    if (cell_clip > 0.0f) c[k] = fmaxf(-cell_clip, fminf(cell_clip, c[k]));
                }
            }
            const float *bias = in[H_B + g]->data;
            const int8_t *wi = in[H_WI + g]->data, *wr = in[H_WR + g]->data;
            for (int64_t b = 0; b < B; b++) {
                float *z = gate[g] + b * C;
                for (int64_t k = 0; k < C; k++) z[k] = ln ? 0.0f : bias[k];
                if (!zero[b]) h_matvec(wi, C, I, qx + b * K, sf[b], asym ? zp[b] : 0,
                                       scales[H_WI + g], z);
                if (!zero[B + b]) h_matvec(wr, C, O, qh + b * K, sf[B + b],
                                           asym ? zp[B + b] : 0, scales[H_WR + g], z);
                if (peep && g != 2) {
                    const float *p = pw + (g == 3 ? 2 : g) * C;
                    for (int64_t k = 0; k < C; k++) z[k] += p[k] * c[b * C + k];
                }
                if (ln) { /* MeanStddevNormalization, coefficients, bias */
                    const float *coef = in[H_LN + g]->data;
                    float sum = 0.0f, sq = 0.0f;
                    for (int64_t k = 0; k < C; k++) sum += z[k];
                    float mean = sum / (float)C;
                    for (int64_t k = 0; k < C; k++) {
                        float d = z[k] - mean;
                        sq += d * d;
                    }
                    float var = sq / (float)C;
                    float inv = 1.0f / sqrtf(var + 1e-8f);
                    for (int64_t k = 0; k < C; k++) z[k] = (z[k] - mean) * inv;
                    for (int64_t k = 0; k < C; k++) z[k] = coef[k] * z[k];
                    for (int64_t k = 0; k < C; k++) z[k] += bias[k];
                }
                for (int64_t k = 0; k < C; k++) z[k] = h_act(g == 2 ? act : 6, z[k]);
            }
        }
        /* CalculateLstmOutputHybrid */
        for (int64_t k = 0; k < B * C; k++) s[k] = gate[3][k] * h_act(act, c[k]);
        for (int64_t b = 0; b < B; b++) {
            float *hb = h + b * O;
            if (!proj) {
                memcpy(hb, s + b * C, sizeof(float) * (size_t)O);
            } else {
                const float *pb = in[H_PROJB] ? in[H_PROJB]->data : NULL;
                for (int64_t k = 0; k < O; k++) hb[k] = pb ? pb[k] : 0.0f;
                float psf;
                int32_t pzp;
                bool pz;
                h_quantize(s + b * C, C, asym, qh + b * K, &psf, &pzp, &pz);
                if (!pz) h_matvec(in[H_PROJ]->data, O, C, qh + b * K, psf, asym ? pzp : 0,
                                  scales[H_PROJ], hb);
                if (proj_clip > 0.0f)
                    for (int64_t k = 0; k < O; k++) hb[k] = fmaxf(-proj_clip, fminf(proj_clip, hb[k]));
            }
            int64_t yo = !seq ? b * O : tm ? (t * B + b) * O : (b * T + t) * O;
            memcpy(yd + yo, hb, sizeof(float) * (size_t)O);
        }
    }
    free(fb), free(qx), free(zp), free(zero);
    return KILN_OK;
}
KILN_REF_OP(TflLstmHybrid, hyb_infer, hyb_run);
