/*
 * attention_views.c - attention recognized by what it computes, whatever
 * view ops an exporter put around it -> KilnAttention.
 *
 * attention.c matches one spelling (BERT's 4-D reshape and transposes of
 * three projections). This pass runs where it did not match and reasons
 * about the data instead: from a Softmax over the last axis it walks back
 * through the scores (Mul / Div by constant scalars, one additive mask Add,
 * or a Where(cond, scores, c) / Where(cond, c, scores) with a constant scalar
 * c, which becomes the additive mask Where(cond, 0, c)) to MatMul(Qop, Kop),
 * and from the Softmax forward to MatMul(P, Vop). Each operand is followed
 * back through view ops (Reshape, Transpose, Squeeze, Unsqueeze, Gather of a
 * constant index, Slice, Split; Q and K also through Mul / Div by constant
 * scalars, which scale the scores) to a rank-3 source tensor, and those ops
 * are replayed symbolically on the source: every axis is a list of atoms,
 * each a strided piece of one source axis whose size is a constant times
 * symbolic dims (so a dynamic batch is fine), plus an offset per source
 * axis (what Gather, Slice and Split select). The operand is attention's
 * when its atoms say: the source is [B, S, N] or [S, B, N], the operand's
 * rows are all of S, its columns a contiguous run of E in N, and its batch
 * axes are B and heads of stride E in N (as two axes or merged into one, as
 * torch.nn.MultiheadAttention folds heads into the batch). K and V may
 * hold fewer heads than Q (grouped-query and multi-query attention): their
 * heads repeated by an Expand of a new axis then merged (as repeat_kv in
 * Llama-style code writes it: each kv head serves consecutive query heads),
 * or a single head MatMul broadcasts over Q's heads. So a packed
 * projection split by Split, Slice or a Gather after a 5-D transpose, and
 * separate projections, are the same case: Q, K and V are read in place at
 * their column offsets. The output chain (Transpose / Reshape after the
 * second MatMul) is replayed the same way to the last value that is [B, S,
 * H * EV], [S, B, H * EV] or those with the first two axes merged.
 *
 * The mask must broadcast into the scores [B, H, S, T] (or [B * H, S, T]
 * when the scores fold the heads into the batch) without growing them, with
 * its last dim T. The view chains' nodes are removed when nothing else reads
 * them; shape computations left without readers go with dead-code
 * elimination.
 */
#include <stdio.h>

#include "core/tensor.h"
#include "kernels/kernel.h"
#include "opt/opt.h"

#define MS 4      /* symbols in a size */
#define MA 8      /* atoms in an axis */
#define MCHAIN 24 /* view ops in one operand chain */

/* A size: c times the product of symbolic dims s[0..n). */
struct mono {
    int64_t c;
    int n;
    const char *s[MS];
};

/* A strided piece of axis `ax` of the source: `size` indices of stride st. */
struct atom {
    int ax;
    struct mono size;
    int64_t st;
};

struct axis {
    int n;
    struct atom a[MA];
};

struct view {
    int rank;
    struct axis x[KILN_MAX_RANK];
    int64_t off[4];
};

static struct mono mono_c(int64_t c)
{
    struct mono m = {.c = c, .n = 0};
    return m;
}

static bool mono_mul(struct mono a, struct mono b, struct mono *out)
{
    if (a.n + b.n > MS || __builtin_mul_overflow(a.c, b.c, &a.c)) return false;
    for (int i = 0; i < b.n; i++) a.s[a.n++] = b.s[i];
    *out = a;
    return true;
}

/* a / b when b divides a: *out. */
static bool mono_div(struct mono a, struct mono b, struct mono *out)
{
    if (b.c == 0 || a.c % b.c) return false;
    for (int i = 0; i < b.n; i++) {
        int k = 0;
        while (k < a.n && strcmp(a.s[k], b.s[i]) != 0) k++;
        if (k == a.n) return false;
        a.s[k] = a.s[--a.n];
    }
    a.c /= b.c;
    *out = a;
    return true;
}

static bool mono_eq(struct mono a, struct mono b)
{
    struct mono q;
    return a.n == b.n && mono_div(a, b, &q) && q.c == 1 && q.n == 0;
}

static bool mono_is(struct mono a, int64_t c)
{
    return a.n == 0 && a.c == c;
}

/* Follow dim *i of v back through ops that pass it through unchanged (MatMul's and Gemm's
 * rows, elementwise ops whose other input does not reach that axis, unary ops, Transpose), to
 * the first value where it is known or named, or as far as it goes: two dims that end at the
 * same place are equal. */
static int dim_origin(const struct kiln_graph *g, int v, int *i)
{
    for (int depth = 0; depth < 32; depth++) {
        const struct kiln_type *t = &g->values[v].type;
        if (t->dims[*i] >= 0 || t->sym[*i]) break;
        int p = kiln_opt_producer(g, v);
        if (p < 0) break;
        const struct kiln_node *n = &g->nodes[p];
        int next = -1, r = t->rank;
        switch (n->op) {
        case KILN_OP_MatMul:
            if (*i < r - 1 && g->values[n->in[0]].type.rank == r) next = n->in[0];
            break;
        case KILN_OP_Gemm:
            if (*i == 0 && kiln_attr_int(n, "transA", 0) == 0) next = n->in[0];
            break;
        case KILN_OP_Add:
        case KILN_OP_Sub:
        case KILN_OP_Mul:
        case KILN_OP_Div:
            for (int k = 0; k < 2 && next < 0; k++) {
                const struct kiln_type *a = &g->values[n->in[k]].type,
                                       *b = &g->values[n->in[1 - k]].type;
                int bi = *i - (r - b->rank); /* the other input's axis, when it has one */
                if (a->rank == r && b->rank >= 0 && (bi < 0 || b->dims[bi] == 1))
                    next = n->in[k];
            }
            break;
        case KILN_OP_Relu:
        case KILN_OP_Gelu:
        case KILN_OP_Erf:
        case KILN_OP_Tanh:
        case KILN_OP_Sigmoid:
        case KILN_OP_Cast:
        case KILN_OP_Identity:
        case KILN_OP_Softmax:
        case KILN_OP_LayerNormalization:
            if (g->values[n->in[0]].type.rank == r) next = n->in[0];
            break;
        case KILN_OP_Transpose: {
            const int64_t *perm;
            if (kiln_attr_ints(n, "perm", &perm) == r && perm[*i] >= 0 && perm[*i] < r &&
                g->values[n->in[0]].type.rank == r) {
                next = n->in[0];
                *i = (int)perm[*i];
            }
            break;
        }
        default:
            break;
        }
        if (next < 0) break;
        v = next;
    }
    return v;
}

static bool shape_mono(const struct kiln_graph *g, int v, int i, struct mono *m);

/* Dim i of value v as a size: a known size, a named symbol, what a Reshape's shape vector
 * says it is (a dynamic batch makes shape inference give up on the whole vector, while its
 * other entries are still constants: Swin's windows), or one named after its origin. */
static bool dim_mono_depth(const struct kiln_graph *g, int v, int i, struct mono *m, int depth)
{
    if (i < 0 || i >= g->values[v].type.rank) return false;
    v = dim_origin(g, v, &i);
    const struct kiln_type *t = &g->values[v].type;
    if (t->dims[i] >= 0) {
        *m = mono_c(t->dims[i]);
        return true;
    }
    int p = kiln_opt_producer(g, v);
    if (!t->sym[i] && p >= 0 && depth < 4 && g->nodes[p].op == KILN_OP_Reshape &&
        kiln_attr_int(&g->nodes[p], "allowzero", 0) == 0) {
        struct mono r;
        if (shape_mono(g, g->nodes[p].in[1], i, &r)) {
            if (r.n || r.c > 0) {
                *m = r;
                return true;
            }
            if (r.c == 0 && dim_mono_depth(g, g->nodes[p].in[0], i, m, depth + 1)) return true;
        }
    }
    const char *sym = t->sym[i];
    if (!sym) {
        char name[48];
        snprintf(name, sizeof name, "~%d.%d", v, i); /* no model symbol starts so */
        sym = kiln_arena_strdup(g->mem, name);
        if (!sym) return false;
    }
    *m = mono_c(1);
    m->n = 1;
    m->s[0] = sym;
    return true;
}

static bool dim_mono(const struct kiln_graph *g, int v, int i, struct mono *m)
{
    return dim_mono_depth(g, v, i, m, 0);
}

/* Scalar integer value v (a shape computation) as a size. */
static bool scalar_mono(const struct kiln_graph *g, int v, int depth, struct mono *m)
{
    const kiln_tensor *t = kiln_opt_const(g, v);
    if (t) {
        if (!kiln_dtype_is_int(t->dtype) || kiln_tensor_count(t) != 1) return false;
        *m = mono_c(kiln_tensor_i64(t, 0));
        return true;
    }
    int p = kiln_opt_producer(g, v);
    if (p < 0 || depth > 8) return false;
    const struct kiln_node *n = &g->nodes[p];
    if (n->op == KILN_OP_Mul && n->n_in == 2) {
        struct mono a, b;
        return scalar_mono(g, n->in[0], depth + 1, &a) && scalar_mono(g, n->in[1], depth + 1, &b) &&
               mono_mul(a, b, m);
    }
    if ((n->op == KILN_OP_Cast || n->op == KILN_OP_Unsqueeze || n->op == KILN_OP_Squeeze) &&
        kiln_dtype_is_int(g->values[n->out[0]].type.dtype))
        return scalar_mono(g, n->in[0], depth + 1, m);
    if (n->op == KILN_OP_Gather && n->n_in == 2 && kiln_attr_int(n, "axis", 0) == 0) {
        const kiln_tensor *idx = kiln_opt_const(g, n->in[1]);
        int si = kiln_opt_producer(g, n->in[0]);
        if (!idx || kiln_tensor_count(idx) != 1 || !kiln_dtype_is_int(idx->dtype) || si < 0 ||
            g->nodes[si].op != KILN_OP_Shape || kiln_node_attr(&g->nodes[si], "start") ||
            kiln_node_attr(&g->nodes[si], "end"))
            return false;
        int src = g->nodes[si].in[0];
        int64_t d = kiln_tensor_i64(idx, 0);
        if (d < 0) d += g->values[src].type.rank;
        return dim_mono(g, src, (int)d, m);
    }
    return false;
}

/* Entry i of a 1-D integer vector v that is the same constant everywhere it is known
 * (ConstantOfShape, or an elementwise Mul of such vectors and constants), as *c. */
static bool uniform_const(const struct kiln_graph *g, int v, int i, int depth, int64_t *c)
{
    const kiln_tensor *t = kiln_opt_const(g, v);
    if (t) {
        int64_t n = kiln_tensor_count(t);
        if (!kiln_dtype_is_int(t->dtype) || t->rank > 1 || n < 1) return false;
        *c = kiln_tensor_i64(t, n == 1 ? 0 : i);
        return n == 1 || i < n;
    }
    int p = kiln_opt_producer(g, v);
    if (p < 0 || depth > 4) return false;
    const struct kiln_node *n = &g->nodes[p];
    if (n->op == KILN_OP_ConstantOfShape) {
        const kiln_tensor *val = kiln_attr_tensor(n, "value");
        if (!val) {
            *c = 0;
            return true;
        }
        if (!kiln_dtype_is_int(val->dtype) || kiln_tensor_count(val) != 1) return false;
        *c = kiln_tensor_i64(val, 0);
        return true;
    }
    int64_t a, b;
    if (n->op == KILN_OP_Mul && n->n_in == 2 && uniform_const(g, n->in[0], i, depth + 1, &a) &&
        uniform_const(g, n->in[1], i, depth + 1, &b) && !__builtin_mul_overflow(a, b, c))
        return true;
    return false;
}

/* Entry i of the 1-D shape vector v as a size (or a raw 0 / -1). */
static bool shape_mono(const struct kiln_graph *g, int v, int i, struct mono *m)
{
    const kiln_tensor *t = kiln_opt_const(g, v);
    if (t) {
        if (!kiln_dtype_is_int(t->dtype) || t->rank != 1 || i >= t->dims[0]) return false;
        *m = mono_c(kiln_tensor_i64(t, i));
        return true;
    }
    int p = kiln_opt_producer(g, v);
    if (p < 0) return false;
    const struct kiln_node *n = &g->nodes[p];
    if (n->op == KILN_OP_Concat) {
        if (kiln_attr_int(n, "axis", 0) != 0) return false;
        int off = 0;
        for (int k = 0; k < n->n_in; k++) {
            const struct kiln_type *pt = &g->values[n->in[k]].type;
            if (pt->rank != 1 || pt->dims[0] < 0) return false;
            if (i < off + pt->dims[0]) return shape_mono(g, n->in[k], i - off, m);
            off += (int)pt->dims[0];
        }
        return false;
    }
    if (n->op == KILN_OP_Reshape && g->values[n->in[0]].type.rank == 1 &&
        g->values[v].type.rank == 1)
        return shape_mono(g, n->in[0], i, m); /* a vector reshaped to itself */
    if (n->op == KILN_OP_Where && n->n_in == 3) {
        /* torch's expand(-1 ...) shape: Where(Equal(s, -1s), 1s, s): a known size of s is
         * never -1, so that entry is s's */
        int e = kiln_opt_producer(g, n->in[0]);
        int64_t c;
        if (e < 0 || g->nodes[e].op != KILN_OP_Equal || g->nodes[e].in[0] != n->in[2] ||
            !uniform_const(g, g->nodes[e].in[1], i, 0, &c) ||
            !shape_mono(g, n->in[2], i, m) || (m->n == 0 && m->c == c) || (m->n && c >= 0))
            return false;
        return true;
    }
    return i == 0 && scalar_mono(g, v, 0, m);
}

static struct mono axis_size(const struct axis *x)
{
    struct mono m = mono_c(1);
    for (int i = 0; i < x->n; i++)
        if (!mono_mul(m, x->a[i].size, &m)) return mono_c(-1);
    return m;
}

static bool view_reshape(struct view *w, const struct mono *t, int rank)
{
    struct atom flat[KILN_MAX_RANK * MA];
    int nf = 0, at = 0;
    for (int i = 0; i < w->rank; i++)
        for (int k = 0; k < w->x[i].n; k++) flat[nf++] = w->x[i].a[k];
    struct view out = *w;
    out.rank = rank;
    for (int i = 0; i < rank; i++) {
        struct axis *x = &out.x[i];
        x->n = 0;
        struct mono acc = mono_c(1), q;
        while (!mono_eq(acc, t[i])) {
            if (at == nf || x->n == MA) return false;
            struct atom a = flat[at];
            struct mono prod;
            if (mono_mul(acc, a.size, &prod) && mono_div(t[i], prod, &q)) {
                x->a[x->n++] = a;
                acc = prod;
                at++;
            } else if (a.size.n == 0 && mono_div(t[i], acc, &q) && q.n == 0 && q.c > 1 &&
                       a.size.c % q.c == 0) {
                /* split the atom: its major part completes this axis */
                int64_t minor = a.size.c / q.c, st;
                if (__builtin_mul_overflow(a.st, minor, &st)) return false;
                x->a[x->n++] = (struct atom){a.ax, mono_c(q.c), st};
                flat[at].size = mono_c(minor);
                acc = t[i];
            } else {
                return false;
            }
        }
    }
    if (at != nf) return false;
    *w = out;
    return true;
}

static bool apply_reshape(const struct kiln_graph *g, const struct kiln_node *n, struct view *w)
{
    const struct kiln_type *st = &g->values[n->in[1]].type;
    if (kiln_attr_int(n, "allowzero", 0) != 0 || st->rank != 1 || st->dims[0] <= 0 ||
        st->dims[0] > KILN_MAX_RANK)
        return false;
    int rank = (int)st->dims[0], minus = -1;
    struct mono t[KILN_MAX_RANK], known = mono_c(1), total = mono_c(1);
    for (int i = 0; i < w->rank; i++)
        if (!mono_mul(total, axis_size(&w->x[i]), &total)) return false;
    for (int i = 0; i < rank; i++) {
        if (!shape_mono(g, n->in[1], i, &t[i])) return false;
        if (mono_is(t[i], 0)) {
            if (i >= w->rank) return false;
            t[i] = axis_size(&w->x[i]);
        }
        if (mono_is(t[i], -1)) {
            if (minus >= 0) return false;
            minus = i;
        } else if (t[i].c <= 0 || !mono_mul(known, t[i], &known)) {
            return false;
        }
    }
    if (minus >= 0 && !mono_div(total, known, &t[minus])) return false;
    return view_reshape(w, t, rank);
}

static bool const_ints(const struct kiln_graph *g, const struct kiln_node *n, int in,
                       const char *attr, int64_t *v, int *count)
{
    if (n->n_in > in && n->in[in] >= 0) {
        const kiln_tensor *t = kiln_opt_const(g, n->in[in]);
        if (!t || !kiln_dtype_is_int(t->dtype) || t->rank > 1 || kiln_tensor_count(t) > 8)
            return false;
        *count = (int)kiln_tensor_count(t);
        for (int i = 0; i < *count; i++) v[i] = kiln_tensor_i64(t, i);
        return true;
    }
    const int64_t *a;
    int c = attr ? kiln_attr_ints(n, attr, &a) : -1;
    if (c < 0 || c > 8) return false;
    for (int i = 0; i < c; i++) v[i] = a[i];
    *count = c;
    return true;
}

/* Keep [start, end) of axis ax (one atom, or none when its size is 1). */
static bool view_range(struct view *w, int ax, int64_t start, int64_t end, bool drop)
{
    struct axis *x = &w->x[ax];
    if (x->n == 0) {
        if (start != 0 || end < 1) return false;
    } else {
        if (x->n != 1) return false;
        struct atom *a = &x->a[0];
        if (a->size.n) { /* a symbolic size: only the whole of it */
            if (start != 0 || end < INT64_MAX / 4) return false;
        } else {
            int64_t sz = a->size.c;
            if (start < 0) start += sz;
            if (end < 0) end += sz;
            if (end > sz) end = sz;
            int64_t skip;
            if (start < 0 || start >= end || __builtin_mul_overflow(start, a->st, &skip) ||
                __builtin_add_overflow(w->off[a->ax], skip, &w->off[a->ax]))
                return false;
            a->size = mono_c(end - start);
            if (end - start == 1) x->n = 0;
        }
    }
    if (drop) {
        if (x->n) return false;
        for (int i = ax; i + 1 < w->rank; i++) w->x[i] = w->x[i + 1];
        w->rank--;
    }
    return true;
}

static int norm_axis(int64_t a, int rank)
{
    if (a < 0) a += rank;
    return a < 0 || a >= rank ? -1 : (int)a;
}

/* Replay node n (its output `out_k`) on the view. */
static bool apply(const struct kiln_graph *g, const struct kiln_node *n, int out_k, struct view *w)
{
    int64_t v[8], v2[8], v3[8];
    int c, c2, c3;
    switch (n->op) {
    case KILN_OP_Reshape:
        return apply_reshape(g, n, w);
    case KILN_OP_Transpose: {
        const int64_t *p;
        int np = kiln_attr_ints(n, "perm", &p);
        struct view o = *w;
        for (int i = 0; i < w->rank; i++) {
            int src = np < 0 ? w->rank - 1 - i : np == w->rank ? norm_axis(p[i], w->rank) : -1;
            if (src < 0) return false;
            o.x[i] = w->x[src];
        }
        *w = o;
        return true;
    }
    case KILN_OP_Unsqueeze:
    case KILN_OP_Squeeze: {
        if (!const_ints(g, n, 1, "axes", v, &c) || c < 1) return false;
        bool un = n->op == KILN_OP_Unsqueeze;
        int rank = un ? w->rank + c : w->rank;
        if (rank > KILN_MAX_RANK) return false;
        bool mark[KILN_MAX_RANK] = {false};
        for (int i = 0; i < c; i++) {
            int a = norm_axis(v[i], rank);
            if (a < 0 || mark[a]) return false;
            mark[a] = true;
        }
        struct view o = *w;
        o.rank = 0;
        for (int i = 0, k = 0; i < rank; i++) {
            if (un && mark[i]) {
                o.x[o.rank++].n = 0;
            } else if (!un && mark[i]) {
                if (w->x[i].n) return false;
            } else {
                o.x[o.rank++] = w->x[un ? k++ : i];
            }
        }
        *w = o;
        return true;
    }
    case KILN_OP_Gather: {
        const kiln_tensor *idx = kiln_opt_const(g, n->in[1]);
        int a = norm_axis(kiln_attr_int(n, "axis", 0), w->rank);
        if (!idx || !kiln_dtype_is_int(idx->dtype) || kiln_tensor_count(idx) != 1 || a < 0 ||
            idx->rank > 1)
            return false;
        int64_t i = kiln_tensor_i64(idx, 0);
        return view_range(w, a, i, i == -1 ? INT64_MAX : i + 1, idx->rank == 0);
    }
    case KILN_OP_Slice: {
        if (n->opset < 10 || !const_ints(g, n, 1, NULL, v, &c) ||
            !const_ints(g, n, 2, NULL, v2, &c2) || c != c2)
            return false;
        if (n->n_in > 3 && n->in[3] >= 0) {
            if (!const_ints(g, n, 3, NULL, v3, &c3) || c3 != c) return false;
        } else {
            for (int i = 0; i < c; i++) v3[i] = i;
        }
        if (n->n_in > 4 && n->in[4] >= 0) {
            int64_t s[8];
            int cs;
            if (!const_ints(g, n, 4, NULL, s, &cs) || cs != c) return false;
            for (int i = 0; i < c; i++)
                if (s[i] != 1) return false;
        }
        for (int i = 0; i < c; i++) {
            int a = norm_axis(v3[i], w->rank);
            if (a < 0 || !view_range(w, a, v[i], v2[i], false)) return false;
        }
        return true;
    }
    case KILN_OP_Split: {
        int a = norm_axis(kiln_attr_int(n, "axis", 0), w->rank);
        if (a < 0 || w->x[a].n != 1 || w->x[a].a[0].size.n) return false;
        if (!const_ints(g, n, 1, "split", v, &c)) {
            if (n->n_in > 1 && n->in[1] >= 0) return false;
            int64_t sz = w->x[a].a[0].size.c;
            if (sz % n->n_out) return false;
            c = n->n_out;
            for (int i = 0; i < c; i++) v[i] = sz / n->n_out;
        }
        if (c != n->n_out || out_k >= c) return false;
        int64_t start = 0;
        for (int i = 0; i < out_k; i++) start += v[i];
        return view_range(w, a, start, start + v[out_k], false);
    }
    case KILN_OP_Expand: {
        /* broadcast: an axis of size 1 (no atom) grown to r becomes a repeat atom of
         * stride 0 (grouped-query attention's repeat_kv); others must keep their size */
        const struct kiln_type *st = &g->values[n->in[1]].type;
        if (st->rank != 1 || st->dims[0] <= 0 || st->dims[0] > KILN_MAX_RANK) return false;
        int rank = (int)st->dims[0];
        if (rank < w->rank) rank = w->rank;
        struct view o = *w;
        int lead = rank - w->rank;
        if (lead) {
            o.rank = rank;
            for (int i = rank - 1; i >= 0; i--) {
                if (i >= lead) o.x[i] = w->x[i - lead];
                else o.x[i].n = 0;
            }
        }
        int sr = (int)st->dims[0];
        for (int i = 0; i < sr; i++) {
            int ax = rank - sr + i;
            struct mono t;
            if (!shape_mono(g, n->in[1], i, &t)) return false;
            if (mono_is(t, 1)) continue;
            struct axis *x = &o.x[ax];
            if (x->n == 0) {
                if (t.n || t.c <= 1) return false;
                x->n = 1;
                x->a[0] = (struct atom){2, t, 0};
            } else if (!mono_eq(axis_size(x), t)) {
                return false;
            }
        }
        *w = o;
        return true;
    }
    default:
        return false;
    }
}

/* The constant scalar factor a Mul / Div node applies to its other input (index *x). */
static bool scalar_factor(const struct kiln_graph *g, const struct kiln_node *n, double *f, int *x)
{
    float c;
    if (n->n_in != 2) return false;
    for (int k = 1; k >= 0; k--) {
        if (n->op == KILN_OP_Div && k == 0) break;
        if (!kiln_opt_const_scalar(g, n->in[k], &c) || c == 0.0f) continue;
        *f = n->op == KILN_OP_Div ? 1.0 / c : c;
        *x = 1 - k;
        return true;
    }
    return false;
}

/* One operand, traced to its source. */
struct operand {
    int src;               /* the rank-3 source value */
    bool seq_first;        /* source is [S, B, N] */
    int64_t heads, width;  /* H and E (or EV) */
    int64_t kv_heads;      /* heads the source holds (K, V of grouped-query attention: fewer) */
    int h_axis;            /* the batch axis holding the heads, -1 when none */
    int64_t offset;        /* column of head 0 in N */
    int nbatch;            /* batch axes of the operand */
    int batch_atoms[2];    /* atoms per batch axis (a head atom and its repeat count as one) */
    bool has_b, has_h;     /* the batch axes hold B / the heads */
    struct mono b, s;      /* B and the sequence length */
    int chain[MCHAIN], n_chain;
};

static bool is_whole(const struct atom *a, int ax, struct mono full)
{
    return a->ax == ax && a->st == 1 && mono_eq(a->size, full);
}

/* Trace operand value v (role: 0 q, 1 k (rows and columns swapped), 2 v). */
static bool trace_n(const struct kiln_graph *g, int v, int role, int max_chain, double *scale,
                    struct operand *o)
{
    memset(o, 0, sizeof *o);
    int outk[MCHAIN];
    int cur = v;
    while (o->n_chain < max_chain) {
        int p = kiln_opt_producer(g, cur);
        if (p < 0) break;
        const struct kiln_node *n = &g->nodes[p];
        int in = 0, k = 0;
        double f;
        if (n->op == KILN_OP_Mul || n->op == KILN_OP_Div) {
            if (role == 2 || !scalar_factor(g, n, &f, &in)) break;
            *scale *= f;
        } else if (n->op == KILN_OP_Reshape || n->op == KILN_OP_Transpose ||
                   n->op == KILN_OP_Squeeze || n->op == KILN_OP_Unsqueeze ||
                   n->op == KILN_OP_Gather || n->op == KILN_OP_Slice || n->op == KILN_OP_Split ||
                   (n->op == KILN_OP_Expand && role != 0)) {
            while (n->out[k] != cur) k++;
        } else {
            break;
        }
        if (kiln_opt_is_graph_output(g, cur)) return false;
        outk[o->n_chain] = k;
        o->chain[o->n_chain++] = p;
        cur = n->in[in];
    }
    o->src = cur;
    const struct kiln_type *st = &g->values[cur].type;
    if (st->rank != 3 || st->dtype != KILN_DTYPE_F32 || st->dims[2] <= 0) return false;
    struct view w = {.rank = 3};
    for (int i = 0; i < 3; i++) {
        struct mono m;
        if (!dim_mono(g, cur, i, &m)) return false;
        w.x[i].n = mono_is(m, 1) ? 0 : 1;
        w.x[i].a[0] = (struct atom){i, m, 1};
    }
    for (int i = o->n_chain - 1; i >= 0; i--) {
        const struct kiln_node *n = &g->nodes[o->chain[i]];
        if (n->op == KILN_OP_Mul || n->op == KILN_OP_Div) continue;
        if (!apply(g, n, outk[i], &w)) return false;
    }
    if (w.rank < 3 || w.rank > 4) return false;
    const struct axis *rows = &w.x[w.rank - (role == 1 ? 1 : 2)];
    const struct axis *cols = &w.x[w.rank - (role == 1 ? 2 : 1)];
    if (rows->n != 1 || cols->n != 1) return false;
    const struct atom *sa = &rows->a[0], *ea = &cols->a[0];
    if (sa->ax > 1 || ea->ax != 2 || ea->st != 1 || ea->size.n) return false;
    o->seq_first = sa->ax == 0;
    int bax = 1 - sa->ax;
    if (!dim_mono(g, cur, sa->ax, &o->s) || !dim_mono(g, cur, bax, &o->b) ||
        !is_whole(sa, sa->ax, o->s) || w.off[sa->ax] != 0 || w.off[bax] != 0)
        return false;
    o->width = ea->size.c;
    o->heads = 1;
    o->offset = w.off[2];
    o->nbatch = w.rank - 2;
    o->h_axis = -1;
    int64_t rep = 1;
    int natoms = 0;
    for (int i = 0; i < o->nbatch; i++) {
        o->batch_atoms[i] = 0;
        for (int k = 0; k < w.x[i].n; k++) {
            const struct atom *a = &w.x[i].a[k];
            if (++natoms > 3) return false;
            if (a->ax == bax && !o->has_b && rep == 1 && !o->has_h && is_whole(a, bax, o->b)) {
                o->has_b = true;
                o->batch_atoms[i]++;
            } else if (a->ax == 2 && !o->has_h && rep == 1 && a->st == o->width &&
                       a->size.n == 0) {
                o->has_h = true;
                o->kv_heads = a->size.c;
                o->h_axis = i;
                o->batch_atoms[i]++;
            } else if (a->ax == 2 && a->st == 0 && a->size.n == 0 && rep == 1 && role != 0 &&
                       (o->has_h ? o->h_axis == i && k > 0 && w.x[i].a[k - 1].ax == 2
                                 : true)) {
                /* K or V repeated for grouped-query heads: kv head h / rep serves query
                 * heads h .. h + rep - 1 (after the head atom), or one head for all */
                rep = a->size.c;
                if (!o->has_h) {
                    o->has_h = true;
                    o->kv_heads = 1;
                    o->h_axis = i;
                    o->batch_atoms[i]++;
                }
            } else {
                return false;
            }
        }
    }
    if (!o->has_h) o->kv_heads = 1;
    o->heads = o->kv_heads * rep;
    if (!o->has_b && !mono_is(o->b, 1)) return false;
    return true;
}

/* Trace v to the furthest rank-3 source that makes it an attention operand. */
static bool trace(const struct kiln_graph *g, int v, int role, double *scale, struct operand *o)
{
    for (int max_chain = MCHAIN; max_chain >= 0; max_chain--) {
        double f = 1.0;
        if (trace_n(g, v, role, max_chain, &f, o)) {
            *scale *= f;
            return true;
        }
        if (o->n_chain < max_chain) max_chain = o->n_chain; /* the walk stopped earlier */
    }
    return false;
}

/* The batch axes of q and operand b have the same structure (so MatMul broadcasts
 * nothing), or b holds one head on q's separate heads axis, which MatMul broadcasts over
 * q's heads (multi-query attention written without an Expand). */
static bool same_batch(const struct operand *a, const struct operand *b)
{
    if (a->nbatch != b->nbatch || a->has_b != b->has_b || !mono_eq(a->b, b->b) ||
        a->seq_first != b->seq_first)
        return false;
    bool bcast = a->has_h && !b->has_h && a->h_axis >= 0 && a->batch_atoms[a->h_axis] == 1;
    if (!bcast && (a->has_h != b->has_h || a->heads != b->heads)) return false;
    for (int i = 0; i < a->nbatch; i++)
        if (a->batch_atoms[i] != b->batch_atoms[i] + (bcast && i == a->h_axis)) return false;
    return true;
}

/* Roles of the output atoms. */
enum { R_B, R_S, R_H, R_V };

/* Is view w of the attention output [B, S, H * EV] / [S, B, ...], or those rows merged? */
static bool canonical_y(const struct view *w, const struct mono *full, int *ysf, int *merge)
{
    /* flatten, dropping the empty axes of size 1 only where B is 1 */
    int order[4], n = 0;
    const struct axis *last = &w->x[w->rank - 1];
    if (w->rank < 2 || w->rank > 3) return false;
    for (int i = 0; i < w->rank; i++)
        for (int k = 0; k < w->x[i].n; k++) {
            const struct atom *a = &w->x[i].a[k];
            if (n == 4 || a->st != 1 || !mono_eq(a->size, full[a->ax])) return false;
            order[n++] = a->ax;
        }
    /* the last axis is exactly [H, EV] (H absent when 1) */
    int nh = mono_is(full[R_H], 1) ? 0 : 1;
    if (last->n != nh + 1 || last->a[last->n - 1].ax != R_V || (nh && last->a[0].ax != R_H))
        return false;
    int nb = mono_is(full[R_B], 1) ? 0 : 1;
    if (n != nb + 1 + nh + 1) return false;
    int si = nb && order[0] == R_B ? 1 : 0;
    if (order[si] != R_S) return false;
    *ysf = nb && si == 0;
    if (nb && order[*ysf ? 1 : 0] != R_B) return false;
    *merge = w->rank == 2;
    if (w->rank == 3 && nb && (w->x[0].n != 1 || w->x[1].n != 1)) return false;
    if (w->rank == 3 && !nb && w->x[0].n + w->x[1].n != 1) return false;
    return true;
}

/* Remove the nodes of chain whose outputs nothing reads any more (repeatedly). */
static void drop_unread(struct kiln_graph *g, const int *chain, int n)
{
    bool more = true;
    while (more) {
        more = false;
        for (int i = 0; i < n; i++) {
            struct kiln_node *nd = &g->nodes[chain[i]];
            if (kiln_opt_node_dead(nd)) continue;
            bool read = false;
            for (int k = 0; k < nd->n_out; k++)
                if (nd->out[k] >= 0 && (g->values[nd->out[k]].uses > 0 ||
                                        kiln_opt_is_graph_output(g, nd->out[k])))
                    read = true;
            if (!read) {
                kiln_opt_remove_node(g, chain[i]);
                more = true;
            }
        }
    }
}

/* Add an additive mask Where(cond, keep ? 0 : c, keep ? c : 0): *mask. */
static kiln_status where_mask(struct kiln_graph *g, int wi, bool keep_true, float c, int *mask)
{
    int cond = g->nodes[wi].in[0], ids[2];
    float vals[2] = {keep_true ? 0.0f : c, keep_true ? c : 0.0f};
    for (int i = 0; i < 2; i++) {
        kiln_tensor *t;
        kiln_status st = kiln_tensor_new(KILN_DTYPE_F32, 0, NULL, &t);
        if (st != KILN_OK) return st;
        ((float *)t->data)[0] = vals[i];
        st = kiln_opt_add_const(g, "attention_mask_value", t, &ids[i]);
        if (st != KILN_OK) return st;
    }
    struct kiln_type mt = g->values[cond].type;
    mt.dtype = KILN_DTYPE_F32;
    int ni, out;
    kiln_status st = kiln_opt_add_value(g, "attention_mask", &mt, &out);
    if (st == KILN_OK) st = kiln_opt_add_node(g, KILN_OP_Where, g->nodes[wi].name, 3, 1, 0, 16, &ni);
    if (st != KILN_OK) return st;
    kiln_opt_set_input(g, ni, 0, cond);
    kiln_opt_set_input(g, ni, 1, ids[0]);
    kiln_opt_set_input(g, ni, 2, ids[1]);
    kiln_opt_set_output(g, ni, 0, out);
    *mask = out;
    return KILN_OK;
}

/* Does v lead back to a MatMul through scale and mask ops? */
static bool reaches_matmul(const struct kiln_graph *g, int v, int depth)
{
    int p = kiln_opt_producer(g, v);
    if (p < 0 || depth > 6 || kiln_opt_single_consumer(g, v) < 0) return false;
    const struct kiln_node *n = &g->nodes[p];
    double f;
    int x;
    if (n->op == KILN_OP_MatMul) return true;
    if ((n->op == KILN_OP_Mul || n->op == KILN_OP_Div) && scalar_factor(g, n, &f, &x))
        return reaches_matmul(g, n->in[x], depth + 1);
    if (n->op == KILN_OP_Add && n->n_in == 2)
        return reaches_matmul(g, n->in[0], depth + 1) || reaches_matmul(g, n->in[1], depth + 1);
    if (n->op == KILN_OP_Where && n->n_in == 3)
        return reaches_matmul(g, n->in[1], depth + 1) || reaches_matmul(g, n->in[2], depth + 1);
    return false;
}

/* Reshape node r2 (to [X, H, S, T]) reads Add(Reshape r1 (scores [X, H, S, T] to
 * [X / P, P, H, S, T]), M) with M a constant that broadcasts into [X / P, P, H, S, T]
 * without its first axis: the Add is a mask indexed by the window x % P. */
static bool periodic_mask(const struct kiln_graph *g, int r2, int *r1_out, int *mask_out,
                          int64_t *period)
{
    const struct kiln_node *n2 = &g->nodes[r2];
    int ai = kiln_opt_producer(g, n2->in[0]);
    if (ai < 0 || kiln_opt_single_consumer(g, n2->in[0]) < 0) return false;
    const struct kiln_node *a = &g->nodes[ai];
    if (a->op != KILN_OP_Add || a->n_in != 2) return false;
    for (int k = 0; k < 2; k++) {
        int r1 = kiln_opt_producer(g, a->in[k]);
        const kiln_tensor *m = kiln_opt_const(g, a->in[1 - k]);
        if (r1 < 0 || !m || m->dtype != KILN_DTYPE_F32 || g->nodes[r1].op != KILN_OP_Reshape ||
            kiln_opt_single_consumer(g, a->in[k]) < 0)
            continue;
        const struct kiln_type *t5 = &g->values[a->in[k]].type,
                               *t4 = &g->values[g->nodes[r1].in[0]].type,
                               *to = &g->values[n2->out[0]].type;
        if (t5->rank != 5 || t4->rank != 4 || to->rank != 4 || m->rank < 1 || m->rank > 5)
            return false;
        struct mono d5[5], d4[4], dout[4];
        for (int i = 0; i < 5; i++)
            if (!dim_mono(g, a->in[k], i, &d5[i])) return false;
        for (int i = 0; i < 4; i++)
            if (!dim_mono(g, g->nodes[r1].in[0], i, &d4[i]) ||
                !dim_mono(g, n2->out[0], i, &dout[i]))
                return false;
        /* [X/P, P, H, S, T] of [X, H, S, T], viewed back to the same: with H, S and T
         * equal, a reshape (which keeps the element count) makes the first axes X/P and P,
         * and the view back X again */
        if (d5[1].n || d5[1].c < 1) return false;
        for (int i = 1; i < 4; i++)
            if (!mono_eq(d4[i], dout[i]) || !mono_eq(d4[i], d5[i + 1])) return false;
        for (int i = 0; i < m->rank; i++) {
            int ax = 5 - m->rank + i;
            int64_t md = m->dims[i];
            if (md != 1 && (ax == 0 || !mono_is(d5[ax], md))) return false;
        }
        *r1_out = r1;
        *mask_out = a->in[1 - k];
        *period = d5[1].c;
        return true;
    }
    return false;
}

/* The mask of a periodic (per window) attention: bias (an additive mask of [X, H, S, T]
 * without its batch axis, or -1) plus pm ([P, H, S, T] from the right, first axis absent)
 * as one constant [P, H, S, T]; -1 in *out when bias is not a constant. */
static kiln_status periodic_mask_const(struct kiln_graph *g, int bias, int pm, int64_t P,
                                       int64_t H, int64_t S, int64_t T, int *out)
{
    *out = -1;
    const kiln_tensor *b = bias >= 0 ? kiln_opt_const(g, bias) : NULL;
    const kiln_tensor *m = kiln_opt_const(g, pm);
    if ((bias >= 0 && (!b || b->dtype != KILN_DTYPE_F32 || b->rank > 4)) || !m) return KILN_OK;
    int64_t want[4] = {P, H, S, T}, bs[4] = {0, 0, 0, 0}, ms[4] = {0, 0, 0, 0}, st = 1;
    if (b) {
        for (int i = b->rank - 1; i >= 0; i--) {
            int ax = 4 - b->rank + i;
            if (b->dims[i] != 1 && (ax == 0 || b->dims[i] != want[ax])) return KILN_OK;
            if (b->dims[i] != 1) bs[ax] = st;
            st *= b->dims[i];
        }
    }
    st = 1; /* the mask: [.., P, H?, S, T] over 5 axes, the first absent or 1 */
    for (int i = m->rank - 1; i >= 0; i--) {
        int ax = 5 - m->rank + i - 1; /* axis of [P, H, S, T] */
        if (m->dims[i] != 1) {
            if (ax < 0 || m->dims[i] != want[ax]) return KILN_OK;
            ms[ax] = st;
        }
        st *= m->dims[i];
    }
    kiln_tensor *t;
    kiln_status rs = kiln_tensor_create(KILN_DTYPE_F32, 4, want, &t);
    if (rs != KILN_OK) return rs;
    float *o = t->data;
    const float *bd = b ? b->data : NULL, *md = m->data;
    for (int64_t p = 0, i = 0; p < P; p++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t q = 0; q < S; q++)
                for (int64_t k = 0; k < T; k++, i++)
                    o[i] = (bd ? bd[h * bs[1] + q * bs[2] + k * bs[3]] : 0.0f) +
                           md[p * ms[0] + h * ms[1] + q * ms[2] + k * ms[3]];
    return kiln_opt_add_const(g, "window_mask", t, out);
}

static kiln_status fuse_views(struct kiln_graph *g, int smi, bool *done)
{
    *done = false;
    const struct kiln_node *sm = &g->nodes[smi];
    const struct kiln_type *ts = &g->values[sm->out[0]].type;
    if (ts->dtype != KILN_DTYPE_F32 || ts->rank < 3 || ts->rank > 4) return KILN_OK;
    int64_t axis = kiln_attr_int(sm, "axis", -1);
    if (axis != -1 && axis != ts->rank - 1) return KILN_OK;
    int rm[24], n_rm = 0;
    rm[n_rm++] = smi;
    /* the scores: back from the Softmax to the first MatMul */
    double scale = 1.0;
    int s = sm->in[0], mask = -1, where = -1, pmask = -1;
    int64_t period = 0;
    bool where_keep = false, scaled = false; /* a scale after the mask would scale it too */
    float where_c = 0.0f;
    for (;;) {
        int p = kiln_opt_producer(g, s);
        if (p < 0 || kiln_opt_single_consumer(g, s) < 0 || n_rm >= 14) return KILN_OK;
        const struct kiln_node *n = &g->nodes[p];
        double f;
        int x;
        if (n->op == KILN_OP_MatMul) break;
        int pr1, pm;
        int64_t per;
        if (n->op == KILN_OP_Reshape && pmask < 0 && mask < 0 && where < 0 && !scaled &&
            periodic_mask(g, p, &pr1, &pm, &per)) {
            /* Swin's shifted windows: scores viewed [B, P, H, S, T], a mask per window
             * added, viewed back: a mask whose batch index is the window, b % P */
            pmask = pm;
            period = per;
            rm[n_rm++] = p;
            rm[n_rm++] = kiln_opt_producer(g, n->in[0]);
            p = pr1;
            s = g->nodes[pr1].in[0];
        } else if ((n->op == KILN_OP_Mul || n->op == KILN_OP_Div) && scalar_factor(g, n, &f, &x)) {
            scale *= f;
            scaled = true;
            s = n->in[x];
        } else if (n->op == KILN_OP_Add && n->n_in == 2 && mask < 0 && where < 0 &&
                   !scaled) {
            bool r0 = reaches_matmul(g, n->in[0], 0), r1 = reaches_matmul(g, n->in[1], 0);
            if (r0 == r1) return KILN_OK;
            mask = n->in[r0 ? 1 : 0];
            s = n->in[r0 ? 0 : 1];
        } else if (n->op == KILN_OP_Where && n->n_in == 3 && mask < 0 && where < 0 &&
                   !scaled) {
            float c;
            int k = kiln_opt_const_scalar(g, n->in[2], &c) ? 1
                    : kiln_opt_const_scalar(g, n->in[1], &c) ? 2
                                                               : -1;
            if (k < 0 || g->values[n->in[0]].type.dtype != KILN_DTYPE_BOOL) return KILN_OK;
            where = p;
            where_keep = k == 1;
            where_c = c;
            s = n->in[k];
        } else {
            return KILN_OK;
        }
        rm[n_rm++] = p;
    }
    int m1 = kiln_opt_producer(g, s);
    rm[n_rm++] = m1;
    int m2 = kiln_opt_single_consumer(g, sm->out[0]);
    if (m2 < 0 || g->nodes[m2].op != KILN_OP_MatMul || g->nodes[m2].in[0] != sm->out[0])
        return KILN_OK;
    rm[n_rm++] = m2;
    struct operand q, k, v;
    double vscale = 1.0;
    if (!trace(g, g->nodes[m1].in[0], 0, &scale, &q) || !trace(g, g->nodes[m1].in[1], 1, &scale, &k) ||
        !trace(g, g->nodes[m2].in[1], 2, &vscale, &v))
        return KILN_OK;
    if (!same_batch(&q, &k) || !same_batch(&q, &v) || q.width != k.width ||
        !mono_eq(k.s, v.s) || q.nbatch + 2 != ts->rank || q.kv_heads != q.heads ||
        k.kv_heads != v.kv_heads || k.kv_heads <= 0 || q.heads % k.kv_heads)
        return KILN_OK;
    /* the mask: into the scores without growing them, last dim T */
    bool merged = q.nbatch == 1 && q.has_b;
    struct mono sd[4];
    int sr = 0;
    if (merged) {
        if (!mono_mul(q.b, mono_c(q.heads), &sd[sr++])) return KILN_OK;
    } else {
        if (q.nbatch == 2) sd[sr++] = q.b;
        sd[sr++] = mono_c(q.heads);
    }
    sd[sr++] = q.s;
    sd[sr++] = k.s;
    if (pmask >= 0) {
        /* one constant [P, H, S, T] mask, indexed by the window b % P */
        if (where >= 0 || q.nbatch != 2 || q.s.n || k.s.n) return KILN_OK;
        int combined;
        kiln_status pst = periodic_mask_const(g, mask, pmask, period, q.heads, q.s.c, k.s.c,
                                              &combined);
        if (pst != KILN_OK) return pst;
        if (combined < 0) return KILN_OK;
        mask = combined;
    }
    int mv = where >= 0 ? g->nodes[where].in[0] : mask;
    if (mv >= 0 && pmask < 0) {
        const struct kiln_type *tm = &g->values[mv].type;
        if ((where < 0 && tm->dtype != KILN_DTYPE_F32) || tm->rank < 1 || tm->rank > sr)
            return KILN_OK;
        for (int i = 0; i < tm->rank; i++) {
            struct mono md, want = sd[sr - tm->rank + i];
            if (!dim_mono(g, mv, i, &md)) return KILN_OK;
            if (i == tm->rank - 1 ? !mono_eq(md, want) : !mono_is(md, 1) && !mono_eq(md, want))
                return KILN_OK;
        }
    }
    /* the output: the furthest [B, S, H * EV]-like value along Transpose / Reshape */
    struct view w = {.rank = 0};
    struct mono full[4] = {q.b, q.s, mono_c(q.heads), mono_c(v.width)};
    struct atom ba[2];
    int nba = 0, used = 0;
    if (q.has_b) ba[nba++] = (struct atom){R_B, q.b, 1};
    if (q.has_h) ba[nba++] = (struct atom){R_H, mono_c(q.heads), 1};
    for (int i = 0; i < q.nbatch; i++) {
        struct axis *x = &w.x[w.rank++];
        x->n = 0;
        for (int a = 0; a < q.batch_atoms[i] && used < nba; a++) x->a[x->n++] = ba[used++];
    }
    w.x[w.rank].n = 1;
    w.x[w.rank++].a[0] = (struct atom){R_S, q.s, 1};
    w.x[w.rank].n = 1;
    w.x[w.rank++].a[0] = (struct atom){R_V, mono_c(v.width), 1};
    int cur = g->nodes[m2].out[0], y = -1, ysf = 0, merge = 0, n_out_chain = 0, out_chain[8];
    int best_chain = 0;
    for (;;) {
        int a, b;
        if (canonical_y(&w, full, &a, &b)) {
            y = cur;
            ysf = a;
            merge = b;
            best_chain = n_out_chain;
        }
        int c = kiln_opt_single_consumer(g, cur);
        if (c < 0 || n_out_chain == 8 || kiln_opt_is_graph_output(g, cur)) break;
        const struct kiln_node *n = &g->nodes[c];
        if ((n->op != KILN_OP_Transpose && n->op != KILN_OP_Reshape) || n->in[0] != cur ||
            !apply(g, n, 0, &w))
            break;
        out_chain[n_out_chain++] = c;
        cur = n->out[0];
    }
    if (y < 0 || g->values[y].type.dtype != KILN_DTYPE_F32) return KILN_OK;
    if (where >= 0) {
        kiln_status st = where_mask(g, where, where_keep, where_c, &mask);
        if (st != KILN_OK) return st;
    }
    int ni;
    kiln_status st = kiln_opt_add_node(g, KILN_OP_KilnAttention, g->nodes[smi].name,
                                       mask >= 0 ? 4 : 3, 1, 13, 1, &ni);
    if (st != KILN_OK) return st;
    kiln_opt_attr_int(g, ni, 0, "num_heads", q.heads);
    kiln_opt_attr_int(g, ni, 1, "head_size", q.width);
    kiln_opt_attr_int(g, ni, 2, "v_head_size", v.width);
    kiln_opt_attr_float(g, ni, 3, "scale", (float)scale);
    kiln_opt_attr_int(g, ni, 4, "seq_first", q.seq_first);
    kiln_opt_attr_int(g, ni, 5, "q_offset", q.offset);
    kiln_opt_attr_int(g, ni, 6, "k_offset", k.offset);
    kiln_opt_attr_int(g, ni, 7, "v_offset", v.offset);
    kiln_opt_attr_int(g, ni, 8, "y_seq_first", ysf);
    kiln_opt_attr_int(g, ni, 9, "y_merge_rows", merge);
    kiln_opt_attr_int(g, ni, 10, "mask_merged", merged && mask >= 0);
    kiln_opt_attr_int(g, ni, 11, "kv_heads", k.kv_heads);
    kiln_opt_attr_int(g, ni, 12, "mask_period", pmask >= 0 ? period : 0);
    kiln_opt_set_input(g, ni, 0, q.src);
    kiln_opt_set_input(g, ni, 1, k.src);
    kiln_opt_set_input(g, ni, 2, v.src);
    if (mask >= 0) kiln_opt_set_input(g, ni, 3, mask);
    /* the core, then the output chain up to y, go; then whatever of the operand chains
     * nothing else reads */
    for (int i = best_chain - 1; i >= 0; i--) kiln_opt_remove_node(g, out_chain[i]);
    for (int i = n_rm - 1; i >= 0; i--) kiln_opt_remove_node(g, rm[i]);
    kiln_opt_set_output(g, ni, 0, y);
    drop_unread(g, q.chain, q.n_chain);
    drop_unread(g, k.chain, k.n_chain);
    drop_unread(g, v.chain, v.n_chain);
    *done = true;
    return KILN_OK;
}

kiln_status kiln_opt_attention_views(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes;
    for (int i = 0; i < n_nodes; i++) {
        const struct kiln_node *n = &g->nodes[i];
        if (kiln_opt_node_dead(n) || n->op != KILN_OP_Softmax || n->n_out != 1) continue;
        bool done;
        kiln_status st = fuse_views(g, i, &done);
        if (kiln_attr_check(&g->nodes[i]) != KILN_OK) kiln_error_clear();
        if (st != KILN_OK) return st;
        if (done) kiln_opt_count(pl, "KilnAttention");
    }
    return KILN_OK;
}
