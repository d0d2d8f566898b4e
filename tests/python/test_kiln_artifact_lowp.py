"""test_kiln_artifact_lowp.py - bf16 and int8 .kiln files are small and exact.

A model whose weights dominate its file (a CNN head and an MLP, about 1.3 MB
of f32 weights: two convolutions, a Gemm with transB=1, a 90%-sparse MatMul,
a Gemm with transB=0) is written as a .kiln file in fp32, bf16 and int8
through the C API (tests/unit_kiln_artifact --save), then:

- sizes: the int8 file is at most 0.27x the fp32 file and the bf16 one at
  most 0.52x (without saved batch sizes, and with them against the fp32
  file of the same batch sizes: packed copies of compressed weights are not
  stored);
- the int8 file holds each quantized weight as numpy's symmetric per-channel
  s8 quantization of the ONNX weight (q and the f32 scales found byte for
  byte in the file), and the format version is 3;
- outputs of the loaded int8 and bf16 files equal those of a session of the
  source model in the same precision (`kiln predict --precision`) bit for
  bit, at the saved batch sizes and at one that was not saved, and stay
  close to a numpy float64 evaluation of the ONNX weights;
- files of format versions 1 and 2 (tests/corpus/kiln_artifact/v1_dense_fp32.kiln
  and v2_dense_fp32.kiln, written before version 3) still load;
- version 3 keeps the graph deflated (GRPZ): it inflates to a graph, and a
  wrong length, a cut stream or both GRPH and GRPZ are refused by name;
- weights that are exactly s8 times a channel scale (what a quantizer's
  DequantizeLinear folded into a float product leaves) are stored s8 in any
  precision, fp32 included, and load back bit for bit; other f32 weights stay
  f32;
- malformed version-2 records behind valid checksums (a zero s8 scale, a
  sparse choice that is not 0, 1 or 4) are refused with a message naming
  them;
- the sparse kernels' decisions saved in SPRS are what a load runs: rewritten
  to "sparse", every product node runs a sparse kernel, dense weights too;
- a residual block (ResNet's: the optimizer fuses each Add into a convolution
  as KilnFusedConv's Sum, with a bias or without, 3x3 and 1x1): in int8 every
  convolution runs dnnl_fused_conv_int8, their weights are numpy's s8 in the
  file (no f32 copy), the file is at most 0.27x the fp32 one (also with a
  batch size saved), and its outputs equal the source int8 session's bit for
  bit and a numpy quantize-dequantize emulation within 1e-4 of the output
  scale (the reference kernels equal numpy's exact block);
- static int8 of the same block (`kiln compile --calibration-method minmax`):
  the f32 weights the quantized graph replaced are not in the file.
"""

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KILN_BUILD_DIR", str(REPO / "build")))
sys.path.insert(0, str(REPO / "tools"))

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from make_kiln_corpus import crc32c, rechecksum  # noqa: E402


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


FLAGS = cpu_flags()
HAS = {"bf16": {"avx512f", "avx512bw", "avx512_bf16"} <= FLAGS,
       "int8": {"avx512f", "avx512bw", "avx512_vnni"} <= FLAGS}


@pytest.fixture(scope="module")
def kiln_bin():
    path = os.path.abspath(os.environ.get("KILN_BIN", str(BUILD / "kiln")))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kiln executable not found at {path}: build it or set KILN_BIN")
    return path


@pytest.fixture(scope="module")
def tool():
    t = BUILD / "tests" / "unit_kiln_artifact"
    if not t.exists():
        pytest.skip(f"{t} not found (build Kiln, or set KILN_BUILD_DIR)")
    return t


def make_weights():
    rng = np.random.default_rng(7)
    w = {
        "k1": rng.standard_normal((32, 3, 3, 3)) * 0.3,
        "b1": rng.standard_normal(32) * 0.1,
        "k2": rng.standard_normal((64, 32, 3, 3)) * 0.08,
        "b2": rng.standard_normal(64) * 0.1,
        "g1": rng.standard_normal((512, 64)) * 0.15,      # Gemm transB=1: [N, K]
        "c1": rng.standard_normal(512) * 0.1,
        "m1": rng.standard_normal((512, 512)) * 0.15,     # MatMul [K, N], 90% zero
        "a1": rng.standard_normal(512) * 0.1,
        "g2": rng.standard_normal((512, 10)) * 0.1,       # Gemm transB=0: [K, N]
        "c2": rng.standard_normal(10) * 0.1,
    }
    w["m1"][rng.random(w["m1"].shape) < 0.9] = 0.0
    return {k: v.astype(np.float32) for k, v in w.items()}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    w = make_weights()
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Conv", ["x", "k1", "b1"], ["c1o"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1o"], ["r1"]),
        helper.make_node("Conv", ["r1", "k2", "b2"], ["c2o"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2o"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["fl"]),
        helper.make_node("Gemm", ["fl", "g1", "c1"], ["h1"], transB=1),
        helper.make_node("Relu", ["h1"], ["h1r"]),
        helper.make_node("MatMul", ["h1r", "m1"], ["h2"]),
        helper.make_node("Add", ["h2", "a1"], ["h2a"]),
        helper.make_node("Relu", ["h2a"], ["h2r"]),
        helper.make_node("Gemm", ["h2r", "g2", "c2"], ["y"]),
    ]
    g = helper.make_graph(nodes, "lowp", [helper.make_tensor_value_info("x", f, ["batch", 3, 12, 12])],
                          [helper.make_tensor_value_info("y", f, ["batch", 10])],
                          [numpy_helper.from_array(v, k) for k, v in w.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="test")
    path = tmp_path_factory.mktemp("lowp") / "model.onnx"
    onnx.save(m, str(path))
    return path, w


def numpy_forward(w, x):
    def conv3(x, k, b):  # 3x3, pad 1, stride 1, NCHW, float64
        n, c, h, wd = x.shape
        xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        cols = np.stack([xp[:, :, i:i + h, j:j + wd] for i in range(3) for j in range(3)], axis=2)
        kk = k.reshape(k.shape[0], c, 9)
        return np.einsum("nckhw,mck->nmhw", cols, kk) + b[None, :, None, None]
    d = {k: v.astype(np.float64) for k, v in w.items()}
    h = np.maximum(conv3(x.astype(np.float64), d["k1"], d["b1"]), 0)
    h = np.maximum(conv3(h, d["k2"], d["b2"]), 0)
    h = h.mean(axis=(2, 3))
    h = np.maximum(h @ d["g1"].T + d["c1"], 0)
    h = np.maximum(h @ d["m1"] + d["a1"], 0)
    return h @ d["g2"] + d["c2"]


def save(tool, src, out, prec, batches):
    r = subprocess.run([str(tool), "--save", str(src), str(out), prec, batches],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out.stat().st_size


def sections(buf):
    assert buf[:8] == b"\x89KILN\r\n\x1a"
    n = struct.unpack_from("<I", buf, 24)[0]
    out = {}
    for i in range(n):
        e = 64 + 32 * i
        kind = bytes(buf[e:e + 4]).decode()
        off, ln = struct.unpack_from("<QQ", buf, e + 8)
        out[kind] = (off, ln)
    return out


# For comparisons bit for bit between two processes: m1 is 90% zero, and each
# process that compiles a plan for a batch size not in the file times the
# sparse kernel against the dense one. Near a tie the two processes can choose
# differently, and the sums then differ in their last bits.
DENSE = {**os.environ, "KILN_SPARSE": "off"}


def predict(kiln_bin, model, x, tmp_path, tag, *extra, env=None):
    inp = tmp_path / f"{tag}_x.npy"
    np.save(inp, x)
    out = tmp_path / f"{tag}_out"
    r = subprocess.run([kiln_bin, "predict", str(model), "--input", f"x={inp}", "--output-dir",
                        str(out), *extra], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return np.load(out / "y.npy")


def s8_numpy(w, axis):
    """Symmetric s8 per output channel (docs/COMPRESSION.md), in float32 as Kiln computes it."""
    wc = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    mx = np.abs(wc).max(axis=1).astype(np.float32)
    scale = np.where(mx > 0, mx / np.float32(127), np.float32(1)).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, scale


@pytest.mark.parametrize("batches", ["", "1,8"])
def test_sizes(tool, model, tmp_path, batches):
    src, _ = model
    size = {p: save(tool, src, tmp_path / f"m_{p}.kiln", p, batches)
            for p in ("fp32", "bf16", "int8") if p == "fp32" or HAS[p]}
    if "int8" in size:
        assert size["int8"] <= 0.27 * size["fp32"], size
    if "bf16" in size:
        assert size["bf16"] <= 0.52 * size["fp32"], size
    print(f"batches '{batches}': sizes {size}, ratios "
          + ", ".join(f"{p} {size[p] / size['fp32']:.3f}x" for p in size))


@pytest.mark.skipif(not HAS["int8"], reason="this CPU lacks AVX512-VNNI")
def test_int8_file_holds_numpy_s8_weights(kiln_bin, tool, model, tmp_path):
    src, w = model
    art = tmp_path / "m.kiln"
    save(tool, src, art, "int8", "1")
    buf = bytearray(art.read_bytes())
    assert struct.unpack_from("<I", buf, 8)[0] == 3  # format version
    secs = sections(buf)
    woff, wlen = secs["WGHT"]
    wght = bytes(buf[woff:woff + wlen])
    # each product weight: q (s8), then at the next 64-byte offset its f32 channel scales
    for name, axis in (("k1", 0), ("k2", 0), ("g1", 0), ("m1", 1), ("g2", 1)):
        q, scale = s8_numpy(w[name], axis)
        at = wght.find(q.tobytes())
        assert at >= 0 and at % 64 == 0, f"{name}: numpy's s8 weights are not in the file"
        sat = (at + q.size + 63) // 64 * 64
        assert wght[sat:sat + 4 * scale.size] == scale.tobytes(), f"{name}: scales differ"
        assert wght.find(w[name].tobytes()) < 0, f"{name}: the f32 weight is stored too"
    # a zero scale behind valid checksums is refused by name
    q, scale = s8_numpy(w["g1"], 0)
    sat = woff + (wght.find(q.tobytes()) + q.size + 63) // 64 * 64
    bad = bytearray(buf)
    struct.pack_into("<f", bad, sat + 4 * 5, 0.0)
    rechecksum(bad)
    badp = tmp_path / "bad_scale.kiln"
    badp.write_bytes(bad)
    r = subprocess.run([kiln_bin, "inspect", str(badp)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "scale of channel 5 is 0" in r.stderr, r.stderr
    assert "bad_scale.kiln" in r.stderr
    # the sparse MatMul's timed choice is stored (SPRS); a bad choice is refused by name
    assert "SPRS" in secs
    off, ln = secs["SPRS"]
    n = struct.unpack_from("<I", buf, off)[0]
    assert n >= 1
    bad = bytearray(buf)
    struct.pack_into("<i", bad, off + ln - 4, 7)  # the last entry's choice
    rechecksum(bad)
    badp = tmp_path / "bad_sprs.kiln"
    badp.write_bytes(bad)
    r = subprocess.run([kiln_bin, "inspect", str(badp)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "sparse choice" in r.stderr and "is 7" in r.stderr, r.stderr
    assert crc32c(b"123456789") == 0xE3069283  # the checksum the test rewrites with


@pytest.mark.parametrize("prec", ["int8", "bf16"])
def test_outputs_equal_the_source_session(kiln_bin, tool, model, tmp_path, prec):
    if not HAS[prec]:
        pytest.skip(f"this CPU cannot run {prec}")
    src, w = model
    art = tmp_path / f"m_{prec}.kiln"
    save(tool, src, art, prec, "1,8")
    rng = np.random.default_rng(3)
    for batch in (1, 8, 3):  # 3 was not saved: its plan is compiled at the first run
        x = rng.standard_normal((batch, 3, 12, 12)).astype(np.float32)
        y_src = predict(kiln_bin, src, x, tmp_path, f"src{batch}", "--precision", prec, env=DENSE)
        y_art = predict(kiln_bin, art, x, tmp_path, f"art{batch}", env=DENSE)
        assert y_art.shape == (batch, 10)
        assert np.array_equal(y_art, y_src), f"{prec} batch {batch}: max diff " \
            f"{np.abs(y_art - y_src).max()}"
        ref = numpy_forward(w, x)
        err = np.abs(y_art - ref).max() / np.abs(ref).max()
        assert err < 0.05, f"{prec} batch {batch}: relative error {err} against numpy"


@pytest.mark.parametrize("version", [1, 2])
def test_older_format_versions_still_load(kiln_bin, tmp_path, version):
    old = REPO / "tests" / "corpus" / "kiln_artifact" / f"v{version}_dense_fp32.kiln"
    assert struct.unpack_from("<I", old.read_bytes(), 8)[0] == version
    r = subprocess.run([kiln_bin, "inspect", str(old)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"format version {version}" in r.stdout
    assert "GRPH" in r.stdout and "GRPZ" not in r.stdout
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    inp = tmp_path / "x.npy"
    np.save(inp, x)
    r = subprocess.run([kiln_bin, "predict", str(old), "--input", f"x={inp}", "--output-dir",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # the dense corpus model: relu(x @ w + b) with make_kiln_corpus.py's weights
    rng = np.random.default_rng(0)
    wt = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    y = np.load(tmp_path / "o" / "y.npy")
    np.testing.assert_allclose(y, np.maximum(x.astype(np.float64) @ wt + b, 0), rtol=1e-5, atol=1e-6)


def with_sections(buf, secs):
    """buf with its sections replaced by secs [(kind, bytes)] (make_kiln_corpus.join)."""
    from make_kiln_corpus import join
    return join(buf, secs)


def test_graph_is_deflated_and_checked(kiln_bin, tool, model, tmp_path):
    import zlib
    from make_kiln_corpus import split
    src, w = model
    art = tmp_path / "m.kiln"
    save(tool, src, art, "fp32", "")
    buf = art.read_bytes()
    secs = split(buf)
    kinds = [k for k, _ in secs]
    assert "GRPZ" in kinds and "GRPH" not in kinds, kinds
    z = dict(secs)["GRPZ"]
    raw = zlib.decompress(z[8:])
    assert struct.unpack_from("<Q", z, 0)[0] == len(raw)
    assert len(z) < len(raw), (len(z), len(raw))
    assert b"k1" in raw and b"g2" in raw  # the graph's value names, deflated
    x = np.random.default_rng(3).standard_normal((2, 3, 12, 12)).astype(np.float32)
    y = predict(kiln_bin, art, x, tmp_path, "good", env=DENSE)
    np.testing.assert_allclose(y, numpy_forward(w, x), rtol=1e-4, atol=1e-4 * np.abs(y).max())

    def refused(tag, new_secs, *want):
        bad = tmp_path / f"{tag}.kiln"
        bad.write_bytes(bytes(with_sections(buf, new_secs)))
        r = subprocess.run([kiln_bin, "inspect", str(bad)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode != 0, tag
        for s in want:
            assert s in r.stderr, (tag, r.stderr)

    at = kinds.index("GRPZ")
    def repl(data, kind="GRPZ"):
        s2 = list(secs)
        s2[at] = (kind, data)
        return s2
    refused("long", repl(struct.pack("<Q", len(raw) + 1) + z[8:]), "section GRPZ",
            f"inflates to {len(raw)} bytes, not the {len(raw) + 1}")
    refused("huge", repl(struct.pack("<Q", 1 << 40) + z[8:]), "section GRPZ", "not possible")
    refused("cut", repl(z[:len(z) // 2]), "section GRPZ", "does not inflate")
    refused("both", list(secs) + [("GRPH", raw)], "GRPH and GRPZ")
    # the same graph as version 2's plain GRPH still loads
    v2 = bytearray(with_sections(buf, repl(raw, "GRPH")))
    struct.pack_into("<I", v2, 8, 2)
    rechecksum(v2)
    (tmp_path / "v2.kiln").write_bytes(bytes(v2))
    assert np.array_equal(predict(kiln_bin, tmp_path / "v2.kiln", x, tmp_path, "v2", env=DENSE), y)


def test_weights_exactly_s8_are_stored_s8_in_fp32(kiln_bin, tool, tmp_path):
    """A convolution and a Gemm whose f32 weights are q * scale (q in [-127, 127], one scale per
    output channel): the fp32 file stores them s8 (q and the scales found in WGHT, not the f32
    bytes) and its outputs equal the source session's bit for bit. The same model with one
    weight nudged off the grid keeps that weight f32."""
    rng = np.random.default_rng(11)
    qk = rng.integers(-127, 128, (32, 16, 3, 3)).astype(np.int8)
    qk[:, 0, 0, 0] = 127  # each channel reaches 127: the scale is max |w| / 127
    sk = (rng.random(32) * 0.01 + 0.001).astype(np.float32)
    k = (qk.astype(np.float32) * sk[:, None, None, None]).astype(np.float32)
    qg = rng.integers(-127, 128, (10, 512)).astype(np.int8)
    qg[:, 0] = -127
    sg = (rng.random(10) * 0.02 + 0.001).astype(np.float32)
    gw = (qg.astype(np.float32) * sg[:, None]).astype(np.float32)
    f = TensorProto.FLOAT

    def build(kw, name):
        nodes = [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["c"], ["r"]),
                 helper.make_node("Flatten", ["r"], ["fl"]),
                 helper.make_node("Gemm", ["fl", "g"], ["y"], transB=1)]
        g = helper.make_graph(nodes, "exact", [helper.make_tensor_value_info("x", f, ["batch", 16, 4, 4])],
                              [helper.make_tensor_value_info("y", f, ["batch", 10])],
                              [numpy_helper.from_array(kw, "k"), numpy_helper.from_array(gw, "g")])
        path = tmp_path / f"{name}.onnx"
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
        return path

    src = build(k, "exact")
    art = tmp_path / "exact.kiln"
    save(tool, src, art, "fp32", "1")
    buf = art.read_bytes()
    woff, wlen = sections(buf)["WGHT"]
    wght = buf[woff:woff + wlen]
    assert wght.find(qk.tobytes()) >= 0 and wght.find(sk.tobytes()) >= 0
    assert wght.find(qg.tobytes()) >= 0 and wght.find(sg.tobytes()) >= 0
    assert wght.find(k.tobytes()[:256]) < 0 and wght.find(gw.tobytes()[:256]) < 0
    assert wlen < 0.5 * (k.nbytes + gw.nbytes), wlen
    x = rng.standard_normal((3, 16, 4, 4)).astype(np.float32)
    y_src = predict(kiln_bin, src, x, tmp_path, "src")
    assert np.array_equal(predict(kiln_bin, art, x, tmp_path, "art"), y_src)

    k2 = k.copy()
    k2[5, 3, 1, 1] = np.nextafter(k2[5, 3, 1, 1], np.float32(1))  # off the grid by one ulp
    src2 = build(k2, "nudged")
    art2 = tmp_path / "nudged.kiln"
    save(tool, src2, art2, "fp32", "")
    buf2 = art2.read_bytes()
    woff, wlen = sections(buf2)["WGHT"]
    wght2 = buf2[woff:woff + wlen]
    assert wght2.find(k2.tobytes()) >= 0  # f32, as given
    assert wght2.find(qg.tobytes()) >= 0  # the Gemm weight is still exact
    assert np.array_equal(predict(kiln_bin, art2, x, tmp_path, "art2"),
                          predict(kiln_bin, src2, x, tmp_path, "src2"))


@pytest.mark.skipif(not HAS["int8"], reason="this CPU lacks AVX512-VNNI")
def test_saved_sparse_choices_are_used_at_load(kiln_bin, tool, model, tmp_path):
    """SPRS: the plans' sparse-or-dense decisions are taken at load, not timed again.

    Saved with batch 1, the file holds a decision per product weight (the dense Gemm weights
    are decided dense without timing, by their density). Rewritten to "sparse, block 1", a load
    must run every one of those nodes on the sparse kernel: no timing or density check would
    choose it for the dense weights."""
    src, _ = model
    art = tmp_path / "m.kiln"
    save(tool, src, art, "int8", "1")
    buf = bytearray(art.read_bytes())
    off, ln = sections(buf)["SPRS"]
    p = off
    n = struct.unpack_from("<I", buf, p)[0]
    p += 4
    tags = []
    for _ in range(n):
        _, tlen = struct.unpack_from("<iI", buf, p)
        p += 8
        tags.append(bytes(buf[p:p + tlen]).decode())
        p += tlen
        assert struct.unpack_from("<i", buf, p)[0] in (0, 1, 4)
        struct.pack_into("<i", buf, p, 1)
        p += 4
    assert p == off + ln
    mm = [t for t in tags if t.startswith("sparse_choice:")]  # MatMul / Gemm decisions
    assert len(mm) == 3 and all(t.startswith("sparse_choice:1x") for t in mm), tags
    rechecksum(buf)
    forced = tmp_path / "forced.kiln"
    forced.write_bytes(buf)
    kernels = {}
    for f in (art, forced):
        r = subprocess.run([kiln_bin, "inspect", str(f)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        kernels[f] = [ln.split()[2] for ln in r.stdout.splitlines()
                      if ln.startswith("  int8 ") and "MatMul" in ln.split()[1]]
    assert len(kernels[forced]) == 3
    assert all(k.startswith("sparse_") for k in kernels[forced]), kernels[forced]
    # the dense Gemm weights (g1, g2) stay dense in the file as saved
    assert sum(k.startswith("dnnl_") for k in kernels[art]) >= 2, kernels[art]


# ---- a residual block: KilnFusedConv with a fused Sum (ResNet's basic block) ----

def make_residual_weights():
    rng = np.random.default_rng(11)
    w = {
        "r1": rng.standard_normal((64, 64, 3, 3)) * 0.05,
        "rb1": rng.standard_normal(64) * 0.1,
        "r2": rng.standard_normal((64, 64, 3, 3)) * 0.05,
        "rb2": rng.standard_normal(64) * 0.1,
        "r3": rng.standard_normal((64, 64, 1, 1)) * 0.1,   # 1x1, no bias, residual again
    }
    return {k: v.astype(np.float32) for k, v in w.items()}


@pytest.fixture(scope="module")
def residual_model(tmp_path_factory):
    """y = GAP(relu(conv1x1(h) + h)), h = relu(conv(relu(conv(x))) + x): the optimizer
    fuses both Adds into the convolutions as a residual Sum."""
    w = make_residual_weights()
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Conv", ["x", "r1", "rb1"], ["a1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a1"], ["a1r"]),
        helper.make_node("Conv", ["a1r", "r2", "rb2"], ["a2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["a2", "x"], ["s1"]),
        helper.make_node("Relu", ["s1"], ["h"]),
        helper.make_node("Conv", ["h", "r3"], ["a3"]),
        helper.make_node("Add", ["h", "a3"], ["s2"]),   # the Sum as the Add's first input
        helper.make_node("Relu", ["s2"], ["h2"]),
        helper.make_node("GlobalAveragePool", ["h2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["y"]),
    ]
    g = helper.make_graph(nodes, "residual",
                          [helper.make_tensor_value_info("x", f, ["batch", 64, 8, 8])],
                          [helper.make_tensor_value_info("y", f, ["batch", 64])],
                          [numpy_helper.from_array(v, k) for k, v in w.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="test")
    path = tmp_path_factory.mktemp("residual") / "model.onnx"
    onnx.save(m, str(path))
    return path, w


def conv_np(x, k, b=None, pad=0):
    """NCHW convolution, stride 1, in float64."""
    n, c, h, wd = x.shape
    kh, kw = k.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    cols = np.stack([xp[:, :, i:i + oh, j:j + ow] for i in range(kh) for j in range(kw)], axis=2)
    y = np.einsum("nckhw,mck->nmhw", cols, k.reshape(k.shape[0], c, kh * kw))
    return y if b is None else y + b[None, :, None, None]


def quant_u8(a):
    """Dynamic u8 quantization of a whole tensor (docs/COMPRESSION.md), as float32 steps."""
    a = a.astype(np.float32)
    lo, hi = np.float32(min(0.0, a.min())), np.float32(max(0.0, a.max()))
    s = np.float32((hi - lo) / np.float32(255))
    if not s > 0:
        s = np.float32(1)
    zp = np.clip(np.rint(-lo / s), 0, 255)
    q = np.clip(np.rint(a * (np.float32(1) / s)) + zp, 0, 255)
    return (q - zp).astype(np.float64) * s


def residual_forward(w, x, int8):
    """The block in float64; int8: X and W through numpy's quantize-dequantize first."""
    d = {k: v.astype(np.float64) for k, v in w.items()}
    if int8:
        for k in ("r1", "r2", "r3"):
            q, sc = s8_numpy(w[k], 0)
            d[k] = q.astype(np.float64) * sc.astype(np.float64)[:, None, None, None]
    qx = quant_u8 if int8 else (lambda a: a.astype(np.float64))
    x = x.astype(np.float64)
    a = np.maximum(conv_np(qx(x), d["r1"], d["rb1"], 1), 0)
    h = np.maximum(conv_np(qx(a), d["r2"], d["rb2"], 1) + x, 0)
    h2 = np.maximum(h + conv_np(qx(h), d["r3"]), 0)
    return h2.mean(axis=(2, 3))


@pytest.mark.skipif(not HAS["int8"], reason="this CPU lacks AVX512-VNNI")
def test_int8_residual_convolutions(kiln_bin, tool, residual_model, tmp_path):
    """The convolutions with a fused residual Sum run int8 (dnnl_fused_conv_int8), their
    weights are stored s8 (numpy's per-channel quantization, byte for byte; no f32 copy),
    the file is at most 0.27x the fp32 one, and its outputs equal the source session's
    int8 bit for bit and numpy's quantize-dequantize emulation within int8 tolerance."""
    src, w = residual_model
    size = {}
    for p, b in (("fp32", ""), ("int8", ""), ("fp32_1", "1"), ("int8_1", "1")):
        size[p] = save(tool, src, tmp_path / f"res_{p}.kiln", p.split("_")[0], b)
    assert size["int8"] <= 0.27 * size["fp32"], size
    assert size["int8_1"] <= 0.27 * size["fp32_1"], size
    art = tmp_path / "res_int8_1.kiln"
    r = subprocess.run([kiln_bin, "inspect", str(art)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    convs = [ln.split() for ln in r.stdout.splitlines() if "Conv" in ln and ln.startswith("  ")
             and ln.split()[0] in ("fp32", "bf16", "int8")]
    assert len(convs) == 3 and all(c[0] == "int8" and c[2] == "dnnl_fused_conv_int8"
                                   for c in convs), r.stdout
    buf = art.read_bytes()
    woff, wlen = sections(buf)["WGHT"]
    wght = buf[woff:woff + wlen]
    for name in ("r1", "r2", "r3"):
        q, scale = s8_numpy(w[name], 0)
        at = wght.find(q.tobytes())
        assert at >= 0 and at % 64 == 0, f"{name}: numpy's s8 weights are not in the file"
        sat = (at + q.size + 63) // 64 * 64
        assert wght[sat:sat + 4 * scale.size] == scale.tobytes(), f"{name}: scales differ"
        assert wght.find(w[name].tobytes()) < 0, f"{name}: the f32 weight is stored too"
    rng = np.random.default_rng(5)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 64, 8, 8)).astype(np.float32)
        y_src = predict(kiln_bin, src, x, tmp_path, f"rsrc{batch}", "--precision", "int8")
        y_art = predict(kiln_bin, art, x, tmp_path, f"rart{batch}")
        assert np.array_equal(y_art, y_src), np.abs(y_art - y_src).max()
        ref = predict(kiln_bin, src, x, tmp_path, f"rref{batch}", "--reference")
        exact = residual_forward(w, x, int8=False)
        np.testing.assert_allclose(ref, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())
        emul = residual_forward(w, x, int8=True)
        scale = np.abs(exact).max()
        # the int8 result is numpy's emulation up to float32 rounding (a flipped rounding
        # of an intermediate activation moves it by one step of one input) ...
        assert np.abs(y_art - emul).max() <= 1e-4 * scale, np.abs(y_art - emul).max() / scale
        # ... and differs from the exact block by the quantization error, not more
        err = np.abs(y_art - exact).max() / scale
        assert 0 < err < 0.03, err
        print(f"batch {batch}: int8 off numpy's emulation by "
              f"{np.abs(y_art - emul).max() / scale:.2e}, off the exact block by {err:.2e} "
              f"(of the output scale)")
    print("sizes", size, f"int8/fp32 {size['int8'] / size['fp32']:.3f}x, "
          f"with batch 1 saved {size['int8_1'] / size['fp32_1']:.3f}x")


@pytest.mark.skipif(not HAS["int8"], reason="this CPU lacks AVX512-VNNI")
def test_static_int8_file_holds_no_f32_weights(kiln_bin, residual_model, tmp_path):
    """Static int8 (`kiln compile --calibration-method`): the quantized graph's convolutions
    read s8 constants; the f32 weights they replaced are read by nothing and must not be in
    the file, nor their fp32 packs (it was 4.5x the fp32 file before)."""
    src, w = residual_model
    cal = tmp_path / "cal"
    cal.mkdir()
    np.save(cal / "x.npy", np.random.default_rng(9).standard_normal((16, 64, 8, 8)).astype(np.float32))
    sizes = {}
    for tag, extra in (("fp32", ["--precision", "fp32"]),
                       ("static", ["--precision", "int8", "--calibration-method", "minmax"])):
        out = tmp_path / f"{tag}.kiln"
        r = subprocess.run([kiln_bin, "compile", str(src), "-o", str(out), "--calibration", str(cal),
                            "--batch-sizes", "1", "--runs", "1", "--max-drop", "50%", *extra],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        sizes[tag] = out.stat().st_size
    buf = (tmp_path / "static.kiln").read_bytes()
    woff, wlen = sections(buf)["WGHT"]
    wght = buf[woff:woff + wlen]
    for name in ("r1", "r2", "r3"):
        assert wght.find(w[name].tobytes()) < 0, f"{name}: the f32 weight is stored"
        assert wght.find(w[name].tobytes()[:256]) < 0, f"{name}: part of the f32 weight is stored"
    assert sizes["static"] <= 0.27 * sizes["fp32"], sizes
    x = np.random.default_rng(4).standard_normal((2, 64, 8, 8)).astype(np.float32)
    y = predict(kiln_bin, tmp_path / "static.kiln", x, tmp_path, "static")
    exact = residual_forward(w, x, int8=False)
    assert np.abs(y - exact).max() < 0.05 * np.abs(exact).max()

