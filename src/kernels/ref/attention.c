/*
 * attention.c - reference kernels for the transformer ops Attention (opset
 * 23/24) and RotaryEmbedding (opset 23).
 *
 * Attention computes softmax(softcap(Q K^T * scale) + bias) V per batch and
 * query head. Q/K/V are 4-D [batch, heads, seq, head_size] or 3-D
 * [batch, seq, heads * head_size] (then q_num_heads / kv_num_heads say how to
 * split). The bias combines attn_mask (bool: false = -inf; float: added; a
 * last dim shorter than the total sequence is padded with -inf), is_causal
 * (query i sees key j iff j <= i + offset, offset = past length) and
 * nonpad_kv_seqlen (opset 24: keys at or past it are -inf). past_key /
 * past_value are concatenated in front of K / V and returned as present_*.
 * Grouped-query attention: query head h uses kv head h / (q_heads / kv_heads).
 * qk_matmul_output_mode picks what output 3 holds: 0 and 1 the (softcapped)
 * scores, 2 the scores plus bias, 3 the softmax. Any float dtype; the math
 * runs in double. Semantics follow onnx/reference/ops/op_attention.py.
 */
#include "kernels/kernel.h"

/* Attention's shapes, resolved from the inputs and attributes. */
struct attn_dims {
    int64_t batch, q_heads, kv_heads, q_seq, kv_seq, past, total, head, v_head;
    bool three_d; /* Q/K/V (and Y) are [batch, seq, hidden] */
};

/* Resolve the shapes from (possibly partial) types; unknown dims stay -1. */
static kiln_status attn_dims_from(const struct kiln_node *n, const struct kiln_type *q,
                                  const struct kiln_type *k, const struct kiln_type *v,
                                  const struct kiln_type *past_k, struct attn_dims *d)
{
    int64_t qh_attr = kiln_attr_int(n, "q_num_heads", 0);
    int64_t kvh_attr = kiln_attr_int(n, "kv_num_heads", 0);
    d->batch = d->q_heads = d->kv_heads = d->q_seq = d->kv_seq = -1;
    d->past = d->total = d->head = d->v_head = -1;
    d->three_d = false;
    if (q->rank < 0) return KILN_OK;
    if (q->rank != 3 && q->rank != 4)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "Q has rank %d, expected 3 or 4",
                               q->rank);
    if (k && k->rank >= 0 && k->rank != q->rank)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "K has rank %d but Q has rank %d",
                               k->rank, q->rank);
    if (v && v->rank >= 0 && v->rank != q->rank)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "V has rank %d but Q has rank %d",
                               v->rank, q->rank);
    d->batch = q->dims[0];
    if (q->rank == 3) {
        d->three_d = true;
        if (qh_attr <= 0 || kvh_attr <= 0)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                                   "3-D inputs need q_num_heads and kv_num_heads > 0 (got %lld, "
                                   "%lld)",
                                   (long long)qh_attr, (long long)kvh_attr);
        d->q_heads = qh_attr;
        d->kv_heads = kvh_attr;
        d->q_seq = q->dims[1];
        if (q->dims[2] >= 0) {
            if (q->dims[2] % qh_attr)
                return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                       "Q hidden size %lld is not a multiple of q_num_heads %lld",
                                       (long long)q->dims[2], (long long)qh_attr);
            d->head = q->dims[2] / qh_attr;
        }
        if (k && k->rank == 3) d->kv_seq = k->dims[1];
        if (v && v->rank == 3 && v->dims[2] >= 0) {
            if (v->dims[2] % kvh_attr)
                return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                       "V hidden size %lld is not a multiple of kv_num_heads %lld",
                                       (long long)v->dims[2], (long long)kvh_attr);
            d->v_head = v->dims[2] / kvh_attr;
        }
    } else {
        d->q_heads = q->dims[1];
        d->q_seq = q->dims[2];
        d->head = q->dims[3];
        if (k && k->rank == 4) {
            d->kv_heads = k->dims[1];
            d->kv_seq = k->dims[2];
        }
        if (v && v->rank == 4) d->v_head = v->dims[3];
    }
    if (d->q_heads > 0 && d->kv_heads > 0 && d->q_heads % d->kv_heads)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "q heads %lld is not a multiple of kv heads %lld",
                               (long long)d->q_heads, (long long)d->kv_heads);
    d->past = 0;
    if (past_k) d->past = past_k->rank == 4 ? past_k->dims[2] : -1;
    d->total = d->past >= 0 && d->kv_seq >= 0 ? d->past + d->kv_seq : -1;
    return KILN_OK;
}

/* Shape function: Y, present_key, present_value, qk_matmul_output. */
static kiln_status attention_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *q = ctx->in[0];
    const struct kiln_type *k = ctx->n_in > 1 ? ctx->in[1] : NULL;
    const struct kiln_type *v = ctx->n_in > 2 ? ctx->in[2] : NULL;
    const struct kiln_type *pk = ctx->n_in > 4 ? ctx->in[4] : NULL;
    if (!q) return KILN_OK;
    struct attn_dims d;
    kiln_status st = attn_dims_from(ctx->node, q, k, v, pk, &d);
    if (st != KILN_OK) return st;
    kiln_dtype dt = q->dtype;
    if (q->rank < 0) {
        if (ctx->out[0]) {
            kiln_type_unknown(ctx->out[0]);
            ctx->out[0]->dtype = dt;
        }
    } else if (ctx->out[0]) {
        if (d.three_d) {
            int64_t hid = d.v_head >= 0 ? d.q_heads * d.v_head : -1;
            int64_t dims[3] = {d.batch, d.q_seq, hid};
            kiln_type_set(ctx->out[0], dt, 3, dims);
        } else {
            int64_t dims[4] = {d.batch, d.q_heads, d.q_seq, d.v_head};
            kiln_type_set(ctx->out[0], dt, 4, dims);
        }
    }
    if (ctx->n_out > 1 && ctx->out[1]) {
        int64_t dims[4] = {d.batch, d.kv_heads, d.total, d.head};
        kiln_type_set(ctx->out[1], dt, 4, dims);
    }
    if (ctx->n_out > 2 && ctx->out[2]) {
        int64_t dims[4] = {d.batch, d.kv_heads, d.total, d.v_head};
        kiln_type_set(ctx->out[2], dt, 4, dims);
    }
    if (ctx->n_out > 3 && ctx->out[3]) {
        int64_t dims[4] = {d.batch, d.q_heads, d.q_seq, d.total};
        kiln_type_set(ctx->out[3], dt, 4, dims);
    }
    return KILN_OK;
}

/* Element (b, h, s, e) of a 4-D tensor, or of a 3-D [b, s, h*E] one. */
static inline int64_t bhse(bool three_d, int64_t H, int64_t S, int64_t E, int64_t b, int64_t h,
                           int64_t s, int64_t e)
{
    return three_d ? ((b * S + s) * H + h) * E + e : ((b * H + h) * S + s) * E + e;
}

/* Check a tensor's shape against expected dims. */
static kiln_status expect_shape(const struct kiln_node *n, const char *what,
                                const kiln_tensor *t, int rank, const int64_t *dims)
{
    bool ok = t->rank == rank;
    for (int i = 0; ok && i < rank; i++) ok = t->dims[i] == dims[i];
    if (ok) return KILN_OK;
    char got[96], want[96];
    return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "%s has shape %s, expected %s", what,
                           kiln_shape_str(t->rank, t->dims, got, sizeof got),
                           kiln_shape_str(rank, dims, want, sizeof want));
}

/*
 * Gather past (4-D [B, H, P, E]) and new (4-D or 3-D) keys or values into a
 * double array [B, H, P + S, E] and write it to present when wanted.
 */
static double *kv_concat(const kiln_tensor *past, const kiln_tensor *cur, bool three_d,
                         const struct attn_dims *d, int64_t E, kiln_tensor *present)
{
    int64_t B = d->batch, H = d->kv_heads, P = d->past, S = d->kv_seq, T = d->total;
    int64_t count = B * H * T * E;
    double *out = malloc((size_t)(count > 0 ? count : 1) * sizeof *out);
    if (!out) return NULL;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t e = 0; e < E; e++) {
                    double v = t < P ? kiln_get_f64(past->dtype, past->data,
                                                    ((b * H + h) * P + t) * E + e)
                                     : kiln_get_f64(cur->dtype, cur->data,
                                                    bhse(three_d, H, S, E, b, h, t - P, e));
                    int64_t o = ((b * H + h) * T + t) * E + e;
                    out[o] = v;
                    if (present) kiln_set_f64(present->dtype, present->data, o, v);
                }
    return out;
}

/* Run Attention. */
static kiln_status attention_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *Q = ctx->in[0], *K = ctx->in[1], *V = ctx->in[2];
    const kiln_tensor *mask = ctx->n_in > 3 ? ctx->in[3] : NULL;
    const kiln_tensor *past_k = ctx->n_in > 4 ? ctx->in[4] : NULL;
    const kiln_tensor *past_v = ctx->n_in > 5 ? ctx->in[5] : NULL;
    const kiln_tensor *nonpad = ctx->n_in > 6 ? ctx->in[6] : NULL;
    kiln_tensor *Y = ctx->out[0];
    kiln_tensor *present_k = ctx->n_out > 1 ? ctx->out[1] : NULL;
    kiln_tensor *present_v = ctx->n_out > 2 ? ctx->out[2] : NULL;
    kiln_tensor *qk_out = ctx->n_out > 3 ? ctx->out[3] : NULL;

    if (!kiln_dtype_is_float(Q->dtype) || K->dtype != Q->dtype || V->dtype != Q->dtype)
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED,
                               "Q/K/V dtypes %s/%s/%s are not one float dtype",
                               kiln_dtype_name(Q->dtype), kiln_dtype_name(K->dtype),
                               kiln_dtype_name(V->dtype));
    if ((past_k == NULL) != (past_v == NULL))
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "past_key and past_value must be given together");

    struct kiln_type tq, tk, tv, tp;
    kiln_type_from_tensor(&tq, Q);
    kiln_type_from_tensor(&tk, K);
    kiln_type_from_tensor(&tv, V);
    if (past_k) kiln_type_from_tensor(&tp, past_k);
    struct attn_dims d;
    kiln_status st = attn_dims_from(n, &tq, &tk, &tv, past_k ? &tp : NULL, &d);
    if (st != KILN_OK) return st;
    if (d.kv_heads <= 0 || d.q_heads <= 0 || d.past < 0)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "cannot resolve head counts");
    int64_t B = d.batch, HQ = d.q_heads, HK = d.kv_heads, SQ = d.q_seq, SK = d.kv_seq;
    int64_t T = d.total, E = d.head, EV = d.v_head;

    /* K and V must agree with Q and each other */
    if (d.three_d) {
        int64_t dk[3] = {B, SK, HK * E}, dv[3] = {B, SK, HK * EV};
        if ((st = expect_shape(n, "K", K, 3, dk)) != KILN_OK) return st;
        if ((st = expect_shape(n, "V", V, 3, dv)) != KILN_OK) return st;
    } else {
        int64_t dk[4] = {B, HK, SK, E}, dv[4] = {B, HK, SK, EV};
        if ((st = expect_shape(n, "K", K, 4, dk)) != KILN_OK) return st;
        if ((st = expect_shape(n, "V", V, 4, dv)) != KILN_OK) return st;
    }
    if (past_k) {
        int64_t dk[4] = {B, HK, d.past, E}, dv[4] = {B, HK, d.past, EV};
        if ((st = expect_shape(n, "past_key", past_k, 4, dk)) != KILN_OK) return st;
        if ((st = expect_shape(n, "past_value", past_v, 4, dv)) != KILN_OK) return st;
        if (past_k->dtype != Q->dtype || past_v->dtype != Q->dtype)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "past_key/past_value dtype differs from Q");
    }

    /* the mask broadcasts (right-aligned) to [B, HQ, SQ, mask_cols] */
    int64_t mstride[4] = {0, 0, 0, 0}, mcols = 0;
    if (mask) {
        if (mask->rank < 1 || mask->rank > 4)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "attn_mask has rank %d",
                                   mask->rank);
        if (mask->dtype != KILN_DTYPE_BOOL && !kiln_dtype_is_float(mask->dtype))
            return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "attn_mask dtype %s",
                                   kiln_dtype_name(mask->dtype));
        int64_t want[4] = {B, HQ, SQ, T};
        int64_t stride = 1;
        for (int i = mask->rank - 1; i >= 0; i--) {
            int ax = 4 - mask->rank + i;
            int64_t md = mask->dims[i];
            if (ax == 3) {
                if (md > T)
                    return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                           "attn_mask last dim %lld exceeds total sequence %lld",
                                           (long long)md, (long long)T);
                mcols = md;
                mstride[3] = 1;
            } else if (md == want[ax]) {
                mstride[ax] = stride;
            } else if (md != 1) {
                char buf[96];
                return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                       "attn_mask shape %s does not broadcast to [%lld,%lld,%lld,"
                                       "%lld]",
                                       kiln_shape_str(mask->rank, mask->dims, buf, sizeof buf),
                                       (long long)B, (long long)HQ, (long long)SQ, (long long)T);
            }
            stride *= md;
        }
    }
    if (nonpad) {
        int64_t dn[1] = {B};
        if ((st = expect_shape(n, "nonpad_kv_seqlen", nonpad, 1, dn)) != KILN_OK) return st;
        if (!kiln_dtype_is_int(nonpad->dtype))
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "nonpad_kv_seqlen dtype %s",
                                   kiln_dtype_name(nonpad->dtype));
        for (int64_t b = 0; b < B; b++) {
            int64_t np = kiln_tensor_i64(nonpad, b);
            if (np < 0 || np > T)
                return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                       "nonpad_kv_seqlen[%lld] = %lld is outside [0, %lld]",
                                       (long long)b, (long long)np, (long long)T);
        }
    }

    bool causal = kiln_attr_int(n, "is_causal", 0) != 0;
    double softcap = kiln_attr_float(n, "softcap", 0.0f);
    int64_t mode = kiln_attr_int(n, "qk_matmul_output_mode", 0);
    if (mode < 0 || mode > 3)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "qk_matmul_output_mode %lld",
                               (long long)mode);
    double scale = kiln_node_attr(n, "scale") ? kiln_attr_float(n, "scale", 1.0f)
                                              : 1.0 / sqrt((double)E);

    st = KILN_OK;
    double *k = NULL, *v = NULL, *row = NULL, *bias = NULL, *qrow = NULL;
    k = kv_concat(past_k, K, d.three_d, &d, E, present_k);
    v = kv_concat(past_v, V, d.three_d, &d, EV, present_v);
    row = malloc((size_t)(2 * T + E + 1) * sizeof *row); /* scores, bias, one query */
    if (!k || !v || !row) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory for Attention scratch");
        goto out_free;
    }
    bias = row + T;
    qrow = bias + T;

    int64_t group = HQ / HK;
    for (int64_t b = 0; b < B; b++) {
        int64_t np = nonpad ? kiln_tensor_i64(nonpad, b) : T;
        /* causal frontier: query i sees key j iff j <= i + offset */
        int64_t offset = past_k ? d.past : nonpad ? np - SQ : 0;
        for (int64_t h = 0; h < HQ; h++) {
            int64_t hk = h / group;
            const double *kb = k + (b * HK + hk) * T * E;
            const double *vb = v + (b * HK + hk) * T * EV;
            for (int64_t i = 0; i < SQ; i++) {
                double row_max = -INFINITY;
                for (int64_t e = 0; e < E; e++)
                    qrow[e] =
                        kiln_get_f64(Q->dtype, Q->data, bhse(d.three_d, HQ, SQ, E, b, h, i, e));
                for (int64_t j = 0; j < T; j++) {
                    double s = 0;
                    for (int64_t e = 0; e < E; e++) s += qrow[e] * kb[j * E + e];
                    s *= scale;
                    if (softcap > 0) s = softcap * tanh(s / softcap);
                    double bj = 0;
                    if (mask) {
                        if (j >= mcols) {
                            bj = -INFINITY;
                        } else {
                            int64_t mi = b * mstride[0] + h * mstride[1] + i * mstride[2] + j;
                            if (mask->dtype == KILN_DTYPE_BOOL)
                                bj = ((const uint8_t *)mask->data)[mi] ? 0 : -INFINITY;
                            else
                                bj = kiln_get_f64(mask->dtype, mask->data, mi);
                        }
                    }
                    if (causal && j > i + offset) bj += -INFINITY;
                    if (nonpad && j >= np) bj += -INFINITY;
                    row[j] = s;
                    bias[j] = bj;
                    double x = s + bj;
                    if (x > row_max) row_max = x;
                }
                int64_t qo = ((b * HQ + h) * SQ + i) * T;
                if (qk_out && mode <= 2)
                    for (int64_t j = 0; j < T; j++)
                        kiln_set_f64(qk_out->dtype, qk_out->data, qo + j,
                                     mode == 2 ? row[j] + bias[j] : row[j]);
                /* softmax; a row masked everywhere gives NaN, as in the ONNX reference */
                double sum = 0;
                for (int64_t j = 0; j < T; j++) {
                    row[j] = exp(row[j] + bias[j] - row_max);
                    sum += row[j];
                }
                for (int64_t j = 0; j < T; j++) row[j] /= sum;
                if (qk_out && mode == 3)
                    for (int64_t j = 0; j < T; j++)
                        kiln_set_f64(qk_out->dtype, qk_out->data, qo + j, row[j]);
                for (int64_t e = 0; e < EV; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j < T; j++) acc += row[j] * vb[j * EV + e];
                    kiln_set_f64(Y->dtype, Y->data, bhse(d.three_d, HQ, SQ, EV, b, h, i, e), acc);
                }
            }
        }
    }

out_free:
    free(k);
    free(v);
    free(row);
    return st;
}

KILN_REF_OP(Attention, attention_infer, attention_run);

/* ---- RotaryEmbedding ---- */

/* Run RotaryEmbedding: rotate the first rotary_embedding_dim features of each head. */
static kiln_status rotary_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *X = ctx->in[0], *cosc = ctx->in[1], *sinc = ctx->in[2];
    const kiln_tensor *pos = ctx->n_in > 3 ? ctx->in[3] : NULL;
    kiln_tensor *Y = ctx->out[0];
    bool interleaved = kiln_attr_int(n, "interleaved", 0) != 0;
    int64_t num_heads = kiln_attr_int(n, "num_heads", 0);
    int64_t rot = kiln_attr_int(n, "rotary_embedding_dim", 0);

    if (!kiln_dtype_is_float(X->dtype))
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "input dtype %s is not supported",
                               kiln_dtype_name(X->dtype));
    if (X->rank != 3 && X->rank != 4)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "input has rank %d, expected 3 or 4",
                               X->rank);
    if (cosc->rank < 2 || cosc->rank != sinc->rank)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "cos_cache / sin_cache ranks %d / %d", cosc->rank, sinc->rank);
    for (int i = 0; i < cosc->rank; i++)
        if (cosc->dims[i] != sinc->dims[i])
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "cos_cache and sin_cache shapes differ");
    int64_t half = cosc->dims[cosc->rank - 1];
    bool three_d = X->rank == 3;
    int64_t B = X->dims[0], S, NH, HD;
    if (three_d) {
        S = X->dims[1];
        if (num_heads <= 0) {
            /* without num_heads, the cache (full rotation) gives the head size */
            if (rot > 0 || half <= 0)
                return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                                       "3-D input needs num_heads > 0");
            num_heads = X->dims[2] / (2 * half);
        }
        if (num_heads <= 0 || X->dims[2] % num_heads)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "hidden size %lld is not a multiple of num_heads %lld",
                                   (long long)X->dims[2], (long long)num_heads);
        NH = num_heads;
        HD = X->dims[2] / NH;
    } else {
        NH = X->dims[1];
        S = X->dims[2];
        HD = X->dims[3];
    }
    if (rot == 0) rot = HD;
    if (rot < 0 || rot > HD || rot % 2 || half * 2 != rot)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "rotary_embedding_dim %lld does not fit head size %lld and cache "
                               "last dim %lld",
                               (long long)rot, (long long)HD, (long long)half);
    int64_t max_pos = 0;
    if (pos) {
        if (cosc->rank != 2 || pos->rank != 2 || pos->dims[0] != B || pos->dims[1] != S ||
            !kiln_dtype_is_int(pos->dtype))
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "position_ids must be integer [%lld, %lld] with a 2-D cache",
                                   (long long)B, (long long)S);
        max_pos = cosc->dims[0];
    } else if (cosc->rank != 3 || cosc->dims[0] != B || cosc->dims[1] != S) {
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "without position_ids the caches must be [%lld, %lld, %lld]",
                               (long long)B, (long long)S, (long long)half);
    }

    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++) {
            int64_t crow;
            if (pos) {
                int64_t p = kiln_tensor_i64(pos, b * S + s);
                if (p < 0 || p >= max_pos)
                    return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                           "position_ids value %lld is outside [0, %lld)",
                                           (long long)p, (long long)max_pos);
                crow = p * half;
            } else {
                crow = (b * S + s) * half;
            }
            for (int64_t h = 0; h < NH; h++) {
                int64_t base = bhse(three_d, NH, S, HD, b, h, s, 0);
                for (int64_t k = 0; k < half; k++) {
                    double c = kiln_get_f64(cosc->dtype, cosc->data, crow + k);
                    double sn = kiln_get_f64(sinc->dtype, sinc->data, crow + k);
                    int64_t i1 = interleaved ? 2 * k : k;
                    int64_t i2 = interleaved ? 2 * k + 1 : k + half;
                    double x1 = kiln_get_f64(X->dtype, X->data, base + i1);
                    double x2 = kiln_get_f64(X->dtype, X->data, base + i2);
                    kiln_set_f64(Y->dtype, Y->data, base + i1, c * x1 - sn * x2);
                    kiln_set_f64(Y->dtype, Y->data, base + i2, sn * x1 + c * x2);
                }
                for (int64_t k = rot; k < HD; k++)
                    kiln_set_f64(Y->dtype, Y->data, base + k,
                                 kiln_get_f64(X->dtype, X->data, base + k));
            }
        }
    return KILN_OK;
}

KILN_REF_OP(RotaryEmbedding, kiln_infer_same, rotary_run);
