"""`kiln watermark embed|verify` (docs/WATERMARK.md): a keyed mark in an ONNX
model's float32 weights.

The mark is checked against an independent decoder written here from the
specification (hashlib's BLAKE2b, the `cryptography` package's ChaCha20,
numpy), not against Kiln's own output: the per-bit z-scores Kiln prints must
equal the reference's. On the bundled digits model (models/digits,
tools/make_digits_model.py) the accuracy on sklearn's digits, computed with a
numpy forward pass, changes by at most 0.1% relative; a wrong key or an
unmarked model read at chance; the mark survives a bf16 round trip and an
int8 per-channel quantize-dequantize of the weights done in numpy and a re-save
with typed float_data instead of raw_data; and bad
inputs give one clear error line.
"""

import hashlib
import json
import math
import subprocess

import numpy as np
import pytest

import test_serve
from cpu_features import AVX512, VNNI
from test_serve import KILN, REPO

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper, TensorProto  # noqa: E402

pytestmark = test_serve.pytestmark

DIGITS = REPO / "models" / "digits" / "1" / "model.onnx"
STEP = 0.01


def run(*args):
    return subprocess.run([KILN, "watermark", *map(str, args)], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def keys(tmp_path):
    a, b = tmp_path / "a.key", tmp_path / "b.key"
    a.write_bytes(bytes(range(32)))
    b.write_bytes(bytes(range(1, 33)))
    return a, b


def embed(src, dst, key, label="acme", bits=32):
    r = run("embed", src, "--key", key, "--out", dst, "--label", label, "--bits", bits)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def verify(model, key, label="acme", bits=32):
    r = run("verify", model, "--key", key, "--label", label, "--bits", bits)
    assert r.returncode in (0, 1), r.stderr
    rep = json.loads(r.stdout)
    assert rep["present"] == (r.returncode == 0)
    return rep


def reference_read(path, key_file, label, bits, step=STEP):
    """The decoder of docs/WATERMARK.md, from scratch."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
    wkey = hashlib.blake2b(key_file.read_bytes(), digest_size=32, key=b"kiln-watermark-v1").digest()
    msg = int.from_bytes(hashlib.blake2b(label.encode(), digest_size=8, key=wkey).digest(), "little")
    msg &= (1 << bits) - 1
    model = onnx.load(str(path))
    tensors = [numpy_helper.to_array(t).astype(np.float64).ravel() for t in model.graph.initializer
               if t.data_type == TensorProto.FLOAT and np.prod(t.dims) >= 256]
    total = sum(t.size for t in tensors)
    enc = Cipher(algorithms.ChaCha20(wkey, bytes(16)), mode=None).encryptor()
    words = np.frombuffer(enc.update(bytes(4 * total)), "<u4")
    bit_of = (words >> 1) % bits
    dither = (words >> 8) / 16777216.0
    score, count = np.zeros(bits), np.zeros(bits)
    i = 0
    for w in tensors:
        n = w.size
        mx = np.abs(w).max()
        delta = step * 2.0 ** (math.frexp(mx)[1] - 1)
        keep = (w != 0)
        keep[np.argmax(np.abs(w))] = False
        ph = w / delta - dither[i:i + n]
        c = np.cos(2 * np.pi * (ph - np.floor(ph)))
        np.add.at(score, bit_of[i:i + n][keep], c[keep])
        np.add.at(count, bit_of[i:i + n][keep], 1)
        i += n
    z = -score / np.sqrt(count / 2)
    return msg, z


def digits_accuracy(path):
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in onnx.load(str(path)).graph.initializer}
    h = np.maximum(x @ w["fc1.weight"].T + w["fc1.bias"], 0)
    return float(((h @ w["fc2.weight"].T + w["fc2.bias"]).argmax(1) == y).mean())


def rewrite_weights(src, dst, fn):
    m = onnx.load(str(src))
    for t in m.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype == np.float32 and a.ndim == 2:
            t.CopyFrom(numpy_helper.from_array(fn(a).astype(np.float32), t.name))
    onnx.save(m, str(dst))


def bf16_round_trip(a):
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000  # round to nearest even
    return u.astype(np.uint32).view(np.float32)


def int8_per_channel(a):
    scale = np.abs(a).max(axis=1, keepdims=True) / 127.0
    scale[scale == 0] = 1
    return np.clip(np.round(a / scale), -127, 127) * scale


def test_embed_verify_matches_reference(tmp_path, keys):
    pytest.importorskip("cryptography")
    out = tmp_path / "marked.onnx"
    rep = embed(DIGITS, out, keys[0])
    assert rep["matched"] == 32 and rep["tensors"] == 2 and rep["elements"] == 64 * 32 + 32 * 10
    assert rep["max_rel_change"] <= STEP / 2 + 1e-6
    got = verify(out, keys[0])
    msg, z = reference_read(out, keys[0], "acme", 32)
    assert int(got["message"], 16) == msg
    np.testing.assert_allclose(got["bit_z"], z, atol=2e-3)
    assert got["present"] and got["matched"] == 32 and got["p_value"] < 1e-20
    assert all((zk > 0) == bool((msg >> k) & 1) for k, zk in enumerate(z))
    # the bytes outside the weights are untouched, and the weights moved at
    # most step/2 of their tensor's power-of-two scale
    a, b = onnx.load(str(DIGITS)), onnx.load(str(out))
    assert a.graph.node == b.graph.node and a.graph.input == b.graph.input
    for ta, tb in zip(a.graph.initializer, b.graph.initializer):
        wa, wb = numpy_helper.to_array(ta), numpy_helper.to_array(tb)
        scale = 2.0 ** (math.frexp(np.abs(wa).max())[1] - 1)
        assert np.abs(wb.astype(np.float64) - wa).max() <= STEP / 2 * scale * 1.0001
        if wa.ndim == 1:
            assert np.array_equal(wa, wb)  # biases are too small to carry the mark


def test_wrong_key_label_and_unmarked_read_at_chance(tmp_path, keys):
    out = tmp_path / "marked.onnx"
    embed(DIGITS, out, keys[0])
    for model, key, label in [(out, keys[1], "acme"), (DIGITS, keys[0], "acme")]:
        rep = verify(model, key, label)
        assert not rep["present"] and rep["p_value"] > 1e-3 and abs(rep["z"]) < 4
        assert 6 <= rep["matched"] <= 26  # chance: Binomial(32, 1/2)
    other = verify(out, keys[0], "someone else")
    assert not other["present"]


def test_digits_accuracy_within_a_tenth_of_a_percent(tmp_path, keys):
    pytest.importorskip("sklearn")
    base = digits_accuracy(DIGITS)
    for i in range(6):  # several keys: the weights each key moves differ
        key = tmp_path / f"k{i}.key"
        key.write_bytes(bytes([i] * 8 + list(range(24))))
        out = tmp_path / f"m{i}.onnx"
        embed(DIGITS, out, key, bits=64)
        acc = digits_accuracy(out)
        assert abs(acc - base) / base <= 0.001, (base, acc)


@pytest.mark.parametrize("name,fn", [("bf16", bf16_round_trip), ("int8", int8_per_channel)])
def test_mark_survives_compression(tmp_path, keys, name, fn):
    out, squeezed = tmp_path / "marked.onnx", tmp_path / f"{name}.onnx"
    embed(DIGITS, out, keys[0])
    rewrite_weights(out, squeezed, fn)
    rep = verify(squeezed, keys[0])
    print(f"{name}: {rep['matched']}/32 bits, z={rep['z']:.1f}")
    assert rep["present"] and rep["matched"] == 32 and rep["z"] > 15
    assert not verify(squeezed, keys[1])["present"]


def test_bad_inputs(tmp_path, keys):
    short = tmp_path / "short.key"
    short.write_bytes(b"abc")
    r = run("verify", DIGITS, "--key", short)
    assert r.returncode == 1 and "at least 16" in r.stderr
    r = run("verify", DIGITS, "--key", tmp_path / "missing.key")
    assert r.returncode == 1 and "missing.key" in r.stderr
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x3a\xff\xff\xff\xff\x0fnot onnx")
    r = run("verify", junk, "--key", keys[0])
    assert r.returncode == 1 and "not an ONNX model" in r.stderr
    tiny = tmp_path / "tiny.onnx"
    g = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                          [numpy_helper.from_array(np.ones(4, np.float32), "b")])
    onnx.save(helper.make_model(g), str(tiny))
    r = run("embed", tiny, "--key", keys[0], "--out", tmp_path / "t.onnx")
    assert r.returncode == 1 and "0 float32 weights" in r.stderr
    assert not (tmp_path / "t.onnx").exists()
    assert run("embed", DIGITS, "--key", keys[0]).returncode == 2  # no --out
    assert run("verify", DIGITS, "--key", keys[0], "--bits", "7").returncode == 2
    assert run("verify", DIGITS, "--key", keys[0], "--step", "0").returncode == 2
    assert run("frobnicate", DIGITS).returncode == 2


def test_mark_survives_reserialization_as_float_data(tmp_path, keys):
    """The same weights stored in typed float_data instead of raw_data."""
    out, typed = tmp_path / "marked.onnx", tmp_path / "typed.onnx"
    embed(DIGITS, out, keys[0])
    m = onnx.load(str(out))
    for t in m.graph.initializer:
        a = numpy_helper.to_array(t)
        t.CopyFrom(helper.make_tensor(t.name, TensorProto.FLOAT, a.shape, a.ravel().tolist()))
    onnx.save(m, str(typed))
    assert not onnx.load(str(typed)).graph.initializer[0].raw_data
    rep, ref = verify(typed, keys[0]), verify(out, keys[0])
    assert rep["present"] and rep["matched"] == 32
    np.testing.assert_allclose(rep["bit_z"], ref["bit_z"], atol=1e-4)


# ------------------------------------------------ .kiln files and SavedModels (verify only)


def compile_kiln(src, dst, precision):
    r = subprocess.run([KILN, "compile", str(src), "-o", str(dst), "--precision", precision,
                        "--runs", "1", "--batch-sizes", "1"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("precision", [
    "fp32",
    pytest.param("bf16", marks=pytest.mark.skipif(
        not AVX512, reason="no AVX-512 on this CPU: bf16 nodes run fp32")),
    pytest.param("int8", marks=pytest.mark.skipif(
        not VNNI, reason="no VNNI/AMX on this CPU: int8 nodes run fp32"))])
def test_mark_survives_compile_to_kiln(tmp_path, keys, precision):
    """A mark embedded in the ONNX file is read from the .kiln `kiln compile`
    writes. fp32 keeps the weights bit for bit; bf16 stores the MatMul/Gemm
    weights as bfloat16 (round to nearest even), so the .kiln must read as the
    reference decoder reads the numpy bf16 round trip; int8 .kiln files (format
    version 2) store the Gemm weights as s8 with one scale per output channel, so
    the .kiln must read as the numpy per-channel int8 round trip does."""
    out, art = tmp_path / "marked.onnx", tmp_path / f"marked_{precision}.kiln"
    embed(DIGITS, out, keys[0])
    compile_kiln(out, art, precision)
    rep = verify(art, keys[0])
    print(f"{precision} .kiln: {rep['matched']}/32 bits, z={rep['z']:.1f}")
    assert rep["present"] and rep["matched"] == 32 and rep["tensors"] == 2
    if precision == "bf16":
        pytest.importorskip("cryptography")
        ref = tmp_path / "bf16.onnx"
        rewrite_weights(out, ref, bf16_round_trip)
        _, z = reference_read(ref, keys[0], "acme", 32)
        assert rep["z"] < verify(out, keys[0])["z"]  # rounding cost some of the margin
    elif precision == "int8":
        ref = tmp_path / "int8.onnx"
        rewrite_weights(out, ref, int8_per_channel)  # digits' Gemms: transB=1, rows are channels
        z = verify(ref, keys[0])["bit_z"]
        assert rep["z"] < verify(out, keys[0])["z"]
    else:
        z = verify(out, keys[0])["bit_z"]
    np.testing.assert_allclose(rep["bit_z"], z, atol=2e-3)
    assert not verify(art, keys[1])["present"]
    # an unmarked model compiled the same way reads at chance
    plain = tmp_path / f"plain_{precision}.kiln"
    compile_kiln(DIGITS, plain, precision)
    assert not verify(plain, keys[0])["present"]
    # embed writes ONNX only
    r = run("embed", art, "--key", keys[0], "--out", tmp_path / "x.kiln")
    assert r.returncode == 1 and "ONNX files only" in r.stderr


def frozen_savedmodel(src_onnx, folder):
    """A SavedModel (TensorFlow's schema, built field by field as
    tools/make_savedmodel_corpus.py does) computing the digits MLP with the
    ONNX file's weights as Const tensors, as a converter to a frozen
    TensorFlow graph can write them: each weight as the ONNX file stores it, applied as
    (W @ x^T)^T (a MatMul with transpose_b would make Kiln's importer fold a transposed copy,
    whose elements are in another order: docs/WATERMARK.md)."""
    import sys
    sys.path.insert(0, str(REPO / "tools"))
    import make_savedmodel_corpus as sm
    w = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in onnx.load(str(src_onnx)).graph.initializer}

    def const(name, a):
        return sm.node(name, "Const", dtype=sm.a_type(sm.DT_FLOAT),
                       value=sm.a_tensor(sm.tensor(sm.DT_FLOAT, list(a.shape), content=a.tobytes())))
    f32 = sm.a_type(sm.DT_FLOAT)
    perm = sm.node("perm", "Const", dtype=sm.a_type(sm.DT_INT32),
                   value=sm.a_tensor(sm.tensor(sm.DT_INT32, [2], ints=[1, 0])))

    def t(name, src):
        return sm.node(name, "Transpose", [src, "perm"], T=f32, Tperm=sm.a_type(sm.DT_INT32))
    # (W @ x^T)^T keeps each weight as the ONNX file stores it ([out, in])
    nodes = [sm.placeholder("x", dims=[-1, 64]), perm,
             const("w1", w["fc1.weight"]), const("b1", w["fc1.bias"]),
             const("w2", w["fc2.weight"]), const("b2", w["fc2.bias"]),
             t("xt", "x"), sm.node("mm1", "MatMul", ["w1", "xt"], T=f32), t("h0", "mm1"),
             sm.node("h1", "BiasAdd", ["h0", "b1"], T=f32), sm.node("r1", "Relu", ["h1"], T=f32),
             t("rt", "r1"), sm.node("mm2", "MatMul", ["w2", "rt"], T=f32), t("y0", "mm2"),
             sm.node("y", "BiasAdd", ["y0", "b2"], T=f32)]
    sig = sm.signature({"x": sm.tensor_info("x:0", dims=[-1, 64])}, {"y": sm.tensor_info("y:0")})
    folder.mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(sm.saved_model(nodes, {"serving_default": sig}))
    return w


def test_verify_reads_a_savedmodel(tmp_path, keys):
    """The marked ONNX's weights in a SavedModel read exactly as in the ONNX
    file; the SavedModel itself computes the digits model (checked with numpy)."""
    out = tmp_path / "marked.onnx"
    embed(DIGITS, out, keys[0])
    sm_dir = tmp_path / "sm" / "1"
    w = frozen_savedmodel(out, sm_dir)
    x = np.linspace(0, 16, 3 * 64, dtype=np.float32).reshape(3, 64)
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([KILN, "predict", str(sm_dir), "--input", f"x={tmp_path / 'x.npy'}",
                        "--output-dir", str(tmp_path / "y")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    want = np.maximum(x @ w["fc1.weight"].T + w["fc1.bias"], 0) @ w["fc2.weight"].T + w["fc2.bias"]
    np.testing.assert_allclose(np.load(tmp_path / "y" / "y.npy"), want, rtol=1e-4, atol=1e-4)
    rep = verify(sm_dir, keys[0])
    assert rep["present"] and rep["matched"] == 32 and rep["tensors"] == 2
    np.testing.assert_allclose(rep["bit_z"], verify(out, keys[0])["bit_z"], atol=1e-6)
    assert not verify(sm_dir, keys[1])["present"]
    plain = tmp_path / "plain" / "1"
    frozen_savedmodel(DIGITS, plain)
    assert not verify(plain, keys[0])["present"]
    r = run("embed", sm_dir, "--key", keys[0], "--out", tmp_path / "x.onnx")
    assert r.returncode == 1 and "ONNX files only" in r.stderr
