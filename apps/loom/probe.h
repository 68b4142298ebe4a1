// Measurements of the machine itself, printed beside benchmark results.
#pragma once

#include <cstddef>

namespace loom::apps {

// Median single-thread copy bandwidth over `bytes`-sized buffers, GB/s: the faster of glibc's
// memcpy and loom's non-temporal copy (comm::copy_streaming, which large messages use).
double memcpy_gbps(size_t bytes, int reps = 5);

// The same with `threads` threads copying at once, each its own `bytes`-sized buffers, all
// started together every repetition: the machine's bytes copied per second in all, GB/s
// (what ranks that all copy during a collective share).
double memcpy_gbps_together(size_t bytes, int threads, int reps = 5);

// Bytes read per second by `threads` threads at once, each reading its own `bytes`, GB/s in
// all, the fastest of `reps`: the bound of a pass that only reads, such as a matrix-vector
// product's weights.
double read_gbps_together(size_t bytes, int threads, int reps = 5);

// Each of `ranks` local ranks' share of the copy bandwidth when they all copy at once:
// memcpy_gbps_together with min(ranks, cores) threads, divided by `ranks`.
double memcpy_share_gbps(size_t bytes, int ranks, int reps = 5);

// One-way core-to-core flag latency in ns (two threads pinned to CPUs 0 and 1 ping-pong a
// cache line). ~50 ns in this VM's usual state, ~210 ns in its slow state; < 0 if the
// machine has a single CPU.
double flag_latency_ns(int round_trips = 200000);

}  // namespace loom::apps
