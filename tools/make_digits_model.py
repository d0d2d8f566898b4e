#!/usr/bin/python3
"""make_digits_model.py - train a tiny digit classifier and write it as ONNX.

Kiln's smallest real model: an MLP (64 -> 32 -> 10) trained with a fixed
seed on scikit-learn's bundled 8x8 digits data set (no download needed), then
written to ONNX by hand with onnx.helper, since no sklearn->ONNX converter is
installed. The graph is the one a PyTorch exporter would produce:

    pixels [batch,64] -> Gemm -> Relu -> Gemm -> Softmax -> probabilities [batch,10]

The model takes raw pixel values (0..16); the 1/16 input scaling used during
training is folded into the first Gemm's weights. Opset 13, IR version 7.

Writes, under --out (default: models/ beside this tools/ folder):
    digits/1/model.onnx         the model (a few KiB), in TF Serving's folder
                                layout (model name, version), so that
                                `kiln serve --model_base_path=models/digits`
                                serves it as version 1
    digits_sample.npy           float32 [4,64], held-out test images
    digits_sample_labels.npy    int64 [4], their true labels

Every image in the sample is one the model classifies correctly with a clear
margin, so a runtime that reproduces the model must predict exactly these
labels. Output bytes are the same on every run on the same machine.

Usage: /usr/bin/python3 tools/make_digits_model.py [--out DIR]
"""

import argparse
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

SEED = 0
HIDDEN = 32
N_SAMPLE = 4
PIXEL_SCALE = 16.0  # digits pixels are integers 0..16


def train():
    """Train the MLP; return (model, x_test, y_test) with x_test unscaled."""
    digits = load_digits()
    x = digits.data.astype(np.float64)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=SEED, stratify=y)
    clf = MLPClassifier(hidden_layer_sizes=(HIDDEN,), activation="relu",
                        solver="adam", alpha=1e-4, max_iter=400,
                        random_state=SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x_train / PIXEL_SCALE, y_train)
    return clf, x_test, y_test


def build_onnx(clf):
    """Write the trained MLP as an ONNX ModelProto taking raw pixels."""
    # Gemm with transB=1 takes weights as [out, in], as PyTorch exports them.
    w1 = (clf.coefs_[0] / PIXEL_SCALE).T.astype(np.float32)   # [32, 64]
    b1 = clf.intercepts_[0].astype(np.float32)                # [32]
    w2 = clf.coefs_[1].T.astype(np.float32)                   # [10, 32]
    b2 = clf.intercepts_[1].astype(np.float32)                # [10]
    n_classes = w2.shape[0]

    inits = [
        numpy_helper.from_array(w1, "fc1.weight"),
        numpy_helper.from_array(b1, "fc1.bias"),
        numpy_helper.from_array(w2, "fc2.weight"),
        numpy_helper.from_array(b2, "fc2.bias"),
    ]
    nodes = [
        helper.make_node("Gemm", ["pixels", "fc1.weight", "fc1.bias"], ["fc1_out"],
                         name="fc1", alpha=1.0, beta=1.0, transB=1),
        helper.make_node("Relu", ["fc1_out"], ["relu_out"], name="relu"),
        helper.make_node("Gemm", ["relu_out", "fc2.weight", "fc2.bias"], ["logits"],
                         name="fc2", alpha=1.0, beta=1.0, transB=1),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "digits_mlp",
        inputs=[helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 64])],
        outputs=[helper.make_tensor_value_info("probabilities", TensorProto.FLOAT,
                                               ["batch", n_classes])],
        initializer=inits)
    graph.doc_string = ("MLP 64->32->10 trained on sklearn's 8x8 digits; "
                        "input: raw pixel values 0..16")
    model = helper.make_model(graph, producer_name="kiln-tools/make_digits_model",
                              producer_version="1",
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model


def forward_f32(model, x):
    """Run the exported graph's math in float32 numpy (a check on build_onnx)."""
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    h = np.maximum(x @ w["fc1.weight"].T + w["fc1.bias"], np.float32(0))
    z = h @ w["fc2.weight"].T + w["fc2.bias"]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def pick_sample(probs, y_test):
    """Indices of the first N_SAMPLE test images classified right by a clear
    margin (top-1 minus top-2 probability >= 0.2), with distinct labels."""
    picked, seen = [], set()
    for i, p in enumerate(probs):
        top2 = np.sort(p)[-2:]
        if int(np.argmax(p)) != y_test[i] or top2[1] - top2[0] < 0.2:
            continue
        if y_test[i] in seen:
            continue
        picked.append(i)
        seen.add(int(y_test[i]))
        if len(picked) == N_SAMPLE:
            break
    return np.array(picked, dtype=np.int64)


def main():
    default_out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=default_out, help="output folder (default: models/)")
    args = ap.parse_args()

    clf, x_test, y_test = train()
    sk_acc = clf.score(x_test / PIXEL_SCALE, y_test)

    model = build_onnx(clf)
    x32 = x_test.astype(np.float32)
    probs = forward_f32(model, x32)
    onnx_acc = float(np.mean(np.argmax(probs, axis=1) == y_test))
    print(f"test accuracy: {sk_acc:.4f} (sklearn), {onnx_acc:.4f} (exported graph, float32), "
          f"{len(y_test)} held-out images")

    idx = pick_sample(probs, y_test)
    if len(idx) != N_SAMPLE:
        sys.exit(f"make_digits_model: only {len(idx)} confidently-right test images found")

    os.makedirs(args.out, exist_ok=True)
    os.makedirs(os.path.join(args.out, "digits", "1"), exist_ok=True)
    onnx_path = os.path.join(args.out, "digits", "1", "model.onnx")
    with open(onnx_path, "wb") as f:
        f.write(model.SerializeToString())
    np.save(os.path.join(args.out, "digits_sample.npy"), np.ascontiguousarray(x32[idx]))
    np.save(os.path.join(args.out, "digits_sample_labels.npy"), y_test[idx].astype(np.int64))
    print(f"wrote {os.path.normpath(onnx_path)} ({os.path.getsize(onnx_path)} bytes), "
          f"sample labels {y_test[idx].tolist()}")


if __name__ == "__main__":
    main()
