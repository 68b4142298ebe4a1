// A flat float buffer of which only some ranges are memory: the page-aligned interiors of the
// ranges named absent are reserved address space with no access, so a stray read of a value
// that lives elsewhere (zero.offload_master: the fp32 master of the weight matrices, in the
// optimizer-state file) faults at once instead of returning zeros. The resident bytes count
// as model state (core/state_memory.h) on the constructing thread's account.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "loom/core/state_memory.h"

namespace loom {

class SparseFloats {
 public:
  using Range = std::pair<size_t, size_t>;  // [first, second) in elements
  SparseFloats() = default;
  // n floats, zero, except the whole pages inside each absent range (sorted, disjoint).
  SparseFloats(size_t n, const std::vector<Range>& absent);
  ~SparseFloats();
  SparseFloats(SparseFloats&& o) noexcept { *this = std::move(o); }
  SparseFloats& operator=(SparseFloats&& o) noexcept;
  SparseFloats(const SparseFloats&) = delete;
  SparseFloats& operator=(const SparseFloats&) = delete;

  float* data() const { return data_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  // The parts of [lo, hi) that are memory, in order.
  std::vector<Range> resident(size_t lo, size_t hi) const;

 private:
  void release();
  float* data_ = nullptr;
  size_t n_ = 0, mapped_ = 0, resident_ = 0;
  std::vector<Range> holes_;  // element ranges with no memory (whole pages)
  StateMemory* account_ = nullptr;
};

}  // namespace loom
