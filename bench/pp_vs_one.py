#!/usr/bin/python3
"""Pipeline parallelism on this machine, in one run (docs/perf.md "Pipeline parallelism"):

  * tokens/s of `loom run -n 2` with train.pp = 2 (1 thread per rank) for each schedule vs
    one loom process with 2 threads on the same global batch (M microbatches = the one
    process's accumulation steps; goal >= 0.85 with M >= 8), and zb-h1 vs 1f1b;
  * the measured bubble of each stage (time waiting for a neighbour over the rest of the
    step, `pp_wait_ms`) next to the schedule's formula, for pp 2 and pp 4 (4 ranks on 2
    cores: oversubscribed);
  * activations each stage holds at most, per schedule;
  * with --balanced instead: the four schedules on `small` with more blocks (24 for pp 2, 32
    for pp 4: the head is one stage's share), each stage's idle share next to the formula
    with unit costs and to the idle the schedule makes of the step's measured passes
    (`pp_schedule_idle_ms`: it counts the stages' imbalance and F, B, W as they are);
  * with --head-split: each schedule also with pp.head_split = true (stage 0 runs
    the tied head for a share of each microbatch's rows), in the same rounds;
  * with --memory instead: pp 2, each schedule with and without activation offload
    (train.offload_activations, horizon 1) and with pp.active_microbatches = 2: activations
    and peak RSS per stage, the bytes spilled and the step time.

    /usr/bin/python3 bench/pp_vs_one.py LOOM DATA_DIR [--model small] [--microbatches 8]
                                        [--steps 4] [--rounds R] [--seq-len T]
                                        [--memory | --balanced | --head-split]

Medians over the steps after the first. Prints markdown tables.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_vs_pytorch import SHAPES  # noqa: E402


def loom(a, n, threads, *extra):
    T = seq_len(a)
    run_dir = tempfile.mkdtemp(prefix="loom-pp-bench-")
    shutil.rmtree(run_dir)
    B = 2  # sequences per microbatch
    cmd = [a.loom, "train", "--set", "model.name=" + a.model, "--set", "data.path=" + a.data,
           "--set", "run.dir=" + run_dir, "--set", "train.steps=%d" % (a.steps + 1),
           "--set", "train.micro_batch=%d" % B,
           "--set", "train.global_batch=%d" % (B * a.microbatches),
           "--set", "train.seq_len=%d" % T, "--set", "train.threads=%d" % threads,
           "--set", "eval.every=0", "--quiet", *extra]
    if n > 1:
        cmd = [a.loom, "run", "-n", str(n)] + cmd
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        ms = [json.loads(line) for line in f if line.strip()][1:]
    shutil.rmtree(run_dir)
    step = statistics.median(m["step_ms"] for m in ms)
    out = {"step_ms": step, "tokens_per_s": statistics.median(m["tokens_per_s"] for m in ms)}
    if "pp_wait_ms" in ms[0]:
        ranks = len(ms[0]["pp_wait_ms"])
        med = lambda key, r: statistics.median(m[key][r] for m in ms)  # noqa: E731
        waits = [med("pp_wait_ms", r) for r in range(ranks)]
        out["bubble"] = [w / (step - w) for w in waits]
        # Each stage's passes (compute_ms), and its idle share as the formulas count it: the
        # step less the passes, the optimizer and the data, over the passes — whatever kept
        # the stage from computing (a neighbour, a transfer, the end of the step).
        out["compute_ms"] = [med("compute_ms", r) for r in range(ranks)]
        # Shares are taken per step, then their median (a median of each field alone would
        # mix the steps).
        share = lambda f, r: statistics.median(f(m, r) / m["compute_ms"][r] for m in ms)  # noqa
        out["idle"] = [share(lambda m, r: m["step_ms"] - m["compute_ms"][r] - m["optim_ms"][r] -
                             m["data_ms"][r], r) for r in range(ranks)]
        # The idle the schedule itself makes of each step's measured passes (transfers free).
        out["schedule_idle"] = [share(lambda m, r: m["pp_schedule_idle_ms"][r], r)
                                for r in range(ranks)]
        out["act_mb"] = ms[-1]["activation_mb"]
        out["rss_mb"] = ms[-1]["rss_peak_mb"]
        out["spilled_mb"] = sum(ms[-1].get("offload_mb", [0]))
    return out


def seq_len(a):
    """Tokens per sequence: --seq-len, or the model's shape in bench/train_vs_pytorch.py."""
    return a.seq_len or SHAPES[a.model][3]


def formula(schedule, P, M, V):
    f = (P - 1) / M
    return {"gpipe": f, "1f1b": f, "interleaved": f / V, "zb-h1": f / 3}[schedule]


# The four schedules and their virtual stages per rank.
SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1))


def pipeline(a, P, schedule, V, *extra):
    """`loom run -n P` with train.pp = P, 1 thread per rank."""
    return loom(a, P, 1, "--set", "train.pp=%d" % P, "--set", "pp.schedule=" + schedule,
                "--set", "pp.virtual_stages=%d" % V, *extra)


HEAD_SPLIT = ("--set", "pp.head_split=true")


def label(schedule, V):
    return schedule + (" (V %d)" % V if V > 1 else "")


def balanced(a):
    """The schedules on a model whose stages are balanced (more blocks of `small`, so the
    head is one stage's share, not more): each stage's idle share beside the schedule's own
    formula (issue 36: within 20%)."""
    M = a.microbatches
    print("%s with more blocks, %d microbatches of 2 x %d tokens per step, 1 thread per rank; "
          "idle share = (step - passes - optimizer - data) / passes, per stage\n" % (
              a.model, M, seq_len(a)))
    print("| pp | blocks | schedule | step ms | passes per stage (ms) | balance (max / min) | "
          "idle share per stage, measured | formula (unit costs) | measured / formula (mean of "
          "stages) | the schedule with the measured passes, per stage | measured / that, per "
          "stage |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for P, layers in ((2, a.layers2), (4, a.layers4)):
        for schedule, V in SCHEDULES:
            r = pipeline(a, P, schedule, V, "--set", "model.n_layer=%d" % layers)
            f = formula(schedule, P, M, V)
            c = r["compute_ms"]
            print("| %d | %d | %s | %.0f | %s | %.3f | %s | %.3f | %.2f | %s | %s |" % (
                P, layers, label(schedule, V), r["step_ms"],
                " / ".join("%.0f" % x for x in c), max(c) / min(c),
                " / ".join("%.3f" % x for x in r["idle"]), f,
                statistics.mean(r["idle"]) / f,
                " / ".join("%.3f" % x for x in r["schedule_idle"]),
                " / ".join("%.2f" % (x / y) for x, y in zip(r["idle"], r["schedule_idle"]))),
                flush=True)


def memory(a):
    print("%s, pp 2, %d microbatches of 2 x %d tokens per step, 1 thread per rank\n" % (
        a.model, a.microbatches, seq_len(a)))
    print("| schedule | variant | step ms | activations per stage (MiB) | peak RSS per stage (MiB)"
          " | spilled per step (MiB) |")
    print("|---|---|---|---|---|---|")
    variants = [("as is", []),
                ("activation offload", ["--set", "train.offload_activations=true", "--set",
                                        "train.activation_loading_horizon=1"]),
                ("2 active microbatches", ["--set", "pp.active_microbatches=2"])]
    for schedule, V in SCHEDULES:
        for name, extra in variants:
            if schedule == "interleaved" and "pp.active_microbatches=2" in extra:
                continue  # interleaved takes no cap
            r = pipeline(a, 2, schedule, V, *extra)
            print("| %s | %s | %.0f | %s | %s | %.0f |" % (
                label(schedule, V), name, r["step_ms"],
                " / ".join("%.0f" % x for x in r["act_mb"]),
                " / ".join("%.0f" % x for x in r["rss_mb"]), r["spilled_mb"]), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("data")
    ap.add_argument("--model", default="small")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=0,
                    help="tokens per sequence (default: the model's shape, 1024 for gpt2-124m)")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="interleaved rounds of the baseline and the pipelines (default table)")
    ap.add_argument("--balanced", action="store_true",
                    help="the idle-share table on a model with balanced stages")
    ap.add_argument("--head-split", action="store_true",
                    help="each schedule also with pp.head_split (default table)")
    ap.add_argument("--layers2", type=int, default=24, help="blocks for pp 2 with --balanced")
    ap.add_argument("--layers4", type=int, default=32, help="blocks for pp 4 with --balanced")
    a = ap.parse_args()
    M = a.microbatches
    if a.memory:
        memory(a)
        return
    if a.balanced:
        balanced(a)
        return
    # Rounds interleave the baseline with the pipelines: each ratio is taken within a round
    # (this host's speed moves by 20% over minutes), the table shows their medians.
    configs = [(P, schedule, V, split) for P in (2, 4) for schedule, V in SCHEDULES
               for split in ((False, True) if a.head_split else (False,))]
    ones, runs = [], {c: [] for c in configs}
    for _ in range(a.rounds):
        ones.append(loom(a, 1, 2))
        for P, schedule, V, split in configs:
            runs[(P, schedule, V, split)].append(
                pipeline(a, P, schedule, V, *(HEAD_SPLIT if split else ())))
    med = statistics.median
    print("%s, %d microbatches of 2 x %d tokens per step, %d round(s); one loom process x 2 "
          "threads: %s ms\n" % (a.model, M, seq_len(a), a.rounds,
                                " / ".join("%.0f" % o["step_ms"] for o in ones)))
    print("| pp | schedule | step ms | tokens/s | vs 1 process | bubble per stage, measured | "
          "formula | activations per stage (MiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for P, schedule, V, split in configs:
        rs = runs[(P, schedule, V, split)]
        r = sorted(rs, key=lambda x: x["step_ms"])[len(rs) // 2]  # the median run's details
        ratio = med([x["tokens_per_s"] / o["tokens_per_s"] for x, o in zip(rs, ones)])
        print("| %d | %s | %.0f | %.0f | %.2fx | %s | %.3f | %s |" % (
            P, label(schedule, V) + (", head split" if split else ""), r["step_ms"],
            r["tokens_per_s"], ratio, " / ".join("%.3f" % b for b in r["bubble"]),
            formula(schedule, P, M, V), " / ".join("%.0f" % x for x in r["act_mb"])))
    for P in (2, 4):
        for split in ((False, True) if a.head_split else (False,)):
            zb = [x["step_ms"] / y["step_ms"] for x, y in zip(runs[(P, "zb-h1", 1, split)],
                                                              runs[(P, "1f1b", 1, split)])]
            print("\npp %d%s: zb-h1 / 1f1b step time %.2fx (goal: below 1)" % (
                P, ", head split" if split else "", med(zb)))


if __name__ == "__main__":
    main()
