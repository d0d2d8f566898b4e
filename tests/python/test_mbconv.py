"""The mbconv_fusion pass and its kernel (KilnMBConv) on ONNX models written
the way PyTorch exports MobileNet-style blocks: Conv + Clip(0, 6) or Relu or
x * Sigmoid(x), depthwise Conv (group = channels), 1x1 Conv, residual Add.

Each model runs through the `kiln` binary three ways: the default path (on
AVX-512 CPUs the blocks become KilnMBConv nodes), KILN_MBCONV=0 (oneDNN's
separate convolutions) and --reference (the imported graph on the reference
kernels). Outputs must agree within 1e-4 of the output's scale, and
`kiln inspect --optimized` must report the fusions where the CPU has
AVX-512 (and none where an intermediate value is read elsewhere).

The binary is $KILN_BIN, or build/kiln in this checkout; the tests skip with
a message when it is missing or onnx is not installed.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
KILN = os.environ.get("KILN_BIN") or str(REPO / "build" / "kiln")

pytestmark = pytest.mark.skipif(
    not (os.path.isfile(KILN) and os.access(KILN, os.X_OK)),
    reason=f"kiln binary not found at {KILN} (build it, or set KILN_BIN)",
)


def has_avx512():
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512f" in flags and os.environ.get("KILN_ISA", "") in ("", "avx512")


class Builder:
    """Nodes and initializers of one model; every weight random but fixed."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, base):
        self.n += 1
        return f"{base}{self.n}"

    def const(self, arr):
        n = self.name("w")
        self.inits.append(numpy_helper.from_array(np.asarray(arr, dtype=np.float32), n))
        return n

    def conv(self, x, cin, cout, k=1, stride=1, group=1):
        w = self.const(self.rng.standard_normal((cout, cin // group, k, k)) * (1.5 / np.sqrt(cin // group * k * k)))
        b = self.const(self.rng.standard_normal(cout) * 0.2)
        y = self.name("c")
        self.nodes.append(helper.make_node("Conv", [x, w, b], [y], group=group, kernel_shape=[k, k],
                                           pads=[k // 2] * 4, strides=[stride, stride]))
        return y

    def act(self, x, kind):
        y = self.name("a")
        if kind == "relu6":
            self.nodes.append(helper.make_node("Clip", [x, self.const(0.0), self.const(6.0)], [y]))
        elif kind == "relu":
            self.nodes.append(helper.make_node("Relu", [x], [y]))
        elif kind == "silu":
            s = self.name("s")
            self.nodes.append(helper.make_node("Sigmoid", [x], [s]))
            self.nodes.append(helper.make_node("Mul", [x, s], [y]))
        else:
            return x
        return y

    def add(self, a, b):
        y = self.name("r")
        self.nodes.append(helper.make_node("Add", [a, b], [y]))
        return y

    def block(self, x, cin, ce, cout, k=3, stride=1, act="relu6", expand=True, residual=False):
        e = self.act(self.conv(x, cin, ce), act) if expand else x
        d = self.act(self.conv(e, ce, ce, k=k, stride=stride, group=ce), act)
        p = self.conv(d, ce, cout)
        return self.add(p, x) if residual else p

    def save(self, path, x, y, cin, hw, outputs=()):
        """Input [N, cin, h, w]: the batch symbolic, the plane fixed (as
        torch.onnx.export writes it with a dynamic batch axis only)."""
        graph = helper.make_graph(
            self.nodes, "blocks",
            [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", cin, *hw])],
            [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in (y, *outputs)],
            self.inits)
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def run(model, x, out, *args, env=None):
    np.save(out.parent / "x.npy", x)
    r = subprocess.run([KILN, "predict", model, "--input", f"x={out.parent / 'x.npy'}",
                        "--output-dir", out, *args], capture_output=True, text=True,
                       env={**os.environ, **(env or {})}, timeout=300)
    assert r.returncode == 0, r.stderr
    return {p.stem: np.load(p) for p in sorted(out.glob("*.npy"))}


def fusions(model, env=None):
    r = subprocess.run([KILN, "inspect", model, "--optimized"], capture_output=True, text=True,
                       env={**os.environ, **(env or {})}, timeout=120)
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stdout.splitlines() if "mbconv_fusion" in ln]
    return line[0] if line else ""


def assert_close(got, want):
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for name, w in want.items():
        assert got[name].shape == w.shape, f"{name}: shape {got[name].shape}, expected {w.shape}"
        scale = max(1.0, float(np.abs(w).max()))
        err = float(np.abs(got[name] - w).max()) / scale
        assert err <= 1e-4, f"{name}: error {err:g} of scale {scale:g}"


def expected_shapes(model, batch):
    """Every output's shape as ONNX's own shape inference gives it (batch bound)."""
    m = onnx.shape_inference.infer_shapes(onnx.load(str(model)), strict_mode=True)
    return {o.name: tuple(batch if d.dim_param else d.dim_value
                          for d in o.type.tensor_type.shape.dim) for o in m.graph.output}


def check_three_ways(tmp_path, model, x, threads):
    ref = run(model, x, tmp_path / "ref", "--reference")
    fused = run(model, x, tmp_path / "fused", "--threads", threads)
    plain = run(model, x, tmp_path / "plain", "--threads", threads, env={"KILN_MBCONV": "0"})
    want = expected_shapes(model, x.shape[0])
    assert {n: a.shape for n, a in ref.items()} == want
    assert_close(fused, ref)
    assert_close(plain, ref)


def save_and_check(tmp_path, b, y, cin, hw, batch, seed, threads, outputs=()):
    """Save b's model (input x [batch, cin, *hw]), run it three ways on a
    random input, and return its mbconv_fusion log line."""
    model = tmp_path / "m.onnx"
    b.save(model, "x", y, cin, hw, outputs=outputs)
    x = np.random.default_rng(seed).standard_normal((batch, cin, *hw)).astype(np.float32)
    check_three_ways(tmp_path, model, x, threads)
    return fusions(model)


@pytest.mark.parametrize("size", [30, 17, 7])
@pytest.mark.parametrize("threads", ["1", "2"])
def test_mobilenet_blocks_match_reference(tmp_path, size, threads):
    """A stem, MobileNetV2's first block (depthwise + project, no expand), a
    strided block and a residual block, then a 1x1 head."""
    b = Builder(1)
    s = b.act(b.conv("x", 3, 32, k=3, stride=2), "relu6")
    a = b.block(s, 32, 32, 16, expand=False)
    c = b.block(a, 16, 96, 24, stride=2)
    r = b.block(c, 24, 144, 24, residual=True)
    y = b.conv(r, 24, 8)
    model = tmp_path / "m.onnx"
    b.save(model, "x", y, 3, (size, size))
    x = np.random.default_rng(2).standard_normal((2, 3, size, size)).astype(np.float32)
    check_three_ways(tmp_path, model, x, threads)
    line = fusions(model)
    if has_avx512():
        assert "MBConv x1" in line and "MBConv+Add x1" in line and "Depthwise+Project x1" in line, line
    else:
        assert "MBConv" not in line and "Depthwise" not in line, line
    assert "MBConv" not in fusions(model, env={"KILN_MBCONV": "0"})
    # no fused node where the kernels are told to stay below AVX-512
    assert "MBConv" not in fusions(model, env={"KILN_ISA": "avx2"})


@pytest.mark.parametrize("act", ["relu", "silu"])
def test_5x5_blocks_and_activations(tmp_path, act):
    """5x5 depthwise kernels at stride 1 and 2 with Relu or SiLU, channel
    counts that are no multiple of 16."""
    b = Builder(3)
    s = b.act(b.conv("x", 8, 24, k=3), act)
    c = b.block(s, 24, 72, 40, k=5, stride=2, act=act)
    r = b.block(c, 40, 120, 40, k=5, act=act, residual=True)
    y = b.conv(r, 40, 8)
    model = tmp_path / "m.onnx"
    b.save(model, "x", y, 8, (19, 23))
    x = np.random.default_rng(4).standard_normal((3, 8, 19, 23)).astype(np.float32)
    check_three_ways(tmp_path, model, x, "2")
    if has_avx512():
        line = fusions(model)
        assert "MBConv x1" in line and "MBConv+Add x1" in line, line


def test_block_not_fused_when_an_intermediate_is_read(tmp_path):
    """The expanded value is also a graph output: the block must stay three
    convolutions (the fused kernel never stores it), and still be right."""
    b = Builder(5)
    s = b.act(b.conv("x", 3, 16, k=3), "relu6")
    e = b.act(b.conv(s, 16, 64), "relu6")
    d = b.act(b.conv(e, 64, 64, k=3, group=64), "relu6")
    p = b.conv(d, 64, 16)
    y = b.conv(p, 16, 4)
    line = save_and_check(tmp_path, b, y, 3, (12, 12), 1, 6, "2", outputs=[e])
    assert "MBConv x" not in line, line


def se_block(b, x, cin, ce, cout, cse, k=3, stride=1, expand=True, residual=False, se_act="silu"):
    """EfficientNet's block as torchvision exports it: expand, depthwise, then
    squeeze-excitation (GlobalAveragePool, 1x1 Conv + SiLU, 1x1 Conv +
    Sigmoid, Mul), project, residual Add."""
    e = b.act(b.conv(x, cin, ce), "silu") if expand else x
    d = b.act(b.conv(e, ce, ce, k=k, stride=stride, group=ce), "silu")
    pooled = b.name("gap")
    b.nodes.append(helper.make_node("GlobalAveragePool", [d], [pooled]))
    f1 = b.act(b.conv(pooled, ce, cse), se_act)
    gate = b.name("g")
    b.nodes.append(helper.make_node("Sigmoid", [b.conv(f1, cse, ce)], [gate]))
    scaled = b.name("m")
    b.nodes.append(helper.make_node("Mul", [d, gate], [scaled]))
    p = b.conv(scaled, ce, cout)
    return b.add(p, x) if residual else p


def efficientnet_stack(size, se_act="silu"):
    """A stem, the first block (no expand), a strided 3x3 block, a residual
    5x5 block and a 1x1 head; channels no multiple of 16."""
    b = Builder(7)
    s = b.act(b.conv("x", 3, 24, k=3, stride=2), "silu")
    a = se_block(b, s, 24, 24, 16, 6, expand=False, se_act=se_act)
    c = se_block(b, a, 16, 96, 40, 4, stride=2, se_act=se_act)
    r = se_block(b, c, 40, 200, 40, 10, k=5, residual=True, se_act=se_act)
    return b, b.conv(r, 40, 8)


@pytest.mark.parametrize("size,batch,threads", [(40, 1, "2"), (40, 3, "2"), (14, 1, "3"),
                                                (14, 2, "3"), (9, 1, "1"), (23, 4, "3")])
def test_squeeze_excitation_blocks_match_reference(tmp_path, size, batch, threads):
    """The squeeze-excitation joins the fused block: one image split between
    threads by channel blocks and pixels (batch below the thread count), or
    whole images per thread; large planes scale the project's weights by the
    gate, small ones the depthwise output."""
    b, y = efficientnet_stack(size)
    line = save_and_check(tmp_path, b, y, 3, (size, size), batch, 8, threads)
    if has_avx512():
        assert ("Depthwise+SE+Project x1" in line and "MBConv+SE x1" in line and
                "MBConv+SE+Add x1" in line), line
    else:
        assert "SE" not in line, line


@pytest.mark.parametrize("se_act", ["relu", "none"])
def test_squeeze_excitation_activations(tmp_path, se_act):
    b, y = efficientnet_stack(12, se_act)
    line = save_and_check(tmp_path, b, y, 3, (12, 12), 2, 9, "2")
    if has_avx512():
        assert "MBConv+SE+Add x1" in line, line


def test_squeeze_excitation_not_fused_when_its_gate_is_read(tmp_path):
    """The gate is a graph output too: the block keeps its own nodes."""
    b, y = efficientnet_stack(10)
    gate = next(n.output[0] for n in b.nodes if n.op_type == "Sigmoid" and n.output[0].startswith("g"))
    line = save_and_check(tmp_path, b, y, 3, (10, 10), 1, 10, "2", outputs=[gate])
    assert "Depthwise+SE+Project x1" not in line, line
    if has_avx512():
        assert "MBConv+SE x1" in line, line


def kernels_run(model, batch, threads, env=None):
    """The kernels `kiln bench --profile` reports for the model's plan."""
    r = subprocess.run([KILN, "bench", model, "--batch", str(batch), "--threads", threads,
                        "--iterations", "1", "--warmup", "0", "--profile"],
                       capture_output=True, text=True, env={**os.environ, **(env or {})},
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


@pytest.mark.parametrize("batch,threads", [(4, "1"), (5, "2"), (9, "2"), (70, "1"), (3, "2")])
def test_small_planes_run_images_together(tmp_path, batch, threads):
    """On small planes the weights outweigh an image's activations: with two
    images or more per thread the kernel expands and projects several images
    in one product each (avx512_mbconv_group), in groups of up to about 1 MiB
    of scratch (70 images on one thread: several groups, the last partial;
    5 on two threads: 2 and 3, gates four images at a time). A 12x12 input
    leaves 6x6 and 3x3 planes: squeeze-excitation blocks with and without a
    residual, a plain block with one, channels no multiple of 16; all
    checked against the reference and oneDNN's convolutions, grouped and
    not (KILN_MBCONV_GROUP=0)."""
    b = Builder(11)
    s = b.act(b.conv("x", 3, 24, k=3, stride=2), "silu")
    c = se_block(b, s, 24, 96, 40, 6, stride=2)
    r = se_block(b, c, 40, 200, 40, 10, k=5, residual=True)
    p = b.block(r, 40, 160, 40, residual=True)
    y = b.conv(p, 40, 8)
    model = tmp_path / "m.onnx"
    b.save(model, "x", y, 3, (12, 12))
    x = np.random.default_rng(12).standard_normal((batch, 3, 12, 12)).astype(np.float32)
    check_three_ways(tmp_path, model, x, threads)
    ref = run(model, x, tmp_path / "ref2", "--reference")
    assert_close(run(model, x, tmp_path / "ungrouped", "--threads", threads,
                     env={"KILN_MBCONV_GROUP": "0"}), ref)
    if not has_avx512():
        return
    grouped = batch // int(threads) >= 2
    assert ("avx512_mbconv_group" in kernels_run(model, batch, threads)) == grouped
    assert "avx512_mbconv_group" not in kernels_run(model, batch, threads,
                                                    env={"KILN_MBCONV_GROUP": "0"})
