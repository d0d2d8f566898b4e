/*
 * unit_conv_tune.c - the convolution kernel's timed choice among its candidates
 * (src/kernels/dnnl/conv.c, src/kernels/tune.h) against the reference conv kernel.
 *
 * Each case (Conv and KilnFusedConv with bias and Relu; 3x3 on 8x8 and on 2x2 images,
 * 1x7 and 7x1 with asymmetric pads, a plain-layout 3x3 from 3 channels, a stride-2 3x3)
 * is compiled with X and Y in its layout (plain, or channels blocked by 16 or 8) under
 * KILN_CONV_ALGO=rule, direct and any (each candidate forced wherever it exists) and in
 * the default timed mode, on 1 and 2 threads, and every output must match the reference
 * within 1e-4 of the output's scale, padding channels of a blocked Y written 0. Forcing
 * "direct" must leave no Winograd kernel, forcing "any" must run the reordering kernel
 * wherever oneDNN prefers other formats; on an AVX-512 CPU some case must have had a
 * Winograd rule and some an "any" candidate, or the forcing tested nothing. In timed
 * mode a second compile with the same weight cache must make the same choice (the slot
 * kiln_kernel_choice_slot keeps).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "one_node.h"
#include "kernels/fast.h"
#include "kernels/kernel.h"
#include "kiln/kiln.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) /* in [-1, 1) */
{
    return (float)((check_xorshift(&rng) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

struct tcase {
    int fused, n, cin, cout, h, w, kh, kw, stride, layout;
    int64_t pads[4]; /* top, left, bottom, right */
    const char *what;
};

static int64_t out_dim(int64_t in, int64_t k, int64_t p0, int64_t p1, int64_t s)
{
    return (in + p0 + p1 - k) / s + 1;
}

static kiln_tensor *tensor(int rank, const int64_t *dims)
{
    kiln_tensor *t;
    if (kiln_tensor_new(KILN_DTYPE_F32, rank, dims, &t) != KILN_OK) abort();
    return t;
}

static void build(struct one_node *t, const struct tcase *c)
{
    memset(t, 0, sizeof *t);
    struct kiln_node *n;
    t->n_in = 3;
    if (kiln_graph_new(&t->g) != KILN_OK ||
        kiln_graph_node_add(t->g, c->fused ? KILN_OP_KilnFusedConv : KILN_OP_Conv, "conv", 3, 1, 4,
                            &n) != KILN_OK)
        abort();
    n->n_attr = 0;
    int id;
    if (kiln_graph_value_add(t->g, "y", KILN_VALUE_NODE, &id) != KILN_OK) abort();
    t->g->values[id].producer = 0;
    t->g->nodes[0].out[0] = id;
    int64_t xd[4] = {c->n, c->cin, c->h, c->w}, wd[4] = {c->cout, c->cin, c->kh, c->kw};
    kiln_tensor *x = tensor(4, xd), *w = tensor(4, wd);
    for (int64_t i = 0; i < kiln_tensor_count(x); i++) ((float *)x->data)[i] = frand();
    for (int64_t i = 0; i < kiln_tensor_count(w); i++) ((float *)w->data)[i] = frand() * 0.3f;
    add_in(t, 0, x, 0);
    add_in(t, 1, w, 1);
    int64_t bd[1] = {c->cout};
    kiln_tensor *b = tensor(1, bd);
    for (int64_t i = 0; i < c->cout; i++) ((float *)b->data)[i] = frand();
    add_in(t, 2, b, 1);
    struct kiln_attr *a = add_attr(t, "pads", KILN_ATTR_INTS);
    a->n = 4;
    a->ints = kiln_arena_alloc(t->g->mem, sizeof(int64_t) * 4);
    a->ints[0] = c->pads[0], a->ints[1] = c->pads[1], a->ints[2] = c->pads[2], a->ints[3] = c->pads[3];
    a = add_attr(t, "strides", KILN_ATTR_INTS);
    a->n = 2;
    a->ints = kiln_arena_alloc(t->g->mem, sizeof(int64_t) * 2);
    a->ints[0] = a->ints[1] = c->stride;
    if (c->fused) {
        a = add_attr(t, "activation", KILN_ATTR_STRING);
        a->s.len = 4;
        a->s.data = kiln_arena_strdup(t->g->mem, "Relu");
    }
}

/* x [N, C, P] plain <-> blocked by b (padding channels 0). */
static void reblock(const float *src, float *dst, int64_t n, int64_t c, int64_t P, int b, int to_plain)
{
    int64_t cb = (c + b - 1) / b;
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < cb * b; k++)
            for (int64_t p = 0; p < P; p++) {
                int64_t bi = ((i * cb + k / b) * P + p) * b + k % b;
                if (to_plain) {
                    if (k < c) dst[(i * c + k) * P + p] = src[bi];
                } else {
                    dst[bi] = k < c ? src[(i * c + k) * P + p] : 0.0f;
                }
            }
}

/* Compile the node's fast kernel in weight cache wc and run it; Y plain in y. Returns 1,
 * 0 when not handled, -1 when a padding channel of a blocked Y was not 0. name / impl
 * receive the kernel's. */
static int run_fast(struct one_node *t, const struct tcase *c, int threads,
                    struct kiln_weight_cache *wc, float *y, char *name, char *impl)
{
    struct kiln_node *n = &t->g->nodes[0];
    struct kiln_type types[3], yt;
    const struct kiln_type *ins[3] = {0};
    const kiln_tensor *vals[3] = {0};
    int layouts[3] = {c->layout, 0, 0}, out_layouts[1] = {c->layout};
    for (int i = 0; i < 3; i++) {
        kiln_type_from_tensor(&types[i], t->in[i]);
        ins[i] = &types[i];
        if (i > 0) vals[i] = t->in[i];
    }
    int64_t oh = out_dim(c->h, c->kh, c->pads[0], c->pads[2], c->stride);
    int64_t ow = out_dim(c->w, c->kw, c->pads[1], c->pads[3], c->stride);
    int64_t yd[4] = {c->n, c->cout, oh, ow};
    yt = types[0];
    for (int i = 0; i < 4; i++) yt.dims[i] = yd[i];
    const struct kiln_type *outs[1] = {&yt};
    struct kiln_compile_ctx cc = {n, 3, ins, vals, layouts, 1, outs, out_layouts, wc, threads, 0};
    struct kiln_kernel_inst inst;
    memset(&inst, 0, sizeof inst);
    int ok = 0, b = c->layout;
    int64_t P = c->h * c->w, Q = oh * ow;
    kiln_status st = kiln_fast_op(n->op)->compile(&cc, &inst);
    if (st != KILN_OK) fprintf(stderr, "compile: %s\n", kiln_last_error());
    if (st == KILN_OK && inst.run) {
        snprintf(name, 64, "%s", inst.name);
        snprintf(impl, 64, "%s", inst.impl);
        int64_t xs[4] = {c->n, b ? (c->cin + b - 1) / b * b : c->cin, c->h, c->w};
        int64_t ys[4] = {c->n, b ? (c->cout + b - 1) / b * b : c->cout, oh, ow};
        kiln_tensor *xb = tensor(4, xs), *yb = tensor(4, ys);
        if (b)
            reblock(t->in[0]->data, xb->data, c->n, c->cin, P, b, 0);
        else
            memcpy(xb->data, t->in[0]->data, t->in[0]->nbytes);
        for (int64_t i = 0; i < kiln_tensor_count(yb); i++) ((float *)yb->data)[i] = NAN;
        kiln_tensor *in[3] = {xb, t->in[1], t->in[2]};
        void *scratch = inst.scratch_bytes ? aligned_alloc(64, (inst.scratch_bytes + 63) / 64 * 64) : NULL;
        struct kiln_run_ctx rc = {.node = n, .n_in = 3, .in = in, .n_out = 1, .out = &yb,
                                  .scratch = scratch, .threads = threads};
        if (inst.run(inst.state, &rc) != KILN_OK) {
            fprintf(stderr, "run: %s\n", kiln_last_error());
        } else {
            ok = 1;
            const float *yy = yb->data;
            if (b) {
                reblock(yy, y, c->n, c->cout, Q, b, 1);
                int64_t cb = ys[1] / b;
                for (int64_t i = 0; i < c->n; i++)
                    for (int64_t k = c->cout; k < cb * b; k++)
                        for (int64_t p = 0; p < Q; p++)
                            if (yy[((i * cb + k / b) * Q + p) * b + k % b] != 0.0f) ok = -1;
            } else {
                memcpy(y, yy, sizeof(float) * (size_t)kiln_tensor_count(yb));
            }
        }
        free(scratch);
        kiln_tensor_free(xb);
        kiln_tensor_free(yb);
    }
    kiln_kernel_inst_destroy(&inst);
    return ok;
}

static kiln_tensor *ref_conv(struct one_node *t, const struct tcase *c)
{
    int64_t yd[4] = {c->n, c->cout, out_dim(c->h, c->kh, c->pads[0], c->pads[2], c->stride),
                     out_dim(c->w, c->kw, c->pads[1], c->pads[3], c->stride)};
    kiln_tensor *y = tensor(4, yd);
    struct kiln_run_ctx rc = {.node = &t->g->nodes[0], .n_in = 3, .in = t->in, .n_out = 1,
                              .out = &y, .threads = 1};
    if (kiln_op_impl(t->g->nodes[0].op)->run(&rc) != KILN_OK) abort();
    return y;
}

static int saw_winograd_rule, saw_any;

static void check_case(const struct tcase *c)
{
    struct one_node t;
    build(&t, c);
    kiln_tensor *want = ref_conv(&t, c);
    int64_t count = kiln_tensor_count(want);
    const float *wv = want->data;
    double scale = 0;
    for (int64_t i = 0; i < count; i++)
        if (fabs(wv[i]) > scale) scale = fabs(wv[i]);
    float *y = malloc(sizeof(float) * (size_t)count);
    static const char *const modes[] = {"rule", "direct", "any", NULL};
    for (int threads = 1; threads <= 2; threads++) {
        char rule_impl[64] = "";
        for (int m = 0; m < 4; m++) {
            if (modes[m])
                setenv("KILN_CONV_ALGO", modes[m], 1);
            else
                unsetenv("KILN_CONV_ALGO");
            struct kiln_weight_cache *wc;
            if (kiln_weight_cache_new(&wc) != KILN_OK) abort();
            char name[64] = "", impl[64] = "";
            int ok = run_fast(&t, c, threads, wc, y, name, impl);
            const char *mode = modes[m] ? modes[m] : "timed";
            CHECK(ok == 1, "%s, %s, %d threads: %s", c->what, mode,
                  threads, ok < 0 ? "padding channels of Y not 0" : "not handled");
            if (ok == 1) {
                double err = 0;
                for (int64_t i = 0; i < count; i++) {
                    double d = fabs((double)y[i] - (double)wv[i]);
                    if (!(d <= err)) err = d;
                }
                CHECK(err <= 1e-4 * (scale > 1 ? scale : 1), "%s, %s, %d threads (%s %s): error %g of scale %g",
                      c->what, mode, threads, name, impl, err, scale);
            }
            if (m == 0) {
                snprintf(rule_impl, sizeof rule_impl, "%s", impl);
                if (strstr(impl, "wino")) saw_winograd_rule = 1;
            }
            if (m == 1) CHECK(!strstr(impl, "wino"), "%s: KILN_CONV_ALGO=direct ran %s", c->what, impl);
            if (m == 2 && strstr(name, "_any")) saw_any = 1;
            if (m == 3) { /* the decision is kept: a second plan chooses the same */
                char name2[64] = "", impl2[64] = "";
                float *y2 = malloc(sizeof(float) * (size_t)count);
                run_fast(&t, c, threads, wc, y2, name2, impl2);
                CHECK(!strcmp(name, name2) && !strcmp(impl, impl2),
                      "%s, %d threads: timed choice %s %s, then %s %s from the same cache", c->what,
                      threads, name, impl, name2, impl2);
                free(y2);
            }
            kiln_weight_cache_free(wc);
        }
        (void)rule_impl;
    }
    unsetenv("KILN_CONV_ALGO");
    free(y);
    kiln_tensor_free(want);
    kiln_graph_free(t.g);
}

int main(void)
{
    static const struct tcase cases[] = {
        {1, 2, 32, 32, 8, 8, 3, 3, 1, 16, {1, 1, 1, 1}, "3x3 on 8x8, blocked 16"},
        {1, 2, 32, 48, 2, 2, 3, 3, 1, 16, {1, 1, 1, 1}, "3x3 on 2x2, blocked 16"},
        {0, 1, 16, 16, 9, 9, 3, 3, 1, 8, {1, 1, 1, 1}, "Conv 3x3 on 9x9, blocked 8"},
        {1, 2, 32, 48, 6, 6, 1, 7, 1, 16, {0, 3, 0, 3}, "1x7 on 6x6, blocked 16"},
        {1, 2, 48, 32, 6, 6, 7, 1, 1, 16, {3, 0, 3, 0}, "7x1 on 6x6, blocked 16"},
        {0, 2, 3, 16, 12, 12, 3, 3, 1, 0, {1, 1, 1, 1}, "Conv 3x3 from 3 channels, plain"},
        {1, 1, 20, 24, 10, 10, 3, 3, 2, 0, {1, 1, 1, 1}, "3x3 stride 2, plain, channels off the block"},
        {1, 2, 32, 32, 7, 7, 3, 3, 2, 16, {0, 0, 0, 0}, "3x3 stride 2 on 7x7, blocked 16"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
    if (__builtin_cpu_supports("avx512f")) /* oneDNN detects the CPU itself */
        CHECK(saw_winograd_rule && saw_any,
              "forcing tested nothing: Winograd rule seen %d, \"any\" candidate seen %d",
              saw_winograd_rule, saw_any);
    return CHECK_DONE();
}
