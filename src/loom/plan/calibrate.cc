#include "loom/plan/calibrate.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <tuple>
#include <vector>

#include "loom/comm/tuning.h"
#include "loom/core/cpus.h"
#include "loom/core/state_memory.h"
#include "loom/core/stats.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/optim/adamw.h"

namespace loom::plan {
namespace {

using Clock = std::chrono::steady_clock;

// Tensor-parallel communication that moves nothing (timing only).
class NoComm : public model::TpComm {
 public:
  explicit NoComm(int t) : t_(t) {}
  void allreduce_sum(float*, size_t) override {}
  void allreduce_max(float*, size_t) override {}
  void allgather(const float* mine, float* all, size_t n) override {
    for (int r = 0; r < t_; ++r) std::memcpy(all + r * n, mine, n * sizeof(float));
  }
  void reduce_scatter_sum(const float* all, float* mine, size_t n) override {
    std::memcpy(mine, all, n * sizeof(float));
  }

 private:
  int t_;
};

// (one block, embedding + final norm + head): forward + backward of one microbatch, the
// median of `repeats` after a warm-up. The block runs alone (Gpt::forward_units on unit 1);
// the ends are a 1-block model's whole pass less that block.
std::pair<double, double> step_seconds(const CpuShape& s, int repeats) {
  NoComm comm(s.tp);
  model::GptConfig cfg = s.model;
  cfg.n_layer = 1;
  model::Gpt g(cfg, true, model::TensorSplit{s.tp, 0, s.sequence_parallel && s.tp > 1});
  if (s.tp > 1) g.set_tp_comm(&comm);
  g.set_recompute_every(s.recompute ? 1 : 0);
  g.set_precision(s.bf16 ? kernels::cpu::Precision::kBF16 : kernels::cpu::Precision::kF32);
  g.init(1);
  const int n = s.micro_batch * s.seq;
  std::vector<int> x(n), y(n);
  for (int i = 0; i < n; ++i) x[i] = (i * 7919) % 50000, y[i] = (i * 104729 + 1) % 50000;
  const size_t rc = static_cast<size_t>(g.rows(s.micro_batch, s.seq)) * s.model.n_embd;
  std::vector<float> in(rc, 0.1f), dout(rc, 0.01f);
  model::Activations a;
  std::vector<double> block, whole;
  for (int r = 0; r <= repeats; ++r) {
    auto t0 = Clock::now();
    g.forward_units(a, 1, 1, nullptr, nullptr, s.micro_batch, s.seq, in.data());
    g.backward_units(a, 1.0f, dout.data(), model::BackwardPart::kWhole);
    auto t1 = Clock::now();
    g.zero_grad();
    g.forward(x.data(), y.data(), s.micro_batch, s.seq);
    g.backward(1.0f);
    auto t2 = Clock::now();
    if (r > 0) {
      block.push_back(std::chrono::duration<double>(t1 - t0).count());
      whole.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
  }
  const double b = median(block);
  return {b, std::max(0.0, median(whole) - b)};
}

// Runs measure(i) for i < copies at once, copy 0 on the calling thread and the others on
// threads of their own (on cpus[i] where given), each with `threads` OpenMP threads and its
// memory in an account of its own (not the caller's model state: core/state_memory.h).
template <typename Fn>
void at_once(int copies, int threads, const std::vector<std::vector<int>>& cpus, Fn measure) {
  auto one = [&](int i) {
    if (i > 0 && i < static_cast<int>(cpus.size()) && !cpus[i].empty()) set_thread_cpus(cpus[i]);
    StateMemory scratch;
    StateMemory::Scope scope(scratch);
    omp_set_num_threads(threads);
    measure(i);
  };
  std::vector<std::thread> others;
  for (int i = 1; i < copies; ++i) others.emplace_back(one, i);
  one(0);
  for (auto& t : others) t.join();
}

// (block, ends) seconds measured by `copies` threads at once; the slowest copy's.
std::pair<double, double> block_and_ends(const CpuShape& shape, int copies, int repeats,
                                         const std::vector<std::vector<int>>& cpus) {
  std::vector<std::pair<double, double>> got(copies);
  at_once(copies, shape.threads, cpus, [&](int i) { got[i] = step_seconds(shape, repeats); });
  std::pair<double, double> worst = got[0];
  for (const auto& [b, e] : got) worst = {std::max(worst.first, b), std::max(worst.second, e)};
  return worst;
}

// AdamW's rate (parameters per second) with `copies` optimizers stepping at once, each on
// its own 4 M parameters: every rank of a machine steps its optimizer at the same moment
// (after the step's reductions), sharing the memory bandwidth. The slowest copy's median.
double adamw_params_per_s(int threads, int copies, int repeats,
                          const std::vector<std::vector<int>>& cpus) {
  const size_t n = size_t{4} << 20;
  std::vector<double> worst(copies);
  at_once(copies, threads, cpus, [&](int i) {
    optim::AdamW adam({{0, n, true}}, 0, n);
    std::vector<float> p(n, 0.01f), g(n, 0.001f);
    std::vector<double> times;
    for (int r = 0; r <= repeats; ++r) {
      const auto t0 = Clock::now();
      adam.step(p.data(), g.data(), 1.0f, 1e-3, optim::AdamWParams{}, r + 1);
      if (r > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    worst[i] = median(times);
  });
  return static_cast<double>(n) / *std::max_element(worst.begin(), worst.end());
}

}  // namespace

CpuCosts measure_cpu(const CpuShape& shape, int ranks, int repeats,
                     const std::vector<std::vector<int>>& copy_cpus) {
  CpuCosts c;
  std::tie(c.block_s, c.ends_s) = block_and_ends(shape, 1, repeats, copy_cpus);
  std::tie(c.block_busy_s, c.ends_busy_s) =
      block_and_ends(shape, std::max(ranks, 1), repeats, copy_cpus);
  c.adamw_params_per_s = adamw_params_per_s(shape.threads, std::max(ranks, 1), repeats, copy_cpus);
  const comm::CostModel cm = comm::CostModel::from_env();
  c.shm_alpha_us = cm.shm.alpha_us, c.shm_gbps = cm.shm.gbps;
  return c;
}

Device cpu_device(int ranks_per_node) {
  Device d;
  d.name = "cpu";
  d.cpu = true;  // its compute comes from measure_cpu's costs, not peak x efficiency
  const double bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  d.mem_gb = bytes / 1e9 / std::max(ranks_per_node, 1);
  return d;
}

ModelShape model_shape(const model::GptConfig& g, int seq) {
  ModelShape m;
  m.name = g.name, m.layers = g.n_layer, m.hidden = g.n_embd, m.heads = g.n_head;
  m.vocab = g.padded_vocab_size, m.seq = seq, m.max_seq = g.block_size;
  m.vocab_size = g.vocab_size;
  return m;
}

}  // namespace loom::plan
