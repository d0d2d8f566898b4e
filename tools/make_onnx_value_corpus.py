#!/usr/bin/env python3
"""make_onnx_value_corpus.py - seed corpora for ONNX sequence and optional values.

Writes tests/corpus/onnx_value/ (fuzz/fuzz_onnx_value.c: a kind byte, 0 tensor,
1 sequence, 2 optional, then the serialized TensorProto / SequenceProto /
OptionalProto) and two models using sequence ops into tests/corpus/onnx/
(fuzz/fuzz_onnx_load.c runs them on zero-filled inputs). Seeds are named by
their SHA-1 so that rerunning the script is idempotent; the two models carry the
"any_seq_" prefix, which tests/python/test_malformed.py reads as "may load".

    /usr/bin/python3 tools/make_onnx_value_corpus.py
"""
import hashlib
import pathlib

import numpy as np
from onnx import SequenceProto, TensorProto, helper, numpy_helper

ROOT = pathlib.Path(__file__).resolve().parents[1]


def put(folder, data, prefix=""):
    d = ROOT / "tests" / "corpus" / folder
    d.mkdir(parents=True, exist_ok=True)
    (d / (prefix + hashlib.sha1(data).hexdigest())).write_bytes(data)


def t(shape, dtype=np.float32):
    return numpy_helper.from_array(np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape))


def values():
    seq = helper.make_sequence("s", 1, [t([2, 3]), t([1, 3]), t([0, 3])])
    empty = helper.make_sequence("e", 1, [])
    nested = helper.make_sequence("n", 3, [seq, empty])
    ints = helper.make_sequence("i", 1, [t([4], np.int64), t([], np.int64)])
    strs = helper.make_sequence("str", 1, [helper.make_tensor("x", TensorProto.STRING, [2], [b"a", b"bc"])])
    opt_t = helper.make_optional("o", 1, t([3]))
    opt_s = helper.make_optional("os", 3, seq)
    opt_none = helper.make_optional("on", 0, None)
    opt_in_seq = SequenceProto(name="so", elem_type=5)
    opt_in_seq.optional_values.extend([opt_t])
    deep = seq
    for _ in range(5):
        deep = helper.make_sequence("d", 3, [deep])
    out = [(0, t([2, 2]).SerializeToString())]
    for s in (seq, empty, nested, ints, strs, opt_in_seq, deep):
        out.append((1, s.SerializeToString()))
    for o in (opt_t, opt_s, opt_none):
        out.append((2, o.SerializeToString()))
    b = seq.SerializeToString()
    out.append((1, b[: len(b) // 2]))  # truncated
    out.append((2, b))  # a sequence read as an optional
    return [bytes([k]) + v for k, v in out]


def models():
    f = TensorProto.FLOAT
    i64 = TensorProto.INT64
    body = helper.make_graph(
        [helper.make_node("SequenceAt", ["s", "i"], ["item"]),
         helper.make_node("ReduceSum", ["item"], ["sum"], keepdims=1),
         helper.make_node("SequenceInsert", ["acc", "sum"], ["acc2"]),
         helper.make_node("Identity", ["c"], ["c2"])],
        "body", [helper.make_tensor_value_info("i", i64, []),
                 helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                 helper.make_tensor_sequence_value_info("acc", f, None)],
        [helper.make_tensor_value_info("c2", TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("acc2", f, None)])
    g1 = helper.make_graph(
        [helper.make_node("SplitToSequence", ["x", "two"], ["s"], axis=0),
         helper.make_node("SequenceLength", ["s"], ["n"]),
         helper.make_node("SequenceEmpty", [], ["e"]),
         helper.make_node("Loop", ["n", "", "e"], ["acc"], body=body),
         helper.make_node("SequenceErase", ["acc", "m1"], ["acc1"]),
         helper.make_node("ConcatFromSequence", ["acc1"], ["y"], axis=0, new_axis=1)],
        "seq_loop", [helper.make_tensor_value_info("x", f, [6, 4])],
        [helper.make_tensor_value_info("y", f, None)],
        initializer=[helper.make_tensor("two", i64, [], [2]), helper.make_tensor("m1", i64, [], [-1])])
    then_g = helper.make_graph([helper.make_node("Optional", ["x"], ["o"])], "then", [],
                               [helper.make_value_info("o", helper.make_optional_type_proto(
                                   helper.make_tensor_type_proto(f, None)))])
    else_g = helper.make_graph([helper.make_node("Optional", [], ["o"],
                                                 type=helper.make_tensor_type_proto(f, None))],
                               "else", [], [helper.make_value_info("o", helper.make_optional_type_proto(
                                   helper.make_tensor_type_proto(f, None)))])
    g2 = helper.make_graph(
        [helper.make_node("If", ["c"], ["opt"], then_branch=then_g, else_branch=else_g),
         helper.make_node("OptionalHasElement", ["opt"], ["has"]),
         helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
         helper.make_node("SequenceMap", ["s"], ["s2"], body=helper.make_graph(
             [helper.make_node("Neg", ["a"], ["b"])], "map",
             [helper.make_tensor_value_info("a", f, None)], [helper.make_tensor_value_info("b", f, None)])),
         helper.make_node("SequenceAt", ["s2", "five"], ["bad"])],
        "opt_if", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                   helper.make_tensor_value_info("x", f, [3])],
        [helper.make_tensor_value_info("has", TensorProto.BOOL, []),
         helper.make_tensor_value_info("bad", f, None)],
        initializer=[helper.make_tensor("five", i64, [], [5])])
    out = []
    for g in (g1, g2):
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        out.append(m.SerializeToString())
    return out


if __name__ == "__main__":
    for v in values():
        put("onnx_value", v)
    for m in models():
        # "any_": valid models in the loader's corpus (test_malformed.py lets them load)
        put("onnx", m, "any_seq_")
    print("wrote", len(values()), "value seeds and", len(models()), "models")
