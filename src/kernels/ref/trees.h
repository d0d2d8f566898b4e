/*
 * trees.h - a decision forest read from an ai.onnx.ml tree node, shared by
 * the reference kernels (trees.c) and the fast tree kernel (trees_fast.c).
 *
 * TreeEnsembleClassifier, TreeEnsembleRegressor (node ids per tree, a mode
 * per node, votes addressed by tree and node id) and TreeEnsemble of opset 5
 * (interior nodes and leaves in separate arrays) are all read into one form:
 * interior nodes with two children each, a child being another interior node
 * (>= 0) or a leaf (~leaf index, < 0), and per leaf a run of (target, weight)
 * votes. Building checks every index, rejects cycles and bounds the depth, so
 * walking a built forest cannot leave its arrays or loop.
 */
#ifndef KILN_KERNELS_REF_TREES_H
#define KILN_KERNELS_REF_TREES_H

#include "kernels/kernel.h"

#define KILN_TREE_MAX_DEPTH 4096 /* longest root-to-leaf path accepted */

enum kiln_tree_mode {
    KILN_TREE_LEQ = 0, KILN_TREE_LT, KILN_TREE_GTE, KILN_TREE_GT, KILN_TREE_EQ, KILN_TREE_NEQ,
    KILN_TREE_MEMBER,
};
enum kiln_tree_agg { KILN_AGG_AVERAGE = 0, KILN_AGG_SUM, KILN_AGG_MIN, KILN_AGG_MAX };
enum kiln_tree_post {
    KILN_POST_NONE = 0, KILN_POST_SOFTMAX, KILN_POST_LOGISTIC, KILN_POST_SOFTMAX_ZERO,
    KILN_POST_PROBIT,
};

struct kiln_tree_node {
    double split;         /* threshold (not used by MEMBER) */
    int64_t feature;      /* column of X */
    int32_t child[2];     /* [0] taken when the test holds, [1] otherwise; ~leaf if < 0 */
    uint8_t mode;         /* enum kiln_tree_mode */
    uint8_t missing_true; /* NaN takes child[0] */
    int32_t set_start;    /* MEMBER: the set is members[set_start .. +set_len) */
    int32_t set_len;
};

struct kiln_forest {
    int n_trees;
    int32_t *roots;            /* per tree: a node, or ~leaf for a one-leaf tree */
    int n_nodes;
    struct kiln_tree_node *nodes;
    int n_leaves;
    int32_t *leaf_first;       /* n_leaves + 1: leaf i votes vote_*[leaf_first[i] .. [i + 1]) */
    int32_t *vote_target;
    double *vote_weight;
    double *members;           /* MEMBER sets */
    int64_t n_targets;         /* score columns before the binary rule */
    int aggregate;             /* enum kiln_tree_agg */
    int post;                  /* enum kiln_tree_post */
    double *base;              /* n_targets values added after aggregation, or NULL */
    int64_t n_features;        /* largest feature id + 1 */
    int max_depth;             /* interior nodes on the longest path */
    /* TreeEnsembleClassifier only */
    int classifier;
    int binary;                /* every vote is for one class: ONNX's two-column rule */
    int n_labels;
    const int64_t *labels_i;   /* classlabels_int64s (graph-owned) or NULL */
    const kiln_string *labels_s;
};

/* Read the forest of a TreeEnsembleClassifier, TreeEnsembleRegressor or
 * TreeEnsemble node; errors name the node and the bad attribute value. */
kiln_status kiln_forest_build(const struct kiln_node *n, struct kiln_forest **out);
void kiln_forest_free(struct kiln_forest *f);

/* Columns of the score output (the classifier's binary rule may add one). */
int64_t kiln_forest_score_cols(const struct kiln_forest *f);

/* Whether a node's test sends value x to child[0]. */
static inline int kiln_tree_goes_true(const struct kiln_forest *f,
                                      const struct kiln_tree_node *nd, double x)
{
    if (x != x) {
        if (nd->missing_true) return 1;
        return nd->mode == KILN_TREE_NEQ; /* NaN != t holds, every other test fails */
    }
    switch (nd->mode) {
    case KILN_TREE_LEQ: return x <= nd->split;
    case KILN_TREE_LT: return x < nd->split;
    case KILN_TREE_GTE: return x >= nd->split;
    case KILN_TREE_GT: return x > nd->split;
    case KILN_TREE_EQ: return x == nd->split;
    case KILN_TREE_NEQ: return x != nd->split;
    default:
        for (int32_t k = 0; k < nd->set_len; k++)
            if (f->members[nd->set_start + k] == x) return 1;
        return 0;
    }
}

/* Start a row's scores (0, or the extreme for MIN / MAX). */
void kiln_forest_scores_init(const struct kiln_forest *f, double *scores, kiln_dtype out_dt);
/* Add leaf `leaf`'s votes into scores. */
static inline void kiln_forest_vote(const struct kiln_forest *f, int32_t leaf, double *scores)
{
    for (int32_t v = f->leaf_first[leaf]; v < f->leaf_first[leaf + 1]; v++) {
        double w = f->vote_weight[v], *s = &scores[f->vote_target[v]];
        if (f->aggregate == KILN_AGG_MIN) *s = w < *s ? w : *s;
        else if (f->aggregate == KILN_AGG_MAX) *s = w > *s ? w : *s;
        else *s += w;
    }
}
/* After every tree voted: average, base values, binary rule, post transform.
 * row has room for kiln_forest_score_cols columns; returns the argmax column. */
int64_t kiln_forest_finish_row(const struct kiln_forest *f, double *row);

/* Write the outputs of row r from its finished scores (classifier: label in
 * out[0], scores in out[1]; regressors: out[0]). */
kiln_status kiln_forest_store_row(const struct kiln_forest *f, kiln_tensor *const *out, int64_t r,
                                  const double *row, int64_t best);

/* The post transforms of ai.onnx.ml, on one row of n scores. */
void kiln_ml_post_transform(int post, double *s, int64_t n);
/* post_transform as a string attribute (old ops) or an int (opset 5). */
kiln_status kiln_ml_post_attr(const struct kiln_node *n, int *out);

#endif
