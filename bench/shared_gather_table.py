#!/usr/bin/env python3
"""Tables of bench/shared_gather.sh: allgather busbw (GB/s) of OpenMPI, loom through the
rings, loom from shared buffers and loom's allgather_shared, medians over rounds, with
allgather_shared's share of its copy limit and its ratio to OpenMPI."""
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_out import load, print_machine_state, size  # noqa: E402

rows, probes = load(sys.argv[1])
print_machine_state(probes)
wrong = sum(r.get("wrong", 0) for r in rows if r.get("wrong", 0) > 0)
print(f"Wrong elements in loom's checked rows: {wrong}")
by = defaultdict(list)
for r in rows:
    by[(r["nranks"], r["bytes"], r["peer"])].append(r)
peers = ["openmpi", "loom-ring", "loom-shared", "loom-machine"]
for n in sorted({r["nranks"] for r in rows}):
    print(f"\n#### allgather, {n} ranks (busbw GB/s, median of rounds)\n")
    print("| size | OpenMPI | loom ring | loom shared buffers | loom allgather_shared "
          "| allgather_shared %lim | allgather_shared/OpenMPI |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for b in sorted({r["bytes"] for r in rows if r["nranks"] == n}):
        med = {}
        for p in peers:
            rs = by.get((n, b, p))
            med[p] = statistics.median(r["busbw"] for r in rs) if rs else None
        lim = by.get((n, b, "loom-machine"))
        lim_txt = f"{100 * statistics.median(r['of_limit'] for r in lim):.0f}%" if lim else "-"
        cell = [f"{med[p]:.2f}" if med[p] else "-" for p in peers]
        ratio = (f"**{med['loom-machine'] / med['openmpi']:.2f}x**"
                 if med["loom-machine"] and med["openmpi"] else "-")
        print(f"| {size(b)} | " + " | ".join(cell) + f" | {lim_txt} | {ratio} |")
