#!/usr/bin/python3
"""Two loom binaries side by side on the pipeline schedules whose backward is whole (1F1B) or
split into B and W passes (ZB-H1), interleaved in each round (docs/perf.md "Pipeline
parallelism": ZB-H1's split backward against the bubble it removes):

    /usr/bin/python3 bench/split_backward_ab.py LOOM_A LOOM_B DATA_DIR [--model small]
        [--pp 2] [--microbatches 8] [--steps 3] [--rounds 2] [--seq-len T] [--head-split]

Per binary: the median step of each schedule over the rounds (each run's median over the
steps after the first), the stages' pass time (compute_ms), and ZB-H1 / 1F1B. Markdown.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pp_vs_one import HEAD_SPLIT, pipeline, seq_len  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loom_a")
    ap.add_argument("loom_b")
    ap.add_argument("data")
    ap.add_argument("--model", default="small")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=0)
    ap.add_argument("--head-split", action="store_true", help="pp.head_split = true")
    a = ap.parse_args()
    extra = HEAD_SPLIT if a.head_split else ()
    runs = {}  # (binary, schedule) -> [result per round]
    for _ in range(a.rounds):
        for which in ("loom_a", "loom_b"):
            a.loom = getattr(a, which)
            for schedule in ("1f1b", "zb-h1"):
                runs.setdefault((which, schedule), []).append(
                    pipeline(a, a.pp, schedule, 1, *extra))
    print("%s, pp %d%s, %d microbatches of 2 x %d tokens, 1 thread per rank, %d rounds\n" % (
        a.model, a.pp, " with pp.head_split" if a.head_split else "", a.microbatches,
        seq_len(a), a.rounds))
    print("| binary | 1F1B step ms | ZB-H1 step ms | ZB-H1 / 1F1B | passes per stage, 1F1B (ms) "
          "| passes per stage, ZB-H1 (ms) |")
    print("|---|---|---|---|---|---|")
    for which in ("loom_a", "loom_b"):
        med = {s: statistics.median(r["step_ms"] for r in runs[(which, s)])
               for s in ("1f1b", "zb-h1")}
        passes = {s: [statistics.median(r["compute_ms"][i] for r in runs[(which, s)])
                      for i in range(a.pp)] for s in ("1f1b", "zb-h1")}
        print("| %s | %.0f | %.0f | %.3f | %s | %s |" % (
            getattr(a, which), med["1f1b"], med["zb-h1"], med["zb-h1"] / med["1f1b"],
            " / ".join("%.0f" % x for x in passes["1f1b"]),
            " / ".join("%.0f" % x for x in passes["zb-h1"])))


if __name__ == "__main__":
    main()
