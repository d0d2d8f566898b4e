/*
 * qlut.c - the qlut_fusion pass: in a static int8 graph, a per-tensor
 * DequantizeLinear of an 8-bit value followed by float elementwise ops of
 * that value alone (SiLU's Sigmoid and Mul, a Sigmoid gate, HardSwish,
 * Tanh, Clip ...), optionally ending in a per-tensor QuantizeLinear, is a
 * function of the 8-bit code: it becomes one KilnLut8 node reading a
 * 256-entry table (reference kernel src/kernels/ref/lut8.c, fast kernel
 * src/kernels/simd/lut8.c). One pass over bytes instead of three or four
 * over float32: EfficientNet's and MobileNetV3's SiLU / HardSwish between
 * quantized convolutions stay 8-bit (DQ -> Sigmoid -> Mul -> Q: an 8-bit
 * table), and the squeeze-and-excitation gate DQ -> Sigmoid and the SiLU
 * feeding a float pool become one byte-to-float table.
 *
 * The table is made by running the replaced nodes themselves, through their
 * reference kernels (kiln_exec_node, as constant folding does), on the 256
 * codes: so KilnLut8 gives bit for bit what the unfused nodes give on the
 * reference kernels.
 *
 * Taken: a DequantizeLinear with one constant float32 scale and one
 * constant 8-bit zero point (or none), float32 output, no block_size /
 * precision / saturate changes; then every node (ops below, one output, no
 * subgraph) whose inputs are values of the region or constants of one
 * element, grown until nothing joins; exactly one value of the region read
 * outside it (or a graph output), and not the DequantizeLinear's own; if
 * that value's one reader is such a QuantizeLinear, it joins and the table
 * is 8-bit, else float32.
 *
 * Then the squeeze-and-excitation that reads a float table's output a
 * (EfficientNet's SiLU after the depthwise convolution): a GlobalAveragePool
 * of a becomes KilnLut8Pool(x, table), and Q(a * s), s per channel
 * ([N or 1, C, 1, 1] float32) and the Mul read only by a per-tensor Q, becomes
 * KilnLut8Mul(x, table, s, y_scale, y_zp): both in the float32 arithmetic of
 * the nodes they replace (ref/lut8.c), and a is no longer written where
 * nothing else reads it. The same 8-bit x, read twice, instead of a float
 * tensor written once and read three times.
 */
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "exec/exec.h"
#include "kernels/kernel.h"
#include "opt/opt.h"

#define QLUT_MAX 16 /* most nodes in one region */

static bool q8(kiln_dtype d) { return d == KILN_DTYPE_U8 || d == KILN_DTYPE_I8; }

/* A node input that is absent (when !need), or a constant of one element of dtype d (0: any). */
static bool one_const(const struct kiln_graph *g, const struct kiln_node *n, int i, int d, bool need)
{
    if (i >= n->n_in || n->in[i] < 0) return !need;
    const kiln_tensor *t = kiln_opt_const(g, n->in[i]);
    return t && kiln_tensor_count(t) == 1 && t->rank <= 1 && (!d || (int)t->dtype == d);
}

/* A per-tensor Q (q) or DQ node between float32 and 8-bit values. */
static bool per_tensor(const struct kiln_graph *g, const struct kiln_node *n, bool q)
{
    if (n->op != (q ? KILN_OP_QuantizeLinear : KILN_OP_DequantizeLinear) || n->n_out != 1 ||
        n->n_in < 2 || n->in[0] < 0 || n->out[0] < 0 || n->n_implicit)
        return false;
    const struct kiln_type *x = &g->values[n->in[0]].type, *y = &g->values[n->out[0]].type;
    const struct kiln_type *i8 = q ? y : x, *f = q ? x : y;
    if (!q8(i8->dtype) || f->dtype != KILN_DTYPE_F32) return false;
    int64_t prec = kiln_attr_int(n, "precision", 0), sat = kiln_attr_int(n, "saturate", 1);
    int64_t block = kiln_attr_int(n, "block_size", 0);
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    if ((prec != 0 && prec != 1) || sat != 1 || block != 0) return false;
    return one_const(g, n, 1, KILN_DTYPE_F32, true) && one_const(g, n, 2, (int)i8->dtype, false);
}

/* Float elementwise ops a region may hold (their reference kernels make the table). */
static bool lut_op(const struct kiln_node *n)
{
    switch (n->op) {
    case KILN_OP_Sigmoid: case KILN_OP_Tanh: case KILN_OP_Relu: case KILN_OP_LeakyRelu:
    case KILN_OP_Elu: case KILN_OP_Selu: case KILN_OP_HardSigmoid: case KILN_OP_HardSwish:
    case KILN_OP_Clip: case KILN_OP_Neg: case KILN_OP_Abs: case KILN_OP_Exp: case KILN_OP_Erf:
    case KILN_OP_Softplus: case KILN_OP_Mish: case KILN_OP_Gelu:
        return true;
    case KILN_OP_Mul: case KILN_OP_Add: case KILN_OP_Sub: case KILN_OP_Div:
        return n->opset >= 7;
    default:
        return false;
    }
}

struct region {
    int nodes[QLUT_MAX + 1]; /* DQ first, then in an order where inputs come first */
    int n;
    int vals[QLUT_MAX + 1]; /* vals[k] = output of nodes[k] */
};

static int in_region(const struct region *r, int v)
{
    for (int k = 0; k < r->n; k++)
        if (r->vals[k] == v) return k;
    return -1;
}

/* Grow the region from DQ node d; false if it comes out too big. */
static bool grow(const struct kiln_graph *g, int d, struct region *r)
{
    r->n = 1;
    r->nodes[0] = d;
    r->vals[0] = g->nodes[d].out[0];
    const struct kiln_type *ft = &g->values[r->vals[0]].type;
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < g->n_nodes; i++) {
            const struct kiln_node *n = &g->nodes[i];
            if (kiln_opt_node_dead(n) || !lut_op(n) || n->n_out != 1 || n->out[0] < 0 ||
                n->n_implicit || in_region(r, n->out[0]) >= 0)
                continue;
            bool ok = n->n_in >= 1, any = false;
            for (int k = 0; k < n->n_in && ok; k++) {
                int v = n->in[k];
                if (v < 0) continue;
                if (in_region(r, v) >= 0) any = true;
                else if (!one_const(g, n, k, KILN_DTYPE_F32, true)) ok = false;
            }
            const struct kiln_type *yt = &g->values[n->out[0]].type;
            if (!ok || !any || yt->dtype != KILN_DTYPE_F32 || !kiln_opt_same_shape(yt, ft)) continue;
            if (r->n == QLUT_MAX) return false;
            r->nodes[r->n] = i;
            r->vals[r->n++] = n->out[0];
            changed = true;
        }
    }
    return true;
}

/* Uses of value v by the region's nodes. */
static int region_uses(const struct kiln_graph *g, const struct region *r, int v)
{
    int c = 0;
    for (int k = 0; k < r->n; k++) {
        const struct kiln_node *n = &g->nodes[r->nodes[k]];
        for (int i = 0; i < n->n_in; i++) c += n->in[i] == v;
    }
    return c;
}

/* Run the region (and Q node q, or -1) on the 256 codes of its 8-bit input through the
 * reference kernels; *table gets the 256 results of Q, or else of region node `exit`. */
static kiln_status make_table(struct kiln_graph *g, const struct region *r, int exit, int q,
                              kiln_tensor **table)
{
    *table = NULL;
    const struct kiln_node *d = &g->nodes[r->nodes[0]];
    kiln_dtype xt = g->values[d->in[0]].type.dtype;
    int64_t dims[4] = {1, 256, 1, 1}; /* rank 4: any Q / DQ axis attribute is in range */
    kiln_tensor *vals[QLUT_MAX + 2] = {NULL}, *codes = NULL;
    kiln_status st = kiln_tensor_new(xt, 4, dims, &codes);
    if (st != KILN_OK) return st;
    for (int k = 0; k < 256; k++) kiln_set_i64(xt, codes->data, k, xt == KILN_DTYPE_I8 ? k - 128 : k);
    int order[QLUT_MAX + 2], n = r->n;
    memcpy(order, r->nodes, sizeof(int) * (size_t)n);
    if (q >= 0) order[n++] = q;
    for (int k = 0; k < n && st == KILN_OK; k++) {
        const struct kiln_node *nd = &g->nodes[order[k]];
        kiln_tensor *in[KILN_MAX_IO];
        for (int i = 0; i < nd->n_in; i++) {
            int v = nd->in[i], j = in_region(r, v);
            in[i] = v < 0 ? NULL : k == 0 && i == 0 ? codes : j >= 0 ? vals[j] : g->values[v].konst;
        }
        kiln_tensor *out[1] = {NULL};
        st = kiln_exec_node(nd, in, out, NULL, (int64_t)1 << 20);
        vals[k] = out[0];
    }
    const kiln_tensor *res = vals[q >= 0 ? n - 1 : exit];
    if (st == KILN_OK && res && kiln_tensor_count(res) == 256) {
        int64_t tdims[1] = {256};
        st = kiln_tensor_new(res->dtype, 1, tdims, table);
        if (st == KILN_OK) memcpy((*table)->data, res->data, (*table)->nbytes);
    }
    for (int k = 0; k < n; k++) kiln_tensor_free(vals[k]);
    kiln_tensor_free(codes);
    return st;
}

/* Try the region of DQ node d: a KilnLut8 where it is one. */
static kiln_status fuse_at(struct kiln_graph *g, int d, struct kiln_opt_pass_log *pl)
{
    struct region r;
    if (!grow(g, d, &r) || r.n < 2) return KILN_OK;
    int exit = -1;
    for (int k = 0; k < r.n; k++) {
        int v = r.vals[k];
        if (!kiln_opt_is_graph_output(g, v) && g->values[v].uses == region_uses(g, &r, v)) continue;
        if (exit >= 0 || k == 0) return KILN_OK; /* two values read outside, or the DQ's */
        exit = k;
    }
    if (exit < 0) return KILN_OK; /* nothing reads the result */
    int y = r.vals[exit];
    int q = kiln_opt_single_consumer(g, y);
    if (q >= 0 && !per_tensor(g, &g->nodes[q], true)) q = -1;
    kiln_tensor *table = NULL;
    kiln_status st = make_table(g, &r, exit, q, &table);
    if (st != KILN_OK || !table) { /* a kernel refused: leave the nodes as they are */
        kiln_error_clear();
        kiln_tensor_free(table);
        return KILN_OK;
    }
    int x = g->nodes[d].in[0], out = q >= 0 ? g->nodes[q].out[0] : y, tv, ni;
    st = kiln_opt_add_const(g, "lut8_table", table, &tv);
    if (st != KILN_OK) return st;
    st = kiln_opt_add_node(g, KILN_OP_KilnLut8, g->nodes[r.nodes[exit]].name, 2, 1, 0, 1, &ni);
    if (st != KILN_OK) return st;
    kiln_opt_set_output(g, ni, 0, out);
    kiln_opt_set_input(g, ni, 0, x);
    kiln_opt_set_input(g, ni, 1, tv);
    if (q >= 0) kiln_opt_remove_node(g, q);
    for (int k = r.n - 1; k >= 0; k--) kiln_opt_remove_node(g, r.nodes[k]);
    g->values[out].producer = ni;
    if (pl) kiln_opt_count(pl, q >= 0 ? "KilnLut8 (8-bit table)" : "KilnLut8 (float table)");
    return KILN_OK;
}

/* A [N or 1, C, 1, 1] float value s for a 4-D x of C channels (the same batch). */
static bool per_channel(const struct kiln_graph *g, int s, const struct kiln_type *x)
{
    const struct kiln_type *t = &g->values[s].type;
    if (t->dtype != KILN_DTYPE_F32 || t->rank != 4 || t->dims[1] != x->dims[1] || t->dims[2] != 1 ||
        t->dims[3] != 1)
        return false;
    if (t->dims[0] == 1) return true;
    if (t->dims[0] >= 0) return t->dims[0] == x->dims[0];
    return x->dims[0] < 0 && t->sym[0] && x->sym[0] && !strcmp(t->sym[0], x->sym[0]);
}

/* The squeeze-and-excitation around a float KilnLut8 L (x -> a): GlobalAveragePool(a) ->
 * KilnLut8Pool(x, table), and Q(a * s) with s per channel -> KilnLut8Mul(x, table, s, ...),
 * so a is not written at all where nothing else reads it. */
static kiln_status se_at(struct kiln_graph *g, int li, struct kiln_opt_pass_log *pl)
{
    int x = g->nodes[li].in[0], tv = g->nodes[li].in[1], a = g->nodes[li].out[0];
    const struct kiln_type *at = &g->values[a].type;
    if (at->dtype != KILN_DTYPE_F32 || at->rank != 4 || at->dims[1] < 1 || at->dims[2] < 1 ||
        at->dims[3] < 1)
        return KILN_OK;
    int n_nodes = g->n_nodes;
    for (int c = 0; c < n_nodes; c++) {
        const struct kiln_node *cn = &g->nodes[c];
        if (kiln_opt_node_dead(cn) || cn->n_out != 1 || cn->out[0] < 0 || cn->n_implicit) continue;
        int ni, q = -1, sv = -1;
        kiln_status st;
        if (cn->op == KILN_OP_GlobalAveragePool && cn->n_in == 1 && cn->in[0] == a) {
            int y = cn->out[0];
            st = kiln_opt_add_node(g, KILN_OP_KilnLut8Pool, g->nodes[c].name, 2, 1, 0, 1, &ni);
            if (st != KILN_OK) return st;
            kiln_opt_set_output(g, ni, 0, y);
            kiln_opt_set_input(g, ni, 0, x);
            kiln_opt_set_input(g, ni, 1, tv);
            kiln_opt_remove_node(g, c);
            g->values[y].producer = ni;
            if (pl) kiln_opt_count(pl, "KilnLut8Pool");
            continue;
        }
        if (cn->op != KILN_OP_Mul || cn->opset < 7 || cn->n_in != 2 || cn->in[0] < 0 || cn->in[1] < 0)
            continue;
        if (cn->in[0] == a) sv = cn->in[1];
        else if (cn->in[1] == a) sv = cn->in[0];
        if (sv < 0 || sv == a || !per_channel(g, sv, at) ||
            !kiln_opt_same_shape(&g->values[cn->out[0]].type, at))
            continue;
        q = kiln_opt_single_consumer(g, cn->out[0]);
        if (q < 0 || !per_tensor(g, &g->nodes[q], true)) continue;
        int y = g->nodes[q].out[0], sc = g->nodes[q].in[1];
        int zp = g->nodes[q].n_in > 2 ? g->nodes[q].in[2] : -1;
        st = kiln_opt_add_node(g, KILN_OP_KilnLut8Mul, g->nodes[c].name, zp >= 0 ? 5 : 4, 1, 0, 1,
                               &ni);
        if (st != KILN_OK) return st;
        kiln_opt_set_output(g, ni, 0, y);
        int in[5] = {x, tv, sv, sc, zp};
        for (int k = 0; k < (zp >= 0 ? 5 : 4); k++) kiln_opt_set_input(g, ni, k, in[k]);
        kiln_opt_remove_node(g, q);
        kiln_opt_remove_node(g, c);
        g->values[y].producer = ni;
        if (pl) kiln_opt_count(pl, "KilnLut8Mul");
    }
    if (g->values[a].uses == 0 && !kiln_opt_is_graph_output(g, a)) kiln_opt_remove_node(g, li);
    return KILN_OK;
}

kiln_status kiln_opt_qlut(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    const char *off = getenv("KILN_QLUT"); /* "0": off (tests and comparisons) */
    if (off && !strcmp(off, "0")) return KILN_OK;
    int n_nodes = g->n_nodes;
    for (int d = 0; d < n_nodes; d++) {
        if (kiln_opt_node_dead(&g->nodes[d]) || !per_tensor(g, &g->nodes[d], false)) continue;
        kiln_status st = fuse_at(g, d, pl);
        if (st != KILN_OK) return st;
    }
    n_nodes = g->n_nodes;
    for (int li = 0; li < n_nodes; li++) {
        const struct kiln_node *n = &g->nodes[li];
        if (kiln_opt_node_dead(n) || n->op != KILN_OP_KilnLut8 || n->n_in != 2 || n->in[1] < 0 ||
            n->out[0] < 0 || !kiln_opt_const(g, n->in[1]) ||
            kiln_opt_const(g, n->in[1])->dtype != KILN_DTYPE_F32)
            continue;
        kiln_status st = se_at(g, li, pl);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}
