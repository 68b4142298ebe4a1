// The fast CPU kernels (kernels/cpu: oneDNN products, vectorised loops, approximate exp and
// tanh) against the reference kernels (kernels/reference: plain loops, sums in double),
// kernel by kernel, on GPT-2-like shapes. The error of an output is max|fast - reference|
// over max|reference| (a norm-relative error): at most 1e-5 in fp32. In bf16 both round
// the products' operands the same way, but an fp32 intermediate that differs in its last
// bit (the fast kernel's fp32 sums, exp_approx) can round to the neighbouring bf16 value
// (2^-8 apart) before the next product, so bf16 outputs are held to 1e-4 (measured: 7.9e-6
// for the attention backward, under 4e-7 for the rest; fp32 all under 9e-7).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/kernels/cpu/kernels.h"
#include "loom/kernels/reference/reference.h"
#include "support/randn.h"

namespace loom::kernels {
namespace {
namespace ref = reference;

using test::randint;
using test::randn;

double rel_error(const std::vector<float>& fast, const std::vector<float>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(fast[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return err / std::max(scale, 1e-30);
}

constexpr double kF32 = 1e-5, kBf16 = 1e-4;

// GPT-2-like: 2 sequences of 64 tokens, C 96 over 4 heads, vocabulary 500 padded to 512.
constexpr int B = 2, T = 64, C = 96, NH = 4, V = 500, Vp = 512, N = B * T;

TEST(ReferenceKernels, RoundBf16IsRoundToNearestEven) {
  // bf16 keeps 7 mantissa bits: 1 + 2^-7 is the next value after 1, 1 + 2^-8 the tie.
  constexpr float u = 1.0f / 256;
  EXPECT_EQ(ref::round_bf16(1.0f), 1.0f);
  EXPECT_EQ(ref::round_bf16(1.0f + u), 1.0f);                 // tie: to even (down)
  EXPECT_EQ(ref::round_bf16(1.0f + 3 * u), 1.0f + 4 * u);     // tie: to even (up)
  EXPECT_EQ(ref::round_bf16(1.0f + 1.5f * u), 1.0f + 2 * u);  // above the tie
  EXPECT_EQ(ref::round_bf16(1.0f + 0.5f * u), 1.0f);          // below it
  EXPECT_TRUE(std::isnan(ref::round_bf16(NAN)));
  const std::vector<float> x = randn(1000, 1);
  std::vector<uint16_t> fast(x.size());
  cpu::round_to_bf16(fast.data(), x.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(bf16_to_f32(fast[i]), ref::round_bf16(x[i])) << i;
}

TEST(ReferenceKernels, EncoderAndLayerNorm) {
  const auto tok = randint(N, V, 2);
  const auto wte = randn(static_cast<size_t>(V) * C, 3), wpe = randn(static_cast<size_t>(T) * C, 4);
  std::vector<float> out(N * C), want(N * C);
  cpu::encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  ref::encoder_forward(want.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  EXPECT_LE(rel_error(out, want), kF32);
  const auto dout = randn(N * C, 5);
  std::vector<float> dwte(wte.size()), dwpe(wpe.size()), rdwte(wte.size()), rdwpe(wpe.size());
  cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
  ref::encoder_backward(rdwte.data(), rdwpe.data(), dout.data(), tok.data(), B, T, C);
  EXPECT_LE(rel_error(dwte, rdwte), kF32);
  EXPECT_LE(rel_error(dwpe, rdwpe), kF32);

  const auto x = randn(N * C, 6, 3.0f), w = randn(C, 7), b = randn(C, 8);
  std::vector<float> y(N * C), ry(N * C), mean(N), rstd(N), rmean(N), rrstd(N);
  cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  ref::layernorm_forward(ry.data(), rmean.data(), rrstd.data(), x.data(), w.data(), b.data(), N, C);
  EXPECT_LE(rel_error(y, ry), kF32);
  EXPECT_LE(rel_error(rstd, rrstd), kF32);
  std::vector<float> dx(N * C, 0.5f), dw(C, 0.5f), db(C, 0.5f);  // backward accumulates
  std::vector<float> rdx = dx, rdw = dw, rdb = db;
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
  ref::layernorm_backward(rdx.data(), rdw.data(), rdb.data(), dout.data(), x.data(), w.data(),
                          rmean.data(), rrstd.data(), N, C);
  EXPECT_LE(rel_error(dx, rdx), kF32);
  EXPECT_LE(rel_error(dw, rdw), kF32);
  EXPECT_LE(rel_error(db, rdb), kF32);
}

TEST(ReferenceKernels, MatmulFp32AndBf16) {
  const int OC = 3 * C;
  const auto x = randn(N * C, 9), w = randn(static_cast<size_t>(OC) * C, 10, 0.1f),
             bias = randn(OC, 11), dout = randn(static_cast<size_t>(N) * OC, 12);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const double tol = bf16 ? kBf16 : kF32;
    cpu::Gemm gemm(bf16 ? cpu::Precision::kBF16 : cpu::Precision::kF32);
    std::vector<float> out(static_cast<size_t>(N) * OC), want(out.size());
    cpu::matmul_forward(gemm, out.data(), x.data(), w.data(), bias.data(), N, C, OC);
    ref::matmul_forward(want.data(), x.data(), w.data(), bias.data(), N, C, OC, bf16);
    EXPECT_LE(rel_error(out, want), bf16 ? 1e-5 : kF32);  // no intermediate to round
    std::vector<float> dx(N * C, 0.25f), dw(w.size(), 0.25f), db(OC, 0.25f);
    std::vector<float> rdx = dx, rdw = dw, rdb = db;
    cpu::matmul_backward(gemm, dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N,
                         C, OC);
    ref::matmul_backward(rdx.data(), rdw.data(), rdb.data(), dout.data(), x.data(), w.data(), N, C,
                         OC, bf16);
    EXPECT_LE(rel_error(dx, rdx), tol);
    EXPECT_LE(rel_error(dw, rdw), tol);
    EXPECT_LE(rel_error(db, rdb), kF32);
  }
}

TEST(ReferenceKernels, AttentionFp32AndBf16) {
  const auto qkv = randn(static_cast<size_t>(N) * 3 * C, 13), dout = randn(N * C, 14);
  const size_t natt = static_cast<size_t>(B) * NH * T * T;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const double tol = bf16 ? kBf16 : kF32;
    cpu::Gemm gemm(bf16 ? cpu::Precision::kBF16 : cpu::Precision::kF32);
    std::vector<float> out(N * C), att(natt), want(N * C), ratt(natt);
    cpu::attention_forward(gemm, out.data(), att.data(), qkv.data(), B, T, C, NH);
    ref::attention_forward(want.data(), ratt.data(), qkv.data(), B, T, C, NH, bf16);
    EXPECT_LE(rel_error(att, ratt), tol);
    EXPECT_LE(rel_error(out, want), tol);
    std::vector<float> dqkv(qkv.size(), 0.125f), scratch(natt), rdqkv = dqkv;
    cpu::attention_backward(gemm, dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(),
                            B, T, C, NH);
    ref::attention_backward(rdqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH, bf16);
    EXPECT_LE(rel_error(dqkv, rdqkv), tol);
  }
}

TEST(ReferenceKernels, GeluResidualAndCrossEntropy) {
  const size_t n = static_cast<size_t>(N) * 4 * C;
  const auto x = randn(n, 15, 2.0f), dout = randn(n, 16);
  std::vector<float> y(n), ry(n), dx(n, 1.0f), rdx(n, 1.0f);
  cpu::gelu_forward(y.data(), x.data(), n);
  ref::gelu_forward(ry.data(), x.data(), n);
  EXPECT_LE(rel_error(y, ry), kF32);
  cpu::gelu_backward(dx.data(), x.data(), dout.data(), n);
  ref::gelu_backward(rdx.data(), x.data(), dout.data(), n);
  EXPECT_LE(rel_error(dx, rdx), kF32);
  std::vector<float> s(n), rs(n), da(n, 1.0f), db(n, -1.0f), rda = da, rdb = db;
  cpu::residual_forward(s.data(), x.data(), dout.data(), n);
  ref::residual_forward(rs.data(), x.data(), dout.data(), n);
  EXPECT_LE(rel_error(s, rs), kF32);
  cpu::residual_backward(da.data(), db.data(), dout.data(), n);
  ref::residual_backward(rda.data(), rdb.data(), dout.data(), n);
  EXPECT_LE(rel_error(da, rda), kF32);
  EXPECT_LE(rel_error(db, rdb), kF32);

  auto logits = randn(static_cast<size_t>(N) * Vp, 17, 3.0f);
  for (int r = 0; r < N; ++r)  // padding the loss must ignore, however large
    for (int i = V; i < Vp; ++i) logits[static_cast<size_t>(r) * Vp + i] = 1e4f;
  const auto tgt = randint(N, V, 18);
  std::vector<float> loss(N), rloss(N), mx(N), sum(N);
  cpu::crossentropy_forward(loss.data(), mx.data(), sum.data(), logits.data(), tgt.data(), N, V,
                            Vp);
  ref::crossentropy_forward(rloss.data(), logits.data(), tgt.data(), N, V, Vp);
  EXPECT_LE(rel_error(loss, rloss), kF32);
  const float dloss = 1.0f / N;
  std::vector<float> rd(logits.size());
  ref::crossentropy_backward(rd.data(), logits.data(), tgt.data(), dloss, N, V, Vp);
  cpu::crossentropy_backward_inplace(logits.data(), nullptr, mx.data(), sum.data(), dloss,
                                     tgt.data(), N, V, Vp);
  EXPECT_LE(rel_error(logits, rd), kF32);
}

TEST(ReferenceKernels, AdamW) {
  const size_t n = 4099;  // not a multiple of any vector width
  auto p = randn(n, 19), m = randn(n, 20, 0.01f), v = randn(n, 21, 0.01f);
  for (auto& x : v) x = x * x;
  const auto g = randn(n, 22);
  auto rp = p, rm = m, rv = v;
  for (int t = 1; t <= 3; ++t) {
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t,
                      0.5f);
    ref::adamw_update(rp.data(), g.data(), rm.data(), rv.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                      t, 0.5f);
  }
  EXPECT_LE(rel_error(p, rp), kF32);
  EXPECT_LE(rel_error(m, rm), kF32);
  EXPECT_LE(rel_error(v, rv), kF32);
}

}  // namespace
}  // namespace loom::kernels
