// Small statistics over measurements.
#pragma once

#include <algorithm>
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

}  // namespace loom
