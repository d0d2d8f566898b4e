"""Tests for `kiln bench`: the JSON report, the text report, and how inputs are made.

`kiln bench` times a model on random inputs (src/cli/cmd_bench.c). These
tests check the contract, not the speed: every documented JSON key is there
and sane (positive times, ordered percentiles, throughput = batch * 1000 /
median), the batch and --dim sizes reach the input shapes, and a bad command
line or an unsizeable symbolic dim is one clear error. They use the bundled
models/digits/1/model.onnx and tiny onnx.helper models, with --iterations 3, so they
take well under a second each.

The binary is $KILN_BIN, or build/kiln in this checkout; the tests skip with
a message when it is missing.
"""

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KILN = os.environ.get("KILN_BIN") or str(REPO / "build" / "kiln")
DIGITS = REPO / "models" / "digits" / "1" / "model.onnx"

pytestmark = pytest.mark.skipif(
    not (os.path.isfile(KILN) and os.access(KILN, os.X_OK)),
    reason=f"kiln binary not found at {KILN} (build it, or set KILN_BIN)",
)

REQUIRED_KEYS = {
    "load_ms", "model_load_ms", "session_create_ms", "first_inference_ms",
    "load_to_first_inference_ms", "median_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms",
    "max_ms", "throughput_per_s", "peak_rss_mb", "batch", "threads", "cpus", "iterations",
    "warmup",
    "inputs", "outputs", "model", "signature", "nonfinite_outputs",
}


def kiln(*args, **kw):
    return subprocess.run([KILN, *map(str, args)], capture_output=True, text=True,
                          errors="replace", timeout=120, **kw)


def bench_json(*args, **kw):
    r = kiln("bench", *args, "--json", **kw)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    return json.loads(r.stdout)


def assert_one_line_error(r, *needles, code=None):
    assert r.returncode != 0 if code is None else r.returncode == code, r
    err = r.stderr.strip()
    assert err and "\n" not in err, f"expected one line on stderr, got:\n{err}"
    assert err.startswith("kiln"), err
    for n in needles:
        assert str(n) in err, f"{n!r} not in {err!r}"


def test_help_lists_options():
    r = kiln("bench", "--help")
    assert r.returncode == 0
    for opt in ("--batch", "--threads", "--iterations", "--warmup", "--dim", "--signature",
                "--json"):
        assert opt in r.stdout
    assert "bench" in kiln("--help").stdout


def test_json_keys_and_sanity():
    j = bench_json(DIGITS, "--batch", 8, "--threads", 2, "--iterations", 3, "--warmup", 1)
    missing = REQUIRED_KEYS - set(j)
    assert not missing, f"missing keys {missing}"
    assert (j["batch"], j["threads"], j["iterations"], j["warmup"]) == (8, 2, 3, 1)
    assert j["signature"] == "serving_default"
    assert j["inputs"] == [{"name": "pixels", "dtype": "float32", "shape": [8, 64]}]
    assert j["outputs"] == [{"name": "probabilities", "dtype": "float32", "shape": [8, 10]}]
    for k in ("load_ms", "model_load_ms", "first_inference_ms", "median_ms", "p90_ms",
              "p99_ms", "mean_ms", "min_ms", "max_ms", "throughput_per_s", "peak_rss_mb"):
        assert isinstance(j[k], (int, float)) and math.isfinite(j[k]) and j[k] > 0, (k, j[k])
    assert j["session_create_ms"] >= 0
    assert j["min_ms"] <= j["median_ms"] <= j["p90_ms"] <= j["p99_ms"] <= j["max_ms"]
    assert j["load_ms"] == pytest.approx(j["model_load_ms"] + j["session_create_ms"], abs=2e-3)
    assert j["load_to_first_inference_ms"] == pytest.approx(
        j["load_ms"] + j["first_inference_ms"], abs=2e-3)
    # median_ms is printed to the nanosecond; allow for that rounding
    assert j["throughput_per_s"] == pytest.approx(8 * 1000 / j["median_ms"], rel=5e-3)
    assert 1 < j["peak_rss_mb"] < 4096
    assert j["nonfinite_outputs"] == 0


def cpus_allowed():
    """CPUs this process may use: its affinity mask, bounded by a cgroup v2 quota."""
    n = len(os.sched_getaffinity(0))
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
        if quota != "max":
            n = min(n, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return n


@pytest.mark.parametrize("env", [{}, {"OMP_PROC_BIND": "true"},
                                 {"OMP_PROC_BIND": "spread", "OMP_PLACES": "cores"}])
def test_cpus_counted_whatever_the_openmp_binding(env):
    # With OMP_PROC_BIND set, OpenMP pins the main thread to one CPU before main(); Kiln
    # must still count (and use) every CPU the process may run on, not that one.
    j = bench_json(DIGITS, "--iterations", 2, env={**os.environ, **env})
    assert j["cpus"] == cpus_allowed(), (env, j["cpus"])


def test_cpus_follow_the_affinity_mask():
    first = sorted(os.sched_getaffinity(0))[0]
    j = bench_json(DIGITS, "--iterations", 2,
                   preexec_fn=lambda: os.sched_setaffinity(0, {first}))
    assert j["cpus"] == 1


def test_text_report():
    r = kiln("bench", DIGITS, "--batch", 2, "--iterations", 3)
    assert r.returncode == 0, r.stderr
    for word in ("load:", "first run:", "median", "p90", "p99", "throughput:", "peak RSS:",
                 "pixels float32[2,64]"):
        assert word in r.stdout, word


@pytest.fixture(scope="module")
def symbolic_model(tmp_path_factory):
    """x float32 [batch, seq], ids int64 [batch, seq], attention_mask int64 [batch, seq]
    -> y = x + float(ids) + float(mask), so the outputs show the inputs' values."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    dims = ["batch", "seq"]
    graph = helper.make_graph(
        [helper.make_node("Cast", ["ids"], ["idsf"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["x", "idsf"], ["t"]),
         helper.make_node("Add", ["t", "maskf"], ["y"])],
        "sym",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims),
         helper.make_tensor_value_info("ids", TensorProto.INT64, dims),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path_factory.mktemp("bench") / "sym.onnx"
    onnx.save(model, str(path))
    return path


def test_symbolic_dims_from_batch_and_dim(symbolic_model):
    j = bench_json(symbolic_model, "--batch", 3, "--dim", "seq=5", "--iterations", 3)
    assert [i["shape"] for i in j["inputs"]] == [[3, 5]] * 3
    assert j["outputs"][0]["shape"] == [3, 5]
    assert j["throughput_per_s"] == pytest.approx(3 * 1000 / j["median_ms"], rel=5e-3)


def test_symbolic_dim_without_size_is_named(symbolic_model):
    r = kiln("bench", symbolic_model, "--iterations", 3)
    assert_one_line_error(r, "seq", "--dim seq=SIZE", code=1)


@pytest.fixture(scope="module")
def range_model(tmp_path_factory):
    """A model whose one output is log(1) = 0 when its inputs follow bench's
    documented scheme and log(0) = -inf otherwise, which bench reports as
    nonfinite_outputs: x float32 in [-1, 1) reaching below -0.9 and above 0.9,
    ids int64 in [0, 100) reaching above 90, attention_mask int64 all 1."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    def const(name, value):
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(
            name, TensorProto.FLOAT, [], [value]))

    nodes = [const(n, v) for n, v in
             (("m1", -1.0), ("p1", 1.0), ("zero", 0.0), ("hundred", 100.0), ("m09", -0.9),
              ("p09", 0.9), ("ninety", 90.0))]
    nodes += [
        helper.make_node("Cast", ["ids"], ["idsf"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("GreaterOrEqual", ["x", "m1"], ["x_lo"]),
        helper.make_node("Less", ["x", "p1"], ["x_hi"]),
        helper.make_node("GreaterOrEqual", ["idsf", "zero"], ["id_lo"]),
        helper.make_node("Less", ["idsf", "hundred"], ["id_hi"]),
        helper.make_node("Equal", ["maskf", "p1"], ["mask_one"]),
        helper.make_node("And", ["x_lo", "x_hi"], ["a1"]),
        helper.make_node("And", ["id_lo", "id_hi"], ["a2"]),
        helper.make_node("And", ["a1", "a2"], ["a3"]),
        helper.make_node("And", ["a3", "mask_one"], ["ok"]),
        helper.make_node("Cast", ["ok"], ["okf"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMin", ["okf"], ["all_ok"], keepdims=0),
        # spread: min(x) < -0.9, max(x) > 0.9, max(ids) > 90
        helper.make_node("ReduceMin", ["x"], ["xmin"], keepdims=0),
        helper.make_node("ReduceMax", ["x"], ["xmax"], keepdims=0),
        helper.make_node("ReduceMax", ["idsf"], ["idmax"], keepdims=0),
        helper.make_node("Less", ["xmin", "m09"], ["s1"]),
        helper.make_node("Greater", ["xmax", "p09"], ["s2"]),
        helper.make_node("Greater", ["idmax", "ninety"], ["s3"]),
        helper.make_node("And", ["s1", "s2"], ["s12"]),
        helper.make_node("And", ["s12", "s3"], ["spread"]),
        helper.make_node("Cast", ["spread"], ["spreadf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["all_ok", "spreadf"], ["verdict"]),
        helper.make_node("Log", ["verdict"], ["y"]),
    ]
    dims = ["batch", "seq"]
    graph = helper.make_graph(
        nodes, "ranges",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims),
         helper.make_tensor_value_info("ids", TensorProto.INT64, dims),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    path = tmp_path_factory.mktemp("bench") / "ranges.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_input_values_follow_the_scheme(range_model):
    j = bench_json(range_model, "--batch", 64, "--dim", "seq=64", "--iterations", 3)
    assert j["outputs"] == [{"name": "y", "dtype": "float32", "shape": []}]
    assert j["nonfinite_outputs"] == 0, "inputs outside the documented ranges"
    # the negative control: ids up to 126 break "ids < 100"
    j = bench_json(range_model, "--batch", 64, "--dim", "seq=64", "--iterations", 3,
                   "--int-high", 127)
    assert j["nonfinite_outputs"] == 1


def test_bad_command_lines():
    assert_one_line_error(kiln("bench"), "missing MODEL", code=2)
    assert_one_line_error(kiln("bench", DIGITS, "--iterations", 0), "--iterations", code=2)
    assert_one_line_error(kiln("bench", DIGITS, "--batch", "x"), "--batch", code=2)
    assert_one_line_error(kiln("bench", DIGITS, "--dim", "seq"), "NAME=SIZE", code=2)
    assert_one_line_error(kiln("bench", DIGITS, "--frobnicate"), "--frobnicate", code=2)
    assert_one_line_error(kiln("bench", DIGITS, "--dim", "batch=4"), "--batch", code=2)
    assert_one_line_error(kiln("bench", DIGITS, "--dim", "seq=4", "--iterations", 3),
                          "seq", code=1)
    assert_one_line_error(kiln("bench", DIGITS, "--signature", "nope"), "nope", code=1)
    assert_one_line_error(kiln("bench", REPO / "no-such-model.onnx"), "no-such-model", code=1)
