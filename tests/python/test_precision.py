"""test_precision.py - `--precision bf16|int8` (kiln_session_options.precision) end to end.

The bundled digits MLP (models/digits/1/model.onnx, made by tools/make_digits_model.py:
Gemm -> Relu -> Gemm -> Softmax) runs with `kiln predict --precision P` on the
held-out quarter of scikit-learn's digits (the same fixed-seed split the
model's script trains on, 450 images). Checked:

- each precision's accuracy is within 1% relative of fp32's, and its top-1
  agrees with fp32 on at least 99% of the images;
- int8 matches an independent numpy emulation of Kiln's dynamic quantization
  (docs/COMPRESSION.md: activations u8 with a per-run scale and zero point,
  weights s8 per output channel, int32 accumulation), to float rounding;
- bf16 matches numpy on bfloat16-rounded inputs and weights (fp32 accumulation);
- `kiln bench --precision int8 --profile` names the int8 kernels;
- a bad --precision is a usage error naming the value.

A small CNN trained on the same digits by tools/make_compression_models.py
(two convolutions, two dense layers; fixed seeds, trained here in seconds)
keeps its held-out accuracy within 1% relative of fp32 in bf16 and int8
(convolutions and dense layers both in the lower precision), and its
profiles name the bf16 and int8 convolution and matmul kernels.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "digits" / "1" / "model.onnx"


def cpu_has_vnni():
    """int8 kernels run only on CPUs with VNNI or AMX (elsewhere int8 nodes stay fp32)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return True
    return any(flag in text for flag in (" avx512_vnni", " avx_vnni", " amx_int8"))


VNNI = cpu_has_vnni()


def cpu_has_avx512():
    """oneDNN 2.6 runs bf16 only on AVX-512 CPUs (elsewhere bf16 nodes stay fp32)."""
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512bw" in f.read()
    except OSError:
        return True


AVX512 = cpu_has_avx512()


@pytest.fixture(scope="module")
def kiln_bin():
    path = os.path.abspath(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln")))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kiln executable not found at {path}: build it or set KILN_BIN")
    return path


@pytest.fixture(scope="module")
def held_out():
    """(x_test float32 [450, 64] raw pixels, y_test int64), as tools/make_digits_model.py splits."""
    sk = pytest.importorskip("sklearn.datasets")
    from sklearn.model_selection import train_test_split
    d = sk.load_digits()
    x = d.data.astype(np.float32)
    y = d.target.astype(np.int64)
    _, x_test, _, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    return np.ascontiguousarray(x_test, dtype=np.float32), y_test


def weights():
    import onnx
    from onnx import numpy_helper
    m = onnx.load(str(MODEL))
    init = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in m.graph.initializer}
    gemms = [n for n in m.graph.node if n.op_type == "Gemm"]
    assert [n.op_type for n in m.graph.node] == ["Gemm", "Relu", "Gemm", "Softmax"]
    for n in gemms:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert attrs.get("transB") == 1 and attrs.get("alpha", 1.0) == 1.0
    return [(init[n.input[1]], init[n.input[2]]) for n in gemms]


def predict(kiln_bin, x, precision, tmp_path):
    out = tmp_path / f"out_{precision}"
    inp = tmp_path / "pixels.npy"
    np.save(inp, x)
    r = subprocess.run([kiln_bin, "predict", str(MODEL), "--input", f"pixels={inp}",
                        "--output-dir", str(out), "--precision", precision],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return np.load(out / "probabilities.npy")


def softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def quant_gemm(a, w, b):
    """Kiln's dynamic int8 Gemm (w is [N, K], transB), computed independently in numpy."""
    a = a.astype(np.float32)
    lo = np.float32(min(0.0, float(a.min())))
    hi = np.float32(max(0.0, float(a.max())))
    sa = np.float32((hi - lo) / np.float32(255.0))
    if not sa > 0:
        sa = np.float32(1.0)
    zp = int(np.clip(np.rint(-lo / sa), 0, 255))
    qa = np.clip(np.rint(a * (np.float32(1.0) / sa)) + zp, 0, 255).astype(np.int64) - zp
    sw = (np.abs(w).max(axis=1) / np.float32(127.0)).astype(np.float32)
    sw[sw == 0] = 1.0
    qw = np.clip(np.rint(w / sw[:, None]), -127, 127).astype(np.int64)
    acc = qa @ qw.T
    return ((acc.astype(np.float32) * sw[None, :]) * sa).astype(np.float32) + b


def bf16(x):
    """Round float32 to bfloat16 (nearest even), back to float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def test_precisions_keep_accuracy(kiln_bin, held_out, tmp_path):
    x, y = held_out
    probs = {p: predict(kiln_bin, x, p, tmp_path) for p in ("fp32", "bf16", "int8")}
    top = {p: probs[p].argmax(axis=1) for p in probs}
    acc = {p: float((top[p] == y).mean()) for p in probs}
    assert acc["fp32"] > 0.9, acc
    for p in ("bf16", "int8"):
        assert acc[p] >= acc["fp32"] * 0.99, f"{p} accuracy {acc[p]:.4f} vs fp32 {acc['fp32']:.4f}"
        agree = float((top[p] == top["fp32"]).mean())
        assert agree >= 0.99, f"{p} top-1 agrees with fp32 on {agree:.4f}"
        assert np.abs(probs[p] - probs["fp32"]).max() < 0.1
    # int8 against the numpy emulation
    (w1, b1), (w2, b2) = weights()
    h = np.maximum(quant_gemm(x, w1, b1), 0)
    want = softmax(quant_gemm(h, w2, b2).astype(np.float64))
    if VNNI:
        err = np.abs(probs["int8"] - want).max()
        assert err < 1e-4, f"int8 off the numpy emulation by {err}"
        # and it is not simply fp32: the quantized path differs from fp32 somewhere
        assert np.abs(probs["int8"] - probs["fp32"]).max() > 1e-7
    else:
        np.testing.assert_array_equal(probs["int8"], probs["fp32"])  # stayed fp32
    # bf16 against numpy on rounded operands
    if not AVX512:
        np.testing.assert_array_equal(probs["bf16"], probs["fp32"])  # stayed fp32
        return
    h = np.maximum(bf16(x) @ bf16(w1).T + b1, 0)
    want = softmax((bf16(h) @ bf16(w2).T + b2).astype(np.float64))
    err = np.abs(probs["bf16"] - want).max()
    assert err < 1e-4, f"bf16 off the numpy emulation by {err}"


@pytest.mark.skipif(not VNNI, reason="no VNNI/AMX on this CPU: int8 nodes stay fp32")
def test_bench_profile_names_int8_kernels(kiln_bin):
    r = subprocess.run([kiln_bin, "bench", str(MODEL), "--batch", "4", "--iterations", "3",
                        "--warmup", "1", "--threads", "1", "--precision", "int8", "--profile"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "_int8" in r.stdout + r.stderr, r.stdout + r.stderr


def test_bad_precision_is_a_usage_error(kiln_bin, tmp_path):
    r = subprocess.run([kiln_bin, "predict", str(MODEL), "--input", "pixels=x.npy",
                        "--output-dir", str(tmp_path), "--precision", "fp8"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "'fp8'" in r.stderr


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    out = tmp_path_factory.mktemp("compression_models")
    r = subprocess.run(["/usr/bin/python3", str(REPO / "tools" / "make_compression_models.py"),
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return out


def run_cnn(kiln_bin, cnn, precision, tmp_path):
    out = tmp_path / f"cnn_{precision}"
    r = subprocess.run([kiln_bin, "predict", str(cnn / "digits_cnn.onnx"), "--input",
                        f"image={cnn / 'digits_test_x.npy'}", "--output-dir", str(out),
                        "--precision", precision], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return np.load(out / "logits.npy")


def test_cnn_precisions_keep_accuracy(kiln_bin, cnn, tmp_path):
    y = np.load(cnn / "digits_test_y.npy")
    logits = {p: run_cnn(kiln_bin, cnn, p, tmp_path) for p in ("fp32", "bf16", "int8")}
    top = {p: logits[p].argmax(axis=1) for p in logits}
    acc = {p: float((top[p] == y).mean()) for p in logits}
    assert acc["fp32"] > 0.9, acc
    for p in ("bf16", "int8"):
        assert acc[p] >= acc["fp32"] * 0.99, f"{p} accuracy {acc[p]:.4f} vs fp32 {acc['fp32']:.4f}"
        agree = float((top[p] == top["fp32"]).mean())
        assert agree >= 0.98, f"{p} top-1 agrees with fp32 on {agree:.4f}"
        if (p == "bf16" and AVX512) or (p == "int8" and VNNI):
            assert np.abs(logits[p] - logits["fp32"]).max() > 0  # really another precision


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_cnn_profile_names_low_precision_kernels(kiln_bin, cnn, precision):
    if precision == "int8" and not VNNI:
        pytest.skip("no VNNI/AMX on this CPU: int8 nodes stay fp32")
    if precision == "bf16" and not AVX512:
        pytest.skip("no AVX-512 on this CPU: bf16 nodes stay fp32")
    r = subprocess.run([kiln_bin, "bench", str(cnn / "digits_cnn.onnx"), "--batch", "2",
                        "--iterations", "3", "--warmup", "1", "--threads", "1",
                        "--precision", precision, "--profile"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    text = r.stdout + r.stderr
    assert f"conv_{precision}" in text and f"matmul_{precision}" in text, text
