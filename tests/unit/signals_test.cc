// core/signals.h: routed signals reach their action on the signal thread, are blocked in
// the threads that compute, and a storm of them during oneDNN GEMMs corrupts nothing (with
// a plain signal handler instead, the storm below aborts the process: the handler's frame
// lands where a JIT kernel's rsp points, in the heap).
#include "loom/core/signals.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "loom/kernels/cpu/gemm.h"

namespace loom {
namespace {

std::atomic<int> g_taken{0};
std::atomic<int> g_thread_blocked{-1};

bool blocked_here(int sig) {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  return sigismember(&now, sig) == 1;
}

TEST(Signals, RoutedSignalReachesItsActionOnTheSignalThread) {
  route_signals({SIGINT, SIGTERM, SIGUSR1});  // first: before any thread of this process
  EXPECT_TRUE(blocked_here(SIGINT));
  std::thread([] { g_thread_blocked = blocked_here(SIGTERM) ? 1 : 0; }).join();
  EXPECT_EQ(g_thread_blocked.load(), 1) << "a thread started later inherits the mask";
  on_signal(SIGUSR1, [](int) {
    EXPECT_TRUE(blocked_here(SIGUSR1));
    g_taken.fetch_add(1);
  });
  ::kill(::getpid(), SIGUSR1);
  for (int i = 0; i < 2000 && g_taken.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(g_taken.load(), 1);
  on_signal(SIGUSR1, nullptr);
}

TEST(Signals, AStormDuringGemmsCorruptsNothing) {
  route_signals({SIGINT, SIGTERM, SIGUSR1});
  std::atomic<int> taken{0};
  on_signal(SIGINT, [&](int) { taken.fetch_add(1); });
  // The product that crashed a rank: the tiny model's input gradient of the LM head,
  // d(x) (B*T = 64, C = 64) = d(logits) (64, 50304) @ wte (50304, 64).
  const int64_t M = 64, N = 64, K = 50304;
  std::vector<float> a(M * K), b(K * N), want(M * N), got(M * N);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 13) * 0.25f - 1.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 7) * 0.5f - 1.0f;
  kernels::cpu::Gemm gemm;
  auto product = [&](std::vector<float>& c) {
    gemm.run({M, N, K}, {a.data(), K, 1}, {b.data(), N, 1}, {c.data(), N, 1}, 1.0f, false);
  };
  product(want);
  std::atomic<bool> done{false};
  std::thread storm([&] {
    while (!done.load()) {
      ::kill(::getpid(), SIGINT);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  int same = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2000);
  int rounds = 0;
  for (; std::chrono::steady_clock::now() < until; ++rounds) {
    std::vector<float> scratch(1 + rounds % 97);  // heap traffic between the products
    product(got);
    same += std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0;
  }
  done = true;
  storm.join();
  EXPECT_EQ(same, rounds);
  EXPECT_GT(taken.load(), 100) << "the storm should have reached the signal thread";
  on_signal(SIGINT, nullptr);
}

}  // namespace
}  // namespace loom
