#include "loom/parallel/sharding.h"

#include <string>

#include "loom/core/error.h"

namespace loom::parallel {
namespace {

class Replicated final : public ShardingPolicy {
 public:
  int stage() const override { return 0; }
  ParamHome params() const override { return ParamHome::kReplicated; }
  GradHome grads() const override { return GradHome::kAllReduced; }
  OptimizerRange optimizer() const override { return OptimizerRange::kWholeUnit; }
};

class ShardedOptimizer final : public ShardingPolicy {  // ZeRO-1
 public:
  int stage() const override { return 1; }
  ParamHome params() const override { return ParamHome::kReplicated; }
  GradHome grads() const override { return GradHome::kReduceScatteredInPlace; }
  OptimizerRange optimizer() const override { return OptimizerRange::kOwnShard; }
};

class ShardedGradients final : public ShardingPolicy {  // ZeRO-2
 public:
  int stage() const override { return 2; }
  ParamHome params() const override { return ParamHome::kReplicated; }
  GradHome grads() const override { return GradHome::kReduceScatteredIntoShard; }
  OptimizerRange optimizer() const override { return OptimizerRange::kOwnShard; }
};

class FullySharded final : public ShardingPolicy {  // ZeRO-3, FSDP's FULL_SHARD
 public:
  int stage() const override { return 3; }
  ParamHome params() const override { return ParamHome::kGatheredOnUse; }
  GradHome grads() const override { return GradHome::kReduceScatteredIntoShard; }
  OptimizerRange optimizer() const override { return OptimizerRange::kOwnShard; }
};

}  // namespace

std::unique_ptr<const ShardingPolicy> make_sharding_policy(int stage, bool nothing_to_shard) {
  if (nothing_to_shard && stage > 1) stage = 1;
  switch (stage) {
    case 0:
      return std::make_unique<Replicated>();
    case 1:
      return std::make_unique<ShardedOptimizer>();
    case 2:
      return std::make_unique<ShardedGradients>();
    case 3:
      return std::make_unique<FullySharded>();
    default:
      throw UserError("train.zero = " + std::to_string(stage) + " is not a ZeRO stage",
                      "use 0 (data parallel), 1, 2 or 3");
  }
}

}  // namespace loom::parallel
