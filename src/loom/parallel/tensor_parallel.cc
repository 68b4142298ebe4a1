#include "loom/parallel/tensor_parallel.h"

#include "loom/core/check.h"
#include "loom/core/stats.h"

namespace loom::parallel {
using comm::ReduceOp;
using loom::DType;

TensorParallel::TensorParallel(std::shared_ptr<comm::Communicator> group)
    : group_(std::move(group)) {
  LOOM_CHECK(group_);
}

template <typename Fn>
void TensorParallel::timed(double bytes, Fn fn) {
  counters_.seconds += seconds_taken(fn);
  counters_.bytes += bytes;
}

void TensorParallel::allreduce_sum(float* x, size_t n) {
  const double t = size();
  ++counters_.allreduce_sum;
  timed(2 * (t - 1) / t * n * sizeof(float),
        [&] { group_->allreduce(x, x, n, DType::kF32, ReduceOp::kSum); });
}

void TensorParallel::allreduce_max(float* x, size_t n) {
  const double t = size();
  ++counters_.allreduce_max;
  timed(2 * (t - 1) / t * n * sizeof(float),
        [&] { group_->allreduce(x, x, n, DType::kF32, ReduceOp::kMax); });
}

void TensorParallel::allgather(const float* mine, float* all, size_t n) {
  ++counters_.allgather;
  timed((size() - 1) * static_cast<double>(n) * sizeof(float),
        [&] { group_->allgather(mine, all, n, DType::kF32); });
}

void TensorParallel::reduce_scatter_sum(const float* all, float* mine, size_t n) {
  ++counters_.reduce_scatter;
  timed((size() - 1) * static_cast<double>(n) * sizeof(float),
        [&] { group_->reduce_scatter(all, mine, n, DType::kF32, ReduceOp::kSum); });
}

}  // namespace loom::parallel
