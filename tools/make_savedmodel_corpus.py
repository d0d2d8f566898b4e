#!/usr/bin/python3
"""make_savedmodel_corpus.py - write the SavedModel corpus under tests/corpus/savedmodel/.

Kiln must load a well-formed SavedModel or refuse a bad one with a status and
a message naming the problem; never crash, hang or recurse without bound.
This script writes small saved_model.pb files built here, field by field,
from TensorFlow's schema (no TensorFlow needed), one file per case:

  tests/corpus/savedmodel/<case>.pb

  ok_*     must load (and the fuzz target runs them);
  any_*    may load or fail (bit flips that may still parse);
  others   must fail to load, with a message matching EXPECT[<case>].

The fuzz target fuzz/fuzz_savedmodel.c is seeded with (and the test suite
replays) the same files; tests/python/test_savedmodel.py loads each with
`kiln inspect` from a temporary folder. The builders are also imported by
that test to make models on the fly.

Deterministic (fixed seed). Run:
    /usr/bin/python3 tools/make_savedmodel_corpus.py [--out tests/corpus]
"""
import argparse
import os
import random
import struct

SEED = 20250611

# TensorFlow DataType codes (types.proto)
DT_FLOAT, DT_INT32, DT_STRING, DT_INT64, DT_BOOL, DT_RESOURCE = 1, 3, 7, 9, 10, 20

# --------------------------------------------------------------------------
# Raw protobuf writing.


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_len(field, data):
    """A length-delimited field (bytes, string or message)."""
    if isinstance(data, str):
        data = data.encode()
    return varint(field << 3 | 2) + varint(len(data)) + data


def f_int(field, n):
    return varint(field << 3) + varint(n)


def f_float(field, x):
    return varint(field << 3 | 5) + struct.pack("<f", x)


def entry(field, key, value_bytes):
    """A map<string, Message> entry."""
    return f_len(field, f_len(1, key) + f_len(2, value_bytes))


# --------------------------------------------------------------------------
# TensorFlow messages.


def shape(dims=None, unknown_rank=False):
    if unknown_rank:
        return f_int(3, 1)
    return b"".join(f_len(2, f_int(1, d)) for d in dims or [])


def tensor(dtype, dims, floats=None, ints=None, strings=None, int64s=None, content=None):
    b = f_int(1, dtype) + f_len(2, shape(dims))
    if content is not None:
        b += f_len(4, content)
    for x in floats or []:
        b += f_float(5, x)
    for x in ints or []:
        b += f_int(7, x)
    for s in strings or []:
        b += f_len(8, s)
    for x in int64s or []:
        b += f_int(10, x)
    return b


def a_type(t):
    return f_int(6, t)


def a_int(i):
    return f_int(3, i)


def a_shape(dims=None, unknown_rank=False):
    return f_len(7, shape(dims, unknown_rank))


def a_tensor(t):
    return f_len(8, t)


def a_func(name):
    return f_len(10, f_len(1, name))


def a_types(ts):
    return f_len(1, b"".join(f_int(6, t) for t in ts))


def node(name, op, inputs=(), **attrs):
    b = f_len(1, name) + f_len(2, op)
    for i in inputs:
        b += f_len(3, i)
    for k, v in attrs.items():
        b += entry(5, k, v)
    return b


def const_f32(name, value, dims=()):
    n = 1
    for d in dims:
        n *= d
    return node(name, "Const", dtype=a_type(DT_FLOAT),
                value=a_tensor(tensor(DT_FLOAT, list(dims), floats=[value] * max(n, 1))))


def placeholder(name, dtype=DT_FLOAT, dims=None):
    return node(name, "Placeholder", dtype=a_type(dtype),
                shape=a_shape(dims, unknown_rank=dims is None))


def arg(name, dtype=DT_FLOAT):
    return f_len(1, name) + f_int(3, dtype)


def function(name, inputs, outputs, nodes, ret, control_ret=None):
    """inputs/outputs: [(name, dtype)]; ret: {output: 'node:arg:idx'}."""
    sig = f_len(1, name)
    for n, t in inputs:
        sig += f_len(2, arg(n, t))
    for n, t in outputs:
        sig += f_len(3, arg(n, t))
    b = f_len(1, sig)
    for nd in nodes:
        b += f_len(3, nd)
    for k, v in ret.items():
        b += f_len(4, f_len(1, k) + f_len(2, v))
    for k, v in (control_ret or {}).items():
        b += f_len(6, f_len(1, k) + f_len(2, v))
    return b


def call(name, fn, inputs, tin, tout, op="StatefulPartitionedCall"):
    return node(name, op, inputs, f=a_func(fn), Tin=a_types(tin), Tout=a_types(tout))


def tensor_info(name, dtype=DT_FLOAT, dims=None):
    b = f_len(1, name) + f_int(2, dtype)
    if dims is not None:
        b += f_len(3, shape(dims))
    return b


def signature(inputs, outputs, method="tensorflow/serving/predict"):
    """inputs/outputs: {alias: tensor_info bytes}"""
    b = b""
    for k, v in inputs.items():
        b += entry(1, k, v)
    for k, v in outputs.items():
        b += entry(2, k, v)
    return b + f_len(3, method)


def saved_model(nodes, signatures, functions=(), tags=("serve",), saver=None):
    gd = b"".join(f_len(1, n) for n in nodes)
    if functions:
        gd += f_len(2, b"".join(f_len(1, f) for f in functions))
    mi = b"".join(f_len(4, t) for t in tags) + f_len(5, "2.99.0")
    mg = f_len(1, mi) + f_len(2, gd)
    if saver:
        mg += f_len(3, saver)
    for k, v in signatures.items():
        mg += entry(5, k, v)
    return f_int(1, 1) + f_len(2, mg)


# --------------------------------------------------------------------------
# Models.


def half_plus_two():
    """y = 0.5 x + 2 without variables (like serving's matrix_half_plus_two)."""
    return saved_model(
        [placeholder("x", dims=[-1, 1]), const_f32("a", 0.5), const_f32("b", 2.0),
         node("Mul", "Mul", ["a", "x"], T=a_type(DT_FLOAT)),
         node("y", "AddV2", ["Mul", "b"], T=a_type(DT_FLOAT))],
        {"serving_default": signature({"x": tensor_info("x:0", dims=[-1, 1])},
                                      {"y": tensor_info("y:0")})})


def times_three_call(op="StatefulPartitionedCall"):
    """TF2 style: the signature calls a function computing x * 3."""
    body = [const_f32("c", 3.0), node("mul", "Mul", ["x", "c:output:0"], T=a_type(DT_FLOAT)),
            node("Identity", "Identity", ["mul:z:0", "^c"], T=a_type(DT_FLOAT))]
    f = function("times_three", [("x", DT_FLOAT)], [("identity", DT_FLOAT)], body,
                 {"identity": "Identity:output:0"})
    return saved_model(
        [placeholder("serving_default_x", dims=[]),
         call("StatefulPartitionedCall", "times_three", ["serving_default_x"], [DT_FLOAT],
              [DT_FLOAT], op=op)],
        {"serving_default": signature({"x": tensor_info("serving_default_x:0", dims=[])},
                                      {"output_0": tensor_info("StatefulPartitionedCall:0")})},
        [f])


def nested_calls(depth):
    """f0 calls f1 ... calls f<depth-1>, which returns x + 1."""
    fns = []
    for i in range(depth):
        if i == depth - 1:
            body = [const_f32("one", 1.0),
                    node("add", "AddV2", ["x", "one:output:0"], T=a_type(DT_FLOAT))]
            ret = {"y": "add:z:0"}
        else:
            body = [call("inner", "f%d" % (i + 1), ["x"], [DT_FLOAT], [DT_FLOAT],
                         op="PartitionedCall")]
            ret = {"y": "inner:output:0"}
        fns.append(function("f%d" % i, [("x", DT_FLOAT)], [("y", DT_FLOAT)], body, ret))
    return saved_model(
        [placeholder("x", dims=[]), call("call", "f0", ["x"], [DT_FLOAT], [DT_FLOAT])],
        {"serving_default": signature({"x": tensor_info("x:0", dims=[])},
                                      {"y": tensor_info("call:0")})}, fns)


def doubling_calls(depth):
    """f<i> calls f<i+1> twice and adds the results: 2^depth instances when inlined."""
    fns = []
    for i in range(depth):
        if i == depth - 1:
            body = [node("id", "Identity", ["x"], T=a_type(DT_FLOAT))]
            ret = {"y": "id:output:0"}
        else:
            body = [call("c1", "f%d" % (i + 1), ["x"], [DT_FLOAT], [DT_FLOAT], op="PartitionedCall"),
                    call("c2", "f%d" % (i + 1), ["x"], [DT_FLOAT], [DT_FLOAT], op="PartitionedCall"),
                    node("add", "AddV2", ["c1:output:0", "c2:output:0"], T=a_type(DT_FLOAT))]
            ret = {"y": "add:z:0"}
        fns.append(function("f%d" % i, [("x", DT_FLOAT)], [("y", DT_FLOAT)], body, ret))
    return saved_model(
        [placeholder("x", dims=[]), call("call", "f0", ["x"], [DT_FLOAT], [DT_FLOAT])],
        {"serving_default": signature({"x": tensor_info("x:0", dims=[])},
                                      {"y": tensor_info("call:0")})}, fns)


def recursive(mutual=False):
    names = ["f", "g"] if mutual else ["f"]
    fns = []
    for i, n in enumerate(names):
        callee = names[(i + 1) % len(names)]
        fns.append(function(n, [("x", DT_FLOAT)], [("y", DT_FLOAT)],
                            [call("again", callee, ["x"], [DT_FLOAT], [DT_FLOAT],
                                  op="PartitionedCall")],
                            {"y": "again:output:0"}))
    return saved_model(
        [placeholder("x", dims=[]), call("call", "f", ["x"], [DT_FLOAT], [DT_FLOAT])],
        {"serving_default": signature({"x": tensor_info("x:0", dims=[])},
                                      {"y": tensor_info("call:0")})}, fns)


def one_node_model(extra_nodes, out="y:0", inputs=None):
    nodes = [placeholder("x", dims=[2])] + extra_nodes
    return saved_model(nodes, {"serving_default": signature(
        inputs if inputs is not None else {"x": tensor_info("x:0", dims=[2])},
        {"y": tensor_info(out)})})


def deep_attr(depth):
    """A node whose attr is an AttrValue list of funcs nested `depth` levels."""
    # innermost AttrValue: i = 1; each level: AttrValue{list{func{attr{k: <inner>}}}}.
    # Built from prefixes only (every level's bytes precede the inner value),
    # so the cost is linear in depth.
    inner = a_int(1)
    n = len(inner)
    prefixes = []
    for _ in range(depth):
        p = bytearray()
        a = varint(2 << 3 | 2) + varint(n)                  # AttrEntry.value
        n += len(a)
        b = f_len(1, "k")                                   # AttrEntry.key
        n += len(b)
        c = varint(2 << 3 | 2) + varint(n)                  # NameAttrList.attr
        n += len(c)
        d = f_len(1, "f")                                   # NameAttrList.name
        n += len(d)
        e = varint(9 << 3 | 2) + varint(n)                  # ListValue.func
        n += len(e)
        f = varint(1 << 3 | 2) + varint(n)                  # AttrValue.list
        n += len(f)
        p += f + e + d + c + b + a
        prefixes.append(bytes(p))
    inner = b"".join(reversed(prefixes)) + inner
    nd = node("y", "Identity", ["x"], T=a_type(DT_FLOAT), deep=inner)
    return one_node_model([nd])


def two_signatures():
    return saved_model(
        [placeholder("x", dims=[-1]), const_f32("two", 2.0), const_f32("three", 3.0),
         node("double", "Mul", ["x", "two"], T=a_type(DT_FLOAT)),
         node("triple", "Mul", ["x", "three"], T=a_type(DT_FLOAT))],
        {"serving_default": signature({"x": tensor_info("x:0", dims=[-1])},
                                      {"y": tensor_info("triple:0")}),
         "double": signature({"x": tensor_info("x:0", dims=[-1])},
                             {"y": tensor_info("double:0")})})


def cases():
    """{name: bytes} of every corpus case."""
    T = a_type(DT_FLOAT)
    c = {}
    c["ok_half_plus_two"] = half_plus_two()
    c["ok_function_call"] = times_three_call()
    c["ok_partitioned_call"] = times_three_call("PartitionedCall")
    c["ok_nested_calls_8"] = nested_calls(8)
    c["ok_two_signatures"] = two_signatures()
    c["ok_control_dep_dropped"] = one_node_model(
        [const_f32("k", 1.0), node("y", "Identity", ["x", "^k"], T=T)])
    c["ok_strided_slice"] = one_node_model([
        node("b", "Const", dtype=a_type(DT_INT32), value=a_tensor(tensor(DT_INT32, [1], ints=[1]))),
        node("e", "Const", dtype=a_type(DT_INT32), value=a_tensor(tensor(DT_INT32, [1], ints=[2]))),
        node("s", "Const", dtype=a_type(DT_INT32), value=a_tensor(tensor(DT_INT32, [1], ints=[1]))),
        node("y", "StridedSlice", ["x", "b", "e", "s"], T=T, Index=a_type(DT_INT32),
             shrink_axis_mask=a_int(1))])
    c["recursive_function"] = recursive()
    c["mutually_recursive_functions"] = recursive(mutual=True)
    c["call_chain_40_deep"] = nested_calls(40)
    c["ok_doubling_calls_10"] = doubling_calls(10)
    c["doubling_calls_30"] = doubling_calls(30)
    c["attr_nested_1000_deep"] = deep_attr(1000)  # the test builds 100,000 in tmp
    c["unknown_op"] = one_node_model([node("y", "FrobnicateOp", ["x"], T=T)])
    c["graph_cycle"] = one_node_model([node("y", "AddV2", ["z", "x"], T=T),
                                       node("z", "AddV2", ["y", "x"], T=T)])
    c["input_node_missing"] = one_node_model([node("y", "AddV2", ["x", "ghost_node"], T=T)])
    c["output_index_out_of_range"] = one_node_model([node("y", "Identity", ["x"], T=T)],
                                                    out="y:5")
    c["signature_tensor_missing"] = one_node_model([node("y", "Identity", ["x"], T=T)],
                                                   out="ghost_output:0")
    c["signature_input_missing"] = one_node_model(
        [node("y", "Identity", ["x"], T=T)], inputs={"x": tensor_info("ghost_input:0")})
    c["placeholder_not_an_input"] = one_node_model(
        [placeholder("p"), node("y", "AddV2", ["x", "p"], T=T)])
    c["const_negative_dim"] = one_node_model([
        node("k", "Const", dtype=T, value=a_tensor(tensor(DT_FLOAT, [-5], floats=[1.0]))),
        node("y", "AddV2", ["x", "k"], T=T)])
    c["const_huge_dims"] = one_node_model([
        node("k", "Const", dtype=T,
             value=a_tensor(tensor(DT_FLOAT, [1 << 40, 1 << 40], floats=[1.0]))),
        node("y", "AddV2", ["x", "k"], T=T)])
    c["const_content_short"] = one_node_model([
        node("k", "Const", dtype=T, value=a_tensor(tensor(DT_FLOAT, [4], content=b"\0" * 7))),
        node("y", "AddV2", ["x", "k"], T=T)])
    c["const_too_many_values"] = one_node_model([
        node("k", "Const", dtype=T, value=a_tensor(tensor(DT_FLOAT, [2], floats=[1, 2, 3]))),
        node("y", "AddV2", ["x", "k"], T=T)])
    c["duplicate_node_names"] = one_node_model([node("y", "Identity", ["x"], T=T),
                                                node("y", "Identity", ["x"], T=T)])
    c["function_not_in_library"] = saved_model(
        [placeholder("x", dims=[]), call("call", "nowhere", ["x"], [DT_FLOAT], [DT_FLOAT])],
        {"serving_default": signature({"x": tensor_info("x:0")}, {"y": tensor_info("call:0")})})
    f1 = function("f", [("x", DT_FLOAT)], [("y", DT_FLOAT)],
                  [node("id", "Identity", ["x"], T=T)], {"y": "id:output:0"})
    c["function_wrong_arity"] = saved_model(
        [placeholder("x", dims=[]),
         call("call", "f", ["x", "x"], [DT_FLOAT, DT_FLOAT], [DT_FLOAT])],
        {"serving_default": signature({"x": tensor_info("x:0")}, {"y": tensor_info("call:0")})},
        [f1])
    c["function_bad_reference"] = saved_model(
        [placeholder("x", dims=[]), call("call", "f", ["x"], [DT_FLOAT], [DT_FLOAT])],
        {"serving_default": signature({"x": tensor_info("x:0")}, {"y": tensor_info("call:0")})},
        [function("f", [("x", DT_FLOAT)], [("y", DT_FLOAT)],
                  [node("id", "Identity", ["x"], T=T)], {"y": "id"})])
    c["no_signatures"] = saved_model([placeholder("x")], {})
    c["no_serve_tags"] = saved_model(
        [placeholder("x", dims=[2]), node("y", "Identity", ["x"], T=T)],
        {"serving_default": signature({"x": tensor_info("x:0")}, {"y": tensor_info("y:0")})},
        tags=("train",))
    c["variable_without_checkpoint"] = one_node_model([
        node("v", "VariableV2", dtype=T, shape=a_shape([2])),
        node("y", "AddV2", ["x", "v"], T=T)])
    c["stateful_assign_add"] = one_node_model([
        node("v", "VariableV2", dtype=T, shape=a_shape([2])),
        node("y", "AssignAdd", ["v", "x"], T=T)])
    c["control_dep_on_assign"] = one_node_model([
        node("v", "VariableV2", dtype=T, shape=a_shape([2])),
        node("set", "Assign", ["v", "x"], T=T),
        node("y", "Identity", ["x", "^set"], T=T)])
    c["random_output"] = one_node_model([
        node("s", "Const", dtype=a_type(DT_INT32), value=a_tensor(tensor(DT_INT32, [1], ints=[2]))),
        node("r", "RandomUniform", ["s"], dtype=T, T=a_type(DT_INT32)),
        node("y", "AddV2", ["x", "r"], T=T)])
    c["empty_file"] = b""
    c["not_protobuf"] = b"this is not a SavedModel\n" * 4
    ok = half_plus_two()
    c["truncated_half"] = ok[: len(ok) // 2]
    c["truncated_one_byte_short"] = ok[:-1]
    # TF2 control flow: While loops over TensorLists (tools/make_tf_control_flow.py)
    import make_tf_control_flow as cf
    c["ok_while_counter"] = cf.counter()
    c["ok_while_tensorlist"] = cf.while_tensorlist()
    c["ok_if_loop_nesting"] = cf.if_loop_nesting()
    c["while_body_missing"] = cf.BAD["bad_while_body_missing"][0]
    # TF1 control flow: frames and Switch/Merge (tools/make_tf1_control_flow.py)
    import make_tf1_control_flow as cf1
    c["ok_tf1_nesting"] = cf1.nesting()
    c["ok_tf1_tensorarray"] = cf1.tensorarray()
    c["tf1_next_iteration_without_merge"] = cf1.BAD["bad_next_iteration_without_merge"][0]
    c["tf1_mismatched_frames"] = cf1.BAD["bad_mismatched_frames"][0]
    rng1 = random.Random(SEED + 1)
    for i in range(6):
        b = bytearray(c["ok_tf1_nesting"])
        for _ in range(1 + i % 3):
            b[rng1.randrange(len(b))] ^= 1 << rng1.randrange(8)
        c["any_tf1_bitflip_%02d" % i] = bytes(b)
    rng = random.Random(SEED)
    base = times_three_call()
    for i in range(12):
        b = bytearray(base)
        for _ in range(1 + i % 3):
            pos = rng.randrange(len(b))
            b[pos] ^= 1 << rng.randrange(8)
        c["any_bitflip_%02d" % i] = bytes(b)
    return c


# What the message of each failing case must say (regex, any case).
EXPECT = {
    "recursive_function": r"recurs",
    "mutually_recursive_functions": r"recurs",
    "call_chain_40_deep": r"deeper than",
    "doubling_calls_30": r"more than \d+ nodes",
    "attr_nested_1000_deep": r"nested more than",
    "unknown_op": r"FrobnicateOp.*|node 'y'",
    "graph_cycle": r"cycle",
    "input_node_missing": r"ghost_node",
    "output_index_out_of_range": r"output 5",
    "signature_tensor_missing": r"ghost_output",
    "signature_input_missing": r"ghost_input",
    "placeholder_not_an_input": r"placeholder 'p'",
    "const_negative_dim": r"dim",
    "const_huge_dims": r"too large",
    "const_content_short": r"tensor_content",
    "const_too_many_values": r"holds 3 values",
    "duplicate_node_names": r"two graph nodes",
    "function_not_in_library": r"nowhere.*not in the graph's function library",
    "while_body_missing": r"node 'w'.*body function 'nowhere'",
    "tf1_next_iteration_without_merge": r"node 'w/NextIteration_1'.*feeds no Merge",
    "tf1_mismatched_frames": r"node 'w/xi'.*two different while loops",
    "function_wrong_arity": r"passes 2 inputs",
    "function_bad_reference": r"without an output name",
    "no_signatures": r"no signatures",
    "no_serve_tags": r"no MetaGraphDef with tags 'serve'",
    "variable_without_checkpoint": r"variable 'v'",
    "stateful_assign_add": r"variable 'v'.*cannot be restored",
    "control_dep_on_assign": r"writes variable state",
    "random_output": r"random",
    "empty_file": r"no MetaGraphDef",
    "not_protobuf": r"saved_model\.pb",
    "truncated_half": r"truncated|claims|saved_model\.pb",
    "truncated_one_byte_short": r"truncated|claims|saved_model\.pb",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "corpus"))
    args = ap.parse_args()
    out = os.path.join(args.out, "savedmodel")
    os.makedirs(out, exist_ok=True)
    for name, data in sorted(cases().items()):
        with open(os.path.join(out, name + ".pb"), "wb") as f:
            f.write(data)
    print("wrote %d cases to %s" % (len(cases()), out))


if __name__ == "__main__":
    main()
