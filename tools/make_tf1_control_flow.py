#!/usr/bin/python3
"""make_tf1_control_flow.py - SavedModels with TF1 control flow and TensorArrays, built by hand.

TensorFlow is not needed (nor installed): each saved_model.pb is written
field by field with the protobuf builders of tools/make_savedmodel_corpus.py,
laid out as TF1's tf.while_loop, tf.cond and TensorArray write them into
the main graph: a loop is a frame of Enter (frame_name, is_constant for
what the loop only reads), Merge(Enter, NextIteration), LoopCond,
Switch(Merge, LoopCond), Identity(Switch:1) for the body, NextIteration and
Exit(Switch:0); a conditional is Switch(pred, pred) with switch_t/switch_f
Identities, pred_id = Identity(pred), a Switch(x, pred_id) per value a branch
reads, constants control-dependent on switch_t/switch_f, and a Merge per
result. tests/python/test_tf1_control.py builds them into a temporary
folder, runs them with `kiln predict` and compares with the NumPy references
below (`*_ref`).

  counting     i = 0; while i < n: acc += i * x; i += 1 (x and n constant Enters)
  tensorarray  a loop writing x * i into a TensorArray (fixed size n) and into
               a dynamic_size one grown from size 0; after it Gather (stack),
               Read, Size, Concat, and a Split / Read of a third array
  cond         tf.cond(sum(x) > 0, x * 2 + 1, x - 1) and its Merge's value_index, and a
               second result of the same cond (x * 2 or x * x)
  nesting      a loop inside a cond branch, a cond inside a loop body, a loop
               inside a loop body and a cond inside a cond branch
  rnn          dynamic_rnn: x [T, B, F] unstacked (TensorArrayScatterV3) into
               an input array read each step, h = tanh(x_t W + h U + b)
               written to an output array, stacked after the loop
  bad_*        malformed frames, refused with a message naming the node (BAD)

Run `/usr/bin/python3 tools/make_tf1_control_flow.py OUT` to write each model
to OUT/<name>/saved_model.pb.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_savedmodel_corpus import (DT_BOOL, DT_FLOAT, DT_INT32, a_int, a_shape,  # noqa: E402
                                    a_tensor, a_type, f_len, node, placeholder, saved_model,
                                    signature, tensor, tensor_info)

F, I, B = DT_FLOAT, DT_INT32, DT_BOOL
DT_RESOURCE = 20


def a_bool(b):
    return bytes([5 << 3, 1 if b else 0])


def a_str(s):
    return f_len(2, s)


def c_f32(name, v, dims=None, ctl=()):
    vals = list(np.asarray(v, np.float32).ravel())
    dims = list(np.shape(v)) if dims is None else dims
    return node(name, "Const", ["^" + c for c in ctl], dtype=a_type(F),
                value=a_tensor(tensor(F, dims, floats=vals)))


def c_i32(name, v, ctl=()):
    vals = list(v) if isinstance(v, (list, tuple)) else [v]
    dims = [len(vals)] if isinstance(v, (list, tuple)) else []
    return node(name, "Const", ["^" + c for c in ctl], dtype=a_type(I),
                value=a_tensor(tensor(I, dims, ints=vals)))


def op(name, kind, inputs, t=F, **attrs):
    return node(name, kind, inputs, T=a_type(t), **attrs)


def sig(inputs, outputs):
    return {"serving_default": signature(
        {k: tensor_info(t, dt, dims) for k, (t, dt, dims) in inputs.items()},
        {k: tensor_info(t) for k, t in outputs.items()})}


def while_loop(p, loop_vars, consts, cond_fn, body_fn, frame=None, ctl_enter=False):
    """TF1's tf.while_loop under name scope p.

    loop_vars: [(initial tensor, dtype)]; consts: {key: (tensor, dtype)} read
    through constant Enters. cond_fn(vars, consts) -> (nodes, bool tensor);
    body_fn(vars, consts, pivot) -> (nodes, [next tensors]) where vars are
    the body's Identity(Switch:1) tensors and consts the Enter tensors.
    Returns (nodes, [Exit tensors])."""
    frame = frame or p + "/while_context"
    nodes, merges, cvals = [], [], {}
    for i, (init, dt) in enumerate(loop_vars):
        nodes.append(op(f"{p}/Enter_{i}", "Enter", [init], t=dt, frame_name=a_str(frame),
                        is_constant=a_bool(False), parallel_iterations=a_int(10)))
        nodes.append(op(f"{p}/Merge_{i}", "Merge", [f"{p}/Enter_{i}", f"{p}/NextIteration_{i}"],
                        t=dt, N=a_int(2)))
        merges.append(f"{p}/Merge_{i}")
    for k, (t, dt) in consts.items():
        nodes.append(op(f"{p}/Enter_{k}", "Enter", [t], t=dt, frame_name=a_str(frame),
                        is_constant=a_bool(True), parallel_iterations=a_int(10)))
        cvals[k] = f"{p}/Enter_{k}"
    cn, pred = cond_fn(merges, cvals)
    nodes += cn
    nodes.append(node(f"{p}/LoopCond", "LoopCond", [pred]))
    ids = []
    for i, (_, dt) in enumerate(loop_vars):
        nodes.append(op(f"{p}/Switch_{i}", "Switch", [merges[i], f"{p}/LoopCond"], t=dt))
        nodes.append(op(f"{p}/Identity_{i}", "Identity", [f"{p}/Switch_{i}:1"], t=dt))
        ids.append(f"{p}/Identity_{i}")
    bn, nexts = body_fn(ids, cvals, f"{p}/Identity_0")
    nodes += bn
    exits = []
    for i, (_, dt) in enumerate(loop_vars):
        nodes.append(op(f"{p}/NextIteration_{i}", "NextIteration", [nexts[i]], t=dt))
        nodes.append(op(f"{p}/Exit_{i}", "Exit", [f"{p}/Switch_{i}"], t=dt))
        exits.append(f"{p}/Exit_{i}")
    return nodes, exits


def cond(p, pred, inputs, true_fn, false_fn, dt=F):
    """TF1's tf.cond under name scope p. inputs: [(tensor, dtype)] the branches
    read; true_fn / false_fn(switched inputs, pivot) -> (nodes, result).
    Returns (nodes, Merge name)."""
    nodes = [op(f"{p}/Switch", "Switch", [pred, pred], t=B),
             op(f"{p}/switch_t", "Identity", [f"{p}/Switch:1"], t=B),
             op(f"{p}/switch_f", "Identity", [f"{p}/Switch"], t=B),
             op(f"{p}/pred_id", "Identity", [pred], t=B)]
    ts, fs = [], []
    for k, (x, xdt) in enumerate(inputs):
        nodes.append(op(f"{p}/Switch_{k + 1}", "Switch", [x, f"{p}/pred_id"], t=xdt))
        ts.append(f"{p}/Switch_{k + 1}:1")
        fs.append(f"{p}/Switch_{k + 1}")
    tn, tout = true_fn(ts, f"{p}/switch_t")
    fn, fout = false_fn(fs, f"{p}/switch_f")
    nodes += tn + fn
    nodes.append(op(f"{p}/Merge", "Merge", [fout, tout], t=dt, N=a_int(2)))
    return nodes, f"{p}/Merge"


def ta_attrs(dynamic=False, elem=None):
    return dict(dtype=a_type(F), element_shape=a_shape(elem, unknown_rank=elem is None),
                dynamic_size=a_bool(dynamic), clear_after_read=a_bool(True),
                identical_element_shapes=a_bool(True), tensor_array_name=a_str(""))


# ---------------------------------------------------------------- models


def counting():
    def c(v, k):
        return [op("w/Less", "Less", [v[0], k["n"]], t=I)], "w/Less"

    def b(v, k, pivot):
        return [c_i32("w/one", 1, ctl=[pivot]),
                op("w/fi", "Cast", [v[0]], t=I, SrcT=a_type(I), DstT=a_type(F)),
                op("w/xi", "Mul", [k["x"], "w/fi"]),
                op("w/acc", "AddV2", [v[1], "w/xi"]),
                op("w/add", "AddV2", [v[0], "w/one"], t=I)], ["w/add", "w/acc"]

    loop, exits = while_loop("w", [("i0", I), ("acc0", F)], {"x": ("x", F), "n": ("n", I)}, c, b)
    nodes = [placeholder("x", F, [-1]), placeholder("n", I, []), c_i32("i0", 0),
             c_f32("zero_f", 0.0), op("acc0", "Mul", ["x", "zero_f"])] + loop
    return saved_model(nodes, sig({"x": ("x:0", F, [-1]), "n": ("n:0", I, [])},
                                  {"i": exits[0] + ":0", "acc": exits[1] + ":0"}))


def counting_ref(x, n):
    acc = x * np.float32(0)
    for i in range(n):
        acc = acc + x * np.float32(i)
    return {"i": np.int32(max(n, 0)), "acc": acc}


def tensorarray():
    def c(v, k):
        return [op("w/Less", "Less", [v[0], k["n"]], t=I)], "w/Less"

    def b(v, k, pivot):
        return [op("w/fi", "Cast", [v[0]], t=I, SrcT=a_type(I), DstT=a_type(F)),
                op("w/xi", "Mul", [k["x"], "w/fi"]),
                node("w/write", "TensorArrayWriteV3", [k["ta"], v[0], "w/xi", v[1]], T=a_type(F)),
                node("w/write_dyn", "TensorArrayWriteV3", [k["dyn"], v[0], "w/xi", v[2]],
                     T=a_type(F)),
                c_i32("w/one", 1, ctl=[pivot]),
                op("w/add", "AddV2", [v[0], "w/one"], t=I)], ["w/add", "w/write", "w/write_dyn"]

    loop, exits = while_loop("w", [("i0", I), ("ta:1", F), ("dyn:1", F)],
                             {"x": ("x", F), "n": ("n", I), "ta": ("ta", DT_RESOURCE),
                              "dyn": ("dyn", DT_RESOURCE)}, c, b)
    split_len = node("split_len", "Const", dtype=a_type(9),
                     value=a_tensor(tensor(9, [3], int64s=[2, 2, 2])))
    nodes = [placeholder("x", F, [3]), placeholder("n", I, []), c_i32("i0", 0), c_i32("zero", 0),
             node("ta", "TensorArrayV3", ["n"], **ta_attrs()),
             node("dyn", "TensorArrayV3", ["zero"], **ta_attrs(dynamic=True)),
             ] + loop + [
             node("size", "TensorArraySizeV3", ["ta", exits[1]]),
             c_i32("start", 0), c_i32("step", 1),
             node("range", "Range", ["start", "size", "step"], Tidx=a_type(I)),
             node("stack", "TensorArrayGatherV3", ["ta", "range", exits[1]], dtype=a_type(F),
                  element_shape=a_shape([3])),
             c_i32("pick", [1, 0]),
             node("gathered", "TensorArrayGatherV3", ["dyn", "pick", exits[2]], dtype=a_type(F),
                  element_shape=a_shape(None, unknown_rank=True)),
             c_i32("last_off", 1),
             op("last", "Sub", ["n", "last_off"], t=I),
             node("read", "TensorArrayReadV3", ["dyn", "last", exits[2]], dtype=a_type(F)),
             node("dyn_size", "TensorArraySizeV3", ["dyn", exits[2]]),
             node("concat", "TensorArrayConcatV3", ["ta", exits[1]], dtype=a_type(F),
                  element_shape_except0=a_shape(None, unknown_rank=True)),
             node("close", "TensorArrayCloseV3", ["ta"]),
             # split x6 = [x, 2x] reshaped [6, 1]... as 3 elements of 2 rows
             c_i32("three", 3),
             node("split_ta", "TensorArrayV3", ["three"], **ta_attrs()),
             op("x2", "Mul", ["x", "x"]),
             node("x6", "ConcatV2", ["x", "x2", "zero"], T=a_type(F), N=a_int(2), Tidx=a_type(I)),
             c_i32("col", [6, 1]),
             node("x61", "Reshape", ["x6", "col"], T=a_type(F), Tshape=a_type(I)),
             split_len,
             node("split", "TensorArraySplitV3", ["split_ta", "x61", "split_len", "split_ta:1"],
                  T=a_type(F)),
             c_i32("two", 2),
             node("split_read", "TensorArrayReadV3", ["split_ta", "two", "split"], dtype=a_type(F)),
             ]
    return saved_model(nodes, sig({"x": ("x:0", F, [3]), "n": ("n:0", I, [])},
                                  {"stack": "stack:0", "gathered": "gathered:0", "read": "read:0",
                                   "size": "size:0", "dyn_size": "dyn_size:0",
                                   "concat": "concat:0", "lengths": "concat:1",
                                   "split_read": "split_read:0"}))


def tensorarray_ref(x, n):
    ys = np.stack([x * np.float32(i) for i in range(n)])
    x6 = np.concatenate([x, x * x]).reshape(6, 1)
    return {"stack": ys, "gathered": ys[[1, 0]], "read": ys[n - 1], "size": np.int32(n),
            "dyn_size": np.int32(n), "concat": ys.reshape(-1), "lengths": np.full(n, 3, np.int64),
            "split_read": x6[4:6]}


def cond_model():
    def t(s, pivot):
        return [c_f32("c/two", 2.0, ctl=[pivot]), c_f32("c/one", 1.0, ctl=[pivot]),
                op("c/mul", "Mul", [s[0], "c/two"]), op("c/add", "AddV2", ["c/mul", "c/one"])], "c/add"

    def f(s, pivot):
        return [c_f32("c/one_f", 1.0, ctl=[pivot]), op("c/sub", "Sub", [s[0], "c/one_f"])], "c/sub"

    c_nodes, merge = cond("c", "pos", [("x", F)], t, f)
    # a second result of the same cond (tf.cond returning a pair): its own Merge over the
    # same Switches, true x * 2, false x * x
    c_nodes += [op("c/sq", "Mul", ["c/Switch_1", "c/Switch_1"]),
                op("c/Merge_1", "Merge", ["c/sq", "c/mul"], N=a_int(2))]
    nodes = [placeholder("x", F, [-1]), c_i32("axis", [0]),
             node("sum", "Sum", ["x", "axis"], T=a_type(F), Tidx=a_type(I), keep_dims=a_bool(False)),
             c_f32("zero", 0.0), op("pos", "Greater", ["sum", "zero"])] + c_nodes + [
             op("y", "Identity", [merge])]
    return saved_model(nodes, sig({"x": ("x:0", F, [-1])},
                                  {"y": "y:0", "branch": merge + ":1", "second": "c/Merge_1:0"}))


def cond_ref(x):
    pos = x.sum() > 0
    return {"y": x * np.float32(2) + np.float32(1) if pos else x - np.float32(1),
            "branch": np.int32(1 if pos else 0), "second": x * np.float32(2) if pos else x * x}


def nesting():
    # (a) a loop inside a cond branch: x > 0 ? sum over i < n of x * i : -x
    def t(s, pivot):
        def lc(v, k):
            return [op("a/w/Less", "Less", [v[0], k["n"]], t=I)], "a/w/Less"

        def lb(v, k, pv):
            return [op("a/w/fi", "Cast", [v[0]], t=I, SrcT=a_type(I), DstT=a_type(F)),
                    op("a/w/xi", "Mul", [k["x"], "a/w/fi"]),
                    op("a/w/acc", "AddV2", [v[1], "a/w/xi"]),
                    c_i32("a/w/one", 1, ctl=[pv]),
                    op("a/w/add", "AddV2", [v[0], "a/w/one"], t=I)], ["a/w/add", "a/w/acc"]
        ln, ex = while_loop("a/w", [("a/i0", I), ("a/acc0", F)], {"x": (s[0], F), "n": (s[1], I)},
                            lc, lb)
        return [c_i32("a/i0", 0, ctl=[pivot]), c_f32("a/acc0", 0.0, ctl=[pivot])] + ln, ex[1]

    def f(s, pivot):
        return [op("a/neg", "Neg", [s[0]])], "a/neg"

    a_nodes, a_merge = cond("a", "pos", [("x", F), ("n", I)], t, f)

    # (b) a cond inside a loop body: n times, acc = acc < 10 ? acc + x : acc / 2
    def bc(v, k):
        return [op("b/Less", "Less", [v[0], k["n"]], t=I)], "b/Less"

    def bb(v, k, pivot):
        def bt(s, pv):
            return [op("b/c/add", "AddV2", [s[0], s[1]])], "b/c/add"

        def bf(s, pv):
            return [c_f32("b/c/half", 0.5, ctl=[pv]), op("b/c/mul", "Mul", [s[0], "b/c/half"])], "b/c/mul"
        cn, m = cond("b/c", "b/small", [(v[1], F), (k["x"], F)], bt, bf)
        return [c_f32("b/ten", 10.0, ctl=[pivot]), op("b/small", "Less", [v[1], "b/ten"])] + cn + [
            c_i32("b/one", 1, ctl=[pivot]), op("b/add", "AddV2", [v[0], "b/one"], t=I)], ["b/add", m]

    b_nodes, b_ex = while_loop("b", [("i0", I), ("zero", F)], {"x": ("x", F), "n": ("n", I)}, bc, bb)

    # (c) a loop inside a loop body: for i < n: for j < i: cnt += 1
    def oc(v, k):
        return [op("o/Less", "Less", [v[0], k["n"]], t=I)], "o/Less"

    def ob(v, k, pivot):
        def ic(iv, ik):
            return [op("o/in/Less", "Less", [iv[0], ik["i"]], t=I)], "o/in/Less"

        def ib(iv, ik, pv):
            return [c_i32("o/in/one", 1, ctl=[pv]),
                    op("o/in/j1", "AddV2", [iv[0], "o/in/one"], t=I),
                    op("o/in/c1", "AddV2", [iv[1], "o/in/one"], t=I)], ["o/in/j1", "o/in/c1"]
        inn, iex = while_loop("o/in", [("o/j0", I), (v[1], I)], {"i": (v[0], I)}, ic, ib)
        return [c_i32("o/j0", 0, ctl=[pivot]), c_i32("o/one", 1, ctl=[pivot])] + inn + [
            op("o/i1", "AddV2", [v[0], "o/one"], t=I)], ["o/i1", iex[1]]

    o_nodes, o_ex = while_loop("o", [("i0", I), ("i0", I)], {"n": ("n", I)}, oc, ob)

    # (d) a cond inside a cond branch: x > 0 ? (n > 2 ? x * 3 : x + 5) : -x
    def dt(s, pivot):
        def it(t, pv):
            return [c_f32("d/in/three", 3.0, ctl=[pv]), op("d/in/mul", "Mul", [t[0], "d/in/three"])], \
                "d/in/mul"

        def ie(t, pv):
            return [c_f32("d/in/five", 5.0, ctl=[pv]), op("d/in/add", "AddV2", [t[0], "d/in/five"])], \
                "d/in/add"
        inner, m = cond("d/in", "d/big", [(s[0], F)], it, ie)
        return [c_i32("d/two", 2, ctl=[pivot]), op("d/big", "Greater", [s[1], "d/two"], t=I)] + inner, m

    def de(s, pivot):
        return [op("d/neg", "Neg", [s[0]])], "d/neg"

    d_nodes, d_merge = cond("d", "pos", [("x", F), ("n", I)], dt, de)
    nodes = [placeholder("x", F, []), placeholder("n", I, []), c_f32("zero", 0.0), c_i32("i0", 0),
             op("pos", "Greater", ["x", "zero"])] + a_nodes + b_nodes + o_nodes + d_nodes
    return saved_model(nodes, sig({"x": ("x:0", F, []), "n": ("n:0", I, [])},
                                  {"branch": a_merge + ":0", "alternating": b_ex[1] + ":0",
                                   "triangle": o_ex[1] + ":0", "cond_in_cond": d_merge + ":0"}))


def nesting_ref(x, n):
    x = np.float32(x)
    branch = np.float32(sum((x * np.float32(i) for i in range(n)), np.float32(0))) if x > 0 else -x
    acc = np.float32(0)
    for _ in range(n):
        acc = acc + x if acc < 10 else acc * np.float32(0.5)
    return {"branch": np.float32(branch), "alternating": np.float32(acc),
            "triangle": np.int32(sum(range(max(n, 0)))),
            "cond_in_cond": np.float32((x * 3 if n > 2 else x + 5) if x > 0 else -x)}


RNN_F, RNN_H = 2, 3


def rnn_weights(seed=5):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((RNN_F, RNN_H)).astype(np.float32) * 0.5,
            rng.standard_normal((RNN_H, RNN_H)).astype(np.float32) * 0.5,
            rng.standard_normal(RNN_H).astype(np.float32) * 0.1)


def rnn():
    """dynamic_rnn's loop: time-major x [T, B, F], h0 [B, H]."""
    w, u, bias = rnn_weights()

    def c(v, k):
        return [op("rnn/w/Less", "Less", [v[0], k["steps"]], t=I)], "rnn/w/Less"

    def b(v, k, pivot):
        return [node("rnn/w/xt", "TensorArrayReadV3", [k["in_ta"], v[0], k["in_flow"]],
                     dtype=a_type(F)),
                node("rnn/w/xw", "MatMul", ["rnn/w/xt", k["W"]], T=a_type(F)),
                node("rnn/w/hu", "MatMul", [v[2], k["U"]], T=a_type(F)),
                op("rnn/w/s", "AddV2", ["rnn/w/xw", "rnn/w/hu"]),
                node("rnn/w/sb", "BiasAdd", ["rnn/w/s", k["b"]], T=a_type(F)),
                op("rnn/w/h", "Tanh", ["rnn/w/sb"]),
                node("rnn/w/write", "TensorArrayWriteV3", [k["out_ta"], v[0], "rnn/w/h", v[1]],
                     T=a_type(F)),
                c_i32("rnn/w/one", 1, ctl=[pivot]),
                op("rnn/w/t1", "AddV2", [v[0], "rnn/w/one"], t=I)], \
            ["rnn/w/t1", "rnn/w/write", "rnn/w/h"]

    loop, exits = while_loop(
        "rnn/w", [("rnn/time", I), ("rnn/out_ta:1", F), ("h0", F)],
        {"steps": ("rnn/steps", I), "in_ta": ("rnn/in_ta", DT_RESOURCE),
         "in_flow": ("rnn/unstack", F), "out_ta": ("rnn/out_ta", DT_RESOURCE),
         "W": ("W", F), "U": ("U", F), "b": ("b", F)}, c, b)
    nodes = [placeholder("x", F, [-1, -1, RNN_F]), placeholder("h0", F, [-1, RNN_H]),
             c_f32("W", w), c_f32("U", u), c_f32("b", bias),
             node("rnn/shape", "Shape", ["x"], T=a_type(F), out_type=a_type(I)),
             c_i32("rnn/b0", [0]), c_i32("rnn/b1", [1]),
             node("rnn/steps", "StridedSlice", ["rnn/shape", "rnn/b0", "rnn/b1", "rnn/b1"],
                  T=a_type(I), Index=a_type(I), shrink_axis_mask=a_int(1)),
             node("rnn/in_ta", "TensorArrayV3", ["rnn/steps"], **ta_attrs(elem=[-1, RNN_F])),
             node("rnn/out_ta", "TensorArrayV3", ["rnn/steps"], **ta_attrs(elem=[-1, RNN_H])),
             c_i32("rnn/zero", 0), c_i32("rnn/one", 1),
             node("rnn/range", "Range", ["rnn/zero", "rnn/steps", "rnn/one"], Tidx=a_type(I)),
             node("rnn/unstack", "TensorArrayScatterV3", ["rnn/in_ta", "rnn/range", "x",
                                                          "rnn/in_ta:1"], T=a_type(F)),
             c_i32("rnn/time", 0)] + loop + [
             node("rnn/size", "TensorArraySizeV3", ["rnn/out_ta", exits[1]]),
             node("rnn/range2", "Range", ["rnn/zero", "rnn/size", "rnn/one"], Tidx=a_type(I)),
             node("rnn/stack", "TensorArrayGatherV3", ["rnn/out_ta", "rnn/range2", exits[1]],
                  dtype=a_type(F), element_shape=a_shape([-1, RNN_H]))]
    return saved_model(nodes, sig({"x": ("x:0", F, [-1, -1, RNN_F]), "h0": ("h0:0", F, [-1, RNN_H])},
                                  {"outputs": "rnn/stack:0", "state": exits[2] + ":0"}))


def rnn_ref(x, h0):
    w, u, b = (a.astype(np.float64) for a in rnn_weights())
    h, outs = h0.astype(np.float64), []
    for t in range(x.shape[0]):
        h = np.tanh(x[t].astype(np.float64) @ w + h @ u + b)
        outs.append(h)
    return {"outputs": np.stack(outs).astype(np.float32), "state": h.astype(np.float32)}


# ------------------------------------------------ malformed: refused, naming the node


def _counter(frame_x=None, dangling_next=False, loop_cond=True):
    def c(v, k):
        return [op("w/Less", "Less", [v[0], "n"], t=I)], "w/Less"

    def b(v, k, pivot):
        return [op("w/xi", "Mul", [k["x"], v[1]]), c_i32("w/one", 1, ctl=[pivot]),
                op("w/add", "AddV2", [v[0], "w/one"], t=I)], ["w/add", "w/xi"]

    loop, exits = while_loop("w", [("i0", I), ("one_f", F)], {"x": ("x", F)}, c, b)
    fixed = []
    for nd in loop:
        if frame_x and nd.startswith(f_len(1, "w/Enter_x")):
            nd = op("w/Enter_x", "Enter", ["x"], frame_name=a_str(frame_x), is_constant=a_bool(True))
        if dangling_next and nd.startswith(f_len(1, "w/Merge_1")):
            nd = op("w/Merge_1", "Merge", ["w/Enter_1", "w/Enter_1"], N=a_int(2))
        if not loop_cond and nd.startswith(f_len(1, "w/LoopCond")):
            nd = op("w/LoopCond", "Identity", ["w/Less"], t=B)
        fixed.append(nd)
    nodes = [placeholder("x", F, []), placeholder("n", I, []), c_i32("i0", 0),
             c_f32("one_f", 1.0)] + fixed
    return saved_model(nodes, sig({"x": ("x:0", F, []), "n": ("n:0", I, [])},
                                  {"y": exits[1] + ":0"}))


def bad_exit_without_enter():
    nodes = [placeholder("x", F, []), op("lost_exit", "Exit", ["x"]), op("y", "Identity", ["lost_exit"])]
    return saved_model(nodes, sig({"x": ("x:0", F, [])}, {"y": "y:0"}))


def bad_merge_three_way():
    def t(s, pivot):
        return [op("c/neg", "Neg", [s[0]])], "c/neg"

    def f(s, pivot):
        return [op("c/abs", "Abs", [s[0]])], "c/abs"
    cn, m = cond("c", "pos", [("x", F)], t, f)
    cn[-1] = op("c/Merge", "Merge", ["c/abs", "c/neg", "x"], N=a_int(3))
    nodes = [placeholder("x", F, []), c_f32("zero", 0.0), op("pos", "Greater", ["x", "zero"])] + cn
    return saved_model(nodes, sig({"x": ("x:0", F, [])}, {"y": m + ":0"}))


def bad_switch_alone():
    nodes = [placeholder("x", F, []), c_f32("zero", 0.0), op("pos", "Greater", ["x", "zero"]),
             op("sw", "Switch", ["x", "pos"])]
    return saved_model(nodes, sig({"x": ("x:0", F, [])}, {"y": "sw:1"}))


def bad_split_unequal():
    lens = node("lens", "Const", dtype=a_type(9), value=a_tensor(tensor(9, [2], int64s=[1, 2])))
    nodes = [placeholder("x", F, [3]), c_i32("two", 2), c_i32("one", 1), lens,
             node("ta", "TensorArrayV3", ["two"], **ta_attrs()),
             node("split", "TensorArraySplitV3", ["ta", "x", "lens", "ta:1"], T=a_type(F)),
             node("y", "TensorArrayReadV3", ["ta", "one", "split"], dtype=a_type(F))]
    return saved_model(nodes, sig({"x": ("x:0", F, [3])}, {"y": "y:0"}))


BAD = {  # name: (bytes, pattern the one-line error must match)
    "bad_exit_without_enter": (bad_exit_without_enter(),
                               r"node 'lost_exit' \(op Exit\).*not inside a while loop"),
    "bad_mismatched_frames": (_counter(frame_x="other_frame"),
                              r"node 'w/xi' \(op Mul\).*two different while loops.*other_frame"),
    "bad_next_iteration_without_merge": (_counter(dangling_next=True),
                                         r"node 'w/NextIteration_1' \(op NextIteration\).*feeds no "
                                         r"Merge"),
    "bad_no_loop_cond": (_counter(loop_cond=False),
                         r"node 'w/Enter_0' \(op Enter\).*no LoopCond"),
    "bad_merge_three_way": (bad_merge_three_way(), r"node 'c/Merge' \(op Merge\).*3 data inputs"),
    "bad_switch_alone": (bad_switch_alone(), r"node 'sw' \(op Switch\).*outside"),
    "bad_split_unequal": (bad_split_unequal(), r"node 'split' \(op TensorArraySplitV3\).*lengths 1 "
                                               r"and 2 differ"),
}

MODELS = {"counting": counting, "tensorarray": tensorarray, "cond": cond_model,
          "nesting": nesting, "rnn": rnn}


def write(out, name, data):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "saved_model.pb"), "wb") as f:
        f.write(data)
    return d


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_tf1_control_flow.py OUT")
    for name, fn in MODELS.items():
        write(sys.argv[1], name, fn())
    for name, (data, _) in BAD.items():
        write(sys.argv[1], name, data)
    print("wrote %d models to %s" % (len(MODELS) + len(BAD), sys.argv[1]))


if __name__ == "__main__":
    main()
