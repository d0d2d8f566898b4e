"""test_tflite.py - TFLite import, end to end through the CLI.

Drives `kiln inspect FILE` and `kiln predict FILE --input NAME=X.npy
--output-dir OUT` on the TFLite models in ../shared/testdata/tflite (see its
README, section 3), checking known answers:

  * half_plus_two (y = x / 2 + 2), the add models (sums of their inputs),
    the tensorflow-onnx regression model (affine in x), hello_world float
    and int8 against sin(x) within the models' known error;
  * the int8 models bit for bit against an independent implementation of
    TFLite's integer arithmetic written here in numpy from TFLite's
    reference kernels (MultiplyByQuantizedMultiplier and friends), reading
    weights and quantization parameters with a small FlatBuffer reader of
    its own (hello_world int8's fully connected layers, pc_conv's quantize,
    per-channel depthwise convolution and dequantize, simple_add's int8 ADD);
  * the person detector on tflite-micro's two test images giving the
    expected labels;
  * lstm.bin (a one-step LSTM with layer norm, projection and cell_clip) and
    LSTMs written here (CIFG, peepholes, projection, layer norm, clipping,
    the BASIC kernel) against a numpy LSTM following TFLite's lstm_eval.cc;
  * hybrid LSTMs against a float32 transcription of TFLite's hybrid path, and
    fully integer LSTMs (TFLite's 8x8_16 kernel) bit for bit against a numpy
    emulation of its integer arithmetic (gemmlowp's 16-bit fixed point, the
    integer layer norm), written here from TFLite's reference kernels;
  * the refused models (custom ops, a file whose intermediate
    tensor has the wrong type) failing with one line naming the op;
  * truncated and bit-flipped copies of a shared model loading or failing
    cleanly.

KILN_BIN is the kiln binary (default build/kiln); KILN_TESTDATA the shared
test data (default ../shared/testdata); tests needing what is absent skip
with a message.
"""
import math
import os
import pathlib
import random
import shutil
import struct
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
KILN = pathlib.Path(os.environ.get("KILN_BIN") or ROOT / "build" / "kiln")
TESTDATA = pathlib.Path(os.environ.get("KILN_TESTDATA") or ROOT.parent / "shared" / "testdata")
TFL = TESTDATA / "tflite"
MICRO = TFL / "tflite-micro/tensorflow/lite/micro"
TFLITE_TD = TFL / "tensorflow/tensorflow/lite"
SERVING = TFL / "serving/tensorflow_serving/servables/tensorflow/testdata"
TIMEOUT_S = 60

pytestmark = [
    pytest.mark.skipif(not os.access(KILN, os.X_OK),
                       reason=f"kiln binary not found at {KILN} (build it, or set KILN_BIN)"),
    pytest.mark.skipif(not TFL.is_dir(),
                       reason=f"shared TFLite models not found at {TFL} (set KILN_TESTDATA)"),
]


def kiln(*args, timeout=TIMEOUT_S):
    return subprocess.run([str(KILN), *map(str, args)], capture_output=True, text=True,
                          errors="replace", timeout=timeout)


def predict(model, inputs, tmp, expect_ok=True, flags=()):
    """Run `kiln predict`; returns {output file stem: array} (or the process on error)."""
    tmp = pathlib.Path(tmp)
    out = tmp / "out"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    args = ["predict", model, "--output-dir", out, *flags]
    for i, (name, arr) in enumerate(inputs.items()):
        p = tmp / f"in{i}.npy"
        np.save(p, arr)
        args += ["--input", f"{name}={p}"]
    r = kiln(*args)
    if not expect_ok:
        return r
    assert r.returncode == 0, r.stderr
    return {p.stem: np.load(p) for p in out.glob("*.npy")}


def assert_clean_error(r, pattern):
    assert r.returncode != 0
    assert "Sanitizer" not in r.stderr and "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("kiln: "), r.stderr
    if pattern:
        import re
        assert re.search(pattern, lines[0]), lines[0]


# ------------------------------------------------- an independent FlatBuffer reader


class Flat:
    """Just enough of the FlatBuffer wire format to read TFLite tensors (no
    checks: it is only run on the shared, valid models)."""

    def __init__(self, data):
        self.b = data

    def _u32(self, o):
        return struct.unpack_from("<I", self.b, o)[0]

    def table(self, pos):
        vt = pos - struct.unpack_from("<i", self.b, pos)[0]
        return pos, vt, struct.unpack_from("<H", self.b, vt)[0]

    def root(self):
        return self.table(self._u32(0))

    def _field(self, t, i):
        pos, vt, vlen = t
        if 4 + 2 * i >= vlen:
            return 0
        o = struct.unpack_from("<H", self.b, vt + 4 + 2 * i)[0]
        return pos + o if o else 0

    def _ref(self, t, i):
        f = self._field(t, i)
        return f + self._u32(f) if f else 0

    def scalar(self, t, i, fmt, default):
        f = self._field(t, i)
        return struct.unpack_from("<" + fmt, self.b, f)[0] if f else default

    def vec(self, t, i, fmt):
        p = self._ref(t, i)
        if not p:
            return []
        n = self._u32(p)
        return list(struct.unpack_from(f"<{n}{fmt}", self.b, p + 4))

    def tables(self, t, i):
        p = self._ref(t, i)
        if not p:
            return []
        return [self.table(p + 4 + 4 * k + self._u32(p + 4 + 4 * k)) for k in range(self._u32(p))]

    def string(self, t, i):
        p = self._ref(t, i)
        return self.b[p + 4:p + 4 + self._u32(p)].decode() if p else ""


TYPES = {0: np.float32, 2: np.int32, 3: np.uint8, 7: np.int16, 9: np.int8}


def read_tensors(path):
    """{tensor name: (data array or None, scales, zero points)} of subgraph 0,
    and the operators as (builtin code, inputs (None where absent), outputs)."""
    fb = Flat(pathlib.Path(path).read_bytes())
    model = fb.root()
    buffers = [fb.vec(b, 0, "B") for b in fb.tables(model, 4)]
    codes = [max(fb.scalar(c, 0, "b", 0), fb.scalar(c, 3, "i", 0)) for c in fb.tables(model, 1)]
    sg = fb.tables(model, 2)[0]
    tensors = {}
    names = []
    for t in fb.tables(sg, 0):
        name = fb.string(t, 3)
        shape = fb.vec(t, 0, "i")
        dtype = TYPES.get(fb.scalar(t, 1, "b", 0))
        raw = bytes(buffers[fb.scalar(t, 2, "I", 0)])
        data = np.frombuffer(raw, dtype=dtype).reshape(shape) if raw else None
        q = fb._ref(t, 4)
        scales, zps = [], []
        if q:
            qt = fb.table(q)
            scales = fb.vec(qt, 2, "f")
            zps = fb.vec(qt, 3, "q")
        tensors[name] = (data, np.array(scales, np.float32), np.array(zps, np.int64))
        names.append(name)
    ops = [(codes[fb.scalar(o, 0, "I", 0)],
            [names[i] if i >= 0 else None for i in fb.vec(o, 1, "i")],
            [names[i] for i in fb.vec(o, 2, "i")]) for o in fb.tables(sg, 3)]
    return tensors, ops


# ------------------------------------------- TFLite's integer arithmetic in numpy


def srdhm(a, b):
    """SaturatingRoundingDoublingHighMul, elementwise on int64 arrays."""
    ab = np.asarray(a, np.int64) * np.asarray(b, np.int64)
    nudged = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    q = np.where(nudged >= 0, nudged >> 31, -((-nudged) >> 31))  # C's truncating division
    return q


def rdbpot(x, e):
    """RoundingDivideByPOT."""
    x = np.asarray(x, np.int64)
    e = np.asarray(e, np.int64)
    mask = (np.int64(1) << e) - 1
    rem = x & mask
    thr = (mask >> 1) + (x < 0)
    return (x >> e) + (rem > thr)


def quantize_multiplier(real):
    m, e = math.frexp(real)
    q = math.floor(abs(m) * 2**31 + 0.5)
    if q == 2**31:
        q //= 2
        e += 1
    return q, e


def mul_by_qm(x, q, shift):
    """MultiplyByQuantizedMultiplier with per-element (or scalar) q and shift."""
    shift = np.asarray(shift, np.int64)
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    return rdbpot(srdhm(np.asarray(x, np.int64) << left, q), right)


def round_half_away(x):
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


def fc_ref(x, w, bias, s_in, zp_in, s_w, s_out, zp_out, lo=-128, hi=127):
    acc = (x.astype(np.int64) - zp_in) @ w.astype(np.int64).T + bias.astype(np.int64)
    q, sh = quantize_multiplier(float(s_in) * float(s_w) / float(s_out))
    return np.clip(mul_by_qm(acc, q, sh) + zp_out, lo, hi)


# ---------------------------------------------------------------- float models


def test_half_plus_two(tmp_path):
    for d, name in [("saved_model_half_plus_two_tflite", "x"),
                    ("saved_model_half_plus_two_tflite_with_sigdef", "tflite_input")]:
        model = SERVING / d / "00000123" / "model.tflite"
        for v in [0.0, 1.0, -3.5, 100.0]:
            got = predict(model, {name: np.array([[v]], np.float32)}, tmp_path)["y"]
            assert got.shape == (1, 1)
            assert got[0, 0] == pytest.approx(v / 2 + 2, rel=1e-6, abs=1e-6)


def test_half_plus_two_folder(tmp_path):
    """A folder holding model.tflite loads like the file."""
    d = SERVING / "saved_model_half_plus_two_tflite" / "00000123"
    got = predict(d, {"x": np.array([[4.0]], np.float32)}, tmp_path)["y"]
    assert got[0, 0] == pytest.approx(4.0)


def test_signature_names():
    r = kiln("inspect", SERVING / "saved_model_half_plus_two_tflite_with_sigdef" / "00000123" /
             "model.tflite")
    assert r.returncode == 0, r.stderr
    assert "signature serving_default" in r.stdout and "tflite_input: float32[1,1]" in r.stdout
    r = kiln("inspect", MICRO / "examples/hello_world/models/hello_world_float.tflite")
    assert r.returncode == 0, r.stderr
    # SignatureDef aliases (as TF Serving shows them), the batch dim free
    assert "dense_input: float32[?,1]" in r.stdout and "dense_2: float32[?,1]" in r.stdout
    assert "format: tflite" in r.stdout


def test_add_models(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 8, 8, 3)).astype(np.float32)
    got = predict(TFLITE_TD / "testdata/add.bin", {"input": x}, tmp_path)["output"]
    np.testing.assert_allclose(got, (x + x) + x, rtol=1e-6)
    a, b, c, d = (rng.standard_normal((1, 8, 8, 3)).astype(np.float32) for _ in range(4))
    got = predict(TFLITE_TD / "testdata/multi_add.bin", {"a": a, "b": b, "c": c, "d": d}, tmp_path)
    np.testing.assert_allclose(got["x"], a + (b + c), rtol=1e-6)
    np.testing.assert_allclose(got["y"], d + (b + c), rtol=1e-6)
    x1, x2 = (rng.standard_normal((5, 4)).astype(np.float32) for _ in range(2))
    got = predict(TFL / "tfjs/tfjs-tflite/test_files/add4.tflite",
                  {"input_1": x1, "input_2": x2}, tmp_path)
    (out,) = got.values()
    np.testing.assert_allclose(out, x1 + x2, rtol=1e-6)


def test_regression_model_is_affine(tmp_path):
    model = TFL / "tensorflow-onnx/tests/models/regression/tflite/model.tflite"
    tensors, _ = read_tensors(model)
    w, b = float(tensors["W"][0]), float(tensors["b"][0])
    for x in [0.0, 1.5, -2.0]:
        got = predict(model, {"X": np.array(x, np.float32)}, tmp_path)["pred"]
        assert got.shape == ()
        assert float(got) == pytest.approx(np.float32(x) * np.float32(w) + np.float32(b), rel=1e-6)


def test_hello_world_float(tmp_path):
    x = np.linspace(0, 2 * math.pi, 50, dtype=np.float32).reshape(50, 1)
    got = predict(MICRO / "examples/hello_world/models/hello_world_float.tflite",
                  {"dense_input": x}, tmp_path)["dense_2"]
    assert got.shape == (50, 1)
    # the model is a 3-layer MLP fitted to sin on [0, 2pi]; its error is below 0.1 there
    assert np.max(np.abs(got - np.sin(x))) < 0.1


# ------------------------------------------------------------- quantized models


def test_hello_world_int8(tmp_path):
    model = MICRO / "examples/hello_world/models/hello_world_int8.tflite"
    tensors, ops = read_tensors(model)
    (_, s_in, zp_in) = tensors["serving_default_dense_input:0"]
    (_, s_out, zp_out) = tensors["StatefulPartitionedCall:0"]
    x = np.linspace(0, 2 * math.pi, 60, dtype=np.float32).reshape(60, 1)
    q = np.clip(round_half_away(x / s_in[0]) + zp_in[0], -128, 127).astype(np.int8)
    got = predict(model, {"dense_input": q}, tmp_path)["dense_2"]
    assert got.dtype == np.int8 and got.shape == (60, 1)
    # bit-exact against TFLite's arithmetic: three FULLY_CONNECTED, the first two with RELU
    h = q
    for code, ins, outs in ops:
        assert code == 9
        xin, w, bias = (tensors[n] for n in ins)
        y = tensors[outs[0]]
        relu = outs[0] != "StatefulPartitionedCall:0"
        lo = int(y[2][0]) if relu else -128
        h = fc_ref(h, w[0], bias[0], xin[1][0], xin[2][0], w[1][0], y[1][0], y[2][0], lo=lo)
    np.testing.assert_array_equal(got, h.astype(np.int8))
    # and the dequantized answer is sin(x) within the int8 model's error
    y = (got.astype(np.float32) - zp_out[0]) * s_out[0]
    assert np.max(np.abs(y - np.sin(x))) < 0.15


def depthwise_ref(q, w, bias, s_in, zp_in, s_w, s_out, zp_out, stride, same):
    """TFLite's per-channel int8 depthwise convolution (multiplier 1), NHWC."""
    n, h, wd, c = q.shape
    _, kh, kw, co = w.shape
    oh = (h + stride - 1) // stride if same else (h - kh + stride) // stride
    ow = (wd + stride - 1) // stride if same else (wd - kw + stride) // stride
    ph = max(0, ((oh - 1) * stride + kh - h) // 2)
    pw = max(0, ((ow - 1) * stride + kw - wd) // 2)
    xp = np.zeros((n, h + kh + stride, wd + kw + stride, c), np.int64)
    xp[:, ph:ph + h, pw:pw + wd, :] = q.astype(np.int64) - zp_in  # padding is the zero point
    acc = np.zeros((n, oh, ow, co), np.int64)
    for fy in range(kh):
        for fx in range(kw):
            patch = xp[:, fy:fy + oh * stride:stride, fx:fx + ow * stride:stride, :]
            acc += patch * w[0, fy, fx, :].astype(np.int64)
    acc += bias.astype(np.int64)
    mults = [quantize_multiplier(float(s_in) * float(sw) / float(s_out)) for sw in s_w]
    qm = np.array([m for m, _ in mults], np.int64)
    sh = np.array([s for _, s in mults], np.int64)
    return np.clip(mul_by_qm(acc, qm, sh) + zp_out, -128, 127)


def test_pc_conv_bit_exact(tmp_path):
    """QUANTIZE -> per-channel int8 DEPTHWISE_CONV_2D (stride 2, SAME) -> DEQUANTIZE."""
    model = TFLITE_TD / "python/testdata/pc_conv.bin"
    t, ops = read_tensors(model)
    assert [code for code, _, _ in ops] == [114, 4, 6]
    rng = np.random.default_rng(7)
    x = rng.uniform(-0.2, 1.2, (1, 128, 128, 1)).astype(np.float32)
    got = predict(model, {"input": x}, tmp_path)["output"]
    assert got.shape == (1, 64, 64, 128)
    _, s_in, zp_in = t["input_int8"]
    q = np.clip(round_half_away(x / s_in[0]) + zp_in[0], -128, 127)
    w, s_w, _ = t["Conv/weights"]
    bias = t["Conv/Conv2D_bias"][0]
    _, s_out, zp_out = t["output_int8"]
    want_q = depthwise_ref(q, w, bias, s_in[0], zp_in[0], s_w, s_out[0], zp_out[0], 2, True)
    want = ((want_q - zp_out[0]).astype(np.float32) * s_out[0]).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_simple_add_int8_bit_exact(tmp_path):
    model = MICRO / "examples/memory_footprint/models/simple_add_model.tflite"
    t, _ = read_tensors(model)
    _, s1, z1 = t["serving_default_input_1:0"]
    _, s2, z2 = t["serving_default_input_2:0"]
    _, so, zo = t["PartitionedCall:0"]
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (2, 128, 128, 1), dtype=np.int8)
    b = rng.integers(-128, 128, (2, 128, 128, 1), dtype=np.int8)
    (got,) = predict(model, {"input_1": a, "input_2": b}, tmp_path).values()
    # TFLite's 8-bit ADD: inputs shifted left 20 bits, rescaled to twice the larger scale
    twice = 2 * max(float(s1[0]), float(s2[0]))
    m1, sh1 = quantize_multiplier(float(s1[0]) / twice)
    m2, sh2 = quantize_multiplier(float(s2[0]) / twice)
    mo, sho = quantize_multiplier(twice / ((1 << 20) * float(so[0])))
    x1 = rdbpot(srdhm((a.astype(np.int64) - z1[0]) << 20, m1), -sh1)
    x2 = rdbpot(srdhm((b.astype(np.int64) - z2[0]) << 20, m2), -sh2)
    want = np.clip(rdbpot(srdhm(x1 + x2, mo), -sho) + zo[0], -128, 127)
    np.testing.assert_array_equal(got, want.astype(np.int8))
    # and it is the float sum within one output step
    fa = (a.astype(np.float64) - z1[0]) * s1[0]
    fb = (b.astype(np.float64) - z2[0]) * s2[0]
    fy = (got.astype(np.float64) - zo[0]) * so[0]
    in_range = np.abs(fa + fb) < 127 * so[0] - 1
    assert np.max(np.abs(fy - (fa + fb))[in_range]) <= so[0] * 1.01


def bmp_pixels(path):
    raw = pathlib.Path(path).read_bytes()[1078:1078 + 96 * 96]
    return np.frombuffer(raw, np.int8).reshape(96, 96)[::-1].reshape(1, 96, 96, 1).copy()


def test_person_detector(tmp_path):
    model = MICRO / "models/person_detect.tflite"
    testdata = MICRO / "examples/person_detection/testdata"
    for image, label in [("person.bmp", 1), ("no_person.bmp", 0)]:
        (got,) = predict(model, {"input": bmp_pixels(testdata / image)}, tmp_path).values()
        assert got.dtype == np.int8 and got.shape == (1, 2)
        assert int(np.argmax(got[0])) == label, (image, got)
        # softmax output, zero point -128 and scale 1/256: the two add up to 256 steps
        assert abs(int(got[0, 0]) + int(got[0, 1])) <= 1


# ---------------------------------------------------------------- refused models


@pytest.mark.parametrize("path,pattern", [
    (SERVING / "parse_example_tflite/00000123/model.tflite", r"custom op 'ParseExampleV2'"),
    (MICRO / "examples/micro_speech/models/audio_preprocessor_int8.tflite",
     r"custom op 'SignalWindow'"),
    (MICRO / "examples/micro_speech/models/audio_preprocessor_float.tflite",
     r"custom op 'SignalWindow'"),
    (TFLITE_TD / "testdata/add_quantized.bin", r"\(ADD\).*uint8 and uint8 into float32"),
])
def test_refused(path, pattern):
    assert_clean_error(kiln("inspect", path), pattern)


# ---------------------------------------------------------------- malformed files


def test_malformed_copies(tmp_path):
    src = (MICRO / "examples/hello_world/models/hello_world_float.tflite").read_bytes()
    rng = random.Random(11)
    cases = [src[:n] for n in (0, 4, 8, 12, 40, len(src) // 2, len(src) - 1)]
    for _ in range(40):
        b = bytearray(src)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        cases.append(bytes(b))
    for i, data in enumerate(cases):
        p = tmp_path / f"m{i}.tflite"
        p.write_bytes(data)
        r = kiln("inspect", p)
        assert "Sanitizer" not in r.stderr and r.returncode in (0, 1), (i, r.returncode, r.stderr)
        if r.returncode:
            assert r.stderr.startswith("kiln: "), r.stderr


# ------------------------------------------------ one-op models written here

import sys  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
import make_tflite_corpus as mk  # noqa: E402


def run_model(m, inputs, tmp, flags=()):
    p = pathlib.Path(tmp) / "m.tflite"
    p.write_bytes(m.bytes())
    return predict(p, inputs, tmp, flags=flags)


def pad_amounts(size, k, stride, same, dil=1):
    eff = (k - 1) * dil + 1
    out = (size + stride - 1) // stride if same else (size - eff + stride) // stride
    return out, max(0, ((out - 1) * stride + eff - size) // 2)


def conv_ref(x, w, b, stride, same, depthwise=False):
    """NHWC float convolution as TFLite defines it; w is OHWI (or 1HWC)."""
    n, h, wd, c = x.shape
    kh, kw = w.shape[1], w.shape[2]
    co = w.shape[3] if depthwise else w.shape[0]
    oh, ph = pad_amounts(h, kh, stride, same)
    ow, pw = pad_amounts(wd, kw, stride, same)
    y = np.zeros((n, oh, ow, co), np.float64)
    for oy in range(oh):
        for ox in range(ow):
            for fy in range(kh):
                for fx in range(kw):
                    iy, ix = oy * stride - ph + fy, ox * stride - pw + fx
                    if 0 <= iy < h and 0 <= ix < wd:
                        if depthwise:
                            y[:, oy, ox, :] += np.repeat(x[:, iy, ix, :], co // c, axis=-1) * \
                                w[0, fy, fx, :]
                        else:
                            y[:, oy, ox, :] += x[:, iy, ix, :] @ w[:, fy, fx, :].T
    return y + (b if b is not None else 0)


@pytest.mark.parametrize("flags", [(), ("--disable-optimizer",), ("--reference",)])
def test_conv_pool_float(tmp_path, flags):
    """CONV_2D (SAME, stride 2, RELU6) then MAX_POOL_2D (VALID), optimized, as
    imported and on the reference kernels."""
    m = mk.Model()
    rng = np.random.default_rng(5)
    x = m.add([1, 5, 5, 2], name="x")
    w = rng.standard_normal((3, 3, 3, 2)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    wi, bi = m.const(w), m.const(b)
    y = m.add([1, 3, 3, 3], name="y")
    m.op("CONV_2D", [x, wi, bi], [y], [("i8", 0), ("i32", 2), ("i32", 2), ("i8", 3)])
    p = m.add([1, 1, 1, 3], name="p")
    m.op("MAX_POOL_2D", [y], [p], [("i8", 1), ("i32", 2), ("i32", 2), ("i32", 2), ("i32", 2)])
    m.inputs, m.outputs = [x], [y, p]
    xv = rng.standard_normal((1, 5, 5, 2)).astype(np.float32) * 2
    got = run_model(m, {"x": xv}, tmp_path, flags)
    want = np.clip(conv_ref(xv, w, b, 2, True), 0, 6)
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["p"], want[:, :2, :2, :].max(axis=(1, 2), keepdims=True),
                               rtol=1e-5, atol=1e-5)


def test_depthwise_and_avgpool_float(tmp_path):
    """DEPTHWISE_CONV_2D with multiplier 2 (SAME), AVERAGE_POOL_2D SAME (padding not counted)."""
    m = mk.Model()
    rng = np.random.default_rng(6)
    x = m.add([1, 4, 5, 2], name="x")
    w = rng.standard_normal((1, 3, 3, 4)).astype(np.float32)
    y = m.add([1, 4, 5, 4], name="y")
    m.op("DEPTHWISE_CONV_2D", [x, m.const(w), -1], [y],
         [("i8", 0), ("i32", 1), ("i32", 1), ("i32", 2)])
    p = m.add([1, 2, 3, 4], name="p")
    m.op("AVERAGE_POOL_2D", [y], [p], [("i8", 0), ("i32", 2), ("i32", 2), ("i32", 2), ("i32", 2)])
    m.inputs, m.outputs = [x], [y, p]
    xv = rng.standard_normal((1, 4, 5, 2)).astype(np.float32)
    got = run_model(m, {"x": xv}, tmp_path)
    want = conv_ref(xv, w, None, 1, True, depthwise=True)
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)
    pool = np.zeros((1, 2, 3, 4))
    for oy in range(2):
        for ox in range(3):  # 5 wide, SAME stride 2: out 3, pad 0 before, 1 after
            pool[0, oy, ox] = want[0, 2 * oy:2 * oy + 2, 2 * ox:2 * ox + 2].mean(axis=(0, 1))
    np.testing.assert_allclose(got["p"], pool, rtol=1e-5, atol=1e-5)


def test_fc_softmax_and_elementwise(tmp_path):
    m = mk.Model()
    rng = np.random.default_rng(8)
    x = m.add([2, 3], name="x", signature=[-1, 3])
    w = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    h = m.add([2, 4], name="h")
    m.op("FULLY_CONNECTED", [x, m.const(w), m.const(b)], [h], [("i8", 1)])
    sm = m.add([2, 4], name="sm")
    m.op("SOFTMAX", [h], [sm], [("f32", 0.5)])
    cv = np.array([1.5, -2.0, 3.0, 0.25], np.float32)
    c = m.const(cv)
    outs = {}
    for name in ["SUB", "DIV", "MUL"]:
        t = m.add([2, 4], name=name.lower())
        m.op(name, [h, c], [t], [("i8", 0)])
        outs[name.lower()] = t
    for name in ["LOGISTIC", "TANH", "RELU", "RELU6"]:
        t = m.add([2, 4], name=name.lower())
        m.op(name, [outs["sub"]], [t])
        outs[name.lower()] = t
    cat = m.add([2, 8], name="cat")
    m.op("CONCATENATION", [outs["sub"], outs["div"]], [cat], [("i32", -1), ("i8", 0)])
    r = m.add([4, 4], name="r")
    m.op("RESHAPE", [cat, m.const(np.array([-1, 4], np.int32))], [r], [])
    m.inputs, m.outputs = [x], [sm, cat, r] + list(outs.values())
    xv = rng.standard_normal((3, 3)).astype(np.float32)  # a batch of 3 through the free dim
    got = run_model(m, {"x": xv}, tmp_path)
    hv = np.maximum(xv @ w.T + b, 0)
    e = np.exp(0.5 * (hv - hv.max(axis=1, keepdims=True)))
    np.testing.assert_allclose(got["sm"], e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    sub, div = hv - cv, hv / cv
    np.testing.assert_allclose(got["sub"], sub, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["div"], div, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["mul"], hv * cv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["logistic"], 1 / (1 + np.exp(-sub)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["tanh"], np.tanh(sub), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["relu"], np.maximum(sub, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["relu6"], np.clip(sub, 0, 6), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["cat"], np.concatenate([sub, div], axis=1), rtol=1e-5)
    np.testing.assert_allclose(got["r"], np.concatenate([sub, div], axis=1).reshape(-1, 4),
                               rtol=1e-5)


def test_shape_ops(tmp_path):
    """PAD, TRANSPOSE, MEAN, STRIDED_SLICE (masks, negative stride, shrink), SQUEEZE."""
    m = mk.Model()
    x = m.add([2, 3, 4], name="x")
    pads = m.const(np.array([[0, 0], [1, 0], [0, 2]], np.int32))
    p = m.add([2, 4, 6], name="p")
    m.op("PAD", [x, pads], [p], [])
    t = m.add([6, 2, 4], name="t")
    m.op("TRANSPOSE", [p, m.const(np.array([2, 0, 1], np.int32))], [t], [])
    mn = m.add([6, 1, 4], name="mn")
    m.op("MEAN", [t, m.const(np.array([1], np.int32))], [mn], [("u8", 1)])
    sq = m.add([6, 4], name="sq")
    m.op("SQUEEZE", [mn], [sq], [("vi32", [1])])
    s = m.add([2, 1], name="s")
    bg, en, st = (m.const(np.array(v, np.int32)) for v in ([1, 3], [5, 0], [2, -1]))
    m.op("STRIDED_SLICE", [sq, bg, en, st], [s], [("i32", 0), ("i32", 2)])
    k = m.add([4], name="k")
    bg, en, st = (m.const(np.array(v, np.int32)) for v in ([-1, 0], [0, 0], [1, 1]))
    m.op("STRIDED_SLICE", [sq, bg, en, st], [k], [("i32", 0), ("i32", 2), ("i32", 0), ("i32", 0),
                                                  ("i32", 1)])
    m.inputs, m.outputs = [x], [p, t, sq, s, k]
    xv = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    got = run_model(m, {"x": xv}, tmp_path)
    pv = np.pad(xv, [(0, 0), (1, 0), (0, 2)])
    tv = pv.transpose(2, 0, 1)
    sqv = tv.mean(axis=1)
    np.testing.assert_array_equal(got["p"], pv)
    np.testing.assert_array_equal(got["t"], tv)
    np.testing.assert_allclose(got["sq"], sqv, rtol=1e-6)
    np.testing.assert_allclose(got["s"], sqv[1:5:2, 3::-1],
                               rtol=1e-6)
    np.testing.assert_allclose(got["k"], sqv[-1, :], rtol=1e-6)


def test_quantize_fc_dequantize_bit_exact(tmp_path):
    m = mk.Model()
    rng = np.random.default_rng(9)
    x = m.add([1, 6], name="x", signature=[-1, 6])
    qx = m.add([1, 6], mk.I8, "qx", quant=([0.02], [1], 0))
    m.op("QUANTIZE", [x], [qx])
    w = rng.integers(-127, 128, (3, 6), dtype=np.int8)
    bias = np.array([300, -200, 0], np.int32)
    y = m.add([1, 3], mk.I8, "y", quant=([0.05], [4], 0))
    m.op("FULLY_CONNECTED", [qx, m.const(w, quant=([0.01], [0], 0)),
                             m.const(bias, quant=([0.0002], [0], 0))], [y], [("i8", 1)])
    z = m.add([1, 3], name="z")
    m.op("DEQUANTIZE", [y], [z])
    m.inputs, m.outputs = [x], [qx, y, z]
    xv = rng.uniform(-3, 3, (16, 6)).astype(np.float32)
    got = run_model(m, {"x": xv}, tmp_path)
    q = np.clip(round_half_away(xv / np.float32(0.02)) + 1, -128, 127)
    np.testing.assert_array_equal(got["qx"], q.astype(np.int8))
    want = fc_ref(q, w, bias, np.float32(0.02), 1, np.float32(0.01), np.float32(0.05), 4, lo=4)
    np.testing.assert_array_equal(got["y"], want.astype(np.int8))
    np.testing.assert_array_equal(got["z"], ((want - 4) * np.float32(0.05)).astype(np.float32))


def test_generated_signature(tmp_path):
    p = tmp_path / "add_sig.tflite"
    p.write_bytes(mk.corpus()["add_sig.tflite"])
    r = kiln("inspect", p)
    assert r.returncode == 0, r.stderr
    assert "x1: float32[?,4]" in r.stdout and "out: float32[?,4]" in r.stdout
    a, b = np.ones((3, 4), np.float32), np.full((3, 4), -2.5, np.float32)
    got = predict(p, {"x1": a, "x2": b}, tmp_path)["out"]
    np.testing.assert_array_equal(got, np.maximum(a + b, 0))


# ---------------------------------------------------------------- kiln serve

SM_HALF_PLUS_THREE = (TESTDATA / "savedmodels/serving/tensorflow_serving/servables/tensorflow/"
                      "testdata/saved_model_half_plus_three/00000123")


def serve_predict(srv, name, x):
    code, body = srv.json("POST", f"/v1/models/{name}:predict", {"instances": x})
    assert code == 200, body
    return body["predictions"]


def test_serve_tflite_version(tmp_path):
    from test_serve import Server
    base = tmp_path / "hp"
    (base / "1").mkdir(parents=True)
    shutil.copy(SERVING / "saved_model_half_plus_two_tflite/00000123/model.tflite", base / "1")
    srv = Server(base, "hp")
    try:
        assert serve_predict(srv, "hp", [[1.0]]) == [[2.5]]
        code, meta = srv.json("GET", "/v1/models/hp/metadata")
        assert code == 200
        sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert list(sig["inputs"]) == ["x"] and list(sig["outputs"]) == ["y"]
    finally:
        srv.kill()


@pytest.mark.skipif(not SM_HALF_PLUS_THREE.is_dir(), reason="shared SavedModel half_plus_three absent")
def test_serve_prefer_tflite_model(tmp_path):
    """A version holding both a SavedModel (x/2 + 3) and model.tflite (x/2 + 2):
    the SavedModel unless --prefer_tflite_model, as in TF Serving."""
    from test_serve import Server
    base = tmp_path / "both"
    shutil.copytree(SM_HALF_PLUS_THREE, base / "1")
    shutil.copy(SERVING / "saved_model_half_plus_two_tflite/00000123/model.tflite", base / "1")
    for extra, want in [((), 3.5), (("--prefer_tflite_model=true",), 2.5),
                        (("--prefer_tflite_model",), 2.5),
                        (("--prefer_tflite_model=false",), 3.5)]:
        srv = Server(base, "both", *extra)
        try:
            got = serve_predict(srv, "both", [[1.0]] if want == 2.5 else [1.0])
            assert np.ravel(got).tolist() == [want], (extra, got)
            if extra:
                assert f"--prefer_tflite_model={'true' if want == 2.5 else 'false'}" in \
                    srv.logtext()
        finally:
            srv.kill()


def lstm_ref(x, w, time_major, cell_clip=0.0, proj_clip=0.0, act=np.tanh):
    """TFLite's float LSTM (lstm_eval.cc, LstmStepFloat), zero initial state:
    per gate z = x W^T + h R^T (+ peephole * c), layer-normalized over the cells
    ((z - mean) / sqrt(var + 1e-8) * coefficient) when ln_g is given, + bias;
    sigmoid for i, f, o and act for the cell gate; CIFG (no w_i): i = 1 - f;
    c clipped to +-cell_clip; h = o * act(c), projected (+ bias), clipped to
    +-proj_clip. The o peephole reads the new c. x is [seq, batch, in] when
    time_major else [batch, seq, in]."""
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    g_ = lambda k: w.get(k)  # noqa: E731
    xs = x if time_major else x.transpose(1, 0, 2)
    seq, batch, _ = xs.shape
    hidden = w["w_f"].shape[0]
    nout = w["r_f"].shape[1]
    h = np.zeros((batch, nout))
    c = np.zeros((batch, hidden))
    cifg = g_("w_i") is None

    def gate(g, cc, f):
        z = xs[t] @ w["w_" + g].T.astype(np.float64) + h @ w["r_" + g].T.astype(np.float64)
        if g_("p_" + g) is not None:
            z = z + w["p_" + g] * cc
        if g_("ln_" + g) is not None:
            mu = z.mean(-1, keepdims=True)
            var = ((z - mu) ** 2).mean(-1, keepdims=True)
            z = (z - mu) / np.sqrt(var + 1e-8) * w["ln_" + g]
        return f(z + w["b_" + g])
    ys = []
    for t in range(seq):
        f = gate("f", c, sig)
        i = 1 - f if cifg else gate("i", c, sig)
        g = gate("c", c, act)
        c = f * c + i * g
        if cell_clip > 0:
            c = np.clip(c, -cell_clip, cell_clip)
        o = gate("o", c, sig)
        h = o * act(c)
        if g_("proj_w") is not None:
            h = h @ w["proj_w"].T.astype(np.float64)
            if g_("proj_b") is not None:
                h = h + w["proj_b"]
            if proj_clip > 0:
                h = np.clip(h, -proj_clip, proj_clip)
        ys.append(h)
    y = np.stack(ys)
    return y if time_major else y.transpose(1, 0, 2)


@pytest.mark.parametrize("time_major,peephole", [(False, False), (True, True), (False, True)])
def test_unidirectional_sequence_lstm(tmp_path, time_major, peephole):
    m, w = mk.lstm_model(2, 4, 3, 5, time_major=time_major, peephole=peephole, seed=3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 2, 3) if time_major else (2, 4, 3)).astype(np.float32)
    got = run_model(m, {"x": x}, tmp_path)["y"]
    np.testing.assert_allclose(got, lstm_ref(x.astype(np.float64), w, time_major),
                               rtol=1e-4, atol=1e-5)
    # twice in a row: the state does not carry over between runs
    again = run_model(m, {"x": x}, tmp_path)["y"]
    np.testing.assert_array_equal(got, again)


# the full LSTM (lowered to per-step primitive ops): each feature alone and together
LSTM_FULL = {
    "cifg": dict(cifg=True),
    "cifg_peephole": dict(cifg=True, peephole=True),
    "projection": dict(proj=3),
    "projection_no_bias": dict(proj=4, proj_bias=False),
    "layer_norm": dict(layer_norm=True),
    "layer_norm_cifg_peephole": dict(layer_norm=True, cifg=True, peephole=True),
    "cell_clip": dict(cell_clip=0.3),
    "proj_clip": dict(proj=3, proj_clip=0.05),
    "relu": dict(act=1),
    "everything": dict(peephole=True, proj=3, layer_norm=True, cell_clip=0.4, proj_clip=0.3),
    "everything_time_major": dict(peephole=True, proj=3, layer_norm=True, cell_clip=0.4,
                                  proj_clip=0.3, time_major=True),
    "one_step": dict(one_step=True, peephole=True, proj=3, layer_norm=True, cell_clip=0.2),
}


@pytest.mark.parametrize("case", sorted(LSTM_FULL))
def test_lstm_full_features(tmp_path, case):
    kw = LSTM_FULL[case]
    m, w = mk.lstm_model(2, 5, 3, 4, seed=7, **kw)
    tm, one = kw.get("time_major", False), kw.get("one_step", False)
    rng = np.random.default_rng(8)
    shape = (2, 3) if one else (5, 2, 3) if tm else (2, 5, 3)
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    got = run_model(m, {"x": x}, tmp_path)["y"]
    xr = x[:, None, :] if one else x
    act = (lambda v: np.maximum(v, 0)) if kw.get("act") == 1 else np.tanh
    want = lstm_ref(xr.astype(np.float64), w, tm, kw.get("cell_clip", 0.0),
                    kw.get("proj_clip", 0.0), act)
    if one:
        want = want[:, 0, :]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if kw.get("proj_clip"):
        assert np.abs(want).max() == pytest.approx(kw["proj_clip"])  # the clip is exercised


def test_lstm_bin_full_lstm(tmp_path):
    """tensorflow/lite/testdata/lstm.bin: a one-step LSTM with layer norm,
    projection and cell_clip 10, against lstm_ref on the file's own weights."""
    path = TFLITE_TD / "testdata/lstm.bin"
    tensors, ops = read_tensors(path)
    (code, ins, outs), = ops
    assert code == 16  # LSTM
    val = lambda k: tensors[ins[k]][0] if ins[k] is not None else None  # noqa: E731
    w = {}
    for j, g in enumerate("ifco"):
        w["w_" + g], w["r_" + g], w["b_" + g] = val(1 + j), val(5 + j), val(12 + j)
        w["ln_" + g] = val(20 + j)
    for j, g in enumerate("ifo"):
        w["p_" + g] = val(9 + j)
    w["proj_w"], w["proj_b"] = val(16), val(17)
    assert w["proj_w"] is not None and w["ln_f"] is not None
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((1, 2)) * 3).astype(np.float32)
    got = predict(path, {ins[0]: x}, tmp_path)[outs[0]]
    want = lstm_ref(x[:, None, :].astype(np.float64), w, False, cell_clip=10.0)[:, 0, :]
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5)


def test_lstm_basic_kernel(tmp_path):
    """LSTM kernel_type BASIC (reference_ops::LstmCell): gates i, g, f, o of
    [x, prev_activ] W^T + b; every output checked against numpy."""
    batch, nin, nout = 3, 4, 5
    m, wb = mk.lstm_basic_model(batch, nin, nout, seed=21)
    w, b = wb["w"], wb["b"]
    rng = np.random.default_rng(22)
    feeds = {"x": rng.standard_normal((batch, nin)), "h": rng.standard_normal((batch, nout)),
             "c": rng.standard_normal((batch, nout)) * 2}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    got = run_model(m, feeds, tmp_path)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    cat = np.concatenate([feeds["x"], feeds["h"]], 1).astype(np.float64)
    full = cat @ w.T + b
    i, g, f, o = (full[:, k * nout:(k + 1) * nout] for k in range(4))
    state = sig(i) * np.tanh(g) + sig(f) * feeds["c"]
    want = {"activ": sig(o) * np.tanh(state), "state": state, "concat": cat, "activ_temp": full}
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("change,pattern", [
    (lambda w: w.__setitem__("w_c", w["w_c"][:, :2].copy()), r"input_to_cell_weights.*input 3"),
    (lambda w: w.__setitem__("proj_b", w["proj_b"][:2].copy()), r"projection_bias.*input 17"),
    (lambda w: w.__setitem__("ln_o", w["ln_o"][:3].copy()),
     r"output_layer_norm_coefficients.*input 23"),
])
def test_lstm_bad_weight_shapes(tmp_path, change, pattern):
    # good weights from the writer, one of them cut, written into the same LSTM
    _, w = mk.lstm_model(1, 2, 3, 4, seed=1, proj=3, layer_norm=True)
    change(w)
    m = mk.Model()
    x = m.add([1, 2, 3], name="x")
    cst = lambda k: m.const(w[k]) if w.get(k) is not None else -1  # noqa: E731
    ins = [x] + [cst("w_" + g) for g in "ifco"] + [cst("r_" + g) for g in "ifco"]
    ins += [-1, -1, -1] + [cst("b_" + g) for g in "ifco"] + [cst("proj_w"), cst("proj_b")]
    h0, c0 = m.add([1, 3], name="h_state"), m.add([1, 4], name="c_state")
    m.tensors[h0][5] = ("u8", 1)
    m.tensors[c0][5] = ("u8", 1)
    ins += [h0, c0] + [cst("ln_" + g) for g in "ifco"]
    y = m.add([1, 2, 3], name="y")
    m.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ins, [y], [("i8", 4), ("f32", 0.0), ("f32", 0.0),
                                                   ("u8", 0)])
    m.inputs, m.outputs = [x], [y]
    p = tmp_path / "bad.tflite"
    p.write_bytes(m.bytes())
    assert_clean_error(kiln("inspect", p), pattern)


def test_string_reshape(tmp_path):
    rng = np.random.default_rng(12)
    words = np.array([b"", b"a", b"kiln", b"tflite", b"\xff\x00z"], dtype="S6")
    x = words[rng.integers(0, len(words), (2, 8, 8, 3))]
    got = predict(TFLITE_TD / "java/src/testdata/string.bin",
                  {"string_input": x}, tmp_path)["output_tensor"]
    np.testing.assert_array_equal(got, x.reshape(2, 4, 4, 12))


def test_micro_speech_runs(tmp_path):
    """micro_speech's classifier (its features come from the refused audio
    preprocessor): on random features it gives a distribution over its 4 labels."""
    model = MICRO / "examples/micro_speech/models/micro_speech_quantized.tflite"
    rng = np.random.default_rng(13)
    x = rng.integers(-128, 128, (1, 1960), dtype=np.int8)
    (got,) = predict(model, {"Reshape_1": x}, tmp_path).values()
    assert got.dtype == np.int8 and got.shape == (1, 4)
    assert abs(int(got.astype(np.int64).sum()) + 4 * 128 - 256) <= 4  # 4 probabilities sum to 1


def test_conv_chain_float(tmp_path):
    """CONV_2D -> DEPTHWISE_CONV_2D -> CONV_2D with 16 channels: the transposes
    between them are the optimizer's to cancel; the answer must not change."""
    rng = np.random.default_rng(21)
    m = mk.Model()
    x = m.add([1, 9, 7, 3], name="x", signature=[-1, 9, 7, 3])
    w1 = (rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((1, 3, 3, 16)) * 0.3).astype(np.float32)
    w3 = (rng.standard_normal((8, 1, 1, 16)) * 0.3).astype(np.float32)
    b1 = rng.standard_normal(16).astype(np.float32)
    a = m.add([1, 9, 7, 16], name="a")
    m.op("CONV_2D", [x, m.const(w1), m.const(b1)], [a], [("i8", 0), ("i32", 1), ("i32", 1), ("i8", 1)])
    b = m.add([1, 5, 4, 16], name="b")
    m.op("DEPTHWISE_CONV_2D", [a, m.const(w2), -1], [b],
         [("i8", 0), ("i32", 2), ("i32", 2), ("i32", 1), ("i8", 3)])
    c = m.add([1, 5, 4, 8], name="c")
    m.op("CONV_2D", [b, m.const(w3), -1], [c], [("i8", 1), ("i32", 1), ("i32", 1), ("i8", 0)])
    m.inputs, m.outputs = [x], [c]
    xv = rng.standard_normal((2, 9, 7, 3)).astype(np.float32)
    want = np.maximum(conv_ref(xv, w1, b1, 1, True), 0)
    want = np.clip(conv_ref(want, w2, None, 2, True, depthwise=True), 0, 6)
    want = conv_ref(want, w3, None, 1, False)
    for flags in [(), ("--reference",)]:
        got = run_model(m, {"x": xv}, tmp_path, flags)["c"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_float16_weights(tmp_path):
    """TFLite's float16 quantization: DEQUANTIZE of float16 filters and weights
    feeding float CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED."""
    rng = np.random.default_rng(31)
    m = mk.Model()
    x = m.add([1, 6, 6, 2], name="x")
    w1 = rng.standard_normal((4, 3, 3, 2)).astype(np.float16)
    w2 = rng.standard_normal((1, 3, 3, 4)).astype(np.float16)
    w3 = rng.standard_normal((3, 4 * 3 * 3)).astype(np.float16)
    ws = []
    for w in (w1, w2, w3):
        t = m.add(list(w.shape), name=f"w{len(ws)}")
        m.op("DEQUANTIZE", [m.const(w)], [t])
        ws.append(t)
    a = m.add([1, 6, 6, 4], name="a")
    m.op("CONV_2D", [x, ws[0], -1], [a], [("i8", 0), ("i32", 1), ("i32", 1), ("i8", 0)])
    b = m.add([1, 3, 3, 4], name="b")
    m.op("DEPTHWISE_CONV_2D", [a, ws[1], -1], [b], [("i8", 0), ("i32", 2), ("i32", 2), ("i32", 1)])
    c = m.add([1, 3], name="c")
    m.op("FULLY_CONNECTED", [b, ws[2], -1], [c], [("i8", 0)])
    m.inputs, m.outputs = [x], [c]
    xv = rng.standard_normal((1, 6, 6, 2)).astype(np.float32)
    want = conv_ref(xv, w1.astype(np.float32), None, 1, True)
    want = conv_ref(want, w2.astype(np.float32), None, 2, True, depthwise=True)
    want = want.reshape(1, -1) @ w3.astype(np.float32).T
    for flags in [(), ("--reference",)]:
        got = run_model(m, {"x": xv}, tmp_path, flags)["c"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ------------------------------------- quantized MUL, SUB, LOGISTIC and TANH


def add_sub_ref(a, b, s1, z1, s2, z2, so, zo, sign, lo, hi):
    """TFLite's 8-bit ADD; SUB is ADD with input 2's multiplier negated (sub.cc)."""
    twice = 2 * max(float(s1), float(s2))
    m1, sh1 = quantize_multiplier(float(s1) / twice)
    m2, sh2 = quantize_multiplier(float(s2) / twice)
    mo, sho = quantize_multiplier(twice / ((1 << 20) * float(so)))
    x1 = rdbpot(srdhm((a.astype(np.int64) - z1) << 20, m1), -sh1)
    x2 = rdbpot(srdhm((b.astype(np.int64) - z2) << 20, sign * m2), -sh2)
    return np.clip(rdbpot(srdhm(x1 + x2, mo), -sho) + zo, lo, hi)


@pytest.mark.parametrize("dt", ["int8", "uint8"])
def test_quantized_mul_sub_bit_exact(tmp_path, dt):
    ttype, npt = (mk.I8, np.int8) if dt == "int8" else (mk.U8, np.uint8)
    qmin, qmax = (-128, 127) if dt == "int8" else (0, 255)
    zoff = 0 if dt == "int8" else 128
    s1, z1 = np.float32(0.031), 3 + zoff
    s2, z2 = np.float32(0.047), -7 + zoff
    sm, zm = np.float32(0.09), -2 + zoff
    ss, zs = np.float32(0.06), 5 + zoff
    m = mk.Model()
    a = m.add([2, 3, 4], ttype, "a", quant=([s1], [z1], 0), signature=[-1, 3, 4])
    b = m.add([3, 4], ttype, "b", quant=([s2], [z2], 0))
    mul = m.add([2, 3, 4], ttype, "mul", quant=([sm], [zm], 0))
    m.op("MUL", [a, b], [mul], [("i8", 0)])
    mulr = m.add([2, 3, 4], ttype, "mulr", quant=([sm], [zm], 0))
    m.op("MUL", [a, b], [mulr], [("i8", 1)])  # fused RELU
    sub = m.add([2, 3, 4], ttype, "sub", quant=([ss], [zs], 0))
    m.op("SUB", [a, b], [sub], [("i8", 0)])
    sub6 = m.add([2, 3, 4], ttype, "sub6", quant=([ss], [zs], 0))
    m.op("SUB", [b, a], [sub6], [("i8", 3)])  # fused RELU6, operands swapped
    m.inputs, m.outputs = [a, b], [mul, mulr, sub, sub6]
    rng = np.random.default_rng(21)
    av = rng.integers(qmin, qmax + 1, (5, 3, 4)).astype(npt)
    bv = rng.integers(qmin, qmax + 1, (3, 4)).astype(npt)
    got = run_model(m, {"a": av, "b": bv}, tmp_path)
    # MUL (mul.cc): one multiplier s1 * s2 / so computed in float
    q, sh = quantize_multiplier(float(s1 * s2 / sm))
    prod = (av.astype(np.int64) - z1) * (bv.astype(np.int64) - z2)
    want = np.clip(mul_by_qm(prod, q, sh) + zm, qmin, qmax)
    np.testing.assert_array_equal(got["mul"], want.astype(npt))
    np.testing.assert_array_equal(got["mulr"], np.maximum(want, max(zm, qmin)).astype(npt))
    want = add_sub_ref(av, bv, s1, z1, s2, z2, ss, zs, -1, qmin, qmax)
    np.testing.assert_array_equal(got["sub"], want.astype(npt))
    hi6 = min(qmax, zs + int(round_half_away(np.float32(6) / ss)))
    want6 = add_sub_ref(bv, av, s2, z2, s1, z1, ss, zs, -1, max(zs, qmin), hi6)
    np.testing.assert_array_equal(got["sub6"], want6.astype(npt))
    # and they are the float results within about one output step
    fa, fb = (av.astype(np.float64) - z1) * s1, (bv.astype(np.float64) - z2) * s2
    fy = (got["sub"].astype(np.float64) - zs) * ss
    ok = np.abs(fa - fb) < (qmax - zs - 1) * ss
    ok &= np.abs(fa - fb) < (zs - qmin - 1) * ss
    assert np.max(np.abs(fy - (fa - fb))[ok]) <= ss * 1.01
    fy = (got["mul"].astype(np.float64) - zm) * sm
    ok = (fa * fb < (qmax - zm - 1) * sm) & (fa * fb > (qmin - zm + 1) * sm)
    assert np.max(np.abs(fy - fa * fb)[ok]) <= sm * 1.01


@pytest.mark.parametrize("dt", ["int8", "uint8"])
def test_quantized_logistic_tanh_bit_exact(tmp_path, dt):
    ttype, npt = (mk.I8, np.int8) if dt == "int8" else (mk.U8, np.uint8)
    qmin, qmax = (-128, 127) if dt == "int8" else (0, 255)
    zoff = 0 if dt == "int8" else 128
    si, zi = np.float32(0.045), 9 + zoff
    # the output parameters TFLite's converter gives these ops
    sl, zl = np.float32(1 / 256), qmin
    st, zt = np.float32(1 / 128), zoff
    m = mk.Model()
    x = m.add([1, 256], ttype, "x", quant=([si], [zi], 0), signature=[-1, 256])
    lg = m.add([1, 256], ttype, "lg", quant=([sl], [zl], 0))
    m.op("LOGISTIC", [x], [lg])
    th = m.add([1, 256], ttype, "th", quant=([st], [zt], 0))
    m.op("TANH", [x], [th])
    m.inputs, m.outputs = [x], [lg, th]
    xv = np.arange(qmin, qmax + 1).reshape(1, 256).astype(npt)  # every input value
    got = run_model(m, {"x": xv}, tmp_path)
    # TFLite's lookup table (LUTPopulate): dequantize, transform, requantize in float32
    d = si * (xv.astype(np.int32) - zi).astype(np.float32)
    lgf = np.float32(1) / (np.float32(1) + np.exp(-d))
    thf = np.tanh(d)
    want_l = np.clip(round_half_away(lgf * (np.float32(1) / sl)) + zl, qmin, qmax)
    want_t = np.clip(round_half_away(thf * (np.float32(1) / st)) + zt, qmin, qmax)
    np.testing.assert_array_equal(got["lg"], want_l.astype(npt))
    np.testing.assert_array_equal(got["th"], want_t.astype(npt))
    # and they are the functions within one output step (1.0 itself saturates)
    d64 = d.astype(np.float64)
    fl = (got["lg"].astype(np.float64) - zl) * sl
    ft = (got["th"].astype(np.float64) - zt) * st
    assert np.max(np.abs(fl - 1 / (1 + np.exp(-d64)))) <= sl
    assert np.max(np.abs(ft - np.tanh(d64))) <= st


# ------------------------------------------------------------- quantized MEAN


def wrap32(v):
    v = np.asarray(v, np.int64)
    return ((v + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def mean_ref(x, axes, keep, s_in, z_in, s_out, z_out, qmin, qmax):
    """reference_ops::QuantizedMeanOrSum (reduce.cc's quantized MEAN): the int32 sum
    less n * input zero point, rescaled by s_in / s_out with 1/n folded into the
    multiplier, + output zero point, clamped."""
    axes = tuple(sorted({a % x.ndim for a in axes}))
    n = int(np.prod([x.shape[a] for a in axes]))
    total = wrap32(x.astype(np.int64).sum(axis=axes, keepdims=keep))
    shifted = wrap32(total - z_in * n)
    q, s = quantize_multiplier(float(s_in) / float(s_out))
    shift = min(n.bit_length() - 1, 32, 31 + s)
    q2 = (q << shift) // n
    return np.clip(mul_by_qm(shifted, q2, s - shift) + z_out, qmin, qmax)


@pytest.mark.parametrize("dt", ["int8", "uint8"])
def test_quantized_mean_bit_exact(tmp_path, dt):
    ttype, npt = (mk.I8, np.int8) if dt == "int8" else (mk.U8, np.uint8)
    qmin, qmax = (-128, 127) if dt == "int8" else (0, 255)
    zoff = 0 if dt == "int8" else 128
    si, zi = np.float32(0.037), 5 + zoff
    so, zo = np.float32(0.021), -9 + zoff
    so2, zo2 = np.float32(0.05), 3 + zoff
    m = mk.Model()
    x = m.add([2, 5, 6, 8], ttype, "x", quant=([si], [zi], 0), signature=[-1, 5, 6, 8])
    sp = m.add([2, 1, 1, 8], ttype, "spatial", quant=([so], [zo], 0))
    m.op("MEAN", [x, m.const(np.array([1, 2], np.int32))], [sp], [("i8", 1)])
    ga = m.add([5, 6], ttype, "general", quant=([so2], [zo2], 0))
    m.op("MEAN", [x, m.const(np.array([-1, 0, 3], np.int32))], [ga], [("i8", 0)])
    one = m.add([2, 5, 8], ttype, "one", quant=([si], [zi], 0))  # same scale: n = 6
    m.op("MEAN", [x, m.const(np.array([2], np.int32))], [one], [("i8", 0)])
    m.inputs, m.outputs = [x], [sp, ga, one]
    rng = np.random.default_rng(31)
    xv = rng.integers(qmin, qmax + 1, (2, 5, 6, 8)).astype(npt)
    xv[0, :, :, 0] = qmax  # saturating channel
    got = run_model(m, {"x": xv}, tmp_path)
    want = mean_ref(xv, [1, 2], True, si, zi, so, zo, qmin, qmax)
    np.testing.assert_array_equal(got["spatial"], want.astype(npt))
    want = mean_ref(xv, [-1, 0, 3], False, si, zi, so2, zo2, qmin, qmax)
    np.testing.assert_array_equal(got["general"], want.astype(npt))
    want = mean_ref(xv, [2], False, si, zi, si, zi, qmin, qmax)
    np.testing.assert_array_equal(got["one"], want.astype(npt))
    # and it is the float mean within one output step where nothing saturates
    fx = (xv.astype(np.float64) - zi) * si
    fm = fx.mean(axis=(1, 2), keepdims=True)
    fy = (got["spatial"].astype(np.float64) - zo) * so
    ok = (fm < (qmax - zo - 1) * so) & (fm > (qmin - zo + 1) * so)
    assert ok.sum() > 8 and np.max(np.abs(fy - fm)[ok]) <= so * 1.01


# ---------------------------------------- int16 activations ("16x8" quantization)


def mul_by_qm64(x, q, shift):
    """MultiplyByQuantizedMultiplier for int64 accumulators (the 16x8 kernels)."""
    q = np.asarray(q, np.int64)
    reduced = np.where(q < 0x7FFF0000, (q + (1 << 15)) >> 16, 0x7FFF)
    total = 15 - np.asarray(shift, np.int64)
    return (np.asarray(x, np.int64) * reduced + (np.int64(1) << (total - 1))) >> total


# TFLite's sigmoid_table_uint16 (kernels/internal/common.h): sigmoid(i / 24) in 0.16
SIGMOID_U16 = np.array([
    32768, 33451, 34133, 34813, 35493, 36169, 36843, 37513, 38180, 38841, 39498, 40149, 40794,
    41432, 42064, 42688, 43304, 43912, 44511, 45102, 45683, 46255, 46817, 47369, 47911, 48443,
    48964, 49475, 49975, 50464, 50942, 51409, 51865, 52311, 52745, 53169, 53581, 53983, 54374,
    54755, 55125, 55485, 55834, 56174, 56503, 56823, 57133, 57433, 57724, 58007, 58280, 58544,
    58800, 59048, 59288, 59519, 59743, 59959, 60168, 60370, 60565, 60753, 60935, 61110, 61279,
    61441, 61599, 61750, 61896, 62036, 62172, 62302, 62428, 62549, 62666, 62778, 62886, 62990,
    63090, 63186, 63279, 63368, 63454, 63536, 63615, 63691, 63765, 63835, 63903, 63968, 64030,
    64090, 64148, 64204, 64257, 64308, 64357, 64405, 64450, 64494, 64536, 64576, 64614, 64652,
    64687, 64721, 64754, 64786, 64816, 64845, 64873, 64900, 64926, 64950, 64974, 64997, 65019,
    65039, 65060, 65079, 65097, 65115, 65132, 65149, 65164, 65179, 65194, 65208, 65221, 65234,
    65246, 65258, 65269, 65280, 65291, 65301, 65310, 65319, 65328, 65337, 65345, 65352, 65360,
    65367, 65374, 65381, 65387, 65393, 65399, 65404, 65410, 65415, 65420, 65425, 65429, 65433,
    65438, 65442, 65445, 65449, 65453, 65456, 65459, 65462, 65465, 65468, 65471, 65474, 65476,
    65479, 65481, 65483, 65485, 65488, 65489, 65491, 65493, 65495, 65497, 65498, 65500, 65501,
    65503, 65504, 65505, 65507, 65508, 65509, 65510, 65511, 65512, 65513, 65514, 65515, 65516,
    65517, 65517, 65518, 65519, 65520, 65520, 65521, 65522, 65522, 65523, 65523, 65524, 65524,
    65525, 65525, 65526, 65526, 65526, 65527, 65527, 65528, 65528, 65528, 65529, 65529, 65529,
    65529, 65530, 65530, 65530, 65530, 65531, 65531, 65531, 65531, 65531, 65532, 65532, 65532,
    65532, 65532, 65532, 65533, 65533, 65533, 65533, 65533, 65533, 65533, 65533, 65534, 65534,
    65534, 65534, 65534, 65534, 65534, 65534, 65534, 65534, 65535], np.int64)


def act16_prepare(scale, tanh):
    """activations.cc's int16 Prepare (kInputIntegerBits 3)."""
    l2 = np.float32(np.log(np.float32(scale))) * (np.float32(1) / np.float32(np.log(np.float32(2))))
    r = np.round(l2)
    shift = 12 + int(r)
    if abs(l2 - r) < 1e-3 and (shift == 0 or (tanh and shift == 1)):
        return 0, shift
    mult, shift = float(scale) * 4096.0 * 3.0, 0
    while mult <= 32767.0 / 2.0 and shift <= 30:
        shift += 1
        mult *= 2.0
    return int(mult), shift


def act16_ref(x, scale, tanh):
    """reference_integer_ops::Logistic / Tanh for int16."""
    mult, shift = act16_prepare(scale, tanh)
    if mult == 0:
        mult, shift = 3 << shift, 0
    rnd = (1 << (shift - 1)) if shift > 0 else 0
    v = (x.astype(np.int64) * mult + rnd) >> shift
    a = np.abs(v)
    frac = 8 if tanh else 9
    uh = a >> frac
    ua = SIGMOID_U16[np.minimum(uh, 254)]
    ub = SIGMOID_U16[np.minimum(uh + 1, 255)]
    r = (ua << frac) + (a & ((1 << frac) - 1)) * (ub - ua)
    if tanh:
        r = np.where(uh >= 255, 0xFFFF << 8, r)
        r = np.where(v >= 0, r - (1 << 23) + (1 << 7), -r + (1 << 23) + (1 << 7) - 1)
        return r >> 8
    r = np.where(uh >= 255, 0x7FFF << 10, r)
    r = np.where(v >= 0, r + (1 << 9), (1 << 25) - r + (1 << 9) - 1)
    return r >> 10


def test_sigmoid_table_is_sigmoid():
    """The table the int16 kernels interpolate is sigmoid(i / 24) to within 1.5 steps."""
    i = np.arange(256)
    assert np.max(np.abs(SIGMOID_U16 - 65536 / (1 + np.exp(-i / 24)))) < 1.5


def test_int16_activations_bit_exact(tmp_path):
    """16x8 quantization: int16 activations (zero point 0), int8 weights, int64 bias,
    through CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, ADD, SUB, MUL, LOGISTIC,
    TANH, AVERAGE_POOL_2D, MEAN, QUANTIZE and DEQUANTIZE."""
    rng = np.random.default_rng(16)
    s_x, s_x2, s_p = np.float32(0.00031), np.float32(0.00052), np.float32(2.0 ** -12)
    m = mk.Model()
    x = m.add([1, 5, 5, 3], mk.I16, "x", quant=([s_x], [0], 0), signature=[-1, 5, 5, 3])
    x2 = m.add([1, 5, 5, 3], mk.I16, "x2", quant=([s_x2], [0], 0), signature=[-1, 5, 5, 3])
    xp = m.add([1, 5, 5, 3], mk.I16, "xp", quant=([s_p], [0], 0), signature=[-1, 5, 5, 3])
    f = m.add([2, 7], name="f", signature=[-1, 7])
    outs = {}

    def out(name, shape, scale):
        t = m.add(shape, mk.I16, name, quant=([scale], [0], 0))
        outs[name] = (t, scale)
        return t

    # CONV_2D: per-channel int8 filter, SAME, stride 1, RELU
    wc = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    swc = rng.uniform(0.002, 0.01, 4).astype(np.float32)
    bc = rng.integers(-200000, 200000, 4).astype(np.int64)
    s_c = np.float32(0.0007)
    m.op("CONV_2D", [x, m.const(wc, quant=(swc, [0] * 4, 0)),
                     m.const(bc, quant=(s_x * swc, [0] * 4, 0))],
         [out("conv", [1, 5, 5, 4], s_c)], [("i8", 0), ("i32", 1), ("i32", 1), ("i8", 1)])
    # DEPTHWISE_CONV_2D: multiplier 2, VALID
    wd = rng.integers(-127, 128, (1, 3, 3, 6)).astype(np.int8)
    swd = rng.uniform(0.002, 0.01, 6).astype(np.float32)
    bd = rng.integers(-50000, 50000, 6).astype(np.int64)
    s_d = np.float32(0.0004)
    m.op("DEPTHWISE_CONV_2D", [x, m.const(wd, quant=(swd, [0] * 6, 3)),
                               m.const(bd, quant=(s_x * swd, [0] * 6, 0))],
         [out("dw", [1, 3, 3, 6], s_d)], [("i8", 1), ("i32", 1), ("i32", 1), ("i32", 2)])
    # FULLY_CONNECTED over the flattened image, per tensor
    wf = rng.integers(-127, 128, (5, 75)).astype(np.int8)
    bf = rng.integers(-100000, 100000, 5).astype(np.int64)
    s_wf, s_f = np.float32(0.004), np.float32(0.002)
    m.op("FULLY_CONNECTED", [x, m.const(wf, quant=([s_wf], [0], 0)),
                             m.const(bf, quant=([s_x * s_wf], [0], 0))],
         [out("fc", [1, 5], s_f)], [("i8", 0)])
    # ADD and SUB (general scales: pot_scale_int16 false), MUL
    s_a, s_m = np.float32(0.0006), np.float32(0.0000123)
    m.op("ADD", [x, x2], [out("add", [1, 5, 5, 3], s_a)], [("i8", 0), ("i8", 0)])
    m.op("SUB", [x, x2], [out("sub", [1, 5, 5, 3], s_a)], [("i8", 0), ("i8", 0)])
    m.op("MUL", [x, x2], [out("mul", [1, 5, 5, 3], s_m)], [("i8", 0)])
    # LOGISTIC and TANH: a general input scale and a power-of-two one
    m.op("LOGISTIC", [x], [out("lg", [1, 5, 5, 3], 2.0 ** -15)])
    m.op("TANH", [x], [out("th", [1, 5, 5, 3], 2.0 ** -15)])
    m.op("LOGISTIC", [xp], [out("lgp", [1, 5, 5, 3], 2.0 ** -15)])
    m.op("TANH", [xp], [out("thp", [1, 5, 5, 3], 2.0 ** -15)])
    # AVERAGE_POOL_2D and MEAN
    m.op("AVERAGE_POOL_2D", [x], [out("pool", [1, 2, 2, 3], s_x)],
         [("i8", 1), ("i32", 2), ("i32", 2), ("i32", 2), ("i32", 2), ("i8", 0)])
    s_mean = np.float32(0.00017)
    m.op("MEAN", [x, m.const(np.array([1, 2], np.int32))], [out("mean", [1, 1, 1, 3], s_mean)],
         [("i8", 1)])
    # QUANTIZE float -> int16 and DEQUANTIZE back
    s_q = np.float32(0.0002)
    m.op("QUANTIZE", [f], [out("q", [2, 7], s_q)])
    dq = m.add([2, 7], name="dq")
    m.op("DEQUANTIZE", [outs["q"][0]], [dq])
    m.inputs = [x, x2, xp, f]
    m.outputs = [t for t, _ in outs.values()] + [dq]
    xv = rng.integers(-32768, 32768, (1, 5, 5, 3)).astype(np.int16)
    xv[0, 0, 0, :] = [-32768, 32767, 0]
    x2v = rng.integers(-32768, 32768, (1, 5, 5, 3)).astype(np.int16)
    xpv = rng.integers(-32768, 32768, (1, 5, 5, 3)).astype(np.int16)
    fv = rng.uniform(-8, 8, (2, 7)).astype(np.float32)
    got = run_model(m, {"x": xv, "x2": x2v, "xp": xpv, "f": fv}, tmp_path)
    x64, x264 = xv.astype(np.int64), x2v.astype(np.int64)

    def check(name, want, lo=-32768):
        np.testing.assert_array_equal(got[name], np.clip(want, lo, 32767).astype(np.int16),
                                      err_msg=name)

    acc = conv_ref(x64.astype(np.float64), wc.astype(np.float64), bc.astype(np.float64), 1,
                   True).astype(np.int64)
    q = [quantize_multiplier(float(s_x) * float(s) / float(s_c)) for s in swc]
    check("conv", mul_by_qm64(acc, [a for a, _ in q], [b for _, b in q]), lo=0)
    acc = conv_ref(x64.astype(np.float64), wd.astype(np.float64), bd.astype(np.float64), 1,
                   False, depthwise=True).astype(np.int64)
    q = [quantize_multiplier(float(s_x) * float(s) / float(s_d)) for s in swd]
    check("dw", mul_by_qm64(acc, [a for a, _ in q], [b for _, b in q]))
    acc = x64.reshape(1, 75) @ wf.astype(np.int64).T + bf
    check("fc", mul_by_qm64(acc, *quantize_multiplier(float(s_x) * float(s_wf) / float(s_f))))
    twice = 2 * max(float(s_x), float(s_x2))
    m1, sh1 = quantize_multiplier(float(s_x) / twice)
    m2, sh2 = quantize_multiplier(float(s_x2) / twice)
    mo, sho = quantize_multiplier(twice / ((1 << 15) * float(s_a)))
    for name, sign in (("add", 1), ("sub", -1)):
        a1 = rdbpot(srdhm(x64 << 15, m1), -sh1)
        a2 = rdbpot(srdhm(x264 << 15, sign * m2), -sh2)
        check(name, rdbpot(srdhm(a1 + a2, mo), -sho))
    check("mul", mul_by_qm(x64 * x264, *quantize_multiplier(float(s_x * s_x2 / s_m))))
    check("lg", act16_ref(xv, s_x, False))
    check("th", act16_ref(xv, s_x, True))
    check("lgp", act16_ref(xpv, s_p, False))
    check("thp", act16_ref(xpv, s_p, True))
    win = x64[:, :4, :4, :].reshape(1, 2, 2, 2, 2, 3).transpose(0, 1, 3, 2, 4, 5)
    sums = win.reshape(1, 2, 2, 4, 3).sum(axis=3)
    check("pool", np.where(sums > 0, (sums + 2) // 4, -((-sums + 2) // 4)))
    check("mean", mean_ref(xv, [1, 2], True, s_x, 0, s_mean, 0, -32768, 32767))
    qv = np.clip(round_half_away(fv / s_q), -32768, 32767)
    check("q", qv)
    np.testing.assert_array_equal(got["dq"], (qv * s_q).astype(np.float32))
    # the functions themselves, within a few steps of 2^-15
    dx = xv.astype(np.float64) * float(s_x)
    assert np.max(np.abs(got["lg"] / 32768 - 1 / (1 + np.exp(-dx)))) < 2e-4
    assert np.max(np.abs(got["th"] / 32768 - np.tanh(dx))) < 4e-4


# ---------------------------------------------------------------------- SVDF


def svdf_ref(x, wf, wt, bias, rank, relu):
    """TFLite's EvalFloatSVDF on a freshly reset (zero) state: shift the state left
    one frame, write x . weights_feature into the newest column, then the time
    weights over the whole memory, summed over each unit's rank filters."""
    b, nf, mem = x.shape[0], wf.shape[0], wt.shape[1]
    state = np.zeros((b, nf, mem), np.float64)
    state[:, :, :-1] = state[:, :, 1:]
    state[:, :, -1] = x.astype(np.float64) @ wf.T.astype(np.float64)
    per_filter = (state * wt[None].astype(np.float64)).sum(axis=2)
    out = per_filter.reshape(b, nf // rank, rank).sum(axis=2) + bias
    return np.maximum(out, 0) if relu else out


def test_svdf_float(tmp_path):
    rng = np.random.default_rng(27)
    nin, nf, rank, mem = 5, 6, 2, 4
    wf = rng.normal(size=(nf, nin)).astype(np.float32)
    wt = rng.normal(size=(nf, mem)).astype(np.float32)
    bias = rng.normal(size=nf // rank).astype(np.float32)
    m = mk.Model()
    x = m.add([1, nin], name="x", signature=[-1, nin])
    state = m.add([1, nf * mem], name="state")
    m.tensors[state][5] = ("u8", 1)  # is_variable
    y = m.add([1, nf // rank], name="y")
    m.op("SVDF", [x, m.const(wf), m.const(wt), m.const(bias), state], [y],
         [("i32", rank), ("i8", 1)])
    y2 = m.add([1, nf], name="y2")  # rank 1, no bias, no activation
    state2 = m.add([1, nf * mem], name="state2")
    m.tensors[state2][5] = ("u8", 1)
    m.op("SVDF", [x, m.const(wf), m.const(wt), -1, state2], [y2], [("i32", 1), ("i8", 0)])
    m.inputs, m.outputs = [x], [y, y2]
    xv = rng.normal(size=(3, nin)).astype(np.float32)
    got = run_model(m, {"x": xv}, tmp_path)
    np.testing.assert_allclose(got["y"], svdf_ref(xv, wf, wt, bias, rank, True), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(got["y2"], svdf_ref(xv, wf, wt, 0, 1, False), rtol=1e-5,
                               atol=1e-5)
    assert (got["y"] == 0).any() and (got["y"] > 0).any()  # the RELU did something


def svdf_int_ref(x, wf, wt, bias, rank, s_in, z_in, s_wf, s_wt, s_st, s_out, z_out):
    """TFLite's EvalIntegerSVDF on a freshly reset (zero) int16 state."""
    b, nf, mem = x.shape[0], wf.shape[0], wt.shape[1]
    state = np.zeros((b, nf, mem), np.int64)
    q1, sh1 = quantize_multiplier(float(np.float32(s_in * s_wf / s_st)))
    q2, sh2 = quantize_multiplier(float(np.float32(s_st * s_wt / s_out)))
    dot = (x.astype(np.int64) - z_in) @ wf.astype(np.int64).T
    state[:, :, -1] = np.clip(mul_by_qm(wrap32(dot), q1, sh1), -32768, 32767)
    scratch = wrap32((state * wt[None].astype(np.int64)).sum(axis=2))
    acc = wrap32(scratch.reshape(b, nf // rank, rank).sum(axis=2) + bias)
    return np.clip(mul_by_qm(acc, q2, sh2) + z_out, -128, 127)


def test_svdf_int8_bit_exact(tmp_path):
    rng = np.random.default_rng(28)
    nin, nf, rank, mem = 12, 8, 2, 5
    s_in, z_in, s_wf, s_wt, s_st = (np.float32(v) for v in (0.06, 0, 0.009, 0.0037, 0.0044))
    s_out, z_out = np.float32(20), -3
    z_in = -7
    wf = rng.integers(-127, 128, (nf, nin)).astype(np.int8)
    wt = rng.integers(-32767, 32768, (nf, mem)).astype(np.int16)
    bias = rng.integers(-3000, 3000, nf // rank).astype(np.int32)
    m = mk.Model()
    x = m.add([1, nin], mk.I8, "x", quant=([s_in], [z_in], 0), signature=[-1, nin])
    st = m.add([1, nf * mem], mk.I16, "state", quant=([s_st], [0], 0))
    m.tensors[st][5] = ("u8", 1)
    y = m.add([1, nf // rank], mk.I8, "y", quant=([s_out], [z_out], 0))
    m.op("SVDF", [x, m.const(wf, quant=([s_wf], [0], 0)), m.const(wt, quant=([s_wt], [0], 0)),
                  m.const(bias, quant=([s_in * s_wf * s_wt], [0], 0)), st], [y],
         [("i32", rank), ("i8", 1)])
    m.inputs, m.outputs = [x], [y]
    xv = rng.integers(-128, 128, (4, nin)).astype(np.int8)
    got = run_model(m, {"x": xv}, tmp_path)
    want = svdf_int_ref(xv, wf, wt, bias, rank, s_in, z_in, s_wf, s_wt, s_st, s_out, z_out)
    np.testing.assert_array_equal(got["y"], want.astype(np.int8))
    assert len(np.unique(got["y"])) > 3


def test_softmax_int16_output_and_requantize_to_int32(tmp_path):
    """int8 SOFTMAX into int16 (scale 1/65536, zero point -32768) and QUANTIZE of
    int16 into int32, as the keyword model ends."""
    si, zi = np.float32(0.07), 2
    m = mk.Model()
    x = m.add([1, 6], mk.I8, "x", quant=([si], [zi], 0), signature=[-1, 6])
    sm = m.add([1, 6], mk.I16, "sm", quant=([1 / 65536], [-32768], 0))
    m.op("SOFTMAX", [x], [sm], [("f32", 1.0)])
    q = m.add([1, 6], mk.I32, "q", quant=([1 / 32768], [0], 0))
    m.op("QUANTIZE", [sm], [q])
    m.inputs, m.outputs = [x], [sm, q]
    rng = np.random.default_rng(29)
    xv = rng.integers(-128, 128, (5, 6)).astype(np.int8)
    xv[0] = 7  # equal logits
    got = run_model(m, {"x": xv}, tmp_path)
    d = (xv.astype(np.float64) - zi) * si
    p = np.exp(d - d.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    fy = (got["sm"].astype(np.float64) + 32768) / 65536
    assert np.max(np.abs(fy - p)) <= 2 / 65536
    # quantize.cc's Requantize: MultiplyByQuantizedMultiplier(x + 32768, 0.5) + 0
    qm, sh = quantize_multiplier(float(np.float32(1 / 65536)) / float(np.float32(1 / 32768)))
    want = mul_by_qm(got["sm"].astype(np.int64) + 32768, qm, sh)
    np.testing.assert_array_equal(got["q"], want.astype(np.int32))


def test_keyword_model_runs_in_its_output_range(tmp_path):
    """keyword_scrambled (tflite-micro's SVDF test model, weights scrambled): int16
    features -> QUANTIZE, seven integer SVDFs and five FULLY_CONNECTED layers, SOFTMAX
    into int16 and QUANTIZE into int32. Its two outputs are probabilities at scale
    2^-15: each in [0, 32768], summing to 32768 within the softmax's rounding."""
    path = MICRO / "models/keyword_scrambled.tflite"
    r = kiln("inspect", path)
    assert r.returncode == 0, r.stderr
    assert "TflSvdf" in r.stdout and "tensor_52: int16[1,96]" in r.stdout
    rng = np.random.default_rng(30)
    for xv in (np.zeros((1, 96), np.int16), rng.integers(-32768, 32768, (1, 96)).astype(np.int16),
               rng.integers(-2000, 2000, (1, 96)).astype(np.int16)):
        got = predict(path, {"tensor_52": xv}, tmp_path)["tensor_53"]
        assert got.dtype == np.int32 and got.shape == (1, 2)
        assert got.min() >= 0 and got.max() <= 32768 and abs(int(got.sum()) - 32768) <= 2


# ------------------------------------------------ hybrid LSTM (float input, int8 weights)


def f32(v):
    return np.float32(v)


def round_away(x):
    """C's round / roundf (half away from zero), exact for float32 and double."""
    a = np.abs(x)
    f = np.floor(a)
    return np.sign(x) * (f + (a - f >= 0.5))


def hyb_quantize(v, asym):
    """TFLite's BatchQuantizeFloats for one row: (q, scale, zero point), None
    for an all-zero row (IsZeroVector: TFLite skips its product)."""
    v = v.astype(np.float32)
    if not v.any():
        return None
    if not asym:  # SymmetricQuantizeFloats
        rng_ = f32(max(abs(v.min()), abs(v.max())))
        sf, inv = f32(rng_ / f32(127)), f32(f32(127) / rng_)
        return np.clip(round_away(v * inv), -127, 127).astype(np.int64), sf, 0
    # AsymmetricQuantizeFloats: the nudged zero point in double
    rmin, rmax = min(0.0, float(v.min())), max(0.0, float(v.max()))
    scale = (rmax - rmin) / 255.0
    zmin, zmax = -128.0 - rmin / scale, 127.0 - rmax / scale
    emin, emax = 128.0 + abs(rmin / scale), 127.0 + abs(rmax / scale)
    z = zmin if emin < emax else zmax
    zp = -128 if z <= -128 else 127 if z >= 127 else int(round_away(z))
    sf = f32(scale)
    inv = f32(1.0 / float(sf))
    return np.clip(round_away(f32(zp) + v * inv), -128, 127).astype(np.int64), sf, zp


def hyb_matvec(w, qrow, ws, out):
    """out += float(dot(w, q) - row_sum(w) * zp) * (row scale * weight scale)."""
    if qrow is None:
        return out
    q, sf, zp = qrow
    dot = w.astype(np.int64) @ q
    if zp:
        d = dot.astype(np.float32) - w.astype(np.int64).sum(1).astype(np.float32) * f32(zp)
        dot = np.trunc(d).astype(np.int64)
    return (out + dot.astype(np.float32) * f32(sf * f32(ws))).astype(np.float32)


def fsum(a):
    s = f32(0)
    for v in a:
        s = f32(s + v)
    return s


def hybrid_lstm_ref(x, w, time_major, asym, cell_clip=0.0, proj_clip=0.0, act=4):
    """TFLite's hybrid LSTM (lstm_eval.cc EvalHybrid / LstmStepHybrid with the
    portable tensor_utils), in float32 in TFLite's order, one batch row at a
    time: input and h rows quantized to int8 (hyb_quantize), int8 products
    rescaled into the gates, the rest in float."""
    acts = {1: lambda v: np.maximum(v, f32(0)), 2: lambda v: np.clip(v, f32(-1), f32(1)),
            3: lambda v: np.clip(v, f32(0), f32(6)), 4: np.tanh}
    fa = acts[act]
    sig = lambda v: (f32(1) / (f32(1) + np.exp(-v))).astype(np.float32)  # noqa: E731
    xs = x if time_major else x.transpose(1, 0, 2)
    steps, batch, _ = xs.shape
    C = w["w_f"].shape[0]
    O = w["r_f"].shape[1]
    cifg = w["w_i"] is None
    ln = w["ln_f"] is not None
    gates = "fco" if cifg else "ifco"
    pw = {g: (f32(w["s_p_" + g]) * w["p_" + g].astype(np.float32)).astype(np.float32)
          for g in "ifo" if w.get("p_" + g) is not None}
    h = np.zeros((batch, O), np.float32)
    c = np.zeros((batch, C), np.float32)
    ys = np.zeros((steps, batch, O), np.float32)
    for t in range(steps):
        for b in range(batch):
            qx = hyb_quantize(xs[t, b], asym)
            qh = hyb_quantize(h[b], asym)
            gate = {}
            for g in [k for k in "ifco" if k in gates]:
                if g == "o":  # UpdateLstmCellFloat before the output gate
                    cb = (gate["f"] * c[b]).astype(np.float32)
                    ig = (f32(1) - gate["f"]) if cifg else gate["i"]
                    cb = (cb + gate["c"] * ig).astype(np.float32)
                    if cell_clip > 0:
                        cb = np.clip(cb, f32(-cell_clip), f32(cell_clip))
                    c[b] = cb
                z = np.zeros(C, np.float32) if ln else w["b_" + g].copy()
                z = hyb_matvec(w["w_" + g], qx, w["s_w_" + g], z)
                z = hyb_matvec(w["r_" + g], qh, w["s_r_" + g], z)
                if g in pw:
                    z = (z + pw[g] * c[b]).astype(np.float32)
                if ln:
                    mean = f32(fsum(z) / f32(C))
                    var = f32(fsum((z - mean) * (z - mean)) / f32(C))
                    inv = f32(f32(1) / np.sqrt(f32(var + f32(1e-8))))
                    z = ((z - mean) * inv).astype(np.float32)
                    z = (w["ln_" + g] * z + w["b_" + g]).astype(np.float32)
                gate[g] = fa(z).astype(np.float32) if g == "c" else sig(z)
            s = (gate["o"] * fa(c[b])).astype(np.float32)
            if w["proj_w"] is not None:
                hb = w["proj_b"].copy() if w["proj_b"] is not None else np.zeros(O, np.float32)
                hb = hyb_matvec(w["proj_w"], hyb_quantize(s, asym), w["s_proj_w"], hb)
                if proj_clip > 0:
                    hb = np.clip(hb, f32(-proj_clip), f32(proj_clip))
            else:
                hb = s
            h[b] = hb
            ys[t, b] = hb
    return ys if time_major else ys.transpose(1, 0, 2)


def dequantized(w):
    return {k: (v.astype(np.float64) * float(w["s_" + k]) if v is not None and v.dtype == np.int8
                else v) for k, v in w.items() if not k.startswith("s_")}


LSTM_HYBRID = {
    "plain": dict(),
    "plain_asym": dict(asym=True),
    "peephole_time_major_asym": dict(peephole=True, time_major=True, asym=True),
    "cifg_projection_asym": dict(cifg=True, proj=3, asym=True),
    "layer_norm_clips": dict(layer_norm=True, proj=3, cell_clip=0.4, proj_clip=0.3,
                             peephole=True),
    "everything_asym": dict(peephole=True, proj=3, layer_norm=True, cell_clip=0.4,
                            proj_clip=0.3, asym=True),
    "projection_no_bias": dict(proj=4, proj_bias=False),
    "relu6": dict(act=3, asym=True),
    "one_step": dict(one_step=True, peephole=True, proj=3, layer_norm=True, asym=True),
}


@pytest.mark.parametrize("case", sorted(LSTM_HYBRID))
def test_lstm_hybrid(tmp_path, case):
    """Hybrid LSTMs (int8 weights with one scale each, float input): Kiln's
    TflLstmHybrid against hybrid_lstm_ref, TFLite's per-row input and state
    quantization included; a batch row of zeros exercises TFLite's skip."""
    kw = dict(LSTM_HYBRID[case])
    asym = kw.get("asym", False)
    m, w = mk.lstm_model(3, 5, 4, 6, seed=31, hybrid=True, **kw)
    tm, one = kw.get("time_major", False), kw.get("one_step", False)
    rng = np.random.default_rng(32)
    shape = (3, 4) if one else (5, 3, 4) if tm else (3, 5, 4)
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    if one:
        x[1] = 0
    elif tm:
        x[2, 1] = 0
    else:
        x[1, 2] = 0
    p = tmp_path / "m.tflite"
    p.write_bytes(m.bytes())
    r = kiln("inspect", p)
    assert r.returncode == 0 and "TflLstmHybrid" in r.stdout, r.stderr
    got = predict(p, {"x": x}, tmp_path)["y"]
    xr = x[:, None, :] if one else x
    want = hybrid_lstm_ref(xr, w, tm, asym, kw.get("cell_clip", 0.0), kw.get("proj_clip", 0.0),
                           kw.get("act", 4))
    if one:
        want = want[:, 0, :]
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)
    # asymmetric_quantize_inputs is read: the other quantization gives other answers
    other = hybrid_lstm_ref(xr, w, tm, not asym, kw.get("cell_clip", 0.0),
                            kw.get("proj_clip", 0.0), kw.get("act", 4))
    assert np.abs((other[:, 0, :] if one else other) - want).max() > 1e-4
    # the per-row quantization is what is computed: the float LSTM on the
    # dequantized weights gives visibly different answers
    act = {1: lambda v: np.maximum(v, 0), 3: lambda v: np.clip(v, 0, 6)}.get(kw.get("act"),
                                                                              np.tanh)
    flt = lstm_ref(xr.astype(np.float64), dequantized(w), tm, kw.get("cell_clip", 0.0),
                   kw.get("proj_clip", 0.0), act)
    if one:
        flt = flt[:, 0, :]
    assert np.abs(flt - want).max() > 1e-4
    np.testing.assert_allclose(got, flt, atol=0.1)  # and yet it is the same LSTM


def hybrid_lstm_with(change):
    """A small hybrid sequence LSTM whose input_to_cell_weights tensor (input
    3) has the quantization change(...) gives, as (scales, zero points, dim)."""
    m, w = mk.lstm_model(1, 2, 3, 4, seed=5, hybrid=True)
    k = m.tensors[m.ops[0][1][1][3]]
    q = change(w)
    k[4] = None if q is None else ("table", [None, None, ("vf32", q[0]), ("vi64", q[1]), None,
                                             None, ("i32", q[2])])
    return m


@pytest.mark.parametrize("change,pattern", [
    (lambda w: None, r"input_to_cell_weights \(input 3, tensor 't3'\) has no quantization scale"),
    (lambda w: ([], [], 0), r"input_to_cell_weights \(input 3, tensor 't3'\) has no "
                            r"quantization scale"),
    (lambda w: ([0.01, 0.02], [0, 0, 0], 0), r"'t3'.*2 scales but 3 zero points"),
    (lambda w: ([0.01] * 4, [0] * 4, 0), r"'t3'\) has 4 scales; TFLite's hybrid LSTM reads one"),
    (lambda w: ([0.0], [0], 0), r"'t3'\) has scale 0"),
    (lambda w: ([float("nan")], [0], 0), r"'t3'\) has scale nan"),
    (lambda w: ([0.01], [3], 0), r"'t3'\) has zero point 3"),
])
def test_lstm_hybrid_bad_quantization(tmp_path, change, pattern):
    m = hybrid_lstm_with(change)
    p = tmp_path / "bad.tflite"
    p.write_bytes(m.bytes())
    assert_clean_error(kiln("inspect", p), pattern)


def test_lstm_hybrid_bad_shapes_and_types(tmp_path):
    m, w = mk.lstm_model(1, 2, 3, 4, seed=5, hybrid=True, proj=3)
    m.tensors[m.ops[0][1][1][16]][0] = ("vi32", [3, 5])  # projection_weights [3, 5], not [3, 4]
    p = tmp_path / "bad.tflite"
    p.write_bytes(m.bytes())
    assert_clean_error(kiln("inspect", p),
                       r"projection_weights \(input 16, tensor 't\d+'\) must have shape \[3, 4\]")
    m, w = mk.lstm_model(1, 2, 3, 4, seed=5, hybrid=True)
    m.tensors[m.ops[0][1][1][13]][1] = ("i8", mk.I8)  # forget_gate_bias declared int8
    p.write_bytes(m.bytes())
    assert_clean_error(kiln("inspect", p), r"forget_gate_bias \(input 13, tensor 't\d+'\) is int8")


# ---------------------------- fully integer LSTM ("8x8_16": int8 activations, int16 cell)
#
# An emulation of TFLite's integer LSTM written from its reference semantics:
# lstm.cc's PopulateQuantizedLstmParams8x8_16 (effective scales in float,
# QuantizeMultiplier), lstm_eval.cc's LstmStepInteger8x8_16 with the portable
# tensor_utils, and gemmlowp's 16-bit fixed point (FixedPoint<int16_t, m>),
# vectorized over the batch and the cells. Products with zero points are
# written as (x - zp) W^T + b rather than TFLite's folded biases (the same
# integers when nothing overflows int32, as here).


def sat_(v, bits):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return np.clip(np.asarray(v, np.int64), lo, hi)


def wrap16(v):
    return ((np.asarray(v, np.int64) + (1 << 15)) & 0xFFFF) - (1 << 15)


def qmult(real):
    """QuantizeMultiplier (quantization_util.cc), with its caps."""
    if real == 0:
        return 0, 0
    m, e = math.frexp(real)
    q = int(round_half_away(np.float64(m) * 2.0 ** 31))
    if q == 2 ** 31:
        q, e = q // 2, e + 1
    if e < -31:
        return 0, 0
    if e > 30:
        return 2 ** 31 - 1, 30
    return q, e


def div_trunc(n, d):
    """C's integer division (towards zero) on int64 arrays."""
    n = np.asarray(n, np.int64)
    return np.where(n >= 0, n // d, -((-n) // d))


def srdhm32(a, b):
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    r = div_trunc(a * b + np.where(a * b >= 0, 1 << 30, 1 - (1 << 30)), 1 << 31)
    return np.where((a == -(1 << 31)) & (b == -(1 << 31)), (1 << 31) - 1, r)


def mbqm(x, q, shift):
    """MultiplyByQuantizedMultiplier (double rounding; x * 2^left wraps in int32)."""
    left, right = max(shift, 0), max(-shift, 0)
    return rdbpot(srdhm32(wrap32(np.asarray(x, np.int64) << left), q), right)


# gemmlowp FixedPoint<int16_t, m>: raw int16 values; + and - wrap, * is
# SaturatingRoundingDoublingHighMul, constants are 32-bit ones rounded to 16.
def fp_mul(a, b):
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    r = div_trunc(a * b + np.where(a * b >= 0, 1 << 14, 1 - (1 << 14)), 1 << 15)
    return np.where((a == -32768) & (b == -32768), 32767, r)


def fp_const(raw32):
    return int(rdbpot(raw32, 16))


def fp_rescale_up(a, e):
    """SaturatingRoundingMultiplyByPOT<e> for e > 0 (Rescale to fewer integer bits)."""
    return sat_(np.asarray(a, np.int64) * (1 << e), 16)


def fp_exp_quarter(a):
    """exp on [-1/4, 0): Taylor around -1/8 (Q0.15)."""
    x = wrap16(a + (1 << 12))
    x2 = fp_mul(x, x)
    x3 = fp_mul(x2, x)
    x4 = fp_mul(x2, x2)
    tail = rdbpot(wrap16(fp_mul(wrap16(rdbpot(x4, 2) + x3), fp_const(715827883)) + x2), 1)
    c = fp_const(1895147668)
    return sat_(c + fp_mul(c, wrap16(x + tail)), 16)  # saturating in 16 bits


EXP_BARREL = [(-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
              (2, 39332535), (3, 720401), (4, 242)]


def fp_exp_neg(a, m):
    """exp_on_negative_values of Qm.(15-m) a <= 0, Q0.15 out."""
    a = np.asarray(a, np.int64)
    frac = 15 - m
    quarter = 1 << (frac - 2)
    r_mod = wrap16((a & (quarter - 1)) - quarter)
    out = fp_exp_quarter(fp_rescale_up(r_mod, m))
    rem = wrap16(r_mod - a)
    for e, mult in EXP_BARREL:
        if m > e:
            out = np.where(rem & (1 << (frac + e)), fp_mul(out, fp_const(mult)), out)
    if m > 5:
        out = np.where(a < fp_const(-(1 << (36 - m))), 0, out)
    return np.where(a == 0, 32767, out)


def fp_newton(a):
    """Newton-Raphson for 1 / (1 + a), a in [0, 1) Q0.15; Q2.13 out."""
    s = np.asarray(a, np.int64) + 32767
    half = div_trunc(s + np.where(s >= 0, 1, -1), 2)
    x = wrap16(fp_const(1515870810) + fp_mul(half, fp_const(-1010580540)))
    for _ in range(3):
        x = wrap16(x + fp_rescale_up(fp_mul(x, wrap16((1 << 13) - fp_mul(half, x))), 2))
    return x


def fp_logistic(a, m):
    a = np.asarray(a, np.int64)
    absa = np.where(a > 0, a, wrap16(-a))
    pos = fp_rescale_up(fp_newton(fp_exp_neg(wrap16(-absa), m)), 1)
    return np.where(a == 0, fp_const(1 << 30), np.where(a > 0, pos, wrap16(32767 - pos)))


def fp_tanh(a, m):
    a = np.asarray(a, np.int64)
    n = np.where(a < 0, a, wrap16(-a))
    t = fp_rescale_up(wrap16(fp_newton(fp_exp_neg(n, m + 1)) - (1 << 13)), 2)
    return np.where(a == 0, 0, np.where(a < 0, wrap16(-t), t))


def test_gemmlowp_int16_logistic_tanh_approximate():
    """The 16-bit fixed-point logistic and tanh above are those functions (to a
    few units in the last place), over every Q3.12 input and a Q4.11 range."""
    a = np.arange(-32768, 32768)
    real = a / 4096.0
    assert np.abs(fp_logistic(a, 3) / 32768.0 - 1 / (1 + np.exp(-real))).max() < 3e-4
    assert np.abs(fp_tanh(a, 3) / 32768.0 - np.tanh(real)).max() < 5e-4
    assert np.abs(fp_tanh(a, 4) / 32768.0 - np.tanh(a / 2048.0)).max() < 5e-4
    assert np.abs(fp_tanh(a, 6) / 32768.0 - np.tanh(a / 512.0)).max() < 5e-4


def inv_sqrt_ref(v):
    """GetInvSqrtQuantizedMultiplierExp(v, -1): 1 / sqrt(v) as a multiplier and
    a (left) shift, by five Newton steps in Q3.28."""
    if v <= 1:
        return (1 << 31) - 1, 0
    shift = 11
    while v >= (1 << 29):
        v //= 4
        shift += 1
    pairs = (32 - v.bit_length() - 1) // 2 - 1
    shift -= pairs
    v <<= 2 * pairs
    half = int(rdbpot(v >> 1, 1))
    x = 1 << 28
    for _ in range(5):
        x3 = int(sat_(int(srdhm32(srdhm32(x, x), x)) << 6, 32))
        x = int(sat_(int(wrap32(int(srdhm32(3 << 27, x)) - int(srdhm32(half, x3)))) << 3, 32))
    x = int(srdhm32(x, 1518500250))
    if shift < 0:
        x, shift = int(wrap32(x << -shift)), 0
    return x, -shift


def layer_norm_int(z, coef, bias, m, s, guard):
    """tensor_utils::ApplyLayerNorm, row by row of the int16 gates z [B, C]."""
    out = np.empty_like(z)
    n = z.shape[1]
    for b in range(z.shape[0]):
        v = z[b].astype(np.int64)
        mean = int(div_trunc(int(v.sum()) * 1024, n))
        var = int(div_trunc(int((v * v).sum()) * ((1 << 20) // n) - mean * mean, 1 << 20))
        im, ish = inv_sqrt_ref(var if var >= 1 else guard)
        rescaled = mbqm(1024 * v - mean, im, ish)
        v3 = wrap32(rescaled * coef.astype(np.int64) + bias)  # an int32 expression
        v4 = div_trunc(np.where(v3 > 0, v3 + 512, v3 - 512), 1024)
        out[b] = sat_(mbqm(v4, m, s + 12), 16)
    return out


def int_lstm_ref(xq, q, time_major, cell_clip=0.0, proj_clip=0.0, stats=None):
    """TFLite's EvalInteger8x8_16 on the int8 input xq ([T, B, I] when
    time_major else [B, T, I]) from the reset state (output state at its zero
    point, cell state 0); q as lstm_int_model returns it. stats, a dict, gets
    the counts of saturated int16 gate sums ("gate") and cell states ("cell")."""
    stats = {} if stats is None else stats
    stats.update(gate=0, cell=0)
    f32 = np.float32
    xs = (xq if time_major else xq.transpose(1, 0, 2)).astype(np.int64)
    steps, batch, _ = xs.shape
    cells, nout = q["w_f"].shape[0], q["r_f"].shape[1]
    ln, cifg = q["ln_f"] is not None, q["w_i"] is None
    cs = q["cell_scale"]
    s_int = q["s_inter"] if ln else [f32(2.0 ** -12)] * 4  # Q3.12 without layer norm
    mult = {}  # PopulateQuantizedLstmParams8x8_16: products in float, peepholes in double
    for j, g in enumerate("ifco"):
        if q["w_" + g] is None:
            continue
        mult["x" + g] = qmult(float(f32(q["s_w_" + g] * q["s_in"]) / s_int[j]))
        mult["h" + g] = qmult(float(f32(q["s_r_" + g] * q["s_state"]) / s_int[j]))
        if q.get("p_" + g) is not None:
            mult["c" + g] = qmult(float(f32(2.0 ** cs * float(q["s_p_" + g]) / float(s_int[j]))))
        if ln:
            mult["ln" + g] = qmult(float(q["s_ln_" + g]))
    mh = qmult(float(f32(2.0 ** -15 / float(q["s_hidden"]) * 2.0 ** -15)))
    cclip = int(f32(cell_clip) / q["s_cell"]) if cell_clip > 0 else 0
    pclip = int(max(-128, min(127, f32(proj_clip) / q["s_state"]))) if proj_clip > 0 else 0
    h = np.full((batch, nout), q["zp_state"], np.int64)
    c = np.zeros((batch, cells), np.int64)
    ys = []
    for t in range(steps):
        gate = {}
        for j, g in enumerate("ifco"):
            if g == "i" and cifg:
                continue
            if g == "o":  # UpdateLstmCellInteger
                fc = wrap16(rdbpot(gate["f"] * c, 15))
                i = wrap16(32767 - gate["f"]) if cifg else gate["i"]
                c = fc + wrap16(rdbpot(i * gate["c"], 30 + cs))
                stats["cell"] += int(np.sum(np.abs(c) > 32767))
                c = sat_(c, 16)
                if cclip:
                    stats["cell_clip"] = stats.get("cell_clip", 0) + int(np.sum(np.abs(c) > cclip))
                    c = np.clip(c, -cclip, cclip)
            b = 0 if ln else q["b_" + g].astype(np.int64)
            acc = wrap32((xs[t] - q["zp_in"]) @ q["w_" + g].T.astype(np.int64) + b)
            z = sat_(mbqm(acc, *mult["x" + g]), 16)
            acc = wrap32((h - q["zp_state"]) @ q["r_" + g].T.astype(np.int64))
            z = mbqm(acc, *mult["h" + g]) + z
            stats["gate"] += int(np.sum((z > 32767) | (z < -32768)))
            z = sat_(z, 16)
            if "c" + g in mult:
                z = sat_(mbqm(q["p_" + g].astype(np.int64) * c, *mult["c" + g]) + z, 16)
            if ln:
                z = layer_norm_int(z, q["ln_" + g], q["b_" + g].astype(np.int64),
                                   *mult["ln" + g], max(1, int(f32(10000) * q["s_ln_" + g])))
            gate[g] = fp_tanh(z, 3) if g == "c" else fp_logistic(z, 3)
        # CalculateLstmOutputInteger8x8_16: TFLite subtracts the hidden zero point
        hid = sat_(mbqm(gate["o"] * fp_tanh(c, 15 + cs), *mh) - q["zp_hidden"], 8)
        if q["proj_w"] is not None:
            pb = q["proj_b"].astype(np.int64) if q["proj_b"] is not None else 0
            acc = wrap32((hid + q["zp_hidden"]) @ q["proj_w"].T.astype(np.int64) + pb)
            mp = qmult(float(f32(q["s_proj_w"] * q["s_hidden"]) / q["s_state"]))
            h = sat_(mbqm(acc, *mp) + q["zp_state"], 8)
            if pclip:
                h = np.clip(h, -pclip, pclip)
        else:
            h = hid
        ys.append(h)
    y = np.stack(ys).astype(np.int8)
    return y if time_major else y.transpose(1, 0, 2)


def int_lstm_float_weights(q):
    """The float LSTM the integer one approximates: its weights dequantized."""
    w = {}
    for k, v in q["float"].items():
        if v is None or q.get(k) is None:
            w[k] = None
        else:
            w[k] = q[k].astype(np.float64) * float(q["s_" + k])
    return w


LSTM_INT = {
    "plain": dict(),
    "cifg": dict(cifg=True),
    "peephole": dict(peephole=True),
    "cifg_peephole_time_major": dict(cifg=True, peephole=True, time_major=True),
    "layer_norm": dict(layer_norm=True),
    "layer_norm_cifg_peephole": dict(layer_norm=True, cifg=True, peephole=True),
    "projection": dict(proj=3),
    "projection_no_bias_peephole": dict(proj=4, proj_bias=False, peephole=True),
    "everything": dict(peephole=True, proj=4, layer_norm=True, cell_clip=0.5, proj_clip=0.6),
    "one_step": dict(one_step=True, layer_norm=True, proj=3),
    "cell_scale_-15": dict(cell_scale=-15, peephole=True),
    "cell_scale_-9": dict(cell_scale=-9, layer_norm=True),
    # large weights and inputs: the gates and the cell state saturate, the clips bite
    "saturating_clipped": dict(w_gain=6.0, x_scale=0.1, cell_clip=1.5, proj=3, proj_clip=0.5),
}


@pytest.mark.parametrize("case", sorted(LSTM_INT))
def test_lstm_integer_bit_exact(tmp_path, case):
    """Fully integer LSTMs (TflLstmInt) bit for bit against int_lstm_ref, and,
    dequantized, near the float LSTM on the dequantized weights."""
    kw = dict(LSTM_INT[case])
    tm, one = kw.get("time_major", False), kw.get("one_step", False)
    m, q = mk.lstm_int_model(3, 6, 4, 4, seed=41, **kw)
    rng = np.random.default_rng(42)
    shape = (3, 4) if one else (6, 3, 4) if tm else (3, 6, 4)
    xq = rng.integers(-128, 128, shape).astype(np.int8)
    if kw.get("w_gain"):
        xq[..., 0] = 127  # drive the gates to saturation
    p = tmp_path / "m.tflite"
    p.write_bytes(m.bytes())
    r = kiln("inspect", p)
    assert r.returncode == 0 and "TflLstmInt" in r.stdout, r.stderr
    got = predict(p, {"x": xq}, tmp_path)["y"]
    xr = xq[:, None, :] if one else xq
    stats = {}
    want = int_lstm_ref(xr, q, tm, kw.get("cell_clip", 0.0), kw.get("proj_clip", 0.0), stats)
    if one:
        want = want[:, 0, :]
    assert got.dtype == np.int8 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    # the same LSTM in float (dequantized weights and input): the integer one
    # approximates it (clipped and saturating cases excepted)
    if not kw.get("w_gain"):
        assert len(np.unique(want)) > (5 if one else 8)  # not a constant output
        xf = (xr.astype(np.float64) - q["zp_in"]) * float(q["s_in"])
        flt = lstm_ref(xf, int_lstm_float_weights(q), tm, kw.get("cell_clip", 0.0),
                       kw.get("proj_clip", 0.0))
        if one:
            flt = flt[:, 0, :]
        deq = (got.astype(np.float64) - q["zp_state"]) * float(q["s_state"])
        assert np.abs(deq - flt).max() < 3 * q["s_state"], np.abs(deq - flt).max()  # 3 steps
    else:  # the saturating case does saturate the gates, clip the cell and the output
        assert stats["gate"] > 20, stats
        assert stats["cell_clip"] > 0, stats
        pclip = int(np.float32(kw["proj_clip"]) / q["s_state"])
        assert want.max() == pclip and want.min() == -pclip and len(np.unique(want)) > 2


def test_lstm_integer_zero_point_and_batch_rows(tmp_path):
    """Each batch row is its own sequence (rows permuted give rows permuted),
    and an input at the zero point gives the constant trajectory of the biases."""
    m, q = mk.lstm_int_model(3, 5, 4, 4, seed=43, peephole=True, layer_norm=True, proj=4)
    p = tmp_path / "m.tflite"
    p.write_bytes(m.bytes())
    rng = np.random.default_rng(44)
    xq = rng.integers(-128, 128, (3, 5, 4)).astype(np.int8)
    xq[1] = q["zp_in"]
    got = predict(p, {"x": xq}, tmp_path)["y"]
    np.testing.assert_array_equal(got, int_lstm_ref(xq, q, False))
    perm = predict(p, {"x": xq[[2, 0, 1]]}, tmp_path)["y"]
    np.testing.assert_array_equal(perm, got[[2, 0, 1]])


def int_lstm_with(change, **kw):
    m, q = mk.lstm_int_model(1, 2, 3, 4, seed=5, **kw)
    change(m, q)
    return m


def set_quant(m, name, scales, zps):
    t = next(t for t in m.tensors if t[3] == ("str", name))
    t[4] = None if scales is None else ("table", [None, None, ("vf32", scales),
                                                  ("vi64", zps), None, None, ("i32", 0)])


@pytest.mark.parametrize("kw,change,pattern", [
    (dict(n_inter=12), lambda m, q: None,
     r"integer LSTM with 12 intermediates \(TFLite's 8x8_8 kernel\) is not implemented"),
    (dict(n_inter=4), lambda m, q: None, r"has 4 intermediate tensors"),
    (dict(peephole=True, proj=3), lambda m, q: None,
     r"integer LSTM with peepholes and a projection to 3 outputs from 4 cells is not implemented"),
    (dict(), lambda m, q: set_quant(m, "c_state", [0.001], [0]),
     r"cell_state \(input 19\) has scale 0.001, not a power of two"),
    (dict(cell_scale=-8), lambda m, q: None, r"cell_state \(input 19\) has scale 2\^-8"),
    (dict(), lambda m, q: set_quant(m, "w_c", [0.01, 0.02], [0, 0]),
     r"input_to_cell_weights \(input 3, tensor 'w_c'\) has 2 scales"),
    (dict(), lambda m, q: set_quant(m, "r_o", [0.01], [4]),
     r"recurrent_to_output_weights \(input 8, tensor 'r_o'\) has zero point 4"),
    (dict(), lambda m, q: set_quant(m, "intermediate_4", None, None),
     r"intermediate 4 'intermediate_4' has no quantization scale"),
    (dict(layer_norm=True), lambda m, q: set_quant(m, "intermediate_2", [0.0], [0]),
     r"intermediate 2 'intermediate_2' has scale 0"),
    (dict(), lambda m, q: m.tensors[m.ops[0][1][1][13]].__setitem__(1, ("i8", mk.F32)),
     r"forget_gate_bias \(input 13, tensor 'b_f'\) is float32; TFLite's integer LSTM takes "
     r"int32"),
    (dict(peephole=True), lambda m, q: m.tensors[m.ops[0][1][1][10]].__setitem__(1, ("i8", mk.I8)),
     r"cell_to_forget_weights \(input 10, tensor 'p_f'\) is int8"),
])
def test_lstm_integer_refused(tmp_path, kw, change, pattern):
    """Integer LSTMs Kiln does not compute, or malformed ones, are refused in
    one line naming what (TFLite's 8x8_8 kernel, peepholes with a projection
    of another size, a cell scale that is not a power of two in 2^-15..2^-9,
    per-channel or asymmetric weights, missing intermediate scales)."""
    m = int_lstm_with(change, **kw)
    p = tmp_path / "bad.tflite"
    p.write_bytes(m.bytes())
    assert_clean_error(kiln("inspect", p), pattern)
