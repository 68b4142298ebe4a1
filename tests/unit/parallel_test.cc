// The mesh (a table of layouts), the vocab-parallel cross-entropy and one tensor-parallel
// training step against one process, with ranks as threads over the real transports.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "loom/core/box.h"
#include "loom/core/error.h"
#include "loom/kernels/backend.h"
#include "loom/kernels/cpu/kernels.h"
#include "loom/model/gpt.h"
#include "loom/model/vocab_parallel_loss.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/mesh.h"
#include "loom/parallel/pipeline.h"
#include "loom/parallel/process_groups.h"
#include "loom/parallel/step_composer.h"
#include "loom/parallel/tensor_parallel.h"
#include "support/thread_ranks.h"

namespace loom::test {
namespace {

using parallel::Mesh;
using parallel::MeshCoord;
using Groups = std::vector<std::vector<int>>;

// The message of the UserError that f throws ("" if none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// ---- the mesh ----

// Written out by hand (docs: rightmost letter fastest), world 12 = dp 2 x pp 3 x tp 2.
TEST(Mesh, World12Tp2Pp3Dp2ByHand) {
  Mesh dpt = Mesh::build(12, 2, 3, "cluster");  // rank = 6 d + 2 p + t
  EXPECT_EQ(dpt.order(), "DPT");
  EXPECT_EQ(dpt.dp(), 2);
  EXPECT_EQ(dpt.groups('T'), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}}));
  EXPECT_EQ(dpt.groups('P'), (Groups{{0, 2, 4}, {1, 3, 5}, {6, 8, 10}, {7, 9, 11}}));
  EXPECT_EQ(dpt.groups('D'), (Groups{{0, 6}, {1, 7}, {2, 8}, {3, 9}, {4, 10}, {5, 11}}));
  EXPECT_EQ(dpt.embedding_group(1), (std::vector<int>{1, 5}));
  EXPECT_EQ(dpt.embedding_group(11), (std::vector<int>{7, 11}));
  EXPECT_TRUE(dpt.embedding_group(9).empty());
  EXPECT_TRUE(dpt.embedding_group(3).empty());  // a middle stage
  EXPECT_EQ(dpt.coord(9), (MeshCoord{1, 1, 1}));

  Mesh tpd = Mesh::build(12, 2, 3, "spread");  // rank = 6 t + 2 p + d
  EXPECT_EQ(tpd.order(), "TPD");
  EXPECT_EQ(tpd.groups('T'), (Groups{{0, 6}, {1, 7}, {2, 8}, {3, 9}, {4, 10}, {5, 11}}));
  EXPECT_EQ(tpd.groups('P'), (Groups{{0, 2, 4}, {1, 3, 5}, {6, 8, 10}, {7, 9, 11}}));
  EXPECT_EQ(tpd.groups('D'), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}}));

  Mesh ptd = Mesh::build(12, 2, 3, "PTD");  // rank = 4 p + 2 t + d
  EXPECT_EQ(ptd.groups('T'), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}}));
  EXPECT_EQ(ptd.groups('P'), (Groups{{0, 4, 8}, {1, 5, 9}, {2, 6, 10}, {3, 7, 11}}));
  EXPECT_EQ(ptd.groups('D'), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}}));
  EXPECT_EQ(ptd.embedding_group(3), (std::vector<int>{3, 11}));
}

// Every layout of a table, in all six orders, against the definition enumerated directly:
// nested loops over the letters from left (slowest) to right (fastest) number the ranks.
TEST(Mesh, TableOfLayoutsInEveryOrder) {
  struct Layout {
    int world, tp, pp;
  };
  const std::vector<Layout> table = {{1, 1, 1},  {2, 2, 1},  {2, 1, 2},  {4, 2, 2},  {8, 2, 2},
                                     {8, 4, 1},  {8, 1, 4},  {12, 2, 3}, {16, 4, 2}, {24, 2, 3},
                                     {32, 8, 2}, {64, 4, 4}, {96, 8, 3}, {6, 3, 1},  {30, 5, 3}};
  std::string order = "DPT";
  int orders = 0;
  do {
    ++orders;
    for (const Layout& l : table) {
      SCOPED_TRACE(order + " world " + std::to_string(l.world) + " tp " + std::to_string(l.tp) +
                   " pp " + std::to_string(l.pp));
      const Mesh m = Mesh::build(l.world, l.tp, l.pp, order);
      const int dp = l.world / (l.tp * l.pp);
      ASSERT_EQ(m.dp(), dp);
      std::map<char, int> size = {{'D', dp}, {'P', l.pp}, {'T', l.tp}};
      std::map<char, int> c;
      int rank = 0;
      for (c[order[0]] = 0; c[order[0]] < size[order[0]]; ++c[order[0]])
        for (c[order[1]] = 0; c[order[1]] < size[order[1]]; ++c[order[1]])
          for (c[order[2]] = 0; c[order[2]] < size[order[2]]; ++c[order[2]], ++rank) {
            const MeshCoord want{c['D'], c['P'], c['T']};
            ASSERT_EQ(m.coord(rank), want) << "rank " << rank;
            ASSERT_EQ(m.rank_of(want), rank);
            for (char dim : {'D', 'P', 'T'}) {
              const auto g = m.group(dim, rank);
              ASSERT_EQ(static_cast<int>(g.size()), size[dim]);
              for (int i = 0; i < size[dim]; ++i) {  // same coordinates but along dim
                MeshCoord other = want;
                (dim == 'D' ? other.dp : dim == 'P' ? other.pp : other.tp) = i;
                ASSERT_EQ(g[i], m.rank_of(other));
              }
            }
          }
      ASSERT_EQ(rank, l.world);
      // The groups along each dimension partition the world.
      for (char dim : {'D', 'P', 'T'}) {
        std::vector<int> seen;
        for (const auto& g : m.groups(dim)) seen.insert(seen.end(), g.begin(), g.end());
        std::sort(seen.begin(), seen.end());
        std::vector<int> all(l.world);
        std::iota(all.begin(), all.end(), 0);
        ASSERT_EQ(seen, all);
      }
    }
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(orders, 6);
}

TEST(Mesh, BadLayoutsNameTheNumbers) {
  EXPECT_NE(error_of([] { Mesh::build(6, 4, 1); })
                .find("train.tp = 4 x train.pp = 1 = 4 does "
                      "not divide the 6 ranks"),
            std::string::npos);
  EXPECT_NE(error_of([] { Mesh::build(12, 2, 4); }).find("= 8 does not divide the 12 ranks"),
            std::string::npos);
  EXPECT_NE(error_of([] { Mesh::build(4, 2, 1, "DXT"); }).find("unknown letter 'X'"),
            std::string::npos);
  EXPECT_NE(error_of([] { Mesh::build(4, 2, 1, "DDT"); }).find("each of D, P, T exactly once"),
            std::string::npos);
  EXPECT_NE(error_of([] { Mesh::build(4, 0, 1); }).find("must be at least 1"), std::string::npos);
  EXPECT_NE(error_of([] {
              model::GptConfig::named("small").validate_split(4);
            }).find("train.tp = 4 does not divide the 6 attention heads of small"),
            std::string::npos);
  EXPECT_EQ(error_of([] { model::GptConfig::named("small").validate_split(3); }), "");
  EXPECT_EQ(Mesh::build(8, 2, 2).describe(),
            "world 8 = dp 2 x pp 2 x tp 2, placement DPT; tp groups [0 1] [2 3] [4 5] [6 7]; pp "
            "groups [0 2] [1 3] [4 6] [5 7]; dp groups [0 4] [1 5] [2 6] [3 7]");
}

// ---- boxes ----

// The ZeRO stages as policies: the table in parallel/sharding.h, decision by decision.
TEST(ShardingPolicy, EachStageMakesTheTablesThreeDecisions) {
  using parallel::GradHome;
  using parallel::OptimizerRange;
  using parallel::ParamHome;
  struct Row {
    ParamHome params;
    GradHome grads;
    OptimizerRange optimizer;
    bool gathers_after_step;
  };
  const Row table[4] = {
      {ParamHome::kReplicated, GradHome::kAllReduced, OptimizerRange::kWholeUnit, false},
      {ParamHome::kReplicated, GradHome::kReduceScatteredInPlace, OptimizerRange::kOwnShard, true},
      {ParamHome::kReplicated, GradHome::kReduceScatteredIntoShard, OptimizerRange::kOwnShard,
       true},
      {ParamHome::kGatheredOnUse, GradHome::kReduceScatteredIntoShard, OptimizerRange::kOwnShard,
       false},
  };
  for (int stage = 0; stage < 4; ++stage) {
    const auto p = parallel::make_sharding_policy(stage);
    EXPECT_EQ(p->stage(), stage);
    EXPECT_EQ(p->params(), table[stage].params) << stage;
    EXPECT_EQ(p->grads(), table[stage].grads) << stage;
    EXPECT_EQ(p->optimizer(), table[stage].optimizer) << stage;
    EXPECT_EQ(p->gathers_after_step(), table[stage].gathers_after_step) << stage;
    // Alone in its shard group (and no replicas) a stage above 1 holds what stage 1 holds.
    EXPECT_EQ(parallel::make_sharding_policy(stage, true)->stage(), std::min(stage, 1));
  }
  for (int bad : {-1, 4}) try {
      parallel::make_sharding_policy(bad);
      ADD_FAILURE() << bad << " was taken as a ZeRO stage";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("is not a ZeRO stage"), std::string::npos) << e.what();
    }
}

TEST(Box, RunsVisitABoxInItsOrder) {
  // Columns 2..4 of rows 1..2 of a (3, 5) tensor, then a range inside that box.
  const Shape shape{3, 5};
  std::vector<int64_t> flats;
  for_each_box_run(shape, {1, 2}, {2, 3}, 0, 6, [&](int64_t pos, int64_t flat, int64_t len) {
    EXPECT_EQ(pos, static_cast<int64_t>(flats.size()));
    for (int64_t i = 0; i < len; ++i) flats.push_back(flat + i);
  });
  EXPECT_EQ(flats, (std::vector<int64_t>{7, 8, 9, 12, 13, 14}));
  flats.clear();
  for_each_box_run(shape, {1, 2}, {2, 3}, 2, 3, [&](int64_t, int64_t flat, int64_t len) {
    for (int64_t i = 0; i < len; ++i) flats.push_back(flat + i);
  });
  EXPECT_EQ(flats, (std::vector<int64_t>{9, 12, 13}));
  int runs = 0;  // a box covering whole trailing dimensions is one run
  for_each_box_run(Shape{4, 3, 2}, {1, 0, 0}, {2, 3, 2}, 0, 12,
                   [&](int64_t, int64_t flat, int64_t len) {
                     EXPECT_EQ(flat, 6);
                     EXPECT_EQ(len, 12);
                     ++runs;
                   });
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(box_flat_index(shape, {1, 2}, {2, 3}, 4), 13);
  EXPECT_EQ(box_position(shape, {1, 2}, {2, 3}, 13), 4);
}

// ---- vocab-parallel cross-entropy ----

// Counts the collectives the loss issues, forwarding to the real group.
TEST(VocabParallelLoss, MatchesOneProcessWithExactlyThreeAllreduces) {
  const int N = 7, V = 1000, Vp = 1024;  // 24 padding columns, all in the last shard
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(N) * Vp);
  for (auto& x : logits) x = d(rng);
  std::vector<int> targets = {0, 999, 511, 512, 255, 768, 3};
  // One process: softmax over the real vocabulary, loss, fused backward.
  std::vector<float> probs = logits, losses(N), row_max(N), row_sum(N);
  kernels::cpu::crossentropy_forward(losses.data(), row_max.data(), row_sum.data(), logits.data(),
                                     targets.data(), N, V, Vp);
  kernels::cpu::crossentropy_backward_inplace(probs.data(), nullptr, row_max.data(), row_sum.data(),
                                              0.25f, targets.data(), N, V, Vp);
  // Both backends' shard kernels, against the fast one-process loss.
  for (const char* backend : {"cpu", "reference"})
    for (int t : {2, 4}) {
      run_ranks(
          t, Layout::kShm, "vploss" + std::to_string(t) + backend, [&](comm::Communicator& c) {
            const auto kb = kernels::make_backend(backend);
            parallel::TensorParallel tp(c.shared_from_this());
            const int Vl = Vp / t, begin = c.rank() * Vl;
            const model::VocabShard shard{begin, Vl, std::clamp(V - begin, 0, Vl)};
            std::vector<float> mine(static_cast<size_t>(N) * Vl), got(N), mx(N), sum(N), tgt(N);
            for (int n = 0; n < N; ++n)
              std::copy_n(logits.begin() + static_cast<ptrdiff_t>(n) * Vp + begin, Vl,
                          mine.begin() + static_cast<ptrdiff_t>(n) * Vl);
            model::vocab_parallel_cross_entropy(*kb, tp, mine.data(), got.data(), targets.data(), N,
                                                shard, {mx.data(), sum.data(), tgt.data()});
            const auto& k = tp.counters();
            EXPECT_EQ(k.allreduce_max, 1);
            EXPECT_EQ(k.allreduce_sum, 2);
            EXPECT_EQ(k.allgather + k.reduce_scatter, 0);
            for (int n = 0; n < N; ++n) EXPECT_NEAR(got[n], losses[n], 1e-5 * losses[n]) << n;
            model::vocab_parallel_cross_entropy_backward(*kb, mine.data(), 0.25f, targets.data(), N,
                                                         shard);
            EXPECT_EQ(tp.counters().allreduce_sum, 2);  // backward: no communication
            for (int n = 0; n < N; ++n)
              for (int i = 0; i < Vl; ++i)
                ASSERT_NEAR(mine[static_cast<size_t>(n) * Vl + i],
                            probs[static_cast<size_t>(n) * Vp + begin + i], 1e-7)
                    << backend << " row " << n << " column " << begin + i;
          });
    }
}

// ---- one tensor-parallel step against one process ----

// Copies this rank's box of every tensor (from a flat layout) into whole-tensor arrays.
void scatter_boxes(const model::Gpt& m, const float* flat,
                   std::map<std::string, std::vector<float>>& whole) {
  for (const model::Tensor& t : m.tensors()) {
    auto& w = whole[t.name];
    w.resize(static_cast<size_t>(numel(t.shape)));
    for_each_box_run(t.shape, t.start, t.extent, 0, static_cast<int64_t>(t.size),
                     [&](int64_t pos, int64_t f, int64_t len) {
                       std::copy_n(flat + t.offset + pos, len, w.begin() + f);
                     });
  }
}

double normalised_error(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(want[i])));
  }
  return err / (mag + 1e-30);
}

struct StepCase {
  int tp;
  bool sequence_parallel;
  int recompute;
  bool split_backward = false;  // input gradients (B), then weight gradients (W)
};

class TensorParallelStep : public ::testing::TestWithParam<StepCase> {};

// A small GPT for thread-rank tests: 4 heads, context 16, a vocabulary of 250 (padded 256).
model::GptConfig small_gpt(int n_layer, int n_embd) {
  model::GptConfig cfg;
  cfg.n_layer = n_layer, cfg.n_head = 4, cfg.n_embd = n_embd, cfg.block_size = 16;
  cfg.vocab_size = 250, cfg.padded_vocab_size = 256;
  return cfg;
}

// n random tokens and targets of that vocabulary.
void random_tokens(unsigned seed, size_t n, std::vector<int>& tokens, std::vector<int>& targets) {
  std::mt19937 rng(seed);
  tokens.resize(n), targets.resize(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = rng() % 250, targets[i] = rng() % 250;
}

// Same seed, same batch: the initial weights gathered from the shards equal one process's
// bit for bit; the loss is within 1e-5 relative and every gradient, gathered, within 1e-5
// (normalised max error per tensor); replicated tensors' gradients agree on every rank.
TEST_P(TensorParallelStep, GradientsEqualOneProcess) {
  const StepCase k = GetParam();
  const model::GptConfig cfg = small_gpt(2, 32);
  const int B = 2, T = 16;
  std::vector<int> tokens, targets;
  random_tokens(11, B * T, tokens, targets);
  model::Gpt ref(cfg);
  ref.init(42);
  ref.zero_grad();
  const float want_loss = ref.forward(tokens.data(), targets.data(), B, T);
  ref.backward();
  std::map<std::string, std::vector<float>> want_p, want_g;
  scatter_boxes(ref, ref.params(), want_p);
  scatter_boxes(ref, ref.grads(), want_g);

  std::vector<std::map<std::string, std::vector<float>>> got_p(k.tp), got_g(k.tp);
  std::vector<float> losses(k.tp);
  run_ranks(k.tp, Layout::kShm, "tpstep", [&](comm::Communicator& c) {
    parallel::TensorParallel tp(c.shared_from_this());
    model::Gpt m(cfg, true, {k.tp, c.rank(), k.sequence_parallel});
    m.set_tp_comm(&tp);
    m.set_recompute_every(k.recompute);
    m.init(42);
    m.zero_grad();
    if (k.split_backward) {
      model::Activations a;
      losses[c.rank()] =
          m.forward_units(a, 0, cfg.n_layer + 1, tokens.data(), targets.data(), B, T, nullptr);
      m.backward_units(a, 1.0f, nullptr, model::BackwardPart::kInput);
      m.backward_units(a, 1.0f, nullptr, model::BackwardPart::kWeight);
    } else {
      losses[c.rank()] = m.forward(tokens.data(), targets.data(), B, T);
      m.backward();
    }
    scatter_boxes(m, m.params(), got_p[c.rank()]);
    scatter_boxes(m, m.grads(), got_g[c.rank()]);
  });
  for (int r = 0; r < k.tp; ++r) EXPECT_NEAR(losses[r], want_loss, 1e-5 * want_loss);
  model::Gpt one_rank_view(cfg, true, {k.tp, 0, k.sequence_parallel});
  for (const model::Tensor& t : one_rank_view.tensors()) {
    std::vector<float> p(want_p[t.name].size()), g(p.size());
    // Rank r contributes its box; replicated tensors come from rank 0 and must agree.
    for (int r = 0; r < k.tp; ++r) {
      model::Gpt view(cfg, false, {k.tp, r, k.sequence_parallel});
      for (const model::Tensor& vt : view.tensors()) {
        if (vt.name != t.name) continue;
        for_each_box_run(vt.shape, vt.start, vt.extent, 0, static_cast<int64_t>(vt.size),
                         [&](int64_t, int64_t f, int64_t len) {
                           std::copy_n(got_p[r][t.name].begin() + f, len, p.begin() + f);
                           std::copy_n(got_g[r][t.name].begin() + f, len, g.begin() + f);
                         });
        if (vt.replicated && r > 0) {
          EXPECT_EQ(got_g[r][t.name], got_g[0][t.name]) << t.name << " on rank " << r;
        }
      }
    }
    EXPECT_EQ(p, want_p[t.name]) << t.name << ": initial weights differ";
    EXPECT_LT(normalised_error(g, want_g[t.name]), 1e-5) << t.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelStep,
                         ::testing::Values(StepCase{2, false, 0}, StepCase{4, false, 0},
                                           StepCase{2, true, 0}, StepCase{4, true, 1},
                                           StepCase{2, true, 1}, StepCase{2, false, 0, true},
                                           StepCase{2, true, 1, true}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.tp) +
                                  (info.param.sequence_parallel ? "_sp" : "") +
                                  (info.param.recompute ? "_recompute" : "") +
                                  (info.param.split_backward ? "_split" : "");
                         });

// ---- data parallelism and ZeRO with thread ranks ----

struct DpCase {
  int n, zero;
  bool shared_gather = true;  // zero.shared_gather (stage 3; thread ranks share a machine)
};

// A rank's model-state high-water mark: at least the formula, at most the formula plus the
// buffers allowed in flight; nothing left allocated after the run.
void expect_state_within(const StateMemory& account, int rank, double expected, double allowance) {
  const double peak = static_cast<double>(account.peak_bytes());
  EXPECT_GE(peak, 0.999 * expected) << "rank " << rank;
  EXPECT_LE(peak, expected + allowance)
      << "rank " << rank << ": " << peak / 1e6 << " MB of model state, formula " << expected / 1e6
      << " MB + at most " << allowance / 1e6 << " MB in flight";
  EXPECT_EQ(account.current_bytes(), 0u) << "rank " << rank << ": state left allocated";
}

class DataParallelSteps : public ::testing::TestWithParam<DpCase> {};

// A model whose blocks dominate (16 blocks, each 6% of the parameters; in `tiny` the
// embedding is 97%, so ZeRO's bounds there hide a unit that is never freed): three AdamW
// steps of a global batch of 4 rows on n thread ranks reproduce one process's losses within
// 1e-5, and each rank's model-state high-water mark (its own StateMemory account) is
// ZeRO's formula plus at most the unit-sized buffers the stage keeps in flight
// (docs/algorithms.md): stage 2, the gradient being computed and <= 2 in reduction; stage 3
// also the gathered parameters of the unit in use and of the next (with the shared gather,
// 1/S of them: the machine holds one copy, which the peak would exceed otherwise). Every
// unit size keeps its own pool of such buffers, so the embedding's add to the blocks'.
TEST_P(DataParallelSteps, LossesOfOneProcessAndZerosMemory) {
  const DpCase k = GetParam();
  const model::GptConfig cfg = small_gpt(16, 64);
  const int rows = 4, T = 16, steps = 3;
  std::vector<int> tokens, targets;
  random_tokens(5, steps * rows * T, tokens, targets);
  optim::AdamWParams adam;

  // Runs the steps on this rank (dp = null: one process); returns the mean loss per step.
  auto run = [&](std::shared_ptr<comm::Communicator> dp, int zero, int rank, int n) {
    model::Gpt m(cfg, /*own_storage=*/false);
    parallel::DpOptions o;
    o.sharding = parallel::make_sharding_policy(zero);
    o.shared_gather = k.shared_gather;
    const parallel::ProcessGroups groups{nullptr, dp, nullptr, nullptr, nullptr};
    parallel::DataParallel engine(m, groups, o);
    parallel::StepComposer step(engine, groups);
    engine.init_weights(7);
    step.check_replicas("the initial weights", true);
    std::vector<float> losses;
    const int mine = rows / n;
    for (int s = 0; s < steps; ++s) {
      const size_t at = (static_cast<size_t>(s) * rows + rank * mine) * T;
      engine.zero_grad();
      float loss = engine.forward(tokens.data() + at, targets.data() + at, mine, T);
      engine.backward(1.0f, true);
      step.finish_gradients();
      engine.optimizer_step(1.0f, 1e-3, adam, s + 1);
      if (dp) dp->allreduce(&loss, &loss, 1, DType::kF32, comm::ReduceOp::kAvg);
      losses.push_back(loss);
    }
    return losses;
  };
  const std::vector<float> want = run(nullptr, 0, 0, 1);

  std::vector<StateMemory> accounts(k.n);
  std::vector<std::vector<float>> got(k.n);
  run_ranks(k.n, Layout::kShm, "dpsteps", [&](comm::Communicator& c) {
    StateMemory::Scope scope(accounts[c.rank()]);
    got[c.rank()] = run(c.shared_from_this(), k.zero, c.rank(), k.n);
  });
  for (int r = 0; r < k.n; ++r)
    for (int s = 0; s < steps; ++s)
      EXPECT_NEAR(got[r][s], want[s], 1e-5 * want[s]) << "rank " << r << " step " << s;

  // ZeRO's formulas (Rajbhandari et al.): 16 bytes per parameter unsharded (fp32 weights,
  // gradients, Adam m and v), less as the stage shards more of them.
  model::Gpt shape(cfg, false);
  std::vector<double> units;
  for (int u = 0; u < shape.num_units(); ++u)
    units.push_back(static_cast<double>(shape.unit_range(u).second - shape.unit_range(u).first));
  const double psi = std::accumulate(units.begin(), units.end(), 0.0);
  // Bytes of one buffer of each size: a block (every block is the same size), and the two
  // other units (the embedding first, the final LayerNorm last).
  const double block = 4 * units[1], ends = 4 * (units.front() + units.back());
  ASSERT_LT(units[1], 0.1 * psi) << "each block should be a small part of the model";
  const double S = k.n, pad = 16.0 * units.size() * S;
  double expected = 16 * psi, allowance = pad;
  if (k.zero == 1) expected = 8 * psi + 8 * psi / S;
  if (k.zero == 2) expected = 4 * psi + 12 * psi / S, allowance += 3 * block + 3 * ends;
  // Stage 3: the gradients as stage 2's (3 blocks and one end), and the gathered parameters
  // of the unit in use and the next (2 blocks and one end) - with the shared gather one
  // buffer per machine, of which each rank accounts for 1/S.
  const double gathered = (2 * block + ends) / (k.shared_gather ? S : 1);
  if (k.zero == 3) expected = 16 * psi / S, allowance += 3 * block + ends + gathered;
  for (int r = 0; r < k.n; ++r) {
    expect_state_within(accounts[r], r, expected, allowance);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, DataParallelSteps,
                         ::testing::Values(DpCase{2, 0}, DpCase{2, 1}, DpCase{2, 2}, DpCase{2, 3},
                                           DpCase{4, 2}, DpCase{4, 3}, DpCase{2, 3, false},
                                           DpCase{4, 3, false}),
                         [](const auto& info) {
                           return "n" + std::to_string(info.param.n) + "_zero" +
                                  std::to_string(info.param.zero) +
                                  (info.param.shared_gather ? "" : "_gather_per_rank");
                         });

// A pipeline stage's data-parallel options: its units, the last stage's copy of wte for the
// tied head, ZeRO stage `zero`.
parallel::DpOptions stage_options(const parallel::PipelineStage& stage, int zero) {
  parallel::DpOptions o;
  o.sharding = parallel::make_sharding_policy(zero);
  o.units = stage.units();
  o.unit0_is_head_copy = stage.last() && !stage.first();
  o.pipeline = true;
  return o;
}

// ZeRO-3 under a pipeline (pp 2 x dp 2 thread ranks, 4 microbatches): the losses of one
// process within 1e-5; from the second step on, each unit is gathered ahead of its use in
// the order the schedule runs the actions (only a step's first use waits for a gather that
// started at the use: the step's order is recorded on the first step); and each rank's
// model state stays within the pipeline's ZeRO-3 formula - this stage's shards (16 bytes
// per parameter over S) and its full gradients (held until the step's last microbatch
// finishes them, 4 bytes per parameter) - plus the gathered parameters of two blocks (the
// one in use and the next) and of each other unit the stage holds (every unit size keeps
// its own pool of gathered buffers, as in LossesOfOneProcessAndZerosMemory).
struct PipeCase {
  const char* schedule;
  int virtual_stages;
};

class PipelinedZero3 : public ::testing::TestWithParam<PipeCase> {};

TEST_P(PipelinedZero3, PrefetchesInScheduleOrderWithOneProcessLosses) {
  const PipeCase k = GetParam();
  const model::GptConfig cfg = small_gpt(8, 64);
  const int P = 2, D = 2, M = 4, B = 1, T = 16, steps = 3;
  const int V = k.virtual_stages, units = cfg.n_layer + 2;
  std::vector<int> tokens, targets;
  random_tokens(9, static_cast<size_t>(steps) * D * M * B * T, tokens, targets);
  optim::AdamWParams adam;
  const size_t step_rows = static_cast<size_t>(D) * M * B;  // sequences per step

  std::vector<float> want;  // one process: the same M x D micro-batches accumulated
  {
    model::Gpt m(cfg, /*own_storage=*/false);
    parallel::DpOptions o;
    o.sharding = parallel::make_sharding_policy(0);
    const parallel::ProcessGroups none{};
    parallel::DataParallel engine(m, none, o);
    parallel::StepComposer step(engine, none);
    engine.init_weights(7);
    for (int s = 0; s < steps; ++s) {
      engine.zero_grad();
      double loss = 0;
      for (size_t a = 0; a < step_rows; ++a) {
        const size_t at = (s * step_rows + a) * T;
        loss += engine.forward(tokens.data() + at, targets.data() + at, B, T);
        engine.backward(1.0f / static_cast<float>(step_rows), a + 1 == step_rows);
      }
      step.finish_gradients();
      engine.optimizer_step(1.0f, 1e-3, adam, s + 1);
      want.push_back(static_cast<float>(loss / static_cast<double>(step_rows)));
    }
  }

  const int world = P * D;
  std::vector<StateMemory> accounts(world);
  std::vector<std::vector<float>> got(world);
  std::vector<int64_t> on_use_first(world), on_use_later(world);
  std::vector<double> stage_params(world), in_flight(world);
  std::vector<int> stage_of(world);
  run_ranks(world, Layout::kShm, std::string("ppzero3") + k.schedule, [&](comm::Communicator& c) {
    StateMemory::Scope scope(accounts[c.rank()]);
    const parallel::Mesh mesh = parallel::Mesh::build(world, 1, P);
    const parallel::MeshCoord me = mesh.coord(c.rank());
    const parallel::ProcessGroups groups =
        parallel::make_process_groups(c.shared_from_this(), mesh);
    model::Gpt m(cfg, /*own_storage=*/false);
    std::vector<int> counts(P * V, units / (P * V));
    for (int i = 0; i < units % (P * V); ++i) ++counts[i];
    parallel::PipelineStage stage(m, groups.pp, parallel::split_units(counts, units, P * V),
                                  parallel::schedule_kind(k.schedule), M);
    parallel::DpOptions o = stage_options(stage, 3);
    o.shared_gather = false;  // a copy per rank: the bound below counts whole units
    parallel::DataParallel engine(m, groups, o);
    parallel::StepComposer step(engine, groups);
    engine.init_weights(7);
    const auto block = static_cast<double>(m.unit_range(1).second - m.unit_range(1).first);
    in_flight[c.rank()] = 2 * 4 * block;
    for (int u : o.units) {
      const auto n = static_cast<double>(m.unit_range(u).second - m.unit_range(u).first);
      stage_params[c.rank()] += n;
      if (n != block) in_flight[c.rank()] += 4 * n;
    }
    stage_of[c.rank()] = me.pp;
    for (int s = 0; s < steps; ++s) {
      const size_t at = (s * step_rows + static_cast<size_t>(me.dp) * M * B) * T;
      engine.zero_grad();
      double loss = stage.train_step(tokens.data() + at, targets.data() + at, B, T,
                                     1.0f / static_cast<float>(M), &engine);
      step.finish_gradients();
      engine.optimizer_step(1.0f, 1e-3, adam, s + 1);
      if (s == 0) on_use_first[c.rank()] = engine.gathers_on_use();
      // The step's mean loss: the last stage's sum over its microbatches, averaged over dp.
      c.allreduce(&loss, &loss, 1, DType::kF64, comm::ReduceOp::kSum);
      got[c.rank()].push_back(static_cast<float>(loss / static_cast<double>(step_rows)));
    }
    on_use_later[c.rank()] = engine.gathers_on_use() - on_use_first[c.rank()];
  });
  for (int r = 0; r < world; ++r) {
    for (int s = 0; s < steps; ++s)
      EXPECT_NEAR(got[r][s], want[s], 1e-5 * want[s]) << "rank " << r << " step " << s;
    EXPECT_GT(on_use_first[r], steps) << "rank " << r << ": the first step gathers on use";
    EXPECT_EQ(on_use_later[r], steps - 1)
        << "rank " << r << " (stage " << stage_of[r] << "): " << on_use_later[r]
        << " uses after the first step waited for a gather started at the use";
    const double psi = stage_params[r], S = D, pad = 16.0 * units * S;
    const double expected = 16 * psi / S + 4 * psi;
    const double allowance = pad + in_flight[r];
    expect_state_within(accounts[r], r, expected, allowance);
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelinedZero3,
                         ::testing::Values(PipeCase{"1f1b", 1}, PipeCase{"zb-h1", 1},
                                           PipeCase{"gpipe", 1}, PipeCase{"interleaved", 2}),
                         [](const auto& info) {
                           std::string name = info.param.schedule;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Interleaved chunks of different sizes each reuse their own activation buffers: after the
// first step no forward sizes a buffer set afresh. (With one pool for every chunk, a forward
// took a set sized for another chunk's blocks and resized it — freed and faulted in again —
// on most forwards, doubling interleaved's step on a VM.)
TEST(PipelineStage, ChunksReuseTheirOwnActivationBuffers) {
  const model::GptConfig cfg = small_gpt(6, 64);
  const int P = 2, V = 2, M = 4, B = 1, T = 16, steps = 3, units = cfg.n_layer + 2;
  std::vector<int> tokens, targets;
  random_tokens(5, static_cast<size_t>(steps) * M * B * T, tokens, targets);
  std::vector<size_t> first(P), later(P);
  run_ranks(P, Layout::kShm, "ppchunkpools", [&](comm::Communicator& c) {
    const parallel::Mesh mesh = parallel::Mesh::build(P, 1, P);
    const parallel::ProcessGroups groups =
        parallel::make_process_groups(c.shared_from_this(), mesh);
    model::Gpt m(cfg, /*own_storage=*/false);
    // Pieces of 1, 2, 3 and 2 units: stage 0 runs the embedding and blocks 2-4, stage 1
    // blocks 0-1 and block 5 with the head.
    parallel::PipelineStage stage(m, groups.pp, parallel::split_units({1, 2, 3, 2}, units, P * V),
                                  parallel::schedule_kind("interleaved"), M);
    parallel::DataParallel engine(m, groups, stage_options(stage, 0));
    parallel::StepComposer step(engine, groups);
    engine.init_weights(7);
    for (int s = 0; s < steps; ++s) {
      const size_t at = static_cast<size_t>(s) * M * B * T;
      engine.zero_grad();
      stage.train_step(tokens.data() + at, targets.data() + at, B, T, 1.0f / M, &engine);
      step.finish_gradients();
      if (s == 0) first[c.rank()] = m.activation_sizings();
    }
    later[c.rank()] = m.activation_sizings() - first[c.rank()];
  });
  for (int r = 0; r < P; ++r) {
    EXPECT_GE(first[r], 2u) << "rank " << r << ": the first step sizes both chunks' buffers";
    EXPECT_EQ(later[r], 0u) << "rank " << r << ": buffer sets sized afresh after the first step";
  }
}

// last_step_schedule: every stage gets the same run of the schedule over the step's measured
// passes (gathered from the group), each stage busy for its passes without their waits, and
// no faster than the step itself ran — a run with free transfers cannot end later than one
// with real ones, so the step's wall time bounds the simulated makespan from above.
TEST(PipelineStage, TheScheduleOfTheMeasuredPassesBoundsTheStep) {
  const model::GptConfig cfg = small_gpt(4, 64);
  const int P = 2, M = 4, B = 1, T = 16, units = cfg.n_layer + 2;
  std::vector<int> tokens, targets;
  random_tokens(6, static_cast<size_t>(M) * B * T, tokens, targets);
  std::vector<parallel::ScheduleTiming> timing(P);
  std::vector<double> wall(P), waited(P);
  run_ranks(P, Layout::kShm, "ppmeasured", [&](comm::Communicator& c) {
    const parallel::Mesh mesh = parallel::Mesh::build(P, 1, P);
    const parallel::ProcessGroups groups =
        parallel::make_process_groups(c.shared_from_this(), mesh);
    model::Gpt m(cfg, /*own_storage=*/false);
    parallel::PipelineStage stage(m, groups.pp, parallel::split_units({3, 3}, units, P),
                                  parallel::schedule_kind("zb-h1"), M);
    parallel::DataParallel engine(m, groups, stage_options(stage, 0));
    engine.init_weights(7);
    engine.zero_grad();
    c.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    stage.train_step(tokens.data(), targets.data(), B, T, 1.0f / M, &engine);
    wall[c.rank()] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    waited[c.rank()] = stage.wait_s();
    timing[c.rank()] = stage.last_step_schedule();
  });
  for (int r = 0; r < P; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(timing[r].busy, timing[0].busy);
    EXPECT_EQ(timing[r].makespan, timing[0].makespan);
    EXPECT_FALSE(timing[r].deadlock);
    EXPECT_GT(timing[0].busy[r], 0.0);
    EXPECT_LE(timing[0].busy[r], wall[r] - waited[r] + 1e-9);
    EXPECT_NEAR(timing[0].idle[r], timing[0].makespan - timing[0].busy[r], 1e-12);
  }
  EXPECT_LE(timing[0].makespan, *std::max_element(wall.begin(), wall.end()));
}

// The replica check (StepComposer::check_replicas) over data-parallel ranks whose weights
// differ (initialised from different seeds): ZeRO 0-2 hold whole replicas, so the check
// names the group and the ranks; ZeRO-3's shards are not replicas, so it passes. Equal
// seeds pass at every stage.
TEST(StepComposer, ReplicaCheckNamesTheGroupAndRanks) {
  for (int zero : {0, 2, 3})
    run_ranks(2, Layout::kShm, "replicas" + std::to_string(zero), [&](comm::Communicator& c) {
      model::Gpt m(small_gpt(2, 32), /*own_storage=*/false);
      parallel::DpOptions o;
      o.sharding = parallel::make_sharding_policy(zero);
      const parallel::ProcessGroups groups{nullptr, c.shared_from_this(), nullptr, nullptr,
                                           nullptr};
      parallel::DataParallel engine(m, groups, o);
      parallel::StepComposer step(engine, groups);
      engine.init_weights(7);
      EXPECT_NO_THROW(step.check_replicas("the initial weights", true));
      engine.init_weights(7 + c.rank());
      if (zero == 3) {
        EXPECT_NO_THROW(step.check_replicas("the initial weights", true));
        return;
      }
      try {
        step.check_replicas("the initial weights", true);
        ADD_FAILURE() << "zero " << zero << ": different replicas passed the check";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("the data-parallel replicas of the initial weights "
                                             "differ between ranks 0 and 1"),
                  std::string::npos)
            << e.what();
      }
      // Without across_dp (a checkpoint's moment: replicas were checked at the start) the
      // data-parallel copies are not compared.
      EXPECT_NO_THROW(step.check_replicas("the weights at step 5", false));
    });
}

}  // namespace
}  // namespace loom::test
