/*
 * xgboost.c - XGBoost's own model files (booster.save_model to .json or
 * .ubj) imported as a Kiln graph.
 *
 * The file (JSON or UBJSON, parsed by xgb_doc.c) holds the learner: its
 * objective, base_score, num_feature / num_class, and the gbtree (or dart)
 * booster's trees, each as parallel node arrays (left_children,
 * right_children, split_indices, split_conditions, default_left,
 * split_type and the categories_* lists). The trees are lowered onto one
 * ai.onnx.ml TreeEnsemble node (opset 5), so XGBoost models run on the same
 * reference and fast tree kernels as ONNX-ML models:
 *
 *   features [N, num_feature] float
 *     -> TreeEnsemble (numerical split: x < split goes left; categorical:
 *        a listed category goes right; NaN follows default_left)
 *     -> Add base margin (base_score through the objective's link:
 *        logit for logistic objectives, log for poisson / gamma / tweedie)
 *     -> the objective's transform (Sigmoid, Exp, Softmax, ArgMax, hinge)
 *     -> predictions: [N] for one output group, [N, num_class] for
 *        multi:softprob, class ids as float for multi:softmax
 *
 * which is what XGBoost's predict returns. Malformed files are refused with
 * the tree and node named: child index out of range, a node reached twice
 * (a cycle), depth beyond the limit, array lengths that disagree, a split
 * on a feature the model does not have. Multi-target trees, gblinear and
 * the survival objectives are refused as unsupported.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "import/model.h"
#include "import/xgb_doc.h"
#include "import/xgboost.h"

#define XGB_MAX_DEPTH 4096 /* the tree kernels' limit (src/kernels/ref/trees.h) */
#define UNSEEN INT64_MIN   /* a node not reached yet */

int kiln_xgboost_sniff(const void *data, size_t size)
{
    const unsigned char *p = data, *end = p + size;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    if (p >= end || *p != '{') return 0;
    if (p + 1 < end && p == (const unsigned char *)data && strchr("iUIlL$#", p[1]) && p[1]) return 2;
    return 1;
}

/* ---- growable arrays ---- */

struct vec {
    void *p;
    size_t n, cap, esz;
};

static kiln_status vec_push(struct vec *v, const void *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        void *np = realloc(v->p, cap * v->esz);
        if (!np) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        v->p = np;
        v->cap = cap;
    }
    memcpy((char *)v->p + v->n * v->esz, x, v->esz);
    v->n++;
    return KILN_OK;
}

static kiln_status push_i(struct vec *v, int64_t x) { return vec_push(v, &x); }
static kiln_status push_f(struct vec *v, float x) { return vec_push(v, &x); }

/* The TreeEnsemble being assembled. */
struct forest {
    struct vec feat, tid, tleaf, fid, fleaf, miss, modes, splits, targets, weights, roots, members;
    int64_t n_int, n_leaf;
};

static void forest_free(struct forest *f)
{
    struct vec *all[] = {&f->feat, &f->tid, &f->tleaf, &f->fid, &f->fleaf, &f->miss, &f->modes,
                         &f->splits, &f->targets, &f->weights, &f->roots, &f->members};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]->p);
}

/* ---- reading the learner ---- */

/* A parameter XGBoost writes as a string ("3", "5E-1") or, in some files, a number. */
static int param_num(const struct xd *obj, const char *key, double *out)
{
    const struct xd *v = xd_get(obj, key);
    if (!v) return 0;
    if (v->t == XD_NUM) {
        *out = v->num;
        return 1;
    }
    if (v->t != XD_STR) return -1;
    const char *s = v->s;
    if (*s == '[') s++;
    char *e;
    *out = strtod(s, &e);
    return e == s ? -1 : 1;
}

/* base_score: "0.5", "[5E-1]" or "[a,b,c]" (one per class). */
static kiln_status read_base_score(const struct xd *lmp, double *out, int k)
{
    for (int i = 0; i < k; i++) out[i] = 0.5;
    const struct xd *v = xd_get(lmp, "base_score");
    if (!v) return KILN_OK;
    if (v->t == XD_NUM) {
        for (int i = 0; i < k; i++) out[i] = v->num;
        return KILN_OK;
    }
    if (v->t != XD_STR) return kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: base_score is not a number");
    const char *s = v->s;
    int bracket = *s == '[';
    if (bracket) s++;
    double vals[1024];
    int n = 0;
    for (;;) {
        char *e;
        double x = strtod(s, &e);
        if (e == s || n >= 1024)
            return kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: base_score '%.60s' is not a number list",
                              v->s);
        vals[n++] = x;
        s = e;
        while (*s == ' ') s++;
        if (*s == ',') {
            s++;
            continue;
        }
        break;
    }
    if ((bracket && *s != ']') || (!bracket && *s))
        return kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: base_score '%.60s' is malformed", v->s);
    if (n != 1 && n != k)
        return kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: base_score has %d values for %d outputs",
                          n, k);
    for (int i = 0; i < k; i++) out[i] = vals[n == 1 ? 0 : i];
    return KILN_OK;
}

enum link { LINK_ID, LINK_LOGIT, LINK_LOG };
enum outf { OUT_ID, OUT_SIGMOID, OUT_EXP, OUT_SOFTPROB, OUT_SOFTMAX, OUT_HINGE };

static kiln_status read_objective(const char *name, enum link *link, enum outf *out)
{
    static const struct { const char *name; enum link link; enum outf out; } objs[] = {
        {"reg:squarederror", LINK_ID, OUT_ID},     {"reg:linear", LINK_ID, OUT_ID},
        {"reg:squaredlogerror", LINK_ID, OUT_ID},  {"reg:pseudohubererror", LINK_ID, OUT_ID},
        {"reg:absoluteerror", LINK_ID, OUT_ID},    {"reg:quantileerror", LINK_ID, OUT_ID},
        {"rank:pairwise", LINK_ID, OUT_ID},        {"rank:ndcg", LINK_ID, OUT_ID},
        {"rank:map", LINK_ID, OUT_ID},             {"binary:logitraw", LINK_ID, OUT_ID},
        {"binary:logistic", LINK_LOGIT, OUT_SIGMOID}, {"reg:logistic", LINK_LOGIT, OUT_SIGMOID},
        {"binary:hinge", LINK_ID, OUT_HINGE},      {"count:poisson", LINK_LOG, OUT_EXP},
        {"reg:gamma", LINK_LOG, OUT_EXP},          {"reg:tweedie", LINK_LOG, OUT_EXP},
        {"multi:softprob", LINK_ID, OUT_SOFTPROB}, {"multi:softmax", LINK_ID, OUT_SOFTMAX},
    };
    for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++)
        if (strcmp(objs[i].name, name) == 0) {
            *link = objs[i].link;
            *out = objs[i].out;
            return KILN_OK;
        }
    return kiln_error(KILN_ERR_UNSUPPORTED, "XGBoost model: objective '%.80s' is not supported", name);
}

/* One tree's arrays, checked, appended to the forest. */
static kiln_status read_tree(const struct xd *tree, int t, int64_t group, double weight,
                             int64_t num_feature, struct forest *f)
{
    static const char *names[] = {"left_children", "right_children", "split_indices",
                                  "split_conditions", "default_left"};
    const struct xd *arr[5];
    long long n = -1;
    for (int k = 0; k < 5; k++) {
        arr[k] = xd_get(tree, names[k]);
        long long c = xd_count(arr[k]);
        if (c < 0)
            return kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: tree %d has no '%s' array", t,
                              names[k]);
        if (k == 0) n = c;
        else if (c != n)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "XGBoost model: tree %d: '%s' has %lld entries, left_children %lld", t,
                              names[k], c, n);
    }
    if (n < 1) return kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: tree %d has no nodes", t);
    const struct xd *tp = xd_get(tree, "tree_param");
    double d;
    if (param_num(tp, "num_nodes", &d) == 1 && d != (double)n)
        return kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: tree %d: num_nodes is %.0f but the arrays "
                          "have %lld entries", t, d, n);
    if (param_num(tp, "size_leaf_vector", &d) == 1 && d > 1)
        return kiln_error(KILN_ERR_UNSUPPORTED, "XGBoost model: tree %d has vector leaves (size_leaf_vector "
                          "%.0f): multi-target trees are not supported", t, d);
    const struct xd *stype = xd_get(tree, "split_type");
    long long nst = xd_count(stype);
    if (nst > 0 && nst != n)
        return kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: tree %d: split_type has %lld entries for "
                          "%lld nodes", t, nst, n);
    const struct xd *cats = xd_get(tree, "categories"), *cnodes = xd_get(tree, "categories_nodes"),
                    *csegs = xd_get(tree, "categories_segments"), *csizes = xd_get(tree, "categories_sizes");
    long long n_cats = xd_count(cats) > 0 ? xd_count(cats) : 0;
    long long n_cnodes = xd_count(cnodes) > 0 ? xd_count(cnodes) : 0;
    if (n_cnodes && (xd_count(csegs) != n_cnodes || xd_count(csizes) != n_cnodes))
        return kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: tree %d: categories_nodes, _segments and "
                          "_sizes differ in length", t);

    /* pass 1: number the reachable nodes depth first, refusing any node reached twice */
    int64_t *id = malloc(sizeof(int64_t) * (size_t)n);
    int64_t *order = malloc(sizeof(int64_t) * (size_t)n);
    int64_t *stack = malloc(sizeof(int64_t) * 2 * ((size_t)n + 1));
    kiln_status st = KILN_OK;
    int ok = 1;
    if (!id || !order || !stack) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    for (long long i = 0; i < n; i++) id[i] = UNSEEN;
    int64_t n_int = 0, n_leaf = 0, sp = 0;
    int root_is_leaf = 0;
    stack[sp++] = 0;
    stack[sp++] = 1;
    while (sp > 0) {
        int64_t depth = stack[--sp], node = stack[--sp];
        if (id[node] != UNSEEN) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: tree %d: node %lld is reached twice (a "
                            "cycle or a shared child)", t, (long long)node);
            goto out;
        }
        if (depth > XGB_MAX_DEPTH) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: tree %d is deeper than Kiln's limit of %d",
                            t, XGB_MAX_DEPTH);
            goto out;
        }
        double lc = xd_num_at(arr[0], (size_t)node, &ok), rc = xd_num_at(arr[1], (size_t)node, &ok);
        if (lc == -1 && rc == -1) {
            id[node] = ~n_leaf++;
            if (node == 0) root_is_leaf = 1;
            continue;
        }
        if (lc < 0 || lc >= n || rc < 0 || rc >= n || lc != floor(lc) || rc != floor(rc)) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: tree %d: node %lld has children %g and %g, "
                            "out of range for %lld nodes", t, (long long)node, lc, rc, n);
            goto out;
        }
        order[n_int] = node;
        id[node] = n_int++;
        stack[sp++] = (int64_t)rc;
        stack[sp++] = depth + 1;
        stack[sp++] = (int64_t)lc;
        stack[sp++] = depth + 1;
    }
    if (!ok) {
        st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: tree %d: a child index is not a number", t);
        goto out;
    }

    /* pass 2: interior nodes in id order, then the leaves */
    int64_t base_int = f->n_int + (root_is_leaf ? 1 : 0), base_leaf = f->n_leaf;
    if ((st = push_i(&f->roots, f->n_int)) != KILN_OK) goto out;
    if (root_is_leaf) {
        /* a one-leaf tree: a root whose two children are that leaf */
        st = push_i(&f->feat, 0);
        if (st == KILN_OK) st = push_i(&f->tid, base_leaf);
        if (st == KILN_OK) st = push_i(&f->tleaf, 1);
        if (st == KILN_OK) st = push_i(&f->fid, base_leaf);
        if (st == KILN_OK) st = push_i(&f->fleaf, 1);
        if (st == KILN_OK) st = push_i(&f->miss, 0);
        uint8_t mode = 0;
        if (st == KILN_OK) st = vec_push(&f->modes, &mode);
        if (st == KILN_OK) st = push_f(&f->splits, 0.0f);
        if (st != KILN_OK) goto out;
    }
    for (int64_t k = 0; k < n_int; k++) {
        int64_t node = order[k];
        double feat = xd_num_at(arr[2], (size_t)node, &ok);
        if (!ok || feat < 0 || feat != floor(feat) || (num_feature > 0 && feat >= (double)num_feature)) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: tree %d: node %lld splits on feature %g "
                            "of %lld", t, (long long)node, feat, (long long)num_feature);
            goto out;
        }
        int cat = nst > 0 && xd_num_at(stype, (size_t)node, &ok) == 1;
        int dleft = xd_num_at(arr[4], (size_t)node, &ok) != 0;
        int64_t l = id[(int64_t)xd_num_at(arr[0], (size_t)node, &ok)];
        int64_t r = id[(int64_t)xd_num_at(arr[1], (size_t)node, &ok)];
        /* numerical: x < split takes the left child; categorical: a listed category the right */
        int64_t tch = cat ? r : l, fch = cat ? l : r;
        st = push_i(&f->feat, (int64_t)feat);
        if (st == KILN_OK) st = push_i(&f->tid, tch < 0 ? base_leaf + ~tch : base_int + tch);
        if (st == KILN_OK) st = push_i(&f->tleaf, tch < 0);
        if (st == KILN_OK) st = push_i(&f->fid, fch < 0 ? base_leaf + ~fch : base_int + fch);
        if (st == KILN_OK) st = push_i(&f->fleaf, fch < 0);
        if (st == KILN_OK) st = push_i(&f->miss, cat ? !dleft : dleft);
        uint8_t mode = cat ? 6 : 1; /* MEMBER or BRANCH_LT */
        if (st == KILN_OK) st = vec_push(&f->modes, &mode);
        if (st == KILN_OK) st = push_f(&f->splits, cat ? 0.0f : (float)xd_num_at(arr[3], (size_t)node, &ok));
        if (st != KILN_OK) goto out;
        if (cat) {
            long long c = -1;
            for (long long j = 0; j < n_cnodes && c < 0; j++)
                if (xd_num_at(cnodes, (size_t)j, &ok) == (double)node) c = j;
            if (c < 0) {
                st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: tree %d: categorical node %lld has no "
                                "categories", t, (long long)node);
                goto out;
            }
            double seg = xd_num_at(csegs, (size_t)c, &ok), size = xd_num_at(csizes, (size_t)c, &ok);
            if (!(seg >= 0 && size >= 0 && seg + size <= (double)n_cats) || seg != floor(seg) ||
                size != floor(size)) {
                st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: tree %d: node %lld's categories "
                                "(%g from %g) exceed the %lld listed", t, (long long)node, size, seg, n_cats);
                goto out;
            }
            for (int64_t j = 0; j < (int64_t)size && st == KILN_OK; j++)
                st = push_f(&f->members, (float)xd_num_at(cats, (size_t)(seg + j), &ok));
            if (st == KILN_OK) st = push_f(&f->members, NAN);
            if (st != KILN_OK) goto out;
        }
    }
    /* leaves in id order: a leaf's value is its split_condition */
    {
        double *vals = malloc(sizeof(double) * (size_t)(n_leaf + 1));
        if (!vals) {
            st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
            goto out;
        }
        for (long long node = 0; node < n; node++)
            if (id[node] != UNSEEN && id[node] < 0) vals[~id[node]] = xd_num_at(arr[3], (size_t)node, &ok);
        for (int64_t j = 0; j < n_leaf && st == KILN_OK; j++) {
            st = push_i(&f->targets, group);
            if (st == KILN_OK) st = push_f(&f->weights, (float)(vals[j] * weight));
        }
        free(vals);
        if (st != KILN_OK) goto out;
    }
    if (!ok) {
        st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: tree %d has an entry that is not a number", t);
        goto out;
    }
    f->n_int += n_int + (root_is_leaf ? 1 : 0);
    f->n_leaf += n_leaf;
out:
    free(id);
    free(order);
    free(stack);
    return st;
}

/* ---- the graph ---- */

static kiln_status new_value(struct kiln_graph *g, const char *name, int *id)
{
    return kiln_graph_value_add(g, name, KILN_VALUE_NODE, id);
}

/* A node with one output named out (a new value); inputs by value id. */
static kiln_status add_node(struct kiln_graph *g, enum kiln_op op, int opset, int in0, int in1,
                            const char *out, int n_attr, struct kiln_node **node, int *out_id)
{
    struct kiln_node *n;
    kiln_status st = kiln_graph_node_add(g, op, out, in1 >= 0 ? 2 : 1, 1, n_attr, &n);
    if (st != KILN_OK) return st;
    n->opset = opset;
    n->in[0] = in0;
    if (in1 >= 0) n->in[1] = in1;
    int id;
    if ((st = new_value(g, out, &id)) != KILN_OK) return st;
    g->values[id].producer = g->n_nodes - 1;
    g->nodes[g->n_nodes - 1].out[0] = id;
    *node = &g->nodes[g->n_nodes - 1];
    *out_id = id;
    return KILN_OK;
}

static void attr_int(struct kiln_node *n, int k, const char *name, int64_t v)
{
    n->attr[k].name = name;
    n->attr[k].type = KILN_ATTR_INT;
    n->attr[k].i = v;
}

static kiln_status attr_ints(struct kiln_graph *g, struct kiln_node *n, int k, const char *name,
                             const struct vec *v)
{
    struct kiln_attr *a = &n->attr[k];
    a->name = name;
    a->type = KILN_ATTR_INTS;
    if (v->n > INT32_MAX) return kiln_error(KILN_ERR_UNSUPPORTED, "XGBoost model: too many tree nodes");
    a->n = (int)v->n;
    a->ints = kiln_arena_alloc(g->mem, sizeof(int64_t) * (v->n + 1));
    if (!a->ints) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if (v->n) memcpy(a->ints, v->p, sizeof(int64_t) * v->n);
    return KILN_OK;
}

static kiln_status attr_tensor(struct kiln_graph *g, struct kiln_node *n, int k, const char *name,
                               kiln_dtype dt, const struct vec *v)
{
    int64_t dims[1] = {(int64_t)v->n};
    kiln_tensor *t;
    kiln_status st = kiln_tensor_new(dt, 1, dims, &t);
    if (st != KILN_OK) return st;
    if (v->n) memcpy(t->data, v->p, v->n * v->esz);
    if ((st = kiln_graph_own_tensor(g, t)) != KILN_OK) return st;
    n->attr[k].name = name;
    n->attr[k].type = KILN_ATTR_TENSOR;
    n->attr[k].t = t;
    return KILN_OK;
}

static kiln_status add_const(struct kiln_graph *g, const char *name, kiln_tensor *t, int *id)
{
    kiln_status st = kiln_graph_own_tensor(g, t);
    if (st != KILN_OK) {
        kiln_tensor_free(t);
        return st;
    }
    if ((st = kiln_graph_value_add(g, name, KILN_VALUE_CONST, id)) != KILN_OK) return st;
    g->values[*id].konst = t;
    kiln_type_from_tensor(&g->values[*id].type, t);
    return KILN_OK;
}

/* features -> TreeEnsemble -> + base -> transform -> predictions */
static kiln_status build_graph(struct kiln_graph *g, struct forest *f, int64_t num_feature, int k,
                               const double *base, enum outf outf)
{
    kiln_status st;
    int x;
    if ((st = kiln_graph_value_add(g, "features", KILN_VALUE_INPUT, &x)) != KILN_OK) return st;
    struct kiln_type *xt = &g->values[x].type;
    kiln_type_unknown(xt);
    xt->dtype = KILN_DTYPE_F32;
    xt->rank = 2;
    xt->dims[0] = -1;
    xt->dims[1] = num_feature;
    xt->sym[0] = "N";
    g->inputs = kiln_arena_alloc(g->mem, sizeof(int));
    g->outputs = kiln_arena_alloc(g->mem, sizeof(int));
    if (!g->inputs || !g->outputs) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    g->inputs[g->n_inputs++] = x;

    struct kiln_node *n;
    int margin;
    const int has_members = f->members.n > 0;
    if ((st = add_node(g, KILN_OP_TreeEnsemble, 5, x, -1, "margin_trees", 14 + has_members, &n,
                       &margin)) != KILN_OK)
        return st;
    int a = 0;
    attr_int(n, a++, "n_targets", k);
    attr_int(n, a++, "aggregate_function", 1);
    attr_int(n, a++, "post_transform", 0);
    if ((st = attr_ints(g, n, a++, "tree_roots", &f->roots)) != KILN_OK ||
        (st = attr_ints(g, n, a++, "nodes_featureids", &f->feat)) != KILN_OK ||
        (st = attr_ints(g, n, a++, "nodes_truenodeids", &f->tid)) != KILN_OK ||
        (st = attr_ints(g, n, a++, "nodes_trueleafs", &f->tleaf)) != KILN_OK ||
        (st = attr_ints(g, n, a++, "nodes_falsenodeids", &f->fid)) != KILN_OK ||
        (st = attr_ints(g, n, a++, "nodes_falseleafs", &f->fleaf)) != KILN_OK ||
        (st = attr_ints(g, n, a++, "nodes_missing_value_tracks_true", &f->miss)) != KILN_OK ||
        (st = attr_ints(g, n, a++, "leaf_targetids", &f->targets)) != KILN_OK ||
        (st = attr_tensor(g, n, a++, "nodes_modes", KILN_DTYPE_U8, &f->modes)) != KILN_OK ||
        (st = attr_tensor(g, n, a++, "nodes_splits", KILN_DTYPE_F32, &f->splits)) != KILN_OK)
        return st;
    if ((st = attr_tensor(g, n, a++, "leaf_weights", KILN_DTYPE_F32, &f->weights)) != KILN_OK) return st;
    if (has_members &&
        (st = attr_tensor(g, n, a++, "membership_values", KILN_DTYPE_F32, &f->members)) != KILN_OK)
        return st;
    if (a != n->n_attr) return kiln_error(KILN_ERR_INTERNAL, "XGBoost lowering: %d attributes", a);

    /* + base margin */
    kiln_tensor *bt;
    int64_t bd[1] = {k};
    if ((st = kiln_tensor_new(KILN_DTYPE_F32, 1, bd, &bt)) != KILN_OK) return st;
    for (int i = 0; i < k; i++) ((float *)bt->data)[i] = (float)base[i];
    int bid, y;
    if ((st = add_const(g, "base_margin", bt, &bid)) != KILN_OK) return st;
    if ((st = add_node(g, KILN_OP_Add, 17, margin, bid, "margin", 0, &n, &y)) != KILN_OK) return st;

    /* the objective's transform */
    int two_d = outf == OUT_SOFTPROB;
    switch (outf) {
    case OUT_SIGMOID: st = add_node(g, KILN_OP_Sigmoid, 17, y, -1, "transformed", 0, &n, &y); break;
    case OUT_EXP: st = add_node(g, KILN_OP_Exp, 17, y, -1, "transformed", 0, &n, &y); break;
    case OUT_SOFTPROB:
        st = add_node(g, KILN_OP_Softmax, 17, y, -1, "predictions", 1, &n, &y);
        if (st == KILN_OK) attr_int(n, 0, "axis", 1);
        break;
    case OUT_SOFTMAX:
        st = add_node(g, KILN_OP_ArgMax, 17, y, -1, "class", 2, &n, &y);
        if (st == KILN_OK) {
            attr_int(n, 0, "axis", 1);
            attr_int(n, 1, "keepdims", 0);
            st = add_node(g, KILN_OP_Cast, 17, y, -1, "predictions", 1, &n, &y);
        }
        if (st == KILN_OK) attr_int(n, 0, "to", 1); /* float */
        two_d = 1; /* already [N] */
        break;
    case OUT_HINGE: {
        kiln_tensor *zero;
        int64_t zd[1] = {1};
        int zid;
        if ((st = kiln_tensor_new(KILN_DTYPE_F32, 1, zd, &zero)) != KILN_OK) return st;
        if ((st = add_const(g, "zero", zero, &zid)) != KILN_OK) return st;
        st = add_node(g, KILN_OP_Greater, 17, y, zid, "positive", 0, &n, &y);
        if (st == KILN_OK) st = add_node(g, KILN_OP_Cast, 17, y, -1, "transformed", 1, &n, &y);
        if (st == KILN_OK) attr_int(n, 0, "to", 1);
        break;
    }
    default: break;
    }
    if (st != KILN_OK) return st;
    if (!two_d) {
        /* one output group: [N, 1] -> [N], as XGBoost's predict returns it */
        kiln_tensor *axes;
        int64_t sd[1] = {1};
        int sid;
        if ((st = kiln_tensor_new(KILN_DTYPE_I64, 1, sd, &axes)) != KILN_OK) return st;
        ((int64_t *)axes->data)[0] = 1;
        if ((st = add_const(g, "squeeze_axes", axes, &sid)) != KILN_OK) return st;
        if ((st = add_node(g, KILN_OP_Squeeze, 17, y, sid, "predictions", 0, &n, &y)) != KILN_OK)
            return st;
    }
    g->outputs[g->n_outputs++] = y;
    return KILN_OK;
}

kiln_status kiln_xgboost_load(const void *data, size_t size, struct kiln_model *m)
{
    int kind = kiln_xgboost_sniff(data, size);
    if (!kind) return kiln_error(KILN_ERR_INVALID_MODEL, "not an XGBoost JSON or UBJSON model");
    struct xd_doc doc;
    kiln_status st = xd_parse(data, size, kind == 2, &doc);
    if (st != KILN_OK) return st;
    struct forest f = {0};
    f.feat.esz = f.tid.esz = f.tleaf.esz = f.fid.esz = f.fleaf.esz = f.miss.esz = f.targets.esz =
        f.roots.esz = sizeof(int64_t);
    f.modes.esz = 1;
    f.splits.esz = f.weights.esz = f.members.esz = sizeof(float);
    double *base = NULL;

    const struct xd *learner = xd_get(&doc.root, "learner");
    const struct xd *lmp = xd_get(learner, "learner_model_param");
    const struct xd *obj = xd_get(xd_get(learner, "objective"), "name");
    const struct xd *booster = xd_get(learner, "gradient_booster");
    const struct xd *bname = xd_get(booster, "name");
    if (!learner || !lmp || !obj || obj->t != XD_STR || !bname || bname->t != XD_STR) {
        st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: no learner with learner_model_param, "
                        "objective and gradient_booster (is this a save_model file?)");
        goto out;
    }
    enum link link = LINK_ID;
    enum outf outf = OUT_ID;
    if ((st = read_objective(obj->s, &link, &outf)) != KILN_OK) goto out;
    const struct xd *model = NULL, *drop = NULL;
    if (strcmp(bname->s, "gbtree") == 0) {
        model = xd_get(booster, "model");
    } else if (strcmp(bname->s, "dart") == 0) {
        model = xd_get(xd_get(booster, "gbtree"), "model");
        drop = xd_get(booster, "weight_drop");
    } else {
        st = kiln_error(KILN_ERR_UNSUPPORTED, "XGBoost model: booster '%.40s' is not supported (gbtree "
                        "and dart are)", bname->s);
        goto out;
    }
    double num_feature = 0, num_class = 0, num_target = 1;
    if (param_num(lmp, "num_feature", &num_feature) < 0 || param_num(lmp, "num_class", &num_class) < 0 ||
        param_num(lmp, "num_target", &num_target) < 0 || !(num_feature >= 1 && num_feature <= (1 << 24)) ||
        !(num_class >= 0 && num_class <= 65536) || num_feature != floor(num_feature) ||
        num_class != floor(num_class)) {
        st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: num_feature %g / num_class %g are not valid",
                        num_feature, num_class);
        goto out;
    }
    if (num_target > 1) {
        st = kiln_error(KILN_ERR_UNSUPPORTED, "XGBoost model: %g targets: multi-target models are not "
                        "supported", num_target);
        goto out;
    }
    int k = num_class > 1 ? (int)num_class : 1;
    if ((outf == OUT_SOFTPROB || outf == OUT_SOFTMAX) != (k > 1)) {
        st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: objective '%.40s' with num_class %d", obj->s,
                        (int)num_class);
        goto out;
    }
    base = malloc(sizeof(double) * (size_t)k);
    if (!base) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    if ((st = read_base_score(lmp, base, k)) != KILN_OK) goto out;
    for (int i = 0; i < k; i++) {
        if (!isfinite(base[i])) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: base_score %g is not finite", base[i]);
            goto out;
        }
        if (link == LINK_LOGIT) {
            if (!(base[i] > 0 && base[i] < 1)) {
                st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: base_score %g is not a probability",
                                base[i]);
                goto out;
            }
            base[i] = log(base[i] / (1 - base[i]));
        } else if (link == LINK_LOG) {
            if (!(base[i] > 0)) {
                st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: base_score %g must be positive",
                                base[i]);
                goto out;
            }
            base[i] = log(base[i]);
        }
    }
    const struct xd *trees = xd_get(model, "trees"), *info = xd_get(model, "tree_info");
    if (!trees || trees->t != XD_ARR || (trees->len > 0 && xd_count(info) != (long long)trees->len)) {
        st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: the booster has no trees array with a "
                        "tree_info entry per tree");
        goto out;
    }
    if (drop && xd_count(drop) != (long long)trees->len && xd_count(drop) != 0) {
        st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: weight_drop has %lld entries for %zu trees",
                        xd_count(drop), trees->len);
        goto out;
    }
    for (size_t t = 0; t < trees->len; t++) {
        int ok = 1;
        double group = xd_num_at(info, t, &ok);
        double w = drop && xd_count(drop) > 0 ? xd_num_at(drop, t, &ok) : 1.0;
        if (!ok || group < 0 || group >= k || group != floor(group)) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "XGBoost model: tree_info[%zu] is %g for %d output groups",
                            t, group, k);
            goto out;
        }
        if (t > INT32_MAX / 2) {
            st = kiln_error(KILN_ERR_UNSUPPORTED, "XGBoost model: too many trees");
            goto out;
        }
        if ((st = read_tree(&trees->items[t], (int)t, (int64_t)group, w, (int64_t)num_feature, &f)) !=
            KILN_OK)
            goto out;
    }
    if (f.n_int > INT32_MAX / 2 || f.n_leaf > INT32_MAX / 2) {
        st = kiln_error(KILN_ERR_UNSUPPORTED, "XGBoost model: too many tree nodes");
        goto out;
    }

    m->format = "xgboost";
    if ((st = kiln_graph_new(&m->graph)) != KILN_OK) goto out;
    struct kiln_graph *g = m->graph;
    g->name = "xgboost";
    if ((st = build_graph(g, &f, (int64_t)num_feature, k, base, outf)) != KILN_OK) goto out;
    if ((st = kiln_graph_verify(g)) != KILN_OK) goto out;
    if ((st = kiln_graph_infer(g)) != KILN_OK) goto out;
    /* producer: "xgboost 1.7.4" from the version array */
    const struct xd *ver = xd_get(&doc.root, "version");
    char prod[64] = "xgboost";
    if (xd_count(ver) == 3) {
        int ok = 1;
        snprintf(prod, sizeof prod, "xgboost %.0f.%.0f.%.0f", xd_num_at(ver, 0, &ok), xd_num_at(ver, 1, &ok),
                 xd_num_at(ver, 2, &ok));
    }
    m->stats.producer = kiln_arena_strdup(g->mem, prod);
    m->n_signatures = 1;
    m->signatures = kiln_arena_alloc(g->mem, sizeof *m->signatures);
    if (!m->signatures || !m->stats.producer) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    struct kiln_signature *sig = &m->signatures[0];
    sig->name = "serving_default";
    sig->method = "tensorflow/serving/predict";
    sig->graph = g;
    sig->n_inputs = g->n_inputs;
    sig->input_values = g->inputs;
    sig->n_outputs = g->n_outputs;
    sig->output_values = g->outputs;
    if ((st = kiln_signature_describe(m, sig)) != KILN_OK) goto out;
    st = kiln_model_finish(m);
out:
    free(base);
    forest_free(&f);
    xd_free(&doc);
    return st;
}
