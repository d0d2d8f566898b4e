"""test_tabular.py - scikit-learn models as ONNX-ML graphs, run by Kiln and
checked against scikit-learn's own predictions.

tools/make_tabular_models.py fits each model (fixed seeds, scikit-learn's
bundled iris, breast_cancer and diabetes data) and writes it with the onnx
package as a converter would (tree ensembles from estimator.tree_, linear
models, SVMs, Scaler / Imputer / OneHotEncoder / FeatureVectorizer /
Normalizer / Binarizer pipelines, ZipMap). Each test runs

    $KILN_BIN predict NAME.onnx --input X=X.npy --output-dir OUT [--reference]

and requires the labels to equal scikit-learn's predict exactly and every
score / probability / regression output to be within 1e-5 relative of
predict_proba / decision_function / predict (float32 features, float32
outputs, scores summed in double).

Also: the ZipMap output is the probability tensor (docs/TABULAR.md), and a
tree model with a child index out of range is refused with a message that
names it.
"""

import importlib.util
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "make_tabular_models.py"
MODELS = ["rf_iris", "gb_iris", "gb_breast_cancer", "rf_diabetes", "gb_diabetes",
          "logreg_breast_cancer", "pipeline_iris", "svc_iris", "svc_proba_iris", "svr_diabetes",
          "binarized_linear_diabetes"]


@pytest.fixture(scope="session")
def kiln_bin():
    path = os.path.abspath(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln")))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kiln executable not found at {path}: build it or set KILN_BIN")
    return path


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    pytest.importorskip("sklearn")
    pytest.importorskip("onnx")
    spec = importlib.util.spec_from_file_location("make_tabular_models", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build(str(tmp_path_factory.mktemp("tabular")))


def run_kiln(kiln_bin, model, inputs, out_dir, extra=()):
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [kiln_bin, "predict", str(model)]
    for name, arr in inputs.items():
        p = out_dir / f"in_{name}.npy"
        np.save(p, arr)
        args += ["--input", f"{name}={p}"]
    args += ["--output-dir", str(out_dir), *extra]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("mode", [[], ["--reference"]], ids=["fast", "reference"])
@pytest.mark.parametrize("name", MODELS)
def test_matches_sklearn(kiln_bin, models, tmp_path, name, mode):
    path, inputs, expected = models[name]
    r = run_kiln(kiln_bin, path, inputs, tmp_path, mode)
    assert r.returncode == 0, r.stderr
    for out, want in expected.items():
        got = np.load(tmp_path / f"{out}.npy")
        assert got.size == want.size, f"{out}: shape {got.shape}, expected {want.shape}"
        got = got.reshape(want.shape)
        if want.dtype.kind in "iu":
            assert got.dtype == np.int64, got.dtype
            bad = np.flatnonzero(got != want)
            assert bad.size == 0, f"{out}: rows {bad[:10]} differ: {got[bad[:10]]} vs {want[bad[:10]]}"
        else:
            tol = 1e-5 * max(1.0, float(np.abs(want).max()))
            err = float(np.abs(got - want).max())
            assert err <= tol, f"{out}: max error {err} > {tol}"


def test_refuses_bad_child(kiln_bin, tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    node = helper.make_node(
        "TreeEnsembleRegressor", ["X"], ["Y"], domain="ai.onnx.ml", n_targets=1,
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0, 0],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[7, 0, 0],
        target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[1.0, 2.0])
    g = helper.make_graph([node], "bad", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    path = tmp_path / "bad.onnx"
    onnx.save(m, str(path))
    r = run_kiln(kiln_bin, path, {"X": np.zeros((1, 1), np.float32)}, tmp_path / "o", ["--reference"])
    assert r.returncode != 0
    assert "false child 7 does not exist" in r.stderr, r.stderr


def test_ml_op_needs_ml_domain(kiln_bin, tmp_path):
    """An ai.onnx.ml op name in the default domain is not mistaken for it."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    node = helper.make_node("Binarizer", ["X"], ["Y"], threshold=0.5)
    g = helper.make_graph([node], "wrong_domain",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    path = tmp_path / "wrong.onnx"
    onnx.save(m, str(path))
    r = run_kiln(kiln_bin, path, {"X": np.zeros(2, np.float32)}, tmp_path / "o")
    assert r.returncode != 0
    assert "op 'Binarizer' is not supported" in r.stderr, r.stderr


def test_serve_zipmap_probabilities(kiln_bin, models, tmp_path):
    """A classifier ending in ZipMap serves its probabilities as one list per instance."""
    from serve_once import serve_predict
    path, inputs, expected = models["rf_iris"]
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(Path(path).read_bytes())
    reply = serve_predict(kiln_bin, tmp_path / "m", "iris", inputs["X"][:5].tolist())
    rows = reply["predictions"]
    assert [r["output_label"] for r in rows] == expected["output_label"][:5].tolist()
    got = np.array([r["output_probability"] for r in rows])
    assert got.shape == (5, 3)
    assert np.abs(got - expected["output_probability"][:5]).max() <= 1e-5


def one_node_model(tmp_path, node, inputs, outputs, ml_opset=3):
    onnx = pytest.importorskip("onnx")
    from onnx import helper
    g = helper.make_graph([node], "one", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15),
                                            helper.make_opsetid("ai.onnx.ml", ml_opset)])
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    return path


def test_string_ops_known_answers(kiln_bin, tmp_path):
    """CategoryMapper, OneHotEncoder on strings and LabelEncoder float -> string, by hand."""
    pytest.importorskip("onnx")
    from onnx import TensorProto as T, helper
    X = np.array([["b", "zz"], ["a", "c"]])
    cases = [
        (helper.make_node("CategoryMapper", ["X"], ["Y"], domain="ai.onnx.ml", cats_strings=["a", "b", "c"],
                          cats_int64s=[7, 8, 9], default_int64=-5),
         [("X", T.STRING, [2, 2])], [("Y", T.INT64, [2, 2])], {"X": X}, np.array([[8, -5], [7, 9]])),
        (helper.make_node("OneHotEncoder", ["X"], ["Y"], domain="ai.onnx.ml", cats_strings=["a", "b", "c"]),
         [("X", T.STRING, [2, 2])], [("Y", T.FLOAT, [2, 2, 3])], {"X": X},
         np.array([[[0, 1, 0], [0, 0, 0]], [[1, 0, 0], [0, 0, 1]]], np.float32)),
        (helper.make_node("LabelEncoder", ["X"], ["Y"], domain="ai.onnx.ml", keys_floats=[0.5, 2.0],
                          values_strings=["half", "two"], default_string="other"),
         [("X", T.FLOAT, [3])], [("Y", T.STRING, [3])], {"X": np.array([2.0, 0.5, 1.0], np.float32)},
         np.array([b"two", b"half", b"other"])),
    ]
    for i, (node, ins, outs, feed, want) in enumerate(cases):
        d = tmp_path / str(i)
        d.mkdir()
        path = one_node_model(d, node, ins, outs, ml_opset=2)
        for mode in ([], ["--reference"]):
            r = run_kiln(kiln_bin, path, feed, d / "o", mode)
            assert r.returncode == 0, r.stderr
            got = np.load(d / "o" / "Y.npy")
            if want.dtype.kind == "S":
                assert got.astype("S").tolist() == want.tolist(), (node.op_type, got)
            else:
                np.testing.assert_array_equal(got, want, err_msg=node.op_type)


def test_tree_classifier_string_labels(kiln_bin, tmp_path):
    """One tree, x0 <= 0.5 -> class 'no' (weight 1), else 'yes'; NaN tracks true."""
    pytest.importorskip("onnx")
    from onnx import TensorProto as T, helper
    node = helper.make_node(
        "TreeEnsembleClassifier", ["X"], ["label", "scores"], domain="ai.onnx.ml",
        classlabels_strings=["no", "yes"], nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2],
        nodes_featureids=[0, 0, 0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0, 0],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0], nodes_missing_value_tracks_true=[1, 0, 0],
        class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[0, 1], class_weights=[1.0, 1.0])
    path = one_node_model(tmp_path, node, [("X", T.FLOAT, ["N", 1])],
                          [("label", T.STRING, ["N"]), ("scores", T.FLOAT, ["N", 2])])
    X = np.array([[0.2], [0.5], [0.7], [np.nan]], np.float32)
    for mode in ([], ["--reference"]):
        r = run_kiln(kiln_bin, path, {"X": X}, tmp_path / "o", mode)
        assert r.returncode == 0, r.stderr
        assert np.load(tmp_path / "o" / "label.npy").astype("S").tolist() == [b"no", b"no", b"yes", b"no"]
        np.testing.assert_array_equal(np.load(tmp_path / "o" / "scores.npy"),
                                      [[1, 0], [1, 0], [0, 1], [1, 0]])
