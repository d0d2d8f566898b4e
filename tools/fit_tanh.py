#!/usr/bin/python3
"""fit_tanh.py - refit the rational tanh of Kiln's SIMD tables (src/kernels/simd/simd_body.h,
v_tanh): tanh(x) ~ x P(x^2) / Q(x^2) on [0, 9], P and Q of degree 4, Q(0) = 1, fitted for
relative error by weighted least squares with Lawson reweighting, then checked in float32
arithmetic (Horner in float32, as the kernel evaluates it) on [-9.5, 9.5] and [1e-30, 1].

    /usr/bin/python3 tools/fit_tanh.py

prints the coefficients (lowest degree first) and the errors; v_tanh uses the 60-iteration
fit. Needs numpy only.
"""
import numpy as np

CLAMP = 9.0  # tanh(9) rounds to 1 - 2^-24 in float32


def fit(dp=4, dq=4, iters=60):
    x = np.concatenate([np.linspace(1e-4, 1, 4000), np.linspace(1, CLAMP, 8000)])
    t, f = x * x, np.tanh(x)
    w = np.ones_like(x)
    for _ in range(iters):
        # x P(t) - f (Q(t) - 1) = f, relative to f
        a = np.concatenate([x[:, None] * t[:, None] ** np.arange(dp + 1),
                            -(f[:, None] * t[:, None] ** np.arange(1, dq + 1))], axis=1)
        sol, *_ = np.linalg.lstsq(a * (w / f)[:, None], w, rcond=None)
        p, q = sol[:dp + 1], np.concatenate([[1.0], sol[dp + 1:]])
        err = np.abs(x * np.polyval(p[::-1], t) / np.polyval(q[::-1], t) / f - 1)
        w = w * (1 + 50 * err / err.max())
        w /= w.mean()
    return p, q, err.max()


def check_f32(p, q):
    xs = np.concatenate([np.linspace(-9.5, 9.5, 4000001), np.logspace(-30, 0, 100000)])
    xs = xs.astype(np.float32)
    xc = np.minimum(np.float32(CLAMP), np.maximum(np.float32(-CLAMP), xs))
    t = (xc * xc).astype(np.float32)
    pp = np.float32(p[-1])
    for c in p[-2::-1]:
        pp = (pp * t + np.float32(c)).astype(np.float32)
    qq = np.float32(q[-1])
    for c in q[-2::-1]:
        qq = (qq * t + np.float32(c)).astype(np.float32)
    y = ((xc * pp).astype(np.float32) / qq).astype(np.float32)
    ref = np.tanh(xs.astype(np.float64))
    ulp = np.abs(y - ref) / np.spacing(np.abs(ref).astype(np.float32))
    return ulp.max(), ulp.mean()


if __name__ == "__main__":
    p, q, e = fit()
    worst, mean = check_f32(p, q)
    print("P:", ", ".join(repr(float(np.float32(c))) for c in p))
    print("Q:", ", ".join(repr(float(np.float32(c))) for c in q))
    print("relative error %.2e exact; float32: at most %.2f ulp, %.3f on average" % (e, worst, mean))
    qmin = np.polyval(q[::-1], np.linspace(0, CLAMP * CLAMP, 1000)).min()
    print("Q's minimum on [0, 81]: %.3f (no pole)" % qmin)
