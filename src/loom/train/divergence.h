// What training does when its numbers go bad (train.on_nonfinite, docs/algorithms.md
// "Numerics"): every step the loss (summed over the replicas) and the global gradient norm
// are checked on every rank before the optimizer step, and all ranks agree on the verdict
// through one allreduce that the step already made (the loss's). A bad step is one whose
// loss or gradient norm is NaN or infinite, or, with train.spike_factor = f > 0, whose loss
// is above f x the median of the last 100 good steps' losses (once 10 are in). The policy:
//   stop    no update, no checkpoint after it; every rank exits 4 with one line naming it
//   skip    no update (weights and Adam's moments untouched; the step number, the learning
//           rate schedule and the data advance); max_skips in a row turn into stop
//   rewind  reload the newest finite checkpoint, move the data past the window that
//           diverged; at most max_rewinds times, then stop
// This class holds the decision and its counters; the trainer acts on it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "loom/core/error.h"

namespace loom::train {

enum class OnNonFinite { kStop, kSkip, kRewind };
OnNonFinite parse_on_nonfinite(const std::string& s);  // "stop" | "skip" | "rewind"

// A step's numbers as every rank agreed on them.
struct StepHealth {
  bool loss_finite = true, grads_finite = true;
  bool spike = false;  // finite, but above spike_factor x the running median
  double median = 0;   // that median, when spike
  bool bad() const { return !loss_finite || !grads_finite || spike; }
  // "the loss and the gradients went non-finite (NaN or infinity)", "the loss 9.1 spiked
  // above 4 x the median of the last 100 steps (2.05)", ...
  std::string what(double loss, double factor) const;
};

class DivergenceGuard {
 public:
  DivergenceGuard(OnNonFinite policy, int64_t max_skips, int64_t max_rewinds, double spike_factor);
  OnNonFinite policy() const { return policy_; }
  double spike_factor() const { return factor_; }

  // The verdict on a step from its agreed loss and whether any rank saw a non-finite
  // gradient norm.
  StepHealth judge(double loss, bool any_grads_nonfinite) const;

  enum class Action { kUpdate, kSkip, kRewind, kStop };
  // What to do about the judged step, counted: a good step's loss joins the window and ends
  // a run of skips; a bad one is skipped, rewound or stops as the policy and the limits say
  // (why_stop() then says which limit).
  Action decide(const StepHealth& h, double loss);
  const std::string& why_stop() const { return why_stop_; }
  int64_t skipped() const { return skipped_; }  // steps skipped so far
  int64_t rewinds() const { return rewinds_; }  // rewinds so far
  // After a rewind found no finite checkpoint to go back to.
  Action no_checkpoint();

  static constexpr size_t kWindow = 100, kMinWindow = 10;

 private:
  OnNonFinite policy_;
  int64_t max_skips_, max_rewinds_;
  double factor_;
  std::deque<double> window_;  // the last kWindow good steps' losses
  int64_t skipped_ = 0, in_a_row_ = 0, rewinds_ = 0;
  std::string why_stop_;
};

}  // namespace loom::train
