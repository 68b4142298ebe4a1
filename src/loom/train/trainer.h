// `loom train` on one rank: the loop of DESIGN's "one training step", the LR schedule,
// clipping, evaluation, checkpoints and metrics (console, metrics.jsonl, TensorBoard).
//
// Run directory (run.dir): config.toml (the resolved configuration), metrics.jsonl (one
// object per step and per evaluation), events.out.tfevents.* (TensorBoard) and ckpt/step_*
// (checkpoints, the newest ckpt.keep kept). --resume continues from the newest checkpoint
// with the losses an uninterrupted run would have had, bit for bit: the data order, the
// schedule and every kernel are deterministic for a fixed configuration and thread count.
#pragma once

#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/ckpt/checkpoint.h"
#include "loom/comm/bootstrap.h"
#include "loom/data/loader.h"
#include "loom/interop/model_files.h"
#include "loom/model/gpt.h"
#include "loom/optim/moment_file.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/mesh.h"
#include "loom/parallel/pipeline.h"
#include "loom/parallel/process_groups.h"
#include "loom/parallel/stage_runner.h"
#include "loom/parallel/step_composer.h"
#include "loom/parallel/tensor_parallel.h"
#include "loom/plan/planner.h"
#include "loom/profile/system_sampler.h"
#include "loom/train/config.h"
#include "loom/train/divergence.h"
#include "loom/train/evaluate.h"
#include "loom/train/step_metrics.h"
#include "loom/train/tensorboard.h"

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

// One rank's training run, composed of its parts: the layout (mesh, process groups,
// pipeline cuts), the model, the parallel state that owns the model's memory (tensor
// parallelism, the pipeline stage, data parallelism / ZeRO), the data, and the outputs
// (metrics.jsonl, TensorBoard, checkpoints, the timeline). run() builds them in that order
// (every input checked on every rank before any rank connects or writes), then loops.
class Trainer {
 public:
  using Clock = std::chrono::steady_clock;
  Trainer(TrainConfig cfg, const TrainOptions& opt);
  int run();

 private:
  // run()'s steps, in order.
  void resolve_model();  // train.init_from: the model's shape comes from the file
  void plan_layout();    // the mesh and everything about the input it must divide
  void set_threads();
  void build_model();
  void open_data();
  void check_run_dir();
  void open_checkpoint();  // the newest checkpoint, checked against the config
  void open_offload();     // offload folders, writable before anyone connects
  void build_parallel_state();
  void open_outputs();  // config.toml, the restored step, metrics.jsonl, TensorBoard
  void resolve_precision();
  void print_banner() const;
  int loop();

  int64_t restore();  // returns the first step to run
  float train_step(int64_t step, double lr, double* grad_norm, bool* stop);
  double evaluate();
  train::ChoiceScores evaluate_task();  // eval.task
  void run_evaluations(int64_t step, bool val);
  void write_trace();
  void save(int64_t next_step);
  void log_step(int64_t step, float loss, double lr, double grad_norm, double step_s);
  // The non-finite / spike handling (train/divergence.h).
  void poison_for_test(int64_t step);
  std::string locate_nonfinite();
  int64_t rewind(int64_t step, const std::string& what);
  int stop_diverged(const std::string& what);
  RankMetrics rank_metrics(double comm_wait_ms, double tp_comm_ms);
  bool chatty() const { return !opt_.quiet && (rank_ == 0 || all_ranks_log_); }
  // Small collectives for the loop (timed as communication): a sum over every rank, a
  // rank-major allgather over every rank, a barrier.
  std::vector<double> world_sum(std::vector<double> v);
  std::vector<double> world_gather(const std::vector<double>& v);
  void barrier();
  void plan_sample();     // --plan: the CPU's costs and the link measured between two steps
  double measure_link();  // --plan: the shared-memory link's bus bandwidth now, GB/s
  bool plan_sample_due(int64_t step) const;
  void plan_check();
  std::pair<double, double> clock_offset_us();

  TrainConfig cfg_;
  TrainOptions opt_;

  // The layout.
  comm::LaunchInfo launch_;
  int rank_ = 0, world_ = 1;
  bool all_ranks_log_ = false;
  std::optional<parallel::Mesh> mesh_;
  parallel::MeshCoord coord_;
  parallel::ProcessGroups groups_;
  std::vector<parallel::UnitRange> pieces_;  // units of each virtual stage
  parallel::HeadSplit head_split_;           // pp.head_split's share and costs (rows 0: none)
  double head_split_gain_ = 1;               // the unsplit over the split simulated step
  parallel::ScheduleKind schedule_ = parallel::ScheduleKind::kOneFOneB;
  int threads_ = 1;
  std::string threads_why_;

  // The model.
  model::GptConfig model_cfg_;
  std::unique_ptr<model::Gpt> model_;
  std::optional<interop::ModelFile> init_;  // train.init_from's weights
  std::string requested_dtype_;
  double peaks_[2] = {0, 0};  // GEMM peaks, fp32 and bf16, summed over the ranks
  double peak_gflops_ = 0;    // the MFU peak, all ranks together
  double peak_lr_ = 0;

  // The parallel state.
  std::unique_ptr<parallel::TensorParallel> tp_;
  std::unique_ptr<parallel::PipelineStage> pipeline_;     // train.pp > 1
  std::unique_ptr<parallel::ActivationOffload> offload_;  // until the pipeline takes it
  std::shared_ptr<optim::MomentFile> moments_;            // zero.offload = disk
  std::unique_ptr<parallel::DataParallel> dp_;
  std::unique_ptr<parallel::StepComposer> step_;   // norm and tied embedding across tp/pp
  std::unique_ptr<parallel::StageRunner> runner_;  // the step through this rank's part

  // The data.
  std::optional<data::TokenDataset> train_data_, val_data_;
  std::optional<data::Loader> loader_, val_loader_;
  std::vector<int32_t> x_, y_;
  std::vector<train::ChoiceItem> task_;  // eval.task's items
  std::shared_ptr<const data::Gpt2Tokenizer> tokenizer_;
  std::optional<ckpt::Reader> checkpoint_;  // the one to resume from, if any

  // The numerics policy and the last step's verdict.
  std::optional<DivergenceGuard> guard_;
  StepHealth health_;

  // The outputs.
  std::unique_ptr<TensorBoardWriter> tb_;
  std::ofstream metrics_;
  std::unique_ptr<profile::SystemSampler> sampler_;  // rank 0: system.jsonl
  Clock::time_point started_;
  int64_t first_step_ = 0;
  // The last step's time by kind (log_step's breakdown): the data loader, the forward,
  // backward and gradient reductions, the optimizer (with ZeRO's gathers and any offload),
  // and the data-parallel communication waited for during the first two and the optimizer.
  double data_s_ = 0, fb_s_ = 0, optim_s_ = 0, fb_comm_s_ = 0, optim_comm_s_ = 0;
  double fb_optim_wait_s_ = 0;  // of fb_s_: waiting for the overlapped optimizer step
  uint64_t in_place_seen_ = 0;  // comm::transport_stats().bytes_read_in_place at the last step
  // For --plan: every step's time and the largest model-state and activation high-water
  // marks over the ranks (MiB).
  std::vector<double> step_s_;
  std::vector<plan::CpuCosts> plan_costs_;         // rank 0: plan_sample's measurements
  std::vector<double> plan_link_gbps_;             // plan_sample's link measurements (every rank)
  std::shared_ptr<comm::Communicator> plan_link_;  // the world on the default rings
  double state_peak_max_mb_ = 0, act_peak_max_mb_ = 0;
};

}  // namespace loom::train
