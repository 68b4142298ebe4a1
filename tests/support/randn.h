// Normally distributed test inputs from a fixed seed (the kernel tests).
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

}  // namespace loom::test
