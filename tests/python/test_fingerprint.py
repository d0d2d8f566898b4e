"""`kiln fingerprint MODEL` (docs/SECURITY.md): the same weights and ops
give the same fingerprint however the file stores them (raw_data, typed
float_data/int64_data fields, external data, other names), and one changed
weight, one changed op or one changed attribute gives another.

The reference is the canonical form as docs/SECURITY.md specifies it,
computed here in Python from the ONNX graph with hashlib's BLAKE2b, for a
model whose nodes are already in topological order.
"""

import hashlib
import struct
import subprocess

import numpy as np
import pytest

import test_serve
from test_serve import KILN

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = test_serve.pytestmark

RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((4, 5)).astype(np.float32)
B1 = RNG.standard_normal((5,)).astype(np.float32)
W2 = RNG.standard_normal((5, 3)).astype(np.float32)
SHAPE = np.array([1, 3], np.int64)


def tensor(name, arr, raw):
    if raw:
        return numpy_helper.from_array(arr, name)
    dt = TensorProto.FLOAT if arr.dtype == np.float32 else TensorProto.INT64
    return helper.make_tensor(name, dt, arr.shape, arr.flatten().tolist(), raw=False)


def build(raw=True, prefix="", w1=W1, act="Relu", alpha=None):
    """x[N,4] -> MatMul W1 -> Add B1 -> act -> MatMul W2 -> Reshape [1,3]."""
    p = prefix
    x = helper.make_tensor_value_info(p + "x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info(p + "y", TensorProto.FLOAT, None)
    inits = [tensor(p + "w1", w1, raw), tensor(p + "b1", B1, raw), tensor(p + "w2", W2, raw),
             tensor(p + "shape", SHAPE, raw)]
    act_node = (helper.make_node(act, [p + "h1"], [p + "h2"], name=p + "act")
                if alpha is None else
                helper.make_node(act, [p + "h1"], [p + "h2"], name=p + "act", alpha=alpha))
    nodes = [helper.make_node("MatMul", [p + "x", p + "w1"], [p + "h0"], name=p + "mm1"),
             helper.make_node("Add", [p + "h0", p + "b1"], [p + "h1"], name=p + "add"),
             act_node,
             helper.make_node("MatMul", [p + "h2", p + "w2"], [p + "h3"], name=p + "mm2"),
             helper.make_node("Reshape", [p + "h3", p + "shape"], [p + "y"], name=p + "rs")]
    g = helper.make_graph(nodes, p + "g", [x], [y], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def fingerprint(path):
    r = subprocess.run([KILN, "fingerprint", str(path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout.strip()
    assert out.startswith("kiln-fp1:") and len(out) == 9 + 64, out
    return out


# ---- the documented canonical form, independently

def u64(v):
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


def bstr(b):
    return u64(len(b)) + b


def canonical(model, dtype_codes):
    g = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    producer = {}
    for k, n in enumerate(g.node):
        for o, name in enumerate(n.output):
            producer[name] = (k, o)
    inputs = [i.name for i in g.input if i.name not in inits]
    const_id = {}
    out = [bstr(b"kiln-fingerprint-v1"), u64(ord("G")), u64(len(inputs))]
    for i in g.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        out += [u64(dtype_codes[t.elem_type]), u64(len(t.shape.dim))]

    def ref(name):
        if name in inputs:
            return u64(ord("I")) + u64(inputs.index(name))
        if name in producer:
            return u64(ord("N")) + u64(producer[name][0]) + u64(producer[name][1])
        if name in const_id:
            return u64(ord("K")) + u64(const_id[name])
        const_id[name] = len(const_id)
        a = inits[name]
        code = dtype_codes[{np.dtype(np.float32): TensorProto.FLOAT,
                            np.dtype(np.int64): TensorProto.INT64}[a.dtype]]
        return (u64(ord("C")) + u64(code) + u64(a.ndim) + b"".join(u64(d) for d in a.shape)
                + bstr(np.ascontiguousarray(a).tobytes()))

    out.append(u64(len(g.node)))
    for n in g.node:
        out += [bstr(n.op_type.encode()), u64(len(n.input))]
        out += [ref(i) for i in n.input]
        out += [u64(len(n.output)), u64(len(n.attribute))]
        for a in sorted(n.attribute, key=lambda a: a.name):
            assert a.type == onnx.AttributeProto.FLOAT
            out += [bstr(a.name.encode()), u64(1), struct.pack("<f", a.f)]
    out.append(u64(len(g.output)))
    out += [ref(o.name) for o in g.output]
    return "kiln-fp1:" + hashlib.blake2b(b"".join(out), digest_size=32).hexdigest()


def dtype_codes():
    """Kiln's dtype numbers, from the public header (kiln_dtype)."""
    import re
    from test_serve import REPO
    text = (REPO / "include" / "kiln" / "kiln.h").read_text()
    enum = text[text.index("typedef enum kiln_dtype"):]
    enum = enum[:enum.index("}")]
    names = re.findall(r"KILN_DTYPE_(\w+)(?:\s*=\s*(\d+))?", enum)
    codes, v = {}, -1
    for name, num in names:
        v = int(num) if num else v + 1
        codes[name] = v
    return {TensorProto.FLOAT: codes["F32"], TensorProto.INT64: codes["I64"]}


def test_fingerprint_matches_the_documented_canonical_form(tmp_path):
    m = build()
    onnx.save(m, str(tmp_path / "m.onnx"))
    assert fingerprint(tmp_path / "m.onnx") == canonical(m, dtype_codes())
    m = build(act="LeakyRelu", alpha=0.25)
    onnx.save(m, str(tmp_path / "leaky.onnx"))
    assert fingerprint(tmp_path / "leaky.onnx") == canonical(m, dtype_codes())


def test_fingerprint_survives_reserialization(tmp_path):
    onnx.save(build(raw=True), str(tmp_path / "raw.onnx"))
    onnx.save(build(raw=False), str(tmp_path / "typed.onnx"))
    onnx.save(build(raw=True, prefix="renamed_"), str(tmp_path / "renamed.onnx"))
    (tmp_path / "ext").mkdir()
    onnx.save(build(raw=True), str(tmp_path / "ext" / "model.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    assert (tmp_path / "ext" / "weights.bin").stat().st_size > 0
    m = onnx.load(str(tmp_path / "typed.onnx"))
    assert not m.graph.initializer[0].raw_data and m.graph.initializer[0].float_data
    fps = {name: fingerprint(tmp_path / name)
           for name in ("raw.onnx", "typed.onnx", "renamed.onnx", "ext/model.onnx")}
    assert len(set(fps.values())) == 1, fps


def test_fingerprint_changes_with_one_weight_an_op_or_an_attribute(tmp_path):
    onnx.save(build(), str(tmp_path / "base.onnx"))
    w = W1.copy()
    w[2, 3] = np.nextafter(w[2, 3], np.float32(np.inf))  # one ulp of one weight
    onnx.save(build(w1=w), str(tmp_path / "weight.onnx"))
    onnx.save(build(act="Sigmoid"), str(tmp_path / "op.onnx"))
    onnx.save(build(act="LeakyRelu", alpha=0.25), str(tmp_path / "a1.onnx"))
    onnx.save(build(act="LeakyRelu", alpha=0.5), str(tmp_path / "a2.onnx"))
    fps = [fingerprint(tmp_path / n) for n in
           ("base.onnx", "weight.onnx", "op.onnx", "a1.onnx", "a2.onnx")]
    assert len(set(fps)) == len(fps), fps


def test_fingerprint_of_a_bad_model_is_an_error(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage")
    r = subprocess.run([KILN, "fingerprint", str(tmp_path / "bad.onnx")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("kiln: ")
