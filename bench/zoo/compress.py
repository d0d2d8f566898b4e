#!/usr/bin/python3
"""bench/zoo/compress.py - the model zoo compiled with `kiln compile --precision auto` against
ONNX Runtime fp32 on the source model.

For each zoo model (tools/export_zoo.py's, cached in $KILN_ZOO_DIR, default ~/.cache/kiln/zoo;
bench/zoo/run.sh exports it when missing):

1. data: --samples calibration and as many evaluation samples drawn around the exporter's own
   batch-2 inputs (inputs/<name>.npy): float inputs from a normal distribution with their mean
   and standard deviation, integer inputs uniform over their range; seeds 1 and 2;
2. `kiln compile model.onnx --precision auto --calibration CAL --eval EVAL --max-drop X
   --batch-sizes 1,B`: accuracy-aware mixed precision (int8 where the metric, top-1 agreement
   with fp32 on the evaluation data, stays within --max-drop; the most sensitive nodes in bf16
   or fp32), the report kept beside the .kiln;
3. timing, in --rounds interleaved rounds at batch 1 and --batch (one process per runtime per
   round, the order alternating): `kiln bench auto.kiln --json` and bench/ort_bench.js on the
   source model (onnxruntime-node, graph optimizations on), both on bench/compare.py's random
   input scheme; the median over rounds of each process's median.

It prints (and writes to --out) a Markdown table: per model the report's verdict (drop), how
many nodes ran int8 / bf16 / fp32, the latencies and ONNX Runtime fp32 / Kiln auto per batch,
and the geometric mean of that ratio per batch (the compression issue's target: at least 2x,
every model within its accuracy bound). The raw records go to --json-out.

Usage:
    /usr/bin/python3 bench/zoo/compress.py [--models a,b,...] [--batch 8] [--rounds 2]
        [--samples 32] [--max-drop 1%] [--kiln build/kiln] [--zoo-dir DIR] [--work DIR]
        [--out FILE] [--json-out FILE]
"""

import argparse
import datetime
import importlib.util
import json
import math
import os
import shlex
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
REPO = os.path.dirname(BENCH)


# bench/zoo/compare.py (by path: bench/compare.py has the same module name), and through it
# bench/compare.py's machinery
_spec = importlib.util.spec_from_file_location("kiln_zoo_compare", os.path.join(HERE, "compare.py"))
zc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zc)
bc = zc.bc


def make_data(model_dir, folder, samples, seed):
    """samples inputs around the exporter's own, as folder/<input>.npy."""
    if os.path.isdir(folder):
        return folder
    rng = np.random.default_rng(seed)
    tmp = folder + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    in_dir = os.path.join(model_dir, "inputs")
    for f in sorted(os.listdir(in_dir)):
        if not f.endswith(".npy"):
            continue
        x = np.load(os.path.join(in_dir, f))
        shape = (samples,) + x.shape[1:]
        if x.dtype.kind in "iu":
            y = rng.integers(int(x.min()), int(x.max()) + 1, size=shape).astype(x.dtype)
        elif x.dtype.kind == "b":
            y = rng.integers(0, 2, size=shape).astype(bool)
        else:
            y = rng.normal(float(x.mean()), float(x.std()) or 1.0, size=shape).astype(x.dtype)
        np.save(os.path.join(tmp, f), y)
    os.rename(tmp, folder)
    return folder


def compile_auto(args, name, model, work):
    cal = make_data(os.path.dirname(model), os.path.join(work, "cal"), args.samples, 1)
    ev = make_data(os.path.dirname(model), os.path.join(work, "eval"), args.samples, 2)
    out = os.path.join(work, "auto.kiln")
    rep = out + ".json"
    cmd = [args.kiln, "compile", model, "-o", out, "--precision", "auto", "--calibration", cal,
           "--eval", ev, "--max-drop", args.max_drop, "--batch-sizes", f"1,{args.batch}",
           "--runs", "3", "--threads", str(args.threads), "--report", rep]
    t0 = time.monotonic()
    rc, _, err = bc.run(cmd, args.timeout)
    if rc != 0:
        raise RuntimeError(f"kiln compile: {(err.strip().splitlines() or ['failed'])[-1]}")
    bc.log(f"{name}: compiled with auto in {time.monotonic() - t0:.0f} s")
    with open(rep) as f:
        return out, json.load(f)


def precisions(report):
    count = {"int8": 0, "bf16": 0, "fp32": 0}
    for n in report.get("nodes") or []:
        p = n.get("precision")
        if p in count:
            count[p] += 1
    return count


def bench_cmd(args, runtime, path, batch, spec):
    common = ["--iterations", str(args.iterations), "--warmup", str(args.warmup),
              "--threads", str(args.threads)]
    if runtime == "kiln":
        return [args.kiln, "bench", path, "--batch", str(batch), "--json"] + common
    return [bc.NODE, os.path.join(BENCH, "ort_bench.js"), path, "--batch", str(batch),
            "--spec", json.dumps(spec)] + common


def timing(args, paths, batch, spec):
    res = {rt: [] for rt in paths}
    for r in range(args.rounds):
        order = list(paths) if r % 2 == 0 else list(paths)[::-1]
        for rt in order:
            rc, out, err = bc.run(bench_cmd(args, rt, paths[rt], batch, spec), args.timeout)
            if rc != 0:
                raise RuntimeError(f"{rt} at batch {batch}: "
                                   f"{(err.strip().splitlines() or ['failed'])[-1]}")
            res[rt].append(bc.last_json(out)["median_ms"])
    return {rt: statistics.median(v) for rt, v in res.items()}


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="", help="comma-separated (default: the whole zoo)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--max-drop", default="1%")
    ap.add_argument("--kiln", default=os.path.join(REPO, "build", "kiln"))
    ap.add_argument("--zoo-dir", default=os.environ.get(
        "KILN_ZOO_DIR", os.path.join(os.path.expanduser("~"), ".cache", "kiln", "zoo")))
    ap.add_argument("--work", default=os.path.join(os.path.expanduser("~"), ".cache", "kiln",
                                                   "zoo-compress"))
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--out", default="")
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    names = args.models.split(",") if args.models else zc.zoo_names()
    started = datetime.datetime.now(datetime.timezone.utc)
    records = []
    for name in names:
        model = os.path.join(args.zoo_dir, name, "model.onnx")
        rec = {"model": name}
        records.append(rec)
        try:
            if not os.path.isfile(model):
                raise RuntimeError(f"{model} is missing (bench/zoo/run.sh exports the zoo)")
            work = os.path.join(args.work, name)
            os.makedirs(work, exist_ok=True)
            path, report = compile_auto(args, name, model, work)
            rec["passed"] = report.get("passed")
            rec["verdict"] = report.get("verdict")
            rec["precisions"] = precisions(report)
            inputs, _ = bc.signature(args.kiln, model)
            rec["timing"] = {}
            for b in (1, args.batch):
                med = timing(args, {"kiln": path, "onnxruntime": model}, b, bc.input_spec(inputs, b))
                rec["timing"][b] = med
                bc.log(f"{name}: batch {b}: Kiln auto {med['kiln']:.3f} ms, ONNX Runtime fp32 "
                       f"{med['onnxruntime']:.3f} ms ({med['onnxruntime'] / med['kiln']:.2f}x)")
        except (RuntimeError, OSError, ValueError, KeyError) as e:
            rec["error"] = str(e)
            bc.log(f"{name}: {e}")
        write(args, records, started, final=name == names[-1])


def write(args, records, started, final):
    """The report so far (rewritten after every model, printed at the end)."""
    cmd = "/usr/bin/python3 bench/zoo/compress.py" + (
        " " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "")
    lines = [f"## The zoo compiled with `auto` ({started:%Y-%m-%d})", "",
             f"Command: `{cmd}` ({args.rounds} interleaved rounds, {args.threads} threads, "
             "medians of per-process medians, ms; ratio = ONNX Runtime fp32 / Kiln auto).", "",
             f"| model | verdict | nodes int8 / bf16 / fp32 | Kiln auto b1 | ORT fp32 b1 | ratio b1 "
             f"| Kiln auto b{args.batch} | ORT fp32 b{args.batch} | ratio b{args.batch} |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    ratios = {1: [], args.batch: []}
    for rec in records:
        if "error" in rec:
            lines.append(f"| {rec['model']} | error: {rec['error']} | | | | | | | |")
            continue
        p = rec["precisions"]
        cells = []
        for b in (1, args.batch):
            t = rec["timing"].get(b, {})
            r = t["onnxruntime"] / t["kiln"] if t.get("kiln") else None
            if r and rec["passed"]:
                ratios[b].append(r)
            cells += [f"{t.get('kiln', 0):.3f}", f"{t.get('onnxruntime', 0):.3f}",
                      f"{r:.2f}x" if r else "-"]
        lines.append(f"| {rec['model']} | {rec['verdict']} | {p['int8']} / {p['bf16']} / "
                     f"{p['fp32']} | " + " | ".join(cells) + " |")
    lines += [""]
    for b in (1, args.batch):
        g = geomean(ratios[b])
        lines.append(f"- geometric mean, batch {b}, over {len(ratios[b])} models within their "
                     f"bound: {g:.2f}x ONNX Runtime fp32 (target 2x: "
                     f"{'met' if g and g >= 2 else 'missed'})" if g else
                     f"- batch {b}: nothing measured")
    text = "\n".join(lines) + "\n"
    if final:
        print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"started": started.isoformat(), "argv": sys.argv[1:], "records": records},
                      f, indent=1, default=str)


if __name__ == "__main__":
    main()
