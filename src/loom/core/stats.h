// Small statistics over measurements.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace loom {

// The middle value (the mean of the two middle ones for an even count); NaN when empty.
inline double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Runs fn; returns the seconds it took (steady clock).
template <typename Fn>
double seconds_taken(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace loom
