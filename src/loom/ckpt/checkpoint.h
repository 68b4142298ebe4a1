// Topology-free checkpoints (DESIGN decision 9; docs/formats.md "Checkpoints").
//
// A checkpoint is a folder <root>/step_NNNNNNNN holding data-RRRRR.bin (one per writing
// rank: raw little-endian float32 pieces back to back) and manifest.json, which names every
// tensor by its logical name with its global shape and lists the pieces that tile it. A
// piece is a region: a box of the tensor (an N-dimensional slice: start and extent per
// dimension — a tensor-parallel shard) and a range of that box's elements in its row-major
// order (a ZeRO shard of it); with file, byte offset and checksum64. Nothing in it depends
// on how many ranks wrote it or how the tensors were split or sharded, so any layout can read
// any region of any tensor back.
//
// Saving is collective when world > 1: every rank writes its pieces into the staging
// folder <root>/.step_NNNNNNNN.tmp, a barrier, rank 0 merges the per-rank indexes into the
// manifest (written last), renames the folder into place and prunes all but the newest
// `keep`; a second barrier. A crash at any point leaves the previous checkpoints intact;
// latest() only ever sees complete folders.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/ckpt/tensor_source.h"
#include "loom/core/box.h"

namespace loom::ckpt {

struct Piece {
  std::string tensor;  // logical name, e.g. "param/h3.qkvw"
  Shape shape;         // the whole tensor's shape
  Region region;
  const float* data = nullptr;  // region.count floats, or
  // (when data is null) writes elements [begin, begin + n) of the piece to out: for state
  // that is not in memory (offloaded optimizer moments), read in chunks as it is saved.
  std::function<void(int64_t begin, int64_t n, float* out)> fetch;
};

struct SaveOptions {
  std::string root;  // the folder that holds step_* checkpoints
  int64_t step = 0;
  int rank = 0, world = 1;
  int keep = 3;  // finite checkpoints kept, with any newer non-finite ones (meta "finite")
  std::function<void()> barrier;  // required when world > 1
};

// Writes this rank's pieces (collective over `world` ranks); returns the checkpoint folder.
// `meta` (rank 0's is kept) carries the non-tensor state: step, loader counter, configs.
std::string save(const SaveOptions& opt, const std::vector<Piece>& pieces,
                 const nlohmann::json& meta);

// The newest complete checkpoint under root, or "" when there is none.
std::string latest(const std::string& root);
// The newest complete one saved after a finite step (meta "finite" true or absent), or "".
std::string latest_finite(const std::string& root);

class Reader : public TensorSource {
 public:
  // UserError naming the folder when the manifest is missing, unreadable or of another
  // format version.
  explicit Reader(const std::string& dir);
  const std::string& dir() const { return dir_; }
  const nlohmann::json& meta() const { return manifest_["meta"]; }
  bool has(const std::string& tensor) const override;
  // The names of the tensors it holds.
  std::vector<std::string> tensors() const;
  Shape shape(const std::string& tensor) const override;
  // The region of tensor (whole shape `shape`) into out (region.count floats). Verifies the
  // checksum of every piece it touches and throws UserError naming the file on a mismatch
  // or a short read, and the tensor when its shape differs from `shape`. (A checkpoint of
  // format 1 stored qkvw as (3C,C): whole-tensor pieces are read by flat index whatever
  // the shape, as long as the element counts agree.)
  void read(const std::string& tensor, const Shape& shape, const Region& region,
            float* out) const override;
  // Elements [begin, begin + count) of the flattened tensor.
  void read(const std::string& tensor, int64_t begin, int64_t count, float* out) const;

 private:
  std::vector<float> piece_data(const std::string& tensor, size_t i) const;

  std::string dir_;
  nlohmann::json manifest_;
};

}  // namespace loom::ckpt
