#!/usr/bin/env python3
"""make_kiln_corpus.py - the fuzzing seed corpus of the .kiln reader.

    python3 tools/make_kiln_corpus.py --tool build/tests/unit_kiln_artifact \
        tests/corpus/kiln_artifact

Builds a few small ONNX models with the onnx package (a dense layer, a
convolution the optimizer blocks and fuses, an If with two subgraphs, a
string constant, a 90%-sparse MatMul), compiles each to a .kiln file with the
C API (the test binary's `--save` mode, src/api/artifact.c behind it; fp32,
and bf16 / int8 for the dense, convolution and sparse models, so that format
version 2's s8 weights and SPRS section are seeded; int8 needs an AVX512-VNNI
machine), and writes them with malformed variants: truncated, a wrong format
version, and bytes flipped
inside each section with every checksum made right again, so that the
replay (fuzz/fuzz_kiln_artifact.c) reaches the section parsers, not only the
CRC checks; format version 3's deflated graph (GRPZ) gets flips made inside the
inflated graph and deflated again, a bad length and a cut stream, and each file
is also written as version 2 with a plain GRPH section. Seeds are deterministic (fixed random seed). The corpus also
keeps v1_dense_fp32.kiln, a format version 1 file written before version 2,
which this script does not make.
"""
import argparse
import os
import random
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def rechecksum(buf):
    """Make every CRC of an edited .kiln file right again."""
    nsec = struct.unpack_from("<I", buf, 24)[0]
    for i in range(nsec):
        e = 64 + 32 * i
        off, ln = struct.unpack_from("<QQ", buf, e + 8)
        struct.pack_into("<I", buf, e + 4, crc32c(buf[off:off + ln]))
    struct.pack_into("<I", buf, 28, crc32c(buf[64:64 + 32 * nsec]))
    struct.pack_into("<I", buf, 60, crc32c(buf[:60]))


def split(buf):
    """The sections of a .kiln file: [(kind, bytes)] in table order."""
    nsec = struct.unpack_from("<I", buf, 24)[0]
    out = []
    for i in range(nsec):
        e = 64 + 32 * i
        off, ln = struct.unpack_from("<QQ", buf, e + 8)
        out.append((bytes(buf[e:e + 4]).decode(), bytes(buf[off:off + ln])))
    return out


def join(header, secs):
    """A .kiln file from the first 64 bytes of another (magic, version, Kiln version) and
    sections [(kind, bytes)], laid out at 64-byte offsets, every checksum right."""
    n = len(secs)
    off = (64 + 32 * n + 63) // 64 * 64
    table, body = bytearray(), bytearray()
    for kind, data in secs:
        table += kind.encode() + struct.pack("<IQQQ", 0, off, len(data), 0)
        pad = (off - 64 - 32 * n) - len(body)
        body += b"\0" * pad + data
        off = (off + len(data) + 63) // 64 * 64
    buf = bytearray(header[:64]) + table + body
    struct.pack_into("<QI", buf, 16, len(buf), n)
    rechecksum(buf)
    return buf


def grpz_variants(good, rnd):
    """Format version 3 keeps the graph deflated (GRPZ): byte flips inside the inflated graph,
    deflated again, so that the replay reaches the graph parser behind zlib; a bad length, a
    cut stream, and the same file written as version 2 with a plain GRPH section."""
    secs = split(good)
    k = next((i for i, (kind, _) in enumerate(secs) if kind == "GRPZ"), None)
    if k is None:
        return {}
    raw = zlib.decompress(secs[k][1][8:])
    out = {}
    for j in range(6):
        g = bytearray(raw)
        at = rnd.randrange(len(g))
        g[at] = rnd.choice([0x00, 0xFF, 0x7F, 0x80, g[at] ^ 0x01, g[at] ^ 0x10])
        s2 = list(secs)
        s2[k] = ("GRPZ", struct.pack("<Q", len(g)) + zlib.compress(bytes(g), 9))
        out[f"grpz_graph{j}"] = join(good, s2)
    for tag, data in (("grpz_len_big", struct.pack("<Q", len(raw) + 1) + secs[k][1][8:]),
                      ("grpz_len_huge", struct.pack("<Q", 1 << 40) + secs[k][1][8:]),
                      ("grpz_cut", secs[k][1][:len(secs[k][1]) // 2])):
        s2 = list(secs)
        s2[k] = ("GRPZ", data)
        out[tag] = join(good, s2)
    s2 = list(secs)
    s2[k] = ("GRPH", raw)
    v2 = join(good, s2)
    struct.pack_into("<I", v2, 8, 2)
    rechecksum(v2)
    out["as_v2"] = v2
    return out


def models():
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    dense = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])], "dense",
        [helper.make_tensor_value_info("x", f, ["batch", 4])],
        [helper.make_tensor_value_info("y", f, ["batch", 3])], [w, b])
    k = numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "k")
    conv = helper.make_graph(
        [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("GlobalAveragePool", ["r"], ["y"])], "conv",
        [helper.make_tensor_value_info("x", f, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", f, ["batch", 16, 1, 1])], [k])
    one = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "one")
    then_g = helper.make_graph([helper.make_node("Add", ["x", "one"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", f, [2])])
    else_g = helper.make_graph([helper.make_node("Mul", ["x", "one"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", f, [2])])
    iff = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)], "if",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", f, [2])],
        [helper.make_tensor_value_info("y", f, [2])], [one])
    s = helper.make_tensor("s", TensorProto.STRING, [2], [b"ab", b"cde"])
    strs = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["y"]), helper.make_node("Identity", ["x"], ["z"])],
        "strings", [helper.make_tensor_value_info("x", f, [1])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [2]),
         helper.make_tensor_value_info("z", f, [1])], [s])
    # a 90%-zero MatMul weight: a sparse-kernel candidate, so an int8 file has an SPRS section
    ws = rng.standard_normal((32, 16)).astype(np.float32)
    ws[rng.random(ws.shape) < 0.9] = 0.0
    sparse = helper.make_graph(
        [helper.make_node("MatMul", ["x", "ws"], ["y"])], "sparse",
        [helper.make_tensor_value_info("x", f, ["batch", 32])],
        [helper.make_tensor_value_info("y", f, ["batch", 16])],
        [numpy_helper.from_array(ws, "ws")])
    for name, g in [("dense", dense), ("conv", conv), ("if", iff), ("strings", strs),
                    ("sparse", sparse)]:
        yield name, helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                                      producer_name="make_kiln_corpus")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True, help="tests/unit_kiln_artifact in a build folder")
    ap.add_argument("out")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rnd = random.Random(1)
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in models():
            src = os.path.join(tmp, name + ".onnx")
            onnx.save(model, src)
            precs = {"dense": ["fp32", "bf16", "int8"], "conv": ["fp32", "int8"],
                     "sparse": ["int8"]}.get(name, ["fp32"])
            for prec in precs:
                art = os.path.join(tmp, f"{name}_{prec}.kiln")
                subprocess.run([a.tool, "--save", src, art, prec], check=True)
                good = bytearray(open(art, "rb").read())
                base = os.path.join(a.out, f"{name}_{prec}")
                open(base + ".kiln", "wb").write(good)
                if prec == "bf16":
                    continue
                for cut in (7, 40, 100, len(good) // 2, len(good) - 1):
                    open(f"{base}_cut{cut}.kiln", "wb").write(good[:cut])
                bad = bytearray(good)
                struct.pack_into("<I", bad, 8, struct.unpack_from("<I", good, 8)[0] + 1)
                rechecksum(bad)
                open(base + "_version_next.kiln", "wb").write(bad)
                for tag, v in grpz_variants(good, rnd).items():
                    open(f"{base}_{tag}.kiln", "wb").write(v)
                nsec = struct.unpack_from("<I", good, 24)[0]
                for i in range(nsec):
                    kind = bytes(good[64 + 32 * i:68 + 32 * i]).decode()
                    off, ln = struct.unpack_from("<QQ", good, 64 + 32 * i + 8)
                    for j in range(4 if kind in ("GRPH", "GRPZ", "SIGN", "META", "SPRS") else 1):
                        if ln == 0:
                            break
                        bad = bytearray(good)
                        at = off + rnd.randrange(ln)
                        bad[at] = rnd.choice([0x00, 0xFF, 0x7F, 0x80, bad[at] ^ 0x01, bad[at] ^ 0x10])
                        rechecksum(bad)
                        open(f"{base}_{kind.lower()}{j}.kiln", "wb").write(bad)
            if name == "dense":
                open(os.path.join(a.out, "foreign_onnx.kiln"), "wb").write(model.SerializeToString())
    print(f"wrote {len(os.listdir(a.out))} files to {a.out}")


if __name__ == "__main__":
    sys.exit(main())
