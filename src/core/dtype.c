/*
 * dtype.c - element type facts, fp16/bf16 and float8/float4 conversion,
 * generic accessors.
 *
 * The float8 and float4 types follow ONNX (docs/technical/float8.md): the
 * value of a bit pattern is the usual sign / biased exponent / mantissa
 * formula with subnormals at exponent 0; the types differ in bias and in
 * which patterns are NaN or inf. Encoding rounds to nearest even in double
 * precision, where every float32 and float16 value is exact.
 */
#include "core/dtype.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_info[KILN_DTYPE_COUNT] = {
    [KILN_DTYPE_UNDEFINED] = {"undefined", 0},
    [KILN_DTYPE_F32] = {"float32", 4},
    [KILN_DTYPE_F16] = {"float16", 2},
    [KILN_DTYPE_BF16] = {"bfloat16", 2},
    [KILN_DTYPE_F64] = {"float64", 8},
    [KILN_DTYPE_I8] = {"int8", 1},
    [KILN_DTYPE_U8] = {"uint8", 1},
    [KILN_DTYPE_I16] = {"int16", 2},
    [KILN_DTYPE_U16] = {"uint16", 2},
    [KILN_DTYPE_I32] = {"int32", 4},
    [KILN_DTYPE_U32] = {"uint32", 4},
    [KILN_DTYPE_I64] = {"int64", 8},
    [KILN_DTYPE_U64] = {"uint64", 8},
    [KILN_DTYPE_BOOL] = {"bool", 1},
    [KILN_DTYPE_STRING] = {"string", sizeof(kiln_string)},
    [KILN_DTYPE_F8E4M3FN] = {"float8e4m3fn", 1},
    [KILN_DTYPE_F8E4M3FNUZ] = {"float8e4m3fnuz", 1},
    [KILN_DTYPE_F8E5M2] = {"float8e5m2", 1},
    [KILN_DTYPE_F8E5M2FNUZ] = {"float8e5m2fnuz", 1},
    [KILN_DTYPE_U4] = {"uint4", 1},
    [KILN_DTYPE_I4] = {"int4", 1},
    [KILN_DTYPE_F4E2M1] = {"float4e2m1", 1},
    [KILN_DTYPE_F8E8M0] = {"float8e8m0", 1},
    [KILN_DTYPE_U2] = {"uint2", 1},
    [KILN_DTYPE_I2] = {"int2", 1},
};
_Static_assert(KILN_DTYPE_COUNT == 25, "dtype_info needs an entry for each new dtype");

const char *kiln_dtype_name(kiln_dtype dt)
{
    if (dt == KILN_DTYPE_SEQUENCE) return "sequence";
    if (dt == KILN_DTYPE_OPTIONAL) return "optional";
    if ((unsigned)dt >= KILN_DTYPE_COUNT) return "invalid";
    return dtype_info[dt].name;
}

size_t kiln_dtype_size(kiln_dtype dt)
{
    if ((unsigned)dt >= KILN_DTYPE_COUNT) return 0;
    return dtype_info[dt].size;
}

float kiln_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while (!(mant & 0x400));
            mant &= 0x3ff;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t kiln_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u) return (uint16_t)(sign | 0x7e00); /* NaN */
    if (absx >= 0x47800000u) {                                /* overflow or inf */
        /* values that round to 65520 or above become inf */
        return (uint16_t)(sign | 0x7c00);
    }
    if (absx < 0x38800000u) { /* subnormal or zero in half */
        float a;
        memcpy(&a, &absx, 4);
        /* scale so that the half subnormal unit is 1, round to nearest even */
        float scaled = a * 16777216.0f; /* 2^24 */
        uint32_t m = (uint32_t)nearbyintf(scaled);
        return (uint16_t)(sign | m);
    }
    uint32_t mant = absx & 0x7fffff;
    uint32_t exp = (absx >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float kiln_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t kiln_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    uint32_t lsb = (x >> 16) & 1;
    x += 0x7fff + lsb;
    return (uint16_t)(x >> 16);
}

/* ---- float8 and float4 ---- */

/* Layout of a small float type. Bit patterns are magnitudes with the sign
 * in bit (bits - 1). */
struct small_float {
    int bits;       /* 8 or 4 */
    int mbits;      /* mantissa bits */
    int bias;       /* exponent bias */
    uint8_t max;    /* pattern of the largest finite magnitude */
    int inf;        /* pattern of +inf, or -1 */
    int nan;        /* pattern of NaN (sign bit included), or -1 */
    bool uz;        /* one zero: no negative zero, NaN is the -0 pattern */
};

/* The layout of dt, or NULL if dt is not a float8 / float4 type (e8m0 is not). */
static const struct small_float *small_float_of(kiln_dtype dt)
{
    static const struct small_float e4m3fn = {8, 3, 7, 0x7e, -1, 0x7f, false};
    static const struct small_float e4m3fnuz = {8, 3, 8, 0x7f, -1, 0x80, true};
    static const struct small_float e5m2 = {8, 2, 15, 0x7b, 0x7c, 0x7e, false};
    static const struct small_float e5m2fnuz = {8, 2, 16, 0x7f, -1, 0x80, true};
    static const struct small_float e2m1 = {4, 1, 1, 0x7, -1, -1, false};
    switch (dt) {
    case KILN_DTYPE_F8E4M3FN: return &e4m3fn;
    case KILN_DTYPE_F8E4M3FNUZ: return &e4m3fnuz;
    case KILN_DTYPE_F8E5M2: return &e5m2;
    case KILN_DTYPE_F8E5M2FNUZ: return &e5m2fnuz;
    case KILN_DTYPE_F4E2M1: return &e2m1;
    default: return NULL;
    }
}

double kiln_f8_to_f64(kiln_dtype dt, uint8_t bits)
{
    if (dt == KILN_DTYPE_F8E8M0) return bits == 0xff ? NAN : ldexp(1.0, (int)bits - 127);
    const struct small_float *f = small_float_of(dt);
    if (!f) return 0;
    uint8_t sign_bit = (uint8_t)(1u << (f->bits - 1));
    bits &= (uint8_t)((1u << f->bits) - 1);
    if (f->nan >= 0 && (bits == f->nan || (!f->uz && (bits & ~sign_bit) == (f->nan & ~sign_bit))))
        return NAN;
    uint8_t mag = bits & (uint8_t)~sign_bit;
    if (f->inf >= 0 && mag > f->inf) return NAN; /* e5m2: every pattern above inf is NaN */
    double v;
    if (f->inf >= 0 && mag == f->inf) {
        v = INFINITY;
    } else {
        int e = mag >> f->mbits, m = mag & ((1 << f->mbits) - 1);
        if (e == 0) v = ldexp(m, 1 - f->bias - f->mbits);
        else v = ldexp(m + (1 << f->mbits), e - f->bias - f->mbits);
    }
    return bits & sign_bit ? -v : v;
}

uint8_t kiln_f64_to_f8(kiln_dtype dt, double v, bool saturate)
{
    const struct small_float *f = small_float_of(dt);
    if (!f) return 0;
    uint8_t sign = signbit(v) ? (uint8_t)(1u << (f->bits - 1)) : 0;
    if (f->nan < 0) saturate = true; /* float4: nothing else to overflow to */
    if (isnan(v)) {
        if (f->nan < 0) return (uint8_t)(1u << (f->bits - 1)); /* float4: -0, like ml_dtypes */
        return f->uz ? (uint8_t)f->nan : (uint8_t)(f->nan | sign);
    }
    uint8_t over; /* what an out-of-range magnitude becomes */
    if (saturate) over = f->max | sign;
    else if (f->inf >= 0) over = (uint8_t)(f->inf | sign);
    else over = f->uz ? (uint8_t)f->nan : (uint8_t)(f->nan | sign);
    double a = fabs(v);
    if (isinf(a)) return over;
    if (a == 0) return f->uz ? 0 : sign;
    /* a = q * 2^(e - mbits) with q rounded to an integer; in units of the
     * smallest subnormal, the pattern is ((e - emin) << mbits) + q, which
     * carries a rounding overflow into the exponent by itself */
    int emin = 1 - f->bias;
    int e;
    frexp(a, &e);
    e -= 1; /* a in [2^e, 2^(e+1)) */
    if (e < emin) e = emin;
    if (e - emin > 48) return over;
    double q = nearbyint(ldexp(a, f->mbits - e)); /* the default mode rounds half to even */
    int64_t mag = ((int64_t)(e - emin) << f->mbits) + (int64_t)q;
    if (mag > f->max) return over;
    if (mag == 0 && f->uz) return 0;
    return (uint8_t)mag | sign;
}

uint8_t kiln_f32_to_e8m0(float f, bool saturate, enum kiln_e8m0_round mode)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    uint32_t exp = (bits >> 23) & 0xff, mant = bits & 0x7fffff;
    if (exp == 0xff) return 0xff;
    bool up = false;
    switch (mode) {
    case KILN_E8M0_ROUND_UP: up = mant != 0; break;
    case KILN_E8M0_ROUND_DOWN: up = false; break;
    case KILN_E8M0_ROUND_NEAREST: {
        /* guard bit set, and round / sticky / exponent-nonzero, as the ONNX reference does */
        bool g = mant & 0x400000, r = mant & 0x200000, s = mant & 0x1fffff;
        up = g && (r || s || exp > 0);
        break;
    }
    }
    if (up && !(saturate && exp == 0xfe)) exp++;
    return (uint8_t)exp;
}

bool kiln_dtype_is_float(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_F32: case KILN_DTYPE_F16: case KILN_DTYPE_BF16: case KILN_DTYPE_F64:
    case KILN_DTYPE_F8E4M3FN: case KILN_DTYPE_F8E4M3FNUZ: case KILN_DTYPE_F8E5M2:
    case KILN_DTYPE_F8E5M2FNUZ: case KILN_DTYPE_F4E2M1: case KILN_DTYPE_F8E8M0:
        return true;
    default:
        return false;
    }
}

bool kiln_dtype_is_int(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_I8: case KILN_DTYPE_U8: case KILN_DTYPE_I16: case KILN_DTYPE_U16:
    case KILN_DTYPE_I32: case KILN_DTYPE_U32: case KILN_DTYPE_I64: case KILN_DTYPE_U64:
    case KILN_DTYPE_I4: case KILN_DTYPE_U4: case KILN_DTYPE_I2: case KILN_DTYPE_U2:
        return true;
    default:
        return false;
    }
}

bool kiln_dtype_is_signed(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_I8: case KILN_DTYPE_I16: case KILN_DTYPE_I32: case KILN_DTYPE_I64:
    case KILN_DTYPE_I4: case KILN_DTYPE_I2:
        return true;
    case KILN_DTYPE_F8E8M0:
        return false;
    default:
        return kiln_dtype_is_float(dt);
    }
}

bool kiln_dtype_is_numeric(kiln_dtype dt)
{
    return kiln_dtype_is_float(dt) || kiln_dtype_is_int(dt) || dt == KILN_DTYPE_BOOL;
}

double kiln_get_f64(kiln_dtype dt, const void *data, int64_t i)
{
    switch (dt) {
    case KILN_DTYPE_F32: return ((const float *)data)[i];
    case KILN_DTYPE_F16: return kiln_f16_to_f32(((const uint16_t *)data)[i]);
    case KILN_DTYPE_BF16: return kiln_bf16_to_f32(((const uint16_t *)data)[i]);
    case KILN_DTYPE_F64: return ((const double *)data)[i];
    case KILN_DTYPE_I8: return ((const int8_t *)data)[i];
    case KILN_DTYPE_U8: return ((const uint8_t *)data)[i];
    case KILN_DTYPE_I16: return ((const int16_t *)data)[i];
    case KILN_DTYPE_U16: return ((const uint16_t *)data)[i];
    case KILN_DTYPE_I32: return ((const int32_t *)data)[i];
    case KILN_DTYPE_U32: return ((const uint32_t *)data)[i];
    case KILN_DTYPE_I64: return (double)((const int64_t *)data)[i];
    case KILN_DTYPE_U64: return (double)((const uint64_t *)data)[i];
    case KILN_DTYPE_BOOL: return ((const uint8_t *)data)[i] != 0;
    case KILN_DTYPE_I4: case KILN_DTYPE_I2: return ((const int8_t *)data)[i];
    case KILN_DTYPE_U4: case KILN_DTYPE_U2: return ((const uint8_t *)data)[i];
    case KILN_DTYPE_F8E4M3FN: case KILN_DTYPE_F8E4M3FNUZ: case KILN_DTYPE_F8E5M2:
    case KILN_DTYPE_F8E5M2FNUZ: case KILN_DTYPE_F4E2M1: case KILN_DTYPE_F8E8M0:
        return kiln_f8_to_f64(dt, ((const uint8_t *)data)[i]);
    default: return 0;
    }
}

static float f32_from_double(double v) { return (float)v; }

void kiln_set_f64(kiln_dtype dt, void *data, int64_t i, double v)
{
    kiln_set_f64_sat(dt, data, i, v, true);
}

void kiln_set_f64_sat(kiln_dtype dt, void *data, int64_t i, double v, bool saturate)
{
    switch (dt) {
    case KILN_DTYPE_F8E4M3FN: case KILN_DTYPE_F8E4M3FNUZ: case KILN_DTYPE_F8E5M2:
    case KILN_DTYPE_F8E5M2FNUZ: case KILN_DTYPE_F4E2M1:
        ((uint8_t *)data)[i] = kiln_f64_to_f8(dt, v, saturate);
        break;
    case KILN_DTYPE_F8E8M0:
        ((uint8_t *)data)[i] = kiln_f32_to_e8m0((float)v, saturate, KILN_E8M0_ROUND_UP);
        break;
    case KILN_DTYPE_F32: ((float *)data)[i] = f32_from_double(v); break;
    case KILN_DTYPE_F16: ((uint16_t *)data)[i] = kiln_f32_to_f16((float)v); break;
    case KILN_DTYPE_BF16: ((uint16_t *)data)[i] = kiln_f32_to_bf16((float)v); break;
    case KILN_DTYPE_F64: ((double *)data)[i] = v; break;
    case KILN_DTYPE_BOOL: ((uint8_t *)data)[i] = v != 0; break;
    default: {
        /* integers: truncate toward zero and saturate; NaN becomes 0 */
        int64_t iv;
        if (isnan(v)) iv = 0;
        else if (dt == KILN_DTYPE_U64) {
            uint64_t u = v <= 0 ? 0 : v >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)v;
            ((uint64_t *)data)[i] = u;
            return;
        } else if (v >= 9223372036854775807.0) iv = INT64_MAX;
        else if (v <= -9223372036854775808.0) iv = INT64_MIN;
        else iv = (int64_t)v;
        kiln_set_i64(dt, data, i, iv);
    }
    }
}

int64_t kiln_get_i64(kiln_dtype dt, const void *data, int64_t i)
{
    switch (dt) {
    case KILN_DTYPE_I8: return ((const int8_t *)data)[i];
    case KILN_DTYPE_U8: return ((const uint8_t *)data)[i];
    case KILN_DTYPE_I16: return ((const int16_t *)data)[i];
    case KILN_DTYPE_U16: return ((const uint16_t *)data)[i];
    case KILN_DTYPE_I32: return ((const int32_t *)data)[i];
    case KILN_DTYPE_U32: return ((const uint32_t *)data)[i];
    case KILN_DTYPE_I64: return ((const int64_t *)data)[i];
    case KILN_DTYPE_U64: return (int64_t)((const uint64_t *)data)[i];
    case KILN_DTYPE_BOOL: return ((const uint8_t *)data)[i] != 0;
    case KILN_DTYPE_I4: case KILN_DTYPE_I2: return ((const int8_t *)data)[i];
    case KILN_DTYPE_U4: case KILN_DTYPE_U2: return ((const uint8_t *)data)[i];
    default: {
        double v = kiln_get_f64(dt, data, i);
        if (isnan(v)) return 0;
        if (v >= 9223372036854775807.0) return INT64_MAX;
        if (v <= -9223372036854775808.0) return INT64_MIN;
        return (int64_t)v;
    }
    }
}

void kiln_set_i64(kiln_dtype dt, void *data, int64_t i, int64_t v)
{
    switch (dt) {
    case KILN_DTYPE_I8: ((int8_t *)data)[i] = (int8_t)v; break;
    case KILN_DTYPE_U8: ((uint8_t *)data)[i] = (uint8_t)v; break;
    case KILN_DTYPE_I16: ((int16_t *)data)[i] = (int16_t)v; break;
    case KILN_DTYPE_U16: ((uint16_t *)data)[i] = (uint16_t)v; break;
    case KILN_DTYPE_I32: ((int32_t *)data)[i] = (int32_t)v; break;
    case KILN_DTYPE_U32: ((uint32_t *)data)[i] = (uint32_t)v; break;
    case KILN_DTYPE_I64: ((int64_t *)data)[i] = v; break;
    case KILN_DTYPE_U64: ((uint64_t *)data)[i] = (uint64_t)v; break;
    case KILN_DTYPE_BOOL: ((uint8_t *)data)[i] = v != 0; break;
    /* sub-byte integers keep their low bits, sign-extended for the signed ones */
    case KILN_DTYPE_I4: ((int8_t *)data)[i] = (int8_t)((v & 0xf) ^ 0x8) - 8; break;
    case KILN_DTYPE_U4: ((uint8_t *)data)[i] = (uint8_t)(v & 0xf); break;
    case KILN_DTYPE_I2: ((int8_t *)data)[i] = (int8_t)((v & 0x3) ^ 0x2) - 2; break;
    case KILN_DTYPE_U2: ((uint8_t *)data)[i] = (uint8_t)(v & 0x3); break;
    default: kiln_set_f64(dt, data, i, (double)v); break;
    }
}

void kiln_convert_elem(kiln_dtype to, void *dst, int64_t di, kiln_dtype from, const void *src,
                       int64_t si)
{
    if (kiln_dtype_is_float(from)) {
        double v = kiln_get_f64(from, src, si);
        if (kiln_dtype_is_int(to)) {
            /* ONNX Cast float->int: truncate; out of range is undefined, we saturate */
            kiln_set_f64(to, dst, di, trunc(v));
        } else {
            kiln_set_f64(to, dst, di, v);
        }
    } else if (from == KILN_DTYPE_U64) {
        uint64_t u = ((const uint64_t *)src)[si];
        if (kiln_dtype_is_float(to)) kiln_set_f64(to, dst, di, (double)u);
        else kiln_set_i64(to, dst, di, (int64_t)u);
    } else {
        int64_t v = kiln_get_i64(from, src, si);
        if (kiln_dtype_is_float(to)) kiln_set_f64(to, dst, di, (double)v);
        else kiln_set_i64(to, dst, di, v);
    }
}

/* ONNX TensorProto.DataType codes (a fact of the ONNX format, used by the
 * importer and by kernels whose attributes name dtypes: Cast, EyeLike, ...). */
kiln_dtype kiln_onnx_dtype(int64_t code)
{
    switch (code) {
    case 1: return KILN_DTYPE_F32;
    case 2: return KILN_DTYPE_U8;
    case 3: return KILN_DTYPE_I8;
    case 4: return KILN_DTYPE_U16;
    case 5: return KILN_DTYPE_I16;
    case 6: return KILN_DTYPE_I32;
    case 7: return KILN_DTYPE_I64;
    case 8: return KILN_DTYPE_STRING;
    case 9: return KILN_DTYPE_BOOL;
    case 10: return KILN_DTYPE_F16;
    case 11: return KILN_DTYPE_F64;
    case 12: return KILN_DTYPE_U32;
    case 13: return KILN_DTYPE_U64;
    case 16: return KILN_DTYPE_BF16;
    case 17: return KILN_DTYPE_F8E4M3FN;
    case 18: return KILN_DTYPE_F8E4M3FNUZ;
    case 19: return KILN_DTYPE_F8E5M2;
    case 20: return KILN_DTYPE_F8E5M2FNUZ;
    case 21: return KILN_DTYPE_U4;
    case 22: return KILN_DTYPE_I4;
    case 23: return KILN_DTYPE_F4E2M1;
    case 24: return KILN_DTYPE_F8E8M0;
    case 25: return KILN_DTYPE_U2;
    case 26: return KILN_DTYPE_I2;
    default: return KILN_DTYPE_UNDEFINED;
    }
}

int kiln_onnx_dtype_code(kiln_dtype dt)
{
    for (int c = 1; c <= 26; c++)
        if (kiln_onnx_dtype(c) == dt) return c;
    return 0;
}
