"""End-to-end tests for `kiln serve --rollout_config_file` (docs/ROLLOUTS.md):
traffic splits on REST, KServe v2 and gRPC, sticky routing, canaries that
promote or roll back on their gates, a restart that resumes, the admin
endpoints, reloads and refused files.

The models are built here with onnx.helper in TF Serving's layout: version v
of an affine model computes y = x * v, so every answer says which version
served it. An erroring candidate reshapes its input to one row (a request
with two rows fails at run time, as a model with a wrong fixed shape does);
a slow candidate multiplies a 256 x 256 matrix made from the input by itself
eight times. Traffic comes from a bounded driver (a few client threads, a
cap on requests and on time) on loopback. Expected shares are checked
against binomial bounds computed here; gate outcomes against the configured
thresholds and the reasons the server gives.
"""

import http.client
import json
import math
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

import test_serve
from test_serve import KILN, free_port

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = test_serve.pytestmark

# ------------------------------------------------------------------ models


def _save(path, nodes, inits, name):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    g = helper.make_graph(nodes, name, [x], [y], inits)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def save_scale(path, a):
    """y = x * a."""
    _save(path, [helper.make_node("Mul", ["x", "a"], ["y"])],
          [numpy_helper.from_array(np.array(a, np.float32), "a")], "scale")


def save_one_row(path, a):
    """y = reshape(x * a, [1, 3]): fails at run time for two rows."""
    _save(path, [helper.make_node("Mul", ["x", "a"], ["t"]),
                 helper.make_node("Reshape", ["t", "shape"], ["y"])],
          [numpy_helper.from_array(np.array(a, np.float32), "a"),
           numpy_helper.from_array(np.array([1, 3], np.int64), "shape")], "one_row")


def save_softmax(path, a):
    """y = softmax(x * a) over the last axis: a probability row per input row."""
    _save(path, [helper.make_node("Mul", ["x", "a"], ["t"]),
                 helper.make_node("Softmax", ["t"], ["y"], axis=-1)],
          [numpy_helper.from_array(np.array(a, np.float32), "a")], "softmax")


def save_slow(path, a, layers=8, n=256):
    """y = x * a + 0 * f(x), where f multiplies an n x n matrix made from x by
    itself `layers` times (input-dependent, so nothing folds away)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(a, np.float32), "a"),
             numpy_helper.from_array((rng.standard_normal((3, n * n)) * 0.01).astype(np.float32), "w0"),
             numpy_helper.from_array(np.array([n, n], np.int64), "sq"),
             numpy_helper.from_array(np.zeros((n, 3), np.float32), "wout")]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"]),
             helper.make_node("Reshape", ["h0", "sq"], ["m0"])]
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [f"m{i}", f"m{i}"], [f"p{i}"]),
                  helper.make_node("Tanh", [f"p{i}"], [f"m{i + 1}"])]
    nodes += [helper.make_node("MatMul", [f"m{layers}", "wout"], ["z"]),  # zeros [n, 3]
              helper.make_node("ReduceSum", ["z"], ["zs"], axes=[0], keepdims=1),  # [1, 3]
              helper.make_node("Mul", ["x", "a"], ["t"]),
              helper.make_node("Add", ["t", "zs"], ["y"])]
    _save(path, nodes, inits, "slow")


# ------------------------------------------------------------------ server


class Rollout(test_serve.Server):
    """kiln serve with a model config file and a rollout file."""

    def __init__(self, root, models, rollout, *extra, address="127.0.0.1", grpc_port=0,
                 log_name="server.log"):
        self.root = root
        self.port = free_port()
        self.grpc = grpc_port
        cfg = root / "models.config"
        cfg.write_text("model_config_list {\n" + "".join(
            f'config {{ name: "{m}" base_path: "{root / m}" model_platform: "onnx" '
            f'model_version_policy {{ all {{}} }} }}\n' for m in models) + "}\n")
        self.rollout = root / "rollout.config"
        if rollout is not None:
            self.rollout.write_text(rollout)
        mon = root / "monitoring.config"
        mon.write_text(test_serve.PROMETHEUS)
        self.log = open(root / log_name, "a+")
        self.proc = subprocess.Popen(
            [KILN, "serve", f"--model_config_file={cfg}", f"--rest_api_port={self.port}",
             f"--rest_api_address={address}", "--rest_api_num_threads=8",
             f"--port={grpc_port}", f"--monitoring_config_file={mon}",
             f"--rollout_config_file={self.rollout}", "--rollout_config_file_poll_wait_seconds=1",
             "--file_system_poll_wait_seconds=1", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_ready()

    def rollouts(self, model=None):
        code, body = self.json("GET", "/v1/rollouts" + (f"/{model}" if model else ""))
        assert code == 200, body
        return body

    def metrics(self):
        return self.request("GET", "/monitoring/prometheus/metrics")[1].decode()

    def events(self):
        out = []
        for line in self.logtext().splitlines():
            if line.startswith("{") and '"component":"rollout"' in line:
                out.append(json.loads(line))
        return out


def predict(port, rows, path, headers=None, conn=None):
    """Which version answered (y / x of the first value), or None on an error."""
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", path, body=json.dumps({"instances": rows}),
              headers={"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    data = r.read()
    if conn is None:
        c.close()
    if r.status != 200:
        return None
    return round(json.loads(data)["predictions"][0][0] / rows[0][0])


class Driver:
    """Bounded traffic: `threads` clients send predict requests (one row, or
    two rows every `two_rows_every`-th request) to the model's default
    version until stop() or until `max_requests` or `max_seconds`."""

    def __init__(self, port, model, threads=6, max_requests=30000, max_seconds=90, two_rows_every=0,
                 rows_fn=None):
        self.ports = port if isinstance(port, list) else [port]  # several: round robin
        self.model = model
        self.stopped = threading.Event()
        self.sent = 0
        self.answers = {}
        self.lock = threading.Lock()
        self.max_requests, self.deadline = max_requests, time.time() + max_seconds
        self.two = two_rows_every
        self.rows_fn = rows_fn  # i -> the rows of request i (default: [1, 2, 3])
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self):
        conns = {p: http.client.HTTPConnection("127.0.0.1", p, timeout=60) for p in self.ports}
        while not self.stopped.is_set() and time.time() < self.deadline:
            with self.lock:
                if self.sent >= self.max_requests:
                    break
                self.sent += 1
                i = self.sent
            port = self.ports[i % len(self.ports)]
            if self.rows_fn:
                rows = self.rows_fn(i)
            else:
                rows = [[1.0, 2.0, 3.0]] * (2 if self.two and i % self.two == 0 else 1)
            try:
                v = predict(port, rows, f"/v1/models/{self.model}:predict", conn=conns[port])
            except (OSError, http.client.HTTPException):
                conns[port].close()
                conns[port] = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                continue
            with self.lock:
                self.answers[v] = self.answers.get(v, 0) + 1
        for c in conns.values():
            c.close()

    def stop(self):
        self.stopped.set()
        for t in self.threads:
            t.join(timeout=60)


def wait_state(srv, model, pred, timeout=90, driver=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = srv.rollouts(model)
        if pred(st):
            return st
        time.sleep(0.2)
    raise AssertionError(f"rollout of {model} did not get there in {timeout} s: {st}\n"
                         f"driver: {driver and driver.answers}\n{srv.logtext()[-3000:]}")


def binomial_ok(k, n, p, sds=5.0):
    return abs(k - n * p) <= sds * math.sqrt(n * p * (1 - p))


# ------------------------------------------------------------------ splits

SPLIT = """
route_key_header: "X-User"
model_rollouts {
  model_name: "split"
  split { version: 1 weight: 70 }
  split { version: 2 weight: 30 }
  sticky: true
}
"""


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    root = tmp_path_factory.mktemp("split")
    for v in (1, 2, 3):
        save_scale(root / "split" / str(v) / "model.onnx", float(v))
    s = Rollout(root, ["split"], SPLIT, grpc_port=free_port())
    yield s
    s.kill()


def test_split_rest_shares_and_explicit_versions(split):
    n = 1500
    conn = http.client.HTTPConnection("127.0.0.1", split.port, timeout=60)
    got = [predict(split.port, [[1.0, 2.0, 3.0]], "/v1/models/split:predict", conn=conn)
           for _ in range(n)]
    assert set(got) == {1, 2}, set(got)  # version 3 (the default, newest) gets nothing
    assert binomial_ok(got.count(2), n, 0.3), got.count(2)
    for v in (1, 2, 3):  # a request that names its version goes there
        assert all(predict(split.port, [[1.0, 2.0, 3.0]], f"/v1/models/split/versions/{v}:predict",
                           conn=conn) == v for _ in range(20))
    conn.close()
    st = split.rollouts("split")
    assert st["kind"] == "split" and st["state"] == "none"
    assert {w["version"]: round(w["weight"], 6) for w in st["weights"]} == {1: 0.7, 2: 0.3}
    m = split.metrics()
    assert re.search(r'kiln_rollout_weight\{model_name="split",version="2"\} 0\.3\b', m), m
    ok = re.search(r'kiln_rollout_requests_total\{model_name="split",version="2",outcome="ok"\} (\d+)', m)
    assert ok and int(ok.group(1)) >= got.count(2) + 20, m


def test_split_sticky(split):
    conn = http.client.HTTPConnection("127.0.0.1", split.port, timeout=60)
    first = {}
    for k in range(300):
        key = f"user-{k}"
        vs = {predict(split.port, [[1.0, 1.0, 1.0]], "/v1/models/split:predict", {"X-User": key}, conn)
              for _ in range(3)}
        assert len(vs) == 1, (key, vs)  # one user keeps one version
        first[key] = vs.pop()
    conn.close()
    # keys hash across the split in its proportions
    assert binomial_ok(list(first.values()).count(2), 300, 0.3), first


def test_split_kserve_v2(split):
    n = 800
    conn = http.client.HTTPConnection("127.0.0.1", split.port, timeout=60)
    got = []
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32",
                                   "data": [1.0, 2.0, 3.0]}]})
    for _ in range(n):
        conn.request("POST", "/v2/models/split/infer", body=body)
        r = conn.getresponse()
        out = json.loads(r.read())
        assert r.status == 200, out
        got.append(round(out["outputs"][0]["data"][0]))
    conn.close()
    assert set(got) == {1, 2} and binomial_ok(got.count(2), n, 0.3), got.count(2)


def test_split_grpc(split):
    grpc = pytest.importorskip("grpc")
    import test_grpc
    pb = next(test_grpc.pb.__wrapped__(_TmpFactory(split.root)))
    ch = grpc.insecure_channel(f"127.0.0.1:{split.grpc}")
    fn = ch.unary_unary("/tensorflow.serving.PredictionService/Predict",
                        request_serializer=lambda m: m.SerializeToString(),
                        response_deserializer=pb.predict.PredictResponse.FromString)
    req = test_grpc.predict_request(pb, "split", {"x": test_grpc.tensor_content(
        pb, np.array([[1, 2, 3]], np.float32), pb.types.DT_FLOAT)})

    def version_of(resp):
        return round(np.frombuffer(resp.outputs["y"].tensor_content, np.float32)[0]
                     if resp.outputs["y"].tensor_content else resp.outputs["y"].float_val[0])

    n = 800
    got = [version_of(fn(req, timeout=30)) for _ in range(n)]
    assert set(got) == {1, 2} and binomial_ok(got.count(2), n, 0.3), got.count(2)
    for k in range(40):  # sticky on gRPC metadata (the header's name in lower case)
        vs = {version_of(fn(req, timeout=30, metadata=(("x-user", f"u{k}"),))) for _ in range(3)}
        assert len(vs) == 1
    ch.close()


class _TmpFactory:
    def __init__(self, root):
        self.root = root

    def mktemp(self, name):
        p = self.root / name
        p.mkdir(exist_ok=True)
        return p


def test_split_reload(split):
    d = Driver(split.port, "split", threads=4)  # traffic while route tables are swapped
    text = SPLIT.replace("weight: 70", "weight: 0").replace("weight: 30", "weight: 1")
    split.rollout.write_text(text)
    wait_state(split, "split", lambda st: [w["version"] for w in st["weights"]] == [2], timeout=20)
    d.stop()
    assert None not in d.answers and d.sent > 0, d.answers
    assert all(predict(split.port, [[1.0, 1.0, 1.0]], "/v1/models/split:predict") == 2
               for _ in range(30))
    # a broken file is refused and logged; the running split stays
    split.rollout.write_text(text.replace("weight: 1", "weight: -1"))
    deadline = time.time() + 20
    while "config_rejected" not in split.logtext() and time.time() < deadline:
        time.sleep(0.2)
    assert "split[1].weight = -1" in split.logtext()
    assert [w["version"] for w in split.rollouts("split")["weights"]] == [2]
    split.rollout.write_text(SPLIT)
    wait_state(split, "split", lambda st: len(st["weights"]) == 2, timeout=20)


# ------------------------------------------------------------------ canaries

CANARY = """
evaluation_interval_seconds: 1
model_rollouts {
  model_name: "%(model)s"
  canary {
    candidate_version: 2
    steps: [20, 50, 100]
    min_requests: %(min)d
    min_step_seconds: 1
    gates { max_error_rate_increase: 0.02 max_p99_latency_ratio: 1.5 }
    %(extra)s
  }
}
"""


def canary_server(tmp_path, v2, min_requests=300, extra="", state_file=None):
    save_scale(tmp_path / "m" / "1" / "model.onnx", 1.0)
    v2(tmp_path / "m" / "2" / "model.onnx", 2.0)
    text = CANARY % {"model": "m", "min": min_requests, "extra": extra}
    if state_file:
        text = f'state_file: "{state_file}"\n' + text
    return Rollout(tmp_path, ["m"], text)


def test_canary_good_candidate_promotes(tmp_path):
    srv = canary_server(tmp_path, save_scale)
    try:
        st = srv.rollouts("m")
        assert st["state"] == "progressing" and st["step_percent"] == 20
        assert (st["candidate_version"], st["baseline_version"]) == (2, 1)
        d = Driver(srv.port, "m")
        st = wait_state(srv, "m", lambda s: s["state"] != "progressing", driver=d)
        d.stop()
        assert st["state"] == "promoted", st
        assert [w["version"] for w in st["weights"]] == [2]
        ev = [(e["event"], e["step_percent"]) for e in srv.events() if e["model"] == "m"]
        # an inconclusive window may hold a step (latency noise on a busy host), never more
        assert [e for e in ev if e[0] != "hold"] == [("advance", 50), ("promote", 100)], ev
        # the stable label moved to the candidate
        assert predict(srv.port, [[1.0, 1.0, 1.0]], "/v1/models/m/labels/stable:predict") == 2
        assert all(predict(srv.port, [[1.0, 1.0, 1.0]], "/v1/models/m:predict") == 2 for _ in range(20))
        m = srv.metrics()
        assert 'kiln_rollout_state{model_name="m",state="promoted"} 1' in m
        assert 'kiln_rollout_events_total{model_name="m",event="promote"} 1' in m
        assert 'kiln_rollout_step{model_name="m"} 100' in m
        # both arms had traffic in the candidate's share at each step
        assert d.answers.get(1, 0) > 300 and d.answers.get(2, 0) > 300, d.answers
        saved = json.loads((tmp_path / "rollout.config.state.json").read_text())
        assert saved["rollouts"][0]["state"] == "promoted"
    finally:
        srv.kill()


def test_canary_erroring_candidate_rolls_back(tmp_path):
    srv = canary_server(tmp_path, save_one_row)
    try:
        d = Driver(srv.port, "m", two_rows_every=4)  # a quarter of requests have two rows
        st = wait_state(srv, "m", lambda s: s["state"] != "progressing", driver=d)
        d.stop()
        assert st["state"] == "rolled_back", st
        assert st["reason"].startswith("step 20%: error rate"), st["reason"]
        assert [w["version"] for w in st["weights"]] == [1]
        ev = [e for e in srv.events() if e["model"] == "m"]
        assert ev[-1]["event"] == "rollback" and "error rate" in ev[-1]["reason"]
        assert all(predict(srv.port, [[1.0, 1.0, 1.0]] * 2, "/v1/models/m:predict") == 1
                   for _ in range(20))
        assert 'kiln_rollout_state{model_name="m",state="rolled_back"} 1' in srv.metrics()
    finally:
        srv.kill()


def test_canary_slow_candidate_rolls_back_on_p99(tmp_path):
    srv = canary_server(tmp_path, save_slow)
    try:
        d = Driver(srv.port, "m")
        st = wait_state(srv, "m", lambda s: s["state"] != "progressing", driver=d)
        d.stop()
        assert st["state"] == "rolled_back", st
        assert "p99 latency" in st["reason"], st["reason"]
        w = st["window"]
        assert w["candidate_p99_us"] > 1.5 * w["baseline_p99_us"], w
    finally:
        srv.kill()


AGREEMENT = """
evaluation_interval_seconds: 1
model_rollouts {
  model_name: "m"
  canary {
    candidate_version: 2
    steps: [20, 50, 100]
    min_requests: 100
    min_step_seconds: 1
    gates { max_error_rate_increase: 0.02 max_p99_latency_ratio: -1 min_agreement: 0.9 }
  }
  shadow { target_version: 2 fraction: 0.5 }
}
"""


@pytest.mark.parametrize("flip,expect", [(False, "promoted"), (True, "rolled_back")])
def test_canary_agreement_gate(tmp_path, flip, expect):
    """A shadow of the baseline's traffic on the candidate pairs their
    outputs: a candidate whose top-1 differs rolls back on agreement, one
    that agrees promotes."""
    save_scale(tmp_path / "m" / "1" / "model.onnx", 1.0)
    # [1, 2, 3] * [2, 2, -2] has its top-1 in the middle column, not the last
    save_scale(tmp_path / "m" / "2" / "model.onnx", [2.0, 2.0, -2.0] if flip else 2.0)
    srv = Rollout(tmp_path, ["m"], AGREEMENT)
    try:
        d = Driver(srv.port, "m")
        st = wait_state(srv, "m", lambda s: s["state"] != "progressing", driver=d)
        d.stop()
        assert st["state"] == expect, st
        code, shadow = srv.json("GET", "/v1/shadow/m")
        assert code == 200, shadow
        r = shadow["requests"]
        assert r["compared"] > 0 and shadow["since_start"]["top1_rows"] > 0
        # the candidate's own answers are never shadowed onto itself: every
        # pair is the baseline's answer against the candidate's
        assert shadow["since_start"]["top1_agreement"] == (0.0 if flip else 1.0), shadow
        if flip:
            assert st["reason"].startswith("step 20%: agreement: top-1 equal on 0 of"), st["reason"]
            ev = [e for e in srv.events() if e["model"] == "m"]
            assert ev[-1]["event"] == "rollback" and "agreement" in ev[-1]["reason"]
        else:
            assert predict(srv.port, [[1.0, 1.0, 1.0]], "/v1/models/m/labels/stable:predict") == 2
    finally:
        srv.kill()


DIVERGENCE = """
evaluation_interval_seconds: 1
model_rollouts {
  model_name: "m"
  canary {
    candidate_version: 2
    steps: [20, 50, 100]
    min_requests: 100
    min_step_seconds: 1
    gates { max_error_rate_increase: 0.02 max_p99_latency_ratio: -1 max_output_divergence: 0.02 }
  }
  shadow { target_version: 2 fraction: 0.5 }
}
"""


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _js(p, q):
    """Jensen-Shannon divergence in nats (scipy's jensenshannon squared, base e)."""
    m = (p + q) / 2
    return 0.5 * np.sum(p * np.log(p / m)) + 0.5 * np.sum(q * np.log(q / m))


@pytest.mark.parametrize("sharper,expect", [(False, "promoted"), (True, "rolled_back")])
def test_canary_output_divergence_gate(tmp_path, sharper, expect):
    """Baseline and candidate both answer softmax(x * a). A candidate with a
    = 3 has the same top-1 on every row (the agreement gate could not tell)
    but sharper probabilities: its mean Jensen-Shannon divergence from the
    baseline on the shadow's pairs (0.045 to 0.078 nats on the rows sent,
    computed here with numpy) is above the allowed 0.02, and it rolls back
    with that reason; an identical candidate (divergence 0) promotes."""
    save_softmax(tmp_path / "m" / "1" / "model.onnx", 1.0)
    save_softmax(tmp_path / "m" / "2" / "model.onnx", 3.0 if sharper else 1.0)
    rows = np.random.default_rng(3).uniform(0.0, 3.0, (8, 3)).round(3)
    ref = np.array([_js(_softmax(r), _softmax(r * (3.0 if sharper else 1.0))) for r in rows])
    srv = Rollout(tmp_path, ["m"], DIVERGENCE)
    try:
        d = Driver(srv.port, "m", rows_fn=lambda i: rows[i % 8:i % 8 + 1].tolist())
        st = wait_state(srv, "m", lambda s: s["state"] != "progressing", driver=d)
        d.stop()
        assert st["state"] == expect, st
        code, shadow = srv.json("GET", "/v1/shadow/m")
        assert code == 200, shadow
        tot = shadow["since_start"]
        assert tot["js_rows"] >= 30 and tot["top1_agreement"] == 1.0, tot
        # the shadow's mean lies within the per-row divergences numpy computes
        assert ref.min() - 1e-4 <= tot["js_divergence"] <= ref.max() + 1e-4, (tot, ref)
        # the counters a fleet controller reads agree with the JSON view
        m = srv.metrics()
        rows_total = float(re.search(r'^kiln_shadow_js_rows_total\{model_name="m"[^}]*\} (\S+)$', m,
                                     re.M).group(1))
        js_total = float(re.search(r'^kiln_shadow_js_sum_total\{model_name="m"[^}]*\} (\S+)$', m,
                                   re.M).group(1))
        assert rows_total >= tot["js_rows"] and \
            ref.min() - 1e-4 <= js_total / rows_total <= ref.max() + 1e-4, (rows_total, js_total)
        g = st["gates"]["output_divergence"]
        assert g["max"] == 0.02 and g["rows"] >= 30, g
        if sharper:
            assert st["reason"].startswith("step 20%: output divergence: mean Jensen-Shannon"), \
                st["reason"]
            assert g["bounds"][0] > 0.02 and ref.min() - 1e-4 <= g["mean"] <= ref.max() + 1e-4, g
            ev = [e for e in srv.events() if e["model"] == "m"]
            assert ev[-1]["event"] == "rollback" and "output divergence" in ev[-1]["reason"]
        else:
            assert g["mean"] == 0.0 and g["bounds"][1] == 0.0, g
            assert [w["version"] for w in st["weights"]] == [2], st
    finally:
        srv.kill()


DRIFT = """
evaluation_interval_seconds: 1
model_rollouts {
  model_name: "m"
  canary {
    candidate_version: 2
    steps: [20, 50, 100]
    min_requests: 100
    min_step_seconds: 1
    gates { max_p99_latency_ratio: -1 roll_back_on_input_drift: true }
  }
}
"""


@pytest.mark.parametrize("drifted,expect", [(False, "promoted"), (True, "rolled_back")])
def test_canary_input_drift_gate(tmp_path, drifted, expect):
    """The candidate's reference profile (kiln profile, uniform inputs on
    [1, 3]) against its live inputs: traffic from the same distribution
    promotes, a constant row (all mass in one bin of each feature) rolls the
    candidate back on input drift."""
    save_scale(tmp_path / "m" / "1" / "model.onnx", 1.0)
    save_scale(tmp_path / "m" / "2" / "model.onnx", 2.0)
    rng = np.random.default_rng(7)
    data = tmp_path / "reference"
    data.mkdir()
    np.save(data / "x.npy", rng.uniform(1.0, 3.0, (4000, 3)).astype(np.float32))
    profile = tmp_path / "m" / "2" / "assets.extra" / "kiln_profile.json"
    profile.parent.mkdir(parents=True)
    # 1000 values before a verdict: the JS distance of an undrifted window
    # is then about 0.04, far below the 0.1 threshold (docs/MONITORING.md)
    p = subprocess.run([KILN, "profile", str(tmp_path / "m" / "2" / "model.onnx"), "--data", str(data),
                        "-o", str(profile), "--min-count", "1000"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    srv = Rollout(tmp_path, ["m"], DRIFT)
    try:
        live = np.random.default_rng(11)
        rows = (lambda i: [[1.0, 2.0, 3.0]]) if drifted else \
            (lambda i: live.uniform(1.0, 3.0, (1, 3)).round(3).tolist())
        d = Driver(srv.port, "m", rows_fn=rows)
        st = wait_state(srv, "m", lambda s: s["state"] != "progressing", driver=d)
        d.stop()
        assert st["state"] == expect, st
        if drifted:
            assert st["reason"].startswith("step 20%: input drift:") and "of version 2" in st["reason"], \
                st["reason"]
            assert "feature 'x" in st["reason"], st["reason"]
        code, mon = srv.json("GET", "/v1/models/m/monitoring")
        assert code == 200, mon
        v2 = [v for v in mon["versions"] if v["version"] == 2][0]
        alerts = [f["alert"] for f in v2["features"] if "alert" in f]
        assert alerts and all(alerts) == drifted and any(alerts) == drifted, v2
    finally:
        srv.kill()


def test_restart_resumes_step(tmp_path):
    state = tmp_path / "rollout-state.json"
    srv = canary_server(tmp_path, save_scale, state_file=state)
    try:
        d = Driver(srv.port, "m")
        wait_state(srv, "m", lambda s: s["step_percent"] == 50 or s["state"] != "progressing", driver=d)
        d.stop()
    finally:
        srv.proc.send_signal(signal.SIGKILL)
        srv.kill()
    assert json.loads(state.read_text())["rollouts"][0]["step"] == 1
    srv = Rollout(tmp_path, ["m"], None)
    try:
        st = srv.rollouts("m")
        assert st["state"] == "progressing" and st["step_percent"] == 50, st
        assert {w["version"]: w["weight"] for w in st["weights"]} == {2: 0.5, 1: 0.5}
        assert "resumes progressing at step 1" in srv.logtext()
    finally:
        srv.kill()


# ------------------------------------------------------------------ admin

ADMIN = """
evaluation_interval_seconds: 1
model_rollouts { model_name: "a" canary { candidate_version: 2 steps: [10, 100] min_requests: 1000000 min_step_seconds: 1 } }
model_rollouts { model_name: "b" canary { candidate_version: 2 steps: [10, 100] min_requests: 1000000 paused: true } }
model_rollouts { model_name: "c" split { version: 1 weight: 1 } }
"""


def post(srv, path, host="127.0.0.1", headers=None):
    c = http.client.HTTPConnection(host, srv.port, timeout=30)
    c.request("POST", path, body="", headers=headers or {})
    r = c.getresponse()
    body = json.loads(r.read())
    c.close()
    return r.status, body


def non_loopback_address():
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent; picks the outgoing interface
            a = s.getsockname()[0]
        return None if a.startswith("127.") else a
    except OSError:
        return None


def test_admin_endpoints(tmp_path):
    for m in "abc":
        for v in (1, 2):
            save_scale(tmp_path / m / str(v) / "model.onnx", float(v))
    addr = non_loopback_address()
    srv = Rollout(tmp_path, ["a", "b", "c"], ADMIN, address="0.0.0.0" if addr else "127.0.0.1")
    try:
        assert [r["model"] for r in srv.rollouts()["rollouts"]] == ["a", "b", "c"]
        assert srv.rollouts("b")["state"] == "paused"
        code, body = post(srv, "/v1/rollouts/a:pause")
        assert code == 200 and body["state"] == "paused", body
        code, body = post(srv, "/v1/rollouts/a:pause")
        assert code == 409 and "is not progressing" in body["error"], body
        code, body = post(srv, "/v1/rollouts/a:resume")
        assert code == 200 and body["state"] == "progressing", body
        code, body = post(srv, "/v1/rollouts/a:rollback")
        assert code == 200 and body["state"] == "rolled_back" and "operator" in body["reason"]
        assert [w["version"] for w in body["weights"]] == [1]
        code, body = post(srv, "/v1/rollouts/b:promote")
        assert code == 200 and body["state"] == "promoted", body
        assert predict(srv.port, [[1.0, 1.0, 1.0]], "/v1/models/b/labels/stable:predict") == 2
        code, body = post(srv, "/v1/rollouts/c:pause")
        assert code == 409 and "static split" in body["error"], body
        code, body = post(srv, "/v1/rollouts/zzz:pause")
        assert code == 404, body
        code, body = post(srv, "/v1/rollouts/a:explode")
        assert code == 400, body
        ev = [(e["model"], e["event"]) for e in srv.events()]
        assert ev == [("a", "pause"), ("a", "resume"), ("a", "rollback"), ("b", "promote")], ev
        m = srv.metrics()
        assert 'kiln_rollout_events_total{model_name="a",event="pause"} 1' in m
        if addr:  # no token file: admin is loopback-only
            code, body = post(srv, "/v1/rollouts/b:rollback", host=addr)
            assert code == 403, body
            c = http.client.HTTPConnection(addr, srv.port, timeout=30)
            c.request("GET", "/v1/rollouts/b")
            assert c.getresponse().status == 200  # reading is open, as TF Serving's status
            c.close()
    finally:
        srv.kill()
    if not addr:
        pytest.skip("no non-loopback address on this host: the refusal from a remote peer is untested")


# ------------------------------------------------------------------ a fleet

FLEET = """
model_rollouts {
  model_name: "m"
  canary {
    candidate_version: 2
    baseline_version: 1
    steps: [20, 50, 100]
    min_requests: 200
    min_step_seconds: 2
    # Prometheus' latency buckets are 1.8x wide: a p99 ratio under 2 is not resolvable
    gates { max_error_rate_increase: 0.02 max_p99_latency_ratio: 3 %s }
  }
  %s
}
"""

# the paired gates from Prometheus: a shadow of the baseline's traffic on the
# candidate in every replica, judged from the sum of their counters
FLEET_PAIRED = ("min_agreement: 0.9 max_output_divergence: 0.02",
                "shadow { target_version: 2 fraction: 0.5 }")


@pytest.mark.parametrize("case,expect", [("good", "promoted"), ("errors", "rolled_back"),
                                         ("diverges", "rolled_back"), ("drifted", "rolled_back")])
def test_fleet_rollout_controller(tmp_path, case, expect):
    """Three replicas behind a round-robin client, a real Prometheus scraping
    them every second, and `kiln rollout-controller` judging the canary from
    Prometheus: every replica follows the file it writes. A candidate that
    errors rolls back on the error rate; one whose probabilities are sharper
    (softmax(3x) against softmax(x): the same top-1, so agreement passes)
    rolls back on output divergence, judged from the replicas' shadow
    counters."""
    prom = shutil.which("prometheus")
    if not prom:
        pytest.skip("prometheus (Debian package prometheus) is not installed")
    rows_fn = None
    if case == "diverges":
        save_softmax(tmp_path / "m" / "1" / "model.onnx", 1.0)
        save_softmax(tmp_path / "m" / "2" / "model.onnx", 3.0)
        rows = np.random.default_rng(3).uniform(0.0, 3.0, (8, 3)).round(3)
        rows_fn = lambda i: rows[i % 8:i % 8 + 1].tolist()  # noqa: E731
    else:
        save_scale(tmp_path / "m" / "1" / "model.onnx", 1.0)
        (save_one_row if case == "errors" else save_scale)(tmp_path / "m" / "2" / "model.onnx", 2.0)
    if case == "drifted":  # a reference profile of uniform inputs on [1, 3], fed a constant row
        data = tmp_path / "reference"
        data.mkdir()
        np.save(data / "x.npy", np.random.default_rng(7).uniform(1.0, 3.0, (4000, 3)).astype(np.float32))
        profile = tmp_path / "m" / "2" / "assets.extra" / "kiln_profile.json"
        profile.parent.mkdir(parents=True)
        p = subprocess.run([KILN, "profile", str(tmp_path / "m" / "2" / "model.onnx"), "--data",
                            str(data), "-o", str(profile), "--min-count", "200"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
    rollout = tmp_path / "rollout.config"
    rollout.write_text(FLEET % (FLEET_PAIRED if case == "diverges" else
                                ("roll_back_on_input_drift: true", "") if case == "drifted" else
                                ("", "")))
    procs, replicas = [], []
    try:
        # The controller takes the canary over first, so no replica judges it alone.
        ctl_log = open(tmp_path / "controller.log", "a+")
        pport = free_port()
        ctl = [KILN, "rollout-controller", f"--prometheus=http://127.0.0.1:{pport}",
               f"--rollout_config_file={rollout}", "--interval_seconds=1"]
        subprocess.run(ctl + ["--once"], stderr=ctl_log, check=True, timeout=60)
        assert "controlled: true" in rollout.read_text()
        replicas = [Rollout(tmp_path, ["m"], None, log_name=f"replica{i}.log") for i in range(3)]
        for r in replicas:
            st = r.rollouts("m")
            assert st["controlled"] and st["state"] == "progressing" and st["step_percent"] == 20, st
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                       "scrape_configs:\n  - job_name: kiln\n"
                       "    metrics_path: /monitoring/prometheus/metrics\n"
                       "    static_configs:\n      - targets: [" +
                       ", ".join(f"'127.0.0.1:{r.port}'" for r in replicas) + "]\n")
        procs.append(subprocess.Popen(
            [prom, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{pport}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w")))
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", pport, timeout=5)
                c.request("GET", "/-/ready")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        procs.append(subprocess.Popen(ctl, stderr=ctl_log))
        d = Driver([r.port for r in replicas], "m", threads=6, max_seconds=120, max_requests=400000,
                   two_rows_every=4 if case == "errors" else 0, rows_fn=rows_fn)
        deadline = time.time() + 120
        states = []
        while time.time() < deadline:
            states = [r.rollouts("m") for r in replicas]
            if all(s["state"] == expect for s in states):
                break
            time.sleep(0.5)
        d.stop()
        ctl_log.flush()
        ctl_log.seek(0)
        ctl_text = ctl_log.read()
        assert procs[1].poll() is None, ("the controller exited", procs[1].returncode, ctl_text)
        assert all(s["state"] == expect for s in states), (states, ctl_text, d.answers)
        reason = states[0]["reason"]
        assert "(fleet, from Prometheus)" in reason and all(s["reason"] == reason for s in states)
        if case == "diverges":
            assert "output divergence: mean Jensen-Shannon" in reason, reason
            assert "shadow {" in rollout.read_text()  # the controller kept the shadow block
        if case == "drifted":
            assert "input drift: 3 features of version 2" in reason and "feature 'x" in reason, reason
        if expect == "rolled_back":
            assert case != "errors" or "error rate" in reason, reason
            assert all([w["version"] for w in s["weights"]] == [1] for s in states)
        else:
            assert all([w["version"] for w in s["weights"]] == [2] for s in states)
            for r in replicas:  # each replica moved stable itself
                assert predict(r.port, [[1.0, 1.0, 1.0]], "/v1/models/m/labels/stable:predict") == 2
        events = [json.loads(line)["event"] for line in ctl_text.splitlines()
                  if line.startswith("{") and "rollout-controller" in line]
        assert events[0] == "start" and events[-1] == ("promote" if expect == "promoted" else "rollback")
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for r in replicas:
            r.kill()


# ------------------------------------------------------------------ bad files


@pytest.mark.parametrize("text,needle", [
    ('model_rollouts { model_name: "m" split { version: 1 weight: 1 } nope: 1 }',
     r"line 1:\d+: unknown field 'nope'"),
    ('\n\nmodel_rollouts {\n  model_name: "m"\n  canary { candidate_version: 2 steps: [50, 20, 100] } }',
     r":4: model_rollouts 'm': canary.steps\[1\] = 20 is not greater than the step before it \(50\)"),
    ('model_rollouts { model_name: "m" canary { candidate_version: 2 steps: [5, 50] } }',
     r"the last step is 50, it must be 100"),
    ('model_rollouts { model_name: "m" canary { candidate_version: 2 candidate_label: "x" } }',
     r"exactly one of candidate_version and candidate_label \(got both\)"),
    ('model_rollouts { model_name: "m" split { version: 1 weight: 1 } canary { candidate_version: 2 } }',
     r"has both split and canary"),
    ('model_rollouts { model_name: "m" split { version: 1 weight: 0 } }', r"the weights sum to 0"),
    ('model_rollouts { model_name: "m" canary { candidate_version: 2 gates { confidence: 1.5 } } }',
     r"canary.gates.confidence = 1.5"),
    ('model_rollouts { model_name: "m" canary { candidate_version: 2 gates { min_agreement: 0.9 } } }',
     r"min_agreement = 0.9 needs canary.candidate_version and a shadow of this model on that version"),
    ('model_rollouts { model_name: "m" canary { candidate_version: 2 gates { min_agreement: 0.9 } }'
     ' shadow { target_version: 3 fraction: 1 } }', r"min_agreement = 0.9 needs"),
    ('model_rollouts { model_name: "m" canary { candidate_version: 2 gates { min_agreement: 1.5 } } }',
     r"canary.gates.min_agreement = 1.5: must be in \[0, 1\]"),
    ('model_rollouts { model_name: "m" canary { candidate_version: 2 gates { max_output_divergence: 0.1 } } }',
     r"max_output_divergence = 0.1 needs canary.candidate_version and a shadow of this model"),
    ('model_rollouts { model_name: "m" canary { candidate_version: 2 gates { max_output_divergence: 0.9 } } }',
     r"canary.gates.max_output_divergence = 0.9: a Jensen-Shannon divergence in nats, in \[0, ln 2"),
    ('model_rollouts { model_name: "m" shadow { fraction: 2 } }', r"shadow.fraction = 2"),
    ('route_key_header: "bad header"', r"route_key_header = 'bad header'"),
    ('model_rollouts { model_name: "m" } model_rollouts { model_name: "m" }', r"model_name given twice"),
])
def test_bad_rollout_file(tmp_path, text, needle):
    save_scale(tmp_path / "m" / "1" / "model.onnx", 1.0)
    f = tmp_path / "bad.rollout"
    f.write_text(text)
    p = subprocess.run([KILN, "serve", f"--model_base_path={tmp_path / 'm'}", "--model_name=m",
                        f"--rest_api_port={free_port()}", "--port=0", "--rest_api_address=127.0.0.1",
                        f"--rollout_config_file={f}"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert str(f) in p.stderr and re.search(needle, p.stderr), p.stderr


def test_admin_path_without_a_rollout_file(tmp_path):
    """Without --rollout_config_file the list is empty (a console polling it
    sees no rollouts, not an error) and model paths are 404 naming the flag."""
    save_scale(tmp_path / "m" / "1" / "model.onnx", 2.0)
    srv = test_serve.Server(tmp_path / "m", "m")
    try:
        code, body = srv.json("GET", "/v1/rollouts")
        assert code == 200 and body == {"rollouts": []}, body
        code, body = post(srv, "/v1/rollouts/m:pause")
        assert code == 404 and "--rollout_config_file" in body["error"], body
        code, body = srv.json("GET", "/v1/rollouts/m")
        assert code == 404, body
    finally:
        srv.kill()
