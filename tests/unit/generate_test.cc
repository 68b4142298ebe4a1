// Generation with the key/value cache (model/generate.h) against full-window generation
// (Gpt::forward over the whole window for every token): the logits of every step within
// 1e-4 of the largest, the same greedy tokens for 64 tokens, alone and in a batch of prompts
// of different lengths, and across the window's end; bf16 weight copies close to fp32;
// sampling's top-k / top-p / temperature against their definitions.
#include "loom/model/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "loom/core/error.h"

namespace loom::model {
namespace {

constexpr int kEot = 999;  // the last of this model's tokens

// A 2-layer model with a 128-position window and 1000 tokens. Weights scaled up from GPT-2's init
// so that attention is peaked (at N(0, 0.02) every row attends almost uniformly, which would hide
// a wrong position or a stale cache entry).
Gpt& model() {
  static Gpt* m = [] {
    GptConfig c;
    c.n_layer = 2, c.n_head = 4, c.n_embd = 64, c.block_size = 128;
    c.vocab_size = 1000, c.padded_vocab_size = 1024;
    auto* g = new Gpt(c);
    g->init(7);
    for (size_t i = 0; i < g->num_params(); ++i) g->params()[i] *= 6;
    return g;
  }();
  return *m;
}

std::vector<int> prompt(int n, int salt) {
  std::vector<int> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 7919 + salt * 104729) % 999;
  return p;
}

SampleOptions greedy() {
  SampleOptions o;
  o.temperature = 0;
  return o;
}

// Two rows of Vp logits: the largest |want| and the largest |got - want|.
struct Gap {
  float scale = 0, err = 0;
};
Gap gap(const float* got, const float* want, int Vp) {
  Gap g;
  for (int v = 0; v < Vp; ++v) {
    g.scale = std::max(g.scale, std::fabs(want[v]));
    g.err = std::max(g.err, std::fabs(got[v] - want[v]));
  }
  return g;
}

// The logits after each prefix of `seq` (from `from` on): the cache's, token by token, and
// the full forward's, must agree.
TEST(Generate, CacheLogitsMatchFullForward) {
  Gpt& m = model();
  const int Vp = m.config().padded_vocab_size;
  const std::vector<int> seq = prompt(100, 1);
  KvDecoder dec(m, 1);
  const float* got = dec.prefill(0, seq.data(), 20);
  for (int t = 20;; ++t) {
    m.forward(seq.data(), nullptr, 1, t);
    const float* want = m.logits() + static_cast<size_t>(t - 1) * Vp;
    const Gap g = gap(got, want, Vp);
    ASSERT_GT(g.scale, 1.0f);
    ASSERT_LE(g.err, 1e-4f * g.scale) << "after " << t << " tokens";
    if (t == static_cast<int>(seq.size())) break;
    got = dec.step({0}, &seq[t]);
  }
  EXPECT_EQ(dec.length(0), 100);
}

// --dtype bf16: decode steps read bf16 copies of the matrices. The logits stay within 1e-2
// (relative to the largest) of fp32's, and differ from them (the copies are read).
TEST(Generate, Bf16WeightsStayCloseToFp32) {
  GptConfig c = model().config();  // GPT-2's initialisation, not scaled up
  Gpt m(c);
  m.init(8);
  const int Vp = m.config().padded_vocab_size;
  const std::vector<int> seq = prompt(60, 10);
  KvDecoder f32(m, 1), bf16(m, 1, true);
  f32.prefill(0, seq.data(), 30);
  bf16.prefill(0, seq.data(), 30);
  float worst = 0, moved = 0;
  for (int t = 30; t < 60; ++t) {
    const float* a = f32.step({0}, &seq[t]);
    const std::vector<float> want(a, a + Vp);
    const float* got = bf16.step({0}, &seq[t]);
    const Gap g = gap(got, want.data(), Vp);
    worst = std::max(worst, g.err / g.scale);
    moved = std::max(moved, g.err);
  }
  std::printf("bf16 weights: logits within %.2e of the largest fp32 logit\n", worst);
  EXPECT_LT(worst, 1e-2f);
  EXPECT_GT(moved, 0.0f);
}

TEST(Generate, GreedyTokensEqualFullWindow) {
  const std::vector<std::vector<int>> prompts = {prompt(40, 2)};
  const auto want = generate(model(), prompts, 64, greedy(), false, kEot);
  const auto got = generate(model(), prompts, 64, greedy(), true, kEot);
  ASSERT_EQ(want[0].size(), 64u);
  EXPECT_EQ(got, want);
  // Not a fixed point: the model must produce varied text for this to test positions.
  std::map<int, int> distinct;
  for (int t : want[0]) ++distinct[t];
  EXPECT_GT(distinct.size(), 8u);
}

// A batch of prompts of different lengths gives each prompt the tokens it gets alone.
TEST(Generate, BatchOfPromptsEqualsEachAlone) {
  const std::vector<std::vector<int>> prompts = {prompt(5, 3), prompt(37, 4), prompt(1, 5)};
  const auto batch = generate(model(), prompts, 48, greedy(), true, kEot);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto alone = generate(model(), {prompts[b]}, 48, greedy(), false, kEot);
    EXPECT_EQ(batch[b], alone[0]) << "prompt " << b;
  }
}

// Past the window: inside it the tokens equal full-window generation; after, the cache
// restarts from the last half window and generation goes on to the requested length.
TEST(Generate, PastTheWindow) {
  const std::vector<std::vector<int>> prompts = {prompt(100, 6)};
  const auto full = generate(model(), prompts, 28, greedy(), false, kEot);
  const auto got = generate(model(), prompts, 300, greedy(), true, kEot);
  ASSERT_EQ(got[0].size(), 300u);
  EXPECT_TRUE(std::equal(full[0].begin(), full[0].end(), got[0].begin()));
  // The 29th new token fills the cache (128 positions); it restarts from the last 64 tokens,
  // so the next 64 are what the full-window reference makes from those 64 alone.
  std::vector<int> ids = prompts[0];
  ids.insert(ids.end(), got[0].begin(), got[0].begin() + 29);
  const std::vector<std::vector<int>> tail = {std::vector<int>(ids.end() - 64, ids.end())};
  const auto after = generate(model(), tail, 64, greedy(), false, kEot);
  ASSERT_EQ(after[0].size(), 64u);
  EXPECT_TRUE(std::equal(after[0].begin(), after[0].end(), got[0].begin() + 29))
      << "the tokens after the cache restarted differ from the reference";
  // A prompt longer than the window: both read its last 128 tokens for the first token;
  // then the cache, full, restarts from the last 64.
  const std::vector<std::vector<int>> longer = {prompt(300, 7)};
  const auto restarted = generate(model(), longer, 20, greedy(), true, kEot);
  ASSERT_EQ(restarted[0].size(), 20u);
  EXPECT_EQ(restarted[0][0], generate(model(), longer, 1, greedy(), false, kEot)[0][0]);
}

TEST(Generate, SamplingIsDeterministicForASeed) {
  SampleOptions o;
  o.temperature = 1.0, o.top_k = 0, o.seed = 11;
  const std::vector<std::vector<int>> prompts = {prompt(10, 8), prompt(10, 9)};
  const auto a = generate(model(), prompts, 30, o, true, kEot);
  EXPECT_EQ(a, generate(model(), prompts, 30, o, true, kEot));
  EXPECT_EQ(a, generate(model(), prompts, 30, o, false, kEot));  // same draws, same logits
  o.seed = 12;
  EXPECT_NE(a, generate(model(), prompts, 30, o, true, kEot));
}

// Draw frequencies against the distribution each option defines (logits log p).
TEST(Generate, TopKTopPTemperature) {
  const std::vector<float> logits = {std::log(0.1f), std::log(0.4f), std::log(0.2f),
                                     std::log(0.3f)};
  auto freq = [&](SampleOptions o) {
    std::mt19937_64 rng(5);
    std::vector<double> f(4);
    const int n = 200000;
    for (int i = 0; i < n; ++i) f[draw_token(logits.data(), 4, o, rng)] += 1.0 / n;
    return f;
  };
  auto expect_near = [](const std::vector<double>& got, const std::vector<double>& want) {
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 0.005) << i;
  };
  SampleOptions o;
  o.temperature = 1, o.top_k = 0;
  expect_near(freq(o), {0.1, 0.4, 0.2, 0.3});
  o.top_k = 2;  // 0.4 and 0.3, renormalised
  expect_near(freq(o), {0, 4.0 / 7, 0, 3.0 / 7});
  o.top_k = 0, o.top_p = 0.5;  // 0.4 < 0.5 <= 0.4 + 0.3
  expect_near(freq(o), {0, 4.0 / 7, 0, 3.0 / 7});
  o.top_p = 0.95;  // 0.9 < 0.95: all four
  expect_near(freq(o), {0.1, 0.4, 0.2, 0.3});
  o.top_p = 1, o.temperature = 0.5;  // p^2, renormalised
  expect_near(freq(o), {0.01 / 0.3, 0.16 / 0.3, 0.04 / 0.3, 0.09 / 0.3});
  o.temperature = 0;
  expect_near(freq(o), {0, 1, 0, 0});
}

TEST(Generate, BadOptionsAreUserErrors) {
  SampleOptions o;
  o.top_p = 0;
  EXPECT_THROW(o.validate(), UserError);
  o.top_p = 1.5;
  EXPECT_THROW(o.validate(), UserError);
  o = {};
  o.temperature = -1;
  EXPECT_THROW(o.validate(), UserError);
  o = {};
  o.top_k = -3;
  EXPECT_THROW(o.validate(), UserError);
}

}  // namespace
}  // namespace loom::model
