// Softmax over the real vocabulary (padded logits excluded) and cross-entropy, fused: the
// forward reads the logits (keeping each row's max and sum of exponentials), the backward
// turns them into dlogits = (softmax - onehot(target)) * dloss in place in one pass, with
// the bf16 copy the head's bf16 products read written in the same pass.
#include <cmath>

#include "loom/kernels/cpu/kernels.h"
#include "loom/kernels/cpu/vecmath.h"

namespace loom::kernels::cpu {

namespace {
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

// The sum of e^(l[i] - m), nothing written.
LOOM_VECTOR_CLONES float sum_exp_row(const float* l, float m, int n) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < n; ++i) sum += exp_approx(l[i] - m);
  return sum;
}

// d[i] = e^(d[i] - m) * c in place (d[i] holds a logit on entry).
LOOM_VECTOR_CLONES void softmax_grad_row(float* d, float m, float c, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) d[i] = exp_approx(d[i] - m) * c;
}
}  // namespace

void crossentropy_forward(float* losses, float* row_max, float* row_sum, const float* logits,
                          const int* targets, int N, int V, int Vp) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    // A row (~200 KB at GPT-2's vocabulary) is read from memory once: the second pass
    // finds it in this core's L2.
    const float* l = logits + static_cast<size_t>(n) * Vp;
    const float m = max_of_row(l, V), s = sum_exp_row(l, m, V);
    row_max[n] = m, row_sum[n] = s;
    losses[n] = std::log(s) + m - l[targets[n]];
  }
}

void crossentropy_backward_inplace(float* logits, uint16_t* dlogits16, const float* row_max,
                                   const float* row_sum, float dloss, const int* targets, int N,
                                   int V, int Vp) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const size_t at = static_cast<size_t>(n) * Vp;
    float* d = logits + at;
    const float c = dloss / row_sum[n];
    softmax_grad_row(d, row_max[n], c, V);
    d[targets[n]] -= dloss;
    for (int i = V; i < Vp; ++i) d[i] = 0;
    if (dlogits16) round_to_bf16_serial(dlogits16 + at, d, Vp);  // the row is still in L2
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
