#include "probe.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "loom/comm/reduce.h"

namespace loom::apps {
namespace {
// Median bytes copied per second by `threads` threads at once (GB/s in all), through glibc's
// memcpy or loom's non-temporal copy.
double copy_gbps_together(size_t bytes, int threads, int reps, bool streaming) {
  threads = std::max(threads, 1);
  struct Copier {
    std::vector<char> a, b;
    double seconds = 0;
  };
  std::vector<Copier> copiers(threads);
  for (auto& c : copiers) c.a.assign(bytes, 1), c.b.assign(bytes, 2);
  auto copy = [&](Copier& c) {
    auto t0 = std::chrono::steady_clock::now();
    if (streaming)
      comm::copy_streaming(c.b.data(), c.a.data(), bytes);
    else
      std::memcpy(c.b.data(), c.a.data(), bytes);
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::swap(c.a, c.b);
  };
  std::vector<double> rates;
  std::barrier start(threads);
  for (int i = 0; i < reps; ++i) {
    std::vector<std::thread> others;
    for (int t = 1; t < threads; ++t)
      others.emplace_back([&, t] { start.arrive_and_wait(), copy(copiers[t]); });
    start.arrive_and_wait();
    copy(copiers[0]);
    for (auto& th : others) th.join();
    double slowest = 0;
    for (const auto& c : copiers) slowest = std::max(slowest, c.seconds);
    rates.push_back(double(bytes) * threads / slowest / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace

double memcpy_gbps(size_t bytes, int reps) {
  return memcpy_gbps_together(bytes, 1, reps);
}

double memcpy_gbps_together(size_t bytes, int threads, int reps) {
  return std::max(copy_gbps_together(bytes, threads, reps, false),
                  copy_gbps_together(bytes, threads, reps, true));
}

double memcpy_share_gbps(size_t bytes, int ranks, int reps) {
  ranks = std::max(ranks, 1);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return memcpy_gbps_together(bytes, std::min(ranks, cores), reps) / ranks;
}

namespace {
bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}
}  // namespace

double flag_latency_ns(int round_trips) {
  if (std::thread::hardware_concurrency() < 2) return -1;
  alignas(64) std::atomic<int> ping{0};
  alignas(64) std::atomic<int> pong{0};
  std::thread other([&] {
    pin(1);
    for (int i = 1; i <= round_trips; ++i) {
      while (ping.load(std::memory_order_acquire) != i) {
      }
      pong.store(i, std::memory_order_release);
    }
  });
  pin(0);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; i <= round_trips; ++i) {
    ping.store(i, std::memory_order_release);
    while (pong.load(std::memory_order_acquire) != i) {
    }
  }
  auto t1 = std::chrono::steady_clock::now();
  other.join();
  // Restore this thread's affinity to every CPU.
  cpu_set_t all;
  CPU_ZERO(&all);
  for (unsigned c = 0; c < std::thread::hardware_concurrency(); ++c) CPU_SET(c, &all);
  pthread_setaffinity_np(pthread_self(), sizeof all, &all);
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / round_trips / 2;
}

}  // namespace loom::apps
