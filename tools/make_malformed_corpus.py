#!/usr/bin/python3
"""make_malformed_corpus.py - write the malformed-ONNX corpus under tests/corpus/.

Kiln must refuse a bad model file with a status and a message naming the
problem; it must never crash, hang, or read outside the model's folder. This
script writes the inputs that check it:

  tests/corpus/onnx/<case>.onnx            one file per case; the fuzz replay
                                           (tests/replay.cmake) and
                                           tests/python/test_malformed.py read it
  tests/corpus/onnx_external/<case>/       model.onnx plus its data files, for
                                           the external-data cases

A case whose name starts with "any_" may load or fail (a bit flip that still
parses, a regression input from the fuzzer); every other case must fail to
load. Symlink cases are built by the test in a temporary folder, since git
stores symlinks unevenly.

Every model is derived from small models built here with onnx.helper. A few
conformance models from the shared test data are read at generation time,
but only their op type, attribute names and input shapes are reused, in new
models with new value names; the script checks that no output contains a run
of their bytes, so nothing of the test data lands in the repository.

Deterministic: the random mutations use a fixed seed. Run:
    /usr/bin/python3 tools/make_malformed_corpus.py [--out tests/corpus]
"""
import argparse
import hashlib
import os
import random
import shutil
import struct
import sys
import warnings

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

IR_VERSION = 7
OPSET = 13
MAX_CORPUS_BYTES = 2 * 1024 * 1024
SEED = 20240611

# Conformance models whose op, attributes and input shapes seed the
# wrong-attribute-type cases (read only; never copied).
TESTDATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                            "testdata", "onnx", "node")
TESTDATA_CASES = [
    "test_conv_with_strides_padding", "test_transpose_all_permutations_0",
    "test_concat_1d_axis_0", "test_cast_FLOAT_to_DOUBLE", "test_gather_0",
    "test_softmax_axis_0", "test_maxpool_2d_pads", "test_leakyrelu",
    "test_gemm_all_attributes", "test_averagepool_2d_strides", "test_flatten_axis0",
]


# --------------------------------------------------------------------------
# Raw protobuf writing (for what onnx's Python library will not serialize).

def pb_varint(n):
    """Base-128 varint of n; negative numbers as 64-bit two's complement."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pb_key(field, wire):
    return pb_varint((field << 3) | wire)


def pb_len(field, payload):
    """A length-delimited field (message, string, bytes, packed)."""
    return pb_key(field, 2) + pb_varint(len(payload)) + payload


def pb_int(field, n):
    return pb_key(field, 0) + pb_varint(n)


def pb_str(field, s):
    return pb_len(field, s.encode() if isinstance(s, str) else s)


# Field numbers (onnx.proto; facts of the format).
MODEL_IR_VERSION, MODEL_GRAPH, MODEL_OPSET = 1, 7, 8
OPSET_DOMAIN, OPSET_VERSION = 1, 2
GRAPH_NODE, GRAPH_NAME, GRAPH_INIT, GRAPH_INPUT, GRAPH_OUTPUT = 1, 2, 5, 11, 12
NODE_INPUT, NODE_OUTPUT, NODE_NAME, NODE_OP, NODE_ATTR = 1, 2, 3, 4, 5
ATTR_NAME, ATTR_G, ATTR_TYPE = 1, 6, 20
VI_NAME, VI_TYPE = 1, 2
TYPE_TENSOR, TT_ELEM, TT_SHAPE = 1, 1, 2
SHAPE_DIM, DIM_VALUE = 1, 1
TENSOR_DIMS, TENSOR_DTYPE, TENSOR_NAME, TENSOR_RAW = 1, 2, 8, 9


def pb_value_info(name, elem_type=None, dims=None):
    body = pb_str(VI_NAME, name)
    if elem_type is not None:
        tt = pb_int(TT_ELEM, elem_type)
        if dims is not None:
            shape = b"".join(pb_len(SHAPE_DIM, pb_int(DIM_VALUE, d)) for d in dims)
            tt += pb_len(TT_SHAPE, shape)
        body += pb_len(VI_TYPE, pb_len(TYPE_TENSOR, tt))
    return body


def pb_model(graph_bytes, opset=OPSET):
    return (pb_int(MODEL_IR_VERSION, IR_VERSION) + pb_len(MODEL_GRAPH, graph_bytes) +
            pb_len(MODEL_OPSET, pb_str(OPSET_DOMAIN, "") + pb_int(OPSET_VERSION, opset)))


def pb_graph_attr(name, graph_bytes):
    return pb_str(ATTR_NAME, name) + pb_int(ATTR_TYPE, AttributeProto.GRAPH) + \
        pb_len(ATTR_G, graph_bytes)


def nested_if_model(depth):
    """An If whose then_branch holds an If, `depth` levels deep; each level is a
    well-formed If (cond "c", else_branch passes "x" through), so only the
    depth is wrong."""
    else_graph = pb_str(GRAPH_NAME, "e") + pb_len(GRAPH_OUTPUT, pb_value_info("x"))
    else_attr = pb_graph_attr("else_branch", else_graph)
    inner = (pb_len(GRAPH_NODE, pb_str(NODE_INPUT, "x") + pb_str(NODE_OUTPUT, "o") +
                    pb_str(NODE_OP, "Identity")) +
             pb_str(GRAPH_NAME, "t") + pb_len(GRAPH_OUTPUT, pb_value_info("o")))
    for _ in range(depth - 1):
        node = (pb_str(NODE_INPUT, "c") + pb_str(NODE_OUTPUT, "o") + pb_str(NODE_OP, "If") +
                pb_len(NODE_ATTR, pb_graph_attr("then_branch", inner)) +
                pb_len(NODE_ATTR, else_attr))
        inner = pb_len(GRAPH_NODE, node) + pb_str(GRAPH_NAME, "t") + \
            pb_len(GRAPH_OUTPUT, pb_value_info("o"))
    top = (pb_str(NODE_INPUT, "c") + pb_str(NODE_OUTPUT, "y") + pb_str(NODE_OP, "If") +
           pb_len(NODE_ATTR, pb_graph_attr("then_branch", inner)) + pb_len(NODE_ATTR, else_attr))
    graph = (pb_len(GRAPH_NODE, top) + pb_str(GRAPH_NAME, "deep_if") +
             pb_len(GRAPH_INPUT, pb_value_info("c", TensorProto.BOOL, [])) +
             pb_len(GRAPH_INPUT, pb_value_info("x", TensorProto.FLOAT, [2])) +
             pb_len(GRAPH_OUTPUT, pb_value_info("y", TensorProto.FLOAT, [2])))
    return pb_model(graph)


def nested_if_minimal(depth):
    """The smallest bytes that nest `depth` If levels: graph{node{attribute{g{...}}}}
    with nothing else below the top, so 100000 levels fit in about a megabyte.
    A parser that recurses per message without a limit overflows the stack."""
    # Built from the inside out without re-copying: lengths are known as we go.
    parts = []          # chunks, outermost last
    size = 0
    for _ in range(depth):
        # attribute { g: <inner graph> }
        attr_head = pb_key(ATTR_G, 2) + pb_varint(size)
        size += len(attr_head)
        # node { attribute: <attr> }
        node_head = pb_key(NODE_ATTR, 2) + pb_varint(size)
        size += len(node_head)
        # graph { node: <node> }
        graph_head = pb_key(GRAPH_NODE, 2) + pb_varint(size)
        size += len(graph_head)
        parts.append(graph_head + node_head + attr_head)
    chain = b"".join(reversed(parts))
    top = (pb_str(NODE_INPUT, "c") + pb_str(NODE_OUTPUT, "y") + pb_str(NODE_OP, "If") +
           pb_len(NODE_ATTR, pb_str(ATTR_NAME, "then_branch") +
                  pb_int(ATTR_TYPE, AttributeProto.GRAPH) + pb_len(ATTR_G, chain)))
    graph = (pb_len(GRAPH_NODE, top) +
             pb_len(GRAPH_INPUT, pb_value_info("c", TensorProto.BOOL, [])) +
             pb_len(GRAPH_OUTPUT, pb_value_info("y", TensorProto.FLOAT, [2])))
    return pb_model(graph)


# --------------------------------------------------------------------------
# Small valid models (the bases every mutation starts from).

def f32(shape, start=0.5):
    n = int(np.prod(shape)) if shape else 1
    return (np.arange(n, dtype=np.float32) * 0.25 + start).reshape(shape)


def finish(graph, opset=OPSET, ir=IR_VERSION):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                          producer_name="kiln-corpus")
    m.ir_version = ir
    return m


def base_add():
    g = helper.make_graph(
        [helper.make_node("Add", ["X", "W"], ["Y"], name="add0")], "add",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(f32([2, 3]), "W")])
    return finish(g)


def base_mlp():
    g = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W1"], ["h0"], name="mm1"),
         helper.make_node("Add", ["h0", "b1"], ["h1"], name="bias1"),
         helper.make_node("Relu", ["h1"], ["h2"], name="relu1"),
         helper.make_node("MatMul", ["h2", "W2"], ["Y"], name="mm2")], "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(f32([4, 3]), "W1"),
         numpy_helper.from_array(f32([3], -0.5), "b1"),
         numpy_helper.from_array(f32([3, 2], 1.0), "W2")])
    return finish(g)


def base_conv():
    g = helper.make_graph(
        [helper.make_node("Conv", ["X", "K"], ["c"], name="conv1", kernel_shape=[3, 3],
                          strides=[2, 1], pads=[1, 0, 1, 0]),
         helper.make_node("MaxPool", ["c"], ["Y"], name="pool1", kernel_shape=[2, 2])], "conv",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, 5, 5])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 1, 2, 2])],
        [numpy_helper.from_array(f32([1, 1, 3, 3]), "K")])
    return finish(g)


def base_if():
    one = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "one")
    then_g = helper.make_graph([helper.make_node("Add", ["X", "one"], ["t"])], "then_g", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Sub", ["X", "one"], ["e"])], "else_g", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    g = helper.make_graph(
        [helper.make_node("If", ["C"], ["Y"], name="if0", then_branch=then_g,
                          else_branch=else_g)], "ifm",
        [helper.make_tensor_value_info("C", TensorProto.BOOL, []),
         helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])], [one])
    return finish(g)


def base_reshape():
    g = helper.make_graph(
        [helper.make_node("Reshape", ["X", "shape"], ["r"], name="reshape0"),
         helper.make_node("Transpose", ["r"], ["t"], name="transpose0", perm=[1, 0]),
         helper.make_node("Concat", ["t", "X"], ["c"], name="concat0", axis=0),
         helper.make_node("Cast", ["c"], ["Y"], name="cast0", to=TensorProto.DOUBLE)],
        "reshape",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, [4, 3])],
        [numpy_helper.from_array(np.array([3, 2], np.int64), "shape")])
    return finish(g)


def base_gather():
    g = helper.make_graph(
        [helper.make_node("Gather", ["D", "I"], ["g"], name="gather0", axis=0),
         helper.make_node("Softmax", ["g"], ["Y"], name="softmax0", axis=-1)], "gather",
        [helper.make_tensor_value_info("I", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(f32([4, 3]), "D")])
    return finish(g)


BASES = {"add": base_add, "mlp": base_mlp, "conv": base_conv, "if": base_if,
         "reshape": base_reshape, "gather": base_gather}


def copy_model(m):
    c = onnx.ModelProto()
    c.CopyFrom(m)
    return c


def ser(m):
    return m.SerializeToString()


def init_of(m, name):
    for t in m.graph.initializer:
        if t.name == name:
            return t
    raise KeyError(name)


def node_of(m, name):
    for n in m.graph.node:
        if n.name == name:
            return n
    raise KeyError(name)


def set_attr(node, attr):
    """Replace (or add) the attribute of the same name."""
    for i, a in enumerate(node.attribute):
        if a.name == attr.name:
            del node.attribute[i]
            break
    node.attribute.append(attr)


def raw_attr(name, type_code, extra=b""):
    """An AttributeProto with an arbitrary type code (onnx's Python enum refuses
    unknown codes on assignment but keeps them when parsed)."""
    a = AttributeProto()
    a.ParseFromString(pb_str(ATTR_NAME, name) + pb_int(ATTR_TYPE, type_code) + extra)
    return a


def input_shape(m, name, dims):
    for vi in m.graph.input:
        if vi.name == name:
            shape = vi.type.tensor_type.shape
            del shape.dim[:]
            for d in dims:
                shape.dim.add().dim_value = d
            return
    raise KeyError(name)


# --------------------------------------------------------------------------
# The corpus.

class Corpus:
    """Collects cases, skips duplicate bytes, and writes them out."""

    def __init__(self):
        self.flat = {}        # name -> bytes
        self.external = {}    # name -> {filename: bytes}
        self.seen = set()

    def add(self, name, data, may_load=False):
        if may_load and not name.startswith("any_"):
            name = "any_" + name
        assert name not in self.flat, name
        h = hashlib.sha256(data).digest()
        if h in self.seen:
            return
        self.seen.add(h)
        self.flat[name] = data

    def add_external(self, name, files):
        assert name not in self.external, name
        self.external[name] = files

    def total_bytes(self):
        return (sum(len(d) for d in self.flat.values()) +
                sum(len(d) for files in self.external.values() for d in files.values()))

    def write(self, out_dir):
        flat_dir = os.path.join(out_dir, "onnx")
        ext_dir = os.path.join(out_dir, "onnx_external")
        # Keep fuzzer regression inputs (fuzz_*) that were added by hand.
        if os.path.isdir(flat_dir):
            for f in os.listdir(flat_dir):
                if not f.startswith("fuzz_") and not f.startswith("any_fuzz_"):
                    os.remove(os.path.join(flat_dir, f))
        shutil.rmtree(ext_dir, ignore_errors=True)
        os.makedirs(flat_dir, exist_ok=True)
        for name, data in sorted(self.flat.items()):
            with open(os.path.join(flat_dir, name + ".onnx"), "wb") as f:
                f.write(data)
        for name, files in sorted(self.external.items()):
            d = os.path.join(ext_dir, name)
            os.makedirs(d)
            for fn, data in files.items():
                p = os.path.join(d, fn)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "wb") as f:
                    f.write(data)


def parse_state(data):
    """How protobuf reads the bytes as a ModelProto: "bad" (framing error),
    "nograph" (parses, no graph: still a malformed model) or "graph"."""
    m = onnx.ModelProto()
    with warnings.catch_warnings():
        # A stray end-group tag stops the parse early with only a warning
        # ("Not all data was converted"): the byte count tells.
        warnings.simplefilter("ignore")
        try:
            if m.ParseFromString(data) != len(data):
                return "bad"
        except Exception:  # google.protobuf.message.DecodeError
            return "bad"
    return "graph" if m.HasField("graph") else "nograph"


def parses(data):
    """Whether the bytes parse as a ModelProto with a graph (so may be valid)."""
    return parse_state(data) == "graph"


def add_truncations(c, bases):
    """Cut each base at many offsets. A cut inside a field breaks the protobuf
    framing (trunc_*: the error must say so); a cut between top-level fields
    still parses, as a model without its graph (cut_*, still an error) or
    without its opset imports (any_cut_*)."""
    for bname, data in bases.items():
        n = len(data)
        step = 1 if n <= 160 else max(1, n // 45)
        offsets = sorted(set(list(range(0, n, step)) + [n - 1, n - 2, n // 2, 1, 2, 3]))
        for off in offsets:
            if off <= 0 or off >= n:
                continue
            cut = data[:off]
            state = parse_state(cut)
            prefix = {"bad": "trunc", "nograph": "cut", "graph": "any_cut"}[state]
            c.add(f"{prefix}_{bname}_{off:04d}", cut)


def add_bitflips(c, bases, rng):
    """Flip single bits at random offsets. A flip that still parses may well be
    a valid model (a changed weight), so those are any_ cases."""
    for bname, data in bases.items():
        for _ in range(14):
            off = rng.randrange(len(data))
            bit = rng.randrange(8)
            b = bytearray(data)
            b[off] ^= 1 << bit
            c.add(f"bitflip_{bname}_{off:04d}_{bit}", bytes(b), may_load=parses(bytes(b)))
        # Bytes forced to the varint edge values (length fields become huge,
        # tags become unknown or invalid).
        for _ in range(6):
            off = rng.randrange(len(data))
            for v in (0x00, 0x7F, 0x80, 0xFF):
                b = bytearray(data)
                if b[off] == v:
                    continue
                b[off] = v
                c.add(f"byteset_{bname}_{off:04d}_{v:02x}", bytes(b), may_load=parses(bytes(b)))
                break


def add_wire_cases(c):
    """Hand-written framing errors."""
    g = ser(base_add().graph)
    c.add("empty", b"")
    c.add("one_zero_byte", b"\x00")
    c.add("only_ir_version", pb_int(MODEL_IR_VERSION, IR_VERSION))
    c.add("graph_len_huge", pb_int(MODEL_IR_VERSION, 7) + pb_key(MODEL_GRAPH, 2) +
          pb_varint((1 << 63) - 1) + g)
    c.add("graph_len_2pow64_minus_1", pb_key(MODEL_GRAPH, 2) + b"\xff" * 9 + b"\x01" + g)
    c.add("graph_len_2pow32", pb_key(MODEL_GRAPH, 2) + pb_varint(1 << 32) + g)
    c.add("graph_len_one_too_many", pb_key(MODEL_GRAPH, 2) + pb_varint(len(g) + 1) + g)
    c.add("varint_11_bytes", pb_key(MODEL_IR_VERSION, 0) + b"\x80" * 10 + b"\x01" +
          pb_len(MODEL_GRAPH, g))
    c.add("varint_unterminated", pb_len(MODEL_GRAPH, g) + pb_key(MODEL_IR_VERSION, 0) +
          b"\x80" * 5)
    c.add("graph_wrong_wire_type", pb_key(MODEL_GRAPH, 0) + pb_varint(7))
    c.add("graph_fixed32_wire_type", pb_key(MODEL_GRAPH, 5) + b"\x01\x02\x03\x04")
    c.add("wire_type_6", pb_len(MODEL_GRAPH, g) + pb_key(20, 6) + b"\x00")
    c.add("wire_type_7", pb_key(3, 7) + pb_len(MODEL_GRAPH, g))
    c.add("field_number_0", b"\x02\x00" + pb_len(MODEL_GRAPH, g))
    c.add("start_group_unclosed", pb_len(MODEL_GRAPH, g) + pb_key(30, 3) + pb_int(1, 5))
    c.add("end_group_unopened", pb_len(MODEL_GRAPH, g) + pb_key(30, 4))
    c.add("node_len_past_graph", pb_len(MODEL_GRAPH, pb_key(GRAPH_NODE, 2) + pb_varint(200) +
                                        b"\x0a\x01X"))
    # Packed int64 dims whose payload ends inside a varint.
    t = pb_key(TENSOR_DIMS, 2) + pb_varint(3) + b"\x02\x83\x80" + pb_int(TENSOR_DTYPE, 1)
    c.add("packed_dims_cut_varint", pb_len(MODEL_GRAPH, pb_len(GRAPH_INIT, t)))
    # Packed floats whose payload is not a multiple of 4.
    t = (pb_int(TENSOR_DIMS, 2) + pb_int(TENSOR_DTYPE, 1) + pb_str(TENSOR_NAME, "W") +
         pb_len(4, b"\x00\x00\x80\x3f\x00\x00"))
    c.add("packed_float_odd_length", pb_len(MODEL_GRAPH, pb_len(GRAPH_INIT, t)))
    rng = random.Random(SEED + 1)
    for size in (1, 7, 64, 512, 4096):
        data = bytes(rng.randrange(256) for _ in range(size))
        prefix = {"bad": "random", "nograph": "garbage", "graph": "any_random"}
        c.add(f"{prefix[parse_state(data)]}_{size}", data)
    # Plausible start, then noise.
    data = ser(base_mlp())[:40] + bytes(rng.randrange(256) for _ in range(300))
    c.add("mlp_head_then_noise", data, may_load=parses(data))


def add_structure_cases(c):
    """Graphs that parse but do not hold together."""
    m = base_add()
    m.ClearField("graph")
    c.add("no_graph", ser(m))

    m = base_add()
    del m.graph.node[:]
    c.add("graph_output_never_produced_no_nodes", ser(m))

    m = base_add()
    m.graph.output.add().CopyFrom(helper.make_tensor_value_info("ghost_output", 1, [2, 3]))
    c.add("graph_output_never_produced", ser(m))

    m = base_mlp()
    node_of(m, "relu1").input[0] = "ghost_input"
    c.add("node_input_never_produced", ser(m))

    m = base_if()
    m.graph.node[0].attribute[0].g.node[0].input[1] = "ghost_in_branch"
    c.add("subgraph_input_never_produced", ser(m))

    # Cycle between two nodes: h1 = Add(h0, h2), h2 = Relu(h1).
    m = base_mlp()
    node_of(m, "bias1").input[1] = "h2"
    c.add("cycle_two_nodes", ser(m))

    m = base_mlp()
    node_of(m, "relu1").input[0] = "h2"
    c.add("cycle_self_loop", ser(m))

    # Three-node cycle with the graph output hanging off it.
    m = base_mlp()
    node_of(m, "mm1").input[0] = "h2"
    c.add("cycle_three_nodes", ser(m))

    # Acyclic but listed out of order: ONNX requires topological order, a
    # loader may sort instead.
    m = base_mlp()
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(reversed(nodes))
    c.add("any_nodes_out_of_order", ser(m))

    m = base_add()
    m.graph.node[0].op_type = "FrobnicateOp"
    c.add("unknown_op", ser(m))

    m = base_add()
    m.graph.node[0].domain = "com.example.nowhere"
    c.add("unknown_domain", ser(m))

    m = base_add()
    m.graph.node[0].op_type = ""
    c.add("empty_op_type", ser(m))

    m = base_if()
    m.graph.node[0].attribute[1].g.node[0].op_type = "FrobnicateOp"
    c.add("unknown_op_in_subgraph", ser(m))

    m = base_add()
    del m.graph.node[0].input[1]
    c.add("add_missing_input", ser(m))

    m = base_add()
    m.graph.node[0].input.append("X")
    c.add("add_extra_input", ser(m))

    m = base_add()
    m.graph.node[0].output.append("Y2")
    c.add("add_extra_output", ser(m))

    m = base_add()
    del m.graph.node[0].output[:]
    c.add("node_without_outputs", ser(m))

    m = base_add()
    del m.graph.output[:]
    c.add("any_graph_without_outputs", ser(m))

    m = base_add()
    m.graph.input[0].name = ""
    c.add("graph_input_empty_name", ser(m))

    m = base_add()
    m.graph.node[0].output[0] = ""
    c.add("node_output_empty_name", ser(m))

    # Duplicate names.
    m = base_add()
    m.graph.initializer.add().CopyFrom(numpy_helper.from_array(f32([2, 3], 9.0), "W"))
    c.add("duplicate_initializer", ser(m))

    m = base_mlp()
    node_of(m, "relu1").output[0] = "h1"
    c.add("duplicate_node_output", ser(m))

    m = base_mlp()
    node_of(m, "relu1").output[0] = "X"
    node_of(m, "mm2").input[0] = "X"
    c.add("duplicate_node_output_shadows_input", ser(m))

    m = base_mlp()
    node_of(m, "relu1").output[0] = "W2"
    node_of(m, "mm2").input[0] = "W2"
    c.add("duplicate_node_output_shadows_initializer", ser(m))

    m = base_add()
    m.graph.input.add().CopyFrom(m.graph.input[0])
    c.add("duplicate_graph_input", ser(m))

    m = base_conv()
    node_of(m, "pool1").output[0] = "c"
    c.add("duplicate_output_feeds_itself", ser(m))

    # Missing or odd opset imports.
    m = base_add()
    m.opset_import[0].version = 100000
    c.add("any_opset_version_100000", ser(m))

    m = base_add()
    m.opset_import[0].version = -1
    c.add("opset_version_negative", ser(m))

    m = base_add()
    m.ir_version = -5
    c.add("any_ir_version_negative", ser(m))

    m = base_add()
    del m.opset_import[:]
    c.add("any_no_opset_import", ser(m))

    # Types that do not fit.
    m = base_add()
    init_of(m, "W").CopyFrom(numpy_helper.from_array(np.arange(6, dtype=np.int64).reshape(2, 3),
                                                     "W"))
    c.add("add_float_int64", ser(m))

    m = base_add()
    init_of(m, "W").CopyFrom(numpy_helper.from_array(f32([4, 5]), "W"))
    c.add("add_shapes_do_not_broadcast", ser(m))

    m = base_mlp()
    init_of(m, "W2").CopyFrom(numpy_helper.from_array(f32([5, 2]), "W2"))
    c.add("matmul_inner_dim_mismatch", ser(m))

    m = base_reshape()
    init_of(m, "shape").CopyFrom(numpy_helper.from_array(np.array([4, 2], np.int64), "shape"))
    c.add("reshape_count_mismatch", ser(m))

    m = base_reshape()
    init_of(m, "shape").CopyFrom(numpy_helper.from_array(np.array([-1, -1], np.int64), "shape"))
    c.add("reshape_two_minus_one", ser(m))

    m = base_reshape()
    init_of(m, "shape").CopyFrom(numpy_helper.from_array(np.array([3, 2], np.float32), "shape"))
    c.add("reshape_shape_is_float", ser(m))

    m = base_if()
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT
    c.add("any_if_cond_float", ser(m))

    m = base_if()
    m.graph.node[0].attribute[1].g.output[0].type.tensor_type.shape.dim[0].dim_value = 3
    c.add("any_if_branches_disagree", ser(m))

    m = base_if()
    del m.graph.node[0].attribute[1]
    c.add("if_missing_else_branch", ser(m))

    m = base_if()
    del m.graph.node[0].attribute[0].g.output[:]
    c.add("if_then_branch_no_outputs", ser(m))

    # Signature-level oddities.
    m = base_add()
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 4
    c.add("input_shape_disagrees_with_initializer", ser(m))

    m = base_add()
    m.graph.input[0].type.ClearField("tensor_type")
    m.graph.input[0].type.sequence_type.elem_type.tensor_type.elem_type = TensorProto.FLOAT
    c.add("input_is_sequence", ser(m))

    m = base_add()
    m.graph.input[0].type.ClearField("tensor_type")
    c.add("any_input_without_type", ser(m))

    m = base_add()
    input_shape(m, "X", [1] * 9)
    m.graph.output[0].type.tensor_type.shape.Clear()
    init_of(m, "W").CopyFrom(numpy_helper.from_array(np.ones([1] * 9, np.float32), "W"))
    c.add("rank_9_tensor", ser(m))

    m = base_add()
    input_shape(m, "X", [1] * 40)
    c.add("input_rank_40", ser(m))

    # Resource bounds that compile or run would hit: any_ at load, but the fuzz
    # replay runs them and they must fail cleanly (KILN_TENSOR_MAX_BYTES).
    g = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["S"], ["Y"], name="cos0",
                          value=numpy_helper.from_array(np.array([1.0], np.float32), "v"))],
        "cos", [], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1 << 18, 1 << 18], np.int64), "S")])
    c.add("any_constantofshape_256gb", ser(finish(g)))
    g = helper.make_graph(
        [helper.make_node("Expand", ["X", "S"], ["Y"], name="expand0")], "expand",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1 << 40, 1 << 40], np.int64), "S")])
    c.add("any_expand_overflowing_shape", ser(finish(g)))


def add_tensor_cases(c):
    """Initializers and input shapes with bad sizes, counts and types."""
    def bad_init(name, mutate, base=base_add, init="W"):
        m = base()
        mutate(init_of(m, init))
        c.add(name, ser(m))

    def dims(d):
        def f(t):
            del t.dims[:]
            t.dims.extend(d)
        return f

    bad_init("init_huge_dim", dims([1 << 62]))
    bad_init("init_huge_dim_2x3", dims([1 << 62, 3]))
    bad_init("init_negative_dim", dims([-2, 3]))
    bad_init("init_negative_dim_minus_one", dims([2, -1]))
    bad_init("init_count_overflows_int64", dims([1 << 32, 1 << 32]))
    bad_init("init_count_overflows_int64_3d", dims([3037000500, 3037000500, 2]))
    bad_init("init_bytes_overflow_int64", dims([1 << 61, 2]))      # count fits, *4 does not
    bad_init("init_int64_min_dim", dims([-(1 << 63), 1]))
    bad_init("init_rank_9", dims([1] * 8 + [6]))

    # Zero elements, but a naive left-to-right product overflows first.
    def zero_huge(t):
        dims([1 << 62, 1 << 62, 0])(t)
        t.raw_data = b""
    m = base_add()
    zero_huge(init_of(m, "W"))
    c.add("any_init_zero_count_huge_dims", ser(m))

    def raw_len(n):
        def f(t):
            t.raw_data = bytes(range(n))
        return f
    bad_init("raw_data_short", raw_len(20))
    bad_init("raw_data_long", raw_len(28))
    bad_init("raw_data_empty", raw_len(0))
    bad_init("raw_data_one_byte", raw_len(1))

    def as_float_data(n):
        def f(t):
            t.ClearField("raw_data")
            t.float_data.extend([0.5] * n)
        return f
    bad_init("float_data_count_short", as_float_data(5))
    bad_init("float_data_count_long", as_float_data(7))

    def no_data(t):
        t.ClearField("raw_data")
    bad_init("init_without_data", no_data)

    def int64_data(n, dtype=TensorProto.INT64, d=(3, 2)):
        def f(t):
            t.ClearField("raw_data")
            t.data_type = dtype
            dims(list(d))(t)
            t.int64_data.extend(list(range(n)))
        return f
    bad_init("int64_data_count_short", int64_data(1), base_reshape, "shape")
    bad_init("int64_data_count_long", int64_data(3, d=[2]), base_reshape, "shape")
    bad_init("int64_data_for_float", int64_data(6, TensorProto.FLOAT, (2, 3)))

    def int32_data(n, dtype):
        def f(t):
            t.ClearField("raw_data")
            t.data_type = dtype
            t.int32_data.extend([1] * n)
        return f
    bad_init("int32_data_count_f16", int32_data(5, TensorProto.FLOAT16))
    bad_init("int32_data_count_bool", int32_data(7, TensorProto.BOOL))

    def dtype(code, raw=None):
        def f(t):
            t.data_type = code
            if raw is not None:
                t.raw_data = bytes(raw)
        return f
    bad_init("init_data_type_0", dtype(0))
    bad_init("init_data_type_99", dtype(99))
    bad_init("init_data_type_negative", dtype(-3))
    bad_init("init_data_type_float8e4m3_17", dtype(17, 6))
    bad_init("init_data_type_complex64_14", dtype(14, 48))
    bad_init("init_data_type_string_raw", dtype(TensorProto.STRING))

    def external_flag(t):
        t.data_location = TensorProto.EXTERNAL
    bad_init("init_external_flag_no_entries", external_flag)

    def data_location_99(t):
        t.MergeFromString(pb_int(14, 99))  # kept as an unknown enum value
    bad_init("init_data_location_99", data_location_99)

    def ext_in_flat_dir(t):
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        e = t.external_data.add()
        e.key, e.value = "location", "missing_weights.bin"
    bad_init("init_external_file_missing", ext_in_flat_dir)

    def segment(t):
        t.segment.begin = 0
        t.segment.end = 3
    bad_init("init_segmented", segment)

    def no_name(t):
        t.name = ""
    bad_init("init_without_name", no_name)

    # Graph input shapes.
    def bad_input(name, d, dt=None):
        m = base_add()
        input_shape(m, "X", d)
        if dt is not None:
            m.graph.input[0].type.tensor_type.elem_type = dt
        c.add(name, ser(m))
    bad_input("input_huge_dim", [2, 1 << 62])
    bad_input("input_negative_dim", [-3, 3])
    bad_input("input_int64_min_dim", [-(1 << 63), 3])
    bad_input("input_count_overflows_int64", [1 << 32, 1 << 32])
    bad_input("input_data_type_99", [2, 3], 99)
    bad_input("input_data_type_float8_17", [2, 3], 17)
    bad_input("any_input_data_type_0", [2, 3], 0)

    # Strings where numbers are needed.
    m = base_add()
    init_of(m, "W").CopyFrom(helper.make_tensor("W", TensorProto.STRING, [2, 3],
                                                [b"a", b"b", b"c", b"d", b"e", b"f"]))
    c.add("add_string_initializer", ser(m))

    m = base_add()
    t = init_of(m, "W")
    t.ClearField("raw_data")
    t.data_type = TensorProto.STRING
    t.string_data.extend([b"x"] * 4)
    c.add("string_data_count_mismatch", ser(m))


def add_sparse_cases(c):
    """Sparse initializers: one well formed (any_: support is optional) and the
    ways indices and values can disagree with the dense shape."""
    def sparse_model(values, indices, dims, idx_dims=None, idx_type=TensorProto.INT64):
        m = base_add()
        del m.graph.initializer[:]
        v = numpy_helper.from_array(np.asarray(values, np.float32), "W")
        i = helper.make_tensor("W_idx", idx_type,
                               idx_dims if idx_dims is not None else [len(indices)], indices)
        m.graph.sparse_initializer.add().CopyFrom(helper.make_sparse_tensor(v, i, dims))
        return ser(m)
    c.add("any_sparse_valid", sparse_model([1, 2, 3], [0, 2, 5], [2, 3]))
    c.add("sparse_index_out_of_range", sparse_model([1, 2, 3], [0, 2, 100], [2, 3]))
    c.add("sparse_index_negative", sparse_model([1, 2, 3], [-1, 2, 4], [2, 3]))
    c.add("sparse_index_huge", sparse_model([1, 2, 3], [0, 1, (1 << 62)], [2, 3]))
    c.add("sparse_count_mismatch", sparse_model([1, 2, 3], [0, 2], [2, 3]))
    c.add("sparse_more_values_than_elements",
          sparse_model(list(range(8)), list(range(8)), [2, 3]))
    c.add("sparse_dims_huge", sparse_model([1, 2, 3], [0, 2, 5], [1 << 62, 1 << 62]))
    c.add("sparse_dims_negative", sparse_model([1, 2, 3], [0, 2, 5], [-2, 3]))
    c.add("sparse_indices_float", sparse_model([1, 2, 3], [0.0, 2.0, 5.0], [2, 3],
                                               idx_type=TensorProto.FLOAT))
    c.add("sparse_2d_indices_out_of_range",
          sparse_model([1, 2, 3], [0, 0, 1, 2, 7, 7], [2, 3], idx_dims=[3, 2]))
    c.add("sparse_2d_indices_wrong_width",
          sparse_model([1, 2, 3], [0, 0, 1, 1, 1, 1, 0, 0, 0], [2, 3], idx_dims=[3, 3]))
    m = onnx.ModelProto()
    m.ParseFromString(sparse_model([1, 2, 3], [0, 2, 5], [2, 3]))
    m.graph.sparse_initializer[0].ClearField("values")
    c.add("sparse_without_values", ser(m))


def add_attribute_cases(c):
    """Attributes of the wrong type, arity or value on this script's models."""
    def with_attr(name, base, node, attr):
        m = base()
        set_attr(node_of(m, node), attr)
        c.add(name, ser(m))

    mk = helper.make_attribute
    with_attr("conv_kernel_shape_float", base_conv, "conv1", mk("kernel_shape", 3.0))
    with_attr("conv_strides_string", base_conv, "conv1", mk("strides", b"2,2"))
    with_attr("conv_pads_graph", base_conv, "conv1",
              mk("pads", helper.make_graph([], "g", [], [])))
    with_attr("conv_kernel_shape_rank_mismatch", base_conv, "conv1", mk("kernel_shape", [3]))
    with_attr("conv_kernel_shape_wrong", base_conv, "conv1", mk("kernel_shape", [5, 5]))
    with_attr("conv_strides_zero", base_conv, "conv1", mk("strides", [0, 0]))
    with_attr("conv_strides_negative", base_conv, "conv1", mk("strides", [-1, 2]))
    with_attr("conv_dilations_zero", base_conv, "conv1", mk("dilations", [0, 1]))
    with_attr("conv_pads_negative_huge", base_conv, "conv1", mk("pads", [-100, 0, 0, 0]))
    with_attr("conv_pads_huge", base_conv, "conv1", mk("pads", [1 << 62, 0, 1 << 62, 0]))
    with_attr("conv_pads_three", base_conv, "conv1", mk("pads", [1, 1, 1]))
    with_attr("conv_group_zero", base_conv, "conv1", mk("group", 0))
    with_attr("conv_group_three", base_conv, "conv1", mk("group", 3))
    with_attr("conv_auto_pad_bogus", base_conv, "conv1", mk("auto_pad", "SIDEWAYS"))
    with_attr("maxpool_kernel_zero", base_conv, "pool1", mk("kernel_shape", [0, 0]))
    with_attr("maxpool_kernel_larger_than_input", base_conv, "pool1",
              mk("kernel_shape", [9, 9]))
    with_attr("maxpool_kernel_shape_int", base_conv, "pool1", mk("kernel_shape", 2))
    with_attr("transpose_perm_int", base_reshape, "transpose0", mk("perm", 1))
    with_attr("transpose_perm_repeated", base_reshape, "transpose0", mk("perm", [0, 0]))
    with_attr("transpose_perm_out_of_range", base_reshape, "transpose0", mk("perm", [1, 5]))
    with_attr("transpose_perm_too_long", base_reshape, "transpose0", mk("perm", [0, 1, 2]))
    with_attr("transpose_perm_negative", base_reshape, "transpose0", mk("perm", [-1, 0]))
    with_attr("concat_axis_floats", base_reshape, "concat0", mk("axis", [0.0]))
    with_attr("concat_axis_out_of_range", base_reshape, "concat0", mk("axis", 5))
    with_attr("concat_axis_int64_min", base_reshape, "concat0", mk("axis", -(1 << 63)))
    # A float where an int is wanted, too large for int64 (a C cast is UB).
    with_attr("concat_axis_float_1e30", base_reshape, "concat0", mk("axis", 1e30))
    with_attr("softmax_axis_float_nan", base_gather, "softmax0", mk("axis", float("nan")))
    with_attr("transpose_perm_floats_inf", base_reshape, "transpose0",
              mk("perm", [float("inf"), 0.0]))
    with_attr("cast_to_string_attr", base_reshape, "cast0", mk("to", "DOUBLE"))
    with_attr("cast_to_99", base_reshape, "cast0", mk("to", 99))
    with_attr("cast_to_0", base_reshape, "cast0", mk("to", 0))
    with_attr("gather_axis_out_of_range", base_gather, "gather0", mk("axis", -10))
    with_attr("gather_axis_tensor", base_gather, "gather0",
              mk("axis", numpy_helper.from_array(np.array(0, np.int64))))
    with_attr("softmax_axis_out_of_range", base_gather, "softmax0", mk("axis", 7))
    with_attr("softmax_axis_strings", base_gather, "softmax0", mk("axis", [b"a", b"b"]))
    with_attr("if_then_branch_int", base_if, "if0", mk("then_branch", 1))
    with_attr("attr_type_99", base_reshape, "concat0", raw_attr("axis", 99, pb_int(3, 0)))
    with_attr("attr_type_negative", base_reshape, "concat0", raw_attr("axis", -1, pb_int(3, 0)))
    with_attr("attr_type_ints_but_float_set", base_reshape, "transpose0",
              raw_attr("perm", AttributeProto.INTS, b"\x15\x00\x00\x80\x3f"))
    with_attr("attr_type_graph_without_graph", base_if, "if0",
              raw_attr("then_branch", AttributeProto.GRAPH))
    with_attr("any_attr_type_0_with_int", base_reshape, "concat0", raw_attr("axis", 0,
                                                                            pb_int(3, 0)))

    m = base_reshape()
    node_of(m, "concat0").attribute.add().CopyFrom(mk("axis", 1))
    c.add("attr_duplicate_name", ser(m))

    m = base_reshape()
    del node_of(m, "cast0").attribute[:]
    c.add("cast_missing_to", ser(m))

    m = base_reshape()
    del node_of(m, "concat0").attribute[:]
    c.add("concat_missing_axis", ser(m))

    m = base_reshape()
    node_of(m, "concat0").attribute[0].name = ""
    c.add("attr_empty_name", ser(m))


def read_testdata_specs():
    """Op type, attributes, opset and input/output types of a few conformance
    models (only these facts are used; none of their bytes)."""
    specs = []
    for case in TESTDATA_CASES:
        path = os.path.join(TESTDATA_DIR, case, "model.onnx")
        if not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            raw = f.read()
        m = onnx.ModelProto()
        m.ParseFromString(raw)
        node = m.graph.node[0]
        ins = [(vi.type.tensor_type.elem_type,
                [d.dim_value for d in vi.type.tensor_type.shape.dim]) for vi in m.graph.input]
        outs = [(vi.type.tensor_type.elem_type,
                 [d.dim_value for d in vi.type.tensor_type.shape.dim]) for vi in m.graph.output]
        opset = max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
        specs.append(dict(case=case, raw=raw, op=node.op_type, attrs=list(node.attribute),
                          ins=ins, outs=outs, opset=opset, ir=m.ir_version))
    return specs


# For each attribute type, values of other types to put in its place.
WRONG_TYPED = {
    AttributeProto.INT: lambda n: [helper.make_attribute(n, 1.5), helper.make_attribute(n, [1, 2]),
                                   helper.make_attribute(n, b"1")],
    AttributeProto.FLOAT: lambda n: [helper.make_attribute(n, b"0.1"),
                                     helper.make_attribute(n, [0.1, 0.2])],
    AttributeProto.INTS: lambda n: [helper.make_attribute(n, 3), helper.make_attribute(n, 3.0),
                                    helper.make_attribute(n, [b"3", b"3"])],
}


def add_testdata_derived(c, specs):
    """Rebuild each conformance node in a fresh model (own value names, own
    shapes where they are large), then give each attribute a wrong type."""
    for s in specs:
        in_names = [f"in{i}" for i in range(len(s["ins"]))]
        out_names = [f"out{i}" for i in range(len(s["outs"]))]
        tag = s["op"].lower()
        for attr in s["attrs"]:
            makers = WRONG_TYPED.get(attr.type)
            if not makers:
                continue
            for k, wrong in enumerate(makers(attr.name)):
                attrs = [a for a in s["attrs"] if a.name != attr.name] + [wrong]
                node = helper.make_node(s["op"], in_names, out_names, name=f"{tag}_node")
                node.attribute.extend(attrs)
                g = helper.make_graph(
                    [node], f"{tag}_wrong_attr",
                    [helper.make_tensor_value_info(n, t, d) for n, (t, d) in zip(in_names,
                                                                                  s["ins"])],
                    [helper.make_tensor_value_info(n, t, None) for n, (t, _) in zip(out_names,
                                                                                     s["outs"])])
                c.add(f"attr_wrong_type_{tag}_{attr.name}_{k}", ser(finish(g, s["opset"])))


def check_no_testdata_copied(c, specs, window=64):
    """Fail if any output holds `window` consecutive bytes of a test model."""
    grams = set()
    for s in specs:
        raw = s["raw"]
        for i in range(len(raw) - window + 1):
            grams.add(raw[i:i + window])
    blobs = list(c.flat.items()) + [(f"{n}/{fn}", d) for n, files in c.external.items()
                                    for fn, d in files.items()]
    for name, data in blobs:
        for i in range(len(data) - window + 1):
            if data[i:i + window] in grams:
                raise SystemExit(f"{name}: holds bytes of a shared test model at offset {i}")


# --------------------------------------------------------------------------
# External data.

EXT_W = f32([2, 3])


def external_model(entries, data_location=TensorProto.EXTERNAL, extra_inits=()):
    """Bytes of the add model with W stored externally: entries is a list of
    (key, value) for TensorProto.external_data."""
    m = base_add()
    t = init_of(m, "W")
    t.ClearField("raw_data")
    t.data_location = data_location
    for k, v in entries:
        e = t.external_data.add()
        e.key, e.value = k, v
    for extra in extra_inits:
        m.graph.initializer.add().CopyFrom(extra)
    return ser(m)


def add_external_cases(c):
    w = EXT_W.tobytes()
    pad = bytes(8) + w  # the tensor at offset 8
    model = "model.onnx"
    c.add_external("absolute_path", {model: external_model([("location", "/etc/passwd")])})
    c.add_external("dotdot", {model: external_model([("location", "../weights.bin")]),
                              "weights.bin": w})
    c.add_external("dotdot_nested", {model: external_model([("location",
                                                             "sub/../../weights.bin")]),
                                     "sub/keep.bin": w, "weights.bin": w})
    c.add_external("dotdot_deep", {model: external_model([("location",
                                                           "../../../../../../etc/passwd")])})
    c.add_external("location_missing_file", {model: external_model([("location", "nope.bin")])})
    c.add_external("location_empty", {model: external_model([("location", "")]),
                                      "weights.bin": w})
    c.add_external("location_key_absent", {model: external_model([("offset", "0"),
                                                                  ("length", "24")]),
                                           "weights.bin": w})
    c.add_external("location_is_directory", {model: external_model([("location", "sub")]),
                                             "sub/keep.bin": w})
    c.add_external("location_is_dot", {model: external_model([("location", ".")]),
                                       "weights.bin": w})
    c.add_external("offset_beyond_file", {model: external_model([("location", "weights.bin"),
                                                                 ("offset", "100")]),
                                          "weights.bin": w})
    c.add_external("length_beyond_file", {model: external_model([("location", "weights.bin"),
                                                                 ("length", "1000")]),
                                          "weights.bin": w})
    c.add_external("offset_plus_length_beyond_file",
                   {model: external_model([("location", "weights.bin"), ("offset", "8"),
                                           ("length", "24")]), "weights.bin": w})
    c.add_external("offset_overflow", {model: external_model([("location", "weights.bin"),
                                                              ("offset", str((1 << 63) - 1)),
                                                              ("length", "24")]),
                                       "weights.bin": w})
    c.add_external("offset_negative", {model: external_model([("location", "weights.bin"),
                                                              ("offset", "-8")]),
                                       "weights.bin": pad})
    c.add_external("offset_not_a_number", {model: external_model([("location", "weights.bin"),
                                                                  ("offset", "eight")]),
                                           "weights.bin": pad})
    c.add_external("offset_trailing_junk", {model: external_model([("location", "weights.bin"),
                                                                   ("offset", "8x")]),
                                            "weights.bin": pad})
    c.add_external("offset_2pow64", {model: external_model([("location", "weights.bin"),
                                                            ("offset", str(1 << 64))]),
                                     "weights.bin": pad})
    c.add_external("length_wrong_for_shape", {model: external_model([("location", "weights.bin"),
                                                                     ("length", "16")]),
                                              "weights.bin": w})
    c.add_external("file_too_short_for_shape", {model: external_model([("location",
                                                                        "weights.bin")]),
                                                "weights.bin": w[:20]})
    c.add_external("file_empty", {model: external_model([("location", "weights.bin")]),
                                  "weights.bin": b""})
    # External data and a huge shape: the size check must come before reading.
    m = onnx.ModelProto()
    m.ParseFromString(external_model([("location", "weights.bin")]))
    init_of(m, "W").dims[0] = 1 << 62
    c.add_external("huge_dims_external", {model: ser(m), "weights.bin": w})
    # A C string stops at the NUL and would name weights.bin; rejecting it
    # needs the length of the protobuf string, so either outcome is accepted.
    c.add_external("any_location_with_nul",
                   {model: external_model([("location", "weights.bin\x00.txt")]),
                    "weights.bin": w})
    # Both inline bytes and an external location: ambiguous, either is accepted.
    m = onnx.ModelProto()
    m.ParseFromString(external_model([("location", "weights.bin")]))
    init_of(m, "W").raw_data = w
    c.add_external("any_raw_data_and_external", {model: ser(m), "weights.bin": w})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "tests", "corpus"))
    args = ap.parse_args()

    for name, make in BASES.items():
        onnx.checker.check_model(make(), full_check=True)

    c = Corpus()
    rng = random.Random(SEED)
    bases = {name: ser(make()) for name, make in BASES.items()}
    add_wire_cases(c)
    add_truncations(c, bases)
    add_bitflips(c, bases, rng)
    add_structure_cases(c)
    add_tensor_cases(c)
    add_sparse_cases(c)
    add_attribute_cases(c)
    specs = read_testdata_specs()
    add_testdata_derived(c, specs)
    c.add("if_nested_3000", nested_if_model(3000))
    c.add("if_nested_100000_minimal", nested_if_minimal(100000))
    add_external_cases(c)

    check_no_testdata_copied(c, specs)
    total = c.total_bytes()
    if total >= MAX_CORPUS_BYTES:
        raise SystemExit(f"corpus is {total} bytes, over {MAX_CORPUS_BYTES}")
    c.write(os.path.abspath(args.out))
    print(f"{len(c.flat)} flat cases, {len(c.external)} external cases, {total} bytes "
          f"({len(specs)} test models read for op facts)")


if __name__ == "__main__":
    sys.exit(main())
