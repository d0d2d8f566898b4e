#!/usr/bin/python3
"""bench/zoo/compare.py - Kiln against ONNX Runtime and PyTorch on the model zoo.

The zoo is tools/export_zoo.py's (cached in $KILN_ZOO_DIR, default
~/.cache/kiln/zoo; bench/zoo/run.sh exports it when missing). For each model
this reuses bench/compare.py's machinery unchanged: the agreement check of
the three runtimes on the exporter's batch-2 inputs, the interleaved timing
rounds at batch 1 and --batch (one process per runtime per round, rotating
order, median over rounds) and one `kiln bench --profile` run. It prints a
Markdown report: per model and batch the median latencies and the ratios
Kiln / ONNX Runtime and Kiln / PyTorch, the geometric mean of Kiln / ONNX
Runtime per batch, and for the five models with the worst ratio Kiln's top
ops by time from the profile, and each model's reference share (the profile's share of
the run on reference kernels). The raw records go to --json-out when given.

It writes nothing into bench/RESULTS.md (that page is the eight benchmark
models'); --out names a Markdown file to write besides printing.

Usage:
    /usr/bin/python3 bench/zoo/compare.py [--models a,b,...] [--batch 8] [--rounds R]
        [--kiln build/kiln] [--zoo-dir DIR] [--out FILE] [--json-out FILE] [--quick]
"""

import argparse
import importlib.util
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
REPO = os.path.dirname(BENCH)


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bc = load("kiln_bench_compare", os.path.join(BENCH, "compare.py"))


def zoo_names():
    """The zoo's model names in order (export_zoo.py --list, without torch)."""
    names, inside = [], False
    with open(os.path.join(REPO, "tools", "export_zoo.py")) as f:
        for line in f:
            if line.startswith("ZOO = "):
                inside = True
            elif inside and line.startswith("])"):
                break
            elif inside and line.strip().startswith('("'):
                names.append(line.strip().split('"')[1])
    return names


def measure(args, name):
    """One model: bench/compare.py's agreement, timing and profile; a record dict."""
    model_dir = os.path.join(args.zoo_dir, name)
    rec = {"model": name, "batches": [], "agreement": None}
    inputs, outputs = bc.signature(args.kiln, os.path.join(model_dir, "model.onnx"))
    torch_file = os.path.join(model_dir, "torch_model.pt")
    if (not os.path.isfile(torch_file) or os.path.getmtime(torch_file)
            < os.path.getmtime(os.path.join(model_dir, "model.onnx"))):
        bc.log(f"{name}: saving PyTorch's module")
        rc, _, err = bc.run([bc.PYTHON, os.path.join(BENCH, "torch_bench.py"), "prepare",
                             model_dir], args.timeout)
        if rc != 0:
            raise RuntimeError(f"torch_bench.py prepare failed: {err.strip()[-300:]}")
    rec["agreement"] = bc.agreement(args, name, model_dir, inputs, outputs)
    bc.log(f"{name}: agreement {rec['agreement']}")
    for batch in (1, args.batch):
        spec = bc.input_spec(inputs, batch)
        per_round, errors = bc.timing(args, model_dir, batch, spec)
        summary = {rt: bc.summarize(per_round[rt]) for rt in bc.RUNTIMES}
        profile = (bc.kiln_profile(args, model_dir, batch, summary["kiln"]["median_ms"])
                   if summary.get("kiln") else None)
        rec["batches"].append({"batch": batch, "errors": errors, "summary": summary,
                               "profile": profile})
    return rec


def median(rec, batch, rt):
    for b in rec["batches"]:
        if b["batch"] == batch and b["summary"].get(rt):
            return b["summary"][rt]["median_ms"]
    return None


def report(args, records):
    """The Markdown report."""
    L = ["# Kiln's model zoo: Kiln, ONNX Runtime, PyTorch", "",
         f"Threads {args.threads}; rounds {args.rounds}; median latency in ms over rounds; "
         "ratio = Kiln / peer (below 1: Kiln faster).", "",
         "| model | agree | batch | Kiln | ONNX Runtime | PyTorch | Kiln/ORT | Kiln/PyTorch | "
         "ref share |",
         "|---|---|---|---|---|---|---|---|---|"]
    worst = {}
    for rec in records:
        if rec.get("error"):
            L.append(f"| {rec['model']} | error: {rec['error'][:120]} | | | | | | | |")
            continue
        ag = rec["agreement"]
        agree = "yes" if ag and ag["ok"] else "NO " + json.dumps(
            {"errors": ag["errors"], "pairs": {k: f"{v:.2g}" for k, v in ag["pairs"].items()}})
        for b in rec["batches"]:
            k, o, p = (median(rec, b["batch"], rt) for rt in bc.RUNTIMES)
            share = (b.get("profile") or {}).get("reference_share")
            share_s = "-" if share is None else f"{100 * share:.2f}%"
            L.append(f"| {rec['model']} | {agree} | {b['batch']} | {bc.fmt_ms(k)} | "
                     f"{bc.fmt_ms(o)} | {bc.fmt_ms(p)} | {bc.fmt_ratio(k, o)} | "
                     f"{bc.fmt_ratio(k, p)} | {share_s} |")
            if k and o:
                worst[rec["model"]] = max(worst.get(rec["model"], 0.0), k / o)
    L.append("")
    for batch in (1, args.batch):
        ratios = [median(r, batch, "kiln") / median(r, batch, "onnxruntime") for r in records
                  if not r.get("error") and median(r, batch, "kiln")
                  and median(r, batch, "onnxruntime")]
        if ratios:
            g = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            L.append(f"- batch {batch}: geometric mean Kiln/ORT {g:.2f} over {len(ratios)} "
                     f"models; above 1.0: {sum(x > 1.0 for x in ratios)}")
        shares = [b["profile"]["reference_share"] for r in records if not r.get("error")
                  for b in r["batches"] if b["batch"] == batch and b.get("profile")
                  and b["profile"].get("reference_share") is not None]
        if shares:
            L.append(f"- batch {batch}: reference share (Kiln's time on reference kernels) at "
                     f"most {100 * max(shares):.2f}% over {len(shares)} models")
    L += ["", "## Kiln's top ops on the five worst models (batch 1 profile)", ""]
    for name in sorted(worst, key=worst.get, reverse=True)[:5]:
        rec = next(r for r in records if r["model"] == name)
        prof = rec["batches"][0]["profile"]
        L.append(f"**{name}** (worst Kiln/ORT {worst[name]:.2f})")
        L.append("")
        if not prof or not prof["ops"]:
            L.append("(no profile)")
        else:
            L.append("| op | kernel | nodes | ms | share | GFLOP/s | % of peak |")
            L.append("|---|---|---|---|---|---|---|")
            for op in sorted(prof["ops"], key=lambda o: -o["ms"])[:args.top_ops]:
                dash = {k: ("-" if op[k] is None else op[k]) for k in ("share", "gflops", "peak_pct")}
                L.append(f"| {op['op']} | {op['kernel']} | {op['nodes']} | {op['ms']:.3f} | "
                         f"{dash['share']} | {dash['gflops']} | {dash['peak_pct']} |")
        L.append("")
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", help="comma-separated (default: the whole zoo)")
    ap.add_argument("--zoo-dir", default=os.environ.get("KILN_ZOO_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "kiln", "zoo"))
    ap.add_argument("--kiln", default=os.path.join(REPO, "build", "kiln"))
    ap.add_argument("--batch", type=int, default=8, help="the larger batch (default 8)")
    ap.add_argument("--quick", action="store_true", help="2 rounds, few runs: a smoke run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--min-iterations", type=int)
    ap.add_argument("--max-iterations", type=int)
    ap.add_argument("--target-s", type=float)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per process")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--top-ops", type=int, default=6)
    ap.add_argument("--out", help="also write the report here")
    ap.add_argument("--json-out", help="write the raw records here")
    args = ap.parse_args()
    defaults = (2, 1, 3, 50, 1.0) if args.quick else (3, 2, 5, 1000, 4.0)
    for attr, d in zip(("rounds", "warmup", "min_iterations", "max_iterations", "target_s"),
                       defaults):
        if getattr(args, attr) is None:
            setattr(args, attr, d)
    args.kiln = os.path.abspath(args.kiln)
    names = [n for n in (args.models or ",".join(zoo_names())).split(",") if n]
    missing = [n for n in names if not os.path.isfile(os.path.join(args.zoo_dir, n, "model.onnx"))]
    if missing:
        sys.exit(f"zoo compare: not exported in {args.zoo_dir}: {', '.join(missing)} "
                 f"(run bench/zoo/run.sh or tools/export_zoo.py)")
    t0 = time.monotonic()
    records = []
    for name in names:
        try:
            records.append(measure(args, name))
        except (RuntimeError, OSError, ValueError) as e:
            records.append({"model": name, "error": str(e)})
            bc.log(f"{name}: {e}")
    text = report(args, records)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(records, f, indent=1, default=str)
    bc.log(f"{len(names)} models in {time.monotonic() - t0:.0f}s")


if __name__ == "__main__":
    main()
