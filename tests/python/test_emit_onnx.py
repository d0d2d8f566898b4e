"""test_emit_onnx.py - `kiln compile --emit-onnx`: Kiln's static int8 model written as ONNX QDQ
(src/api/emit_onnx.c, kiln_session_write_onnx; docs/COMPRESSION.md, "--emit-onnx").

Two models: the small CNN trained on scikit-learn's digits by
tools/make_compression_models.py (Conv, Relu, Flatten, Gemm), and a random MLP made
here with torch on a 3-D input, which torch exports as MatMul + Add (the transformer
form). Each is compiled with `--precision int8 --calibration DATA --emit-onnx`, then:

- onnx.checker.check_model (full_check) accepts the emitted file; it imports opset 13
  and holds no float weight any more (each Conv/Gemm/MatMul weight is an int8
  initializer read through a per-channel DequantizeLinear);
- its quantization is the documented one, recomputed independently: each weight's
  scale is max|w| / 127 per output channel of the source model's float weight and the
  int8 values round(w / scale); each activation's scale and zero point come from its
  min and max over the calibration data, computed by a numpy evaluation of the source
  model ((hi - lo) / 255, zp = round(-lo / scale), hi >= 0 >= lo);
- a numpy evaluation of the emitted graph's QDQ semantics (DequantizeLinear(
  QuantizeLinear(x)) with the emitted scales, float64 arithmetic) agrees with Kiln's
  int8 .kiln within one quantization step of the output;
- Kiln running the emitted ONNX file gives bit-identical outputs to the .kiln: the
  file holds the same QDQ graph the calibration built, and Kiln's qdq_fusion pass turns
  it into the same int8 kernels;
- ONNX Runtime (onnxruntime-node through bench/ort_bench.js --check, when
  bench/node_modules has it) runs the emitted file and agrees with Kiln within one
  quantization step (its requantization rounds in its own order);
- a dynamic int8 compile with --emit-onnx is refused with a message saying why.
"""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cpu_features import VNNI

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ORT_BENCH = REPO / "bench" / "ort_bench.js"
ORT_MODULE = REPO / "bench" / "node_modules" / "onnxruntime-node"


@pytest.fixture(scope="module")
def kiln_bin():
    path = os.path.abspath(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln")))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kiln executable not found at {path}: build it or set KILN_BIN")
    return path


def run(args, timeout=300):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout)


# ---- numpy evaluation of the ONNX ops these models use ----

def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def conv2d(x, w, b, a):
    assert a.get("group", 1) == 1 and all(d == 1 for d in a.get("dilations", [1, 1]))
    sh, sw = a.get("strides", [1, 1])
    pt, pl, pb, pr = a.get("pads", [0, 0, 0, 0])
    x = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    kh, kw = w.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
    y = np.einsum("nchwij,ocij->nohw", win, w)
    return y + (b.reshape(1, -1, 1, 1) if b is not None else 0)


def quantize(x, s, z, dt):
    lo, hi = (0, 255) if dt == np.uint8 else (-128, 127)
    return np.clip(np.rint(x / s) + z.astype(np.float64), lo, hi).astype(dt)


def per_axis(p, axis, rank):
    if p.ndim == 0:
        return p
    shape = [1] * rank
    shape[axis] = -1
    return p.reshape(shape)


def evaluate(model, feeds):
    """Every value of the model's graph, in float64 (QDQ ops by their ONNX definition)."""
    env = {k: v for k, v in feeds.items()}
    for t in model.graph.initializer:
        env[t.name] = numpy_helper.to_array(t)
    for n in model.graph.node:
        a = attrs(n)
        x = [env[i] if i else None for i in n.input]
        f = [v.astype(np.float64) if v is not None and v.dtype == np.float32 else v for v in x]
        op = n.op_type
        if op == "Conv":
            y = conv2d(f[0], f[1], f[2] if len(f) > 2 else None, a)
        elif op == "Relu":
            y = np.maximum(f[0], 0)
        elif op == "Flatten":
            ax = a.get("axis", 1)
            y = f[0].reshape(int(np.prod(f[0].shape[:ax])), -1)
        elif op == "Gemm":
            wb = f[1].T if a.get("transB", 0) else f[1]
            y = a.get("alpha", 1.0) * (f[0] @ wb)
            if len(f) > 2:
                y = y + a.get("beta", 1.0) * f[2]
        elif op == "MatMul":
            y = f[0] @ f[1]
        elif op == "Add":
            y = f[0] + f[1]
        elif op == "QuantizeLinear":
            s, z = x[1].astype(np.float64), x[2]
            ax = a.get("axis", 1)
            y = quantize(f[0], per_axis(s, ax, f[0].ndim), per_axis(z, ax, f[0].ndim), z.dtype.type)
        elif op == "DequantizeLinear":
            s, z = x[1].astype(np.float64), x[2]
            ax = a.get("axis", 1)
            y = (x[0].astype(np.float64) - per_axis(z, ax, x[0].ndim).astype(np.float64)) \
                * per_axis(s, ax, x[0].ndim)
        else:
            raise AssertionError(f"the numpy evaluator lacks {op}")
        env[n.output[0]] = y
    return env


# ---- the models ----

@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    out = tmp_path_factory.mktemp("emit_cnn")
    r = run(["/usr/bin/python3", REPO / "tools" / "make_compression_models.py", "--out", out],
            timeout=600)
    assert r.returncode == 0, r.stderr
    (out / "cal").mkdir()
    np.save(out / "cal" / "image.npy", np.load(out / "digits_cal_x.npy"))
    x = np.load(out / "digits_test_x.npy")[:128]
    return out / "digits_cnn.onnx", "image", out / "cal", x


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    torch = pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("emit_mlp")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.ReLU(), torch.nn.Linear(48, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 6)).eval()
    path = out / "mlp.onnx"
    torch.onnx.export(model, torch.zeros(1, 4, 24), str(path), input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
                      opset_version=13)
    rng = np.random.default_rng(0)
    (out / "cal").mkdir()
    np.save(out / "cal" / "x.npy", rng.normal(size=(64, 4, 24)).astype(np.float32))
    x = rng.normal(size=(32, 4, 24)).astype(np.float32)
    return path, "x", out / "cal", x


def compile_emit(kiln_bin, model, cal, tmp_path):
    kiln, qdq = tmp_path / "int8.kiln", tmp_path / "int8_qdq.onnx"
    r = run([kiln_bin, "compile", model, "-o", kiln, "--precision", "int8", "--calibration", cal,
             "--max-drop", "100%", "--runs", "2", "--batch-sizes", "1", "--emit-onnx", qdq])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"wrote {qdq}" in r.stdout
    return kiln, qdq


def predict(kiln_bin, model, name, x, tmp_path, tag):
    inp = tmp_path / f"{tag}_in.npy"
    np.save(inp, x)
    od = tmp_path / f"{tag}_out"
    r = run([kiln_bin, "predict", model, "--input", f"{name}={inp}", "--output-dir", od])
    assert r.returncode == 0, r.stderr
    files = sorted(od.glob("*.npy"))
    assert len(files) == 1
    return np.load(files[0])


def output_step(qdq_model):
    """The scale of the last activation DequantizeLinear before the graph output (one
    quantization step of the output; a bias Add after it, as torch exports MatMul + Add,
    shifts values without rescaling them)."""
    init = {t.name: numpy_helper.to_array(t) for t in qdq_model.graph.initializer}
    producer = {o: n for n in qdq_model.graph.node for o in n.output}
    n = producer[qdq_model.graph.output[0].name]
    while n.op_type != "DequantizeLinear":
        assert n.op_type in ("Add", "Relu"), n.op_type
        n = next(producer[i] for i in n.input if i in producer)
    return float(init[n.input[1]])


def check_quantization(src, qdq, name, cal_x):
    """The emitted scales, zero points and int8 weights against the documented formulas,
    recomputed from the source model and the calibration data."""
    init = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    src_init = {t.name: numpy_helper.to_array(t) for t in src.graph.initializer}
    producer = {o: n for n in qdq.graph.node for o in n.output}
    fp32 = evaluate(src, {name: cal_x})
    n_weights = n_acts = 0
    for n in qdq.graph.node:
        if n.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        # the weight: an int8 initializer through DequantizeLinear, per output channel
        dq = producer[n.input[1]]
        assert dq.op_type == "DequantizeLinear" and dq.input[0] in init
        q, s, z = (init[i] for i in dq.input)
        assert q.dtype == np.int8 and not z.any()
        assert n.name
        src_node = next(m for m in src.graph.node if m.name == n.name)  # nodes keep their names
        w = src_init[src_node.input[1]].astype(np.float64)
        axis = attrs(dq).get("axis", 1)
        assert axis == (0 if n.op_type == "Conv" or attrs(n).get("transB", 0) else 1)
        red = tuple(d for d in range(w.ndim) if d != axis)
        want_s = np.abs(w).max(axis=red) / 127
        np.testing.assert_allclose(s, want_s, rtol=1e-6)
        want_q = np.clip(np.rint(w / per_axis(s.astype(np.float64), axis, w.ndim)), -127, 127)
        assert np.abs(q.astype(np.int64) - want_q).max() <= 1  # float32 vs float64 division
        assert (q.astype(np.int64) == want_q).mean() > 0.999
        n_weights += 1
    for n in qdq.graph.node:
        if n.op_type != "QuantizeLinear":
            continue
        deq = [m for m in qdq.graph.node if m.op_type == "DequantizeLinear" and m.input[0] == n.output[0]]
        assert len(deq) == 1
        # the float value quantized: the Q's input (an original name) or the DQ's output
        v = n.input[0] if n.input[0] in fp32 else deq[0].output[0]
        x = fp32[v]
        lo, hi = min(0.0, float(x.min())), max(0.0, float(x.max()))
        s, z = init[n.input[1]], init[n.input[2]]
        assert z.dtype == np.uint8
        np.testing.assert_allclose(float(s), (hi - lo) / 255, rtol=1e-4)
        assert abs(int(z) - int(np.clip(np.rint(-lo / ((hi - lo) / 255)), 0, 255))) <= 1
        n_acts += 1
    return n_weights, n_acts


def ort_run(model, name, x, tmp_path):
    if shutil.which("node") is None or not ORT_MODULE.is_dir():
        pytest.skip("onnxruntime-node is not installed in bench/node_modules "
                    "(cd bench && npm ci --ignore-scripts)")
    ind, od = tmp_path / "ort_in", tmp_path / "ort_out"
    ind.mkdir()
    np.save(ind / f"{name}.npy", x)
    r = run(["node", ORT_BENCH, model, "--check", ind, "--out", od, "--threads", "1"])
    assert r.returncode == 0, r.stderr
    files = sorted(od.glob("*.npy"))
    assert len(files) == 1
    return np.load(files[0])


@pytest.mark.skipif(not VNNI, reason="no VNNI/AMX on this CPU: Kiln's int8 nodes run fp32, "
                    "so its outputs are not the QDQ model's")
@pytest.mark.parametrize("which", ["cnn", "mlp"])
def test_emitted_qdq_model(kiln_bin, cnn, mlp, which, tmp_path):
    src_path, name, cal, x = cnn if which == "cnn" else mlp
    kiln, qdq_path = compile_emit(kiln_bin, src_path, cal, tmp_path)
    qdq = onnx.load(str(qdq_path))
    onnx.checker.check_model(qdq, full_check=True)
    assert {o.domain or "": o.version for o in qdq.opset_import}[""] == 13
    assert not any(n.op_type == "Softmax" for n in qdq.graph.node)
    src = onnx.load(str(src_path))
    n_q = sum(n.op_type in ("Conv", "Gemm", "MatMul") for n in src.graph.node)
    float_weights = [t.name for t in qdq.graph.initializer
                     if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) >= 2]
    assert float_weights == [], float_weights
    # the weights take one byte per element (the file is smaller; not 4x: scales and biases)
    int8_bytes = sum(numpy_helper.to_array(t).nbytes for t in qdq.graph.initializer
                     if t.data_type == onnx.TensorProto.INT8 and len(t.dims) >= 2)
    src_elems = sum(numpy_helper.to_array(t).size for t in src.graph.initializer if len(t.dims) >= 2)
    assert int8_bytes == src_elems
    assert os.path.getsize(qdq_path) < os.path.getsize(src_path)

    n_w, n_a = check_quantization(src, qdq, name, np.load(cal / f"{name}.npy"))
    assert n_w == n_q and n_a >= n_q

    k8 = predict(kiln_bin, kiln, name, x, tmp_path, "kiln")
    kq = predict(kiln_bin, qdq_path, name, x, tmp_path, "qdq")
    np.testing.assert_array_equal(kq, k8)  # the same QDQ graph, the same int8 kernels

    step = output_step(qdq)
    ref = evaluate(qdq, {name: x})[qdq.graph.output[0].name]
    d = np.abs(ref - k8) / step
    assert d.max() <= 1.0 + 1e-3, d.max()
    assert (d < 1e-3).mean() > 0.95  # mostly the very same quantized value

    fp32 = predict(kiln_bin, src_path, name, x, tmp_path, "fp32")
    assert np.abs(k8 - fp32).max() > 0  # really quantized
    if which == "cnn":
        assert (k8.argmax(-1) == fp32.argmax(-1)).mean() >= 0.97

    ort = ort_run(qdq_path, name, x, tmp_path)
    d = np.abs(ort - k8) / step
    assert d.max() <= 1.0 + 1e-3, d.max()


def test_dynamic_int8_is_refused(kiln_bin, mlp, tmp_path):
    src_path, _, cal, _ = mlp
    r = run([kiln_bin, "compile", src_path, "-o", tmp_path / "m.kiln", "--precision", "int8",
             "--emit-onnx", tmp_path / "m.onnx"])
    assert r.returncode != 0
    assert "--emit-onnx" in r.stderr and "dynamic int8" in r.stderr and "--calibration" in r.stderr
    assert not (tmp_path / "m.onnx").exists()
