"""Concat in place (src/exec/plan.c): producers write straight into their slice
of a Concat's output, and a Concat whose every input is in place is removed.

Each graph is built with onnx.helper around constant-weight convolutions (so the
layout pass blocks the values between them: nChw16c with AVX-512, nChw8c with
KILN_ISA=avx2), run on the default path and on the reference path (imported
graph, reference kernels, no plans), and the outputs compared within 1e-4 of
their scale. The optimization log of the batch-1 plan (`kiln inspect --optimized
--json`) says how many Concat inputs were written in place and how many Concat
steps were removed; each case checks those counts against what the rule allows
(an input is in place when its slice is contiguous in the output, 64-byte
aligned, on whole channel blocks, and it is a buffer of its own), so a planner
that placed nothing (and so trivially matched) fails, and one that placed what
it must not (a graph input, an off-block slice) fails too. Batch 2 runs (whose
channel slices are not contiguous: those plans copy, but a Concat on axis 0 is
still in place) are compared with the reference path too.
"""
import json
import re
import subprocess

import numpy as np
import pytest

from test_layout import G, isa_env, kiln_bin, predict  # noqa: F401 (fixture)

onnx = pytest.importorskip("onnx")


class GB(G):
    """G with the batch and spatial size chosen."""

    def __init__(self, c_in, batch=1, h=8, w=8):
        self.nodes, self.inits, self.inputs, self.n = [], [], [], 0
        self.feeds = {}
        self.input("X", (batch, c_in, h, w))


def concat_counts(kiln, model, env):
    """(inputs in place, Concat inputs, steps removed) of the batch-1 plan's log line."""
    proc = subprocess.run([kiln, "inspect", str(model), "--optimized", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    log = json.loads(proc.stdout)["signatures"][0]["optimization"]["log"]
    line = next((l for l in log.splitlines() if "concat in place:" in l), "")
    m = re.search(r": (\d+) of (\d+) Concat inputs written in place .*, (\d+) Concat steps removed",
                  line)
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


def run_case(kiln, tmp_path, build, expect):
    """build(batch) -> (G, outputs); expect(isa) -> (in place, inputs, removed) at batch 1."""
    for isa in ("", "avx2"):
        env = isa_env(isa)
        for batch in (1, 2):
            g, outputs = build(batch)
            g.save(tmp_path / "m.onnx", outputs)
            if batch == 1:
                assert concat_counts(kiln, tmp_path / "m.onnx", env) == expect(isa), \
                    f"isa {isa or 'default'}"
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
    run_case(kiln_bin, tmp_path, build, lambda isa: (4, 4, 2))


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
    # out: a and b in place; stacked: Neg(a) in place, c (a graph output) copied
    run_case(kiln_bin, tmp_path, build, lambda isa: (3, 4, 1))


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
