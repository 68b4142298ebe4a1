#include "loom/parallel/step_composer.h"

#include <cmath>
#include <string>
#include <vector>

#include "loom/core/error.h"

namespace loom::parallel {
using comm::ReduceOp;

StepComposer::StepComposer(DataParallel& dp, const ProcessGroups& groups)
    : dp_(dp), dp_group_(groups.dp), tp_(groups.tp), pp_(groups.pp), embedding_(groups.embedding) {}

void StepComposer::check_replicas(const std::string& when, bool across_dp) {
  auto compare = [&](comm::Communicator& group, uint64_t mine, const std::string& what) {
    int64_t sum = static_cast<int64_t>(mine);
    std::vector<int64_t> all(group.size());
    dp_.timed([&] { group.allgather(&sum, all.data(), 1, DType::kI64); });
    for (int q = 0; q < group.size(); ++q)
      if (all[q] != all[0])
        throw Error(what + " of " + when + " differ between ranks 0 and " + std::to_string(q) +
                    " of the " + group.config().name + " group (checksum mismatch)");
  };
  // (Only where compared: with zero.offload_master the checksum reads the master from disk.)
  if (across_dp && dp_group_)
    if (const auto replica = dp_.replica_checksum())
      compare(*dp_group_, *replica, "the data-parallel replicas");
  if (tp_)
    compare(*tp_, dp_.held_checksum([](const model::Tensor& t) { return t.replicated; }),
            "replicated tensors (LayerNorms, wpe, row-parallel biases)");
  if (embedding_)
    compare(*embedding_, dp_.held_checksum([](const model::Tensor& t) { return t.name == "wte"; }),
            "the tied embedding's copies on the first and last pipeline stage");
}

void StepComposer::finish_reductions() {
  dp_.finish_reductions();
  // The tied embedding (unit 0): the first stage's gradient of wte and the last stage's
  // (its head copy) add up.
  if (embedding_) {
    float* g = dp_.unit_grad(0);
    const size_t n = dp_.unit_grad_size(0);
    dp_.timed([&] { embedding_->allreduce(g, g, n, DType::kF32, ReduceOp::kSum); });
  }
}

double StepComposer::grad_norm() {
  // This rank's share of the squared norm (summed over the shard group), then the other
  // tensor- and pipeline-parallel parts.
  double ss = dp_.grad_sum_of_squares();
  for (auto* group : {&tp_, &pp_})
    if (*group) dp_.timed([&] { (*group)->allreduce(&ss, &ss, 1, DType::kF64, ReduceOp::kSum); });
  return std::sqrt(ss);
}

}  // namespace loom::parallel
