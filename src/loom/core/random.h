// Counter-based random numbers: a value is a pure function of (key, index), so any element
// of any tensor can be generated alone, on any rank, in any order (weight initialisation
// under every parallel layout gives the same weights).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace loom {

// SplitMix64's finaliser: a bijection of 64-bit words with good avalanche.
inline uint64_t splitmix64_finaliser(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One SplitMix64 output: the finaliser of x plus the golden-ratio increment.
inline uint64_t mix64(uint64_t x) {
  return splitmix64_finaliser(x + 0x9E3779B97F4A7C15ull);
}

// A standard normal sample for (key, index): Box-Muller over two 32-bit uniforms.
inline float normal_at(uint64_t key, uint64_t index) {
  const uint64_t r = mix64(key ^ mix64(index));
  const double u1 = (static_cast<double>(r >> 32) + 0.5) * 0x1p-32;  // (0, 1)
  const double u2 = static_cast<double>(r & 0xffffffffu) * 0x1p-32;  // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

}  // namespace loom
