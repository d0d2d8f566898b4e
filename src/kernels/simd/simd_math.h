/*
 * simd_math.h - exp and sigmoid over the vector vocabulary of simd_body.h
 * (vf, vset, vfma, vmins, vmaxs, vround, vpow2i, vneg, vabs, vlt, vsel,
 * vrecip12), shared by the kernel tables (simd_body.h) and by kernels that
 * apply an activation in registers (mbconv_avx512.c). Include it after the
 * vocabulary is defined; not for SIMD_SCALAR (libm there).
 */
#ifndef KILN_KERNELS_SIMD_SIMD_MATH_H
#define KILN_KERNELS_SIMD_SIMD_MATH_H

/* e^r for the reduced argument r (|r| <= ln2 / 2, plus lo): the Cephes expf polynomial. */
static inline vf v_exp_reduced(vf r)
{
    vf r2 = r * r;
    vf q45 = vfma(vset(1.9875691500e-4f), r, vset(1.3981999507e-3f));
    vf q23 = vfma(vset(8.3334519073e-3f), r, vset(4.1665795894e-2f));
    vf q01 = vfma(vset(1.6666665459e-1f), r, vset(5.0000001201e-1f));
    vf p = vfma(vfma(q45, r2, q23), r2, q01);
    return vfma(p, r2, r) + vset(1.0f);
}

/* exp(hi + lo) with |lo| < 2; Cody-Waite reduction (hi's part exact), the
 * Cephes expf polynomial, and 2^n applied in two halves so that results
 * overflow to inf and underflow gradually through the denormals (in one
 * scalef instruction where the vocabulary defines KILN_V_SCALEF). */
static inline vf v_exp2s(vf hi, vf lo, float shift)
{
    hi = vmins(vset(89.0f), vmaxs(vset(-120.0f), hi)); /* NaN passes; 2^n halves stay normal */
    vf n = vround((hi + lo) * vset(1.44269504088896341f));
    vf r = vfma(n, vset(-0.693359375f), hi);
    r = vfma(n, vset(2.12194440e-4f), r);
    vf y = v_exp_reduced(r + lo);
#ifdef KILN_V_SCALEF
    return vscalef(y, n + vset(shift)); /* y * 2^(n + shift), one rounding */
#else
    vf n1 = vround(n * vset(0.5f));
    vf n2 = n - n1 + vset(shift);
    return y * vpow2i(n1) * vpow2i(n2);
#endif
}

/* exp(hi + lo); v_exp2s(hi, lo, s) is exp(hi + lo) * 2^s (s in [0, 32]), for
 * callers that scale a result that would be denormal before rounding it. */
static inline vf v_exp2(vf hi, vf lo) { return v_exp2s(hi, lo, 0.0f); }
static inline vf v_exp(vf x) { return v_exp2(x, vset(-0.0f)); }

/* exp(x) with x clamped to [-87, 88], where every result is a normal float:
 * 2^n in one step, not two halves (without scalef, the halves cost a third
 * of v_exp). Bit for bit v_exp(x) inside that range. For the activations,
 * whose results saturate long before either end. */
static inline vf v_exp_normal(vf x)
{
#ifdef KILN_V_SCALEF
    return v_exp(x);
#else
    x = vmins(vset(88.0f), vmaxs(vset(-87.0f), x)); /* NaN passes */
    vf n = vround(x * vset(1.44269504088896341f));
    vf r = vfma(n, vset(-0.693359375f), x);
    r = vfma(n, vset(2.12194440e-4f), r);
    return v_exp_reduced(r) * vpow2i(n);
#endif
}

/* Sigmoid: 1 / (1 + e^-|x|), times e^-|x| for x < 0 (vrecip12: the reciprocal of a value
 * in [1, 2]). e^-|x| is made as e^-|x| 2^24, whose 2^n stays normal in one step down to
 * -|x| = -104 (where sigmoid is below half the smallest denormal), and the product for
 * x < 0 scaled back last, so the denormal tail rounds once: v_exp's two halves of 2^n are
 * not needed. */
static inline vf v_sigmoid(vf v)
{
    vf t = vmaxs(vset(-104.0f), vneg(vabs(v))); /* NaN passes */
    vf n = vround(t * vset(1.44269504088896341f));
    vf r = vfma(n, vset(-0.693359375f), t);
    r = vfma(n, vset(2.12194440e-4f), r);
    vf e24 = v_exp_reduced(r) * vpow2i(n + vset(24.0f)); /* e^t 2^24 */
    vf q = vrecip12(vfma(e24, vset(0x1p-24f), vset(1.0f)));
    return vsel(vlt(v, vset(0.0f)), q, (e24 * q) * vset(0x1p-24f));
}

/* v_sigmoid for a gate that multiplies a state (the recurrent cells): the
 * same for x >= -87; below, e^-87 (1.6e-38) rather than the denormal tail. */
static inline vf v_sigmoid_gate(vf v)
{
    vf e = v_exp_normal(vneg(vabs(v)));
    vf r = vrecip12(vset(1.0f) + e);
    return vsel(vlt(v, vset(0.0f)), r, e * r);
}

#endif
