/*
 * unit_trees.c - the fast tree kernel (src/kernels/trees_fast.c) against
 * the reference tree kernels (src/kernels/ref/trees.c).
 *
 * Random forests (fixed seeds) are written as TreeEnsembleRegressor,
 * TreeEnsembleClassifier and TreeEnsemble (opset 5) nodes with every
 * compare mode the fast kernel takes (BRANCH_LEQ, LT, GTE, GT), thresholds
 * given as float and as double (nodes_values_as_tensor, values between two
 * floats), missing_value_tracks_true set at random, several votes per leaf,
 * every aggregate function and post transform, base values, and the
 * classifier's binary rule. Inputs mix NaN, +-inf and values equal to the
 * thresholds (ties decide LEQ against LT). Also XGBoost's form (one target
 * per tree, one vote per leaf) at depths 0 to 10 with leaves above the last
 * level, 12 classes, complete trees of depth 5 to 9 (every kind of level
 * lookup of the AVX-512 walk), and several votes per leaf for distinct
 * targets, and forests of 37 to 150 trees of mixed depths (blocks of 64
 * trees and groups of 16 with a partial last one, shallow trees masked off
 * while deep ones step) over 12 to 70 features (the one-row walk keeps up
 * to 16, 32 or 64 features in registers, gathers beyond). Row counts 1 to 130 straddle the one-row walk
 * (16 trees at once, fewer than 16 rows a thread), the 32-row blocks of the
 * scalar path and the 64-row blocks (4 x 16 lanes) of the level-order path. Every
 * forest is compiled on the machine's ISA and with KILN_ISA=avx2 (the
 * scalar path); where the CPU has AVX-512 the forests the level-order path
 * must take are checked to take it. The fast kernel runs on one thread and
 * on two into outputs prefilled with garbage; labels must equal the
 * reference's, and scores agree to 1e-6 relative on the scalar path and
 * exactly on the level-order path (both sum the same doubles in the same
 * order). A forest with an EQ split must be declined (reference path).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/threadpool.h"
#include "kernels/fast.h"
#include "kernels/kernel.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(uint64_t n) { return check_xorshift(&rng_state) % n; }
static double unif(void) { return (double)(check_xorshift(&rng_state) >> 11) / 9007199254740992.0; }

#define MAX_N 65536

struct forest_spec {
    int trees, depth, features, targets;
    int v5;            /* TreeEnsemble (opset 5) instead of the regressor / classifier */
    int classifier;
    int binary;        /* classifier: every vote for class 0, two labels */
    int double_split;  /* thresholds as nodes_values_as_tensor (double) */
    int eq_split;      /* include a BRANCH_EQ node (the fast kernel must decline) */
    int aggregate;     /* 0..3 */
    int post;          /* 0..4 */
    int tree_target;   /* every leaf of tree t votes once, for target t % targets (XGBoost's form) */
    int distinct;      /* several votes per leaf, for distinct targets */
    int leaf_rate;     /* a node above the last level is a leaf with odds 1 / leaf_rate (0: 1 / 5) */
    int no_leaf_early; /* complete trees */
    int levels;        /* the AVX-512 level-order path must take it (where the CPU has AVX-512) */
};

/* Attribute arrays for one node, built in plain arrays. */
struct arrays {
    int64_t treeids[MAX_N], nodeids[MAX_N], feat[MAX_N], tid[MAX_N], fid[MAX_N], miss[MAX_N];
    int64_t tleaf[MAX_N], fleaf[MAX_N];
    const char *modes[MAX_N];
    uint8_t mode_codes[MAX_N];
    double vals[MAX_N];
    int n;
    int64_t v_tree[MAX_N], v_node[MAX_N], v_ids[MAX_N];
    double v_w[MAX_N];
    int nv;
    int64_t roots[64];
    int n_tree_now;    /* the tree being grown (opset 5) */
    int64_t leaf_target[MAX_N];
    double leaf_w[MAX_N];
    int n_leaf;
};

static double split_pool[8];

static const char *mode_names[] = {"BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ"};

static int early_leaf(const struct forest_spec *sp)
{
    if (sp->no_leaf_early) return 0;
    return rnd((uint64_t)(sp->leaf_rate ? sp->leaf_rate : 5)) == 0;
}

/* Grow one tree of the old form: node ids 0.. in this tree; returns the node id. */
static int64_t grow_v1(struct arrays *a, const struct forest_spec *sp, int tree, int depth,
                       int64_t *next_id)
{
    if (a->n >= MAX_N || a->nv + 64 >= MAX_N) abort(); /* a spec too big for the arrays */
    int i = a->n++;
    int64_t id = (*next_id)++;
    a->treeids[i] = tree;
    a->nodeids[i] = id;
    if (depth == 0 || (depth < sp->depth && early_leaf(sp))) {
        a->modes[i] = "LEAF";
        a->feat[i] = 0;
        a->vals[i] = 0;
        a->tid[i] = a->fid[i] = 0;
        a->miss[i] = 0;
        int votes = sp->classifier && !sp->binary ? 1 + (int)rnd(sp->targets) : 1 + (int)rnd(2);
        if (sp->tree_target) votes = 1;
        int64_t order[64];
        for (int k = 0; k < sp->targets; k++) order[k] = k;
        for (int k = sp->targets - 1; k > 0; k--) { /* a random order: distinct targets */
            int64_t j = (int64_t)rnd((uint64_t)k + 1), tmp = order[k];
            order[k] = order[j];
            order[j] = tmp;
        }
        if (sp->distinct && votes > sp->targets) votes = sp->targets;
        for (int k = 0; k < votes; k++) {
            a->v_tree[a->nv] = tree;
            a->v_node[a->nv] = id;
            a->v_ids[a->nv] = sp->binary ? 0
                              : sp->tree_target ? tree % sp->targets
                              : sp->distinct ? order[k] : (int64_t)rnd((uint64_t)sp->targets);
            a->v_w[a->nv] = unif() * 2 - 1;
            a->nv++;
        }
        return id;
    }
    int mode = (int)rnd(4);
    if (sp->eq_split && tree == 0 && id == 0) mode = 4;
    a->modes[i] = mode_names[mode];
    a->feat[i] = (int64_t)rnd((uint64_t)sp->features);
    a->vals[i] = split_pool[rnd(8)];
    a->miss[i] = (int64_t)rnd(2);
    a->tid[i] = grow_v1(a, sp, tree, depth - 1, next_id);
    a->fid[i] = grow_v1(a, sp, tree, depth - 1, next_id);
    return id;
}

/* Grow one tree of the opset-5 form; returns (node index) or ~leaf. */
static int64_t grow_v5(struct arrays *a, const struct forest_spec *sp, int depth, int top)
{
    if (!top && (depth == 0 || early_leaf(sp))) {
        int l = a->n_leaf++;
        a->leaf_target[l] = sp->tree_target ? a->n_tree_now % sp->targets : (int64_t)rnd((uint64_t)sp->targets);
        a->leaf_w[l] = unif() * 2 - 1;
        return ~(int64_t)l;
    }
    int i = a->n++;
    a->mode_codes[i] = (uint8_t)rnd(4);
    a->feat[i] = (int64_t)rnd((uint64_t)sp->features);
    a->vals[i] = split_pool[rnd(8)];
    a->miss[i] = (int64_t)rnd(2);
    int64_t t = grow_v5(a, sp, depth - 1, 0), f = grow_v5(a, sp, depth - 1, 0);
    a->tid[i] = t < 0 ? ~t : t;
    a->tleaf[i] = t < 0;
    a->fid[i] = f < 0 ? ~f : f;
    a->fleaf[i] = f < 0;
    return i;
}

/* ---- the node under test ---- */

struct tcase {
    struct kiln_graph *g;
    struct kiln_node *node;
    int n_out;
};

static struct kiln_attr *add_attr(struct tcase *c, const char *name, enum kiln_attr_type t)
{
    struct kiln_attr *a = &c->node->attr[c->node->n_attr++];
    a->name = name;
    a->type = t;
    return a;
}

static void a_ints(struct tcase *c, const char *name, const int64_t *v, int n)
{
    struct kiln_attr *a = add_attr(c, name, KILN_ATTR_INTS);
    a->n = n;
    a->ints = kiln_arena_alloc(c->g->mem, sizeof(int64_t) * (size_t)(n + 1));
    memcpy(a->ints, v, sizeof(int64_t) * (size_t)n);
}

static void a_floats(struct tcase *c, const char *name, const double *v, int n)
{
    struct kiln_attr *a = add_attr(c, name, KILN_ATTR_FLOATS);
    a->n = n;
    a->floats = kiln_arena_alloc(c->g->mem, sizeof(float) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) a->floats[i] = (float)v[i];
}

static void a_tensor(struct tcase *c, const char *name, kiln_dtype dt, const double *v, int n)
{
    int64_t d = n;
    kiln_tensor *t;
    if (kiln_tensor_new(dt, 1, &d, &t) != KILN_OK || kiln_graph_own_tensor(c->g, t) != KILN_OK) abort();
    for (int i = 0; i < n; i++) kiln_set_f64(dt, t->data, i, v[i]);
    add_attr(c, name, KILN_ATTR_TENSOR)->t = t;
}

static void a_int(struct tcase *c, const char *name, int64_t v) { add_attr(c, name, KILN_ATTR_INT)->i = v; }

static void a_str(struct tcase *c, const char *name, const char *v)
{
    struct kiln_attr *a = add_attr(c, name, KILN_ATTR_STRING);
    a->s.len = strlen(v);
    a->s.data = kiln_arena_strdup(c->g->mem, v);
}

static struct arrays A;

static void build(struct tcase *c, const struct forest_spec *sp)
{
    static const char *aggs[] = {"AVERAGE", "SUM", "MIN", "MAX"};
    static const char *posts[] = {"NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"};
    memset(&A, 0, sizeof A);
    enum kiln_op op = sp->v5 ? KILN_OP_TreeEnsemble
                      : sp->classifier ? KILN_OP_TreeEnsembleClassifier : KILN_OP_TreeEnsembleRegressor;
    c->n_out = sp->classifier ? 2 : 1;
    if (kiln_graph_new(&c->g) != KILN_OK ||
        kiln_graph_node_add(c->g, op, "forest", 1, c->n_out, 24, &c->node) != KILN_OK)
        abort();
    c->node->n_attr = 0;
    c->node->opset = sp->v5 ? 5 : 3;
    double *vals = A.vals;
    if (sp->v5) {
        for (int t = 0; t < sp->trees; t++) {
            A.n_tree_now = t;
            A.roots[t] = grow_v5(&A, sp, sp->depth, 1);
        }
        static double modes[MAX_N];
        for (int i = 0; i < A.n; i++) modes[i] = A.mode_codes[i];
        a_int(c, "n_targets", sp->targets);
        a_int(c, "aggregate_function", sp->aggregate);
        a_int(c, "post_transform", sp->post);
        a_ints(c, "tree_roots", A.roots, sp->trees);
        a_ints(c, "nodes_featureids", A.feat, A.n);
        a_ints(c, "nodes_truenodeids", A.tid, A.n);
        a_ints(c, "nodes_trueleafs", A.tleaf, A.n);
        a_ints(c, "nodes_falsenodeids", A.fid, A.n);
        a_ints(c, "nodes_falseleafs", A.fleaf, A.n);
        a_ints(c, "nodes_missing_value_tracks_true", A.miss, A.n);
        a_ints(c, "leaf_targetids", A.leaf_target, A.n_leaf);
        a_tensor(c, "nodes_modes", KILN_DTYPE_U8, modes, A.n);
        a_tensor(c, "nodes_splits", KILN_DTYPE_F32, vals, A.n);
        a_tensor(c, "leaf_weights", KILN_DTYPE_F32, A.leaf_w, A.n_leaf);
    } else {
        for (int t = 0; t < sp->trees; t++) {
            int64_t next = 0;
            grow_v1(&A, sp, t, sp->depth, &next);
        }
        const char *vp = sp->classifier ? "class" : "target";
        char n1[32], n2[32], n3[32], n4[40];
        snprintf(n1, sizeof n1, "%s_treeids", vp);
        snprintf(n2, sizeof n2, "%s_nodeids", vp);
        snprintf(n3, sizeof n3, "%s_ids", vp);
        snprintf(n4, sizeof n4, "%s_weights", vp);
        a_ints(c, "nodes_treeids", A.treeids, A.n);
        a_ints(c, "nodes_nodeids", A.nodeids, A.n);
        a_ints(c, "nodes_featureids", A.feat, A.n);
        a_ints(c, "nodes_truenodeids", A.tid, A.n);
        a_ints(c, "nodes_falsenodeids", A.fid, A.n);
        a_ints(c, "nodes_missing_value_tracks_true", A.miss, A.n);
        struct kiln_attr *m = add_attr(c, "nodes_modes", KILN_ATTR_STRINGS);
        m->n = A.n;
        m->strings = kiln_arena_alloc(c->g->mem, sizeof(kiln_string) * (size_t)A.n);
        for (int i = 0; i < A.n; i++) {
            m->strings[i].data = (char *)A.modes[i];
            m->strings[i].len = strlen(A.modes[i]);
        }
        if (sp->double_split) a_tensor(c, "nodes_values_as_tensor", KILN_DTYPE_F64, vals, A.n);
        else a_floats(c, "nodes_values", vals, A.n);
        a_ints(c, kiln_arena_strdup(c->g->mem, n1), A.v_tree, A.nv);
        a_ints(c, kiln_arena_strdup(c->g->mem, n2), A.v_node, A.nv);
        a_ints(c, kiln_arena_strdup(c->g->mem, n3), A.v_ids, A.nv);
        a_floats(c, kiln_arena_strdup(c->g->mem, n4), A.v_w, A.nv);
        a_str(c, "post_transform", posts[sp->post]);
        double base[64];
        for (int k = 0; k < sp->targets; k++) base[k] = unif() - 0.5;
        a_floats(c, "base_values", base, sp->binary ? 1 : sp->targets);
        if (sp->classifier) {
            int64_t labels[64];
            for (int k = 0; k < sp->targets; k++) labels[k] = 10 + 3 * k;
            a_ints(c, "classlabels_int64s", labels, sp->binary ? 2 : sp->targets);
        } else {
            a_int(c, "n_targets", sp->targets);
            a_str(c, "aggregate_function", aggs[sp->aggregate]);
        }
    }
    for (int k = 0; k < c->n_out; k++) {
        int id;
        char nm[16];
        snprintf(nm, sizeof nm, "y%d", k);
        if (kiln_graph_value_add(c->g, nm, KILN_VALUE_NODE, &id) != KILN_OK) abort();
        c->node->out[k] = id;
    }
}

/* ---- running both kernels ---- */

static void infer_types(struct tcase *c, const kiln_tensor *x, struct kiln_type *types)
{
    struct kiln_type xt;
    kiln_type_from_tensor(&xt, x);
    const struct kiln_type *in_p[1] = {&xt};
    const kiln_tensor *in_v[1] = {NULL};
    struct kiln_type *out_p[2] = {&types[0], &types[1]};
    kiln_type_unknown(&types[0]);
    kiln_type_unknown(&types[1]);
    struct kiln_infer_ctx ic = {c->node, 1, in_p, in_v, c->n_out, out_p};
    if (kiln_op_impl(c->node->op)->infer(&ic) != KILN_OK) {
        fprintf(stderr, "infer: %s\n", kiln_last_error());
        abort();
    }
}

static void new_outs(struct tcase *c, const struct kiln_type *types, kiln_tensor **out, int garbage)
{
    for (int k = 0; k < c->n_out; k++) {
        if (kiln_tensor_new(types[k].dtype, types[k].rank, types[k].dims, &out[k]) != KILN_OK) abort();
        if (garbage && types[k].dtype != KILN_DTYPE_STRING) memset(out[k]->data, 0xff, out[k]->nbytes);
    }
}

/* Compile and run the fast kernel; returns 0 if it declined the node, else
 * sets *kernel to the name of the path it compiled. */
static int run_fast(struct tcase *c, kiln_tensor *x, int threads, kiln_tensor **out, const char **kernel)
{
    const struct kiln_fast_op *f = kiln_fast_op(c->node->op);
    if (!f) return 0;
    struct kiln_type types[2], xt;
    infer_types(c, x, types);
    kiln_type_from_tensor(&xt, x);
    const struct kiln_type *in_p[1] = {&xt}, *out_p[2] = {&types[0], &types[1]};
    const kiln_tensor *in_v[1] = {NULL};
    int layouts[2] = {0, 0};
    struct kiln_compile_ctx cc = {.node = c->node, .n_in = 1, .in = in_p, .in_value = in_v,
                                  .in_layout = layouts, .n_out = c->n_out, .out = out_p,
                                  .out_layout = layouts, .threads = threads};
    struct kiln_kernel_inst inst = {0};
    if (f->compile(&cc, &inst) != KILN_OK) abort();
    if (!inst.run) return 0;
    static char name_copy[128]; /* the instance frees its name with its state */
    snprintf(name_copy, sizeof name_copy, "%s", inst.name ? inst.name : "");
    *kernel = name_copy;
    new_outs(c, types, out, 1);
    kiln_tensor *ins[1] = {x};
    struct kiln_run_ctx rc = {.node = c->node, .n_in = 1, .in = ins, .n_out = c->n_out, .out = out,
                              .threads = threads};
    kiln_status st = inst.run(inst.state, &rc);
    CHECK(st == KILN_OK, "fast run: %s", kiln_last_error());
    kiln_kernel_inst_destroy(&inst);
    return 1;
}

static kiln_tensor *make_input(int rows, int features)
{
    int64_t d[2] = {rows, features};
    kiln_tensor *x;
    if (kiln_tensor_new(KILN_DTYPE_F32, 2, d, &x) != KILN_OK) abort();
    float *p = x->data;
    for (int64_t i = 0; i < (int64_t)rows * features; i++) {
        uint64_t r = rnd(10);
        p[i] = r < 4 ? (float)split_pool[rnd(8)]                  /* ties with the splits */
               : r < 5 ? NAN : r < 6 ? (rnd(2) ? INFINITY : -INFINITY)
                       : (float)(unif() * 4 - 2);
    }
    return x;
}

/* One spec against the reference, on the ISA KILN_ISA allows (isa "" for
 * the machine's own). */
static void check_spec_isa(const char *label, const struct forest_spec *sp, const char *isa)
{
    static const int row_counts[] = {1, 2, 7, 15, 16, 17, 31, 32, 33, 64, 65, 100, 130};
    if (*isa) setenv("KILN_ISA", isa, 1);
    else unsetenv("KILN_ISA");
    int want_levels = sp->levels && !*isa && kiln_cpu_isa() == KILN_ISA_AVX512;
    struct tcase c;
    build(&c, sp);
    for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++) {
        kiln_tensor *x = make_input(row_counts[ri], sp->features);
        struct kiln_type types[2];
        infer_types(&c, x, types);
        kiln_tensor *want[2] = {0};
        new_outs(&c, types, want, 0);
        kiln_tensor *ins[1] = {x};
        struct kiln_run_ctx rc = {.node = c.node, .n_in = 1, .in = ins, .n_out = c.n_out, .out = want,
                                  .threads = 1};
        kiln_status st = kiln_op_impl(c.node->op)->run(&rc);
        CHECK(st == KILN_OK, "%s: reference: %s", label, kiln_last_error());
        for (int threads = 1; threads <= 2; threads++) {
            kiln_tensor *got[2] = {0};
            const char *kernel = "";
            int handled = run_fast(&c, x, threads, got, &kernel);
            if (sp->eq_split) {
                CHECK(!handled, "%s: the fast kernel took a forest with a BRANCH_EQ split", label);
                continue;
            }
            CHECK(handled, "%s: the fast kernel declined", label);
            if (!handled) continue;
            int levels = strcmp(kernel, "tree_levels_avx512") == 0;
            CHECK(!want_levels || levels, "%s: compiled as %s, not the level-order path", label, kernel);
            CHECK(!levels || !*isa, "%s: the level-order path under KILN_ISA=%s", label, isa);
            for (int k = 0; k < c.n_out; k++) {
                int64_t n = kiln_tensor_count(want[k]);
                int bad = -1;
                for (int64_t i = 0; i < n && bad < 0; i++) {
                    if (want[k]->dtype == KILN_DTYPE_I64) {
                        if (((int64_t *)got[k]->data)[i] != ((int64_t *)want[k]->data)[i]) bad = (int)i;
                    } else {
                        double a = kiln_tensor_f64(got[k], i), b = kiln_tensor_f64(want[k], i);
                        /* the level-order path sums the same doubles in the same order: equal */
                        double tol = levels ? 0 : 1e-6 * fmax(1.0, fabs(b));
                        if (!(fabs(a - b) <= tol) && !(isnan(a) && isnan(b))) bad = (int)i;
                    }
                }
                CHECK(bad < 0, "%s (%s, KILN_ISA '%s'): rows %d threads %d output %d element %d: fast %.9g "
                      "reference %.9g", label, kernel, isa, row_counts[ri], threads, k, bad,
                      bad < 0 ? 0 : kiln_tensor_f64(got[k], bad), bad < 0 ? 0 : kiln_tensor_f64(want[k], bad));
            }
            for (int k = 0; k < 2; k++) kiln_tensor_free(got[k]);
        }
        for (int k = 0; k < 2; k++) kiln_tensor_free(want[k]);
        kiln_tensor_free(x);
    }
    kiln_graph_free(c.g);
    unsetenv("KILN_ISA");
}

/* Every spec on the machine's best ISA and on AVX2 (the scalar blocked path);
 * the random state is restored between the two, so both see the same forest. */
static void check_spec(const char *label, const struct forest_spec *sp)
{
    uint64_t seed = rng_state;
    check_spec_isa(label, sp, "");
    rng_state = seed;
    check_spec_isa(label, sp, "avx2");
}

int main(void)
{
    /* splits: floats, and doubles between two floats (only the double form keeps them) */
    double base[8] = {-1.0, -0.25, 0.0, 0.1, 0.5, 1.0, 1.5, 2.0};
    for (int i = 0; i < 8; i++) split_pool[i] = base[i];
    char label[96];
    for (int agg = 0; agg < 4; agg++)
        for (int post = 0; post < 5; post++) {
            struct forest_spec sp = {.trees = 7, .depth = 5, .features = 5, .targets = 3,
                                     .aggregate = agg, .post = post};
            snprintf(label, sizeof label, "regressor agg %d post %d", agg, post);
            check_spec(label, &sp);
            sp.v5 = 1;
            sp.levels = agg < 2; /* one vote per leaf: SUM and AVERAGE take the level-order path */
            snprintf(label, sizeof label, "TreeEnsemble agg %d post %d", agg, post);
            check_spec(label, &sp);
        }
    for (int post = 0; post < 5; post++) {
        struct forest_spec sp = {.trees = 9, .depth = 6, .features = 4, .targets = 4, .classifier = 1,
                                 .aggregate = 1, .post = post};
        snprintf(label, sizeof label, "classifier post %d", post);
        check_spec(label, &sp);
        sp.binary = 1;
        sp.targets = 2;
        snprintf(label, sizeof label, "binary classifier post %d", post);
        check_spec(label, &sp);
    }
    /* double thresholds just off the floats: LEQ vs LT vs GTE vs GT must round the right way */
    for (int i = 0; i < 8; i++) split_pool[i] = base[i] + (i % 2 ? 1e-9 : -1e-9);
    struct forest_spec dsp = {.trees = 12, .depth = 6, .features = 3, .targets = 1, .double_split = 1,
                              .aggregate = 1};
    check_spec("double thresholds", &dsp);
    for (int i = 0; i < 8; i++) split_pool[i] = base[i];
    struct forest_spec deep = {.trees = 3, .depth = 10, .features = 8, .targets = 2, .aggregate = 1};
    check_spec("deep trees", &deep);
    /* XGBoost's form (one target per tree, one vote per leaf), depths 0 to 10, some leaves above
     * the last level (padded by the level-order path), regression and 12 classes */
    for (int depth = 0; depth <= 10; depth++) {
        struct forest_spec sp = {.trees = 8, .depth = depth, .features = 6, .targets = 1,
                                 .aggregate = 1, .tree_target = 1, .leaf_rate = 8, .levels = 1,
                                 .post = depth % 2 ? 2 : 0};
        snprintf(label, sizeof label, "XGBoost-like regressor depth %d", depth);
        check_spec(label, &sp);
        struct forest_spec mc = {.trees = 36, .depth = depth < 6 ? depth : 6, .features = 9,
                                 .targets = 12, .classifier = 1, .aggregate = 1, .tree_target = 1,
                                 .leaf_rate = 6, .levels = 1, .post = 1};
        snprintf(label, sizeof label, "XGBoost-like 12 classes depth %d", mc.depth);
        check_spec(label, &mc);
    }
    /* complete trees: every level of the walk (permutes up to level 6, gathers below) */
    for (int depth = 5; depth <= 9; depth++) {
        struct forest_spec sp = {.trees = 5, .depth = depth, .features = 7, .targets = 2, .v5 = 1,
                                 .aggregate = 0, .no_leaf_early = 1, .levels = 1};
        snprintf(label, sizeof label, "complete TreeEnsemble depth %d", depth);
        check_spec(label, &sp);
    }
    /* many trees, not a multiple of 16 or 64, of mixed depths (early leaves often): the one-row
     * walk's blocks of 64 trees, 16 per lane group, masked lanes for shallow trees; 12, 40, 20
     * and 70 features: the row held in one, four and two registers, and gathered */
    struct forest_spec many = {.trees = 150, .depth = 7, .features = 12, .targets = 1, .aggregate = 1,
                               .tree_target = 1, .leaf_rate = 3, .levels = 1};
    check_spec("150 trees of mixed depth", &many);
    struct forest_spec many_c = {.trees = 75, .depth = 8, .features = 40, .targets = 3, .classifier = 1,
                                 .aggregate = 1, .tree_target = 1, .leaf_rate = 4, .levels = 1, .post = 2};
    check_spec("75 trees, 3 classes, mixed depth", &many_c);
    struct forest_spec many_v5 = {.trees = 37, .depth = 6, .features = 20, .targets = 2, .v5 = 1,
                                  .aggregate = 0, .leaf_rate = 5, .levels = 1};
    check_spec("37 trees TreeEnsemble", &many_v5);
    struct forest_spec wide = {.trees = 20, .depth = 5, .features = 70, .targets = 1, .aggregate = 1,
                               .tree_target = 1, .leaf_rate = 4, .levels = 1};
    check_spec("70 features", &wide);
    /* several votes per leaf for distinct targets: one leaf table per target of the tree */
    struct forest_spec dv = {.trees = 10, .depth = 6, .features = 5, .targets = 5, .distinct = 1,
                             .aggregate = 1, .levels = 1};
    check_spec("distinct votes per leaf", &dv);
    struct forest_spec eq = {.trees = 2, .depth = 3, .features = 2, .targets = 1, .eq_split = 1,
                             .aggregate = 1};
    check_spec("BRANCH_EQ declined", &eq);
    return CHECK_DONE();
}
