#include "loom/comm/reduce.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "loom/core/check.h"
#include "loom/core/tunable.h"

namespace loom::comm {
namespace {

const BytesTunable kStreamingMin(
    "LOOM_STREAMING_COPY_MIN", 8 << 20,
    "a collective of at least this many bytes (allgather, alltoall: its whole output) writes "
    "its shared-memory receives, own block and out-of-place reductions into the output with "
    "non-temporal stores; 0 = never (docs/perf.md)");

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

size_t streaming_copy_min() {
  const int64_t v = kStreamingMin.get();
  return v <= 0 ? SIZE_MAX : static_cast<size_t>(v);
}

void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes) std::memcpy(dst, src, bytes);
}

#if defined(__x86_64__)
namespace {
// Whole 64-byte lines from s to the line-aligned d with streaming stores.
__attribute__((target("avx2"))) void stream_lines_avx2(std::byte* d, const std::byte* s,
                                                       size_t lines) {
  for (size_t i = 0; i < lines; ++i, d += 64, s += 64) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), x);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), y);
  }
}

void stream_lines_sse2(std::byte* d, const std::byte* s, size_t lines) {
  for (size_t i = 0; i < lines; ++i, d += 64, s += 64) {
    __m128i v[4];
    for (int k = 0; k < 4; ++k)
      v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16 * k));
    for (int k = 0; k < 4; ++k) _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16 * k), v[k]);
  }
}

std::atomic<uint64_t> g_streamed{0};

bool has_avx2() {
  static const bool yes = (__builtin_cpu_init(), __builtin_cpu_supports("avx2"));
  return yes;
}

// Whole lines with streaming stores through the widest kernel the CPU has. The caller
// counts them in g_streamed (once per call, not per piece) and fences.
void stream_lines(std::byte* d, const std::byte* s, size_t lines) {
  if (has_avx2())
    stream_lines_avx2(d, s, lines);
  else
    stream_lines_sse2(d, s, lines);
}
}  // namespace

void copy_streaming(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  if (d == s || bytes == 0) return;
  const size_t head = (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64;
  if (bytes < head + 64) return std::memcpy(d, s, bytes), void();
  std::memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  const size_t lines = bytes / 64;
  g_streamed.fetch_add(lines * 64, std::memory_order_relaxed);
  stream_lines(d, s, lines);
  _mm_sfence();
  std::memcpy(d + lines * 64, s + lines * 64, bytes % 64);
}

void reduce_streaming(void* dst, const void* a, const void* b, size_t count, DType dtype,
                      ReduceOp op) {
  // Each 1 KiB piece is reduced into a buffer that stays in L1, then streamed out from there:
  // one streaming path for every dtype and op, bit-identical to reduce_into. Measured (2-rank
  // reduce_scatter, docs/perf.md): as fast as an AVX2 sum that streams from registers; 8 KiB
  // pieces were 10-20% slower than plain stores (the loads and the stores stop overlapping).
  constexpr size_t kPiece = 1 << 10;
  const size_t es = dtype_size(dtype);
  auto* d = static_cast<std::byte*>(dst);
  const auto* x = static_cast<const std::byte*>(a);
  const auto* y = static_cast<const std::byte*>(b);
  const size_t head = (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64;
  size_t bytes = count * es;
  if (head % es != 0 || bytes < head + kPiece) return reduce_into(dst, a, b, count, dtype, op);
  reduce_into(d, x, y, head / es, dtype, op);
  d += head, x += head, y += head, bytes -= head;
  alignas(64) std::byte tmp[kPiece];
  const size_t pieces = bytes / kPiece;
  for (size_t i = 0; i < pieces; ++i, d += kPiece, x += kPiece, y += kPiece) {
    reduce_into(tmp, x, y, kPiece / es, dtype, op);
    stream_lines(d, tmp, kPiece / 64);
  }
  g_streamed.fetch_add(pieces * kPiece, std::memory_order_relaxed);
  _mm_sfence();
  reduce_into(d, x, y, bytes % kPiece / es, dtype, op);
}

uint64_t bytes_streamed() {
  return g_streamed.load(std::memory_order_relaxed);
}
#else
void copy_streaming(void* dst, const void* src, size_t bytes) {
  copy_bytes(dst, src, bytes);
}
void reduce_streaming(void* dst, const void* a, const void* b, size_t count, DType dtype,
                      ReduceOp op) {
  reduce_into(dst, a, b, count, dtype, op);
}
uint64_t bytes_streamed() {
  return 0;
}
#endif

}  // namespace loom::comm
