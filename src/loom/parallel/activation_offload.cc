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

ActivationOffload::~ActivationOffload() {
  io_.reset();  // finishes the queued reads and writes before the file goes
}

void ActivationOffload::offload(int key, model::Activations& a, const float* keep) {
  LOOM_CHECK(!is_out(key));
  Slot& s = slots_[key];
  std::vector<std::vector<float>*> bufs = a.buffers();
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
      file_.write(at, bufs[i]->data(), s.sizes[i] * sizeof(float));
      recycle(std::move(*bufs[i]));
      bufs[i]->clear();
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
void ActivationOffload::recycle(std::vector<float>&& b) {
  const size_t bytes = b.capacity() * sizeof(float);
  std::lock_guard<std::mutex> lock(spare_mu_);
  if (spare_bytes_.load() + bytes <= spare_cap_.load()) {
    spare_bytes_ += bytes;
    spare_.push_back(std::move(b));
  }
  std::vector<float>().swap(b);
}

void ActivationOffload::reuse(std::vector<float>& b, size_t n) {
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
  b.resize(n);
}

void ActivationOffload::drop_spares() {
  std::vector<std::vector<float>> gone;
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
  std::vector<std::vector<float>*> bufs = a.buffers();
  LOOM_CHECK_EQ(bufs.size(), s.sizes.size());
  for (size_t i = 0; i < s.sizes.size(); ++i)
    if (i + 1 != s.kept) read_ += static_cast<double>(s.sizes[i] * sizeof(float));
  s.reading = io_->submit([this, bufs, &s] {
    size_t at = s.offset;
    for (size_t i = 0; i < bufs.size(); at += s.sizes[i] * sizeof(float), ++i) {
      if (i + 1 == s.kept) continue;
      reuse(*bufs[i], s.sizes[i]);
      *s.resident += s.sizes[i] * sizeof(float);
      file_.read(at, bufs[i]->data(), s.sizes[i] * sizeof(float));
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
