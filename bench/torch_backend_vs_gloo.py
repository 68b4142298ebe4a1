#!/usr/bin/python3
"""torch.distributed with backend "loom" vs "gloo", same run (docs/perf.md "torch backend").

  * all_reduce, all_gather_into_tensor (gloo: all_gather into a list; it has no
    _allgather_base), reduce_scatter_tensor (gloo has none: loom only) at 2 and 4
    processes, 4 KiB - 256 MiB, float32, with loom twice: tensors on the heap (torch's
    allocator) and in loom's shared memory (loom_torch.use_shared_memory() before they are
    allocated); --rounds R interleaves R rounds of the three and takes each row's median;
    median time -> busbw (nccl-tests' definitions:
    allreduce 2(n-1)/n x bytes / t; allgather and reduce-scatter (n-1)/n x bytes / t, bytes
    being the whole gathered / scattered buffer);
  * DDP step time of a small GPT (bench/train_vs_pytorch.py's model) over each backend.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_backend_vs_gloo.py [--max 256M]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_vs_pytorch import free_port  # noqa: E402


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def torch_backend(backend):
    """The torch.distributed backend for one of ours: gloo, loom, or loom-shm (loom with
    loom_torch.use_shared_memory() on, before any tensor is allocated)."""
    if not backend.startswith("loom"):
        return backend
    import loom_torch
    if backend == "loom-shm":
        loom_torch.use_shared_memory()
    return "loom"


def worker(backend, rank, world, port, sizes, out):
    import torch
    import torch.distributed as dist
    backend = torch_backend(backend)
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world)
    rows = []
    for nbytes in sizes:
        n = nbytes // 4 // world * world  # a whole number of shards (3 processes)
        x = torch.ones(n)
        shard = torch.ones(n // world)
        full = torch.empty(n)
        parts = [torch.empty(n // world) for _ in range(world)]
        ops = {"all_reduce": lambda: dist.all_reduce(x)}
        if backend == "loom":
            ops["all_gather_into_tensor"] = lambda: dist.all_gather_into_tensor(full, shard)
            ops["reduce_scatter_tensor"] = lambda: dist.reduce_scatter_tensor(shard, full)
        else:
            ops["all_gather_into_tensor"] = lambda: dist.all_gather(parts, shard)
        for name, fn in ops.items():
            t0 = time.perf_counter()
            fn()  # warm-up; every rank then runs the same number of iterations (~2 s)
            warm = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(warm, op=dist.ReduceOp.MAX)
            iters = int(min(50, max(5, 2.0 / max(warm.item(), 1e-6))))
            times = []
            for _ in range(iters):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            # the slowest rank's median defines the operation's time
            t = torch.tensor([statistics.median(times)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            rows.append((name, nbytes, t.item()))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def ddp_worker(backend, rank, world, port, steps, out):
    import torch
    import torch.distributed as dist
    backend = torch_backend(backend)  # before the model: parameters and DDP's buckets shared
    sys.path.insert(0, HERE)
    from train_vs_pytorch import SHAPES, V, make_gpt
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world)
    name = "small"
    B, T = 2, SHAPES[name][3]
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(make_gpt(name, B))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, V, (B, T))
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x, x).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"step_s": statistics.median(times[1:])}, f)
    dist.destroy_process_group()


def spawn(args, world):
    port = free_port()
    out = "/tmp/loom-torch-bench-%d.json" % os.getpid()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, "--worker"] + args +
                              [str(r), str(world), str(port), out], env=env)
             for r in range(world)]
    for p in procs:
        if p.wait() != 0:
            sys.exit("worker failed: %s" % args)
    with open(out) as f:
        return json.load(f)


def main():
    if sys.argv[1:2] == ["--worker"]:
        a = sys.argv[2:]
        if a[0] == "ddp":
            return ddp_worker(a[1], int(a[3]), int(a[4]), int(a[5]), int(a[2]), a[6])
        sizes = [int(s) for s in a[1].split(",")]
        return worker(a[0], int(a[2]), int(a[3]), int(a[4]), sizes, a[5])
    ap = argparse.ArgumentParser()
    ap.add_argument("--min", default="4K")
    ap.add_argument("--max", default="256M")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--ddp-steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    sizes, s = [], parse_size(a.min)
    while s <= parse_size(a.max):
        sizes.append(s)
        s *= 4
    size_arg = ",".join(map(str, sizes))
    print("| procs | op | size | gloo busbw GB/s | loom (heap) | loom / gloo | "
          "loom (shared memory) | loom / gloo |")
    print("|---|---|---|---|---|---|---|---|")
    backends = ("gloo", "loom", "loom-shm")
    for world in [int(w) for w in a.worlds.split(",")]:
        times = {b: {} for b in backends}
        for _ in range(a.rounds):  # interleaved: each round runs the three one after another
            for b in backends:
                for op, n, t in spawn([b, size_arg], world):
                    times[b].setdefault((op, n), []).append(t)
        res = {b: {k: statistics.median(v) for k, v in times[b].items()} for b in backends}
        for op in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
            for n in sizes:
                factor = 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
                bw = {b: factor * n / res[b][(op, n)] / 1e9 if (op, n) in res[b] else None
                      for b in res}
                g = "%.2f" % bw["gloo"] if bw["gloo"] else "not supported"
                cells = []
                for b in ("loom", "loom-shm"):
                    cells += ["%.2f" % bw[b],
                              "%.1fx" % (bw[b] / bw["gloo"]) if bw["gloo"] else "-"]
                size = "%d KiB" % (n >> 10) if n < 1 << 20 else "%d MiB" % (n >> 20)
                print("| %d | %s | %s | %s | %s |" % (world, op, size, g, " | ".join(cells)))
    ddp = {b: spawn(["ddp", b, str(a.ddp_steps)], 2)["step_s"] for b in backends}
    print("\nDDP, GPT small (B=2 x 256 per rank), 2 ranks x 1 thread: gloo %.0f ms/step, "
          "loom %.0f ms/step (%.2fx), loom with shared memory %.0f ms/step (%.2fx)"
          % (ddp["gloo"] * 1e3, ddp["loom"] * 1e3, ddp["gloo"] / ddp["loom"],
             ddp["loom-shm"] * 1e3, ddp["gloo"] / ddp["loom-shm"]))


if __name__ == "__main__":
    main()
