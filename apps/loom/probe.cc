#include "probe.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "loom/comm/reduce.h"

namespace loom::apps {
namespace {
enum class Traffic { kMemcpy, kStreaming, kRead };

// The sum of a buffer's 64-bit words in 8 independent lanes (vector adds): a pass bound by the
// bytes read (within ~10% of an AVX-512 loop's best on Zen 4; more lanes or AVX-512 clones of
// this loop read slower).
uint64_t read_all(const char* p, size_t bytes) {
  uint64_t lane[8] = {};
  const size_t n = bytes / sizeof lane;
  for (size_t i = 0; i < n; ++i) {
    uint64_t w[8];
    std::memcpy(w, p + i * sizeof lane, sizeof lane);
    for (int j = 0; j < 8; ++j) lane[j] += w[j];
  }
  uint64_t s = 0;
  for (uint64_t l : lane) s += l;
  return s;
}

// Bytes copied (or read) per second by `threads` threads at once (GB/s in all): copied through
// glibc's memcpy or loom's non-temporal copy (the median repetition), or only read (the
// fastest: a bound for passes that only read, on a host whose bandwidth varies by 1.5x
// from one second to the next).
double gbps_together(size_t bytes, int threads, int reps, Traffic traffic) {
  threads = std::max(threads, 1);
  const bool read = traffic == Traffic::kRead;
  struct Copier {
    std::vector<char> a, b;
    double seconds = 0;
    uint64_t sum = 0;
  };
  std::vector<Copier> copiers(threads);
  for (auto& c : copiers) c.a.assign(bytes, 1), c.b.assign(read ? 0 : bytes, 2);
  auto copy = [&](Copier& c) {
    auto t0 = std::chrono::steady_clock::now();
    if (traffic == Traffic::kStreaming)
      comm::copy_streaming(c.b.data(), c.a.data(), bytes);
    else if (traffic == Traffic::kMemcpy)
      std::memcpy(c.b.data(), c.a.data(), bytes);
    else
      c.sum += read_all(c.a.data(), bytes);
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!read) std::swap(c.a, c.b);
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
  volatile uint64_t sink = 0;  // the sums are used, so the reads are not optimised away
  for (const auto& c : copiers) sink = sink + c.sum;
  return read ? rates.back() : rates[rates.size() / 2];
}

}  // namespace

double memcpy_gbps(size_t bytes, int reps) {
  return memcpy_gbps_together(bytes, 1, reps);
}

double memcpy_gbps_together(size_t bytes, int threads, int reps) {
  return std::max(gbps_together(bytes, threads, reps, Traffic::kMemcpy),
                  gbps_together(bytes, threads, reps, Traffic::kStreaming));
}

double read_gbps_together(size_t bytes, int threads, int reps) {
  return gbps_together(bytes, threads, reps, Traffic::kRead);
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
