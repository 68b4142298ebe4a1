#include "loom/parallel/activation_offload.h"

#include <malloc.h>

#include <chrono>

#include "loom/core/check.h"
#include "loom/core/error.h"

namespace loom::parallel {

ActivationOffload::ActivationOffload(const std::string& dir, int rank)
    : file_(dir, "activations-rank" + std::to_string(rank) + ".spill", "activation spill file",
            "point train.offload_dir at a writable folder with free space (default: "
            "run.dir/spill), or set train.offload_activations = false") {
  // Buffers freed here must leave the process, not glibc's heap: a fixed threshold turns off
  // its growing one (up to 32 MiB), so every buffer of 256 KiB or more is its own mapping
  // and free() unmaps it (measured: without this, offload raised gpipe's peak RSS).
  ::mallopt(M_MMAP_THRESHOLD, 256 * 1024);
}

// A buffer in device memory goes through a host copy (the backends built today keep theirs in
// host memory: no copy).
void ActivationOffload::write(size_t at, const model::Floats& b) {
  if (b.empty()) return;  // a buffer the run does not use (no memory given)
  if (b.memory()->host_visible()) return file_.write(at, b.data(), b.bytes());
  std::vector<float> host(b.size());
  b.to_host(host.data());
  file_.write(at, host.data(), b.bytes());
}

void ActivationOffload::read(size_t at, model::Floats& b) {
  if (b.empty()) return;
  if (b.memory()->host_visible()) return file_.read(at, b.data(), b.bytes());
  std::vector<float> host(b.size());
  file_.read(at, host.data(), b.bytes());
  b.from_host(host.data(), host.size());
}

ActivationOffload::~ActivationOffload() {
  io_.reset();  // finishes the queued reads and writes before the file goes
}

void ActivationOffload::offload(int key, model::Activations& a, const float* keep) {
  LOOM_CHECK(!is_out(key));
  Slot& s = slots_[key];
  std::vector<model::Floats*> bufs = a.buffers();
  s.kept = 0;
  for (size_t i = 0; i < bufs.size(); ++i)
    if (keep && bufs[i]->data() == keep) s.kept = i + 1;
  s.sizes.clear();
  size_t bytes = 0;
  for (auto* b : bufs) s.sizes.push_back(b->size()), bytes += b->size() * sizeof(float);
  if (bytes > s.capacity) s.offset = end_, s.capacity = bytes, end_ += bytes;
  if (bytes > spare_cap_.load()) spare_cap_ = bytes;
  *s.resident = bytes;
  if (s.kept) bytes -= s.sizes[s.kept - 1] * sizeof(float);
  written_ += static_cast<double>(bytes);
  // The buffer a send still reads (the stage's output) stays in memory: waiting for the send
  // here would hold every later offload behind a slow neighbour.
  s.writing = io_->submit([this, bufs, &s] {
    for (size_t i = 0, at = s.offset; i < bufs.size(); at += s.sizes[i] * sizeof(float), ++i) {
      if (i + 1 == s.kept) continue;
      write(at, *bufs[i]);
      recycle(bufs[i]->take());
      *s.resident -= s.sizes[i] * sizeof(float);
    }
  });
  state_[key] = false;
  backlog_.push_back(s.writing);
}

// Written-out buffers wait here for the next read-back instead of leaving the process at
// once: memory handed back and taken again costs a page fault per 4 KiB (a few us each in a
// VM), about what the disk costs. At most one microbatch's worth (the largest slot) waits;
// the rest is freed. Both run on the I/O thread; drop_spares() empties them when a forward
// is about to allocate afresh.
void ActivationOffload::recycle(model::Floats&& b) {
  const size_t bytes = b.capacity() * sizeof(float);
  std::lock_guard<std::mutex> lock(spare_mu_);
  if (spare_bytes_.load() + bytes <= spare_cap_.load()) {
    spare_bytes_ += bytes;
    spare_.push_back(std::move(b));
  }
  b.release();
}

void ActivationOffload::reuse(model::Floats& b, size_t n) {
  if (n == 0) return;  // a buffer the run does not use
  std::unique_lock<std::mutex> lock(spare_mu_);
  auto best = spare_.end();  // the smallest spare that fits
  for (auto it = spare_.begin(); it != spare_.end(); ++it)
    if (it->capacity() >= n && (best == spare_.end() || it->capacity() < best->capacity()))
      best = it;
  if (best != spare_.end()) {
    spare_bytes_ -= best->capacity() * sizeof(float);
    b.swap(*best);
    spare_.erase(best);
  }
  lock.unlock();
  b.resize_discard(n);  // read over whole
}

void ActivationOffload::drop_spares() {
  std::vector<model::Floats> gone;
  {
    std::lock_guard<std::mutex> lock(spare_mu_);
    gone.swap(spare_);
    spare_bytes_ = 0;
  }
}

void ActivationOffload::limit_backlog(size_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!backlog_.empty() &&
         (backlog_.size() > n ||
          backlog_.front().wait_for(std::chrono::seconds(0)) == std::future_status::ready)) {
    backlog_.front().get();  // rethrows an I/O error
    backlog_.pop_front();
  }
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

size_t ActivationOffload::resident_bytes(int key) const {
  const auto it = slots_.find(key);
  return is_out(key) && it != slots_.end() ? it->second.resident->load() : 0;
}

void ActivationOffload::prefetch(int key, model::Activations& a) {
  auto it = state_.find(key);
  if (it == state_.end() || it->second) return;
  it->second = true;
  Slot& s = slots_[key];
  std::vector<model::Floats*> bufs = a.buffers();
  LOOM_CHECK_EQ(bufs.size(), s.sizes.size());
  for (size_t i = 0; i < s.sizes.size(); ++i)
    if (i + 1 != s.kept) read_ += static_cast<double>(s.sizes[i] * sizeof(float));
  s.reading = io_->submit([this, bufs, &s] {
    size_t at = s.offset;
    for (size_t i = 0; i < bufs.size(); at += s.sizes[i] * sizeof(float), ++i) {
      if (i + 1 == s.kept) continue;
      reuse(*bufs[i], s.sizes[i]);
      *s.resident += s.sizes[i] * sizeof(float);
      read(at, *bufs[i]);
    }
  });
}

void ActivationOffload::fetch(int key, model::Activations& a) {
  if (!is_out(key)) return;
  prefetch(key, a);
  const auto t0 = std::chrono::steady_clock::now();
  Slot& s = slots_[key];
  s.writing.get();  // rethrows an I/O error
  s.reading.get();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state_.erase(key);
}

}  // namespace loom::parallel
