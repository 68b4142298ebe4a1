// Measurements of the machine itself, printed beside benchmark results.
#pragma once

#include <cstddef>

namespace loom::apps {

// Median single-thread memcpy bandwidth over `bytes`-sized buffers, GB/s.
double memcpy_gbps(size_t bytes, int reps = 5);

// One-way core-to-core flag latency in ns (two threads pinned to CPUs 0 and 1 ping-pong a
// cache line). ~50 ns in this VM's usual state, ~210 ns in its slow state; < 0 if the
// machine has a single CPU.
double flag_latency_ns(int round_trips = 200000);

}  // namespace loom::apps
