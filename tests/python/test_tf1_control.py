"""test_tf1_control.py - TF1 control flow (Switch/Merge, while-loop frames) and TensorArrayV3.

The models are written by tools/make_tf1_control_flow.py in the layout TF1's
tf.while_loop, tf.cond and TensorArray give a graph (no TensorFlow needed)
into tmp_path and run with `kiln predict`; the answers are worked out
independently in NumPy by that script's *_ref functions. Kiln turns the
frames into While and the Switch/Merge conditionals into If nodes
(src/import/tf_v1_control.c) and lowers those as the TF2 ops. Malformed
frames must be refused with one line naming the node.

KILN_BIN is the kiln binary (default build/kiln).
"""
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
KILN = pathlib.Path(os.environ.get("KILN_BIN") or ROOT / "build" / "kiln")
sys.path.insert(0, str(ROOT / "tools"))
import make_tf1_control_flow as cf  # noqa: E402

pytestmark = pytest.mark.skipif(not os.access(KILN, os.X_OK),
                                reason=f"kiln binary not found at {KILN} (build it, or set KILN_BIN)")


def kiln(*args):
    return subprocess.run([str(KILN), *map(str, args)], capture_output=True, text=True,
                          errors="replace", timeout=60)


def predict(d, inputs, tmp):
    out = tmp / "out"
    out.mkdir(parents=True, exist_ok=True)
    for p in out.glob("*.npy"):
        p.unlink()
    args = ["predict", d, "--output-dir", out]
    for i, (name, arr) in enumerate(inputs.items()):
        p = tmp / f"in{i}.npy"
        np.save(p, arr)
        args += ["--input", f"{name}={p}"]
    r = kiln(*args)
    assert r.returncode == 0, r.stderr
    return {p.stem: np.load(p) for p in out.glob("*.npy")}


TOP_OPS = {"counting": {"Loop"}, "tensorarray": {"Loop", "TfListSetItem", "ScatterND"},
           "cond": {"If"}, "nesting": {"If", "Loop"}, "rnn": {"Loop", "ScatterND"}}


def build(tmp, name):
    d = cf.write(str(tmp), name, cf.MODELS[name]())
    # the frames and conditionals became Kiln's Loop and If, not something else
    r = kiln("inspect", d, "--json")
    assert r.returncode == 0, r.stderr
    ops = json.loads(r.stdout)["ops"]
    assert TOP_OPS[name] <= set(ops), ops
    return d


def check(got, want):
    assert set(got) == set(want)
    for k, w in want.items():
        w = np.asarray(w)
        assert got[k].shape == w.shape, (k, got[k].shape, w.shape)
        assert got[k].dtype == w.dtype, (k, got[k].dtype, w.dtype)
        np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_counting_loop(tmp_path, n):
    d = build(tmp_path, "counting")
    x = np.array([1.5, -2.0, 0.25], np.float32)
    check(predict(d, {"x": x, "n": np.array(n, np.int32)}, tmp_path), cf.counting_ref(x, n))


@pytest.mark.parametrize("n", [2, 5])
def test_tensorarray_loop(tmp_path, n):
    d = build(tmp_path, "tensorarray")
    x = np.array([1.5, -2.0, 0.25], np.float32)
    check(predict(d, {"x": x, "n": np.array(n, np.int32)}, tmp_path), cf.tensorarray_ref(x, n))


@pytest.mark.parametrize("x", [[1.0, 2.0], [-3.0, 1.0], [0.0]])
def test_cond(tmp_path, x):
    d = build(tmp_path, "cond")
    x = np.array(x, np.float32)
    check(predict(d, {"x": x}, tmp_path), cf.cond_ref(x))


@pytest.mark.parametrize("x,n", [(1.5, 4), (2.0, 0), (-3.0, 5), (4.0, 9), (0.25, 1)])
def test_loop_in_cond_cond_in_loop_loop_in_loop(tmp_path, x, n):
    d = build(tmp_path, "nesting")
    got = predict(d, {"x": np.array(x, np.float32), "n": np.array(n, np.int32)}, tmp_path)
    check(got, cf.nesting_ref(x, n))


@pytest.mark.parametrize("t,b", [(4, 2), (1, 1), (7, 3)])
def test_dynamic_rnn(tmp_path, t, b):
    d = build(tmp_path, "rnn")
    rng = np.random.default_rng(t * 10 + b)
    x = rng.standard_normal((t, b, cf.RNN_F)).astype(np.float32)
    h0 = rng.standard_normal((b, cf.RNN_H)).astype(np.float32)
    check(predict(d, {"x": x, "h0": h0}, tmp_path), cf.rnn_ref(x, h0))


@pytest.mark.parametrize("name", sorted(cf.BAD))
def test_malformed_frames_are_refused(tmp_path, name):
    data, pattern = cf.BAD[name]
    d = cf.write(str(tmp_path), name, data)
    r = kiln("inspect", d)
    assert r.returncode == 1, f"exit {r.returncode}; stderr: {r.stderr[-2000:]}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kiln: "), r.stderr[-2000:]
    assert re.search(pattern, lines[0], re.I), f"{pattern!r} not in: {lines[0]}"


# Ops of equal length, swapped in place in the wire bytes (field 2 of a NodeDef, tag 0x12):
# graphs whose frames and conditionals are wrong in every way a swap can make them.
SWAPS = [(b"Merge", b"Enter"), (b"Enter", b"Merge"), (b"Exit", b"Less"), (b"Less", b"Exit"),
         (b"Identity", b"LoopCond"), (b"LoopCond", b"Identity"), (b"Switch", b"MatMul"),
         (b"Exit", b"Cast"), (b"Merge", b"Const")]


@pytest.mark.parametrize("name", sorted(cf.MODELS))
def test_mangled_control_flow_never_crashes(tmp_path, name):
    import random
    base = cf.MODELS[name]()
    rng = random.Random(name)
    tried = 0
    for _ in range(40):
        a, b = rng.choice(SWAPS)
        pat = bytes([0x12, len(a)]) + a
        spots = [i for i in range(len(base)) if base.startswith(pat, i)]
        if not spots:
            continue
        i = rng.choice(spots)
        data = base[:i] + bytes([0x12, len(b)]) + b + base[i + len(pat):]
        d = cf.write(str(tmp_path), f"m{tried}", data)
        r = kiln("inspect", d)
        tried += 1
        assert r.returncode in (0, 1), f"{a}->{b} at {i}: exit {r.returncode}\n{r.stderr[-2000:]}"
        if r.returncode == 1:
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("kiln: "), r.stderr[-2000:]
        if tried == 6:
            break
    assert tried >= 4
