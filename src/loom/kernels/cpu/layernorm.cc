// LayerNorm over the channel dimension, eps = 1e-5 (GPT-2 / PyTorch default).
//
// Backward, per row, with xhat = (x - mean) * rstd and dnorm = dout * weight:
//   dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
#include <cmath>

#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  constexpr float kEps = 1e-5f;
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    float m = 0;
    for (int i = 0; i < C; ++i) m += x[i];
    m /= C;
    float var = 0;
    for (int i = 0; i < C; ++i) var += (x[i] - m) * (x[i] - m);
    var /= C;
    float s = 1.0f / std::sqrt(var + kEps);
    float* o = out + static_cast<size_t>(n) * C;
    for (int i = 0; i < C; ++i) o[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
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
  for (int n = 0; n < N; ++n) {  // rows in order, as layernorm_backward accumulates them
    const float* d = dout + static_cast<size_t>(n) * C;
    const float* x = inp + static_cast<size_t>(n) * C;
    const float m = mean[n], s = rstd[n];
    for (int i = 0; i < C; ++i) {
      dbias[i] += d[i];
      dweight[i] += (x[i] - m) * s * d[i];
    }
  }
}

}  // namespace loom::kernels::cpu
