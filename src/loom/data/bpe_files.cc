#include "loom/data/bpe_files.h"

#include <nlohmann/json.hpp>

#include "loom/core/error.h"

namespace loom::data {

namespace {

// The code point GPT-2's table gives byte b.
uint32_t code_point_of(uint8_t b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  if (printable) return b;
  uint32_t n = 0;  // b is the n-th unprintable byte
  for (int c = 0; c < b; ++c) {
    const bool p = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
    n += !p;
  }
  return 256 + n;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {  // every code point here is below U+0800
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace

std::string byte_level_spelling(std::string_view bytes) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    for (int b = 0; b < 256; ++b) append_utf8(code_point_of(static_cast<uint8_t>(b)), t[b]);
    return t;
  }();
  std::string out;
  for (char c : bytes) out += table[static_cast<uint8_t>(c)];
  return out;
}

std::vector<std::string> token_spellings(const Gpt2Tokenizer& tok) {
  std::vector<std::string> out(Gpt2Tokenizer::kVocabSize);
  for (int id = 0; id < Gpt2Tokenizer::kEndOfText; ++id)
    out[id] = byte_level_spelling(tok.token_bytes(id));
  out[Gpt2Tokenizer::kEndOfText] = "<|endoftext|>";
  return out;
}

std::vector<std::pair<int, int>> derive_merges(const Gpt2Tokenizer& tok) {
  std::vector<std::pair<int, int>> merges;
  std::vector<std::string> parts;
  for (int r = 256; r < Gpt2Tokenizer::kEndOfText; ++r) {
    const std::string& bytes = tok.token_bytes(r);
    parts.clear();
    for (char c : bytes) parts.emplace_back(1, c);
    // Merge the lowest-ranked adjacent pair, among ranks below r, until none is left.
    for (;;) {
      int best = r;
      size_t at = 0;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        const int id = tok.id_of(parts[i] + parts[i + 1]);
        if (id >= 0 && id < best) best = id, at = i;
      }
      if (best == r) break;
      parts[at] += parts[at + 1];
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    if (parts.size() != 2)
      throw InternalError("token " + std::to_string(r) + " is not the merge of two lower ones (" +
                          std::to_string(parts.size()) + " parts)");
    merges.push_back({tok.id_of(parts[0]), tok.id_of(parts[1])});
  }
  return merges;
}

std::string vocab_json(const Gpt2Tokenizer& tok) {
  // Written by hand: an ordered_json object finds each new key by a linear search.
  const std::vector<std::string> s = token_spellings(tok);
  std::string out = "{";
  for (int id = 0; id < Gpt2Tokenizer::kVocabSize; ++id)
    out += (id ? "," : "") + nlohmann::json(s[id]).dump() + ":" + std::to_string(id);
  return out + "}\n";
}

std::string merges_txt(const Gpt2Tokenizer& tok) {
  const std::vector<std::string> s = token_spellings(tok);
  std::string out = "#version: 0.2\n";
  for (auto [a, b] : derive_merges(tok)) out += s[a] + " " + s[b] + "\n";
  return out;
}

}  // namespace loom::data
