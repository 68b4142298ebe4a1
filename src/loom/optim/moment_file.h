// Optimizer-state offload (`zero.offload = disk`, in the spirit of ZeRO-Infinity): Adam's
// moments of this rank live in a file instead of memory. Each AdamW range owns a region of
// the file (its m, then its v); a step streams every range of the file, one after another,
// through two chunk buffers: the next chunk is read and the last one written on an I/O
// thread while the current one updates, across range boundaries too.
// The parameters (loom computes on its fp32 master weights) and gradients stay in memory.
// The file is scratch, removed when the run ends; checkpoints copy the moments out of it.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "loom/core/io_thread.h"
#include "loom/core/scratch_file.h"

namespace loom::optim {

class MomentFile {
 public:
  // Creates `dir` and the file; UserError naming the folder when that fails. A step streams
  // chunks of `chunk` elements (0: LOOM_OFFLOAD_CHUNK, kChunk unless set; tests pass fewer).
  // 512 KiB a slot: a chunk's slots stay in the caches between the read and the update (2 MiB
  // slots took 2.2x as long a step on Zen 4: docs/perf-history.md).
  static constexpr size_t kChunk = size_t{1} << 17;
  MomentFile(const std::string& dir, int rank, size_t chunk = 0);
  ~MomentFile();
  MomentFile(const MomentFile&) = delete;
  MomentFile& operator=(const MomentFile&) = delete;

  // A zero-filled region of `bytes`; returns its offset.
  size_t allocate(size_t bytes);
  // Synchronous, whole: UserError naming the file on failure.
  void read(size_t offset, void* out, size_t bytes) const;
  void write(size_t offset, const void* in, size_t bytes) const;
  IoThread& io() { return *io_; }
  size_t chunk() const { return chunk_; }
  // Stream buffer b (0 or 1) of slot which (0: m, 1: v, 2: the master weights), chunk()
  // floats: allocated on first use (not zeroed) and kept for every later step (2 MiB, 3 with
  // the master weights). Freed after each step, they
  // would cost their page faults again: 0.25 s a step in a VM (gpt2-124m, measured).
  float* buffer(int b, int which);
  const std::string& path() const { return file_.path(); }
  // Bytes moved since the last reset (optimizer steps and checkpoints).
  double bytes_read() const { return read_.load(); }
  double bytes_written() const { return written_.load(); }
  void reset_counters() { read_ = 0, written_ = 0; }

 private:
  ScratchFile file_;
  size_t end_ = 0, chunk_;
  std::unique_ptr<float[]> buffers_;                  // 6 x chunk_: [b][which]
  mutable std::atomic<double> read_{0}, written_{0};  // the I/O thread adds too
  std::unique_ptr<IoThread> io_ = std::make_unique<IoThread>();
};

}  // namespace loom::optim
