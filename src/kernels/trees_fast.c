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
 * reference kernel runs the node. Tested against the reference in
 * tests/c/unit_trees.c.
 */
#include <float.h>
#include <stdlib.h>

#include "core/threadpool.h"
#include "kernels/fast.h"
#include "kernels/ref/trees.h"

#define TREE_BLOCK 32       /* rows walked together */
#define TREE_MAX_COLS 4096  /* score columns the stack buffers allow */
#define TREE_LANES 8        /* rows of a block that descend a tree in lockstep */

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

static void tree_state_free(void *p)
{
    struct tree_state *s = p;
    if (!s) return;
    kiln_forest_free(s->f);
    free(s->nodes);
    free(s->roots);
    free(s);
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
        const struct kiln_tree_node *nd = &f->nodes[n];
        struct fnode *o = &out[map[n]];
        double t = nd->split;
        int swap = 0;
        if (t != t) {
            o->thr = NAN; /* every test fails: the false child */
        } else if (nd->mode == KILN_TREE_LEQ) {
            o->thr = float_down(t);
        } else if (nd->mode == KILN_TREE_LT) {
            o->thr = t == -INFINITY ? NAN : float_below(t);
        } else if (nd->mode == KILN_TREE_GTE) {
            if (t == -INFINITY) {
                o->thr = INFINITY; /* x >= -inf holds for every x but NaN */
            } else {
                o->thr = float_below(t); /* x >= t  <=>  !(x < t) */
                swap = 1;
            }
        } else {
            o->thr = float_down(t); /* x > t  <=>  !(x <= t) */
            swap = 1;
        }
        int32_t ch[2] = {nd->child[swap], nd->child[!swap]};
        /* NaN: `x <= thr` fails, so without the flag it takes ch[1]; the flag sends it to
         * the true child, wherever that landed */
        int nan_to_0 = nd->missing_true ? !swap : swap;
        o->feat = (uint32_t)nd->feature | (nan_to_0 ? 0x80000000u : 0);
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

static kiln_status tree_run_fast(void *state, struct kiln_run_ctx *ctx);

static kiln_status tree_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
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
    inst->name = "tree_blocked";
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

static void tree_rows(void *arg, int64_t begin, int64_t end)
{
    struct tree_job *j = arg;
    const struct tree_state *s = j->s;
    const struct kiln_forest *f = s->f;
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

KILN_FAST_OP(TreeEnsembleClassifier, tree_compile, NULL);
KILN_FAST_OP(TreeEnsembleRegressor, tree_compile, NULL);
KILN_FAST_OP(TreeEnsemble, tree_compile, NULL);
