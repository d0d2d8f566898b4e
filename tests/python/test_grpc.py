"""End-to-end tests for `kiln serve`'s gRPC API (TF Serving's
PredictionService and ModelService, grpc.health.v1, grpc.reflection) with
Debian's python3-grpcio as the client.

Message classes are generated at test time by protoc --python_out from
Kiln's published schemas (src/import/proto/api), and every call is a generic
channel.unary_unary / unary_stream / stream_stream on the method path, as a
client generated from TF Serving's own protos would make it. Expected values
come from numpy (the models are y = x*a + b and identities), from REST and
KServe v2 answers of the same server, and from TF Serving's documented
status codes and messages. Every wait is bounded; servers are always killed.
"""

import concurrent.futures
import http.client
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
grpc = pytest.importorskip("grpc")
pytest.importorskip("google.protobuf")
from onnx import TensorProto as OnnxTP, helper, numpy_helper  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
KILN = os.environ.get("KILN_BIN") or str(REPO / "build" / "kiln")
API = REPO / "src" / "import" / "proto" / "api"
PROTOC = "/usr/bin/protoc"

pytestmark = [
    pytest.mark.skipif(not (os.path.isfile(KILN) and os.access(KILN, os.X_OK)),
                       reason=f"kiln binary not found at {KILN} (build it, or set KILN_BIN)"),
    pytest.mark.skipif(not os.path.exists(PROTOC), reason="protoc (protobuf-compiler) missing"),
]

PS = "/tensorflow.serving.PredictionService/"
MS = "/tensorflow.serving.ModelService/"

# ------------------------------------------------------------------ protos


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    """The generated modules, as attributes: pb.predict, pb.tensor, ..."""
    out = tmp_path_factory.mktemp("pb")
    protos = sorted(str(p.relative_to(API)) for p in API.rglob("*.proto"))
    subprocess.run([PROTOC, f"-I{API}", f"--python_out={out}", *protos], check=True)
    sys.path.insert(0, str(out))

    def load_file(rel, name):
        # grpc/... would collide with the grpc package: load by path
        spec = importlib.util.spec_from_file_location(name, out / rel)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    class M:
        pass

    m = M()
    from tensorflow.core.framework import tensor_pb2, types_pb2  # noqa: E402
    from tensorflow.core.protobuf import meta_graph_pb2  # noqa: E402
    from tensorflow.core.example import example_pb2  # noqa: E402
    from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2,  # noqa: E402
                                         get_model_status_pb2, inference_pb2, input_pb2,
                                         model_management_pb2, predict_pb2, regression_pb2)
    m.tensor, m.types, m.meta, m.example = tensor_pb2, types_pb2, meta_graph_pb2, example_pb2
    m.predict, m.meta_md, m.status = predict_pb2, get_model_metadata_pb2, get_model_status_pb2
    m.classification, m.regression, m.inference = classification_pb2, regression_pb2, inference_pb2
    m.input, m.mgmt = input_pb2, model_management_pb2
    m.health = load_file("grpc/health/v1/health_pb2.py", "kiln_health_pb2")
    m.refl = load_file("grpc/reflection/v1/reflection_pb2.py", "kiln_reflection_v1_pb2")
    m.refl_alpha = load_file("grpc/reflection/v1alpha/reflection_pb2.py", "kiln_reflection_v1alpha_pb2")
    yield m
    sys.path.remove(str(out))


# ------------------------------------------------------------------ models


def save_affine(path, a, b):
    """y = x * a + b over float32 [batch, 3]."""
    x = helper.make_tensor_value_info("x", OnnxTP.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", OnnxTP.FLOAT, ["batch", 3])
    inits = [numpy_helper.from_array(np.array(a, np.float32), "a"),
             numpy_helper.from_array(np.array(b, np.float32), "b")]
    nodes = [helper.make_node("Mul", ["x", "a"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"]),
             helper.make_node("Neg", ["y"], ["z"])]
    z = helper.make_tensor_value_info("z", OnnxTP.FLOAT, ["batch", 3])
    g = helper.make_graph(nodes, "affine", [x], [y, z], inits)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


# dtype name: (numpy dtype, ONNX dtype, TF DataType, TensorProto typed field)
TYPES = {
    "f32": (np.float32, OnnxTP.FLOAT, 1, "float_val"),
    "f64": (np.float64, OnnxTP.DOUBLE, 2, "double_val"),
    "i32": (np.int32, OnnxTP.INT32, 3, "int_val"),
    "u8": (np.uint8, OnnxTP.UINT8, 4, "int_val"),
    "i16": (np.int16, OnnxTP.INT16, 5, "int_val"),
    "i8": (np.int8, OnnxTP.INT8, 6, "int_val"),
    "i64": (np.int64, OnnxTP.INT64, 9, "int64_val"),
    "bool": (np.bool_, OnnxTP.BOOL, 10, "bool_val"),
    "u16": (np.uint16, OnnxTP.UINT16, 17, "int_val"),
    "f16": (np.float16, OnnxTP.FLOAT16, 19, "half_val"),
    "u32": (np.uint32, OnnxTP.UINT32, 22, "uint32_val"),
    "u64": (np.uint64, OnnxTP.UINT64, 23, "uint64_val"),
}


def save_identities(path):
    """One Identity per dtype (in_<t> -> out_<t>, shape [batch, 2]) and strings."""
    ins, outs, nodes = [], [], []
    for name, (_, ot, _, _) in TYPES.items():
        ins.append(helper.make_tensor_value_info(f"in_{name}", ot, ["batch", 2]))
        outs.append(helper.make_tensor_value_info(f"out_{name}", ot, ["batch", 2]))
        nodes.append(helper.make_node("Identity", [f"in_{name}"], [f"out_{name}"]))
    ins.append(helper.make_tensor_value_info("in_str", OnnxTP.STRING, ["batch", 2]))
    outs.append(helper.make_tensor_value_info("out_str", OnnxTP.STRING, ["batch", 2]))
    nodes.append(helper.make_node("Identity", ["in_str"], ["out_str"]))
    g = helper.make_graph(nodes, "ids", ins, outs)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


# ------------------------------------------------------------------ server


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """kiln serve on free loopback ports (REST and gRPC), Prometheus on."""

    def __init__(self, tmp, config_lines, *extra):
        self.rest = free_port()
        self.grpc = free_port()
        cfg = tmp / "models.config"
        cfg.write_text("model_config_list {\n" + "".join(config_lines) + "}\n")
        mon = tmp / "monitoring.config"
        mon.write_text('prometheus_config: { enable: true, path: "/metrics" }\n')
        self.log = open(tmp / "server.log", "w+")
        self.proc = subprocess.Popen(
            [KILN, "serve", f"--model_config_file={cfg}", f"--rest_api_port={self.rest}",
             f"--port={self.grpc}", "--rest_api_address=127.0.0.1", "--rest_api_num_threads=4",
             "--grpc_max_threads=8", f"--monitoring_config_file={mon}",
             "--file_system_poll_wait_seconds=1", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            assert self.proc.poll() is None, self.logtext()
            try:
                if self.http("GET", "/v2/health/ready")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            self.kill()
            raise AssertionError("server not ready in 60 s: " + self.logtext())
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{self.grpc}",
            options=[("grpc.max_receive_message_length", 256 << 20),
                     ("grpc.max_send_message_length", 256 << 20)])

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def http(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.rest, timeout=30)
        try:
            c.request(method, path, body=json.dumps(body) if body is not None else None)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def call(self, method, request, response_cls, timeout=30, channel=None, **kw):
        fn = (channel or self.channel).unary_unary(
            method, request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_cls.FromString)
        return fn(request, timeout=timeout, **kw)

    def kill(self):
        if getattr(self, "channel", None):
            self.channel.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


def model_line(name, base):
    return f'config {{ name: "{name}" base_path: "{base}" model_platform: "onnx" }}\n'


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc")
    save_affine(root / "aff" / "1" / "model.onnx", [2.0, 3.0, 4.0], [1.0, 0.5, -1.0])
    save_identities(root / "ids" / "1" / "model.onnx")
    s = Server(root, [model_line("aff", root / "aff"), model_line("ids", root / "ids")])
    s.root = root
    yield s
    s.kill()


def affine(x):
    return x * np.array([2, 3, 4], np.float32) + np.array([1, 0.5, -1], np.float32)


def tensor_content(pb, arr, dtype):
    t = pb.tensor.TensorProto(dtype=dtype, tensor_content=np.ascontiguousarray(arr).tobytes())
    for d in arr.shape:
        t.tensor_shape.dim.add(size=d)
    return t


def n_values(shape):
    return int(np.prod(shape)) if shape else 1


def to_numpy(pb, t):
    """Decode a TensorProto independently of Kiln (TF's rules)."""
    for name, (npt, _, code, field) in TYPES.items():
        if t.dtype != code:
            continue
        shape = [d.size for d in t.tensor_shape.dim]
        n = int(np.prod(shape)) if shape else 1
        if t.tensor_content:
            return np.frombuffer(t.tensor_content, npt).reshape(shape)
        if field == "float_val" and len(t.float_val) > 1000:
            # fast path: the packed field's bytes, from the proto's own serialization
            solo = pb.tensor.TensorProto(float_val=t.float_val).SerializeToString()
            i, n = 1, 0
            for shift in range(0, 64, 7):  # tag 0x2a, then a varint length
                b = solo[i]
                i += 1
                n |= (b & 0x7F) << shift
                if not b & 0x80:
                    break
            arr = np.frombuffer(solo[i:i + n], np.float32)
            return arr.reshape(shape) if len(arr) == n_values(shape) else None
        vals = list(getattr(t, field))
        if field == "half_val":
            arr = np.array(vals, np.uint16).view(np.float16)
        else:
            arr = np.array(vals, npt)
        if len(arr) < n:  # TF: the last value repeats
            arr = np.concatenate([arr, np.repeat(arr[-1:], n - len(arr))])
        return arr.reshape(shape)
    if t.dtype == 7:
        return np.array(list(t.string_val), object).reshape([d.size for d in t.tensor_shape.dim])
    raise AssertionError(f"dtype {t.dtype}")


def predict_request(pb, model, inputs, version=None, label=None, signature=None, output_filter=()):
    r = pb.predict.PredictRequest()
    r.model_spec.name = model
    if version is not None:
        r.model_spec.version.value = version
    if label is not None:
        r.model_spec.version_label = label
    if signature is not None:
        r.model_spec.signature_name = signature
    for k, v in inputs.items():
        r.inputs[k].CopyFrom(v)
    r.output_filter.extend(output_filter)
    return r


def expect_error(fn, code, needle=None):
    with pytest.raises(grpc.RpcError) as e:
        fn()
    assert e.value.code() == code, (e.value.code(), e.value.details())
    if needle is not None:
        assert needle in e.value.details(), e.value.details()
    return e.value.details()


# ------------------------------------------------------------------ Predict


def test_predict_tensor_content(srv, pb):
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    r = srv.call(PS + "Predict", predict_request(pb, "aff", {"x": tensor_content(pb, x, 1)}),
                 pb.predict.PredictResponse)
    assert r.model_spec.name == "aff" and r.model_spec.version.value == 1
    assert r.model_spec.signature_name == "serving_default"
    assert set(r.outputs) == {"y", "z"}
    y = r.outputs["y"]
    assert y.dtype == 1 and [d.size for d in y.tensor_shape.dim] == [4, 3]
    assert len(y.float_val) == 12 and not y.tensor_content  # TF Serving: typed fields
    np.testing.assert_array_equal(to_numpy(pb, y), affine(x))
    np.testing.assert_array_equal(to_numpy(pb, r.outputs["z"]), -affine(x))


def test_predict_typed_fields_repeat_last_value(srv, pb):
    t = pb.tensor.TensorProto(dtype=1, float_val=[1.0, 2.0])
    for d in (2, 3):
        t.tensor_shape.dim.add(size=d)
    r = srv.call(PS + "Predict", predict_request(pb, "aff", {"x": t}), pb.predict.PredictResponse)
    x = np.array([1, 2, 2, 2, 2, 2], np.float32).reshape(2, 3)  # TF repeats the last value
    np.testing.assert_array_equal(to_numpy(pb, r.outputs["y"]), affine(x))
    # one value fills everything, no values means zeros
    t1 = pb.tensor.TensorProto(dtype=1, float_val=[5.0])
    t1.tensor_shape.dim.add(size=1)
    t1.tensor_shape.dim.add(size=3)
    r = srv.call(PS + "Predict", predict_request(pb, "aff", {"x": t1}), pb.predict.PredictResponse)
    np.testing.assert_array_equal(to_numpy(pb, r.outputs["y"]), affine(np.full((1, 3), 5, np.float32)))


@pytest.mark.parametrize("encoding", ["typed", "content"])
def test_predict_every_dtype(srv, pb, encoding):
    rng = np.random.default_rng(1)
    inputs, want = {}, {}
    for name, (npt, _, code, field) in TYPES.items():
        if npt == np.bool_:
            a = rng.integers(0, 2, (3, 2)).astype(np.bool_)
        elif np.issubdtype(npt, np.floating):
            a = (rng.standard_normal((3, 2)) * 100).astype(npt)
        else:
            info = np.iinfo(npt)
            a = rng.integers(info.min, info.max, (3, 2), dtype=npt, endpoint=True)
        want[name] = a
        if encoding == "content":
            inputs[f"in_{name}"] = tensor_content(pb, a, code)
        else:
            t = pb.tensor.TensorProto(dtype=code)
            t.tensor_shape.dim.add(size=3)
            t.tensor_shape.dim.add(size=2)
            vals = a.view(np.uint16).ravel().tolist() if field == "half_val" else a.ravel().tolist()
            getattr(t, field).extend(vals)
            inputs[f"in_{name}"] = t
    s = pb.tensor.TensorProto(dtype=7, string_val=[b"a", b"", b"\x00\xff", "é".encode(), b"x" * 300, b"z"])
    s.tensor_shape.dim.add(size=3)
    s.tensor_shape.dim.add(size=2)
    inputs["in_str"] = s
    r = srv.call(PS + "Predict", predict_request(pb, "ids", inputs), pb.predict.PredictResponse)
    for name, (npt, _, code, field) in TYPES.items():
        out = r.outputs[f"out_{name}"]
        assert out.dtype == code
        assert len(getattr(out, field)) == 6, (name, out)  # answered in the dtype's typed field
        got = to_numpy(pb, out)
        assert got.dtype == np.dtype(npt)
        np.testing.assert_array_equal(got, want[name], err_msg=name)
    assert list(r.outputs["out_str"].string_val) == list(s.string_val)


def test_predict_scalar_broadcast_and_bfloat16_half_val(srv, pb):
    """half_val holds fp16 bit patterns; a single value fills the shape."""
    t = pb.tensor.TensorProto(dtype=19, half_val=[int(np.float16(1.5).view(np.uint16))])
    t.tensor_shape.dim.add(size=2)
    t.tensor_shape.dim.add(size=2)
    inputs = {f"in_{n}": tensor_content(pb, np.zeros((2, 2), TYPES[n][0]), TYPES[n][2]) for n in TYPES}
    inputs["in_f16"] = t
    s = pb.tensor.TensorProto(dtype=7, string_val=[b"q"])
    s.tensor_shape.dim.add(size=2)
    s.tensor_shape.dim.add(size=2)
    inputs["in_str"] = s
    r = srv.call(PS + "Predict", predict_request(pb, "ids", inputs), pb.predict.PredictResponse)
    np.testing.assert_array_equal(to_numpy(pb, r.outputs["out_f16"]), np.full((2, 2), 1.5, np.float16))
    assert list(r.outputs["out_str"].string_val) == [b"q"] * 4


def test_output_filter(srv, pb):
    x = np.ones((1, 3), np.float32)
    req = predict_request(pb, "aff", {"x": tensor_content(pb, x, 1)}, output_filter=["z"])
    r = srv.call(PS + "Predict", req, pb.predict.PredictResponse)
    assert set(r.outputs) == {"z"}
    np.testing.assert_array_equal(to_numpy(pb, r.outputs["z"]), -affine(x))
    bad = predict_request(pb, "aff", {"x": tensor_content(pb, x, 1)}, output_filter=["w"])
    expect_error(lambda: srv.call(PS + "Predict", bad, pb.predict.PredictResponse),
                 grpc.StatusCode.INVALID_ARGUMENT,
                 "output tensor alias not found in signature: w Outputs expected to be in the set {y,z}.")
    dup = predict_request(pb, "aff", {"x": tensor_content(pb, x, 1)}, output_filter=["y", "y"])
    expect_error(lambda: srv.call(PS + "Predict", dup, pb.predict.PredictResponse),
                 grpc.StatusCode.INVALID_ARGUMENT, "duplicate output tensor alias: y")
    # TF Serving truncates messages to 1024 characters
    long = predict_request(pb, "aff", {"x": tensor_content(pb, x, 1)}, output_filter=["w" * 2000])
    details = expect_error(lambda: srv.call(PS + "Predict", long, pb.predict.PredictResponse),
                           grpc.StatusCode.INVALID_ARGUMENT, "output tensor alias not found")
    assert len(details) == 1024 + len("...TRUNCATED") and details.endswith("w...TRUNCATED")


def test_predict_errors(srv, pb):
    x = tensor_content(pb, np.ones((1, 3), np.float32), 1)
    P = pb.predict.PredictResponse
    call = lambda req: (lambda: srv.call(PS + "Predict", req, P))  # noqa: E731
    IA, NF = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    expect_error(call(pb.predict.PredictRequest()), IA, "Missing ModelSpec")
    r = pb.predict.PredictRequest()
    r.model_spec.signature_name = "x"
    expect_error(call(r), IA, "ModelSpec has no name specified.")
    expect_error(call(predict_request(pb, "nope", {"x": x})), NF,
                 "Servable not found for request: Latest(nope)")
    expect_error(call(predict_request(pb, "aff", {"x": x}, version=9)), NF,
                 "Servable not found for request: Specific(aff, 9)")
    expect_error(call(predict_request(pb, "aff", {"x": x}, label="canary")), IA,
                 "Unrecognized servable version label: canary")
    expect_error(call(predict_request(pb, "aff", {"x": x}, signature="sig")),
                 grpc.StatusCode.FAILED_PRECONDITION, 'Serving signature key "sig" not found.')
    expect_error(call(predict_request(pb, "aff", {"x": x, "extra": x})), IA,
                 "input size does not match signature: 2!=1 len({extra,x}) != len({x}). "
                 "Sent extra: {extra}. Missing but required: {}.")
    expect_error(call(predict_request(pb, "aff", {"w": x})), IA,
                 "Sent extra: {w}. Missing but required: {x}.")
    bad = pb.tensor.TensorProto(dtype=1, tensor_content=b"\0" * 10)
    bad.tensor_shape.dim.add(size=1)
    bad.tensor_shape.dim.add(size=3)
    expect_error(call(predict_request(pb, "aff", {"x": bad})), IA, "tensor parsing error: x")
    i = tensor_content(pb, np.ones((1, 3), np.int32), 3)
    expect_error(call(predict_request(pb, "aff", {"x": i})), IA,
                 "Expected input x to be float but get int32.")
    wrong = tensor_content(pb, np.ones((1, 4), np.float32), 1)
    expect_error(call(predict_request(pb, "aff", {"x": wrong})), IA, "input x has shape [1,4]")
    # bytes that are not a PredictRequest
    raw = srv.channel.unary_unary(PS + "Predict")
    expect_error(lambda: raw(b"\x0a\xff\xff", timeout=10), IA)
    # unknown methods and services
    expect_error(lambda: srv.channel.unary_unary(PS + "Nope")(b"", timeout=10),
                 grpc.StatusCode.UNIMPLEMENTED, "Method not found")
    # the server is still fine
    srv.call(PS + "Predict", predict_request(pb, "aff", {"x": x}), P)


def test_string_tensor_claims_bounded(srv, pb):
    """A few bytes may not make the server allocate what a shape claims:
    more strings than tensor_content has bytes, or one string_val repeated
    into millions of copies (found by fuzz_tensor_proto and fuzz_warmup)."""
    others = {}
    for name, (_, _, code, _) in TYPES.items():
        others[f"in_{name}"] = pb.tensor.TensorProto(dtype=code)  # zeros of shape [1, 2]
        others[f"in_{name}"].tensor_shape.dim.add(size=1)
        others[f"in_{name}"].tensor_shape.dim.add(size=2)
    t = pb.tensor.TensorProto(dtype=7, tensor_content=b"\x01a\x01b")
    t.tensor_shape.dim.add(size=1 << 30)  # 16 GiB of string pointers, under the 64 GiB tensor cap
    t.tensor_shape.dim.add(size=2)
    expect_error(lambda: srv.call(PS + "Predict", predict_request(pb, "ids", dict(others, in_str=t)),
                                  pb.predict.PredictResponse),
                 grpc.StatusCode.INVALID_ARGUMENT, "too few for the")
    t = pb.tensor.TensorProto(dtype=7, string_val=[b"x" * 1000])
    t.tensor_shape.dim.add(size=1 << 22)
    t.tensor_shape.dim.add(size=2)
    details = expect_error(lambda: srv.call(PS + "Predict", predict_request(pb, "ids", dict(others, in_str=t)),
                                            pb.predict.PredictResponse),
                           grpc.StatusCode.INVALID_ARGUMENT)
    assert "would repeat a 1000-byte string" in details, details


def test_large_tensor(srv, pb):
    rows = 1_700_000  # 20 MB of float32 each way
    x = np.random.default_rng(2).standard_normal((rows, 3)).astype(np.float32)
    req = predict_request(pb, "aff", {"x": tensor_content(pb, x, 1)}, output_filter=["y"])
    r = srv.call(PS + "Predict", req, pb.predict.PredictResponse, timeout=120)
    np.testing.assert_array_equal(to_numpy(pb, r.outputs["y"]), affine(x))


def test_message_limit_and_compression(tmp_path, pb):
    save_affine(tmp_path / "aff" / "1" / "model.onnx", [2.0, 3.0, 4.0], [1.0, 0.5, -1.0])
    sock = tmp_path / "kiln.sock"
    s = Server(tmp_path, [model_line("aff", tmp_path / "aff")],
               "--grpc_channel_arguments=grpc.max_receive_message_length=100000",
               f"--grpc_socket_path={sock}")
    try:
        x = np.ones((10000, 3), np.float32)  # 120 KB
        req = predict_request(pb, "aff", {"x": tensor_content(pb, x, 1)})
        expect_error(lambda: s.call(PS + "Predict", req, pb.predict.PredictResponse),
                     grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (1200")
        # gzip and deflate, both ways; the limit applies after decompression
        small = predict_request(pb, "aff", {"x": tensor_content(pb, x[:5000], 1)})
        for comp in (grpc.Compression.Gzip, grpc.Compression.Deflate):
            r = s.call(PS + "Predict", small, pb.predict.PredictResponse, compression=comp)
            np.testing.assert_array_equal(to_numpy(pb, r.outputs["y"]), affine(x[:5000]))
            expect_error(lambda: s.call(PS + "Predict", req, pb.predict.PredictResponse, compression=comp),
                         grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max")
        # the Unix socket serves the same API
        with grpc.insecure_channel(f"unix:{sock}") as ch:
            small = predict_request(pb, "aff", {"x": tensor_content(pb, np.ones((2, 3), np.float32), 1)})
            r = s.call(PS + "Predict", small, pb.predict.PredictResponse, channel=ch)
            np.testing.assert_array_equal(to_numpy(pb, r.outputs["y"]), affine(np.ones((2, 3), np.float32)))
    finally:
        s.kill()


def test_deadline_and_cancel(srv, pb):
    x = np.ones((3_000_000, 3), np.float32)
    req = predict_request(pb, "aff", {"x": tensor_content(pb, x, 1)}, output_filter=["y"])
    expect_error(lambda: srv.call(PS + "Predict", req, pb.predict.PredictResponse, timeout=0.005),
                 grpc.StatusCode.DEADLINE_EXCEEDED)
    fn = srv.channel.unary_unary(PS + "Predict", request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.predict.PredictResponse.FromString)
    fut = fn.future(req, timeout=60)
    time.sleep(0.05)
    fut.cancel()
    assert fut.cancelled() or fut.done()
    # the server keeps serving
    small = predict_request(pb, "aff", {"x": tensor_content(pb, np.ones((1, 3), np.float32), 1)})
    srv.call(PS + "Predict", small, pb.predict.PredictResponse)


def test_cancelled_calls_while_their_requests_are_read(srv, pb):
    """A client that gives up (deadline or cancel) while a request thread still parses its
    large request: the stream goes, and the request bytes must stay until the thread is done
    with them. They were freed with the stream, and the server crashed in protobuf's unpack
    (seen on a loaded 2-core machine in test_deadline_and_cancel). Many calls whose deadlines
    end at different points of the parse make the race likely; the server must answer after
    them, and under the sanitizers any read of freed bytes fails the run."""
    x = np.ones((1_000_000, 3), np.float32)
    req = predict_request(pb, "aff", {"x": tensor_content(pb, x, 1)}, output_filter=["y"])
    fn = srv.channel.unary_unary(PS + "Predict", request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.predict.PredictResponse.FromString)
    t0 = time.monotonic()
    fn(req, timeout=60)
    full = time.monotonic() - t0  # deadlines from 40% to 112% of one whole call
    futs = [fn.future(req, timeout=full * (0.4 + 0.08 * (i % 10))) for i in range(40)]
    for i, f in enumerate(futs):
        if i % 3 == 0:
            f.cancel()
    for f in futs:
        try:
            f.result()
        except grpc.RpcError as e:
            # UNAVAILABLE: "GOAWAY received", the server's answer to a burst of resets
            # (the rapid-reset budget), which closes the other streams of the connection too
            assert e.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                                grpc.StatusCode.UNAVAILABLE), e
        except grpc.FutureCancelledError:
            pass
    assert srv.proc.poll() is None, srv.logtext()
    small = predict_request(pb, "aff", {"x": tensor_content(pb, np.ones((1, 3), np.float32), 1)})
    srv.call(PS + "Predict", small, pb.predict.PredictResponse)


def test_many_concurrent_calls_one_channel(srv, pb):
    fn = srv.channel.unary_unary(PS + "Predict", request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.predict.PredictResponse.FromString)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1 + i % 5, 3)).astype(np.float32) for i in range(200)]
    futs = [fn.future(predict_request(pb, "aff", {"x": tensor_content(pb, x, 1)}), timeout=60) for x in xs]
    for x, f in zip(xs, futs):
        np.testing.assert_array_equal(to_numpy(pb, f.result().outputs["y"]), affine(x))


def save_slow(path, width=512, steps=40):
    """K x (MatMul, Tanh) over float32 [batch, width]: seconds of compute for a large batch."""
    x = helper.make_tensor_value_info("x", OnnxTP.FLOAT, ["batch", width])
    y = helper.make_tensor_value_info("y", OnnxTP.FLOAT, ["batch", width])
    w = np.random.default_rng(0).standard_normal((width, width)).astype(np.float32) / np.sqrt(width)
    nodes, cur = [], "x"
    for k in range(steps):
        nodes.append(helper.make_node("MatMul", [cur, "w"], [f"m{k}"]))
        cur = "y" if k == steps - 1 else f"t{k}"
        nodes.append(helper.make_node("Tanh", [f"m{k}"], [cur]))
    g = helper.make_graph(nodes, "slow", [x], [y], [numpy_helper.from_array(w, "w")])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_busy_request_threads_do_not_starve_the_queue(tmp_path, pb):
    """Without batching only one request thread per core runs at once; when
    they are all busy for long, a queued call still gets another thread
    within a tick (100 ms) instead of waiting for a long call to end."""
    save_slow(tmp_path / "slow" / "1" / "model.onnx")
    s = Server(tmp_path, [model_line("slow", tmp_path / "slow")])
    try:
        fn = s.channel.unary_unary(PS + "Predict", request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=pb.predict.PredictResponse.FromString)
        x = np.ones((3072, 512), np.float32)  # 40 x 1.6 GFLOP: a second or more per call
        req = predict_request(pb, "slow", {"x": tensor_content(pb, x, 1)})
        t0 = time.time()
        slow = [fn.future(req, timeout=300) for _ in range(os.cpu_count() or 1)]
        time.sleep(0.5)  # they arrived and occupy every running request thread
        H = pb.health
        t1 = time.time()
        r = s.call("/grpc.health.v1.Health/Check", H.HealthCheckRequest(service=""),
                   H.HealthCheckResponse, timeout=120)
        waited = time.time() - t1
        assert r.status == H.HealthCheckResponse.SERVING
        for f in slow:
            assert f.result().outputs["y"].tensor_shape.dim[0].size == 3072
        slow_s = time.time() - t0
        # the check waited for a tick, not for a long call to end
        assert waited < 0.25 * slow_s, f"the check waited {waited:.2f} s; the long calls took {slow_s:.2f} s"
    finally:
        s.kill()


def test_grpc_rest_kserve_identical(srv, pb):
    x = np.random.default_rng(4).standard_normal((5, 3)).astype(np.float32)
    r = srv.call(PS + "Predict", predict_request(pb, "aff", {"x": tensor_content(pb, x, 1)}),
                 pb.predict.PredictResponse)
    g = to_numpy(pb, r.outputs["y"])
    code, body = srv.http("POST", "/v1/models/aff:predict", {"instances": x.tolist()})
    assert code == 200, body
    rest = np.array([p["y"] for p in json.loads(body)["predictions"]], np.float32)
    code, body = srv.http("POST", "/v2/models/aff/infer", {"inputs": [
        {"name": "x", "shape": [5, 3], "datatype": "FP32", "data": x.ravel().tolist()}]})
    assert code == 200, body
    kv2 = [o for o in json.loads(body)["outputs"] if o["name"] == "y"][0]
    kv2 = np.array(kv2["data"], np.float32).reshape(kv2["shape"])
    np.testing.assert_array_equal(g, rest)
    np.testing.assert_array_equal(g, kv2)
    np.testing.assert_array_equal(g, affine(x))


def test_metrics_entrypoint_grpc(srv, pb):
    small = predict_request(pb, "aff", {"x": tensor_content(pb, np.ones((1, 3), np.float32), 1)})
    srv.call(PS + "Predict", small, pb.predict.PredictResponse)
    code, body = srv.http("GET", "/metrics")
    text = body.decode()
    assert code == 200
    assert ('request_latency_count{model_name="aff",API="predict",entrypoint="GRPC"}' in text), text
    assert ':tensorflow:serving:request_count{model_name="aff",status="OK"}' in text
    assert 'kiln_request_errors_total{model_name="nope",API="predict",code="NOT_FOUND"}' in text


# ------------------------------------------------------------------ metadata, status, health


def test_get_model_metadata(srv, pb):
    req = pb.meta_md.GetModelMetadataRequest(metadata_field=["signature_def"])
    req.model_spec.name = "aff"
    r = srv.call(PS + "GetModelMetadata", req, pb.meta_md.GetModelMetadataResponse)
    assert r.model_spec.name == "aff" and r.model_spec.version.value == 1
    any_ = r.metadata["signature_def"]
    assert any_.type_url == "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    sdm = pb.meta_md.SignatureDefMap()
    assert any_.Unpack(sdm)
    sig = sdm.signature_def["serving_default"]
    assert sig.method_name == "tensorflow/serving/predict"
    assert set(sig.inputs) == {"x"} and set(sig.outputs) == {"y", "z"}
    assert sig.inputs["x"].dtype == pb.types.DT_FLOAT
    assert [d.size for d in sig.inputs["x"].tensor_shape.dim] == [-1, 3]
    IA = grpc.StatusCode.INVALID_ARGUMENT
    M = pb.meta_md.GetModelMetadataResponse
    no_field = pb.meta_md.GetModelMetadataRequest()
    no_field.model_spec.name = "aff"
    expect_error(lambda: srv.call(PS + "GetModelMetadata", no_field, M), IA,
                 "GetModelMetadataRequest must specify at least one metadata_field")
    other = pb.meta_md.GetModelMetadataRequest(metadata_field=["graph"])
    other.model_spec.name = "aff"
    expect_error(lambda: srv.call(PS + "GetModelMetadata", other, M), IA,
                 "Metadata field graph is not supported")
    expect_error(lambda: srv.call(PS + "GetModelMetadata",
                                  pb.meta_md.GetModelMetadataRequest(metadata_field=["signature_def"]), M),
                 IA, "Missing ModelSpec")
    unknown = pb.meta_md.GetModelMetadataRequest(metadata_field=["signature_def"])
    unknown.model_spec.name = "nope"
    expect_error(lambda: srv.call(PS + "GetModelMetadata", unknown, M), grpc.StatusCode.NOT_FOUND)


def test_get_model_status(srv, pb):
    req = pb.status.GetModelStatusRequest()
    req.model_spec.name = "aff"
    r = srv.call(MS + "GetModelStatus", req, pb.status.GetModelStatusResponse)
    assert [(v.version, v.state, v.status.error_code) for v in r.model_version_status] == \
        [(1, pb.status.ModelVersionStatus.AVAILABLE, 0)]
    code, body = srv.http("GET", "/v1/models/aff")
    rest = json.loads(body)["model_version_status"]
    assert [(int(v["version"]), v["state"]) for v in rest] == [(1, "AVAILABLE")]
    req.model_spec.name = "nope"
    expect_error(lambda: srv.call(MS + "GetModelStatus", req, pb.status.GetModelStatusResponse),
                 grpc.StatusCode.NOT_FOUND, "Could not find any versions of model nope")
    req.model_spec.name = "aff"
    req.model_spec.version.value = 7
    expect_error(lambda: srv.call(MS + "GetModelStatus", req, pb.status.GetModelStatusResponse),
                 grpc.StatusCode.NOT_FOUND, "Could not find version 7 of model aff")


def test_health_check_and_watch(srv, pb):
    H = pb.health
    for service in ("", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService",
                    "PredictionService", "ModelService"):
        r = srv.call("/grpc.health.v1.Health/Check", H.HealthCheckRequest(service=service),
                     H.HealthCheckResponse)
        assert r.status == H.HealthCheckResponse.SERVING, service
    expect_error(lambda: srv.call("/grpc.health.v1.Health/Check", H.HealthCheckRequest(service="x.Y"),
                                  H.HealthCheckResponse), grpc.StatusCode.NOT_FOUND)
    watch = srv.channel.unary_stream("/grpc.health.v1.Health/Watch",
                                     request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=H.HealthCheckResponse.FromString)
    it = watch(H.HealthCheckRequest(service=""), timeout=30)
    assert next(it).status == H.HealthCheckResponse.SERVING
    it.cancel()
    it = watch(H.HealthCheckRequest(service="x.Y"), timeout=30)
    assert next(it).status == H.HealthCheckResponse.SERVICE_UNKNOWN
    it.cancel()


def test_health_watch_across_shutdown(tmp_path, pb):
    save_affine(tmp_path / "aff" / "1" / "model.onnx", [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    s = Server(tmp_path, [model_line("aff", tmp_path / "aff")])
    try:
        H = pb.health
        watch = s.channel.unary_stream("/grpc.health.v1.Health/Watch",
                                       request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=H.HealthCheckResponse.FromString)
        it = watch(H.HealthCheckRequest(service="tensorflow.serving.PredictionService"), timeout=30)
        assert next(it).status == H.HealthCheckResponse.SERVING
        t0 = time.time()
        s.proc.send_signal(15)  # SIGTERM: readiness off, then drain
        assert next(it).status == H.HealthCheckResponse.NOT_SERVING
        # the drain ends the Watch stream with a status (not a broken connection),
        # and the server does not wait out its 10 s drain for it
        with pytest.raises(grpc.RpcError) as e:
            next(it)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
        assert e.value.details() == "the server is shutting down"
        assert s.proc.wait(timeout=30) == 0
        assert time.time() - t0 < 5
    finally:
        s.kill()


# ------------------------------------------------------------------ reflection


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection(srv, pb, version):
    from google.protobuf import descriptor_pb2, descriptor_pool
    R = pb.refl if version == "v1" else pb.refl_alpha
    stream = srv.channel.stream_stream(
        f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=R.ServerReflectionResponse.FromString)
    reqs = [R.ServerReflectionRequest(list_services=""),
            R.ServerReflectionRequest(file_containing_symbol="tensorflow.serving.PredictionService"),
            R.ServerReflectionRequest(file_containing_symbol="tensorflow.serving.PredictRequest"),
            R.ServerReflectionRequest(file_by_filename="grpc/health/v1/health.proto"),
            R.ServerReflectionRequest(file_containing_symbol="no.Such")]
    resps = list(stream(iter(reqs), timeout=30))
    assert len(resps) == 5
    names = {s.name for s in resps[0].list_services_response.service}
    assert {"tensorflow.serving.PredictionService", "tensorflow.serving.ModelService",
            "grpc.health.v1.Health", f"grpc.reflection.{version}.ServerReflection"} <= names
    # a pool built from the one response alone: the file and all it imports
    pending = [descriptor_pb2.FileDescriptorProto.FromString(b)
               for b in resps[1].file_descriptor_response.file_descriptor_proto]
    assert pending[0].name == "tensorflow_serving/apis/prediction_service.proto"
    pool, added = descriptor_pool.DescriptorPool(), set()
    for _ in range(len(pending)):
        for f in pending:
            if f.name not in added and all(d in added for d in f.dependency):
                pool.Add(f)
                added.add(f.name)
    assert added == {f.name for f in pending}
    svc = pool.FindServiceByName("tensorflow.serving.PredictionService")
    assert {m.name for m in svc.methods} == {"Classify", "Regress", "Predict", "MultiInference",
                                             "GetModelMetadata"}
    assert pool.FindMessageTypeByName("tensorflow.TensorProto").fields_by_name["half_val"].number == 13
    f2 = descriptor_pb2.FileDescriptorProto.FromString(resps[2].file_descriptor_response.file_descriptor_proto[0])
    assert f2.name == "tensorflow_serving/apis/predict.proto"
    f3 = descriptor_pb2.FileDescriptorProto.FromString(resps[3].file_descriptor_response.file_descriptor_proto[0])
    assert f3.package == "grpc.health.v1"
    assert resps[4].error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_reflection_client_tool(srv):
    """tools/grpc_reflect.py: no generated code, only what reflection tells it."""
    tool = [sys.executable, str(REPO / "tools" / "grpc_reflect.py"), f"127.0.0.1:{srv.grpc}"]
    r = subprocess.run(tool + ["list"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert {"tensorflow.serving.PredictionService", "tensorflow.serving.ModelService",
            "grpc.health.v1.Health"} <= set(r.stdout.split())
    r = subprocess.run(tool + ["describe", "tensorflow.serving.PredictionService"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "rpc Predict(tensorflow.serving.PredictRequest) returns (tensorflow.serving.PredictResponse)" \
        in r.stdout, r.stdout
    x = [[1.0, -2.0, 0.5], [3.0, 0.0, -1.5]]
    req = {"model_spec": {"name": "aff"}, "inputs": {"x": {
        "dtype": "DT_FLOAT", "tensor_shape": {"dim": [{"size": 2}, {"size": 3}]},
        "float_val": [v for row in x for v in row]}}}
    r = subprocess.run(tool + ["call", "tensorflow.serving.PredictionService/Predict", json.dumps(req)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    y = json.loads(r.stdout)["outputs"]["y"]
    assert y["dtype"] == "DT_FLOAT" and [int(d["size"]) for d in y["tensor_shape"]["dim"]] == [2, 3]
    np.testing.assert_array_equal(np.array(y["float_val"], np.float32).reshape(2, 3),
                                  affine(np.array(x, np.float32)))
    req["model_spec"]["name"] = "nope"
    r = subprocess.run(tool + ["call", "tensorflow.serving.PredictionService/Predict", json.dumps(req)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr, (r.returncode, r.stderr)


# ------------------------------------------------------------------ Classify, Regress, MultiInference, reload

TESTDATA = Path(os.environ.get("KILN_TESTDATA") or REPO.parent / "shared" / "testdata")
HALF = (TESTDATA / "savedmodels" / "serving" / "tensorflow_serving" / "servables" / "tensorflow"
        / "testdata" / "saved_model_half_plus_two_cpu" / "00000123")


@pytest.fixture(scope="module")
def half(tmp_path_factory):
    """TF Serving's test model: y = x/2 + 2, y2 = x/2 + 3, with classify and
    regress signatures over serialized tf.Examples."""
    if not HALF.is_dir():
        pytest.skip(f"{HALF} missing")
    import shutil
    root = tmp_path_factory.mktemp("half")
    shutil.copytree(HALF, root / "half" / "123")
    s = Server(root, [f'config {{ name: "half" base_path: "{root / "half"}" model_platform: "tensorflow" }}\n'])
    yield s
    s.kill()


def examples_input(pb, xs, context=None):
    inp = pb.input.Input()
    lst = inp.example_list_with_context if context is not None else inp.example_list
    for x in xs:
        e = lst.examples.add()
        if x is not None:
            e.features.feature["x"].float_list.value.append(x)
    if context is not None:
        lst.context.features.feature["x"].float_list.value.append(context)
    return inp


def test_classify(half, pb):
    req = pb.classification.ClassificationRequest(input=examples_input(pb, [1.0, -4.0, 10.5]))
    req.model_spec.name = "half"
    req.model_spec.signature_name = "classify_x_to_y"
    r = half.call(PS + "Classify", req, pb.classification.ClassificationResponse)
    got = [[(c.label, c.score) for c in cl.classes] for cl in r.result.classifications]
    assert got == [[("", x / 2 + 2)] for x in (1.0, -4.0, 10.5)]
    assert r.model_spec.name == "half" and r.model_spec.version.value == 123
    assert r.model_spec.signature_name == "classify_x_to_y"
    code, body = half.http("POST", "/v1/models/half:classify", {
        "signature_name": "classify_x_to_y", "examples": [{"x": 1.0}, {"x": -4.0}, {"x": 10.5}]})
    assert code == 200
    assert [[tuple(c) for c in row] for row in json.loads(body)["results"]] == got


def test_regress(half, pb):
    req = pb.regression.RegressionRequest(input=examples_input(pb, [1.0, 2.0]))
    req.model_spec.name = "half"
    req.model_spec.signature_name = "regress_x_to_y2"
    r = half.call(PS + "Regress", req, pb.regression.RegressionResponse)
    assert [v.value for v in r.result.regressions] == [3.5, 4.0]
    # context features go into every example
    req = pb.regression.RegressionRequest(input=examples_input(pb, [None, None], context=4.0))
    req.model_spec.name = "half"
    req.model_spec.signature_name = "regress_x_to_y"
    r = half.call(PS + "Regress", req, pb.regression.RegressionResponse)
    assert [v.value for v in r.result.regressions] == [4.0, 4.0]
    IA = grpc.StatusCode.INVALID_ARGUMENT
    req.model_spec.signature_name = "classify_x_to_y"
    expect_error(lambda: half.call(PS + "Regress", req, pb.regression.RegressionResponse), IA,
                 "Expected regression signature method_name to be tensorflow/serving/regress.")
    empty = pb.regression.RegressionRequest()
    empty.model_spec.name = "half"
    empty.model_spec.signature_name = "regress_x_to_y"
    expect_error(lambda: half.call(PS + "Regress", empty, pb.regression.RegressionResponse), IA,
                 "Input is empty.")


def test_multi_inference(half, pb):
    def task(sig, method):
        t = pb.inference.InferenceTask(method_name=f"tensorflow/serving/{method}")
        t.model_spec.name = "half"
        t.model_spec.signature_name = sig
        return t
    req = pb.inference.MultiInferenceRequest(
        tasks=[task("classify_x_to_y", "classify"), task("regress_x_to_y2", "regress")],
        input=examples_input(pb, [1.0, 3.0]))
    r = half.call(PS + "MultiInference", req, pb.inference.MultiInferenceResponse)
    assert len(r.results) == 2
    assert [cl.classes[0].score for cl in r.results[0].classification_result.classifications] == [2.5, 3.5]
    assert [v.value for v in r.results[1].regression_result.regressions] == [3.5, 4.5]
    assert r.results[1].model_spec.signature_name == "regress_x_to_y2"
    IA = grpc.StatusCode.INVALID_ARGUMENT
    M = pb.inference.MultiInferenceResponse
    dup = pb.inference.MultiInferenceRequest(
        tasks=[task("regress_x_to_y", "regress"), task("regress_x_to_y", "regress")],
        input=examples_input(pb, [1.0]))
    expect_error(lambda: half.call(PS + "MultiInference", dup, M), IA,
                 "Duplicate evaluation of signature: regress_x_to_y")
    other = task("regress_x_to_y2", "regress")
    other.model_spec.name = "other"
    two = pb.inference.MultiInferenceRequest(tasks=[task("regress_x_to_y", "regress"), other],
                                             input=examples_input(pb, [1.0]))
    expect_error(lambda: half.call(PS + "MultiInference", two, M), IA,
                 "All ModelSpecs in a MultiInferenceRequest must access the same model name.")
    bad = pb.inference.MultiInferenceRequest(tasks=[task("regress_x_to_y", "predict")],
                                             input=examples_input(pb, [1.0]))
    expect_error(lambda: half.call(PS + "MultiInference", bad, M), grpc.StatusCode.UNIMPLEMENTED,
                 "Unsupported signature method_name: tensorflow/serving/predict")
    missing = pb.inference.MultiInferenceRequest(tasks=[task("nope", "regress")],
                                                 input=examples_input(pb, [1.0]))
    expect_error(lambda: half.call(PS + "MultiInference", missing, M), IA,
                 "Requested signature not found in model graph: nope")


def test_reload_config(tmp_path, pb):
    save_affine(tmp_path / "aff" / "1" / "model.onnx", [2.0, 3.0, 4.0], [1.0, 0.5, -1.0])
    save_affine(tmp_path / "neg" / "4" / "model.onnx", [-1.0, -1.0, -1.0], [0.0, 0.0, 0.0])
    s = Server(tmp_path, [model_line("aff", tmp_path / "aff")])
    try:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        neg = predict_request(pb, "neg", {"x": tensor_content(pb, x, 1)})
        expect_error(lambda: s.call(PS + "Predict", neg, pb.predict.PredictResponse), grpc.StatusCode.NOT_FOUND)
        req = pb.mgmt.ReloadConfigRequest()
        for name in ("aff", "neg"):
            c = req.config.model_config_list.config.add(name=name, base_path=str(tmp_path / name),
                                                        model_platform="onnx")
        c.version_labels["stable"] = 4
        r = s.call(MS + "HandleReloadConfigRequest", req, pb.mgmt.ReloadConfigResponse, timeout=60)
        assert r.status.error_code == 0
        # loaded before the reply, as TF Serving's ReloadConfig waits for the new models
        out = s.call(PS + "Predict", neg, pb.predict.PredictResponse)
        np.testing.assert_array_equal(to_numpy(pb, out.outputs["y"]), -x)
        assert out.model_spec.version.value == 4
        lab = predict_request(pb, "neg", {"x": tensor_content(pb, x, 1)}, label="stable")
        assert s.call(PS + "Predict", lab, pb.predict.PredictResponse).model_spec.version.value == 4
        # a config without model_config_list is refused and changes nothing
        expect_error(lambda: s.call(MS + "HandleReloadConfigRequest", pb.mgmt.ReloadConfigRequest(),
                                    pb.mgmt.ReloadConfigResponse),
                     grpc.StatusCode.INVALID_ARGUMENT, "no model_config_list")
        s.call(PS + "Predict", neg, pb.predict.PredictResponse)
        # dropping a model unloads it
        only = pb.mgmt.ReloadConfigRequest()
        only.config.model_config_list.config.add(name="neg", base_path=str(tmp_path / "neg"))
        s.call(MS + "HandleReloadConfigRequest", only, pb.mgmt.ReloadConfigResponse, timeout=60)
        aff = predict_request(pb, "aff", {"x": tensor_content(pb, x, 1)})
        expect_error(lambda: s.call(PS + "Predict", aff, pb.predict.PredictResponse), grpc.StatusCode.NOT_FOUND)
    finally:
        s.kill()


# ------------------------------------------------------------------ TLS


def make_certs(d):
    """A CA, a server certificate for localhost / 127.0.0.1 and a client certificate (openssl)."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=kiln-test-ca")
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for who in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key", "-out", f"{who}.csr",
            "-subj", f"/CN={'localhost' if who == 'server' else 'kiln-client'}")
        run("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{who}.pem", "-days", "2", "-extfile", "san.ext")
    return {k: (d / k).read_bytes() for k in ("ca.pem", "server.key", "server.pem", "client.key", "client.pem")}


def pem_field(name, data):
    return f'{name}: "' + data.decode().replace("\n", "\\n") + '"\n'


@pytest.mark.skipif(not os.path.exists("/usr/bin/openssl"), reason="openssl missing")
@pytest.mark.parametrize("mutual", [False, True])
def test_tls(tmp_path, pb, mutual):
    certs = make_certs(tmp_path)
    ssl = tmp_path / "ssl.config"
    ssl.write_text(pem_field("server_key", certs["server.key"]) + pem_field("server_cert", certs["server.pem"])
                   + (pem_field("custom_ca", certs["ca.pem"]) + "client_verify: true\n" if mutual else ""))
    save_affine(tmp_path / "aff" / "1" / "model.onnx", [2.0, 3.0, 4.0], [1.0, 0.5, -1.0])
    s = Server(tmp_path, [model_line("aff", tmp_path / "aff")], f"--ssl_config_file={ssl}")
    try:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        req = predict_request(pb, "aff", {"x": tensor_content(pb, x, 1)})
        creds = grpc.ssl_channel_credentials(
            root_certificates=certs["ca.pem"],
            private_key=certs["client.key"] if mutual else None,
            certificate_chain=certs["client.pem"] if mutual else None)
        with grpc.secure_channel(f"localhost:{s.grpc}", creds) as ch:
            r = s.call(PS + "Predict", req, pb.predict.PredictResponse, channel=ch)
            np.testing.assert_array_equal(to_numpy(pb, r.outputs["y"]), affine(x))
        # plaintext is refused on a TLS port
        with grpc.insecure_channel(f"127.0.0.1:{s.grpc}") as ch:
            expect_error(lambda: s.call(PS + "Predict", req, pb.predict.PredictResponse, channel=ch, timeout=5),
                         grpc.StatusCode.UNAVAILABLE)
        if mutual:  # no client certificate: the handshake fails
            plain = grpc.ssl_channel_credentials(root_certificates=certs["ca.pem"])
            with grpc.secure_channel(f"localhost:{s.grpc}", plain) as ch:
                expect_error(lambda: s.call(PS + "Predict", req, pb.predict.PredictResponse, channel=ch,
                                            timeout=5), grpc.StatusCode.UNAVAILABLE)
        # the drain over TLS: GOAWAYs, then the Watch stream ends with a status, not a
        # broken connection, and the server exits without waiting out its drain time
        with grpc.secure_channel(f"localhost:{s.grpc}", creds) as ch:
            assert_watch_ends_at_sigterm(s, pb, ch)
    finally:
        s.kill()


def assert_watch_ends_at_sigterm(s, pb, channel):
    H = pb.health
    watch = channel.unary_stream("/grpc.health.v1.Health/Watch",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=H.HealthCheckResponse.FromString)
    it = watch(H.HealthCheckRequest(service=""), timeout=30)
    assert next(it).status == H.HealthCheckResponse.SERVING
    t0 = time.time()
    s.proc.send_signal(15)
    assert next(it).status == H.HealthCheckResponse.NOT_SERVING
    with pytest.raises(grpc.RpcError) as e:
        next(it)
    assert (e.value.code(), e.value.details()) == (grpc.StatusCode.UNAVAILABLE,
                                                   "the server is shutting down"), e.value
    assert s.proc.wait(timeout=30) == 0
    assert time.time() - t0 < 5


def test_sigterm_drain_unix_socket(tmp_path, pb):
    save_affine(tmp_path / "aff" / "1" / "model.onnx", [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    sock = tmp_path / "kiln.sock"
    s = Server(tmp_path, [model_line("aff", tmp_path / "aff")], f"--grpc_socket_path={sock}")
    try:
        with grpc.insecure_channel(f"unix:{sock}") as ch:
            assert_watch_ends_at_sigterm(s, pb, ch)
        assert not sock.exists()  # unlinked when the drain stopped accepting
    finally:
        s.kill()


# ------------------------------------------------------------------ a second client stack

NODE_DIR = REPO / "tests" / "node"


@pytest.mark.skipif(not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir(),
                    reason="tests/node/node_modules missing (cd tests/node && npm ci)")
def test_node_grpc_js_client(srv):
    """@grpc/grpc-js (its own HTTP/2 stack) against the same server."""
    r = subprocess.run(["node", str(NODE_DIR / "grpc_client.js"), str(srv.grpc)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for check in ("predict", "typed_fields_repeat_last", "large_gzip", "concurrent", "errors",
                  "deadline", "metadata", "status", "health"):
        assert f"ok {check}" in r.stdout, r.stdout + r.stderr


def h2_frame(ftype, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes([ftype, flags]) + stream.to_bytes(4, "big") + payload


def h2_read_until_goaway(s, seconds):
    """The GOAWAY error code the server sends within seconds, or None (still open)."""
    buf, end = b"", time.time() + seconds
    s.settimeout(0.2)
    while time.time() < end:
        try:
            d = s.recv(65536)
        except socket.timeout:
            continue
        if not d:
            return "closed"
        buf += d
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            n = int.from_bytes(buf[:3], "big")
            if buf[3] == 7:
                return int.from_bytes(buf[13:17], "big")
            buf = buf[9 + n:]
    return None


@pytest.mark.parametrize("kind", ["empty_data", "window_update", "ping", "unknown_type"])
def test_budget_of_frames_that_carry_nothing(srv, kind):
    """h2.c's per-connection budget: 1,000 such frames at once are allowed (a
    connection stays open), 1,500 more a second later (about 500 came back) end it with GOAWAY
    ENHANCE_YOUR_CALM (0xb); RFC 9113 section 10.5."""
    hdr = (b"\x83\x86\x04" + bytes([len(b"/grpc.health.v1.Health/Watch")]) +
           b"/grpc.health.v1.Health/Watch" + b"\x01\x09127.0.0.1" +
           b"\x00\x0ccontent-type\x10application/grpc" + b"\x00\x02te\x08trailers")
    frame = {"empty_data": h2_frame(0, 0, 1), "window_update": h2_frame(8, 0, 0, (1).to_bytes(4, "big")),
             "ping": h2_frame(6, 0, 0, bytes(8)), "unknown_type": h2_frame(0xfa, 0, 0)}[kind]
    with socket.create_connection(("127.0.0.1", srv.grpc), timeout=5) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0) + h2_frame(1, 4, 1, hdr))
        s.sendall(frame * 950)
        assert h2_read_until_goaway(s, 1.0) is None
        s.sendall(frame * 1500)  # the second meanwhile gave back 500
        assert h2_read_until_goaway(s, 5.0) == 0xB  # ENHANCE_YOUR_CALM


# ------------------------------------------------------------------ batching shared with REST


def metric_value(text, name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def batching_server(tmp_path, params):
    save_affine(tmp_path / "aff" / "1" / "model.onnx", [2.0, 3.0, 4.0], [1.0, 0.5, -1.0])
    pfile = tmp_path / "batching.config"
    pfile.write_text(params)
    return Server(tmp_path, [model_line("aff", tmp_path / "aff")], "--enable_batching=true",
                  f"--batching_parameters_file={pfile}", "--rest_api_num_threads=16",
                  "--grpc_max_threads=16")


def test_grpc_and_rest_join_one_batch(tmp_path, pb):
    import threading
    s = batching_server(tmp_path, """
        max_batch_size { value: 8 }
        batch_timeout_micros { value: 1000000 }
        max_enqueued_batches { value: 100 }
        num_batch_threads { value: 1 }
        allowed_batch_sizes: 8
    """)
    try:
        xs = [np.full((1, 3), i + 1, np.float32) for i in range(4)]
        results = [None] * 4
        barrier = threading.Barrier(4)

        def client(i):
            barrier.wait()
            if i % 2 == 0:
                r = s.call(PS + "Predict", predict_request(pb, "aff", {"x": tensor_content(pb, xs[i], 1)}),
                           pb.predict.PredictResponse)
                results[i] = to_numpy(pb, r.outputs["y"])
            else:
                code, body = s.http("POST", "/v1/models/aff:predict", {"instances": xs[i].tolist()})
                assert code == 200, body
                results[i] = np.array([p["y"] for p in json.loads(body)["predictions"]], np.float32)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for i in range(4):
            np.testing.assert_array_equal(results[i], affine(xs[i]))
        text = s.http("GET", "/metrics")[1].decode()
        # four requests, two per API, ran as one batch of 4 rows padded to 8
        assert metric_value(text, 'kiln_batch_size_count{model_name="aff",version="1"}') == 1, text
        assert 'request_latency_count{model_name="aff",API="predict",entrypoint="GRPC"} 2' in text
        assert 'request_latency_count{model_name="aff",API="predict",entrypoint="REST"} 2' in text
    finally:
        s.kill()


def test_full_batch_queue_unavailable(tmp_path, pb):
    s = batching_server(tmp_path, """
        max_batch_size { value: 4 }
        batch_timeout_micros { value: 500000 }
        max_enqueued_batches { value: 1 }
        num_batch_threads { value: 1 }
    """)
    try:
        fn = s.channel.unary_unary(PS + "Predict", request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=pb.predict.PredictResponse.FromString)
        x = np.ones((3, 3), np.float32)
        futs = [fn.future(predict_request(pb, "aff", {"x": tensor_content(pb, x, 1)}), timeout=30)
                for _ in range(12)]
        codes = []
        for f in futs:
            try:
                np.testing.assert_array_equal(to_numpy(pb, f.result().outputs["y"]), affine(x))
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                assert e.details() == "The batch scheduling queue to which this task was submitted is full"
                codes.append(e.code())
        assert grpc.StatusCode.OK in codes and grpc.StatusCode.UNAVAILABLE in codes, codes
    finally:
        s.kill()


def test_cancelled_call_leaves_its_batch(tmp_path, pb):
    """A call cancelled (RST_STREAM) while its batch is still open is dropped
    when the batch forms: the batch runs only the other call's rows."""
    s = batching_server(tmp_path, """
        max_batch_size { value: 8 }
        batch_timeout_micros { value: 2000000 }
        max_enqueued_batches { value: 100 }
        num_batch_threads { value: 1 }
    """)
    try:
        fn = s.channel.unary_unary(PS + "Predict", request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=pb.predict.PredictResponse.FromString)
        xa = np.full((1, 3), 2.0, np.float32)
        xb = np.full((3, 3), 5.0, np.float32)
        fa = fn.future(predict_request(pb, "aff", {"x": tensor_content(pb, xa, 1)}), timeout=30)
        fb = fn.future(predict_request(pb, "aff", {"x": tensor_content(pb, xb, 1)}), timeout=30)
        in_flight = 'kiln_model_version_requests_in_flight{model_name="aff",version="1"}'

        def gauge():
            return metric_value(s.http("GET", "/metrics")[1].decode(), in_flight)
        # both calls hold the version: they wait in the open batch (2 s timeout)
        limit = time.time() + 10
        while gauge() != 2 and time.time() < limit:
            time.sleep(0.02)
        assert gauge() == 2
        time.sleep(0.2)  # from acquiring the version to joining the batch: microseconds
        assert not fa.done() and not fb.done()
        assert fb.cancel()
        np.testing.assert_array_equal(to_numpy(pb, fa.result().outputs["y"]), affine(xa))
        assert fb.cancelled()
        text = s.http("GET", "/metrics")[1].decode()
        # one run, of A's single row: B's three rows never joined it
        assert metric_value(text, 'kiln_batch_size_count{model_name="aff",version="1"}') == 1, text
        assert metric_value(text, 'kiln_batch_size_sum{model_name="aff",version="1"}') == 1, text
        assert metric_value(text, 'kiln_batch_cancelled_total{model_name="aff",version="1"}') == 1, text
        limit = time.time() + 10
        while gauge() != 0 and time.time() < limit:
            time.sleep(0.02)
        assert gauge() == 0  # the cancelled call let go of the version
    finally:
        s.kill()


def test_port_in_use(tmp_path):
    """A taken default port leaves REST serving (logged); an explicit --port must open."""
    save_affine(tmp_path / "aff" / "1" / "model.onnx", [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        blocker.bind(("0.0.0.0", 8500))
        blocker.listen(1)
    except OSError:
        pass  # something else holds 8500 already: the same situation
    try:
        rest = free_port()
        p = subprocess.Popen([KILN, "serve", f"--model_base_path={tmp_path / 'aff'}", "--model_name=aff",
                              f"--rest_api_port={rest}", "--rest_api_address=127.0.0.1"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.time() + 60
            while time.time() < deadline:
                try:
                    c = http.client.HTTPConnection("127.0.0.1", rest, timeout=5)
                    c.request("GET", "/v2/health/ready")
                    if c.getresponse().status == 200:
                        break
                except OSError:
                    time.sleep(0.1)
            else:
                raise AssertionError("not ready")
            p.send_signal(15)
            out = p.communicate(timeout=30)[0]
            assert p.returncode == 0, out
            assert "gRPC is not served (pass --port to require it)" in out, out
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        r = subprocess.run([KILN, "serve", f"--model_base_path={tmp_path / 'aff'}", "--model_name=aff",
                            f"--rest_api_port={free_port()}", "--port=8500"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "cannot listen on 0.0.0.0:8500 for gRPC" in r.stderr, r.stderr
    finally:
        blocker.close()


# ------------------------------------------------------------------ sequence outputs


def save_sequence_model(path):
    """x float32 [n, 4] -> parts: sequence of x's rows split 1/3 along axis 0 (items
    [1, 4] and [n-1, 4]), maybe: Optional(x * 2) when cond is true else an empty
    optional, total: x.sum() (a plain tensor)."""
    F = OnnxTP.FLOAT
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["x2"]),
         helper.make_node("Optional", ["x2"], ["o"])], "then", [],
        [helper.make_value_info("o", helper.make_optional_type_proto(
            helper.make_tensor_type_proto(F, None)))])
    else_g = helper.make_graph(
        [helper.make_node("Optional", [], ["e"], type=helper.make_tensor_type_proto(F, None))],
        "else", [], [helper.make_value_info("e", helper.make_optional_type_proto(
            helper.make_tensor_type_proto(F, None)))])
    nodes = [
        helper.make_node("Constant", [], ["split"], value=numpy_helper.from_array(
            np.array([1], np.int64), "split")),
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Gather", ["shp", "zero"], ["n"]),
        helper.make_node("Sub", ["n", "one"], ["rest"]),
        helper.make_node("Concat", ["split", "rest"], ["lens"], axis=0),
        helper.make_node("SplitToSequence", ["x", "lens"], ["parts"], axis=0),
        helper.make_node("If", ["cond"], ["maybe"], then_branch=then_g, else_branch=else_g),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
    ]
    inits = [numpy_helper.from_array(np.array(2, np.float32), "two"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one")]
    g = helper.make_graph(
        nodes, "seq",
        [helper.make_tensor_value_info("x", F, ["n", 4]),
         helper.make_tensor_value_info("cond", OnnxTP.BOOL, [])],
        [helper.make_tensor_sequence_value_info("parts", F, None),
         helper.make_value_info("maybe", helper.make_optional_type_proto(
             helper.make_tensor_type_proto(F, None))),
         helper.make_tensor_value_info("total", F, [])],
        initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(path))


def test_sequence_and_optional_outputs_on_every_api(tmp_path, pb):
    """A sequence output NAME answers as tensors NAME/0..NAME/n-1 on REST, KServe v2
    and gRPC alike, a present optional as NAME, an empty one not at all; the model is
    served unbatched even with batching on (its items have no batch dimension)."""
    save_sequence_model(tmp_path / "seq" / "1" / "model.onnx")
    bcfg = tmp_path / "batching.config"
    bcfg.write_text("max_batch_size { value: 8 }\nbatch_timeout_micros { value: 1000 }\n")
    s = Server(tmp_path, [model_line("seq", tmp_path / "seq")], "--enable_batching=true",
               f"--batching_parameters_file={bcfg}")
    try:
        assert "batching_off=serving_default(sequence_output=parts)" in s.logtext(), s.logtext()
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        want = {"parts/0": x[:1], "parts/1": x[1:], "total": np.array(x.sum())}
        # REST, columnar
        code, body = s.http("POST", "/v1/models/seq:predict",
                            {"inputs": {"x": x.tolist(), "cond": True}})
        assert code == 200, body
        outs = json.loads(body)["outputs"]
        assert set(outs) == {"parts/0", "parts/1", "maybe", "total"}, outs
        for k, v in want.items():
            np.testing.assert_array_equal(np.array(outs[k], np.float32), v)
        np.testing.assert_array_equal(np.array(outs["maybe"], np.float32), x * 2)
        # an empty optional is left out
        code, body = s.http("POST", "/v1/models/seq:predict",
                            {"inputs": {"x": x.tolist(), "cond": False}})
        assert code == 200, body
        assert set(json.loads(body)["outputs"]) == {"parts/0", "parts/1", "total"}
        # KServe v2
        code, body = s.http("POST", "/v2/models/seq/infer", {"inputs": [
            {"name": "x", "shape": [3, 4], "datatype": "FP32", "data": x.ravel().tolist()},
            {"name": "cond", "shape": [], "datatype": "BOOL", "data": [True]}]})
        assert code == 200, body
        got = {o["name"]: o for o in json.loads(body)["outputs"]}
        assert set(got) == {"parts/0", "parts/1", "maybe", "total"}
        for k, v in want.items():
            assert got[k]["shape"] == list(v.shape)
            np.testing.assert_array_equal(np.array(got[k]["data"], np.float32).reshape(v.shape), v)
        # gRPC Predict, and output_filter naming the sequence
        req = predict_request(pb, "seq", {"x": tensor_content(pb, x, 1),
                                          "cond": tensor_content(pb, np.array(True), 10)})
        r = s.call(PS + "Predict", req, pb.predict.PredictResponse)
        assert set(r.outputs) == {"parts/0", "parts/1", "maybe", "total"}
        for k, v in want.items():
            np.testing.assert_array_equal(to_numpy(pb, r.outputs[k]), v)
        req.output_filter.append("parts")
        r = s.call(PS + "Predict", req, pb.predict.PredictResponse)
        assert set(r.outputs) == {"parts/0", "parts/1"}
        # metadata: the sequence is a DT_VARIANT (21), as TF's TensorList
        code, body = s.http("GET", "/v1/models/seq/metadata")
        assert code == 200, body
        outs = json.loads(body)["metadata"]["signature_def"]["signature_def"]["serving_default"]["outputs"]
        assert outs["parts"]["dtype"] == "DT_VARIANT" and outs["total"]["dtype"] == "DT_FLOAT"
    finally:
        s.kill()
