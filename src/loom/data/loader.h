// The training data loader (DESIGN decision 8: data order is a pure function of
// (seed, epoch, global sample index)).
//
// The stream is a prep folder's shards of one split, concatenated. Sample j is the token
// window [j*T, j*T + T + 1): inputs are its first T tokens, targets its last T. Epoch e
// visits the S = (tokens-1)/T samples in the order of a bijection on [0, S) keyed by
// (seed, e) — a 4-round Feistel network with cycle walking — so no rank builds or shares
// an index. Global step s takes samples s*B .. s*B+B-1 of that order (B = the global
// batch); data-parallel rank r of R reads the r-th of R equal slices. The S mod B samples
// that do not fill a batch at the end of an epoch are dropped. The loader's whole state is
// the step counter and a sample offset (normally 0): with offset k, step s takes the
// samples k + s*B .. k + s*B + B-1 of the run of epochs (a rewind past the data that made
// training diverge moves it; the checkpoint records it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/data/shard.h"

namespace loom::data {

class TokenDataset {
 public:
  // All shards of `split` ("train" or "val") listed in <dir>/manifest.json, verified.
  static TokenDataset open(const std::string& dir, const std::string& split);
  uint64_t tokens() const { return total_; }
  // Tokens [begin, begin + n) of the concatenated stream.
  void read(uint64_t begin, size_t n, int32_t* out) const;

 private:
  std::vector<ShardView> shards_;
  std::vector<uint64_t> starts_;  // first stream index of each shard
  uint64_t total_ = 0;
};

// A keyed bijection on [0, n).
class SampleOrder {
 public:
  SampleOrder(uint64_t n, uint64_t seed);
  uint64_t at(uint64_t epoch, uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t n_, seed_;
  int half_bits_;
};

struct BatchShape {
  int global_batch = 8;  // sequences per optimizer step, over all data-parallel ranks
  int seq_len = 64;
  int dp_rank = 0;
  int dp_size = 1;
};

class Loader {
 public:
  Loader(const TokenDataset& data, BatchShape shape, uint64_t seed);
  uint64_t samples() const { return order_.size(); }
  uint64_t steps_per_epoch() const { return steps_per_epoch_; }
  int local_batch() const { return shape_.global_batch / shape_.dp_size; }
  // This rank's slice of global step `step`: x and y are local_batch() x seq_len.
  void batch(uint64_t step, int32_t* x, int32_t* y) const;
  // The global sample index (in the dataset) of slot `i` of global step `step`.
  uint64_t sample_of(uint64_t step, int i) const;
  void set_sample_offset(uint64_t samples) { offset_ = samples; }
  uint64_t sample_offset() const { return offset_; }

 private:
  const TokenDataset& data_;
  BatchShape shape_;
  SampleOrder order_;
  uint64_t steps_per_epoch_;
  uint64_t offset_ = 0;
};

}  // namespace loom::data
