// `loom train [--config FILE] [--set key=value]... [--resume]` and
// `loom sample --ckpt DIR --prompt TEXT`.
#include "train.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "loom/ckpt/checkpoint.h"
#include "loom/core/error.h"
#include "loom/data/tokenizer.h"
#include "loom/model/gpt.h"
#include "loom/train/config.h"
#include "loom/train/trainer.h"

namespace loom::apps {

std::function<int()> add_train_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    bool resume = false, quiet = false, plan = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* t = app.add_subcommand("train", "train a GPT model (configs/*.toml)");
  t->add_option("--config,-c", a->config, "TOML config file");
  t->add_option("--set", a->overrides, "override a key: --set optim.lr=3e-4 (repeatable)");
  t->add_flag("--resume", a->resume, "continue from the newest checkpoint in run.dir");
  t->add_flag("--quiet", a->quiet, "no progress lines");
  t->add_flag("--plan", a->plan,
              "at the end, print the planner's prediction for this layout next to the "
              "measurement (and write run.dir/plan.json)");
  return [a]() -> int {
    train::TrainConfig cfg = train::TrainConfig::load(a->config, a->overrides);
    return train::train(std::move(cfg), {a->resume, a->quiet, a->plan});
  };
}

namespace {
// Index of the next token drawn from the first V logits at `temperature` (0: greedy),
// restricted to the top_k most likely (0: all).
int draw(const float* logits, int V, double temperature, int top_k, std::mt19937_64& rng) {
  if (temperature <= 0) return static_cast<int>(std::max_element(logits, logits + V) - logits);
  std::vector<int> idx(V);
  for (int i = 0; i < V; ++i) idx[i] = i;
  const int k = top_k > 0 ? std::min(top_k, V) : V;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<double> w(k);
  const double top = logits[idx[0]];
  for (int i = 0; i < k; ++i) w[i] = std::exp((logits[idx[i]] - top) / temperature);
  std::discrete_distribution<int> d(w.begin(), w.end());
  return idx[d(rng)];
}
}  // namespace

std::function<int()> add_sample_command(CLI::App& app) {
  struct Args {
    std::string ckpt, prompt = "\n", vocab;
    int tokens = 200, top_k = 40;
    double temperature = 0.8;
    uint64_t seed = 1;
  };
  auto a = std::make_shared<Args>();
  CLI::App* s = app.add_subcommand("sample", "generate text from a checkpoint");
  s->add_option("--ckpt", a->ckpt, "checkpoint folder, or a run.dir (its newest checkpoint)")
      ->required();
  s->add_option("--prompt", a->prompt, "text to continue");
  s->add_option("--tokens,-n", a->tokens, "tokens to generate (default 200)");
  s->add_option("--temperature", a->temperature, "softmax temperature; 0 = greedy (default 0.8)");
  s->add_option("--top-k", a->top_k, "sample among the k most likely tokens; 0 = all (default 40)");
  s->add_option("--seed", a->seed, "random seed (default 1)");
  s->add_option("--vocab", a->vocab, "r50k_base.tiktoken (default: the cached one)");
  return [a]() -> int {
    std::string dir = a->ckpt;
    if (!std::filesystem::exists(dir + "/manifest.json")) {
      std::string newest = ckpt::latest(dir + "/ckpt");
      if (newest.empty()) newest = ckpt::latest(dir);
      if (!newest.empty()) dir = newest;
    }
    ckpt::Reader r(dir);
    model::Gpt m(model::GptConfig::from_json(r.meta()["model"]));
    for (const auto& t : m.tensors())
      r.read("param/" + t.name, 0, static_cast<int64_t>(t.size), m.params() + t.offset);
    auto tok = data::Gpt2Tokenizer::load(a->vocab);
    data::Gpt2Tokenizer::Encoder enc(tok);
    std::vector<int> ids = enc.encode(a->prompt);
    if (ids.empty()) ids.push_back(data::Gpt2Tokenizer::kEndOfText);
    std::mt19937_64 rng(a->seed);
    const int ctx = m.config().block_size, V = m.config().vocab_size,
              Vp = m.config().padded_vocab_size;
    std::vector<int> generated;
    for (int n = 0; n < a->tokens; ++n) {
      const int T = static_cast<int>(std::min<size_t>(ids.size(), ctx));
      m.forward(ids.data() + ids.size() - T, nullptr, 1, T);
      const int next =
          draw(m.logits() + static_cast<size_t>(T - 1) * Vp, V, a->temperature, a->top_k, rng);
      if (next == data::Gpt2Tokenizer::kEndOfText) break;
      ids.push_back(next);
      generated.push_back(next);
    }
    // Decoded as a whole: a character may span tokens.
    std::printf("%s%s\n", a->prompt.c_str(), tok->decode(generated).c_str());
    return 0;
  };
}

}  // namespace loom::apps
