// Sharded data parallelism as a policy (ZeRO 0-3, FSDP's sharding strategies): for each
// model unit, three orthogonal decisions that DataParallel acts on.
//
//   stage   parameters between uses    gradients land                  optimizer steps
//   0       replicated                 all-reduced, whole              the whole unit
//   1       replicated                 reduce-scattered in place       its own shard
//   2       replicated                 reduce-scattered into a shard   its own shard
//   3       sharded, gathered per use  reduce-scattered into a shard   its own shard
//
// Where the optimizer steps a shard of replicated parameters (1, 2), the step ends with an
// allgather of the updated shards. A new strategy (e.g. hybrid sharding with parameters
// gathered within a machine only) is a new implementation of the interface and a name in
// make_sharding_policy; nothing else compares stage numbers.
#pragma once

#include <memory>

namespace loom::parallel {

enum class ParamHome {
  kReplicated,     // every rank of the shard group holds the whole unit
  kGatheredOnUse,  // each rank holds its shard; the unit is gathered before each use
};
enum class GradHome {
  kAllReduced,                // the whole gradient, averaged over the group
  kReduceScatteredInPlace,    // a whole-unit buffer per step, of which this rank's slice
                              // holds the average
  kReduceScatteredIntoShard,  // a whole-unit buffer per use, reduce-scattered and added
                              // into a persistent shard, then freed
};
enum class OptimizerRange { kWholeUnit, kOwnShard };

class ShardingPolicy {
 public:
  virtual ~ShardingPolicy() = default;
  virtual int stage() const = 0;  // the ZeRO stage it implements (checkpoints, messages)
  virtual ParamHome params() const = 0;
  virtual GradHome grads() const = 0;
  virtual OptimizerRange optimizer() const = 0;

  // Questions derived from the three decisions.
  bool shards() const { return optimizer() == OptimizerRange::kOwnShard; }
  bool params_sharded() const { return params() == ParamHome::kGatheredOnUse; }
  // A whole-unit gradient buffer lives through the step (else one per use, from a pool).
  bool grads_whole_through_step() const { return grads() != GradHome::kReduceScatteredIntoShard; }
  // The updated shards are allgathered into the replicated parameters after the step.
  bool gathers_after_step() const { return shards() && !params_sharded(); }
};

// The one place a configuration's stage number becomes a policy (train.zero, 0-3). With
// `nothing_to_shard` (one rank in the shard group and no replica group) stages 2 and 3 hold
// what stage 1 holds, and are stage 1.
std::unique_ptr<const ShardingPolicy> make_sharding_policy(int stage,
                                                           bool nothing_to_shard = false);

}  // namespace loom::parallel
