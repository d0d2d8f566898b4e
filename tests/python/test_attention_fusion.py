"""test_attention_fusion.py - attention from several exporters' spellings becomes one
KilnAttention (src/opt/attention_views.c) and matches PyTorch.

Small models with random weights from fixed seeds are exported with torch.onnx.export into a
temporary folder together with PyTorch's output:

- torch.nn.MultiheadAttention, sequence-first and batch_first, with a boolean key_padding_mask
  and a float [S, S] attn_mask (one packed in_proj split by Slice, heads folded into the batch,
  the mask merged with the padding at run time);
- a block whose causal mask torch.tril makes in forward (exported as Trilu; causal_trilu),
- a GPT-2 block: packed c_attn split by Split, 4-D views, scale after the product, the causal
  mask as masked_fill (Where) from a lower-triangular buffer; dynamic batch;
- nn.TransformerEncoderLayer (sequence-first, a [S, S] float src_mask);
- a BERT-style encoder with separate Q, K and V projections, an additive [B, 1, 1, S] mask made
  from an attention_mask input, and the scale applied to Q before the product; dynamic batch;
- a variant with the scale on K (Div), a [B, 1, S, S] mask and a 5-D packed projection split by
  Gather, and one that adds the mask before the scale (the scale would apply to the mask: not
  fused, and still right);
- grouped-query attention as Llama-style code writes it (two kv heads repeated for four query
  heads by Expand and Reshape) and multi-query attention (one kv head that MatMul broadcasts);
- torchvision's Swin window attention, plain and shifted (the shifted windows' mask is added to
  the scores viewed [B, windows, H, S, T], so its batch index is the window: mask_period), with
  a dynamic batch, so shape inference gives up on the window reshapes' shape vectors.

Each must fuse as many attentions as it has (the optimization log of `kiln inspect --optimized`
counts KilnAttention), run them on the fused kernel (`kiln bench --profile`), and match PyTorch
within 1e-4 * max(1, max|torch|) on the default path, on the reference kernels (KILN_FAST=0:
KilnAttention's reference kernel) and on the unfused graph on the reference path
(`--reference`).

KILN_BIN names the kiln executable (default: build/kiln); the tests skip, saying so, when it or
PyTorch is missing.
"""

import math
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
REL_TOL = 1e-4
S = 12  # sequence length
B = 2   # batch


@pytest.fixture(scope="session")
def kiln_bin():
    path = os.path.abspath(os.environ.get("KILN_BIN", str(REPO / "build" / "kiln")))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"kiln executable not found at {path}: build it or set KILN_BIN")
    return path


def build(name):
    """(module, {input name: tensor}, dynamic batch?, attentions) for one model."""
    torch = pytest.importorskip("torch", reason="PyTorch is needed to export the models")
    nn = torch.nn
    torch.manual_seed(sum(map(ord, name)))
    d, h = 64, 4

    class MHA(nn.Module):
        def __init__(self, batch_first):
            super().__init__()
            self.bf = batch_first
            self.mha = nn.MultiheadAttention(d, h, batch_first=batch_first)

        def forward(self, x, key_padding_mask, attn_mask):
            return self.mha(x, x, x, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                            need_weights=False)[0]

    class GPT2Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(d, 3 * d)
            self.c_proj = nn.Linear(d, d)
            self.register_buffer("bias", torch.tril(torch.ones(S, S, dtype=torch.bool))
                                 .view(1, 1, S, S))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(x).split(d, dim=2)
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
            a = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
            a = a.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")).softmax(-1)
            return self.c_proj((a @ v).transpose(1, 2).contiguous().view(b, t, d))

    class Bert(nn.Module):
        """Separate projections; scale on Q; additive mask [B, 1, 1, S] from the input."""

        def __init__(self, layers=2):
            super().__init__()
            self.q = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
            self.k = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
            self.v = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
            self.o = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
            self.ln = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))

        def heads(self, x):
            return x.view(x.shape[0], x.shape[1], h, d // h).permute(0, 2, 1, 3)

        def forward(self, x, attention_mask):
            ext = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
            for q, k, v, o, ln in zip(self.q, self.k, self.v, self.o, self.ln):
                qh = self.heads(q(x)) / math.sqrt(d // h)
                s = qh @ self.heads(k(x)).transpose(-1, -2) + ext
                c = (s.softmax(-1) @ self.heads(v(x))).permute(0, 2, 1, 3)
                x = ln(x + o(c.reshape(x.shape[0], x.shape[1], d)))
            return x

    class PackedGather(nn.Module):
        """One projection viewed [B, S, 3, H, E], permuted to [3, B, H, S, E], split by
        Gather; K divided by sqrt(E); a [B, 1, S, S] float mask input."""

        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)

        def forward(self, x, mask):
            b, t, _ = x.shape
            qkv = self.qkv(x).reshape(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            a = (q @ (k / math.sqrt(d // h)).transpose(-2, -1) + mask).softmax(dim=-1)
            return self.proj((a @ v).transpose(1, 2).reshape(b, t, d))

    g = torch.Generator().manual_seed(11)
    x = torch.randn(B, S, d, generator=g)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, -3:] = True  # the second sequence is 3 shorter
    causal = torch.triu(torch.full((S, S), float("-inf")), 1)
    if name in ("mha", "mha_batch_first"):
        bf = name == "mha_batch_first"
        return (MHA(bf), {"x": x if bf else x.transpose(0, 1).contiguous(),
                          "key_padding_mask": pad, "attn_mask": causal}, False, 1)
    if name == "gpt2":
        return GPT2Block(), {"x": x}, True, 1
    if name == "encoder_layer":
        layer = nn.TransformerEncoderLayer(d, h, 128, dropout=0.0)

        class Enc(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = layer

            def forward(self, x, src_mask):
                return self.layer(x, src_mask=src_mask)

        return Enc(), {"x": x.transpose(0, 1).contiguous(), "src_mask": causal}, False, 1
    if name == "bert":
        am = torch.ones(B, S, dtype=torch.int64)
        am[0, -4:] = 0
        return Bert(), {"x": x, "attention_mask": am}, True, 2
    if name == "packed_gather":
        m = torch.randn(B, 1, S, S, generator=g)
        return PackedGather(), {"x": x, "mask": m}, False, 1
    if name == "scaled_mask":
        class ScaledMask(PackedGather):
            """The mask added before the scale, so the scale applies to it too."""

            def forward(self, x, mask):
                b, t, _ = x.shape
                qkv = self.qkv(x).reshape(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
                a = ((qkv[0] @ qkv[1].transpose(-2, -1) + mask) * 0.25).softmax(dim=-1)
                return self.proj((a @ qkv[2]).transpose(1, 2).reshape(b, t, d))

        return ScaledMask(), {"x": x, "mask": torch.randn(B, 1, S, S, generator=g)}, False, 0
    if name == "causal_trilu":
        class CausalTrilu(nn.Module):
            """A causal mask made in forward by torch.tril of ones the sequence's size
            (exported as Trilu, opset 14), applied by masked_fill; separate projections."""

            def __init__(self):
                super().__init__()
                self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

            def forward(self, x):
                b, t, _ = x.shape
                e = d // h
                q, k, v = (p(x).view(b, t, h, e).transpose(1, 2) for p in (self.q, self.k, self.v))
                keep = torch.tril(torch.ones(t, t, dtype=torch.bool))
                a = ((q @ k.transpose(-2, -1)) / math.sqrt(e)).masked_fill(~keep, float("-inf"))
                return self.o((a.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))

        return CausalTrilu(), {"x": x}, True, 1
    if name in ("gqa", "mqa"):
        kvh = 2 if name == "gqa" else 1

        class GroupedQuery(nn.Module):
            """Llama-style grouped-query attention: K and V with kvh heads, repeated for the
            query heads by repeat_kv (Expand of a new axis, then a Reshape merging it); for
            one kv head (multi-query) the [B, 1, S, E] keys are left to MatMul's broadcast.
            Causal mask from a constant buffer; dynamic batch."""

            def __init__(self):
                super().__init__()
                self.q = nn.Linear(d, d)
                self.k = nn.Linear(d, kvh * (d // h))
                self.v = nn.Linear(d, kvh * (d // h))
                self.o = nn.Linear(d, d)
                self.register_buffer("causal", torch.triu(torch.full((S, S), -1e9), 1))

            def forward(self, x):
                b, t, _ = x.shape
                e = d // h
                q = self.q(x).view(b, t, h, e).transpose(1, 2)
                k = self.k(x).view(b, t, kvh, e).transpose(1, 2)
                v = self.v(x).view(b, t, kvh, e).transpose(1, 2)
                if kvh > 1:  # repeat_kv
                    r = h // kvh
                    k = k[:, :, None].expand(b, kvh, r, t, e).reshape(b, h, t, e)
                    v = v[:, :, None].expand(b, kvh, r, t, e).reshape(b, h, t, e)
                a = (q @ k.transpose(-2, -1)) / math.sqrt(e) + self.causal[:t, :t]
                y = a.softmax(-1) @ v
                return self.o(y.transpose(1, 2).reshape(b, t, d))

        return GroupedQuery(), {"x": x}, True, 1
    if name in ("swin", "swin_shifted"):
        tv = pytest.importorskip("torchvision")
        from torchvision.models.swin_transformer import ShiftedWindowAttention
        shift = [2, 2] if name == "swin_shifted" else [0, 0]
        # 8 x 8 pixels in 4 x 4 windows: 4 windows per image, heads 2 of 16
        attn = ShiftedWindowAttention(32, [4, 4], shift, 2)
        with torch.no_grad():  # a relative position bias that matters
            attn.relative_position_bias_table.normal_(0, 1.0, generator=g)
        return attn, {"x": torch.randn(B, 8, 8, 32, generator=g)}, True, 1
    raise KeyError(name)


MODELS = ["mha", "mha_batch_first", "gpt2", "encoder_layer", "bert", "packed_gather",
          "scaled_mask", "gqa", "mqa", "swin", "swin_shifted", "causal_trilu"]


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """name -> (folder with model.onnx, inputs and y.npy (PyTorch's), input names,
    attention count, dynamic batch?)."""
    root = tmp_path_factory.mktemp("attention")
    done = {}

    def get(name):
        if name not in done:
            torch = pytest.importorskip("torch")
            model, inputs, dynamic, count = build(name)
            model.eval()
            folder = root / name
            folder.mkdir()
            names = list(inputs)
            axes = {n: {0: "batch"} for n in names} if dynamic else None
            if axes:
                axes["y"] = {0: "batch"}
            with torch.no_grad():
                want = model(*inputs.values()).numpy()
                torch.onnx.export(model, tuple(inputs.values()), str(folder / "model.onnx"),
                                  input_names=names, output_names=["y"], opset_version=14,
                                  dynamic_axes=axes)
            for n, t in inputs.items():
                np.save(folder / f"{n}.npy", t.numpy())
            np.save(folder / "y.npy", want)
            done[name] = (folder, names, count, dynamic)
        return done[name]

    return get


def run(kiln, args, env=None):
    proc = subprocess.run([kiln, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"kiln {' '.join(args)} exited {proc.returncode}:\n" \
                                 f"{(proc.stderr or proc.stdout)[-2000:]}"
    return proc.stdout + proc.stderr


MODES = {
    "default": ([], {}),
    "reference-kernels": ([], {"KILN_FAST": "0"}),
    "unfused-reference": (["--reference"], {}),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", MODELS)
def test_matches_pytorch(name, mode, kiln_bin, exported, tmp_path):
    folder, names, _, _ = exported(name)
    flags, env = MODES[mode]
    args = ["predict", str(folder / "model.onnx"), "--output-dir", str(tmp_path), *flags]
    for n in names:
        args += ["--input", f"{n}={folder / (n + '.npy')}"]
    run(kiln_bin, args, env)
    got = np.load(tmp_path / "y.npy")
    want = np.load(folder / "y.npy")
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= REL_TOL * scale, f"{name} ({mode}): max|kiln - torch| = {err:.3g}"


@pytest.mark.parametrize("name", MODELS)
def test_attention_is_fused_and_fast(name, kiln_bin, exported):
    folder, _, count, dynamic = exported(name)
    log = run(kiln_bin, ["inspect", str(folder / "model.onnx"), "--optimized"])
    if count == 0:  # a pattern KilnAttention does not compute: left alone
        assert "KilnAttention" not in log, log
        return
    m = re.search(r"attention_fusion .*KilnAttention x(\d+)", log)
    assert m and int(m.group(1)) == count, f"expected KilnAttention x{count}:\n{log}"
    batch = ["--batch", str(B)] if dynamic else []
    out = run(kiln_bin, ["bench", str(folder / "model.onnx"), *batch, "--iterations", "2",
                         "--warmup", "1", "--profile"])
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == ["KilnAttention"]]
    assert rows and all(r[1].startswith("f32_attention_") for r in rows), out
    assert all(r[5] != "-" for r in rows), f"KilnAttention's work is not counted:\n{out}"
    assert not [line for line in out.splitlines()
                if line.split()[:1] == ["Softmax"]], out
