// `loom prep`: a text corpus in, GPT-2 token shards out (docs/formats.md).
//
// Files are read in sorted order and cut into ~64 KiB chunks at points where the GPT-2
// pre-tokenizer splits anyway (a non-space character, then one space and an ASCII letter), so
// tokenizing chunks separately gives exactly the ids of tokenizing the whole file. Chunks are
// tokenized on every core; chunk k (counted over the whole corpus) goes to validation when
// floor((k+1)f + 1/2) > floor(kf + 1/2), f = the validation fraction, so the split does not
// depend on the thread count. Each document (file) ends with <|endoftext|> in every split
// that received part of it. Everything is written into "<out>.tmp-<pid>" and renamed to
// <out> at the end: an error leaves nothing behind, an existing <out> is never touched.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/data/tokenizer.h"

namespace loom::data {

struct PrepOptions {
  std::vector<std::string> inputs;
  std::string out;
  uint64_t shard_bytes = 1ull << 30;  // token bytes per shard (uint16 each)
  double val_fraction = 0.01;
  int threads = 0;  // 0: every core
  bool progress = true;
};

struct PrepSummary {
  uint64_t files = 0, input_bytes = 0, text_bytes = 0, chunks = 0;
  uint64_t train_tokens = 0, val_tokens = 0;
  int train_shards = 0, val_shards = 0;
  double seconds = 0;
};

PrepSummary run_prep(const PrepOptions& opts, std::shared_ptr<const Gpt2Tokenizer> tok);

// Where text may be cut without changing its tokens (see above); exposed for tests.
std::vector<size_t> chunk_cuts(const std::string& text, size_t target);

}  // namespace loom::data
