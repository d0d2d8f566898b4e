"""test_models.py - whole real models through the kiln CLI, checked against PyTorch.

Each model is exported by tools/export_models.py (random weights, fixed
seeds, BatchNorm statistics re-estimated), together with batch-2 inputs and
PyTorch's outputs: into the cache KILN_TEST_MODELS names when it is set (the
test suite's build/test-models/, filled by tools/cache_test_models.py and
shared with unit_opt), else once per test session into a temporary folder. Each
test runs, on each execution path in MODES (optimized + fast kernels,
optimized + reference kernels, unoptimized, reference executor, AVX2, scalar),

    $KILN_BIN predict model.onnx --input NAME=NAME.npy ... --output-dir OUT

and requires, for every output, max|kiln - torch| <= 1e-4 * max(1, max|torch|):
tight enough that a wrong kernel, a wrong attribute or a broken broadcast
fails, loose enough for float32 summation order.

A last test runs the checked-in models/digits/1/model.onnx (tools/make_digits_model.py)
on its held-out sample and requires the true labels.

KILN_BIN names the kiln executable (default: build/kiln in this repository);
the tests skip, saying so, when it is missing. The PyTorch tests skip when
torch (or, for the image models, torchvision) is not installed.
KILN_TEST_TIMEOUT bounds one kiln run in seconds (default 1200).
"""

import importlib.util
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
EXPORT_SCRIPT = REPO / "tools" / "export_models.py"
CACHE_SCRIPT = REPO / "tools" / "cache_test_models.py"
MODEL_CACHE = os.environ.get("KILN_TEST_MODELS")
MODELS_DIR = REPO / "models"
RUN_TIMEOUT_S = float(os.environ.get("KILN_TEST_TIMEOUT", "1200"))
REL_TOL = 1e-4

VISION_MODELS = ["resnet18", "mobilenet_v2", "efficientnet_b0"]
OTHER_MODELS = ["bert_small", "tabular_mlp", "dlrm"]


@pytest.fixture(scope="session")
def kiln_bin():
    """Absolute path of the kiln executable, or skip."""
    path = os.path.abspath(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln")))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kiln executable not found at {path}: build it "
                    f"(cmake -S . -B build && cmake --build build) or set KILN_BIN")
    return path


class ExportCache:
    """Exports models on first request into one session folder and remembers them."""

    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.done = {}
        self.module = None

    def _load_exporter(self):
        pytest.importorskip("torch", reason="PyTorch is needed to export the reference models")
        script = CACHE_SCRIPT if MODEL_CACHE else EXPORT_SCRIPT
        spec = importlib.util.spec_from_file_location("kiln_export_models", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def exporter(self):
        """tools/export_models.py as a module (the cache script loads it for its exports)."""
        if self.module is None:
            self.module = self._load_exporter()
        return self.module._load_exporter() if MODEL_CACHE else self.module

    def get(self, name):
        """Folder holding model.onnx, inputs/ and expected/ for name."""
        if name not in self.done:
            if name in VISION_MODELS:
                pytest.importorskip("torchvision",
                                    reason=f"torchvision is needed to build {name} "
                                           f"(Debian: apt-get install python3-torchvision)")
            if self.module is None:
                self.module = self._load_exporter()
            if MODEL_CACHE:
                self.done[name] = self.module.cached_model(name, MODEL_CACHE)
            else:
                self.module.export_model(name, str(self.out_dir))
                self.done[name] = self.out_dir / name
        return self.done[name]


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    return ExportCache(tmp_path_factory.mktemp("exported_models"))


# Every execution path of a model is checked against PyTorch: the default
# (optimized graph, plans, fast kernels), the optimized graph on reference
# kernels (KILN_FAST=0: the fused ops' reference kernels), the imported graph
# on plans and fast kernels (--disable-optimizer), the pure reference path
# (--reference), the AVX2 kernels and 8-wide blocked layouts (KILN_ISA=avx2),
# the portable fallbacks (KILN_ISA=scalar), and direct convolutions only
# (KILN_WINOGRAD=0; the default runs 3x3 stride-1 convolutions with Winograd),
# and inverted-residual blocks as three oneDNN convolutions (KILN_MBCONV=0;
# the default fuses them into KilnMBConv on AVX-512 CPUs).
MODES = {
    "default": ([], {}),
    "direct-conv": ([], {"KILN_WINOGRAD": "0"}),
    "unfused-blocks": ([], {"KILN_MBCONV": "0"}),
    "fused-reference-kernels": ([], {"KILN_FAST": "0"}),
    "disable-optimizer": (["--disable-optimizer"], {}),
    "reference": (["--reference"], {}),
    "avx2": ([], {"KILN_ISA": "avx2"}),
    "scalar": ([], {"KILN_ISA": "scalar"}),
}


def run_kiln(kiln, model_path, inputs, out_dir, args=(), env=None):
    """Run `kiln predict`; inputs maps input name -> .npy path. Fails the test,
    with kiln's own message, if kiln exits non-zero."""
    cmd = [kiln, "predict", str(model_path)]
    for name, path in inputs.items():
        cmd += ["--input", f"{name}={path}"]
    cmd += ["--output-dir", str(out_dir), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        pytest.fail(f"kiln ran over {RUN_TIMEOUT_S:.0f}s: {' '.join(cmd)}")
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        pytest.fail(f"kiln exited {proc.returncode}: {' '.join(cmd)}\n{tail}")


def load_output(out_dir, name):
    path = Path(out_dir) / f"{name}.npy"
    if not path.is_file():
        found = sorted(p.name for p in Path(out_dir).iterdir())
        pytest.fail(f"kiln wrote no {path.name} in {out_dir} (found: {found})")
    return np.load(path)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", VISION_MODELS + OTHER_MODELS)
def test_model_matches_pytorch(name, mode, kiln_bin, exported, tmp_path):
    model_dir = exported.get(name)
    inputs = {p.stem: p for p in sorted((model_dir / "inputs").glob("*.npy"))}
    expected = {p.stem: np.load(p) for p in sorted((model_dir / "expected").glob("*.npy"))}
    assert inputs and expected, f"export of {name} wrote no inputs or expected outputs"

    args, env = MODES[mode]
    run_kiln(kiln_bin, model_dir / "model.onnx", inputs, tmp_path, args, env)

    failures = []
    for out_name, want in expected.items():
        got = load_output(tmp_path, out_name)
        if got.shape != want.shape:
            failures.append(f"{out_name}: shape {got.shape}, expected {want.shape}")
            continue
        if not np.all(np.isfinite(got)):
            failures.append(f"{out_name}: {np.count_nonzero(~np.isfinite(got))} "
                            f"non-finite values")
            continue
        scale = max(1.0, float(np.abs(want).max()))
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        err = float(diff.max())
        if err > REL_TOL * scale:
            worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
            failures.append(f"{out_name}: max|kiln - torch| = {err:.3g} > {REL_TOL * scale:.3g} "
                            f"(at {tuple(int(i) for i in worst)}: kiln {got[worst]:.6g}, "
                            f"torch {want[worst]:.6g})")
    assert not failures, f"{name} ({mode}): " + "; ".join(failures)


def test_digits_predicts_sample_labels(kiln_bin, tmp_path):
    model = MODELS_DIR / "digits" / "1" / "model.onnx"
    sample = MODELS_DIR / "digits_sample.npy"
    labels = np.load(MODELS_DIR / "digits_sample_labels.npy")

    run_kiln(kiln_bin, model, {"pixels": sample}, tmp_path)
    probs = load_output(tmp_path, "probabilities")

    assert probs.shape == (len(labels), 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert np.argmax(probs, axis=1).tolist() == labels.tolist()


# ---------------------------------------------------------------- the profile's work counts

def mbconv_fuses():
    """Whether the optimizer makes KilnMBConv here: an AVX-512 CPU, KILN_ISA not lowered,
    KILN_MBCONV not 0."""
    try:
        with open("/proc/cpuinfo") as f:
            avx512 = " avx512f" in f.read()
    except OSError:
        avx512 = False
    return (avx512 and os.environ.get("KILN_ISA", "") in ("", "avx512")
            and os.environ.get("KILN_MBCONV", "1") != "0")


def torch_flops(exporter, name):
    """2 x the multiply-accumulates of one batch-1 forward pass of the PyTorch model:
    every Conv2d and Linear from its output shape (forward hooks) and every torch.matmul
    call (BERT's attention products), counted while PyTorch runs it."""
    import torch
    build, make_inputs, _ = exporter.MODELS[name]()
    model = build().eval()
    total = [0]

    def conv_hook(m, args, out):
        total[0] += 2 * out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]

    def linear_hook(m, args, out):
        total[0] += 2 * out.numel() * m.in_features

    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(conv_hook)
        elif isinstance(m, torch.nn.Linear):
            m.register_forward_hook(linear_hook)
    real_matmul = torch.matmul

    def counting_matmul(a, b):
        out = real_matmul(a, b)
        total[0] += 2 * out.numel() * a.shape[-1]
        return out

    torch.matmul = counting_matmul
    try:
        with torch.no_grad():
            model(*make_inputs(1, torch.Generator().manual_seed(0)).values())
    finally:
        torch.matmul = real_matmul
    return total[0]


def profile_steps(kiln, model_path, args=()):
    """Run `kiln bench --profile` once and parse its peak line and every step's row:
    [(op, ms per run, MFLOP or None, GFLOP/s or None, share of peak % or None)]."""
    proc = subprocess.run([kiln, "bench", str(model_path), "--batch", "1", "--iterations", "2",
                           "--warmup", "0", "--profile", *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env={**os.environ, "KILN_PROFILE_STEPS": "100000"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    peak_lines = [l for l in lines if l.startswith("peak: ")]
    assert len(peak_lines) == 1, proc.stderr[-2000:]
    peak = float(peak_lines[0].split()[1])
    start = lines.index("slowest steps:") + 2
    steps = []
    for line in lines[start:]:
        if not line[:5].strip().isdigit():
            break
        # fixed columns: step, node (32), op (20), kernel (22), then ms, share, MFLOP, GFLOP/s, peak
        op = line[39:59].strip()
        ms, _share, mflop, gflops, pct = line[83:].split()[:5]
        num = lambda s: None if s == "-" else float(s.rstrip("%"))
        steps.append((op, float(ms), num(mflop), num(gflops), num(pct)))
    return peak, steps


@pytest.mark.parametrize("name", ["efficientnet_b0", "mobilenet_v2", "bert_small"])
def test_profile_counts_the_models_work(name, kiln_bin, exported):
    """`kiln bench --profile` counts, per step, the floating-point work of the products: the
    totals match PyTorch's own layers (hooks) on the imported graph and on the optimized one
    (fused blocks, attention and matmuls with their epilogues count what they replaced), and
    every rate is that work over that time, as a share of the printed peak."""
    model_dir = exported.get(name)
    want = torch_flops(exported.exporter(), name) / 1e6
    for args in ([], ["--disable-optimizer"]):
        peak, steps = profile_steps(kiln_bin, model_dir / "model.onnx", args)
        assert peak > 0
        counted = [s for s in steps if s[2] is not None]
        got = sum(s[2] for s in counted)
        # each row rounds to 0.001 MFLOP
        assert abs(got - want) <= 0.0005 * len(counted) + 1e-9 * want, \
            f"{name} {args}: profile counts {got:.3f} MFLOP, PyTorch's layers {want:.3f}"
        for op, ms, mflop, gflops, pct in counted:
            if ms >= 0.01 and mflop >= 0.1:
                # ms and MFLOP are rounded to 0.001, GFLOP/s to 0.1
                lo = (mflop - 5e-4) / (ms + 5e-4) - 0.05
                hi = (mflop + 5e-4) / (ms - 5e-4) + 0.05
                assert lo <= gflops <= hi, (op, ms, mflop, gflops)
                # the share rounds to 1%, GFLOP/s and the peak to 0.1 (a sanitizer build's
                # peak is a few GFLOP/s)
                assert pct == pytest.approx(100 * gflops / peak,
                                            abs=0.6 + (5 + 0.05 * pct) / peak), \
                    (op, gflops, pct, peak)
        if not args:
            ops = {s[0] for s in counted}
            # the fused block kernel is AVX-512 only (KILN_MBCONV=0 turns it off)
            fused = {"efficientnet_b0": "KilnMBConv" if mbconv_fuses() else "KilnFusedConv",
                     "mobilenet_v2": "KilnMBConv" if mbconv_fuses() else "KilnFusedConv",
                     "bert_small": "Attention"}[name]
            assert fused in ops, f"{name}: no {fused} step counted ({sorted(ops)})"
