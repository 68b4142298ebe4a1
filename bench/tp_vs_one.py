#!/usr/bin/python3
"""Tensor parallelism on this machine, in one run (docs/perf.md "Tensor parallelism"):

  * tokens/s of `loom run -n 2` with train.tp = 2 (1 thread per rank), with and without
    sequence parallelism, vs one loom process with 2 threads on the same batch (goal >= 0.8),
    with the share of the step spent in tensor-parallel collectives; PyTorch 1.13 on one
    process with 2 threads as the peer measured in the same run;
  * per-rank activation memory the blocks keep (measured: the model's buffers) next to
    loom's exact formula and Korthikanti et al.'s sbh(10 + 24/t + 5as/(ht)) and
    (sbh/t)(34 + 5as/h) (16-bit activations, with dropout masks);
  * tensor-parallel bytes per step (counted from the collectives issued, as a ring moves
    them) next to Megatron's volume per layer: 4 allreduces (2 forward, 2 backward) of sbh.

    /usr/bin/python3 bench/tp_vs_one.py LOOM DATA_DIR [--models small,gpt2-124m] [--steps 6]
                                                      [--repeats 3]

Each loom configuration runs --repeats times, round-robin (the machine's speed drifts by
~10% over minutes); a figure is the median over runs of each run's median over the steps
after the first. Prints markdown tables.
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
from train_vs_pytorch import SHAPES, run_child  # noqa: E402

MiB = 1 << 20


def loom(loom_bin, data, name, steps, tp, sp, threads):
    L, NH, C, T, B = SHAPES[name]
    run_dir = tempfile.mkdtemp(prefix="loom-tp-bench-")
    shutil.rmtree(run_dir)
    cmd = [loom_bin, "train", "--set", "model.name=" + name, "--set", "data.path=" + data,
           "--set", "run.dir=" + run_dir, "--set", "train.steps=%d" % (steps + 1),
           "--set", "train.micro_batch=%d" % B, "--set", "train.global_batch=%d" % B,
           "--set", "train.seq_len=%d" % T, "--set", "train.threads=%d" % threads,
           "--set", "train.tp=%d" % tp, "--set", "tp.sequence_parallel=%s" % str(sp).lower(),
           "--set", "eval.every=0", "--quiet"]
    if tp > 1:
        cmd = [loom_bin, "run", "-n", str(tp)] + cmd
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        ms = [json.loads(line) for line in f if line.strip()][1:]
    shutil.rmtree(run_dir)
    med = lambda k: statistics.median(m.get(k, 0) for m in ms)  # noqa: E731
    return {"step_s": med("step_ms") / 1e3, "tp_s": med("tp_comm_ms") / 1e3,
            "tp_mb": med("tp_comm_mb"), "block_act_mb": ms[-1]["block_activation_mb"][0]}


def pytorch(name, steps):
    env = dict(os.environ, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2")
    out, _ = run_child([sys.executable, os.path.join(os.path.dirname(__file__),
                                                     "train_vs_pytorch.py"),
                        "--worker", name, str(steps), "fp32"], env)
    return json.loads(out.strip().splitlines()[-1])["step_s"]


def formulas(name, t, sp):
    """Per-rank bytes the blocks keep: loom's accounting (fp32, no dropout) and Korthikanti
    et al.'s (16-bit, with dropout masks), summed over the layers."""
    L, a, h, s, b = SHAPES[name][0], SHAPES[name][1], SHAPES[name][2], SHAPES[name][3], \
        SHAPES[name][4]
    if sp:
        mine = (s * b * h * 16 + 4 * s * b + a * s * s * b) / t
        paper = s * b * h / t * (34 + 5 * a * s / h)
    else:
        mine = s * b * h * (4 + 12 / t) + 4 * s * b + a * s * s * b / t
        paper = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    return 4 * L * mine, L * paper


def volumes(name, t, sp):
    """Tensor-parallel bytes a rank sends per step (fp32), as a ring moves them: Megatron's
    four allreduces of sbh per layer, and loom's total (those, plus the vocab-parallel
    embedding's and head's reductions, the loss's three allreduces of sb floats and, with
    sequence parallelism, the LayerNorm outputs gathered again in backward and the
    LayerNorm gradients' allreduces)."""
    L, h, s, b = SHAPES[name][0], SHAPES[name][2], SHAPES[name][3], SHAPES[name][4]
    ar = 2 * (t - 1) / t  # allreduce: per byte of buffer
    ag = (t - 1) / t      # allgather / reduce-scatter of the whole buffer
    sbh = 4 * s * b * h
    megatron = L * 4 * ar * sbh
    if sp:
        # per layer: forward 2 allgathers + 2 reduce-scatters, backward 2 + 2 + 2 regathers,
        # 2 LayerNorm gradient allreduces of 2h floats; the embedding's reduce-scatter and
        # its backward's allgather; the head: allgather forward, reduce-scatter backward,
        # the final LayerNorm's gradients.
        mine = L * (10 * ag * sbh + 2 * ar * 8 * h) + 4 * ag * sbh + ar * 8 * h
    else:
        mine = megatron + 2 * ar * sbh  # embedding forward, head backward
    mine += 3 * ar * 4 * s * b  # the vocab-parallel loss
    return megatron, mine


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("data")
    ap.add_argument("--models", default="small,gpt2-124m")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    speed, memory, comm = [], [], []
    for name in a.models.split(","):
        L, NH, C, T, B = SHAPES[name]
        configs = ((1, False, 2), (2, False, 1), (2, True, 1))  # (tp, sequence parallel, threads)
        runs = [[loom(a.loom, a.data, name, a.steps, *c) for c in configs]
                for _ in range(a.repeats)]
        one, tp, tps = ({k: statistics.median(r[i][k] for r in runs) for k in runs[0][i]}
                        for i in range(len(configs)))
        pt = pytorch(name, a.steps)
        tokens = B * T
        for label, r in (("loom, 1 process x 2 threads", one), ("loom tp 2 x 1 thread", tp),
                         ("loom tp 2 + sequence parallel", tps)):
            speed.append((name, label, r["step_s"], tokens / r["step_s"],
                          one["step_s"] / r["step_s"], r["tp_s"] / r["step_s"]))
        speed.append((name, "PyTorch 1.13, 1 process x 2 threads", pt, tokens / pt,
                      one["step_s"] / pt, None))
        for label, r, t, sp in (("1 process", one, 1, False), ("tp 2", tp, 2, False),
                                ("tp 2 + sequence parallel", tps, 2, True)):
            mine, paper = formulas(name, t, sp)
            memory.append((name, label, r["block_act_mb"], mine / MiB, paper / MiB))
        for label, r, sp in (("tp 2", tp, False), ("tp 2 + sequence parallel", tps, True)):
            megatron, mine = volumes(name, 2, sp)
            comm.append((name, label, r["tp_mb"], mine / MiB, megatron / MiB))

    print("| model | configuration | step ms | tokens/s | vs 1 process | tp collectives share |")
    print("|---|---|---|---|---|---|")
    for name, label, step, tok, ratio, share in speed:
        print("| %s | %s | %.0f | %.0f | %.2fx | %s |" % (
            name, label, step * 1e3, tok, ratio, "-" if share is None else "%.0f%%" % (100 * share)))
    print("\n| model | layout | block activations per rank, measured (MiB) | loom's formula, "
          "fp32 (MiB) | Korthikanti et al., 16-bit (MiB) |")
    print("|---|---|---|---|---|")
    for name, label, got, mine, paper in memory:
        print("| %s | %s | %.1f | %.1f | %.1f |" % (name, label, got, mine, paper))
    print("\n| model | layout | tp bytes per step per rank, counted (MiB) | expected (MiB) | "
          "Megatron's 4 allreduces of sbh per layer (MiB) |")
    print("|---|---|---|---|---|")
    for name, label, got, mine, megatron in comm:
        print("| %s | %s | %.1f | %.1f | %.1f |" % (name, label, got, mine, megatron))


if __name__ == "__main__":
    main()
