// `loom prep --input FILES... --out DIR`: a text or JSON Lines corpus -> GPT-2 token shards.
#include "prep.h"

#include <cstdio>

#include "loom/core/error.h"
#include "loom/core/tunable.h"
#include "loom/data/prep.h"

namespace loom::apps {

std::function<int()> add_prep_command(CLI::App& app) {
  struct Args {
    std::vector<std::string> inputs, where;
    std::string out, tokenizer = "gpt2", shard_size = "1GiB", vocab, format = "auto",
                     text_key = "text";
    double val_fraction = 0.01;
    int threads = 0;
    bool quiet = false, skip_bad = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* p = app.add_subcommand(
      "prep",
      "turn text or JSON Lines files or folders (.txt, .jsonl, .json; plain, .gz, .xz or .zst) "
      "into token shards");
  p->add_option("--input,-i", a->inputs, "files or folders; - reads standard input")->required();
  p->add_option("--out,-o", a->out, "output folder (must not exist)")->required();
  p->add_option("--format", a->format,
                "auto: by name (.jsonl/.json[.gz|.xz|.zst] are JSON Lines, the rest text, - text); "
                "text or jsonl: every input (default auto)");
  p->add_option("--text-key", a->text_key,
                "JSON Lines: the document's field, a dotted path (default text)");
  p->add_option("--where", a->where,
                "JSON Lines: keep records whose field equals a value, e.g. "
                "meta.pile_set_name=Wikipedia (repeatable: all must match)");
  p->add_flag("--skip-bad", a->skip_bad,
              "JSON Lines: count and skip bad records instead of stopping at the first");
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
    o.format = a->format;
    o.records.text_key = a->text_key;
    for (const auto& w : a->where) o.records.where.push_back(data::parse_where(w));
    o.skip_bad = a->skip_bad;
    auto tok = data::Gpt2Tokenizer::load(a->vocab);
    data::PrepSummary s = data::run_prep(o, tok);
    std::printf(
        "prep: %llu input(s), %.1f MB read (%.1f MB decompressed), %llu document(s), %.1f MB of "
        "text -> %llu train tokens in %d shard(s), %llu val tokens in %d shard(s); %.1f s, "
        "%.1f MB/s -> %s\n",
        static_cast<unsigned long long>(s.files), s.input_bytes / 1e6, s.raw_bytes / 1e6,
        static_cast<unsigned long long>(s.documents), s.text_bytes / 1e6,
        static_cast<unsigned long long>(s.train_tokens), s.train_shards,
        static_cast<unsigned long long>(s.val_tokens), s.val_shards, s.seconds,
        s.text_bytes / 1e6 / std::max(s.seconds, 1e-9), o.out.c_str());
    if (s.filtered)
      std::printf("prep: --where left out %llu record(s)\n",
                  static_cast<unsigned long long>(s.filtered));
    if (s.bad) {
      std::printf("prep: skipped %llu bad record(s) (--skip-bad); the first:\n",
                  static_cast<unsigned long long>(s.bad));
      for (const auto& b : s.first_bad) std::printf("  %s\n", b.c_str());
    }
    return 0;
  };
}

}  // namespace loom::apps
