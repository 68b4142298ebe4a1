// Activation offload for pipelines (SageMaker model parallel's offload_activations): while a
// microbatch waits in the pipeline between its forward and its backward on a stage, the
// activations it keeps leave memory for a spill file, written and read back by a
// background I/O thread; the executor starts the read a few actions (the loading horizon)
// before the backward that needs them, so the disk overlaps compute. With recompute those
// activations are only the block inputs on the residual stream (and the last stage's
// logits).
//
// One file per rank, one slot per (microbatch, chunk), reused every step; the file is
// removed when the offloader goes.
#pragma once

#include <atomic>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/core/io_thread.h"
#include "loom/core/scratch_file.h"
#include "loom/model/gpt.h"

namespace loom::parallel {

class ActivationOffload {
 public:
  // Creates `dir` and the file in it; UserError naming the folder when that fails.
  ActivationOffload(const std::string& dir, int rank);
  ~ActivationOffload();
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // Writes a's buffers to key's slot and frees them, but the one at `keep` (a send may
  // still read it). The caller does not touch a until fetch(key).
  void offload(int key, model::Activations& a, const float* keep);
  // Waits until at most `n` offloads are still being written (a compute thread that runs
  // ahead of a starved I/O thread would otherwise hold everything anyway).
  void limit_backlog(size_t n);
  // Starts reading key's buffers back, if they are out and not already coming back.
  void prefetch(int key, model::Activations& a);
  // Returns when key's buffers are back in a (reading them now if nobody asked before).
  void fetch(int key, model::Activations& a);
  bool is_out(int key) const { return state_.count(key) > 0; }
  // Bytes of an offloaded key still in memory (its write not finished, or read back).
  size_t resident_bytes(int key) const;
  // Written-out buffers kept for the next read-back (at most one microbatch's worth).
  size_t spare_bytes() const { return spare_bytes_.load(); }
  // Frees the spares: a forward about to allocate fresh buffers would otherwise hold a
  // microbatch it computes, one being written and one kept for later at once.
  void drop_spares();

  const std::string& path() const { return file_.path(); }
  double bytes_written() const { return written_; }
  double bytes_read() const { return read_; }
  double wait_s() const { return wait_s_; }  // time fetch() blocked
  void reset_counters() { written_ = read_ = wait_s_ = 0; }

 private:
  struct Slot {
    size_t offset = 0, capacity = 0;  // bytes in the file
    std::vector<size_t> sizes;        // floats of each buffer written
    size_t kept = 0;                  // 1 + the index of the buffer left in memory; 0: none
    // Bytes of the key's buffers in memory, kept by the I/O thread as it frees and refills.
    std::shared_ptr<std::atomic<size_t>> resident = std::make_shared<std::atomic<size_t>>(0);
    std::shared_future<void> writing, reading;
  };

  void recycle(model::Floats&& b);                // I/O thread: a written buffer, kept or freed
  void reuse(model::Floats& b, size_t n);         // I/O thread: b sized n, from a spare if one fits
  void write(size_t at, const model::Floats& b);  // I/O thread: b to the file at `at`
  void read(size_t at, model::Floats& b);         // and back

  ScratchFile file_;
  std::mutex spare_mu_;               // the I/O thread fills spare_, either side empties it
  std::vector<model::Floats> spare_;  // written-out buffers for the next read-back
  std::atomic<size_t> spare_cap_{0};  // their most bytes: the largest microbatch
  std::atomic<size_t> spare_bytes_{0};
  size_t end_ = 0;             // the file's allocated size
  std::map<int, Slot> slots_;  // by key, kept across steps
  std::map<int, bool> state_;  // keys whose buffers are out (true: a read was started)
  std::deque<std::shared_future<void>> backlog_;  // writes, oldest first
  double written_ = 0, read_ = 0, wait_s_ = 0;
  std::unique_ptr<IoThread> io_ = std::make_unique<IoThread>();  // joined before file_ goes
};

}  // namespace loom::parallel
