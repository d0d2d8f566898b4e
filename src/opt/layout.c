/*
 * layout.c - the layout pass: store the activations of convolutional
 * networks with their channels blocked (graph.h, kiln_value.layout), so the
 * oneDNN kernels run their blocked code paths without reordering at every
 * node.
 *
 * The block is 16 on CPUs with AVX-512, 8 with AVX2, and the pass does
 * nothing otherwise (KILN_ISA=avx2|scalar in the environment lowers it, as
 * for the kernels). Nodes play one of two roles for a 4-D float32 value:
 *  - sources choose blocked storage for their own reasons: Conv /
 *    KilnFusedConv / ConvTranspose, pooling, and the per-channel binary ops
 *    of squeeze-and-excitation (their fast kernels write blocked output,
 *    kiln_fast_accepts_blocked);
 *  - followers work on blocked data as on plain, so their output takes their
 *    data inputs' layout: unary elementwise ops and activations, binary ops
 *    of two same-shape inputs (residual Adds, SiLU's Mul), Concat along any
 *    axis (along C off the blocks, copied lane by lane), Slice with constant
 *    arguments (the batch whole), Gather of channels by constant indices,
 *    constant Pad of H and W, Resize / Upsample of H and W by constant
 *    scales or sizes, and InstanceNormalization / GroupNormalization /
 *    KilnGroupNorm (their scale and bias read plain) (is_follower; the kernels in src/kernels/simd
 *    slice.c, data.c, concat.c, pad.c, resize.c, norm.c). A channel shuffle (Reshape,
 *    Transpose, Reshape) is first rewritten as a Gather of channels
 *    (layout_shuffle.c), and a Split along C, H or W as one Slice per
 *    piece. Ops without a blocked kernel (Reshape, Transpose, ...) read
 *    plain data.
 * A value is blocked when it is supplied blocked (written by a source, or by
 * a follower with a blocked data input) and demanded blocked (read by a
 * source that wants it, or by a follower whose output is demanded); both
 * spread through chains of followers to a fixed point, so no list of chains
 * is written down. Then every edge where the layouts disagree gets a
 * KilnReorder node (shared by the consumers that want the same layout of a
 * value), which is where a layout really changes:
 *  - a consumer that does not read blocked input (Flatten, Softmax, ...);
 *  - a follower's other data inputs (a plain graph input into a blocked
 *    Concat);
 *  - a graph output (its value keeps its id and stays plain: the producer
 *    writes a new blocked value, and a KilnReorder writes the output);
 *  - KilnFusedConv's Sum, which must match Y's layout;
 *  - a pool's input, which oneDNN pools fastest in its output's layout; but
 *    where the pool's output is at most half its input (GlobalAveragePool
 *    before a Flatten), the output is blocked and the reorder follows it
 *    (the cheaper edge, counted in the log);
 *  - a plain value with at least `block` channels entering a blocked
 *    convolution (a reorder costs far less than a plain convolution). The
 *    first convolution of a network (few input channels) reads its plain
 *    input directly and writes blocked output.
 * A convolution the pass leaves in plain layouts is not left slow: its
 * kernel (src/kernels/dnnl/conv.c) asks oneDNN for its preferred formats
 * and reorders at its own edges where the plain implementation is a
 * fallback. Values captured by subgraphs stay plain. Convolutions are
 * blocked only where their fast kernel surely runs (constant 4-D weights),
 * since the reference kernels read plain storage only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/fast.h"
#include "kernels/ref/resample.h"
#include "kernels/simd/pad.h"
#include "opt/layout_nhwc.h"
#include "opt/layout_shuffle.h"
#include "opt/opt.h"

/* The channel block for this CPU: 16, 8 or 0. */
static int pick_block(void)
{
    const char *isa = getenv("KILN_ISA");
    if (isa && !strcmp(isa, "scalar")) return 0;
    __builtin_cpu_init();
    if (!(isa && !strcmp(isa, "avx2")) && __builtin_cpu_supports("avx512f")) return 16;
    if (__builtin_cpu_supports("avx2")) return 8;
    return 0;
}

static int is_conv(const struct kiln_node *n)
{
    return n->op == KILN_OP_Conv || n->op == KILN_OP_KilnFusedConv ||
           n->op == KILN_OP_ConvTranspose || n->op == KILN_OP_KilnFusedConvTranspose;
}

static int is_pool(const struct kiln_node *n)
{
    return n->op == KILN_OP_MaxPool || n->op == KILN_OP_AveragePool ||
           n->op == KILN_OP_GlobalAveragePool || n->op == KILN_OP_GlobalMaxPool;
}

/* A binary op of a 4-D tensor and a per-channel [N or 1, C, 1, 1] one (the
 * squeeze-and-excitation scale of EfficientNet / MobileNetV3) or a [C, 1, 1]
 * one (ConvNeXt's layer scale): the big input
 * and the output may be blocked, the small one stays plain. *big = its index. */
static int is_chanop(const struct kiln_graph *g, const struct kiln_node *n, int *big)
{
    if ((n->op != KILN_OP_Mul && n->op != KILN_OP_Add && n->op != KILN_OP_Sub &&
         n->op != KILN_OP_Div) ||
        n->n_in != 2 || n->n_out != 1 || n->in[0] < 0 || n->in[1] < 0)
        return 0;
    for (int k = 0; k < 2; k++) {
        const struct kiln_type *x = &g->values[n->in[k]].type, *v = &g->values[n->in[1 - k]].type;
        if (x->rank != 4 || (v->rank != 4 && v->rank != 3) || x->dtype != KILN_DTYPE_F32 ||
            v->dtype != KILN_DTYPE_F32)
            continue;
        int o = v->rank - 3; /* where v's C is: [C,1,1] is a layer scale */
        if (x->dims[1] <= 0 || v->dims[o] != x->dims[1] || v->dims[o + 1] != 1 ||
            v->dims[o + 2] != 1)
            continue;
        if (x->dims[2] == 1 && x->dims[3] == 1) continue; /* both per-channel */
        if (v->rank == 4 && v->dims[0] != 1 && v->dims[0] != x->dims[0]) continue;
        *big = k;
        return 1;
    }
    return 0;
}

/* A value that may be blocked: a 4-D float32 tensor not captured by a subgraph. */
static int act_value(const struct kiln_graph *g, const unsigned char *captured, int v)
{
    if (v < 0 || v >= g->n_values || (captured && captured[v])) return 0;
    const struct kiln_type *t = &g->values[v].type;
    return t->dtype == KILN_DTYPE_F32 && t->rank == 4;
}

/* Whether dim i of x and y is surely the same: equal sizes, or one named symbolic
 * dim (the batch: the pass runs before a plan binds the input shapes). */
static int same_dim(const struct kiln_type *x, const struct kiln_type *y, int i)
{
    if (x->dims[i] != y->dims[i]) return 0;
    return x->dims[i] >= 0 || (x->sym[i] && y->sym[i] && !strcmp(x->sym[i], y->sym[i]));
}

static int same_dims(const struct kiln_graph *g, int a, int b)
{
    const struct kiln_type *x = &g->values[a].type, *y = &g->values[b].type;
    if (x->rank != y->rank) return 0;
    for (int i = 0; i < x->rank; i++)
        if (!same_dim(x, y, i)) return 0;
    return 1;
}

/* A constant 1-D int32 / int64 tensor: its entries (at most 4 unless big), else -1. */
static int64_t const_ints(const struct kiln_graph *g, int v, int64_t *out, int64_t cap)
{
    if (v < 0 || g->values[v].kind != KILN_VALUE_CONST || !g->values[v].konst) return -1;
    const kiln_tensor *t = g->values[v].konst;
    if ((t->dtype != KILN_DTYPE_I64 && t->dtype != KILN_DTYPE_I32) || t->rank != 1 ||
        t->dims[0] > cap)
        return -1;
    for (int64_t i = 0; i < t->dims[0]; i++)
        out[i] = t->dtype == KILN_DTYPE_I64 ? ((const int64_t *)t->data)[i]
                                            : ((const int32_t *)t->data)[i];
    return t->dims[0];
}

/* A Slice or Gather whose fast kernel surely runs on blocked data (simd/slice.c,
 * simd/data.c): a Slice with constant arguments (opset 10+) that leaves the batch
 * whole, or a Gather of channels (axis 1) by constant 1-D indices within C. */
static int picks_constant(const struct kiln_graph *g, const struct kiln_node *n)
{
    const struct kiln_type *x = &g->values[n->in[0]].type;
    if (n->op == KILN_OP_Gather) {
        int64_t axis = kiln_attr_int(n, "axis", 0), c = x->dims[1];
        if ((axis != 1 && axis != -3) || n->n_in != 2 || c <= 0) return 0;
        const kiln_tensor *t = g->values[n->in[1]].kind == KILN_VALUE_CONST
                                   ? g->values[n->in[1]].konst
                                   : NULL;
        if (!t || t->rank != 1 || (t->dtype != KILN_DTYPE_I64 && t->dtype != KILN_DTYPE_I32))
            return 0;
        for (int64_t i = 0; i < t->dims[0]; i++) {
            int64_t v = t->dtype == KILN_DTYPE_I64 ? ((const int64_t *)t->data)[i]
                                                   : ((const int32_t *)t->data)[i];
            if (v < -c || v >= c) return 0;
        }
        return 1;
    }
    if (n->opset < 10 || n->n_in < 3) return 0;
    int64_t a[4], axes[4] = {0, 1, 2, 3}, steps[4] = {1, 1, 1, 1};
    int64_t k = const_ints(g, n->in[1], a, 4);
    if (k < 0 || const_ints(g, n->in[2], a, 4) != k) return 0;
    if (n->n_in > 3 && n->in[3] >= 0 && const_ints(g, n->in[3], axes, 4) != k) return 0;
    if (n->n_in > 4 && n->in[4] >= 0 && const_ints(g, n->in[4], steps, 4) != k) return 0;
    for (int64_t i = 0; i < k; i++)
        if (axes[i] == 0 || axes[i] == -4 || steps[i] == 0) return 0;
    return 1;
}

/* A Resize / Upsample whose fast kernel surely runs on blocked data (simd/resize.c):
 * constant roi / scales / sizes, N and C unchanged, taps the kernel takes. The taps
 * of H and W do not depend on the batch, so a symbolic one is checked as 1. */
static int resize_constant(const struct kiln_graph *g, const struct kiln_node *n)
{
    int up = n->op == KILN_OP_Upsample;
    const struct kiln_type *x = &g->values[n->in[0]].type;
    const kiln_tensor *in[4] = {NULL, NULL, NULL, NULL};
    for (int i = 1; i < n->n_in && i < 4; i++) {
        if (n->in[i] < 0) continue;
        if (g->values[n->in[i]].kind != KILN_VALUE_CONST || !g->values[n->in[i]].konst) return 0;
        in[i] = g->values[n->in[i]].konst;
    }
    const kiln_tensor *roi = NULL, *scales = in[1], *sizes = NULL;
    if (!up && n->opset >= 11) {
        roi = in[1];
        scales = in[2];
        sizes = in[3];
    }
    int64_t xd[4], od[4];
    for (int d = 0; d < 4; d++) xd[d] = x->dims[d];
    if (xd[0] < 0 && x->sym[0]) xd[0] = 1;
    for (int d = 0; d < 4; d++)
        if (xd[d] <= 0) return 0;
    struct kiln_resize_axis h, w;
    if (!kiln_resize_hw(n, up, xd, roi, scales, sizes, KILN_RESIZE_FAST_TAPS, od, &h, &w))
        return 0;
    kiln_resize_axis_free(&h);
    kiln_resize_axis_free(&w);
    return 1;
}

/* A node that works on blocked data as on plain (a "follower": its output takes its
 * data inputs' layout, and all of them must share it): a unary elementwise op, a
 * binary one of two same-shape inputs, or a Concat along N, H or W, or along C
 * when every input but the last holds whole blocks. Its kernel must say so too. */
static int is_follower(const struct kiln_graph *g, const unsigned char *captured,
                       const struct kiln_node *n, int block)
{
    int big;
    if (is_conv(n) || is_pool(n) || is_chanop(g, n, &big)) return 0;
    if (n->n_out < 1 || !act_value(g, captured, n->out[0])) return 0;
    for (int k = 1; k < n->n_out; k++)
        if (n->out[k] >= 0) return 0;
    if (!kiln_fast_accepts_blocked(n, 0, block)) return 0;
    int y = n->out[0];
    if (n->op == KILN_OP_Slice || n->op == KILN_OP_Gather)
        return act_value(g, captured, n->in[0]) && picks_constant(g, n);
    if (n->op == KILN_OP_Pad) {
        int64_t a[4];
        float fill;
        const kiln_tensor *pads = n->n_in > 1 ? kiln_opt_const(g, n->in[1]) : NULL;
        int has_value = n->n_in > 2 && n->in[2] >= 0, has_axes = n->n_in > 3 && n->in[3] >= 0;
        const kiln_tensor *value = has_value ? kiln_opt_const(g, n->in[2]) : NULL;
        return act_value(g, captured, n->in[0]) &&
               kiln_pad_hw(n, pads, has_axes, value, has_value, a, &fill);
    }
    if (n->op == KILN_OP_Resize || n->op == KILN_OP_Upsample)
        return act_value(g, captured, n->in[0]) && resize_constant(g, n);
    if (n->op == KILN_OP_Concat) {
        int64_t axis = kiln_attr_int(n, "axis", 1);
        if (kiln_attr_check(n) != KILN_OK) {
            kiln_error_clear();
            return 0;
        }
        if (axis < 0) axis += 4;
        if (axis < 0 || axis > 3 || n->n_in < 1) return 0;
        for (int k = 0; k < n->n_in; k++) {
            int v = n->in[k];
            if (!act_value(g, captured, v)) return 0;
            const struct kiln_type *t = &g->values[v].type;
            for (int d = 0; d < 4; d++)
                if (d != axis && !same_dim(t, &g->values[y].type, d)) return 0;
            if (axis == 1 && t->dims[1] < 0) return 0;
        }
        return 1;
    }
    if (n->op == KILN_OP_Add || n->op == KILN_OP_Sub || n->op == KILN_OP_Mul ||
        n->op == KILN_OP_Div) {
        if (n->opset < 7 || n->n_in != 2) return 0;
        return act_value(g, captured, n->in[0]) && act_value(g, captured, n->in[1]) &&
               same_dims(g, n->in[0], y) && same_dims(g, n->in[1], y);
    }
    if (n->op == KILN_OP_GroupNormalization || n->op == KILN_OP_InstanceNormalization ||
        n->op == KILN_OP_KilnGroupNorm)
        return act_value(g, captured, n->in[0]) && same_dims(g, n->in[0], y); /* scale, bias plain */
    /* unary: input 0 is the data; Clip's bounds are one-element float32 tensors */
    if (!act_value(g, captured, n->in[0]) || !same_dims(g, n->in[0], y)) return 0;
    for (int k = 1; k < n->n_in; k++) {
        int v = n->in[k];
        if (v < 0) continue;
        const struct kiln_type *t = &g->values[v].type;
        if (n->op != KILN_OP_Clip || t->dtype != KILN_DTYPE_F32 ||
            kiln_shape_count(t->rank, t->dims) != 1)
            return 0;
    }
    if (n->op == KILN_OP_Gelu) {
        const char *a = kiln_attr_str(n, "approximate", "none");
        if (strcmp(a, "none") && strcmp(a, "tanh")) return 0;
    }
    return 1;
}

/* Whether input i of follower n carries data (takes the output's layout). */
static int follower_data_input(const struct kiln_node *n, int i)
{
    if (n->op == KILN_OP_Concat) return 1;
    if (n->op == KILN_OP_Slice || n->op == KILN_OP_Gather || n->op == KILN_OP_Pad ||
        n->op == KILN_OP_Resize || n->op == KILN_OP_Upsample)
        return i == 0;
    if (n->op == KILN_OP_Add || n->op == KILN_OP_Sub || n->op == KILN_OP_Mul ||
        n->op == KILN_OP_Div)
        return i < 2;
    return i == 0;
}

/* May node n read its input i (or write its output 0, i = -1) blocked by `block`? */
static int node_accepts(const struct kiln_graph *g, const unsigned char *captured,
                        const struct kiln_node *n, int i, int block)
{
    int big = -1;
    if (!is_conv(n) && !is_pool(n) && !is_chanop(g, n, &big)) return 0;
    if (big >= 0 && i >= 0 && i != big) return 0;
    if (n->n_out < 1 || !act_value(g, captured, n->out[0])) return 0;
    if (!act_value(g, captured, n->in[0])) return 0;
    if (i >= 0 && (i >= n->n_in || !act_value(g, captured, n->in[i]))) return 0;
    if (is_conv(n)) {
        int w = n->in[1];
        if (w < 0 || g->values[w].kind != KILN_VALUE_CONST || !g->values[w].konst ||
            g->values[w].type.dtype != KILN_DTYPE_F32 || g->values[w].type.rank != 4)
            return 0;
        if (n->n_in > 2 && n->in[2] >= 0 && g->values[n->in[2]].type.dtype != KILN_DTYPE_F32)
            return 0;
    }
    if (is_pool(n) && n->n_out > 1 && n->out[1] >= 0) return 0;
    return kiln_fast_accepts_blocked(n, i, block);
}

/* A conv's input 0 with fewer channels than a block (the network's first conv). */
static int few_channels(const struct kiln_graph *g, const struct kiln_node *n, int i, int block)
{
    if (!is_conv(n) || i != 0) return 0;
    int64_t c = g->values[n->in[0]].type.dims[1];
    return c >= 0 && c < block;
}

struct reorder_memo {
    int value, to, out;
};

struct layout_pass {
    struct kiln_graph *g;
    struct kiln_opt_pass_log *pl;
    int block;
    struct reorder_memo *memo;
    int n_memo, cap_memo;
};

/* Add a KilnReorder node reading value `in` (layout from) into value `out` (layout to). */
static kiln_status add_reorder_node(struct layout_pass *lp, int in, int out, int from, int to)
{
    struct kiln_graph *g = lp->g;
    char name[256];
    snprintf(name, sizeof name, "%s/reorder%d", g->values[in].name ? g->values[in].name : "", to);
    struct kiln_node *n;
    kiln_status st = kiln_graph_node_add(g, KILN_OP_KilnReorder, name, 1, 1, 2, &n);
    if (st != KILN_OK) return st;
    n->in[0] = in;
    n->out[0] = out;
    n->attr[0].name = kiln_arena_strdup(g->mem, "from");
    n->attr[0].type = KILN_ATTR_INT;
    n->attr[0].i = from;
    n->attr[1].name = kiln_arena_strdup(g->mem, "to");
    n->attr[1].type = KILN_ATTR_INT;
    n->attr[1].i = to;
    if (!n->attr[0].name || !n->attr[1].name)
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory adding a reorder");
    g->values[out].kind = KILN_VALUE_NODE;
    g->values[out].producer = g->n_nodes - 1;
    g->values[in].uses++;
    if (lp->pl) kiln_opt_count(lp->pl, "KilnReorder");
    return KILN_OK;
}

/* A new value with v's type and layout `layout`; its id in *out. */
static kiln_status add_value_like(struct kiln_graph *g, int v, int layout, int *out)
{
    char name[256];
    snprintf(name, sizeof name, "%s/layout%d", g->values[v].name ? g->values[v].name : "", layout);
    kiln_status st = kiln_graph_value_add(g, name, KILN_VALUE_NODE, out);
    if (st != KILN_OK) return st;
    struct kiln_value *nv = &g->values[*out];
    nv->type = g->values[v].type;
    nv->layout = layout;
    nv->uses = 0;
    return KILN_OK;
}

/* The value holding v in layout `to` (a KilnReorder made on first request). */
static kiln_status reorder_of(struct layout_pass *lp, int v, int to, int *out)
{
    for (int i = 0; i < lp->n_memo; i++)
        if (lp->memo[i].value == v && lp->memo[i].to == to) {
            *out = lp->memo[i].out;
            return KILN_OK;
        }
    if (lp->n_memo == lp->cap_memo) {
        int cap = lp->cap_memo ? lp->cap_memo * 2 : 16;
        struct reorder_memo *m = realloc(lp->memo, sizeof *m * (size_t)cap);
        if (!m) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in the layout pass");
        lp->memo = m;
        lp->cap_memo = cap;
    }
    int nv;
    kiln_status st = add_value_like(lp->g, v, to, &nv);
    if (st == KILN_OK) st = add_reorder_node(lp, v, nv, lp->g->values[v].layout, to);
    if (st != KILN_OK) return st;
    lp->memo[lp->n_memo++] = (struct reorder_memo){v, to, nv};
    *out = nv;
    return KILN_OK;
}

/* The layout node c wants for its input i, now holding value v. */
static int wanted_layout(struct layout_pass *lp, const unsigned char *captured, int c, int i)
{
    struct kiln_graph *g = lp->g;
    const struct kiln_node *n = &g->nodes[c];
    int v = n->in[i];
    int have = g->values[v].layout;
    if (is_follower(g, captured, n, lp->block))
        return follower_data_input(n, i) ? g->values[n->out[0]].layout : 0;
    if (!node_accepts(g, captured, n, i, lp->block)) return 0;
    int out_layout = g->values[n->out[0]].layout;
    int big;
    if (is_pool(n) || is_chanop(g, n, &big)) return out_layout;
    if (i == 3) return out_layout; /* KilnFusedConv's Sum */
    /* a convolution writing plain data reads plain data too: oneDNN has no fast kernel from
     * blocked to plain (EfficientNet's squeeze-and-excitation convs on [N,C,1,1] fell to its
     * reference implementation); the reorder of such an input is small */
    if (i == 0 && have && !out_layout) return 0;
    if (i == 0 && have == 0 && out_layout && !few_channels(g, n, 0, lp->block) &&
        g->values[v].type.dims[1] >= lp->block)
        return out_layout; /* enter the region */
    return have;
}

/* Graph outputs stay plain: the producer of an output that the pass gave a layout
 * writes a twin in that layout, and a KilnReorder writes the output. */
static kiln_status outputs_plain(struct layout_pass *lp, int n_nodes, int n_values)
{
    struct kiln_graph *g = lp->g;
    kiln_status st = KILN_OK;
    for (int k = 0; k < g->n_outputs && st == KILN_OK; k++) {
        int o = g->outputs[k];
        if (o < 0 || o >= n_values || !g->values[o].layout) continue;
        int twin, p = g->values[o].producer, lo = g->values[o].layout;
        st = add_value_like(g, o, lo, &twin);
        if (st != KILN_OK) break;
        g->values[twin].producer = p;
        for (int j = 0; j < g->nodes[p].n_out; j++)
            if (g->nodes[p].out[j] == o) g->nodes[p].out[j] = twin;
        for (int c = 0; c < n_nodes; c++)
            for (int i = 0; i < g->nodes[c].n_in; i++)
                if (g->nodes[c].in[i] == o) {
                    g->nodes[c].in[i] = twin;
                    g->values[o].uses--;
                    g->values[twin].uses++;
                }
        g->values[o].layout = 0;
        st = add_reorder_node(lp, twin, o, lo, 0);
    }
    return st;
}

/* The channels-last part (layout_nhwc.c): int8 convolution chains on values the
 * blocked part left plain, with reorders at their edges. */
static kiln_status layout_nhwc(struct layout_pass *lp, const unsigned char *captured)
{
    struct kiln_graph *g = lp->g;
    int n_nodes = g->n_nodes, n_values = g->n_values;
    unsigned char *role = NULL;
    kiln_status st = kiln_opt_nhwc_mark(g, captured, lp->pl, &role);
    if (st != KILN_OK || !role) return st;
    st = outputs_plain(lp, n_nodes, n_values);
    for (int c = 0; c < n_nodes && st == KILN_OK; c++) {
        if (kiln_opt_node_dead(&g->nodes[c])) continue;
        for (int i = 0; i < g->nodes[c].n_in && st == KILN_OK; i++) {
            int v = g->nodes[c].in[i];
            if (v < 0) continue;
            int want = kiln_opt_nhwc_wanted(g, c, role[c], i), have = g->values[v].layout;
            if (want == have || (want != KILN_LAYOUT_NHWC && have != KILN_LAYOUT_NHWC)) continue;
            int nv = -1;
            st = reorder_of(lp, v, want, &nv);
            if (st != KILN_OK) break;
            g->nodes[c].in[i] = nv;
            g->values[v].uses--;
            g->values[nv].uses++;
        }
    }
    free(role);
    return st;
}

kiln_status kiln_opt_layout(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    struct layout_pass lp = {.g = g, .pl = pl, .block = pick_block()};
    if (!lp.block) return KILN_OK;
    kiln_status st = kiln_opt_layout_shuffle(g, pl);
    if (st == KILN_OK) st = kiln_opt_split_as_slices(g, pl);
    if (st == KILN_OK) st = kiln_opt_slice_of_gather(g, pl);
    if (st != KILN_OK) return st;
    /* room for the values the pass adds too (at most one per node input and output) */
    size_t n_cap = (size_t)g->n_values + (size_t)g->n_outputs + 1;
    for (int c = 0; c < g->n_nodes; c++) n_cap += (size_t)g->nodes[c].n_in;
    unsigned char *captured = calloc(n_cap, 1);
    if (!captured) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in the layout pass");
    for (int c = 0; c < g->n_nodes; c++)
        for (int k = 0; k < g->nodes[c].n_implicit; k++)
            if (g->nodes[c].implicit[k] >= 0 && g->nodes[c].implicit[k] < g->n_values)
                captured[g->nodes[c].implicit[k]] = 1;
    int n_nodes = g->n_nodes, n_values = g->n_values;

    /* 1. block each value that is supplied blocked and demanded blocked:
     *  - supplied: written by a blocked-capable convolution or pool (a source), or by
     *    a follower with a supplied data input;
     *  - demanded: read blocked by a source (not the network's first convolution), or
     *    by a follower whose output is demanded.
     * Both spread through followers until nothing changes. A follower's other data
     * inputs then get a reorder into its layout, and any other consumer of a blocked
     * value a reorder out of it (step 3): a reorder is placed only where a layout
     * really changes, wherever the chain of followers leads. */
    unsigned char *role = calloc((size_t)n_nodes + 1, 1); /* 1 source, 2 follower */
    unsigned char *supply = calloc((size_t)n_values + 1, 1), *demand = calloc((size_t)n_values + 1, 1);
    if (!role || !supply || !demand) {
        free(role);
        free(supply);
        free(demand);
        free(captured);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in the layout pass");
    }
    for (int p = 0; p < n_nodes; p++) {
        const struct kiln_node *pn = &g->nodes[p];
        if (pn->n_out < 1 || pn->out[0] < 0) continue;
        if (is_follower(g, captured, pn, lp.block)) role[p] = 2;
        else if (node_accepts(g, captured, pn, -1, lp.block)) role[p] = 1;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int p = 0; p < n_nodes; p++) {
            const struct kiln_node *pn = &g->nodes[p];
            if (!role[p] || supply[pn->out[0]]) continue;
            int s = role[p] == 1;
            for (int i = 0; i < pn->n_in && !s; i++)
                if (pn->in[i] >= 0 && follower_data_input(pn, i) && supply[pn->in[i]]) s = 1;
            if (s) changed = supply[pn->out[0]] = 1;
        }
        for (int c = 0; c < n_nodes; c++) {
            const struct kiln_node *cn = &g->nodes[c];
            if (!role[c]) continue;
            for (int i = 0; i < cn->n_in; i++) {
                int v = cn->in[i];
                if (v < 0 || demand[v]) continue;
                int d = role[c] == 1 ? node_accepts(g, captured, cn, i, lp.block) &&
                                           !few_channels(g, cn, i, lp.block)
                                     : follower_data_input(cn, i) && demand[cn->out[0]];
                if (d) changed = demand[v] = 1;
            }
        }
    }
    for (int p = 0; p < n_nodes; p++) {
        int v = g->nodes[p].out[0];
        if (role[p] && supply[v] && demand[v]) g->values[v].layout = lp.block;
    }
    /* cost: a pool reads its input in its output's layout, so a pool whose blocked
     * input is wanted by no blocked reader downstream would have the reorder on its
     * input; where the output is smaller (GlobalAveragePool before the classifier) and
     * nothing else reads the input plain, it writes blocked output and the reorder moves
     * after it */
    for (int p = 0; p < n_nodes; p++) {
        const struct kiln_node *pn = &g->nodes[p];
        if (role[p] != 1 || !is_pool(pn) || g->values[pn->out[0]].layout) continue;
        int x = pn->in[0];
        if (x < 0 || !g->values[x].layout) continue;
        const struct kiln_type *xt = &g->values[x].type, *yt = &g->values[pn->out[0]].type;
        int64_t xs = 1, ys = 1;
        for (int d = 1; d < 4; d++) {
            xs *= xt->dims[d] > 0 ? xt->dims[d] : -1;
            ys *= yt->dims[d] > 0 ? yt->dims[d] : -1;
        }
        if (xs <= 0 || ys <= 0 || ys * 2 > xs || !same_dim(xt, yt, 0)) continue;
        /* where another reader (or the graph's output) needs x plain, that reorder is paid
         * anyway and the pool reads its result: nothing to move */
        bool plain_reader = kiln_opt_is_graph_output(g, x);
        for (int c = 0; c < n_nodes && !plain_reader; c++) {
            const struct kiln_node *cn = &g->nodes[c];
            if (c == p || kiln_opt_node_dead(cn)) continue;
            for (int i = 0; i < cn->n_in; i++)
                if (cn->in[i] == x && (!role[c] || !g->values[cn->out[0]].layout))
                    plain_reader = true;
        }
        if (plain_reader) continue;
        g->values[pn->out[0]].layout = lp.block;
        if (pl) kiln_opt_count(pl, "reorder after a pool, not before");
    }
    free(role);
    free(supply);
    free(demand);

    /* 2. graph outputs stay plain: the producer writes a blocked twin */
    if (st == KILN_OK) st = outputs_plain(&lp, n_nodes, n_values);

    /* 3. reorders where a consumer wants another layout than its input has */
    for (int c = 0; c < n_nodes && st == KILN_OK; c++) {
        for (int i = 0; i < g->nodes[c].n_in && st == KILN_OK; i++) {
            int v = g->nodes[c].in[i];
            if (v < 0) continue;
            int want = wanted_layout(&lp, captured, c, i);
            if (want == g->values[v].layout) continue;
            int nv = -1;
            st = reorder_of(&lp, v, want, &nv);
            if (st != KILN_OK) break;
            g->nodes[c].in[i] = nv;
            g->values[v].uses--;
            g->values[nv].uses++;
        }
    }

    for (int v = 0; v < g->n_values && st == KILN_OK; v++)
        if (g->values[v].layout && pl) kiln_opt_count(pl, "blocked value");
    if (st == KILN_OK) st = layout_nhwc(&lp, captured);
    free(lp.memo);
    free(captured);
    return st;
}
