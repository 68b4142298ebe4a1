// The training configuration (DESIGN decision 10): one TOML file, any key overridable on
// the command line with --set section.key=value, validated at load with messages that name
// the key, the value and what was expected. Unknown keys are errors (with the nearest known
// key as a hint), so a typo never silently trains with a default.
//
// Batch arithmetic: train.global_batch (sequences per optimizer step, over all
// data-parallel ranks) = train.micro_batch x train.grad_accum x data-parallel size (the
// ranks / (train.tp x train.pp)). Give either global_batch or grad_accum (or both,
// consistent); resolve_batch() derives the other, so the same file means the same
// optimisation on any number of ranks and any layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/optim/adamw.h"
#include "loom/optim/schedule.h"

namespace loom::train {

struct TrainConfig {
  // [model]
  std::string model_name = "tiny";
  bool model_name_set = false;  // model.name was given (in the file or by --set)
  // The named model's shape changed (0: kept): a model of its own, "custom <L>x<C>"
  // (model::GptConfig::reshaped); what `loom plan --out` writes for a custom shape.
  int64_t n_layer = 0, n_head = 0, n_embd = 0, vocab_size = 0, block_size = 0;
  bool reshaped() const { return n_layer || n_head || n_embd || vocab_size || block_size; }
  // [data]
  std::string data_path;
  // [train]
  int64_t steps = 100;
  int64_t micro_batch = 4;
  int64_t seq_len = 64;
  int64_t grad_accum = 0;    // 0: derived from global_batch
  int64_t global_batch = 0;  // 0: derived from grad_accum (default 1)
  int64_t seed = 1337;
  std::string dtype = "auto";  // auto | fp32 | bf16 (bf16 products, fp32 master weights and sums)
  int64_t threads = 0;         // OpenMP threads per rank; 0: the cores this rank may use
  // Kernel backend (kernels/backend.h): cpu (optimised) | reference (plain loops, slow; the
  // oracle the tests hold cpu to)
  std::string backend = "cpu";
  std::string recompute = "none";          // none | all | every_K
  int64_t zero = 0;                        // ZeRO stage 0-3 (docs/algorithms.md "ZeRO")
  int64_t tp = 1;                          // tensor-parallel size (docs/algorithms.md)
  int64_t pp = 1;                          // pipeline-parallel size (docs/algorithms.md)
  std::string placement = "cluster";       // cluster (= DPT) | spread (= TPD) | an order of D, P, T
  bool offload_activations = false;        // pipelines: spill waiting microbatches to disk
  bool profile = false;                    // the timeline: run.dir/trace.json
  double system_sample_s = 0.5;            // rank 0 samples the system into system.jsonl; 0: off
  int64_t activation_loading_horizon = 4;  // read them back this many actions ahead
  std::string offload_dir;                 // the spill files' folder; "": run.dir/spill
  // Start from these weights (step 0, fresh optimizer): a Hugging Face GPT-2 folder or
  // .safetensors file, or another run's loom checkpoint; the model's shape comes from it.
  std::string init_from;
  // A step whose loss or gradient norm is not finite (or, with spike_factor > 0, whose loss
  // is above spike_factor x the median of the last 100 steps' losses): stop (no checkpoint
  // after it, exit code 4) | skip (no update; max_skips in a row become stop) | rewind
  // (reload the last finite checkpoint, move the data past the window that diverged; at
  // most max_rewinds times, then stop). docs/algorithms.md "Numerics".
  std::string on_nonfinite = "stop";
  int64_t max_skips = 5;
  int64_t max_rewinds = 3;
  // How far a rewind moves the data from the checkpoint's position; 0: the samples read since
  // that checkpoint (through the failed step) and one global batch more.
  int64_t rewind_skip_samples = 0;
  double spike_factor = 0;  // 0: off
  // [tp]
  bool sequence_parallel = false;  // split LayerNorm/residual regions along the tokens
  // [pp]
  int64_t pp_microbatches = 0;         // microbatches per step (= train.grad_accum; 0: that)
  std::string pp_schedule = "1f1b";    // gpipe | 1f1b | interleaved | zb-h1
  int64_t pp_virtual_stages = 1;       // chunks per stage (interleaved)
  int64_t pp_active_microbatches = 0;  // most microbatches a stage holds; 0: the schedule's
  std::vector<int64_t> pp_split;       // units per virtual stage; empty: balanced by FLOPs
  bool pp_head_split = false;  // stage 0 runs the tied head for a share of each microbatch's rows
  // [zero]
  std::string shard_group = "world";    // world | node (shard inside a machine, replicate across)
  std::string comm_dtype = "fp32";      // fp32 | bf16: dtype of gradient reductions
  std::string shared_buffers = "auto";  // auto | off: model state in memory local ranks map
  std::string shared_gather = "auto";   // auto | off: ZeRO-3 gathers one copy per machine
  std::string zero_offload = "none";    // none | disk: Adam's moments in a file, streamed
  std::string zero_offload_dir;         // that file's folder; "": run.dir/offload
  // With zero.offload = disk and unsharded parameters: the streamed Adam step runs on a thread
  // beside the next step, whose first use of each unit waits for that unit's update.
  bool zero_overlap_step = true;
  // With zero.offload = disk, ZeRO 0 and train.dtype = bf16: the fp32 master weights stream
  // with the moments; memory keeps the bf16 copies the products read (and the fp32 norms,
  // biases and embeddings).
  bool zero_offload_master = false;
  // [optim]
  double lr = 6e-4;
  double min_lr_ratio = 0.1;  // cosine decays to lr x this at train.steps
  int64_t warmup_steps = 10;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;      // matrices and embeddings only
  double grad_clip = 1.0;         // global L2 norm; 0 disables
  std::string lr_scale = "none";  // none | linear (x data-parallel size, Horovod's convention)
  // [eval]
  int64_t eval_every = 0;  // steps; 0: never
  int64_t eval_batches = 4;
  std::string eval_task;  // a multiple-choice file (HellaSwag's layout), scored at each eval
  // [ckpt]
  int64_t ckpt_every = 0;  // steps; 0: only at the end
  int64_t ckpt_keep = 3;
  // [run]
  std::string run_dir = "runs/default";
  int64_t log_every = 1;
  // [metrics]
  double peak_gflops = 0;  // per rank, for MFU; 0: measured at start (docs/perf.md)

  // Reads `path` (empty: defaults only), then applies each "key=value" override.
  static TrainConfig load(const std::string& path, const std::vector<std::string>& overrides);
  // Derives grad_accum or global_batch for `dp_size` data-parallel ranks; UserError naming
  // the keys when they do not divide.
  void resolve_batch(int dp_size);
  // Blocks to recompute in backward: 0 none, 1 all, K every K-th.
  int recompute_every() const;
  // train.dtype resolved: auto = bf16 only where the CPU has bf16 products and they are at
  // least 10% faster than fp32's (GEMM peaks as measured, any unit: a margin, so that noise
  // does not flip the choice between runs); an explicit fp32 or bf16 is kept.
  static std::string resolve_dtype(const std::string& requested, double fp32_gflops,
                                   double bf16_gflops, bool native_bf16 = true);
  // The resolved configuration as TOML (written to the run directory).
  std::string to_toml() const;
  optim::AdamWParams adamw() const;
  optim::LrSchedule schedule(double peak_lr) const;
};

}  // namespace loom::train
