// Rooted collectives: broadcast, reduce, gather, scatter; plus alltoall and the barrier.
// vr = (rank - root) mod n is a rank's position relative to the root.
//
// broadcast tree    Binomial tree: vr receives from vr minus its lowest set bit, then sends
//                   to vr + 2^k for each 2^k below that bit. Chunked (LOOM_PIPELINE_CHUNK):
//                   a rank forwards chunk c while it receives chunk c+1. log2 n alpha + N/beta
//                   + (log2 n - 1) chunk/beta.
// broadcast ring    A chain root -> root+1 -> ..., chunked the same way: every link carries N
//                   once; wins for very large messages when latency is cheap.
// broadcast direct  The root sends N to every rank: (n-1) N from the root, one step.
// reduce tree       Binomial tree toward the root, chunked; children folded in a fixed order.
// reduce direct     Every rank sends N to the root, which reduces them in rank order.
// gather / scatter  Direct: the root receives / sends one block per rank, all at once.
// alltoall          Direct: block q of every rank's input goes to rank q, all at once,
//                   peers staggered by rank. Wire: (n-1)/n N per rank.
// barrier           Dissemination: in round k rank r signals r+2^k and waits for r-2^k;
//                   ceil(log2 n) rounds of empty messages.
#include <algorithm>

#include "loom/comm/algorithms/algorithms.h"
#include "loom/comm/algorithms/util.h"
#include "loom/comm/reduce.h"

namespace loom::comm::algo {

void broadcast_tree(Exec& x, void* buf, size_t bytes, int root) {
  const int n = x.size(), vr = mod(x.rank() - root, n);
  if (n == 1) return;
  int low = 1;  // lowest set bit of vr (n for the root): our subtree spans vr .. vr+low-1
  while (low < n && !(vr & low)) low <<= 1;
  const size_t chunk = pipeline_chunk(x.esize());
  size_t off = 0;
  do {
    size_t len = std::min(chunk, bytes - off);
    if (vr != 0) x.wait(x.recv(mod(vr - low + root, n), at(buf, off), len));
    for (int mask = low >> 1; mask >= 1; mask >>= 1)
      if (vr + mask < n) x.send(mod(vr + mask + root, n), at(buf, off), len);
    off += len;
  } while (off < bytes);
  x.wait_all();
}

void broadcast_ring(Exec& x, void* buf, size_t bytes, int root) {
  const int n = x.size(), vr = mod(x.rank() - root, n);
  if (n == 1) return;
  const size_t chunk = pipeline_chunk(x.esize());
  size_t off = 0;
  do {
    size_t len = std::min(chunk, bytes - off);
    if (vr != 0) x.wait(x.recv(mod(x.rank() - 1, n), at(buf, off), len));
    if (vr != n - 1) x.send(mod(x.rank() + 1, n), at(buf, off), len);
    off += len;
  } while (off < bytes);
  x.wait_all();
}

void broadcast_direct(Exec& x, void* buf, size_t bytes, int root) {
  const int n = x.size(), r = x.rank();
  if (r == root) {
    for (int i = 1; i < n; ++i) x.send(mod(r + i, n), buf, bytes);
  } else {
    x.recv(root, buf, bytes);
  }
  x.wait_all();
}

void reduce_tree(Exec& x, const void* in, void* out, size_t count, int root) {
  const size_t bytes = count * x.esize();
  void* work = x.rank() == root ? out : x.scratch(bytes);
  copy_bytes(work, in, bytes);
  if (x.size() == 1) return;
  binomial_reduce_inplace(x, work, bytes, root);
}

void reduce_direct(Exec& x, const void* in, void* out, size_t count, int root) {
  const int r = x.rank();
  const size_t bytes = count * x.esize();
  if (r != root) {
    x.send(root, in, bytes);
    x.wait_all();
    return;
  }
  if (in == out && r != 0) {
    std::byte* keep = x.scratch(bytes);
    copy_bytes(keep, in, bytes);
    in = keep;
  }
  reduce_all_in_rank_order(x, out, in, count);
}

void gather_direct(Exec& x, const void* in, void* out, size_t bytes, int root) {
  const int n = x.size(), r = x.rank();
  if (r == root) {
    for (int q = 0; q < n; ++q)
      if (q != r) x.recv(q, at(out, q * bytes), bytes);
    copy_bytes(at(out, r * bytes), in, bytes);
  } else {
    x.send(root, in, bytes);
  }
  x.wait_all();
}

void scatter_direct(Exec& x, const void* in, void* out, size_t bytes, int root) {
  const int n = x.size(), r = x.rank();
  if (r == root) {
    for (int i = 1; i < n; ++i) {
      int q = mod(r + i, n);
      x.send(q, at(in, q * bytes), bytes);
    }
    copy_bytes(out, at(in, r * bytes), bytes);
  } else {
    x.recv(root, out, bytes);
  }
  x.wait_all();
}

void alltoall_direct(Exec& x, const void* in, void* out, size_t bytes) {
  const int n = x.size(), r = x.rank();
  if (in == out) {
    std::byte* keep = x.scratch(n * bytes);
    copy_bytes(keep, in, n * bytes);
    in = keep;
  }
  for (int i = 1; i < n; ++i) {
    int to = mod(r + i, n), from = mod(r - i, n);
    x.send(to, at(in, to * bytes), bytes);
    x.recv(from, at(out, from * bytes), bytes);
  }
  copy_bytes(at(out, r * bytes), at(in, r * bytes), bytes);
  x.wait_all();
}

void barrier_dissemination(Exec& x) {
  const int n = x.size(), r = x.rank();
  for (int dist = 1; dist < n; dist <<= 1) {
    x.send(mod(r + dist, n), nullptr, 0);
    x.recv(mod(r - dist, n), nullptr, 0);
    x.wait_all();
  }
}

}  // namespace loom::comm::algo
