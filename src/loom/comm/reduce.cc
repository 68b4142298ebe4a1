#include "loom/comm/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "loom/core/check.h"

namespace loom::comm {
namespace {

template <typename T>
inline T combine(T x, T y, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<T>(x + y);
    case ReduceOp::kProd:
      return static_cast<T>(x * y);
    case ReduceOp::kMin:
      return std::min(x, y);
    case ReduceOp::kMax:
      return std::max(x, y);
    case ReduceOp::kCount:
      break;
  }
  return x;
}

// Each loop reads a[i] and b[i] before it writes d[i], so d may alias a or b exactly (never
// partly): no iteration depends on another, which the pragma tells the compiler (otherwise
// it proves nothing about the pointers and, when they alias, runs the scalar fallback of
// its runtime overlap check: 3 GB/s instead of memory speed).
#if defined(__clang__)
#define LOOM_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#else
#define LOOM_IVDEP _Pragma("GCC ivdep")
#endif

// The op is hoisted out of the loop so each variant vectorises.
template <typename T>
inline void reduce_any(T* d, const T* a, const T* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      LOOM_IVDEP for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(a[i] + b[i]);
      break;
    case ReduceOp::kProd:
      LOOM_IVDEP for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(a[i] * b[i]);
      break;
    case ReduceOp::kMin:
      LOOM_IVDEP for (size_t i = 0; i < n; ++i) d[i] = combine(a[i], b[i], ReduceOp::kMin);
      break;
    case ReduceOp::kMax:
      LOOM_IVDEP for (size_t i = 0; i < n; ++i) d[i] = combine(a[i], b[i], ReduceOp::kMax);
      break;
    case ReduceOp::kCount:
      break;
  }
}

// Runtime dispatch: one clone per ISA level, chosen at load time. ThreadSanitizer cannot
// run the ifunc resolvers (they execute before its runtime starts), so TSan builds use the
// baseline version.
#if defined(__SANITIZE_THREAD__)
#define LOOM_CLONES
#else
#define LOOM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

LOOM_CLONES void reduce_f32(float* d, const float* a, const float* b, size_t n, ReduceOp op) {
  reduce_any(d, a, b, n, op);
}

LOOM_CLONES void reduce_f64(double* d, const double* a, const double* b, size_t n, ReduceOp op) {
  reduce_any(d, a, b, n, op);
}

LOOM_CLONES void reduce_i32(int32_t* d, const int32_t* a, const int32_t* b, size_t n, ReduceOp op) {
  reduce_any(d, a, b, n, op);
}

LOOM_CLONES void reduce_i64(int64_t* d, const int64_t* a, const int64_t* b, size_t n, ReduceOp op) {
  reduce_any(d, a, b, n, op);
}

LOOM_CLONES void reduce_u8(uint8_t* d, const uint8_t* a, const uint8_t* b, size_t n, ReduceOp op) {
  reduce_any(d, a, b, n, op);
}

LOOM_CLONES void reduce_bf16(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n,
                             ReduceOp op) {
  for (size_t i = 0; i < n; ++i)
    d[i] = f32_to_bf16(combine(bf16_to_f32(a[i]), bf16_to_f32(b[i]), op));
}

LOOM_CLONES void reduce_f16(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n,
                            ReduceOp op) {
  for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(combine(f16_to_f32(a[i]), f16_to_f32(b[i]), op));
}

template <typename T>
void divide(T* p, size_t n, int by) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(by));
}

}  // namespace

void reduce_into(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  switch (dtype) {
    case DType::kF32:
      return reduce_f32(static_cast<float*>(dst), static_cast<const float*>(a),
                        static_cast<const float*>(b), count, op);
    case DType::kF64:
      return reduce_f64(static_cast<double*>(dst), static_cast<const double*>(a),
                        static_cast<const double*>(b), count, op);
    case DType::kI32:
      return reduce_i32(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a),
                        static_cast<const int32_t*>(b), count, op);
    case DType::kI64:
      return reduce_i64(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                        static_cast<const int64_t*>(b), count, op);
    case DType::kU8:
      return reduce_u8(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a),
                       static_cast<const uint8_t*>(b), count, op);
    case DType::kBF16:
      return reduce_bf16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                         static_cast<const uint16_t*>(b), count, op);
    case DType::kF16:
      return reduce_f16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                        static_cast<const uint16_t*>(b), count, op);
    case DType::kCount:
      break;
  }
  LOOM_CHECK_MSG(false, "unknown dtype");
}

void finish_avg(void* buf, size_t count, DType dtype, int n) {
  switch (dtype) {
    case DType::kF32:
      return divide(static_cast<float*>(buf), count, n);
    case DType::kF64:
      return divide(static_cast<double*>(buf), count, n);
    case DType::kI32:
      return divide(static_cast<int32_t*>(buf), count, n);
    case DType::kI64:
      return divide(static_cast<int64_t*>(buf), count, n);
    case DType::kU8:
      return divide(static_cast<uint8_t*>(buf), count, n);
    case DType::kBF16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = f32_to_bf16(bf16_to_f32(p[i]) / n);
      return;
    }
    case DType::kF16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = f32_to_f16(f16_to_f32(p[i]) / n);
      return;
    }
    case DType::kCount:
      break;
  }
}

void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes) std::memcpy(dst, src, bytes);
}

}  // namespace loom::comm
