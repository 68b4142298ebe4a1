// `loom prep --input FILES... --out DIR`: text corpus -> GPT-2 token shards.
#include "prep.h"

#include <cstdio>

#include "loom/core/error.h"
#include "loom/core/tunable.h"
#include "loom/data/prep.h"

namespace loom::apps {

std::function<int()> add_prep_command(CLI::App& app) {
  struct Args {
    std::vector<std::string> inputs;
    std::string out, tokenizer = "gpt2", shard_size = "1GiB", vocab;
    double val_fraction = 0.01;
    int threads = 0;
    bool quiet = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* p =
      app.add_subcommand("prep", "turn text files or folders (.txt, .gz, .xz) into token shards");
  p->add_option("--input,-i", a->inputs, "files or folders")->required();
  p->add_option("--out,-o", a->out, "output folder (must not exist)")->required();
  p->add_option("--tokenizer", a->tokenizer, "gpt2");
  p->add_option("--shard-size", a->shard_size, "token bytes per shard, e.g. 64MiB (default 1GiB)");
  p->add_option("--val-fraction", a->val_fraction,
                "share of ~64 KiB chunks held out (default 0.01)");
  p->add_option("--threads", a->threads, "tokenizer threads (default: every core)");
  p->add_option("--vocab", a->vocab, "r50k_base.tiktoken (default: the cached one)");
  p->add_flag("--quiet", a->quiet, "no progress bar");
  return [a]() -> int {
    if (a->tokenizer != "gpt2")
      throw UserError("--tokenizer '" + a->tokenizer + "' is not known", "use gpt2");
    data::PrepOptions o;
    o.inputs = a->inputs;
    o.out = a->out;
    o.shard_bytes = parse_bytes(a->shard_size, "--shard-size");
    o.val_fraction = a->val_fraction;
    o.threads = a->threads;
    o.progress = !a->quiet;
    auto tok = data::Gpt2Tokenizer::load(a->vocab);
    data::PrepSummary s = data::run_prep(o, tok);
    std::printf(
        "prep: %llu file(s), %.1f MB read, %.1f MB of text -> %llu train tokens in %d shard(s), "
        "%llu val tokens in %d shard(s); %.1f s, %.1f MB/s -> %s\n",
        static_cast<unsigned long long>(s.files), s.input_bytes / 1e6, s.text_bytes / 1e6,
        static_cast<unsigned long long>(s.train_tokens), s.train_shards,
        static_cast<unsigned long long>(s.val_tokens), s.val_shards, s.seconds,
        s.text_bytes / 1e6 / std::max(s.seconds, 1e-9), o.out.c_str());
    return 0;
  };
}

}  // namespace loom::apps
