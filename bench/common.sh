# shellcheck shell=bash
# Sourced by the collective benchmarks (run from the repository root).
#
# bench_start PREFIX [OUT_DIR]: sets `out` (OUT_DIR, or bench/out/PREFIX<date-time>) with
# empty results.jsonl and probe.jsonl, builds OpenMPI's peer into build/peers, sets `loom`.
bench_start() {
  out=${2:-bench/out/$1$(date +%Y%m%d-%H%M%S)}
  mkdir -p "$out" build/peers
  mpicc -O2 -o build/peers/mpi_bench bench/peers/mpi_bench.c
  # shellcheck disable=SC2034 # read by the sourcing script
  loom=build/apps/loom/loom
  : > "$out/results.jsonl"
  : > "$out/probe.jsonl"
}

# probe WHEN NRANKS: the machine probe (memcpy GB/s, core-to-core flag latency), tagged, appended
# to $out/probe.jsonl.
probe() { build/apps/loom/loom bench --probe | sed "s/^{/{\"when\":\"$1\",\"nranks\":$2,/" >> "$out/probe.jsonl"; }

# mpi_peer ROUND NRANKS [OP]: OpenMPI 4.1's mpi_bench on NRANKS ranks over MIN..MAX (x4),
# ITERS iterations, OP only or all three ops; its rows tagged with ROUND and appended to
# $out/results.jsonl.
mpi_peer() {
  # shellcheck disable=SC2086 # an absent OP is no argument
  mpirun --allow-run-as-root --oversubscribe -np "$2" build/peers/mpi_bench "$MIN" "$MAX" 4 \
    "$ITERS" ${3:-} | sed "s/^{/{\"round\":$1,/" >> "$out/results.jsonl"
}
