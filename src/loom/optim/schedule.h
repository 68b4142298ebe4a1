// The learning-rate schedule: linear warmup from peak/warmup to peak over warmup_steps,
// then a half cosine from peak down to peak x min_lr_ratio at total_steps.
#pragma once

#include <cstdint>

namespace loom::optim {

struct LrSchedule {
  double peak = 6e-4;
  int64_t warmup_steps = 10;
  int64_t total_steps = 100;
  double min_lr_ratio = 0.1;
  // The learning rate of optimizer step `step` (counting from 0).
  double at(int64_t step) const;
};

}  // namespace loom::optim
