// Allgather(v) algorithms. n ranks, block r of the output comes from rank r; N = total
// output bytes.
//
// ring    n-1 steps; at step s rank r forwards block r-s to r+1 and receives block r-s-1.
//         Wire: (n-1)/n N per rank; latency (n-1) alpha. Bandwidth-optimal.
// direct  Every rank sends its block to every other rank at once and receives all n-1
//         blocks at once (the all-to-all pattern). Same bytes as ring, one step of latency;
//         across machines it keeps every link busy at the same time.
// rd      Recursive doubling (n a power of two): log2 n rounds, exchanging the contiguous
//         run of blocks gathered so far with rank^2^k. Wire: (n-1)/n N; log2 n alpha.
// hier    Leaders gather their host's blocks over shm, exchange host bundles directly over
//         TCP, then send the whole output to their local ranks over shm.
#include "loom/comm/algorithms/algorithms.h"
#include "loom/comm/algorithms/util.h"
#include "loom/comm/reduce.h"

namespace loom::comm::algo {
namespace {
void place_own(Exec& x, const void* in, void* out, const Blocks& b) {
  copy_bytes(at(out, b.off[x.rank()]), in, b.len[x.rank()]);
}
}  // namespace

void allgather_ring(Exec& x, const void* in, void* out, const Blocks& b) {
  const int n = x.size(), r = x.rank();
  // Our own block leaves straight from `in`; its copy into `out` overlaps the ring.
  x.copy_in_background(at(out, b.off[r]), in, b.len[r]);
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  for (int s = 0; s < n - 1; ++s) {
    int sb = mod(r - s, n), rb = mod(r - s - 1, n);
    SendReq* snd = x.send(next, s == 0 ? in : at(out, b.off[sb]), b.len[sb]);
    RecvReq* rcv = x.recv(prev, at(out, b.off[rb]), b.len[rb]);
    x.wait(rcv);
    x.wait(snd);
  }
  x.wait_all();
}

void allgather_direct(Exec& x, const void* in, void* out, const Blocks& b) {
  const int n = x.size(), r = x.rank();
  for (int i = 1; i < n; ++i) {
    int q = mod(r + i, n);  // stagger the peers so no rank is everyone's first target
    x.send(q, in, b.len[r]);
  }
  for (int i = 1; i < n; ++i) {
    int q = mod(r - i, n);
    x.recv(q, at(out, b.off[q]), b.len[q]);
  }
  x.copy_in_background(at(out, b.off[r]), in, b.len[r]);
  x.wait_all();
}

void allgather_rd(Exec& x, const void* in, void* out, const Blocks& b) {
  const int n = x.size(), r = x.rank();
  place_own(x, in, out, b);
  for (int mask = 1; mask < n; mask <<= 1) {
    int partner = r ^ mask;
    int mine = r & ~(mask - 1), theirs = partner & ~(mask - 1);
    auto span = [&](int first) {
      return std::pair<size_t, size_t>(
          b.off[first], b.off[first + mask - 1] + b.len[first + mask - 1] - b.off[first]);
    };
    auto [mo, ml] = span(mine);
    auto [to, tl] = span(theirs);
    SendReq* s = x.send(partner, at(out, mo), ml);
    RecvReq* rv = x.recv(partner, at(out, to), tl);
    x.wait(rv);
    x.wait(s);
  }
}

void allgather_hier(Exec& x, const void* in, void* out, const Blocks& b) {
  const Topology& t = x.topo();
  const int r = x.rank();
  const int my_host = t.host_of[r];
  const std::vector<int>& local = t.hosts[my_host];
  const int leader = local.front();
  place_own(x, in, out, b);
  if (r != leader) {
    x.send(leader, in, b.len[r]);
    x.wait_all();
    x.wait(x.recv(leader, out, b.total()));
    return;
  }
  for (size_t i = 1; i < local.size(); ++i)
    x.recv(local[i], at(out, b.off[local[i]]), b.len[local[i]]);
  x.wait_all();
  // Exchange host bundles with every other leader: one message per block, in rank order.
  for (int h = 0; h < t.nhosts(); ++h) {
    if (h == my_host) continue;
    int other = t.leader_of_host(h);
    for (int q : local) x.send(other, at(out, b.off[q]), b.len[q]);
    for (int q : t.hosts[h]) x.recv(other, at(out, b.off[q]), b.len[q]);
  }
  x.wait_all();
  for (size_t i = 1; i < local.size(); ++i) x.send(local[i], out, b.total());
  x.wait_all();
}

}  // namespace loom::comm::algo
