/*
 * tflite_q.c - reference kernels of the TFLite block of ops.def: quantized
 * convolution (plain and depthwise), fully connected, add, pooling, softmax
 * and (re)quantization, computed exactly as TFLite's reference kernels do.
 *
 * These ops are created only by the TFLite importer (tflite_lower.c), which
 * works out their integer parameters from the model's scales and zero
 * points the way TFLite's kernels prepare them (tflite_q.h). Tensors are
 * NHWC like TFLite's. The contracts (all attributes are required unless a
 * default is given):
 *
 *   TflQuantize(x) -> y of dtype `to` (int8, uint8, int16, or int32 from an
 *       integer x)
 *       float x:   y = clamp(round_half_away(x / scale) + zero_point)
 *       integer x: y = clamp(MultiplyByQuantizedMultiplier(x - in_zero_point,
 *                            multiplier, shift) + zero_point)
 *   TflConv(x, w, [bias]) NHWC; w is [Cout, KH, KW, Cin/groups] or, with
 *       depthwise=1, [1, KH, KW, Cin * multiplier]. strides [h, w],
 *       dilations [h, w], same (TFLite SAME padding, else VALID),
 *       input_offset, weights_offset, output_offset, multipliers and shifts
 *       (one, or one per output channel), act_min, act_max.
 *   TflFullyConnected(x, w [N, K], [bias]) -> [rows, N] (or x's leading dims
 *       with keep_num_dims=1); offsets, multipliers, shifts, act range as above.
 *   TflAdd(a, b) broadcast: TFLite's 8-bit add with left_shift and the three
 *       multiplier/shift pairs; act range. SUB is this op with a negated
 *       input2_multiplier, as TFLite's sub.cc prepares it.
 *   TflMul(a, b) broadcast: (a + input1_offset) * (b + input2_offset)
 *       rescaled by output_multiplier/output_shift, + output_offset; act range.
 *   TflLut(x) int8 or uint8: y = table[(uint8)x], `table` 256 values built
 *       by the importer the way TFLite's LUT kernels (LOGISTIC, TANH) do.
 *   TflPool(x) NHWC: kernel [h, w], strides, same, max (0: average with
 *       TFLite's rounding division), act_min, act_max.
 *   TflMean(x) -> mean over `axes` (keepdims): TFLite's QuantizedMeanOrSum, the
 *       int32 sum of the inputs less n * input_zero_point rescaled by
 *       multiplier/shift (input scale / output scale) with 1/n folded into
 *       the multiplier, + output_zero_point, clamped. No axes: a copy.
 *   TflAct16(x) int16 LOGISTIC (tanh=0) or TANH (tanh=1): TFLite's
 *       interpolation in its 256-entry sigmoid table after rescaling by
 *       input_multiplier / 2^input_left_shift (multiplier 0: a power-of-two
 *       scale, 3 << shift).
 *   TflSvdf(x int8, weights_feature int8 [F, I], weights_time int16 [F, M],
 *       [bias int32 [F / rank]]) -> int8 [B, F / rank]: TFLite's
 *       EvalIntegerSVDF on a reset (zero) int16 state: the newest state
 *       column is clamp16(MultiplyByQuantizedMultiplier(sum (x - input_zero_point)
 *       * w, multiplier1, shift1)); times weights_time[:, M - 1], summed over
 *       each unit's rank filters, + bias, rescaled by multiplier2/shift2,
 *       + output_zero_point, clamped.
 *   TflConv and TflFullyConnected with int16 input: int8 weights, int64 bias,
 *       an int64 accumulator and the 64-bit MultiplyByQuantizedMultiplier.
 *   TflSoftmax(x) along the last axis -> `to` (int8: zero point -128, or
 *       uint8: 0, scale 1/256; or int16: zero point -32768, scale 1/65536): gemmlowp's fixed-point exp and reciprocal
 *       with input_multiplier, input_left_shift and diff_min.
 */
#include "kernels/ref/tflite_q.h"

#include "kernels/kernel.h"

#include <stdlib.h>

static bool is_q(kiln_dtype dt)
{
    return dt == KILN_DTYPE_I8 || dt == KILN_DTYPE_U8 || dt == KILN_DTYPE_I16;
}

static int32_t qget(const kiln_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case KILN_DTYPE_I8: return ((const int8_t *)t->data)[i];
    case KILN_DTYPE_U8: return ((const uint8_t *)t->data)[i];
    case KILN_DTYPE_I16: return ((const int16_t *)t->data)[i];
    default: return ((const int32_t *)t->data)[i];
    }
}

static void qset(kiln_tensor *t, int64_t i, int32_t v)
{
    switch (t->dtype) {
    case KILN_DTYPE_I8: ((int8_t *)t->data)[i] = (int8_t)v; break;
    case KILN_DTYPE_U8: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
    case KILN_DTYPE_I16: ((int16_t *)t->data)[i] = (int16_t)v; break;
    default: ((int32_t *)t->data)[i] = v; break;
    }
}

static int32_t clamp32(int64_t v, int64_t lo, int64_t hi)
{
    return (int32_t)(v < lo ? lo : v > hi ? hi : v);
}

static kiln_status need_q_input(const struct kiln_node *n, const struct kiln_type *t,
                                const char *what)
{
    if (t && t->dtype != KILN_DTYPE_UNDEFINED && !is_q(t->dtype))
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "%s is %s, expected int8 or uint8",
                               what, kiln_dtype_name(t->dtype));
    return KILN_OK;
}

/* Output spatial size and leading pad of TFLite SAME / VALID padding. */
static void tfl_out_pad(int64_t in, int64_t k, int64_t stride, int64_t dil, bool same,
                        int64_t *out, int64_t *pad)
{
    int64_t eff = (k - 1) * dil + 1;
    *out = same ? (in + stride - 1) / stride : (in - eff + stride) / stride;
    if (*out < 0) *out = 0;
    int64_t total = (*out - 1) * stride + eff - in;
    *pad = total > 0 ? total / 2 : 0;
}

/* The two-element INTS attribute name (strides, dilations, kernel). */
static kiln_status pair(const struct kiln_node *n, const char *name, int64_t dflt, int64_t *v)
{
    const int64_t *p;
    int cnt = kiln_attr_ints(n, name, &p);
    if (cnt < 0 && dflt > 0) {
        v[0] = v[1] = dflt;
        return KILN_OK;
    }
    if (cnt != 2 || p[0] < 1 || p[1] < 1 || p[0] > (1 << 20) || p[1] > (1 << 20))
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "%s must be two positive values", name);
    v[0] = p[0];
    v[1] = p[1];
    return KILN_OK;
}

/* Per-channel (or single) multipliers and shifts; *cnt their count. The
 * 16x8 kernels (int64 accumulator) take shifts up to 7 only, as TFLite's own
 * MultiplyByQuantizedMultiplier for int64 does; the 8-bit ones up to 30. */
static kiln_status mults(const struct kiln_node *n, bool x16, const int64_t **m, const int64_t **s,
                         int *cnt)
{
    int max_shift = x16 ? 7 : 30;
    int a = kiln_attr_ints(n, "multipliers", m), b = kiln_attr_ints(n, "shifts", s);
    if (a < 1 || a != b)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "multipliers (%d) and shifts (%d) must "
                               "be given, as many of each", a, b);
    for (int i = 0; i < a; i++)
        if ((*m)[i] < 0 || (*m)[i] > INT32_MAX || (*s)[i] < -31 || (*s)[i] > max_shift)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "multiplier %lld with shift %lld "
                                   "is out of range (shift -31 to %d%s)", (long long)(*m)[i],
                                   (long long)(*s)[i], max_shift,
                                   x16 ? " for 16-bit activations" : "");
    *cnt = a;
    return KILN_OK;
}

/* Zero-point offsets are within 16 bits (so products fit in 64 bits). */
static kiln_status offsets_ok(const struct kiln_node *n, int64_t a, int64_t b, int64_t c)
{
    if (a < -65536 || a > 65536 || b < -65536 || b > 65536 || c < -65536 || c > 65536)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "offsets %lld, %lld, %lld are out of "
                               "range", (long long)a, (long long)b, (long long)c);
    return KILN_OK;
}

/* ---- TflQuantize ---- */

static kiln_dtype to_dtype(const struct kiln_node *n)
{
    int64_t to = kiln_attr_int(n, "to", 0);
    return to == KILN_DTYPE_I8 || to == KILN_DTYPE_U8 || to == KILN_DTYPE_I16 ||
                   to == KILN_DTYPE_I32
               ? (kiln_dtype)to
               : KILN_DTYPE_UNDEFINED;
}

static kiln_status quantize_infer(struct kiln_infer_ctx *ctx)
{
    kiln_dtype to = to_dtype(ctx->node);
    if (to == KILN_DTYPE_UNDEFINED)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "'to' must be int8, uint8, "
                               "int16 or int32");
    if (!ctx->out[0]) return KILN_OK;
    *ctx->out[0] = *ctx->in[0];
    ctx->out[0]->dtype = to;
    return KILN_OK;
}

static void qrange(kiln_dtype dt, int32_t *lo, int32_t *hi)
{
    *lo = dt == KILN_DTYPE_I8 ? -128 : dt == KILN_DTYPE_U8 ? 0 : dt == KILN_DTYPE_I32 ? INT32_MIN : -32768;
    *hi = dt == KILN_DTYPE_I8 ? 127 : dt == KILN_DTYPE_U8 ? 255 : dt == KILN_DTYPE_I32 ? INT32_MAX : 32767;
}

static kiln_status quantize_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    int32_t lo, hi;
    qrange(y->dtype, &lo, &hi);
    int64_t zp = kiln_attr_int(ctx->node, "zero_point", 0), n = kiln_tensor_count(x);
    if (x->dtype == KILN_DTYPE_F32) {
        float scale = kiln_attr_float(ctx->node, "scale", 0.0f);
        if (!(scale > 0))
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "scale %g", (double)scale);
        for (int64_t i = 0; i < n; i++) {
            float r = roundf(((const float *)x->data)[i] / scale);
            double v = r != r ? 0.0 : (double)r + (double)zp; /* NaN quantizes to the zero point */
            qset(y, i, v < lo ? lo : v > hi ? hi : (int32_t)v);
        }
        return KILN_OK;
    }
    if (!is_q(x->dtype))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "input is %s",
                               kiln_dtype_name(x->dtype));
    int64_t izp = kiln_attr_int(ctx->node, "in_zero_point", 0);
    int64_t m = kiln_attr_int(ctx->node, "multiplier", 0), s = kiln_attr_int(ctx->node, "shift", 0);
    if (m < 0 || m > INT32_MAX || s < -31 || s > 30 || izp < -65536 || izp > 65536 ||
        zp < -65536 || zp > 65536)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "multiplier %lld shift %lld "
                               "zero points %lld, %lld", (long long)m, (long long)s,
                               (long long)izp, (long long)zp);
    for (int64_t i = 0; i < n; i++) {
        int32_t v = tfl_mul_by_qm((int32_t)(qget(x, i) - izp), (int32_t)m, (int)s);
        qset(y, i, clamp32((int64_t)v + zp, lo, hi));
    }
    return KILN_OK;
}
KILN_REF_OP(TflQuantize, quantize_infer, quantize_run);

/* ---- TflConv ---- */

static kiln_status conv_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_type *x = ctx->in[0], *w = ctx->in[1];
    kiln_status st = need_q_input(n, x, "input");
    if (st != KILN_OK) return st;
    int64_t s[2] = {0, 0}, d[2] = {0, 0};
    if ((st = pair(n, "strides", 1, s)) != KILN_OK || (st = pair(n, "dilations", 1, d)) != KILN_OK)
        return st;
    if ((x->rank >= 0 && x->rank != 4) || (w->rank >= 0 && w->rank != 4))
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "input and filter must be 4-D");
    if (!ctx->out[0]) return KILN_OK;
    struct kiln_type *o = ctx->out[0];
    kiln_type_unknown(o);
    o->dtype = x->dtype;
    o->rank = 4;
    bool dw = kiln_attr_int(n, "depthwise", 0) != 0, same = kiln_attr_int(n, "same", 0) != 0;
    o->dims[0] = x->rank == 4 ? x->dims[0] : -1;
    o->dims[3] = w->rank == 4 ? w->dims[dw ? 3 : 0] : -1;
    for (int i = 0; i < 2; i++) {
        int64_t pad;
        o->dims[1 + i] = -1;
        if (x->rank == 4 && w->rank == 4 && x->dims[1 + i] >= 0 && w->dims[1 + i] >= 0)
            tfl_out_pad(x->dims[1 + i], w->dims[1 + i], s[i], d[i], same, &o->dims[1 + i], &pad);
    }
    return KILN_OK;
}

static kiln_status conv_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0], *w = ctx->in[1], *b = ctx->n_in > 2 ? ctx->in[2] : NULL;
    kiln_tensor *y = ctx->out[0];
    int64_t s[2] = {0, 0}, d[2] = {0, 0};
    kiln_status st;
    if ((st = pair(n, "strides", 1, s)) != KILN_OK || (st = pair(n, "dilations", 1, d)) != KILN_OK)
        return st;
    const int64_t *m, *sh;
    int nm;
    if ((st = mults(n, x->dtype == KILN_DTYPE_I16, &m, &sh, &nm)) != KILN_OK) return st;
    bool dw = kiln_attr_int(n, "depthwise", 0) != 0, same = kiln_attr_int(n, "same", 0) != 0;
    int64_t in_off = kiln_attr_int(n, "input_offset", 0), w_off = kiln_attr_int(n, "weights_offset", 0);
    int64_t out_off = kiln_attr_int(n, "output_offset", 0);
    int64_t lo = kiln_attr_int(n, "act_min", -128), hi = kiln_attr_int(n, "act_max", 127);
    if ((st = offsets_ok(n, in_off, w_off, out_off)) != KILN_OK) return st;
    bool x16 = x->dtype == KILN_DTYPE_I16;
    if (!is_q(x->dtype) || !is_q(w->dtype) ||
        (b && b->dtype != (x16 ? KILN_DTYPE_I64 : KILN_DTYPE_I32)))
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "input %s, filter %s, bias %s",
                               kiln_dtype_name(x->dtype), kiln_dtype_name(w->dtype),
                               b ? kiln_dtype_name(b->dtype) : "none");
    int64_t N = x->dims[0], H = x->dims[1], W = x->dims[2], C = x->dims[3];
    int64_t KH = w->dims[1], KW = w->dims[2], CO = y->dims[3], OH = y->dims[1], OW = y->dims[2];
    int64_t wc = w->dims[3]; /* filter input depth (conv) */
    if ((dw && (w->dims[0] != 1 || C < 1 || CO % C)) || (!dw && (wc < 1 || C % wc)) ||
        (b && kiln_tensor_count(b) != CO) || (nm != 1 && nm != CO))
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "filter, bias or multipliers do not "
                               "fit %lld input and %lld output channels", (long long)C,
                               (long long)CO);
    if (!dw && CO % (C / wc)) /* each of the C / wc groups has CO / groups filters (conv.cc) */
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "%lld output channels do not divide "
                               "into the %lld groups that %lld input channels over a filter depth "
                               "of %lld make", (long long)CO, (long long)(C / wc), (long long)C,
                               (long long)wc);
    int64_t ph, pw, tmp;
    tfl_out_pad(H, KH, s[0], d[0], same, &tmp, &ph);
    tfl_out_pad(W, KW, s[1], d[1], same, &tmp, &pw);
    int64_t groups = dw ? 1 : C / wc, per_group = dw ? 1 : CO / groups, mult_dw = dw ? CO / C : 1;
    const int32_t *bias = b && !x16 ? b->data : NULL;
    const int64_t *bias64 = b && x16 ? b->data : NULL;
    int64_t o = 0;
    for (int64_t bi = 0; bi < N; bi++)
        for (int64_t oy = 0; oy < OH; oy++)
            for (int64_t ox = 0; ox < OW; ox++)
                for (int64_t oc = 0; oc < CO; oc++, o++) {
                    int64_t iy0 = oy * s[0] - ph, ix0 = ox * s[1] - pw;
                    int64_t acc = 0;
                    for (int64_t fy = 0; fy < KH; fy++) {
                        int64_t iy = iy0 + d[0] * fy;
                        if (iy < 0 || iy >= H) continue;
                        for (int64_t fx = 0; fx < KW; fx++) {
                            int64_t ix = ix0 + d[1] * fx;
                            if (ix < 0 || ix >= W) continue;
                            int64_t xb = ((bi * H + iy) * W + ix) * C;
                            if (dw) {
                                int64_t ic = oc / mult_dw;
                                acc += (int64_t)(qget(w, (fy * KW + fx) * CO + oc) + w_off) *
                                       (qget(x, xb + ic) + in_off);
                            } else {
                                int64_t g = oc / per_group;
                                int64_t wb = ((oc * KH + fy) * KW + fx) * wc;
                                for (int64_t ic = 0; ic < wc; ic++)
                                    acc += (int64_t)(qget(w, wb + ic) + w_off) *
                                           (qget(x, xb + g * wc + ic) + in_off);
                            }
                        }
                    }
                    int k = nm == 1 ? 0 : (int)oc;
                    int32_t v;
                    if (x16) { /* 16x8: int64 accumulator and bias */
                        if (bias64) acc = (int64_t)((uint64_t)acc + (uint64_t)bias64[oc]);
                        v = tfl_mul_by_qm64(acc, (int32_t)m[k], (int)sh[k]);
                    } else {
                        int32_t a32 = (int32_t)(uint32_t)(uint64_t)acc;
                        if (bias) a32 = (int32_t)((uint32_t)a32 + (uint32_t)bias[oc]);
                        v = tfl_mul_by_qm(a32, (int32_t)m[k], (int)sh[k]);
                    }
                    qset(y, o, clamp32((int64_t)v + out_off, lo, hi));
                }
    return KILN_OK;
}
KILN_REF_OP(TflConv, conv_infer, conv_run);

/* ---- TflFullyConnected ---- */

static kiln_status fc_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_type *x = ctx->in[0], *w = ctx->in[1];
    kiln_status st = need_q_input(n, x, "input");
    if (st != KILN_OK) return st;
    if (w->rank >= 0 && w->rank != 2)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "weights must be 2-D");
    if (!ctx->out[0]) return KILN_OK;
    struct kiln_type *o = ctx->out[0];
    kiln_type_unknown(o);
    o->dtype = x->dtype;
    int64_t nout = w->rank == 2 ? w->dims[0] : -1, k = w->rank == 2 ? w->dims[1] : -1;
    if (kiln_attr_int(n, "keep_num_dims", 0) && x->rank >= 1) {
        *o = *x;
        o->dims[x->rank - 1] = nout;
        o->sym[x->rank - 1] = NULL;
        return KILN_OK;
    }
    o->rank = 2;
    o->dims[1] = nout;
    o->dims[0] = -1;
    if (x->rank >= 0 && k > 0) {
        int known = 1;
        for (int i = 0; i < x->rank; i++) known &= x->dims[i] >= 0;
        int64_t cnt = known ? kiln_shape_count(x->rank, x->dims) : -1;
        if (known && cnt < 0)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "input is too large (its "
                                   "dimensions' product exceeds the largest tensor)");
        if (cnt >= 0) {
            if (cnt % k)
                return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "input of %lld elements is "
                                       "not rows of %lld", (long long)cnt, (long long)k);
            o->dims[0] = cnt / k;
        } else if (x->rank == 2 && x->dims[1] == k) {
            o->dims[0] = x->dims[0];
            o->sym[0] = x->sym[0];
        }
    }
    return KILN_OK;
}

static kiln_status fc_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0], *w = ctx->in[1], *b = ctx->n_in > 2 ? ctx->in[2] : NULL;
    kiln_tensor *y = ctx->out[0];
    const int64_t *m, *sh;
    int nm;
    kiln_status st = mults(n, x->dtype == KILN_DTYPE_I16, &m, &sh, &nm);
    if (st != KILN_OK) return st;
    int64_t nout = w->dims[0], k = w->dims[1], rows = k ? kiln_tensor_count(x) / k : 0;
    bool x16 = x->dtype == KILN_DTYPE_I16;
    if (!is_q(x->dtype) || !is_q(w->dtype) ||
        (b && (b->dtype != (x16 ? KILN_DTYPE_I64 : KILN_DTYPE_I32) ||
                                                     kiln_tensor_count(b) != nout)) ||
        (nm != 1 && nm != nout) || kiln_tensor_count(y) != rows * nout)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "operands do not fit");
    int64_t in_off = kiln_attr_int(n, "input_offset", 0), w_off = kiln_attr_int(n, "weights_offset", 0);
    int64_t out_off = kiln_attr_int(n, "output_offset", 0);
    int64_t lo = kiln_attr_int(n, "act_min", -128), hi = kiln_attr_int(n, "act_max", 127);
    if ((st = offsets_ok(n, in_off, w_off, out_off)) != KILN_OK) return st;
    const int32_t *bias = b && !x16 ? b->data : NULL;
    const int64_t *bias64 = b && x16 ? b->data : NULL;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < nout; c++) {
            int64_t acc = 0;
            for (int64_t i = 0; i < k; i++)
                acc += (int64_t)(qget(x, r * k + i) + in_off) * (qget(w, c * k + i) + w_off);
            int q = nm == 1 ? 0 : (int)c;
            int32_t v;
            if (x16) { /* 16x8: int64 accumulator and bias */
                if (bias64) acc = (int64_t)((uint64_t)acc + (uint64_t)bias64[c]);
                v = tfl_mul_by_qm64(acc, (int32_t)m[q], (int)sh[q]);
            } else {
                int32_t a32 = (int32_t)(uint32_t)(uint64_t)acc;
                if (bias) a32 = (int32_t)((uint32_t)a32 + (uint32_t)bias[c]);
                v = tfl_mul_by_qm(a32, (int32_t)m[q], (int)sh[q]);
            }
            qset(y, r * nout + c, clamp32((int64_t)v + out_off, lo, hi));
        }
    return KILN_OK;
}
KILN_REF_OP(TflFullyConnected, fc_infer, fc_run);

/* ---- TflAdd ---- */

static kiln_status add_infer(struct kiln_infer_ctx *ctx)
{
    kiln_status st = need_q_input(ctx->node, ctx->in[0], "input 0");
    if (st == KILN_OK) st = need_q_input(ctx->node, ctx->in[1], "input 1");
    if (st == KILN_OK) st = kiln_infer_broadcast(ctx);
    return st;
}

static kiln_status add_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *a = ctx->in[0], *b = ctx->in[1];
    kiln_tensor *y = ctx->out[0];
    if (!is_q(a->dtype) || b->dtype != a->dtype)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "inputs are %s and %s",
                               kiln_dtype_name(a->dtype), kiln_dtype_name(b->dtype));
    int64_t o1 = kiln_attr_int(n, "input1_offset", 0), o2 = kiln_attr_int(n, "input2_offset", 0);
    int64_t ls = kiln_attr_int(n, "left_shift", 20);
    int64_t m1 = kiln_attr_int(n, "input1_multiplier", 0), s1 = kiln_attr_int(n, "input1_shift", 0);
    int64_t m2 = kiln_attr_int(n, "input2_multiplier", 0), s2 = kiln_attr_int(n, "input2_shift", 0);
    int64_t mo = kiln_attr_int(n, "output_multiplier", 0), so = kiln_attr_int(n, "output_shift", 0);
    int64_t oo = kiln_attr_int(n, "output_offset", 0);
    int64_t lo = kiln_attr_int(n, "act_min", -128), hi = kiln_attr_int(n, "act_max", 127);
    if (ls < 0 || ls > 22 || o1 < -65536 || o1 > 65536 || o2 < -65536 || o2 > 65536 || s1 > 0 || s2 > 0 || so > 0 || s1 < -31 || s2 < -31 || so < -31 ||
        m1 < 0 || m2 < -INT32_MAX || mo < 0 || m1 > INT32_MAX || m2 > INT32_MAX || mo > INT32_MAX)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "multipliers or shifts out of range");
    int64_t cnt = kiln_tensor_count(y);
    const kiln_tensor *ins[2] = {a, b};
    struct kiln_bcast_iter it;
    kiln_bcast_iter_init(&it, y, 2, ins);
    for (int64_t i = 0; i < cnt; i++) {
        int32_t v1 = (int32_t)(uint32_t)((uint64_t)(qget(a, it.off[0]) + o1) << ls);
        int32_t v2 = (int32_t)(uint32_t)((uint64_t)(qget(b, it.off[1]) + o2) << ls);
        int32_t x1 = tfl_rdbpot(tfl_srdhm(v1, (int32_t)m1), (int)-s1);
        int32_t x2 = tfl_rdbpot(tfl_srdhm(v2, (int32_t)m2), (int)-s2);
        int32_t out = tfl_rdbpot(tfl_srdhm(x1 + x2, (int32_t)mo), (int)-so);
        qset(y, i, clamp32((int64_t)out + oo, lo, hi));
        if (i + 1 < cnt) kiln_bcast_iter_next(&it);
    }
    return KILN_OK;
}
KILN_REF_OP(TflAdd, add_infer, add_run);

/* ---- TflMul ---- */

static kiln_status mul_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *a = ctx->in[0], *b = ctx->in[1];
    kiln_tensor *y = ctx->out[0];
    if (!is_q(a->dtype) || b->dtype != a->dtype)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "inputs are %s and %s",
                               kiln_dtype_name(a->dtype), kiln_dtype_name(b->dtype));
    int64_t o1 = kiln_attr_int(n, "input1_offset", 0), o2 = kiln_attr_int(n, "input2_offset", 0);
    int64_t oo = kiln_attr_int(n, "output_offset", 0);
    int64_t mo = kiln_attr_int(n, "output_multiplier", 0), so = kiln_attr_int(n, "output_shift", 0);
    int64_t lo = kiln_attr_int(n, "act_min", -128), hi = kiln_attr_int(n, "act_max", 127);
    kiln_status st = offsets_ok(n, o1, o2, oo);
    if (st != KILN_OK) return st;
    if (mo < 0 || mo > INT32_MAX || so < -31 || so > 30)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "multiplier %lld with shift %lld is "
                               "out of range", (long long)mo, (long long)so);
    int64_t cnt = kiln_tensor_count(y);
    const kiln_tensor *ins[2] = {a, b};
    struct kiln_bcast_iter it;
    kiln_bcast_iter_init(&it, y, 2, ins);
    for (int64_t i = 0; i < cnt; i++) {
        int64_t p = (int64_t)(qget(a, it.off[0]) + o1) * (qget(b, it.off[1]) + o2);
        int32_t v = tfl_mul_by_qm((int32_t)(uint32_t)(uint64_t)p, (int32_t)mo, (int)so);
        qset(y, i, clamp32((int64_t)v + oo, lo, hi));
        if (i + 1 < cnt) kiln_bcast_iter_next(&it);
    }
    return KILN_OK;
}
KILN_REF_OP(TflMul, add_infer, mul_run);

/* ---- TflLut ---- */

static kiln_status lut_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (x->dtype != KILN_DTYPE_UNDEFINED && x->dtype != KILN_DTYPE_I8 && x->dtype != KILN_DTYPE_U8)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "input is %s, expected int8 "
                               "or uint8", kiln_dtype_name(x->dtype));
    const int64_t *t;
    if (kiln_attr_ints(ctx->node, "table", &t) != 256)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "table must have 256 values");
    if (ctx->out[0]) *ctx->out[0] = *x;
    return KILN_OK;
}

static kiln_status lut_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    const int64_t *t;
    if (kiln_attr_ints(ctx->node, "table", &t) != 256 ||
        (x->dtype != KILN_DTYPE_I8 && x->dtype != KILN_DTYPE_U8))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "input %s or table",
                               kiln_dtype_name(x->dtype));
    int32_t lo, hi;
    qrange(y->dtype, &lo, &hi);
    int64_t cnt = kiln_tensor_count(x);
    for (int64_t i = 0; i < cnt; i++)
        qset(y, i, clamp32(t[(uint8_t)qget(x, i)], lo, hi));
    return KILN_OK;
}
KILN_REF_OP(TflLut, lut_infer, lut_run);

/* ---- TflPool ---- */

static kiln_status pool_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_type *x = ctx->in[0];
    kiln_status st = need_q_input(n, x, "input");
    int64_t k[2] = {0, 0}, s[2] = {0, 0};
    if (st != KILN_OK || (st = pair(n, "kernel", 0, k)) != KILN_OK ||
        (st = pair(n, "strides", 1, s)) != KILN_OK)
        return st;
    if (x->rank >= 0 && x->rank != 4)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "input must be 4-D");
    if (!ctx->out[0]) return KILN_OK;
    struct kiln_type *o = ctx->out[0];
    *o = *x;
    if (x->rank != 4) return KILN_OK;
    bool same = kiln_attr_int(n, "same", 0) != 0;
    for (int i = 0; i < 2; i++) {
        int64_t pad;
        o->sym[1 + i] = NULL;
        if (x->dims[1 + i] >= 0) tfl_out_pad(x->dims[1 + i], k[i], s[i], 1, same, &o->dims[1 + i], &pad);
    }
    return KILN_OK;
}

static kiln_status pool_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    int64_t k[2] = {0, 0}, s[2] = {0, 0};
    kiln_status st;
    if ((st = pair(n, "kernel", 0, k)) != KILN_OK || (st = pair(n, "strides", 1, s)) != KILN_OK)
        return st;
    bool same = kiln_attr_int(n, "same", 0) != 0, max = kiln_attr_int(n, "max", 0) != 0;
    int64_t lo = kiln_attr_int(n, "act_min", -128), hi = kiln_attr_int(n, "act_max", 127);
    int64_t N = x->dims[0], H = x->dims[1], W = x->dims[2], C = x->dims[3];
    int64_t OH = y->dims[1], OW = y->dims[2], ph, pw, tmp;
    tfl_out_pad(H, k[0], s[0], 1, same, &tmp, &ph);
    tfl_out_pad(W, k[1], s[1], 1, same, &tmp, &pw);
    int64_t o = 0;
    for (int64_t bi = 0; bi < N; bi++)
        for (int64_t oy = 0; oy < OH; oy++)
            for (int64_t ox = 0; ox < OW; ox++)
                for (int64_t c = 0; c < C; c++, o++) {
                    int64_t iy0 = oy * s[0] - ph, ix0 = ox * s[1] - pw;
                    int64_t acc = max ? INT64_MIN : 0, count = 0;
                    for (int64_t fy = 0; fy < k[0]; fy++)
                        for (int64_t fx = 0; fx < k[1]; fx++) {
                            int64_t iy = iy0 + fy, ix = ix0 + fx;
                            if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                            int32_t v = qget(x, ((bi * H + iy) * W + ix) * C + c);
                            if (max) acc = v > acc ? v : acc;
                            else acc += v;
                            count++;
                        }
                    if (!count)
                        return kiln_node_error(n, KILN_ERR_RUNTIME, "a pooling window lies "
                                               "entirely in the padding");
                    if (!max)
                        acc = acc > 0 ? (acc + count / 2) / count : (acc - count / 2) / count;
                    qset(y, o, clamp32(acc, lo, hi));
                }
    return KILN_OK;
}
KILN_REF_OP(TflPool, pool_infer, pool_run);

/* ---- TflSoftmax: gemmlowp fixed point ---- */

static int32_t wrap_add(int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }
static int32_t wrap_sub(int32_t a, int32_t b) { return (int32_t)((uint32_t)a - (uint32_t)b); }

/* exp(a) for a in [-1/4, 0), a and the result with 0 integer bits. */
static int32_t exp_on_interval(int32_t a)
{
    const int32_t constant_term = 1895147668; /* exp(-1/8) */
    const int32_t one_third = 715827883;
    int32_t x = wrap_add(a, 1 << 28);          /* a + 1/8 */
    int32_t x2 = tfl_srdhm(x, x), x3 = tfl_srdhm(x2, x), x4 = tfl_srdhm(x2, x2);
    int32_t x4_over_4 = tfl_rdbpot(x4, 2);
    int32_t poly = tfl_rdbpot(wrap_add(tfl_srdhm(wrap_add(x4_over_4, x3), one_third), x2), 1);
    return wrap_add(constant_term, tfl_srdhm(constant_term, wrap_add(x, poly)));
}

/* exp(a) for a <= 0 with 5 integer bits; the result with 0 integer bits. */
static int32_t exp_on_negative_values(int32_t a)
{
    const int frac = 26;
    const int32_t one_quarter = 1 << (frac - 2), mask = one_quarter - 1;
    int32_t a_mod = wrap_sub(a & mask, one_quarter);
    int32_t result = exp_on_interval(tfl_sat_shl(a_mod, 5));
    int32_t remainder = wrap_sub(a_mod, a);
    static const int32_t mult[7] = {1672461947, 1302514674, 790015084, 290630308,
                                    39332535,   720401,     242};
    for (int e = -2; e <= 4; e++)
        if (remainder & (int32_t)(1u << (frac + e))) result = tfl_srdhm(result, mult[e + 2]);
    return a == 0 ? INT32_MAX : result;
}

/* 1 / (1 + a) for a in [0, 1), 0 integer bits in, 0 integer bits out. */
static int32_t one_over_one_plus_x(int32_t a)
{
    int64_t sum = (int64_t)a + INT32_MAX;
    int32_t half_denominator = (int32_t)((sum + (sum >= 0 ? 1 : -1)) / 2);
    const int32_t c48_17 = 1515870810, cm32_17 = -1010580540; /* 2 integer bits */
    int32_t x = wrap_add(c48_17, tfl_srdhm(half_denominator, cm32_17));
    for (int i = 0; i < 3; i++) {
        int32_t hd_x = tfl_srdhm(half_denominator, x);
        int32_t one_minus = wrap_sub(1 << 29, hd_x);
        x = wrap_add(x, tfl_sat_shl(tfl_srdhm(x, one_minus), 2));
    }
    return tfl_sat_shl(x, 1);
}

static kiln_status softmax_infer(struct kiln_infer_ctx *ctx)
{
    kiln_status st = need_q_input(ctx->node, ctx->in[0], "input");
    if (st != KILN_OK) return st;
    kiln_dtype to = to_dtype(ctx->node);
    if (to != KILN_DTYPE_I8 && to != KILN_DTYPE_U8 && to != KILN_DTYPE_I16)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "'to' must be int8, uint8 "
                               "or int16");
    if (!ctx->out[0]) return KILN_OK;
    *ctx->out[0] = *ctx->in[0];
    ctx->out[0]->dtype = to;
    return KILN_OK;
}

static kiln_status softmax_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    int64_t im = kiln_attr_int(n, "input_multiplier", 0), ils = kiln_attr_int(n, "input_left_shift", 0);
    int64_t diff_min = kiln_attr_int(n, "diff_min", 0);
    if (im < 0 || im > INT32_MAX || ils < 0 || ils > 31 || x->rank < 1)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "multiplier %lld, shift %lld",
                               (long long)im, (long long)ils);
    int64_t depth = x->dims[x->rank - 1], rows = depth ? kiln_tensor_count(x) / depth : 0;
    int32_t qmin, qmax;
    qrange(y->dtype, &qmin, &qmax);
    int out_bits = y->dtype == KILN_DTYPE_I16 ? 16 : 8; /* sizeof(OutputT) * 8 */
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = r * depth;
        int32_t mx = qget(x, base);
        for (int64_t c = 1; c < depth; c++) mx = qget(x, base + c) > mx ? qget(x, base + c) : mx;
        int32_t sum = 0; /* 12 integer bits */
        for (int64_t c = 0; c < depth; c++) {
            int32_t diff = qget(x, base + c) - mx;
            if (diff >= diff_min) {
                int32_t scaled = tfl_srdhm(tfl_sat_shl(diff, (int)ils), (int32_t)im);
                sum = wrap_add(sum, tfl_rdbpot(exp_on_negative_values(scaled), 12));
            }
        }
        int headroom = sum > 0 ? __builtin_clz((uint32_t)sum) : 31;
        int bits_over_unit = 12 - headroom;
        int32_t shifted = (int32_t)(((uint32_t)sum << headroom) - (1u << 31));
        int32_t scale = one_over_one_plus_x(shifted);
        for (int64_t c = 0; c < depth; c++) {
            int32_t diff = qget(x, base + c) - mx;
            int32_t out = qmin;
            if (diff >= diff_min) {
                int32_t scaled = tfl_srdhm(tfl_sat_shl(diff, (int)ils), (int32_t)im);
                int32_t e = exp_on_negative_values(scaled);
                int32_t unsat = tfl_rdbpot(tfl_srdhm(scale, e), bits_over_unit + 31 - out_bits);
                out = clamp32((int64_t)unsat + qmin, qmin, qmax);
            }
            qset(y, base + c, out);
        }
    }
    return KILN_OK;
}
KILN_REF_OP(TflSoftmax, softmax_infer, softmax_run);

/* ---- TflMean: reference_ops::QuantizedMeanOrSum (compute_sum false) ---- */

/* The resolved axes (non-negative, each once) as a bit mask over x's dims. */
static kiln_status mean_axes(const struct kiln_node *n, int rank, unsigned *mask, int *count)
{
    const int64_t *a;
    int cnt = kiln_attr_ints(n, "axes", &a);
    *mask = 0;
    *count = cnt < 0 ? 0 : cnt;
    for (int i = 0; i < cnt; i++) {
        int64_t ax = a[i] < 0 ? a[i] + rank : a[i];
        if (ax < 0 || ax >= rank)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "axis %lld is out of range for "
                                   "rank %d", (long long)a[i], rank);
        *mask |= 1u << ax;
    }
    return KILN_OK;
}

static kiln_status mean_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    kiln_status st = need_q_input(ctx->node, x, "input");
    if (st != KILN_OK || !ctx->out[0]) return st;
    struct kiln_type *o = ctx->out[0];
    if (x->rank < 0) {
        kiln_type_unknown(o);
        o->dtype = x->dtype;
        return KILN_OK;
    }
    unsigned mask;
    int cnt;
    if ((st = mean_axes(ctx->node, x->rank, &mask, &cnt)) != KILN_OK) return st;
    bool keep = kiln_attr_int(ctx->node, "keepdims", 0) != 0;
    *o = *x;
    if (!cnt) return KILN_OK; /* TFLite copies the input */
    int r = 0;
    for (int i = 0; i < x->rank; i++) {
        if (mask & (1u << i)) {
            if (!keep) continue;
            o->dims[r] = 1;
            o->sym[r++] = NULL;
        } else {
            o->dims[r] = x->dims[i];
            o->sym[r++] = x->sym[i];
        }
    }
    o->rank = r;
    return KILN_OK;
}

static kiln_status mean_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    unsigned mask;
    int cnt;
    kiln_status st = mean_axes(n, x->rank, &mask, &cnt);
    if (st != KILN_OK) return st;
    if (!is_q(x->dtype) || y->dtype != x->dtype)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "input %s, output %s",
                               kiln_dtype_name(x->dtype), kiln_dtype_name(y->dtype));
    int64_t total = kiln_tensor_count(x), nout = kiln_tensor_count(y);
    if (!cnt) { /* ReduceIsCopy */
        for (int64_t i = 0; i < total && i < nout; i++) qset(y, i, qget(x, i));
        return KILN_OK;
    }
    int64_t izp = kiln_attr_int(n, "input_zero_point", 0), ozp = kiln_attr_int(n, "output_zero_point", 0);
    int64_t m = kiln_attr_int(n, "multiplier", 0), s = kiln_attr_int(n, "shift", 0);
    if (m < 0 || m > INT32_MAX || s < -31 || s > 30 || izp < -65536 || izp > 65536 ||
        ozp < -65536 || ozp > 65536)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "multiplier %lld shift %lld zero "
                               "points %lld, %lld", (long long)m, (long long)s, (long long)izp,
                               (long long)ozp);
    int64_t cnt_in = 1;
    for (int i = 0; i < x->rank; i++)
        if (mask & (1u << i)) cnt_in *= x->dims[i];
    for (int64_t i = 0; i < nout; i++) qset(y, i, 0);
    if (total == 0 || cnt_in == 0) return KILN_OK;
    if (total % cnt_in || total / cnt_in != nout)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "output of %lld elements", (long long)nout);
    int64_t *sum = calloc((size_t)nout, sizeof *sum);
    if (!sum) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    /* output index of each input element: strides over the kept dims */
    int64_t ostride[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0}, acc = 1, off = 0;
    for (int i = x->rank - 1; i >= 0; i--) {
        ostride[i] = mask & (1u << i) ? 0 : acc;
        if (!(mask & (1u << i))) acc *= x->dims[i];
    }
    for (int64_t i = 0; i < total; i++) {
        sum[off] += qget(x, i);
        for (int d = x->rank - 1; d >= 0; d--) {
            off += ostride[d];
            if (++idx[d] < x->dims[d]) break;
            off -= ostride[d] * idx[d];
            idx[d] = 0;
        }
    }
    /* the 1/n folded into the multiplier, as QuantizedMeanOrSum does */
    int shift = 63 - __builtin_clzll((unsigned long long)cnt_in);
    if (shift > 32) shift = 32;
    if (shift > 31 + s) shift = (int)(31 + s);
    if (shift < 0) shift = 0;
    int32_t mult = (int32_t)(((int64_t)m << shift) / cnt_in);
    int oshift = (int)s - shift;
    int32_t lo, hi;
    qrange(y->dtype, &lo, &hi);
    for (int64_t i = 0; i < nout; i++) {
        int32_t t32 = (int32_t)(uint32_t)(uint64_t)sum[i]; /* TFLite's int32 temp_sum */
        int32_t shifted = (int32_t)(uint32_t)((uint64_t)(int64_t)t32 - (uint64_t)(izp * cnt_in));
        int32_t v = tfl_mul_by_qm(shifted, mult, oshift);
        qset(y, i, clamp32((int64_t)v + ozp, lo, hi));
    }
    free(sum);
    return KILN_OK;
}
KILN_REF_OP(TflMean, mean_infer, mean_run);

/* ---- TflAct16: int16 LOGISTIC and TANH (reference_integer_ops) ---- */

/* TFLite's sigmoid_table_uint16: sigmoid(i / 24) in 0.16 fixed point, the
 * table both int16 kernels interpolate (tanh(x) = 2 sigmoid(2x) - 1). */
static const uint16_t sigmoid_table_uint16[256] = {
    32768, 33451, 34133, 34813, 35493, 36169, 36843, 37513, 38180, 38841, 39498, 40149, 40794,
    41432, 42064, 42688, 43304, 43912, 44511, 45102, 45683, 46255, 46817, 47369, 47911, 48443,
    48964, 49475, 49975, 50464, 50942, 51409, 51865, 52311, 52745, 53169, 53581, 53983, 54374,
    54755, 55125, 55485, 55834, 56174, 56503, 56823, 57133, 57433, 57724, 58007, 58280, 58544,
    58800, 59048, 59288, 59519, 59743, 59959, 60168, 60370, 60565, 60753, 60935, 61110, 61279,
    61441, 61599, 61750, 61896, 62036, 62172, 62302, 62428, 62549, 62666, 62778, 62886, 62990,
    63090, 63186, 63279, 63368, 63454, 63536, 63615, 63691, 63765, 63835, 63903, 63968, 64030,
    64090, 64148, 64204, 64257, 64308, 64357, 64405, 64450, 64494, 64536, 64576, 64614, 64652,
    64687, 64721, 64754, 64786, 64816, 64845, 64873, 64900, 64926, 64950, 64974, 64997, 65019,
    65039, 65060, 65079, 65097, 65115, 65132, 65149, 65164, 65179, 65194, 65208, 65221, 65234,
    65246, 65258, 65269, 65280, 65291, 65301, 65310, 65319, 65328, 65337, 65345, 65352, 65360,
    65367, 65374, 65381, 65387, 65393, 65399, 65404, 65410, 65415, 65420, 65425, 65429, 65433,
    65438, 65442, 65445, 65449, 65453, 65456, 65459, 65462, 65465, 65468, 65471, 65474, 65476,
    65479, 65481, 65483, 65485, 65488, 65489, 65491, 65493, 65495, 65497, 65498, 65500, 65501,
    65503, 65504, 65505, 65507, 65508, 65509, 65510, 65511, 65512, 65513, 65514, 65515, 65516,
    65517, 65517, 65518, 65519, 65520, 65520, 65521, 65522, 65522, 65523, 65523, 65524, 65524,
    65525, 65525, 65526, 65526, 65526, 65527, 65527, 65528, 65528, 65528, 65529, 65529, 65529,
    65529, 65530, 65530, 65530, 65530, 65531, 65531, 65531, 65531, 65531, 65532, 65532, 65532,
    65532, 65532, 65532, 65533, 65533, 65533, 65533, 65533, 65533, 65533, 65533, 65534, 65534,
    65534, 65534, 65534, 65534, 65534, 65534, 65534, 65534, 65535};

static kiln_status act16_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (x->dtype != KILN_DTYPE_UNDEFINED && x->dtype != KILN_DTYPE_I16)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "input is %s, expected int16",
                               kiln_dtype_name(x->dtype));
    if (ctx->out[0]) *ctx->out[0] = *x;
    return KILN_OK;
}

static kiln_status act16_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    int64_t im = kiln_attr_int(ctx->node, "input_multiplier", 0);
    int64_t ils = kiln_attr_int(ctx->node, "input_left_shift", 0);
    bool tanh_ = kiln_attr_int(ctx->node, "tanh", 0) != 0;
    if (x->dtype != KILN_DTYPE_I16 || im < 0 || im > 32767 || ils < 0 || ils > 31 ||
        (im == 0 && ils > 12))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "input %s, multiplier %lld, "
                               "shift %lld", kiln_dtype_name(x->dtype), (long long)im,
                               (long long)ils);
    if (im == 0) { /* power-of-two input scale */
        im = 3 << ils;
        ils = 0;
    }
    int64_t round = ils > 0 ? (int64_t)1 << (ils - 1) : 0;
    int64_t cnt = kiln_tensor_count(x);
    const int16_t *in = x->data;
    int16_t *out = y->data;
    for (int64_t i = 0; i < cnt; i++) {
        int32_t v = (int32_t)(((int64_t)in[i] * im + round) >> ils);
        uint32_t a = (uint32_t)(v < 0 ? -(int64_t)v : v);
        if (!tanh_) {
            uint32_t uh = a >> 9, r;
            if (uh >= 255) {
                r = 0x7FFFu << 10;
            } else {
                uint32_t ua = sigmoid_table_uint16[uh], ub = sigmoid_table_uint16[uh + 1];
                r = (ua << 9) + (a & 0x1FF) * (ub - ua);
            }
            r = v >= 0 ? r + (1u << 9) : (1u << 25) - r + (1u << 9) - 1;
            out[i] = (int16_t)(r >> 10);
        } else {
            uint32_t uh = a >> 8;
            int32_t r;
            if (uh >= 255) {
                r = 0xFFFF << 8;
            } else {
                uint32_t ua = sigmoid_table_uint16[uh], ub = sigmoid_table_uint16[uh + 1];
                r = (int32_t)((ua << 8) + (a & 0xFF) * (ub - ua));
            }
            r = v >= 0 ? r - (1 << 23) + (1 << 7) : -r + (1 << 23) + (1 << 7) - 1;
            out[i] = (int16_t)(r >> 8);
        }
    }
    return KILN_OK;
}
KILN_REF_OP(TflAct16, act16_infer, act16_run);

/* ---- TflSvdf: integer SVDF, one invocation from a zero state ---- */

static kiln_status svdf_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_type *x = ctx->in[0], *wf = ctx->in[1];
    int64_t rank = kiln_attr_int(n, "rank", 1);
    if ((x->dtype != KILN_DTYPE_UNDEFINED && x->dtype != KILN_DTYPE_I8) || (x->rank >= 0 && x->rank != 2) ||
        wf->rank != 2 || rank < 1 || wf->dims[0] < 0 || wf->dims[0] % rank)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "an int8 [batch, input] and 2-D "
                               "weights with filters a multiple of rank %lld expected",
                               (long long)rank);
    if (!ctx->out[0]) return KILN_OK;
    struct kiln_type *o = ctx->out[0];
    kiln_type_unknown(o);
    o->dtype = KILN_DTYPE_I8;
    o->rank = 2;
    o->dims[0] = x->rank == 2 ? x->dims[0] : -1;
    o->sym[0] = x->rank == 2 ? x->sym[0] : NULL;
    o->dims[1] = wf->dims[0] / rank;
    return KILN_OK;
}

static kiln_status svdf_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0], *wf = ctx->in[1], *wt = ctx->in[2];
    const kiln_tensor *b = ctx->n_in > 3 ? ctx->in[3] : NULL;
    kiln_tensor *y = ctx->out[0];
    int64_t rank = kiln_attr_int(n, "rank", 1), izp = kiln_attr_int(n, "input_zero_point", 0);
    int64_t ozp = kiln_attr_int(n, "output_zero_point", 0);
    int64_t m1 = kiln_attr_int(n, "multiplier1", 0), s1 = kiln_attr_int(n, "shift1", 0);
    int64_t m2 = kiln_attr_int(n, "multiplier2", 0), s2 = kiln_attr_int(n, "shift2", 0);
    if (x->dtype != KILN_DTYPE_I8 || wf->dtype != KILN_DTYPE_I8 || wt->dtype != KILN_DTYPE_I16 ||
        (b && b->dtype != KILN_DTYPE_I32) || x->rank != 2 || wf->rank != 2 || wt->rank != 2 ||
        rank < 1 || wf->dims[0] % rank || wt->dims[0] != wf->dims[0] || wt->dims[1] < 1 ||
        x->dims[1] != wf->dims[1] || (b && kiln_tensor_count(b) != wf->dims[0] / rank) ||
        m1 < 0 || m1 > INT32_MAX || m2 < 0 || m2 > INT32_MAX || s1 < -31 || s1 > 30 ||
        s2 < -31 || s2 > 30 || izp < -128 || izp > 127 || ozp < -128 || ozp > 127)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "operands or parameters do not fit");
    int64_t B = x->dims[0], I = x->dims[1], F = wf->dims[0], M = wt->dims[1], U = F / rank;
    const int8_t *xd = x->data, *wfd = wf->data;
    const int16_t *wtd = wt->data;
    const int32_t *bias = b ? b->data : NULL;
    int8_t *out = y->data;
    for (int64_t bi = 0; bi < B; bi++)
        for (int64_t u = 0; u < U; u++) {
            uint32_t acc = bias ? (uint32_t)bias[u] : 0; /* TFLite's int32 sums */
            for (int64_t r = 0; r < rank; r++) {
                int64_t f = u * rank + r, dot = 0;
                for (int64_t c = 0; c < I; c++)
                    dot += (int64_t)wfd[f * I + c] * (xd[bi * I + c] - izp);
                int32_t st = tfl_mul_by_qm((int32_t)(uint32_t)(uint64_t)dot, (int32_t)m1, (int)s1);
                st = clamp32(st, -32768, 32767); /* the newest int16 state entry */
                acc += (uint32_t)((int32_t)wtd[f * M + M - 1] * st); /* older entries are 0 */
            }
            int32_t v = tfl_mul_by_qm((int32_t)acc, (int32_t)m2, (int)s2);
            out[bi * U + u] = (int8_t)clamp32((int64_t)v + ozp, -128, 127);
        }
    return KILN_OK;
}
KILN_REF_OP(TflSvdf, svdf_infer, svdf_run);
