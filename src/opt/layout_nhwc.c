/*
 * layout_nhwc.c - the channels-last part of the layout pass (layout.c): int8
 * convolution chains stored NHWC (graph.h, KILN_LAYOUT_NHWC), so oneDNN's
 * int8 convolutions (which run fast only on channels-last data; their
 * channel-blocked int8 code is its reference implementation) read and write
 * the plan's values directly instead of reordering at every node.
 *
 * Only on CPUs with AVX-512 VNNI, where the int8 kernel (src/kernels/dnnl/
 * qlinear.c) surely runs. Roles, on values the blocked pass left plain:
 *  - sources: QLinearConv with an 8-bit 4-D x and y, constant 4-D s8
 *    weights with zero points 0, constant scalar scales and zero points
 *    (per-channel weight scales) and an int32 bias: reads and writes NHWC;
 *  - followers (elementwise, so any storage order is the same to them): a
 *    QuantizeLinear / DequantizeLinear of a 4-D value with one scale and zero
 *    point, KilnQLinearAdd, a float Add or Mul of two same-shape 4-D values
 *    (the residual, SiLU's x * sigmoid(x)), a Relu, a Sigmoid, a Swish (the
 *    SiLU of src/opt/silu.c), a Clip with scalar bounds
 *    (src/kernels/simd/quant8.c, elementwise.c), an 8-bit
 *    MaxPool (dnnl/pool.c; ceil_mode too, where its extra right padding stays
 *    inside the window), and a float Mul by a per-channel [N or 1, C, 1, 1]
 *    value (squeeze-and-excitation, C <= 2048: elementwise.c treats channels
 *    last as one block of all C channels) following by its big input;
 *  - sinks: a float GlobalAveragePool reads its input channels last where it
 *    already is, and writes its [N, C, 1, 1] output plain (the same bytes);
 *  - KilnLut8 (src/opt/qlut.c: SiLU, a Sigmoid gate ... of an 8-bit value by
 *    a 256-entry table) follows like the elementwise ops; on a one-pixel
 *    [N, C, 1, 1] value (squeeze-and-excitation), where NHWC and NCHW are the
 *    same bytes, it and the pool before it read channels last wherever that is
 *    supplied and write either layout, so the SE's 1x1 convolutions, their
 *    tables and the pool chain without a reorder; KilnLut8Pool (the pool of a
 *    float table's values) likewise, and KilnLut8Mul (Q of a float table's
 *    values times a per-channel scale) follows by its 8-bit input as the
 *    per-channel Mul does.
 * KILN_NHWC=0 in the environment turns the channels-last part off.
 * As in the blocked pass, a value is NHWC when it is supplied NHWC (written by
 * a source, or by a follower with an NHWC data input) and demanded NHWC (read
 * by a source, or by a follower whose output is demanded); every other edge
 * gets a KilnReorder node (`from` / `to` 1 or 0), graph outputs stay plain.
 */
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "kernels/kernel.h"
#include "kernels/ref/gemm.h" /* kiln_window_resolve */
#include "opt/layout_nhwc.h"

/* A value that may be stored NHWC: 4-D, not captured by a subgraph, still plain. */
static int nhwc_value(const struct kiln_graph *g, const unsigned char *captured, int v, int q8)
{
    if (v < 0 || v >= g->n_values || (captured && captured[v])) return 0;
    const struct kiln_value *val = &g->values[v];
    if (val->layout || val->kind != KILN_VALUE_NODE || val->type.rank != 4) return 0;
    kiln_dtype d = val->type.dtype;
    return q8 ? d == KILN_DTYPE_U8 || d == KILN_DTYPE_I8 : d == KILN_DTYPE_F32;
}

static const kiln_tensor *konst(const struct kiln_graph *g, int v)
{
    if (v < 0 || v >= g->n_values || g->values[v].kind != KILN_VALUE_CONST) return NULL;
    return g->values[v].konst;
}

/* Input i of n: absent, or a constant scalar (one element) of dtype d (any if 0). */
static int scalar_or_absent(const struct kiln_graph *g, const struct kiln_node *n, int i, int d)
{
    if (i >= n->n_in || n->in[i] < 0) return 1;
    const kiln_tensor *t = konst(g, n->in[i]);
    return t && kiln_tensor_count(t) == 1 && t->rank <= 1 && (!d || (int)t->dtype == d);
}

static int is_source(const struct kiln_graph *g, const unsigned char *cap, const struct kiln_node *n)
{
    if (n->op != KILN_OP_QLinearConv || n->n_in < 8 || n->n_out != 1) return 0;
    if (!nhwc_value(g, cap, n->in[0], 1) || !nhwc_value(g, cap, n->out[0], 1)) return 0;
    const kiln_tensor *w = konst(g, n->in[3]), *ws = konst(g, n->in[4]);
    if (!w || w->dtype != KILN_DTYPE_I8 || w->rank != 4 || !ws || ws->dtype != KILN_DTYPE_F32)
        return 0;
    int64_t m = w->dims[0];
    if (kiln_tensor_count(ws) != 1 && kiln_tensor_count(ws) != m) return 0;
    if (n->in[5] >= 0) {
        const kiln_tensor *z = konst(g, n->in[5]);
        if (!z) return 0;
        for (int64_t i = 0; i < kiln_tensor_count(z); i++)
            if (kiln_get_i64(z->dtype, z->data, i) != 0) return 0;
    }
    if (n->in[1] < 0 || n->in[6] < 0 || !scalar_or_absent(g, n, 1, KILN_DTYPE_F32) ||
        !scalar_or_absent(g, n, 6, KILN_DTYPE_F32) || !scalar_or_absent(g, n, 2, 0) ||
        !scalar_or_absent(g, n, 7, 0))
        return 0;
    if (n->n_in > 8 && n->in[8] >= 0) {
        const struct kiln_type *b = &g->values[n->in[8]].type;
        if (b->dtype != KILN_DTYPE_I32 || kiln_shape_count(b->rank, b->dims) != m) return 0;
    }
    int64_t group = kiln_attr_int(n, "group", 1);
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return 0;
    }
    const struct kiln_type *x = &g->values[n->in[0]].type;
    return group >= 1 && x->dims[1] > 0 && x->dims[1] % group == 0 &&
           x->dims[1] / group == w->dims[1] && m % group == 0;
}

/* A float Mul of a 4-D value by a per-channel [N or 1, C, 1, 1] one (squeeze-and-excitation),
 * C at most 2048 (the elementwise kernel's channel tile): the index of the big input, else -1. */
static int chan_mul(const struct kiln_graph *g, const unsigned char *cap, const struct kiln_node *n)
{
    if (n->op != KILN_OP_Mul || n->opset < 7 || n->n_in != 2 || n->n_out != 1 || n->in[0] < 0 ||
        n->in[1] < 0 || !nhwc_value(g, cap, n->out[0], 0))
        return -1;
    const struct kiln_type *y = &g->values[n->out[0]].type;
    for (int k = 0; k < 2; k++) {
        if (!nhwc_value(g, cap, n->in[k], 0)) continue;
        const struct kiln_type *x = &g->values[n->in[k]].type, *v = &g->values[n->in[1 - k]].type;
        if (v->dtype != KILN_DTYPE_F32 || v->rank != 4 || x->dims[1] < 1 || x->dims[1] > 2048 ||
            v->dims[1] != x->dims[1] || v->dims[2] != 1 || v->dims[3] != 1 ||
            (v->dims[0] != 1 && v->dims[0] != x->dims[0]))
            continue;
        if (v->dims[0] < 0 && (!v->sym[0] || !x->sym[0] || strcmp(v->sym[0], x->sym[0])))
            continue; /* the same symbolic batch */
        if (x->dims[2] == 1 && x->dims[3] == 1) continue;
        int same = 1;
        for (int d = 0; d < 4; d++)
            if (x->dims[d] != y->dims[d] || (d && x->dims[d] < 0)) same = 0;
        if (same) return k;
    }
    return -1;
}

/* A float GlobalAveragePool reading a 4-D value: it may read channels last and write its
 * [N, C, 1, 1] output plain (src/kernels/dnnl/pool.c). */
static int is_sink(const struct kiln_graph *g, const unsigned char *cap, const struct kiln_node *n)
{
    return n->op == KILN_OP_GlobalAveragePool && n->n_in == 1 && n->n_out == 1 &&
           nhwc_value(g, cap, n->in[0], 0) && n->out[0] >= 0 &&
           g->values[n->out[0]].type.rank == 4;
}

/* A value of one pixel, [N, C, 1, 1]: channels last and plain are the same bytes. */
static int one_pixel(const struct kiln_graph *g, int v)
{
    const struct kiln_type *t = &g->values[v].type;
    return t->rank == 4 && t->dims[2] == 1 && t->dims[3] == 1;
}

/* A KilnLut8 (src/opt/qlut.c: a 256-entry table of an 8-bit value; elementwise, so any
 * storage order is the same to it) of a 4-D 8-bit value, writing 8-bit or float values. */
static int lut_node(const struct kiln_graph *g, const unsigned char *cap, const struct kiln_node *n)
{
    if (n->op != KILN_OP_KilnLut8 || n->n_in != 2 || n->n_out != 1 || n->in[0] < 0 ||
        n->out[0] < 0)
        return 0;
    const kiln_tensor *t = konst(g, n->in[1]);
    int x = n->in[0], y = n->out[0];
    if (!t || kiln_tensor_count(t) != 256 || !nhwc_value(g, cap, x, 1) ||
        !nhwc_value(g, cap, y, t->dtype != KILN_DTYPE_F32))
        return 0;
    const struct kiln_type *xt = &g->values[x].type, *yt = &g->values[y].type;
    for (int d = 0; d < 4; d++)
        if (xt->dims[d] != yt->dims[d] || (xt->dims[d] < 0 && d)) return 0;
    return yt->dims[0] >= 0 || (xt->sym[0] && yt->sym[0] && !strcmp(xt->sym[0], yt->sym[0]));
}

/* KilnLut8Pool (the pool of a float table's values, src/opt/qlut.c) of a 4-D 8-bit value:
 * reads channels last, writes [N, C, 1, 1] in either layout. */
static int lut_pool_node(const struct kiln_graph *g, const unsigned char *cap,
                         const struct kiln_node *n)
{
    return n->op == KILN_OP_KilnLut8Pool && n->n_in == 2 && n->n_out == 1 && n->out[0] >= 0 &&
           nhwc_value(g, cap, n->in[0], 1) && g->values[n->out[0]].type.rank == 4 &&
           one_pixel(g, n->out[0]);
}

/* KilnLut8Mul (Q(table[x] * s), s per channel: src/opt/qlut.c) of a 4-D 8-bit x with static
 * C, H, W into the same shape: follows by x as the per-channel Mul does. */
static int lut_mul_node(const struct kiln_graph *g, const unsigned char *cap,
                        const struct kiln_node *n)
{
    if (n->op != KILN_OP_KilnLut8Mul || n->n_in < 4 || n->n_out != 1 || n->in[0] < 0 ||
        n->in[2] < 0 || !nhwc_value(g, cap, n->in[0], 1) || !nhwc_value(g, cap, n->out[0], 1))
        return 0;
    const struct kiln_type *xt = &g->values[n->in[0]].type, *yt = &g->values[n->out[0]].type;
    for (int d = 0; d < 4; d++)
        if (xt->dims[d] != yt->dims[d] || (d && xt->dims[d] < 1)) return 0;
    return yt->dims[0] >= 0 || (xt->sym[0] && yt->sym[0] && !strcmp(xt->sym[0], yt->sym[0]));
}

static int is_follower(const struct kiln_graph *g, const unsigned char *cap, const struct kiln_node *n)
{
    if (n->n_out != 1 || n->n_in < 1) return 0;
    int x = n->in[0], y = n->out[0];
    if (n->op == KILN_OP_QuantizeLinear || n->op == KILN_OP_DequantizeLinear) {
        int q = n->op == KILN_OP_QuantizeLinear;
        if (!nhwc_value(g, cap, x, !q) || !nhwc_value(g, cap, y, q)) return 0;
        int64_t prec = kiln_attr_int(n, "precision", 0), sat = kiln_attr_int(n, "saturate", 1);
        int64_t block = kiln_attr_int(n, "block_size", 0);
        if (kiln_attr_check(n) != KILN_OK) {
            kiln_error_clear();
            return 0;
        }
        if ((prec != 0 && prec != 1) || sat != 1 || block != 0) return 0;
        int qd = (int)g->values[q ? y : x].type.dtype;
        return n->n_in >= 2 && n->in[1] >= 0 && scalar_or_absent(g, n, 1, KILN_DTYPE_F32) &&
               scalar_or_absent(g, n, 2, qd);
    }
    if (n->op == KILN_OP_KilnQLinearAdd) {
        if (n->n_in != 8 || !nhwc_value(g, cap, x, 1) || !nhwc_value(g, cap, n->in[3], 1) ||
            !nhwc_value(g, cap, y, 1))
            return 0;
        const struct kiln_type *at = &g->values[x].type, *bt = &g->values[n->in[3]].type;
        const struct kiln_type *yt = &g->values[y].type;
        for (int d = 0; d < 4; d++)
            if (at->dims[d] != yt->dims[d] || bt->dims[d] != yt->dims[d] || (yt->dims[d] < 0 && d))
                return 0;
        if (yt->dims[0] < 0 && (!at->sym[0] || !bt->sym[0] || !yt->sym[0] ||
                                strcmp(at->sym[0], yt->sym[0]) || strcmp(bt->sym[0], yt->sym[0])))
            return 0;
        const char *act = kiln_attr_str(n, "activation", "");
        return (!act[0] || !strcmp(act, "Relu")) && scalar_or_absent(g, n, 1, KILN_DTYPE_F32) &&
               scalar_or_absent(g, n, 4, KILN_DTYPE_F32) && scalar_or_absent(g, n, 6, KILN_DTYPE_F32) &&
               n->in[1] >= 0 && n->in[4] >= 0 && n->in[6] >= 0 &&
               scalar_or_absent(g, n, 2, (int)at->dtype) && scalar_or_absent(g, n, 5, (int)bt->dtype) &&
               scalar_or_absent(g, n, 7, (int)yt->dtype);
    }
    if (n->op == KILN_OP_MaxPool) { /* 8-bit, 2-D, a window oneDNN surely takes */
        if (n->n_in != 1 || (n->n_out > 1 && n->out[1] >= 0) || !nhwc_value(g, cap, x, 1) ||
            !nhwc_value(g, cap, y, 1) || g->values[x].type.dtype != g->values[y].type.dtype)
            return 0;
        const char *ap = kiln_attr_str(n, "auto_pad", "NOTSET");
        int64_t ceil_mode = kiln_attr_int(n, "ceil_mode", 0);
        const struct kiln_attr *k = kiln_node_attr(n, "kernel_shape");
        const struct kiln_attr *pads = kiln_node_attr(n, "pads");
        const struct kiln_attr *dil = kiln_node_attr(n, "dilations");
        if (kiln_attr_check(n) != KILN_OK) {
            kiln_error_clear();
            return 0;
        }
        if (strcmp(ap, "NOTSET") || !k || k->type != KILN_ATTR_INTS || k->n != 2) return 0;
        if (dil && (dil->type != KILN_ATTR_INTS || dil->n != 2 || dil->ints[0] != 1 ||
                    dil->ints[1] != 1))
            return 0;
        if (pads && (pads->type != KILN_ATTR_INTS || pads->n != 4)) return 0;
        for (int i = 0; pads && i < 4; i++)
            if (pads->ints[i] < 0 || pads->ints[i] >= k->ints[i % 2]) return 0;
        const struct kiln_type *xt = &g->values[x].type;
        if (xt->dims[2] <= 0 || xt->dims[3] <= 0) return 0;
        if (ceil_mode) { /* dnnl/pool.c's extra right padding: still less than the window */
            struct kiln_window w;
            if (kiln_window_resolve(n, 2, xt->dims + 2, NULL, 1, &w) != KILN_OK) {
                kiln_error_clear();
                return 0;
            }
            for (int i = 0; i < 2; i++) {
                int64_t pr = (w.out[i] - 1) * w.stride[i] + w.kernel[i] - w.in[i] - w.pad_begin[i];
                if (pr < w.pad_end[i]) pr = w.pad_end[i];
                if (pr >= w.kernel[i] || w.out[i] != g->values[y].type.dims[i + 2]) return 0;
            }
        }
        return 1;
    }
    if (!nhwc_value(g, cap, x, 0) || !nhwc_value(g, cap, y, 0)) return 0;
    const struct kiln_type *xt = &g->values[x].type, *yt = &g->values[y].type;
    for (int d = 0; d < 4; d++)
        if (xt->dims[d] != yt->dims[d] || (xt->dims[d] < 0 && d)) return 0;
    if (n->op == KILN_OP_Add || n->op == KILN_OP_Mul) {
        if (n->opset < 7 || n->n_in != 2 || !nhwc_value(g, cap, n->in[1], 0)) return 0;
        const struct kiln_type *bt = &g->values[n->in[1]].type;
        for (int d = 0; d < 4; d++)
            if (bt->dims[d] != yt->dims[d] || (bt->dims[d] < 0 && d)) return 0;
        /* a symbolic batch: the same name */
        if (yt->dims[0] < 0 && (!xt->sym[0] || !bt->sym[0] || !yt->sym[0] ||
                                strcmp(xt->sym[0], yt->sym[0]) || strcmp(bt->sym[0], yt->sym[0])))
            return 0;
        return 1;
    }
    if (yt->dims[0] < 0 && (!xt->sym[0] || !yt->sym[0] || strcmp(xt->sym[0], yt->sym[0])))
        return 0;
    if (n->op == KILN_OP_Relu || n->op == KILN_OP_Sigmoid || n->op == KILN_OP_Swish)
        return n->n_in == 1;
    if (n->op == KILN_OP_Clip) {
        for (int k = 1; k < n->n_in; k++)
            if (n->in[k] >= 0 && !scalar_or_absent(g, n, k, KILN_DTYPE_F32)) return 0;
        return 1;
    }
    return 0;
}

/* Roles: 1 source, 2 follower, 3 sink (reads channels last, writes plain), 4 / 5 a
 * per-channel Mul following by its input 0 / 1; 6 / 7 a sink / KilnLut8 whose output /
 * input is one pixel (the squeeze-and-excitation's pool, SiLU and gate): it reads its input
 * channels last wherever that is supplied so, and writes either layout (the same bytes). */
enum { R_SOURCE = 1, R_FOLLOWER, R_SINK, R_CHAN0, R_CHAN1, R_SINK1, R_LUT1 };

/* A role that demands input 0 channels last whatever its output's layout. */
static int reads_cl(int r) { return r == R_SOURCE || r == R_SINK || r == R_SINK1 || r == R_LUT1; }

/* Inputs of follower n (role r) that carry data. */
static int data_input(const struct kiln_node *n, int r, int i)
{
    if (r == R_CHAN0 || r == R_CHAN1) return i == r - R_CHAN0;
    if (n->op == KILN_OP_KilnQLinearAdd) return i == 0 || i == 3;
    return n->op == KILN_OP_Add || n->op == KILN_OP_Mul ? i < 2 : i == 0;
}

kiln_status kiln_opt_nhwc_mark(struct kiln_graph *g, const unsigned char *captured,
                              struct kiln_opt_pass_log *pl, unsigned char **role_out)
{
    *role_out = NULL;
    const char *isa = getenv("KILN_ISA");
    __builtin_cpu_init();
    const char *off = getenv("KILN_NHWC"); /* "0": off (tests compare with and without) */
    if ((isa && (!strcmp(isa, "scalar") || !strcmp(isa, "avx2"))) || (off && !strcmp(off, "0")) ||
        !__builtin_cpu_supports("avx512vnni"))
        return KILN_OK;
    int n_nodes = g->n_nodes, n_values = g->n_values;
    unsigned char *role = calloc((size_t)n_nodes + 1, 1);
    unsigned char *supply = calloc((size_t)n_values + 1, 1), *demand = calloc((size_t)n_values + 1, 1);
    if (!role || !supply || !demand) {
        free(role);
        free(supply);
        free(demand);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in the layout pass");
    }
    int any = 0;
    for (int p = 0; p < n_nodes; p++) {
        const struct kiln_node *pn = &g->nodes[p];
        if (kiln_opt_node_dead(pn)) continue;
        int big = chan_mul(g, captured, pn);
        if (is_source(g, captured, pn)) role[p] = R_SOURCE, any = 1;
        else if (big >= 0) role[p] = (unsigned char)(R_CHAN0 + big);
        else if (lut_mul_node(g, captured, pn)) role[p] = R_CHAN0;
        else if (lut_pool_node(g, captured, pn)) role[p] = R_SINK1;
        else if (lut_node(g, captured, pn))
            role[p] = one_pixel(g, pn->in[0]) ? R_LUT1 : R_FOLLOWER;
        else if (is_follower(g, captured, pn)) role[p] = R_FOLLOWER;
        else if (is_sink(g, captured, pn)) role[p] = one_pixel(g, pn->out[0]) ? R_SINK1 : R_SINK;
    }
    for (int changed = any; changed;) {
        changed = 0;
        for (int p = 0; p < n_nodes; p++) {
            const struct kiln_node *pn = &g->nodes[p];
            if (!role[p] || role[p] == R_SINK || supply[pn->out[0]]) continue;
            int s = role[p] == R_SOURCE;
            for (int i = 0; i < pn->n_in && !s; i++)
                if (pn->in[i] >= 0 && data_input(pn, role[p], i) && supply[pn->in[i]]) s = 1;
            if (s) changed = supply[pn->out[0]] = 1;
        }
        for (int c = 0; c < n_nodes; c++) {
            const struct kiln_node *cn = &g->nodes[c];
            if (!role[c]) continue;
            for (int i = 0; i < cn->n_in; i++) {
                int v = cn->in[i];
                if (v < 0 || demand[v]) continue;
                int d = reads_cl(role[c])
                            ? i == 0
                            : data_input(cn, role[c], i) && demand[cn->out[0]];
                if (d) changed = demand[v] = 1;
            }
        }
    }
    int count = 0;
    for (int p = 0; p < n_nodes; p++) {
        int v = g->nodes[p].out[0];
        if (role[p] && role[p] != R_SINK && supply[v] && demand[v]) {
            g->values[v].layout = KILN_LAYOUT_NHWC;
            count++;
        }
    }
    if (pl)
        for (int i = 0; i < count; i++) kiln_opt_count(pl, "channels-last value");
    free(supply);
    free(demand);
    if (count) *role_out = role;
    else free(role);
    return KILN_OK;
}

/* The layout node c (with role `role`: 0 none, 1 source, 2 follower) wants for input i. */
int kiln_opt_nhwc_wanted(const struct kiln_graph *g, int c, int role, int i)
{
    const struct kiln_node *n = &g->nodes[c];
    int out = n->n_out > 0 && n->out[0] >= 0 ? g->values[n->out[0]].layout : 0;
    if (role == R_SOURCE) return i == 0 ? KILN_LAYOUT_NHWC : 0;
    if (role == R_SINK || role == R_SINK1 || role == R_LUT1) /* where it is channels last anyway */
        return i == 0 && g->values[n->in[0]].layout == KILN_LAYOUT_NHWC ? KILN_LAYOUT_NHWC : 0;
    if (role) return data_input(n, role, i) && out == KILN_LAYOUT_NHWC ? KILN_LAYOUT_NHWC : 0;
    return 0;
}
