// Matrix products for the CPU kernels, through oneDNN's matmul primitive.
//
// Why oneDNN and not OpenBLAS: on this machine oneDNN 2.6 runs the model's shapes at
// ~430-470 GFLOP/s fp32 and ~800-950 GFLOP/s bf16 on 2 cores, OpenBLAS 0.3.21 at ~230
// (bench/gemm_peak.cc measures both; docs/perf.md has the table).
//
// A Gemm object owns the engine, a cache of primitives keyed by shape, strides and mode,
// and the bf16 staging buffers; one per model (it is not thread-safe). In bf16 mode the
// operands are rounded to bf16 (round to nearest even) and the product accumulates in fp32
// into an fp32 result — the same numerics as PyTorch's CPU autocast. An operand is rounded
// just before the product unless the caller hands its bf16 copy along (MatrixView::bf16: a
// weight's copy made once per forward, an output gradient read by two products).
#pragma once

#include <cstdint>
#include <memory>

#include "loom/kernels/backend.h"

namespace loom::kernels::cpu {

using kernels::Precision;

// A batch of matrices over a float buffer: element (b0, b1, row, col) lives at
// data[b0 * batch0 + b1 * batch1 + row * row_stride + col * col_stride].
struct MatrixView {
  const float* data;
  int64_t row_stride, col_stride;
  int64_t batch0 = 0, batch1 = 0;
  // The same elements already rounded to bf16, at the same offsets; a native bf16 product
  // reads them instead of rounding `data` again. Null: rounded before the product.
  const uint16_t* bf16 = nullptr;
};

struct GemmShape {
  int64_t M, N, K;
  int64_t batch0 = 1, batch1 = 1;
};

class Gemm {
 public:
  explicit Gemm(Precision precision = Precision::kF32);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  Precision precision() const { return precision_; }
  void set_precision(Precision p) { precision_ = p; }

  // c (M,N) = alpha * a (M,K) @ b (K,N), plus the old c when accumulate, plus bias (N) on
  // every row where given (added to the fp32 accumulator inside the product: no pass of its
  // own; single matrices only); for every batch. c's view must not overlap a or b.
  void run(const GemmShape& s, MatrixView a, MatrixView b, MatrixView c, float alpha,
           bool accumulate, const float* bias = nullptr);

  // Whether products read bf16 operands (native bf16 mode): then an operand's bf16 copy,
  // where the caller has one, saves rounding it again.
  bool reads_bf16() const;
  // x (n elements) rounded to bf16 in one of this Gemm's staging buffers (kStagingSlots of
  // them, so a kernel can hold several roundings at once), valid until that slot's next
  // use: for an operand two products read. Null unless reads_bf16().
  static constexpr int kStagingSlots = 4;
  const uint16_t* stage_bf16(const float* x, int64_t n, int slot = 0);
  // That buffer with room for n elements, for a kernel that writes the rounding itself.
  uint16_t* staging_bf16(int64_t n, int slot = 0);
  // Off: stage_bf16/staging_bf16 return null, so every product rounds its own operands (the
  // same bits; a reference for tests).
  void set_staging(bool on) { staging_ = on; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Precision precision_;
  bool staging_ = true;
};

// Whether oneDNN has a bf16 matrix product on this CPU (AVX-512 BF16, AMX, or AVX-512 core
// emulation). Without it Precision::kBF16 rounds the operands to bf16 and runs the fp32
// product: the same numbers (bf16 operands, fp32 accumulation), none of the speed.
bool native_bf16();

// out[i] = x[i] rounded to bf16 (round to nearest even), on the calling thread team.
void round_to_bf16(uint16_t* out, const float* x, int64_t n);
// The same on the calling thread alone (inside a parallel loop), vectorised for AVX-512,
// AVX2 or the baseline, chosen at run time.
void round_to_bf16_serial(uint16_t* out, const float* x, int64_t n);

// How many threads of the OpenMP team (of `team` in all) flush subnormal floats to zero
// (core/float_env.h), each read inside one parallel region.
int threads_flushing_denormals(int* team);

// The MFU denominator: the best of 10 square 1024^3 products in `p` on the calling thread
// team (the library's best case at this machine's clocks and this process's threads).
double measure_peak_gflops(Precision p);

}  // namespace loom::kernels::cpu
