#!/usr/bin/python3
"""python_overhead.py - per-call time of a tiny model: Kiln's Python API
against ONNX Runtime (onnxruntime-node) and PyTorch.

What is measured: the wall time of one call that runs a model on a batch
of 1, from the host language, on a model so small that the call's own
overhead (argument conversion, dispatch, output allocation) is most of it:

    identity     Identity over float32 [batch,64]: the call and nothing else
    tabular_mlp  the tabular MLP of tools/export_models.py (64 -> 256 -> 256
                 -> 1 with BatchNorm and ReLU), exported with
                 torch.onnx.export; the same torch module is PyTorch's side

Kiln: kiln.InferenceSession(...).run(None, {name: x}) (python/kiln; built into
build/python when `import kiln` fails). ONNX Runtime: bench/ort_overhead.js,
`await session.run(feeds)` in Node (bench/node_modules; skipped when
missing). PyTorch: module(torch.from_numpy(x)) under torch.inference_mode().
All with one intra-op thread (--threads), warmed up, each call timed alone;
medians reported. A run also checks that Kiln's MLP output matches PyTorch's.

Usage: /usr/bin/python3 bench/python_overhead.py [--iterations N] [--threads T]
           [--batch B] [--models identity,tabular_mlp] [--json FILE]
This is a smoke benchmark, not part of `make test` or bench/run.sh; figures
from a shared or busy machine are indicative only.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def import_kiln():
    try:
        import kiln
        return kiln
    except ImportError:
        pass
    build = Path(os.environ.get("KILN_BUILD_DIR") or REPO / "build").resolve()
    out = build / "python"
    subprocess.run([sys.executable, str(REPO / "python" / "setup.py"), "-q", "build",
                    "--build-lib", str(out), "--build-temp", str(build / "python-tmp")],
                   cwd=REPO, check=True, env=dict(os.environ, KILN_BUILD_DIR=str(build)))
    sys.path.insert(0, str(out))
    import kiln
    return kiln


def stats_us(times):
    times = sorted(times)
    return {"median_us": statistics.median(times), "p90_us": times[int(0.9 * (len(times) - 1))],
            "min_us": times[0], "mean_us": statistics.fmean(times), "iterations": len(times)}


def time_calls(fn, iterations, warmup):
    for _ in range(warmup):
        fn()
    out = []
    clock = time.perf_counter_ns
    for _ in range(iterations):
        t0 = clock()
        fn()
        out.append((clock() - t0) / 1000.0)
    return stats_us(out)


def make_models(tmp, torch, names):
    """name -> (onnx path, input name, torch module)."""
    models = {}
    if "identity" in names:
        import onnx
        from onnx import TensorProto, helper
        g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = 7
        path = os.path.join(tmp, "identity.onnx")
        onnx.save(m, path)
        models["identity"] = (path, "x", torch.nn.Identity().eval())
    if "tabular_mlp" in names:
        sys.path.insert(0, str(REPO / "tools"))
        from export_models import TabularMLP
        torch.manual_seed(0)
        net = TabularMLP()
        with torch.no_grad():  # non-trivial BatchNorm statistics
            for mod in net.modules():
                if isinstance(mod, torch.nn.BatchNorm1d):
                    mod.running_mean.uniform_(-0.5, 0.5)
                    mod.running_var.uniform_(0.5, 2.0)
        net.eval()
        path = os.path.join(tmp, "tabular_mlp.onnx")
        torch.onnx.export(net, torch.randn(2, 64), path, input_names=["features"],
                          output_names=["score"], opset_version=14,
                          dynamic_axes={"features": {0: "batch"}, "score": {0: "batch"}})
        models["tabular_mlp"] = (path, "features", net)
    return models


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--models", default="identity,tabular_mlp")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()

    import torch
    torch.set_num_threads(a.threads)
    kiln = import_kiln()
    node = shutil.which("node")
    have_ort = node and (REPO / "bench" / "node_modules" / "onnxruntime-node").is_dir()
    names = a.models.split(",")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, inp, net) in make_models(tmp, torch, names).items():
            x = np.random.default_rng(0).uniform(-1, 1, (a.batch, 64)).astype(np.float32)
            so = kiln.SessionOptions()
            so.intra_op_num_threads = a.threads
            sess = kiln.InferenceSession(path, so)
            feed = {inp: x}
            with torch.inference_mode():
                want = net(torch.from_numpy(x)).numpy()
            np.testing.assert_allclose(sess.run(None, feed)[0], want, rtol=1e-4, atol=1e-5)
            r = {"kiln": time_calls(lambda: sess.run(None, feed), a.iterations, a.warmup)}
            xt = torch.from_numpy(x)

            def torch_call():
                with torch.inference_mode():
                    return net(xt)
            r["pytorch"] = time_calls(torch_call, a.iterations, a.warmup)
            if have_ort:
                p = subprocess.run([node, str(REPO / "bench" / "ort_overhead.js"), path,
                                    "--input", inp, "--shape", f"{a.batch},64",
                                    "--iterations", str(a.iterations), "--warmup", str(a.warmup),
                                    "--threads", str(a.threads)],
                                   capture_output=True, text=True, timeout=600)
                if p.returncode == 0:
                    r["onnxruntime-node"] = json.loads(p.stdout)
                else:
                    print(f"python_overhead: ort_overhead.js failed: {p.stderr.strip()}",
                          file=sys.stderr)
            results[name] = r

    print(f"per-call time, batch {a.batch}, {a.threads} thread(s), {a.iterations} calls "
          f"(median / p90 / min, microseconds)")
    print("| model | Kiln (Python) | ONNX Runtime (Node) | PyTorch (Python) |")
    print("|---|---|---|---|")
    for name, r in results.items():
        cell = (lambda k: "%.1f / %.1f / %.1f" % (r[k]["median_us"], r[k]["p90_us"], r[k]["min_us"])
                if k in r else "n/a")
        print(f"| {name} | {cell('kiln')} | {cell('onnxruntime-node')} | {cell('pytorch')} |")
    if not have_ort:
        print("(onnxruntime-node not installed: run `npm ci --ignore-scripts` in bench/)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"batch": a.batch, "threads": a.threads, "results": results,
                       "kiln_version": kiln.__version__, "torch_version": torch.__version__}, f,
                      indent=1)


if __name__ == "__main__":
    main()
