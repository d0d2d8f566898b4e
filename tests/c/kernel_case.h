/*
 * kernel_case.h - one-node graphs run through a reference kernel and the
 * fast kernels, for the differential tests (unit_simd.c, unit_kernels.c).
 *
 * Each case builds a one-node graph, computes the expected outputs with
 * the op's reference kernel (kiln_op_impl: infer, then run), and compiles
 * and runs the fast kernel (kiln_fast_op: the op's choice) once per ISA
 * this CPU has (KILN_ISA=scalar|avx2|avx512 before each compile), or one
 * kernel of a family forced (forced_kernel), into outputs prefilled with
 * NaN garbage (the plan's outputs are not zeroed), on one thread and on
 * two; the two must agree exactly.
 */
#ifndef KILN_TEST_KERNEL_CASE_H
#define KILN_TEST_KERNEL_CASE_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocked_layout.h"
#include "check.h"
#include "core/threadpool.h"
#include "kernels/family.h"
#include "kernels/fast.h"
#include "kernels/kernel.h"
#include "kernels/simd/simd.h"
#include "kernels/simd/skinny.h"

/* ---- Random numbers (xorshift, reproducible) ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static inline uint64_t rng_next(void) { return check_xorshift(&rng_state); }
static inline float rng_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)((rng_next() >> 11) * (1.0 / 9007199254740992.0));
}
static inline float rng_normal(void)
{
    float u = rng_uniform(1e-7f, 1.0f), v = rng_uniform(0.0f, 1.0f);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* ---- One-node graphs ---- */

#define MAX_IO 14 /* KilnQLinearConvAdd has 14 inputs */

struct case_node {
    struct kiln_graph *g;
    struct kiln_node *node;
    int n_in, n_out;
    kiln_tensor *in[MAX_IO];
    bool is_const[MAX_IO];
    bool out_wanted[MAX_IO];
};

static inline void cn_init(struct case_node *c, enum kiln_op op, int opset, int n_in, int n_out)
{
    memset(c, 0, sizeof *c);
    if (kiln_graph_new(&c->g) != KILN_OK) abort();
    if (kiln_graph_node_add(c->g, op, "node_under_test", n_in, n_out, 16, &c->node) != KILN_OK)
        abort();
    c->node->opset = opset;
    c->node->n_attr = 0;
    c->n_in = n_in;
    c->n_out = n_out;
    for (int k = 0; k < n_out; k++) {
        char name[16];
        int id;
        snprintf(name, sizeof name, "out%d", k);
        if (kiln_graph_value_add(c->g, name, KILN_VALUE_NODE, &id) != KILN_OK) abort();
        c->node->out[k] = id;
        c->out_wanted[k] = k == 0;
    }
}

/* Input i (x NULL = absent); the case owns x. */
static inline void cn_input(struct case_node *c, int i, kiln_tensor *x, bool konst)
{
    c->in[i] = x;
    c->is_const[i] = konst;
    if (!x) {
        c->node->in[i] = -1;
        return;
    }
    char name[16];
    int id;
    snprintf(name, sizeof name, "in%d", i);
    if (kiln_graph_value_add(c->g, name, konst ? KILN_VALUE_CONST : KILN_VALUE_INPUT, &id) !=
        KILN_OK)
        abort();
    c->node->in[i] = id;
}

static inline struct kiln_attr *cn_attr(struct case_node *c, const char *name, enum kiln_attr_type t)
{
    struct kiln_attr *a = &c->node->attr[c->node->n_attr++];
    a->name = kiln_arena_strdup(c->g->mem, name);
    a->type = t;
    return a;
}
static inline void attr_int(struct case_node *c, const char *name, int64_t v)
{
    cn_attr(c, name, KILN_ATTR_INT)->i = v;
}
static inline void attr_float(struct case_node *c, const char *name, float v)
{
    cn_attr(c, name, KILN_ATTR_FLOAT)->f = v;
}
static inline void attr_str(struct case_node *c, const char *name, const char *v)
{
    struct kiln_attr *a = cn_attr(c, name, KILN_ATTR_STRING);
    a->s.len = strlen(v);
    a->s.data = kiln_arena_strdup(c->g->mem, v);
}
static inline void attr_ints(struct case_node *c, const char *name, const int64_t *v, int n)
{
    struct kiln_attr *a = cn_attr(c, name, KILN_ATTR_INTS);
    a->n = n;
    a->ints = kiln_arena_alloc(c->g->mem, sizeof(int64_t) * (size_t)(n ? n : 1));
    if (n) memcpy(a->ints, v, sizeof(int64_t) * (size_t)n);
}

static inline void cn_free(struct case_node *c)
{
    for (int i = 0; i < c->n_in; i++) kiln_tensor_free(c->in[i]);
    kiln_graph_free(c->g);
}

static inline kiln_tensor *tensor_f32(int rank, const int64_t *dims)
{
    kiln_tensor *t;
    if (kiln_tensor_new(KILN_DTYPE_F32, rank, dims, &t) != KILN_OK) abort();
    return t;
}

/* Output types by the op's shape function. */
static inline kiln_status cn_infer(struct case_node *c, struct kiln_type *types)
{
    struct kiln_type in_t[MAX_IO];
    const struct kiln_type *in_p[MAX_IO];
    const kiln_tensor *in_v[MAX_IO];
    struct kiln_type *out_p[MAX_IO];
    for (int i = 0; i < c->n_in; i++) {
        in_p[i] = NULL;
        in_v[i] = c->in[i];
        if (c->in[i]) {
            kiln_type_from_tensor(&in_t[i], c->in[i]);
            in_p[i] = &in_t[i];
        }
    }
    for (int k = 0; k < c->n_out; k++) {
        kiln_type_unknown(&types[k]);
        out_p[k] = c->out_wanted[k] ? &types[k] : NULL;
    }
    struct kiln_infer_ctx ic = {c->node, c->n_in, in_p, in_v, c->n_out, out_p};
    return kiln_op_impl(c->node->op)->infer(&ic);
}

static inline void free_outs(kiln_tensor **out, int n)
{
    for (int k = 0; k < n; k++) {
        kiln_tensor_free(out[k]);
        out[k] = NULL;
    }
}

/* Run the reference kernel; outputs zero-filled as the executor does. */
static inline kiln_status run_ref(struct case_node *c, kiln_tensor **out)
{
    struct kiln_type types[MAX_IO];
    kiln_status st = cn_infer(c, types);
    if (st != KILN_OK) return st;
    for (int k = 0; k < c->n_out; k++) {
        out[k] = NULL;
        if (c->out_wanted[k] &&
            kiln_tensor_new(types[k].dtype, types[k].rank, types[k].dims, &out[k]) != KILN_OK)
            abort();
    }
    kiln_tensor *given[MAX_IO];
    memcpy(given, out, sizeof(kiln_tensor *) * (size_t)c->n_out);
    struct kiln_run_ctx rc = {.node = c->node, .n_in = c->n_in, .in = c->in, .n_out = c->n_out,
                              .out = out, .threads = 1};
    st = kiln_op_impl(c->node->op)->run(&rc);
    /* an op whose output shape is known only at run time (DYNOUT: TfListSetItem) may
     * replace an output tensor with one of its own */
    for (int k = 0; k < c->n_out; k++)
        if (out[k] != given[k]) kiln_tensor_free(given[k]);
    return st;
}

/* The kernel run_fast_ex compiles instead of the op's choice (NULL: the choice). */
static const struct kiln_kernel_def *forced_kernel;
/* Give each compile a weight cache of its own (kernels that pack weights need one). */
static bool case_weight_cache;
/* The precision each compile asks for (kiln_precision: 0 fp32, 1 bf16, 2 int8). */
static int case_precision;
/* The highest ISA Kiln's kernels see in each compile ("avx2": a kernel taken only below
 * AVX-512 is tested on an AVX-512 CPU too; oneDNN keeps its own ISA); NULL: the CPU's. */
static const char *case_isa_cap;
static inline int case_isa_rank(const char *isa)
{
    return !strcmp(isa, "scalar") ? 0 : !strcmp(isa, "avx2") ? 1 : 2;
}
/* The storage of input 0 and output 0 (a 4-D float32 tensor each; a KilnFusedConv's
 * residual Sum, input 3, stored as output 0) in the fast runs:
 * 0 plain, or 8 / 16 channel-blocked ([N][ceil(C/b)][H][W][b], padding lanes zero), as
 * the layout pass stores values. The cases stay plain; run_fast_ex converts the input
 * to the layout and the output back, and fails a blocked output whose padding lanes are
 * not zero (the next kernel may read them). */
static int case_layout;
/* Output 0's storage when it differs from input 0's (-1: the same as case_layout). */
static int case_layout_out = -1;
/* Non-NULL: unit_kernels forces only the kernels whose names start with it on the next
 * cases (a semantic other kernels of the op do not share, as oneDNN's max pooling, which
 * drops a NaN). */
static const char *case_kernel_prefix __attribute__((unused));

/* Runs of one compiled instance per fast run (run_fast_ex). */
static int case_repeat __attribute__((unused)) = 1;

/* Compile the fast kernel under KILN_ISA=isa (or forced_kernel) and run it on `threads`
 * threads. *handled = whether compile took the node; name (64 bytes, may
 * be NULL) gets the kernel's name. */
static inline kiln_status run_fast_ex(struct case_node *c, const char *isa, int threads, bool *handled,
                               char *name, kiln_tensor **out, bool inplace, bool *did_inplace)
{
    if (did_inplace) *did_inplace = false;
    *handled = false;
    for (int k = 0; k < c->n_out; k++) out[k] = NULL;
    const struct kiln_fast_op *f = kiln_fast_op(c->node->op);
    if (!f) return KILN_OK;
    struct kiln_type types[MAX_IO], in_t[MAX_IO];
    kiln_status st = cn_infer(c, types);
    if (st != KILN_OK) return st;
    const struct kiln_type *in_p[MAX_IO], *out_p[MAX_IO];
    const kiln_tensor *in_v[MAX_IO];
    int layouts[MAX_IO] = {0}, out_layouts[MAX_IO] = {0};
    const int blk_in = case_layout, blk = case_layout_out >= 0 ? case_layout_out : case_layout;
    if (blk_in || blk) {
        if (!c->in[0] || c->in[0]->rank != 4 || c->in[0]->dtype != KILN_DTYPE_F32 ||
            types[0].rank != 4 || types[0].dtype != KILN_DTYPE_F32)
            abort(); /* a generator asked for a layout its case cannot have */
        layouts[0] = blk_in;
        out_layouts[0] = blk;
    }
    /* a KilnFusedConv's (KilnMBConv's) residual Sum, input 3 (7), is stored as its output is
     * (the layout pass's rule) */
    const int sum_i = c->node->op == KILN_OP_KilnFusedConv ? 3
                      : c->node->op == KILN_OP_KilnMBConv  ? 7
                                                           : -1;
    const bool blk_sum = blk && sum_i > 0 && c->n_in > sum_i && c->in[sum_i] &&
                         c->in[sum_i]->rank == 4 && c->in[sum_i]->dtype == KILN_DTYPE_F32;
    if (blk_sum) layouts[sum_i] = blk;
    for (int i = 0; i < c->n_in; i++) {
        in_p[i] = NULL;
        in_v[i] = c->is_const[i] ? c->in[i] : NULL;
        if (c->in[i]) {
            kiln_type_from_tensor(&in_t[i], c->in[i]);
            in_p[i] = &in_t[i];
        }
    }
    for (int k = 0; k < c->n_out; k++) out_p[k] = c->out_wanted[k] ? &types[k] : NULL;
    struct kiln_weight_cache *wc = NULL;
    if (case_weight_cache && kiln_weight_cache_new(&wc) != KILN_OK) abort();
    struct kiln_compile_ctx cc = {
        .node = c->node, .n_in = c->n_in, .in = in_p, .in_value = in_v, .in_layout = layouts,
        .n_out = c->n_out, .out = out_p, .out_layout = out_layouts, .weights = wc,
        .threads = threads, .precision = case_precision,
    };
    struct kiln_kernel_inst inst = {0};
    if (case_isa_cap && case_isa_rank(case_isa_cap) < case_isa_rank(isa)) isa = case_isa_cap;
    if (forced_kernel) {
        if (case_isa_cap) setenv("KILN_ISA", case_isa_cap, 1);
        st = kiln_kernel_compile(forced_kernel, &cc, &inst);
        if (case_isa_cap) unsetenv("KILN_ISA");
    } else {
        setenv("KILN_ISA", isa, 1);
        st = f->compile(&cc, &inst);
        unsetenv("KILN_ISA");
    }
    if (st != KILN_OK || !inst.run) {
        kiln_kernel_inst_destroy(&inst);
        kiln_weight_cache_free(wc);
        return st;
    }
    *handled = true;
    if (name) snprintf(name, 64, "%s", inst.name);
    for (int k = 0; k < c->n_out; k++) {
        if (!c->out_wanted[k]) continue;
        if (k == 0 && blk) { /* blocked storage with the plain dims */
            int64_t flat = kc_blocked_count(types[0].dims, blk);
            if (kiln_tensor_new_uninit(KILN_DTYPE_F32, 1, &flat, &out[0]) != KILN_OK) abort();
            out[0]->rank = 4;
            memcpy(out[0]->dims, types[0].dims, sizeof out[0]->dims);
        } else if (kiln_tensor_new_uninit(types[k].dtype, types[k].rank, types[k].dims,
                                          &out[k]) != KILN_OK) {
            abort();
        }
        memset(out[k]->data, 0xff, out[k]->nbytes); /* NaN garbage: every element must be written */
    }
    void *scratch = NULL;
    if (inst.scratch_bytes) {
        scratch = aligned_alloc(64, (inst.scratch_bytes + 63) / 64 * 64);
        if (!scratch) abort();
        /* NaN garbage: a kernel that reads scratch it did not write shows in the result */
        memset(scratch, 0xff, (inst.scratch_bytes + 63) / 64 * 64);
    }
    kiln_tensor *ins[MAX_IO];
    memcpy(ins, c->in, sizeof ins);
    kiln_tensor *blocked_in = blk_in ? kc_to_blocked(c->in[0], blk_in) : NULL;
    if (blk_in) ins[0] = blocked_in;
    kiln_tensor *blocked_sum = blk_sum ? kc_to_blocked(c->in[sum_i], blk) : NULL;
    if (blk_sum) ins[sum_i] = blocked_sum;
    if (blk_in || blk) inplace = false;
    int ii = inst.inplace_input; /* 0, or the input a fused Sum reads (KilnFusedConv's 3) */
    if (inplace && inst.inplace && out[0] && ii >= 0 && ii < c->n_in && c->in[ii] &&
        out[0]->nbytes == c->in[ii]->nbytes) {
        /* output 0 overwrites (a copy of) that input */
        memcpy(out[0]->data, c->in[ii]->data, out[0]->nbytes);
        ins[ii] = out[0];
        *did_inplace = true;
    }
    struct kiln_run_ctx rc = {.node = c->node, .n_in = c->n_in, .in = ins, .n_out = c->n_out,
                              .out = out, .scratch = scratch, .threads = threads};
    st = inst.run(inst.state, &rc);
    /* case_repeat: the same instance runs again, and every output must be bit for bit the
     * first run's (kernels that choose between ways of running by timing their first runs) */
    for (int r = 1; r < case_repeat && st == KILN_OK && !(did_inplace && *did_inplace); r++) {
        kiln_tensor *first[MAX_IO] = {NULL};
        for (int k = 0; k < c->n_out; k++)
            if (out[k] && kiln_tensor_clone(out[k], &first[k]) != KILN_OK) abort();
        st = inst.run(inst.state, &rc);
        for (int k = 0; k < c->n_out && st == KILN_OK; k++)
            CHECK(!out[k] || !memcmp(out[k]->data, first[k]->data, out[k]->nbytes),
                  "%s: run %d of the same instance on %d threads differs from the first in "
                  "output %d", inst.name ? inst.name : "kernel", r + 1, threads, k);
        for (int k = 0; k < c->n_out; k++) kiln_tensor_free(first[k]);
    }
    free(scratch);
    kiln_tensor_free(blocked_in);
    kiln_tensor_free(blocked_sum);
    if (blk && out[0]) { /* back to plain */
        bool pad_bad = false;
        kiln_tensor *plain = kc_from_blocked(out[0], blk, &pad_bad);
        CHECK(!pad_bad, "%s: padding lanes of the output blocked by %d are not zero",
              inst.name ? inst.name : "kernel", blk);
        kiln_tensor_free(out[0]);
        out[0] = plain;
    }
    kiln_kernel_inst_destroy(&inst);
    kiln_weight_cache_free(wc);
    return st;
}

static inline kiln_status run_fast(struct case_node *c, const char *isa, int threads, bool *handled,
                            char *name, kiln_tensor **out)
{
    return run_fast_ex(c, isa, threads, handled, name, out, false, NULL);
}

/* ---- Comparison ---- */

static int inplace_runs; /* cases run with output 0 over the input the kernel names */
static double worst_rel; /* largest relative error seen by compare_f32 (|want| > 1e-30) */

/* got ~ want: NaN where NaN, equal infinities, else |g - w| <= atol + rtol |w|. */
static inline bool compare_f32(const char *what, const kiln_tensor *got, const kiln_tensor *want,
                        const kiln_tensor *x, double rtol, double atol)
{
    if (!got || !want || got->nbytes != want->nbytes) {
        fprintf(stderr, "%s: output sizes differ\n", what);
        return false;
    }
    const float *g = got->data, *w = want->data;
    int64_t n = (int64_t)(got->nbytes / sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        bool ok;
        if (isnan(w[i]) || isnan(g[i])) ok = isnan(w[i]) && isnan(g[i]);
        else if (isinf(w[i]) || isinf(g[i])) ok = g[i] == w[i];
        else ok = fabs((double)g[i] - w[i]) <= atol + rtol * fabs((double)w[i]);
        if (ok && !isnan(w[i]) && !isinf(w[i]) && fabs(w[i]) > 1e-30) {
            double rel = fabs((double)g[i] - w[i]) / fabs((double)w[i]);
            if (rel > worst_rel) worst_rel = rel;
        }
        if (!ok) {
            fprintf(stderr, "%s: element %lld: got %.9g, want %.9g", what, (long long)i,
                    (double)g[i], (double)w[i]);
            if (x && x->dtype == KILN_DTYPE_F32 && (int64_t)(x->nbytes / 4) == n)
                fprintf(stderr, " (x = %.9g)", (double)((const float *)x->data)[i]);
            fputc('\n', stderr);
            return false;
        }
    }
    return true;
}

static inline bool same_bytes(const kiln_tensor *a, const kiln_tensor *b)
{
    return a && b && a->nbytes == b->nbytes && memcmp(a->data, b->data, a->nbytes) == 0;
}

/* The ISAs this CPU can run. */
static const char *const isa_names[] = {"scalar", "avx2", "avx512"};
static inline int isa_levels(void)
{
    unsetenv("KILN_ISA");
    return (int)kiln_cpu_isa() + 1;
}

/* One fast run of the case (under KILN_ISA=isa, or forced_kernel) against the reference
 * outputs want: on one thread, again on two (the same bytes), and in place where the kernel
 * allows. expect_handled: 1 = the kernel must take the node, 0 = decline, -1 = either.
 * Returns whether the kernel took the node. */
static inline bool check_run(struct case_node *c, const char *isa, const char *label, kiln_tensor **want,
                      double rtol, double atol, int expect_handled)
{
    kiln_tensor *got[MAX_IO], *got2[MAX_IO];
    bool handled = false, handled2 = false;
    char name[64] = "", what[160];
    kiln_status st = run_fast(c, isa, 1, &handled, name, got);
    snprintf(what, sizeof what, "%s [%s]", label, handled ? name : isa);
    CHECK(st == KILN_OK, "%s: fast kernel failed: %s", what, kiln_last_error());
    if (expect_handled >= 0)
        CHECK(handled == (expect_handled == 1), "%s: fast kernel %s the node", what,
              handled ? "took" : "declined");
    if (st == KILN_OK && handled) {
        for (int k = 0; k < c->n_out; k++)
            if (c->out_wanted[k]) {
                bool ok = want[k]->dtype == KILN_DTYPE_F32
                              ? compare_f32(what, got[k], want[k], c->in[0], rtol, atol)
                              : same_bytes(got[k], want[k]);
                CHECK(ok, "%s: output %d differs from the reference", what, k);
            }
        char name2[64] = "";
        st = run_fast(c, isa, 2, &handled2, name2, got2);
        CHECK(st == KILN_OK && handled2, "%s: two-thread run failed", what);
        /* a kernel that times its candidates at compile (the sparse products) may choose
         * another one for 2 threads: then both must match the reference, not each other */
        bool same_kernel = strcmp(name, name2) == 0;
        for (int k = 0; st == KILN_OK && k < c->n_out; k++)
            if (c->out_wanted[k]) {
                if (same_kernel)
                    CHECK(same_bytes(got[k], got2[k]), "%s: output %d differs on 2 threads", what, k);
                else
                    CHECK(want[k]->dtype == KILN_DTYPE_F32
                              ? compare_f32(what, got2[k], want[k], c->in[0], rtol, atol)
                              : same_bytes(got2[k], want[k]),
                          "%s: output %d of the 2-thread run (%s) differs from the reference",
                          what, k, name2);
            }
        free_outs(got2, c->n_out);
        bool inplace = false;
        st = run_fast_ex(c, isa, 1, &handled2, NULL, got2, true, &inplace);
        if (inplace) {
            CHECK(st == KILN_OK && same_bytes(got[0], got2[0]), "%s: in-place run differs", what);
            inplace_runs++;
        }
        free_outs(got2, c->n_out);
    }
    free_outs(got, c->n_out);
    return handled;
}

/* Called by check_case with the reference outputs after the chosen kernel's runs
 * (unit_kernels.c: every kernel of the op, forced). */
static void (*check_case_hook)(struct case_node *c, const char *label, kiln_tensor **want,
                               double rtol, double atol);

/*
 * Run the case through the reference and through the op's chosen fast kernel
 * on every ISA, single- and two-threaded (check_run), then check_case_hook.
 * expect_handled: 1 = the fast kernel must take the node, 0 = it must
 * decline, -1 = either.
 */
static inline void check_case(struct case_node *c, const char *label, double rtol, double atol,
                       int expect_handled)
{
    kiln_tensor *want[MAX_IO];
    kiln_status st = run_ref(c, want);
    CHECK(st == KILN_OK, "%s: reference failed: %s", label, kiln_last_error());
    if (st != KILN_OK) {
        free_outs(want, c->n_out);
        return;
    }
    for (int lv = 0; lv < isa_levels(); lv++)
        check_run(c, isa_names[lv], label, want, rtol, atol, expect_handled);
    if (check_case_hook) check_case_hook(c, label, want, rtol, atol);
    free_outs(want, c->n_out);
}

/* Inputs for elementwise cases: 0, -0, +-inf, NaN, huge and denormal values; sizes below,
 * at and above the vector widths. */
static const float specials[] = {0.0f,     -0.0f,    INFINITY, -INFINITY, NAN,     1e30f,
                                 -1e30f,   88.7f,    -88.7f,   89.0f,     -104.0f, -120.0f,
                                 1e-40f,   -1e-40f,  3.4e38f,  -3.4e38f,  1.0f,    -1.0f,
                                 0.55f,    -0.55f,   0.99999f, -1.00001f, -3.0f,   3.0f,
                                 -2.9999f, 14.8f,    -14.9f,   -9.0f,     -20.0f,  1e-20f};
#define N_SPECIALS (int)(sizeof specials / sizeof specials[0])

static const int64_t sizes[] = {1, 7, 8, 15, 16, 17, 31, 33, 1000};
#define N_SIZES (int)(sizeof sizes / sizeof sizes[0])

#endif
