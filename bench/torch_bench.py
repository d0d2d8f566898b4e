#!/usr/bin/python3
"""torch_bench.py - PyTorch's side of Kiln's benchmark: the same measurements
as `kiln bench --json`, with PyTorch running its own nn.Module (not the ONNX
file).

The module is the one tools/export_models.py exported: `prepare` rebuilds it
with the exporter's constructors and seeds, exactly as export_model() does
(torch.manual_seed(seed_for(name)), build(), re-estimate BatchNorm with a
generator seeded seed_for(name) + 1, eval()), and saves it whole with
torch.save as MODEL_DIR/torch_model.pt. compare.py checks that this module's
outputs match the exporter's stored ones, so a rebuild that drifted from the
export would show up as a failed agreement check.

    torch_bench.py prepare MODEL_DIR
    torch_bench.py time MODEL_DIR --spec JSON --batch N [--threads T]
        [--iterations K] [--warmup W] [--seed S] [--int-high H]
    torch_bench.py check MODEL_DIR --spec JSON --outputs NAME,... --inputs DIR --out DIR

MODEL_DIR is bench/models/<name> (or a zoo folder of tools/export_zoo.py); its last
component names the model.
Threads: torch.set_num_threads(T) (default 2), one inter-op thread; runs are
under torch.inference_mode().

Timing: load_ms is torch.load of the whole module plus eval() (what loading
a saved PyTorch model costs; the module classes come from
tools/export_models.py and torchvision), first_inference_ms the first call,
then W warmup calls and K recorded calls. Inputs are random by kiln bench's
scheme (src/cli/cmd_bench.c): floats uniform in [-1, 1), integers uniform in
[0, H) (default 100) except inputs whose name contains "mask" (all 1),
bools 0 or 1; numpy's generator, so the values differ from Kiln's and ONNX
Runtime's but not their distribution. Prints one JSON object with kiln
bench's keys plus base_rss_mb (RSS after importing torch, before loading).
"""

import argparse
import json
import os
import resource
import sys
import time

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
import export_models as em  # noqa: E402  (module classes are pickled as export_models.X)

TORCH_FILE = "torch_model.pt"


def proc_status_mb(field):
    """A kB field of /proc/self/status in MiB, or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def current_rss_mb():
    return proc_status_mb("VmRSS") or 0.0


def peak_rss_mb():
    """VmHWM (not carried across exec, unlike ru_maxrss; see peak_rss_mb in
    src/cli/cmd_bench.c), else ru_maxrss."""
    hwm = proc_status_mb("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


BASE_RSS_MB = current_rss_mb()

DTYPES = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32,
          "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}


def prepare(model_dir):
    """Rebuild the exported module exactly as export_model() does and save it."""
    name = os.path.basename(os.path.normpath(model_dir))
    if name in em.MODELS:
        build, make_inputs, _ = em.MODELS[name]()
    else:  # a zoo model (bench/zoo/): its classes are pickled as export_zoo.X
        import export_zoo
        if name not in export_zoo.ZOO:
            raise SystemExit(f"torch_bench: unknown model '{name}'")
        build, make_inputs, _ = export_zoo.ZOO[name]()
    torch.manual_seed(em.seed_for(name))
    gen = torch.Generator().manual_seed(em.seed_for(name) + 1)
    model = build()
    em.reestimate_batchnorm(model, make_inputs, gen)
    model.eval()
    path = os.path.join(model_dir, TORCH_FILE)
    torch.save(model, path + ".tmp")
    os.replace(path + ".tmp", path)
    print(json.dumps({"runtime": "pytorch", "prepared": path}))


def random_inputs(spec, seed, int_high):
    """One tensor per spec entry, by kiln bench's scheme."""
    rng = np.random.default_rng(seed)
    out = []
    for s in spec:
        shape, dt = tuple(s["shape"]), s["dtype"]
        if dt not in DTYPES:
            raise SystemExit(f"torch_bench: input '{s['name']}': dtype {dt} is not supported here")
        if dt.startswith("float"):
            a = rng.uniform(-1.0, 1.0, shape).astype(DTYPES[dt])
        elif dt == "bool":
            a = rng.integers(0, 2, shape).astype(np.bool_)
        elif "mask" in s["name"].lower():
            a = np.ones(shape, DTYPES[dt])
        else:
            a = rng.integers(0, int_high, shape).astype(DTYPES[dt])
        out.append(torch.from_numpy(a))
    return out


def load(model_dir):
    return torch.load(os.path.join(model_dir, TORCH_FILE)).eval()


def ms_since(t0):
    return (time.perf_counter() - t0) * 1e3


def time_model(args):
    spec = json.loads(args.spec)
    inputs = random_inputs(spec, args.seed, args.int_high)
    t0 = time.perf_counter()
    model = load(args.model_dir)
    load_ms = ms_since(t0)
    with torch.inference_mode():
        t0 = time.perf_counter()
        model(*inputs)
        first_ms = ms_since(t0)
        for _ in range(args.warmup):
            model(*inputs)
        lat = []
        for _ in range(args.iterations):
            t0 = time.perf_counter()
            model(*inputs)
            lat.append(ms_since(t0))
    lat = np.array(lat)
    median = float(np.percentile(lat, 50))
    print(json.dumps({
        "runtime": "pytorch", "version": torch.__version__, "model": args.model_dir,
        "batch": args.batch, "threads": args.threads, "iterations": args.iterations,
        "warmup": args.warmup, "inputs": spec,
        "load_ms": load_ms, "first_inference_ms": first_ms,
        "load_to_first_inference_ms": load_ms + first_ms,
        "median_ms": median, "p90_ms": float(np.percentile(lat, 90)),
        "p99_ms": float(np.percentile(lat, 99)), "mean_ms": float(lat.mean()),
        "min_ms": float(lat.min()), "max_ms": float(lat.max()),
        "throughput_per_s": args.batch * 1000.0 / median,
        "peak_rss_mb": peak_rss_mb(),
        "base_rss_mb": BASE_RSS_MB,
    }))


def check_model(args):
    spec = json.loads(args.spec)
    inputs = [torch.from_numpy(np.load(os.path.join(args.inputs, s["name"] + ".npy")))
              for s in spec]
    model = load(args.model_dir)
    with torch.inference_mode():
        out = model(*inputs)
    if isinstance(out, torch.Tensor):
        out = (out,)
    names = args.outputs.split(",")
    if len(names) != len(out):
        raise SystemExit(f"torch_bench: the module returned {len(out)} outputs, "
                         f"the signature has {len(names)}")
    os.makedirs(args.out, exist_ok=True)
    for n, t in zip(names, out):
        np.save(os.path.join(args.out, n + ".npy"), t.detach().numpy())
    print(json.dumps({"runtime": "pytorch", "outputs": names}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["prepare", "time", "check"])
    ap.add_argument("model_dir")
    ap.add_argument("--spec", help="inputs as JSON: [{name, dtype, shape}], in call order")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--int-high", type=int, default=100)
    ap.add_argument("--outputs", help="check: the output names, in order")
    ap.add_argument("--inputs", help="check: folder of <input>.npy")
    ap.add_argument("--out", help="check: folder for <output>.npy")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    if args.mode == "prepare":
        prepare(args.model_dir)
    elif args.mode == "time":
        if not args.spec or args.iterations < 1:
            ap.error("time needs --spec and --iterations >= 1")
        time_model(args)
    else:
        if not (args.spec and args.outputs and args.inputs and args.out):
            ap.error("check needs --spec, --outputs, --inputs and --out")
        check_model(args)


if __name__ == "__main__":
    main()
