#include "loom/train/trainer.h"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/ckpt/checkpoint.h"
#include "loom/comm/bootstrap.h"
#include "loom/comm/communicator.h"
#include "loom/comm/flight_recorder.h"
#include "loom/core/cpus.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/signals.h"
#include "loom/core/state_memory.h"
#include "loom/core/stats.h"
#include "loom/data/loader.h"
#include "loom/interop/model_files.h"
#include "loom/kernels/backend.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/model/gpt.h"
#include "loom/optim/moment_file.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/mesh.h"
#include "loom/parallel/pipeline.h"
#include "loom/parallel/process_groups.h"
#include "loom/parallel/tensor_parallel.h"
#include "loom/plan/calibrate.h"
#include "loom/plan/planner.h"
#include "loom/profile/system_sampler.h"
#include "loom/profile/trace.h"
#include "loom/train/divergence.h"
#include "loom/train/evaluate.h"
#include "loom/train/tensorboard.h"

namespace loom::train {
namespace fs = std::filesystem;
using Clock = Trainer::Clock;

namespace {

std::atomic<int> g_stop_signal{0};  // set by the signal thread, read at step boundaries

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return buf;
}

// Metrics lines of steps after the resumed one belong to the abandoned future; drop them
// (atomically) so metrics.jsonl reads as one uninterrupted run.
void truncate_metrics(const std::string& path, int64_t last_step) {
  if (!fs::exists(path)) return;
  std::istringstream in(read_file(path));
  std::string line, kept;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("step", int64_t{0}) <= last_step) kept += line + "\n";
  }
  write_file_atomic(path, kept);
}

// Bytes this process has held at most (VmHWM), for the per-rank memory metrics.
double peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024.0;
}

// The model the config names, with its [model] shape keys applied (a custom shape).
model::GptConfig model_of(const TrainConfig& c) {
  model::GptConfig g = model::GptConfig::named(c.model_name)
                           .reshaped(static_cast<int>(c.n_layer), static_cast<int>(c.n_embd),
                                     static_cast<int>(c.n_head), static_cast<int>(c.vocab_size),
                                     static_cast<int>(c.block_size));
  g.validate();
  return g;
}

}  // namespace

Trainer::Trainer(TrainConfig cfg, const TrainOptions& opt)
    : cfg_(std::move(cfg)), opt_(opt), model_cfg_(model_of(cfg_)) {}

void Trainer::open_data() {
  if (!fs::is_directory(cfg_.data_path))
    throw UserError("data.path " + cfg_.data_path + " is not a folder",
                    "prepare one with `loom prep -i TEXT -o DIR` and set data.path=DIR");
  train_data_.emplace(data::TokenDataset::open(cfg_.data_path, "train"));
  const int B = static_cast<int>(cfg_.global_batch), T = static_cast<int>(cfg_.seq_len);
  loader_.emplace(*train_data_, data::BatchShape{B, T, coord_.dp, mesh_->dp()},
                  static_cast<uint64_t>(cfg_.seed));
  x_.resize(static_cast<size_t>(cfg_.micro_batch * cfg_.grad_accum * cfg_.seq_len));
  y_.resize(x_.size());
  if (cfg_.eval_every > 0) {
    val_data_.emplace(data::TokenDataset::open(cfg_.data_path, "val"));
    const int vb = static_cast<int>(cfg_.micro_batch);
    val_loader_.emplace(*val_data_, data::BatchShape{vb, T, 0, 1},
                        static_cast<uint64_t>(cfg_.seed));
  }
}

// Every rank checks before any rank writes (the communicator is created after this, and
// its rendezvous waits for all ranks).
void Trainer::check_run_dir() {
  const std::string metrics = cfg_.run_dir + "/metrics.jsonl";
  if (!opt_.resume && (fs::exists(metrics) || !ckpt::latest(cfg_.run_dir + "/ckpt").empty()))
    throw UserError("run.dir " + cfg_.run_dir + " already holds a run",
                    "continue it with --resume, or pick a new run.dir (nothing was changed)");
}

void Trainer::open_checkpoint() {
  const std::string dir = ckpt::latest(cfg_.run_dir + "/ckpt");
  if (dir.empty()) return;
  const ckpt::Reader& r = checkpoint_.emplace(dir);
  if (r.meta()["model"] != model_cfg_.to_json())
    throw UserError("checkpoint " + dir + " is of model " + r.meta()["model"].dump() +
                        ", the config asks for " + model_cfg_.to_json().dump(),
                    "resume with the model.name the run was started with, or use a new run.dir");
}

int64_t Trainer::restore() {
  if (!checkpoint_) {
    if (opt_.resume && chatty())
      std::printf("loom: no checkpoint in %s/ckpt yet; starting from step 0\n",
                  cfg_.run_dir.c_str());
    if (init_) {
      dp_->load(*init_->weights, /*weights_only=*/true);
      step_->check_replicas("the weights of train.init_from", true);
      if (chatty())
        std::printf("loom: starting from %s %s (step 0, a fresh optimizer)\n", init_->kind.c_str(),
                    init_->path.c_str());
      return 0;
    }
    dp_->init_weights(static_cast<uint64_t>(cfg_.seed));
    step_->check_replicas("the initial weights", true);
    return 0;
  }
  dp_->load(*checkpoint_);
  const int64_t step = checkpoint_->meta()["next_step"];
  loader_->set_sample_offset(checkpoint_->meta().value("data_offset", uint64_t{0}));
  if (chatty())
    std::printf("loom: resumed from %s (step %lld)\n", checkpoint_->dir().c_str(),
                static_cast<long long>(step));
  return step;
}

void Trainer::save(int64_t next_step) {
  step_->check_replicas("the weights at step " + std::to_string(next_step), false);
  const std::vector<ckpt::Piece> pieces = dp_->checkpoint_pieces();
  const nlohmann::json layout = {{"ranks", world_},
                                 {"dp", mesh_->dp()},
                                 {"tp", mesh_->tp()},
                                 {"pp", mesh_->pp()},
                                 {"placement", mesh_->order()},
                                 {"sequence_parallel", cfg_.sequence_parallel},
                                 {"pp_schedule", cfg_.pp_schedule},
                                 {"pp_virtual_stages", cfg_.pp_virtual_stages},
                                 {"zero", cfg_.zero}};
  nlohmann::json meta = {{"next_step", next_step},
                         {"loader_step", next_step},
                         {"seed", cfg_.seed},
                         {"model", model_cfg_.to_json()},
                         {"config", cfg_.to_toml()},
                         {"layout", layout},
                         {"dtype", cfg_.dtype},
                         // The data's position past a rewind, and whether the step before
                         // this save was finite (ckpt.keep counts only finite ones).
                         {"data_offset", loader_->sample_offset()},
                         {"finite", !health_.bad()}};
  TraceSpan span("checkpoint", "checkpoint");
  ckpt::SaveOptions so;
  so.root = cfg_.run_dir + "/ckpt";
  so.step = next_step;
  so.keep = static_cast<int>(cfg_.ckpt_keep);
  so.rank = rank_;
  so.world = world_;
  so.barrier = [this] { barrier(); };
  ckpt::save(so, pieces, meta);
}

// This boot of this machine (/proc/sys/kernel/random/boot_id), as 32 bits a double holds.
static double boot_id_hash() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return static_cast<double>(std::hash<std::string>{}(id)&0xffffffffu);
}

// This rank's CLOCK_MONOTONIC minus rank 0's, in microseconds, and the round trip it was
// measured with (Cristian's algorithm: 8 ping-pongs with rank 0, the shortest round trip's
// midpoint against rank 0's reply time; error at most half that round trip). Every rank
// takes part, rank 0 serving the others in turn.
std::pair<double, double> Trainer::clock_offset_us() {
  if (!groups_.world) return {0, 0};
  constexpr int kRounds = 8;
  double best_rtt = 1e300, offset = 0, t = 0;
  if (rank_ == 0) {
    for (int r = 1; r < world_; ++r)
      for (int i = 0; i < kRounds; ++i) {
        groups_.world->recv(&t, 1, DType::kF64, r);
        t = Trace::now_us();
        groups_.world->send(&t, 1, DType::kF64, r);
      }
    return {0, 0};
  }
  for (int i = 0; i < kRounds; ++i) {
    const double t1 = Trace::now_us();
    groups_.world->send(&t1, 1, DType::kF64, 0);
    groups_.world->recv(&t, 1, DType::kF64, 0);
    const double t2 = Trace::now_us();
    if (t2 - t1 < best_rtt) best_rtt = t2 - t1, offset = (t1 + t2) / 2 - t;
  }
  return {offset, best_rtt};
}

// train.profile: each rank writes its spans (trace/rank-R.json), then rank 0 merges them
// into run.dir/trace.json: processes = ranks, threads = compute and one track per
// communicator. Each rank's times are moved onto rank 0's clock by the measured offset
// (about 0 for ranks of one machine, which share CLOCK_MONOTONIC; machines' clocks differ).
void Trainer::write_trace() {
  if (!cfg_.profile) return;
  sampler_.reset();  // its last sample is in system.jsonl and the trace both, or in neither
  Trace::get().enable(false);
  const auto events = Trace::get().take();
  // Ranks of rank 0's machine (same boot id, whatever the network namespace) share its
  // clock exactly: their measured offset is recorded, not applied.
  const auto [measured_us, rtt_us] = clock_offset_us();
  const auto boot = world_gather({boot_id_hash()});
  const double offset_us = boot[static_cast<size_t>(rank_)] == boot[0] ? 0.0 : measured_us;
  nlohmann::json out = nlohmann::json::array();
  out.push_back({{"ph", "M"},
                 {"name", "process_name"},
                 {"pid", rank_},
                 {"tid", 0},
                 {"args",
                  {{"name", "rank " + std::to_string(rank_)},
                   {"clock_offset_us", offset_us},
                   {"clock_measured_us", measured_us},
                   {"clock_rtt_us", rtt_us}}}});
  out.push_back({{"ph", "M"},
                 {"name", "process_sort_index"},
                 {"pid", rank_},
                 {"tid", 0},
                 {"args", {{"sort_index", rank_}}}});
  out.push_back({{"ph", "M"},
                 {"name", "thread_name"},
                 {"pid", rank_},
                 {"tid", Trace::kCompute},
                 {"args", {{"name", "compute"}}}});
  for (const auto& [comm, tid] : comm::FlightRecorder::get().tracks())
    out.push_back({{"ph", "M"},
                   {"name", "thread_name"},
                   {"pid", rank_},
                   {"tid", tid},
                   {"args", {{"name", "comm " + comm}}}});
  for (const auto& e : events) {
    nlohmann::json j = {{"ph", std::string(1, e.ph)},
                        {"name", e.name},
                        {"cat", e.cat},
                        {"pid", rank_},
                        {"tid", e.tid},
                        {"ts", e.ts_us - offset_us}};
    if (e.ph == 'X') j["dur"] = e.dur_us;
    if (!e.args.empty()) j["args"] = nlohmann::json::parse(e.args);
    out.push_back(std::move(j));
  }
  const std::string dir = cfg_.run_dir + "/trace";
  std::filesystem::create_directories(dir);
  write_file_atomic(dir + "/rank-" + std::to_string(rank_) + ".json", out.dump());
  barrier();
  if (rank_ != 0) return;
  nlohmann::json all = nlohmann::json::array();
  for (int r = 0; r < world_; ++r) {
    std::ifstream f(dir + "/rank-" + std::to_string(r) + ".json");
    for (auto& e : nlohmann::json::parse(f)) all.push_back(std::move(e));
  }
  write_file_atomic(cfg_.run_dir + "/trace.json",
                    nlohmann::json{{"traceEvents", all}, {"displayTimeUnit", "ms"}}.dump());
  if (chatty())
    std::printf("loom: timeline of %d rank(s) in %s/trace.json (chrome://tracing, Perfetto)\n",
                world_, cfg_.run_dir.c_str());
}

float Trainer::train_step(int64_t step, double lr, double* grad_norm, bool* stop) {
  const int mb = static_cast<int>(cfg_.micro_batch), T = static_cast<int>(cfg_.seq_len);
  const auto data_start = Clock::now();
  {
    TraceSpan span("data", "data");
    loader_->batch(static_cast<uint64_t>(step), x_.data(), y_.data());
  }
  const auto fb_start = Clock::now();
  data_s_ = std::chrono::duration<double>(fb_start - data_start).count();
  const double comm_before = dp_->comm_wait_s(), optim_wait_before = dp_->step_wait_s();
  dp_->zero_grad();
  // The accumulation micro-steps (a pipeline's microbatches), through this rank's part.
  const float scale = 1.0f / static_cast<float>(cfg_.grad_accum);
  const double loss_sum =
      runner_->train_step(x_.data(), y_.data(), mb, T, static_cast<int>(cfg_.grad_accum), scale);
  double norm;
  {
    TraceSpan span("gradients", "compute");  // the last reductions and the norm
    step_->finish_reductions();
    poison_for_test(step);
    norm = step_->grad_norm();
  }
  *grad_norm = norm;
  // The mean loss over the data-parallel replicas (the last pipeline stage computes it, the
  // tensor-parallel ranks of a stage the same value, other stages report 0), whether any
  // rank was asked to stop (every rank must stop after the same step, or the checkpoint
  // they save together would not match) and whether any rank's gradient norm is not finite
  // (a replica's own gradients are not reduced into the others' norm): one allreduce,
  // before the update, so that every rank takes the same decision on it.
  const auto sums = world_sum({loss_sum / static_cast<double>(cfg_.grad_accum),
                               g_stop_signal.load() ? 1.0 : 0.0, std::isfinite(norm) ? 0.0 : 1.0});
  *stop = sums[1] > 0;
  const float loss = static_cast<float>(sums[0] / (mesh_->dp() * mesh_->tp()));
  health_ = guard_->judge(loss, sums[2] > 0);
  const float clip = cfg_.grad_clip > 0 && norm > cfg_.grad_clip
                         ? static_cast<float>(cfg_.grad_clip / norm)
                         : 1.0f;
  const auto optim_start = Clock::now();
  fb_s_ = std::chrono::duration<double>(optim_start - fb_start).count();
  fb_comm_s_ = dp_->comm_wait_s() - comm_before;
  fb_optim_wait_s_ = dp_->step_wait_s() - optim_wait_before;
  if (!health_.bad()) {  // a bad step's update is never applied, whatever the policy
    TraceSpan span("optimizer", "optimizer");
    dp_->optimizer_step(clip, lr, cfg_.adamw(), step + 1);
  }
  optim_s_ = std::chrono::duration<double>(Clock::now() - optim_start).count();
  optim_comm_s_ = dp_->comm_wait_s() - comm_before - fb_comm_s_;
  return loss;
}

// Each data-parallel replica evaluates every dp-th batch; rounds stay in step on all ranks
// (ZeRO-3's and tensor parallelism's forward are collective), a replica past the end
// repeats a batch with weight 0.
double Trainer::evaluate() {
  const int mb = static_cast<int>(cfg_.micro_batch), T = static_cast<int>(cfg_.seq_len);
  std::vector<int32_t> x(static_cast<size_t>(mb) * T), y(x.size());
  double sum = 0;
  const int64_t n = std::min<int64_t>(cfg_.eval_batches, val_loader_->steps_per_epoch());
  for (int64_t first = 0; first < n; first += mesh_->dp()) {  // the same batches every time
    const int64_t i = first + coord_.dp;
    val_loader_->batch(static_cast<uint64_t>(i % n), x.data(), y.data());
    const double loss = runner_->forward_only(x.data(), y.data(), mb, T, nullptr);
    if (i < n) sum += loss;
  }
  // Summed over every rank: each replica's last stage counted once per tensor-parallel rank.
  return world_sum({sum})[0] / static_cast<double>(n * mesh_->tp());
}

// eval.task: each data-parallel replica scores every dp-th item through the layout's own
// forward (micro_batch rows of seq_len tokens, padded), so ZeRO-3's gathers and the tensor-
// and pipeline-parallel communication run as in training; the replicas' log-likelihoods
// are gathered through a sum in which each replica's reporting rank (tensor-parallel rank
// 0 of the last stage) alone fills its slot.
train::ChoiceScores Trainer::evaluate_task() {
  const int mb = static_cast<int>(cfg_.micro_batch), T = static_cast<int>(cfg_.seq_len);
  std::vector<int> x(static_cast<size_t>(mb) * T), y(x.size());
  std::vector<float> losses(x.size());
  const train::NllFn nll = [&](const int* tokens, const int* targets, int B, int Tn, float* out) {
    for (int r0 = 0; r0 < B; r0 += mb) {
      std::fill(x.begin(), x.end(), 0);
      std::fill(y.begin(), y.end(), 0);
      const int rows = std::min(mb, B - r0);
      for (int r = 0; r < rows; ++r)
        for (int t = 0; t < Tn; ++t)
          x[r * T + t] = tokens[(r0 + r) * Tn + t], y[r * T + t] = targets[(r0 + r) * Tn + t];
      runner_->forward_only(x.data(), y.data(), mb, T, losses.data());
      for (int r = 0; r < rows; ++r)
        for (int t = 0; t < Tn; ++t) out[(r0 + r) * Tn + t] = losses[r * T + t];
    }
  };
  const bool reports = coord_.tp == 0 && runner_->computes_loss();
  const train::GatherFn gather = [&](const std::vector<double>& mine) {
    std::vector<double> all(mine.size() * mesh_->dp(), 0.0);
    if (reports) std::copy(mine.begin(), mine.end(), all.begin() + mine.size() * coord_.dp);
    return world_sum(std::move(all));
  };
  return train::score_choices(task_, tokenizer_, T + 1, nll, coord_.dp, mesh_->dp(), gather);
}

// The evaluations due after `step` (1-based count of steps done): the validation loss
// (`val`) and eval.task's scores, into metrics.jsonl, TensorBoard and the console.
void Trainer::run_evaluations(int64_t step, bool val) {
  TraceSpan span("evaluation", "eval");
  nlohmann::json j = {{"step", step}};
  std::vector<std::pair<std::string, double>> scalars;
  std::string line;
  if (val) {
    const double v = evaluate();
    j["val_loss"] = v;
    scalars.push_back({"val/loss", v});
    char buf[64];
    std::snprintf(buf, sizeof buf, "val loss %.4f", v);
    line = buf;
  }
  if (!task_.empty()) {
    const train::ChoiceScores c = evaluate_task();
    j["task_acc"] = c.acc;
    j["task_acc_norm"] = c.acc_norm;
    j["task_items"] = c.items;
    scalars.push_back({"eval/task_acc", c.acc});
    scalars.push_back({"eval/task_acc_norm", c.acc_norm});
    char buf[96];
    std::snprintf(buf, sizeof buf, "%stask acc %.4f, acc_norm %.4f (%lld items)",
                  line.empty() ? "" : ", ", c.acc, c.acc_norm, static_cast<long long>(c.items));
    line += buf;
  }
  if (rank_ == 0) {
    metrics_ << j.dump() << "\n";
    metrics_.flush();
    tb_->scalars(step, scalars);
  }
  if (chatty()) std::printf("step %6lld | %s\n", static_cast<long long>(step), line.c_str());
}

std::vector<double> Trainer::world_sum(std::vector<double> v) {
  if (groups_.world)
    dp_->timed([&] {
      groups_.world->allreduce(v.data(), v.data(), v.size(), DType::kF64, comm::ReduceOp::kSum);
    });
  return v;
}

std::vector<double> Trainer::world_gather(const std::vector<double>& v) {
  if (!groups_.world) return v;
  std::vector<double> all(v.size() * world_);
  groups_.world->allgather(v.data(), all.data(), v.size(), DType::kF64);
  return all;
}

void Trainer::barrier() {
  if (groups_.world) groups_.world->barrier();
}

// This rank's part of the step's metrics, gathered from every rank (profile/metrics_fields.h),
// from the step's data-parallel and tensor-parallel waits (read by log_step) and the
// pipeline's, offload's and moments' counters, which it resets for the next step.
RankMetrics Trainer::rank_metrics(double comm_wait_ms, double tp_comm_ms) {
  using F = RankMetrics::PerRank;
  constexpr double kMiB = 1 << 20;
  RankMetrics m;
  // Memory: the model-state high-water mark (parameters, gradients, optimizer state,
  // gathered buffers), the activation buffers and the process's peak RSS. Under a pipeline
  // the activations are the most its held microbatches took at once.
  double act = static_cast<double>(model_->activation_bytes());
  double block_act = static_cast<double>(model_->block_activation_bytes());
  double pp_wait_ms = 0;
  if (pipeline_) {
    act += static_cast<double>(pipeline_->peak_activation_bytes());
    block_act = static_cast<double>(pipeline_->peak_block_activation_bytes());
    pp_wait_ms = pipeline_->wait_s() * 1e3;
    m.set(F::kPpScheduleIdleMs, pipeline_->last_step_schedule().idle[pipeline_->stage()] * 1e3);
    if (pipeline_->offload()) m.set(F::kOffloadMb, pipeline_->offload()->bytes_written() / kMiB);
    pipeline_->reset_counters();
  }
  if (!pipeline_) m.leave_out(F::kPpWaitMs), m.leave_out(F::kPpScheduleIdleMs);
  if (!pipeline_ || !pipeline_->offload()) m.leave_out(F::kOffloadMb);
  if (!dp_->overlaps_step()) m.leave_out(F::kOptimWaitMs);
  if (moments_) {  // optimizer state moved to and from its file in the step
    m.set(F::kZeroOffloadMb, (moments_->bytes_read() + moments_->bytes_written()) / kMiB);
    moments_->reset_counters();
  } else {
    m.leave_out(F::kZeroOffloadMb);
  }
  // This rank's step by kind (docs/formats.md, metrics.jsonl): communication it waited for
  // outside the optimizer (data-parallel, tensor-parallel, pipeline receives), compute = the
  // forward/backward time less the communication waited for inside it.
  const double blocked_ms = tp_comm_ms + pp_wait_ms;
  // Bytes this rank received by reading senders' buffers in place in the step (shared
  // buffers, docs/algorithms.md "Single copy").
  const uint64_t in_place = comm::transport_stats().bytes_read_in_place;
  m.set(F::kStatePeakMb, static_cast<double>(StateMemory::peak()) / kMiB);
  m.set(F::kRssPeakMb, peak_rss_bytes() / kMiB);
  m.set(F::kActivationMb, act / kMiB);
  m.set(F::kBlockActivationMb, block_act / kMiB);
  m.set(F::kPpWaitMs, pp_wait_ms);
  m.set(F::kOptimMs, optim_s_ * 1e3);
  m.set(F::kOptimWaitMs, fb_optim_wait_s_ * 1e3);
  m.set(F::kDataMs, data_s_ * 1e3);
  m.set(F::kComputeMs, std::max(0.0, (fb_s_ - fb_comm_s_ - fb_optim_wait_s_) * 1e3 - blocked_ms));
  m.set(F::kExposedCommMs, comm_wait_ms - optim_comm_s_ * 1e3 + blocked_ms);
  m.set(F::kCommInPlaceMb, static_cast<double>(in_place - in_place_seen_) / kMiB);
  in_place_seen_ = in_place;
  m.gather([this](const std::vector<double>& v) { return world_gather(v); });
  state_peak_max_mb_ = std::max(state_peak_max_mb_, m.max_over_ranks(F::kStatePeakMb));
  act_peak_max_mb_ = std::max(act_peak_max_mb_, m.max_over_ranks(F::kActivationMb));
  return m;
}

void Trainer::log_step(int64_t step, float loss, double lr, double grad_norm, double step_s) {
  namespace mf = profile::metrics;
  const double comm_wait_ms = dp_->comm_wait_s() * 1e3;
  const double tp_comm_ms = tp_ ? tp_->counters().seconds * 1e3 : 0;
  const double tp_comm_mb = tp_ ? tp_->counters().bytes / (1 << 20) : 0;
  const RankMetrics ranks = rank_metrics(comm_wait_ms, tp_comm_ms);
  dp_->reset_comm_wait();
  if (tp_) tp_->reset_counters();
  step_s_.push_back(step_s);
  if (rank_ != 0) return;
  const double tokens = static_cast<double>(cfg_.global_batch) * cfg_.seq_len;
  const double tps = tokens / step_s;
  const auto skipped = static_cast<double>(guard_->skipped());
  const auto rewinds = static_cast<double>(guard_->rewinds());
  const double mfu =
      model_cfg_.flops_per_token(static_cast<int>(cfg_.seq_len)) * tps / (peak_gflops_ * 1e9);
  const std::vector<std::pair<mf::ScalarField, double>> job = {{mf::kLoss, loss},
                                                               {mf::kLr, lr},
                                                               {mf::kGradNorm, grad_norm},
                                                               {mf::kStepMs, step_s * 1e3},
                                                               {mf::kCommWaitMs, comm_wait_ms},
                                                               {mf::kTokensPerS, tps},
                                                               {mf::kMfu, mfu},
                                                               {mf::kSkippedSteps, skipped},
                                                               {mf::kRewinds, rewinds}};
  nlohmann::json j = {{mf::kStep, step + 1}};
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& [field, value] : job) {
    j[field.key] = value;
    scalars.push_back({field.tensorboard, value});
  }
  if (tp_) {
    j[mf::kTpCommMs.key] = tp_comm_ms, j[mf::kTpCommMb.key] = tp_comm_mb;
    scalars.push_back({mf::kTpCommMs.tensorboard, tp_comm_ms});
  }
  ranks.write(j);
  metrics_ << j.dump() << "\n";
  metrics_.flush();
  ranks.add_scalars(scalars);
  if (sampler_ && sampler_->samples() > 0) {  // the system's latest sample
    const profile::SystemSample s = sampler_->latest();
    double busy = 0;
    for (double b : s.cpu_busy) busy += b;
    scalars.push_back({"system/cpu_busy_cores", busy});
    scalars.push_back({"system/rss_mb_rank0", s.rss_mb});
    scalars.push_back({"system/disk_read_mbps", s.disk_read_mbps});
    scalars.push_back({"system/disk_write_mbps", s.disk_write_mbps});
    scalars.push_back({"system/ctxt_per_s", s.ctxt_per_s});
    for (const auto& [dev, rt] : s.net_mbps)
      scalars.push_back({"system/net_mbps/" + dev, rt.first + rt.second});
    for (const auto& g : s.gpus) {
      scalars.push_back({"system/gpu" + std::to_string(g.index) + "/util_pct", g.util_pct});
      scalars.push_back({"system/gpu" + std::to_string(g.index) + "/mem_used_mb", g.mem_used_mb});
    }
  }
  tb_->scalars(step + 1, scalars);
  if (!opt_.quiet && ((step + 1) % cfg_.log_every == 0 || step + 1 == cfg_.steps)) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - started_).count();
    const double per_step = elapsed / static_cast<double>(step + 1 - first_step_);
    char tp_part[48] = "";
    if (tp_) std::snprintf(tp_part, sizeof tp_part, ", tp %.0f", tp_comm_ms);
    std::printf(
        "step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %7.0f tok/s | MFU %4.1f%% | "
        "%6.0f ms (comm wait %.0f%s) | ETA %s\n",
        static_cast<long long>(step + 1), static_cast<long long>(cfg_.steps), loss, lr, grad_norm,
        tps, 100 * mfu, step_s * 1e3, comm_wait_ms, tp_part,
        format_duration(per_step * static_cast<double>(cfg_.steps - step - 1)).c_str());
    std::fflush(stdout);
  }
}

void Trainer::resolve_model() {
  if (!cfg_.eval_task.empty()) {
    task_ = train::read_choice_task(cfg_.eval_task);
    tokenizer_ = data::Gpt2Tokenizer::load("");
  }
  if (cfg_.init_from.empty()) return;
  init_.emplace(interop::open_model(cfg_.init_from));
  const model::GptConfig& from = init_->config;
  if (cfg_.model_name_set || cfg_.reshaped()) {
    nlohmann::json a = model_cfg_.to_json(), b = from.to_json();
    a.erase("name"), b.erase("name");
    if (a != b)
      throw UserError("the [model] section (" + model_cfg_.name + ": " +
                          interop::describe_shape(model_cfg_) + ") disagrees with " +
                          "train.init_from " + init_->path + " (" + interop::describe_shape(from) +
                          ")",
                      "leave the [model] section out: with train.init_from the shape comes from "
                      "the file");
  }
  model_cfg_ = from;
  cfg_.model_name = from.name;
}

void Trainer::plan_layout() {
  mesh_ = parallel::Mesh::build(world_, static_cast<int>(cfg_.tp), static_cast<int>(cfg_.pp),
                                cfg_.placement);
  coord_ = mesh_->coord(rank_);
  model_cfg_.validate_split(mesh_->tp());
  const int P = mesh_->pp(), V = static_cast<int>(cfg_.pp_virtual_stages);
  if (P == 1 &&
      (V > 1 || !cfg_.pp_split.empty() || cfg_.pp_active_microbatches > 0 || cfg_.pp_head_split))
    throw UserError(
        "pp.virtual_stages, pp.split, pp.active_microbatches and pp.head_split need pipeline "
        "parallelism (train.pp > 1)",
        "set train.pp, or leave the pp section out");
  if (cfg_.pp_head_split && (mesh_->tp() > 1 || cfg_.offload_activations))
    throw UserError(
        std::string("pp.head_split is built without tensor parallelism or activation offload; "
                    "this run has ") +
            (mesh_->tp() > 1 ? "train.tp = " + std::to_string(mesh_->tp())
                             : std::string("train.offload_activations")),
        "turn pp.head_split off, or run it with train.tp = 1 and no activation offload");
  if (cfg_.zero_offload_master) {
    std::string missing;
    if (cfg_.zero_offload != "disk")
      missing = "zero.offload = \"" + cfg_.zero_offload + "\"";
    else if (cfg_.zero != 0)
      missing = "train.zero = " + std::to_string(cfg_.zero);
    else if (cfg_.dtype != "bf16")
      missing = "train.dtype = \"" + cfg_.dtype + "\"";
    else if (cfg_.backend != "cpu")
      missing = "train.backend = \"" + cfg_.backend + "\"";
    if (!missing.empty())
      throw UserError(
          "zero.offload_master needs zero.offload = \"disk\", train.zero = 0, "
          "train.dtype = \"bf16\" and train.backend = \"cpu\"; this run has " +
              missing,
          "set those four, or leave zero.offload_master out (the master weights stay "
          "in memory)");
  }
  if (P == 1 && cfg_.offload_activations)
    throw UserError("train.offload_activations needs pipeline parallelism (train.pp > 1)",
                    "without a pipeline one micro-batch is held at a time; use train.recompute "
                    "to save activation memory");
  // A pipeline's microbatches are the step's accumulation micro-batches.
  if (cfg_.pp_microbatches > 0) {
    if (cfg_.grad_accum != 0 && cfg_.grad_accum != cfg_.pp_microbatches)
      throw UserError("pp.microbatches = " + std::to_string(cfg_.pp_microbatches) +
                          " disagrees with train.grad_accum = " + std::to_string(cfg_.grad_accum),
                      "a pipeline's microbatches are the accumulation steps: set one of them");
    cfg_.grad_accum = cfg_.pp_microbatches;
  }
  cfg_.resolve_batch(mesh_->dp());
  if (P > 1) {
    schedule_ = parallel::schedule_kind(cfg_.pp_schedule);
    parallel::make_schedule(schedule_, P, static_cast<int>(cfg_.grad_accum), V,
                            static_cast<int>(cfg_.pp_active_microbatches));  // checks M, V, A
    const int units = model_cfg_.n_layer + 2;
    const std::vector<double> costs =
        parallel::gpt_unit_costs(model_cfg_.n_layer, model_cfg_.n_embd, model_cfg_.vocab_size,
                                 static_cast<int>(cfg_.seq_len));
    if (cfg_.pp_split.empty())
      pieces_ = parallel::balance_stages(costs, P, V);
    else
      pieces_ = parallel::split_units({cfg_.pp_split.begin(), cfg_.pp_split.end()}, units, P * V);
    if (cfg_.pp_head_split) {
      // The cut and the head's share together (a given pp.split stays), by the simulated step.
      const parallel::HeadSplitPlan plan = parallel::plan_head_split(
          costs, 6.0 * model_cfg_.vocab_size * model_cfg_.n_embd,
          static_cast<int>(cfg_.micro_batch * cfg_.seq_len), schedule_, P, V,
          static_cast<int>(cfg_.grad_accum), static_cast<int>(cfg_.pp_active_microbatches),
          cfg_.pp_split.empty() ? std::vector<parallel::UnitRange>{} : pieces_);
      pieces_ = plan.pieces;
      head_split_ = {plan.rows, plan.forward_cost, plan.cost};
      head_split_gain_ = plan.step > 0 ? plan.unsplit_step / plan.step : 1;
    }
  }
  if (cfg_.seq_len > model_cfg_.block_size)
    throw UserError("train.seq_len = " + std::to_string(cfg_.seq_len) + " exceeds the context of " +
                        model_cfg_.name + " (" + std::to_string(model_cfg_.block_size) + ")",
                    "lower train.seq_len or pick a model with a longer context");
  if (cfg_.sequence_parallel && (cfg_.micro_batch * cfg_.seq_len) % cfg_.tp != 0)
    throw UserError("tp.sequence_parallel splits the " +
                        std::to_string(cfg_.micro_batch * cfg_.seq_len) +
                        " token rows of a micro-batch (micro_batch x seq_len) over train.tp = " +
                        std::to_string(cfg_.tp) + " ranks, which does not divide them",
                    "make train.micro_batch x train.seq_len a multiple of train.tp");
}

int Trainer::run() {
  launch_ = comm::launch_info_from_env();
  rank_ = launch_.rank;
  world_ = launch_.size;
  all_ranks_log_ = std::getenv("LOOM_LOG_ALL_RANKS") != nullptr;
  // Everything that can be wrong with the input is checked here, on every rank, before
  // any rank connects or writes.
  resolve_model();
  plan_layout();
  set_threads();
  build_model();
  open_data();
  check_run_dir();
  open_checkpoint();
  open_offload();
  // Then the ranks connect, and the parallel state takes the model's memory.
  build_parallel_state();
  open_outputs();
  resolve_precision();
  print_banner();
  return loop();
}

void Trainer::set_threads() {
  const int cpus = cpus_available();
  threads_ =
      cfg_.threads > 0 ? static_cast<int>(cfg_.threads) : std::max(1, cpus / launch_.local_size);
  omp_set_num_threads(threads_);
  threads_why_ = cfg_.threads > 0
                     ? " (train.threads)"
                     : " (" + std::to_string(cpus) + " CPUs this process may use / " +
                           std::to_string(launch_.local_size) + " rank(s) on this machine)";
}

void Trainer::build_model() {
  model_ = std::make_unique<model::Gpt>(
      model_cfg_, /*own_storage=*/false,
      model::TensorSplit{mesh_->tp(), coord_.tp, cfg_.sequence_parallel});
  model_->set_recompute_every(cfg_.recompute_every());
  if (cfg_.backend != "cpu") model_->set_backend(kernels::make_backend(cfg_.backend));
}

void Trainer::open_offload() {
  if (cfg_.offload_activations)
    offload_ = std::make_unique<parallel::ActivationOffload>(
        cfg_.offload_dir.empty() ? cfg_.run_dir + "/spill" : cfg_.offload_dir, rank_);
  if (cfg_.zero_offload == "disk")
    moments_ = std::make_shared<optim::MomentFile>(
        cfg_.zero_offload_dir.empty() ? cfg_.run_dir + "/offload" : cfg_.zero_offload_dir, rank_);
}

// The process groups of the mesh, then the parallel state over them: tensor parallelism
// (the model's TpComm), the pipeline stage, and data parallelism / ZeRO over the units
// this rank holds, which owns the model's parameter, gradient and optimizer memory.
void Trainer::build_parallel_state() {
  std::shared_ptr<const parallel::ShardingPolicy> sharding =
      parallel::make_sharding_policy(static_cast<int>(cfg_.zero));
  parallel::GroupOptions go;
  go.shard_within_node = cfg_.shard_group == "node" && sharding->shards();
  // The world carries sums, gathers and barriers of a few values (its groups, split from it,
  // get the default rings): small rings.
  std::shared_ptr<comm::Communicator> world;
  if (world_ > 1) {
    comm::CommConfig wc = comm::CommConfig::from_env();
    wc.shm_ring_bytes = comm::CommConfig::kControlRing;
    world = comm::init_from_env(wc);
  }
  groups_ = parallel::make_process_groups(std::move(world), *mesh_, go);
  if (groups_.tp) {
    tp_ = std::make_unique<parallel::TensorParallel>(groups_.tp);
    model_->set_tp_comm(tp_.get());
  }
  parallel::DpOptions dpo;
  dpo.sharding = std::move(sharding);
  dpo.comm_bf16 = cfg_.comm_dtype == "bf16";
  dpo.shared_buffers = cfg_.shared_buffers == "auto";
  dpo.shared_gather = cfg_.shared_gather == "auto";
  dpo.moments = moments_;
  dpo.overlap_step = cfg_.zero_overlap_step;
  dpo.offload_master = cfg_.zero_offload_master;
  dpo.lookup_from_master = cfg_.zero_offload_master && mesh_->tp() == 1 && !cfg_.pp_head_split;
  if (mesh_->pp() > 1) {
    pipeline_ = std::make_unique<parallel::PipelineStage>(
        *model_, groups_.pp, pieces_, schedule_, static_cast<int>(cfg_.grad_accum),
        static_cast<int>(cfg_.pp_active_microbatches), head_split_);
    if (offload_)
      pipeline_->set_offload(std::move(offload_),
                             static_cast<int>(cfg_.activation_loading_horizon));
    dpo.units = pipeline_->units();
    dpo.unit0_is_head_copy = pipeline_->last() && !pipeline_->first();
    dpo.pipeline = true;
  }
  dp_ = std::make_unique<parallel::DataParallel>(*model_, groups_, dpo);
  step_ = std::make_unique<parallel::StepComposer>(*dp_, groups_);
  runner_ = parallel::make_stage_runner(*model_, *dp_, pipeline_.get());
}

void Trainer::open_outputs() {
  if (rank_ == 0) {
    fs::create_directories(cfg_.run_dir);
    write_file_atomic(cfg_.run_dir + "/config.toml", cfg_.to_toml());
  }
  first_step_ = restore();
  if (rank_ != 0) return;
  truncate_metrics(cfg_.run_dir + "/metrics.jsonl", first_step_);
  metrics_.open(cfg_.run_dir + "/metrics.jsonl", std::ios::app);
  if (!metrics_)
    throw UserError("cannot append to " + cfg_.run_dir + "/metrics.jsonl",
                    "check that run.dir is writable");
  tb_ = std::make_unique<TensorBoardWriter>(cfg_.run_dir);
  if (cfg_.system_sample_s > 0)
    sampler_ = std::make_unique<profile::SystemSampler>(cfg_.run_dir + "/system.jsonl",
                                                        cfg_.system_sample_s);
}

// GEMM peaks, fp32 and bf16 (summed over the ranks): train.dtype = auto picks bf16 only
// where it is faster, an explicit bf16 that is slower gets a warning. metrics.peak_gflops
// replaces the measured peak for MFU (with an explicit fp32 nothing is measured). A resumed
// run keeps the precision its checkpoint was trained in (bit-exact resume).
void Trainer::resolve_precision() {
  requested_dtype_ = cfg_.dtype;
  if (cfg_.peak_gflops <= 0 || cfg_.dtype != "fp32") {
    const auto sums =
        world_sum({kernels::cpu::measure_peak_gflops(kernels::cpu::Precision::kF32),
                   kernels::cpu::measure_peak_gflops(kernels::cpu::Precision::kBF16)});
    peaks_[0] = sums[0], peaks_[1] = sums[1];
  }
  const nlohmann::json* meta = checkpoint_ ? &checkpoint_->meta() : nullptr;
  cfg_.dtype =
      requested_dtype_ == "auto" && meta && meta->contains("dtype")
          ? (*meta)["dtype"].get<std::string>()
          : TrainConfig::resolve_dtype(requested_dtype_, peaks_[0], peaks_[1],
                                       cfg_.backend == "cpu" && kernels::cpu::native_bf16());
  const bool bf16 = cfg_.dtype == "bf16";
  model_->set_precision(bf16 ? kernels::Precision::kBF16 : kernels::Precision::kF32);
  peak_gflops_ = cfg_.peak_gflops > 0 ? cfg_.peak_gflops * world_ : peaks_[bf16 ? 1 : 0];
  if (requested_dtype_ == "bf16" && peaks_[1] < peaks_[0] && rank_ == 0)
    std::fprintf(stderr,
                 "loom: warning: train.dtype = bf16, but bf16 products run at %.0f GFLOP/s here "
                 "against %.0f in fp32 (no AVX-512 BF16?); train.dtype = auto would pick fp32\n",
                 peaks_[1] / world_, peaks_[0] / world_);
  peak_lr_ = cfg_.lr_scale == "linear" ? cfg_.lr * mesh_->dp() : cfg_.lr;
}

void Trainer::print_banner() const {
  if (!chatty()) return;
  double params = 0;  // the whole model's, whatever this rank holds of it
  for (const model::Tensor& t : model_->tensors()) params += static_cast<double>(numel(t.shape));
  // Read back on every thread of the team (core/float_env.h: set in main, inherited).
  int team = 0;
  const int flushing = kernels::cpu::threads_flushing_denormals(&team);
  const std::string denormals =
      flushing == team ? "denormals flushed to zero on all " + std::to_string(team) + " threads"
      : flushing == 0  ? "denormals kept (LOOM_FLUSH_DENORMALS=0)"
                       : "denormals flushed on " + std::to_string(flushing) + " of " +
                            std::to_string(team) + " threads";
  const std::string peaks = peaks_[0] > 0
                                ? " (GEMM peaks per rank: fp32 " +
                                      std::to_string(std::lround(peaks_[0] / world_)) + ", bf16 " +
                                      std::to_string(std::lround(peaks_[1] / world_)) + ")"
                                : "";
  std::printf(
      "loom: training %s (%.1fM parameters) on %s: %lld steps of %lld sequences x %lld "
      "tokens (micro-batch %lld x %lld accumulation x %d data-parallel, ZeRO %lld), %s%s, "
      "threads per rank: %d%s, %s, MFU peak %.0f GFLOP/s%s\n",
      model_cfg_.name.c_str(), params / 1e6, cfg_.data_path.c_str(),
      static_cast<long long>(cfg_.steps), static_cast<long long>(cfg_.global_batch),
      static_cast<long long>(cfg_.seq_len), static_cast<long long>(cfg_.micro_batch),
      static_cast<long long>(cfg_.grad_accum), mesh_->dp(), static_cast<long long>(cfg_.zero),
      cfg_.dtype.c_str(), requested_dtype_ == "auto" ? " (auto)" : "", threads_,
      threads_why_.c_str(), denormals.c_str(), peak_gflops_, peaks.c_str());
  std::printf("loom: layout %s%s%s\n", mesh_->describe().c_str(),
              cfg_.sequence_parallel && mesh_->tp() > 1 ? ", sequence parallel" : "",
              cfg_.backend != "cpu" ? (", kernels: " + cfg_.backend).c_str() : "");
  if (pipeline_)
    std::printf(
        "loom: pipeline %s, %lld microbatches%s, %d chunk(s) per stage: %s\n",
        cfg_.pp_schedule.c_str(), static_cast<long long>(cfg_.grad_accum),
        cfg_.pp_active_microbatches > 0
            ? (" (at most " + std::to_string(cfg_.pp_active_microbatches) + " active)").c_str()
            : "",
        static_cast<int>(cfg_.pp_virtual_stages),
        parallel::describe_stages(pieces_, model_cfg_.n_layer).c_str());
  if (pipeline_ && cfg_.pp_head_split) {
    const long long n = cfg_.micro_batch * cfg_.seq_len;
    if (head_split_.rows > 0)
      std::printf(
          "loom: head split: stage 0 runs the head for rows [0, %d) of each microbatch's "
          "%lld (%.0f%%), the last stage the rest; simulated step %.2fx faster\n",
          head_split_.rows, n, 100.0 * head_split_.rows / n, head_split_gain_);
    else
      std::printf(
          "loom: head split: no share of the head beats this cut on stage 0; the last "
          "stage runs all of it\n");
  }
}

// The steps, each followed by its metrics, the evaluations and checkpoints due after it;
// a stop signal ends the loop at the next step boundary with a checkpoint.
int Trainer::loop() {
  for (int sig : {SIGINT, SIGTERM}) on_signal(sig, [](int s) { g_stop_signal.store(s); });
  started_ = Clock::now();
  Trace::get().enable(cfg_.profile);
  guard_.emplace(parse_on_nonfinite(cfg_.on_nonfinite), cfg_.max_skips, cfg_.max_rewinds,
                 cfg_.spike_factor);
  const optim::LrSchedule schedule = cfg_.schedule(peak_lr_);
  int64_t saved_at = first_step_;
  dp_->reset_comm_wait();
  for (int64_t step = first_step_; step < cfg_.steps; ++step) {
    const auto t0 = Clock::now();
    const double lr = schedule.at(step);
    double norm = 0;
    bool stop = false;
    float loss;
    {
      TraceSpan span("step " + std::to_string(step + 1), "step");
      loss = train_step(step, lr, &norm, &stop);
    }
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    DivergenceGuard::Action action = guard_->decide(health_, loss);
    log_step(step, loss, lr, norm, dt);
    if (health_.bad()) {
      const std::string where = health_.grads_finite ? "" : locate_nonfinite();
      const std::string what = "step " + std::to_string(step + 1) + ": " +
                               health_.what(loss, cfg_.spike_factor) +
                               (where.empty() ? "" : " (" + where + ")");
      if (action == DivergenceGuard::Action::kRewind) {
        const int64_t back = rewind(step, what);
        if (back >= 0) {
          step = back - 1;  // the loop's ++ makes it `back`
          continue;
        }
        action = guard_->no_checkpoint();
      }
      if (action == DivergenceGuard::Action::kStop) return stop_diverged(what);
      if (chatty())
        std::printf("loom: %s; update skipped (%lld skipped so far, train.on_nonfinite = skip)\n",
                    what.c_str(), static_cast<long long>(guard_->skipped()));
    }
    if (cfg_.eval_every > 0 && (step + 1) % cfg_.eval_every == 0) run_evaluations(step + 1, true);
    // eval.task without eval.every: once, after the last step.
    if (cfg_.eval_every == 0 && !task_.empty() && step + 1 == cfg_.steps)
      run_evaluations(step + 1, false);
    if (cfg_.ckpt_every > 0 && (step + 1) % cfg_.ckpt_every == 0)
      save(step + 1), saved_at = step + 1;
    if (tb_) tb_->flush();
    if (plan_sample_due(step)) plan_sample();
    if (stop) {
      if (saved_at != step + 1) save(step + 1);
      write_trace();
      if (rank_ == 0 || all_ranks_log_)
        std::printf(
            "loom: stopped by a signal after step %lld; checkpoint saved, continue with "
            "--resume\n",
            static_cast<long long>(step + 1));
      return 130;
    }
  }
  if (saved_at != cfg_.steps) save(cfg_.steps);
  if (tb_) tb_->flush();
  write_trace();
  if (opt_.plan) plan_check();
  return 0;
}

// --plan: rank 0 measures the CPU's costs at this layout's shape (plan/calibrate.h: alone,
// and with as many copies as ranks at once) while the other ranks wait at a barrier, then all
// ranks measure the link, between two steps: at a third and two thirds of the run and at its
// end, so the costs are measured in the host's states the steps saw (on shared cores a state
// lasts seconds and moves a measurement by 10-40%; the link's flag hand-overs 4-10x);
// plan_check takes each cost's median over the three.
void Trainer::plan_sample() {
  barrier();
  if (rank_ == 0) {
    const int T = static_cast<int>(cfg_.seq_len);
    const int t = mesh_->tp();
    // The copies run where this job's ranks do (each on its rank's CPUs when they are bound).
    std::vector<std::vector<int>> cpus;
    if (groups_.world) cpus = groups_.world->topology().cpus;
    plan_costs_.push_back(plan::measure_cpu(
        {model_cfg_, static_cast<int>(cfg_.micro_batch), T, t, cfg_.recompute_every() == 1,
         cfg_.sequence_parallel && t > 1, cfg_.dtype == "bf16", omp_get_max_threads()},
        world_, 5, cpus));
  }
  barrier();
  if (groups_.world) plan_link_gbps_.push_back(measure_link());
}

// The shared-memory link as this job's ranks see it: a few allreduces of the gradients' size
// (8 MiB at most), bus bandwidth = 2(n-1)/n of the bytes over the median time.
double Trainer::measure_link() {
  // On the default rings the gradients' groups have (the world's are small).
  if (!plan_link_) plan_link_ = groups_.world->split(0, rank_);
  const size_t n = std::min<size_t>(model_->num_params(), size_t{2} << 20);
  std::vector<float> buf(n, 1.0f);
  std::vector<double> times;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = Clock::now();
    plan_link_->allreduce(buf.data(), buf.data(), n, DType::kF32, comm::ReduceOp::kSum);
    if (i > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * (world_ - 1) / world_ * n * 4 / median(times) / 1e9;
}

bool Trainer::plan_sample_due(int64_t step) const {
  const int64_t run = cfg_.steps - first_step_, done = step + 1 - first_step_;
  return opt_.plan && run >= 3 && step + 1 < cfg_.steps && (done == run / 3 || done == 2 * run / 3);
}

// --plan: the planner's prediction for this very layout (plan/planner.h), next to what the
// run measured: the model-state high-water mark (the largest over the ranks) and the median
// step time (the first step, which allocates and warms up, left out), with the CPU's costs
// sampled across the run (plan_sample).
void Trainer::plan_check() {
  plan_sample();
  const double link_gbps = plan_link_gbps_.empty() ? 0 : median(plan_link_gbps_);
  plan_link_.reset();
  if (rank_ != 0) return;
  const int T = static_cast<int>(cfg_.seq_len);
  const bool recompute = cfg_.recompute_every() == 1;
  plan::CpuCosts k = plan_costs_.back();
  auto median_of = [&](double plan::CpuCosts::*field) {
    std::vector<double> v;
    for (const plan::CpuCosts& c : plan_costs_) v.push_back(c.*field);
    k.*field = median(v);
  };
  for (auto field :
       {&plan::CpuCosts::block_s, &plan::CpuCosts::ends_s, &plan::CpuCosts::block_busy_s,
        &plan::CpuCosts::ends_busy_s, &plan::CpuCosts::adamw_params_per_s})
    median_of(field);
  if (link_gbps > 0) k.shm_gbps = link_gbps;
  plan::Layout l;
  l.dp = mesh_->dp(), l.tp = mesh_->tp(), l.pp = mesh_->pp(), l.zero = static_cast<int>(cfg_.zero);
  l.micro_batch = static_cast<int>(cfg_.micro_batch);
  l.microbatches = static_cast<int>(cfg_.grad_accum);
  l.virtual_stages = static_cast<int>(cfg_.pp_virtual_stages);
  l.schedule = cfg_.pp_schedule;
  l.recompute = recompute;
  l.sequence_parallel = cfg_.sequence_parallel && l.tp > 1;
  l.offload = cfg_.zero_offload != "disk" ? "none"
              : cfg_.zero_offload_master  ? "optimizer+master"
                                          : "optimizer";
  l.bf16 = cfg_.dtype == "bf16";
  plan::Cluster c;
  c.per_node = world_;
  c.device = plan::cpu_device(world_);
  const plan::ModelShape m = plan::model_shape(model_cfg_, T);
  const plan::Prediction p = plan::predict(m, c, l, static_cast<int>(cfg_.global_batch), &k);
  const std::vector<double> steps(step_s_.begin() + (step_s_.size() > 1 ? 1 : 0), step_s_.end());
  const double measured_s = steps.empty() ? 0 : median(steps);
  const double mib = 1 << 20;
  auto err = [](double predicted, double measured) {
    return measured > 0 ? (predicted - measured) / measured : 0.0;
  };
  nlohmann::json j = {{"layout", l.describe()},
                      {"predicted",
                       {{"state_mb", p.state_max / mib},
                        {"activation_mb", p.activations_max / mib},
                        {"step_ms", p.step_s() * 1e3},
                        {"terms_ms",
                         {{"compute", p.compute * 1e3},
                          {"bubble", p.bubble * 1e3},
                          {"tp_comm", p.tp_comm * 1e3},
                          {"pp_comm", p.pp_comm * 1e3},
                          {"dp_comm", p.dp_comm * 1e3},
                          {"optimizer", p.optimizer_s * 1e3}}},
                        {"measured_costs",
                         {{"block_ms", k.block_s * 1e3},
                          {"embedding_and_head_ms", k.ends_s * 1e3},
                          {"block_busy_ms", k.block_busy_s * 1e3},
                          {"embedding_and_head_busy_ms", k.ends_busy_s * 1e3},
                          {"link_gbps", k.shm_gbps}}}}},
                      {"measured",
                       {{"state_mb", state_peak_max_mb_},
                        {"activation_mb", act_peak_max_mb_},
                        {"step_ms", measured_s * 1e3},
                        {"steps", steps.size()}}},
                      {"error",
                       {{"state", err(p.state_max, state_peak_max_mb_ * mib)},
                        {"step", err(p.step_s(), measured_s)}}}};
  write_file_atomic(cfg_.run_dir + "/plan.json", j.dump(2) + "\n");
  std::printf(
      "loom: plan vs measured (%s): model state per rank %.2f MiB predicted, %.2f measured "
      "(%+.1f%%); step %.1f ms predicted, %.1f measured median (%+.1f%%); activations %.2f "
      "MiB predicted, %.2f measured\n",
      l.describe().c_str(), p.state_max / mib, state_peak_max_mb_,
      100 * err(p.state_max, state_peak_max_mb_ * mib), p.step_s() * 1e3, measured_s * 1e3,
      100 * err(p.step_s(), measured_s), p.activations_max / mib, act_peak_max_mb_);
}

int train(TrainConfig cfg, const TrainOptions& opt) {
  // Before the first thread (communicators, OpenMP, the loader) starts: core/signals.h.
  route_signals({SIGINT, SIGTERM, SIGUSR1});
  Trainer t(std::move(cfg), opt);
  return t.run();
}

}  // namespace loom::train
