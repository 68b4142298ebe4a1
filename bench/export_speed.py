#!/usr/bin/env python3
"""`loom export` speed and memory (issue 32): gpt2-124m to Hugging Face safetensors and to
GGUF (goal <= 5 s each), and gpt2-1558m exported tensor by tensor (goal: peak RSS under
2 GiB, not the model's 6 GiB), beside `cp` of the checkpoint's data files (the disk's own
speed) in the same run. Each model's checkpoint comes from one `loom train` step (1558m
with Adam's moments on disk, zero.offload = disk, so it fits 24 GiB); median of --rounds
exports, with the max RSS from /usr/bin/time.

    /usr/bin/python3 bench/export_speed.py [--loom build/apps/loom/loom] [--data DIR]
        [--models gpt2-124m,gpt2-1558m] [--rounds 3] [--work /tmp/loom-export-bench]
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import time

ap = argparse.ArgumentParser()
ap.add_argument("--loom", default="build/apps/loom/loom")
ap.add_argument("--data", default="")
ap.add_argument("--models", default="gpt2-124m,gpt2-1558m")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--work", default="/tmp/loom-export-bench")
args = ap.parse_args()
loom = os.path.abspath(args.loom)
os.makedirs(args.work, exist_ok=True)
cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
data = args.data
if not data:
    data = os.path.join(args.work, "kjv")
    if not os.path.exists(data):
        text = os.path.join(args.work, "kjv.txt")
        with open(text, "wb") as f:
            subprocess.run(["bible", "-f", "gen1:1-rev22:21"], stdout=f, check=True)
        subprocess.run([loom, "prep", "-i", text, "-o", data, "--quiet"], check=True)


def timed(cmd):
    """Wall seconds and max RSS (MiB) of cmd."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("%s failed:\n%s%s" % (cmd, p.stdout, p.stderr[-2000:]))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1))
    return time.perf_counter() - t0, rss / 1024


print("CPU: %s, %d cores" % (cpu, os.cpu_count()))
print("| model | what | median s | min-max s | max RSS MiB | output MB |")
print("|---|---|---|---|---|---|")
for name in args.models.split(","):
    run_dir = os.path.join(args.work, name)
    if not glob.glob(os.path.join(run_dir, "ckpt", "step_*")):
        shutil.rmtree(run_dir, ignore_errors=True)
        extra = ["--set", "zero.offload=disk"] if name == "gpt2-1558m" else []
        subprocess.run([loom, "train", "--set", "model.name=" + name, "--set", "data.path=" + data,
                        "--set", "run.dir=" + run_dir, "--set", "train.steps=1",
                        "--set", "train.micro_batch=1", "--set", "train.seq_len=64",
                        "--set", "train.dtype=fp32", "--set", "metrics.peak_gflops=100",
                        "--quiet"] + extra, check=True)
    ckpt = sorted(glob.glob(os.path.join(run_dir, "ckpt", "step_*")))[-1]
    ways = {
        "cp of the checkpoint's files": lambda out: ["cp", "-r", ckpt, out],
        "export --format hf": lambda out: [loom, "export", "--ckpt", ckpt, "--format", "hf", "--out", out],
        "export --format gguf": lambda out: [loom, "export", "--ckpt", ckpt, "--format", "gguf",
                                             "--out", out + ".gguf"],
    }
    rows = {k: [] for k in ways}
    for r in range(args.rounds):
        for what, cmd in ways.items():
            out = os.path.join(args.work, "out")
            shutil.rmtree(out, ignore_errors=True)
            if os.path.exists(out + ".gguf"):
                os.remove(out + ".gguf")
            subprocess.run(["sync"])
            s, rss = timed(cmd(out))
            size = sum(os.path.getsize(p) for p in glob.glob(out + "/*")) if os.path.isdir(out) \
                else os.path.getsize(out + ".gguf")
            rows[what].append((s, rss, size / 1e6))
    for what, v in rows.items():
        t = [x[0] for x in v]
        print("| %s | %s | %.2f | %.2f-%.2f | %.0f | %.0f |" % (
            name, what, statistics.median(t), min(t), max(t), max(x[1] for x in v), v[0][2]))
    print(json.dumps({"model": name, "rows": rows}))
