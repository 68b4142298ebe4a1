#!/usr/bin/env python3
"""Medians of bench/streaming_copy.sh's rounds: per op, buffers and size, loom's busbw out
of place with each LOOM_STREAMING_COPY_MIN (and its share of the copy limit), OpenMPI's, and
the ratio of the last threshold to streaming off."""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_out import load, print_machine_state, size  # noqa: E402

rows, probes = load(sys.argv[1])
print_machine_state(probes)
loom = [r for r in rows if r.get("peer", "").startswith("loom") and not r["inplace"]]
mpi = [r for r in rows if r.get("peer") == "openmpi"]
thresholds = sorted({int(r["peer"].rsplit("-", 1)[1]) for r in loom})


def med(rs, key):
    vals = [r[key] for r in rs]
    return statistics.median(vals) if vals else None


print("| op | buffers | size | " + " | ".join(
    "nt %s busbw (%%lim)" % ("off" if t == 0 else size(t)) for t in thresholds) +
    " | OpenMPI busbw | last / off |")
print("|---" * (len(thresholds) + 5) + "|")
for op in sorted({r["op"] for r in loom}):
    for buffers in ("heap", "shared"):
        for b in sorted({r["bytes"] for r in loom if r["op"] == op}):
            cells, bw = [], []
            for t in thresholds:
                rs = [r for r in loom if r["op"] == op and r["bytes"] == b and
                      r["peer"] == "loom-%s-nt-%d" % (buffers, t)]
                v, lim = med(rs, "busbw"), med(rs, "of_limit")
                bw.append(v)
                cells.append("-" if v is None else "%.2f (%.0f%%)" % (v, 100 * lim))
            m = med([r for r in mpi if r["op"] == op and r["bytes"] == b], "busbw")
            ratio = "%.2fx" % (bw[-1] / bw[0]) if bw[0] and bw[-1] else "-"
            print("| %s | %s | %s | %s | %s | %s |" % (
                op, buffers, size(b), " | ".join(cells), "-" if m is None else "%.2f" % m,
                ratio))
