/*
 * opt.c - the optimizer pipeline and the helpers passes share.
 *
 * Pass order (each pass is its own file):
 *   qdq_fusion             DQ -> Conv / MatMul / Gemm [-> Relu] -> Q -> QLinearConv,
 *                          KilnQLinearMatMul (quantized models on int8 kernels)
 *   identity_elimination   Identity, Dropout (inference), no-op Reshape / Cast
 *   constant_folding       nodes whose inputs are all constants, Shape of typed values
 *   dead_code_elimination
 *   cse                    identical nodes, identical small constants
 *   identity_elimination   again: Reshapes whose target folded to their input's shape
 *   gelu_fusion            x*0.5*(1+Erf(x/sqrt2)) and the tanh form -> Gelu
 *   layernorm_fusion       ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add -> LayerNormalization
 *   transpose_cancel       Transpose followed by its inverse (or two composed into one)
 *   attention_fusion       Q/K/V reshape+transpose, MatMul, scale, mask, Softmax, MatMul -> Attention
 *   conv_slice_fold        Conv + Slice of spatial axes -> Conv with less padding
 *                          (causal convolutions: TCN, WaveNet)
 *   conv_tap_cut           Conv taps that only read padding dropped (dilated
 *                          convolutions on small images: DeepLab's ASPP)
 *   conv_bn_fold           Conv / Gemm + BatchNormalization -> new weights
 *   conv_fusion            Conv + bias + residual Add + activation -> KilnFusedConv
 *   matmul_fusion          Gemm / MatMul + bias + residual Add + activation -> KilnFusedMatMul
 *   transpose_matmul       MatMul reading Transposes -> KilnMatMulT (strided operands)
 *   qadd_fusion            Q(Relu(DQ(a) + DQ(b))) -> KilnQLinearAdd (static int8 residuals)
 *   qlut_fusion            DQ -> float elementwise ops [-> Q] -> KilnLut8 (a 256-entry table)
 *   dead_code_elimination
 *   layout                 (layout.c, when options ask for it and it is linked in)
 *   mbconv_fusion          (after layout) blocked expand / depthwise / [SE] / project -> KilnMBConv
 *   qconv_sum              (after layout) QLinearConv -> KilnQLinearAdd on channels-last values
 *                          -> KilnQLinearConvAdd (the Add as oneDNN's sum post-op)
 *
 * Removed nodes are marked (op_type points at dead_tag, no inputs or
 * outputs) and dropped by kiln_opt_compact after each pass, which also
 * re-verifies the graph so the next pass sees a fresh topological order and
 * exact use counts; static types are then re-inferred (folded shapes make
 * more of them known, and the fusions match on them).
 */
#include "opt/opt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/tensor.h"
#include "import/model.h"
#include "kernels/kernel.h"

static const char dead_tag[] = "<removed>";

bool kiln_opt_node_dead(const struct kiln_node *n) { return n->op_type == dead_tag; }

bool kiln_opt_is_graph_output(const struct kiln_graph *g, int v)
{
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v) return true;
    return false;
}

void kiln_opt_count(struct kiln_opt_pass_log *pl, const char *kind)
{
    if (!pl) return;
    for (int i = 0; i < pl->n_kinds; i++)
        if (strcmp(pl->kinds[i].kind, kind) == 0) {
            pl->kinds[i].count++;
            return;
        }
    if (pl->n_kinds == KILN_OPT_MAX_KINDS) return;
    pl->kinds[pl->n_kinds].kind = kind;
    pl->kinds[pl->n_kinds].count = 1;
    pl->n_kinds++;
}

void kiln_opt_remove_node(struct kiln_graph *g, int node_index)
{
    struct kiln_node *n = &g->nodes[node_index];
    if (kiln_opt_node_dead(n)) return;
    for (int k = 0; k < n->n_in; k++)
        if (n->in[k] >= 0) g->values[n->in[k]].uses--;
    for (int k = 0; k < n->n_implicit; k++) g->values[n->implicit[k]].uses--;
    for (int k = 0; k < n->n_out; k++) {
        int v = n->out[k];
        if (v >= 0 && g->values[v].kind == KILN_VALUE_NODE && g->values[v].producer == node_index)
            g->values[v].producer = -1;
    }
    n->n_in = 0;
    n->n_out = 0;
    n->n_implicit = 0;
    n->op_type = dead_tag;
}

/* Replace captures of `from` by `to` in the direct subgraphs of node n. */
static void replace_captures(struct kiln_node *n, int from, int to)
{
    for (int k = 0; k < n->n_attr; k++) {
        struct kiln_graph *sub = n->attr[k].type == KILN_ATTR_GRAPH ? n->attr[k].g : NULL;
        if (!sub) continue;
        for (int v = 0; v < sub->n_values; v++)
            if (sub->values[v].kind == KILN_VALUE_OUTER && sub->values[v].outer == from)
                sub->values[v].outer = to;
    }
}

void kiln_opt_replace_uses(struct kiln_graph *g, int from, int to)
{
    if (from == to) return;
    int moved = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        struct kiln_node *n = &g->nodes[i];
        if (kiln_opt_node_dead(n)) continue;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] == from) {
                n->in[k] = to;
                moved++;
            }
        bool cap = false;
        for (int k = 0; k < n->n_implicit; k++)
            if (n->implicit[k] == from) {
                n->implicit[k] = to;
                moved++;
                cap = true;
            }
        if (cap) replace_captures(n, from, to);
    }
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == from) {
            g->outputs[i] = to;
            moved++;
        }
    g->values[from].uses -= moved;
    g->values[to].uses += moved;
}

int kiln_opt_single_consumer(const struct kiln_graph *g, int v)
{
    if (v < 0 || g->values[v].uses != 1 || kiln_opt_is_graph_output(g, v)) return -1;
    int found = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct kiln_node *n = &g->nodes[i];
        if (kiln_opt_node_dead(n)) continue;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] == v) {
                if (found >= 0) return -1;
                found = i;
            }
        for (int k = 0; k < n->n_implicit; k++)
            if (n->implicit[k] == v) return -1;
    }
    return found;
}

void kiln_opt_set_input(struct kiln_graph *g, int ni, int k, int v)
{
    struct kiln_node *n = &g->nodes[ni];
    if (n->in[k] >= 0) g->values[n->in[k]].uses--;
    n->in[k] = v;
    if (v >= 0) g->values[v].uses++;
}

kiln_status kiln_opt_add_node(struct kiln_graph *g, enum kiln_op op, const char *name, int n_in,
                              int n_out, int n_attr, int opset, int *ni)
{
    struct kiln_node *n;
    kiln_status st = kiln_graph_node_add(g, op, name, n_in, n_out, n_attr, &n);
    if (st != KILN_OK) return st;
    n->opset = opset;
    *ni = g->n_nodes - 1;
    return KILN_OK;
}

void kiln_opt_set_output(struct kiln_graph *g, int ni, int k, int v)
{
    g->nodes[ni].out[k] = v;
    if (v >= 0) {
        g->values[v].kind = KILN_VALUE_NODE;
        g->values[v].producer = ni;
    }
}

/* A fresh value name "<base>/opt_<id>". */
static kiln_status fresh_value(struct kiln_graph *g, const char *base, enum kiln_value_kind kind,
                               int *id)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%.200s/opt_%d", base ? base : "", g->n_values);
    return kiln_graph_value_add(g, buf, kind, id);
}

kiln_status kiln_opt_add_value(struct kiln_graph *g, const char *base, const struct kiln_type *t,
                               int *id)
{
    kiln_status st = fresh_value(g, base, KILN_VALUE_NODE, id);
    if (st != KILN_OK) return st;
    struct kiln_value *v = &g->values[*id];
    if (t) v->type = *t;
    else kiln_type_unknown(&v->type);
    v->producer = -1;
    return KILN_OK;
}

kiln_status kiln_opt_add_const(struct kiln_graph *g, const char *base, kiln_tensor *t, int *id)
{
    kiln_status st = kiln_graph_own_tensor(g, t);
    if (st != KILN_OK) return st;
    st = fresh_value(g, base, KILN_VALUE_CONST, id);
    if (st != KILN_OK) return st;
    struct kiln_value *v = &g->values[*id];
    v->konst = t;
    v->producer = -1;
    kiln_type_from_tensor(&v->type, t);
    return KILN_OK;
}

const kiln_tensor *kiln_opt_const(const struct kiln_graph *g, int v)
{
    if (v < 0 || v >= g->n_values || g->values[v].kind != KILN_VALUE_CONST) return NULL;
    return g->values[v].konst;
}

bool kiln_opt_const_scalar(const struct kiln_graph *g, int v, float *out)
{
    const kiln_tensor *t = kiln_opt_const(g, v);
    if (!t || t->dtype != KILN_DTYPE_F32 || kiln_tensor_count(t) != 1) return false;
    *out = ((const float *)t->data)[0];
    return true;
}

int kiln_opt_producer(const struct kiln_graph *g, int v)
{
    if (v < 0 || v >= g->n_values || g->values[v].kind != KILN_VALUE_NODE) return -1;
    int p = g->values[v].producer;
    if (p < 0 || p >= g->n_nodes || kiln_opt_node_dead(&g->nodes[p])) return -1;
    return p;
}

void kiln_opt_attr_int(struct kiln_graph *g, int ni, int k, const char *name, int64_t v)
{
    struct kiln_attr *a = &g->nodes[ni].attr[k];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = KILN_ATTR_INT;
    a->i = v;
}

void kiln_opt_attr_float(struct kiln_graph *g, int ni, int k, const char *name, float v)
{
    struct kiln_attr *a = &g->nodes[ni].attr[k];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = KILN_ATTR_FLOAT;
    a->f = v;
}

kiln_status kiln_opt_set_ints(struct kiln_graph *g, int ni, const char *name, const int64_t *v,
                              int n)
{
    struct kiln_node *c = &g->nodes[ni];
    int found = -1;
    for (int i = 0; i < c->n_attr; i++)
        if (c->attr[i].name && !strcmp(c->attr[i].name, name)) found = i;
    int n_attr = c->n_attr + (found < 0 ? 1 : 0);
    struct kiln_attr *attr = kiln_arena_alloc(g->mem, sizeof *attr * (size_t)n_attr);
    int64_t *nv = kiln_arena_alloc(g->mem, sizeof *nv * (size_t)(n > 0 ? n : 1));
    if (!attr || !nv) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory setting '%s'", name);
    memcpy(nv, v, sizeof *nv * (size_t)n);
    memcpy(attr, c->attr, sizeof *attr * (size_t)c->n_attr);
    struct kiln_attr *a = &attr[found < 0 ? c->n_attr : found];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = KILN_ATTR_INTS;
    a->n = n;
    a->ints = nv;
    c->attr = attr;
    c->n_attr = n_attr;
    return KILN_OK;
}

kiln_status kiln_opt_attr_str(struct kiln_graph *g, int ni, int k, const char *name, const char *v)
{
    char *s = kiln_arena_strdup(g->mem, v);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "optimizer: out of memory");
    struct kiln_attr *a = &g->nodes[ni].attr[k];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = KILN_ATTR_STRING;
    a->s.data = s;
    a->s.len = strlen(s);
    return KILN_OK;
}

bool kiln_opt_same_shape(const struct kiln_type *a, const struct kiln_type *b)
{
    if (a->rank < 0 || a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++) {
        if (a->dims[i] >= 0 && a->dims[i] == b->dims[i]) continue;
        if (a->dims[i] < 0 && b->dims[i] < 0 && a->sym[i] && b->sym[i] &&
            strcmp(a->sym[i], b->sym[i]) == 0)
            continue;
        return false;
    }
    return true;
}

kiln_status kiln_opt_compact(struct kiln_graph *g)
{
    int w = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (kiln_opt_node_dead(&g->nodes[i])) continue;
        if (w != i) g->nodes[w] = g->nodes[i];
        struct kiln_node *n = &g->nodes[w];
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] >= 0) {
                g->values[n->out[k]].kind = KILN_VALUE_NODE;
                g->values[n->out[k]].producer = w;
            }
        w++;
    }
    g->n_nodes = w;
    return kiln_graph_verify(g);
}

/* ---- pipeline ---- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int live_nodes(const struct kiln_graph *g)
{
    int c = 0;
    for (int i = 0; i < g->n_nodes; i++) c += !kiln_opt_node_dead(&g->nodes[i]);
    return c;
}

typedef kiln_status (*pass_fn)(struct kiln_graph *g, struct kiln_opt_pass_log *pl);

kiln_status kiln_optimize(struct kiln_graph *g, const struct kiln_opt_options *o,
                          struct kiln_opt_log *log)
{
    static const struct {
        const char *name;
        pass_fn fn;
    } passes[] = {
        {"qdq_fusion", kiln_opt_qdq}, /* before folding dequantizes the int8 weights */
        {"identity_elimination", kiln_opt_identity},
        {"constant_folding", kiln_opt_fold},
        {"dead_code_elimination", kiln_opt_dce},
        {"cse", kiln_opt_cse},
        {"identity_elimination", kiln_opt_identity}, /* Reshapes whose shape folded */
        {"gelu_fusion", kiln_opt_gelu},
        {"layernorm_fusion", kiln_opt_layernorm},
        {"groupnorm_fusion", kiln_opt_groupnorm}, /* Reshape, InstanceNorm, Reshape, affine */
        {"transpose_cancel", kiln_opt_transpose},
        {"attention_fusion", kiln_opt_attention},
        {"conv_slice_fold", kiln_opt_conv_slice}, /* before conv_bn_fold: causal convs */
        {"conv_tap_cut", kiln_opt_conv_taps}, /* after conv_slice_fold: its smaller pads */
        {"conv_bn_fold", kiln_opt_conv_bn},
        {"conv_fusion", kiln_opt_fuse_conv},
        {"matmul_fusion", kiln_opt_fuse_matmul},
        {"transpose_matmul", kiln_opt_transpose_matmul}, /* products read Transposes' inputs */
        {"qadd_fusion", kiln_opt_qadd}, /* Q(Relu(DQ + DQ)) -> KilnQLinearAdd */
        {"qlut_fusion", kiln_opt_qlut}, /* DQ -> SiLU / Sigmoid ... [-> Q] -> KilnLut8 */
        {"silu_fusion", kiln_opt_silu}, /* x * Sigmoid(x) left after the fusions above */
        {"dead_code_elimination", kiln_opt_dce},
    };
    struct kiln_opt_log local;
    if (!log) log = &local;
    memset(log, 0, sizeof *log);
    if (!g) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_optimize: NULL graph");
    kiln_status st = kiln_graph_verify(g);
    if (st != KILN_OK) return st;
    log->nodes_before = g->n_nodes;
    int n_passes = (int)(sizeof passes / sizeof passes[0]);
    bool layout = o && o->layout && kiln_opt_layout != NULL;
    /* the passes that need blocked layouts run after the layout pass */
    static const struct {
        const char *name;
        pass_fn fn;
    } late[] = {
        {"layout", kiln_opt_layout}, /* weak: n_late is 0 without it */
        {"mbconv_fusion", kiln_opt_mbconv},
        {"qconv_sum", kiln_opt_qconv_sum}, /* QLinearConv + KilnQLinearAdd on NHWC values */
    };
    int n_late = layout ? (int)(sizeof late / sizeof late[0]) : 0;
    for (int i = 0; i < n_passes + n_late; i++) {
        struct kiln_opt_pass_log *pl =
            log->n_passes < KILN_OPT_MAX_PASSES ? &log->passes[log->n_passes++] : NULL;
        struct kiln_opt_pass_log scratch;
        if (!pl) pl = &scratch;
        memset(pl, 0, sizeof *pl);
        pass_fn fn = i < n_passes ? passes[i].fn : late[i - n_passes].fn;
        pl->pass = i < n_passes ? passes[i].name : late[i - n_passes].name;
        pl->nodes_before = g->n_nodes;
        double t0 = now_ms();
        st = fn(g, pl);
        /* the graph stays valid on a pass error: compact and verify whatever happened */
        kiln_status cst = kiln_opt_compact(g);
        /* later passes match on types: refine them with what this pass made constant or fused */
        if (cst == KILN_OK) cst = kiln_graph_infer(g);
        pl->nodes_after = live_nodes(g);
        pl->ms = now_ms() - t0;
        if (st != KILN_OK) return kiln_error_wrap(st, "optimizer pass %s", pl->pass);
        if (cst != KILN_OK) return kiln_error_wrap(cst, "after optimizer pass %s", pl->pass);
    }
    log->nodes_after = g->n_nodes;
    return KILN_OK;
}

void kiln_opt_log_print(const struct kiln_opt_log *log, void (*line)(void *ctx, const char *s),
                        void *ctx)
{
    char buf[512];
    snprintf(buf, sizeof buf, "optimizer: %d -> %d nodes", log->nodes_before, log->nodes_after);
    line(ctx, buf);
    for (int i = 0; i < log->n_passes; i++) {
        const struct kiln_opt_pass_log *p = &log->passes[i];
        int len = snprintf(buf, sizeof buf, "  %-22s %4d -> %4d nodes %7.2f ms", p->pass,
                           p->nodes_before, p->nodes_after, p->ms);
        for (int k = 0; k < p->n_kinds && len > 0 && (size_t)len < sizeof buf; k++)
            len += snprintf(buf + len, sizeof buf - (size_t)len, "%s %s x%d", k ? "," : ";",
                            p->kinds[k].kind, p->kinds[k].count);
        line(ctx, buf);
    }
    if (log->plans > 0) {
        snprintf(buf, sizeof buf, "  arena %zu bytes, packed weights %zu bytes (%d plan%s)",
                 log->arena_bytes, log->packed_weight_bytes, log->plans,
                 log->plans == 1 ? "" : "s");
        line(ctx, buf);
    } else {
        line(ctx, "  arena: no plan yet (plans compile per input shape, at the first run of each; "
                  "a server precompiles the batch sizes its warmup or batching config names)");
    }
}

bool kiln_opt_bypass(struct kiln_graph *g, int ni, int in_v, int out_v)
{
    if (in_v < 0 || out_v < 0 || in_v == out_v) return false;
    if (!kiln_opt_is_graph_output(g, out_v)) {
        kiln_opt_replace_uses(g, out_v, in_v);
        kiln_opt_remove_node(g, ni);
        return true;
    }
    /* out_v must keep its id: in_v's producer writes out_v instead */
    int p = kiln_opt_producer(g, in_v);
    if (p < 0 || p == ni || kiln_opt_is_graph_output(g, in_v)) return false;
    struct kiln_node *pn = &g->nodes[p];
    int slot = -1;
    for (int k = 0; k < pn->n_out; k++)
        if (pn->out[k] == in_v) slot = k;
    if (slot < 0) return false;
    kiln_opt_remove_node(g, ni);
    kiln_opt_replace_uses(g, in_v, out_v);
    kiln_opt_set_output(g, p, slot, out_v);
    g->values[in_v].producer = -1;
    return true;
}
