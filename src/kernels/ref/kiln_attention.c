/*
 * kiln_attention.c - reference kernel for KilnAttention, the attention the
 * optimizer recognizes in any exporter's graph (src/opt/attention_views.c).
 *
 * Q, K and V are read in place from the tensors that hold them, rank 3:
 * [B, S, N] or, with seq_first, [S, B, N]. Head h of Q is the num_heads *
 * head_size columns from q_offset (columns q_offset + h * head_size ..);
 * K likewise from k_offset, V from v_offset with v_head_size. So one packed
 * projection [B, S, 3 * H * E] can feed all three with offsets 0, H*E and
 * 2*H*E, and no Split, Slice or transpose is materialized. With kv_heads
 * (default num_heads) K and V hold fewer heads, each shared by num_heads /
 * kv_heads consecutive query heads (grouped-query and multi-query attention):
 * query head h reads kv head h / (num_heads / kv_heads). With mask_period P
 * the mask's batch axis has P entries and batch b reads entry b % P (the
 * window of Swin's shifted-window attention, whose batch is images x windows). Per batch b, head
 * h and query i: y = softmax(scale * q . k_j + mask[b, h, i, j]) . v_j. The
 * optional f32 mask broadcasts to [B, H, S, T]; with mask_merged its rank is
 * at most 3 and it broadcasts to [B * H, S, T] (attention exported with the
 * heads folded into the batch, as torch.nn.MultiheadAttention does). Y is
 * [B, S, H * v_head_size], [S, B, ...] with y_seq_first, or its first two
 * axes merged with y_merge_rows. The math runs in double; the fast kernel
 * (src/kernels/simd/attention.c) is tested against this one.
 */
#include <math.h>

#include "kernels/kernel.h"

/* The layout read from the node and its inputs' shapes. */
struct ka_dims {
    int64_t B, SQ, T, H, KVH, E, EV, N[3], off[3];
    bool sf, ysf, merge;
};

static kiln_status ka_dims(const struct kiln_node *n, const int64_t *const dims[3],
                           const int ranks[3], struct ka_dims *d)
{
    static const char *off_name[3] = {"q_offset", "k_offset", "v_offset"};
    d->sf = kiln_attr_int(n, "seq_first", 0) != 0;
    d->ysf = kiln_attr_int(n, "y_seq_first", 0) != 0;
    d->merge = kiln_attr_int(n, "y_merge_rows", 0) != 0;
    d->H = kiln_attr_int(n, "num_heads", 0);
    d->KVH = kiln_attr_int(n, "kv_heads", d->H);
    d->E = kiln_attr_int(n, "head_size", 0);
    d->EV = kiln_attr_int(n, "v_head_size", 0);
    if (d->H <= 0 || d->E <= 0 || d->EV <= 0)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "num_heads %lld, head_size %lld and v_head_size %lld must be > 0",
                               (long long)d->H, (long long)d->E, (long long)d->EV);
    if (d->KVH <= 0 || d->H % d->KVH)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "kv_heads %lld does not divide num_heads %lld", (long long)d->KVH,
                               (long long)d->H);
    for (int i = 0; i < 3; i++)
        if (ranks[i] != 3)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "input %d has rank %d, expected 3",
                                   i, ranks[i]);
    int bi = d->sf ? 1 : 0, si = d->sf ? 0 : 1;
    d->B = dims[0][bi];
    d->SQ = dims[0][si];
    d->T = dims[1][si];
    int64_t width[3] = {d->H * d->E, d->KVH * d->E, d->KVH * d->EV};
    for (int i = 0; i < 3; i++) {
        d->N[i] = dims[i][2];
        d->off[i] = kiln_attr_int(n, off_name[i], 0);
        if (d->N[i] >= 0 && (d->off[i] < 0 || d->off[i] + width[i] > d->N[i]))
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "%s %lld + %lld columns exceed input %d's last dim %lld",
                                   off_name[i], (long long)d->off[i], (long long)width[i], i,
                                   (long long)d->N[i]);
        if (i > 0 && d->B >= 0 && dims[i][bi] >= 0 && dims[i][bi] != d->B)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "input %d has batch %lld, Q has %lld", i,
                                   (long long)dims[i][bi], (long long)d->B);
    }
    if (d->T >= 0 && dims[2][si] >= 0 && dims[2][si] != d->T)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "V has %lld positions, K has %lld",
                               (long long)dims[2][si], (long long)d->T);
    return KILN_OK;
}

static kiln_status ka_infer(struct kiln_infer_ctx *ctx)
{
    const int64_t *dims[3];
    int ranks[3];
    for (int i = 0; i < 3; i++) {
        if (!ctx->in[i] || ctx->in[i]->rank < 0) return KILN_OK;
        dims[i] = ctx->in[i]->dims;
        ranks[i] = ctx->in[i]->rank;
    }
    struct ka_dims d;
    kiln_status st = ka_dims(ctx->node, dims, ranks, &d);
    if (st != KILN_OK || !ctx->out[0]) return st;
    const struct kiln_type *q = ctx->in[0];
    struct kiln_type *y = ctx->out[0];
    int bi = d.sf ? 1 : 0, si = d.sf ? 0 : 1;
    int first = d.ysf ? si : bi, second = d.ysf ? bi : si;
    if (d.merge) {
        int64_t rows = q->dims[first] >= 0 && q->dims[second] >= 0 ? q->dims[0] * q->dims[1] : -1;
        int64_t yd[2] = {rows, d.H * d.EV};
        kiln_type_set(y, q->dtype, 2, yd);
    } else {
        int64_t yd[3] = {q->dims[first], q->dims[second], d.H * d.EV};
        kiln_type_set(y, q->dtype, 3, yd);
        y->sym[0] = q->sym[first];
        y->sym[1] = q->sym[second];
    }
    return KILN_OK;
}

static kiln_status ka_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const int64_t *dims[3];
    int ranks[3];
    for (int i = 0; i < 3; i++) {
        if (ctx->in[i]->dtype != KILN_DTYPE_F32)
            return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "input %d is not float32", i);
        dims[i] = ctx->in[i]->dims;
        ranks[i] = ctx->in[i]->rank;
    }
    struct ka_dims d;
    kiln_status st = ka_dims(n, dims, ranks, &d);
    if (st != KILN_OK) return st;
    const kiln_tensor *m = ctx->n_in > 3 ? ctx->in[3] : NULL;
    bool merged = kiln_attr_int(n, "mask_merged", 0) != 0;
    /* mask_period P: the mask's batch axis is the window, b % P (Swin's shifted windows) */
    int64_t period = kiln_attr_int(n, "mask_period", 0);
    if (period < 0 || (period > 0 && (merged || d.B % period)))
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "mask_period %lld does not divide the batch %lld",
                               (long long)period, (long long)d.B);
    /* the mask's strides over [B, H, S, T] (merged: [B * H, S, T] as b * H + h) */
    int64_t ms[4] = {0, 0, 0, 0};
    if (m) {
        if (m->dtype != KILN_DTYPE_F32 || m->rank < 1 || m->rank > (merged ? 3 : 4))
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "mask must be float32 of rank 1 to %d", merged ? 3 : 4);
        int64_t want[4] = {period > 0 ? period : d.B, d.H, d.SQ, d.T}, stride = 1;
        if (m->dims[m->rank - 1] != d.T)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "mask's last dim %lld is not the %lld keys",
                                   (long long)m->dims[m->rank - 1], (long long)d.T);
        for (int i = m->rank - 1; i >= 0; i--) {
            int ax = 4 - m->rank + i;
            int64_t md = m->dims[i];
            if (merged && ax == 1 && md == d.B * d.H) {
                ms[0] = stride * d.H;
                ms[1] = stride;
            } else if (md == want[ax]) {
                ms[ax] = stride;
            } else if (md != 1) {
                return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                       "mask dim %d is %lld: it does not broadcast to the scores",
                                       i, (long long)md);
            }
            stride *= md;
        }
    }
    int64_t ny = d.H * d.EV;
    if (ctx->out[0]->dtype != KILN_DTYPE_F32 ||
        kiln_shape_count(ctx->out[0]->rank, ctx->out[0]->dims) != d.B * d.SQ * ny)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "output holds the wrong count");
    double *p = malloc((size_t)(d.T > 0 ? d.T : 1) * sizeof *p);
    if (!p) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory for KilnAttention");
    const float *q = ctx->in[0]->data, *k = ctx->in[1]->data, *v = ctx->in[2]->data;
    const float *mk = m ? m->data : NULL;
    float *y = ctx->out[0]->data;
    float scale = kiln_attr_float(n, "scale", 1.0f);
    int64_t seq[3] = {d.SQ, d.T, d.T};
    /* element offset of (batch b, position s) in input i */
#define AT(i, b, s) ((d.sf ? ((s) * d.B + (b)) : ((b) * seq[i] + (s))) * d.N[i] + d.off[i])
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < d.H; h++)
            for (int64_t i = 0; i < d.SQ; i++) {
                int64_t hk = h / (d.H / d.KVH); /* the kv head of query head h */
                const float *qi = q + AT(0, b, i) + h * d.E;
                double mx = -INFINITY;
                for (int64_t j = 0; j < d.T; j++) {
                    const float *kj = k + AT(1, b, j) + hk * d.E;
                    double acc = 0.0;
                    for (int64_t e = 0; e < d.E; e++) acc += (double)qi[e] * kj[e];
                    acc *= scale;
                    if (mk)
                        acc += mk[(period > 0 ? b % period : b) * ms[0] + h * ms[1] + i * ms[2] +
                                  j * ms[3]];
                    p[j] = acc;
                    if (acc > mx) mx = acc;
                }
                double sum = 0.0;
                for (int64_t j = 0; j < d.T; j++) {
                    p[j] = exp(p[j] - mx);
                    sum += p[j];
                }
                int64_t row = d.ysf ? i * d.B + b : b * d.SQ + i;
                float *yi = y + row * ny + h * d.EV;
                for (int64_t e = 0; e < d.EV; e++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < d.T; j++) acc += p[j] * v[AT(2, b, j) + hk * d.EV + e];
                    yi[e] = (float)(acc / sum);
                }
            }
#undef AT
    free(p);
    return KILN_OK;
}

KILN_REF_OP(KilnAttention, ka_infer, ka_run);
