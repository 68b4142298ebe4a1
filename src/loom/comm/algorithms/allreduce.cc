// Allreduce algorithms. n ranks, N bytes per rank; alpha = per-message latency.
//
// ring    Reduce-scatter then allgather around the ring 0 -> 1 -> ... -> n-1 -> 0, each in
//         n-1 steps of N/n bytes. Wire: 2(n-1)/n * N per rank. Time ~ 2(n-1)alpha +
//         2(n-1)/n N/beta. Bandwidth-optimal: wins for large messages.
// rd      Recursive doubling: log2(n) rounds, each exchanging all N bytes with rank^2^k and
//         reducing. Non-powers of two fold the first 2*rem ranks in pairs first and send the
//         result back at the end. Wire: log2(n) * N. Wins for small messages.
// direct  One shot: every rank sends its N bytes to every other rank and reduces all n
//         inputs in rank order. Wire: (n-1) N. One step of latency: wins for small
//         messages inside a machine, where the n-1 sends run in parallel.
// tree    Binomial reduce to rank 0 then binomial broadcast, both pipelined in chunks.
// hier    Two levels: reduce to each host's leader over shm, ring allreduce among the
//         leaders over TCP, broadcast back over shm; in chunks, so that chunk k's local
//         reduce, chunk k-1's inter-host ring and chunk k-2's local broadcast overlap.
// shared  One machine, every rank's buffers reachable from every other (each in a shared
//         buffer, or thread ranks of one process): the ranks name their buffers to each
//         other, then rank r reduces block r of all n inputs, in rank order, piece by piece
//         into its own output and copies each piece into the n-1 other outputs; a second
//         exchange says "done". Each input byte is read once and each output byte written
//         once (a fused reduce-scatter + allgather), in two steps of latency. Where some
//         rank's buffer is on the heap of another process, every rank runs ring instead.
#include <algorithm>
#include <atomic>

#include "loom/comm/algorithms/algorithms.h"
#include "loom/comm/algorithms/util.h"
#include "loom/comm/reduce.h"
#include "loom/core/tsan.h"
#include "loom/core/tunable.h"

namespace loom::comm::algo {
namespace {

const BytesTunable kPipelineChunk("LOOM_PIPELINE_CHUNK", 256 << 10,
                                  "chunk bytes for pipelined tree/chain broadcast and reduce");
const BytesTunable kSharedPiece("LOOM_SHARED_ALLREDUCE_PIECE", 64 << 10,
                                "bytes the shared allreduce reduces before copying them out (and "
                                "the shared reduce-scatter at a time)");
std::atomic<uint64_t> g_fused{0};
std::atomic<uint64_t> g_shared_read{0};
const BytesTunable kHierChunk("LOOM_HIER_CHUNK", 1 << 20,
                              "chunk bytes of the hierarchical pipelines (allreduce, "
                              "reduce_scatter: all blocks together)");

// Ring allreduce among `members` (ascending ranks); `me` is this rank's index in it.
void ring_allreduce_members(Exec& x, const std::vector<int>& members, int me, const void* in,
                            void* out, size_t count) {
  const int k = static_cast<int>(members.size());
  const size_t es = x.esize();
  if (k == 1) {
    copy_bytes(out, in, count * es);
    return;
  }
  const int next = members[mod(me + 1, k)], prev = members[mod(me - 1, k)];
  Blocks b = even_blocks(count, k, es);
  // Reduce-scatter: step s sends block me-s, receives block me-s-1 and folds in our input.
  for (int s = 0; s < k - 1; ++s) {
    int sb = mod(me - s, k), rb = mod(me - s - 1, k);
    const void* src = s == 0 ? at(in, b.off[sb]) : at(out, b.off[sb]);
    SendReq* snd = x.send(next, src, b.len[sb]);
    RecvReq* rcv = x.recv_reduce(prev, at(out, b.off[rb]), at(in, b.off[rb]), b.len[rb]);
    x.wait(rcv);
    x.wait(snd);
  }
  // Block me+1 is now complete here. Allgather: pass complete blocks along.
  for (int s = 0; s < k - 1; ++s) {
    int sb = mod(me + 1 - s, k), rb = mod(me - s, k);
    SendReq* snd = x.send(next, at(out, b.off[sb]), b.len[sb]);
    RecvReq* rcv = x.recv(prev, at(out, b.off[rb]), b.len[rb]);
    x.wait(rcv);
    x.wait(snd);
  }
}

}  // namespace

void binomial_reduce_inplace(Exec& x, void* work, size_t bytes, int root) {
  const int n = x.size(), vr = mod(x.rank() - root, n);
  const size_t chunk = pipeline_chunk(x.esize());
  size_t off = 0;
  do {
    size_t len = std::min(chunk, bytes - off);
    for (int mask = 1; mask < n; mask <<= 1) {
      if (vr & mask) {
        x.send(mod(vr - mask + root, n), at(work, off), len);
        break;
      }
      if (vr + mask < n) {
        RecvReq* r = x.recv_reduce(mod(vr + mask + root, n), at(work, off), at(work, off), len);
        x.wait(r);
      }
    }
    off += len;
  } while (off < bytes);
  x.wait_all();
}

namespace {
// A byte-count tunable (at least 64) rounded down to whole elements, one at least.
size_t whole_elements(const BytesTunable& bytes, size_t esize) {
  const size_t c = static_cast<size_t>(std::max<int64_t>(bytes.get(), 64));
  return std::max(esize, c / esize * esize);
}
}  // namespace

size_t pipeline_chunk(size_t esize) {
  return whole_elements(kPipelineChunk, esize);
}

void allreduce_ring(Exec& x, const void* in, void* out, size_t count) {
  std::vector<int> all(x.size());
  for (int i = 0; i < x.size(); ++i) all[i] = i;
  ring_allreduce_members(x, all, x.rank(), in, out, count);
}

void allreduce_rd(Exec& x, const void* in, void* out, size_t count) {
  const int n = x.size(), r = x.rank();
  const size_t bytes = count * x.esize();
  copy_bytes(out, in, bytes);
  if (n == 1) return;
  const int p = largest_pow2_at_most(n), rem = n - p;
  std::byte* tmp = x.scratch(bytes);
  // Fold: among the first 2*rem ranks, even ones hand their data to the odd neighbour.
  int vr;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      x.wait(x.send(r + 1, out, bytes));
      vr = -1;
    } else {
      x.wait(x.recv(r - 1, tmp, bytes));
      reduce_into(out, tmp, out, count, x.dtype(), x.redop());
      vr = r / 2;
    }
  } else {
    vr = r - rem;
  }
  if (vr >= 0) {
    for (int mask = 1; mask < p; mask <<= 1) {
      int pvr = vr ^ mask;
      int peer = pvr < rem ? pvr * 2 + 1 : pvr + rem;
      SendReq* s = x.send(peer, out, bytes);
      RecvReq* rv = x.recv(peer, tmp, bytes);
      x.wait(rv);
      x.wait(s);
      // Lower rank's operand first, so both partners compute identical bits.
      if (peer < r)
        reduce_into(out, tmp, out, count, x.dtype(), x.redop());
      else
        reduce_into(out, out, tmp, count, x.dtype(), x.redop());
    }
  }
  if (r < 2 * rem) {
    if (r % 2 == 1)
      x.send(r - 1, out, bytes);
    else
      x.recv(r + 1, out, bytes);
    x.wait_all();
  }
}

void allreduce_direct(Exec& x, const void* in, void* out, size_t count) {
  const int n = x.size(), r = x.rank();
  const size_t bytes = count * x.esize();
  if (n == 1) {
    copy_bytes(out, in, bytes);
    return;
  }
  if (in == out) {  // the input must survive until the local reduction below
    std::byte* keep = x.scratch(bytes);
    copy_bytes(keep, in, bytes);
    in = keep;
  }
  for (int q = 0; q < n; ++q)
    if (q != r) x.send(q, in, bytes);
  // Reduce in rank order: ranks below us, our own input, ranks above us. Ranks 0 and 1 fold
  // their own input into the first receive (x0 op x1 either way round: IEEE sum and product
  // commute bitwise; min/max do not for signed zeros, so they keep the separate pass).
  const bool commutes = !dtype_is_float(x.dtype()) || x.redop() == ReduceOp::kSum ||
                        x.redop() == ReduceOp::kAvg || x.redop() == ReduceOp::kProd;
  if (!(commutes && r <= 1)) return reduce_all_in_rank_order(x, out, in, count);
  const RecvReq* prev = x.recv_reduce(1 - r, out, in, bytes);
  for (int q = 2; q < n; ++q) prev = x.recv_reduce(q, out, out, bytes, prev);
  x.wait_all();
}

void allreduce_tree(Exec& x, const void* in, void* out, size_t count) {
  const size_t bytes = count * x.esize();
  copy_bytes(out, in, bytes);
  if (x.size() == 1) return;
  binomial_reduce_inplace(x, out, bytes, 0);
  broadcast_tree(x, out, bytes, 0);
}

size_t hier_chunk_bytes() {
  return static_cast<size_t>(std::max<int64_t>(1, kHierChunk.get()));
}

void allreduce_hier(Exec& x, const void* in, void* out, size_t count) {
  const Topology& t = x.topo();
  const int r = x.rank();
  const std::vector<int>& local = t.local(r);
  const int leader = local.front();
  const bool is_leader = r == leader;
  std::vector<int> leaders;
  int my_leader_index = -1;
  for (int h = 0; h < t.nhosts(); ++h) {
    if (t.leader_of_host(h) == leader) my_leader_index = h;
    leaders.push_back(t.leader_of_host(h));
  }
  const size_t es = x.esize(), bytes = count * es;
  const size_t chunk = std::max(es, hier_chunk_bytes() / es * es);
  const size_t nchunks = std::max<size_t>(1, (bytes + chunk - 1) / chunk);
  auto off_of = [&](size_t c) { return c * chunk; };
  auto len_of = [&](size_t c) { return std::min(chunk, bytes - std::min(bytes, c * chunk)); };

  // Tick t: local reduce of chunk t, leaders' ring on chunk t-1, local broadcast of t-2.
  for (size_t tick = 0; tick < nchunks + 2; ++tick) {
    if (tick < nchunks) {
      size_t o = off_of(tick), l = len_of(tick);
      if (is_leader) {
        copy_bytes(at(out, o), at(in, o), l);
        const RecvReq* prev = nullptr;
        for (size_t i = 1; i < local.size(); ++i)
          prev = x.recv_reduce(local[i], at(out, o), at(out, o), l, prev);
      } else {
        x.send(leader, at(in, o), l);
      }
    }
    if (tick >= 2 && tick - 2 < nchunks) {
      size_t o = off_of(tick - 2), l = len_of(tick - 2);
      if (is_leader) {
        for (size_t i = 1; i < local.size(); ++i) x.send(local[i], at(out, o), l);
      } else {
        x.recv(leader, at(out, o), l);
      }
    }
    if (is_leader && tick >= 1 && tick - 1 < nchunks) {
      size_t o = off_of(tick - 1), l = len_of(tick - 1);
      ring_allreduce_members(x, leaders, my_leader_index, at(out, o), at(out, o), l / es);
    }
    x.wait_all();
  }
}

uint64_t shared_allreduces_fused() {
  return g_fused.load(std::memory_order_relaxed);
}

void exchange_with_all(Exec& x, const void* mine, void* all, size_t bytes) {
  const int n = x.size(), r = x.rank();
  for (int i = 1; i < n; ++i) {  // staggered: send to r+i while hearing from r-i
    const int from = mod(r - i, n);
    x.send(mod(r + i, n), mine, bytes);
    x.recv(from, bytes ? at(all, from * bytes) : nullptr, bytes);
  }
  x.wait_all();
}

uint64_t shared_bytes_read() {
  return g_shared_read.load(std::memory_order_relaxed);
}

void count_shared_read(uint64_t bytes) {
  g_shared_read.fetch_add(bytes, std::memory_order_relaxed);
}

size_t shared_piece(size_t esize) {
  return whole_elements(kSharedPiece, esize);
}

// Both buffers of one rank, as it names them to the others.
struct SharedEnds {
  PeerBuffer in, out;
};

void allreduce_shared(Exec& x, const void* in, void* out, size_t count) {
  const int n = x.size(), r = x.rank();
  const size_t es = x.esize(), bytes = count * es;
  if (n == 1 || bytes == 0) return copy_bytes(out, in, bytes);
  // Name our buffers to every rank and learn theirs.
  std::vector<SharedEnds> ends(n);
  ends[r] = {Exec::name_buffer(in, bytes), Exec::name_buffer(out, bytes)};
  tsan_release(in), tsan_release(out);  // what we wrote before the call, for the peers
  exchange_with_all(x, &ends[r], ends.data(), sizeof(SharedEnds));
  // The same decision on every rank: one process, or every buffer in a shared buffer.
  bool one_process = true, all_shared = true;
  for (const SharedEnds& e : ends) {
    one_process = one_process && e.in.pid == ends[0].in.pid;
    all_shared = all_shared && e.in.fd >= 0 && e.out.fd >= 0;
  }
  if (!one_process && !all_shared) return allreduce_ring(x, in, out, count);
  g_fused.fetch_add(1, std::memory_order_relaxed);

  std::vector<const std::byte*> ins(n);
  std::vector<std::byte*> outs(n);
  for (int q = 0; q < n; ++q) {
    ins[q] = q == r ? static_cast<const std::byte*>(in) : x.peer_memory(q, ends[q].in, bytes);
    outs[q] = q == r ? static_cast<std::byte*>(out) : x.peer_memory(q, ends[q].out, bytes);
    if (q != r) tsan_acquire(ins[q]), tsan_acquire(outs[q]);
  }
  const Blocks b = even_blocks(count, n, es);
  const size_t off = b.off[r], len = b.len[r];
  const size_t piece = shared_piece(es);
  // Reduce into our own output, unless it is our input (in place) and ranks before ours are
  // folded in first, which would overwrite it before it is read: then into scratch.
  const bool in_own_out = !(in == out && r >= 2);
  std::byte* acc = in_own_out ? nullptr : x.scratch(piece);
  const DType t = x.dtype();
  const ReduceOp op = x.redop();
  for (size_t p = 0; p < len; p += piece) {
    const size_t o = off + p, l = std::min(piece, len - p), c = l / es;
    std::byte* dst = in_own_out ? outs[r] + o : acc;
    reduce_into(dst, ins[0] + o, ins[1] + o, c, t, op);
    for (int q = 2; q < n; ++q) reduce_into(dst, dst, ins[q] + o, c, t, op);
    for (int i = in_own_out ? 1 : 0; i < n; ++i) {  // staggered: rank r+1 first
      const int q = mod(r + i, n);
      if (q != r && x.streams(len))
        copy_streaming(outs[q] + o, dst, l);
      else
        copy_bytes(outs[q] + o, dst, l);
    }
  }
  count_shared_read(static_cast<uint64_t>(n - 1) * len);
  // Done: our block is in every output and we read no input any more.
  for (int q = 0; q < n; ++q)
    if (q != r) tsan_release(ins[q] + off), tsan_release(outs[q] + off);
  exchange_with_all(x, nullptr, nullptr, 0);
  for (int q = 0; q < n; ++q)
    if (q != r) tsan_acquire(at(in, b.off[q])), tsan_acquire(at(out, b.off[q]));
}

}  // namespace loom::comm::algo
