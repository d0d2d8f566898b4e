/*
 * isa_scalar.c - the portable f32 kernel table: the loops of simd_body.h
 * with one lane, and libm for the math (in double where the reference
 * kernels compute in double; Gelu without their cancellation). Used on
 * CPUs without AVX2 and with KILN_ISA=scalar.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/simd/simd.h"

typedef float vf;
typedef int vm;
#define W 1
#define SIMD_SCALAR 1
#define SIMD_TABLE kiln_simd_scalar
#define SIMD_ISA "scalar"

static inline vf vld(const float *p) { return *p; }
static inline void vst(float *p, vf v) { *p = v; }
static inline vf vset(float x) { return x; }
/* a * b + c with the product exact (double), as the reference computes */
static inline vf vfma(vf a, vf b, vf c) { return (float)((double)a * b + c); }
static inline vf vmaxs(vf a, vf b) { return a > b ? a : b; }
static inline vf vmins(vf a, vf b) { return a < b ? a : b; }
static inline vm vlt(vf a, vf b) { return a < b; }
static inline vm vnan(vf a) { return a != a; }
static inline vf vsel(vm m, vf a, vf b) { return m ? b : a; }
/* vabs and vrecip12 complete every ISA's vocabulary (simd_body.h), but the
 * scalar table's math comes from libm and uses neither */
__attribute__((unused)) static inline vf vabs(vf a) { return fabsf(a); }
static inline vf vneg(vf a) { return -a; }
static inline vf vsqrt(vf a) { return sqrtf(a); }
/* 1 / a for a in [1, 2] */
__attribute__((unused)) static inline vf vrecip12(vf a) { return 1.0f / a; }
static inline float vhsum(vf a) { return a; }
static inline float vhmax(vf a) { return a; }

static inline vf v_exp(vf x) { return (float)exp(x); }
static inline vf v_tanh(vf x) { return tanhf(x); }
static inline vf v_erf(vf x) { return (float)erf(x); }
static inline vf v_sigmoid(vf x)
{
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}
static inline vf v_sigmoid_gate(vf x) { return v_sigmoid(x); }
/* Gelu through erfc and x * sigmoid(2u): no cancellation for large negative x */
static inline vf v_gelu(vf x) { return (float)(0.5 * x * erfc(-x / sqrt(2.0))); }
static inline vf v_gelu_tanh(vf x)
{
    double d = x, u = 0.7978845608028654 * (d + 0.044715 * d * d * d);
    return (float)(d / (1.0 + exp(-2.0 * u)));
}
static inline vf v_softplus(vf x)
{
    double d = x;
    return (float)(d > 0 ? d + log1p(exp(-d)) : log1p(exp(d)));
}

static inline void vtranspose(vf r[1]) { (void)r; }
static inline void vdeint(vf a, vf b, vf *even, vf *odd)
{
    *even = a;
    *odd = b;
}


#include "kernels/simd/simd_body.h"
