#!/usr/bin/env python3
"""Table of bench/shared_allreduce.sh: allreduce busbw (GB/s, median of rounds) of the shared
algorithm and ring, from shared buffers and from the heap, beside OpenMPI; %lim is the
shared algorithm's share of the copy limit, and the last column what naming the buffers
costs ring where the shared algorithm cannot run (heap buffers of separate processes)."""
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_out import load, print_machine_state, size  # noqa: E402

rows, probes = load(sys.argv[1])
print_machine_state(probes)
print()
runs = defaultdict(list)
for r in rows:
    if r["op"] == "allreduce":
        runs[(r["nranks"], r["bytes"], r.get("peer"), bool(r.get("inplace", False)))].append(r)


def pick(n, b, peer, ip=False):
    rs = sorted(runs.get((n, b, peer, ip), []), key=lambda r: r["time_us"])
    return rs[len(rs) // 2] if rs else None


def bw(x):
    return f"{x['busbw']:.2f}" if x else "-"


def ratio(x, y):
    return f"{x['busbw'] / y['busbw']:.2f}x" if x and y else "-"


for n in (2, 4):
    sizes = sorted({k[1] for k in runs if k[0] == n})
    if not sizes:
        continue
    print(f"### allreduce, {n} ranks (busbw GB/s, median of rounds)")
    print()
    print("| size | OpenMPI | ring (shared bufs) | shared | shared %lim | shared/OpenMPI | "
          "shared/ring | in place: ring | shared | shared/OpenMPI | heap: ring | "
          "shared algo (runs ring) | its cost |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b in sizes:
        mp = pick(n, b, "openmpi")
        ring, sh = pick(n, b, "loom-ring-shared"), pick(n, b, "loom-shared-shared")
        ring_ip = pick(n, b, "loom-ring-shared", True)
        sh_ip = pick(n, b, "loom-shared-shared", True)
        hr, hs = pick(n, b, "loom-ring-heap"), pick(n, b, "loom-shared-heap")
        lim = f"{100 * sh['of_limit']:.0f}%" if sh else "-"
        print(f"| {size(b)} | {bw(mp)} | {bw(ring)} | {bw(sh)} | {lim} | {ratio(sh, mp)} | "
              f"{ratio(sh, ring)} | {bw(ring_ip)} | {bw(sh_ip)} | {ratio(sh_ip, mp)} | "
              f"{bw(hr)} | {bw(hs)} | {ratio(hs, hr)} |")
    print()
