#!/usr/bin/python3
"""bench/compress/run.py - the compression benchmark: Kiln fp32 / bf16 / int8 against ONNX
Runtime fp32 and ONNX Runtime running Kiln's own int8 model (`kiln compile --emit-onnx`),
per model and batch, with file sizes, the compile reports' accuracy figures, and the
ratios against the targets of the compression issue. For a quiet machine: it takes about
an hour with bert_base; it is not part of `make test`.

For each model (bench/models/<name>/model.onnx, exported by tools/export_models.py when
missing, with random weights and fixed seeds):

1. data: --cal-samples calibration inputs and --eval-samples evaluation inputs drawn by the
   exporter's own input generator (tools/export_models.py MODELS[name]) with fixed seeds,
   saved as folders of <input>.npy;
2. compile (`kiln compile`, --max-drop 100%: the figures are reported, not enforced):
     fp32.kiln   --precision fp32
     bf16.kiln   --precision bf16
     int8.kiln   dynamic int8 (activation ranges measured per run)
     int8_static.kiln  CNNs: static int8 (--calibration, --calibration-method minmax),
                 also written as qdq.onnx (--emit-onnx), the model ORT's int8 row runs;
                 transformers (bert_*): a static int8 compile only to emit qdq.onnx (QDQ
                 cannot express dynamic scales)
   each with --eval on the evaluation data (no labels: random weights, so the metric is
   top-1 agreement with fp32 and the report's SQNR / errors);
3. time, in --rounds interleaved rounds (the order rotates every round), each runtime in its
   own process on the same random-input scheme as bench/compare.py:
     kiln_fp32, kiln_bf16, kiln_int8, kiln_int8_static   `kiln bench X.kiln --json`
     ort_fp32                          bench/ort_bench.js model.onnx (onnxruntime-node)
     ort_qdq                           bench/ort_bench.js qdq.onnx
   the median over rounds of each process's median latency is reported;
4. write a markdown section (--out, default bench/compress/results.md, for pasting into
   bench/RESULTS.md with the command line that made it) and the raw numbers (--json-out).

Targets checked (from the issue; int8 is static for the CNNs, dynamic for bert_base):
resnet50 int8 >= 3.0x ORT fp32 and >= 1.5x ORT on the same int8 model; bert_base int8 >=
2.5x ORT fp32 and >= 1.2x ORT int8; bf16 >= 1.5x Kiln fp32 on resnet50 and bert_base;
mobilenet_v2 and efficientnet_b0 int8 >= 2x ORT fp32; the int8 .kiln <= 0.27x the source
ONNX model (the fp32 model as the user has it; an fp32 .kiln also stores packed weights and
is larger); bert_base pruned to --prune (default 90%, one shot by magnitude: `kiln compile
--prune`) in fp32 and dynamic int8 on the sparse kernels, int8 >= 6x ORT fp32 (the dense
model: ONNX Runtime's CPU kernels do not skip zeros).

Usage:
    /usr/bin/python3 bench/compress/run.py [--models resnet50,mobilenet_v2,efficientnet_b0,bert_base]
        [--batches 1,8] [--rounds 5] [--threads 2] [--kiln build/kiln]
Smoke run (a tiny model, one round, seconds):
    /usr/bin/python3 bench/compress/run.py --models tabular_mlp --batches 1 --rounds 1 \\
        --iterations 5 --work /tmp/kiln-compress-smoke --out /tmp/kiln-compress-smoke/results.md
"""

import argparse
import datetime
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
REPO = os.path.dirname(BENCH)
NODE = shutil.which("node") or "node"
PYTHON = "/usr/bin/python3"
sys.path.insert(0, os.path.join(REPO, "tools"))
sys.path.insert(0, BENCH)

VARIANTS = ["kiln_fp32", "kiln_bf16", "kiln_int8", "kiln_int8_static", "kiln_sparse_fp32",
            "kiln_sparse_int8", "ort_fp32", "ort_qdq"]
LABEL = {"kiln_fp32": "Kiln fp32", "kiln_bf16": "Kiln bf16", "kiln_int8": "Kiln int8",
         "kiln_int8_static": "Kiln static int8",
         "kiln_sparse_fp32": "Kiln pruned fp32", "kiln_sparse_int8": "Kiln pruned int8",
         "ort_fp32": "ORT fp32", "ort_qdq": "ORT on Kiln's QDQ int8"}
# (model, numerator, denominator, minimum ratio of denominator's latency to numerator's)
# The int8 is static for CNNs and dynamic for transformers; dynamic int8 of the CNNs
# stays in the table (a column), not in the targets.
SPEED_TARGETS = [
    ("bert_base", "kiln_int8", "ort_fp32", 2.5), ("bert_base", "kiln_int8", "ort_qdq", 1.2),
    ("resnet50", "kiln_bf16", "kiln_fp32", 1.5), ("bert_base", "kiln_bf16", "kiln_fp32", 1.5),
    ("resnet50", "kiln_int8_static", "ort_fp32", 3.0), ("resnet50", "kiln_int8_static", "ort_qdq", 1.5),
    ("mobilenet_v2", "kiln_int8_static", "ort_fp32", 2.0),
    ("efficientnet_b0", "kiln_int8_static", "ort_fp32", 2.0),
    ("bert_base", "kiln_sparse_int8", "ort_fp32", 6.0),
]
INT8_SIZE_TARGET = 0.27


def int8_variant(name):
    """The int8 file the targets judge: dynamic for transformers, static for CNNs."""
    return "kiln_int8" if transformer(name) else "kiln_int8_static"


def log(msg):
    print(f"compress-bench: {msg}", file=sys.stderr, flush=True)


def run(cmd, timeout):
    try:
        p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout} s"


def transformer(name):
    return name.startswith("bert")


def ensure_model(args, name):
    path = os.path.join(args.models_dir, name, "model.onnx")
    if not os.path.exists(path):
        log(f"exporting {name} into {args.models_dir}")
        cmd = [PYTHON, os.path.join(REPO, "tools", "export_models.py"), "--out", args.models_dir,
               "--models", name] + (["--bert-base"] if name == "bert_base" else [])
        rc, _, err = run(cmd, 3600)
        if rc != 0:
            raise RuntimeError(f"export of {name} failed: {err.strip()[-500:]}")
    return path


def make_data(name, folder, samples, seed):
    """samples inputs from the exporter's generator, as folder/<input>.npy."""
    import torch
    import export_models
    if os.path.isdir(folder):
        return folder
    _, make_inputs, _ = export_models.MODELS[name]()
    gen = torch.Generator().manual_seed(seed)
    parts = [make_inputs(min(8, samples - i), gen) for i in range(0, samples, 8)]
    os.makedirs(folder + ".tmp", exist_ok=True)
    for k in parts[0]:
        np.save(os.path.join(folder + ".tmp", f"{k}.npy"),
                np.concatenate([p[k].numpy() for p in parts]))
    os.rename(folder + ".tmp", folder)
    return folder


def compile_variants(args, name, model, work, cal, ev):
    """The .kiln files and qdq.onnx; returns {variant: path}, {variant: report}, errors."""
    base = [args.kiln, "compile", model, "--max-drop", "100%", "--eval", ev,
            "--batch-sizes", args.batches, "--runs", str(args.compile_runs),
            "--threads", str(args.threads)]
    jobs = {
        "kiln_fp32": ["--precision", "fp32"],
        "kiln_bf16": ["--precision", "bf16"],
        "kiln_int8": ["--precision", "int8"],
    }
    if not transformer(name):
        # static int8 (what ORT runs from qdq.onnx): the same graph, run by Kiln
        jobs["kiln_int8_static"] = ["--precision", "int8", "--calibration", cal,
                                    "--calibration-method", "minmax", "--emit-onnx",
                                    os.path.join(work, "qdq.onnx")]
    if transformer(name):
        jobs["static_int8"] = ["--precision", "int8", "--calibration", cal, "--emit-onnx",
                               os.path.join(work, "qdq.onnx")]
        if args.prune > 0:
            # pruned by magnitude in one shot (--prune), on the sparse kernels where they
            # measure faster (--sparse auto); the accuracy cost is in the report
            prune = ["--prune", str(args.prune), "--prune-block", str(args.prune_block)]
            jobs["kiln_sparse_fp32"] = ["--precision", "fp32"] + prune
            jobs["kiln_sparse_int8"] = ["--precision", "int8"] + prune
    for v in (args.skip.split(",") if args.skip else []):
        jobs.pop(v, None)
    paths, reports, errors = {}, {}, {}
    for v, extra in jobs.items():
        out = os.path.join(work, f"{v}.kiln")
        rep = out + ".json"
        t0 = time.monotonic()
        rc, _, err = run(base + ["-o", out, "--report", rep] + extra, args.timeout)
        if rc != 0:
            errors[v] = (err.strip().splitlines() or ["failed"])[-1]
            log(f"  compile {v}: {errors[v]}")
            continue
        log(f"  compiled {v} in {time.monotonic() - t0:.1f} s")
        paths[v] = out
        with open(rep) as f:
            reports[v] = json.load(f)
    if os.path.exists(os.path.join(work, "qdq.onnx")):
        paths["ort_qdq"] = os.path.join(work, "qdq.onnx")
    paths["ort_fp32"] = model
    return paths, reports, errors


def bench_cmd(args, variant, path, batch, spec, iterations):
    common = ["--iterations", str(iterations), "--warmup", str(args.warmup),
              "--threads", str(args.threads)]
    if variant.startswith("kiln"):
        return [args.kiln, "bench", path, "--batch", str(batch), "--json"] + common
    return [NODE, os.path.join(BENCH, "ort_bench.js"), path, "--batch", str(batch),
            "--spec", json.dumps(spec)] + common


def timing(args, paths, batch, spec):
    from compare import last_json
    """Interleaved rounds: {variant: [median_ms per round]}, errors."""
    present = [v for v in VARIANTS if v in paths]
    res = {v: [] for v in present}
    errors = {}
    for r in range(args.rounds):
        order = present[r % len(present):] + present[:r % len(present)]
        for v in order:
            if v in errors:
                continue
            rc, out, err = run(bench_cmd(args, v, paths[v], batch, spec, args.iterations),
                               args.timeout)
            if rc != 0:
                errors[v] = (err.strip().splitlines() or ["failed"])[-1]
                log(f"  {v}: {errors[v]}")
                continue
            ms = last_json(out)["median_ms"]  # compare.py's (multi-line JSON)
            res[v].append(ms)
            log(f"  batch {batch} round {r + 1} {v:10s} median {ms:.3f} ms")
    return {v: statistics.median(x) for v, x in res.items() if x}, errors


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def write_markdown(args, records, started, path):
    cmd = "/usr/bin/python3 bench/compress/run.py" + (
        " " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "")
    lines = [f"## Compression ({started:%Y-%m-%d})", "",
             f"Command: `{cmd}` ({args.rounds} interleaved rounds, {args.threads} threads, "
             f"medians of per-process medians, ms).", "",
             "| model | batch | " + " | ".join(LABEL[v] for v in VARIANTS) +
             " | int8 / ORT fp32 | int8 / ORT QDQ | static int8 / ORT fp32 | static int8 / ORT QDQ"
             " | bf16 / Kiln fp32 |",
             "|---|---:|" + "---:|" * (len(VARIANTS) + 5)]
    for rec in records:
        for b, med in rec["timing"].items():
            def ratio(num, den):
                return med[den] / med[num] if num in med and den in med else None
            lines.append(f"| {rec['model']} | {b} | " +
                         " | ".join(fmt(med.get(v), 3) for v in VARIANTS) +
                         f" | {fmt(ratio('kiln_int8', 'ort_fp32'))}x"
                         f" | {fmt(ratio('kiln_int8', 'ort_qdq'))}x"
                         f" | {fmt(ratio('kiln_int8_static', 'ort_fp32'))}x"
                         f" | {fmt(ratio('kiln_int8_static', 'ort_qdq'))}x"
                         f" | {fmt(ratio('kiln_bf16', 'kiln_fp32'))}x |")
    lines += ["", "The size target compares the int8 file a user would deploy (static int8 for CNNs, "
              "dynamic for transformers, as the issue's speed targets) with the fp32 model as the "
              "user has it, the source ONNX file (compression-reference's anchor: 418 MB fp32 "
              "ONNX to 105 MB int8). An fp32 .kiln is larger than its source: it also stores the "
              "weights packed for the kernels of each saved batch size.", "",
              "| model | source ONNX MB | fp32 .kiln MB | bf16 .kiln MB | dynamic int8 .kiln MB | "
              "static int8 .kiln MB | QDQ ONNX MB | int8 / source | top-1 agreement bf16 / int8 "
              "| SQNR dB bf16 / int8 |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for rec in records:
        s = rec["sizes"]
        mb = {k: (v / 1e6 if v else None) for k, v in s.items()}
        iv = int8_variant(rec["model"])
        r = s[iv] / s["source"] if s.get(iv) and s.get("source") else None
        acc = rec["accuracy"]

        def pair(key):
            return " / ".join(fmt(acc.get(v, {}).get(key), 4 if key == "top1" else 1)
                              for v in ("kiln_bf16", iv))
        lines.append(f"| {rec['model']} | {fmt(mb.get('source'), 1)} | {fmt(mb.get('kiln_fp32'), 1)}"
                     f" | {fmt(mb.get('kiln_bf16'), 1)} | {fmt(mb.get('kiln_int8'), 1)}"
                     f" | {fmt(mb.get('kiln_int8_static'), 1)}"
                     f" | {fmt(mb.get('ort_qdq'), 1)} | {fmt(r, 3)}x ({'static' if iv.endswith('static') else 'dynamic'}) | {pair('top1')}"
                     f" | {pair('sqnr')} |")
    pruned = [(rec, v) for rec in records for v in ("kiln_sparse_fp32", "kiln_sparse_int8")
              if v in rec["accuracy"]]
    if pruned:
        lines += ["", f"Pruned (one shot, {args.prune:.0%} of each product's weight by magnitude, "
                  f"blocks of {args.prune_block}); agreement with the unpruned fp32 model:", "",
                  "| model | variant | .kiln MB | top-1 agreement | SQNR dB |", "|---|---|---:|---:|---:|"]
        for rec, v in pruned:
            a = rec["accuracy"][v]
            mb = rec["sizes"].get(v)
            lines.append(f"| {rec['model']} | {LABEL[v]} | {fmt(mb / 1e6 if mb else None, 1)} | "
                         f"{fmt(a.get('top1'), 4)} | {fmt(a.get('sqnr'), 1)} |")
    lines += ["", "Targets (met / missed, at the best batch measured):", ""]
    for model, num, den, want in SPEED_TARGETS:
        rec = next((x for x in records if x["model"] == model), None)
        if not rec:
            continue
        got = [t[den] / t[num] for t in rec["timing"].values() if num in t and den in t]
        if not got:
            lines.append(f"- {model} {LABEL[num]} vs {LABEL[den]} >= {want}x: not measured")
            continue
        best = max(got)
        lines.append(f"- {model} {LABEL[num]} vs {LABEL[den]} >= {want}x: "
                     f"{'met' if best >= want else 'MISSED'} ({best:.2f}x; per batch "
                     + ", ".join(f"{g:.2f}x" for g in got) + ")")
    for rec in records:
        s = rec["sizes"]
        iv = int8_variant(rec["model"])
        if s.get(iv) and s.get("source"):
            r = s[iv] / s["source"]
            lines.append(f"- {rec['model']} {LABEL[iv]} .kiln <= {INT8_SIZE_TARGET}x the source "
                         f"ONNX: {'met' if r <= INT8_SIZE_TARGET else 'MISSED'} ({r:.3f}x)")
    errs = [f"- {rec['model']}: {k}: {v}" for rec in records for k, v in rec["errors"].items()]
    if errs:
        lines += ["", "Errors:", ""] + errs
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet50,mobilenet_v2,efficientnet_b0,bert_base")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=30, help="timed runs per process")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cal-samples", type=int, default=64)
    ap.add_argument("--eval-samples", type=int, default=64)
    ap.add_argument("--compile-runs", type=int, default=3, help="kiln compile --runs")
    ap.add_argument("--kiln", default=os.path.join(REPO, "build", "kiln"))
    ap.add_argument("--models-dir", default=os.path.join(BENCH, "models"))
    ap.add_argument("--work", default=os.path.join(os.path.expanduser("~"), ".cache", "kiln",
                                                   "compress-bench"))
    ap.add_argument("--out", default=os.path.join(HERE, "results.md"))
    ap.add_argument("--json-out", default=os.path.join(HERE, "results.json"))
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--prune", type=float, default=0.9,
                    help="transformers: also compile pruned to this share (0: not)")
    ap.add_argument("--prune-block", type=int, default=1, choices=(1, 4))
    ap.add_argument("--skip", default="", help="variants not to compile, e.g. kiln_bf16")
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(BENCH, "node_modules", "onnxruntime-node")):
        sys.exit("onnxruntime-node is missing: (cd bench && npm ci --ignore-scripts), "
                 "or run bench/run.sh once")
    from compare import input_spec, signature  # bench/compare.py's helpers
    started = datetime.datetime.now(datetime.timezone.utc)
    records = []
    for name in args.models.split(","):
        log(f"{name}")
        model = ensure_model(args, name)
        work = os.path.join(args.work, name)
        os.makedirs(work, exist_ok=True)
        cal = make_data(name, os.path.join(work, "cal"), args.cal_samples, 1)
        ev = make_data(name, os.path.join(work, "eval"), args.eval_samples, 2)
        paths, reports, errors = compile_variants(args, name, model, work, cal, ev)
        inputs, _ = signature(args.kiln, model)
        timings = {}
        for b in [int(x) for x in args.batches.split(",")]:
            med, errs = timing(args, paths, b, input_spec(inputs, b))
            timings[b] = med
            errors.update({f"{k} (batch {b})": v for k, v in errs.items()})
        sizes = {"source": os.path.getsize(model)}
        sizes.update({v: os.path.getsize(p) for v, p in paths.items() if v != "ort_fp32"})
        accuracy = {}
        for v, rep in reports.items():
            o = (rep.get("outputs") or [{}])[0]
            accuracy[v] = {"top1": o.get("top1_agreement"), "sqnr": o.get("sqnr_db")}
        records.append({"model": name, "timing": timings, "sizes": sizes, "accuracy": accuracy,
                        "errors": errors, "reports": reports})
    text = write_markdown(args, records, started, args.out)
    with open(args.json_out, "w") as f:
        json.dump({"started": started.isoformat(), "argv": sys.argv[1:], "records": records}, f,
                  indent=1, default=str)
    print(text)


if __name__ == "__main__":
    main()
