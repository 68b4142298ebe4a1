#!/usr/bin/python3
"""loom sample (key/value cache) vs PyTorch 1.13 (Debian python3-torch) generating with a
key/value cache from the same checkpoint, and vs loom without the cache, in one run, same
threads: greedy decoding, a prompt of P tokens from the King James Bible, N new tokens.

    /usr/bin/python3 bench/sample_vs_pytorch.py LOOM DATA_DIR [--model gpt2-124m]
        [--prompt-tokens 512] [--new 256] [--rounds 3] [--batch 1]

--batch B generates B sequences at once (B windows of Genesis of the same length: loom's
repeated --prompt, PyTorch's batched cache); tokens/s count every sequence's tokens.

DATA_DIR is a `loom prep` folder (the checkpoint is a 1-step run of the model on it: the
speed does not depend on the weights). Rounds interleave loom (fp32, bf16 weights) and PyTorch
(1 thread and all cores: on 2 cores its 1-thread decoding was the faster); medians. The
PyTorch model reads the checkpoint's tensors, so its greedy tokens are compared with loom's.

Decoding is bound by the bytes it reads per token: the weights (all but the position table;
bf16 copies of the matrices for --dtype bf16) once per step for the batch, and each sequence's
keys and values (2 x layers x channels x 4 bytes a cached position, at the mean length while
decoding). Each round runs `loom bench --probe`; the table puts each generator's GB/s read
beside the probe's read bandwidth (its fastest repetition, the median over the rounds; 1 thread
for 1-thread PyTorch, all cores otherwise).
Prints a markdown table for docs/perf.md.
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def read_checkpoint(step_dir):
    """{name: np.ndarray} of the param/ tensors of a one-process checkpoint (whole pieces)."""
    man = json.load(open(os.path.join(step_dir, "manifest.json")))
    out = {}
    for name, t in man["tensors"].items():
        if not name.startswith("param/"):
            continue
        flat = np.empty(int(np.prod(t["shape"])), dtype=np.float32)
        for p in t["pieces"]:
            if "start" in p:
                sys.exit("read_checkpoint: a one-process checkpoint is expected (boxes found)")
            with open(os.path.join(step_dir, p["file"]), "rb") as f:
                f.seek(p["offset"])
                flat[p["begin"]:p["begin"] + p["count"]] = np.frombuffer(
                    f.read(4 * p["count"]), dtype=np.float32)
        out[name[len("param/"):]] = flat.reshape(t["shape"])
    return out, man["meta"]["model"]


def torch_generate(params, cfg, prompts, new, threads):
    """Greedy decoding with a key/value cache in PyTorch of equally long prompts at once;
    (each prompt's new tokens, prefill s, decode s).

    Written for speed: the cache is preallocated and written in place (torch.cat of the
    growing cache cost more than the products here), and single rows go through
    matrix-vector products (torch.mv), ~6x faster than F.linear's addmm on one row with
    Debian's PyTorch build (BLAS_INFO=generic)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # (measured: no effect here; its 2-thread slowness is not it)
    P = {k: torch.from_numpy(v) for k, v in params.items()}
    L, NH, C, T = cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["block_size"]
    V, hs = cfg["vocab_size"], C // NH
    B = len(prompts)
    kc = torch.zeros(L, B, NH, T, hs)
    vc = torch.zeros(L, B, NH, T, hs)

    def linear(x, w, b=None):  # x (n, in), w (out, in)
        if x.shape[0] == 1:
            y = torch.mv(w, x[0]).unsqueeze(0)
            return y if b is None else y + b
        return F.linear(x, w, b)

    def forward(tokens, pos0):  # tokens (B, n) at positions pos0.. -> the last logits (B, V)
        n = tokens.shape[1]
        end = pos0 + n
        x = (P["wte"][tokens] + P["wpe"][pos0:end]).reshape(B * n, C)
        for layer in range(L):
            w = lambda s: P["h%d.%s" % (layer, s)]  # noqa: E731
            h = F.layer_norm(x, (C,), w("ln1w"), w("ln1b"), 1e-5)
            qkv = linear(h, w("qkvw").reshape(3 * C, C), w("qkvb").reshape(3 * C))
            q, k, v = (t.reshape(B, n, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=1))
            kc[layer, :, :, pos0:end] = k
            vc[layer, :, :, pos0:end] = v
            att = (q @ kc[layer, :, :, :end].transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            if n > 1:  # causal inside the new rows
                mask = torch.ones(n, end).tril(pos0) == 0
                att = att.masked_fill(mask, float("-inf"))
            y = (att.softmax(dim=-1) @ vc[layer, :, :, :end]).transpose(1, 2).reshape(B * n, C)
            x = x + linear(y, w("attprojw"), w("attprojb"))
            h = F.layer_norm(x, (C,), w("ln2w"), w("ln2b"), 1e-5)
            h = F.gelu(linear(h, w("fcw"), w("fcb")), approximate="tanh")
            x = x + linear(h, w("fcprojw"), w("fcprojb"))
        last = F.layer_norm(x.reshape(B, n, C)[:, -1], (C,), P["lnfw"], P["lnfb"], 1e-5)
        return linear(last, P["wte"])[:, :V]

    with torch.no_grad():
        t0 = time.perf_counter()
        nxt = forward(torch.tensor(prompts), 0).argmax(dim=-1)
        t1 = time.perf_counter()
        out = [nxt]
        while len(out) < new:
            nxt = forward(nxt.unsqueeze(1), len(prompts[0]) + len(out) - 1).argmax(dim=-1)
            out.append(nxt)
        t2 = time.perf_counter()
    return [[int(t[i]) for t in out] for i in range(B)], t1 - t0, t2 - t1


def loom_sample(loom, ckpt, texts, new, cache, dtype="fp32"):
    cmd = [loom, "sample", "--ckpt", ckpt, "-n", str(new), "--temperature", "0", "--stats",
           "--dtype", dtype] + [x for t in texts for x in ("--prompt", t)] + \
        ([] if cache else ["--no-cache"])
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = re.search(r"first new token after ([\d.]+) s; (\d+) more new tokens in ([\d.]+) s",
                  p.stderr)
    if not m:
        sys.exit("no --stats line from loom sample:\n" + p.stderr)
    return p.stdout, float(m.group(1)), int(m.group(2)), float(m.group(3))


def encode(loom, text):
    return [int(x) for x in subprocess.run([loom, "tokenize", text], capture_output=True,
                                           text=True, check=True).stdout.split()]


def decode(loom, ids):  # `loom tokenize --decode` ends the text with a new line
    return subprocess.run([loom, "tokenize", "--decode"] + [str(i) for i in ids],
                          capture_output=True, text=True, check=True).stdout[:-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("data")
    ap.add_argument("--model", default="gpt2-124m")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--no-cache-new", type=int, default=16,
                    help="new tokens for loom --no-cache (each re-runs the whole window); "
                         "0 leaves that row out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1, help="sequences generated at once")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        subprocess.run([a.loom, "train", "-c", os.path.join(root, "configs", "tiny.toml"),
                        "--set", "model.name=" + a.model, "--set", "data.path=" + a.data,
                        "--set", "run.dir=" + run_dir, "--set", "train.steps=1",
                        "--set", "train.seq_len=64", "--set", "train.micro_batch=1",
                        "--set", "train.global_batch=1", "--set", "ckpt.every=1",
                        "--set", "eval.every=0", "--quiet"], check=True)
        step_dir = os.path.join(run_dir, "ckpt", sorted(os.listdir(os.path.join(run_dir,
                                                                                  "ckpt")))[-1])
        params, cfg = read_checkpoint(step_dir)
        # The prompts: windows of P tokens of Genesis, each as text that encodes to exactly
        # them (a window that does not is moved on by a token).
        text = subprocess.run(["bible", "-f", "gen1:1-gen20:18"], capture_output=True,
                              text=True, check=True).stdout
        all_ids = encode(a.loom, text)
        windows, at = [], 0
        while len(windows) < a.batch:
            ids = all_ids[at:at + a.prompt_tokens]
            if len(ids) < a.prompt_tokens:
                sys.exit("Genesis has too few tokens for %d prompts" % a.batch)
            if encode(a.loom, decode(a.loom, ids)) == ids:
                windows.append(ids)
                at += a.prompt_tokens
            else:
                at += 1
        prompts = [decode(a.loom, ids) for ids in windows]
        ids = windows[0]
        cores = os.cpu_count()
        names = ["loom fp32", "loom bf16"] + ["pytorch %d" % t for t in sorted({1, cores})]
        rows = {k: [] for k in names}
        probes = []
        for r in range(a.rounds):
            probes.append(json.loads(subprocess.run([a.loom, "bench", "--probe"],
                                                    capture_output=True, text=True,
                                                    check=True).stdout))
            for name in names:
                if name.startswith("loom"):
                    out, first, stepped, gen = loom_sample(a.loom, step_dir, prompts, a.new,
                                                           True, name.split()[1])
                    rows[name].append((first, stepped / gen))
                    if name == "loom fp32":
                        loom_text = out
                else:
                    toks, pre, dec = torch_generate(params, cfg, windows, a.new,
                                                    int(name.split()[1]))
                    rows[name].append((pre, a.batch * (a.new - 1) / dec))
            print("round %d: %s" % (r, ", ".join("%s %.1f tok/s" % (k, v[-1][1])
                                                 for k, v in rows.items())), file=sys.stderr)
        if a.no_cache_new > 0:
            _, nc_first, nc_stepped, nc_gen = loom_sample(a.loom, step_dir, prompts[:1],
                                                          a.no_cache_new, False)
        same = loom_text == "----\n".join(p + decode(a.loom, t) + "\n"
                                          for p, t in zip(prompts, toks))
    med = {k: (statistics.median(x for x, _ in v), statistics.median(y for _, y in v))
           for k, v in rows.items()}
    best = max((v[1], k) for k, v in med.items() if k.startswith("pytorch"))
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = re.search(r"Model name:\s*(.*)", cpu).group(1)
    print("%s, %d prompt(s) of %d tokens at once, %d new tokens each, greedy, %d threads, %s, "
          "medians of %d rounds" % (a.model, a.batch, len(ids), a.new, os.cpu_count(), cpu,
                                    a.rounds))
    print()
    # Bytes read per new token (see the docstring).
    is_matrix = lambda k: k == "wte" or k.endswith(("qkvw", "attprojw", "fcw", "fcprojw"))
    matrices = sum(v.size for k, v in params.items() if is_matrix(k))
    vectors = sum(v.size for k, v in params.items() if not is_matrix(k) and k != "wpe")
    cached = 2 * cfg["n_layer"] * cfg["n_embd"] * 4 * (len(ids) + a.new / 2)
    per_token = {w: (matrices * w + vectors * 4) / a.batch + cached for w in (4, 2)}
    read1 = statistics.median(p["read_gbps"] for p in probes)
    read_all = statistics.median(p["read_gbps_all_cores"] for p in probes)
    print("Bytes read per new token: %.0f MB in fp32, %.0f MB with bf16 matrices (%.0f MB of "
          "them the keys and values); `loom bench --probe` read bandwidth, medians of the "
          "rounds: %.1f GB/s on 1 thread, %.1f GB/s on %d" %
          (per_token[4] / 1e6, per_token[2] / 1e6, cached / 1e6, read1, read_all, cores))
    print()
    print("| generator | prompt -> first token (s) | new tokens/s | vs best PyTorch "
          "| GB/s read (% of the probe's) |")
    print("|---|---:|---:|---:|---:|")
    label = {"loom fp32": "loom sample, key/value cache, fp32",
             "loom bf16": "loom sample, key/value cache, --dtype bf16 (bf16 weight copies)"}
    for k in names:
        name = label.get(k) or "PyTorch 1.13, key/value cache, fp32, %s thread(s)" % k.split()[1]
        gbps = med[k][1] * per_token[2 if k == "loom bf16" else 4] / 1e9
        limit = read1 if k == "pytorch 1" else read_all
        print("| %s | %.3f | %.1f | %.2fx | %.1f (%.0f%%) |" %
              (name, med[k][0], med[k][1], med[k][1] / best[0], gbps, 100 * gbps / limit))
    if a.no_cache_new > 0:
        print("| loom sample --no-cache, fp32, one prompt (%d new tokens) | %.3f | %.2f | %.3fx "
              "| |" % (a.no_cache_new, nc_first, nc_stepped / nc_gen,
                      nc_stepped / nc_gen / best[0]))
    print()
    print("greedy text of loom (fp32) and PyTorch: %s" % ("identical" if same else "DIFFERENT"))


if __name__ == "__main__":
    main()
