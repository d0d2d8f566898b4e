/*
 * unit_tflite.c - TFLite's integer arithmetic (src/kernels/ref/tflite_q.h)
 * and the reference kernels of the TFLite block of ops.def
 * (src/kernels/ref/tflite_q.c) on small cases worked out by hand from the
 * definitions in TFLite's reference kernels: rounding of exact halves in
 * SaturatingRoundingDoublingHighMul and RoundingDivideByPOT, multiplier
 * preparation, the zero point as padding of a quantized convolution,
 * per-channel requantization, activation clamps, TFLite's rounding
 * division in average pooling and the fixed-point softmax.
 */
#include <string.h>

#include "check.h"
#include "core/tensor.h"
#include "ir/graph.h"
#include "kernels/kernel.h"
#include "kernels/ref/tflite_q.h"

static struct kiln_graph *g;

/* A node of op with room for attributes; inputs are given at run. */
static struct kiln_node *mk(enum kiln_op op, int n_in)
{
    struct kiln_node *n;
    if (kiln_graph_node_add(g, op, "t", n_in, 1, 24, &n) != KILN_OK) return NULL;
    n->n_attr = 0;
    n->opset = 21;
    return n;
}
static void ai(struct kiln_node *n, const char *name, int64_t v)
{
    struct kiln_attr *a = &n->attr[n->n_attr++];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = KILN_ATTR_INT;
    a->i = v;
}
static void af(struct kiln_node *n, const char *name, float v)
{
    struct kiln_attr *a = &n->attr[n->n_attr++];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = KILN_ATTR_FLOAT;
    a->f = v;
}
static void ais(struct kiln_node *n, const char *name, int cnt, const int64_t *v)
{
    struct kiln_attr *a = &n->attr[n->n_attr++];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = KILN_ATTR_INTS;
    a->n = cnt;
    a->ints = kiln_arena_alloc(g->mem, sizeof(int64_t) * (size_t)cnt);
    memcpy(a->ints, v, sizeof(int64_t) * (size_t)cnt);
}

static kiln_tensor *tens(kiln_dtype dt, int rank, const int64_t *dims, const void *data)
{
    kiln_tensor *t;
    if (kiln_tensor_new(dt, rank, dims, &t) != KILN_OK) return NULL;
    if (data) memcpy(t->data, data, t->nbytes);
    return t;
}

/* Infer the output shape, allocate it and run the node's reference kernel. */
static kiln_tensor *run(struct kiln_node *n, int n_in, kiln_tensor **in)
{
    const struct kiln_op_impl *impl = kiln_op_impl(n->op);
    struct kiln_type ti[4], to;
    const struct kiln_type *tip[4];
    for (int i = 0; i < n_in; i++) {
        kiln_type_from_tensor(&ti[i], in[i]);
        tip[i] = &ti[i];
    }
    struct kiln_type *top = &to;
    struct kiln_infer_ctx ic = {n, n_in, tip, (const kiln_tensor *const *)in, 1, &top};
    if (impl->infer(&ic) != KILN_OK) {
        fprintf(stderr, "infer: %s\n", kiln_last_error());
        return NULL;
    }
    kiln_tensor *y = tens(to.dtype, to.rank, to.dims, NULL);
    struct kiln_run_ctx rc = {.node = n, .n_in = n_in, .in = in, .n_out = 1, .out = &y, .threads = 1};
    if (impl->run(&rc) != KILN_OK) {
        fprintf(stderr, "run: %s\n", kiln_last_error());
        kiln_tensor_free(y);
        return NULL;
    }
    return y;
}

static void test_arithmetic(void)
{
    CHECK(tfl_srdhm(1 << 30, 1 << 30) == 1 << 29, "2^30 * 2^30 / 2^31");
    CHECK(tfl_srdhm(INT32_MIN, INT32_MIN) == INT32_MAX, "the one overflow saturates");
    CHECK(tfl_srdhm(3, 1 << 30) == 2, "1.5 rounds up");
    CHECK(tfl_srdhm(-3, 1 << 30) == -1, "-1.5 rounds up too (gemmlowp's nudge)");
    CHECK(tfl_rdbpot(5, 1) == 3 && tfl_rdbpot(-5, 1) == -3, "halves away from zero");
    CHECK(tfl_rdbpot(-4, 1) == -2 && tfl_rdbpot(7, 2) == 2, "exact and above half");
    CHECK(tfl_rdbpot(6, 2) == 2 && tfl_rdbpot(-6, 2) == -2, "1.5 and -1.5");
    int32_t q;
    int s;
    tfl_quantize_multiplier(0.5, &q, &s);
    CHECK(q == 1 << 30 && s == 0, "0.5 = 2^30 * 2^-31: got %d, %d", q, s);
    tfl_quantize_multiplier(3.0, &q, &s);
    CHECK(q == 1610612736 && s == 2, "3 = 0.75 * 2^2: got %d, %d", q, s);
    CHECK(tfl_mul_by_qm(10, q, s) == 30, "10 * 3");
    tfl_quantize_multiplier(0.1, &q, &s);
    CHECK(q == 1717986918 && s == -3, "0.1 = 0.8 * 2^-3: got %d, %d", q, s);
    CHECK(tfl_mul_by_qm(25, q, s) == 3 && tfl_mul_by_qm(-25, q, s) == -3, "2.5 -> 3, -2.5 -> -3");
    struct tfl_softmax_params sp;
    tfl_softmax_prepare(1.0f, 1.0f / 16, &sp);
    /* 2^26 / 16 = 2^22 = 0.5 * 2^23: multiplier 2^30, shift 23 */
    CHECK(sp.input_multiplier == 1 << 30 && sp.input_left_shift == 23, "softmax %d %d",
          sp.input_multiplier, sp.input_left_shift);
    CHECK(sp.diff_min == -(int32_t)((31.0 * (1 << 26)) / (1 << 23)), "diff_min %d", sp.diff_min);
}

/* The 16x8 primitives: the 64-bit MultiplyByQuantizedMultiplier rounds the
 * multiplier to 16 bits and adds half before one arithmetic shift (ties go
 * up, toward +infinity), and the int16 LOGISTIC/TANH preparation. */
static void test_arithmetic16(void)
{
    CHECK(tfl_mul_by_qm64(1001, 1 << 30, 0) == 501, "500.5 rounds up");
    CHECK(tfl_mul_by_qm64(-1001, 1 << 30, 0) == -500, "-500.5 rounds up too");
    CHECK(tfl_mul_by_qm64(-1000, 1 << 30, 0) == -500, "exact");
    CHECK(tfl_mul_by_qm64((int64_t)1 << 40, 1 << 30, -20) == 1 << 19, "2^40 / 2 / 2^20");
    CHECK(tfl_mul_by_qm64(3, INT32_MAX, 1) == 6, "a multiplier near 1 is 0x7FFF / 2^15");
    int sh;
    CHECK(tfl_act16_prepare(1.0f / 4096, false, &sh) == 0 && sh == 0, "2^-12: POT, shift 0");
    CHECK(tfl_act16_prepare(1.0f / 2048, true, &sh) == 0 && sh == 1, "tanh 2^-11: POT, shift 1");
    int32_t m = tfl_act16_prepare(1.0f / 2048, false, &sh);
    CHECK(m == 24576 && sh == 12, "logistic 2^-11: 6 doubled 12 times, got %d, %d", m, sh);
}

static void test_quantize(void)
{
    int64_t d4 = 5;
    float xf[5] = {0.25f, -0.25f, 0.75f, 1000.0f, -0.2f};
    kiln_tensor *x = tens(KILN_DTYPE_F32, 1, &d4, xf);
    struct kiln_node *n = mk(KILN_OP_TflQuantize, 1);
    ai(n, "to", KILN_DTYPE_I8);
    ai(n, "zero_point", 0);
    af(n, "scale", 0.5f);
    kiln_tensor *y = run(n, 1, &x);
    const int8_t want[5] = {1, -1, 2, 127, 0};
    CHECK(y && memcmp(y->data, want, 5) == 0, "round half away from zero, clamp");
    kiln_tensor_free(y);
    kiln_tensor_free(x);
    int8_t xi[2] = {10, -128};
    int64_t d2 = 2;
    x = tens(KILN_DTYPE_I8, 1, &d2, xi);
    n = mk(KILN_OP_TflQuantize, 1);
    ai(n, "to", KILN_DTYPE_U8);
    ai(n, "zero_point", 3);
    ai(n, "in_zero_point", 0);
    ai(n, "multiplier", 1 << 30);
    ai(n, "shift", 0);
    y = run(n, 1, &x);
    CHECK(y && ((uint8_t *)y->data)[0] == 8 && ((uint8_t *)y->data)[1] == 0,
          "requantize: 10 / 2 + 3 = 8; -64 + 3 clamps to 0");
    kiln_tensor_free(y);
    kiln_tensor_free(x);
}

static void test_fully_connected(void)
{
    int64_t dx[2] = {1, 2}, dw[2] = {2, 2}, db = 2;
    int8_t xv[2] = {3, -2}, wv[4] = {2, 1, 1, -3};
    int32_t bv[2] = {5, 0};
    kiln_tensor *in[3] = {tens(KILN_DTYPE_I8, 2, dx, xv), tens(KILN_DTYPE_I8, 2, dw, wv),
                          tens(KILN_DTYPE_I32, 1, &db, bv)};
    struct kiln_node *n = mk(KILN_OP_TflFullyConnected, 3);
    ai(n, "input_offset", 1); /* input zero point -1 */
    ai(n, "weights_offset", 0);
    ai(n, "output_offset", 10);
    ai(n, "act_min", -128);
    ai(n, "act_max", 15);
    int64_t m = 1 << 30, s = 0;
    ais(n, "multipliers", 1, &m);
    ais(n, "shifts", 1, &s);
    /* (4, -1) . (2, 1) + 5 = 12 -> 6 + 10 = 16 -> clamp 15;
     * (4, -1) . (1, -3) + 0 = 7 -> 3.5 rounds to 4 -> 14 */
    kiln_tensor *y = run(n, 3, in);
    CHECK(y && y->rank == 2 && y->dims[0] == 1 && y->dims[1] == 2, "shape");
    CHECK(y && ((int8_t *)y->data)[0] == 15 && ((int8_t *)y->data)[1] == 14, "got %d %d",
          y ? ((int8_t *)y->data)[0] : 0, y ? ((int8_t *)y->data)[1] : 0);
    kiln_tensor_free(y);
    for (int i = 0; i < 3; i++) kiln_tensor_free(in[i]);
}

static void test_conv(void)
{
    /* depthwise 3x3 SAME over a 2x2 image: every window covers all four
     * pixels; the padding is the zero point, so it adds nothing */
    int64_t dx[4] = {1, 2, 2, 1}, dw[4] = {1, 3, 3, 1};
    int8_t xv[4] = {1, 2, 3, 4}, wv[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    kiln_tensor *in[2] = {tens(KILN_DTYPE_I8, 4, dx, xv), tens(KILN_DTYPE_I8, 4, dw, wv)};
    struct kiln_node *n = mk(KILN_OP_TflConv, 2);
    int64_t one[2] = {1, 1}, m = 1 << 30, s = 0;
    ais(n, "strides", 2, one);
    ais(n, "dilations", 2, one);
    ai(n, "same", 1);
    ai(n, "depthwise", 1);
    ai(n, "input_offset", -1); /* zero point 1: pixels 0, 1, 2, 3 */
    ai(n, "weights_offset", 0);
    ai(n, "output_offset", 0);
    ai(n, "act_min", -128);
    ai(n, "act_max", 127);
    ais(n, "multipliers", 1, &m);
    ais(n, "shifts", 1, &s);
    kiln_tensor *y = run(n, 2, in);
    bool ok = y && kiln_tensor_count(y) == 4;
    for (int i = 0; ok && i < 4; i++) ok = ((int8_t *)y->data)[i] == 3; /* 6 / 2 */
    CHECK(ok, "depthwise SAME with zero-point padding");
    kiln_tensor_free(y);
    kiln_tensor_free(in[0]);
    kiln_tensor_free(in[1]);

    /* 1x1 convolution, two output channels with their own multipliers */
    int64_t dx2[4] = {1, 1, 1, 1}, dw2[4] = {2, 1, 1, 1};
    int8_t xv2[1] = {7}, wv2[2] = {1, 2};
    kiln_tensor *in2[2] = {tens(KILN_DTYPE_I8, 4, dx2, xv2), tens(KILN_DTYPE_I8, 4, dw2, wv2)};
    n = mk(KILN_OP_TflConv, 2);
    int64_t ms[2] = {1 << 30, 1 << 30}, ss[2] = {0, -1};
    ais(n, "strides", 2, one);
    ais(n, "dilations", 2, one);
    ai(n, "same", 0);
    ai(n, "input_offset", 0);
    ai(n, "weights_offset", 0);
    ai(n, "output_offset", -2);
    ai(n, "act_min", -128);
    ai(n, "act_max", 127);
    ais(n, "multipliers", 2, ms);
    ais(n, "shifts", 2, ss);
    y = run(n, 2, in2);
    /* 7 * 0.5 = 3.5 -> 4, - 2 = 2; 14 * 0.25 = 3.5 -> 4, - 2 = 2 */
    CHECK(y && y->dims[3] == 2 && ((int8_t *)y->data)[0] == 2 && ((int8_t *)y->data)[1] == 2,
          "per-channel requantization");
    kiln_tensor_free(y);
    kiln_tensor_free(in2[0]);
    kiln_tensor_free(in2[1]);
}

static void test_add(void)
{
    int64_t d = 3;
    uint8_t a[3] = {3, 200, 0}, b[3] = {4, 100, 0};
    kiln_tensor *in[2] = {tens(KILN_DTYPE_U8, 1, &d, a), tens(KILN_DTYPE_U8, 1, &d, b)};
    struct tfl_add_params p;
    tfl_add_prepare(1.0f, 0, 1.0f, 0, 1.0f, 0, 20, &p);
    CHECK(p.left_shift == 20 && p.input1_multiplier == 1 << 30 && p.input1_shift == 0,
          "inputs at half of twice the scale");
    /* 2 / 2^20 = 2^-19 = 0.5 * 2^-18 */
    CHECK(p.output_multiplier == 1 << 30 && p.output_shift == -18, "%d %d", p.output_multiplier,
          p.output_shift);
    struct kiln_node *n = mk(KILN_OP_TflAdd, 2);
    ai(n, "input1_offset", p.input1_offset);
    ai(n, "input2_offset", p.input2_offset);
    ai(n, "left_shift", p.left_shift);
    ai(n, "input1_multiplier", p.input1_multiplier);
    ai(n, "input1_shift", p.input1_shift);
    ai(n, "input2_multiplier", p.input2_multiplier);
    ai(n, "input2_shift", p.input2_shift);
    ai(n, "output_multiplier", p.output_multiplier);
    ai(n, "output_shift", p.output_shift);
    ai(n, "output_offset", p.output_offset);
    ai(n, "act_min", 0);
    ai(n, "act_max", 255);
    kiln_tensor *y = run(n, 2, in);
    const uint8_t want[3] = {7, 255, 0};
    CHECK(y && memcmp(y->data, want, 3) == 0, "3 + 4, 200 + 100 clamped, 0 + 0");
    kiln_tensor_free(y);
    kiln_tensor_free(in[0]);
    kiln_tensor_free(in[1]);
}

/* SUB is TflAdd with input 2's multiplier negated; MUL; the LOGISTIC/TANH table. */
static void test_sub_mul_lut(void)
{
    int64_t d = 3;
    int8_t a[3] = {10, -100, 5}, b[3] = {4, 100, 5};
    kiln_tensor *in[2] = {tens(KILN_DTYPE_I8, 1, &d, a), tens(KILN_DTYPE_I8, 1, &d, b)};
    struct tfl_add_params p;
    tfl_add_prepare(1.0f, 0, 1.0f, 0, 1.0f, 0, 20, &p);
    struct kiln_node *n = mk(KILN_OP_TflAdd, 2);
    ai(n, "left_shift", p.left_shift);
    ai(n, "input1_multiplier", p.input1_multiplier);
    ai(n, "input1_shift", p.input1_shift);
    ai(n, "input2_multiplier", -p.input2_multiplier);
    ai(n, "input2_shift", p.input2_shift);
    ai(n, "output_multiplier", p.output_multiplier);
    ai(n, "output_shift", p.output_shift);
    kiln_tensor *y = run(n, 2, in);
    const int8_t want_sub[3] = {6, -128, 0};
    CHECK(y && memcmp(y->data, want_sub, 3) == 0, "10 - 4, -100 - 100 clamped, 5 - 5");
    kiln_tensor_free(y);
    int8_t ma[3] = {3, -4, 100}, mb[3] = {5, 6, 100};
    memcpy(in[0]->data, ma, 3);
    memcpy(in[1]->data, mb, 3);
    n = mk(KILN_OP_TflMul, 2);
    ai(n, "output_multiplier", 1 << 30); /* 0.5 */
    ai(n, "output_shift", 0);
    ai(n, "output_offset", 1);
    y = run(n, 2, in);
    /* 15 * 0.5 = 7.5 ties up to 8; -24 * 0.5 = -12; 5000 clamps; each + 1 */
    const int8_t want_mul[3] = {9, -11, 127};
    CHECK(y && memcmp(y->data, want_mul, 3) == 0, "got %d %d %d", y ? ((int8_t *)y->data)[0] : 0,
          y ? ((int8_t *)y->data)[1] : 0, y ? ((int8_t *)y->data)[2] : 0);
    kiln_tensor_free(y);
    kiln_tensor_free(in[0]);
    kiln_tensor_free(in[1]);
    int64_t table[256], d4 = 4;
    for (int k = 0; k < 256; k++) table[k] = k / 2 - 64;
    table[1] = 500;
    int8_t xv[4] = {-128, -1, 127, 1};
    kiln_tensor *x = tens(KILN_DTYPE_I8, 1, &d4, xv);
    n = mk(KILN_OP_TflLut, 1);
    ais(n, "table", 256, table);
    y = run(n, 1, &x);
    const int8_t want_lut[4] = {0, 63, -1, 127}; /* indexed by the byte; 500 clamped */
    CHECK(y && memcmp(y->data, want_lut, 4) == 0, "table indexed by (uint8)x");
    kiln_tensor_free(y);
    kiln_tensor_free(x);
}

static void test_pool(void)
{
    int64_t dx[4] = {1, 2, 2, 2};
    int8_t xv[8] = {1, -1, 2, -2, 3, -3, 5, -5}; /* channel 0: 1 2 3 5; channel 1: negated */
    kiln_tensor *x = tens(KILN_DTYPE_I8, 4, dx, xv);
    int64_t k[2] = {2, 2};
    for (int max = 0; max < 2; max++) {
        struct kiln_node *n = mk(KILN_OP_TflPool, 1);
        ais(n, "kernel", 2, k);
        ais(n, "strides", 2, k);
        ai(n, "same", 0);
        ai(n, "max", max);
        ai(n, "act_min", -128);
        ai(n, "act_max", 127);
        kiln_tensor *y = run(n, 1, &x);
        int8_t w0 = max ? 5 : 3, w1 = max ? -1 : -3; /* (11 + 2) / 4 = 3; (-11 - 2) / 4 = -3 */
        CHECK(y && kiln_tensor_count(y) == 2 && ((int8_t *)y->data)[0] == w0 &&
                  ((int8_t *)y->data)[1] == w1,
              "%s pool", max ? "max" : "average");
        kiln_tensor_free(y);
    }
    kiln_tensor_free(x);
}

static void test_softmax(void)
{
    struct tfl_softmax_params p;
    tfl_softmax_prepare(1.0f, 1.0f / 16, &p);
    int64_t d[2] = {2, 2};
    int8_t xv[4] = {0, 0, 100, -100};
    kiln_tensor *x = tens(KILN_DTYPE_I8, 2, d, xv);
    struct kiln_node *n = mk(KILN_OP_TflSoftmax, 1);
    ai(n, "input_multiplier", p.input_multiplier);
    ai(n, "input_left_shift", p.input_left_shift);
    ai(n, "diff_min", p.diff_min);
    ai(n, "to", KILN_DTYPE_I8);
    kiln_tensor *y = run(n, 1, &x);
    /* equal logits: 1/2 = 128 steps of 1/256 above -128; a gap of 12.5 in
     * float: the larger gets everything (clamped to 127), the smaller -128 */
    const int8_t want[4] = {0, 0, 127, -128};
    CHECK(y && memcmp(y->data, want, 4) == 0, "got %d %d %d %d", y ? ((int8_t *)y->data)[0] : 0,
          y ? ((int8_t *)y->data)[1] : 0, y ? ((int8_t *)y->data)[2] : 0,
          y ? ((int8_t *)y->data)[3] : 0);
    kiln_tensor_free(y);
    kiln_tensor_free(x);
}

int main(void)
{
    if (kiln_graph_new(&g) != KILN_OK) return 1;
    test_arithmetic();
    test_arithmetic16();
    test_quantize();
    test_fully_connected();
    test_conv();
    test_add();
    test_sub_mul_lut();
    test_pool();
    test_softmax();
    kiln_graph_free(g);
    return CHECK_DONE();
}
