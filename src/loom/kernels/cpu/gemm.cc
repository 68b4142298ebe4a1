#include "loom/kernels/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <dnnl.hpp>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/core/check.h"
#include "loom/core/dtype.h"
#include "loom/core/float_env.h"
#include "loom/core/tunable.h"
#include "loom/kernels/cpu/chunks.h"
#include "loom/kernels/cpu/vecmath.h"
#include "loom/profile/trace.h"

namespace loom::kernels::cpu {

namespace {

const DoubleTunable kTraceGemmMflop("LOOM_TRACE_GEMM_MFLOP", 50.0,
                                    "the timeline shows matrix products of at least this many "
                                    "MFLOP (train.profile)");
using dnnl::memory;

// Elements from the view's first to its last one, inclusive (strides are non-negative).
int64_t span(const GemmShape& s, const MatrixView& v, int64_t rows, int64_t cols) {
  return (s.batch0 - 1) * v.batch0 + (s.batch1 - 1) * v.batch1 + (rows - 1) * v.row_stride +
         (cols - 1) * v.col_stride + 1;
}

memory::desc describe(const GemmShape& s, const MatrixView& v, int64_t rows, int64_t cols,
                      memory::data_type dt) {
  if (s.batch0 == 1 && s.batch1 == 1)
    return memory::desc({rows, cols}, dt, {v.row_stride, v.col_stride});
  return memory::desc({s.batch0, s.batch1, rows, cols}, dt,
                      {v.batch0, v.batch1, v.row_stride, v.col_stride});
}

void to_bf16(std::vector<uint16_t>& out, const float* in, int64_t n) {
  if (static_cast<int64_t>(out.size()) < n) out.resize(n);
  round_to_bf16(out.data(), in, n);
}
// Operands rounded to bf16 and kept as floats: what a bf16 product reads, for the fp32
// primitive (CPUs without bf16 instructions); widened from the caller's bf16 copy where it
// hands one along (the same values: its fp32 values may not be in memory, zero.offload_master).
void round_bf16(std::vector<float>& out, const float* in, const uint16_t* in16, int64_t n) {
  if (static_cast<int64_t>(out.size()) < n) out.resize(n);
  float* o = out.data();
  if (in16) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = bf16_to_f32(in16[i]);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = bf16_to_f32(f32_to_bf16(in[i]));
}

}  // namespace

LOOM_VECTOR_CLONES void round_to_bf16_serial(uint16_t* out, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(x[i]);
}

void round_to_bf16(uint16_t* out, const float* x, int64_t n) {
  for_each_chunk(static_cast<size_t>(n), [&](size_t c, size_t k) {
    round_to_bf16_serial(out + c, x + c, static_cast<int64_t>(k));
  });
}

bool native_bf16() {
  static const bool ok = [] {
    try {
      dnnl::engine e(dnnl::engine::kind::cpu, 0);
      const memory::desc d({2, 2}, memory::data_type::bf16, memory::format_tag::ab);
      const memory::desc f({2, 2}, memory::data_type::f32, memory::format_tag::ab);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(d, d, f), e);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

struct Gemm::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<std::array<int64_t, 21>, dnnl::matmul> cache;
  std::vector<uint16_t> a16, b16;
  std::array<std::vector<uint16_t>, kStagingSlots> staged;
  std::vector<float> a32, b32;  // rounded operands (bf16 without native support)
};

Gemm::Gemm(Precision precision) : impl_(std::make_unique<Impl>()), precision_(precision) {}
Gemm::~Gemm() = default;

bool Gemm::reads_bf16() const {
  return precision_ == Precision::kBF16 && native_bf16();
}

uint16_t* Gemm::staging_bf16(int64_t n, int slot) {
  if (!reads_bf16() || !staging_) return nullptr;
  LOOM_CHECK(slot >= 0 && slot < kStagingSlots);
  auto& buf = impl_->staged[slot];
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}

const uint16_t* Gemm::stage_bf16(const float* x, int64_t n, int slot) {
  uint16_t* out = staging_bf16(n, slot);
  if (out) round_to_bf16(out, x, n);
  return out;
}

void Gemm::run(const GemmShape& s, MatrixView a, MatrixView b, MatrixView c, float alpha,
               bool accumulate, const float* bias) {
  if (s.M == 0 || s.N == 0 || s.batch0 == 0 || s.batch1 == 0) return;
  LOOM_CHECK_LT(0, s.K);
  LOOM_CHECK(!bias || (s.batch0 == 1 && s.batch1 == 1));
  // The timeline shows products of at least LOOM_TRACE_GEMM_MFLOP (their name the shape).
  std::optional<TraceSpan> trace;
  if (Trace::on()) {
    const double flops = 2.0 * s.M * s.N * s.K * s.batch0 * s.batch1;
    if (flops >= kTraceGemmMflop.get() * 1e6)
      trace.emplace("gemm " + std::to_string(s.batch0 * s.batch1) + "x" + std::to_string(s.M) +
                        "x" + std::to_string(s.N) + "x" + std::to_string(s.K),
                    "kernel", Trace::kCompute);
  }
  // bf16: the library's bf16 product where the CPU has one; otherwise the same numbers (bf16
  // operands, fp32 accumulation) from the fp32 product over operands rounded to bf16.
  const bool rounded = precision_ == Precision::kBF16;
  const bool bf16 = reads_bf16();
  const memory::data_type in_t = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  memory::desc ad = describe(s, a, s.M, s.K, in_t), bd = describe(s, b, s.K, s.N, in_t),
               cd = describe(s, c, s.M, s.N, memory::data_type::f32);
  // The primitive's identity: shape, every view's strides, precision, mode, alpha, bias.
  // clang-format off
  const std::array<int64_t, 21> key = {
      s.M, s.N, s.K, s.batch0, s.batch1,
      a.row_stride, a.col_stride, a.batch0, a.batch1,
      b.row_stride, b.col_stride, b.batch0, b.batch1,
      c.row_stride, c.col_stride, c.batch0, c.batch1,
      bf16, accumulate, static_cast<int64_t>(std::bit_cast<uint32_t>(alpha)), bias != nullptr};
  // clang-format on
  const memory::desc biasd({1, s.N}, memory::data_type::f32, {s.N, 1});
  auto it = impl_->cache.find(key);
  if (it == impl_->cache.end()) {
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd(
        bias ? dnnl::matmul::desc(ad, bd, biasd, cd) : dnnl::matmul::desc(ad, bd, cd), attr,
        impl_->engine);
    it = impl_->cache.emplace(key, dnnl::matmul(pd)).first;
  }
  void* ap = const_cast<float*>(a.data);
  void* bp = const_cast<float*>(b.data);
  if (bf16) {
    // The caller's bf16 copy of an operand, or the operand rounded into `buf`.
    auto operand = [](const MatrixView& v, std::vector<uint16_t>& buf, int64_t n) -> void* {
      if (v.bf16) return const_cast<uint16_t*>(v.bf16);
      to_bf16(buf, v.data, n);
      return buf.data();
    };
    ap = operand(a, impl_->a16, span(s, a, s.M, s.K));
    bp = operand(b, impl_->b16, span(s, b, s.K, s.N));
  } else if (rounded) {
    round_bf16(impl_->a32, a.data, a.bf16, span(s, a, s.M, s.K));
    round_bf16(impl_->b32, b.data, b.bf16, span(s, b, s.K, s.N));
    ap = impl_->a32.data();
    bp = impl_->b32.data();
  }
  memory am(ad, impl_->engine, ap), bm(bd, impl_->engine, bp),
      cm(cd, impl_->engine, const_cast<float*>(c.data));
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(biasd, impl_->engine, const_cast<float*>(bias)));
  it->second.execute(impl_->stream, args);
  impl_->stream.wait();
}

int threads_flushing_denormals(int* team) {
  int n = 0, flushing = 0;
#pragma omp parallel reduction(+ : n, flushing)
  {
    n += 1;
    flushing += flushing_denormals() ? 1 : 0;
  }
  if (team) *team = n;
  return flushing;
}

double measure_peak_gflops(Precision p) {
  constexpr int64_t n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  Gemm gemm(p);
  double best = 1e30;
  for (int i = 0; i < 11; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm.run({n, n, n}, {a.data(), n, 1}, {b.data(), n, 1}, {c.data(), n, 1}, 1.0f, false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) best = std::min(best, s);  // the first run builds the primitive
  }
  return 2.0 * n * n * n / best / 1e9;
}

}  // namespace loom::kernels::cpu
