#!/usr/bin/python3
"""ZeRO-3 under a pipeline, two loom binaries side by side (issue 36 item 2: the prefetch):
`small` fp32 on `loom run -n 4` as pp 2 x dp 2 with ZeRO-3 (1F1B, micro-batch 1 x 256 tokens,
4 microbatches per step, 1 thread per rank: 4 ranks on 2 cores), interleaved rounds.
Per run, medians over the steps after the first: the step, rank 0's data-parallel wait
(`comm_wait_ms`: ZeRO-3's gathers and the reduce-scatter it waited for) and the largest
exposed communication over the ranks (`exposed_comm_ms`, pipeline receives included).

    /usr/bin/python3 bench/pp_zero3_wait.py OLD_LOOM NEW_LOOM DATA_DIR [--rounds 3] [--steps 6]
"""
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
a = p.parse_args()


def one(loom):
    d = tempfile.mkdtemp(prefix="loom-ppz3-")
    shutil.rmtree(d)
    args = ["train", "--set", "model.name=small", "--set", "data.path=" + a.data,
            "--set", "run.dir=" + d, "--set", "train.steps=%d" % a.steps,
            "--set", "train.global_batch=8", "--set", "train.micro_batch=1",
            "--set", "train.seq_len=256", "--set", "train.dtype=fp32",
            "--set", "metrics.peak_gflops=100", "--set", "eval.every=0", "--set", "ckpt.every=0",
            "--set", "train.pp=2", "--set", "train.zero=3", "--quiet"]
    subprocess.run([loom, "run", "-n", "4", loom] + args, check=True, capture_output=True,
                   timeout=900)
    with open(os.path.join(d, "metrics.jsonl")) as f:
        steps = [json.loads(line) for line in f if '"loss"' in line][1:]
    shutil.rmtree(d, ignore_errors=True)
    return (statistics.median(m["step_ms"] for m in steps),
            statistics.median(m["comm_wait_ms"] for m in steps),
            statistics.median(max(m["exposed_comm_ms"]) for m in steps))


runs = {"old": [], "new": []}
for r in range(a.rounds):
    for name in ("old", "new"):
        runs[name].append(one(getattr(a, name)))
        print("round %d %s: step %.0f ms, dp wait %.0f ms, exposed %.0f ms" %
              ((r + 1, name) + runs[name][-1]), flush=True)
print("| binary | step ms | rank 0's dp wait ms | largest exposed comm ms | rounds (step) |")
print("|---|---|---|---|---|")
for name in ("old", "new"):
    med = [statistics.median(x[i] for x in runs[name]) for i in range(3)]
    print("| %s | %.0f | %.0f | %.0f | %s |" % (name, med[0], med[1], med[2],
                                                " / ".join("%.0f" % x[0] for x in runs[name])))
