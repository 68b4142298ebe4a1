// Softmax over the real vocabulary (padded logits excluded) and cross-entropy.
// Fused backward, in place: dlogits = (probs - onehot(target)) * dloss.
#include <cmath>

#include "loom/kernels/cpu/kernels.h"
#include "loom/kernels/cpu/vecmath.h"

namespace loom::kernels::cpu {

namespace {
// One row: probs[i] = e^(l[i] - max) / sum over the first V entries; padding gets 0.
// In place is allowed (probs == logits).
LOOM_VECTOR_CLONES void softmax_row(float* p, const float* l, int V, int Vp) {
  float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
  for (int i = 0; i < V; ++i) maxv = l[i] > maxv ? l[i] : maxv;
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < V; ++i) {
    p[i] = exp_approx(l[i] - maxv);
    sum += p[i];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int i = 0; i < V; ++i) p[i] *= inv;
  for (int i = V; i < Vp; ++i) p[i] = 0;
}

LOOM_VECTOR_CLONES void scale_row(float* p, float s, int V) {
#pragma omp simd
  for (int i = 0; i < V; ++i) p[i] *= s;
}

LOOM_VECTOR_CLONES float max_of_row(const float* l, int n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int i = 0; i < n; ++i) m = l[i] > m ? l[i] : m;
  return m;
}

// p[i] = e^(p[i] - m) in place; returns the sum.
LOOM_VECTOR_CLONES float exp_row(float* p, float m, int n) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < n; ++i) {
    p[i] = exp_approx(p[i] - m);
    sum += p[i];
  }
  return sum;
}
}  // namespace

void softmax_forward(float* probs, const float* logits, int N, int V, int Vp) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n)
    softmax_row(probs + static_cast<size_t>(n) * Vp, logits + static_cast<size_t>(n) * Vp, V, Vp);
}

void crossentropy_forward(float* losses, const float* probs, const int* targets, int N, int Vp) {
  for (int n = 0; n < N; ++n)
    losses[n] = -std::log(probs[static_cast<size_t>(n) * Vp + targets[n]]);
}

void crossentropy_softmax_backward_inplace(float* probs, float dloss, const int* targets, int N,
                                           int V, int Vp) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    float* p = probs + static_cast<size_t>(n) * Vp;
    scale_row(p, dloss, V);
    p[targets[n]] -= dloss;
  }
}

// ---- vocabulary shards ----

void logits_shard_max(float* maxv, const float* logits, int N, int Vl, int valid) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) maxv[n] = max_of_row(logits + static_cast<size_t>(n) * Vl, valid);
}

void logits_shard_target(float* picked, const float* logits, const int* targets, int N, int Vl,
                         int vbegin, int valid) {
  for (int n = 0; n < N; ++n) {
    const int i = targets[n] - vbegin;
    picked[n] = i >= 0 && i < valid ? logits[static_cast<size_t>(n) * Vl + i] : 0.0f;
  }
}

void softmax_shard_exp(float* logits, float* sums, const float* maxv, int N, int Vl, int valid) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    float* p = logits + static_cast<size_t>(n) * Vl;
    sums[n] = exp_row(p, maxv[n], valid);
    for (int i = valid; i < Vl; ++i) p[i] = 0;
  }
}

void softmax_shard_scale(float* probs, const float* sums, int N, int Vl, int valid) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) scale_row(probs + static_cast<size_t>(n) * Vl, 1.0f / sums[n], valid);
}

void crossentropy_shard_backward_inplace(float* probs, float dloss, const int* targets, int N,
                                         int Vl, int vbegin, int valid) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    float* p = probs + static_cast<size_t>(n) * Vl;
    scale_row(p, dloss, valid);
    const int i = targets[n] - vbegin;
    if (i >= 0 && i < valid) p[i] -= dloss;
  }
}

}  // namespace loom::kernels::cpu
