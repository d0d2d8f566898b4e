"""End-to-end tests for shadow traffic (src/serve/shadow/, docs/SHADOW.md):
a real `kiln serve` on loopback with a rollout file whose shadow blocks send
requests of a teacher to a student, to an identical copy, to a target that
fails, to a slow target behind a one-slot queue, and to a labelled version of
the same model. Every statistic the server reports (top-1 agreement, mean
absolute and relative difference, Jensen-Shannon divergence) is checked
against numpy computed from the same inputs with the models' own weights;
the primary's response is checked to be byte-identical with and without a
shadow. A short load run (wrk, 64 connections) reports the primary's p99
with and without the shadow; it asserts no timing (the machine is shared).
"""

import json
import os
import re
import shutil
import subprocess
import time

import numpy as np
import pytest

import test_serve
from test_serve import KILN, PROMETHEUS, free_port, wait_for

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = test_serve.pytestmark

FEATURES, CLASSES = 4, 3
# teacher logits: features 0, 1, 2 (times 2); student logits: features 0, 1, 3 (times 1.5)
W_TEACHER = np.zeros((FEATURES, CLASSES), np.float32)
W_TEACHER[0, 0] = W_TEACHER[1, 1] = W_TEACHER[2, 2] = 2.0
W_STUDENT = np.zeros((FEATURES, CLASSES), np.float32)
W_STUDENT[0, 0] = W_STUDENT[1, 1] = W_STUDENT[3, 2] = 1.5


def save_softmax(path, w, features=FEATURES):
    """probs = Softmax(x @ w) over float32 [batch, features]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", w.shape[1]])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    g = helper.make_graph(nodes, "softmax", [x], [y], [numpy_helper.from_array(w, "w")])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def save_slow(path, width=768, depth=24):
    """A slow target: x [batch, 4] through `depth` Tanh(MatMul(., W)) of width
    `width` (one shared weight), then Softmax over 3 classes."""
    rng = np.random.default_rng(7)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", CLASSES])
    inits = [numpy_helper.from_array(rng.standard_normal((FEATURES, width)).astype(np.float32), "w0"),
             numpy_helper.from_array((rng.standard_normal((width, width)) / width ** 0.5)
                                     .astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((width, CLASSES)).astype(np.float32), "wo")]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"])]
    for i in range(depth):
        nodes += [helper.make_node("MatMul", [f"h{i}", "w"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"])]
    nodes += [helper.make_node("MatMul", [f"h{depth}", "wo"], ["logits"]),
              helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    g = helper.make_graph(nodes, "slow", [x], [y], inits)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def inputs(n_agree, n_disagree, seed=1):
    """Rows on which teacher and student agree on the top-1 (the largest of
    features 0 and 1 wins for both, by a margin) and rows on which they do
    not (feature 2 wins for the teacher, feature 3 is the smallest for the
    student). Returns rows in a shuffled order."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_agree):
        hi = rng.uniform(1.0, 2.0)
        r = rng.uniform(-1.0, hi - 0.5, FEATURES)
        r[rng.integers(0, 2)] = hi
        rows.append(r)
    for _ in range(n_disagree):
        r = rng.uniform(-1.0, 0.5, FEATURES)
        r[2] = rng.uniform(1.0, 2.0)
        r[3] = min(r[0], r[1]) - rng.uniform(0.3, 1.0)
        rows.append(r)
    x = np.array(rows, np.float32)
    return x[rng.permutation(len(x))]


def reference_stats(p, s):
    """The statistics docs/SHADOW.md defines, in numpy (float64)."""
    p, s = p.astype(np.float64), s.astype(np.float64)
    d = np.abs(s - p)
    m = np.maximum(np.abs(p), np.abs(s))
    rel = np.where(m > 0, d / np.where(m > 0, m, 1.0), 0.0)
    pn, sn = p / p.sum(1, keepdims=True), s / s.sum(1, keepdims=True)
    mid = (pn + sn) / 2

    def kl(a):
        return np.sum(np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0) / mid), 0.0), axis=1)

    js = 0.5 * kl(pn) + 0.5 * kl(sn)
    return {"top1_agreement": float(np.mean(p.argmax(1) == s.argmax(1))),
            "mean_abs_diff": float(d.mean()), "mean_rel_diff": float(rel.mean()),
            "max_abs_diff": float(d.max()), "js_divergence": float(js.mean())}


MODEL_CONFIG = """
model_config_list {
  config { name: "teacher" base_path: "%(root)s/teacher" }
  config { name: "student" base_path: "%(root)s/student" }
  config { name: "twin_primary" base_path: "%(root)s/teacher" }
  config { name: "twin" base_path: "%(root)s/teacher" }
  config { name: "bad_primary" base_path: "%(root)s/teacher" }
  config { name: "bad" base_path: "%(root)s/bad" }
  config { name: "slow_primary" base_path: "%(root)s/teacher" }
  config { name: "slow" base_path: "%(root)s/slow" }
  config { name: "sampled" base_path: "%(root)s/teacher" }
  config {
    name: "vt"
    base_path: "%(root)s/vt"
    model_version_policy { all {} }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "candidate" value: 2 }
  }
}
"""

ROLLOUT = """
# each primary and its shadow
model_rollouts { model_name: "teacher" shadow { target_model: "student" fraction: 1.0 } }
model_rollouts { model_name: "twin_primary" shadow { target_model: "twin" fraction: 1 compare: "probabilities" } }
model_rollouts { model_name: "bad_primary" shadow { target_model: "bad" fraction: 1 } }
model_rollouts { model_name: "slow_primary" shadow { target_model: "slow" fraction: 1 queue_size: 1 } }
model_rollouts { model_name: "sampled" shadow { target_model: "twin" fraction: 0.25 } }
model_rollouts { model_name: "vt" shadow { target_label: "candidate" fraction: 1 output: "probs" } }
"""


class ShadowServer(test_serve.Server):
    """kiln serve from a model config file, with the Prometheus page and,
    unless rollout is None, a rollout file."""

    def __init__(self, root, rollout, *extra):  # noqa: D107
        self.port = free_port()
        tag = "shadow" if rollout else "plain"
        self.log = open(root / f"{tag}.log", "w+")
        mon = root / "monitoring.config"
        mon.write_text(PROMETHEUS)
        args = [KILN, "serve", f"--model_config_file={root / 'models.config'}",
                f"--rest_api_port={self.port}", "--rest_api_address=127.0.0.1", "--port=0",
                "--rest_api_num_threads=16", f"--monitoring_config_file={mon}", *extra]
        if rollout is not None:
            (root / "rollout.config").write_text(rollout)
            args.append(f"--rollout_config_file={root / 'rollout.config'}")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_ready()

    def predict(self, model, x, version=None):
        path = f"/v1/models/{model}" + (f"/versions/{version}" if version else "") + ":predict"
        code, data, _ = self.request("POST", path, {"instances": x.tolist()})
        assert code == 200, data
        return data

    def shadow(self, model):
        code, body = self.json("GET", f"/v1/shadow/{model}")
        assert code == 200, body
        return body

    def settled(self, model, timeout=60):
        """The model's shadow view once every sampled request is accounted for."""
        def done():
            b = self.shadow(model)
            r = b["requests"]
            return b["queue_depth"] == 0 and r["compared"] + r["dropped"] + r["failed"] == r["sampled"]
        assert wait_for(done, timeout), self.shadow(model)
        return self.shadow(model)

    def metrics(self):
        code, data, _ = self.request("GET", "/monitoring/prometheus/metrics")
        assert code == 200
        return data.decode()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("shadow")
    save_softmax(root / "teacher" / "1" / "model.onnx", W_TEACHER)
    save_softmax(root / "student" / "1" / "model.onnx", W_STUDENT)
    save_softmax(root / "bad" / "1" / "model.onnx", np.ones((5, CLASSES), np.float32), features=5)
    save_slow(root / "slow" / "1" / "model.onnx")
    save_softmax(root / "vt" / "1" / "model.onnx", W_TEACHER)
    save_softmax(root / "vt" / "2" / "model.onnx", W_STUDENT)
    (root / "models.config").write_text(MODEL_CONFIG % {"root": root})
    return root


@pytest.fixture(scope="module")
def srv(models):
    s = ShadowServer(models, ROLLOUT)
    yield s
    s.kill()


def check_stats(got, want, rows):
    assert got["rows"] == rows and got["top1_rows"] == rows and got["js_rows"] == rows
    assert got["values"] == rows * CLASSES and got["non_probability_rows"] == 0
    assert got["top1_agreement"] == pytest.approx(want["top1_agreement"], abs=1e-12)
    for k in ("mean_abs_diff", "mean_rel_diff", "max_abs_diff"):
        assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-7), k
    assert got["js_divergence"] == pytest.approx(want["js_divergence"], rel=1e-3, abs=1e-8)


def test_teacher_student(srv):
    x = inputs(48, 16)  # top-1 agrees on 48 of 64 rows by construction
    batches = [x[i:i + 4] for i in range(0, len(x), 4)]
    primary = np.concatenate([np.array(json.loads(srv.predict("teacher", b))["predictions"])
                              for b in batches])
    teacher, student = softmax(x.astype(np.float64) @ W_TEACHER), softmax(x.astype(np.float64) @ W_STUDENT)
    np.testing.assert_allclose(primary, teacher, rtol=1e-5, atol=1e-6)  # the primary is the teacher
    want = reference_stats(teacher, student)
    assert want["top1_agreement"] == 0.75
    b = srv.settled("teacher")
    assert b["target"] == "student" and b["compare"] == "auto" and b["fraction"] == 1
    assert b["requests"] == {"seen": 16, "sampled": 16, "compared": 16, "dropped": 0, "failed": 0}
    check_stats(b["since_start"], want, 64)
    check_stats(b["window"], want, 64)
    assert b["since_start"]["requests"] == 16 and len(b["recent"]) == 16
    assert b["recent"][0]["primary_version"] == 1 and b["recent"][0]["target_version"] == 1
    assert b["last_error"] is None
    # the Prometheus page: the names docs/SHADOW.md lists, window values
    m = srv.metrics()
    lab = 'model_name="teacher",target="student"'
    assert f'kiln_shadow_requests_total{{{lab},outcome="compared"}} 16' in m
    assert f'kiln_shadow_requests_total{{{lab},outcome="dropped"}} 0' in m
    assert 'kiln_shadow_queue_depth{model_name="teacher"} 0' in m
    for name, key in (("top1_agreement", "top1_agreement"), ("mean_abs_diff", "mean_abs_diff"),
                      ("js_divergence", "js_divergence"), ("mean_rel_diff", "mean_rel_diff")):
        v = float(re.search(rf"^kiln_shadow_{name}\{{{lab}\}} (\S+)$", m, re.M).group(1))
        assert v == pytest.approx(want[key], rel=1e-3, abs=1e-8), name
    p99 = float(re.search(r'^kiln_shadow_added_latency_us\{model_name="teacher"\} (\S+)$', m,
                          re.M).group(1))
    assert 0 < p99 < 1e6
    assert b["added_latency_us"]["count"] == 16
    # the whole list names every shadowed model
    code, all_ = srv.json("GET", "/v1/shadow")
    assert code == 200
    assert sorted(e["model_name"] for e in all_["shadows"]) == sorted(
        ["teacher", "twin_primary", "bad_primary", "slow_primary", "sampled", "vt"])


def test_identical_copy(srv):
    x = inputs(20, 12, seed=2)
    for i in range(0, len(x), 8):
        srv.predict("twin_primary", x[i:i + 8])
    b = srv.settled("twin_primary")
    s = b["since_start"]
    assert b["requests"]["compared"] == 4 and b["compare"] == "probabilities"
    assert s["rows"] == 32 and s["top1_agreement"] == 1.0
    assert s["mean_abs_diff"] == 0 and s["mean_rel_diff"] == 0 and s["js_divergence"] == 0


def test_version_label_of_same_model(srv):
    x = inputs(30, 10, seed=3)
    for i in range(0, len(x), 5):
        srv.predict("vt", x[i:i + 5], version=1)  # the teacher; the shadow is label candidate
    b = srv.settled("vt")
    assert b["target"] == "vt/labels/candidate" and b["output"] == "probs"
    want = reference_stats(softmax(x.astype(np.float64) @ W_TEACHER),
                           softmax(x.astype(np.float64) @ W_STUDENT))
    assert want["top1_agreement"] == 0.75
    check_stats(b["since_start"], want, 40)
    assert b["recent"][0]["primary_version"] == 1 and b["recent"][0]["target_version"] == 2


def test_failing_target_counts_and_primary_answers(srv):
    x = inputs(3, 1, seed=4)
    want = json.loads(srv.predict("teacher", x))  # the same model, unshadowed answer
    for _ in range(5):
        assert json.loads(srv.predict("bad_primary", x)) == want
    b = srv.settled("bad_primary")
    assert b["requests"]["failed"] == 5 and b["requests"]["compared"] == 0
    assert "bad" in b["last_error"] and "failed" in b["last_error"]
    assert 'kiln_shadow_requests_total{model_name="bad_primary",target="bad",outcome="failed"} 5' \
        in srv.metrics()
    assert b["since_start"]["top1_agreement"] is None  # nothing compared: no ratio


def test_full_queue_drops_and_counts(srv):
    """A one-slot queue in front of a slow target: a burst from 8 clients
    fills it; every sampled request ends compared or dropped, and the
    primary answers all of them."""
    import concurrent.futures as cf
    x = inputs(4, 0, seed=5)
    n = 120
    with cf.ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda _: srv.predict("slow_primary", x), range(n)))
    b = srv.settled("slow_primary")
    r = b["requests"]
    assert r["sampled"] == n and r["dropped"] > 0 and r["compared"] >= 1
    assert r["compared"] + r["dropped"] == n and r["failed"] == 0
    assert b["queue_size"] == 1
    assert (f'kiln_shadow_requests_total{{model_name="slow_primary",target="slow",'
            f'outcome="dropped"}} {r["dropped"]}') in srv.metrics()


def test_fraction_samples(srv):
    x = inputs(1, 0, seed=6)
    for _ in range(400):
        srv.predict("sampled", x)
    r = srv.settled("sampled")["requests"]
    # binomial(400, 0.25): mean 100, sd 8.7; 5 sd either side
    assert r["seen"] == 400 and 57 <= r["sampled"] <= 143, r
    assert r["compared"] == r["sampled"]


def test_unknown_model_and_method(srv):
    code, body = srv.json("GET", "/v1/shadow/nope")
    assert code == 404 and "nope" in body["error"]
    code, _, _ = srv.request("POST", "/v1/shadow", "{}")
    assert code == 400  # TF Serving's rule: anything else under /v1/ is malformed


def test_primary_byte_identical_without_shadow(models, srv):
    x = inputs(6, 2, seed=8)
    plain = ShadowServer(models, None)
    try:
        for model in ("teacher", "twin_primary", "bad_primary", "vt"):
            assert plain.predict(model, x) == srv.predict(model, x), model
        code, body = plain.json("GET", "/v1/shadow")
        assert code == 200 and body == {"shadows": []}
    finally:
        plain.kill()


def test_grpc_predict_is_shadowed(models, tmp_path, tmp_path_factory):
    """gRPC Predict passes the same observer: the teacher's gRPC requests are
    compared with the student's answers, against numpy."""
    tg = pytest.importorskip("test_grpc")
    gen = tg.pb.__pytest_wrapped__.obj(tmp_path_factory)  # the generated TF Serving messages
    pb = next(gen)
    rollout = tmp_path / "rollout.config"
    rollout.write_text('model_rollouts { model_name: "teacher" shadow { target_model: "student" '
                       'fraction: 1 } }\n')
    s = tg.Server(tmp_path, [tg.model_line("teacher", models / "teacher"),
                             tg.model_line("student", models / "student")],
                  f"--rollout_config_file={rollout}")
    try:
        x = inputs(12, 4, seed=10)
        for i in range(0, len(x), 8):
            req = tg.predict_request(pb, "teacher", {"x": tg.tensor_content(pb, x[i:i + 8], 1)})
            r = s.call(tg.PS + "Predict", req, pb.predict.PredictResponse)
            got = tg.to_numpy(pb, r.outputs["probs"])
            np.testing.assert_allclose(got, softmax(x[i:i + 8].astype(np.float64) @ W_TEACHER),
                                       rtol=1e-5, atol=1e-6)

        def view():
            code, body = s.http("GET", "/v1/shadow/teacher")
            assert code == 200, body
            return json.loads(body)
        assert wait_for(lambda: view()["requests"]["compared"] == 2, 30), view()
        want = reference_stats(softmax(x.astype(np.float64) @ W_TEACHER),
                               softmax(x.astype(np.float64) @ W_STUDENT))
        check_stats(view()["since_start"], want, 16)
        assert want["top1_agreement"] == 0.75
    finally:
        s.kill()
        next(gen, None)


def test_sigterm_with_shadow_work_pending(models, tmp_path):
    """SIGTERM while the slow target still has work queued: the worker
    finishes its run, everything is freed (the sanitizer build checks for
    leaks at exit) and the server exits 0."""
    import signal
    (tmp_path / "models.config").write_text(
        f'model_config_list {{ config {{ name: "slow_primary" base_path: "{models}/teacher" }}\n'
        f'  config {{ name: "slow" base_path: "{models}/slow" }} }}\n')
    s = ShadowServer(tmp_path, 'model_rollouts { model_name: "slow_primary" shadow { '
                               'target_model: "slow" fraction: 1 queue_size: 4 } }\n')
    try:
        x = inputs(8, 0, seed=11)
        for _ in range(6):
            s.predict("slow_primary", x)
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=60) == 0, s.logtext()
        assert "Sanitizer" not in s.logtext(), s.logtext()
    finally:
        s.kill()


@pytest.mark.parametrize("block,msg", [
    # the rollout loader checks ranges first (src/serve/rollout/config.c)
    ("shadow { target_model: 'student' fraction: 1.5 }", "shadow.fraction = 1.5: must be in [0, 1]"),
    ("shadow { target_model: 'student' fraction: 1 compare: 'softmax' }", "shadow.compare 'softmax'"),
    ("shadow { queue_size: -1 }", "shadow.queue_size = -1: must be >= 0"),
    ("shadow { target_version: 2 target_label: 'x' }", "both target_version and target_label"),
    ("shadow { fraction: 0.1 } shadow { fraction: 0.2 }", "line 1"),  # the text parser
])
def test_bad_rollout_file(models, block, msg):
    path = models / "bad_rollout.config"
    path.write_text(f"model_rollouts {{ model_name: 'teacher' {block} }}\n")
    small = models / "teacher_only.config"
    small.write_text(f"model_config_list {{ config {{ name: 'teacher' base_path: '{models}/teacher' }} }}")
    r = subprocess.run([KILN, "serve", f"--model_config_file={small}",
                        f"--rest_api_port={free_port()}", "--rest_api_address=127.0.0.1", "--port=0",
                        f"--rollout_config_file={path}"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and msg in r.stderr, r.stderr
    assert "teacher" in r.stderr or "line" in r.stderr


# ------------------------------------------------------------------ load (reported, not asserted)


def wrk_p99_us(port, model, x, seconds):
    script = f"""
wrk.method = "POST"
wrk.body = '{json.dumps({"instances": x.tolist()})}'
wrk.headers["Content-Type"] = "application/json"
"""
    path = f"/tmp/kiln_shadow_wrk_{port}.lua"
    with open(path, "w") as f:
        f.write(script)
    out = subprocess.run(["wrk", "-t4", "-c64", f"-d{seconds}s", "--latency", "-s", path,
                          f"http://127.0.0.1:{port}/v1/models/{model}:predict"],
                         capture_output=True, text=True, timeout=seconds + 30).stdout
    m = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    assert m, out
    scale = {"us": 1.0, "ms": 1e3, "s": 1e6}[m.group(2)]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return float(m.group(1)) * scale, rps


def test_load_p99_with_and_without_shadow(tmp_path, record_property, capsys):
    """The MLP (models/digits) under 64 connections, on a server whose
    rollout file shadows every request (fraction 1) to an identical copy and
    on one without a shadow, alternated twice for 2 s each. The primary's
    p99 ratio is printed and recorded, not asserted: the machine is shared."""
    if not shutil.which("wrk"):
        pytest.skip("wrk not installed")
    if not test_serve.DIGITS.exists():
        pytest.skip("models/digits/1/model.onnx missing")
    base = test_serve.DIGITS.parent.parent
    (tmp_path / "models.config").write_text(
        f'model_config_list {{ config {{ name: "mlp" base_path: "{base}" }}\n'
        f'  config {{ name: "mlp_twin" base_path: "{base}" }} }}\n')
    rollout = 'model_rollouts { model_name: "mlp" shadow { target_model: "mlp_twin" fraction: 1 } }\n'
    x = np.random.default_rng(9).uniform(0, 16, (1, 64)).astype(np.float32)
    runs = {"without": [], "with": []}
    added = None
    for _ in range(2):
        for kind in ("without", "with"):
            s = ShadowServer(tmp_path, rollout if kind == "with" else None)
            try:
                runs[kind].append(wrk_p99_us(s.port, "mlp", x, 2))
                if kind == "with":
                    added = s.shadow("mlp")
            finally:
                s.kill()
    p99 = {k: float(np.median([r[0] for r in v])) for k, v in runs.items()}
    rps = {k: float(np.median([r[1] for r in v])) for k, v in runs.items()}
    req = added["requests"]
    line = (f"shadow load (digits MLP, 64 connections, fraction 1): primary p99 {p99['without']:.0f} us "
            f"without, {p99['with']:.0f} us with (ratio {p99['with'] / p99['without']:.3f}); "
            f"{rps['without']:.0f} vs {rps['with']:.0f} req/s; after hook p50 "
            f"{added['added_latency_us']['p50']} us p99 {added['added_latency_us']['p99']} us; "
            f"shadow compared {req['compared']} dropped {req['dropped']} of {req['sampled']}")
    record_property("shadow_load", line)
    with capsys.disabled():
        print("\n" + line)


def test_reload_applies_shadow_blocks(models, tmp_path):
    """The rollout loader re-reads the file and the shadow follows: a block
    added while serving starts sampling, without a restart."""
    root = tmp_path
    for name in ("teacher", "student"):
        shutil.copytree(models / name, root / name)
    (root / "models.config").write_text(
        'model_config_list {\n'
        f'  config {{ name: "teacher" base_path: "{root}/teacher" }}\n'
        f'  config {{ name: "student" base_path: "{root}/student" }}\n'
        '}\n')
    s = ShadowServer(root, 'model_rollouts { model_name: "student" }\n',
                     "--rollout_config_file_poll_wait_seconds=1")
    try:
        x = inputs(3, 1)
        s.predict("teacher", x)
        code, _ = s.json("GET", "/v1/shadow/teacher")
        assert code == 404  # no shadow for the teacher yet
        rollout = root / "rollout.config"
        rollout.write_text('model_rollouts { model_name: "teacher" '
                           'shadow { target_model: "student" fraction: 1 } }\n')
        os.utime(rollout, (time.time() + 5, time.time() + 5))  # a different mtime, surely
        assert wait_for(lambda: s.json("GET", "/v1/shadow/teacher")[0] == 200, 30)
        s.predict("teacher", x)
        b = s.settled("teacher")
        assert b["requests"]["compared"] == 1
        teacher, student = softmax(x.astype(np.float64) @ W_TEACHER), softmax(x.astype(np.float64) @ W_STUDENT)
        want = reference_stats(teacher, student)
        assert b["since_start"]["top1_agreement"] == pytest.approx(want["top1_agreement"], abs=1e-12)
    finally:
        s.kill()
