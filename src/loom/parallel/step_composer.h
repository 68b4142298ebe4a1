// The duties of a training step that span the mesh's dimensions, composed over the parts
// that each own one dimension: data parallelism has reduced every gradient over its own
// group (and the replicas across machines); the step composer then sums the tied
// embedding's two copies (first and last pipeline stage) and completes the global
// gradient norm over the tensor- and pipeline-parallel groups.
#pragma once

#include "loom/parallel/data_parallel.h"
#include "loom/parallel/process_groups.h"

namespace loom::parallel {

class StepComposer {
 public:
  // Of the groups it uses tp, pp and embedding (null where one would be this rank alone).
  StepComposer(DataParallel& dp, const ProcessGroups& groups);

  // After the last backward: waits for the data-parallel reductions, sums the tied
  // embedding's gradient copies (both take the sum, so the copies stay equal) and returns
  // the L2 norm of the whole model's averaged gradient. Communication waited for counts in
  // dp's comm_wait_s().
  double finish_gradients();

 private:
  DataParallel& dp_;
  std::shared_ptr<comm::Communicator> tp_, pp_, embedding_;
};

}  // namespace loom::parallel
