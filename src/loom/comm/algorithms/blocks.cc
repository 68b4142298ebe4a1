#include "loom/comm/algorithms/algorithms.h"
#include "loom/comm/algorithms/util.h"
#include "loom/comm/reduce.h"

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

void reduce_all_in_rank_order(Exec& x, void* out, const void* own, size_t count) {
  const int n = x.size(), r = x.rank();
  const size_t bytes = count * x.esize();
  const RecvReq* prev = nullptr;
  for (int q = 0; q < r; ++q)
    prev = q == 0 ? x.recv(q, out, bytes) : x.recv_reduce(q, out, out, bytes, prev);
  if (prev) x.wait(prev);
  if (r == 0)
    copy_bytes(out, own, bytes);
  else
    reduce_into(out, out, own, count, x.dtype(), x.redop());
  prev = nullptr;
  for (int q = r + 1; q < n; ++q) prev = x.recv_reduce(q, out, out, bytes, prev);
  x.wait_all();
}

}  // namespace loom::comm::algo
