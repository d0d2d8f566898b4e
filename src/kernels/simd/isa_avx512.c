/*
 * isa_avx512.c - the f32 kernel table for AVX-512 (F + DQ): 16 lanes.
 * The vector vocabulary of simd_body.h over __m512, compiled for
 * avx512f/avx512dq/fma by a target pragma (no per-file compiler flags); it
 * is only called after kiln_cpu_isa() reported AVX-512.
 */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/simd/simd.h"

#if defined(__clang__) /* clang ignores GCC's target pragma; it has its own form */
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx2,fma")
#endif

#include "kernels/simd/vocab_avx512.h"
#define SIMD_TABLE kiln_simd_avx512
#define SIMD_ISA "avx512"

#include "kernels/simd/simd_body.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
