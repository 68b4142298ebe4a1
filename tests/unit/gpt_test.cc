// loom's GPT against PyTorch 1.13 (tests/reference/gpt_fixture.py): same weights, same
// batch; logits and every parameter gradient within 1e-4 (normalised max error per
// tensor), the loss within 1e-5, and 10 AdamW steps with the same loss trajectory.
#include "loom/model/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/float_env.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::model {
namespace {

// Subnormals flushed as `loom` flushes them (LOOM_FLUSH_DENORMALS, default on), set before
// the first OpenMP region so that every worker inherits it: the fixtures hold with it.
class FlushDenormals : public ::testing::Environment {
  void SetUp() override { flush_denormals_from_env(); }
};
[[maybe_unused]] const auto* const kFlush = ::testing::AddGlobalTestEnvironment(new FlushDenormals);

nlohmann::json fixture() {
  const char* path = std::getenv("LOOM_GPT_FIXTURE");
  if (!path) throw std::runtime_error("set LOOM_GPT_FIXTURE (CTest does)");
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

GptConfig config_of(const nlohmann::json& j) {
  GptConfig c;
  c.name = "fixture";
  c.n_layer = j["n_layer"], c.n_head = j["n_head"], c.n_embd = j["n_embd"];
  c.block_size = j["block_size"], c.vocab_size = j["vocab_size"];
  c.padded_vocab_size = j["padded_vocab_size"];
  return c;
}

// Loads the fixture's weights into the model's flat buffer (wte gets zero padding rows).
void load(Gpt& m, const nlohmann::json& params) {
  std::fill(m.params(), m.params() + m.num_params(), 0.0f);
  for (const Tensor& t : m.tensors()) {
    auto v = params.at(t.name).get<std::vector<float>>();
    ASSERT_LE(v.size(), t.size) << t.name;
    if (t.name != "wte") {
      ASSERT_EQ(v.size(), t.size) << t.name;
    }
    std::copy(v.begin(), v.end(), m.params() + t.offset);
  }
}

double normalised_error(const float* got, const std::vector<float>& want) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(want[i])));
  }
  return err / (mag + 1e-30);
}

TEST(Gpt, MatchesPyTorchLogitsLossAndGradients) {
  auto fx = fixture();
  Gpt m(config_of(fx["config"]));
  load(m, fx["params"]);
  const int B = fx["B"], T = fx["T"], V = m.config().vocab_size, Vp = m.config().padded_vocab_size;
  auto tokens = fx["tokens"].get<std::vector<int>>(),
       targets = fx["targets"].get<std::vector<int>>();
  m.forward(tokens.data(), nullptr, B, T);  // inference: the logits stay readable
  auto want_logits = fx["logits"].get<std::vector<float>>();
  std::vector<float> got_logits;
  for (int n = 0; n < B * T; ++n)
    got_logits.insert(got_logits.end(), m.logits() + n * Vp, m.logits() + n * Vp + V);
  EXPECT_LT(normalised_error(got_logits.data(), want_logits), 1e-4);
  float loss = m.forward(tokens.data(), targets.data(), B, T);
  EXPECT_NEAR(loss, fx["loss"].get<double>(), 1e-5 * std::fabs(fx["loss"].get<double>()));
  m.zero_grad();
  m.backward();
  for (const Tensor& t : m.tensors()) {
    auto want = fx["grads"].at(t.name).get<std::vector<float>>();
    EXPECT_LT(normalised_error(m.grads() + t.offset, want), 1e-4) << t.name;
  }
  // padded vocabulary rows get no gradient
  for (size_t i = static_cast<size_t>(V) * m.config().n_embd;
       i < static_cast<size_t>(Vp) * m.config().n_embd; ++i)
    ASSERT_EQ(m.grads()[i], 0.0f);
}

TEST(Gpt, TenAdamWStepsFollowPyTorchsLossTrajectory) {
  auto fx = fixture();
  Gpt m(config_of(fx["config"]));
  load(m, fx["params"]);
  const int B = fx["B"], T = fx["T"];
  auto tokens = fx["tokens"].get<std::vector<int>>(),
       targets = fx["targets"].get<std::vector<int>>();
  const auto& opt = fx["adamw"];
  auto want = opt["losses"].get<std::vector<double>>();
  std::vector<float> mom(m.num_params(), 0), var(m.num_params(), 0);
  for (size_t step = 0; step < want.size(); ++step) {
    m.zero_grad();
    float loss = m.forward(tokens.data(), targets.data(), B, T);
    EXPECT_NEAR(loss, want[step], 1e-5 * std::fabs(want[step])) << "step " << step;
    m.backward();
    for (const Tensor& t : m.tensors())
      kernels::cpu::adamw_update(
          m.params() + t.offset, m.grads() + t.offset, mom.data() + t.offset, var.data() + t.offset,
          t.size, opt["lr"], opt["beta1"], opt["beta2"], opt["eps"],
          t.decay ? opt["weight_decay"].get<float>() : 0.0f, static_cast<int>(step) + 1);
  }
}

// One forward + backward of the fixture batch; returns the loss, gradients in m.grads().
float step_of(Gpt& m, const nlohmann::json& fx) {
  auto tokens = fx["tokens"].get<std::vector<int>>(),
       targets = fx["targets"].get<std::vector<int>>();
  m.zero_grad();
  float loss = m.forward(tokens.data(), targets.data(), fx["B"], fx["T"]);
  m.backward();
  return loss;
}

TEST(Gpt, RecomputeGivesIdenticalLossAndGradients) {
  auto fx = fixture();
  Gpt ref(config_of(fx["config"]));
  load(ref, fx["params"]);
  const float want = step_of(ref, fx);
  for (int every : {1, 2}) {
    Gpt m(config_of(fx["config"]));
    load(m, fx["params"]);
    m.set_recompute_every(every);
    EXPECT_EQ(step_of(m, fx), want) << "recompute every " << every;
    for (size_t i = 0; i < m.num_params(); ++i)
      ASSERT_EQ(m.grads()[i], ref.grads()[i]) << "recompute every " << every << " at " << i;
    if (every == 1) {
      EXPECT_LT(m.activation_bytes(), ref.activation_bytes());
    }
  }
}

// Units bound to caller-owned buffers (as ZeRO-3 does) compute what owned storage does, and
// the hooks see every use bracketed and each unit's gradients finished once, in reverse.
TEST(Gpt, ExternalUnitStorageAndHookOrder) {
  auto fx = fixture();
  Gpt ref(config_of(fx["config"]));
  load(ref, fx["params"]);
  const float want = step_of(ref, fx);

  Gpt m(config_of(fx["config"]), /*own_storage=*/false);
  std::vector<std::vector<float>> p(m.num_units()), g(m.num_units());
  for (int u = 0; u < m.num_units(); ++u) {
    auto [b, e] = m.unit_range(u);
    p[u].assign(ref.params() + b, ref.params() + e);
    g[u].assign(e - b, 0.0f);
    m.bind_unit(u, p[u].data(), g[u].data());
  }
  struct Recorder : UnitHooks {
    std::vector<std::string> events;
    int in_use = -1;
    void before_use(int u) override {
      EXPECT_EQ(in_use, -1) << "unit " << u << " used while " << in_use << " is in use";
      in_use = u;
    }
    void after_use(int u) override {
      EXPECT_EQ(in_use, u);
      in_use = -1;
    }
    void grads_ready(int u) override { events.push_back("g" + std::to_string(u)); }
  } rec;
  m.set_hooks(&rec);
  EXPECT_EQ(step_of(m, fx), want);
  for (int u = 0; u < m.num_units(); ++u) {
    auto [b, e] = m.unit_range(u);
    for (size_t i = b; i < e; ++i) ASSERT_EQ(g[u][i - b], ref.grads()[i]) << "unit " << u;
  }
  std::vector<std::string> order;
  for (int u = m.num_units() - 1; u >= 0; --u) order.push_back("g" + std::to_string(u));
  EXPECT_EQ(rec.events, order);
}

// bf16 products (fp32 accumulation, fp32 master weights) stay close to fp32 but do differ.
TEST(Gpt, Bf16ComputeIsCloseToFp32) {
  auto fx = fixture();
  Gpt m(config_of(fx["config"]));
  load(m, fx["params"]);
  const float f32 = step_of(m, fx);
  m.set_precision(kernels::cpu::Precision::kBF16);
  const float bf16 = step_of(m, fx);
  EXPECT_NE(bf16, f32);
  EXPECT_NEAR(bf16, f32, 1e-2 * f32);
}

// The bf16 copies of the weights (made once per forward, read by the forward's and the
// backward's products) hold exactly the bits each product rounded before: the same loss
// and gradients bit for bit, with recompute too, and after the parameters change between
// steps (an optimizer update: the next forward rounds them again).
//
// Likewise the roundings of activations and gradients written by the passes that produce
// them, and operands rounded once for two products (set_bf16_staging): `without` has
// neither, so each of its products rounds its own operands.
TEST(Gpt, Bf16WeightCopiesChangeNoBit) {
  if (!kernels::cpu::native_bf16()) GTEST_SKIP() << "no native bf16 products on this CPU";
  auto fx = fixture();
  Gpt with(config_of(fx["config"])), without(config_of(fx["config"]));
  without.set_bf16_weight_copies(false);
  without.set_bf16_staging(false);
  for (Gpt* m : {&with, &without}) {
    load(*m, fx["params"]);
    m->set_precision(kernels::cpu::Precision::kBF16);
    m->set_recompute_every(2);
  }
  for (int step = 0; step < 3; ++step) {
    ASSERT_EQ(step_of(with, fx), step_of(without, fx)) << "step " << step;
    for (size_t i = 0; i < with.num_params(); ++i)
      ASSERT_EQ(with.grads()[i], without.grads()[i]) << "step " << step << " at " << i;
    for (Gpt* m : {&with, &without})  // plain SGD: every weight changes
      for (size_t i = 0; i < m->num_params(); ++i) m->params()[i] -= 0.5f * m->grads()[i];
  }
}

// ---- runs of units (pipeline stages), split backward, microbatches in flight ----

// One step of the fixture batch as runs of units (a pipeline's stages in one process: each
// run's output is the next one's input, each run's input gradient the previous one's
// output gradient), with `part` kWhole or kInput followed by kWeight.
float staged_step(Gpt& m, const nlohmann::json& fx, const std::vector<std::pair<int, int>>& runs,
                  bool split) {
  auto tokens = fx["tokens"].get<std::vector<int>>(),
       targets = fx["targets"].get<std::vector<int>>();
  const int B = fx["B"], T = fx["T"];
  std::vector<Activations> acts(runs.size());
  m.zero_grad();
  float loss = 0;
  const float* x = nullptr;
  for (size_t i = 0; i < runs.size(); ++i) {
    loss = m.forward_units(acts[i], runs[i].first, runs[i].second, tokens.data(), targets.data(), B,
                           T, x);
    x = m.output(acts[i]);
  }
  const float* d = nullptr;
  for (size_t i = runs.size(); i-- > 0;) {
    m.backward_units(acts[i], 1.0f, d, split ? BackwardPart::kInput : BackwardPart::kWhole);
    d = m.input_grad(acts[i]);
  }
  for (size_t i = runs.size(); split && i-- > 0;)
    m.backward_units(acts[i], 1.0f, nullptr, BackwardPart::kWeight);
  return loss;
}

// The same kernels in the same order: every way of cutting the model, whole or split
// backward, with or without recompute, gives the whole model's loss and gradients bit for
// bit.
TEST(Gpt, RunsOfUnitsAndSplitBackwardEqualTheWholeModel) {
  auto fx = fixture();
  Gpt ref(config_of(fx["config"]));
  load(ref, fx["params"]);
  const float want = step_of(ref, fx);
  const int head = ref.config().n_layer + 1;
  ASSERT_GE(head, 3);
  const std::vector<std::vector<std::pair<int, int>>> cuts = {
      {{0, head}}, {{0, 1}, {2, head}}, {{0, 0}, {1, head - 1}, {head, head}}};
  for (int recompute : {0, 1})
    for (const auto& runs : cuts)
      for (bool split : {false, true}) {
        SCOPED_TRACE("runs " + std::to_string(runs.size()) + (split ? " split" : " whole") +
                     " recompute " + std::to_string(recompute));
        Gpt m(config_of(fx["config"]));
        load(m, fx["params"]);
        m.set_recompute_every(recompute);
        EXPECT_EQ(staged_step(m, fx, runs, split), want);
        for (size_t i = 0; i < m.num_params(); ++i)
          ASSERT_EQ(m.grads()[i], ref.grads()[i]) << "element " << i;
      }
}

// Two microbatches' forwards before either backward (as a pipeline holds them): the same
// gradients as one after the other.
TEST(Gpt, MicrobatchesInFlightKeepTheirOwnActivations) {
  auto fx = fixture();
  auto tokens = fx["tokens"].get<std::vector<int>>(),
       targets = fx["targets"].get<std::vector<int>>();
  const int B = fx["B"], T = fx["T"], head = config_of(fx["config"]).n_layer + 1;
  std::vector<int> other(tokens.rbegin(), tokens.rend());  // a second microbatch
  Gpt a(config_of(fx["config"])), b(config_of(fx["config"]));
  load(a, fx["params"]);
  load(b, fx["params"]);
  a.zero_grad();
  const float la0 = a.forward(tokens.data(), targets.data(), B, T);
  a.backward(0.5f);
  const float la1 = a.forward(other.data(), targets.data(), B, T);
  a.backward(0.5f);
  Activations m0, m1;
  b.zero_grad();
  EXPECT_EQ(b.forward_units(m0, 0, head, tokens.data(), targets.data(), B, T, nullptr), la0);
  EXPECT_EQ(b.forward_units(m1, 0, head, other.data(), targets.data(), B, T, nullptr), la1);
  b.backward_units(m0, 0.5f, nullptr, BackwardPart::kWhole);
  b.backward_units(m1, 0.5f, nullptr, BackwardPart::kInput);
  b.backward_units(m1, 0.5f, nullptr, BackwardPart::kWeight);
  for (size_t i = 0; i < a.num_params(); ++i) ASSERT_EQ(b.grads()[i], a.grads()[i]) << i;
  EXPECT_GT(m1.bytes(), m1.block_bytes());
}

// The head split (pipeline: stage 0 runs the head over rows [0, r)): the last run's forward
// hands those rows of the final norm's output out and computes the rest; head_share gives
// their loss, wte gradient and input gradient, which the backward takes before the final
// norm's. The loss and gradients equal the whole model's up to summation order (the head's
// weight gradient is two partial products), for whole and split backwards, r from 1 to N-1.
TEST(Gpt, TheHeadSplitEqualsTheWholeModel) {
  auto fx = fixture();
  auto tokens = fx["tokens"].get<std::vector<int>>(),
       targets = fx["targets"].get<std::vector<int>>();
  const int B = fx["B"], T = fx["T"], N = B * T;
  Gpt ref(config_of(fx["config"]));
  load(ref, fx["params"]);
  const float want = step_of(ref, fx);
  const int head = ref.config().n_layer + 1, C = ref.config().n_embd;
  for (int r : {1, N / 2, N - 1})
    for (bool split : {false, true}) {
      SCOPED_TRACE("rows " + std::to_string(r) + (split ? " B + W" : " BW"));
      Gpt m(config_of(fx["config"]));
      load(m, fx["params"]);
      m.zero_grad();
      std::vector<float> ln, dln(static_cast<size_t>(r) * C);
      HeadShare share{r, [&](const float* x) { ln.assign(x, x + dln.size()); },
                      [&] { return dln.data(); }};
      Activations first, last;
      m.forward_units(first, 0, 1, tokens.data(), nullptr, B, T, nullptr);
      const float own =
          m.forward_units(last, 2, head, nullptr, targets.data(), B, T, m.output(first), &share);
      ASSERT_EQ(ln.size(), dln.size());
      const float other = m.head_share(ln.data(), targets.data(), r, N, 1.0f, dln.data());
      EXPECT_NEAR(own + other, want, 1e-6f * want);
      const BackwardPart part = split ? BackwardPart::kInput : BackwardPart::kWhole;
      m.backward_units(last, 1.0f, nullptr, part, &share);
      m.backward_units(first, 1.0f, m.input_grad(last), part);
      if (split) {
        m.backward_units(last, 1.0f, nullptr, BackwardPart::kWeight);
        m.backward_units(first, 1.0f, nullptr, BackwardPart::kWeight);
      }
      double worst = 0, scale = 0;
      for (size_t i = 0; i < m.num_params(); ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(m.grads()[i] - ref.grads()[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(ref.grads()[i])));
      }
      EXPECT_LT(worst, 1e-5 * scale) << "largest gradient " << scale;
    }
}

TEST(Gpt, NamedConfigsAndValidation) {
  GptConfig s = GptConfig::named("small");
  EXPECT_EQ(s.n_layer, 6);
  EXPECT_EQ(s.n_embd, 384);
  EXPECT_EQ(s.padded_vocab_size % 128, 0);
  Gpt g(GptConfig::named("gpt2-124m"));
  // 124M without the position embeddings' share counted twice: the classic 124,439,808
  // plus the 47 padding rows of wte (47 x 768).
  EXPECT_EQ(g.num_params(), 124439808u + 47u * 768u);
  EXPECT_THROW(GptConfig::named("gpt5"), UserError);
  GptConfig bad = GptConfig::named("tiny");
  bad.n_embd = 63;
  EXPECT_THROW(Gpt{bad}, UserError);
  EXPECT_EQ(g.num_units(), 12 + 2);
  // 6 x (124,439,808 - 1024 x 768 position embeddings) + 12 x 12 layers x 768 x T
  EXPECT_DOUBLE_EQ(g.config().flops_per_token(1024), 6.0 * 123653376 + 12.0 * 12 * 768 * 1024);
}

}  // namespace
}  // namespace loom::model
