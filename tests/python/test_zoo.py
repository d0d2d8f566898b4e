"""test_zoo.py - every model of Kiln's zoo through the kiln CLI, checked against PyTorch.

The zoo (tools/export_zoo.py: 30 architectures, random weights from fixed
seeds, BatchNorm statistics re-estimated, batch-2 inputs and PyTorch's
outputs) is exported once into a cache outside the repository ($KILN_ZOO_DIR,
default ~/.cache/kiln/zoo) by the test setup when missing, and reused while
the export scripts are unchanged. Each model runs through Kiln's default path
(`kiln predict`) and every output must satisfy, as in test_models.py,

    max|kiln - torch| <= 1e-4 * max(1, max|torch|).

When that fails, the model is rebuilt from its seeds (as bench/torch_bench.py
prepare does; its float32 outputs must equal the exported ones) and run by
PyTorch in float64, and the output still passes when Kiln is about as close
to float64 as PyTorch's own float32 run is:

    max|kiln - torch64| <= max(1e-4 * max(1, max|torch|), 1.5 * max|torch - torch64|).

Two float32 runs of a deep network that sum in different orders can each be
1e-4 from the exact result and 1.4e-4 from each other (inception_v3 on an
AVX2 CPU, where oneDNN's convolutions take other algorithms than on AVX-512).

Each model must also run on fast kernels: no fallback in the optimization log
(a oneDNN primitive on its reference or generic code) and a reference share
under 1% in `kiln bench --json` (test_zoo_model_runs_on_fast_kernels). The
other execution paths (reference kernels, no optimizer, the reference path,
AVX2, scalar) run in a target of their own: test_zoo_paths.py,
`make test-zoo-paths`.

A model Kiln cannot load, run or get right today is not skipped: it is listed
in KNOWN_FAILURES below with the error Kiln prints, and runs as a strict
xfail, so that table is the to-do list and a model that starts passing fails
the test until it is taken off the table.

Time on 2 cores: see docs/ZOO.md. KILN_ZOO_HEAVY=0 leaves out the models in
HEAVY (the slowest to export and run); by default every model runs.
KILN_BIN names the kiln executable (default build/kiln); the tests skip,
saying so, when it, torch or torchvision is missing.
"""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
EXPORT_SCRIPT = REPO / "tools" / "export_zoo.py"
RUN_TIMEOUT_S = float(os.environ.get("KILN_TEST_TIMEOUT", "1200"))
REL_TOL = 1e-4

# model -> the error Kiln gives today (its message, or the size of the mismatch).
# Strict xfail: a model listed here that passes fails the run.
# Empty today: all 30 models match on the default path (the zoo's first run, on this
# commit's Kiln). Add an entry, with Kiln's message, for a model added that does not.
KNOWN_FAILURES = {
}

# The slowest to export (two thirds of the export time); KILN_ZOO_HEAVY=0 leaves them out.
HEAVY = ["wide_resnet50_2", "densenet121", "swin_t", "resnext50_32x4d"]


def zoo_module():
    spec = importlib.util.spec_from_file_location("kiln_export_zoo", EXPORT_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def zoo_names():
    """The model names, read from the script without importing torch."""
    names, inside = [], False
    for line in EXPORT_SCRIPT.read_text().splitlines():
        if line.startswith("ZOO = "):
            inside = True
        elif inside and line.startswith("])"):
            break
        elif inside and line.strip().startswith('("'):
            names.append(line.strip().split('"')[1])
    return names


NAMES = zoo_names()
if os.environ.get("KILN_ZOO_HEAVY", "1") == "0":
    NAMES = [n for n in NAMES if n not in HEAVY]


@pytest.fixture(scope="session")
def kiln_bin():
    path = os.path.abspath(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln")))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kiln executable not found at {path}: build it or set KILN_BIN")
    return path


@pytest.fixture(scope="session")
def zoo():
    """The zoo folder, with every model of NAMES exported (cached)."""
    pytest.importorskip("torch", reason="PyTorch is needed to export the zoo")
    pytest.importorskip("torchvision", reason="torchvision is needed to export the zoo "
                                              "(Debian: apt-get install python3-torchvision)")
    module = zoo_module()
    out = module.zoo_dir()
    t0 = time.monotonic()
    spent = module.ensure(NAMES, out, log=lambda s: print(s, file=sys.stderr))
    exported = [n for n, s in spent.items() if s > 0]
    print(f"zoo: {len(NAMES)} models in {out}; exported {len(exported)} "
          f"in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    return Path(out)


def float64_reference(name, model_dir):
    """{output: PyTorch's float64 output} for the zoo model, rebuilt from its seeds,
    or a string saying why there is none. The batch statistics that the export
    re-estimates depend on PyTorch's thread count (the export ran with this
    process's or with every core), so each count is tried until the rebuilt
    model's float32 outputs equal the exported ones bit for bit."""
    try:
        import torch
        module = zoo_module()
        em = module.em
        build, make_inputs, output_names = module.ZOO[name]()
        names = list(make_inputs(1, torch.Generator().manual_seed(0)))
        inputs = [torch.from_numpy(np.load(model_dir / "inputs" / f"{n}.npy")) for n in names]
        expected = [np.load(model_dir / "expected" / f"{n}.npy") for n in output_names]
        threads0, tried = torch.get_num_threads(), []
        for threads in dict.fromkeys([threads0, os.cpu_count() or 1, 1]):
            torch.set_num_threads(threads)
            try:
                torch.manual_seed(em.seed_for(name))
                gen = torch.Generator().manual_seed(em.seed_for(name) + 1)
                model = build()
                em.reestimate_batchnorm(model, make_inputs, gen)
                model.eval()
                with torch.no_grad():
                    out32 = model(*inputs)
                    out32 = (out32,) if isinstance(out32, torch.Tensor) else out32
                    diff = max(float(np.abs(t.numpy() - e).max()) for t, e in zip(out32, expected))
                    if diff == 0.0:
                        out64 = model.double()(*[t.double() if t.is_floating_point() else t
                                                 for t in inputs])
                        out64 = (out64,) if isinstance(out64, torch.Tensor) else out64
                        return {n: t.numpy() for n, t in zip(output_names, out64)}
                    tried.append(f"{threads} threads: {diff:.3g}")
            finally:
                torch.set_num_threads(threads0)
    except Exception as e:  # noqa: BLE001 - any failure leaves the float32 verdict standing
        return f"no float64 reference ({type(e).__name__}: {e})"
    return ("no float64 reference (the rebuilt model's float32 outputs differ from the "
            f"export's: {', '.join(tried)})")


def check(name, kiln, model_dir, tmp_path, args=(), env=None):
    """Run the model through kiln (`kiln predict` with args, in the environment plus
    env); a list of problems (empty when it matches)."""
    inputs = {p.stem: p for p in sorted((model_dir / "inputs").glob("*.npy"))}
    expected = {p.stem: np.load(p) for p in sorted((model_dir / "expected").glob("*.npy"))}
    assert inputs and expected, f"the export of {name} wrote no inputs or expected outputs"
    cmd = [kiln, "predict", str(model_dir / "model.onnx"), *args]
    for n, p in inputs.items():
        cmd += ["--input", f"{n}={p}"]
    cmd += ["--output-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        return [f"kiln exited {proc.returncode}: "
                + (proc.stderr or proc.stdout).strip()[-600:]]
    problems, ref64 = [], None
    for out_name, want in expected.items():
        path = tmp_path / f"{out_name}.npy"
        if not path.is_file():
            problems.append(f"no output {out_name}")
            continue
        got = np.load(path)
        if got.shape != want.shape:
            problems.append(f"{out_name}: shape {got.shape}, expected {want.shape}")
            continue
        if not np.all(np.isfinite(got)):
            problems.append(f"{out_name}: {np.count_nonzero(~np.isfinite(got))} non-finite values")
            continue
        scale = max(1.0, float(np.abs(want).max()))
        err = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
        if err <= REL_TOL * scale:
            continue
        msg = f"{out_name}: max|kiln - torch| = {err:.3g} > {REL_TOL * scale:.3g}"
        if ref64 is None:
            ref64 = float64_reference(name, model_dir)
        if isinstance(ref64, str) or out_name not in ref64:
            problems.append(f"{msg}; {ref64 if isinstance(ref64, str) else 'no float64 output'}")
            continue
        e_kiln = float(np.abs(got.astype(np.float64) - ref64[out_name]).max())
        e_torch = float(np.abs(want.astype(np.float64) - ref64[out_name]).max())
        print(f"{name}: {out_name}: max|kiln - torch64| = {e_kiln:.3g}, "
              f"max|torch - torch64| = {e_torch:.3g}", file=sys.stderr)
        if e_kiln > max(REL_TOL * scale, 1.5 * e_torch):
            problems.append(f"{msg}, and max|kiln - torch64| = {e_kiln:.3g} > 1.5 x "
                            f"max|torch - torch64| = {1.5 * e_torch:.3g}")
    return problems


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[n]))
    if n in KNOWN_FAILURES else n for n in NAMES])
def test_zoo_model_matches_pytorch(name, kiln_bin, zoo, tmp_path):
    problems = check(name, kiln_bin, zoo / name, tmp_path)
    assert not problems, f"{name}: " + "; ".join(problems)


def fast_kernel_problems(kiln, model_dir):
    """What keeps the model off fast kernels on the default path: the fallbacks the
    optimization log names (a oneDNN primitive on its reference or generic code,
    src/exec/plan.c) and a reference share of 1% or more of `kiln bench`'s time at the
    exported batch (2)."""
    model = str(model_dir / "model.onnx")
    problems = []
    log = subprocess.run([kiln, "inspect", model, "--optimized"], capture_output=True,
                         text=True, errors="replace", timeout=RUN_TIMEOUT_S)
    if log.returncode != 0:
        return [f"kiln inspect exited {log.returncode}: {log.stderr.strip()[-400:]}"]
    problems += [line.strip() for line in log.stdout.splitlines() if "fallback:" in line]
    bench = subprocess.run([kiln, "bench", model, "--batch", "2", "--iterations", "3",
                            "--warmup", "1", "--json"], capture_output=True, text=True,
                           errors="replace", timeout=RUN_TIMEOUT_S)
    if bench.returncode != 0:
        return problems + [f"kiln bench exited {bench.returncode}: {bench.stderr.strip()[-400:]}"]
    share = json.loads(bench.stdout)["reference_share"]
    # under the sanitizers Kiln's own kernels slow down and oneDNN's do not: the
    # share is not the product's there (the fallbacks still are)
    if os.environ.get("KILN_SANITIZED") != "1" and (share is None or share >= 0.01):
        problems.append(f"reference_share {share} (at most 0.01)")
    return problems


@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_runs_on_fast_kernels(name, kiln_bin, zoo):
    """No reference kernel on the hot path of any zoo model: no fallback named in the
    optimization log, reference share under 1%."""
    problems = fast_kernel_problems(kiln_bin, zoo / name)
    assert not problems, f"{name}: " + "; ".join(problems)


def test_known_failures_are_zoo_models():
    """The to-do table names only models of the zoo."""
    assert set(KNOWN_FAILURES) <= set(zoo_names()), set(KNOWN_FAILURES) - set(zoo_names())
    assert len(zoo_names()) >= 24
