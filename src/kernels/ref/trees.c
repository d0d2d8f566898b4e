/*
 * trees.c - reading ai.onnx.ml tree ensembles (trees.h) and the reference
 * kernels of TreeEnsembleClassifier, TreeEnsembleRegressor and TreeEnsemble.
 *
 * Semantics follow the ONNX-ML specification and ONNX Runtime: a node's
 * test (x <= split, x < split, ..., x in set) picks its true child; NaN
 * picks the true child when nodes_missing_value_tracks_true says so and
 * otherwise fails every test but BRANCH_NEQ. Votes of the reached leaves
 * are aggregated per target (SUM, AVERAGE over the trees, MIN, MAX), the
 * base values are added, then the post transform (NONE, SOFTMAX, LOGISTIC,
 * SOFTMAX_ZERO, PROBIT) is applied. The classifier's two-column rule for
 * binary models (every vote for one class) and its labels follow the ONNX
 * reference implementation. Scores are accumulated in double.
 *
 * The reference kernels read the forest from the node's attributes on every
 * run; the fast kernel (trees_fast.c) reads it once per plan.
 */
#include <float.h>
#include <stdlib.h>

#include "kernels/ref/trees.h"

/* ---- post transforms ---- */

static double probit_erfinv(double x)
{
    /* the approximation ONNX Runtime and the ONNX reference use */
    double sgn = x < 0 ? -1.0 : 1.0;
    x = (1.0 - x) * (1.0 + x);
    if (x == 0) return 0;
    double lg = log(x);
    double v = 2.0 / (3.14159265358979323846 * 0.147) + 0.5 * lg;
    double v2 = 1.0 / 0.147 * lg;
    double v3 = -v + sqrt(v * v - v2);
    return sgn * sqrt(v3);
}

void kiln_ml_post_transform(int post, double *s, int64_t n)
{
    if (post == KILN_POST_LOGISTIC) {
        for (int64_t i = 0; i < n; i++) {
            double v = 1.0 / (1.0 + exp(-fabs(s[i])));
            s[i] = s[i] < 0 ? 1.0 - v : v;
        }
    } else if (post == KILN_POST_SOFTMAX && n > 0) {
        double mx = s[0], sum = 0;
        for (int64_t i = 1; i < n; i++) mx = s[i] > mx ? s[i] : mx;
        for (int64_t i = 0; i < n; i++) sum += (s[i] = exp(s[i] - mx));
        for (int64_t i = 0; i < n; i++) s[i] /= sum;
    } else if (post == KILN_POST_SOFTMAX_ZERO && n > 0) {
        double mx = s[0], sum = 0;
        for (int64_t i = 1; i < n; i++) mx = s[i] > mx ? s[i] : mx;
        double e = exp(-mx);
        for (int64_t i = 0; i < n; i++) {
            s[i] = s[i] > 1e-7 || s[i] < -1e-7 ? exp(s[i] - mx) : s[i] * e;
            sum += s[i];
        }
        for (int64_t i = 0; i < n; i++) s[i] = sum == 0 ? 0.5 : s[i] / sum;
    } else if (post == KILN_POST_PROBIT) {
        for (int64_t i = 0; i < n; i++) s[i] = 1.41421356 * probit_erfinv(s[i] * 2 - 1);
    }
}

kiln_status kiln_ml_post_attr(const struct kiln_node *n, int *out)
{
    const struct kiln_attr *a = kiln_node_attr(n, "post_transform");
    *out = KILN_POST_NONE;
    if (!a) return KILN_OK;
    if (a->type == KILN_ATTR_INT) {
        if (a->i < 0 || a->i > KILN_POST_PROBIT)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "post_transform is %lld, expected 0..4",
                                   (long long)a->i);
        *out = (int)a->i;
        return KILN_OK;
    }
    static const char *names[] = {"NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"};
    const char *s = kiln_attr_str(n, "post_transform", "NONE");
    for (int i = 0; i < 5; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return KILN_OK;
        }
    return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                           "post_transform is '%s', expected NONE, SOFTMAX, LOGISTIC, "
                           "SOFTMAX_ZERO or PROBIT", s);
}

/* ---- reading the attributes ---- */

void kiln_forest_free(struct kiln_forest *f)
{
    if (!f) return;
    free(f->roots);
    free(f->nodes);
    free(f->leaf_first);
    free(f->vote_target);
    free(f->vote_weight);
    free(f->members);
    free(f->base);
    free(f);
}

/* An INTS attribute that must be present with n entries (n < 0: any). */
static kiln_status need_ints(const struct kiln_node *node, const char *name, int n,
                             const int64_t **v, int *count)
{
    int c = kiln_attr_ints(node, name, v);
    if (c < 0) return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "attribute '%s' is missing", name);
    if (n >= 0 && c != n)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s has %d values, expected %d", name,
                               c, n);
    if (count) *count = c;
    return KILN_OK;
}

/* A list of numbers from FLOATS `name` or TENSOR `name`_as_tensor (or, for
 * opset 5, a TENSOR `name` itself), as doubles (malloc'd). *n = -1 if absent. */
static kiln_status read_numbers(const struct kiln_node *node, const char *name, double **out,
                                int *n)
{
    *out = NULL;
    *n = -1;
    const struct kiln_attr *a = kiln_node_attr(node, name);
    const kiln_tensor *t = NULL;
    char tname[96];
    snprintf(tname, sizeof tname, "%s_as_tensor", name);
    const struct kiln_attr *at = kiln_node_attr(node, tname);
    if (at && at->type == KILN_ATTR_TENSOR) t = at->t;
    else if (a && a->type == KILN_ATTR_TENSOR) t = a->t;
    int64_t count;
    if (t) {
        if (!kiln_dtype_is_float(t->dtype) && !kiln_dtype_is_int(t->dtype))
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s has dtype %s", name,
                                   kiln_dtype_name(t->dtype));
        count = kiln_tensor_count(t);
    } else if (a && a->type == KILN_ATTR_FLOATS) {
        count = a->n;
    } else if (a) {
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "attribute '%s' has the wrong type",
                               name);
    } else {
        return KILN_OK;
    }
    if (count > INT32_MAX / 2)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s has too many values", name);
    double *v = malloc(sizeof(double) * (size_t)(count + 1));
    if (!v) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t i = 0; i < count; i++) v[i] = t ? kiln_get_f64(t->dtype, t->data, i) : a->floats[i];
    *out = v;
    *n = (int)count;
    return KILN_OK;
}

/* Check that the child graph is acyclic and bounded in depth (iterative DFS). */
static kiln_status check_shape(const struct kiln_node *node, struct kiln_forest *f)
{
    if (f->n_nodes == 0) {
        f->max_depth = 0;
        return KILN_OK;
    }
    int32_t *depth = malloc(sizeof(int32_t) * (size_t)f->n_nodes);
    int32_t *stack = malloc(sizeof(int32_t) * (size_t)f->n_nodes);
    uint8_t *state = calloc((size_t)f->n_nodes, 1); /* 0 new, 1 on the stack, 2 done */
    kiln_status st = KILN_OK;
    if (!depth || !stack || !state) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    f->max_depth = 0;
    for (int t = 0; t < f->n_trees && st == KILN_OK; t++) {
        if (f->roots[t] < 0 || state[f->roots[t]] == 2) continue;
        int sp = 0;
        stack[sp++] = f->roots[t];
        state[f->roots[t]] = 1;
        while (sp > 0) {
            int32_t c = stack[sp - 1];
            int pushed = 0;
            for (int k = 0; k < 2 && !pushed; k++) {
                int32_t ch = f->nodes[c].child[k];
                if (ch < 0 || state[ch] == 2) continue;
                if (state[ch] == 1) {
                    st = kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                         "tree %d has a cycle through node %d", t, ch);
                    goto done;
                }
                state[ch] = 1;
                stack[sp++] = ch;
                pushed = 1;
            }
            if (pushed) continue;
            int32_t d = 0;
            for (int k = 0; k < 2; k++) {
                int32_t ch = f->nodes[c].child[k];
                if (ch >= 0 && depth[ch] > d) d = depth[ch];
            }
            depth[c] = d + 1;
            if (depth[c] > KILN_TREE_MAX_DEPTH) {
                st = kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                     "tree %d is deeper than Kiln's limit of %d", t,
                                     KILN_TREE_MAX_DEPTH);
                goto done;
            }
            if (depth[c] > f->max_depth) f->max_depth = depth[c];
            state[c] = 2;
            sp--;
        }
    }
done:
    free(depth);
    free(stack);
    free(state);
    return st;
}

/* (tree id, node id) -> position, for the old ops' addressing. */
struct key { int64_t tree, node; int32_t pos; };

static int key_cmp(const void *a, const void *b)
{
    const struct key *x = a, *y = b;
    if (x->tree != y->tree) return x->tree < y->tree ? -1 : 1;
    if (x->node != y->node) return x->node < y->node ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int32_t key_find(const struct key *keys, int n, int64_t tree, int64_t node)
{
    struct key k = {tree, node, -1};
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (key_cmp(&keys[mid], &k) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && keys[lo].tree == tree && keys[lo].node == node ? keys[lo].pos : -1;
}

static kiln_status build_v1(const struct kiln_node *node, struct kiln_forest *f)
{
    const int classifier = node->op == KILN_OP_TreeEnsembleClassifier;
    const char *vp = classifier ? "class" : "target";
    const int64_t *treeids, *nodeids, *featureids, *trueids, *falseids, *missing = NULL;
    int n = 0;
    kiln_status st = need_ints(node, "nodes_treeids", -1, &treeids, &n);
    if (st == KILN_OK) st = need_ints(node, "nodes_nodeids", n, &nodeids, NULL);
    if (st == KILN_OK) st = need_ints(node, "nodes_featureids", n, &featureids, NULL);
    if (st == KILN_OK) st = need_ints(node, "nodes_truenodeids", n, &trueids, NULL);
    if (st == KILN_OK) st = need_ints(node, "nodes_falsenodeids", n, &falseids, NULL);
    if (st != KILN_OK) return st;
    int nm = kiln_attr_ints(node, "nodes_missing_value_tracks_true", &missing);
    if (nm >= 0 && nm != n)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "nodes_missing_value_tracks_true has %d values, expected %d", nm, n);
    const struct kiln_attr *modes = kiln_node_attr(node, "nodes_modes");
    if (!modes || modes->type != KILN_ATTR_STRINGS || modes->n != n)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "nodes_modes must be %d strings", n);
    double *values = NULL, *weights = NULL;
    int nv, nw;
    struct key *keys = NULL;
    int32_t *pos_id = NULL;
    if ((st = read_numbers(node, "nodes_values", &values, &nv)) != KILN_OK) goto out;
    if (nv >= 0 && nv != n) {
        st = kiln_node_error(node, KILN_ERR_INVALID_MODEL, "nodes_values has %d values, expected %d",
                             nv, n);
        goto out;
    }
    char an[64];
    const int64_t *v_tree, *v_node, *v_ids;
    int n_votes = 0;
    snprintf(an, sizeof an, "%s_treeids", vp);
    if ((st = need_ints(node, an, -1, &v_tree, &n_votes)) != KILN_OK) goto out;
    snprintf(an, sizeof an, "%s_nodeids", vp);
    if ((st = need_ints(node, an, n_votes, &v_node, NULL)) != KILN_OK) goto out;
    snprintf(an, sizeof an, "%s_ids", vp);
    if ((st = need_ints(node, an, n_votes, &v_ids, NULL)) != KILN_OK) goto out;
    snprintf(an, sizeof an, "%s_weights", vp);
    if ((st = read_numbers(node, an, &weights, &nw)) != KILN_OK) goto out;
    if (nw != n_votes) {
        st = kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s has %d values, expected %d", an, nw,
                             n_votes);
        goto out;
    }
    keys = malloc(sizeof *keys * (size_t)(n + 1));
    pos_id = malloc(sizeof *pos_id * (size_t)(n + 1)); /* node or ~leaf per position */
    if (!keys || !pos_id) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    int n_leaf = 0, n_int = 0;
    for (int i = 0; i < n; i++) {
        keys[i] = (struct key){treeids[i], nodeids[i], i};
        const kiln_string m = modes->strings[i];
        pos_id[i] = m.len == 4 && memcmp(m.data, "LEAF", 4) == 0 ? ~n_leaf++ : n_int++;
    }
    qsort(keys, (size_t)n, sizeof *keys, key_cmp);
    for (int i = 1; i < n; i++)
        if (keys[i].tree == keys[i - 1].tree && keys[i].node == keys[i - 1].node) {
            st = kiln_node_error(node, KILN_ERR_INVALID_MODEL, "tree %lld has node %lld twice",
                                 (long long)keys[i].tree, (long long)keys[i].node);
            goto out;
        }
    f->n_nodes = n_int;
    f->n_leaves = n_leaf;
    f->nodes = calloc((size_t)n_int + 1, sizeof *f->nodes);
    f->roots = malloc(sizeof(int32_t) * (size_t)(n + 1));
    f->leaf_first = calloc((size_t)n_leaf + 2, sizeof(int32_t));
    f->vote_target = malloc(sizeof(int32_t) * (size_t)(n_votes + 1));
    f->vote_weight = malloc(sizeof(double) * (size_t)(n_votes + 1));
    if (!f->nodes || !f->roots || !f->leaf_first || !f->vote_target || !f->vote_weight) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    static const char *mode_names[] = {"BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT",
                                       "BRANCH_EQ", "BRANCH_NEQ"};
    f->n_features = 0;
    for (int i = 0; i < n; i++) {
        if (pos_id[i] < 0) continue;
        struct kiln_tree_node *nd = &f->nodes[pos_id[i]];
        const kiln_string m = modes->strings[i];
        int mode = -1;
        for (int k = 0; k < 6; k++)
            if (m.len == strlen(mode_names[k]) && memcmp(m.data, mode_names[k], m.len) == 0) mode = k;
        if (mode < 0) {
            st = kiln_node_error(node, KILN_ERR_INVALID_MODEL, "nodes_modes[%d] is '%.*s'", i,
                                 (int)m.len, m.data);
            goto out;
        }
        if (featureids[i] < 0 || featureids[i] > INT32_MAX) {
            st = kiln_node_error(node, KILN_ERR_INVALID_MODEL, "nodes_featureids[%d] is %lld", i,
                                 (long long)featureids[i]);
            goto out;
        }
        nd->mode = (uint8_t)mode;
        nd->feature = featureids[i];
        if (featureids[i] + 1 > f->n_features) f->n_features = featureids[i] + 1;
        nd->split = values ? values[i] : 0.0;
        nd->missing_true = nm >= 0 && missing[i] != 0;
        const int64_t ch[2] = {trueids[i], falseids[i]};
        for (int k = 0; k < 2; k++) {
            int32_t p = key_find(keys, n, treeids[i], ch[k]);
            if (p < 0) {
                st = kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                     "tree %lld node %lld: %s child %lld does not exist",
                                     (long long)treeids[i], (long long)nodeids[i],
                                     k ? "false" : "true", (long long)ch[k]);
                goto out;
            }
            nd->child[k] = pos_id[p];
        }
    }
    /* trees in id order; the root is the tree's first node in the lists */
    f->n_trees = 0;
    for (int i = 0; i < n; i++) {
        if (i > 0 && keys[i].tree == keys[i - 1].tree) continue;
        int32_t first = keys[i].pos;
        for (int j = i + 1; j < n && keys[j].tree == keys[i].tree; j++)
            if (keys[j].pos < first) first = keys[j].pos;
        f->roots[f->n_trees++] = pos_id[first];
    }
    /* votes, grouped by leaf */
    for (int v = 0; v < n_votes; v++) {
        int32_t p = key_find(keys, n, v_tree[v], v_node[v]);
        if (p < 0 || pos_id[p] >= 0) {
            st = kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                 "vote %d is for tree %lld node %lld, which is not a leaf", v,
                                 (long long)v_tree[v], (long long)v_node[v]);
            goto out;
        }
        if (v_ids[v] < 0 || v_ids[v] >= f->n_targets) {
            st = kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s_ids[%d] is %lld, expected 0..%lld",
                                 vp, v, (long long)v_ids[v], (long long)f->n_targets - 1);
            goto out;
        }
        f->leaf_first[~pos_id[p] + 1]++;
    }
    for (int l = 0; l < n_leaf; l++) f->leaf_first[l + 1] += f->leaf_first[l];
    int32_t *fill = calloc((size_t)n_leaf + 1, sizeof(int32_t));
    if (!fill) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    for (int v = 0; v < n_votes; v++) {
        int32_t leaf = ~pos_id[key_find(keys, n, v_tree[v], v_node[v])];
        int32_t at = f->leaf_first[leaf] + fill[leaf]++;
        f->vote_target[at] = (int32_t)v_ids[v];
        f->vote_weight[at] = weights[v];
    }
    free(fill);
    if (classifier) {
        int binary = n_votes > 0;
        for (int v = 1; v < n_votes; v++) binary &= v_ids[v] == v_ids[0];
        f->binary = binary;
    }
out:
    free(values);
    free(weights);
    free(keys);
    free(pos_id);
    return st;
}

static kiln_status build_v5(const struct kiln_node *node, struct kiln_forest *f)
{
    const int64_t *featureids, *trueids, *falseids, *trueleaf, *falseleaf, *roots, *targets,
        *missing = NULL;
    int n = 0, n_leaf = 0, n_trees = 0;
    kiln_status st = need_ints(node, "nodes_featureids", -1, &featureids, &n);
    if (st == KILN_OK) st = need_ints(node, "nodes_truenodeids", n, &trueids, NULL);
    if (st == KILN_OK) st = need_ints(node, "nodes_falsenodeids", n, &falseids, NULL);
    if (st == KILN_OK) st = need_ints(node, "nodes_trueleafs", n, &trueleaf, NULL);
    if (st == KILN_OK) st = need_ints(node, "nodes_falseleafs", n, &falseleaf, NULL);
    if (st == KILN_OK) st = need_ints(node, "tree_roots", -1, &roots, &n_trees);
    if (st == KILN_OK) st = need_ints(node, "leaf_targetids", -1, &targets, &n_leaf);
    if (st != KILN_OK) return st;
    int nm = kiln_attr_ints(node, "nodes_missing_value_tracks_true", &missing);
    if (nm >= 0 && nm != n)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "nodes_missing_value_tracks_true has %d values, expected %d", nm, n);
    const kiln_tensor *modes = kiln_attr_tensor(node, "nodes_modes");
    if (!modes || kiln_tensor_count(modes) != n || !kiln_dtype_is_int(modes->dtype))
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "nodes_modes must be a tensor of %d integers", n);
    double *splits = NULL, *weights = NULL, *members = NULL;
    int ns, nw, n_members;
    if ((st = read_numbers(node, "nodes_splits", &splits, &ns)) != KILN_OK) goto out;
    if ((st = read_numbers(node, "leaf_weights", &weights, &nw)) != KILN_OK) goto out;
    if ((st = read_numbers(node, "membership_values", &members, &n_members)) != KILN_OK) goto out;
    if (ns != n || nw != n_leaf) {
        st = kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                             "nodes_splits has %d values for %d nodes, leaf_weights %d for %d "
                             "leaves", ns, n, nw, n_leaf);
        goto out;
    }
    f->n_nodes = n;
    f->n_leaves = n_leaf;
    f->n_trees = n_trees;
    f->nodes = calloc((size_t)n + 1, sizeof *f->nodes);
    f->roots = malloc(sizeof(int32_t) * (size_t)(n_trees + 1));
    f->leaf_first = malloc(sizeof(int32_t) * (size_t)(n_leaf + 1));
    f->vote_target = malloc(sizeof(int32_t) * (size_t)(n_leaf + 1));
    f->vote_weight = weights;
    weights = NULL;
    if (!f->nodes || !f->roots || !f->leaf_first || !f->vote_target) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    for (int l = 0; l <= n_leaf; l++) f->leaf_first[l] = l;
    for (int l = 0; l < n_leaf; l++) {
        if (targets[l] < 0 || targets[l] >= f->n_targets) {
            st = kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                 "leaf_targetids[%d] is %lld, expected 0..%lld", l,
                                 (long long)targets[l], (long long)f->n_targets - 1);
            goto out;
        }
        f->vote_target[l] = (int32_t)targets[l];
    }
    int m_at = 0;
    f->n_features = 0;
    for (int i = 0; i < n; i++) {
        struct kiln_tree_node *nd = &f->nodes[i];
        int64_t mode = kiln_get_i64(modes->dtype, modes->data, i);
        if (mode < 0 || mode > KILN_TREE_MEMBER) {
            st = kiln_node_error(node, KILN_ERR_INVALID_MODEL, "nodes_modes[%d] is %lld", i,
                                 (long long)mode);
            goto out;
        }
        if (featureids[i] < 0 || featureids[i] > INT32_MAX) {
            st = kiln_node_error(node, KILN_ERR_INVALID_MODEL, "nodes_featureids[%d] is %lld", i,
                                 (long long)featureids[i]);
            goto out;
        }
        nd->mode = (uint8_t)mode;
        nd->feature = featureids[i];
        if (featureids[i] + 1 > f->n_features) f->n_features = featureids[i] + 1;
        nd->split = splits[i];
        nd->missing_true = nm >= 0 && missing[i] != 0;
        if (mode == KILN_TREE_MEMBER) {
            /* each MEMBER node's set: the next run of membership_values up to a NaN */
            nd->set_start = m_at;
            while (m_at < n_members && members[m_at] == members[m_at]) m_at++;
            if (m_at >= n_members) {
                st = kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                     "membership_values has no NaN-terminated set for node %d", i);
                goto out;
            }
            nd->set_len = m_at - nd->set_start;
            m_at++;
        }
        const int64_t ch[2] = {trueids[i], falseids[i]}, lf[2] = {trueleaf[i], falseleaf[i]};
        for (int k = 0; k < 2; k++) {
            int64_t lim = lf[k] ? n_leaf : n;
            if (ch[k] < 0 || ch[k] >= lim) {
                st = kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                     "node %d: %s child %lld is out of range (%lld %s)", i,
                                     k ? "false" : "true", (long long)ch[k], (long long)lim,
                                     lf[k] ? "leaves" : "nodes");
                goto out;
            }
            nd->child[k] = lf[k] ? ~(int32_t)ch[k] : (int32_t)ch[k];
        }
    }
    f->members = members;
    members = NULL;
    for (int t = 0; t < n_trees; t++) {
        int64_t r = roots[t];
        if (r < 0 || r >= n) {
            st = kiln_node_error(node, KILN_ERR_INVALID_MODEL, "tree_roots[%d] is %lld of %d nodes",
                                 t, (long long)r, n);
            goto out;
        }
        /* a one-leaf tree: a root whose two children are the same leaf */
        if (trueleaf[r] && falseleaf[r] && trueids[r] == falseids[r]) f->roots[t] = ~(int32_t)trueids[r];
        else f->roots[t] = (int32_t)r;
    }
out:
    free(splits);
    free(weights);
    free(members);
    return st;
}

kiln_status kiln_forest_build(const struct kiln_node *node, struct kiln_forest **out)
{
    *out = NULL;
    struct kiln_forest *f = calloc(1, sizeof *f);
    if (!f) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kiln_status st = kiln_ml_post_attr(node, &f->post);
    if (st != KILN_OK) goto fail;
    f->aggregate = KILN_AGG_SUM;
    if (node->op == KILN_OP_TreeEnsembleClassifier) {
        f->classifier = 1;
        const struct kiln_attr *ls = kiln_node_attr(node, "classlabels_strings");
        int ni = kiln_attr_ints(node, "classlabels_int64s", &f->labels_i);
        if (ls && ls->type == KILN_ATTR_STRINGS && ls->n > 0) {
            f->labels_s = ls->strings;
            f->n_labels = ls->n;
            f->labels_i = NULL;
        } else if (ni > 0) {
            f->n_labels = ni;
        } else {
            st = kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                 "one of classlabels_int64s and classlabels_strings is required");
            goto fail;
        }
        f->n_targets = f->n_labels;
    } else {
        f->n_targets = kiln_attr_int(node, "n_targets", 1);
        if (f->n_targets < 1 || f->n_targets > (1 << 24)) {
            st = kiln_node_error(node, KILN_ERR_INVALID_MODEL, "n_targets is %lld",
                                 (long long)f->n_targets);
            goto fail;
        }
        const struct kiln_attr *ag = kiln_node_attr(node, "aggregate_function");
        if (ag && ag->type == KILN_ATTR_INT) {
            f->aggregate = (int)ag->i;
            if (ag->i < 0 || ag->i > KILN_AGG_MAX) f->aggregate = -1;
        } else if (ag) {
            const char *s = kiln_attr_str(node, "aggregate_function", "SUM");
            f->aggregate = strcmp(s, "AVERAGE") == 0 ? KILN_AGG_AVERAGE
                           : strcmp(s, "SUM") == 0   ? KILN_AGG_SUM
                           : strcmp(s, "MIN") == 0   ? KILN_AGG_MIN
                           : strcmp(s, "MAX") == 0   ? KILN_AGG_MAX
                                                     : -1;
        }
        if (f->aggregate < 0) {
            st = kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                 "aggregate_function must be AVERAGE, SUM, MIN or MAX");
            goto fail;
        }
    }
    st = node->op == KILN_OP_TreeEnsemble ? build_v5(node, f) : build_v1(node, f);
    if (st != KILN_OK) goto fail;
    if (node->op != KILN_OP_TreeEnsemble) {
        int nb;
        if ((st = read_numbers(node, "base_values", &f->base, &nb)) != KILN_OK) goto fail;
        if (nb == 1 && f->n_targets > 1) {
            /* one base value for every column, as numpy broadcasts it */
            double *b = realloc(f->base, sizeof(double) * (size_t)f->n_targets);
            if (!b) {
                st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
                goto fail;
            }
            for (int64_t i = 1; i < f->n_targets; i++) b[i] = b[0];
            f->base = b;
        } else if (nb >= 0 && nb != f->n_targets) {
            if (nb == 0) {
                free(f->base);
                f->base = NULL;
            } else {
                st = kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                     "base_values has %d values, expected %lld", nb,
                                     (long long)f->n_targets);
                goto fail;
            }
        }
    }
    if ((st = check_shape(node, f)) != KILN_OK) goto fail;
    *out = f;
    return KILN_OK;
fail:
    kiln_forest_free(f);
    return st;
}

int64_t kiln_forest_score_cols(const struct kiln_forest *f)
{
    return f->classifier && f->binary && f->n_targets == 1 ? 2 : f->n_targets;
}

void kiln_forest_scores_init(const struct kiln_forest *f, double *scores, kiln_dtype out_dt)
{
    double big = out_dt == KILN_DTYPE_F64 ? DBL_MAX : FLT_MAX;
    double v = f->aggregate == KILN_AGG_MIN ? big : f->aggregate == KILN_AGG_MAX ? -big : 0.0;
    for (int64_t i = 0; i < f->n_targets; i++) scores[i] = v;
}

int64_t kiln_forest_finish_row(const struct kiln_forest *f, double *row)
{
    int64_t nt = f->n_targets, cols = kiln_forest_score_cols(f);
    if (f->aggregate == KILN_AGG_AVERAGE && f->n_trees > 0)
        for (int64_t i = 0; i < nt; i++) row[i] /= f->n_trees;
    if (f->base)
        for (int64_t i = 0; i < nt; i++) row[i] += f->base[i];
    if (f->classifier && f->binary) {
        row[1] = row[0];
        row[0] = f->post == KILN_POST_NONE || f->post == KILN_POST_PROBIT ? 1 - row[1] : -row[1];
    }
    kiln_ml_post_transform(f->post, row, cols);
    int64_t best = 0;
    for (int64_t i = 1; i < cols; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

kiln_status kiln_forest_store_row(const struct kiln_forest *f, kiln_tensor *const *out, int64_t r,
                                  const double *row, int64_t best)
{
    int64_t cols = kiln_forest_score_cols(f);
    kiln_tensor *scores = f->classifier ? out[1] : out[0];
    if (scores)
        for (int64_t i = 0; i < cols; i++) kiln_set_f64(scores->dtype, scores->data, r * cols + i, row[i]);
    if (!f->classifier || !out[0]) return KILN_OK;
    if (f->labels_s) {
        kiln_string s = f->labels_s[best < f->n_labels ? best : f->n_labels - 1];
        return kiln_tensor_set_string(out[0], (size_t)r, s.data ? s.data : "", s.len);
    }
    int64_t label;
    if (f->n_labels == 1) label = best == 1 && f->labels_i[0] == 1 ? 1 : 0;
    else label = f->labels_i[best];
    ((int64_t *)out[0]->data)[r] = label;
    return KILN_OK;
}

/* ---- the reference kernels ---- */

static kiln_status tree_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_type *x = ctx->in[0];
    int64_t cols = -1;
    kiln_dtype label_dt = KILN_DTYPE_I64;
    if (n->op == KILN_OP_TreeEnsembleClassifier) {
        const struct kiln_attr *ls = kiln_node_attr(n, "classlabels_strings");
        const int64_t *li;
        int ni = kiln_attr_ints(n, "classlabels_int64s", &li);
        int nl = ls && ls->type == KILN_ATTR_STRINGS && ls->n > 0 ? ls->n : ni;
        if (ls && ls->type == KILN_ATTR_STRINGS && ls->n > 0) label_dt = KILN_DTYPE_STRING;
        if (nl <= 0)
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                                   "one of classlabels_int64s and classlabels_strings is required");
        /* the two-column rule needs the votes: only a one-label model may widen */
        if (nl >= 2) cols = nl;
        else {
            const int64_t *ids;
            int nv = kiln_attr_ints(n, "class_ids", &ids);
            int binary = nv > 0;
            for (int v = 1; v < nv; v++) binary &= ids[v] == ids[0];
            cols = binary ? 2 : 1;
        }
    } else {
        cols = kiln_attr_int(n, "n_targets", 1);
        if (cols < 1) return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "n_targets is %lld",
                                             (long long)cols);
    }
    kiln_dtype out_dt = KILN_DTYPE_F32;
    if (n->op == KILN_OP_TreeEnsemble && x && x->dtype != KILN_DTYPE_UNDEFINED) out_dt = x->dtype;
    int64_t rows = -1;
    if (x && x->rank >= 0) {
        if (x->rank > 2)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "X must be [N, F] or [F], got rank %d",
                                   x->rank);
        rows = x->rank == 2 ? x->dims[0] : 1;
    }
    int64_t d2[2] = {rows, cols};
    struct kiln_type *score = n->op == KILN_OP_TreeEnsembleClassifier ? ctx->out[1] : ctx->out[0];
    if (score) kiln_type_set(score, out_dt, 2, d2);
    if (n->op == KILN_OP_TreeEnsembleClassifier && ctx->out[0])
        kiln_type_set(ctx->out[0], label_dt, 1, d2);
    /* the batch dim keeps its symbolic name */
    const char *sym = x && x->rank == 2 ? x->sym[0] : NULL;
    if (score) score->sym[0] = sym;
    if (n->op == KILN_OP_TreeEnsembleClassifier && ctx->out[0]) ctx->out[0]->sym[0] = sym;
    return KILN_OK;
}

static kiln_status tree_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    if (!kiln_dtype_is_float(x->dtype) && !kiln_dtype_is_int(x->dtype))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT, "X has dtype %s",
                               kiln_dtype_name(x->dtype));
    struct kiln_forest *f;
    kiln_status st = kiln_forest_build(ctx->node, &f);
    if (st != KILN_OK) return st;
    int64_t rows = x->rank == 2 ? x->dims[0] : 1, nf = x->rank == 0 ? 1 : x->dims[x->rank - 1];
    int64_t cols = kiln_forest_score_cols(f);
    double *row = NULL;
    if (f->n_features > nf) {
        st = kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                             "the trees read feature %lld but X has %lld columns",
                             (long long)f->n_features - 1, (long long)nf);
        goto out;
    }
    row = malloc(sizeof(double) * (size_t)(cols + f->n_targets + 1));
    if (!row) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    kiln_tensor *score = ctx->out[f->classifier ? 1 : 0];
    kiln_dtype out_dt = score ? score->dtype : KILN_DTYPE_F32;
    for (int64_t r = 0; r < rows && st == KILN_OK; r++) {
        kiln_forest_scores_init(f, row, out_dt);
        for (int t = 0; t < f->n_trees; t++) {
            int32_t c = f->roots[t];
            while (c >= 0) {
                const struct kiln_tree_node *nd = &f->nodes[c];
                double v = kiln_get_f64(x->dtype, x->data, r * nf + nd->feature);
                c = nd->child[kiln_tree_goes_true(f, nd, v) ? 0 : 1];
            }
            kiln_forest_vote(f, ~c, row);
        }
        int64_t best = kiln_forest_finish_row(f, row);
        st = kiln_forest_store_row(f, ctx->out, r, row, best);
    }
out:
    free(row);
    kiln_forest_free(f);
    return st;
}

KILN_REF_OP(TreeEnsembleClassifier, tree_infer, tree_run);
KILN_REF_OP(TreeEnsembleRegressor, tree_infer, tree_run);
KILN_REF_OP(TreeEnsemble, tree_infer, tree_run);
