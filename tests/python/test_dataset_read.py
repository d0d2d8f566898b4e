"""test_dataset_read.py - kiln_dataset_read (kiln.h, src/api/dataset.c), the reader of
`kiln compile --calibration/--eval DIR`, `kiln gate` folders and `kiln serve`'s
assets.extra/kiln_calibration/ folder, through libkiln.so with ctypes.

A two-input ONNX model made with onnx.helper (x: float32 [N, 3], "ids:0": int64 [N, k]; the
second name needs the '_' file name). Written with numpy:
- a folder with x.npy + ids_0.npy and two .npz archives reads as numpy's concatenation, the
  .npy files first, then the archives in name order; a lone .npz reads as its arrays;
- errors name the file and the input: an input without a file (and no archive), an archive
  without a member, a wrong dtype, a fixed dimension, inputs with different sample counts, a
  file whose trailing shape differs from the files before (a dynamic dimension), a file that
  does not parse, and NaN only with KILN_DATASET_FINITE (with the sample's index);
- kiln_dataset_check counts samples.
"""

import ctypes as C
import os
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FINITE = 1
F32, I64 = 1, 11  # KILN_DTYPE_F32, KILN_DTYPE_I64


class Tensor(C.Structure):
    _fields_ = [("dtype", C.c_int), ("rank", C.c_int), ("dims", C.c_int64 * 8),
                ("data", C.c_void_p), ("nbytes", C.c_size_t), ("owns_data", C.c_int)]


class Dataset(C.Structure):
    _fields_ = [("n", C.c_int), ("names", C.POINTER(C.c_char_p)),
                ("t", C.POINTER(C.POINTER(Tensor))), ("samples", C.c_int64)]


@pytest.fixture(scope="module")
def lib():
    path = Path(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln"))).parent / "libkiln.so"
    if not path.exists():
        pytest.skip(f"libkiln.so not found at {path}: build it or set KILN_BIN")
    lib = C.CDLL(str(path))
    lib.kiln_last_error.restype = C.c_char_p
    lib.kiln_model_load.argtypes = [C.c_char_p, C.c_void_p, C.POINTER(C.c_void_p)]
    lib.kiln_model_find_signature.restype = C.c_void_p
    lib.kiln_model_find_signature.argtypes = [C.c_void_p, C.c_char_p]
    lib.kiln_dataset_read.argtypes = [C.c_char_p, C.c_void_p, C.c_uint, C.POINTER(Dataset),
                                      C.c_char_p]
    lib.kiln_dataset_check.argtypes = [C.POINTER(Dataset), C.c_char_p, C.c_int64, C.c_char_p]
    lib.kiln_dataset_free.argtypes = [C.POINTER(Dataset)]
    lib.kiln_model_free.argtypes = [C.c_void_p]
    return lib


@pytest.fixture(scope="module")
def sig(lib, tmp_path_factory):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    ids = helper.make_tensor_value_info("ids:0", TensorProto.INT64, ["n", "k"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    z = helper.make_tensor_value_info("z", TensorProto.INT64, ["n", "k"])
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"]),
                           helper.make_node("Identity", ["ids:0"], ["z"])], "g", [x, ids], [y, z])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    path = tmp_path_factory.mktemp("model") / "two.onnx"
    onnx.save(m, str(path))
    model = C.c_void_p()
    assert lib.kiln_model_load(str(path).encode(), None, C.byref(model)) == 0, lib.kiln_last_error()
    s = lib.kiln_model_find_signature(model, None)
    assert s
    yield s
    lib.kiln_model_free(model)


def read(lib, sig, path, flags=0):
    """(status, {name: array} or the error message)."""
    d = Dataset()
    err = C.create_string_buffer(512)
    st = lib.kiln_dataset_read(str(path).encode(), sig, flags, C.byref(d), err)
    if st != 0:
        assert d.n == 0 and not d.t  # nothing left to free
        return st, err.value.decode()
    out = {}
    for i in range(d.n):
        t = d.t[i].contents
        shape = tuple(t.dims[:t.rank])
        dt = {F32: np.float32, I64: np.int64}[t.dtype]
        buf = (C.c_char * t.nbytes).from_address(t.data)
        out[d.names[i].decode()] = np.frombuffer(bytes(buf), dt).reshape(shape)
    assert all(len(a) == d.samples for a in out.values())
    few = C.create_string_buffer(512)
    finite = all(np.isfinite(a).all() for a in out.values())
    ok = lib.kiln_dataset_check(C.byref(d), b"D", d.samples, few)
    assert (ok == 0) == finite, few.value
    if not finite:
        assert "data 'D': input 'x' holds NaN at sample" in few.value.decode()
    assert lib.kiln_dataset_check(C.byref(d), b"D", d.samples + 1, few) != 0
    assert f"data 'D' has {d.samples} samples; at least {d.samples + 1}" in few.value.decode()
    lib.kiln_dataset_free(C.byref(d))
    return st, out


def arrays(rng, n):
    return (rng.normal(size=(n, 3)).astype(np.float32),
            rng.integers(-5, 5, size=(n, 2)).astype(np.int64))


def test_folder_of_npy_and_npz_stacks_in_order(lib, sig, tmp_path):
    rng = np.random.default_rng(0)
    (x0, i0), (x1, i1), (x2, i2) = arrays(rng, 5), arrays(rng, 3), arrays(rng, 4)
    np.save(tmp_path / "x.npy", x0)
    np.save(tmp_path / "ids_0.npy", i0)  # "ids:0" with ':' replaced by '_'
    np.savez_compressed(tmp_path / "b.npz", x=x2, ids_0=i2)
    np.savez(tmp_path / "a.npz", **{"x": x1, "ids:0": i1})  # members named either way
    (tmp_path / "README.txt").write_text("ignored")
    np.save(tmp_path / "labels.npy", np.arange(12))  # not an input: ignored
    st, got = read(lib, sig, tmp_path)
    assert st == 0, got
    np.testing.assert_array_equal(got["x"], np.concatenate([x0, x1, x2]))
    np.testing.assert_array_equal(got["ids:0"], np.concatenate([i0, i1, i2]))
    # archives alone, and one archive as the path
    for f in ("x.npy", "ids_0.npy"):
        (tmp_path / f).unlink()
    st, got = read(lib, sig, tmp_path)
    assert st == 0, got
    np.testing.assert_array_equal(got["x"], np.concatenate([x1, x2]))
    st, got = read(lib, sig, tmp_path / "b.npz")
    assert st == 0, got
    np.testing.assert_array_equal(got["ids:0"], i2)


def test_bad_data_names_the_file_and_input(lib, sig, tmp_path):
    rng = np.random.default_rng(1)
    x, ids = arrays(rng, 6)
    nan = x.copy()
    nan[4, 1] = np.nan
    cases = {
        "no_files": ({"x.npy": x}, "has no ids_0.npy for input 'ids:0'"),
        "empty": ({}, "has no x.npy for input 'x' and no .npz files"),
        "member": ({"x.npy": x, "ids_0.npy": ids, "m.npz": {"x": x}},
                   "m.npz' has no array 'ids_0' for input 'ids:0'"),
        "dtype": ({"x.npy": x.astype(np.float64), "ids_0.npy": ids},
                  "x.npy: input 'x' is float64, the signature wants float32"),
        "fixed": ({"x.npy": x[:, :2], "ids_0.npy": ids},
                  "x.npy: input 'x' dimension 1 is 2, the signature wants 3"),
        "count": ({"x.npy": x[:5], "ids_0.npy": ids},
                  "input 'ids:0' has 6 samples, input 'x' 5"),
        "stack": ({"x.npy": x, "ids_0.npy": ids, "m.npz": {"x": x, "ids_0": ids[:, :1]}},
                  "m.npz[ids_0]: input 'ids:0' has another dtype or shape than in the files "
                  "before"),
        "parse": ({"x.npy": b"\x93NUMPY\x01\x00{'descr'", "ids_0.npy": ids}, "input 'x': "),
    }
    for name, (files, why) in cases.items():
        d = tmp_path / name
        d.mkdir()
        for f, a in files.items():
            if isinstance(a, bytes):
                (d / f).write_bytes(a)
            elif isinstance(a, dict):
                np.savez(d / f, **a)
            else:
                np.save(d / f, a)
        st, msg = read(lib, sig, d)
        assert st != 0 and why in msg, (name, msg)
        assert str(d) in msg or name == "parse", (name, msg)
    # NaN: an error only with KILN_DATASET_FINITE, naming the file, input and sample
    d = tmp_path / "nan"
    d.mkdir()
    np.save(d / "x.npy", nan)
    np.save(d / "ids_0.npy", ids)
    st, got = read(lib, sig, d)
    assert st == 0 and np.isnan(got["x"][4, 1])
    st, msg = read(lib, sig, d, FINITE)
    assert st != 0 and f"{d}/x.npy: input 'x' holds NaN at sample 4" in msg, msg
    st, msg = read(lib, sig, tmp_path / "missing")
    assert st != 0 and "does not exist" in msg, msg
    (tmp_path / "data.txt").write_text("x")
    st, msg = read(lib, sig, tmp_path / "data.txt")
    assert st != 0 and "neither a folder nor an .npz file" in msg, msg
