// Collective algorithms, each a sequence of send / recv / recv_reduce primitives over the
// Exec interface. docs/algorithms.md gives every algorithm's steps and bytes on the wire.
//
// Conventions: `count` is in elements of exec.dtype(); byte offsets are element-aligned.
// Buffers may alias where the communicator's API allows in-place use (documented there).
// Reductions happen in a fixed order on every run, so results are reproducible, and where
// several ranks hold the same result it is bitwise identical on all of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/comm/exec.h"

namespace loom::comm::algo {

// Splits `count` elements into n nearly equal blocks; offsets and lengths in bytes.
struct Blocks {
  std::vector<size_t> off, len;
  size_t total() const { return off.empty() ? 0 : off.back() + len.back(); }
};
Blocks even_blocks(size_t count, int n, size_t esize);
Blocks blocks_from_counts(const std::vector<size_t>& counts, size_t esize);

// allreduce: out = reduce over ranks of in.
void allreduce_ring(Exec& x, const void* in, void* out, size_t count);
void allreduce_rd(Exec& x, const void* in, void* out, size_t count);
void allreduce_direct(Exec& x, const void* in, void* out, size_t count);
void allreduce_tree(Exec& x, const void* in, void* out, size_t count);
void allreduce_hier(Exec& x, const void* in, void* out, size_t count);
void allreduce_shared(Exec& x, const void* in, void* out, size_t count);
// Shared allreduces this process has run fused, not as ring (tests).
uint64_t shared_allreduces_fused();
// Bytes the shared algorithms have read from peers' buffers through their mappings (in
// place, like the single-copy receives: transport_stats() counts both).
uint64_t shared_bytes_read();

// allgather(v): block r of out = rank r's in; blocks given in bytes. In-place when
// in == out + blocks.off[rank].
void allgather_ring(Exec& x, const void* in, void* out, const Blocks& b);
void allgather_direct(Exec& x, const void* in, void* out, const Blocks& b);
void allgather_rd(Exec& x, const void* in, void* out, const Blocks& b);
void allgather_hier(Exec& x, const void* in, void* out, const Blocks& b);
// Into one buffer per machine that its ranks all map (Communicator::allgather_shared); `id`
// names the buffer, the same on every rank of a machine.
void allgather_shared(Exec& x, const void* in, void* out, const Blocks& b, uint64_t id);

// reduce_scatter: out (count elements) = block `rank` of the reduction of every in
// (size * count elements). In-place when out == in + rank * count.
void reduce_scatter_ring(Exec& x, const void* in, void* out, size_t count);
void reduce_scatter_direct(Exec& x, const void* in, void* out, size_t count);
void reduce_scatter_rd(Exec& x, const void* in, void* out, size_t count);
void reduce_scatter_hier(Exec& x, const void* in, void* out, size_t count);
void reduce_scatter_shared(Exec& x, const void* in, void* out, size_t count);
// Shared reduce-scatters this process has run fused, not as ring (tests).
uint64_t shared_reduce_scatters_fused();

// broadcast `bytes` from root, in place.
void broadcast_tree(Exec& x, void* buf, size_t bytes, int root);
void broadcast_direct(Exec& x, void* buf, size_t bytes, int root);
void broadcast_ring(Exec& x, void* buf, size_t bytes, int root);

// reduce to root: out significant at root only (may be null elsewhere).
void reduce_tree(Exec& x, const void* in, void* out, size_t count, int root);
void reduce_direct(Exec& x, const void* in, void* out, size_t count, int root);

// gather / scatter / alltoall with `bytes` per rank.
void gather_direct(Exec& x, const void* in, void* out, size_t bytes, int root);
void scatter_direct(Exec& x, const void* in, void* out, size_t bytes, int root);
void alltoall_direct(Exec& x, const void* in, void* out, size_t bytes);

// Dissemination barrier: ceil(log2 n) rounds of empty messages.
void barrier_dissemination(Exec& x);

}  // namespace loom::comm::algo
