/*
 * tf_lower_nn.c - TensorFlow neural-network ops to Kiln IR: BiasAdd, Conv2D,
 * DepthwiseConv2dNative, Conv2DBackpropInput, MaxPool, AvgPool and
 * FusedBatchNorm. TF's NHWC layouts become Transpose + NCHW op + Transpose;
 * FusedBatchNorm in inference mode is a per-channel multiply-add.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "import/tf_lower.h"
#include "kernels/kernel.h"

kiln_status tfo_lw_bias_add(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1, b = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &b);
    if (st != KILN_OK) return st;
    const char *fmt = tfo_attr_str(L, "data_format", "NHWC");
    if (strcmp(fmt, "NCHW") == 0 || strcmp(fmt, "NCDHW") == 0) {
        int r = tfo_vtype(L, x)->rank;
        if (r < 2) return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "NCHW BiasAdd needs an input of known rank");
        int64_t axes[KILN_MAX_RANK];
        for (int i = 0; i < r - 2; i++) axes[i] = i + 1;
        if (r > 2 && (st = tfo_axes_node(L, KILN_OP_Unsqueeze, b, r - 2, axes, &b)) != KILN_OK) return st;
    }
    if ((st = tfo_bin(L, KILN_OP_Add, x, b, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}
/* ---- convolution and pooling (NHWC <-> NCHW) ---- */

struct conv_geom {
    bool nchw;
    int64_t strides[2], dil[2], ksize[2];
    const char *auto_pad;     /* "SAME_UPPER", "VALID" or NULL (explicit pads) */
    int64_t pads[4];
};

static kiln_status conv_geom(L_t *L, bool pool, struct conv_geom *gm)
{
    const char *fmt = tfo_attr_str(L, "data_format", "NHWC");
    if (strcmp(fmt, "NHWC") != 0 && strcmp(fmt, "NCHW") != 0)
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "data_format '%s' is not supported", fmt);
    gm->nchw = strcmp(fmt, "NCHW") == 0;
    int hi = gm->nchw ? 2 : 1, wi = gm->nchw ? 3 : 2;
    const int64_t *v;
    const char *names[3] = {"strides", "dilations", "ksize"};
    int64_t *dst[3] = {gm->strides, gm->dil, gm->ksize};
    for (int k = 0; k < 3; k++) {
        dst[k][0] = dst[k][1] = 1;
        if (k == 2 && !pool) continue;
        int n = tfo_attr_ints(L, names[k], &v);
        if (n < 0) continue;
        if (n != 4) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "%s has %d values, expected 4", names[k], n);
        if (v[0] != 1 || v[gm->nchw ? 1 : 3] != 1)
            return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "%s over the batch or channel dim is not supported",
                        names[k]);
        dst[k][0] = v[hi];
        dst[k][1] = v[wi];
        if (v[hi] < 1 || v[wi] < 1)
            return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "%s must be positive", names[k]);
    }
    const char *pad = tfo_attr_str(L, "padding", "VALID");
    gm->auto_pad = NULL;
    memset(gm->pads, 0, sizeof gm->pads);
    if (strcmp(pad, "SAME") == 0) gm->auto_pad = "SAME_UPPER";
    else if (strcmp(pad, "VALID") == 0) gm->auto_pad = "VALID";
    else if (strcmp(pad, "EXPLICIT") == 0 && !pool) {
        int n = tfo_attr_ints(L, "explicit_paddings", &v);
        if (n != 8) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "explicit_paddings has %d values, expected 8", n);
        gm->pads[0] = v[2 * hi];
        gm->pads[1] = v[2 * wi];
        gm->pads[2] = v[2 * hi + 1];
        gm->pads[3] = v[2 * wi + 1];
    } else {
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "padding '%s' is not supported", pad);
    }
    return KILN_OK;
}

static const int64_t TO_NCHW[4] = {0, 3, 1, 2};
static const int64_t TO_NHWC[4] = {0, 2, 3, 1};

static kiln_status conv_attrs(struct emit *em, const struct conv_geom *gm, bool pool)
{
    kiln_status st = tfo_a_ints(em, "strides", 2, gm->strides);
    if (st == KILN_OK && !pool) st = tfo_a_ints(em, "dilations", 2, gm->dil);
    if (st == KILN_OK && pool) st = tfo_a_ints(em, "kernel_shape", 2, gm->ksize);
    if (st != KILN_OK) return st;
    if (gm->auto_pad) return tfo_a_str(em, "auto_pad", gm->auto_pad, strlen(gm->auto_pad));
    return tfo_a_ints(em, "pads", 4, gm->pads);
}

kiln_status tfo_lw_conv(L_t *L, const struct tf_op *e)
{
    int x = -1, w = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &w);
    if (st != KILN_OK) return st;
    struct conv_geom gm;
    if ((st = conv_geom(L, false, &gm)) != KILN_OK) return st;
    bool depthwise = e->arg == TFV_DEPTHWISE;
    const struct kiln_type *wt = tfo_vtype(L, w);
    if (wt->rank != 4 && wt->rank != -1)
        return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "filter has rank %d, expected 4", wt->rank);
    int64_t group = 1;
    if (depthwise) {
        /* [kh,kw,in,mult] -> [kh,kw,1,in*mult]: output channel i*mult+m */
        if (wt->rank != 4 || wt->dims[2] < 0 || wt->dims[3] < 0)
            return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "needs a filter of known shape");
        group = wt->dims[2];
        int64_t shape[4] = {wt->dims[0], wt->dims[1], 1, wt->dims[2] * wt->dims[3]};
        if ((st = tfo_reshape_to(L, w, 4, shape, &w)) != KILN_OK) return st;
    } else if (wt->rank == 4 && wt->dims[2] > 0) {
        const struct kiln_type *xt = tfo_vtype(L, x);
        int64_t cin = xt->rank == 4 ? xt->dims[gm.nchw ? 1 : 3] : -1;
        if (cin > 0 && cin != wt->dims[2]) {
            if (cin % wt->dims[2] != 0)
                return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "input has %lld channels, filter %lld",
                            (long long)cin, (long long)wt->dims[2]);
            group = cin / wt->dims[2];
        }
    }
    static const int64_t HWIO_TO_OIHW[4] = {3, 2, 0, 1};
    if ((st = tfo_transpose(L, w, 4, HWIO_TO_OIHW, &w)) != KILN_OK) return st;
    if (!gm.nchw && (st = tfo_transpose(L, x, 4, TO_NCHW, &x)) != KILN_OK) return st;
    struct emit em;
    int in[2] = {x, w};
    if ((st = tfo_node_begin(L, KILN_OP_Conv, 2, in, 1, 5, &em)) != KILN_OK) return st;
    if ((st = conv_attrs(&em, &gm, false)) != KILN_OK) return st;
    tfo_a_int(&em, "group", group);
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    if (!gm.nchw && (st = tfo_transpose(L, y, 4, TO_NHWC, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

/* Conv2DBackpropInput(input_sizes, filter, out_backprop): the gradient of a
 * Conv2D with respect to its input, as ConvTranspose. The transposed conv
 * crops the forward conv's begin padding; the end is whatever makes the
 * output input_sizes (negative: output_padding). */
kiln_status tfo_lw_conv_backprop_input(L_t *L, const struct tf_op *e)
{
    (void)e;
    int w = -1, dy = -1, y = -1, n = -1;
    int64_t sizes[4];
    kiln_status st = tfo_need_const_ints(L, 0, sizes, 4, &n, "input_sizes");
    if (st == KILN_OK) st = tfo_in_value(L, 1, &w);
    if (st == KILN_OK) st = tfo_in_value(L, 2, &dy);
    if (st != KILN_OK) return st;
    if (n != 4) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "input_sizes has %d values, expected 4", n);
    struct conv_geom gm;
    if ((st = conv_geom(L, false, &gm)) != KILN_OK) return st;
    const struct kiln_type *wt = tfo_vtype(L, w);
    if (wt->rank != 4 || wt->dims[0] < 1 || wt->dims[1] < 1)
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "needs a filter of known shape");
    int64_t in_sp[2] = {sizes[gm.nchw ? 2 : 1], sizes[gm.nchw ? 3 : 2]};
    int64_t pads[4], opad[2];
    for (int i = 0; i < 2; i++) {
        int64_t k = (wt->dims[i] - 1) * gm.dil[i] + 1, s = gm.strides[i], h = in_sp[i];
        if (h < 1) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "input_sizes has a dim of %lld", (long long)h);
        int64_t pb, oh;
        if (!gm.auto_pad) {
            pb = gm.pads[i];
            oh = (h + gm.pads[i] + gm.pads[2 + i] - k) / s + 1;
        } else if (strcmp(gm.auto_pad, "VALID") == 0) {
            pb = 0;
            oh = (h - k) / s + 1;
        } else {
            oh = (h + s - 1) / s;
            int64_t total = (oh - 1) * s + k - h;
            pb = total > 0 ? total / 2 : 0;
        }
        if (oh < 1) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "the filter is larger than the input");
        int64_t pe = s * (oh - 1) + k - h - pb;
        pads[i] = pb;
        pads[2 + i] = pe > 0 ? pe : 0;
        opad[i] = pe < 0 ? -pe : 0;
    }
    static const int64_t HWIO_TO_OIHW[4] = {3, 2, 0, 1};
    if ((st = tfo_transpose(L, w, 4, HWIO_TO_OIHW, &w)) != KILN_OK) return st;
    if (!gm.nchw && (st = tfo_transpose(L, dy, 4, TO_NCHW, &dy)) != KILN_OK) return st;
    struct emit em;
    int in[2] = {dy, w};
    if ((st = tfo_node_begin(L, KILN_OP_ConvTranspose, 2, in, 1, 4, &em)) != KILN_OK) return st;
    if ((st = tfo_a_ints(&em, "strides", 2, gm.strides)) != KILN_OK) return st;
    if ((st = tfo_a_ints(&em, "dilations", 2, gm.dil)) != KILN_OK) return st;
    if ((st = tfo_a_ints(&em, "pads", 4, pads)) != KILN_OK) return st;
    if ((st = tfo_a_ints(&em, "output_padding", 2, opad)) != KILN_OK) return st;
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    if (!gm.nchw && (st = tfo_transpose(L, y, 4, TO_NHWC, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_pool(L_t *L, const struct tf_op *e)
{
    int x = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st != KILN_OK) return st;
    struct conv_geom gm;
    if ((st = conv_geom(L, true, &gm)) != KILN_OK) return st;
    if (!gm.nchw && (st = tfo_transpose(L, x, 4, TO_NCHW, &x)) != KILN_OK) return st;
    struct emit em;
    if ((st = tfo_node_begin(L, e->op, 1, &x, 1, 5, &em)) != KILN_OK) return st;
    if ((st = conv_attrs(&em, &gm, true)) != KILN_OK) return st;
    if (e->op == KILN_OP_AveragePool) tfo_a_int(&em, "count_include_pad", 0);
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    if (!gm.nchw && (st = tfo_transpose(L, y, 4, TO_NHWC, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

/* FusedBatchNorm in inference mode: y = x * s + (offset - mean * s), s = scale / sqrt(var + eps). */
kiln_status tfo_lw_fused_batch_norm(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1, scale = -1, offset = -1, mean = -1, var = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &scale);
    if (st == KILN_OK) st = tfo_in_value(L, 2, &offset);
    if (st == KILN_OK) st = tfo_in_value(L, 3, &mean);
    if (st == KILN_OK) st = tfo_in_value(L, 4, &var);
    if (st != KILN_OK) return st;
    if (tfo_attr_bool(L, "is_training", true))
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "training mode (is_training true) is not supported");
    const char *fmt = tfo_attr_str(L, "data_format", "NHWC");
    kiln_dtype dt = tfo_vtype(L, scale)->dtype != KILN_DTYPE_UNDEFINED ? tfo_vtype(L, scale)->dtype : KILN_DTYPE_F32;
    int eps = -1, t = -1, sq = -1, s = -1, ms = -1, b = -1, xs = -1, y = -1;
    if ((st = tfo_const_scalar(L, dt, tfo_attr_float(L, "epsilon", 1e-4f), &eps)) != KILN_OK) return st;
    if ((st = tfo_bin(L, KILN_OP_Add, var, eps, &t)) != KILN_OK) return st;
    if ((st = tfo_un(L, KILN_OP_Sqrt, t, &sq)) != KILN_OK) return st;
    if ((st = tfo_bin(L, KILN_OP_Div, scale, sq, &s)) != KILN_OK) return st;
    if ((st = tfo_bin(L, KILN_OP_Mul, mean, s, &ms)) != KILN_OK) return st;
    if ((st = tfo_bin(L, KILN_OP_Sub, offset, ms, &b)) != KILN_OK) return st;
    if (strcmp(fmt, "NCHW") == 0) {
        static const int64_t axes[2] = {1, 2};
        if ((st = tfo_axes_node(L, KILN_OP_Unsqueeze, s, 2, axes, &s)) != KILN_OK) return st;
        if ((st = tfo_axes_node(L, KILN_OP_Unsqueeze, b, 2, axes, &b)) != KILN_OK) return st;
    } else if (strcmp(fmt, "NHWC") != 0) {
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "data_format '%s' is not supported", fmt);
    }
    if (tfo_vtype(L, x)->dtype != dt && tfo_vtype(L, x)->dtype != KILN_DTYPE_UNDEFINED) {
        /* half inputs with float statistics */
        if ((st = tfo_cast_to(L, s, tfo_vtype(L, x)->dtype, &s)) != KILN_OK) return st;
        if ((st = tfo_cast_to(L, b, tfo_vtype(L, x)->dtype, &b)) != KILN_OK) return st;
    }
    if ((st = tfo_bin(L, KILN_OP_Mul, x, s, &xs)) != KILN_OK) return st;
    if ((st = tfo_bin(L, KILN_OP_Add, xs, b, &y)) != KILN_OK) return st;
    if ((st = tfo_set_outputs(L, 6)) != KILN_OK) return st;
    L->out[0].v = y;
    L->out[1].v = mean;
    L->out[2].v = var;
    L->out[3].v = mean;
    L->out[4].v = var;
    L->out[5].v = mean;
    return KILN_OK;
}
