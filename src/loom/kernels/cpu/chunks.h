// How the flat element-wise kernels run on the thread team. Only for the kernels' own
// sources, which are built with OpenMP.
#pragma once

#include <algorithm>
#include <cstddef>

namespace loom::kernels::cpu {

// fn(begin, count) over [0, n) in chunks of 2^14 elements, the chunks split statically over
// the calling thread team: how the flat element-wise kernels (a serial, vector-cloned chunk
// function each) run in parallel.
template <class Fn>
void for_each_chunk(size_t n, Fn&& fn) {
  constexpr size_t kChunk = size_t{1} << 14;
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < n; c += kChunk) fn(c, std::min(kChunk, n - c));
}

}  // namespace loom::kernels::cpu
