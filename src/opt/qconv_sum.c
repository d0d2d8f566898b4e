/*
 * qconv_sum.c - the qconv_sum pass (after the layout pass): a QLinearConv
 * whose 8-bit output a is read only by a KilnQLinearAdd (the residual Add
 * of a static int8 CNN, src/opt/qadd.c) becomes one KilnQLinearConvAdd, so
 * the convolution adds the other operand b as oneDNN's sum post-op while
 * it writes its output (src/kernels/dnnl/qlinear.c), in place of b's
 * buffer where the plan can give it (nothing reads b later), instead of
 * writing a and running a separate pass over a, b and y.
 *
 * Taken: a, b and y stored channels last (KILN_LAYOUT_NHWC: the
 * convolution is one of the layout pass's int8 sources, so oneDNN's VNNI
 * kernel runs it), b of y's dtype (the sum reads the destination as y's
 * type), the Add's a_scale / a_zp the same constants as the convolution's
 * y_scale / y_zp, a not a graph output. The zero points may all differ
 * (the sum post-op subtracts b's, the destination's is y's). Either operand
 * may be the convolution's; the first that qualifies is taken.
 * KILN_QSUM=0 in the environment turns the pass off.
 */
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "kernels/kernel.h"
#include "opt/opt.h"

/* Whether inputs i of p and j of q are the same constant (both absent counts too). */
static bool same_const(const struct kiln_graph *g, const struct kiln_node *p, int i,
                       const struct kiln_node *q, int j)
{
    int a = i < p->n_in ? p->in[i] : -1, b = j < q->n_in ? q->in[j] : -1;
    if (a < 0 || b < 0) return a == b;
    if (a == b) return true;
    const kiln_tensor *ta = kiln_opt_const(g, a), *tb = kiln_opt_const(g, b);
    return ta && tb && ta->dtype == tb->dtype && ta->nbytes == tb->nbytes &&
           memcmp(ta->data, tb->data, ta->nbytes) == 0;
}

static bool nhwc(const struct kiln_graph *g, int v)
{
    return v >= 0 && g->values[v].layout == KILN_LAYOUT_NHWC && g->values[v].type.rank == 4;
}

/* The QLinearConv producing operand k (0 or 1) of the Add ai, fusable; -1 if none. */
static int conv_of(const struct kiln_graph *g, int ai, int k)
{
    const struct kiln_node *ad = &g->nodes[ai];
    int v = ad->in[3 * k], o = ad->in[3 * (1 - k)], y = ad->out[0];
    int ci = kiln_opt_producer(g, v);
    if (ci < 0 || kiln_opt_single_consumer(g, v) != ai || kiln_opt_is_graph_output(g, v))
        return -1;
    const struct kiln_node *c = &g->nodes[ci];
    if (c->op != KILN_OP_QLinearConv || c->n_out != 1 || c->n_in < 8 || c->n_in > 9) return -1;
    if (!nhwc(g, c->in[0]) || !nhwc(g, v) || !nhwc(g, o) || !nhwc(g, y)) return -1;
    if (g->values[o].type.dtype != g->values[y].type.dtype) return -1;
    if (!kiln_opt_same_shape(&g->values[o].type, &g->values[y].type)) return -1;
    if (!same_const(g, c, 6, ad, 3 * k + 1) || !same_const(g, c, 7, ad, 3 * k + 2)) return -1;
    return ci;
}

kiln_status kiln_opt_qconv_sum(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    const char *off = getenv("KILN_QSUM");
    if (off && strcmp(off, "0") == 0) return KILN_OK;
    int n_nodes = g->n_nodes;
    for (int ai = 0; ai < n_nodes; ai++) {
        const struct kiln_node *ad = &g->nodes[ai];
        if (kiln_opt_node_dead(ad) || ad->op != KILN_OP_KilnQLinearAdd || ad->n_in != 8 ||
            ad->n_out != 1 || ad->in[0] < 0 || ad->in[3] < 0 || ad->out[0] < 0)
            continue;
        const char *act = kiln_attr_str(ad, "activation", "");
        if (kiln_attr_check(ad) != KILN_OK) {
            kiln_error_clear();
            continue;
        }
        if (act[0] && strcmp(act, "Relu")) continue;
        int k = 0, ci = conv_of(g, ai, 0);
        if (ci < 0) ci = conv_of(g, ai, k = 1);
        if (ci < 0) continue;
        bool relu = act[0] != 0;
        const struct kiln_node *c = &g->nodes[ci];
        int in[14];
        for (int i = 0; i < 9; i++) in[i] = i < c->n_in ? c->in[i] : -1;
        int ob = 3 * (1 - k);
        in[9] = ad->in[ob];
        in[10] = ad->in[ob + 1];
        in[11] = ad->in[ob + 2];
        in[12] = ad->in[6];
        in[13] = ad->in[7];
        int y = ad->out[0], ni;
        kiln_status st = kiln_opt_add_node(g, KILN_OP_KilnQLinearConvAdd, c->name, 14, 1,
                                           c->n_attr + 1, c->opset, &ni);
        if (st != KILN_OK) return st;
        c = &g->nodes[ci];
        struct kiln_node *f = &g->nodes[ni];
        int na = 0;
        for (int i = 0; i < c->n_attr; i++)
            if (strcmp(c->attr[i].name, "activation")) f->attr[na++] = c->attr[i];
        if (relu && (st = kiln_opt_attr_str(g, ni, na++, "activation", "Relu")) != KILN_OK)
            return st;
        g->nodes[ni].n_attr = na;
        kiln_opt_set_output(g, ni, 0, y);
        for (int i = 0; i < 14; i++) kiln_opt_set_input(g, ni, i, in[i]);
        kiln_opt_remove_node(g, ai);
        kiln_opt_remove_node(g, ci);
        g->values[y].producer = ni;
        if (pl) kiln_opt_count(pl, relu ? "KilnQLinearConvAdd+Relu" : "KilnQLinearConvAdd");
    }
    return KILN_OK;
}
