#include "loom/comm/algorithms/algorithms.h"

namespace loom::comm::algo {

Blocks even_blocks(size_t count, int n, size_t esize) {
  Blocks b;
  b.off.resize(n);
  b.len.resize(n);
  size_t base = count / n, extra = count % n, at = 0;
  for (int i = 0; i < n; ++i) {
    size_t c = base + (static_cast<size_t>(i) < extra ? 1 : 0);
    b.off[i] = at * esize;
    b.len[i] = c * esize;
    at += c;
  }
  return b;
}

Blocks blocks_from_counts(const std::vector<size_t>& counts, size_t esize) {
  Blocks b;
  size_t at = 0;
  for (size_t c : counts) {
    b.off.push_back(at);
    b.len.push_back(c * esize);
    at += c * esize;
  }
  return b;
}

}  // namespace loom::comm::algo
