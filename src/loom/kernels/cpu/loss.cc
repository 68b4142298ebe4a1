// Softmax over the real vocabulary (padded logits excluded) and cross-entropy.
// Fused backward: dlogits += (probs - onehot(target)) * dloss.
#include <cmath>

#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

void softmax_forward(float* probs, const float* logits, int N, int V, int Vp) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const float* l = logits + static_cast<size_t>(n) * Vp;
    float* p = probs + static_cast<size_t>(n) * Vp;
    float maxv = -INFINITY;
    for (int i = 0; i < V; ++i) maxv = l[i] > maxv ? l[i] : maxv;
    float sum = 0;
    for (int i = 0; i < V; ++i) {
      p[i] = std::exp(l[i] - maxv);
      sum += p[i];
    }
    for (int i = 0; i < V; ++i) p[i] /= sum;
    for (int i = V; i < Vp; ++i) p[i] = 0;
  }
}

void crossentropy_forward(float* losses, const float* probs, const int* targets, int N, int Vp) {
  for (int n = 0; n < N; ++n)
    losses[n] = -std::log(probs[static_cast<size_t>(n) * Vp + targets[n]]);
}

void crossentropy_softmax_backward(float* dlogits, const float* dlosses, const float* probs,
                                   const int* targets, int N, int V, int Vp) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    float* dl = dlogits + static_cast<size_t>(n) * Vp;
    const float* p = probs + static_cast<size_t>(n) * Vp;
    const float d = dlosses[n];
    for (int i = 0; i < V; ++i) dl[i] += (p[i] - (i == targets[n] ? 1.0f : 0.0f)) * d;
  }
}

}  // namespace loom::kernels::cpu
