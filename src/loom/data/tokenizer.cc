#define PCRE2_CODE_UNIT_WIDTH 8
#include "loom/data/tokenizer.h"

#include <pcre2.h>

#include <climits>
#include <cstdlib>
#include <fstream>

#include "loom/core/base64.h"
#include "loom/core/error.h"
#include "loom/data/utf8.h"

namespace loom::data {
namespace {

// GPT-2's split pattern as the reference writes it for JavaScript:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with \s spelled out as JavaScript defines it (it includes U+FEFF, which PCRE2's does not).
#define LOOM_JS_SPACE                                                                \
  "\\t\\n\\x0B\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}" \
  "\\x{205F}\\x{3000}\\x{FEFF}"
constexpr const char* kPattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" LOOM_JS_SPACE
    "\\p{L}\\p{N}]+"
    "|[" LOOM_JS_SPACE "]+(?![^" LOOM_JS_SPACE "])|[" LOOM_JS_SPACE "]+";

}  // namespace

std::string Gpt2Tokenizer::default_vocab_path() {
  if (const char* p = std::getenv("LOOM_TOKENIZER_VOCAB"); p && *p) return p;
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    base = x;
  else if (const char* h = std::getenv("HOME"); h && *h)
    base = std::string(h) + "/.cache";
  else
    base = "/tmp";
  return base + "/loom/r50k_base.tiktoken";
}

std::shared_ptr<const Gpt2Tokenizer> Gpt2Tokenizer::load(const std::string& given) {
  const std::string path = given.empty() ? default_vocab_path() : given;
  std::ifstream f(path);
  if (!f)
    throw UserError("cannot read the GPT-2 vocabulary " + path,
                    "run scripts/fetch_tokenizer.sh (or set LOOM_TOKENIZER_VOCAB)");
  std::shared_ptr<Gpt2Tokenizer> t(new Gpt2Tokenizer());
  t->bytes_of_.resize(kVocabSize);
  t->bytes_of_[kEndOfText] = "<|endoftext|>";
  std::string line, bytes;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.empty()) continue;
    auto sp = line.find(' ');
    char* end = nullptr;
    long rank = sp == std::string::npos ? -1 : std::strtol(line.c_str() + sp + 1, &end, 10);
    if (sp == std::string::npos || rank < 0 || rank >= kEndOfText || *end != '\0' ||
        !base64_decode(std::string_view(line).substr(0, sp), bytes) || bytes.empty())
      throw UserError(path + ":" + std::to_string(lineno) + ": not a 'base64 rank' line",
                      "the file is corrupt; delete it and run scripts/fetch_tokenizer.sh");
    t->rank_.emplace(bytes, static_cast<int>(rank));
    t->bytes_of_[rank] = bytes;
  }
  if (t->rank_.size() != static_cast<size_t>(kEndOfText))
    throw UserError(path + " has " + std::to_string(t->rank_.size()) + " tokens, expected " +
                        std::to_string(kEndOfText),
                    "the file is corrupt or not r50k_base; run scripts/fetch_tokenizer.sh");
  int err;
  PCRE2_SIZE off;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                             PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code)
    throw InternalError("the GPT-2 split pattern does not compile at " + std::to_string(off));
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if no JIT
  t->regex_ = code;
  return t;
}

Gpt2Tokenizer::~Gpt2Tokenizer() {
  if (regex_) pcre2_code_free(static_cast<pcre2_code*>(regex_));
}

int Gpt2Tokenizer::rank_of(std::string_view bytes) const {
  // unordered_map<std::string> lookups by string_view need C++20 heterogeneous lookup with a
  // transparent hash; a thread-local key buffer keeps this allocation-free instead.
  thread_local std::string key;
  key.assign(bytes.data(), bytes.size());
  auto it = rank_.find(key);
  return it == rank_.end() ? INT_MAX : it->second;
}

// Byte-pair merging of one piece: start from single bytes and repeatedly merge the adjacent
// pair whose concatenation has the lowest rank, until no pair is in the vocabulary.
void Gpt2Tokenizer::bpe(std::string_view piece, std::vector<int>& out) const {
  if (int r = rank_of(piece); r != INT_MAX) {
    out.push_back(r);
    return;
  }
  // parts[i] = start offset of part i; parts.back() = piece.size().
  std::vector<size_t> parts(piece.size() + 1);
  for (size_t i = 0; i <= piece.size(); ++i) parts[i] = i;
  // ranks[i] = rank of merging part i with part i+1.
  std::vector<int> ranks(piece.size(), INT_MAX);
  auto pair_rank = [&](size_t i) {
    if (i + 2 >= parts.size()) return INT_MAX;
    return rank_of(piece.substr(parts[i], parts[i + 2] - parts[i]));
  };
  for (size_t i = 0; i + 1 < parts.size(); ++i) ranks[i] = pair_rank(i);
  while (parts.size() > 2) {
    int best = INT_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 2 < parts.size(); ++i)
      if (ranks[i] < best) best = ranks[i], at = i;
    if (best == INT_MAX) break;
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    ranks.erase(ranks.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    ranks[at] = pair_rank(at);
    if (at > 0) ranks[at - 1] = pair_rank(at - 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i)
    out.push_back(rank_of(piece.substr(parts[i], parts[i + 1] - parts[i])));
}

std::string Gpt2Tokenizer::decode(const std::vector<int>& ids) const {
  std::string s;
  for (int id : ids) {
    if (id < 0 || id >= kVocabSize)
      throw UserError("token id " + std::to_string(id) + " is outside the GPT-2 vocabulary",
                      "ids run from 0 to 50256");
    s += bytes_of_[id];
  }
  return s;
}

Gpt2Tokenizer::Encoder::Encoder(std::shared_ptr<const Gpt2Tokenizer> tok) : tok_(std::move(tok)) {
  match_data_ =
      pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(tok_->regex_), nullptr);
}

Gpt2Tokenizer::Encoder::~Encoder() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
}

void Gpt2Tokenizer::Encoder::encode(std::string_view text, std::vector<int>& out) {
  if (valid_utf8(text)) {
    encode_valid(text, out);
  } else {
    std::string fixed = repair_utf8(text);
    encode_valid(fixed, out);
  }
}

void Gpt2Tokenizer::Encoder::encode_valid(std::string_view text, std::vector<int>& out) {
  auto* re = static_cast<pcre2_code*>(tok_->regex_);
  auto* md = static_cast<pcre2_match_data*>(match_data_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0;
  while (at < text.size()) {
    int rc = pcre2_match(re, subject, text.size(), at, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;  // nothing left that matches (cannot happen: every character matches)
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t start = ov[0], end = ov[1];
    if (end == start) {  // defensive: never loop on an empty match
      ++at;
      continue;
    }
    std::string_view piece = text.substr(start, end - start);
    at = end;
    if (piece.size() > 64) {  // long runs (whitespace, repeated symbols): not worth caching
      tok_->bpe(piece, out);
      continue;
    }
    auto it = cache_.find(std::string(piece));
    if (it == cache_.end()) {
      std::vector<int> ids;
      tok_->bpe(piece, ids);
      if (cache_.size() > (1u << 20)) cache_.clear();
      it = cache_.emplace(std::string(piece), std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

}  // namespace loom::data
