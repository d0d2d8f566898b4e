"""Fusions where a value's unknown dims have no name.

A batch dim computed inside the model (vit_small's class token is concatenated
to the patches, so every later value's batch dim is unknown and unnamed) made
two types with the same unknown dim look different, and an activation stayed
apart from its MatMul (vit_small's Gelu: 17% of its batch-8 time on a separate
pass). An activation keeps its input's shape whatever the types say, so
MatMul + bias + Gelu (the erf form) and Conv + Relu fuse. The fused model must
agree with numpy.

The binary is $KILN_BIN, or build/kiln in this checkout; the tests skip with a
message when it is missing.
"""

import math
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


def kiln(*args):
    r = subprocess.run([KILN, *map(str, args)], capture_output=True, text=True,
                       errors="replace", timeout=120)
    assert r.returncode == 0, r.stderr
    return r


def vi(name, dims):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def erf(x):
    return np.vectorize(math.erf)(x)


def test_matmul_bias_gelu_fuses_with_unnamed_dims(tmp_path):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((24, 40)).astype(np.float32) * 0.2
    b = rng.standard_normal(40).astype(np.float32) * 0.1
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array(math.sqrt(2), np.float32), "s2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Add", ["b", "mm"], ["a"]),
             helper.make_node("Div", ["a", "s2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["a", "e1"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    g = helper.make_graph(nodes, "g", [vi("x", [None, 5, 24])], [vi("y", [None, 5, 40])], inits)
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]), str(path))

    log = kiln("inspect", path, "--optimized").stdout
    assert "MatMul+Bias+Gelu x1" in log, log

    x = rng.standard_normal((3, 5, 24)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    kiln("predict", path, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "out")
    got = np.load(tmp_path / "out" / "y.npy")
    a = x.astype(np.float64) @ w + b
    want = 0.5 * a * (1 + erf(a / math.sqrt(2)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_conv_relu_fuses_with_unnamed_dims(tmp_path):
    rng = np.random.default_rng(6)
    k = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "g", [vi("x", [None, 3, 6, 6])], [vi("y", [None, 8, 6, 6])],
                          [numpy_helper.from_array(k, "k")])
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]), str(path))
    log = kiln("inspect", path, "--optimized").stdout
    assert "Conv+Relu x1" in log, log
