// Test inputs from a fixed seed (the kernel tests): normal floats, uniform integers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace loom::test {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// n integers uniform in [0, hi) (token ids, targets) from a fixed seed.
inline std::vector<int> randint(size_t n, int hi, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> d(0, hi - 1);
  std::vector<int> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace loom::test
