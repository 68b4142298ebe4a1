// The planner (`loom plan`, `loom train --plan`): for a model, a cluster and a global batch,
// the layouts (dp, tp, pp, ZeRO stage, micro-batch, schedule, recompute, offload) that fit
// in memory, with predicted per-rank memory and step time, best first.
//
// Memory (bytes per rank, the fullest rank): model state by ZeRO's formulas — on GPUs mixed
// precision's 16 bytes per parameter (2 weights, 2 gradients, 12 fp32 master + Adam), on
// loom's CPU path fp32's 16 (4 + 4 + 8) with the buffers loom's DataParallel really holds
// (per-unit padding to the data-parallel size, the unit whose full gradient waits for its
// reduce-scatter, ZeRO-3's gathered units); activations by Korthikanti et al.'s per-layer
// formulas (GPUs) or loom's fp32 ones (docs/perf.md), times the microbatches the schedule
// keeps in flight.
//
// Time (seconds per step): compute = per operation of the layer, FLOPs at an efficiency by
// size plus bytes over HBM at an efficiency by size, not overlapped (GPUs: Calculon's model
// and constants, planner.cc; CPU: the measured time of loom's own block, embedding and head
// at this shape, calibrate.h); tensor-parallel collectives and
// data-parallel gradient synchronisation by ring formulas over the link bandwidths (CPU:
// the tuning table's shared-memory cost model); the pipeline's step = the schedule's
// makespan with the slowest stage's costs (parallel/pipeline_schedule.h simulator); the
// optimizer = its bytes / memory bandwidth (GPU) or the measured AdamW rate (CPU).
// docs/architecture.md (the planner) lists every term and its validation.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace loom::plan {

// One device, as published (GPUs) or as measured (cpu).
struct Device {
  std::string name;
  double peak_tflops = 0;    // dense 16-bit (GPUs; the CPU has measured costs instead)
  double mem_gb = 0;         // per device (cpu: the machine's memory / ranks on it)
  double hbm_gbps = 0;       // memory bandwidth
  double intra_gbps = 0;     // per device and direction inside a machine (NVLink)
  double inter_gbps = 0;     // per device and direction between machines (InfiniBand)
  double vector_tflops = 0;  // the non-tensor (elementwise) 16-bit peak
  bool cpu = false;
};
// a100-40, a100-80, h100, h200 (published figures; docs/architecture.md); UserError
// otherwise. "cpu" is built by calibrate.h.
Device gpu_device(const std::string& name);

struct ModelShape {
  std::string name;
  int layers = 0, hidden = 0, heads = 0, vocab = 0 /* padded */, seq = 0, max_seq = 0;
  int vocab_size = 0;              // unpadded (0: the padded one)
  bool flash_attention = false;    // no s x s scores kept or moved (cuDNN/FlashAttention)
  bool dropout = true;             // Megatron's GPT: 0.1 after attention and each branch
  bool fused_elementwise = false;  // residual + LayerNorm and GeLU fused (llm.c)
  double params() const;           // the whole model's (tied head)
  // Megatron's model FLOPs of one step of `batch` sequences with full recompute when
  // `recompute`: 72 B s l h^2 (1 + s/6h + V/(12 l h)) x (4/3 with recompute), as in
  // Narayanan et al. (2021) eq. 3.
  double step_flops(double batch, bool recompute) const;
};

struct Cluster {
  int nodes = 1, per_node = 1;
  Device device;
  int world() const { return nodes * per_node; }
};

struct Layout {
  int dp = 1, tp = 1, pp = 1, zero = 0, micro_batch = 1, microbatches = 1, virtual_stages = 1;
  std::string schedule = "1f1b";  // pipelines: gpipe, 1f1b, interleaved, zb-h1
  bool recompute = false, sequence_parallel = false;
  // Selective recomputation (Korthikanti et al. 2022): only the attention core (Q K^T,
  // softmax, dropout, x V) runs again in the backward and only its s x s scores are not
  // kept. GPU predictions of published runs; loom's CPU path recomputes whole blocks, so
  // `loom plan` does not offer it. Ignored with `recompute`.
  bool recompute_attention = false;
  // none, optimizer (zero.offload = disk), optimizer+master (and zero.offload_master: with
  // bf16, the blocks' matrices and a head stage's embedding copy keep only bf16 copies)
  std::string offload = "none";
  // CPU: train.dtype = bf16, whose products read a bf16 copy of each block's weights and of
  // the embedding where the head runs (2 bytes each, beside the fp32 weights; not ZeRO-3)
  bool bf16 = false;
  bool selective_recompute() const { return recompute_attention && !recompute; }
  std::string describe() const;
};

// The CPU's measured costs at one shape (calibrate.h); unused on GPUs.
struct CpuCosts {
  double block_s = 0;  // one block's forward + backward, one microbatch, this tp split
  double ends_s = 0;   // embedding + final norm + head (forward + backward)
  // The same with every rank of the machine computing at once (ranks share the cores'
  // caches and memory bandwidth): what data and tensor parallelism see; a pipeline stage
  // sees between the two, by how busy the other stages are.
  double block_busy_s = 0, ends_busy_s = 0;
  double adamw_params_per_s = 0;
  double shm_alpha_us = 0, shm_gbps = 0;  // the tuning table's shared-memory link
};

struct Prediction {
  Layout layout;
  // bytes per rank (the fullest)
  double params = 0, grads = 0, optimizer = 0, buffers = 0, activations = 0;
  double state() const { return params + grads + optimizer + buffers; }
  // The largest model state and the largest activations of any stage: state() and
  // activations are the fullest stage's (the most memory of the two together), which in a
  // pipeline can hold less state than the stage with the tied head (its embedding copy) and
  // fewer activations than the first stage - what `--plan` compares with the ranks' largest
  // high-water marks.
  double state_max = 0, activations_max = 0;
  double memory() const { return state() + activations; }
  // seconds per step, by term (`loom plan --explain`): the forward and backward passes; the
  // recomputed forward (GPUs; on the CPU it is measured inside `compute`); the pipeline's
  // idle time; communication that nothing hides, by dimension: tensor-parallel
  // collectives, pipeline sends, data-parallel gradient reduction (allreduce, or ZeRO's
  // reduce-scatter), ZeRO's parameter gathers; the optimizer step.
  double compute = 0, recompute = 0, bubble = 0, tp_comm = 0, pp_comm = 0, dp_comm = 0,
         zero_comm = 0, optimizer_s = 0;
  double step_s() const {
    return compute + recompute + bubble + tp_comm + pp_comm + dp_comm + zero_comm + optimizer_s;
  }
  double tflops_per_device = 0;  // Megatron's model FLOPs (recompute counted) / step / devices
  bool fits = true;
};

// One layout's prediction; `cpu` is read when the cluster's device is the CPU. UserError
// naming the numbers when the layout cannot run (sizes that do not divide, tp beyond a
// machine, ...).
Prediction predict(const ModelShape& m, const Cluster& c, const Layout& l, int global_batch,
                   const CpuCosts* cpu = nullptr);

// Layout p's step and memory by term, one per line, each with its share and a total line
// that is their sum (`loom plan --explain N`).
std::string explain(const Prediction& p);

// Layouts of the cluster for the batch, those that fit first, fastest first. `costs`
// returns the CPU costs for a (micro-batch, tp, recompute) (ignored on GPUs).
template <typename CostFn>
std::vector<Prediction> enumerate(const ModelShape& m, const Cluster& c, int global_batch,
                                  CostFn costs);
std::vector<Layout> candidate_layouts(const ModelShape& m, const Cluster& c, int global_batch);

// Units' parameter counts under a t-way tensor split (embedding, blocks, final norm):
// loom's model layout (model/gpt.h), checked against the model by tests/unit/plan_test.cc.
std::vector<double> unit_params(const ModelShape& m, int t);

// The layout as a config to start from ([model], [train], [pp], [zero] keys); a custom shape
// ("custom LxH") by its [model] n_layer, n_head, n_embd, vocab_size and block_size.
std::string layout_toml(const ModelShape& m, const Layout& l, int global_batch);

template <typename CostFn>
std::vector<Prediction> enumerate(const ModelShape& m, const Cluster& c, int global_batch,
                                  CostFn costs) {
  std::vector<Prediction> out;
  for (const Layout& l : candidate_layouts(m, c, global_batch)) {
    CpuCosts k;
    if (c.device.cpu) k = costs(l);
    out.push_back(predict(m, c, l, global_batch, c.device.cpu ? &k : nullptr));
  }
  std::stable_sort(out.begin(), out.end(), [](const Prediction& a, const Prediction& b) {
    if (a.fits != b.fits) return a.fits;
    return a.step_s() < b.step_s();
  });
  return out;
}

}  // namespace loom::plan
