#!/usr/bin/python3
"""make_transformer_model.py - a small transformer trained on a synthetic sequence task, for
the compression accuracy tests (tests/python/test_compile_transformer.py).

The task, "majority token": a sequence of 16 tokens drawn from 5 symbols, one of which
occurs strictly more often than any other; the class is that symbol. Sequences are drawn
with a fixed seed (numpy), ties rejected.

The model is a 2-layer post-norm transformer encoder written out in plain torch ops, so that
torch.onnx.export (opset 13) writes the standard ONNX pattern Kiln's optimizer recognizes
(Gather embeddings, MatMul/Add projections, Softmax attention, LayerNorm as
ReduceMean/Sub/Pow/Sqrt/Div, Gelu as Erf) rather than an opaque fused op:

    tokens int64 [batch,16] -> embedding (5 -> 32) + learned positions
        -> 2 x [multi-head self-attention (2 heads) -> add & LayerNorm
                -> Linear 32->64 -> GELU -> Linear 64->32 -> add & LayerNorm]
        -> mean over positions -> Linear 32->5 -> logits [batch,5]

Trains with Adam for --steps (150) steps of 128 sequences (fixed seeds, one thread; seconds
on an idle core, a few minutes on a loaded machine, so the test caches the result) and
reaches >= 95% accuracy on held-out sequences. Writes under --out:

    transformer.onnx         the model
    transformer_test_x.npy   int64 [512,16] held-out sequences
    transformer_test_y.npy   int64 [512] their classes
    transformer_cal_x.npy    int64 [256,16] training sequences (calibration data)
    transformer_test_logits.npy  float32 [512,5] PyTorch's fp32 logits of the held-out sequences

Usage: /usr/bin/python3 tools/make_transformer_model.py [--out DIR] [--steps N]
"""

import argparse
import math
import os

import numpy as np
import torch

SEED = 0
VOCAB, SEQ, D, HEADS, FF, LAYERS = 5, 16, 32, 2, 64, 2


def sequences(rng, n):
    """n sequences with a unique most frequent token, and that token."""
    xs, ys = [], []
    while len(xs) < n:
        x = rng.integers(0, VOCAB, size=SEQ)
        c = np.bincount(x, minlength=VOCAB)
        if (c == c.max()).sum() == 1:
            xs.append(x)
            ys.append(int(c.argmax()))
    return np.array(xs, dtype=np.int64), np.array(ys, dtype=np.int64)


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(D, 3 * D)
        self.proj = torch.nn.Linear(D, D)
        self.ln1 = torch.nn.LayerNorm(D)
        self.ff1 = torch.nn.Linear(D, FF)
        self.ff2 = torch.nn.Linear(FF, D)
        self.ln2 = torch.nn.LayerNorm(D)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        hd = D // HEADS

        def heads(t):
            return t.reshape(b, s, HEADS, hd).transpose(1, 2)

        a = torch.softmax(heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(hd), dim=-1)
        h = (a @ heads(v)).transpose(1, 2).reshape(b, s, D)
        x = self.ln1(x + self.proj(h))
        return self.ln2(x + self.ff2(torch.nn.functional.gelu(self.ff1(x))))


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, D)
        self.pos = torch.nn.Parameter(torch.randn(1, SEQ, D) * 0.1)
        self.layers = torch.nn.ModuleList([Layer() for _ in range(LAYERS)])
        self.head = torch.nn.Linear(D, VOCAB)

    def forward(self, tokens):
        x = self.emb(tokens) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


def train(steps):
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    rng = np.random.default_rng(SEED)
    x_train, y_train = sequences(rng, 8192)
    x_test, y_test = sequences(rng, 512)
    model = Classifier()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    for step in range(steps):
        i = torch.from_numpy(rng.integers(0, len(x_train), size=128))
        loss = torch.nn.functional.cross_entropy(model(xt[i]), yt[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model, x_train[:256], x_test, y_test


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="transformer_model")
    ap.add_argument("--steps", type=int, default=150)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model, x_cal, x_test, y_test = train(args.steps)
    with torch.no_grad():
        logits = model(torch.from_numpy(x_test)).numpy()
    acc = float((logits.argmax(1) == y_test).mean())
    np.save(os.path.join(args.out, "transformer_test_logits.npy"), logits.astype(np.float32))
    torch.onnx.export(model, torch.zeros(1, SEQ, dtype=torch.int64),
                      os.path.join(args.out, "transformer.onnx"), input_names=["tokens"],
                      output_names=["logits"],
                      dynamic_axes={"tokens": {0: "batch"}, "logits": {0: "batch"}},
                      opset_version=13)
    np.save(os.path.join(args.out, "transformer_test_x.npy"), x_test)
    np.save(os.path.join(args.out, "transformer_test_y.npy"), y_test)
    np.save(os.path.join(args.out, "transformer_cal_x.npy"), x_cal)
    print(f"transformer: held-out accuracy {acc:.4f} (PyTorch fp32)")


if __name__ == "__main__":
    main()
