// ProcessGroupLoom: a c10d process group (torch 1.13's ProcessGroup; torch >= 2.0's
// Backend) whose collectives run on a loom Communicator. Rendezvous goes through the store
// torch hands in; operations are queued on the communicator's worker thread and complete
// asynchronously (Work::wait, isCompleted, getFuture).
#pragma once

#include <torch/version.h>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define LOOM_TORCH_BASE c10d::Backend
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#define LOOM_TORCH_BASE c10d::ProcessGroup
#endif

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "loom/comm/communicator.h"

namespace loom_torch {

class LoomWork;

class ProcessGroupLoom : public LOOM_TORCH_BASE {
 public:
  ProcessGroupLoom(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   std::chrono::milliseconds timeout);
  ~ProcessGroupLoom() override;

  // The creator torch.distributed calls: (store, rank, size, timeout).
  static c10::intrusive_ptr<LOOM_TORCH_BASE> create(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    const std::chrono::duration<float>& timeout);

  const std::string getBackendName() const override { return "loom"; }

  using Tensors = std::vector<at::Tensor>;
  using Work = c10::intrusive_ptr<c10d::Work>;
  Work broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override;
  Work allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override;
  Work allreduce_coalesced(Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  Work reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override;
  Work allgather(std::vector<Tensors>& outputs, Tensors& inputs,
                 const c10d::AllgatherOptions& opts) override;
  Work _allgather_base(at::Tensor& output, at::Tensor& input,
                       const c10d::AllgatherOptions& opts) override;
  Work allgather_coalesced(std::vector<Tensors>& outputs, Tensors& inputs,
                           const c10d::AllgatherOptions& opts) override;
  Work gather(std::vector<Tensors>& outputs, Tensors& inputs,
              const c10d::GatherOptions& opts) override;
  Work scatter(Tensors& outputs, std::vector<Tensors>& inputs,
               const c10d::ScatterOptions& opts) override;
  Work reduce_scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                      const c10d::ReduceScatterOptions& opts) override;
  Work _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                            const c10d::ReduceScatterOptions& opts) override;
  Work alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                     std::vector<int64_t>& input_splits,
                     const c10d::AllToAllOptions& opts) override;
  Work alltoall(Tensors& outputs, Tensors& inputs, const c10d::AllToAllOptions& opts) override;
  Work send(Tensors& tensors, int dst, int tag) override;
  Work recv(Tensors& tensors, int src, int tag) override;
  Work recvAnysource(Tensors& tensors, int tag) override;
  Work barrier(const c10d::BarrierOptions& opts) override;
  // gloo's protocol: rank 0 hears from every rank within the timeout, then answers each;
  // it names the rank (with wait_all_ranks, every rank) that did not arrive. As after any
  // loom failure, the group is unusable after a failed one.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

 private:
  loom::comm::OpOptions op_options(std::chrono::milliseconds timeout) const;
  void check_root(int64_t root, const char* op) const;  // a rank of this group
  // Exchanges blocks of different sizes as one alltoall of blocks padded to the largest
  // (loom has no alltoallv): in[i] goes to rank i, out[i] comes from rank i.
  Work alltoall_padded(c10d::OpType type, std::vector<at::Tensor> in, std::vector<at::Tensor> out,
                       std::vector<at::Tensor> results, std::chrono::milliseconds timeout);

  std::shared_ptr<loom::comm::Communicator> comm_;
  std::chrono::milliseconds timeout_;
};

}  // namespace loom_torch
