#!/usr/bin/env bash
# TCP send threads (issue 12 item 5): loom's 2-rank allgather over TCP with the send thread
# off (LOOM_TCP_SEND_THREAD=0) and from 1 MiB / 4 MiB payloads (THRESHOLDS), beside the
# plain loopback socket stream in both directions at once (bench/peers/tcp_stream.cc,
# BIDIR=1: a thread per direction), in ROUNDS interleaved rounds, with the machine probe
# before each; prints the medians.
#
#   bash bench/tcp_send_thread.sh [OUT_DIR]        (needs scripts/setup.sh and a build/)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
bench_start tcp-send-thread- "${1:-}"
g++ -O2 -std=c++17 -o build/peers/tcp_stream bench/peers/tcp_stream.cc -lpthread
MIN=${MIN:-1048576} MAX=${MAX:-268435456} ITERS=${ITERS:-10} ROUNDS=${ROUNDS:-5}
THRESHOLDS=${THRESHOLDS:-0 1048576 4194304}
for ((round = 1; round <= ROUNDS; round++)); do
  probe "before-r$round" 2
  for t in $THRESHOLDS; do
    LOOM_TRANSPORT=tcp LOOM_TCP_SEND_THREAD=$t $loom bench --np 2 --op allgather --min "$MIN" \
      --max "$MAX" --factor 4 --iters "$ITERS" --json - |
      sed "s/^{/{\"peer\":\"loom-thread-$t\",\"round\":$round,/" >> "$out/results.jsonl"
  done
  BIDIR=1 build/peers/tcp_stream | sed "s/^{/{\"round\":$round,/" >> "$out/results.jsonl"
done
/usr/bin/python3 bench/tcp_send_thread_table.py "$out"
