// AdamW over a contiguous range of a flat parameter layout: the whole model on one rank, a
// rank's shard under ZeRO. The optimizer knows ranges and decay flags, not the model.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/state_memory.h"

namespace loom::optim {

struct AdamWParams {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to spans marked decay only
};

// A span of the flat layout [begin, end) and whether weight decay applies to it (matrices
// and embeddings yes, biases and norms no).
struct DecaySpan {
  size_t begin, end;
  bool decay;
};

class AdamW {
 public:
  // Moments for elements [begin, end) of the layout; `spans` (in layout coordinates, in any
  // number) say where weight decay applies and are clipped to the range.
  AdamW(const std::vector<DecaySpan>& spans, size_t begin, size_t end);
  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  // params and grads point at element `begin` of the layout; grads are multiplied by
  // grad_scale (clipping) on the fly; t counts optimizer steps from 1.
  void step(float* params, const float* grads, float grad_scale, double lr, const AdamWParams& p,
            int64_t t);
  StateVector& m() { return m_; }
  StateVector& v() { return v_; }

 private:
  size_t begin_, end_;
  std::vector<DecaySpan> spans_;  // relative to begin_
  StateVector m_, v_;
};

}  // namespace loom::optim
