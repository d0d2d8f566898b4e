/*
 * kernel_cases.h - the test case generators of the kernel families
 * (src/kernels/family.h). The family lists name one generator per kernel
 * (their `cases` column); unit_kernels.c pairs each kernel with
 * kcase_<cases> here, so a kernel listed without a generator does not
 * build, runs every generator once, and runs each case through the
 * reference, the op's chosen kernel on every ISA, and every kernel of the
 * op forced (check_case_hook). A generator states for each case whether
 * the op's fast path must take it (check_case's expect_handled).
 *
 * Include after kernel_case.h.
 */
#ifndef KILN_TEST_KERNEL_CASES_H
#define KILN_TEST_KERNEL_CASES_H

/* ---- Elementwise (elementwise.def) ---- */

struct unary_case {
    enum kiln_op op;
    const char *name;
    float lo, hi;       /* random input range */
    double rtol, atol;
};

static void add_unary_attrs(struct case_node *c, enum kiln_op op, int variant)
{
    if (op == KILN_OP_LeakyRelu) attr_float(c, "alpha", 0.1f);
    if (op == KILN_OP_HardSigmoid) {
        attr_float(c, "alpha", 0.3f);
        attr_float(c, "beta", 0.4f);
    }
    if (op == KILN_OP_Gelu) attr_str(c, "approximate", variant ? "tanh" : "none");
    if (op == KILN_OP_Swish && variant) attr_float(c, "alpha", 1.702f); /* else 1: SiLU */
}

/*
 * The reference computes Gelu as 0.5 x (1 + erf(x / sqrt 2)) in double,
 * which cancels for x below about -6 (it returns -0 from x = -9). The fast
 * kernels go through erfc / x sigmoid(2u) instead, so they are also held
 * to an independent long-double oracle: 1e-5 relative, or a denormal ulp.
 */
static void gelu_oracle_check(struct case_node *c, int variant, const char *label)
{
    const kiln_tensor *x = c->in[0];
    kiln_tensor *want;
    if (kiln_tensor_new(KILN_DTYPE_F32, x->rank, x->dims, &want) != KILN_OK) abort();
    const float *px = x->data;
    float *pw = want->data;
    for (size_t i = 0; i < x->nbytes / 4; i++) {
        long double d = px[i];
        if (variant) {
            long double u = 0.7978845608028654L * (d + 0.044715L * d * d * d);
            pw[i] = (float)(d / (1.0L + expl(-2.0L * u)));
        } else {
            pw[i] = (float)(0.5L * d * erfcl(-d / sqrtl(2.0L)));
        }
    }
    for (int lv = 0; lv < isa_levels(); lv++) {
        kiln_tensor *got[MAX_IO];
        bool handled;
        char what[128];
        snprintf(what, sizeof what, "%s [%s] vs long double", label, isa_names[lv]);
        kiln_status st = run_fast(c, isa_names[lv], 1, &handled, NULL, got);
        CHECK(st == KILN_OK && handled, "%s: failed", what);
        if (st == KILN_OK && handled)
            CHECK(compare_f32(what, got[0], want, x, 1e-5, 3e-45), "%s: differs", what);
        free_outs(got, c->n_out);
    }
    kiln_tensor_free(want);
}

/* One unary case over x (n elements); variant picks Gelu's mode. */
static void unary_run_case(const struct unary_case *u, int variant, const float *xs, int64_t n,
                           const char *tag)
{
    struct case_node c;
    int n_in = u->op == KILN_OP_Clip ? 3 : 1;
    cn_init(&c, u->op, u->op == KILN_OP_Swish ? 24 : 13, n_in, 1);
    add_unary_attrs(&c, u->op, variant);
    kiln_tensor *x = tensor_f32(1, &n);
    memcpy(x->data, xs, (size_t)n * sizeof(float));
    cn_input(&c, 0, x, false);
    if (u->op == KILN_OP_Clip) {
        int64_t one = 1;
        kiln_tensor *lo = tensor_f32(0, &one), *hi = variant ? NULL : tensor_f32(0, &one);
        ((float *)lo->data)[0] = -0.5f;
        if (hi) ((float *)hi->data)[0] = 2.0f;
        cn_input(&c, 1, lo, false);
        cn_input(&c, 2, hi, false);
    }
    char label[96];
    snprintf(label, sizeof label, "%s%s %s n=%lld", u->name,
             !variant ? "" : u->op == KILN_OP_Gelu ? "(tanh)" : u->op == KILN_OP_Swish ? "(1.702)" : "",
             tag, (long long)n);
    double worst_before = worst_rel;
    check_case(&c, label, u->rtol, u->atol, 1);
    if (u->op == KILN_OP_Gelu) { /* report the error against the oracle, not the reference */
        worst_rel = worst_before;
        gelu_oracle_check(&c, variant, label);
    }
    cn_free(&c);
}

static const struct unary_case unary_cases[] = {
    {KILN_OP_Relu, "Relu", -5, 5, 0, 0},
    {KILN_OP_LeakyRelu, "LeakyRelu", -5, 5, 0, 0},
    {KILN_OP_Clip, "Clip", -5, 5, 0, 0},
    {KILN_OP_Neg, "Neg", -5, 5, 0, 0},
    {KILN_OP_Sqrt, "Sqrt", 0, 100, 0, 0},
    {KILN_OP_Sigmoid, "Sigmoid", -20, 20, 1e-5, 3e-45},
    {KILN_OP_Tanh, "Tanh", -6, 6, 1e-5, 3e-45},
    {KILN_OP_Exp, "Exp", -90, 90, 1e-5, 3e-45},
    {KILN_OP_Erf, "Erf", -4, 4, 1e-5, 3e-45},
    {KILN_OP_Gelu, "Gelu", -8, 8, 1e-5, 2e-14}, /* see gelu_oracle_check */
    {KILN_OP_HardSwish, "HardSwish", -5, 5, 1e-5, 1e-30},
    {KILN_OP_HardSigmoid, "HardSigmoid", -5, 5, 1e-6, 1e-30},
    {KILN_OP_Softplus, "Softplus", -20, 20, 1e-5, 3e-45},
    /* x sigmoid(alpha x): the float sigmoid is denormal from alpha x = -87, where the product
     * loses the digits the reference's double keeps; the results there are below FLT_MIN */
    {KILN_OP_Swish, "Swish", -20, 20, 1e-5, 1.2e-38},
};
#define N_UNARY (int)(sizeof unary_cases / sizeof unary_cases[0])

static void test_unary(void)
{
    float *buf = malloc(120001 * sizeof(float));
    for (int u = 0; u < N_UNARY; u++) {
        const struct unary_case *uc = &unary_cases[u];
        int variants =
            uc->op == KILN_OP_Gelu || uc->op == KILN_OP_Clip || uc->op == KILN_OP_Swish ? 2 : 1;
        for (int v = 0; v < variants; v++) {
            double worst_before = worst_rel;
            worst_rel = 0;
            for (int s = 0; s < N_SIZES; s++) {
                int64_t n = sizes[s];
                for (int64_t i = 0; i < n; i++) buf[i] = rng_uniform(uc->lo, uc->hi);
                unary_run_case(uc, v, buf, n, "random");
            }
            unary_run_case(uc, v, specials, N_SPECIALS, "specials");
            /* dense sweep over the whole interesting range, and big enough to thread */
            int64_t n = 120001;
            for (int64_t i = 0; i < n; i++) buf[i] = -120.0f + 240.0f * (float)i / (float)(n - 1);
            unary_run_case(uc, v, buf, n, "sweep[-120,120]");
            n = 20001;
            for (int64_t i = 0; i < n; i++) buf[i] = -4.0f + 8.0f * (float)i / (float)(n - 1);
            unary_run_case(uc, v, buf, n, "sweep[-4,4]");
            printf("%-12s%-7s max relative error vs %s (|y| > 1e-30): %.2e\n", uc->name,
                   !v ? "" : uc->op == KILN_OP_Gelu ? "(tanh)" : uc->op == KILN_OP_Swish ? "(1.702)" : "",
                   uc->op == KILN_OP_Gelu ? "long double" : "reference", worst_rel);
            if (worst_before > worst_rel) worst_rel = worst_before;
        }
    }
    free(buf);
}

/* ---- Binary (elementwise.def) ---- */

static void binary_case(enum kiln_op op, int ra, const int64_t *da, int rb, const int64_t *db,
                        int expect)
{
    struct case_node c;
    cn_init(&c, op, 14, 2, 1);
    kiln_tensor *a = tensor_f32(ra, da), *b = tensor_f32(rb, db);
    float *pa = a->data, *pb = b->data;
    for (size_t i = 0; i < a->nbytes / 4; i++) pa[i] = rng_uniform(-10, 10);
    for (size_t i = 0; i < b->nbytes / 4; i++) pb[i] = rng_uniform(-10, 10);
    for (int i = 0; i < N_SPECIALS && i < (int)(a->nbytes / 4); i += 3) pa[i] = specials[i];
    for (int i = 1; i < N_SPECIALS && i < (int)(b->nbytes / 4); i += 4) pb[i] = specials[i];
    cn_input(&c, 0, a, false);
    cn_input(&c, 1, b, false);
    char label[128], sa[64], sb[64];
    snprintf(label, sizeof label, "%s %s %s", kiln_op_name(op), kiln_shape_str(ra, da, sa, 64),
             kiln_shape_str(rb, db, sb, 64));
    check_case(&c, label, 0, 0, expect);
    cn_free(&c);
}

static void test_binary(void)
{
    const enum kiln_op ops[] = {KILN_OP_Add, KILN_OP_Sub, KILN_OP_Mul, KILN_OP_Div};
    for (int o = 0; o < 4; o++) {
        for (int s = 0; s < N_SIZES; s++) {
            int64_t n = sizes[s], one = 1, rn[2] = {5, n}, rn3[3] = {2, 3, n}, r1n[2] = {1, n};
            binary_case(ops[o], 1, &n, 1, &n, 1);          /* same shape */
            binary_case(ops[o], 1, &n, 0, &one, 1);        /* b scalar */
            binary_case(ops[o], 0, &one, 1, &n, 1);        /* a scalar */
            binary_case(ops[o], 2, rn, 1, &n, 1);          /* bias row */
            binary_case(ops[o], 1, &n, 2, rn, 1);          /* a repeats */
            binary_case(ops[o], 3, rn3, 2, r1n, 1);        /* [2,3,n] + [1,n] */
        }
        int64_t big[3] = {4, 100, 300}, row = 300, col[2] = {5, 1}, rowm[2] = {1, 7};
        binary_case(ops[o], 3, big, 1, &row, 1);           /* threaded bias add */
        binary_case(ops[o], 3, big, 3, big, 1);
        binary_case(ops[o], 2, col, 2, rowm, 1);           /* outer broadcast: broadcast.c */
        /* per-channel scales (squeeze-and-excitation): [N,C,H,W] op [N or 1,C,1,1] */
        int64_t x4[4] = {2, 5, 7, 9}, s4[4] = {2, 5, 1, 1}, s14[4] = {1, 5, 1, 1};
        int64_t xb[4] = {2, 64, 30, 30}, sb[4] = {2, 64, 1, 1};
        binary_case(ops[o], 4, x4, 4, s4, 1);
        binary_case(ops[o], 4, x4, 4, s14, 1);
        binary_case(ops[o], 4, s4, 4, x4, 1);
        binary_case(ops[o], 4, xb, 4, sb, 1);              /* threaded */
    }
}

/* General broadcasts (broadcast.c): shapes the specialised kernels decline,
 * all taken by the op's choice; odd sizes around the vector widths, both
 * inputs broadcasting, the small input first or second, ranks 0 to 6. */
static void test_binary_bcast(void)
{
    const enum kiln_op ops[] = {KILN_OP_Add, KILN_OP_Sub, KILN_OP_Mul, KILN_OP_Div};
    for (int o = 0; o < 4; o++) {
        enum kiln_op op = ops[o];
        for (int s = 0; s < N_SIZES; s++) {
            int64_t n = sizes[s];
            int64_t x3[3] = {3, n, 5}, mid[3] = {1, n, 1}, midr[2] = {n, 1};
            int64_t col[2] = {n, 1}, row[2] = {1, 9}, row2[2] = {3, n}, col2[2] = {3, 1};
            binary_case(op, 3, x3, 3, mid, 1);   /* middle axis [1,C,1] vs [N,C,L] */
            binary_case(op, 2, midr, 3, x3, 1);  /* [C,1] vs [N,C,L], small first */
            binary_case(op, 2, col, 2, row, 1);  /* outer product [n,1] op [1,9] */
            binary_case(op, 2, row2, 2, col2, 1); /* [3,n] op [3,1]: a column */
        }
        /* ConvNeXt's layer scale [C,1,1] against [N,C,H,W], both orders, odd C and H*W */
        int64_t x4[4] = {2, 5, 7, 9}, ls[3] = {5, 1, 1}, xw[4] = {1, 96, 16, 16}, lw[3] = {96, 1, 1};
        binary_case(op, 4, x4, 3, ls, 1);
        binary_case(op, 3, ls, 4, x4, 1);
        binary_case(op, 4, xw, 3, lw, 1);
        /* an attention mask [B,1,1,S] against scores [B,H,S,S], and [B,1,S,S] */
        int64_t sc[4] = {2, 3, 17, 17}, m1[4] = {2, 1, 1, 17}, m2[4] = {2, 1, 17, 17};
        binary_case(op, 4, sc, 4, m1, 1);
        binary_case(op, 4, m2, 4, sc, 1);
        /* both inputs broadcast; a 6-D case; rank 0 against rank 0 */
        int64_t p[3] = {3, 1, 5}, q[3] = {1, 4, 1}, d6a[6] = {2, 1, 3, 1, 5, 3},
                d6b[6] = {1, 4, 3, 2, 1, 3}, one = 1;
        binary_case(op, 3, p, 3, q, 1);
        binary_case(op, 6, d6a, 6, d6b, 1);
        binary_case(op, 0, &one, 0, &one, 1);
        /* threaded: rows of 300 from an outer product, and a long column broadcast */
        int64_t big[3] = {64, 1, 300}, bigb[3] = {1, 80, 300}, tall[2] = {70000, 8},
                tallc[2] = {70000, 1};
        binary_case(op, 3, big, 3, bigb, 1);
        binary_case(op, 2, tall, 2, tallc, 1);
    }
    /* declined: int32 (the reference runs it) */
    int64_t da[2] = {3, 1}, db[2] = {1, 4};
    struct case_node c;
    cn_init(&c, KILN_OP_Add, 14, 2, 1);
    kiln_tensor *a, *b;
    if (kiln_tensor_new(KILN_DTYPE_I32, 2, da, &a) != KILN_OK ||
        kiln_tensor_new(KILN_DTYPE_I32, 2, db, &b) != KILN_OK)
        abort();
    for (int i = 0; i < 3; i++) ((int32_t *)a->data)[i] = i * 7 - 5;
    for (int i = 0; i < 4; i++) ((int32_t *)b->data)[i] = 100 - i;
    cn_input(&c, 0, a, false);
    cn_input(&c, 1, b, false);
    check_case(&c, "Add int32 [3,1] [1,4] (reference)", 0, 0, 0);
    cn_free(&c);
}

/* ---- Softmax, LayerNormalization (norm.def) ---- */

static enum kiln_op g_softmax_op = KILN_OP_Softmax; /* test_softmax's op: Softmax or LogSoftmax */

static void softmax_case(int rank, const int64_t *dims, int64_t axis, int opset, bool specials_in)
{
    struct case_node c;
    cn_init(&c, g_softmax_op, opset, 1, 1);
    attr_int(&c, "axis", axis);
    kiln_tensor *x = tensor_f32(rank, dims);
    float *px = x->data;
    for (size_t i = 0; i < x->nbytes / 4; i++) px[i] = rng_uniform(-30, 30);
    if (specials_in && x->nbytes / 4 > 40) {
        px[3] = -INFINITY;
        px[11] = 1e30f;
        px[20] = -1e30f;
        px[37] = NAN;
    }
    cn_input(&c, 0, x, false);
    char label[128], sd[64];
    snprintf(label, sizeof label, "%s %s axis %lld opset %d%s",
             g_softmax_op == KILN_OP_LogSoftmax ? "LogSoftmax" : "Softmax",
             kiln_shape_str(rank, dims, sd, 64), (long long)axis, opset,
             specials_in ? " specials" : "");
    /* LogSoftmax: where x is the row's maximum, y = x - lse is near 0 and only the
     * absolute error (a few ulps of lse, |x| <= 30 here) is meaningful */
    check_case(&c, label, 1e-5, g_softmax_op == KILN_OP_LogSoftmax ? 2e-5 : 1e-30, 1);
    cn_free(&c);
}

static void test_softmax(void)
{
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s], d2[2] = {3, n}, d3[3] = {2, n, 5}, d3b[3] = {3, 4, n};
        softmax_case(2, d2, -1, 13, false);
        softmax_case(3, d3, 1, 13, false);
        softmax_case(3, d3b, 0, 13, false);
        softmax_case(3, d3b, 1, 11, false); /* 2-D coercion */
        int64_t d4[3] = {2, 17, n};
        softmax_case(3, d4, 1, 13, false);  /* strided, inner = n */
    }
    int64_t big[2] = {64, 1000}, sp[2] = {4, 64}, all_inf[2] = {2, 3};
    softmax_case(2, big, -1, 13, false);
    softmax_case(2, sp, -1, 13, true);
    /* a row of -inf gives NaN in both */
    struct case_node c;
    cn_init(&c, g_softmax_op, 13, 1, 1);
    kiln_tensor *x = tensor_f32(2, all_inf);
    for (int i = 0; i < 6; i++) ((float *)x->data)[i] = i < 3 ? -INFINITY : (float)i;
    cn_input(&c, 0, x, false);
    check_case(&c, "Softmax row of -inf", 1e-5, 1e-30, 1);
    cn_free(&c);
}

static void test_log_softmax(void)
{
    g_softmax_op = KILN_OP_LogSoftmax;
    test_softmax();
    g_softmax_op = KILN_OP_Softmax;
}

static void layernorm_case(int rank, const int64_t *dims, int64_t axis, bool bias, bool stats)
{
    struct case_node c;
    cn_init(&c, KILN_OP_LayerNormalization, 17, bias ? 3 : 2, stats ? 3 : 1);
    attr_int(&c, "axis", axis);
    attr_float(&c, "epsilon", 1e-5f);
    c.out_wanted[1] = c.out_wanted[2] = stats;
    int a = (int)(axis < 0 ? axis + rank : axis);
    kiln_tensor *x = tensor_f32(rank, dims);
    kiln_tensor *sc = tensor_f32(rank - a, dims + a), *bi = bias ? tensor_f32(rank - a, dims + a)
                                                                 : NULL;
    float *px = x->data;
    for (size_t i = 0; i < x->nbytes / 4; i++) px[i] = 3.0f * rng_normal() + 2.0f;
    for (size_t i = 0; i < sc->nbytes / 4; i++) ((float *)sc->data)[i] = rng_uniform(0.5f, 1.5f);
    for (size_t i = 0; bi && i < bi->nbytes / 4; i++) ((float *)bi->data)[i] = rng_normal();
    cn_input(&c, 0, x, false);
    cn_input(&c, 1, sc, true);
    if (bias) cn_input(&c, 2, bi, true);
    char label[128], sd[64];
    snprintf(label, sizeof label, "LayerNormalization %s axis %lld%s%s",
             kiln_shape_str(rank, dims, sd, 64), (long long)axis, bias ? " bias" : "",
             stats ? " stats" : "");
    check_case(&c, label, 1e-5, 1e-5, 1);
    cn_free(&c);
}

static void test_layernorm(void)
{
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s], d2[2] = {5, n}, d3[3] = {2, 3, n};
        layernorm_case(2, d2, -1, true, false);
        layernorm_case(2, d2, 1, false, true);
        layernorm_case(3, d3, 1, true, true);
    }
    int64_t big[3] = {8, 16, 768};
    layernorm_case(3, big, -1, true, false);
}

/* InstanceNormalization (groups 0) or GroupNormalization of x [dims], scale and bias per
 * channel (or per group before opset 21), constant or not. */
static void groupnorm_act_case(int rank, const int64_t *dims, int64_t groups, int opset,
                               bool konst, float shift, const char *act)
{
    struct case_node c;
    enum kiln_op op = act ? KILN_OP_KilnGroupNorm
                      : groups ? KILN_OP_GroupNormalization : KILN_OP_InstanceNormalization;
    cn_init(&c, op, groups ? opset : 6, 3, 1);
    attr_float(&c, "epsilon", groups ? 1e-3f : 1e-5f);
    if (groups) attr_int(&c, "num_groups", groups);
    if (act) attr_str(&c, "activation", act);
    int64_t per = groups && opset < 21 ? groups : dims[1];
    kiln_tensor *x = tensor_f32(rank, dims), *sc = tensor_f32(1, &per), *bi = tensor_f32(1, &per);
    for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = 3.0f * rng_normal() + shift;
    for (int64_t i = 0; i < per; i++) {
        ((float *)sc->data)[i] = rng_uniform(-1.5f, 1.5f);
        ((float *)bi->data)[i] = rng_normal();
    }
    cn_input(&c, 0, x, false);
    cn_input(&c, 1, sc, konst);
    cn_input(&c, 2, bi, konst);
    char label[160], sd[64];
    snprintf(label, sizeof label, "%s%s%s %s groups %lld opset %d%s mean %g", kiln_op_name(op),
             act ? " " : "", act ? act : "", kiln_shape_str(rank, dims, sd, 64),
             (long long)groups, groups ? opset : 6, konst ? " constant scale" : "", (double)shift);
    check_case(&c, label, 2e-5, 2e-5, 1);
    cn_free(&c);
}

static void groupnorm_case(int rank, const int64_t *dims, int64_t groups, int opset, bool konst,
                           float shift)
{
    groupnorm_act_case(rank, dims, groups, opset, konst, shift, NULL);
}

/* KilnGroupNorm: GroupNormalization (per channel) then SiLU or Relu, plain and blocked. */
static void test_groupnorm_act(void)
{
    int64_t img[4] = {2, 32, 7, 9}, p[4] = {1, 20, 5, 5}, vol[5] = {1, 6, 3, 4, 5};
    groupnorm_act_case(4, img, 8, 21, true, 0.5f, "SiLU");
    groupnorm_act_case(4, p, 4, 21, false, -1.0f, "Relu");
    groupnorm_act_case(5, vol, 3, 21, true, 0.3f, "SiLU");
    for (int b = 8; b <= 16; b += 8) {
        case_layout = b;
        groupnorm_act_case(4, img, 8, 21, true, 0.0f, "SiLU");
        groupnorm_act_case(4, p, 4, 21, true, 2.0f, "SiLU"); /* padding lanes stay 0 */
        groupnorm_act_case(4, p, 5, 21, false, 0.0f, "Relu");
        case_layout = 0;
    }
}

static void test_groupnorm(void)
{
    for (int s = 0; s < N_SIZES - 1; s++) { /* planes of 1 to 33 pixels: tails, one pixel */
        int64_t d4[4] = {2, 3, sizes[s], 1 + (s & 1)}, d3[3] = {1, 4, sizes[s]};
        groupnorm_case(4, d4, 0, 6, s & 1, 0.0f);
        groupnorm_case(3, d3, 0, 6, true, 2.0f);
    }
    int64_t img[4] = {2, 32, 24, 24}, vol[5] = {1, 6, 3, 4, 5}, far[3] = {2, 8, 300};
    groupnorm_case(4, img, 0, 6, true, 0.5f);
    groupnorm_case(5, vol, 0, 6, false, -1.0f);
    groupnorm_case(3, far, 0, 6, true, 1000.0f); /* a mean far from zero against a std of 3 */
    groupnorm_case(4, img, 8, 18, true, 0.0f);   /* scale and bias per group */
    groupnorm_case(4, img, 8, 21, false, 0.0f);  /* per channel */
    groupnorm_case(5, vol, 3, 21, true, 0.3f);
    groupnorm_case(4, img, 32, 21, true, 0.0f);
    /* channel-blocked as the layout pass stores them: groups inside a block, across blocks
     * (16 channels a group in blocks of 8), straddling blocks (5 channels a group), padding
     * lanes, one pixel, a mean far from zero */
    for (int b = 8; b <= 16; b += 8) {
        case_layout = b;
        int64_t a[4] = {2, 64, 7, 9}, p[4] = {1, 20, 5, 5}, q[4] = {2, 48, 3, 11},
                one[4] = {3, 24, 1, 1}, w[4] = {1, 12, 16, 16};
        groupnorm_case(4, a, 32, 21, true, 0.5f);
        groupnorm_case(4, p, 4, 21, false, 0.0f);
        groupnorm_case(4, q, 3, 21, true, 1000.0f);
        groupnorm_case(4, one, 6, 18, true, -2.0f);
        groupnorm_case(4, w, 0, 6, true, 0.0f);
        groupnorm_case(4, p, 0, 6, false, 3.0f);
        case_layout = 0;
    }
}

/* Pow(x, e) with a constant scalar exponent e of dtype dt: the products, quotient and square
 * roots the fast kernel computes (2, 3, 0.5, -1, -0.5) within a few ulp of the reference's
 * pow() in double; any other exponent, or one that is not a constant, stays with the
 * reference. */
static void pow_case(double e, kiln_dtype dt, bool konst, const float *xs, int64_t n,
                     const char *tag, int expect)
{
    struct case_node c;
    cn_init(&c, KILN_OP_Pow, 15, 2, 1);
    kiln_tensor *x = tensor_f32(1, &n), *et;
    memcpy(x->data, xs, (size_t)n * sizeof(float));
    if (kiln_tensor_new(dt, 0, NULL, &et) != KILN_OK) abort();
    if (dt == KILN_DTYPE_F32) ((float *)et->data)[0] = (float)e;
    else ((int64_t *)et->data)[0] = (int64_t)e;
    cn_input(&c, 0, x, false);
    cn_input(&c, 1, et, konst);
    char label[96];
    snprintf(label, sizeof label, "Pow(x, %g %s%s) %s n=%lld", e, kiln_dtype_name(dt),
             konst ? "" : ", not constant", tag, (long long)n);
    check_case(&c, label, 1e-6, 1e-37, expect);
    cn_free(&c);
}

static void test_pow(void)
{
    static const double exps[] = {2, 3, 0.5, -1, -0.5};
    float *buf = malloc(100003 * sizeof(float));
    for (size_t k = 0; k < sizeof exps / sizeof exps[0]; k++) {
        float lo = exps[k] == 0.5 || exps[k] == -0.5 ? 0.0f : -30.0f;
        for (int s = 0; s < N_SIZES; s++) {
            for (int64_t i = 0; i < sizes[s]; i++) buf[i] = rng_uniform(lo, 30.0f);
            pow_case(exps[k], KILN_DTYPE_F32, true, buf, sizes[s], "random", 1);
        }
        pow_case(exps[k], KILN_DTYPE_F32, true, specials, N_SPECIALS, "specials", 1);
        for (int64_t i = 0; i < 100003; i++) buf[i] = rng_uniform(lo, 30.0f);
        pow_case(exps[k], KILN_DTYPE_F32, true, buf, 100003, "threaded", 1);
    }
    for (int64_t i = 0; i < 64; i++) buf[i] = rng_uniform(-4.0f, 4.0f);
    pow_case(2, KILN_DTYPE_I64, true, buf, 64, "random", 1);
    pow_case(2, KILN_DTYPE_F32, false, buf, 64, "random", 0);
    pow_case(1.7, KILN_DTYPE_F32, true, buf, 64, "random", 0);
    free(buf);
}

/* ---- Gather, Slice, Pad, Transpose, Concat (copy.def) ---- */

static void test_gather(void)
{
    const int64_t sizes_d[] = {1, 7, 16, 33, 768};
    for (int s = 0; s < 5; s++) {
        for (int it = 0; it < 2; it++) {
            int64_t dd[2] = {50, sizes_d[s]}, di[2] = {3, 4};
            struct case_node c;
            cn_init(&c, KILN_OP_Gather, 13, 2, 1);
            kiln_tensor *data = tensor_f32(2, dd), *idx;
            for (size_t i = 0; i < data->nbytes / 4; i++) ((float *)data->data)[i] = rng_normal();
            if (kiln_tensor_new(it ? KILN_DTYPE_I32 : KILN_DTYPE_I64, 2, di, &idx) != KILN_OK)
                abort();
            for (int i = 0; i < 12; i++) {
                int64_t v = (int64_t)(rng_next() % 100) - 50; /* [-50, 50): negatives wrap */
                if (it) ((int32_t *)idx->data)[i] = (int32_t)v;
                else ((int64_t *)idx->data)[i] = v;
            }
            cn_input(&c, 0, data, true);
            cn_input(&c, 1, idx, false);
            char label[64];
            snprintf(label, sizeof label, "Gather [50,%lld] %s", (long long)sizes_d[s],
                     it ? "int32" : "int64");
            check_case(&c, label, 0, 0, 1);
            cn_free(&c);
        }
    }
    /* out of range: an error naming the node and the index */
    int64_t dd[2] = {10, 4}, di = 3;
    struct case_node c;
    cn_init(&c, KILN_OP_Gather, 13, 2, 1);
    kiln_tensor *data = tensor_f32(2, dd), *idx;
    if (kiln_tensor_new(KILN_DTYPE_I64, 1, &di, &idx) != KILN_OK) abort();
    ((int64_t *)idx->data)[0] = 2;
    ((int64_t *)idx->data)[1] = 10;
    cn_input(&c, 0, data, true);
    cn_input(&c, 1, idx, false);
    kiln_tensor *out[MAX_IO];
    for (int lv = 0; lv < isa_levels(); lv++) {
        bool handled;
        kiln_status st = run_fast(&c, isa_names[lv], 1, &handled, NULL, out);
        CHECK(handled && st == KILN_ERR_INVALID_ARGUMENT, "Gather out of range: status %d", st);
        CHECK(strstr(kiln_last_error(), "node_under_test") && strstr(kiln_last_error(), "10"),
              "Gather error message: %s", kiln_last_error());
        free_outs(out, 1);
    }
    cn_free(&c);
}

/* Gather on any axis (data.c gather_axis): data dt of dims, indices (int32 or int64,
 * shape ir/id, values in [-n, n)) at run time or constant. */
static void gather_axis_case(kiln_dtype dt, int rank, const int64_t *dims, int64_t axis, int ir,
                             const int64_t *id, bool idx32, bool konst)
{
    struct case_node c;
    cn_init(&c, KILN_OP_Gather, 13, 2, 1);
    attr_int(&c, "axis", axis);
    kiln_tensor *data, *idx;
    if (kiln_tensor_new(dt, rank, dims, &data) != KILN_OK ||
        kiln_tensor_new(idx32 ? KILN_DTYPE_I32 : KILN_DTYPE_I64, ir, id, &idx) != KILN_OK)
        abort();
    if (dt == KILN_DTYPE_F32)
        for (size_t i = 0; i < data->nbytes / 4; i++) ((float *)data->data)[i] = rng_normal();
    else
        for (size_t i = 0; i < data->nbytes; i++) ((uint8_t *)data->data)[i] = (uint8_t)rng_next();
    int64_t n = dims[axis < 0 ? axis + rank : axis], ni = kiln_tensor_count(idx);
    for (int64_t i = 0; i < ni; i++) {
        int64_t v = (int64_t)(rng_next() % (uint64_t)(2 * n)) - n; /* [-n, n) */
        if (idx32) ((int32_t *)idx->data)[i] = (int32_t)v;
        else ((int64_t *)idx->data)[i] = v;
    }
    cn_input(&c, 0, data, false);
    cn_input(&c, 1, idx, konst);
    char label[128], sd[64], si[64];
    snprintf(label, sizeof label, "Gather %s %s axis %lld indices %s %s%s", kiln_dtype_name(dt),
             kiln_shape_str(rank, dims, sd, 64), (long long)axis, kiln_shape_str(ir, id, si, 64),
             idx32 ? "int32" : "int64", konst ? " constant" : "");
    check_case(&c, label, 0, 0, 1);
    cn_free(&c);
}

static void test_gather_axis(void)
{
    int64_t one = 1, i1[1] = {5}, i2[2] = {3, 4};
    for (int s = 0; s < N_SIZES; s++) {
        int64_t h = sizes[s], bth[3] = {2, 9, h}, d4[4] = {3, 2, 11, h};
        gather_axis_case(KILN_DTYPE_F32, 3, bth, 1, 0, &one, false, true);  /* x[:, t, :] */
        gather_axis_case(KILN_DTYPE_F32, 3, bth, -2, 1, i1, true, false);
        gather_axis_case(KILN_DTYPE_F32, 3, bth, 2, 1, i1, false, false);  /* innermost */
        gather_axis_case(KILN_DTYPE_F32, 4, d4, 2, 2, i2, true, false);
        gather_axis_case(KILN_DTYPE_U8, 4, d4, -1, 2, i2, false, false);
    }
    int64_t big[3] = {64, 40, 300};
    gather_axis_case(KILN_DTYPE_F32, 3, big, 1, 1, i1, false, false); /* threaded */
    /* out of range at run time: an error naming the node, the index and the axis */
    int64_t dd[3] = {2, 10, 4}, di = 2;
    struct case_node c;
    cn_init(&c, KILN_OP_Gather, 13, 2, 1);
    attr_int(&c, "axis", 1);
    kiln_tensor *data = tensor_f32(3, dd), *idx;
    if (kiln_tensor_new(KILN_DTYPE_I64, 1, &di, &idx) != KILN_OK) abort();
    ((int64_t *)idx->data)[0] = -10;
    ((int64_t *)idx->data)[1] = 10;
    cn_input(&c, 0, data, false);
    cn_input(&c, 1, idx, false);
    kiln_tensor *out[MAX_IO];
    for (int lv = 0; lv < isa_levels(); lv++) {
        bool handled;
        kiln_status st = run_fast(&c, isa_names[lv], 1, &handled, NULL, out);
        CHECK(handled && st == KILN_ERR_INVALID_ARGUMENT, "Gather axis 1 out of range: status %d",
              st);
        CHECK(strstr(kiln_last_error(), "node_under_test") && strstr(kiln_last_error(), "dim 1"),
              "Gather axis 1 error message: %s", kiln_last_error());
        free_outs(out, 1);
    }
    cn_free(&c);
}

/* Slice of a float32 tensor by constant arguments (simd/slice.c, plain layout here;
 * the blocked layouts are compared in tests/python/test_layout.py). */
static kiln_tensor *ints_i64(int n, const int64_t *v)
{
    int64_t d = n;
    kiln_tensor *t;
    if (kiln_tensor_new(KILN_DTYPE_I64, 1, &d, &t) != KILN_OK) abort();
    memcpy(t->data, v, sizeof(int64_t) * (size_t)n);
    return t;
}

static void slice_case_r(int rank, const int64_t *dims, int n, const int64_t *starts,
                         const int64_t *ends, const int64_t *axes, const int64_t *steps,
                         const char *what)
{
    struct case_node c;
    cn_init(&c, KILN_OP_Slice, 13, steps ? 5 : 4, 1);
    kiln_tensor *x = tensor_f32(rank, dims);
    for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal();
    cn_input(&c, 0, x, false);
    cn_input(&c, 1, ints_i64(n, starts), true);
    cn_input(&c, 2, ints_i64(n, ends), true);
    cn_input(&c, 3, ints_i64(n, axes), true);
    if (steps) cn_input(&c, 4, ints_i64(n, steps), true);
    char label[128];
    snprintf(label, sizeof label, "Slice %d-D %s", rank, what);
    check_case(&c, label, 0, 0, 1);
    cn_free(&c);
}

static void slice_case(const int64_t *dims, int n, const int64_t *starts, const int64_t *ends,
                       const int64_t *axes, const int64_t *steps, const char *what)
{
    slice_case_r(4, dims, n, starts, ends, axes, steps, what);
}

static void test_slice(void)
{
    int64_t d[4] = {2, 37, 9, 11}, one[4] = {1, 1, 1, 1};
    slice_case(d, 1, (int64_t[]){5}, (int64_t[]){29}, (int64_t[]){1}, NULL, "channels");
    slice_case(d, 2, (int64_t[]){-1, 1}, (int64_t[]){-100, 8}, (int64_t[]){3, 2},
               (int64_t[]){-2, 3}, "columns backwards, rows stepped");
    slice_case(d, 3, (int64_t[]){36, 0, 0}, (int64_t[]){0, 9, 11}, (int64_t[]){1, -2, -1},
               (int64_t[]){-5, 1, 1}, "channels backwards");
    slice_case(d, 1, (int64_t[]){20}, (int64_t[]){10}, (int64_t[]){1}, NULL, "empty");
    slice_case(one, 1, (int64_t[]){0}, (int64_t[]){INT64_MAX}, (int64_t[]){3}, NULL, "1x1x1x1");
    /* ranks 1 to 3 (plain, as 4-D with leading 1s): a 1-D convolution's time axis (the
     * causal trim TCNs export, when no Conv precedes it), the batch, every axis at once */
    int64_t d3[3] = {8, 64, 130}, e3[3] = {3, 17, 9}, d2[2] = {6, 33}, d1[1] = {1000};
    slice_case_r(3, d3, 1, (int64_t[]){0}, (int64_t[]){128}, (int64_t[]){2}, NULL, "time trim");
    slice_case_r(3, d3, 1, (int64_t[]){-2}, (int64_t[]){INT64_MAX}, (int64_t[]){-1}, NULL,
                 "last 2 steps");
    slice_case_r(3, e3, 1, (int64_t[]){1}, (int64_t[]){3}, (int64_t[]){0}, NULL, "batch");
    slice_case_r(3, e3, 3, (int64_t[]){2, -1, 1}, (int64_t[]){-100, 2, 8},
                 (int64_t[]){0, 1, 2}, (int64_t[]){-1, -3, 2}, "every axis, steps");
    slice_case_r(2, d2, 2, (int64_t[]){1, 30}, (int64_t[]){5, 3}, (int64_t[]){0, 1},
                 (int64_t[]){2, -4}, "rows and columns");
    slice_case_r(1, d1, 1, (int64_t[]){7}, (int64_t[]){-7}, (int64_t[]){0},
                 (int64_t[]){3}, "stepped");
    slice_case_r(3, e3, 1, (int64_t[]){5}, (int64_t[]){5}, (int64_t[]){1}, NULL, "empty");
}

/* Pad of a 4-D float32 tensor on H and W (simd/pad.c, plain layout here; blocked in
 * tests/python/test_layout.py); other pads fall to the reference. */
static void pad_case(const int64_t *dims, const int64_t *pads, float fill, int opset, int handled,
                     const char *what)
{
    struct case_node c;
    cn_init(&c, KILN_OP_Pad, opset, opset >= 11 ? 3 : 1, 1);
    kiln_tensor *x = tensor_f32(4, dims);
    for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal();
    cn_input(&c, 0, x, false);
    if (opset >= 11) {
        int64_t one = 1;
        kiln_tensor *v;
        if (kiln_tensor_new(KILN_DTYPE_F32, 0, &one, &v) != KILN_OK) abort();
        ((float *)v->data)[0] = fill;
        cn_input(&c, 1, ints_i64(8, pads), true);
        cn_input(&c, 2, v, true);
    } else {
        attr_ints(&c, "pads", pads, 8);
        attr_float(&c, "value", fill);
    }
    char label[128];
    snprintf(label, sizeof label, "Pad 4-D %s opset %d", what, opset);
    check_case(&c, label, 0, 0, handled);
    cn_free(&c);
}

static void test_pad(void)
{
    int64_t d[4] = {2, 19, 7, 9}, one[4] = {1, 1, 1, 1};
    pad_case(d, (int64_t[]){0, 0, 1, 2, 0, 0, 3, 0}, 0.0f, 13, 1, "top left bottom");
    pad_case(d, (int64_t[]){0, 0, 0, 0, 0, 0, 0, 0}, 0.0f, 13, 1, "nothing");
    pad_case(one, (int64_t[]){0, 0, 2, 2, 0, 0, 2, 2}, -1.5f, 13, 1, "1x1 by 2, fill -1.5");
    pad_case(d, (int64_t[]){0, 0, 1, 1, 0, 0, 1, 1}, 2.0f, 2, 1, "attributes");
    pad_case(d, (int64_t[]){0, 1, 0, 0, 0, 0, 0, 0}, 0.0f, 13, 1, "channels (pad_nd)");
    pad_case(d, (int64_t[]){0, 0, -1, 0, 0, 0, 0, 0}, 0.0f, 13, 1, "negative (pad_nd)");
}

/* The general Pad (pad_nd.c): dtype dt, pads (2 per axis of `axes`, or of every dim
 * when n_axes is 0), mode, the constant as a float (converted to dt) or none; pads
 * and axes constant unless run_time. */
static void pad_nd_case(kiln_dtype dt, int rank, const int64_t *dims, const int64_t *pads,
                        int n_axes, const int64_t *axes, const char *mode, const float *fill,
                        bool run_time, int handled, const char *what)
{
    struct case_node c;
    cn_init(&c, KILN_OP_Pad, 19, n_axes ? 4 : 3, 1);
    attr_str(&c, "mode", mode);
    kiln_tensor *x;
    if (kiln_tensor_new(dt, rank, dims, &x) != KILN_OK) abort();
    size_t es = kiln_dtype_size(dt), count = es ? x->nbytes / es : 0;
    for (size_t i = 0; i < count; i++) {
        if (dt == KILN_DTYPE_F32) ((float *)x->data)[i] = rng_normal();
        else if (dt == KILN_DTYPE_I64) ((int64_t *)x->data)[i] = (int64_t)(rng_next() % 2001) - 1000;
        else if (dt == KILN_DTYPE_U8) ((uint8_t *)x->data)[i] = (uint8_t)rng_next();
        else if (dt == KILN_DTYPE_F16) ((uint16_t *)x->data)[i] = (uint16_t)(0x3c00 + rng_next() % 1024);
    }
    cn_input(&c, 0, x, false);
    int np = 2 * (n_axes ? n_axes : rank);
    cn_input(&c, 1, ints_i64(np, pads), !run_time);
    kiln_tensor *v = NULL;
    if (fill) {
        int64_t one = 1;
        if (kiln_tensor_new(dt, 0, &one, &v) != KILN_OK) abort();
        if (dt == KILN_DTYPE_F32) ((float *)v->data)[0] = *fill;
        else if (dt == KILN_DTYPE_I64) ((int64_t *)v->data)[0] = (int64_t)*fill;
        else if (dt == KILN_DTYPE_U8) ((uint8_t *)v->data)[0] = (uint8_t)*fill;
        else if (dt == KILN_DTYPE_F16) ((uint16_t *)v->data)[0] = 0xc000; /* -2 */
    }
    cn_input(&c, 2, v, true);
    if (n_axes) cn_input(&c, 3, ints_i64(n_axes, axes), true);
    char label[160], sd[64];
    snprintf(label, sizeof label, "Pad %s %s %s: %s", kiln_dtype_name(dt),
             kiln_shape_str(rank, dims, sd, 64), mode, what);
    check_case(&c, label, 0, 0, handled);
    cn_free(&c);
}

static void test_pad_nd(void)
{
    const float zero = 0.0f, minus = -1.25f, seven = 7.0f;
    /* Swin's NHWC Pad of H and W (axes 1, 2), by pads and by the axes input */
    int64_t nhwc[4] = {1, 16, 16, 96}, ax12[2] = {1, 2};
    pad_nd_case(KILN_DTYPE_F32, 4, nhwc, (int64_t[]){0, 0, 0, 0, 0, 5, 5, 0}, 0, NULL, "constant",
                &zero, false, 1, "NHWC bottom right");
    pad_nd_case(KILN_DTYPE_F32, 4, nhwc, (int64_t[]){1, 2, 4, 3}, 2, ax12, "constant", &minus,
                false, 1, "axes 1, 2, fill -1.25");
    pad_nd_case(KILN_DTYPE_F32, 4, nhwc, (int64_t[]){0, 5, 0, 5}, 2, (int64_t[]){-3, -2},
                "constant", NULL, false, 1, "negative axes, no constant");
    /* odd sizes, ranks 1, 3, 5; crops; every dim padded */
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s], d1[1] = {n}, d3[3] = {2, n, 3}, d5[5] = {2, 1, 3, n, 2};
        pad_nd_case(KILN_DTYPE_F32, 1, d1, (int64_t[]){3, 1}, 0, NULL, "constant", &seven, false,
                    1, "1-D");
        pad_nd_case(KILN_DTYPE_F32, 3, d3, (int64_t[]){1, 0, 2, 0, 3, 1}, 0, NULL, "constant",
                    &minus, false, 1, "every dim");
        pad_nd_case(KILN_DTYPE_F32, 5, d5, (int64_t[]){0, 1, 0, 0, 0, 0, 0, 1, 2, 0}, 0, NULL,
                    "constant", &zero, false, 1, "5-D");
        pad_nd_case(KILN_DTYPE_F32, 3, d3, (int64_t[]){0, -1, 0, 0, 2, -1}, 0, NULL, "constant",
                    &zero, false, 1, "crop and pad");
        pad_nd_case(KILN_DTYPE_F32, 3, d3, (int64_t[]){0, 2, 1, 1, 3, 2}, 0, NULL, "edge", NULL,
                    false, 1, "edge");
        pad_nd_case(KILN_DTYPE_F32, 3, d3, (int64_t[]){1, 5, 2, 0, 6, 3}, 0, NULL, "reflect", NULL,
                    false, 1, "reflect past the size");
        pad_nd_case(KILN_DTYPE_F32, 3, d3, (int64_t[]){1, 4, 0, 2, 5, 4}, 0, NULL, "wrap", NULL,
                    false, 1, "wrap past the size");
    }
    int64_t d3[3] = {3, 4, 5};
    pad_nd_case(KILN_DTYPE_F32, 3, d3, (int64_t[]){0, -4, 0, 0, 0, 0}, 0, NULL, "constant", &seven,
                false, 1, "cropped to nothing");
    pad_nd_case(KILN_DTYPE_F32, 3, d3, (int64_t[]){0, -1, -1, 0, 2, 1}, 0, NULL, "edge", NULL,
                false, 1, "edge with a crop");
    /* other dtypes: int64, uint8 and float16 (bytes), with and without a constant */
    pad_nd_case(KILN_DTYPE_I64, 3, d3, (int64_t[]){1, 0, 2, 0, 1, 1}, 0, NULL, "constant", &seven,
                false, 1, "int64 fill 7");
    pad_nd_case(KILN_DTYPE_U8, 3, d3, (int64_t[]){0, 3, 0, 1, 0, 2}, 0, NULL, "constant", &seven,
                false, 1, "uint8 fill 7");
    pad_nd_case(KILN_DTYPE_F16, 3, d3, (int64_t[]){0, 1, 1, 0, 1, 1}, 0, NULL, "constant", &zero,
                false, 1, "float16 fill -2");
    pad_nd_case(KILN_DTYPE_U8, 3, d3, (int64_t[]){2, 0, 0, 0, 0, 3}, 0, NULL, "reflect", NULL,
                false, 1, "uint8 reflect");
    /* threaded: rows of a larger NHWC tensor */
    int64_t big[4] = {4, 60, 60, 32};
    pad_nd_case(KILN_DTYPE_F32, 4, big, (int64_t[]){0, 3, 0, 0, 0, 0, 4, 0}, 0, NULL, "constant",
                &minus, false, 1, "threaded");
    /* declined: pads known only at run time */
    pad_nd_case(KILN_DTYPE_F32, 3, d3, (int64_t[]){1, 0, 2, 0, 1, 1}, 0, NULL, "constant", &zero,
                true, 0, "run-time pads (reference)");
}

/* Gather of channels (axis 1) by constant indices (simd/data.c through gather4.h). */
static void test_gather_channels(void)
{
    int64_t d[4] = {2, 21, 5, 7};
    const int64_t idx[] = {20, 0, 0, -1, 17, 16, 5, -21, 9};
    for (int konst = 0; konst < 2; konst++) {
        struct case_node c;
        cn_init(&c, KILN_OP_Gather, 13, 2, 1);
        attr_int(&c, "axis", 1);
        kiln_tensor *x = tensor_f32(4, d);
        for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal();
        cn_input(&c, 0, x, false);
        cn_input(&c, 1, ints_i64(9, idx), konst);
        /* constant indices run the channel gather; run-time indices gather_axis */
        check_case(&c, konst ? "Gather channels" : "Gather channels, indices at run time", 0, 0,
                   1);
        cn_free(&c);
    }
}

static void transpose_case(kiln_dtype dt, int rank, const int64_t *dims, const int64_t *perm)
{
    struct case_node c;
    cn_init(&c, KILN_OP_Transpose, 13, 1, 1);
    if (perm) attr_ints(&c, "perm", perm, rank);
    kiln_tensor *x;
    if (kiln_tensor_new(dt, rank, dims, &x) != KILN_OK) abort();
    uint8_t *p = x->data;
    for (size_t i = 0; i < x->nbytes; i++) p[i] = (uint8_t)rng_next();
    if (dt == KILN_DTYPE_F32) /* keep f32 values finite so compare_f32 is exact */
        for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal();
    cn_input(&c, 0, x, false);
    char label[128], sd[64];
    snprintf(label, sizeof label, "Transpose %s %s perm %s", kiln_dtype_name(dt),
             kiln_shape_str(rank, dims, sd, 64), perm ? "given" : "reversed");
    check_case(&c, label, 0, 0, 1);
    cn_free(&c);
}

/* DepthToSpace (mode DCR or CRD) or SpaceToDepth (mode NULL) of x [dims] by b. */
static void depth_space_case(enum kiln_op op, kiln_dtype dt, const int64_t *dims, int64_t b,
                             const char *mode)
{
    struct case_node c;
    cn_init(&c, op, 13, 1, 1);
    attr_int(&c, "blocksize", b);
    if (mode) attr_str(&c, "mode", mode);
    kiln_tensor *x;
    if (kiln_tensor_new(dt, 4, dims, &x) != KILN_OK) abort();
    for (int64_t i = 0; i < kiln_tensor_count(x); i++)
        if (dt == KILN_DTYPE_F32) ((float *)x->data)[i] = rng_normal();
        else kiln_set_i64(dt, x->data, i, (int64_t)(rng_next() % 100000));
    cn_input(&c, 0, x, false);
    char label[128], sd[64];
    snprintf(label, sizeof label, "%s %s %s b%lld %s", kiln_op_name(op), kiln_dtype_name(dt),
             kiln_shape_str(4, dims, sd, 64), (long long)b, mode ? mode : "");
    check_case(&c, label, 0, 0, 1);
    cn_free(&c);
}

static void test_depth_space(void)
{
    /* ESPCN's PixelShuffle (9 channels, b 3), a wide one for two threads, CRD, int32 */
    depth_space_case(KILN_OP_DepthToSpace, KILN_DTYPE_F32, (int64_t[]){1, 9, 7, 11}, 3, NULL);
    depth_space_case(KILN_OP_DepthToSpace, KILN_DTYPE_F32, (int64_t[]){2, 8, 5, 6}, 2, "DCR");
    depth_space_case(KILN_OP_DepthToSpace, KILN_DTYPE_F32, (int64_t[]){2, 12, 5, 6}, 2, "CRD");
    depth_space_case(KILN_OP_DepthToSpace, KILN_DTYPE_F32, (int64_t[]){2, 64, 40, 50}, 4, "CRD");
    depth_space_case(KILN_OP_DepthToSpace, KILN_DTYPE_I32, (int64_t[]){1, 18, 3, 4}, 3, "DCR");
    depth_space_case(KILN_OP_DepthToSpace, KILN_DTYPE_F32, (int64_t[]){1, 5, 3, 4}, 1, NULL);
    depth_space_case(KILN_OP_SpaceToDepth, KILN_DTYPE_F32, (int64_t[]){2, 3, 6, 8}, 2, NULL);
    depth_space_case(KILN_OP_SpaceToDepth, KILN_DTYPE_F32, (int64_t[]){1, 4, 9, 12}, 3, NULL);
    depth_space_case(KILN_OP_SpaceToDepth, KILN_DTYPE_I32, (int64_t[]){2, 16, 64, 48}, 4, NULL);
}

static void test_transpose(void)
{
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s];
        int64_t d2[2] = {n, 37}, p2[2] = {1, 0};
        int64_t d4[4] = {2, n, 3, 8}, p4[4] = {0, 2, 1, 3};
        int64_t d3[3] = {3, 33, n}, p3[3] = {0, 2, 1};
        int64_t d4b[4] = {2, 3, 4, n}, p4b[4] = {3, 1, 0, 2};
        int64_t d3c[3] = {4, 1, n}, p3c[3] = {2, 0, 1};
        transpose_case(KILN_DTYPE_F32, 2, d2, p2);
        transpose_case(KILN_DTYPE_F32, 4, d4, p4);
        transpose_case(KILN_DTYPE_F32, 3, d3, p3);
        transpose_case(KILN_DTYPE_F32, 4, d4b, p4b);
        transpose_case(KILN_DTYPE_F32, 3, d3c, p3c);
        transpose_case(KILN_DTYPE_I64, 3, d3, p3);
        transpose_case(KILN_DTYPE_U8, 4, d4b, p4b);
        transpose_case(KILN_DTYPE_F16, 3, d3, NULL);
    }
    int64_t bert[4] = {8, 128, 12, 64}, pb[4] = {0, 2, 1, 3}, big[2] = {700, 900}, p2[2] = {1, 0};
    transpose_case(KILN_DTYPE_F32, 4, bert, pb);
    transpose_case(KILN_DTYPE_F32, 2, big, p2);
}


/* Concat of inputs that differ along axis (sizes[k]), any fixed-size dtype (simd/concat.c,
 * plain layout here; blocked in tests/python/test_layout.py). */
static void concat_case(kiln_dtype dt, int rank, const int64_t *dims, int n_in,
                        const int64_t *along, int64_t axis, const char *what)
{
    struct case_node c;
    cn_init(&c, KILN_OP_Concat, 13, n_in, 1);
    attr_int(&c, "axis", axis);
    int a = (int)(axis < 0 ? axis + rank : axis);
    for (int k = 0; k < n_in; k++) {
        int64_t d[KILN_MAX_RANK];
        memcpy(d, dims, sizeof(int64_t) * (size_t)rank);
        d[a] = along[k];
        kiln_tensor *x;
        if (kiln_tensor_new(dt, rank, d, &x) != KILN_OK) abort();
        uint8_t *p = x->data;
        for (size_t i = 0; i < x->nbytes; i++) p[i] = (uint8_t)rng_next();
        if (dt == KILN_DTYPE_F32)
            for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal();
        cn_input(&c, k, x, false);
    }
    char label[128], sd[64];
    snprintf(label, sizeof label, "Concat %s %s axis %lld %s", kiln_dtype_name(dt),
             kiln_shape_str(rank, dims, sd, 64), (long long)axis, what);
    check_case(&c, label, 0, 0, 1);
    cn_free(&c);
}

static void test_concat(void)
{
    /* the axis's entry of dims is replaced by each input's size along it */
    int64_t d4[4] = {2, 6, 5, 7}, d2[2] = {3, 5}, d3[3] = {3, 4, 6}, d1 = 1, big[4] = {4, 32, 64, 64};
    concat_case(KILN_DTYPE_F32, 4, d4, 3, (int64_t[]){3, 5, 8}, 1, "channels");
    concat_case(KILN_DTYPE_F32, 4, d4, 2, (int64_t[]){1, 2}, 0, "batch");
    concat_case(KILN_DTYPE_F32, 4, d4, 2, (int64_t[]){4, 9}, -1, "columns, negative axis");
    concat_case(KILN_DTYPE_F32, 2, d2, 3, (int64_t[]){7, 1, 33}, 1, "rows");
    concat_case(KILN_DTYPE_I64, 3, d3, 2, (int64_t[]){2, 3}, 0, "leading");
    concat_case(KILN_DTYPE_U8, 1, &d1, 4, (int64_t[]){1, 15, 16, 17}, 0, "bytes");
    concat_case(KILN_DTYPE_F16, 3, d3, 2, (int64_t[]){5, 1}, 0, "halves");
    concat_case(KILN_DTYPE_BOOL, 2, d2, 2, (int64_t[]){3, 3}, -1, "bool");
    concat_case(KILN_DTYPE_F32, 4, d4, 1, (int64_t[]){6}, 1, "one input");
    concat_case(KILN_DTYPE_F32, 4, big, 2, (int64_t[]){32, 48}, 1, "threaded");
}

/* ---- Reductions (reduce.def) ---- */

/* special: every 7th value NaN, +inf or -inf in turn (Max / Min must keep a NaN anywhere) */
static void reduce_case_x(enum kiln_op op, int rank, const int64_t *dims, const int64_t *axes,
                          int n_axes, bool axes_input, int keepdims, int expect, bool special)
{
    struct case_node c;
    cn_init(&c, op, axes_input ? 18 : 13, axes_input ? 2 : 1, 1);
    attr_int(&c, "keepdims", keepdims);
    if (!axes_input && n_axes > 0) attr_ints(&c, "axes", axes, n_axes);
    kiln_tensor *x = tensor_f32(rank, dims);
    for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal() + 0.5f;
    /* ReduceLogSum on positive values, its domain: a sum that cancels to near 0 makes its
     * log as uncertain as the float sum's last bits (the reference sums in double) */
    for (size_t i = 0; op == KILN_OP_ReduceLogSum && i < x->nbytes / 4; i++)
        ((float *)x->data)[i] = fabsf(((float *)x->data)[i]) + 0.01f;
    static const float sp[3] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 3; special && i < x->nbytes / 4; i += 7) ((float *)x->data)[i] = sp[i / 7 % 3];
    cn_input(&c, 0, x, false);
    if (axes_input) {
        int64_t na = n_axes;
        kiln_tensor *a;
        if (kiln_tensor_new(KILN_DTYPE_I64, 1, &na, &a) != KILN_OK) abort();
        memcpy(a->data, axes, sizeof(int64_t) * (size_t)n_axes);
        cn_input(&c, 1, a, true);
    }
    char label[128], sd[64];
    snprintf(label, sizeof label, "%s %s %d axes%s keepdims %d%s", kiln_op_name(op),
             kiln_shape_str(rank, dims, sd, 64), n_axes, axes_input ? " (input)" : "", keepdims,
             special ? " nan/inf" : "");
    check_case(&c, label, 1e-5, 1e-5, expect);
    cn_free(&c);
}

static void reduce_case(enum kiln_op op, int rank, const int64_t *dims, const int64_t *axes,
                        int n_axes, bool axes_input, int keepdims, int expect)
{
    reduce_case_x(op, rank, dims, axes, n_axes, axes_input, keepdims, expect, false);
}

static void test_reduce(void)
{
    const enum kiln_op ops[] = {KILN_OP_ReduceMean,      KILN_OP_ReduceSum, KILN_OP_ReduceMax,
                                KILN_OP_ReduceMin,       KILN_OP_ReduceSumSquare,
                                KILN_OP_ReduceL1,        KILN_OP_ReduceL2,
                                KILN_OP_ReduceLogSum};
    const int n_ops = (int)(sizeof ops / sizeof ops[0]);
    for (int o = 0; o < n_ops; o++)
        for (int s = 0; s < N_SIZES; s++) {
            int64_t n = sizes[s], d[3] = {2, 5, n}, last = -1, two[2] = {1, 2}, first = 0,
                    mid = 1, d4[4] = {3, 4, 2, n}, mid2[2] = {1, 2};
            reduce_case(ops[o], 3, d, &last, 1, false, 1, 1);
            reduce_case(ops[o], 3, d, &last, 1, true, 0, 1);
            reduce_case(ops[o], 3, d, two, 2, true, 1, 1);
            reduce_case(ops[o], 3, d, NULL, 0, false, 0, 1); /* all axes */
            reduce_case(ops[o], 3, d, &first, 1, false, 1, 1); /* leading axis: rows of 5n */
            reduce_case(ops[o], 3, d, &mid, 1, false, 1, 1);   /* middle axis (embedding bags) */
            reduce_case(ops[o], 3, d, &mid, 1, true, 0, 1);
            reduce_case(ops[o], 4, d4, mid2, 2, true, 1, 1);   /* two middle axes */
            /* axes that are not one run: one pass per run, innermost first */
            int64_t split[2] = {0, 2}, d5[4] = {2, 3, 4, n}, ax13[2] = {1, 3};
            int64_t ax013[3] = {0, 1, 3}, ax02[2] = {0, 2};
            reduce_case(ops[o], 3, d, split, 2, false, 1, 1);
            reduce_case(ops[o], 4, d5, ax13, 2, true, 0, 1);
            reduce_case(ops[o], 4, d5, ax013, 3, false, 1, 1);
            reduce_case(ops[o], 4, d5, ax02, 2, false, 0, 1);
        }
    /* size-1 reduced dims only: groups of one element */
    int64_t ones[3] = {4, 1, 9}, ax1 = 1;
    for (int o = 0; o < n_ops; o++) reduce_case(ops[o], 3, ones, &ax1, 1, false, 1, 1);
    int64_t big[2] = {512, 768}, last = -1;
    reduce_case(KILN_OP_ReduceMean, 2, big, &last, 1, false, 1, 1);
    for (int o = 2; o < 4; o++)
        for (int s = 0; s < N_SIZES; s++) {
            int64_t n = sizes[s], d[3] = {2, 5, n}, mid = 1;
            reduce_case_x(ops[o], 3, d, &last, 1, false, 1, 1, true);
            reduce_case_x(ops[o], 3, d, &mid, 1, false, 1, 1, true);
        }
}

/* ---- Convolutions (dnnl/conv.def) ---- */

/* Conv or KilnFusedConv (act: its activation, NULL = none) of x [N,C,H,W] by constant
 * weights [M,C/group,kh,kw], optional bias and (fused) residual Sum; pads on all sides. */
static void conv_case(bool fused, const int64_t *xd, const int64_t *wd, int64_t group,
                      int64_t pad, bool bias, bool sum, const char *act, const char *what)
{
    struct case_node c;
    cn_init(&c, fused ? KILN_OP_KilnFusedConv : KILN_OP_Conv, 13, sum ? 4 : bias ? 3 : 2, 1);
    attr_int(&c, "group", group);
    int64_t pads[4] = {pad, pad, pad, pad};
    attr_ints(&c, "pads", pads, 4);
    if (act) attr_str(&c, "activation", act);
    kiln_tensor *x = tensor_f32(4, xd), *w = tensor_f32(4, wd);
    for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal();
    for (size_t i = 0; i < w->nbytes / 4; i++) ((float *)w->data)[i] = rng_normal() * 0.3f;
    cn_input(&c, 0, x, false);
    cn_input(&c, 1, w, true);
    if (bias || sum) {
        kiln_tensor *b = bias ? tensor_f32(1, wd) : NULL;
        for (size_t i = 0; b && i < b->nbytes / 4; i++) ((float *)b->data)[i] = rng_normal();
        cn_input(&c, 2, b, true);
    }
    if (sum) {
        int64_t yd[4] = {xd[0], wd[0], xd[2] + 2 * pad - wd[2] + 1, xd[3] + 2 * pad - wd[3] + 1};
        kiln_tensor *s = tensor_f32(4, yd);
        for (size_t i = 0; i < s->nbytes / 4; i++) ((float *)s->data)[i] = rng_normal();
        cn_input(&c, 3, s, false);
    }
    char label[160], sx[64], sw[64];
    snprintf(label, sizeof label, "%s %s * %s group %lld pad %lld%s%s%s%s %s",
             fused ? "KilnFusedConv" : "Conv", kiln_shape_str(4, xd, sx, 64),
             kiln_shape_str(4, wd, sw, 64), (long long)group, (long long)pad, bias ? " bias" : "",
             sum ? " sum" : "", act ? " " : "", act ? act : "", what);
    check_case(&c, label, 1e-4, 1e-4, 1);
    cn_free(&c);
}

/* A 1-D Conv or KilnFusedConv: x [N,C,L] * w [M,C/group,k], dilation dil, stride st, pads
 * pb at the start and pe at the end (causal: pb = dil * (k - 1), pe = 0). */
static void conv1d_case(bool fused, const int64_t *xd, const int64_t *wd, int64_t group,
                        int64_t dil, int64_t st, int64_t pb, int64_t pe, bool bias, bool sum,
                        const char *act)
{
    struct case_node c;
    cn_init(&c, fused ? KILN_OP_KilnFusedConv : KILN_OP_Conv, 13, sum ? 4 : bias ? 3 : 2, 1);
    attr_int(&c, "group", group);
    int64_t pads[2] = {pb, pe};
    attr_ints(&c, "pads", pads, 2);
    attr_ints(&c, "dilations", &dil, 1);
    attr_ints(&c, "strides", &st, 1);
    if (act) attr_str(&c, "activation", act);
    kiln_tensor *x = tensor_f32(3, xd), *w = tensor_f32(3, wd);
    for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal();
    for (size_t i = 0; i < w->nbytes / 4; i++) ((float *)w->data)[i] = rng_normal() * 0.3f;
    cn_input(&c, 0, x, false);
    cn_input(&c, 1, w, true);
    if (bias || sum) {
        kiln_tensor *b = bias ? tensor_f32(1, wd) : NULL;
        for (size_t i = 0; b && i < b->nbytes / 4; i++) ((float *)b->data)[i] = rng_normal();
        cn_input(&c, 2, b, true);
    }
    if (sum) {
        int64_t yd[3] = {xd[0], wd[0], (xd[2] + pb + pe - dil * (wd[2] - 1) - 1) / st + 1};
        kiln_tensor *s = tensor_f32(3, yd);
        for (size_t i = 0; i < s->nbytes / 4; i++) ((float *)s->data)[i] = rng_normal();
        cn_input(&c, 3, s, false);
    }
    char label[160], sx[64], sw[64];
    snprintf(label, sizeof label,
             "%s 1-D %s * %s group %lld dilation %lld stride %lld pads %lld,%lld%s%s%s%s",
             fused ? "KilnFusedConv" : "Conv", kiln_shape_str(3, xd, sx, 64),
             kiln_shape_str(3, wd, sw, 64), (long long)group, (long long)dil, (long long)st,
             (long long)pb, (long long)pe, bias ? " bias" : "", sum ? " sum" : "",
             act ? " " : "", act ? act : "");
    check_case(&c, label, 1e-4, 1e-4, 1);
    cn_free(&c);
}

/* 1-D convolutions: a TCN's causal dilated ones (batch 1 and 8, dilations 1 to 8, the
 * residual Sum and Relu fused), symmetric, strided and grouped ones, a 1x1 with a Sum (the
 * TCN's skip path), and a per-channel scale (a standalone BatchNormalization on a
 * sequence becomes one: opt/conv_bn.c). */
static void conv1d_cases(bool fused)
{
    const char *act = fused ? "Relu" : NULL;
    for (int64_t dil = 1; dil <= 8; dil *= 2)
        conv1d_case(fused, (int64_t[]){dil == 4 ? 8 : 1, 64, 128}, (int64_t[]){64, 64, 3}, 1,
                    dil, 1, 2 * dil, 0, true, fused, act);
    conv1d_case(fused, (int64_t[]){2, 8, 37}, (int64_t[]){16, 8, 3}, 1, 2, 1, 2, 2, true,
                false, act);
    conv1d_case(fused, (int64_t[]){3, 5, 50}, (int64_t[]){7, 5, 5}, 1, 3, 2, 1, 3, false, fused,
                act);
    conv1d_case(fused, (int64_t[]){2, 12, 20}, (int64_t[]){6, 4, 3}, 3, 2, 1, 2, 2, true, false,
                act);
    conv1d_case(fused, (int64_t[]){8, 8, 128}, (int64_t[]){64, 8, 1}, 1, 1, 1, 0, 0, true, fused,
                act);
    conv1d_case(fused, (int64_t[]){2, 16, 33}, (int64_t[]){16, 1, 1}, 16, 1, 1, 0, 0, true,
                false, act);
}

static void conv_cases(bool fused)
{
    conv1d_cases(fused);
    const char *act = fused ? "Relu" : NULL;
    /* 1x1 images: Kiln's matrix-vector kernel (squeeze-excitation) */
    conv_case(fused, (int64_t[]){2, 24, 1, 1}, (int64_t[]){8, 24, 1, 1}, 1, 0, true, false, act,
              "1x1 image");
    conv_case(fused, (int64_t[]){3, 5, 1, 1}, (int64_t[]){7, 5, 1, 1}, 1, 0, false, false, act,
              "1x1 image, no bias");
    if (fused)
        conv_case(fused, (int64_t[]){1, 40, 1, 1}, (int64_t[]){10, 40, 1, 1}, 1, 0, true, false,
                  "Sigmoid", "1x1 image");
    /* up to 16 images on the skinny kernel's panels (outputs over two panels, a tail); more
     * on the register-tiled GEMM */
    conv_case(fused, (int64_t[]){2, 96, 1, 1}, (int64_t[]){50, 96, 1, 1}, 1, 0, true, false, act,
              "1x1 image, 50 outputs");
    conv_case(fused, (int64_t[]){13, 24, 1, 1}, (int64_t[]){30, 24, 1, 1}, 1, 0, true, false, act,
              "13 1x1 images"); /* the skinny kernel's rows past its matmul use: 8 + 4 + 1 */
    conv_case(fused, (int64_t[]){20, 24, 1, 1}, (int64_t[]){30, 24, 1, 1}, 1, 0, true, false, act,
              "20 1x1 images");
    /* up to 7 (and 9) output channels, stride 1, plain: Kiln's direct kernel (tails of the two
     * pixel vectors, 1 to 7 channels in blocks of 4, a 9x9 window, dilation) */
    conv_case(fused, (int64_t[]){1, 5, 20, 23}, (int64_t[]){3, 5, 9, 9}, 1, 4, true, false, act,
              "9x9 to 3 channels");
    conv_case(fused, (int64_t[]){2, 4, 9, 40}, (int64_t[]){7, 4, 3, 3}, 1, 1, false, false, act,
              "3x3 to 7 channels");
    conv_case(fused, (int64_t[]){3, 2, 6, 5}, (int64_t[]){1, 2, 3, 3}, 1, 0, true, false, act,
              "3x3 to 1 channel, no pads");
    if (fused)
        conv_case(fused, (int64_t[]){1, 3, 17, 33}, (int64_t[]){5, 3, 5, 5}, 1, 2, true, false,
                  "Tanh", "5x5 to 5 channels");
    conv_case(fused, (int64_t[]){2, 6, 11, 21}, (int64_t[]){9, 6, 3, 3}, 1, 1, true, false, act,
              "3x3 to 9 channels (4 + 4 + 1)");
    /* Tanh and GeluTanh: below AVX-512 applied by Kiln after oneDNN's convolution
     * (kd_deferred_activation), blocked padding lanes included */
    if (fused) {
        conv_case(fused, (int64_t[]){1, 1, 12, 13}, (int64_t[]){16, 1, 5, 5}, 1, 2, true, false,
                  "Tanh", "5x5 of one channel to 16");
        conv_case(fused, (int64_t[]){2, 8, 7, 7}, (int64_t[]){12, 8, 3, 3}, 1, 1, true, true,
                  "Tanh", "residual");
        conv_case(fused, (int64_t[]){1, 8, 9, 9}, (int64_t[]){16, 8, 3, 3}, 1, 1, false, false,
                  "GeluTanh", "3x3");
        for (int b = 8; b <= 16; b += 8) { /* as the layout pass stores them */
            case_layout = b;
            conv_case(fused, (int64_t[]){1, 1, 12, 13}, (int64_t[]){12, 1, 5, 5}, 1, 2, true,
                      false, "Tanh", b == 8 ? "blocked by 8" : "blocked by 16");
            conv_case(fused, (int64_t[]){2, 5, 9, 9}, (int64_t[]){20, 5, 3, 3}, 1, 1, true,
                      false, "GeluTanh", b == 8 ? "blocked by 8" : "blocked by 16");
            case_layout = 0;
        }
    }
    /* a 1x1 convolution of one image with few pixels and a large weight: below AVX-512, two
     * oneDNN convolutions over the halves of the output channels (dnnl/conv_split.c), a
     * residual Sum and the activation after it added by Kiln; plain (oneDNN has no 1x1
     * kernel there: the split declines) and blocked as the layout pass stores them. On an
     * AVX-512 CPU the split declines too (oneDNN's 1x1 kernel splits channels there), so these
     * cases run with Kiln's ISA lowered to AVX2 (oneDNN keeps its own) */
    case_isa_cap = "avx2";
    for (int b = 0; b <= 16; b += 8) {
        case_layout = b;
        conv_case(fused, (int64_t[]){1, 256, 2, 2}, (int64_t[]){512, 256, 1, 1}, 1, 0, true, false,
                  act, "1x1 on 2x2, 512 KB weight");
        if (fused && b) { /* (plain with a Sum the family leaves to the reference) */
            conv_case(fused, (int64_t[]){1, 256, 4, 4}, (int64_t[]){512, 256, 1, 1}, 1, 0, true,
                      true, act, "1x1 on 4x4, residual");
            conv_case(fused, (int64_t[]){1, 256, 3, 3}, (int64_t[]){512, 256, 1, 1}, 1, 0, false,
                      false, "Tanh", "1x1 on 3x3, no bias");
            conv_case(fused, (int64_t[]){1, 256, 2, 2}, (int64_t[]){512, 256, 1, 1}, 1, 0, true,
                      true, "Sigmoid", "1x1 on 2x2, residual");
            /* an odd count of channel blocks: halves of 28 and 27 blocks of 8 (of 16: 440
             * is none, the split declines), 14 and 13 of 16 */
            conv_case(fused, (int64_t[]){1, 320, 3, 3}, (int64_t[]){440, 320, 1, 1}, 1, 0, true,
                      true, act, "1x1 on 3x3, 55 blocks of 8, residual");
            conv_case(fused, (int64_t[]){1, 320, 2, 2}, (int64_t[]){432, 320, 1, 1}, 1, 0, true,
                      false, act, "1x1 on 2x2, 27 blocks of 16");
        }
        case_layout = 0;
    }
    case_isa_cap = NULL;
    /* everything else: oneDNN */
    conv_case(fused, (int64_t[]){1, 8, 9, 9}, (int64_t[]){16, 8, 3, 3}, 1, 1, true, false, act,
              "3x3");
    conv_case(fused, (int64_t[]){2, 16, 7, 7}, (int64_t[]){16, 1, 3, 3}, 16, 1, true, false, act,
              "depthwise");
    conv_case(fused, (int64_t[]){2, 6, 5, 5}, (int64_t[]){4, 6, 1, 1}, 1, 0, true, false, act,
              "1x1 on 5x5");
    if (fused)
        conv_case(fused, (int64_t[]){1, 8, 6, 6}, (int64_t[]){8, 8, 3, 3}, 1, 1, true, true, act,
                  "residual");
}

/* ---- Attention, recurrent layers (attention.def) ---- */


/* mask_kind: 0 none, 1 f32 [SQ, mcols], 2 bool [B, 1, SQ, T], 3 causal. */
static void attention_case(bool four_d, int64_t B, int64_t SQ, int64_t T, int64_t HQ, int64_t HK,
                           int64_t E, int mask_kind, int64_t mcols)
{
    struct case_node c;
    cn_init(&c, KILN_OP_Attention, 23, mask_kind == 1 || mask_kind == 2 ? 4 : 3, 1);
    if (!four_d) {
        attr_int(&c, "q_num_heads", HQ);
        attr_int(&c, "kv_num_heads", HK);
    }
    if (mask_kind == 3) attr_int(&c, "is_causal", 1);
    if (E == 16) attr_float(&c, "scale", 0.3f);
    kiln_tensor *t[3];
    for (int i = 0; i < 3; i++) {
        int64_t S = i == 0 ? SQ : T, H = i == 0 ? HQ : HK;
        int64_t d3[3] = {B, S, H * E}, d4[4] = {B, H, S, E};
        t[i] = four_d ? tensor_f32(4, d4) : tensor_f32(3, d3);
        for (size_t k = 0; k < t[i]->nbytes / 4; k++) ((float *)t[i]->data)[k] = rng_normal();
        cn_input(&c, i, t[i], false);
    }
    if (mask_kind == 1) {
        int64_t dm[2] = {SQ, mcols};
        kiln_tensor *m = tensor_f32(2, dm);
        for (size_t k = 0; k < m->nbytes / 4; k++)
            ((float *)m->data)[k] = rng_next() % 5 == 0 ? -INFINITY : rng_uniform(-2, 2);
        for (int64_t r = 0; r < SQ; r++) ((float *)m->data)[r * mcols] = 0.0f; /* no empty row */
        cn_input(&c, 3, m, false);
    } else if (mask_kind == 2) {
        int64_t dm[4] = {B, 1, SQ, T};
        kiln_tensor *m;
        if (kiln_tensor_new(KILN_DTYPE_BOOL, 4, dm, &m) != KILN_OK) abort();
        uint8_t *pm = m->data;
        for (size_t k = 0; k < m->nbytes; k++) pm[k] = rng_next() % 3 != 0;
        for (int64_t r = 0; r < B * SQ; r++) pm[r * T] = 1;
        cn_input(&c, 3, m, false);
    }
    char label[160];
    snprintf(label, sizeof label, "Attention %s B%lld SQ%lld T%lld HQ%lld HK%lld E%lld mask %d",
             four_d ? "4-D" : "3-D", (long long)B, (long long)SQ, (long long)T, (long long)HQ,
             (long long)HK, (long long)E, mask_kind);
    check_case(&c, label, 1e-4, 1e-5, 1);
    cn_free(&c);
}

/* KilnAttention (opt/attention_views.c): Q, K and V read in place from [B, S, N] or [S, B, N]
 * (seq_first) at column offsets (packed: N = 3 * H * E); Y [B, S, .] / [S, B, .] / rows merged.
 * mask_kind: 0 none, 1 [B, 1, 1, T], 2 [SQ, T], 3 [B * H, SQ, T] merged, 4 [B * H, 1, T] merged. */
static void kiln_attention_case(bool seq_first, bool packed, int ysf, int merge, int64_t B,
                                int64_t SQ, int64_t T, int64_t H, int64_t E, int mask_kind)
{
    struct case_node c;
    cn_init(&c, KILN_OP_KilnAttention, 1, mask_kind ? 4 : 3, 1);
    attr_int(&c, "num_heads", H);
    attr_int(&c, "head_size", E);
    attr_int(&c, "v_head_size", E);
    attr_float(&c, "scale", 0.35f);
    attr_int(&c, "seq_first", seq_first);
    attr_int(&c, "y_seq_first", ysf);
    attr_int(&c, "y_merge_rows", merge);
    attr_int(&c, "mask_merged", mask_kind >= 3);
    int64_t N = packed ? 3 * H * E + 5 : H * E;
    static const char *off[3] = {"q_offset", "k_offset", "v_offset"};
    for (int i = 0; i < 3; i++) {
        int64_t S = i == 0 ? SQ : T;
        int64_t d[3] = {seq_first ? S : B, seq_first ? B : S, N};
        kiln_tensor *t = tensor_f32(3, d);
        for (size_t k = 0; k < t->nbytes / 4; k++) ((float *)t->data)[k] = rng_normal();
        cn_input(&c, i, t, false);
        attr_int(&c, off[i], packed ? i * H * E + 1 : 0);
    }
    if (mask_kind) {
        int64_t dm[4][4] = {{B, 1, 1, T}, {SQ, T}, {B * H, SQ, T}, {B * H, 1, T}};
        int rank[4] = {4, 2, 3, 3};
        kiln_tensor *m = tensor_f32(rank[mask_kind - 1], dm[mask_kind - 1]);
        for (size_t k = 0; k < m->nbytes / 4; k++)
            ((float *)m->data)[k] = rng_next() % 5 == 0 ? -INFINITY : rng_uniform(-2, 2);
        for (size_t k = 0; k < m->nbytes / 4; k += (size_t)T) ((float *)m->data)[k] = 0.0f;
        cn_input(&c, 3, m, false);
    }
    char label[160];
    snprintf(label, sizeof label, "KilnAttention sf%d packed%d ysf%d merge%d B%lld SQ%lld T%lld "
             "H%lld E%lld mask %d", seq_first, packed, ysf, merge, (long long)B, (long long)SQ,
             (long long)T, (long long)H, (long long)E, mask_kind);
    check_case(&c, label, 1e-4, 1e-5, 1);
    cn_free(&c);
}

static void test_attention(void)
{
    /* BERT's shape: 64-wide heads, 128 positions, an additive mask (full register tiles) */
    attention_case(false, 1, 128, 128, 2, 2, 64, 1, 128);
    const int64_t seqs[] = {1, 7, 17, 70};
    for (int s = 0; s < 4; s++) {
        int64_t S = seqs[s];
        attention_case(false, 2, S, S, 4, 2, 8, 0, 0);
        attention_case(false, 1, S, S + 3, 4, 4, 16, 1, S + 3);
        attention_case(false, 1, S, S + 3, 2, 1, 8, 1, S);       /* short mask: -inf padding */
        attention_case(false, 2, S, S, 4, 2, 8, 2, 0);
        attention_case(false, 2, S, S, 4, 2, 8, 3, 0);
        attention_case(true, 2, S, S + 1, 4, 2, 8, 0, 0);
    }
    /* declined: softcap */
    struct case_node c;
    cn_init(&c, KILN_OP_Attention, 23, 3, 1);
    attr_float(&c, "softcap", 5.0f);
    int64_t d4[4] = {1, 2, 3, 4};
    for (int i = 0; i < 3; i++) cn_input(&c, i, tensor_f32(4, d4), false);
    check_case(&c, "Attention softcap (declined)", 1e-4, 1e-5, 0);
    cn_free(&c);
    for (int s = 0; s < 4; s++) {
        int64_t S = seqs[s];
        for (int mk = 0; mk <= 4; mk++) {
            kiln_attention_case(mk % 2, mk != 2, mk % 2, 0, 2, S, S, 4, 8, mk);
            kiln_attention_case(mk % 2 == 0, true, 0, 1, 3, S, S + 2, 2, 16, mk == 2 ? 0 : mk);
        }
        kiln_attention_case(true, true, 1, 1, 2, S, S, 1, 32, 0); /* one head */
    }
}

/* ---- Recurrent layers (rnn.c) ---- */

static void attr_strs(struct case_node *c, const char *name, const char *const *v, int n)
{
    struct kiln_attr *a = cn_attr(c, name, KILN_ATTR_STRINGS);
    a->n = n;
    a->strings = kiln_arena_alloc(c->g->mem, sizeof(kiln_string) * (size_t)n);
    for (int i = 0; i < n; i++) {
        a->strings[i].data = kiln_arena_strdup(c->g->mem, v[i]);
        a->strings[i].len = strlen(v[i]);
    }
}
static void attr_floats(struct case_node *c, const char *name, const float *v, int n)
{
    struct kiln_attr *a = cn_attr(c, name, KILN_ATTR_FLOATS);
    a->n = n;
    a->floats = kiln_arena_alloc(c->g->mem, sizeof(float) * (size_t)n);
    memcpy(a->floats, v, sizeof(float) * (size_t)n);
}

static kiln_tensor *rnn_random(int rank, const int64_t *dims, float scale)
{
    kiln_tensor *t = tensor_f32(rank, dims);
    for (size_t k = 0; k < t->nbytes / 4; k++) ((float *)t->data)[k] = scale * rng_uniform(-1, 1);
    return t;
}

enum { RNN_LENS = 1, RNN_INIT = 2, RNN_LAYOUT1 = 4, RNN_PEEP = 8, RNN_YH_ONLY = 16,
       RNN_NO_BIAS = 32, RNN_W_INPUT = 64 };

struct rnn_extra {
    const char *const *acts; /* NULL = the defaults */
    int n_acts;
    const float *alpha, *beta;
    int n_alpha, n_beta;
    float clip;              /* 0 = none */
    int input_forget;
};

/* One RNN / GRU / LSTM node against the reference. gates: 1, 3 or 4. */
static void rnn_case(enum kiln_op op, const char *dir, int lbr, int64_t T, int64_t B, int64_t I,
                     int64_t H, int flags, const struct rnn_extra *x)
{
    const int lstm = op == KILN_OP_LSTM, G = op == KILN_OP_RNN ? 1 : op == KILN_OP_GRU ? 3 : 4;
    const int64_t ND = strcmp(dir, "bidirectional") == 0 ? 2 : 1;
    const int layout = flags & RNN_LAYOUT1 ? 1 : 0;
    int n_in = lstm ? 8 : 6, n_out = lstm ? 3 : 2;
    struct case_node c;
    cn_init(&c, op, 14, n_in, n_out);
    attr_str(&c, "direction", dir);
    attr_int(&c, "hidden_size", H);
    if (layout) attr_int(&c, "layout", 1);
    if (op == KILN_OP_GRU) attr_int(&c, "linear_before_reset", lbr);
    if (x && x->acts) attr_strs(&c, "activations", x->acts, x->n_acts);
    if (x && x->n_alpha) attr_floats(&c, "activation_alpha", x->alpha, x->n_alpha);
    if (x && x->n_beta) attr_floats(&c, "activation_beta", x->beta, x->n_beta);
    if (x && x->clip > 0) attr_float(&c, "clip", x->clip);
    if (x && x->input_forget) attr_int(&c, "input_forget", 1);
    float ws = 1.0f / sqrtf((float)H);
    int64_t dx[3] = {layout ? B : T, layout ? T : B, I}, dw[3] = {ND, G * H, I},
            dr[3] = {ND, G * H, H}, db[2] = {ND, 2 * G * H}, dh[3] = {layout ? B : ND,
                                                                       layout ? ND : B, H},
            dp[2] = {ND, 3 * H};
    kiln_tensor *X = tensor_f32(3, dx);
    for (size_t k = 0; k < X->nbytes / 4; k++) ((float *)X->data)[k] = rng_normal();
    cn_input(&c, 0, X, false);
    cn_input(&c, 1, rnn_random(3, dw, ws), !(flags & RNN_W_INPUT));
    cn_input(&c, 2, rnn_random(3, dr, ws), !(flags & RNN_W_INPUT));
    cn_input(&c, 3, flags & RNN_NO_BIAS ? NULL : rnn_random(2, db, 0.5f), !(flags & RNN_W_INPUT));
    kiln_tensor *L = NULL;
    if (flags & RNN_LENS) {
        int64_t dl[1] = {B};
        if (kiln_tensor_new(KILN_DTYPE_I32, 1, dl, &L) != KILN_OK) abort();
        for (int64_t b = 0; b < B; b++) /* every length from 0 to T, T first */
            ((int32_t *)L->data)[b] = (int32_t)((T - b % (T + 1) + T + 1) % (T + 1));
    }
    cn_input(&c, 4, L, false);
    cn_input(&c, 5, flags & RNN_INIT ? rnn_random(3, dh, 1.0f) : NULL, false);
    if (lstm) {
        cn_input(&c, 6, flags & RNN_INIT ? rnn_random(3, dh, 1.0f) : NULL, false);
        cn_input(&c, 7, flags & RNN_PEEP ? rnn_random(2, dp, 0.5f) : NULL, !(flags & RNN_W_INPUT));
    }
    for (int k = 0; k < n_out; k++) c.out_wanted[k] = !(flags & RNN_YH_ONLY) || k == 1;
    char label[200];
    snprintf(label, sizeof label, "%s %s%s T%lld B%lld I%lld H%lld flags %#x%s%s", kiln_op_name(op),
             dir, op == KILN_OP_GRU ? (lbr ? " lbr1" : " lbr0") : "", (long long)T, (long long)B,
             (long long)I, (long long)H, flags, x && x->acts ? " acts " : "",
             x && x->acts ? x->acts[0] : "");
    check_case(&c, label, 1e-4, 2e-5, 1);
    cn_free(&c);
}

/* Every direction and cell (GRU with both linear_before_reset values), with and without
 * sequence lengths (every length from 0 to T) and initial states, both layouts, batch 1 and
 * more, hidden sizes below, at and above the vector widths, and a size large enough that
 * two threads split the GEMM and the steps; then peepholes, input_forget, clip, every
 * activation function, per-direction activation lists, and weights known only at run time. */
static void test_rnn(void)
{
    static const char *const dirs[] = {"forward", "reverse", "bidirectional"};
    static const struct {
        int64_t T, B, I, H;
        int flags;
    } shapes[] = {
        {5, 1, 3, 7, 0},
        {4, 3, 5, 8, RNN_LENS | RNN_INIT},
        {3, 5, 8, 17, RNN_LENS | RNN_INIT | RNN_LAYOUT1},
        {6, 2, 4, 16, RNN_INIT | RNN_NO_BIAS},
        {2, 4, 6, 33, RNN_LENS | RNN_YH_ONLY},
        {3, 8, 20, 260, RNN_LENS | RNN_INIT},
    };
    static const struct {
        enum kiln_op op;
        int lbr;
    } cells[] = {{KILN_OP_RNN, 0}, {KILN_OP_GRU, 0}, {KILN_OP_GRU, 1}, {KILN_OP_LSTM, 0}};
    for (size_t ci = 0; ci < sizeof cells / sizeof cells[0]; ci++)
        for (int d = 0; d < 3; d++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                rnn_case(cells[ci].op, dirs[d], cells[ci].lbr, shapes[si].T, shapes[si].B,
                         shapes[si].I, shapes[si].H, shapes[si].flags, NULL);

    /* a node whose steps can split times its first runs split and on one thread, then
     * keeps the faster (simd/rnn.c, struct rnn_tune): twelve runs of one instance, each
     * bit for bit the first */
    case_repeat = 12;
    rnn_case(KILN_OP_LSTM, "forward", 0, 3, 8, 20, 260, RNN_LENS | RNN_INIT, NULL);
    rnn_case(KILN_OP_GRU, "reverse", 0, 3, 8, 20, 260, RNN_INIT, NULL);
    case_repeat = 1;
    rnn_case(KILN_OP_LSTM, "bidirectional", 0, 4, 3, 5, 17, RNN_LENS | RNN_INIT | RNN_PEEP, NULL);
    struct rnn_extra fg = {.input_forget = 1};
    rnn_case(KILN_OP_LSTM, "forward", 0, 4, 2, 5, 9, RNN_INIT | RNN_PEEP, &fg);
    struct rnn_extra clip = {.clip = 0.4f};
    rnn_case(KILN_OP_LSTM, "reverse", 0, 4, 2, 5, 9, RNN_INIT, &clip);
    rnn_case(KILN_OP_GRU, "bidirectional", 1, 4, 2, 5, 9, RNN_INIT, &clip);
    rnn_case(KILN_OP_GRU, "forward", 0, 4, 2, 5, 9, RNN_INIT, &clip);

    static const char *const fns[] = {"Relu",      "Tanh",     "Sigmoid",    "Affine",
                                      "LeakyRelu", "ThresholdedRelu",        "ScaledTanh",
                                      "HardSigmoid", "Elu",    "Softsign",   "Softplus"};
    static const float al[] = {0.7f, 0.3f}, be[] = {0.2f, 0.6f};
    for (int f = 0; f < 11; f++) {
        struct rnn_extra e = {.acts = &fns[f], .n_acts = 1, .alpha = al, .n_alpha = 1,
                              .beta = be, .n_beta = 1};
        rnn_case(KILN_OP_RNN, "forward", 0, 3, 2, 4, 9, RNN_INIT, &e);
    }
    static const char *const gru_acts[] = {"HardSigmoid", "Softsign", "Sigmoid", "ScaledTanh"};
    struct rnn_extra ge = {.acts = gru_acts, .n_acts = 4, .alpha = al, .n_alpha = 2,
                           .beta = be, .n_beta = 2};
    rnn_case(KILN_OP_GRU, "bidirectional", 1, 3, 2, 4, 9, RNN_INIT, &ge);
    rnn_case(KILN_OP_GRU, "bidirectional", 0, 3, 2, 4, 9, RNN_INIT, &ge);
    static const char *const lstm_acts[] = {"Sigmoid", "Elu", "Softplus"};
    struct rnn_extra le = {.acts = lstm_acts, .n_acts = 3, .alpha = al, .n_alpha = 1};
    rnn_case(KILN_OP_LSTM, "bidirectional", 0, 3, 2, 4, 9, RNN_INIT, &le);
    /* weights that are graph inputs (as in the ONNX node tests): packed by each run */
    rnn_case(KILN_OP_LSTM, "bidirectional", 0, 3, 2, 4, 9, RNN_W_INPUT | RNN_PEEP | RNN_LENS, NULL);
    rnn_case(KILN_OP_GRU, "forward", 0, 3, 2, 4, 17, RNN_W_INPUT | RNN_INIT, NULL);
    rnn_case(KILN_OP_GRU, "reverse", 1, 3, 2, 4, 17, RNN_W_INPUT | RNN_INIT, NULL);
    rnn_case(KILN_OP_RNN, "forward", 0, 3, 2, 4, 5, RNN_W_INPUT | RNN_NO_BIAS, NULL);
}

/* ---- The generators named by the family lists ---- */

/* ---- Resize / Upsample of H and W (simd/resize.c) and Split (simd/split.c) ---- */

static kiln_tensor *floats_f32(int n, const float *v)
{
    int64_t d = n;
    kiln_tensor *t = tensor_f32(1, &d);
    memcpy(t->data, v, sizeof(float) * (size_t)n);
    return t;
}

/* One Resize-19 (or Upsample-9) case: x of dims d, by scales (4 entries, or 2 with
 * axes 2, 3) or sizes; mode and coordinate mapping as named. */
static void resize_case(enum kiln_op op, const int64_t *d, const float *scales, int n_scales,
                        const int64_t *sizes, const char *mode, const char *coord,
                        const char *nearest, int axes_hw, int handled)
{
    struct case_node c;
    int up = op == KILN_OP_Upsample;
    cn_init(&c, op, up ? 9 : 19, up ? 2 : 4, 1);
    attr_str(&c, "mode", mode);
    if (!up) {
        if (coord) attr_str(&c, "coordinate_transformation_mode", coord);
        if (nearest) attr_str(&c, "nearest_mode", nearest);
        if (axes_hw) attr_ints(&c, "axes", (const int64_t[]){2, 3}, 2);
    }
    kiln_tensor *x = tensor_f32(4, d);
    for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal();
    cn_input(&c, 0, x, false);
    if (up) {
        cn_input(&c, 1, floats_f32(4, scales), true);
    } else {
        cn_input(&c, 1, NULL, false);
        cn_input(&c, 2, scales ? floats_f32(n_scales, scales) : NULL, true);
        cn_input(&c, 3, sizes ? ints_i64(axes_hw ? 2 : 4, sizes) : NULL, true);
    }
    char label[160];
    snprintf(label, sizeof label, "%s %s %s %s [%lld,%lld,%lld,%lld]%s", up ? "Upsample" : "Resize",
             mode, coord ? coord : "", nearest ? nearest : "", (long long)d[0], (long long)d[1],
             (long long)d[2], (long long)d[3], sizes ? " by sizes" : "");
    check_case(&c, label, 1e-5, 1e-5, handled);
    cn_free(&c);
}

static void test_resize(void)
{
    int64_t d[4] = {2, 3, 9, 11}, one[4] = {1, 17, 1, 1}, big[4] = {1, 4, 33, 40};
    const float up2[4] = {1, 1, 2, 2}, odd[4] = {1, 1, 1.7f, 0.6f}, hw[2] = {0.6f, 1.7f};
    resize_case(KILN_OP_Resize, d, up2, 4, NULL, "nearest", NULL, NULL, 0, 1);
    resize_case(KILN_OP_Resize, d, odd, 4, NULL, "nearest", "asymmetric", "floor", 0, 1);
    resize_case(KILN_OP_Resize, d, odd, 4, NULL, "nearest", "align_corners", "ceil", 0, 1);
    resize_case(KILN_OP_Resize, d, odd, 4, NULL, "nearest", "half_pixel", "round_prefer_ceil", 0,
                1);
    resize_case(KILN_OP_Resize, d, odd, 4, NULL, "linear", "half_pixel", NULL, 0, 1);
    resize_case(KILN_OP_Resize, d, odd, 4, NULL, "linear", "pytorch_half_pixel", NULL, 0, 1);
    resize_case(KILN_OP_Resize, d, odd, 4, NULL, "linear", "half_pixel_symmetric", NULL, 0, 1);
    resize_case(KILN_OP_Resize, d, up2, 4, NULL, "cubic", "align_corners", NULL, 0, 1);
    resize_case(KILN_OP_Resize, one, up2, 4, NULL, "linear", NULL, NULL, 0, 1);
    resize_case(KILN_OP_Resize, big, NULL, 0, (const int64_t[]){1, 4, 7, 100}, "linear", NULL,
                NULL, 0, 1);
    resize_case(KILN_OP_Resize, d, hw, 2, NULL, "nearest", "tf_half_pixel_for_nn",
                "round_prefer_ceil", 1, 1);
    /* at scale 1, tf_half_pixel_for_nn rounding up moves N and C by one: the reference
     * computes it (rounding down, they map to themselves: the fast kernel's) */
    resize_case(KILN_OP_Resize, d, odd, 4, NULL, "nearest", "tf_half_pixel_for_nn",
                "round_prefer_ceil", 0, 0);
    resize_case(KILN_OP_Resize, d, odd, 4, NULL, "nearest", "tf_half_pixel_for_nn", NULL, 0, 1);
    resize_case(KILN_OP_Resize, d, odd, 4, NULL, "linear", "tf_crop_and_resize", NULL, 0, 0);
    resize_case(KILN_OP_Resize, d, (const float[]){1, 2, 1, 1}, 4, NULL, "nearest", NULL, NULL, 0,
                0); /* C resized */
}

static void test_upsample(void)
{
    int64_t d[4] = {2, 3, 5, 7};
    resize_case(KILN_OP_Upsample, d, (const float[]){1, 1, 2, 3}, 4, NULL, "nearest", NULL, NULL,
                0, 1);
    resize_case(KILN_OP_Upsample, d, (const float[]){1, 1, 2, 1.5f}, 4, NULL, "linear", NULL,
                NULL, 0, 1);
}

static void split_case(kiln_dtype dt, int rank, const int64_t *dims, int axis, int n_out,
                       const int64_t *split, int handled)
{
    struct case_node c;
    cn_init(&c, KILN_OP_Split, 13, 2, n_out);
    for (int k = 0; k < n_out; k++) c.out_wanted[k] = true;
    attr_int(&c, "axis", axis);
    kiln_tensor *x;
    if (kiln_tensor_new(dt, rank, dims, &x) != KILN_OK) abort();
    uint8_t *p = x->data;
    for (size_t i = 0; i < x->nbytes; i++) p[i] = (uint8_t)rng_next();
    if (dt == KILN_DTYPE_F32)
        for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal();
    cn_input(&c, 0, x, false);
    cn_input(&c, 1, ints_i64(n_out, split), true);
    char label[128], sd[64];
    snprintf(label, sizeof label, "Split %s %s axis %d into %d", kiln_dtype_name(dt),
             kiln_shape_str(rank, dims, sd, 64), axis, n_out);
    check_case(&c, label, 0, 0, handled);
    cn_free(&c);
}

/* ---- Where and Expand (simd/bcast_copy.c): broadcasting copies of any fixed-size dtype ---- */

/* A tensor of dt with random bytes (bool: 0 or 1; float32: normal values). */
static kiln_tensor *tensor_random(kiln_dtype dt, int rank, const int64_t *dims)
{
    kiln_tensor *t;
    if (kiln_tensor_new(dt, rank, dims, &t) != KILN_OK) abort();
    unsigned char *b = t->data;
    for (size_t i = 0; i < t->nbytes; i++) b[i] = (unsigned char)rng_next();
    if (dt == KILN_DTYPE_BOOL)
        for (size_t i = 0; i < t->nbytes; i++) b[i] &= 1;
    if (dt == KILN_DTYPE_F32)
        for (size_t i = 0; i < t->nbytes / 4; i++) ((float *)t->data)[i] = rng_normal();
    return t;
}

static void where_case(kiln_dtype dt, int rc, const int64_t *dc, int rx, const int64_t *dx,
                       int ry, const int64_t *dy, const char *what)
{
    struct case_node c;
    cn_init(&c, KILN_OP_Where, 16, 3, 1);
    cn_input(&c, 0, tensor_random(KILN_DTYPE_BOOL, rc, dc), false);
    cn_input(&c, 1, tensor_random(dt, rx, dx), false);
    cn_input(&c, 2, tensor_random(dt, ry, dy), false);
    char label[128];
    snprintf(label, sizeof label, "Where %s %s", kiln_dtype_name(dt), what);
    check_case(&c, label, 0, 0, 1);
    cn_free(&c);
}

static void test_where(void)
{
    static const kiln_dtype dts[] = {KILN_DTYPE_F32, KILN_DTYPE_I64, KILN_DTYPE_F16,
                                     KILN_DTYPE_BOOL, KILN_DTYPE_I32};
    for (size_t t = 0; t < sizeof dts / sizeof dts[0]; t++) {
        for (int s = 0; s < N_SIZES; s++) {
            int64_t n = sizes[s], full[4] = {2, 3, n, n}, pad[4] = {2, 1, 1, n};
            int64_t causal[4] = {1, 1, n, n}, one = 1, row[1] = {n};
            where_case(dts[t], 4, full, 4, full, 4, full, "all [2,3,n,n]");
            where_case(dts[t], 4, pad, 4, full, 0, &one, "padding mask [2,1,1,n], scalar Y");
            where_case(dts[t], 4, causal, 0, &one, 4, full, "causal mask [1,1,n,n], scalar X");
            where_case(dts[t], 1, row, 4, pad, 4, causal, "[n] condition, X and Y broadcast");
        }
    }
    int64_t big[4] = {4, 8, 128, 128}, bmask[4] = {4, 1, 1, 128}, one = 1;
    where_case(KILN_DTYPE_F32, 4, bmask, 4, big, 0, &one, "threaded [4,8,128,128]");
    int64_t scalar_c = 1, col[2] = {7, 1}, rowv[2] = {1, 9};
    where_case(KILN_DTYPE_F32, 1, &scalar_c, 2, col, 2, rowv, "[1] condition, outer product");
}

static void expand_case(kiln_dtype dt, int rx, const int64_t *dx, int rs, const int64_t *shape,
                        const char *what)
{
    struct case_node c;
    cn_init(&c, KILN_OP_Expand, 13, 2, 1);
    cn_input(&c, 0, tensor_random(dt, rx, dx), false);
    cn_input(&c, 1, ints_i64(rs, shape), true);
    char label[128];
    snprintf(label, sizeof label, "Expand %s %s", kiln_dtype_name(dt), what);
    check_case(&c, label, 0, 0, 1);
    cn_free(&c);
}

static void test_expand(void)
{
    static const kiln_dtype dts[] = {KILN_DTYPE_F32, KILN_DTYPE_I64, KILN_DTYPE_U8,
                                     KILN_DTYPE_BF16};
    for (size_t t = 0; t < sizeof dts / sizeof dts[0]; t++) {
        for (int s = 0; s < N_SIZES; s++) {
            int64_t n = sizes[s], col[2] = {3, 1}, to3[3] = {2, 3, n}, row[2] = {1, n};
            int64_t to2[2] = {4, n}, one = 1, to_one[2] = {5, n}, ids[2] = {1, n};
            int64_t to_ids[2] = {3, 1}, mid[3] = {2, 1, n}, to_mid[3] = {2, 6, n};
            expand_case(dts[t], 2, col, 3, to3, "[3,1] to [2,3,n]");
            expand_case(dts[t], 2, row, 2, to2, "[1,n] to [4,n]");
            expand_case(dts[t], 0, &one, 2, to_one, "scalar to [5,n]");
            expand_case(dts[t], 2, ids, 2, to_ids, "[1,n] by [3,1] (numpy: [3,n])");
            expand_case(dts[t], 3, mid, 3, to_mid, "[2,1,n] to [2,6,n]");
        }
    }
    int64_t x[3] = {1, 1, 512}, big[3] = {16, 64, 512};
    expand_case(KILN_DTYPE_F32, 3, x, 3, big, "threaded [1,1,512] to [16,64,512]");
}

static void test_split(void)
{
    split_case(KILN_DTYPE_F32, 3, (const int64_t[]){3, 5, 24}, -1, 3, (const int64_t[]){8, 12, 4},
               1);
    split_case(KILN_DTYPE_F32, 4, (const int64_t[]){2, 40, 3, 5}, 1, 2, (const int64_t[]){16, 24},
               1);
    split_case(KILN_DTYPE_I64, 2, (const int64_t[]){7, 2}, 0, 2, (const int64_t[]){3, 4}, 1);
    split_case(KILN_DTYPE_U8, 1, (const int64_t[]){1000}, 0, 4,
               (const int64_t[]){1, 0, 500, 499}, 1);
    split_case(KILN_DTYPE_F16, 5, (const int64_t[]){2, 3, 4, 5, 6}, 2, 2,
               (const int64_t[]){1, 3}, 1);
}

/* ---- Pooling (pool.def) ---- */

struct pool_spec {
    int nsp;                       /* spatial dims: 1 to 3 */
    int64_t k, s, pad, dil;
    int ceil, include_pad;
    const char *auto_pad;          /* NULL = NOTSET */
};

/* Every 37th input of the next pool cases NaN (a window holding one gives NaN). */
static bool pool_nan;

static void pool_case(enum kiln_op op, int rank, const int64_t *dims, const struct pool_spec *p,
                      bool indices, int expect)
{
    struct case_node c;
    cn_init(&c, op, op == KILN_OP_MaxPool ? 12 : 19, 1, indices ? 2 : 1);
    if (indices) c.out_wanted[1] = true;
    kiln_tensor *x = tensor_f32(rank, dims);
    for (size_t i = 0; i < x->nbytes / 4; i++)
        ((float *)x->data)[i] = pool_nan && i % 37 == 5 ? NAN : rng_normal();
    cn_input(&c, 0, x, false);
    if (p) {
        int64_t ks[3], st[3], dl[3], pads[6];
        for (int i = 0; i < p->nsp; i++) {
            ks[i] = p->k;
            st[i] = p->s;
            dl[i] = p->dil;
            pads[i] = pads[i + p->nsp] = p->pad;
        }
        attr_ints(&c, "kernel_shape", ks, p->nsp);
        attr_ints(&c, "strides", st, p->nsp);
        if (p->auto_pad) attr_str(&c, "auto_pad", p->auto_pad);
        else attr_ints(&c, "pads", pads, 2 * p->nsp);
        if (p->dil > 1) attr_ints(&c, "dilations", dl, p->nsp);
        attr_int(&c, "ceil_mode", p->ceil);
        if (op == KILN_OP_AveragePool) attr_int(&c, "count_include_pad", p->include_pad);
    }
    char label[160], sd[64];
    snprintf(label, sizeof label, "%s %s k%lld s%lld p%lld d%lld ceil %d incl %d%s%s",
             kiln_op_name(op), kiln_shape_str(rank, dims, sd, 64), (long long)(p ? p->k : 0),
             (long long)(p ? p->s : 0), (long long)(p ? p->pad : 0), (long long)(p ? p->dil : 0),
             p ? p->ceil : 0, p ? p->include_pad : 0, p && p->auto_pad ? p->auto_pad : "",
             indices ? " with Indices" : "");
    check_case(&c, label, 1e-5, 1e-6, expect);
    /* 2-D windows and global pools also on the layout pass's channel-blocked storage (a
     * global pool's [N, C, 1, 1] output blocked, or plain as before a Flatten) */
    if (rank == 4 && !indices && (expect == 1 || !p) &&
        !(op == KILN_OP_AveragePool && p && p->ceil && p->include_pad)) {
        for (int b = 8; b <= 16; b += 8)
            for (int plain_out = 0; plain_out <= (p ? 0 : 1); plain_out++) {
                char lb[200];
                snprintf(lb, sizeof lb, "%s, blocked by %d%s", label, b,
                         plain_out ? " into a plain output" : "");
                case_layout = b;
                case_layout_out = plain_out ? 0 : -1;
                check_case(&c, lb, 1e-5, 1e-6, expect);
                case_layout = 0;
                case_layout_out = -1;
            }
    }
    cn_free(&c);
}

static void test_pool_family(void)
{
    static const struct pool_spec specs[] = {
        {2, 3, 2, 1, 1, 0, 0, NULL}, {2, 2, 2, 0, 1, 1, 0, NULL}, {2, 3, 1, 1, 2, 0, 0, NULL},
        {2, 3, 2, 1, 1, 0, 1, NULL}, {2, 3, 2, 0, 1, 1, 0, NULL}, {2, 3, 2, 0, 1, 0, 0, "SAME_UPPER"},
        {2, 1, 1, 0, 1, 0, 0, NULL},
    };
    const enum kiln_op ops[] = {KILN_OP_MaxPool, KILN_OP_AveragePool};
    for (int o = 0; o < 2; o++) {
        for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
            if (ops[o] == KILN_OP_MaxPool && specs[i].include_pad) continue;
            for (int s = 0; s < N_SIZES - 1; s++) { /* channels 1 to 33, odd and even images */
                int64_t d[4] = {2, sizes[s], 9 - (s & 1), 7 + (s & 1)};
                pool_case(ops[o], 4, d, &specs[i], false, 1);
            }
        }
        /* a 1-D window (NCW) and a 3-D one (NCDHW); a larger threaded image */
        const struct pool_spec p1 = {1, 3, 2, 1, 1, 0, 0, NULL}, p3 = {3, 2, 2, 0, 1, 1, 0, NULL};
        int64_t d3[3] = {2, 5, 21}, d5[5] = {1, 3, 5, 6, 7}, big[4] = {2, 64, 56, 56};
        pool_case(ops[o], 3, d3, &p1, false, 1);
        /* 1-D: stride 1 (W outputs at a time), dilated, and non-overlapping k = s = 2 and 4
         * (the parity-split vectors) on rows that leave tails and pads; those last again with
         * NaNs, which Kiln's kernels keep and oneDNN's max pooling drops */
        static const struct {
            struct pool_spec p;
            int64_t d[3];
            bool nan;
        } one_d[] = {
            {{1, 3, 1, 1, 1, 0, 0, NULL}, {2, 3, 53}, false},
            {{1, 3, 1, 2, 2, 0, 1, NULL}, {2, 3, 53}, false},
            {{1, 4, 4, 0, 1, 1, 0, NULL}, {1, 17, 1981}, true},
            {{1, 2, 2, 0, 1, 0, 0, NULL}, {2, 5, 77}, true},
            {{1, 2, 2, 1, 1, 1, 0, NULL}, {1, 3, 131}, false},
            {{1, 4, 4, 2, 1, 0, 0, NULL}, {1, 3, 131}, false},
        };
        for (size_t i = 0; i < sizeof one_d / sizeof one_d[0]; i++)
            pool_case(ops[o], 3, one_d[i].d, &one_d[i].p, false, 1);
        pool_nan = true;
        case_kernel_prefix = "f32_";
        for (size_t i = 0; i < sizeof one_d / sizeof one_d[0]; i++)
            if (one_d[i].nan) pool_case(ops[o], 3, one_d[i].d, &one_d[i].p, false, 1);
        case_kernel_prefix = NULL;
        pool_nan = false;
        pool_case(ops[o], 5, d5, &p3, false, 1);
        pool_case(ops[o], 4, big, &specs[0], false, 1);
    }
    /* declined: MaxPool's Indices output; AveragePool counting pads with a ceil_mode window
     * past the end padding (ONNX does not count that room) */
    int64_t d[4] = {1, 4, 8, 8};
    pool_case(KILN_OP_MaxPool, 4, d, &specs[0], true, 0);
    const struct pool_spec past = {2, 3, 2, 0, 1, 1, 1, NULL};
    pool_case(KILN_OP_AveragePool, 4, d, &past, false, 0);
}

static void test_global_pool(void)
{
    const enum kiln_op ops[] = {KILN_OP_GlobalAveragePool, KILN_OP_GlobalMaxPool};
    for (int o = 0; o < 2; o++) {
        for (int s = 0; s < N_SIZES; s++) {
            int64_t d4[4] = {2, sizes[s], 7, 5}, one[4] = {3, sizes[s], 1, 1};
            pool_case(ops[o], 4, d4, NULL, false, 1);
            pool_case(ops[o], 4, one, NULL, false, 1);
        }
        int64_t d3[3] = {2, 6, 33}, d5[5] = {2, 3, 4, 5, 6}, big[4] = {4, 256, 28, 28};
        pool_case(ops[o], 3, d3, NULL, false, 1);
        pool_case(ops[o], 5, d5, NULL, false, 1);
        pool_case(ops[o], 4, big, NULL, false, 1);
    }
}

/* ---- Matrix products (dnnl/matmul.def) ---- */

static kiln_tensor *rand_f32(int rank, const int64_t *dims, float scale)
{
    kiln_tensor *t = tensor_f32(rank, dims);
    for (size_t i = 0; i < t->nbytes / 4; i++) ((float *)t->data)[i] = rng_normal() * scale;
    return t;
}

/* A constant B with about `zeros` of its elements 0 (the sparse entries' candidates). */
static kiln_tensor *sparse_f32(int rank, const int64_t *dims, double zeros)
{
    kiln_tensor *t = rand_f32(rank, dims, 0.5f);
    for (size_t i = 0; i < t->nbytes / 4; i++)
        if (rng_uniform(0, 1) < zeros) ((float *)t->data)[i] = 0.0f;
    return t;
}

struct mm_spec {
    enum kiln_op op;
    int ra, rb;
    int64_t a[4], b[4];   /* stored shapes (transposed where ta / tb) */
    int ta, tb;
    float alpha, beta;    /* beta: Gemm only */
    int rc;               /* bias / C rank (-1: none) */
    int64_t c[4];
    bool b_const, sum;    /* sum: KilnFusedMatMul's residual input 3 */
    const char *act;      /* KilnFusedMatMul's activation ("" none) */
    float act_alpha, act_beta;
    double zeros;         /* > 0: B constant with this share of zeros */
    const char *sparse;   /* KILN_SPARSE for the case (NULL: auto) */
    int expect;           /* check_case's expect_handled */
    int prec;             /* the plan's precision: 0 fp32, 1 bf16, 2 int8 (B constant) */
};

/* When set, mm_case also checks that the op's choice (1 thread) runs a kernel whose name
 * holds this text. */
static const char *mm_want_kernel;

static void mm_case(const struct mm_spec *m, const char *what)
{
    struct case_node c;
    int n_in = m->sum ? 4 : m->rc >= 0 ? 3 : 2;
    cn_init(&c, m->op, 13, n_in, 1);
    if (m->op != KILN_OP_MatMul) {
        attr_int(&c, "transA", m->ta);
        attr_int(&c, "transB", m->tb);
        attr_float(&c, "alpha", m->alpha);
    }
    if (m->op == KILN_OP_Gemm) attr_float(&c, "beta", m->beta);
    if (m->op == KILN_OP_KilnFusedMatMul) {
        attr_str(&c, "activation", m->act ? m->act : "");
        if (m->act_alpha != 0 || m->act_beta != 0) {
            attr_float(&c, "act_alpha", m->act_alpha);
            attr_float(&c, "act_beta", m->act_beta);
        }
    }
    cn_input(&c, 0, rand_f32(m->ra, m->a, 1.0f), false);
    cn_input(&c, 1, m->zeros > 0 ? sparse_f32(m->rb, m->b, m->zeros) : rand_f32(m->rb, m->b, 0.5f),
             m->b_const || m->zeros > 0);
    if (n_in > 2) cn_input(&c, 2, m->rc >= 0 ? rand_f32(m->rc, m->c, 1.0f) : NULL, true);
    if (m->sum) {
        struct kiln_type ty[MAX_IO];
        if (cn_infer(&c, ty) != KILN_OK) abort();
        cn_input(&c, 3, rand_f32(ty[0].rank, ty[0].dims, 1.0f), false);
    }
    char label[240], sa[64], sb[64], sc[64];
    snprintf(label, sizeof label, "%s %s%s x %s%s%s%s alpha %g beta %g%s%s%s%s%s%s%s %s",
             kiln_op_name(m->op), kiln_shape_str(m->ra, m->a, sa, 64), m->ta ? "^T" : "",
             kiln_shape_str(m->rb, m->b, sb, 64), m->tb ? "^T" : "", m->b_const ? " (const)" : "",
             m->zeros > 0 ? " (sparse)" : "", (double)m->alpha, (double)m->beta,
             m->rc >= 0 ? " C " : "", m->rc >= 0 ? kiln_shape_str(m->rc, m->c, sc, 64) : "",
             m->sum ? " sum" : "", m->act && m->act[0] ? " " : "", m->act ? m->act : "",
             m->sparse ? " KILN_SPARSE=force" : "",
             m->prec == 1 ? " bf16" : m->prec == 2 ? " int8" : "", what);
    if (m->sparse) setenv("KILN_SPARSE", m->sparse, 1);
    /* low precision: A and B rounded (bf16: 8 bits of mantissa; int8: 255 steps of A's range,
     * 127 of B's column), errors growing as sqrt(K) */
    double k = (double)m->a[m->ra - 1 - (m->ta ? 1 : 0)];
    double atol = m->prec == 1 ? 0.01 * sqrt(k) : m->prec == 2 ? 0.04 * sqrt(k) : 1e-4;
    double rtol = m->prec ? 0.02 : 1e-4;
    case_precision = m->prec;
    check_case(&c, label, rtol, atol, m->expect);
    bool lowp_cpu = m->prec == 1 ? isa_levels() == 3 : __builtin_cpu_supports("avx512vnni");
    if (m->prec && lowp_cpu) { /* the op's choice ran the asked precision (else fp32) */
        kiln_tensor *got[MAX_IO];
        bool handled = false;
        char name[64] = "";
        kiln_status st = run_fast(&c, isa_names[isa_levels() - 1], 1, &handled, name, got);
        const char *tag = m->prec == 1 ? "bf16" : "int8";
        CHECK(st == KILN_OK && handled && strstr(name, tag),
              "%s: the choice ran %s, not a %s kernel", label, handled ? name : "nothing", tag);
        free_outs(got, c.n_out);
    }
    case_precision = 0;
    if (m->sparse && !m->ta && !m->sum) { /* forced: the op's choice is the sparse kernel */
        kiln_tensor *got[MAX_IO];
        bool handled = false;
        char name[64] = "";
        kiln_status st = run_fast(&c, isa_names[isa_levels() - 1], 1, &handled, name, got);
        CHECK(st == KILN_OK && handled && strncmp(name, "sparse", 6) == 0,
              "%s: the choice ran %s, not the sparse kernel", label, handled ? name : "nothing");
        free_outs(got, c.n_out);
    }
    if (m->sparse) unsetenv("KILN_SPARSE");
    if (mm_want_kernel) {
        kiln_tensor *got[MAX_IO];
        bool handled = false;
        char name[64] = "";
        kiln_status st = run_fast(&c, isa_names[isa_levels() - 1], 1, &handled, name, got);
        CHECK(st == KILN_OK && handled && strstr(name, mm_want_kernel),
              "%s: the choice ran %s, not a %s kernel", label, handled ? name : "nothing",
              mm_want_kernel);
        if (st == KILN_OK && handled) free_outs(got, c.n_out);
    }
    cn_free(&c);
}

/* MatMul: sizes around the vector widths, B constant or not; batched products with numpy
 * broadcasting of the batch dims (A's batch folded into rows where B is one matrix); a
 * mostly-zero constant B (the sparse entry: timed, and forced). */
static void test_matmul_family(void)
{
    static const int64_t sz[] = {1, 15, 16, 17, 65};
    for (int im = 0; im < 5; im++)
        for (int ik = 0; ik < 5; ik += 2)
            for (int in = 0; in < 5; in += 2) {
                int64_t m = sz[im], k = sz[(ik + im) % 5], n = sz[in];
                struct mm_spec s = {KILN_OP_MatMul, 2, 2, {m, k}, {k, n}, 0, 0, 1, 1, -1, {0},
                                    (im + in) % 2 == 1, false, NULL, 0, 0, 0, NULL, 1, 0};
                mm_case(&s, "");
            }
    static const struct mm_spec bc[] = {
        {KILN_OP_MatMul, 3, 2, {2, 17, 33}, {33, 16}, 0, 0, 1, 1, -1, {0}, true, false, NULL, 0, 0, 0, NULL, 1, 0},
        {KILN_OP_MatMul, 3, 2, {3, 5, 16}, {16, 65}, 0, 0, 1, 1, -1, {0}, false, false, NULL, 0, 0, 0, NULL, 1, 0},
        {KILN_OP_MatMul, 3, 3, {4, 15, 17}, {4, 17, 16}, 0, 0, 1, 1, -1, {0}, false, false, NULL, 0, 0, 0, NULL, 1, 0},
        {KILN_OP_MatMul, 4, 4, {2, 3, 16, 8}, {2, 3, 8, 17}, 0, 0, 1, 1, -1, {0}, false, false, NULL, 0, 0, 0, NULL, 1, 0},
        {KILN_OP_MatMul, 4, 4, {2, 1, 7, 8}, {1, 3, 8, 5}, 0, 0, 1, 1, -1, {0}, false, false, NULL, 0, 0, 0, NULL, 1, 0},
        {KILN_OP_MatMul, 2, 3, {7, 8}, {3, 8, 5}, 0, 0, 1, 1, -1, {0}, true, false, NULL, 0, 0, 0, NULL, 1, 0},
        {KILN_OP_MatMul, 3, 3, {2, 7, 8}, {1, 8, 5}, 0, 0, 1, 1, -1, {0}, true, false, NULL, 0, 0, 0, NULL, 1, 0},
        {KILN_OP_MatMul, 3, 4, {6, 9, 4}, {2, 1, 4, 11}, 0, 0, 1, 1, -1, {0}, false, false, NULL, 0, 0, 0, NULL, 1, 0},
        /* B's rows 4 KB apart: packed with padded rows (dnnl/matmul.c) */
        {KILN_OP_MatMul, 2, 2, {17, 24}, {24, 1024}, 0, 0, 1, 1, -1, {0}, true, false, NULL, 0, 0, 0, NULL, 1, 0},
        {KILN_OP_MatMul, 3, 3, {2, 9, 16}, {2, 16, 2048}, 0, 0, 1, 1, -1, {0}, true, false, NULL, 0, 0, 0, NULL, 1, 0},
        /* a mostly-zero constant B: timed against oneDNN, then the sparse kernel forced */
        {KILN_OP_MatMul, 2, 2, {64, 128}, {128, 96}, 0, 0, 1, 1, -1, {0}, true, false, NULL, 0, 0, 0.8, NULL, 1, 0},
        {KILN_OP_MatMul, 3, 2, {2, 33, 64}, {64, 40}, 0, 0, 1, 1, -1, {0}, true, false, NULL, 0, 0, 0.7, "force", 1, 0},
        {KILN_OP_MatMul, 2, 2, {1, 64}, {64, 33}, 0, 0, 1, 1, -1, {0}, true, false, NULL, 0, 0, 0.9, "force", 1, 0},
        {KILN_OP_MatMul, 2, 2, {17, 30}, {30, 17}, 0, 0, 1, 1, -1, {0}, true, false, NULL, 0, 0, 0.6, "force", 1, 0},
        /* plans compiled for bf16 and int8 (oneDNN's low-precision products, the sparse int8 one) */
        {KILN_OP_MatMul, 2, 2, {33, 64}, {64, 48}, 0, 0, 1, 1, -1, {0}, true, false, NULL, 0, 0, 0, NULL, 1, 1},
        {KILN_OP_MatMul, 3, 2, {2, 17, 64}, {64, 40}, 0, 0, 1, 1, -1, {0}, true, false, NULL, 0, 0, 0, NULL, 1, 1},
        {KILN_OP_MatMul, 2, 2, {33, 64}, {64, 48}, 0, 0, 1, 1, -1, {0}, true, false, NULL, 0, 0, 0, NULL, 1, 2},
        {KILN_OP_MatMul, 3, 2, {2, 17, 64}, {64, 40}, 0, 0, 1, 1, -1, {0}, true, false, NULL, 0, 0, 0, NULL, 1, 2},
        {KILN_OP_MatMul, 2, 2, {32, 64}, {64, 48}, 0, 0, 1, 1, -1, {0}, true, false, NULL, 0, 0, 0.8, "force", 1, 2},
    };
    for (size_t i = 0; i < sizeof bc / sizeof bc[0]; i++) mm_case(&bc[i], "");
}

/* Gemm: transA / transB, alpha, beta (0 drops C), C of every shape that broadcasts
 * (scalar, [N], [1,N], [M,1], [M,N]); a [M,1] C scaled by beta != 1 stays on the
 * reference; a mostly-zero constant B (transB read through strides). */
static void test_gemm_family(void)
{
#define G(ta, tb, alpha, beta, rc, c0, c1, konst, zeros, sparse, expect)                        \
    {KILN_OP_Gemm, 2, 2, {(ta) ? 16 : 15, (ta) ? 15 : 16}, {(tb) ? 17 : 16, (tb) ? 16 : 17},    \
     ta, tb, alpha, beta, rc, {c0, c1}, konst, false, NULL, 0, 0, zeros, sparse, expect, 0}
    static const struct mm_spec gc[] = {
        G(0, 0, 1.0f, 1.0f, 1, 17, 0, true, 0, NULL, 1),
        G(0, 1, 1.0f, 1.0f, 1, 17, 0, true, 0, NULL, 1),
        G(1, 0, 0.5f, 1.0f, 2, 1, 17, true, 0, NULL, 1),
        G(1, 1, 2.0f, 1.0f, -1, 0, 0, false, 0, NULL, 1),
        G(0, 1, 1.0f, 0.5f, 2, 15, 17, true, 0, NULL, 1),
        G(0, 0, 1.5f, 1.0f, 2, 15, 17, false, 0, NULL, 1),
        G(1, 0, 1.0f, -2.0f, 2, 15, 17, false, 0, NULL, 1),
        G(0, 1, 1.0f, 1.0f, 2, 15, 1, true, 0, NULL, -1),
        G(0, 1, 1.0f, 0.5f, 2, 15, 1, true, 0, NULL, 0),
        G(0, 0, 1.0f, 1.0f, 0, 0, 0, true, 0, NULL, 1),
        G(0, 0, 0.75f, 0.0f, 1, 17, 0, true, 0, NULL, 1),
        G(1, 1, 1.0f, 1.0f, 1, 17, 0, false, 0, NULL, 1),
        G(0, 1, 1.0f, 1.0f, 1, 17, 0, true, 0.8, NULL, 1),
        G(0, 1, 0.5f, 1.0f, 1, 17, 0, true, 0.8, "force", 1),
        G(0, 0, 1.0f, 1.0f, -1, 0, 0, true, 0.7, "force", 1),
        G(1, 0, 1.0f, 1.0f, 1, 17, 0, true, 0.8, "force", 1), /* transA: oneDNN's */
    };
#undef G
    for (size_t i = 0; i < sizeof gc / sizeof gc[0]; i++) mm_case(&gc[i], "");
    /* larger, for two threads */
    struct mm_spec big = {KILN_OP_Gemm, 2, 2, {96, 64}, {128, 64}, 0, 1, 1, 1, 1, {128}, true,
                          false, NULL, 0, 0, 0, NULL, 1, 0};
    mm_case(&big, "");
    for (int prec = 1; prec <= 2; prec++) { /* bf16 and int8 plans: alpha, transB, C [N] */
        struct mm_spec lp = {KILN_OP_Gemm, 2, 2, {24, 64}, {40, 64}, 0, 1, 0.5f, 1, 1, {40}, true,
                             false, NULL, 0, 0, 0, NULL, 1, prec};
        mm_case(&lp, "");
    }
}

/* A few rows by a constant B (simd/skinny.c, taken before oneDNN's product): every row
 * count to KILN_SKINNY_MATMUL_MAX_M (the tiles of 4 or 8 rows and their rests), N not a
 * multiple of a panel (24 or 48 columns) and below one, a long k (read as four streams and a
 * rest, or one), transB, alpha, bias, Sum,
 * activations, Gemm's beta 0, A's batch dims folded into rows; the choice runs the kernel.
 * Rows past that to KILN_SKINNY_MAX_M + 1 (the kernel's 16-row tiles are the convolutions'
 * and pointwise.c's, tested with them), a B that is not constant, and KILN_SKINNY=0 run
 * oneDNN's. */
static void test_skinny_products(void)
{
#define S(op, ra, a0, a1, k, n, tb, alpha, beta, bias, sum, act)                                      {op, ra, 2, {a0, (ra) == 2 ? (k) : (a1), k}, {(tb) ? (n) : (k), (tb) ? (k) : (n)}, 0, tb,          alpha, beta, (bias) ? 1 : -1, {n}, true, sum, act, 0, 0, 0, NULL, 1, 0}
    for (int64_t m = 1; m <= KILN_SKINNY_MAX_M + 1; m++) {
        /* k of 37 (one stream) or 131 (four streams of 32 and a rest of 3, skinny_body.h) */
        struct mm_spec s = S(KILN_OP_MatMul, 2, m, 0, m % 2 ? 37 : 131, m % 3 ? 97 : 48, 0, 1.0f,
                             1.0f, 0, 0, NULL);
        mm_want_kernel = m <= KILN_SKINNY_MATMUL_MAX_M ? "skinny" : "dnnl";
        mm_case(&s, "");
    }
    const struct mm_spec sc[] = {
        S(KILN_OP_Gemm, 2, 4, 0, 300, 10, 1, 0.5f, 1.0f, 1, 0, NULL),
        S(KILN_OP_Gemm, 2, 1, 0, 64, 1000, 1, 1.0f, 1.0f, 1, 0, NULL),
        S(KILN_OP_Gemm, 2, 3, 0, 64, 50, 0, 1.0f, 0.0f, 1, 0, NULL),
        S(KILN_OP_KilnFusedMatMul, 3, 2, 3, 96, 130, 0, 1.0f, 1.0f, 1, 1, "Gelu"),
        S(KILN_OP_KilnFusedMatMul, 3, 1, 4, 64, 3, 1, 2.0f, 1.0f, 1, 0, "Relu"),
        S(KILN_OP_KilnFusedMatMul, 2, 8, 0, 33, 71, 0, 1.0f, 1.0f, 0, 1, "HardSwish"),
        S(KILN_OP_KilnFusedMatMul, 2, 5, 0, 40, 49, 1, 1.0f, 1.0f, 1, 1, "Clip"),
        S(KILN_OP_KilnFusedMatMul, 3, 2, 2, 24, 24, 0, 1.0f, 1.0f, 1, 0, "Sigmoid"),
    };
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) {
        struct mm_spec s = sc[i];
        if (s.act && !strcmp(s.act, "Clip")) s.act_alpha = -0.5f, s.act_beta = 0.75f;
        mm_want_kernel = "skinny";
        mm_case(&s, "");
    }
    mm_want_kernel = "dnnl";
    struct mm_spec var = S(KILN_OP_MatMul, 2, 4, 0, 37, 97, 0, 1.0f, 1.0f, 0, 0, NULL);
    var.b_const = false;
    mm_case(&var, "");
    setenv("KILN_SKINNY", "0", 1);
    struct mm_spec off = S(KILN_OP_MatMul, 2, 4, 0, 37, 97, 0, 1.0f, 1.0f, 0, 0, NULL);
    mm_case(&off, " KILN_SKINNY=0");
    unsetenv("KILN_SKINNY");
    mm_want_kernel = NULL;
#undef S
}

/* KilnFusedMatMul: bias, residual Sum, every activation oneDNN fuses, transposes, batched;
 * sparse candidates with Relu (and a Sum, which the sparse kernel declines). */
static void test_fused_matmul_family(void)
{
#define F(ra, a0, a1, a2, k, n, ta, tb, bias, sum, konst, alpha, act, aa, ab, zeros, sparse)      \
    {KILN_OP_KilnFusedMatMul, ra, 2,                                                              \
     {(ra) == 2 && (ta) ? (a1) : (a0), (ra) == 2 && (ta) ? (a0) : (ra) == 3 && (ta) ? (a2) : (a1), \
      (ra) == 3 && (ta) ? (a1) : (a2)},                                                           \
     {(tb) ? (n) : (k), (tb) ? (k) : (n)}, ta, tb, alpha, 1, (bias) ? 1 : -1, {n}, konst, sum,   \
     act, aa, ab, zeros, sparse, 1, 0}
    static const struct mm_spec fc[] = {
        F(3, 2, 5, 16, 16, 33, 0, 0, 1, 0, 1, 1.0f, "Gelu", 0, 0, 0, NULL),
        F(3, 2, 5, 17, 17, 16, 0, 1, 1, 1, 1, 1.0f, "", 0, 0, 0, NULL),
        F(2, 65, 16, 0, 16, 15, 0, 0, 1, 0, 1, 0.5f, "Relu", 0, 0, 0, NULL),
        F(2, 1, 16, 0, 16, 17, 1, 0, 0, 1, 0, 2.0f, "Tanh", 0, 0, 0, NULL),
        F(3, 3, 4, 8, 8, 8, 0, 0, 1, 1, 0, 1.0f, "GeluTanh", 0, 0, 0, NULL),
        F(2, 15, 16, 0, 16, 16, 0, 1, 1, 0, 1, 1.0f, "Sigmoid", 0, 0, 0, NULL),
        F(3, 2, 7, 16, 16, 31, 0, 0, 1, 0, 1, 1.0f, "LeakyRelu", 0.1f, 0, 0, NULL),
        F(2, 17, 15, 0, 15, 32, 0, 1, 1, 1, 1, 1.0f, "Clip", 0.0f, 6.0f, 0, NULL),
        F(2, 16, 16, 0, 16, 16, 0, 0, 0, 0, 1, 1.0f, "Clip", -0.5f, 0.25f, 0, NULL),
        F(3, 2, 3, 33, 33, 17, 0, 0, 1, 1, 1, 1.0f, "HardSwish", 0, 0, 0, NULL),
        F(2, 9, 16, 0, 16, 48, 0, 0, 1, 0, 1, 1.0f, "HardSigmoid", 0.25f, 0.4f, 0, NULL),
        F(3, 1, 1, 16, 16, 16, 0, 1, 1, 0, 1, 1.0f, "SiLU", 0, 0, 0, NULL),
        F(2, 64, 32, 0, 32, 64, 0, 0, 1, 1, 1, 1.0f, "SiLU", 0, 0, 0, NULL),
        F(2, 64, 64, 0, 64, 48, 0, 0, 1, 0, 1, 1.0f, "Relu", 0, 0, 0.8, NULL),
        F(3, 2, 9, 64, 64, 40, 0, 1, 1, 0, 1, 1.0f, "Relu", 0, 0, 0.75, "force"),
        F(2, 20, 32, 0, 32, 24, 0, 0, 0, 0, 1, 0.5f, "", 0, 0, 0.8, "force"),
        F(2, 20, 32, 0, 32, 24, 0, 0, 1, 1, 1, 1.0f, "Relu", 0, 0, 0.8, "force"), /* Sum: dense */
    };
    /* bf16 and int8 plans: bias, Sum and activations as post-ops */
    const struct mm_spec lowp[] = {
        F(3, 2, 9, 64, 64, 40, 0, 0, 1, 1, 1, 1.0f, "Gelu", 0, 0, 0, NULL),
        F(2, 33, 64, 0, 64, 48, 0, 1, 1, 0, 1, 1.0f, "Relu", 0, 0, 0, NULL),
        F(2, 40, 64, 0, 64, 32, 0, 0, 1, 0, 1, 1.0f, "GeluTanh", 0, 0, 0, NULL),
    };
#undef F
    for (size_t i = 0; i < sizeof fc / sizeof fc[0]; i++) mm_case(&fc[i], "");
    for (int prec = 1; prec <= 2; prec++)
        for (size_t i = 0; i < sizeof lowp / sizeof lowp[0]; i++) {
            struct mm_spec lp = lowp[i];
            lp.prec = prec;
            mm_case(&lp, "");
        }
    test_skinny_products();
}

/* ---- Transposed convolutions (dnnl/deconv.def) ---- */

struct deconv_spec {
    int nsp;                   /* spatial dims: 1, 2 or 3 */
    int64_t n, c, m, sp, k;    /* batch, in / out channels, input size, kernel size */
    int64_t group, stride, dil;
    int64_t pad_b, pad_e, opad; /* pads (begin, end) and output_padding, every dim */
    const char *auto_pad;      /* NULL = explicit pads */
    int64_t out_shape;         /* > 0: the output_shape attribute (every dim) */
    int bias;
    const char *act;           /* KilnFusedConvTranspose's activation */
    float act_alpha, act_beta;
};

static void deconv_case(bool fused, const struct deconv_spec *k, bool w_const)
{
    struct case_node c;
    cn_init(&c, fused ? KILN_OP_KilnFusedConvTranspose : KILN_OP_ConvTranspose, 13,
            k->bias ? 3 : 2, 1);
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
    cn_input(&c, 0, rand_f32(rank, xd, 1.0f), false);
    cn_input(&c, 1, rand_f32(rank, wd, 0.3f), w_const);
    if (k->bias) cn_input(&c, 2, rand_f32(1, &k->m, 1.0f), true);
    attr_ints(&c, "strides", st, k->nsp);
    attr_ints(&c, "dilations", dl, k->nsp);
    attr_ints(&c, "kernel_shape", ks, k->nsp);
    attr_int(&c, "group", k->group);
    if (k->opad) attr_ints(&c, "output_padding", op, k->nsp);
    if (k->auto_pad) attr_str(&c, "auto_pad", k->auto_pad);
    else attr_ints(&c, "pads", pads, 2 * k->nsp);
    if (k->out_shape > 0) attr_ints(&c, "output_shape", os, k->nsp);
    const char *act = fused ? (k->act ? k->act : "Relu") : NULL;
    if (act) {
        attr_str(&c, "activation", act);
        if (k->act_alpha != 0 || k->act_beta != 0) {
            attr_float(&c, "act_alpha", k->act_alpha);
            attr_float(&c, "act_beta", k->act_beta);
        }
    }
    char label[224], sx[64], sw[64];
    snprintf(label, sizeof label,
             "%s %s * %s group %lld stride %lld dilation %lld pads %lld,%lld output_padding %lld"
             "%s%s output_shape %lld%s%s%s%s",
             fused ? "KilnFusedConvTranspose" : "ConvTranspose", kiln_shape_str(rank, xd, sx, 64),
             kiln_shape_str(rank, wd, sw, 64), (long long)k->group, (long long)k->stride,
             (long long)k->dil, (long long)k->pad_b, (long long)k->pad_e, (long long)k->opad,
             k->auto_pad ? " auto_pad " : "", k->auto_pad ? k->auto_pad : "",
             (long long)k->out_shape, k->bias ? " bias" : "", act ? " " : "", act ? act : "",
             w_const ? "" : " (runtime weights)");
    check_case(&c, label, 1e-4, 1e-4, 1);
    cn_free(&c);
}

/* A grid over ConvTranspose's parameters: 1-D, 2-D and 3-D; groups (depthwise included);
 * strides 1 to 3; dilations; symmetric, asymmetric and zero pads; output_padding; auto_pad
 * SAME_UPPER, SAME_LOWER and VALID; output_shape; with and without bias; channel counts
 * below, at and above the vector widths; weights constant (packed) and graph inputs (read
 * in place through strides). Fused: the same with an activation (Relu, or the case's). */
static void deconv_cases(bool fused)
{
    static const struct deconv_spec cases[] = {
        {2, 1, 3, 16, 5, 3, 1, 1, 1, 0, 0, 0, NULL, 0, 1, NULL, 0, 0},
        {2, 2, 16, 8, 7, 4, 1, 2, 1, 1, 1, 0, NULL, 0, 1, NULL, 0, 0}, /* UNet 2x up: k4 s2 p1 */
        {2, 1, 32, 16, 6, 2, 1, 2, 1, 0, 0, 0, NULL, 0, 0, NULL, 0, 0}, /* k2 s2 */
        {2, 1, 17, 33, 5, 3, 1, 2, 1, 1, 1, 1, NULL, 0, 1, NULL, 0, 0}, /* output_padding */
        {2, 1, 15, 17, 4, 3, 1, 3, 2, 0, 2, 2, NULL, 0, 1, NULL, 0, 0}, /* dilation, asymmetric */
        {2, 2, 16, 32, 5, 3, 2, 2, 1, 1, 0, 0, NULL, 0, 1, NULL, 0, 0}, /* groups */
        {2, 1, 16, 16, 6, 3, 16, 1, 1, 1, 1, 0, NULL, 0, 1, "Clip", 0.0f, 6.0f}, /* depthwise */
        {2, 1, 8, 8, 5, 3, 1, 2, 1, 0, 0, 0, "SAME_UPPER", 0, 1, "LeakyRelu", 0.1f, 0},
        {2, 1, 8, 12, 5, 4, 1, 2, 1, 0, 0, 0, "SAME_LOWER", 0, 0, "Sigmoid", 0, 0},
        {2, 1, 8, 4, 5, 3, 1, 2, 1, 0, 0, 0, "VALID", 0, 1, NULL, 0, 0},
        {2, 1, 6, 6, 4, 3, 1, 2, 1, 0, 0, 0, NULL, 10, 1, NULL, 0, 0}, /* output_shape */
        {1, 2, 16, 24, 9, 5, 1, 2, 1, 2, 2, 1, NULL, 0, 1, "Tanh", 0, 0}, /* 1-D */
        {1, 1, 4, 6, 7, 3, 2, 3, 2, 0, 1, 0, NULL, 0, 0, NULL, 0, 0},
        {3, 1, 8, 8, 3, 3, 1, 2, 1, 1, 1, 1, NULL, 0, 1, "SiLU", 0, 0}, /* 3-D */
        {3, 1, 4, 6, 3, 2, 2, 2, 1, 0, 0, 0, NULL, 0, 1, NULL, 0, 0},
        {2, 1, 64, 32, 16, 4, 1, 2, 1, 1, 1, 0, NULL, 0, 1, NULL, 0, 0}, /* for 2 threads */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        deconv_case(fused, &cases[i], true);
        if (i % 3 == 0) deconv_case(fused, &cases[i], false);
    }
    /* 2-D, as the layout pass stores them: X blocked, Y blocked or plain; the upsamplings
     * of UNets and decoders (k2 s2, k3 s2 with output_padding, k4 s2 p1), channel counts
     * off the block, a Sigmoid (non-zero at 0: padding lanes) */
    static const struct deconv_spec blocked[] = {
        {2, 1, 64, 32, 6, 2, 1, 2, 1, 0, 0, 0, NULL, 0, 1, NULL, 0, 0},
        {2, 2, 32, 16, 7, 3, 1, 2, 1, 1, 1, 1, NULL, 0, 1, NULL, 0, 0},
        {2, 1, 24, 12, 5, 4, 1, 2, 1, 1, 1, 0, NULL, 0, 1, "Sigmoid", 0, 0},
        {2, 1, 16, 20, 5, 3, 1, 3, 1, 0, 2, 0, NULL, 0, 0, "Tanh", 0, 0},
    };
    for (int b = 8; b <= 16; b += 8)
        for (int plain_out = 0; plain_out <= 1; plain_out++) {
            case_layout = b;
            case_layout_out = plain_out ? 0 : -1;
            for (size_t i = 0; i < sizeof blocked / sizeof blocked[0]; i++)
                deconv_case(fused, &blocked[i], true);
            case_layout = 0;
            case_layout_out = -1;
        }
}

/* ---- Quantized ops (dnnl/qlinear.def) ---- */

/* A tensor of dt with uniform integers in [lo, hi] (or all v when lo == hi). */
static kiln_tensor *tensor_ints(kiln_dtype dt, int rank, const int64_t *dims, int lo, int hi)
{
    kiln_tensor *t;
    if (kiln_tensor_new(dt, rank, dims, &t) != KILN_OK) abort();
    for (int64_t i = 0; i < kiln_tensor_count(t); i++)
        kiln_set_i64(dt, t->data, i, lo + (int64_t)(rng_next() % (uint64_t)(hi - lo + 1)));
    return t;
}

static kiln_tensor *scalar_of(kiln_dtype dt, double v)
{
    kiln_tensor *t;
    if (kiln_tensor_new(dt, 0, NULL, &t) != KILN_OK) abort();
    kiln_set_f64(dt, t->data, 0, v);
    return t;
}

/* Per-channel weight scales: powers of two (2^-5, 2^-6, 2^-7, ...), so every product
 * acc * x_scale * w_scale / y_scale is exact in float and double alike and both sides
 * round the same value (half to even; y's zero points are even, so adding them after
 * rounding, as the reference does, or before, changes nothing). */
static kiln_tensor *pow2_scales(int64_t n)
{
    kiln_tensor *t = tensor_f32(n > 0 ? 1 : 0, &n);
    for (int64_t i = 0; i < (n > 0 ? n : 1); i++)
        ((float *)t->data)[i] = ldexpf(1.0f, -5 - (int)(i % 3));
    return t;
}

struct q_spec {
    enum kiln_op op;
    int rx;
    int64_t x[4], w[4];   /* x's shape; w: [K, N] products, [M, C/g, kh, kw] convolutions */
    bool x_signed, y_signed;
    int x_zp;             /* x's zero point (0: none given for the Integer ops) */
    bool x_zp_runtime;    /* Integer ops: x's zero point a graph input */
    bool per_channel;     /* one weight scale per output channel */
    bool bias;            /* QLinearConv / KilnQLinearMatMul: int32 bias */
    int w_zp;             /* the weights' zero point (!= 0: declined) */
    int64_t group, pad, stride;
    int expect;
};


/* The quantized family needs int8 dot products (families.c, INT8_DOT): on a CPU without
 * them (AVX2 only) its kernels must decline, and the reference runs the node. */
static int q_expect(int expect)
{
    return expect == 1 && !kiln_kernel_isa_ok(KILN_KISA_INT8_DOT) ? 0 : expect;
}

static void q_case(const struct q_spec *q)
{
    enum kiln_op op = q->op;
    bool conv = op == KILN_OP_QLinearConv || op == KILN_OP_ConvInteger;
    bool qlin = op != KILN_OP_MatMulInteger && op != KILN_OP_ConvInteger;
    int n_in = op == KILN_OP_QLinearConv || op == KILN_OP_KilnQLinearMatMul ? (q->bias ? 9 : 8)
               : qlin ? 8 : 4;
    struct case_node c;
    cn_init(&c, op, op == KILN_OP_KilnQLinearMatMul ? 1 : 10, n_in, 1);
    kiln_dtype xdt = q->x_signed ? KILN_DTYPE_I8 : KILN_DTYPE_U8;
    kiln_dtype ydt = q->y_signed ? KILN_DTYPE_I8 : KILN_DTYPE_U8;
    int wr = conv ? 4 : 2;
    int64_t nout = conv ? q->w[0] : q->w[1];
    kiln_tensor *x = tensor_ints(xdt, q->rx, q->x, q->x_signed ? -128 : 0, q->x_signed ? 127 : 255);
    kiln_tensor *w = tensor_ints(KILN_DTYPE_I8, wr, q->w, -127, 127);
    kiln_tensor *wzp = q->per_channel ? tensor_ints(KILN_DTYPE_I8, 1, &nout, q->w_zp, q->w_zp)
                                      : scalar_of(KILN_DTYPE_I8, q->w_zp);
    kiln_tensor *xzp = scalar_of(xdt, q->x_zp);
    if (conv) {
        attr_int(&c, "group", q->group);
        int64_t pads[4] = {q->pad, q->pad, q->pad, q->pad}, st[2] = {q->stride, q->stride};
        attr_ints(&c, "pads", pads, 4);
        attr_ints(&c, "strides", st, 2);
    }
    if (qlin) {
        cn_input(&c, 0, x, false);
        cn_input(&c, 1, scalar_of(KILN_DTYPE_F32, 1.0 / 16), true);
        cn_input(&c, 2, xzp, true);
        cn_input(&c, 3, w, true);
        cn_input(&c, 4, pow2_scales(q->per_channel ? nout : 0), true);
        cn_input(&c, 5, wzp, true);
        cn_input(&c, 6, scalar_of(KILN_DTYPE_F32, 16.0), true);
        cn_input(&c, 7, scalar_of(ydt, q->y_signed ? -4 : 128), true);
        if (n_in > 8) cn_input(&c, 8, tensor_ints(KILN_DTYPE_I32, 1, &nout, -20000, 20000), true);
    } else {
        cn_input(&c, 0, x, false);
        cn_input(&c, 1, w, true);
        if (q->x_zp || q->x_zp_runtime) cn_input(&c, 2, xzp, !q->x_zp_runtime);
        else {
            kiln_tensor_free(xzp);
            cn_input(&c, 2, NULL, false);
        }
        cn_input(&c, 3, wzp, true);
    }
    char label[224], sx[64], sw[64];
    snprintf(label, sizeof label,
             "%s %s %s x %s x_zp %d%s%s%s w_zp %d%s group %lld pad %lld stride %lld",
             kiln_op_name(op), q->x_signed ? "s8" : "u8", kiln_shape_str(q->rx, q->x, sx, 64),
             kiln_shape_str(wr, q->w, sw, 64), q->x_zp, q->x_zp_runtime ? " (runtime)" : "",
             q->per_channel ? " per-channel" : "", q->bias ? " bias" : "", q->w_zp,
             qlin ? (q->y_signed ? " -> s8" : " -> u8") : " -> s32", (long long)q->group,
             (long long)q->pad, (long long)q->stride);
    check_case(&c, label, 0, 0, q_expect(q->expect));
    cn_free(&c);
}

#define QMM(op, rx, x0, x1, x2, k, n, xs, ys, xzp, rt, pc, bias, wzp, expect)                    \
    {op, rx, {x0, x1, x2}, {k, n}, xs, ys, xzp, rt, pc, bias, wzp, 1, 0, 1, expect}
#define QCV(op, n, c, h, m, kk, xs, ys, xzp, pc, bias, wzp, group, pad, stride, expect)           \
    {op, 4, {n, c, h, h + 1}, {m, (c) / (group), kk, kk}, xs, ys, xzp, false, pc, bias, wzp,   \
     group, pad, stride, expect}

/* Products: 2-D and batched A (leading dims are rows), u8 and s8 A and Y, scalar and
 * per-column weight scales, x zero points 0 and not, K and N around the vector widths,
 * one product large enough for two threads; nonzero weight zero points are declined. */
static void qmatmul_cases(enum kiln_op op)
{
    bool b = op == KILN_OP_KilnQLinearMatMul;
    const struct q_spec cases[] = {
        QMM(op, 2, 1, 16, 0, 16, 16, false, false, 128, false, false, b, 0, 1),
        QMM(op, 2, 17, 33, 0, 33, 15, false, false, 3, false, true, b, 0, 1),
        QMM(op, 3, 2, 5, 64, 64, 40, false, true, 0, false, true, false, 0, 1),
        QMM(op, 2, 9, 31, 0, 31, 65, true, true, -7, false, false, b, 0, 1),
        QMM(op, 3, 4, 16, 64, 64, 64, false, false, 120, false, true, b, 0, 1),
        QMM(op, 2, 5, 16, 0, 16, 8, false, false, 128, false, false, false, 3, 0),
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) q_case(&cases[i]);
}

static void qconv_cases(enum kiln_op op)
{
    bool b = op == KILN_OP_QLinearConv;
    const struct q_spec cases[] = {
        QCV(op, 1, 8, 9, 16, 3, false, false, 128, false, b, 0, 1, 1, 1, 1),
        QCV(op, 2, 16, 7, 8, 1, false, true, 5, true, b, 0, 1, 0, 1, 1),
        QCV(op, 1, 16, 8, 16, 3, false, false, 128, true, false, 0, 16, 1, 2, 1), /* depthwise */
        QCV(op, 2, 32, 6, 32, 3, false, false, 3, true, b, 0, 2, 1, 1, 1),     /* groups */
        /* 3 channels a group: oneDNN's int8 kernels leave it to its reference code (declined) */
        QCV(op, 2, 12, 6, 8, 3, false, false, 3, false, b, 0, 4, 1, 1, -1),
        QCV(op, 2, 12, 6, 8, 3, true, true, -3, false, b, 0, 1, 1, 1, 1),       /* s8 x */
        QCV(op, 2, 12, 6, 8, 3, true, false, -3, false, b, 0, 4, 1, 1, -1),     /* s8 x, groups */
        QCV(op, 1, 32, 14, 32, 3, false, false, 100, true, b, 0, 1, 1, 1, 1),   /* 2 threads */
        QCV(op, 1, 8, 5, 8, 3, false, false, 128, false, false, 2, 1, 1, 1, 0), /* w_zp: declined */
        /* 1x1 on few pixels with a tail of output channels (40, 24: not whole blocks of 16),
         * MobileNetV3's projections: oneDNN 2.6's AMX 1x1 kernel got them wrong and wrote past
         * its output (dnnl_common.c, kd_pd_denied) */
        {op, 4, {1, 96, 6, 6}, {40, 96, 1, 1}, false, false, 7, false, true, b, 0, 1, 0, 1, 1},
        {op, 4, {3, 96, 6, 6}, {24, 96, 1, 1}, false, false, 7, false, true, b, 0, 1, 0, 1, 1},
        {op, 4, {2, 240, 6, 6}, {40, 240, 1, 1}, false, false, 100, false, true, b, 0, 1, 0, 1, 1},
        QCV(op, 1, 96, 5, 40, 1, false, false, 7, true, b, 0, 1, 0, 1, 1),
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) q_case(&cases[i]);
}

/* KilnQLinearConvAdd (src/opt/qconv_sum.c): the convolution's output a (scale 16, zero point
 * 128 / -4) plus b, requantized to y, with power-of-two scales so that oneDNN's sum post-op
 * chain (dnnl/qlinear.c) is exact and must equal the reference bit for bit; u8 and s8, zero
 * points that differ, Relu or not, depthwise, strides, a tail of channels, two threads. */
static void qconv_add_case(int64_t n, int64_t ch, int64_t h, int64_t m, int64_t kk, bool sgn,
                           int bzp, int yzp, bool relu, int64_t group, int64_t pad, int64_t stride,
                           bool bias)
{
    enum kiln_op op = KILN_OP_KilnQLinearConvAdd;
    struct case_node c;
    cn_init(&c, op, 1, 14, 1);
    kiln_dtype dt = sgn ? KILN_DTYPE_I8 : KILN_DTYPE_U8;
    int lo = sgn ? -128 : 0, hi = sgn ? 127 : 255;
    int64_t xd[4] = {n, ch, h, h + 1}, wd[4] = {m, ch / group, kk, kk};
    int64_t yd[4] = {n, m, (h + 2 * pad - kk) / stride + 1, (h + 1 + 2 * pad - kk) / stride + 1};
    attr_int(&c, "group", group);
    int64_t pads[4] = {pad, pad, pad, pad}, st[2] = {stride, stride};
    attr_ints(&c, "pads", pads, 4);
    attr_ints(&c, "strides", st, 2);
    if (relu) attr_str(&c, "activation", "Relu");
    cn_input(&c, 0, tensor_ints(dt, 4, xd, lo, hi), false);
    cn_input(&c, 1, scalar_of(KILN_DTYPE_F32, 1.0 / 16), true);
    cn_input(&c, 2, scalar_of(dt, sgn ? -3 : 100), true);
    cn_input(&c, 3, tensor_ints(KILN_DTYPE_I8, 4, wd, -127, 127), true);
    cn_input(&c, 4, pow2_scales(m), true);
    cn_input(&c, 5, scalar_of(KILN_DTYPE_I8, 0), true);
    cn_input(&c, 6, scalar_of(KILN_DTYPE_F32, 16.0), true);
    cn_input(&c, 7, scalar_of(dt, sgn ? -4 : 128), true);
    cn_input(&c, 8, bias ? tensor_ints(KILN_DTYPE_I32, 1, &m, -20000, 20000) : NULL, bias);
    cn_input(&c, 9, tensor_ints(dt, 4, yd, lo, hi), false);
    cn_input(&c, 10, scalar_of(KILN_DTYPE_F32, 8.0), true);
    cn_input(&c, 11, scalar_of(dt, bzp), true);
    cn_input(&c, 12, scalar_of(KILN_DTYPE_F32, 32.0), true);
    cn_input(&c, 13, scalar_of(dt, yzp), true);
    char label[176];
    snprintf(label, sizeof label,
             "KilnQLinearConvAdd %s n %lld c %lld h %lld m %lld k %lld b_zp %d y_zp %d%s group %lld "
             "pad %lld stride %lld%s", sgn ? "s8" : "u8", (long long)n, (long long)ch, (long long)h,
             (long long)m, (long long)kk, bzp, yzp, relu ? " Relu" : "", (long long)group,
             (long long)pad, (long long)stride, bias ? " bias" : "");
    check_case(&c, label, 0, 0, q_expect(1));
    cn_free(&c);
}

static void qconv_add_cases(void)
{
    qconv_add_case(1, 16, 8, 16, 1, false, 7, 12, true, 1, 0, 1, true);
    qconv_add_case(2, 16, 7, 24, 3, false, 131, 3, false, 1, 1, 1, true);
    qconv_add_case(1, 16, 9, 16, 3, false, 128, 0, true, 16, 1, 2, true); /* depthwise, stride 2 */
    qconv_add_case(2, 32, 6, 40, 1, true, -5, 9, false, 1, 0, 1, true);  /* s8 */
    qconv_add_case(1, 32, 14, 32, 3, true, 0, -128, true, 1, 1, 1, true); /* 2 threads */
    qconv_add_case(1, 16, 5, 16, 1, false, 3, 250, false, 1, 0, 1, false); /* no bias */
}

static void integer_matmul_cases(void)
{
    const struct q_spec cases[] = {
        QMM(KILN_OP_MatMulInteger, 2, 7, 16, 0, 16, 17, false, false, 128, false, false, false, 0, 1),
        QMM(KILN_OP_MatMulInteger, 3, 2, 9, 64, 64, 33, false, false, 0, false, false, false, 0, 1),
        QMM(KILN_OP_MatMulInteger, 2, 33, 48, 0, 48, 16, true, false, -5, false, false, false, 0, 1),
        /* x's zero point a run-time scalar (DynamicQuantizeLinear's) */
        QMM(KILN_OP_MatMulInteger, 2, 15, 32, 0, 32, 31, false, false, 77, true, false, false, 0, 1),
        QMM(KILN_OP_MatMulInteger, 2, 4, 16, 0, 16, 8, false, false, 1, false, true, false, 2, 0),
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) q_case(&cases[i]);
}
#undef QMM
#undef QCV

/* ---- The 8-bit family (simd/quant8.def): Q, DQ, KilnQLinearAdd, KilnLut8* ---- */

/* x float32 of dims: normal values times 40 (past the 8-bit range after most scales),
 * with NaN, +-inf and exact halves (round half to even) when specials is set. */
static kiln_tensor *q8_floats(int rank, const int64_t *dims, bool specials)
{
    kiln_tensor *x = tensor_f32(rank, dims);
    float *p = x->data;
    size_t n = x->nbytes / 4;
    for (size_t i = 0; i < n; i++) p[i] = 40.0f * rng_normal();
    if (specials && n > 8) {
        p[1] = NAN;
        p[2] = INFINITY;
        p[3] = -INFINITY;
        p[4] = 2.5f; /* with scale 1: halves round to even */
        p[5] = -3.5f;
        p[6] = 1e30f;
    }
    return x;
}

static void quantize8_case(kiln_dtype q, int rank, const int64_t *dims, float scale, int zp,
                           bool with_zp, bool specials, int expect)
{
    struct case_node c;
    cn_init(&c, KILN_OP_QuantizeLinear, 13, with_zp ? 3 : 2, 1);
    cn_input(&c, 0, q8_floats(rank, dims, specials), false);
    cn_input(&c, 1, scalar_of(KILN_DTYPE_F32, scale), true);
    if (with_zp) cn_input(&c, 2, scalar_of(q, zp), true);
    char label[128], sd[64];
    snprintf(label, sizeof label, "QuantizeLinear %s to %s scale %g zp %d%s",
             kiln_shape_str(rank, dims, sd, 64), kiln_dtype_name(q), (double)scale, zp,
             specials ? " specials" : "");
    check_case(&c, label, 0, 0, expect);
    cn_free(&c);
}

static void test_quantize8(void)
{
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s], d1[1] = {n}, d3[3] = {2, 3, n};
        quantize8_case(KILN_DTYPE_U8, 1, d1, 0.5f, 128, true, false, 1);
        quantize8_case(KILN_DTYPE_I8, 3, d3, 0.37f, -3, true, false, 1);
        quantize8_case(KILN_DTYPE_U8, 3, d3, 1.0f, 0, false, true, 1);
        quantize8_case(KILN_DTYPE_I8, 3, d3, 1.0f, 5, true, true, 1);
    }
    int64_t big[2] = {300, 1000};
    quantize8_case(KILN_DTYPE_U8, 2, big, 0.21f, 17, true, false, 1); /* threaded */
    /* per-axis scales stay on the reference kernel */
    int64_t d[2] = {3, 20}, three = 3;
    struct case_node c;
    cn_init(&c, KILN_OP_QuantizeLinear, 13, 3, 1);
    attr_int(&c, "axis", 0);
    cn_input(&c, 0, q8_floats(2, d, false), false);
    kiln_tensor *sc = tensor_f32(1, &three);
    for (int i = 0; i < 3; i++) ((float *)sc->data)[i] = 0.5f + (float)i;
    cn_input(&c, 1, sc, true);
    cn_input(&c, 2, tensor_ints(KILN_DTYPE_U8, 1, &three, 0, 255), true);
    check_case(&c, "QuantizeLinear per-axis (declined)", 0, 0, 0);
    cn_free(&c);
}

static void dequantize8_case(kiln_dtype q, int rank, const int64_t *dims, float scale, int zp,
                             bool with_zp)
{
    struct case_node c;
    cn_init(&c, KILN_OP_DequantizeLinear, 13, with_zp ? 3 : 2, 1);
    cn_input(&c, 0, tensor_ints(q, rank, dims, q == KILN_DTYPE_U8 ? 0 : -128,
                                q == KILN_DTYPE_U8 ? 255 : 127), false);
    cn_input(&c, 1, scalar_of(KILN_DTYPE_F32, scale), true);
    if (with_zp) cn_input(&c, 2, scalar_of(q, zp), true);
    char label[128], sd[64];
    snprintf(label, sizeof label, "DequantizeLinear %s %s scale %g zp %d",
             kiln_shape_str(rank, dims, sd, 64), kiln_dtype_name(q), (double)scale, zp);
    check_case(&c, label, 0, 0, 1);
    cn_free(&c);
}

static void test_dequantize8(void)
{
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s], d1[1] = {n}, d3[3] = {2, 3, n};
        dequantize8_case(KILN_DTYPE_U8, 1, d1, 0.5f, 128, true);
        dequantize8_case(KILN_DTYPE_I8, 3, d3, 0.037f, -3, true);
        dequantize8_case(KILN_DTYPE_U8, 3, d3, 3.0f, 0, false);
    }
    int64_t big[2] = {300, 1000};
    dequantize8_case(KILN_DTYPE_I8, 2, big, 0.013f, 4, true);
}

static void qlinear_add8_case(kiln_dtype q, int rank, const int64_t *dims, bool relu)
{
    struct case_node c;
    cn_init(&c, KILN_OP_KilnQLinearAdd, 1, 8, 1);
    if (relu) attr_str(&c, "activation", "Relu");
    int lo = q == KILN_DTYPE_U8 ? 0 : -128, hi = q == KILN_DTYPE_U8 ? 255 : 127;
    cn_input(&c, 0, tensor_ints(q, rank, dims, lo, hi), false);
    cn_input(&c, 1, scalar_of(KILN_DTYPE_F32, 0.05), true);
    cn_input(&c, 2, scalar_of(q, q == KILN_DTYPE_U8 ? 120 : -2), true);
    cn_input(&c, 3, tensor_ints(q, rank, dims, lo, hi), false);
    cn_input(&c, 4, scalar_of(KILN_DTYPE_F32, 0.031), true);
    cn_input(&c, 5, scalar_of(q, q == KILN_DTYPE_U8 ? 131 : 3), true);
    cn_input(&c, 6, scalar_of(KILN_DTYPE_F32, 0.07), true);
    cn_input(&c, 7, scalar_of(q, q == KILN_DTYPE_U8 ? 100 : -7), true);
    char label[128], sd[64];
    snprintf(label, sizeof label, "KilnQLinearAdd %s %s%s", kiln_shape_str(rank, dims, sd, 64),
             kiln_dtype_name(q), relu ? " Relu" : "");
    check_case(&c, label, 0, 0, 1);
    cn_free(&c);
}

static void test_qlinear_add8(void)
{
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s], d4[4] = {2, 3, n, 5};
        qlinear_add8_case(KILN_DTYPE_U8, 4, d4, false);
        qlinear_add8_case(KILN_DTYPE_I8, 4, d4, true);
    }
    int64_t big[2] = {256, 1000};
    qlinear_add8_case(KILN_DTYPE_U8, 2, big, true);
}

/* A 256-entry table of dt: random bytes, or float32 values (a NaN and an inf among them). */
static kiln_tensor *lut_table(kiln_dtype dt)
{
    int64_t n = 256;
    if (dt != KILN_DTYPE_F32) return tensor_ints(dt, 1, &n, dt == KILN_DTYPE_U8 ? 0 : -128,
                                                 dt == KILN_DTYPE_U8 ? 255 : 127);
    kiln_tensor *t = tensor_f32(1, &n);
    for (int i = 0; i < 256; i++) ((float *)t->data)[i] = 3.0f * rng_normal();
    ((float *)t->data)[7] = NAN;
    ((float *)t->data)[200] = INFINITY;
    return t;
}

static void lut8_case(kiln_dtype xq, kiln_dtype tq, int rank, const int64_t *dims)
{
    struct case_node c;
    cn_init(&c, KILN_OP_KilnLut8, 1, 2, 1);
    cn_input(&c, 0, tensor_ints(xq, rank, dims, xq == KILN_DTYPE_U8 ? 0 : -128,
                                xq == KILN_DTYPE_U8 ? 255 : 127), false);
    cn_input(&c, 1, lut_table(tq), true);
    char label[128], sd[64];
    snprintf(label, sizeof label, "KilnLut8 %s %s table %s", kiln_shape_str(rank, dims, sd, 64),
             kiln_dtype_name(xq), kiln_dtype_name(tq));
    check_case(&c, label, 0, 0, 1);
    cn_free(&c);
}

static void test_lut8(void)
{
    static const kiln_dtype xs[2] = {KILN_DTYPE_U8, KILN_DTYPE_I8};
    static const kiln_dtype ts[3] = {KILN_DTYPE_U8, KILN_DTYPE_I8, KILN_DTYPE_F32};
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s], d3[3] = {2, 7, n};
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 3; b++) lut8_case(xs[a], ts[b], 3, d3);
    }
    int64_t big[2] = {300, 1000};
    lut8_case(KILN_DTYPE_U8, KILN_DTYPE_U8, 2, big);
    lut8_case(KILN_DTYPE_I8, KILN_DTYPE_F32, 2, big);
}

static void lut8_mul_case(kiln_dtype xq, kiln_dtype yq, const int64_t *dims, bool with_zp,
                          bool shared_s)
{
    struct case_node c;
    cn_init(&c, KILN_OP_KilnLut8Mul, 1, with_zp ? 5 : 4, 1);
    cn_input(&c, 0, tensor_ints(xq, 4, dims, xq == KILN_DTYPE_U8 ? 0 : -128,
                                xq == KILN_DTYPE_U8 ? 255 : 127), false);
    cn_input(&c, 1, lut_table(KILN_DTYPE_F32), true);
    int64_t sd4[4] = {shared_s ? 1 : dims[0], dims[1], 1, 1};
    kiln_tensor *sc = tensor_f32(4, sd4);
    for (size_t i = 0; i < sc->nbytes / 4; i++) ((float *)sc->data)[i] = rng_uniform(0.0f, 1.0f);
    cn_input(&c, 2, sc, false);
    cn_input(&c, 3, scalar_of(KILN_DTYPE_F32, 0.043), true);
    if (with_zp) cn_input(&c, 4, scalar_of(yq, yq == KILN_DTYPE_U8 ? 128 : -1), true);
    char label[128], sd[64];
    snprintf(label, sizeof label, "KilnLut8Mul %s %s to %s%s", kiln_shape_str(4, dims, sd, 64),
             kiln_dtype_name(xq), kiln_dtype_name(with_zp ? yq : KILN_DTYPE_U8),
             shared_s ? " s [1,C,1,1]" : "");
    check_case(&c, label, 0, 0, 1);
    cn_free(&c);
}

static void test_lut8_mul(void)
{
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s], d4[4] = {2, 5, n, 3};
        lut8_mul_case(KILN_DTYPE_U8, KILN_DTYPE_U8, d4, true, false);
        lut8_mul_case(KILN_DTYPE_I8, KILN_DTYPE_I8, d4, true, true);
        lut8_mul_case(KILN_DTYPE_U8, KILN_DTYPE_U8, d4, false, false);
    }
    int64_t big[4] = {4, 96, 24, 24};
    lut8_mul_case(KILN_DTYPE_U8, KILN_DTYPE_U8, big, true, false);
}

static void lut8_pool_case(kiln_dtype xq, const int64_t *dims)
{
    struct case_node c;
    cn_init(&c, KILN_OP_KilnLut8Pool, 1, 2, 1);
    cn_input(&c, 0, tensor_ints(xq, 4, dims, xq == KILN_DTYPE_U8 ? 0 : -128,
                                xq == KILN_DTYPE_U8 ? 255 : 127), false);
    kiln_tensor *t = lut_table(KILN_DTYPE_F32);
    ((float *)t->data)[7] = 0.5f; /* no NaN or inf here: they would fill whole rows */
    ((float *)t->data)[200] = -0.25f;
    cn_input(&c, 1, t, true);
    char label[128], sd[64];
    snprintf(label, sizeof label, "KilnLut8Pool %s %s", kiln_shape_str(4, dims, sd, 64),
             kiln_dtype_name(xq));
    check_case(&c, label, 1e-6, 1e-6, 1);
    cn_free(&c);
}

static void test_lut8_pool(void)
{
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s], d4[4] = {2, 5, n, 3};
        lut8_pool_case(KILN_DTYPE_U8, d4);
        lut8_pool_case(KILN_DTYPE_I8, d4);
    }
    int64_t big[4] = {4, 96, 24, 24};
    lut8_pool_case(KILN_DTYPE_U8, big);
}

static void kcase_quantize8(void) { test_quantize8(); }
static void kcase_dequantize8(void) { test_dequantize8(); }
static void kcase_qlinear_add8(void) { test_qlinear_add8(); }
static void kcase_lut8(void) { test_lut8(); }
static void kcase_lut8_mul(void) { test_lut8_mul(); }
static void kcase_lut8_pool(void) { test_lut8_pool(); }
/* ---- KilnReorder (dnnl/reorder.c): float32 between plain and blocked storage ---- */

/* The reference copies the logical values (no from / to attributes: the plain tensors the
 * case framework hands it), the fast kernel moves storage between the layouts the case
 * sets (case_layout in, case_layout_out out; the framework converts both sides). */
static void test_reorder(void)
{
    static const int pairs[][2] = {{0, 8}, {0, 16}, {8, 0}, {16, 0}, {8, 16}, {16, 8}, {0, 0}};
    static const int64_t chans[] = {3, 8, 16, 20, 33};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
        for (size_t k = 0; k < sizeof chans / sizeof chans[0]; k++) {
            int64_t d[4] = {2, chans[k], 5, 7};
            struct case_node c;
            cn_init(&c, KILN_OP_KilnReorder, 1, 1, 1);
            kiln_tensor *x = tensor_f32(4, d);
            for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal();
            cn_input(&c, 0, x, false);
            char label[96];
            snprintf(label, sizeof label, "KilnReorder [2,%lld,5,7] %d -> %d", (long long)d[1],
                     pairs[p][0], pairs[p][1]);
            case_layout = pairs[p][0];
            case_layout_out = pairs[p][1];
            check_case(&c, label, 0, 0, 1);
            case_layout = 0;
            case_layout_out = -1;
            cn_free(&c);
        }
}

static void kcase_reorder(void) { test_reorder(); }

/* ---- KilnMBConv (simd/mbconv.c): the fused inverted-residual block, blocked by 16 ---- */

static kiln_tensor *mb_weights(int64_t d0, int64_t d1, int64_t k, float gain)
{
    int64_t d[4] = {d0, d1, k, k};
    kiln_tensor *t = tensor_f32(4, d);
    float sc = gain / sqrtf((float)(d1 * k * k));
    for (size_t i = 0; i < t->nbytes / 4; i++) ((float *)t->data)[i] = sc * rng_normal();
    return t;
}

static kiln_tensor *mb_bias(int64_t n)
{
    kiln_tensor *t = tensor_f32(1, &n);
    for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = 0.2f * rng_normal();
    return t;
}

/* x [n, cin, h, w] through expand (cin -> ce; none when !expand: ce = cin), a k x k
 * depthwise at stride s, an optional squeeze-excitation of cse channels and the project to
 * cout, with the activations given (NULL: none), and a residual when sum. */
static void mbconv_case(int64_t n, int64_t cin, int64_t ce, int64_t cout, int64_t h, int64_t k,
                        int64_t s, bool expand, int64_t cse, bool sum, const char *act,
                        const char *project_act)
{
    struct case_node c;
    cn_init(&c, KILN_OP_KilnMBConv, 1, 12, 1);
    attr_int(&c, "dw_kernel", k);
    attr_int(&c, "dw_stride", s);
    if (act && expand) attr_str(&c, "expand_activation", act);
    if (act) attr_str(&c, "dw_activation", act);
    if (act && !strcmp(act, "Clip")) {
        attr_float(&c, "expand_act_alpha", 0.0f);
        attr_float(&c, "expand_act_beta", 6.0f);
        attr_float(&c, "dw_act_alpha", 0.0f);
        attr_float(&c, "dw_act_beta", 6.0f);
    }
    if (project_act) attr_str(&c, "activation", project_act);
    if (cse) attr_str(&c, "se_activation", "SiLU");
    int64_t xd[4] = {n, cin, h, h}, ho = (h + 2 * (k / 2) - k) / s + 1;
    kiln_tensor *x = tensor_f32(4, xd);
    for (size_t i = 0; i < x->nbytes / 4; i++) ((float *)x->data)[i] = rng_normal();
    cn_input(&c, 0, x, false);
    if (!expand) ce = cin;
    cn_input(&c, 1, expand ? mb_weights(ce, cin, 1, 1.5f) : NULL, true);
    cn_input(&c, 2, expand ? mb_bias(ce) : NULL, true);
    cn_input(&c, 3, mb_weights(ce, 1, k, 1.5f), true);
    cn_input(&c, 4, mb_bias(ce), true);
    cn_input(&c, 5, mb_weights(cout, ce, 1, 1.0f), true);
    cn_input(&c, 6, mb_bias(cout), true);
    kiln_tensor *r = NULL;
    if (sum) {
        int64_t yd[4] = {n, cout, ho, ho};
        r = tensor_f32(4, yd);
        for (size_t i = 0; i < r->nbytes / 4; i++) ((float *)r->data)[i] = rng_normal();
    }
    cn_input(&c, 7, r, false);
    cn_input(&c, 8, cse ? mb_weights(cse, ce, 1, 1.0f) : NULL, true);
    cn_input(&c, 9, cse ? mb_bias(cse) : NULL, true);
    cn_input(&c, 10, cse ? mb_weights(ce, cse, 1, 1.0f) : NULL, true);
    cn_input(&c, 11, cse ? mb_bias(ce) : NULL, true);
    char label[160];
    snprintf(label, sizeof label,
             "KilnMBConv n %lld %lld->%lld->%lld %lldx%lld k %lld s %lld%s se %lld%s %s/%s",
             (long long)n, (long long)cin, (long long)ce, (long long)cout, (long long)h,
             (long long)h, (long long)k, (long long)s, expand ? "" : " no expand",
             (long long)cse, sum ? " residual" : "", act ? act : "none",
             project_act ? project_act : "none");
    case_layout = 16;
    /* the kernel runs on AVX-512 CPUs whatever KILN_ISA says (a fused node keeps it) */
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    check_case(&c, label, 1e-4, 1e-4, avx512 ? 1 : 0);
    case_layout = 0;
    cn_free(&c);
}

static void test_mbconv(void)
{
    /* MobileNetV2-style blocks: Clip(0, 6), no expand, strides, residual, 5x5 */
    mbconv_case(2, 32, 32, 16, 9, 3, 1, false, 0, false, "Clip", NULL);
    mbconv_case(2, 16, 96, 24, 14, 3, 2, true, 0, false, "Clip", NULL);
    mbconv_case(3, 24, 144, 24, 7, 3, 1, true, 0, true, "Clip", NULL);
    mbconv_case(1, 40, 120, 40, 11, 5, 1, true, 0, true, "Relu", NULL);
    mbconv_case(2, 24, 72, 40, 13, 5, 2, true, 0, false, "SiLU", NULL);
    /* EfficientNet's: SiLU, squeeze-excitation, channels no multiple of 16 */
    mbconv_case(1, 24, 24, 16, 20, 3, 1, false, 6, false, "SiLU", NULL);
    mbconv_case(2, 16, 96, 40, 20, 3, 2, true, 4, false, "SiLU", NULL);
    mbconv_case(3, 40, 200, 40, 6, 5, 1, true, 10, true, "SiLU", NULL);
    /* small planes with several images per thread: the grouped path (kiln_mbconv_group) */
    mbconv_case(6, 40, 200, 40, 3, 3, 1, true, 10, true, "SiLU", NULL);
    mbconv_case(5, 48, 160, 48, 4, 3, 1, true, 0, true, "Clip", NULL);
    mbconv_case(9, 24, 96, 40, 6, 3, 2, true, 6, false, "SiLU", NULL);
    /* a project activation (the pass fuses none today, the kernel takes it) */
    mbconv_case(1, 16, 64, 16, 8, 3, 1, true, 0, false, "Relu", "Relu");
}

static void kcase_mbconv(void) { test_mbconv(); }

/* ---- TfListSetItem (tf_list_fast.c): a TensorList's write ---- */

static void list_set_case(kiln_dtype dt, int lrank, const int64_t *ld, int irank,
                          const int64_t *id, int64_t index, const char *what)
{
    struct case_node c;
    cn_init(&c, KILN_OP_TfListSetItem, 1, 3, 1);
    cn_input(&c, 0, tensor_random(dt, lrank, ld), false);
    cn_input(&c, 1, scalar_of(KILN_DTYPE_I64, (double)index), false);
    cn_input(&c, 2, tensor_random(dt, irank, id), false);
    char label[96];
    snprintf(label, sizeof label, "TfListSetItem %s %s index %lld", kiln_dtype_name(dt), what,
             (long long)index);
    check_case(&c, label, 0, 0, 1);
    cn_free(&c);
}

static void test_list_set_item(void)
{
    static const kiln_dtype dts[] = {KILN_DTYPE_F32, KILN_DTYPE_I64, KILN_DTYPE_U8};
    for (size_t t = 0; t < sizeof dts / sizeof dts[0]; t++)
        for (int s = 0; s < N_SIZES; s++) {
            int64_t n = sizes[s], ld[3] = {4, 3, n}, id[2] = {3, n}, fresh[2] = {4, 0};
            list_set_case(dts[t], 3, ld, 2, id, 0, "[4,3,n]");
            list_set_case(dts[t], 3, ld, 2, id, 3, "[4,3,n]");
            /* a list that holds no elements yet (Keras's reserve): zeros with the item */
            list_set_case(dts[t], 2, fresh, 2, id, 2, "fresh [4,0]");
        }
    /* an index out of range: the reference's error, naming the node */
    int64_t ld[2] = {4, 5}, id[1] = {5};
    struct case_node c;
    cn_init(&c, KILN_OP_TfListSetItem, 1, 3, 1);
    cn_input(&c, 0, tensor_random(KILN_DTYPE_F32, 2, ld), false);
    cn_input(&c, 1, scalar_of(KILN_DTYPE_I64, 4), false);
    cn_input(&c, 2, tensor_random(KILN_DTYPE_F32, 1, id), false);
    kiln_tensor *out[MAX_IO];
    bool handled;
    kiln_status st = run_fast(&c, "scalar", 1, &handled, NULL, out);
    CHECK(handled && st != KILN_OK && strstr(kiln_last_error(), "node_under_test") &&
              strstr(kiln_last_error(), "index 4"),
          "TfListSetItem index out of range: status %d, %s", st, kiln_last_error());
    free_outs(out, 1);
    cn_free(&c);
}

static void kcase_list_set_item(void) { test_list_set_item(); }

/* ---- Tree ensembles (trees_fast.c; tests/c/unit_trees.c has the thorough forests) ---- */

#define TC_MAX 64

/* Full binary trees of depth 3 (7 branches, 8 leaves each) on 5 features, the branch modes
 * cycling through LEQ, LT, GTE and GT, thresholds from a few values the inputs hit exactly,
 * NaN going to the true child on every other branch. */
struct tree_forest {
    int n, trees;
    int64_t tree[TC_MAX], node[TC_MAX], feat[TC_MAX], tid[TC_MAX], fid[TC_MAX], miss[TC_MAX];
    float val[TC_MAX];
    const char *mode[TC_MAX];
    int nl;                          /* leaves */
    int64_t l_tree[TC_MAX], l_node[TC_MAX], l_id[TC_MAX];
    float l_w[TC_MAX];
};

static void tc_forest(struct tree_forest *f, int trees, int targets)
{
    static const char *modes[4] = {"BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT"};
    static const float pool[4] = {-0.5f, 0.0f, 0.25f, 1.0f};
    memset(f, 0, sizeof *f);
    f->trees = trees;
    for (int t = 0; t < trees; t++)
        for (int k = 0; k < 15; k++) { /* node k: children 2k+1, 2k+2; 7..14 leaves */
            int i = f->n++;
            f->tree[i] = t;
            f->node[i] = k;
            if (k < 7) {
                f->mode[i] = modes[(t + k) % 4];
                f->feat[i] = (t * 3 + k) % 5;
                f->val[i] = pool[(int)(rng_next() % 4)];
                f->tid[i] = 2 * k + 1;
                f->fid[i] = 2 * k + 2;
                f->miss[i] = k % 2;
            } else {
                f->mode[i] = "LEAF";
                int l = f->nl++;
                f->l_tree[l] = t;
                f->l_node[l] = k;
                f->l_id[l] = (int64_t)(rng_next() % (uint64_t)targets);
                f->l_w[l] = rng_normal();
            }
        }
}

/* x [rows, 5]: values from the thresholds' pool (ties), others and a few NaN */
static kiln_tensor *tc_input(int64_t rows)
{
    int64_t d[2] = {rows, 5};
    kiln_tensor *x = tensor_f32(2, d);
    static const float pool[4] = {-0.5f, 0.0f, 0.25f, 1.0f};
    for (int64_t i = 0; i < rows * 5; i++) {
        uint64_t r = rng_next() % 10;
        ((float *)x->data)[i] = r < 4 ? pool[r] : r == 9 && i % 7 == 0 ? NAN : rng_normal();
    }
    return x;
}

static void tc_v3_attrs(struct case_node *c, const struct tree_forest *f, const char *vp)
{
    attr_ints(c, "nodes_treeids", f->tree, f->n);
    attr_ints(c, "nodes_nodeids", f->node, f->n);
    attr_ints(c, "nodes_featureids", f->feat, f->n);
    attr_ints(c, "nodes_truenodeids", f->tid, f->n);
    attr_ints(c, "nodes_falsenodeids", f->fid, f->n);
    attr_ints(c, "nodes_missing_value_tracks_true", f->miss, f->n);
    attr_strs(c, "nodes_modes", f->mode, f->n);
    attr_floats(c, "nodes_values", f->val, f->n);
    char n1[32], n2[32], n3[32], n4[32];
    snprintf(n1, sizeof n1, "%s_treeids", vp);
    snprintf(n2, sizeof n2, "%s_nodeids", vp);
    snprintf(n3, sizeof n3, "%s_ids", vp);
    snprintf(n4, sizeof n4, "%s_weights", vp);
    attr_ints(c, kiln_arena_strdup(c->g->mem, n1), f->l_tree, f->nl);
    attr_ints(c, kiln_arena_strdup(c->g->mem, n2), f->l_node, f->nl);
    attr_ints(c, kiln_arena_strdup(c->g->mem, n3), f->l_id, f->nl);
    attr_floats(c, kiln_arena_strdup(c->g->mem, n4), f->l_w, f->nl);
}

static void tree_regressor_case(int trees, int targets, const char *agg, const char *post,
                                int64_t rows)
{
    struct tree_forest f;
    tc_forest(&f, trees, targets);
    struct case_node c;
    cn_init(&c, KILN_OP_TreeEnsembleRegressor, 3, 1, 1);
    tc_v3_attrs(&c, &f, "target");
    attr_int(&c, "n_targets", targets);
    attr_str(&c, "aggregate_function", agg);
    attr_str(&c, "post_transform", post);
    float base[4] = {0.5f, -0.25f, 0.125f, 1.0f};
    attr_floats(&c, "base_values", base, targets);
    cn_input(&c, 0, tc_input(rows), false);
    char label[96];
    snprintf(label, sizeof label, "TreeEnsembleRegressor %d trees %d targets %s %s rows %lld",
             trees, targets, agg, post, (long long)rows);
    check_case(&c, label, 1e-6, 1e-6, 1);
    cn_free(&c);
}

static void tree_classifier_case(int trees, int classes, const char *post, int64_t rows)
{
    struct tree_forest f;
    tc_forest(&f, trees, classes == 2 ? 1 : classes);
    struct case_node c;
    cn_init(&c, KILN_OP_TreeEnsembleClassifier, 3, 1, 2);
    tc_v3_attrs(&c, &f, "class");
    attr_str(&c, "post_transform", post);
    int64_t labels[4] = {10, 13, 16, 19};
    attr_ints(&c, "classlabels_int64s", labels, classes);
    cn_input(&c, 0, tc_input(rows), false);
    char label[96];
    snprintf(label, sizeof label, "TreeEnsembleClassifier %d trees %d classes %s rows %lld",
             trees, classes, post, (long long)rows);
    check_case(&c, label, 1e-6, 1e-6, 1);
    cn_free(&c);
}

static void test_tree_regressor(void)
{
    tree_regressor_case(3, 1, "SUM", "NONE", 37);
    tree_regressor_case(4, 2, "AVERAGE", "NONE", 100);
    tree_regressor_case(2, 3, "MAX", "NONE", 9);
    tree_regressor_case(3, 4, "MIN", "SOFTMAX", 64);
    tree_regressor_case(4, 1, "SUM", "NONE", 1000); /* threaded */
}

static void test_tree_classifier(void)
{
    tree_classifier_case(3, 2, "LOGISTIC", 41);   /* binary: one score column */
    tree_classifier_case(4, 3, "SOFTMAX", 100);
    tree_classifier_case(2, 4, "NONE", 7);
    tree_classifier_case(4, 3, "NONE", 1000);
}

/* ai.onnx.ml opset 5's TreeEnsemble: the same forests in its attributes (leaves apart). */
static void tree_ensemble_case(int trees, int targets, int64_t agg, int64_t rows)
{
    struct tree_forest f;
    tc_forest(&f, trees, targets);
    struct case_node c;
    cn_init(&c, KILN_OP_TreeEnsemble, 5, 1, 1);
    /* branches and leaves renumbered: branch k of tree t is t * 7 + k; its children are
     * branches (k < 3) or leaves (t * 8 + child - 7) */
    int64_t roots[TC_MAX], feat[TC_MAX], tid[TC_MAX], tleaf[TC_MAX], fid[TC_MAX],
        fleaf[TC_MAX], miss[TC_MAX], ltarget[TC_MAX];
    float modes[TC_MAX], splits[TC_MAX];
    int nb = 0;
    static const char *const names[4] = {"BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT"};
    for (int i = 0; i < f.n; i++) {
        if (f.node[i] >= 7) continue;
        int t = (int)f.tree[i], k = (int)f.node[i];
        if (k == 0) roots[t] = nb;
        int code = 0; /* opset 5's modes: 0 LEQ, 1 LT, 2 GTE, 3 GT */
        for (int m = 0; m < 4; m++)
            if (!strcmp(f.mode[i], names[m])) code = m;
        modes[nb] = (float)code;
        splits[nb] = f.val[i];
        feat[nb] = f.feat[i];
        miss[nb] = f.miss[i];
        int64_t tc = 2 * k + 1, fc = 2 * k + 2;
        tleaf[nb] = tc >= 7;
        fleaf[nb] = fc >= 7;
        tid[nb] = tc >= 7 ? t * 8 + tc - 7 : t * 7 + tc;
        fid[nb] = fc >= 7 ? t * 8 + fc - 7 : t * 7 + fc;
        nb++;
    }
    for (int l = 0; l < f.nl; l++) ltarget[l] = f.l_id[l];
    struct kiln_attr *a;
    attr_int(&c, "n_targets", targets);
    attr_int(&c, "aggregate_function", agg);
    attr_int(&c, "post_transform", 0);
    attr_ints(&c, "tree_roots", roots, trees);
    attr_ints(&c, "nodes_featureids", feat, nb);
    attr_ints(&c, "nodes_truenodeids", tid, nb);
    attr_ints(&c, "nodes_trueleafs", tleaf, nb);
    attr_ints(&c, "nodes_falsenodeids", fid, nb);
    attr_ints(&c, "nodes_falseleafs", fleaf, nb);
    attr_ints(&c, "nodes_missing_value_tracks_true", miss, nb);
    attr_ints(&c, "leaf_targetids", ltarget, f.nl);
    const struct {
        const char *name;
        kiln_dtype dt;
        const float *v;
        int n;
    } tens[3] = {{"nodes_modes", KILN_DTYPE_U8, modes, nb},
                 {"nodes_splits", KILN_DTYPE_F32, splits, nb},
                 {"leaf_weights", KILN_DTYPE_F32, f.l_w, f.nl}};
    for (int k = 0; k < 3; k++) {
        int64_t d = tens[k].n;
        kiln_tensor *t;
        if (kiln_tensor_new(tens[k].dt, 1, &d, &t) != KILN_OK ||
            kiln_graph_own_tensor(c.g, t) != KILN_OK)
            abort();
        for (int i = 0; i < tens[k].n; i++) kiln_set_f64(tens[k].dt, t->data, i, tens[k].v[i]);
        a = cn_attr(&c, tens[k].name, KILN_ATTR_TENSOR);
        a->t = t;
    }
    cn_input(&c, 0, tc_input(rows), false);
    char label[96];
    snprintf(label, sizeof label, "TreeEnsemble %d trees %d targets aggregate %lld rows %lld",
             trees, targets, (long long)agg, (long long)rows);
    check_case(&c, label, 1e-6, 1e-6, 1);
    cn_free(&c);
}

static void test_tree_ensemble(void)
{
    tree_ensemble_case(3, 1, 1, 37); /* SUM */
    tree_ensemble_case(4, 2, 0, 100); /* AVERAGE */
    tree_ensemble_case(2, 3, 2, 1000); /* MIN */
}

static void kcase_tree_regressor(void) { test_tree_regressor(); }
static void kcase_tree_classifier(void) { test_tree_classifier(); }
static void kcase_tree_ensemble(void) { test_tree_ensemble(); }

/* ---- KilnMatMulT (dnnl/matmul_t.c): products of transposed views ---- */

static void matmul_t_case(int r, const int64_t *ad, const int64_t *pa, const int64_t *bd,
                          const int64_t *pb, float alpha, const char *what, int expect)
{
    struct case_node c;
    cn_init(&c, KILN_OP_KilnMatMulT, 1, 2, 1);
    if (pa) attr_ints(&c, "permA", pa, r);
    if (pb) attr_ints(&c, "permB", pb, r);
    if (alpha != 1.0f) attr_float(&c, "alpha", alpha);
    kiln_tensor *a = tensor_f32(r, ad), *b = tensor_f32(r, bd);
    for (size_t i = 0; i < a->nbytes / 4; i++) ((float *)a->data)[i] = rng_normal();
    for (size_t i = 0; i < b->nbytes / 4; i++) ((float *)b->data)[i] = rng_normal();
    cn_input(&c, 0, a, false);
    cn_input(&c, 1, b, false);
    char label[96];
    snprintf(label, sizeof label, "KilnMatMulT %s alpha %g", what, (double)alpha);
    /* sums of up to 128 products of normal values (about 11 in size): 1e-5 of that */
    check_case(&c, label, 1e-5, 2e-4, expect);
    cn_free(&c);
}

static void test_matmul_t(void)
{
    /* attention: Q, K, V stored [B,S,H,D] */
    const int64_t q0213[4] = {0, 2, 1, 3}, k0231[4] = {0, 2, 3, 1};
    for (int s = 0; s < N_SIZES; s++) {
        int64_t S = sizes[s], qkv[4] = {2, S, 3, 8}, probs[4] = {2, 3, S, S};
        matmul_t_case(4, qkv, q0213, qkv, k0231, 0.125f, "Q [B,S,H,D] @ K^T [B,S,H,D]", 1);
        matmul_t_case(4, probs, NULL, qkv, q0213, 1.0f, "P @ V [B,S,H,D]", 1);
    }
    int64_t q[4] = {2, 4, 16, 8}, k[4] = {2, 16, 4, 8}, kq[4] = {0, 2, 3, 1};
    matmul_t_case(4, q, NULL, k, kq, 1.0f, "plain Q, K [B,S,H,D]", 1);
    /* rank 3, last two swapped on both sides; a broadcast batch */
    const int64_t sw[3] = {0, 2, 1};
    int64_t a3[3] = {3, 7, 5}, b3[3] = {1, 9, 7};
    matmul_t_case(3, a3, sw, b3, sw, 2.0f, "rank 3, both swapped, batch 1 in B", 1);
    int64_t a2[2] = {33, 17}, b2[2] = {40, 33};
    const int64_t t2[2] = {1, 0};
    matmul_t_case(2, a2, t2, b2, t2, 1.0f, "rank 2, A^T @ B^T", 1);
    int64_t big[4] = {4, 128, 8, 64};
    matmul_t_case(4, big, q0213, big, k0231, 0.125f, "threaded [4,128,8,64]", 1);
}

static void kcase_matmul_t(void) { test_matmul_t(); }

static void kcase_depth_space(void) { test_depth_space(); }
static void kcase_pool(void) { test_pool_family(); }
static void kcase_global_pool(void) { test_global_pool(); }
static void kcase_unary(void) { test_unary(); }
static void kcase_binary(void) { test_binary(); }
static void kcase_binary_bcast(void) { test_binary_bcast(); }
static void kcase_softmax(void) { test_softmax(); }
static void kcase_where(void) { test_where(); }
static void kcase_expand(void) { test_expand(); }
static void kcase_log_softmax(void) { test_log_softmax(); }
static void kcase_layernorm(void) { test_layernorm(); }
static void kcase_groupnorm(void) { test_groupnorm(); }
static void kcase_groupnorm_act(void) { test_groupnorm_act(); }
static void kcase_pow(void) { test_pow(); }
static void kcase_gather_rows(void) { test_gather(); }
static void kcase_gather_axis(void) { test_gather_axis(); }
static void kcase_gather_channels(void) { test_gather_channels(); }
static void kcase_slice(void) { test_slice(); }
static void kcase_pad(void) { test_pad(); }
static void kcase_pad_nd(void) { test_pad_nd(); }
static void kcase_transpose(void) { test_transpose(); }
static void kcase_concat(void) { test_concat(); }
static void kcase_resize(void) { test_resize(); }
static void kcase_upsample(void) { test_upsample(); }
static void kcase_split(void) { test_split(); }
static void kcase_reduce(void) { test_reduce(); }
static void kcase_attention(void) { test_attention(); }
static void kcase_recurrent(void) { test_rnn(); }
static void kcase_conv(void) { conv_cases(false); }
static void kcase_fused_conv(void) { conv_cases(true); }
static void kcase_matmul(void) { test_matmul_family(); }
static void kcase_gemm(void) { test_gemm_family(); }
static void kcase_fused_matmul(void) { test_fused_matmul_family(); }
static void kcase_deconv(void) { deconv_cases(false); }
static void kcase_fused_deconv(void) { deconv_cases(true); }
static void kcase_qlinear_conv(void) { qconv_cases(KILN_OP_QLinearConv); }
static void kcase_qlinear_matmul(void) { qmatmul_cases(KILN_OP_QLinearMatMul); }
static void kcase_kiln_qlinear_matmul(void) { qmatmul_cases(KILN_OP_KilnQLinearMatMul); }
static void kcase_kiln_qlinear_conv_add(void) { qconv_add_cases(); }
static void kcase_conv_integer(void) { qconv_cases(KILN_OP_ConvInteger); }
static void kcase_matmul_integer(void) { integer_matmul_cases(); }

#endif
