#!/usr/bin/env python3
"""Writes the seed inputs of the libFuzzer targets into tests/fuzz/corpus/<target>/.

Seeds are valid inputs of each format (and a few near misses), so the fuzzers start from
what loom writes instead of rediscovering the formats; the committed files are this
script's output. Run it again after a format changes."""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from common import checksum64  # noqa: E402


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def shard(tokens, split=0, index=0, vocab=50257):
    body = struct.pack("<%dH" % len(tokens), *tokens)
    head = b"LOOMTOK1" + struct.pack("<IIQQII", 1, vocab, len(tokens), checksum64(body), split,
                                     index) + bytes(24)
    return head + body


# Token shards.
put("shard_fuzz", "empty", shard([]))
put("shard_fuzz", "ten", shard(list(range(0, 50000, 5000))))
put("shard_fuzz", "val", shard([50256, 1, 2, 3], split=1, index=3))
put("shard_fuzz", "truncated", shard([1, 2, 3, 4])[:-2])

# A prepared dataset's manifest (the fuzz target's folder holds train_000000.bin, 100 tokens).
manifest = {"eot": 50256, "files": 1, "format": "loom-tokens", "input_bytes": 400,
            "shards": [{"file": "train_000000.bin", "split": "train", "tokens": 100}],
            "tokenizer": "gpt2 (r50k_base)", "val_fraction": 0.0, "version": 1,
            "vocab_size": 50257}
put("data_manifest_fuzz", "one_shard", json.dumps(manifest, indent=2))
manifest["shards"].append({"file": "train_000000.bin", "split": "val", "tokens": 100})
put("data_manifest_fuzz", "two_splits", json.dumps(manifest))
put("data_manifest_fuzz", "no_shards", json.dumps({"format": "loom-tokens", "shards": []}))

# A checkpoint manifest (the fuzz target's folder holds data-00000.bin: floats 0..63).
data = struct.pack("<64f", *range(64))


def piece(offset, begin, count, start=None, extent=None):
    p = {"begin": begin, "count": count, "file": "data-00000.bin", "offset": offset * 4,
         "checksum": checksum64(data[offset * 4:(offset + count) * 4])}
    if start is not None:
        p["start"], p["extent"] = start, extent
    return p


def ckpt(tensors):
    return json.dumps({"format": "loom-checkpoint", "version": 2, "step": 3, "world_size": 2,
                       "meta": {"next_step": 3, "loader_step": 3, "seed": 1},
                       "tensors": tensors})


whole = {"w": {"dtype": "f32", "shape": [8, 8], "pieces": [piece(0, 0, 64)]}}
put("ckpt_manifest_fuzz", "whole", ckpt(whole))
ranges = {"b": {"dtype": "f32", "shape": [64], "pieces": [piece(0, 0, 40), piece(40, 40, 24)]}}
put("ckpt_manifest_fuzz", "ranges", ckpt(ranges))
boxes = {"w": {"dtype": "f32", "shape": [8, 8], "pieces": [
    piece(0, 0, 32, [0, 0], [8, 4]), piece(32, 0, 32, [0, 4], [8, 4])]}}
put("ckpt_manifest_fuzz", "boxes", ckpt(boxes))
put("ckpt_manifest_fuzz", "version1", ckpt(whole).replace('"version": 2', '"version": 1'))

# Training configurations: the shipped ones, and one with overrides after a NUL.
for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
    with open(os.path.join(ROOT, "configs", name)) as f:
        put("config_fuzz", name, f.read())
put("config_fuzz", "overrides", "[train]\nsteps = 10\n\0train.zero=3\noptim.lr=1e-3\n"
    "pp.split=[1, 3]\ntrain.recompute=every_2")

# The handshake: byte 0 picks the side (odd: server), then what the other side sends.
hello = b"LOOM" + struct.pack("<I", 1) + bytes(range(32))
put("handshake_fuzz", "server_gets_hello", b"\x01" + hello + bytes(32))
put("handshake_fuzz", "client_gets_hello", b"\x00" + hello + bytes(32))
put("handshake_fuzz", "client_gets_other", b"\x00" + b"HTTP/1.1 200 OK\r\n\r\n" + bytes(24))

# The tokenizer: English, code, other scripts, invalid UTF-8.
put("tokenizer_fuzz", "english", "In the beginning God created the heaven and the earth.\n")
put("tokenizer_fuzz", "code", "static int x = 0x1f;  // it's\n\tif (a != b) { return -1; }\n")
put("tokenizer_fuzz", "scripts", "Grüße, 東京, Привет, مرحبا 🙂\u00a0\u2003 'll 've 's")
put("tokenizer_fuzz", "invalid_utf8", b"ab\xff\xfe\xc3(\xe2\x82 \xf0\x9f\x99")

# The store's wire protocol (src/loom/comm/store/wire.h): a few requests.


def frame(code, timeout_ms, number, *strings):
    body = struct.pack("<BIqI", code, timeout_ms, number, len(strings))
    for s in strings:
        body += struct.pack("<I", len(s)) + s
    return struct.pack("<I", len(body)) + body


put("store_wire_fuzz", "set", frame(1, 0, 0, b"rank/0/addr", b"10.0.0.1:29500"))
put("store_wire_fuzz", "wait", frame(6, 5000, 0, b"a", b"b", b"c"))
put("store_wire_fuzz", "add_then_get", frame(3, 0, -1, b"count") + frame(2, 100, 0, b"count"))
put("store_wire_fuzz", "reply", frame(100, 0, 7, b""))

# Model files (src/loom/ckpt/safetensors.h, gguf.h): a small safetensors file of each dtype
# and a near miss, and a GGUF header with metadata of several types and one tensor.


def safetensors(tensors, meta=None):
    header, data = {}, b""
    if meta:
        header["__metadata__"] = meta
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


put("model_file_fuzz", "three_dtypes", safetensors([
    ("w", "F32", [2, 2], struct.pack("<4f", 1, -2, 0.5, 3)),
    ("h", "F16", [3], struct.pack("<3H", 0x3c00, 0xc000, 0x7c00)),
    ("b", "BF16", [2], struct.pack("<2H", 0x3f80, 0x0001))], {"format": "pt"}))
put("model_file_fuzz", "overlap", safetensors([("a", "F32", [1], b"\0" * 4)])[:-2] + b"\0\0\0\0")


def gstr(s):
    return struct.pack("<Q", len(s)) + s.encode()


def gguf():
    kv = (gstr("general.architecture") + struct.pack("<I", 8) + gstr("gpt2") +
          gstr("gpt2.block_count") + struct.pack("<II", 4, 2) +
          gstr("eps") + struct.pack("<If", 6, 1e-5) +
          gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + gstr("a") + gstr("b"))
    info = gstr("w") + struct.pack("<IQQIQ", 2, 2, 2, 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 4) + kv + info
    head += b"\0" * (-len(head) % 32)
    return head + struct.pack("<4f", 1, 2, 3, 4)


put("model_file_fuzz", "gguf", gguf())

# Corpus input (src/loom/data/input.h, jsonl.h): JSON Lines records, one compressed copy.
lines = ('{"doc": {"text": "In the beginning"}, "meta": {"set": "wiki"}}\n'
         '{"doc": {"text": 7}, "meta": {"set": "wiki"}}\n'
         '{"doc": {"text": "x"}, "meta": {"set": "web"}}\n'
         'not json\n[1, 2]\n{"doc": {"text": "\\ud800"}, "meta": {"set": "wiki"}}\n')
put("corpus_input_fuzz", "records", lines)
import gzip  # noqa: E402
put("corpus_input_fuzz", "records_gz", gzip.compress(lines.encode(), mtime=0))
