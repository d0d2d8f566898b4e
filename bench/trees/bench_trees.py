#!/usr/bin/env python3
"""bench_trees.py - gradient-boosted trees: Kiln against XGBoost's own predict
and against ONNX Runtime on the ONNX-ML export of the same model.

The model is trained here with a fixed seed by Debian's python3-xgboost on
synthetic data (regression, --trees trees of depth --depth over --features
features, 5% of the inputs missing), saved with save_model (model.json), and
written as an ai.onnx.ml TreeEnsembleRegressor (model.onnx: BRANCH_LT
splits, missing_value_tracks_true from default_left, base_values from
base_score), which is how onnxmltools converts XGBoost models. Before timing,
Kiln (on model.json), XGBoost and ONNX Runtime (on model.onnx) are run on the
same 256 rows and must agree to 1e-4 relative: a benchmark of wrong answers
would mean nothing.

Timing, per batch size (default 1 and 1024), --threads threads, on random
rows uniform in [-1, 1) for all three (kiln bench's scheme; no missing
values at timing):
  - Kiln:  `kiln bench model.json --batch B --json` (its median);
  - XGBoost: booster.inplace_predict on a float32 array (in this process),
           nthread --threads;
  - ONNX Runtime: `node bench/ort_bench.js model.onnx --spec ... --batch B`
           (onnxruntime-node from bench/node_modules; bench/run.sh installs it).
A short calibration first sets the runs of each (tool, batch) measurement so
that it lasts at least --min-seconds (default 2) and has at least --min-runs
runs (default 200), after --warmup runs. Then --rounds rounds (default 5):
in each, every tool is measured once per batch, the tools' order rotated
from round to round, so that a busy spell on the machine hits all of them.
Reported: per tool the median of the rounds' medians and their range
(min-max), and per ratio (other / Kiln) the ratio of those medians and the
range of the per-round ratios; and the fastest single run of each (on a
loaded machine the least disturbed figure). OUT/results.json keeps every
round's figure.
Usage (from the repository root):

    /usr/bin/python3 bench/trees/bench_trees.py [--trees 500] [--depth 7]
        [--features 32] [--batches 1,1024] [--threads 2] [--rounds 5]
        [--min-runs 200] [--min-seconds 2] [--out bench/models/trees]
        [--kiln build/kiln] [--quick]

--quick (the smoke run): 50 trees, 2 rounds, 20 runs or 0.2 s a measurement.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def train(args):
    import xgboost as xgb
    rng = np.random.RandomState(0)
    n = 10000
    X = rng.randn(n, args.features).astype(np.float32)
    w = rng.randn(args.features)
    y = X @ w + np.sin(X[:, 0] * 3) + X[:, 1] * X[:, 2] + 0.1 * rng.randn(n)
    X[rng.rand(*X.shape) < 0.05] = np.nan
    params = {"objective": "reg:squarederror", "max_depth": args.depth, "eta": 0.1, "seed": 0,
              "nthread": os.cpu_count() or 2, "tree_method": "hist"}
    b = xgb.train(params, xgb.DMatrix(X, label=y, missing=np.nan), num_boost_round=args.trees)
    return b, X


def to_onnx(model_json, path):
    """The XGBoost JSON as an ai.onnx.ml TreeEnsembleRegressor."""
    import onnx
    from onnx import TensorProto, helper
    m = json.load(open(model_json))["learner"]
    trees = m["gradient_booster"]["model"]["trees"]
    base = float(m["learner_model_param"]["base_score"].strip("[]"))
    nf = int(m["learner_model_param"]["num_feature"])
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                         "nodes_values", "nodes_truenodeids", "nodes_falsenodeids",
                         "nodes_missing_value_tracks_true", "target_treeids", "target_nodeids",
                         "target_ids", "target_weights")}
    for t, tr in enumerate(trees):
        for i, (l, r) in enumerate(zip(tr["left_children"], tr["right_children"])):
            leaf = l == -1
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(i)
            a["nodes_featureids"].append(0 if leaf else tr["split_indices"][i])
            a["nodes_modes"].append("LEAF" if leaf else "BRANCH_LT")
            a["nodes_values"].append(0.0 if leaf else tr["split_conditions"][i])
            a["nodes_truenodeids"].append(0 if leaf else l)
            a["nodes_falsenodeids"].append(0 if leaf else r)
            a["nodes_missing_value_tracks_true"].append(0 if leaf else int(tr["default_left"][i]))
            if leaf:
                a["target_treeids"].append(t)
                a["target_nodeids"].append(i)
                a["target_ids"].append(0)
                a["target_weights"].append(tr["split_conditions"][i])
    node = helper.make_node("TreeEnsembleRegressor", ["features"], ["predictions"], domain="ai.onnx.ml",
                            n_targets=1, aggregate_function="SUM", base_values=[base], **a)
    g = helper.make_graph([node], "xgboost_gbm",
                          [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", nf])],
                          [helper.make_tensor_value_info("predictions", TensorProto.FLOAT, ["N", 1])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.save(model, path)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"bench_trees: {' '.join(cmd)} failed:\n{r.stderr}")
    return r.stdout


def last_json(text):
    start = text.rfind("\n{")
    return json.loads(text[start + 1 if start >= 0 else text.find("{"):])


def check(args, booster, X):
    """Kiln, XGBoost and ONNX Runtime agree on 256 rows."""
    import xgboost as xgb
    d = os.path.join(args.out, "check")
    os.makedirs(os.path.join(d, "in"), exist_ok=True)
    rows = np.ascontiguousarray(X[:256])
    np.save(os.path.join(d, "in", "features.npy"), rows)
    want = booster.predict(xgb.DMatrix(rows, missing=np.nan))
    run([args.kiln, "predict", os.path.join(args.out, "model.json"), "--input",
         f"features={os.path.join(d, 'in', 'features.npy')}", "--output-dir", os.path.join(d, "kiln")])
    got = np.load(os.path.join(d, "kiln", "predictions.npy")).reshape(-1)
    tol = 1e-4 * max(1.0, float(np.abs(want).max()))
    if np.abs(got - want).max() > tol:
        sys.exit(f"bench_trees: Kiln differs from XGBoost by {np.abs(got - want).max()}")
    if args.ort:
        run(["node", os.path.join(REPO, "bench", "ort_bench.js"), os.path.join(args.out, "model.onnx"),
             "--check", os.path.join(d, "in"), "--out", os.path.join(d, "ort")])
        ort = np.load(os.path.join(d, "ort", "predictions.npy")).reshape(-1)
        if np.abs(ort - want).max() > tol:
            sys.exit(f"bench_trees: ONNX Runtime differs from XGBoost by {np.abs(ort - want).max()}")


def time_xgboost(args, booster, batch, iterations):
    """(median, min) ms of `iterations` inplace_predict calls on random rows (uniform
    in [-1, 1), as kiln bench and ort_bench.js make them), after warmup."""
    booster.set_param({"nthread": args.threads})
    rows = np.random.RandomState(1).uniform(-1, 1, (batch, args.features)).astype(np.float32)
    for _ in range(args.warmup + 1):
        booster.inplace_predict(rows, missing=np.nan)
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        booster.inplace_predict(rows, missing=np.nan)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), min(times)


def measure(args, tool, booster, batch, iterations):
    """(median, min) ms of one measurement (one process for Kiln and ONNX Runtime)."""
    common = ["--threads", str(args.threads), "--iterations", str(iterations), "--warmup", str(args.warmup)]
    if tool == "kiln":
        r = last_json(run([args.kiln, "bench", os.path.join(args.out, "model.json"), "--batch", str(batch),
                           "--json", *common]))
        return r["median_ms"], r["min_ms"]
    if tool == "xgboost":
        return time_xgboost(args, booster, batch, iterations)
    spec = json.dumps([{"name": "features", "dtype": "float32", "shape": [batch, args.features]}])
    r = last_json(run(["node", os.path.join(REPO, "bench", "ort_bench.js"), os.path.join(args.out, "model.onnx"),
                       "--spec", spec, "--batch", str(batch), *common]))
    return r["median_ms"], r["min_ms"]


def spread(values):
    """(median, min, max) of a list."""
    return statistics.median(values), min(values), max(values)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", type=int, default=500)
    ap.add_argument("--depth", type=int, default=7)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--batches", default="1,1024")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-runs", type=int, default=200)
    ap.add_argument("--min-seconds", type=float, default=2.0)
    ap.add_argument("--max-runs", type=int, default=200000)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "models", "trees"))
    ap.add_argument("--kiln", default=os.environ.get("KILN_BIN", os.path.join(REPO, "build", "kiln")))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.trees, args.rounds, args.min_runs, args.min_seconds = 50, 2, 20, 0.2
    os.makedirs(args.out, exist_ok=True)
    args.ort = os.path.isdir(os.path.join(REPO, "bench", "node_modules", "onnxruntime-node"))
    if not args.ort:
        print("bench_trees: onnxruntime-node is not installed (bench/run.sh installs it); "
              "ONNX Runtime is left out", file=sys.stderr)
    booster, X = train(args)
    booster.save_model(os.path.join(args.out, "model.json"))
    to_onnx(os.path.join(args.out, "model.json"), os.path.join(args.out, "model.onnx"))
    check(args, booster, X)
    tools = ["kiln", "xgboost"] + (["ort"] if args.ort else [])
    batches = [int(b) for b in args.batches.split(",")]
    # calibration: runs per measurement so that each lasts --min-seconds (at least --min-runs)
    iters = {}
    for batch in batches:
        for tool in tools:
            est = measure(args, tool, booster, batch, 20)[0]
            iters[(tool, batch)] = int(min(args.max_runs, max(args.min_runs,
                                                              args.min_seconds * 1000 / max(est, 1e-6))))
    # rounds: every tool measured once per batch per round, the order rotated between rounds
    samples = {(tool, batch): [] for tool in tools for batch in batches}
    best = {(tool, batch): [] for tool in tools for batch in batches}
    for r in range(args.rounds):
        for batch in batches:
            order = tools[r % len(tools):] + tools[:r % len(tools)]
            for tool in order:
                med, fastest = measure(args, tool, booster, batch, iters[(tool, batch)])
                samples[(tool, batch)].append(med)
                best[(tool, batch)].append(fastest)
        print(f"bench_trees: round {r + 1}/{args.rounds} done", file=sys.stderr)
    results = []
    for batch in batches:
        res = {"batch": batch, "rounds": args.rounds}
        for tool in tools:
            med, lo, hi = spread(samples[(tool, batch)])
            res[f"{tool}_ms"] = med
            res[f"{tool}_ms_min"], res[f"{tool}_ms_max"] = lo, hi
            res[f"{tool}_runs"] = iters[(tool, batch)]
            res[f"{tool}_samples_ms"] = samples[(tool, batch)]
            res[f"{tool}_best_ms"] = min(best[(tool, batch)])
        for tool in tools[1:]:
            ratios = [o / k for o, k in zip(samples[(tool, batch)], samples[("kiln", batch)])]
            res[f"{tool}_over_kiln"] = res[f"{tool}_ms"] / res["kiln_ms"]
            res[f"{tool}_over_kiln_rounds"] = spread(ratios)
            res[f"{tool}_over_kiln_best"] = res[f"{tool}_best_ms"] / res["kiln_best_ms"]
        results.append(res)
    print(f"trees {args.trees}, depth {args.depth}, features {args.features}, threads {args.threads}, "
          f"{args.rounds} rounds, median of each round's median (runs per measurement in brackets), "
          f"[min-max over rounds], best single run")
    for r in results:
        print(f"batch {r['batch']}:")
        for tool in tools:
            print(f"  {tool:8} {r[tool + '_ms']:9.4f} ms  [{r[tool + '_ms_min']:.4f}-{r[tool + '_ms_max']:.4f}]"
                  f"  best {r[tool + '_best_ms']:.4f}  ({r[tool + '_runs']} runs)")
        for tool in tools[1:]:
            med, lo, hi = r[f"{tool}_over_kiln_rounds"]
            print(f"  {tool}/kiln {r[tool + '_over_kiln']:6.2f}x  (per round {med:.2f}x, {lo:.2f}-{hi:.2f}; "
                  f"best runs {r[tool + '_over_kiln_best']:.2f}x)")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"trees": args.trees, "depth": args.depth, "features": args.features,
                   "threads": args.threads, "rounds": args.rounds, "min_runs": args.min_runs,
                   "min_seconds": args.min_seconds, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
