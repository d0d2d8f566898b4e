"""test_qdq.py - models that arrive quantized run on Kiln's int8 kernels.

Models built here with onnx.helper, in the two forms quantizers write:

- QDQ: QuantizeLinear / DequantizeLinear around float Conv, Gemm and MatMul
  (per-tensor and per-channel s8 weights, u8 and s8 activations, int32 biases,
  Relu before the Q), as ONNX Runtime's quantize_static writes them; Kiln's
  qdq_fusion pass (src/opt/qdq.c) turns them into QLinearConv /
  KilnQLinearMatMul chains that stay int8 between ops;
- QOperator: QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger nodes.

Each model runs four ways: the fast path (optimizer + oneDNN int8 kernels,
src/kernels/dnnl/qlinear.c) with 1 and 2 threads, the same optimized graph on
reference kernels (KILN_FAST=0), and the imported graph on the reference path
(--reference: QDQ executed literally in float). They are checked against an
independent numpy emulation of the integer arithmetic
(acc = sum (x - x_zp) * w + bias in int64, y = sat(rint(acc * m) + y_zp) with
m = float32(float32(x_scale * w_scale) / y_scale)):

- int32 outputs (ConvInteger, MatMulInteger) bit for bit;
- the reference kernels bit for bit;
- the fast kernels within one quantization step, on at most 0.5% of the
  elements: oneDNN multiplies acc by m in float32 and adds y_zp before
  rounding, the reference in double after it, so a value within ~1e-7
  relative of a rounding midpoint may round the other way;
- the literal float QDQ graph within one step per quantized layer (float
  sums of dequantized values round differently from integer sums).

The fast path must really have run: `kiln bench --profile` names the
dnnl_qlinear_* kernels, and no DequantizeLinear is left between two fused
convolutions. A model quantized by PyTorch (torch.ao.quantization static
quantization of a small CNN, exported with torch.onnx.export) is checked the
same way when this torch can export it.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def cpu_has_vnni():
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return True
    return any(flag in text for flag in (" avx512_vnni", " avx_vnni", " amx_int8"))


VNNI = cpu_has_vnni()


@pytest.fixture(scope="module")
def kiln_bin():
    path = os.path.abspath(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln")))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kiln executable not found at {path}: build it or set KILN_BIN")
    return path


# ---- numpy integer reference ----

def qrange(dt):
    return (-128, 127) if dt == np.int8 else (0, 255)


def requant(acc, mult, zp, dt):
    lo, hi = qrange(dt)
    v = np.rint(acc.astype(np.float64) * mult.astype(np.float64)) + zp
    return np.clip(v, lo, hi).astype(dt)


def mult_of(xs, ws, ys):
    return (np.float32(xs) * np.asarray(ws, np.float32)).astype(np.float32) / np.float32(ys)


def conv_int(x, xzp, w, stride, pad, group):
    """int64 convolution of (x - xzp) [N,C,H,W] and w [M,C/g,kh,kw]."""
    x = x.astype(np.int64) - int(xzp)
    w = w.astype(np.int64)
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (wd + 2 * pad - kw) // stride + 1
    y = np.zeros((n, m, oh, ow), np.int64)
    mg = m // group
    for g in range(group):
        xs = xp[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
                y[:, g * mg:(g + 1) * mg] += np.einsum("nchw,mc->nmhw", patch,
                                                       w[g * mg:(g + 1) * mg, :, i, j])
    return y


def quantize(x, s, zp, dt):
    lo, hi = qrange(dt)
    return np.clip(np.rint(x / np.float32(s)) + zp, lo, hi).astype(dt)


# ---- running Kiln ----

def run(kiln_bin, model, feeds, tmp_path, mode="fast", threads=1):
    """Run model with feeds {name: array}; mode fast | refkernels | reference | noopt."""
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    out = tmp_path / f"out_{mode}_{threads}"
    args = [kiln_bin, "predict", str(path), "--output-dir", str(out), "--threads", str(threads)]
    for name, a in feeds.items():
        f = tmp_path / f"in_{name}.npy"
        np.save(f, a)
        args += ["--input", f"{name}={f}"]
    if mode == "reference":
        args.append("--reference")
    if mode == "noopt":
        args.append("--disable-optimizer")
    env = dict(os.environ)
    if mode == "refkernels":
        env["KILN_FAST"] = "0"
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return {o.name: np.load(out / f"{o.name}.npy") for o in model.graph.output}


def profile(kiln_bin, model, tmp_path, extra=()):
    path = tmp_path / "model_prof.onnx"
    onnx.save(model, str(path))
    r = subprocess.run([kiln_bin, "bench", str(path), "--iterations", "2", "--warmup", "1",
                        "--threads", "1", "--profile", *extra],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


def assert_close_steps(got, want, what, frac=0.005):
    """8-bit results within one step, on at most frac of the elements."""
    d = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert d.max() <= 1, f"{what}: max difference {d.max()} steps"
    assert (d > 0).mean() <= frac, f"{what}: {(d > 0).mean():.4f} of elements differ"


# ---- QDQ model builder ----

def tensor(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


class QDQ:
    """Builds a QDQ graph from float input x through quantized layers, like ORT's QDQ format."""

    def __init__(self, act_dt, x_shape, seed):
        self.rng = np.random.default_rng(seed)
        self.dt = act_dt
        self.nodes, self.inits = [], []
        self.k = 0
        self.x_shape = x_shape
        self.in_scale = np.float32(0.05)
        self.in_zp = 0 if act_dt == np.int8 else 128
        self.cur = self.q("x", self.in_scale, self.in_zp)  # name of the current quantized tensor
        self.cur_scale, self.cur_zp = self.in_scale, self.in_zp
        self.layers = []  # for the numpy reference

    def name(self, base):
        self.k += 1
        return f"{base}{self.k}"

    def const(self, base, a):
        n = self.name(base)
        self.inits.append(tensor(n, a))
        return n

    def q(self, x, s, zp, dt=None):
        dt = dt or self.dt
        out = self.name("q")
        self.nodes.append(helper.make_node(
            "QuantizeLinear", [x, self.const("s", np.float32(s)), self.const("z", dt(zp))], [out]))
        return out

    def dq(self, x, s, zp, axis=None):
        out = self.name("dq")
        kw = {} if axis is None else {"axis": axis}
        self.nodes.append(helper.make_node(
            "DequantizeLinear", [x, self.const("s", s), self.const("z", zp)], [out], **kw))
        return out

    def weights(self, shape, per_channel, axis):
        wq = self.rng.integers(-127, 128, size=shape).astype(np.int8)
        nch = shape[axis]
        ws = (self.rng.uniform(0.002, 0.02, size=nch) if per_channel
              else np.array([0.01])).astype(np.float32)
        return wq, ws

    def layer(self, kind, shape, per_channel=True, relu=False, stride=1, pad=0, group=1,
              bias=True, trans_b=True, out_scale=None, clip=None):
        x = self.dq(self.cur, np.float32(self.cur_scale), self.dt(self.cur_zp))
        axis = 0 if kind == "conv" or (kind == "gemm" and trans_b) else 1
        wq, ws = self.weights(shape, per_channel, axis)
        wzp = np.zeros(ws.shape, np.int8)
        w = self.dq(self.const("w", wq), ws if per_channel else ws[0],
                    wzp if per_channel else np.int8(0), axis if per_channel else None)
        nout = shape[axis]
        inputs = [x, w]
        bq = None
        if bias:
            bq = self.rng.integers(-3000, 3000, size=nout).astype(np.int32)
            bs = (np.float32(self.cur_scale) * ws).astype(np.float32)
            inputs.append(self.dq(self.const("b", bq), bs if per_channel else bs[0],
                                  np.zeros(nout, np.int32) if per_channel else np.int32(0),
                                  0 if per_channel else None))
        y = self.name("y")
        if kind == "conv":
            k = shape[2]
            self.nodes.append(helper.make_node("Conv", inputs, [y], strides=[stride, stride],
                                               pads=[pad] * 4, group=group,
                                               kernel_shape=[k, k]))
        elif kind == "gemm":
            self.nodes.append(helper.make_node("Gemm", inputs, [y], transB=int(trans_b)))
        else:
            assert not bias
            self.nodes.append(helper.make_node("MatMul", inputs, [y]))
        if relu:
            r = self.name("relu")
            self.nodes.append(helper.make_node("Relu", [y], [r]))
            y = r
        if clip is not None:  # Clip(min, max) with constant bounds (ReLU6: (0, 6))
            r = self.name("clip")
            self.nodes.append(helper.make_node(
                "Clip", [y, self.const("lo", np.float32(clip[0])),
                         self.const("hi", np.float32(clip[1]))], [r]))
            y = r
        ys = np.float32(out_scale or 0.08)
        low = relu or clip is not None
        yzp = (-128 if low else 3) if self.dt == np.int8 else (0 if low else 120)
        self.layers.append(dict(kind=kind, wq=wq if not (kind == "gemm" and trans_b) else wq.T,
                                ws=ws, bq=bq, xs=self.cur_scale, xzp=self.cur_zp, ys=ys,
                                yzp=yzp, stride=stride, pad=pad, group=group, relu=relu,
                                clip=clip))
        self.cur = self.q(y, ys, yzp)
        self.cur_scale, self.cur_zp = ys, yzp

    def flatten(self):
        x = self.dq(self.cur, np.float32(self.cur_scale), self.dt(self.cur_zp))
        f = self.name("flat")
        self.nodes.append(helper.make_node("Flatten", [x], [f]))
        self.cur = self.q(f, self.cur_scale, self.cur_zp)
        self.layers.append(dict(kind="flatten"))

    def model(self):
        out = self.dq(self.cur, np.float32(self.cur_scale), self.dt(self.cur_zp))
        self.nodes.append(helper.make_node("Identity", [out], ["y"]))
        g = helper.make_graph(
            self.nodes, "qdq",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(self.x_shape))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = 8
        return m

    def reference(self, x):
        """The model in numpy integers: the last quantized tensor, and y dequantized."""
        q = quantize(x, self.in_scale, self.in_zp, self.dt)
        for L in self.layers:
            if L["kind"] == "flatten":
                q = q.reshape(q.shape[0], -1)
                continue
            if L["kind"] == "conv":
                acc = conv_int(q, L["xzp"], L["wq"], L["stride"], L["pad"], L["group"])
                ch = (None, slice(None), None, None)
            else:
                acc = (q.astype(np.int64) - L["xzp"]) @ L["wq"].astype(np.int64)
                ch = (None, slice(None))
            if L["bq"] is not None:
                acc = acc + L["bq"].astype(np.int64)[ch]
            m = mult_of(L["xs"], L["ws"], L["ys"])
            q = requant(acc, m[ch] if m.size > 1 else m, L["yzp"], self.dt)
            if L["clip"] is not None:  # Q(Clip(v, a, b)) = clip(Q(v), Q(a), Q(b)): Q is monotonic
                qa, qb = (quantize(np.float32(v), L["ys"], L["yzp"], self.dt) for v in L["clip"])
                q = np.clip(q, qa, qb).astype(self.dt)
        return q, (q.astype(np.float32) - np.float32(self.cur_zp)) * np.float32(self.cur_scale)


def cnn(act_dt, n, c, h, w, seed=0, per_channel=True):
    b = QDQ(act_dt, (n, c, h, w), seed)
    b.layer("conv", (17, c, 3, 3), per_channel, relu=True, pad=1)
    b.layer("conv", (17, 1, 3, 3), per_channel, relu=True, pad=1, stride=2, group=17)
    b.layer("conv", (16, 17, 1, 1), per_channel, relu=False, bias=True)
    b.flatten()
    oh, ow = (h + 1) // 2, (w + 1) // 2
    b.layer("gemm", (10, 16 * oh * ow), per_channel, relu=True)
    b.layer("gemm", (10, 7), per_channel, trans_b=False)
    return b


def mlp(act_dt, rows, k, seed=0, per_channel=False):
    b = QDQ(act_dt, (rows, k), seed)
    b.layer("matmul", (k, 33), per_channel, bias=False)
    b.layer("gemm", (65, 33), per_channel, relu=True)
    b.layer("gemm", (1, 65), per_channel)
    return b


CASES = [
    ("cnn_u8_per_channel", lambda: cnn(np.uint8, 2, 3, 8, 8)),
    ("cnn_s8_per_channel", lambda: cnn(np.int8, 1, 1, 5, 7, seed=1)),
    ("cnn_u8_per_tensor", lambda: cnn(np.uint8, 3, 16, 1, 1, seed=2, per_channel=False)),
    ("mlp_u8_per_tensor", lambda: mlp(np.uint8, 1, 1)),
    ("mlp_s8_per_channel", lambda: mlp(np.int8, 17, 64, seed=3, per_channel=True)),
]


@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
def test_qdq_models(kiln_bin, tmp_path, name, make):
    b = make()
    model = b.model()
    rng = np.random.default_rng(7)
    x = rng.normal(0, 2.0, size=b.x_shape).astype(np.float32)
    _, want = b.reference(x)
    step = np.float32(b.cur_scale)
    ref_kernels = run(kiln_bin, model, {"x": x}, tmp_path, "refkernels")["y"]
    np.testing.assert_array_equal(ref_kernels, want)  # the reference kernels: bit for bit
    for threads in (1, 2):
        fast = run(kiln_bin, model, {"x": x}, tmp_path, "fast", threads)["y"]
        assert_close_steps(np.rint(fast / step), np.rint(want / step), f"{name} fast t={threads}",
                           frac=0.005 if fast.size > 400 else 2.0 / fast.size)
    literal = run(kiln_bin, model, {"x": x}, tmp_path, "reference")["y"]
    n_layers = sum(1 for L in b.layers if L["kind"] != "flatten")
    assert np.abs(literal - want).max() <= n_layers * step * 1.0001 + 1e-6


@pytest.mark.skipif(not VNNI, reason="no VNNI/AMX on this CPU: int8 nodes run on reference kernels")
def test_qdq_runs_on_int8_kernels(kiln_bin, tmp_path):
    text = profile(kiln_bin, cnn(np.uint8, 2, 3, 8, 8).model(), tmp_path)
    assert "dnnl_qlinear_conv" in text, text
    assert "dnnl_qlinear_matmul" in text, text
    # per-op summary rows "OP KERNEL COUNT ...": the three convolutions and two products chain
    # in int8; the only DequantizeLinear steps left are Flatten's (a float op) and the output's
    counts = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 3 and f[0] in ("QLinearConv", "KilnQLinearMatMul", "DequantizeLinear",
                                    "Conv", "Gemm", "MatMul") and f[2].isdigit():
            counts[f[0]] = counts.get(f[0], 0) + int(f[2])
    assert counts == {"QLinearConv": 3, "KilnQLinearMatMul": 2, "DequantizeLinear": 2}, text


# ---- QOperator models ----

def qop_model(nodes, inits, inputs, out_dt):
    g = helper.make_graph(nodes, "qop", inputs,
                          [helper.make_tensor_value_info("y", out_dt, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


CONV_SHAPES = [  # n, c, h, w, m, k, stride, pad, group
    (1, 1, 1, 1, 1, 1, 1, 0, 1),
    (2, 3, 9, 7, 17, 3, 1, 1, 1),
    (1, 16, 6, 6, 33, 3, 2, 1, 1),
    (1, 17, 5, 5, 17, 3, 1, 1, 17),
    (3, 8, 4, 4, 16, 1, 1, 0, 2),
]


@pytest.mark.parametrize("shape", CONV_SHAPES, ids=[str(s) for s in CONV_SHAPES])
@pytest.mark.parametrize("xdt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_qlinear_conv_and_conv_integer(kiln_bin, tmp_path, shape, xdt):
    n, c, h, w, m, k, stride, pad, group = shape
    rng = np.random.default_rng(sum(shape))
    lo, hi = qrange(xdt)
    x = rng.integers(lo, hi + 1, size=(n, c, h, w)).astype(xdt)
    wq = rng.integers(-127, 128, size=(m, c // group, k, k)).astype(np.int8)
    xzp = xdt(7 if xdt == np.int8 else 131)
    xs, ys = np.float32(0.02), np.float32(0.5)
    ws = rng.uniform(0.001, 0.01, size=m).astype(np.float32)
    yzp = xdt(-5 if xdt == np.int8 else 100)
    bq = rng.integers(-20000, 20000, size=m).astype(np.int32)
    attrs = dict(strides=[stride] * 2, pads=[pad] * 4, group=group, kernel_shape=[k, k])
    inits = [tensor("xs", xs), tensor("xzp", xzp), tensor("w", wq), tensor("ws", ws),
             tensor("wzp", np.zeros(m, np.int8)), tensor("ys", ys), tensor("yzp", yzp),
             tensor("b", bq)]
    xin = [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype)
                                         if hasattr(helper, "np_dtype_to_tensor_dtype")
                                         else onnx.mapping.NP_TYPE_TO_TENSOR_TYPE[x.dtype],
                                         list(x.shape))]
    acc = conv_int(x, xzp, wq, stride, pad, group)
    # QLinearConv
    model = qop_model([helper.make_node("QLinearConv", ["x", "xs", "xzp", "w", "ws", "wzp",
                                                        "ys", "yzp", "b"], ["y"], **attrs)],
                      inits, xin, TensorProto.UINT8 if xdt == np.uint8 else TensorProto.INT8)
    want = requant(acc + bq[None, :, None, None], mult_of(xs, ws, ys)[None, :, None, None],
                   int(yzp), xdt)
    np.testing.assert_array_equal(run(kiln_bin, model, {"x": x}, tmp_path, "reference")["y"], want)
    for threads in (1, 2):
        got = run(kiln_bin, model, {"x": x}, tmp_path, "noopt", threads)["y"]
        assert got.dtype == xdt
        assert_close_steps(got, want, f"QLinearConv t={threads}",
                           frac=0.005 if want.size > 400 else 1.0 / want.size)
    # ConvInteger: int32, bit for bit
    model = qop_model([helper.make_node("ConvInteger", ["x", "w", "xzp"], ["y"], **attrs)],
                      [tensor("xzp", xzp), tensor("w", wq)], xin, TensorProto.INT32)
    for threads in (1, 2):
        got = run(kiln_bin, model, {"x": x}, tmp_path, "noopt", threads)["y"]
        np.testing.assert_array_equal(got, acc.astype(np.int32))
    if VNNI:
        assert "dnnl_conv_integer" in profile(kiln_bin, model, tmp_path, ["--disable-optimizer"])


def random_conv_shapes(count, seed=2026):
    """n, c, h, w, m, k, stride, pad, group drawn as CNNs have them: mostly 1x1 and 3x3 on
    small images, channel counts off and on the blocks of 16, some depthwise."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        k = int(rng.choice([1, 1, 1, 3, 5]))
        c = int(rng.choice([8, 16, 24, 40, 48, 96, 120, 240]))
        m = int(rng.choice([8, 20, 24, 40, 48, 72, 96, 144]))
        group = 1
        if rng.random() < 0.2:
            group, m = c, c
        out.append((int(rng.integers(1, 4)), c, int(rng.integers(1, 15)), int(rng.integers(1, 15)),
                    m, k, int(rng.choice([1, 1, 2])), k // 2, group))
    return out


@pytest.mark.parametrize("shape", random_conv_shapes(24), ids=str)
def test_qlinear_conv_random_shapes(kiln_bin, tmp_path, shape):
    """QLinearConv (u8, per-channel weights, bias) on seeded CNN-like shapes against the numpy
    integer reference, within one step: the oneDNN kernel a CPU picks must be right on the
    shapes real models have (oneDNN 2.6's AMX 1x1 kernel was not: 1x1, 240 -> 144 channels
    on 13 x 3 pixels corrupted the heap, src/kernels/dnnl/dnnl_common.c, kd_pd_denied)."""
    n, c, h, w, m, k, stride, pad, group = shape
    rng = np.random.default_rng(sum(shape))
    x = rng.integers(0, 256, size=(n, c, h, w)).astype(np.uint8)
    wq = rng.integers(-127, 128, size=(m, c // group, k, k)).astype(np.int8)
    xzp, yzp = np.uint8(7), np.uint8(100)
    xs, ys = np.float32(0.02), np.float32(0.05)
    ws = rng.uniform(1e-4, 3e-4, size=m).astype(np.float32)
    bq = rng.integers(-1000, 1000, size=m).astype(np.int32)
    attrs = dict(strides=[stride] * 2, pads=[pad] * 4, group=group, kernel_shape=[k, k])
    inits = [tensor("xs", xs), tensor("xzp", xzp), tensor("w", wq), tensor("ws", ws),
             tensor("wzp", np.zeros(m, np.int8)), tensor("ys", ys), tensor("yzp", yzp),
             tensor("b", bq)]
    xin = [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))]
    model = qop_model([helper.make_node("QLinearConv", ["x", "xs", "xzp", "w", "ws", "wzp",
                                                        "ys", "yzp", "b"], ["y"], **attrs)],
                      inits, xin, TensorProto.UINT8)
    acc = conv_int(x, xzp, wq, stride, pad, group)
    want = requant(acc + bq[None, :, None, None], mult_of(xs, ws, ys)[None, :, None, None],
                   int(yzp), np.uint8)
    got = run(kiln_bin, model, {"x": x}, tmp_path, "noopt", 2)["y"]
    assert_close_steps(got, want, f"QLinearConv {shape}",
                       frac=0.005 if want.size > 400 else 1.0 / want.size)


MM_SHAPES = [(1, 1, 1), (3, 17, 5), (17, 64, 33), (2, 5, 16, 65)]  # rows..., k, n


@pytest.mark.parametrize("shape", MM_SHAPES, ids=[str(s) for s in MM_SHAPES])
@pytest.mark.parametrize("xdt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_qlinear_matmul_and_matmul_integer(kiln_bin, tmp_path, shape, xdt):
    *rows, k, nn = shape
    rng = np.random.default_rng(sum(shape) + 5)
    lo, hi = qrange(xdt)
    a = rng.integers(lo, hi + 1, size=(*rows, k)).astype(xdt)
    bq = rng.integers(-127, 128, size=(k, nn)).astype(np.int8)
    azp = xdt(-3 if xdt == np.int8 else 77)
    as_, ys = np.float32(0.03), np.float32(0.25)
    bs = rng.uniform(0.001, 0.01, size=nn).astype(np.float32)
    yzp = xdt(9 if xdt == np.int8 else 60)
    ain = [helper.make_tensor_value_info(
        "a", TensorProto.UINT8 if xdt == np.uint8 else TensorProto.INT8, list(a.shape))]
    acc = (a.astype(np.int64) - int(azp)) @ bq.astype(np.int64)
    inits = [tensor("as", as_), tensor("azp", azp), tensor("b", bq), tensor("bs", bs),
             tensor("bzp", np.zeros(nn, np.int8)), tensor("ys", ys), tensor("yzp", yzp)]
    model = qop_model([helper.make_node("QLinearMatMul", ["a", "as", "azp", "b", "bs", "bzp",
                                                          "ys", "yzp"], ["y"])],
                      inits, ain, TensorProto.UINT8 if xdt == np.uint8 else TensorProto.INT8)
    want = requant(acc, mult_of(as_, bs, ys), int(yzp), xdt)
    np.testing.assert_array_equal(run(kiln_bin, model, {"a": a}, tmp_path, "reference")["y"], want)
    for threads in (1, 2):
        got = run(kiln_bin, model, {"a": a}, tmp_path, "noopt", threads)["y"]
        assert_close_steps(got, want, f"QLinearMatMul t={threads}",
                           frac=0.005 if want.size > 400 else 1.0 / want.size)
    # MatMulInteger with the zero point a run-time input (as DynamicQuantizeLinear gives it)
    ain2 = ain + [helper.make_tensor_value_info("azp", ain[0].type.tensor_type.elem_type, [])]
    model = qop_model([helper.make_node("MatMulInteger", ["a", "b", "azp"], ["y"])],
                      [tensor("b", bq)], ain2, TensorProto.INT32)
    for threads in (1, 2):
        got = run(kiln_bin, model, {"a": a, "azp": np.array(azp)}, tmp_path, "noopt", threads)["y"]
        np.testing.assert_array_equal(got, acc.astype(np.int32))
    if VNNI:
        model2 = qop_model([helper.make_node("MatMulInteger", ["a", "b", "azp"], ["y"])],
                           [tensor("b", bq), tensor("azp", azp)], ain, TensorProto.INT32)
        assert "dnnl_matmul_integer" in profile(kiln_bin, model2, tmp_path,
                                                ["--disable-optimizer"])


# ---- a model quantized by PyTorch ----

def torch_quantized_cnn(tmp_path):
    """A small CNN statically quantized by torch.ao.quantization (fused Conv+ReLU, per-channel
    weights, calibrated on random images), exported to ONNX (QDQ with Constant parameters,
    Cast after each QuantizeLinear, the bias zero point as Cast(ConstantOfShape))."""
    torch = pytest.importorskip("torch")
    import torch.nn as nn
    tq = pytest.importorskip("torch.ao.quantization")
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = tq.QuantStub()
            self.c1 = nn.Conv2d(1, 8, 3, padding=1)
            self.r1 = nn.ReLU()
            self.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
            self.r2 = nn.ReLU()
            self.fl = nn.Flatten()
            self.fc = nn.Linear(16 * 4 * 4, 10)
            self.dq = tq.DeQuantStub()

        def forward(self, x):
            return self.dq(self.fc(self.fl(self.r2(self.c2(self.r1(self.c1(self.q(x))))))))

    net = Net().eval()
    net.qconfig = tq.get_default_qconfig("fbgemm")
    tq.fuse_modules(net, [["c1", "r1"], ["c2", "r2"]], inplace=True)
    tq.prepare(net, inplace=True)
    with torch.no_grad():
        for _ in range(4):
            net(torch.randn(16, 1, 8, 8))
    tq.convert(net, inplace=True)
    path = tmp_path / "torch_q.onnx"
    try:
        torch.onnx.export(net, torch.randn(1, 1, 8, 8), str(path), opset_version=13,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "n"}})
    except Exception as e:  # an exporter without quantized-op support
        pytest.skip(f"this torch cannot export a quantized model to ONNX: {e}")
    x = torch.randn(32, 1, 8, 8)
    with torch.no_grad():
        want = net(x).numpy()
    return onnx.load(str(path)), x.numpy(), want, float(net.fc.scale)


def test_pytorch_quantized_model(kiln_bin, tmp_path):
    model, x, want, step = torch_quantized_cnn(tmp_path)
    ref = run(kiln_bin, model, {"x": x}, tmp_path, "refkernels")["y"]
    literal = run(kiln_bin, model, {"x": x}, tmp_path, "reference")["y"]
    for threads in (1, 2):
        fast = run(kiln_bin, model, {"x": x}, tmp_path, "fast", threads)["y"]
        assert_close_steps(np.rint(fast / step), np.rint(ref / step), f"torch fast t={threads}",
                           frac=0.005)
    # PyTorch's own int8 execution (FBGEMM) rounds its requantization its own way: within one
    # output step of Kiln's integer result on nearly every element, and so is the literal QDQ graph
    for got in (ref, literal):
        d = np.rint(np.abs(got - want) / step)
        assert d.max() <= 2 and (d > 0).mean() <= 0.05, (d.max(), (d > 0).mean())
    if VNNI:
        text = profile(kiln_bin, model, tmp_path)
        assert "dnnl_qlinear_conv" in text and "dnnl_qlinear_matmul" in text, text


# ---- the fast QuantizeLinear / DequantizeLinear kernels (src/kernels/simd/quant8.c) ----

def qdq_pair_model(dt, scale, zp, shape):
    """x -> QuantizeLinear -> q (output) -> DequantizeLinear -> y (output)."""
    et = TensorProto.UINT8 if dt == np.uint8 else TensorProto.INT8
    inits = [tensor("s", np.float32(scale)), tensor("z", np.array(zp, dtype=dt))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    g = helper.make_graph(nodes, "qdq_pair",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("q", et, list(shape)),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("dt,zp", [(np.uint8, 0), (np.uint8, 131), (np.int8, 0), (np.int8, -7)])
@pytest.mark.parametrize("shape", [(1, 3, 5, 7), (2, 17, 41, 53)])
@pytest.mark.parametrize("threads", [1, 2])
def test_fast_quantize_dequantize(kiln_bin, tmp_path, dt, zp, shape, threads):
    rng = np.random.default_rng(7)
    scale = 0.0371
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    flat = x.reshape(-1)
    n = flat.size
    # rounding midpoints (half to even), out-of-range values, infinities, NaN and -0
    flat[: n // 4] = (rng.integers(-300, 300, n // 4) + 0.5).astype(np.float32) * np.float32(scale)
    flat[1:4] = [np.inf, -np.inf, np.nan]
    flat[4:6] = [1e30, -0.0]
    model = qdq_pair_model(dt, scale, zp, shape)
    fast = run(kiln_bin, model, {"x": x}, tmp_path, "fast", threads)
    ref = run(kiln_bin, model, {"x": x}, tmp_path, "refkernels", threads)
    # bit for bit against the reference kernels (NaN included)
    assert np.array_equal(fast["q"], ref["q"])
    assert np.array_equal(fast["y"].view(np.uint32), ref["y"].view(np.uint32))
    # and against numpy (NaN quantizes to 0, as in the ONNX reference)
    ok = ~np.isnan(x)
    want = quantize(np.where(ok, x, 0), scale, zp, dt)
    want[~ok] = 0
    assert np.array_equal(fast["q"], want)
    want_y = (fast["q"].astype(np.float32) - np.float32(zp)) * np.float32(scale)
    assert np.array_equal(fast["y"], want_y)


def test_fast_quantize_dequantize_kernels_run(kiln_bin, tmp_path):
    text = profile(kiln_bin, qdq_pair_model(np.uint8, 0.05, 3, (1, 8, 32, 32)), tmp_path)
    kernels = {line.split()[0]: line.split()[1] for line in text.splitlines()
               if len(line.split()) >= 3 and line.split()[0] in ("QuantizeLinear",
                                                                 "DequantizeLinear")}
    assert kernels.get("QuantizeLinear", "").endswith("_quantize_8"), text
    assert kernels.get("DequantizeLinear", "").endswith("_dequantize_8"), text


def clip_cnn(act_dt, clip, out_scale):
    b = QDQ(act_dt, (2, 3, 9, 9), 5)
    b.layer("conv", (16, 3, 3, 3), True, pad=1, clip=clip, out_scale=out_scale)
    b.layer("conv", (16, 1, 3, 3), True, pad=1, group=16, clip=clip, out_scale=out_scale)
    b.layer("conv", (8, 16, 1, 1), True)
    return b


# ReLU6 whose quantized range [0, 255 * 0.02 = 5.1] lies inside [0, 6]: the Clip changes
# nothing the QuantizeLinear can see and is fused away; Clip(0, 2) is narrower than the
# range and must stay (run as imported).
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("clip,fused", [((0.0, 6.0), True), ((0.0, 2.0), False)])
def test_qdq_clip(kiln_bin, tmp_path, dt, clip, fused):
    b = clip_cnn(dt, clip, 0.02)
    model = b.model()
    x = np.random.default_rng(3).normal(0, 2.0, size=b.x_shape).astype(np.float32)
    _, want = b.reference(x)
    step = np.float32(b.cur_scale)
    np.testing.assert_array_equal(run(kiln_bin, model, {"x": x}, tmp_path, "refkernels")["y"],
                                  want)
    for threads in (1, 2):
        fast = run(kiln_bin, model, {"x": x}, tmp_path, "fast", threads)["y"]
        assert_close_steps(np.rint(fast / step), np.rint(want / step), f"clip t={threads}")
    text = profile(kiln_bin, model, tmp_path)
    # per-op summary rows "OP KERNEL COUNT ...": three QLinearConv when the Clips fuse, else
    # only the last convolution (the other two run in float, Clip fused as an activation)
    n = sum(int(f[2]) for f in (line.split() for line in text.splitlines())
            if len(f) > 2 and f[0] == "QLinearConv" and f[2].isdigit())
    assert n == (3 if fused else 1), text
