/*
 * trees_levels.h - a forest padded into complete trees, laid out level by
 * level, for the AVX-512 tree kernel (trees_avx512.c, called by
 * trees_fast.c).
 *
 * Tree t of depth D (interior nodes on its longest path) is stored as the
 * complete binary tree of depth D: level L (0 .. D-1) holds 2^L nodes at
 * thr/feat[node_off[t] + 2^L - 1 ..], node i of a level having children 2i
 * (the test holds: x <= thr) and 2i + 1 (it fails) on the next level. A
 * leaf above level D is padded with nodes that always go to 2i (threshold
 * +inf, NaN sent to child 0), so its votes sit in the leftmost slot below
 * it. After D steps a row's index i (0 .. 2^D - 1) addresses the leaf
 * tables: for the tree's k-th target tgt[tgt_first[t] + k], the weight is
 * leaf[leaf_off[t] + k * 2^D + i] (0 where the leaf does not vote for it).
 * feat holds the feature in its low 31 bits and bit 31 when NaN goes to
 * child 0. thr and feat have 64 readable entries past the last tree's
 * nodes, so a level's 16- or 64-wide loads never leave the arrays.
 *
 * For walking one row through many trees at once (one tree per lane),
 * lane_node[t] is node_off[t] as int32 and lane_depth[t] the depth, both
 * padded with zeros (depth 0: no step) to n_lanes, a multiple of
 * KILN_TREE_LEVELS_TREES trees, so that a block's loads stay inside. The
 * nodes of the first KILN_TREE_LEVELS_TOP levels are also kept tree by tree
 * side by side: top_thr/top_feat[p * n_lanes + t] is node p (0 .. 2^TOP - 2,
 * level order) of tree t (thr +inf and feat 0 where the tree has no such
 * node; such lanes are masked off), so that 16 trees' nodes there are plain
 * loads rather than gathers.
 */
#ifndef KILN_KERNELS_TREES_LEVELS_H
#define KILN_KERNELS_TREES_LEVELS_H

#include <stdint.h>

#define KILN_TREE_LEVELS_MAX_DEPTH 16 /* deepest tree the padded layout takes */
#define KILN_TREE_LEVELS_ROWS 64      /* rows one call walks (4 groups of 16) */
#define KILN_TREE_LEVELS_TREES 64     /* trees one block of the one-row walk takes (4 x 16) */
#define KILN_TREE_LEVELS_TOP 3        /* levels of the one-row walk read without gathers */

struct kiln_tree_levels {
    int n_trees;
    uint8_t *depth;       /* per tree */
    int64_t *node_off;    /* per tree, into thr / feat */
    int64_t *leaf_off;    /* per tree, into leaf */
    int32_t *tgt_first;   /* n_trees + 1, into tgt */
    int32_t *tgt;
    float *thr;
    uint32_t *feat;
    double *leaf;
    int64_t n_lanes;      /* n_trees rounded up to KILN_TREE_LEVELS_TREES */
    int32_t *lane_node;   /* n_lanes */
    int32_t *lane_depth;
    float *top_thr;       /* (2^KILN_TREE_LEVELS_TOP - 1) * n_lanes */
    uint32_t *top_feat;
};

/* Add every tree's votes for rows x[0 .. rows) (rows <= 64, row r at x + r *
 * nf) into acc[target * 64 + r], tree by tree in order (as the reference
 * sums them). Needs AVX-512F/DQ (kiln_cpu_isa() == KILN_ISA_AVX512). */
void kiln_tree_levels_avx512(const struct kiln_tree_levels *lv, const float *x, int64_t nf, int rows,
                             double *acc);

/* Add every tree's votes for the one row x[0 .. nf) into acc[target],
 * tree by tree in order (the same sums in the same order as the reference),
 * walking 16 trees at once, one per lane, four groups of 16 in lockstep.
 * Needs AVX-512F/DQ. */
void kiln_tree_levels_row_avx512(const struct kiln_tree_levels *lv, const float *x, int64_t nf, double *acc);

#endif
