#!/usr/bin/env bash
# Single copy (issue 12): loom's collectives with buffers on the heap (messages staged
# through the shared-memory rings) and in shared buffers (`loom bench --shared`: read in
# place by the receiver), beside OpenMPI 4.1's shared-memory path, in one run.
#
#   bash bench/single_copy.sh [OUT_DIR]        (needs scripts/setup.sh and a build/)
#
# ROUNDS interleaved rounds (loom ring, loom shared, OpenMPI, ...) for 2 and 4 ranks,
# allreduce / allgather / reduce_scatter, MIN..MAX (x4), f32, in and out of place for loom
# (OpenMPI out of place). The machine probe (memcpy GB/s, core-to-core flag latency) runs
# before and after each block. Writes JSON lines to OUT_DIR and prints the tables.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
bench_start single-copy- "${1:-}"
MIN=${MIN:-65536} MAX=${MAX:-268435456} ITERS=${ITERS:-20} ROUNDS=${ROUNDS:-3}
for ((round = 1; round <= ROUNDS; round++)); do
  for n in 2 4; do
    probe "before-r$round" "$n"
    for op in allreduce allgather reduce_scatter; do
      for mode in ring shared; do
        flag=""; [[ $mode == shared ]] && flag=--shared
        $loom bench --np "$n" --op "$op" --min "$MIN" --max "$MAX" --factor 4 --iters "$ITERS" \
          $flag --json - | sed "s/^{/{\"peer\":\"loom-$mode\",\"round\":$round,/" >> "$out/results.jsonl"
      done
    done
    mpi_peer "$round" "$n"
    probe "after-r$round" "$n"
  done
done
/usr/bin/python3 bench/single_copy_table.py "$out"
