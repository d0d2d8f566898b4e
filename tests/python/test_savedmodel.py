"""test_savedmodel.py - TensorFlow SavedModel import, end to end through the CLI.

Drives `kiln inspect DIR --json` and `kiln predict DIR --signature NAME
--input x=FILE.npy --output-dir OUT` on:

  * every SavedModel in ../shared/testdata/savedmodels (38 real models; see
    its README): each either loads and gives the known right answers, or is
    refused with a message naming what is missing (docs/SAVEDMODEL.md keeps
    the same table);
  * malformed SavedModels built in tmp_path from copies of small shared
    models (truncated and bit-flipped saved_model.pb, missing, truncated and
    corrupted variables, a missing signature key, attributes nested 100,000
    deep) and the synthetic corpus of tools/make_savedmodel_corpus.py
    (recursive functions, call chains, cycles, bad tensors, ...): each loads
    or fails with one "kiln: ..." line; none crashes or hangs.

tf.Example inputs for the classify/regress signatures are serialized here by
hand (the protobuf wire format of tensorflow.Example), so no TensorFlow is
needed. KILN_BIN is the kiln binary (default build/kiln); KILN_TESTDATA the
shared test data (default ../shared/testdata); tests needing what is absent
skip with a message.
"""
import json
import os
import pathlib
import random
import re
import shutil
import stat
import struct
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
KILN = pathlib.Path(os.environ.get("KILN_BIN") or ROOT / "build" / "kiln")
TESTDATA = pathlib.Path(os.environ.get("KILN_TESTDATA") or ROOT.parent / "shared" / "testdata")
SM = TESTDATA / "savedmodels"
CORPUS = ROOT / "tests" / "corpus" / "savedmodel"
TIMEOUT_S = 60

sys.path.insert(0, str(ROOT / "tools"))
import make_savedmodel_corpus as corpus  # noqa: E402

pytestmark = pytest.mark.skipif(not os.access(KILN, os.X_OK),
                                reason=f"kiln binary not found at {KILN} (build it, or set KILN_BIN)")
needs_testdata = pytest.mark.skipif(not SM.is_dir(),
                                    reason=f"shared SavedModels not found at {SM} (set KILN_TESTDATA)")

# ---------------------------------------------------------------- helpers


def kiln(*args, timeout=TIMEOUT_S):
    return subprocess.run([str(KILN), *map(str, args)], capture_output=True, text=True,
                          errors="replace", timeout=timeout)


def assert_clean_error(r, pattern=None):
    """Refused: exit 1 (not a signal), one 'kiln: ...' line, no sanitizer report."""
    assert r.returncode == 1, f"exit {r.returncode}; stderr: {r.stderr[-2000:]}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kiln: "), r.stderr[-2000:]
    if pattern:
        assert re.search(pattern, lines[0], re.I), f"{pattern!r} not in: {lines[0]}"
    return lines[0]


def assert_loads_or_clean_error(r):
    if r.returncode == 0:
        return
    assert_clean_error(r)


def model(rel):
    d = SM / rel
    if not d.is_dir():
        pytest.skip(f"{d} not found")
    return d


def inspect_json(d, *extra):
    r = kiln("inspect", d, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def predict(d, inputs, signature=None, tmp=None, expect_ok=True, tags=None):
    """Run `kiln predict`; returns {output alias: array} (or the process on error)."""
    tmp = pathlib.Path(tmp)
    out = tmp / "out"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    args = ["predict", d, "--output-dir", out]
    if signature:
        args += ["--signature", signature]
    if tags:
        args += ["--tags", tags]
    for i, (name, arr) in enumerate(inputs.items()):
        p = tmp / f"in{i}.npy"
        np.save(p, arr)
        args += ["--input", f"{name}={p}"]
    r = kiln(*args)
    if not expect_ok:
        return r
    assert r.returncode == 0, r.stderr
    return {p.stem: np.load(p) for p in out.glob("*.npy")}


def copy_model(src, dst):
    """Copy a (read-only) shared model folder to a writable place."""
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR | (stat.S_IXUSR if p.is_dir() else 0))
    return dst


# tf.Example, serialized by hand: Example{features: Features{feature: map<string, Feature>}},
# Feature{bytes_list = 1 | float_list = 2 | int64_list = 3}, each list {repeated value = 1}.
def tf_example(**features):
    body = b""
    for key, values in features.items():
        if isinstance(values[0], float):
            feat = corpus.f_len(2, corpus.f_len(1, b"".join(struct.pack("<f", v) for v in values)))
        elif isinstance(values[0], int):
            feat = corpus.f_len(3, corpus.f_len(1, b"".join(corpus.varint(v) for v in values)))
        else:
            feat = corpus.f_len(1, b"".join(corpus.f_len(1, v) for v in values))
        body += corpus.f_len(1, corpus.f_len(1, key) + corpus.f_len(2, feat))
    return corpus.f_len(1, body)


def examples(*dicts):
    return np.array([tf_example(**d) for d in dicts], dtype=object).astype("S")


# ------------------------------------------------ every shared model: load or refuse

SERVING = "serving/tensorflow_serving/servables/tensorflow/testdata/"
TFCC = "tensorflow/tensorflow/cc/saved_model/testdata/"
MLNET = "machinelearning-testdata/Microsoft.ML.TensorFlow.TestModels/"
TFJS = "tfjs/tfjs-node/test_objects/saved_model/"
HP2_SIGS = ["classify_x2_to_y3", "classify_x_to_y", "regress_x2_to_y3", "regress_x_to_y",
            "regress_x_to_y2", "serving_default"]
HP2_SIGS_NO_CX2 = [s for s in HP2_SIGS if s != "classify_x2_to_y3"]

# path -> list of signature names (loads) or a regex the refusal must match
MODELS = {
    MLNET + "cifar_saved_model": ["serving_default"],
    MLNET + "mnist_conv_model": ["serving_default"],
    MLNET + "mnist_lr_model": ["serving_default"],
    MLNET + "model_matmul": ["serving_default"],
    MLNET + "model_primitive_input_test": ["serving_default"],
    MLNET + "model_shape_test": ["serving_default"],
    MLNET + "model_string_test": ["serving_default"],
    MLNET + "model_types_test": ["serving_default"],
    "serving/tensorflow_serving/batching/testdata/matrix_half_plus_two/1": ["serving_default"],
    SERVING + "saved_model_counter/00000123":
        ["get_counter", "incr_counter", "incr_counter_by", "reset_counter"],
    SERVING + "saved_model_half_plus_three/00000123":
        ["serving_default", "tensorflow/serving/regress"],
    SERVING + "saved_model_half_plus_two_2_versions/00000123": HP2_SIGS,
    SERVING + "saved_model_half_plus_two_2_versions/00000124": HP2_SIGS,
    SERVING + "saved_model_half_plus_two_cpu/00000123": HP2_SIGS_NO_CX2,
    SERVING + "saved_model_half_plus_two_cpu_with_empty_saved_model_config/00000123": HP2_SIGS,
    SERVING + "saved_model_half_plus_two_cpu_with_saved_model_config/00000123": HP2_SIGS,
    SERVING + "saved_model_half_plus_two_gpu/00000123": HP2_SIGS,
    SERVING + "saved_model_half_plus_two_gpu_trt/00000123": HP2_SIGS_NO_CX2,
    SERVING + "saved_model_half_plus_two_mkl/00000123": HP2_SIGS_NO_CX2,
    SERVING + "saved_model_half_plus_two_mlmd/00000123": HP2_SIGS_NO_CX2,
    SERVING + "saved_model_half_plus_two_tf2_cpu/00000123": HP2_SIGS,
    "tensorflow-onnx/tests/models/regression/saved_model": ["serving_default"],
    "tensorflow-onnx/tests/models/saved_model_with_redundant_inputs": ["serving_default"],
    TFCC + "half_plus_two/00000123": HP2_SIGS,
    TFCC + "half_plus_two_main_op/00000123": HP2_SIGS,
    TFCC + "half_plus_two_pbtxt/00000123": HP2_SIGS,
    TFCC + "half_plus_two_v2/00000123": HP2_SIGS_NO_CX2,
    TFCC + "x_plus_y_v2_debuginfo": ["serving_default"],
    TFJS + "int64_multiply": ["serving_default"],
    TFJS + "model_multi_output": ["serving_default"],
    TFJS + "model_single_input_multi_output": ["serving_default"],
    TFJS + "module_with_multiple_signatures": ["serving_default", "timestwo"],
    TFJS + "times_three_float": ["serving_default"],
    TFJS + "times_two_int": ["serving_default"],
    TFJS + "uint8_multiply": ["serving_default"],
    "tfx/tfx/components/testdata/trainer/current/Format-Serving/export/chicago-taxi/1646034756":
        r"op 'AsString'.*not support",
    "tfx/tfx/components/testdata/trainer/keras/Format-Serving": ["serving_default"],
    "tfx/tfx/components/testdata/transform/transform_graph/transform_fn":
        r"no MetaGraphDef with tags 'serve'.*'transform'",
    # TF2 control flow and Keras recurrent layers (While loops over TensorLists)
    "iteam1-predict-series-data-with-RNN/lstm_model": ["serving_default"],
    "iteam1-predict-series-data-with-RNN/gru_model": ["serving_default"],
    "Dachkovski-simple_tensorflow_serving/models/lstm/1": ["serving_default"],
    "tensorflow/tensorflow/c/experimental/saved_model/internal/testdata/SimpleWhileLoop":
        ["serving_default"],
}


@needs_testdata
def test_table_covers_every_shared_savedmodel():
    found = {str(p.parent.relative_to(SM)) for p in SM.rglob("saved_model.pb*")}
    assert found == set(MODELS), f"README models not in the table: {found ^ set(MODELS)}"


@needs_testdata
@pytest.mark.parametrize("rel", sorted(MODELS))
def test_every_model_loads_or_is_refused(rel):
    d = model(rel)
    want = MODELS[rel]
    r = kiln("inspect", d, "--json")
    if isinstance(want, str):
        assert_clean_error(r, want)
        return
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["format"] == "savedmodel"
    names = [s["name"] for s in info["signatures"]]
    assert sorted(names) == sorted(want)
    for s in info["signatures"]:
        for io in s["inputs"] + s["outputs"]:
            assert io["name"] and ":" not in io["name"], f"not an alias: {io['name']}"


@needs_testdata
def test_transform_graph_with_its_own_tags_is_refused_clearly():
    d = model("tfx/tfx/components/testdata/transform/transform_graph/transform_fn")
    assert_clean_error(kiln("inspect", d, "--tags", "transform"),
                       r"signature 'transform_signature'.*(sparse|composite|not support)")


# ------------------------------------------------------------- right answers

# Known answers of the loop models (../shared/testdata/README.md: TF's own
# C-API test, the repo notebook, and a NumPy re-implementation of Keras'
# cells reading the checkpoints).
SIMPLE_WHILE = "tensorflow/tensorflow/c/experimental/saved_model/internal/testdata/SimpleWhileLoop"
MSFT_WINDOWS = np.array([[294.85, 294.23, 292.88, 296.31, 302.75],
                         [229.56416184, 172.56306615, 301.24160457, 272.47018967, 223.16284409]],
                        np.float32).reshape(2, 5, 1)


@needs_testdata
@pytest.mark.parametrize("value,want", [(10.0, 55.0), (3.0, 6.0), (2.5, 4.5), (0.0, 0.0),
                                        (-2.0, 0.0)])
def test_simple_while_loop(tmp_path, value, want):
    # compute(v): acc = 0; while v > 0: acc += v; v -= 1
    got = predict(model(SIMPLE_WHILE), {"value": np.array(value, np.float32)},
                  tmp=tmp_path)["output_0"]
    assert got.shape == () and got == want


@needs_testdata
@pytest.mark.parametrize("rel,inp,out,want", [
    ("iteam1-predict-series-data-with-RNN/lstm_model", "input_6", "dense_17", [299.2193, 231.69974]),
    ("iteam1-predict-series-data-with-RNN/gru_model", "input_10", "dense_29", [297.93964, 228.84355]),
])
def test_keras_recurrent_models(tmp_path, rel, inp, out, want):
    d = model(rel)
    got = predict(d, {inp: MSFT_WINDOWS}, tmp=tmp_path)[out]
    assert got.shape == (2, 1)
    np.testing.assert_allclose(got[:, 0], want, rtol=2e-6)
    # one row at a time gives the same answers (the loop's batch is dynamic)
    got1 = predict(d, {inp: MSFT_WINDOWS[1:]}, tmp=tmp_path)[out]
    np.testing.assert_allclose(got1[:, 0], want[1:], rtol=2e-6)


@needs_testdata
@pytest.mark.parametrize("rel,fused", [
    ("iteam1-predict-series-data-with-RNN/lstm_model", {"LSTM": 1}),
    ("Dachkovski-simple_tensorflow_serving/models/lstm/1", {"LSTM": 3}),
    ("iteam1-predict-series-data-with-RNN/gru_model", {"GRU": 1}),
])
def test_keras_recurrent_loops_become_recurrent_ops(rel, fused):
    # the Keras LSTM and GRU loops are replaced by Kiln's LSTM and GRU ops
    ops = inspect_json(model(rel))["ops"]
    for op, count in fused.items():
        assert ops.get(op) == count, ops
    assert "Loop" not in ops


@needs_testdata
def test_stacked_sigmoid_lstms(tmp_path):
    d = model("Dachkovski-simple_tensorflow_serving/models/lstm/1")
    zeros = predict(d, {"input": np.zeros((1, 60, 5), np.float32)}, tmp=tmp_path)["output"]
    assert zeros.shape == (1, 60)
    np.testing.assert_allclose(zeros[0, :4], [0.402595, 0.462870, 0.445517, 0.374754], atol=2e-6)
    np.testing.assert_allclose(zeros.mean(), 0.404064, atol=2e-6)
    ramp = (np.arange(300, dtype=np.float32) / 300).reshape(1, 60, 5)
    got = predict(d, {"input": ramp}, tmp=tmp_path)["output"]
    np.testing.assert_allclose(got.mean(), 0.404109, atol=2e-6)
    assert not np.allclose(got, zeros)  # the input reaches the output

HP2_DIRS = [rel for rel, sigs in MODELS.items() if isinstance(sigs, list) and "regress_x_to_y2" in sigs]
X = np.array([[1.0], [2.0], [3.0]], np.float32)


def hp2_variables(rel):
    """(a, b, c) of a half_plus_two model; the x2 signatures use a2 and c2 where present."""
    return 0.5, 2.0, 3.0


@needs_testdata
@pytest.mark.parametrize("rel", HP2_DIRS)
def test_half_plus_two_family(rel, tmp_path):
    d = model(rel)
    sigs = MODELS[rel]
    tf2 = "tf2_cpu" in rel
    x = X[:1, 0] if tf2 else X            # TF2 export: x is float32[1]
    got = predict(d, {"x": x}, tmp=tmp_path)["y"]
    np.testing.assert_allclose(got, 0.5 * x + 2, rtol=1e-6)
    # the x2 -> y3 signatures: y = 0.5 x + 3 (mkl: broadcast against a [1,10,10,1] branch)
    for sig in [s for s in sigs if "x2_to_y3" in s]:
        alias = "scores" if sig.startswith("classify") else "outputs"
        xin = X[:1] if "mkl" in rel else x
        got = predict(d, {"inputs": xin}, signature=sig, tmp=tmp_path)[alias]
        if "mkl" in rel:
            assert got.shape == (1, 10, 10, 1)
            np.testing.assert_allclose(got, np.full((1, 10, 10, 1), 3.5, np.float32), rtol=1e-6)
        else:
            np.testing.assert_allclose(got, 0.5 * xin + 3, rtol=1e-6)
    # classify / regress through serialized tf.Example
    ex = examples({"x": [1.0], "x2": [4.0]}, {"x": [3.0], "x2": [6.0]})
    want = {"regress_x_to_y": [[2.5], [3.5]], "classify_x_to_y": [[2.5], [3.5]],
            "regress_x_to_y2": [[3.5], [4.5]]}
    for sig, expect in want.items():
        if sig not in sigs or ("mkl" in rel and sig == "regress_x_to_y2"):
            continue  # mkl's y2 broadcasts against a [1,10,10,1] branch: one example, below
        alias = "scores" if sig.startswith("classify") else "outputs"
        got = predict(d, {"inputs": ex}, signature=sig, tmp=tmp_path)[alias]
        np.testing.assert_allclose(got, np.array(expect, np.float32), rtol=1e-6)
    if "mkl" in rel:
        got = predict(d, {"inputs": ex[:1]}, signature="regress_x_to_y2", tmp=tmp_path)["outputs"]
        np.testing.assert_allclose(got, np.full((1, 10, 10, 1), 3.5, np.float32), rtol=1e-6)


@needs_testdata
def test_tf_example_missing_required_feature_is_an_error(tmp_path):
    d = model(TFCC + "half_plus_two/00000123")
    r = predict(d, {"inputs": examples({"x2": [1.0]})}, signature="regress_x_to_y",
                tmp=tmp_path, expect_ok=False)
    assert_clean_error(r, r"'x'")


@needs_testdata
def test_tf_example_default_for_optional_feature(tmp_path):
    d = model(TFCC + "half_plus_two/00000123")  # x2 defaults to 0 when absent
    got = predict(d, {"inputs": examples({"x": [1.0]})}, signature="regress_x_to_y",
                  tmp=tmp_path)["outputs"]
    np.testing.assert_allclose(got, [[2.5]])


@needs_testdata
def test_half_plus_three(tmp_path):
    d = model(SERVING + "saved_model_half_plus_three/00000123")
    got = predict(d, {"x": X}, tmp=tmp_path)["y"]
    np.testing.assert_allclose(got, 0.5 * X + 3, rtol=1e-6)
    # the regress signature takes one serialized example (a scalar string)
    ex = np.array(tf_example(x=[4.0]), dtype=object).astype("S")
    got = predict(d, {"inputs": ex}, signature="tensorflow/serving/regress", tmp=tmp_path)["outputs"]
    np.testing.assert_allclose(got.ravel(), [5.0], rtol=1e-6)


@needs_testdata
def test_matrix_half_plus_two(tmp_path):
    d = model("serving/tensorflow_serving/batching/testdata/matrix_half_plus_two/1")
    x = np.arange(18, dtype=np.float32).reshape(2, 3, 3)
    np.testing.assert_allclose(predict(d, {"x": x}, tmp=tmp_path)["y"], 0.5 * x + 2)


@needs_testdata
@pytest.mark.parametrize("sig,inputs,want", [
    ("get_counter", {}, 0.0),
    ("incr_counter", {}, 1.0),
    ("incr_counter_by", {"delta": np.array(2.5, np.float32)}, 2.5),
    ("reset_counter", {}, 0.0),
])
def test_counter_signatures_in_a_fresh_process(tmp_path, sig, inputs, want):
    # each kiln predict starts from the checkpoint (counter = 0); state that
    # persists across requests is checked through the server in
    # test_savedmodel_state.py
    d = model(SERVING + "saved_model_counter/00000123")
    out = predict(d, inputs, tmp=tmp_path, signature=sig)
    assert out["output"].dtype == np.float32 and out["output"] == want


@needs_testdata
@pytest.mark.parametrize("name,inputs,want", [
    ("times_three_float", {"x": np.array(2.5, np.float32)}, {"output_0": np.float32(7.5)}),
    ("times_two_int", {"x": np.array(7, np.int32)}, {"output_0": np.int32(14)}),
    ("int64_multiply", {"x": np.array([3, 4], np.int64)}, {"output_0": np.array([18, 24], np.int64)}),
    ("uint8_multiply", {"x": np.array([3], np.uint8)}, {"output_0": np.array([18], np.int32)}),
    ("model_multi_output", {"x": np.array(3, np.int32), "y": np.array(5, np.int32)},
     {"output_0": np.int32(6), "output_1": np.int32(5)}),
    ("model_single_input_multi_output", {"x": np.array(3, np.int32)},
     {"output_0": np.int32(6), "output_1": np.int32(3)}),
    ("module_with_multiple_signatures", {"x": np.array(2.0, np.float32)},
     {"output_0": np.float32(6.0)}),
])
def test_tfjs_modules(name, inputs, want, tmp_path):
    got = predict(model(TFJS + name), inputs, tmp=tmp_path)
    assert set(got) == set(want)
    for k, v in want.items():
        v = np.asarray(v)
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, (k, got[k].dtype, got[k].shape)
        np.testing.assert_array_equal(got[k], v)


@needs_testdata
def test_tfjs_second_signature(tmp_path):
    d = model(TFJS + "module_with_multiple_signatures")
    got = predict(d, {"x": np.array(2.0, np.float32)}, signature="timestwo", tmp=tmp_path)
    np.testing.assert_array_equal(got["output_0"], np.float32(4.0))


@needs_testdata
def test_x_plus_y(tmp_path):
    d = model(TFCC + "x_plus_y_v2_debuginfo")
    got = predict(d, {"x": np.array(2.0, np.float32), "y": np.array(5.5, np.float32)},
                  tmp=tmp_path)
    np.testing.assert_array_equal(got["output_0"], np.float32(7.5))


@needs_testdata
def test_string_concatenation(tmp_path):
    d = model(MLNET + "model_primitive_input_test")
    got = predict(d, {"input1": np.array([b"ab", b"c"]), "input2": np.array([b"X", b"YZ"])},
                  tmp=tmp_path)
    assert got["string_merge"].tolist() == [b"abX", b"cYZ"]


@needs_testdata
def test_string_split_and_join(tmp_path):
    d = model(MLNET + "model_string_test")
    a = np.array([[b"a", b"b"], [b"c", b"d"]])
    got = predict(d, {"A": a, "B": np.array([b"x/y", b"z"])}, tmp=tmp_path)
    assert got["Original_A"].tolist() == a.tolist()
    assert got["Joined_Splited_Text"].tolist() == [[b"x y z"]]


@needs_testdata
def test_identity_over_eleven_dtypes(tmp_path):
    d = model(MLNET + "model_types_test")
    # the README notes u8/u16/u32 were exported as int8/int16/int32
    dtypes = {"b": np.bool_, "f32": np.float32, "f64": np.float64, "i16": np.int16,
              "i32": np.int32, "i64": np.int64, "i8": np.int8, "u16": np.int16,
              "u32": np.int32, "u64": np.uint64, "u8": np.int8}
    inputs = {k: np.array([[1, 0], [1, 1], [0, 1]], dt) for k, dt in dtypes.items()}
    got = predict(d, inputs, tmp=tmp_path)
    assert len(got) == 11
    for k, v in inputs.items():
        assert got["o_" + k].dtype == v.dtype
        np.testing.assert_array_equal(got["o_" + k], v)


@needs_testdata
def test_partially_known_shapes(tmp_path):
    d = model(MLNET + "model_shape_test")
    inputs = {"OneDim": np.arange(3, dtype=np.float32),
              "TwoDim": np.arange(6, dtype=np.float32).reshape(2, 3),
              "ThreeDim": np.arange(8, dtype=np.float32).reshape(1, 4, 2),
              "FourDim": np.arange(12, dtype=np.float32).reshape(1, 2, 2, 3),
              "FourDimKnown": np.arange(16, dtype=np.float32).reshape(2, 2, 2, 2)}
    got = predict(d, inputs, tmp=tmp_path)
    np.testing.assert_array_equal(got["o_OneDim"], inputs["OneDim"].reshape(1, 3))
    for k in ["TwoDim", "ThreeDim", "FourDim", "FourDimKnown"]:
        np.testing.assert_array_equal(got["o_" + k], inputs[k])


@needs_testdata
def test_batch_matmul(tmp_path):
    d = model(MLNET + "model_matmul")
    a = np.random.default_rng(1).standard_normal((3, 2, 2)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((3, 2, 2)).astype(np.float32)
    np.testing.assert_allclose(predict(d, {"a": a, "b": b}, tmp=tmp_path)["c"], a @ b, rtol=1e-5)


@needs_testdata
def test_redundant_input_is_accepted(tmp_path):
    d = model("tensorflow-onnx/tests/models/saved_model_with_redundant_inputs")
    x = np.arange(10, dtype=np.float32).reshape(1, 10)
    got = predict(d, {"x": x, "y": np.zeros((1, 10), np.float32)}, tmp=tmp_path)
    np.testing.assert_allclose(got["z"], x + 1)


@needs_testdata
def test_linear_regression_uses_the_checkpoint(tmp_path):
    d = model("tensorflow-onnx/tests/models/regression/saved_model")
    # variables.data holds W then b (keys in sorted order) as little-endian float32
    w, b = struct.unpack("<2f", next((d / "variables").glob("variables.data-*")).read_bytes()[:8])
    x = np.array([-1.0, 0.0, 2.5], np.float32)
    np.testing.assert_allclose(predict(d, {"X": x}, tmp=tmp_path)["pred"], w * x + b, rtol=1e-5)


def softmax_rows_ok(y, classes):
    assert y.shape[1] == classes and np.all(np.isfinite(y)) and np.all(y >= 0)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-4)


def checkpoint(d):
    """The model's variables, read by the test's own TensorBundle reader (not Kiln's)."""
    from tensor_bundle_ref import read_bundle
    return read_bundle(d / "variables" / "variables")


def softmax64(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@needs_testdata
def test_mnist_lr(tmp_path):
    # Prediction = Softmax(Features @ W + b). This checkpoint holds W = b = 0.1 everywhere
    # (checked below), so every class gets the same logit and the right answer is exactly
    # 0.1 whatever the input: no input can tell the classes apart. What an input can
    # discriminate is the arithmetic: large and negative pixels give logits near +-2000,
    # where a softmax that does not subtract the row maximum overflows to NaN.
    d = model(MLNET + "mnist_lr_model")
    v = checkpoint(d)
    assert v["W"].shape == (784, 10) and v["b"].shape == (10,)
    assert np.all(v["W"] == np.float32(0.1)) and np.all(v["b"] == np.float32(0.1))
    rng = np.random.default_rng(3)
    x = np.stack([rng.random(784), 30 * rng.random(784), -30 * rng.random(784),
                  np.zeros(784)]).astype(np.float32)
    want = softmax64(x.astype(np.float64) @ v["W"] + v["b"])
    got = predict(d, {"Features": x}, tmp=tmp_path)["Prediction"]
    assert got.shape == (4, 10)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


@needs_testdata
def test_mnist_conv_with_dropout_at_keep_probability_one(tmp_path):
    d = model(MLNET + "mnist_conv_model")
    x = np.random.default_rng(4).random((3, 28, 28, 1), dtype=np.float32)
    y = predict(d, {"Features": x}, tmp=tmp_path)["Prediction"]
    softmax_rows_ok(y, 10)
    # deterministic and per-row: the same image alone gives the same row
    y1 = predict(d, {"Features": x[1:2]}, tmp=tmp_path)["Prediction"]
    np.testing.assert_allclose(y1[0], y[1], rtol=1e-4, atol=1e-6)


@needs_testdata
def test_cifar_cnn(tmp_path):
    d = model(MLNET + "cifar_saved_model")
    x = np.random.default_rng(5).random((2, 32, 32, 3), dtype=np.float32)
    y = predict(d, {"Input": x}, tmp=tmp_path)["Output"]
    assert y.shape == (2, 10) and np.all(np.isfinite(y))
    y1 = predict(d, {"Input": x[1:]}, tmp=tmp_path)["Output"]
    np.testing.assert_allclose(y1[0], y[1], rtol=1e-4, atol=1e-5)
    # the graph in numpy from the checkpoint: Conv2D 7x7 stride 2 VALID (NHWC, HWIO
    # weights) + bconv1, Relu, Reshape to [-1, 13*13*32], MatMul W1 + b1
    v = checkpoint(d)
    w, xin = v["Wconv1"].astype(np.float64), x.astype(np.float64)
    kh, kw, _, co = w.shape
    oh, ow = (32 - kh) // 2 + 1, (32 - kw) // 2 + 1
    conv = np.zeros((2, oh, ow, co))
    for i in range(kh):
        for j in range(kw):
            conv += xin[:, i:i + 2 * oh - 1:2, j:j + 2 * ow - 1:2, :] @ w[i, j]
    h = np.maximum(conv + v["bconv1"], 0).reshape(2, -1)
    want = h @ v["W1"] + v["b1"]
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert np.ptp(want, axis=1).min() > 0.1  # the classes do differ for these inputs


@needs_testdata
def test_keras_tf_example_classifier(tmp_path):
    d = model("tfx/tfx/components/testdata/trainer/keras/Format-Serving")
    ex = examples({"culmen_length_mm": [0.5], "culmen_depth_mm": [0.3],
                   "flipper_length_mm": [0.6], "body_mass_g": [0.4]},
                  {"culmen_length_mm": [0.1], "culmen_depth_mm": [0.9],
                   "flipper_length_mm": [0.2], "body_mass_g": [0.7]})
    got = predict(d, {"examples": ex}, tmp=tmp_path)["output_0"]
    softmax_rows_ok(got, 3)
    # serve_tf_examples_fn: ParseExample, concatenate in the model's input order
    # (culmen_length, culmen_depth, flipper_length, body_mass), three Dense layers
    # (Relu, Relu, Softmax); the weights from the checkpoint in numpy
    v = checkpoint(d)
    def layer(k, name):
        return v[f"layer_with_weights-{k}/{name}/.ATTRIBUTES/VARIABLE_VALUE"].astype(np.float64)
    x = np.array([[0.5, 0.3, 0.6, 0.4], [0.1, 0.9, 0.2, 0.7]])
    h = np.maximum(x @ layer(0, "kernel") + layer(0, "bias"), 0)
    h = np.maximum(h @ layer(1, "kernel") + layer(1, "bias"), 0)
    want = softmax64(h @ layer(2, "kernel") + layer(2, "bias"))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.abs(want[0] - want[1]).max() > 1e-3  # the two examples do differ


@needs_testdata
def test_inspect_lists_every_signature_with_aliases():
    info = inspect_json(model(TFCC + "half_plus_two/00000123"))
    sigs = {s["name"]: s for s in info["signatures"]}
    assert sigs["serving_default"]["method"] == "tensorflow/serving/predict"
    assert sigs["classify_x_to_y"]["method"] == "tensorflow/serving/classify"
    assert [i["name"] for i in sigs["serving_default"]["inputs"]] == ["x"]
    assert [o["name"] for o in sigs["classify_x_to_y"]["outputs"]] == ["scores"]
    assert sigs["classify_x_to_y"]["inputs"][0]["dtype"] == "string"


# ---------------------------------------------------- malformed SavedModels

def hp2_copy(tmp_path):
    return copy_model(model(TFCC + "half_plus_two/00000123"), tmp_path / "m")


@needs_testdata
@pytest.mark.parametrize("keep", [0, 1, 7, 100, 0.25, 0.5, 0.9, -1])
def test_truncated_saved_model_pb(keep, tmp_path):
    d = hp2_copy(tmp_path)
    pb = d / "saved_model.pb"
    data = pb.read_bytes()
    n = keep if isinstance(keep, int) and keep >= 0 else (len(data) - 1 if keep == -1 else int(len(data) * keep))
    pb.write_bytes(data[:n])
    assert_clean_error(kiln("inspect", d))


@needs_testdata
def test_bit_flipped_saved_model_pb(tmp_path):
    src = hp2_copy(tmp_path)
    data = (src / "saved_model.pb").read_bytes()
    rng = random.Random(20250611)
    for i in range(40):
        b = bytearray(data)
        for _ in range(1 + i % 4):
            pos = rng.randrange(len(b))
            b[pos] ^= 1 << rng.randrange(8)
        (src / "saved_model.pb").write_bytes(bytes(b))
        assert_loads_or_clean_error(kiln("inspect", src))


@needs_testdata
def test_missing_variables(tmp_path):
    d = hp2_copy(tmp_path)
    shutil.rmtree(d / "variables")
    assert_clean_error(kiln("inspect", d), r"variable 'a'.*variables\.index")


@needs_testdata
def test_truncated_variables_data(tmp_path):
    d = hp2_copy(tmp_path)
    data = next((d / "variables").glob("variables.data-*"))
    data.write_bytes(data.read_bytes()[:6])
    assert_clean_error(kiln("inspect", d), r"variable")


@needs_testdata
def test_truncated_variables_index(tmp_path):
    d = hp2_copy(tmp_path)
    idx = d / "variables" / "variables.index"
    idx.write_bytes(idx.read_bytes()[:50])
    assert_clean_error(kiln("inspect", d), r"variable 'a'")


@needs_testdata
def test_bad_crc_in_variables(tmp_path):
    d = hp2_copy(tmp_path)
    data = next((d / "variables").glob("variables.data-*"))
    b = bytearray(data.read_bytes())
    b[2] ^= 0x01
    data.write_bytes(bytes(b))
    assert_clean_error(kiln("inspect", d), r"crc")


@needs_testdata
def test_missing_signature_key(tmp_path):
    d = model(TFCC + "half_plus_two/00000123")
    r = predict(d, {"x": X}, signature="no_such_signature", tmp=tmp_path, expect_ok=False)
    assert_clean_error(r, r"no_such_signature")


@needs_testdata
def test_wrong_tags(tmp_path):
    d = model(TFCC + "half_plus_two/00000123")
    assert_clean_error(kiln("inspect", d, "--tags", "serve,gpu"),
                       r"no MetaGraphDef with tags 'serve,gpu'.*'serve'")


@needs_testdata
def test_malformed_pbtxt(tmp_path):
    d = copy_model(model(TFCC + "half_plus_two_pbtxt/00000123"), tmp_path / "m")
    txt = d / "saved_model.pbtxt"
    lines = txt.read_text().splitlines()
    lines[40] = lines[40] + " }}} garbage {"
    txt.write_text("\n".join(lines))
    assert_clean_error(kiln("inspect", d), r"line \d+")


def write_pb(tmp_path, data, name="m"):
    d = tmp_path / name
    d.mkdir()
    (d / "saved_model.pb").write_bytes(data)
    return d


def test_attributes_nested_100000_deep(tmp_path):
    d = write_pb(tmp_path, corpus.deep_attr(100000))
    assert_clean_error(kiln("inspect", d), r"nested more than")


@pytest.mark.parametrize("case", sorted(corpus.cases()))
def test_corpus_case(case, tmp_path):
    data = corpus.cases()[case]
    stored = CORPUS / f"{case}.pb"
    if stored.exists():
        assert stored.read_bytes() == data, "tests/corpus/savedmodel is stale: rerun " \
                                            "tools/make_savedmodel_corpus.py"
    d = write_pb(tmp_path, data)
    r = kiln("inspect", d)
    if case.startswith("ok_"):
        assert r.returncode == 0, r.stderr
    elif case.startswith("any_"):
        assert_loads_or_clean_error(r)
    else:
        assert_clean_error(r, corpus.EXPECT.get(case))


@pytest.mark.parametrize("case,inputs,want", [
    ("ok_half_plus_two", {"x": np.array([[2.0], [4.0]], np.float32)}, {"y": [[3.0], [4.0]]}),
    ("ok_function_call", {"x": np.array(2.0, np.float32)}, {"output_0": 6.0}),
    ("ok_partitioned_call", {"x": np.array(2.0, np.float32)}, {"output_0": 6.0}),
    ("ok_nested_calls_8", {"x": np.array(2.0, np.float32)}, {"y": 3.0}),
    ("ok_control_dep_dropped", {"x": np.array([1.0, 2.0], np.float32)}, {"y": [1.0, 2.0]}),
    ("ok_strided_slice", {"x": np.array([1.0, 2.0], np.float32)}, {"y": 2.0}),
    ("ok_two_signatures", {"x": np.array([1.0, 2.0], np.float32)}, {"y": [3.0, 6.0]}),
])
def test_corpus_models_compute(case, inputs, want, tmp_path):
    d = write_pb(tmp_path, corpus.cases()[case])
    got = predict(d, inputs, tmp=tmp_path)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], np.array(v, np.float32))
    if case == "ok_two_signatures":
        got = predict(d, inputs, signature="double", tmp=tmp_path)
        np.testing.assert_allclose(got["y"], [2.0, 4.0])


# ------------------------------------------ single TF ops against numpy

NP_DT = {np.dtype(np.float32): corpus.DT_FLOAT, np.dtype(np.int32): corpus.DT_INT32,
         np.dtype(np.int64): corpus.DT_INT64, np.dtype(np.bool_): corpus.DT_BOOL}


def const_node(name, arr):
    arr = np.ascontiguousarray(arr)
    dt = NP_DT[arr.dtype]
    return corpus.node(name, "Const", dtype=corpus.a_type(dt),
                       value=corpus.a_tensor(corpus.tensor(dt, list(arr.shape),
                                                           content=arr.tobytes())))


def op_model(tmp_path, inputs, nodes, outputs):
    """inputs: {name: array} (placeholders of those dtypes and shapes); nodes: NodeDef bytes
    (Consts via const_node); outputs: {alias: tensor name}."""
    phs = [corpus.placeholder(k, NP_DT[v.dtype], list(v.shape)) for k, v in inputs.items()]
    sig = corpus.signature(
        {k: corpus.tensor_info(f"{k}:0", NP_DT[v.dtype], list(v.shape)) for k, v in inputs.items()},
        {k: corpus.tensor_info(t) for k, t in outputs.items()})
    d = tmp_path / "opmodel"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir()
    (d / "saved_model.pb").write_bytes(corpus.saved_model(phs + nodes, {"serving_default": sig}))
    return predict(d, inputs, tmp=tmp_path)


def attr_ints(vals):
    return corpus.f_len(1, b"".join(corpus.f_int(3, v) for v in vals))


def attr_str(s):
    return corpus.f_len(2, s)


def attr_b(v):
    return corpus.f_int(5, 1 if v else 0)


def attr_f(v):
    return corpus.f_float(4, v)


FT = corpus.a_type(corpus.DT_FLOAT)
I32 = corpus.a_type(corpus.DT_INT32)
rng = np.random.default_rng(20250611)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def np_conv2d_nhwc(x, w, stride, padding, dil=(1, 1)):
    n, h, wd, c = x.shape
    kh, kw, ci, co = w.shape
    ekh, ekw = (kh - 1) * dil[0] + 1, (kw - 1) * dil[1] + 1
    if padding == "SAME":
        oh, ow = -(-h // stride[0]), -(-wd // stride[1])
        ph = max((oh - 1) * stride[0] + ekh - h, 0)
        pw = max((ow - 1) * stride[1] + ekw - wd, 0)
        x = np.pad(x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
    else:
        oh, ow = (h - ekh) // stride[0] + 1, (wd - ekw) // stride[1] + 1
    groups = c // ci
    y = np.zeros((n, oh, ow, co), np.float64)
    cog = co // groups
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * stride[0]:i * stride[0] + ekh:dil[0], j * stride[1]:j * stride[1] + ekw:dil[1], :]
            for g in range(groups):
                y[..., i, j, g * cog:(g + 1) * cog] = np.tensordot(
                    patch[..., g * ci:(g + 1) * ci], w[..., g * cog:(g + 1) * cog], axes=3)
    return y.astype(np.float32)


@pytest.mark.parametrize("padding,stride", [("SAME", 1), ("SAME", 2), ("VALID", 2)])
def test_op_conv2d_nhwc(padding, stride, tmp_path):
    x, w = randn(2, 7, 6, 3), randn(3, 2, 3, 4)
    got = op_model(tmp_path, {"x": x}, [const_node("w", w), corpus.node(
        "y", "Conv2D", ["x", "w"], T=FT, strides=attr_ints([1, stride, stride, 1]),
        padding=attr_str(padding))], {"y": "y:0"})["y"]
    np.testing.assert_allclose(got, np_conv2d_nhwc(x, w, (stride, stride), padding), rtol=1e-4, atol=1e-4)


def test_op_depthwise_conv(tmp_path):
    x, w = randn(1, 5, 5, 3), randn(3, 3, 3, 2)   # channel multiplier 2
    got = op_model(tmp_path, {"x": x}, [const_node("w", w), corpus.node(
        "y", "DepthwiseConv2dNative", ["x", "w"], T=FT, strides=attr_ints([1, 1, 1, 1]),
        padding=attr_str("SAME"))], {"y": "y:0"})["y"]
    # output channel c*2+m = conv of input channel c with w[..., c, m]
    want = np.concatenate([np_conv2d_nhwc(x[..., c:c + 1], w[:, :, c:c + 1, :], (1, 1), "SAME")
                           for c in range(3)], axis=-1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op,padding", [("MaxPool", "SAME"), ("AvgPool", "SAME"), ("MaxPool", "VALID")])
def test_op_pool(op, padding, tmp_path):
    x = randn(1, 5, 5, 2)
    got = op_model(tmp_path, {"x": x}, [corpus.node(
        "y", op, ["x"], T=FT, ksize=attr_ints([1, 2, 2, 1]), strides=attr_ints([1, 2, 2, 1]),
        padding=attr_str(padding))], {"y": "y:0"})["y"]
    oh = 3 if padding == "SAME" else 2
    want = np.zeros((1, oh, oh, 2), np.float32)
    for i in range(oh):
        for j in range(oh):
            win = x[:, 2 * i:2 * i + 2, 2 * j:2 * j + 2, :]   # SAME pads only at the end here
            want[:, i, j, :] = win.max(axis=(1, 2)) if op == "MaxPool" else win.mean(axis=(1, 2))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_op_fused_batch_norm(tmp_path):
    x = randn(2, 3, 3, 4)
    s, o, m, v = randn(4), randn(4), randn(4), np.abs(randn(4)) + 0.5
    got = op_model(tmp_path, {"x": x}, [const_node("s", s), const_node("o", o), const_node("m", m),
                                        const_node("v", v), corpus.node(
        "bn", "FusedBatchNormV3", ["x", "s", "o", "m", "v"], T=FT, U=FT,
        epsilon=attr_f(0.001), is_training=attr_b(False))], {"y": "bn:0"})["y"]
    np.testing.assert_allclose(got, (x - m) / np.sqrt(v + 0.001) * s + o, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_op_matmul_transposes(ta, tb, tmp_path):
    a, b = randn(3, 4), randn(4, 5)
    a_in, b_in = (a.T.copy() if ta else a), (b.T.copy() if tb else b)
    got = op_model(tmp_path, {"a": a_in, "b": b_in}, [corpus.node(
        "y", "MatMul", ["a", "b"], T=FT, transpose_a=attr_b(ta), transpose_b=attr_b(tb))],
        {"y": "y:0"})["y"]
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


STRIDED = [  # (begin, end, strides, masks dict, numpy index)
    ([1], [3], [1], {}, np.s_[1:3]),
    ([0, 1], [0, 3], [1, 1], {"begin_mask": 1, "end_mask": 1}, np.s_[:, 1:3]),
    ([-1], [0], [-1], {"end_mask": 1}, np.s_[::-1]),
    ([0, 2], [0, 3], [1, 1], {"shrink_axis_mask": 2, "begin_mask": 1, "end_mask": 1}, np.s_[:, 2]),
    ([0, 0], [0, 1], [1, 1], {"ellipsis_mask": 1, "new_axis_mask": 0}, np.s_[..., 0:1]),
    ([0, 0, 1], [0, 0, 2], [1, 1, 1], {"new_axis_mask": 2, "begin_mask": 1, "end_mask": 1},
     np.s_[:, None, 1:2]),
    ([-1, 0], [0, 0], [1, 1], {"shrink_axis_mask": 1, "end_mask": 2}, np.s_[-1, :]),
    ([3, 0], [0, 4], [-2, 2], {"end_mask": 1}, np.s_[3::-2, 0:4:2]),
]


@pytest.mark.parametrize("case", range(len(STRIDED)))
def test_op_strided_slice(case, tmp_path):
    begin, end, strides, masks, idx = STRIDED[case]
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    attrs = {k: corpus.a_int(v) for k, v in masks.items()}
    got = op_model(tmp_path, {"x": x}, [
        const_node("b", np.array(begin, np.int32)), const_node("e", np.array(end, np.int32)),
        const_node("s", np.array(strides, np.int32)),
        corpus.node("y", "StridedSlice", ["x", "b", "e", "s"], T=FT, Index=I32, **attrs)],
        {"y": "y:0"})["y"]
    np.testing.assert_array_equal(got, x[idx])


def test_op_shapes_and_reductions(tmp_path):
    x = randn(2, 3, 4)
    nodes = [
        const_node("ax", np.array([1], np.int32)), const_node("ax2", np.array(-1, np.int32)),
        const_node("perm", np.array([2, 0, 1], np.int32)),
        const_node("shape", np.array([4, -1], np.int32)), const_node("idx", np.array([2, 0], np.int32)),
        const_node("k", np.array(2, np.int32)),
        corpus.node("mean", "Mean", ["x", "ax"], T=FT, Tidx=I32, keep_dims=attr_b(True)),
        corpus.node("sum", "Sum", ["x", "ax2"], T=FT, Tidx=I32),
        corpus.node("tr", "Transpose", ["x", "perm"], T=FT, Tperm=I32),
        corpus.node("rs", "Reshape", ["x", "shape"], T=FT, Tshape=I32),
        corpus.node("cat", "ConcatV2", ["x", "x", "ax"], T=FT, N=corpus.a_int(2), Tidx=I32),
        corpus.node("pk", "Pack", ["x", "x"], T=FT, N=corpus.a_int(2), axis=corpus.a_int(-1)),
        corpus.node("up", "Unpack", ["x"], T=FT, num=corpus.a_int(3), axis=corpus.a_int(1)),
        corpus.node("ga", "GatherV2", ["x", "idx", "ax2"], Tparams=FT, Tindices=I32, Taxis=I32),
        corpus.node("am", "ArgMax", ["x", "ax2"], T=FT, Tidx=I32),
        corpus.node("tk", "TopKV2", ["x", "k"], T=FT),
        corpus.node("sm", "Softmax", ["x"], T=FT),
        corpus.node("ed", "ExpandDims", ["x", "ax2"], T=FT, Tdim=I32),
        corpus.node("sh", "Shape", ["x"], T=FT, out_type=I32),
        corpus.node("sp", "Split", ["ax", "x"], T=FT, num_split=corpus.a_int(3)),
    ]
    outs = {"mean": "mean:0", "sum": "sum:0", "tr": "tr:0", "rs": "rs:0", "cat": "cat:0",
            "pk": "pk:0", "up1": "up:1", "ga": "ga:0", "am": "am:0", "tkv": "tk:0", "tki": "tk:1",
            "sm": "sm:0", "ed": "ed:0", "sh": "sh:0", "sp2": "sp:2"}
    g = op_model(tmp_path, {"x": x}, nodes, outs)
    np.testing.assert_allclose(g["mean"], x.mean(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(g["sum"], x.sum(axis=-1), rtol=1e-5)
    np.testing.assert_array_equal(g["tr"], x.transpose(2, 0, 1))
    np.testing.assert_array_equal(g["rs"], x.reshape(4, -1))
    np.testing.assert_array_equal(g["cat"], np.concatenate([x, x], axis=1))
    np.testing.assert_array_equal(g["pk"], np.stack([x, x], axis=-1))
    np.testing.assert_array_equal(g["up1"], x[:, 1, :])
    np.testing.assert_array_equal(g["ga"], x[..., [2, 0]])
    assert g["am"].dtype == np.int64
    np.testing.assert_array_equal(g["am"], x.argmax(axis=-1))
    np.testing.assert_array_equal(g["tkv"], -np.sort(-x, axis=-1)[..., :2])
    assert g["tki"].dtype == np.int32
    np.testing.assert_array_equal(g["tki"], np.argsort(-x, axis=-1, kind="stable")[..., :2])
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(g["sm"], e / e.sum(axis=-1, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(g["ed"], x[..., None])
    np.testing.assert_array_equal(g["sh"], np.array([2, 3, 4], np.int32))
    np.testing.assert_array_equal(g["sp2"], x[:, 2:3, :])


def test_op_elementwise_tf_semantics(tmp_path):
    a = np.array([7, -7, 7, -7, 0], np.int32)
    b = np.array([2, 2, -2, -2, 3], np.int32)
    f = np.array([-3.0, -0.5, 0.0, 2.0, 7.5], np.float32)
    nodes = [
        const_node("zero", np.array(0.0, np.float32)),
        const_node("cond", np.array([True, False], np.bool_)),
        const_node("m", np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)),
        corpus.node("fd", "FloorDiv", ["a", "b"], T=I32),
        corpus.node("fm", "FloorMod", ["a", "b"], T=I32),
        corpus.node("r6", "Relu6", ["f"], T=FT),
        corpus.node("lr", "LeakyRelu", ["f"], T=FT, alpha=attr_f(0.1)),
        corpus.node("dn", "DivNoNan", ["f", "zero"], T=FT),
        corpus.node("sq", "SquaredDifference", ["f", "zero"], T=FT),
        corpus.node("rs", "Rsqrt", ["sq"], T=FT),
        corpus.node("ne", "NotEqual", ["a", "b"], T=I32),
        corpus.node("sel", "Select", ["cond", "m", "zero_m"], T=FT),
        corpus.node("zero_m", "ZerosLike", ["m"], T=FT),
        corpus.node("cs", "Cast", ["a"], SrcT=I32, DstT=FT),
    ]
    g = op_model(tmp_path, {"a": a, "b": b, "f": f}, nodes,
                 {k: f"{k}:0" for k in ["fd", "fm", "r6", "lr", "dn", "sq", "ne", "sel", "cs"]})
    np.testing.assert_array_equal(g["fd"], a // b)
    np.testing.assert_array_equal(g["fm"], a % b)
    np.testing.assert_allclose(g["r6"], np.clip(f, 0, 6))
    np.testing.assert_allclose(g["lr"], np.where(f > 0, f, 0.1 * f), rtol=1e-6)
    np.testing.assert_array_equal(g["dn"], np.zeros(5, np.float32))
    np.testing.assert_allclose(g["sq"], f * f)
    np.testing.assert_array_equal(g["ne"], a != b)
    np.testing.assert_array_equal(g["sel"], [[1.0, 2.0], [0.0, 0.0]])
    np.testing.assert_array_equal(g["cs"], a.astype(np.float32))


def test_op_float_floor_semantics_and_mapped_attrs(tmp_path):
    # FloorDiv / FloorMod on floats follow Python's floor semantics; LeakyRelu's alpha
    # defaults to 0.2; LogSoftmax runs over the last axis
    a = np.array([7.5, -7.5, 7.5, -7.5, 0.0, 6.0], np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0, 3.0, -3.0], np.float32)
    nodes = [
        corpus.node("fd", "FloorDiv", ["a", "b"], T=FT),
        corpus.node("fm", "FloorMod", ["a", "b"], T=FT),
        corpus.node("lr", "LeakyRelu", ["a"], T=FT),
        corpus.node("ls", "LogSoftmax", ["m"], T=FT),
    ]
    m = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 4.0]], np.float32)
    g = op_model(tmp_path, {"a": a, "b": b, "m": m}, nodes,
                 {k: f"{k}:0" for k in ["fd", "fm", "lr", "ls"]})
    np.testing.assert_array_equal(g["fd"], np.floor_divide(a, b))
    np.testing.assert_array_equal(g["fm"], np.mod(a, b))
    np.testing.assert_allclose(g["lr"], np.where(a > 0, a, np.float32(0.2) * a), rtol=1e-6)
    e = m - m.max(axis=-1, keepdims=True)
    np.testing.assert_allclose(g["ls"], e - np.log(np.exp(e).sum(axis=-1, keepdims=True)),
                               rtol=1e-5, atol=1e-6)


def test_op_reverse(tmp_path):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    nodes = [
        const_node("ax0", np.array([0], np.int32)),
        const_node("ax12", np.array([1, -1], np.int64)),
        corpus.node("r0", "ReverseV2", ["x", "ax0"], T=FT, Tidx=corpus.a_type(corpus.DT_INT32)),
        corpus.node("r12", "ReverseV2", ["x", "ax12"], T=FT, Tidx=corpus.a_type(corpus.DT_INT64)),
    ]
    g = op_model(tmp_path, {"x": x}, nodes, {"r0": "r0:0", "r12": "r12:0"})
    np.testing.assert_array_equal(g["r0"], x[::-1])
    np.testing.assert_array_equal(g["r12"], x[:, ::-1, ::-1])


def test_op_pad_tile_fill_range_onehot(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    i = np.array([0, 2, -1, 5], np.int32)
    nodes = [
        const_node("p", np.array([[1, 0], [0, 2]], np.int32)),
        const_node("mult", np.array([2, 1], np.int32)),
        const_node("dims", np.array([2, 2], np.int32)), const_node("v", np.array(9.0, np.float32)),
        const_node("r0", np.array(1, np.int32)), const_node("r1", np.array(8, np.int32)),
        const_node("r2", np.array(3, np.int32)),
        const_node("depth", np.array(3, np.int32)), const_node("on", np.array(1.0, np.float32)),
        const_node("off", np.array(0.0, np.float32)),
        const_node("sb", np.array([0, 1], np.int32)), const_node("ss", np.array([-1, 2], np.int32)),
        corpus.node("pad", "Pad", ["x", "p"], T=FT, Tpaddings=I32),
        corpus.node("mp", "MirrorPad", ["x", "p"], T=FT, Tpaddings=I32, mode=attr_str("REFLECT")),
        corpus.node("tile", "Tile", ["x", "mult"], T=FT, Tmultiples=I32),
        corpus.node("fill", "Fill", ["dims", "v"], T=FT, index_type=I32),
        corpus.node("rng", "Range", ["r0", "r1", "r2"], Tidx=I32),
        corpus.node("oh", "OneHot", ["i", "depth", "on", "off"], T=FT, TI=I32),
        corpus.node("sl", "Slice", ["x", "sb", "ss"], T=FT, Index=I32),
        corpus.node("cum", "Cumsum", ["x", "r0"], T=FT, Tidx=I32, exclusive=attr_b(True)),
    ]
    g = op_model(tmp_path, {"x": x, "i": i}, nodes,
                 {k: f"{k}:0" for k in ["pad", "mp", "tile", "fill", "rng", "oh", "sl", "cum"]})
    np.testing.assert_array_equal(g["pad"], np.pad(x, ((1, 0), (0, 2))))
    np.testing.assert_array_equal(g["mp"], np.pad(x, ((1, 0), (0, 2)), mode="reflect"))
    np.testing.assert_array_equal(g["tile"], np.tile(x, (2, 1)))
    np.testing.assert_array_equal(g["fill"], np.full((2, 2), 9.0, np.float32))
    np.testing.assert_array_equal(g["rng"], np.arange(1, 8, 3, dtype=np.int32))
    # TF: -1 and out-of-range indices give all-off rows
    np.testing.assert_array_equal(g["oh"], [[1, 0, 0], [0, 0, 1], [0, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(g["sl"], x[0:, 1:3])
    np.testing.assert_array_equal(g["cum"], np.cumsum(x, axis=1) - x)


@pytest.mark.parametrize("padding,stride,h", [("SAME", 2, 6), ("SAME", 2, 7), ("VALID", 2, 7),
                                              ("VALID", 3, 8), ("SAME", 1, 5)])
def test_op_conv2d_backprop_input(padding, stride, h, tmp_path):
    k = 3
    w = randn(k, k, 2, 4)                              # [kh, kw, in, out]
    if padding == "SAME":
        oh = -(-h // stride)
        pb = max((oh - 1) * stride + k - h, 0) // 2
    else:
        oh, pb = (h - k) // stride + 1, 0
    dy = randn(1, oh, oh, 4)
    got = op_model(tmp_path, {"dy": dy}, [
        const_node("sizes", np.array([1, h, h, 2], np.int32)), const_node("w", w),
        corpus.node("y", "Conv2DBackpropInput", ["sizes", "w", "dy"], T=FT,
                    strides=attr_ints([1, stride, stride, 1]), padding=attr_str(padding))],
        {"y": "y:0"})["y"]
    want = np.zeros((1, h, h, 2), np.float64)
    for i in range(oh):
        for j in range(oh):
            for a in range(k):
                for b in range(k):
                    r, c = i * stride + a - pb, j * stride + b - pb
                    if 0 <= r < h and 0 <= c < h:
                        want[0, r, c, :] += w[a, b] @ dy[0, i, j]
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-4, atol=1e-4)
