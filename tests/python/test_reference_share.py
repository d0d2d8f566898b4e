"""Tests for how Kiln reports reference code on a plan's hot path.

- `kiln bench --json` reports `reference_share`, the share of the timed runs'
  time spent on reference kernels (Kiln's own, or a oneDNN primitive running
  oneDNN's reference implementation), from the profile; `--profile` lists
  every such step under "reference-kernel steps".
- When a plan compiles, the implementation oneDNN chose for every primitive is
  checked (src/exec/plan.c): a reference or generic fallback (`ref:...`, a
  GEMM-based convolution) is named in the optimization log (`kiln inspect
  --optimized`) with its node and shapes. The test compares those lines with
  oneDNN's own account of the primitives it created (ONEDNN_VERBOSE=2).

Tiny onnx.helper models, --iterations 3: each test takes well under a second.
The binary is $KILN_BIN, or build/kiln in this checkout; the tests skip with a
message when it is missing.
"""

import json
import os
import re
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


def kiln(*args, env=None):
    r = subprocess.run([KILN, *map(str, args)], capture_output=True, text=True,
                       errors="replace", timeout=120, env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr
    return r


def save(tmp_path, name, nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    path = tmp_path / name
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]), str(path))
    return path


@pytest.fixture
def mixed_model(tmp_path):
    """Relu and Neg (fast kernels) around CumSum and Mod (reference kernels only)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 512])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 512])
    axis = numpy_helper.from_array(np.array(1, dtype=np.int64), "axis")
    three = numpy_helper.from_array(np.array([3.0], dtype=np.float32), "three")
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("CumSum", ["a", "axis"], ["b"], name="cumsum"),
             helper.make_node("Mod", ["b", "three"], ["c"], name="mod", fmod=1),
             helper.make_node("Neg", ["c"], ["y"], name="neg")]
    return save(tmp_path, "mixed.onnx", nodes, [x], [y], [axis, three])


def profile_sections(text):
    """{step: kernel} of the slowest-steps table and [(step, share)] of the reference list."""
    steps, refs, section = {}, [], None
    for line in text.splitlines():
        if line.startswith("slowest steps:"):
            section = "slow"
        elif line.startswith("reference-kernel steps:"):
            section = "ref"
            head = line
        elif section == "slow" and re.match(r"\s+\d+ ", line):
            f = line.split()
            steps[int(f[0])] = f[3]
        elif section == "ref" and re.match(r"\s+\d+ ", line):
            f = line.split()
            refs.append((int(f[0]), float(re.search(r"([\d.]+)%", line).group(1))))
    assert section == "ref", f"no reference-kernel section in:\n{text}"
    return steps, refs, head


def test_profile_lists_every_reference_step(mixed_model):
    r = kiln("bench", mixed_model, "--iterations", "3", "--json", "--profile")
    steps, refs, head = profile_sections(r.stderr)
    want = sorted(s for s, k in steps.items() if k == "reference")
    assert want, f"the model should have reference steps:\n{r.stderr}"
    assert sorted(s for s, _ in refs) == want
    n, pct = re.match(r"reference-kernel steps: (\d+), ([\d.]+)% of the time", head).groups()
    assert int(n) == len(want)
    share = json.loads(r.stdout)["reference_share"]
    assert 0 < share < 1
    # the JSON share is the profile's, and the listed steps' shares add up to it
    assert abs(100 * share - float(pct)) <= 0.01
    assert abs(sum(s for _, s in refs) - 100 * share) <= 0.1 * len(refs) + 0.01


def test_reference_share_is_one_on_reference_kernels(mixed_model):
    for env, args in (({"KILN_FAST": "0"}, ()), ({}, ("--reference",))):
        out = kiln("bench", mixed_model, "--iterations", "3", "--json", *args, env=env).stdout
        assert json.loads(out)["reference_share"] == 1.0, (env, args)


def test_reference_share_is_zero_on_fast_kernels(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 512])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 512])
    path = save(tmp_path, "fast.onnx", [helper.make_node("Relu", ["x"], ["a"]),
                                        helper.make_node("Sigmoid", ["a"], ["y"])], [x], [y])
    out = kiln("bench", path, "--iterations", "3", "--json").stdout
    assert json.loads(out)["reference_share"] == 0.0


def test_fallbacks_in_the_log_match_onednn(tmp_path):
    """A 1x1 convolution to 2 channels on plain data, and a 3x3 one to 16 channels: the
    log's fallback lines name exactly the convolutions oneDNN created on its generic GEMM
    or reference code, with their shapes."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((2, 16, 1, 1)).astype(np.float32), "w1")
    w3 = numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32), "w3")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 24, 24])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 24, 24])
    nodes = [helper.make_node("Conv", ["x", "w3"], ["a"], name="conv3x3", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w1"], ["y"], name="conv1x1")]
    path = save(tmp_path, "convs.onnx", nodes, [x], [y], [w1, w3])
    r = kiln("inspect", path, "--optimized", env={"ONEDNN_VERBOSE": "2"})
    created = [line.split(",") for line in r.stdout.splitlines() + r.stderr.splitlines()
               if line.startswith("onednn_verbose,create") and ",convolution," in line]
    assert created, "oneDNN reported no convolution"
    generic = sorted({f[4] for f in created if "gemm" in f[4] or f[4].startswith("ref")})
    fallbacks = [line.strip() for line in r.stdout.splitlines() if "fallback:" in line]
    named = sorted({re.search(r"runs (\S+) ", f).group(1) for f in fallbacks})
    assert named == generic, f"log: {fallbacks}\noneDNN: {[f[4] for f in created]}"
    for f in fallbacks:
        assert re.search(r"fallback: conv(3x3|1x1) \(Conv\)", f), f
        assert "[1,16,24,24]" in f, f


def test_masks_and_log_softmax_run_on_fast_kernels(tmp_path):
    """An attention-style mask given at run time (Where with a [B,1,1,S] bool condition),
    LogSoftmax over the last axis, and position ids expanded to the batch: all on fast
    kernels (simd/bcast_copy.c, norm.c), and the outputs as numpy computes them."""
    b, h, s = 2, 4, 16
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, h, s, s])
    mask = helper.make_tensor_value_info("mask", TensorProto.BOOL, [b, 1, 1, s])
    pos = helper.make_tensor_value_info("pos", TensorProto.INT64, [1, s])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, h, s, s])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [b, s])
    neg = numpy_helper.from_array(np.array(-1e9, dtype=np.float32), "neg")
    shape = numpy_helper.from_array(np.array([b, s], dtype=np.int64), "shape")
    nodes = [helper.make_node("Where", ["mask", "x", "neg"], ["m"]),
             helper.make_node("LogSoftmax", ["m"], ["y"], axis=-1),
             helper.make_node("Expand", ["pos", "shape"], ["ids"])]
    path = save(tmp_path, "masks.onnx", nodes, [x, mask, pos], [y, ids], [neg, shape])
    r = kiln("bench", path, "--iterations", "3", "--json", "--profile")
    assert json.loads(r.stdout)["reference_share"] == 0.0, r.stderr
    for kernel in ("where_bcast", "f32_log_softmax_", "expand_bcast"):
        assert kernel in r.stderr, f"{kernel} not in the profile:\n{r.stderr}"
    rng = np.random.default_rng(3)
    xv = rng.standard_normal((b, h, s, s)).astype(np.float32)
    mv = rng.random((b, 1, 1, s)) < 0.7
    mv[..., 0] = True
    pv = np.arange(s, dtype=np.int64)[None, :]
    for name, v in (("x", xv), ("mask", mv), ("pos", pv)):
        np.save(tmp_path / f"{name}.npy", v)
    kiln("predict", path, *[a for n in ("x", "mask", "pos")
                            for a in ("--input", f"{n}={tmp_path / (n + '.npy')}")],
         "--output-dir", tmp_path / "out")
    m = np.where(mv, xv, np.float32(-1e9)).astype(np.float64)
    want = m - m.max(-1, keepdims=True)
    want -= np.log(np.exp(want).sum(-1, keepdims=True))
    got = np.load(tmp_path / "out" / "y.npy")
    assert np.allclose(got, want, rtol=1e-5, atol=1e-4), float(np.abs(got - want).max())
    assert (np.load(tmp_path / "out" / "ids.npy") == np.broadcast_to(pv, (b, s))).all()
