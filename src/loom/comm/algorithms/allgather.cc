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
// hier    Leaders gather their host's blocks over shm, exchange them with every other
//         host's leader at once (the all-to-all pattern between machines), and pass every
//         block on to their local ranks over shm. In chunks of every block: chunk t's local
//         gather, chunk t-1's exchange between leaders and chunk t-2's hand-out run at once,
//         so the link does not wait for the local steps. Wire between hosts: (h-1)/h N per
//         leader.
// shared  (allgather_shared) The output is one buffer per machine that all its ranks map.
//         A barrier among the machine's ranks (each is done reading the last result), then
//         each rank copies its own block into place and sends it to every other machine's
//         first rank, which receives those machines' blocks into place; a second local
//         barrier publishes the result. Per rank: a copy of its own block (N/n), not of the
//         n-1 others; wire between hosts: N/n per rank per other host.
#include <algorithm>
#include <string>
#include <utility>

#include "loom/comm/algorithms/algorithms.h"
#include "loom/comm/algorithms/util.h"
#include "loom/comm/reduce.h"
#include "loom/core/error.h"

namespace loom::comm::algo {
namespace {
void place_own(Exec& x, const void* in, void* out, const Blocks& b) {
  copy_bytes(at(out, b.off[x.rank()]), in, b.len[x.rank()]);
}
}  // namespace

void allgather_ring(Exec& x, const void* in, void* out, const Blocks& b) {
  const int n = x.size(), r = x.rank();
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  void* own = at(out, b.off[r]);
  // Our own block leaves straight from `in`. Its copy into `out`: where each rank has a core
  // and the output is not written with non-temporal stores, the shared-memory pair places it
  // as it writes each piece into the ring (`in` read once, from cache: 1.05-1.21x the separate
  // copy at 256 KiB-4 MiB on 2 ranks, docs/perf.md); otherwise a background copy overlaps
  // the ring's waits.
  const bool fused =
      own != in && x.is_shm(next) && !x.topo().oversubscribed && !x.streams(b.len[r]);
  if (!fused) x.copy_in_background(own, in, b.len[r]);
  for (int s = 0; s < n - 1; ++s) {
    int sb = mod(r - s, n), rb = mod(r - s - 1, n);
    SendReq* snd = s == 0 && fused ? x.send_and_place(next, in, b.len[r], own)
                                   : x.send(next, s == 0 ? in : at(out, b.off[sb]), b.len[sb]);
    RecvReq* rcv = x.recv(prev, at(out, b.off[rb]), b.len[rb]);
    x.wait(rcv);
    x.wait(snd);
    if (s == 0 && fused) x.place_rest(snd);
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
  const int n = x.size(), r = x.rank();
  const int my_host = t.host_of[r];
  const std::vector<int>& local = t.local(r);
  const int leader = local.front();
  const size_t es = x.esize();
  size_t longest = 0;
  for (int q = 0; q < n; ++q) longest = std::max(longest, b.len[q]);
  // Chunks of each block, sized so that one chunk of all n blocks is about LOOM_HIER_CHUNK.
  const size_t chunk = std::max(es, hier_chunk_bytes() / static_cast<size_t>(n) / es * es);
  const size_t nchunks = std::max<size_t>(1, (longest + chunk - 1) / chunk);
  // Chunk c of block q: [o, o + l) of it (empty past its end).
  auto piece = [&](int q, size_t c) {
    const size_t o = std::min(b.len[q], c * chunk);
    return std::pair<size_t, size_t>(b.off[q] + o, std::min(chunk, b.len[q] - o));
  };
  x.copy_in_background(at(out, b.off[r]), in, b.len[r]);
  for (size_t tick = 0; tick < nchunks + 2; ++tick) {
    if (tick < nchunks) {  // local gather of chunk `tick`
      if (r != leader) {
        const size_t o = std::min(b.len[r], tick * chunk);
        const size_t l = std::min(chunk, b.len[r] - o);
        if (l > 0) x.send(leader, at(in, o), l);
      } else {
        for (size_t i = 1; i < local.size(); ++i) {
          auto [o, l] = piece(local[i], tick);
          if (l > 0) x.recv(local[i], at(out, o), l);
        }
      }
    }
    if (r == leader && tick >= 1 && tick - 1 < nchunks) {  // exchange between leaders
      for (int i = 1; i < t.nhosts(); ++i) {               // staggered: host h+1, h+2, ...
        const int h = (my_host + i) % t.nhosts();
        for (int q : local) {
          auto [o, l] = piece(q, tick - 1);
          if (l > 0) x.send(t.leader_of_host(h), q == r ? at(in, o - b.off[r]) : at(out, o), l);
        }
      }
      for (int h = 0; h < t.nhosts(); ++h) {
        if (h == my_host) continue;
        for (int q : t.hosts[h]) {
          auto [o, l] = piece(q, tick - 1);
          if (l > 0) x.recv(t.leader_of_host(h), at(out, o), l);
        }
      }
    }
    if (tick >= 2 && tick - 2 < nchunks) {  // hand out chunk tick-2 of every block
      for (int q = 0; q < n; ++q) {
        auto [o, l] = piece(q, tick - 2);
        if (l == 0) continue;
        if (r != leader) {
          if (q != r) x.recv(leader, at(out, o), l);
        } else {
          for (size_t i = 1; i < local.size(); ++i)
            if (local[i] != q) x.send(local[i], at(out, o), l);
        }
      }
    }
    x.wait_all();
  }
}

namespace {

// A dissemination barrier among `local` (this host's ranks, ascending); every message
// carries `id`, and a rank that receives another id fails (a desync: the ranks named
// different machine buffers).
void local_barrier(Exec& x, const std::vector<int>& local, uint64_t id) {
  const int n = static_cast<int>(local.size());
  const int i = static_cast<int>(std::find(local.begin(), local.end(), x.rank()) - local.begin());
  for (int dist = 1; dist < n; dist <<= 1) {
    uint64_t got = id;
    const int from = local[mod(i - dist, n)];
    x.send(local[(i + dist) % n], &id, sizeof id);
    x.recv(from, &got, sizeof got);
    x.wait_all();
    if (got != id)  // a desync: the communicator aborts the job, so no rank waits on
      throw PeerError(PeerError::Kind::kDesync,  // the second barrier until its deadline
                      "allgather_shared: ranks " + std::to_string(x.rank()) + " and " +
                          std::to_string(from) +
                          " of one machine named different machine buffers; every rank of a "
                          "machine must gather into the same buffer (the n-th "
                          "alloc_machine_buffer of each)",
                      from);
  }
}

}  // namespace

void allgather_shared(Exec& x, const void* in, void* out, const Blocks& b, uint64_t id) {
  const Topology& t = x.topo();
  const int r = x.rank();
  const int my_host = t.host_of[r];
  const std::vector<int>& local = t.local(r);
  local_barrier(x, local, id);  // nobody reads the last result any more
  x.copy_in_background(at(out, b.off[r]), in, b.len[r]);
  for (int i = 1; i < t.nhosts(); ++i) {  // staggered: host h+1, h+2, ...
    const int h = (my_host + i) % t.nhosts();
    if (b.len[r] > 0) x.send(t.leader_of_host(h), in, b.len[r]);
  }
  if (r == local.front())
    for (int h = 0; h < t.nhosts(); ++h)
      if (h != my_host)
        for (int q : t.hosts[h])
          if (b.len[q] > 0) x.recv(q, at(out, b.off[q]), b.len[q]);
  x.wait_all();
  local_barrier(x, local, id);  // every block of the machine's buffer is in place
}

}  // namespace loom::comm::algo
