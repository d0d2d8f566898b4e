#!/usr/bin/env python3
"""Sparse vs dense MatMul: one BERT-base-sized layer, Kiln's kernels.

Builds an ONNX model Y = X @ W + b (W [K, N], default 768 x 3072, the
size of BERT-base's feed-forward input projection) with a given share of
W's entries zero (unstructured, or in 1x4 blocks along K), and times it
with `kiln bench` in fp32 and int8, each once with the sparse kernels
disabled (KILN_SPARSE=off) and once forced (KILN_SPARSE=force), interleaved
over --rounds, reporting medians. Which kernel Kiln picks on its own
(KILN_SPARSE unset: measured per layer at plan compile) is shown by
`--profile`. Use a quiet machine for figures worth quoting.

    python3 bench/compress/sparse.py --kiln build/kiln [--rows 128]
        [--sparsity 0.9] [--blocks] [--rounds 5] [--iterations 50]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_model(path, k, n, sparsity, blocks, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32) * 0.05
    if blocks:
        keep = rng.random((k // 4, n)) >= sparsity
        w *= np.repeat(keep, 4, axis=0)
    else:
        w *= rng.random((k, n)) >= sparsity
    b = rng.standard_normal(n).astype(np.float32) * 0.1
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "sparse_layer", [x], [y],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)
    return float((w == 0).mean())


def bench(kiln, model, rows, precision, mode, iterations, threads):
    env = dict(os.environ)
    env["KILN_SPARSE"] = mode
    cmd = [kiln, "bench", model, "--batch", str(rows), "--precision", precision, "--json",
           "--iterations", str(iterations), "--warmup", "5"]
    if threads:
        cmd += ["--threads", str(threads)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    d = json.loads(out)
    return d["median_ms"], d["min_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--k", type=int, default=768)
    ap.add_argument("--n", type=int, default=3072)
    ap.add_argument("--rows", type=int, default=128, help="rows of X (batch x sequence)")
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--blocks", action="store_true", help="zeros in 1x4 blocks along K")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--precisions", default="fp32,int8")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = os.path.join(d, "layer.onnx")
        zeros = make_model(model, a.k, a.n, a.sparsity, a.blocks)
        print(f"X [{a.rows}, {a.k}] x W [{a.k}, {a.n}], {100 * zeros:.1f}% zeros"
              f" ({'1x4 blocks' if a.blocks else 'unstructured'})")
        for prec in a.precisions.split(","):
            t = {"off": [], "force": []}
            for _ in range(a.rounds):
                for mode in ("off", "force"):
                    t[mode].append(bench(a.kiln, model, a.rows, prec, mode, a.iterations, a.threads))
            for k, label in ((0, "median"), (1, "best")):
                dense = statistics.median(x[k] for x in t["off"])
                sparse = statistics.median(x[k] for x in t["force"])
                print(f"{prec} ({label} run, median over {a.rounds} rounds): dense {dense:.3f} ms, "
                      f"sparse {sparse:.3f} ms, sparse speedup {dense / sparse:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
