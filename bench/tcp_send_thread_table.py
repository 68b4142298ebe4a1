#!/usr/bin/env python3
"""Medians of bench/tcp_send_thread.sh's rounds: loom's TCP allgather busbw (out of place)
per send-thread threshold, and its share of the bidirectional socket stream."""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_out import load, print_machine_state, size  # noqa: E402

rows, probes = load(sys.argv[1])
print_machine_state(probes)
streams = [r["gbps"] for r in rows if r.get("peer") == "socket"]
socket = statistics.median(streams)
loom = [r for r in rows if r.get("peer", "").startswith("loom") and not r["inplace"]]
peers = sorted({r["peer"] for r in loom}, key=lambda p: int(p.rsplit("-", 1)[1]))
print("socket stream, both directions: %.2f GB/s per direction (median of %d)" %
      (socket, len(streams)))
print("| size | " + " | ".join("%s busbw GB/s (share)" % p for p in peers) + " |")
print("|---" * (len(peers) + 1) + "|")
for b in sorted({r["bytes"] for r in loom}):
    cells = []
    for p in peers:
        v = statistics.median(r["busbw"] for r in loom if r["peer"] == p and r["bytes"] == b)
        cells.append("%.2f (%.0f%%)" % (v, 100 * v / socket))
    print("| %s | %s |" % (size(b), " | ".join(cells)))
