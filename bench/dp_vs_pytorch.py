#!/usr/bin/python3
"""Data-parallel training on this machine, in one run (docs/perf.md "Data parallel"):

  * `loom run -n 2` (1 thread per rank) vs one loom process with 2 threads, same model and
    global batch: tokens/s ratio (target >= 0.9), for ZeRO 0-3 (target: ZeRO-3 step time
    <= 1.15x ZeRO-0), with the share of the step spent waiting on communication;
  * PyTorch 1.13 DDP and DDP + ZeroRedundancyOptimizer over gloo, 2 ranks x 1 thread, same
    model and batch (target: loom >= 2x tokens/s);
  * model-state bytes per rank (allocator high-water mark) for ZeRO 0-3 at 1, 2 and 4 ranks
    next to the formulas.

    /usr/bin/python3 bench/dp_vs_pytorch.py LOOM DATA_DIR [--model small] [--steps 6]

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
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_vs_pytorch import SHAPES, V, adamw_groups, free_port, make_gpt  # noqa: E402


def torch_worker(name, rank, world, port, steps, zero, B):
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    model = DDP(make_gpt(name, B))
    if zero:
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    else:
        opt = torch.optim.AdamW(adamw_groups(model.module), lr=6e-4, betas=(0.9, 0.95))
    T = SHAPES[name][3]
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B, T))
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"step_s": statistics.median(times[1:])}))
    dist.destroy_process_group()


def torch_ddp(name, steps, zero, B):
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", name, str(r), "2", str(port),
                               str(steps), str(int(zero)), str(B)],
                              stdout=subprocess.PIPE, text=True, env=env) for r in range(2)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit("PyTorch DDP worker failed")
    return json.loads(outs[0].strip().splitlines()[-1])["step_s"]


def loom(loom_bin, data, name, steps, n, zero, micro, global_batch, threads):
    run_dir = tempfile.mkdtemp(prefix="loom-dp-bench-")
    shutil.rmtree(run_dir)
    cmd = [loom_bin, "train", "--set", "model.name=" + name, "--set", "data.path=" + data,
           "--set", "run.dir=" + run_dir, "--set", "train.steps=%d" % (steps + 1),
           "--set", "train.micro_batch=%d" % micro, "--set", "train.global_batch=%d" % global_batch,
           "--set", "train.seq_len=%d" % SHAPES[name][3], "--set", "train.threads=%d" % threads,
           "--set", "train.zero=%d" % zero, "--set", "eval.every=0", "--quiet"]
    if n > 1:
        cmd = [loom_bin, "run", "-n", str(n)] + cmd
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        ms = [json.loads(line) for line in f if line.strip()]
    shutil.rmtree(run_dir)
    later = ms[1:]
    step = statistics.median(m["step_ms"] for m in later) / 1e3
    wait = statistics.median(m["comm_wait_ms"] for m in later) / 1e3
    return step, wait, ms[-1]["state_peak_mb"]


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        a = sys.argv[2:]
        return torch_worker(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), a[5] == "1",
                            int(a[6]))
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("data")
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    name, steps = a.model, a.steps
    L, NH, C, T, B = SHAPES[name]
    G = 2 * B  # global batch: B sequences per rank on 2 ranks
    tokens = G * T

    one, _, _ = loom(a.loom, a.data, name, steps, 1, 0, B, G, 2)
    rows = [("loom, 1 process x 2 threads (accumulation 2)", one, 0.0)]
    two = {}
    for zero in (0, 1, 2, 3):
        step, wait, _ = loom(a.loom, a.data, name, steps, 2, zero, B, G, 1)
        two[zero] = step
        rows.append(("loom run -n 2 x 1 thread, ZeRO %d" % zero, step, wait))
    pt = torch_ddp(name, steps, False, B)
    pt_zero = torch_ddp(name, steps, True, B)
    rows.append(("PyTorch DDP (gloo), 2 ranks x 1 thread", pt, None))
    rows.append(("PyTorch DDP + ZeroRedundancyOptimizer (gloo), 2 x 1", pt_zero, None))
    print("%s, global batch %d x %d tokens, %d steps (median after the first):\n" %
          (name, G, T, steps))
    print("| configuration | step ms | tokens/s | vs 1 process | comm wait share |")
    print("|---|---|---|---|---|")
    for label, step, wait in rows:
        share = "-" if wait is None else "%.0f%%" % (100 * wait / step)
        print("| %s | %.0f | %.0f | %.2fx | %s |" % (label, step * 1e3, tokens / step,
                                                     one / step, share))
    print("\nZeRO-3 / ZeRO-0 step time on 2 ranks: %.2fx (target <= 1.15x)" % (two[3] / two[0]))
    print("loom ZeRO-0 / PyTorch DDP tokens/s: %.2fx; loom ZeRO-1 / PyTorch ZeRO optimizer: %.2fx "
          "(target >= 2x)" % (pt / two[0], pt_zero / two[1]))

    # Model state per rank, from the allocator's high-water mark.
    print("\n| ranks | ZeRO | model state per rank (MiB), measured | formula (MiB) |")
    print("|---|---|---|---|")
    for n in (1, 2, 4):
        for zero in (0, 1, 2, 3):
            _, _, mem = loom(a.loom, a.data, name, 1, n, zero, 1, n, 1)
            Vp = 50304
            psi = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
            formula = {0: 16 * psi, 1: 8 * psi + 8 * psi / n, 2: 4 * psi + 12 * psi / n,
                       3: 16 * psi / n}[zero if n > 1 else 0]
            extra = {2: " + a unit's gradient", 3: " + 2 gathered units"}.get(zero if n > 1 else 0,
                                                                               "")
            print("| %d | %d | %s | %.0f%s |" % (n, zero, " / ".join("%.0f" % m for m in mem),
                                                formula / (1 << 20), extra))


if __name__ == "__main__":
    main()
