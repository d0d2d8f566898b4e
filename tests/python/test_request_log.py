"""End-to-end tests for `kiln serve`'s request log (TF Serving's
logging_config in the model config; src/serve/reqlog/, docs/REQUEST_LOG.md)
and `kiln warmup-from-log`.

A real server on loopback gets requests over REST and gRPC (python grpcio);
the log files are then read back independently: the TFRecord framing and
its CRC-32C by the code below (checked against the Castagnoli check value),
the PredictionLog records by the protobuf runtime from TF Serving's own
schemas (src/import/proto/api) plus the logging messages written here from
tensorflow_serving/apis/prediction_log.proto and core/logging.proto.
Expected outputs come from numpy (the model is y = x * a + b, z = -y) and
from the answers the server gave. JSON-lines logs are read with json.loads.
"""

import json
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("google.protobuf")
pytest.importorskip("onnx")

import test_grpc  # noqa: E402
from test_grpc import API, KILN, PROTOC, PS, Server, model_line, save_affine  # noqa: E402
from conftest import TESTDATA  # noqa: E402

pytestmark = test_grpc.pytestmark

A = np.array([2.0, 3.0, 4.0], np.float32)
B = np.array([1.0, 0.5, -1.0], np.float32)
HALF = (TESTDATA / "savedmodels/serving/tensorflow_serving/servables/tensorflow/testdata/"
        "saved_model_half_plus_two_2_versions/00000123")

# TF Serving's request-log messages (tensorflow_serving/apis/prediction_log.proto,
# tensorflow_serving/core/logging.proto, config/logging_config.proto), for
# decoding what Kiln writes with the protobuf runtime.
LOG_PROTO = """
syntax = "proto3";
package tensorflow.serving;
import "tensorflow_serving/apis/classification.proto";
import "tensorflow_serving/apis/model.proto";
import "tensorflow_serving/apis/predict.proto";
import "tensorflow_serving/apis/regression.proto";
message SamplingConfig { double sampling_rate = 1; int32 attributes = 2; }
message LogMetadata {
  ModelSpec model_spec = 1;
  SamplingConfig sampling_config = 2;
  repeated string saved_model_tags = 3;
}
message ClassifyLog { ClassificationRequest request = 1; ClassificationResponse response = 2; }
message RegressLog { RegressionRequest request = 1; RegressionResponse response = 2; }
message PredictLog { PredictRequest request = 1; PredictResponse response = 2; }
message PredictionLog {
  LogMetadata log_metadata = 1;
  oneof log_type {
    ClassifyLog classify_log = 2;
    RegressLog regress_log = 3;
    PredictLog predict_log = 6;
  }
}
"""


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    out = tmp_path_factory.mktemp("pb")
    (out / "kiln_reqlog_test.proto").write_text(LOG_PROTO)
    protos = sorted(str(p.relative_to(API)) for p in API.rglob("*.proto")
                    if "tensorflow" in p.parts[len(API.parts)])
    subprocess.run([PROTOC, f"-I{API}", f"-I{out}", f"--python_out={out}", *protos,
                    "kiln_reqlog_test.proto"], check=True)
    sys.path.insert(0, str(out))
    import kiln_reqlog_test_pb2 as log  # noqa: E402
    from tensorflow.core.framework import tensor_pb2  # noqa: E402
    from tensorflow_serving.apis import predict_pb2  # noqa: E402
    yield type("PB", (), {"log": log, "tensor": tensor_pb2, "predict": predict_pb2})
    sys.path.remove(str(out))


# ------------------------------------------------------------------ TFRecord reader


def crc32c(data):
    table = crc32c.table
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        t.append(c)
    return t


crc32c.table = _table()


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def read_tfrecords(data):
    """The records of a TFRecord file; every CRC checked, no bytes left over."""
    out, at = [], 0
    while at < len(data):
        assert len(data) - at >= 16, "truncated record header"
        (n,) = struct.unpack_from("<Q", data, at)
        (lcrc,) = struct.unpack_from("<I", data, at + 8)
        assert lcrc == masked(crc32c(data[at:at + 8])), "length CRC"
        rec = data[at + 12:at + 12 + n]
        assert len(rec) == n, "truncated record"
        (dcrc,) = struct.unpack_from("<I", data, at + 12 + n)
        assert dcrc == masked(crc32c(rec)), "data CRC"
        out.append(rec)
        at += 16 + n
    return out


def test_crc32c_reference():
    assert crc32c(b"123456789") == 0xE3069283  # the published CRC-32C check value


def to_numpy(tp):
    """A float TensorProto as numpy (tensor_content or float_val)."""
    shape = [d.size for d in tp.tensor_shape.dim]
    assert tp.dtype == 1  # DT_FLOAT
    if tp.tensor_content:
        return np.frombuffer(tp.tensor_content, "<f4").reshape(shape)
    return np.array(tp.float_val, np.float32).reshape(shape)


def disk_use(files):
    """Bytes in files, those deleted meanwhile counting 0."""
    total = 0
    for f in files:
        try:
            total += f.stat().st_size
        except FileNotFoundError:
            pass
    return total


def log_files(prefix, ext="tfrecord"):
    return sorted(Path(prefix).parent.glob(Path(prefix).name + f".*.{ext}"))


def read_logs(pb, prefix):
    logs = []
    for f in log_files(prefix):
        for rec in read_tfrecords(f.read_bytes()):
            m = pb.log.PredictionLog()
            m.ParseFromString(rec)
            logs.append(m)
    return logs


def metric(srv, line_prefix):
    code, data = srv.http("GET", "/metrics")
    assert code == 200
    for line in data.decode().splitlines():
        if line.startswith(line_prefix):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_records(srv, model, n, timeout=20):
    key = f'kiln_request_log_records_total{{model_name="{model}"}}'
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (metric(srv, key) or 0) >= n:
            return metric(srv, key)
        time.sleep(0.05)
    return metric(srv, key)


def settle(srv, key, timeout=20):
    """A metric's value once it has not moved for 0.3 s (the writer is idle)."""
    last, since, deadline = None, time.time(), time.time() + timeout
    while time.time() < deadline:
        v = metric(srv, key)
        if v != last:
            last, since = v, time.time()
        elif time.time() - since >= 0.3:
            break
        time.sleep(0.05)
    return last


def logging_line(name, base, prefix, rate, kind=""):
    t = f'type: "{kind}" ' if kind else ""
    return (f'config {{ name: "{name}" base_path: "{base}" model_platform: "onnx" '
            f'logging_config {{ log_collector_config {{ {t}filename_prefix: "{prefix}" }} '
            f'sampling_config {{ sampling_rate: {rate} }} }} }}\n')


def rest_predict(srv, model, x):
    code, body = srv.http("POST", f"/v1/models/{model}:predict",
                          {"inputs": {"x": x.tolist()}})
    assert code == 200, body
    return json.loads(body)["outputs"]


def grpc_predict(srv, pb, model, x):
    req = pb.predict.PredictRequest()
    req.model_spec.name = model
    t = req.inputs["x"]
    t.dtype = 1
    t.tensor_shape.dim.add().size = x.shape[0]
    t.tensor_shape.dim.add().size = x.shape[1]
    t.float_val.extend(x.ravel().tolist())
    r = srv.call(PS + "Predict", req, pb.predict.PredictResponse)
    return {k: to_numpy(v) for k, v in r.outputs.items()}


# ------------------------------------------------------------------ PredictionLog TFRecords


def test_predict_log_rest_and_grpc(tmp_path, pb):
    save_affine(tmp_path / "aff" / "1" / "model.onnx", A, B)
    prefix = tmp_path / "logs" / "aff"
    prefix.parent.mkdir()
    srv = Server(tmp_path, [logging_line("aff", tmp_path / "aff", prefix, 1.0)])
    rng = np.random.default_rng(7)
    sent = []
    try:
        for i in range(6):
            x = rng.normal(size=(1 + i % 3, 3)).astype(np.float32)
            if i % 2 == 0:
                out = rest_predict(srv, "aff", x)
                sent.append((x, np.array(out["y"], np.float32), np.array(out["z"], np.float32)))
            else:
                out = grpc_predict(srv, pb, "aff", x)
                sent.append((x, out["y"], out["z"]))
        assert wait_records(srv, "aff", 6) == 6
        assert metric(srv, 'kiln_request_log_dropped_total{model_name="aff",reason="queue_full"}') == 0
        files = log_files(prefix)
        assert metric(srv, "kiln_request_log_disk_bytes") == sum(f.stat().st_size for f in files)
    finally:
        srv.kill()
    logs = read_logs(pb, prefix)
    assert len(logs) == 6
    for (x, y, z), m in zip(sent, logs):
        assert m.WhichOneof("log_type") == "predict_log"
        md = m.log_metadata
        assert md.model_spec.name == "aff" and md.model_spec.version.value == 1
        assert md.model_spec.signature_name == "serving_default"
        assert md.sampling_config.sampling_rate == 1.0
        req, res = m.predict_log.request, m.predict_log.response
        assert req.model_spec.name == "aff" and set(req.inputs) == {"x"}
        np.testing.assert_array_equal(to_numpy(req.inputs["x"]), x)
        assert set(res.outputs) == {"y", "z"}
        want = x * A + B  # numpy's answer
        np.testing.assert_allclose(to_numpy(res.outputs["y"]), want, rtol=1e-6)
        np.testing.assert_allclose(to_numpy(res.outputs["z"]), -want, rtol=1e-6)
        # and exactly what the server answered
        np.testing.assert_allclose(to_numpy(res.outputs["y"]), y, rtol=1e-6)
        np.testing.assert_allclose(to_numpy(res.outputs["z"]), z, rtol=1e-6)


def test_sampling_rate(tmp_path, pb):
    save_affine(tmp_path / "aff" / "1" / "model.onnx", A, B)
    prefix = tmp_path / "aff"  # files next to the model folder
    rate, n = 0.25, 400
    srv = Server(tmp_path, [logging_line("aff", tmp_path / "aff", prefix, rate)])
    try:
        x = np.ones((1, 3), np.float32)
        for _ in range(n):
            rest_predict(srv, "aff", x)
        k = settle(srv, 'kiln_request_log_records_total{model_name="aff"}')
    finally:
        srv.kill()
    logs = read_logs(pb, prefix)
    assert len(logs) == k
    # binomial(400, 0.25): mean 100, sd 8.66; 5 sd either side
    sd = (n * rate * (1 - rate)) ** 0.5
    assert abs(k - n * rate) <= 5 * sd, k
    assert all(m.log_metadata.sampling_config.sampling_rate == rate for m in logs)


def test_rotation_keeps_disk_bound(tmp_path, pb):
    save_affine(tmp_path / "aff" / "1" / "model.onnx", A, B)
    prefix = tmp_path / "logs" / "aff"
    prefix.parent.mkdir()
    # a file a previous run left: counts toward the bound, deleted first
    old = Path(str(prefix) + ".20200101-000000.000000.tfrecord")
    old.write_bytes(b"\0" * 3000)
    max_file, max_disk = 2048, 8192
    srv = Server(tmp_path, [logging_line("aff", tmp_path / "aff", prefix, 1.0)],
                 f"--request_log_max_file_bytes={max_file}", "--request_log_max_disk_bytes=8K")
    n = 150
    xs = [np.full((1, 3), i, np.float32) for i in range(n)]
    try:
        for x in xs:
            rest_predict(srv, "aff", x)
            assert disk_use(log_files(prefix)) <= max_disk
        assert wait_records(srv, "aff", n) == n
        files = log_files(prefix)
        assert metric(srv, "kiln_request_log_disk_bytes") == sum(f.stat().st_size for f in files)
    finally:
        srv.kill()
    assert not old.exists()
    files = log_files(prefix)
    assert len(files) >= 3
    sizes = [f.stat().st_size for f in files]
    assert sum(sizes) <= max_disk
    kept = []
    for f in files:
        recs = read_tfrecords(f.read_bytes())
        assert f.stat().st_size <= max_file or len(recs) == 1
        for r in recs:
            m = pb.log.PredictionLog()
            m.ParseFromString(r)
            kept.append(int(to_numpy(m.predict_log.request.inputs["x"])[0, 0]))
    # the newest records survive, in order, with nothing missing between them
    assert kept == list(range(n - len(kept), n)) and len(kept) > 20


def test_jsonl_log(tmp_path, pb):
    save_affine(tmp_path / "aff" / "1" / "model.onnx", A, B)
    prefix = tmp_path / "aff-json"
    srv = Server(tmp_path, [logging_line("aff", tmp_path / "aff", prefix, 1, "kiln_jsonl")])
    xs = [np.array([[1.5, -2, 3]], np.float32), np.array([[0, 1, 2], [3, 4, 5]], np.float32)]
    try:
        rest_predict(srv, "aff", xs[0])
        grpc_predict(srv, pb, "aff", xs[1])
        assert wait_records(srv, "aff", 2) == 2
    finally:
        srv.kill()
    (f,) = log_files(prefix, "jsonl")
    lines = f.read_text().splitlines()
    assert len(lines) == 2
    for line, x, ep in zip(lines, xs, ["REST", "GRPC"]):
        r = json.loads(line)
        assert r["model_name"] == "aff" and r["version"] == 1 and r["api"] == "predict"
        assert r["entrypoint"] == ep and r["signature_name"] == "serving_default"
        assert r["time"].endswith("Z") and r["latency_us"] >= 0
        np.testing.assert_array_equal(np.array(r["request"]["inputs"]["x"], np.float32), x)
        want = x * A + B
        np.testing.assert_allclose(np.array(r["response"]["outputs"]["y"]), want, rtol=1e-6)
        np.testing.assert_allclose(np.array(r["response"]["outputs"]["z"]), -want, rtol=1e-6)


def _log_until(srv, model, n, x, timeout=20):
    """Send predicts until the model's records_total reaches n (a reload takes
    effect within a poll); the number sent."""
    sent, deadline = 0, time.time() + timeout
    while time.time() < deadline:
        rest_predict(srv, model, x)
        sent += 1
        if (settle(srv, f'kiln_request_log_records_total{{model_name="{model}"}}', timeout=2) or 0) >= n:
            return sent
    raise AssertionError(f"no request log records for {model} after {sent} requests:\n" + srv.logtext())


def test_logging_config_reload_from_file(tmp_path, pb):
    """logging_config follows the polled model config file: none at start (no
    record), then PredictionLog TFRecords under a prefix, then off again."""
    save_affine(tmp_path / "aff" / "1" / "model.onnx", A, B)
    prefix = tmp_path / "logs" / "aff"
    prefix.parent.mkdir()
    srv = Server(tmp_path, [model_line("aff", tmp_path / "aff")],
                 "--model_config_file_poll_wait_seconds=1")
    cfg = tmp_path / "models.config"
    x = np.array([[1.0, -2.0, 0.5]], np.float32)
    try:
        rest_predict(srv, "aff", x)
        assert metric(srv, 'kiln_request_log_records_total{model_name="aff"}') is None
        cfg.write_text("model_config_list {\n" + logging_line("aff", tmp_path / "aff", prefix, 1.0) + "}\n")
        _log_until(srv, "aff", 1, x)
        assert "request log of model 'aff' (reloaded): sampling_rate 1" in srv.logtext()
        for _ in range(3):
            rest_predict(srv, "aff", x)
        n_on = wait_records(srv, "aff", 4)
        assert n_on >= 4
        cfg.write_text("model_config_list {\n" + model_line("aff", tmp_path / "aff") + "}\n")
        deadline = time.time() + 20
        while "request log of model 'aff' (reloaded): off" not in srv.logtext():
            assert time.time() < deadline, srv.logtext()
            time.sleep(0.1)
        before = settle(srv, 'kiln_request_log_records_total{model_name="aff"}')
        for _ in range(5):
            rest_predict(srv, "aff", x)
        assert settle(srv, 'kiln_request_log_records_total{model_name="aff"}') == before
    finally:
        srv.kill()
    logs = read_logs(pb, prefix)
    assert len(logs) == before
    for m in logs:  # every record decodes to what numpy computes
        np.testing.assert_array_equal(to_numpy(m.predict_log.request.inputs["x"]), x)
        np.testing.assert_allclose(to_numpy(m.predict_log.response.outputs["y"]), x * A + B, rtol=1e-6)


def _field(number, payload):
    """A length-delimited protobuf field."""
    def varint(v):
        out = b""
        while True:
            out += bytes([(v & 0x7F) | (0x80 if v > 0x7F else 0)])
            if v <= 0x7F:
                return out
            v >>= 7
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_logging_config_reload_over_grpc(tmp_path, pb):
    """HandleReloadConfigRequest changes a model's logging_config while
    serving: from TFRecords under one prefix to JSON lines under another,
    with a new sampling rate in the records."""
    from tensorflow_serving.apis import model_management_pb2
    save_affine(tmp_path / "aff" / "1" / "model.onnx", A, B)
    first, second = tmp_path / "first" / "aff", tmp_path / "second" / "aff"
    first.parent.mkdir()
    second.parent.mkdir()
    srv = Server(tmp_path, [logging_line("aff", tmp_path / "aff", first, 1.0)])
    x = np.array([[0.25, 4.0, -1.0]], np.float32)
    try:
        rest_predict(srv, "aff", x)
        assert wait_records(srv, "aff", 1) == 1
        req = model_management_pb2.ReloadConfigRequest()
        c = req.config.model_config_list.config.add(name="aff", base_path=str(tmp_path / "aff"),
                                                    model_platform="onnx")
        # ModelConfig.logging_config (field 6; TF Serving's logging_config.proto), which
        # the API protos built here leave out: its wire bytes, kept as an unknown field
        c.MergeFromString(_field(6, _field(1, _field(1, b"kiln_jsonl") + _field(2, str(second).encode()))
                                 + _field(2, b"\x09" + struct.pack("<d", 0.999999))))
        r = srv.call("/tensorflow.serving.ModelService/HandleReloadConfigRequest", req,
                     model_management_pb2.ReloadConfigResponse, timeout=60)
        assert r.status.error_code == 0
        for _ in range(40):  # a few may be left out by the sampling (1e-6 each)
            rest_predict(srv, "aff", x)
        total = wait_records(srv, "aff", 40)
    finally:
        srv.kill()
    assert len(read_logs(pb, first)) == 1
    (f,) = log_files(second, "jsonl")
    lines = [json.loads(ln) for ln in f.read_text().splitlines()]
    assert len(lines) == total - 1 and len(lines) >= 39
    for r in lines:
        assert r["sampling_rate"] == 0.999999
        np.testing.assert_allclose(np.array(r["response"]["outputs"]["y"]), x * A + B, rtol=1e-6)


def test_unwritable_folder_is_counted_not_fatal(tmp_path, pb):
    save_affine(tmp_path / "aff" / "1" / "model.onnx", A, B)
    prefix = tmp_path / "no" / "such" / "folder" / "aff"
    srv = Server(tmp_path, [logging_line("aff", tmp_path / "aff", prefix, 1.0)])
    try:
        x = np.ones((1, 3), np.float32)
        for _ in range(5):
            np.testing.assert_allclose(np.array(rest_predict(srv, "aff", x)["y"]), x * A + B)
        key = 'kiln_request_log_dropped_total{model_name="aff",reason="write_error"}'
        deadline = time.time() + 10
        while time.time() < deadline and metric(srv, key) < 5:
            time.sleep(0.05)
        assert metric(srv, key) == 5
        assert metric(srv, 'kiln_request_log_records_total{model_name="aff"}') == 0
        assert srv.logtext().count("request log of model 'aff': cannot create") == 1
    finally:
        srv.kill()


def test_queue_drops_are_counted(tmp_path, pb):
    """With a one-record queue and concurrent clients, every sampled request is
    either written or counted as dropped; none is lost, none blocks."""
    save_affine(tmp_path / "aff" / "1" / "model.onnx", A, B)
    prefix = tmp_path / "aff"
    srv = Server(tmp_path, [logging_line("aff", tmp_path / "aff", prefix, 1.0)],
                 "--request_log_queue_size=1")
    n_threads, per = 4, 40
    try:
        def client():
            for _ in range(per):
                rest_predict(srv, "aff", np.ones((4, 3), np.float32))

        ts = [threading.Thread(target=client) for _ in range(n_threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        written = settle(srv, 'kiln_request_log_records_total{model_name="aff"}')
        dropped = metric(srv, 'kiln_request_log_dropped_total{model_name="aff",reason="queue_full"}')
    finally:
        srv.kill()
    assert written + dropped == n_threads * per
    assert len(read_logs(pb, prefix)) == written


def test_sigterm_writes_what_is_queued(tmp_path, pb):
    save_affine(tmp_path / "aff" / "1" / "model.onnx", A, B)
    prefix = tmp_path / "aff"
    srv = Server(tmp_path, [logging_line("aff", tmp_path / "aff", prefix, 1.0)])
    n = 40
    try:
        for i in range(n):
            rest_predict(srv, "aff", np.full((1, 3), i, np.float32))
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=30) == 0
    finally:
        srv.kill()
    logs = read_logs(pb, prefix)
    assert [int(to_numpy(m.predict_log.request.inputs["x"])[0, 0]) for m in logs] == list(range(n))


def test_bad_logging_config_is_refused(tmp_path):
    save_affine(tmp_path / "aff" / "1" / "model.onnx", A, B)
    for line, msg in [
        (logging_line("aff", tmp_path / "aff", tmp_path / "l", 1.5), "sampling_rate must be in [0, 1]"),
        (logging_line("aff", tmp_path / "aff", tmp_path / "l", 1, "fluentd"),
         "type 'fluentd' is not a log collector Kiln has"),
        (logging_line("aff", tmp_path / "aff", "", 0.5), "filename_prefix is empty"),
    ]:
        cfg = tmp_path / "bad.config"
        cfg.write_text("model_config_list {\n" + line + "}\n")
        r = subprocess.run([KILN, "serve", f"--model_config_file={cfg}", "--rest_api_port=1",
                            "--port=0"], capture_output=True, text=True, timeout=30)
        assert r.returncode != 0 and msg in r.stderr, r.stderr


# ------------------------------------------------------------------ classify and regress


def example(**feats):
    from tensorflow.core.example import example_pb2  # noqa: E402
    e = example_pb2.Example()
    for k, v in feats.items():
        e.features.feature[k].float_list.value.extend(v)
    return e


def test_classify_and_regress_logs(tmp_path, pb):
    if not HALF.is_dir():
        pytest.skip(f"shared test data not found: {HALF}")
    import shutil
    shutil.copytree(HALF, tmp_path / "half" / "1")
    prefix = tmp_path / "half"
    line = logging_line("half", tmp_path / "half", prefix, 1.0).replace('"onnx"', '"tensorflow"')
    srv = Server(tmp_path, [line])
    try:
        code, body = srv.http("POST", "/v1/models/half:classify",
                              {"signature_name": "classify_x_to_y", "examples": [{"x": 1.0}, {"x": 4.0}]})
        assert code == 200, body
        code, body = srv.http("POST", "/v1/models/half:regress",
                              {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]})
        assert code == 200 and json.loads(body) == {"results": [3.0]}
        assert wait_records(srv, "half", 2) == 2
    finally:
        srv.kill()
    c, r = read_logs(pb, prefix)
    assert c.WhichOneof("log_type") == "classify_log" and r.WhichOneof("log_type") == "regress_log"
    assert c.classify_log.request.model_spec.signature_name == "classify_x_to_y"
    exs = c.classify_log.request.input.example_list.examples
    assert [list(e.features.feature["x"].float_list.value) for e in exs] == [[1.0], [4.0]]
    scores = [[k.score for k in cl.classes] for cl in c.classify_log.response.result.classifications]
    assert scores == [[2.5], [4.0]]  # 0.5 * x + 2
    assert [g.value for g in r.regress_log.response.result.regressions] == [3.0]
    (ex,) = r.regress_log.request.input.example_list.examples
    assert list(ex.features.feature["x"].float_list.value) == [2.0]


# ------------------------------------------------------------------ warmup-from-log


def test_warmup_from_log_loads_and_replays(tmp_path, pb):
    save_affine(tmp_path / "aff" / "1" / "model.onnx", A, B)
    prefix = tmp_path / "logs" / "aff"
    prefix.parent.mkdir()
    srv = Server(tmp_path, [logging_line("aff", tmp_path / "aff", prefix, 1.0)],
                 "--request_log_max_file_bytes=600")
    xs = [np.full((1 + i % 2, 3), i, np.float32) for i in range(7)]
    try:
        for x in xs:
            rest_predict(srv, "aff", x)
        assert wait_records(srv, "aff", len(xs)) == len(xs)
    finally:
        srv.kill()
    files = log_files(prefix)
    assert len(files) > 1  # several files, read in name order
    logged = read_logs(pb, prefix)

    # version 2: the same model, warmed up from version 1's log
    save_affine(tmp_path / "aff" / "2" / "model.onnx", A, B)
    out = tmp_path / "aff" / "2" / "assets.extra" / "tf_serving_warmup_requests"
    out.parent.mkdir()
    r = subprocess.run([KILN, "warmup-from-log", *map(str, files), "-o", str(out), "--max", "5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "wrote 5 warmup records" in r.stdout
    recs = read_tfrecords(out.read_bytes())
    assert len(recs) == 5
    for rec, m in zip(recs, logged):
        w = pb.log.PredictionLog()
        w.ParseFromString(rec)
        assert w.WhichOneof("log_type") == "predict_log"
        assert not w.HasField("log_metadata") and not w.predict_log.HasField("response")
        assert w.predict_log.request == m.predict_log.request

    # a server loading version 2 replays those 5 requests before serving it
    srv = Server(tmp_path, [model_line("aff", tmp_path / "aff")])
    try:
        assert metric(srv, ':tensorflow:serving:model_warmup_records_read{model_path=') == 5
        assert "warmup_records=5" in srv.logtext()
        np.testing.assert_allclose(np.array(rest_predict(srv, "aff", xs[0])["y"]), xs[0] * A + B)
    finally:
        srv.kill()


def test_warmup_from_log_refuses_corrupt_logs(tmp_path):
    good = tmp_path / "x.tfrecord"
    good.write_bytes(b"")
    r = subprocess.run([KILN, "warmup-from-log", str(good), "-o", str(tmp_path / "w")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "nothing written" in r.stderr
    bad = tmp_path / "bad.tfrecord"
    n = struct.pack("<Q", 3)
    bad.write_bytes(n + struct.pack("<I", masked(crc32c(n))) + b"abc" + b"\0\0\0\0")
    r = subprocess.run([KILN, "warmup-from-log", str(bad), "-o", str(tmp_path / "w")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "record 0: data CRC mismatch" in r.stderr, r.stderr
    assert not (tmp_path / "w").exists()
