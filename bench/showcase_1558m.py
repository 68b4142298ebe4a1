#!/usr/bin/python3
"""The memory showcase (docs/perf.md "gpt2-1558m on one machine"): trains configs/gpt2-1558m.toml
(pp 4, recompute, activation and optimizer-state offload) with `loom run -n 4`, sampling the
resident memory of every process of the job every 0.5 s, then prints the step times, the
losses, the job's peak RSS (the sum over its processes at one moment), the disk traffic of
the offloads and a sample from the checkpoint.

    /usr/bin/python3 bench/showcase_1558m.py LOOM DATA_DIR RUN_DIR [--steps 3] [--set KEY=VALUE]

With --model gpt2-124m --reference the same configuration trains a model that one process
can hold, and one process without pipeline or offload trains it too: the printed largest
relative difference of the losses checks the showcase's machinery (4 stages, chunked
moment streaming, spilled activations) at a size where it runs many chunks.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time


def rss_of_tree(root, hwm):
    """Resident bytes of root and every process below it; each one's own high-water mark
    (VmHWM) into hwm[pid]."""
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                    elif line.startswith("VmHWM:"):
                        hwm[pid] = int(line.split()[1]) * 1024
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
    ap.add_argument("--model", default="")
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="more config settings for the job (e.g. zero.overlap_step=false)")
    a = ap.parse_args()
    a.loom = os.path.abspath(a.loom)
    config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../configs/gpt2-1558m.toml")
    shutil.rmtree(a.run_dir, ignore_errors=True)
    cmd = [a.loom, "run", "-n", "4", a.loom, "train", "-c", config, "--set",
           "data.path=" + a.data, "--set", "run.dir=" + a.run_dir, "--set",
           "train.steps=%d" % a.steps]
    if a.model:
        cmd += ["--set", "model.name=" + a.model]
    for kv in a.set:
        cmd += ["--set", kv]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak, hwm = [0], {}

    def sample():  # every 0.1 s: a transient shorter than that may fall between two samples
        while proc.poll() is None:
            peak[0] = max(peak[0], rss_of_tree(proc.pid, hwm))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    for line in proc.stdout:  # the job's log as it runs
        print(line, end="", flush=True)
    proc.wait()
    sampler.join()
    took = time.time() - t0
    if proc.returncode != 0:
        sys.exit("the job failed (exit %d)" % proc.returncode)
    with open(os.path.join(a.run_dir, "metrics.jsonl")) as f:
        ms = [json.loads(line) for line in f if line.strip()]
    val = {m["step"]: m["val_loss"] for m in ms if "val_loss" in m}
    steps = [m for m in ms if "loss" in m]
    # With zero.overlap_step the optimizer call returns at once; the update runs beside the
    # next step, whose forward and backward wait for it where they catch up (optim_wait_ms).
    print("| step | training loss | validation loss | step s | optimizer step s (slowest rank) |"
          " waited for the last step's update, s (slowest rank) |"
          " Adam file traffic, GiB (all ranks) | activations spilled, GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for m in steps:
        print("| %d | %.4f | %s | %.0f | %.1f | %s | %.1f | %.2f |" % (
            m["step"], m["loss"], "%.4f" % val[m["step"]] if m["step"] in val else "-",
            m["step_ms"] / 1e3, max(m["optim_ms"]) / 1e3,
            "%.1f" % (max(m["optim_wait_ms"]) / 1e3) if "optim_wait_ms" in m else "-",
            sum(m.get("zero_offload_mb", [0])) / 1024, sum(m.get("offload_mb", [0])) / 1024))
    last = steps[-1]
    print("\njob: %.0f s in all; peak RSS of the job %.2f GiB (sum over its processes at one "
          "moment, sampled every 0.1 s); the processes' own peaks (VmHWM) add up to %.2f GiB (an "
          "upper bound: not all at one moment); per-rank peak RSS %s GiB; model state per rank "
          "%s GiB" % (
              took, peak[0] / 2**30, sum(hwm.values()) / 2**30,
              " / ".join("%.2f" % (x / 1024) for x in last["rss_peak_mb"]),
              " / ".join("%.2f" % (x / 1024) for x in last["state_peak_mb"])))
    if a.reference:
        ref_dir = a.run_dir + "-one-process"
        shutil.rmtree(ref_dir, ignore_errors=True)
        one = [a.loom, "train", "-c", config] + cmd[cmd.index("--set"):] + [
            "--set", "run.dir=" + ref_dir, "--set", "train.pp=1", "--set",
            "train.offload_activations=false", "--set", "zero.offload=none", "--set",
            "train.threads=2"]
        subprocess.run(one, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(ref_dir, "metrics.jsonl")) as f:
            ref = [json.loads(line)["loss"] for line in f if '"loss"' in line]
        got = [m["loss"] for m in steps]
        diff = max(abs(x - y) / abs(y) for x, y in zip(got, ref))
        print("one process without pipeline or offload: losses %s; largest relative difference"
              " %.2e" % (" ".join("%.4f" % x for x in ref), diff))
    sample = subprocess.run([a.loom, "sample", "--ckpt", a.run_dir, "--prompt", "And God said",
                             "-n", "8", "--temperature", "0"], capture_output=True, text=True)
    print("loom sample (exit %d): %r" % (sample.returncode, sample.stdout.strip()))


if __name__ == "__main__":
    main()
