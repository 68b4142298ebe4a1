// Topology-free checkpoints (DESIGN decision 9; docs/formats.md "Checkpoints").
//
// A checkpoint is a folder <root>/step_NNNNNNNN holding data-RRRRR.bin (one per writing
// rank: raw little-endian float32 pieces back to back) and manifest.json, which names every
// tensor by its logical name with its global shape and lists the pieces that tile it
// (file, byte offset, first element, element count, checksum64). Nothing in it depends on
// how many ranks wrote it or how the tensors were sharded, so any layout can read any
// range of any tensor back.
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

namespace loom::ckpt {

struct Piece {
  std::string tensor;          // logical name, e.g. "param/h3.qkvw"
  std::vector<int64_t> shape;  // the whole tensor's shape
  int64_t begin = 0;           // first element of this piece in the flattened tensor
  int64_t count = 0;
  const float* data = nullptr;
};

struct SaveOptions {
  std::string root;  // the folder that holds step_* checkpoints
  int64_t step = 0;
  int rank = 0, world = 1;
  int keep = 3;
  std::function<void()> barrier;  // required when world > 1
};

// Writes this rank's pieces (collective over `world` ranks); returns the checkpoint folder.
// `meta` (rank 0's is kept) carries the non-tensor state: step, loader counter, configs.
std::string save(const SaveOptions& opt, const std::vector<Piece>& pieces,
                 const nlohmann::json& meta);

// The newest complete checkpoint under root, or "" when there is none.
std::string latest(const std::string& root);

class Reader {
 public:
  // UserError naming the folder when the manifest is missing, unreadable or of another
  // format version.
  explicit Reader(const std::string& dir);
  const std::string& dir() const { return dir_; }
  const nlohmann::json& meta() const { return manifest_["meta"]; }
  bool has(const std::string& tensor) const;
  std::vector<int64_t> shape(const std::string& tensor) const;
  // Elements [begin, begin + count) of the flattened tensor; verifies the checksum of every
  // piece it touches and throws UserError naming the file on a mismatch or a short read.
  void read(const std::string& tensor, int64_t begin, int64_t count, float* out) const;

 private:
  std::string dir_;
  nlohmann::json manifest_;
};

}  // namespace loom::ckpt
