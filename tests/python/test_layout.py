"""The layout pass (src/opt/layout.c) on small graphs, one per kind of op a
blocked layout crosses.

Each graph is built with onnx.helper around constant-weight convolutions, so
the pass blocks the values between them (nChw16c with AVX-512, nChw8c with
KILN_ISA=avx2). Each test runs the graph on the default path (optimizer,
layout pass, fast kernels) and on the reference path (imported graph,
reference kernels, plain layouts), and compares the outputs within 1e-4 of
their scale; and it reads the optimization log (`kiln inspect --optimized
--json`) to check that the pass did block the values the case is about and
placed no more reorders than the case needs, so a pass that blocked nothing
(and so trivially matched) fails. Channel counts off the block (24 with
blocks of 16) check that the padded channels stay zero where f(0) is not 0
(Sigmoid, Div).
"""
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def kiln_bin():
    path = os.path.abspath(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln")))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kiln executable not found at {path}: build it or set KILN_BIN")
    return path


def isa_env(isa):
    env = dict(os.environ)
    env.pop("KILN_FAST", None)
    if isa:
        env["KILN_ISA"] = isa
    else:
        env.pop("KILN_ISA", None)
    return env


class G:
    """A graph under construction: constant-weight convolutions and other nodes."""

    def __init__(self, c_in, h=10, w=10):
        self.nodes, self.inits, self.inputs, self.n = [], [], [], 0
        self.feeds = {}
        self.input("X", (2, c_in, h, w))

    def name(self, p):
        self.n += 1
        return f"{p}{self.n}"

    def input(self, name, shape):
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        self.feeds[name] = RNG.standard_normal(shape).astype(np.float32)
        return name

    def const(self, arr):
        n = self.name("k")
        self.inits.append(numpy_helper.from_array(np.asarray(arr, dtype=np.float32), n))
        return n

    def conv(self, x, c_in, c_out, k=1, stride=1, group=1):
        w = self.const(RNG.standard_normal((c_out, c_in // group, k, k)) * (1.0 / np.sqrt(c_in * k * k)))
        b = self.const(RNG.standard_normal(c_out) * 0.1)
        return self.op("Conv", [x, w, b], kernel_shape=[k, k], pads=[k // 2] * 4,
                       strides=[stride, stride], group=group)

    def op(self, op_type, inputs, **attrs):
        y = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [y], name=y, **attrs))
        return y

    def save(self, path, outputs, shapes=None):
        """shapes: an output's shape where ONNX's inference cannot tell it (behind a Reshape
        to a computed shape)."""
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        graph = helper.make_graph(self.nodes, "layout_case", self.inputs, outs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
        model.ir_version = 7
        # the outputs' shapes from ONNX's own inference, then the full check
        inferred = onnx.shape_inference.infer_shapes(model)
        inferred_types = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
        for o in model.graph.output:
            if o.name in (shapes_given := shapes or {}):
                o.type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, shapes_given[o.name]))
            else:
                o.type.CopyFrom(inferred_types[o.name].type)
        onnx.checker.check_model(model)
        onnx.save(model, str(path))


def predict(kiln, model, feeds, out_dir, env, reference=False):
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [kiln, "predict", str(model)]
    for name, arr in feeds.items():
        p = out_dir / f"in_{name}.npy"
        np.save(p, arr)
        cmd += ["--input", f"{name}={p}"]
    cmd += ["--output-dir", str(out_dir)]
    if reference:
        cmd.append("--reference")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return out_dir


def opt_log(kiln, model, env):
    """The optimization log `kiln inspect --optimized --json` gives for the first signature."""
    proc = subprocess.run([kiln, "inspect", str(model), "--optimized", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["signatures"][0]["optimization"]["log"]


def layout_counts(kiln, model, env):
    """(blocked values, reorders) from the layout pass's line of the optimization log."""
    log = opt_log(kiln, model, env)
    line = next((l for l in log.splitlines() if l.strip().startswith("layout ")), "")
    blocked = re.search(r"blocked value x(\d+)", line)
    reorders = re.search(r"KilnReorder x(\d+)", line)
    return (int(blocked.group(1)) if blocked else 0, int(reorders.group(1)) if reorders else 0)


def run_case(kiln, tmp_path, g, outputs, min_blocked, max_reorders, shapes=None):
    model = tmp_path / "m.onnx"
    g.save(model, outputs, shapes)
    for isa in ("", "avx2"):
        env = isa_env(isa)
        blocked, reorders = layout_counts(kiln, model, env)
        assert blocked >= min_blocked, f"isa {isa or 'default'}: {blocked} blocked values"
        assert reorders <= max_reorders, f"isa {isa or 'default'}: {reorders} reorders"
        got = predict(kiln, model, g.feeds, tmp_path / f"fast{isa}", env)
        ref = predict(kiln, model, g.feeds, tmp_path / f"ref{isa}", env, reference=True)
        for o in outputs:
            a, b = np.load(got / f"{o}.npy"), np.load(ref / f"{o}.npy")
            assert a.shape == b.shape
            scale = max(1.0, float(np.abs(b).max()))
            err = float(np.abs(a.astype(np.float64) - b).max())
            assert err <= 1e-4 * scale, f"{o} (isa {isa or 'default'}): error {err:.3g}"


def pool(g, x):
    """A MaxPool (stride 1): keeps the next op from being fused into the convolution."""
    return g.op("MaxPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1])


# 24 channels: padded blocks with 16, where Sigmoid(0) and HardSwish's f(0) != 0 would leak
@pytest.mark.parametrize("c,act", [(32, "Relu"), (24, "Sigmoid"), (24, "HardSwish"),
                                   (24, "Clip")])
def test_unary_between_convs(kiln_bin, tmp_path, c, act):
    g = G(3)
    x = pool(g, g.conv("X", 3, c, 3))
    if act == "Clip":
        y = g.op("Clip", [x, g.const(np.float32(-0.5)), g.const(np.float32(0.7))])
    else:
        y = g.op(act, [x])
    z = g.conv(g.conv(y, c, 32, 3), 32, 16, 1)
    # conv, pool, activation, conv: blocked; the last conv writes the plain output and
    # so reads plain input (one reorder)
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=4, max_reorders=1)


@pytest.mark.parametrize("c,op", [(32, "Add"), (24, "Div"), (24, "Mul"), (32, "Sub")])
def test_binary_between_convs(kiln_bin, tmp_path, c, op):
    g = G(3)
    a = pool(g, g.conv("X", 3, c, 3))
    b = pool(g, g.conv("X", 3, c, 1))
    if op == "Div":
        b = g.op("Sigmoid", [b])  # away from 0
    y = g.op(op, [a, b])
    z = g.conv(g.conv(y, c, 32, 1), 32, 16, 1)
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=6, max_reorders=1)


def test_silu_and_residual(kiln_bin, tmp_path):
    """x * sigmoid(x) (one Swish after silu_fusion, blocked as the Sigmoid and Mul were), then a
    residual Add of the block's input, then MaxPool."""
    g = G(3)
    x = pool(g, g.conv("X", 3, 32, 3))
    s = g.op("Sigmoid", [x])
    m = g.op("Mul", [x, s])
    y = g.conv(m, 32, 32, 3)
    r = g.op("Add", [y, x])
    p = g.op("MaxPool", [r], kernel_shape=[2, 2], strides=[2, 2])
    z = g.conv(g.conv(p, 32, 16, 1), 16, 16, 1)
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=6, max_reorders=1)


@pytest.mark.parametrize("c1,c2", [(32, 16), (32, 24), (16, 48)])
def test_concat_channels(kiln_bin, tmp_path, c1, c2):
    """Fire module: Concat of two convolutions along C (whole blocks but the last)."""
    g = G(3)
    s = g.conv("X", 3, 16, 1)
    a = g.op("Relu", [g.conv(s, 16, c1, 1)])
    b = g.op("Relu", [g.conv(s, 16, c2, 3)])
    y = g.op("Concat", [a, b], axis=1)
    z = g.conv(g.conv(y, c1 + c2, 32, 1), 32, 16, 1)
    # s, a, b, the Concat, the conv after it; one reorder before the last conv
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=5, max_reorders=1)


def test_concat_channels_off_the_block(kiln_bin, tmp_path):
    """A first input of 24 channels is not a whole number of 16-blocks: with AVX-512
    the Concat copies lane by lane into the output's blocks, still blocked (one
    reorder, before the last convolution); with AVX2 it is whole blocks of 8."""
    g = G(3)
    a = g.conv("X", 3, 24, 1)
    b = g.conv("X", 3, 16, 3)
    y = g.op("Concat", [a, b], axis=1)
    z = g.conv(g.conv(y, 40, 16, 1), 16, 16, 1)
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=4, max_reorders=1)


def ints(g, vals):
    n = g.name("i")
    g.inits.append(numpy_helper.from_array(np.asarray(vals, dtype=np.int64), n))
    return n


def shuffle(g, x, c, groups, h, w):
    """ShuffleNet's channel shuffle: Reshape [N, g, C/g, H, W], Transpose(0,2,1,3,4),
    Reshape [N, C, H, W] (0 copies the batch, -1 is forced by the count)."""
    r = g.op("Reshape", [x, ints(g, [0, groups, c // groups, h, w])])
    t = g.op("Transpose", [r], perm=[0, 2, 1, 3, 4])
    return g.op("Reshape", [t, ints(g, [0, -1, h, w])])


@pytest.mark.parametrize("half", [58, 24, 16])
def test_shufflenet_unit(kiln_bin, tmp_path, half):
    """Two ShuffleNet v2 units: Slice the channels in halves (58: off every block),
    a 1x1 / depthwise 3x3 / 1x1 branch on one half, Concat with the other, channel
    shuffle. The shuffle becomes a Gather of channels and everything stays blocked:
    before, each Reshape / Transpose / Reshape and each Slice read plain data (a
    reorder on either side of every unit); now one reorder remains, before the
    last convolution, which writes the plain graph output."""
    c = 2 * half
    g = G(3)
    x = g.op("Relu", [g.conv("X", 3, c, 3)])
    for _ in range(2):
        a = g.op("Slice", [x, ints(g, [0]), ints(g, [half]), ints(g, [1])])
        b = g.op("Slice", [x, ints(g, [half]), ints(g, [c]), ints(g, [1])])
        b = g.op("Relu", [g.conv(b, half, half, 1)])
        b = g.conv(b, half, half, 3, group=half)
        b = g.op("Relu", [g.conv(b, half, half, 1)])
        y = g.op("Concat", [a, b], axis=1)
        x = shuffle(g, y, c, 2, 10, 10)
    z = g.conv(g.conv(x, c, 32, 1), 32, 16, 1)
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=14, max_reorders=1)
    proc = subprocess.run([kiln_bin, "inspect", str(tmp_path / "m.onnx"), "--optimized"],
                          capture_output=True, text=True, env=isa_env(""), timeout=120)
    assert "channel shuffle as Gather x2" in proc.stdout, proc.stdout
    # the second unit's halves read the first shuffle's input: Gathers of their indices
    assert "Slice of Gather as Gather x2" in proc.stdout, proc.stdout


def test_slices_of_a_channel_gather(kiln_bin, tmp_path):
    """Slices of a Gather of channels by constant indices (a permutation with a repeat)
    become Gathers of the sliced indices: a range, a step of 2, a negative step from a
    negative start, an end past the axis; a Slice on H and one of another Gather's output
    by int32 indices also read twice stay correct. Each against the reference kernels."""
    g = G(3)
    x = g.op("Relu", [g.conv("X", 3, 24, 3)])
    perm = [5, 3, 23, 0, 7, 7, 12, 1, 2, 4, 6, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    y = g.op("Gather", [x, ints(g, perm)], axis=1)
    outs = [
        g.op("Slice", [y, ints(g, [2]), ints(g, [18]), ints(g, [1])]),
        g.op("Slice", [y, ints(g, [1]), ints(g, [100]), ints(g, [1]), ints(g, [2])]),
        g.op("Slice", [y, ints(g, [-2]), ints(g, [-100]), ints(g, [1]), ints(g, [-3])]),
        g.op("Slice", [y, ints(g, [1]), ints(g, [7]), ints(g, [2])]),
    ]
    k = g.name("i")
    g.inits.append(numpy_helper.from_array(np.array([4, 0, 9, 9, 1, 2, 3, 5], np.int32), k))
    y2 = g.op("Gather", [x, k], axis=1)
    outs.append(g.op("Slice", [y2, ints(g, [0]), ints(g, [8]), ints(g, [1])]))
    outs.append(g.op("Relu", [y2]))
    outs = [g.conv(o, c, 8, 1) for o, c in zip(outs, [16, 12, 8, 24, 8, 8])]
    run_case(kiln_bin, tmp_path, g, outs, min_blocked=1, max_reorders=8)
    proc = subprocess.run([kiln_bin, "inspect", str(tmp_path / "m.onnx"), "--optimized"],
                          capture_output=True, text=True, env=isa_env(""), timeout=120)
    assert "Slice of Gather as Gather x4" in proc.stdout, proc.stdout


def test_shuffle_three_groups_is_graph_output(kiln_bin, tmp_path):
    """A shuffle of 3 groups whose result is also a graph output (a plain twin)."""
    g = G(3)
    x = g.conv("X", 3, 48, 3)
    y = shuffle(g, x, 48, 3, 10, 10)
    z = g.conv(g.conv(y, 48, 32, 1), 32, 16, 1)
    run_case(kiln_bin, tmp_path, g, [y, z], min_blocked=3, max_reorders=2)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([5], [29], [1], [1]),                          # channels off the block
    ([1, 0], [9, 10], [2, 3], [2, 1]),              # rows with a step
    ([-1, 3], [-100, 40], [3, 1], [-2, 2]),         # columns backwards, every other channel
    ([0, 0, 2], [16, 7, 10], [1, 2, 3], [1, 1, 1]),  # a whole block, a crop
])
def test_slice_between_convs(kiln_bin, tmp_path, starts, ends, axes, steps):
    g = G(3)
    x = pool(g, g.conv("X", 3, 40, 3))
    y = g.op("Slice", [x, ints(g, starts), ints(g, ends), ints(g, axes), ints(g, steps)])
    c = len(range(40)[slice(*[(s, e, st) for s, e, a, st in zip(starts, ends, axes, steps)
                               if a == 1][0])]) if 1 in axes else 40
    z = g.conv(g.conv(y, c, 32, 3), 32, 16, 1)
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=4, max_reorders=1)


def test_gather_channels_between_convs(kiln_bin, tmp_path):
    """A Gather of channels (repeats, negative indices, fewer than C) stays blocked."""
    g = G(3)
    x = g.conv("X", 3, 40, 3)
    idx = [39, 0, 0, -1, 17, 16, 5, -40, 22, 31, 8, 9, 10, 11, 12, 13, 14, 15, 1, 2, 3]
    y = g.op("Gather", [x, ints(g, idx)], axis=1)
    z = g.conv(g.conv(y, len(idx), 32, 3), 32, 16, 1)
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=3, max_reorders=1)


@pytest.mark.parametrize("axis", [0, 2, -1])
def test_concat_spatial_axes(kiln_bin, tmp_path, axis):
    g = G(3)
    a = g.conv("X", 3, 24, 3)
    b = g.conv("X", 3, 24, 1)
    y = g.op("Concat", [a, b], axis=axis)
    z = g.conv(g.conv(y, 24, 16, 3), 16, 16, 1)
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=4, max_reorders=1)


def test_concat_of_upsampled_and_plain(kiln_bin, tmp_path):
    """The detection-network neck: Concat(Resize(conv), graph input) into a 1x1
    convolution. The Resize and the Concat stay blocked; one reorder brings the plain
    graph input into the Concat's layout, one takes the output out of it."""
    g = G(3, 8, 8)
    x2 = g.input("X2", (2, 32, 16, 16))
    a = g.conv("X", 3, 32, 3)
    up = g.op("Resize", [a, "", g.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    y = g.op("Concat", [up, x2], axis=1)
    z = g.conv(g.conv(y, 64, 32, 1), 32, 16, 1)
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=1, max_reorders=2)


def test_follower_output_is_graph_output(kiln_bin, tmp_path):
    """A blocked pool and Relu whose value is also a graph output (a plain twin is
    written by a reorder), and a Flatten (no blocked kernel) after the chain."""
    g = G(3)
    a = g.op("Relu", [pool(g, g.conv("X", 3, 32, 3))])
    z = g.conv(a, 32, 32, 3)
    r = g.op("Add", [z, a])
    f = g.op("Flatten", [g.conv(r, 32, 16, 1)])
    # blocked: conv, pool, Relu (twin), conv z with the Add fused as its Sum;
    # reorders: the Relu's plain output, and the input of the last conv (plain output)
    run_case(kiln_bin, tmp_path, g, [a, f], min_blocked=4, max_reorders=2)


@pytest.mark.parametrize("c,fill", [(32, 0.0), (24, 1.5)])
def test_pad_before_pool(kiln_bin, tmp_path, c, fill):
    """DenseNet's transition and Inception's pool branch: conv, Pad (H and W),
    AveragePool, conv, all blocked; a fill that is not 0 must not leak into the
    padded channels of the last block (24 channels with blocks of 16)."""
    g = G(3)
    x = g.conv("X", 3, c, 3)
    p = g.op("Pad", [x, ints(g, [0, 0, 1, 0, 0, 0, 2, 1]), g.const(np.float32(fill))])
    a = g.op("AveragePool", [p], kernel_shape=[3, 3], strides=[1, 1])
    z = g.conv(g.conv(g.op("Sigmoid", [a]), c, 32, 1), 32, 16, 1)
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=5, max_reorders=1)


def test_global_pool_reorders_its_output(kiln_bin, tmp_path):
    """A GlobalAveragePool before a Flatten: the reorder goes after the pool (on
    [N, C, 1, 1]) rather than before it (on [N, C, H, W]), as the log says."""
    g = G(3)
    x = g.conv(g.conv("X", 3, 32, 3), 32, 40, 3)
    f = g.op("Flatten", [g.op("GlobalAveragePool", [x])])
    run_case(kiln_bin, tmp_path, g, [f], min_blocked=3, max_reorders=1)
    proc = subprocess.run([kiln_bin, "inspect", str(tmp_path / "m.onnx"), "--optimized"],
                          capture_output=True, text=True, env=isa_env(""), timeout=120)
    assert "reorder after a pool, not before x1" in proc.stdout, proc.stdout


# ------------------------------------------------------------------ Resize and Split


@pytest.mark.parametrize("c,inputs,attrs", [
    (32, ("", "scales", [1, 1, 2, 2]), dict(mode="nearest")),
    (24, ("", "sizes", [2, 24, 15, 7]), dict(mode="linear")),  # 10 -> 15 and 10 -> 7
    (24, ("", "scales", [1, 1, 2, 2]),
     dict(mode="linear", coordinate_transformation_mode="align_corners")),
    (24, ("", "scales", [1, 1, 1.5, 0.5]),
     dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="ceil")),
    (40, ("", "sizes", [2, 40, 13, 21]),
     dict(mode="cubic", coordinate_transformation_mode="pytorch_half_pixel")),
    (16, ("", "scales", [1, 1, 0.5, 0.5]), dict(mode="cubic", exclude_outside=1)),
])
def test_resize_between_convs(kiln_bin, tmp_path, c, inputs, attrs):
    """Resize of H and W stays blocked (simd/resize.c) in every mode and coordinate
    mapping the fast kernel takes, 24 and 40 channels off the block included."""
    g = G(3)
    x = g.conv("X", 3, c, 3)
    roi, kind, vals = inputs
    if kind == "scales":
        args = [x, roi, g.const(np.array(vals, np.float32))]
    else:
        args = [x, roi, "", ints(g, vals)]
    y = g.op("Resize", args, **attrs)
    z = g.conv(g.conv(y, c, 32, 3), 32, 16, 1)
    # blocked: x, y and the middle convolution's output; one reorder, for the output
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=3, max_reorders=1)


def test_resize_crop_and_resize_stays_plain(kiln_bin, tmp_path):
    """tf_crop_and_resize (extrapolated points) has no fast kernel: the Resize reads
    plain data and the outputs still match the reference."""
    g = G(3)
    x = g.conv("X", 3, 16, 3)
    roi = g.const(np.array([0, 0, 0.1, 0.2, 1, 1, 0.9, 1.3], np.float32))
    y = g.op("Resize", [x, roi, g.const(np.array([1, 1, 1.5, 1.5], np.float32))],
             mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
             extrapolation_value=0.5)
    z = g.conv(y, 16, 16, 1)
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=0, max_reorders=2)


@pytest.mark.parametrize("axis,split", [(1, [16, 24]), (1, [24, 16]), (2, [3, 7]),
                                         (-1, [4, 4, 2])])
def test_split_between_convs(kiln_bin, tmp_path, axis, split):
    """A Split along C, H or W becomes Slices that stay blocked; every piece feeds a
    convolution (a piece that starts or ends off the block too). Pieces of fewer
    channels than a block would feed their convolutions plain, as a network's first
    convolution reads its input: not what this case is about."""
    g = G(3)
    x = pool(g, g.conv("X", 3, 40, 3))
    ys = [g.name("split") for _ in split]
    g.nodes.append(helper.make_node("Split", [x, ints(g, split)], ys, name=g.name("s"),
                                    axis=axis))
    outs = [g.conv(y, split[i] if axis == 1 else 40, 16, 1) for i, y in enumerate(ys)]
    run_case(kiln_bin, tmp_path, g, outs, min_blocked=2 + len(split), max_reorders=len(split))


def test_split_plain_any_rank(kiln_bin, tmp_path):
    """Split of plain tensors (a GRU's gates: rank 3, the last axis; int64 on axis 0)
    runs on the fast memcpy kernel, not the reference one, and matches it."""
    rng = np.random.default_rng(3)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5, 24])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [7, 2])
    outs = [helper.make_tensor_value_info(n, t, None)
            for n, t in (("a", TensorProto.FLOAT), ("b", TensorProto.FLOAT),
                         ("c", TensorProto.FLOAT), ("p", TensorProto.INT64),
                         ("q", TensorProto.INT64))]
    nodes = [helper.make_node("Split", ["x", "s3"], ["a", "b", "c"], axis=-1),
             helper.make_node("Split", ["i", "s2"], ["p", "q"], axis=0)]
    inits = [numpy_helper.from_array(np.array([8, 12, 4], np.int64), "s3"),
             numpy_helper.from_array(np.array([3, 4], np.int64), "s2")]
    model = helper.make_model(helper.make_graph(nodes, "split", [x, i], outs, inits),
                              opset_imports=[helper.make_opsetid("", 14)])
    path = tmp_path / "split.onnx"
    onnx.save(model, str(path))
    feeds = {"x": rng.standard_normal((3, 5, 24)).astype(np.float32),
             "i": rng.integers(-9, 9, (7, 2)).astype(np.int64)}
    got = predict(kiln_bin, path, feeds, tmp_path / "fast", isa_env(""))
    want = {"a": feeds["x"][..., :8], "b": feeds["x"][..., 8:20], "c": feeds["x"][..., 20:],
            "p": feeds["i"][:3], "q": feeds["i"][3:]}
    for name, w in want.items():
        np.testing.assert_array_equal(np.load(got / f"{name}.npy"), w)
    r = subprocess.run([kiln_bin, "bench", str(path), "--iterations", "3", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["reference_share"] == 0.0, r.stdout


@pytest.mark.parametrize("attrs,scales", [
    (dict(mode="nearest"), [1, 1, 2, 3]),
    # tf_half_pixel_for_nn moves N and C too when they are resized (by 1): axes leaves
    # them out (with them in, the fast kernel declines and the reference runs)
    (dict(mode="nearest", nearest_mode="round_prefer_ceil", axes=[2, 3],
          coordinate_transformation_mode="tf_half_pixel_for_nn"), [0.6, 1.7]),
    (dict(mode="linear"), [1, 1, 1.8, 0.4]),
    (dict(mode="linear", coordinate_transformation_mode="half_pixel_symmetric"), [1, 1, 2, 2]),
    (dict(mode="cubic", cubic_coeff_a=-0.5), [1, 1, 1.3, 2.2]),
])
def test_resize_plain(kiln_bin, tmp_path, attrs, scales):
    """Resize of a plain graph input (no convolution around it) runs on the fast kernel
    (reference share 0) and matches the reference kernel, at sizes off every vector width."""
    rng = np.random.default_rng(5)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 9, 11])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    inits = [numpy_helper.from_array(np.array(scales, np.float32), "scales")]
    model = helper.make_model(helper.make_graph([node], "resize", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 19)])
    path = tmp_path / "resize.onnx"
    onnx.save(model, str(path))
    feeds = {"x": rng.standard_normal((2, 5, 9, 11)).astype(np.float32)}
    got = np.load(predict(kiln_bin, path, feeds, tmp_path / "fast", isa_env("")) / "y.npy")
    ref = np.load(predict(kiln_bin, path, feeds, tmp_path / "ref", isa_env(""),
                          reference=True) / "y.npy")
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    r = subprocess.run([kiln_bin, "bench", str(path), "--iterations", "3", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["reference_share"] == 0.0, r.stdout


def group_norm(g, x, c, groups, affine=True, inner=False):
    """torch.nn.GroupNorm as PyTorch exports it: Reshape [0, G, -1], InstanceNormalization
    (ones and zeros of G, or other values when inner), Reshape back to Shape(x), then the
    per-channel affine Mul and Add ([C, 1, 1], as the exporter writes them)."""
    r = g.op("Reshape", [x, ints(g, [0, groups, -1])])
    s = RNG.uniform(0.5, 1.5, groups) if inner else np.ones(groups)
    b = RNG.standard_normal(groups) * 0.2 if inner else np.zeros(groups)
    i = g.op("InstanceNormalization", [r, g.const(s), g.const(b)], epsilon=1e-5)
    z = g.op("Reshape", [i, g.op("Shape", [x])])
    if affine:
        z = g.op("Mul", [z, g.const(RNG.uniform(0.5, 1.5, (c, 1, 1)))])
        z = g.op("Add", [z, g.const(RNG.standard_normal((c, 1, 1)) * 0.3)])
    return z


def fused_groupnorms(kiln, model, env):
    log = opt_log(kiln, model, env)
    line = next((l for l in log.splitlines() if l.strip().startswith("groupnorm_fusion")), "")
    return sum(int(n) for n in re.findall(r"GroupNormalization(?:\(\+affine\))? x(\d+)", line))


@pytest.mark.parametrize("c,groups,affine,inner", [
    (32, 8, True, False),    # 4 channels a group, inside a block
    (24, 6, True, True),     # padded blocks of 16; the InstanceNormalization's own affine
    (48, 3, False, False),   # 16 channels a group, across blocks of 8
    (20, 4, True, False),    # 5 channels a group: groups straddle blocks
])
def test_group_norm_between_convs(kiln_bin, tmp_path, c, groups, affine, inner):
    """GroupNorm then SiLU between convolutions, as in diffusion UNets (groupnorm_fusion: one
    KilnGroupNorm node): the normalization reads and writes the blocked values (before the
    fusion its Reshapes made them plain, with reorders around each)."""
    g = G(3)
    x = g.conv("X", 3, c, 3)
    n = group_norm(g, x, c, groups, affine, inner)
    s = g.op("Mul", [n, g.op("Sigmoid", [n])])
    z = g.conv(g.conv(s, c, 32, 3), 32, 16, 1)
    model, shapes = tmp_path / "m.onnx", {z: [2, 16, 10, 10]}
    g.save(model, [z], shapes)
    assert fused_groupnorms(kiln_bin, model, isa_env("")) == 1
    # blocked: the convolution's output, the KilnGroupNorm's (the SiLU fused into it), the
    # middle convolution's
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=3, max_reorders=1, shapes=shapes)


def test_group_norm_after_upsampled_concat_symbolic_batch(kiln_bin, tmp_path):
    """A UNet decoder step with a symbolic batch: Concat(Resize(conv), conv) into a GroupNorm.
    Resize by constant scales keeps its channels known with an unknown batch (shape
    inference), so the GroupNorm fuses and the chain stays blocked."""
    g = G(3, 8, 8)
    g.inputs[0] = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 3, 8, 8])
    a = g.conv("X", 3, 32, 3)
    up = g.op("Resize", [a, "", g.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    b = g.conv(g.op("Resize", ["X", "", g.const(np.array([1, 1, 2, 2], np.float32))],
                    mode="nearest"), 3, 16, 3)
    y = g.op("Concat", [up, b], axis=1)
    n = group_norm(g, y, 48, 8)
    z = g.conv(g.conv(n, 48, 32, 3), 32, 16, 1)
    model, shapes = tmp_path / "m.onnx", {z: ["batch", 16, 16, 16]}
    g.save(model, [z], shapes)
    assert fused_groupnorms(kiln_bin, model, isa_env("")) == 1
    run_case(kiln_bin, tmp_path, g, [z], min_blocked=5, max_reorders=2, shapes=shapes)


def test_group_norm_pattern_variants_not_fused(kiln_bin, tmp_path):
    """Near misses stay as imported and still agree with the reference: the normalized value
    read twice (by the Reshape back and by a graph output), and a Reshape back to another
    shape."""
    g = G(3)
    x = g.conv("X", 3, 32, 3)
    r = g.op("Reshape", [x, ints(g, [0, 8, -1])])
    i = g.op("InstanceNormalization", [r, g.const(np.ones(8)), g.const(np.zeros(8))])
    z = g.op("Reshape", [i, g.op("Shape", [x])])
    r2 = g.op("Reshape", [x, ints(g, [0, 4, -1])])
    i2 = g.op("InstanceNormalization", [r2, g.const(np.ones(4)), g.const(np.zeros(4))])
    z2 = g.op("Reshape", [i2, ints(g, [2, 32, 100])])
    model = tmp_path / "m.onnx"
    g.save(model, [z, i, z2], {z: [2, 32, 10, 10], i: [2, 8, 400], z2: [2, 32, 100]})
    assert fused_groupnorms(kiln_bin, model, isa_env("")) == 0
    env = isa_env("")
    got = predict(kiln_bin, model, g.feeds, tmp_path / "fast", env)
    ref = predict(kiln_bin, model, g.feeds, tmp_path / "ref", env, reference=True)
    for o in (z, i, z2):
        a, b = np.load(got / f"{o}.npy"), np.load(ref / f"{o}.npy")
        assert a.shape == b.shape
        assert float(np.abs(a.astype(np.float64) - b).max()) <= 1e-4 * max(1.0, float(np.abs(b).max()))


@pytest.mark.parametrize("opset", [18, 21])
def test_native_group_normalization_with_silu(kiln_bin, tmp_path, opset):
    """ONNX's own GroupNormalization (opset 18: scale and bias per group; 21: per channel) then
    SiLU between convolutions: one KilnGroupNorm (the activation applied as each block is
    normalized), blocked, equal to the reference. Written by hand: the installed onnx package
    knows opsets up to 17, so there is no checker for these."""
    g = G(3)
    c, groups = 24, 6
    x = g.conv("X", 3, c, 3)
    per = groups if opset < 21 else c
    n = g.op("GroupNormalization", [x, g.const(RNG.uniform(0.5, 1.5, per)),
                                    g.const(RNG.standard_normal(per) * 0.3)],
             num_groups=groups, epsilon=1e-5)
    s = g.op("Mul", [n, g.op("Sigmoid", [n])])
    z = g.conv(g.conv(s, c, 32, 3), 32, 16, 1)
    graph = helper.make_graph(g.nodes, "gn", g.inputs,
                              [helper.make_tensor_value_info(z, TensorProto.FLOAT, [2, 16, 10, 10])],
                              g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    log = opt_log(kiln_bin, path, isa_env(""))
    assert "KilnGroupNorm+SiLU x1" in log, log
    for isa in ("", "avx2"):
        env = isa_env(isa)
        blocked, reorders = layout_counts(kiln_bin, path, env)
        assert blocked >= 3 and reorders <= 1, (isa, blocked, reorders)
        got = predict(kiln_bin, path, g.feeds, tmp_path / f"fast{isa}", env)
        ref = predict(kiln_bin, path, g.feeds, tmp_path / f"ref{isa}", env, reference=True)
        a, b = np.load(got / f"{z}.npy"), np.load(ref / f"{z}.npy")
        assert float(np.abs(a.astype(np.float64) - b).max()) <= 1e-4 * max(1.0, float(np.abs(b).max()))
