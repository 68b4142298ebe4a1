// A linear's forward on a few rows with bf16 weights (generation with `loom sample --dtype
// bf16`): out (R,OC) = inp (R,C) @ weight (OC,C)^T + bias (OC), the weights stored as bf16
// bits and widened to fp32 in registers; products and sums fp32; inp, out and bias fp32.
// With one row per sequence the product is a matrix-vector product bound by the bytes of
// the weights, so half the bytes is about twice the speed (fp32 few-row products go
// through oneDNN, as fast as these loops in fp32). Threads split the output columns; each
// weight row, once in L1, meets every input row.
#include <algorithm>
#include <bit>
#include <cstdint>

#include "loom/kernels/cpu/kernels.h"
#include "loom/kernels/cpu/vecmath.h"

namespace loom::kernels::cpu {

namespace {
[[gnu::always_inline]] inline float widen(uint16_t w) {
  return std::bit_cast<float>(static_cast<uint32_t>(w) << 16);
}

// dot(x, w) over C, the weight row read front to back (one stream for the prefetcher: four
// interleaved rows ran at half the bandwidth). kLanes independent sums, each a vector lane:
// the add latency is hidden without reassociating anything, and the lanes are added in a
// fixed order.
constexpr int kLanes = 32;
[[gnu::always_inline]] inline float dot(const float* x, const uint16_t* w, int C) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= C; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += widen(w[i + j]) * x[i + j];
  float s = 0;
  for (; i < C; ++i) s += widen(w[i]) * x[i];
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

// Output columns [o_begin, o_end), each weight row against every input row.
LOOM_VECTOR_CLONES void rows_block(float* out, const float* inp, const uint16_t* weight, int R,
                                   int C, int OC, int o_begin, int o_end) {
  for (int o = o_begin; o < o_end; ++o) {
    const uint16_t* w = weight + static_cast<size_t>(o) * C;
    for (int r = 0; r < R; ++r)
      out[static_cast<size_t>(r) * OC + o] = dot(inp + static_cast<size_t>(r) * C, w, C);
  }
}
}  // namespace

void matmul_forward_rows_bf16(float* out, const float* inp, const uint16_t* weight,
                              const float* bias, int R, int C, int OC) {
  constexpr int kBlock = 64;  // output columns per task
#pragma omp parallel for schedule(static)
  for (int o = 0; o < OC; o += kBlock) {
    const int end = std::min(OC, o + kBlock);
    rows_block(out, inp, weight, R, C, OC, o, end);
    if (bias)
      for (int r = 0; r < R; ++r)
        for (int j = o; j < end; ++j) out[static_cast<size_t>(r) * OC + j] += bias[j];
  }
}

}  // namespace loom::kernels::cpu
