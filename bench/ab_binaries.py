#!/usr/bin/env python3
"""Two loom binaries side by side, in one run (issue 33's speed check of a restructuring:
the starting commit's binary against the new one). Interleaved rounds A B A B ...; medians.

  /usr/bin/python3 bench/ab_binaries.py OLD_LOOM NEW_LOOM DATA_DIR [--rounds 3] [--steps 6]

Rows: `loom bench --np 2 --op allreduce` time at 8 B, 64 KiB and 16 MiB (in place, median
of each run's iterations), and the median training step (steps 2.., metrics.jsonl) of
`small` (fp32, global batch 8 x 256, micro-batch 4) on one process with 2 threads and on 2
ranks x 1 thread as ZeRO-0, ZeRO-3, tp 2 and pp 2 (1F1B), and on 4 ranks x 1 thread as pp 2 x
dp 2 with ZeRO-1 and ZeRO-3 (micro-batch 1: 4 microbatches). The ratio is new / old (below 1:
the new binary is faster)."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

p = argparse.ArgumentParser()
p.add_argument("old")
p.add_argument("new")
p.add_argument("data")
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--rows", default="", help="only the training rows whose name holds one of "
               "these comma-separated words, and no allreduce rows (a follow-up on a few rows)")
a = p.parse_args()

SIZES = [8, 64 << 10, 16 << 20]
LAYOUTS = [("1 process x 2 threads", 1, []),
           ("ZeRO-0, 2 ranks", 2, ["--set", "train.zero=0"]),
           ("ZeRO-3, 2 ranks", 2, ["--set", "train.zero=3"]),
           ("tp 2", 2, ["--set", "train.tp=2"]),
           ("pp 2 (1F1B)", 2, ["--set", "train.pp=2"]),
           # 4 ranks on 2 cores, micro-batch 1: 4 microbatches per step
           ("pp 2 x dp 2 ZeRO-1 (1F1B)", 4,
            ["--set", "train.pp=2", "--set", "train.zero=1", "--set", "train.micro_batch=1"]),
           ("pp 2 x dp 2 ZeRO-3 (1F1B)", 4,
            ["--set", "train.pp=2", "--set", "train.zero=3", "--set", "train.micro_batch=1"])]
if a.rows:
    SIZES = []
    LAYOUTS = [l for l in LAYOUTS if any(w in l[0] for w in a.rows.split(","))]


def bench(loom):
    out = {}
    for size in SIZES:
        r = subprocess.run([loom, "bench", "--np", "2", "--op", "allreduce", "--min", str(size),
                            "--max", str(size), "--iters", "200" if size < 1 << 20 else "30",
                            "--json", "-"], capture_output=True, text=True, check=True,
                           timeout=300)
        rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
        out[size] = [x["time_us"] for x in rows if x["inplace"]][0]
    return out


def train(loom, n, extra, work):
    d = tempfile.mkdtemp(dir=work)
    args = ["train", "--set", "model.name=small", "--set", "data.path=" + a.data, "--set",
            "run.dir=" + d, "--set", "train.steps=%d" % a.steps, "--set", "train.global_batch=8",
            "--set", "train.micro_batch=4", "--set", "train.seq_len=256", "--set",
            "train.dtype=fp32", "--set", "metrics.peak_gflops=100", "--set", "eval.every=0",
            "--set", "ckpt.every=0", "--quiet"] + extra
    cmd = [loom] + args if n == 1 else [loom, "run", "-n", str(n), loom] + args
    subprocess.run(cmd, check=True, timeout=900, capture_output=True)
    steps = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if '"loss"' in l]
    shutil.rmtree(d)
    return statistics.median(s["step_ms"] for s in steps[1:])


work = tempfile.mkdtemp()
res = {"old": {"bench": {s: [] for s in SIZES}, "train": {l[0]: [] for l in LAYOUTS}},
       "new": {"bench": {s: [] for s in SIZES}, "train": {l[0]: [] for l in LAYOUTS}}}
for r in range(a.rounds):
    for who in ("old", "new") if r % 2 == 0 else ("new", "old"):
        loom = a.old if who == "old" else a.new
        for s, t in bench(loom).items():
            res[who]["bench"][s].append(t)
        for name, n, extra in LAYOUTS:
            res[who]["train"][name].append(train(loom, n, extra, work))
shutil.rmtree(work)

print("| row | old (median) | new (median) | new / old | rounds old | rounds new |")
print("|---|---|---|---|---|---|")
for s in SIZES:
    o, n = res["old"]["bench"][s], res["new"]["bench"][s]
    label = "allreduce %s, 2 ranks, in place (us)" % (
        "8 B" if s == 8 else "64 KiB" if s == 64 << 10 else "16 MiB")
    print("| %s | %.2f | %.2f | %.3f | %s | %s |" % (
        label, statistics.median(o), statistics.median(n), statistics.median(n) /
        statistics.median(o), " / ".join("%.2f" % x for x in o), " / ".join("%.2f" % x for x in n)))
for name, _, _ in LAYOUTS:
    o, n = res["old"]["train"][name], res["new"]["train"][name]
    print("| small, %s: step (ms) | %.0f | %.0f | %.3f | %s | %s |" % (
        name, statistics.median(o), statistics.median(n), statistics.median(n) /
        statistics.median(o), " / ".join("%.0f" % x for x in o), " / ".join("%.0f" % x for x in n)))
