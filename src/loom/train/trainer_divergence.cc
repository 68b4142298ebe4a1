// The trainer's numerics policy in action (train.on_nonfinite, train/divergence.h): the
// test switch that poisons a gradient, finding the first non-finite tensor, the rewind and
// the stop. The decision itself is DivergenceGuard's; the check rides train_step's
// allreduce (trainer.cc).
#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "loom/ckpt/checkpoint.h"
#include "loom/core/error.h"
#include "loom/core/tunable.h"
#include "loom/train/trainer.h"

namespace loom::train {
namespace {

const StringTunable kPoisonGrad(
    "LOOM_TEST_POISON_GRAD", "",
    "STEP:RANK (tests only): the first time step STEP (1-based) runs, once its gradients are "
    "final, rank RANK sets the first element of its first non-empty unit's gradient to NaN");

}  // namespace

// LOOM_TEST_POISON_GRAD=STEP:RANK: a NaN in one gradient element of one rank, once the
// gradients are final (the non-finite tests; docs/errors.md).
void Trainer::poison_for_test(int64_t step) {
  static const std::string spec = kPoisonGrad.get();
  if (spec.empty()) return;
  long long at = 0;
  int rank = 0;
  if (std::sscanf(spec.c_str(), "%lld:%d", &at, &rank) != 2)
    throw UserError("LOOM_TEST_POISON_GRAD=" + spec + " is not STEP:RANK", "e.g. 3:1, or unset it");
  static bool fired = false;  // once: a rewound run passes the step again, clean
  if (at != step + 1 || rank != rank_ || fired) return;
  fired = true;
  for (int u = 0; u < model_->num_units(); ++u)
    if (dp_->unit_grad_size(u) > 0) {
      dp_->unit_grad(u)[0] = std::numeric_limits<float>::quiet_NaN();
      return;
    }
}

// After a step with non-finite gradients, on every rank: where the NaN or infinity is —
// the first unit (then tensor) over all ranks that hold one, and which rank saw it.
std::string Trainer::locate_nonfinite() {
  const auto mine = dp_->first_nonfinite_grad();
  const std::vector<model::Tensor>& ts = model_->tensors();
  double key = 1e18;  // unit-major, then tensor: the smallest is the first in the model
  if (mine) {
    const auto it = std::find_if(ts.begin(), ts.end(),
                                 [&](const model::Tensor& t) { return t.name == mine->second; });
    key = static_cast<double>(mine->first) * 1e6 + static_cast<double>(it - ts.begin());
  }
  const std::vector<double> all = world_gather({key});
  const auto first = std::min_element(all.begin(), all.end());
  if (*first >= 1e18) return "";  // the norm overflowed, no element did
  const auto unit = static_cast<int64_t>(*first / 1e6);
  const auto tensor = static_cast<size_t>(*first - static_cast<double>(unit) * 1e6);
  const int L = model_cfg_.n_layer;
  const std::string what = unit == 0       ? "the embeddings"
                           : unit == L + 1 ? "the final LayerNorm"
                                           : "block " + std::to_string(unit - 1);
  return "first in " + what + ", tensor " + ts[tensor].name + ", on rank " +
         std::to_string(first - all.begin());
}

// train.on_nonfinite = rewind: back to the newest finite checkpoint, the data moved past
// the window that diverged. Returns the step to continue from, or -1 when there is no
// checkpoint to go back to.
int64_t Trainer::rewind(int64_t step, const std::string& what) {
  const std::string dir = ckpt::latest_finite(cfg_.run_dir + "/ckpt");
  if (dir.empty()) return -1;
  const ckpt::Reader r(dir);
  dp_->load(r);
  step_->check_replicas("the weights rewound to", true);
  // The data from the checkpoint on moves past the window read since it (through the failed
  // step) and one global batch more, or train.rewind_skip_samples. The window is in the
  // stream the run followed since the checkpoint: the current offset's (an earlier rewind
  // to the same checkpoint moved it already; a later checkpoint recorded it).
  const int64_t back = r.meta()["next_step"];
  const uint64_t skip = cfg_.rewind_skip_samples > 0
                            ? static_cast<uint64_t>(cfg_.rewind_skip_samples)
                            : static_cast<uint64_t>(step + 2 - back) * cfg_.global_batch;
  loader_->set_sample_offset(loader_->sample_offset() + skip);
  if (chatty())
    std::printf(
        "loom: %s; rewound to %s (step %lld), the data moved on by %llu samples (rewind %lld "
        "of %lld, train.on_nonfinite = rewind)\n",
        what.c_str(), dir.c_str(), static_cast<long long>(back),
        static_cast<unsigned long long>(skip), static_cast<long long>(guard_->rewinds()),
        static_cast<long long>(cfg_.max_rewinds));
  return back;
}

// A bad step that the policy does not survive: every rank prints the one line (and the
// hint) and exits kExitDiverged, writing no checkpoint.
int Trainer::stop_diverged(const std::string& what) {
  if (tb_) tb_->flush();
  write_trace();
  const std::string last = ckpt::latest_finite(cfg_.run_dir + "/ckpt");
  std::fprintf(stderr,
               "loom: error: training diverged at %s; stopped without saving (%s); the last "
               "good checkpoint is %s\nhint: resume from it with --resume after lowering "
               "optim.lr or raising optim.warmup_steps, or set train.on_nonfinite = skip or "
               "rewind (docs/errors.md)\n",
               what.c_str(), guard_->why_stop().c_str(),
               last.empty() ? "none (none was saved yet)" : last.c_str());
  return kExitDiverged;
}

}  // namespace loom::train
