// A linear's forward on a few rows (generation: R sequences decoding at once): out (R,OC) =
// inp (R,C) @ weight (OC,C)^T + bias (OC). Threads split the output columns; each 8-wide piece
// of a weight row is loaded once and meets every input row (in groups of up to 8 rows).
// - fp32 weights, 1 to 16 rows. oneDNN's product at M = 8 reached neither the machine's
//   bandwidth nor its FLOPs (docs/perf.md, generation at batch 8); at M = 1 it read the
//   weights at ~93% of the bandwidth on Zen 3, but at about half this kernel's speed on
//   Zen 5, so one row comes here too.
// - bf16 weights (`loom sample --dtype bf16`), stored as bf16 bits and widened to fp32 in
//   registers; products and sums fp32. With one row per sequence the product is a
//   matrix-vector product bound by the bytes of the weights, so half the bytes is about
//   twice the speed. Each piece is widened once for all rows, in vector registers (widening
//   it again per row, in a scalar loop, made 8 rows 1.9x slower).
// Both run on generation's rows only and are checked within a tolerance, so they are built
// with fused multiply-adds; at one row the weights' bytes decide, at 8 the arithmetic
// (docs/perf-history.md, "Generation on Zen 4").
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "loom/core/check.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

namespace {
using Vec8 = float __attribute__((vector_size(32)));
using Vec8u = uint32_t __attribute__((vector_size(32)));
using Vec8h = uint16_t __attribute__((vector_size(16)));

// (Out parameters, not return values: a vector returned without AVX enabled changes the ABI
// of the baseline build.)
[[gnu::always_inline]] inline void load8(Vec8& v, const float* p) {
  std::memcpy(&v, p, sizeof v);
}
// 8 bf16 values widened: the bits moved to a float's upper half.
[[gnu::always_inline]] inline void load8(Vec8& v, const uint16_t* p) {
  Vec8h h;
  std::memcpy(&h, p, sizeof h);
  const Vec8u u = __builtin_convertvector(h, Vec8u) << 16;
  std::memcpy(&v, &u, sizeof v);
}
[[gnu::always_inline]] inline float load1(const float* p) {
  return *p;
}
[[gnu::always_inline]] inline float load1(const uint16_t* p) {
  const uint32_t u = static_cast<uint32_t>(*p) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// O output columns from o of R rows. Each row keeps U vector sums per column over consecutive
// pieces; the sums, then the lanes, are added in a fixed order.
template <int R, int O, int U, typename W>
[[gnu::always_inline]] inline void columns(float* out, const float* inp, const W* weight,
                                           const float* bias, int C, int OC, int o) {
  Vec8 acc[O][R][U] = {};
  int i = 0;
  for (; i + 8 * U <= C; i += 8 * U)
    for (int u = 0; u < U; ++u) {
      Vec8 wv[O], xv;
      for (int c = 0; c < O; ++c) load8(wv[c], weight + static_cast<size_t>(o + c) * C + i + 8 * u);
      for (int r = 0; r < R; ++r) {
        load8(xv, inp + static_cast<size_t>(r) * C + i + 8 * u);
        for (int c = 0; c < O; ++c) acc[c][r][u] += wv[c] * xv;
      }
    }
  for (; i + 8 <= C; i += 8) {
    Vec8 wv[O], xv;
    for (int c = 0; c < O; ++c) load8(wv[c], weight + static_cast<size_t>(o + c) * C + i);
    for (int r = 0; r < R; ++r) {
      load8(xv, inp + static_cast<size_t>(r) * C + i);
      for (int c = 0; c < O; ++c) acc[c][r][0] += wv[c] * xv;
    }
  }
  for (int c = 0; c < O; ++c) {
    const W* w = weight + static_cast<size_t>(o + c) * C;
    for (int r = 0; r < R; ++r) {
      for (int u = 1; u < U; ++u) acc[c][r][0] += acc[c][r][u];
      float s = 0;
      for (int j = 0; j < 8; ++j) s += acc[c][r][0][j];
      for (int k = i; k < C; ++k) s += load1(w + k) * inp[static_cast<size_t>(r) * C + k];
      out[static_cast<size_t>(r) * OC + o + c] = bias ? s + bias[o + c] : s;
    }
  }
}

// R rows, output columns [o_begin, o_end), O at a time, then one at a time. At one to three
// rows, U = 4/R sums per row, so the adds' latency does not bound the loop (one sum per row ran
// at ~24 GB/s a core); from four rows, O weight rows at once, so each input piece loaded meets
// O weight pieces.
template <int R, int O, typename W>
[[gnu::always_inline]] inline void rows_block(float* out, const float* inp, const W* weight,
                                              const float* bias, int C, int OC, int o_begin,
                                              int o_end) {
  constexpr int U = R >= 4 ? 1 : 4 / R;
  int o = o_begin;
  for (; o + O <= o_end; o += O) columns<R, O, U>(out, inp, weight, bias, C, OC, o);
  for (; o < o_end; ++o) columns<R, 1, U>(out, inp, weight, bias, C, OC, o);
}

// The block built for three instruction sets, picked at run time; products fused (these
// kernels are checked within a tolerance only). With AVX-512VL's 32 vector registers, 8 weight
// rows at once (fp32, 8 rows on Zen 4: 1.3x 2 at once, 1.8x one at a time); AVX2's 16 spill at
// more than 2 (4 at once: 2x slower at 8 rows). target_clones' "avx512f" has neither VL's
// upper 16 registers at 256 bits nor FMA.
using Block = void (*)(float*, const float*, const void*, const float*, int, int, int, int);

template <int R, typename W>
[[gnu::target("avx512f,avx512vl,fma")]] void block_avx512(float* out, const float* inp,
                                                          const void* w, const float* bias, int C,
                                                          int OC, int o_begin, int o_end) {
  rows_block<R, (R >= 4 ? 8 : 1)>(out, inp, static_cast<const W*>(w), bias, C, OC, o_begin, o_end);
}
template <int R, typename W>
[[gnu::target("avx2,fma")]] void block_avx2(float* out, const float* inp, const void* w,
                                            const float* bias, int C, int OC, int o_begin,
                                            int o_end) {
  rows_block<R, (R >= 4 ? 2 : 1)>(out, inp, static_cast<const W*>(w), bias, C, OC, o_begin, o_end);
}
template <int R, typename W>
void block_base(float* out, const float* inp, const void* w, const float* bias, int C, int OC,
                int o_begin, int o_end) {
  rows_block<R, (R >= 4 ? 2 : 1)>(out, inp, static_cast<const W*>(w), bias, C, OC, o_begin, o_end);
}

template <int R, typename W>
Block block_for(RowsIsa isa) {
  if (isa == RowsIsa::kAuto) {
    static const RowsIsa best = rows_isa_available(RowsIsa::kAvx512) ? RowsIsa::kAvx512
                                : rows_isa_available(RowsIsa::kAvx2) ? RowsIsa::kAvx2
                                                                     : RowsIsa::kBaseline;
    isa = best;
  }
  LOOM_CHECK(rows_isa_available(isa));
  return isa == RowsIsa::kAvx512 ? block_avx512<R, W>
         : isa == RowsIsa::kAvx2 ? block_avx2<R, W>
                                 : block_base<R, W>;
}

template <int R, typename W>
void rows(float* out, const float* inp, const W* weight, const float* bias, int C, int OC,
          RowsIsa isa) {
  // Blocks of 64 output columns split across the threads.
  constexpr int kBlock = 64;
  const Block block = block_for<R, W>(isa);
#pragma omp parallel for schedule(static)
  for (int o = 0; o < OC; o += kBlock)
    block(out, inp, weight, bias, C, OC, o, std::min(OC, o + kBlock));
}

template <typename W>
using Rows = void (*)(float*, const float*, const W*, const float*, int, int, RowsIsa);
template <typename W>
constexpr Rows<W> kRows[8] = {rows<1, W>, rows<2, W>, rows<3, W>, rows<4, W>,
                              rows<5, W>, rows<6, W>, rows<7, W>, rows<8, W>};

// In groups of up to 8 rows.
template <typename W>
void grouped(float* out, const float* inp, const W* weight, const float* bias, int R, int C, int OC,
             RowsIsa isa) {
  for (int r0 = 0; r0 < R; r0 += 8)
    kRows<W>[std::min(8, R - r0) - 1](out + static_cast<size_t>(r0) * OC,
                                      inp + static_cast<size_t>(r0) * C, weight, bias, C, OC, isa);
}
}  // namespace

bool rows_isa_available(RowsIsa isa) {
  switch (isa) {
    case RowsIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("fma");
    case RowsIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default:
      return true;
  }
}

void matmul_forward_rows(float* out, const float* inp, const float* weight, const float* bias,
                         int R, int C, int OC, RowsIsa isa) {
  grouped(out, inp, weight, bias, R, C, OC, isa);
}

void matmul_forward_rows_bf16(float* out, const float* inp, const uint16_t* weight,
                              const float* bias, int R, int C, int OC, RowsIsa isa) {
  grouped(out, inp, weight, bias, R, C, OC, isa);
}

}  // namespace loom::kernels::cpu
