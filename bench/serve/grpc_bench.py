#!/usr/bin/python3
"""grpc_bench.py - `kiln serve`'s gRPC API against its own REST API on the
same server: h2load (Debian's nghttp2-client) posting a pre-framed
PredictRequest to /tensorflow.serving.PredictionService/Predict, and wrk
posting the same row as TF Serving REST JSON, on loopback.

For each model (bench/models/<name>, as bench/serve/run.sh exports them;
one row of the exporter's inputs) one server is started with both APIs. A
python3-grpcio call first checks that gRPC answers grpc-status 0 with the
same outputs as REST (h2load only checks :status). Then, for each
concurrency (1, 16, 64), wrk runs with that many connections and h2load with
min(c, 4) connections of c / min(c, 4) streams each (gRPC clients multiplex
streams on few connections). h2load reports no percentiles: its mean and
max per request are given, wrk's p50 and p99.

Usage:
    /usr/bin/python3 bench/serve/grpc_bench.py [--models tabular_mlp,resnet18]
        [--conns 1,16,64] [--duration 10] [--kiln build/kiln]
    /usr/bin/python3 bench/serve/grpc_bench.py --smoke   # tiny model, 1 s runs

Not part of `make test`; figures from a shared or loaded machine are noise.
"""

import argparse
import importlib.util
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

SERVE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(SERVE))
sys.path.insert(0, SERVE)
import serve_bench  # noqa: E402  (make_body, run_wrk, free_port)


def tensor_proto_bytes(x):
    """tensorflow.TensorProto{dtype FLOAT, shape, tensor_content}, by hand."""
    def varint(v):
        out = bytearray()
        while True:
            b = v & 0x7F
            v >>= 7
            out.append(b | (0x80 if v else 0))
            if not v:
                return bytes(out)

    def field(num, payload):
        return varint(num << 3 | 2) + varint(len(payload)) + payload
    shape = b"".join(field(2, varint(1 << 3) + varint(d)) for d in x.shape)
    content = np.ascontiguousarray(x, np.float32).tobytes()
    return varint(1 << 3) + varint(1) + field(2, shape) + field(4, content)


def predict_request_bytes(model, name, x):
    def varint(v):
        out = bytearray()
        while True:
            b = v & 0x7F
            v >>= 7
            out.append(b | (0x80 if v else 0))
            if not v:
                return bytes(out)

    def field(num, payload):
        return varint(num << 3 | 2) + varint(len(payload)) + payload
    spec = field(1, model.encode())
    entry = field(1, name.encode()) + field(2, tensor_proto_bytes(x))
    return field(1, spec) + field(2, entry)


def fields(buf):
    """(number, wire type, value) of a protobuf message's fields."""
    i, out = 0, []
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(buf, i)
        elif wt == 2:
            n, i = read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        else:
            raise ValueError("bad wire type")
        out.append((num, wt, v))
    return out


def read_varint(buf, i):
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def check_grpc(port, msg, rest_answer):
    """One call with python3-grpcio: status OK, and the outputs equal REST's."""
    import grpc
    with grpc.insecure_channel(f"127.0.0.1:{port}",
                               options=[("grpc.max_receive_message_length", 1 << 30)]) as ch:
        raw = ch.unary_unary("/tensorflow.serving.PredictionService/Predict")(msg, timeout=60)
    got = {}
    for num, _, entry in fields(raw):
        if num != 1:  # PredictResponse.outputs
            continue
        kv = dict((n, v) for n, _, v in fields(entry))
        t = fields(kv[2])
        vals = b"".join(v for n, wt, v in t if n == 5 and wt == 2)  # packed float_val
        content = b"".join(v for n, _, v in t if n == 4)
        got[kv[1].decode()] = np.frombuffer(content or vals, np.float32)
    preds = rest_answer["predictions"]
    row = preds[0]
    if isinstance(row, dict):
        for k, v in row.items():
            if not np.array_equal(got[k], np.asarray(v, np.float32).ravel()):
                raise SystemExit(f"grpc_bench: gRPC and REST disagree on output {k}")
    elif not np.array_equal(next(iter(got.values())), np.asarray(preds, np.float32).ravel()):
        raise SystemExit("grpc_bench: gRPC and REST disagree")


def run_h2load(url, body_path, conns, duration):
    c = min(conns, 4)
    m = max(1, conns // c)
    cmd = ["h2load", f"-c{c}", f"-m{m}", f"-D{duration}", "-H", "content-type: application/grpc",
           "-H", "te: trailers", "-d", body_path, url]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120)
    out = r.stdout
    fin = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", out)
    reqs = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed", out)
    lat = re.search(r"time for request:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)", out)
    if r.returncode != 0 or not fin or not reqs:
        raise RuntimeError(f"h2load failed ({r.returncode}): {out[-800:]} {r.stderr[-300:]}")

    def ms(v, unit):
        return float(v) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    return {"rps": float(fin.group(3)), "succeeded": int(reqs.group(3)), "failed": int(reqs.group(4)),
            "mean_ms": ms(lat.group(5), lat.group(6)) if lat else None,
            "max_ms": ms(lat.group(3), lat.group(4)) if lat else None, "cmd": " ".join(cmd)}


def smoke_model(tmp):
    import onnx
    from onnx import TensorProto, helper
    d = os.path.join(tmp, "models", "smoke")
    os.makedirs(os.path.join(d, "inputs"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "smoke", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]),
              os.path.join(d, "model.onnx"))
    np.save(os.path.join(d, "inputs", "x.npy"), np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32))
    return os.path.join(tmp, "models")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tabular_mlp,resnet18")
    ap.add_argument("--conns", default="1,16,64")
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--kiln", default=os.path.join(REPO, "build", "kiln"))
    ap.add_argument("--models-dir", default=os.path.join(REPO, "bench", "models"))
    ap.add_argument("--smoke", action="store_true", help="a tiny model, 1 s per run")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln-grpc-bench-")
    if args.smoke:
        args.models_dir, args.models, args.duration = smoke_model(tmp), "smoke", 1
    records = []
    for name in args.models.split(","):
        model_dir = os.path.join(args.models_dir, name)
        base = os.path.join(tmp, name)
        os.makedirs(os.path.join(base, "1"))
        os.symlink(os.path.join(model_dir, "model.onnx"), os.path.join(base, "1", "model.onnx"))
        body = os.path.join(tmp, f"{name}.json")
        x = serve_bench.make_body(model_dir, body)
        in_name = os.path.splitext(sorted(os.listdir(os.path.join(model_dir, "inputs")))[0])[0]
        msg = predict_request_bytes(name, in_name, x)
        framed = os.path.join(tmp, f"{name}.grpc")
        with open(framed, "wb") as f:
            f.write(b"\0" + struct.pack(">I", len(msg)) + msg)
        rest, grpc_port = serve_bench.free_port(), serve_bench.free_port()
        log = open(os.path.join(tmp, f"{name}.log"), "w")
        proc = subprocess.Popen([args.kiln, "serve", f"--model_base_path={base}", f"--model_name={name}",
                                 f"--rest_api_port={rest}", f"--port={grpc_port}",
                                 "--rest_api_address=127.0.0.1"], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            url = f"http://127.0.0.1:{rest}/v1/models/{name}:predict"
            deadline = time.time() + 300
            while True:
                try:
                    answer = serve_bench.post(url, open(body, "rb").read(), 30)
                    break
                except Exception:
                    if time.time() > deadline or proc.poll() is not None:
                        raise SystemExit(f"grpc_bench: {name}: server not ready; see {log.name}")
                    time.sleep(0.5)
            check_grpc(grpc_port, msg, answer)
            for conns in [int(c) for c in args.conns.split(",")]:
                w = serve_bench.run_wrk(args, url, body, conns, 30, os.getpgid(proc.pid))
                h = run_h2load(f"http://127.0.0.1:{grpc_port}/tensorflow.serving.PredictionService/Predict",
                               framed, conns, args.duration)
                rec = {"model": name, "concurrency": conns, "rest": w, "grpc": h}
                records.append(rec)
                print(f"{name:12s} c={conns:<3d} REST {w['rps']:9.0f} req/s p50 {w['p50_ms']:.2f} ms "
                      f"p99 {w['p99_ms']:.2f} ms | gRPC {h['rps']:9.0f} req/s mean {h['mean_ms']} ms "
                      f"max {h['max_ms']} ms ({h['failed']} failed)", flush=True)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.close()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
