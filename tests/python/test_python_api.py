"""Tests of `import kiln`, Kiln's Python API (python/kiln, docs/PYTHON.md).

The module first builds the package with `python/setup.py build` into
$KILN_BUILD_DIR/python (against that build's libkiln.so, with -Werror) and
imports it from there; it skips when libkiln.so is missing. Every expected
value comes from somewhere other than Kiln: numpy (in double precision
where arithmetic is involved), PyTorch, the inputs themselves (Identity),
known answers of the shared SavedModels, or `kiln predict` for the
"same answer as the CLI" and "same message as the CLI" checks.

What is covered: every dtype's round trip; symbolic and unknown dims;
errors (wrong name, dtype, shape, missing input, unknown output, missing
file, malformed bytes, unknown signature) with Kiln's messages; runs from
many threads at once against a float64 numpy reference; the digits model
against a numpy MLP and `kiln predict`; a PyTorch model exported with
torch.onnx.export; SavedModel signatures; zero-copy inputs and outputs;
the GIL released during runs; session options, run options (deadline,
cancel) and the optimization log.
"""

import gc
import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KILN_BUILD_DIR") or REPO / "build").resolve()
KILN_BIN = os.environ.get("KILN_BIN") or str(BUILD / "kiln")
TESTDATA = Path(os.environ.get("KILN_TESTDATA") or REPO.parent / "shared" / "testdata")
SAVEDMODELS = TESTDATA / "savedmodels"

if not (BUILD / "libkiln.so").exists():
    pytest.skip(f"{BUILD}/libkiln.so not found (build Kiln, or set KILN_BUILD_DIR)",
                allow_module_level=True)


def _build_extension():
    """Build kiln._kiln into BUILD/python and import it from there."""
    out = BUILD / "python"
    env = dict(os.environ, KILN_BUILD_DIR=str(BUILD), KILN_WERROR="1")
    if os.environ.get("KILN_SANITIZED") == "1" and "libasan" in os.environ.get("LD_PRELOAD", ""):
        # the sanitizer build (ctest preloads the runtimes): check the extension's C too
        flags = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
        env["CFLAGS"] = flags
        env["LDFLAGS"] = "-fsanitize=address,undefined"
        out = BUILD / "python-sanitized"
    r = subprocess.run(
        [sys.executable, str(REPO / "python" / "setup.py"), "-q", "build",
         "--build-lib", str(out), "--build-temp", str(out) + "-tmp"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"building the extension failed:\n{r.stdout}\n{r.stderr}"
    sys.path.insert(0, str(out))
    import kiln as k
    assert Path(k.__file__).resolve().parent == (out / "kiln").resolve(), k.__file__
    return k


kiln = _build_extension()


# ------------------------------------------------------------------ model helpers


def onnx_bytes(nodes, inputs, outputs, initializers=(), opset=13):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    return m.SerializeToString()


def identity_model(elem, shape=("batch", 3)):
    return onnx_bytes([helper.make_node("Identity", ["x"], ["y"])],
                      [helper.make_tensor_value_info("x", elem, list(shape))],
                      [helper.make_tensor_value_info("y", elem, list(shape))])


def mlp_weights(seed, width=64, layers=3):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
            for _ in range(layers)]


def tanh_mlp_model(weights):
    """x [batch, w] -> (MatMul W_i, Tanh) per weight -> y."""
    nodes, inits, cur = [], [], "x"
    for i, w in enumerate(weights):
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"]))
        cur = f"t{i}"
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    w = weights[0].shape[0]
    return onnx_bytes(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", w])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", w])], inits)


def tanh_mlp_reference(weights, x):
    h = x.astype(np.float64)
    for w in weights:
        h = np.tanh(h @ w.astype(np.float64))
    return h


def kiln_cli(*args):
    return subprocess.run([KILN_BIN, *map(str, args)], capture_output=True, text=True,
                          errors="replace", timeout=120)


needs_cli = pytest.mark.skipif(not os.access(KILN_BIN, os.X_OK),
                               reason=f"kiln binary not found at {KILN_BIN}")


# ------------------------------------------------------------------ dtypes

ROUND_TRIP = {
    "float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "float16": TensorProto.FLOAT16,
    "int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int16": TensorProto.INT16,
    "uint16": TensorProto.UINT16, "int32": TensorProto.INT32, "uint32": TensorProto.UINT32,
    "int64": TensorProto.INT64, "uint64": TensorProto.UINT64, "bool": TensorProto.BOOL,
}
ORT_TYPES = {
    "float32": "tensor(float)", "float64": "tensor(double)", "float16": "tensor(float16)",
    "int8": "tensor(int8)", "uint8": "tensor(uint8)", "int16": "tensor(int16)",
    "uint16": "tensor(uint16)", "int32": "tensor(int32)", "uint32": "tensor(uint32)",
    "int64": "tensor(int64)", "uint64": "tensor(uint64)", "bool": "tensor(bool)",
}


def values_of(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        v = rng.standard_normal(shape).astype(dt)
        v.flat[0] = np.finfo(dt).max
        v.flat[1] = -np.finfo(dt).tiny
        return v
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dt)
    v = rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    v.flat[0], v.flat[1] = info.min, info.max
    return v


@pytest.mark.parametrize("dtype", sorted(ROUND_TRIP))
def test_dtype_round_trip(dtype):
    sess = kiln.InferenceSession(identity_model(ROUND_TRIP[dtype]))
    assert sess.get_inputs()[0].type == ORT_TYPES[dtype]
    assert sess.get_outputs()[0].type == ORT_TYPES[dtype]
    x = values_of(dtype, (4, 3))
    (y,) = sess.run(None, {"x": x})
    assert y.dtype == np.dtype(dtype) and y.shape == (4, 3)
    np.testing.assert_array_equal(y, x)


def test_float_specials_round_trip():
    sess = kiln.InferenceSession(identity_model(TensorProto.FLOAT))
    x = np.array([[np.nan, np.inf, -np.inf], [-0.0, 1e-45, -3.5]], np.float32)
    (y,) = sess.run(None, {"x": x})
    assert y.tobytes() == x.tobytes()  # bit for bit, NaN and -0 included


def test_bfloat16_travels_as_uint16_bits():
    sess = kiln.InferenceSession(identity_model(TensorProto.BFLOAT16))
    assert sess.get_inputs()[0].type == "tensor(bfloat16)"
    f = np.array([[1.0, -2.5, 3.140625], [0.0, 65280.0, -1e-3]], np.float32)
    bits = (f.view(np.uint32) >> 16).astype(np.uint16)  # truncation: exact for these values
    (y,) = sess.run(None, {"x": bits})
    assert y.dtype == np.uint16
    np.testing.assert_array_equal(y, bits)
    back = (y.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(back[0], f[0])
    with pytest.raises(kiln.InvalidArgument, match="bit patterns"):
        sess.run(None, {"x": [[1.0, 2.0, 3.0]]})  # values or bits? not guessed


@pytest.mark.parametrize("to", ["float64", "float16", "int32", "int64", "uint8", "bool", "int8"])
def test_cast_matches_numpy(to):
    m = onnx_bytes([helper.make_node("Cast", ["x"], ["y"], to=ROUND_TRIP[to])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                   [helper.make_tensor_value_info("y", ROUND_TRIP[to], ["n"])])
    x = np.array([0, 1, 2, 3, 7, 100, 0.5, 2.75, 120], np.float32)
    (y,) = kiln.InferenceSession(m).run(None, {"x": x})
    assert y.dtype == np.dtype(to)
    np.testing.assert_array_equal(y, x.astype(to))


def test_strings_round_trip():
    sess = kiln.InferenceSession(identity_model(TensorProto.STRING, ("n",)))
    assert sess.get_inputs()[0].type == "tensor(string)"
    words = ["kiln", "", "naïve ☃", "a\x00b"]
    for x in (np.array(words, dtype=object), np.array(words), words):
        (y,) = sess.run(None, {"x": x})
        assert y.dtype == object and y.shape == (4,)
        assert list(y) == words
    raw = np.array([b"\xff\xfe", b"ok"], dtype=object)  # not UTF-8: comes back as bytes
    (y,) = sess.run(None, {"x": raw})
    assert list(y) == [b"\xff\xfe", "ok"]
    with pytest.raises(kiln.InvalidArgument, match="element 1 is int"):
        sess.run(None, {"x": np.array(["a", 3], dtype=object)})


def test_sequence_and_optional_outputs():
    """A sequence output is a list of arrays, an optional its value or None
    (docs/SEQUENCES.md); a sequence input is refused by name."""
    opt_f = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    m = onnx_bytes([helper.make_node("SplitToSequence", ["x", "two"], ["parts"], axis=0),
                    helper.make_node("Optional", ["x"], ["full"]),
                    helper.make_node("Optional", [], ["none"],
                                     type=helper.make_tensor_type_proto(TensorProto.FLOAT, None))],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 2])],
                   [helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None),
                    helper.make_value_info("full", opt_f), helper.make_value_info("none", opt_f)],
                   [numpy_helper.from_array(np.array(2, np.int64), "two")], opset=16)
    sess = kiln.InferenceSession(m)
    assert [o.type for o in sess.get_outputs()] == ["seq(tensor)", "optional", "optional"]
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    parts, full, none = sess.run(None, {"x": x})
    want = np.array_split(x, [2, 4])
    assert isinstance(parts, list) and len(parts) == 3
    for got, w in zip(parts, want):
        np.testing.assert_array_equal(got, w)
    np.testing.assert_array_equal(full, x)
    assert none is None
    seq_in = onnx_bytes([helper.make_node("SequenceLength", ["s"], ["n"])],
                        [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)],
                        [helper.make_tensor_value_info("n", TensorProto.INT64, [])], opset=16)
    with pytest.raises(kiln.InvalidArgument, match="input 's' is a sequence"):
        kiln.InferenceSession(seq_in).run(None, {"s": [x]})


def test_lists_are_converted_to_the_signature_dtype():
    sess = kiln.InferenceSession(identity_model(TensorProto.INT32))
    (y,) = sess.run(None, {"x": [[1, 2, 3]]})
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [[1, 2, 3]])


def test_scalar_and_empty_tensors():
    m = onnx_bytes([helper.make_node("Identity", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    (y,) = kiln.InferenceSession(m).run(None, {"x": np.float32(2.5)})
    assert y.shape == () and y == 2.5
    sess = kiln.InferenceSession(identity_model(TensorProto.FLOAT))
    (y,) = sess.run(None, {"x": np.zeros((0, 3), np.float32)})
    assert y.shape == (0, 3)


# ------------------------------------------------------------------ shapes and metadata


def test_symbolic_and_unknown_dims():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", None, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None, 4])
    m = onnx_bytes([helper.make_node("Relu", ["x"], ["y"])], [x], [y])
    sess = kiln.InferenceSession(m)
    (inp,) = sess.get_inputs()
    assert (inp.name, inp.type, inp.shape) == ("x", "tensor(float)", ["batch", None, 4])
    assert sess.get_outputs()[0].shape == ["batch", None, 4]
    for shape in [(1, 1, 4), (3, 7, 4), (2, 0, 4)]:
        v = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        (out,) = sess.run(None, {"x": v})
        np.testing.assert_array_equal(out, np.maximum(v, 0))


def test_providers_and_metadata():
    sess = kiln.InferenceSession(identity_model(TensorProto.FLOAT))
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert kiln.get_available_providers() == ["CPUExecutionProvider"]
    assert sess.signature == "serving_default"
    assert list(sess.signatures) == ["serving_default"]
    info = sess.model_info()
    assert info["format"] == "onnx" and info["ops"] == {"Identity": 1} and info["opsets"][""] == 13
    with pytest.warns(UserWarning, match="CUDAExecutionProvider"):
        kiln.InferenceSession(identity_model(TensorProto.FLOAT),
                              providers=["CUDAExecutionProvider", "CPUExecutionProvider"])


def test_path_bytes_and_pathlike_agree(tmp_path):
    w = mlp_weights(3)
    blob = tanh_mlp_model(w)
    p = tmp_path / "m.onnx"
    p.write_bytes(blob)
    x = np.random.default_rng(2).standard_normal((5, 64)).astype(np.float32)
    outs = [kiln.InferenceSession(src).run(None, {"x": x})[0]
            for src in (str(p), p, blob, bytearray(blob), memoryview(blob))]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    np.testing.assert_allclose(outs[0], tanh_mlp_reference(w, x), rtol=1e-4, atol=1e-5)


def test_output_names_select_and_order():
    m = onnx_bytes([helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Abs", ["x"], ["b"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                   [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n"]),
                    helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n"])])
    sess = kiln.InferenceSession(m)
    x = np.array([-1.5, 2.0], np.float32)
    a, b = sess.run(None, {"x": x})
    np.testing.assert_array_equal(a, -x)
    np.testing.assert_array_equal(b, np.abs(x))
    b2, a2 = sess.run(["b", "a"], {"x": x})
    np.testing.assert_array_equal(b2, np.abs(x))
    np.testing.assert_array_equal(a2, -x)
    (b3,) = sess.run(["b"], {"x": x})
    np.testing.assert_array_equal(b3, np.abs(x))
    assert len(sess.run([], {"x": x})) == 2


# ------------------------------------------------------------------ errors


@pytest.fixture(scope="module")
def f32_sess():
    return kiln.InferenceSession(identity_model(TensorProto.FLOAT))


def test_wrong_input_name(f32_sess):
    with pytest.raises(kiln.InvalidArgument) as e:
        f32_sess.run(None, {"nope": np.zeros((1, 3), np.float32)})
    assert str(e.value) == "'nope' is not an input of signature 'serving_default'"
    assert isinstance(e.value, ValueError) and isinstance(e.value, RuntimeError)
    assert isinstance(e.value, kiln.KilnError)
    assert e.value.status == "INVALID_ARGUMENT"


def test_wrong_dtype(f32_sess):
    with pytest.raises(ValueError, match=r"input 'x' must be float32, got float64"):
        f32_sess.run(None, {"x": np.zeros((1, 3), np.float64)})
    with pytest.raises(kiln.InvalidArgument, match=r"numpy dtype complex64 has no Kiln dtype"):
        f32_sess.run(None, {"x": np.zeros((1, 3), np.complex64)})


def test_wrong_shape(f32_sess):
    with pytest.raises(kiln.InvalidArgument, match=r"input 'x' must have shape \[batch,3\], got"):
        f32_sess.run(None, {"x": np.zeros((2, 5), np.float32)})
    with pytest.raises(kiln.InvalidArgument, match="must have shape"):
        f32_sess.run(None, {"x": np.zeros((3,), np.float32)})


def test_missing_input_unknown_output_and_bad_arguments(f32_sess):
    with pytest.raises(kiln.InvalidArgument, match="input 'x' is missing"):
        f32_sess.run(None, {})
    with pytest.raises(kiln.InvalidArgument, match="'z' is not an output of signature"):
        f32_sess.run(["z"], {"x": np.zeros((1, 3), np.float32)})
    with pytest.raises(TypeError, match="input_feed must be a dict"):
        f32_sess.run(None, [np.zeros((1, 3), np.float32)])
    with pytest.raises(TypeError, match="keys must be str"):
        f32_sess.run(None, {1: np.zeros((1, 3), np.float32)})


@needs_cli
def test_missing_file_message_is_kilns(tmp_path):
    missing = tmp_path / "absent.onnx"
    with pytest.raises(kiln.KilnError) as e:
        kiln.InferenceSession(str(missing))
    cli = kiln_cli("predict", missing, "--input", "x=/dev/null", "--output-dir", tmp_path / "o")
    assert cli.returncode != 0
    assert cli.stderr.strip() == "kiln: " + str(e.value)
    assert str(missing) in str(e.value)


@needs_cli
@pytest.mark.parametrize("blob", [b"", b"not a model", b"\x08\x07\x12\xff\xff\xff\x0f",
                                  identity_model(TensorProto.FLOAT)[:-7]])
def test_malformed_bytes(tmp_path, blob):
    with pytest.raises(kiln.KilnError) as e:
        kiln.InferenceSession(blob)
    assert not isinstance(e.value, kiln.InternalError)
    p = tmp_path / "bad.onnx"
    p.write_bytes(blob)
    with pytest.raises(kiln.KilnError) as e2:
        kiln.InferenceSession(str(p))
    cli = kiln_cli("predict", p, "--input", "x=/dev/null", "--output-dir", tmp_path / "o")
    assert cli.returncode != 0 and cli.stderr.strip() == "kiln: " + str(e2.value)
    assert type(e.value) is type(e2.value)


def test_rank_above_kilns_maximum(f32_sess):
    with pytest.raises(kiln.InvalidArgument, match="rank 9; Kiln's maximum is 8"):
        f32_sess.run(None, {"x": np.zeros((1,) * 9, np.float32)})


# ------------------------------------------------------------------ real models


def digits_reference(x):
    """The digits MLP recomputed in float64 from the weights in the file."""
    m = onnx.load(str(REPO / "models" / "digits" / "1" / "model.onnx"))
    w = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in m.graph.initializer}
    assert [n.op_type for n in m.graph.node] == ["Gemm", "Relu", "Gemm", "Softmax"]
    h = x.astype(np.float64)
    for n in m.graph.node:
        if n.op_type == "Gemm":
            a = {at.name: helper.get_attribute_value(at) for at in n.attribute}
            b = w[n.input[1]].T if a.get("transB", 0) else w[n.input[1]]
            h = a.get("alpha", 1.0) * (h @ b) + a.get("beta", 1.0) * w[n.input[2]]
        elif n.op_type == "Relu":
            h = np.maximum(h, 0)
        else:
            e = np.exp(h - h.max(axis=1, keepdims=True))
            h = e / e.sum(axis=1, keepdims=True)
    return h


def test_digits_against_numpy_mlp():
    sess = kiln.InferenceSession(str(REPO / "models" / "digits" / "1" / "model.onnx"))
    assert [(a.name, a.type, a.shape) for a in sess.get_inputs()] == [
        ("pixels", "tensor(float)", ["batch", 64])]
    assert sess.get_outputs()[0].shape == ["batch", 10]
    x = np.load(REPO / "models" / "digits_sample.npy")
    labels = np.load(REPO / "models" / "digits_sample_labels.npy")
    (p,) = sess.run(["probabilities"], {"pixels": x})
    np.testing.assert_allclose(p, digits_reference(x), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(p.argmax(axis=1), labels)


@needs_cli
def test_digits_equals_kiln_predict(tmp_path):
    x = np.load(REPO / "models" / "digits_sample.npy")
    r = kiln_cli("predict", REPO / "models" / "digits" / "1" / "model.onnx", "--input",
                 f"pixels={REPO / 'models' / 'digits_sample.npy'}", "--output-dir", tmp_path)
    assert r.returncode == 0, r.stderr
    cli = np.load(tmp_path / "probabilities.npy")
    (p,) = kiln.InferenceSession(str(REPO / "models" / "digits" / "1" / "model.onnx")).run(None, {"pixels": x})
    assert p.dtype == cli.dtype and p.shape == cli.shape
    np.testing.assert_array_equal(p, cli)


def test_torch_exported_model(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10),
        torch.nn.Softmax(dim=1)).eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 2.0)
    buf = io.BytesIO()
    x = torch.randn(2, 3, 16, 16)
    torch.onnx.export(net, x, buf, input_names=["image"], output_names=["probs"],
                      dynamic_axes={"image": {0: "batch"}, "probs": {0: "batch"}}, opset_version=13)
    sess = kiln.InferenceSession(buf.getvalue())
    assert sess.get_inputs()[0].shape == ["batch", 3, 16, 16]
    for n in (1, 5):
        xb = torch.randn(n, 3, 16, 16)
        with torch.no_grad():
            want = net(xb).numpy()
        (got,) = sess.run(None, {"image": xb.numpy()})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    if os.access(KILN_BIN, os.X_OK):  # and the same answer as the command line's
        (tmp_path / "m.onnx").write_bytes(buf.getvalue())
        np.save(tmp_path / "image.npy", xb.numpy())
        r = kiln_cli("predict", tmp_path / "m.onnx", "--input", f"image={tmp_path / 'image.npy'}",
                     "--output-dir", tmp_path / "out")
        assert r.returncode == 0, r.stderr
        np.testing.assert_array_equal(np.load(tmp_path / "out" / "probs.npy"), got)


def savedmodel(rel):
    p = SAVEDMODELS / rel
    if not p.exists():
        pytest.skip(f"shared test data not found: {p}")
    return str(p)


def test_savedmodel_signatures():
    path = savedmodel("tfjs/tfjs-node/test_objects/saved_model/module_with_multiple_signatures")
    sess = kiln.InferenceSession(path)
    sigs = sess.signatures
    assert sorted(sigs) == ["serving_default", "timestwo"]
    assert [(a.name, a.type, a.shape) for a in sigs["timestwo"].inputs] == [
        ("x", "tensor(float)", [])]
    assert sigs["timestwo"].method == "tensorflow/serving/predict"
    x = np.float32(3.5)
    assert sess.signature == "serving_default"
    assert sess.run(None, {"x": x})[0] == np.float32(10.5)  # x*3, the tfjs test model
    two = kiln.InferenceSession(path, signature="timestwo")
    assert two.signature == "timestwo"
    assert two.run(None, {"x": x})[0] == np.float32(7.0)  # x*2
    with pytest.raises(kiln.NotFound, match="signature 'nope' not found"):
        kiln.InferenceSession(path, signature="nope")


def test_savedmodel_dtypes_and_strings():
    base = "machinelearning-testdata/Microsoft.ML.TensorFlow.TestModels/"
    sess = kiln.InferenceSession(savedmodel(base + "model_types_test"))
    types = {a.name: a.type for a in sess.get_inputs()}
    # the model's u8/u16/u32 inputs were exported as int8/16/32 (see the data's README)
    numpy_of = {"b": "bool", "f32": "float32", "f64": "float64", "i16": "int16", "i32": "int32",
                "i64": "int64", "i8": "int8", "u16": "int16", "u32": "int32", "u64": "uint64",
                "u8": "int8"}
    assert {n: types[n] for n in numpy_of} == {n: ORT_TYPES[d] for n, d in numpy_of.items()}
    feed = {n: values_of(d, (3, 2), seed=i) for i, (n, d) in enumerate(sorted(numpy_of.items()))}
    # and the signature binds u8/u16/u32 to the tensors of i8/i16/i32: feed them the same values
    for u, i in (("u8", "i8"), ("u16", "i16"), ("u32", "i32")):
        feed[u] = feed[i]
    outs = sess.run([f"o_{n}" for n in feed], feed)
    for (n, x), y in zip(feed.items(), outs):
        assert y.dtype == x.dtype, n
        np.testing.assert_array_equal(y, x)
    strings = kiln.InferenceSession(savedmodel(base + "model_string_test"))
    a = np.array([["x/y", ""], ["é", "\x00z"]], dtype=object)
    (orig,) = strings.run(["Original_A"], {"A": a, "B": np.array(["p/q"], dtype=object)})
    assert orig.shape == (2, 2) and orig.tolist() == a.tolist()


def test_savedmodel_half_plus_two_signatures():
    path = savedmodel("serving/tensorflow_serving/servables/tensorflow/testdata/"
                      "saved_model_half_plus_two_2_versions/00000123")
    x = np.array([[1.0], [2.0], [-4.0]], np.float32)
    sess = kiln.InferenceSession(path)
    assert sess.get_inputs()[0].shape == [None, 1]
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], 0.5 * x + 2)
    x2 = kiln.InferenceSession(path, signature="regress_x2_to_y3")
    assert x2.get_inputs()[0].name == "inputs"
    np.testing.assert_array_equal(x2.run(["outputs"], {"inputs": x})[0], 0.5 * x + 3)


# ------------------------------------------------------------------ threads and the GIL


def test_concurrent_runs_match_float64_reference():
    w = mlp_weights(7)
    sess = kiln.InferenceSession(tanh_mlp_model(w))
    errors, results = [], {}

    def worker(t):
        try:
            rng = np.random.default_rng(100 + t)
            for i in range(25):
                x = rng.standard_normal((1 + (i + t) % 9, 64)).astype(np.float32)
                (y,) = sess.run(None, {"x": x})
                results[(t, i)] = (x, y)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 6 * 25
    for x, y in results.values():
        np.testing.assert_allclose(y, tanh_mlp_reference(w, x), rtol=1e-4, atol=2e-5)


def slow_session(threads=1):
    so = kiln.SessionOptions()
    so.intra_op_num_threads = threads
    return kiln.InferenceSession(tanh_mlp_model(mlp_weights(11, width=512, layers=16)), so)


def test_gil_released_during_run():
    sess = slow_session()
    x = np.random.default_rng(0).standard_normal((128, 512)).astype(np.float32)
    sess.run(None, {"x": x})  # compile the plan first
    t0 = time.perf_counter()
    sess.run(None, {"x": x})
    one = time.perf_counter() - t0
    big = np.tile(x, (max(1, int(np.ceil(0.3 / one))), 1))  # one run of about 0.3 s

    started, done = threading.Event(), threading.Event()

    def runner():
        started.set()
        sess.run(None, {"x": big})
        done.set()

    th = threading.Thread(target=runner)
    th.start()
    started.wait()
    ticks, start = 0, time.perf_counter()
    last, gap = start, 0.0
    while not done.is_set():
        now = time.perf_counter()
        gap = max(gap, now - last)
        last = now
        ticks += 1
    elapsed = time.perf_counter() - start
    th.join()
    # Were the GIL held during the run, this loop would stand still for the
    # whole run (gap ~ elapsed); released, it keeps ticking alongside.
    assert elapsed > 0.1, elapsed
    assert gap < 0.5 * elapsed, (gap, elapsed)
    assert ticks > 1000, ticks


def test_optimization_log_and_options():
    w = mlp_weights(5)
    blob = tanh_mlp_model(w)
    x = np.random.default_rng(4).standard_normal((3, 64)).astype(np.float32)
    on = kiln.InferenceSession(blob)
    log = on.optimization_log()
    assert isinstance(log, str) and log.strip() and "optimizer disabled" not in log
    so = kiln.SessionOptions()
    so.graph_optimization_level = kiln.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert so.enable_optimization is False
    off = kiln.InferenceSession(blob, so)
    assert "optimizer disabled" in off.optimization_log()
    so2 = kiln.SessionOptions()
    so2.use_reference_kernels = True
    so2.intra_op_num_threads = 1
    ref = kiln.InferenceSession(blob, sess_options=so2)
    want = tanh_mlp_reference(w, x)
    for s in (on, off, ref):
        np.testing.assert_allclose(s.run(None, {"x": x})[0], want, rtol=1e-4, atol=2e-5)
    on.precompile([1, 4])
    with pytest.raises(AttributeError):
        so.not_an_option = 1
    so3 = kiln.SessionOptions()
    so3.max_tensor_bytes = 64
    small = kiln.InferenceSession(blob, so3)
    with pytest.raises(kiln.OutOfMemory, match="above the session's limit of 64 bytes"):
        small.run(None, {"x": x})


def test_run_options_cancel_and_deadline():
    sess = slow_session()
    x = np.random.default_rng(0).standard_normal((64, 512)).astype(np.float32)
    ro = kiln.RunOptions()
    ro.terminate = True
    with pytest.raises(kiln.DeadlineExceeded):
        sess.run(None, {"x": x}, ro)
    ro.terminate = False
    (y,) = sess.run(None, {"x": x}, ro)
    assert y.shape == (64, 512)
    big = np.random.default_rng(0).standard_normal((2048, 512)).astype(np.float32)
    with pytest.raises(kiln.DeadlineExceeded):
        sess.run(None, {"x": big}, kiln.RunOptions(timeout_ms=1))


# ------------------------------------------------------------------ zero copy


def test_outputs_are_handed_over_without_copy():
    sess = kiln.InferenceSession(identity_model(TensorProto.FLOAT, ("n", 1024)))
    x = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    assert not y.flags.owndata  # numpy did not allocate it ...
    assert type(y.base).__name__ == "PyCapsule"  # ... Kiln's tensor is its memory
    assert y.flags.c_contiguous and y.flags.writeable and y.flags.aligned
    assert not np.shares_memory(x, y)
    np.testing.assert_array_equal(y, x)
    y[0, 0] = 42.0  # the array owns its memory: writing it touches nothing else
    (y2,) = sess.run(None, {"x": x})
    assert y2[0, 0] == x[0, 0]
    del y, y2
    gc.collect()


def test_inputs_are_read_in_place():
    sess = kiln.InferenceSession(identity_model(TensorProto.FLOAT, ("n", 64)))
    x = np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)
    before = kiln.input_copies()
    for _ in range(3):
        (y,) = sess.run(None, {"x": x})
    assert kiln.input_copies() == before  # C-contiguous, aligned, native: no copy
    np.testing.assert_array_equal(y, x)
    wide = np.random.default_rng(1).standard_normal((128, 128)).astype(np.float32)
    for view in (wide[:, ::2], np.asfortranarray(x), x.astype(">f4")):
        n = kiln.input_copies()
        (y,) = sess.run(None, {"x": view})
        assert kiln.input_copies() == n + 1
        np.testing.assert_array_equal(y, np.ascontiguousarray(view, dtype=np.float32))
    ro = np.ascontiguousarray(x)
    ro.flags.writeable = False  # a read-only array is read in place too
    n = kiln.input_copies()
    sess.run(None, {"x": ro})
    assert kiln.input_copies() == n


def test_input_is_not_modified():
    m = onnx_bytes([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    keep = x.copy()
    (y,) = kiln.InferenceSession(m).run(None, {"x": x})
    np.testing.assert_array_equal(x, keep)
    np.testing.assert_array_equal(y, -np.maximum(keep, 0))


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_outputs_and_inputs_are_freed():
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("AddressSanitizer's quarantine keeps freed memory resident")
    sess = kiln.InferenceSession(identity_model(TensorProto.FLOAT, ("n", 1024)))
    x = np.ones((1024, 1024), np.float32)  # 4 MiB in, 4 MiB out per run
    wide = np.ones((1024, 2048), np.float32)
    for _ in range(5):
        sess.run(None, {"x": x})
    gc.collect()
    before = rss_bytes()
    for _ in range(100):  # 400 MiB of outputs if they leaked
        (y,) = sess.run(None, {"x": wide[:, ::2] if _ % 2 else x})  # and copied inputs
        del y
    gc.collect()
    assert rss_bytes() - before < 64 << 20



def test_stubs_match_the_module():
    import ast
    tree = ast.parse((REPO / "python" / "kiln" / "__init__.pyi").read_text())
    top = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert top <= set(dir(kiln)), top - set(dir(kiln))
    assert set(kiln.__all__) <= top, set(kiln.__all__) - top
    stub_cls = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    methods = {n.name for n in stub_cls["InferenceSession"].body if isinstance(n, ast.FunctionDef)}
    public = {m for m in dir(kiln.InferenceSession) if not m.startswith("_")}
    assert methods - {"__init__"} == public


def test_onnxruntime_style_code_runs_unchanged():
    ort = kiln  # as `import kiln as ort`
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(REPO / "models" / "digits" / "1" / "model.onnx"), sess_options=so,
                                providers=["CPUExecutionProvider"])
    input_name = sess.get_inputs()[0].name
    output_name = sess.get_outputs()[0].name
    x = np.load(REPO / "models" / "digits_sample.npy")
    pred = sess.run([output_name], {input_name: x})[0]
    np.testing.assert_allclose(pred, digits_reference(x), rtol=1e-4, atol=1e-6)
    assert sess.get_session_options() is so


# ---- profiling: session.profile() and end_profiling() ----

DIGITS = REPO / "models" / "digits" / "1" / "model.onnx"


def test_profile_counts_every_run_of_every_step():
    """digits is Gemm, Relu, Gemm, Softmax (the model's own op histogram); with the
    optimizer off every node is one step, each run N times."""
    so = kiln.SessionOptions()
    so.enable_profiling = True
    so.enable_optimization = False
    sess = kiln.InferenceSession(str(DIGITS), sess_options=so)
    x = np.load(REPO / "models" / "digits_sample.npy")
    n = 7
    for _ in range(n):
        sess.run(None, {"pixels": x})
    steps = sess.profile()
    ops = sess.model_info()["ops"]
    assert sorted(e["op_type"] for e in steps) == sorted(op for op, c in ops.items() for _ in range(c))
    assert [e["calls"] for e in steps] == [n] * len(steps)
    assert all(e["total_ns"] > 0 for e in steps)
    assert [e["total_ns"] for e in steps] == sorted((e["total_ns"] for e in steps), reverse=True)
    assert sum(e["share"] for e in steps) == pytest.approx(1.0)
    gemms = [e for e in steps if e["op_type"] == "Gemm"]
    batch = x.shape[0]
    assert sorted(e["flops"] for e in gemms) == [2.0 * batch * 32 * 10, 2.0 * batch * 64 * 32]
    by_op = sess.profile(by="op")
    gemm = [e for e in by_op if e["op_type"] == "Gemm"]
    assert sum(e["nodes"] for e in gemm) == 2 and sum(e["calls"] for e in gemm) == 2 * n
    assert all(e["node_name"] is None for e in by_op)
    assert sum(e["share"] for e in by_op) == pytest.approx(1.0)
    with pytest.raises(kiln.InvalidArgument):
        sess.profile(by="kernel")
    sess.reset_profiling()
    assert sess.profile() == []
    sess.run(None, {"pixels": x})
    assert [e["calls"] for e in sess.profile()] == [1] * len(steps)


def test_profile_of_the_optimized_graph_and_threads():
    sess = kiln.InferenceSession(str(DIGITS))
    x = np.load(REPO / "models" / "digits_sample.npy")
    sess.run(None, {"pixels": x})
    assert sess.profile() == []  # off by default
    sess.enable_profiling()
    threads = [threading.Thread(target=lambda: [sess.run(None, {"pixels": x}) for _ in range(10)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    steps = sess.profile()
    assert steps and all(e["calls"] == 40 for e in steps)
    # the products are still there after fusion, under a MatMul/Gemm-type op
    assert any("Gemm" in e["op_type"] or "MatMul" in e["op_type"] for e in steps), steps
    assert sum(e["share"] for e in steps) == pytest.approx(1.0)


def test_end_profiling_writes_a_chrome_trace(tmp_path, monkeypatch):
    import json
    monkeypatch.chdir(tmp_path)
    so = kiln.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = "digits"
    sess = kiln.InferenceSession(str(DIGITS), sess_options=so)
    x = np.load(REPO / "models" / "digits_sample.npy")
    for _ in range(3):
        sess.run(None, {"pixels": x})
    steps = sess.profile()
    path = sess.end_profiling()
    assert Path(path).name.startswith("digits_") and path.endswith(".json")
    events = json.loads((tmp_path / path).read_text())
    assert len(events) == len(steps)
    for ev in events:
        assert ev["ph"] == "X" and ev["cat"] == "Node" and ev["dur"] > 0 and ev["args"]["calls"] == 3
    # laid end to end in step order
    for a, b in zip(events, events[1:]):
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"])
    assert {ev["args"]["op_name"] for ev in events} == {e["op_type"] for e in steps}
    # profiling is over, as in ONNX Runtime
    sess.run(None, {"pixels": x})
    assert sess.profile() == [] and sess.end_profiling() == ""


def test_profiling_the_reference_kernels_is_refused():
    so = kiln.SessionOptions()
    so.use_reference_kernels = True
    so.enable_profiling = True
    with pytest.raises(kiln.Unsupported, match="reference"):
        kiln.InferenceSession(str(DIGITS), sess_options=so)
    so.enable_profiling = False
    sess = kiln.InferenceSession(str(DIGITS), sess_options=so)
    with pytest.raises(kiln.Unsupported, match="reference"):
        sess.enable_profiling()
    assert sess.profile() == []


# ------------------------------------------------------------------ compute precision


def test_precision_bf16_int8_against_fp32_and_numpy():
    """InferenceSession(precision=...) and SessionOptions.precision on the
    bundled digits MLP over scikit-learn's 450 held-out digits: bf16 and int8
    within tolerance of fp32 (top-1 agreement >= 99%, probabilities within
    0.1), and equal to test_precision's numpy emulations of Kiln's bf16 and
    dynamic int8 arithmetic within 1e-4 where the CPU runs them (elsewhere
    the session stays fp32, as documented)."""
    sk = pytest.importorskip("sklearn.datasets")
    from sklearn.model_selection import train_test_split
    from test_precision import AVX512, VNNI, bf16, quant_gemm
    d = sk.load_digits()
    _, x, _, y = train_test_split(d.data.astype(np.float32), d.target.astype(np.int64),
                                  test_size=0.25, random_state=0, stratify=d.target)
    path = str(REPO / "models" / "digits" / "1" / "model.onnx")
    m = onnx.load(path)
    init = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in m.graph.initializer}
    layers = []
    for n in m.graph.node:
        if n.op_type == "Gemm":
            a = {at.name: helper.get_attribute_value(at) for at in n.attribute}
            w = init[n.input[1]]
            layers.append((w if a.get("transB", 0) else w.T, init[n.input[2]]))
    (w1, b1), (w2, b2) = layers

    def softmax(z):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    emulated = {
        "fp32": digits_reference(x),
        "bf16": softmax((bf16(np.maximum(bf16(x) @ bf16(w1).T + b1, 0)) @ bf16(w2).T + b2)
                        .astype(np.float64)),
        "int8": softmax(quant_gemm(np.maximum(quant_gemm(x, w1, b1), 0), w2, b2)
                        .astype(np.float64)),
    }
    runs = {"bf16": AVX512, "int8": VNNI}
    probs = {}
    for p in ("fp32", "bf16", "int8"):
        (probs[p],) = kiln.InferenceSession(path, precision=p).run(["probabilities"], {"pixels": x})
        so = kiln.SessionOptions()
        so.precision = p
        (again,) = kiln.InferenceSession(path, sess_options=so).run(None, {"pixels": x})
        np.testing.assert_array_equal(again, probs[p])
    fp32 = probs["fp32"]
    np.testing.assert_allclose(fp32, emulated["fp32"], rtol=1e-4, atol=1e-6)
    assert (fp32.argmax(1) == y).mean() > 0.9
    for p in ("bf16", "int8"):
        agree = (probs[p].argmax(1) == fp32.argmax(1)).mean()
        assert agree >= 0.99, f"{p}: top-1 agrees with fp32 on {agree:.4f}"
        assert np.abs(probs[p] - fp32).max() < 0.1
        if runs[p]:
            err = np.abs(probs[p] - emulated[p]).max()
            assert err < 1e-4, f"{p} off the numpy emulation by {err}"
            assert np.abs(probs[p] - fp32).max() > 1e-6, f"{p} ran fp32"
        else:
            np.testing.assert_allclose(probs[p], fp32, rtol=1e-5, atol=1e-7)


def test_precision_bad_value_is_value_error():
    path = str(REPO / "models" / "digits" / "1" / "model.onnx")
    for bad in ("fp16", "INT8", "", "auto"):
        with pytest.raises(ValueError, match=r"precision must be 'fp32', 'bf16' or 'int8', got "
                                             + repr(bad)):
            kiln.InferenceSession(path, precision=bad)
        so = kiln.SessionOptions()
        so.precision = bad
        with pytest.raises(kiln.InvalidArgument, match="precision must be"):
            kiln.InferenceSession(path, sess_options=so)
    with pytest.raises(ValueError, match="got 8"):
        kiln.InferenceSession(path, precision=8)
    assert "precision='fp32'" in repr(kiln.SessionOptions())
    # None is the default, fp32
    x = np.load(REPO / "models" / "digits_sample.npy")
    (p,) = kiln.InferenceSession(path, precision=None).run(None, {"pixels": x})
    np.testing.assert_allclose(p, digits_reference(x), rtol=1e-4, atol=1e-6)
