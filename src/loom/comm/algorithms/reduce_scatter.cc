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
// hier    Several hosts: each host's leader sums its local ranks' inputs over shm, sends
//         every other host's leader the partial sums of that host's blocks (all at once:
//         the all-to-all pattern between machines), adds what the other leaders sent for
//         its own host's blocks (in host order), and hands each local rank its block. In
//         chunks of every block: chunk t's local sum, chunk t-1's exchange between leaders
//         and chunk t-2's hand-out run at once. Wire between hosts: (h-1)/h N per leader,
//         where ring sends (n-1)/n N across each host boundary.
// shared  One machine, every rank's input reachable from every other (in a shared buffer,
//         or thread ranks of one process): the ranks name their inputs to each other, then
//         rank r reduces block r of all n inputs, in rank order, piece by piece into its
//         output, reading the peers' inputs through its mappings of them; a second exchange
//         says "done" (a peer may not touch its input before). Each input byte is read once
//         by the one rank that needs it, nothing goes through the rings; two steps of
//         latency. Where some rank's input is on another process's heap, ring.
#include <algorithm>
#include <atomic>
#include <vector>

#include "loom/comm/algorithms/algorithms.h"
#include "loom/comm/algorithms/util.h"
#include "loom/comm/reduce.h"
#include "loom/core/tsan.h"

namespace loom::comm::algo {
namespace {
std::atomic<uint64_t> g_fused{0};
}  // namespace

uint64_t shared_reduce_scatters_fused() {
  return g_fused.load(std::memory_order_relaxed);
}

void reduce_scatter_shared(Exec& x, const void* in, void* out, size_t count) {
  const int n = x.size(), r = x.rank();
  const size_t es = x.esize(), bb = count * es, total = bb * static_cast<size_t>(n);
  if (n == 1 || bb == 0) return copy_bytes(out, at(in, r * bb), bb);
  std::vector<PeerBuffer> named(n);
  named[r] = Exec::name_buffer(in, total);
  tsan_release(in);  // what we wrote before the call, for the peers
  exchange_with_all(x, &named[r], named.data(), sizeof(PeerBuffer));
  // The same decision on every rank: one process, or every input in a shared buffer.
  bool one_process = true, all_shared = true;
  for (const PeerBuffer& b : named)
    one_process = one_process && b.pid == named[0].pid, all_shared = all_shared && b.fd >= 0;
  if (!one_process && !all_shared) return reduce_scatter_ring(x, in, out, count);
  g_fused.fetch_add(1, std::memory_order_relaxed);

  std::vector<const std::byte*> ins(n);
  for (int q = 0; q < n; ++q) {
    const std::byte* base =
        q == r ? static_cast<const std::byte*>(in) : x.peer_memory(q, named[q], total);
    if (q != r) tsan_acquire(base);  // where its owner released it
    ins[q] = base + r * bb;
  }
  // Into our output, unless it overlaps our own block of the input and ranks before ours
  // are folded in first (they would overwrite it before it is read): then through scratch.
  // A large out-of-place output takes its last fold with non-temporal stores (the earlier
  // folds stay in a cached scratch piece): nobody reads it before the call returns.
  const auto* o0 = static_cast<const std::byte*>(out);
  const bool overlap = o0 < ins[r] + bb && ins[r] < o0 + bb;
  const bool stream = !overlap && x.streams(bb);
  const size_t piece = shared_piece(es);
  std::byte* acc = (overlap && r >= 2) || (stream && n > 2) ? x.scratch(piece) : nullptr;
  const DType t = x.dtype();
  const ReduceOp op = x.redop();
  for (size_t p = 0; p < bb; p += piece) {
    const size_t l = std::min(piece, bb - p), c = l / es;
    if (stream) {
      const std::byte* a = ins[0] + p;
      if (n > 2) {
        reduce_into(acc, ins[0] + p, ins[1] + p, c, t, op);
        for (int q = 2; q < n - 1; ++q) reduce_into(acc, acc, ins[q] + p, c, t, op);
        a = acc;
      }
      reduce_streaming(at(out, p), a, ins[n - 1] + p, c, t, op);
      continue;
    }
    std::byte* dst = acc ? acc : at(out, p);
    reduce_into(dst, ins[0] + p, ins[1] + p, c, t, op);
    for (int q = 2; q < n; ++q) reduce_into(dst, dst, ins[q] + p, c, t, op);
    if (acc) copy_bytes(at(out, p), acc, l);
  }
  count_shared_read(static_cast<uint64_t>(n - 1) * bb);
  // Done: we read no peer's input any more.
  for (int q = 0; q < n; ++q)
    if (q != r) tsan_release(ins[q]);
  exchange_with_all(x, nullptr, nullptr, 0);
  for (int q = 0; q < n; ++q)
    if (q != r) tsan_acquire(at(in, q * bb));
}

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

void reduce_scatter_hier(Exec& x, const void* in, void* out, size_t count) {
  const Topology& t = x.topo();
  const int n = x.size(), r = x.rank();
  const int my_host = t.host_of[r];
  const std::vector<int>& local = t.local(r);
  const int leader = local.front();
  const size_t es = x.esize(), bb = count * es;
  // Chunks of each block, sized so that one chunk of all n blocks is about LOOM_HIER_CHUNK.
  const size_t chunk = std::max(es, hier_chunk_bytes() / static_cast<size_t>(n) / es * es);
  const size_t nchunks = std::max<size_t>(1, (bb + chunk - 1) / chunk);
  auto off_of = [&](size_t c) { return c * chunk; };
  auto len_of = [&](size_t c) { return std::min(chunk, bb - std::min(bb, c * chunk)); };
  // The leader sums into `work` (N bytes): block q's partial sum at q * bb.
  std::byte* work = r == leader ? x.scratch(static_cast<size_t>(n) * bb) : nullptr;
  for (size_t tick = 0; tick < nchunks + 2; ++tick) {
    if (tick < nchunks) {  // local sum of chunk `tick` of every block
      const size_t o = off_of(tick), l = len_of(tick);
      for (int q = 0; q < n && l > 0; ++q) {
        if (r != leader) {
          x.send(leader, at(in, q * bb + o), l);
          continue;
        }
        copy_bytes(work + q * bb + o, at(in, q * bb + o), l);
        const RecvReq* prev = nullptr;
        for (size_t i = 1; i < local.size(); ++i)
          prev = x.recv_reduce(local[i], work + q * bb + o, work + q * bb + o, l, prev);
      }
    }
    if (r == leader && tick >= 1 && tick - 1 < nchunks) {  // exchange between leaders
      const size_t o = off_of(tick - 1), l = len_of(tick - 1);
      for (int i = 1; i < t.nhosts() && l > 0; ++i) {  // staggered: h+1, h+2, ...
        const int h = (my_host + i) % t.nhosts();
        for (int q : t.hosts[h]) x.send(t.leader_of_host(h), work + q * bb + o, l);
      }
      for (int q : local) {  // the other hosts' sums of our blocks, added in host order
        const RecvReq* prev = nullptr;
        for (int h = 0; h < t.nhosts() && l > 0; ++h)
          if (h != my_host)
            prev =
                x.recv_reduce(t.leader_of_host(h), work + q * bb + o, work + q * bb + o, l, prev);
      }
    }
    if (tick >= 2 && tick - 2 < nchunks) {  // hand out chunk tick-2 of each local block
      const size_t o = off_of(tick - 2), l = len_of(tick - 2);
      if (r != leader) {
        if (l > 0) x.recv(leader, at(out, o), l);
      } else if (l > 0) {
        for (size_t i = 1; i < local.size(); ++i) x.send(local[i], work + local[i] * bb + o, l);
        copy_bytes(at(out, o), work + r * bb + o, l);
      }
    }
    x.wait_all();
  }
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
