#!/usr/bin/env bash
# loom's collectives side by side with OpenMPI 4.1 and Gloo on this machine, in one run.
#
#   bash bench/comm_vs_peers.sh [OUT_DIR]        (needs scripts/setup.sh and a build/)
#
# For 2 and 4 ranks, 4 KiB .. 256 MiB (x4), f32: loom allreduce / allgather /
# reduce_scatter (shm), OpenMPI MPI_Allreduce / MPI_Allgather / MPI_Reduce_scatter_block,
# Gloo's ring allreduce and allgather over loopback TCP; then loom allgather with
# LOOM_TRANSPORT=tcp against a plain two-process socket stream. The core-to-core flag
# probe runs before and after each block so ratios are compared in one machine state.
# Writes JSON lines to OUT_DIR and prints the markdown tables for docs/perf.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/out/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
peers=build/peers
mkdir -p "$peers"
mpicc -O2 -o "$peers/mpi_bench" bench/peers/mpi_bench.c
g++ -O2 -std=c++17 -o "$peers/gloo_bench" bench/peers/gloo_bench.cc -lgloo -lpthread
g++ -O2 -std=c++17 -o "$peers/tcp_stream" bench/peers/tcp_stream.cc -lpthread
loom=build/apps/loom/loom
MIN=${MIN:-4096} MAX=${MAX:-268435456} FACTOR=${FACTOR:-4} ITERS=${ITERS:-20}
source bench/common.sh  # probe

run_gloo() {
  local n=$1 dir
  dir=$(mktemp -d)
  for ((r = 0; r < n; r++)); do
    RANK=$r SIZE=$n STORE_DIR=$dir "$peers/gloo_bench" "$MIN" "$MAX" "$FACTOR" "$ITERS" > "$dir/out$r" &
  done
  wait
  cat "$dir/out0"
  rm -rf "$dir"
}

# ROUNDS interleaved rounds (loom, OpenMPI, Gloo, loom, ...): the table takes the median of
# the rounds, so a noisy minute on this shared VM does not decide a ratio.
ROUNDS=${ROUNDS:-3}
for ((round = 1; round <= ROUNDS; round++)); do
  for n in 2 4; do
    probe "before-r$round" "$n"
    for op in allreduce allgather reduce_scatter; do
      $loom bench --np "$n" --op "$op" --min "$MIN" --max "$MAX" --factor "$FACTOR" \
        --iters "$ITERS" --json - | sed "s/^{/{\"peer\":\"loom\",\"round\":$round,/" >> "$out/results.jsonl"
    done
    mpirun --allow-run-as-root --oversubscribe -np "$n" "$peers/mpi_bench" "$MIN" "$MAX" "$FACTOR" \
      "$ITERS" | sed "s/^{/{\"round\":$round,/" >> "$out/results.jsonl"
    if ((round == 1)); then  # Gloo is 10-100x behind; one round is enough to place it
      run_gloo "$n" | sed "s/^{/{\"round\":$round,/" >> "$out/results.jsonl"
    fi
    probe "after-r$round" "$n"
  done
done
# TCP: loom allgather forced onto TCP vs the loopback socket ceiling.
probe before-tcp 2
LOOM_TRANSPORT=tcp $loom bench --np 2 --op allgather --min 1M --max 256M --factor 4 \
  --iters "$ITERS" --json - | sed 's/^{/{"peer":"loom-tcp",/' >> "$out/results.jsonl"
"$peers/tcp_stream" >> "$out/results.jsonl"
BIDIR=1 "$peers/tcp_stream" >> "$out/results.jsonl"
probe after-tcp 2
/usr/bin/python3 bench/perf_table.py "$out"
