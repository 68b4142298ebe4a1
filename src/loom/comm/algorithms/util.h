// Small helpers shared by the algorithm files.
#pragma once

#include <cstddef>

namespace loom::comm::algo {

inline std::byte* at(void* p, size_t off) {
  return static_cast<std::byte*>(p) + off;
}
inline const std::byte* at(const void* p, size_t off) {
  return static_cast<const std::byte*>(p) + off;
}
inline int mod(int a, int n) {
  return ((a % n) + n) % n;
}
inline int largest_pow2_at_most(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}
// Chunk size used by pipelined algorithms, rounded to whole elements.
size_t pipeline_chunk(size_t esize);

}  // namespace loom::comm::algo
