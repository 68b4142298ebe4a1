// `loom prep`: a corpus in (plain text and JSON Lines, plain or .gz/.xz/.zst, files, folders
// or standard input), GPT-2 token shards out (docs/formats.md).
//
// Documents: a plain-text file is one document; a JSON Lines record is one document (the
// string at --text-key, kept when every --where condition matches: data/jsonl.h). Every
// document ends with <|endoftext|> (50256) in each split that received part of it, so the
// model sees document boundaries as GPT-2 did.
//
// Chunks: each document is cut into ~64 KiB chunks at points where the GPT-2 pre-tokenizer
// splits anyway (a non-space ASCII character, then one space and an ASCII letter), so
// tokenizing chunks separately gives exactly the ids of tokenizing the whole document.
// Chunk k (counted over the whole corpus) goes to validation when floor((k+1)f + 1/2) >
// floor(kf + 1/2), f = the validation fraction.
//
// Work: the input is read in pieces of ~8 MiB of decompressed bytes (a run of whole JSON
// Lines records, or a run of whole chunks of a text file). Each worker thread in turn
// reads and decompresses the next piece (one reader at a time, so pieces come in input
// order), then parses and tokenizes it while the next worker reads; the main thread
// appends finished pieces in input order and writes shards. So neither the chunk cuts nor
// the split depend on the thread count, compressed and plain copies of a corpus give
// byte-identical shards, and decompression runs on the workers, not in a single reader in
// front of them. At most a few pieces per worker are in memory, whatever the file sizes.
//
// A bad JSON Lines record stops prep with "FILE:LINE: reason" (the first in input order)
// unless skip_bad, which counts them. Everything is written into "<out>.tmp-<pid>" and
// renamed to <out> at the end: an error leaves nothing behind, an existing <out> is never
// touched.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loom/data/jsonl.h"
#include "loom/data/tokenizer.h"

namespace loom::data {

struct PrepOptions {
  std::vector<std::string> inputs;  // files, folders, "-" (standard input)
  std::string out;
  uint64_t shard_bytes = 1ull << 30;  // token bytes per shard (uint16 each)
  double val_fraction = 0.01;
  int threads = 0;  // 0: every core
  bool progress = true;
  std::string format = "auto";  // auto (by name; "-" is text) | text | jsonl (every input)
  RecordFilter records;         // JSON Lines: the text key and the --where conditions
  bool skip_bad = false;        // count bad records instead of stopping
};

struct PrepSummary {
  uint64_t files = 0, input_bytes = 0, raw_bytes = 0, text_bytes = 0, chunks = 0;
  uint64_t documents = 0;              // plain-text files and kept records
  uint64_t filtered = 0;               // records --where left out
  uint64_t bad = 0;                    // bad records skipped (skip_bad)
  std::vector<std::string> first_bad;  // "FILE:LINE: reason" of the first few
  uint64_t train_tokens = 0, val_tokens = 0;
  uint64_t train_text_bytes = 0, val_text_bytes = 0;  // document bytes behind each split
  uint64_t train_documents = 0, val_documents = 0;    // documents with tokens in each split
  int train_shards = 0, val_shards = 0;
  double seconds = 0;
};

PrepSummary run_prep(const PrepOptions& opts, std::shared_ptr<const Gpt2Tokenizer> tok);

// Where text may be cut without changing its tokens (see above); exposed for tests.
std::vector<size_t> chunk_cuts(std::string_view text, size_t target);

}  // namespace loom::data
