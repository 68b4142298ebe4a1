// The communication tensor parallelism puts into the model, as the model sees it (DESIGN
// decision 4: the model never holds a communicator). parallel::TensorParallel implements it
// over the tensor-parallel group; without tensor parallelism the model calls none of it.
//
// The model uses these as Megatron's conjugate pairs (tensor_parallel/mappings.py):
//   f  before a column-parallel linear: identity forward, allreduce of the input gradient
//      in backward; under sequence parallelism allgather of the rows forward and
//      reduce-scatter backward;
//   g  after a row-parallel linear: allreduce forward, identity backward; under sequence
//      parallelism reduce-scatter forward and allgather backward;
// and for the vocab-parallel loss, one max- and two sum-allreduces of one float per row.
// Every call is blocking and collective over the group; fp32; sums in rank order, so every
// rank gets the same bits.
#pragma once

#include <cstddef>

namespace loom::model {

class TpComm {
 public:
  virtual ~TpComm() = default;
  virtual void allreduce_sum(float* x, size_t n) = 0;
  virtual void allreduce_max(float* x, size_t n) = 0;
  // Rank r's n floats land at all[r*n .. r*n+n).
  virtual void allgather(const float* mine, float* all, size_t n) = 0;
  // mine = the sum over ranks of all[r*n .. r*n+n), r this rank.
  virtual void reduce_scatter_sum(const float* all, float* mine, size_t n) = 0;
};

// How one rank's model is split: `size` ways, this rank holding part `rank`.
struct TensorSplit {
  int size = 1, rank = 0;
  bool sequence_parallel = false;
};

}  // namespace loom::model
