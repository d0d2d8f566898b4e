"""tensor_bundle_ref.py - an independent reader of TensorFlow checkpoints (TensorBundle),
for computing reference answers in the SavedModel tests.

Kiln has its own TensorBundle reader (src/import/tensor_bundle.c); a test
that took its reference values from Kiln would check Kiln against itself.
This is a second, separate implementation in Python from the format's
description, kept small and plain:

  variables.index   a LevelDB-style sorted table: data blocks of
                    prefix-compressed key/value entries with a restart array,
                    an index block pointing at them, a 48-byte footer ending
                    in the magic 0xdb4775248b80fb57; each block is followed by
                    a compression byte (0 none, 1 Snappy) and a CRC32C. The
                    value for key "" is the BundleHeaderProto; every other key
                    is a tensor name and its value a BundleEntryProto
                    (dtype = 1, shape = 2, shard_id = 3, offset = 4, size = 5).
  variables.data-SSSSS-of-NNNNN
                    the raw little-endian tensor bytes at offset, size.

read_bundle(prefix) -> {name: numpy array} for the numeric dtypes the tests
need (float, double, int32, int64); others are left out. No CRC checks: the
shared test data is trusted here.
"""
import struct
from pathlib import Path

import numpy as np

MAGIC = 0xDB4775248B80FB57
DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 9: np.int64}


def _varint(b, i):
    shift = v = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


def _fields(b):
    """Protobuf wire format: yields (field number, wire type, value)."""
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wt}")
        yield num, wt, v


def _snappy(b):
    n, i = _varint(b, 0)
    out = bytearray()
    while i < len(b):
        tag = b[i]
        i += 1
        kind = tag & 3
        if kind == 0:  # literal
            ln = tag >> 2
            if ln >= 60:
                k = ln - 59
                ln = int.from_bytes(b[i:i + k], "little")
                i += k
            ln += 1
            out += b[i:i + ln]
            i += ln
            continue
        if kind == 1:
            ln, off = ((tag >> 2) & 7) + 4, ((tag >> 5) << 8) | b[i]
            i += 1
        elif kind == 2:
            ln, off = (tag >> 2) + 1, int.from_bytes(b[i:i + 2], "little")
            i += 2
        else:
            ln, off = (tag >> 2) + 1, int.from_bytes(b[i:i + 4], "little")
            i += 4
        for _ in range(ln):
            out.append(out[-off])
    assert len(out) == n
    return bytes(out)


def _block(data, handle):
    off, i = _varint(handle, 0)
    size, _ = _varint(handle, i)
    raw, kind = data[off:off + size], data[off + size]
    if kind == 1:
        raw = _snappy(raw)
    elif kind != 0:
        raise ValueError(f"block compression {kind}")
    return raw


def _entries(block):
    """Key/value pairs of one table block, keys rebuilt from their shared prefixes."""
    nrestarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end = len(block) - 4 - 4 * nrestarts
    i, key = 0, b""
    while i < end:
        shared, i = _varint(block, i)
        unshared, i = _varint(block, i)
        vlen, i = _varint(block, i)
        key = key[:shared] + block[i:i + unshared]
        i += unshared
        yield key, block[i:i + vlen]
        i += vlen


def read_index(path):
    """{tensor name: (dtype, shape, shard, offset, size)} from a variables.index file."""
    data = Path(path).read_bytes()
    footer = data[-48:]
    assert struct.unpack("<Q", footer[40:])[0] == MAGIC, f"{path}: not a table"
    _, i = _varint(footer, 0)  # metaindex handle: offset, size
    _, i = _varint(footer, i)
    index_handle = footer[i:]
    out = {}
    for _, handle in _entries(_block(data, index_handle)):
        for key, value in _entries(_block(data, handle)):
            if not key:
                continue  # the BundleHeaderProto
            dtype, shape, shard, offset, size = 0, [], 0, 0, 0
            for num, _, v in _fields(value):
                if num == 1:
                    dtype = v
                elif num == 2:
                    shape = [next((d for n, _, d in _fields(dim) if n == 1), 0)
                             for n, _, dim in _fields(v) if n == 2]
                elif num == 3:
                    shard = v
                elif num == 4:
                    offset = v
                elif num == 5:
                    size = v
            out[key.decode()] = (dtype, shape, shard, offset, size)
    return out


def read_bundle(prefix):
    """{tensor name: numpy array} of a checkpoint, prefix e.g. DIR/variables/variables."""
    prefix = Path(prefix)
    index = read_index(str(prefix) + ".index")
    shards = sorted(prefix.parent.glob(prefix.name + ".data-*-of-*"))
    blobs = [p.read_bytes() for p in shards]
    out = {}
    for name, (dtype, shape, shard, offset, size) in index.items():
        if dtype not in DTYPES:
            continue
        arr = np.frombuffer(blobs[shard][offset:offset + size], dtype=np.dtype(DTYPES[dtype]).newbyteorder("<"))
        out[name] = arr.reshape(shape).astype(DTYPES[dtype])
    return out
