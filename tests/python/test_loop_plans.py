"""test_loop_plans.py - Loop, If and Scan run on plans (their bodies as sub-plans).

Each ONNX graph is built with onnx.helper and run three ways: `kiln predict`
(plans, fast kernels), `kiln predict --reference` (imported graph, reference
executor) and NumPy; the three must agree. The cases the plan compiler can express (a trip
count known after folding, captured outer values, a carried shape that grows,
zero iterations, a loop inside an If, a trip count given at run time with only
loop-carried values, Scan over either axis in either direction) must show their Loop, If and Scan steps on loop_plan / if_plan / scan_plan in
`kiln bench --profile`; a loop whose scan outputs' length depends on the data
must show none (no plan: the reference executor, still with the right answer), as must
nested growing loops past the budget of body plans and a loop whose condition turns false
on a later body plan. Also: carried values handed back in place or as views (swapped, or a
view beside the value itself), and a body value above the per-tensor limit (refused). The Keras SimpleRNN and Bidirectional loops written as TF2 does are
in test_tf_control_flow.py.

KILN_BIN is the kiln binary (default build/kiln).
"""
import os
import pathlib
import re
import subprocess

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
KILN = pathlib.Path(os.environ.get("KILN_BIN") or ROOT / "build" / "kiln")
pytestmark = pytest.mark.skipif(not os.access(KILN, os.X_OK),
                                reason=f"kiln binary not found at {KILN} (build it, or set KILN_BIN)")
F = TensorProto.FLOAT


def kiln(*args):
    return subprocess.run([str(KILN), *map(str, args)], capture_output=True, text=True,
                          errors="replace", timeout=120)


def save(tmp, graph):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    p = tmp / "m.onnx"
    onnx.save(m, str(p))
    return p


def predict(path, inputs, tmp, reference=False):
    out = tmp / ("ref" if reference else "out")
    out.mkdir(exist_ok=True)
    args = ["predict", path, "--output-dir", out] + (["--reference"] if reference else [])
    for name, arr in inputs.items():
        p = tmp / f"in_{name}.npy"
        np.save(p, arr)
        args += ["--input", f"{name}={p}"]
    r = kiln(*args)
    assert r.returncode == 0, r.stderr
    return {p.stem: np.load(p) for p in out.glob("*.npy")}


def control_kernels(path):
    """The kernels `kiln bench --profile` says ran each Loop, If and Scan node: loop_plan,
    if_plan and scan_plan when the graph ran on a plan (its bodies as sub-plans); none when it ran
    on the reference executor (no plan, no profile)."""
    r = kiln("bench", path, "--profile", "--iterations", "2", "--warmup", "0", "--int-high", "4")
    assert r.returncode == 0, r.stderr
    return re.findall(r"^\s*\d+\s+\S+\s+(Loop|If|Scan)\s+(\S+)", r.stderr, re.M)


def check(path, inputs, want, tmp, planned=True, ref_shapes=None):
    got = predict(path, inputs, tmp)
    ref = predict(path, inputs, tmp, reference=True)
    for k, w in want.items():
        w = np.asarray(w)
        for name, res in (("plan", got), ("reference", ref)):
            shape = (ref_shapes or {}).get(k, w.shape) if name == "reference" else w.shape
            assert res[k].shape == shape, (name, k, res[k].shape, shape)
            np.testing.assert_allclose(res[k], w.reshape(shape), rtol=1e-5, atol=1e-5,
                                       err_msg=f"{name} {k}")
    kernels = control_kernels(path)
    if planned:
        assert kernels and all(k in ("loop_plan", "if_plan", "scan_plan") for _, k in kernels), kernels
    else:
        assert not kernels, kernels


def rnn_body(units, feats, w, r, b):
    """Loop body: h' = tanh(x[i] @ W + h @ R + b); scan output h'. x is captured."""
    nodes = [
        helper.make_node("Gather", ["x", "i"], ["xt"], axis=0),
        helper.make_node("MatMul", ["xt", "W"], ["a"]),
        helper.make_node("MatMul", ["h", "R"], ["c"]),
        helper.make_node("Add", ["a", "c"], ["s"]),
        helper.make_node("Add", ["s", "B"], ["s2"]),
        helper.make_node("Tanh", ["s2"], ["h1"]),
        helper.make_node("Identity", ["cond"], ["cond1"]),
        helper.make_node("Identity", ["h1"], ["y"]),
    ]
    return helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h", F, None)],
        [helper.make_tensor_value_info("cond1", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h1", F, None),
         helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R"),
         numpy_helper.from_array(b, "B")])


def rnn_ref(x, h0, w, r, b):
    h = h0.astype(np.float64)
    ys = []
    for t in range(x.shape[0]):
        h = np.tanh(x[t] @ w + h @ r + b)
        ys.append(h)
    ys = np.stack(ys) if ys else np.zeros((0,) + h0.shape)
    return h.astype(np.float32), ys.astype(np.float32)


@pytest.mark.parametrize("steps,batch", [(6, 1), (3, 4), (1, 2)])
def test_rnn_loop_known_trip_count(tmp_path, steps, batch):
    # x is [T, B, F]; the trip count is Shape(x)[0], known once shapes fold; the body
    # captures x (an outer value computed from an input) and its weights are constants
    rng = np.random.default_rng(steps * 10 + batch)
    units, feats = 5, 3
    w = rng.standard_normal((feats, units)).astype(np.float32) * 0.5
    r = rng.standard_normal((units, units)).astype(np.float32) * 0.5
    b = rng.standard_normal(units).astype(np.float32) * 0.5
    nodes = [
        helper.make_node("Mul", ["x_in", "two"], ["x"]),
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Gather", ["shp", "zero"], ["m"], axis=0),
        helper.make_node("Loop", ["m", "", "h0"], ["h", "ys"], body=rnn_body(units, feats, w, r, b)),
        helper.make_node("Relu", ["ys"], ["out"]),
    ]
    g = helper.make_graph(
        nodes, "rnn",
        [helper.make_tensor_value_info("x_in", F, [steps, batch, feats]),
         helper.make_tensor_value_info("h0", F, [batch, units])],
        [helper.make_tensor_value_info("h", F, None), helper.make_tensor_value_info("out", F, None)],
        [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
         numpy_helper.from_array(np.array(0, np.int64), "zero")])
    p = save(tmp_path, g)
    x = rng.standard_normal((steps, batch, feats)).astype(np.float32)
    h0 = rng.standard_normal((batch, units)).astype(np.float32)
    h, ys = rnn_ref(2 * x, h0, w, r, b)
    check(p, {"x_in": x, "h0": h0}, {"h": h, "out": np.maximum(ys, 0)}, tmp_path)


def counter_loop(m_input, scan):
    """Loop(M) over acc' = acc * 0.5 + i, carried acc [2], optionally a scan output."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["acc", "half"], ["ah"]),
         helper.make_node("Add", ["ah", "fi"], ["acc1"]),
         helper.make_node("Identity", ["cond"], ["cond1"])] +
        ([helper.make_node("Identity", ["acc1"], ["s"])] if scan else []),
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", F, None)],
        [helper.make_tensor_value_info("cond1", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc1", F, None)] +
        ([helper.make_tensor_value_info("s", F, None)] if scan else []),
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    outs = ["acc"] + (["s"] if scan else [])
    nodes = [helper.make_node("Loop", [m_input, "", "a0"], outs, body=body),
             helper.make_node("Neg", ["acc"], ["y"])]
    return nodes, outs


def counter_ref(a0, m):
    acc, ss = a0.astype(np.float64), []
    for i in range(m):
        acc = acc * 0.5 + i
        ss.append(acc)
    return acc.astype(np.float32), (np.stack(ss) if ss else np.zeros((0, 2))).astype(np.float32)


@pytest.mark.parametrize("m", [0, 1, 5])
def test_constant_trip_count_and_zero_iterations(tmp_path, m):
    nodes, outs = counter_loop("m", scan=True)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a0", F, [2])],
                          [helper.make_tensor_value_info("y", F, None),
                           helper.make_tensor_value_info("s", F, None)],
                          [numpy_helper.from_array(np.array(m, np.int64), "m")])
    p = save(tmp_path, g)
    a0 = np.array([1.0, -3.0], np.float32)
    acc, ss = counter_ref(a0, m)
    # zero iterations: the plan knows the scan output's element shape from the body;
    # the reference executor has only its declared type (unknown here), so [0]
    check(p, {"a0": a0}, {"y": -acc, "s": ss}, tmp_path,
          ref_shapes={"s": (0,)} if m == 0 else None)


@pytest.mark.parametrize("m", [0, 3, 8])
def test_runtime_trip_count_carried_only(tmp_path, m):
    # M is an input: only loop-carried values, whose shapes do not change, so the loop
    # still runs on a plan however many iterations it makes
    nodes, _ = counter_loop("m", scan=False)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a0", F, [2]),
                                       helper.make_tensor_value_info("m", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("y", F, None)])
    p = save(tmp_path, g)
    a0 = np.array([2.0, 0.25], np.float32)
    acc, _ = counter_ref(a0, m)
    check(p, {"a0": a0, "m": np.array(m, np.int64)}, {"y": -acc}, tmp_path)


def test_runtime_trip_count_with_scan_output_is_not_planned(tmp_path):
    # the scan output's length is the run-time M: no plan, the reference executor
    nodes, _ = counter_loop("m", scan=True)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a0", F, [2]),
                                       helper.make_tensor_value_info("m", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("y", F, None),
                           helper.make_tensor_value_info("s", F, None)])
    p = save(tmp_path, g)
    a0 = np.array([2.0, 0.25], np.float32)
    acc, ss = counter_ref(a0, 4)
    check(p, {"a0": a0, "m": np.array(4, np.int64)}, {"y": -acc, "s": ss}, tmp_path,
          planned=False)


@pytest.mark.parametrize("m", [0, 1, 4])
def test_carried_shape_grows(tmp_path, m):
    # y' = Concat(y, y[-1:] + 1) for a constant trip count: one body plan per length
    body = helper.make_graph(
        [helper.make_node("Slice", ["y", "st", "en"], ["last"]),
         helper.make_node("Add", ["last", "one"], ["nxt"]),
         helper.make_node("Concat", ["y", "nxt"], ["y1"], axis=0),
         helper.make_node("Identity", ["cond"], ["cond1"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y", F, None)],
        [helper.make_tensor_value_info("cond1", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y1", F, None)],
        [numpy_helper.from_array(np.array([-1], np.int64), "st"),
         numpy_helper.from_array(np.array([2**62], np.int64), "en"),
         numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    g = helper.make_graph(
        [helper.make_node("Loop", ["m", "", "y0"], ["y"], body=body),
         helper.make_node("Mul", ["y", "y"], ["sq"])],
        "g", [helper.make_tensor_value_info("y0", F, [3])],
        [helper.make_tensor_value_info("sq", F, None)],
        [numpy_helper.from_array(np.array(m, np.int64), "m")])
    p = save(tmp_path, g)
    y0 = np.array([0.5, 2.0, -1.0], np.float32)
    y = np.concatenate([y0, -1.0 + np.arange(1, m + 1, dtype=np.float32)])
    check(p, {"y0": y0}, {"sq": y * y}, tmp_path)


@pytest.mark.parametrize("flag", [True, False])
def test_loop_in_if(tmp_path, flag):
    # If(flag): then a Loop summing x * i for i < 4 (x captured two levels up), else x * 10
    loop_body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("Add", ["acc", "xi"], ["acc1"]),
         helper.make_node("Identity", ["cond"], ["cond1"])],
        "loop_body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", F, None)],
        [helper.make_tensor_value_info("cond1", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc1", F, None)])
    then_g = helper.make_graph(
        [helper.make_node("Loop", ["four", "", "zeros"], ["r"], body=loop_body)], "then", [],
        [helper.make_tensor_value_info("r", F, None)],
        [numpy_helper.from_array(np.array(4, np.int64), "four")])
    else_g = helper.make_graph([helper.make_node("Mul", ["x", "ten"], ["r2"])], "else", [],
                               [helper.make_tensor_value_info("r2", F, None)],
                               [numpy_helper.from_array(np.array(10.0, np.float32), "ten")])
    g = helper.make_graph(
        [helper.make_node("Sub", ["x", "x"], ["zeros"]),
         helper.make_node("If", ["flag"], ["y"], then_branch=then_g, else_branch=else_g)],
        "g", [helper.make_tensor_value_info("x", F, [2, 3]),
              helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", F, None)])
    p = save(tmp_path, g)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    want = x * 6 if flag else x * 10
    check(p, {"x": x, "flag": np.array(flag)}, {"y": want}, tmp_path)


@pytest.mark.parametrize("in_rev,out_rev", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("steps", [0, 1, 5])
def test_scan_axes_and_directions(tmp_path, steps, in_rev, out_rev):
    # Scan over axis 1 of x [2, T]: s' = s + x_t * w (w captured from the outer graph),
    # y_t = s' * 2 stacked on axis 1, either direction on each side
    body = helper.make_graph(
        [helper.make_node("Mul", ["xt", "w"], ["xw"]),
         helper.make_node("Add", ["s", "xw"], ["s1"]),
         helper.make_node("Add", ["s1", "s1"], ["y"])],
        "body",
        [helper.make_tensor_value_info("s", F, [2]), helper.make_tensor_value_info("xt", F, [2])],
        [helper.make_tensor_value_info("s1", F, [2]), helper.make_tensor_value_info("y", F, [2])])
    g = helper.make_graph(
        [helper.make_node("Neg", ["w_in"], ["w"]),
         helper.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1,
                          scan_input_axes=[1], scan_input_directions=[in_rev],
                          scan_output_axes=[1], scan_output_directions=[out_rev])],
        "g", [helper.make_tensor_value_info("s0", F, [2]),
              helper.make_tensor_value_info("x", F, [2, steps]),
              helper.make_tensor_value_info("w_in", F, [2])],
        [helper.make_tensor_value_info("s", F, None), helper.make_tensor_value_info("ys", F, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 7
    p = tmp_path / "scan.onnx"
    onnx.save(m, str(p))
    rng = np.random.default_rng(steps * 4 + in_rev * 2 + out_rev)
    s0 = rng.standard_normal(2).astype(np.float32)
    x = rng.standard_normal((2, steps)).astype(np.float32)
    w_in = rng.standard_normal(2).astype(np.float32)
    s, ys = s0.astype(np.float64), []
    for t in range(steps):
        s = s + x[:, steps - 1 - t if in_rev else t] * -w_in
        ys.append(2 * s)
    ys = np.stack(ys, 1) if ys else np.zeros((2, 0))
    if out_rev:
        ys = ys[:, ::-1]
    check(p, {"s0": s0, "x": x, "w_in": w_in},
          {"s": s.astype(np.float32), "ys": ys.astype(np.float32)}, tmp_path)


def loop_graph(body, carried, outs, m, extra_nodes=(), inits=()):
    """A graph running Loop(m) with `body` over the float inputs `carried` (name: shape),
    its outputs `outs` the Loop's, taken as the graph's outputs."""
    return helper.make_graph(
        [helper.make_node("Loop", ["m", ""] + list(carried), list(outs), body=body),
         *extra_nodes],
        "g", [helper.make_tensor_value_info(k, F, s) for k, s in carried.items()],
        [helper.make_tensor_value_info(o, F, None) for o in outs],
        [numpy_helper.from_array(np.array(m, np.int64), "m"), *inits])


@pytest.mark.parametrize("n", [6, 0])
@pytest.mark.parametrize("view_first", [True, False])
@pytest.mark.parametrize("m", [1, 3])
def test_carried_view_beside_the_value_itself(tmp_path, n, view_first, m):
    # carried a [1,n] and b [n]; the body outputs a' = Unsqueeze(b, 0) and b' = b. With
    # n = 0 the view shares b's (empty) memory: b's tensor is handed back as a', which must
    # not change what b' is copied as (each iteration then finds the body plan for a [1,0],
    # b [0] again). view_first: a is carried before b (the view is the earlier output)
    order = ["a", "b"] if view_first else ["b", "a"]
    new = {"a": "ub", "b": "b"}
    body = helper.make_graph(
        [helper.make_node("Unsqueeze", ["b", "axes"], ["ub"]),
         helper.make_node("Identity", ["cond"], ["cond1"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])] +
        [helper.make_tensor_value_info(k, F, None) for k in order],
        [helper.make_tensor_value_info("cond1", TensorProto.BOOL, [])] +
        [helper.make_tensor_value_info(new[k], F, None) for k in order],
        [numpy_helper.from_array(np.array([0], np.int64), "axes")])
    shapes = {"a": [1, n], "b": [n]}
    g = helper.make_graph(
        [helper.make_node("Loop", ["m", ""] + [k + "0" for k in order], order, body=body)],
        "g", [helper.make_tensor_value_info(k + "0", F, shapes[k]) for k in order],
        [helper.make_tensor_value_info(k, F, None) for k in order],
        [numpy_helper.from_array(np.array(m, np.int64), "m")])
    p = save(tmp_path, g)
    rng = np.random.default_rng(7)
    a0 = rng.standard_normal((1, n)).astype(np.float32)
    b0 = rng.standard_normal(n).astype(np.float32)
    a, b = a0, b0
    for _ in range(m):
        a, b = b[None], b
    check(p, {"a0": a0, "b0": b0}, {"a": a, "b": b}, tmp_path)


@pytest.mark.skipif(KILN.exists() and b"libasan" in KILN.read_bytes(),
                    reason="caps the address space, which ASan's shadow memory exceeds")
def test_body_value_above_the_tensor_limit_is_refused(tmp_path):
    # a Loop body asks for a 64 GiB tensor (ConstantOfShape [2^34] floats): refused as the
    # reference executor refuses it (per-tensor limit, 16 GiB by default), before anything
    # that size is allocated (the address space is capped at 8 GiB), with no crash
    body = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["big"],
                          value=numpy_helper.from_array(np.array([1.0], np.float32))),
         helper.make_node("ReduceSum", ["big"], ["s"], keepdims=1),
         helper.make_node("Add", ["acc", "s"], ["acc1"]),
         helper.make_node("Identity", ["cond"], ["cond1"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", F, None)],
        [helper.make_tensor_value_info("cond1", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc1", F, None)],
        [numpy_helper.from_array(np.array([1 << 34], np.int64), "shape")])
    p = save(tmp_path, loop_graph(body, {"acc0": [1]}, ["acc"], 2))
    np.save(tmp_path / "acc0.npy", np.zeros(1, np.float32))

    def cap():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    for ref in ([], ["--reference"]):
        r = subprocess.run([str(KILN), "predict", str(p), "--output-dir", str(tmp_path / "o"),
                            "--input", f"acc0={tmp_path / 'acc0.npy'}", *ref],
                           capture_output=True, text=True, errors="replace", timeout=120,
                           preexec_fn=cap)
        assert r.returncode > 0, (ref, r.returncode, r.stderr)
        assert "per tensor" in r.stderr, (ref, r.stderr)


def nested_growing(levels, m):
    """`levels` Loops nested, each of m iterations: a level's body runs the next level's
    Loop over its carried y, then y' = Concat(y, y[-1:] + 1); y grows on every level, so
    each level has a body plan per length of y for each plan of the level around it."""
    body = None
    for lv in reversed(range(levels)):
        pre = "y"
        nodes = []
        inits = [numpy_helper.from_array(np.array([-1], np.int64), "st"),
                 numpy_helper.from_array(np.array([2**62], np.int64), "en"),
                 numpy_helper.from_array(np.array(1.0, np.float32), "one")]
        if body is not None:
            nodes.append(helper.make_node("Loop", ["mm", "", "y"], ["yin"], body=body))
            inits.append(numpy_helper.from_array(np.array(m, np.int64), "mm"))
            pre = "yin"
        nodes += [helper.make_node("Slice", [pre, "st", "en"], ["last"]),
                  helper.make_node("Add", ["last", "one"], ["nxt"]),
                  helper.make_node("Concat", [pre, "nxt"], ["y1"], axis=0),
                  helper.make_node("Identity", ["cond"], ["cond1"])]
        body = helper.make_graph(
            nodes, f"body{lv}",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []),
             helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
             helper.make_tensor_value_info("y", F, None)],
            [helper.make_tensor_value_info("cond1", TensorProto.BOOL, []),
             helper.make_tensor_value_info("y1", F, None)], inits)
    return loop_graph(body, {"y0": [2]}, ["y"], m)


def nested_growing_ref(y, levels, m):
    for _ in range(m):
        if levels > 1:
            y = nested_growing_ref(y, levels - 1, m)
        y = np.concatenate([y, y[-1:] + 1])
    return y


@pytest.mark.parametrize("levels,m,planned", [(3, 3, True), (4, 8, False)])
def test_nested_growing_loops_bounded_body_plans(tmp_path, levels, m, planned):
    # 3 + 9 + 27 body plans stay on plans; 8 + 64 + 512 + 4096 are past the budget of
    # body plans per graph (256): the compile gives up at once and the reference
    # executor runs the graph
    p = save(tmp_path, nested_growing(levels, m))
    y0 = np.array([0.5, -2.0], np.float32)
    want = nested_growing_ref(y0.astype(np.float64), levels, m).astype(np.float32)
    import time
    t0 = time.monotonic()
    check(p, {"y0": y0}, {"y": want}, tmp_path, planned=planned)
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("m", [3, 4, 10])
def test_condition_turns_false_on_a_later_body_plan(tmp_path, m):
    # x grows each iteration and the condition is Size(x) < 5: true on the first body
    # plans, false on the one for length 5, so M = 10 is not the trip count (the loop
    # stops after 5 iterations): no plan, the reference executor; M <= 4: on plans
    body = helper.make_graph(
        [helper.make_node("Slice", ["x", "st", "en"], ["last"]),
         helper.make_node("Add", ["last", "one"], ["nxt"]),
         helper.make_node("Concat", ["x", "nxt"], ["x1"], axis=0),
         helper.make_node("Size", ["x"], ["n"]),
         helper.make_node("Less", ["n", "five"], ["cond1"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", F, None)],
        [helper.make_tensor_value_info("cond1", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x1", F, None)],
        [numpy_helper.from_array(np.array([-1], np.int64), "st"),
         numpy_helper.from_array(np.array([2**62], np.int64), "en"),
         numpy_helper.from_array(np.array(1.0, np.float32), "one"),
         numpy_helper.from_array(np.array(5, np.int64), "five")])
    p = save(tmp_path, loop_graph(body, {"x0": [1]}, ["x"], m))
    x = x0 = np.array([3.0], np.float32)
    for _ in range(m):
        cond = x.size < 5
        x = np.concatenate([x, x[-1:] + 1])
        if not cond:
            break
    check(p, {"x0": x0}, {"x": x}, tmp_path, planned=m <= 4)


@pytest.mark.parametrize("m", [1, 2, 5])
def test_carried_swap_written_in_place(tmp_path, m):
    # a' = Relu(b) (written over b's memory, handed back as b's tensor) and b' = a (a's
    # tensor handed back): each old carried value is taken over by some output, and none
    # may be freed while the loop still holds it
    body = helper.make_graph(
        [helper.make_node("Relu", ["b"], ["rb"]),
         helper.make_node("Identity", ["cond"], ["cond1"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("a", F, None),
         helper.make_tensor_value_info("b", F, None)],
        [helper.make_tensor_value_info("cond1", TensorProto.BOOL, []),
         helper.make_tensor_value_info("rb", F, None),
         helper.make_tensor_value_info("a", F, None)])
    p = save(tmp_path, loop_graph(body, {"a0": [4], "b0": [4]}, ["a", "b"], m))
    a0 = np.array([1.5, -2.0, 3.0, -0.5], np.float32)
    b0 = np.array([-1.0, 4.0, -3.5, 2.0], np.float32)
    a, b = a0, b0
    for _ in range(m):
        a, b = np.maximum(b, 0), a
    check(p, {"a0": a0, "b0": b0}, {"a": a, "b": b}, tmp_path)
