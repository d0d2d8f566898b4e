"""test_sparse.py - sparse kernels and pruning through `kiln compile` (docs/COMPRESSION.md).

- A two-layer MLP whose weights are 90% zero (the first unstructured, the second
  in 1x4 blocks), made here with onnx's helper: compiled with `kiln compile`,
  the .kiln's outputs equal numpy's dense fp32 product (and, on VNNI CPUs, numpy's
  emulation of Kiln's dynamic int8) within float tolerance, and the report names
  the layers that run on sparse kernels. KILN_SPARSE=force in the environment
  makes every candidate sparse, so the names are checked deterministically; in
  the default auto mode (timed per layer, either kernel may win on a loaded
  machine) the outputs must still match, and --sparse off names no layer.
- --prune on the bundled digits MLP: the report's pruning counts and its
  accuracy, fp32 and pruned, equal numpy's one-shot per-layer magnitude pruning
  of the same weights evaluated on the held-out digits, and the .kiln computes
  exactly that pruned model.
"""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from test_compile import (BATCH, DIGITS, VNNI, compile_model, digits, gemm_weights,  # noqa: F401
                          kiln_bin, mlp, predict_batched, softmax)

K, H, N = 256, 512, 16


def make_sparse_mlp(path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(7)
    w1 = (rng.standard_normal((K, H)) * 0.1).astype(np.float32)
    w1 *= rng.random((K, H)) >= 0.9
    w2 = (rng.standard_normal((H, N)) * 0.1).astype(np.float32)
    w2 *= np.repeat(rng.random((H // 4, N)) >= 0.9, 4, axis=0)
    b1 = (rng.standard_normal(H) * 0.1).astype(np.float32)
    b2 = (rng.standard_normal(N) * 0.1).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"], name="dense1"),
             helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]),
             helper.make_node("MatMul", ["h", "w2"], ["y0"], name="dense2"),
             helper.make_node("Add", ["y0", "b2"], ["y"])]
    g = helper.make_graph(nodes, "sparse_mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", N])],
                          [numpy_helper.from_array(a, n)
                           for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return [(w1.T.copy(), b1), (w2.T.copy(), b2)]


@pytest.fixture()
def sparse_env():
    old = os.environ.get("KILN_SPARSE")
    yield os.environ
    if old is None:
        os.environ.pop("KILN_SPARSE", None)
    else:
        os.environ["KILN_SPARSE"] = old


def test_sparse_mlp_matches_dense(kiln_bin, tmp_path, sparse_env):
    model = tmp_path / "sparse_mlp.onnx"
    layers = make_sparse_mlp(model)
    assert (layers[0][0] == 0).mean() > 0.88 and (layers[1][0] == 0).mean() > 0.85
    x = np.random.default_rng(1).standard_normal((128, K)).astype(np.float32)
    (tmp_path / "eval").mkdir()
    np.save(tmp_path / "eval" / "x.npy", x)
    want = mlp(x, layers, ["fp32", "fp32"], batched=True)
    modes = [("force", "fp32"), ("auto", "fp32"), ("off", "fp32")]
    if VNNI:
        modes.append(("force", "int8"))
    for env, prec in modes:
        sparse_env.pop("KILN_SPARSE", None)
        extra = ["--sparse", "off"] if env == "off" else []
        if env == "force":
            sparse_env["KILN_SPARSE"] = "force"
        out = tmp_path / f"mlp_{env}_{prec}.kiln"
        r, rep = compile_model(kiln_bin, model, out, "--precision", prec, "--eval",
                               tmp_path / "eval", "--max-drop", "100%", *extra)
        got = predict_batched(kiln_bin, out, "x", x, tmp_path, f"{env}_{prec}")
        sp = rep["sparse"]
        assert sp["mode"] == ("off" if env == "off" else "auto") and sp["prune"] is None
        kernels = {n["node"]: n["kernel"] for n in sp["nodes"]}
        if prec == "int8":
            emu = mlp(x, layers, ["int8", "int8"], batched=True)
            assert np.abs(got - emu).max() < 1e-4 * max(1.0, float(np.abs(emu).max()))
        else:
            assert np.abs(got - want).max() < 1e-4 * max(1.0, float(np.abs(want).max())), env
        if env == "force":
            suffix = "_int8" if prec == "int8" else ""
            assert len(kernels) == 2, sp
            assert all(k.startswith("sparse_") and k.endswith(suffix) for k in kernels.values())
            assert all(("_int8" in k) == (prec == "int8") for k in kernels.values()), kernels
            assert "sparse:" in r.stdout and "on sparse kernels" in r.stdout
            for name in kernels:
                assert name in r.stdout
        elif env == "off":
            assert kernels == {} and "dense kernels only" in r.stdout
        else:
            assert all(k.startswith("sparse_") for k in kernels.values())


def prune_numpy(w_nk, ratio):
    """Per-layer one-shot magnitude pruning as kiln_model_prune does it (w as [N, K];
    ties broken by position in (n, k) order)."""
    flat = np.abs(w_nk).ravel()
    order = np.argsort(flat, kind="stable")
    cut = int(math.floor(ratio * flat.size))
    out = w_nk.copy().ravel()
    out[order[:cut]] = 0
    return out.reshape(w_nk.shape), cut


def test_prune_digits_reports_the_cost(kiln_bin, digits, tmp_path):
    ev, _, labels, x, y = digits
    layers = gemm_weights(DIGITS)
    for ratio in (0.5, 0.9):
        out = tmp_path / f"digits_pruned_{ratio}.kiln"
        r, rep = compile_model(kiln_bin, DIGITS, out, "--precision", "fp32", "--prune", str(ratio),
                               "--eval", ev, "--labels", labels, "--max-drop", "100%")
        pruned, zeroed = [], 0
        for w, b in layers:
            pw, cut = prune_numpy(w, ratio)
            pruned.append((pw, b))
            zeroed += cut
        p = rep["sparse"]["prune"]
        assert p["ratio"] == ratio and p["block"] == 1 and p["scope"] == "per layer"
        assert p["layers"] == len(layers) and p["zeroed"] == zeroed
        assert p["weights"] == sum(w.size for w, _ in layers)
        acc32 = float((softmax(mlp(x, layers, ["fp32"] * 2, batched=False)).argmax(1) == y).mean())
        want = softmax(mlp(x, pruned, ["fp32"] * 2, batched=False))
        accp = float((want.argmax(1) == y).mean())
        assert rep["metric"]["fp32"] == pytest.approx(acc32)
        assert rep["metric"]["compressed"] == pytest.approx(accp)
        got = predict_batched(kiln_bin, out, "pixels", x, tmp_path, f"pruned{ratio}")
        assert np.abs(got - want).max() < 1e-5
        assert "pruned:" in r.stdout
        if ratio == 0.9:  # one-shot 90% costs accuracy, and the report says so
            assert accp < acc32 and rep["metric"]["drop"] > 0


def test_prune_and_sparse_errors(kiln_bin, tmp_path):
    from test_compile import run
    for bad in (["--prune", "0"], ["--prune", "1"], ["--prune", "x"], ["--sparse", "on"],
                ["--prune-block", "3"]):
        r = run([kiln_bin, "compile", DIGITS, "-o", tmp_path / "x.kiln", "--precision", "fp32", *bad])
        assert r.returncode == 2, (bad, r.stderr)
        assert bad[0] in r.stderr and bad[1] in r.stderr


def make_cnn(path):
    """x [batch, 8, 12, 12] -> Conv 3x3 (8->32, pad 1) + Relu -> Conv 1x1 (32->64) + Relu
    -> Conv 1x1 (64->48, bias) -> Conv 1x1 (48->20, no bias, 4 pixels: stride 1 on a
    2x2 average pool) -> Flatten. Dense weights: --prune makes the 1x1 ones sparse."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(11)

    def w(*shape):
        return (rng.standard_normal(shape) * (2.0 / np.prod(shape[1:])) ** 0.5).astype(np.float32)

    inits = {"w0": w(32, 8, 3, 3), "b0": w(32) * 0.1, "w1": w(64, 32, 1, 1), "b1": w(64) * 0.1,
             "w2": w(48, 64, 1, 1), "b2": w(48) * 0.1, "w3": w(20, 48, 1, 1)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv3x3", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], name="pw1"),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="pw2"),
             helper.make_node("AveragePool", ["c2"], ["p2"], kernel_shape=[6, 6], strides=[6, 6]),
             helper.make_node("Conv", ["p2", "w3"], ["c3"], name="pw3"),
             helper.make_node("Flatten", ["c3"], ["y"])]
    g = helper.make_graph(nodes, "sparse_cnn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 80])],
                          [numpy_helper.from_array(a, n) for n, a in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(path))


def test_pruned_cnn_1x1_convs_run_sparse(kiln_bin, tmp_path, sparse_env):
    """--prune 0.9 on a small CNN: its 1x1 convolutions (and only those) are pruned and
    may run on the sparse conv kernel; the .kiln's outputs equal the reference kernels'
    (KILN_FAST=0) on the same pruned model, whichever kernel each layer chose."""
    model = tmp_path / "cnn.onnx"
    make_cnn(model)
    x = np.random.default_rng(3).standard_normal((16, 8, 12, 12)).astype(np.float32)
    (tmp_path / "eval").mkdir()
    np.save(tmp_path / "eval" / "x.npy", x)
    # the reference: the same pruned model compiled and run without fast kernels (so
    # unblocked, on src/kernels/ref)
    sparse_env["KILN_FAST"] = "0"
    ref = tmp_path / "cnn_ref.kiln"
    compile_model(kiln_bin, model, ref, "--precision", "fp32", "--prune", "0.9")
    want = predict_batched(kiln_bin, ref, "x", x, tmp_path, "ref")
    sparse_env.pop("KILN_FAST", None)
    assert want.shape == (16, 80)
    scale = max(1.0, float(np.abs(want).max()))
    modes = [("force", "fp32"), ("auto", "fp32")]
    if VNNI:
        modes.append(("force", "int8"))
    for env, prec in modes:
        sparse_env.pop("KILN_SPARSE", None)
        if env == "force":
            sparse_env["KILN_SPARSE"] = "force"
        out = tmp_path / f"cnn_{env}_{prec}.kiln"
        r, rep = compile_model(kiln_bin, model, out, "--precision", prec, "--prune", "0.9",
                               "--eval", tmp_path / "eval", "--max-drop", "100%")
        p = rep["sparse"]["prune"]
        assert p["layers"] == 3 and p["weights"] == 64 * 32 + 48 * 64 + 20 * 48, p
        kernels = {n["node"]: n["kernel"] for n in rep["sparse"]["nodes"]}
        assert "conv3x3" not in kernels, kernels
        assert all("conv" in k for k in kernels.values()), kernels
        if env == "force":
            assert set(kernels) == {"pw1", "pw2", "pw3"}, kernels
            assert all(k.endswith("_int8") == (prec == "int8") for k in kernels.values()), kernels
            for name in kernels:
                assert name in r.stdout
        got = predict_batched(kiln_bin, out, "x", x, tmp_path, f"{env}_{prec}")
        assert got.shape == want.shape
        # int8 (dynamic quantization of every conv) is checked loosely against fp32
        tol = 5e-2 if prec == "int8" else 1e-4
        assert np.abs(got - want).max() < tol * scale, (env, prec, np.abs(got - want).max())
