#!/usr/bin/python3
"""Allgather from heap buffers inside one machine (issue 37 item 2): loom's ring, whose
messages go through the shared-memory rings, beside OpenMPI 4.1's MPI_Allgather (vader,
cross-memory attach: one copy) in one run; with --old, a second loom binary too (before /
after a change).

    /usr/bin/python3 bench/heap_allgather.py LOOM [--old OLD_LOOM] [--np 2,4] [--rounds 5]
                                             [--min 64K] [--max 256M] [--iters 40]

Interleaved rounds (loom, old loom, OpenMPI, loom, ...), out of place, f32, sizes MIN..MAX
(x4, the whole output); each figure is the median over the rounds of each run's median
iteration. Prints a markdown table per rank count: time, OpenMPI / loom (above 1: loom is
faster) and old / new. Needs mpicc and mpirun (scripts/setup.sh).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from bench_out import size  # noqa: E402  (64 KiB, 1 MiB: as docs/perf.md writes sizes)


def parse_size(s):  # 64K, 1M, 256M
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def loom_rows(binary, n, a, env=None):
    """`loom bench`'s allgather over a.min..a.max (x4): {(bytes, in place): median µs}."""
    out = subprocess.run([binary, "bench", "--np", str(n), "--op", "allgather", "--min",
                          str(a.min), "--max", str(a.max), "--factor", "4", "--iters",
                          str(a.iters), "--json", "-"], check=True, capture_output=True,
                         text=True, env=env).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {(r["bytes"], r["inplace"]): r["time_us"] for r in rows}


def loom_times(binary, n, a):  # out of place: {bytes: µs}
    return {b: t for (b, inplace), t in loom_rows(binary, n, a).items() if not inplace}


def mpi_times(mpi_bench, n, a):
    out = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n),
                          mpi_bench, str(a.min), str(a.max), "4", str(a.iters), "allgather"],
                         check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {r["bytes"]: r["time_us"] for r in rows if r["op"] == "allgather"}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("loom")
    p.add_argument("--old", help="a second loom binary, measured in the same rounds")
    p.add_argument("--np", default="2,4")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min", type=parse_size, default=parse_size("64K"))
    p.add_argument("--max", type=parse_size, default=parse_size("256M"))
    p.add_argument("--iters", type=int, default=40)
    a = p.parse_args()
    peers = os.path.join(ROOT, "build", "peers")
    os.makedirs(peers, exist_ok=True)
    mpi_bench = os.path.join(peers, "mpi_bench")
    subprocess.run(["mpicc", "-O2", "-o", mpi_bench,
                    os.path.join(ROOT, "bench", "peers", "mpi_bench.c")], check=True)
    runs = [("loom", a.loom)] + ([("old", a.old)] if a.old else [])
    for n in [int(x) for x in a.np.split(",")]:
        got = {}  # (who, bytes) -> [time per round]
        for _ in range(a.rounds):
            for who, binary in runs:
                for b, t in loom_times(binary, n, a).items():
                    got.setdefault((who, b), []).append(t)
            for b, t in mpi_times(mpi_bench, n, a).items():
                got.setdefault(("openmpi", b), []).append(t)
        med = {k: statistics.median(v) for k, v in got.items()}
        print("\n%d ranks, heap buffers, out of place (medians of %d interleaved rounds)\n" %
              (n, a.rounds))
        head = "| size | loom µs | OpenMPI µs | OpenMPI / loom |"
        print(head + (" old loom µs | old / new |" if a.old else ""))
        print("|---" * (4 + (2 if a.old else 0)) + "|")
        for b in sorted({k[1] for k in med}):
            lo, mp = med[("loom", b)], med[("openmpi", b)]
            row = "| %s | %.1f | %.1f | %.2f× |" % (size(b), lo, mp, mp / lo)
            if a.old:
                row += " %.1f | %.2f× |" % (med[("old", b)], med[("old", b)] / lo)
            print(row)


if __name__ == "__main__":
    main()
