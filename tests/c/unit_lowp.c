/*
 * unit_lowp.c - the low-precision fast kernels (KILN_PRECISION_BF16 and
 * KILN_PRECISION_INT8 in src/kernels/dnnl/matmul.c) against plain C
 * references written here.
 *
 * int8 (dynamic quantization): the reference quantizes A to u8 and B to
 * per-column symmetric s8 with the formulas docs/COMPRESSION.md states,
 * accumulates (q_a - zp) * q_w in int32, and forms
 * (float(acc) * (scale_w * alpha)) * scale_a + bias + Sum, activation last,
 * in the same float order the kernel promises: the kernel must match it
 * bit for bit. Each int8 result must also lie within the quantization
 * error of the exact fp32 product.
 * bf16: the reference rounds A and alpha * B to bfloat16 (nearest even)
 * and accumulates in double; the kernel (fp32 accumulation) must agree
 * within 1e-4 of the output's scale, and the exact fp32 product within
 * bfloat16 rounding (1e-2).
 * Shapes: M, K, N of 1 and around the vector widths (15, 16, 17, 33, 65);
 * rank-3 A folded into rows; an A large enough that two threads split its
 * conversion; Gemm with transB, alpha, a row bias, a full C
 * (sum post-op); KilnFusedMatMul with Relu. Every case runs with 1 and 2
 * threads, and must actually run in the asked precision (kernel name; int8
 * only on CPUs with VNNI or AMX, bf16 only with AVX-512; elsewhere they
 * must stay fp32).
 * Through the public API: a bad precision is refused naming the value, and
 * sessions of every precision on one model (models/digits/1/model.onnx) keep their
 * own plans (fp32 unchanged; bf16 and int8 close to it but not equal).
 * Conv: channels 1, 3, 16, 17, 33, 3x3 with padding, 1x1, stride 2,
 * depthwise and grouped, bias. bf16 against a double-precision convolution
 * of bfloat16-rounded X and W; int8 (groups of 1; grouped convolutions stay
 * fp32, checked) bit for bit against an integer convolution written here,
 * where a padded position contributes 0 (the real zero, q = zp), and
 * Y = (float(acc) * scale_w) * scale_x + bias. KilnFusedConv with a
 * residual Sum (fp32, not quantized) and Relu: Y = act(... + bias + Sum),
 * with and without bias, 1x1 strided, channels off the block.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "one_node.h"
#include "kernels/dnnl/dnnl_common.h"
#include "kernels/fast.h"
#include "kernels/kernel.h"
#include "kiln/kiln.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) /* in [-1, 1) */
{
    return (float)((check_xorshift(&rng) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static kiln_tensor *rand_tensor(int rank, const int64_t *dims, float lo, float hi)
{
    kiln_tensor *t;
    if (kiln_tensor_new(KILN_DTYPE_F32, rank, dims, &t) != KILN_OK) abort();
    float *d = t->data;
    for (int64_t i = 0; i < kiln_tensor_count(t); i++) d[i] = lo + (frand() + 1.0f) * 0.5f * (hi - lo);
    return t;
}

/* One product under test: Y = act(alpha * A x op(B) + bias + sum). */
struct mm_case {
    enum kiln_op op;
    int a_rank;      /* 2 or 3 (3: [2, M, K]) */
    int64_t m, k, n;
    int trans_b;     /* Gemm only */
    float alpha;     /* Gemm / fused only */
    int bias;        /* 1 = row bias [N]; 2 = full [M, N] (Gemm C, beta 1) */
    int relu;        /* fused only */
    float a_lo, a_hi; /* A's value range (asymmetric ranges exercise the zero point) */
};

static void build(struct one_node *t, const struct mm_case *c)
{
    memset(t, 0, sizeof *t);
    int n_in = c->bias ? 3 : 2;
    struct kiln_node *n;
    if (kiln_graph_new(&t->g) != KILN_OK ||
        kiln_graph_node_add(t->g, c->op, "node", n_in, 1, 4, &n) != KILN_OK)
        abort();
    n->n_attr = 0;
    t->n_in = n_in;
    int id;
    if (kiln_graph_value_add(t->g, "y", KILN_VALUE_NODE, &id) != KILN_OK) abort();
    t->g->values[id].producer = 0;
    t->g->nodes[0].out[0] = id;
    int64_t ad[3] = {2, c->m, c->k}, a2[2] = {c->m, c->k};
    add_in(t, 0, c->a_rank == 3 ? rand_tensor(3, ad, c->a_lo, c->a_hi)
                                : rand_tensor(2, a2, c->a_lo, c->a_hi), 0);
    int64_t bd[2] = {c->trans_b ? c->n : c->k, c->trans_b ? c->k : c->n};
    add_in(t, 1, rand_tensor(2, bd, -1.0f, 1.0f), 1);
    if (c->bias == 1) {
        int64_t d[1] = {c->n};
        add_in(t, 2, rand_tensor(1, d, -1.0f, 1.0f), 1);
    } else if (c->bias == 2) {
        int64_t d[2] = {c->m, c->n};
        add_in(t, 2, rand_tensor(2, d, -1.0f, 1.0f), 1);
    }
    if (c->op != KILN_OP_MatMul) {
        add_attr(t, "transB", KILN_ATTR_INT)->i = c->trans_b;
        add_attr(t, "alpha", KILN_ATTR_FLOAT)->f = c->alpha;
    }
    if (c->op == KILN_OP_KilnFusedMatMul) {
        struct kiln_attr *a = add_attr(t, "activation", KILN_ATTR_STRING);
        const char *s = c->relu ? "Relu" : "";
        a->s.len = strlen(s);
        a->s.data = kiln_arena_strdup(t->g->mem, s);
    }
}

/* B's element (k, j) as the product sees it. */
static float b_at(const struct mm_case *c, const float *b, int64_t k, int64_t j)
{
    return c->trans_b ? b[j * c->k + k] : b[k * c->n + j];
}

/* Rows of the folded product (A's batch folded into M). */
static int64_t rows(const struct mm_case *c) { return c->a_rank == 3 ? 2 * c->m : c->m; }

/* Row r's bias / sum term for column j (0 when none). */
static float extra_at(const struct mm_case *c, const float *e, int64_t r, int64_t j)
{
    if (c->bias == 1) return e[j];
    if (c->bias == 2) return e[r * c->n + j];
    return 0.0f;
}

/* The int8 reference; y has rows(c) * n elements. */
static void ref_int8(const struct mm_case *c, struct one_node *t, float *y)
{
    const float *a = t->in[0]->data, *b = t->in[1]->data;
    const float *e = c->bias ? t->in[2]->data : NULL;
    int64_t R = rows(c), K = c->k, N = c->n;
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < R * K; i++) {
        if (a[i] < lo) lo = a[i];
        if (a[i] > hi) hi = a[i];
    }
    float sa = (hi - lo) / 255.0f;
    if (!(sa > 0.0f)) sa = 1.0f;
    float zf = nearbyintf(-lo / sa);
    int32_t zp = zf < 0 ? 0 : zf > 255 ? 255 : (int32_t)zf;
    int32_t *qa = malloc(sizeof(int32_t) * (size_t)(R * K));
    int32_t *qw = malloc(sizeof(int32_t) * (size_t)(K * N));
    float *sw = malloc(sizeof(float) * (size_t)N);
    for (int64_t i = 0; i < R * K; i++) {
        float q = nearbyintf(a[i] * (1.0f / sa)) + (float)zp;
        qa[i] = q < 0 ? 0 : q > 255 ? 255 : (int32_t)q;
    }
    for (int64_t j = 0; j < N; j++) {
        float mx = 0.0f;
        for (int64_t k = 0; k < K; k++) mx = fmaxf(mx, fabsf(b_at(c, b, k, j)));
        sw[j] = mx > 0.0f ? mx / 127.0f : 1.0f;
        for (int64_t k = 0; k < K; k++) {
            float q = nearbyintf(b_at(c, b, k, j) / sw[j]);
            qw[k * N + j] = q < -127 ? -127 : q > 127 ? 127 : (int32_t)q;
        }
    }
    float alpha = c->op == KILN_OP_MatMul ? 1.0f : c->alpha;
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < N; j++) {
            int32_t acc = 0;
            for (int64_t k = 0; k < K; k++) acc += (qa[r * K + k] - zp) * qw[k * N + j];
            float v = (float)acc * (sw[j] * alpha);
            v = v * sa;
            if (c->bias) v = v + extra_at(c, e, c->bias == 2 ? r : 0, j);
            if (c->relu && v < 0.0f) v = 0.0f;
            y[r * N + j] = v;
        }
    free(qa);
    free(qw);
    free(sw);
}

/* The bf16 reference (round_inputs = 1) or the exact product (0), in double. */
static void ref_float(const struct mm_case *c, struct one_node *t, int round_inputs, float *y)
{
    const float *a = t->in[0]->data, *b = t->in[1]->data;
    const float *e = c->bias ? t->in[2]->data : NULL;
    int64_t R = rows(c), K = c->k, N = c->n;
    float alpha = c->op == KILN_OP_MatMul ? 1.0f : c->alpha;
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) {
                float av = a[r * K + k], bv = alpha * b_at(c, b, k, j);
                if (round_inputs) {
                    av = kiln_bf16_to_f32(kiln_f32_to_bf16(av));
                    bv = kiln_bf16_to_f32(kiln_f32_to_bf16(bv));
                    acc += (double)av * bv;
                } else {
                    acc += (double)av * b_at(c, b, k, j) * alpha;
                }
            }
            double v = acc;
            if (c->bias) v += extra_at(c, e, c->bias == 2 ? r : 0, j);
            if (c->relu && v < 0.0) v = 0.0;
            y[r * N + j] = (float)v;
        }
}

/* Compile the node for `precision` and run it; NULL when the kernel declined.
 * *name points at a copy of the kernel's name: the instance owns its name and
 * frees it with its state. */
static int g_bf16_amx_convs; /* bf16 convolutions oneDNN ran on AMX tiles (channels last) */

static kiln_tensor *run_fast(struct one_node *t, int precision, int threads, const char **name)
{
    struct kiln_node *n = &t->g->nodes[0];
    const struct kiln_fast_op *f = kiln_fast_op(n->op);
    *name = NULL;
    if (!f) return NULL;
    struct kiln_type types[4], yt;
    const struct kiln_type *ins[4] = {0};
    const kiln_tensor *vals[4] = {0};
    int layouts[4] = {0}, out_layouts[1] = {0};
    for (int i = 0; i < t->n_in; i++) {
        if (!t->in[i]) continue; /* an absent optional input */
        kiln_type_from_tensor(&types[i], t->in[i]);
        ins[i] = &types[i];
        if (i > 0) vals[i] = t->in[i];
    }
    struct kiln_type *outs_w[1] = {&yt};
    struct kiln_infer_ctx ic = {n, t->n_in, ins, vals, 1, outs_w};
    if (n->op == KILN_OP_KilnFusedMatMul) { /* its output type is Gemm's (MatMul's for rank 3) */
        n->op = t->in[0]->rank == 2 ? KILN_OP_Gemm : KILN_OP_MatMul;
        kiln_status st = kiln_op_impl(n->op)->infer(&ic);
        n->op = KILN_OP_KilnFusedMatMul;
        if (st != KILN_OK) return NULL;
    } else if (kiln_op_impl(n->op)->infer(&ic) != KILN_OK) {
        return NULL;
    }
    struct kiln_weight_cache *wc;
    if (kiln_weight_cache_new(&wc) != KILN_OK) abort();
    const struct kiln_type *outs[1] = {&yt};
    struct kiln_compile_ctx cc = {n, t->n_in, ins, vals, layouts, 1, outs, out_layouts,
                                  wc, threads, precision, 0};
    struct kiln_kernel_inst inst;
    memset(&inst, 0, sizeof inst);
    kiln_tensor *y = NULL;
    kiln_status st = f->compile(&cc, &inst);
    if (st != KILN_OK) fprintf(stderr, "compile: %s\n", kiln_last_error());
    if (st == KILN_OK && inst.run) {
        static char name_copy[128];
        snprintf(name_copy, sizeof name_copy, "%s", inst.name ? inst.name : "");
        *name = name_copy;
        if (precision == KILN_PRECISION_BF16 && strstr(name_copy, "conv_bf16") &&
            strstr(inst.impl, "amx"))
            g_bf16_amx_convs++;
        if (kiln_tensor_new(KILN_DTYPE_F32, yt.rank, yt.dims, &y) != KILN_OK) abort();
        float *yd = y->data;
        for (int64_t i = 0; i < kiln_tensor_count(y); i++) yd[i] = NAN;
        void *scratch = inst.scratch_bytes ? aligned_alloc(64, (inst.scratch_bytes + 63) / 64 * 64)
                                           : NULL;
        struct kiln_run_ctx rc = {.node = n, .n_in = t->n_in, .in = t->in, .n_out = 1,
                                  .out = &y, .scratch = scratch, .threads = threads};
        st = inst.run(inst.state, &rc);
        if (st != KILN_OK) {
            fprintf(stderr, "run: %s\n", kiln_last_error());
            kiln_tensor_free(y);
            y = NULL;
        }
        free(scratch);
    }
    kiln_kernel_inst_destroy(&inst);
    kiln_weight_cache_free(wc);
    return y;
}

static void describe(const struct mm_case *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s a_rank=%d m=%lld k=%lld n=%lld transB=%d alpha=%g bias=%d relu=%d",
             kiln_op_name(c->op), c->a_rank, (long long)c->m, (long long)c->k, (long long)c->n,
             c->trans_b, (double)c->alpha, c->bias, c->relu);
}

static int g_int8_cases, g_bf16_cases;
static int g_vnni; /* the CPU has VNNI (or AMX): int8 kernels are expected, else fp32 */

static int g_bf16; /* the CPU has AVX-512 (oneDNN 2.6 runs bf16 there, natively or emulated) */

/* Whether /proc/cpuinfo's flags hold any of the given flags (1 when unknown). */
static int cpu_flag(const char *a, const char *b, const char *c)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 1; /* unknown: expect the kernels and let a failure say so */
    char line[8192];
    int yes = 0;
    while (!yes && fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5))
            yes = strstr(line, a) || (b && strstr(line, b)) || (c && strstr(line, c));
    fclose(f);
    return yes;
}

/* int8 ran where expected: with VNNI an _int8 kernel, without it fp32. */
static int int8_expected(const char *name)
{
    return name && (g_vnni ? strstr(name, "_int8") != NULL : strstr(name, "_int8") == NULL);
}

/* bf16 likewise, with AVX-512. */
static int bf16_expected(const char *name)
{
    return name && (g_bf16 ? strstr(name, "_bf16") != NULL : strstr(name, "_bf16") == NULL);
}

static void check_case(const struct mm_case *c)
{
    char what[200];
    describe(c, what, sizeof what);
    struct one_node t;
    build(&t, c);
    int64_t count = rows(c) * c->n;
    float *exact = malloc(sizeof(float) * (size_t)count);
    float *want = malloc(sizeof(float) * (size_t)count);
    ref_float(c, &t, 0, exact);
    double scale = 1.0;
    for (int64_t i = 0; i < count; i++) scale = fmax(scale, fabs(exact[i]));
    for (int threads = 1; threads <= 2; threads++) {
        const char *name;
        /* int8: bit for bit against the integer reference */
        ref_int8(c, &t, want);
        kiln_tensor *y = run_fast(&t, KILN_PRECISION_INT8, threads, &name);
        CHECK(y && int8_expected(name), "%s threads=%d: int8 kernel %s (VNNI %d)", what, threads,
              name ? name : "declined", g_vnni);
        if (y && name && strstr(name, "_int8")) {
            g_int8_cases++;
            const float *yd = y->data;
            int64_t bad = 0, first = -1;
            double qerr = 0.0;
            for (int64_t i = 0; i < count; i++) {
                if (memcmp(&yd[i], &want[i], sizeof(float)) != 0) {
                    if (first < 0) first = i;
                    bad++;
                }
                qerr = fmax(qerr, fabs((double)yd[i] - exact[i]));
            }
            CHECK(bad == 0, "%s threads=%d: %lld of %lld int8 outputs differ from the integer "
                  "reference (first [%lld]: %.9g vs %.9g)", what, threads, (long long)bad,
                  (long long)count, (long long)first, first >= 0 ? (double)yd[first] : 0.0,
                  first >= 0 ? (double)want[first] : 0.0);
            /* quantization error: |A| / 255 * |B| per term, summed over K, bounded loosely */
            double bound = 0.02 * scale + 0.01 * (double)c->k;
            CHECK(qerr <= bound, "%s threads=%d: int8 error %g above %g", what, threads, qerr,
                  bound);
        }
        kiln_tensor_free(y);
        /* bf16: within fp32 accumulation of the rounded inputs, and bf16 rounding of the exact */
        ref_float(c, &t, 1, want);
        y = run_fast(&t, KILN_PRECISION_BF16, threads, &name);
        CHECK(y && bf16_expected(name), "%s threads=%d: bf16 kernel %s (AVX-512 %d)", what,
              threads, name ? name : "declined", g_bf16);
        if (y && name && strstr(name, "_bf16")) {
            g_bf16_cases++;
            const float *yd = y->data;
            double e1 = 0.0, e2 = 0.0;
            for (int64_t i = 0; i < count; i++) {
                double d1 = fabs((double)yd[i] - want[i]), d2 = fabs((double)yd[i] - exact[i]);
                e1 = isnan(d1) ? 1e9 : fmax(e1, d1);
                e2 = isnan(d2) ? 1e9 : fmax(e2, d2);
            }
            CHECK(e1 <= 1e-4 * scale, "%s threads=%d: bf16 off the rounded-input reference by %g",
                  what, threads, e1 / scale);
            CHECK(e2 <= 1e-2 * scale, "%s threads=%d: bf16 off the exact product by %g", what,
                  threads, e2 / scale);
        }
        kiln_tensor_free(y);
        /* fp32 stays fp32 */
        y = run_fast(&t, KILN_PRECISION_FP32, threads, &name);
        CHECK(y && name && !strstr(name, "_int8") && !strstr(name, "_bf16"),
              "%s threads=%d: fp32 kernel name %s", what, threads, name ? name : "declined");
        kiln_tensor_free(y);
    }
    free(exact);
    free(want);
    kiln_graph_free(t.g);
}

/* ---- Conv (bf16) ---- */

struct conv_case {
    int64_t n, c, h, w, m, k, stride, pad, group;
    int bias;
    int sum;  /* KilnFusedConv with a residual Sum (input 3) */
    int relu; /* KilnFusedConv's activation Relu, after the Sum */
};

static void check_conv(const struct conv_case *c)
{
    char what[200];
    snprintf(what, sizeof what, "%s n=%lld c=%lld %lldx%lld m=%lld k=%lld stride=%lld pad=%lld "
             "group=%lld bias=%d sum=%d relu=%d", c->sum || c->relu ? "KilnFusedConv" : "Conv",
             (long long)c->n, (long long)c->c, (long long)c->h, (long long)c->w,
             (long long)c->m, (long long)c->k, (long long)c->stride, (long long)c->pad,
             (long long)c->group, c->bias, c->sum, c->relu);
    struct one_node t;
    memset(&t, 0, sizeof t);
    int fused = c->sum || c->relu;
    int n_in = c->sum ? 4 : c->bias ? 3 : 2;
    struct kiln_node *node;
    if (kiln_graph_new(&t.g) != KILN_OK ||
        kiln_graph_node_add(t.g, fused ? KILN_OP_KilnFusedConv : KILN_OP_Conv, "conv", n_in, 1,
                            5, &node) != KILN_OK)
        abort();
    node->n_attr = 0;
    t.n_in = n_in;
    int id;
    if (kiln_graph_value_add(t.g, "y", KILN_VALUE_NODE, &id) != KILN_OK) abort();
    t.g->values[id].producer = 0;
    t.g->nodes[0].out[0] = id;
    int64_t xd[4] = {c->n, c->c, c->h, c->w}, wd[4] = {c->m, c->c / c->group, c->k, c->k};
    int64_t oh = (c->h + 2 * c->pad - c->k) / c->stride + 1;
    int64_t ow = (c->w + 2 * c->pad - c->k) / c->stride + 1;
    add_in(&t, 0, rand_tensor(4, xd, -1.0f, 1.0f), 0);
    add_in(&t, 1, rand_tensor(4, wd, -1.0f, 1.0f), 1);
    if (c->bias) {
        int64_t bd[1] = {c->m};
        add_in(&t, 2, rand_tensor(1, bd, -1.0f, 1.0f), 1);
    } else if (c->sum) { /* an absent bias */
        t.g->nodes[0].in[2] = -1;
    }
    if (c->sum) { /* the residual: a run-time input of Y's shape, larger than the products */
        int64_t sd[4] = {c->n, c->m, oh, ow};
        add_in(&t, 3, rand_tensor(4, sd, -3.0f, 2.0f), 0);
    }
    if (c->relu) {
        struct kiln_attr *ra = add_attr(&t, "activation", KILN_ATTR_STRING);
        ra->s.len = 4;
        ra->s.data = kiln_arena_strdup(t.g->mem, "Relu");
    }
    struct kiln_attr *a = add_attr(&t, "strides", KILN_ATTR_INTS);
    a->n = 2;
    a->ints = kiln_arena_alloc(t.g->mem, sizeof(int64_t) * 2);
    a->ints[0] = a->ints[1] = c->stride;
    a = add_attr(&t, "pads", KILN_ATTR_INTS);
    a->n = 4;
    a->ints = kiln_arena_alloc(t.g->mem, sizeof(int64_t) * 4);
    for (int i = 0; i < 4; i++) a->ints[i] = c->pad;
    add_attr(&t, "group", KILN_ATTR_INT)->i = c->group;
    int64_t count = c->n * c->m * oh * ow, cg = c->c / c->group, mg = c->m / c->group;
    float *want = malloc(sizeof(float) * (size_t)count), *exact = malloc(sizeof(float) * (size_t)count);
    const float *x = t.in[0]->data, *w = t.in[1]->data, *b = c->bias ? t.in[2]->data : NULL;
    const float *sum = c->sum ? t.in[3]->data : NULL;
    double scale = 1.0;
    for (int64_t in = 0; in < c->n; in++)
        for (int64_t m = 0; m < c->m; m++)
            for (int64_t oy = 0; oy < oh; oy++)
                for (int64_t ox = 0; ox < ow; ox++) {
                    double r = 0.0, e = 0.0;
                    int64_t g = m / mg;
                    for (int64_t ci = 0; ci < cg; ci++)
                        for (int64_t ky = 0; ky < c->k; ky++)
                            for (int64_t kx = 0; kx < c->k; kx++) {
                                int64_t iy = oy * c->stride - c->pad + ky;
                                int64_t ix = ox * c->stride - c->pad + kx;
                                if (iy < 0 || iy >= c->h || ix < 0 || ix >= c->w) continue;
                                float xv = x[((in * c->c + g * cg + ci) * c->h + iy) * c->w + ix];
                                float wv = w[((m * cg + ci) * c->k + ky) * c->k + kx];
                                e += (double)xv * wv;
                                r += (double)kiln_bf16_to_f32(kiln_f32_to_bf16(xv)) *
                                     kiln_bf16_to_f32(kiln_f32_to_bf16(wv));
                            }
                    if (b) {
                        r += b[m];
                        e += b[m];
                    }
                    int64_t o = ((in * c->m + m) * oh + oy) * ow + ox;
                    if (sum) {
                        r += sum[o];
                        e += sum[o];
                    }
                    if (c->relu) {
                        r = fmax(r, 0.0);
                        e = fmax(e, 0.0);
                    }
                    want[o] = (float)r;
                    exact[o] = (float)e;
                    scale = fmax(scale, fabs(e));
                }
    /* the integer reference */
    float *want8 = malloc(sizeof(float) * (size_t)count);
    {
        int64_t xn = c->n * c->c * c->h * c->w, wn = c->m * cg * c->k * c->k, per = cg * c->k * c->k;
        float lo = 0.0f, hi = 0.0f;
        for (int64_t i = 0; i < xn; i++) {
            lo = fminf(lo, x[i]);
            hi = fmaxf(hi, x[i]);
        }
        float sx = (hi - lo) / 255.0f;
        if (!(sx > 0.0f)) sx = 1.0f;
        float zf = nearbyintf(-lo / sx);
        int32_t zp = zf < 0 ? 0 : zf > 255 ? 255 : (int32_t)zf;
        int32_t *qx = malloc(sizeof(int32_t) * (size_t)xn), *qw = malloc(sizeof(int32_t) * (size_t)wn);
        float *sw = malloc(sizeof(float) * (size_t)c->m);
        for (int64_t i = 0; i < xn; i++) {
            float q = nearbyintf(x[i] * (1.0f / sx)) + (float)zp;
            qx[i] = q < 0 ? 0 : q > 255 ? 255 : (int32_t)q;
        }
        for (int64_t m = 0; m < c->m; m++) {
            float mx = 0.0f;
            for (int64_t i = 0; i < per; i++) mx = fmaxf(mx, fabsf(w[m * per + i]));
            sw[m] = mx > 0.0f ? mx / 127.0f : 1.0f;
            for (int64_t i = 0; i < per; i++) {
                float q = nearbyintf(w[m * per + i] / sw[m]);
                qw[m * per + i] = q < -127 ? -127 : q > 127 ? 127 : (int32_t)q;
            }
        }
        for (int64_t in = 0; in < c->n; in++)
            for (int64_t m = 0; m < c->m; m++)
                for (int64_t oy = 0; oy < oh; oy++)
                    for (int64_t ox = 0; ox < ow; ox++) {
                        int32_t acc = 0;
                        int64_t g = m / mg;
                        for (int64_t ci = 0; ci < cg; ci++)
                            for (int64_t ky = 0; ky < c->k; ky++)
                                for (int64_t kx = 0; kx < c->k; kx++) {
                                    int64_t iy = oy * c->stride - c->pad + ky;
                                    int64_t ix = ox * c->stride - c->pad + kx;
                                    if (iy < 0 || iy >= c->h || ix < 0 || ix >= c->w) continue;
                                    acc += (qx[((in * c->c + g * cg + ci) * c->h + iy) * c->w + ix] -
                                            zp) * qw[((m * cg + ci) * c->k + ky) * c->k + kx];
                                }
                        int64_t o = ((in * c->m + m) * oh + oy) * ow + ox;
                        float v = (float)acc * sw[m];
                        v = v * sx;
                        if (b) v = v + b[m];
                        if (sum) v = v + sum[o];
                        if (c->relu) v = fmaxf(v, 0.0f);
                        want8[o] = v;
                    }
        free(qx);
        free(qw);
        free(sw);
    }
    for (int threads = 1; threads <= 2; threads++) {
        const char *name;
        kiln_tensor *y = run_fast(&t, KILN_PRECISION_INT8, threads, &name);
        if (c->group == 1) {
            CHECK(y && int8_expected(name), "%s threads=%d: int8 kernel %s (VNNI %d)", what,
                  threads, name ? name : "declined", g_vnni);
        } else {
            CHECK(y && name && !strstr(name, "_int8"), "%s threads=%d: grouped conv ran %s", what,
                  threads, name ? name : "declined");
        }
        if (y && name && strstr(name, "_int8") && kiln_tensor_count(y) == count) {
            g_int8_cases++;
            const float *yd = y->data;
            int64_t bad = 0, first = -1;
            double qerr = 0.0;
            for (int64_t i = 0; i < count; i++) {
                if (memcmp(&yd[i], &want8[i], sizeof(float)) != 0) {
                    if (first < 0) first = i;
                    bad++;
                }
                qerr = fmax(qerr, fabs((double)yd[i] - exact[i]));
            }
            CHECK(bad == 0, "%s threads=%d: %lld of %lld int8 outputs differ from the integer "
                  "reference (first [%lld]: %.9g vs %.9g)", what, threads, (long long)bad,
                  (long long)count, (long long)first, first >= 0 ? (double)yd[first] : 0.0,
                  first >= 0 ? (double)want8[first] : 0.0);
            CHECK(qerr <= 0.05 * scale, "%s threads=%d: int8 error %g of scale %g", what, threads,
                  qerr, scale);
        }
        kiln_tensor_free(y);
        y = run_fast(&t, KILN_PRECISION_BF16, threads, &name);
        CHECK(y && bf16_expected(name), "%s threads=%d: bf16 kernel %s (AVX-512 %d)", what,
              threads, name ? name : "declined", g_bf16);
        if (y && name && strstr(name, "_bf16")) {
            g_bf16_cases++;
            const float *yd = y->data;
            double e1 = 0.0, e2 = 0.0;
            CHECK(kiln_tensor_count(y) == count, "%s: output count", what);
            for (int64_t i = 0; i < count && kiln_tensor_count(y) == count; i++) {
                double d1 = fabs((double)yd[i] - want[i]), d2 = fabs((double)yd[i] - exact[i]);
                e1 = isnan(d1) ? 1e9 : fmax(e1, d1);
                e2 = isnan(d2) ? 1e9 : fmax(e2, d2);
            }
            CHECK(e1 <= 1e-4 * scale, "%s threads=%d: bf16 off the rounded-input reference by %g",
                  what, threads, e1 / scale);
            CHECK(e2 <= 1e-2 * scale, "%s threads=%d: bf16 off the exact conv by %g", what,
                  threads, e2 / scale);
        }
        kiln_tensor_free(y);
    }
    free(want);
    free(want8);
    free(exact);
    kiln_graph_free(t.g);
}

/* ---- the session option ---- */

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

/* Run models/digits/1/model.onnx on 4 fixed images at a precision; the probabilities, or NULL. */
static float *digits_run(kiln_model *m, int precision, kiln_status *st_out)
{
    kiln_session_options so;
    kiln_session_options_init(&so);
    so.precision = precision;
    so.threads = 1;
    kiln_session *s = NULL;
    *st_out = kiln_session_create(m, NULL, &so, &s);
    if (*st_out != KILN_OK) return NULL;
    int64_t d[2] = {4, 64};
    kiln_tensor *x;
    if (kiln_tensor_new(KILN_DTYPE_F32, 2, d, &x) != KILN_OK) abort();
    float *xd = x->data;
    for (int i = 0; i < 4 * 64; i++) xd[i] = (float)((i * 7 + i / 64 * 3) % 17); /* pixels 0..16 */
    kiln_named_tensor in = {"pixels", x};
    kiln_outputs *o = NULL;
    float *p = NULL;
    *st_out = kiln_session_run(s, &in, 1, &o);
    if (*st_out == KILN_OK) {
        const kiln_tensor *y = kiln_outputs_get(o, 0);
        p = malloc(sizeof(float) * 40);
        if (y && kiln_tensor_count(y) == 40) memcpy(p, y->data, sizeof(float) * 40);
        else *st_out = KILN_ERR_INTERNAL;
    }
    kiln_outputs_free(o);
    kiln_tensor_free(x);
    kiln_session_free(s);
    return p;
}

static void test_session_option(void)
{
    kiln_model *m = NULL;
    kiln_status st = kiln_model_load(KILN_SOURCE_DIR "/models/digits/1/model.onnx", NULL, &m);
    CHECK(st == KILN_OK, "load digits: %s", kiln_last_error());
    if (st != KILN_OK) return;
    float *bad = digits_run(m, 7, &st);
    CHECK(!bad && st == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_last_error(), "precision 7"),
          "precision 7: %d %s", (int)st, kiln_last_error());
    free(bad);
    /* one model, sessions of every precision, interleaved: each its own plans */
    float *p32 = digits_run(m, KILN_PRECISION_FP32, &st);
    float *p8 = digits_run(m, KILN_PRECISION_INT8, &st);
    float *p16 = digits_run(m, KILN_PRECISION_BF16, &st);
    float *p32b = digits_run(m, KILN_PRECISION_FP32, &st);
    CHECK(p32 && p8 && p16 && p32b, "digits runs: %s", kiln_last_error());
    if (p32 && p8 && p16 && p32b) {
        CHECK(!memcmp(p32, p32b, sizeof(float) * 40), "fp32 unchanged by the other sessions");
        double d8 = 0.0, d16 = 0.0;
        for (int i = 0; i < 40; i++) {
            d8 = fmax(d8, fabs((double)p8[i] - p32[i]));
            d16 = fmax(d16, fabs((double)p16[i] - p32[i]));
        }
        CHECK(d8 < 0.1 && d16 < 0.1, "probabilities off fp32 by %g (int8), %g (bf16)", d8, d16);
        CHECK(!g_vnni || d8 > 0.0, "int8 session ran fp32");
        CHECK(!g_bf16 || d16 > 0.0, "bf16 session ran fp32");
    }
    free(p32);
    free(p8);
    free(p16);
    free(p32b);
    kiln_model_free(m);
}

int main(void)
{
    /* the public names */
    kiln_precision pr = KILN_PRECISION_FP32;
    CHECK(kiln_precision_parse("bf16", &pr) == KILN_OK && pr == KILN_PRECISION_BF16, "parse bf16");
    CHECK(kiln_precision_parse("int8", &pr) == KILN_OK && pr == KILN_PRECISION_INT8, "parse int8");
    CHECK(kiln_precision_parse("fp32", &pr) == KILN_OK && pr == KILN_PRECISION_FP32, "parse fp32");
    CHECK(kiln_precision_parse("INT8", &pr) == KILN_ERR_INVALID_ARGUMENT &&
              strstr(kiln_last_error(), "'INT8'"), "bad name: %s", kiln_last_error());
    CHECK(!strcmp(kiln_precision_name(KILN_PRECISION_INT8), "int8"), "name");
    g_vnni = cpu_flag(" avx512_vnni", " avx_vnni", " amx_int8");
    g_bf16 = cpu_flag(" avx512bw", NULL, NULL);
    if (!g_vnni) printf("no VNNI: int8 nodes are expected to stay fp32\n");
    if (!g_bf16) printf("no AVX-512: bf16 nodes are expected to stay fp32\n");
    if (!kiln_fast_op(KILN_OP_MatMul)) {
        printf("fast kernels disabled (KILN_FAST=0): nothing to compare\n");
        return 0;
    }
    static const int64_t ms[] = {1, 3, 17}, ks[] = {1, 15, 16, 17, 65}, ns[] = {1, 15, 16, 17, 33};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++)
            for (size_t l = 0; l < sizeof ns / sizeof ns[0]; l++) {
                struct mm_case c = {KILN_OP_MatMul, 2, ms[i], ks[j], ns[l], 0, 1.0f, 0, 0,
                                    -1.0f, 1.0f};
                check_case(&c);
            }
    const struct mm_case more[] = {
        {KILN_OP_MatMul, 3, 5, 33, 17, 0, 1.0f, 0, 0, -0.5f, 2.0f},   /* folded rows, asymmetric A */
        {KILN_OP_MatMul, 2, 16, 64, 64, 0, 1.0f, 0, 0, 0.0f, 3.0f},   /* A >= 0 (after a ReLU) */
        {KILN_OP_MatMul, 2, 4, 16, 8, 0, 1.0f, 0, 0, -2.0f, -0.5f},   /* A < 0 */
        {KILN_OP_MatMul, 2, 40, 1024, 16, 0, 1.0f, 0, 0, -0.7f, 3.0f}, /* A split over threads */
        {KILN_OP_Gemm, 2, 7, 33, 15, 1, 0.5f, 1, 0, -1.0f, 1.0f},     /* transB, alpha, row bias */
        {KILN_OP_Gemm, 2, 9, 17, 16, 0, 1.0f, 2, 0, -1.0f, 1.0f},     /* full C: sum post-op */
        {KILN_OP_Gemm, 2, 1, 65, 33, 1, 1.0f, 1, 0, -1.0f, 1.0f},     /* batch 1 dense layer */
        {KILN_OP_KilnFusedMatMul, 2, 17, 31, 20, 1, 1.0f, 1, 1, -1.0f, 1.0f}, /* bias + Relu */
        {KILN_OP_KilnFusedMatMul, 3, 6, 16, 33, 0, 2.0f, 1, 1, -1.0f, 1.5f},  /* folded, alpha */
    };
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) check_case(&more[i]);
    const struct conv_case convs[] = {
        {1, 1, 8, 8, 1, 3, 1, 1, 1, 0, 0, 0},
        {1, 3, 9, 7, 16, 3, 1, 1, 1, 1, 0, 0},
        {2, 16, 8, 8, 17, 3, 2, 1, 1, 1, 0, 0},
        {1, 17, 6, 6, 33, 1, 1, 0, 1, 1, 0, 0},
        {1, 33, 10, 10, 16, 3, 1, 0, 1, 0, 0, 0},
        {1, 16, 7, 7, 16, 3, 1, 1, 16, 1, 0, 0}, /* depthwise */
        {1, 32, 5, 5, 64, 3, 1, 1, 4, 1, 0, 0},  /* groups */
        /* KilnFusedConv with a residual Sum (a ResNet block's last convolution) */
        {1, 16, 8, 8, 16, 3, 1, 1, 1, 1, 1, 1},  /* bias + Sum + Relu */
        {2, 17, 7, 5, 33, 3, 1, 1, 1, 1, 1, 0},  /* bias + Sum, channels off the block */
        {1, 3, 6, 6, 1, 1, 1, 0, 1, 0, 1, 1},    /* no bias, one output channel */
        {2, 32, 9, 9, 64, 1, 2, 0, 1, 1, 1, 1},  /* strided 1x1 (a downsample branch) */
        {1, 33, 5, 5, 15, 3, 1, 1, 1, 1, 0, 1},  /* bias + Relu, no Sum */
        {1, 16, 7, 7, 16, 3, 1, 1, 16, 1, 1, 1}, /* depthwise with a Sum: stays fp32 */
    };
    for (size_t i = 0; i < sizeof convs / sizeof convs[0]; i++) check_conv(&convs[i]);
    test_session_option();
    printf("%d int8 and %d bf16 runs compared\n", g_int8_cases, g_bf16_cases);
    /* with AMX, a bf16 convolution whose work pays for the reorders runs on the tiles in
     * oneDNN's channels-last formats (dnnl/conv.c, conv_try_any), not on AVX512-BF16 */
    printf("%d bf16 convolution runs on AMX (AMX-BF16 %d)\n", g_bf16_amx_convs, kd_cpu_amx_bf16());
    if (kd_cpu_amx_bf16()) CHECK(g_bf16_amx_convs >= 8, "only %d bf16 convolution runs on AMX",
                                 g_bf16_amx_convs);
    return CHECK_DONE();
}
