#include "probe.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace loom::apps {

double memcpy_gbps(size_t bytes, int reps) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<double> rates;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    auto t1 = std::chrono::steady_clock::now();
    rates.push_back(bytes / std::chrono::duration<double>(t1 - t0).count() / 1e9);
    std::swap(a, b);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
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
