#!/usr/bin/python3
"""cpu_per_request.py - server CPU time per request of `kiln serve`'s gRPC
API against its REST API, on one server answering both.

Requests per second on a shared or small machine mostly say how the load
client and the server split the cores; the server's own CPU time per request
(user + system of the kiln process, from /proc/PID/stat, before and after a
fixed number of requests) says what a request costs the server and varies
far less with the machine's load. This tool measures it for a Predict of one
row (default: tools/export_models.py's tabular_mlp, 64 floats -> score):

  gRPC  h2load (Debian's nghttp2-client) posting a pre-framed PredictRequest
        (the 5-byte gRPC prefix and tensor_content, as grpc_bench.py frames
        it), --streams in flight over min(streams, 4) connections
  REST  h2load --h1 posting the row as TF Serving REST JSON over --streams
        HTTP/1.1 keep-alive connections (the same load client for both)

Rounds alternate which API goes first; each run is preceded by a short
warm-up. It prints per run the requests/s, the server's CPU microseconds per
request in total and per thread kind (the gRPC loop "grpc-loop", its request
threads "grpc-req", everything else "other": MHD's threads, batching), then
the medians and gRPC / REST. Every answer must be HTTP 200, Kiln's error
counter (its /metrics page) must not grow during a run (h2load checks only
:status, not grpc-status), and each gRPC run is followed by one
python3-grpcio call that must answer status 0 with the REST answer's
outputs.

    /usr/bin/python3 bench/serve/cpu_per_request.py [--requests 200000]
        [--streams 64] [--rounds 3] [--kiln build/kiln]
        [--model-dir bench/models/tabular_mlp] [--perf grpc|rest]

--perf API records the server with `perf record -g` during that API's runs
(perf.data in the current folder) when perf is installed.

Needs bench/models/tabular_mlp (`/usr/bin/python3 tools/export_models.py
--out bench/models --models tabular_mlp`). Not part of `make test`.
"""
import argparse
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

SERVE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(SERVE))
sys.path.insert(0, SERVE)
import grpc_bench  # noqa: E402  (predict_request_bytes, check_grpc)
import serve_bench  # noqa: E402  (make_body, free_port, post)

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid):
    """{thread kind: CPU seconds} of the process's live threads, and the
    process total (which also counts threads that already ended)."""
    kinds = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        fields = s.rsplit(")", 1)[1].split()
        kind = comm if comm in ("grpc-loop", "grpc-req") else "other"
        kinds[kind] = kinds.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return kinds, (int(fields[11]) + int(fields[12])) / TICK


def h2load(args, url, body, streams, n, h1):
    conns = streams if h1 else min(streams, 4)
    cmd = ["h2load", f"-c{conns}", f"-m{1 if h1 else max(1, streams // conns)}", "-t2", f"-n{n}",
           "-d", body]
    cmd += ["--h1", "-H", "content-type: application/json"] if h1 else \
        ["-H", "content-type: application/grpc", "-H", "te: trailers"]
    r = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=600)
    out = r.stdout
    reqs = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed", out)
    codes = re.search(r"status codes: (\d+) 2xx", out)
    rps = re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out)
    if r.returncode != 0 or not reqs or not codes or int(codes.group(1)) != n:
        raise SystemExit(f"cpu_per_request: h2load failed or saw non-200 answers: {out[-600:]} {r.stderr[-300:]}")
    return float(rps.group(1)) if rps else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200000)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kiln", default=os.path.join(REPO, "build", "kiln"))
    ap.add_argument("--model-dir", default=os.path.join(REPO, "bench", "models", "tabular_mlp"))
    ap.add_argument("--perf", choices=["grpc", "rest"])
    ap.add_argument("--server-args", default="", help="extra kiln serve flags, space separated")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model_dir, "model.onnx")):
        raise SystemExit(f"cpu_per_request: {a.model_dir}/model.onnx missing: "
                         "tools/export_models.py --out bench/models --models tabular_mlp")
    name = os.path.basename(os.path.normpath(a.model_dir))
    tmp = tempfile.mkdtemp(prefix="kiln-cpu-")
    base = os.path.join(tmp, name)
    os.makedirs(os.path.join(base, "1"))
    os.symlink(os.path.abspath(os.path.join(a.model_dir, "model.onnx")), os.path.join(base, "1", "model.onnx"))
    body = os.path.join(tmp, "body.json")
    x = serve_bench.make_body(a.model_dir, body)
    in_name = os.path.splitext(sorted(os.listdir(os.path.join(a.model_dir, "inputs")))[0])[0]
    msg = grpc_bench.predict_request_bytes(name, in_name, x)
    framed = os.path.join(tmp, "body.grpc")
    with open(framed, "wb") as f:
        f.write(b"\0" + struct.pack(">I", len(msg)) + msg)
    rest, grpc_port = serve_bench.free_port(), serve_bench.free_port()
    log = open(os.path.join(tmp, "kiln.log"), "w")
    mon = os.path.join(tmp, "monitoring.config")
    with open(mon, "w") as f:
        f.write('prometheus_config: { enable: true, path: "/metrics" }\n')
    proc = subprocess.Popen([a.kiln, "serve", f"--model_base_path={base}", f"--model_name={name}",
                             f"--rest_api_port={rest}", f"--port={grpc_port}", "--rest_api_address=127.0.0.1",
                             "--file_system_poll_wait_seconds=0", f"--monitoring_config_file={mon}"] + a.server_args.split(),
                            stdout=log, stderr=subprocess.STDOUT)
    urls = {"rest": f"http://127.0.0.1:{rest}/v1/models/{name}:predict",
            "grpc": f"http://127.0.0.1:{grpc_port}/tensorflow.serving.PredictionService/Predict"}
    bodies = {"rest": body, "grpc": framed}
    results = {"rest": [], "grpc": []}
    try:
        deadline = time.time() + 120
        while True:
            try:
                answer = serve_bench.post(urls["rest"], open(body, "rb").read(), 30)
                break
            except Exception:
                if time.time() > deadline or proc.poll() is not None:
                    raise SystemExit(f"cpu_per_request: server not ready; see {log.name}")
                time.sleep(0.3)
        grpc_bench.check_grpc("Kiln gRPC", grpc_port, msg, answer, 0.0)
        for rnd in range(a.rounds):
            for api in (("grpc", "rest") if rnd % 2 == 0 else ("rest", "grpc")):
                h2load(a, urls[api], bodies[api], a.streams, max(1000, a.requests // 20), api == "rest")
                perf = None
                if a.perf == api:
                    perf = subprocess.Popen(["perf", "record", "-g", "-q", "-o", f"perf-{api}.data",
                                             "-p", str(proc.pid)], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
                    time.sleep(0.5)
                errors0 = grpc_bench.kiln_errors(rest)
                k0, t0 = thread_cpu(proc.pid)
                rps = h2load(a, urls[api], bodies[api], a.streams, a.requests, api == "rest")
                k1, t1 = thread_cpu(proc.pid)
                if perf:
                    perf.send_signal(2)
                    perf.wait()
                us = (t1 - t0) / a.requests * 1e6
                per = {k: round((k1.get(k, 0) - k0.get(k, 0)) / a.requests * 1e6, 2) for k in k1}
                if grpc_bench.kiln_errors(rest) != errors0:
                    raise SystemExit(f"cpu_per_request: Kiln answered errors under load; see {log.name}")
                if api == "grpc":
                    grpc_bench.check_grpc("Kiln gRPC", grpc_port, msg, answer, 0.0)
                results[api].append({"rps": rps, "us": us, "threads": per})
                print(f"round {rnd + 1} {api:4s}: {rps:8.0f} req/s  {us:6.2f} us CPU/request  {per}",
                      flush=True)
    finally:
        proc.terminate()
        proc.wait()
    med = {api: statistics.median(r["us"] for r in results[api]) for api in results}
    print(json.dumps({"model": name, "streams": a.streams, "requests": a.requests, "rounds": a.rounds,
                      "grpc_us_per_request": round(med["grpc"], 2), "rest_us_per_request": round(med["rest"], 2),
                      "grpc_over_rest": round(med["grpc"] / med["rest"], 3)}))


if __name__ == "__main__":
    main()
