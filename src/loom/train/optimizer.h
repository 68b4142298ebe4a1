// The learning-rate schedule and AdamW over a contiguous range of the flat parameter
// layout (the whole model on one rank; a rank's shard under ZeRO).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/state_memory.h"
#include "loom/model/gpt.h"
#include "loom/train/config.h"

namespace loom::train {

// Linear warmup from lr/warmup to lr over optim.warmup_steps, then a half cosine from lr
// down to lr x optim.min_lr_ratio at train.steps. `step` counts from 0.
double learning_rate(const TrainConfig& c, double peak_lr, int64_t step);

// Sum of squares in double precision (gradient norms: partial sums add across ranks).
double sum_of_squares(const float* x, size_t n);

class AdamW {
 public:
  // Moments for elements [begin, end) of the flat layout; weight decay per the tensors'
  // decay flags.
  AdamW(const std::vector<model::Tensor>& tensors, size_t begin, size_t end);
  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  // params and grads point at element `begin` of the layout; grads are multiplied by
  // grad_scale (clipping) on the fly; t counts optimizer steps from 1.
  void step(float* params, const float* grads, float grad_scale, double lr, const TrainConfig& c,
            int64_t t);
  StateVector& m() { return m_; }
  StateVector& v() { return v_; }

 private:
  struct Span {
    size_t begin, end;  // relative to begin_
    bool decay;
  };
  size_t begin_, end_;
  std::vector<Span> spans_;
  StateVector m_, v_;
};

}  // namespace loom::train
