"""test_calibration.py - static int8 quantization with calibration (kiln_calibration_* in
kiln.h; docs/COMPRESSION.md, "Static calibration"), through libkiln.so with ctypes.

- kiln_calibration_range for MinMax, percentile and entropy (KL) equals numpy
  re-implementations of the documented algorithms (2048-bin |x| histogram; TensorRT's
  KL search over 128..2048 bins with 128 quantized bins), on normal, heavy-tailed,
  all-positive, all-negative and constant data;
- a small CNN trained on scikit-learn's digits by tools/make_compression_models.py,
  calibrated on 200 training images with each method, keeps its held-out accuracy
  within 1% relative of fp32, its top-1 agrees with fp32 on >= 98% of the images,
  and its outputs really are quantized (they differ from fp32) with static scales:
  an image gives the same logits alone and inside a batch (dynamic quantization
  would measure the batch's range);
- misuse is an error, not a crash: finish before any feed, a bad method or percentile,
  a wrong input name.
"""

import ctypes as C
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from quant_models import outlier_cnn

REPO = Path(__file__).resolve().parents[2]
BINS = 2048


@pytest.fixture(scope="module")
def lib():
    path = Path(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln"))).parent / "libkiln.so"
    if not path.exists():
        pytest.skip(f"libkiln.so not found at {path}: build it or set KILN_BIN")
    lib = C.CDLL(str(path))
    lib.kiln_last_error.restype = C.c_char_p
    lib.kiln_calibration_range.argtypes = [C.POINTER(C.c_float), C.c_int64, C.c_int, C.c_double,
                                           C.POINTER(C.c_float), C.POINTER(C.c_float)]
    lib.kiln_calibration_finish.argtypes = [C.c_void_p, C.c_int, C.c_double]
    for f in ("kiln_model_load", "kiln_session_create", "kiln_calibration_begin",
              "kiln_calibration_feed", "kiln_session_run", "kiln_tensor_wrap"):
        getattr(lib, f).restype = C.c_int
    lib.kiln_outputs_get.restype = C.c_void_p
    lib.kiln_outputs_get.argtypes = [C.c_void_p, C.c_int]
    lib.kiln_outputs_free.argtypes = [C.c_void_p]
    lib.kiln_tensor_free.argtypes = [C.c_void_p]
    lib.kiln_calibration_free.argtypes = [C.c_void_p]
    lib.kiln_calibration_node_count.argtypes = [C.c_void_p]
    lib.kiln_session_free.argtypes = [C.c_void_p]
    lib.kiln_model_free.argtypes = [C.c_void_p]
    return lib


# ---- the range methods in numpy ----

def histogram(x):
    x = x[np.isfinite(x)].astype(np.float64)
    r = float(np.abs(x).max()) if x.size else 0.0
    h = np.zeros(BINS)
    if r > 0:
        idx = np.minimum((np.abs(x) * (BINS / r)).astype(np.int64), BINS - 1)
        np.add.at(h, idx, 1)
    else:
        h[0] = x.size
    return h, r, min(0.0, float(x.min())), max(0.0, float(x.max()))


def kl(h, i):
    p = h[:i].copy()
    p[i - 1] += h[i:].sum()
    starts = np.floor(np.arange(128) * i / 128).astype(np.int64)  # strictly increasing: i >= 128
    seg = h[:i]
    total = np.add.reduceat(seg, starts)
    nz = np.add.reduceat((seg != 0).astype(np.int64), starts)
    per = np.where(nz > 0, total / np.maximum(nz, 1), 0.0)
    lengths = np.diff(np.append(starts, i))
    q = np.where(seg != 0, np.repeat(per, lengths), 0.0)
    if p.sum() <= 0:
        return 0.0
    pn = p / p.sum()
    qn = q / q.sum() if q.sum() > 0 else q
    m = pn > 0
    qq = np.where(qn[m] > 0, qn[m], 1e-10)
    return float(np.sum(pn[m] * np.log(pn[m] / qq)))


def np_range(x, method, pct=99.99):
    h, r, lo, hi = histogram(x)
    w = r / BINS
    t = r
    if method == 1 and r > 0:
        c = np.cumsum(h)
        k = int(np.argmax(c >= pct / 100.0 * h.sum()))
        t = (k + 1) * w
    elif method == 2 and r > 0:
        kls = [kl(h, i) for i in range(128, BINS + 1)]
        t = (128 + int(np.argmin(kls))) * w
    if method in (1, 2):
        lo, hi = max(lo, -t), min(hi, t)
    return np.float32(lo), np.float32(hi)


def kiln_range(lib, x, method, pct=99.99):
    x = np.ascontiguousarray(x, np.float32)
    lo, hi = C.c_float(), C.c_float()
    st = lib.kiln_calibration_range(x.ctypes.data_as(C.POINTER(C.c_float)), x.size, method, pct,
                                    C.byref(lo), C.byref(hi))
    assert st == 0, lib.kiln_last_error()
    return np.float32(lo.value), np.float32(hi.value)


DATA = {
    "normal": lambda r: r.normal(0.3, 1.0, 20000),
    "heavy": lambda r: np.concatenate([r.laplace(0, 0.5, 20000), [40.0, -25.0]]),
    "positive": lambda r: np.abs(r.normal(0, 2.0, 5000)),
    "negative": lambda r: -np.abs(r.standard_t(3, 5000)),
    "constant": lambda r: np.zeros(100),
}


@pytest.mark.parametrize("name", sorted(DATA))
@pytest.mark.parametrize("method", [0, 1, 2], ids=["minmax", "percentile", "entropy"])
def test_range_methods_match_numpy(lib, name, method):
    x = DATA[name](np.random.default_rng(3)).astype(np.float32)
    got = kiln_range(lib, x, method)
    want = np_range(x, method)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert got[0] <= 0 <= got[1]


def test_entropy_clips_outliers(lib):
    x = DATA["heavy"](np.random.default_rng(3)).astype(np.float32)
    lo, hi = kiln_range(lib, x, 2)
    assert hi < 40.0 / 2 and lo > -25.0 / 2  # KL clips the two far outliers
    lo, hi = kiln_range(lib, x, 0)
    assert (lo, hi) == (np.float32(-25.0), np.float32(40.0))


# ---- end to end on the digits CNN ----

class Tensor(C.Structure):
    _fields_ = [("dtype", C.c_int), ("rank", C.c_int), ("dims", C.c_int64 * 8),
                ("data", C.c_void_p), ("nbytes", C.c_size_t), ("owns_data", C.c_int)]


class Named(C.Structure):
    _fields_ = [("name", C.c_char_p), ("tensor", C.c_void_p)]


F32 = 1  # KILN_DTYPE_FLOAT32


def wrap(lib, a):
    a = np.ascontiguousarray(a, np.float32)
    dims = (C.c_int64 * a.ndim)(*a.shape)
    t = C.c_void_p()
    assert lib.kiln_tensor_wrap(F32, a.ndim, dims, a.ctypes.data_as(C.c_void_p), a.nbytes,
                                C.byref(t)) == 0, lib.kiln_last_error()
    return t, a


def run(lib, sess, x):
    t, keep = wrap(lib, x)
    inp = (Named * 1)(Named(b"image", t))
    out = C.c_void_p()
    st = lib.kiln_session_run(sess, inp, 1, C.byref(out))
    lib.kiln_tensor_free(t)
    assert st == 0, lib.kiln_last_error()
    ot = Tensor.from_address(lib.kiln_outputs_get(out, 0))
    shape = [ot.dims[i] for i in range(ot.rank)]
    y = np.ctypeslib.as_array(C.cast(ot.data, C.POINTER(C.c_float)), (int(np.prod(shape)),))
    y = y.copy().reshape(shape)
    lib.kiln_outputs_free(out)
    return y


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    out = tmp_path_factory.mktemp("calib_models")
    r = subprocess.run(["/usr/bin/python3", str(REPO / "tools" / "make_compression_models.py"),
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    x_train, _, _, _ = train_test_split(x, d.target, test_size=0.25, random_state=0,
                                        stratify=d.target)
    return (out / "digits_cnn.onnx", x_train[:200], np.load(out / "digits_test_x.npy"),
            np.load(out / "digits_test_y.npy"))


class ProfileEntry(C.Structure):
    _fields_ = [("op", C.c_char_p), ("node", C.c_char_p), ("kernel", C.c_char_p),
                ("plan", C.c_int), ("step", C.c_int), ("nodes", C.c_int), ("calls", C.c_int64),
                ("total_ns", C.c_int64), ("share", C.c_double), ("flops", C.c_double)]


def kernels(lib, sess, x):
    """{op: kernel} of one profiled run."""
    lib.kiln_session_profile_enable.argtypes = [C.c_void_p, C.c_int]
    lib.kiln_session_profile_get.argtypes = [C.c_void_p, C.POINTER(C.c_void_p)]
    lib.kiln_profile_op_count.argtypes = [C.c_void_p]
    lib.kiln_profile_op.argtypes = [C.c_void_p, C.c_int]
    lib.kiln_profile_op.restype = C.POINTER(ProfileEntry)
    lib.kiln_profile_free.argtypes = [C.c_void_p]
    assert lib.kiln_session_profile_enable(sess, 1) == 0
    run(lib, sess, x)
    p = C.c_void_p()
    assert lib.kiln_session_profile_get(sess, C.byref(p)) == 0, lib.kiln_last_error()
    out = {}
    for i in range(lib.kiln_profile_op_count(p)):
        e = lib.kiln_profile_op(p, i).contents
        out[e.op.decode()] = e.kernel.decode()
    lib.kiln_profile_free(p)
    return out


def cpu_has_vnni():
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return True
    return any(flag in text for flag in (" avx512_vnni", " avx_vnni", " amx_int8"))


def session(lib, path):
    m, s = C.c_void_p(), C.c_void_p()
    assert lib.kiln_model_load(str(path).encode(), None, C.byref(m)) == 0, lib.kiln_last_error()
    assert lib.kiln_session_create(m, None, None, C.byref(s)) == 0, lib.kiln_last_error()
    return m, s


def calibrate(lib, sess, x_cal, method, pct=99.99, batch=50):
    c = C.c_void_p()
    assert lib.kiln_calibration_begin(sess, C.byref(c)) == 0, lib.kiln_last_error()
    for i in range(0, len(x_cal), batch):
        t, keep = wrap(lib, x_cal[i:i + batch])
        inp = (Named * 1)(Named(b"image", t))
        st = lib.kiln_calibration_feed(c, inp, 1)
        lib.kiln_tensor_free(t)
        assert st == 0, lib.kiln_last_error()
    assert lib.kiln_calibration_finish(c, method, pct) == 0, lib.kiln_last_error()
    n = lib.kiln_calibration_node_count(c)
    lib.kiln_calibration_free(c)
    return n


@pytest.mark.parametrize("method", [0, 1, 2], ids=["minmax", "percentile", "entropy"])
def test_static_int8_keeps_accuracy(lib, cnn, method):
    path, x_cal, x_test, y_test = cnn
    m, s = session(lib, path)
    try:
        fp32 = run(lib, s, x_test)
        n = calibrate(lib, s, x_cal, method)
        assert n == 4  # two convolutions and two dense layers
        q = run(lib, s, x_test)
        acc32 = float((fp32.argmax(1) == y_test).mean())
        acc8 = float((q.argmax(1) == y_test).mean())
        assert acc32 > 0.9
        assert acc8 >= acc32 * 0.99, (acc8, acc32)
        assert float((q.argmax(1) == fp32.argmax(1)).mean()) >= 0.98
        assert np.abs(q - fp32).max() > 0  # quantized, not fp32
        assert np.abs(q - fp32).max() < 0.1 * np.abs(fp32).max()
        # static scales: a row does not depend on the other rows of its batch
        np.testing.assert_array_equal(run(lib, s, x_test[5:6]), q[5:6])
        np.testing.assert_array_equal(run(lib, s, x_test[:7] * 0 + x_test[5:6]), q[[5] * 7])
        if cpu_has_vnni():  # the int8 kernels ran, int8 from one convolution to the next
            k = kernels(lib, s, x_test[:8])
            assert k.get("QLinearConv") == "dnnl_qlinear_conv", k
            assert k.get("KilnQLinearMatMul") == "dnnl_qlinear_matmul", k
            assert "Conv" not in k and "KilnFusedConv" not in k, k
    finally:
        lib.kiln_session_free(s)
        lib.kiln_model_free(m)


def test_calibration_misuse_is_an_error(lib, cnn):
    path, x_cal, _, _ = cnn
    m, s = session(lib, path)
    try:
        c = C.c_void_p()
        assert lib.kiln_calibration_begin(s, C.byref(c)) == 0
        assert lib.kiln_calibration_finish(c, 0, 0.0) != 0  # nothing fed
        assert b"no calibration batches" in lib.kiln_last_error()
        t, keep = wrap(lib, x_cal[:4])
        bad = (Named * 1)(Named(b"pixels", t))
        assert lib.kiln_calibration_feed(c, bad, 1) != 0
        assert b"'pixels'" in lib.kiln_last_error()
        good = (Named * 1)(Named(b"image", t))
        assert lib.kiln_calibration_feed(c, good, 1) == 0
        lib.kiln_tensor_free(t)
        assert lib.kiln_calibration_finish(c, 7, 0.0) != 0
        assert lib.kiln_calibration_finish(c, 1, 150.0) != 0
        assert b"150" in lib.kiln_last_error()
        lib.kiln_calibration_free(c)
    finally:
        lib.kiln_session_free(s)
        lib.kiln_model_free(m)


def relu6_cnn(path):
    """image [N,3,8,8] -> Conv -> Clip(0, 6) -> Conv -> Clip(0, 6) -> Conv: the Clips' bounds
    come from Constant nodes, as torch.onnx.export writes ReLU6."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(11)
    inits, nodes, cur = [], [], "image"
    for i, (co, ci) in enumerate([(16, 3), (16, 16), (8, 16)]):
        inits += [numpy_helper.from_array((rng.standard_normal((co, ci, 3, 3)) * 0.4)
                                          .astype(np.float32), f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(co) * 0.5).astype(np.float32),
                                          f"b{i}")]
        nodes.append(helper.make_node("Conv", [cur, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1] * 4))
        cur = f"c{i}"
        if i < 2:
            for nm, v in ((f"lo{i}", 0.0), (f"hi{i}", 6.0)):
                nodes.append(helper.make_node("Constant", [], [nm], value=numpy_helper.from_array(
                    np.array(v, np.float32), nm)))
            nodes.append(helper.make_node("Clip", [cur, f"lo{i}", f"hi{i}"], [f"r{i}"]))
            cur = f"r{i}"
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    g = helper.make_graph(nodes, "relu6", [helper.make_tensor_value_info(
        "image", TensorProto.FLOAT, ["n", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_static_int8_fuses_relu6(lib, tmp_path):
    """Static calibration quantizes a ReLU6's output and qdq_fusion drops the Clip into the
    int8 convolution (Q(Clip(v, 0, 6)) = Q(v) on a range inside [0, 6])."""
    path = tmp_path / "relu6.onnx"
    relu6_cnn(path)
    x = np.random.default_rng(2).normal(0, 1.5, (64, 3, 8, 8)).astype(np.float32)
    m, s = session(lib, path)
    try:
        fp32 = run(lib, s, x)
        assert (fp32 != 0).any()
        assert calibrate(lib, s, x[:48], 0) == 3
        q = run(lib, s, x)
        # within a few output steps of fp32 (3 quantized layers)
        step = (fp32.max() - min(0.0, fp32.min())) / 255
        assert np.abs(q - fp32).max() < 8 * step, (np.abs(q - fp32).max(), step)
        if cpu_has_vnni():
            k = kernels(lib, s, x[:4])
            assert k.get("QLinearConv") == "dnnl_qlinear_conv", k
            assert "Clip" not in k and "Conv" not in k and "KilnFusedConv" not in k, k
    finally:
        lib.kiln_session_free(s)
        lib.kiln_model_free(m)


def test_calibration_exclude_keeps_a_node_in_fp32(lib, tmp_path):
    """kiln_calibration_exclude: the excluded convolution and the value it reads stay float, so
    the outlier model keeps its top-1 where static int8 of the whole model loses it; the node
    count says one node fewer; an unknown or unquantized name is KILN_ERR_NOT_FOUND (4)."""
    pytest.importorskip("onnx")
    path = tmp_path / "outlier.onnx"
    x = outlier_cnn(path)
    lib.kiln_calibration_exclude.argtypes = [C.c_void_p, C.c_char_p]
    results = {}
    for excl in ([], [b"conv2"]):
        m, s = session(lib, path)
        try:
            fp32 = run(lib, s, x)
            c = C.c_void_p()
            assert lib.kiln_calibration_begin(s, C.byref(c)) == 0, lib.kiln_last_error()
            t, keep = wrap(lib, x)
            inp = (Named * 1)(Named(b"image", t))
            assert lib.kiln_calibration_feed(c, inp, 1) == 0, lib.kiln_last_error()
            lib.kiln_tensor_free(t)
            for name in excl:
                assert lib.kiln_calibration_exclude(c, name) == 0, lib.kiln_last_error()
            assert lib.kiln_calibration_exclude(c, b"no_such_node") == 4
            assert b"no_such_node" in lib.kiln_last_error()
            assert lib.kiln_calibration_finish(c, 0, 0.0) == 0, lib.kiln_last_error()
            n = lib.kiln_calibration_node_count(c)
            lib.kiln_calibration_free(c)
            q = run(lib, s, x)
        finally:
            lib.kiln_session_free(s)
            lib.kiln_model_free(m)
        agree = float(np.mean(q.argmax(1) == fp32.argmax(1)))
        err = float(np.abs(q - fp32).max() / np.abs(fp32).max())
        results[len(excl)] = (n, agree, err)
    (n0, agree0, err0), (n1, agree1, err1) = results[0], results[1]
    assert (n0, n1) == (3, 2), results
    assert agree0 < 0.9 and err0 > 0.1, results  # the outlier really hurts the whole model
    assert agree1 >= 0.9 and err1 < 0.05, results
