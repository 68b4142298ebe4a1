#include "loom/optim/moment_file.h"

#include "loom/core/error.h"
#include "loom/core/tunable.h"

namespace loom::optim {

namespace {
const IntTunable kOffloadChunk("LOOM_OFFLOAD_CHUNK", static_cast<int64_t>(MomentFile::kChunk),
                               "elements of each slot an offloaded optimizer step streams at once "
                               "(two buffers of m, v and the master weights: 24 bytes each)");

size_t chunk_or_default(size_t chunk) {
  if (chunk > 0) return chunk;
  const int64_t v = kOffloadChunk.get();
  if (v < 1024)
    throw UserError("LOOM_OFFLOAD_CHUNK=" + std::to_string(v) + " is below 1024 elements",
                    "use e.g. 524288 (2 MiB a slot)");
  return static_cast<size_t>(v);
}
}  // namespace

MomentFile::MomentFile(const std::string& dir, int rank, size_t chunk)
    : file_(dir, "adam-moments-rank" + std::to_string(rank) + ".bin", "optimizer-state file",
            "point zero.offload_dir at a writable folder with room for 8 bytes per parameter of "
            "this rank, 12 with zero.offload_master (default: run.dir/offload), or set "
            "zero.offload = \"none\""),
      chunk_(chunk_or_default(chunk)) {}

float* MomentFile::buffer(int b, int which) {
  // Not value-initialised: every element is read from the file before it is used.
  // Untouched pages take no memory: the master's two buffers only when they are used.
  if (!buffers_) buffers_.reset(new float[6 * chunk_]);
  return buffers_.get() + (3 * b + which) * chunk_;
}

MomentFile::~MomentFile() {
  io_.reset();  // finishes queued reads and writes before the file goes
}

size_t MomentFile::allocate(size_t bytes) {
  const size_t at = end_;
  end_ += bytes;
  file_.resize(end_);  // a sparse file reads as zeros
  return at;
}

void MomentFile::read(size_t offset, void* out, size_t bytes) const {
  read_ += static_cast<double>(bytes);
  file_.read(offset, out, bytes);
}

void MomentFile::write(size_t offset, const void* in, size_t bytes) const {
  written_ += static_cast<double>(bytes);
  file_.write(offset, in, bytes);
}

}  // namespace loom::optim
