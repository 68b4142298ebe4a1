#include "loom/core/checksum.h"

#include <cstring>

namespace loom {
namespace {
constexpr uint64_t kPrime = 1099511628211ull;
}

void Checksum64::update(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n && npending_) {  // finish a word split across calls
    pending_[npending_++] = *p++;
    --n;
    if (npending_ == 8) {
      uint64_t w;
      std::memcpy(&w, pending_, 8);
      h_ = (h_ ^ w) * kPrime;
      npending_ = 0;
    }
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h_ = (h_ ^ w) * kPrime;
  }
  while (n--) pending_[npending_++] = *p++;
}

uint64_t Checksum64::value() const {
  uint64_t h = h_;
  for (size_t i = 0; i < npending_; ++i) h = (h ^ pending_[i]) * kPrime;
  return h;
}

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * kPrime;
  return h;
}

uint64_t checksum64(const void* data, size_t n) {
  Checksum64 c;
  c.update(data, n);
  return c.value();
}

}  // namespace loom
