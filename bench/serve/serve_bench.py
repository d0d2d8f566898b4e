#!/usr/bin/python3
"""serve_bench.py - the serving benchmark: `kiln serve` against the two usual
ways of putting a model behind HTTP, measured with wrk on the same machine,
results in a section of bench/RESULTS.md (between `<!-- serve:begin -->` and
`<!-- serve:end -->`; the rest of the file is left alone).

bench/serve/run.sh installs what this needs (wrk, gunicorn, Flask, PyTorch,
onnxruntime-node, the models) and runs it.

Servers, each on its own loopback port, all answering TF Serving's REST
predict call (POST /v1/models/<name>:predict, {"instances": [...]}):

  kiln        `kiln serve` on a TF Serving layout (BASE/1/model.onnx), its
              default threads (--rest_api_num_threads 4 x cores, intra-op all
              cores)
  kiln-batch  the same with --enable_batching and a BatchingParameters file
              (max_batch_size 64, batch_timeout_micros 0, num_batch_threads =
              cores, max_enqueued_batches 100: TF Serving's advice for CPUs)
  flask       bench/serve/flask_server.py under gunicorn, sync workers,
              2 x cores + 1 of them (gunicorn's documented rule), one torch
              thread each; the model's own PyTorch nn.Module, model(x) per
              request
  node        bench/serve/node_server.js: Node's http module around one
              onnxruntime-node session (intra-op threads = cores, inter-op 1)

For each model all four are started together (idle ones cost nothing), the
agreement check posts the benchmark body to each and requires every answer
within --tol (1e-4) of PyTorch's, scaled like compare.py (max|a - b| <= tol *
max(1, max|ref|)). Then, for each round and each connection count, wrk runs
against each server in turn, the order rotating every round, so that load
from other work on the machine hits all of them alike. Reported figures are
medians over rounds. Bodies: one row of the exporter's inputs (tabular_mlp:
1 x 64 floats; resnet18: one 3 x 224 x 224 image).

Besides wrk's numbers it records each server's CPU time per request (the sum
of utime + stime over the server's process group, from /proc, across the wrk
run) and wrk's own CPU time: the load generator shares the cores.

Usage:
    /usr/bin/python3 bench/serve/serve_bench.py [--models tabular_mlp,resnet18]
        [--conns 1,16,64] [--duration 10] [--rounds 2] [--kiln build/kiln]
        [--servers kiln,kiln-batch,flask,node] [--out bench/RESULTS.md]
        [--json-out FILE] [--command TEXT]
"""

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np

SERVE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(SERVE)
REPO = os.path.dirname(BENCH)
PYTHON = "/usr/bin/python3"
NODE = shutil.which("node") or "node"
BEGIN, END = "<!-- serve:begin -->", "<!-- serve:end -->"
ALL_SERVERS = ["kiln", "kiln-batch", "flask", "node"]
LABEL = {"kiln": "Kiln", "kiln-batch": "Kiln + batching", "flask": "Flask + PyTorch",
         "node": "Node + ORT"}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg):
    print(f"[serve {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def group_cpu_s(pgid):
    """utime + stime (s) of every process in process group pgid."""
    ticks = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the comm: state ppid pgrp session ... utime(14th) stime(15th)
        if int(fields[2]) == pgid:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / CLK_TCK


def cmd_version(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return (r.stdout.strip() or r.stderr.strip()).splitlines()[0] if r.returncode == 0 else "?"
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "?"


def machine_info(kiln):
    fields = {}
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            k, _, v = line.partition(":")
            fields[k.strip()] = v.strip()
    except OSError:
        pass
    try:
        with open(os.path.join(BENCH, "node_modules", "onnxruntime-node", "package.json")) as f:
            ort = json.load(f)["version"]
    except (OSError, ValueError, KeyError):
        ort = "?"
    return {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "nproc": os.cpu_count(),
        "cpu": fields.get("Model name", platform.processor() or "?"),
        "kernel": platform.release(),
        "kiln": cmd_version([kiln, "--version"]),
        "node": cmd_version([NODE, "--version"]),
        "onnxruntime": ort,
        "torch": cmd_version([PYTHON, "-c", "import torch; print(torch.__version__)"]),
        "flask": cmd_version([PYTHON, "-c",
                              "import importlib.metadata as m; print(m.version('flask'))"]),
        "gunicorn": cmd_version(["gunicorn", "--version"]).replace("gunicorn (version ", "")
        .rstrip(")"),
        "wrk": cmd_version(["sh", "-c", "wrk -v 2>&1 | head -n 1"]).split(" [")[0]
        .replace("wrk debian/", "").replace("wrk ", ""),
    }


# ------------------------------------------------------------------ servers

class Server:
    def __init__(self, key, cmd, env, port, log_path):
        self.key, self.cmd, self.port, self.log_path = key, cmd, port, log_path
        self.env = dict(os.environ, **env)
        self.proc = None

    def start(self):
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, env=self.env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        if self.proc:
            self.log.close()

    def tail(self):
        try:
            with open(self.log_path) as f:
                return f.read()[-1500:]
        except OSError:
            return ""


def post(url, body, timeout):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(server, url, body, timeout):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.key} exited with {server.proc.returncode}:\n"
                               f"{server.tail()}")
        try:
            return post(url, body, 120)
        except (urllib.error.URLError, ConnectionError, OSError, ValueError) as e:
            last = e
            time.sleep(0.5)
    raise RuntimeError(f"{server.key} not answering {url} after {timeout} s ({last}):\n"
                       f"{server.tail()}")


def make_servers(args, name, tmp, base_dir):
    model_dir = os.path.join(args.models_dir, name)
    nproc = os.cpu_count() or 1
    batching = os.path.join(tmp, "batching.txt")
    with open(batching, "w") as f:
        f.write("max_batch_size { value: 64 }\n"
                "batch_timeout_micros { value: 0 }\n"
                f"num_batch_threads {{ value: {nproc} }}\n"
                "max_enqueued_batches { value: 100 }\n")
    servers = {}
    for key in args.servers:
        port = free_port()
        log_path = os.path.join(tmp, f"{name}-{key}.log")
        if key in ("kiln", "kiln-batch"):
            cmd = [os.path.abspath(args.kiln), "serve", f"--rest_api_port={port}",
                   "--rest_api_address=127.0.0.1", f"--model_name={name}",
                   f"--model_base_path={base_dir}", "--file_system_poll_wait_seconds=0"]
            if key == "kiln-batch":
                cmd += ["--enable_batching", f"--batching_parameters_file={batching}"]
            env = {}
        elif key == "flask":
            workers = args.flask_workers or 2 * nproc + 1
            cmd = ["gunicorn", "-w", str(workers), "-b", f"127.0.0.1:{port}", "--chdir", SERVE,
                   "--timeout", "300", "--backlog", "2048", "flask_server:app"]
            env = {"SERVE_MODEL_DIR": os.path.abspath(model_dir), "SERVE_MODEL_NAME": name,
                   "SERVE_TORCH_THREADS": "1"}
        elif key == "node":
            cmd = [NODE, os.path.join(SERVE, "node_server.js"),
                   os.path.join(model_dir, "model.onnx"), name, str(port),
                   "--threads", str(nproc)]
            env = {}
        else:
            raise SystemExit(f"serve_bench: unknown server '{key}'")
        servers[key] = Server(key, cmd, env, port, log_path)
    return servers


# ------------------------------------------------------------------ measuring

def make_body(model_dir, path):
    """One example from the exporter's batch-2 inputs, as TF Serving row format."""
    in_dir = os.path.join(model_dir, "inputs")
    files = sorted(os.listdir(in_dir))
    if len(files) != 1:
        raise SystemExit(f"serve_bench: {in_dir}: expected one input, found {files}")
    x = np.load(os.path.join(in_dir, files[0]))[:1].astype(np.float32)
    with open(path, "w") as f:
        json.dump({"instances": x.tolist()}, f, separators=(",", ":"))
    return x


def agree(answers, tol):
    """{server: predictions}; returns (ok, {server: max abs error vs flask (or the first)})."""
    ref_key = "flask" if "flask" in answers else next(iter(answers))
    ref = np.asarray(answers[ref_key], dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(ref))))
    errs, ok = {}, True
    for k, v in answers.items():
        a = np.asarray(v, dtype=np.float64)
        if a.shape != ref.shape:
            errs[k] = f"shape {list(a.shape)} vs {ref_key}'s {list(ref.shape)}"
            ok = False
            continue
        e = float(np.max(np.abs(a - ref))) if a.size else 0.0
        errs[k] = e
        ok = ok and e <= tol * scale
    return ok, errs, ref_key


def run_wrk(args, url, body_path, conns, timeout_s, pgid):
    threads = min(2, conns)
    cmd = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{args.duration}s", "--latency",
           f"--timeout={timeout_s}s", "-s", os.path.join(SERVE, "post.lua"), url]
    cpu0 = group_cpu_s(pgid)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, WRK_BODY=body_path),
                       timeout=args.duration + timeout_s + 60)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu1 = group_cpu_s(pgid)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if r.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    w = json.loads(line[len("WRKJSON "):])
    secs = w["duration_us"] / 1e6
    ok = w["requests"] - w["errors"]["status"]
    errors = sum(w["errors"].values())
    return {
        "rps": ok / secs if secs > 0 else 0.0,
        "p50_ms": w["p50_us"] / 1e3, "p90_ms": w["p90_us"] / 1e3, "p99_ms": w["p99_us"] / 1e3,
        "max_ms": w["max_us"] / 1e3, "requests": w["requests"], "errors": errors,
        "error_detail": w["errors"],
        "server_cpu_ms_per_req": (cpu1 - cpu0) * 1e3 / ok if ok else None,
        "server_cores_busy": (cpu1 - cpu0) / secs if secs > 0 else None,
        "wrk_cores_busy": ((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)) / secs
        if secs > 0 else None,
        "wrk_cmd": " ".join(cmd),
    }


def settle(server, limit_s=180):
    """Wait until the server is idle (under 5% of a core for 0.5 s): wrk stops with
    requests in flight, and a slow server goes on computing them after wrk has gone,
    which would load the next server's run. Returns the seconds waited."""
    t0 = time.time()
    last = group_cpu_s(server.proc.pid)
    while time.time() - t0 < limit_s:
        time.sleep(0.5)
        now = group_cpu_s(server.proc.pid)
        if now - last < 0.025:
            break
        last = now
    return time.time() - t0


def bench_model(args, name, tmp):
    model_dir = os.path.join(args.models_dir, name)
    base_dir = os.path.join(tmp, "base", name)
    os.makedirs(os.path.join(base_dir, "1"))
    os.symlink(os.path.abspath(os.path.join(model_dir, "model.onnx")),
               os.path.join(base_dir, "1", "model.onnx"))
    if "flask" in args.servers and not os.path.exists(os.path.join(model_dir, "torch_model.pt")):
        log(f"{name}: rebuilding the PyTorch module (torch_bench.py prepare)")
        subprocess.run([PYTHON, os.path.join(BENCH, "torch_bench.py"), "prepare", model_dir],
                       check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    body_path = os.path.join(tmp, f"{name}.json")
    x = make_body(model_dir, body_path)
    with open(body_path, "rb") as f:
        body = f.read()
    servers = make_servers(args, name, tmp, base_dir)
    rec = {"model": name, "input_shape": list(x.shape), "body_bytes": len(body),
           "servers": {k: " ".join(s.cmd) for k, s in servers.items()}, "runs": []}
    try:
        for s in servers.values():
            s.start()
        answers = {}
        for k, s in servers.items():
            url = f"http://127.0.0.1:{s.port}/v1/models/{name}:predict"
            got = wait_ready(s, url, body, args.start_timeout)
            if "predictions" not in got:
                raise RuntimeError(f"{k}: no predictions in {str(got)[:300]}")
            answers[k] = got["predictions"]
        ok, errs, ref_key = agree(answers, args.tol)
        rec["agreement"] = {"ok": ok, "reference": ref_key, "max_abs_err": errs}
        log(f"{name}: agreement vs {ref_key}: " +
            ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
                      for k, v in errs.items()))
        if not ok:
            raise RuntimeError(f"{name}: the servers disagree beyond {args.tol}: {errs}")
        timeout_s = args.wrk_timeout or (5 if name == "tabular_mlp" else 60)
        keys = list(servers)
        # warm up (every gunicorn worker's first call, ORT's and Kiln's arenas): a short
        # unrecorded run at the highest concurrency
        for k, s in servers.items():
            url = f"http://127.0.0.1:{s.port}/v1/models/{name}:predict"
            args_w = argparse.Namespace(**dict(vars(args), duration=2))
            run_wrk(args_w, url, body_path, min(max(args.conns), 8), timeout_s, s.proc.pid)
            settle(s)
        for rnd in range(args.rounds):
            for conns in args.conns:
                order = keys[rnd % len(keys):] + keys[:rnd % len(keys)]
                for k in order:
                    s = servers[k]
                    url = f"http://127.0.0.1:{s.port}/v1/models/{name}:predict"
                    r = run_wrk(args, url, body_path, conns, timeout_s, s.proc.pid)
                    r.update(server=k, conns=conns, round=rnd, settle_s=settle(s))
                    rec["runs"].append(r)
                    log(f"{name} round {rnd + 1} c={conns:<3} {k:<10} {r['rps']:9.1f} req/s  "
                        f"p50 {r['p50_ms']:8.3f} ms  p99 {r['p99_ms']:8.3f} ms  "
                        f"errors {r['errors']}  cpu/req {fms(r['server_cpu_ms_per_req'])} ms  "
                        f"settle {r['settle_s']:.1f} s  load {loadavg()}")
                    if s.proc.poll() is not None:
                        raise RuntimeError(f"{k} died during the run:\n{s.tail()}")
    finally:
        for s in servers.values():
            s.stop()
    return rec


# ------------------------------------------------------------------ report

def summarize(rec, server, conns):
    runs = [r for r in rec["runs"] if r["server"] == server and r["conns"] == conns]
    if not runs:
        return None

    def med(key):
        vals = [r[key] for r in runs if r[key] is not None]
        return statistics.median(vals) if vals else None
    return {"rps": med("rps"), "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
            "errors": sum(r["errors"] for r in runs), "requests": sum(r["requests"] for r in runs),
            "cpu": med("server_cpu_ms_per_req"), "busy": med("server_cores_busy"),
            "wrk_busy": med("wrk_cores_busy")}


def fms(x):
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def frps(x):
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def ratio(a, b):
    return "-" if not a or not b else f"{a / b:.2f}"


def section(args, info, records, started, finished):
    L = [BEGIN, "## Serving benchmark (HTTP, wrk)", ""]
    L.append(f"Written by `bench/serve/serve_bench.py` on {info['date']}: "
             f"{args.rounds} round(s) of {args.duration} s per server, model and connection "
             f"count. Not a timed test; `bench/compare.py` keeps this section when it rewrites "
             f"the file.")
    L.append("")
    L.append("Command:")
    L.append("")
    L.append("```sh")
    L.append(args.command or " ".join(sys.argv))
    L.append("```")
    L.append("")
    L.append("Each wrk run: `wrk -t2 -cN -dDs --latency --timeout=Ts -s bench/serve/post.lua URL` "
             "(`-t1` for one connection; T = 5 s for tabular_mlp, 60 s for resnet18), posting a "
             "fixed body (`{\"instances\": [...]}`, one example) to "
             "`/v1/models/<name>:predict`.")
    L.append("")
    L.append("Machine and versions:")
    L.append("")
    L.append(f"- {info['cpu']}, nproc {info['nproc']}; Linux {info['kernel']}. Load average at "
             f"start {started['load']}, at end {finished['load']}; wall time "
             f"{(finished['t'] - started['t']) / 60:.1f} min.")
    L.append(f"- `{info['kiln']}` (`{args.kiln}`); onnxruntime-node {info['onnxruntime']} on node "
             f"{info['node']}; PyTorch {info['torch']}, Flask {info['flask']}, "
             f"gunicorn {info['gunicorn']}; wrk {info['wrk']}.")
    L.append("")
    L.append("Servers (all on 127.0.0.1, started together, measured one after another):")
    L.append("")
    nproc = info["nproc"]
    workers = args.flask_workers or 2 * nproc + 1
    L.append(f"- **Kiln**: `kiln serve` with its defaults (`--rest_api_num_threads` "
             f"4 x cores = {4 * nproc}, intra-op threads = all cores), model in a TF Serving "
             f"layout (BASE/1/model.onnx).")
    L.append("- **Kiln + batching**: the same plus `--enable_batching "
             "--batching_parameters_file` with max_batch_size 64, batch_timeout_micros 0, "
             f"num_batch_threads {nproc}, max_enqueued_batches 100 (TF Serving's CPU advice).")
    L.append(f"- **Flask + PyTorch**: `bench/serve/flask_server.py` under gunicorn "
             f"(Debian's), {workers} sync workers (gunicorn's 2 x cores + 1), "
             f"`torch.set_num_threads(1)` each; the model's own nn.Module "
             f"(`bench/torch_bench.py prepare`), `model(x)` per request.")
    L.append(f"- **Node + ORT**: `bench/serve/node_server.js`, Node's http module, one "
             f"onnxruntime-node session (graph optimization all, intra-op threads {nproc}, "
             f"inter-op 1), one `session.run` per request.")
    L.append("")
    L.append("Before measuring, each model's body went to every server and every answer was "
             f"compared with PyTorch's (max |a - b| <= {args.tol} x max(1, max|ref|)):")
    L.append("")
    for rec in records:
        errs = rec["agreement"]["max_abs_err"]
        L.append(f"- {rec['model']} (input {rec['input_shape']}, body {rec['body_bytes']:,} "
                 f"bytes): " + ", ".join(
                     f"{LABEL[k]} {v:.1e}" if isinstance(v, float) else f"{LABEL[k]} {v}"
                     for k, v in errs.items() if k != rec["agreement"]["reference"]) +
                 (" — agree" if rec["agreement"]["ok"] else " — **DISAGREE**"))
    L.append("")
    L.append("### Throughput and latency")
    L.append("")
    L.append("Requests/s counts 2xx answers; p50 / p99 from wrk's histogram (completed requests "
             "only). Errors: wrk's connect/read/write/timeout errors plus non-2xx answers, all "
             "rounds. Server CPU: the server's CPU time (all its processes and threads) per "
             "answered request; busy: cores the server kept busy. Medians over rounds.")
    L.append("")
    L.append("| model | conns | server | req/s | p50 ms | p99 ms | errors | server CPU ms/req "
             "| server busy (cores) | wrk busy (cores) |")
    L.append("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for rec in records:
        for c in args.conns:
            for k in args.servers:
                s = summarize(rec, k, c)
                if not s:
                    continue
                L.append(f"| {rec['model']} | {c} | {LABEL[k]} | {frps(s['rps'])} | "
                         f"{fms(s['p50_ms'])} | {fms(s['p99_ms'])} | {s['errors']} | "
                         f"{fms(s['cpu'])} | {busy(s['busy'])} | {busy(s['wrk_busy'])} |")
    L.append("")
    L.append("### Ratios (throughput)")
    L.append("")
    L.append("| model | conns | Kiln / Flask | Kiln / Node | Kiln + batching / Flask "
             "| Kiln + batching / Node |")
    L.append("|---|---:|---:|---:|---:|---:|")
    for rec in records:
        for c in args.conns:
            g = {k: summarize(rec, k, c) for k in args.servers}
            rp = {k: (v["rps"] if v else None) for k, v in g.items()}
            L.append(f"| {rec['model']} | {c} | {ratio(rp.get('kiln'), rp.get('flask'))} | "
                     f"{ratio(rp.get('kiln'), rp.get('node'))} | "
                     f"{ratio(rp.get('kiln-batch'), rp.get('flask'))} | "
                     f"{ratio(rp.get('kiln-batch'), rp.get('node'))} |")
    L.append("")
    L.append("### Targets (tabular_mlp, 64 connections)")
    L.append("")
    L.append("The issue asks for at least 10x Flask's and 2x Node's throughput with a lower p99 "
             "than both.")
    L.append("")
    tab = next((r for r in records if r["model"] == "tabular_mlp"), None)
    if tab and 64 in args.conns:
        g = {k: summarize(tab, k, 64) for k in args.servers}
        for k in ("kiln", "kiln-batch"):
            if not g.get(k):
                continue
            parts = []
            for peer, want in (("flask", 10.0), ("node", 2.0)):
                if g.get(peer) and g[peer]["rps"]:
                    x = g[k]["rps"] / g[peer]["rps"]
                    parts.append(f"{x:.2f}x {LABEL[peer]} (target {want:g}x: "
                                 f"{'met' if x >= want else '**not met**'})")
            p99s = [g[p]["p99_ms"] for p in ("flask", "node") if g.get(p)]
            if p99s:
                lower = g[k]["p99_ms"] < min(p99s)
                parts.append(f"p99 {fms(g[k]['p99_ms'])} ms vs "
                             + " / ".join(f"{fms(g[p]['p99_ms'])} ms"
                                          for p in ("flask", "node") if g.get(p))
                             + f" ({'lower than both: met' if lower else '**not met**'})")
            L.append(f"- {LABEL[k]}: " + "; ".join(parts) + ".")
    else:
        L.append("- not measured in this run.")
    L.append("")
    L.append("### Caveats")
    L.append("")
    L.append("- wrk runs on the same cores as the server (the wrk busy column is its share), "
             "so no server gets the whole machine; the faster the server, the more CPU wrk "
             "takes from it, which narrows the gap between fast and slow servers. Server CPU "
             "per request is the figure least disturbed by this.")
    L.append("- wrk stops with requests in flight; before the next run the benchmark waits "
             "until the server has finished them (its CPU use drops to idle), so one server's "
             "backlog does not load the next one's run. Latencies count completed requests "
             "only: a server so slow that requests exceed wrk's timeout shows them as errors.")
    L.append("- The machine was shared with other work (builds and tests) during the run; the "
             "servers were measured alternately, rotating the order every round, so a burst "
             "of load hits all of them alike, but absolute figures are noisy. Compare ratios, "
             "and rerun with more rounds (`SERVE_ROUNDS`) before quoting them.")
    L.append("- Raw per-run numbers: `bench/serve/results.json`.")
    L.append(END)
    return "\n".join(L) + "\n"


def busy(x):
    return "-" if x is None else f"{x:.2f}"


def write_section(path, text):
    try:
        with open(path) as f:
            old = f.read()
    except FileNotFoundError:
        old = ""
    i, j = old.find(BEGIN), old.find(END)
    if i >= 0 and j > i:
        new = old[:i] + text + old[j + len(END):].lstrip("\n")
    else:
        new = old.rstrip("\n") + ("\n\n" if old else "") + text
    with open(path + ".tmp", "w") as f:
        f.write(new)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tabular_mlp,resnet18")
    ap.add_argument("--conns", default="1,16,64")
    ap.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--servers", default=",".join(ALL_SERVERS))
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--models-dir", default=os.path.join(BENCH, "models"))
    ap.add_argument("--flask-workers", type=int, default=0, help="default 2 x cores + 1")
    ap.add_argument("--wrk-timeout", type=int, default=0,
                    help="wrk --timeout in s (default 5 for tabular_mlp, 60 otherwise)")
    ap.add_argument("--start-timeout", type=int, default=300)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--out", default=os.path.join(BENCH, "RESULTS.md"))
    ap.add_argument("--json-out", default=os.path.join(SERVE, "results.json"))
    ap.add_argument("--command", help="the command that started this, for RESULTS.md")
    args = ap.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    args.conns = [int(c) for c in args.conns.split(",") if c]
    args.servers = [s for s in args.servers.split(",") if s]
    for s in args.servers:
        if s not in ALL_SERVERS:
            ap.error(f"unknown server '{s}' (have {', '.join(ALL_SERVERS)})")

    info = machine_info(args.kiln)
    started = {"t": time.time(), "load": loadavg()}
    records = []
    with tempfile.TemporaryDirectory(prefix="kiln-serve-bench-") as tmp:
        for name in args.models:
            log(f"{name}: starting {', '.join(args.servers)}")
            records.append(bench_model(args, name, tmp))
    finished = {"t": time.time(), "load": loadavg()}
    with open(args.json_out, "w") as f:
        json.dump({"info": info, "args": vars(args), "records": records}, f, indent=1)
    write_section(args.out, section(args, info, records, started, finished))
    log(f"wrote the serve section of {args.out} and {args.json_out}")


if __name__ == "__main__":
    main()
