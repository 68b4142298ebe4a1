#!/usr/bin/python3
"""ZeRO-3 with the machine-shared gather (zero.shared_gather = auto) against a gathered copy
per rank (off), in one run (docs/perf.md "The machine-shared allgather"):

  * step time and the share spent waiting on communication (metrics.jsonl, median of the
    steps after the first), `loom run -n N`, 1 thread per rank;
  * model-state bytes per rank (the allocator's high-water mark; a machine buffer counts
    1/ranks-per-machine on each rank) and the machine's real memory: the highest sum of the
    ranks' proportional set sizes (Pss, /proc/PID/smaps_rollup, which splits shared pages
    between the processes that map them), sampled every 0.1 s.

    /usr/bin/python3 bench/shared_gather_train.py LOOM DATA_DIR [--models small gpt2-124m]
        [--ranks 2 4] [--steps 4] [--rounds 2]

With --ab-env VAR=VALUE it compares instead the default environment ("off" column) with
VAR=VALUE set ("on"), at --zero Z (3 or 0) and zero.shared_gather = --shared-gather (off),
e.g. non-temporal stores: --ab-env LOOM_STREAMING_COPY_MIN=0 (then "on" is streaming off).

Modes alternate within each round (on, off, on, ...) so both see the same machine state.
Prints a markdown table.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

SEQ = {"small": 256, "gpt2-124m": 1024}


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open("/proc/%d/task/%d/children" % (p, p)) as f:
                kids = [int(x) for x in f.read().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


def pss_kib(pid):
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(loom, data, model, n, mode, steps, ab_env=None, zero=3, shared_gather="off"):
    """mode "auto"/"off": zero.shared_gather (ZeRO-3). With ab_env: "auto" sets it, "off"
    runs the default environment, both at `zero` with `shared_gather`."""
    env = dict(os.environ)
    if ab_env:
        if mode == "auto":
            var, value = ab_env.split("=", 1)
            env[var] = value
        mode = shared_gather
    run_dir = tempfile.mkdtemp(prefix="loom-sg-bench-")
    shutil.rmtree(run_dir)
    cmd = [loom, "run", "-n", str(n), loom, "train", "--set", "model.name=" + model,
           "--set", "data.path=" + data, "--set", "run.dir=" + run_dir,
           "--set", "train.steps=%d" % (steps + 1), "--set", "train.micro_batch=1",
           "--set", "train.global_batch=%d" % n, "--set", "train.seq_len=%d" % SEQ[model],
           "--set", "train.threads=1", "--set", "train.zero=%d" % zero,
           "--set", "zero.shared_gather=" + mode, "--set", "eval.every=0",
           "--set", "ckpt.every=0", "--quiet"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    peak = 0
    while p.poll() is None:
        ranks = [q for q in descendants(p.pid)]
        peak = max(peak, sum(pss_kib(q) for q in ranks))
        time.sleep(0.1)
    if p.returncode != 0:
        raise SystemExit("%s failed (%d)" % (" ".join(cmd), p.returncode))
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        ms = [json.loads(line) for line in f if line.strip()]
    shutil.rmtree(run_dir)
    later = [m for m in ms if "step_ms" in m][1:]
    return {"step_ms": statistics.median(m["step_ms"] for m in later),
            "wait_ms": statistics.median(m["comm_wait_ms"] for m in later),
            "state_mb": max(ms[-1]["state_peak_mb"]), "pss_mb": peak / 1024}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("data")
    ap.add_argument("--models", nargs="+", default=["small", "gpt2-124m"])
    ap.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ab-env", help="VAR=VALUE: compare the default environment with it set")
    ap.add_argument("--zero", type=int, default=3, help="with --ab-env: train.zero")
    ap.add_argument("--shared-gather", default="off", help="with --ab-env: zero.shared_gather")
    a = ap.parse_args()
    res = {}
    for rnd in range(a.rounds):
        for model in a.models:
            for n in a.ranks:
                for mode in (("auto", "off") if rnd % 2 == 0 else ("off", "auto")):
                    r = run(a.loom, a.data, model, n, mode, a.steps, a.ab_env, a.zero,
                            a.shared_gather)
                    res.setdefault((model, n, mode), []).append(r)
                    print("# round %d %s n=%d %s: %s" % (rnd + 1, model, n, mode, r), flush=True)
    on_name = a.ab_env or "shared"
    if a.ab_env:
        print("\n(zero %d, zero.shared_gather=%s)" % (a.zero, a.shared_gather))
    off_name = "default" if a.ab_env else "off"
    print("\n| model | ranks | step ms {1} → {0} | {0}/{1} | comm wait ms {1} → {0} "
          "| model state MiB/rank {1} → {0} | machine Pss MiB {1} → {0} |".format(on_name, off_name))
    print("|---|---:|---|---:|---|---|---|")
    for model in a.models:
        for n in a.ranks:
            off, on = res[(model, n, "off")], res[(model, n, "auto")]

            def med(rs, k):
                return statistics.median(r[k] for r in rs)
            print("| %s | %d | %.0f → %.0f | %.2fx | %.0f → %.0f | %.1f → %.1f | %.0f → %.0f |" % (
                model, n, med(off, "step_ms"), med(on, "step_ms"),
                med(on, "step_ms") / med(off, "step_ms"), med(off, "wait_ms"),
                med(on, "wait_ms"), med(off, "state_mb"), med(on, "state_mb"),
                med(off, "pss_mb"), med(on, "pss_mb")))


if __name__ == "__main__":
    main()
