/*
 * static_quant.h - static int8 quantization of a float graph from calibrated
 * activation ranges (static_quant.c; the public API is kiln_calibration_* in
 * kiln.h, src/api/calibration.c; docs/COMPRESSION.md, "Static calibration").
 *
 * A histogram collects one activation's values over the calibration batches;
 * a method turns it into a range [lo, hi] (lo <= 0 <= hi). The graph rewrite
 * then writes the model in ONNX's QDQ form (QuantizeLinear / DequantizeLinear
 * with those ranges around each Conv, Gemm and MatMul with constant weights,
 * weights symmetric s8 per output channel, biases int32), which the
 * optimizer's qdq_fusion pass (qdq.c) turns into int8 kernels.
 */
#ifndef KILN_OPT_STATIC_QUANT_H
#define KILN_OPT_STATIC_QUANT_H

#include <stdint.h>

#include "ir/graph.h"

#define KILN_CALIB_BINS 2048

/* Values seen for one activation: min, max, and a histogram of |x| over
 * [0, range] in KILN_CALIB_BINS bins (re-binned when a batch exceeds range). */
struct kiln_calib_hist {
    double min, max;
    double range;
    int64_t seen;
    double bins[KILN_CALIB_BINS];
};

void kiln_calib_hist_init(struct kiln_calib_hist *h);
void kiln_calib_hist_add(struct kiln_calib_hist *h, const float *x, int64_t n);
/* The range by method (0 MinMax, 1 percentile, 2 entropy): see static_quant.c. */
void kiln_calib_hist_range(const struct kiln_calib_hist *h, int method, double percentile,
                           float *lo, float *hi);

/* A node static quantization handles, and the values it needs ranges of. */
struct kiln_sq_target {
    int node;        /* Conv, Gemm or MatMul, or a residual Add */
    int x;           /* its float input (Add: the first) */
    int y;           /* the value quantized after it: its output, or its Relu's */
    int relu;        /* the Relu node between, or -1 */
    int x2;          /* Add: its second float input; else -1 */
    int float_out;   /* y stays float: a node kept in fp32 reads it (calibration's
                        exclusions); its consumers that are quantized wrap their own input */
};

/* The targets of g (caller frees *out). */
kiln_status kiln_sq_targets(const struct kiln_graph *g, struct kiln_sq_target **out, int *n);
/* Rewrite g into QDQ form: range[v] = {lo, hi} for every x and y of the targets (indexed by
 * value id; other entries unused). g is left verified. */
kiln_status kiln_sq_rewrite(struct kiln_graph *g, const struct kiln_sq_target *t, int n,
                            const float (*range)[2]);

#endif
