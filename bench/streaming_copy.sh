#!/usr/bin/env bash
# Non-temporal stores for large received messages (LOOM_STREAMING_COPY_MIN): loom's 2-rank
# allgather, allreduce and reduce_scatter from heap and from shared buffers, with streaming
# copies off (0) and from each threshold in THRESHOLDS, beside OpenMPI, in ROUNDS interleaved
# rounds with the machine probe before each; prints the medians and the share of the copy
# limit (loom bench's %lim).
#
#   bash bench/streaming_copy.sh [OUT_DIR]        (needs scripts/setup.sh and a build/)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
bench_start streaming-copy- "${1:-}"
MIN=${MIN:-1048576} MAX=${MAX:-268435456} ITERS=${ITERS:-10} ROUNDS=${ROUNDS:-3}
THRESHOLDS=${THRESHOLDS:-0 8388608} OPS=${OPS:-allgather allreduce reduce_scatter}
for ((round = 1; round <= ROUNDS; round++)); do
  probe "before-r$round" 2
  for op in $OPS; do
    for buffers in heap shared; do
      flag=
      if [[ $buffers == shared ]]; then flag=--shared; fi
      for t in $THRESHOLDS; do
        # shellcheck disable=SC2086 # $flag is empty or one word
        LOOM_STREAMING_COPY_MIN=$t $loom bench --np 2 --op "$op" $flag --min "$MIN" \
          --max "$MAX" --factor 4 --iters "$ITERS" --no-check --json - |
          sed "s/^{/{\"peer\":\"loom-$buffers-nt-$t\",\"round\":$round,/" >> "$out/results.jsonl"
      done
    done
  done
  mpi_peer "$round" 2
done
probe after 2
/usr/bin/python3 bench/streaming_copy_table.py "$out"
