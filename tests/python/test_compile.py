"""test_compile.py - `kiln compile`: precisions, the auto policy, the accuracy report, the .kiln.

Trained models and real data, all made by scripts in the repository:

- the bundled digits MLP (models/digits, tools/make_digits_model.py) on the held-out
  quarter of scikit-learn's digits;
- a small CNN trained on the same digits and a tabular MLP on scikit-learn's
  breast-cancer data set taking raw features (their scales span 0.001..4000),
  both from tools/make_compression_models.py (seconds).

Checked against independent numpy computations: the report's per-output errors
(top-1 agreement, max/mean absolute and relative error, SQNR) and metric
(accuracy fp32 vs compressed) equal the same quantities computed in numpy from
the fp32 outputs and the written .kiln's outputs (run in the compile's batches
of 64, since dynamic int8 depends on the batch), and those outputs equal a
numpy emulation of Kiln's int8 / bf16 arithmetic; a node's reported SQNR equals
the numpy SQNR of the model with that node alone in int8. Each mode stays
within 1% relative accuracy of fp32, or `auto` reports which node fell back
and why (the tabular model's first layer, whose input int8 cannot represent);
an explicit int8 compile of that model exits non-zero naming the drop and
writes no artifact. Bad data gets errors naming the file and the input.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from quant_models import outlier_cnn
from test_precision import bf16, quant_gemm  # the numpy emulations of the precisions

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "models" / "digits" / "1" / "model.onnx"
SHARED = REPO.parent / "shared" / "testdata"
BATCH = 64  # kiln compile's evaluation batch (KILN_COMPILE_EVAL_BATCH)


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


VNNI = any(f in cpu_flags() for f in (" avx512_vnni", " avx_vnni", " amx_int8"))
AVX512 = " avx512bw" in cpu_flags()


@pytest.fixture(scope="module")
def kiln_bin():
    path = os.path.abspath(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln")))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kiln executable not found at {path}: build it or set KILN_BIN")
    return path


def run(args, timeout=300):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout)


def compile_model(kiln_bin, model, out, *extra, ok=True):
    report = Path(str(out) + ".json")
    r = run([kiln_bin, "compile", model, "-o", out, "--report", report, "--runs", "3",
             "--batch-sizes", "1,8", *extra])
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    return r, (json.loads(report.read_text()) if report.exists() else None)


def predict_batched(kiln_bin, model, name, x, tmp_path, tag):
    """Run model on x in batches of 64 (as kiln compile evaluates), concatenated."""
    outs = []
    for i in range(0, len(x), BATCH):
        inp = tmp_path / f"{tag}_{i}.npy"
        np.save(inp, x[i:i + BATCH])
        od = tmp_path / f"{tag}_out_{i}"
        r = run([kiln_bin, "predict", model, "--input", f"{name}={inp}", "--output-dir", od])
        assert r.returncode == 0, r.stderr
        files = sorted(od.glob("*.npy"))
        assert len(files) == 1
        outs.append(np.load(files[0]))
    return np.concatenate(outs)


def stats(b, c):
    """The report's per-output quantities, in numpy (definitions: src/cli/compile.h)."""
    b = b.astype(np.float64)
    c = c.astype(np.float64)
    d = np.abs(c - b)
    rel = d / np.maximum(np.abs(b), 1e-6)
    noise = (d ** 2).sum()
    return {
        "top1_agreement": float((b.argmax(1) == c.argmax(1)).mean()),
        "max_abs_error": float(d.max()), "mean_abs_error": float(d.mean()),
        "max_rel_error": float(rel.max()), "mean_rel_error": float(rel.mean()),
        "sqnr_db": None if noise == 0 else float(10 * np.log10((b ** 2).sum() / noise)),
    }


def check_output_stats(reported, b, c):
    want = stats(b, c)
    for k, v in want.items():
        if v is None:
            assert reported[k] is None, (k, reported[k])
        else:
            assert reported[k] == pytest.approx(v, rel=1e-4, abs=1e-9), (k, reported[k], v)


def gemm(a, w, b, mode):
    if mode == "int8":
        return quant_gemm(a, w, b)
    if mode == "bf16":
        return bf16(a) @ bf16(w).T + b
    return a @ w.T + b


def gemm_weights(path, names=False):
    """(W [N,K], b) of every Gemm of an ONNX MLP, in order (and their node names)."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(str(path))
    init = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in m.graph.initializer}
    out = []
    for n in m.graph.node:
        if n.op_type != "Gemm":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        w = init[n.input[1]]
        out.append((w if attrs.get("transB", 0) else w.T, init[n.input[2]], n.name))
    return out if names else [(w, b) for w, b, _ in out]


def mlp(x, layers, modes, batched):
    """An MLP of Gemm -> Relu ... -> Gemm in numpy, each layer in its mode."""
    def one(xb):
        h = xb
        for i, ((w, b), mode) in enumerate(zip(layers, modes)):
            h = gemm(h, w, b, mode)
            if i + 1 < len(layers):
                h = np.maximum(h, 0)
        return h
    if not batched:
        return one(x)
    return np.concatenate([one(x[i:i + BATCH]) for i in range(0, len(x), BATCH)])


def softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """(folder with eval pixels.npy, folder with calibration pixels.npy, labels.npy path, x, y)."""
    sk = pytest.importorskip("sklearn.datasets")
    from sklearn.model_selection import train_test_split
    d = sk.load_digits()
    x = d.data.astype(np.float32)
    y = d.target.astype(np.int64)
    x_train, x_test, _, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    root = tmp_path_factory.mktemp("digits_data")
    (root / "eval").mkdir()
    (root / "cal").mkdir()
    np.save(root / "eval" / "pixels.npy", x_test)
    np.save(root / "cal" / "pixels.npy", x_train[:200])
    np.save(root / "labels.npy", y_test)
    return root / "eval", root / "cal", root / "labels.npy", x_test, y_test


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    out = tmp_path_factory.mktemp("compression_models")
    r = run(["/usr/bin/python3", REPO / "tools" / "make_compression_models.py", "--out", out],
            timeout=600)
    assert r.returncode == 0, r.stderr
    for model, name in (("digits", "image"), ("cancer", "features")):
        for part in ("test", "cal"):
            (out / f"{model}_{part}").mkdir()
            np.save(out / f"{model}_{part}" / f"{name}.npy", np.load(out / f"{model}_{part}_x.npy"))
    return out


@pytest.mark.skipif(not VNNI, reason="no VNNI/AMX on this CPU: int8 nodes stay fp32")
def test_digits_mlp_every_mode(kiln_bin, digits, tmp_path):
    ev, cal, labels, x, y = digits
    fp32 = predict_batched(kiln_bin, DIGITS, "pixels", x, tmp_path, "fp32")
    layers = gemm_weights(DIGITS)
    acc32 = float((fp32.argmax(1) == y).mean())
    assert acc32 > 0.9
    for mode in ("fp32", "bf16", "int8", "auto"):
        out = tmp_path / f"digits_{mode}.kiln"
        _, rep = compile_model(kiln_bin, DIGITS, out, "--precision", mode, "--calibration", cal,
                               "--eval", ev, "--labels", labels)
        assert rep["passed"] is True and rep["precision_asked"] == mode
        assert rep["metric"]["name"] == "accuracy"
        assert rep["metric"]["fp32"] == pytest.approx(acc32)
        got = predict_batched(kiln_bin, out, "pixels", x, tmp_path, mode)
        # the report describes exactly what the written artifact computes
        check_output_stats(rep["outputs"][0], fp32, got)
        acc = float((got.argmax(1) == y).mean())
        assert rep["metric"]["compressed"] == pytest.approx(acc)
        assert acc >= acc32 * 0.99 or any(n["fell_back"] for n in rep["nodes"])
        assert rep["eval"]["samples"] == len(x)
        if mode == "fp32":
            assert rep["outputs"][0]["identical"] is True and rep["nodes"] == []
            continue
        assert rep["calibration"]["samples"] == 200 and rep["calibration"]["method"] == "dynamic"
        assert [n["name"] for n in rep["nodes"]] == ["fc1", "fc2"]
        assert [lat["batch"] for lat in rep["latency"]] == [1, 8]
        assert all(lat["fp32_p50_ms"] > 0 and lat["compressed_p50_ms"] > 0 for lat in rep["latency"])
        eff = "int8" if mode == "auto" else mode
        if (eff == "int8" and not VNNI) or (eff == "bf16" and not AVX512):
            continue
        assert all(n["precision"] == eff for n in rep["nodes"]), rep["nodes"]
        # the artifact's outputs against numpy's emulation of the precision
        want = softmax(mlp(x, layers, [eff, eff], batched=True).astype(np.float64))
        assert np.abs(got - want).max() < 1e-4
        # weights: the products' weights at 1 (int8) or 2 (bf16) bytes, the rest fp32
        w_elems = sum(w.size for w, _ in layers)
        per = {"int8": 1, "bf16": 2}[eff]
        size = rep["size"]
        assert size["compressed_weight_bytes"] == size["fp32_weight_bytes"] - (4 - per) * w_elems
        # each node's SQNR: that node alone in the precision, in numpy
        xc = np.load(cal / "pixels.npy")
        base = softmax(mlp(xc, layers, ["fp32", "fp32"], batched=True).astype(np.float64))
        for i, node in enumerate(("fc1", "fc2")):
            modes = ["fp32", "fp32"]
            modes[i] = eff
            c = softmax(mlp(xc, layers, modes, batched=True).astype(np.float64))
            want_db = 10 * np.log10((base ** 2).sum() / ((c - base) ** 2).sum())
            rep_node = next(n for n in rep["nodes"] if n["name"] == node)
            assert rep_node["sqnr_db"] == pytest.approx(want_db, abs=0.05), node


@pytest.mark.skipif(not VNNI, reason="no VNNI/AMX on this CPU: int8 nodes stay fp32")
def test_tabular_auto_falls_back_and_int8_fails(kiln_bin, trained, tmp_path):
    model = trained / "cancer_mlp.onnx"
    x = np.load(trained / "cancer_test_x.npy")
    y = np.load(trained / "cancer_test_y.npy")
    common = ["--calibration", trained / "cancer_cal", "--eval", trained / "cancer_test",
              "--labels", trained / "cancer_test_y.npy"]
    # explicit int8: the raw features' range defeats per-tensor activation scales
    out = tmp_path / "cancer_int8.kiln"
    r, rep = compile_model(kiln_bin, model, out, "--precision", "int8", *common, ok=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "exceeds --max-drop 1%" in r.stderr and "relative accuracy drop" in r.stderr
    assert not out.exists()
    assert rep["passed"] is False and rep["metric"]["drop"] > 0.01
    # auto: the first layer (lowest SQNR) falls back, the second stays int8
    out = tmp_path / "cancer_auto.kiln"
    r, rep = compile_model(kiln_bin, model, out, "--precision", "auto", *common)
    nodes = {n["name"]: n for n in rep["nodes"]}
    first, second = (n["name"] for n in sorted(rep["nodes"], key=lambda n: n["sqnr_db"]))
    assert nodes[first]["fell_back"] and not nodes[second]["fell_back"]
    assert nodes[second]["precision"] == "int8"
    fb = nodes[first]["precision"]
    assert fb in ("bf16", "fp32")
    assert "lowest of the nodes still in int8" in nodes[first]["reason"]
    assert rep["fallbacks"] == [{"node": first, "precision": fb, "reason": nodes[first]["reason"]}]
    assert first in r.stdout and "1 of 2 nodes fell back" in r.stdout
    named = gemm_weights(model, names=True)
    layers = [(w, b) for w, b, _ in named]
    assert [n["name"] for n in rep["nodes"]] == [name for _, _, name in named]  # graph order
    # the node SQNRs against numpy: each layer alone in int8, on the calibration rows
    cal = np.load(trained / "cancer_cal_x.npy")
    base = mlp(cal, layers, ["fp32", "fp32"], batched=True).astype(np.float64)
    for i, (_, _, name) in enumerate(named):
        modes = ["fp32", "fp32"]
        modes[i] = "int8"
        c = mlp(cal, layers, modes, batched=True).astype(np.float64)
        want_db = 10 * np.log10((base ** 2).sum() / ((c - base) ** 2).sum())
        assert nodes[name]["sqnr_db"] == pytest.approx(want_db, abs=0.05), name
    assert first == named[0][2]  # the layer that takes the raw features
    # the written .kiln keeps the mixed precision: the whole test set in one batch
    inp = tmp_path / "features.npy"
    np.save(inp, x)
    r = run([kiln_bin, "predict", out, "--input", f"features={inp}", "--output-dir",
             tmp_path / "pred"])
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "pred" / "logits.npy")
    want = mlp(x, layers, [fb, "int8"], batched=False)
    assert np.abs(got - want).max() < 1e-4 * max(1.0, np.abs(want).max())
    # and is not what all-int8 or all-fp32 would give
    for other in (["int8", "int8"], ["fp32", "fp32"]):
        assert np.abs(got - mlp(x, layers, other, batched=False)).max() > 1e-3
    acc32 = float((mlp(x, layers, ["fp32", "fp32"], False).argmax(1) == y).mean())
    assert float((got.argmax(1) == y).mean()) >= acc32 * 0.99


def test_cnn_modes_within_one_percent(kiln_bin, trained, tmp_path):
    model = trained / "digits_cnn.onnx"
    x = np.load(trained / "digits_test_x.npy")
    y = np.load(trained / "digits_test_y.npy")
    fp32 = predict_batched(kiln_bin, model, "image", x, tmp_path, "cnn_fp32")
    acc32 = float((fp32.argmax(1) == y).mean())
    assert acc32 > 0.9
    for mode in ("bf16", "int8", "auto"):
        out = tmp_path / f"cnn_{mode}.kiln"
        _, rep = compile_model(kiln_bin, model, out, "--precision", mode, "--calibration",
                               trained / "digits_cal", "--eval", trained / "digits_test",
                               "--labels", trained / "digits_test_y.npy")
        got = predict_batched(kiln_bin, out, "image", x, tmp_path, f"cnn_{mode}")
        check_output_stats(rep["outputs"][0], fp32, got)
        acc = float((got.argmax(1) == y).mean())
        assert rep["metric"]["fp32"] == pytest.approx(acc32)
        assert rep["metric"]["compressed"] == pytest.approx(acc)
        assert acc >= acc32 * 0.99 or rep["fallbacks"], (mode, acc, acc32)
        ops = {n["op"] for n in rep["nodes"]}
        if VNNI or AVX512:
            assert any("Conv" in op for op in ops) and any("MatMul" in op for op in ops), ops


@pytest.mark.skipif(not VNNI, reason="no VNNI/AMX on this CPU: the int8 kernels decline")
def test_cnn_static_int8_every_method(kiln_bin, trained, tmp_path):
    """--precision int8 --calibration DATA --calibration-method M: static int8
    (activation ranges fixed from the calibration data by M). The artifact
    runs its convolutions and products on the int8 kernels, within 1%
    relative accuracy of fp32, and the report names the method."""
    model = trained / "digits_cnn.onnx"
    x = np.load(trained / "digits_test_x.npy")
    y = np.load(trained / "digits_test_y.npy")
    fp32 = predict_batched(kiln_bin, model, "image", x, tmp_path, "st_fp32")
    acc32 = float((fp32.argmax(1) == y).mean())
    for method in ("minmax", "percentile", "entropy"):
        out = tmp_path / f"cnn_static_{method}.kiln"
        _, rep = compile_model(kiln_bin, model, out, "--precision", "int8", "--calibration",
                               trained / "digits_cal", "--calibration-method", method,
                               "--eval", trained / "digits_test",
                               "--labels", trained / "digits_test_y.npy")
        assert rep["calibration"]["method"] == method and rep["calibration"]["samples"] == 200
        got = predict_batched(kiln_bin, out, "image", x, tmp_path, f"st_{method}")
        check_output_stats(rep["outputs"][0], fp32, got)
        acc = float((got.argmax(1) == y).mean())
        assert rep["metric"]["compressed"] == pytest.approx(acc)
        assert acc >= acc32 * 0.99, (method, acc, acc32)
        assert (got.argmax(1) == fp32.argmax(1)).mean() >= 0.98
        r = run([kiln_bin, "inspect", out])
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("dnnl_qlinear_conv") == 2, r.stdout
        assert r.stdout.count("dnnl_qlinear_matmul") == 2, r.stdout
    # the method is for static int8 only
    r, _ = compile_model(kiln_bin, model, tmp_path / "x.kiln", "--precision", "bf16",
                         "--calibration", trained / "digits_cal", "--calibration-method",
                         "minmax", ok=False)
    assert r.returncode == 2 and "static int8" in r.stderr, r.stderr
    r, _ = compile_model(kiln_bin, model, tmp_path / "x.kiln", "--precision", "int8",
                         "--calibration", trained / "digits_cal", "--calibration-method",
                         "kl", ok=False)
    assert r.returncode == 2 and "'kl' is not minmax, percentile or entropy" in r.stderr


@pytest.mark.skipif(not VNNI, reason="no VNNI/AMX on this CPU: int8 nodes stay fp32")
def test_static_int8_sees_constants_through_identity(kiln_bin, trained, tmp_path):
    """PyTorch's exporter writes Identity(initializer) for tensors it deduplicated (the
    all-zero biases of freshly initialized layers, tied weights). The same CNN with every
    weight and bias read through an Identity quantizes the same products and gives the same
    outputs bit for bit as the plain one; `kiln inspect` says the file is static int8, and the
    report's compressed size is the quantized graph's (it said the fp32 size before), and
    the file is as small as the plain one's."""
    import onnx
    from onnx import helper
    model = trained / "digits_cnn.onnx"
    m = onnx.load(str(model))
    inits = {i.name for i in m.graph.initializer}
    ids = []
    for n in m.graph.node:
        if n.op_type in ("Conv", "Gemm", "MatMul"):
            for k in range(1, len(n.input)):
                if n.input[k] in inits:
                    alias = f"{n.input[k]}_alias_{n.name or k}"
                    ids.append(helper.make_node("Identity", [n.input[k]], [alias]))
                    n.input[k] = alias
    assert len(ids) >= 6, len(ids)
    nodes = ids + list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    aliased = tmp_path / "aliased.onnx"
    onnx.save(m, str(aliased))
    x = np.load(trained / "digits_test_x.npy")
    outs, sizes = {}, {}
    for tag, src in (("plain", model), ("aliased", aliased)):
        out = tmp_path / f"{tag}.kiln"
        _, rep = compile_model(kiln_bin, src, out, "--precision", "int8", "--calibration",
                               trained / "digits_cal", "--calibration-method", "minmax",
                               "--eval", trained / "digits_test")
        # the report's size is the quantized graph's: s8 weights, not the fp32 ones
        size = rep["size"]
        sizes[tag] = out.stat().st_size
        assert 0.25 <= size["ratio"] <= 0.30, size
        assert size["compressed_weight_bytes"] < out.stat().st_size
        r = run([kiln_bin, "inspect", out])
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("dnnl_qlinear_conv") == 2, (tag, r.stdout)
        assert r.stdout.count("dnnl_qlinear_matmul") == 2, (tag, r.stdout)
        assert "precision: int8 (static: 4 quantized products" in r.stdout, r.stdout
        outs[tag] = predict_batched(kiln_bin, out, "image", x, tmp_path, tag)
    assert np.array_equal(outs["plain"], outs["aliased"])
    # no packs of a transient graph's weights filed under the aliased file's scalars (it was
    # 119 KB against 15 KB)
    assert sizes["aliased"] <= 1.1 * sizes["plain"], sizes


def test_data_forms_and_bad_data(kiln_bin, digits, tmp_path):
    ev, cal, labels, x, y = digits
    # .npz and JSON-lines of TF Serving predict bodies read the same samples
    np.savez(tmp_path / "eval.npz", pixels=x)
    with open(tmp_path / "eval.jsonl", "w") as f:
        for i in range(0, len(x), 50):
            f.write(json.dumps({"instances": [{"pixels": r.tolist()} for r in x[i:i + 50]]}) + "\n")
    reps = []
    for data in (ev, tmp_path / "eval.npz", tmp_path / "eval.jsonl"):
        _, rep = compile_model(kiln_bin, DIGITS, tmp_path / "d.kiln", "--precision", "bf16",
                               "--eval", data, "--labels", labels)
        reps.append(rep)
        assert rep["eval"]["samples"] == len(x)
    assert reps[0]["metric"] == reps[1]["metric"] == reps[2]["metric"]

    def bad(data, *want, extra=()):
        r, _ = compile_model(kiln_bin, DIGITS, tmp_path / "bad.kiln", "--precision", "int8",
                             "--eval", data, *extra, ok=False)
        assert r.returncode != 0
        for w in want:
            assert w in r.stderr, (w, r.stderr)
        assert not (tmp_path / "bad.kiln").exists()

    def folder(name, arr, fname="pixels.npy"):
        p = tmp_path / name
        p.mkdir()
        np.save(p / fname, arr)
        return p

    bad(folder("wrong_name", x, "image.npy"), "pixels", "wrong_name")
    bad(folder("wrong_dtype", x.astype(np.float64)), "pixels", "float64", "wrong_dtype")
    bad(folder("wrong_shape", x[:, :63]), "pixels", "dimension 1 is 63", "wrong_shape")
    bad(folder("few", x[:5]), "few", "5 samples", "at least 10")
    xn = x.copy()
    xn[17, 3] = np.nan
    bad(folder("nan", xn), "nan", "pixels", "NaN at sample 17")
    bad(ev, "--labels", "12 rows", extra=("--labels", folder("l", y[:12], "y.npy") / "y.npy"))
    with open(tmp_path / "bad.jsonl", "w") as f:
        f.write(json.dumps({"instances": [{"image": [0.0] * 64}]}) + "\n")
    bad(tmp_path / "bad.jsonl", "bad.jsonl")
    bad(tmp_path / "missing", "missing", "does not exist")


@pytest.mark.skipif(not VNNI, reason="no VNNI/AMX on this CPU: auto starts from bf16")
def test_auto_quantizes_unnamed_nodes(kiln_bin, digits, tmp_path):
    """ONNX node names are optional (onnx.helper leaves them empty). Per-node precision is
    keyed by name, so the importer names an unnamed node "<op_type>_<index>" (a suffix when
    a named node holds that name): `auto` must quantize such a model, the names must be the
    same in the report, the sensitivity runs and the .kiln, and the artifact must compute
    numpy's int8 emulation."""
    import onnx
    ev, cal, labels, x, y = digits
    m = onnx.load(str(DIGITS))
    for n in m.graph.node:
        n.name = ""
    m.graph.node[1].name = "Gemm_0"  # the Relu takes the first Gemm's generated name
    src = tmp_path / "unnamed.onnx"
    onnx.save(m, str(src))
    want_names = ["Gemm_0_2", "Gemm_2"]
    out = tmp_path / "unnamed.kiln"
    _, rep = compile_model(kiln_bin, src, out, "--precision", "auto", "--calibration", cal,
                           "--eval", ev, "--labels", labels)
    assert rep["passed"] is True
    assert [n["name"] for n in rep["nodes"]] == want_names, rep["nodes"]
    assert all(n["precision"] == "int8" and not n["fell_back"] for n in rep["nodes"])
    # each node's sensitivity was measured with that node alone in int8, found by its name
    xc = np.load(cal / "pixels.npy")
    layers = gemm_weights(src)
    base = softmax(mlp(xc, layers, ["fp32", "fp32"], batched=True).astype(np.float64))
    for i, node in enumerate(want_names):
        modes = ["fp32", "fp32"]
        modes[i] = "int8"
        c = softmax(mlp(xc, layers, modes, batched=True).astype(np.float64))
        want_db = 10 * np.log10((base ** 2).sum() / ((c - base) ** 2).sum())
        got = next(n for n in rep["nodes"] if n["name"] == node)
        assert got["sqnr_db"] == pytest.approx(want_db, abs=0.05), node
    # the .kiln keeps the names and their precision, and computes int8
    r = run([kiln_bin, "inspect", out])
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("  int8 ")]
    assert sorted(row[-1] for row in rows) == want_names, r.stdout
    got = predict_batched(kiln_bin, out, "pixels", x, tmp_path, "unnamed")
    want = softmax(mlp(x, layers, ["int8", "int8"], batched=True).astype(np.float64))
    assert np.abs(got - want).max() < 1e-4
    # a second import of the same file names the nodes alike: the names key a profile
    r = run([kiln_bin, "bench", src, "--batch", "1", "--iterations", "1", "--profile"])
    assert r.returncode == 0, r.stderr
    prof = r.stdout + r.stderr
    assert all(name in prof for name in want_names + ["Softmax_3"]), prof


def test_usage_errors(kiln_bin, digits, tmp_path):
    ev = digits[0]
    r = run([kiln_bin, "compile", DIGITS, "-o", tmp_path / "x.kiln", "--emit-onnx", "x.onnx"])
    assert r.returncode == 2 and "static int8" in r.stderr  # test_emit_onnx.py has the rest
    r = run([kiln_bin, "compile", DIGITS, "-o", tmp_path / "x.kiln", "--precision", "fp8"])
    assert r.returncode == 2 and "'fp8'" in r.stderr
    r = run([kiln_bin, "compile", DIGITS, "-o", tmp_path / "x.kiln"])  # auto needs data
    assert r.returncode == 2 and "needs data" in r.stderr
    r = run([kiln_bin, "compile", DIGITS, "-o", tmp_path / "x.kiln", "--eval", ev,
             "--max-drop", "lots"])
    assert r.returncode == 2 and "'lots'" in r.stderr
    # without labels the bound is on top-1 disagreement with fp32
    r, rep = compile_model(kiln_bin, DIGITS, tmp_path / "nl.kiln", "--precision", "int8",
                           "--eval", ev)
    assert rep["metric"]["name"] is None
    assert rep["metric"]["drop"] == pytest.approx(1 - rep["outputs"][0]["top1_agreement"])


def test_savedmodel(kiln_bin, tmp_path):
    sm = SHARED / "savedmodels" / "machinelearning-testdata" / "Microsoft.ML.TensorFlow.TestModels" \
        / "mnist_conv_model"
    if not sm.is_dir():
        pytest.skip(f"{sm} is absent (../shared/testdata)")
    rng = np.random.default_rng(0)
    (tmp_path / "d").mkdir()
    x = rng.random((32, 28, 28, 1), dtype=np.float32)
    np.save(tmp_path / "d" / "Features.npy", x)
    out = tmp_path / "mnist.kiln"
    _, rep = compile_model(kiln_bin, sm, out, "--precision", "auto", "--eval", tmp_path / "d",
                           "--max-drop", "10%")
    assert rep["outputs"][0]["name"] == "Prediction"
    got = predict_batched(kiln_bin, out, "Features", x, tmp_path, "sm")
    base = predict_batched(kiln_bin, sm, "Features", x, tmp_path, "sm32")
    check_output_stats(rep["outputs"][0], base, got)


def table_model(path, rows=600, cols=32):
    """ids [N, 5] -> Gather of a [rows, cols] table (e, an output) -> MatMul (y)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(5)
    # rows of very different magnitudes: one scale per row matters
    table = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 3.0, (rows, 1))).astype(np.float32)
    w = (rng.standard_normal((cols, 8)) * 0.2).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
         helper.make_node("MatMul", ["e", "w"], ["y"])],
        "tables",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 5])],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["N", 5, cols]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, 8])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(m, str(path))
    return table


def rows_s8(t):
    """Per-row symmetric s8 rounding in float32, as kiln_model_quantize_tables (src/api/tables.c)."""
    s = np.abs(t).max(axis=1, keepdims=True) / np.float32(127)
    s = np.where(s > 0, s, np.float32(1)).astype(np.float32)
    return (np.clip(np.rint(t / s), -127, 127) * s).astype(np.float32)


def test_int8_embedding_tables_stored_s8(kiln_bin, tmp_path):
    """--precision int8 rounds a Gather's constant table to s8 per row (docs/COMPRESSION.md,
    "Embedding tables"): the compiled model gathers exactly numpy's rounding of the table, the
    report says so, and the file stores a byte an element (--tables f32: the source's floats)."""
    model = tmp_path / "tables.onnx"
    table = table_model(model)
    want = rows_s8(table)
    assert np.any(want != table)  # the rounding changes the table: the check below can fail
    rng = np.random.default_rng(1)
    ids = rng.integers(0, table.shape[0], size=(40, 5)).astype(np.int64)
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "ids.npy", ids)
    files = {}
    for mode in ("s8", "f32"):
        out = tmp_path / f"t_{mode}.kiln"
        extra = ["--tables", "f32"] if mode == "f32" else []
        _, rep = compile_model(kiln_bin, model, out, "--precision", "int8", "--eval", tmp_path / "d",
                               "--max-drop", "100%", *extra)
        assert rep["tables"] == ({"mode": "s8", "tables": 1, "elements": table.size} if mode == "s8"
                                 else {"mode": "f32"}), rep["tables"]
        np.save(tmp_path / "ids1.npy", ids[:8])
        od = tmp_path / f"out_{mode}"
        r = run([kiln_bin, "predict", out, "--input", f"ids={tmp_path / 'ids1.npy'}",
                 "--output-dir", od])
        assert r.returncode == 0, r.stderr
        e = np.load(od / "e.npy")
        ref = want if mode == "s8" else table
        assert np.array_equal(e, ref[ids[:8]]), f"{mode}: max diff {np.abs(e - ref[ids[:8]]).max()}"
        files[mode] = out.stat().st_size
    # s8: a byte an element and a float a row, where f32 takes four bytes an element
    assert files["f32"] - files["s8"] >= 3 * table.size - 4 * table.shape[0] - 4096, files
    # fp32 leaves the tables alone
    _, rep = compile_model(kiln_bin, model, tmp_path / "t_fp32.kiln", "--precision", "fp32",
                           "--eval", tmp_path / "d", "--max-drop", "100%")
    assert rep["tables"] == {"mode": "f32"}


@pytest.mark.skipif(not VNNI, reason="no VNNI/AMX on this CPU: the int8 kernels decline")
def test_auto_tries_static_int8(kiln_bin, trained, tmp_path, monkeypatch):
    """auto with calibration data also builds static int8 of the whole model (MinMax) and keeps
    it where it is within --max-drop and faster than the per-node dynamic mix
    (KILN_AUTO_STATIC=force: within the bound is enough; =0: not tried). A kept static model
    gives exactly the outputs of an explicit `--precision int8 --calibration-method minmax`
    compile, the report says static, and the verdict names the choice."""
    model = trained / "digits_cnn.onnx"
    x = np.load(trained / "digits_test_x.npy")
    common = ["--calibration", trained / "digits_cal", "--eval", trained / "digits_test",
              "--labels", trained / "digits_test_y.npy"]
    explicit = tmp_path / "static.kiln"
    compile_model(kiln_bin, model, explicit, "--precision", "int8", "--calibration-method",
                  "minmax", *common)
    want = predict_batched(kiln_bin, explicit, "image", x, tmp_path, "explicit")
    monkeypatch.setenv("KILN_AUTO_STATIC", "force")
    out = tmp_path / "auto_static.kiln"
    _, rep = compile_model(kiln_bin, model, out, "--precision", "auto", *common)
    assert "static int8 of the whole model (MinMax), within the bound" in rep["verdict"], rep["verdict"]
    assert rep["auto"]["static"] is True and rep["auto"]["static_kept_fp32"] == 0, rep["auto"]
    assert rep["calibration"]["method"] == "minmax", rep["calibration"]
    got = predict_batched(kiln_bin, out, "image", x, tmp_path, "auto_static")
    np.testing.assert_array_equal(got, want)
    monkeypatch.setenv("KILN_AUTO_STATIC", "0")
    _, rep0 = compile_model(kiln_bin, model, tmp_path / "auto_mix.kiln", "--precision", "auto",
                            *common)
    assert "static int8" not in rep0["verdict"] and rep0["calibration"]["method"] == "dynamic", rep0
    assert rep0["auto"] == {"static": False, "static_whole_model_drop": None,
                            "static_kept_fp32": None, "static_kept_drop": None, "mix_ms": None,
                            "static_ms": None}, rep0["auto"]
    monkeypatch.delenv("KILN_AUTO_STATIC")
    _, rep1 = compile_model(kiln_bin, model, tmp_path / "auto.kiln", "--precision", "auto", *common)
    assert "static int8 of the whole model" in rep1["verdict"], rep1["verdict"]


def test_auto_static_keeps_the_most_sensitive_nodes(kiln_bin, tmp_path, monkeypatch):
    """auto's static int8 candidate: where the whole model exceeds --max-drop (the outlier
    model: 8-bit rounding of conv2's input), the same calibration is finished again with the
    1, 2, 4 ... most sensitive convolutions kept in fp32, and the first within the bound is
    taken (KILN_AUTO_STATIC=force: within the bound is enough). The report names conv2 as
    kept in fp32 and the rest int8, the verdict says so, and the file's outputs agree with the
    fp32 model as the report says."""
    model = tmp_path / "outlier.onnx"
    x = outlier_cnn(model)
    for part, rows in (("cal", x[:32]), ("eval", x[32:])):
        (tmp_path / part).mkdir()
        np.save(tmp_path / part / "image.npy", rows)
    monkeypatch.setenv("KILN_AUTO_STATIC", "force")
    out = tmp_path / "auto.kiln"
    _, rep = compile_model(kiln_bin, model, out, "--precision", "auto", "--calibration",
                           tmp_path / "cal", "--eval", tmp_path / "eval", "--max-drop", "10%")
    assert "static int8 (MinMax) with the 1 most sensitive node kept in fp32" in rep["verdict"], \
        rep["verdict"]
    assert rep["passed"] and rep["calibration"]["method"] == "minmax", rep
    au = rep["auto"]
    assert au["static"] is True and au["static_kept_fp32"] == 1, au
    assert au["static_whole_model_drop"] > 0.1 and au["static_kept_drop"] <= 0.1, au
    prec = {n["name"]: n["precision"] for n in rep["nodes"]}
    assert prec == {"conv1": "int8", "conv2": "fp32", "conv3": "int8"}, rep["nodes"]
    kept = [n for n in rep["nodes"] if n["fell_back"]]
    assert [n["name"] for n in kept] == ["conv2"] and "kept in fp32" in kept[0]["reason"], kept
    fp32 = predict_batched(kiln_bin, model, "image", x[32:], tmp_path, "fp32")
    got = predict_batched(kiln_bin, out, "image", x[32:], tmp_path, "auto")
    agree = float(np.mean(got.argmax(1) == fp32.argmax(1)))
    assert abs((1 - agree) - rep["metric"]["drop"]) < 1e-6 and agree >= 0.9, (agree, rep["metric"])


def released_weights_model(path):
    """A grouped convolution whose groups oneDNN runs on its reference code unless merged
    (dnnl/conv.c, conv_try_merge: regnet's 26 groups of 8 channels) and a stride-2
    ConvTranspose (dnnl/deconv_phase.c): both build their own weights from W's floats."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(3)
    w1 = (rng.standard_normal((208, 8, 3, 3)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((208, 16, 2, 2)) * 0.1).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c"], group=26, pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("ConvTranspose", ["r", "w2"], ["y"], strides=[2, 2])],
        "released", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 208, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 14, 14])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


@pytest.mark.parametrize("mode", ["int8", "bf16", "auto"])
def test_second_precision_reads_released_weights(kiln_bin, tmp_path, mode):
    """kiln compile plans the model in fp32 and then in the asked precision: kernels that
    build weights of their own from W's floats at compile time must make W resident again
    after the first plan packed and released it (they read NULL: a crash on regnet_y_400mf
    and the UNet of the zoo). The compiled file's outputs equal the fp32 model's within the
    precision's error."""
    model = tmp_path / "released.onnx"
    released_weights_model(model)
    x = np.random.default_rng(4).normal(0, 1, size=(12, 208, 7, 7)).astype(np.float32)
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "x.npy", x)
    out = tmp_path / f"released_{mode}.kiln"
    r, rep = compile_model(kiln_bin, model, out, "--precision", mode, "--calibration",
                           tmp_path / "d", "--eval", tmp_path / "d", "--max-drop", "100%")
    o = rep["outputs"][0]  # (int8 leaves grouped and transposed convolutions in fp32)
    assert r.returncode == 0 and (o["identical"] or o["sqnr_db"] > 15), o
