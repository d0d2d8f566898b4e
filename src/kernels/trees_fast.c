/*
 * trees_fast.c - the fast kernel of TreeEnsembleClassifier,
 * TreeEnsembleRegressor and TreeEnsemble: the forest compiled once per plan
 * into a layout made for walking many rows, rows split across threads.
 *
 * Compile reads the forest (kiln_forest_build, as the reference kernel does
 * on every run) and flattens it into 16-byte nodes, each tree's nodes
 * contiguous in depth-first order so that a path stays within few cache
 * lines. Every test becomes one form, `x <= threshold` with a float
 * threshold, children swapped for >= and >:
 *
 *     x <= t  ->  x <= largest float <= t      x >= t  ->  !(x <= largest float < t)
 *     x <  t  ->  x <= largest float <  t      x >  t  ->  !(x <= largest float <= t)
 *
 * which for every float x gives the same answer as comparing in double
 * against the (double) split, and NaN takes its own child (the true child
 * when missing_value_tracks_true says so, else the false one). Rows are
 * evaluated in blocks of 32: each tree is walked for every row of the
 * block before the next tree, so a tree's nodes are read from cache 32
 * times, eight rows at a time in lockstep so that their loads overlap.
 * Scores are accumulated in double as in the reference, then the
 * reference's finishing steps (average, base values, binary rule, post
 * transform, labels) run per row.
 *
 * Handled: float32 X of rank 2 (or 1), modes BRANCH_LEQ / LT / GTE / GT
 * (what converters and XGBoost emit), at most 4096 score columns. Anything
 * else (EQ / NEQ / MEMBER splits, other dtypes) returns run NULL and the
 * reference kernel runs the node. Declared in the tree family's list
 * (trees.def, family.h); tested against the reference there and in
 * tests/c/unit_trees.c.
 */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "kernels/family.h"
#include "kernels/ref/trees.h"
#include "kernels/trees_levels.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/trees.def"
#undef KILN_KERNEL

#define TREE_BLOCK 32       /* rows walked together */
#define TREE_MAX_COLS 4096  /* score columns the stack buffers allow */
#define TREE_LANES 8        /* rows of a block that descend a tree in lockstep */
#define TREE_LEVELS_MIN 16  /* fewer rows per thread: one row at a time, 16 trees at once */

struct fnode {
    float thr;           /* go to child[0] when x <= thr */
    uint32_t feat;       /* feature; bit 31: NaN goes to child[0] */
    int32_t child[2];    /* >= 0: node index (absolute); < 0: ~leaf */
};

struct tree_state {
    struct kiln_forest *f;   /* votes, base values, post transform, labels */
    struct fnode *nodes;
    int32_t *roots;          /* node index, or ~leaf for a one-leaf tree */
    int64_t cols;            /* score columns */
    struct kiln_tree_levels *lv; /* the padded level-order form (AVX-512), or NULL */
};

/* Largest float <= t, and largest float < t (t not NaN). */
static float float_down(double t)
{
    float f = (float)t;
    if ((double)f > t) f = nextafterf(f, -INFINITY);
    return f;
}

static float float_below(double t)
{
    float f = float_down(t);
    if ((double)f == t) f = nextafterf(f, -INFINITY);
    return f;
}

static void levels_free(struct kiln_tree_levels *lv);

static void tree_state_free(void *p)
{
    struct tree_state *s = p;
    if (!s) return;
    kiln_forest_free(s->f);
    levels_free(s->lv);
    free(s->nodes);
    free(s->roots);
    free(s);
}

/* Node nd as one test `x <= thr` on feature *feat (bit 31: NaN goes to
 * ch[0]), ch[0] taken when it holds. */
static void node_test(const struct kiln_tree_node *nd, float *thr, uint32_t *feat, int32_t ch[2])
{
    double t = nd->split;
    int swap = 0;
    if (t != t) {
        *thr = NAN; /* every test fails: the false child */
    } else if (nd->mode == KILN_TREE_LEQ) {
        *thr = float_down(t);
    } else if (nd->mode == KILN_TREE_LT) {
        *thr = t == -INFINITY ? NAN : float_below(t);
    } else if (nd->mode == KILN_TREE_GTE) {
        if (t == -INFINITY) {
            *thr = INFINITY; /* x >= -inf holds for every x but NaN */
        } else {
            *thr = float_below(t); /* x >= t  <=>  !(x < t) */
            swap = 1;
        }
    } else {
        *thr = float_down(t); /* x > t  <=>  !(x <= t) */
        swap = 1;
    }
    ch[0] = nd->child[swap];
    ch[1] = nd->child[!swap];
    /* NaN: `x <= thr` fails, so without the flag it takes ch[1]; the flag sends it to
     * the true child, wherever that landed */
    int nan_to_0 = nd->missing_true ? !swap : swap;
    *feat = (uint32_t)nd->feature | (nan_to_0 ? 0x80000000u : 0);
}

/* Lay out the subtree under forest node `c` depth first from nodes[*at]. */
static int32_t layout(const struct kiln_forest *f, struct fnode *out, int32_t *map, int32_t c,
                      int32_t *at, int32_t *stack)
{
    /* iterative: stack holds forest nodes whose slots are assigned, children pending */
    if (c < 0) return c;
    int sp = 0;
    int32_t root = *at;
    map[c] = (*at)++;
    stack[sp++] = c;
    while (sp > 0) {
        int32_t n = stack[--sp];
        struct fnode *o = &out[map[n]];
        int32_t ch[2];
        node_test(&f->nodes[n], &o->thr, &o->feat, ch);
        for (int k = 1; k >= 0; k--) {
            if (ch[k] < 0) {
                o->child[k] = ch[k];
            } else {
                if (map[ch[k]] < 0) {
                    map[ch[k]] = (*at)++;
                    stack[sp++] = ch[k];
                }
                o->child[k] = map[ch[k]];
            }
        }
    }
    return root;
}

/* ---- the padded level-order form (trees_levels.h) ---- */

static void levels_free(struct kiln_tree_levels *lv)
{
    if (!lv) return;
    free(lv->depth);
    free(lv->node_off);
    free(lv->leaf_off);
    free(lv->tgt_first);
    free(lv->tgt);
    free(lv->thr);
    free(lv->feat);
    free(lv->leaf);
    free(lv->lane_node);
    free(lv->lane_depth);
    free(lv->top_thr);
    free(lv->top_feat);
    free(lv);
}

/* Depth of the subtree under c (a leaf: 0), or KILN_TREE_LEVELS_MAX_DEPTH + 1
 * once it is deeper than the layout takes. */
static int sub_depth(const struct kiln_forest *f, int32_t c, int level)
{
    if (c < 0) return 0;
    if (level >= KILN_TREE_LEVELS_MAX_DEPTH) return KILN_TREE_LEVELS_MAX_DEPTH + 1;
    int a = sub_depth(f, f->nodes[c].child[0], level + 1);
    if (a > KILN_TREE_LEVELS_MAX_DEPTH) return a;
    int b = sub_depth(f, f->nodes[c].child[1], level + 1);
    return 1 + (a > b ? a : b);
}

/* Collect the targets the leaves under c vote for into tgt (seen[target] ==
 * stamp marks them); 0 when a leaf votes twice for one target (its two votes
 * could not be one table entry without changing the sums' rounding). */
static int sub_targets(const struct kiln_forest *f, int32_t c, int32_t *seen, int32_t *leaf_seen,
                       int32_t stamp, int32_t *leaf_stamp, int32_t *tgt, int32_t *n)
{
    if (c >= 0)
        return sub_targets(f, f->nodes[c].child[0], seen, leaf_seen, stamp, leaf_stamp, tgt, n) &&
               sub_targets(f, f->nodes[c].child[1], seen, leaf_seen, stamp, leaf_stamp, tgt, n);
    int32_t l = ~c;
    ++*leaf_stamp;
    for (int32_t v = f->leaf_first[l]; v < f->leaf_first[l + 1]; v++) {
        int32_t k = f->vote_target[v];
        if (leaf_seen[k] == *leaf_stamp) return 0;
        leaf_seen[k] = *leaf_stamp;
        if (seen[k] != stamp) {
            seen[k] = stamp;
            tgt[(*n)++] = k;
        }
    }
    return 1;
}

/* Write the subtree under c, at position i of level `level`, into tree t. */
static void sub_fill(const struct kiln_forest *f, struct kiln_tree_levels *lv, int t, int32_t c,
                     int level, int64_t i, const int32_t *slot)
{
    int depth = lv->depth[t];
    float *thr = lv->thr + lv->node_off[t];
    uint32_t *feat = lv->feat + lv->node_off[t];
    if (c >= 0) {
        int32_t ch[2];
        int64_t at = ((int64_t)1 << level) - 1 + i;
        node_test(&f->nodes[c], &thr[at], &feat[at], ch);
        sub_fill(f, lv, t, ch[0], level + 1, 2 * i, slot);
        sub_fill(f, lv, t, ch[1], level + 1, 2 * i + 1, slot);
        return;
    }
    /* a leaf above the last level: nodes that always go to child 0 down to it */
    for (int k = level; k < depth; k++) {
        int64_t at = ((int64_t)1 << k) - 1 + (i << (k - level));
        thr[at] = INFINITY;
        feat[at] = 0x80000000u;
    }
    int64_t width = (int64_t)1 << depth, pos = i << (depth - level);
    int32_t l = ~c;
    for (int32_t v = f->leaf_first[l]; v < f->leaf_first[l + 1]; v++)
        lv->leaf[lv->leaf_off[t] + slot[f->vote_target[v]] * width + pos] = f->vote_weight[v];
}

/* The padded form of f, or NULL (*st KILN_OK) when it does not fit: a tree
 * deeper than KILN_TREE_LEVELS_MAX_DEPTH, padding that would multiply the
 * forest's size by more than 64 (sparse deep trees walk faster as they are),
 * a leaf voting twice for one target, or MIN / MAX aggregation. */
static struct kiln_tree_levels *levels_build(const struct kiln_forest *f, int64_t nf, kiln_status *st)
{
    *st = KILN_OK;
    if ((f->aggregate != KILN_AGG_SUM && f->aggregate != KILN_AGG_AVERAGE) ||
        nf * KILN_TREE_LEVELS_ROWS >= INT32_MAX || f->n_targets > INT32_MAX)
        return NULL;
    struct kiln_tree_levels *lv = calloc(1, sizeof *lv);
    int32_t *seen = malloc(sizeof(int32_t) * ((size_t)f->n_targets + 1));
    int32_t *leaf_seen = malloc(sizeof(int32_t) * ((size_t)f->n_targets + 1));
    int32_t *slot = malloc(sizeof(int32_t) * ((size_t)f->n_targets + 1));
    int nt = f->n_trees;
    if (lv) {
        lv->n_trees = nt;
        lv->depth = malloc((size_t)nt + 1);
        lv->node_off = malloc(sizeof(int64_t) * ((size_t)nt + 1));
        lv->leaf_off = malloc(sizeof(int64_t) * ((size_t)nt + 1));
        lv->tgt_first = malloc(sizeof(int32_t) * ((size_t)nt + 1));
    }
    if (!lv || !seen || !leaf_seen || !slot || !lv->depth || !lv->node_off || !lv->leaf_off ||
        !lv->tgt_first)
        goto oom;
    for (int64_t k = 0; k < f->n_targets; k++) seen[k] = leaf_seen[k] = -1;
    /* pass 1: depths, targets per tree, sizes */
    int64_t nodes = 0, leaves = 0, n_tgt = 0;
    int64_t budget = 64 * ((int64_t)f->n_nodes + f->n_leaves + 16);
    int32_t leaf_stamp = -1;
    int32_t *tgt_tmp = malloc(sizeof(int32_t) * ((size_t)f->n_targets + 1));
    if (!tgt_tmp) goto oom;
    for (int t = 0; t < nt; t++) {
        int d = sub_depth(f, f->roots[t], 0);
        int32_t n = 0;
        if (d > KILN_TREE_LEVELS_MAX_DEPTH ||
            !sub_targets(f, f->roots[t], seen, leaf_seen, t, &leaf_stamp, tgt_tmp, &n)) {
            free(tgt_tmp);
            goto decline;
        }
        lv->depth[t] = (uint8_t)d;
        lv->node_off[t] = nodes;
        lv->leaf_off[t] = leaves;
        lv->tgt_first[t] = (int32_t)n_tgt;
        nodes += ((int64_t)1 << d) - 1;
        leaves += (int64_t)n << d;
        n_tgt += n;
        if (nodes + leaves > budget || nodes + leaves > ((int64_t)1 << 25) || n_tgt > INT32_MAX) {
            free(tgt_tmp);
            goto decline;
        }
    }
    lv->tgt_first[nt] = (int32_t)n_tgt;
    lv->tgt = malloc(sizeof(int32_t) * ((size_t)n_tgt + 1));
    lv->thr = malloc(sizeof(float) * ((size_t)nodes + 64));
    lv->feat = calloc((size_t)nodes + 64, sizeof(uint32_t));
    lv->leaf = calloc((size_t)leaves + 1, sizeof(double));
    size_t lanes = ((size_t)nt + KILN_TREE_LEVELS_TREES - 1) / KILN_TREE_LEVELS_TREES * KILN_TREE_LEVELS_TREES;
    size_t top = ((size_t)1 << KILN_TREE_LEVELS_TOP) - 1;
    lv->n_lanes = (int64_t)lanes;
    lv->lane_node = calloc(lanes + 1, sizeof(int32_t));
    lv->lane_depth = calloc(lanes + 1, sizeof(int32_t));
    lv->top_thr = malloc(sizeof(float) * (top * lanes + 1));
    lv->top_feat = calloc(top * lanes + 1, sizeof(uint32_t));
    if (!lv->tgt || !lv->thr || !lv->feat || !lv->leaf || !lv->lane_node || !lv->lane_depth ||
        !lv->top_thr || !lv->top_feat) {
        free(tgt_tmp);
        goto oom;
    }
    for (int64_t i = 0; i < nodes + 64; i++) lv->thr[i] = INFINITY;
    for (size_t i = 0; i < top * lanes + 1; i++) lv->top_thr[i] = INFINITY;
    /* pass 2: the targets (again, in the same order) and the levels */
    for (int64_t k = 0; k < f->n_targets; k++) seen[k] = -1;
    for (int t = 0; t < nt; t++) {
        int32_t n = 0;
        sub_targets(f, f->roots[t], seen, leaf_seen, t, &leaf_stamp, lv->tgt + lv->tgt_first[t], &n);
        for (int32_t k = 0; k < n; k++) slot[lv->tgt[lv->tgt_first[t] + k]] = k;
        sub_fill(f, lv, t, f->roots[t], 0, 0, slot);
        lv->lane_node[t] = (int32_t)lv->node_off[t]; /* nodes < 2^25 (the budget above) */
        lv->lane_depth[t] = lv->depth[t];
        for (int64_t p = 0; p < ((int64_t)1 << lv->depth[t]) - 1 && p < (int64_t)top; p++) {
            lv->top_thr[p * lv->n_lanes + t] = lv->thr[lv->node_off[t] + p];
            lv->top_feat[p * lv->n_lanes + t] = lv->feat[lv->node_off[t] + p];
        }
    }
    free(tgt_tmp);
    free(seen);
    free(leaf_seen);
    free(slot);
    return lv;
oom:
    *st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
decline:
    levels_free(lv);
    free(seen);
    free(leaf_seen);
    free(slot);
    return NULL;
}

static kiln_status tree_run_fast(void *state, struct kiln_run_ctx *ctx);

kiln_status kiln_k_tree_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_type *x = cc->in[0];
    if (!x || x->dtype != KILN_DTYPE_F32 || x->rank < 1 || x->rank > 2) return KILN_OK;
    struct kiln_forest *f;
    kiln_status st = kiln_forest_build(cc->node, &f);
    if (st != KILN_OK) {
        /* the reference kernel reports it at run time, with the same message */
        kiln_error_clear();
        return KILN_OK;
    }
    int64_t nf = x->dims[x->rank - 1];
    int64_t cols = kiln_forest_score_cols(f);
    int ok = f->n_features <= nf && cols <= TREE_MAX_COLS && f->n_targets <= TREE_MAX_COLS;
    for (int i = 0; i < f->n_nodes && ok; i++) ok = f->nodes[i].mode <= KILN_TREE_GT;
    const struct kiln_type *score = f->classifier ? (cc->n_out > 1 ? cc->out[1] : NULL) : cc->out[0];
    if (score && score->dtype != KILN_DTYPE_F32) ok = 0;
    if (!ok) {
        kiln_forest_free(f);
        return KILN_OK;
    }
    struct tree_state *s = calloc(1, sizeof *s);
    int32_t *map = malloc(sizeof(int32_t) * ((size_t)f->n_nodes + 1));
    int32_t *stack = malloc(sizeof(int32_t) * ((size_t)f->n_nodes + 1));
    if (s) {
        s->f = f;
        s->cols = cols;
        s->nodes = malloc(sizeof(struct fnode) * ((size_t)f->n_nodes + 1));
        s->roots = malloc(sizeof(int32_t) * ((size_t)f->n_trees + 1));
    } else {
        kiln_forest_free(f);
    }
    if (!s || !s->nodes || !s->roots || !map || !stack) {
        tree_state_free(s);
        free(map);
        free(stack);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < f->n_nodes; i++) map[i] = -1;
    int32_t at = 0;
    for (int t = 0; t < f->n_trees; t++) {
        int32_t r = f->roots[t];
        /* a node shared by two trees (allowed in opset 5) is laid out once */
        s->roots[t] = r < 0 ? r : map[r] >= 0 ? map[r] : layout(f, s->nodes, map, r, &at, stack);
    }
    free(map);
    free(stack);
    if (kiln_cpu_isa() == KILN_ISA_AVX512) {
        s->lv = levels_build(f, nf, &st);
        if (st != KILN_OK) {
            tree_state_free(s);
            return st;
        }
    }
    inst->name = s->lv ? "tree_levels_avx512" : "tree_blocked";
    inst->state = s;
    inst->run = tree_run_fast;
    inst->destroy = tree_state_free;
    return KILN_OK;
}

struct tree_job {
    const struct tree_state *s;
    const float *x;
    int64_t nf;
    kiln_tensor *const *out;
    kiln_dtype out_dt;
    _Atomic int failed;
};

/* One step down from node n for row x. */
static inline int32_t tree_step(const struct fnode *n, const float *x)
{
    float v = x[n->feat & 0x7fffffffu];
    int k = !(v <= n->thr);
    if (v != v) k = !(n->feat >> 31);
    return n->child[k];
}

/* Rows [begin, end) on the padded level-order form, 64 at a time; 0 if the
 * accumulators could not be allocated (the caller walks them as usual). */
static int tree_rows_levels(struct tree_job *j, int64_t begin, int64_t end)
{
    const struct tree_state *s = j->s;
    const struct kiln_forest *f = s->f;
    int64_t nt = f->n_targets;
    double *acc = malloc(sizeof(double) * (size_t)(nt > 0 ? nt : 1) * KILN_TREE_LEVELS_ROWS);
    if (!acc) return 0;
    double row[TREE_MAX_COLS + 2];
    for (int64_t r0 = begin; r0 < end; r0 += KILN_TREE_LEVELS_ROWS) {
        int nb = (int)(end - r0 < KILN_TREE_LEVELS_ROWS ? end - r0 : KILN_TREE_LEVELS_ROWS);
        memset(acc, 0, sizeof(double) * (size_t)nt * KILN_TREE_LEVELS_ROWS);
        kiln_tree_levels_avx512(s->lv, j->x + r0 * j->nf, j->nf, nb, acc);
        for (int b = 0; b < nb; b++) {
            for (int64_t k = 0; k < nt; k++) row[k] = acc[k * KILN_TREE_LEVELS_ROWS + b];
            int64_t best = kiln_forest_finish_row(f, row);
            if (kiln_forest_store_row(f, j->out, r0 + b, row, best) != KILN_OK) j->failed = 1;
        }
    }
    free(acc);
    return 1;
}

/* Rows [begin, end) one by one, each walking 16 trees at a time on the
 * padded level-order form. */
static void tree_rows_one(struct tree_job *j, int64_t begin, int64_t end)
{
    const struct tree_state *s = j->s;
    const struct kiln_forest *f = s->f;
    double row[TREE_MAX_COLS + 2];
    for (int64_t r = begin; r < end; r++) {
        memset(row, 0, sizeof(double) * (size_t)f->n_targets);
        kiln_tree_levels_row_avx512(s->lv, j->x + r * j->nf, j->nf, row);
        int64_t best = kiln_forest_finish_row(f, row);
        if (kiln_forest_store_row(f, j->out, r, row, best) != KILN_OK) j->failed = 1;
    }
}

static void tree_rows(void *arg, int64_t begin, int64_t end)
{
    struct tree_job *j = arg;
    const struct tree_state *s = j->s;
    const struct kiln_forest *f = s->f;
    if (s->lv && end - begin < TREE_LEVELS_MIN) {
        tree_rows_one(j, begin, end);
        return;
    }
    if (s->lv && tree_rows_levels(j, begin, end)) return;
    int64_t nt = f->n_targets, cols = s->cols, width = nt > cols ? nt : cols;
    int64_t block = TREE_BLOCK * width <= TREE_MAX_COLS ? TREE_BLOCK : 1;
    double buf[TREE_MAX_COLS + 2];
    int32_t leaf[TREE_BLOCK];
    for (int64_t r0 = begin; r0 < end; r0 += block) {
        int64_t nb = end - r0 < block ? end - r0 : block;
        for (int64_t b = 0; b < nb; b++) kiln_forest_scores_init(f, buf + b * width, j->out_dt);
        for (int t = 0; t < f->n_trees; t++) {
            int32_t root = s->roots[t];
            int64_t b = 0;
            /* eight rows descend together: eight independent chains of loads */
            for (; b + TREE_LANES <= nb; b += TREE_LANES) {
                int32_t c[TREE_LANES];
                const float *xr[TREE_LANES];
                for (int l = 0; l < TREE_LANES; l++) {
                    c[l] = root;
                    xr[l] = j->x + (r0 + b + l) * j->nf;
                }
                for (;;) {
                    int live = 0;
                    for (int l = 0; l < TREE_LANES; l++) {
                        if (c[l] < 0) continue;
                        c[l] = tree_step(&s->nodes[c[l]], xr[l]);
                        live = 1;
                    }
                    if (!live) break;
                }
                for (int l = 0; l < TREE_LANES; l++) leaf[b + l] = ~c[l];
            }
            for (; b < nb; b++) {
                const float *xr = j->x + (r0 + b) * j->nf;
                int32_t c = root;
                while (c >= 0) c = tree_step(&s->nodes[c], xr);
                leaf[b] = ~c;
            }
            for (int64_t v = 0; v < nb; v++) kiln_forest_vote(f, leaf[v], buf + v * width);
        }
        for (int64_t b = 0; b < nb; b++) {
            double *row = buf + b * width;
            int64_t best = kiln_forest_finish_row(f, row);
            if (kiln_forest_store_row(f, j->out, r0 + b, row, best) != KILN_OK) j->failed = 1;
        }
    }
}

static kiln_status tree_run_fast(void *state, struct kiln_run_ctx *ctx)
{
    const struct tree_state *s = state;
    const kiln_tensor *x = ctx->in[0];
    int64_t rows = x->rank == 2 ? x->dims[0] : 1;
    struct tree_job j = {s, x->data, x->dims[x->rank - 1], ctx->out, KILN_DTYPE_F32, 0};
    /* a few hundred node visits per row: split rows finely enough to use every thread */
    kiln_parallel_for(ctx->threads, rows, TREE_BLOCK, tree_rows, &j);
    if (j.failed) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "%s node '%s': out of memory writing labels",
                                    ctx->node->op_type, ctx->node->name);
    return KILN_OK;
}

