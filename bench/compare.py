#!/usr/bin/python3
"""compare.py - run Kiln, ONNX Runtime and PyTorch side by side on the benchmark
models and write bench/RESULTS.md (and the raw measurements, bench/results.json).

bench/run.sh prepares everything this needs (the kiln build, onnxruntime-node
in bench/node_modules, the exported models in bench/models) and then runs it.

For each model (bench/models/<name>/model.onnx, made by tools/export_models.py):

1. Agreement. The exporter's fixed batch-2 inputs (inputs/*.npy) go through
   `kiln predict`, ONNX Runtime (ort_bench.js check) and PyTorch's own
   nn.Module (torch_bench.py check); every pair must agree within --tol
   (default 1e-4) of the output's scale, max|a - b| <= tol * max(1, max|ref|),
   the measure tests/python/test_models.py uses; a pair with Kiln also agrees
   within 1.5x ONNX Runtime's own distance from PyTorch (two float32 runs of a
   deep network that sum in other orders), and that distance must stay within
   1.5 x tol. PyTorch is also compared with the outputs stored at export,
   which shows that torch_bench.py rebuilt the same module.
2. Timing, at batch 1 and 32 (BERT models: 1 and 8). Each of --rounds rounds
   runs each runtime once in its own process (`kiln bench --json`,
   ort_bench.js, torch_bench.py time), rotating the order every round, so a
   burst of load from elsewhere on the machine hits all three alike. The
   first round records --min-iterations runs; later rounds record enough to
   fill about --target-s seconds per runtime (from the previous round's
   median), between --min-iterations and --max-iterations. Every process
   does its own load, first inference and --warmup unrecorded runs. A
   reported number is the median over rounds of that round's value.

Inputs are random with one scheme in all three (see src/cli/cmd_bench.c):
floats uniform in [-1, 1), integer ids uniform in [0, 100), "mask" inputs all
1. The shapes come from the model's signature with the symbolic batch dim
set to the batch size.

Usage:
    /usr/bin/python3 bench/compare.py [--quick] [--models a,b,...] [--rounds R]
        [--kiln build/kiln] [--models-dir bench/models] [--out bench/RESULTS.md]
        [--command TEXT]
"""

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
NODE = shutil.which("node") or "node"
PYTHON = "/usr/bin/python3"

ALL_MODELS = ["resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0", "bert_small",
              "bert_base", "tabular_mlp", "dlrm"]
QUICK_MODELS = ["tabular_mlp", "dlrm", "bert_small", "mobilenet_v2"]
RUNTIMES = ["kiln", "onnxruntime", "pytorch"]
LABEL = {"kiln": "Kiln", "onnxruntime": "ONNX Runtime", "pytorch": "PyTorch"}


def batches_for(name):
    return (1, 8) if name.startswith("bert") else (1, 32)


def log(msg):
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, timeout):
    """Run cmd; returns (returncode, stdout, stderr), returncode None on timeout."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {timeout} s"


def last_json(stdout):
    """The JSON object a bench tool printed (kiln bench prints it over several lines)."""
    start = stdout.find("{")
    return json.loads(stdout[start:])


# ------------------------------------------------------------------ the machine

def machine_info(kiln):
    info = {"date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        lscpu = ""
    fields = {}
    for line in lscpu.splitlines():
        k, _, v = line.partition(":")
        fields[k.strip()] = v.strip()
    flags = set(fields.get("Flags", "").split())
    info["cpu"] = fields.get("Model name", platform.processor() or "unknown")
    info["cpus"] = fields.get("CPU(s)", str(os.cpu_count()))
    info["threads_per_core"] = fields.get("Thread(s) per core", "?")
    info["avx2"] = "avx2" in flags
    info["avx512f"] = "avx512f" in flags
    info["fma"] = "fma" in flags
    info["kernel"] = platform.release()
    rc, out, _ = run([kiln, "--version"], 30)
    info["kiln"] = out.strip() if rc == 0 else "unknown"
    try:
        with open(os.path.join(BENCH, "node_modules", "onnxruntime-node", "package.json")) as f:
            info["onnxruntime"] = json.load(f)["version"]
    except (OSError, ValueError, KeyError):
        info["onnxruntime"] = "not installed"
    rc, out, _ = run([PYTHON, "-c", "import torch; print(torch.__version__)"], 120)
    info["pytorch"] = out.strip() if rc == 0 else "not installed"
    rc, out, _ = run([NODE, "--version"], 30)
    info["node"] = out.strip() if rc == 0 else "not installed"
    info["python"] = platform.python_version()
    # Debian's PyTorch calls whatever libblas.so.3 the alternatives system
    # picks: netlib's reference BLAS unless OpenBLAS or BLIS is installed.
    blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    info["blas"] = blas if os.path.exists(blas) else "unknown"
    return info


def loadavg():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


# ------------------------------------------------------------------ one model

def signature(kiln, model_path):
    """(inputs, outputs) of the default signature from `kiln inspect --json`."""
    rc, out, err = run([kiln, "inspect", model_path, "--json"], 600)
    if rc != 0:
        raise RuntimeError(f"kiln inspect failed: {err.strip()}")
    sig = json.loads(out)["signatures"][0]
    return sig["inputs"], sig["outputs"]


def input_spec(inputs, batch):
    """Concrete shapes: axis 0 (when not fixed) and every dim named like it = batch."""
    batch_name = None
    for v in inputs:
        if v["shape"] and not isinstance(v["shape"][0], int):
            batch_name = v["shape"][0]
            break
    spec = []
    for v in inputs:
        shape = []
        for axis, d in enumerate(v["shape"]):
            if isinstance(d, int):
                shape.append(d)
            elif axis == 0 or (d is not None and d == batch_name):
                shape.append(batch)
            else:
                raise RuntimeError(f"input {v['name']} dim {axis} ({d}) is symbolic; "
                                   f"the benchmark models have only a symbolic batch dim")
        spec.append({"name": v["name"], "dtype": v["dtype"], "shape": shape})
    return spec


def agreement(args, name, model_dir, inputs, outputs):
    """Run the exporter's fixed inputs through all three; returns a result dict."""
    in_dir = os.path.join(model_dir, "inputs")
    exp_dir = os.path.join(model_dir, "expected")
    model_path = os.path.join(model_dir, "model.onnx")
    spec = json.dumps([{"name": v["name"], "dtype": v["dtype"], "shape": []} for v in inputs])
    out_names = [v["name"] for v in outputs]
    res = {"errors": {}, "pairs": {}}
    with tempfile.TemporaryDirectory(prefix=f"kiln-bench-{name}-") as tmp:
        dirs = {rt: os.path.join(tmp, rt) for rt in RUNTIMES}
        cmds = {
            "kiln": [args.kiln, "predict", model_path, "--output-dir", dirs["kiln"]]
            + [a for v in inputs for a in ("--input", f"{v['name']}={in_dir}/{v['name']}.npy")],
            "onnxruntime": [NODE, os.path.join(BENCH, "ort_bench.js"), model_path,
                            "--check", in_dir, "--out", dirs["onnxruntime"],
                            "--threads", str(args.threads)],
            "pytorch": [PYTHON, os.path.join(BENCH, "torch_bench.py"), "check", model_dir,
                        "--spec", spec, "--outputs", ",".join(out_names), "--inputs", in_dir,
                        "--out", dirs["pytorch"], "--threads", str(args.threads)],
        }
        got = {}
        for rt in RUNTIMES:
            rc, _, err = run(cmds[rt], args.timeout)
            if rc != 0:
                res["errors"][rt] = (err.strip().splitlines() or ["failed"])[-1]
                continue
            got[rt] = {n: np.load(os.path.join(dirs[rt], n + ".npy")) for n in out_names}
        got["export"] = {n: np.load(os.path.join(exp_dir, n + ".npy")) for n in out_names}
        # (a, b): b is the reference whose scale the error is measured against
        for a, b in (("kiln", "pytorch"), ("onnxruntime", "pytorch"), ("kiln", "onnxruntime"),
                     ("pytorch", "export")):
            if a not in got or b not in got:
                continue
            worst = 0.0
            for n in out_names:
                x, y = got[a][n].astype(np.float64), got[b][n].astype(np.float64)
                if x.shape != y.shape:
                    worst = math.inf
                    continue
                scale = max(1.0, float(np.max(np.abs(y))) if y.size else 1.0)
                err = float(np.max(np.abs(x - y))) / scale if y.size else 0.0
                worst = max(worst, err if math.isfinite(err) else math.inf)
            res["pairs"][f"{a}/{b}"] = worst
    res["ok"] = agreement_ok(res["pairs"], res["errors"], args.tol)
    return res


def agreement_ok(pairs, errors, tol):
    """Whether the runtimes agree: none failed, and every pair's error is within tol; a pair
    with Kiln may instead be within 1.5x ONNX Runtime's own distance from PyTorch (two
    float32 runs of a deep network that sum in other orders can each be 1e-4 from the exact
    result; tests/python/test_zoo.py's float64 check says the same), as long as that
    distance itself is within 1.5 x tol."""
    peer = pairs.get("onnxruntime/pytorch", 0.0)
    if errors or not peer <= 1.5 * tol:
        return False
    return all(e <= tol or (pair.startswith("kiln/") and e <= 1.5 * peer)
               for pair, e in pairs.items() if pair != "onnxruntime/pytorch")


def bench_cmd(args, rt, model_dir, batch, spec, iterations):
    model_path = os.path.join(model_dir, "model.onnx")
    common = ["--iterations", str(iterations), "--warmup", str(args.warmup),
              "--threads", str(args.threads)]
    if rt == "kiln":
        return [args.kiln, "bench", model_path, "--batch", str(batch), "--json"] + common
    if rt == "onnxruntime":
        return [NODE, os.path.join(BENCH, "ort_bench.js"), model_path, "--batch", str(batch),
                "--spec", json.dumps(spec)] + common
    return [PYTHON, os.path.join(BENCH, "torch_bench.py"), "time", model_dir,
            "--batch", str(batch), "--spec", json.dumps(spec)] + common


def timing(args, model_dir, batch, spec):
    """All rounds for one model and batch: {runtime: [per-round result]}, errors."""
    results = {rt: [] for rt in RUNTIMES}
    errors = {}
    estimate = {}
    for r in range(args.rounds):
        order = RUNTIMES[r % 3:] + RUNTIMES[:r % 3]
        for rt in order:
            if rt in errors:
                continue
            k = args.min_iterations
            if rt in estimate and estimate[rt] > 0:
                k = int(math.ceil(args.target_s * 1000.0 / estimate[rt]))
                k = max(args.min_iterations, min(args.max_iterations, k))
            rc, out, err = run(bench_cmd(args, rt, model_dir, batch, spec, k), args.timeout)
            if rc != 0:
                errors[rt] = (err.strip().splitlines() or ["failed"])[-1]
                log(f"  {rt}: {errors[rt]}")
                continue
            res = last_json(out)
            res["round"] = r
            results[rt].append(res)
            estimate[rt] = res["median_ms"]
            log(f"  round {r + 1} {rt:12s} median {res['median_ms']:.4f} ms "
                f"({k} runs), load {res['load_ms']:.1f} ms, rss {res['peak_rss_mb']:.1f} MiB")
    return results, errors


def parse_profile(stderr):
    """`kiln bench --profile`'s op table: {"peak": GFLOP/s, "ops": [{op, kernel, nodes, ms,
    share, gflops, peak_pct}], "reference_share": the run's share on reference kernels}
    (gflops and peak_pct None where the op's work is not counted; the share None where the
    profile does not say)."""
    def num(x):
        return None if x == "-" else float(x.rstrip("%"))

    lines = stderr.splitlines()
    peak = next((float(l.split()[1]) for l in lines if l.startswith("peak: ")), None)
    # "reference-kernel steps: N, X% of the time": the share of the run on reference code
    ref = next((float(l.split(",")[1].split("%")[0]) / 100.0 for l in lines
                if l.startswith("reference-kernel steps: ")), None)
    ops = []
    try:
        start = next(i for i, l in enumerate(lines) if l.startswith("op ") and "kernel" in l) + 1
    except StopIteration:
        return {"peak": peak, "ops": ops, "reference_share": ref}
    for line in lines[start:]:
        f = line.split()
        if len(f) < 7 or line.startswith("slowest steps"):
            break
        ops.append({"op": f[0], "kernel": f[1], "nodes": int(f[2]), "ms": float(f[3]),
                    "share": num(f[4]), "gflops": num(f[5]), "peak_pct": num(f[6])})
    return {"peak": peak, "ops": ops, "reference_share": ref}


def kiln_profile(args, model_dir, batch, median_ms):
    """One `kiln bench --profile` process of about two seconds; parse_profile's result, or
    None when it failed."""
    k = max(args.min_iterations, min(args.max_iterations, int(2000.0 / max(median_ms, 1e-3))))
    cmd = [args.kiln, "bench", os.path.join(model_dir, "model.onnx"), "--batch", str(batch),
           "--threads", str(args.threads), "--iterations", str(k), "--warmup",
           str(args.warmup), "--profile"]
    rc, _, err = run(cmd, args.timeout)
    if rc != 0:
        log(f"  kiln profile: {(err.strip().splitlines() or ['failed'])[-1]}")
        return None
    try:
        return parse_profile(err)
    except ValueError as e:  # a row this parser does not know: keep the timings
        log(f"  kiln profile: unreadable table ({e})")
        return None


def summarize(per_round):
    """Median over rounds of each reported number."""
    if not per_round:
        return None
    keys = ["load_ms", "first_inference_ms", "load_to_first_inference_ms", "median_ms",
            "p90_ms", "p99_ms", "mean_ms", "min_ms", "max_ms", "throughput_per_s",
            "peak_rss_mb", "base_rss_mb"]
    s = {k: float(np.median([r[k] for r in per_round])) for k in keys if k in per_round[0]}
    s["rounds"] = len(per_round)
    s["iterations"] = sum(r["iterations"] for r in per_round)
    return s


# ------------------------------------------------------------------ RESULTS.md

def fmt_ms(x):
    if x is None:
        return "error"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def fmt_ratio(a, b):
    if a is None or b is None or b <= 0:
        return "-"
    return f"{a / b:.2f}"


def get(summary, rt, key):
    s = summary.get(rt)
    return s.get(key) if s else None


def write_results(args, info, records, started, finished, path):
    L = []
    mode = "quick (BENCH_QUICK=1)" if args.quick else "full"
    L.append("# Kiln benchmark results\n")
    L.append(f"Written by `bench/compare.py` on {info['date']}; mode: **{mode}**. "
             "Kiln runs its default path: the optimized graph on a compiled plan per shape with "
             "oneDNN and Kiln's SIMD kernels.\n")
    ratios = [(rec["model"], b["batch"],
               get(b["summary"], "kiln", "median_ms") / get(b["summary"], "onnxruntime",
                                                             "median_ms"))
              for rec in records for b in rec["batches"]
              if get(b["summary"], "kiln", "median_ms")
              and get(b["summary"], "onnxruntime", "median_ms")]
    if ratios:
        geo = math.exp(sum(math.log(r) for _, _, r in ratios) / len(ratios))
        worst = max(ratios, key=lambda x: x[2])
        best = min(ratios, key=lambda x: x[2])
        L.append(f"Kiln / ONNX Runtime median latency over {len(ratios)} model-batch pairs: "
                 f"geometric mean **{geo:.2f}**, from {best[2]:.2f} ({best[0]}, batch "
                 f"{best[1]}) to {worst[2]:.2f} ({worst[0]}, batch {worst[1]}).\n")
    L.append("Command:\n")
    L.append("```sh\n" + args.command + "\n```\n")
    if args.command != shlex.join(args.argv):
        L.append("which ran:\n")
        L.append("```sh\n" + shlex.join(args.argv) + "\n```\n")
    L.append("## Machine\n")
    L.append(f"- CPU: {info['cpu']}, {info['cpus']} CPU(s), {info['threads_per_core']} "
             f"thread(s) per core; avx2: {'yes' if info['avx2'] else 'no'}, "
             f"avx512f: {'yes' if info['avx512f'] else 'no'}, "
             f"fma: {'yes' if info['fma'] else 'no'}; Linux {info['kernel']}")
    L.append(f"- Load average (1, 5, 15 min) at start: {started['load']}; at end: "
             f"{finished['load']}. The machine was shared with other work, so absolute "
             "times are noisy; the ratios compare runs interleaved in the same minutes.")
    L.append(f"- Kiln: `{info['kiln']}` (`{os.path.relpath(args.kiln, REPO)}`), session "
             f"threads {args.threads} (one OpenMP pool shared with oneDNN)")
    L.append(f"- ONNX Runtime: onnxruntime-node {info['onnxruntime']} (node {info['node']}), "
             f"graph optimization level all, intra-op threads {args.threads}, inter-op 1")
    L.append(f"- PyTorch: {info['pytorch']} (Debian python3-torch, Python {info['python']}), "
             f"torch.set_num_threads({args.threads}), one inter-op thread, inference_mode, "
             "its own nn.Module; BLAS: `" + info["blas"] + "`"
             + (" (netlib's reference BLAS: PyTorch's Linear and MatMul are slower here than "
                "with OpenBLAS or MKL)" if "/blas/" in info["blas"] else ""))
    L.append(f"- Rounds: {args.rounds}, warmup runs per process: {args.warmup}, recorded runs "
             f"per process: {args.min_iterations} in round 1, then about {args.target_s:g} s "
             f"worth ({args.min_iterations}..{args.max_iterations})")
    L.append(f"- Wall time: {finished['wall_s'] / 60:.1f} min\n")

    L.append("## Median latency (ms)\n")
    L.append("Median over rounds of each process's median; lower is better. "
             "Ratio = Kiln / other (1.0 = as fast; the issue's target is Kiln / ONNX Runtime "
             "<= 1.0 everywhere, <= 0.8 for mobilenet_v2, efficientnet_b0, BERT, tabular "
             "and DLRM).\n")
    L.append("The last column compares the fastest runs (median over rounds of each "
             "process's minimum), which the load from other work on the machine disturbs "
             "least.\n")
    L.append("| model | batch | Kiln | ONNX Runtime | PyTorch | Kiln / ORT | Kiln / PyTorch | "
             "Kiln / ORT (min) |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for rec in records:
        for b in rec["batches"]:
            s = b["summary"]
            k, o, t = (get(s, rt, "median_ms") for rt in RUNTIMES)
            kmin, omin = get(s, "kiln", "min_ms"), get(s, "onnxruntime", "min_ms")
            L.append(f"| {rec['model']} | {b['batch']} | {fmt_ms(k)} | {fmt_ms(o)} | "
                     f"{fmt_ms(t)} | **{fmt_ratio(k, o)}** | {fmt_ratio(k, t)} | "
                     f"{fmt_ratio(kmin, omin)} |")
    L.append("")

    L.append("## Latency spread (ms): min / p90 / p99\n")
    L.append("| model | batch | Kiln | ONNX Runtime | PyTorch |")
    L.append("|---|---:|---|---|---|")
    for rec in records:
        for b in rec["batches"]:
            s = b["summary"]
            cells = [" / ".join(fmt_ms(get(s, rt, k)) for k in ("min_ms", "p90_ms", "p99_ms"))
                     if s.get(rt) else "error" for rt in RUNTIMES]
            L.append(f"| {rec['model']} | {b['batch']} | " + " | ".join(cells) + " |")
    L.append("")

    L.append("## Throughput (examples/s, batch / median)\n")
    L.append("| model | batch | Kiln | ONNX Runtime | PyTorch |")
    L.append("|---|---:|---:|---:|---:|")
    for rec in records:
        for b in rec["batches"]:
            s = b["summary"]
            cells = []
            for rt in RUNTIMES:
                v = get(s, rt, "throughput_per_s")
                cells.append("error" if v is None else f"{v:,.1f}")
            L.append(f"| {rec['model']} | {b['batch']} | " + " | ".join(cells) + " |")
    L.append("")

    L.append("## Load and first inference (ms, batch-1 processes)\n")
    L.append("Load: Kiln `kiln_model_load` + `kiln_session_create`; ONNX Runtime "
             "`InferenceSession.create` (including its graph optimizations); PyTorch "
             "`torch.load` of the whole saved module + `eval()`. Load to first = load + the "
             "first run.\n")
    L.append("| model | Kiln load | ORT load | PyTorch load | Kiln load to first | "
             "ORT load to first | PyTorch load to first | Kiln / ORT (load to first) |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for rec in records:
        if not rec["batches"]:
            continue
        s = rec["batches"][0]["summary"]
        loads = [fmt_ms(get(s, rt, "load_ms")) for rt in RUNTIMES]
        firsts = [fmt_ms(get(s, rt, "load_to_first_inference_ms")) for rt in RUNTIMES]
        ratio = fmt_ratio(get(s, "kiln", "load_to_first_inference_ms"),
                          get(s, "onnxruntime", "load_to_first_inference_ms"))
        L.append(f"| {rec['model']} | " + " | ".join(loads + firsts) + f" | {ratio} |")
    L.append("")

    L.append("## Peak RSS (MiB)\n")
    L.append("Peak resident set (VmHWM) of each benchmark process. In parentheses: the "
             "process's RSS before loading the model (the node runtime with onnxruntime-node "
             "loaded; the Python interpreter with torch imported), which is part of the "
             "peak.\n")
    L.append("| model | batch | Kiln | ONNX Runtime | PyTorch | Kiln / ORT |")
    L.append("|---|---:|---:|---:|---:|---:|")
    for rec in records:
        for b in rec["batches"]:
            s = b["summary"]
            cells = []
            for rt in RUNTIMES:
                v = get(s, rt, "peak_rss_mb")
                base = get(s, rt, "base_rss_mb")
                if v is None:
                    cells.append("error")
                else:
                    cells.append(f"{v:.1f}" + (f" ({base:.0f})" if base is not None else ""))
            ratio = fmt_ratio(get(s, "kiln", "peak_rss_mb"), get(s, "onnxruntime", "peak_rss_mb"))
            L.append(f"| {rec['model']} | {b['batch']} | " + " | ".join(cells) + f" | {ratio} |")
    L.append("")

    L.append("## Agreement on the exporter's fixed inputs (batch 2)\n")
    L.append(f"max|a - b| / max(1, max|b|) over every output; passes at <= {args.tol:g}. "
             "Kiln via `kiln predict`; \"PyTorch / export\" compares this run's PyTorch module "
             "with the outputs stored when the model was exported.\n")
    L.append("| model | Kiln / PyTorch | ORT / PyTorch | Kiln / ORT | PyTorch / export | "
             "agree |")
    L.append("|---|---:|---:|---:|---:|---|")
    for rec in records:
        ag = rec["agreement"]
        cells = []
        for pair in ("kiln/pytorch", "onnxruntime/pytorch", "kiln/onnxruntime",
                     "pytorch/export"):
            v = ag["pairs"].get(pair)
            cells.append("-" if v is None else f"{v:.1e}")
        verdict = "yes" if ag["ok"] else "**NO**"
        L.append(f"| {rec['model']} | " + " | ".join(cells) + f" | {verdict} |")
    L.append("")

    errs = []
    for rec in records:
        for rt, e in rec["agreement"]["errors"].items():
            errs.append(f"- {rec['model']}, agreement, {LABEL[rt]}: {e}")
        for b in rec["batches"]:
            for rt, e in b["errors"].items():
                errs.append(f"- {rec['model']}, batch {b['batch']}, {LABEL[rt]}: {e}")
        if rec.get("error"):
            errs.append(f"- {rec['model']}: {rec['error']}")
    if errs:
        L.append("## Errors\n")
        L.extend(errs)
        L.append("")

    L.append("## Method\n")
    L.append("- Each runtime runs in its own process per model, batch and round; the order of "
             "the three rotates every round, so they are measured alternately in the same "
             "minutes.")
    L.append("- All three runtimes use two intra-op threads. On a machine loaded by other "
             "work, a two-thread runtime can lose time waiting for its slower thread at every "
             "parallel op, so the minimum column is the steadier comparison.")
    L.append("- Inputs are random, one scheme in all three (`src/cli/cmd_bench.c`): floats "
             "uniform in [-1, 1), integer ids uniform in [0, 100), inputs named like `mask` "
             "all 1; shapes from the model's signature with the batch dim set. The generators "
             "differ, so the values differ; the distributions do not.")
    L.append("- Percentiles interpolate linearly between ranks (numpy's default) over one "
             "process's recorded runs; the tables show the median over rounds.")
    L.append("- Raw per-round numbers: `bench/results.json`.")
    L.append("\n## Where Kiln's time goes (`kiln bench --profile`)\n")
    L.append("One more Kiln process per model and batch after the timed rounds, with every step "
             "timed (the profile's own overhead makes its total a little above the median "
             "above). Per op: share of the profiled time and, for ops made of products, "
             "GFLOP/s (2 per multiply-accumulate) as a share of the peak that the profile "
             "measures with a register-only FMA loop on the same threads. The work counted is the "
             "direct algorithm's: Winograd convolutions (3x3, stride 1) multiply less and can "
             "show more than 100%.\n")
    L.append("| model | batch | peak GFLOP/s | ops, slowest first: share of time (GFLOP/s, share of peak) |")
    L.append("|---|---:|---:|---|")
    for rec in records:
        for b in rec["batches"]:
            p = b.get("profile")
            if not p or not p["ops"]:
                continue
            parts = []
            for o in p["ops"][:3]:
                rate = (f" ({o['gflops']:.0f}, {o['peak_pct']:.0f}%)"
                        if o["gflops"] is not None else "")
                parts.append(f"{o['op']} {o['share']:.1f}%{rate}")
            peak = f"{p['peak']:.0f}" if p["peak"] else "-"
            L.append(f"| {rec['model']} | {b['batch']} | {peak} | {'; '.join(parts)} |")
    # Keep the serving benchmarks' sections (bench/serve/serve_bench.py and grpc_bench.py).
    try:
        with open(path) as f:
            old = f.read()
        for tag in ("serve", "grpc", "observers"):  # the serving benchmarks' sections
            i, j = old.find(f"<!-- {tag}:begin -->"), old.find(f"<!-- {tag}:end -->")
            if 0 <= i < j:
                L.append("\n" + old[i:j + len(f"<!-- {tag}:end -->")])
    except OSError:
        pass
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


# ------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"small models ({','.join(QUICK_MODELS)}), fewer runs")
    ap.add_argument("--models", help="comma-separated (default: every exported one; "
                                     "quick: the small ones)")
    ap.add_argument("--models-dir", default=os.path.join(BENCH, "models"))
    ap.add_argument("--kiln", default=os.path.join(REPO, "build", "kiln"))
    ap.add_argument("--out", default=os.path.join(BENCH, "RESULTS.md"))
    ap.add_argument("--json-out", default=os.path.join(BENCH, "results.json"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--min-iterations", type=int)
    ap.add_argument("--max-iterations", type=int)
    ap.add_argument("--target-s", type=float, help="recorded seconds per process after round 1")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per process")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--command", help="the command that started this, for RESULTS.md")
    args = ap.parse_args()
    args.argv = [PYTHON] + [os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]
    defaults = ((2, 1, 3, 200, 2.0) if args.quick else (3, 2, 5, 1000, 8.0))
    for attr, d in zip(("rounds", "warmup", "min_iterations", "max_iterations", "target_s"),
                       defaults):
        if getattr(args, attr) is None:
            setattr(args, attr, d)
    args.kiln = os.path.abspath(args.kiln)
    if not args.command:
        args.command = shlex.join(args.argv)

    if args.models:
        names = [n for n in args.models.split(",") if n]
    else:
        names = [n for n in (QUICK_MODELS if args.quick else ALL_MODELS)
                 if os.path.isfile(os.path.join(args.models_dir, n, "model.onnx"))]
    if not names:
        sys.exit(f"compare: no models under {args.models_dir} (run bench/run.sh)")

    t_start = time.monotonic()
    started = {"load": loadavg()}
    info = machine_info(args.kiln)
    log(f"{info['cpu']}, {info['cpus']} CPUs; kiln {info['kiln']}, ORT {info['onnxruntime']}, "
        f"torch {info['pytorch']}; models: {', '.join(names)}")
    records = []
    for name in names:
        model_dir = os.path.join(args.models_dir, name)
        rec = {"model": name, "batches": [], "agreement": {"errors": {}, "pairs": {},
                                                           "ok": False}}
        records.append(rec)
        try:
            inputs, outputs = signature(args.kiln, os.path.join(model_dir, "model.onnx"))
            torch_file = os.path.join(model_dir, "torch_model.pt")
            if (not os.path.isfile(torch_file) or os.path.getmtime(torch_file)
                    < os.path.getmtime(os.path.join(model_dir, "model.onnx"))):
                log(f"{name}: saving PyTorch's module")
                rc, _, err = run([PYTHON, os.path.join(BENCH, "torch_bench.py"), "prepare",
                                  model_dir], args.timeout)
                if rc != 0:
                    raise RuntimeError(f"torch_bench.py prepare failed: {err.strip()[-300:]}")
            log(f"{name}: agreement check")
            rec["agreement"] = agreement(args, name, model_dir, inputs, outputs)
            log(f"{name}: {rec['agreement']}")
            for batch in batches_for(name):
                log(f"{name}: batch {batch}")
                spec = input_spec(inputs, batch)
                per_round, errors = timing(args, model_dir, batch, spec)
                summary = {rt: summarize(per_round[rt]) for rt in RUNTIMES}
                profile = (kiln_profile(args, model_dir, batch, summary["kiln"]["median_ms"])
                           if summary.get("kiln") else None)
                rec["batches"].append({
                    "batch": batch, "spec": spec, "errors": errors, "rounds": per_round,
                    "summary": summary, "profile": profile})
        except (RuntimeError, OSError, ValueError) as e:
            rec["error"] = str(e)
            log(f"{name}: {e}")
        # write as we go, so a long run leaves partial results behind
        finished = {"load": loadavg(), "wall_s": time.monotonic() - t_start}
        write_results(args, info, records, started, finished, args.out)
        with open(args.json_out, "w") as f:
            settings = {k: getattr(args, k) for k in
                        ("quick", "threads", "rounds", "warmup", "min_iterations",
                         "max_iterations", "target_s", "tol")}
            json.dump({"machine": info, "command": args.command, "argv": args.argv,
                       "settings": settings, "load_start": started["load"],
                       "load_end": finished["load"], "wall_s": finished["wall_s"],
                       "models": records}, f, indent=1)
    log(f"wrote {os.path.relpath(args.out, REPO)} and {os.path.relpath(args.json_out, REPO)}")
    bad = [r["model"] for r in records if not r["agreement"]["ok"]]
    if bad:
        log(f"outputs disagree (or a runtime failed) on: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
