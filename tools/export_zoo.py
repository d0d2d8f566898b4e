#!/usr/bin/python3
"""export_zoo.py - export Kiln's model zoo: 30 architectures a user might bring.

tools/export_models.py exports the eight benchmark models; this script exports
a wider zoo the same way (its export_spec: random weights from a per-model
fixed seed, BatchNorm given random affine parameters and re-estimated
statistics, torch.onnx.export with a dynamic batch axis, PyTorch's own outputs
at batch 2 as the reference), so that tests/python/test_zoo.py can check Kiln
on every one and bench/zoo/run.sh can time it against ONNX Runtime and
PyTorch. The zoo covers torchvision's families (dense, grouped, depthwise,
channel shuffle, squeeze-excitation, inverted residual, large-kernel with
LayerNorm, fire modules, inception branches, windowed attention, a vision
transformer, two segmentation heads) and small custom models for what
torchvision lacks: a UNet with transposed convolutions, a dilated 1-D temporal
convolutional network, LSTM and GRU classifiers, a GRU/LSTM
sequence-to-sequence model, torch.nn.TransformerEncoder (packed Q/K/V
projections), a GPT-2-style decoder with a causal mask, a raw-audio 1-D CNN,
a style-transfer network (InstanceNorm, a 9x9 convolution to 3 colours), a
GroupNorm UNet, a sub-pixel super-resolution network and an MLP-Mixer. Input sizes are
kept small (64x64 to 96x96 images, 32-64 steps) so the whole zoo exports in a
few minutes and runs in seconds.

Layout, per model (as export_models.py):
    DIR/<name>/model.onnx, DIR/<name>/inputs/<input>.npy, DIR/<name>/expected/<output>.npy
    DIR/<name>/STAMP      the hash of this script and export_models.py at export

DIR defaults to $KILN_ZOO_DIR, else ~/.cache/kiln/zoo (outside the repository:
the zoo is about 1 GB). A model whose STAMP matches the current scripts is
not exported again.

Usage:
    /usr/bin/python3 tools/export_zoo.py [--out DIR] [--models a,b,...] [--force] [--list]
Importable: ZOO (name -> spec factory), zoo_dir(), ensure(names, out_dir).
"""

import argparse
import collections
import hashlib
import importlib.util
import math
import os
import shutil
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("kiln_export_models",
                                               os.path.join(HERE, "export_models.py"))
em = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(em)


def zoo_dir():
    return os.environ.get("KILN_ZOO_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "kiln", "zoo")


def script_hash():
    h = hashlib.sha256()
    for f in ("export_zoo.py", "export_models.py"):
        with open(os.path.join(HERE, f), "rb") as fh:
            h.update(fh.read())
    h.update(torch.__version__.encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------- torchvision

def image_inputs(size, channels=3):
    def inputs(batch, gen):
        return {"input": torch.randn(batch, channels, size, size, generator=gen)}
    return inputs


def tv_spec(arch, size, **kwargs):
    def build():
        import torchvision
        return getattr(torchvision.models, arch)(weights=None, **kwargs)
    return build, image_inputs(size), ["logits"]


class PooledHead(nn.Module):
    """A torchvision network's convolutional features, global average pooling
    and one Linear: VGG's and AlexNet's 4096-wide heads hold 500 MB / 230 MB of
    weights, which would dominate both the zoo's size and its timings."""

    def __init__(self, features, channels, classes=1000):
        super().__init__()
        self.features = features
        self.fc = nn.Linear(channels, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def tv_features_spec(arch, channels, size):
    def build():
        import torchvision
        return PooledHead(getattr(torchvision.models, arch)(weights=None).features, channels)
    return build, image_inputs(size), ["logits"]


class SegOut(nn.Module):
    """torchvision's segmentation models return {"out": ...}; export the tensor."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


def seg_spec(arch, size):
    def build():
        import torchvision
        return SegOut(getattr(torchvision.models.segmentation, arch)(
            weights=None, weights_backbone=None, num_classes=21))
    return build, image_inputs(size), ["out"]


class SeqFirstMHA(nn.MultiheadAttention):
    """nn.MultiheadAttention over [batch, seq, dim] computed as batch_first=False
    (transposes around it). With batch_first=True and no gradients, PyTorch
    takes its fused inference path (aten::_native_multi_head_attention), which
    torch.onnx cannot export; the result is the same."""

    def forward(self, query, key, value, **kwargs):
        out, weights = super().forward(query.transpose(0, 1), key.transpose(0, 1),
                                       value.transpose(0, 1), **kwargs)
        return out.transpose(0, 1), weights


def vit_spec():
    def build():
        from torchvision.models.vision_transformer import VisionTransformer
        model = VisionTransformer(image_size=64, patch_size=8, num_layers=4, num_heads=4,
                                  hidden_dim=192, mlp_dim=768, num_classes=100)
        for blk in model.encoder.layers:
            mha = SeqFirstMHA(192, 4, dropout=0.0)
            mha.load_state_dict(blk.self_attention.state_dict())
            blk.self_attention = mha
        return model
    return build, image_inputs(64), ["logits"]


# ---------------------------------------------------------------- custom models

class UNet(nn.Module):
    """A three-level UNet: conv-BN-ReLU pairs, max-pool down, ConvTranspose
    (stride 2) up, skip connections concatenated, per-pixel class scores."""

    def __init__(self, c_in=3, classes=4, w=16):
        super().__init__()

        def block(a, b):
            return nn.Sequential(nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU(),
                                 nn.Conv2d(b, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU())
        self.d1, self.d2, self.d3 = block(c_in, w), block(w, 2 * w), block(2 * w, 4 * w)
        self.mid = block(4 * w, 8 * w)
        self.u3 = nn.ConvTranspose2d(8 * w, 4 * w, 2, stride=2)
        self.b3 = block(8 * w, 4 * w)
        self.u2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2)
        self.b2 = block(4 * w, 2 * w)
        self.u1 = nn.ConvTranspose2d(2 * w, w, 3, stride=2, padding=1, output_padding=1)
        self.b1 = block(2 * w, w)
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, x):
        s1 = self.d1(x)
        s2 = self.d2(F.max_pool2d(s1, 2))
        s3 = self.d3(F.max_pool2d(s2, 2))
        m = self.mid(F.max_pool2d(s3, 2))
        y = self.b3(torch.cat([self.u3(m), s3], 1))
        y = self.b2(torch.cat([self.u2(y), s2], 1))
        y = self.b1(torch.cat([self.u1(y), s1], 1))
        return self.head(y)


class TCN(nn.Module):
    """A temporal convolutional network: residual blocks of two causal dilated
    Conv1d (dilation 1, 2, 4, 8; left padding then a right trim), BatchNorm1d,
    ReLU; classifier on the last step."""

    def __init__(self, c_in=8, width=64, classes=10, k=3):
        super().__init__()
        self.k = k
        self.blocks = nn.ModuleList()
        c = c_in
        for d in (1, 2, 4, 8):
            self.blocks.append(nn.ModuleDict({
                "c1": nn.Conv1d(c, width, k, dilation=d, padding=(k - 1) * d),
                "n1": nn.BatchNorm1d(width),
                "c2": nn.Conv1d(width, width, k, dilation=d, padding=(k - 1) * d),
                "n2": nn.BatchNorm1d(width),
                "skip": nn.Conv1d(c, width, 1) if c != width else nn.Identity()}))
            c = width
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        t = x.shape[2]
        for b in self.blocks:
            y = F.relu(b["n1"](b["c1"](x)[:, :, :t]))
            y = F.relu(b["n2"](b["c2"](y)[:, :, :t]))
            x = F.relu(y + b["skip"](x))
        return self.fc(x[:, :, -1])


class RNNClassifier(nn.Module):
    """Two-layer (LSTM) or bidirectional (GRU) recurrent encoder over a
    [batch, time, features] sequence; a Linear on the final step's output."""

    def __init__(self, cell, features=16, hidden=64, classes=10):
        super().__init__()
        if cell == "lstm":
            self.rnn = nn.LSTM(features, hidden, num_layers=2, batch_first=True)
            out = hidden
        else:
            self.rnn = nn.GRU(features, hidden, num_layers=1, batch_first=True,
                              bidirectional=True)
            out = 2 * hidden
        self.fc = nn.Linear(out, classes)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.fc(y[:, -1])


class Seq2Seq(nn.Module):
    """GRU encoder over source tokens; its final state starts an LSTM decoder
    fed the (teacher-forced) target tokens; vocabulary scores per step."""

    def __init__(self, vocab=500, emb=64, hidden=128):
        super().__init__()
        self.src_emb = nn.Embedding(vocab, emb)
        self.tgt_emb = nn.Embedding(vocab, emb)
        self.enc = nn.GRU(emb, hidden, batch_first=True)
        self.dec = nn.LSTM(emb, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, src, tgt):
        _, h = self.enc(self.src_emb(src))
        y, _ = self.dec(self.tgt_emb(tgt), (h, torch.zeros_like(h)))
        return self.out(y)


def seq_inputs(steps, features):
    def inputs(batch, gen):
        return {"input": torch.randn(batch, steps, features, generator=gen)}
    return inputs


def seq2seq_inputs(batch, gen):
    return {"src": torch.randint(0, 500, (batch, 24), generator=gen),
            "tgt": torch.randint(0, 500, (batch, 16), generator=gen)}


def gelu(x):
    """GELU as a plain function: nn.TransformerEncoderLayer given F.gelu itself
    takes its fused inference path (aten::_transformer_encoder_layer_fwd),
    which torch.onnx cannot export."""
    return F.gelu(x)


class TransformerClassifier(nn.Module):
    """torch.nn.TransformerEncoder (nn.MultiheadAttention: one packed Q/K/V
    projection), post-LN, GELU, then mean pooling and a Linear."""

    def __init__(self, d=128, heads=4, layers=3, classes=10):
        super().__init__()
        # batch_first=False: see SeqFirstMHA
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation=gelu)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.fc = nn.Linear(d, classes)

    def forward(self, x):
        return self.fc(self.enc(x.transpose(0, 1)).mean(dim=0))


class GPT2Block(nn.Module):
    """Pre-LN GPT-2 block: one packed c_attn projection split into Q, K, V,
    causal mask from a lower-triangular buffer, tanh-approximated GELU MLP."""

    def __init__(self, d, heads, ctx):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)
        self.register_buffer("bias", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool))
                             .view(1, 1, ctx, ctx))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        hd = d // self.heads
        q, k, v = (z.view(b, t, self.heads, hd).transpose(1, 2) for z in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
        w = w.masked_fill(~self.bias[:, :, :t, :t], torch.finfo(w.dtype).min)
        a = torch.matmul(F.softmax(w, dim=-1), v).transpose(1, 2).reshape(b, t, d)
        x = x + self.c_proj(a)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """Token + position embeddings, 4 GPT-2 blocks, final LayerNorm, tied LM head."""

    def __init__(self, vocab=1000, d=128, heads=4, layers=4, ctx=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([GPT2Block(d, heads, ctx) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)

    def forward(self, input_ids):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.wte(input_ids) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return torch.matmul(self.ln_f(x), self.wte.weight.t())


class AudioCNN(nn.Module):
    """A raw-waveform keyword classifier (M5-style): a strided 80-tap Conv1d,
    then Conv1d-BatchNorm1d-ReLU-MaxPool1d stages, a global average and a
    Linear head: 1-D convolutions and 1-D pooling over plain [N, C, L]."""

    def __init__(self, classes=35):
        super().__init__()
        layers, c = [], 1
        for w, k, s in [(32, 80, 4), (32, 3, 1), (64, 3, 1), (128, 3, 1)]:
            layers += [nn.Conv1d(c, w, k, stride=s), nn.BatchNorm1d(w), nn.ReLU(),
                       nn.MaxPool1d(4 if k == 80 else 2)]
            c = w
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool1d(self.features(x), 1).flatten(1))


class StyleTransfer(nn.Module):
    """Johnson et al.'s fast style transfer, narrowed: 9x9 and strided 3x3
    convolutions with InstanceNorm and ReLU, three residual blocks, nearest
    upsampling, a 9x9 convolution back to 3 colours (few output channels)."""

    def __init__(self):
        super().__init__()

        def cb(a, b, k, s):
            return nn.Sequential(nn.Conv2d(a, b, k, s, k // 2), nn.InstanceNorm2d(b, affine=True),
                                 nn.ReLU())
        self.enc = nn.Sequential(cb(3, 32, 9, 1), cb(32, 64, 3, 2), cb(64, 128, 3, 2))
        self.res = nn.ModuleList([nn.Sequential(cb(128, 128, 3, 1), nn.Conv2d(128, 128, 3, 1, 1),
                                                nn.InstanceNorm2d(128, affine=True))
                                  for _ in range(3)])
        self.dec = nn.Sequential(nn.Upsample(scale_factor=2), cb(128, 64, 3, 1),
                                 nn.Upsample(scale_factor=2), cb(64, 32, 3, 1),
                                 nn.Conv2d(32, 3, 9, 1, 4))

    def forward(self, x):
        x = self.enc(x)
        for r in self.res:
            x = x + r(x)
        return self.dec(x)


class GroupNormUNet(nn.Module):
    """A diffusion-style UNet: residual blocks of GroupNorm(32)-SiLU-Conv3x3
    (GroupNorm exports as Reshape, InstanceNormalization, Reshape, Mul, Add), a
    strided down-sampling convolution, nearest up-sampling, skip Concats."""

    def __init__(self, c=64):
        super().__init__()
        self.inp = nn.Conv2d(3, c, 3, padding=1)

        def rb(a, b):
            return nn.ModuleDict(dict(
                n1=nn.GroupNorm(32, a), c1=nn.Conv2d(a, b, 3, padding=1),
                n2=nn.GroupNorm(32, b), c2=nn.Conv2d(b, b, 3, padding=1),
                sk=nn.Conv2d(a, b, 1) if a != b else nn.Identity()))
        self.d1, self.d2, self.mid = rb(c, c), rb(c, 2 * c), rb(2 * c, 2 * c)
        self.u2, self.u1 = rb(4 * c, c), rb(2 * c, c)
        self.down = nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.out = nn.Conv2d(c, 3, 3, padding=1)

    @staticmethod
    def block(m, x):
        h = m["c1"](F.silu(m["n1"](x)))
        h = m["c2"](F.silu(m["n2"](h)))
        return h + m["sk"](x)

    def forward(self, x):
        x = self.inp(x)
        a = self.block(self.d1, x)
        b = self.block(self.mid, self.block(self.d2, self.down(a)))
        u = self.block(self.u2, torch.cat([b, b], 1))
        u = F.interpolate(u, scale_factor=2, mode="nearest")
        return self.out(self.block(self.u1, torch.cat([u, a], 1)))


class ESPCN(nn.Module):
    """Sub-pixel super-resolution (x3): a 5x5 convolution of one channel, tanh,
    a 3x3 convolution to r^2 channels and PixelShuffle (DepthToSpace)."""

    def __init__(self, r=3):
        super().__init__()
        self.c1 = nn.Conv2d(1, 64, 5, padding=2)
        self.c2 = nn.Conv2d(64, 32, 3, padding=1)
        self.c3 = nn.Conv2d(32, r * r, 3, padding=1)
        self.ps = nn.PixelShuffle(r)

    def forward(self, x):
        return self.ps(self.c3(torch.tanh(self.c2(torch.tanh(self.c1(x))))))


class MLPMixer(nn.Module):
    """MLP-Mixer: 8x8 patches by a strided convolution, token-mixing and
    channel-mixing MLPs with GELU between LayerNorms (one over a transposed
    view), mean over tokens, a Linear head."""

    def __init__(self, d=128, patches=64, layers=4, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, d, 8, stride=8)
        self.blocks = nn.ModuleList([nn.ModuleDict(dict(
            n1=nn.LayerNorm(d), t1=nn.Linear(patches, 256), t2=nn.Linear(256, patches),
            n2=nn.LayerNorm(d), c1=nn.Linear(d, 512), c2=nn.Linear(512, d)))
            for _ in range(layers)])
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        for b in self.blocks:
            y = b["n1"](x).transpose(1, 2)
            x = x + b["t2"](F.gelu(b["t1"](y))).transpose(1, 2)
            x = x + b["c2"](F.gelu(b["c1"](b["n2"](x))))
        return self.head(x.mean(1))


def init_transformer(model):
    """Attention that is not uniform (export_models.init_bert_weights's scheme)."""
    em.init_bert_weights(model)
    return model


def custom_spec(cls, inputs, outputs, init=None):
    def build():
        m = cls()
        return init(m) if init else m
    return build, inputs, outputs


# name -> () -> (build, inputs(batch, gen), output names), as export_models.MODELS
ZOO = collections.OrderedDict([
    # torchvision classification, one or two per family
    ("densenet121", lambda: tv_spec("densenet121", 64)),              # dense concat chains
    ("resnext50_32x4d", lambda: tv_spec("resnext50_32x4d", 64)),      # grouped convolutions
    ("wide_resnet50_2", lambda: tv_spec("wide_resnet50_2", 64)),
    ("mobilenet_v3_small", lambda: tv_spec("mobilenet_v3_small", 96)),  # SE, hardswish
    ("shufflenet_v2_x1_0", lambda: tv_spec("shufflenet_v2_x1_0", 96)),  # channel shuffle
    ("squeezenet1_1", lambda: tv_spec("squeezenet1_1", 96)),          # fire modules
    ("googlenet", lambda: tv_spec("googlenet", 96, aux_logits=False, init_weights=True)),
    # init_weights=False (PyTorch's default init) at 128x128: torchvision's truncated normal
    # (std 0.1) at 96x96 makes the logits so ill-conditioned that ONNX Runtime and Kiln's
    # reference executor alike differ from PyTorch by 1.2e-4 of their scale; here they
    # differ by 0.8e-4 (ORT) to 0.97e-4 (Kiln): still the tightest model of the zoo
    ("inception_v3", lambda: tv_spec("inception_v3", 128, aux_logits=False, init_weights=False)),
    ("mnasnet0_5", lambda: tv_spec("mnasnet0_5", 96)),
    ("regnet_y_400mf", lambda: tv_spec("regnet_y_400mf", 96)),        # grouped + SE
    ("efficientnet_v2_s", lambda: tv_spec("efficientnet_v2_s", 96)),  # fused MBConv
    ("convnext_tiny", lambda: tv_spec("convnext_tiny", 64)),          # 7x7 depthwise, LayerNorm
    ("vgg11_bn", lambda: tv_features_spec("vgg11_bn", 512, 64)),
    ("alexnet", lambda: tv_features_spec("alexnet", 256, 96)),
    ("swin_t", lambda: tv_spec("swin_t", 64)),                        # windowed attention
    ("vit_small", vit_spec),                                          # vision transformer
    # torchvision segmentation
    ("lraspp_mobilenet_v3", lambda: seg_spec("lraspp_mobilenet_v3_large", 96)),
    ("deeplabv3_mobilenet_v3", lambda: seg_spec("deeplabv3_mobilenet_v3_large", 96)),
    # custom
    ("unet", lambda: custom_spec(UNet, image_inputs(64), ["out"])),
    ("tcn", lambda: custom_spec(TCN, lambda b, g: {"input": torch.randn(b, 8, 128, generator=g)},
                                ["logits"])),
    ("lstm_classifier", lambda: custom_spec(lambda: RNNClassifier("lstm"), seq_inputs(32, 16),
                                            ["logits"])),
    ("gru_classifier", lambda: custom_spec(lambda: RNNClassifier("gru"), seq_inputs(32, 16),
                                           ["logits"])),
    ("seq2seq", lambda: custom_spec(Seq2Seq, seq2seq_inputs, ["scores"])),
    ("transformer_encoder", lambda: custom_spec(
        TransformerClassifier, seq_inputs(32, 128), ["logits"], init_transformer)),
    ("gpt2_decoder", lambda: custom_spec(
        GPT2, lambda b, g: {"input_ids": torch.randint(0, 1000, (b, 48), generator=g)},
        ["logits"], init_transformer)),
    # found by trying architectures Kiln was not tuned for (bench/RESULTS.md)
    ("audio_cnn", lambda: custom_spec(
        AudioCNN, lambda b, g: {"input": torch.randn(b, 1, 8000, generator=g)}, ["logits"])),
    ("style_transfer", lambda: custom_spec(StyleTransfer, image_inputs(96), ["out"])),
    ("groupnorm_unet", lambda: custom_spec(GroupNormUNet, image_inputs(64), ["out"])),
    ("espcn", lambda: custom_spec(
        ESPCN, lambda b, g: {"input": torch.randn(b, 1, 96, 96, generator=g)}, ["out"])),
    ("mlp_mixer", lambda: custom_spec(MLPMixer, image_inputs(64), ["logits"])),
])


def ensure(names, out_dir, force=False, log=print):
    """Export every model of names missing from out_dir (or stamped by other
    scripts). Returns {name: seconds spent exporting (0.0 if cached)}."""
    stamp = script_hash()
    spent = {}
    for name in names:
        d = os.path.join(out_dir, name)
        stamp_path = os.path.join(d, "STAMP")
        if not force and os.path.isfile(stamp_path):
            with open(stamp_path) as f:
                if f.read().strip() == stamp:
                    spent[name] = 0.0
                    continue
        if os.path.isdir(d):
            shutil.rmtree(d)
        info = em.export_spec(name, ZOO[name](), out_dir)
        with open(stamp_path, "w") as f:
            f.write(stamp + "\n")
        spent[name] = info["seconds"]
        log(f"export_zoo: {name}: {info['seconds']:.1f}s, "
            f"{os.path.getsize(info['path']) / 1e6:.1f} MB, ops "
            + ", ".join(f"{k}:{v}" for k, v in info["ops"].items()))
    return spent


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=zoo_dir(), help="output folder (default %(default)s)")
    ap.add_argument("--models", default=",".join(ZOO), help="comma-separated (default: all)")
    ap.add_argument("--force", action="store_true", help="export even when cached")
    ap.add_argument("--list", action="store_true", help="print the model names and exit")
    args = ap.parse_args()
    if args.list:
        print("\n".join(ZOO))
        return
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        sys.exit(f"export_zoo: unknown model(s) {', '.join(unknown)}; known: {', '.join(ZOO)}")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    t0 = time.monotonic()
    ensure(names, args.out, args.force, log=lambda s: print(s, flush=True))
    print(f"export_zoo: {len(names)} models in {args.out} ({time.monotonic() - t0:.0f}s)")


if __name__ == "__main__":
    main()
