// The duties of a training step that span the mesh's dimensions, composed over the parts
// that each own one dimension: data parallelism has reduced every gradient over its own
// group (and the replicas across machines); the step composer then sums the tied
// embedding's two copies (first and last pipeline stage) and completes the global
// gradient norm over the tensor- and pipeline-parallel groups. It also checks that the
// copies the mesh keeps of one tensor (data-parallel replicas, tensor-parallel replicated
// tensors, the tied embedding on two stages) agree.
#pragma once

#include <string>

#include "loom/parallel/data_parallel.h"
#include "loom/parallel/process_groups.h"

namespace loom::parallel {

class StepComposer {
 public:
  // Of the groups it uses dp, tp, pp and embedding (null where one would be this rank
  // alone).
  StepComposer(DataParallel& dp, const ProcessGroups& groups);

  // After the last backward: waits for the data-parallel reductions, sums the tied
  // embedding's gradient copies (both take the sum, so the copies stay equal) and returns
  // the L2 norm of the whole model's averaged gradient. Communication waited for counts in
  // dp's comm_wait_s().
  double finish_gradients() {
    finish_reductions();
    return grad_norm();
  }
  // Its two halves: the gradients final (the reductions and the embedding's sum), then the
  // norm (between them the trainer's test switch may poison a gradient: docs/errors.md).
  void finish_reductions();
  double grad_norm();

  // Error naming the ranks when a replicated tensor differs across the tensor-parallel
  // group, or the tied embedding between the first and last pipeline stage, or (with
  // `across_dp`) the data-parallel replicas' parameters (ZeRO 0-2; checksums, one allgather
  // of 8 bytes per group). `when` names the moment in the message.
  void check_replicas(const std::string& when, bool across_dp);

 private:
  DataParallel& dp_;
  std::shared_ptr<comm::Communicator> dp_group_, tp_, pp_, embedding_;
};

}  // namespace loom::parallel
