// LayerNorm over the channel dimension, eps = 1e-5 (GPT-2 / PyTorch default); the forward
// optionally fused with the residual add before it and the bf16 rounding of its output.
//
// Backward, per row, with xhat = (x - mean) * rstd and dnorm = dout * weight:
//   dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
#include <algorithm>
#include <cmath>

#include "loom/kernels/cpu/kernels.h"
#include "loom/kernels/cpu/vecmath.h"

namespace loom::kernels::cpu {

namespace {
constexpr float kEps = 1e-5f;

// One row of C: res = a + b where a residual add comes first (b non-null; else res = a is
// the input), its mean and rstd, out, and out's bf16 rounding where asked.
LOOM_VECTOR_CLONES void layernorm_row(float* res, float* out, uint16_t* out16, float* mean,
                                      float* rstd, const float* a, const float* b,
                                      const float* weight, const float* bias, int C) {
  const float* x = a;
  if (b) {
#pragma omp simd
    for (int i = 0; i < C; ++i) res[i] = a[i] + b[i];
    x = res;
  }
  float m = 0;
#pragma omp simd reduction(+ : m)
  for (int i = 0; i < C; ++i) m += x[i];
  m /= C;
  float var = 0;
#pragma omp simd reduction(+ : var)
  for (int i = 0; i < C; ++i) var += (x[i] - m) * (x[i] - m);
  var /= C;
  const float s = 1.0f / std::sqrt(var + kEps);
#pragma omp simd
  for (int i = 0; i < C; ++i) out[i] = (x[i] - m) * s * weight[i] + bias[i];
  if (out16) round_to_bf16_serial(out16, out, C);
  *mean = m;
  *rstd = s;
}

void layernorm_rows(float* res, float* out, uint16_t* out16, float* mean, float* rstd,
                    const float* a, const float* b, const float* weight, const float* bias, int N,
                    int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const size_t o = static_cast<size_t>(n) * C;
    layernorm_row(b ? res + o : nullptr, out + o, out16 ? out16 + o : nullptr, mean + n, rstd + n,
                  a + o, b ? b + o : nullptr, weight, bias, C);
  }
}
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, uint16_t* out16) {
  layernorm_rows(nullptr, out, out16, mean, rstd, inp, nullptr, weight, bias, N, C);
}

void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                const float* b, const float* weight, const float* bias, int N,
                                int C, uint16_t* out16) {
  layernorm_rows(res, out, out16, mean, rstd, a, b, weight, bias, N, C);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  layernorm_backward_input(dinp, dout, inp, weight, mean, rstd, N, C);
  layernorm_backward_weight(dweight, dbias, dout, inp, mean, rstd, N, C);
}

void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* weight,
                              const float* mean, const float* rstd, int N, int C) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const float* d = dout + static_cast<size_t>(n) * C;
    const float* x = inp + static_cast<size_t>(n) * C;
    float* dx = dinp + static_cast<size_t>(n) * C;
    const float m = mean[n], s = rstd[n];
    float dnorm_mean = 0, dnorm_xhat_mean = 0;
    for (int i = 0; i < C; ++i) {
      float xhat = (x[i] - m) * s;
      float dnorm = d[i] * weight[i];
      dnorm_mean += dnorm;
      dnorm_xhat_mean += dnorm * xhat;
    }
    dnorm_mean /= C;
    dnorm_xhat_mean /= C;
    for (int i = 0; i < C; ++i) {
      float xhat = (x[i] - m) * s;
      dx[i] += s * (d[i] * weight[i] - dnorm_mean - xhat * dnorm_xhat_mean);
    }
  }
}

void layernorm_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int N, int C) {
  // Each thread owns a block of columns and adds the rows into it in order: every column's
  // sum is the same sequence of additions as one thread's row-by-row loop.
  constexpr int kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int i0 = 0; i0 < C; i0 += kBlock) {
    const int i1 = std::min(C, i0 + kBlock);
    for (int n = 0; n < N; ++n) {
      const float* d = dout + static_cast<size_t>(n) * C;
      const float* x = inp + static_cast<size_t>(n) * C;
      const float m = mean[n], s = rstd[n];
#pragma omp simd
      for (int i = i0; i < i1; ++i) {
        dbias[i] += d[i];
        dweight[i] += (x[i] - m) * s * d[i];
      }
    }
  }
}

}  // namespace loom::kernels::cpu
