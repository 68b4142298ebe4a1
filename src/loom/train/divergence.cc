#include "loom/train/divergence.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "loom/core/error.h"

namespace loom::train {

OnNonFinite parse_on_nonfinite(const std::string& s) {
  if (s == "stop") return OnNonFinite::kStop;
  if (s == "skip") return OnNonFinite::kSkip;
  if (s == "rewind") return OnNonFinite::kRewind;
  throw UserError("train.on_nonfinite = '" + s + "' is not a policy", "stop, skip or rewind");
}

std::string StepHealth::what(double loss, double factor) const {
  if (spike) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "the loss %.4g spiked above %g x the median of the last steps' losses (%.4g)",
                  loss, factor, median);
    return buf;
  }
  if (!loss_finite && !grads_finite) return "the loss and the gradients went non-finite";
  return !loss_finite ? "the loss went non-finite" : "the gradients went non-finite";
}

DivergenceGuard::DivergenceGuard(OnNonFinite policy, int64_t max_skips, int64_t max_rewinds,
                                 double spike_factor)
    : policy_(policy), max_skips_(max_skips), max_rewinds_(max_rewinds), factor_(spike_factor) {}

StepHealth DivergenceGuard::judge(double loss, bool any_grads_nonfinite) const {
  StepHealth h;
  h.loss_finite = std::isfinite(loss);
  h.grads_finite = !any_grads_nonfinite;
  if (factor_ > 0 && h.loss_finite && window_.size() >= kMinWindow) {
    std::vector<double> w(window_.begin(), window_.end());
    std::nth_element(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(w.size() / 2), w.end());
    h.median = w[w.size() / 2];
    h.spike = loss > factor_ * h.median;
  }
  return h;
}

DivergenceGuard::Action DivergenceGuard::decide(const StepHealth& h, double loss) {
  if (!h.bad()) {
    window_.push_back(loss);
    if (window_.size() > kWindow) window_.pop_front();
    in_a_row_ = 0;
    return Action::kUpdate;
  }
  switch (policy_) {
    case OnNonFinite::kStop:
      why_stop_ = "train.on_nonfinite = stop";
      return Action::kStop;
    case OnNonFinite::kSkip:
      if (in_a_row_ >= max_skips_) {
        why_stop_ = std::to_string(in_a_row_ + 1) +
                    " bad steps in a row (train.max_skips = " + std::to_string(max_skips_) + ")";
        return Action::kStop;
      }
      ++in_a_row_, ++skipped_;
      return Action::kSkip;
    case OnNonFinite::kRewind:
      if (rewinds_ >= max_rewinds_) {
        why_stop_ = "rewound " + std::to_string(rewinds_) +
                    " times already (train.max_rewinds = " + std::to_string(max_rewinds_) + ")";
        return Action::kStop;
      }
      ++rewinds_;
      return Action::kRewind;
  }
  return Action::kStop;
}

DivergenceGuard::Action DivergenceGuard::no_checkpoint() {
  --rewinds_;
  why_stop_ =
      "train.on_nonfinite = rewind, but no finite checkpoint was saved yet (set ckpt.every)";
  return Action::kStop;
}

}  // namespace loom::train
