#!/usr/bin/python3
"""loom train vs PyTorch 1.13 (Debian python3-torch) on the same GPT-2 model, batch and
optimizer, fp32 (and bf16), 2 threads, in one run: median step time -> tokens/s, MFU, and
peak RSS of each process.

    /usr/bin/python3 bench/train_vs_pytorch.py LOOM DATA_DIR [--steps N] [--models small,gpt2-124m]
        [--pytorch-bf16-steps N]

DATA_DIR is a `loom prep` folder (PyTorch gets random tokens: the speed does not depend on
them). Prints a markdown table for docs/perf.md.
"""
import argparse
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SHAPES = {"small": (6, 6, 384, 256, 4), "gpt2-124m": (12, 12, 768, 1024, 1)}  # L, NH, C, T, B
V = 50257


def flops_per_token(L, C, T):  # the same count as loom's GptConfig::flops_per_token
    params = V * C + L * (12 * C * C + 13 * C) + 2 * C
    return 6 * params + 12 * L * C * T


def make_gpt(name, B):
    """The GPT-2 model of `name` in PyTorch, for micro-batch B (also used by
    bench/dp_vs_pytorch.py)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    L, NH, C, T, _ = SHAPES[name]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.attproj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
            # float, not bool: gloo cannot broadcast bool buffers (DDP syncs buffers)
            self.register_buffer("mask", torch.tril(torch.ones(T, T)))

        def forward(self, x):
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            hs = C // NH
            q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(self.mask == 0, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.attproj(y)
            return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.lnf = nn.LayerNorm(C)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(T))
            for b in self.blocks:
                x = b(x)
            logits = self.lnf(x) @ self.wte.weight.T
            return F.cross_entropy(logits.view(-1, V).float(), targets.view(-1))

    return GPT()


def adamw_groups(model):
    return [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]


def pytorch_worker(name, steps, dtype):
    """Runs in a child process: prints the median step seconds."""
    import torch

    torch.set_num_threads(2)
    L, NH, C, T, B = SHAPES[name]
    torch.manual_seed(0)
    model = make_gpt(name, B)
    opt = torch.optim.AdamW(adamw_groups(model), lr=6e-4, betas=(0.9, 0.95))
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B, T))
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(dtype == "bf16")):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"step_s": statistics.median(times[1:])}))


def free_port():
    """A TCP port free on 127.0.0.1 now (rendezvous of the DDP benchmarks' ranks)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run_child(cmd, env):
    """Runs cmd; returns (stdout, peak RSS in MiB of that process, from wait4's rusage)."""
    with tempfile.TemporaryFile(mode="w+") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        out.seek(0)
        text = out.read()
    if status != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{text}")
    return text, ru.ru_maxrss / 1024


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return pytorch_worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--models", default="small,gpt2-124m")
    ap.add_argument("--pytorch-bf16-steps", type=int, default=2,
                    help="timed steps of PyTorch in bf16 (Debian's PyTorch has no fast bf16 "
                    "matmul on CPU: one gpt2-124m step took minutes)")
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2")
    # Each row is printed as soon as it is measured (a full run takes long on 2 cores).
    print("| model | dtype | B x T | PyTorch tok/s | loom tok/s | loom / PyTorch | PyTorch GFLOP/s "
          "| loom GFLOP/s | PyTorch peak RSS | loom peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for name in a.models.split(","):
        L, NH, C, T, B = SHAPES[name]
        fpt = flops_per_token(L, C, T)
        for dtype in ("fp32", "bf16"):
            pt_steps = a.steps if dtype == "fp32" else min(a.steps, a.pytorch_bf16_steps)
            out, pt_rss = run_child([sys.executable, __file__, "--worker", name, str(pt_steps),
                                     dtype], env)
            pt = json.loads(out.strip().splitlines()[-1])["step_s"]
            run_dir = tempfile.mkdtemp(prefix="loom-bench-")
            shutil.rmtree(run_dir)
            cmd = [a.loom, "train", "--set", "model.name=" + name, "--set", "data.path=" + a.data,
                   "--set", "run.dir=" + run_dir, "--set", f"train.steps={a.steps + 1}",
                   "--set", f"train.micro_batch={B}", "--set", f"train.seq_len={T}",
                   "--set", f"train.global_batch={B}", "--set", "train.threads=2",
                   "--set", "train.dtype=" + dtype, "--set", "eval.every=0", "--quiet"]
            _, loom_rss = run_child(cmd, env)
            with open(os.path.join(run_dir, "metrics.jsonl")) as f:
                ms = [json.loads(l) for l in f if l.strip()]
            lm = statistics.median(m["step_ms"] for m in ms[1:]) / 1e3
            shutil.rmtree(run_dir)
            r = (name, dtype, B, T, B * T / pt, B * T / lm, fpt * B * T / pt / 1e9,
                 fpt * B * T / lm / 1e9, pt_rss, loom_rss)
            print(f"| {r[0]} | {r[1]} | {r[2]} x {r[3]} | {r[4]:.0f} | {r[5]:.0f} | "
                  f"{r[5] / r[4]:.2f}x | {r[6]:.0f} | {r[7]:.0f} | {r[8]:.0f} MiB | "
                  f"{r[9]:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
