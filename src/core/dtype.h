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

float kiln_f16_to_f32(uint16_t h);
uint16_t kiln_f32_to_f16(float f);
float kiln_bf16_to_f32(uint16_t h);
uint16_t kiln_f32_to_bf16(float f);

bool kiln_dtype_is_float(kiln_dtype dt);   /* f16, bf16, f32, f64 */
bool kiln_dtype_is_int(kiln_dtype dt);     /* signed and unsigned integers */
bool kiln_dtype_is_signed(kiln_dtype dt);  /* signed ints and floats */
bool kiln_dtype_is_numeric(kiln_dtype dt); /* floats, ints and bool */

double kiln_get_f64(kiln_dtype dt, const void *data, int64_t i);
void kiln_set_f64(kiln_dtype dt, void *data, int64_t i, double v);
int64_t kiln_get_i64(kiln_dtype dt, const void *data, int64_t i);
void kiln_set_i64(kiln_dtype dt, void *data, int64_t i, int64_t v);

/* Convert one element between numeric dtypes with ONNX Cast semantics
 * (float to int truncates toward zero; out-of-range is saturated). */
void kiln_convert_elem(kiln_dtype to, void *dst, int64_t di, kiln_dtype from, const void *src,
                       int64_t si);

#endif
