#!/usr/bin/env python3
"""make_tflite_corpus.py - small TFLite models written from scratch.

A FlatBuffer writer of a few dozen lines (tables laid out front to back,
each child after the field that points to it) and the TFLite schema's field
ids are enough to write .tflite files without TensorFlow. The test suite
(tests/python/test_tflite.py) builds one-op models with it to check each
float op Kiln lowers against numpy; `python3 tools/make_tflite_corpus.py
DIR` writes the fuzzing seed corpus (tests/corpus/tflite/): valid models of
every supported op, float and quantized, and malformed ones (truncated,
vtable and offsets pointing outside the file, vectors longer than the file,
indices out of range, a custom op, a wrong options type).
"""
import pathlib
import struct
import sys

import numpy as np

F32, F16, I32, U8, I64, I16, I8 = 0, 1, 2, 3, 4, 7, 9

# BuiltinOperator codes and BuiltinOptions union types (schema.fbs)
OPS = {"ADD": (0, 11), "AVERAGE_POOL_2D": (1, 5), "CONCATENATION": (2, 10), "CONV_2D": (3, 1),
       "DEPTHWISE_CONV_2D": (4, 2), "DEQUANTIZE": (6, 0), "FULLY_CONNECTED": (9, 8),
       "LOGISTIC": (14, 0), "MAX_POOL_2D": (17, 5), "MUL": (18, 21), "RELU": (19, 0),
       "RELU6": (21, 0), "RESHAPE": (22, 17), "SOFTMAX": (25, 9), "TANH": (28, 0),
       "CUSTOM": (32, 0), "PAD": (34, 22), "TRANSPOSE": (39, 26), "MEAN": (40, 27),
       "SUB": (41, 28), "DIV": (42, 29), "SQUEEZE": (43, 30), "STRIDED_SLICE": (45, 32),
       "QUANTIZE": (114, 0), "SVDF": (27, 6), "LSTM": (16, 14), "UNIDIRECTIONAL_SEQUENCE_LSTM": (44, 71)}


class Builder:
    """Writes a FlatBuffer front to back. A table is a list indexed by field
    id of None or (kind, value); kinds: u8 i8 i32 u32 f32 i64 u64 (scalars),
    str, table, vi32 vf32 vi64 vu8 (vectors), vtable (vector of tables)."""

    SCALAR = {"u8": "B", "i8": "b", "i32": "i", "u32": "I", "f32": "f", "i64": "q", "u64": "Q"}

    def __init__(self):
        self.buf = bytearray(8)

    def align(self, n, extra=0):
        while (len(self.buf) + extra) % n:
            self.buf += b"\0"

    def table(self, fields):
        inline = []  # (field id, kind, value, size)
        for fid, f in enumerate(fields):
            if f is None:
                continue
            kind, value = f
            size = struct.calcsize(self.SCALAR[kind]) if kind in self.SCALAR else 4
            inline.append((fid, kind, value, size))
        inline.sort(key=lambda x: -x[3])  # 8-byte fields first: they stay aligned
        obj_len = 4 + sum(s for *_, s in inline)
        offsets = {}
        o = 4
        for fid, _, _, size in inline:
            offsets[fid] = o
            o += size
        self.align(2)
        vt_pos = len(self.buf)
        nf = len(fields)
        self.buf += struct.pack(f"<HH{nf}H", 4 + 2 * nf, obj_len,
                                *[offsets.get(i, 0) for i in range(nf)])
        self.align(8)
        pos = len(self.buf)
        self.buf += struct.pack("<i", pos - vt_pos) + bytes(obj_len - 4)
        refs = []
        for fid, kind, value, size in inline:
            at = pos + offsets[fid]
            if kind in self.SCALAR:
                struct.pack_into("<" + self.SCALAR[kind], self.buf, at, value)
            else:
                refs.append((at, kind, value))
        for at, kind, value in refs:
            child = self.emit(kind, value)
            struct.pack_into("<I", self.buf, at, child - at)
        return pos

    def emit(self, kind, value):
        if kind == "table":
            return self.table(value)
        if kind == "str":
            data = value.encode()
            self.align(4)
            pos = len(self.buf)
            self.buf += struct.pack("<I", len(data)) + data + b"\0"
            return pos
        if kind == "vtable":
            self.align(4)
            pos = len(self.buf)
            self.buf += struct.pack("<I", len(value)) + bytes(4 * len(value))
            for i, t in enumerate(value):
                child = self.table(t)
                struct.pack_into("<I", self.buf, pos + 4 + 4 * i, child - (pos + 4 + 4 * i))
            return pos
        fmt = {"vi32": "i", "vf32": "f", "vi64": "q", "vu8": "B"}[kind]
        size = struct.calcsize(fmt)
        self.align(max(size, 16) if kind == "vu8" else max(size, 4), 4)
        pos = len(self.buf)
        self.buf += struct.pack(f"<I{len(value)}{fmt}", len(value), *value)
        return pos

    def finish(self, root_fields, ident=b"TFL3"):
        root = self.table(root_fields)
        struct.pack_into("<I", self.buf, 0, root)
        self.buf[4:8] = ident
        return bytes(self.buf)


def tensor(shape, ttype=F32, buffer=0, name="t", quant=None, signature=None):
    """A Tensor table; quant = (scales, zero points, quantized dimension)."""
    q = None
    if quant:
        scales, zps, dim = quant
        q = ("table", [None, None, ("vf32", list(scales)), ("vi64", list(zps)), None, None,
                       ("i32", dim)])
    return [("vi32", list(shape)), ("i8", ttype), ("u32", buffer), ("str", name), q, None, None,
            ("vi32", list(signature)) if signature else None]


def operator(opcode_index, inputs, outputs, opt_type=0, opts=None, intermediates=None):
    op = [("u32", opcode_index), ("vi32", list(inputs)), ("vi32", list(outputs)),
          ("u8", opt_type) if opt_type else None, ("table", opts) if opts is not None else None]
    if intermediates is not None:  # field 8, after custom options (5, 6) and mutating inputs (7)
        op += [None, None, None, ("vi32", list(intermediates))]
    return op


class Model:
    """One subgraph under construction: tensors, constant buffers, operators."""

    def __init__(self):
        self.tensors, self.buffers, self.ops, self.codes = [], [[]], [], []
        self.inputs, self.outputs, self.sigs = [], [], []

    def add(self, shape, ttype=F32, name=None, data=None, quant=None, signature=None):
        buf = 0
        if data is not None:
            self.buffers.append(list(np.ascontiguousarray(data).tobytes()))
            buf = len(self.buffers) - 1
        self.tensors.append(tensor(shape, ttype, buf, name or f"t{len(self.tensors)}", quant,
                                   signature))
        return len(self.tensors) - 1

    def const(self, arr, ttype=None, name=None, quant=None):
        arr = np.asarray(arr)
        ttype = ttype if ttype is not None else {np.float32: F32, np.float16: F16, np.int32: I32,
                                                  np.int8: I8, np.int16: I16,
                                                  np.uint8: U8, np.int64: I64}[arr.dtype.type]
        return self.add(arr.shape, ttype, name, arr, quant)

    def op(self, name, inputs, outputs, opts=None, custom=None, intermediates=None):
        code, opt_type = OPS[name]
        key = (code, custom)
        if key not in self.codes:
            self.codes.append(key)
        self.ops.append(operator(self.codes.index(key), inputs, outputs,
                                 opt_type if opts is not None else 0, opts, intermediates))

    def bytes(self):
        b = Builder()
        codes = []
        for code, custom in self.codes:
            codes.append([("i8", min(code, 127)), ("str", custom) if custom else None,
                          ("i32", 1), ("i32", code)])
        sg = [("vtable", self.tensors), ("vi32", self.inputs), ("vi32", self.outputs),
              ("vtable", self.ops), ("str", "main")]
        sigs = None
        if self.sigs:
            sigs = ("vtable", [[("vtable", [[("str", n), ("u32", i)] for n, i in ins]),
                                ("vtable", [[("str", n), ("u32", i)] for n, i in outs]),
                                ("str", key), None, ("u32", 0)] for key, ins, outs in self.sigs])
        root = [("u32", 3), ("vtable", codes), ("vtable", [sg]), ("str", "kiln test"),
                ("vtable", [[("vu8", d)] if d else [] for d in self.buffers]), None, None, sigs]
        return b.finish(root)


def unary(op, shape=(2, 3), opts=None):
    m = Model()
    x = m.add(shape, name="x")
    y = m.add(shape, name="y")
    m.op(op, [x], [y], opts)
    m.inputs, m.outputs = [x], [y]
    return m


def lstm_model(batch, seq, nin, hidden, time_major=False, peephole=False, seed=0, cifg=False,
               proj=0, proj_bias=True, layer_norm=False, cell_clip=0.0, proj_clip=0.0,
               act=4, one_step=False, hybrid=False, asym=False):
    """A float UNIDIRECTIONAL_SEQUENCE_LSTM (or, one_step, an LSTM of input
    [batch, nin]) with the optional features: CIFG (no input gate), proj
    outputs of projection (with a bias when proj_bias), layer norm, clipping,
    activation act; returns the model and its weights {name: array, None when
    absent}: w_g, r_g, b_g (g in i, f, c, o), p_i, p_f, p_o, ln_g, proj_w, proj_b.
    hybrid: the weight matrices and peepholes become int8 with one symmetric
    scale each (max |w| / 127, as TFLite's converter quantizes them), stored
    as s_<name>; asym sets asymmetric_quantize_inputs."""
    rng = np.random.default_rng(seed)
    m = Model()
    nout = proj or hidden
    shape = [batch, nin] if one_step else [seq, batch, nin] if time_major else [batch, seq, nin]
    x = m.add(shape, name="x")
    wts = {}

    def rnd(*s):
        return (rng.standard_normal(s) * 0.5).astype(np.float32)
    gates = "fco" if cifg else "ifco"
    for g in "ifco":
        wts["w_" + g] = rnd(hidden, nin) if g in gates else None
    for g in "ifco":
        wts["r_" + g] = rnd(hidden, nout) if g in gates else None
    for g in "ifco":
        wts["b_" + g] = rnd(hidden) if g in gates else None
    for g in "ifo":
        wts["p_" + g] = rnd(hidden) if peephole and g in gates else None
    for g in "ifco":
        wts["ln_" + g] = (1 + rnd(hidden)) if layer_norm and g in gates else None
    wts["proj_w"] = rnd(proj, hidden) if proj else None
    wts["proj_b"] = rnd(proj) if proj and proj_bias else None

    if hybrid:
        for k in [k for k in wts if k[:2] in ("w_", "r_", "p_") or k == "proj_w"]:
            if wts[k] is not None:
                sc = np.float32(np.abs(wts[k]).max() / 127)
                wts[k] = np.clip(np.round(wts[k] / sc), -127, 127).astype(np.int8)
                wts["s_" + k] = sc

    def c(k):
        if wts[k] is None:
            return -1
        if wts[k].dtype == np.int8:
            return m.const(wts[k], quant=([float(wts["s_" + k])], [0], 0))
        return m.const(wts[k])
    ins = [x] + [c("w_" + g) for g in "ifco"] + [c("r_" + g) for g in "ifco"]
    ins += [c("p_" + g) for g in "ifo"] + [c("b_" + g) for g in "ifco"]
    ins += [c("proj_w"), c("proj_b")]
    h0 = m.add([batch, nout], name="h_state")
    c0 = m.add([batch, hidden], name="c_state")
    m.tensors[h0][5] = ("u8", 1)  # is_variable
    m.tensors[c0][5] = ("u8", 1)
    ins += [h0, c0]
    if layer_norm:
        ins += [c("ln_" + g) for g in "ifco"]
    out_shape = ([batch, nout] if one_step else [seq, batch, nout] if time_major
                 else [batch, seq, nout])
    y = m.add(out_shape, name="y")
    opts = [("i8", act), ("f32", cell_clip), ("f32", proj_clip)]
    tail = [("u8", 1)] if asym else []
    if one_step:
        m.op("LSTM", ins, [y], opts + ([("u8", 0)] + tail if tail else []))
    else:
        m.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ins, [y],
             opts + [("u8", 1 if time_major else 0)] + tail)
    m.inputs, m.outputs = [x], [y]
    return m, wts


def lstm_int_model(batch, seq, nin, hidden, time_major=False, peephole=False, seed=0,
                   cifg=False, proj=0, proj_bias=True, layer_norm=False, cell_clip=0.0,
                   proj_clip=0.0, one_step=False, cell_scale=-11, n_inter=5, x_scale=6 / 255,
                   w_gain=1.0):
    """A fully integer LSTM (TFLite's "8x8_16": int8 input, weights and output
    state, int16 cell state, 5 intermediates) quantized from lstm_model's float
    weights the way TFLite's quantizer lays it out: int8 weight matrices and
    projection with one symmetric scale (max |w| / 127), int16 peepholes and
    layer norm coefficients (max |v| / 32767), int32 gate biases (scale s_in
    s_w, or with layer norm s_ln / 1024), an int32 projection bias (s_hidden
    s_proj), cell state scale 2^cell_scale. w_gain scales the float weights
    before quantizing (large gains saturate the gates). Returns the model and
    {name: int array or None, "s_" + name: scale, and the activation scales
    and zero points: s_in, zp_in, s_state, zp_state, s_hidden, zp_hidden,
    s_inter (5), cell_scale, float: the float weights}."""
    _, fw = lstm_model(batch, seq, nin, hidden, time_major, peephole, seed, cifg, proj, proj_bias,
                       layer_norm, cell_clip, proj_clip, 4, one_step)
    f32 = np.float32
    nout = proj or hidden
    q = {"float": fw, "s_in": f32(x_scale), "zp_in": 5, "cell_scale": cell_scale,
         "s_cell": f32(2.0 ** cell_scale)}
    if proj:
        q.update(s_state=f32(1 / 64), zp_state=2, s_hidden=f32(1 / 128), zp_hidden=-1)
    else:  # the hidden intermediate is the output state (TFLite negates its zero point)
        q.update(s_state=f32(1 / 128), zp_state=-3, s_hidden=f32(1 / 128), zp_hidden=3)
    q["s_inter"] = [f32(0.002 if layer_norm else 0.007)] * 4 + [q["s_hidden"]]
    for k, v in fw.items():
        if v is None:
            q[k] = None
        elif k[:2] in ("w_", "r_") or k == "proj_w":
            v = v * w_gain
            q["s_" + k] = f32(np.abs(v).max() / 127)
            q[k] = np.clip(np.round(v / q["s_" + k]), -127, 127).astype(np.int8)
        elif k[:2] in ("p_", "ln"):
            q["s_" + k] = f32(np.abs(v).max() / 32767)
            q[k] = np.clip(np.round(v / q["s_" + k]), -32767, 32767).astype(np.int16)
    for g in "ifco":
        b = fw["b_" + g]
        if b is not None:
            q["s_b_" + g] = (f32(q["s_ln_" + g] / 1024) if layer_norm
                             else f32(q["s_in"] * q["s_w_" + g]))
            q["b_" + g] = np.round(b / q["s_b_" + g]).astype(np.int32)
    if fw["proj_b"] is not None:
        q["s_proj_b"] = f32(q["s_hidden"] * q["s_proj_w"])
        q["proj_b"] = np.round(fw["proj_b"] / q["s_proj_b"]).astype(np.int32)
    m = Model()
    shape = [batch, nin] if one_step else [seq, batch, nin] if time_major else [batch, seq, nin]
    x = m.add(shape, I8, "x", quant=([q["s_in"]], [q["zp_in"]], 0))

    def c(k):
        if q.get(k) is None:
            return -1
        return m.const(q[k], name=k, quant=([float(q["s_" + k])], [0], 0))
    ins = [x] + [c("w_" + g) for g in "ifco"] + [c("r_" + g) for g in "ifco"]
    ins += [c("p_" + g) for g in "ifo"] + [c("b_" + g) for g in "ifco"]
    ins += [c("proj_w"), c("proj_b")]
    h0 = m.add([batch, nout], I8, "h_state", quant=([q["s_state"]], [q["zp_state"]], 0))
    c0 = m.add([batch, hidden], I16, "c_state", quant=([q["s_cell"]], [0], 0))
    m.tensors[h0][5] = ("u8", 1)  # is_variable
    m.tensors[c0][5] = ("u8", 1)
    ins += [h0, c0] + [c("ln_" + g) for g in "ifco"]
    inter = [m.add([], I16 if i < 4 else I8, f"intermediate_{i}",
                   quant=([q["s_inter"][min(i, 4)]], [0 if i != 4 else q["zp_hidden"]], 0))
             for i in range(n_inter)]
    out_shape = ([batch, nout] if one_step else [seq, batch, nout] if time_major
                 else [batch, seq, nout])
    y = m.add(out_shape, I8, "y", quant=([q["s_state"]], [q["zp_state"]], 0))
    opts = [("i8", 4), ("f32", cell_clip), ("f32", proj_clip)]
    if one_step:
        m.op("LSTM", ins, [y], opts, intermediates=inter)
    else:
        m.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ins, [y], opts + [("u8", 1 if time_major else 0)],
             intermediates=inter)
    m.inputs, m.outputs = [x], [y]
    return m, q


def lstm_basic_model(batch, nin, nout, seed=0):
    """A float LSTM with kernel_type BASIC: inputs x [batch, nin], h and c
    [batch, nout]; outputs activ, state, concat, activ_temp. Returns the model
    and its weights (w [4 nout, nin + nout], b [4 nout])."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((4 * nout, nin + nout)) * 0.5).astype(np.float32)
    b = (rng.standard_normal(4 * nout) * 0.5).astype(np.float32)
    m = Model()
    x, h, c = (m.add([batch, n], name=nm) for n, nm in ((nin, "x"), (nout, "h"), (nout, "c")))
    outs = [m.add(s, name=nm) for s, nm in (([batch, nout], "activ"), ([batch, nout], "state"),
                                            ([batch, nin + nout], "concat"),
                                            ([batch, 4 * nout], "activ_temp"))]
    m.op("LSTM", [x, h, m.const(w), m.const(b), c], outs,
         [("i8", 4), ("f32", 0.0), ("f32", 0.0), ("u8", 1)])
    m.inputs, m.outputs = [x, h, c], outs
    return m, {"w": w, "b": b}


def corpus():
    """{file name: bytes} of the seed corpus."""
    out = {}
    rng = np.random.default_rng(5)

    m = Model()
    a, b = m.add([1, 4], name="a", signature=[-1, 4]), m.add([1, 4], name="b", signature=[-1, 4])
    s = m.add([1, 4], name="sum")
    m.op("ADD", [a, b], [s], [("i8", 1)])
    m.inputs, m.outputs = [a, b], [s]
    m.sigs = [("serving_default", [("x1", a), ("x2", b)], [("out", s)])]
    out["add_sig.tflite"] = m.bytes()

    m = Model()
    x = m.add([1, 5, 5, 2], name="x")
    w = m.const(rng.standard_normal((3, 3, 3, 2)).astype(np.float32))
    bias = m.const(rng.standard_normal(3).astype(np.float32))
    y = m.add([1, 3, 3, 3], name="y")
    m.op("CONV_2D", [x, w, bias], [y], [("i8", 0), ("i32", 2), ("i32", 2), ("i8", 3)])
    p = m.add([1, 2, 2, 3], name="p")
    m.op("MAX_POOL_2D", [y], [p], [("i8", 0), ("i32", 2), ("i32", 2), ("i32", 2), ("i32", 2)])
    m.inputs, m.outputs = [x], [p]
    out["conv_pool.tflite"] = m.bytes()

    m = Model()
    x = m.add([1, 4, 4, 2], name="x")
    w = m.const(rng.standard_normal((1, 3, 3, 4)).astype(np.float32))
    y = m.add([1, 4, 4, 4], name="y")
    m.op("DEPTHWISE_CONV_2D", [x, w, -1], [y], [("i8", 0), ("i32", 1), ("i32", 1), ("i32", 2)])
    m.inputs, m.outputs = [x], [y]
    out["depthwise.tflite"] = m.bytes()

    m = Model()
    x = m.add([2, 3], name="x")
    w = m.const(rng.standard_normal((4, 3)).astype(np.float32))
    h = m.add([2, 4], name="h")
    m.op("FULLY_CONNECTED", [x, w, -1], [h], [("i8", 1)])
    sm = m.add([2, 4], name="sm")
    m.op("SOFTMAX", [h], [sm], [("f32", 1.0)])
    m.inputs, m.outputs = [x], [sm]
    out["fc_softmax.tflite"] = m.bytes()

    # quantized: int8 fully connected, per-channel conv, add, average pool, softmax
    m = Model()
    q_in = ([0.05], [-3], 0)
    x = m.add([1, 4, 4, 2], I8, "x", quant=q_in)
    w = m.const(rng.integers(-127, 128, (2, 3, 3, 2), dtype=np.int8), quant=([0.01, 0.02], [0, 0], 0))
    bq = m.const(np.array([100, -50], np.int32), quant=([0.0005, 0.001], [0, 0], 0))
    c = m.add([1, 4, 4, 2], I8, "c", quant=([0.1], [2], 0))
    m.op("CONV_2D", [x, w, bq], [c], [("i8", 0), ("i32", 1), ("i32", 1), ("i8", 1)])
    d = m.add([1, 4, 4, 2], I8, "d", quant=([0.12], [-1], 0))
    m.op("ADD", [c, x], [d], [("i8", 0)])
    e = m.add([1, 2, 2, 2], I8, "e", quant=([0.12], [-1], 0))
    m.op("AVERAGE_POOL_2D", [d], [e], [("i8", 1), ("i32", 2), ("i32", 2), ("i32", 2), ("i32", 2)])
    f = m.add([1, 8], I8, "f", quant=([0.12], [-1], 0))
    m.op("RESHAPE", [e], [f], [("vi32", [1, 8])])
    g = m.add([1, 8], I8, "g", quant=([1 / 256], [-128], 0))
    m.op("SOFTMAX", [f], [g], [("f32", 1.0)])
    m.inputs, m.outputs = [x], [g]
    out["quant_mix.tflite"] = m.bytes()

    m = Model()
    x = m.add([1, 6], name="x")
    qx = m.add([1, 6], I8, "qx", quant=([0.02], [1], 0))
    m.op("QUANTIZE", [x], [qx])
    w = m.const(rng.integers(-127, 128, (3, 6), dtype=np.int8), quant=([0.01], [0], 0))
    y = m.add([1, 3], I8, "y", quant=([0.05], [0], 0))
    m.op("FULLY_CONNECTED", [qx, w, -1], [y], [("i8", 0)])
    z = m.add([1, 3], name="z")
    m.op("DEQUANTIZE", [y], [z])
    m.inputs, m.outputs = [x], [z]
    out["quant_fc.tflite"] = m.bytes()

    # quantized: uint8 MUL, SUB (broadcast, fused RELU), LOGISTIC, TANH
    m = Model()
    x = m.add([2, 3], U8, "x", quant=([0.03], [130], 0))
    k = m.const(np.array([7, 200, 128], np.uint8), quant=([0.02], [128], 0))
    p = m.add([2, 3], U8, "p", quant=([0.05], [125], 0))
    m.op("MUL", [x, k], [p], [("i8", 0)])
    s = m.add([2, 3], U8, "s", quant=([0.04], [120], 0))
    m.op("SUB", [p, x], [s], [("i8", 1)])
    lg = m.add([2, 3], U8, "lg", quant=([1 / 256], [0], 0))
    m.op("LOGISTIC", [s], [lg])
    th = m.add([2, 3], U8, "th", quant=([1 / 128], [128], 0))
    m.op("TANH", [lg], [th])
    m.inputs, m.outputs = [x], [th]
    out["quant_elementwise.tflite"] = m.bytes()

    m = Model()
    x = m.add([2, 3, 4], name="x")
    pads = m.const(np.array([[0, 0], [1, 0], [0, 2]], np.int32))
    p = m.add([2, 4, 6], name="p")
    m.op("PAD", [x, pads], [p], [])
    perm = m.const(np.array([2, 0, 1], np.int32))
    t = m.add([6, 2, 4], name="t")
    m.op("TRANSPOSE", [p, perm], [t], [])
    axes = m.const(np.array([1], np.int32))
    mn = m.add([6, 4], name="mn")
    m.op("MEAN", [t, axes], [mn], [("u8", 0)])
    bg, en, st = (m.const(np.array(v, np.int32)) for v in ([1, 0], [5, 4], [2, -1]))
    s = m.add([2, 4], name="s")
    m.op("STRIDED_SLICE", [mn, bg, en, st], [s], [("i32", 0), ("i32", 2)])
    m.inputs, m.outputs = [x], [s]
    out["shape_ops.tflite"] = m.bytes()

    out["seq_lstm.tflite"] = lstm_model(2, 3, 4, 5, peephole=True)[0].bytes()
    out["full_lstm.tflite"] = lstm_model(2, 3, 4, 5, peephole=True, proj=3, layer_norm=True,
                                         cell_clip=1.0, proj_clip=0.5)[0].bytes()
    out["cifg_lstm.tflite"] = lstm_model(1, 2, 3, 4, cifg=True, one_step=True)[0].bytes()
    out["basic_lstm.tflite"] = lstm_basic_model(2, 3, 4)[0].bytes()
    # hybrid LSTMs (int8 weights, float activations)
    out["hybrid_lstm.tflite"] = lstm_model(2, 3, 4, 5, hybrid=True)[0].bytes()
    out["hybrid_lstm_full_asym.tflite"] = lstm_model(
        2, 3, 4, 5, hybrid=True, asym=True, peephole=True, proj=3, layer_norm=True,
        cell_clip=0.5, proj_clip=0.4, time_major=True)[0].bytes()
    out["hybrid_lstm_cifg_step.tflite"] = lstm_model(1, 1, 3, 4, hybrid=True, cifg=True,
                                                     one_step=True, asym=True)[0].bytes()
    m = lstm_model(1, 2, 3, 4, hybrid=True)[0]
    m.tensors[m.ops[0][1][1][3]][4] = None  # an int8 weight without its scale
    out["hybrid_lstm_no_scale.tflite"] = m.bytes()
    # fully integer LSTMs (8x8_16: int8 activations and weights, int16 cell state)
    out["int_lstm.tflite"] = lstm_int_model(2, 3, 4, 5, seed=9)[0].bytes()
    out["int_lstm_full.tflite"] = lstm_int_model(
        2, 3, 4, 5, seed=10, peephole=True, proj=5, layer_norm=True, cell_clip=0.5,
        proj_clip=0.4, time_major=True)[0].bytes()
    out["int_lstm_cifg_proj_step.tflite"] = lstm_int_model(1, 1, 3, 4, seed=11, cifg=True,
                                                           proj=3, one_step=True)[0].bytes()
    out["int_lstm_8x8_8.tflite"] = lstm_int_model(1, 2, 3, 4, seed=12, n_inter=12,
                                                  one_step=True)[0].bytes()
    m = lstm_int_model(1, 2, 3, 4, seed=13)[0]
    m.ops[0][8] = ("vi32", [0, 1, 2, 3, 99])  # an intermediate past the tensors
    out["int_lstm_bad_intermediate.tflite"] = m.bytes()

    m = unary("CUSTOM")
    m.codes = [(32, "MyCustomOp")]
    out["custom_op.tflite"] = m.bytes()

    # malformed
    good = out["conv_pool.tflite"]
    out["truncated_half.tflite"] = good[:len(good) // 2]
    out["truncated_header.tflite"] = good[:7]
    bad = bytearray(good)
    struct.pack_into("<I", bad, 0, len(bad) + 100)
    out["root_past_end.tflite"] = bytes(bad)
    bad = bytearray(good)
    root = struct.unpack_from("<I", bad, 0)[0]
    struct.pack_into("<i", bad, root, -0x7fffffff)
    out["vtable_past_end.tflite"] = bytes(bad)
    m = unary("RELU")
    m.tensors[0][0] = ("vi32", [2, 3] * 5)  # rank 10
    out["rank_too_big.tflite"] = m.bytes()
    m = unary("RELU")
    m.ops[0][1] = ("vi32", [7])  # tensor index out of range
    out["bad_tensor_index.tflite"] = m.bytes()
    m = unary("RELU")
    m.ops[0][0] = ("u32", 9)  # opcode index out of range
    out["bad_opcode_index.tflite"] = m.bytes()
    m = unary("SOFTMAX", opts=[("f32", 1.0)])
    m.ops[0][3] = ("u8", 1)  # Conv2DOptions on a SOFTMAX
    out["wrong_options_type.tflite"] = m.bytes()
    bad = bytearray(unary("TANH").bytes())
    i = bad.find(struct.pack("<I", 2) + struct.pack("<ii", 2, 3))  # the shape vector [2, 3]
    if i >= 0:
        struct.pack_into("<I", bad, i, 0x3fffffff)
    out["vector_past_end.tflite"] = bytes(bad)

    # quantized MEAN, int16 (16x8) ops and float SVDF
    rng = np.random.default_rng(6)
    m = Model()
    x = m.add([1, 3, 3, 4], I8, "x", quant=([0.05], [3], 0))
    y = m.add([1, 1, 1, 4], I8, "y", quant=([0.02], [-5], 0))
    m.op("MEAN", [x, m.const(np.array([1, 2], np.int32))], [y], [("i8", 1)])
    m.inputs, m.outputs = [x], [y]
    out["mean_int8.tflite"] = m.bytes()
    m = Model()
    x = m.add([1, 3, 3, 2], I16, "x", quant=([0.001], [0], 0))
    w = m.const(rng.integers(-127, 128, (3, 2, 2, 2)).astype(np.int8), quant=([0.01] * 3, [0] * 3, 0))
    b = m.const(np.array([100, -7, 0], np.int64), quant=([0.00001] * 3, [0] * 3, 0))
    c = m.add([1, 2, 2, 3], I16, "c", quant=([0.002], [0], 0))
    m.op("CONV_2D", [x, w, b], [c], [("i8", 1), ("i32", 1), ("i32", 1), ("i8", 0)])
    t = m.add([1, 2, 2, 3], I16, "t", quant=([2.0 ** -15], [0], 0))
    m.op("TANH", [c], [t])
    s2 = m.add([1, 2, 2, 3], I16, "s", quant=([0.003], [0], 0))
    m.op("ADD", [c, t], [s2], [("i8", 0), ("i8", 0)])
    m.inputs, m.outputs = [x], [s2]
    out["int16_conv_tanh_add.tflite"] = m.bytes()
    m = Model()
    x = m.add([2, 3], name="x")
    st = m.add([2, 8], name="state")
    m.tensors[st][5] = ("u8", 1)
    y = m.add([2, 2], name="y")
    m.op("SVDF", [x, m.const(rng.standard_normal((4, 3)).astype(np.float32)),
                  m.const(rng.standard_normal((4, 2)).astype(np.float32)), -1, st], [y],
         [("i32", 2), ("i8", 0)])
    m.inputs, m.outputs = [x], [y]
    out["svdf.tflite"] = m.bytes()
    m = Model()
    x = m.add([1, 4], I8, "x", quant=([0.05], [-3], 0))
    st = m.add([1, 6], I16, "state", quant=([0.004], [0], 0))
    m.tensors[st][5] = ("u8", 1)
    y = m.add([1, 1], I8, "y", quant=([0.5], [0], 0))
    m.op("SVDF", [x, m.const(rng.integers(-127, 128, (2, 4)).astype(np.int8), quant=([0.01], [0], 0)),
                  m.const(rng.integers(-999, 999, (2, 3)).astype(np.int16), quant=([0.002], [0], 0)),
                  m.const(np.array([5], np.int32), quant=([0.0000001], [0], 0)), st], [y],
         [("i32", 2), ("i8", 0)])
    sm = m.add([1, 1], I16, "sm", quant=([1 / 65536], [-32768], 0))
    m.op("SOFTMAX", [y], [sm], [("f32", 1.0)])
    q = m.add([1, 1], I32, "q", quant=([1 / 32768], [0], 0))
    m.op("QUANTIZE", [sm], [q])
    m.inputs, m.outputs = [x], [q]
    out["svdf_int8_softmax16.tflite"] = m.bytes()
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    d = pathlib.Path(sys.argv[1])
    d.mkdir(parents=True, exist_ok=True)
    for name, data in corpus().items():
        (d / name).write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
