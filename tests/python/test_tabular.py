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
