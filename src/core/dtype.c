/*
 * dtype.c - element type facts, fp16/bf16 conversion, generic accessors.
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
};

const char *kiln_dtype_name(kiln_dtype dt)
{
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

bool kiln_dtype_is_float(kiln_dtype dt)
{
    return dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16 ||
           dt == KILN_DTYPE_F64;
}

bool kiln_dtype_is_int(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_I8: case KILN_DTYPE_U8: case KILN_DTYPE_I16: case KILN_DTYPE_U16:
    case KILN_DTYPE_I32: case KILN_DTYPE_U32: case KILN_DTYPE_I64: case KILN_DTYPE_U64:
        return true;
    default:
        return false;
    }
}

bool kiln_dtype_is_signed(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_I8: case KILN_DTYPE_I16: case KILN_DTYPE_I32: case KILN_DTYPE_I64:
        return true;
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
    default: return 0;
    }
}

static float f32_from_double(double v) { return (float)v; }

void kiln_set_f64(kiln_dtype dt, void *data, int64_t i, double v)
{
    switch (dt) {
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
