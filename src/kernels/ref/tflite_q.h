/*
 * tflite_q.h - TFLite's integer arithmetic, for the quantized Tfl* ops.
 *
 * TFLite's quantized kernels rescale int32 accumulators with a fixed-point
 * multiplier in [2^30, 2^31) and a power-of-two shift, using gemmlowp's
 * rounding primitives; the results of a model depend on every rounding
 * choice, so Kiln reproduces them exactly: SaturatingRoundingDoublingHighMul,
 * RoundingDivideByPOT, MultiplyByQuantizedMultiplier (int32 and, for the
 * 16x8 kernels, int64 accumulators), the multiplier
 * preparation (QuantizeMultiplier, in double, rounding half away from zero)
 * and the parameter preparation of ADD and SOFTMAX. The importer
 * (src/import/tflite_lower.c) uses the preparation functions to fill the
 * ops' attributes; the reference kernels (tflite_q.c) use the rest.
 * Everything here is plain integer C with no undefined behaviour for any
 * int32 input (shifts are done on unsigned values or after range checks).
 */
#ifndef KILN_KERNELS_REF_TFLITE_Q_H
#define KILN_KERNELS_REF_TFLITE_Q_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/* gemmlowp SaturatingRoundingDoublingHighMul: round(a * b / 2^31), the one
 * overflowing case (INT32_MIN squared) saturated. */
static inline int32_t tfl_srdhm(int32_t a, int32_t b)
{
    if (a == INT32_MIN && b == INT32_MIN) return INT32_MAX;
    int64_t ab = (int64_t)a * (int64_t)b;
    int64_t nudge = ab >= 0 ? (1 << 30) : (1 - (1 << 30));
    return (int32_t)((ab + nudge) / ((int64_t)1 << 31));
}

/* gemmlowp RoundingDivideByPOT: x / 2^exponent rounded half away from zero. */
static inline int32_t tfl_rdbpot(int32_t x, int exponent)
{
    if (exponent <= 0) return x;
    if (exponent > 31) exponent = 31;
    int32_t mask = (int32_t)(((int64_t)1 << exponent) - 1);
    int32_t remainder = x & mask;
    int32_t threshold = (mask >> 1) + (x < 0 ? 1 : 0);
    return (x >> exponent) + (remainder > threshold ? 1 : 0);
}

/* x * 2^shift with int32 saturation (gemmlowp SaturatingRoundingMultiplyByPOT
 * for a positive exponent). */
static inline int32_t tfl_sat_shl(int32_t x, int shift)
{
    int64_t v = (int64_t)x * ((int64_t)1 << shift);
    return v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : (int32_t)v;
}

/* TFLite MultiplyByQuantizedMultiplier: x * q * 2^shift / 2^31, rounded. The
 * left shift wraps like TFLite's int32 multiply (done in unsigned here). */
static inline int32_t tfl_mul_by_qm(int32_t x, int32_t q, int shift)
{
    int left = shift > 0 ? shift : 0, right = shift > 0 ? 0 : -shift;
    int32_t xs = (int32_t)((uint32_t)x << left);
    return tfl_rdbpot(tfl_srdhm(xs, q), right);
}

/* TFLite QuantizeMultiplier: real = q * 2^(shift - 31), q in [2^30, 2^31). */
static inline void tfl_quantize_multiplier(double real, int32_t *q_out, int *shift_out)
{
    if (!(real > 0) || !isfinite(real)) {
        *q_out = 0;
        *shift_out = 0;
        return;
    }
    int shift;
    double q = frexp(real, &shift);
    int64_t qf = (int64_t)round(q * (double)((int64_t)1 << 31));
    if (qf == ((int64_t)1 << 31)) {
        qf /= 2;
        shift++;
    }
    if (shift < -31) {
        shift = 0;
        qf = 0;
    }
    if (shift > 30) { /* TFLite saturates multipliers too large to represent */
        shift = 30;
        qf = ((int64_t)1 << 31) - 1;
    }
    *q_out = (int32_t)qf;
    *shift_out = shift;
}

/* TFLite's MultiplyByQuantizedMultiplier for an int64 accumulator (the 16x8
 * kernels): the multiplier reduced to 16 bits, one rounding shift. The
 * product is taken in unsigned arithmetic so that no input is undefined
 * behaviour (TFLite assumes |x| < 2^47, where it is exact). */
static inline int32_t tfl_mul_by_qm64(int64_t x, int32_t q, int shift)
{
    int32_t reduced = q < 0x7FFF0000 ? (q + (1 << 15)) >> 16 : 0x7FFF;
    int total_shift = 15 - shift; /* shift in [-31, 7]: 8 .. 46 */
    uint64_t v = (uint64_t)x * (uint64_t)(int64_t)reduced + ((uint64_t)1 << (total_shift - 1));
    return (int32_t)((int64_t)v >> total_shift);
}

/* TFLite's CheckedLog2: *log2 = round(log2(x)) (in float); true when x is a
 * power of two to within 1e-3 of an exponent. */
static inline int tfl_checked_log2(float x, int *log2_out)
{
    float l = logf(x) * (1.0f / logf(2.0f));
    float r = roundf(l);
    *log2_out = (int)fmaxf(-1000.0f, fminf(1000.0f, r));
    return fabsf(l - r) < 1e-3f;
}

/* The input rescaling of the int16 LOGISTIC and TANH kernels (activations.cc,
 * kInputIntegerBits 3): a power-of-two input scale keeps multiplier 0 (the
 * kernel then uses 3 << left_shift), any other scale gets a multiplier below
 * 2^15 taking it to 1 / (3 * 4096). Returns the multiplier, sets *left_shift. */
static inline int32_t tfl_act16_prepare(float input_scale, bool tanh_, int *left_shift)
{
    int l2;
    bool pot = tfl_checked_log2(input_scale, &l2);
    *left_shift = (15 - 3) + l2;
    pot = pot && (*left_shift == 0 || (tanh_ && *left_shift == 1));
    if (pot) return 0;
    double m = (double)input_scale * 4096.0 * 3.0;
    *left_shift = 0;
    while (m <= 32767.0 / 2.0 && *left_shift <= 30) {
        (*left_shift)++;
        m *= 2.0;
    }
    return m < 2147483647.0 ? (int32_t)m : INT32_MAX;
}

/* Parameters of quantized ADD (TFLite add.cc, 8-bit inputs: left_shift 20). */
struct tfl_add_params {
    int32_t input1_offset, input2_offset, output_offset, left_shift;
    int32_t input1_multiplier, input2_multiplier, output_multiplier;
    int input1_shift, input2_shift, output_shift;
};

static inline void tfl_add_prepare(float s1, int32_t z1, float s2, int32_t z2, float so,
                                   int32_t zo, int left_shift, struct tfl_add_params *p)
{
    p->input1_offset = -z1;
    p->input2_offset = -z2;
    p->output_offset = zo;
    p->left_shift = left_shift; /* 20 for 8-bit, 15 for int16 (general scales) */
    double twice_max = 2 * (double)(s1 > s2 ? s1 : s2);
    double r1 = (double)s1 / twice_max, r2 = (double)s2 / twice_max;
    double ro = twice_max / ((double)(1 << p->left_shift) * (double)so);
    tfl_quantize_multiplier(r1, &p->input1_multiplier, &p->input1_shift);
    tfl_quantize_multiplier(r2, &p->input2_multiplier, &p->input2_shift);
    tfl_quantize_multiplier(ro, &p->output_multiplier, &p->output_shift);
}

/* Parameters of quantized SOFTMAX (PreprocessSoftmaxScaling with 5 integer
 * bits for the scaled differences, CalculateInputRadius). */
struct tfl_softmax_params {
    int32_t input_multiplier;
    int input_left_shift;
    int32_t diff_min;
};

static inline void tfl_softmax_prepare(float beta, float input_scale, struct tfl_softmax_params *p)
{
    const int int_bits = 5;
    double real = (double)beta * (double)input_scale * (double)(1 << (31 - int_bits));
    double cap = (double)(((int64_t)1 << 31) - 1);
    if (real > cap) real = cap;
    tfl_quantize_multiplier(real, &p->input_multiplier, &p->input_left_shift);
    if (p->input_left_shift < 0) { /* TFLite requires a multiplier >= 1 here */
        p->input_left_shift = 0;
    }
    double max_rescaled = 1.0 * ((1 << int_bits) - 1) * (double)((int64_t)1 << (31 - int_bits)) /
                          (double)((int64_t)1 << p->input_left_shift);
    p->diff_min = -(int32_t)floor(max_rescaled);
}

#endif
