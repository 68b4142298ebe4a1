// AdamW as PyTorch's torch.optim.AdamW computes it (decoupled weight decay), on gradients
// multiplied by grad_scale (clipping):
//   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
#include <cmath>

#include "loom/kernels/cpu/chunks.h"
#include "loom/kernels/cpu/kernels.h"
#include "loom/kernels/cpu/vecmath.h"

namespace loom::kernels::cpu {

namespace {
// One chunk, on the calling thread: element-wise, so every clone gives the same bits (IEEE
// division and square root), only wider.
LOOM_VECTOR_CLONES void adamw_chunk(float* params, const float* grads, float* m, float* v, size_t n,
                                    float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float c1, float c2, float grad_scale) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) {
    float g = grads[i] * grad_scale;
    float p = params[i];
    p -= lr * weight_decay * p;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / c1, vhat = vi / c2;
    params[i] = p - lr * mhat / (std::sqrt(vhat) + eps);
  }
}
}  // namespace

void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t,
                  float grad_scale) {
  const float c1 = 1.0f - std::pow(beta1, static_cast<float>(t));
  const float c2 = 1.0f - std::pow(beta2, static_cast<float>(t));
  for_each_chunk(n, [&](size_t c, size_t k) {
    adamw_chunk(params + c, grads + c, m + c, v + c, k, lr, beta1, beta2, eps, weight_decay, c1, c2,
                grad_scale);
  });
}

}  // namespace loom::kernels::cpu
