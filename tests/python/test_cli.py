"""Tests for the `kiln` command-line tool: inspect, predict and the .npy codec.

The tests build small ONNX models with onnx.helper (Add/Mul over two inputs
with a symbolic batch dim, Identity over every dtype) and drive the real
binary. The binary is $KILN_BIN, or build/kiln in this checkout; the tests
skip with a message when it is missing.

Contract checked here (see src/cli/*.c): `--help` everywhere exits 0; a bad
command line exits 2 with one line on stderr; any other failure exits
non-zero with one line "kiln: ..." on stderr that names the bad thing.
"""

import json
import os
import re
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
KILN = os.environ.get("KILN_BIN") or str(REPO / "build" / "kiln")

pytestmark = pytest.mark.skipif(
    not (os.path.isfile(KILN) and os.access(KILN, os.X_OK)),
    reason=f"kiln binary not found at {KILN} (build it, or set KILN_BIN)",
)

# numpy dtype -> (ONNX element type, Kiln dtype name)
DTYPES = {
    "float32": (TensorProto.FLOAT, "float32"),
    "float64": (TensorProto.DOUBLE, "float64"),
    "float16": (TensorProto.FLOAT16, "float16"),
    "int8": (TensorProto.INT8, "int8"),
    "uint8": (TensorProto.UINT8, "uint8"),
    "int16": (TensorProto.INT16, "int16"),
    "uint16": (TensorProto.UINT16, "uint16"),
    "int32": (TensorProto.INT32, "int32"),
    "uint32": (TensorProto.UINT32, "uint32"),
    "int64": (TensorProto.INT64, "int64"),
    "uint64": (TensorProto.UINT64, "uint64"),
    "bool": (TensorProto.BOOL, "bool"),
}


# ------------------------------------------------------------------ helpers


def kiln(*args):
    """Run the kiln binary; text output, undecodable bytes replaced."""
    return subprocess.run(
        [KILN, *map(str, args)], capture_output=True, text=True, errors="replace", timeout=120
    )


def assert_one_line_error(r, *needles, code=None):
    """A failure: non-zero exit (or exactly `code`), one stderr line naming each needle."""
    if code is None:
        assert r.returncode != 0, r
    else:
        assert r.returncode == code, r
    err = r.stderr.strip()
    assert err, r
    assert "\n" not in err, f"expected one line on stderr, got:\n{err}"
    assert err.startswith("kiln"), err
    for n in needles:
        assert str(n) in err, f"{n!r} not in {err!r}"
    return err


def save_model(graph, path, opset=13, check=True):
    model = helper.make_model(
        graph,
        producer_name="kiln-test",
        producer_version="1.0",
        opset_imports=[helper.make_opsetid("", opset)],
    )
    model.ir_version = 7
    if check:  # onnx 1.12's checker rejects rank-unknown graph inputs
        onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def add_mul_model(path, np_dtype="float32"):
    """z = x + y; "scaled:0" = z * W, with x, y of shape [N, 3] and W a [3] initializer."""
    et = DTYPES[np_dtype][0]
    w = numpy_helper.from_array(np.array([1, 2, 3], dtype=np_dtype), name="W")
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "y"], ["z"], name="add"),
            helper.make_node("Mul", ["z", "W"], ["scaled:0"], name="mul"),
        ],
        "add_mul",
        [
            helper.make_tensor_value_info("x", et, ["N", 3]),
            helper.make_tensor_value_info("y", et, ["N", 3]),
        ],
        [
            helper.make_tensor_value_info("z", et, ["N", 3]),
            helper.make_tensor_value_info("scaled:0", et, ["N", 3]),
        ],
        initializer=[w],
    )
    return save_model(graph, path)


def mixed_identity_model(path):
    """Identity over an int64 [N], a bool [2, 2] and a string [?] input."""
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["ids"], ["ids_out"]),
            helper.make_node("Identity", ["mask"], ["mask_out"]),
            helper.make_node("Identity", ["text"], ["text/out"]),
        ],
        "mixed",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 2]),
            helper.make_tensor_value_info("text", TensorProto.STRING, [None]),
        ],
        [
            helper.make_tensor_value_info("ids_out", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("mask_out", TensorProto.BOOL, [2, 2]),
            helper.make_tensor_value_info("text/out", TensorProto.STRING, [None]),
        ],
    )
    return save_model(graph, path)


def identity_model(path, elem_type):
    """y = Identity(x) with x of unknown rank."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", elem_type, None)],
        [helper.make_tensor_value_info("y", elem_type, None)],
    )
    return save_model(graph, path, check=False)


def save_npy(path, arr, version=None):
    with open(path, "wb") as f:
        if version is None:
            np.save(f, arr)
        else:
            np.lib.format.write_array(f, arr, version=version)
    return path


def raw_npy(path, header, data=b"", version=(1, 0)):
    """A hand-made .npy: header text (a dict literal), then data bytes."""
    h = header.encode("latin1")
    fmt = "<H" if version[0] == 1 else "<I"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY" + bytes(version) + struct.pack(fmt, len(h)) + h + data)
    return path


def kiln_dtype_of(arr):
    return "string" if arr.dtype.kind in "SU" else DTYPES[arr.dtype.newbyteorder("=").name][1]


def expected_output(arr):
    """What predict writes back for arr: same values, native order; strings as UTF-8 'S'."""
    if arr.dtype.kind == "U":
        return np.char.encode(arr, "utf-8") if arr.size else arr.astype("S1")
    if arr.dtype.kind == "S":
        return arr
    return arr.astype(arr.dtype.newbyteorder("="))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {
        "add": add_mul_model(d / "add.onnx"),
        "mixed": mixed_identity_model(d / "mixed.onnx"),
    }


@pytest.fixture(scope="module")
def identity_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("identity")
    out = {name: identity_model(d / f"{name}.onnx", et) for name, (et, _) in DTYPES.items()}
    out["string"] = identity_model(d / "string.onnx", TensorProto.STRING)
    return out


# ------------------------------------------------------------- help, usage


def test_top_level_help_and_version():
    r = kiln("--help")
    assert r.returncode == 0, r
    assert "usage" in r.stdout and "inspect" in r.stdout and "predict" in r.stdout
    r = kiln("--version")
    assert r.returncode == 0, r
    # "kiln 0.1.0 (git REVISION)": the git revision of the build, "unknown" outside a checkout
    m = re.fullmatch(r"kiln (\d+\.\d+\.\d+) \(git (\S+)\)", r.stdout.strip())
    assert m, r.stdout
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=7", "HEAD"],
                          capture_output=True, text=True)
    if head.returncode == 0 and head.stdout.strip():
        assert head.stdout.strip()[:7] in m.group(2), (m.group(2), head.stdout)


@pytest.mark.parametrize("cmd", ["inspect", "predict"])
def test_subcommand_help(cmd):
    r = kiln(cmd, "--help")
    assert r.returncode == 0, r
    assert r.stdout.startswith(f"usage: kiln {cmd}")
    assert kiln(cmd, "-h").returncode == 0
    assert kiln("help", cmd).stdout == r.stdout


def test_usage_errors():
    assert_one_line_error(kiln("frobnicate"), "frobnicate", code=2)
    assert_one_line_error(kiln("--frobnicate"), "--frobnicate", code=2)
    assert_one_line_error(kiln("inspect", "m.onnx", "--bogus"), "--bogus", code=2)
    assert_one_line_error(kiln("predict", "m.onnx", "--output-dir", "o", "--bogus"), "--bogus", code=2)
    assert_one_line_error(kiln("inspect"), "MODEL", code=2)
    assert_one_line_error(kiln("predict", "m.onnx"), "--output-dir", code=2)
    assert_one_line_error(kiln("predict", "m.onnx", "--output-dir"), "--output-dir", code=2)
    assert_one_line_error(kiln("predict", "m.onnx", "--input", "x", "--output-dir", "o"), "x", code=2)
    assert kiln().returncode == 2


def test_missing_model_file(tmp_path):
    assert_one_line_error(kiln("inspect", tmp_path / "nope.onnx"), "nope.onnx")


# ------------------------------------------------------------------ inspect


def test_inspect_text(models):
    r = kiln("inspect", models["add"])
    assert r.returncode == 0, r
    out = r.stdout
    assert "format: onnx" in out.lower()
    assert "kiln-test" in out
    assert "ai.onnx 13" in out
    assert "serving_default" in out
    assert "x: float32[N,3]" in out
    assert "y: float32[N,3]" in out
    assert "z: float32[N,3]" in out
    assert "scaled:0: float32[N,3]" in out
    lines = [ln.split() for ln in out.splitlines()]
    assert ["Add", "1"] in lines and ["Mul", "1"] in lines
    assert "nodes: 2" in out
    assert "parameters: 3 (12 bytes)" in out


def test_inspect_text_unknown_dims(models, identity_models):
    out = kiln("inspect", models["mixed"]).stdout
    assert "ids: int64[N]" in out
    assert "mask: bool[2,2]" in out
    assert "text: string[?]" in out
    assert "text/out: string[?]" in out
    assert "Identity 3" in " ".join(out.split())
    out = kiln("inspect", identity_models["float32"]).stdout
    assert "x: float32 (rank unknown)" in out


def test_inspect_json(models):
    r = kiln("inspect", models["add"], "--json")
    assert r.returncode == 0, r
    j = json.loads(r.stdout)
    assert set(j) >= {
        "format", "producer", "ir_version", "opsets", "signatures", "ops",
        "param_count", "param_bytes", "node_count",
    }
    assert j["format"].lower() == "onnx"
    assert "kiln-test" in j["producer"]
    assert j["ir_version"] == 7
    assert {"domain": "ai.onnx", "version": 13} in j["opsets"]
    assert j["ops"] == {"Add": 1, "Mul": 1}
    assert j["param_count"] == 3
    assert j["param_bytes"] == 12
    assert j["node_count"] == 2
    assert len(j["signatures"]) == 1
    sig = j["signatures"][0]
    assert sig["name"] == "serving_default"
    assert isinstance(sig["method"], str)
    assert sig["inputs"] == [
        {"name": "x", "dtype": "float32", "shape": ["N", 3]},
        {"name": "y", "dtype": "float32", "shape": ["N", 3]},
    ]
    assert sig["outputs"] == [
        {"name": "z", "dtype": "float32", "shape": ["N", 3]},
        {"name": "scaled:0", "dtype": "float32", "shape": ["N", 3]},
    ]


def test_inspect_json_unknown_dims(models, identity_models):
    j = json.loads(kiln("inspect", "--json", models["mixed"]).stdout)
    ins = {v["name"]: v for v in j["signatures"][0]["inputs"]}
    assert ins["ids"] == {"name": "ids", "dtype": "int64", "shape": ["N"]}
    assert ins["mask"]["shape"] == [2, 2] and ins["mask"]["dtype"] == "bool"
    assert ins["text"] == {"name": "text", "dtype": "string", "shape": [None]}
    assert j["ops"] == {"Identity": 3}
    assert j["param_count"] == 0
    j = json.loads(kiln("inspect", identity_models["float32"], "--json").stdout)
    assert j["signatures"][0]["inputs"][0]["shape"] is None


# ------------------------------------------------------------------ predict


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_predict_add_mul(tmp_path, dtype):
    model = add_mul_model(tmp_path / "m.onnx", dtype)
    x = (np.arange(15).reshape(5, 3) - 4).astype(dtype)
    y = (np.arange(15).reshape(5, 3) * 3).astype(dtype)
    out_dir = tmp_path / "out" / "nested"  # created, parents too
    r = kiln(
        "predict", model,
        "--input", f"x={save_npy(tmp_path / 'x.npy', x)}",
        "--input", f"y={save_npy(tmp_path / 'y.npy', y)}",
        "--output-dir", out_dir,
    )
    assert r.returncode == 0, r
    assert r.stdout.splitlines() == [
        f"z: {dtype}[5,3] -> {out_dir}/z.npy",
        f"scaled:0: {dtype}[5,3] -> {out_dir}/scaled_0.npy",
    ]
    z = np.load(out_dir / "z.npy")
    s = np.load(out_dir / "scaled_0.npy")
    assert z.dtype == np.dtype(dtype) and s.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(z, x + y)
    np.testing.assert_array_equal(s, (x + y) * np.array([1, 2, 3], dtype=dtype))


def test_predict_signature_flag_and_equals_syntax(tmp_path, models):
    x = np.ones((2, 3), np.float32)
    px = save_npy(tmp_path / "x.npy", x)
    r = kiln(
        "predict", models["add"], f"--input=x={px}", f"--input=y={px}",
        "--signature", "serving_default", f"--output-dir={tmp_path / 'o'}",
    )
    assert r.returncode == 0, r
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "z.npy"), x + x)
    r = kiln(
        "predict", models["add"], "--input", f"x={px}", "--input", f"y={px}",
        "--signature", "nope", "--output-dir", tmp_path / "o2",
    )
    assert_one_line_error(r, "nope")


def test_predict_mixed_dtypes(tmp_path, models):
    ids = np.array([3, -1, 2**40], np.int64)
    mask = np.array([[True, False], [False, True]])
    text = np.array(["héllo", "", "日本語"])
    out = tmp_path / "out"
    r = kiln(
        "predict", models["mixed"],
        "--input", f"ids={save_npy(tmp_path / 'ids.npy', ids)}",
        "--input", f"mask={save_npy(tmp_path / 'mask.npy', mask)}",
        "--input", f"text={save_npy(tmp_path / 'text.npy', text)}",
        "--output-dir", out,
    )
    assert r.returncode == 0, r
    assert r.stdout.splitlines() == [
        f"ids_out: int64[3] -> {out}/ids_out.npy",
        f"mask_out: bool[2,2] -> {out}/mask_out.npy",
        f"text/out: string[3] -> {out}/text_out.npy",
    ]
    np.testing.assert_array_equal(np.load(out / "ids_out.npy"), ids)
    m = np.load(out / "mask_out.npy")
    assert m.dtype == np.bool_
    np.testing.assert_array_equal(m, mask)
    t = np.load(out / "text_out.npy")
    assert t.dtype.kind == "S"
    assert [s.decode("utf-8") for s in t] == list(text)


ROUND_TRIP_DTYPES = [
    "<f4", "<f8", "<f2", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "|b1",
    ">f4", ">f8", ">f2", ">i2", ">u2", ">i4", ">u4", ">i8", ">u8",
]


def sample(dtype, shape):
    n = int(np.prod(shape))
    if np.dtype(dtype).kind == "b":
        return (np.arange(n) % 3 == 0).reshape(shape)
    kind = np.dtype(dtype).kind
    a = np.arange(n) * 7 - 3
    if kind == "u":
        a = np.abs(a)
    if kind == "f":
        a = a / 4
    a = a.astype(dtype)
    if kind in "iu" and n:
        a[-1] = np.iinfo(a.dtype).max  # all bytes matter, so byte order shows
    return a.reshape(shape)


def run_identity(tmp_path, model, arr, version=None):
    src = save_npy(tmp_path / "in.npy", arr, version)
    out = tmp_path / "out"
    r = kiln("predict", model, "--input", f"x={src}", "--output-dir", out)
    assert r.returncode == 0, r
    dims = ",".join(str(d) for d in arr.shape)
    assert r.stdout.splitlines() == [f"y: {kiln_dtype_of(arr)}[{dims}] -> {out}/y.npy"]
    return np.load(out / "y.npy")


@pytest.mark.parametrize("dtype", ROUND_TRIP_DTYPES)
@pytest.mark.parametrize("shape", [(2, 3), (), (0,), (2, 0, 3)], ids=str)
def test_npy_round_trip(tmp_path, identity_models, dtype, shape):
    arr = sample(dtype, shape)
    model = identity_models[np.dtype(dtype).newbyteorder("=").name]
    got = run_identity(tmp_path, model, arr)
    want = expected_output(arr)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_format_versions(tmp_path, identity_models, version):
    arr = sample("<f4", (3, 4))
    np.testing.assert_array_equal(run_identity(tmp_path, identity_models["float32"], arr, version), arr)
    text = np.array(["a", "bé"])
    got = run_identity(tmp_path, identity_models["string"], text, version)
    np.testing.assert_array_equal(got, expected_output(text))


@pytest.mark.parametrize(
    "arr",
    [
        np.array([b"ab", b"", b"xyz"]),
        np.array([b"a\x00b", b"\xff\xfe"]),  # binary-safe, embedded NUL kept
        np.array(["héllo", "", "日本語", "😀x"]),
        np.array(["a", "bc"], dtype=">U3"),
        np.array([["x", "yy"], ["zzz", ""]]),
        np.array("scalar"),
        np.array(b"bytes"),
        np.array([], dtype="S3"),
        np.array([], dtype="U2").reshape(0, 2),
    ],
    ids=lambda a: f"{a.dtype.str}{list(a.shape)}",
)
def test_npy_round_trip_strings(tmp_path, identity_models, arr):
    got = run_identity(tmp_path, identity_models["string"], arr)
    want = expected_output(arr)
    assert got.dtype.kind == "S" and got.shape == arr.shape
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------- error paths


def test_predict_missing_input(tmp_path, models):
    px = save_npy(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    r = kiln("predict", models["add"], "--input", f"x={px}", "--output-dir", tmp_path / "o")
    assert_one_line_error(r, "'y'")
    assert not (tmp_path / "o").exists()


def test_predict_unknown_input(tmp_path, models):
    px = save_npy(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    r = kiln(
        "predict", models["add"], "--input", f"x={px}", "--input", f"y={px}",
        "--input", f"bogus={px}", "--output-dir", tmp_path / "o",
    )
    assert_one_line_error(r, "bogus")


def test_predict_duplicate_input(tmp_path, models):
    px = save_npy(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    r = kiln(
        "predict", models["add"], "--input", f"x={px}", "--input", f"x={px}",
        "--input", f"y={px}", "--output-dir", tmp_path / "o",
    )
    assert_one_line_error(r, "'x'")


def test_predict_missing_file(tmp_path, models):
    px = save_npy(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    r = kiln(
        "predict", models["add"], "--input", f"x={px}", "--input", f"y={tmp_path / 'gone.npy'}",
        "--output-dir", tmp_path / "o",
    )
    assert_one_line_error(r, "gone.npy")


def test_predict_runtime_error_is_one_line(tmp_path, models):
    # float64 data for a float32 input: the library rejects it
    px = save_npy(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    py = save_npy(tmp_path / "y.npy", np.ones((2, 3), np.float64))
    r = kiln("predict", models["add"], "--input", f"x={px}", "--input", f"y={py}",
             "--output-dir", tmp_path / "o")
    assert_one_line_error(r)


HDR = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }"
GOOD_DATA = np.arange(6, dtype="<f4").tobytes()
BAD_NPY = {
    "truncated_header": lambda p: p.write_bytes(p.read_bytes()[:30]),
    "truncated_data": lambda p: p.write_bytes(p.read_bytes()[:-1]),
    "extra_data": lambda p: p.write_bytes(p.read_bytes() + b"\0"),
    "too_short": lambda p: p.write_bytes(b"\x93NUM"),
    "bad_magic": lambda p: p.write_bytes(b"PK\x03\x04" + p.read_bytes()[4:]),
    "bad_version": lambda p: p.write_bytes(p.read_bytes()[:6] + b"\x09\x00" + p.read_bytes()[8:]),
    "fortran_order": lambda p: raw_npy(p, HDR % ("<f4", "True", "(2, 3)"), GOOD_DATA),
    "huge_shape": lambda p: raw_npy(p, HDR % ("<f4", "False", "(4611686018427387904, 8)"), GOOD_DATA),
    "huge_dim": lambda p: raw_npy(p, HDR % ("<f4", "False", "(123456789012345678901234567890,)"), GOOD_DATA),
    "large_shape_small_data": lambda p: raw_npy(p, HDR % ("<f4", "False", "(1099511627776,)"), GOOD_DATA),
    "negative_dim": lambda p: raw_npy(p, HDR % ("<f4", "False", "(-1, 6)"), GOOD_DATA),
    "rank_9": lambda p: raw_npy(p, HDR % ("<f4", "False", "(1,1,1,1,1,1,1,1,6)"), GOOD_DATA),
    "object_dtype": lambda p: raw_npy(p, HDR % ("|O", "False", "(3,)"), b"\0" * 24),
    "complex_dtype": lambda p: raw_npy(p, HDR % ("<c8", "False", "(3,)"), b"\0" * 24),
    "header_too_long": lambda p: p.write_bytes(b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFF0) + b"{"),
    "header_garbage": lambda p: raw_npy(p, "__import__('os').system('true')\n", GOOD_DATA),
    "missing_key": lambda p: raw_npy(p, "{'descr': '<f4', 'shape': (2, 3), }", GOOD_DATA),
    "bad_unicode": lambda p: raw_npy(p, HDR % ("<U1", "False", "(1,)"), struct.pack("<I", 0x110000)),
}


@pytest.mark.parametrize("case", sorted(BAD_NPY))
def test_predict_bad_npy(tmp_path, identity_models, case):
    p = save_npy(tmp_path / "bad_input.npy", np.arange(6, dtype="<f4").reshape(2, 3))
    BAD_NPY[case](p)
    model = identity_models["string" if case == "bad_unicode" else "float32"]
    r = kiln("predict", model, "--input", f"x={p}", "--output-dir", tmp_path / "o")
    assert r.returncode == 1, r
    assert_one_line_error(r, "bad_input.npy")
    assert not (tmp_path / "o").exists()


def test_output_name_sanitized_and_collisions(tmp_path):
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["x"], ["a/b c:0"]),
            helper.make_node("Identity", ["x"], ["ok.name-1_x"]),
        ],
        "names",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [
            helper.make_tensor_value_info("a/b c:0", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("ok.name-1_x", TensorProto.FLOAT, [2]),
        ],
    )
    model = save_model(graph, tmp_path / "names.onnx")
    px = save_npy(tmp_path / "x.npy", np.array([1.5, -2], np.float32))
    out = tmp_path / "o"
    r = kiln("predict", model, "--input", f"x={px}", "--output-dir", out)
    assert r.returncode == 0, r
    assert sorted(os.listdir(out)) == ["a_b_c_0.npy", "ok.name-1_x.npy"]
    assert f"a/b c:0: float32[2] -> {out}/a_b_c_0.npy" in r.stdout.splitlines()


@pytest.mark.parametrize("flag", [None, "--disable-optimizer"])
def test_predict_absent_interior_output_at_slot_growth(tmp_path, flag):
    """LayerNormalization with its Mean output left empty ("") while Y and InvStdDev
    are used, behind chains of 40 to 80 Relu nodes: one of these graphs has exactly as
    many values as the plan's first slot block, so the slot made for the empty output
    grows (and moves) the slot array right before the step's kernel compiles. The plan
    once kept pointers into the old array (a use after free the sanitizer build finds).
    Outputs are checked against numpy."""
    x = np.linspace(-2, 3, 16, dtype=np.float32).reshape(2, 8)
    scale = np.linspace(0.5, 1.5, 8, dtype=np.float32)
    bias = np.linspace(-0.25, 0.25, 8, dtype=np.float32)
    mean = x.mean(axis=1, keepdims=True)
    inv_std = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    want_y = np.maximum((x - mean) * inv_std * scale + bias, 0)
    for chain in range(40, 81):
        nodes = [helper.make_node("LayerNormalization", ["x", "scale", "bias"],
                                  ["r0", "", "inv_std"], axis=-1, epsilon=1e-5)]
        for i in range(chain):
            nodes.append(helper.make_node("Relu", [f"r{i}"], [f"r{i + 1}"]))
        graph = helper.make_graph(
            nodes, "slots",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
            [helper.make_tensor_value_info(f"r{chain}", TensorProto.FLOAT, [2, 8]),
             helper.make_tensor_value_info("inv_std", TensorProto.FLOAT, [2, 1])],
            [numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(bias, "bias")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        path = tmp_path / f"m{chain}.onnx"
        onnx.save(model, path)
        out = tmp_path / f"out{chain}"
        args = ["predict", path, "--input", f"x={save_npy(tmp_path / 'x.npy', x)}",
                "--output-dir", out]
        r = kiln(*args, *([flag] if flag else []))
        assert r.returncode == 0, (chain, r.stderr)
        np.testing.assert_allclose(np.load(out / f"r{chain}.npy"), want_y, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.load(out / "inv_std.npy"), inv_std, rtol=1e-5)


def test_inspect_optimized_log(tmp_path):
    """`kiln inspect --optimized` prints the optimizer's log: per pass, the node counts
    (chaining from the graph as imported to the graph as optimized) and the fusions by
    kind, then the arena and packed-weight bytes of the plan compiled at batch 1."""
    rng = np.random.default_rng(3)
    c = 4
    inits = [numpy_helper.from_array(rng.standard_normal((c, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((c, c, 3, 3)).astype(np.float32), "w2")]
    for name, val in (("s", 1.5), ("b", 0.1), ("m", 0.2), ("v", 2.0)):
        inits.append(numpy_helper.from_array(np.full(c, val, np.float32), name))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r"]),
             # stride 2: oneDNN's kernel, which packs its weights (Kiln's direct kernel for
             # few output channels takes the stride-1 one and packs nothing)
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    graph = helper.make_graph(
        nodes, "convbn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", c, 4, 4])], inits)
    model = save_model(graph, tmp_path / "convbn.onnx")
    r = kiln("inspect", model, "--optimized")
    assert r.returncode == 0, r
    out = r.stdout.splitlines()
    total = [ln for ln in out if ln.strip().startswith("optimizer:")]
    assert total and total[0].split()[1:4] == ["4", "->", "2"], total
    passes = [ln.split() for ln in out if " nodes " in ln and "->" in ln and "optimizer:" not in ln]
    assert len(passes) >= 13, out
    count = 4
    for p in passes:  # "<pass> A -> B nodes <ms> ms[; kind xN, ...]"
        assert int(p[1]) == count, (p, count)
        count = int(p[3])
    assert count == 2
    text = "\n".join(out)
    assert "Conv+BatchNormalization x1" in text
    fused = [ln for ln in out if ln.split()[0] == "conv_fusion"]
    assert fused and "Conv+" in fused[0] and "Relu" in fused[0], fused
    arena = [ln.split() for ln in out if ln.strip().startswith("arena ")]
    assert arena, text
    # the 4 x 8 x 8 float intermediate between the two convolutions lives in the arena
    assert int(arena[0][1]) >= c * 8 * 8 * 4 and int(arena[0][5]) > 0, arena
    assert arena[0][7:] == ["(1", "plan)"], arena  # inspect compiles the batch-1 plan
