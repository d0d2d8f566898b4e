"""test_int8_chain.py - static int8 CNN blocks chained in int8 end to end.

What a calibrated ResNet / MobileNetV2 block becomes (docs/COMPRESSION.md,
"Consecutive quantized ops"): QLinearConv nodes reading and writing
channels-last 8-bit values (KILN_LAYOUT_NHWC, src/opt/layout_nhwc.c), and the
residual Q(Relu(DQ(a) + DQ(b))) fused into one KilnQLinearAdd
(src/opt/qadd.c, ref/qlinear_add.c, simd/quant8.c).

Checked against an independent numpy emulation: integer convolutions
(acc in int64, y = sat(rint(acc * m) + y_zp)) and the residual Add in the
float32 arithmetic of the QDQ nodes it replaces
(s = (a - a_zp) * a_scale + (b - b_zp) * b_scale, Relu, y = sat(rint(s / y_scale) + y_zp)):

- KilnQLinearAdd alone: fast kernel (1 and 2 threads), reference kernel and the
  unfused graph (--disable-optimizer) bit for bit, at rounding midpoints too;
- a residual block chain (conv, MaxPool, conv, conv, Add+Relu, depthwise conv,
  conv, Add, conv; the MaxPool between a DQ and a Q of the same parameters
  runs on the 8-bit values): the optimized
  graph on reference kernels bit for bit; the fast path with 1 and 2 threads
  within one step (oneDNN's float requantization, see test_qdq.py); the
  profile shows the fused Add, channels-last values and no DequantizeLinear
  inside the chain;
- the residual Add fused into the convolution that makes one operand
  (KilnQLinearConvAdd, src/opt/qconv_sum.c, oneDNN's sum post-op in
  src/kernels/dnnl/qlinear.c): a bottleneck block with a projection shortcut
  (the other operand read by nothing else: the output may take its memory)
  and a block whose other operand is read again later (copied), with
  1 and 2 threads, within one step of numpy on at most 1% of the elements and
  within one step of the unfused kernels (KILN_QSUM=0) everywhere, the
  profile naming the sum kernel; and a block where neither operand may be
  fused (each read twice): KilnQLinearAdd stays.
- KilnLut8 (src/opt/qlut.c: DQ -> SiLU / Sigmoid / HardSwish [-> Q] as a
  256-entry table), KilnLut8Pool and KilnLut8Mul (the squeeze-and-excitation
  reading a float table): bit for bit the unfused nodes on the reference
  kernels (and numpy's float32 arithmetic), fast kernels 1 and 2 threads,
  plain and channels last; an EfficientNet MBConv block whose profile shows no
  float op, inner DQ or reorder left.
"""

import os

import numpy as np
import pytest

from test_qdq import (QDQ, VNNI, assert_close_steps, conv_int, kiln_bin, mult_of,  # noqa: F401
                      profile, quantize, requant, run, tensor)

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def qadd_ref(a, sa, za, b, sb, zb, sy, zy, relu, dt):
    """The float32 arithmetic of DQ, Add, Relu, Q (numpy float32 throughout)."""
    fa = (a.astype(np.float32) - np.float32(za)) * np.float32(sa)
    fb = (b.astype(np.float32) - np.float32(zb)) * np.float32(sb)
    s = (fa + fb).astype(np.float32)
    if relu:
        s = np.maximum(s, np.float32(0))
    return quantize(s, sy, zy, dt)


def qadd_model(dt, shape, p, relu):
    et = TensorProto.UINT8 if dt == np.uint8 else TensorProto.INT8
    sa, za, sb, zb, sy, zy = p
    inits = [tensor("sa", np.float32(sa)), tensor("za", np.array(za, dt)),
             tensor("sb", np.float32(sb)), tensor("zb", np.array(zb, dt)),
             tensor("sy", np.float32(sy)), tensor("zy", np.array(zy, dt))]
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["fa"]),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["fb"]),
             helper.make_node("Add", ["fa", "fb"], ["s"])]
    last = "s"
    if relu:
        nodes.append(helper.make_node("Relu", ["s"], ["r"]))
        last = "r"
    nodes.append(helper.make_node("QuantizeLinear", [last, "sy", "zy"], ["y"]))
    g = helper.make_graph(nodes, "qadd",
                          [helper.make_tensor_value_info("a", et, list(shape)),
                           helper.make_tensor_value_info("b", et, list(shape))],
                          [helper.make_tensor_value_info("y", et, list(shape))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("shape", [(1, 3, 5, 7), (2, 17, 41, 53)])
@pytest.mark.parametrize("relu", [True, False], ids=["relu", "plain"])
def test_qlinear_add(kiln_bin, tmp_path, dt, shape, relu):
    rng = np.random.default_rng(3)
    lo, hi = (-128, 128) if dt == np.int8 else (0, 256)
    a = rng.integers(lo, hi, size=shape).astype(dt)
    b = rng.integers(lo, hi, size=shape).astype(dt)
    # y_scale = a_scale = b_scale / 2 with zero points 0 puts many sums on rounding midpoints
    p = (0.05, 0, 0.1, 0, 0.1, 0) if dt == np.int8 else (0.0371, 131, 0.0213, 7, 0.0402, 12)
    model = qadd_model(dt, shape, p, relu)
    want = qadd_ref(a, p[0], p[1], b, p[2], p[3], p[4], p[5], relu, dt)
    feeds = {"a": a, "b": b}
    unfused = run(kiln_bin, model, feeds, tmp_path, "noopt")["y"]
    np.testing.assert_array_equal(unfused, want)
    np.testing.assert_array_equal(run(kiln_bin, model, feeds, tmp_path, "refkernels")["y"], want)
    for threads in (1, 2):
        np.testing.assert_array_equal(run(kiln_bin, model, feeds, tmp_path, "fast", threads)["y"],
                                      want)
    text = profile(kiln_bin, model, tmp_path)
    assert "KilnQLinearAdd" in text and "QuantizeLinear" not in text, text


class Residual(QDQ):
    """QDQ with residual Adds: add(other) adds the quantized tensor `other` to the current one."""

    def add(self, other, relu, ys=0.09):
        name, s, zp, idx = other
        a = self.dq(self.cur, np.float32(self.cur_scale), self.dt(self.cur_zp))
        b = self.dq(name, np.float32(s), self.dt(zp))
        y = self.name("add")
        self.nodes.append(helper.make_node("Add", [a, b], [y]))
        if relu:
            r = self.name("relu")
            self.nodes.append(helper.make_node("Relu", [y], [r]))
            y = r
        yzp = (-128 if relu else 5) if self.dt == np.int8 else (0 if relu else 110)
        self.layers.append(dict(kind="add", other=idx,
                                xs=self.cur_scale, xzp=self.cur_zp, bs=s, bzp=zp, ys=ys, yzp=yzp,
                                relu=relu))
        self.cur = self.q(y, ys, yzp)
        self.cur_scale, self.cur_zp = np.float32(ys), yzp

    def maxpool(self, k=3, stride=2, pad=1, ceil=0):
        """DQ -> MaxPool -> Q with the same parameters (what calibration writes around a pool)."""
        x = self.dq(self.cur, np.float32(self.cur_scale), self.dt(self.cur_zp))
        y = self.name("pool")
        self.nodes.append(helper.make_node("MaxPool", [x], [y], kernel_shape=[k, k],
                                           strides=[stride, stride], pads=[pad] * 4,
                                           ceil_mode=ceil))
        self.layers.append(dict(kind="maxpool", k=k, stride=stride, pad=pad, ceil=ceil))
        self.cur = self.q(y, self.cur_scale, self.cur_zp)

    def goto(self, m):
        """Continue from an earlier quantized tensor (a second branch)."""
        name, s, zp, idx = m
        self.layers.append(dict(kind="goto", src=idx))
        self.cur, self.cur_scale, self.cur_zp = name, s, zp

    def mark(self):
        """The current quantized tensor, for a later add (with its layer index)."""
        return (self.cur, self.cur_scale, self.cur_zp, len(self.layers))

    def reference(self, x):
        q = quantize(x, self.in_scale, self.in_zp, self.dt)
        outs = [q]  # outs[i] = the quantized tensor after i layers
        for L in self.layers:
            if L["kind"] == "goto":
                q = outs[L["src"]]
            elif L["kind"] == "maxpool":
                k, st, p = L["k"], L["stride"], L["pad"]
                lo = np.iinfo(self.dt).min
                rnd = (st - 1) if L.get("ceil") else 0  # ceil_mode: one more window if any left
                oh = (q.shape[2] + 2 * p - k + rnd) // st + 1
                ow = (q.shape[3] + 2 * p - k + rnd) // st + 1
                eh = max(0, (oh - 1) * st + k - q.shape[2] - 2 * p)  # ceil's extra right rows
                ew = max(0, (ow - 1) * st + k - q.shape[3] - 2 * p)
                xp = np.pad(q, ((0, 0), (0, 0), (p, p + eh), (p, p + ew)), constant_values=lo)
                q = np.full((q.shape[0], q.shape[1], oh, ow), lo, self.dt)
                for i in range(k):
                    for j in range(k):
                        q = np.maximum(q, xp[:, :, i:i + st * oh:st, j:j + st * ow:st])
            elif L["kind"] == "add":
                q = qadd_ref(q, L["xs"], L["xzp"], outs[L["other"]], L["bs"], L["bzp"], L["ys"],
                             L["yzp"], L["relu"], self.dt)
            else:
                acc = conv_int(q, L["xzp"], L["wq"], L["stride"], L["pad"], L["group"])
                ch = (None, slice(None), None, None)
                if L["bq"] is not None:
                    acc = acc + L["bq"].astype(np.int64)[ch]
                m = mult_of(L["xs"], L["ws"], L["ys"])
                q = requant(acc, m[ch] if m.size > 1 else m, L["yzp"], self.dt)
            outs.append(q)
        return q, (q.astype(np.float32) - np.float32(self.cur_zp)) * np.float32(self.cur_scale)


def residual_chain(dt, n, c, h, w, seed=0):
    b = Residual(dt, (n, c, h, w), seed)
    b.layer("conv", (c, c, 1, 1), relu=True, out_scale=0.06)
    b.maxpool()
    m0 = b.mark()
    b.layer("conv", (c, c, 3, 3), relu=True, pad=1, out_scale=0.07)
    b.layer("conv", (c, c, 1, 1), relu=False, out_scale=0.08)
    b.add(m0, relu=True)
    m1 = b.mark()
    b.layer("conv", (c, 1, 3, 3), relu=True, pad=1, group=c, out_scale=0.05)  # depthwise
    b.layer("conv", (c, c, 1, 1), relu=False, out_scale=0.08)
    b.add(m1, relu=False)
    b.layer("conv", (c, c, 1, 1), relu=False, out_scale=0.1)
    return b


@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("shape", [(1, 16, 8, 8), (2, 17, 5, 7), (1, 32, 14, 14)])
def test_residual_chain(kiln_bin, tmp_path, dt, shape):
    b = residual_chain(dt, *shape, seed=shape[1])
    model = b.model()
    x = np.random.default_rng(11).normal(0, 2.0, size=b.x_shape).astype(np.float32)
    qwant, want = b.reference(x)
    step = np.float32(b.cur_scale)
    ref_kernels = run(kiln_bin, model, {"x": x}, tmp_path, "refkernels")["y"]
    np.testing.assert_array_equal(ref_kernels, want)  # the reference kernels: bit for bit
    for threads in (1, 2):
        fast = run(kiln_bin, model, {"x": x}, tmp_path, "fast", threads)["y"]
        assert_close_steps(np.rint(fast / step), np.rint(want / step), f"fast t={threads}",
                           frac=0.01)


@pytest.mark.skipif(not VNNI, reason="no VNNI/AMX on this CPU: int8 nodes run on reference kernels")
def test_residual_chain_stays_int8_channels_last(kiln_bin, tmp_path):
    model = residual_chain(np.uint8, 1, 32, 14, 14).model()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILN_QSUM", "0")  # the Adds on their own (here: as the sum post-op below)
        text = profile(kiln_bin, model, tmp_path)
        table = {ln.split()[0]: ln.split() for ln in text.splitlines() if len(ln.split()) >= 3}
        assert "KilnQLinearAdd" in table and "KilnQLinearConvAdd" not in table, text
        assert int(table["QLinearConv"][2]) == 6, text
    text = profile(kiln_bin, model, tmp_path)
    lines = text.splitlines()
    table = {ln.split()[0]: ln.split() for ln in lines if len(ln.split()) >= 3}
    assert int(table["KilnQLinearConvAdd"][2]) == 2 and "KilnQLinearAdd" not in table, text
    assert int(table["QLinearConv"][2]) == 4, text
    # only the model's own edges: Q of the float input, DQ of the output
    assert int(table.get("DequantizeLinear", ["", "", "0"])[2]) <= 1, text
    assert "Add" not in table and "Relu" not in table, text
    # the MaxPool between them pools bytes, channels last
    # (the per-step list names a step's layout; it lists the slowest steps, and under the
    # sanitizer build the MaxPool may not be among them: then the kernel table must show it)
    pools = [ln for ln in lines if "MaxPool" in ln and "(blocked" in ln]
    if pools:
        assert any("(blocked 1)" in ln for ln in pools), text
    else:
        assert "MaxPool" in table and b"libasan" in open(kiln_bin, "rb").read(), text
    # the chain's values are stored channels last ("blocked 1" in the step list)
    assert "(blocked 1)" in text, text


@pytest.mark.skipif(not VNNI, reason="no VNNI/AMX on this CPU: int8 nodes run on reference kernels")
@pytest.mark.parametrize("hw", [14, 15])
def test_ceil_mode_maxpool_channels_last(kiln_bin, tmp_path, hw):
    """SqueezeNet's pool: MaxPool with ceil_mode between two int8 convolutions pools bytes
    channels last (in plain NCHW oneDNN had only its reference code for 8-bit max pooling:
    5.8 of SqueezeNet's 6.1 ms), with the reference's result bit for bit."""
    b = Residual(np.uint8, (1, 16, hw, hw), 3)
    b.layer("conv", (16, 16, 1, 1), relu=True, out_scale=0.06)
    b.maxpool(k=3, stride=2, pad=0, ceil=1)
    b.layer("conv", (16, 16, 1, 1), relu=False, out_scale=0.08)
    model = b.model()
    x = np.random.default_rng(5).normal(0, 2.0, size=b.x_shape).astype(np.float32)
    _, want = b.reference(x)
    np.testing.assert_array_equal(run(kiln_bin, model, {"x": x}, tmp_path, "refkernels")["y"], want)
    step = np.float32(b.cur_scale)
    for threads in (1, 2):
        fast = run(kiln_bin, model, {"x": x}, tmp_path, "fast", threads)["y"]
        assert_close_steps(np.rint(fast / step), np.rint(want / step), f"t={threads}", frac=0.01)
    text = profile(kiln_bin, model, tmp_path)
    pools = [ln for ln in text.splitlines() if "MaxPool" in ln and "(blocked" in ln]
    assert pools and all("(blocked 1)" in ln for ln in pools), text


def silu_se_model(n, c, h, w):
    """EfficientNet's pattern in QDQ: conv -> SiLU -> squeeze-and-excitation scale (a GAP read
    and a per-channel Mul) -> conv, the SiLU, SE and pool in float between Q/DQ."""
    b = Residual(np.uint8, (n, c, h, w), 4)
    b.layer("conv", (c, c, 1, 1), relu=False, out_scale=0.05)
    x = b.dq(b.cur, np.float32(b.cur_scale), b.dt(b.cur_zp))
    sig = b.name("sig")
    silu = b.name("silu")
    pooled = b.name("gap")
    gate = b.name("gate")
    scaled = b.name("se")
    scale = b.const("chs", np.random.default_rng(5).uniform(0.5, 1.5, (1, c, 1, 1)).astype(np.float32))
    b.nodes += [helper.make_node("Sigmoid", [x], [sig]),
                helper.make_node("Mul", [x, sig], [silu]),
                helper.make_node("GlobalAveragePool", [silu], [pooled]),
                helper.make_node("Mul", [pooled, scale], [gate]),
                helper.make_node("Mul", [gate, silu], [scaled])]
    b.cur = b.q(scaled, 0.04, 30)
    b.cur_scale, b.cur_zp = np.float32(0.04), 30
    b.layer("conv", (c, c, 1, 1), relu=False, out_scale=0.08)
    return b.model()


@pytest.mark.skipif(not VNNI, reason="no VNNI/AMX on this CPU: int8 nodes run on reference kernels")
@pytest.mark.parametrize("shape", [(1, 16, 8, 8), (2, 24, 5, 7)])
def test_silu_se_channels_last(kiln_bin, tmp_path, shape, monkeypatch):
    """The SiLU / squeeze-and-excitation float ops between Q/DQ run channels last: the same
    fast kernels as in NCHW (KILN_NHWC=0), so the same result but for float rounding in the
    pool's sum order (within one step on at most 1% of the elements), 1 and 2 threads."""
    monkeypatch.setenv("KILN_QLUT", "0")  # the float ops themselves (KilnLut8: tests below)
    model = silu_se_model(*shape)
    x = np.random.default_rng(9).normal(0, 2.0, size=shape).astype(np.float32)
    step = np.float32(0.08)
    for threads in (1, 2):
        monkeypatch.setenv("KILN_NHWC", "0")
        plain = run(kiln_bin, model, {"x": x}, tmp_path, "fast", threads)["y"]
        monkeypatch.delenv("KILN_NHWC")
        cl = run(kiln_bin, model, {"x": x}, tmp_path, "fast", threads)["y"]
        assert_close_steps(np.rint(cl / step), np.rint(plain / step), f"t={threads}", frac=0.01)
        ref = run(kiln_bin, model, {"x": x}, tmp_path, "refkernels", threads)["y"]
        assert np.abs(cl - ref).max() <= 2 * step + 1e-6  # fast sigmoid vs the reference's
    text = profile(kiln_bin, model, tmp_path)
    # x * sigmoid(x) runs as one Swish step since the SiLU fusion; the gate stays a Sigmoid
    assert ("f32_sigmoid_avx512_blocked1" in text or "f32_silu_avx512_blocked1" in text) and \
        "chan1" in text, text


def identity_conv(b, m):
    """A 1x1 convolution of m channels with weights 127 * I and scales 1/127, its output
    scale the input's: y = clip(x - x_zp + y_zp), so the quantized tensor before it shows
    through step for step, and that tensor stays channels last (a convolution reads it)."""
    saved = b.weights
    b.weights = lambda shape, per_channel, axis: (
        np.eye(m, dtype=np.int8)[:, :, None, None] * np.int8(127),
        np.full(m, 1.0 / 127, np.float32))
    b.layer("conv", (m, m, 1, 1), relu=False, bias=False, out_scale=b.cur_scale)
    b.weights = saved


def projection_block(dt, n, c, h, w, seed=0):
    """ResNet's bottleneck with a projection shortcut: both Add operands are convolutions'
    outputs read by nothing else; the projection's becomes the fused one, the main branch's
    the sum operand, its memory the output's (the plan's in-place rule)."""
    b = Residual(dt, (n, c, h, w), seed)
    b.layer("conv", (c, c, 1, 1), relu=True, out_scale=0.06)
    m0 = b.mark()
    b.layer("conv", (c, c, 1, 1), relu=True, out_scale=0.07)
    b.layer("conv", (c, c, 3, 3), relu=True, pad=1, out_scale=0.07)
    b.layer("conv", (2 * c, c, 1, 1), relu=False, out_scale=0.08)
    main = b.mark()
    b.goto(m0)
    b.layer("conv", (2 * c, c, 1, 1), relu=False, out_scale=0.05)  # projection
    b.add(main, relu=True, ys=0.1)
    identity_conv(b, 2 * c)
    return b


def shared_block(dt, n, c, h, w, seed=0):
    """The other operand t0 is read again after the fused Add (by a convolution the graph
    lists, and the plan runs, after it): the kernel must copy t0 into its output, not write
    over it; the second Add takes the first one's output in place."""
    b = Residual(dt, (n, c, h, w), seed)
    b.layer("conv", (c, c, 1, 1), relu=True, out_scale=0.06)
    t0 = b.mark()
    b.layer("conv", (c, c, 3, 3), relu=True, pad=1, out_scale=0.07)
    b.layer("conv", (c, c, 1, 1), relu=False, out_scale=0.08)
    b.add(t0, relu=False, ys=0.09)  # fused: conv + t0, t0 read later
    y1 = b.mark()
    b.goto(t0)
    b.layer("conv", (c, c, 1, 1), relu=False, out_scale=0.05)  # reads t0 after the Add
    b.add(y1, relu=True, ys=0.12)  # fused: conv + y1
    identity_conv(b, c)
    return b


def layer_counts(text):
    return {ln.split()[0]: int(ln.split()[2]) for ln in text.splitlines()
            if len(ln.split()) >= 3 and ln.split()[2].isdigit()}


@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("shape", [(1, 16, 8, 8), (2, 24, 5, 7)])
@pytest.mark.parametrize("block", ["projection", "shared"])
def test_qconv_sum(kiln_bin, tmp_path, dt, shape, block, monkeypatch):
    """The fused Add within one step (1 LSB) of numpy and of the unfused kernels
    (KILN_QSUM=0), 1 and 2 threads. The identity convolution after it shows the Add's output
    step for step. With these round scales (0.05, 0.08, 0.1: many sums on rounding
    midpoints) up to a few percent of the elements round the other way; with calibrated
    scales far fewer (docs/COMPRESSION.md)."""
    b = (projection_block if block == "projection" else shared_block)(dt, *shape, seed=shape[1])
    model = b.model()
    x = np.random.default_rng(5).normal(0, 2.0, size=b.x_shape).astype(np.float32)
    _, want = b.reference(x)
    step = np.float32(b.cur_scale)
    np.testing.assert_array_equal(run(kiln_bin, model, {"x": x}, tmp_path, "refkernels")["y"],
                                  want)
    for threads in (1, 2):
        fused = run(kiln_bin, model, {"x": x}, tmp_path, "fast", threads)["y"]
        monkeypatch.setenv("KILN_QSUM", "0")
        unfused = run(kiln_bin, model, {"x": x}, tmp_path, "fast", threads)["y"]
        monkeypatch.delenv("KILN_QSUM")
        assert_close_steps(np.rint(fused / step), np.rint(want / step), f"numpy t={threads}",
                           frac=0.05)
        assert_close_steps(np.rint(fused / step), np.rint(unfused / step),
                           f"unfused t={threads}", frac=0.05)
    if VNNI:
        counts = layer_counts(profile(kiln_bin, model, tmp_path))
        assert counts.get("KilnQLinearConvAdd") == (2 if block == "shared" else 1), counts
        assert "KilnQLinearAdd" not in counts and "Add" not in counts, counts


@pytest.mark.skipif(not VNNI, reason="no VNNI/AMX on this CPU: int8 nodes run on reference kernels")
def test_qconv_sum_profile_names_kernel(kiln_bin, tmp_path):
    text = profile(kiln_bin, projection_block(np.uint8, 1, 32, 14, 14).model(), tmp_path)
    assert "dnnl_qlinear_conv_sum" in text, text  # the sum post-op, not the split fallback
    assert "dnnl_qlinear_conv_add" not in text, text


def test_qconv_sum_declined(kiln_bin, tmp_path):
    """An Add whose operands are both read elsewhere (t1 by the second convolution, t2 by the
    third) is not fused and stays a KilnQLinearAdd; the next one, whose convolution output
    only it reads, is; the result that of numpy within one step."""
    b = Residual(np.uint8, (1, 16, 8, 8), 7)
    b.layer("conv", (16, 16, 1, 1), relu=True, out_scale=0.06)
    t1 = b.mark()
    b.layer("conv", (16, 16, 1, 1), relu=False, out_scale=0.07)
    t2 = b.mark()
    b.add(t1, relu=True)  # t2 + t1: not fused
    y1 = b.mark()
    b.goto(t2)
    b.layer("conv", (16, 16, 1, 1), relu=False, out_scale=0.08)
    b.add(y1, relu=False, ys=0.1)  # t3 + y1: fused
    identity_conv(b, 16)
    model = b.model()
    x = np.random.default_rng(2).normal(0, 2.0, size=b.x_shape).astype(np.float32)
    _, want = b.reference(x)
    step = np.float32(b.cur_scale)
    for threads in (1, 2):
        got = run(kiln_bin, model, {"x": x}, tmp_path, "fast", threads)["y"]
        assert_close_steps(np.rint(got / step), np.rint(want / step), f"t={threads}", frac=0.05)
    if VNNI:
        counts = layer_counts(profile(kiln_bin, model, tmp_path))
        assert counts.get("KilnQLinearAdd") == 1 and counts.get("KilnQLinearConvAdd") == 1, counts
# ---- KilnLut8: DQ -> float elementwise ops [-> Q] as a 256-entry table (src/opt/qlut.c) ----

def sigmoid32(f):
    """The reference Sigmoid's float32 arithmetic (ref/elementwise.c)."""
    with np.errstate(over="ignore"):
        pos = np.float32(1) / (np.float32(1) + np.exp(-f))
        e = np.exp(f)
        neg = e / (np.float32(1) + e)
    return np.where(f >= 0, pos, neg).astype(np.float32)


def lut_model(dt, shape, p, kind, out8):
    """a (8-bit) -> DQ -> kind (silu: x * Sigmoid(x), sigmoid, hardswish, hardsigmoid) [-> Q]
    -> y."""
    et = TensorProto.UINT8 if dt == np.uint8 else TensorProto.INT8
    sa, za, sy, zy = p
    inits = [tensor("sa", np.float32(sa)), tensor("za", np.array(za, dt)),
             tensor("sy", np.float32(sy)), tensor("zy", np.array(zy, dt))]
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["f"])]
    if kind == "silu":
        nodes += [helper.make_node("Sigmoid", ["f"], ["sig"]),
                  helper.make_node("Mul", ["f", "sig"], ["r"])]
    elif kind == "sigmoid":
        nodes.append(helper.make_node("Sigmoid", ["f"], ["r"]))
    elif kind == "hardsigmoid":  # MobileNetV3's squeeze-and-excitation gate
        nodes.append(helper.make_node("HardSigmoid", ["f"], ["r"], alpha=1.0 / 6, beta=0.5))
    else:
        nodes.append(helper.make_node("HardSwish", ["f"], ["r"]))
    if out8:
        nodes.append(helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", ["r"], ["y"]))
    g = helper.make_graph(nodes, "lut",
                          [helper.make_tensor_value_info("a", et, list(shape))],
                          [helper.make_tensor_value_info("y", et if out8 else TensorProto.FLOAT,
                                                         list(shape))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])


def op_counts(text):
    """Nodes per op in the profile's op table (rows: op, kernel, nodes, ...), summed over
    kernels: op_counts(text)("Sigmoid")."""
    n, table = {}, False
    for ln in text.splitlines():
        f = ln.split()
        if f[:3] == ["op", "kernel", "nodes"]:
            table = True
        elif table and len(f) >= 3 and f[2].isdigit():
            n[f[0]] = n.get(f[0], 0) + int(f[2])
        elif table and (not f or f[0].endswith(":")):
            table = False
    return lambda op: n.get(op, 0)


def all_codes(dt, shape, seed):
    """Every 8-bit code at least once (the first 256 elements), then random ones."""
    lo, hi = (-128, 128) if dt == np.int8 else (0, 256)
    a = np.random.default_rng(seed).integers(lo, hi, size=int(np.prod(shape)))
    a[:256] = np.arange(lo, hi)
    return a.reshape(shape).astype(dt)


@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("shape", [(1, 16, 4, 4), (2, 17, 41, 53)])
@pytest.mark.parametrize("kind,out8", [("silu", True), ("silu", False), ("sigmoid", False),
                                       ("hardswish", True), ("hardsigmoid", False)])
def test_lut8(kiln_bin, tmp_path, monkeypatch, dt, shape, kind, out8):
    """KilnLut8 gives bit for bit what the unfused DQ, ops and Q give on the reference kernels
    (its table is made by them), on every code, reference and fast kernel (AVX-512 VBMI),
    1 and 2 threads; SiLU and Sigmoid also bit for bit against numpy's float32 arithmetic."""
    p = (0.043, 37, 0.021, 13) if dt == np.uint8 else (0.05, -3, 0.019, -115)
    model = lut_model(dt, shape, p, kind, out8)
    a = all_codes(dt, shape, shape[1])
    feeds = {"a": a}
    monkeypatch.setenv("KILN_QLUT", "0")
    unfused = run(kiln_bin, model, feeds, tmp_path, "refkernels")["y"]
    monkeypatch.delenv("KILN_QLUT")
    assert unfused.dtype == (dt if out8 else np.float32)
    if kind in ("silu", "sigmoid"):  # the unfused reference itself against numpy
        f = (a.astype(np.float32) - np.float32(p[1])) * np.float32(p[0])
        r = f * sigmoid32(f) if kind == "silu" else sigmoid32(f)
        want = quantize(r.astype(np.float32), p[2], p[3], dt) if out8 else r.astype(np.float32)
        if out8:
            np.testing.assert_array_equal(unfused, want)
        else:  # numpy's and the C library's expf may differ in the last bit (x * that: 2)
            np.testing.assert_array_max_ulp(unfused, want, maxulp=2)
    np.testing.assert_array_equal(run(kiln_bin, model, feeds, tmp_path, "refkernels")["y"],
                                  unfused)
    for threads in (1, 2):
        np.testing.assert_array_equal(run(kiln_bin, model, feeds, tmp_path, "fast", threads)["y"],
                                      unfused)
    text = profile(kiln_bin, model, tmp_path)
    c = op_counts(text)
    assert c("KilnLut8") == 1 and c("Sigmoid") == c("Mul") == c("HardSwish") == 0, text
    assert c("HardSigmoid") == 0, text
    assert c("DequantizeLinear") == c("QuantizeLinear") == 0, text


def se_model(dt, shape, batched_gate):
    """a (8-bit) -> DQ -> SiLU -> [GlobalAveragePool -> pooled; Mul by gate g (per channel)
    -> Q -> y]: the squeeze-and-excitation's reads of a float SiLU."""
    et = TensorProto.UINT8 if dt == np.uint8 else TensorProto.INT8
    zp = 9 if dt == np.uint8 else -20
    inits = [tensor("sa", np.float32(0.045)), tensor("za", np.array(zp, dt)),
             tensor("sy", np.float32(0.017)), tensor("zy", np.array(zp + 3, dt))]
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["f"]),
             helper.make_node("Sigmoid", ["f"], ["sig"]),
             helper.make_node("Mul", ["f", "sig"], ["silu"]),
             helper.make_node("GlobalAveragePool", ["silu"], ["pooled"]),
             helper.make_node("Mul", ["g", "silu"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "sy", "zy"], ["y"])]
    gshape = [shape[0] if batched_gate else 1, shape[1], 1, 1]
    g = helper.make_graph(nodes, "se",
                          [helper.make_tensor_value_info("a", et, list(shape)),
                           helper.make_tensor_value_info("g", TensorProto.FLOAT, gshape)],
                          [helper.make_tensor_value_info("pooled", TensorProto.FLOAT,
                                                         [shape[0], shape[1], 1, 1]),
                           helper.make_tensor_value_info("y", et, list(shape))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]), gshape


@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("shape,batched", [((1, 16, 4, 4), False), ((2, 19, 13, 11), True),
                                           ((3, 5, 1, 1), False)])
def test_lut8_se(kiln_bin, tmp_path, monkeypatch, dt, shape, batched):
    """KilnLut8Pool and KilnLut8Mul (the pool and the per-channel Mul + Q that read a float
    SiLU) give bit for bit what the unfused nodes give on the reference kernels, reference
    and fast kernels, 1 and 2 threads; the pool also within float rounding of numpy's mean."""
    model, gshape = se_model(dt, shape, batched)
    a = all_codes(dt, shape, 7) if np.prod(shape) >= 256 else \
        np.random.default_rng(7).integers(-128 if dt == np.int8 else 0, 128, size=shape).astype(dt)
    gate = np.random.default_rng(8).uniform(0.0, 1.0, size=gshape).astype(np.float32)
    feeds = {"a": a, "g": gate}
    monkeypatch.setenv("KILN_QLUT", "0")
    unfused = run(kiln_bin, model, feeds, tmp_path, "refkernels")
    monkeypatch.delenv("KILN_QLUT")
    zp = 9 if dt == np.uint8 else -20
    f = (a.astype(np.float32) - np.float32(zp)) * np.float32(0.045)
    silu = (f * sigmoid32(f)).astype(np.float32)
    np.testing.assert_allclose(unfused["pooled"], silu.astype(np.float64).mean(axis=(2, 3),
                                                                               keepdims=True),
                               rtol=1e-6, atol=1e-7)
    for mode, threads in (("refkernels", 1), ("fast", 1), ("fast", 2)):
        got = run(kiln_bin, model, feeds, tmp_path, mode, threads)
        for k in ("pooled", "y"):
            np.testing.assert_array_equal(got[k], unfused[k], err_msg=f"{k} {mode} t={threads}")
    c = op_counts(profile(kiln_bin, model, tmp_path))
    assert c("KilnLut8Pool") == 1 and c("KilnLut8Mul") == 1, c
    assert c("Mul") == c("GlobalAveragePool") == c("Sigmoid") == c("KilnLut8") == 0


def mbconv_se_model(dt, n, c, h, w, seed=0):
    """EfficientNet's MBConv block as a static int8 QDQ graph: 1x1 expand conv -> SiLU ->
    depthwise 3x3 -> SiLU -> squeeze-and-excitation (GlobalAveragePool -> 1x1 conv -> SiLU ->
    1x1 conv -> Sigmoid -> per-channel Mul) -> 1x1 project conv, each SiLU (x * Sigmoid(x)),
    the pool and the Mul in float between DQ and Q, as calibration writes them."""
    b = Residual(dt, (n, c, h, w), seed)
    e, r = 4 * c, max(c // 4, 2)
    zp = 20 if dt == np.uint8 else -100

    def silu(q):
        x = b.dq(b.cur, np.float32(b.cur_scale), b.dt(b.cur_zp))
        sig, y = b.name("sig"), b.name("silu")
        b.nodes += [helper.make_node("Sigmoid", [x], [sig]), helper.make_node("Mul", [x, sig], [y])]
        if q:
            b.cur, b.cur_scale, b.cur_zp = b.q(y, 0.03, zp), np.float32(0.03), zp
        return y

    b.layer("conv", (e, c, 1, 1), out_scale=0.05)
    silu(True)
    b.layer("conv", (e, 1, 3, 3), pad=1, group=e, out_scale=0.05)
    act = silu(False)
    gap = b.name("gap")
    b.nodes.append(helper.make_node("GlobalAveragePool", [act], [gap]))
    b.cur, b.cur_scale, b.cur_zp = b.q(gap, 0.02, zp), np.float32(0.02), zp
    b.layer("conv", (r, e, 1, 1), out_scale=0.04)
    silu(True)
    b.layer("conv", (e, r, 1, 1), out_scale=0.06)
    x = b.dq(b.cur, np.float32(b.cur_scale), b.dt(b.cur_zp))
    gate, scaled = b.name("gate"), b.name("se")
    b.nodes += [helper.make_node("Sigmoid", [x], [gate]),
                helper.make_node("Mul", [act, gate], [scaled])]
    b.cur, b.cur_scale, b.cur_zp = b.q(scaled, 0.03, zp), np.float32(0.03), zp
    b.layer("conv", (c, e, 1, 1), out_scale=0.08)
    return b.model()


@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("shape", [(1, 16, 8, 8), (2, 12, 7, 5), (1, 5, 6, 6)])
def test_mbconv_se_lut_chain(kiln_bin, tmp_path, monkeypatch, dt, shape):
    """The block with its SiLUs and SE gate as KilnLut8: on the reference kernels bit for bit
    the unfused graph's result (KILN_QLUT=0); the fast path (channels last on VNNI), 1 and 2
    threads, within one step of it on at most 2% of the elements (oneDNN's float requantization
    and the pool's sum order, as in test_residual_chain)."""
    model = mbconv_se_model(dt, *shape, seed=shape[1])
    x = np.random.default_rng(13).normal(0, 2.0, size=shape).astype(np.float32)
    step = np.float32(0.08)
    monkeypatch.setenv("KILN_QLUT", "0")
    unfused = run(kiln_bin, model, {"x": x}, tmp_path, "refkernels")["y"]
    monkeypatch.delenv("KILN_QLUT")
    np.testing.assert_array_equal(run(kiln_bin, model, {"x": x}, tmp_path, "refkernels")["y"],
                                  unfused)
    for threads in (1, 2):
        fast = run(kiln_bin, model, {"x": x}, tmp_path, "fast", threads)["y"]
        assert_close_steps(np.rint(fast / step), np.rint(unfused / step), f"fast t={threads}",
                           frac=0.02)


@pytest.mark.skipif(not VNNI, reason="no VNNI/AMX on this CPU: int8 nodes run on reference kernels")
def test_mbconv_se_stays_int8_channels_last(kiln_bin, tmp_path, monkeypatch):
    """The profile: three KilnLut8 (two 8-bit SiLUs, the float gate), the SE's pool and
    per-channel Mul + Q on the float SiLU's table (KilnLut8Pool, KilnLut8Mul), no Sigmoid, Mul,
    float pool, no DequantizeLinear but the output's, and no reorder but at the graph's edges
    (the float input's Q and the output's DQ); with the tables off (KILN_QLUT=0) the same
    graph ran float Sigmoids and DQs between the convolutions."""
    model = mbconv_se_model(np.uint8, 1, 16, 14, 14)

    text = profile(kiln_bin, model, tmp_path)
    c = op_counts(text)
    assert c("KilnLut8") == 3 and c("QLinearConv") == 5, text
    assert c("KilnLut8Pool") == 1 and c("KilnLut8Mul") == 1, text
    assert c("Sigmoid") == c("Mul") == c("GlobalAveragePool") == 0, text
    assert c("DequantizeLinear") <= 1, text
    assert c("KilnReorder") <= 2, text
    monkeypatch.setenv("KILN_QLUT", "0")
    before = op_counts(profile(kiln_bin, model, tmp_path))
    # the SiLUs x * sigmoid(x) run as Swish steps (the SiLU fusion), the gate as a Sigmoid
    assert before("DequantizeLinear") >= 4 and before("Sigmoid") + before("Swish") == 4, text


def identity_conv_nodes(nodes, inits, x, c, s, zp, dt, tag):
    """DQ(x) -> 1x1 Conv with identity int8 weights (scale 1) -> Q(s, zp): with x's scale s and
    zero point zp the requantization multiplier is exactly 1, so every kernel returns x's codes."""
    w = np.eye(c, dtype=np.int8).reshape(c, c, 1, 1)
    inits += [tensor(f"w{tag}", w), tensor(f"ws{tag}", np.ones(c, np.float32)),
              tensor(f"wz{tag}", np.zeros(c, np.int8)), tensor(f"s{tag}", np.float32(s)),
              tensor(f"z{tag}", np.array(zp, dt))]
    nodes += [helper.make_node("DequantizeLinear", [x, f"s{tag}", f"z{tag}"], [f"xf{tag}"]),
              helper.make_node("DequantizeLinear", [f"w{tag}", f"ws{tag}", f"wz{tag}"],
                               [f"wf{tag}"], axis=0),
              helper.make_node("Conv", [f"xf{tag}", f"wf{tag}"], [f"c{tag}"], kernel_shape=[1, 1]),
              helper.make_node("QuantizeLinear", [f"c{tag}", f"s{tag}", f"z{tag}"], [f"q{tag}"])]
    return f"q{tag}"


def se_nhwc_model(dt, shape, batched_gate):
    """x (float) -> Q -> identity conv -> DQ -> SiLU -> [pool -> pooled; Mul by gate g -> Q ->
    identity conv -> y]: the SE's KilnLut8Pool and KilnLut8Mul between int8 convolutions, so
    channels last on VNNI, on values every kernel computes exactly."""
    n, c = shape[:2]
    et = TensorProto.UINT8 if dt == np.uint8 else TensorProto.INT8
    zp, zy = (9, 12) if dt == np.uint8 else (-20, -17)
    nodes, inits = [], [tensor("sx", np.float32(0.045)), tensor("zx", np.array(zp, dt))]
    nodes.append(helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["qx"]))
    a = identity_conv_nodes(nodes, inits, "qx", c, 0.045, zp, dt, "_c1")
    inits += [tensor("sa", np.float32(0.045)), tensor("za", np.array(zp, dt)),
              tensor("sy", np.float32(0.017)), tensor("zy", np.array(zy, dt))]
    nodes += [helper.make_node("DequantizeLinear", [a, "sa", "za"], ["f"]),
              helper.make_node("Sigmoid", ["f"], ["sig"]),
              helper.make_node("Mul", ["f", "sig"], ["silu"]),
              helper.make_node("GlobalAveragePool", ["silu"], ["pooled"]),
              helper.make_node("Mul", ["silu", "g"], ["m"]),
              helper.make_node("QuantizeLinear", ["m", "sy", "zy"], ["qm"])]
    y = identity_conv_nodes(nodes, inits, "qm", c, 0.017, zy, dt, "_c2")
    nodes.append(helper.make_node("Identity", [y], ["y"]))
    gshape = [n if batched_gate else 1, c, 1, 1]
    g = helper.make_graph(nodes, "se_nhwc",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)),
                           helper.make_tensor_value_info("g", TensorProto.FLOAT, gshape)],
                          [helper.make_tensor_value_info("pooled", TensorProto.FLOAT,
                                                         [n, c, 1, 1]),
                           helper.make_tensor_value_info("y", et, list(shape))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]), gshape


@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("shape,batched", [((1, 40, 9, 7), False), ((2, 72, 5, 6), True)])
def test_lut8_se_channels_last(kiln_bin, tmp_path, monkeypatch, dt, shape, batched):
    """KilnLut8Pool and KilnLut8Mul reading channels-last values (VBMI: 64 channels at a time,
    with tails) bit for bit the unfused nodes on the reference kernels, 1 and 2 threads."""
    model, gshape = se_nhwc_model(dt, shape, batched)
    x = np.random.default_rng(21).normal(0, 3.0, size=shape).astype(np.float32)
    gate = np.random.default_rng(22).uniform(0.0, 1.0, size=gshape).astype(np.float32)
    feeds = {"x": x, "g": gate}
    monkeypatch.setenv("KILN_QLUT", "0")
    unfused = run(kiln_bin, model, feeds, tmp_path, "refkernels")
    monkeypatch.delenv("KILN_QLUT")
    for mode, threads in (("refkernels", 1), ("fast", 1), ("fast", 2)):
        got = run(kiln_bin, model, feeds, tmp_path, mode, threads)
        for k in ("pooled", "y"):
            np.testing.assert_array_equal(got[k], unfused[k], err_msg=f"{k} {mode} t={threads}")
    text = profile(kiln_bin, model, tmp_path)
    c = op_counts(text)
    assert c("KilnLut8Pool") == 1 and c("KilnLut8Mul") == 1 and c("QLinearConv") == 2, text
    if VNNI and os.environ.get("KILN_ISA") not in ("scalar", "avx2"):
        # the pool and the Mul read the convolution's channels-last bytes
        assert c("KilnReorder") <= 3, text
        assert any("KilnLut8Mul" in ln and "(blocked 1)" in ln for ln in text.splitlines()) or \
            b"libasan" in open(kiln_bin, "rb").read(), text
