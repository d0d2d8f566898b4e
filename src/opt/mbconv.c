/*
 * mbconv.c - the mbconv_fusion pass: an inverted-residual block (1x1
 * expand convolution, depthwise convolution, 1x1 project convolution, as in
 * MobileNetV2) -> one KilnMBConv node (opt.h), whose kernel never stores the
 * expanded activation whole (src/kernels/simd/mbconv.c).
 *
 * Runs after the layout pass, on chains whose values are blocked by 16, and
 * only where kiln_cpu_isa() is AVX-512 and the CPU runs the fused kernel
 * (kiln_mbconv_cpu_ok: AVX-512 F and DQ):
 *   X -> Conv/KilnFusedConv 1x1 (group 1, stride 1, no pads, no Sum) -> E
 *     -> Conv/KilnFusedConv kxk depthwise (k 3 or 5, the kernel's specialized
 *        sizes; stride 1 or 2, pads k/2, no Sum) -> D
 *     -> Conv/KilnFusedConv 1x1 (group 1, stride 1, no pads, Sum allowed) -> Y
 * where E and D are read only by the next convolution and are no graph
 * outputs, every weight and bias is a float32 constant, every activation is
 * none, Relu, Clip (lo <= hi) or SiLU and no dilation or auto_pad is set.
 * Depthwise + project is fused too where X feeds the depthwise directly
 * (MobileNetV2's first block). A squeeze-excitation between the depthwise
 * and the project (EfficientNet's, as PyTorch exports it) joins the node:
 *   D -> GlobalAveragePool -> Conv 1x1 (W1, act none, Relu, Clip or SiLU)
 *     -> Conv 1x1 (W2, act Sigmoid) -> S;  Mul(D, S) -> project
 * (a KilnReorder may sit before either convolution and before the Mul)
 * where D is read by the pool and the Mul only, and every value in between
 * by one node. Y keeps its id. Not fused: expand + depthwise alone
 * (measured, 5-8% slower end to end than oneDNN's two convolutions).
 * KILN_MBCONV=0 in the environment turns the pass off (for comparisons).
 */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "kernels/kernel.h"
#include "kernels/simd/mbconv.h"
#include "opt/opt.h"

struct conv_info {
    int node;
    int k, s;           /* square kernel, equal strides */
    int64_t group;
    const kiln_tensor *w;
    int bias;           /* value id or -1 */
    int sum;            /* value id or -1 */
    const char *act;
    float alpha, beta;
};

static bool ints_all(const struct kiln_node *n, const char *name, int64_t want, int count)
{
    const int64_t *v;
    int c = kiln_attr_ints(n, name, &v);
    if (c < 0) return true; /* absent: the default is checked by the caller */
    if (c != count) return false;
    for (int i = 0; i < c; i++)
        if (v[i] != want) return false;
    return true;
}

/* A 2-D float32 convolution with constant weights, square odd kernel, equal
 * strides and pads k / 2, no dilation, activation none, Relu, Clip or SiLU. */
static bool conv_info(const struct kiln_graph *g, int ni, struct conv_info *ci)
{
    const struct kiln_node *n = &g->nodes[ni];
    if (kiln_opt_node_dead(n) || n->n_out != 1 || n->n_in < 2 ||
        (n->op != KILN_OP_Conv && n->op != KILN_OP_KilnFusedConv))
        return false;
    const kiln_tensor *w = kiln_opt_const(g, n->in[1]);
    if (!w || w->dtype != KILN_DTYPE_F32 || w->rank != 4 || w->dims[2] != w->dims[3] ||
        w->dims[2] % 2 == 0 || w->dims[2] > 7)
        return false;
    int k = (int)w->dims[2];
    const char *ap = kiln_attr_str(n, "auto_pad", "NOTSET");
    if (strcmp(ap, "NOTSET") != 0) return false;
    const int64_t *st;
    int ns = kiln_attr_ints(n, "strides", &st);
    int s = ns < 0 ? 1 : ns == 2 && st[0] == st[1] ? (int)st[0] : 0;
    if (s != 1 && s != 2) return false;
    if (!ints_all(n, "dilations", 1, 2) || !ints_all(n, "pads", k / 2, 4)) return false;
    const int64_t *pv;
    if (k > 1 && kiln_attr_ints(n, "pads", &pv) < 0) return false; /* default pads are 0 */
    const int64_t *ks;
    int nk = kiln_attr_ints(n, "kernel_shape", &ks);
    if (nk >= 0 && (nk != 2 || ks[0] != k || ks[1] != k)) return false;
    ci->node = ni;
    ci->k = k;
    ci->s = s;
    ci->group = kiln_attr_int(n, "group", 1);
    ci->w = w;
    ci->bias = n->n_in > 2 ? n->in[2] : -1;
    ci->sum = n->op == KILN_OP_KilnFusedConv && n->n_in > 3 ? n->in[3] : -1;
    if (ci->bias >= 0) {
        const kiln_tensor *b = kiln_opt_const(g, ci->bias);
        if (!b || b->dtype != KILN_DTYPE_F32 || b->rank != 1 || b->dims[0] != w->dims[0])
            return false;
    }
    ci->act = n->op == KILN_OP_KilnFusedConv ? kiln_attr_str(n, "activation", "") : "";
    ci->alpha = kiln_attr_float(n, "act_alpha", -FLT_MAX);
    ci->beta = kiln_attr_float(n, "act_beta", FLT_MAX);
    kiln_error_clear(); /* a mistyped attribute just means no match */
    return true;
}

/* The activations the fused kernel applies: none, Relu, Clip (lo <= hi), SiLU. */
static bool act_ok(const struct conv_info *ci)
{
    if (!strcmp(ci->act, "") || !strcmp(ci->act, "Relu") || !strcmp(ci->act, "SiLU")) return true;
    return !strcmp(ci->act, "Clip") && ci->alpha <= ci->beta;
}

/* v is blocked by 16, read only by node `reader`, and no graph output. */
static bool inner_value(const struct kiln_graph *g, int v, int reader)
{
    return v >= 0 && g->values[v].layout == 16 && kiln_opt_single_consumer(g, v) == reader &&
           !kiln_opt_is_graph_output(g, v);
}

/* The activation attributes of stage `stage` (0 expand, 1 depthwise, 2 project,
 * 3 the squeeze-excitation's first convolution);
 * attribute names are kept by pointer, so they are literals. */
static kiln_status set_act(struct kiln_graph *g, int ni, int *na, int stage,
                           const struct conv_info *c)
{
    static const char *const names[4][3] = {
        {"expand_activation", "expand_act_alpha", "expand_act_beta"},
        {"dw_activation", "dw_act_alpha", "dw_act_beta"},
        {"activation", "act_alpha", "act_beta"},
        {"se_activation", "se_act_alpha", "se_act_beta"},
    };
    kiln_status st = kiln_opt_attr_str(g, ni, (*na)++, names[stage][0], c->act);
    if (st != KILN_OK) return st;
    kiln_opt_attr_float(g, ni, (*na)++, names[stage][1], c->alpha);
    kiln_opt_attr_float(g, ni, (*na)++, names[stage][2], c->beta);
    return KILN_OK;
}

/* A 1x1 convolution, stride 1, group 1 (a residual Sum is checked by the caller). */
static bool pointwise(const struct conv_info *c)
{
    return c->k == 1 && c->s == 1 && c->group == 1;
}

/* An expand or squeeze convolution: pointwise, no Sum, an activation the kernel applies. */
static bool is_1x1(const struct conv_info *c)
{
    return pointwise(c) && c->sum < 0 && act_ok(c);
}

/* A depthwise convolution (group = channels) with a kernel the fused kernel
 * specializes (3x3, 5x5). */
static bool is_depthwise(const struct kiln_graph *g, int di, struct conv_info *d)
{
    return conv_info(g, di, d) && act_ok(d) && (d->k == 3 || d->k == 5) && d->sum < 0 &&
           d->group == d->w->dims[0] && d->w->dims[1] == 1;
}

/* A squeeze-excitation of D (see the file comment) ending in the Mul node
 * mi that writes the project's input: f1 and f2 are its two convolutions,
 * d_val is D, nodes[] the n_nodes nodes it replaces (pool, reorders, f1,
 * f2, Mul). */
struct se_match {
    struct conv_info f1, f2;
    int d_val;
    int n_nodes;
    int nodes[8];
};

/* The producer of v, which only `reader` reads, looking through a
 * KilnReorder (recorded in se) that only `reader` reads; -1 if none. */
static int se_producer(const struct kiln_graph *g, int v, int reader, struct se_match *se)
{
    int pi = kiln_opt_single_consumer(g, v) == reader ? kiln_opt_producer(g, v) : -1;
    if (pi >= 0 && g->nodes[pi].op == KILN_OP_KilnReorder) {
        se->nodes[se->n_nodes++] = pi;
        int rv = g->nodes[pi].in[0];
        pi = kiln_opt_single_consumer(g, rv) == pi ? kiln_opt_producer(g, rv) : -1;
    }
    return pi;
}

static bool match_se(const struct kiln_graph *g, int mi, struct se_match *se)
{
    const struct kiln_node *m = &g->nodes[mi];
    if (m->op != KILN_OP_Mul || m->n_in != 2 || m->n_out != 1) return false;
    for (int side = 0; side < 2; side++) {
        int dv = m->in[side], sv = m->in[1 - side];
        se->n_nodes = 0;
        se->nodes[se->n_nodes++] = mi;
        if (dv < 0 || sv < 0 || g->values[dv].layout != 16 || g->values[dv].uses != 2 ||
            kiln_opt_is_graph_output(g, dv))
            continue;
        int f2 = se_producer(g, sv, mi, se);
        if (f2 < 0 || !conv_info(g, f2, &se->f2) || !pointwise(&se->f2) || se->f2.sum >= 0 ||
            strcmp(se->f2.act, "Sigmoid") != 0)
            continue;
        se->nodes[se->n_nodes++] = f2;
        int f1 = se_producer(g, g->nodes[f2].in[0], f2, se);
        if (f1 < 0 || !conv_info(g, f1, &se->f1) || !is_1x1(&se->f1)) continue;
        se->nodes[se->n_nodes++] = f1;
        int pi = se_producer(g, g->nodes[f1].in[0], f1, se);
        if (pi < 0 || g->nodes[pi].op != KILN_OP_GlobalAveragePool || g->nodes[pi].n_in != 1 ||
            g->nodes[pi].in[0] != dv)
            continue;
        se->nodes[se->n_nodes++] = pi;
        /* W1 [Cse, Ce, 1, 1] and W2 [Ce, Cse, 1, 1] chain (Ce checked by the caller) */
        if (se->f2.w->dims[1] != se->f1.w->dims[0] || se->f1.w->dims[1] != se->f2.w->dims[0])
            continue;
        se->d_val = dv;
        return true;
    }
    return false;
}

/* Replace expand e (NULL = none), depthwise d and project p, reading x, by
 * one KilnMBConv writing y. */
static kiln_status emit(struct kiln_graph *g, struct kiln_opt_pass_log *pl,
                        const struct conv_info *e, const struct conv_info *d,
                        const struct conv_info *p, const struct se_match *se, int x, int y)
{
    static const struct conv_info none = {.node = -1, .bias = -1, .sum = -1, .act = ""};
    int n_in = se ? 12 : p->sum >= 0 ? 8 : 7, ni;
    kiln_status st = kiln_opt_add_node(g, KILN_OP_KilnMBConv, g->nodes[p->node].name, n_in, 1,
                                       se ? 14 : 11, g->nodes[p->node].opset, &ni);
    if (st != KILN_OK) return st;
    int na = 0;
    kiln_opt_attr_int(g, ni, na++, "dw_kernel", d->k);
    kiln_opt_attr_int(g, ni, na++, "dw_stride", d->s);
    if ((st = set_act(g, ni, &na, 0, e ? e : &none)) != KILN_OK) return st;
    if ((st = set_act(g, ni, &na, 1, d)) != KILN_OK) return st;
    if ((st = set_act(g, ni, &na, 2, p)) != KILN_OK) return st;
    if (se && (st = set_act(g, ni, &na, 3, &se->f1)) != KILN_OK) return st;
    g->nodes[ni].n_attr = na;
    const int ins[12] = {x,
                         e ? g->nodes[e->node].in[1] : -1,
                         e ? e->bias : -1,
                         g->nodes[d->node].in[1],
                         d->bias,
                         g->nodes[p->node].in[1],
                         p->bias,
                         p->sum,
                         se ? g->nodes[se->f1.node].in[1] : -1,
                         se ? se->f1.bias : -1,
                         se ? g->nodes[se->f2.node].in[1] : -1,
                         se ? se->f2.bias : -1};
    for (int k = 0; k < n_in; k++) kiln_opt_set_input(g, ni, k, ins[k]);
    kiln_opt_remove_node(g, p->node);
    for (int k = 0; se && k < se->n_nodes; k++) kiln_opt_remove_node(g, se->nodes[k]);
    kiln_opt_remove_node(g, d->node);
    if (e) kiln_opt_remove_node(g, e->node);
    kiln_opt_set_output(g, ni, 0, y);
    static const char *const kinds[2][2][2] = {
        {{"Depthwise+Project", "Depthwise+Project+Add"},
         {"Depthwise+SE+Project", "Depthwise+SE+Project+Add"}},
        {{"MBConv", "MBConv+Add"}, {"MBConv+SE", "MBConv+SE+Add"}},
    };
    kiln_opt_count(pl, kinds[e != NULL][se != NULL][p->sum >= 0]);
    return KILN_OK;
}

kiln_status kiln_opt_mbconv(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    const char *env = getenv("KILN_MBCONV");
    if ((env && strcmp(env, "0") == 0) || kiln_cpu_isa() != KILN_ISA_AVX512 ||
        !kiln_mbconv_cpu_ok())
        return KILN_OK;
    int n_nodes = g->n_nodes;
    for (int pi = 0; pi < n_nodes; pi++) {
        struct conv_info p, d, e;
        if (!conv_info(g, pi, &p) || !pointwise(&p) || !act_ok(&p)) continue;
        int y = g->nodes[pi].out[0], dv = g->nodes[pi].in[0];
        if (g->values[y].layout != 16 || !inner_value(g, dv, pi)) continue;
        if (p.sum >= 0 && g->values[p.sum].layout != 16) continue;
        int di = kiln_opt_producer(g, dv);
        struct se_match se;
        bool has_se = di >= 0 && match_se(g, di, &se);
        if (has_se) di = kiln_opt_producer(g, dv = se.d_val);
        if (di < 0 || !is_depthwise(g, di, &d) || p.w->dims[1] != d.w->dims[0]) continue;
        if (has_se && se.f1.w->dims[1] != d.w->dims[0]) continue;
        int ev = g->nodes[di].in[0];
        int ei = inner_value(g, ev, di) ? kiln_opt_producer(g, ev) : -1;
        bool has_e = ei >= 0 && conv_info(g, ei, &e) && is_1x1(&e) &&
                     e.w->dims[0] == d.w->dims[0];
        int x = has_e ? g->nodes[ei].in[0] : ev;
        if (g->values[x].layout != 16 || g->values[x].type.rank != 4) continue;
        kiln_status st = emit(g, pl, has_e ? &e : NULL, &d, &p, has_se ? &se : NULL, x, y);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}
