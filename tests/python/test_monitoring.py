"""test_monitoring.py - model monitoring: `kiln profile` and the drift,
confidence and validation metrics of `kiln serve` (src/serve/monitor/,
docs/MONITORING.md).

A small classifier is built here with onnx.helper: probs = softmax(x @ W + b
+ c * v) over a float input x [N, 4] and an integer input c [N]. Its
reference profile, written by `kiln profile` from .npy files and from a
JSON-lines file of predict bodies, is checked against numpy (deciles, bin
counts, top-k values, the max-probability distribution of softmax computed
in numpy). The same profile, with validation rules added, is served for
versions 1 and 2: version 1 gets fresh reference-distributed traffic,
version 2 drifted traffic. Every drift gauge is compared with PSI,
Jensen-Shannon (scipy) and L-infinity computed in numpy from the profile's
bins and the rows the test sent; gauges stay below the thresholds on
version 1 and the alert fires on version 2's drifted features only. NaN,
infinite and out-of-range values are counted, a reject rule answers 400
naming the input and the value, the confidence histograms equal numpy's on
the returned outputs, the expected accuracy is their mean max probability,
and the JSON view agrees with the Prometheus page. A second model with a
string input checks top-k categories, missing (empty) strings and
L-infinity; another checks that the window slides; `kiln profile` also
reads .npz archives, JSON lines and TF Serving warmup files.
"""
import json
import math
import re
import subprocess
import time

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from scipy.spatial.distance import jensenshannon  # noqa: E402

from test_serve import KILN, Server  # noqa: E402

W = np.array([[1.0, -0.5, 0.2], [0.3, 0.8, -1.0], [-0.7, 0.1, 0.9], [0.5, 0.5, 0.5]], np.float32)
B = np.array([0.1, -0.2, 0.05], np.float32)
V = np.array([[0.6, -0.3, 0.4]], np.float32)
DECILES = np.arange(1, 10) / 10.0


def save_classifier(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    c = helper.make_tensor_value_info("c", TensorProto.INT64, ["batch"])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 3])
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B"),
             numpy_helper.from_array(V, "V"), numpy_helper.from_array(np.array([-1, 1], np.int64), "shape")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]),
             helper.make_node("Add", ["xw", "B"], ["xwb"]),
             helper.make_node("Cast", ["c"], ["cf"], to=TensorProto.FLOAT),
             helper.make_node("Reshape", ["cf", "shape"], ["c2"]),
             helper.make_node("Mul", ["c2", "V"], ["cv"]),
             helper.make_node("Add", ["xwb", "cv"], ["z"]),
             helper.make_node("Softmax", ["z"], ["probs"], axis=1)]
    g = helper.make_graph(nodes, "classifier", [x, c], [y], inits)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def softmax_np(x, c):
    z = x.astype(np.float64) @ W.astype(np.float64) + B + c.astype(np.float64)[:, None] * V[0]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def sample(rng, n, drift=False):
    x = rng.standard_normal((n, 4)).astype(np.float32)
    c = rng.choice(3, size=n, p=[0.5, 0.3, 0.2]).astype(np.int64)
    if drift:
        x[:, 0] += 2.0
        c = rng.choice(3, size=n, p=[0.1, 0.2, 0.7]).astype(np.int64)
    return x, c


# numpy references of the statistics (docs/MONITORING.md)
def psi_np(ref, cur):
    p = np.maximum(ref / ref.sum(), 1e-4)
    q = np.maximum(cur / cur.sum(), 1e-4)
    return float(np.sum((q - p) * np.log(q / p)))


def js_np(ref, cur):
    return float(jensenshannon(ref / ref.sum(), cur / cur.sum(), base=2))


def linf_np(ref, cur):
    return float(np.max(np.abs(ref / ref.sum() - cur / cur.sum())))


def confidence_np(p):
    s = np.sort(p, axis=1)
    # entropy of the probabilities as served (scipy's entropy would renormalize them first)
    h = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), axis=1)
    return s[:, -1], s[:, -1] - s[:, -2], h / math.log(p.shape[1])


def run_profile(*args):
    return subprocess.run([KILN, "profile", *map(str, args)], capture_output=True, text=True, timeout=120)


def prom(srv):
    code, body, _ = srv.request("GET", "/monitoring/prometheus/metrics")
    assert code == 200
    return body.decode()


def prom_value(text, name, **labels):
    for line in text.splitlines():
        m = re.match(r"^([^{\s]+)\{([^}]*)\}\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if got == {k: str(v) for k, v in labels.items()}:
            return float(m.group(3))
    return None


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("monitoring")
    model = root / "model.onnx"
    save_classifier(model)
    rng = np.random.default_rng(7)
    x, c = sample(rng, 3000)
    ref = root / "ref"
    ref.mkdir()
    np.save(ref / "x.npy", x)
    np.save(ref / "c.npy", c)
    r = run_profile(model, "--data", ref, "-o", root / "profile.json", "--batch", 500)
    assert r.returncode == 0, r.stderr
    prof = json.loads((root / "profile.json").read_text())
    return root, model, x, c, prof


def test_profile_matches_numpy(setup):
    root, model, x, c, prof = setup
    assert prof["kiln_profile"] == 1 and prof["rows"] == 3000
    feats = {f["name"]: f for f in prof["features"]}
    assert sorted(feats) == ["c", "x[0]", "x[1]", "x[2]", "x[3]"]
    for j in range(4):
        f = feats[f"x[{j}]"]
        col = x[:, j].astype(np.float64)
        edges = np.unique(np.quantile(col, DECILES))
        assert f["kind"] == "numeric" and f["input"] == "x" and f["column"] == j
        np.testing.assert_allclose(f["edges"], edges, rtol=1e-12)
        counts = np.bincount(np.searchsorted(f["edges"], col, side="right"), minlength=len(edges) + 1)
        assert f["counts"] == counts.tolist()
        assert (f["min"], f["max"], f["count"], f["nan"]) == (col.min(), col.max(), 3000, 0)
    fc = feats["c"]
    vals, cnt = np.unique(c, return_counts=True)
    order = np.argsort(-cnt, kind="stable")
    assert fc["kind"] == "categorical" and fc["value_type"] == "number" and fc["column"] == -1
    assert fc["values"] == vals[order].tolist() and fc["counts"] == cnt[order].tolist() + [0]
    (out,) = prof["outputs"]
    maxp = softmax_np(x, c).max(axis=1)
    assert out["name"] == "probs" and out["count"] == 3000
    assert out["mean_max_probability"] == pytest.approx(maxp.mean(), rel=1e-5)
    hist = np.bincount(np.ceil(maxp * 10 - 1e-9).astype(int) - 1, minlength=10)
    assert np.abs(np.array(out["max_probability"]) - hist).max() <= 2  # float32 vs float64 at edges
    assert prof["rules"] == []


def test_profile_from_json_lines_equals_npy(setup):
    root, model, x, c, prof = setup
    lines = root / "requests.jsonl"
    with open(lines, "w") as f:
        for i in range(0, 3000, 250):  # both TF Serving formats
            if i % 500:
                f.write(json.dumps({"inputs": {"x": x[i:i + 250].tolist(), "c": c[i:i + 250].tolist()}}) + "\n")
            else:
                f.write(json.dumps({"instances": [{"x": x[k].tolist(), "c": int(c[k])}
                                                  for k in range(i, i + 250)]}) + "\n")
    r = run_profile(model, "--data", lines, "-o", root / "p2.json")
    assert r.returncode == 0, r.stderr
    p2 = json.loads((root / "p2.json").read_text())
    assert p2["features"] == prof["features"] and p2["rows"] == 3000
    assert p2["outputs"][0]["mean_max_probability"] == pytest.approx(
        prof["outputs"][0]["mean_max_probability"], rel=1e-12)


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_profile_from_npz_equals_npy(setup, save, tmp_path):
    root, model, x, c, prof = setup
    save(tmp_path / "ref.npz", x=x, c=c, unused=np.zeros(3))
    r = run_profile(model, "--data", tmp_path / "ref.npz", "-o", tmp_path / "p.json", "--batch", 500)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "p.json").read_text()) == prof
    save(tmp_path / "short.npz", x=x)
    r = run_profile(model, "--data", tmp_path / "short.npz", "-o", tmp_path / "q.json")
    assert r.returncode == 1 and "short.npz" in r.stderr and "'c.npy'" in r.stderr, r.stderr
    data = (tmp_path / "ref.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) - 30])
    r = run_profile(model, "--data", tmp_path / "cut.npz", "-o", tmp_path / "q.json")
    assert r.returncode == 1 and "cut.npz" in r.stderr, r.stderr
    assert not (tmp_path / "q.json").exists()


def test_profile_from_warmup_file_equals_npy(setup):
    from test_serve_warmup import predict_log, tfrecord
    root, model, x, c, prof = setup
    warm = root / "tf_serving_warmup_requests"
    warm.write_bytes(tfrecord([predict_log({"x": x[i:i + 1000], "c": c[i:i + 1000]})
                               for i in range(0, 3000, 1000)]))
    r = run_profile(model, "--data", warm, "-o", root / "p3.json")
    assert r.returncode == 0, r.stderr
    p3 = json.loads((root / "p3.json").read_text())
    assert p3["features"] == prof["features"] and p3["rows"] == 3000
    assert p3["outputs"][0]["mean_max_probability"] == pytest.approx(
        prof["outputs"][0]["mean_max_probability"], rel=1e-9)
    warm.write_bytes(tfrecord([predict_log({"x": x[:10]})]))
    r = run_profile(model, "--data", warm, "-o", root / "p4.json")
    assert r.returncode == 1 and "record 1" in r.stderr and "'c'" in r.stderr, r.stderr


def test_profile_flags_set_thresholds_and_window(setup, tmp_path):
    root, model, x, c, prof = setup
    assert (prof["thresholds"], prof["window_seconds"], prof["sub_windows"], prof["min_count"]) == (
        {"psi": 0.25, "js": 0.1, "linf": 0.1}, 300, 5, 500)  # docs/MONITORING.md's defaults
    r = run_profile(model, "--data", root / "ref", "-o", tmp_path / "p.json", "--psi", "0.2", "--js", "0.3",
                    "--linf", "0.05", "--window-seconds", "120", "--sub-windows", "4", "--min-count", "50")
    assert r.returncode == 0, r.stderr
    p = json.loads((tmp_path / "p.json").read_text())
    assert (p["thresholds"], p["window_seconds"], p["sub_windows"], p["min_count"]) == (
        {"psi": 0.2, "js": 0.3, "linf": 0.05}, 120, 4, 50)
    for bad in (["--psi", "0"], ["--js", "nan"], ["--sub-windows", "61"], ["--bins", "3"]):
        r = run_profile(model, "--data", root / "ref", "-o", tmp_path / "q.json", *bad)
        assert r.returncode == 2 and bad[0] in r.stderr, (bad, r.stderr)


def test_profile_bad_data_names_file_and_input(setup, tmp_path):
    root, model, x, c, prof = setup
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "x.npy", x)
    r = run_profile(model, "--data", tmp_path / "d", "-o", tmp_path / "p.json")
    assert r.returncode == 1 and "'c'" in r.stderr and "c.npy" in r.stderr, r.stderr
    np.save(tmp_path / "d" / "c.npy", c[:10])
    r = run_profile(model, "--data", tmp_path / "d", "-o", tmp_path / "p.json")
    assert r.returncode == 1 and "c.npy" in r.stderr and "10 samples" in r.stderr, r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"inputs": {"x": [[1, 2, 3, 4]], "c": [0]}}\n{"inputs": {"x": [[1, 2]], "c": [0]}}\n')
    r = run_profile(model, "--data", bad, "-o", tmp_path / "p.json")
    assert r.returncode == 1 and "bad.jsonl:2" in r.stderr and "x" in r.stderr, r.stderr
    assert not (tmp_path / "p.json").exists()


def post(srv, version, x, c):
    body = json.dumps({"inputs": {"x": x.tolist(), "c": c.tolist()}})
    code, data, _ = srv.request("POST", f"/v1/models/mon/versions/{version}:predict", body)
    return code, json.loads(data)


@pytest.fixture(scope="module")
def served(setup):
    root, model, x, c, prof = setup
    prof = dict(prof)
    prof["window_seconds"], prof["sub_windows"], prof["min_count"] = 600, 6, 500
    prof["rules"] = [{"input": "x", "min": -8, "max": 8, "allow_nan": False, "action": "count"},
                     {"input": "c", "min": 0, "max": 2, "action": "reject"}]
    base = root / "mon"
    for v in (1, 2):
        save_classifier(base / str(v) / "model.onnx")
        (base / str(v) / "assets.extra").mkdir()
        (base / str(v) / "assets.extra" / "kiln_profile.json").write_text(json.dumps(prof))
    cfg = root / "models.config"
    cfg.write_text(f"model_config_list {{ config {{ name: 'mon' base_path: '{base}' "
                   "model_platform: 'tensorflow' model_version_policy { specific { versions: 1 "
                   "versions: 2 } } } }\n")
    srv = Server(base, "mon", f"--model_config_file={cfg}")
    rng = np.random.default_rng(11)
    sent = {1: ([], [], []), 2: ([], [], [])}
    for v in (1, 2):
        for _ in range(20):
            xs, cs = sample(rng, 100, drift=(v == 2))
            code, reply = post(srv, v, xs, cs)
            assert code == 200, reply
            sent[v][0].append(xs)
            sent[v][1].append(cs)
            sent[v][2].append(np.array(reply["outputs"], np.float32).astype(np.float64))
    # anomalies on version 1: a NaN (counted) and an out-of-range value (counted)
    xa = np.zeros((3, 4), np.float32)
    xa[0, 2] = np.nan
    xa[1, 3] = 50.0
    xa[2, 1] = -np.inf
    code, reply = post(srv, 1, xa, np.array([0, 1, 2]))
    assert code == 200, reply
    sent[1][0].append(xa)
    sent[1][1].append(np.array([0, 1, 2]))
    sent[1][2].append(np.array(reply["outputs"], np.float32).astype(np.float64))
    yield srv, prof, {v: tuple(np.concatenate(a) for a in sent[v]) for v in sent}
    srv.kill()


def test_drift_gauges_match_numpy(served):
    srv, prof, sent = served
    text = prom(srv)
    feats = {f["name"]: f for f in prof["features"]}
    for v in (1, 2):
        x, c, _ = sent[v]
        for j in range(4):
            f = feats[f"x[{j}]"]
            ref = np.array(f["counts"], np.float64)
            col = x[:, j].astype(np.float64)
            col = col[np.isfinite(col)]  # NaN is counted apart, not binned
            cur = np.bincount(np.searchsorted(f["edges"], col, side="right"),
                              minlength=len(ref)).astype(np.float64)
            lab = dict(model_name="mon", version=v, feature=f"x[{j}]")
            psi, js = prom_value(text, "kiln_drift_psi", **lab), prom_value(text, "kiln_drift_js", **lab)
            assert psi == pytest.approx(psi_np(ref, cur), rel=1e-9, abs=1e-12), (v, j)
            assert js == pytest.approx(js_np(ref, cur), rel=1e-9, abs=1e-12), (v, j)
            drifted = v == 2 and j == 0
            assert prom_value(text, "kiln_drift_alert", **lab) == (1.0 if drifted else 0.0), (v, j, psi, js)
            if drifted:
                assert psi > 0.25 and js > 0.1
            else:
                assert psi < 0.25 and js < 0.1
            assert prom_value(text, "kiln_drift_linf", **lab) is None
        fc = feats["c"]
        ref = np.array(fc["counts"], np.float64)
        cur = np.array([np.sum(c == val) for val in fc["values"]] + [0], np.float64)
        lab = dict(model_name="mon", version=v, feature="c")
        linf = prom_value(text, "kiln_drift_linf", **lab)
        assert linf == pytest.approx(linf_np(ref, cur), rel=1e-9, abs=1e-12)
        assert prom_value(text, "kiln_drift_alert", **lab) == (1.0 if v == 2 else 0.0), linf
        assert prom_value(text, "kiln_drift_psi", **lab) is None


def test_anomalies_counted(served):
    srv, prof, sent = served
    text = prom(srv)
    get = lambda v, feat, kind: prom_value(text, "kiln_feature_anomalies_total", model_name="mon",
                                          version=v, feature=feat, kind=kind)
    assert get(1, "x[2]", "nan") == 1
    assert get(1, "x[3]", "out_of_range") == 1
    assert get(1, "x[1]", "inf") == 1 and get(1, "x[1]", "out_of_range") == 0
    assert get(1, "x[0]", "nan") == 0 and get(1, "x[3]", "nan") == 0 and get(1, "x[2]", "inf") == 0
    assert get(2, "x[2]", "nan") == 0 and get(1, "c", "missing") == 0


def test_reject_rule_answers_400(served):
    srv, prof, sent = served
    before = prom_value(prom(srv), "kiln_validation_rejections_total", model_name="mon", version=1, feature="c")
    code, reply = post(srv, 1, np.zeros((3, 4), np.float32), np.array([0, 7, 1]))
    assert code == 400, reply
    assert "'c'" in reply["error"] and "7" in reply["error"], reply
    after = prom_value(prom(srv), "kiln_validation_rejections_total", model_name="mon", version=1, feature="c")
    assert (before, after) == (0, 1)


def test_confidence_histograms_match_numpy(served):
    srv, prof, sent = served
    text = prom(srv)
    for v in (1, 2):
        out = sent[v][2]
        out = out[np.all(np.isfinite(out), axis=1)]
        maxp, margin, ent = confidence_np(out)
        for name, vals in (("max_probability", maxp), ("margin", margin), ("entropy", ent)):
            metric = f"kiln_prediction_{name}"
            for k in range(1, 11):
                le = f"{k / 10:g}"
                got = prom_value(text, metric + "_bucket", model_name="mon", version=v, le=le)
                assert got == np.sum(vals <= k / 10), (v, name, le)
            assert prom_value(text, metric + "_bucket", model_name="mon", version=v, le="+Inf") == len(vals)
            assert prom_value(text, metric + "_count", model_name="mon", version=v) == len(vals)
            assert prom_value(text, metric + "_sum", model_name="mon", version=v) == pytest.approx(
                vals.sum(), rel=1e-9), (v, name)
        acc = prom_value(text, "kiln_expected_accuracy", model_name="mon", version=v)
        assert acc == pytest.approx(maxp.mean(), rel=1e-9)


def test_monitoring_off(setup, tmp_path):
    root, model, x, c, prof = setup
    prof = dict(prof, rules=[{"input": "c", "min": 0, "max": 2, "action": "reject"}], min_count=1)
    base = tmp_path / "off"
    save_classifier(base / "1" / "model.onnx")
    (base / "1" / "assets.extra").mkdir()
    (base / "1" / "assets.extra" / "kiln_profile.json").write_text(json.dumps(prof))
    srv = Server(base, "off", "--enable_model_monitoring=false")
    try:
        body = json.dumps({"inputs": {"x": x[:600].tolist(), "c": [7] + c[1:600].tolist()}})
        code, data, _ = srv.request("POST", "/v1/models/off:predict", body)
        assert code == 200, data  # no reject rule without monitoring
        text = prom(srv)
        assert "kiln_drift_" not in text and "kiln_prediction_max_probability" not in text
        code, data, _ = srv.request("GET", "/v1/models/off/monitoring")
        assert code == 404 and b"monitoring is off" in data, data
    finally:
        srv.kill()


def test_window_slides(setup, tmp_path):
    root, model, x, c, prof = setup
    prof = dict(prof, window_seconds=2, sub_windows=2, min_count=100)
    base = tmp_path / "win"
    save_classifier(base / "1" / "model.onnx")
    (base / "1" / "assets.extra").mkdir()
    (base / "1" / "assets.extra" / "kiln_profile.json").write_text(json.dumps(prof))
    srv = Server(base, "win")
    try:
        body = json.dumps({"inputs": {"x": x[:200].tolist(), "c": c[:200].tolist()}})
        assert srv.request("POST", "/v1/models/win:predict", body)[0] == 200
        lab = dict(model_name="win", version=1, feature="x[0]")
        assert prom_value(prom(srv), "kiln_drift_psi", **lab) is not None
        time.sleep(4.2)  # two 1 s slots: everything has left the window
        text = prom(srv)
        assert prom_value(text, "kiln_drift_psi", **lab) is None
        assert prom_value(text, "kiln_expected_accuracy", model_name="win", version=1) is None
        assert prom_value(text, "kiln_prediction_max_probability_count", model_name="win", version=1) == 200
    finally:
        srv.kill()


def test_concurrent_requests_all_counted(setup, tmp_path):
    """Requests from many connections at once (spread over the server's
    request threads, each adding to its own shard of the window): the
    window, the drift gauges and the cumulative counters hold every row."""
    import threading
    root, model, x, c, prof = setup
    prof = dict(prof, window_seconds=600, sub_windows=6, min_count=100)
    base = tmp_path / "conc"
    save_classifier(base / "1" / "model.onnx")
    (base / "1" / "assets.extra").mkdir()
    (base / "1" / "assets.extra" / "kiln_profile.json").write_text(json.dumps(prof))
    srv = Server(base, "conc")
    rng = np.random.default_rng(5)
    parts = [sample(rng, 20, drift=(i % 3 == 0)) for i in range(96)]
    failures = []

    def worker(k):
        for i in range(k, len(parts), 8):
            body = json.dumps({"inputs": {"x": parts[i][0].tolist(), "c": parts[i][1].tolist()}})
            code = srv.request("POST", "/v1/models/conc:predict", body)[0]
            if code != 200:
                failures.append(code)

    try:
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        xs = np.concatenate([p[0] for p in parts])
        text = prom(srv)
        lab = dict(model_name="conc", version=1)
        assert prom_value(text, "kiln_prediction_max_probability_count", **lab) == len(xs)
        feats = {f["name"]: f for f in prof["features"]}
        for j in range(4):
            f = feats[f"x[{j}]"]
            ref = np.array(f["counts"], np.float64)
            cur = np.bincount(np.searchsorted(f["edges"], xs[:, j].astype(np.float64), side="right"),
                              minlength=len(ref)).astype(np.float64)
            flab = dict(lab, feature=f"x[{j}]")
            assert prom_value(text, "kiln_drift_window_values", **flab) == len(xs)
            assert prom_value(text, "kiln_drift_psi", **flab) == pytest.approx(
                psi_np(ref, cur), rel=1e-9, abs=1e-12), j
    finally:
        srv.kill()


def test_changed_profile_is_reread(setup, tmp_path):
    """A version's kiln_profile.json replaced while serving is read again
    after the next model poll: the same live rows that matched the first
    reference drift from the second (a reference shifted by +2 on x[0], as
    `sample(drift=True)` makes), and the window starts over."""
    root, model, x, c, prof = setup
    base = tmp_path / "re"
    save_classifier(base / "1" / "model.onnx")
    extra = base / "1" / "assets.extra"
    extra.mkdir()
    (extra / "kiln_profile.json").write_text(json.dumps(dict(prof, min_count=100)))
    srv = Server(base, "re")
    live_x, live_c = sample(np.random.default_rng(11), 400)

    def send_and_read():
        body = json.dumps({"inputs": {"x": live_x.tolist(), "c": live_c.tolist()}})
        assert srv.request("POST", "/v1/models/re:predict", body)[0] == 200
        code, data, _ = srv.request("GET", "/v1/models/re/monitoring")
        assert code == 200
        (v,) = json.loads(data)["versions"]
        return {f["name"]: f for f in v["features"]}

    try:
        f = send_and_read()
        assert f["x[0]"]["window_count"] == 400 and f["x[0]"]["alert"] is False, f["x[0]"]
        # the second reference: drifted data through kiln profile
        dx, dc = sample(np.random.default_rng(5), 3000, drift=True)
        ref2 = tmp_path / "ref2"
        ref2.mkdir()
        np.save(ref2 / "x.npy", dx)
        np.save(ref2 / "c.npy", dc)
        r = run_profile(model, "--data", ref2, "-o", tmp_path / "p2.json", "--min-count", "100")
        assert r.returncode == 0, r.stderr
        (tmp_path / "p2.json").replace(extra / "kiln_profile.json")  # atomically, as a deploy would
        deadline = time.time() + 20
        while "kiln_profile.json of version 1 of 're' changed" not in srv.logtext():
            assert time.time() < deadline, srv.logtext()
            time.sleep(0.1)
        f = send_and_read()
        # a fresh window on the new reference: only the rows sent since
        assert f["x[0]"]["window_count"] == 400, f["x[0]"]
        new = json.loads((extra / "kiln_profile.json").read_text())
        ref0 = [g for g in new["features"] if g["name"] == "x[0]"][0]
        live = np.bincount(np.searchsorted(ref0["edges"], live_x[:, 0], side="right"),
                           minlength=len(ref0["edges"]) + 1)
        assert f["x[0]"]["alert"] is True, f["x[0]"]
        # the PSI the server reports is numpy's on the new reference
        assert math.isclose(f["x[0]"]["psi"], psi_np(np.array(ref0["counts"], float), live), rel_tol=1e-6)
    finally:
        srv.kill()


def test_json_view_agrees_with_prometheus(served):
    srv, prof, sent = served
    code, view = srv.json("GET", "/v1/models/mon/monitoring")
    assert code == 200, view
    text = prom(srv)
    assert view["model_name"] == "mon" and sorted(v["version"] for v in view["versions"]) == [1, 2]
    for ver in view["versions"]:
        v = ver["version"]
        assert ver["window_seconds"] == 600 and ver["min_count"] == 500
        assert ver["thresholds"] == {"psi": 0.25, "js": 0.1, "linf": 0.1}
        assert [f["name"] for f in ver["features"]] == [f["name"] for f in prof["features"]]
        for f in ver["features"]:
            lab = dict(model_name="mon", version=v, feature=f["name"])
            stats = ("psi", "js") if f["kind"] == "numeric" else ("linf",)
            for st in stats:
                assert f[st] == prom_value(text, f"kiln_drift_{st}", **lab), (v, f)
            assert f["alert"] == bool(prom_value(text, "kiln_drift_alert", **lab))
            vals = sent[v][1] if f["name"] == "c" else sent[v][0][:, int(f["name"][2])]
            assert f["window_count"] == np.isfinite(vals).sum()
            for kind, n in f["anomalies"].items():
                assert n == prom_value(text, "kiln_feature_anomalies_total", kind=kind, **lab)
        conf = ver["confidence"]
        assert conf["output"] == "probs" and conf["count"] == prom_value(
            text, "kiln_prediction_max_probability_count", model_name="mon", version=v)
        assert conf["expected_accuracy"] == prom_value(text, "kiln_expected_accuracy", model_name="mon", version=v)
        assert np.cumsum(conf["entropy"])[:10].tolist() == [
            prom_value(text, "kiln_prediction_entropy_bucket", model_name="mon", version=v, le=f"{k / 10:g}")
            for k in range(1, 11)]
        assert conf["reference_mean_max_probability"] == prof["outputs"][0]["mean_max_probability"]
        assert ver["rejections"] == {"c": prom_value(text, "kiln_validation_rejections_total",
                                                     model_name="mon", version=v, feature="c")}
    assert srv.request("GET", "/v1/models/nosuch/monitoring")[0] == 404


def save_string_model(path):
    """probs = softmax(x @ W + B) beside an echo of a string input s."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    st = helper.make_tensor_value_info("s", TensorProto.STRING, ["batch"])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 3])
    e = helper.make_tensor_value_info("s_echo", TensorProto.STRING, ["batch"])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["z"]),
             helper.make_node("Softmax", ["z"], ["probs"], axis=1), helper.make_node("Identity", ["s"], ["s_echo"])]
    g = helper.make_graph(nodes, "strings", [x, st], [y, e],
                          [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_string_feature_top_k_and_linf(tmp_path):
    rng = np.random.default_rng(3)
    model = tmp_path / "s" / "1" / "model.onnx"
    save_string_model(model)
    x = rng.standard_normal((1000, 4)).astype(np.float32)
    s = rng.choice(["paris", "oslo", "lima", "évora", ""], size=1000, p=[0.5, 0.25, 0.15, 0.05, 0.05])
    (tmp_path / "ref").mkdir()
    np.save(tmp_path / "ref" / "x.npy", x)
    np.save(tmp_path / "ref" / "s.npy", s)
    out = tmp_path / "s" / "1" / "assets.extra" / "kiln_profile.json"
    out.parent.mkdir()
    r = run_profile(model, "--data", tmp_path / "ref", "-o", out, "--top-k", 3)
    assert r.returncode == 0, r.stderr
    prof = json.loads(out.read_text())
    (f,) = [f for f in prof["features"] if f["name"] == "s"]
    vals, cnt = np.unique(s[s != ""], return_counts=True)
    order = np.argsort(-cnt, kind="stable")[:3]
    assert f["kind"] == "categorical" and f["value_type"] == "string"
    assert f["values"] == vals[order].tolist() and f["missing"] == np.sum(s == "")
    assert f["counts"] == cnt[order].tolist() + [int(cnt.sum() - cnt[order].sum())]
    prof["min_count"] = 100
    out.write_text(json.dumps(prof))
    srv = Server(tmp_path / "s", "s")
    try:
        live = rng.choice(["lima", "évora", "tokyo", ""], size=600, p=[0.5, 0.2, 0.2, 0.1])
        body = json.dumps({"inputs": {"x": x[:600].tolist(), "s": live.tolist()}})
        code, data, _ = srv.request("POST", "/v1/models/s:predict", body)
        assert code == 200, data
        text = prom(srv)
        seen = live[live != ""]
        cur = np.array([np.sum(seen == v) for v in f["values"]] + [np.sum(~np.isin(seen, f["values"]))], float)
        lab = dict(model_name="s", version=1, feature="s")
        linf = prom_value(text, "kiln_drift_linf", **lab)
        assert linf == pytest.approx(linf_np(np.array(f["counts"], float), cur), rel=1e-9)
        assert linf > 0.1 and prom_value(text, "kiln_drift_alert", **lab) == 1
        assert prom_value(text, "kiln_feature_anomalies_total", kind="missing", **lab) == np.sum(live == "")
    finally:
        srv.kill()
