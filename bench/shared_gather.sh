#!/usr/bin/env bash
# The machine-shared allgather (issue 12 item 2): `loom bench --op allgather_shared` (one
# output buffer per machine, each rank copies only its own block) beside loom's allgather
# with heap buffers (the rings), with shared buffers (`--shared`: read in place) and
# OpenMPI 4.1's MPI_Allgather, in one run.
#
#   bash bench/shared_gather.sh [OUT_DIR]        (needs scripts/setup.sh and a build/)
#
# ROUNDS interleaved rounds for 2 and 4 ranks, MIN..MAX (x4), f32, out of place. busbw is
# allgather's in every row (algbw x (n-1)/n), so the rows compare as times do. The machine
# probe (memcpy GB/s, core-to-core flag latency) runs before and after each block.
# MODES (default "ring shared machine") picks loom's rows; OpenMPI runs in every round.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
bench_start shared-gather- "${1:-}"
MIN=${MIN:-65536} MAX=${MAX:-268435456} ITERS=${ITERS:-20} ROUNDS=${ROUNDS:-3}
MODES=${MODES:-ring shared machine}
for ((round = 1; round <= ROUNDS; round++)); do
  for n in 2 4; do
    probe "before-r$round" "$n"
    for mode in $MODES; do
      op=allgather flag=""
      [[ $mode == shared ]] && flag=--shared
      [[ $mode == machine ]] && op=allgather_shared
      $loom bench --np "$n" --op "$op" --min "$MIN" --max "$MAX" --factor 4 --iters "$ITERS" \
        $flag --json - | grep '"inplace":false' |
        sed "s/^{/{\"peer\":\"loom-$mode\",\"round\":$round,/" >> "$out/results.jsonl"
    done
    mpi_peer "$round" "$n" allgather
    probe "after-r$round" "$n"
  done
done
/usr/bin/python3 bench/shared_gather_table.py "$out"
