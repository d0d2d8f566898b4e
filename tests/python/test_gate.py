"""The release gate (docs/RELEASE_GATE.md): `kiln gate`, blessings,
`kiln serve --require_blessing`, and assets.extra/kiln_version.json.

Models are built here with onnx.helper; every metric the gate reports is
recomputed with numpy from the same weights and data (float32 forward pass,
argmax, accuracy, agreement, output distance, RMSE/MAE), and the blessing's
file list is checked with hashlib. Latency is only compared in direction
(a model doing ~100x the work is slower), never against fixed figures.
"""

import hashlib
import json
import re
import shutil
import subprocess

import numpy as np
import pytest

import test_serve
from conftest import TESTDATA
from test_serve import KILN, Server, save_affine, wait_for
from test_serve_warmup import predict_log, tfrecord

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = test_serve.pytestmark

N, D, C = 200, 8, 4
RNG = np.random.default_rng(19)
X = RNG.standard_normal((N, D)).astype(np.float32)
W_TRUE = RNG.standard_normal((D, C)).astype(np.float32)
LABELS = np.argmax(X @ W_TRUE, axis=1).astype(np.int64)
W_BASE = (W_TRUE + 0.3 * RNG.standard_normal((D, C))).astype(np.float32)
W_WORSE = (W_TRUE + 1.5 * RNG.standard_normal((D, C))).astype(np.float32)
BIAS = np.zeros(C, np.float32)


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def forward(w):
    return softmax(X @ w + BIAS).astype(np.float32)


def save_classifier(path, w, slow=0):
    """probs = softmax(x @ w + bias) over float32 [batch, D]; with slow=k, k
    extra 256x256 MatMul+Tanh layers whose sum is multiplied by 0 and added
    (the same answer, much more work)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", D])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", C])
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(BIAS, "bias")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "bias"], ["logits"])]
    last = "logits"
    if slow:
        rng = np.random.default_rng(5)
        inits.append(numpy_helper.from_array((rng.standard_normal((D, 256)) * 0.1).astype(np.float32), "w_in"))
        nodes.append(helper.make_node("MatMul", ["x", "w_in"], ["h0"]))
        for k in range(slow):
            inits.append(numpy_helper.from_array((rng.standard_normal((256, 256)) * 0.05).astype(np.float32), f"w{k}"))
            nodes.append(helper.make_node("MatMul", [f"h{k}", f"w{k}"], [f"m{k}"]))
            nodes.append(helper.make_node("Tanh", [f"m{k}"], [f"h{k + 1}"]))
        inits.append(numpy_helper.from_array(np.zeros((256, C), np.float32), "zero"))
        nodes.append(helper.make_node("MatMul", [f"h{slow}", "zero"], ["nothing"]))
        nodes.append(helper.make_node("Add", ["logits", "nothing"], ["logits2"]))
        last = "logits2"
    nodes.append(helper.make_node("Softmax", [last], ["probs"], axis=1))
    g = helper.make_graph(nodes, "classifier", [x], [y], inits)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def kiln(*args):
    return subprocess.run([KILN, *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.fixture
def setup(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "x.npy", X)
    np.save(tmp_path / "labels.npy", LABELS)
    save_classifier(tmp_path / "base" / "1" / "model.onnx", W_BASE)
    return tmp_path


def gate(tmp, cand, *extra, labels=True):
    args = ["gate", cand, "--baseline", tmp / "base" / "1", "--data", tmp / "data",
            "--report", tmp / "report.json", "--batch-sizes", "1,8", "--runs", "10", *extra]
    if labels:
        args += ["--labels", tmp / "labels.npy"]
    r = kiln(*args)
    report = json.loads((tmp / "report.json").read_text()) if (tmp / "report.json").exists() else None
    return r, report


def sha256_files(folder):
    out = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and rel != "assets.extra/kiln_blessing.json":
            out.append((rel, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()))
    return sorted(out)


# ------------------------------------------------------------------ kiln gate


def test_equal_candidate_is_blessed(setup):
    cand = setup / "cand" / "2"
    shutil.copytree(setup / "base" / "1", cand)
    r, rep = gate(setup, cand)
    assert r.returncode == 0, r.stderr
    res = rep["result"]
    assert res["verdict"] == "pass" and res["reasons"] == []
    acc = float(np.mean(np.argmax(forward(W_BASE), axis=1) == LABELS))
    q = res["quality"]
    assert q["kind"] == "class_scores" and q["metric"] == "accuracy"
    assert q["baseline"] == pytest.approx(acc) and q["candidate"] == pytest.approx(acc)
    assert q["top1_agreement"] == 1.0 and q["max_abs_diff"] == 0.0 and q["drop"] == 0.0
    assert [lat["batch_size"] for lat in res["latency"]] == [1, 8]
    assert "PASS" in r.stdout and "accuracy" in r.stdout
    # the blessing lists the folder's files with their real SHA-256
    bless = json.loads((cand / "assets.extra" / "kiln_blessing.json").read_text())
    assert bless["format"] == "kiln-blessing-v1"
    files = [(f["path"], f["size"], f["sha256"]) for f in bless["files"]]
    assert files == sha256_files(cand)
    lines = "".join(f"sha256 {h} {s} {p}\n" for p, s, h in files)
    assert bless["digest"] == "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
    assert rep["blessing"]["digest"] == bless["digest"]
    assert bless["baseline"]["path"].endswith("base/1") and bless["summary"]["verdict"] == "pass"


def test_worse_candidate_fails_with_numpy_metrics(setup):
    cand = setup / "worse" / "2"
    save_classifier(cand / "model.onnx", W_WORSE)
    r, rep = gate(setup, cand)
    assert r.returncode == 1
    pb, pc = forward(W_BASE), forward(W_WORSE)
    acc_b = float(np.mean(np.argmax(pb, 1) == LABELS))
    acc_c = float(np.mean(np.argmax(pc, 1) == LABELS))
    assert acc_c < acc_b * 0.95, "the test's worse model must be measurably worse"
    q = rep["result"]["quality"]
    assert q["baseline"] == pytest.approx(acc_b) and q["candidate"] == pytest.approx(acc_c)
    assert q["drop"] == pytest.approx((acc_b - acc_c) / acc_b, rel=1e-6)
    assert q["top1_agreement"] == pytest.approx(float(np.mean(np.argmax(pb, 1) == np.argmax(pc, 1))))
    diff = np.abs(pc.astype(np.float64) - pb)
    assert q["mean_abs_diff"] == pytest.approx(diff.mean(), rel=1e-4)
    assert q["max_abs_diff"] == pytest.approx(diff.max(), rel=1e-4)
    rel = diff / np.maximum(np.abs(pb.astype(np.float64)), 1e-6)
    assert q["mean_rel_diff"] == pytest.approx(rel.mean(), rel=1e-3)
    assert rep["result"]["verdict"] == "fail"
    assert "accuracy drop" in r.stderr and "--max-drop" in r.stderr
    assert not (cand / "assets.extra" / "kiln_blessing.json").exists()
    assert rep["blessing"]["state"] == "none"
    # a generous --max-drop lets it through
    r, rep = gate(setup, cand, "--max-drop", "90%", "--no-bless")
    assert r.returncode == 0, r.stderr
    assert not (cand / "assets.extra" / "kiln_blessing.json").exists()


def test_without_labels_agreement_decides(setup):
    cand = setup / "worse" / "2"
    save_classifier(cand / "model.onnx", W_WORSE)
    r, rep = gate(setup, cand, "--no-bless", labels=False)
    agree = float(np.mean(np.argmax(forward(W_BASE), 1) == np.argmax(forward(W_WORSE), 1)))
    assert agree < 0.99
    q = rep["result"]["quality"]
    assert q["metric"] is None and q["top1_agreement"] == pytest.approx(agree)
    assert q["drop"] == pytest.approx(1 - agree)
    assert r.returncode == 1 and "disagreement" in r.stderr


def test_slow_candidate_fails_latency(setup):
    cand = setup / "slow" / "2"
    save_classifier(cand / "model.onnx", W_BASE, slow=12)
    r, rep = gate(setup, cand, "--batch-sizes", "8", "--max-p99-ms", "0.001", "--no-bless")
    assert r.returncode == 1
    assert "p99 latency at batch size 8" in r.stderr and "--max-p99-ms" in r.stderr
    lat = rep["result"]["latency"][0]
    assert lat["candidate"]["p50_ms"] > lat["baseline"]["p50_ms"]
    # same answers: quality passes, only latency failed
    assert rep["result"]["quality"]["drop"] == 0.0
    assert len(rep["result"]["reasons"]) == 1


def test_regression_rmse_and_jsonl_data(tmp_path):
    """y = 2x + 1 against y = 2.1x + 1, with float targets: RMSE and MAE as
    numpy computes them; the data as TF Serving predict bodies."""
    save_affine(tmp_path / "b" / "1" / "model.onnx", [2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    save_affine(tmp_path / "c" / "1" / "model.onnx", [2.1, 2.1, 2.1], [1.0, 1.0, 1.0])
    x = RNG.standard_normal((30, 3)).astype(np.float32)
    target = (2 * x + 1 + 0.05 * RNG.standard_normal((30, 3))).astype(np.float32)
    np.save(tmp_path / "t.npy", target)
    with open(tmp_path / "req.jsonl", "w") as f:
        for i in range(0, 30, 10):
            f.write(json.dumps({"instances": x[i:i + 10].tolist()}) + "\n")
    r = kiln("gate", tmp_path / "c" / "1", "--baseline", tmp_path / "b" / "1", "--data",
             tmp_path / "req.jsonl", "--labels", tmp_path / "t.npy", "--report", tmp_path / "r.json",
             "--runs", "5", "--max-drop", "1000%", "--no-bless")
    assert r.returncode == 0, r.stderr
    q = json.loads((tmp_path / "r.json").read_text())["result"]["quality"]
    yb = (x * np.float32(2.0) + np.float32(1.0)).astype(np.float64)
    yc = (x * np.float32(2.1) + np.float32(1.0)).astype(np.float64)
    t = target.astype(np.float64)
    assert q["kind"] == "values" and q["metric"] == "rmse"
    assert q["baseline"] == pytest.approx(np.sqrt(np.mean((yb - t) ** 2)), rel=1e-5)
    assert q["candidate"] == pytest.approx(np.sqrt(np.mean((yc - t) ** 2)), rel=1e-5)
    assert q["candidate_mae"] == pytest.approx(np.mean(np.abs(yc - t)), rel=1e-5)
    assert q["top1_agreement"] is None


def test_warmup_file_as_data(setup):
    """A TF Serving warmup file (TFRecord of PredictionLog) feeds the gate
    the same samples as the .npy folder: the same numpy accuracy."""
    cand = setup / "worse" / "2"
    save_classifier(cand / "model.onnx", W_WORSE)
    wf = setup / "tf_serving_warmup_requests"
    wf.write_bytes(tfrecord([predict_log({"x": X[i:i + 50]}) for i in range(0, N, 50)]))
    r = kiln("gate", cand, "--baseline", setup / "base" / "1", "--data", wf, "--labels",
             setup / "labels.npy", "--report", setup / "w.json", "--runs", "3", "--batch-sizes", "4",
             "--max-drop", "100%", "--no-bless")
    assert r.returncode == 0, r.stderr
    q = json.loads((setup / "w.json").read_text())["result"]["quality"]
    assert q["candidate"] == pytest.approx(float(np.mean(np.argmax(forward(W_WORSE), 1) == LABELS)))
    assert json.loads((setup / "w.json").read_text())["result"]["samples"] == N
    wf.write_bytes(tfrecord([predict_log({"y": X[:5]})]))
    r = kiln("gate", cand, "--baseline", setup / "base" / "1", "--data", wf)
    assert r.returncode == 1 and "record 0: no input 'x'" in r.stderr


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_data(setup, save):
    """An .npz archive (stored or deflated) reads as the .npy folder does."""
    cand = setup / "worse" / "2"
    save_classifier(cand / "model.onnx", W_WORSE)
    save(setup / "d.npz", x=X, unused=np.zeros(3))
    r = kiln("gate", cand, "--baseline", setup / "base" / "1", "--data", setup / "d.npz", "--labels",
             setup / "labels.npy", "--report", setup / "z.json", "--runs", "3", "--batch-sizes", "4",
             "--max-drop", "100%", "--no-bless")
    assert r.returncode == 0, r.stderr
    q = json.loads((setup / "z.json").read_text())["result"]["quality"]
    assert q["baseline"] == pytest.approx(float(np.mean(np.argmax(forward(W_BASE), 1) == LABELS)))
    assert q["candidate"] == pytest.approx(float(np.mean(np.argmax(forward(W_WORSE), 1) == LABELS)))
    save(setup / "e.npz", y=X)
    r = kiln("gate", cand, "--baseline", setup / "base" / "1", "--data", setup / "e.npz")
    assert r.returncode == 1 and "e.npz' has no array 'x' for input 'x'" in r.stderr
    save(setup / "f.npz", x=X.astype(np.int32))
    r = kiln("gate", cand, "--baseline", setup / "base" / "1", "--data", setup / "f.npz")
    assert r.returncode == 1 and "f.npz[x]" in r.stderr and "int32" in r.stderr


def test_savedmodel_and_tflite_half_plus_two(tmp_path):
    """TF Serving's half_plus_two / half_plus_three test models (shared test
    data): across formats, RMSE against targets x/2 + 2 computed here."""
    sm = TESTDATA / "savedmodels/serving/tensorflow_serving/servables/tensorflow/testdata"
    tl = TESTDATA / "tflite/serving/tensorflow_serving/servables/tensorflow/testdata"
    two, three = sm / "saved_model_half_plus_two_cpu/00000123", sm / "saved_model_half_plus_three/00000123"
    lite = tl / "saved_model_half_plus_two_tflite/00000123/model.tflite"
    for p in (two, three, lite):
        if not p.exists():
            pytest.skip(f"shared test data missing: {p}")
    (tmp_path / "d").mkdir()
    x = np.arange(10, dtype=np.float32).reshape(10, 1)
    np.save(tmp_path / "d" / "x.npy", x)
    np.save(tmp_path / "t.npy", x / 2 + 2)
    common = ["--data", tmp_path / "d", "--labels", tmp_path / "t.npy", "--runs", "3",
              "--batch-sizes", "1", "--no-bless", "--report", tmp_path / "r.json"]
    r = kiln("gate", three, "--baseline", two, *common)
    assert r.returncode == 1 and "rmse 0 -> 1" in r.stderr
    q = json.loads((tmp_path / "r.json").read_text())["result"]["quality"]
    assert q["baseline"] == 0.0 and q["candidate"] == pytest.approx(1.0) and q["drop"] is None
    r = kiln("gate", lite, "--baseline", two, *common)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "r.json").read_text())["result"]["quality"]["max_abs_diff"] == 0.0


def test_bad_data_and_signature_mismatch(setup):
    cand = setup / "c" / "2"
    shutil.copytree(setup / "base" / "1", cand)
    # the data's input has the wrong dtype
    bad = setup / "bad"
    bad.mkdir()
    np.save(bad / "x.npy", X.astype(np.float64))
    r = kiln("gate", cand, "--baseline", setup / "base" / "1", "--data", bad)
    assert r.returncode == 1 and "x.npy" in r.stderr and "'x'" in r.stderr and "float64" in r.stderr
    # no file for the input
    empty = setup / "empty"
    empty.mkdir()
    r = kiln("gate", cand, "--baseline", setup / "base" / "1", "--data", empty)
    assert r.returncode == 1 and "no x.npy for input 'x'" in r.stderr
    # a broken JSON line names the file and line
    (setup / "bad.jsonl").write_text('{"instances": [[1,2,3,4,5,6,7,8]]}\n{"instances": [[1,2]]}\n')
    r = kiln("gate", cand, "--baseline", setup / "base" / "1", "--data", setup / "bad.jsonl")
    assert r.returncode == 1 and "bad.jsonl line 2" in r.stderr
    # a baseline with another output name
    save_affine(setup / "aff" / "model.onnx", [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    r = kiln("gate", cand, "--baseline", setup / "aff" / "model.onnx", "--data", setup / "data")
    assert r.returncode == 1 and "signature mismatch" in r.stderr
    # a candidate that does not load
    (setup / "broken").mkdir()
    (setup / "broken" / "model.onnx").write_bytes(b"not a model")
    r = kiln("gate", setup / "broken", "--baseline", setup / "base" / "1", "--data", setup / "data")
    assert r.returncode == 1 and "broken" in r.stderr
    r = kiln("gate", cand, "--baseline", setup / "base" / "1", "--data", setup / "data",
             "--max-drop", "lots")
    assert r.returncode == 2


# ------------------------------------------------------------------ serving


VERSION_INFO = {"source_commit": "3f2a9c1", "data_version": "2026-11-30",
                "training_run": "run-481", "labels": {"team": "search"}}


def test_require_blessing_and_version_info(setup):
    models = setup / "served"
    # 1: blessed, with a kiln_version.json (written before the gate: it is hashed too)
    v1 = models / "1"
    shutil.copytree(setup / "base" / "1", v1)
    (v1 / "assets.extra").mkdir()
    (v1 / "assets.extra" / "kiln_version.json").write_text(json.dumps(VERSION_INFO))
    (setup / "base" / "1" / "assets.extra").mkdir()
    (setup / "base" / "1" / "assets.extra" / "kiln_version.json").write_text('{"training_run": "run-1"}')
    r, _ = gate(setup, v1)
    assert r.returncode == 0, r.stderr
    bless = json.loads((v1 / "assets.extra" / "kiln_blessing.json").read_text())
    assert bless["baseline"]["version_info"] == {"training_run": "run-1"}
    # 2: blessed, then its model replaced (stale)
    v2 = models / "2"
    shutil.copytree(setup / "base" / "1", v2)
    r, _ = gate(setup, v2)
    assert r.returncode == 0, r.stderr
    save_classifier(v2 / "model.onnx", W_WORSE)
    # 3: never blessed
    save_classifier(models / "3" / "model.onnx", W_BASE)
    srv = Server(models, "clf", "--require_blessing")
    try:
        code, st = srv.json("GET", "/v1/models/clf")
        assert code == 200
        by_v = {s["version"]: s for s in st["model_version_status"]}
        assert by_v["1"]["state"] == "AVAILABLE"
        # TF Serving's status JSON keeps its shape: no extra members
        assert set(by_v["1"]) == {"version", "state", "status"}
        assert by_v["2"]["state"] == "END" and by_v["3"]["state"] == "END"
        assert "stale blessing" in by_v["2"]["status"]["error_message"]
        assert "model.onnx" in by_v["2"]["status"]["error_message"]
        assert "not blessed" in by_v["3"]["status"]["error_message"]
        code, body = srv.json("POST", "/v1/models/clf:predict", {"instances": X[:2].tolist()})
        assert code == 200
        np.testing.assert_allclose(body["predictions"], forward(W_BASE)[:2], rtol=1e-5, atol=1e-6)
        # traceability: KServe v2 metadata, the console's JSON, the load log line
        code, meta = srv.json("GET", "/v2/models/clf")
        assert code == 200
        assert meta["parameters"] == {"source_commit": "3f2a9c1", "data_version": "2026-11-30",
                                      "training_run": "run-481", "label.team": "search"}
        code, stats = srv.json("GET", "/console/api/stats")
        assert code == 200
        vers = {v["version"]: v for v in stats["models"][0]["versions"]}
        assert vers["1"]["version_info"] == VERSION_INFO
        assert vers["1"]["blessing"].startswith("sha256:")
        assert "not blessed" in vers["3"]["error_message"]
        log = srv.logtext()
        line = [ln for ln in log.splitlines() if "event=load " in ln and "version=1" in ln]
        assert line and "version_info=" in line[0] and "3f2a9c1" in line[0]
        assert re.search(r"event=load_failed .*version=3.*not blessed", log)
        # blessing version 3 now makes the server load it at its next poll
        r, _ = gate(setup, models / "3")
        assert r.returncode == 0, r.stderr
        assert wait_for(lambda: {s["version"]: s["state"] for s in
                                 srv.json("GET", "/v1/models/clf")[1]["model_version_status"]}
                        .get("3") == "AVAILABLE", timeout=30), srv.logtext()
    finally:
        srv.kill()


from test_grpc import pb  # noqa: E402,F401  (the generated TF Serving modules, a fixture)


def test_version_info_in_grpc_metadata(setup, pb):  # noqa: F811
    """GetModelMetadata over gRPC (grpcio, TF Serving's own request and
    response types): a version with a kiln_version.json answers its
    signature_def as TF Serving does plus a "kiln_version_info" entry, a
    google.protobuf.StringValue holding the record as JSON; a version
    without one answers signature_def only; the entry can be asked for
    alone; an unknown field is still refused."""
    import grpc
    from google.protobuf import wrappers_pb2
    import test_grpc
    models = setup / "served"
    shutil.copytree(setup / "base" / "1", models / "1")
    shutil.copytree(setup / "base" / "1", models / "2")
    (models / "2" / "assets.extra").mkdir()
    (models / "2" / "assets.extra" / "kiln_version.json").write_text(json.dumps(VERSION_INFO))
    srv = test_grpc.Server(setup, [f'config {{ name: "clf" base_path: "{models}" model_platform: "onnx" '
                                   f'model_version_policy {{ all {{}} }} }}\n'])
    try:
        M = pb.meta_md.GetModelMetadataResponse
        meta = "/tensorflow.serving.PredictionService/GetModelMetadata"

        def ask(version, fields):
            req = pb.meta_md.GetModelMetadataRequest(metadata_field=fields)
            req.model_spec.name = "clf"
            req.model_spec.version.value = version
            return srv.call(meta, req, M)

        r = ask(2, ["signature_def"])
        assert set(r.metadata) == {"signature_def", "kiln_version_info"}
        assert r.model_spec.version.value == 2
        sdm = pb.meta_md.SignatureDefMap()
        assert r.metadata["signature_def"].Unpack(sdm)  # what TF Serving's clients read
        assert list(sdm.signature_def["serving_default"].inputs) == ["x"]
        info = wrappers_pb2.StringValue()
        assert r.metadata["kiln_version_info"].Is(wrappers_pb2.StringValue.DESCRIPTOR)
        assert r.metadata["kiln_version_info"].Unpack(info)
        assert json.loads(info.value) == VERSION_INFO
        r = ask(1, ["signature_def"])
        assert set(r.metadata) == {"signature_def"}
        r = ask(2, ["kiln_version_info"])
        assert set(r.metadata) == {"kiln_version_info"}
        with pytest.raises(grpc.RpcError) as e:
            ask(2, ["nope"])
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Metadata field nope is not supported" in e.value.details()
        # REST's metadata carries the same entry beside signature_def
        import urllib.request
        for v, want in ((2, VERSION_INFO), (1, None)):
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{srv.rest}/v1/models/clf/versions/{v}/metadata",
                    timeout=30) as resp:
                md = json.load(resp)["metadata"]
            assert "serving_default" in md["signature_def"]["signature_def"]
            assert md.get("kiln_version_info") == want, md
    finally:
        srv.kill()


def test_malformed_version_info_fails_the_load(setup):
    models = setup / "served"
    shutil.copytree(setup / "base" / "1", models / "1")
    v2 = models / "2"
    shutil.copytree(setup / "base" / "1", v2)
    (v2 / "assets.extra").mkdir()
    (v2 / "assets.extra" / "kiln_version.json").write_text('{"source_comit": "x"}')
    srv = Server(models, "clf")
    try:
        code, st = srv.json("GET", "/v1/models/clf/versions/2")
        assert code == 200
        s = st["model_version_status"][0]
        assert s["state"] == "END" and "source_comit" in s["status"]["error_message"]
        code, st = srv.json("GET", "/v1/models/clf/versions/1")
        assert st["model_version_status"][0]["state"] == "AVAILABLE"
        code, meta = srv.json("GET", "/v2/models/clf")
        assert "parameters" not in meta
    finally:
        srv.kill()
