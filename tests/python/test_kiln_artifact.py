"""test_kiln_artifact.py - compiled artifacts (.kiln, docs/KILN_FORMAT.md) in the tools.

The bundled digits MLP (models/digits/1/model.onnx: Gemm -> Relu -> Gemm ->
Softmax) is compiled to a .kiln file through the C API (the test binary
tests/unit_kiln_artifact --save, until `kiln compile` writes them), then:

- `kiln predict` on the .kiln file gives the source model's outputs exactly,
  and both match a numpy evaluation of the ONNX file's weights;
- `kiln serve` serves a version folder holding only model.kiln, and a TF
  Serving :predict over REST answers with the numpy reference;
- `kiln inspect` shows the precision, sections and per-node kernels;
- `kiln bench` runs it;
- the Python extension (`import kiln`) loads it like any other model, with
  the source's signature names.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_once import serve_predict  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KILN_BUILD_DIR", str(REPO / "build")))
MODEL = REPO / "models" / "digits" / "1" / "model.onnx"
SAMPLE = REPO / "models" / "digits_sample.npy"


@pytest.fixture(scope="module")
def kiln_bin():
    path = os.path.abspath(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln")))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kiln executable not found at {path}: build it or set KILN_BIN")
    return path


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    tool = BUILD / "tests" / "unit_kiln_artifact"
    if not tool.exists():
        pytest.skip(f"{tool} not found (build Kiln, or set KILN_BUILD_DIR)")
    out = tmp_path_factory.mktemp("art") / "digits.kiln"
    subprocess.run([str(tool), "--save", str(MODEL), str(out), "fp32"], check=True, timeout=120)
    return out


def numpy_reference(x):
    """The digits MLP evaluated with numpy from the ONNX file's initializers."""
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper
    m = onnx.load(str(MODEL))
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in m.graph.initializer}
    gemms = [n for n in m.graph.node if n.op_type == "Gemm"]
    h = x.astype(np.float64)
    for i, n in enumerate(gemms):
        trans_b = any(a.name == "transB" and a.i for a in n.attribute)
        b = w[n.input[1]].T if trans_b else w[n.input[1]]
        h = h @ b + w[n.input[2]]
        if i == 0:
            h = np.maximum(h, 0)
    e = np.exp(h - h.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def predict(kiln_bin, model, x, tmp_path, tag):
    inp = tmp_path / f"{tag}_x.npy"
    np.save(inp, x)
    out = tmp_path / f"{tag}_out"
    r = subprocess.run([kiln_bin, "predict", str(model), "--input", f"pixels={inp}",
                        "--output-dir", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return np.load(out / "probabilities.npy")


def test_predict_equals_source_and_numpy(kiln_bin, artifact, tmp_path):
    x = np.load(SAMPLE).astype(np.float32)
    y_src = predict(kiln_bin, MODEL, x, tmp_path, "src")
    y_art = predict(kiln_bin, artifact, x, tmp_path, "art")
    assert y_art.dtype == np.float32 and y_art.shape == (x.shape[0], 10)
    assert np.array_equal(y_art, y_src)  # fp32 artifacts are exact
    np.testing.assert_allclose(y_art, numpy_reference(x), rtol=1e-4, atol=1e-6)
    labels = np.load(REPO / "models" / "digits_sample_labels.npy")
    assert np.array_equal(y_art.argmax(axis=1), labels)


def test_serve_version_folder_with_model_kiln(kiln_bin, artifact, tmp_path):
    base = tmp_path / "digits"
    (base / "1").mkdir(parents=True)
    shutil.copy(artifact, base / "1" / "model.kiln")
    x = np.load(SAMPLE).astype(np.float32)
    reply = serve_predict(kiln_bin, base, "digits", x.tolist())
    y = np.array(reply["predictions"], dtype=np.float64)
    np.testing.assert_allclose(y, numpy_reference(x), rtol=1e-4, atol=1e-6)


def test_inspect_shows_sections_precision_and_kernels(kiln_bin, artifact):
    r = subprocess.run([kiln_bin, "inspect", str(artifact)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "format: kiln" in out
    assert "precision: fp32" in out
    assert "format version 3" in out
    for sec in ("META", "SIGN", "GRPZ", "WGHT"):
        assert sec in out, out
    assert "pixels" in out and "probabilities" in out  # the source's signature names
    assert "precision per node" in out and "Softmax" in out, out


def test_bench_runs_the_artifact(kiln_bin, artifact):
    r = subprocess.run([kiln_bin, "bench", str(artifact), "--iterations", "3", "--warmup", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_a_corrupted_artifact_is_refused_by_name(kiln_bin, artifact, tmp_path):
    bad = tmp_path / "bad.kiln"
    data = bytearray(artifact.read_bytes())
    data[-5] ^= 0xFF  # inside the weight section
    bad.write_bytes(bytes(data))
    r = subprocess.run([kiln_bin, "inspect", str(bad)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    assert str(bad) in r.stderr and "checksum mismatch" in r.stderr, r.stderr


def test_python_extension_loads_the_artifact(artifact):
    if not (BUILD / "libkiln.so").exists():
        pytest.skip(f"{BUILD}/libkiln.so not found")
    out = BUILD / "python"
    env = dict(os.environ, KILN_BUILD_DIR=str(BUILD))
    run_env = dict(os.environ)
    if b"libasan" in (BUILD / "libkiln.so").read_bytes():
        # a sanitizer build: the extension is built with the sanitizers and the
        # interpreter runs with their runtimes preloaded (as test_python_api.py does)
        flags = "-fsanitize=address,undefined -fno-sanitize-recover=undefined"
        env.update(CFLAGS=flags + " -fno-omit-frame-pointer", LDFLAGS="-fsanitize=address,undefined")
        out = BUILD / "python-sanitized"
        libs = [subprocess.run(["gcc", f"-print-file-name={n}"], capture_output=True,
                               text=True).stdout.strip() for n in ("libasan.so", "libubsan.so")]
        run_env.update(LD_PRELOAD=":".join(libs), ASAN_OPTIONS="detect_leaks=0")
    # always (re)build: the package carries its own copy of libkiln.so, which an
    # earlier build may have left stale (setup.py build only recompiles what changed)
    r = subprocess.run([sys.executable, str(REPO / "python" / "setup.py"), "-q", "build",
                        "--build-lib", str(out), "--build-temp", str(out) + "-tmp"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    code = (
        "import sys, numpy as np; sys.path.insert(0, sys.argv[1]); import kiln\n"
        "s = kiln.InferenceSession(sys.argv[2])\n"
        "assert [i.name for i in s.get_inputs()] == ['pixels'], s.get_inputs()\n"
        "assert [o.name for o in s.get_outputs()] == ['probabilities']\n"
        "x = np.load(sys.argv[3]).astype(np.float32)\n"
        "np.save(sys.argv[4], s.run(None, {'pixels': x})[0])\n")
    y_path = artifact.parent / "py_y.npy"
    r = subprocess.run([sys.executable, "-c", code, str(out), str(artifact), str(SAMPLE),
                        str(y_path)], capture_output=True, text=True, timeout=120, env=run_env)
    assert r.returncode == 0, r.stderr
    x = np.load(SAMPLE).astype(np.float32)
    np.testing.assert_allclose(np.load(y_path), numpy_reference(x), rtol=1e-4, atol=1e-6)
