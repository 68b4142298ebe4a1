// Tensor parallelism's communication (model/tp_comm.h) over the tensor-parallel group of the
// mesh: blocking collectives on the calling thread, timed and counted for the metrics and
// for tests that assert which collectives a layer issues.
#pragma once

#include <cstdint>
#include <memory>

#include "loom/comm/communicator.h"
#include "loom/model/tp_comm.h"

namespace loom::parallel {

class TensorParallel : public model::TpComm {
 public:
  explicit TensorParallel(std::shared_ptr<comm::Communicator> group);
  int size() const { return group_->size(); }
  int rank() const { return group_->rank(); }

  void allreduce_sum(float* x, size_t n) override;
  void allreduce_max(float* x, size_t n) override;
  void allgather(const float* mine, float* all, size_t n) override;
  void reduce_scatter_sum(const float* all, float* mine, size_t n) override;

  // Since construction or the last reset: calls per kind, bytes each rank sent and
  // received as the algorithm moves them (ring: 2(t-1)/t x the buffer for an allreduce,
  // (t-1)/t for allgather and reduce-scatter — the volume Megatron's papers count), and the
  // seconds spent in them.
  struct Counters {
    int64_t allreduce_sum = 0, allreduce_max = 0, allgather = 0, reduce_scatter = 0;
    double bytes = 0, seconds = 0;
  };
  const Counters& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }

 private:
  template <typename Fn>
  void timed(double bytes, Fn fn);

  std::shared_ptr<comm::Communicator> group_;
  Counters counters_;
};

}  // namespace loom::parallel
