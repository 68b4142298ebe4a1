// The fields of metrics.jsonl's step lines (docs/formats.md): written by the trainer
// (train/step_metrics.*), read by `loom report` (profile/report.cc) and its page. One list,
// so a field is named in one place.
#pragma once

#include <array>
#include <cstddef>

namespace loom::profile::metrics {

// Scalars of the whole job (one number per step line), with their TensorBoard tag.
struct ScalarField {
  const char* key;
  const char* tensorboard;
};
inline constexpr ScalarField kLoss{"loss", "train/loss"};
inline constexpr ScalarField kLr{"lr", "train/lr"};
inline constexpr ScalarField kGradNorm{"grad_norm", "train/grad_norm"};
inline constexpr ScalarField kStepMs{"step_ms", "perf/step_ms"};
inline constexpr ScalarField kCommWaitMs{"comm_wait_ms", "perf/comm_wait_ms"};
inline constexpr ScalarField kTokensPerS{"tokens_per_s", "perf/tokens_per_s"};
inline constexpr ScalarField kMfu{"mfu", "perf/mfu"};
// Counts so far of steps whose update was skipped and of rewinds (train.on_nonfinite).
inline constexpr ScalarField kSkippedSteps{"skipped_steps", "train/skipped_steps"};
inline constexpr ScalarField kRewinds{"rewinds", "train/rewinds"};
inline constexpr ScalarField kTpCommMs{"tp_comm_ms", "perf/tp_comm_ms"};  // under tp only
inline constexpr ScalarField kTpCommMb{"tp_comm_mb", nullptr};            // under tp only
inline constexpr const char* kStep = "step";
inline constexpr const char* kValLoss = "val_loss";

// Per-rank fields: an array with one value per rank, in rank order.
enum class PerRank : int {
  kStatePeakMb,        // model-state high-water mark (parameters, gradients, optimizer state)
  kRssPeakMb,          // the process's peak RSS
  kActivationMb,       // activation buffers (under a pipeline: the most held at once)
  kBlockActivationMb,  // of which the blocks'
  kPpWaitMs,           // pipeline receives waited for (pipelines only)
  kPpScheduleIdleMs,   // the idle the schedule makes of the step's measured passes (pipelines)
  kOffloadMb,          // activations spilled and loaded (train.offload_activations only)
  kZeroOffloadMb,      // optimizer state moved to and from its file (zero.offload = disk only)
  kOptimMs,            // the optimizer step, with ZeRO's gathers and any offload
  kOptimWaitMs,        // forward and backward waiting for the last step's overlapped update
  kDataMs,             // the data loader
  kComputeMs,          // forward and backward less the communication waited for inside
  kExposedCommMs,      // communication waited for outside the optimizer
  kCommInPlaceMb,      // bytes received by reading a sender's buffer in place
  kCount
};
inline constexpr size_t kPerRankCount = static_cast<size_t>(PerRank::kCount);

struct PerRankField {
  const char* key;
  const char* tensorboard;  // tag prefix, "/rankN" appended; nullptr: not in TensorBoard
};
inline constexpr std::array<PerRankField, kPerRankCount> kPerRankFields = {{
    {"state_peak_mb", "memory/state_peak_mb"},
    {"rss_peak_mb", "memory/rss_peak_mb"},
    {"activation_mb", nullptr},
    {"block_activation_mb", nullptr},
    {"pp_wait_ms", nullptr},
    {"pp_schedule_idle_ms", nullptr},
    {"offload_mb", nullptr},
    {"zero_offload_mb", nullptr},
    {"optim_ms", nullptr},
    {"optim_wait_ms", nullptr},
    {"data_ms", nullptr},
    {"compute_ms", nullptr},
    {"exposed_comm_ms", nullptr},
    {"comm_in_place_mb", nullptr},
}};

constexpr const char* key(PerRank f) {
  return kPerRankFields[static_cast<size_t>(f)].key;
}

}  // namespace loom::profile::metrics
