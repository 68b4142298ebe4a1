// Closed-form inputs and expected outputs for collective tests: every value is a small
// integer (or a power of two for prod), exactly representable in every dtype, so the
// expected result is exact whatever order the reduction runs in.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "loom/comm/types.h"
#include "loom/core/dtype.h"

namespace loom::test {

inline double load(DType t, const void* p, size_t i) {
  return load_element(t, p, i);
}
inline void store(DType t, void* p, size_t i, double v) {
  store_element(t, p, i, v);
}

// Rank r's input element i for reduction op `op`.
inline double input_value(comm::ReduceOp op, int r, size_t i) {
  if (op == comm::ReduceOp::kProd) return 1 + ((r + i) % 2);  // 1 or 2
  if (op == comm::ReduceOp::kMin || op == comm::ReduceOp::kMax) return (r * 5 + i * 3) % 13;
  return (r + 1) * (i % 5 + 1);  // sum, avg: at most 5 * 36 = 180 for 8 ranks
}

inline double expected_value(comm::ReduceOp op, DType t, int n, size_t i) {
  double acc = input_value(op, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = input_value(op, r, i);
    switch (op) {
      case comm::ReduceOp::kSum:
      case comm::ReduceOp::kAvg:
        acc += v;
        break;
      case comm::ReduceOp::kProd:
        acc *= v;
        break;
      case comm::ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case comm::ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      default:
        break;
    }
  }
  if (op == comm::ReduceOp::kAvg) {
    if (dtype_is_float(t))
      acc = static_cast<float>(acc) / n;  // finish_avg divides in f32 (f64 for f64)
    else
      acc = std::trunc(acc / n);
  }
  return acc;
}

// Fills `buf` (count elements) for rank r; element i of logical block b gets the value of
// global index offset + i.
inline void fill(DType t, void* buf, size_t count, comm::ReduceOp op, int r, size_t offset = 0) {
  for (size_t i = 0; i < count; ++i) store(t, buf, i, input_value(op, r, offset + i));
}

// Same value after a round trip through dtype t (what the rank would compare against).
inline double as_dtype(DType t, double v) {
  std::vector<uint8_t> tmp(8);
  store(t, tmp.data(), 0, v);
  return load(t, tmp.data(), 0);
}

}  // namespace loom::test
