#!/usr/bin/env python3
"""Turns bench/comm_vs_peers.sh output (results.jsonl, probe.jsonl) into markdown tables:
busbw per size for loom (out-of-place), OpenMPI and Gloo, with loom/peer ratios."""
import json
import sys
from collections import defaultdict
from pathlib import Path

out = Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "results.jsonl").read_text().splitlines() if l.strip()]
probes = [json.loads(l) for l in (out / "probe.jsonl").read_text().splitlines() if l.strip()]

def size(b):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"

print("Machine state (core-to-core flag latency, ns; ~50 usual, ~210 slow):")
for p in probes:
    print(f"- {p['when']} ({p['nranks']} ranks): {p['flag_latency_ns']:.0f} ns, memcpy {p['memcpy_gbps']:.1f} GB/s")
print()

# Median over rounds of each (peer, op, ranks, size): the row whose time is the median.
groups = defaultdict(list)
for r in rows:
    if r.get("peer") in ("loom", "openmpi", "gloo") and not r.get("inplace", False):
        groups[(r["op"], r["nranks"], r["bytes"], r["peer"])].append(r)
table = defaultdict(dict)  # (op, n) -> bytes -> peer -> row
for (op, n, b, peer), rs in groups.items():
    rs.sort(key=lambda r: r["time_us"])
    table[(op, n)].setdefault(b, {})[peer] = rs[len(rs) // 2]
rounds = max((r.get("round", 1) for r in rows), default=1)
print(f"Each loom and OpenMPI figure is the median of {rounds} interleaved rounds "
      "(each round's figure is itself the median of the timed iterations).")
print()

for (op, n), by_size in sorted(table.items()):
    print(f"### {op}, {n} ranks (busbw GB/s; time in us for sizes below 64 KiB)")
    print()
    print("| size | loom algo | loom | OpenMPI | Gloo | loom/OpenMPI | loom/Gloo |")
    print("|---|---|---|---|---|---|---|")
    for b in sorted(by_size):
        p = by_size[b]
        lo, mp, gl = p.get("loom"), p.get("openmpi"), p.get("gloo")
        def fmt(x):
            if not x:
                return "-"
            return f"{x['busbw']:.2f}" if b >= 65536 else f"{x['busbw']:.2f} ({x['time_us']:.1f} us)"
        def ratio(x, y):
            if not x or not y:
                return "-"
            return f"{x['busbw'] / y['busbw']:.1f}x" if b >= 65536 else f"{y['time_us'] / x['time_us']:.1f}x"
        print(f"| {size(b)} | {lo['algo'] if lo else '-'} | {fmt(lo)} | {fmt(mp)} | {fmt(gl)} | {ratio(lo, mp)} | {ratio(lo, gl)} |")
    print()

tcp = [r for r in rows if r.get("peer") == "loom-tcp" and not r.get("inplace")]
sock = {r["bidir"]: r["gbps"] for r in rows if r.get("peer") == "socket"}
if tcp:
    print("### allgather over TCP (LOOM_TRANSPORT=tcp, 2 ranks) vs a plain loopback socket stream")
    print()
    print(f"Socket stream: one direction {sock.get(False, 0):.2f} GB/s, both directions at once {sock.get(True, 0):.2f} GB/s per direction.")
    print()
    print("| size | loom algbw GB/s | share of the one-way socket stream | share of the bidirectional stream |")
    print("|---|---|---|---|")
    for r in sorted(tcp, key=lambda r: r["bytes"]):
        # A 2-rank allgather moves size/2 bytes each way per rank, both directions at once.
        per_dir = r["bytes"] / 2 / r["time_us"] / 1e3
        print(f"| {size(r['bytes'])} | {r['algbw']:.2f} | {per_dir / sock.get(False, 1):.0%} | {per_dir / sock.get(True, 1):.0%} |")
