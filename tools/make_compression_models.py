#!/usr/bin/python3
"""make_compression_models.py - small trained models for the compression accuracy tests.

Trains, with fixed seeds and in a few seconds on one core, a small CNN on
scikit-learn's bundled 8x8 digits (no download) and exports it to ONNX with
torch.onnx.export:

    image [batch,1,8,8] -> Conv 3x3 (1->8) -> Relu -> Conv 3x3 stride 2 (8->16) -> Relu
          -> Flatten -> Gemm (256->32) -> Relu -> Gemm (32->10) -> logits [batch,10]

Pixels are scaled to 0..1 by the caller (the model takes image / 16).
Writes, under --out (default: a folder named compression_models in the
current directory):

    digits_cnn.onnx       the model
    digits_test_x.npy     float32 [450,1,8,8], the held-out quarter (stratified, seed 0)
    digits_test_y.npy     int64 [450], its labels
    digits_cal_x.npy      float32 [200,1,8,8], training images (calibration data)

and a tabular classifier on scikit-learn's bundled breast-cancer data set
(30 raw features whose scales range from 0.001 to 4000): an MLP
30 -> 32 -> Relu -> 2 trained on standardized features, with the
standardization folded into the first layer so that the model takes the raw
features, as a deployed tabular model often does. Its first layer's input
spans six orders of magnitude, which is what dynamic int8 quantization (one
activation scale per tensor) handles worst: the case `kiln compile
--precision auto` exists for.

    cancer_mlp.onnx       features [batch,30] -> logits [batch,2]
    cancer_test_x.npy     float32 [143,30], the held-out quarter (stratified, seed 0)
    cancer_test_y.npy     int64 [143]
    cancer_cal_x.npy      float32 [200,30], training rows (calibration data)

tests/python/test_precision.py runs this into a temporary folder and checks
that every --precision keeps the held-out accuracy within 1% of fp32;
tests/python/test_compile.py compiles these models with `kiln compile`.

Usage: /usr/bin/python3 tools/make_compression_models.py [--out DIR] [--epochs N]
"""

import argparse
import os

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.model_selection import train_test_split

SEED = 0


class DigitsCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.f1 = torch.nn.Linear(256, 32)
        self.f2 = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        x = torch.flatten(x, 1)
        return self.f2(torch.relu(self.f1(x)))


def data():
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    return train_test_split(x, y, test_size=0.25, random_state=SEED, stratify=y)


def train(epochs):
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    torch.set_num_threads(1)
    x_train, x_test, y_train, y_test = data()
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    g = torch.Generator().manual_seed(SEED)
    for _ in range(epochs):
        perm = torch.randperm(len(xt), generator=g)
        for i in range(0, len(xt), 64):
            idx = perm[i:i + 64]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
    model.eval()
    return model, x_test, y_test


def train_cancer(epochs=200):
    """The breast-cancer MLP with standardization folded into its first layer."""
    torch.manual_seed(SEED)
    d = load_breast_cancer()
    x = d.data.astype(np.float32)
    y = d.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=SEED,
                                                        stratify=y)
    mean = x_train.mean(axis=0)
    std = x_train.std(axis=0) + 1e-6
    f1, f2 = torch.nn.Linear(30, 32), torch.nn.Linear(32, 2)
    opt = torch.optim.Adam(list(f1.parameters()) + list(f2.parameters()), lr=1e-2)
    xt = torch.from_numpy((x_train - mean) / std)
    yt = torch.from_numpy(y_train)
    for _ in range(epochs):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(f2(torch.relu(f1(xt))), yt)
        loss.backward()
        opt.step()
    with torch.no_grad():  # f1((x - mean) / std) == x @ (W / std).T + (b - W @ (mean / std))
        w = f1.weight / torch.from_numpy(std)[None, :]
        b = f1.bias - f1.weight @ torch.from_numpy(mean / std)
        f1.weight.copy_(w)
        f1.bias.copy_(b)
    model = torch.nn.Sequential(f1, torch.nn.ReLU(), f2).eval()
    return model, x_train[:200], x_test, y_test


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="compression_models")
    ap.add_argument("--epochs", type=int, default=15)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model, x_test, y_test = train(args.epochs)
    with torch.no_grad():
        acc = float((model(torch.from_numpy(x_test)).argmax(1).numpy() == y_test).mean())
    torch.onnx.export(model, torch.zeros(1, 1, 8, 8), os.path.join(args.out, "digits_cnn.onnx"),
                      input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
                      opset_version=13)
    np.save(os.path.join(args.out, "digits_test_x.npy"), x_test)
    np.save(os.path.join(args.out, "digits_test_y.npy"), y_test)
    x_train = data()[0]
    np.save(os.path.join(args.out, "digits_cal_x.npy"), x_train[:200])
    print(f"digits_cnn: held-out accuracy {acc:.4f} (PyTorch fp32)")

    model, x_cal, x_test, y_test = train_cancer()
    with torch.no_grad():
        acc = float((model(torch.from_numpy(x_test)).argmax(1).numpy() == y_test).mean())
    torch.onnx.export(model, torch.zeros(1, 30), os.path.join(args.out, "cancer_mlp.onnx"),
                      input_names=["features"], output_names=["logits"],
                      dynamic_axes={"features": {0: "batch"}, "logits": {0: "batch"}},
                      opset_version=13)
    np.save(os.path.join(args.out, "cancer_test_x.npy"), x_test)
    np.save(os.path.join(args.out, "cancer_test_y.npy"), y_test)
    np.save(os.path.join(args.out, "cancer_cal_x.npy"), x_cal)
    print(f"cancer_mlp: held-out accuracy {acc:.4f} (PyTorch fp32)")


if __name__ == "__main__":
    main()
