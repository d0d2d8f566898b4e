"""test_zoo_kernels.py - small models whose hot ops left the reference kernels,
from PyTorch through the kiln CLI.

An LSTM classifier (two stacked bidirectional layers), a GRU classifier (two
layers; PyTorch exports GRU with linear_before_reset=1) and a UNet-style
block (convolutions, a skip Concat, ConvTranspose 2x2 stride 2 and 4x4
stride 2 pad 1), with random weights from fixed seeds, are exported with
torch.onnx.export into a temporary folder together with PyTorch's output for
a batch-2 input. Each runs through `kiln predict` on the default path (fast
recurrent kernels, src/kernels/simd/rnn.c; oneDNN deconvolution,
src/kernels/dnnl/deconv.c), on the reference kernels (KILN_FAST=0), and on
the AVX2 and portable kernel tables, and must match PyTorch within
1e-4 * max(1, max|torch|), as in test_models.py. A last test checks in the
profile that the default path runs those nodes on the fast kernels.

KILN_BIN names the kiln executable (default: build/kiln); the tests skip,
saying so, when it or PyTorch is missing.
"""

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
REL_TOL = 1e-4

MODES = {
    "default": {},
    "reference-kernels": {"KILN_FAST": "0"},
    "avx2": {"KILN_ISA": "avx2"},
    "scalar": {"KILN_ISA": "scalar"},
}


@pytest.fixture(scope="session")
def kiln_bin():
    path = os.path.abspath(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln")))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kiln executable not found at {path}: build it or set KILN_BIN")
    return path


def build_unet(torch):
    class Up(torch.nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.up = torch.nn.ConvTranspose2d(cin, cout, 2, stride=2)
            self.conv = torch.nn.Sequential(torch.nn.Conv2d(2 * cout, cout, 3, padding=1),
                                            torch.nn.ReLU())

        def forward(self, x, skip):
            return self.conv(torch.cat([self.up(x), skip], 1))

    class UNetBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.down = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU())
            self.mid = torch.nn.Sequential(torch.nn.MaxPool2d(2),
                                           torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU())
            self.up = Up(32, 16)
            self.up2 = torch.nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1)
            self.head = torch.nn.Conv2d(8, 2, 1)

        def forward(self, x):
            d = self.down(x)
            return self.head(torch.relu(self.up2(self.up(self.mid(d), d))))

    return UNetBlock().eval(), torch.randn(2, 3, 24, 24)


def build_preact(torch):
    """Pre-activation residual blocks: BatchNorm -> ReLU -> Conv (the BN cannot fold), a
    BatchNorm straight into an unpadded 1x1 Conv (it folds into that Conv's weights), and one
    after a ReLU into a padded grouped 3x3 Conv (it cannot: the padding would see its shift)."""
    nn = torch.nn

    class PreAct(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(16)
            self.conv1 = nn.Conv2d(16, 16, 3, padding=1)
            self.bn2 = nn.BatchNorm2d(16)
            self.conv2 = nn.Conv2d(16, 32, 1)
            self.bn3 = nn.BatchNorm2d(32)
            self.conv3 = nn.Conv2d(32, 8, 3, padding=1, groups=2)

        def forward(self, x):
            x = self.stem(x)
            x = x + self.conv1(torch.relu(self.bn1(x)))
            return self.conv3(self.bn3(torch.relu(self.conv2(self.bn2(x)))))

    m = PreAct()
    gen = torch.Generator().manual_seed(7)
    for bn in (m.bn1, m.bn2, m.bn3):  # non-trivial statistics and affine parameters
        c = bn.num_features
        bn.running_mean.copy_(torch.randn(c, generator=gen) * 0.5)
        bn.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
        bn.weight.data.copy_(torch.rand(c, generator=gen) + 0.5)
        bn.bias.data.copy_(torch.randn(c, generator=gen) * 0.3)
    return m.eval(), torch.randn(2, 3, 20, 20)


def build_model(name):
    """(module, input) for one model; seeded, so every export is the same."""
    torch = pytest.importorskip("torch", reason="PyTorch is needed to export the models")
    torch.manual_seed({"lstm": 1234, "gru": 4321, "unet": 2468, "preact": 1357}[name])
    if name == "unet":
        return build_unet(torch)
    if name == "preact":
        return build_preact(torch)

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            if name == "lstm":
                self.rnn = torch.nn.LSTM(16, 40, num_layers=2, batch_first=True,
                                         bidirectional=True)
                width = 80
            else:
                self.rnn = torch.nn.GRU(16, 48, num_layers=2, batch_first=True)
                width = 48
            self.fc = torch.nn.Linear(width, 5)

        def forward(self, x):
            y, _ = self.rnn(x)
            return self.fc(y[:, -1])

    return Classifier().eval(), torch.randn(2, 12, 16)


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """name -> folder with model.onnx, x.npy and y.npy (PyTorch's)."""
    root = tmp_path_factory.mktemp("zoo_kernels")
    done = {}

    def get(name):
        if name not in done:
            torch = pytest.importorskip("torch")
            model, x = build_model(name)
            folder = root / name
            folder.mkdir()
            with torch.no_grad():
                want = model(x).numpy()
                torch.onnx.export(model, (x,), str(folder / "model.onnx"), input_names=["x"],
                                  output_names=["y"], opset_version=14)
            np.save(folder / "x.npy", x.numpy())
            np.save(folder / "y.npy", want)
            done[name] = folder
        return done[name]

    return get


def run(kiln, args, env=None):
    proc = subprocess.run([kiln, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"kiln {' '.join(args)} exited {proc.returncode}:\n" \
                                 f"{(proc.stderr or proc.stdout)[-2000:]}"
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", ["lstm", "gru", "unet", "preact"])
def test_model_matches_pytorch(name, mode, kiln_bin, exported, tmp_path):
    folder = exported(name)
    run(kiln_bin, ["predict", str(folder / "model.onnx"), "--input", f"x={folder / 'x.npy'}",
                   "--output-dir", str(tmp_path)], MODES[mode])
    got = np.load(tmp_path / "y.npy")
    want = np.load(folder / "y.npy")
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= REL_TOL * scale, f"{name} ({mode}): max|kiln - torch| = {err:.3g}"


@pytest.mark.parametrize("name,op,kernel", [("lstm", "LSTM", "f32_lstm_"),
                                            ("gru", "GRU", "f32_gru_"),
                                            ("unet", "ConvTranspose", "dnnl_deconv")])
def test_nodes_run_on_fast_kernels(name, op, kernel, kiln_bin, exported):
    folder = exported(name)
    out = run(kiln_bin, ["bench", str(folder / "model.onnx"), "--batch", "1", "--iterations",
                         "2", "--warmup", "1", "--profile"])
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == [op]]
    assert rows, f"no {op} row in the profile:\n{out}"
    assert all(r[1].startswith(kernel) for r in rows), f"{op} not on {kernel}*:\n{out}"


def test_transposed_convolution_fuses_its_activation(kiln_bin, exported):
    """The UNet block's second ConvTranspose and the ReLU after it run as one fused kernel
    with the activation as a oneDNN post-op: the phase convolution (deconv_phase.c) or
    oneDNN's deconvolution."""
    folder = exported("unet")
    log = run(kiln_bin, ["inspect", str(folder / "model.onnx"), "--optimized"])
    assert re.search(r"ConvTranspose\+Relu x1\b", log), log
    out = run(kiln_bin, ["bench", str(folder / "model.onnx"), "--batch", "1", "--iterations",
                         "2", "--warmup", "1", "--profile"])
    rows = [line.split() for line in out.splitlines()
            if line.split()[:1] == ["KilnFusedConvTranspose"]]
    assert rows and all(r[1] in ("dnnl_fused_deconv", "dnnl_fused_deconv_phase")
                        for r in rows), out


def test_standalone_batchnorm_leaves_the_reference(kiln_bin, exported):
    """The pre-activation model's BatchNormalizations: one folded into the 1x1 Conv after it,
    two turned into depthwise convolutions (one with its ReLU fused), none left to run."""
    folder = exported("preact")
    log = run(kiln_bin, ["inspect", str(folder / "model.onnx"), "--optimized"])
    assert re.search(r"BatchNormalization\+Conv x1\b", log), log
    assert re.search(r"BatchNormalization as depthwise Conv x2\b", log), log
    out = run(kiln_bin, ["bench", str(folder / "model.onnx"), "--batch", "1", "--iterations",
                         "2", "--warmup", "1", "--profile"])
    assert not [line for line in out.splitlines() if line.startswith("BatchNormalization")], out
