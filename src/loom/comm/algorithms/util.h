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

// Receives `count` elements from every other rank and reduces them with `own` into `out` in
// rank order (x0 op x1 op ... op x(n-1), ours at our position), so every rank that runs it
// on the same inputs gets the same bits. `own` may alias `out` only on rank 0 (elsewhere
// the receives overwrite `out` first). The sends are the caller's. Ends with wait_all().
void reduce_all_in_rank_order(Exec& x, void* out, const void* own, size_t count);

// Binomial reduce of `work` (already holding this rank's input) toward `root`, chunked so
// a rank forwards chunk c to its parent while it receives chunk c+1 from its children
// (allreduce_tree's first half, and reduce_tree). Ends with wait_all().
void binomial_reduce_inplace(Exec& x, void* work, size_t bytes, int root);

// LOOM_HIER_CHUNK: the pipeline chunk of the hierarchical algorithms (allreduce.cc).
size_t hier_chunk_bytes();

// The shared algorithms' exchanges: sends `bytes` of `mine` to every other rank and
// receives rank q's into all + q * bytes (staggered: to r+i while hearing from r-i); with 0
// bytes, a "done" to and from every rank. Ends with wait_all().
void exchange_with_all(Exec& x, const void* mine, void* all, size_t bytes);
// LOOM_SHARED_ALLREDUCE_PIECE in whole elements: what the shared algorithms reduce at a time.
size_t shared_piece(size_t esize);
// Adds to shared_bytes_read() (algorithms.h).
void count_shared_read(uint64_t bytes);

}  // namespace loom::comm::algo
