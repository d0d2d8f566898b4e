"""test_conv_tune.py - a convolution's timed choice among its oneDNN implementations
(src/kernels/dnnl/conv.c, docs/ARCHITECTURE.md "Timed choice") as a saved .kiln keeps it.

The model is a 1x7 and a 7x1 convolution (asymmetric pads, bias, Relu), the shapes where
oneDNN's blocked direct kernel and its nhwc brgconv kernel trade places with the batch.
Saved with batch sizes 1 and 8, the file must hold the plans' decisions in its TUNE
section (tag "conv_algo_choice:...", choice 0 the rules', 1 direct, 2 format any);
rewritten to "format any", a load must run the 1x7 convolution on the reordering kernel
without timing anything, and every file's outputs must equal a numpy convolution within
1e-4 of scale. A choice out of range must be refused by name.
"""
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KILN_BUILD_DIR", str(REPO / "build")))
sys.path.insert(0, str(REPO / "tools"))
from make_kiln_corpus import rechecksum  # noqa: E402


@pytest.fixture(scope="module")
def kiln_bin():
    path = os.path.abspath(os.environ.get("KILN_BIN", str(BUILD / "kiln")))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kiln executable not found at {path}: build it or set KILN_BIN")
    return path


@pytest.fixture(scope="module")
def tool():
    t = BUILD / "tests" / "unit_kiln_artifact"
    if not t.exists():
        pytest.skip(f"{t} not found (build Kiln, or set KILN_BUILD_DIR)")
    return t


RNG = np.random.default_rng(3)
W1 = (RNG.standard_normal((48, 32, 1, 7)) * 0.2).astype(np.float32)
B1 = RNG.standard_normal(48).astype(np.float32)
W2 = (RNG.standard_normal((32, 48, 7, 1)) * 0.2).astype(np.float32)
B2 = RNG.standard_normal(32).astype(np.float32)


def conv_np(x, w, b, pads):
    """Conv (stride 1) in float64: pads = (top, left, bottom, right)."""
    t, l, bo, r = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, bo), (l, r)))
    m, _, kh, kw = w.shape
    n, _, hp, wp = xp.shape
    oh, ow = hp - kh + 1, wp - kw + 1
    y = np.zeros((n, m, oh, ow))
    for i in range(kh):
        for j in range(kw):
            y += np.einsum("nchw,mc->nmhw", xp[:, :, i:i + oh, j:j + ow], w[:, :, i, j])
    return y + b[None, :, None, None]


def forward(x):
    h = np.maximum(conv_np(x, W1, B1, (0, 3, 0, 3)), 0)
    return np.maximum(conv_np(h, W2, B2, (3, 0, 3, 0)), 0)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[0, 3, 0, 3]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[3, 0, 3, 0]),
             helper.make_node("Relu", ["c2"], ["y"])]
    g = helper.make_graph(
        nodes, "tune", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32, 6, 6])],
        [numpy_helper.from_array(a, n) for a, n in ((W1, "w1"), (B1, "b1"), (W2, "w2"), (B2, "b2"))])
    path = tmp_path_factory.mktemp("tune") / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def sections(buf):
    assert buf[:8] == b"\x89KILN\r\n\x1a"
    n = struct.unpack_from("<I", buf, 24)[0]
    out = {}
    for i in range(n):
        e = 64 + 32 * i
        off, ln = struct.unpack_from("<QQ", buf, e + 8)
        out[bytes(buf[e:e + 4]).decode()] = (off, ln)
    return out


def tune_entries(buf):
    """[(offset of the choice, tag, choice)] of the TUNE section."""
    off, ln = sections(buf)["TUNE"]
    p = off
    n = struct.unpack_from("<I", buf, p)[0]
    p += 4
    out = []
    for _ in range(n):
        _, tlen = struct.unpack_from("<iI", buf, p)
        p += 8
        tag = bytes(buf[p:p + tlen]).decode()
        p += tlen
        out.append((p, tag, struct.unpack_from("<i", buf, p)[0]))
        p += 4
    assert p == off + ln
    return out


def predict(kiln_bin, model, x, tmp_path, tag):
    inp = tmp_path / f"{tag}_x.npy"
    np.save(inp, x)
    out = tmp_path / f"{tag}_out"
    r = subprocess.run([kiln_bin, "predict", str(model), "--input", f"x={inp}", "--output-dir",
                        str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return np.load(out / "y.npy"), r


def conv_kernels(kiln_bin, path):
    r = subprocess.run([kiln_bin, "inspect", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return [ln.split()[2] for ln in r.stdout.splitlines()
            if ln.startswith("  fp32 ") and ln.split()[1] == "KilnFusedConv"]


def test_saved_choices_are_used_at_load(kiln_bin, tool, model, tmp_path):
    art = tmp_path / "m.kiln"
    r = subprocess.run([str(tool), "--save", str(model), str(art), "fp32", "1,8"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    buf = bytearray(art.read_bytes())
    if "TUNE" not in sections(buf):
        pytest.skip("no convolution of this model had a second candidate on this CPU")
    entries = tune_entries(buf)
    assert entries and all(t.startswith("conv_algo_choice:") and 0 <= c <= 2
                           for _, t, c in entries), entries
    # the 1x7 convolution's decisions, one per saved batch size
    assert sorted(t.split(":")[1] for _, t, _ in entries if "[48," not in t.split(":")[1]) == \
        ["[1,32,6,6]", "[8,32,6,6]"], entries
    forced = bytearray(buf)
    for p, _, _ in entries:
        struct.pack_into("<i", forced, p, 2)
    rechecksum(forced)
    fpath = tmp_path / "forced.kiln"
    fpath.write_bytes(forced)
    kernels = conv_kernels(kiln_bin, fpath)
    assert len(kernels) == 2 and kernels[0] == "dnnl_fused_conv_any", kernels
    x = RNG.standard_normal((8, 32, 6, 6)).astype(np.float32)
    want = forward(x)
    scale = max(1.0, float(np.abs(want).max()))
    for path, tag in ((model, "onnx"), (art, "saved"), (fpath, "forced")):
        y, _ = predict(kiln_bin, path, x, tmp_path, tag)
        assert np.abs(y - want).max() <= 1e-4 * scale, (tag, np.abs(y - want).max())
    # a choice out of range is refused, naming it
    bad = bytearray(buf)
    struct.pack_into("<i", bad, entries[0][0], 7)
    rechecksum(bad)
    bpath = tmp_path / "bad.kiln"
    bpath.write_bytes(bad)
    r = subprocess.run([kiln_bin, "inspect", str(bpath)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "tune choice" in r.stderr and "is 7" in r.stderr, r.stderr
