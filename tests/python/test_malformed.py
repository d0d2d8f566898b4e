"""test_malformed.py - malformed ONNX files fail cleanly in `kiln inspect`.

Every file in tests/corpus/onnx (written by tools/make_malformed_corpus.py,
plus fuzzer regression inputs) is loaded with `$KILN_BIN inspect FILE`.
Unless its name starts with "any_", it must be refused: a non-zero exit, one
line on stderr that starts with "kiln:" and says what is wrong, within ten
seconds. No file may crash the process (a signal, a sanitizer report). The
"any_" files may also load.

The external-data cases (tests/corpus/onnx_external/<case>/) are copied into
a temporary folder next to a readable "bait" weights file, so that a path
that escapes the model's folder is refused for escaping, not because the
target happens to be missing. Symlink escapes are built here, and valid
models with external data must load.

KILN_BIN defaults to build/kiln; the tests skip when it does not exist.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus" / "onnx"
EXTERNAL = ROOT / "tests" / "corpus" / "onnx_external"
TIMEOUT_S = 10

sys.path.insert(0, str(ROOT / "tools"))
import make_malformed_corpus as corpus  # noqa: E402  (builds the tmp_path models)


def _kiln_bin():
    p = pathlib.Path(os.environ.get("KILN_BIN", str(ROOT / "build" / "kiln")))
    if not p.is_absolute() and not p.exists():
        p = ROOT / p
    return p


KILN_BIN = _kiln_bin()
pytestmark = pytest.mark.skipif(not os.access(KILN_BIN, os.X_OK),
                                reason=f"no kiln binary at {KILN_BIN} (set KILN_BIN)")

# Words the message of some cases must contain (regex, any case): enough to
# show it names the problem rather than just "invalid model".
DUPLICATE = r"duplicate|twice|more than once|already"
DEPTH = r"deep|depth|nest|recurs"
EXPECTED_WORDS = {
    "cycle_two_nodes": r"cycle",
    "cycle_self_loop": r"cycle",
    "cycle_three_nodes": r"cycle",
    "init_huge_dim": r"dim",
    "init_huge_dim_2x3": r"dim",
    "init_negative_dim": r"dim",
    "init_negative_dim_minus_one": r"dim",
    "init_count_overflows_int64": r"dim|overflow|too large|too big",
    "input_huge_dim": r"dim|overflow|too large|too big",
    "input_negative_dim": r"dim",
    "raw_data_short": r"raw_data",
    "raw_data_long": r"raw_data",
    "raw_data_empty": r"raw_data",
    "int64_data_count_short": r"int64_data",
    "int64_data_count_long": r"int64_data",
    "float_data_count_short": r"float_data",
    "unknown_op": r"FrobnicateOp",
    "unknown_op_in_subgraph": r"FrobnicateOp",
    "node_input_never_produced": r"ghost_input",
    "graph_output_never_produced": r"ghost_output",
    "subgraph_input_never_produced": r"ghost_in_branch",
    "duplicate_initializer": DUPLICATE,
    "duplicate_node_output": DUPLICATE,
    "duplicate_graph_input": DUPLICATE,
    "init_data_type_99": r"99",
    "init_data_type_0": r"data_type|dtype|type",
    "init_data_type_float8e4m3_17": r"17|float8",
    "input_data_type_99": r"99",
    "conv_strides_zero": r"strides",
    "conv_group_zero": r"group",
    "conv_kernel_shape_float": r"kernel_shape",
    "transpose_perm_repeated": r"perm",
    "transpose_perm_int": r"perm",
    "cast_missing_to": r"\bto\b",
    "concat_axis_out_of_range": r"axis",
    "sparse_index_out_of_range": r"sparse|ind",
    "if_nested_3000": DEPTH,
    "if_nested_100000_minimal": DEPTH,
    "empty": r"empty|graph",
    "no_graph": r"graph",
}
# A truncated or garbled file must be reported as such.
PARSE_WORDS = r"protobuf|pars|decod|truncat|malformed|corrupt|wire type"
PARSE_PREFIXES = ("trunc_", "graph_len_", "varint_", "wire_type_", "random_")

# External-data messages: escapes must say they are about external data.
EXTERNAL_WORDS = r"external"
EXTERNAL_LOOSE = r"external|location|offset|length|weights\.bin|nope\.bin"
ESCAPES = {"absolute_path", "dotdot", "dotdot_nested", "dotdot_deep"}

SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer",
                   "runtime error", "MemorySanitizer", "ThreadSanitizer")


def run_inspect(path):
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
    try:
        return subprocess.run([str(KILN_BIN), "inspect", str(path)], capture_output=True,
                              timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kiln inspect {path}: no answer within {TIMEOUT_S} s (hang)")


def assert_no_crash(res, path):
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode >= 0, f"{path}: killed by signal {-res.returncode}\n{err}"
    for mark in SANITIZER_MARKS:
        assert mark not in err, f"{path}: sanitizer report\n{err}"
    return err


def assert_clean_failure(res, path, words=None):
    """Non-zero exit and exactly one specific 'kiln:' line on stderr; returns it."""
    err = assert_no_crash(res, path)
    assert res.returncode != 0, f"{path}: loaded, but the file is malformed"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"{path}: expected one error line, got:\n{err}"
    line = lines[0]
    assert line.startswith("kiln:"), f"{path}: error does not start with 'kiln:': {line!r}"
    msg = line[len("kiln:"):].strip()
    # Specific: more than a status name; a few words naming the problem.
    assert len(msg) >= 15 and len(msg.split()) >= 3, f"{path}: vague error: {line!r}"
    if words:
        assert re.search(words, msg, re.IGNORECASE), \
            f"{path}: error should mention /{words}/: {line!r}"
    return line


def corpus_files():
    files = sorted(p for p in CORPUS.iterdir() if p.is_file()) if CORPUS.is_dir() else []
    return files


def case_name(path):
    return path.name[:-len(".onnx")] if path.name.endswith(".onnx") else path.name


def test_corpus_present():
    files = corpus_files()
    assert len(files) > 100, "tests/corpus/onnx is missing; run tools/make_malformed_corpus.py"
    names = {case_name(p) for p in files}
    for name in EXPECTED_WORDS:
        assert name in names, f"corpus lacks case {name}"


@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: p.name)
def test_malformed_file(path):
    name = case_name(path)
    res = run_inspect(path)
    if name.startswith("any_"):
        assert_no_crash(res, path)
        if res.returncode != 0:
            assert_clean_failure(res, path)
        return
    words = EXPECTED_WORDS.get(name)
    if words is None and name.startswith(PARSE_PREFIXES):
        words = PARSE_WORDS
    assert_clean_failure(res, path, words)


# --------------------------------------------------------------------------
# External data.

def external_cases():
    if not EXTERNAL.is_dir():
        return []
    return sorted(p.name for p in EXTERNAL.iterdir() if p.is_dir())


def bait(tmp_path):
    """A readable, correctly sized weights file just outside the model folder."""
    w = corpus.EXT_W.tobytes()
    (tmp_path / "weights.bin").write_bytes(w)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.bin").write_bytes(w)
    return w


@pytest.mark.parametrize("case", external_cases())
def test_external_case(case, tmp_path):
    bait(tmp_path)
    d = tmp_path / case
    shutil.copytree(EXTERNAL / case, d)
    res = run_inspect(d / "model.onnx")
    if case.startswith("any_"):
        assert_no_crash(res, d)
        if res.returncode != 0:
            assert_clean_failure(res, d)
        return
    assert_clean_failure(res, d, EXTERNAL_WORDS if case in ESCAPES else EXTERNAL_LOOSE)


def model_dir(path, entries, files=()):
    """A model folder at path: model.onnx with W external per entries, plus files."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.onnx").write_bytes(corpus.external_model(entries))
    for name, data in files:
        p = path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return path / "model.onnx"


def test_external_symlink_file_escape(tmp_path):
    bait(tmp_path)
    model = model_dir(tmp_path / "m", [("location", "weights.bin")])
    os.symlink("../outside/secret.bin", tmp_path / "m" / "weights.bin")
    assert_clean_failure(run_inspect(model), model, r"external|outside|symlink|escape")


def test_external_symlink_absolute_escape(tmp_path):
    bait(tmp_path)
    model = model_dir(tmp_path / "m", [("location", "weights.bin")])
    os.symlink(tmp_path / "outside" / "secret.bin", tmp_path / "m" / "weights.bin")
    assert_clean_failure(run_inspect(model), model, r"external|outside|symlink|escape")


def test_external_symlink_dir_escape(tmp_path):
    bait(tmp_path)
    model = model_dir(tmp_path / "m", [("location", "sub/secret.bin")])
    os.symlink("../outside", tmp_path / "m" / "sub")
    assert_clean_failure(run_inspect(model), model, r"external|outside|symlink|escape")


def test_external_symlink_chain_escape(tmp_path):
    """A link to a link inside the folder that finally points outside."""
    bait(tmp_path)
    model = model_dir(tmp_path / "m", [("location", "a.bin")])
    os.symlink("b.bin", tmp_path / "m" / "a.bin")
    os.symlink("../outside/secret.bin", tmp_path / "m" / "b.bin")
    assert_clean_failure(run_inspect(model), model, r"external|outside|symlink|escape")


def test_external_fifo_does_not_hang(tmp_path):
    """Opening a FIFO blocks until a writer comes: the loader must not open
    anything but a regular file that way."""
    model = model_dir(tmp_path / "m", [("location", "weights.bin")])
    os.mkfifo(tmp_path / "m" / "weights.bin")
    assert_clean_failure(run_inspect(model), model, r"external|regular|fifo|pipe")


def test_external_symlink_to_fifo_outside(tmp_path):
    model = model_dir(tmp_path / "m", [("location", "weights.bin")])
    os.mkfifo(tmp_path / "pipe")
    os.symlink(tmp_path / "pipe", tmp_path / "m" / "weights.bin")
    assert_clean_failure(run_inspect(model), model, r"external|outside|symlink|regular|fifo")


def test_external_symlink_to_device(tmp_path):
    model = model_dir(tmp_path / "m", [("location", "weights.bin")])
    os.symlink("/dev/zero", tmp_path / "m" / "weights.bin")
    assert_clean_failure(run_inspect(model), model, r"external|outside|symlink|regular")


def test_external_symlink_inside_folder(tmp_path):
    """A link that stays inside the folder may be followed or refused, cleanly."""
    w = bait(tmp_path)
    model = model_dir(tmp_path / "m", [("location", "weights.bin")], [("real.bin", w)])
    os.symlink("real.bin", tmp_path / "m" / "weights.bin")
    res = run_inspect(model)
    assert_no_crash(res, model)
    if res.returncode != 0:
        assert_clean_failure(res, model)


def assert_adds_external_w(model, tmp_path):
    """Run the add model (Y = X + W): Y must be X plus the external W's values."""
    x = np.array([[1.0, -2.0, 3.0], [0.25, 8.0, -1.5]], dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    out.mkdir()
    res = subprocess.run([str(KILN_BIN), "predict", str(model), "--input", f"X={tmp_path / 'x.npy'}",
                          "--output-dir", str(out)], capture_output=True, timeout=TIMEOUT_S)
    err = assert_no_crash(res, model)
    assert res.returncode == 0, f"valid external-data model refused: {err}"
    y = np.load(out / "Y.npy")
    assert y.shape == (2, 3)
    np.testing.assert_array_equal(y, x + corpus.EXT_W)


def test_external_valid(tmp_path):
    w = corpus.EXT_W.tobytes()
    model = model_dir(tmp_path / "m", [("location", "weights.bin")], [("weights.bin", w)])
    res = run_inspect(model)
    err = assert_no_crash(res, model)
    assert res.returncode == 0, f"valid external-data model refused: {err}"
    assert_adds_external_w(model, tmp_path)


def test_external_valid_offset_length_subfolder(tmp_path):
    # the tensor at offset 16, after other floats: a loader that ignores the offset
    # (or the length) reads different values and fails the comparison
    w = corpus.EXT_W.tobytes()
    before = np.full(4, 99.0, dtype=np.float32).tobytes()
    after = np.full(2, -7.0, dtype=np.float32).tobytes()
    model = model_dir(tmp_path / "m",
                      [("location", "data/w.bin"), ("offset", "16"), ("length", str(len(w)))],
                      [("data/w.bin", before + w + after)])
    res = run_inspect(model)
    err = assert_no_crash(res, model)
    assert res.returncode == 0, f"valid external-data model refused: {err}"
    assert_adds_external_w(model, tmp_path)


def test_external_valid_through_symlinked_folder(tmp_path):
    """The folder check must compare resolved paths on both sides: a model
    reached through a symlinked folder, with its data inside, loads."""
    w = corpus.EXT_W.tobytes()
    model_dir(tmp_path / "real", [("location", "weights.bin")], [("weights.bin", w)])
    os.symlink("real", tmp_path / "link")
    model = tmp_path / "link" / "model.onnx"
    res = run_inspect(model)
    err = assert_no_crash(res, model)
    assert res.returncode == 0, f"valid external-data model refused: {err}"
