#!/usr/bin/python3
"""export_models.py - export real model architectures to ONNX with reference data.

Kiln's whole-model tests and benchmarks need real architectures, not toy
graphs, but no pretrained weights can be downloaded here. So each model is
built in PyTorch with random weights from a fixed seed, exported with
torch.onnx.export (dynamic batch axis), and run once in PyTorch on fixed
random inputs; a test then runs the same inputs through Kiln and compares.

Random weights need one fix to make that comparison mean something: a
BatchNorm layer's running statistics start at mean 0 / variance 1, which
do not match random-weight activations, and through a deep network the
activations then collapse to zero or blow up. So before export every
BatchNorm gets a random scale and shift (trained ones are not 1 and 0) and
re-estimates its statistics (cumulative average, momentum=None) over a few
batches of random inputs, with the rest of the model in eval mode;
afterwards each layer's outputs are roughly normalized, as in a trained
network.

Models (name: inputs -> outputs):
    resnet18, resnet50, mobilenet_v2, efficientnet_b0   (torchvision, weights=None)
        input float32 [batch,3,224,224] -> logits float32 [batch,1000]
    bert_small   BERT-style encoder: 4 layers, hidden 256, 4 heads, FFN 1024, vocab 1000
        input_ids int64 [batch,128], attention_mask int64 [batch,128]
        -> hidden float32 [batch,128,256]
    bert_base    the same at BERT-base size: 12 layers, hidden 768, 12 heads, FFN 3072,
                 vocab 30522 (about 440 MB of ONNX); only with --bert-base or --models
    tabular_mlp  features float32 [batch,64] -> 256 -> 256 (BatchNorm1d, ReLU) -> score [batch,1]
    dlrm         DLRM-style recommender: dense float32 [batch,13] through a bottom MLP,
                 cat_0..cat_3 int64 [batch,3] (multi-hot, 3 ids per table) through
                 embedding tables summed per bag, pairwise dot interaction, top MLP,
                 sigmoid -> probability [batch,1]

For each model, under --out DIR:
    DIR/<name>/model.onnx
    DIR/<name>/inputs/<input_name>.npy       batch 2, fixed seed
    DIR/<name>/expected/<output_name>.npy    PyTorch's float32 outputs for those inputs

Usage:
    /usr/bin/python3 tools/export_models.py --out DIR [--models resnet18,dlrm,...]
        [--bert-base] [--opset N]
Default models: every one except bert_base. Importable: export_model(name, out_dir),
and export_spec(name, (build, make_inputs, output_names), out_dir) for other tables.
"""

import argparse
import collections
import math
import os
import sys
import time

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_OPSET = 14       # torch 1.13 exports 7..17; 14 is its most exercised recent opset
REFERENCE_BATCH = 2
BN_BATCHES = 4           # forward passes used to re-estimate BatchNorm statistics
BN_BATCH_SIZE = 8
SEQ_LEN = 128


# ---------------------------------------------------------------- BERT-style encoder

class BertConfig:
    def __init__(self, layers, hidden, heads, intermediate, vocab, max_positions=512):
        self.layers = layers
        self.hidden = hidden
        self.heads = heads
        self.intermediate = intermediate
        self.vocab = vocab
        self.max_positions = max_positions
        self.ln_eps = 1e-12  # HuggingFace BERT's layer_norm_eps


class BertEmbeddings(nn.Module):
    """Word + position + token-type (type 0) embeddings, then LayerNorm, as in HF BERT."""

    def __init__(self, cfg):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab, cfg.hidden)
        self.position_embeddings = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.token_type_embeddings = nn.Embedding(2, cfg.hidden)
        self.LayerNorm = nn.LayerNorm(cfg.hidden, eps=cfg.ln_eps)
        self.register_buffer("position_ids", torch.arange(cfg.max_positions).unsqueeze(0))

    def forward(self, input_ids):
        seq = input_ids.size(1)
        position_ids = self.position_ids[:, :seq]
        token_type_ids = torch.zeros_like(input_ids)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
             + self.token_type_embeddings(token_type_ids))
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    """Multi-head scaled dot-product attention over the additive mask."""

    def __init__(self, cfg):
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.hidden // cfg.heads
        self.query = nn.Linear(cfg.hidden, cfg.hidden)
        self.key = nn.Linear(cfg.hidden, cfg.hidden)
        self.value = nn.Linear(cfg.hidden, cfg.hidden)

    def split_heads(self, x):
        b, s, _ = x.size()
        return x.view(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x, additive_mask):
        q = self.split_heads(self.query(x))
        k = self.split_heads(self.key(x))
        v = self.split_heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        probs = F.softmax(scores + additive_mask, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        b, s = ctx.size(0), ctx.size(1)
        return ctx.view(b, s, self.heads * self.head_dim)


class BertLayer(nn.Module):
    """Attention + residual LayerNorm, then GELU FFN + residual LayerNorm (post-LN)."""

    def __init__(self, cfg):
        super().__init__()
        self.attention = BertSelfAttention(cfg)
        self.attention_output = nn.Linear(cfg.hidden, cfg.hidden)
        self.attention_norm = nn.LayerNorm(cfg.hidden, eps=cfg.ln_eps)
        self.intermediate = nn.Linear(cfg.hidden, cfg.intermediate)
        self.output = nn.Linear(cfg.intermediate, cfg.hidden)
        self.output_norm = nn.LayerNorm(cfg.hidden, eps=cfg.ln_eps)

    def forward(self, x, additive_mask):
        a = self.attention_output(self.attention(x, additive_mask))
        x = self.attention_norm(a + x)
        h = F.gelu(self.intermediate(x))  # exact (erf) GELU, as BERT uses
        return self.output_norm(self.output(h) + x)


class BertEncoder(nn.Module):
    """Embeddings + N encoder layers; returns the last hidden state."""

    def __init__(self, cfg):
        super().__init__()
        self.embeddings = BertEmbeddings(cfg)
        self.layers = nn.ModuleList([BertLayer(cfg) for _ in range(cfg.layers)])

    def forward(self, input_ids, attention_mask):
        # [batch, seq] of 1 (attend) / 0 (padding) -> additive [batch, 1, 1, seq]
        mask = attention_mask[:, None, None, :].to(torch.float32)
        additive_mask = (1.0 - mask) * torch.finfo(torch.float32).min
        x = self.embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, additive_mask)
        return x


def init_bert_weights(model):
    """Weights that make attention non-uniform: Linear std 1/sqrt(fan_in) so
    query.key scores have unit scale; nonzero biases and LayerNorm affine."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 1.0 / math.sqrt(m.in_features))
            nn.init.normal_(m.bias, 0.0, 0.1)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 1.0)
        elif isinstance(m, nn.LayerNorm):
            nn.init.normal_(m.weight, 1.0, 0.1)
            nn.init.normal_(m.bias, 0.0, 0.1)


def bert_inputs(cfg, batch, gen):
    """Random token ids; row 0 unpadded, later rows padded from position 100 on."""
    ids = torch.randint(0, cfg.vocab, (batch, SEQ_LEN), generator=gen, dtype=torch.int64)
    mask = torch.ones(batch, SEQ_LEN, dtype=torch.int64)
    for row in range(1, batch):
        valid = max(1, 100 - 16 * (row - 1))
        mask[row, valid:] = 0
        ids[row, valid:] = 0  # [PAD]
    return {"input_ids": ids, "attention_mask": mask}


# ---------------------------------------------------------------- tabular MLP and DLRM

class TabularMLP(nn.Module):
    """64 features -> Linear/BatchNorm1d/ReLU x2 (256 wide) -> one score."""

    def __init__(self, features=64, width=256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, width), nn.BatchNorm1d(width), nn.ReLU(),
            nn.Linear(width, width), nn.BatchNorm1d(width), nn.ReLU(),
            nn.Linear(width, 1))

    def forward(self, features):
        return self.net(features)


DLRM_DENSE = 13
DLRM_TABLES = (1000, 500, 200, 100)  # rows per embedding table
DLRM_DIM = 16
DLRM_BAG = 3                          # ids per table per example (multi-hot)


class DLRM(nn.Module):
    """DLRM-style model: bottom MLP on dense features, one embedding bag (sum)
    per sparse feature, pairwise dot products of all feature vectors, top MLP
    on [bottom output, dot products], sigmoid."""

    def __init__(self):
        super().__init__()
        self.bottom = nn.Sequential(
            nn.Linear(DLRM_DENSE, 64), nn.ReLU(), nn.Linear(64, DLRM_DIM), nn.ReLU())
        self.tables = nn.ModuleList([nn.Embedding(n, DLRM_DIM) for n in DLRM_TABLES])
        n_vec = 1 + len(DLRM_TABLES)
        li, lj = torch.tril_indices(n_vec, n_vec, offset=-1)
        # flat positions of the strictly-lower triangle of the [n_vec, n_vec] dot matrix
        self.register_buffer("pair_index", li * n_vec + lj)
        n_pairs = n_vec * (n_vec - 1) // 2
        self.top = nn.Sequential(
            nn.Linear(DLRM_DIM + n_pairs, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
            nn.Linear(32, 1))

    def forward(self, dense, cat_0, cat_1, cat_2, cat_3):
        d = self.bottom(dense)
        bags = [t(ids).sum(dim=1) for t, ids in zip(self.tables, (cat_0, cat_1, cat_2, cat_3))]
        vecs = torch.stack([d] + bags, dim=1)            # [batch, n_vec, dim]
        dots = torch.bmm(vecs, vecs.transpose(1, 2))      # [batch, n_vec, n_vec]
        pairs = dots.flatten(1).index_select(1, self.pair_index)
        return torch.sigmoid(self.top(torch.cat([d, pairs], dim=1)))


def dlrm_inputs(batch, gen):
    x = {"dense": torch.rand(batch, DLRM_DENSE, generator=gen) * 4.0}
    for i, rows in enumerate(DLRM_TABLES):
        x[f"cat_{i}"] = torch.randint(0, rows, (batch, DLRM_BAG), generator=gen,
                                      dtype=torch.int64)
    return x


# ---------------------------------------------------------------- the model table

def reestimate_batchnorm(model, make_batch, gen):
    """Give every BatchNorm a random affine transform, then recompute its running
    mean/variance as a cumulative average over BN_BATCHES random batches, with
    the other layers in eval mode (no dropout or stochastic depth)."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    model.eval()
    for bn in bns:
        if bn.affine:  # a trained network's scales and shifts are not 1 and 0
            with torch.no_grad():
                bn.weight.normal_(1.0, 0.2, generator=gen)
                bn.bias.normal_(0.0, 0.2, generator=gen)
        bn.reset_running_stats()
        bn.momentum = None
        bn.train()
    with torch.no_grad():
        for _ in range(BN_BATCHES):
            model(*make_batch(BN_BATCH_SIZE, gen).values())
    model.eval()


def vision_spec(arch):
    def build():
        import torchvision  # imported here so non-vision models need no torchvision
        model = getattr(torchvision.models, arch)(weights=None)
        return model

    def inputs(batch, gen):
        return {"input": torch.randn(batch, 3, 224, 224, generator=gen)}

    return build, inputs, ["logits"]


def bert_spec(cfg):
    def build():
        model = BertEncoder(cfg)
        init_bert_weights(model)
        return model

    return build, lambda batch, gen: bert_inputs(cfg, batch, gen), ["hidden"]


def tabular_spec():
    def inputs(batch, gen):
        return {"features": torch.randn(batch, 64, generator=gen)}

    return TabularMLP, inputs, ["score"]


def dlrm_spec():
    return DLRM, dlrm_inputs, ["probability"]


# name -> () -> (build() -> nn.Module, inputs(batch, gen) -> {name: tensor}, output names)
MODELS = collections.OrderedDict([
    ("resnet18", lambda: vision_spec("resnet18")),
    ("resnet50", lambda: vision_spec("resnet50")),
    ("mobilenet_v2", lambda: vision_spec("mobilenet_v2")),
    ("efficientnet_b0", lambda: vision_spec("efficientnet_b0")),
    ("bert_small", lambda: bert_spec(BertConfig(4, 256, 4, 1024, 1000))),
    ("bert_base", lambda: bert_spec(BertConfig(12, 768, 12, 3072, 30522))),
    ("tabular_mlp", tabular_spec),
    ("dlrm", dlrm_spec),
])
DEFAULT_MODELS = [n for n in MODELS if n != "bert_base"]


def seed_for(name):
    """A fixed per-model seed (stable across runs, unlike hash())."""
    return sum((i + 1) * ord(c) for i, c in enumerate(name)) % (2 ** 31)


def fix_output_dims(onnx_path, shapes):
    """The exporter names some static output dims symbolically (BERT's
    sequence axis comes out as "Addhidden_dim_1"); write every output dim
    except the batch axis as the number PyTorch produced."""
    m = onnx.load(onnx_path)
    changed = False
    for out in m.graph.output:
        dims = out.type.tensor_type.shape.dim
        for axis, d in enumerate(dims):
            if axis > 0 and not d.HasField("dim_value"):
                d.dim_value = shapes[out.name][axis]  # clears dim_param
                changed = True
    if changed:
        onnx.save(m, onnx_path)


def op_histogram(onnx_path):
    """{op_type: count} of an ONNX file's main graph, sorted by op name."""
    m = onnx.load(onnx_path)
    return dict(sorted(collections.Counter(n.op_type for n in m.graph.node).items()))


def export_model(name, out_dir, opset=DEFAULT_OPSET):
    """Build, export and write reference data for one model under out_dir/name.
    Returns a dict: path, inputs, outputs (names), ops (histogram), seconds."""
    if name not in MODELS:
        raise KeyError(f"unknown model '{name}' (known: {', '.join(MODELS)})")
    return export_spec(name, MODELS[name](), out_dir, opset)


def export_spec(name, spec, out_dir, opset=DEFAULT_OPSET):
    """export_model for a spec (build, make_inputs, output_names) from any table
    (tools/export_zoo.py has its own): the seeds come from name."""
    t0 = time.monotonic()
    build, make_inputs, output_names = spec
    torch.manual_seed(seed_for(name))
    gen = torch.Generator().manual_seed(seed_for(name) + 1)
    model = build()
    reestimate_batchnorm(model, make_inputs, gen)
    model.eval()

    ref_gen = torch.Generator().manual_seed(seed_for(name) + 2)
    inputs = make_inputs(REFERENCE_BATCH, ref_gen)
    input_names = list(inputs)
    with torch.no_grad():
        outputs = model(*inputs.values())
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    if len(outputs) != len(output_names):
        raise RuntimeError(f"{name}: model returned {len(outputs)} outputs, "
                           f"expected {len(output_names)}")

    model_dir = os.path.join(out_dir, name)
    os.makedirs(os.path.join(model_dir, "inputs"), exist_ok=True)
    os.makedirs(os.path.join(model_dir, "expected"), exist_ok=True)
    onnx_path = os.path.join(model_dir, "model.onnx")
    dynamic_axes = {n: {0: "batch"} for n in input_names + output_names}
    with torch.no_grad():
        torch.onnx.export(model, tuple(inputs.values()), onnx_path,
                          input_names=input_names, output_names=output_names,
                          dynamic_axes=dynamic_axes, opset_version=opset,
                          do_constant_folding=True,
                          training=torch.onnx.TrainingMode.EVAL)
    fix_output_dims(onnx_path, {n: tuple(t.shape) for n, t in zip(output_names, outputs)})
    # check_model by path handles models over protobuf's 2 GiB message limit too
    onnx.checker.check_model(onnx_path)

    for n, t in inputs.items():
        np.save(os.path.join(model_dir, "inputs", n + ".npy"), t.numpy())
    for n, t in zip(output_names, outputs):
        np.save(os.path.join(model_dir, "expected", n + ".npy"),
                t.detach().numpy().astype(np.float32))
    return {"path": onnx_path, "inputs": input_names, "outputs": output_names,
            "ops": op_histogram(onnx_path), "seconds": time.monotonic() - t0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help=f"comma-separated (default: {','.join(DEFAULT_MODELS)}; "
                         f"all: {','.join(MODELS)})")
    ap.add_argument("--bert-base", action="store_true",
                    help="also export bert_base (BERT-base size, about 440 MB)")
    ap.add_argument("--opset", type=int, default=DEFAULT_OPSET,
                    help=f"ONNX opset (default {DEFAULT_OPSET}; torch 1.13 supports up to 17)")
    args = ap.parse_args()

    names = [n for n in args.models.split(",") if n]
    if args.bert_base and "bert_base" not in names:
        names.append("bert_base")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        sys.exit(f"export_models: unknown model(s) {', '.join(unknown)}; "
                 f"known: {', '.join(MODELS)}")

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    for name in names:
        info = export_model(name, args.out, args.opset)
        size = os.path.getsize(info["path"])
        ops = ", ".join(f"{k}:{v}" for k, v in info["ops"].items())
        print(f"{name}: {info['seconds']:.1f}s, {size / 1e6:.1f} MB, "
              f"inputs {info['inputs']} -> outputs {info['outputs']}\n  ops: {ops}",
              flush=True)


if __name__ == "__main__":
    main()
