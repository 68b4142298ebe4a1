// The CPU's costs for the planner, measured: loom's own model at the layout's shape (one
// microbatch's forward + backward of a 1-block and a 3-block model: the difference over 2 is
// a block, the rest the embedding and head), AdamW's update rate over 4M parameters with
// every rank of the machine stepping at once, and
// the tuning table's shared-memory cost model (comm/tuning.h). Runs on the calling thread
// team (set it to the ranks' threads first). Tensor-parallel shapes run against a
// communication stub that moves nothing: the collectives are priced separately. Its models'
// and optimizers' memory counts in an account of its own, not the caller's StateMemory.
#pragma once

#include <string>

#include "loom/model/gpt.h"
#include "loom/plan/planner.h"

namespace loom::plan {

struct CpuShape {
  model::GptConfig model;
  int micro_batch = 1, seq = 64, tp = 1;
  bool recompute = false, sequence_parallel = false, bf16 = false;
  int threads = 1;  // per rank
};

// `ranks` = the ranks that share the machine: the busy costs and AdamW's rate run that many
// copies at once (threads, each with `threads` OpenMP threads), the plain ones one copy
// alone. `copy_cpus[i]`, where given, are the CPUs copy i runs on (the machine's ranks'
// affinity masks, from the communicator's topology: with each rank bound to its own cores,
// copies left on the caller's would share them); copy 0 runs on the calling thread as it is.
CpuCosts measure_cpu(const CpuShape& shape, int ranks, int repeats = 3,
                     const std::vector<std::vector<int>>& copy_cpus = {});

// The CPU as a device: the machine's memory shared by `ranks_per_node` (its times come from
// measure_cpu, so no peak is measured).
Device cpu_device(int ranks_per_node);

// A model's shape for the planner at sequence length seq.
ModelShape model_shape(const model::GptConfig& g, int seq);

}  // namespace loom::plan
