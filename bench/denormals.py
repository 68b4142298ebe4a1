#!/usr/bin/env python3
"""Subnormal floats and step time (issue 38): `tiny` on one process, a healthy run and one
whose loss spikes (optim.lr = 10, optim.grad_clip = 0: activations and gradients fill with
subnormals), each with LOOM_FLUSH_DENORMALS=1 (loom's default) and 0, interleaved rounds.

  /usr/bin/python3 bench/denormals.py LOOM DATA_DIR [--rounds 3] [--steps 12] [--model tiny]

Prints the median step time (steps 3.., metrics.jsonl) of each of the four runs and the
spiking run over the healthy one with flushing (the goal: at most 1.5x)."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

p = argparse.ArgumentParser()
p.add_argument("loom")
p.add_argument("data")
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--model", default="tiny")
a = p.parse_args()
CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "tiny.toml")
# The spiking run keeps training through non-finite steps (skipping their updates) rather
# than stopping at the first one (train.on_nonfinite's default).
RUNS = [("healthy", []), ("spiking (lr 10, no clip)", ["--set", "optim.lr=10", "--set", "optim.grad_clip=0",
                                                      "--set", "train.on_nonfinite=skip",
                                                      "--set", "train.max_skips=100000"])]


def step_ms(flush, extra):
    d = tempfile.mkdtemp(prefix="loom-denormals-")
    try:
        env = dict(os.environ, LOOM_FLUSH_DENORMALS=str(flush))
        subprocess.run([a.loom, "train", "-c", CONFIG, "--set", "model.name=" + a.model,
                        "--set", "data.path=" + a.data, "--set", "run.dir=" + d,
                        "--set", f"train.steps={a.steps}", "--set", "train.dtype=fp32",
                        "--set", "eval.every=0", "--set", "ckpt.every=0", "--quiet", *extra],
                       check=True, env=env)
        rows = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
        steps = [r for r in rows if "step_ms" in r and r["step"] >= 3]
        return statistics.median(r["step_ms"] for r in steps), steps[-1]["loss"]
    finally:
        shutil.rmtree(d, ignore_errors=True)


res = {}
for _ in range(a.rounds):
    for name, extra in RUNS:
        for flush in (1, 0):
            ms, loss = step_ms(flush, extra)
            res.setdefault((name, flush), []).append(ms)
            res[(name, flush, "loss")] = loss
print(f"model {a.model}, {a.rounds} rounds, median step (ms) of each round's steps 3..{a.steps}")
print("| run | flushed (default) | kept (LOOM_FLUSH_DENORMALS=0) | kept / flushed | last loss |")
print("|---|---|---|---|---|")
for name, _ in RUNS:
    f, k = statistics.median(res[(name, 1)]), statistics.median(res[(name, 0)])
    print(f"| {name} | {f:.1f} | {k:.1f} | {k / f:.2f} | {res[(name, 1, 'loss')]:.3g} |")
h = statistics.median(res[("healthy", 1)])
s = statistics.median(res[(RUNS[1][0], 1)])
print(f"spiking / healthy, flushed: {s / h:.2f} (goal <= 1.5)")
