"""End-to-end tests for `kiln serve`: the real server on a loopback port,
driven with http.client.

One server (module fixture) serves model "aff" (y = x*a + b, float32
[batch,3]) from a temp base path with version 1; a second serves a
string-identity model with a `_bytes` output and models/digits (version 1). Tests cover
TF Serving's REST API (status, metadata, row and columnar predict, b64,
NaN), error paths and their HTTP codes, KServe v2, Prometheus metrics,
adding version 2 while serving, a broken version 3 that is never served,
and SIGTERM -> exit 0. Every wait is bounded; servers are always killed.
"""

import base64
import gzip
import http.client
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
KILN = os.environ.get("KILN_BIN") or str(REPO / "build" / "kiln")
DIGITS = REPO / "models" / "digits" / "1" / "model.onnx"

pytestmark = pytest.mark.skipif(
    not (os.path.isfile(KILN) and os.access(KILN, os.X_OK)),
    reason=f"kiln binary not found at {KILN} (build it, or set KILN_BIN)",
)


# ------------------------------------------------------------------ models


def save_affine(path, a, b):
    """y = x * a + b over float32 [batch, 3]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    inits = [numpy_helper.from_array(np.array(a, np.float32), "a"),
             numpy_helper.from_array(np.array(b, np.float32), "b")]
    nodes = [helper.make_node("Mul", ["x", "a"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])]
    g = helper.make_graph(nodes, "affine", [x], [y], inits)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def save_strings(path):
    """Two outputs: text (Identity) and text_bytes (Identity, b64 in replies)."""
    s = helper.make_tensor_value_info("s", TensorProto.STRING, ["batch"])
    o1 = helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])
    o2 = helper.make_tensor_value_info("text_bytes", TensorProto.STRING, ["batch"])
    nodes = [helper.make_node("Identity", ["s"], ["text"]),
             helper.make_node("Identity", ["s"], ["text_bytes"])]
    g = helper.make_graph(nodes, "strings", [s], [o1, o2])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


# ------------------------------------------------------------------ server


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PROMETHEUS = 'prometheus_config: { enable: true, path: "/monitoring/prometheus/metrics" }\n'


class Server:
    """kiln serve on a free loopback port. The Prometheus page is on (TF
    Serving's monitoring config file) unless metrics=False."""

    def __init__(self, base, name, *extra, metrics=True, env=None):
        self.port = free_port()
        self.log = open(base.parent / f"{name}.log", "w+")
        if metrics:
            mon = base.parent / f"{name}.monitoring"
            mon.write_text(PROMETHEUS)
            extra = (f"--monitoring_config_file={mon}", *extra)
        self.proc = subprocess.Popen(
            [KILN, "serve", f"--model_base_path={base}", f"--model_name={name}",
             f"--rest_api_port={self.port}", "--rest_api_address=127.0.0.1",
             "--rest_api_num_threads=4", "--file_system_poll_wait_seconds=1", *extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.wait_ready()

    def wait_ready(self):
        """Poll readiness for up to 60 s; fail with the server's log."""
        deadline = time.time() + 60
        while time.time() < deadline:
            assert self.proc.poll() is None, self.logtext()
            try:
                if self.request("GET", "/v2/health/ready")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.kill()
        raise AssertionError("server not ready in 60 s: " + self.logtext())

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def request(self, method, path, body=None, headers=None, timeout=30):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, r.read(), r.getheader("Content-Type")
        finally:
            c.close()

    def json(self, method, path, body=None, **kw):
        code, data, _ = self.request(method, path, body, **kw)
        return code, json.loads(data)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture(scope="module")
def aff(tmp_path_factory):
    root = tmp_path_factory.mktemp("aff")
    base = root / "aff"
    save_affine(base / "1" / "model.onnx", 2.0, 1.0)
    srv = Server(base, "aff")
    srv.base = base
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def strings(tmp_path_factory):
    root = tmp_path_factory.mktemp("str")
    base = root / "str"
    save_strings(base / "1" / "model.onnx")
    srv = Server(base, "str")
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    if not DIGITS.exists():
        pytest.skip("models/digits/1/model.onnx missing")
    base = tmp_path_factory.mktemp("digits") / "digits"
    (base / "1").mkdir(parents=True)
    shutil.copy(DIGITS, base / "1" / "model.onnx")
    srv = Server(base, "digits")
    yield srv
    srv.kill()


def wait_for(pred, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


# ------------------------------------------------------------------ TF Serving REST


def test_status(aff):
    code, body = aff.json("GET", "/v1/models/aff")
    assert code == 200
    assert body == {"model_version_status": [{"version": "1", "state": "AVAILABLE",
                    "status": {"error_code": "OK", "error_message": ""}}]}
    code, body = aff.json("GET", "/v1/models/aff/versions/1")
    assert code == 200 and body["model_version_status"][0]["version"] == "1"


def test_status_unknown(aff):
    code, body = aff.json("GET", "/v1/models/nope")
    assert code == 404 and "nope" in body["error"]
    code, body = aff.json("GET", "/v1/models/aff/versions/77")
    assert code == 404 and "77" in body["error"]


def test_metadata(aff):
    code, body = aff.json("GET", "/v1/models/aff/metadata")
    assert code == 200
    assert body["model_spec"] == {"name": "aff", "signature_name": "", "version": "1"}
    sig = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    x = sig["inputs"]["x"]
    assert x["dtype"] == "DT_FLOAT"
    assert x["tensor_shape"]["dim"] == [{"size": "-1", "name": ""}, {"size": "3", "name": ""}]
    assert sig["outputs"]["y"]["dtype"] == "DT_FLOAT"
    assert sig["method_name"] == "tensorflow/serving/predict"


def test_predict_row_and_columnar(aff):
    code, body = aff.json("POST", "/v1/models/aff:predict", {"instances": [[1, 2, 3], [4.5, 5, -6]]})
    assert code == 200, body
    assert body == {"predictions": [[3, 5, 7], [10, 11, -11]]}
    code, body = aff.json("POST", "/v1/models/aff/versions/1:predict",
                          {"inputs": {"x": [[0.25, 0, 1]]}})
    assert code == 200 and body == {"outputs": [[1.5, 1, 3]]}
    code, body = aff.json("POST", "/v1/models/aff:predict", {"inputs": [[1, 1, 1]]})
    assert code == 200 and body == {"outputs": [[3, 3, 3]]}
    code, body = aff.json("POST", "/v1/models/aff:predict",
                          {"signature_name": "serving_default", "instances": [{"x": [0, 0, 0]}]})
    assert code == 200 and body == {"predictions": [[1, 1, 1]]}


def test_float_round_trip(aff):
    v = 0.1234567  # not exact in float32: the reply must round-trip the float32
    code, body = aff.json("POST", "/v1/models/aff:predict", {"instances": [[v, 0, 0]]})
    assert code == 200
    want = np.float32(np.float32(v) * np.float32(2)) + np.float32(1)
    assert np.float32(body["predictions"][0][0]) == want


def test_nan_infinity(aff):
    code, data, _ = aff.request("POST", "/v1/models/aff:predict",
                                '{"instances": [[NaN, Infinity, -Infinity]]}')
    assert code == 200, data
    text = data.decode()
    assert "NaN" in text and "-Infinity" in text
    row = json.loads(text)["predictions"][0]  # Python's json reads NaN/Infinity too
    assert math.isnan(row[0]) and row[1] == math.inf and row[2] == -math.inf


@pytest.mark.parametrize("body,needle", [
    ('{"instances": [[1,2,3]', "JSON Parse error"),
    ('[1,2,3]', "Is not object"),
    ('{"foo": 1}', "Missing 'inputs' or 'instances' key"),
    ('{"inputs": [[1,2,3]], "instances": [[1,2,3]]}', "only one of 'inputs' or 'instances'"),
    ('{"instances": []}', "No values in 'instances' array"),
    ('{"instances": [[1,"a",3]]}', "input 'x'"),
    ('{"instances": [[1,2,3],[1,2]]}', "ragged"),
    ('{"inputs": [[1,2,3],[[1],2,3]]}', "ragged"),
    ('{"instances": [[1,2,3,4]]}', "expected shape"),
    ('{"inputs": {"nope": [[1,2,3]]}}', "input tensor alias not found"),
    ('{"signature_name": "other", "instances": [[1,2,3]]}', "not found in signature def"),
    ('{"instances": ' + "[" * 100 + "]" * 100 + "}", "nesting"),
])
def test_predict_bad_requests(aff, body, needle):
    code, resp = aff.json("POST", "/v1/models/aff:predict", body)
    assert code == 400, resp
    assert needle in resp["error"]


def test_wrong_dtype_names_input(aff):
    code, resp = aff.json("POST", "/v1/models/aff:predict", {"instances": [["x", 1, 2]]})
    assert code == 400
    assert "is not of expected type: float" in resp["error"] and "'x'" in resp["error"]


def test_unknown_model_and_version_predict(aff):
    code, resp = aff.json("POST", "/v1/models/half:predict", {"instances": [[1, 2, 3]]})
    assert code == 404 and resp["error"] == "Servable not found for request: Latest(half)"
    code, resp = aff.json("POST", "/v1/models/aff/versions/9:predict", {"instances": [[1, 2, 3]]})
    assert code == 404 and "Specific(aff, 9)" in resp["error"]


def test_malformed_paths(aff):
    code, resp = aff.json("GET", "/v1/models/aff/bogus")
    assert code == 400 and resp["error"].startswith("Malformed request: GET")
    code, resp = aff.json("DELETE", "/v1/models/aff")
    assert code == 400
    code, _, _ = aff.request("GET", "/nothing/here")
    assert code == 404


def test_content_type_json(aff):
    _, _, ctype = aff.request("GET", "/v1/models/aff")
    assert ctype.startswith("application/json")
    _, _, ctype = aff.request("GET", "/v1/models/nope")
    assert ctype.startswith("application/json")


def test_oversized_body(aff):
    big = b'{"instances": [' + b"1," * (33 << 20) + b"1]}"  # > 64 MiB
    code, data, _ = aff.request("POST", "/v1/models/aff:predict", big, timeout=120)
    assert code == 413, data
    assert "limit" in json.loads(data)["error"]


def test_gzip_body(aff):
    body = gzip.compress(json.dumps({"instances": [[1, 2, 3]]}).encode())
    code, data, _ = aff.request("POST", "/v1/models/aff:predict", body,
                                headers={"Content-Encoding": "gzip"})
    assert code == 200 and json.loads(data) == {"predictions": [[3, 5, 7]]}
    bomb = gzip.compress(b" " * (70 << 20))  # inflates past the limit
    code, data, _ = aff.request("POST", "/v1/models/aff:predict", bomb,
                                headers={"Content-Encoding": "gzip"})
    assert code == 413


def test_list_models(aff):
    code, body = aff.json("GET", "/v1/models")
    assert code == 200
    assert body["models"][0]["name"] == "aff" and body["models"][0]["ready"] is True


def test_strings_b64(strings):
    raw = bytes([0, 255, 10, 65])
    code, body = strings.json("POST", "/v1/models/str:predict",
                              {"instances": ["hello", {"b64": base64.b64encode(raw).decode()}]})
    assert code == 200, body
    preds = body["predictions"]
    assert preds[0]["text"] == "hello"
    assert preds[0]["text_bytes"] == {"b64": base64.b64encode(b"hello").decode()}
    assert base64.b64decode(preds[1]["text_bytes"]["b64"]) == raw
    code, body = strings.json("POST", "/v1/models/str:predict", {"inputs": {"s": ["a", "b"]}})
    assert code == 200 and body["outputs"]["text"] == ["a", "b"]
    code, body = strings.json("POST", "/v1/models/str:predict", {"instances": [{"b64": "-_"}]})
    assert code == 400 and "base64" in body["error"]
    code, body = strings.json("POST", "/v1/models/str:predict", {"instances": [1.5]})
    assert code == 400 and "string" in body["error"]


def test_digits(digits):
    sample = np.load(REPO / "models" / "digits_sample.npy")
    code, meta = digits.json("GET", "/v1/models/digits/metadata")
    assert code == 200
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    (name,) = sig["inputs"].keys()
    code, body = digits.json("POST", "/v1/models/digits:predict",
                             {"inputs": {name: sample[:4].tolist()}})
    assert code == 200, body
    got = np.asarray(body["outputs"], dtype=np.float64)
    # the model's own arithmetic in numpy (Gemm, Relu, Gemm, Softmax; weights from the
    # file), and the sample's true labels (tools/make_digits_model.py)
    w = {t.name: numpy_helper.to_array(t).astype(np.float64)
         for t in onnx.load(str(DIGITS)).graph.initializer}
    h = np.maximum(sample[:4].astype(np.float64) @ w["fc1.weight"].T + w["fc1.bias"], 0)
    logits = h @ w["fc2.weight"].T + w["fc2.bias"]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    assert got.shape == (4, 10), got.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    labels = np.load(REPO / "models" / "digits_sample_labels.npy")
    assert got.argmax(axis=1).tolist() == labels[:4].tolist()


# ------------------------------------------------------------------ KServe v2, health, metrics


def test_v2(aff):
    assert aff.json("GET", "/v2/health/live") == (200, {"live": True})
    assert aff.json("GET", "/v2/health/ready") == (200, {"ready": True})
    code, body = aff.json("GET", "/v2/models/aff")
    assert code == 200 and body["platform"] == "onnx_onnxv1"
    assert body["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
    assert aff.json("GET", "/v2/models/aff/ready") == (200, {"name": "aff", "ready": True})
    assert aff.json("GET", "/v2/models/nope/ready")[0] == 404
    req = {"id": "r1", "inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                   "data": [1, 2, 3, 4, 5, 6]}]}
    code, body = aff.json("POST", "/v2/models/aff/infer", req)
    assert code == 200, body
    assert body["model_name"] == "aff" and body["id"] == "r1"
    assert body["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2, 3],
                                "data": [3, 5, 7, 9, 11, 13]}]
    req["inputs"][0]["datatype"] = "FP64"
    code, body = aff.json("POST", "/v2/models/aff/infer", req)
    assert code == 400 and "datatype" in body["error"]
    req["inputs"][0]["datatype"] = "FP32"
    req["inputs"][0]["shape"] = [3, 3]
    code, body = aff.json("POST", "/v2/models/aff/infer", req)
    assert code == 400
    # a huge shape with little data is refused before anything is allocated
    # (it used to allocate the shape's 24 GB first)
    req["inputs"][0]["shape"] = [2000000000, 3]
    code, body = aff.json("POST", "/v2/models/aff/infer", req)
    assert code == 400 and "data has 6 elements but the shape needs 6000000000" in body["error"]
    assert aff.proc.poll() is None


def test_metrics(aff):
    aff.json("POST", "/v1/models/aff:predict", {"instances": [[1, 2, 3]]})
    code, data, ctype = aff.request("GET", "/monitoring/prometheus/metrics")
    assert code == 200 and ctype.startswith("text/plain")
    text = data.decode()
    assert "# TYPE :tensorflow:serving:request_count counter" in text
    assert ':tensorflow:serving:request_count{model_name="aff",status="OK"}' in text
    assert "# TYPE :tensorflow:serving:request_latency histogram" in text
    assert ('request_latency_bucket{model_name="aff",API="predict",entrypoint="REST",le="10"}'
            in text)
    assert 'le="+Inf"' in text and ":tensorflow:serving:request_latency_count" in text


# ------------------------------------------------------------------ versions (order matters)


def test_zz_new_version_then_broken_version(aff):
    save_affine(aff.base / "tmp2" / "model.onnx", 10.0, 0.0)
    os.rename(aff.base / "tmp2", aff.base / "2")  # appears whole, as a deploy would

    def v2_available():
        code, body = aff.json("GET", "/v1/models/aff")
        return any(v["version"] == "2" and v["state"] == "AVAILABLE"
                   for v in body["model_version_status"])
    assert wait_for(v2_available), aff.json("GET", "/v1/models/aff")
    code, body = aff.json("POST", "/v1/models/aff:predict", {"instances": [[1, 2, 3]]})
    assert code == 200 and body == {"predictions": [[10, 20, 30]]}
    code, body = aff.json("POST", "/v1/models/aff/versions/1:predict", {"instances": [[1, 2, 3]]})
    assert code == 404  # latest policy: only the newest version is served

    # a half-copied version 3: truncated model file
    (aff.base / "3").mkdir()
    good = (aff.base / "2" / "model.onnx").read_bytes()
    (aff.base / "3" / "model.onnx").write_bytes(good[: len(good) // 2])

    def v3_failed():
        code, body = aff.json("GET", "/v1/models/aff/versions/3")
        return code == 200 and body["model_version_status"][0]["status"]["error_code"] != "OK"
    assert wait_for(v3_failed), aff.json("GET", "/v1/models/aff")
    code, body = aff.json("GET", "/v1/models/aff/versions/3")
    st = body["model_version_status"][0]
    assert st["state"] == "END" and st["status"]["error_message"]
    code, body = aff.json("POST", "/v1/models/aff:predict", {"instances": [[1, 2, 3]]})
    assert code == 200 and body == {"predictions": [[10, 20, 30]]}  # v2 keeps serving
    code, body = aff.json("GET", "/v1/models/aff/versions/2")
    assert body["model_version_status"][0]["state"] == "AVAILABLE"


# ------------------------------------------------------------------ command line, shutdown


def test_flags(tmp_path):
    r = subprocess.run([KILN, "serve", "--bogus_flag=1"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unknown flag" in r.stderr
    r = subprocess.run([KILN, "serve", "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "ModelServer" in r.stdout
    r = subprocess.run([KILN, "serve", "--rest_api_port=abc", "--model_base_path=/x"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2


def cpus_of_thread(pid, tid):
    """A thread's allowed CPUs, from /proc (Cpus_allowed_list: "0-3,6")."""
    for line in open(f"/proc/{pid}/task/{tid}/status"):
        if line.startswith("Cpus_allowed_list:"):
            cpus = set()
            for part in line.split(":", 1)[1].strip().split(","):
                lo, _, hi = part.partition("-")
                cpus.update(range(int(lo), int(hi or lo) + 1))
            return cpus
    raise AssertionError(f"no Cpus_allowed_list for thread {tid}")


def test_request_threads_use_every_cpu_under_omp_binding(tmp_path):
    # OMP_PROC_BIND pins the main thread to one CPU before main(); threads made later inherit
    # that. kiln serve gives its thread every CPU back first, so request threads (and the runs
    # they make) are not all confined to CPU 0.
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("needs two CPUs or more")
    base = tmp_path / "pin"
    save_affine(base / "1" / "model.onnx", 2.0, 1.0)
    srv = Server(base, "pin", "--enable_batching",
                 env=dict(os.environ, OMP_PROC_BIND="true", OMP_PLACES="cores"))
    try:
        code, body = srv.json("POST", "/v1/models/pin:predict", {"instances": [[1.0, 2.0, 3.0]]})
        assert code == 200 and body["predictions"] == [[3.0, 5.0, 7.0]], body
        pid = srv.proc.pid
        workers = [t for t in os.listdir(f"/proc/{pid}/task")
                   if open(f"/proc/{pid}/task/{t}/comm").read().strip() == "MHD-worker"]
        assert workers, "no request threads found"
        for t in workers:
            assert cpus_of_thread(pid, t) == allowed, t
    finally:
        srv.kill()


def test_env_and_sigterm(tmp_path):
    save_affine(tmp_path / "models" / "envm" / "1" / "model.onnx", 1.0, 0.0)
    port = free_port()
    env = dict(os.environ, MODEL_NAME="envm", MODEL_BASE_PATH=str(tmp_path / "models"))
    log = open(tmp_path / "log", "w+")
    p = subprocess.Popen([KILN, "serve", f"--rest_api_port={port}", "--rest_api_address=127.0.0.1",
                          "--enable_batching"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        def ready():
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/v1/models/envm")
                return c.getresponse().status == 200
            except OSError:
                return False
        assert wait_for(ready, 60)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
        log.seek(0)
        text = log.read()
        assert "--port=8500" in text and "batching: max_batch_size=1000" in text
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        log.close()


def test_sigterm_drain_keepalive(tmp_path):
    """The drain on SIGTERM: a request whose body is still arriving is
    answered in full with Connection: close; an idle keep-alive connection
    is closed with a FIN (the client reads EOF, not a reset); exit 0 well
    within the drain time."""
    save_affine(tmp_path / "models" / "km" / "1" / "model.onnx", 2.0, 1.0)
    port = free_port()
    log = open(tmp_path / "log", "w+")
    p = subprocess.Popen([KILN, "serve", f"--rest_api_port={port}", "--rest_api_address=127.0.0.1",
                          "--port=0", "--model_name=km", f"--model_base_path={tmp_path / 'models' / 'km'}"],
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        def ready():
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/v1/models/km")
                return c.getresponse().status == 200
            except OSError:
                return False
        assert wait_for(ready, 60)
        idle = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        idle.request("GET", "/v1/models/km")
        r = idle.getresponse()
        assert r.status == 200 and r.getheader("Connection", "").lower() != "close"
        r.read()
        x = [[1.0, 2.0, 3.0]]
        body = json.dumps({"instances": x}).encode()
        slow = socket.create_connection(("127.0.0.1", port), timeout=10)
        slow.sendall(b"POST /v1/models/km:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
        time.sleep(0.3)  # the headers are in; the body is not
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        slow.sendall(body[5:])
        reply = b""
        while True:
            chunk = slow.recv(65536)
            if not chunk:
                break
            reply += chunk
        head, _, rest = reply.partition(b"\r\n\r\n")
        status = int(head.split()[1])
        # begun before the signal, so 200 (503 only if a loaded host had not read its
        # headers by then): a whole answer either way, never a reset
        assert status in (200, 503), reply
        assert b"connection: close" in head.lower(), head
        if status == 200:
            np.testing.assert_allclose(json.loads(rest)["predictions"], np.array(x) * 2.0 + 1.0)
        else:
            assert b"shutting down" in rest, rest
        # the idle keep-alive connection: an orderly close (EOF), not a reset
        idle.sock.settimeout(10)
        assert idle.sock.recv(1) == b""
        assert p.wait(timeout=30) == 0
        assert time.time() - t0 < 5
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        log.close()
