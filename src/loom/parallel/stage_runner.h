// How a rank runs a step's microbatches through the part of the model it holds, the same
// call for every layout: the whole model (no pipeline: the accumulation micro-steps one
// after the other, data parallelism reducing after the last) or a pipeline stage (the
// schedule's actions, data parallelism driven through PipelineHooks).
#pragma once

#include <memory>

#include "loom/parallel/data_parallel.h"
#include "loom/parallel/pipeline.h"

namespace loom::parallel {

class StageRunner {
 public:
  virtual ~StageRunner() = default;
  // One step: microbatch m's tokens and targets are tokens[m*B*T ...] (M of them); the
  // gradients accumulate scaled by `scale` per microbatch. Returns the sum of the
  // microbatches' losses where the loss is computed (the last stage), 0 elsewhere.
  virtual double train_step(const int* tokens, const int* targets, int B, int T, int M,
                            float scale) = 0;
  // One micro-batch forward (evaluation): its mean loss where the loss is computed, 0
  // elsewhere; there, if `losses` is given, the per-position losses (B x T).
  virtual double forward_only(const int* tokens, const int* targets, int B, int T,
                              float* losses) = 0;
  // Whether this rank computes the loss (the last pipeline stage; every rank without one).
  virtual bool computes_loss() const = 0;
};

// `dp` drives the model in both; `stage` is the rank's pipeline stage (null: no pipeline).
// The runner keeps references: both must outlive it.
std::unique_ptr<StageRunner> make_stage_runner(model::Gpt& model, DataParallel& dp,
                                               PipelineStage* stage);

}  // namespace loom::parallel
