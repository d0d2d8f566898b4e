/*
 * tf_keras_rnn.c - a Keras LSTM loop recognized and replaced by Kiln's LSTM.
 *
 * Keras saves an LSTM layer (when cuDNN is not used, or on the CPU path of
 * `*_with_fallback`) as a While loop over TensorLists. tf_control.c lowers
 * the loop's body into a subgraph; this file looks at that subgraph and,
 * when it is exactly the Keras cell, emits one LSTM op (the ONNX LSTM, with
 * its reference kernel in src/kernels/ref/rnn.c) instead of the Loop, so the
 * signature no longer needs the control-flow executor. Anything that does
 * not match exactly (masking, dropout, peepholes, another cell, a loop that
 * does not run over the whole input) keeps the loop as written.
 *
 * The pattern, on the lowered body (t, h, c, out are loop-carried; X, W, R,
 * b come from outside the loop; W, R and b constants):
 *   z   = MatMul(Gather(X, t), W) + MatMul(h, R) + b     (any operand order)
 *   i, f, g, o = Split(z, 4, axis 1)
 *   c'  = F(f) * c + F(i) * G(g)
 *   h'  = F(o) * H(c')
 *   out' = TfListSetItem(out, t, h'), t' = t + 1, cond = t' < n
 * with F, G, H single-input activations Kiln's LSTM knows (Sigmoid, Tanh,
 * Relu), n == X.shape[0] (n is Shape(X)[0] in the enclosing graph, as Keras
 * writes it), t starting at 0, and `out` reserved with n elements. Other
 * carried values may only be counters (x' = x + 1). The LSTM then gets
 * W [1,4H,I], R [1,4H,H] and B [1,8H] reordered from Keras' gate order
 * (i, f, c, o) to ONNX's (i, o, f, c); the loop's outputs become Y squeezed
 * (the list), Y_h and Y_c (the last h and c), n (t) and x0 + n (counters).
 */
#define _GNU_SOURCE
#include <string.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "import/tf_import.h"
#include "kernels/kernel.h"

typedef struct tf_node_ctx L_t;

/* The node producing v in g if it is an `op` node, else NULL. */
static const struct kiln_node *prod(const struct kiln_graph *g, int v, enum kiln_op op)
{
    if (v < 0 || v >= g->n_values || g->values[v].kind != KILN_VALUE_NODE) return NULL;
    int p = g->values[v].producer;
    if (p < 0 || p >= g->n_nodes || g->nodes[p].op != op) return NULL;
    return &g->nodes[p];
}

static const kiln_tensor *konst(const struct kiln_graph *g, int v)
{
    return v >= 0 && g->values[v].kind == KILN_VALUE_CONST ? g->values[v].konst : NULL;
}

static bool is_const_int(const struct kiln_graph *g, int v, int64_t want)
{
    const kiln_tensor *t = konst(g, v);
    return t && kiln_dtype_is_int(t->dtype) && kiln_tensor_count(t) == 1 &&
           kiln_tensor_i64(t, 0) == want;
}

/* Whether v is x + 1 (either order). */
static bool is_increment(const struct kiln_graph *g, int v, int x)
{
    const struct kiln_node *n = prod(g, v, KILN_OP_Add);
    return n && n->n_in == 2 &&
           ((n->in[0] == x && is_const_int(g, n->in[1], 1)) ||
            (n->in[1] == x && is_const_int(g, n->in[0], 1)));
}

/* The LSTM activation name of a single-input activation node's output, or NULL. */
static const char *act_of(const struct kiln_graph *g, int v, int *x)
{
    static const struct { enum kiln_op op; const char *name; } acts[] = {
        {KILN_OP_Sigmoid, "Sigmoid"}, {KILN_OP_Tanh, "Tanh"}, {KILN_OP_Relu, "Relu"}};
    for (size_t i = 0; i < sizeof acts / sizeof *acts; i++) {
        const struct kiln_node *n = prod(g, v, acts[i].op);
        if (n && n->n_in == 1) {
            *x = n->in[0];
            return acts[i].name;
        }
    }
    return NULL;
}

/* The two inputs of a Mul node producing v. */
static bool mul_parts(const struct kiln_graph *g, int v, int *a, int *b)
{
    const struct kiln_node *n = prod(g, v, KILN_OP_Mul);
    if (!n || n->n_in != 2) return false;
    *a = n->in[0];
    *b = n->in[1];
    return true;
}

/* Whether v = act(x) * y (either order) for the given x and y; the
 * activation's name in *act. */
static bool mul_act_by(const struct kiln_graph *g, int v, int x, int y, const char **act)
{
    int p, q, ax;
    if (!mul_parts(g, v, &p, &q)) return false;
    for (int s = 0; s < 2; s++) {
        int a = s ? q : p, b = s ? p : q;
        if (b == y && (*act = act_of(g, a, &ax)) && ax == x) return true;
    }
    return false;
}

/* Whether v = act1(x1) * act2(x2) (either order); names in *a1, *a2. */
static bool mul_two_acts(const struct kiln_graph *g, int v, int x1, int x2, const char **a1,
                         const char **a2)
{
    int p, q, xp, xq;
    const char *np, *nq;
    if (!mul_parts(g, v, &p, &q) || !(np = act_of(g, p, &xp)) || !(nq = act_of(g, q, &xq)))
        return false;
    if (xp == x1 && xq == x2) {
        *a1 = np;
        *a2 = nq;
        return true;
    }
    if (xp == x2 && xq == x1) {
        *a1 = nq;
        *a2 = np;
        return true;
    }
    return false;
}

/* The value v reduces to through Cast, Reshape, Squeeze and Unsqueeze. */
static int through_casts(const struct kiln_graph *g, int v)
{
    for (int i = 0; i < 8; i++) {
        if (v < 0 || g->values[v].kind != KILN_VALUE_NODE) return v;
        const struct kiln_node *n = &g->nodes[g->values[v].producer];
        if (n->op != KILN_OP_Cast && n->op != KILN_OP_Reshape && n->op != KILN_OP_Squeeze &&
            n->op != KILN_OP_Unsqueeze && n->op != KILN_OP_Identity)
            return v;
        v = n->in[0];
    }
    return v;
}

/* The Shape node producing v, possibly through a Cast (TF's int32 shapes). */
static const struct kiln_node *shape_node(const struct kiln_graph *g, int v)
{
    const struct kiln_node *c = prod(g, v, KILN_OP_Cast);
    return prod(g, c ? c->in[0] : v, KILN_OP_Shape);
}

/* Whether v (in g) is X.shape[0]: Shape(X)[0:1] through Slice or Gather,
 * or a constant equal to X's static first dim. */
static bool is_first_dim(const struct kiln_graph *g, int v, int x)
{
    const kiln_tensor *k = konst(g, v);
    if (k) {
        const struct kiln_type *t = &g->values[x].type;
        return kiln_dtype_is_int(k->dtype) && kiln_tensor_count(k) == 1 && t->rank >= 1 &&
               t->dims[0] >= 0 && kiln_tensor_i64(k, 0) == t->dims[0];
    }
    v = through_casts(g, v);
    const struct kiln_node *sh, *n;
    if ((n = shape_node(g, v))) /* Shape(X, start 0, end 1) */
        return n->in[0] == x && kiln_attr_int(n, "start", 0) == 0 && kiln_attr_int(n, "end", -1) == 1;
    if ((n = prod(g, v, KILN_OP_Gather)) && is_const_int(g, n->in[1], 0) &&
        kiln_attr_int(n, "axis", 0) == 0 && (sh = shape_node(g, n->in[0])))
        return sh->in[0] == x && kiln_attr_int(sh, "start", 0) == 0 && !kiln_node_attr(sh, "end");
    if ((n = prod(g, v, KILN_OP_Slice)) && n->n_in >= 3 && is_const_int(g, n->in[1], 0) &&
        is_const_int(g, n->in[2], 1) && (n->n_in < 4 || n->in[3] < 0 || is_const_int(g, n->in[3], 0)) &&
        (n->n_in < 5 || n->in[4] < 0 || is_const_int(g, n->in[4], 1)) &&
        (sh = shape_node(g, n->in[0])))
        return sh->in[0] == x && kiln_attr_int(sh, "start", 0) == 0 && !kiln_node_attr(sh, "end");
    return false;
}

/* The parent value a subgraph value stands for (captured), or -1. */
static int outer_of(const struct kiln_graph *sub, int v)
{
    return v >= 0 && sub->values[v].kind == KILN_VALUE_OUTER ? sub->values[v].outer : -1;
}

/* What was matched. */
struct rnn_match {
    bool gru;                  /* a GRU (reset_after) cell, else an LSTM cell */
    int jt, jl, jh, jc;        /* carried indices of t, the output list, h and c (-1: GRU) */
    int x, n;                  /* parent values: the input [T,B,I] and the trip count */
    int xt;                    /* sub value: the Gather(X, t) the cell reads */
    const kiln_tensor *w, *r, *b, *rb; /* kernel, recurrent kernel, bias (GRU: input
                                          bias, rb the recurrent bias) */
    const char *act_f, *act_g, *act_h;
};

/* Split(v, k, axis 1) with equal parts: the node, or NULL. */
static const struct kiln_node *split_of(const struct kiln_graph *g, int v, int k)
{
    const struct kiln_node *sp = prod(g, v, KILN_OP_Split);
    if (!sp || sp->n_out != k || (sp->n_in > 1 && sp->in[1] >= 0)) return NULL;
    int64_t ax = kiln_attr_int(sp, "axis", 0);
    return ax == 1 || ax == -1 ? sp : NULL;
}

/* v = MatMul(a, W) + bias (either order of the Add) with W and bias constants. */
static bool affine(const struct kiln_graph *g, int v, int *a, const kiln_tensor **w,
                   const kiln_tensor **bias)
{
    const struct kiln_node *add = prod(g, v, KILN_OP_Add);
    if (!add || add->n_in != 2) return false;
    for (int s = 0; s < 2; s++) {
        const struct kiln_node *mm = prod(g, add->in[s], KILN_OP_MatMul);
        if (mm && (*bias = konst(g, add->in[1 - s])) && (*w = konst(g, mm->in[1]))) {
            *a = mm->in[0];
            return true;
        }
    }
    return false;
}

/* v = a + b in either order. */
static bool is_add_of(const struct kiln_graph *g, int v, int a, int b)
{
    const struct kiln_node *n = prod(g, v, KILN_OP_Add);
    return n && n->n_in == 2 &&
           ((n->in[0] == a && n->in[1] == b) || (n->in[0] == b && n->in[1] == a));
}

/* The LSTM cell: h' = F(o) * H(c'), c' = F(f) * c + F(i) * G(g), (i, f, g, o) =
 * Split(MatMul(x_t, W) + MatMul(h, R) + b, 4). */
static bool lstm_cell(const struct kiln_graph *sub, int n_carried, int h_new, struct rnn_match *m)
{
    const int *in = sub->inputs + 2, *out = sub->outputs + 1;
    int p, q, o = -1, c_new = -1;
    const char *fo = NULL, *hh = NULL;
    m->jc = -1;
    if (!mul_parts(sub, h_new, &p, &q)) return false;
    for (int s = 0; s < 2 && m->jc < 0; s++) {
        int a = s ? q : p, b = s ? p : q;
        if (!(fo = act_of(sub, a, &o)) || !(hh = act_of(sub, b, &c_new))) continue;
        for (int j = 0; j < n_carried; j++)
            if (out[j] == c_new) m->jc = j;
    }
    if (m->jc < 0) return false;
    const struct kiln_node *sp = split_of(sub, o, 4);
    if (!sp || sp->out[3] != o) return false;
    int i_ = sp->out[0], f_ = sp->out[1], g_ = sp->out[2];
    const struct kiln_node *add = prod(sub, c_new, KILN_OP_Add);
    if (!add || add->n_in != 2) return false;
    const char *ff = NULL, *fi = NULL, *gg = NULL;
    bool ok = false;
    for (int s = 0; s < 2 && !ok; s++)
        ok = mul_act_by(sub, add->in[s], f_, in[m->jc], &ff) &&
             mul_two_acts(sub, add->in[1 - s], i_, g_, &fi, &gg);
    if (!ok || strcmp(ff, fi) != 0 || strcmp(ff, fo) != 0) return false;
    m->act_f = ff;
    m->act_g = gg;
    m->act_h = hh;
    /* z = (MatMul(x_t, W) + MatMul(h, R)) + b */
    const struct kiln_node *zb = prod(sub, sp->in[0], KILN_OP_Add);
    if (!zb) return false;
    int mm = -1;
    m->b = NULL;
    for (int s = 0; s < 2 && !m->b; s++)
        if ((m->b = konst(sub, zb->in[s]))) mm = zb->in[1 - s];
    const struct kiln_node *zs = prod(sub, mm, KILN_OP_Add);
    if (!m->b || !zs) return false;
    const struct kiln_node *mx = NULL, *mh = NULL;
    for (int s = 0; s < 2; s++) {
        const struct kiln_node *a = prod(sub, zs->in[s], KILN_OP_MatMul);
        if (!a) return false;
        if (a->in[0] == in[m->jh]) mh = a;
        else mx = a;
    }
    if (!mx || !mh || !(m->w = konst(sub, mx->in[1])) || !(m->r = konst(sub, mh->in[1]))) return false;
    m->xt = mx->in[0];
    m->rb = NULL;
    return true;
}

/* The GRU cell (Keras reset_after=True): (xz, xr, xh) = Split(MatMul(x_t, W) + bx, 3),
 * (rz, rr, rh) = Split(MatMul(h, R) + br, 3), z = F(xz + rz), r = F(xr + rr),
 * n = G(xh + r * rh), h' = z * h + (1 - z) * n. */
static bool gru_cell(const struct kiln_graph *sub, int h_new, struct rnn_match *m)
{
    const int h_in = sub->inputs[2 + m->jh];
    const struct kiln_node *add = prod(sub, h_new, KILN_OP_Add);
    if (!add || add->n_in != 2) return false;
    for (int s = 0; s < 2; s++) {
        int p, q, zin = -1, hn = -1;
        const char *fz = NULL;
        /* z * h */
        if (!mul_parts(sub, add->in[s], &p, &q)) continue;
        int zv = p == h_in ? q : q == h_in ? p : -1;
        if (zv < 0 || !(fz = act_of(sub, zv, &zin))) continue;
        /* (1 - z) * n */
        if (!mul_parts(sub, add->in[1 - s], &p, &q)) continue;
        for (int t = 0; t < 2 && hn < 0; t++) {
            const struct kiln_node *sub1 = prod(sub, t ? q : p, KILN_OP_Sub);
            const kiln_tensor *one = sub1 ? konst(sub, sub1->in[0]) : NULL;
            if (one && one->dtype == KILN_DTYPE_F32 && kiln_tensor_count(one) == 1 &&
                ((const float *)one->data)[0] == 1.0f && sub1->in[1] == zv)
                hn = t ? p : q;
        }
        int hpre = -1;
        const char *gn = hn >= 0 ? act_of(sub, hn, &hpre) : NULL;
        if (!gn) continue;
        /* z's and r's inputs: xz + rz, xr + rr from the two Splits */
        const struct kiln_node *za = prod(sub, zin, KILN_OP_Add);
        if (!za || za->n_in != 2) continue;
        const struct kiln_node *xs = split_of(sub, za->in[0], 3), *rs = split_of(sub, za->in[1], 3);
        if (xs && rs && (xs->out[0] != za->in[0] || rs->out[0] != za->in[1])) xs = rs = NULL;
        if (!xs || !rs) {
            xs = split_of(sub, za->in[1], 3);
            rs = split_of(sub, za->in[0], 3);
            if (!xs || !rs || xs->out[0] != za->in[1] || rs->out[0] != za->in[0]) continue;
        }
        /* which Split is the recurrent one: its input is MatMul(h, R) + br */
        int xa = -1, ra = -1;
        if (!affine(sub, xs->in[0], &xa, &m->w, &m->b) || !affine(sub, rs->in[0], &ra, &m->r, &m->rb))
            continue;
        if (ra != h_in) { /* swapped */
            const struct kiln_node *t = xs;
            xs = rs;
            rs = t;
            const kiln_tensor *tw = m->w, *tb = m->b;
            m->w = m->r;
            m->b = m->rb;
            m->r = tw;
            m->rb = tb;
            int ti = xa;
            xa = ra;
            ra = ti;
        }
        if (ra != h_in) continue;
        /* r = F(xr + rr), n = G(xh + r * rh) */
        int rin = -1, rr = -1;
        const struct kiln_node *na = prod(sub, hpre, KILN_OP_Add);
        if (!na || na->n_in != 2) continue;
        int rmul = na->in[0] == xs->out[2] ? na->in[1] : na->in[1] == xs->out[2] ? na->in[0] : -1;
        int pp, qq;
        if (rmul < 0 || !mul_parts(sub, rmul, &pp, &qq)) continue;
        rr = pp == rs->out[2] ? qq : qq == rs->out[2] ? pp : -1;
        const char *fr = rr >= 0 ? act_of(sub, rr, &rin) : NULL;
        if (!fr || strcmp(fr, fz) != 0 || !is_add_of(sub, rin, xs->out[1], rs->out[1])) continue;
        m->act_f = fz;
        m->act_g = gn;
        m->act_h = NULL;
        m->xt = xa;
        m->jc = -1;
        return true;
    }
    return false;
}

static bool match(const struct kiln_graph *sub, const struct kiln_graph *g, int n_carried,
                  struct rnn_match *m)
{
    const int *in = sub->inputs + 2, *out = sub->outputs + 1;
    const struct kiln_node *set = NULL;
    m->jl = -1;
    for (int j = 0; j < n_carried; j++) {
        const struct kiln_node *s = prod(sub, out[j], KILN_OP_TfListSetItem);
        if (s && s->in[0] == in[j]) {
            if (set) return false;
            set = s;
            m->jl = j;
        }
    }
    if (!set) return false;
    /* t: carried, t' = t + 1; h: carried, h' is what is set into the list */
    m->jt = m->jh = m->jc = -1;
    for (int j = 0; j < n_carried; j++) {
        if (in[j] == set->in[1]) m->jt = j;
        if (out[j] == set->in[2]) m->jh = j;
    }
    if (m->jt < 0 || m->jh < 0 || !is_increment(sub, out[m->jt], in[m->jt])) return false;
    m->gru = false;
    if (!lstm_cell(sub, n_carried, set->in[2], m)) {
        if (!gru_cell(sub, set->in[2], m)) return false;
        m->gru = true;
    }
    /* x_t = Gather(X, t), X from outside the loop */
    const struct kiln_node *gx = prod(sub, m->xt, KILN_OP_Gather);
    if (!gx || gx->in[1] != in[m->jt] || kiln_attr_int(gx, "axis", 0) != 0) return false;
    m->x = outer_of(sub, gx->in[0]);
    if (m->x < 0) return false;
    /* shapes: W [I,kH], R [H,kH], biases [kH], all float32 */
    int k = m->gru ? 3 : 4;
    const kiln_tensor *ts[4] = {m->w, m->r, m->b, m->rb};
    for (int i = 0; i < 4; i++)
        if (ts[i] && ts[i]->dtype != KILN_DTYPE_F32) return false;
    if (m->w->rank != 2 || m->r->rank != 2 || m->b->rank != 1 || (m->rb && m->rb->rank != 1))
        return false;
    int64_t hk = m->r->dims[1];
    if (hk != k * m->r->dims[0] || m->w->dims[1] != hk || m->b->dims[0] != hk ||
        (m->rb && m->rb->dims[0] != hk))
        return false;
    /* cond = t' < n, n == X.shape[0] */
    const struct kiln_node *lt = prod(sub, sub->outputs[0], KILN_OP_Less);
    if (!lt || lt->in[0] != out[m->jt]) return false;
    m->n = outer_of(sub, lt->in[1]);
    if (m->n < 0) {
        /* a constant trip count: X's static first dim */
        const kiln_tensor *kn = konst(sub, lt->in[1]);
        const struct kiln_type *xt = &g->values[m->x].type;
        if (!kn || !kiln_dtype_is_int(kn->dtype) || kiln_tensor_count(kn) != 1 || xt->rank < 1 ||
            xt->dims[0] != kiln_tensor_i64(kn, 0))
            return false;
        m->n = -2;
    } else if (!is_first_dim(g, m->n, m->x)) {
        return false;
    }
    /* every other carried value is a counter */
    for (int j = 0; j < n_carried; j++)
        if (j != m->jt && j != m->jl && j != m->jh && j != m->jc && !is_increment(sub, out[j], in[j]))
            return false;
    return m->jt != m->jh && m->jt != m->jc && m->jh != m->jc && m->jl != m->jt &&
           m->jl != m->jh && m->jl != m->jc;
}

/* Keras' weights [rows, kH] (gates in column blocks, Keras' order) as
 * ONNX's [1, kH, rows] (row blocks in ONNX's order: from[g] is the Keras
 * block of ONNX gate g); a bias [kH] (and a second one, rb) as [1, 2kH]. */
static kiln_status onnx_weights(const kiln_tensor *k, const kiln_tensor *rb, bool bias, int gates,
                                const int *from, kiln_tensor **out)
{
    int64_t hk = bias ? k->dims[0] : k->dims[1], h = hk / gates, rows = bias ? 1 : k->dims[0];
    int64_t dims[3] = {1, bias ? 2 * hk : hk, rows};
    kiln_status st = kiln_tensor_new(KILN_DTYPE_F32, bias ? 2 : 3, dims, out);
    if (st != KILN_OK) return st;
    const float *src = k->data;
    float *dst = (*out)->data;
    for (int gi = 0; gi < gates; gi++)
        for (int64_t u = 0; u < h; u++)
            for (int64_t r = 0; r < rows; r++)
                dst[(gi * h + u) * rows + r] = src[r * hk + from[gi] * h + u];
    if (bias && rb)
        for (int gi = 0; gi < gates; gi++)
            for (int64_t u = 0; u < h; u++)
                dst[hk + gi * h + u] = ((const float *)rb->data)[from[gi] * h + u];
    return KILN_OK;
}

static kiln_status emit(L_t *L, enum kiln_op op, int n_in, const int *in, int n_out,
                        const struct kiln_attr *a, int n_a, int *outs)
{
    return tf_emit(L, op, n_in, in, n_out, a, n_a, outs);
}

static kiln_status const_t(L_t *L, kiln_tensor *t, int *id) { return tf_const(L, t, id); }

static kiln_status axes_op(L_t *L, enum kiln_op op, int x, int64_t axis, int *out)
{
    int64_t d = 1;
    kiln_tensor *t;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_I64, 1, &d, &t);
    if (st != KILN_OK) return st;
    ((int64_t *)t->data)[0] = axis;
    int in[2] = {x, -1};
    if ((st = const_t(L, t, &in[1])) != KILN_OK) return st;
    return emit(L, op, 2, in, 1, NULL, 0, out);
}

static kiln_status cast(L_t *L, int x, kiln_dtype dt, int *out)
{
    if (L->g->values[x].type.dtype == dt) {
        *out = x;
        return KILN_OK;
    }
    struct kiln_attr a = {.name = "to", .type = KILN_ATTR_INT, .i = kiln_onnx_dtype_code(dt)};
    return emit(L, KILN_OP_Cast, 1, &x, 1, &a, 1, out);
}

kiln_status tf_keras_rnn_fuse(struct tf_node_ctx *L, const struct kiln_graph *sub,
                              const int *carried_var, int n_carried, bool *done)
{
    static const int lstm_from[4] = {0, 3, 1, 2}; /* ONNX i, o, f, c from Keras i, f, c, o */
    static const int gru_from[3] = {0, 1, 2};     /* z, r, h in both */
    struct rnn_match m;
    *done = false;
    if (n_carried < 3 || !match(sub, L->g, n_carried, &m)) return KILN_OK;
    int kt = carried_var[m.jt], kl = carried_var[m.jl], kh = carried_var[m.jh];
    struct kiln_graph *g = L->g;
    /* t starts at 0; the list is reserved with n elements (ConstantOfShape([n, ...])) */
    if (!is_const_int(g, L->in[kt].v, 0)) return KILN_OK;
    const struct kiln_node *cs = prod(g, L->in[kl].v, KILN_OP_ConstantOfShape);
    const struct kiln_node *cc = cs ? prod(g, cs->in[0], KILN_OP_Concat) : NULL;
    if (!cc || cc->n_in < 1) return KILN_OK;
    int n0 = through_casts(g, cc->in[0]);
    if (m.n >= 0 ? n0 != through_casts(g, m.n) && !is_first_dim(g, n0, m.x)
                 : !is_first_dim(g, n0, m.x))
        return KILN_OK;
    if (g->values[m.x].type.dtype != KILN_DTYPE_F32) return KILN_OK;
    int gates = m.gru ? 3 : 4;
    const int *from = m.gru ? gru_from : lstm_from;
    int64_t hidden = m.r->dims[0];
    kiln_tensor *wt[3] = {NULL, NULL, NULL};
    kiln_status st = onnx_weights(m.w, NULL, false, gates, from, &wt[0]);
    if (st == KILN_OK) st = onnx_weights(m.r, NULL, false, gates, from, &wt[1]);
    if (st == KILN_OK) st = onnx_weights(m.b, m.rb, true, gates, from, &wt[2]);
    int in[7] = {m.x, -1, -1, -1, -1, -1, -1};
    for (int i = 0; i < 3; i++) {
        if (st == KILN_OK) st = const_t(L, wt[i], &in[1 + i]); /* takes wt[i] over */
        else kiln_tensor_free(wt[i]);
    }
    if (st != KILN_OK) return st;
    if ((st = axes_op(L, KILN_OP_Unsqueeze, L->in[kh].v, 0, &in[5])) != KILN_OK) return st;
    if (!m.gru &&
        (st = axes_op(L, KILN_OP_Unsqueeze, L->in[carried_var[m.jc]].v, 0, &in[6])) != KILN_OK)
        return st;
    kiln_string *names = kiln_arena_alloc(g->mem, sizeof *names * 3);
    if (!names) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    const char *acts[3] = {m.act_f, m.act_g, m.act_h};
    for (int i = 0; i < gates - 1; i++) {
        names[i].data = (char *)acts[i];
        names[i].len = strlen(acts[i]);
    }
    struct kiln_attr a[3] = {
        {.name = "hidden_size", .type = KILN_ATTR_INT, .i = hidden},
        {.name = "activations", .type = KILN_ATTR_STRINGS, .n = gates - 1, .strings = names},
        {.name = "linear_before_reset", .type = KILN_ATTR_INT, .i = 1}};
    int y[3] = {-1, -1, -1};
    if (m.gru) st = emit(L, KILN_OP_GRU, 6, in, 2, a, 3, y);
    else st = emit(L, KILN_OP_LSTM, 7, in, 3, a, 2, y);
    if (st != KILN_OK) return st;
    int list, h, c = -1;
    if ((st = axes_op(L, KILN_OP_Squeeze, y[0], 1, &list)) != KILN_OK) return st;
    if ((st = axes_op(L, KILN_OP_Squeeze, y[1], 0, &h)) != KILN_OK) return st;
    if (!m.gru && (st = axes_op(L, KILN_OP_Squeeze, y[2], 0, &c)) != KILN_OK) return st;
    /* the trip count: n, or X's static first dim */
    int n = m.n;
    if (n < 0) {
        int64_t d = g->values[m.x].type.dims[0];
        kiln_tensor *t;
        if ((st = kiln_tensor_scalar_i64(KILN_DTYPE_I64, d, &t)) != KILN_OK) return st;
        if ((st = const_t(L, t, &n)) != KILN_OK) return st;
    }
    for (int j = 0; j < n_carried; j++) {
        int k = carried_var[j], v;
        if (j == m.jl) v = list;
        else if (j == m.jh) v = h;
        else if (j == m.jc) v = c;
        else {
            kiln_dtype dt = g->values[L->in[k].v].type.dtype;
            if ((st = cast(L, n, dt, &v)) != KILN_OK) return st;
            if (j != m.jt) { /* a counter: x0 + n */
                int add_in[2] = {L->in[k].v, v};
                if ((st = emit(L, KILN_OP_Add, 2, add_in, 1, NULL, 0, &v)) != KILN_OK) return st;
            }
        }
        L->out[k].v = v;
        L->out[k].var = -1;
    }
    *done = true;
    return KILN_OK;
}
