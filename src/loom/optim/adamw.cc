#include "loom/optim/adamw.h"

#include <algorithm>

#include "loom/kernels/cpu/kernels.h"

namespace loom::optim {

AdamW::AdamW(const std::vector<DecaySpan>& spans, size_t begin, size_t end)
    : begin_(begin), end_(end), m_(end - begin, 0.0f), v_(end - begin, 0.0f) {
  for (const auto& s : spans) {
    const size_t lo = std::max(begin, s.begin), hi = std::min(end, s.end);
    if (lo < hi) spans_.push_back({lo - begin, hi - begin, s.decay});
  }
}

void AdamW::step(float* params, const float* grads, float grad_scale, double lr,
                 const AdamWParams& p, int64_t t) {
  for (const DecaySpan& s : spans_)
    kernels::cpu::adamw_update(params + s.begin, grads + s.begin, m_.data() + s.begin,
                               v_.data() + s.begin, s.end - s.begin, static_cast<float>(lr),
                               p.beta1, p.beta2, p.eps, s.decay ? p.weight_decay : 0.0f,
                               static_cast<int>(t), grad_scale);
}

}  // namespace loom::optim
