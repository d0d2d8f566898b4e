#!/usr/bin/python3
"""make_tf_control_flow.py - SavedModels with TF2 control flow and TensorLists, built by hand.

TensorFlow is not needed (nor installed): each model is a saved_model.pb
written field by field with the protobuf builders of
tools/make_savedmodel_corpus.py, laid out the way TF2 writes them (cond,
body and branch functions in the function library; "node:output:index"
references inside function bodies; loop variables in While's T list).
tests/python/test_tf_control_flow.py builds them into a temporary folder,
runs them with `kiln predict` and compares with the NumPy references below.

  while_tensorlist  an RNN-shaped StatelessWhile over TensorLists:
                    h = tanh(0.5 h + x[t]) for t < TensorListLength(x), each
                    h set into a list reserved with an unknown element
                    shape; outputs Stack, Gather, Length and ElementShape
                    of that list and the last h.
  if_loop_nesting   a While inside an If branch (x > 0: sum of x * i for
                    i < n, else -x), an If inside a While body (n times:
                    acc < 10 ? acc + x : acc / 2) and a While inside a While
                    body (the sum of i for i < n).
  list_append       a Python-style loop filling a dynamically sized
                    TensorArray (EmptyTensorList, SetItem with resize) and a
                    list grown with PushBack.
  case              Case(index; x * (k + 1) + k for branches k = 0..4); an
                    index out of range runs the last branch.
  keras_rnn         a Keras LSTM or GRU layer's loop as Keras writes it (Kiln
                    replaces it by its LSTM / GRU op), or with one extra loop
                    variable so that it runs as written.
  simple_rnn        a Keras SimpleRNN layer's loop, alone or as a
                    Bidirectional pair (runs as a Loop on plans).
  mask=True         (simple_rnn, keras_rnn) the layer after Masking(0.):
                    a bool mask TensorList and SelectV2 of output and state,
                    as Keras' backend.rnn writes it (never fused).
  bad_*             malformed loops and branches that must be refused with
                    a message naming the node (see BAD).

Run `/usr/bin/python3 tools/make_tf_control_flow.py OUT` to write each model
to OUT/<name>/saved_model.pb.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_savedmodel_corpus import (DT_BOOL, DT_FLOAT, DT_INT32, a_func, a_int, a_shape,  # noqa: E402
                                    a_tensor, a_type, a_types, f_len, function, node,
                                    placeholder, saved_model, shape, signature, tensor,
                                    tensor_info)

DT_VARIANT = 21
F, I, B, V = DT_FLOAT, DT_INT32, DT_BOOL, DT_VARIANT


def c_f32(name, v):
    return node(name, "Const", dtype=a_type(F), value=a_tensor(tensor(F, [], floats=[v])))


def c_i32(name, v):
    vals = list(v) if isinstance(v, (list, tuple)) else [v]
    dims = [len(vals)] if isinstance(v, (list, tuple)) else []
    return node(name, "Const", dtype=a_type(I), value=a_tensor(tensor(I, dims, ints=vals)))


def op(name, kind, inputs, t=F, **attrs):
    return node(name, kind, inputs, T=a_type(t), **attrs)


def shapes(*dims):
    """A list(shape) attr; None is an unknown rank."""
    return f_len(1, b"".join(f_len(7, shape(d, unknown_rank=d is None)) for d in dims))


def funcs(*names):
    return f_len(1, b"".join(f_len(9, f_len(1, n)) for n in names))


def while_node(name, kind, inputs, types, cond, body, out_shapes):
    return node(name, kind, inputs, T=a_types(types), cond=a_func(cond), body=a_func(body),
                output_shapes=shapes(*out_shapes), parallel_iterations=a_int(10))


def sig(inputs, outputs):
    """inputs: {alias: (tensor, dtype, dims)}; outputs: {alias: tensor}."""
    return {"serving_default": signature(
        {k: tensor_info(t, dt, dims) for k, (t, dt, dims) in inputs.items()},
        {k: tensor_info(t) for k, t in outputs.items()})}


def list_attrs(**extra):
    return dict(element_dtype=a_type(F), **extra)


# ---------------------------------------------------------------- models


def while_tensorlist():
    loop_types = [I, F, V, V]
    args = [("t", I), ("h", F), ("out", V), ("inp", V)]
    cond = function("cond_rnn", args, [("c", B)], [
        node("len", "TensorListLength", ["inp"]),
        op("less", "Less", ["t", "len:length:0"], t=I),
    ], {"c": "less:z:0"})
    body = function("body_rnn", args, [(n + "_1", t) for n, t in args], [
        c_i32("es", [-1, -1]),
        node("xt", "TensorListGetItem", ["inp", "t", "es:output:0"], **list_attrs()),
        c_f32("half", 0.5),
        op("hh", "Mul", ["h", "half:output:0"]),
        op("s", "AddV2", ["hh:z:0", "xt:item:0"]),
        op("h1", "Tanh", ["s:z:0"]),
        node("out1", "TensorListSetItem", ["out", "t", "h1:y:0"], **list_attrs()),
        c_i32("one", 1),
        op("t1", "AddV2", ["t", "one:output:0"], t=I),
        op("inp1", "Identity", ["inp"], t=V),
    ], {"t_1": "t1:z:0", "h_1": "h1:y:0", "out_1": "out1:output_handle:0",
        "inp_1": "inp1:output:0"})
    nodes = [
        placeholder("x", F, [-1, -1, -1]),
        placeholder("h0", F, [-1, -1]),
        c_i32("es", [-1, -1]),
        node("ta_in", "TensorListFromTensor", ["x", "es"], shape_type=a_type(I), **list_attrs()),
        node("n", "TensorListLength", ["ta_in"]),
        c_i32("unknown", -1),
        node("ta_out", "TensorListReserve", ["unknown", "n"], shape_type=a_type(I), **list_attrs()),
        c_i32("t0", 0),
        while_node("w", "StatelessWhile", ["t0", "h0", "ta_out", "ta_in"], loop_types,
                   "cond_rnn", "body_rnn", [[], [-1, -1], None, None]),
        node("y", "TensorListStack", ["w:2", "es"], num_elements=a_int(-1), **list_attrs()),
        c_i32("pick", [1, 0]),
        node("g", "TensorListGather", ["w:2", "pick", "es"], **list_attrs()),
        node("len", "TensorListLength", ["w:2"]),
        node("eshape", "TensorListElementShape", ["w:2"], shape_type=a_type(I)),
    ]
    return saved_model(nodes, sig(
        {"x": ("x:0", F, [-1, -1, -1]), "h0": ("h0:0", F, [-1, -1])},
        {"y": "y:0", "h": "w:1", "gathered": "g:0", "length": "len:0", "element_shape": "eshape:0"}),
        [cond, body])


def while_tensorlist_ref(x, h0):
    h, ys = h0, []
    for t in range(x.shape[0]):
        h = np.tanh(0.5 * h + x[t])
        ys.append(h)
    y = np.stack(ys)
    return {"y": y, "h": h, "gathered": y[[1, 0]], "length": np.int32(len(ys)),
            "element_shape": np.array(h.shape, np.int32)}


def list_append():
    """A tf.function Python loop collecting values: `for i in range(n)` writes x * i
    into a dynamically sized TensorArray (EmptyTensorList + SetItem with
    resize_if_index_out_of_bounds) and appends it to a list (PushBack)."""
    args = [("i", I), ("n", I), ("ta", V), ("pb", V), ("x", F)]
    cond = function("cond_append", args, [("c", B)],
                    [op("less", "Less", ["i", "n"], t=I)], {"c": "less:z:0"})
    body = function("body_append", args, [(n + "_1", t) for n, t in args], [
        op("fi", "Cast", ["i"], t=I, SrcT=a_type(I), DstT=a_type(F)),
        op("xi", "Mul", ["x", "fi:y:0"]),
        node("ta1", "TensorListSetItem", ["ta", "i", "xi:z:0"],
             resize_if_index_out_of_bounds=a_bool(True), **list_attrs()),
        node("pb1", "TensorListPushBack", ["pb", "xi:z:0"], **list_attrs()),
        c_i32("one", 1),
        op("i1", "AddV2", ["i", "one:output:0"], t=I),
    ], {"i_1": "i1:z:0", "n_1": "n", "ta_1": "ta1:output_handle:0",
        "pb_1": "pb1:output_handle:0", "x_1": "x"})
    nodes = [
        placeholder("x", F, [-1]), placeholder("n", I, []),
        c_i32("unknown", -1), c_i32("i0", 0),
        node("ta0", "EmptyTensorList", ["unknown", "unknown"], shape_type=a_type(I), **list_attrs()),
        node("pb0", "EmptyTensorList", ["unknown", "unknown"], shape_type=a_type(I), **list_attrs()),
        while_node("w", "While", ["i0", "n", "ta0", "pb0", "x"], [I, I, V, V, F], "cond_append",
                   "body_append", [[], [], None, None, [-1]]),
        c_i32("es", [-1]),
        node("written", "TensorListStack", ["w:2", "es"], num_elements=a_int(-1), **list_attrs()),
        node("appended", "TensorListStack", ["w:3", "es"], num_elements=a_int(-1), **list_attrs()),
        node("len", "TensorListLength", ["w:3"]),
    ]
    return saved_model(nodes, sig({"x": ("x:0", F, [-1]), "n": ("n:0", I, [])},
                                  {"written": "written:0", "appended": "appended:0",
                                   "length": "len:0"}), [cond, body])


def list_append_ref(x, n):
    ys = np.stack([x * np.float32(i) for i in range(n)])
    return {"written": ys, "appended": ys, "length": np.int32(n)}


def a_bool(b):
    """A bool attr (AttrValue.b, field 5)."""
    return bytes([5 << 3, 1 if b else 0])


def if_loop_nesting():
    # then: acc = sum over i < n of x * i (a While inside the branch); else: -x
    wargs = [("i", I), ("acc", F), ("x", F), ("n", I)]
    cond_sum = function("cond_sum", wargs, [("c", B)],
                        [op("less", "Less", ["i", "n"], t=I)], {"c": "less:z:0"})
    body_sum = function("body_sum", wargs, [(n + "_1", t) for n, t in wargs], [
        op("fi", "Cast", ["i"], t=I, SrcT=a_type(I), DstT=a_type(F)),
        op("xi", "Mul", ["x", "fi:y:0"]),
        op("acc1", "AddV2", ["acc", "xi:z:0"]),
        c_i32("one", 1),
        op("i1", "AddV2", ["i", "one:output:0"], t=I),
        op("xid", "Identity", ["x"]),
    ], {"i_1": "i1:z:0", "acc_1": "acc1:z:0", "x_1": "xid:output:0", "n_1": "n"})
    then_b = function("then_sum", [("x", F), ("n", I)], [("y", F)], [
        c_i32("zero", 0), c_f32("fzero", 0.0),
        while_node("loop", "StatelessWhile", ["zero:output:0", "fzero:output:0", "x", "n"],
                   [I, F, F, I], "cond_sum", "body_sum", [[], [], [], []]),
    ], {"y": "loop:output:1"})
    else_b = function("else_neg", [("x", F), ("n", I)], [("y", F)],
                      [op("neg", "Neg", ["x"])], {"y": "neg:y:0"})
    # n times: acc = acc < 10 ? acc + x : acc / 2 (an If inside a While body)
    add_x = function("add_x", [("acc", F), ("x", F)], [("y", F)],
                     [op("s", "AddV2", ["acc", "x"])], {"y": "s:z:0"})
    halve = function("halve", [("acc", F), ("x", F)], [("y", F)],
                     [c_f32("h", 0.5), op("m", "Mul", ["acc", "h:output:0"])], {"y": "m:z:0"})
    cond_alt = function("cond_alt", wargs, [("c", B)],
                        [op("less", "Less", ["i", "n"], t=I)], {"c": "less:z:0"})
    body_alt = function("body_alt", wargs, [(n + "_1", t) for n, t in wargs], [
        c_f32("ten", 10.0),
        op("small", "Less", ["acc", "ten:output:0"]),
        node("pick", "If", ["small:z:0", "acc", "x"], Tcond=a_type(B), Tin=a_types([F, F]),
             Tout=a_types([F]), then_branch=a_func("add_x"), else_branch=a_func("halve"),
             output_shapes=shapes([])),
        c_i32("one", 1),
        op("i1", "AddV2", ["i", "one:output:0"], t=I),
    ], {"i_1": "i1:z:0", "acc_1": "pick:output:0", "x_1": "x", "n_1": "n"})
    # a loop in a loop body: n times, count i more (triangle numbers)
    targs = [("i", I), ("n", I), ("acc", I)]
    cond_outer = function("cond_outer", targs, [("c", B)],
                          [op("less", "Less", ["i", "n"], t=I)], {"c": "less:z:0"})
    iargs = [("j", I), ("i", I), ("cnt", I)]
    cond_inner = function("cond_inner", iargs, [("c", B)],
                          [op("less", "Less", ["j", "i"], t=I)], {"c": "less:z:0"})
    body_inner = function("body_inner", iargs, [(n + "_1", t) for n, t in iargs], [
        c_i32("one", 1),
        op("j1", "AddV2", ["j", "one:output:0"], t=I),
        op("cnt1", "AddV2", ["cnt", "one:output:0"], t=I),
    ], {"j_1": "j1:z:0", "i_1": "i", "cnt_1": "cnt1:z:0"})
    body_outer = function("body_outer", targs, [(n + "_1", t) for n, t in targs], [
        c_i32("zero", 0), c_i32("one", 1),
        while_node("inner", "While", ["zero:output:0", "i", "acc"], [I, I, I], "cond_inner",
                   "body_inner", [[], [], []]),
        op("i1", "AddV2", ["i", "one:output:0"], t=I),
    ], {"i_1": "i1:z:0", "n_1": "n", "acc_1": "inner:output:2"})
    nodes = [
        placeholder("x", F, []), placeholder("n", I, []),
        c_f32("zero", 0.0),
        op("pos", "Greater", ["x", "zero"]),
        c_i32("izero", 0),
        while_node("outer", "StatelessWhile", ["izero", "n", "izero"], [I, I, I], "cond_outer",
                   "body_outer", [[], [], []]),
        node("branch", "StatelessIf", ["pos", "x", "n"], Tcond=a_type(B), Tin=a_types([F, I]),
             Tout=a_types([F]), then_branch=a_func("then_sum"), else_branch=a_func("else_neg"),
             output_shapes=shapes([])),
        c_i32("i0", 0),
        while_node("alt", "While", ["i0", "zero", "x", "n"], [I, F, F, I], "cond_alt",
                   "body_alt", [[], [], [], []]),
    ]
    return saved_model(nodes, sig({"x": ("x:0", F, []), "n": ("n:0", I, [])},
                                  {"branch": "branch:0", "alternating": "alt:1",
                                   "triangle": "outer:2"}),
                       [cond_sum, body_sum, then_b, else_b, add_x, halve, cond_alt, body_alt,
                        cond_outer, cond_inner, body_inner, body_outer])


def if_loop_nesting_ref(x, n):
    x = np.float32(x)
    branch = np.float32(sum(x * np.float32(i) for i in range(n))) if x > 0 else -x
    acc = np.float32(0)
    for _ in range(n):
        acc = acc + x if acc < 10 else acc * np.float32(0.5)
    return {"branch": np.float32(branch), "alternating": np.float32(acc),
            "triangle": np.int32(sum(range(max(n, 0))))}


CASE_BRANCHES = 5


def case():
    """Case(index, x) over 5 branches: branch k computes x * (k + 1) + k."""
    fs = []
    for k in range(CASE_BRANCHES):
        fs.append(function("branch%d" % k, [("x", F)], [("y", F)],
                           [c_f32("m", k + 1.0), c_f32("c", float(k)),
                            op("mul", "Mul", ["x", "m:output:0"]),
                            op("r", "AddV2", ["mul:z:0", "c:output:0"])], {"y": "r:z:0"}))
    nodes = [placeholder("index", I, []), placeholder("x", F, [-1]),
             node("case", "Case", ["index", "x"], Tin=a_types([F]), Tout=a_types([F]),
                  branches=funcs(*["branch%d" % k for k in range(CASE_BRANCHES)]),
                  output_shapes=shapes([-1]))]
    return saved_model(nodes, sig({"index": ("index:0", I, []), "x": ("x:0", F, [-1])},
                                  {"y": "case:0"}), fs)


def case_ref(index, x):
    k = index if 0 <= index < CASE_BRANCHES else CASE_BRANCHES - 1
    return {"y": x * np.float32(k + 1) + np.float32(k)}


def keras_rnn(cell="lstm", units=3, features=2, act="Tanh", rec_act="Sigmoid", extra=False,
              seed=7, backwards=False, mask=False):
    """A Keras-style LSTM or GRU (reset_after) layer, return_sequences and the final
    states, laid out as Keras' standard_lstm / standard_gru write it: x [B,T,I]
    transposed to [T,B,I], a TensorList per sequence, a StatelessWhile whose body
    does GetItem, the MatMuls, BiasAdds and Splits of the cell, the state update and
    SetItem. Kiln replaces this loop by its LSTM or GRU op. extra=True adds a loop
    variable counting down (d' = d - 1) that the recognizer does not know, so that
    the same computation runs as the loop. backwards=True is Keras' go_backwards (the
    backward half of a Bidirectional layer): the time-major input is reversed
    (ReverseV2) before the loop. mask=True: the layer follows Masking(0.), written as
    in _simple_rnn_layer (a bool mask TensorList, SelectV2 of the new output, h and c
    against the previous output, h and c; Keras' default zero_output_for_mask=False);
    Kiln's LSTM / GRU op has no mask, so this loop must run as written."""
    lstm = cell == "lstm"
    k = 4 if lstm else 3
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((features, k * units)).astype(np.float32) * 0.5
    r = rng.standard_normal((units, k * units)).astype(np.float32) * 0.5
    b = rng.standard_normal(k * units if lstm else (2, k * units)).astype(np.float32) * 0.5

    def c_arr(name, a):
        return node(name, "Const", dtype=a_type(F),
                    value=a_tensor(tensor(F, list(a.shape), content=a.tobytes())))

    names = ["loop_counter", "max_iter", "t", "out", "h"] + (["c"] if lstm else []) + \
        ["n", "inp", "kernel", "rec"] + (["bias"] if lstm else ["bias_x", "bias_r"])
    if mask:
        names.insert(names.index("out") + 1, "prev_out")
        names.insert(names.index("inp") + 1, "mask_in")
    kinds = {"loop_counter": I, "max_iter": I, "t": I, "out": V, "n": I, "inp": V, "mask_in": V}
    if extra:
        names.append("d")
        kinds["d"] = I
    types = [kinds.get(n, F) for n in names]
    args = list(zip(names, types))
    cond = function("rnn_cond", args, [("c_out", B)],
                    [op("less", "Less", ["t", "n"], t=I)], {"c_out": "less:z:0"})
    body = [
        c_i32("es", [-1, features]),
        node("xt", "TensorListGetItem", ["inp", "t", "es:output:0"], **list_attrs()),
        c_i32("split_dim", 1),
        op("mm", "MatMul", ["xt:item:0", "kernel"]),
        op("mm1", "MatMul", ["h", "rec"]),
    ]
    if lstm:
        body += [
            op("add", "AddV2", ["mm:product:0", "mm1:product:0"]),
            op("biasadd", "BiasAdd", ["add:z:0", "bias"]),
            node("split", "Split", ["split_dim:output:0", "biasadd:output:0"], T=a_type(F),
                 num_split=a_int(4)),
            op("gi", rec_act, ["split:output:0"]),
            op("gf", rec_act, ["split:output:1"]),
            op("fc", "Mul", ["gf:y:0", "c"]),
            op("gc", act, ["split:output:2"]),
            op("ic", "Mul", ["gi:y:0", "gc:y:0"]),
            op("c1", "AddV2", ["fc:z:0", "ic:z:0"]),
            op("go", rec_act, ["split:output:3"]),
            op("hc", act, ["c1:z:0"]),
            op("h1", "Mul", ["go:y:0", "hc:y:0"]),
        ]
    else:
        body += [
            op("bx", "BiasAdd", ["mm:product:0", "bias_x"]),
            node("xs", "Split", ["split_dim:output:0", "bx:output:0"], T=a_type(F), num_split=a_int(3)),
            op("br", "BiasAdd", ["mm1:product:0", "bias_r"]),
            node("rs", "Split", ["split_dim:output:0", "br:output:0"], T=a_type(F), num_split=a_int(3)),
            op("za", "AddV2", ["xs:output:0", "rs:output:0"]),
            op("z", rec_act, ["za:z:0"]),
            op("ra", "AddV2", ["xs:output:1", "rs:output:1"]),
            op("r", rec_act, ["ra:z:0"]),
            op("rh", "Mul", ["r:y:0", "rs:output:2"]),
            op("ha", "AddV2", ["xs:output:2", "rh:z:0"]),
            op("hh", act, ["ha:z:0"]),
            op("zh", "Mul", ["z:y:0", "h"]),
            c_f32("one_f", 1.0),
            op("omz", "Sub", ["one_f:output:0", "z:y:0"]),
            op("nh", "Mul", ["omz:z:0", "hh:y:0"]),
            op("h1", "AddV2", ["zh:z:0", "nh:z:0"]),
        ]
    new_h, new_c = "h1:z:0", "c1:z:0"
    if mask:
        body += [
            c_i32("es_m", [-1, 1]),
            node("mt", "TensorListGetItem", ["mask_in", "t", "es_m:output:0"],
                 element_dtype=a_type(B)),
            c_i32("mult", [1, 1]),
            node("mtile", "Tile", ["mt:item:0", "mult:output:0"], T=a_type(B),
                 Tmultiples=a_type(I)),
            op("sel_h", "SelectV2", ["mtile:output:0", "h1:z:0", "h"]),
            op("sel_out", "SelectV2", ["mtile:output:0", "h1:z:0", "prev_out"]),
        ] + ([op("sel_c", "SelectV2", ["mtile:output:0", "c1:z:0", "c"])] if lstm else [])
        new_h, new_c = "sel_h:output:0", "sel_c:output:0"
    body += [
        node("out1", "TensorListSetItem", ["out", "t", "sel_out:output:0" if mask else "h1:z:0"],
             **list_attrs()),
        c_i32("one", 1),
        op("t1", "AddV2", ["t", "one:output:0"], t=I),
        op("lc1", "AddV2", ["loop_counter", "one:output:0"], t=I),
    ]
    ret = {n + "_1": n for n in names}
    ret.update({"loop_counter_1": "lc1:z:0", "t_1": "t1:z:0", "out_1": "out1:output_handle:0",
                "h_1": new_h})
    if mask:
        ret["prev_out_1"] = "sel_out:output:0"
    if lstm:
        ret["c_1"] = new_c
    if extra:
        body.append(op("d1", "Sub", ["d", "one:output:0"], t=I))
        ret["d_1"] = "d1:z:0"
    body_fn = function("rnn_body", args, [(n + "_1", t) for n, t in args], body, ret)
    nodes = [
        placeholder("x", F, [-1, -1, features]),
        placeholder("h0", F, [-1, units]), placeholder("c0", F, [-1, units]),
        c_i32("perm", [1, 0, 2]),
        op("xt0", "Transpose", ["x", "perm"], Tperm=a_type(I)),
        c_i32("time_axis", [0]),
        op("xt", "ReverseV2", ["xt0", "time_axis"], Tidx=a_type(I)) if backwards
        else op("xt", "Identity", ["xt0"]),
        node("shape", "Shape", ["xt"], T=a_type(F), out_type=a_type(I)),
        c_i32("b0", [0]), c_i32("b1", [1]),
        node("n", "StridedSlice", ["shape", "b0", "b1", "b1"], T=a_type(I), Index=a_type(I),
             shrink_axis_mask=a_int(1)),
        c_i32("es_out", [-1, units]),
        node("reserve", "TensorListReserve", ["es_out", "n"], shape_type=a_type(I), **list_attrs()),
        c_i32("es_in", [-1, features]),
        node("unstack", "TensorListFromTensor", ["xt", "es_in"], shape_type=a_type(I),
             **list_attrs()),
        c_arr("kernel", w), c_arr("rec", r), c_i32("zero", 0), c_i32("max_iter", -1),
    ]
    if mask:
        nodes += [
            c_f32("zf", 0.0),
            node("ne", "NotEqual", ["x", "zf"], T=a_type(F), incompatible_shape_error=a_bool(True)),
            c_i32("last_axis", -1),
            node("any", "Any", ["ne", "last_axis"], Tidx=a_type(I), keep_dims=a_bool(False)),
            node("mask3", "ExpandDims", ["any", "last_axis"], T=a_type(B), Tdim=a_type(I)),
            op("mt0", "Transpose", ["mask3", "perm"], t=B, Tperm=a_type(I)),
            op("mt", "ReverseV2", ["mt0", "time_axis"], t=B, Tidx=a_type(I)) if backwards
            else op("mt", "Identity", ["mt0"], t=B),
            c_i32("es_mask", [-1, 1]),
            node("mask_unstack", "TensorListFromTensor", ["mt", "es_mask"], shape_type=a_type(I),
                 element_dtype=a_type(B)),
            # the previous output starts as zeros [B, units] (Keras: zeros_like of the
            # first step's output)
            op("prev0", "ZerosLike", ["h0"]),
        ]
    if lstm:
        nodes.append(c_arr("bias", b))
    else:
        nodes += [c_arr("bias_x", b[0]), c_arr("bias_r", b[1])]
    initial = {"loop_counter": "zero", "max_iter": "max_iter", "t": "zero", "out": "reserve",
               "h": "h0", "c": "c0", "n": "n", "inp": "unstack", "kernel": "kernel", "rec": "rec",
               "bias": "bias", "bias_x": "bias_x", "bias_r": "bias_r", "d": "n",
               "prev_out": "prev0", "mask_in": "mask_unstack"}
    shapes_of = {"out": None, "inp": None, "mask_in": None, "h": [-1, units], "c": [-1, units],
                 "prev_out": [-1, units],
                 "kernel": [features, k * units], "rec": [units, k * units],
                 "bias": [k * units], "bias_x": [k * units], "bias_r": [k * units]}
    nodes += [
        while_node("while", "StatelessWhile", [initial[n] for n in names], types, "rnn_cond",
                   "rnn_body", [shapes_of.get(n, []) for n in names]),
        c_i32("es_stack", [-1, units]),
        node("stack", "TensorListStack", ["while:3", "es_stack"], num_elements=a_int(-1),
             **list_attrs()),
        op("seq", "Transpose", ["stack", "perm"], Tperm=a_type(I)),
    ]
    hi = names.index("h")
    outs = {"seq": "seq:0", "h": "while:%d" % hi, "t": "while:2", "steps": "while:0"}
    if lstm:
        outs["c"] = "while:%d" % names.index("c")
    model = saved_model(nodes, sig({"x": ("x:0", F, [-1, -1, features]),
                                    "h0": ("h0:0", F, [-1, units]), "c0": ("c0:0", F, [-1, units])},
                                   outs), [cond, body_fn])
    return model, (w, r, b)


NP_ACT = {"Tanh": np.tanh, "Sigmoid": lambda v: 1 / (1 + np.exp(-v)), "Relu": lambda v: np.maximum(v, 0)}


def keras_rnn_ref(cell, x, h0, c0, weights, act="Tanh", rec_act="Sigmoid", backwards=False,
                  mask=False):
    """Keras' LSTM (gates i, f, c, o) or GRU (reset_after; gates z, r, h) cell in
    NumPy, float64. mask: where all of x[b, t] is zero, sample b keeps h and c and
    outputs its previous output (zeros before any)."""
    if backwards:
        x = x[:, ::-1]
    w, r, b = (a.astype(np.float64) for a in weights)
    fa, ga = NP_ACT[rec_act], NP_ACT[act]
    h, c = h0.astype(np.float64), c0.astype(np.float64)
    seq = []
    prev = np.zeros_like(h)
    for t in range(x.shape[1]):
        xt = x[:, t].astype(np.float64)
        h_old, c_old = h, c
        if cell == "lstm":
            i, f, g, o = np.split(xt @ w + h @ r + b, 4, axis=1)
            c = fa(f) * c + fa(i) * ga(g)
            h = fa(o) * ga(c)
        else:
            xz, xr, xh = np.split(xt @ w + b[0], 3, axis=1)
            rz, rr, rh = np.split(h @ r + b[1], 3, axis=1)
            z, rg = fa(xz + rz), fa(xr + rr)
            h = z * h + (1 - z) * ga(xh + rg * rh)
        if mask:
            h, c, prev = h.copy(), c.copy(), prev.copy()
            for i in range(x.shape[0]):
                if np.all(x[i, t] == 0):
                    h[i], c[i] = h_old[i], c_old[i]
                else:
                    prev[i] = h[i]
            seq.append(prev)
            continue
        seq.append(h)
    out = {"seq": np.stack(seq, 1).astype(np.float32), "h": h.astype(np.float32),
           "t": np.int32(x.shape[1]), "steps": np.int32(x.shape[1])}
    if cell == "lstm":
        out["c"] = c.astype(np.float32)
    return out


def _simple_rnn_layer(p, units, features, steps, backwards, seed, mask=False, zero_output=False):
    """Nodes and functions of one Keras SimpleRNN layer (return_sequences, tanh) over
    the graph's x [B, steps, features], names prefixed by p; outputs p+"seq" [B, T, U]
    (in the input's time order) and the last state p+"while:<H_INDEX>" (see the return).

    mask: the layer follows Masking(mask_value=0.) as Keras' backend.rnn writes it: the
    mask [B, T] = Any(NotEqual(x, 0), -1) is expanded to [B, T, 1], made time-major (and
    reversed for go_backwards) and unstacked into a bool TensorList read in the body;
    there the new output and state are SelectV2(Tile(mask_t, [1, 1]), new, old) with
    mask_t [B, 1] broadcast over the units: a masked step carries the state, and its
    output is the previous output (a loop variable, zeros at first) or, with
    zero_output (Keras' zero_output_for_mask), zeros."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((features, units)) * 0.5).astype(np.float32)
    r = (rng.standard_normal((units, units)) * 0.5).astype(np.float32)
    b = (rng.standard_normal(units) * 0.5).astype(np.float32)

    def c_arr(name, a):
        return node(name, "Const", dtype=a_type(F),
                    value=a_tensor(tensor(F, list(a.shape), content=a.tobytes())))

    names = ["loop_counter", "max_iter", "t", "out", "h", "n", "inp", "kernel", "rec", "bias"]
    if mask:
        names = ["loop_counter", "max_iter", "t", "out", "prev_out", "h", "n", "inp", "mask_in",
                 "kernel", "rec", "bias"]
    kinds = {"loop_counter": I, "max_iter": I, "t": I, "out": V, "n": I, "inp": V, "mask_in": V}
    types = [kinds.get(n, F) for n in names]
    args = list(zip(names, types))
    cond = function(p + "cond", args, [("c_out", B)],
                    [op("less", "Less", ["t", "n"], t=I)], {"c_out": "less:z:0"})
    body = [
        c_i32("es", [-1, features]),
        node("xt", "TensorListGetItem", ["inp", "t", "es:output:0"], **list_attrs()),
        op("mm", "MatMul", ["xt:item:0", "kernel"]),
        op("mm1", "MatMul", ["h", "rec"]),
        op("add", "AddV2", ["mm:product:0", "mm1:product:0"]),
        op("biasadd", "BiasAdd", ["add:z:0", "bias"]),
        op("h1", "Tanh", ["biasadd:output:0"]),
    ]
    new_h, new_out = "h1:y:0", "h1:y:0"
    if mask:
        body += [
            c_i32("es_m", [-1, 1]),
            node("mt", "TensorListGetItem", ["mask_in", "t", "es_m:output:0"],
                 element_dtype=a_type(B)),
            c_i32("mult", [1, 1]),
            node("mt_out", "Tile", ["mt:item:0", "mult:output:0"], T=a_type(B),
                 Tmultiples=a_type(I)),
            node("mt_st", "Tile", ["mt:item:0", "mult:output:0"], T=a_type(B),
                 Tmultiples=a_type(I)),
        ]
        if zero_output:
            body += [op("zeros", "ZerosLike", ["h1:y:0"]),
                     op("sel_out", "SelectV2", ["mt_out:output:0", "h1:y:0", "zeros:y:0"])]
        else:
            body += [op("sel_out", "SelectV2", ["mt_out:output:0", "h1:y:0", "prev_out"])]
        body += [op("sel_h", "SelectV2", ["mt_st:output:0", "h1:y:0", "h"])]
        new_h, new_out = "sel_h:output:0", "sel_out:output:0"
    body += [
        node("out1", "TensorListSetItem", ["out", "t", new_out], **list_attrs()),
        c_i32("one", 1),
        op("t1", "AddV2", ["t", "one:output:0"], t=I),
        op("lc1", "AddV2", ["loop_counter", "one:output:0"], t=I),
    ]
    ret = {n + "_1": n for n in names}
    ret.update({"loop_counter_1": "lc1:z:0", "t_1": "t1:z:0", "out_1": "out1:output_handle:0",
                "h_1": new_h})
    if mask:
        ret["prev_out_1"] = new_out
    body_fn = function(p + "body", args, [(n + "_1", t) for n, t in args], body, ret)
    nodes = [
        c_i32(p + "perm", [1, 0, 2]),
        op(p + "xt0", "Transpose", ["x", p + "perm"], Tperm=a_type(I)),
        c_i32(p + "time_axis", [0]),
        op(p + "xt", "ReverseV2", [p + "xt0", p + "time_axis"], Tidx=a_type(I)) if backwards
        else op(p + "xt", "Identity", [p + "xt0"]),
        node(p + "shape", "Shape", [p + "xt"], T=a_type(F), out_type=a_type(I)),
        c_i32(p + "b0", [0]), c_i32(p + "b1", [1]),
        node(p + "n", "StridedSlice", [p + "shape", p + "b0", p + "b1", p + "b1"], T=a_type(I),
             Index=a_type(I), shrink_axis_mask=a_int(1)),
        c_i32(p + "es_out", [-1, units]),
        node(p + "reserve", "TensorListReserve", [p + "es_out", p + "n"], shape_type=a_type(I),
             **list_attrs()),
        c_i32(p + "es_in", [-1, features]),
        node(p + "unstack", "TensorListFromTensor", [p + "xt", p + "es_in"],
             shape_type=a_type(I), **list_attrs()),
        c_arr(p + "kernel", w), c_arr(p + "rec", r), c_arr(p + "bias", b),
        c_i32(p + "zero", 0), c_i32(p + "max_iter", -1),
        # Keras' initial state: zeros [B, units] from the batch size
        node(p + "xshape", "Shape", ["x"], T=a_type(F), out_type=a_type(I)),
        node(p + "batch", "StridedSlice", [p + "xshape", p + "b0", p + "b1", p + "b1"],
             T=a_type(I), Index=a_type(I), shrink_axis_mask=a_int(1)),
        c_i32(p + "units", units),
        node(p + "hshape", "Pack", [p + "batch", p + "units"], T=a_type(I), N=a_int(2)),
        c_f32(p + "zf", 0.0),
        node(p + "h0", "Fill", [p + "hshape", p + "zf"], T=a_type(F), index_type=a_type(I)),
    ]
    if mask:
        nodes += [
            node(p + "ne", "NotEqual", ["x", p + "zf"], T=a_type(F),
                 incompatible_shape_error=a_bool(True)),
            c_i32(p + "last_axis", -1),
            node(p + "any", "Any", [p + "ne", p + "last_axis"], Tidx=a_type(I),
                 keep_dims=a_bool(False)),
            node(p + "mask3", "ExpandDims", [p + "any", p + "last_axis"], T=a_type(B),
                 Tdim=a_type(I)),
            op(p + "mt0", "Transpose", [p + "mask3", p + "perm"], t=B, Tperm=a_type(I)),
            op(p + "mt", "ReverseV2", [p + "mt0", p + "time_axis"], t=B, Tidx=a_type(I))
            if backwards else op(p + "mt", "Identity", [p + "mt0"], t=B),
            c_i32(p + "es_mask", [-1, 1]),
            node(p + "mask_unstack", "TensorListFromTensor", [p + "mt", p + "es_mask"],
                 shape_type=a_type(I), element_dtype=a_type(B)),
        ]
    initial = {"loop_counter": "zero", "max_iter": "max_iter", "t": "zero", "out": "reserve",
               "h": "h0", "n": "n", "inp": "unstack", "kernel": "kernel", "rec": "rec",
               "bias": "bias", "prev_out": "h0", "mask_in": "mask_unstack"}
    shapes_of = {"out": None, "inp": None, "mask_in": None, "h": [-1, units],
                 "prev_out": [-1, units], "kernel": [features, units],
                 "rec": [units, units], "bias": [units]}
    nodes += [
        while_node(p + "while", "StatelessWhile", [p + initial[n] for n in names], types,
                   p + "cond", p + "body", [shapes_of.get(n, []) for n in names]),
        c_i32(p + "es_stack", [-1, units]),
        node(p + "stack", "TensorListStack", [p + "while:3", p + "es_stack"],
             num_elements=a_int(-1), **list_attrs()),
        op(p + "seq_tm", "ReverseV2", [p + "stack", p + "time_axis"], Tidx=a_type(I))
        if backwards else op(p + "seq_tm", "Identity", [p + "stack"]),
        op(p + "seq", "Transpose", [p + "seq_tm", p + "perm"], Tperm=a_type(I)),
    ]
    return nodes, [cond, body_fn], (w, r, b), names.index("h")


def simple_rnn(units=4, features=3, steps=5, bidirectional=False, seed=11, mask=False,
               zero_output=False):
    """A Keras SimpleRNN layer (tanh, return_sequences and the last state) as TF2
    writes its loop (Kiln has no fused op for it: it runs as a Loop), or a
    Bidirectional(SimpleRNN) pair: a forward and a go_backwards loop whose sequences
    are concatenated on the last axis (the backward one put back in time order) and
    whose last states are concatenated. x is [batch, steps, features] with steps
    fixed (-1: unknown). mask, zero_output: after Masking(0.) (see _simple_rnn_layer)."""
    nodes = [placeholder("x", F, [-1, steps, features])]
    funcs_, weights = [], []
    for i, p in enumerate(["fw_", "bw_"] if bidirectional else ["fw_"]):
        nd, fn, w, hi = _simple_rnn_layer(p, units, features, steps, p == "bw_", seed + i,
                                          mask, zero_output)
        nodes += nd
        funcs_ += fn
        weights.append(w)
    if bidirectional:
        nodes += [c_i32("cat_axis", -1),
                  node("seq", "ConcatV2", ["fw_seq", "bw_seq", "cat_axis"], T=a_type(F),
                       N=a_int(2), Tidx=a_type(I)),
                  node("h", "ConcatV2", ["fw_while:%d" % hi, "bw_while:%d" % hi, "cat_axis"],
                       T=a_type(F),
                       N=a_int(2), Tidx=a_type(I))]
        outs = {"seq": "seq:0", "h": "h:0"}
    else:
        outs = {"seq": "fw_seq:0", "h": "fw_while:%d" % hi}
    model = saved_model(nodes, sig({"x": ("x:0", F, [-1, steps, features])}, outs), funcs_)
    return model, weights


def simple_rnn_ref(x, weights, bidirectional=False, mask=False, zero_output=False):
    """SimpleRNN (tanh) in NumPy, float64; Bidirectional concatenates the forward
    sequence with the backward one in input time order, and the two last states.
    mask: sample b's step t counts only where some feature of x[b, t] is nonzero; a
    masked step, sample by sample, keeps the state and outputs the previous step's
    output (zeros before any), or zeros with zero_output."""
    def run(xs, w, r, b):
        batch = xs.shape[0]
        h = np.zeros((batch, w.shape[1]))
        prev = np.zeros_like(h)
        seq = []
        for t in range(xs.shape[1]):
            new = np.tanh(xs[:, t] @ w + h @ r + b)
            for i in range(batch):
                if mask and not np.any(xs[i, t] != 0):
                    seq_i = np.zeros(w.shape[1]) if zero_output else prev[i]
                    new[i], prev[i] = h[i], seq_i
                else:
                    prev[i] = new[i]
            h = new
            seq.append(prev.copy())
        return np.stack(seq, 1) if seq else np.zeros((xs.shape[0], 0, w.shape[1])), h
    x = x.astype(np.float64)
    w = [tuple(a.astype(np.float64) for a in ws) for ws in weights]
    seq, h = run(x, *w[0])
    if bidirectional:
        bseq, bh = run(x[:, ::-1], *w[1])
        seq = np.concatenate([seq, bseq[:, ::-1]], -1)
        h = np.concatenate([h, bh], -1)
    return {"seq": seq.astype(np.float32), "h": h.astype(np.float32)}


# ------------------------------------------------ malformed: refused, naming the node


def _counter(body_name="body", cond_name="cond", body_args=2, cond_outs=1, kind="StatelessWhile"):
    args = [("i", I), ("n", I)][:body_args]
    cond = function("cond", [("i", I), ("n", I)], [("c", B), ("d", B)][:cond_outs],
                    [op("less", "Less", ["i", "n"], t=I)],
                    {"c": "less:z:0", "d": "less:z:0"} if cond_outs > 1 else {"c": "less:z:0"})
    body = function("body", args, [(n + "_1", t) for n, t in args],
                    [c_i32("one", 1), op("i1", "AddV2", ["i", "one:output:0"], t=I)],
                    {"i_1": "i1:z:0", "n_1": "n"} if body_args > 1 else {"i_1": "i1:z:0"})
    nodes = [placeholder("n", I, []), c_i32("i0", 0),
             while_node("w", kind, ["i0", "n"], [I, I], cond_name, body_name, [[], []])]
    return saved_model(nodes, sig({"n": ("n:0", I, [])}, {"y": "w:0"}), [cond, body])


def counter():
    """y = max(n, 0): the smallest While (a corpus seed)."""
    return _counter()


def bad_if_branch_missing():
    nodes = [placeholder("x", F, []), c_f32("zero", 0.0), op("pos", "Greater", ["x", "zero"]),
             node("branch", "If", ["pos", "x"], Tin=a_types([F]), Tout=a_types([F]),
                  then_branch=a_func("nowhere"), else_branch=a_func("nowhere"))]
    return saved_model(nodes, sig({"x": ("x:0", F, [])}, {"y": "branch:0"}))


def bad_list_of_strings():
    nodes = [placeholder("n", I, []), c_i32("es", [-1]),
             node("l", "TensorListReserve", ["es", "n"], element_dtype=a_type(7),
                  shape_type=a_type(I)),
             node("y", "TensorListLength", ["l"])]
    return saved_model(nodes, sig({"n": ("n:0", I, [])}, {"y": "y:0"}))


BAD = {  # name: (bytes, pattern the one-line error must match)
    "bad_while_body_missing": (_counter(body_name="nowhere"),
                               r"node 'w'.*body function 'nowhere' is not in the graph's function"),
    "bad_while_cond_missing": (_counter(cond_name="nowhere"),
                               r"node 'w'.*cond function 'nowhere' is not in the graph's function"),
    "bad_while_body_arity": (_counter(body_args=1), r"node 'w'.*takes 1 arguments and returns 1"),
    "bad_while_cond_two_outputs": (_counter(cond_outs=2), r"node 'w'.*cond function 'cond' returns 2"),
    "bad_if_branch_missing": (bad_if_branch_missing(),
                              r"node 'branch'.*function 'nowhere' is not in the graph's function"),
    "bad_list_of_strings": (bad_list_of_strings(), r"node 'l'.*element_dtype.*string"),
}

MODELS = {"while_tensorlist": while_tensorlist, "if_loop_nesting": if_loop_nesting, "case": case,
          "counter": counter, "list_append": list_append}


def write(out, name, data):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "saved_model.pb"), "wb") as f:
        f.write(data)
    return d


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_tf_control_flow.py OUT")
    for name, fn in MODELS.items():
        write(sys.argv[1], name, fn())
    for name, (data, _) in BAD.items():
        write(sys.argv[1], name, data)
    print("wrote %d models to %s" % (len(MODELS) + len(BAD), sys.argv[1]))


if __name__ == "__main__":
    main()
