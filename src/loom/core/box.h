// Boxes: N-dimensional slices of a row-major tensor, given by a start and an extent per
// dimension (a tensor-parallel shard is one: rows [r*V/t, (r+1)*V/t) of an embedding,
// columns [r*C/t, (r+1)*C/t) of a projection). A tensor's elements are addressed by their
// flat row-major index in the tensor; a box's elements by their position in the box's own
// row-major order. An empty start/extent stands for the whole tensor.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "loom/core/check.h"

namespace loom {

using Shape = std::vector<int64_t>;

inline int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Calls fn(pos, flat, len) for positions [begin, begin + count) of the box (start, extent)
// of a tensor of `shape`, in runs of `len` elements that are contiguous both in the box
// (positions pos .. pos+len-1) and in the tensor (flat indices flat .. flat+len-1). Trailing
// dimensions the box covers whole are merged, so the whole tensor is one run.
template <typename Fn>
void for_each_box_run(const Shape& shape, const Shape& start_in, const Shape& extent_in,
                      int64_t begin, int64_t count, Fn fn) {
  const size_t nd = shape.size();
  const Shape zeros(nd, 0);
  const Shape& start = start_in.empty() ? zeros : start_in;
  const Shape& extent = extent_in.empty() ? shape : extent_in;
  LOOM_CHECK(start.size() == nd && extent.size() == nd);
  if (count <= 0) return;
  if (nd == 0) return fn(begin, begin, count);
  // Dimensions k+1.. are covered whole; a run is extent[k] x (their product) elements.
  size_t k = nd - 1;
  int64_t inner = 1;
  while (k > 0 && start[k] == 0 && extent[k] == shape[k]) inner *= shape[k], --k;
  const int64_t run = extent[k] * inner;
  int64_t pos = begin;
  const int64_t end = begin + count;
  while (pos < end) {
    const int64_t row = pos / run, off = pos % run;
    // The row's coordinates in dims 0..k-1, shifted by the box's start, as a flat index.
    int64_t flat = 0, rest = row, scale = shape[k] * inner;
    for (size_t d = k; d-- > 0;) {
      flat += (start[d] + rest % extent[d]) * scale;
      rest /= extent[d];
      scale *= shape[d];
    }
    flat += start[k] * inner + off;
    const int64_t len = std::min(run - off, end - pos);
    fn(pos, flat, len);
    pos += len;
  }
}

// The flat index in the tensor of position `pos` of the box (start, extent).
inline int64_t box_flat_index(const Shape& shape, const Shape& start, const Shape& extent,
                              int64_t pos) {
  if (start.empty()) return pos;
  int64_t flat = 0, scale = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    flat += (start[d] + pos % extent[d]) * scale;
    pos /= extent[d];
    scale *= shape[d];
  }
  return flat;
}

// The position in the box (start, extent) of flat index `flat`, which the box must contain.
inline int64_t box_position(const Shape& shape, const Shape& start, const Shape& extent,
                            int64_t flat) {
  if (start.empty()) return flat;
  int64_t pos = 0, scale = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    pos += (flat % shape[d] - start[d]) * scale;
    flat /= shape[d];
    scale *= extent[d];
  }
  return pos;
}

}  // namespace loom
