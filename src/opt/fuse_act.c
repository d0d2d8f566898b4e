/*
 * fuse_act.c - Conv + bias Add + residual Add + activation -> KilnFusedConv,
 * and the activation matcher the MatMul fusion shares.
 *
 * From a float32 Conv the pass follows single-consumer edges: an Add of a
 * constant per-channel bias (when the Conv has none), an Add of another
 * value of exactly the Conv's output shape (the residual, becomes Sum),
 * then one activation (Relu, Clip with constant bounds, LeakyRelu,
 * HardSwish, HardSigmoid, Sigmoid, x*Sigmoid(x) as SiLU, Gelu, Tanh). The
 * last value of the chain keeps its id: the fused node writes it.
 * ConvTranspose + bias Add + activation -> KilnFusedConvTranspose likewise
 * (no residual).
 */
#include <float.h>
#include <pthread.h>
#include <stdio.h>

#include "core/tensor.h"
#include "kernels/kernel.h"
#include "opt/opt.h"

/* ---- fusion kind names ---- */

static const char *const act_names[] = {"",           "Relu",      "Clip",    "LeakyRelu",
                                        "HardSwish",  "HardSigmoid", "Sigmoid", "SiLU",
                                        "Tanh",       "Gelu",      "GeluTanh"};
#define N_ACTS ((int)(sizeof act_names / sizeof act_names[0]))
static const char *const bases[] = {"Conv", "Gemm", "MatMul", "ConvTranspose"};
#define N_BASES 4
static char kinds[N_BASES][2][2][N_ACTS][64];
static pthread_once_t kinds_once = PTHREAD_ONCE_INIT;

static void kinds_init(void)
{
    for (int b = 0; b < N_BASES; b++)
        for (int bi = 0; bi < 2; bi++)
            for (int s = 0; s < 2; s++)
                for (int a = 0; a < N_ACTS; a++)
                    snprintf(kinds[b][bi][s][a], sizeof kinds[b][bi][s][a], "%s%s%s%s%s", bases[b],
                             bi ? "+Bias" : "", s ? "+Add" : "", a ? "+" : "", act_names[a]);
}

const char *kiln_opt_fusion_kind(const char *base, bool bias, bool sum, const char *act)
{
    pthread_once(&kinds_once, kinds_init);
    int b = 0, a = 0;
    for (int i = 0; i < N_BASES; i++)
        if (strcmp(bases[i], base) == 0) b = i;
    for (int i = 0; i < N_ACTS; i++)
        if (act && strcmp(act_names[i], act) == 0) a = i;
    return kinds[b][bias][sum][a];
}

/* ---- activation matcher ---- */

bool kiln_opt_clip_bounds(const struct kiln_graph *g, const struct kiln_node *n, float *lo,
                          float *hi)
{
    *lo = -FLT_MAX;
    *hi = FLT_MAX;
    if (n->opset < 11) {
        *lo = kiln_attr_float(n, "min", -FLT_MAX);
        *hi = kiln_attr_float(n, "max", FLT_MAX);
        if (kiln_attr_check(n) != KILN_OK) {
            kiln_error_clear();
            return false;
        }
        return true;
    }
    if (n->n_in > 1 && n->in[1] >= 0 && !kiln_opt_const_scalar(g, n->in[1], lo)) return false;
    if (n->n_in > 2 && n->in[2] >= 0 && !kiln_opt_const_scalar(g, n->in[2], hi)) return false;
    return true;
}

int kiln_opt_match_residual(const struct kiln_graph *g, int ai, int cur,
                            const struct kiln_type *ty)
{
    if (ai < 0 || g->nodes[ai].op != KILN_OP_Add) return -1;
    const struct kiln_node *a = &g->nodes[ai];
    int other = a->in[0] == cur ? a->in[1] : a->in[0];
    if (other == cur || other < 0 || g->values[other].type.dtype != KILN_DTYPE_F32 ||
        !kiln_opt_same_shape(&g->values[other].type, ty) ||
        !kiln_opt_same_shape(&g->values[a->out[0]].type, ty))
        return -1;
    return other;
}

bool kiln_opt_match_act(const struct kiln_graph *g, int y, struct kiln_opt_act *a)
{
    memset(a, 0, sizeof *a);
    if (y < 0 || g->values[y].type.dtype != KILN_DTYPE_F32 || kiln_opt_is_graph_output(g, y))
        return false;
    /* SiLU: y read by Sigmoid(y) and Mul(y, s), s read only by that Mul */
    if (g->values[y].uses == 2) {
        int sig = -1, mul = -1;
        for (int i = 0; i < g->n_nodes; i++) {
            const struct kiln_node *n = &g->nodes[i];
            if (kiln_opt_node_dead(n)) continue;
            for (int k = 0; k < n->n_in; k++) {
                if (n->in[k] != y) continue;
                if (n->op == KILN_OP_Sigmoid && sig < 0) sig = i;
                else if (n->op == KILN_OP_Mul && mul < 0) mul = i;
                else return false;
            }
        }
        if (sig < 0 || mul < 0) return false;
        int s = g->nodes[sig].out[0];
        const struct kiln_node *m = &g->nodes[mul];
        if (kiln_opt_single_consumer(g, s) != mul) return false;
        if (!((m->in[0] == y && m->in[1] == s) || (m->in[0] == s && m->in[1] == y))) return false;
        a->name = "SiLU";
        a->out = m->out[0];
        a->n_nodes = 2;
        a->nodes[0] = sig;
        a->nodes[1] = mul;
        return true;
    }
    int ci = kiln_opt_single_consumer(g, y);
    if (ci < 0) return false;
    const struct kiln_node *n = &g->nodes[ci];
    if (n->in[0] != y || n->n_out < 1) return false;
    for (int k = 1; k < n->n_in; k++)
        if (n->in[k] == y) return false;
    switch (n->op) {
    case KILN_OP_Relu: a->name = "Relu"; break;
    case KILN_OP_Sigmoid: a->name = "Sigmoid"; break;
    case KILN_OP_Tanh: a->name = "Tanh"; break;
    case KILN_OP_HardSwish: a->name = "HardSwish"; break;
    case KILN_OP_LeakyRelu:
        a->name = "LeakyRelu";
        a->alpha = kiln_attr_float(n, "alpha", 0.01f);
        break;
    case KILN_OP_HardSigmoid:
        a->name = "HardSigmoid";
        a->alpha = kiln_attr_float(n, "alpha", 0.2f);
        a->beta = kiln_attr_float(n, "beta", 0.5f);
        break;
    case KILN_OP_Clip:
        if (!kiln_opt_clip_bounds(g, n, &a->alpha, &a->beta)) return false;
        a->name = "Clip";
        break;
    case KILN_OP_Gelu: {
        const char *ap = kiln_attr_str(n, "approximate", "none");
        if (strcmp(ap, "none") == 0) a->name = "Gelu";
        else if (strcmp(ap, "tanh") == 0) a->name = "GeluTanh";
        break;
    }
    default: break;
    }
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    if (!a->name) return false;
    a->out = n->out[0];
    a->n_nodes = 1;
    a->nodes[0] = ci;
    return true;
}

/* ---- Conv fusion ---- */

/* A constant per-channel bias for m channels of a rank-r NCHW output: [m], or
 * [1, m, 1, ...] / [m, 1, ...] right-aligned. */
static bool channel_bias(const kiln_tensor *t, int64_t m, int r)
{
    if (!t || t->dtype != KILN_DTYPE_F32 || kiln_tensor_count(t) != m || t->rank > r) return false;
    if (t->rank == 1) return m == 1 || r == 1; /* [m] broadcasts over W, not C */
    /* the channel axis is r - 1 - (spatial dims): t's dims right-aligned to r */
    for (int i = 0; i < t->rank; i++) {
        int ax = r - t->rank + i;
        if (ax == 1 ? t->dims[i] != m : t->dims[i] != 1) return false;
    }
    return true;
}

kiln_status kiln_opt_fuse_conv(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes;
    for (int ci = 0; ci < n_nodes; ci++) {
        const struct kiln_node *c = &g->nodes[ci];
        if (kiln_opt_node_dead(c) || (c->op != KILN_OP_Conv && c->op != KILN_OP_ConvTranspose) ||
            c->n_out != 1)
            continue;
        const bool convt = c->op == KILN_OP_ConvTranspose;
        int y = c->out[0];
        const struct kiln_type *ty = &g->values[y].type;
        if (ty->dtype != KILN_DTYPE_F32 || ty->rank < 3) continue;
        int cur = y, bias = c->n_in > 2 ? c->in[2] : -1, sum = -1;
        int rm[4], n_rm = 0;
        bool new_bias = false;
        /* bias Add when the Conv has none */
        int ai = kiln_opt_single_consumer(g, cur);
        if (bias < 0 && ai >= 0 && g->nodes[ai].op == KILN_OP_Add) {
            const struct kiln_node *a = &g->nodes[ai];
            int other = a->in[0] == cur ? a->in[1] : a->in[0];
            const kiln_tensor *bt = kiln_opt_const(g, other);
            int64_t m = ty->dims[1];
            if (m > 0 && channel_bias(bt, m, ty->rank) &&
                g->values[a->out[0]].type.rank == ty->rank) {
                kiln_tensor *nb;
                kiln_status st = kiln_tensor_new(KILN_DTYPE_F32, 1, &m, &nb);
                if (st != KILN_OK) return st;
                memcpy(nb->data, bt->data, sizeof(float) * (size_t)m);
                st = kiln_opt_add_const(g, g->values[other].name, nb, &bias);
                if (st != KILN_OK) return st;
                c = &g->nodes[ci];
                rm[n_rm++] = ai;
                cur = g->nodes[ai].out[0];
                new_bias = true;
                ai = kiln_opt_single_consumer(g, cur);
            }
        }
        /* residual Add of a value with the output's shape */
        int other = convt ? -1 : kiln_opt_match_residual(g, ai, cur, ty);
        if (other >= 0) {
            rm[n_rm++] = ai;
            sum = other;
            cur = g->nodes[ai].out[0];
        }
        struct kiln_opt_act act;
        /* an activation keeps its input's shape (kiln_opt_match_act): no check of the
         * types, whose unknown dims the exporter may name differently per value */
        bool has_act = kiln_opt_match_act(g, cur, &act);
        if (has_act) {
            for (int k = 0; k < act.n_nodes; k++) rm[n_rm++] = act.nodes[k];
            cur = act.out;
        }
        if (n_rm == 0) continue;

        int n_in = sum >= 0 ? 4 : bias >= 0 ? 3 : 2;
        int ni;
        kiln_status st = kiln_opt_add_node(g, convt ? KILN_OP_KilnFusedConvTranspose
                                                 : KILN_OP_KilnFusedConv,
                                           g->nodes[ci].name, n_in, 1,
                                           g->nodes[ci].n_attr + 3, g->nodes[ci].opset, &ni);
        if (st != KILN_OK) return st;
        c = &g->nodes[ci];
        struct kiln_node *f = &g->nodes[ni];
        int na = 0;
        for (int k = 0; k < c->n_attr; k++) {
            const char *an = c->attr[k].name;
            if (strcmp(an, "activation") == 0 || strcmp(an, "act_alpha") == 0 ||
                strcmp(an, "act_beta") == 0)
                continue;
            f->attr[na++] = c->attr[k];
        }
        st = kiln_opt_attr_str(g, ni, na++, "activation", has_act ? act.name : "");
        if (st != KILN_OK) return st;
        kiln_opt_attr_float(g, ni, na++, "act_alpha", has_act ? act.alpha : 0.0f);
        kiln_opt_attr_float(g, ni, na++, "act_beta", has_act ? act.beta : 0.0f);
        g->nodes[ni].n_attr = na;
        kiln_opt_set_input(g, ni, 0, c->in[0]);
        kiln_opt_set_input(g, ni, 1, c->in[1]);
        if (n_in > 2) kiln_opt_set_input(g, ni, 2, bias);
        if (n_in > 3) kiln_opt_set_input(g, ni, 3, sum);
        for (int k = 0; k < n_rm; k++) kiln_opt_remove_node(g, rm[k]);
        kiln_opt_remove_node(g, ci);
        kiln_opt_set_output(g, ni, 0, cur);
        kiln_opt_count(pl, kiln_opt_fusion_kind(convt ? "ConvTranspose" : "Conv", new_bias, sum >= 0,
                                                has_act ? act.name : ""));
    }
    return KILN_OK;
}
