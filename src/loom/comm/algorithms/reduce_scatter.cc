// Reduce-scatter algorithms: rank r ends with block r of the element-wise reduction.
// n ranks, B = bytes per block, N = nB.
//
// ring    n-1 steps around the ring; a partial block travels n-1 hops, picking up one
//         rank's contribution per hop, and lands complete at its owner. Two block-sized
//         scratch slots. Wire: (n-1) B per rank.
// direct  Every rank sends block q of its input to rank q at once; each rank reduces the
//         n contributions to its block in rank order. Wire: (n-1) B; one step.
// rd      Recursive halving (n a power of two): log2 n rounds; in each, keep the half of
//         the remaining range that holds your block, send the other half to rank^2^k and
//         reduce what comes back. Wire: (n-1) B; needs an N-byte scratch copy.
#include "loom/comm/algorithms/algorithms.h"
#include "loom/comm/algorithms/util.h"
#include "loom/comm/reduce.h"

namespace loom::comm::algo {

void reduce_scatter_ring(Exec& x, const void* in, void* out, size_t count) {
  const int n = x.size(), r = x.rank();
  const size_t bb = count * x.esize();
  if (n == 1) {
    copy_bytes(out, in, bb);
    return;
  }
  std::byte* slots = x.scratch(2 * bb);
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  for (int s = 0; s < n - 1; ++s) {
    int sb = mod(r - s - 1, n), rb = mod(r - s - 2, n);
    const void* src = s == 0 ? at(in, sb * bb) : slots + ((s - 1) % 2) * bb;
    void* dst = s == n - 2 ? out : slots + (s % 2) * bb;
    SendReq* snd = x.send(next, src, bb);
    RecvReq* rcv = x.recv_reduce(prev, dst, at(in, rb * bb), bb);
    x.wait(rcv);
    x.wait(snd);
  }
}

void reduce_scatter_direct(Exec& x, const void* in, void* out, size_t count) {
  const int n = x.size(), r = x.rank();
  const size_t bb = count * x.esize();
  const void* own = at(in, r * bb);
  if (n == 1) {
    copy_bytes(out, own, bb);
    return;
  }
  if (out == own) {  // in place: keep our contribution before the chain overwrites it
    std::byte* keep = x.scratch(bb);
    copy_bytes(keep, own, bb);
    own = keep;
  }
  for (int i = 1; i < n; ++i) {
    int q = mod(r + i, n);
    x.send(q, at(in, q * bb), bb);
  }
  reduce_all_in_rank_order(x, out, own, count);
}

void reduce_scatter_rd(Exec& x, const void* in, void* out, size_t count) {
  const int n = x.size(), r = x.rank();
  const size_t bb = count * x.esize();
  std::byte* work = x.scratch(n * bb);
  copy_bytes(work, in, n * bb);
  int lo = 0;
  for (int mask = n / 2; mask >= 1; mask /= 2) {
    int partner = r ^ mask;
    int keep_lo = (r & mask) ? lo + mask : lo;
    int send_lo = (r & mask) ? lo : lo + mask;
    SendReq* s = x.send(partner, work + send_lo * bb, mask * bb);
    RecvReq* rv = x.recv_reduce(partner, work + keep_lo * bb, work + keep_lo * bb, mask * bb);
    x.wait(rv);
    x.wait(s);
    lo = keep_lo;
  }
  copy_bytes(out, work + r * bb, bb);
}

}  // namespace loom::comm::algo
