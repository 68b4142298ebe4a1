// Accounting of model-state memory (parameters, gradients, optimizer moments, gathered
// unit buffers): every such buffer is a StateVector, whose allocator counts the bytes it
// holds, so ZeRO's memory formulas can be checked against the real high-water mark of
// those allocations (tests/integration/dp_e2e.py) instead of against RSS.
#pragma once

#include <atomic>
#include <cstddef>
#include <new>
#include <vector>

namespace loom {

class StateMemory {
 public:
  static size_t current() { return current_.load(std::memory_order_relaxed); }
  static size_t peak() { return peak_.load(std::memory_order_relaxed); }
  static void add(size_t bytes) {
    const size_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    size_t p = peak_.load(std::memory_order_relaxed);
    while (now > p && !peak_.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  static void sub(size_t bytes) { current_.fetch_sub(bytes, std::memory_order_relaxed); }

 private:
  static inline std::atomic<size_t> current_{0};
  static inline std::atomic<size_t> peak_{0};
};

template <typename T>
struct StateAllocator {
  using value_type = T;
  StateAllocator() = default;
  template <typename U>
  StateAllocator(const StateAllocator<U>&) {}  // NOLINT: allocators convert implicitly
  T* allocate(size_t n) {
    T* p = static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64}));
    StateMemory::add(n * sizeof(T));
    return p;
  }
  void deallocate(T* p, size_t n) {
    StateMemory::sub(n * sizeof(T));
    ::operator delete (p, std::align_val_t{64});
  }
  template <typename U>
  bool operator==(const StateAllocator<U>&) const {
    return true;
  }
};

using StateVector = std::vector<float, StateAllocator<float>>;

}  // namespace loom
