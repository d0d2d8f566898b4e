"""test_xgboost.py - XGBoost save_model files (JSON and UBJSON) loaded by
Kiln and checked against XGBoost's own predict and against known answers.

Boosters are trained here with fixed seeds by Debian's python3-xgboost on
small synthetic data with NaN in the inputs (regression, binary and
multiclass objectives, poisson, hinge, dart, categorical splits), saved in
both formats, run with

    $KILN_BIN predict model.{json,ubj} --input features=X.npy --output-dir OUT

(fast kernels and --reference), and compared with booster.predict within
float rounding (2e-6 relative). The models in ../shared/testdata/xgboost
(see its README) are checked against the answers stated there; those tests
skip when the folder is absent. Malformed files must be refused with a
message naming the fault.
"""

import json
import os
import subprocess
from pathlib import Path

from serve_once import serve_predict

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "testdata" / "xgboost"
xgb = pytest.importorskip("xgboost")


@pytest.fixture(scope="session")
def kiln_bin():
    path = os.path.abspath(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln")))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kiln executable not found at {path}: build it or set KILN_BIN")
    return path


def predict(kiln_bin, model, X, out_dir, extra=()):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    xp = out_dir / "features.npy"
    np.save(xp, np.ascontiguousarray(X, dtype=np.float32))
    r = subprocess.run([kiln_bin, "predict", str(model), "--input", f"features={xp}",
                        "--output-dir", str(out_dir), *extra], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return np.load(out_dir / "predictions.npy")


def data(n=300, f=6, seed=0, nan=0.08):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, f).astype(np.float32)
    score = X[:, 0] + 0.5 * X[:, 1] * X[:, 2] - np.abs(X[:, 3])
    X[rng.rand(n, f) < nan] = np.nan
    return X, score


def labels_for(objective, score):
    if objective.startswith("multi"):
        return np.digitize(score, np.quantile(score, [0.33, 0.66]))
    if objective.startswith("binary") or objective == "reg:logistic":
        return (score > 0).astype(np.float32)
    if objective == "count:poisson":
        return np.floor(np.exp(np.clip(score, -2, 2)))
    return score


CASES = {
    "reg_squarederror": {"objective": "reg:squarederror"},
    "binary_logistic": {"objective": "binary:logistic"},
    "binary_logitraw": {"objective": "binary:logitraw"},
    "reg_logistic": {"objective": "reg:logistic", "base_score": 0.3},
    "binary_hinge": {"objective": "binary:hinge"},
    "count_poisson": {"objective": "count:poisson"},
    "multi_softprob": {"objective": "multi:softprob", "num_class": 3},
    "multi_softmax": {"objective": "multi:softmax", "num_class": 3},
    "dart": {"objective": "reg:squarederror", "booster": "dart", "rate_drop": 0.3,
             "skip_drop": 0.0},
    "deep": {"objective": "reg:squarederror", "max_depth": 8, "min_child_weight": 0},
}


@pytest.fixture(scope="session")
def boosters(tmp_path_factory):
    out = tmp_path_factory.mktemp("xgb")
    made = {}
    X, score = data()
    for name, params in CASES.items():
        p = {"max_depth": 4, "eta": 0.3, "seed": 0, "nthread": 1, **params}
        y = labels_for(p["objective"], score)
        b = xgb.train(p, xgb.DMatrix(X, label=y, missing=np.nan), num_boost_round=12)
        paths = []
        for ext in ("json", "ubj"):
            path = out / f"{name}.{ext}"
            b.save_model(str(path))
            paths.append(path)
        made[name] = (paths, X, b.predict(xgb.DMatrix(X, missing=np.nan)))
    return made


@pytest.mark.parametrize("mode", [[], ["--reference"]], ids=["fast", "reference"])
@pytest.mark.parametrize("ext", [0, 1], ids=["json", "ubj"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_xgboost(kiln_bin, boosters, tmp_path, name, ext, mode):
    paths, X, want = boosters[name]
    got = predict(kiln_bin, paths[ext], X, tmp_path, mode)
    assert got.shape == want.shape
    assert np.isnan(X).any()
    err = float(np.abs(got - want).max())
    assert err <= 2e-6 * max(1.0, float(np.abs(want).max())), f"max error {err}"


def test_categorical_matches_xgboost(kiln_bin, tmp_path):
    rng = np.random.RandomState(1)
    n = 400
    cat = rng.randint(0, 6, n).astype(np.float32)
    num = rng.randn(n).astype(np.float32)
    y = np.where(np.isin(cat, [1, 4]), 2.0, -1.0) + num
    X = np.stack([cat, num], axis=1)
    X[rng.rand(n) < 0.05, 0] = np.nan
    d = xgb.DMatrix(X, label=y, feature_types=["c", "q"], enable_categorical=True)
    b = xgb.train({"tree_method": "hist", "max_cat_to_onehot": 1, "max_depth": 3, "seed": 0},
                  d, num_boost_round=8)
    path = tmp_path / "cat.json"
    b.save_model(str(path))
    model = json.loads(path.read_text())
    assert any(1 in t["split_type"] for t in model["learner"]["gradient_booster"]["model"]["trees"])
    got = predict(kiln_bin, path, X, tmp_path / "o")
    want = b.predict(xgb.DMatrix(X, feature_types=["c", "q"], enable_categorical=True))
    assert np.abs(got - want).max() <= 2e-6 * max(1.0, np.abs(want).max())


def test_model_folder_and_inspect(kiln_bin, boosters, tmp_path):
    """A folder with model.ubj loads; inspect shows the format and the signature."""
    paths, X, want = boosters["multi_softprob"]
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.ubj").write_bytes(paths[1].read_bytes())
    r = subprocess.run([kiln_bin, "inspect", str(folder)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "format: xgboost" in r.stdout and "features: float32[N,6]" in r.stdout, r.stdout
    got = predict(kiln_bin, folder, X, tmp_path / "o")
    assert got.shape == (len(X), 3)
    assert np.abs(got - want).max() <= 2e-6


# ---- the shared models, against the answers in ../shared/testdata/README.md ----

def need(path):
    if not path.exists():
        pytest.skip(f"{path} is absent (shared test data)")
    return path


def test_shared_treelite_categorical(kiln_bin, tmp_path):
    d = SHARED / "dmlc-treelite/tests/examples/xgb_toy_categorical"
    model = need(d / "xgb_toy_categorical_model.json")
    rows = []
    for line in (d / "xgb_toy_categorical.test").read_text().split("\n"):
        if not line.strip():
            continue
        row = [np.nan, np.nan]
        for item in line.split()[1:]:
            k, v = item.split(":")
            row[int(k)] = float(v)
        rows.append(row)
    want = np.array([float(v) for v in (d / "xgb_toy_categorical.test.pred").read_text().split()])
    got = predict(kiln_bin, model, np.array(rows, np.float32), tmp_path)
    assert np.abs(got - want).max() < 1e-5


def test_shared_vespa_breast_cancer_ubj(kiln_bin, tmp_path):
    model = need(SHARED / "vespa-engine-vespa/model-integration/src/test/models/xgboost/binary_breast_cancer.ubj")
    from sklearn.datasets import load_breast_cancer
    X, y = load_breast_cancer(return_X_y=True)
    got = predict(kiln_bin, model, X, tmp_path)
    assert abs(got[0] - 0.030272) < 2e-6 and abs(got[19] - 0.991486) < 2e-6, got[[0, 19]]
    assert ((got > 0.5) == (y == 1)).all()


def test_shared_ankane_model_json(kiln_bin, tmp_path):
    d = SHARED / "ankane-xgboost-ruby/test/support"
    model = need(d / "model.json")
    rows = np.loadtxt(d / "data.csv", delimiter=",", skiprows=1)
    X, y = rows[:, :4], rows[:, 4]
    got = predict(kiln_bin, model, X, tmp_path)
    np.testing.assert_allclose(got[[0, 1, 2, 300, 301, 302]],
                               [1.006533, 1.012018, 0.996004, 1.134992, 1.332621, 1.649341], atol=2e-6)
    rmse = float(np.sqrt(np.mean((got[300:] - y[300:]) ** 2)))
    assert abs(rmse - 0.318102) < 1e-5


# ---- malformed files ----

def tiny_model():
    tree = {"left_children": [1, -1, -1], "right_children": [2, -1, -1], "split_indices": [0, 0, 0],
            "split_conditions": [0.5, -1.0, 1.0], "default_left": [1, 0, 0], "split_type": [0, 0, 0],
            "categories": [], "categories_nodes": [], "categories_segments": [], "categories_sizes": [],
            "tree_param": {"num_nodes": "3", "num_feature": "2", "size_leaf_vector": "0"}}
    return {"learner": {"learner_model_param": {"base_score": "5E-1", "num_class": "0", "num_feature": "2",
                                                "num_target": "1"},
                        "objective": {"name": "reg:squarederror"},
                        "gradient_booster": {"name": "gbtree", "model": {"trees": [tree], "tree_info": [0]}}},
            "version": [1, 7, 4]}


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.update(left_children=[1, -1, 9]) or t.update(right_children=[5, -1, -1]),
     "out of range for 3 nodes"),
    (lambda t: t.update(left_children=[1, 0, -1], right_children=[2, 2, -1]), "reached twice"),
    (lambda t: t.update(split_indices=[0, 0]), "'split_indices' has 2 entries, left_children 3"),
    (lambda t: t.update(split_indices=[7, 0, 0]), "splits on feature 7 of 2"),
    (lambda t: t.update(split_type=[1, 0, 0]), "categorical node 0 has no categories"),
])
def test_malformed_refused(kiln_bin, tmp_path, edit, message):
    m = tiny_model()
    edit(m["learner"]["gradient_booster"]["model"]["trees"][0])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(m))
    r = subprocess.run([kiln_bin, "inspect", str(path)], capture_output=True, text=True)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr


def test_tiny_model_known_answer(kiln_bin, tmp_path):
    """x < 0.5 goes left (-1), else right (+1), NaN left; base 0.5 added."""
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(tiny_model()))
    X = np.array([[0.2, 0], [0.5, 0], [0.9, 0], [np.nan, 0]], np.float32)
    got = predict(kiln_bin, path, X, tmp_path / "o")
    np.testing.assert_array_equal(got, [-0.5, 1.5, 1.5, -0.5])


def test_unsupported_objective(kiln_bin, tmp_path):
    m = tiny_model()
    m["learner"]["objective"]["name"] = "survival:cox"
    path = tmp_path / "cox.json"
    path.write_text(json.dumps(m))
    r = subprocess.run([kiln_bin, "inspect", str(path)], capture_output=True, text=True)
    assert r.returncode != 0 and "objective 'survival:cox' is not supported" in r.stderr, r.stderr


def test_serve_xgboost_version_folder(kiln_bin, boosters, tmp_path):
    """kiln serve loads 1/model.ubj; TF Serving's predict returns XGBoost's probabilities."""
    paths, X, want = boosters["multi_softprob"]
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.ubj").write_bytes(paths[1].read_bytes())
    rows = np.nan_to_num(X[:4], nan=0.0)  # JSON has no NaN literal in TF Serving's format
    reply = serve_predict(kiln_bin, tmp_path / "m", "xgb", rows.tolist())
    got = np.array(reply["predictions"], dtype=np.float32)
    ref = xgb.Booster(model_file=str(paths[0])).predict(xgb.DMatrix(rows))
    assert got.shape == (4, 3)
    assert np.abs(got - ref).max() <= 2e-6


def test_depth_limit(kiln_bin, tmp_path):
    """A 5,000-deep chain (each right child the next split) is refused, not walked."""
    depth = 5000
    n = 2 * depth + 1
    left, right = [-1] * n, [-1] * n
    for d in range(depth):
        node = 2 * d
        left[node], right[node] = node + 1, node + 2
    m = tiny_model()
    t = m["learner"]["gradient_booster"]["model"]["trees"][0]
    t.update(left_children=left, right_children=right, split_indices=[0] * n,
             split_conditions=[0.5] * n, default_left=[0] * n, split_type=[0] * n)
    t["tree_param"]["num_nodes"] = str(n)
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(m))
    r = subprocess.run([kiln_bin, "inspect", str(path)], capture_output=True, text=True)
    assert r.returncode != 0 and "deeper than Kiln's limit of 4096" in r.stderr, r.stderr
