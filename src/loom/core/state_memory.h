// Accounting of model-state memory (parameters, gradients, optimizer moments, gathered
// unit buffers): every such buffer is a StateVector, whose allocator counts the bytes it
// holds, so ZeRO's memory formulas can be checked against the real high-water mark of
// those allocations (tests/integration/dp_e2e.py, and per rank with thread ranks in
// tests/unit/parallel_test.cc) instead of against RSS.
//
// Counting goes to the calling thread's account: the process's, unless a
// StateMemory::Scope on that thread names another (one per rank when ranks are threads of
// one process). Each block remembers its account, so a free on another thread subtracts
// from the right one.
#pragma once

#include <atomic>
#include <cstddef>
#include <new>
#include <vector>

namespace loom {

// Where StateVectors get their memory: the heap, or, while a StateMemory::SourceScope
// names one on the allocating thread, this source (e.g. memory the other processes of the
// machine can map, so collectives read it in place: comm::shared_state_source()). A block
// remembers its source, so it is freed to it from any thread.
class StateSource {
 public:
  virtual void* allocate(size_t bytes) = 0;  // 64-byte aligned
  virtual void deallocate(void* p) = 0;

 protected:
  ~StateSource() = default;
};

class StateMemory {
 public:
  // The calling thread's account.
  static StateMemory& mine() { return *scope_; }
  static size_t current() { return mine().now_.load(std::memory_order_relaxed); }
  static size_t peak() { return mine().peak_.load(std::memory_order_relaxed); }

  size_t current_bytes() const { return now_.load(std::memory_order_relaxed); }
  size_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  void add(size_t bytes) {
    const size_t now = now_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    size_t p = peak_.load(std::memory_order_relaxed);
    while (now > p && !peak_.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  void sub(size_t bytes) { now_.fetch_sub(bytes, std::memory_order_relaxed); }

  // While alive, this thread's allocations count in `account`.
  // While alive, this thread's StateVectors take their memory from `source` (nullptr: the
  // heap).
  class SourceScope {
   public:
    explicit SourceScope(StateSource* source) : saved_(source_) { source_ = source; }
    ~SourceScope() { source_ = saved_; }
    SourceScope(const SourceScope&) = delete;
    SourceScope& operator=(const SourceScope&) = delete;

   private:
    StateSource* saved_;
  };
  static StateSource* source() { return source_; }

  class Scope {
   public:
    explicit Scope(StateMemory& account) : saved_(scope_) { scope_ = &account; }
    ~Scope() { scope_ = saved_; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StateMemory* saved_;
  };

 private:
  std::atomic<size_t> now_{0};
  std::atomic<size_t> peak_{0};
  static StateMemory process_;
  static thread_local StateMemory* scope_;
  static thread_local StateSource* source_;
};

inline StateMemory StateMemory::process_;
inline thread_local StateMemory* StateMemory::scope_ = &StateMemory::process_;
inline thread_local StateSource* StateMemory::source_ = nullptr;

template <typename T>
struct StateAllocator {
  using value_type = T;
  // Each block starts with a 64-byte header holding its account and source (the data stays
  // 64-byte aligned).
  static constexpr size_t kHeader = 64;
  StateAllocator() = default;
  template <typename U>
  StateAllocator(const StateAllocator<U>&) {}  // NOLINT: allocators convert implicitly
  struct Header {
    StateMemory* account;
    StateSource* source;
  };
  T* allocate(size_t n) {
    StateSource* source = StateMemory::source();
    const size_t bytes = kHeader + n * sizeof(T);
    auto* base = static_cast<std::byte*>(source ? source->allocate(bytes)
                                                : ::operator new (bytes, std::align_val_t{64}));
    StateMemory* account = &StateMemory::mine();
    *reinterpret_cast<Header*>(base) = {account, source};
    account->add(n * sizeof(T));
    return reinterpret_cast<T*>(base + kHeader);
  }
  void deallocate(T* p, size_t n) {
    std::byte* base = reinterpret_cast<std::byte*>(p) - kHeader;
    const Header h = *reinterpret_cast<Header*>(base);
    h.account->sub(n * sizeof(T));
    if (h.source)
      h.source->deallocate(base);
    else
      ::operator delete (base, std::align_val_t{64});
  }
  template <typename U>
  bool operator==(const StateAllocator<U>&) const {
    return true;
  }
};

using StateVector = std::vector<float, StateAllocator<float>>;

}  // namespace loom
