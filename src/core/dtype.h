/*
 * dtype.h - element types: sizes, names, half-precision conversion and
 * generic element access for reference kernels.
 *
 * The generic accessors (kiln_get_f64 / kiln_set_f64 / kiln_get_i64 /
 * kiln_set_i64) let a reference kernel be written once for every numeric
 * dtype: floats go through double, integers through int64 (uint64 through
 * the same bits). They are for reference kernels only; fast kernels work on
 * typed pointers.
 */
#ifndef KILN_CORE_DTYPE_H
#define KILN_CORE_DTYPE_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/kiln.h"

/* kiln_f16_to_f32, kiln_f32_to_f16, kiln_bf16_to_f32 and kiln_f32_to_bf16
 * are public (include/kiln/kiln.h): the server converts with the same code. */

/*
 * Low-precision types (float8, float4, int4, int2; one element per byte).
 * Converting to a float8 or float4 rounds to nearest even. With saturate,
 * values beyond the largest finite value, infinities included, become
 * that value (NaN stays NaN); without it they become inf where the type
 * has one and NaN otherwise. float4e2m1 has neither, so it always
 * saturates (and NaN becomes -0, as ml_dtypes does).
 */
uint8_t kiln_f64_to_f8(kiln_dtype dt, double v, bool saturate); /* float8 or float4 bits */
double kiln_f8_to_f64(kiln_dtype dt, uint8_t bits);            /* float8 or float4 bits */

/* How a value between two powers of two becomes a float8e8m0 (Cast's round_mode). */
enum kiln_e8m0_round {
    KILN_E8M0_ROUND_UP,      /* to the larger power of two (ONNX's default) */
    KILN_E8M0_ROUND_DOWN,    /* to the smaller one (drop the mantissa) */
    KILN_E8M0_ROUND_NEAREST, /* by the mantissa's top bits, ties up */
};
/* float8e8m0 bits for |f|: zero becomes 2^-127 (0x00), inf and NaN 0xff;
 * saturate keeps rounding from going past 2^127 (0xfe) to NaN. */
uint8_t kiln_f32_to_e8m0(float f, bool saturate, enum kiln_e8m0_round mode);

bool kiln_dtype_is_float(kiln_dtype dt);   /* f16, bf16, f32, f64, float8, float4 */
bool kiln_dtype_is_int(kiln_dtype dt);     /* signed and unsigned integers, 2 to 64 bits */
bool kiln_dtype_is_signed(kiln_dtype dt);  /* signed ints and floats (not float8e8m0) */
bool kiln_dtype_is_numeric(kiln_dtype dt); /* floats, ints and bool */

/* Setting an integer element truncates toward zero and wraps to its width
 * (so does int4: 9 becomes -7); setting a float8 saturates; setting a
 * float8e8m0 rounds up. */
double kiln_get_f64(kiln_dtype dt, const void *data, int64_t i);
void kiln_set_f64(kiln_dtype dt, void *data, int64_t i, double v);
int64_t kiln_get_i64(kiln_dtype dt, const void *data, int64_t i);
void kiln_set_i64(kiln_dtype dt, void *data, int64_t i, int64_t v);
/* kiln_set_f64 with Cast's saturate choice for float8 types. */
void kiln_set_f64_sat(kiln_dtype dt, void *data, int64_t i, double v, bool saturate);

/* Convert one element between numeric dtypes with ONNX Cast semantics
 * (float to int truncates toward zero; out-of-range is saturated). */
void kiln_convert_elem(kiln_dtype to, void *dst, int64_t di, kiln_dtype from, const void *src,
                       int64_t si);

/* Map an ONNX TensorProto.DataType code to a Kiln dtype (UNDEFINED if none),
 * and back (0 if none). */
kiln_dtype kiln_onnx_dtype(int64_t code);
int kiln_onnx_dtype_code(kiln_dtype dt);

#endif
