"""End-to-end tests for `kiln serve --allow_compression` and
`--allow_precompilation` (docs/COMPRESSION.md, "In kiln serve").

The bundled digits MLP (models/digits) is served with a warmup file
(assets.extra/tf_serving_warmup_requests, written by test_serve_warmup's
encoder) holding 200 training rows of scikit-learn's digits. With
--allow_compression the version is compiled by the auto policy on those rows:
the load line carries the summary, the Prometheus gauge and the metadata say
int8, and the answers equal a numpy emulation of Kiln's dynamic int8 Gemm
(test_precision's) and agree with numpy's fp32 model on the held-out rows.
Without data (no warmup file, or fewer than 10 rows) the version is served
in fp32, answers equal numpy's fp32 model, and the log says why. With
--allow_precompilation a restart loads the compiled .kiln from the cache
(the log says so and names the .kiln format: no import); a corrupted cache
entry is reported, removed and rebuilt, and the answers stay the same.

A version may instead (or also) hold a calibration folder
(assets.extra/kiln_calibration/: pixels.npy and/or .npz archives): with only
the folder the version is compressed on its rows, with both the folder wins,
and a folder with wrong names, dtypes, shapes, NaN, too few rows or a
damaged file serves the version in fp32 with a reason naming the file and
the input.
"""

import shutil
from pathlib import Path

import numpy as np
import pytest

import test_serve
from test_serve import Server
from test_compile import VNNI, gemm_weights, mlp, softmax
from test_serve_warmup import load_lines, metrics_text, predict_log, tfrecord, write_warmup

pytestmark = test_serve.pytestmark

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "models" / "digits" / "1" / "model.onnx"


@pytest.fixture(scope="module")
def data():
    sk = pytest.importorskip("sklearn.datasets")
    from sklearn.model_selection import train_test_split
    d = sk.load_digits()
    x = d.data.astype(np.float32)
    y = d.target.astype(np.int64)
    x_train, x_test, _, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    return x_train[:200], x_test[:64]


def version(base, rows, folder=None):
    """base/1 holding the digits MLP and, when rows is not None, a warmup
    file of predict requests of 20 rows each; folder: {file name: array, or
    {member: array} for an .npz, or bytes} written into
    assets.extra/kiln_calibration/."""
    (base / "1").mkdir(parents=True)
    shutil.copy(DIGITS, base / "1" / "model.onnx")
    if rows is not None:
        write_warmup(base / "1", tfrecord([predict_log({"pixels": rows[i:i + 20]})
                                           for i in range(0, len(rows), 20)]))
    if folder is not None:
        cal = base / "1" / "assets.extra" / "kiln_calibration"
        cal.mkdir(parents=True)
        for name, arr in folder.items():
            if isinstance(arr, bytes):
                (cal / name).write_bytes(arr)
            elif isinstance(arr, dict):
                np.savez(cal / name, **arr)
            else:
                np.save(cal / name, arr)
    return base


def predict(srv, name, x):
    code, body = srv.json("POST", f"/v1/models/{name}:predict", {"instances": x.tolist()})
    assert code == 200, body
    return np.array(body["predictions"], np.float64)


def precision_gauge(srv, name):
    lines = [ln for ln in metrics_text(srv).splitlines()
             if ln.startswith(f'kiln_model_precision{{model_name="{name}",version="1"')]
    assert len(lines) == 1, lines
    assert lines[0].endswith("} 1")
    return lines[0].split('precision="')[1].split('"')[0]


def metadata_precision(srv, name):
    code, body = srv.json("GET", f"/v1/models/{name}/versions/1/metadata")
    assert code == 200, body
    return body["metadata"]["kiln_precision"]


@pytest.mark.skipif(not VNNI, reason="no VNNI on this CPU: no int8 kernels to compress to")
def test_compression_serves_int8_within_the_bound(tmp_path, data):
    cal, x = data
    base = version(tmp_path / "c", cal)
    layers = gemm_weights(DIGITS)
    srv = Server(base, "c", "--allow_compression")
    try:
        (line,) = load_lines(srv)
        assert " compression=int8 " in line, line
        assert 'compression_summary="int8: 2 int8, 0 bf16, 0 fp32 nodes;' in line, line
        assert "on 200 samples" in line and "top-1 agreement" in line and "0 fell back" in line
        assert precision_gauge(srv, "c") == "int8"
        assert metadata_precision(srv, "c") == "int8"
        got = predict(srv, "c", x)
    finally:
        srv.kill()
    # exactly Kiln's dynamic int8 on this request's 64 rows, in numpy
    want = softmax(mlp(x, layers, ["int8", "int8"], batched=False).astype(np.float64))
    assert np.abs(got - want).max() < 1e-4
    fp32 = softmax(mlp(x, layers, ["fp32", "fp32"], batched=False).astype(np.float64))
    assert np.abs(got - fp32).max() > 1e-6  # really compressed
    assert (got.argmax(1) == fp32.argmax(1)).mean() >= 0.99


def test_no_data_serves_fp32_and_says_why(tmp_path, data):
    cal, x = data
    layers = gemm_weights(DIGITS)
    fp32 = softmax(mlp(x, layers, ["fp32", "fp32"], batched=False).astype(np.float64))
    for name, rows, why in (
            ("none", None, "no data to check it on: the version has no "
                           "assets.extra/kiln_calibration/ folder and no "
                           "assets.extra/tf_serving_warmup_requests"),
            ("few", cal[:5], "the warmup file holds 5 samples for signature 'serving_default', "
                             "fewer than 10")):
        base = version(tmp_path / name, rows)
        srv = Server(base, name, "--allow_compression")
        try:
            (line,) = load_lines(srv)
            assert " compression=off compression_reason=" in line and why in line, line
            assert precision_gauge(srv, name) == "fp32"
            assert metadata_precision(srv, name) == "fp32"
            got = predict(srv, name, x)
        finally:
            srv.kill()
        assert np.abs(got - fp32).max() < 1e-5


def test_precompilation_cache_hit_and_rebuild(tmp_path, data):
    cal, x = data
    base = version(tmp_path / "p", cal)
    cache = tmp_path / "cache"
    flags = ("--allow_compression", "--allow_precompilation", f"--precompilation_cache_dir={cache}")
    answers, lines = [], []
    for start in range(3):
        srv = Server(base, "p", *flags)
        try:
            (line,) = load_lines(srv)
            lines.append(line)
            answers.append(predict(srv, "p", x))
            prec = precision_gauge(srv, "p")
        finally:
            srv.kill()
        entries = list(cache.glob("*.kiln"))
        assert len(entries) == 1, entries
        if start == 1:  # damage the entry: the next start reports, removes and rebuilds it
            raw = bytearray(entries[0].read_bytes())
            raw[len(raw) // 2] ^= 0xFF
            entries[0].write_bytes(bytes(raw))
    first, hit, rebuilt = lines
    assert " format=onnx " in first and " precompilation=stored " in first, first
    assert " format=kiln " in hit and f" precompilation=hit precision={prec} " in hit, hit
    assert "compression=" not in hit  # nothing compiled again
    assert "kiln_serve_precision" in hit  # the stored summary comes back in the log
    assert "precompilation_cache=unusable" in rebuilt and " precompilation=stored " in rebuilt
    assert " format=onnx " in rebuilt
    if VNNI:
        assert prec == "int8"
    assert np.array_equal(answers[0], answers[1]) and np.array_equal(answers[0], answers[2])


@pytest.mark.skipif(not VNNI, reason="no VNNI on this CPU: no int8 kernels to compress to")
def test_calibration_folder_compresses(tmp_path, data):
    """Only a calibration folder (120 rows in pixels.npy, 80 in an .npz):
    compressed on its 200 rows, the answers exactly Kiln's dynamic int8."""
    cal, x = data
    layers = gemm_weights(DIGITS)
    want = softmax(mlp(x, layers, ["int8", "int8"], batched=False).astype(np.float64))
    fp32 = softmax(mlp(x, layers, ["fp32", "fp32"], batched=False).astype(np.float64))
    for name, rows, folder, data_says in (
            ("folder", None, {"pixels.npy": cal[:120], "more.npz": {"pixels": cal[120:]}},
             'compression_data="assets.extra/kiln_calibration: 200 samples"'),
            # the folder wins over a warmup file too small to check on
            ("both", cal[:5], {"rows.npz": {"pixels": cal}},
             'compression_data="assets.extra/kiln_calibration: 200 samples (preferred to '
             'the warmup file)"')):
        base = version(tmp_path / name, rows, folder)
        srv = Server(base, name, "--allow_compression")
        try:
            (line,) = load_lines(srv)
            assert " compression=int8 " in line, line
            assert data_says in line, line
            assert "on 200 samples" in line, line
            assert precision_gauge(srv, name) == "int8"
            assert metadata_precision(srv, name) == "int8"
            got = predict(srv, name, x)
        finally:
            srv.kill()
        assert np.abs(got - want).max() < 1e-4
        assert np.abs(got - fp32).max() > 1e-6  # really compressed


def test_bad_calibration_folder_serves_fp32_and_says_why(tmp_path, data):
    """Each broken folder: fp32 (numpy's answers), the reason names the file
    and the input; the warmup file beside it is not used instead."""
    cal, x = data
    layers = gemm_weights(DIGITS)
    fp32 = softmax(mlp(x, layers, ["fp32", "fp32"], batched=False).astype(np.float64))
    nan = cal.copy()
    nan[37, 5] = np.nan
    cases = (
        ("name", {"image.npy": cal}, "has no pixels.npy for input 'pixels'"),
        ("dtype", {"pixels.npy": cal.astype(np.float64)},
         "kiln_calibration/pixels.npy: input 'pixels' is float64, the signature wants float32"),
        ("shape", {"pixels.npy": cal[:, :63]},
         "kiln_calibration/pixels.npy: input 'pixels' dimension 1 is 63, the signature wants 64"),
        ("nan", {"pixels.npy": nan},
         "kiln_calibration/pixels.npy: input 'pixels' holds NaN at sample 37"),
        ("few", {"pixels.npy": cal[:4], "b.npz": {"pixels": cal[4:9]}},
         "kiln_calibration' has 9 samples; at least 10 are needed"),
        ("member", {"pixels.npy": cal, "b.npz": {"x": cal}},
         "kiln_calibration/b.npz' has no array 'pixels' for input 'pixels'"),
        ("damaged", {"pixels.npy": b"\x93NUMPY\x01\x00garbage"}, "input 'pixels': "),
    )
    for name, folder, why in cases:
        base = version(tmp_path / name, cal, folder)
        srv = Server(base, name, "--allow_compression")
        try:
            (line,) = load_lines(srv)
            assert " compression=off compression_reason=\"bad calibration data: " in line, line
            assert why in line, line
            assert precision_gauge(srv, name) == "fp32"
            got = predict(srv, name, x)
        finally:
            srv.kill()
        assert np.abs(got - fp32).max() < 1e-5, name


@pytest.mark.skipif(not VNNI, reason="no VNNI on this CPU: no int8 kernels")
def test_served_kiln_files_report_their_precision(tmp_path, data):
    """A version holding model.kiln reports the precision the file was compiled to (the
    gauge and the metadata), without --allow_compression: dynamic int8, static int8 (a
    quantized graph in an fp32 session) and fp32; the answers are the file's."""
    import subprocess
    cal, x = data
    (tmp_path / "cal").mkdir()
    np.save(tmp_path / "cal" / "pixels.npy", cal)
    cases = {"fp32": ["--precision", "fp32"], "int8": ["--precision", "int8"],
             "static": ["--precision", "int8", "--calibration-method", "minmax"]}
    for tag, extra in cases.items():
        base = tmp_path / tag
        (base / "1").mkdir(parents=True)
        art = base / "1" / "model.kiln"
        r = subprocess.run([test_serve.KILN, "compile", str(DIGITS), "-o", str(art), "--calibration",
                            str(tmp_path / "cal"), "--max-drop", "100%", "--runs", "1", *extra],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        srv = Server(base, tag)
        try:
            want = "fp32" if tag == "fp32" else "int8"
            assert precision_gauge(srv, tag) == want
            assert metadata_precision(srv, tag) == want
            got = predict(srv, tag, x)
        finally:
            srv.kill()
        np.save(tmp_path / f"{tag}_x.npy", x)
        r = subprocess.run([test_serve.KILN, "predict", str(art), "--input",
                            f"pixels={tmp_path / f'{tag}_x.npy'}", "--output-dir",
                            str(tmp_path / f"{tag}_o")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        out = sorted((tmp_path / f"{tag}_o").glob("*.npy"))
        assert len(out) == 1, out
        np.testing.assert_allclose(got, np.load(out[0]), rtol=1e-6, atol=1e-7)
