#!/usr/bin/env python3
"""make_tabular_models.py - scikit-learn models written as ONNX-ML graphs.

Fits small scikit-learn models with fixed seeds on the data sets scikit-learn
bundles (iris, breast_cancer, diabetes) and writes each as an ONNX model in
the ai.onnx.ml domain, the way skl2onnx converts them (skl2onnx itself is not
installed here): trees from estimator.tree_ as TreeEnsembleClassifier /
TreeEnsembleRegressor, linear models as LinearClassifier / LinearRegressor,
SVC / SVR as SVMClassifier / SVMRegressor, StandardScaler as Scaler,
OneHotEncoder as OneHotEncoder, SimpleImputer as Imputer, Binarizer,
Normalizer, FeatureVectorizer joining a pipeline's columns, and ZipMap after
a classifier's probabilities.

For every model it also saves the inputs and scikit-learn's own predict /
predict_proba / decision outputs, which tests/python/test_tabular.py compares
with Kiln's. Usage:

    /usr/bin/python3 tools/make_tabular_models.py OUT_DIR

writes OUT_DIR/<name>.onnx, OUT_DIR/<name>.inputs.npz and
OUT_DIR/<name>.expected.npz (output name -> array) and prints the names.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ML = "ai.onnx.ml"
OPSETS = [helper.make_opsetid("", 15), helper.make_opsetid(ML, 3)]


def _model(nodes, inputs, outputs, name, initializers=()):
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    m = helper.make_model(g, opset_imports=OPSETS, producer_name="kiln-make_tabular_models")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _vi(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def _dtensor(name, values):
    """A double tensor attribute value (nodes_values_as_tensor and friends)."""
    return numpy_helper.from_array(np.asarray(values, dtype=np.float64), name)


# ---- trees ----

def tree_attrs(trees, leaf_votes, prefix):
    """ONNX-ML tree attributes for sklearn trees.

    trees: list of sklearn Tree objects; leaf_votes(tree_index, tree, node)
    returns [(target_or_class, weight), ...] for a leaf. Thresholds go in as
    doubles (nodes_values_as_tensor) so that float32 features compare with
    them exactly as scikit-learn does (X as float32, thresholds double).
    """
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                         "nodes_truenodeids", "nodes_falsenodeids", "values")}
    v = {k: [] for k in ("treeids", "nodeids", "ids", "weights")}
    for ti, t in enumerate(trees):
        for ni in range(t.node_count):
            leaf = t.children_left[ni] == -1
            a["nodes_treeids"].append(ti)
            a["nodes_nodeids"].append(ni)
            a["nodes_featureids"].append(0 if leaf else int(t.feature[ni]))
            a["nodes_modes"].append("LEAF" if leaf else "BRANCH_LEQ")
            a["nodes_truenodeids"].append(0 if leaf else int(t.children_left[ni]))
            a["nodes_falsenodeids"].append(0 if leaf else int(t.children_right[ni]))
            a["values"].append(0.0 if leaf else float(t.threshold[ni]))
            if leaf:
                for target, w in leaf_votes(ti, t, ni):
                    v["treeids"].append(ti)
                    v["nodeids"].append(ni)
                    v["ids"].append(int(target))
                    v["weights"].append(float(w))
    attrs = {k: a[k] for k in a if k != "values"}
    attrs["nodes_values_as_tensor"] = _dtensor("nodes_values", a["values"])
    attrs[prefix + "_treeids"] = v["treeids"]
    attrs[prefix + "_nodeids"] = v["nodeids"]
    attrs[prefix + "_ids"] = v["ids"]
    attrs[prefix + "_weights_as_tensor"] = _dtensor(prefix + "_weights", v["weights"])
    return attrs


def zipmap_outputs(nodes, labels, proba_name):
    """Append ZipMap after the probability tensor; returns the output value infos."""
    nodes.append(helper.make_node("ZipMap", [proba_name], ["output_probability"], domain=ML,
                                  classlabels_int64s=[int(c) for c in labels]))
    seq_map = onnx.TypeProto()
    mt = seq_map.sequence_type.elem_type.map_type
    mt.key_type = TensorProto.INT64
    mt.value_type.tensor_type.elem_type = TensorProto.FLOAT
    return [_vi("output_label", TensorProto.INT64, ["N"]),
            helper.make_value_info("output_probability", seq_map)]


def random_forest_classifier(X, y):
    from sklearn.ensemble import RandomForestClassifier
    m = RandomForestClassifier(n_estimators=12, max_depth=6, random_state=0).fit(X, y)
    n = len(m.estimators_)

    def votes(ti, t, ni):
        counts = t.value[ni][0]
        return [(k, c / counts.sum() / n) for k, c in enumerate(counts)]

    attrs = tree_attrs([e.tree_ for e in m.estimators_], votes, "class")
    nodes = [helper.make_node("TreeEnsembleClassifier", ["X"], ["output_label", "probabilities"],
                              domain=ML, classlabels_int64s=[int(c) for c in m.classes_],
                              post_transform="NONE", **attrs)]
    outs = zipmap_outputs(nodes, m.classes_, "probabilities")
    model = _model(nodes, [_vi("X", TensorProto.FLOAT, ["N", X.shape[1]])], outs, "rf_classifier")
    return model, {"output_label": m.predict(X), "output_probability": m.predict_proba(X)}


def gradient_boosting_classifier(X, y):
    from sklearn.ensemble import GradientBoostingClassifier
    m = GradientBoostingClassifier(n_estimators=25, max_depth=3, learning_rate=0.2,
                                   random_state=0).fit(X, y)
    k = m.estimators_.shape[1]
    lr = m.learning_rate
    trees, cls = [], []
    for stage in m.estimators_:
        for c, e in enumerate(stage):
            trees.append(e.tree_)
            cls.append(c)

    def votes(ti, t, ni):
        return [(cls[ti], lr * t.value[ni][0][0])]

    attrs = tree_attrs(trees, votes, "class")
    # the initial raw score: decision_function less the trees' part, on one row
    raw = m.decision_function(X[:1]).reshape(-1)
    tree_part = np.zeros(k)
    for stage in m.estimators_:
        for c, e in enumerate(stage):
            tree_part[c] += lr * e.predict(X[:1])[0]
    base = raw - tree_part
    post = "LOGISTIC" if k == 1 else "SOFTMAX"
    nodes = [helper.make_node("TreeEnsembleClassifier", ["X"], ["output_label", "probabilities"],
                              domain=ML, classlabels_int64s=[int(c) for c in m.classes_],
                              base_values=[float(b) for b in base], post_transform=post, **attrs)]
    outs = zipmap_outputs(nodes, m.classes_, "probabilities")
    model = _model(nodes, [_vi("X", TensorProto.FLOAT, ["N", X.shape[1]])], outs, "gb_classifier")
    return model, {"output_label": m.predict(X), "output_probability": m.predict_proba(X)}


def tree_regressor(m, X, name, aggregate):
    if hasattr(m, "init_"):  # gradient boosting
        lr = m.learning_rate
        trees = [e.tree_ for e in m.estimators_[:, 0]]
        base = [float(m.predict(X[:1])[0] - sum(lr * e.predict(X[:1])[0] for e in m.estimators_[:, 0]))]
        scale = lr
    else:
        trees = [e.tree_ for e in m.estimators_]
        base, scale = None, 1.0

    def votes(ti, t, ni):
        return [(0, scale * t.value[ni][0][0])]

    attrs = tree_attrs(trees, votes, "target")
    if base is not None:
        attrs["base_values"] = base
    nodes = [helper.make_node("TreeEnsembleRegressor", ["X"], ["variable"], domain=ML, n_targets=1,
                              aggregate_function=aggregate, **attrs)]
    model = _model(nodes, [_vi("X", TensorProto.FLOAT, ["N", X.shape[1]])],
                   [_vi("variable", TensorProto.FLOAT, ["N", 1])], name)
    return model, {"variable": m.predict(X).reshape(-1, 1)}


# ---- linear models and SVMs ----

def scaler_logistic_binary(X, y):
    """StandardScaler + LogisticRegression (binary) + ZipMap."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    p = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(X, y)
    sc, lr = p.steps[0][1], p.steps[1][1]
    nodes = [
        helper.make_node("Scaler", ["X"], ["scaled"], domain=ML, offset=sc.mean_.tolist(),
                         scale=(1.0 / sc.scale_).tolist()),
        helper.make_node("LinearClassifier", ["scaled"], ["output_label", "probabilities"], domain=ML,
                         coefficients=lr.coef_.ravel().tolist(), intercepts=lr.intercept_.tolist(),
                         classlabels_ints=[int(c) for c in lr.classes_], post_transform="LOGISTIC"),
    ]
    outs = zipmap_outputs(nodes, lr.classes_, "probabilities")
    model = _model(nodes, [_vi("X", TensorProto.FLOAT, ["N", X.shape[1]])], outs, "logreg_binary")
    return model, {"output_label": p.predict(X), "output_probability": p.predict_proba(X)}


def mixed_pipeline(X, y):
    """Numeric columns through SimpleImputer + StandardScaler, one categorical
    column through OneHotEncoder, joined by FeatureVectorizer, then a
    multinomial LogisticRegression and ZipMap. Inputs: num (float, some NaN)
    and cat (int64)."""
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline, make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler
    rng = np.random.RandomState(0)
    num = X[:, :3].astype(np.float32).copy()
    num[rng.rand(*num.shape) < 0.1] = np.nan
    cat = np.digitize(X[:, 3], [0.8, 1.7]).astype(np.int64).reshape(-1, 1) * 10 + 3
    Xall = np.concatenate([num.astype(np.float64), cat.astype(np.float64)], axis=1)
    ct = ColumnTransformer([
        ("num", make_pipeline(SimpleImputer(strategy="mean"), StandardScaler()), [0, 1, 2]),
        ("cat", OneHotEncoder(), [3]),
    ])
    p = Pipeline([("prep", ct), ("clf", LogisticRegression(max_iter=2000))]).fit(Xall, y)
    imp, sc = ct.named_transformers_["num"].steps[0][1], ct.named_transformers_["num"].steps[1][1]
    ohe = ct.named_transformers_["cat"]
    lr = p.named_steps["clf"]
    cats = [int(c) for c in ohe.categories_[0]]
    nodes = [
        helper.make_node("Imputer", ["num"], ["imputed"], domain=ML,
                         imputed_value_floats=imp.statistics_.tolist(), replaced_value_float=float("nan")),
        helper.make_node("Scaler", ["imputed"], ["scaled"], domain=ML, offset=sc.mean_.tolist(),
                         scale=(1.0 / sc.scale_).tolist()),
        helper.make_node("OneHotEncoder", ["cat"], ["onehot3"], domain=ML, cats_int64s=cats, zeros=1),
        helper.make_node("Reshape", ["onehot3", "shape"], ["onehot"]),
        helper.make_node("FeatureVectorizer", ["scaled", "onehot"], ["features"], domain=ML,
                         inputdimensions=[3, len(cats)]),
        helper.make_node("LinearClassifier", ["features"], ["output_label", "probabilities"], domain=ML,
                         coefficients=lr.coef_.ravel().tolist(), intercepts=lr.intercept_.tolist(),
                         classlabels_ints=[int(c) for c in lr.classes_], post_transform="SOFTMAX",
                         multi_class=1),
    ]
    outs = zipmap_outputs(nodes, lr.classes_, "probabilities")
    shape = numpy_helper.from_array(np.array([-1, len(cats)], dtype=np.int64), "shape")
    model = _model(nodes, [_vi("num", TensorProto.FLOAT, ["N", 3]), _vi("cat", TensorProto.INT64, ["N", 1])],
                   outs, "mixed_pipeline", [shape])
    inputs = {"num": num, "cat": cat}
    return model, {"output_label": p.predict(Xall), "output_probability": p.predict_proba(Xall)}, inputs


def svc(X, y, probability):
    from sklearn.svm import SVC
    m = SVC(kernel="rbf", gamma=0.2, C=2.0, probability=probability, random_state=0,
            decision_function_shape="ovo").fit(X, y)
    attrs = dict(kernel_type="RBF", kernel_params=[float(m._gamma), float(m.coef0), float(m.degree)],
                 vectors_per_class=[int(v) for v in m.n_support_],
                 support_vectors=m.support_vectors_.ravel().tolist(),
                 coefficients=m.dual_coef_.ravel().tolist(), rho=m.intercept_.tolist(),
                 classlabels_ints=[int(c) for c in m.classes_])
    expected = {"label": m.predict(X)}
    if probability:
        attrs["prob_a"] = m.probA_.tolist()
        attrs["prob_b"] = m.probB_.tolist()
        expected["scores"] = m.predict_proba(X)
    nodes = [helper.make_node("SVMClassifier", ["X"], ["label", "scores"], domain=ML, **attrs)]
    k = len(m.classes_)
    cols = k if probability else k * (k - 1) // 2
    model = _model(nodes, [_vi("X", TensorProto.FLOAT, ["N", X.shape[1]])],
                   [_vi("label", TensorProto.INT64, ["N"]), _vi("scores", TensorProto.FLOAT, ["N", cols])],
                   "svc_proba" if probability else "svc")
    if not probability:
        # ONNX orders the one-vs-one scores like libsvm: (0,1), (0,2), ..., (1,2), ...
        expected["scores"] = m.decision_function(X)
    return model, expected


def svr_normalized(X, y):
    """Normalizer (L2) + SVR (rbf) -> SVMRegressor; and Binarizer + LinearRegression."""
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import Normalizer
    from sklearn.svm import SVR
    p = make_pipeline(Normalizer(norm="l2"), SVR(kernel="rbf", gamma=3.0, C=50.0)).fit(X, y)
    m = p.steps[1][1]
    nodes = [
        helper.make_node("Normalizer", ["X"], ["normed"], domain=ML, norm="L2"),
        helper.make_node("SVMRegressor", ["normed"], ["variable"], domain=ML, kernel_type="RBF",
                         kernel_params=[float(m._gamma), 0.0, 3.0], n_supports=int(m.support_.size),
                         support_vectors=m.support_vectors_.ravel().tolist(),
                         coefficients=m.dual_coef_.ravel().tolist(), rho=m.intercept_.tolist()),
    ]
    model = _model(nodes, [_vi("X", TensorProto.FLOAT, ["N", X.shape[1]])],
                   [_vi("variable", TensorProto.FLOAT, ["N", 1])], "svr_normalized")
    return model, {"variable": p.predict(X).reshape(-1, 1)}


def binarized_linear(X, y):
    from sklearn.linear_model import LinearRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import Binarizer
    p = make_pipeline(Binarizer(threshold=0.0), LinearRegression()).fit(X, y)
    m = p.steps[1][1]
    nodes = [
        helper.make_node("Binarizer", ["X"], ["bin"], domain=ML, threshold=0.0),
        helper.make_node("LinearRegressor", ["bin"], ["variable"], domain=ML,
                         coefficients=m.coef_.ravel().tolist(), intercepts=[float(m.intercept_)], targets=1),
    ]
    model = _model(nodes, [_vi("X", TensorProto.FLOAT, ["N", X.shape[1]])],
                   [_vi("variable", TensorProto.FLOAT, ["N", 1])], "binarized_linear")
    return model, {"variable": p.predict(X).reshape(-1, 1)}


def build(out_dir):
    """Fit and write every model; returns {name: (onnx path, inputs, expected)}."""
    from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor
    os.makedirs(out_dir, exist_ok=True)
    iris_X, iris_y = load_iris(return_X_y=True)
    bc_X, bc_y = load_breast_cancer(return_X_y=True)
    db_X, db_y = load_diabetes(return_X_y=True)
    # scikit-learn's trees see float32 features: fit on them so thresholds agree
    iris_X, bc_X, db_X = (a.astype(np.float32).astype(np.float64) for a in (iris_X, bc_X, db_X))
    made = {}

    def add(name, result, X):
        model, expected = result[0], result[1]
        inputs = result[2] if len(result) > 2 else {"X": X.astype(np.float32)}
        path = os.path.join(out_dir, name + ".onnx")
        onnx.save(model, path)
        np.savez(os.path.join(out_dir, name + ".inputs.npz"), **inputs)
        np.savez(os.path.join(out_dir, name + ".expected.npz"), **expected)
        made[name] = (path, inputs, expected)

    add("rf_iris", random_forest_classifier(iris_X, iris_y), iris_X)
    add("gb_iris", gradient_boosting_classifier(iris_X, iris_y), iris_X)
    add("gb_breast_cancer", gradient_boosting_classifier(bc_X, bc_y), bc_X)
    add("rf_diabetes", tree_regressor(RandomForestRegressor(n_estimators=10, max_depth=6, random_state=0)
                                      .fit(db_X, db_y), db_X, "rf_regressor", "AVERAGE"), db_X)
    add("gb_diabetes", tree_regressor(GradientBoostingRegressor(n_estimators=30, max_depth=3, random_state=0)
                                      .fit(db_X, db_y), db_X, "gb_regressor", "SUM"), db_X)
    add("logreg_breast_cancer", scaler_logistic_binary(bc_X, bc_y), bc_X)
    add("pipeline_iris", mixed_pipeline(iris_X, iris_y), iris_X)
    add("svc_iris", svc(iris_X, iris_y, False), iris_X)
    add("svc_proba_iris", svc(iris_X, iris_y, True), iris_X)
    add("svr_diabetes", svr_normalized(db_X, db_y), db_X)
    add("binarized_linear_diabetes", binarized_linear(db_X, db_y), db_X)
    return made


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for name in build(sys.argv[1]):
        print(name)
