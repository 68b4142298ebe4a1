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
#include "loom/kernels/cpu/kernels.h"

namespace loom::model {
namespace {

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
  float loss = m.forward(tokens.data(), targets.data(), B, T);
  EXPECT_NEAR(loss, fx["loss"].get<double>(), 1e-5 * std::fabs(fx["loss"].get<double>()));
  auto want_logits = fx["logits"].get<std::vector<float>>();
  std::vector<float> got_logits;
  for (int n = 0; n < B * T; ++n)
    got_logits.insert(got_logits.end(), m.logits() + n * Vp, m.logits() + n * Vp + V);
  EXPECT_LT(normalised_error(got_logits.data(), want_logits), 1e-4);
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
}

}  // namespace
}  // namespace loom::model
