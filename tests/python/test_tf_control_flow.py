"""test_tf_control_flow.py - TF2 control flow and TensorLists in SavedModels.

The models are written by tools/make_tf_control_flow.py (TF2's layout, no
TensorFlow needed) into tmp_path and run with `kiln predict`; the answers
are worked out independently in NumPy by that script's *_ref functions.
Together they exercise While and StatelessWhile (carried and pass-through
loop variables, the condition re-evaluated on each iteration), If,
StatelessIf and Case (an index out of range runs the last branch), a loop
inside a branch and a branch inside a loop body, and each TensorList op
Kiln lowers (FromTensor, Reserve with an unknown element shape, GetItem,
SetItem, Stack, Gather, Length, ElementShape), and Keras SimpleRNN and
Bidirectional(SimpleRNN) loops, which must run on plans (the Loop step on
loop_plan in `kiln bench --profile`) and agree with NumPy and with the
reference executor, and the same layers and Keras LSTM / GRU loops after
Masking(0.) (a bool mask TensorList; masked LSTM / GRU loops are not
fused). Malformed loops and branches must be refused with one
line naming the node. The shared Keras models are
checked in test_savedmodel.py.

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
import make_tf_control_flow as cf  # noqa: E402

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


def build(tmp, name):
    return cf.write(str(tmp), name, cf.MODELS[name]())


def check(got, want):
    assert set(got) == set(want)
    for k, w in want.items():
        w = np.asarray(w)
        assert got[k].shape == w.shape, (k, got[k].shape, w.shape)
        assert got[k].dtype == w.dtype, (k, got[k].dtype, w.dtype)
        np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("t,b,f", [(4, 2, 3), (1, 1, 1), (7, 3, 2)])
def test_while_over_tensorlists(tmp_path, t, b, f):
    d = build(tmp_path, "while_tensorlist")
    rng = np.random.default_rng(t * 100 + b * 10 + f)
    x = rng.standard_normal((t, b, f)).astype(np.float32)
    h0 = rng.standard_normal((b, f)).astype(np.float32)
    if t < 2:  # the model gathers elements [1, 0]
        with pytest.raises(AssertionError, match=r"out of range|indices"):
            predict(d, {"x": x, "h0": h0}, tmp_path)
        return
    check(predict(d, {"x": x, "h0": h0}, tmp_path), cf.while_tensorlist_ref(x, h0))


@pytest.mark.parametrize("x,n", [(1.5, 4), (2.0, 0), (-3.0, 5), (0.0, 3), (4.0, 9), (0.25, 1)])
def test_loop_in_branch_and_branch_in_loop(tmp_path, x, n):
    d = build(tmp_path, "if_loop_nesting")
    got = predict(d, {"x": np.array(x, np.float32), "n": np.array(n, np.int32)}, tmp_path)
    check(got, cf.if_loop_nesting_ref(x, n))


@pytest.mark.parametrize("index", [0, 1, 2, 3, 4, 5, -1, 100])
def test_case(tmp_path, index):
    d = build(tmp_path, "case")
    x = np.array([1.0, -2.0, 3.5], np.float32)
    got = predict(d, {"index": np.array(index, np.int32), "x": x}, tmp_path)
    check(got, cf.case_ref(index, x))


@pytest.mark.parametrize("n,want", [(5, 5), (0, 0), (-3, 0), (1000, 1000)])
def test_counter(tmp_path, n, want):
    d = build(tmp_path, "counter")
    got = predict(d, {"n": np.array(n, np.int32)}, tmp_path)["y"]
    assert got.dtype == np.int32 and got == want


@pytest.mark.parametrize("name", sorted(cf.BAD))
def test_malformed_control_flow_is_refused(tmp_path, name):
    data, pattern = cf.BAD[name]
    d = cf.write(str(tmp_path), name, data)
    r = kiln("inspect", d)
    assert r.returncode == 1, f"exit {r.returncode}; stderr: {r.stderr[-2000:]}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kiln: "), r.stderr[-2000:]
    assert re.search(pattern, lines[0], re.I), f"{pattern!r} not in: {lines[0]}"


def ops_of(d):
    r = kiln("inspect", d, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ops"]


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("act,rec_act,batch,steps,backwards", [("Tanh", "Sigmoid", 2, 5, False),
                                                               ("Sigmoid", "Sigmoid", 1, 1, False),
                                                               ("Relu", "Sigmoid", 3, 9, False),
                                                               ("Tanh", "Sigmoid", 2, 4, True)])
def test_keras_rnn_loop_fused_and_as_written(tmp_path, cell, act, rec_act, batch, steps,
                                             backwards):
    # The Keras LSTM / GRU loop is replaced by Kiln's LSTM / GRU op; the same loop with
    # one extra loop variable the recognizer does not know runs as written. Both must
    # agree with the NumPy cell and with each other.
    rng = np.random.default_rng(steps * 10 + batch)
    x = rng.standard_normal((batch, steps, 2)).astype(np.float32)
    h0 = rng.standard_normal((batch, 3)).astype(np.float32)
    c0 = rng.standard_normal((batch, 3)).astype(np.float32)
    fused_op = cell.upper()
    got = {}
    for extra in (False, True):
        data, weights = cf.keras_rnn(cell, act=act, rec_act=rec_act, extra=extra,
                                     backwards=backwards)
        d = cf.write(str(tmp_path), f"{cell}_{int(extra)}", data)
        ops = ops_of(d)
        assert ("Loop" in ops) == extra and (fused_op in ops) != extra, ops
        got[extra] = predict(d, {"x": x, "h0": h0, "c0": c0}, tmp_path)
        check(got[extra], cf.keras_rnn_ref(cell, x, h0, c0, weights, act, rec_act, backwards))
    for k in got[False]:
        np.testing.assert_allclose(got[False][k], got[True][k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("n", [1, 4, 7])
def test_lists_that_grow(tmp_path, n):
    # EmptyTensorList filled by SetItem with resize_if_index_out_of_bounds, and by PushBack
    d = build(tmp_path, "list_append")
    x = np.array([1.5, -2.0, 0.25], np.float32)
    got = predict(d, {"x": x, "n": np.array(n, np.int32)}, tmp_path)
    check(got, cf.list_append_ref(x, n))


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("steps,batch", [(5, 2), (1, 1), (9, 3)])
def test_simple_rnn_runs_on_plans(tmp_path, bidirectional, steps, batch):
    # Keras SimpleRNN (no fused op): its While runs as a Loop step whose body is a plan
    # (TfListSetItem writing in place), on the default path; --reference runs the
    # reference executor. Both must give NumPy's answer, and the profile must show the
    # Loop steps on loop_plan.
    data, weights = cf.simple_rnn(units=4, features=3, steps=steps, bidirectional=bidirectional)
    d = cf.write(str(tmp_path), "srnn", data)
    x = np.random.default_rng(steps + batch).standard_normal((batch, steps, 3)).astype(np.float32)
    want = cf.simple_rnn_ref(x, weights, bidirectional)
    check(predict(d, {"x": x}, tmp_path), want)
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    np.save(tmp_path / "x.npy", x)
    r = kiln("predict", d, "--reference", "--output-dir", ref_dir, "--input", f"x={tmp_path / 'x.npy'}")
    assert r.returncode == 0, r.stderr
    check({p.stem: np.load(p) for p in ref_dir.glob("*.npy")}, want)
    r = kiln("bench", d, "--profile", "--iterations", "2", "--warmup", "0")
    assert r.returncode == 0, r.stderr
    loops = re.findall(r"^\s*\d+\s+\S+\s+Loop\s+(\S+)", r.stderr, re.M)
    assert loops == ["loop_plan"] * (2 if bidirectional else 1), r.stderr[-3000:]
    # the bodies' plans are profiled too: their MatMuls ran on a fast kernel
    assert "body plan 0 of Loop node 'fw_while'" in r.stderr, r.stderr[-3000:]
    body = r.stderr[r.stderr.index("body plan 0 of Loop"):]
    assert re.search(r"^MatMul\s+(?!reference)\S+\s+2\s", body, re.M), body[:3000]


def masked_x(batch, steps, seed):
    """x [batch, steps, 3] for a layer after Masking(0.): sample 0 has trailing zero
    steps (padding), sample 1 is fully masked, sample 2 has no masked step, sample 3 a
    masked step in the middle, and a step with only some features zero (not masked)."""
    x = np.random.default_rng(seed).standard_normal((batch, steps, 3)).astype(np.float32)
    x[0, steps // 2 + 1:] = 0
    if batch > 1:
        x[1] = 0
    if batch > 3 and steps > 2:
        x[3, 1] = 0
        x[3, 2, :2] = 0
    return x


def run_both(d, x, tmp_path):
    """kiln predict on the default path (plans) and with --reference."""
    got = predict(d, {"x": x}, tmp_path)
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir(exist_ok=True)
    for p in ref_dir.glob("*.npy"):
        p.unlink()
    np.save(tmp_path / "x.npy", x)
    r = kiln("predict", d, "--reference", "--output-dir", ref_dir, "--input",
             f"x={tmp_path / 'x.npy'}")
    assert r.returncode == 0, r.stderr
    return got, {p.stem: np.load(p) for p in ref_dir.glob("*.npy")}


@pytest.mark.parametrize("zero_output", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("steps,batch", [(5, 4), (1, 2), (7, 5)])
def test_masked_simple_rnn(tmp_path, bidirectional, zero_output, steps, batch):
    # Masking(0.) before SimpleRNN / Bidirectional(SimpleRNN): the mask Any(x != 0, -1)
    # unstacked into a bool TensorList; masked steps keep the state and repeat the
    # previous output (Keras' default) or output zeros (zero_output_for_mask). On plans
    # and on the reference executor, against NumPy.
    data, weights = cf.simple_rnn(units=4, features=3, steps=steps, bidirectional=bidirectional,
                                  mask=True, zero_output=zero_output)
    d = cf.write(str(tmp_path), "srnn_mask", data)
    x = masked_x(batch, steps, steps * 10 + batch)
    want = cf.simple_rnn_ref(x, weights, bidirectional, mask=True, zero_output=zero_output)
    # the mask matters here: the unmasked answer differs
    unmasked = cf.simple_rnn_ref(x, weights, bidirectional)
    assert not np.allclose(want["seq"], unmasked["seq"], atol=1e-3)
    plans, ref = run_both(d, x, tmp_path)
    check(plans, want)
    check(ref, want)
    r = kiln("bench", d, "--profile", "--iterations", "1", "--warmup", "0")
    assert r.returncode == 0, r.stderr
    loops = re.findall(r"^\s*\d+\s+\S+\s+Loop\s+(\S+)", r.stderr, re.M)
    assert loops == ["loop_plan"] * (2 if bidirectional else 1), r.stderr[-3000:]


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("steps,batch,backwards", [(5, 4, False), (6, 5, True), (1, 2, False)])
def test_masked_keras_rnn_is_not_fused(tmp_path, cell, steps, batch, backwards):
    # Keras LSTM / GRU after Masking(0.): Kiln's fused LSTM / GRU op has no mask, so the
    # recognizer must leave the loop as written; on plans and on the reference executor
    # its answers must be NumPy's masked cell.
    data, weights = cf.keras_rnn(cell, backwards=backwards, mask=True)
    d = cf.write(str(tmp_path), f"{cell}_mask", data)
    ops = ops_of(d)
    assert "Loop" in ops and cell.upper() not in ops, ops
    x = masked_x(batch, steps, steps * 10 + batch)[:, :, :2].copy()
    if batch > 3 and steps > 2:
        x[3, 2, 1] = 0.5  # one feature zero, the other not: not masked
    rng = np.random.default_rng(batch)
    h0 = rng.standard_normal((batch, 3)).astype(np.float32)
    c0 = rng.standard_normal((batch, 3)).astype(np.float32)
    want = cf.keras_rnn_ref(cell, x, h0, c0, weights, backwards=backwards, mask=True)
    unmasked = cf.keras_rnn_ref(cell, x, h0, c0, weights, backwards=backwards)
    assert not np.allclose(want["h"], unmasked["h"], atol=1e-3)
    inputs = {"x": x, "h0": h0, "c0": c0}
    check(predict(d, inputs, tmp_path), want)
    r = kiln("predict", d, "--reference", "--output-dir", tmp_path / "ref",
             *[a for i, (k, v) in enumerate(inputs.items())
               for a in ("--input", f"{k}={tmp_path / f'in{i}.npy'}")])
    assert r.returncode == 0, r.stderr
    check({p.stem: np.load(p) for p in (tmp_path / "ref").glob("*.npy")}, want)
