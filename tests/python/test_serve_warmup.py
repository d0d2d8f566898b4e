"""End-to-end tests for `kiln serve`: TF Serving's model warmup
(assets.extra/tf_serving_warmup_requests, a TFRecord of PredictionLog written
here by hand: no TensorFlow needed), CORS, the monitoring config file,
per-request deadlines that stop the model run (batched or not), Kiln's own
metrics, the structured load log and the honoured-flags line.

The protobuf and TFRecord bytes come from a tiny encoder below; its CRC-32C
is checked against the published check value of the Castagnoli polynomial.
"""

import json
import re
import shutil
import struct
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import test_serve
from test_serve import KILN, Server, save_affine, wait_for

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = test_serve.pytestmark

# ../shared/testdata next to the repository, or KILN_TESTDATA (conftest.py)
from conftest import TESTDATA  # noqa: E402
HALF = (TESTDATA / "savedmodels/serving/tensorflow_serving/servables/tensorflow/testdata/"
        "saved_model_half_plus_two_2_versions/00000123")

# ------------------------------------------------------------------ protobuf + TFRecord encoder


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def fld(num, payload):
    """A length-delimited field (wire type 2)."""
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def fint(num, v):
    return varint(num << 3) + varint(v)


def tensor_proto(arr):
    """TensorProto: dtype, shape, float_val (packed) or int64_val."""
    arr = np.asarray(arr)
    dtype = {np.float32: 1, np.int64: 9}[arr.dtype.type]
    shape = b"".join(fld(2, fint(1, d)) for d in arr.shape)
    body = fint(1, dtype) + fld(2, shape)
    if dtype == 1:
        body += fld(5, arr.astype("<f4").tobytes())
    else:
        body += fld(10, b"".join(varint(int(v) & (2**64 - 1)) for v in arr.ravel()))
    return body


def model_spec(signature=""):
    return fld(1, fld(1, b"m") + (fld(3, signature.encode()) if signature else b""))


def predict_log(inputs, signature=""):
    req = model_spec(signature)
    for k, v in inputs.items():
        req += fld(2, fld(1, k.encode()) + fld(2, tensor_proto(v)))
    return fld(6, fld(1, req))  # PredictionLog.predict_log.request


def example(**feats):
    """tf.Example with float features."""
    fs = b""
    for k, vals in feats.items():
        floats = fld(1, struct.pack(f"<{len(vals)}f", *vals))  # FloatList.value, packed
        fs += fld(1, fld(1, k.encode()) + fld(2, fld(2, floats)))  # map entry -> Feature.float_list
    return fld(1, fs)  # Example.features


def classify_log(examples, signature, context=None, regress=False):
    if context is None:
        inp = fld(1, b"".join(fld(1, e) for e in examples))  # Input.example_list
    else:
        inp = fld(2, b"".join(fld(1, e) for e in examples) + fld(2, context))
    req = model_spec(signature) + fld(2, inp)
    return fld(3 if regress else 2, fld(1, req))


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(records):
    out = b""
    for r in records:
        n = struct.pack("<Q", len(r))
        out += n + struct.pack("<I", masked(crc32c(n))) + r + struct.pack("<I", masked(crc32c(r)))
    return out


def write_warmup(version_dir, data):
    d = Path(version_dir) / "assets.extra"
    d.mkdir(parents=True, exist_ok=True)
    (d / "tf_serving_warmup_requests").write_bytes(data)


def test_crc32c_reference():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


# ------------------------------------------------------------------ helpers


def metrics_text(srv):
    code, data, _ = srv.request("GET", "/monitoring/prometheus/metrics")
    assert code == 200
    return data.decode()


def metric(text, line_prefix):
    """Value of the first sample whose line starts with line_prefix (None if absent)."""
    for line in text.splitlines():
        if line.startswith(line_prefix):
            return float(line.rsplit(" ", 1)[1])
    return None


def status_of(srv, name, version):
    code, body = srv.json("GET", f"/v1/models/{name}/versions/{version}")
    assert code == 200, body
    return body["model_version_status"][0]


def load_lines(srv):
    return [ln for ln in srv.logtext().splitlines() if " event=load " in ln]


X1 = np.array([[1, 2, 3]], np.float32)
X2 = np.array([[1, 1, 1], [2, 2, 2]], np.float32)

# ------------------------------------------------------------------ warmup


def test_warmup_replayed_through_the_batcher(tmp_path):
    base = tmp_path / "w"
    save_affine(base / "1" / "model.onnx", 2.0, 1.0)
    write_warmup(base / "1", tfrecord([predict_log({"x": X1}), predict_log({"x": X2})]))
    pfile = tmp_path / "batching"
    pfile.write_text("max_batch_size { value: 4 }\nallowed_batch_sizes: 1\nallowed_batch_sizes: 2\n"
                     "allowed_batch_sizes: 4\nnum_batch_threads { value: 1 }\n")
    srv = Server(base, "w", "--enable_batching", f"--batching_parameters_file={pfile}",
                 "--num_request_iterations_for_warmup=3")
    try:
        text = metrics_text(srv)
        # 2 records x 3 iterations, each a batch of its own, before any request
        assert metric(text, ":tensorflow:serving:batching_session:wrapped_run_count") == 6
        assert metric(text, ':tensorflow:serving:model_warmup_records_read{model_path=') == 2
        assert ':tensorflow:serving:request_count{model_name="w"' not in text
        (line,) = load_lines(srv)
        assert "warmup_records=2 warmup_iterations=3" in line
        assert "precompiled_batch_sizes=1,2,4" in line and "optimization_log=" in line
        # the log's last line: the precompiled plans' arena and packed weights
        assert re.search(r"arena \d+ bytes, packed weights \d+ bytes \([3-9] plans\)", line), line
        assert status_of(srv, "w", 1)["state"] == "AVAILABLE"
        code, body = srv.json("POST", "/v1/models/w:predict", {"instances": [[1, 2, 3]]})
        assert code == 200 and body == {"predictions": [[3, 5, 7]]}
    finally:
        srv.kill()


def test_malformed_warmup_fails_the_version(tmp_path):
    base = tmp_path / "bad"
    for v in (1, 2, 3, 4, 5, 6):
        save_affine(base / str(v) / "model.onnx", float(v), 0.0)
    good = tfrecord([predict_log({"x": X1})])
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0xFF
    write_warmup(base / "2", bytes(bad_crc))
    write_warmup(base / "3", good[:-6])                              # truncated record
    write_warmup(base / "4", tfrecord([predict_log({"y": X1})]))     # no such input
    write_warmup(base / "5", tfrecord([b"\x0a\x05junk"]))            # not a PredictionLog
    write_warmup(base / "6", tfrecord([predict_log({"x": np.ones((1, 4), np.float32)})]))
    srv = Server(base, "bad")
    try:
        expect = {2: "data CRC mismatch", 3: "runs past the end", 4: "input 'x'",
                  5: "record 0", 6: "warmup record 0"}
        for v, needle in expect.items():
            st = status_of(srv, "bad", v)
            assert st["state"] == "END", (v, st)
            assert st["status"]["error_code"] != "OK", (v, st)
            assert needle in st["status"]["error_message"], (v, st)
        assert "warmup" in status_of(srv, "bad", 2)["status"]["error_message"]
        assert status_of(srv, "bad", 1)["state"] == "AVAILABLE"  # the latest good one serves
        code, body = srv.json("POST", "/v1/models/bad:predict", {"instances": [[1, 2, 3]]})
        assert code == 200 and body == {"predictions": [[1, 2, 3]]}
        assert srv.proc.poll() is None
        log = srv.logtext()
        assert log.count(" event=load_failed ") == 5 and "status=INVALID_ARGUMENT" in log
    finally:
        srv.kill()
    # with warmup off the same files are not read: version 6 serves
    srv = Server(base, "bad", "--enable_model_warmup=false")
    try:
        assert status_of(srv, "bad", 6)["state"] == "AVAILABLE"
        assert "warmup=disabled" in load_lines(srv)[0]
    finally:
        srv.kill()


def test_warmup_more_than_1000_records(tmp_path):
    base = tmp_path / "many"
    save_affine(base / "1" / "model.onnx", 1.0, 0.0)
    save_affine(base / "2" / "model.onnx", 2.0, 0.0)
    write_warmup(base / "2", tfrecord([predict_log({"x": X1})] * 1001))
    srv = Server(base, "many")
    try:
        msg = status_of(srv, "many", 2)["status"]["error_message"]
        assert "more than 1000 warmup records" in msg
    finally:
        srv.kill()


@pytest.mark.skipif(not HALF.is_dir(), reason=f"shared test model missing: {HALF}")
def test_classify_and_regress_warmup(tmp_path):
    base = tmp_path / "half"
    shutil.copytree(HALF, base / "1")
    shutil.copytree(HALF, base / "2")
    ex = [example(x=[1.0]), example(x=[4.0])]
    write_warmup(base / "1", tfrecord([
        classify_log(ex, "classify_x_to_y"),
        classify_log([example(x=[2.0])], "regress_x_to_y", context=example(c=[0.0]), regress=True),
    ]))
    # version 2: a classify record on the predict signature (float input)
    write_warmup(base / "2", tfrecord([classify_log(ex, "serving_default")]))
    srv = Server(base, "half")
    try:
        assert status_of(srv, "half", 1)["state"] == "AVAILABLE"
        st = status_of(srv, "half", 2)
        assert st["state"] == "END" and "one string input" in st["status"]["error_message"]
        (line,) = load_lines(srv)
        assert "warmup_records=2" in line
        code, body = srv.json("POST", "/v1/models/half:regress",
                              {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]})
        assert code == 200 and body == {"results": [3.0]}  # 0.5 * 2 + 2
    finally:
        srv.kill()


# ------------------------------------------------------------------ CORS, monitoring config


def test_cors(tmp_path):
    base = tmp_path / "c"
    save_affine(base / "1" / "model.onnx", 1.0, 0.0)
    srv = Server(base, "c", "--rest_api_enable_cors_support")
    try:
        c = test_serve.http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        c.request("GET", "/v1/models/c")
        r = c.getresponse()
        r.read()
        assert r.status == 200
        assert r.getheader("Access-Control-Allow-Origin") == "*"
        assert r.getheader("Access-Control-Allow-Methods") == "POST, GET"
        assert r.getheader("Access-Control-Allow-Headers") == "Content-Type"
        c.request("OPTIONS", "/v1/models/c:predict", headers={"Origin": "https://example.com"})
        r = c.getresponse()
        r.read()
        assert r.status == 200 and r.getheader("Access-Control-Allow-Origin") == "*"
        c.request("OPTIONS", "/v1/models/c:predict")
        r = c.getresponse()
        body = json.loads(r.read())
        assert r.status == 400 and body == {"error": "Origin header is missing in CORS preflight"}
        c.request("OPTIONS", "/v1/models/c:predict", headers={"Origin": "null"})
        r = c.getresponse()
        r.read()
        assert r.status == 400
        c.close()
    finally:
        srv.kill()
    srv = Server(base, "c")  # off by default: no headers, OPTIONS is a malformed /v1 request
    try:
        c = test_serve.http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        c.request("OPTIONS", "/v1/models/c:predict", headers={"Origin": "https://example.com"})
        r = c.getresponse()
        body = json.loads(r.read())
        assert r.status == 400 and body["error"].startswith("Malformed request: OPTIONS")
        assert r.getheader("Access-Control-Allow-Origin") is None
        c.close()
    finally:
        srv.kill()


def test_monitoring_config(tmp_path):
    base = tmp_path / "mon"
    save_affine(base / "1" / "model.onnx", 1.0, 0.0)
    default = "/monitoring/prometheus/metrics"
    srv = Server(base, "mon", metrics=False)  # TF Serving's default: no metrics page
    try:
        assert srv.request("GET", default)[0] == 404
    finally:
        srv.kill()
    cfg = tmp_path / "m.config"
    cfg.write_text('prometheus_config { enable: true path: "/custom/metrics" }\n')
    srv = Server(base, "mon", f"--monitoring_config_file={cfg}", metrics=False)
    try:
        code, data, ctype = srv.request("GET", "/custom/metrics")
        assert code == 200 and ctype.startswith("text/plain")
        assert b":tensorflow:serving:request_count" in data
        assert srv.request("GET", default)[0] == 404
        # printed once the listener is up, so possibly just after the first reply
        assert wait_for(lambda: "Prometheus metrics at /custom/metrics" in srv.logtext(), 10), \
            srv.logtext()
    finally:
        srv.kill()
    cfg.write_text("prometheus_config { enable: false }\n")
    srv = Server(base, "mon", f"--monitoring_config_file={cfg}", metrics=False)
    try:
        assert srv.request("GET", default)[0] == 404
    finally:
        srv.kill()
    cfg.write_text("prometheus_config { enable: true }\n")  # empty path: the default
    srv = Server(base, "mon", f"--monitoring_config_file={cfg}", metrics=False)
    try:
        assert srv.request("GET", default)[0] == 200
    finally:
        srv.kill()
    for bad in ("prometheus_config { enabel: true }\n", 'prometheus_config { path: "x" }\n'):
        cfg.write_text(bad)
        r = subprocess.run([KILN, "serve", f"--model_base_path={base}",
                            f"--monitoring_config_file={cfg}", "--rest_api_port=1"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode != 0 and "--monitoring_config_file" in r.stderr


# ------------------------------------------------------------------ deadlines


def save_slow(path, n_nodes=400):
    """n = int64 [2] input; W = ones(n) * 1e-3; h = W @ W @ W ... (n_nodes MatMuls):
    the request picks the size, so one model is fast or slow on demand."""
    n = helper.make_tensor_value_info("n", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("ConstantOfShape", ["n"], ["w0"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1e-3]))]
    prev = "w0"
    for i in range(n_nodes):
        out = "y" if i == n_nodes - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, "w0"], [out]))
        prev = out
    g = helper.make_graph(nodes, "slow", [n], [y])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_deadline_stops_the_run(tmp_path):
    base = tmp_path / "slow"
    save_slow(base / "1" / "model.onnx")
    srv = Server(base, "slow", "--rest_api_timeout_in_ms=500")
    try:
        code, body = srv.json("POST", "/v1/models/slow:predict", {"inputs": {"n": [4, 4]}})
        assert code == 200, body
        t0 = time.time()
        code, body = srv.json("POST", "/v1/models/slow:predict", {"inputs": {"n": [512, 512]}},
                              timeout=120)
        elapsed = time.time() - t0
        # 400 MatMuls of 512^3 (0.27 GFLOP each; ~25 s here without a deadline, 2 cores)
        assert code == 504 and body["error"] == "Deadline Exceeded", body
        assert elapsed < 8, elapsed
        text = metrics_text(srv)
        assert metric(text, 'kiln_request_errors_total{model_name="slow",API="predict",'
                            'code="DEADLINE_EXCEEDED"}') == 1
        assert srv.json("POST", "/v1/models/slow:predict", {"inputs": {"n": [4, 4]}})[0] == 200
    finally:
        srv.kill()


def test_deadline_in_batching(tmp_path):
    base = tmp_path / "slowb"
    save_slow(base / "1" / "model.onnx")
    pfile = tmp_path / "batching"
    # a lone request waits 2 s for company: past its 500 ms deadline when the batch forms
    pfile.write_text("max_batch_size { value: 8 }\nbatch_timeout_micros { value: 2000000 }\n"
                     "num_batch_threads { value: 1 }\n")
    srv = Server(base, "slowb", "--rest_api_timeout_in_ms=500", "--enable_batching",
                 f"--batching_parameters_file={pfile}")
    try:
        code, body = srv.json("POST", "/v1/models/slowb:predict",
                              {"inputs": {"n": [4, 4]}}, timeout=60)
        assert code == 504 and body["error"] == "Deadline Exceeded", body
        text = metrics_text(srv)
        assert metric(text, 'kiln_batch_deadline_expired_total{model_name="slowb",version="1"}') == 1
        assert metric(text, ":tensorflow:serving:batching_session:wrapped_run_count") == 0  # never ran
    finally:
        srv.kill()
    pfile.write_text("max_batch_size { value: 8 }\nnum_batch_threads { value: 1 }\n")
    srv = Server(base, "slowb", "--rest_api_timeout_in_ms=500", "--enable_batching",
                 f"--batching_parameters_file={pfile}")
    try:  # a batch that runs is stopped at its deadline too
        t0 = time.time()
        code, body = srv.json("POST", "/v1/models/slowb:predict", {"inputs": {"n": [512, 512]}},
                              timeout=120)
        assert code == 504 and time.time() - t0 < 8, body
    finally:
        srv.kill()


# ------------------------------------------------------------------ metrics, logs, flags


def test_kiln_metrics_move(tmp_path):
    base = tmp_path / "km"
    save_affine(base / "1" / "model.onnx", 1.0, 0.0)
    srv = Server(base, "km")
    try:
        lat = 'kiln_request_latency_us_count{model_name="km",version="1",API="predict"}'
        err = 'kiln_request_errors_total{model_name="km",API="predict",code="INVALID_ARGUMENT"}'
        before = metrics_text(srv)
        assert metric(before, lat) is None and metric(before, err) is None
        for _ in range(3):
            assert srv.json("POST", "/v1/models/km:predict", {"instances": [[1, 2, 3]]})[0] == 200
        assert srv.json("POST", "/v1/models/km:predict", {"instances": [[1, 2]]})[0] == 400
        text = metrics_text(srv)
        assert metric(text, lat) == 4  # the failed one reached version 1 too
        assert metric(text, err) == 1
        assert 'kiln_request_latency_us_bucket{model_name="km",version="1",API="predict",le="+Inf"} 4' in text
        assert metric(text, "kiln_process_resident_memory_bytes") > 1 << 20
        assert metric(text, 'kiln_model_version_requests_in_flight{model_name="km",version="1"}') == 0
        # this scrape; the request before it leaves the gauge when libmicrohttpd reports it
        # completed, which can come just after its client has read the reply
        deadline = time.monotonic() + 5.0
        while metric(text, "kiln_http_requests_in_flight") != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
            text = metrics_text(srv)
        assert metric(text, "kiln_http_requests_in_flight") == 1
    finally:
        srv.kill()


def test_load_log_and_flags(tmp_path):
    base = tmp_path / "lg"
    save_affine(base / "1" / "model.onnx", 1.0, 0.0)
    srv = Server(base, "lg", "--disable_optimizer", "--tensorflow_intra_op_parallelism=2",
                 "--use_tfrt=true")
    try:
        text = srv.logtext()
        (line,) = load_lines(srv)
        assert re.search(r'event=load model="lg" version=1 format=\S+ signatures=1 load_ms=', line)
        assert 'optimization_log="optimizer disabled' in line and "state=AVAILABLE" in line
        honoured = [ln for ln in text.splitlines() if "honoured flags:" in ln]
        assert len(honoured) == 1
        h = honoured[0]
        assert "--disable_optimizer=true (optimizer off)" in h
        assert "--tensorflow_intra_op_parallelism=2 (threads per run)" in h
        assert "accepted and ignored:" in h and "--use_tfrt" in h.split("accepted and ignored:")[1]
        assert "--use_tfrt is accepted and ignored" in text
        # a version removed from disk: one unload line once the next one serves
        save_affine(base / "2" / "model.onnx", 2.0, 0.0)
        assert wait_for(lambda: " event=unload " in srv.logtext())
        assert wait_for(lambda: len(load_lines(srv)) == 2)
    finally:
        srv.kill()


def test_load_log_before_any_plan(tmp_path):
    # no warmup, no batching: nothing compiles at load, and the log says so
    base = tmp_path / "np"
    save_affine(base / "1" / "model.onnx", 1.0, 0.0)
    srv = Server(base, "np")
    try:
        (line,) = load_lines(srv)
        assert "matmul_fusion" in line and "arena: no plan yet" in line, line
        code, body = srv.json("POST", "/v1/models/np:predict", {"instances": [[1, 2, 3]]})
        assert code == 200 and body == {"predictions": [[1, 2, 3]]}
    finally:
        srv.kill()
