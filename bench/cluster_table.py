#!/usr/bin/env python3
"""Turns bench/cluster_vs_peers.sh output (results.jsonl) into a markdown table per layout:
algbw (GB/s, out of place) of loom (the algorithm auto chose, and every other valid one),
OpenMPI and Gloo, medians over rounds, and loom's share of the machine link's limit: the
bytes each machine's link carries at best ((h-1)/h N for allgather and reduce_scatter,
2(h-1)/h N for allreduce, h machines) over iperf3's bandwidth on the same links."""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

out = Path(sys.argv[1])
rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()
        if line.strip()]


def size(b):  # sizes are rounded down to a multiple of the rank count: 1048560 B is "1 MiB"
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= 0.99 * k:
            return "%g %s" % (round(b / k, 1), unit)
    return "%d B" % b


def med(xs):
    return statistics.median(xs) if xs else None


layouts = sorted({r["layout"] for r in rows}, key=lambda s: tuple(map(int, s.split("x"))))
for layout in layouts:
    rs = [r for r in rows if r["layout"] == layout and not r.get("inplace", False)]
    h = int(layout.split("x")[0])
    gbps = [r["gbps"] for r in rs if r.get("peer") == "iperf3"]
    link = gbps[0] / 8 if gbps else None  # GB/s
    print("\n%s (%s machines x %s ranks), links %s; iperf3 %.2f Gbit/s\n" %
          (layout, h, layout.split("x")[1], rs[0]["rate"], gbps[0] if gbps else float("nan")))
    tuned = any(r.get("peer") == "openmpi-tuned" for r in rs)  # MPI_MCA was set
    print("| op | size | loom (auto) | %% of link limit | other loom algorithms | OpenMPI | "
          "loom/OpenMPI | %sGloo | loom/Gloo |" % (
              "OpenMPI tuned | loom/OpenMPI tuned | " if tuned else ""))
    print("|---|---|---|---|---|---|---|---|---|%s" % ("---|---|" if tuned else ""))
    auto, forced, peer = defaultdict(list), defaultdict(dict), defaultdict(list)
    for r in rs:
        if r.get("peer") == "iperf3":
            continue
        key = (r["op"], r["bytes"])
        if r.get("choice") == "auto":
            auto[key].append(r)
        elif r.get("choice") == "forced":
            forced[key][r["algo"]] = r["algbw"]
        elif r.get("peer") in ("openmpi", "openmpi-tuned", "gloo"):
            peer[(r["peer"],) + key].append(r["algbw"])
    for op in ("allreduce", "allgather", "reduce_scatter"):
        for b in sorted({k[1] for k in auto if k[0] == op}):
            a = auto[(op, b)]
            bw = med([r["algbw"] for r in a])
            algo = a[0]["algo"]
            limit = link * h / ((2 if op == "allreduce" else 1) * (h - 1)) if link else None
            others = ", ".join("%s %.3f" % (k, v) for k, v in sorted(forced[(op, b)].items())
                               if k != algo)
            mpi = med(peer[("openmpi", op, b)])
            gloo = med(peer[("gloo", op, b)])
            peers = [mpi]
            if tuned:
                peers.append(med(peer[("openmpi-tuned", op, b)]))
            ratios = " | ".join("%s | %s" % ("%.3f" % x if x else "-",
                                             "%.2fx" % (bw / x) if x else "-") for x in peers)
            print("| %s | %s | %s %.3f | %s | %s | %s | %s | %s |" % (
                op, size(b), algo, bw, "%.0f%%" % (100 * bw / limit) if limit else "",
                others or "-", ratios, "%.3f" % gloo if gloo else "-",
                "%.2fx" % (bw / gloo) if gloo else "-"))
