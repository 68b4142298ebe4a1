// A linear's forward on a few rows (generation: R sequences decoding at once): out (R,OC) =
// inp (R,C) @ weight (OC,C)^T + bias (OC). Threads split the output columns; each weight row,
// once in L1, meets every input row.
// - bf16 weights (`loom sample --dtype bf16`), stored as bf16 bits and widened to fp32 in
//   registers; products and sums fp32. With one row per sequence the product is a
//   matrix-vector product bound by the bytes of the weights, so half the bytes is about
//   twice the speed.
// - fp32 weights, 1 to 16 rows: each 8-float piece of a weight row is loaded once for up to
//   8 rows. oneDNN's product at M = 8 reached neither the machine's bandwidth nor its FLOPs
//   (docs/perf.md, generation at batch 8); at M = 1 it read the weights at ~93% of the
//   bandwidth on Zen 3, but at about half this kernel's speed on Zen 5, so one row comes
//   here too.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

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

// fn(o_begin, o_end) over the output columns in blocks of 64, the blocks split across the
// threads.
template <typename Fn>
void column_blocks(int OC, Fn fn) {
  constexpr int kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int o = 0; o < OC; o += kBlock) fn(o, std::min(OC, o + kBlock));
}

// fp32 weights, R rows at once: each 8-float piece of a weight row is loaded once and meets
// every row's piece (R independent vector sums, one per row, added across in a fixed order
// at the end). Output columns [o_begin, o_end).
using Vec8 = float __attribute__((vector_size(32)));

template <int R>
LOOM_VECTOR_CLONES void rows_fp32_block(float* out, const float* inp, const float* weight,
                                        const float* bias, int C, int OC, int o_begin, int o_end) {
  for (int o = o_begin; o < o_end; ++o) {
    const float* w = weight + static_cast<size_t>(o) * C;
    Vec8 acc[R] = {};
    int i = 0;
    for (; i + 8 <= C; i += 8) {
      Vec8 wv;
      std::memcpy(&wv, w + i, sizeof wv);
      for (int r = 0; r < R; ++r) {
        Vec8 xv;
        std::memcpy(&xv, inp + static_cast<size_t>(r) * C + i, sizeof xv);
        acc[r] += wv * xv;
      }
    }
    for (int r = 0; r < R; ++r) {
      float s = 0;
      for (int j = 0; j < 8; ++j) s += acc[r][j];
      for (int k = i; k < C; ++k) s += w[k] * inp[static_cast<size_t>(r) * C + k];
      out[static_cast<size_t>(r) * OC + o] = bias ? s + bias[o] : s;
    }
  }
}

template <int R>
void rows_fp32(float* out, const float* inp, const float* weight, const float* bias, int C,
               int OC) {
  column_blocks(OC,
                [&](int o, int end) { rows_fp32_block<R>(out, inp, weight, bias, C, OC, o, end); });
}

using RowsFp32 = void (*)(float*, const float*, const float*, const float*, int, int);
constexpr RowsFp32 kRowsFp32[8] = {rows_fp32<1>, rows_fp32<2>, rows_fp32<3>, rows_fp32<4>,
                                   rows_fp32<5>, rows_fp32<6>, rows_fp32<7>, rows_fp32<8>};
}  // namespace

void matmul_forward_rows(float* out, const float* inp, const float* weight, const float* bias,
                         int R, int C, int OC) {
  // In groups of up to 8 rows (8 sums and a weight piece fill 9 of AVX2's 16 registers).
  for (int r0 = 0; r0 < R; r0 += 8)
    kRowsFp32[std::min(8, R - r0) - 1](out + static_cast<size_t>(r0) * OC,
                                       inp + static_cast<size_t>(r0) * C, weight, bias, C, OC);
}

void matmul_forward_rows_bf16(float* out, const float* inp, const uint16_t* weight,
                              const float* bias, int R, int C, int OC) {
  column_blocks(OC, [&](int o, int end) {
    rows_block(out, inp, weight, R, C, OC, o, end);
    if (bias)
      for (int r = 0; r < R; ++r)
        for (int j = o; j < end; ++j) out[static_cast<size_t>(r) * OC + j] += bias[j];
  });
}

}  // namespace loom::kernels::cpu
