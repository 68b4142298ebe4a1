#include "loom/parallel/step_composer.h"

#include <cmath>

namespace loom::parallel {
using comm::ReduceOp;

StepComposer::StepComposer(DataParallel& dp, const ProcessGroups& groups)
    : dp_(dp), tp_(groups.tp), pp_(groups.pp), embedding_(groups.embedding) {}

double StepComposer::finish_gradients() {
  dp_.finish_reductions();
  // The tied embedding (unit 0): the first stage's gradient of wte and the last stage's
  // (its head copy) add up.
  if (embedding_) {
    float* g = dp_.unit_grad(0);
    const size_t n = dp_.unit_grad_size(0);
    dp_.timed([&] { embedding_->allreduce(g, g, n, DType::kF32, ReduceOp::kSum); });
  }
  // This rank's share of the squared norm (summed over the shard group), then the other
  // tensor- and pipeline-parallel parts.
  double ss = dp_.grad_sum_of_squares();
  for (auto* group : {&tp_, &pp_})
    if (*group) dp_.timed([&] { (*group)->allreduce(&ss, &ss, 1, DType::kF64, ReduceOp::kSum); });
  return std::sqrt(ss);
}

}  // namespace loom::parallel
