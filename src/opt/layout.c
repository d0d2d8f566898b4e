/*
 * layout.c - the layout pass: store the activations of convolution chains
 * with their channels blocked (graph.h, kiln_value.layout), so the oneDNN
 * kernels run their blocked code paths without reordering at every node.
 *
 * The block is 16 on CPUs with AVX-512, 8 with AVX2, and the pass does
 * nothing otherwise (KILN_ISA=avx2|scalar in the environment lowers it, as
 * for the kernels). A 4-D float32 value produced by a node whose fast
 * kernel writes blocked output (kiln_fast_accepts_blocked) is blocked when
 * at least one consumer reads it blocked; the values so chosen form
 * maximal connected regions of Conv / KilnFusedConv / ConvTranspose / pooling nodes. Then
 * every edge where the layouts disagree gets a KilnReorder node (shared by
 * the consumers that want the same layout of a value):
 *  - a consumer that does not read blocked input (Flatten, Softmax, ...);
 *  - a graph output (its value keeps its id and stays plain: the producer
 *    writes a new blocked value, and a KilnReorder writes the output);
 *  - KilnFusedConv's Sum, which must match Y's layout;
 *  - a pool's input, which oneDNN pools fastest in its output's layout;
 *  - a plain value with at least `block` channels entering a blocked
 *    convolution (a reorder costs far less than a plain convolution). The
 *    first convolution of a network (few input channels) reads its plain
 *    input directly and writes blocked output.
 * Values captured by subgraphs stay plain. Convolutions are blocked only
 * where their fast kernel surely runs (constant 4-D weights), since the
 * reference kernels read plain storage only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/fast.h"
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
 * squeeze-and-excitation scale of EfficientNet / MobileNetV3): the big input
 * and the output may be blocked, the small one stays plain. *big = its index. */
static int is_chanop(const struct kiln_graph *g, const struct kiln_node *n, int *big)
{
    if ((n->op != KILN_OP_Mul && n->op != KILN_OP_Add && n->op != KILN_OP_Sub &&
         n->op != KILN_OP_Div) ||
        n->n_in != 2 || n->n_out != 1 || n->in[0] < 0 || n->in[1] < 0)
        return 0;
    for (int k = 0; k < 2; k++) {
        const struct kiln_type *x = &g->values[n->in[k]].type, *v = &g->values[n->in[1 - k]].type;
        if (x->rank != 4 || v->rank != 4 || x->dtype != KILN_DTYPE_F32 ||
            v->dtype != KILN_DTYPE_F32)
            continue;
        if (x->dims[1] <= 0 || v->dims[1] != x->dims[1] || v->dims[2] != 1 || v->dims[3] != 1)
            continue;
        if (x->dims[2] == 1 && x->dims[3] == 1) continue; /* both per-channel */
        if (v->dims[0] != 1 && v->dims[0] != x->dims[0]) continue;
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

kiln_status kiln_opt_layout(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    struct layout_pass lp = {.g = g, .pl = pl, .block = pick_block()};
    if (!lp.block) return KILN_OK;
    kiln_status st = KILN_OK;
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

    /* 1. block each value written blocked and read blocked by some consumer */
    for (int p = 0; p < n_nodes; p++) {
        const struct kiln_node *pn = &g->nodes[p];
        if (pn->n_out < 1 || pn->out[0] < 0 || !node_accepts(g, captured, pn, -1, lp.block))
            continue;
        int v = pn->out[0], wanted = 0;
        for (int c = 0; c < n_nodes && !wanted; c++) {
            const struct kiln_node *cn = &g->nodes[c];
            for (int i = 0; i < cn->n_in && !wanted; i++)
                if (cn->in[i] == v && node_accepts(g, captured, cn, i, lp.block) &&
                    !few_channels(g, cn, i, lp.block))
                    wanted = 1;
        }
        if (wanted) g->values[v].layout = lp.block;
    }

    /* 2. graph outputs stay plain: the producer writes a blocked twin */
    for (int k = 0; k < g->n_outputs && st == KILN_OK; k++) {
        int o = g->outputs[k];
        if (o < 0 || o >= n_values || !g->values[o].layout) continue;
        int twin, p = g->values[o].producer;
        st = add_value_like(g, o, g->values[o].layout, &twin);
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
        st = add_reorder_node(&lp, twin, o, lp.block, 0);
    }

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
    free(lp.memo);
    free(captured);
    return st;
}
