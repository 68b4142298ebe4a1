#include "shared_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <map>
#include <mutex>

#include "loom/comm/transport/shm/shared_memory.h"

namespace loom_torch {
namespace {

namespace shm = loom::comm::shm;

// A size class: whole pages, then rounded up to 1, 1.25, 1.5 or 1.75 times a power of two
// (at most a quarter wasted), so that a cached buffer fits the next request of about its
// size.
size_t size_class(size_t n) {
  constexpr size_t kPage = 4096;
  n = (n + kPage - 1) / kPage * kPage;
  if (n <= 4 * kPage) return n;
  const size_t top = size_t{1} << (std::bit_width(n) - 1);  // the power of two below n
  const size_t quarter = top / 4;
  return (n + quarter - 1) / quarter * quarter;
}

struct Block {  // a DataPtr's context: which buffer, of which class
  void* data;
  size_t size;
};

class SharedCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const override {
    if (!enabled_.load(std::memory_order_relaxed) || n < min_bytes_.load()) {
      return fallback_->allocate(n);
    }
    const size_t size = size_class(n);
    void* data = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(size);
      if (it != cache_.end()) {
        data = it->second;
        cache_.erase(it);
        cached_ -= size;
        ++reused_;
      }
      live_ += size;
    }
    if (!data) {
      try {
        data = shm::shared_alloc(size);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        live_ -= size;
        throw;
      }
      std::lock_guard<std::mutex> lock(mu_);
      ++made_;
    }
    return {data, new Block{data, size}, &release, c10::Device(c10::DeviceType::CPU)};
  }

  void enable(bool on, size_t min_bytes, size_t cache_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fallback_) {
      // Each shared buffer keeps its memfd open (peers open it through /proc/<pid>/fd), so
      // a model's tensors can need thousands: the soft limit on open files goes up to the
      // hard one (often 1024 of 524288).
      rlimit files{};
      if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
        files.rlim_cur = files.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &files);
      }
      fallback_ = c10::GetCPUAllocator();
      c10::SetCPUAllocator(this, /*priority=*/1);  // above the default's 0
      pthread_atfork(&before_fork, &after_fork_parent, &after_fork_child);
    }
    min_bytes_ = min_bytes;
    cache_limit_ = cache_bytes;
    enabled_ = on && !in_child_;
    trim();
  }

  SharedMemoryStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {live_, cached_, made_, reused_, released_, enabled_.load()};
  }

  size_t shared_from() const {
    return enabled_.load() ? std::max<size_t>(min_bytes_.load(), 1) : 0;
  }

  static SharedCpuAllocator& get() {
    // Never destroyed: torch frees tensors during interpreter shutdown, after statics.
    static auto* a = new SharedCpuAllocator;
    return *a;
  }

 private:
  static void release(void* ctx) {
    auto* b = static_cast<Block*>(ctx);
    get().put_back(b->data, b->size);
    delete b;
  }

  void put_back(void* data, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_child_) return;  // the parent's buffer: neither ours to free nor to hand out
    live_ -= size;
    cache_.emplace(size, data);
    cached_ += size;
    trim();
  }

  // Releases cached buffers, largest first, until the cache is within its limit (mu_ held).
  void trim() {
    while (cached_ > cache_limit_ && !cache_.empty()) {
      auto it = std::prev(cache_.end());
      cached_ -= it->first;
      ++released_;
      shm::shared_free(it->second);
      cache_.erase(it);
    }
  }

  // Around fork(): the lock is held across it, so the child's copy is consistent. In the
  // child the cached buffers are the parent's pages (handing one out would alias the
  // parent's next tensor): forget them, and allocate from the previous allocator.
  static void before_fork() { get().mu_.lock(); }
  static void after_fork_parent() { get().mu_.unlock(); }
  static void after_fork_child() {
    SharedCpuAllocator& a = get();
    a.in_child_ = true;
    a.enabled_ = false;
    a.cache_.clear();
    a.cached_ = 0;
    a.mu_.unlock();
  }

  mutable std::mutex mu_;
  c10::Allocator* fallback_ = nullptr;
  std::atomic<bool> enabled_{false};
  std::atomic<size_t> min_bytes_{64 << 10};
  size_t cache_limit_ = size_t{1} << 30;
  bool in_child_ = false;
  mutable std::multimap<size_t, void*> cache_;  // freed buffers by size class
  mutable size_t live_ = 0, cached_ = 0;
  mutable uint64_t made_ = 0, reused_ = 0, released_ = 0;
};

}  // namespace

void use_shared_memory(bool on, size_t min_bytes, size_t cache_bytes) {
  SharedCpuAllocator::get().enable(on, min_bytes, cache_bytes);
}

SharedMemoryStats shared_memory_stats() {
  return SharedCpuAllocator::get().stats();
}

size_t shared_storage_from() {
  return SharedCpuAllocator::get().shared_from();
}

bool in_shared_memory(const void* data, size_t bytes) {
  shm::SharedRef ref;
  return shm::shared_find(data, bytes, &ref);
}

}  // namespace loom_torch
