"""test_sequences.py - ONNX sequence and optional values, end to end.

Graphs are built here with onnx.helper and run with `kiln predict`; every
answer is worked out independently in NumPy. They cover each sequence op
(SplitToSequence with and without split and keepdims, SequenceAt and
SequenceErase and SequenceInsert with negative positions, SequenceLength,
ConcatFromSequence with and without new_axis, SequenceConstruct,
SequenceEmpty, SequenceMap), a sequence carried through a Loop, an Optional
through an If, and positions out of range, which must fail with one line
naming the node and the position (never a crash). A PyTorch module with a
list built in a scripted loop, exported by torch.onnx.export (which emits
SplitToSequence, SequenceInsert and ConcatFromSequence inside a Loop), must
give PyTorch's answer. A model whose output is a sequence is refused by
`kiln predict` with a message naming the output (.npy holds tensors); the
serving APIs answer such outputs as tensors NAME/i (test_grpc.py).
The ONNX conformance node tests for these ops run in tests/conformance.

KILN_BIN is the kiln binary (default build/kiln).
"""
import os
import pathlib
import subprocess

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

try:
    import torch
except ImportError:  # the PyTorch test skips
    torch = None

ROOT = pathlib.Path(__file__).resolve().parents[2]
KILN = pathlib.Path(os.environ.get("KILN_BIN") or ROOT / "build" / "kiln")

pytestmark = pytest.mark.skipif(not os.access(KILN, os.X_OK),
                                reason=f"kiln binary not found at {KILN} (build it, or set KILN_BIN)")

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def kiln(*args):
    return subprocess.run([str(KILN), *map(str, args)], capture_output=True, text=True,
                          errors="replace", timeout=60)


def save(tmp, nodes, inputs, outputs, inits=(), opset=17, name="m"):
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    p = tmp / f"{name}.onnx"
    onnx.save(m, str(p))
    return p


def run(tmp, model, feeds):
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    for p in out.glob("*.npy"):
        p.unlink()
    args = ["predict", model, "--output-dir", out]
    for i, (k, v) in enumerate(feeds.items()):
        p = tmp / f"in{i}.npy"
        np.save(p, v)
        args += ["--input", f"{k}={p}"]
    r = kiln(*args)
    return r, {p.stem: np.load(p) for p in out.glob("*.npy")}


def predict(tmp, model, feeds):
    r, outs = run(tmp, model, feeds)
    assert r.returncode == 0, r.stderr
    return outs


def vi(name, et, shape):
    return helper.make_tensor_value_info(name, et, shape)


def const_i64(name, vals):
    return helper.make_tensor(name, I64, [len(vals)] if isinstance(vals, list) else [],
                              vals if isinstance(vals, list) else [vals])


def test_split_positions_and_concat(tmp_path):
    """SplitToSequence by lengths and by a chunk size, negative positions, Erase,
    Insert, Length, ConcatFromSequence with new_axis."""
    nodes = [
        helper.make_node("SplitToSequence", ["x", "lens"], ["s"], axis=0),
        helper.make_node("SequenceLength", ["s"], ["n"]),
        helper.make_node("SequenceAt", ["s", "m1"], ["last"]),
        helper.make_node("SequenceErase", ["s", "m2"], ["e"]),           # drop the middle
        helper.make_node("ConcatFromSequence", ["e"], ["cat"], axis=0),
        helper.make_node("SplitToSequence", ["x", "two"], ["c"], axis=1),  # [5,2],[5,1]
        helper.make_node("SequenceErase", ["c"], ["c1"]),                 # default: the last
        helper.make_node("SequenceInsert", ["c1", "x2", "m1"], ["c2"]),   # before the last
        helper.make_node("ConcatFromSequence", ["c2"], ["st"], axis=-1, new_axis=1),
    ]
    inits = [const_i64("lens", [1, 2, 2]), const_i64("m1", -1), const_i64("m2", -2),
             const_i64("two", 2)]
    m = save(tmp_path, nodes, [vi("x", F, [5, 3]), vi("x2", F, [5, 2])],
             [vi("n", I64, []), vi("last", F, None), vi("cat", F, None), vi("st", F, None)],
             inits)
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    x2 = np.random.default_rng(1).standard_normal((5, 2)).astype(np.float32)
    o = predict(tmp_path, m, {"x": x, "x2": x2})
    parts = [x[0:1], x[1:3], x[3:5]]
    assert o["n"] == 3
    np.testing.assert_array_equal(o["last"], parts[-1])
    np.testing.assert_array_equal(o["cat"], np.concatenate([parts[0], parts[2]], 0))
    np.testing.assert_array_equal(o["st"], np.stack([x2, x[:, 0:2]], axis=-1))


def test_split_keepdims_and_construct(tmp_path):
    """No split: one item per row; keepdims=0 squeezes the axis. SequenceConstruct and
    SequenceEmpty + SequenceInsert build the same sequence."""
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["rows"], axis=1, keepdims=0),
        helper.make_node("ConcatFromSequence", ["rows"], ["t"], axis=0, new_axis=1),
        helper.make_node("SequenceConstruct", ["a", "b", "a"], ["s"]),
        helper.make_node("ConcatFromSequence", ["s"], ["aba"], axis=1),
        helper.make_node("SequenceEmpty", [], ["e"], dtype=F),
        helper.make_node("SequenceInsert", ["e", "b"], ["e1"]),
        helper.make_node("SequenceInsert", ["e1", "a", "zero"], ["e2"]),  # at the front
        helper.make_node("ConcatFromSequence", ["e2"], ["ab"], axis=0),
    ]
    m = save(tmp_path, nodes, [vi("x", F, [3, 4]), vi("a", F, [2, 2]), vi("b", F, [2, 2])],
             [vi("t", F, None), vi("aba", F, None), vi("ab", F, None)], [const_i64("zero", 0)])
    rng = np.random.default_rng(2)
    x, a, b = (rng.standard_normal(s).astype(np.float32) for s in [(3, 4), (2, 2), (2, 2)])
    o = predict(tmp_path, m, {"x": x, "a": a, "b": b})
    np.testing.assert_array_equal(o["t"], x.T)
    np.testing.assert_array_equal(o["aba"], np.concatenate([a, b, a], axis=1))
    np.testing.assert_array_equal(o["ab"], np.concatenate([a, b], axis=0))


def test_sequence_in_loop_and_map(tmp_path):
    """A sequence carried through a Loop (SequenceAt / SequenceInsert in the body, the
    trip count from SequenceLength) and SequenceMap over the same items."""
    body = helper.make_graph(
        [helper.make_node("SequenceAt", ["s", "i"], ["item"]),
         helper.make_node("ReduceSum", ["item", "ax0"], ["sum"], keepdims=1),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["sum", "fi"], ["scaled"]),
         helper.make_node("SequenceInsert", ["acc", "scaled"], ["acc2"]),
         helper.make_node("Identity", ["cond"], ["cond2"])],
        "body",
        [vi("i", I64, []), vi("cond", TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("acc", F, None)],
        [vi("cond2", TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("acc2", F, None)],
        initializer=[const_i64("ax0", [0])])
    map_body = helper.make_graph(
        [helper.make_node("Mul", ["item", "k"], ["y"]),
         helper.make_node("Shape", ["item"], ["shp"])],
        "map_body", [vi("item", F, None), vi("k", F, [])], [vi("y", F, None), vi("shp", I64, None)])
    nodes = [
        helper.make_node("SplitToSequence", ["x", "three"], ["s"], axis=0),
        helper.make_node("SequenceLength", ["s"], ["n"]),
        helper.make_node("SequenceEmpty", [], ["acc0"], dtype=F),
        helper.make_node("Loop", ["n", "", "acc0"], ["acc"], body=body),
        helper.make_node("ConcatFromSequence", ["acc"], ["sums"], axis=0),
        helper.make_node("SequenceMap", ["s", "k"], ["ys", "shapes"], body=map_body),
        helper.make_node("ConcatFromSequence", ["ys"], ["mapped"], axis=0),
        helper.make_node("ConcatFromSequence", ["shapes"], ["dims"], axis=0, new_axis=1),
    ]
    m = save(tmp_path, nodes, [vi("x", F, [8, 2]), vi("k", F, [])],
             [vi("sums", F, None), vi("mapped", F, None), vi("dims", I64, None)],
             [const_i64("three", 3)])
    x = np.random.default_rng(3).standard_normal((8, 2)).astype(np.float32)
    k = np.float32(-1.5)
    o = predict(tmp_path, m, {"x": x, "k": k})
    chunks = [x[0:3], x[3:6], x[6:8]]
    want = np.concatenate([c.sum(0, keepdims=True) * i for i, c in enumerate(chunks)])
    np.testing.assert_allclose(o["sums"], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(o["mapped"], x * k)
    np.testing.assert_array_equal(o["dims"], np.stack([np.array(c.shape) for c in chunks], axis=0))


def test_optional_through_if(tmp_path):
    """Optional with and without a value, chosen by an If; OptionalHasElement and
    OptionalGetElement read it."""
    then_g = helper.make_graph([helper.make_node("Optional", ["x"], ["o"])], "then", [],
                               [helper.make_value_info(
                                   "o", helper.make_optional_type_proto(
                                       helper.make_tensor_type_proto(F, None)))])
    else_g = helper.make_graph(
        [helper.make_node("Optional", [], ["o"],
                          type=helper.make_tensor_type_proto(F, None))], "else", [],
        [helper.make_value_info("o", helper.make_optional_type_proto(
            helper.make_tensor_type_proto(F, None)))])
    nodes = [helper.make_node("If", ["c"], ["opt"], then_branch=then_g, else_branch=else_g),
             helper.make_node("OptionalHasElement", ["opt"], ["has"]),
             helper.make_node("Optional", ["x"], ["full"]),
             helper.make_node("OptionalGetElement", ["full"], ["got"])]
    m = save(tmp_path, nodes, [vi("c", TensorProto.BOOL, []), vi("x", F, [3])],
             [vi("has", TensorProto.BOOL, []), vi("got", F, None)], opset=16)
    x = np.array([1, 2, 3], np.float32)
    for c in (True, False):
        o = predict(tmp_path, m, {"c": np.array(c), "x": x})
        assert bool(o["has"]) is c
        np.testing.assert_array_equal(o["got"], x)


def test_empty_optional_get_is_an_error(tmp_path):
    nodes = [helper.make_node("Optional", [], ["o"], type=helper.make_tensor_type_proto(F, None)),
             helper.make_node("OptionalGetElement", ["o"], ["y"], name="get")]
    m = save(tmp_path, nodes, [], [vi("y", F, None)], opset=16)
    r, _ = run(tmp_path, m, {})
    assert r.returncode != 0
    assert "OptionalGetElement node 'get'" in r.stderr and "empty" in r.stderr, r.stderr


@pytest.mark.parametrize("op,pos,ok", [
    ("SequenceAt", 2, True), ("SequenceAt", -3, True), ("SequenceAt", 3, False),
    ("SequenceAt", -4, False), ("SequenceErase", -3, True), ("SequenceErase", 3, False),
    ("SequenceInsert", 3, True), ("SequenceInsert", -3, True), ("SequenceInsert", 4, False),
    ("SequenceInsert", -4, False)])
def test_positions_are_bounds_checked(tmp_path, op, pos, ok):
    ins = {"SequenceAt": ["s", "p"], "SequenceErase": ["s", "p"],
           "SequenceInsert": ["s", "v", "p"]}[op]
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
             helper.make_node(op, ins, ["r"], name="pick")]
    if op != "SequenceAt":
        nodes.append(helper.make_node("ConcatFromSequence", ["r"], ["y"], axis=0))
    else:
        nodes.append(helper.make_node("Identity", ["r"], ["y"]))
    m = save(tmp_path, nodes, [vi("x", F, [3, 2]), vi("p", I64, []), vi("v", F, [1, 2])],
             [vi("y", F, None)])
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    v = np.full((1, 2), 9, np.float32)
    r, o = run(tmp_path, m, {"x": x, "p": np.array(pos, np.int64), "v": v})
    if not ok:
        assert r.returncode != 0
        assert f"{op} node 'pick'" in r.stderr and f"position {pos} is out of range" in r.stderr
        assert "Sanitizer" not in r.stderr
        return
    assert r.returncode == 0, r.stderr
    items = [x[i:i + 1] for i in range(3)]
    if op == "SequenceAt":
        want = items[pos]
    elif op == "SequenceErase":
        del items[pos]
        want = np.concatenate(items)
    else:
        items.insert(pos if pos >= 0 else pos + 3, v)
        want = np.concatenate(items)
    np.testing.assert_array_equal(o["y"], want)


def test_sequence_output_is_refused_by_predict(tmp_path):
    nodes = [helper.make_node("SplitToSequence", ["x"], ["seq_out"], axis=0)]
    m = save(tmp_path, nodes, [vi("x", F, [2, 2])],
             [helper.make_tensor_sequence_value_info("seq_out", F, None)])
    r, _ = run(tmp_path, m, {"x": np.zeros((2, 2), np.float32)})
    assert r.returncode != 0
    assert "output 'seq_out' is a sequence value" in r.stderr, r.stderr


if torch is not None:
    class ListInLoop(torch.nn.Module):
        def forward(self, x):
            parts = x.split(2, 0)
            outs = []
            for p in parts:
                outs.append(p.sum(0, keepdim=True) * 2.0 + p[0:1])
            return torch.cat(outs, 0)


def test_torch_list_in_scripted_loop(tmp_path):
    if torch is None:
        pytest.skip("PyTorch is not installed")
    m = torch.jit.script(ListInLoop())
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(0))
    p = tmp_path / "torch_list.onnx"
    torch.onnx.export(m, (x,), str(p), input_names=["x"], output_names=["y"], opset_version=13,
                      dynamic_axes={"x": {0: "n"}})
    ops = {n.op_type for n in onnx.load(str(p)).graph.node}
    assert {"SplitToSequence", "ConcatFromSequence", "Loop"} <= ops, ops
    for rows in (7, 4, 1):
        xi = torch.randn(rows, 3, generator=torch.Generator().manual_seed(rows))
        o = predict(tmp_path, p, {"x": xi.numpy()})
        np.testing.assert_allclose(o["y"], m(xi).numpy(), rtol=1e-5, atol=1e-6)
