// Element-wise layers: GELU (tanh approximation) and the residual add.
//   gelu(x) = 0.5 x (1 + tanh(s (x + 0.044715 x^3))),  s = sqrt(2/pi)
#include <cmath>

#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {
namespace {
constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
}

void gelu_forward(float* out, const float* inp, size_t n) {
#pragma omp parallel for
  for (size_t i = 0; i < n; ++i) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kS * (x + 0.044715f * x * x * x)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
#pragma omp parallel for
  for (size_t i = 0; i < n; ++i) {
    float x = inp[i];
    float u = kS * (x + 0.044715f * x * x * x);
    float th = std::tanh(u);
    float sech2 = 1.0f - th * th;
    float local = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kS * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += local * dout[i];
  }
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

}  // namespace loom::kernels::cpu
