#include "loom/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "loom/core/error.h"
#include "loom/parallel/pipeline_schedule.h"
#include "loom/parallel/pipeline_stages.h"

namespace loom::plan {
namespace {

// A ring collective's time: `passes` x (n-1)/n of `bytes` over `gbps`, plus its steps'
// latency (alpha_us per step, one step per peer and pass).
double ring_s(double bytes, int n, double passes, double gbps, double alpha_us = 0) {
  if (n <= 1) return 0;
  return passes * (n - 1.0) / n * bytes / (gbps * 1e9) + passes * (n - 1) * alpha_us * 1e-6;
}

// GPU operations, as Calculon models them (Isaev et al., "Calculon: a Methodology and Tool
// for High-Level Co-Design of Systems and Large Language Models", SC '23; the constants are
// its systems/a100_80g.json and h100_80g_nvl8.json): an operation's FLOPs at the matrix
// unit's (products) or the vector unit's (everything else) peak times an efficiency that
// grows with the operation's size, plus the bytes it moves at the HBM bandwidth times an
// efficiency that grows with the transfer — the two not overlapped ("no_overlap").
struct Step {
  double at_least, efficiency;
};
constexpr Step kMatrixEfficiency[] = {{128e9, 0.95}, {16e9, 0.9}, {1e9, 0.6}, {0, 0.1}};  // FLOPs
constexpr Step kVectorEfficiency[] = {{16e9, 0.95}, {1e9, 0.5}, {0, 0.1}};                // FLOPs
constexpr Step kHbmEfficiency[] = {{100e6, 0.9}, {10e6, 0.75}, {1e6, 0.6}, {0, 0.3}};     // bytes
// The share of a link's bandwidth that collectives reach (the same files).
constexpr double kNvlinkEfficiency = 0.6, kInfinibandEfficiency = 0.9;
constexpr double kNvlinkLatencyUs = 1, kInfinibandLatencyUs = 2;

template <size_t N>
double efficiency(const Step (&table)[N], double size) {
  for (const Step& st : table)
    if (size >= st.at_least) return st.efficiency;
  return table[N - 1].efficiency;
}

struct GpuOp {
  double flops, bytes;
  bool matrix;
};

double op_s(const Device& d, const GpuOp& op) {
  const double peak = (op.matrix ? d.peak_tflops : d.vector_tflops) * 1e12;
  const double eff =
      op.matrix ? efficiency(kMatrixEfficiency, op.flops) : efficiency(kVectorEfficiency, op.flops);
  const double f = op.flops > 0 ? op.flops / (peak * eff) : 0;
  const double m =
      op.bytes > 0 ? op.bytes / (d.hbm_gbps * 1e9 * efficiency(kHbmEfficiency, op.bytes)) : 0;
  return f + m;
}

// The attention core of one layer's forward on one tensor-parallel rank: Q K^T, softmax,
// dropout and the product with V — or one fused kernel with flash attention. Selective
// recomputation (Korthikanti et al.) runs these again in the backward.
std::vector<GpuOp> attention_ops(double b, double s, double h, double a, int t,
                                 const ModelShape& m) {
  const double e = 2, N = b * s, hs = h / t, scores = b * (a / t) * s * s;
  if (m.flash_attention) return {{4 * b * s * s * hs, e * 4 * N * hs, true}};
  std::vector<GpuOp> ops = {{2 * b * s * s * hs, e * (2 * N * hs + scores), true},  // Q K^T
                            {5 * scores, e * 2 * scores, false}};                   // softmax
  if (m.dropout) ops.push_back({2 * scores, (2 * e + 1) * scores, false});          // dropout
  ops.push_back({2 * b * s * s * hs, e * (scores + 2 * N * hs), true});             // x V
  return ops;
}

// One transformer layer's forward operations on one tensor-parallel rank, 16-bit values
// (Megatron-LM's layer: LayerNorm, QKV, attention, projection, dropout + residual,
// LayerNorm, MLP with GeLU, dropout + residual); with sequence parallelism the norms,
// dropouts and residuals see 1/t of the tokens. FLOPs of elementwise work per element:
// LayerNorm 7, softmax 5, GeLU 8, dropout 2, residual 1 (they are memory-bound anyway).
// Without dropout (GPT-2 reproductions such as llm.c) those passes and the mask's bytes
// go; with fused elementwise kernels (llm.c: the residual add inside the next LayerNorm's
// kernel, GeLU in the MLP product's cuBLASLt epilogue) the LayerNorm does not read its
// input back (the fused kernel writes the sum and the normalised values: 4 passes instead
// of 5) and GeLU writes its output beside the product's instead of reading it back.
std::vector<GpuOp> layer_ops(double b, double s, double h, double a, int t, bool sp,
                             const ModelShape& m) {
  const double e = 2, N = b * s, hs = h / t, rows = sp ? N / t : N;
  const double drop = m.dropout ? 1 : 0;  // the dropout pass and its 1-byte mask
  const double norm_bytes = e * (m.fused_elementwise ? 1 : 2) * rows * h;
  const double residual = (2 * drop + 1) * rows * h, residual_bytes = (3 * e + drop) * rows * h;
  std::vector<GpuOp> ops = {
      {7 * rows * h, norm_bytes, false},                                   // LayerNorm 1
      {2 * N * h * 3 * hs, e * (N * h + h * 3 * hs + N * 3 * hs), true}};  // QKV
  const std::vector<GpuOp> core = attention_ops(b, s, h, a, t, m);
  ops.insert(ops.end(), core.begin(), core.end());
  const std::vector<GpuOp> rest = {
      {2 * N * hs * h, e * (N * hs + hs * h + N * h), true},              // projection
      {residual, residual_bytes, false},                                  // dropout + residual
      {7 * rows * h, norm_bytes, false},                                  // LayerNorm 2
      {2 * N * h * 4 * hs, e * (N * h + 4 * h * hs + 4 * N * hs), true},  // MLP up
      {8 * 4 * N * hs, e * (m.fused_elementwise ? 1 : 2) * 4 * N * hs, false},  // GeLU
      {2 * N * 4 * hs * h, e * (4 * N * hs + 4 * hs * h + N * h), true},        // MLP down
      {residual, residual_bytes, false}};  // dropout + residual
  ops.insert(ops.end(), rest.begin(), rest.end());
  return ops;
}

// The embedding, final LayerNorm, the head's logits and the vocabulary-parallel loss (in
// fp32), forward, on one tensor-parallel rank.
std::vector<GpuOp> ends_ops(double b, double s, double h, double V, int t, bool sp) {
  const double e = 2, N = b * s, rows = sp ? N / t : N, Vt = V / t;
  return {{0, e * 2 * N * h, false},                              // embedding rows + positions
          {7 * rows * h, e * 2 * rows * h, false},                // final LayerNorm
          {2 * N * h * Vt, e * (N * h + h * Vt + N * Vt), true},  // logits
          {5 * N * Vt, (e + 4) * N * Vt, false}};                 // softmax cross-entropy
}

// The forward time of `ops`. The caller makes forward + backward 3 of it (each operation's
// backward twice its forward: two products per product, gradient and saved input read per
// elementwise op), and a recomputed forward one more.
double forward_s(const Device& d, const std::vector<GpuOp>& ops) {
  double sum = 0;
  for (const GpuOp& op : ops) sum += op_s(d, op);
  return sum;
}

}  // namespace

Device gpu_device(const std::string& name) {
  // Published figures: dense bf16 peak, memory, HBM bandwidth, NVLink per direction (half
  // the bidirectional figure), one InfiniBand HCA per GPU (HDR 200 Gb/s on DGX A100, NDR
  // 400 Gb/s on DGX H100/H200), the vector (non-tensor) fp16 peak: A100 78 TFLOP/s from its
  // datasheet, H100/H200 120 as Calculon's h100_80g_nvl8.json models it. How much of each
  // the software reaches: the efficiency tables above (docs/architecture.md, the planner).
  if (name == "a100-40") return {"a100-40", 312, 40, 1555, 300, 25, 78, false};
  if (name == "a100-80" || name == "a100") return {"a100-80", 312, 80, 2039, 300, 25, 78, false};
  if (name == "h100") return {"h100", 989, 80, 3350, 450, 50, 120, false};
  if (name == "h200") return {"h200", 989, 141, 4800, 450, 50, 120, false};
  throw UserError("device '" + name + "' is not in the planner's table",
                  "use cpu (measured here), a100-40, a100-80, h100 or h200");
}

double ModelShape::params() const {
  double p = 0;
  for (double u : unit_params(*this, 1)) p += u;
  return p;
}

double ModelShape::step_flops(double batch, bool recompute) const {
  const double s = seq, l = layers, h = hidden, V = vocab;
  const double blocks = 72 * batch * s * l * h * h * (1 + s / (6 * h)) * (recompute ? 4.0 / 3 : 1);
  return blocks + 6 * batch * s * h * V;
}

std::string Layout::describe() const {
  std::ostringstream o;
  o << "dp " << dp << " tp " << tp << " pp " << pp << " zero " << zero << " mb " << micro_batch
    << "x" << microbatches;
  if (pp > 1)
    o << " " << schedule << (virtual_stages > 1 ? "/v" + std::to_string(virtual_stages) : "");
  if (recompute) o << " recompute";
  if (selective_recompute()) o << " recompute-attention";
  if (sequence_parallel) o << " sp";
  if (offload != "none") o << " offload " << offload;
  return o.str();
}

std::vector<double> unit_params(const ModelShape& m, int t) {
  const double C = m.hidden;
  std::vector<double> u = {m.vocab / t * C + m.max_seq * C};
  for (int l = 0; l < m.layers; ++l) u.push_back(12 * C * C / t + 7 * C / t + 6 * C);
  u.push_back(2 * C);
  return u;
}

Prediction predict(const ModelShape& m, const Cluster& c, const Layout& l, int global_batch,
                   const CpuCosts* cpu) {
  const Device& d = c.device;
  const int t = l.tp, P = l.pp, S = l.dp, V = l.virtual_stages, M = l.microbatches;
  const double b = l.micro_batch, s = m.seq, h = m.hidden, a = m.heads;
  if (S * t * P != c.world())
    throw UserError("layout " + l.describe() + " needs " + std::to_string(S * t * P) +
                        " ranks, the cluster has " + std::to_string(c.world()),
                    "make dp x tp x pp equal nodes x devices per node");
  if (static_cast<long>(S) * l.micro_batch * M != global_batch)
    throw UserError("dp " + std::to_string(S) + " x micro-batch " + std::to_string(l.micro_batch) +
                        " x " + std::to_string(M) + " microbatches is not the global batch " +
                        std::to_string(global_batch),
                    "pick a micro-batch that divides global_batch / dp");
  if (t > c.per_node || m.heads % t || m.vocab % t)
    throw UserError("tp " + std::to_string(t) + " does not split " + m.name + " inside a machine",
                    "tp must divide the heads (" + std::to_string(m.heads) +
                        ") and the padded vocabulary and be at most the devices per node");
  if (P * V > m.layers + 2)
    throw UserError("pp " + std::to_string(P) + " x " + std::to_string(V) + " chunks exceeds " +
                        std::to_string(m.layers + 2) + " units",
                    "use fewer stages");
  if (!d.cpu && cpu) cpu = nullptr;
  if (d.cpu && !cpu)
    throw UserError("a CPU prediction needs measured costs", "use loom plan --device cpu");
  Prediction p;
  p.layout = l;

  // Stages: loom's cut by FLOPs (parallel/pipeline_stages.h); the last stage also holds the
  // tied embedding (its head reads wte).
  const std::vector<double> units = unit_params(m, t);
  const int nu = static_cast<int>(units.size());
  std::vector<parallel::UnitRange> pieces = {{0, nu - 1}};
  if (P > 1)
    pieces = parallel::balance_stages(parallel::gpt_unit_costs(m.layers, m.hidden, m.vocab, m.seq),
                                      P, V);
  const auto kind = parallel::schedule_kind(P > 1 ? l.schedule : "1f1b");
  parallel::ScheduleTiming timing;  // with the stages' costs (below)

  // Per-layer activations of one microbatch (bytes) and what a recomputed layer keeps.
  double layer_act, layer_kept, head_act;
  if (d.cpu) {  // loom's fp32 buffers (docs/perf.md: activations)
    layer_act = 4 * (l.sequence_parallel && t > 1
                         ? (16 * s * b * h + 4 * s * b + a * s * s * b) / t
                         : s * b * h * (4 + 12.0 / t) + 4 * s * b + a * s * s * b / t);
    layer_kept = 4 * s * b * h / (l.sequence_parallel ? t : 1);
    head_act = 4 * b * s * m.vocab / t + 4 * 3 * b * s * h;
  } else {  // Korthikanti et al., 16-bit
    // the s x s scores, softmax and dropout mask: not kept with flash attention or when
    // selective recomputation runs the attention core again
    const double scores = m.flash_attention || l.selective_recompute() ? 0 : 5 * a * s / h;
    layer_act = l.sequence_parallel ? s * b * h / t * (34 + scores)
                                    : s * b * h * (10 + 24.0 / t + scores / t);
    if (t == 1) layer_act = s * b * h * (34 + scores);
    layer_kept = 2 * s * b * h / (l.sequence_parallel ? t : 1);
    head_act = 4 * b * s * m.vocab / t;
  }

  // Per stage: parameters held, layers, head; the fullest stage sets memory, the slowest
  // the pipeline's pace.
  double worst_mem = -1;
  std::vector<double> stage_params(P, 0.0);
  std::vector<int> stage_layers(P, 0);
  std::vector<bool> stage_head(P, false), stage_embed(P, false);
  // The same per virtual stage (piece k runs on stage k % P), for its compute.
  const int VS = static_cast<int>(pieces.size());
  std::vector<int> piece_layers(VS, 0);
  std::vector<bool> piece_head(VS, false);
  double biggest_unit = 0;
  for (int k = 0; k < VS; ++k) {
    const int st = k % P;
    for (int u = pieces[k].first; u <= pieces[k].last; ++u) {
      stage_params[st] += units[u];
      biggest_unit = std::max(biggest_unit, units[u]);
      if (u >= 1 && u <= m.layers) ++stage_layers[st], ++piece_layers[k];
      if (u == nu - 1) stage_head[st] = piece_head[k] = true;
      if (u == 0) stage_embed[st] = true;
    }
  }
  for (int st = 0; st < P; ++st)
    if (stage_head[st] && !stage_embed[st]) stage_params[st] += units[0];

  // Compute of one microbatch through a run of units: GPUs by FLOPs and bytes; the CPU by
  // the measured block and embedding + head, between their alone and all-ranks-busy costs
  // by `share` (how busy the other ranks are meanwhile).
  auto mix = [](double alone, double busy, double share) { return alone + (busy - alone) * share; };
  // A layer's forward (GPUs: its operations, above); its forward + backward is 3 of them
  // (B = 2F), and a recomputed layer runs the forward once more (`recompute_layer_s`; the
  // CPU's measured block has it).
  const double layer_fwd_s =
      d.cpu ? 0.0 : forward_s(d, layer_ops(b, s, h, a, t, l.sequence_parallel && t > 1, m));
  const double ends_fwd_s =
      d.cpu ? 0.0 : forward_s(d, ends_ops(b, s, h, m.vocab, t, l.sequence_parallel && t > 1));
  auto layer_s = [&](double share) {
    if (d.cpu) return mix(cpu->block_s, cpu->block_busy_s, share);
    return 3 * layer_fwd_s;
  };
  double recompute_layer_s = 0;
  if (!d.cpu && l.recompute) recompute_layer_s = layer_fwd_s;
  if (!d.cpu && l.selective_recompute())
    recompute_layer_s = forward_s(d, attention_ops(b, s, h, a, t, m));
  auto head_s = [&](double share) {
    if (d.cpu) return mix(cpu->ends_s, cpu->ends_busy_s, share);
    return 3 * ends_fwd_s;
  };
  // Links as collectives reach them (GPUs: the share above, and a latency per ring step).
  const double nvlink = d.intra_gbps * kNvlinkEfficiency, ib = d.inter_gbps * kInfinibandEfficiency;
  // Tensor-parallel collectives per layer and microbatch: 2 allreduces of (b,s,h) forward,
  // 2 backward, 2 more in a recomputed forward (with sequence parallelism the allgathers
  // and reduce-scatters move the same bytes); the embedding's and head's, and the
  // vocab-parallel loss's 3 allreduces of (b,s) floats.
  const double value_bytes = d.cpu ? 4 : 2;
  const double act_msg = b * s * h * value_bytes;
  const double tp_layer =
      (l.recompute ? 6 : 4) * (d.cpu ? ring_s(act_msg, t, 2, cpu->shm_gbps, cpu->shm_alpha_us)
                                     : ring_s(act_msg, t, 2, nvlink, kNvlinkLatencyUs));
  const double tp_ends = d.cpu ? 2 * ring_s(act_msg, t, 2, cpu->shm_gbps, cpu->shm_alpha_us) +
                                     3 * ring_s(4 * b * s, t, 2, cpu->shm_gbps, cpu->shm_alpha_us)
                               : 2 * ring_s(act_msg, t, 2, nvlink, kNvlinkLatencyUs) +
                                     3 * ring_s(4 * b * s, t, 2, nvlink, kNvlinkLatencyUs);
  // Per virtual stage: its compute and communication.
  std::vector<double> share(P, 1.0);  // a lone stage: every rank busy (dp, tp)
  std::vector<double> comp(P), comm(P), recomp(P);
  auto stage_times = [&]() {
    std::fill(comp.begin(), comp.end(), 0.0), std::fill(comm.begin(), comm.end(), 0.0);
    std::fill(recomp.begin(), recomp.end(), 0.0);
    std::vector<double> fwd(VS);
    for (int k = 0; k < VS; ++k) {
      const int st = k % P;
      const double c =
          piece_layers[k] * layer_s(share[st]) + (piece_head[k] ? head_s(share[st]) : 0);
      const double r = piece_layers[k] * recompute_layer_s;
      const double x = piece_layers[k] * tp_layer + (piece_head[k] ? tp_ends : 0);
      comp[st] += c, recomp[st] += r, comm[st] += x;
      fwd[k] = (c + r + x) / 3;  // F : BW = 1 : 2 (a recomputed forward runs with the BW)
    }
    return fwd;
  };
  std::vector<double> fwd = stage_times();
  auto slowest = [&]() {
    int w = 0;
    for (int st = 1; st < P; ++st)
      if (comp[st] + recomp[st] + comm[st] > comp[w] + recomp[w] + comm[w]) w = st;
    return w;
  };
  if (P > 1) {
    // Run the schedule with these costs; then each stage's cost from how busy the others
    // were (on the CPU), and run it again.
    const auto actions = parallel::make_schedule(kind, P, M, V);
    timing = parallel::simulate_schedule(actions, P, V, fwd);
    if (d.cpu) {
      for (int st = 0; st < P; ++st) {
        double others = 0;
        for (int q = 0; q < P; ++q)
          if (q != st) others += timing.busy[q] / timing.makespan;
        share[st] = others / (P - 1);
      }
      fwd = stage_times();
      timing = parallel::simulate_schedule(actions, P, V, fwd);
    }
    const int w = slowest();
    p.compute = M * comp[w];
    p.recompute = M * recomp[w];
    p.tp_comm = M * comm[w];
    p.bubble = std::max(0.0, timing.makespan - M * (comp[w] + recomp[w] + comm[w]));
    const bool cross = t * P > c.per_node;  // stages on other machines (tp fastest, then pp)
    const double link = d.cpu ? cpu->shm_gbps : (cross ? ib : nvlink);
    const double lat_us =
        d.cpu ? cpu->shm_alpha_us : (cross ? kInfinibandLatencyUs : kNvlinkLatencyUs);
    const double msg = act_msg / (l.sequence_parallel ? t : 1);
    p.pp_comm = M * 2 * (msg / (link * 1e9) + lat_us * 1e-6) * V;
  } else {
    p.compute = M * comp[0];
    p.recompute = M * recomp[0];
    p.tp_comm = M * comm[0];
  }

  // Memory and data-parallel traffic of the fullest stage.
  for (int st = 0; st < P; ++st) {
    const double psi = stage_params[st];
    const double shard = l.zero > 0 && S > 1 ? psi / S : psi;
    double params, grads, opt, buffers = 0;
    if (d.cpu) {  // fp32: 4 weights, 4 gradients, 8 Adam moments
      params = 4 * (l.zero == 3 ? shard : psi);
      grads = 4 * (l.zero >= 2 && P == 1 ? shard : psi);
      opt = l.offload != "none" ? 0 : 8 * (l.zero >= 1 ? shard : psi);
      if (l.bf16 && l.zero < 3) {  // the copies the products read (model/gpt.h)
        const double matrices = stage_layers[st] * 12 * m.hidden * m.hidden / t;
        const double copied = stage_layers[st] * units[1] + (stage_head[st] ? units[0] : 0);
        params += 2 * copied;
        if (l.offload == "optimizer+master") {  // their fp32 values live in the file, and
          // the embedding's where only the head reads it, or wte's where the lookup reads its
          // rows from the file (without tensor parallelism: DpOptions::lookup_from_master)
          double gone = matrices;
          if (stage_head[st] && !stage_embed[st])
            gone += units[0];
          else if (stage_embed[st] && t == 1)
            gone += m.vocab * m.hidden;
          params -= 4 * gone;
        }
      }
      // ZeRO 2 and 3 without a pipeline: full gradients in backward (docs/algorithms.md): the
      // embedding's from the tied head (the first use) to the lookup (the last), and a
      // block's from its use until its reduce-scatter lands - the block being computed and
      // up to 2 in reduction, the most at once (fewer when reductions land early; never more
      // blocks than the model has).
      const int blocks_in_flight = std::min(3, m.layers);
      const double grads_in_flight =
          m.layers > 0 ? units[0] + blocks_in_flight * units[1] : biggest_unit;
      if (l.zero == 2 && S > 1 && P == 1) buffers += 4 * grads_in_flight;
      if (l.zero == 3 && S > 1) {  // the gradients, and the gathered parameters, which the
        // shared gather (zero.shared_gather = auto) holds once per machine: 1/k on each of the
        // k data-parallel ranks a machine holds (tensor, then pipeline ranks fill it first).
        // Without a pipeline the gathers are prefetched and their buffers pooled: at the
        // embedding's use (forward's end, the tied head) the last block in use, the one before
        // it in the pool and the embedding prefetched - it and 2 blocks' buffers.
        const int k = std::clamp(c.per_node / std::max(1, t * P), 1, S);
        const double gathered =
            P == 1 && m.layers > 0 ? units[0] + std::min(2, m.layers) * units[1] : biggest_unit;
        buffers += 4 * (P == 1 ? grads_in_flight : biggest_unit) + 4 * gathered / k;
      }
    } else {  // mixed precision: 2 + 2 + 12
      params = 2 * (l.zero == 3 ? shard : psi);
      grads = 2 * (l.zero >= 2 ? shard : psi);
      opt = 12 * (l.zero >= 1 ? shard : psi);
      if (l.zero == 3 && S > 1) buffers += 2 * 2 * biggest_unit;
    }
    double in_flight = 1;
    if (P > 1) in_flight = timing.peak_in_flight[st] / static_cast<double>(V);
    const double per_layer = l.recompute ? layer_kept : layer_act;
    double acts = in_flight * stage_layers[st] * per_layer;
    if (l.recompute) acts += layer_act;  // the recomputed layer's working buffers
    if (stage_head[st]) acts += head_act;
    const double mem = params + grads + opt + buffers + acts;
    p.state_max = std::max(p.state_max, params + grads + opt + buffers);
    p.activations_max = std::max(p.activations_max, acts);
    if (mem > worst_mem) {
      worst_mem = mem;
      p.params = params, p.grads = grads, p.optimizer = opt, p.buffers = buffers,
      p.activations = acts;
    }
  }
  // Data-parallel synchronisation of the largest stage's gradients (not overlapped with
  // the backward: loom and Megatron-LM of 2021 reduce after it); ZeRO-1/2 then gather the
  // updated parameters. ZeRO-3 gathers a unit at each use, in every microbatch's forward and
  // backward — the tied embedding twice each on a stage that also runs the head — and
  // reduce-scatters its gradient.
  // A stage's units: its blocks and, if it has the embedding or the head, their one unit.
  auto units_of = [&](int st) { return stage_layers[st] + (stage_embed[st] || stage_head[st]); };
  const auto biggest = std::max_element(stage_params.begin(), stage_params.end());
  const double psi_max = *biggest;
  const int dp_units = units_of(static_cast<int>(biggest - stage_params.begin()));
  double z3_params = 0;  // parameters moved per microbatch, the busiest stage
  int z3_units = 1;      // and the units it gathers them in
  for (int st = 0; st < P; ++st) {
    double moved = 3 * stage_params[st];
    if (stage_head[st] && stage_embed[st]) moved += 2 * units[0];
    if (moved > z3_params) z3_params = moved, z3_units = units_of(st);
  }
  const double gbytes = psi_max * value_bytes;
  const bool cross = c.nodes > 1;
  // Across machines the group's k ranks on a machine (dp is the outermost dimension: a
  // machine holds per_node / (t p) of them) each reach the network through their own HCA
  // (DGX A100/H100: one per GPU), and NCCL builds one ring per NIC, each carrying 1/k of the
  // data: k x a NIC's bandwidth, up to NVLink's, which every ring also crosses.
  const int rails = std::clamp(c.per_node / std::max(1, t * P), 1, S);
  const double link = d.cpu ? cpu->shm_gbps : (cross ? std::min(rails * ib, nvlink) : nvlink);
  const double alpha =
      d.cpu ? cpu->shm_alpha_us : (cross ? kInfinibandLatencyUs : kNvlinkLatencyUs);
  // Each term's passes over the data-parallel group, in bytes: the gradients' reduction
  // (dp_comm) and ZeRO's parameter gathers (zero_comm); their time is the ring's, split
  // between the two by bytes.
  if (S > 1) {
    double reduce = 0, gather = 0;  // bytes moved once around the ring
    switch (l.zero) {
      case 0:
        reduce = 2 * gbytes;  // allreduce
        break;
      case 1:
        reduce = 2 * gbytes, gather = gbytes;  // allreduce, then the updated shards gathered
        break;
      case 2:
        reduce = gbytes, gather = gbytes;  // reduce-scatter, then the updated shards gathered
        break;
      default:  // per microbatch: gathers in the forward and backward, the reduce-scatter
        reduce = M * psi_max * value_bytes;
        gather = M * (z3_params - psi_max) * value_bytes;
        break;
    }
    const double total = l.zero == 3 ? M * ring_s(z3_params * value_bytes, S, 1, link, alpha)
                                     : ring_s(gbytes, S, (reduce + gather) / gbytes, link, alpha);
    p.dp_comm = total * reduce / (reduce + gather);
    p.zero_comm = total - p.dp_comm;
    // ZeRO-3 prefetches (loom since issue 36 item 2, as FSDP and DeepSpeed do): a unit's
    // gather is in flight while the unit before it computes, so what stays on the step's
    // path is each pass's first gather, or what the gathers take beyond the compute.
    if (l.zero == 3) p.zero_comm = std::max(p.zero_comm / z3_units, p.zero_comm - p.compute);
    // On CPUs the prediction is loom's, which reduces each unit's gradients as soon as they
    // are final (in the last microbatch's backward; ZeRO-3: in every microbatch's) while the
    // units below it run their backward: what stays on the path is the last unit's share, or
    // what the reductions take beyond that backward (2/3 of the compute). The GPU terms are
    // the published systems', which reduce after the backward (Megatron-LM 2021).
    if (d.cpu) {
      const double backward = 2.0 / 3.0 * p.compute / (l.zero == 3 ? 1 : M);
      p.dp_comm = std::max(p.dp_comm / dp_units, p.dp_comm - backward);
    }
  }
  const double opt_params = l.zero >= 1 && S > 1 ? psi_max / S : psi_max;
  p.optimizer_s = d.cpu ? opt_params / cpu->adamw_params_per_s
                        : opt_params * 34 /  // fp32 p, m, v, g in; p, m, v, bf16 p out
                              (d.hbm_gbps * 1e9 * efficiency(kHbmEfficiency, opt_params * 34));
  p.tflops_per_device = m.step_flops(global_batch, l.recompute) / p.step_s() / c.world() / 1e12;
  p.fits = p.memory() <= d.mem_gb * 1e9 * (d.cpu ? 1.0 : 0.9);
  return p;
}

std::string explain(const Prediction& p) {
  std::ostringstream o;
  char line[160];
  const double step = p.step_s(), mem = p.memory();
  auto row = [&](const char* name, double v, double total, const char* unit, double scale,
                 const char* what) {
    std::snprintf(line, sizeof line, "  %-22s %10.4f %s %5.1f%%  %s\n", name, v * scale, unit,
                  total > 0 ? 100 * v / total : 0.0, what);
    o << line;
  };
  o << "step, " << p.layout.describe() << ":\n";
  row("compute", p.compute, step, "s ", 1, "forward + backward of the slowest stage's layers");
  row("recompute", p.recompute, step, "s ", 1,
      "the forward again before the backward (CPU: measured inside compute)");
  row("pipeline bubble", p.bubble, step, "s ", 1, "idle while the schedule fills and drains");
  row("tensor parallel", p.tp_comm, step, "s ", 1, "activation allreduces inside the layers");
  row("pipeline sends", p.pp_comm, step, "s ", 1, "activations and their gradients between stages");
  row("data parallel", p.dp_comm, step, "s ", 1,
      "gradient reduction after the backward (allreduce or reduce-scatter)");
  row("ZeRO gathers", p.zero_comm, step, "s ", 1,
      "parameters gathered (ZeRO-1/2 after the step, "
      "ZeRO-3 at each use)");
  row("optimizer", p.optimizer_s, step, "s ", 1, "AdamW over this rank's share");
  row("total", step, step, "s ", 1, "the sum of the above");
  o << "memory per rank (the fullest stage):\n";
  row("parameters", p.params, mem, "GB", 1e-9, "");
  row("gradients", p.grads, mem, "GB", 1e-9, "");
  row("optimizer state", p.optimizer, mem, "GB", 1e-9, "");
  row("buffers", p.buffers, mem, "GB", 1e-9, "a unit's full gradient or gathered parameters");
  row("activations", p.activations, mem, "GB", 1e-9, "the microbatches in flight");
  row("total", mem, mem, "GB", 1e-9, p.fits ? "fits" : "does not fit");
  return o.str();
}

std::vector<Layout> candidate_layouts(const ModelShape& m, const Cluster& c, int global_batch) {
  std::vector<Layout> out;
  const int W = c.world();
  for (int t = 1; t <= c.per_node; ++t) {
    if (W % t || c.per_node % t || m.heads % t || m.vocab % t) continue;
    for (int P = 1; P <= W / t && P <= m.layers; ++P) {
      if ((W / t) % P) continue;
      const int S = W / (t * P);
      if (global_batch % S) continue;
      for (int mb = 1; mb <= global_batch / S; mb *= 2) {
        if ((global_batch / S) % mb) continue;
        const int M = global_batch / S / mb;
        if (P > 1 && M < P) continue;
        std::vector<std::pair<std::string, int>> schedules = {{"1f1b", 1}};
        if (P > 1) {
          schedules = {{"1f1b", 1}, {"gpipe", 1}, {"zb-h1", 1}};
          if (m.layers + 2 >= 2 * P) schedules.push_back({"interleaved", 2});
        }
        for (const auto& [sched, v] : schedules)
          for (int zero = 0; zero <= (S > 1 ? 3 : 0); ++zero)
            for (int rc = 0; rc <= 1; ++rc) {
              Layout l;
              l.dp = S, l.tp = t, l.pp = P, l.zero = zero, l.micro_batch = mb, l.microbatches = M;
              l.schedule = sched, l.virtual_stages = v, l.recompute = rc;
              l.sequence_parallel = t > 1;
              out.push_back(l);
            }
      }
    }
  }
  return out;
}

std::string layout_toml(const ModelShape& m, const Layout& l, int global_batch) {
  std::ostringstream o;
  o << "# from `loom plan`: " << l.describe() << "\n[model]\n";
  if (m.name.rfind("custom ", 0) == 0)
    o << "n_layer = " << m.layers << "\nn_head = " << m.heads << "\nn_embd = " << m.hidden
      << "\nvocab_size = " << (m.vocab_size > 0 ? m.vocab_size : m.vocab)
      << "\nblock_size = " << m.max_seq << "\n";
  else
    o << "name = \"" << m.name << "\"\n";
  o << "\n[train]\nglobal_batch = " << global_batch << "\nmicro_batch = " << l.micro_batch
    << "\nseq_len = " << m.seq << "\ntp = " << l.tp << "\npp = " << l.pp << "\nzero = " << l.zero
    << "\nrecompute = \"" << (l.recompute ? "all" : "none") << "\"\n";
  if (l.pp > 1)
    o << "\n[pp]\nschedule = \"" << l.schedule << "\"\nvirtual_stages = " << l.virtual_stages
      << "\n";
  if (l.tp > 1)
    o << "\n[tp]\nsequence_parallel = " << (l.sequence_parallel ? "true" : "false") << "\n";
  if (l.offload != "none") o << "\n[zero]\noffload = \"disk\"\n";
  if (l.offload == "optimizer+master") o << "offload_master = true\n";
  return o.str();
}

}  // namespace loom::plan
