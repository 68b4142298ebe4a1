// `loom train [--config FILE] [--set key=value]... [--resume]` and
// `loom sample --ckpt DIR --prompt TEXT`.
#include "train.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "loom/ckpt/checkpoint.h"
#include "loom/core/error.h"
#include "loom/data/tokenizer.h"
#include "loom/interop/model_files.h"
#include "loom/model/generate.h"
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

std::function<int()> add_sample_command(CLI::App& app) {  // generate text from any model file
  struct Args {
    std::string ckpt, vocab, dtype = "fp32";
    std::vector<std::string> prompts;
    int tokens = 200;
    model::SampleOptions o;
    bool no_cache = false, stats = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* s = app.add_subcommand("sample", "generate text from a checkpoint");
  s->add_option("--ckpt,--model", a->ckpt,
                "a checkpoint folder or run.dir (its newest checkpoint), a Hugging Face GPT-2 "
                "folder or a .safetensors file")
      ->required();
  s->add_option("--prompt", a->prompts,
                "text to continue; repeat it for a batch of prompts (default: a new line)");
  s->add_option("--tokens,-n", a->tokens, "tokens to generate per prompt (default 200)");
  s->add_option("--temperature", a->o.temperature, "softmax temperature; 0 = greedy (default 0.8)");
  s->add_option("--top-k", a->o.top_k,
                "sample among the k most likely tokens; 0 = all (default 40)");
  s->add_option("--top-p", a->o.top_p,
                "... and among the fewest most likely holding this much probability (default 1)");
  s->add_option("--seed", a->o.seed, "random seed (default 1)");
  s->add_option("--vocab", a->vocab, "r50k_base.tiktoken (default: the cached one)");
  s->add_option("--dtype", a->dtype,
                "fp32, or bf16: decode reading bf16 copies of the weight matrices (about twice "
                "as fast; logits within ~1e-2, so text may differ) (default fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  s->add_flag("--no-cache", a->no_cache,
              "no key/value cache: the whole window again for every token (slow; the reference)");
  s->add_flag("--stats", a->stats, "print the prompt and generation speeds to stderr");
  return [a]() -> int {
    a->o.bf16_weights = a->dtype == "bf16";
    if (a->o.bf16_weights && a->no_cache)
      throw UserError("--dtype bf16 applies to the key/value cache's decoding",
                      "leave out --no-cache, or use --dtype fp32");
    a->o.validate();
    if (a->tokens < 0)
      throw UserError("--tokens " + std::to_string(a->tokens) + " is negative",
                      "the number of tokens to generate per prompt, e.g. -n 200");
    const interop::ModelFile mf = interop::open_model(a->ckpt);
    model::Gpt m(mf.config, true, {}, /*with_grads=*/false);
    interop::load_params(*mf.weights, m);
    auto tok = data::Gpt2Tokenizer::load(a->vocab);
    data::Gpt2Tokenizer::Encoder enc(tok);
    if (a->prompts.empty()) a->prompts.push_back("\n");
    std::vector<std::vector<int>> ids;
    size_t prompt_tokens = 0;
    for (const auto& p : a->prompts) {
      ids.push_back(enc.encode(p));
      if (ids.back().empty()) ids.back().push_back(data::Gpt2Tokenizer::kEndOfText);
      prompt_tokens += ids.back().size();
    }
    model::GenerateStats st;
    const auto out = model::generate(m, ids, a->tokens, a->o, !a->no_cache,
                                     data::Gpt2Tokenizer::kEndOfText, &st);
    size_t generated = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      if (i > 0) std::printf("----\n");
      // Decoded as a whole: a character may span tokens.
      std::printf("%s%s\n", a->prompts[i].c_str(), tok->decode(out[i]).c_str());
      generated += out[i].size();
    }
    if (a->stats) {
      // Each prompt's first new token comes from its prompt's forward; the rest one by one.
      const double gen_s = st.total_s - st.first_token_s;
      const size_t stepped = generated - std::min(generated, out.size());
      std::fprintf(stderr,
                   "loom sample: %zu prompt(s), %zu prompt tokens: first new token after %.3f s; "
                   "%zu more new tokens in %.3f s: %.1f tokens/s (key/value cache %s, %s)\n",
                   out.size(), prompt_tokens, st.first_token_s, stepped, gen_s,
                   gen_s > 0 ? stepped / gen_s : 0.0, a->no_cache ? "off" : "on", a->dtype.c_str());
    }
    return 0;
  };
}

}  // namespace loom::apps
