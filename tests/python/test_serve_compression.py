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


def version(base, rows):
    """base/1 holding the digits MLP and, when rows is not None, a warmup
    file of predict requests of 20 rows each."""
    (base / "1").mkdir(parents=True)
    shutil.copy(DIGITS, base / "1" / "model.onnx")
    if rows is not None:
        write_warmup(base / "1", tfrecord([predict_log({"pixels": rows[i:i + 20]})
                                           for i in range(0, len(rows), 20)]))
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
