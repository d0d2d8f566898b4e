/*
 * unit_opt.c - the graph optimizer (src/opt/) and the fused ops' reference
 * kernels (src/kernels/ref/fused.c).
 *
 * Every check runs a graph through the reference executor before and after
 * kiln_optimize and compares the outputs (max |diff| <= 1e-4 * max |ref|,
 * floor 1e-4), then checks which nodes the optimizer left. Small graphs are
 * built here, one per pattern; then real models: the test suite exports the
 * small ones (tools/cache_test_models.py, ctest fixture export_test_models)
 * into a cache named by KILN_TEST_MODELS (<dir>/<name>/model.onnx); without
 * it, bench/models/ (tools/export_models.py --out bench/models). A missing
 * model is a visible skip (exit 77), a failure with KILN_REQUIRE_TESTDATA=1;
 * resnet50, which only bench/models holds, is checked when it is there. The
 * fused ops' reference kernels are thereby compared against the unfused
 * composition of reference ops, on random values and fixed shapes with odd
 * sizes (9 x 7 images, 3 and 5 channels).
 *
 * Each optimized graph is also compiled into a plan (the bench models
 * optimized as sessions do, blocked layouts included) and run: its outputs
 * must match the reference executor's on the graph as built, and once warm
 * a run must allocate nothing but the outputs it hands over. The binary's
 * malloc family counts calls by who made them (not under the sanitizers,
 * which replace it): oneDNN's own small allocations inside
 * dnnl_primitive_execute (its argument map, through operator new) are
 * counted apart, every other caller (Kiln, and libc on Kiln's behalf) must
 * make none but the outputs'.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/fileio.h"
#include "core/threadpool.h"
#include "core/tensor.h"
#include "exec/exec.h"
#include "exec/plan.h"
#include "kernels/fast.h"
#include "import/model.h"
#include "ir/graph.h"
#include "kernels/kernel.h"
#include "kiln/kiln.h"
#include "opt/opt.h"

/* ---- counting allocations ---- */

#if !defined(__SANITIZE_ADDRESS__)
#define COUNT_ALLOCS 1
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
static atomic_int counting, allocs, dnnl_allocs;
/* Count one call made from return address ra: oneDNN's (its code, its C++
 * runtime's operator new, OpenMP's) apart from everyone else's. */
static void count_one(void *ra)
{
    if (!atomic_load_explicit(&counting, memory_order_relaxed)) return;
    Dl_info d;
    const char *f = dladdr(ra, &d) && d.dli_fname ? d.dli_fname : "";
    if (strstr(f, "libdnnl") || strstr(f, "libstdc++") || strstr(f, "libgomp"))
        atomic_fetch_add_explicit(&dnnl_allocs, 1, memory_order_relaxed);
    else
        atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
}
#define RA __builtin_return_address(0)
void *malloc(size_t n)
{
    count_one(RA);
    return __libc_malloc(n);
}
void *calloc(size_t n, size_t size)
{
    count_one(RA);
    return __libc_calloc(n, size);
}
void *realloc(void *p, size_t n)
{
    count_one(RA);
    return __libc_realloc(p, n);
}
void *aligned_alloc(size_t align, size_t n)
{
    count_one(RA);
    return __libc_memalign(align, n);
}
void *memalign(size_t align, size_t n);
void *memalign(size_t align, size_t n)
{
    count_one(RA);
    return __libc_memalign(align, n);
}
int posix_memalign(void **out, size_t align, size_t n)
{
    count_one(RA);
    void *p = __libc_memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
#endif

/* ---- random numbers ---- */

static uint64_t rng_state = 0x1234567887654321ull;
static double rnd(void) /* uniform in [-1, 1) */
{
    return (double)(check_xorshift(&rng_state) >> 11) / (double)(1ull << 52) - 1.0;
}

static kiln_tensor *rand_tensor(int rank, const int64_t *dims, double scale, double offset)
{
    kiln_tensor *t;
    if (kiln_tensor_new(KILN_DTYPE_F32, rank, dims, &t) != KILN_OK) return NULL;
    int64_t n = kiln_tensor_count(t);
    for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = (float)(rnd() * scale + offset);
    return t;
}

/* max |a - b| relative to max |b| (floor 1): fails on shape or dtype mismatch. */
static double rel_diff(const kiln_tensor *a, const kiln_tensor *b)
{
    if (!a || !b || a->dtype != b->dtype || a->rank != b->rank) return INFINITY;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return INFINITY;
    int64_t n = kiln_tensor_count(a);
    double md = 0, mref = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = kiln_tensor_f64(a, i), y = kiln_tensor_f64(b, i);
        if (isnan(x) != isnan(y)) return INFINITY;
        if (fabs(x - y) > md) md = fabs(x - y);
        if (fabs(y) > mref) mref = fabs(y);
    }
    return md / (mref > 1.0 ? mref : 1.0);
}

static int count_op(const struct kiln_graph *g, enum kiln_op op)
{
    int c = 0;
    for (int i = 0; i < g->n_nodes; i++) c += g->nodes[i].op == op;
    return c;
}

/* ---- small graph builder ---- */

struct gb {
    struct kiln_graph *g;
    int n_in, in[8];
    int n_out, out[8];
};

static int gb_input(struct gb *b, const char *name, int rank, const int64_t *dims)
{
    int id;
    kiln_graph_value_add(b->g, name, KILN_VALUE_INPUT, &id);
    kiln_type_set(&b->g->values[id].type, KILN_DTYPE_F32, rank, dims);
    b->in[b->n_in++] = id;
    return id;
}

static int gb_const(struct gb *b, kiln_tensor *t)
{
    int id;
    char name[32];
    snprintf(name, sizeof name, "c%d", b->g->n_values);
    kiln_graph_value_add(b->g, name, KILN_VALUE_CONST, &id);
    kiln_graph_own_tensor(b->g, t);
    b->g->values[id].konst = t;
    kiln_type_from_tensor(&b->g->values[id].type, t);
    return id;
}

static int gb_scalar(struct gb *b, float v)
{
    kiln_tensor *t;
    kiln_tensor_new(KILN_DTYPE_F32, 0, NULL, &t);
    ((float *)t->data)[0] = v;
    return gb_const(b, t);
}

static int gb_rand(struct gb *b, int rank, const int64_t *dims, double scale, double offset)
{
    return gb_const(b, rand_tensor(rank, dims, scale, offset));
}

static int gb_i64(struct gb *b, int n, const int64_t *v)
{
    kiln_tensor *t;
    int64_t d = n;
    kiln_tensor_new(KILN_DTYPE_I64, 1, &d, &t);
    memcpy(t->data, v, sizeof(int64_t) * (size_t)n);
    return gb_const(b, t);
}

/* Add a node with the given inputs (-1 = absent) and one new output; returns the node. */
static struct kiln_node *gb_node(struct gb *b, enum kiln_op op, int n_in, const int *ins,
                                 int n_attr, int *out)
{
    struct kiln_node *n;
    char name[32];
    snprintf(name, sizeof name, "n%d", b->g->n_nodes);
    kiln_graph_node_add(b->g, op, name, n_in, 1, n_attr, &n);
    n->opset = 17;
    for (int k = 0; k < n_in; k++) n->in[k] = ins[k];
    int id;
    snprintf(name, sizeof name, "v%d", b->g->n_values);
    kiln_graph_value_add(b->g, name, KILN_VALUE_NODE, &id);
    kiln_type_unknown(&b->g->values[id].type);
    b->g->values[id].producer = b->g->n_nodes - 1;
    n->out[0] = id;
    *out = id;
    return n;
}

static int gb_op1(struct gb *b, enum kiln_op op, int x)
{
    int y;
    gb_node(b, op, 1, &x, 0, &y);
    return y;
}

static int gb_op2(struct gb *b, enum kiln_op op, int x, int z)
{
    int y, in[2] = {x, z};
    gb_node(b, op, 2, in, 0, &y);
    return y;
}

static void set_ints(struct kiln_graph *g, struct kiln_attr *a, const char *name, int n,
                     const int64_t *v)
{
    a->name = name;
    a->type = KILN_ATTR_INTS;
    a->n = n;
    a->ints = kiln_arena_alloc(g->mem, sizeof(int64_t) * (size_t)n);
    memcpy(a->ints, v, sizeof(int64_t) * (size_t)n);
}

static void set_int(struct kiln_attr *a, const char *name, int64_t v)
{
    a->name = name;
    a->type = KILN_ATTR_INT;
    a->i = v;
}

static void set_float(struct kiln_attr *a, const char *name, float v)
{
    a->name = name;
    a->type = KILN_ATTR_FLOAT;
    a->f = v;
}

static void set_str(struct kiln_graph *g, struct kiln_attr *a, const char *name, const char *v)
{
    a->name = name;
    a->type = KILN_ATTR_STRING;
    a->s.data = kiln_arena_strdup(g->mem, v);
    a->s.len = strlen(v);
}

static int gb_conv(struct gb *b, int x, int w, int bias, int64_t group, int64_t k, int64_t pad,
                   int64_t stride)
{
    int y, in[3] = {x, w, bias};
    struct kiln_node *n = gb_node(b, KILN_OP_Conv, bias >= 0 ? 3 : 2, in, 4, &y);
    int64_t ks[2] = {k, k}, pads[4] = {pad, pad, pad, pad}, st[2] = {stride, stride};
    set_ints(b->g, &n->attr[0], "kernel_shape", 2, ks);
    set_ints(b->g, &n->attr[1], "pads", 4, pads);
    set_ints(b->g, &n->attr[2], "strides", 2, st);
    set_int(&n->attr[3], "group", group);
    return y;
}

static struct gb gb_new(void)
{
    struct gb b;
    memset(&b, 0, sizeof b);
    kiln_graph_new(&b.g);
    return b;
}

/* Finish: set inputs/outputs, verify and infer. */
static bool gb_finish(struct gb *b)
{
    struct kiln_graph *g = b->g;
    g->n_inputs = b->n_in;
    g->inputs = kiln_arena_alloc(g->mem, sizeof(int) * 8);
    memcpy(g->inputs, b->in, sizeof(int) * (size_t)b->n_in);
    g->n_outputs = b->n_out;
    g->outputs = kiln_arena_alloc(g->mem, sizeof(int) * 8);
    memcpy(g->outputs, b->out, sizeof(int) * (size_t)b->n_out);
    kiln_status st = kiln_graph_verify(g);
    if (st == KILN_OK) st = kiln_graph_infer(g);
    if (st != KILN_OK) fprintf(stderr, "graph build failed: %s\n", kiln_last_error());
    return st == KILN_OK;
}

/* Random inputs for g's inputs (symbolic dims = 1; ints in [0, 2]). */
static bool make_inputs(const struct kiln_graph *g, kiln_tensor **in)
{
    for (int i = 0; i < g->n_inputs; i++) {
        const struct kiln_type *t = &g->values[g->inputs[i]].type;
        int64_t dims[KILN_MAX_RANK];
        for (int d = 0; d < t->rank; d++) dims[d] = t->dims[d] >= 0 ? t->dims[d] : 1;
        if (kiln_tensor_new(t->dtype, t->rank, dims, &in[i]) != KILN_OK) return false;
        int64_t n = kiln_tensor_count(in[i]);
        for (int64_t k = 0; k < n; k++) {
            if (t->dtype == KILN_DTYPE_F32) ((float *)in[i]->data)[k] = (float)rnd();
            else kiln_set_f64(t->dtype, in[i]->data, k, (double)((rng_state >> 20) % 3));
            rnd();
        }
    }
    return true;
}

/*
 * Run g (reference), optimize a second graph g2 built the same way, run it
 * and compare. Returns the largest relative difference (INFINITY on error).
 */
static double compare_graphs(struct kiln_graph *ref, struct kiln_graph *opt,
                             struct kiln_opt_log *log)
{
    kiln_tensor *in[16] = {NULL}, *o1[16] = {NULL}, *o2[16] = {NULL};
    double worst = INFINITY;
    if (ref->n_inputs > 16 || ref->n_outputs > 16 || !make_inputs(ref, in)) goto out;
    if (kiln_exec_run_limited(ref, in, o1, 0, NULL) != KILN_OK) {
        fprintf(stderr, "reference run failed: %s\n", kiln_last_error());
        goto out;
    }
    struct kiln_opt_options o = {0};
    if (kiln_optimize(opt, &o, log) != KILN_OK) {
        fprintf(stderr, "optimize failed: %s\n", kiln_last_error());
        goto out;
    }
    if (kiln_exec_run_limited(opt, in, o2, 0, NULL) != KILN_OK) {
        fprintf(stderr, "optimized run failed: %s\n", kiln_last_error());
        goto out;
    }
    worst = 0;
    for (int i = 0; i < ref->n_outputs; i++) {
        double d = rel_diff(o2[i], o1[i]);
        if (d > worst) worst = d;
    }
out:
    for (int i = 0; i < 16; i++) {
        kiln_tensor_free(in[i]);
        kiln_tensor_free(o1[i]);
        kiln_tensor_free(o2[i]);
    }
    return worst;
}

/*
 * Compile g (optimized) into a plan for inputs of batch 1 and run it five
 * times. The last run's outputs must match the reference executor's run of
 * ref (the graph as built; not for graphs with model state, whose runs
 * change it). Where allocations are counted, runs 3 to 5 (warm: arena,
 * oneDNN bindings and the OpenMP team exist) must make exactly the
 * allocations of the outputs they hand over (as many as kiln_tensor_new
 * makes for them).
 */
static void check_plan(const char *name, const struct kiln_graph *g, const struct kiln_graph *ref)
{
    kiln_tensor *in[16] = {NULL}, *out[16] = {NULL}, *want_out[16] = {NULL};
    struct kiln_weight_cache *wc = NULL;
    struct kiln_plan *p = NULL;
    if (g->n_inputs > 16 || g->n_outputs > 16 || !make_inputs(g, in) ||
        kiln_weight_cache_new(&wc) != KILN_OK ||
        kiln_plan_compile(g, (const kiln_tensor *const *)in, wc, 2, &p) != KILN_OK) {
        CHECK(0, "%s: no plan: %s", name, kiln_last_error());
        goto out;
    }
    if (count_op(g, KILN_OP_TfVariable) + count_op(g, KILN_OP_TfAssign) > 0) ref = NULL;
    int runs_ok = 1;
#ifdef COUNT_ALLOCS
    int want = 0;
#endif
    for (int r = 0; r < 5 && runs_ok; r++) {
#ifdef COUNT_ALLOCS
        if (r == 2) {
            atomic_store(&allocs, 0);
            atomic_store(&dnnl_allocs, 0);
        }
        if (r >= 2) atomic_store(&counting, 1);
#endif
        runs_ok = kiln_plan_run(p, in, out, 2, NULL) == KILN_OK;
#ifdef COUNT_ALLOCS
        atomic_store(&counting, 0);
        for (int i = 0; i < g->n_outputs && runs_ok && r >= 2; i++) {
            /* what making this output alone costs */
            int before = atomic_load(&allocs);
            kiln_tensor *t = NULL;
            atomic_store(&counting, 1);
            kiln_status st = kiln_tensor_new(out[i]->dtype, out[i]->rank, out[i]->dims, &t);
            atomic_store(&counting, 0);
            kiln_tensor_free(t);
            want += atomic_load(&allocs) - before;
            atomic_store(&allocs, before);
            runs_ok = st == KILN_OK;
        }
#endif
        if (r == 4 && runs_ok && ref) {
            kiln_status st = kiln_exec_run_limited(ref, in, want_out, 0, NULL);
            CHECK(st == KILN_OK, "%s: reference run failed: %s", name, kiln_last_error());
            for (int i = 0; i < g->n_outputs && st == KILN_OK; i++)
                CHECK(rel_diff(out[i], want_out[i]) <= 1e-4,
                      "%s: the plan's output %d differs from the reference by %g", name, i,
                      rel_diff(out[i], want_out[i]));
        }
        for (int i = 0; i < g->n_outputs; i++) {
            kiln_tensor_free(out[i]);
            out[i] = NULL;
        }
    }
    CHECK(runs_ok, "%s: plan run failed: %s", name, kiln_last_error());
#ifdef COUNT_ALLOCS
    if (runs_ok) {
        CHECK(atomic_load(&allocs) == want,
              "%s: 3 warm plan runs made %d allocations, their outputs %d", name,
              atomic_load(&allocs), want);
        printf("%s: a warm plan run allocates its outputs (%d); oneDNN inside it %d times\n",
               name, want / 3, atomic_load(&dnnl_allocs) / 3);
    }
#endif
out:
    kiln_plan_free(p);
    kiln_weight_cache_free(wc);
    for (int i = 0; i < 16; i++) {
        kiln_tensor_free(in[i]);
        kiln_tensor_free(want_out[i]);
    }
}

static void print_line(void *ctx, const char *s)
{
    (void)ctx;
    printf("%s\n", s);
}

static void dump_type(const struct kiln_type *t)
{
    printf("%s[", kiln_dtype_name(t->dtype));
    for (int d = 0; d < t->rank; d++)
        printf("%s%lld%s%s", d ? "," : "", (long long)t->dims[d], t->sym[d] ? ":" : "",
               t->sym[d] ? t->sym[d] : "");
    printf("]%s", t->rank < 0 ? "?" : "");
}

/* Print g's nodes (debugging: unit_opt dump MODEL). */
static void dump_graph(const struct kiln_graph *g)
{
    for (int oi = 0; oi < g->n_nodes; oi++) {
        const struct kiln_node *n = &g->nodes[g->order ? g->order[oi] : oi];
        printf("%s %s(", kiln_op_name(n->op), n->name);
        for (int k = 0; k < n->n_in; k++)
            printf("%s%s", k ? ", " : "", n->in[k] >= 0 ? g->values[n->in[k]].name : "-");
        printf(") -> ");
        for (int k = 0; k < n->n_out; k++) {
            if (n->out[k] < 0) continue;
            printf("%s ", g->values[n->out[k]].name);
            dump_type(&g->values[n->out[k]].type);
        }
        printf("\n");
    }
}


/* ---- small graphs, one per pattern ---- */

typedef void (*build_fn)(struct gb *b);

/* The optimization log: per pass, node counts that chain from the graph as built to the
 * graph as optimized, and positive counts of named kinds. */
static struct kiln_opt_log last_log;
static void check_log(const char *name, const struct kiln_opt_log *log, int before, int after)
{
    CHECK(log->nodes_before == before && log->nodes_after == after,
          "%s: log says %d -> %d nodes, the graphs have %d -> %d", name, log->nodes_before,
          log->nodes_after, before, after);
    CHECK(log->n_passes >= 13, "%s: only %d passes logged", name, log->n_passes);
    int prev = before;
    for (int i = 0; i < log->n_passes; i++) {
        const struct kiln_opt_pass_log *p = &log->passes[i];
        CHECK(p->pass && p->nodes_before == prev, "%s: pass %d (%s) starts at %d nodes, not %d",
              name, i, p->pass ? p->pass : "?", p->nodes_before, prev);
        for (int k = 0; k < p->n_kinds; k++)
            CHECK(p->kinds[k].kind && p->kinds[k].count > 0, "%s: pass %s logs an empty kind",
                  name, p->pass);
        prev = p->nodes_after;
    }
    CHECK(prev == after, "%s: the last pass ends at %d nodes, the graph has %d", name, prev,
          after);
}

/* Build the graph twice (same constants), optimize one, compare; then check op counts. */
static struct kiln_graph *run_case(const char *name, build_fn build, double *diff)
{
    struct gb b1 = gb_new(), b2 = gb_new();
    uint64_t seed = rng_state;
    build(&b1);
    rng_state = seed;
    build(&b2);
    *diff = INFINITY;
    if (!gb_finish(&b1) || !gb_finish(&b2)) {
        CHECK(0, "%s: graph did not build", name);
        kiln_graph_free(b1.g);
        kiln_graph_free(b2.g);
        return NULL;
    }
    struct kiln_opt_log log;
    *diff = compare_graphs(b1.g, b2.g, &log);
    CHECK(*diff <= 1e-4, "%s: optimized outputs differ by %g", name, *diff);
    check_log(name, &log, b1.g->n_nodes, b2.g->n_nodes);
    last_log = log;
    check_plan(name, b2.g, b1.g);
    kiln_graph_free(b1.g);
    return b2.g;
}

/* How many fusions / removals of `kind` the log counts over all passes (kinds that start
 * with `kind` when prefix is set). */
static int log_kind(const struct kiln_opt_log *log, const char *kind, bool prefix)
{
    int n = 0;
    for (int i = 0; i < log->n_passes; i++)
        for (int k = 0; k < log->passes[i].n_kinds; k++) {
            const char *s = log->passes[i].kinds[k].kind;
            if (prefix ? strncmp(s, kind, strlen(kind)) == 0 : strcmp(s, kind) == 0)
                n += log->passes[i].kinds[k].count;
        }
    return n;
}

#define EXPECT_LOG(name, kind, prefix, n)                                                      \
    CHECK(log_kind(&last_log, kind, prefix) == (n), "%s: the log counts %d '%s', expected %d", \
          name, log_kind(&last_log, kind, prefix), kind, n)

#define EXPECT_OPS(g, name, op, n) \
    CHECK(count_op(g, KILN_OP_##op) == (n), "%s: %d %s nodes, expected %d", name, count_op(g, KILN_OP_##op), #op, n)

/* fold + identity + cse + dce */
static void build_simple(struct gb *b)
{
    int64_t d[2] = {3, 5};
    int x = gb_input(b, "x", 2, d);
    int c = gb_op2(b, KILN_OP_Add, gb_rand(b, 2, d, 1, 0), gb_rand(b, 2, d, 1, 0)); /* folds */
    int sh = gb_op1(b, KILN_OP_Shape, x);                                          /* folds */
    int i1 = gb_op1(b, KILN_OP_Identity, x);
    int r0 = gb_op2(b, KILN_OP_Reshape, i1, sh);                                   /* no-op */
    int r = gb_op2(b, KILN_OP_Expand, r0, gb_i64(b, 2, (int64_t[]){1, 5}));        /* no-op */
    int dr = gb_op2(b, KILN_OP_Pad, gb_op1(b, KILN_OP_Dropout, r),
                    gb_i64(b, 4, (int64_t[]){0, 0, 0, 0}));                        /* no-op */
    int r1 = gb_op1(b, KILN_OP_Relu, dr), r2 = gb_op1(b, KILN_OP_Relu, dr);         /* cse */
    int y, in[1] = {gb_op2(b, KILN_OP_Add, gb_op2(b, KILN_OP_Mul, r1, c), r2)};
    struct kiln_node *n = gb_node(b, KILN_OP_Cast, 1, in, 1, &y);                  /* no-op */
    set_int(&n->attr[0], "to", 1);
    gb_op1(b, KILN_OP_Neg, x); /* dead */
    b->out[b->n_out++] = gb_op1(b, KILN_OP_Identity, y); /* Identity writing a graph output */
}

/* Conv (no bias) + BN + bias-free residual + Relu; depthwise Conv + bias Add + SiLU */
static void build_conv(struct gb *b)
{
    int64_t dx[4] = {2, 3, 9, 7}, dw[4] = {5, 3, 3, 3}, dc[1] = {5}, dwd[4] = {5, 1, 3, 3};
    int64_t db[4] = {1, 5, 1, 1};
    int x = gb_input(b, "x", 4, dx);
    int c1 = gb_conv(b, x, gb_rand(b, 4, dw, 0.5, 0), -1, 1, 3, 1, 1);
    int bn, in[5] = {c1, gb_rand(b, 1, dc, 0.5, 1), gb_rand(b, 1, dc, 0.5, 0),
                     gb_rand(b, 1, dc, 0.5, 0), gb_rand(b, 1, dc, 0.4, 0.6)};
    struct kiln_node *n = gb_node(b, KILN_OP_BatchNormalization, 5, in, 1, &bn);
    set_float(&n->attr[0], "epsilon", 1e-3f);
    int r1 = gb_op1(b, KILN_OP_Relu, bn);
    /* depthwise, stride 2, bias as an Add of [1, C, 1, 1], then x * Sigmoid(x) */
    int c2 = gb_conv(b, r1, gb_rand(b, 4, dwd, 0.5, 0), -1, 5, 3, 1, 2);
    int a2 = gb_op2(b, KILN_OP_Add, c2, gb_rand(b, 4, db, 0.5, 0));
    int s2 = gb_op2(b, KILN_OP_Mul, a2, gb_op1(b, KILN_OP_Sigmoid, a2));
    /* 1x1 conv with bias + residual Add + Clip(0, 6) */
    int64_t dp[4] = {5, 5, 1, 1};
    int c3 = gb_conv(b, s2, gb_rand(b, 4, dp, 0.5, 0), gb_rand(b, 1, dc, 0.5, 0), 1, 1, 0, 1);
    int a3 = gb_op2(b, KILN_OP_Add, s2, c3);
    int y, cin[3] = {a3, gb_scalar(b, 0.0f), gb_scalar(b, 6.0f)};
    gb_node(b, KILN_OP_Clip, 3, cin, 0, &y);
    b->out[b->n_out++] = y;
}

/* BatchNormalization after a Conv with a bias and after a Gemm (transB, C a vector): both fold */
static void build_bn_more(struct gb *b)
{
    int64_t dx[4] = {1, 4, 6, 5}, dw[4] = {6, 4, 3, 3}, dc[1] = {6}, da[2] = {3, 7},
            dg[2] = {6, 7};
    int x = gb_input(b, "x", 4, dx), a = gb_input(b, "a", 2, da);
    int c = gb_conv(b, x, gb_rand(b, 4, dw, 0.5, 0), gb_rand(b, 1, dc, 0.5, 0), 1, 3, 1, 1);
    int gin[3] = {a, gb_rand(b, 2, dg, 0.5, 0), gb_rand(b, 1, dc, 0.5, 0)}, gm;
    struct kiln_node *n = gb_node(b, KILN_OP_Gemm, 3, gin, 1, &gm);
    set_int(&n->attr[0], "transB", 1);
    int src[2] = {c, gm};
    for (int i = 0; i < 2; i++) {
        int bn, in[5] = {src[i], gb_rand(b, 1, dc, 0.5, 1), gb_rand(b, 1, dc, 0.5, 0),
                         gb_rand(b, 1, dc, 0.5, 0), gb_rand(b, 1, dc, 0.4, 0.6)};
        gb_node(b, KILN_OP_BatchNormalization, 5, in, 0, &bn);
        b->out[b->n_out++] = bn;
    }
}

/* Conv (no auto_pad) with explicit kernel_shape / pads / strides / dilations of any rank. */
static int gb_conv_nd(struct gb *b, int x, int w, int bias, int nsp, const int64_t *k,
                      const int64_t *pads, const int64_t *strides, const int64_t *dil)
{
    int y, in[3] = {x, w, bias};
    struct kiln_node *n = gb_node(b, KILN_OP_Conv, bias >= 0 ? 3 : 2, in, 4, &y);
    set_ints(b->g, &n->attr[0], "kernel_shape", nsp, k);
    set_ints(b->g, &n->attr[1], "pads", 2 * nsp, pads);
    set_ints(b->g, &n->attr[2], "strides", nsp, strides);
    set_ints(b->g, &n->attr[3], "dilations", nsp, dil);
    return y;
}

static int gb_slice(struct gb *b, int x, int n, const int64_t *starts, const int64_t *ends,
                    const int64_t *axes)
{
    int y, in[4] = {x, gb_i64(b, n, starts), gb_i64(b, n, ends), gb_i64(b, n, axes)};
    gb_node(b, KILN_OP_Slice, 4, in, 0, &y);
    return y;
}

/* Slices of Conv outputs (conv_slice.c): a causal 1-D Conv (dilation 2, pads 4 and 4, the
 * last 4 outputs sliced off) before a BatchNormalization and Relu; a 2-D Conv of stride 2
 * sliced at both ends of H and W by negative and out-of-range indices, its Slice a graph
 * output; and two Slices that stay: one cutting more than the padding, one on channels. */
static void build_conv_slice(struct gb *b)
{
    int64_t dx[3] = {2, 5, 17}, dw[3] = {6, 5, 3}, dc[1] = {6};
    int x = gb_input(b, "x", 3, dx);
    int c1 = gb_conv_nd(b, x, gb_rand(b, 3, dw, 0.5, 0), gb_rand(b, 1, dc, 0.5, 0), 1,
                        (int64_t[]){3}, (int64_t[]){4, 4}, (int64_t[]){1}, (int64_t[]){2});
    int s1 = gb_slice(b, c1, 1, (int64_t[]){0}, (int64_t[]){17}, (int64_t[]){2});
    int bn, in[5] = {s1, gb_rand(b, 1, dc, 0.5, 1), gb_rand(b, 1, dc, 0.5, 0),
                     gb_rand(b, 1, dc, 0.5, 0), gb_rand(b, 1, dc, 0.4, 0.6)};
    gb_node(b, KILN_OP_BatchNormalization, 5, in, 0, &bn);
    b->out[b->n_out++] = gb_op1(b, KILN_OP_Relu, bn);
    /* [1,3,9,8] * [4,3,3,3], stride 2, pads 2 -> [1,4,6,5]; rows 1..4, columns 1..4 */
    int64_t dx2[4] = {1, 3, 9, 8}, dw2[4] = {4, 3, 3, 3};
    int x2 = gb_input(b, "x2", 4, dx2);
    int c2 = gb_conv_nd(b, x2, gb_rand(b, 4, dw2, 0.5, 0), -1, 2, (int64_t[]){3, 3},
                        (int64_t[]){2, 2, 2, 2}, (int64_t[]){2, 2}, (int64_t[]){1, 1});
    b->out[b->n_out++] =
        gb_slice(b, c2, 2, (int64_t[]){1, -4}, (int64_t[]){5, 100}, (int64_t[]){2, -1});
    /* pads 1 and 1: cutting 2 at the end would need a negative pad */
    int c3 = gb_conv_nd(b, x, gb_rand(b, 3, dw, 0.5, 0), -1, 1, (int64_t[]){3},
                        (int64_t[]){1, 1}, (int64_t[]){1}, (int64_t[]){1});
    b->out[b->n_out++] = gb_slice(b, c3, 1, (int64_t[]){0}, (int64_t[]){15}, (int64_t[]){-1});
    int c4 = gb_conv_nd(b, x, gb_rand(b, 3, dw, 0.5, 0), -1, 1, (int64_t[]){3},
                        (int64_t[]){2, 2}, (int64_t[]){1}, (int64_t[]){1});
    b->out[b->n_out++] = gb_slice(b, c4, 1, (int64_t[]){1}, (int64_t[]){4}, (int64_t[]){1});
}

/* Dead taps of dilated convolutions (conv_taps.c): DeepLab's ASPP shape (3x3, dilation 12,
 * pads 12 on a 6x6 image: only the centre tap reads the image), a cut on one axis only, a
 * stride-2 cut, a 1-D cut to the middle three of five taps; and one that stays (dilation 4
 * on 6x6: every tap reads the image for some output). */
static void build_conv_taps(struct gb *b)
{
    int64_t dx[4] = {1, 8, 6, 6}, dw[4] = {4, 8, 3, 3}, dc[1] = {4};
    int x = gb_input(b, "x", 4, dx);
    b->out[b->n_out++] = gb_conv_nd(b, x, gb_rand(b, 4, dw, 0.5, 0), gb_rand(b, 1, dc, 0.5, 0),
                                    2, (int64_t[]){3, 3}, (int64_t[]){12, 12, 12, 12},
                                    (int64_t[]){1, 1}, (int64_t[]){12, 12});
    b->out[b->n_out++] = gb_conv_nd(b, x, gb_rand(b, 4, dw, 0.5, 0), -1, 2, (int64_t[]){3, 3},
                                    (int64_t[]){4, 4, 4, 4}, (int64_t[]){1, 1},
                                    (int64_t[]){4, 4});
    int64_t dx2[4] = {1, 3, 4, 7}, dw2[4] = {2, 3, 3, 3};
    int x2 = gb_input(b, "x2", 4, dx2);
    b->out[b->n_out++] = gb_conv_nd(b, x2, gb_rand(b, 4, dw2, 0.5, 0), -1, 2, (int64_t[]){3, 3},
                                    (int64_t[]){4, 2, 4, 2}, (int64_t[]){1, 1},
                                    (int64_t[]){4, 2});
    int64_t dx3[4] = {1, 2, 3, 3}, dw3[4] = {3, 2, 3, 3};
    int x3 = gb_input(b, "x3", 4, dx3);
    b->out[b->n_out++] = gb_conv_nd(b, x3, gb_rand(b, 4, dw3, 0.5, 0), -1, 2, (int64_t[]){3, 3},
                                    (int64_t[]){3, 3, 3, 3}, (int64_t[]){2, 2},
                                    (int64_t[]){3, 3});
    int64_t dx4[3] = {2, 4, 5}, dw4[3] = {3, 4, 5};
    int x4 = gb_input(b, "x4", 3, dx4);
    b->out[b->n_out++] = gb_conv_nd(b, x4, gb_rand(b, 3, dw4, 0.5, 0), -1, 1, (int64_t[]){5},
                                    (int64_t[]){6, 6}, (int64_t[]){1}, (int64_t[]){3});
}

/* one activation after Conv + residual, selected by act_case */
static int act_case;
#define N_ACT_CASES 11
/* Activation act_case (0..N_ACT_CASES-1) of a: every one the fusions take. */
static int gb_act(struct gb *b, int a)
{
    int y = -1;
    struct kiln_node *n;
    switch (act_case) {
    case 0: y = gb_op1(b, KILN_OP_Relu, a); break;
    case 1: n = gb_node(b, KILN_OP_LeakyRelu, 1, &a, 1, &y); set_float(&n->attr[0], "alpha", 0.3f); break;
    case 2: y = gb_op1(b, KILN_OP_HardSwish, a); break;
    case 3:
        n = gb_node(b, KILN_OP_HardSigmoid, 1, &a, 2, &y);
        set_float(&n->attr[0], "alpha", 0.3f);
        set_float(&n->attr[1], "beta", 0.4f);
        break;
    case 4: y = gb_op1(b, KILN_OP_Sigmoid, a); break;
    case 5: y = gb_op1(b, KILN_OP_Tanh, a); break;
    case 6: y = gb_op1(b, KILN_OP_Gelu, a); break;
    case 7:
        n = gb_node(b, KILN_OP_Gelu, 1, &a, 1, &y);
        set_str(b->g, &n->attr[0], "approximate", "tanh");
        break;
    case 8: {
        int in[3] = {a, gb_scalar(b, -0.5f), -1};
        gb_node(b, KILN_OP_Clip, 2, in, 0, &y);
        break;
    }
    case 9: { /* Relu6 */
        int in[3] = {a, gb_scalar(b, 0.0f), gb_scalar(b, 6.0f)};
        gb_node(b, KILN_OP_Clip, 3, in, 0, &y);
        break;
    }
    default: y = gb_op2(b, KILN_OP_Mul, a, gb_op1(b, KILN_OP_Sigmoid, a)); /* SiLU */
    }
    return y;
}

static void build_conv_act(struct gb *b)
{
    int64_t dx[4] = {1, 4, 6, 5}, dw[4] = {6, 2, 3, 3}, dc[1] = {6}, dy[4] = {1, 6, 6, 5};
    int x = gb_input(b, "x", 4, dx), res = gb_input(b, "res", 4, dy);
    int c = gb_conv(b, x, gb_rand(b, 4, dw, 1, 0), gb_rand(b, 1, dc, 0.5, 0), 2, 3, 1, 1);
    int a = gb_op2(b, KILN_OP_Add, c, res);
    b->out[b->n_out++] = gb_act(b, a);
}

/* 3-D MatMul + bias + activation, and Gemm + activation, for every activation */
static void build_matmul_act(struct gb *b)
{
    int64_t dx[3] = {2, 3, 17}, dm[2] = {17, 19}, dn[1] = {19}, da[2] = {4, 17}, dw[2] = {17, 5};
    int x = gb_input(b, "x", 3, dx), a = gb_input(b, "a", 2, da);
    int m = gb_op2(b, KILN_OP_MatMul, x, gb_rand(b, 2, dm, 0.5, 0));
    b->out[b->n_out++] = gb_act(b, gb_op2(b, KILN_OP_Add, m, gb_rand(b, 1, dn, 1, 0)));
    int g, in[2] = {a, gb_rand(b, 2, dw, 0.5, 0)};
    gb_node(b, KILN_OP_Gemm, 2, in, 0, &g);
    b->out[b->n_out++] = gb_act(b, g);
}

/* Gemm variants and 3-D MatMul + bias + residual + Relu */
static void build_matmul(struct gb *b)
{
    int64_t da[2] = {5, 7}, dw[2] = {3, 5}, dc[1] = {3}, dx[3] = {2, 5, 7}, dm[2] = {7, 9};
    int64_t dn[1] = {9}, dr[3] = {2, 5, 9};
    int a = gb_input(b, "a", 2, da), x = gb_input(b, "x", 3, dx), res = gb_input(b, "res", 3, dr);
    /* Gemm(A^T-free, B^T, alpha, beta) + Tanh: A [5,7]^T is [7,5]: use transA on [5,7] */
    int y1, in[3] = {a, gb_rand(b, 2, dw, 1, 0), gb_rand(b, 1, dc, 1, 0)};
    struct kiln_node *n = gb_node(b, KILN_OP_Gemm, 3, in, 4, &y1);
    set_int(&n->attr[0], "transA", 1);
    set_int(&n->attr[1], "transB", 1);
    set_float(&n->attr[2], "alpha", 0.7f);
    set_float(&n->attr[3], "beta", 0.5f);
    b->out[b->n_out++] = gb_op1(b, KILN_OP_Tanh, y1); /* [7, 3] */
    /* BERT-style: x [2,5,7] @ W [7,9] + b [9] + res, Relu */
    int m = gb_op2(b, KILN_OP_MatMul, x, gb_rand(b, 2, dm, 1, 0));
    int ab = gb_op2(b, KILN_OP_Add, gb_rand(b, 1, dn, 1, 0), m);
    b->out[b->n_out++] = gb_op1(b, KILN_OP_Relu, gb_op2(b, KILN_OP_Add, ab, res));
}

/* PyTorch's LayerNorm and both GELU forms */
static void build_ln_gelu(struct gb *b)
{
    int64_t dx[3] = {2, 3, 11}, dc[1] = {11};
    int x = gb_input(b, "x", 3, dx);
    int ax, ax2;
    struct kiln_node *n = gb_node(b, KILN_OP_ReduceMean, 1, &x, 1, &ax);
    int64_t last = -1;
    set_ints(b->g, &n->attr[0], "axes", 1, &last);
    int d = gb_op2(b, KILN_OP_Sub, x, ax);
    int p = gb_op2(b, KILN_OP_Pow, d, gb_scalar(b, 2.0f));
    n = gb_node(b, KILN_OP_ReduceMean, 1, &p, 1, &ax2);
    set_ints(b->g, &n->attr[0], "axes", 1, &last);
    int s = gb_op1(b, KILN_OP_Sqrt, gb_op2(b, KILN_OP_Add, ax2, gb_scalar(b, 1e-5f)));
    int ln = gb_op2(b, KILN_OP_Add, gb_op2(b, KILN_OP_Mul, gb_op2(b, KILN_OP_Div, d, s),
                                           gb_rand(b, 1, dc, 0.5, 1)),
                    gb_rand(b, 1, dc, 0.5, 0));
    /* erf GELU: x * (1 + erf(x / sqrt2)) * 0.5 */
    int e = gb_op1(b, KILN_OP_Erf, gb_op2(b, KILN_OP_Div, ln, gb_scalar(b, 1.4142135f)));
    int g1 = gb_op2(b, KILN_OP_Mul, gb_op2(b, KILN_OP_Mul, ln, gb_op2(b, KILN_OP_Add, e, gb_scalar(b, 1.0f))),
                    gb_scalar(b, 0.5f));
    /* tanh GELU: (x * 0.5) * (1 + tanh(0.79788 * (x + 0.044715 * x^3))) */
    int cube = gb_op2(b, KILN_OP_Pow, g1, gb_scalar(b, 3.0f));
    int inner = gb_op2(b, KILN_OP_Add, g1, gb_op2(b, KILN_OP_Mul, gb_scalar(b, 0.044715f), cube));
    int t = gb_op1(b, KILN_OP_Tanh, gb_op2(b, KILN_OP_Mul, inner, gb_scalar(b, 0.7978846f)));
    int g2 = gb_op2(b, KILN_OP_Mul, gb_op2(b, KILN_OP_Mul, g1, gb_scalar(b, 0.5f)),
                    gb_op2(b, KILN_OP_Add, gb_scalar(b, 1.0f), t));
    b->out[b->n_out++] = g2;
}

/* SiLU after something other than a convolution or a product (an Add here, a
 * normalization in UNets): x * Sigmoid(x) in both operand orders becomes Swish; a
 * Sigmoid read twice, and a Sigmoid times another value, stay */
static void build_silu(struct gb *b)
{
    int64_t dx[3] = {2, 3, 5}, dc[1] = {5};
    int x = gb_input(b, "x", 3, dx);
    int a = gb_op2(b, KILN_OP_Add, x, gb_rand(b, 1, dc, 2, 0));
    b->out[b->n_out++] = gb_op2(b, KILN_OP_Mul, gb_op1(b, KILN_OP_Sigmoid, a), a);
    int a2 = gb_op2(b, KILN_OP_Mul, x, gb_rand(b, 1, dc, 3, 0));
    b->out[b->n_out++] = gb_op2(b, KILN_OP_Mul, a2, gb_op1(b, KILN_OP_Sigmoid, a2));
    int s3 = gb_op1(b, KILN_OP_Sigmoid, x); /* read twice */
    b->out[b->n_out++] = gb_op2(b, KILN_OP_Mul, x, s3);
    b->out[b->n_out++] = gb_op1(b, KILN_OP_Relu, s3);
    int g4 = gb_op2(b, KILN_OP_Sub, x, gb_rand(b, 1, dc, 1, 0));
    b->out[b->n_out++] = gb_op2(b, KILN_OP_Mul, gb_op1(b, KILN_OP_Sigmoid, g4), x); /* a gate */
}

/* BERT's attention with constant reshape targets, a [B,1,1,T] mask, and a
 * Transpose pair that cancels */
static int gb_transpose(struct gb *b, int x, int r, const int64_t *perm)
{
    int y;
    struct kiln_node *n = gb_node(b, KILN_OP_Transpose, 1, &x, 1, &y);
    set_ints(b->g, &n->attr[0], "perm", r, perm);
    return y;
}

/* Two transposes that do not cancel become one; a pair that cancels goes */
static void build_transposes(struct gb *b)
{
    int64_t dx[3] = {2, 3, 4}, p1[3] = {1, 0, 2}, p2[3] = {0, 2, 1}, p3[3] = {2, 0, 1},
            p3i[3] = {1, 2, 0};
    int x = gb_input(b, "x", 3, dx);
    b->out[b->n_out++] = gb_transpose(b, gb_transpose(b, x, 3, p1), 3, p2);
    b->out[b->n_out++] = gb_op1(b, KILN_OP_Relu, gb_transpose(b, gb_transpose(b, x, 3, p3), 3, p3i));
}

static void build_attention(struct gb *b)
{
    enum { B = 2, S = 5, H = 3, D = 4 };
    int64_t dx[3] = {B, S, H * D}, dmask[4] = {B, 1, 1, S}, dw[2] = {H * D, H * D};
    int64_t p0213[4] = {0, 2, 1, 3}, p0231[4] = {0, 2, 3, 1}, p021[3] = {0, 2, 1};
    int x = gb_input(b, "x", 3, dx), mask = gb_input(b, "mask", 4, dmask);
    int64_t split[4] = {0, 0, H, D}, merge[3] = {0, 0, H * D};
    int sv = gb_i64(b, 4, split), mv = gb_i64(b, 3, merge);
    int q = gb_op2(b, KILN_OP_MatMul, x, gb_rand(b, 2, dw, 0.5, 0));
    int k = gb_op2(b, KILN_OP_MatMul, x, gb_rand(b, 2, dw, 0.5, 0));
    int v = gb_op2(b, KILN_OP_MatMul, x, gb_rand(b, 2, dw, 0.5, 0));
    int q4 = gb_transpose(b, gb_op2(b, KILN_OP_Reshape, q, sv), 4, p0213);
    int k4 = gb_transpose(b, gb_op2(b, KILN_OP_Reshape, k, sv), 4, p0231);
    int v4 = gb_transpose(b, gb_op2(b, KILN_OP_Reshape, v, sv), 4, p0213);
    int sc = gb_op2(b, KILN_OP_Div, gb_op2(b, KILN_OP_MatMul, q4, k4), gb_scalar(b, 2.0f));
    int sm, smin = gb_op2(b, KILN_OP_Add, sc, mask);
    struct kiln_node *n = gb_node(b, KILN_OP_Softmax, 1, &smin, 1, &sm);
    set_int(&n->attr[0], "axis", -1);
    int c = gb_transpose(b, gb_op2(b, KILN_OP_MatMul, sm, v4), 4, p0213);
    int y = gb_op2(b, KILN_OP_Reshape, c, mv);
    int t = gb_transpose(b, gb_transpose(b, y, 3, p021), 3, p021);
    b->out[b->n_out++] = t;
}

/* A Conv whose output is also a graph output must not fuse */
static void build_no_fuse(struct gb *b)
{
    int64_t dx[4] = {1, 2, 4, 4}, dw[4] = {2, 2, 1, 1};
    int x = gb_input(b, "x", 4, dx);
    int c = gb_conv(b, x, gb_rand(b, 4, dw, 1, 0), -1, 1, 1, 0, 1);
    b->out[b->n_out++] = c;
    b->out[b->n_out++] = gb_op1(b, KILN_OP_Relu, c);
}

/* Model state: a variable read has no inputs but is no constant (fold must leave it), two
 * reads of one variable may straddle a write (CSE must not merge them), and a write whose
 * result nobody uses still writes (DCE must keep it). */
static void build_stateful(struct gb *b)
{
    int64_t d[1] = {4};
    kiln_tensor *var = rand_tensor(1, d, 1, 0);
    kiln_graph_own_tensor(b->g, var);
    int x = gb_input(b, "x", 1, d), r[2], w;
    for (int i = 0; i < 2; i++) {
        struct kiln_node *n = gb_node(b, KILN_OP_TfVariable, 0, NULL, 1, &r[i]);
        n->attr[0].name = "var";
        n->attr[0].type = KILN_ATTR_TENSOR;
        n->attr[0].t = var;
    }
    int c = gb_rand(b, 1, d, 1, 0);
    b->out[b->n_out++] = gb_op2(b, KILN_OP_Add, r[0], c);
    b->out[b->n_out++] = gb_op2(b, KILN_OP_Mul, r[1], c);
    struct kiln_node *n = gb_node(b, KILN_OP_TfAssign, 1, &x, 2, &w);
    n->attr[0].name = "var";
    n->attr[0].type = KILN_ATTR_TENSOR;
    n->attr[0].t = var;
    set_str(b->g, &n->attr[1], "mode", "add");
}

/* The input shapes of the plans a cache holds, as kiln_plan_cache_profile_print lists them. */
static char *cached_shapes(struct kiln_plan_cache *pc)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    kiln_plan_cache_profile_print(pc, f);
    fclose(f);
    return buf;
}

/*
 * Plans: one per input shape, in a bounded cache that evicts the least
 * recently used; weights packed once (by the first plan) and shared by every
 * later one; each plan's output equal to the reference executor's.
 */
static void test_plan_cache(void)
{
    struct gb b = gb_new();
    int64_t dx[2] = {-1, 64}, dw[2] = {64, 48}, dn[1] = {48};
    int x = gb_input(&b, "x", 2, dx);
    int m = gb_op2(&b, KILN_OP_MatMul, x, gb_rand(&b, 2, dw, 0.5, 0));
    b.out[b.n_out++] = gb_op1(&b, KILN_OP_Relu, gb_op2(&b, KILN_OP_Add, m, gb_rand(&b, 1, dn, 1, 0)));
    struct kiln_weight_cache *wc = NULL;
    struct kiln_plan_cache *pc = NULL;
    struct kiln_opt_log log;
    struct kiln_opt_options lo = {.layout = 1};
    if (!gb_finish(&b) || kiln_optimize(b.g, &lo, &log) != KILN_OK ||
        kiln_weight_cache_new(&wc) != KILN_OK || kiln_plan_cache_new(2, &pc) != KILN_OK) {
        CHECK(0, "plan cache: setup failed: %s", kiln_last_error());
        goto out;
    }
    static const int64_t batches[] = {1, 2, 1, 3, 1, 2};
    /* what the cache holds after each get (capacity 2, least recently used evicted) */
    static const char *const held[][2] = {{"[1,64]", NULL},     {"[1,64]", "[2,64]"},
                                          {"[1,64]", "[2,64]"}, {"[1,64]", "[3,64]"},
                                          {"[1,64]", "[3,64]"}, {"[1,64]", "[2,64]"}};
    size_t packed = 0;
    for (int i = 0; i < 6; i++) {
        int64_t d[2] = {batches[i], 64};
        kiln_tensor *in = rand_tensor(2, d, 1, 0), *got = NULL, *want = NULL;
        struct kiln_plan *p = NULL;
        kiln_status st = kiln_plan_cache_get(pc, b.g, (const kiln_tensor *const *)&in, wc, 2, 0, &p);
        if (st == KILN_OK) st = kiln_plan_run(p, &in, &got, 2, NULL);
        if (st == KILN_OK) st = kiln_exec_run_limited(b.g, &in, &want, 0, NULL);
        CHECK(st == KILN_OK, "plan cache: batch %lld: %s", (long long)batches[i],
              kiln_last_error());
        if (st == KILN_OK)
            CHECK(rel_diff(got, want) <= 1e-5, "plan cache: batch %lld differs by %g",
                  (long long)batches[i], rel_diff(got, want));
        kiln_plan_cache_release(pc, p);
        size_t now = kiln_weight_cache_bytes(wc);
        if (i == 0) packed = now;
        CHECK(packed >= 64 * 48 * sizeof(float) && now == packed,
              "plan cache: %zu bytes packed after batch %lld, %zu after the first plan", now,
              (long long)batches[i], packed);
        char *shapes = cached_shapes(pc);
        int plans = 0, steps, fast;
        size_t arena;
        kiln_plan_cache_summary(pc, &plans, &steps, &fast, &arena);
        int want_plans = held[i][1] ? 2 : 1;
        CHECK(plans == want_plans, "plan cache: %d plans after get %d, expected %d", plans, i,
              want_plans);
        for (int k = 0; k < 2 && shapes; k++)
            if (held[i][k])
                CHECK(strstr(shapes, held[i][k]) != NULL, "plan cache: %s not cached after get %d:\n%s",
                      held[i][k], i, shapes);
        free(shapes);
        kiln_tensor_free(in);
        kiln_tensor_free(got);
        kiln_tensor_free(want);
    }
out:
    kiln_plan_cache_free(pc);
    kiln_weight_cache_free(wc);
    kiln_graph_free(b.g);
}

/* In-place elementwise steps: a chain of unary ops over one [64, 64] value needs one arena
 * buffer (each op writes over its input once that dies), not two alternating ones. */
static void test_plan_inplace(void)
{
    struct gb b = gb_new();
    int64_t dx[2] = {64, 64};
    int v = gb_op1(&b, KILN_OP_Relu, gb_input(&b, "x", 2, dx));
    v = gb_op1(&b, KILN_OP_Tanh, v);
    v = gb_op1(&b, KILN_OP_Sigmoid, v);
    b.out[b.n_out++] = gb_op1(&b, KILN_OP_Neg, v);
    struct kiln_weight_cache *wc = NULL;
    struct kiln_plan *p = NULL;
    kiln_tensor *in = NULL;
    if (gb_finish(&b) && kiln_weight_cache_new(&wc) == KILN_OK &&
        (in = rand_tensor(2, dx, 1, 0)) != NULL &&
        kiln_plan_compile(b.g, (const kiln_tensor *const *)&in, wc, 1, &p) == KILN_OK) {
        CHECK(kiln_plan_arena_bytes(p) == 64 * 64 * sizeof(float),
              "in place: arena of %zu bytes for a chain of unary ops on 16384-byte values",
              kiln_plan_arena_bytes(p));
        check_plan("in place", b.g, b.g);
    } else {
        CHECK(0, "in place: no plan: %s", kiln_last_error());
    }
    kiln_plan_free(p);
    kiln_weight_cache_free(wc);
    kiln_tensor_free(in);
    kiln_graph_free(b.g);
}

/* Two Inception-like modules: four branches from one input (1x1; 1x1 then 3x3; 1x1 then
 * 3x3 then 3x3; MaxPool then 1x1) joined by a Concat, the second module's input that
 * Concat; last, a Sigmoid of the module's input (an elementwise op that could write over
 * the input it reads last, while the other branches still read it) added to the output. */
static int inception_module(struct gb *b, int x, int64_t c)
{
    int64_t w1[4] = {16, c, 1, 1}, w3[4] = {16, 16, 3, 3}, bd[1] = {16};
    int br[4];
    br[0] = gb_op1(b, KILN_OP_Relu, gb_conv(b, x, gb_rand(b, 4, w1, 0.3, 0), gb_rand(b, 1, bd, 0.1, 0), 1, 1, 0, 1));
    int t = gb_op1(b, KILN_OP_Relu, gb_conv(b, x, gb_rand(b, 4, w1, 0.3, 0), -1, 1, 1, 0, 1));
    br[1] = gb_op1(b, KILN_OP_Relu, gb_conv(b, t, gb_rand(b, 4, w3, 0.2, 0), -1, 1, 3, 1, 1));
    t = gb_op1(b, KILN_OP_Relu, gb_conv(b, x, gb_rand(b, 4, w1, 0.3, 0), -1, 1, 1, 0, 1));
    t = gb_op1(b, KILN_OP_Relu, gb_conv(b, t, gb_rand(b, 4, w3, 0.2, 0), -1, 1, 3, 1, 1));
    br[2] = gb_op1(b, KILN_OP_Relu, gb_conv(b, t, gb_rand(b, 4, w3, 0.2, 0), -1, 1, 3, 1, 1));
    int mp;
    struct kiln_node *n = gb_node(b, KILN_OP_MaxPool, 1, &x, 2, &mp);
    int64_t ks[2] = {3, 3}, pads[4] = {1, 1, 1, 1};
    set_ints(b->g, &n->attr[0], "kernel_shape", 2, ks);
    set_ints(b->g, &n->attr[1], "pads", 4, pads);
    br[3] = gb_op1(b, KILN_OP_Relu, gb_conv(b, mp, gb_rand(b, 4, w1, 0.3, 0), -1, 1, 1, 0, 1));
    int y;
    n = gb_node(b, KILN_OP_Concat, 4, br, 1, &y);
    set_int(&n->attr[0], "axis", 1);
    return y;
}

static void build_inception(struct gb *b)
{
    int64_t dx[4] = {1, 32, 12, 12};
    int x = gb_input(b, "x", 4, dx);
    int m1 = inception_module(b, x, 32);
    int m2 = inception_module(b, m1, 64);
    b->out[b->n_out++] = gb_op2(b, KILN_OP_Add, m2, gb_op1(b, KILN_OP_Sigmoid, m1));
}

/* Lanes (plan.c): on two threads the Inception modules' branches run side by side, and
 * the plan's output still matches the reference executor's (run_case checks the plan on
 * two threads; here it is compiled again to see that lanes were taken). */
static void test_plan_lanes(void)
{
    double d;
    struct kiln_graph *g = run_case("inception lanes", build_inception, &d);
    if (!g) return;
    kiln_tensor *in[4] = {NULL};
    struct kiln_weight_cache *wc = NULL;
    struct kiln_plan *p = NULL;
    if (make_inputs(g, in) && kiln_weight_cache_new(&wc) == KILN_OK &&
        kiln_plan_compile(g, (const kiln_tensor *const *)in, wc, 2, &p) == KILN_OK) {
        if (kiln_cpu_count() >= 2)
            CHECK(kiln_plan_lane_steps(p) > 0, "inception lanes: no steps in lanes (%d steps)",
                  kiln_plan_steps(p));
        else
            printf("inception lanes: one CPU, lanes not expected\n");
        setenv("KILN_LANES", "0", 1);
        struct kiln_plan *q = NULL;
        if (kiln_plan_compile(g, (const kiln_tensor *const *)in, wc, 2, &q) == KILN_OK)
            CHECK(kiln_plan_lane_steps(q) == 0, "inception lanes: KILN_LANES=0 left %d steps in lanes",
                  kiln_plan_lane_steps(q));
        kiln_plan_free(q);
        unsetenv("KILN_LANES");
    } else {
        CHECK(0, "inception lanes: no plan: %s", kiln_last_error());
    }
    kiln_plan_free(p);
    kiln_weight_cache_free(wc);
    for (int i = 0; i < 4; i++) kiln_tensor_free(in[i]);
    kiln_graph_free(g);
}

/* DenseNet-style dense block (plan.c, Concat folded into its reader): a 3x3 Conv gives
 * f0 of c0 channels; each of three layers reads Concat(f0, f1, ...) through
 * BatchNormalization and Relu (a depthwise 1x1 Conv once optimized: a per-channel
 * reader), then a 1x1 Conv of 16 channels, BatchNormalization, Relu and a 3x3 Conv of
 * `growth` channels (f_l); the block's last Concat goes through BatchNormalization and
 * Clip(0, 6) to a 1x1 Conv, the output. */
static int64_t dense_n, dense_c0, dense_growth;

static int dense_bn(struct gb *b, int x, int64_t c)
{
    int64_t dc[1] = {c};
    int bn, in[5] = {x, gb_rand(b, 1, dc, 0.5, 1), gb_rand(b, 1, dc, 0.5, 0),
                     gb_rand(b, 1, dc, 0.5, 0), gb_rand(b, 1, dc, 0.4, 0.6)};
    gb_node(b, KILN_OP_BatchNormalization, 5, in, 0, &bn);
    return bn;
}

static int dense_concat(struct gb *b, int n, const int *f)
{
    int y;
    struct kiln_node *nd = gb_node(b, KILN_OP_Concat, n, f, 1, &y);
    set_int(&nd->attr[0], "axis", 1);
    return y;
}

static void build_dense(struct gb *b)
{
    int64_t dx[4] = {dense_n, 8, 9, 7}, w0[4] = {dense_c0, 8, 3, 3}, b0[1] = {dense_c0};
    int x = gb_input(b, "x", 4, dx);
    int f[8], nf = 0;
    f[nf++] = gb_op1(b, KILN_OP_Relu, gb_conv(b, x, gb_rand(b, 4, w0, 0.3, 0),
                                              gb_rand(b, 1, b0, 0.1, 0), 1, 3, 1, 1));
    int64_t c = dense_c0;
    for (int l = 0; l < 3; l++) {
        int t = gb_op1(b, KILN_OP_Relu, dense_bn(b, dense_concat(b, nf, f), c));
        int64_t w1[4] = {16, c, 1, 1}, b1[1] = {16}, w3[4] = {dense_growth, 16, 3, 3};
        t = gb_conv(b, t, gb_rand(b, 4, w1, 0.3, 0), gb_rand(b, 1, b1, 0.1, 0), 1, 1, 0, 1);
        t = gb_op1(b, KILN_OP_Relu, dense_bn(b, t, 16));
        f[nf++] = gb_conv(b, t, gb_rand(b, 4, w3, 0.2, 0), -1, 1, 3, 1, 1);
        c += dense_growth;
    }
    int y, cin[3] = {dense_bn(b, dense_concat(b, nf, f), c), gb_scalar(b, 0.0f),
                     gb_scalar(b, 6.0f)};
    gb_node(b, KILN_OP_Clip, 3, cin, 0, &y);
    int64_t wo[4] = {8, c, 1, 1};
    b->out[b->n_out++] = gb_conv(b, y, gb_rand(b, 4, wo, 0.3, 0), -1, 1, 1, 0, 1);
}

/* The dense block at batch n with c0 and growth channels, optimized with or without the
 * layout pass, compiled on 1 and 2 threads: the plan's output matches the reference
 * executor's on the graph as built, and the Concats a per-channel reader can take are
 * folded into it: at batch 1 none (their inputs are written in place: a Concat left
 * copying, an off-block one, may fold), at batch > 1 each whose output is plain or
 * whose inputs but the last are whole channel blocks of its layout. */
static void check_dense(int64_t n, int64_t c0, int64_t growth, int layout)
{
    char name[96];
    snprintf(name, sizeof name, "dense block (batch %lld, %lld + 3 x %lld channels, layout %s)",
             (long long)n, (long long)c0, (long long)growth, layout ? "pass" : "off");
    dense_n = n, dense_c0 = c0, dense_growth = growth;
    struct gb b1 = gb_new(), b2 = gb_new();
    uint64_t seed = rng_state;
    build_dense(&b1);
    rng_state = seed;
    build_dense(&b2);
    kiln_tensor *in[4] = {NULL}, *want[4] = {NULL}, *got[4] = {NULL};
    struct kiln_weight_cache *wc = NULL;
    struct kiln_opt_options o = {layout};
    struct kiln_opt_log log;
    if (!gb_finish(&b1) || !gb_finish(&b2) || kiln_optimize(b2.g, &o, &log) != KILN_OK ||
        !make_inputs(b1.g, in) || kiln_exec_run_limited(b1.g, in, want, 0, NULL) != KILN_OK ||
        kiln_weight_cache_new(&wc) != KILN_OK) {
        CHECK(0, "%s: setup failed: %s", name, kiln_last_error());
        goto out;
    }
    /* which Concats the rule allows to fold (batch > 1) */
    int concats = 0, foldable = 0, blocked = 0;
    for (int i = 0; i < b2.g->n_nodes; i++) {
        const struct kiln_node *nd = &b2.g->nodes[i];
        if (nd->op != KILN_OP_Concat) continue;
        concats++;
        int lo = b2.g->values[nd->out[0]].layout;
        blocked |= lo != 0;
        bool whole = true;
        for (int k = 0; k + 1 < nd->n_in && lo; k++)
            whole = whole && b2.g->values[nd->in[k]].type.dims[1] % lo == 0;
        foldable += whole;
    }
    CHECK(concats == 4, "%s: %d Concats in the optimized graph, not 4", name, concats);
    if (layout) printf("%s: Concats %s\n", name, blocked ? "blocked" : "plain (no blocked layout here)");
    for (int threads = 1; threads <= 2; threads++) {
        struct kiln_plan *p = NULL;
        if (kiln_plan_compile(b2.g, (const kiln_tensor *const *)in, wc, threads, &p) != KILN_OK) {
            CHECK(0, "%s: no plan on %d threads: %s", name, threads, kiln_last_error());
            continue;
        }
        int folded = kiln_plan_concat_folded(p), removed = kiln_plan_concat_removed(p);
        if (n > 1)
            CHECK(folded == foldable && removed == 0,
                  "%s, %d threads: %d Concats folded into their reader and %d removed, want %d "
                  "and 0", name, threads, folded, removed, foldable);
        else
            CHECK(folded + removed <= concats && removed > 0,
                  "%s, %d threads: %d Concats folded, %d removed (in place) of %d", name, threads,
                  folded, removed, concats);
        for (int r = 0; r < 2; r++) {
            kiln_tensor_free(got[0]);
            got[0] = NULL;
            if (kiln_plan_run(p, in, got, threads, NULL) != KILN_OK) {
                CHECK(0, "%s: run failed: %s", name, kiln_last_error());
                break;
            }
            double d = rel_diff(got[0], want[0]);
            CHECK(d <= 1e-4, "%s, %d threads, run %d: the plan's output differs from the "
                  "reference by %g", name, threads, r, d);
        }
        printf("%s, %d threads: %d steps, %d Concats folded, %d removed\n", name, threads,
               kiln_plan_steps(p), folded, removed);
        kiln_plan_free(p);
    }
out:
    kiln_weight_cache_free(wc);
    for (int i = 0; i < 4; i++) {
        kiln_tensor_free(in[i]);
        kiln_tensor_free(want[i]);
        kiln_tensor_free(got[i]);
    }
    kiln_graph_free(b1.g);
    kiln_graph_free(b2.g);
}

static void test_plan_concat_fold(void)
{
    for (int layout = 0; layout <= 1; layout++) {
        check_dense(2, 32, 16, layout); /* whole blocks of 8 and 16 */
        check_dense(3, 19, 5, layout);  /* off-block: blocked Concats of several inputs copy */
        check_dense(1, 32, 16, layout); /* batch 1: in place */
    }
    /* KILN_CONCAT_FOLD=0: the Concats copy, the outputs are the same */
    setenv("KILN_CONCAT_FOLD", "0", 1);
    dense_n = 2, dense_c0 = 32, dense_growth = 16;
    struct gb b = gb_new();
    build_dense(&b);
    kiln_tensor *in[4] = {NULL};
    struct kiln_weight_cache *wc = NULL;
    struct kiln_plan *p = NULL;
    struct kiln_opt_options o = {1};
    struct kiln_opt_log log;
    if (gb_finish(&b) && kiln_optimize(b.g, &o, &log) == KILN_OK && make_inputs(b.g, in) &&
        kiln_weight_cache_new(&wc) == KILN_OK &&
        kiln_plan_compile(b.g, (const kiln_tensor *const *)in, wc, 2, &p) == KILN_OK)
        CHECK(kiln_plan_concat_folded(p) == 0, "KILN_CONCAT_FOLD=0 folded %d Concats",
              kiln_plan_concat_folded(p));
    else
        CHECK(0, "dense block, KILN_CONCAT_FOLD=0: no plan: %s", kiln_last_error());
    unsetenv("KILN_CONCAT_FOLD");
    kiln_plan_free(p);
    kiln_weight_cache_free(wc);
    for (int i = 0; i < 4; i++) kiln_tensor_free(in[i]);
    kiln_graph_free(b.g);
}

static void test_small(void)
{
    double d;
    struct kiln_graph *g;
    if ((g = run_case("simple", build_simple, &d))) {
        /* left: Mul, Add, Relu (Identity/Dropout/Reshape/Expand/Pad/Cast/Shape/dead Neg/Add
         * gone) */
        CHECK(g->n_nodes == 3, "simple: %d nodes left, expected 3", g->n_nodes);
        if (g->n_nodes != 3) dump_graph(g);
        EXPECT_OPS(g, "simple", Relu, 1);
        EXPECT_LOG("simple", "Identity", false, 2);
        EXPECT_LOG("simple", "Dropout", false, 1);
        EXPECT_LOG("simple", "Reshape", false, 1);
        EXPECT_LOG("simple", "Expand", false, 1);
        EXPECT_LOG("simple", "Cast", false, 1);
        EXPECT_LOG("simple", "Pad", false, 1);
        EXPECT_LOG("simple", "Relu", false, 1); /* CSE */
        CHECK(g->outputs[0] == g->nodes[g->order[g->n_nodes - 1]].out[0] ||
                  g->values[g->outputs[0]].kind == KILN_VALUE_NODE,
              "simple: output value not produced");
        kiln_graph_free(g);
    }
    if ((g = run_case("conv", build_conv, &d))) {
        EXPECT_OPS(g, "conv", BatchNormalization, 0);
        EXPECT_OPS(g, "conv", KilnFusedConv, 3);
        EXPECT_LOG("conv", "Conv+BatchNormalization", false, 1);
        EXPECT_LOG("conv", "Conv+", true, 4); /* + BN, and 3 fused convolutions */
        CHECK(g->n_nodes == 3, "conv: %d nodes left, expected 3", g->n_nodes);
        kiln_graph_free(g);
    }
    if ((g = run_case("bn more", build_bn_more, &d))) {
        EXPECT_OPS(g, "bn more", BatchNormalization, 0);
        EXPECT_LOG("bn more", "Conv+BatchNormalization", false, 1);
        EXPECT_LOG("bn more", "Gemm+BatchNormalization", false, 1);
        kiln_graph_free(g);
    }
    if ((g = run_case("conv slice", build_conv_slice, &d))) {
        EXPECT_LOG("conv slice", "Conv+Slice", false, 2);
        EXPECT_OPS(g, "conv slice", Slice, 2);
        EXPECT_OPS(g, "conv slice", BatchNormalization, 0);
        EXPECT_LOG("conv slice", "Conv+BatchNormalization", false, 1);
        CHECK(g->n_nodes == 6, "conv slice: %d nodes left, expected 6", g->n_nodes);
        if (g->n_nodes != 6) dump_graph(g);
        kiln_graph_free(g);
    }
    if ((g = run_case("conv taps", build_conv_taps, &d))) {
        EXPECT_LOG("conv taps", "Conv taps cut", false, 4);
        int64_t kept[5] = {0};
        int nc = 0;
        for (int i = 0; i < g->n_nodes && nc < 5; i++)
            if (g->nodes[i].op == KILN_OP_Conv || g->nodes[i].op == KILN_OP_KilnFusedConv)
                kept[nc++] = kiln_shape_count(g->values[g->nodes[i].in[1]].type.rank,
                                              g->values[g->nodes[i].in[1]].type.dims);
        /* weights left: 4*8*1*1, 4*8*3*3, 2*3*1*3, 3*2*1*1, 3*4*3 (in graph order) */
        CHECK(nc == 5 && kept[0] == 32 && kept[1] == 288 && kept[2] == 18 && kept[3] == 6 &&
                  kept[4] == 36,
              "conv taps: weights of %lld %lld %lld %lld %lld elements", (long long)kept[0],
              (long long)kept[1], (long long)kept[2], (long long)kept[3], (long long)kept[4]);
        kiln_graph_free(g);
    }
    for (act_case = 0; act_case < N_ACT_CASES; act_case++) {
        char name[32];
        snprintf(name, sizeof name, "conv act %d", act_case);
        if ((g = run_case(name, build_conv_act, &d))) {
            CHECK(g->n_nodes == 1 && g->nodes[0].op == KILN_OP_KilnFusedConv,
                  "%s: %d nodes, first %s", name, g->n_nodes, kiln_op_name(g->nodes[0].op));
            kiln_graph_free(g);
        }
    }
    for (act_case = 0; act_case < N_ACT_CASES; act_case++) {
        char name[32];
        snprintf(name, sizeof name, "matmul act %d", act_case);
        if ((g = run_case(name, build_matmul_act, &d))) {
            CHECK(g->n_nodes == 2 && count_op(g, KILN_OP_KilnFusedMatMul) == 2,
                  "%s: %d nodes, %d KilnFusedMatMul", name, g->n_nodes,
                  count_op(g, KILN_OP_KilnFusedMatMul));
            kiln_graph_free(g);
        }
    }
    if ((g = run_case("matmul", build_matmul, &d))) {
        EXPECT_OPS(g, "matmul", KilnFusedMatMul, 2);
        CHECK(log_kind(&last_log, "MatMul+", true) + log_kind(&last_log, "Gemm+", true) == 2,
              "matmul: the log counts %d MatMul / Gemm fusions, expected 2",
              log_kind(&last_log, "MatMul+", true) + log_kind(&last_log, "Gemm+", true));
        CHECK(g->n_nodes == 2, "matmul: %d nodes left, expected 2", g->n_nodes);
        kiln_graph_free(g);
    }
    if ((g = run_case("layernorm+gelu", build_ln_gelu, &d))) {
        EXPECT_OPS(g, "layernorm+gelu", LayerNormalization, 1);
        EXPECT_OPS(g, "layernorm+gelu", Gelu, 2);
        EXPECT_LOG("layernorm+gelu", "LayerNormalization", false, 1);
        EXPECT_LOG("layernorm+gelu", "Gelu(", true, 2);
        CHECK(g->n_nodes == 3, "layernorm+gelu: %d nodes left, expected 3", g->n_nodes);
        kiln_graph_free(g);
    }
    if ((g = run_case("silu", build_silu, &d))) {
        EXPECT_OPS(g, "silu", Swish, 2);
        EXPECT_OPS(g, "silu", Sigmoid, 2);
        EXPECT_LOG("silu", "Swish(SiLU)", false, 2);
        kiln_graph_free(g);
    }
    if ((g = run_case("transposes", build_transposes, &d))) {
        EXPECT_OPS(g, "transposes", Transpose, 1);
        EXPECT_LOG("transposes", "Transpose+Transpose", false, 1);
        EXPECT_LOG("transposes", "Transpose+inverse", false, 1);
        kiln_graph_free(g);
    }
    if ((g = run_case("attention", build_attention, &d))) {
        EXPECT_OPS(g, "attention", Attention, 1);
        EXPECT_OPS(g, "attention", Transpose, 0);
        EXPECT_OPS(g, "attention", Softmax, 0);
        EXPECT_LOG("attention", "Attention", false, 1);
        EXPECT_LOG("attention", "Transpose+inverse", false, 1);
        kiln_graph_free(g);
    }
    if ((g = run_case("stateful", build_stateful, &d))) {
        EXPECT_OPS(g, "stateful", TfVariable, 2);
        EXPECT_OPS(g, "stateful", TfAssign, 1);
        kiln_graph_free(g);
    }
    if ((g = run_case("no fuse", build_no_fuse, &d))) {
        EXPECT_OPS(g, "no fuse", KilnFusedConv, 0);
        kiln_graph_free(g);
    }
}

/* ---- benchmark models ---- */

/* Load an ONNX model with the importer only (no session preparation). */
static struct kiln_model *load_model(const char *path, const char *dir)
{
    struct kiln_model *m = calloc(1, sizeof *m);
    struct kiln_file_map map;
    if (!m || kiln_file_map(path, &map) != KILN_OK) {
        free(m);
        return NULL;
    }
    if (kiln_onnx_load_file(&map, dir, m) != KILN_OK) {
        fprintf(stderr, "load %s: %s\n", path, kiln_last_error());
        kiln_graph_free(m->graph);
        if (m->proto_free && m->proto) m->proto_free(m->proto);
        free(m->copies);
        free(m);
        return NULL;
    }
    return m;
}

static void free_model(struct kiln_model *m)
{
    if (!m) return;
    kiln_graph_free(m->graph);
    if (m->proto_free && m->proto) m->proto_free(m->proto);
    for (int i = 0; i < m->n_maps; i++) kiln_file_unmap(&m->maps[i]);
    free(m->maps);
    free(m->copies);
    free(m);
}

static void test_model(const char *name, int optional, int *before, int *after)
{
    char path[640], dir[512];
    const char *cache = getenv("KILN_TEST_MODELS");
    snprintf(dir, sizeof dir, "%s/%s", cache && *cache ? cache : KILN_SOURCE_DIR "/bench/models",
             name);
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    if (access(path, R_OK) != 0 && optional) { /* only bench/models holds it */
        snprintf(dir, sizeof dir, "%s/bench/models/%s", KILN_SOURCE_DIR, name);
        snprintf(path, sizeof path, "%s/model.onnx", dir);
        if (access(path, R_OK) != 0) {
            printf("not checked: %s (not exported for the tests; "
                   "tools/export_models.py --out bench/models adds it)\n", name);
            return;
        }
    }
    if (access(path, R_OK) != 0) {
        CHECK_SKIP("%s: %s not present (KILN_TEST_MODELS names the folder that "
                   "tools/cache_test_models.py fills)", name, path);
        return;
    }
    struct kiln_model *m1 = load_model(path, dir), *m2 = load_model(path, dir);
    CHECK(m1 && m2, "%s: loading failed", name);
    if (!m1 || !m2) goto out;
    struct kiln_graph *g1 = m1->graph, *g2 = m2->graph;
    struct kiln_opt_log log;
    *before = g1->n_nodes;
    double d = compare_graphs(g1, g2, &log);
    *after = g2->n_nodes;
    printf("%s: %d -> %d nodes, rel diff %.3g\n", name, *before, *after, d);
    kiln_opt_log_print(&log, print_line, NULL);
    CHECK(d <= 1e-4, "%s: optimized outputs differ by %g", name, d);
    { /* optimized as sessions do it: convolution chains blocked too */
        struct kiln_model *m3 = load_model(path, dir);
        struct kiln_opt_options lo = {.layout = 1};
        struct kiln_opt_log log3;
        if (m3 && kiln_optimize(m3->graph, &lo, &log3) == KILN_OK)
            check_plan(name, m3->graph, g1);
        else
            CHECK(0, "%s: optimizing with the layout pass failed: %s", name, kiln_last_error());
        free_model(m3);
    }
    CHECK(*after < *before, "%s: optimizer removed nothing", name);
    CHECK(count_op(g2, KILN_OP_BatchNormalization) == 0, "%s: BatchNormalization left", name);
    CHECK(count_op(g2, KILN_OP_Identity) == 0, "%s: Identity left", name);
    CHECK(count_op(g2, KILN_OP_Constant) == 0, "%s: Constant left", name);
    /* ResNet's shortcut projections (3 in resnet18, 4 in resnet50) become the Sum of the
     * block's last conv; MobileNet's and EfficientNet's linear bottlenecks have nothing
     * to fuse: only those stay plain Convs */
    if (strcmp(name, "resnet18") == 0 || strcmp(name, "resnet50") == 0)
        CHECK(count_op(g2, KILN_OP_Conv) == (name[6] == '1' ? 3 : 4), "%s: %d unfused Conv left",
              name, count_op(g2, KILN_OP_Conv));
    CHECK(count_op(g2, KILN_OP_Relu) == 0 || strcmp(name, "dlrm") == 0,
          "%s: %d Relu left", name, count_op(g2, KILN_OP_Relu));
    CHECK(count_op(g2, KILN_OP_Clip) == 0, "%s: Clip left", name);
    if (strcmp(name, "efficientnet_b0") == 0)
        CHECK(count_op(g2, KILN_OP_Sigmoid) == 0, "%s: Sigmoid left", name);
    if (strcmp(name, "bert_small") == 0) {
        CHECK(count_op(g2, KILN_OP_LayerNormalization) == 9, "bert_small: %d LayerNormalization",
              count_op(g2, KILN_OP_LayerNormalization));
        CHECK(count_op(g2, KILN_OP_Attention) == 4, "bert_small: %d Attention",
              count_op(g2, KILN_OP_Attention));
        CHECK(count_op(g2, KILN_OP_KilnFusedMatMul) == 24, "bert_small: %d KilnFusedMatMul",
              count_op(g2, KILN_OP_KilnFusedMatMul));
        CHECK(count_op(g2, KILN_OP_MatMul) == 0 && count_op(g2, KILN_OP_Softmax) == 0 &&
                  count_op(g2, KILN_OP_Erf) == 0 && count_op(g2, KILN_OP_Transpose) == 0,
              "bert_small: unfused MatMul / Softmax / Erf / Transpose left");
    }
    if (strcmp(name, "tabular_mlp") == 0 || strcmp(name, "dlrm") == 0)
        CHECK(count_op(g2, KILN_OP_Gemm) == 0 && count_op(g2, KILN_OP_Relu) == 0,
              "%s: Gemm or Relu left", name);
out:
    free_model(m1);
    free_model(m2);
}

static void test_models(void)
{
    int b, a;
    static const char *names[] = {"resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0",
                                  "bert_small", "tabular_mlp", "dlrm"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        b = a = 0;
#if defined(__SANITIZE_ADDRESS__)
        /* the two biggest convnets take most of a minute under the sanitizers */
        if (strcmp(names[i], "resnet50") == 0 || strcmp(names[i], "efficientnet_b0") == 0) {
            printf("skip %s under the sanitizers (slow)\n", names[i]);
            continue;
        }
#endif
        test_model(names[i], strcmp(names[i], "resnet50") == 0, &b, &a);
    }
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "dump") == 0) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s", argv[2]);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        struct kiln_model *m = load_model(argv[2], slash ? dir : ".");
        if (!m) return 1;
        struct kiln_opt_log log;
        struct kiln_opt_options o = {0};
        if (argc > 3) dump_graph(m->graph);
        kiln_status st = kiln_optimize(m->graph, &o, &log);
        dump_graph(m->graph);
        if (st != KILN_OK) printf("optimize: %s\n", kiln_last_error());
        free_model(m);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "small") == 0) {
        test_small();
        test_plan_cache();
        test_plan_inplace();
        test_plan_lanes();
        test_plan_concat_fold();
        return CHECK_DONE();
    }
    if (argc > 1 && strcmp(argv[1], "concat") == 0) {
        test_plan_concat_fold();
        return CHECK_DONE();
    }
    if (argc > 1 && strcmp(argv[1], "models") == 0) {
        test_models();
        return CHECK_DONE();
    }
    test_small();
    test_plan_cache();
    test_plan_inplace();
    test_plan_lanes();
    test_plan_concat_fold();
    test_models();
    return CHECK_DONE();
}
