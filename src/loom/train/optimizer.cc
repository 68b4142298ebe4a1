#include "loom/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "loom/kernels/cpu/kernels.h"

namespace loom::train {

double learning_rate(const TrainConfig& c, double peak_lr, int64_t step) {
  if (step < c.warmup_steps) return peak_lr * static_cast<double>(step + 1) / c.warmup_steps;
  const double min_lr = peak_lr * c.min_lr_ratio;
  const int64_t decay_steps = std::max<int64_t>(1, c.steps - c.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - c.warmup_steps) / decay_steps);
  return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

// Fixed blocks summed in parallel, then added in block order: the same bits on any thread
// count (an OpenMP reduction combines in arrival order, which would break bit-exact resume).
double sum_of_squares(const float* x, size_t n) {
  constexpr size_t kBlock = 1 << 16;
  const size_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks, 0.0);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < blocks; ++b) {
    double s = 0;
    for (size_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i)
      s += static_cast<double>(x[i]) * x[i];
    partial[b] = s;
  }
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

AdamW::AdamW(const std::vector<model::Tensor>& tensors, size_t begin, size_t end)
    : begin_(begin), end_(end), m_(end - begin, 0.0f), v_(end - begin, 0.0f) {
  for (const auto& t : tensors) {
    const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.size);
    if (lo < hi) spans_.push_back({lo - begin, hi - begin, t.decay});
  }
}

void AdamW::step(float* params, const float* grads, float grad_scale, double lr,
                 const TrainConfig& c, int64_t t) {
  for (const Span& s : spans_)
    kernels::cpu::adamw_update(
        params + s.begin, grads + s.begin, m_.data() + s.begin, v_.data() + s.begin,
        s.end - s.begin, static_cast<float>(lr), static_cast<float>(c.beta1),
        static_cast<float>(c.beta2), static_cast<float>(c.eps),
        s.decay ? static_cast<float>(c.weight_decay) : 0.0f, static_cast<int>(t), grad_scale);
}

}  // namespace loom::train
