/*
 * unit_dnnl.c - the oneDNN fast kernels (src/kernels/dnnl/) against the
 * reference kernels, the KilnReorder kernels, the layout pass, and the fused
 * inverted-residual kernel (KilnMBConv, src/kernels/simd/mbconv.c), which
 * runs on the same blocked layouts.
 *
 * Each case builds a one-node graph, runs the reference kernel
 * (kiln_op_impl) and the fast kernel (compiled as a plan would: concrete
 * types, constant weights, layouts, a weight cache, scratch; outputs
 * filled with NaN first so an unwritten element shows), and compares
 * within 1e-4 of the output's scale. Shapes cover edge sizes (channels 1,
 * 3, 15, 16, 17, 33; 1x1 and odd spatial sizes; groups, depthwise;
 * strides, dilations, asymmetric and auto pads; matmul sizes 1, 15, 16,
 * 17, 65; batched and broadcast products) and blocked layouts (inputs
 * blocked by the reference KilnReorder, outputs read back through it).
 * The layout pass runs on a small conv network, and the blocked graph,
 * run node by node with the fast kernels, must match the plain reference.
 *
 * KILN_VERBOSE=1 also prints GFLOP/s of a 3x3 conv 64->64 at 56x56.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blocked_layout.h"
#include "check.h"
#include "core/threadpool.h"
#include "kernels/dnnl/dnnl_common.h"
#include "kernels/simd/mbconv.h"
#include "kernels/fast.h"
#include "kernels/kernel.h"
#include "opt/opt.h"

static int g_threads = 2;
static struct kiln_weight_cache *g_cache;

/* ---- random data ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static kiln_tensor *rand_tensor(int rank, const int64_t *dims)
{
    kiln_tensor *t;
    if (kiln_tensor_new(KILN_DTYPE_F32, rank, dims, &t) != KILN_OK) abort();
    float *d = t->data;
    for (int64_t i = 0; i < kiln_tensor_count(t); i++) d[i] = frand();
    return t;
}

/* ---- one-node graphs ---- */

/* most inputs of a node under test (KilnMBConv with a squeeze-excitation) */
#define TG_MAX_IN 12

struct tg {
    struct kiln_graph *g;
    int node;
    kiln_tensor *in[TG_MAX_IN];     /* input values (borrowed: consts are owned by the graph) */
    int n_in;
    struct kiln_weight_cache *wc; /* per graph: the cache keys on weight addresses */
};

static void tg_init(struct tg *t, enum kiln_op op, int n_in, int n_attr)
{
    memset(t, 0, sizeof *t);
    if (kiln_graph_new(&t->g) != KILN_OK || kiln_weight_cache_new(&t->wc) != KILN_OK) abort();
    struct kiln_node *n;
    if (kiln_graph_node_add(t->g, op, "node", n_in, 1, n_attr, &n) != KILN_OK) abort();
    n->n_attr = 0;
    t->n_in = n_in;
    int id;
    if (kiln_graph_value_add(t->g, "y", KILN_VALUE_NODE, &id) != KILN_OK) abort();
    t->g->values[id].producer = 0;
    t->g->nodes[0].out[0] = id;
}

static struct kiln_node *tg_node(struct tg *t) { return &t->g->nodes[0]; }

static void tg_free(struct tg *t)
{
    kiln_graph_free(t->g);
    kiln_weight_cache_free(t->wc);
}

/* Input i: x (owned by the graph), a constant when konst. */
static void tg_in(struct tg *t, int i, kiln_tensor *x, int konst)
{
    int id;
    if (!x) return;
    if (kiln_graph_value_add(t->g, konst ? "w" : "x", konst ? KILN_VALUE_CONST : KILN_VALUE_INPUT,
                             &id) != KILN_OK)
        abort();
    kiln_graph_own_tensor(t->g, x);
    kiln_type_from_tensor(&t->g->values[id].type, x);
    if (konst) t->g->values[id].konst = x;
    tg_node(t)->in[i] = id;
    t->in[i] = x;
}

static struct kiln_attr *tg_attr(struct tg *t, const char *name, enum kiln_attr_type type)
{
    struct kiln_node *n = tg_node(t);
    struct kiln_attr *a = &n->attr[n->n_attr++];
    a->name = kiln_arena_strdup(t->g->mem, name);
    a->type = type;
    return a;
}

static void attr_int(struct tg *t, const char *name, int64_t v) { tg_attr(t, name, KILN_ATTR_INT)->i = v; }
static void attr_float(struct tg *t, const char *name, float v) { tg_attr(t, name, KILN_ATTR_FLOAT)->f = v; }
static void attr_str(struct tg *t, const char *name, const char *v)
{
    struct kiln_attr *a = tg_attr(t, name, KILN_ATTR_STRING);
    a->s.len = strlen(v);
    a->s.data = kiln_arena_strdup(t->g->mem, v);
}
static void attr_ints(struct tg *t, const char *name, const int64_t *v, int n)
{
    struct kiln_attr *a = tg_attr(t, name, KILN_ATTR_INTS);
    a->n = n;
    a->ints = kiln_arena_alloc(t->g->mem, sizeof(int64_t) * (size_t)n);
    memcpy(a->ints, v, sizeof(int64_t) * (size_t)n);
}

/* ---- layouts (an independent converter, checked against KilnReorder below) ---- */

static int64_t blocked_count(const int64_t *d, int b)
{
    return kc_blocked_count(d, b);
}

/* A copy of plain x (rank 4) in layout b (0 = plain copy); padding zero. */
static kiln_tensor *to_layout(const kiln_tensor *x, int b)
{
    if (b) return kc_to_blocked(x, b);
    kiln_tensor *c;
    if (kiln_tensor_clone(x, &c) != KILN_OK) abort();
    return c;
}

/* Plain copy of x stored in layout b; padding must be zero (else *pad_bad). */
static kiln_tensor *from_layout(const kiln_tensor *x, int b, int *pad_bad)
{
    if (!b) {
        kiln_tensor *t;
        if (kiln_tensor_new(KILN_DTYPE_F32, 4, x->dims, &t) != KILN_OK) abort();
        memcpy(t->data, x->data, t->nbytes);
        return t;
    }
    bool bad = false;
    kiln_tensor *t = kc_from_blocked(x, b, &bad);
    if (bad) *pad_bad = 1;
    return t;
}

/* A tensor of type ty stored in layout b, filled with NaN. */
static kiln_tensor *nan_tensor(const struct kiln_type *ty, int b)
{
    int64_t flat = ty->rank == 4 && b ? blocked_count(ty->dims, b) : kiln_shape_count(ty->rank, ty->dims);
    if (flat < 1) flat = 1;
    kiln_tensor *t;
    if (kiln_tensor_new_uninit(KILN_DTYPE_F32, 1, &flat, &t) != KILN_OK) abort();
    for (int64_t i = 0; i < flat; i++) ((float *)t->data)[i] = NAN;
    t->rank = ty->rank;
    memcpy(t->dims, ty->dims, sizeof t->dims);
    return t;
}

/* ---- running ---- */

/* KilnFusedConv's output type is Conv's; its reference is composed here from
 * the Conv reference kernel and the activation formulas below. */
static kiln_status infer_out(struct tg *t, struct kiln_type *out)
{
    struct kiln_node *n = tg_node(t);
    if (n->op == KILN_OP_KilnFusedConv) {
        n->op = KILN_OP_Conv;
        n->n_in = 3;
        t->n_in = 3;
        kiln_status st = infer_out(t, out);
        n->op = KILN_OP_KilnFusedConv;
        n->n_in = 4;
        t->n_in = 4;
        return st;
    }
    const struct kiln_type *ins[TG_MAX_IN] = {0};
    const kiln_tensor *vals[TG_MAX_IN] = {0};
    struct kiln_type types[TG_MAX_IN];
    for (int i = 0; i < t->n_in; i++)
        if (t->in[i]) {
            kiln_type_from_tensor(&types[i], t->in[i]);
            ins[i] = &types[i];
            vals[i] = t->in[i];
        }
    struct kiln_type *outs[1] = {out};
    struct kiln_infer_ctx ic = {tg_node(t), t->n_in, ins, vals, 1, outs};
    return kiln_op_impl(tg_node(t)->op)->infer(&ic);
}

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

/* The fused activations (opt.h), as the ONNX ops define them. */
static double act_ref(const struct kiln_node *n, double x)
{
    const char *a = kiln_attr_str(n, "activation", "");
    float al0 = !strcmp(a, "LeakyRelu") ? 0.01f : !strcmp(a, "HardSigmoid") ? 0.2f : -FLT_MAX;
    float be0 = !strcmp(a, "HardSigmoid") ? 0.5f : FLT_MAX;
    float al = kiln_attr_float(n, "act_alpha", al0), be = kiln_attr_float(n, "act_beta", be0);
    if (!strcmp(a, "Relu")) return x > 0 ? x : 0;
    if (!strcmp(a, "LeakyRelu")) return x > 0 ? x : al * x;
    if (!strcmp(a, "Clip")) return fmin(fmax(x, al), be);
    if (!strcmp(a, "HardSwish")) return x * fmax(0, fmin(1, x / 6 + 0.5));
    if (!strcmp(a, "HardSigmoid")) return fmax(0, fmin(1, al * x + be));
    if (!strcmp(a, "Sigmoid")) return sigm(x);
    if (!strcmp(a, "SiLU")) return x * sigm(x);
    if (!strcmp(a, "Tanh")) return tanh(x);
    if (!strcmp(a, "Gelu")) return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    if (!strcmp(a, "GeluTanh"))
        return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    return x;
}

static kiln_tensor *run_ref_plain(struct tg *t);

static kiln_tensor *run_ref(struct tg *t)
{
    struct kiln_node *n = tg_node(t);
    if (n->op != KILN_OP_KilnFusedConv) return run_ref_plain(t);
    n->op = KILN_OP_Conv;
    n->n_in = 3;
    t->n_in = 3;
    kiln_tensor *y = run_ref_plain(t);
    n->op = KILN_OP_KilnFusedConv;
    n->n_in = 4;
    t->n_in = 4;
    if (!y) return NULL;
    float *d = y->data;
    const float *s = t->in[3] ? t->in[3]->data : NULL;
    for (int64_t i = 0; i < kiln_tensor_count(y); i++)
        d[i] = (float)act_ref(n, (double)d[i] + (s ? s[i] : 0.0));
    return y;
}

static kiln_tensor *run_ref_plain(struct tg *t)
{
    struct kiln_type ty;
    if (infer_out(t, &ty) != KILN_OK) {
        fprintf(stderr, "infer: %s\n", kiln_last_error());
        return NULL;
    }
    kiln_tensor *y;
    if (kiln_tensor_new(ty.dtype, ty.rank, ty.dims, &y) != KILN_OK) abort();
    kiln_tensor *ins[TG_MAX_IN] = {0};
    for (int i = 0; i < t->n_in; i++) ins[i] = t->in[i];
    struct kiln_run_ctx rc = {.node = tg_node(t), .n_in = t->n_in, .in = ins, .n_out = 1, .out = &y,
                              .threads = 1};
    if (kiln_op_impl(tg_node(t)->op)->run(&rc) != KILN_OK) {
        fprintf(stderr, "ref run: %s\n", kiln_last_error());
        kiln_tensor_free(y);
        return NULL;
    }
    return y;
}

/*
 * Compile and run the fast kernel with the inputs stored in layouts in_l
 * (NULL = plain) and the output in layout out_l; returns the output read
 * back to plain (NULL if the kernel declined or failed; *handled says).
 */
static int g_inplace;      /* run_fast: write Y over the input the kernel allows in place */
static int g_inplace_runs; /* runs that did */
static char g_last_impl[48]; /* run_fast: the implementation the last compile chose */
static char g_last_name[48]; /* and the kernel's name */

static kiln_tensor *run_fast(struct tg *t, const int *in_l, int out_l, int threads, int *handled)
{
    *handled = 0;
    const struct kiln_fast_op *f = kiln_fast_op(tg_node(t)->op);
    if (!f) return NULL;
    struct kiln_type ty, types[TG_MAX_IN];
    if (infer_out(t, &ty) != KILN_OK) return NULL;
    const struct kiln_type *ins[TG_MAX_IN] = {0};
    const kiln_tensor *vals[TG_MAX_IN] = {0};
    kiln_tensor *stored[TG_MAX_IN] = {0};
    int layouts[TG_MAX_IN] = {0};
    for (int i = 0; i < t->n_in; i++) {
        if (!t->in[i]) continue;
        kiln_type_from_tensor(&types[i], t->in[i]);
        ins[i] = &types[i];
        int v = tg_node(t)->in[i];
        if (t->g->values[v].kind == KILN_VALUE_CONST) vals[i] = t->in[i];
        layouts[i] = in_l ? in_l[i] : 0;
        stored[i] = layouts[i] ? to_layout(t->in[i], layouts[i]) : t->in[i];
    }
    const struct kiln_type *outs[1] = {&ty};
    int out_layouts[1] = {out_l};
    struct kiln_compile_ctx cc = {tg_node(t), t->n_in, ins, vals, layouts, 1, outs, out_layouts,
                                  t->wc, threads, 0, 0};
    struct kiln_kernel_inst inst;
    memset(&inst, 0, sizeof inst);
    kiln_tensor *res = NULL;
    kiln_status st = f->compile(&cc, &inst);
    if (st != KILN_OK) fprintf(stderr, "compile: %s\n", kiln_last_error());
    if (st == KILN_OK && inst.run) {
        *handled = 1;
        snprintf(g_last_impl, sizeof g_last_impl, "%s", inst.impl);
        snprintf(g_last_name, sizeof g_last_name, "%s", inst.name ? inst.name : "");
        kiln_tensor *y = nan_tensor(&ty, out_l);
        kiln_tensor *run_in[TG_MAX_IN];
        memcpy(run_in, stored, sizeof run_in);
        int ii = inst.inplace ? inst.inplace_input : -1;
        if (g_inplace && ii >= 0 && ii < t->n_in && stored[ii] && stored[ii]->nbytes == y->nbytes) {
            /* as a plan runs it when the input dies here: Y over that input's memory */
            memcpy(y->data, stored[ii]->data, y->nbytes);
            run_in[ii] = y;
            g_inplace_runs++;
        }
        size_t sbytes = (inst.scratch_bytes + 63) / 64 * 64;
        void *scratch = inst.scratch_bytes ? aligned_alloc(64, sbytes) : NULL;
        /* NaNs: a kernel that reads scratch it did not write shows in the result */
        if (scratch) memset(scratch, 0xff, sbytes);
        struct kiln_run_ctx rc = {.node = tg_node(t), .n_in = t->n_in, .in = run_in, .n_out = 1,
                                  .out = &y, .scratch = scratch, .threads = threads};
        st = inst.run(inst.state, &rc);
        if (st != KILN_OK) fprintf(stderr, "fast run: %s\n", kiln_last_error());
        int pad_bad = 0;
        if (getenv("UNIT_DNNL_DEBUG") && st == KILN_OK)
            for (int i = 0; i < 8; i++) fprintf(stderr, "%g ", ((float *)y->data)[i]);
        if (st == KILN_OK) {
            res = out_l ? from_layout(y, out_l, &pad_bad) : y;
            CHECK(!pad_bad, "padded channels of the blocked output are not zero");
        }
        if (res != y) kiln_tensor_free(y);
        free(scratch);
    }
    kiln_kernel_inst_destroy(&inst);
    for (int i = 0; i < t->n_in; i++)
        if (stored[i] != t->in[i]) kiln_tensor_free(stored[i]);
    return res;
}

/* Max |a - b| relative to max(1, max |ref|); 1e9 when shapes differ or NaN. */
static double rel_err(const kiln_tensor *ref, const kiln_tensor *got)
{
    if (!ref || !got || kiln_tensor_count(ref) != kiln_tensor_count(got)) return 1e9;
    const float *a = ref->data, *b = got->data;
    double scale = 1, err = 0;
    for (int64_t i = 0; i < kiln_tensor_count(ref); i++) scale = fmax(scale, fabs(a[i]));
    for (int64_t i = 0; i < kiln_tensor_count(ref); i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d != d) return 1e9;
        err = fmax(err, d);
    }
    return err / scale;
}

/* Compare the fast kernel (in the given layouts and thread counts) with the reference. */
static void differ(struct tg *t, const char *what, const int *in_l, int out_l, int expect_handled)
{
    kiln_tensor *ref = run_ref(t);
    CHECK(ref != NULL, "%s: reference failed", what);
    for (int run = 0; run < 4; run++) { /* 1 and g_threads threads, then both in place */
        int handled, th = run % 2 ? g_threads : 1;
        if (run % 2 && g_threads == 1) continue;
        g_inplace = run >= 2;
        kiln_tensor *got = run_fast(t, in_l, out_l, th, &handled);
        g_inplace = 0;
        if (expect_handled) {
            CHECK(handled, "%s: fast kernel declined", what);
            double e = rel_err(ref, got);
            if (getenv("UNIT_DNNL_DEBUG") && e > 1e-4) {
                fprintf(stderr, "\n%s ref:", what);
                for (int i = 0; i < 8; i++) fprintf(stderr, " %g", ((float *)ref->data)[i]);
                fprintf(stderr, "\n got:");
                for (int i = 0; i < 8; i++) fprintf(stderr, " %g", ((float *)got->data)[i]);
                fprintf(stderr, "\n");
            }
            CHECK(e <= 1e-4, "%s (threads %d%s, layouts in %d out %d): error %g", what, th,
                  run >= 2 ? ", in place" : "", in_l ? in_l[0] : 0, out_l, e);
        } else {
            CHECK(!handled, "%s: fast kernel should have declined", what);
        }
        kiln_tensor_free(got);
    }
    kiln_tensor_free(ref);
}

/* ---- Conv / KilnFusedConv ---- */

struct conv_case {
    int64_t n, c, h, w, m, kh, kw, group, stride, dil;
    int64_t pads[4];
    const char *auto_pad; /* NULL = explicit pads */
    int bias, sum;
    const char *act;      /* NULL = plain Conv */
    float act_alpha, act_beta;
};

static void build_conv(struct tg *t, const struct conv_case *k)
{
    int fused = k->act != NULL || k->sum;
    tg_init(t, fused ? KILN_OP_KilnFusedConv : KILN_OP_Conv, fused ? 4 : 3, 10);
    int64_t xd[4] = {k->n, k->c, k->h, k->w}, wd[4] = {k->m, k->c / k->group, k->kh, k->kw};
    tg_in(t, 0, rand_tensor(4, xd), 0);
    tg_in(t, 1, rand_tensor(4, wd), 1);
    if (k->bias) tg_in(t, 2, rand_tensor(1, &k->m), 1);
    int64_t st[2] = {k->stride, k->stride}, dl[2] = {k->dil, k->dil}, ks[2] = {k->kh, k->kw};
    attr_ints(t, "strides", st, 2);
    attr_ints(t, "dilations", dl, 2);
    attr_ints(t, "kernel_shape", ks, 2);
    attr_int(t, "group", k->group);
    if (k->auto_pad) attr_str(t, "auto_pad", k->auto_pad);
    else attr_ints(t, "pads", k->pads, 4);
    if (fused) {
        attr_str(t, "activation", k->act ? k->act : "");
        if (k->act_alpha != 0 || k->act_beta != 0) {
            attr_float(t, "act_alpha", k->act_alpha);
            attr_float(t, "act_beta", k->act_beta);
        }
    }
    if (k->sum) {
        struct kiln_type ty;
        if (infer_out(t, &ty) != KILN_OK) abort();
        tg_in(t, 3, rand_tensor(4, ty.dims), 0);
    }
}

static void test_conv(void)
{
    static const struct conv_case cases[] = {
        {1, 3, 7, 7, 16, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, NULL, 0, 0},
        {2, 16, 9, 9, 16, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0},
        {1, 17, 8, 11, 33, 3, 3, 1, 2, 1, {0, 1, 2, 0}, NULL, 1, 0, NULL, 0, 0},
        {1, 15, 7, 7, 15, 1, 1, 1, 1, 1, {0, 0, 0, 0}, NULL, 0, 1, "", 0, 0},
        {1, 33, 13, 13, 17, 3, 3, 1, 1, 2, {2, 2, 2, 2}, NULL, 1, 1, "Relu", 0, 0},
        {1, 16, 10, 10, 32, 3, 3, 2, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "LeakyRelu", 0.1f, 0},
        {1, 32, 9, 9, 32, 3, 3, 32, 2, 1, {0, 0, 0, 0}, "SAME_UPPER", 1, 0, "Clip", 0.0f, 6.0f},
        {1, 17, 7, 7, 17, 5, 5, 17, 1, 1, {2, 1, 1, 2}, NULL, 1, 0, "HardSwish", 0, 0},
        {1, 1, 5, 5, 1, 3, 3, 1, 1, 1, {0, 0, 0, 0}, "SAME_LOWER", 0, 0, "Sigmoid", 0, 0},
        {1, 16, 1, 1, 16, 1, 1, 1, 1, 1, {0, 0, 0, 0}, NULL, 1, 1, "SiLU", 0, 0},
        {1, 8, 7, 7, 24, 3, 3, 1, 1, 1, {1, 1, 1, 1}, "VALID", 1, 0, "Tanh", 0, 0},
        {1, 16, 7, 7, 16, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 1, "Gelu", 0, 0},
        {1, 16, 7, 7, 16, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "GeluTanh", 0, 0},
        {1, 16, 7, 7, 16, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 0, 1, "HardSigmoid", 0.25f, 0.4f},
        {2, 3, 15, 15, 16, 7, 7, 1, 2, 1, {3, 3, 3, 3}, NULL, 1, 0, "Relu", 0, 0},
        /* resnet-like 3x3 stride-1 shapes: oneDNN's Winograd kernels (2x3 and 4x3) */
        {1, 64, 28, 28, 64, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 1, "Relu", 0, 0},
        {4, 32, 20, 20, 48, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0},
        {2, 128, 7, 7, 128, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 0, 1, "", 0, 0},
        {4, 64, 20, 20, 96, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0},
        {2, 128, 8, 8, 128, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 0, 1, "", 0, 0},
        /* 3x3 on images under 4 wide or high: the direct algorithm even with Winograd allowed */
        {8, 32, 2, 2, 48, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 1, "Relu", 0, 0},
        {2, 16, 3, 9, 16, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "", 0, 0},
        /* squeeze-excitation: 1x1 convolutions of 1x1 images (Kiln's matrix-vector kernel) */
        {2, 48, 1, 1, 1152, 1, 1, 1, 1, 1, {0, 0, 0, 0}, NULL, 1, 0, "Sigmoid", 0, 0},
        {3, 1152, 1, 1, 48, 1, 1, 1, 1, 1, {0, 0, 0, 0}, NULL, 1, 0, "SiLU", 0, 0},
        {1, 20, 1, 1, 30, 1, 1, 1, 1, 1, {0, 0, 0, 0}, NULL, 0, 0, NULL, 0, 0},
        {9, 17, 1, 1, 15, 1, 1, 1, 1, 1, {0, 0, 0, 0}, NULL, 1, 0, "Clip", 0.0f, 6.0f},
        {8, 512, 1, 1, 520, 1, 1, 1, 1, 1, {0, 0, 0, 0}, NULL, 1, 0, "SiLU", 0, 0}, /* 2 threads */
        /* a 1x1 image whose one output reads the padding: bias only */
        {1, 16, 1, 1, 16, 1, 1, 1, 2, 1, {1, 1, 0, 0}, NULL, 1, 0, "Relu", 0, 0},
    };
    /* each case with Winograd allowed (the default) and with the direct algorithm only */
    for (int wino = 1; wino >= 0; wino--) {
        setenv("KILN_WINOGRAD", wino ? "1" : "0", 1);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const struct conv_case *k = &cases[i];
            char what[80];
            snprintf(what, sizeof what, "conv case %zu (%s, winograd %s)", i,
                     k->act ? k->act : "Conv", wino ? "allowed" : "off");
            for (int lay = 0; lay <= 2; lay++) {
                /* plain; blocked by 8; blocked by 16 (X, Sum and Y; the first conv
                 * of a network reads plain input) */
                int b = lay == 0 ? 0 : lay == 1 ? 8 : 16;
                int in_l[4] = {k->c < 8 ? 0 : b, 0, 0, b};
                struct tg t;
                build_conv(&t, k);
                differ(&t, what, in_l, b, 1);
                tg_free(&t);
            }
        }
    }
    unsetenv("KILN_WINOGRAD");
    /* where Winograd runs (conv_winograd_pays): declined for few channels
     * (C * M / (C + M) < 32) on images of at most 64 outputs, where the tiles cover
     * 1.5x the output or more, and in tiles of 2 for fewer than 2M products of output
     * pixels, C and M; blocked by 16, the layout of the chains it runs in.
     * wino: 1 Winograd, 0 direct, 2 anything but F(4x4,3x3) (oneDNN picks the tile) */
    static const struct {
        struct conv_case k;
        int wino;
    } wcases[] = {
        {{1, 64, 28, 28, 64, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 1},
        {{4, 64, 20, 20, 96, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 1},
        {{2, 128, 8, 8, 128, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 0, 1, "", 0, 0}, 1},
        /* 7x7: tiles of 2 or 4 cover 1.31x, but 128 -> 128 at batch 2 is 1.6M products
         * (Winograd measured 1.14-1.26x slower); resnet's last stage (512 channels) keeps it */
        {{2, 128, 7, 7, 128, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 0, 1, "", 0, 0}, 0},
        {{1, 512, 7, 7, 512, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 0, 1, "", 0, 0}, 1},
        /* few channels on a larger image (squeezenet's 23x23) */
        {{4, 32, 20, 20, 48, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 1},
        /* few channels on small images (googlenet's 6x6 branches, densenet121's 8x8) */
        {{1, 16, 6, 6, 48, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 0},
        {{8, 32, 6, 6, 128, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 0},
        {{1, 128, 8, 8, 32, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 1, "Relu", 0, 0}, 0},
        /* 5x5 and 6x6 at batch 8 (squeezenet's, googlenet's): never in tiles of 4 */
        {{8, 64, 5, 5, 256, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 2},
        {{8, 128, 6, 6, 256, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 2},
        /* batch 1, tiles of 2, under 2M products: squeezenet's 5x5 and 11x11 expands
         * (0.23M, 0.5M), 64 -> 64 on 14x14 (0.8M), alexnet's 192 -> 384 on 5x5 (1.84M) */
        {{1, 48, 5, 5, 192, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 0},
        {{1, 32, 11, 11, 128, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 0},
        {{1, 64, 14, 14, 64, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 1, "Relu", 0, 0}, 0},
        {{1, 192, 5, 5, 384, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 0},
        /* over it: alexnet's 384 -> 256 on 5x5 (2.5M), 256 -> 256 on 7x7 at batch 2 (6.4M) */
        {{1, 384, 5, 5, 256, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 1},
        {{2, 256, 7, 7, 256, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 1, "Relu", 0, 0}, 1},
    };
    /* oneDNN's f32 Winograd kernels need AVX-512: elsewhere only the cases
     * expecting the direct algorithm (or no F(4x4)) say anything */
    int have_wino = kiln_cpu_isa() == KILN_ISA_AVX512;
    if (!have_wino) printf("winograd choice: no AVX-512, the cases expecting Winograd are skipped\n");
    for (size_t i = 0; i < sizeof wcases / sizeof wcases[0]; i++) {
        char what[80];
        if (wcases[i].wino == 1 && !have_wino) continue;
        snprintf(what, sizeof what, "winograd choice case %zu", i);
        int in_l[4] = {16, 0, 0, 16};
        struct tg t;
        build_conv(&t, &wcases[i].k);
        g_last_impl[0] = '\0';
        differ(&t, what, in_l, 16, 1);
        int wino = strstr(g_last_impl, "wino") != NULL;
        if (wcases[i].wino == 2)
            CHECK(!strstr(g_last_impl, "4x3"), "%s: runs %s, expected no F(4x4,3x3)", what,
                  g_last_impl);
        else
            CHECK(wino == wcases[i].wino, "%s: runs %s, expected %s", what, g_last_impl,
                  wcases[i].wino ? "Winograd" : "the direct algorithm");
        tg_free(&t);
    }
    /* weights known only at run time: left to the reference */
    struct tg t;
    struct conv_case k = {1, 4, 5, 5, 4, 3, 3, 1, 1, 1, {0, 0, 0, 0}, NULL, 0, 0, NULL, 0, 0};
    build_conv(&t, &k);
    t.g->values[tg_node(&t)->in[1]].kind = KILN_VALUE_INPUT;
    differ(&t, "conv with runtime weights", NULL, 0, 0);
    tg_free(&t);
}

/* Convolutions of a few output pixels with large weights run as im2col and a product
 * (conv.c, cgemm_compile): Kiln's skinny kernel by default, a oneDNN matmul with
 * KILN_SKINNY=0 (up to 9 output pixels per image; 10 to 16 on the skinny kernel only, with
 * weights of 1 MiB or more).
 * Each case matches the reference on one and two threads in every layout
 * (plain, blocked by 8 and 16, output channels off the block included), runs the product
 * where it should (kernel "f32_skinny_...", or impl "matmul:..." with KILN_SKINNY=0) and
 * the direct convolution where it should not, and matches again with KILN_CONV_GEMM=0. */
static void test_conv_gemm(void)
{
    static const struct {
        struct conv_case k;
        int gemm;
    } cases[] = {
        /* 3x3 on 2x2 (inception_v3's, wide_resnet50_2's last stage), bias and Relu */
        {{1, 128, 2, 2, 144, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 1},
        /* 3x3 on 3x3 (googlenet's last modules), 100 output channels: blocked padding */
        {{1, 96, 3, 3, 100, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, NULL, 0, 0}, 1},
        /* 1x3 and 3x1 at batch 4 (16 rows) */
        {{4, 128, 2, 2, 112, 1, 3, 1, 1, 1, {0, 1, 0, 1}, NULL, 1, 0, "Relu", 0, 0}, 1},
        {{4, 128, 2, 2, 112, 3, 1, 1, 1, 1, {1, 0, 1, 0}, NULL, 0, 0, "Relu", 0, 0}, 1},
        /* stride 2, dilation 2, uneven pads, a clamp: 2x1 outputs */
        {{1, 64, 5, 5, 128, 3, 3, 1, 2, 2, {1, 0, 2, 1}, NULL, 0, 0, "Clip", 0.0f, 6.0f}, 1},
        /* 1024 output channels: oneDNN's product (KILN_SKINNY=0) with padded weight rows */
        {{1, 16, 3, 3, 1024, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 1},
        /* 3x3 on 4x4 with 1.3 MB of weights (wide_resnet50_2's third stage has 9.4 MB):
         * on the skinny kernel only (2) */
        {{1, 256, 4, 4, 144, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 2},
        /* not taken: 1x1 (the direct kernel reads its weights well), a residual Sum, too
         * many rows (batch 8 of 2x2 images, batch 2 of 4x4), too many pixels (5x5),
         * small weights (on 2x2; on 4x4 under 1 MiB, which stays in cache) */
        {{1, 512, 2, 2, 512, 1, 1, 1, 1, 1, {0, 0, 0, 0}, NULL, 1, 0, "Relu", 0, 0}, 0},
        {{1, 128, 2, 2, 144, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 1, "Relu", 0, 0}, 0},
        {{8, 128, 2, 2, 144, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 0},
        {{2, 256, 4, 4, 144, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 0},
        {{1, 128, 4, 4, 144, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 0},
        {{1, 128, 5, 5, 144, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 0},
        {{1, 16, 2, 2, 32, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 0},
    };
    for (int mode = 0; mode <= 2; mode++) { /* default, KILN_SKINNY=0, KILN_CONV_GEMM=0 */
        if (mode == 1) setenv("KILN_SKINNY", "0", 1);
        if (mode == 2) {
            unsetenv("KILN_SKINNY");
            setenv("KILN_CONV_GEMM", "0", 1);
        }
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const struct conv_case *k = &cases[i].k;
            for (int lay = 0; lay <= 2; lay++) {
                int b = lay == 0 ? 0 : lay == 1 ? 8 : 16;
                int in_l[4] = {b, 0, 0, b};
                char what[96];
                snprintf(what, sizeof what, "conv gemm case %zu (layout %d%s)", i, b,
                         mode == 1 ? ", KILN_SKINNY=0" : mode == 2 ? ", KILN_CONV_GEMM=0" : "");
                struct tg t;
                build_conv(&t, k);
                g_last_impl[0] = '\0';
                g_last_name[0] = '\0';
                differ(&t, what, in_l, b, 1);
                int product = mode == 0 ? strstr(g_last_name, "skinny") != NULL
                                        : strncmp(g_last_impl, "matmul:", 7) == 0;
                int want = cases[i].gemm == 1 ? mode != 2 : cases[i].gemm == 2 && mode == 0;
                CHECK(product == want, "%s: runs %s (%s), expected %s", what, g_last_name,
                      g_last_impl, want ? "the im2col product" : "the direct convolution");
                tg_free(&t);
            }
        }
    }
    unsetenv("KILN_CONV_GEMM");
}

/* Convolutions whose plain or mixed layouts oneDNN runs on a fallback (its
 * reference code or im2col GEMM): conv.c makes them in the formats oneDNN
 * prefers, with reorders around (conv_try_any). Each case must match the
 * reference, run on no fallback, and match again with KILN_CONV_ANY=0 (the
 * plan's layouts as given). */
static void test_conv_any(void)
{
    static const struct {
        struct conv_case k;
        int in_l, out_l;
    } cases[] = {
        /* convnext: 7x7 depthwise, plain */
        {{2, 96, 8, 8, 96, 7, 7, 96, 1, 1, {3, 3, 3, 3}, NULL, 1, 0, NULL, 0, 0}, 0, 0},
        /* dilated 7x7 depthwise */
        {{1, 32, 12, 12, 32, 7, 7, 32, 1, 2, {6, 6, 6, 6}, NULL, 1, 0, "Relu", 0, 0}, 0, 0},
        /* shufflenet: 3x3 stride-2 depthwise of 116 channels (off the block) */
        {{2, 116, 12, 12, 116, 3, 3, 116, 2, 1, {1, 1, 1, 1}, NULL, 1, 0, NULL, 0, 0}, 16, 16},
        {{2, 116, 12, 12, 116, 3, 3, 116, 2, 1, {1, 1, 1, 1}, NULL, 1, 0, NULL, 0, 0}, 8, 8},
        /* shufflenet: 1x1 after the channel shuffle, plain */
        {{2, 58, 12, 12, 58, 1, 1, 1, 1, 1, {0, 0, 0, 0}, NULL, 1, 0, "Relu", 0, 0}, 0, 0},
        /* squeezenet: a blocked squeeze output into a plain expand 3x3 */
        {{2, 16, 23, 23, 64, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 16, 0},
        {{2, 16, 23, 23, 64, 3, 3, 1, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 8, 0},
        /* a plain 1x1 with a residual Sum */
        {{1, 24, 10, 10, 48, 1, 1, 1, 1, 1, {0, 0, 0, 0}, NULL, 1, 1, "Relu", 0, 0}, 0, 0},
        /* grouped, dilated, plain */
        {{1, 32, 11, 11, 64, 3, 3, 4, 1, 2, {2, 2, 2, 2}, NULL, 0, 0, NULL, 0, 0}, 0, 0},
        /* padded beyond what oneDNN's direct kernels take (conv_try_pad): an atrous 3x3 of
         * rate 6 (DeepLab's ASPP), plain and blocked */
        {{1, 32, 20, 20, 32, 3, 3, 1, 1, 6, {6, 6, 6, 6}, NULL, 1, 0, "Relu", 0, 0}, 0, 0},
        {{2, 32, 20, 20, 32, 3, 3, 1, 1, 6, {6, 6, 6, 6}, NULL, 1, 0, "Relu", 0, 0}, 8, 8},
        /* a style-transfer 9x9 of pad 4 from 3 channels, plain and into a blocked output */
        {{1, 3, 24, 24, 16, 9, 9, 1, 1, 1, {4, 4, 4, 4}, NULL, 1, 0, "Relu", 0, 0}, 0, 0},
        {{1, 3, 24, 24, 16, 9, 9, 1, 1, 1, {4, 4, 4, 4}, NULL, 1, 0, "Relu", 0, 0}, 0, 8},
        /* alexnet's 11x11 of stride 4 and pad 2 from 3 channels */
        {{2, 3, 35, 35, 16, 11, 11, 1, 4, 1, {2, 2, 2, 2}, NULL, 1, 0, "Relu", 0, 0}, 0, 8},
        /* dilated, uneven pads on both axes, a residual Sum, 12 channels (off the block) */
        {{1, 12, 15, 17, 16, 3, 3, 1, 1, 4, {8, 0, 0, 8}, NULL, 1, 1, "Relu", 0, 0}, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct conv_case *k = &cases[i].k;
        int b = cases[i].in_l;
        int in_l[4] = {b, 0, 0, cases[i].out_l};
        for (int any = 1; any >= 0; any--) {
            char what[96];
            snprintf(what, sizeof what, "conv_any case %zu (layouts %d -> %d, any %s)", i, b,
                     cases[i].out_l, any ? "on" : "off");
            setenv("KILN_CONV_ANY", any ? "1" : "0", 1);
            struct tg t;
            build_conv(&t, k);
            g_last_impl[0] = '\0';
            differ(&t, what, in_l, cases[i].out_l, 1);
            if (any)
                CHECK(strncmp(g_last_impl, "ref", 3) != 0 && !strstr(g_last_impl, "gemm"),
                      "%s: runs oneDNN's fallback %s (%s)", what, g_last_impl, g_last_name);
            tg_free(&t);
        }
    }
    unsetenv("KILN_CONV_ANY");
}

/* 1-D convolutions, dilated and padded (a TCN's causal ones: pads 2 * dilation before,
 * none after), which oneDNN 2.6's AVX2 direct kernel refuses: padded explicitly
 * (conv_try_pad), they must match the reference and run on no fallback. */
static void test_conv1d_pad(void)
{
    static const struct {
        int64_t n, c, l, m, k, dil, stride, pb, pe;
        int sum;
    } cases[] = {
        {1, 64, 128, 64, 3, 2, 1, 4, 0, 0},
        {2, 64, 96, 64, 3, 8, 1, 16, 0, 1},
        {1, 16, 50, 24, 5, 3, 1, 6, 6, 0},
        {2, 20, 61, 16, 3, 2, 2, 3, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "conv1d_pad case %zu", i);
        struct tg t;
        tg_init(&t, KILN_OP_KilnFusedConv, 4, 10);
        int64_t xd[3] = {cases[i].n, cases[i].c, cases[i].l};
        int64_t wd[3] = {cases[i].m, cases[i].c, cases[i].k};
        tg_in(&t, 0, rand_tensor(3, xd), 0);
        tg_in(&t, 1, rand_tensor(3, wd), 1);
        tg_in(&t, 2, rand_tensor(1, &cases[i].m), 1);
        int64_t pads[2] = {cases[i].pb, cases[i].pe};
        attr_ints(&t, "strides", &cases[i].stride, 1);
        attr_ints(&t, "dilations", &cases[i].dil, 1);
        attr_ints(&t, "kernel_shape", &cases[i].k, 1);
        attr_ints(&t, "pads", pads, 2);
        attr_int(&t, "group", 1);
        attr_str(&t, "activation", "Relu");
        if (cases[i].sum) {
            struct kiln_type ty;
            if (infer_out(&t, &ty) != KILN_OK) abort();
            tg_in(&t, 3, rand_tensor(3, ty.dims), 0);
        }
        g_last_impl[0] = '\0';
        differ(&t, what, NULL, 0, 1);
        CHECK(strncmp(g_last_impl, "ref", 3) != 0 && !strstr(g_last_impl, "gemm"),
              "%s: runs oneDNN's fallback %s (%s)", what, g_last_impl, g_last_name);
        tg_free(&t);
    }
}

/* Grouped convolutions whose groups are narrower than the layout's channel block
 * (resnext50_32x4d: 32 groups of 4 channels) run with groups merged into block-diagonal
 * ones (conv.c, conv_try_merge) on a direct kernel, not oneDNN's reference or GEMM code, and
 * agree with the reference kernel. KILN_CONV_MERGE=0 shows the fallback it replaces. */
static void test_conv_merge(void)
{
    static const struct {
        struct conv_case k;
        int layout;
        int merged; /* 1: the merged kernel must run; 2: a direct kernel, merged or oneDNN's own */
    } cases[] = {
        /* resnext: 4 channels per group, 3x3, bias and Relu */
        {{1, 64, 10, 10, 64, 3, 3, 16, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 8, 1},
        /* stride 2, 2 input and 4 output channels per group, 2 images */
        {{2, 32, 9, 9, 64, 3, 3, 16, 2, 1, {1, 1, 1, 1}, NULL, 1, 0, NULL, 0, 0}, 8, 1},
        /* a residual Sum */
        {{1, 48, 7, 7, 48, 3, 3, 12, 1, 1, {1, 1, 1, 1}, NULL, 0, 1, "Relu", 0, 0}, 8, 1},
        /* 16-channel blocks (AVX-512 CPUs only) */
        {{1, 64, 10, 10, 64, 3, 3, 16, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Relu", 0, 0}, 16, 2},
        /* 3 groups of 8: no k <= 4 divides the groups into whole 16-blocks, 8-blocks need none */
        {{1, 24, 6, 6, 24, 3, 3, 3, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, NULL, 0, 0}, 8, 0},
    };
    int avx512 = __builtin_cpu_supports("avx512f");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct conv_case *k = &cases[i].k;
        int b = cases[i].layout;
        if (b == 16 && !avx512) continue; /* the layout pass blocks by 16 only with AVX-512 */
        int in_l[4] = {b, 0, 0, b};
        for (int merge = 1; merge >= 0; merge--) {
            char what[96];
            snprintf(what, sizeof what, "conv_merge case %zu (layout %d, merge %s)", i, b,
                     merge ? "on" : "off");
            setenv("KILN_CONV_MERGE", merge ? "1" : "0", 1);
            struct tg t;
            build_conv(&t, k);
            g_last_impl[0] = g_last_name[0] = '\0';
            differ(&t, what, in_l, b, 1);
            int is_merged = strstr(g_last_name, "merged") != NULL;
            if (!merge) CHECK(!is_merged, "%s: merged with KILN_CONV_MERGE=0 (%s)", what, g_last_name);
            else if (cases[i].merged)
                CHECK((is_merged || cases[i].merged == 2) && strncmp(g_last_impl, "ref", 3) != 0 &&
                          !strstr(g_last_impl, "gemm"),
                      "%s: runs %s (%s), not the merged groups on a direct kernel", what,
                      g_last_impl, g_last_name);
            tg_free(&t);
        }
    }
    unsetenv("KILN_CONV_MERGE");
}

/* ---- ConvTranspose (deconv.c) ---- */

struct deconv_case {
    int nsp;                   /* spatial dims: 1, 2 or 3 */
    int64_t n, c, m, sp, k;    /* batch, in / out channels, input size, kernel size */
    int64_t group, stride, dil;
    int64_t pad_b, pad_e, opad; /* pads (begin, end) and output_padding, every dim */
    const char *auto_pad;      /* NULL = explicit pads */
    int64_t out_shape;         /* > 0: the output_shape attribute (every dim) */
    int bias;
    const char *act;           /* non-NULL: KilnFusedConvTranspose with this activation */
    float act_alpha, act_beta;
};

static void build_deconv(struct tg *t, const struct deconv_case *k)
{
    tg_init(t, k->act ? KILN_OP_KilnFusedConvTranspose : KILN_OP_ConvTranspose, k->bias ? 3 : 2,
            13);
    int rank = k->nsp + 2;
    int64_t xd[5] = {k->n, k->c}, wd[5] = {k->c, k->m / k->group};
    int64_t st[3], dl[3], ks[3], pads[6], op[3], os[3];
    for (int i = 0; i < k->nsp; i++) {
        xd[i + 2] = k->sp + i; /* unequal sizes per dim */
        wd[i + 2] = k->k;
        st[i] = k->stride;
        dl[i] = k->dil;
        ks[i] = k->k;
        pads[i] = k->pad_b;
        pads[k->nsp + i] = k->pad_e;
        op[i] = k->opad;
        os[i] = k->out_shape + i;
    }
    tg_in(t, 0, rand_tensor(rank, xd), 0);
    tg_in(t, 1, rand_tensor(rank, wd), 1);
    if (k->bias) tg_in(t, 2, rand_tensor(1, &k->m), 1);
    attr_ints(t, "strides", st, k->nsp);
    attr_ints(t, "dilations", dl, k->nsp);
    attr_ints(t, "kernel_shape", ks, k->nsp);
    attr_int(t, "group", k->group);
    if (k->opad) attr_ints(t, "output_padding", op, k->nsp);
    if (k->auto_pad) attr_str(t, "auto_pad", k->auto_pad);
    else attr_ints(t, "pads", pads, 2 * k->nsp);
    if (k->out_shape > 0) attr_ints(t, "output_shape", os, k->nsp);
    if (k->act) {
        attr_str(t, "activation", k->act);
        attr_float(t, "act_alpha", k->act_alpha);
        attr_float(t, "act_beta", k->act_beta);
    }
}

/* A grid over ConvTranspose's parameters: 1-D, 2-D and 3-D; groups (depthwise
 * included); strides 1 to 3; dilations; symmetric, asymmetric and zero pads;
 * output_padding; auto_pad SAME_UPPER, SAME_LOWER and VALID; output_shape; with
 * and without bias; channel counts below, at and above the vector widths; 2-D
 * cases also with X and Y blocked by 8 and 16; and weights that are graph inputs. */
static void test_deconv(void)
{
    static const struct deconv_case cases[] = {
        {2, 1, 3, 16, 5, 3, 1, 1, 1, 0, 0, 0, NULL, 0, 1, NULL, 0, 0},
        {2, 2, 16, 8, 7, 4, 1, 2, 1, 1, 1, 0, NULL, 0, 1, NULL, 0, 0}, /* UNet 2x up: k4 s2 p1 */
        {2, 1, 32, 16, 6, 2, 1, 2, 1, 0, 0, 0, NULL, 0, 0, NULL, 0, 0}, /* k2 s2 */
        {2, 1, 17, 33, 5, 3, 1, 2, 1, 1, 1, 1, NULL, 0, 1, NULL, 0, 0}, /* output_padding */
        {2, 1, 15, 17, 4, 3, 1, 3, 2, 0, 2, 2, NULL, 0, 1, NULL, 0, 0}, /* dilation, asymmetric pads */
        {2, 2, 16, 32, 5, 3, 2, 2, 1, 1, 0, 0, NULL, 0, 1, NULL, 0, 0}, /* groups */
        {2, 1, 16, 16, 6, 3, 16, 1, 1, 1, 1, 0, NULL, 0, 1, NULL, 0, 0}, /* depthwise */
        {2, 1, 8, 8, 5, 3, 1, 2, 1, 0, 0, 0, "SAME_UPPER", 0, 1, NULL, 0, 0},
        {2, 1, 8, 12, 5, 4, 1, 2, 1, 0, 0, 0, "SAME_LOWER", 0, 0, NULL, 0, 0},
        {2, 1, 8, 4, 5, 3, 1, 2, 1, 0, 0, 0, "VALID", 0, 1, NULL, 0, 0},
        {2, 1, 6, 6, 4, 3, 1, 2, 1, 0, 0, 0, NULL, 10, 1, NULL, 0, 0}, /* output_shape */
        {1, 2, 16, 24, 9, 5, 1, 2, 1, 2, 2, 1, NULL, 0, 1, NULL, 0, 0}, /* 1-D */
        {1, 1, 4, 6, 7, 3, 2, 3, 2, 0, 1, 0, NULL, 0, 0, NULL, 0, 0},
        {3, 1, 8, 8, 3, 3, 1, 2, 1, 1, 1, 1, NULL, 0, 1, NULL, 0, 0}, /* 3-D */
        {3, 1, 4, 6, 3, 2, 2, 2, 1, 0, 0, 0, NULL, 0, 1, NULL, 0, 0},
        {2, 1, 64, 32, 16, 4, 1, 2, 1, 1, 1, 0, NULL, 0, 1, NULL, 0, 0}, /* large enough for 2 threads */
        /* KilnFusedConvTranspose: the activation as a post-op */
        {2, 2, 16, 8, 7, 4, 1, 2, 1, 1, 1, 0, NULL, 0, 1, "Relu", 0, 0},
        {2, 1, 17, 16, 5, 2, 1, 2, 1, 0, 0, 0, NULL, 0, 0, "LeakyRelu", 0.1f, 0},
        {2, 1, 16, 16, 6, 3, 16, 1, 1, 1, 1, 0, NULL, 0, 1, "Clip", 0.0f, 6.0f},
        {2, 1, 8, 12, 5, 4, 1, 2, 1, 0, 0, 0, "SAME_LOWER", 0, 1, "Sigmoid", 0, 0},
        {1, 1, 8, 8, 9, 3, 1, 2, 1, 1, 1, 1, NULL, 0, 1, "Tanh", 0, 0},
        {3, 1, 8, 8, 3, 3, 1, 2, 1, 1, 1, 1, NULL, 0, 1, "SiLU", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[80];
        snprintf(what, sizeof what, "ConvTranspose case %zu%s%s", i, cases[i].act ? " + " : "",
                 cases[i].act ? cases[i].act : "");
        struct tg t;
        build_deconv(&t, &cases[i]);
        differ(&t, what, NULL, 0, 1);
        if (cases[i].nsp == 2) /* X and Y blocked by 8 and by 16, as the layout pass stores them */
            for (int b = 8; b <= 16; b += 8) {
                int in_l[3] = {b, 0, 0};
                snprintf(what, sizeof what, "ConvTranspose case %zu, blocked %d", i, b);
                differ(&t, what, in_l, b, 1);
            }
        /* the same with weights that are graph inputs */
        t.g->values[tg_node(&t)->in[1]].kind = KILN_VALUE_INPUT;
        snprintf(what, sizeof what, "ConvTranspose case %zu, runtime weights", i);
        differ(&t, what, NULL, 0, 1);
        tg_free(&t);
    }
}

/* ---- MatMul / Gemm / KilnFusedMatMul ---- */

static void test_matmul(void)
{
    static const int64_t sizes[] = {1, 15, 16, 17, 65};
    for (int im = 0; im < 5; im++)
        for (int ik = 0; ik < 5; ik += 2)
            for (int in = 0; in < 5; in++) {
                int64_t m = sizes[im], k = sizes[(ik + im) % 5], n = sizes[in];
                int64_t ad[2] = {m, k}, bd[2] = {k, n};
                struct tg t;
                tg_init(&t, KILN_OP_MatMul, 2, 0);
                tg_in(&t, 0, rand_tensor(2, ad), 0);
                tg_in(&t, 1, rand_tensor(2, bd), (im + in) % 2);
                char what[64];
                snprintf(what, sizeof what, "matmul %lldx%lldx%lld", (long long)m, (long long)k,
                         (long long)n);
                differ(&t, what, NULL, 0, 1);
                tg_free(&t);
            }
    /* batched and broadcast */
    static const struct {
        int ra, rb;
        int64_t a[4], b[4];
        int konst;
    } bc[] = {
        {3, 2, {2, 17, 33}, {33, 16}, 1},          /* BERT: one folded 2-D product */
        {3, 2, {3, 5, 16}, {16, 65}, 0},
        {3, 3, {4, 15, 17}, {4, 17, 16}, 0},       /* attention-like batched */
        {4, 4, {2, 3, 16, 8}, {2, 3, 8, 17}, 0},
        {4, 4, {2, 1, 7, 8}, {1, 3, 8, 5}, 0},     /* broadcast batch dims */
        {2, 3, {7, 8}, {3, 8, 5}, 1},              /* A broadcast over B's batch */
        {3, 3, {2, 7, 8}, {1, 8, 5}, 1},           /* B with batch dim 1: folded */
        {2, 2, {17, 24}, {24, 1024}, 1},           /* rows 4 KB apart: packed padded */
        {3, 3, {2, 9, 16}, {2, 16, 1024}, 1},      /* ... per batch too */
    };
    for (size_t i = 0; i < sizeof bc / sizeof bc[0]; i++) {
        struct tg t;
        tg_init(&t, KILN_OP_MatMul, 2, 0);
        tg_in(&t, 0, rand_tensor(bc[i].ra, bc[i].a), 0);
        tg_in(&t, 1, rand_tensor(bc[i].rb, bc[i].b), bc[i].konst);
        char what[64];
        snprintf(what, sizeof what, "batched matmul case %zu", i);
        differ(&t, what, NULL, 0, 1);
        tg_free(&t);
    }
    /* Gemm: transposes, alpha, beta, C shapes */
    static const struct {
        int ta, tb;
        float alpha, beta;
        int c_rank;
        int64_t c[2];
        int konst;
    } gc[] = {
        {0, 0, 1.0f, 1.0f, 1, {17, 0}, 1}, {0, 1, 1.0f, 1.0f, 1, {17, 0}, 1},
        {1, 0, 0.5f, 1.0f, 2, {1, 17}, 1}, {1, 1, 2.0f, 1.0f, 0, {0, 0}, 0},
        {0, 1, 1.0f, 0.5f, 2, {15, 17}, 1}, {0, 0, 1.5f, 1.0f, 2, {15, 17}, 0},
        {0, 1, 1.0f, 1.0f, 2, {15, 1}, 1},
    };
    for (size_t i = 0; i < sizeof gc / sizeof gc[0]; i++) {
        int64_t m = 15, k = 16, n = 17;
        int64_t ad[2] = {gc[i].ta ? k : m, gc[i].ta ? m : k};
        int64_t bd[2] = {gc[i].tb ? n : k, gc[i].tb ? k : n};
        struct tg t;
        tg_init(&t, KILN_OP_Gemm, 3, 4);
        tg_in(&t, 0, rand_tensor(2, ad), 0);
        tg_in(&t, 1, rand_tensor(2, bd), gc[i].konst);
        if (gc[i].c_rank) tg_in(&t, 2, rand_tensor(gc[i].c_rank, gc[i].c), 1);
        attr_int(&t, "transA", gc[i].ta);
        attr_int(&t, "transB", gc[i].tb);
        attr_float(&t, "alpha", gc[i].alpha);
        attr_float(&t, "beta", gc[i].beta);
        char what[64];
        snprintf(what, sizeof what, "gemm case %zu", i);
        /* a broadcast C of shape [M, 1] may stay on the reference; check values only */
        kiln_tensor *ref = run_ref(&t);
        int handled;
        kiln_tensor *got = run_fast(&t, NULL, 0, g_threads, &handled);
        CHECK(!handled || rel_err(ref, got) <= 1e-4, "%s: error %g", what, rel_err(ref, got));
        CHECK(handled || gc[i].c[1] == 1, "%s: declined", what);
        kiln_tensor_free(ref);
        kiln_tensor_free(got);
        tg_free(&t);
    }
    /* KilnFusedMatMul: bias, sum, activations, transposes, batched */
    static const struct {
        int ra;
        int64_t a[3];
        int64_t k, n;
        int ta, tb, bias, sum, konst;
        float alpha;
        const char *act;
        float act_alpha, act_beta;
    } fc[] = {
        {3, {2, 5, 16}, 16, 33, 0, 0, 1, 0, 1, 1.0f, "Gelu", 0, 0},
        {3, {2, 5, 17}, 17, 16, 0, 1, 1, 1, 1, 1.0f, "", 0, 0},
        {2, {65, 16}, 16, 15, 0, 0, 1, 0, 1, 0.5f, "Relu", 0, 0},
        {2, {1, 16}, 16, 17, 1, 0, 0, 1, 0, 2.0f, "Tanh", 0, 0},
        {3, {3, 4, 8}, 8, 8, 0, 0, 1, 1, 0, 1.0f, "GeluTanh", 0, 0},
        {2, {15, 16}, 16, 16, 0, 1, 1, 0, 1, 1.0f, "Sigmoid", 0, 0},
        {3, {2, 7, 16}, 16, 31, 0, 0, 1, 0, 1, 1.0f, "LeakyRelu", 0.1f, 0},
        {2, {17, 15}, 15, 32, 0, 1, 1, 1, 1, 1.0f, "Clip", 0.0f, 6.0f},
        {2, {16, 16}, 16, 16, 0, 0, 0, 0, 1, 1.0f, "Clip", -0.5f, 0.25f},
        {3, {2, 3, 33}, 33, 17, 0, 0, 1, 1, 1, 1.0f, "HardSwish", 0, 0},
        {2, {9, 16}, 16, 48, 0, 0, 1, 0, 1, 1.0f, "HardSigmoid", 0.25f, 0.4f},
        {3, {1, 1, 16}, 16, 16, 0, 1, 1, 0, 1, 1.0f, "SiLU", 0, 0},
        {2, {64, 32}, 32, 64, 0, 0, 1, 1, 1, 1.0f, "SiLU", 0, 0},
        {2, {12, 16}, 16, 2048, 0, 0, 1, 1, 1, 0.5f, "Relu", 0, 0}, /* B's rows padded */
        {2, {12, 16}, 16, 1024, 0, 1, 1, 0, 1, 1.0f, "Gelu", 0, 0},
    };
    for (size_t i = 0; i < sizeof fc / sizeof fc[0]; i++) {
        struct tg t;
        tg_init(&t, KILN_OP_KilnFusedMatMul, 4, 4);
        int64_t ad[3];
        memcpy(ad, fc[i].a, sizeof ad);
        if (fc[i].ta) {
            int64_t x = ad[fc[i].ra - 1];
            ad[fc[i].ra - 1] = ad[fc[i].ra - 2];
            ad[fc[i].ra - 2] = x;
        }
        int64_t bd[2] = {fc[i].tb ? fc[i].n : fc[i].k, fc[i].tb ? fc[i].k : fc[i].n};
        tg_in(&t, 0, rand_tensor(fc[i].ra, ad), 0);
        tg_in(&t, 1, rand_tensor(2, bd), fc[i].konst);
        if (fc[i].bias) tg_in(&t, 2, rand_tensor(1, &fc[i].n), 1);
        attr_int(&t, "transA", fc[i].ta);
        attr_int(&t, "transB", fc[i].tb);
        attr_float(&t, "alpha", fc[i].alpha);
        attr_str(&t, "activation", fc[i].act);
        if (fc[i].act_alpha != 0 || fc[i].act_beta != 0) {
            attr_float(&t, "act_alpha", fc[i].act_alpha);
            attr_float(&t, "act_beta", fc[i].act_beta);
        }
        if (fc[i].sum) {
            struct kiln_type ty;
            if (infer_out(&t, &ty) != KILN_OK) { fprintf(stderr, "%s\n", kiln_last_error()); abort(); }
            tg_in(&t, 3, rand_tensor(ty.rank, ty.dims), 0);
        }
        char what[64];
        snprintf(what, sizeof what, "fused matmul case %zu", i);
        differ(&t, what, NULL, 0, 1);
        tg_free(&t);
    }
}

/* kd_md_pad_rows: plain [.., K, N] with rows a multiple of 4 KB apart gets rows 16 floats
 * longer (outer dims following), anything else stays. */
/* kd_quantize_u8 (dynamic int8's per-run activation pass): its AVX-512 form gives the same
 * bytes, scale and zero point as the portable loops (KILN_ISA=avx2), on every count from 1
 * to 70 and on larger ones with tails, one and two threads, with NaN and infinities (skipped
 * by the range, NaN quantized to the zero point), all-negative and all-positive data, and
 * values on the rounding midpoints. */
static void test_quantize_u8(void)
{
    static const int64_t counts[] = {1, 2, 15, 16, 17, 31, 33, 64, 70, 16383, 16384, 16385,
                                     40000, 100003};
    int cases = 0;
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
        for (int kind = 0; kind < 4; kind++)
            for (int threads = 1; threads <= 2; threads++) {
                int64_t n = counts[ci];
                float *a = malloc(sizeof(float) * (size_t)n);
                uint8_t *q1 = malloc((size_t)n), *q2 = malloc((size_t)n);
                if (!a || !q1 || !q2) abort();
                uint32_t r = 12345u + (uint32_t)(n * 7 + kind);
                for (int64_t i = 0; i < n; i++) {
                    r = r * 1664525u + 1013904223u;
                    float u = (float)(r >> 8) / 16777216.0f; /* [0, 1) */
                    float v = kind == 0 ? 8.0f * u - 3.0f      /* asymmetric */
                              : kind == 1 ? -5.0f * u - 0.5f   /* all negative */
                              : kind == 2 ? 2.0f * u + 0.25f   /* all positive */
                                          : (float)((int)(u * 511.0f) - 255) * 0.5f; /* midpoints */
                    if (kind == 0 && i % 97 == 5) v = NAN;
                    if (kind == 0 && i % 89 == 7) v = i % 2 ? INFINITY : -INFINITY;
                    a[i] = v;
                }
                float s1, s2;
                int32_t z1, z2;
                setenv("KILN_ISA", "avx2", 1);
                kd_quantize_u8(a, n, q1, threads, &s1, &z1);
                unsetenv("KILN_ISA");
                kd_quantize_u8(a, n, q2, threads, &s2, &z2);
                CHECK(memcmp(&s1, &s2, sizeof s1) == 0 && z1 == z2,
                      "quantize_u8 n=%lld kind %d threads %d: scale %.9g / %.9g, zero point %d / %d",
                      (long long)n, kind, threads, (double)s1, (double)s2, z1, z2);
                int64_t bad = 0;
                for (int64_t i = 0; i < n; i++) bad += q1[i] != q2[i];
                CHECK(bad == 0, "quantize_u8 n=%lld kind %d threads %d: %lld bytes differ",
                      (long long)n, kind, threads, (long long)bad);
                if (kind == 0 && n > 100)
                    CHECK(q2[5] == (uint8_t)z2, "quantize_u8: NaN gave %d, not the zero point %d",
                          q2[5], z2);
                cases++;
                free(a);
                free(q1);
                free(q2);
            }
    printf("quantize_u8: %d cases, AVX-512 form %s\n", cases,
           kiln_cpu_isa() >= KILN_ISA_AVX512 ? "compared" : "not on this CPU (both portable)");
}

/* kd_to_bf16 (the bf16 kernels' per-run input pass): its AVX-512 form gives the bits of
 * kd_f32_to_bf16 on every float of a sweep (ties to even, subnormals, infinities, NaNs of
 * both signs and payloads), with tails, one and two threads. */
static void test_to_bf16(void)
{
    static const int64_t counts[] = {1, 15, 16, 17, 100, 16385, 70001};
    int cases = 0;
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
        for (int threads = 1; threads <= 2; threads++) {
            int64_t n = counts[ci];
            float *a = malloc(sizeof(float) * (size_t)n);
            uint16_t *h = malloc(2 * (size_t)n);
            if (!a || !h) abort();
            uint32_t r = 777u + (uint32_t)n;
            for (int64_t i = 0; i < n; i++) {
                r = r * 1664525u + 1013904223u;
                uint32_t bits = r;
                if (i % 5 == 1) bits = (r & 0xffff0000u) | 0x8000u;     /* a tie */
                if (i % 7 == 2) bits = (r & 0x807fffffu);               /* subnormal */
                if (i % 11 == 3) bits = 0x7f800000u | (r & 0x80000000u); /* infinity */
                if (i % 13 == 4) bits = 0x7f800001u | (r & 0x807fffffu); /* NaN */
                memcpy(&a[i], &bits, 4);
            }
            kd_to_bf16(a, n, h, threads);
            int64_t bad = 0;
            for (int64_t i = 0; i < n; i++) bad += h[i] != kd_f32_to_bf16(a[i]);
            CHECK(bad == 0, "to_bf16 n=%lld threads %d: %lld values differ from kd_f32_to_bf16",
                  (long long)n, threads, (long long)bad);
            cases++;
            free(a);
            free(h);
        }
    printf("to_bf16: %d cases\n", cases);
}

static void test_pad_rows(void)
{
    dnnl_memory_desc_t md, out;
    dnnl_dims_t d2 = {64, 1024}, d3 = {3, 8, 2048}, d2b = {64, 768};
    CHECK(dnnl_memory_desc_init_by_tag(&md, 2, d2, dnnl_f32, dnnl_ab) == dnnl_success &&
              kd_md_pad_rows(&md, &out) && out.format_desc.blocking.strides[0] == 1040 &&
              out.format_desc.blocking.strides[1] == 1 && out.dims[1] == 1024,
          "pad rows: [64, 1024] not padded to 1040");
    CHECK(dnnl_memory_desc_init_by_tag(&md, 3, d3, dnnl_f32, dnnl_abc) == dnnl_success &&
              kd_md_pad_rows(&md, &out) && out.format_desc.blocking.strides[0] == 8 * 2064 &&
              out.format_desc.blocking.strides[1] == 2064,
          "pad rows: [3, 8, 2048] strides");
    CHECK(dnnl_memory_desc_init_by_tag(&md, 2, d2b, dnnl_f32, dnnl_ab) == dnnl_success &&
              !kd_md_pad_rows(&md, &out),
          "pad rows: [64, 768] padded");
    CHECK(dnnl_memory_desc_init_by_tag(&md, 2, d2, dnnl_f32, dnnl_ba) == dnnl_success &&
              !kd_md_pad_rows(&md, &out),
          "pad rows: a transposed md padded");
    CHECK(dnnl_memory_desc_init_by_tag(&md, 2, d2, dnnl_f32, dnnl_ab) == dnnl_success,
          "pad rows: md");
    setenv("KILN_MATMUL_PAD", "0", 1);
    CHECK(!kd_md_pad_rows(&md, &out), "pad rows: KILN_MATMUL_PAD=0 padded");
    unsetenv("KILN_MATMUL_PAD");
}

/* ---- pooling ---- */

static void test_pool(void)
{
    static const struct {
        enum kiln_op op;
        int64_t c, h, w, k, s, pad, dil;
        int ceil, include_pad;
    } pc[] = {
        {KILN_OP_MaxPool, 16, 9, 9, 3, 2, 1, 1, 0, 0},
        {KILN_OP_MaxPool, 17, 8, 8, 2, 2, 0, 1, 1, 0},
        {KILN_OP_MaxPool, 3, 7, 7, 3, 1, 1, 2, 0, 0},
        {KILN_OP_AveragePool, 33, 7, 7, 3, 2, 1, 1, 0, 0},
        {KILN_OP_AveragePool, 16, 7, 7, 3, 2, 1, 1, 0, 1},
        {KILN_OP_AveragePool, 15, 8, 8, 3, 2, 0, 1, 1, 0},
        {KILN_OP_GlobalAveragePool, 17, 7, 7, 0, 0, 0, 0, 0, 0},
        {KILN_OP_GlobalAveragePool, 16, 1, 1, 0, 0, 0, 0, 0, 0},
        {KILN_OP_GlobalMaxPool, 33, 5, 3, 0, 0, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof pc / sizeof pc[0]; i++)
        for (int lay = 0; lay <= 2; lay++) {
            int b = lay == 0 ? 0 : lay == 1 ? 8 : 16;
            struct tg t;
            tg_init(&t, pc[i].op, 1, 6);
            int64_t xd[4] = {2, pc[i].c, pc[i].h, pc[i].w};
            tg_in(&t, 0, rand_tensor(4, xd), 0);
            if (pc[i].k) {
                int64_t ks[2] = {pc[i].k, pc[i].k}, st[2] = {pc[i].s, pc[i].s};
                int64_t pads[4] = {pc[i].pad, pc[i].pad, pc[i].pad, pc[i].pad};
                int64_t dl[2] = {pc[i].dil, pc[i].dil};
                attr_ints(&t, "kernel_shape", ks, 2);
                attr_ints(&t, "strides", st, 2);
                attr_ints(&t, "pads", pads, 4);
                if (pc[i].dil > 1) attr_ints(&t, "dilations", dl, 2);
                attr_int(&t, "ceil_mode", pc[i].ceil);
                if (pc[i].op == KILN_OP_AveragePool)
                    attr_int(&t, "count_include_pad", pc[i].include_pad);
            }
            int in_l[1] = {b};
            char what[64];
            snprintf(what, sizeof what, "pool case %zu", i);
            differ(&t, what, in_l, b, 1);
            tg_free(&t);
        }
}

/* ---- KilnReorder: reference and fast, round trips ---- */

static void test_reorder(void)
{
    static const int64_t shapes[][4] = {{1, 3, 5, 5}, {2, 16, 3, 3}, {1, 17, 1, 1}, {2, 33, 4, 7}};
    for (size_t s = 0; s < 4; s++)
        for (int from = 0; from <= 16; from += 8)
            for (int to = 0; to <= 16; to += 8) {
                struct tg t;
                tg_init(&t, KILN_OP_KilnReorder, 1, 2);
                kiln_tensor *x = rand_tensor(4, shapes[s]);
                tg_in(&t, 0, x, 0);
                attr_int(&t, "from", from);
                attr_int(&t, "to", to);
                /* reference: stored input in `from`, output read back from `to` */
                kiln_tensor *xs = to_layout(x, from);
                struct kiln_type ty;
                kiln_type_from_tensor(&ty, x);
                kiln_tensor *y = nan_tensor(&ty, to);
                kiln_tensor *ins[1] = {xs};
                struct kiln_run_ctx rc = {.node = tg_node(&t), .n_in = 1, .in = ins, .n_out = 1,
                                          .out = &y, .threads = 1};
                kiln_status st = kiln_op_impl(KILN_OP_KilnReorder)->run(&rc);
                CHECK(st == KILN_OK, "ref reorder %d->%d: %s", from, to, kiln_last_error());
                int pad_bad = 0;
                kiln_tensor *back = from_layout(y, to, &pad_bad);
                CHECK(!pad_bad && rel_err(x, back) == 0, "ref reorder %d->%d of case %zu", from,
                      to, s);
                kiln_tensor_free(back);
                kiln_tensor_free(y);
                kiln_tensor_free(xs);
                /* fast */
                int in_l[1] = {from}, handled;
                kiln_tensor *got = run_fast(&t, in_l, to, g_threads, &handled);
                CHECK(handled && rel_err(x, got) == 0, "fast reorder %d->%d of case %zu", from,
                      to, s);
                kiln_tensor_free(got);
                tg_free(&t);
            }
}

/* ---- KilnMBConv (src/kernels/simd/mbconv.c) ---- */

struct mb_case {
    int64_t n, cin, ce, cout, h, w, k, s;
    int expand, sum;
    const char *act[3]; /* expand, depthwise, project */
    float lo[3], hi[3]; /* Clip bounds */
    int64_t cse;        /* squeeze-excitation channels (0 = none) */
    const char *se_act; /* its first product's activation */
};

static void build_mbconv(struct tg *t, const struct mb_case *c)
{
    tg_init(t, KILN_OP_KilnMBConv, c->cse ? 12 : c->sum ? 8 : 7, c->cse ? 14 : 11);
    int64_t cin = c->expand ? c->cin : c->ce;
    int64_t xd[4] = {c->n, cin, c->h, c->w}, we[4] = {c->ce, cin, 1, 1};
    int64_t wd[4] = {c->ce, 1, c->k, c->k}, wp[4] = {c->cout, c->ce, 1, 1};
    tg_in(t, 0, rand_tensor(4, xd), 0);
    if (c->expand) {
        tg_in(t, 1, rand_tensor(4, we), 1);
        tg_in(t, 2, rand_tensor(1, &c->ce), 1);
    }
    tg_in(t, 3, rand_tensor(4, wd), 1);
    tg_in(t, 4, rand_tensor(1, &c->ce), 1);
    tg_in(t, 5, rand_tensor(4, wp), 1);
    tg_in(t, 6, rand_tensor(1, &c->cout), 1);
    attr_int(t, "dw_kernel", c->k);
    attr_int(t, "dw_stride", c->s);
    static const char *const names[3][3] = {
        {"expand_activation", "expand_act_alpha", "expand_act_beta"},
        {"dw_activation", "dw_act_alpha", "dw_act_beta"},
        {"activation", "act_alpha", "act_beta"},
    };
    for (int i = 0; i < 3; i++) {
        attr_str(t, names[i][0], c->act[i]);
        attr_float(t, names[i][1], c->lo[i]);
        attr_float(t, names[i][2], c->hi[i]);
    }
    if (c->cse) {
        int64_t w1[4] = {c->cse, c->ce, 1, 1}, w2[4] = {c->ce, c->cse, 1, 1};
        tg_in(t, 8, rand_tensor(4, w1), 1);
        tg_in(t, 9, rand_tensor(1, &c->cse), 1);
        tg_in(t, 10, rand_tensor(4, w2), 1);
        tg_in(t, 11, rand_tensor(1, &c->ce), 1);
        attr_str(t, "se_activation", c->se_act);
        attr_float(t, "se_act_alpha", -1.0f);
        attr_float(t, "se_act_beta", 1.0f);
    }
    if (c->sum) {
        struct kiln_type ty;
        if (infer_out(t, &ty) != KILN_OK) abort();
        tg_in(t, 7, rand_tensor(4, ty.dims), 0);
    }
}

/* The fused kernel (blocked input, residual and output; 1, 2 and 3 threads:
 * row ranges that split images and bands) against KilnMBConv's reference
 * kernel, which computes the three convolutions in double. Shapes: channel
 * counts below, at and above the block of 16, 1x1 and odd planes, 3x3, 5x5
 * and 7x7, strides 1, 2 and 3, planes tall enough for several bands, input channels
 * enough for several weight slices; every activation. The whole-model and
 * ONNX tests (tests/python) check the fused graph against the unfused
 * reference convolutions. */
static void test_mbconv(void)
{
    static const struct mb_case cases[] = {
        {2, 16, 96, 24, 16, 16, 3, 2, 1, 0, {"Clip", "Clip", ""}, {0, 0, 0}, {6, 6, 0}, 0, NULL},
        {1, 24, 144, 24, 9, 7, 3, 1, 1, 1, {"Relu", "Relu", ""}, {0}, {0}, 0, NULL},
        {3, 3, 17, 5, 5, 6, 5, 1, 1, 0, {"SiLU", "SiLU", "SiLU"}, {0}, {0}, 0, NULL},
        {1, 33, 40, 33, 13, 13, 5, 2, 1, 1, {"Clip", "", "Relu"}, {-1, 0, 0}, {2, 0, 0}, 0, NULL},
        {2, 0, 32, 16, 12, 12, 3, 1, 0, 0, {"", "Clip", ""}, {0, 0, 0}, {0, 6, 0}, 0, NULL},
        {1, 0, 17, 17, 5, 3, 3, 2, 0, 1, {"", "Relu", "Clip"}, {0, 0, -0.5f}, {0, 0, 0.5f}, 0, NULL},
        {2, 16, 16, 16, 1, 1, 3, 1, 1, 1, {"Relu", "Relu", ""}, {0}, {0}, 0, NULL},
        {1, 160, 960, 160, 7, 7, 3, 1, 1, 1, {"Clip", "Clip", ""}, {0, 0, 0}, {6, 6, 0}, 0, NULL},
        {1, 24, 144, 24, 56, 56, 3, 1, 1, 1, {"Clip", "Clip", ""}, {0, 0, 0}, {6, 6, 0}, 0, NULL},
        {2, 32, 192, 64, 28, 28, 3, 2, 1, 0, {"Clip", "Clip", ""}, {0, 0, 0}, {6, 6, 0}, 0, NULL},
        /* the generic depthwise loops: 7x7, and stride 3 */
        {1, 8, 24, 8, 11, 9, 7, 1, 1, 1, {"Relu", "SiLU", ""}, {0}, {0}, 0, NULL},
        {2, 16, 32, 16, 10, 10, 3, 3, 1, 0, {"", "Relu", "Relu"}, {0}, {0}, 0, NULL},
        /* squeeze-excitation: one image split between threads (channel
         * blocks, then pixels or output blocks) or whole images per thread;
         * the gate folded into D in place, into a copy of D, or into the
         * weights; hidden widths below and above 4 and 16 */
        {1, 16, 96, 24, 24, 24, 3, 2, 1, 0, {"SiLU", "SiLU", ""}, {0}, {0}, 4, "SiLU"},
        {1, 24, 144, 24, 14, 14, 5, 1, 1, 1, {"SiLU", "SiLU", ""}, {0}, {0}, 6, "SiLU"},
        {1, 40, 200, 72, 5, 4, 5, 1, 1, 1, {"SiLU", "SiLU", ""}, {0}, {0}, 10, "Relu"},
        {3, 16, 50, 16, 6, 7, 3, 1, 1, 0, {"Clip", "Relu", "Relu"}, {0, 0, 0}, {6, 0, 0}, 17, "Clip"},
        {2, 0, 33, 8, 9, 9, 3, 2, 0, 0, {"", "SiLU", ""}, {0}, {0}, 3, ""},
        {1, 192, 1152, 320, 7, 7, 3, 1, 1, 0, {"SiLU", "SiLU", ""}, {0}, {0}, 48, "SiLU"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct mb_case *c = &cases[i];
        struct tg t;
        build_mbconv(&t, c);
        char what[160];
        snprintf(what, sizeof what,
                 "mbconv %lldx%lld %lld->%lld->%lld->%lld k%lld s%lld n%lld se%lld%s",
                 (long long)c->h, (long long)c->w, (long long)c->cin, (long long)c->ce,
                 (long long)c->cout, (long long)c->ce, (long long)c->k, (long long)c->s,
                 (long long)c->n, (long long)c->cse, c->sum ? " +sum" : "");
        int in_l[12] = {16, 0, 0, 0, 0, 0, 0, 16};
        differ(&t, what, in_l, 16, 1);
        kiln_tensor *ref = run_ref(&t);
        int handled;
        kiln_tensor *got = run_fast(&t, in_l, 16, 3, &handled);
        CHECK(handled && rel_err(ref, got) <= 1e-4, "%s on 3 threads: error %g", what,
              rel_err(ref, got));
        kiln_tensor_free(got);
        kiln_tensor_free(ref);
        /* the kernel takes blocked storage only; a KILN_ISA set after the
         * model was optimized must not leave a fused node without it */
        int plain[12] = {0};
        got = run_fast(&t, plain, 0, 1, &handled);
        CHECK(!handled, "%s: accepted plain storage", what);
        kiln_tensor_free(got);
        setenv("KILN_ISA", "avx2", 1);
        got = run_fast(&t, in_l, 16, 1, &handled);
        unsetenv("KILN_ISA");
        CHECK(handled, "%s: declined under KILN_ISA=avx2", what);
        kiln_tensor_free(got);
        tg_free(&t);
    }
}

/* The fused kernel's own SiLU, alone: identity expand and project, a depthwise kernel
 * whose only tap is its center, no biases, so that Y = SiLU(SiLU(X)) with products by 1
 * and sums with 0 only; compared with the double-precision function at every input in
 * [-30, 30] (where e^-x is normal), relative 1.5e-6 (the float log2(e) alone moves e^-x by
 * up to 1.5e-8 |x log2(e)|). */
static double silu_d(double x) { return x / (1.0 + exp(-x)); }

static void test_mbconv_silu(void)
{
    const struct mb_case c = {1, 16, 16, 16, 8, 8, 3, 1, 1, 0, {"SiLU", "SiLU", ""}, {0}, {0},
                              0, NULL};
    struct tg t;
    build_mbconv(&t, &c);
    float *x = t.in[0]->data, *we = t.in[1]->data, *be = t.in[2]->data, *wd = t.in[3]->data,
          *bd = t.in[4]->data, *wp = t.in[5]->data, *bp = t.in[6]->data;
    int64_t n = 16 * 8 * 8;
    for (int64_t i = 0; i < n; i++) x[i] = (float)(-30.0 + 60.0 * (double)i / (double)(n - 1));
    for (int i = 0; i < 16; i++) {
        for (int j = 0; j < 16; j++) we[i * 16 + j] = wp[i * 16 + j] = i == j ? 1.0f : 0.0f;
        for (int k = 0; k < 9; k++) wd[i * 9 + k] = k == 4 ? 1.0f : 0.0f;
        be[i] = bd[i] = bp[i] = 0.0f;
    }
    int in_l[12] = {16, 0, 0, 0, 0, 0, 0, 16}, handled;
    kiln_tensor *got = run_fast(&t, in_l, 16, 1, &handled);
    double worst = 0.0;
    for (int64_t i = 0; handled && got && i < n; i++) {
        double want = silu_d(silu_d((double)x[i]));
        double e = fabs(((float *)got->data)[i] - want) / fmax(fabs(want), 1e-30);
        if (!(e <= worst)) worst = e;
    }
    CHECK(handled && worst <= 1.5e-6, "fused SiLU on [-30, 30]: relative error %g", worst);
    kiln_tensor_free(got);
    /* SiLU(SiLU(x)) beyond +-80 is x above and 0 below (SiLU is under 1e-32 there; the
     * clamped quotient alone would not be for x near -FLT_MAX) */
    /* past the clamp, one value per channel at pixel (3, 3) (infinities and NaN cannot be
     * checked this way: the identity's zeros turn them into NaN, as in any convolution) */
    static const float edge[6] = {90.0f, 200.0f, 3e38f, -90.0f, -200.0f, -3e38f};
    for (int64_t i = 0; i < n; i++) x[i] = 0.0f;
    for (int ch = 0; ch < 6; ch++) x[ch * 64 + 27] = edge[ch];
    got = run_fast(&t, in_l, 16, 1, &handled);
    float y[6] = {0};
    for (int ch = 0; ch < 6; ch++) y[ch] = handled && got ? ((float *)got->data)[ch * 64 + 27] : 1;
    CHECK(y[0] == 90.0f && y[1] == 200.0f && y[2] == 3e38f, "fused SiLU above 80: %g %g %g",
          y[0], y[1], y[2]);
    CHECK(y[3] == 0.0f && y[4] == 0.0f && y[5] == 0.0f, "fused SiLU below -80: %g %g %g", y[3],
          y[4], y[5]);
    kiln_tensor_free(got);
    tg_free(&t);
}

/* ---- the layout pass on a small network, run node by node ---- */

/* Run g (verified) node by node: fast kernels with the values' layouts when
 * use_fast, else the reference kernels; returns output 0 (plain). */
static kiln_tensor *run_graph(struct kiln_graph *g, kiln_tensor *input, int use_fast)
{
    kiln_tensor **val = calloc((size_t)g->n_values, sizeof *val);
    val[g->inputs[0]] = input;
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == KILN_VALUE_CONST) val[v] = g->values[v].konst;
    int ok = 1;
    for (int oi = 0; oi < g->n_nodes && ok; oi++) {
        const struct kiln_node *n = &g->nodes[g->order[oi]];
        const struct kiln_type *ins[4] = {0};
        const kiln_tensor *vals[4] = {0};
        struct kiln_type types[4], ty;
        int in_l[4] = {0}, out_l[1] = {g->values[n->out[0]].layout};
        for (int i = 0; i < n->n_in; i++) {
            if (n->in[i] < 0) continue;
            kiln_type_from_tensor(&types[i], val[n->in[i]]);
            ins[i] = &types[i];
            if (g->values[n->in[i]].kind == KILN_VALUE_CONST) vals[i] = val[n->in[i]];
            in_l[i] = g->values[n->in[i]].layout;
        }
        struct kiln_type *outs[1] = {&ty};
        struct kiln_infer_ctx ic = {n, n->n_in, ins, vals, 1, outs};
        const struct kiln_op_impl *impl = kiln_op_impl(n->op);
        if (impl->infer(&ic) != KILN_OK) { ok = 0; break; }
        kiln_tensor *y = nan_tensor(&ty, out_l[0]);
        kiln_tensor *in[4] = {0};
        for (int i = 0; i < n->n_in; i++) in[i] = n->in[i] >= 0 ? val[n->in[i]] : NULL;
        struct kiln_run_ctx rc = {.node = n, .n_in = n->n_in, .in = in, .n_out = 1, .out = &y,
                                  .threads = g_threads};
        struct kiln_kernel_inst inst;
        memset(&inst, 0, sizeof inst);
        const struct kiln_fast_op *f = use_fast ? kiln_fast_op(n->op) : NULL;
        const struct kiln_type *couts[1] = {&ty};
        struct kiln_compile_ctx cc = {n, n->n_in, ins, vals, in_l, 1, couts, out_l, g_cache,
                                      g_threads, 0, 0};
        if (f && f->compile(&cc, &inst) != KILN_OK) ok = 0;
        int blocked = out_l[0];
        for (int i = 0; i < n->n_in; i++) blocked |= in_l[i];
        if (ok && !inst.run && blocked) {
            fprintf(stderr, "%s node '%s' with blocked values fell back to the reference\n",
                    n->op_type, n->name);
            ok = 0;
        }
        void *scratch = inst.scratch_bytes ? aligned_alloc(64, (inst.scratch_bytes + 63) / 64 * 64) : NULL;
        if (ok && inst.run) ok = inst.run(inst.state, &rc) == KILN_OK;
        else if (ok) ok = impl->run(&rc) == KILN_OK;
        free(scratch);
        kiln_kernel_inst_destroy(&inst);
        val[n->out[0]] = y;
    }
    kiln_tensor *out = NULL;
    if (ok) {
        out = val[g->outputs[0]];
        val[g->outputs[0]] = NULL;
    }
    for (int v = 0; v < g->n_values; v++)
        if (val[v] && g->values[v].kind == KILN_VALUE_NODE) kiln_tensor_free(val[v]);
    free(val);
    return out;
}

/* Add a node (one output, value `name`) to g; returns its output value id. */
static int add_node(struct kiln_graph *g, enum kiln_op op, const int *ins, int n_in,
                    const char *name, int *node_out)
{
    struct kiln_node *n;
    if (kiln_graph_node_add(g, op, name, n_in, 1, 8, &n) != KILN_OK) abort();
    n->n_attr = 0;
    for (int i = 0; i < n_in; i++) n->in[i] = ins[i];
    int id;
    if (kiln_graph_value_add(g, name, KILN_VALUE_NODE, &id) != KILN_OK) abort();
    g->values[id].producer = g->n_nodes - 1;
    g->nodes[g->n_nodes - 1].out[0] = id;
    *node_out = g->n_nodes - 1;
    return id;
}

static void node_attr_ints(struct kiln_graph *g, int node, const char *name, int64_t a, int64_t b,
                           int count)
{
    struct kiln_node *n = &g->nodes[node];
    struct kiln_attr *at = &n->attr[n->n_attr++];
    at->name = kiln_arena_strdup(g->mem, name);
    at->type = KILN_ATTR_INTS;
    at->n = count;
    at->ints = kiln_arena_alloc(g->mem, sizeof(int64_t) * 4);
    for (int i = 0; i < count; i++) at->ints[i] = i % 2 ? b : a;
}

static int add_const(struct kiln_graph *g, int rank, const int64_t *dims)
{
    int id;
    kiln_tensor *x = rand_tensor(rank, dims);
    if (kiln_graph_value_add(g, "w", KILN_VALUE_CONST, &id) != KILN_OK) abort();
    kiln_graph_own_tensor(g, x);
    g->values[id].konst = x;
    kiln_type_from_tensor(&g->values[id].type, x);
    return id;
}

/* Set every value's type by running the reference infer over the graph in order. */
static void infer_types(struct kiln_graph *g)
{
    for (int oi = 0; oi < g->n_nodes; oi++) {
        const struct kiln_node *n = &g->nodes[g->order[oi]];
        const struct kiln_type *ins[4] = {0};
        const kiln_tensor *vals[4] = {0};
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] >= 0) {
                ins[i] = &g->values[n->in[i]].type;
                vals[i] = g->values[n->in[i]].konst;
            }
        struct kiln_type *outs[1] = {&g->values[n->out[0]].type};
        struct kiln_infer_ctx ic = {n, n->n_in, ins, vals, 1, outs};
        if (kiln_op_impl(n->op)->infer(&ic) != KILN_OK) abort();
    }
}

/*
 * x[1,3,16,16] -> Conv 3->16 (first conv) -> MaxPool -> FusedConv 16->24 +Relu ->
 * FusedConv 24->24 (Sum = previous) -> Flatten (not blocked)       [output 0]
 *                                    -> GlobalAveragePool          [output 1]
 */
static void test_layout_pass(int block_isa)
{
    struct kiln_graph *g;
    if (kiln_graph_new(&g) != KILN_OK) abort();
    g->inputs = kiln_arena_alloc(g->mem, sizeof(int) * 2);
    g->outputs = kiln_arena_alloc(g->mem, sizeof(int) * 3);
    int x;
    if (kiln_graph_value_add(g, "x", KILN_VALUE_INPUT, &x) != KILN_OK) abort();
    int64_t xd[4] = {1, 3, 16, 16};
    kiln_tensor *input = rand_tensor(4, xd);
    kiln_type_from_tensor(&g->values[x].type, input);
    g->inputs[g->n_inputs++] = x;
    int node;
    int64_t w1[4] = {16, 3, 3, 3}, w2[4] = {24, 16, 3, 3}, w3[4] = {24, 24, 1, 1}, b24 = 24;
    int c1in[3] = {x, add_const(g, 4, w1), add_const(g, 1, (int64_t[]){16})};
    int c1 = add_node(g, KILN_OP_Conv, c1in, 3, "c1", &node);
    node_attr_ints(g, node, "pads", 1, 1, 4);
    int p1 = add_node(g, KILN_OP_MaxPool, &c1, 1, "p1", &node);
    node_attr_ints(g, node, "kernel_shape", 2, 2, 2);
    node_attr_ints(g, node, "strides", 2, 2, 2);
    int c2in[3] = {p1, add_const(g, 4, w2), add_const(g, 1, &b24)};
    int c2 = add_node(g, KILN_OP_KilnFusedConv, c2in, 3, "c2", &node);
    node_attr_ints(g, node, "pads", 1, 1, 4);
    struct kiln_attr *a = &g->nodes[node].attr[g->nodes[node].n_attr++];
    a->name = "activation";
    a->type = KILN_ATTR_STRING;
    a->s.data = "Relu";
    a->s.len = 4;
    int c3in[4] = {c2, add_const(g, 4, w3), add_const(g, 1, &b24), c2};
    int c3 = add_node(g, KILN_OP_KilnFusedConv, c3in, 4, "c3", &node);
    int fl = add_node(g, KILN_OP_Flatten, &c3, 1, "flat", &node);
    int gp = add_node(g, KILN_OP_GlobalAveragePool, &c3, 1, "gap", &node);
    g->outputs[g->n_outputs++] = fl;
    g->outputs[g->n_outputs++] = gp;
    g->outputs[g->n_outputs++] = c2;
    if (kiln_graph_verify(g) != KILN_OK) {
        CHECK(0, "verify: %s", kiln_last_error());
        return;
    }
    infer_types(g);
    kiln_tensor *ref0 = run_graph(g, input, 0);

    setenv("KILN_ISA", block_isa == 16 ? "avx512" : "avx2", 1);
    struct kiln_opt_pass_log pl;
    memset(&pl, 0, sizeof pl);
    kiln_status st = kiln_opt_layout(g, &pl);
    unsetenv("KILN_ISA");
    CHECK(st == KILN_OK, "layout pass: %s", kiln_last_error());
    st = kiln_graph_verify(g);
    CHECK(st == KILN_OK, "verify after the layout pass: %s", kiln_last_error());
    int reorders = 0, blocked = 0;
    for (int k = 0; k < pl.n_kinds; k++) {
        if (!strcmp(pl.kinds[k].kind, "KilnReorder")) reorders = pl.kinds[k].count;
        if (!strcmp(pl.kinds[k].kind, "blocked value")) blocked = pl.kinds[k].count;
    }
    /* blocked: c1, p1, c2's twin (c2 is a graph output), c3; reorders: c2's twin -> c2,
     * c3 -> plain for Flatten; the global pool (no blocked reader) writes plain */
    int c2_node = g->values[c2].producer, c2_twin = -1;
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k].op == KILN_OP_KilnFusedConv && g->nodes[k].in[3] >= 0)
            c2_twin = g->nodes[k].in[0];
    CHECK(g->values[x].layout == 0, "the input stays plain");
    CHECK(g->values[c1].layout == block_isa && g->values[p1].layout == block_isa &&
              c2_twin >= 0 && g->values[c2_twin].layout == block_isa &&
              g->values[c3].layout == block_isa,
          "chain blocked: %d %d %d %d", g->values[c1].layout, g->values[p1].layout,
          c2_twin >= 0 ? g->values[c2_twin].layout : -1, g->values[c3].layout);
    CHECK(g->values[fl].layout == 0 && g->values[gp].layout == 0 && g->values[c2].layout == 0,
          "graph outputs stay plain");
    CHECK(g->nodes[c2_node].op == KILN_OP_KilnReorder, "c2 is written by a KilnReorder");
    CHECK(reorders == 2 && blocked == 4, "reorders %d, blocked values %d", reorders, blocked);
    if (kiln_weight_cache_new(&g_cache) != KILN_OK) abort();
    kiln_tensor *out0 = run_graph(g, input, 1);
    kiln_weight_cache_free(g_cache);
    g_cache = NULL;
    CHECK(rel_err(ref0, out0) <= 1e-4, "blocked network (block %d) differs: %g", block_isa,
          rel_err(ref0, out0));
    kiln_tensor_free(ref0);
    kiln_tensor_free(out0);
    kiln_tensor_free(input);
    kiln_graph_free(g);
}

/* ---- figures (KILN_VERBOSE=1): a resnet and a few MobileNet / EfficientNet shapes ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench_conv(const struct conv_case *k, int layout)
{
    struct tg t;
    build_conv(&t, k);
    struct kiln_type ty, types[3];
    const struct kiln_type *ins[4] = {0};
    const kiln_tensor *vals[4] = {0};
    for (int i = 0; i < 3; i++) {
        kiln_type_from_tensor(&types[i], t.in[i]);
        ins[i] = &types[i];
    }
    vals[1] = t.in[1];
    vals[2] = t.in[2];
    infer_out(&t, &ty);
    double flops = 2.0 * (double)kiln_shape_count(4, ty.dims) * (double)(k->c / k->group) *
                   (double)(k->kh * k->kw);
    int in_l[4] = {layout, 0, 0, 0}, out_l[1] = {layout};
    const struct kiln_type *outs[1] = {&ty};
    struct kiln_compile_ctx cc = {tg_node(&t), 4, ins, vals, in_l, 1, outs, out_l, t.wc,
                                  g_threads, 0, 0};
    struct kiln_kernel_inst inst;
    memset(&inst, 0, sizeof inst);
    double t0 = now_s();
    kiln_status st = kiln_fast_op(KILN_OP_KilnFusedConv)->compile(&cc, &inst);
    double compile_s = now_s() - t0;
    if (st != KILN_OK || !inst.run) {
        printf("bench: not compiled\n");
        tg_free(&t);
        return;
    }
    kiln_tensor *x = to_layout(t.in[0], layout), *y = nan_tensor(&ty, layout);
    kiln_tensor *in[4] = {x, t.in[1], t.in[2], NULL};
    void *scratch = inst.scratch_bytes ? aligned_alloc(64, (inst.scratch_bytes + 63) / 64 * 64) : NULL;
    double best[2] = {1e9, 1e9};
    for (int th = 1; th <= 2; th++) {
        struct kiln_run_ctx rc = {.node = tg_node(&t), .n_in = 4, .in = in, .n_out = 1, .out = &y,
                                  .scratch = scratch, .threads = th == 1 ? 1 : g_threads};
        for (int i = 0; i < 50; i++) {
            t0 = now_s();
            inst.run(inst.state, &rc);
            double dt = now_s() - t0;
            if (dt < best[th - 1]) best[th - 1] = dt;
        }
    }
    printf("conv %lldx%lld %lld->%lld g%lld s%lld at %lldx%lld +%s (%s, %s): %.1f us, %.1f "
           "GFLOP/s on 1 thread; %.1f us on %d; compile %.1f ms\n",
           (long long)k->kh, (long long)k->kw, (long long)k->c, (long long)k->m,
           (long long)k->group, (long long)k->stride, (long long)k->h, (long long)k->w,
           k->act && k->act[0] ? k->act : "bias",
           layout ? (layout == 16 ? "nChw16c" : "nChw8c") : "nchw", inst.name, best[0] * 1e6,
           flops / best[0] * 1e-9, best[1] * 1e6, g_threads, compile_s * 1e3);
    free(scratch);
    kiln_kernel_inst_destroy(&inst);
    kiln_tensor_free(x);
    kiln_tensor_free(y);
    tg_free(&t);
}

static void bench_convs(void)
{
    static const struct conv_case resnet = {1, 64, 56, 56, 64, 3, 3, 1, 1, 1, {1, 1, 1, 1},
                                            NULL, 1, 0, "Relu", 0, 0};
    for (int lay = 0; lay <= 16; lay += 8) bench_conv(&resnet, lay);
    static const struct conv_case dw[] = {
        {1, 32, 112, 112, 32, 3, 3, 32, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "Clip", 0, 6},
        {1, 96, 112, 112, 96, 3, 3, 96, 2, 1, {1, 1, 1, 1}, NULL, 1, 0, "Clip", 0, 6},
        {1, 144, 56, 56, 144, 3, 3, 144, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "SiLU", 0, 0},
        {1, 240, 28, 28, 240, 5, 5, 240, 1, 1, {2, 2, 2, 2}, NULL, 1, 0, "SiLU", 0, 0},
        {1, 672, 14, 14, 672, 5, 5, 672, 1, 1, {2, 2, 2, 2}, NULL, 1, 0, "SiLU", 0, 0},
        {32, 144, 56, 56, 144, 3, 3, 144, 1, 1, {1, 1, 1, 1}, NULL, 1, 0, "SiLU", 0, 0},
    };
    for (size_t i = 0; i < sizeof dw / sizeof dw[0]; i++) bench_conv(&dw[i], 16);
}

int main(void)
{
    if (!kiln_fast_op(KILN_OP_Conv)) {
        printf("fast kernels disabled (KILN_FAST=0): nothing to compare\n");
        return 0;
    }
    test_conv();
    test_conv_gemm();
    test_conv_any();
    test_conv1d_pad();
    test_conv_merge();
    int conv_inplace = g_inplace_runs;
    test_matmul();
    test_pad_rows();
    test_quantize_u8();
    test_to_bf16();
    /* residual sums: Y written over the Sum input, as plans run them when it dies there */
    CHECK(conv_inplace >= 8 && g_inplace_runs - conv_inplace >= 6,
          "in-place runs: %d conv, %d matmul", conv_inplace, g_inplace_runs - conv_inplace);
    printf("%d conv and %d matmul runs in place\n", conv_inplace, g_inplace_runs - conv_inplace);
    test_pool();
    test_deconv();
    test_reorder();
    if (kiln_cpu_isa() == KILN_ISA_AVX512 && kiln_mbconv_cpu_ok()) {
        test_mbconv();
        test_mbconv_silu();
    }
    else printf("no AVX-512: the fused MBConv kernel is not compiled here\n");
    if (kiln_cpu_isa() == KILN_ISA_AVX512) test_layout_pass(16);
    else printf("no AVX-512: the layout pass blocks by 8 only, its 16-block case is skipped\n");
    test_layout_pass(8);
    const char *verbose = getenv("KILN_VERBOSE");
    if (verbose && strcmp(verbose, "0") != 0) {
        bench_convs();
    }
    return CHECK_DONE();
}
