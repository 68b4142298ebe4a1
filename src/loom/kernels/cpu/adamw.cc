// AdamW as PyTorch's torch.optim.AdamW computes it (decoupled weight decay), on gradients
// multiplied by grad_scale (clipping):
//   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
#include <cmath>

#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t,
                  float grad_scale) {
  const float c1 = 1.0f - std::pow(beta1, static_cast<float>(t));
  const float c2 = 1.0f - std::pow(beta2, static_cast<float>(t));
#pragma omp parallel for
  for (size_t i = 0; i < n; ++i) {
    float g = grads[i] * grad_scale;
    params[i] -= lr * weight_decay * params[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    float mhat = m[i] / c1, vhat = v[i] / c2;
    params[i] -= lr * mhat / (std::sqrt(vhat) + eps);
  }
}

}  // namespace loom::kernels::cpu
