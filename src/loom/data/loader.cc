#include "loom/data/loader.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/random.h"
#include "loom/data/tokenizer.h"

namespace loom::data {

TokenDataset TokenDataset::open(const std::string& dir, const std::string& split) {
  std::ifstream f(dir + "/manifest.json");
  if (!f)
    throw UserError("no token dataset at " + dir + " (missing manifest.json)",
                    "point data.path at a folder written by `loom prep`");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw UserError(dir + "/manifest.json is not valid JSON: " + e.what(), "re-run `loom prep`");
  }
  // The manifest is outside input: its fields are checked for type before use, and a shard
  // must be a plain file name inside the folder.
  auto bad = [&](const std::string& why) {
    return UserError(dir + "/manifest.json is damaged: " + why, "re-run `loom prep`");
  };
  if (!m.is_object() || !m.contains("shards") || !m["shards"].is_array())
    throw bad("it has no \"shards\" array");
  TokenDataset d;
  for (const auto& s : m["shards"]) {
    if (!s.is_object() || !s.contains("split") || !s["split"].is_string())
      throw bad("a shard entry has no \"split\" string");
    if (s["split"] != split) continue;
    if (!s.contains("file") || !s["file"].is_string() || !s.contains("tokens") ||
        !s["tokens"].is_number_unsigned())
      throw bad("a shard entry lacks its \"file\" name or \"tokens\" count");
    const std::string file = s["file"];
    if (!plain_file_name(file))
      throw bad("shard file '" + file + "' is not a file name inside the folder");
    ShardView v = ShardView::open(dir + "/" + file, Gpt2Tokenizer::kVocabSize);
    const uint64_t want = s["tokens"];
    if (v.size() != want)
      throw UserError("token shard " + v.path() + " holds " + std::to_string(v.size()) +
                          " tokens but the manifest says " + std::to_string(want),
                      "re-run `loom prep`");
    d.starts_.push_back(d.total_);
    d.total_ += v.size();
    d.shards_.push_back(std::move(v));
  }
  if (d.total_ == 0)
    throw UserError("the " + split + " split of " + dir + " has no tokens",
                    "prepare more text, or a larger --val-fraction for validation");
  return d;
}

void TokenDataset::read(uint64_t begin, size_t n, int32_t* out) const {
  auto it = std::upper_bound(starts_.begin(), starts_.end(), begin);
  size_t s = static_cast<size_t>(it - starts_.begin()) - 1;
  uint64_t off = begin - starts_[s];
  for (size_t i = 0; i < n; ++i, ++off) {
    while (off >= shards_[s].size()) off -= shards_[s++].size();
    out[i] = shards_[s].tokens()[off];
  }
}

namespace {
// The Feistel rounds' mixing: SplitMix64's finaliser alone (no increment: mix64 would
// change every data order written so far).
uint64_t mix(uint64_t x) {
  return splitmix64_finaliser(x);
}
}  // namespace

SampleOrder::SampleOrder(uint64_t n, uint64_t seed) : n_(n), seed_(seed) {
  int bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  half_bits_ = (bits + 1) / 2;
}

uint64_t SampleOrder::at(uint64_t epoch, uint64_t i) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t x = i;
  do {  // cycle-walk: re-encrypt until the value falls inside [0, n)
    uint64_t l = x >> half_bits_, r = x & mask;
    for (int round = 0; round < 4; ++round) {
      uint64_t f = mix(r ^ mix(seed_ ^ mix(epoch * 4 + round + 1))) & mask;
      uint64_t nl = r;
      r = l ^ f;
      l = nl;
    }
    x = (l << half_bits_) | r;
  } while (x >= n_);
  return x;
}

Loader::Loader(const TokenDataset& data, BatchShape shape, uint64_t seed)
    : data_(data),
      shape_(shape),
      order_(data.tokens() > 1 ? (data.tokens() - 1) / shape.seq_len : 0, seed) {
  if (shape.dp_size < 1 || shape.dp_rank < 0 || shape.dp_rank >= shape.dp_size ||
      shape.global_batch % shape.dp_size != 0)
    throw UserError("a global batch of " + std::to_string(shape.global_batch) +
                        " sequences does not split over " + std::to_string(shape.dp_size) +
                        " data-parallel ranks",
                    "make train.global_batch a multiple of the data-parallel size");
  steps_per_epoch_ = order_.size() / static_cast<uint64_t>(shape.global_batch);
  if (steps_per_epoch_ == 0)
    throw UserError("the dataset has " + std::to_string(order_.size()) + " samples of " +
                        std::to_string(shape.seq_len) + " tokens, fewer than one global batch of " +
                        std::to_string(shape.global_batch),
                    "use a smaller batch or sequence length, or more data");
}

uint64_t Loader::sample_of(uint64_t step, int i) const {
  // The position in the run of epochs, each steps_per_epoch_ x B samples of the order long.
  const uint64_t per_epoch = steps_per_epoch_ * static_cast<uint64_t>(shape_.global_batch);
  const uint64_t at =
      offset_ + step * static_cast<uint64_t>(shape_.global_batch) + static_cast<uint64_t>(i);
  return order_.at(at / per_epoch, at % per_epoch);
}

void Loader::batch(uint64_t step, int32_t* x, int32_t* y) const {
  const int local = local_batch(), T = shape_.seq_len;
  std::vector<int32_t> window(static_cast<size_t>(T) + 1);
  for (int b = 0; b < local; ++b) {
    uint64_t j = sample_of(step, shape_.dp_rank * local + b);
    data_.read(j * static_cast<uint64_t>(T), window.size(), window.data());
    std::copy(window.begin(), window.end() - 1, x + static_cast<size_t>(b) * T);
    std::copy(window.begin() + 1, window.end(), y + static_cast<size_t>(b) * T);
  }
}

}  // namespace loom::data
