#!/usr/bin/env python3
"""2-rank small-message latency, loom against OpenMPI (issue 12 item 3), in one run.

    /usr/bin/python3 bench/small_msgs.py [--loom BIN[=LABEL] ...] [--rounds 3]
        [--min 8] [--max 16384] [--iters 20000]

Each round runs every loom binary given (e.g. a build of the tree before a change and one
after) and OpenMPI's peer (bench/peers/mpi_bench.c) back to back, allreduce and allgather
over f32 at MIN..MAX bytes (x2); the table is the median of the rounds of each one's
per-call time in us (loom bench's and the peer's own medians over their iterations), with
the core-to-core flag latency probed before and after (this host's speed drifts).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sizes(lo, hi):
    s, v = [], lo
    while v <= hi:
        s.append(v)
        v *= 2
    return s


def run_loom(binary, op, lo, hi, iters):
    out = subprocess.run([binary, "bench", "--np", "2", "--op", op, "-b", str(lo), "-e", str(hi),
                          "-f", "2", "-n", str(iters), "-w", "2000", "--no-check", "--json", "-"],
                         check=True, capture_output=True, text=True).stdout
    res = {}
    for line in out.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if not row["inplace"]:  # out of place, as the peer runs
                res[row["bytes"]] = row["time_us"]
    return res


def run_mpi(peer, lo, hi, iters):
    out = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", peer,
                          str(lo), str(hi), "2", str(iters)],
                         check=True, capture_output=True, text=True).stdout
    res = {}
    for line in out.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            res[(row["op"], row["bytes"])] = row["time_us"]
    return res


def probe(binary):
    out = subprocess.run([binary, "bench", "--probe"], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", action="append", default=[],
                    help="BIN[=LABEL], repeatable (default build/apps/loom/loom)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min", type=int, default=8)
    ap.add_argument("--max", type=int, default=16384)
    ap.add_argument("--iters", type=int, default=20000)
    a = ap.parse_args()
    looms = []
    for spec in a.loom or [os.path.join(ROOT, "build/apps/loom/loom")]:
        b, _, label = spec.partition("=")
        looms.append((b, label or "loom"))
    peer = os.path.join(ROOT, "build/peers/mpi_bench")
    os.makedirs(os.path.dirname(peer), exist_ok=True)
    subprocess.run(["mpicc", "-O2", "-o", peer, os.path.join(ROOT, "bench/peers/mpi_bench.c")],
                   check=True)
    ops = ["allreduce", "allgather"]
    times = {}  # (label, op, bytes) -> [us per round]
    flags = []
    for rnd in range(a.rounds):
        flags.append(probe(looms[0][0]).get("flag_latency_ns"))
        for b, label in looms:
            for op in ops:
                for k, v in run_loom(b, op, a.min, a.max, a.iters).items():
                    times.setdefault((label, op, k), []).append(v)
        for (op, k), v in run_mpi(peer, a.min, a.max, a.iters).items():
            if op in ops:
                times.setdefault(("OpenMPI", op, k), []).append(v)
        print("round %d done" % (rnd + 1), file=sys.stderr)
    flags.append(probe(looms[0][0]).get("flag_latency_ns"))
    labels = [l for _, l in looms]
    print("flag latency (ns) at each round's start and at the end: %s" % flags)
    print()
    print("| op | bytes | " + " | ".join(labels) + " | OpenMPI | " +
          " | ".join("%s / OpenMPI" % l for l in labels) + " |")
    print("|---|---:|" + "---:|" * (2 * len(labels) + 1))
    for op in ops:
        for k in sizes(a.min, a.max):
            mpi = times.get(("OpenMPI", op, k))
            if not mpi:
                continue
            m = statistics.median(mpi)
            ours = [statistics.median(times[(l, op, k)]) for l in labels]
            print("| %s | %d | %s | %.2f | %s |" % (
                op, k, " | ".join("%.2f" % t for t in ours), m,
                " | ".join("%.2fx" % (t / m) for t in ours)))


if __name__ == "__main__":
    main()
