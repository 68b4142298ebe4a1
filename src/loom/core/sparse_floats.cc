#include "loom/core/sparse_floats.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "loom/core/check.h"
#include "loom/core/error.h"

namespace loom {

SparseFloats::SparseFloats(size_t n, const std::vector<Range>& absent) : n_(n) {
  if (n == 0) return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)), per_page = page / sizeof(float);
  mapped_ = (n * sizeof(float) + page - 1) / page * page;
  // Anonymous pages are zero and take memory only once touched; the holes never are.
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw UserError(
        "cannot map " + std::to_string(mapped_) + " bytes for the parameters: " + errno_text(errno),
        "free memory on this machine, or hold fewer parameters per rank");
  data_ = static_cast<float*>(p);
  size_t prev = 0, holes = 0;
  for (const auto& [lo, hi] : absent) {
    LOOM_CHECK(prev <= lo && lo <= hi && hi <= n);
    prev = hi;
    const size_t a = (lo + per_page - 1) / per_page * per_page, b = hi / per_page * per_page;
    if (a >= b) continue;
    if (mprotect(data_ + a, (b - a) * sizeof(float), PROT_NONE) != 0)
      throw InternalError("cannot protect the offloaded parameters' pages: " + errno_text(errno));
    holes_.push_back({a, b});
    holes += b - a;
  }
  resident_ = (n - holes) * sizeof(float);
  account_ = &StateMemory::mine();
  account_->add(resident_);
}

SparseFloats& SparseFloats::operator=(SparseFloats&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr), n_ = std::exchange(o.n_, 0);
    mapped_ = std::exchange(o.mapped_, 0), resident_ = std::exchange(o.resident_, 0);
    holes_ = std::move(o.holes_), account_ = std::exchange(o.account_, nullptr);
  }
  return *this;
}

SparseFloats::~SparseFloats() {
  release();
}

void SparseFloats::release() {
  if (!data_) return;
  munmap(data_, mapped_);
  if (account_) account_->sub(resident_);
  data_ = nullptr, n_ = mapped_ = resident_ = 0, holes_.clear(), account_ = nullptr;
}

std::vector<SparseFloats::Range> SparseFloats::resident(size_t lo, size_t hi) const {
  std::vector<Range> out;
  for (const auto& [a, b] : holes_) {
    if (b <= lo) continue;
    if (a >= hi) break;
    if (lo < a) out.push_back({lo, a});
    lo = std::max(lo, b);
  }
  if (lo < hi) out.push_back({lo, hi});
  return out;
}

}  // namespace loom
