#!/usr/bin/env bash
# loom's collectives across emulated machines (tests/cluster/cluster.sh: network namespaces,
# links shaped with tbf) beside iperf3 on the same links, OpenMPI 4.1 (mpirun reaching the
# machines through bench/peers/netns_rsh.sh as its remote shell agent) and Gloo, in one run.
#
#   bash bench/cluster_vs_peers.sh [OUT_DIR]       (root; needs scripts/setup.sh and a build/)
#
# For each LAYOUT (machines x ranks per machine, default "2x1 3x1 2x2 3x2") at RATE
# (default 2gbit): iperf3 between machines 0 and 1, then ROUNDS interleaved rounds of loom
# (the algorithm auto chooses; round 1 also every other valid one), OpenMPI and (round 1)
# Gloo, allreduce / allgather / reduce_scatter (OPS), MIN..MAX bytes (ALGOS: the algorithms
# forced in round 1, "" for none; direct on 8 ranks at 256 MiB takes minutes a size). Prints
# the markdown table for docs/perf.md (bench/cluster_table.py): each figure is also a share
# of the machine link's limit, the bytes each machine's link must carry over iperf3's
# bandwidth.
# MPI_MCA="name=value ...": every round also runs OpenMPI with these MCA parameters (e.g.
# "btl_tcp_links=2 btl_tcp_sndbuf=4194304 btl_tcp_rcvbuf=4194304", loom's two streams and
# socket buffers), a second peer column ("OpenMPI tuned").
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/out/cluster-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
src=$PWD
C=$src/tests/cluster/cluster.sh
loom=$src/build/apps/loom/loom
peers=$src/build/peers
mkdir -p "$peers"
mpicc -O2 -o "$peers/mpi_bench" bench/peers/mpi_bench.c
g++ -O2 -std=c++17 -o "$peers/gloo_bench" bench/peers/gloo_bench.cc -lgloo -lpthread
LAYOUTS=${LAYOUTS:-"2x1 3x1 2x2 3x2"} RATE=${RATE:-2gbit} ROUNDS=${ROUNDS:-3}
MIN=${MIN:-1048576} MAX=${MAX:-67108864} FACTOR=${FACTOR:-8} ITERS=${ITERS:-5}
ALGOS=${ALGOS-"ring direct hier"}  # forced in round 1 beside auto's choice; ALGOS="" for none
OPS=${OPS:-"allreduce allgather reduce_scatter"}  # one op: OpenMPI runs only that one too
MPI_MCA=${MPI_MCA:-}
trap 'bash "$C" down' EXIT
addr() { echo "10.77.0.$(($1 + 1))"; }
tag() { sed "s/^{/{\"layout\":\"$1\",\"rate\":\"$RATE\",${2:-}/"; }

run_loom() {  # run_loom M K LAYOUT EXTRA... : loom bench on M machines x K ranks
  local m=$1 k=$2 layout=$3 port=$((29800 + RANDOM % 100)) tok
  shift 3
  tok=$(openssl rand -hex 16)
  local pids=()
  for ((r = 0; r < m * k; r++)); do
    bash "$C" exec $((r / k)) env LOOM_RANK=$r LOOM_WORLD_SIZE=$((m * k)) LOOM_LOCAL_RANK=$((r % k)) \
      LOOM_LOCAL_WORLD_SIZE="$k" LOOM_STORE="tcp://$(addr 0):$port" LOOM_JOB_TOKEN="$tok" \
      "$loom" bench --min "$MIN" --max "$MAX" --factor "$FACTOR" --iters "$ITERS" --json - "$@" \
      > "$out/loom_rank$r.out" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  grep '^{' "$out/loom_rank0.out"
}

run_mpi() {  # run_mpi M K [name=value ...]: OpenMPI, with extra MCA parameters if given
  local m=$1 k=$2 hosts="" i only="" kv mca=()
  shift 2
  for kv in "$@"; do mca+=(--mca "${kv%%=*}" "${kv#*=}"); done
  [ "$OPS" = "${OPS%% *}" ] && only=$OPS  # a single op: OpenMPI runs it alone
  for ((i = 0; i < m; i++)); do hosts+="${hosts:+,}$(addr $i):$k"; done
  bash "$C" exec 0 mpirun --allow-run-as-root --host "$hosts" -np $((m * k)) \
    --mca plm_rsh_agent "$src/bench/peers/netns_rsh.sh" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self,vader --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
    "${mca[@]}" "$peers/mpi_bench" "$MIN" "$MAX" "$FACTOR" "$ITERS" $only 2> "$out/mpi.err" |
    grep '^{'
}

run_gloo() {
  local m=$1 k=$2 dir r
  dir=$(mktemp -d)
  for ((r = 0; r < m * k; r++)); do
    bash "$C" exec $((r / k)) env RANK=$r SIZE=$((m * k)) STORE_DIR="$dir" GLOO_HOST="$(addr $((r / k)))" \
      "$peers/gloo_bench" "$MIN" "$MAX" "$FACTOR" "$ITERS" > "$dir/out$r" &
  done
  wait
  cat "$dir/out0"
  rm -rf "$dir"
}

for layout in $LAYOUTS; do
  m=${layout%x*} k=${layout#*x}
  bash "$C" up "$m" "$RATE"
  bash "$C" exec 1 iperf3 -s -1 > /dev/null 2>&1 &
  sleep 0.5
  bash "$C" exec 0 iperf3 -c "$(addr 1)" -t 5 -J |
    python3 -c 'import json,sys; print(json.dumps({"peer":"iperf3","gbps":json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9}))' |
    tag "$layout" >> "$out/results.jsonl"
  wait
  for ((round = 1; round <= ROUNDS; round++)); do
    for op in $OPS; do
      run_loom "$m" "$k" "$layout" --op "$op" | tag "$layout" "\"round\":$round,\"choice\":\"auto\"," >> "$out/results.jsonl"
      if ((round == 1)); then
        for algo in $ALGOS; do
          run_loom "$m" "$k" "$layout" --op "$op" --algo "$algo" | grep "\"algo\":\"$algo\"" |
            tag "$layout" "\"round\":$round,\"choice\":\"forced\"," >> "$out/results.jsonl" || true
        done
      fi
    done
    run_mpi "$m" "$k" | tag "$layout" "\"round\":$round," >> "$out/results.jsonl"
    if [ -n "$MPI_MCA" ]; then
      # shellcheck disable=SC2086  # the parameters are words
      run_mpi "$m" "$k" $MPI_MCA | sed 's/"peer":"openmpi"/"peer":"openmpi-tuned"/' |
        tag "$layout" "\"round\":$round," >> "$out/results.jsonl"
    fi
    if ((round == 1)); then run_gloo "$m" "$k" | tag "$layout" "\"round\":$round," >> "$out/results.jsonl"; fi
  done
  bash "$C" down
done
python3 bench/cluster_table.py "$out"
