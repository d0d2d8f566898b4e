"""Concat in place (src/exec/plan.c): producers write straight into their slice
of a Concat's output, and a Concat whose every input is in place is removed.

Each graph is built with onnx.helper around constant-weight convolutions (so the
layout pass blocks the values between them: nChw16c with AVX-512, nChw8c with
KILN_ISA=avx2), run on the default path and on the reference path (imported
graph, reference kernels, no plans), and the outputs compared within 1e-4 of
their scale. The optimization log of the plan (`kiln inspect --optimized
--json --batch N`) says how many Concat inputs were
written in place, how many Concat steps were removed and how many of the inputs
are strided slices; each case checks those counts against what the rule allows
(an input is in place when its slice is contiguous in the output, 64-byte
aligned, on whole channel blocks, and it is a buffer of its own), so a planner
that placed nothing (and so trivially matched) fails, and one that placed what
it must not (a graph input, an off-block slice) fails too. At batch 2 a channel
slice is two pieces, one image apart: an input is in place there only when its
producer's kernel writes such a slice (today the simd Concat: a Concat inside a
Concat) and the outer Concat is its only reader; the batch-2 counts are checked
as well, and those plans compared with the reference path too.
"""
import json
import re
import subprocess

import numpy as np
import pytest

from cpu_features import AVX512
from test_layout import G, isa_env, kiln_bin, predict  # noqa: F401 (fixture)

onnx = pytest.importorskip("onnx")


class GB(G):
    """G with the batch and spatial size chosen."""

    def __init__(self, c_in, batch=1, h=8, w=8):
        self.nodes, self.inits, self.inputs, self.n = [], [], [], 0
        self.feeds = {}
        self.input("X", (batch, c_in, h, w))


# the ISA the layout pass blocks for by default here: 16-channel blocks need AVX-512
MACHINE_ISA = "" if AVX512 else "avx2"


def concat_counts(kiln, model, env, batch=1):
    """(inputs in place, Concat inputs, steps removed, strided) of the plan's log line."""
    proc = subprocess.run([kiln, "inspect", str(model), "--optimized", "--json",
                           "--batch", str(batch)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    log = json.loads(proc.stdout)["signatures"][0]["optimization"]["log"]
    line = next((l for l in log.splitlines() if "concat in place:" in l), "")
    m = re.search(r": (\d+) of (\d+) Concat inputs written in place .*, (\d+) Concat steps removed"
                  r", (\d+) inputs strided", line)
    assert m, f"no concat line in the log:\n{log}"
    return tuple(int(x) for x in m.groups())


def compare(kiln, tmp_path, g, outputs, env, tag):
    got = predict(kiln, tmp_path / "m.onnx", g.feeds, tmp_path / f"fast{tag}", env)
    ref = predict(kiln, tmp_path / "m.onnx", g.feeds, tmp_path / f"ref{tag}", env, reference=True)
    for o in outputs:
        a, b = np.load(got / f"{o}.npy"), np.load(ref / f"{o}.npy")
        assert a.shape == b.shape
        scale = max(1.0, float(np.abs(b).max()))
        err = float(np.abs(a.astype(np.float64) - b).max())
        assert err <= 1e-4 * scale, f"{o} ({tag}): error {err:.3g}"


def run_case(kiln, tmp_path, build, expect, expect2=None):
    """build(batch) -> (G, outputs); expect(isa) -> (in place, inputs, removed) at batch 1;
    expect2(isa) -> (in place, inputs, removed, strided) at batch 2 (default: only the
    inputs counted, nothing in place)."""
    for isa in ("", "avx2"):
        env = isa_env(isa)
        for batch in (1, 2):
            g, outputs = build(batch)
            g.save(tmp_path / "m.onnx", outputs)
            got = concat_counts(kiln, tmp_path / "m.onnx", env, batch)
            if batch == 1:
                want = expect(isa or MACHINE_ISA) + (0,)
            elif expect2:
                want = expect2(isa or MACHINE_ISA)
            else:
                want = (0, got[1], 0, 0)
            assert got == want, f"isa {isa or 'default'}, batch {batch}"
            compare(kiln, tmp_path, g, outputs, env, f"{isa}{batch}")


def dense_block(g, x, c0, growth, layers):
    """torchvision's DenseNet block: layer i reads Concat(all features so far)."""
    feats, c = [x], c0
    for _ in range(layers):
        cat = feats[0] if len(feats) == 1 else g.op("Concat", feats, axis=1)
        h = g.op("Relu", [g.conv(g.op("Relu", [cat]), c, 4 * growth, 1)])
        feats.append(g.conv(h, 4 * growth, growth, 3))
        c += growth
    return g.op("Concat", feats, axis=1), c


def test_dense_chain(kiln_bin, tmp_path):
    """Two dense blocks with a transition: every Concat's inputs are written in place by
    their convolutions (the growing Concats become views of the block's last one), so
    no Concat step is left."""
    def build(batch):
        g = GB(3, batch)
        x = g.op("MaxPool", [g.conv("X", 3, 16, 3)], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        y, c = dense_block(g, x, 16, 16, 3)
        t = g.op("AveragePool", [g.conv(g.op("Relu", [y]), c, 32, 1)], kernel_shape=[2, 2],
                 strides=[2, 2])
        z, c = dense_block(g, t, 32, 16, 3)
        return g, [g.conv(g.op("Relu", [z]), c, 8, 1)]
    # per block: Concats of 2, 3 and 4 features: 9 inputs, all in place, 3 steps removed
    run_case(kiln_bin, tmp_path, build, lambda isa: (18, 18, 6))


def test_input_also_read_elsewhere(kiln_bin, tmp_path):
    """A Concat input that another node reads after the Concat ran: its slice must
    live on (and not be written over) until that read."""
    def build(batch):
        g = GB(3, batch)
        a = g.conv("X", 3, 16, 3)
        b = g.conv("X", 3, 16, 1)
        y = g.op("Concat", [a, b], axis=1)
        z = g.conv(g.op("Relu", [y]), 32, 16, 3)
        w = g.op("Add", [g.op("Relu", [a]), z])  # a read again, after the Concat
        return g, [g.conv(w, 16, 8, 1)]
    run_case(kiln_bin, tmp_path, build, lambda isa: (2, 2, 1))


def test_graph_input_and_computed(kiln_bin, tmp_path):
    """Concat(X, Sigmoid(X)) in plain layout: the graph input is the caller's and is
    copied; Sigmoid writes its slice in place (after X's 16 channels of 8x8 floats:
    4 KiB, aligned), and the Concat step stays to copy X only."""
    def build(batch):
        g = GB(16, batch)
        y = g.op("Concat", ["X", g.op("Sigmoid", ["X"])], axis=1)
        return g, [g.op("Mul", [y, y])]
    run_case(kiln_bin, tmp_path, build, lambda isa: (1, 2, 0))


def test_graph_input_reordered(kiln_bin, tmp_path):
    """Concat(X, conv(X)) between convolutions: the layout pass reorders X into the
    blocked layout, and that reorder (a step of the plan) writes its slice in place
    like the convolution: nothing is left to copy."""
    def build(batch):
        g = GB(16, batch)
        y = g.op("Concat", ["X", g.conv("X", 16, 16, 3)], axis=1)
        return g, [g.conv(y, 32, 8, 3)]
    run_case(kiln_bin, tmp_path, build, lambda isa: (2, 2, 1))


def test_concat_of_concat(kiln_bin, tmp_path):
    """Concat(Concat(a, b), c): the inner output is a slice of the outer one, and a
    and b slices of that: nothing is copied."""
    def build(batch):
        g = GB(3, batch)
        a, b, c = (g.conv("X", 3, 16, k) for k in (1, 3, 5))
        inner = g.op("Concat", [a, b], axis=1)
        outer = g.op("Concat", [inner, c], axis=1)
        return g, [g.conv(outer, 48, 8, 1)]
    # batch 2: the inner Concat (the simd kernel) writes its rows one outer row apart;
    # a and b (convolutions: oneDNN has no fast strided destination) are copied into it
    run_case(kiln_bin, tmp_path, build, lambda isa: (4, 4, 2), lambda isa: (1, 4, 0, 1))


@pytest.mark.parametrize("c1,c2", [(32, 24), (24, 16)])
def test_blocked_offsets(kiln_bin, tmp_path, c1, c2):
    """Channel offsets on and off the blocks. 32 + 24: both in place (the last input's
    padding is the output's). 24 + 16 with blocks of 16: the first input does not end
    on a block and the second does not start on one, so both are copied (lane by lane);
    with blocks of 8 (AVX2) both are whole blocks and in place."""
    def build(batch):
        g = GB(3, batch)
        a = g.conv("X", 3, c1, 3)
        b = g.conv("X", 3, c2, 1)
        y = g.op("Concat", [a, b], axis=1)
        return g, [g.conv(g.conv(y, c1 + c2, 16, 3), 16, 8, 1)]

    def expect(isa):
        if c1 % 16 == 0 or isa == "avx2":
            return (2, 2, 1)
        return (0, 2, 0)
    run_case(kiln_bin, tmp_path, build, expect)


def test_output_and_axis0(kiln_bin, tmp_path):
    """Plain layout: a Concat that is a graph output (its slices are in the caller's
    tensor), an input that is itself a graph output (copied: it is handed to the
    caller), and a Concat on axis 0 (contiguous at every batch)."""
    def build(batch):
        g = GB(16, batch)
        a = g.op("Sigmoid", ["X"])
        b = g.op("Tanh", ["X"])
        c = g.op("Relu", ["X"])
        out = g.op("Concat", [a, b], axis=1)
        stacked = g.op("Concat", [g.op("Neg", [a]), c], axis=0)
        return g, [out, g.op("Mul", [stacked, stacked]), c]
    # out: a and b in place; stacked: Neg(a) in place, c (a graph output) copied; at batch
    # 2 only the axis-0 Concat still is (Sigmoid and Tanh do not write strided slices)
    run_case(kiln_bin, tmp_path, build, lambda isa: (3, 4, 1), lambda isa: (1, 4, 0, 0))


def test_input_in_two_concats(kiln_bin, tmp_path):
    """Concat(a, b) and Concat(b, a): a value has one place, so the later Concat gets
    both inputs in place and the earlier one copies both (from their slices of the
    later output, which must not have been written over in between)."""
    def build(batch):
        g = GB(3, batch)
        a = g.conv("X", 3, 16, 3)
        b = g.conv("X", 3, 16, 1)
        y1 = g.conv(g.op("Concat", [a, b], axis=1), 32, 16, 3)
        y2 = g.conv(g.op("Concat", [b, a], axis=1), 32, 16, 1)
        return g, [g.conv(g.op("Add", [y1, y2]), 16, 8, 1)]
    run_case(kiln_bin, tmp_path, build, lambda isa: (2, 4, 1))


def test_nested_plain_strided(kiln_bin, tmp_path):
    """Plain layout, batch 2: Concat(Relu(X), Concat(Sigmoid(X), Tanh(X))). The inner
    Concat's slice starts after Relu's 16 channels of 8x8 floats (4 KiB per image:
    aligned), so it writes its rows straight into the outer output, one outer row
    apart, and the elementwise producers are copied (at batch 1 all are in place)."""
    def build(batch):
        g = GB(16, batch)
        inner = g.op("Concat", [g.op("Sigmoid", ["X"]), g.op("Tanh", ["X"])], axis=1)
        y = g.op("Concat", [g.op("Relu", ["X"]), inner], axis=1)
        return g, [g.op("Mul", [y, y])]
    run_case(kiln_bin, tmp_path, build, lambda isa: (4, 4, 2), lambda isa: (1, 4, 0, 1))


def test_nested_second_reader(kiln_bin, tmp_path):
    """The inner Concat's output is read again by a convolution: at batch 2 that reader
    wants a dense tensor, so the inner Concat keeps a buffer of its own and the outer
    one copies it (at batch 1 the slice is contiguous and every reader can share it)."""
    def build(batch):
        g = GB(3, batch)
        a, b, c = (g.conv("X", 3, 16, k) for k in (1, 3, 5))
        inner = g.op("Concat", [a, b], axis=1)
        outer = g.op("Concat", [inner, c], axis=1)
        return g, [g.op("Add", [g.conv(outer, 48, 8, 1), g.conv(inner, 32, 8, 3)])]
    run_case(kiln_bin, tmp_path, build, lambda isa: (4, 4, 2))


@pytest.mark.parametrize("c_first", [8, 16])
def test_nested_blocked_offsets(kiln_bin, tmp_path, c_first):
    """Blocked, batch 2: Concat(conv(8 or 16 channels), Concat(a, b)). After 16 channels
    the inner Concat starts on a block and is placed; after 8 it does not start on a
    block of 16 (copied, lane by lane, by the outer Concat) but does on a block of 8
    (AVX2: placed)."""
    def build(batch):
        g = GB(3, batch)
        first = g.conv("X", 3, c_first, 3)
        inner = g.op("Concat", [g.conv("X", 3, 16, 1), g.conv("X", 3, 16, 3)], axis=1)
        y = g.op("Concat", [first, inner], axis=1)
        return g, [g.conv(y, c_first + 32, 8, 1)]

    def expect2(isa):
        return (1, 4, 0, 1) if c_first % 16 == 0 or isa == "avx2" else (0, 4, 0, 0)

    def expect1(isa):
        return (4, 4, 2) if c_first % 16 == 0 or isa == "avx2" else (2, 4, 1)
    run_case(kiln_bin, tmp_path, build, expect1, expect2)


def test_strided_bit_identical(kiln_bin, tmp_path):
    """A strided placement moves the same bytes as the copy it replaces: the output
    of the plan that places the inner Concat (batch 2) is bit-identical to that of
    the same graph with the inner Concat also a graph output (which keeps it copied)."""
    g = GB(3, 2)
    a, b, c = (g.conv("X", 3, 16, k) for k in (1, 3, 5))
    inner = g.op("Concat", [a, b], axis=1)
    y = g.conv(g.op("Concat", [c, inner], axis=1), 48, 8, 1)
    for isa in ("", "avx2"):
        env = isa_env(isa)
        outs = {}
        for extra in (False, True):
            g.save(tmp_path / "m.onnx", [y, inner] if extra else [y])
            counts = concat_counts(kiln_bin, tmp_path / "m.onnx", env, 2)
            assert counts[3] == (0 if extra else 1), counts
            got = predict(kiln_bin, tmp_path / "m.onnx", g.feeds,
                          tmp_path / f"bit{isa}{extra}", env)
            outs[extra] = np.load(got / f"{y}.npy")
        assert np.array_equal(outs[False], outs[True]), f"isa {isa or 'default'}"


def test_inspect_batch_option(kiln_bin, tmp_path):
    """`kiln inspect --optimized --batch N` plans for batch N (the concat line names the
    shape planned for); a batch that is not a positive integer is a usage error."""
    g = GB(3, 1)
    y = g.op("Concat", [g.conv("X", 3, 16, 1), g.conv("X", 3, 16, 3)], axis=1)
    g.save(tmp_path / "m.onnx", [g.conv(y, 32, 8, 1)])
    proc = subprocess.run([kiln_bin, "inspect", str(tmp_path / "m.onnx"), "--optimized",
                           "--batch", "3"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "concat in place: plan for [3,3,8,8]: 0 of 2" in proc.stdout
    assert "plan (batch 3):" in proc.stdout
    for bad in ("0", "x", "-2"):
        proc = subprocess.run([kiln_bin, "inspect", str(tmp_path / "m.onnx"), "--optimized",
                               "--batch", bad], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "--batch" in proc.stderr, (bad, proc.stderr)
