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

Timing, per batch size (default 1 and 1024), each tool in its own process,
--threads threads:
  - Kiln:  `kiln bench model.json --batch B --json` (random inputs, median of
           --iterations runs after warmup);
  - XGBoost: booster.inplace_predict on a float32 array, median of the same
           number of runs after warmup, nthread --threads;
  - ONNX Runtime: `node bench/ort_bench.js model.onnx --spec ... --batch B`
           (onnxruntime-node from bench/node_modules; bench/run.sh installs it).
Prints a table of median milliseconds and the ratios, and writes
OUT/results.json. Usage (from the repository root):

    /usr/bin/python3 bench/trees/bench_trees.py [--trees 500] [--depth 7]
        [--features 32] [--batches 1,1024] [--threads 2] [--iterations 20]
        [--out bench/models/trees] [--kiln build/kiln] [--quick]

--quick (the smoke run): 50 trees, 5 iterations.
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


def time_xgboost(args, booster, X, batch):
    import xgboost as xgb  # noqa: F401
    booster.set_param({"nthread": args.threads})
    rows = np.ascontiguousarray(X[:batch] if batch <= len(X) else np.resize(X, (batch, X.shape[1])))
    for _ in range(args.warmup + 1):
        booster.inplace_predict(rows, missing=np.nan)
    times = []
    for _ in range(args.iterations):
        t0 = time.perf_counter()
        booster.inplace_predict(rows, missing=np.nan)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", type=int, default=500)
    ap.add_argument("--depth", type=int, default=7)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--batches", default="1,1024")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "models", "trees"))
    ap.add_argument("--kiln", default=os.environ.get("KILN_BIN", os.path.join(REPO, "build", "kiln")))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.trees, args.iterations = 50, 5
    os.makedirs(args.out, exist_ok=True)
    args.ort = os.path.isdir(os.path.join(REPO, "bench", "node_modules", "onnxruntime-node"))
    if not args.ort:
        print("bench_trees: onnxruntime-node is not installed (bench/run.sh installs it); "
              "ONNX Runtime is left out", file=sys.stderr)
    booster, X = train(args)
    booster.save_model(os.path.join(args.out, "model.json"))
    to_onnx(os.path.join(args.out, "model.json"), os.path.join(args.out, "model.onnx"))
    check(args, booster, X)
    results = []
    for batch in [int(b) for b in args.batches.split(",")]:
        common = ["--threads", str(args.threads), "--iterations", str(args.iterations),
                  "--warmup", str(args.warmup)]
        kiln = last_json(run([args.kiln, "bench", os.path.join(args.out, "model.json"), "--batch",
                              str(batch), "--json", *common]))["median_ms"]
        xgbt = time_xgboost(args, booster, X, batch)
        ort = None
        if args.ort:
            spec = json.dumps([{"name": "features", "dtype": "float32", "shape": [batch, args.features]}])
            ort = last_json(run(["node", os.path.join(REPO, "bench", "ort_bench.js"),
                                 os.path.join(args.out, "model.onnx"), "--spec", spec, "--batch",
                                 str(batch), *common]))["median_ms"]
        results.append({"batch": batch, "kiln_ms": kiln, "xgboost_ms": xgbt, "ort_ms": ort})
    print(f"trees {args.trees}, depth {args.depth}, features {args.features}, threads {args.threads}")
    print(f"{'batch':>6} {'kiln ms':>9} {'xgboost ms':>11} {'ort ms':>9} {'xgb/kiln':>9} {'ort/kiln':>9}")
    for r in results:
        ort = f"{r['ort_ms']:9.3f}" if r["ort_ms"] is not None else f"{'-':>9}"
        ortr = f"{r['ort_ms'] / r['kiln_ms']:9.2f}" if r["ort_ms"] is not None else f"{'-':>9}"
        print(f"{r['batch']:>6} {r['kiln_ms']:9.3f} {r['xgboost_ms']:11.3f} {ort} "
              f"{r['xgboost_ms'] / r['kiln_ms']:9.2f} {ortr}")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"trees": args.trees, "depth": args.depth, "features": args.features,
                   "threads": args.threads, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
