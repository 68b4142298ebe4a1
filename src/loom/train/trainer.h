// `loom train` on one rank: the loop of DESIGN's "one training step", the LR schedule,
// clipping, evaluation, checkpoints and metrics (console, metrics.jsonl, TensorBoard).
//
// Run directory (run.dir): config.toml (the resolved configuration), metrics.jsonl (one
// object per step and per evaluation), events.out.tfevents.* (TensorBoard) and ckpt/step_*
// (checkpoints, the newest ckpt.keep kept). --resume continues from the newest checkpoint
// with the losses an uninterrupted run would have had, bit for bit: the data order, the
// schedule and every kernel are deterministic for a fixed configuration and thread count.
#pragma once

#include <string>

#include "loom/train/config.h"

namespace loom::train {

struct TrainOptions {
  bool resume = false;  // continue from run.dir/ckpt's newest checkpoint (if any)
  bool quiet = false;   // no console progress lines
  bool plan = false;    // at the end, the planner's prediction for this layout next to the
                        // measurement (printed, and run.dir/plan.json)
};

// Returns the process exit code: 0 when train.steps are done, 130 when interrupted by
// SIGINT/SIGTERM (after saving a checkpoint at the step boundary).
int train(TrainConfig cfg, const TrainOptions& opt);

}  // namespace loom::train
