#!/usr/bin/python3
"""grpc_bench.py - `kiln serve`'s gRPC API against its own REST API on the
same server and against a gRPC peer: a Node.js @grpc/grpc-js server around
onnxruntime-node (bench/serve/grpc_node_server.js), on loopback.

For each model (bench/models/<name>, as tools/export_models.py exports them;
one row of the exporter's inputs) one Kiln server is started with both APIs,
and one Node peer. Before measuring, a python3-grpcio call checks that both
gRPC servers answer grpc-status 0 with the outputs of Kiln's REST API (Kiln
exactly, the peer within 1e-4 relative). Then, for each concurrency c (1, 16,
64 concurrent requests), three runs of --duration seconds each:

  Kiln REST   wrk, c connections, posting the row as TF Serving REST JSON
  Kiln gRPC   h2load (Debian's nghttp2-client), min(c, 4) connections of
              c / min(c, 4) streams each (gRPC clients multiplex streams on
              few connections), posting a pre-framed request: the 5-byte gRPC
              prefix plus a serialized PredictRequest (tensor_content)
  Node gRPC   the same h2load run against the peer

Requests/s count completed requests; p50/p99 come from wrk's histogram and
from h2load's per-request --log-file. h2load checks only :status, so each
gRPC run is followed by one grpcio call that must still answer status 0, and
Kiln's error counter (its /metrics page; CANCELLED aside, since h2load ends a
timed run with streams in flight) must not have grown. It prints
one line per point, the ratios Kiln gRPC / Kiln REST and Kiln gRPC / Node
gRPC (requests/s), and a markdown table.

Usage (needs bench/models, bench/node_modules: `bench/serve/run.sh` or
`tools/export_models.py --out bench/models --models tabular_mlp,resnet18` and
`cd bench && npm ci --ignore-scripts`):

    /usr/bin/python3 bench/serve/grpc_bench.py --models tabular_mlp,resnet18 \
        --conns 1,16,64 --duration 10 [--kiln build/kiln] [--json-out F]
    /usr/bin/python3 bench/serve/grpc_bench.py --smoke   # tiny model, 1 s runs

Not part of `make test`; figures from a shared or loaded machine are noise.
"""

import argparse
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

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


def grpc_outputs(port, msg, timeout=60):
    """One Predict call with python3-grpcio: {output name: float32 values}."""
    import grpc
    with grpc.insecure_channel(f"127.0.0.1:{port}",
                               options=[("grpc.max_receive_message_length", 1 << 30)]) as ch:
        raw = ch.unary_unary("/tensorflow.serving.PredictionService/Predict")(msg, timeout=timeout)
    got = {}
    for num, _, entry in fields(raw):
        if num != 1:  # PredictResponse.outputs
            continue
        kv = dict((n, v) for n, _, v in fields(entry))
        t = fields(kv[2])
        vals = b"".join(v for n, wt, v in t if n == 5 and wt == 2)  # packed float_val
        content = b"".join(v for n, _, v in t if n == 4)
        got[kv[1].decode()] = np.frombuffer(content or vals, np.float32)
    return got


def check_grpc(who, port, msg, rest_answer, rtol):
    """grpc-status 0, and the outputs equal REST's (within rtol of the largest)."""
    got = grpc_outputs(port, msg)
    preds = rest_answer["predictions"]
    row = preds[0]
    want = ({k: np.asarray(v, np.float32).ravel() for k, v in row.items()} if isinstance(row, dict)
            else {None: np.asarray(preds, np.float32).ravel()})
    for k, v in want.items():
        g = got.get(k) if k is not None else next(iter(got.values()), None)
        if g is None or g.shape != v.shape:
            raise SystemExit(f"grpc_bench: {who}: output {k} missing or of another size")
        scale = max(1.0, float(np.max(np.abs(v)))) if v.size else 1.0
        err = float(np.max(np.abs(g.astype(np.float64) - v))) if v.size else 0.0
        if err > rtol * scale:
            raise SystemExit(f"grpc_bench: {who} and Kiln REST disagree on output {k} (max error {err})")


def percentile(sorted_vals, q):
    if not sorted_vals:
        return None
    i = min(len(sorted_vals) - 1, max(0, int(round(q / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[i]


def run_h2load(url, body_path, conns, duration, log_path):
    """h2load posting the pre-framed request with `conns` streams in flight."""
    c = min(conns, 4)
    m = max(1, conns // c)
    cmd = ["h2load", f"-c{c}", f"-m{m}", f"-t{min(c, 2)}", f"-D{duration}",
           "-H", "content-type: application/grpc", "-H", "te: trailers",
           "-d", body_path, f"--log-file={log_path}", url]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120)
    out = r.stdout
    reqs = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed", out)
    fin = re.search(r"finished in ([\d.]+)(m?s),", out)
    if r.returncode != 0 or not reqs or not fin:
        raise RuntimeError(f"h2load failed ({r.returncode}): {out[-800:]} {r.stderr[-300:]}")
    lat = []
    with open(log_path) as f:
        for line in f:
            cols = line.split("\t")
            if len(cols) >= 3 and cols[1] == "200":
                lat.append(int(cols[2]) / 1e3)
    lat.sort()
    secs = float(fin.group(1)) / (1e3 if fin.group(2) == "ms" else 1.0)
    return {"rps": len(lat) / secs if secs > 0 else 0.0, "succeeded": int(reqs.group(3)),
            "failed": int(reqs.group(4)), "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
            "max_ms": lat[-1] if lat else None, "cmd": " ".join(cmd)}


def kiln_errors(rest_port):
    """Kiln's count of requests that ended with an error (its /metrics page),
    CANCELLED aside: h2load ends a timed run by closing its connections with
    streams in flight, which the server records as cancelled calls."""
    with urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    n = 0
    for line in text.splitlines():
        if line.startswith("kiln_request_errors_total{") and 'code="CANCELLED"' not in line:
            n += float(line.rsplit(" ", 1)[1])
    return n


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


def start_node_peer(model_onnx, name, tmp):
    port = serve_bench.free_port()
    log = open(os.path.join(tmp, f"{name}-node-grpc.log"), "w")
    proc = subprocess.Popen([serve_bench.NODE, os.path.join(SERVE, "grpc_node_server.js"), model_onnx, name,
                             str(port), "--threads", str(os.cpu_count() or 1)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, port, log


def wait_grpc(who, proc, port, msg, log, limit_s=120):
    deadline = time.time() + limit_s
    while True:
        try:
            grpc_outputs(port, msg, timeout=30)
            return
        except Exception:
            if time.time() > deadline or proc.poll() is not None:
                raise SystemExit(f"grpc_bench: {who} not ready; see {log.name}")
            time.sleep(0.5)


def fnum(x, fmt):
    return "-" if x is None else format(x, fmt)


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def table(records):
    lines = ["| model | streams | Kiln gRPC req/s | p50 ms | p99 ms | Kiln REST req/s | p50 ms | p99 ms "
             "| Node gRPC req/s | p50 ms | p99 ms | gRPC / REST | gRPC / Node |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        k, w, n = r["kiln_grpc"], r["kiln_rest"], r["node_grpc"]
        lines.append(f"| {r['model']} | {r['concurrency']} | {fnum(k['rps'], '.0f')} | {fnum(k['p50_ms'], '.2f')} "
                     f"| {fnum(k['p99_ms'], '.2f')} | {fnum(w['rps'], '.0f')} | {fnum(w['p50_ms'], '.2f')} "
                     f"| {fnum(w['p99_ms'], '.2f')} | {fnum(n['rps'], '.0f')} | {fnum(n['p50_ms'], '.2f')} "
                     f"| {fnum(n['p99_ms'], '.2f')} | {ratio(k['rps'], w['rps'])} | {ratio(k['rps'], n['rps'])} |")
    return "\n".join(lines)


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
    if not os.path.isdir(os.path.join(REPO, "bench", "node_modules", "@grpc", "grpc-js")):
        raise SystemExit("grpc_bench: bench/node_modules lacks @grpc/grpc-js: cd bench && npm ci --ignore-scripts")
    tmp = tempfile.mkdtemp(prefix="kiln-grpc-bench-")
    if args.smoke:
        args.models_dir, args.models, args.duration = smoke_model(tmp), "smoke", 1
    records = []
    for name in args.models.split(","):
        model_dir = os.path.join(args.models_dir, name)
        model_onnx = os.path.join(model_dir, "model.onnx")
        base = os.path.join(tmp, name)
        os.makedirs(os.path.join(base, "1"))
        os.symlink(model_onnx, os.path.join(base, "1", "model.onnx"))
        body = os.path.join(tmp, f"{name}.json")
        x = serve_bench.make_body(model_dir, body)
        in_name = os.path.splitext(sorted(os.listdir(os.path.join(model_dir, "inputs")))[0])[0]
        msg = predict_request_bytes(name, in_name, x)
        framed = os.path.join(tmp, f"{name}.grpc")
        with open(framed, "wb") as f:
            f.write(b"\0" + struct.pack(">I", len(msg)) + msg)
        rest, grpc_port = serve_bench.free_port(), serve_bench.free_port()
        log = open(os.path.join(tmp, f"{name}.log"), "w")
        mon = os.path.join(tmp, "monitoring.config")
        with open(mon, "w") as f:
            f.write('prometheus_config: { enable: true, path: "/metrics" }\n')
        proc = subprocess.Popen([args.kiln, "serve", f"--model_base_path={base}", f"--model_name={name}",
                                 f"--rest_api_port={rest}", f"--port={grpc_port}",
                                 "--rest_api_address=127.0.0.1", "--file_system_poll_wait_seconds=0",
                                 f"--monitoring_config_file={mon}"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        node, node_port, node_log = start_node_peer(model_onnx, name, tmp)
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
            check_grpc("Kiln gRPC", grpc_port, msg, answer, 0.0)
            wait_grpc("the Node gRPC peer", node, node_port, msg, node_log)
            check_grpc("the Node gRPC peer", node_port, msg, answer, 1e-4)
            path = "/tensorflow.serving.PredictionService/Predict"
            for conns in [int(c) for c in args.conns.split(",")]:
                w = serve_bench.run_wrk(args, url, body, conns, 30, os.getpgid(proc.pid))
                errors0 = kiln_errors(rest)
                k = run_h2load(f"http://127.0.0.1:{grpc_port}{path}", framed, conns, args.duration,
                               os.path.join(tmp, f"{name}-{conns}-kiln.tsv"))
                check_grpc("Kiln gRPC", grpc_port, msg, answer, 0.0)
                if kiln_errors(rest) != errors0:
                    raise SystemExit(f"grpc_bench: {name}: Kiln answered gRPC errors under load; see {log.name}")
                n = run_h2load(f"http://127.0.0.1:{node_port}{path}", framed, conns, args.duration,
                               os.path.join(tmp, f"{name}-{conns}-node.tsv"))
                check_grpc("the Node gRPC peer", node_port, msg, answer, 1e-4)
                rec = {"model": name, "concurrency": conns, "kiln_rest": w, "kiln_grpc": k, "node_grpc": n}
                records.append(rec)
                print(f"{name:12s} c={conns:<3d} Kiln gRPC {k['rps']:8.0f} req/s p50 {fnum(k['p50_ms'], '.2f')} "
                      f"p99 {fnum(k['p99_ms'], '.2f')} ms | REST {w['rps']:8.0f} req/s p50 {w['p50_ms']:.2f} "
                      f"p99 {w['p99_ms']:.2f} ms | Node gRPC {n['rps']:8.0f} req/s p50 {fnum(n['p50_ms'], '.2f')} "
                      f"p99 {fnum(n['p99_ms'], '.2f')} ms | gRPC/REST {ratio(k['rps'], w['rps'])} "
                      f"gRPC/Node {ratio(k['rps'], n['rps'])} (h2load failed: Kiln {k['failed']}, "
                      f"Node {n['failed']}; wrk errors {w['errors']})", flush=True)
        finally:
            for p in (proc, node):
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            log.close()
            node_log.close()
    print()
    print(table(records))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
