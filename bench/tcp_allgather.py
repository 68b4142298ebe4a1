#!/usr/bin/python3
"""The TCP allgather against two socket streams (issue 37 item 4): loom's 2-rank allgather
over loopback TCP (LOOM_TRANSPORT=tcp, out of place and in place) beside the plain socket
stream in both directions at once (bench/peers/tcp_stream.cc, BIDIR=1: a thread per
direction), with --old a second loom binary too (before / after a change).

    /usr/bin/python3 bench/tcp_allgather.py LOOM [--old OLD_LOOM] [--rounds 5]
                                            [--min 16M] [--max 256M] [--iters 10]

Two references per size: the stream reusing one 1 MiB buffer (cache-resident: what the
earlier rows of docs/perf.md divided by), and the stream walking a buffer as large as each
rank's message (SPAN = half the output), which reads and writes memory as the collective
does. A 2-rank allgather of S bytes sends S/2 each way; its rate per direction is S/2 over
its time, divided by the stream's per-direction rate. Interleaved rounds (new, old, the
streams), medians over rounds of each run's median iteration.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from bench_out import size  # noqa: E402
from heap_allgather import loom_rows, parse_size  # noqa: E402


def stream_gbps(binary, span):
    env = dict(os.environ, BIDIR="1", SPAN=str(span))
    out = subprocess.run([binary], check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])["gbps"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("loom")
    p.add_argument("--old", help="a second loom binary, measured in the same rounds")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min", type=parse_size, default=parse_size("16M"))
    p.add_argument("--max", type=parse_size, default=parse_size("256M"))
    p.add_argument("--iters", type=int, default=10)
    a = p.parse_args()
    peers = os.path.join(ROOT, "build", "peers")
    os.makedirs(peers, exist_ok=True)
    stream = os.path.join(peers, "tcp_stream")
    subprocess.run(["g++", "-O2", "-std=c++17", "-o", stream,
                    os.path.join(ROOT, "bench", "peers", "tcp_stream.cc"), "-lpthread"],
                   check=True)
    sizes = []
    s = a.min
    while s <= a.max:
        sizes.append(s)
        s *= 4
    runs = [("new", a.loom)] + ([("old", a.old)] if a.old else [])
    tcp = dict(os.environ, LOOM_TRANSPORT="tcp")
    got = {}  # key -> [value per round]
    for _ in range(a.rounds):
        for who, binary in runs:
            for k, t in loom_rows(binary, 2, a, tcp).items():
                got.setdefault((who,) + k, []).append(t)
        got.setdefault(("cached",), []).append(stream_gbps(stream, 0))
        for b in sizes:
            got.setdefault(("span", b), []).append(stream_gbps(stream, b // 2))
    med = {k: statistics.median(v) for k, v in got.items()}
    cached = med[("cached",)]
    print("\n2 ranks, loopback TCP, allgather (medians of %d interleaved rounds); the 1 MiB "
          "stream: %.2f GB/s per direction\n" % (a.rounds, cached))
    cols = ["size", "stream, message-sized buffers GB/s"]
    for who, _ in runs:
        for ip in ("out of place", "in place"):
            cols += ["%s %s GB/s" % (who, ip), "of the sized / 1 MiB stream"]
    print("| " + " | ".join(cols) + " |")
    print("|---" * len(cols) + "|")
    for b in sizes:
        ref = med[("span", b)]
        row = [size(b), "%.2f" % ref]
        for who, _ in runs:
            for ip in (False, True):
                rate = b / 2 / med[(who, b, ip)] / 1e3  # bytes / us -> GB/s
                row += ["%.2f" % rate, "%.0f%% / %.0f%%" % (100 * rate / ref, 100 * rate / cached)]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
