#!/usr/bin/env bash
# The shared allreduce (issue 37 item 1): each rank reduces its block of every rank's input
# and writes it into every rank's output, against ring with the same buffers and OpenMPI 4.1,
# in one run.
#
#   bash bench/shared_allreduce.sh [OUT_DIR]        (needs scripts/setup.sh and a build/)
#
# ROUNDS interleaved rounds for 2 and 4 ranks, allreduce f32, MIN..MAX (x4), in and out of
# place: ring and shared from shared buffers (`loom bench --shared`), ring and shared from
# the heap (where the shared algorithm finds buffers no peer can map and runs ring after
# naming them: its cost there), OpenMPI (out of place). The machine probe runs before and
# after each block. Writes JSON lines to OUT_DIR and prints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
bench_start shared-allreduce- "${1:-}"
MIN=${MIN:-1048576} MAX=${MAX:-268435456} ITERS=${ITERS:-10} ROUNDS=${ROUNDS:-3}
for ((round = 1; round <= ROUNDS; round++)); do
  for n in 2 4; do
    probe "before-r$round" "$n"
    for mode in ring-shared shared-shared ring-heap shared-heap; do
      flag=""; [[ $mode == *-shared ]] && flag=--shared
      $loom bench --np "$n" --op allreduce --algo "${mode%-*}" --min "$MIN" --max "$MAX" \
        --factor 4 --iters "$ITERS" $flag --json - |
        sed "s/^{/{\"peer\":\"loom-$mode\",\"round\":$round,/" >> "$out/results.jsonl"
    done
    mpi_peer "$round" "$n" allreduce
    probe "after-r$round" "$n"
  done
done
/usr/bin/python3 bench/shared_allreduce_table.py "$out"
