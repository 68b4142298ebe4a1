// Every CPU kernel's backward against central finite differences of its forward, with the
// loss L = sum(out * g) for a fixed random g (so dout = g), measured as the normalised error
// max|analytic - numeric| / max|numeric| over sampled elements (ggml's test-backend-ops idea).
// Also: softmax rows sum to one and ignore padded logits, and AdamW matches a double-precision
// reference of PyTorch's formula.
#include "loom/kernels/cpu/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/kernels/cpu/vecmath.h"
#include "support/randn.h"

namespace loom::kernels::cpu {
namespace {

using test::randn;

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Normalised error of `analytic` against central differences of `loss` w.r.t. x.
double grad_error(std::vector<float>& x, const std::vector<float>& analytic,
                  const std::function<double()>& loss, float eps = 1e-2f, size_t samples = 64) {
  double max_err = 0, max_num = 0;
  size_t stride = std::max<size_t>(1, x.size() / samples);
  for (size_t i = 0; i < x.size(); i += stride) {
    float keep = x[i];
    x[i] = keep + eps;
    double lp = loss();
    x[i] = keep - eps;
    double lm = loss();
    x[i] = keep;
    double num = (lp - lm) / (2.0 * eps);
    max_err = std::max(max_err, std::fabs(num - analytic[i]));
    max_num = std::max(max_num, std::fabs(num));
  }
  return max_err / (max_num + 1e-12);
}

constexpr double kTol = 5e-3;

TEST(Kernels, LayerNormBackward) {
  const int N = 6, C = 16;
  auto x = randn(N * C, 1), w = randn(C, 2), b = randn(C, 3), g = randn(N * C, 4);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return dot(out, g);
  };
  loss();
  std::vector<float> dx(N * C, 0), dw(C, 0), db(C, 0);
  layernorm_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  EXPECT_LT(grad_error(x, dx, loss), kTol);
  EXPECT_LT(grad_error(w, dw, loss), kTol);
  EXPECT_LT(grad_error(b, db, loss), kTol);
}

TEST(Kernels, MatmulBackward) {
  const int N = 5, C = 7, OC = 9;
  auto x = randn(N * C, 5), w = randn(OC * C, 6), b = randn(OC, 7), g = randn(N * OC, 8);
  std::vector<float> out(N * OC);
  Gemm gemm;
  auto loss = [&] {
    matmul_forward(gemm, out.data(), x.data(), w.data(), b.data(), N, C, OC);
    return dot(out, g);
  };
  loss();
  // the forward itself, against a triple loop
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = b[o];
      for (int c = 0; c < C; ++c) s += static_cast<double>(x[n * C + c]) * w[o * C + c];
      EXPECT_NEAR(out[n * OC + o], s, 1e-4);
    }
  std::vector<float> dx(N * C, 0), dw(OC * C, 0), db(OC, 0);
  matmul_backward(gemm, dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), N, C, OC);
  EXPECT_LT(grad_error(x, dx, loss), kTol);
  EXPECT_LT(grad_error(w, dw, loss), kTol);
  EXPECT_LT(grad_error(b, db, loss), kTol);
}

// bf16 mode rounds both operands to bf16 and accumulates in fp32: the result matches a
// double-precision product of the rounded operands, and differs from the fp32 product.
TEST(Kernels, Bf16MatmulRoundsOperandsAndAccumulatesInF32) {
  const int N = 33, C = 70, OC = 17;
  auto x = randn(N * C, 30), w = randn(OC * C, 31);
  std::vector<float> out(N * OC), out32(N * OC);
  Gemm gemm(Precision::kBF16), gemm32;
  matmul_forward(gemm, out.data(), x.data(), w.data(), nullptr, N, C, OC);
  matmul_forward(gemm32, out32.data(), x.data(), w.data(), nullptr, N, C, OC);
  double max_diff32 = 0;
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = 0;
      for (int c = 0; c < C; ++c)
        s += static_cast<double>(bf16_to_f32(f32_to_bf16(x[n * C + c]))) *
             bf16_to_f32(f32_to_bf16(w[o * C + c]));
      EXPECT_NEAR(out[n * OC + o], s, 1e-4 * (1 + std::fabs(s)));
      max_diff32 = std::max(max_diff32, std::fabs(out32[n * OC + o] - s));
    }
  EXPECT_GT(max_diff32, 1e-3);  // the fp32 product is measurably different
}

// The fused forward passes give exactly the unfused ones' numbers: the residual add and the
// LayerNorm that reads it, and the bf16 rounding of LayerNorm's and GELU's outputs (which the
// next product reads instead of rounding them itself). Odd widths exercise the vector tails.
TEST(Kernels, FusedResidualLayerNormAndBf16OutputsEqualTheUnfusedPasses) {
  for (int C : {7, 77, 389}) {
    const int N = 13;
    auto a = randn(N * C, 50), b = randn(N * C, 51), w = randn(C, 52), bias = randn(C, 53);
    std::vector<float> res(N * C), out(N * C), mean(N), rstd(N);
    residual_forward(res.data(), a.data(), b.data(), res.size());
    layernorm_forward(out.data(), mean.data(), rstd.data(), res.data(), w.data(), bias.data(), N,
                      C);
    std::vector<float> res2(N * C), out2(N * C), mean2(N), rstd2(N);
    std::vector<uint16_t> out16(N * C);
    residual_layernorm_forward(res2.data(), out2.data(), mean2.data(), rstd2.data(), a.data(),
                               b.data(), w.data(), bias.data(), N, C, out16.data());
    EXPECT_EQ(res2, res);
    EXPECT_EQ(out2, out);
    EXPECT_EQ(mean2, mean);
    EXPECT_EQ(rstd2, rstd);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out16[i], f32_to_bf16(out[i])) << i;
    std::vector<uint16_t> ln16(N * C);
    layernorm_forward(out2.data(), mean2.data(), rstd2.data(), res.data(), w.data(), bias.data(), N,
                      C, ln16.data());
    EXPECT_EQ(out2, out);
    EXPECT_EQ(ln16, out16);
  }
  const size_t n = (1 << 15) + 333;  // two chunks and a tail
  auto x = randn(n, 54, 3.0f);
  std::vector<float> g(n), g2(n);
  std::vector<uint16_t> g16(n);
  gelu_forward(g.data(), x.data(), n);
  gelu_forward(g2.data(), x.data(), n, g16.data());
  EXPECT_EQ(g2, g);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(g16[i], f32_to_bf16(g[i])) << i;
}

// A bf16 product reads the input's bf16 copy where one is given (here deliberately another
// matrix's: the result is that matrix's product) and adds the bias inside the product.
TEST(Kernels, Bf16MatmulReadsTheGivenInputRoundingAndAddsTheBias) {
  if (!native_bf16()) GTEST_SKIP() << "no native bf16 products on this CPU";
  const int N = 33, C = 70, OC = 17;
  auto x = randn(N * C, 60), other = randn(N * C, 61), w = randn(OC * C, 62), b = randn(OC, 63);
  std::vector<uint16_t> other16(N * C);
  for (size_t i = 0; i < other.size(); ++i) other16[i] = f32_to_bf16(other[i]);
  Gemm gemm(Precision::kBF16);
  std::vector<float> out(N * OC), expect(N * OC);
  matmul_forward(gemm, out.data(), x.data(), w.data(), b.data(), N, C, OC, nullptr, other16.data());
  matmul_forward(gemm, expect.data(), other.data(), w.data(), b.data(), N, C, OC);
  EXPECT_EQ(out, expect);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = b[o];
      for (int c = 0; c < C; ++c)
        s += static_cast<double>(bf16_to_f32(other16[n * C + c])) *
             bf16_to_f32(f32_to_bf16(w[o * C + c]));
      EXPECT_NEAR(out[n * OC + o], s, 1e-4 * (1 + std::fabs(s)));
    }
}

// A backward told to assign writes its input gradient over whatever the buffer held (NaN
// here): the same numbers as adding into zeros, in fp32 and bf16 products.
TEST(Kernels, AssigningBackwardsEqualAccumulatingIntoZeros) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (Precision p : {Precision::kF32, Precision::kBF16}) {
    Gemm gemm(p);
    const int B = 2, T = 7, C = 8, NH = 2, N = B * T, OC = 12;
    auto x = randn(N * 3 * C, 70), g = randn(N * C, 71), att = randn(B * NH * T * T, 72);
    std::vector<float> out(N * C), scratch(att.size());
    attention_forward(gemm, out.data(), att.data(), x.data(), B, T, C, NH);
    std::vector<float> acc(x.size(), 0.0f), put(x.size(), nan);
    attention_backward(gemm, acc.data(), scratch.data(), g.data(), x.data(), att.data(), B, T, C,
                       NH);
    attention_backward(gemm, put.data(), scratch.data(), g.data(), x.data(), att.data(), B, T, C,
                       NH, true);
    EXPECT_EQ(put, acc);
    auto w = randn(OC * C, 73), d = randn(N * OC, 74);
    std::vector<float> in_acc(N * C, 0.0f), in_put(N * C, nan), dw(OC * C, 0.0f), db(OC, 0.0f);
    matmul_backward(gemm, in_acc.data(), dw.data(), db.data(), d.data(), out.data(), w.data(), N, C,
                    OC);
    matmul_backward(gemm, in_put.data(), dw.data(), db.data(), d.data(), out.data(), w.data(), N, C,
                    OC, nullptr, nullptr, true);
    EXPECT_EQ(in_put, in_acc);
    std::vector<float> ge_acc(g.size(), 0.0f), ge_put(g.size(), nan);
    gelu_backward(ge_acc.data(), out.data(), g.data(), g.size());
    gelu_backward(ge_put.data(), out.data(), g.data(), g.size(), true);
    EXPECT_EQ(ge_put, ge_acc);
  }
}

// The few-row products: exactly the weights' values (fp32, or bf16 widened) times fp32 inputs,
// summed in fp32, plus the bias. C = 100: the unrolled loop, single pieces and a scalar tail;
// OC = 71: the last block of 64 columns is 7 wide (past the weight rows taken at once, 8 or 2,
// columns one at a time); rows 1 to 3 (several sums per row), 5 and 8 (several weight rows at
// once), 11 (a group of 8, then 3).
// Every instruction set the kernels are built for that this CPU has.
TEST(Kernels, FewRowMatmul) {
  const int C = 100, OC = 71;
  for (RowsIsa isa : {RowsIsa::kAvx512, RowsIsa::kAvx2, RowsIsa::kBaseline, RowsIsa::kAuto}) {
    if (!rows_isa_available(isa)) {
      std::printf("few-row products: instruction set %d not on this CPU, not run\n",
                  static_cast<int>(isa));
      continue;
    }
    for (int R : {1, 2, 3, 5, 8, 11})
      for (bool bf16 : {false, true}) {
        auto x = randn(R * C, 40), w = randn(OC * C, 41), b = randn(OC, 42);
        std::vector<uint16_t> h(w.size());
        for (size_t i = 0; i < w.size(); ++i) h[i] = f32_to_bf16(w[i]);
        if (bf16)
          for (size_t i = 0; i < w.size(); ++i) w[i] = bf16_to_f32(h[i]);
        std::vector<float> out(R * OC);
        if (bf16)
          matmul_forward_rows_bf16(out.data(), x.data(), h.data(), b.data(), R, C, OC, isa);
        else
          matmul_forward_rows(out.data(), x.data(), w.data(), b.data(), R, C, OC, isa);
        for (int r = 0; r < R; ++r)
          for (int o = 0; o < OC; ++o) {
            double s = b[o];
            for (int c = 0; c < C; ++c) s += static_cast<double>(x[r * C + c]) * w[o * C + c];
            EXPECT_NEAR(out[r * OC + o], s, 1e-5 * (1 + std::fabs(s)))
                << "isa " << static_cast<int>(isa) << (bf16 ? " bf16 " : " fp32 ") << R
                << " rows, row " << r << ", column " << o;
          }
      }
  }
}

// Attention of new rows over cached keys and values equals attention_forward's rows.
TEST(Kernels, AttentionDecodeEqualsCausalAttention) {
  const int T = 9, C = 8, NH = 2, hs = C / NH, cap = 12;
  auto qkv = randn(T * 3 * C, 43, 2.0f);
  std::vector<float> want(T * C), att(NH * T * T);
  Gemm gemm;
  attention_forward(gemm, want.data(), att.data(), qkv.data(), 1, T, C, NH);
  // The cache (NH, cap, hs) of keys and values at positions 0..T-1.
  std::vector<float> kc(NH * cap * hs), vc(NH * cap * hs);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < hs; ++i) {
        kc[(h * cap + t) * hs + i] = qkv[t * 3 * C + C + h * hs + i];
        vc[(h * cap + t) * hs + i] = qkv[t * 3 * C + 2 * C + h * hs + i];
      }
  // Rows 2, 8 and 5 (any order), each attending to its prefix.
  const int rows[] = {2, 8, 5};
  std::vector<float> q(3 * 3 * C), out(3 * C), scratch(3 * NH * cap);
  std::vector<const float*> k(3, kc.data()), v(3, vc.data());
  std::vector<int> len;
  for (int r = 0; r < 3; ++r) {
    std::copy_n(&qkv[rows[r] * 3 * C], 3 * C, &q[r * 3 * C]);
    len.push_back(rows[r] + 1);
  }
  attention_decode(out.data(), scratch.data(), q.data(), k.data(), v.data(), len.data(), 3, C, NH,
                   cap);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < C; ++c) EXPECT_NEAR(out[r * C + c], want[rows[r] * C + c], 1e-5);
}

TEST(Kernels, AttentionBackwardAndCausality) {
  const int B = 2, T = 5, C = 8, NH = 2;
  auto x = randn(B * T * 3 * C, 9), g = randn(B * T * C, 10);
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  Gemm gemm;
  auto loss = [&] {
    attention_forward(gemm, out.data(), att.data(), x.data(), B, T, C, NH);
    return dot(out, g);
  };
  loss();
  std::vector<float> dx(x.size(), 0), scratch(att.size(), 0);
  attention_backward(gemm, dx.data(), scratch.data(), g.data(), x.data(), att.data(), B, T, C, NH);
  EXPECT_LT(grad_error(x, dx, loss, 1e-2f, 240), kTol);
  // Causality: the output at t=0 does not depend on any later position.
  auto first = out;
  x[(0 * T + 3) * 3 * C + C + 1] += 1.0f;      // a key at t=3
  x[(0 * T + 4) * 3 * C + 2 * C + 1] += 1.0f;  // a value at t=4
  loss();
  for (int i = 0; i < C; ++i) EXPECT_EQ(out[i], first[i]);
}

TEST(Kernels, VectorExpAndTanhAreAccurate) {
  double max_rel = 0, max_abs = 0;
  for (double d = -87.0; d <= 88.0; d += 0.001) {
    const float x = static_cast<float>(d);
    const double e = std::exp(static_cast<double>(x));
    max_rel = std::max(max_rel, std::fabs(exp_approx(x) - e) / e);
  }
  for (double d = -20.0; d <= 20.0; d += 0.0001) {
    const float x = static_cast<float>(d);
    max_abs = std::max(max_abs, std::fabs(tanh_approx(x) - std::tanh(static_cast<double>(x))));
  }
  EXPECT_LT(max_rel, 5e-7);
  EXPECT_LT(max_abs, 1e-6);
  EXPECT_EQ(exp_approx(-1000.0f), exp_approx(-87.0f));  // clamped, no denormals or NaN
}

TEST(Kernels, GeluBackward) {
  auto x = randn(200, 11, 2.0f), g = randn(200, 12);
  std::vector<float> out(200);
  auto loss = [&] {
    gelu_forward(out.data(), x.data(), x.size());
    return dot(out, g);
  };
  loss();
  EXPECT_NEAR(
      out[0],
      0.5 * x[0] * (1 + std::tanh(std::sqrt(2 / M_PI) * (x[0] + 0.044715 * std::pow(x[0], 3)))),
      1e-5);
  std::vector<float> dx(200, 0);
  gelu_backward(dx.data(), x.data(), g.data(), x.size());
  EXPECT_LT(grad_error(x, dx, loss, 1e-3f, 200), kTol);
}

TEST(Kernels, EncoderAndResidualBackward) {
  const int B = 2, T = 3, C = 4, V = 5;
  std::vector<int> tok{1, 4, 1, 0, 2, 1};
  auto wte = randn(V * C, 13), wpe = randn(T * C, 14), g = randn(B * T * C, 15);
  std::vector<float> out(B * T * C);
  auto loss = [&] {
    encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, g);
  };
  loss();
  std::vector<float> dwte(V * C, 0), dwpe(T * C, 0);
  encoder_backward(dwte.data(), dwpe.data(), g.data(), tok.data(), B, T, C);
  EXPECT_LT(grad_error(wte, dwte, loss), kTol);
  EXPECT_LT(grad_error(wpe, dwpe, loss), kTol);
  std::vector<float> a = randn(10, 16), b2 = randn(10, 17), r(10), da(10, 1), db(10, 0);
  residual_forward(r.data(), a.data(), b2.data(), 10);
  residual_backward(da.data(), db.data(), g.data(), 10);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(r[i], a[i] + b2[i]);
    EXPECT_EQ(da[i], 1 + g[i]);  // accumulates
    EXPECT_EQ(db[i], g[i]);
  }
}

// The fused softmax + cross-entropy: losses against the formula in double, dlogits against
// finite differences of the loss, padding ignored and given zero gradient, and the bf16 copy
// written in the same pass equal to the rounding of the fp32 gradient.
TEST(Kernels, SoftmaxCrossEntropyWithPaddedVocabulary) {
  const int N = 4, V = 10, Vp = 16;
  auto logits = randn(N * Vp, 18, 2.0f);
  const float dl = 0.7f;  // loss = dl * sum of the per-position losses
  for (int n = 0; n < N; ++n)
    for (int i = V; i < Vp; ++i) logits[n * Vp + i] = 100.0f;  // padding must not matter
  std::vector<int> targets{0, 3, 9, 5};
  std::vector<float> losses(N), mx(N), sum(N);
  auto loss = [&] {
    crossentropy_forward(losses.data(), mx.data(), sum.data(), logits.data(), targets.data(), N, V,
                         Vp);
    double total = 0;
    for (float x : losses) total += x;
    return dl * total;
  };
  loss();
  for (int n = 0; n < N; ++n) {
    double s = 0;
    for (int i = 0; i < V; ++i) s += std::exp(static_cast<double>(logits[n * Vp + i]));
    const double want = std::log(s) - logits[n * Vp + targets[n]];
    EXPECT_NEAR(losses[n], want, 1e-5 * std::fabs(want) + 1e-6) << "row " << n;
  }
  std::vector<float> dlogits = logits, again = logits;
  std::vector<uint16_t> d16(N * Vp, 0xffff);
  crossentropy_backward_inplace(dlogits.data(), nullptr, mx.data(), sum.data(), dl, targets.data(),
                                N, V, Vp);
  crossentropy_backward_inplace(again.data(), d16.data(), mx.data(), sum.data(), dl, targets.data(),
                                N, V, Vp);
  for (int i = 0; i < N * Vp; ++i) {
    ASSERT_EQ(again[i], dlogits[i]) << i;
    ASSERT_EQ(d16[i], f32_to_bf16(dlogits[i])) << i;
  }
  for (int n = 0; n < N; ++n)
    for (int i = V; i < Vp; ++i) EXPECT_EQ(dlogits[n * Vp + i], 0.0f);
  EXPECT_LT(grad_error(logits, dlogits, loss, 1e-2f, N * Vp), kTol);
}

TEST(Kernels, AdamWMatchesTheReferenceFormula) {
  const size_t n = 50;
  auto p = randn(n, 20), m = std::vector<float>(n, 0), v = std::vector<float>(n, 0);
  std::vector<double> rp(p.begin(), p.end()), rm(n, 0), rv(n, 0);
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  for (int t = 1; t <= 5; ++t) {
    auto g = randn(n, 100 + t);
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, t);
    for (size_t i = 0; i < n; ++i) {
      rp[i] -= lr * wd * rp[i];
      rm[i] = b1 * rm[i] + (1 - b1) * g[i];
      rv[i] = b2 * rv[i] + (1 - b2) * double(g[i]) * g[i];
      double mh = rm[i] / (1 - std::pow(double(b1), t)), vh = rv[i] / (1 - std::pow(double(b2), t));
      rp[i] -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], rp[i], 1e-5);
}

}  // namespace
}  // namespace loom::kernels::cpu
