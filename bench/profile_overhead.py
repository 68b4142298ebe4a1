#!/usr/bin/python3
"""What train.profile costs (docs/perf.md "The timeline's cost"): `small` on `loom run -n 2`
(ZeRO 3: the most collectives per step, so the most spans), the same steps with the timeline
on and off, rounds alternating; medians of the step times after the first.

    /usr/bin/python3 bench/profile_overhead.py LOOM DATA_DIR [--rounds 3] [--steps 6]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile


def step_ms(a, profile):
    d = tempfile.mkdtemp(prefix="loom-profile-bench-")
    cmd = [a.loom, "run", "-n", "2", a.loom, "train", "--set", "model.name=small", "--set",
           "data.path=" + a.data, "--set", "run.dir=" + d, "--set", "train.steps=%d" % a.steps,
           "--set", "train.micro_batch=2", "--set", "train.global_batch=8", "--set",
           "train.seq_len=256", "--set", "train.zero=3", "--set", "train.threads=1", "--set",
           "eval.every=0", "--set", "train.profile=%s" % ("true" if profile else "false"),
           "--quiet"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(d, "metrics.jsonl")) as f:
        ms = [json.loads(line)["step_ms"] for line in f if '"step_ms"' in line][1:]
    spans = 0
    if profile:
        with open(os.path.join(d, "trace.json")) as f:
            spans = sum(1 for e in json.load(f)["traceEvents"] if e["ph"] == "X")
    shutil.rmtree(d)
    return statistics.median(ms), spans


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("data")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    off, on, spans = [], [], 0
    for _ in range(a.rounds):
        off.append(step_ms(a, False)[0])
        t, spans = step_ms(a, True)
        on.append(t)
    print("| timeline | step ms (median of %d rounds) | rounds |" % a.rounds)
    print("|---|---|---|")
    print("| off | %.0f | %s |" % (statistics.median(off), " / ".join("%.0f" % x for x in off)))
    print("| on | %.0f | %s |" % (statistics.median(on), " / ".join("%.0f" % x for x in on)))
    print("\non/off: %.3fx; %d spans in a %d-step trace (2 ranks)" % (
        statistics.median(on) / statistics.median(off), spans, a.steps))


if __name__ == "__main__":
    main()
