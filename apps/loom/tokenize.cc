// `loom tokenize [TEXT|-]` prints GPT-2 token ids; `--decode` turns ids back into text.
#include "tokenize.h"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>

#include "loom/core/error.h"
#include "loom/data/tokenizer.h"

namespace loom::apps {

std::function<int()> add_tokenize_command(CLI::App& app) {
  struct Args {
    std::vector<std::string> input;
    bool decode = false;
    bool stats = false;
    std::string vocab;
  };
  auto a = std::make_shared<Args>();
  CLI::App* t = app.add_subcommand("tokenize", "GPT-2 token ids of TEXT (or stdin with '-')");
  t->add_option("input", a->input, "text, or '-' for stdin; with --decode: ids");
  t->add_flag("--decode", a->decode, "decode ids (arguments or stdin) to text");
  t->add_option("--vocab", a->vocab, "r50k_base.tiktoken (default: the cached one)");
  t->add_flag("--stats", a->stats,
              "print only a JSON line with bytes, tokens and encode throughput (one thread)");
  return [a]() -> int {
    auto tok = data::Gpt2Tokenizer::load(a->vocab);
    std::string text;
    if (a->input.empty() || (a->input.size() == 1 && a->input[0] == "-")) {
      text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    } else {
      for (size_t i = 0; i < a->input.size(); ++i) text += (i ? " " : "") + a->input[i];
    }
    if (a->decode) {
      std::vector<int> ids;
      std::istringstream is(text);
      std::string word;
      while (is >> word) {
        char* end = nullptr;
        long v = std::strtol(word.c_str(), &end, 10);
        if (*end != '\0')
          throw UserError("'" + word + "' is not a token id", "pass whole numbers 0..50256");
        ids.push_back(static_cast<int>(v));
      }
      std::string s = tok->decode(ids);
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::printf("\n");
      return 0;
    }
    data::Gpt2Tokenizer::Encoder enc(tok);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<int> ids = enc.encode(text);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (a->stats) {
      std::printf(
          "{\"impl\":\"loom\",\"bytes\":%zu,\"tokens\":%zu,\"seconds\":%.4f,\"mb_per_s\":%.2f}\n",
          text.size(), ids.size(), s, text.size() / s / 1e6);
      return 0;
    }
    for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
    std::printf("\n");
    return 0;
  };
}

}  // namespace loom::apps
