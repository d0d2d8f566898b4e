"""test_half_conversions.py - the exported float16 / bfloat16 conversions of kiln.h
(kiln_f16_to_f32, kiln_f32_to_f16, kiln_bf16_to_f32, kiln_f32_to_bf16), which the
runtime's kernels and the server's JSON, monitoring and shadow code all use, through
libkiln.so with ctypes.

References, independent of Kiln:
- float16: numpy's float16 casts (IEEE binary16, round to nearest even), on every
  float16 bit pattern one way and on edge and random float32 values the other way
  (zeros, subnormals and their rounding ties, the largest finite value and the
  overflow threshold 65520, infinities, NaNs with signs and payloads);
- bfloat16: an emulation that picks the nearer of the two neighbouring bfloat16
  values in float64 arithmetic, ties to the even one, and PyTorch's bfloat16 cast
  where torch is installed.
NaNs: every NaN stays a NaN with its sign. float32 -> float16 gives the quiet NaN
0x7e00 with the sign; float32 -> bfloat16 keeps the top payload bits and sets the
quiet bit; widening keeps the payload (documented in kiln.h).
"""

import ctypes as C
import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lib():
    build = os.environ.get("KILN_BUILD_DIR")
    path = Path(build) / "libkiln.so" if build else \
        Path(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln"))).parent / "libkiln.so"
    if not path.exists():
        pytest.skip(f"libkiln.so not found at {path}: build it or set KILN_BUILD_DIR")
    lib = C.CDLL(str(path))
    lib.kiln_f16_to_f32.argtypes = [C.c_uint16]
    lib.kiln_f16_to_f32.restype = C.c_float
    lib.kiln_bf16_to_f32.argtypes = [C.c_uint16]
    lib.kiln_bf16_to_f32.restype = C.c_float
    lib.kiln_f32_to_f16.argtypes = [C.c_float]
    lib.kiln_f32_to_f16.restype = C.c_uint16
    lib.kiln_f32_to_bf16.argtypes = [C.c_float]
    lib.kiln_f32_to_bf16.restype = C.c_uint16
    return lib


def f32_of_bits(u):
    return np.asarray(u, dtype=np.uint32).view(np.float32)


def bits_of_f32(f):
    return np.asarray(f, dtype=np.float32).view(np.uint32)


def call_to_bits(fn, values):
    """Call a float32 -> bits function on each value. ctypes passes c_float by value:
    build it from the bits so that NaN payloads and signs reach the function intact."""
    out = np.empty(len(values), dtype=np.uint16)
    for i, u in enumerate(bits_of_f32(values)):
        out[i] = fn(C.c_float.from_buffer_copy(int(u).to_bytes(4, "little")))
    return out


def call_from_bits(fn, bits):
    """Call a bits -> float32 function on each pattern; the results' float32 bits.
    ctypes hands a float result to Python as a double, and that widening sets the
    quiet bit of a signaling NaN: NaN results are compared with that bit masked."""
    return np.array([fn(int(b)) for b in bits], dtype=np.float32).view(np.uint32)


def edge_f32():
    """float32 edge values for both narrowings, as float32."""
    u = []
    for s in (0, 0x80000000):
        u += [s | b for b in (
            0x00000000,              # zero
            0x00000001, 0x007fffff,  # float32 subnormals
            0x7f800000,              # inf
            0x7fc00000, 0x7f800001, 0x7fffffff, 0x7fa00000, 0x7fc00001,  # NaNs
            0x7f7fffff, 0x7f7f0000, 0x7f7f8000, 0x7f7f7fff,  # float32 max, bf16 max, ties
        )]
    v = [
        2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -26,   # f16 subnormal unit, ties
        5 * 2.0 ** -25, 3 * 2.0 ** -25, 2.0 ** -14, 2.0 ** -14 - 2.0 ** -24,
        (1023.5) * 2.0 ** -24, 2.0 ** -15 + 2.0 ** -25,       # subnormal ties both ways
        65504.0, 65519.0, 65519.996, 65520.0, 65536.0, 1e38,  # max, overflow threshold
        1.0, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -11 + 2.0 ** -20,
        1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -8 + 2.0 ** -20,  # bf16 ties
        np.pi, 1 / 3, 2048.0 + 1.0, 2048.0 + 3.0, 0.1, 1e-8, 1e-40,
    ]
    vals = np.concatenate([f32_of_bits(np.array(u, dtype=np.uint32)),
                           np.array(v, dtype=np.float32), -np.array(v, dtype=np.float32)])
    rng = np.random.default_rng(21)
    rand = f32_of_bits(rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32))
    near = (rng.standard_normal(5000) * 1000).astype(np.float32)
    return np.concatenate([vals, rand, near])


def assert_nan_kept(got_nan, want_nan, got_bits, src_bits, sign_shift_got, sign_shift_src):
    """NaN exactly where the reference has one, each with the source's sign."""
    assert np.array_equal(got_nan, want_nan), "NaN where the reference has none, or the reverse"
    assert np.array_equal((got_bits[got_nan] >> sign_shift_got) & 1,
                          (src_bits[want_nan] >> sign_shift_src) & 1), "a NaN lost its sign"


def test_f16_to_f32_every_pattern(lib):
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = call_from_bits(lib.kiln_f16_to_f32, h)
    want = h.view(np.float16).astype(np.float32).view(np.uint32)
    nan = np.isnan(h.view(np.float16))
    assert np.array_equal(got[~nan], want[~nan])
    got_f = got.view(np.float32)
    assert_nan_kept(np.isnan(got_f), nan, got, h.astype(np.uint32), 31, 15)
    # payload: the 10 float16 mantissa bits become the top of the 23 (quiet bit masked)
    assert np.array_equal((got[nan] >> 13) & 0x1ff, h[nan].astype(np.uint32) & 0x1ff)


def test_f32_to_f16_matches_numpy(lib):
    x = edge_f32()
    got = call_to_bits(lib.kiln_f32_to_f16, x)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    bad = np.flatnonzero(got[~nan] != want[~nan])
    assert bad.size == 0, [(float(x[~nan][i]), hex(got[~nan][i]), hex(want[~nan][i]))
                           for i in bad[:10]]
    # NaN: the quiet NaN 0x7e00 with the input's sign
    sign = (bits_of_f32(x[nan]) >> 16) & 0x8000
    assert np.array_equal(got[nan], (sign | 0x7e00).astype(np.uint16))
    # the rounding cases the edge list was built for
    assert lib.kiln_f32_to_f16(65519.0) == 0x7bff and lib.kiln_f32_to_f16(65520.0) == 0x7c00
    assert lib.kiln_f32_to_f16(2.0 ** -25) == 0 and lib.kiln_f32_to_f16(3 * 2.0 ** -26) == 1
    assert lib.kiln_f32_to_f16(-(2.0 ** -24)) == 0x8001


def bf16_reference(x):
    """Round float32 to bfloat16 (nearest, ties to even) by comparing the two
    neighbouring bfloat16 values in float64 (past the largest finite one the
    neighbour is 2^128, i.e. infinity); NaNs give 0 here (checked separately)."""
    out = np.zeros(len(x), dtype=np.uint16)
    for i, u in enumerate(bits_of_f32(x)):
        u = int(u)
        xi = float(x[i])
        if np.isnan(xi):
            continue
        if np.isinf(xi):
            out[i] = u >> 16
            continue
        sign = u & 0x80000000
        a = u & 0xffff0000                                # toward zero
        b = sign | ((u & 0x7fff0000) + 0x10000)           # away from zero
        fa = float(f32_of_bits(np.uint32(a)))
        if (b & 0x7fffffff) == 0x7f800000:
            fb = -(2.0 ** 128) if sign else 2.0 ** 128
        else:
            fb = float(f32_of_bits(np.uint32(b)))
        da, db = abs(xi - fa), abs(fb - xi)
        out[i] = a >> 16 if da < db or (da == db and (a >> 16) & 1 == 0) else b >> 16
    return out


def test_f32_to_bf16_round_to_nearest_even(lib):
    x = edge_f32()
    got = call_to_bits(lib.kiln_f32_to_bf16, x)
    nan = np.isnan(x)
    want = bf16_reference(x)
    bad = np.flatnonzero(got[~nan] != want[~nan])
    assert bad.size == 0, [(float(x[~nan][i]), hex(got[~nan][i]), hex(want[~nan][i]))
                           for i in bad[:10]]
    # NaN: sign and top payload bits kept, quiet bit set
    src = bits_of_f32(x[nan])
    assert np.array_equal(got[nan], ((src >> 16) | 0x40).astype(np.uint16))
    # ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1 (even); 1 + 3*2^-8 -> up
    assert lib.kiln_f32_to_bf16(1.0 + 2.0 ** -8) == 0x3f80
    assert lib.kiln_f32_to_bf16(1.0 + 3 * 2.0 ** -8) == 0x3f82


def test_bf16_against_torch(lib):
    torch = pytest.importorskip("torch")
    x = edge_f32()
    nan = np.isnan(x)
    got = call_to_bits(lib.kiln_f32_to_bf16, x)
    want = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(got[~nan], want[~nan])
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    widened = call_from_bits(lib.kiln_bf16_to_f32, h)
    ref = torch.from_numpy(h.view(np.int16).copy()).view(torch.bfloat16).float().numpy()
    isnan = np.isnan(ref)
    assert np.array_equal(widened[~isnan], ref.view(np.uint32)[~isnan])
    # widening is exact, NaNs included: the bits move up 16 places (quiet bit masked)
    assert np.array_equal(widened | 0x00400000, (h.astype(np.uint32) << 16) | 0x00400000)
