"""The transpose_matmul pass (src/opt/transpose_matmul.c) and KilnMatMulT's kernel
(src/kernels/dnnl/matmul_t.c): products that read Transposes read the
untransposed values through strides, so the transposed copies are never written.

The model is an attention the attention_fusion pass does not recognize (Relu
where Softmax would be): Q, K and V projected, reshaped to [B,S,H,D] and
transposed ([0,2,1,3], K [0,2,3,1]) before Q K^T / sqrt(D) and P V. Kiln's
default path must rewrite the two products (the log names them), run no
Transpose before them, and match numpy and the reference path; with
--disable-optimizer the Transposes run as written.

The binary is $KILN_BIN, or build/kiln in this checkout; the tests skip with a
message when it is missing or onnx is not installed.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
KILN = os.environ.get("KILN_BIN") or str(REPO / "build" / "kiln")

pytestmark = pytest.mark.skipif(
    not (os.path.isfile(KILN) and os.access(KILN, os.X_OK)),
    reason=f"kiln binary not found at {KILN} (build it, or set KILN_BIN)",
)

B, S, H, D = 2, 24, 4, 16
E = H * D


def kiln(*args):
    r = subprocess.run([KILN, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def unfused_attention(tmp_path, rng):
    w = {n: (rng.standard_normal((E, E)) / np.sqrt(E)).astype(np.float32) for n in "qkv"}
    inits = [numpy_helper.from_array(w[n], f"w{n}") for n in "qkv"]
    inits += [numpy_helper.from_array(np.array([B, S, H, D], dtype=np.int64), "split"),
              numpy_helper.from_array(np.array([B, S, E], dtype=np.int64), "merge"),
              numpy_helper.from_array(np.array(np.sqrt(D), dtype=np.float32), "scale")]
    nodes = []
    for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}p"]),
                  helper.make_node("Reshape", [f"{n}p", "split"], [f"{n}4"]),
                  helper.make_node("Transpose", [f"{n}4"], [f"{n}t"], perm=perm)]
    nodes += [helper.make_node("MatMul", ["qt", "kt"], ["s"]),
              helper.make_node("Div", ["s", "scale"], ["ss"]),
              helper.make_node("Relu", ["ss"], ["p"]),
              helper.make_node("MatMul", ["p", "vt"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merge"], ["y"])]
    g = helper.make_graph(nodes, "unfused",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, E])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, E])],
                          inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]), str(path))
    return path, w


def numpy_attention(x, w):
    q, k, v = (x.astype(np.float64) @ w[n] for n in "qkv")
    q, k, v = (t.reshape(B, S, H, D) for t in (q, k, v))
    s = q.transpose(0, 2, 1, 3) @ k.transpose(0, 2, 3, 1) / np.sqrt(D)
    o = np.maximum(s, 0.0) @ v.transpose(0, 2, 1, 3)
    return o.transpose(0, 2, 1, 3).reshape(B, S, E)


def test_products_read_the_transposes_inputs(tmp_path):
    rng = np.random.default_rng(5)
    path, w = unfused_attention(tmp_path, rng)
    x = rng.standard_normal((B, S, E)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    log = kiln("inspect", path, "--optimized").stdout
    line = next((ln for ln in log.splitlines() if "transpose_matmul" in ln), "")
    assert "Transpose+Transpose+MatMul x1" in line and "Transpose+MatMul x1" in line, log
    prof = kiln("bench", path, "--iterations", "3", "--profile").stderr
    assert "dnnl_matmul_strided" in prof, prof
    # one Transpose left: the output's, which no product reads
    rows = [ln.split() for ln in prof.splitlines() if ln.startswith("Transpose ")]
    assert rows and all(int(r[2]) == 1 for r in rows), prof
    want = numpy_attention(x, w)
    for args in ([], ["--reference"], ["--disable-optimizer"]):
        out = tmp_path / ("out" + "".join(args).replace("-", "_"))
        kiln("predict", path, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", out, *args)
        got = np.load(out / "y.npy")
        err = float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))
        assert err <= 1e-5, (args, err)
