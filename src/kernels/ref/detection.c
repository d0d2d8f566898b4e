/*
 * detection.c - reference kernels for object-detection ops: RoiAlign and
 * NonMaxSuppression.
 *
 * RoiAlign pools each region of interest into an output_height x
 * output_width grid; each bin averages (or, for mode "max", takes the
 * largest weighted corner of) sampling_ratio^2 bilinear samples, as in
 * onnx/reference/ops/op_roi_align.py. coordinate_transformation_mode
 * "half_pixel" (default from opset 16) shifts the roi by half a pixel;
 * "output_half_pixel" (opset 10's behavior) does not and forces rois to be
 * at least 1x1.
 *
 * NonMaxSuppression greedily keeps, per batch and class, the highest-scoring
 * boxes whose score is above score_threshold and whose IoU with every box
 * already kept is at most iou_threshold, up to max_output_boxes_per_class.
 * Equal scores keep the lower box index first. Its output size depends on
 * the data, so the kernel allocates it (DYNOUT).
 */
#include <stdlib.h>

#include "kernels/kernel.h"

/* ---- RoiAlign ---- */

/* Shape function: [num_rois, C, output_height, output_width]. */
static kiln_status roialign_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_type *x = ctx->in[0], *rois = ctx->in[1], *bi = ctx->in[2];
    if (!ctx->out[0] || !x) return KILN_OK;
    int64_t oh = kiln_attr_int(n, "output_height", 1), ow = kiln_attr_int(n, "output_width", 1);
    if (oh <= 0 || ow <= 0)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "output_height %lld / output_width %lld must be positive",
                               (long long)oh, (long long)ow);
    if (x->rank >= 0 && x->rank != 4)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "X has rank %d, expected 4",
                               x->rank);
    int64_t nr = -1;
    if (bi && bi->rank == 1) nr = bi->dims[0];
    else if (rois && rois->rank == 2) nr = rois->dims[0];
    int64_t dims[4] = {nr, x->rank == 4 ? x->dims[1] : -1, oh, ow};
    kiln_type_set(ctx->out[0], x->dtype, 4, dims);
    return KILN_OK;
}

/* Bilinear sample point: four flat positions and weights (all zero when outside). */
struct roi_sample {
    int64_t pos[4];
    double w[4];
};

/* Compute the sample at (y, x) of an H x W map, the way the ONNX reference does. */
static void roi_sample_at(double y, double x, int64_t H, int64_t W, struct roi_sample *s)
{
    memset(s, 0, sizeof *s);
    /* outside (or NaN): no contribution */
    if (H <= 0 || W <= 0 || !(y >= -1.0 && y <= (double)H && x >= -1.0 && x <= (double)W))
        return;
    if (y < 0) y = 0;
    if (x < 0) x = 0;
    int64_t y_lo = (int64_t)y, x_lo = (int64_t)x, y_hi, x_hi;
    if (y_lo >= H - 1) {
        y_hi = y_lo = H - 1;
        y = (double)y_lo;
    } else {
        y_hi = y_lo + 1;
    }
    if (x_lo >= W - 1) {
        x_hi = x_lo = W - 1;
        x = (double)x_lo;
    } else {
        x_hi = x_lo + 1;
    }
    double ly = y - (double)y_lo, lx = x - (double)x_lo, hy = 1 - ly, hx = 1 - lx;
    s->pos[0] = y_lo * W + x_lo;
    s->pos[1] = y_lo * W + x_hi;
    s->pos[2] = y_hi * W + x_lo;
    s->pos[3] = y_hi * W + x_hi;
    s->w[0] = hy * hx;
    s->w[1] = hy * lx;
    s->w[2] = ly * hx;
    s->w[3] = ly * lx;
}

/* Run RoiAlign. */
static kiln_status roialign_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *X = ctx->in[0], *rois = ctx->in[1], *bi = ctx->in[2];
    kiln_tensor *Y = ctx->out[0];
    const char *mode = kiln_attr_str(n, "mode", "avg");
    bool is_max;
    if (strcmp(mode, "avg") == 0) is_max = false;
    else if (strcmp(mode, "max") == 0) is_max = true;
    else return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "mode '%s' is not avg or max", mode);
    const char *ctm = kiln_attr_str(n, "coordinate_transformation_mode",
                                    n->opset >= 16 ? "half_pixel" : "output_half_pixel");
    bool half_pixel;
    if (strcmp(ctm, "half_pixel") == 0) half_pixel = true;
    else if (strcmp(ctm, "output_half_pixel") == 0) half_pixel = false;
    else
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "coordinate_transformation_mode '%s' is not supported", ctm);
    int64_t OH = kiln_attr_int(n, "output_height", 1), OW = kiln_attr_int(n, "output_width", 1);
    int64_t sampling = kiln_attr_int(n, "sampling_ratio", 0);
    double spatial_scale = kiln_attr_float(n, "spatial_scale", 1.0f);
    if (sampling < 0)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "sampling_ratio %lld is negative",
                               (long long)sampling);

    if (!kiln_dtype_is_float(X->dtype) || !kiln_dtype_is_float(rois->dtype))
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "dtypes %s / %s are not supported",
                               kiln_dtype_name(X->dtype), kiln_dtype_name(rois->dtype));
    if (X->rank != 4)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "X has rank %d, expected 4",
                               X->rank);
    int64_t NR = bi->rank == 1 ? bi->dims[0] : -1;
    if (rois->rank != 2 || rois->dims[1] != 4 || rois->dims[0] != NR ||
        !kiln_dtype_is_int(bi->dtype))
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "rois must be [num_rois, 4] and batch_indices int [num_rois]");
    int64_t N = X->dims[0], C = X->dims[1], H = X->dims[2], W = X->dims[3];
    if (Y->rank != 4 || Y->dims[0] != NR || Y->dims[1] != C || Y->dims[2] != OH || Y->dims[3] != OW)
        return kiln_node_error(n, KILN_ERR_INTERNAL, "output shape mismatch");

    for (int64_t r = 0; r < NR; r++) {
        int64_t b = kiln_tensor_i64(bi, r);
        if (b < 0 || b >= N)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "batch_indices[%lld] = %lld is outside [0, %lld)",
                                   (long long)r, (long long)b, (long long)N);
        double off = half_pixel ? 0.5 : 0.0;
        double x0 = kiln_tensor_f64(rois, r * 4 + 0) * spatial_scale - off;
        double y0 = kiln_tensor_f64(rois, r * 4 + 1) * spatial_scale - off;
        double x1 = kiln_tensor_f64(rois, r * 4 + 2) * spatial_scale - off;
        double y1 = kiln_tensor_f64(rois, r * 4 + 3) * spatial_scale - off;
        double rw = x1 - x0, rh = y1 - y0;
        if (!half_pixel) {
            rw = fmax(rw, 1.0);
            rh = fmax(rh, 1.0);
        }
        double bh = rh / (double)OH, bw = rw / (double)OW;
        /* samples per bin and axis; an empty, inverted or NaN roi gets none */
        double ghd = sampling > 0 ? (double)sampling : ceil(rh / (double)OH);
        double gwd = sampling > 0 ? (double)sampling : ceil(rw / (double)OW);
        if (!(ghd >= 0)) ghd = 0;
        if (!(gwd >= 0)) gwd = 0;
        if (ghd > 65536 || gwd > 65536)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "roi %lld needs a %gx%g sampling grid per bin", (long long)r,
                                   ghd, gwd);
        int64_t gh = (int64_t)ghd, gw = (int64_t)gwd;
        double count = (double)(gh * gw > 1 ? gh * gw : 1);
        for (int64_t c = 0; c < C; c++) {
            const int64_t xb = (b * C + c) * H * W;
            for (int64_t ph = 0; ph < OH; ph++)
                for (int64_t pw = 0; pw < OW; pw++) {
                    double val = 0;
                    bool first = true;
                    for (int64_t iy = 0; iy < gh; iy++) {
                        double yy = y0 + (double)ph * bh + ((double)iy + 0.5) * bh / (double)gh;
                        for (int64_t ix = 0; ix < gw; ix++) {
                            double xx =
                                x0 + (double)pw * bw + ((double)ix + 0.5) * bw / (double)gw;
                            struct roi_sample s;
                            roi_sample_at(yy, xx, H, W, &s);
                            double v[4];
                            for (int q = 0; q < 4; q++)
                                v[q] = s.w[q] * kiln_get_f64(X->dtype, X->data, xb + s.pos[q]);
                            if (!is_max) {
                                val += v[0] + v[1] + v[2] + v[3];
                            } else {
                                double m = fmax(fmax(v[0], v[1]), fmax(v[2], v[3]));
                                val = first ? m : fmax(val, m);
                                first = false;
                            }
                        }
                    }
                    if (!is_max) val /= count;
                    kiln_set_f64(Y->dtype, Y->data, ((r * C + c) * OH + ph) * OW + pw, val);
                }
        }
    }
    return KILN_OK;
}

KILN_REF_OP(RoiAlign, roialign_infer, roialign_run);

/* ---- NonMaxSuppression ---- */

/* Shape function: [num_selected, 3] int64, num_selected known only at run time. */
static kiln_status nms_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    int64_t dims[2] = {-1, 3};
    kiln_type_set(ctx->out[0], KILN_DTYPE_I64, 2, dims);
    return KILN_OK;
}

/* A candidate box of one class: score and index into the batch's boxes. */
struct nms_cand {
    double score;
    int64_t index;
};

/* Sort by score descending, then index ascending. */
static int nms_cmp(const void *pa, const void *pb)
{
    const struct nms_cand *a = pa, *b = pb;
    if (a->score > b->score) return -1;
    if (a->score < b->score) return 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* Corners (y_min, x_min, y_max, x_max) of box i of a batch's boxes. */
static void nms_box(const kiln_tensor *boxes, int64_t base, bool center, double *out)
{
    double v[4];
    for (int q = 0; q < 4; q++) v[q] = kiln_get_f64(boxes->dtype, boxes->data, base + q);
    if (center) {
        /* [x_center, y_center, width, height] */
        out[0] = v[1] - v[3] / 2;
        out[1] = v[0] - v[2] / 2;
        out[2] = v[1] + v[3] / 2;
        out[3] = v[0] + v[2] / 2;
    } else {
        /* [y1, x1, y2, x2], either corner pair */
        out[0] = fmin(v[0], v[2]);
        out[1] = fmin(v[1], v[3]);
        out[2] = fmax(v[0], v[2]);
        out[3] = fmax(v[1], v[3]);
    }
}

/* Whether boxes a and b overlap by more than the threshold. */
static bool nms_suppress(const double *a, const double *b, double iou_threshold)
{
    double ih = fmin(a[2], b[2]) - fmax(a[0], b[0]);
    double iw = fmin(a[3], b[3]) - fmax(a[1], b[1]);
    if (ih <= 0 || iw <= 0) return false;
    double inter = ih * iw;
    double area_a = (a[2] - a[0]) * (a[3] - a[1]), area_b = (b[2] - b[0]) * (b[3] - b[1]);
    double uni = area_a + area_b - inter;
    if (area_a <= 0 || area_b <= 0 || uni <= 0) return false;
    return inter / uni > iou_threshold;
}

/* Run NonMaxSuppression; allocates the [num_selected, 3] output. */
static kiln_status nms_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *boxes = ctx->in[0], *scores = ctx->in[1];
    const kiln_tensor *t_max = ctx->n_in > 2 ? ctx->in[2] : NULL;
    const kiln_tensor *t_iou = ctx->n_in > 3 ? ctx->in[3] : NULL;
    const kiln_tensor *t_score = ctx->n_in > 4 ? ctx->in[4] : NULL;
    int64_t cpb = kiln_attr_int(n, "center_point_box", 0);
    if (cpb != 0 && cpb != 1)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "center_point_box %lld is not 0 or 1",
                               (long long)cpb);
    if (!kiln_dtype_is_float(boxes->dtype) || !kiln_dtype_is_float(scores->dtype))
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "dtypes %s / %s are not supported",
                               kiln_dtype_name(boxes->dtype), kiln_dtype_name(scores->dtype));
    if (boxes->rank != 3 || boxes->dims[2] != 4 || scores->rank != 3 ||
        scores->dims[0] != boxes->dims[0] || scores->dims[2] != boxes->dims[1]) {
        char b1[96], b2[96];
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "boxes %s and scores %s must be [B, N, 4] and [B, C, N]",
                               kiln_shape_str(boxes->rank, boxes->dims, b1, sizeof b1),
                               kiln_shape_str(scores->rank, scores->dims, b2, sizeof b2));
    }
    /* the scalar inputs may be empty or absent */
    int64_t max_out = 0;
    double iou_th = 0, score_th = 0;
    bool use_score = false;
    if (t_max && kiln_shape_count(t_max->rank, t_max->dims) > 0) {
        if (!kiln_dtype_is_int(t_max->dtype))
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "max_output_boxes_per_class has dtype %s",
                                   kiln_dtype_name(t_max->dtype));
        max_out = kiln_tensor_i64(t_max, 0);
    }
    if (t_iou && kiln_shape_count(t_iou->rank, t_iou->dims) > 0) iou_th = kiln_tensor_f64(t_iou, 0);
    if (t_score && kiln_shape_count(t_score->rank, t_score->dims) > 0) {
        score_th = kiln_tensor_f64(t_score, 0);
        use_score = true;
    }
    if (iou_th < 0 || iou_th > 1)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "iou_threshold %g is outside [0, 1]",
                               iou_th);

    int64_t B = boxes->dims[0], NB = boxes->dims[1], NC = scores->dims[1];
    if (max_out < 0) max_out = 0;
    if (max_out > NB) max_out = NB;
    kiln_status st = KILN_OK;
    struct nms_cand *cand = malloc((size_t)(NB + 1) * sizeof *cand);
    double *corners = malloc((size_t)(NB * 4 + 1) * sizeof *corners);
    int64_t *kept = malloc((size_t)(NB + 1) * sizeof *kept);
    /* selected triples, grown as needed */
    int64_t *sel = NULL, n_sel = 0, cap_sel = 0;
    if (!cand || !corners || !kept) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory for NonMaxSuppression");
        goto out_free;
    }
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i < NB; i++)
            nms_box(boxes, (b * NB + i) * 4, cpb == 1, corners + i * 4);
        for (int64_t c = 0; c < NC; c++) {
            int64_t nc = 0, nk = 0;
            for (int64_t i = 0; i < NB; i++) {
                double s = kiln_get_f64(scores->dtype, scores->data, (b * NC + c) * NB + i);
                if (isnan(s) || (use_score && !(s > score_th))) continue;
                cand[nc].score = s;
                cand[nc].index = i;
                nc++;
            }
            qsort(cand, (size_t)nc, sizeof *cand, nms_cmp);
            for (int64_t q = 0; q < nc && nk < max_out; q++) {
                const double *bx = corners + cand[q].index * 4;
                bool drop = false;
                for (int64_t j = 0; j < nk && !drop; j++)
                    drop = nms_suppress(corners + kept[j] * 4, bx, iou_th);
                if (drop) continue;
                kept[nk++] = cand[q].index;
                if (n_sel == cap_sel) {
                    int64_t ncap = cap_sel ? cap_sel * 2 : 64;
                    int64_t *ns = realloc(sel, (size_t)ncap * 3 * sizeof *ns);
                    if (!ns) {
                        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory for NMS output");
                        goto out_free;
                    }
                    sel = ns;
                    cap_sel = ncap;
                }
                sel[n_sel * 3 + 0] = b;
                sel[n_sel * 3 + 1] = c;
                sel[n_sel * 3 + 2] = cand[q].index;
                n_sel++;
            }
        }
    }
    int64_t dims[2] = {n_sel, 3};
    kiln_tensor *out;
    st = kiln_tensor_new(KILN_DTYPE_I64, 2, dims, &out);
    if (st != KILN_OK) goto out_free;
    if (n_sel > 0) memcpy(out->data, sel, (size_t)n_sel * 3 * sizeof *sel);
    ctx->out[0] = out;

out_free:
    free(cand);
    free(corners);
    free(kept);
    free(sel);
    return st;
}

KILN_REF_OP(NonMaxSuppression, nms_infer, nms_run);
