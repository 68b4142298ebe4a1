// The pipeline executor: runs one stage's actions of a schedule (parallel/pipeline_schedule.h)
// for one optimizer step, moving activations and their gradients between neighbouring
// stages.
//
// Transfers. Every directed link between two stages and each kind of message (activations
// forward, gradients backward) is its own two-rank communicator, split from the pipeline
// group: on a link one rank only sends and the other only receives, in the order the
// validated schedule guarantees to be the same on both ends. Sends are asynchronous (the
// link's worker thread moves the data while this rank computes) from buffers that live
// until the step ends; receives block when the action needs their data. Operations of one
// communicator run in call order, so with one communicator per pipeline group a rank's
// receive could wait behind its own large send, which waits for a neighbour stuck the same
// way; per-link communicators cannot, whatever the message size against the shared-memory
// ring (and with P = 2 the two directions and two kinds between the same pair of ranks stay
// apart — Megatron's issue 750).
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/model/gpt.h"
#include "loom/parallel/activation_offload.h"
#include "loom/parallel/pipeline_schedule.h"
#include "loom/parallel/pipeline_stages.h"

namespace loom::parallel {

// Told around each step and each action (data parallelism reduces a unit's gradients once
// per step, after the microbatch that finishes them; ZeRO-3 gathers parameters around their
// use, and prefetches them in the order a step of the same kind used them before).
class PipelineHooks {
 public:
  virtual ~PipelineHooks() = default;
  // A train_step (training) or a forward_only begins / has ended.
  virtual void step_begins(bool training) = 0;
  virtual void step_ends() = 0;
  virtual void before_forward() = 0;
  virtual void before_backward(bool last_microbatch) = 0;
  virtual void after_action() = 0;
};

// The head split (pp.head_split): stage 0 runs the head over the first `rows` rows of each
// microbatch (H passes, placed with these costs: add_head_passes); rows = 0: no split.
struct HeadSplit {
  int rows = 0;
  std::vector<double> forward_cost;  // per virtual stage
  HeadSplitCost cost;
};

class PipelineStage {
 public:
  // `pp` is the pipeline group (at least two stages); `pieces` the units of each of the
  // P*V virtual stages (chunk c of stage s is piece c*P + s). Collective over `pp`.
  PipelineStage(model::Gpt& model, std::shared_ptr<comm::Communicator> pp,
                std::vector<UnitRange> pieces, ScheduleKind kind, int microbatches,
                int active_microbatches = 0, HeadSplit head = {});

  // Activation offload: a microbatch's activations go to `offload`'s spill file after its
  // forward when it waits for its backward, and are read back `horizon` actions ahead.
  void set_offload(std::unique_ptr<ActivationOffload> offload, int horizon) {
    offload_ = std::move(offload), horizon_ = horizon;
  }
  const ActivationOffload* offload() const { return offload_.get(); }

  int stage() const { return stage_; }
  int stages() const { return P_; }
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == P_ - 1; }
  int microbatches() const { return M_; }
  const std::vector<StageActions>& schedule() const { return schedule_; }
  // Every unit this rank's chunks run, ascending (with unit 0 on the last stage: the tied
  // head's copy of the embedding).
  std::vector<int> units() const;

  // One step: microbatch m's tokens and targets are tokens[m*B*T ...]; gradients accumulate
  // scaled by `scale` per microbatch (1/M averages them). Returns the sum of the
  // microbatches' losses on the last stage, 0 elsewhere — with the head split, stage 0's rows'
  // share on stage 0 and the rest on the last stage (their sum over the group is the loss).
  double train_step(const int* tokens, const int* targets, int B, int T, float scale,
                    PipelineHooks* hooks);
  // Forward only (evaluation): microbatches one after the other through every chunk. On the
  // last stage `losses` (if given) receives the per-position losses (microbatches x B x T).
  double forward_only(const int* tokens, const int* targets, int B, int T, int microbatches,
                      PipelineHooks* hooks, float* losses = nullptr);

  // Since the last reset: seconds this rank waited for a neighbour (receives, and the
  // step's last sends), and the most bytes of activations held at once (a microbatch's
  // chunk is held from its F to its last backward part; buffers are recycled).
  double wait_s() const { return wait_s_; }
  // Collective over the pipeline group: the schedule run with the last train_step's passes
  // as every stage measured them (each action's time less its waits for a neighbour;
  // simulate_schedule) — the idle the schedule itself makes of those passes, transfers free.
  ScheduleTiming last_step_schedule();
  size_t peak_activation_bytes() const { return peak_bytes_; }
  size_t peak_block_activation_bytes() const { return peak_block_bytes_; }
  void reset_counters() {
    wait_s_ = 0, peak_bytes_ = peak_block_bytes_ = 0;
    if (offload_) offload_->reset_counters();
  }

 private:
  struct Link {  // a two-rank communicator: rank 0 sends, rank 1 receives
    std::shared_ptr<comm::Communicator> comm;
    std::vector<float> staging;  // the receiver's buffer
  };
  // The head split's two channels: the final norm's rows (last stage -> 0), their gradient back.
  enum Kind { kActivation, kGradient, kHeadInput, kHeadGrad, kKinds };
  Link* link(Kind kind, int from, int to);
  double forward_action(int m, int chunk, const int* tokens, const int* targets, int B, int T,
                        PipelineHooks* hooks, bool training = false);
  double head_action(int m, const int* targets, int B, int T, float scale, PipelineHooks* hooks);
  // The HeadShare of an F or B/BW on the last virtual stage over `a` (null: no split).
  const model::HeadShare* head_share(const model::Activations& a);
  model::Activations& hold(int m, int chunk);  // from the pool, for F
  // Back to the chunk's pool, after the last backward; next_forward_chunk: the chunk of the
  // forward that runs next (-1: a backward does).
  void release(int m, int chunk, int next_forward_chunk);
  void sweep_retiring();  // frees retiring activations no send reads
  void note_peak();       // the peak of activation bytes in memory
  const float* receive(Kind kind, int from, size_t n);
  // An async send from a buffer of `owner`, which is not reused before the send is done
  // (null: a buffer that lives until the step ends).
  void send(Kind kind, int to, const float* data, size_t n, const model::Activations* owner);
  void wait_sends();

  model::Gpt& model_;
  std::shared_ptr<comm::Communicator> pp_;
  std::vector<UnitRange> pieces_;
  int P_ = 1, V_ = 1, M_ = 1, stage_ = 0;
  std::vector<StageActions> schedule_;
  std::vector<Link> links_;       // [kind][from][to], flattened; null comm where no link
  std::vector<double> action_s_;  // the last train_step's actions: seconds less waits
  int head_rows_ = 0;             // the head split's rows per microbatch on stage 0 (0: none)
  model::HeadShare share_;        // the last stage's, for the action running
  std::vector<std::vector<float>> head_grads_;  // stage 0: per microbatch, H's input gradient
  // [microbatch][chunk]: held activations; the pools keep released ones for reuse, so a
  // step allocates only as many as the schedule holds at once. One pool per chunk: chunks
  // differ in blocks, and a buffer set sized for another chunk's blocks is resized (freed
  // and faulted in again) by the forward that takes it — interleaved's chunks did that on
  // most forwards.
  std::vector<std::vector<std::unique_ptr<model::Activations>>> acts_;
  std::vector<std::vector<std::unique_ptr<model::Activations>>> pool_;  // [chunk]
  // With offload: finished microbatches' activations, freed once their sends are done.
  std::vector<std::unique_ptr<model::Activations>> retiring_;
  std::vector<comm::WorkPtr> sends_;
  std::map<const model::Activations*, std::vector<comm::WorkPtr>> sending_from_;
  std::unique_ptr<ActivationOffload> offload_;
  int horizon_ = 4;
  double wait_s_ = 0;
  size_t peak_bytes_ = 0, peak_block_bytes_ = 0;
};

}  // namespace loom::parallel
