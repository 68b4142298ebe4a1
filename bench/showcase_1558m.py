#!/usr/bin/python3
"""The memory showcase (docs/perf.md "gpt2-1558m on one machine"): trains configs/gpt2-1558m.toml
(pp 4, recompute, activation and optimizer-state offload) with `loom run -n 4`, sampling the
resident memory of every process of the job every 0.5 s, then prints the step times, the
losses, the job's peak RSS (the sum over its processes at one moment), the disk traffic of
the offloads and a sample from the checkpoint.

    /usr/bin/python3 bench/showcase_1558m.py LOOM DATA_DIR RUN_DIR [--steps 3]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time


def rss_of_tree(root):
    """Resident bytes of root and every process below it."""
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            for task in os.listdir("/proc/%d/task" % pid):
                with open("/proc/%d/task/%s/children" % (pid, task)) as f:
                    todo += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("data")
    ap.add_argument("run_dir")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../configs/gpt2-1558m.toml")
    shutil.rmtree(a.run_dir, ignore_errors=True)
    cmd = [a.loom, "run", "-n", "4", a.loom, "train", "-c", config, "--set",
           "data.path=" + a.data, "--set", "run.dir=" + a.run_dir, "--set",
           "train.steps=%d" % a.steps]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], rss_of_tree(proc.pid))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out = proc.stdout.read()
    proc.wait()
    sampler.join()
    took = time.time() - t0
    print(out[-3000:])
    if proc.returncode != 0:
        sys.exit("the job failed (exit %d)" % proc.returncode)
    with open(os.path.join(a.run_dir, "metrics.jsonl")) as f:
        ms = [json.loads(line) for line in f if line.strip()]
    val = {m["step"]: m["val_loss"] for m in ms if "val_loss" in m}
    steps = [m for m in ms if "loss" in m]
    print("| step | training loss | validation loss | step s | Adam file traffic, GB (all ranks) |"
          " activations spilled, GB |")
    print("|---|---|---|---|---|---|")
    for m in steps:
        print("| %d | %.4f | %s | %.0f | %.1f | %.2f |" % (
            m["step"], m["loss"], "%.4f" % val[m["step"]] if m["step"] in val else "-",
            m["step_ms"] / 1e3, sum(m.get("zero_offload_mb", [0])) / 1024,
            sum(m.get("offload_mb", [0])) / 1024))
    last = steps[-1]
    print("\njob: %.0f s in all; peak RSS of the job %.2f GiB (sum over its processes); per-rank"
          " peak RSS %s GiB; model state per rank %s GiB" % (
              took, peak[0] / 2**30, " / ".join("%.2f" % (x / 1024) for x in last["rss_peak_mb"]),
              " / ".join("%.2f" % (x / 1024) for x in last["state_peak_mb"])))
    sample = subprocess.run([a.loom, "sample", "--ckpt", a.run_dir, "--prompt", "And God said",
                             "-n", "8", "--temperature", "0"], capture_output=True, text=True)
    print("loom sample (exit %d): %r" % (sample.returncode, sample.stdout.strip()))


if __name__ == "__main__":
    main()
