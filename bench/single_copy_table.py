#!/usr/bin/env python3
"""Tables of bench/single_copy.sh: busbw (GB/s) of loom with heap buffers (ring), loom with
shared buffers (read in place) and OpenMPI, the medians over rounds, with the copy limit
share (%lim) of loom's rows and the ratios to OpenMPI."""
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_out import load, print_machine_state, size  # noqa: E402

rows, probes = load(sys.argv[1])
print_machine_state(probes)
print()
med = defaultdict(list)
for r in rows:
    peer = r.get("peer")
    key = (r["op"], r["nranks"], r["bytes"], peer, bool(r.get("inplace", False)))
    med[key].append(r)


def pick(op, n, b, peer, ip):
    rs = med.get((op, n, b, peer, ip))
    if not rs:
        return None
    rs = sorted(rs, key=lambda r: r["time_us"])
    return rs[len(rs) // 2]


for op in ("allreduce", "allgather", "reduce_scatter"):
    for n in (2, 4):
        sizes = sorted({k[2] for k in med if k[0] == op and k[1] == n})
        if not sizes:
            continue
        print(f"### {op}, {n} ranks (busbw GB/s, median of rounds; %lim: share of the copy limit)")
        print()
        print("| size | OpenMPI | loom ring | loom shared | shared %lim | shared/OpenMPI | "
              "ring in place | shared in place | shared in place/OpenMPI |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for b in sizes:
            mp = pick(op, n, b, "openmpi", False)
            ring, sh = pick(op, n, b, "loom-ring", False), pick(op, n, b, "loom-shared", False)
            ring_ip, sh_ip = pick(op, n, b, "loom-ring", True), pick(op, n, b, "loom-shared", True)
            f = lambda x: f"{x['busbw']:.2f}" if x else "-"
            ratio = lambda x, y: f"{x['busbw'] / y['busbw']:.2f}x" if x and y else "-"
            lim = f"{100 * sh['of_limit']:.0f}%" if sh else "-"
            print(f"| {size(b)} | {f(mp)} | {f(ring)} | {f(sh)} | {lim} | {ratio(sh, mp)} | "
                  f"{f(ring_ip)} | {f(sh_ip)} | {ratio(sh_ip, mp)} |")
        print()
