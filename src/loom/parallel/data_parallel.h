// Data parallelism and ZeRO (DeepSpeed's stages; stage 3 is PyTorch FSDP's full sharding)
// on top of the model's units (DESIGN decisions 4 and 5). The model stays free of
// parallelism: this engine owns the parameter, gradient and optimizer buffers, binds the
// model's units into them and reacts to the model's UnitHooks.
//
//   stage 0 (DDP)  full parameters, full gradients, full Adam moments on every rank; each
//                  unit's gradients are allreduced asynchronously as soon as backward
//                  finishes the unit, overlapping the rest of backward; micro-steps before
//                  the last of an accumulation do not communicate.
//   stage 1        full parameters and gradients; Adam moments for this rank's shard only.
//                  Gradients are reduce-scattered (async, per unit), each rank updates its
//                  shard, the updated parameters are allgathered.
//   stage 2        as 1, but only the gradient shard persists: a unit's full gradient
//                  exists from its first use in backward until its reduce-scatter lands
//                  in the shard (every micro-step), then it is freed.
//   stage 3        as 2, and parameters are sharded too: a unit is allgathered before each
//                  use and freed after it; the next unit in the recorded use order is
//                  prefetched while the current one computes.
//
// Data parallelism is one dimension of the mesh: the engine runs over the data-parallel group
// (the ranks that hold the same part of the model and read different data). Under tensor
// parallelism each rank's model is its shard of the whole, and ZeRO shards that shard over
// the data-parallel group only. The tensor-parallel group is used to count replicated
// tensors once in this rank's share of the gradient norm and to check that they stay
// identical; completing the norm across tp and pp and summing the tied embedding's copies
// is the step composer's (parallel/step_composer.h). The stages are ShardingPolicy
// implementations (parallel/sharding.h); the engine acts on the policy's decisions.
//
// Sharding is per unit: unit u (n elements) is padded to a multiple of the shard-group size
// S and rank r owns elements [r * n/S, (r+1) * n/S) of it. With zero.shard_group = node the
// shard group is the ranks of one machine and the shards are replicated across machines
// (gradients reduce-scattered inside the machine, then allreduced across machines).
//
// Every buffer of model state is a StateVector, so StateMemory's high-water mark is the
// model-state memory ZeRO's formulas predict (docs/algorithms.md "Data parallel and ZeRO").
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "loom/ckpt/checkpoint.h"
#include "loom/comm/communicator.h"
#include "loom/core/sparse_floats.h"
#include "loom/core/state_memory.h"
#include "loom/core/stats.h"
#include "loom/model/gpt.h"
#include "loom/optim/adamw.h"
#include "loom/parallel/pipeline.h"
#include "loom/parallel/process_groups.h"
#include "loom/parallel/sharding.h"

namespace loom::parallel {

struct DpOptions {
  // train.zero as a policy (make_sharding_policy, parallel/sharding.h); null: replicated.
  std::shared_ptr<const ShardingPolicy> sharding;
  bool comm_bf16 = false;  // gradient reductions in bf16 (sums stay fp32 locally)
  // zero.shared_buffers: parameters, gradients and gathered units in memory the other ranks
  // of the machine map (Communicator::alloc_shared), so reduce-scatters and allgathers
  // between them are read in place instead of copied through the rings. Used only where
  // data-parallel ranks share a machine.
  bool shared_buffers = true;
  // zero.shared_gather: ZeRO-3 gathers each unit into one buffer per machine
  // (Communicator::allgather_shared) that the machine's ranks all read, instead of a copy
  // per rank. Used only where ranks of the shard group share a machine.
  bool shared_gather = true;
  // Pipeline parallelism: the units this rank's stage holds (empty: all); unit 0 held only
  // as the tied head's copy of the embedding (the last stage), whose gradient is summed
  // with the first stage's over the embedding group and which the first stage writes.
  std::vector<int> units;
  bool unit0_is_head_copy = false;
  // Driven by a pipeline (PipelineHooks): gradients are reduced once per step, after the
  // last microbatch (ZeRO 2 holds its stage's full gradients until then), and ZeRO-3
  // prefetches in the order of the whole step (every action's uses, as the schedule runs
  // them) instead of per forward and backward.
  bool pipeline = false;
  // zero.offload = disk: Adam's moments in this file instead of memory.
  std::shared_ptr<optim::MomentFile> moments;
  // zero.overlap_step: with the moments in a file and a policy that does not shard (ZeRO 0),
  // optimizer_step() returns at once and the streamed step runs on a thread beside what
  // follows; the next use of each unit waits for that unit's update (overlaps_step()).
  bool overlap_step = false;
  // zero.offload_master (with `moments`, a policy that does not shard, bf16 products): the fp32
  // master weights live in the moments' file too and stream with them; the model reads each
  // unit's bf16 copy, made from the master after every update (Gpt::set_owner_bf16_copies),
  // and the weight matrices' fp32 values are not in memory at all (SparseFloats). Tensors the
  // model reads in fp32 (norms, biases, embeddings) keep an fp32 copy in memory.
  bool offload_master = false;
  // With offload_master, no tensor parallelism and no head split: on the rank that looks
  // tokens up, wte's fp32 values leave memory too and each microbatch's lookup reads its rows
  // from the master in the file (Gpt::set_lookup_rows); the head reads wte's bf16 copy.
  bool lookup_from_master = false;
};

class DataParallel : public model::UnitHooks, public PipelineHooks {
 public:
  // The model must be built without its own storage. Of the mesh's groups (null where one
  // would be this rank alone) it uses dp (same part of the model, other data), shard and
  // replica (zero.shard_group = node) and tp (replicated tensors count once in the norm).
  DataParallel(model::Gpt& model, const ProcessGroups& groups, DpOptions o);
  ~DataParallel() override;

  int rank() const { return dp_ ? dp_->rank() : 0; }
  int size() const { return dp_ ? dp_->size() : 1; }
  const DpOptions& options() const { return opt_; }
  const ShardingPolicy& sharding() const { return *policy_; }

  // Every rank generates the weights it holds (the model's initialisation is a pure
  // function of the element; StepComposer::check_replicas then proves the copies agree).
  void init_weights(uint64_t seed);
  // Checksums of what this rank holds, for the replica checks across the mesh's groups
  // (StepComposer::check_replicas): all of its parameters, where every data-parallel rank
  // holds them all (null where the policy shards them); the tensors for which keep(t) holds.
  std::optional<uint64_t> replica_checksum() const;
  uint64_t held_checksum(const std::function<bool(const model::Tensor&)>& keep);
  // Reads this rank's part of a checkpoint of any layout: the weights and Adam's moments,
  // or (weights_only: train.init_from) the weights alone, the moments left at zero.
  void load(const ckpt::TensorSource& r, bool weights_only = false);
  // The pieces this rank writes in a checkpoint (each element written by one rank).
  std::vector<ckpt::Piece> checkpoint_pieces();

  // One training step: zero_grad(), then per micro-step forward() + backward(last), then
  // the step composer's finish_gradients() (parallel/step_composer.h), which calls the
  // three below, and optimizer_step().
  void zero_grad();
  float forward(const int* tokens, const int* targets, int B, int T);
  void backward(float scale, bool last_micro_step);
  // Waits for the gradient reductions (and averages the replicas across machines).
  void finish_reductions();
  // This rank's reduced gradient of unit u (the range its optimizer steps) and its size.
  float* unit_grad(int u);
  size_t unit_grad_size(int u) const;
  // This rank's share of the squared gradient norm, summed over the shard group.
  double grad_sum_of_squares();
  // After a step whose gradient norm is not finite: the first tensor (units in order) with a
  // NaN or infinity in this rank's reduced gradient, as {unit, tensor name}; none if clean.
  // A pass over the gradients: not for the hot path.
  std::optional<std::pair<int, std::string>> first_nonfinite_grad();
  void optimizer_step(float grad_scale, double lr, const optim::AdamWParams& p, int64_t t);
  // Whether optimizer_step() hands the step to a thread (DpOptions::overlap_step where it
  // applies). The parameters are then final unit by unit: the model's uses wait in
  // before_use(), and every method here that reads parameters, moments or gradients waits for
  // the whole step first.
  bool overlaps_step() const;
  // Seconds the calling thread has waited for overlapped steps (callers take differences).
  double step_wait_s() const { return step_wait_s_; }

  // ZeRO-3: uses whose unit was not gathered or being gathered yet (not prefetched), since
  // construction.
  int64_t gathers_on_use() const { return gathers_on_use_; }

  // Seconds the calling thread spent waiting on communication since the last reset.
  double comm_wait_s() const { return comm_wait_s_; }
  void reset_comm_wait() { comm_wait_s_ = 0; }
  // Runs fn, adding its duration to comm_wait_s() (the trainer's own small collectives).
  template <typename Fn>
  void timed(Fn fn);

  // UnitHooks
  void before_use(int u) override;
  void after_use(int u) override;
  void grads_ready(int u) override;
  // PipelineHooks: the pipeline runs the model's passes itself.
  void step_begins(bool training) override;
  void step_ends() override;
  void before_forward() override;
  void before_backward(bool last_microbatch) override;
  void after_action() override;

 private:
  // One model unit's state (as FSDP's flat-parameter handle): where its elements are in
  // the flat layout and in this rank's buffers, its optimizer over the range the policy
  // steps, and the buffers that live only around a use.
  struct Unit {
    size_t begin = 0, end = 0;          // in the model's flat layout
    size_t shard = 0;                   // elements per rank (padded unit / S)
    size_t own_begin = 0, own_end = 0;  // this rank's elements, flat layout (may be empty)
    size_t full_off = 0;                // offset in padded full buffers
    size_t shard_off = 0;               // offset in this rank's shard buffers
    std::unique_ptr<optim::AdamW> adam;
    StateVector full_grad;    // GradHome::kReduceScatteredIntoShard: during backward
    StateVector gathered;     // ParamHome::kGatheredOnUse: the gathered parameters
    comm::WorkPtr gathering;  // the gather in flight
    // With the shared gather: the machine buffer the unit is gathered into. Every rank of
    // a machine takes and gives them in the same order (the units' use order), so the n-th
    // buffer is the same one on all of them (allgather_shared checks it). Each rank
    // accounts for its share of a buffer's bytes.
    comm::MachineBuffer machine_gathered;
    size_t n() const { return end - begin; }
  };
  struct Pending {  // a gradient reduction in flight
    int unit;
    comm::WorkPtr work;
    std::vector<uint16_t> bf16;  // staging when communicating in bf16
  };
  enum class Phase { kIdle, kForward, kBackward };

  void launch_reduction(int u);
  void retire(Pending& p);
  void retire_done(size_t max_in_flight);
  void wait(const comm::WorkPtr& w);  // timed as communication when it blocks
  float* own_grad(int u);             // this rank's reduced gradient shard of unit u
  float* own_param(int u);            // this rank's parameter shard of unit u
  float* full_param(int u);           // stage 0-2: the unit's full parameters
  // Where the parameters are: params_, or sparse_params_ (zero.offload_master).
  float* param_base() { return sparse_params_.empty() ? params_.data() : sparse_params_.data(); }
  const float* param_base() const {
    return sparse_params_.empty() ? params_.data() : sparse_params_.data();
  }
  // zero.offload_master: whether t's fp32 values are only in the file (Gpt::only_bf16_read
  // for the units this rank holds).
  bool offloaded(const model::Tensor& t) const;
  // zero.offload_master with lookup_from_master: whether t is the wte this rank looks up from
  // the file (offloaded, and with no bf16 copy unless the head runs here).
  bool looked_up_from_file(const model::Tensor& t) const;
  // zero.offload_master: elements [lo, lo + n) of unit u's master weights (lo from the unit's
  // start) have become `v`: their bf16 copy and the fp32 values kept in memory follow.
  void master_changed(int u, size_t lo, size_t n, const float* v);
  // zero.offload_master: unit u's master weights [lo, lo + n), from the file.
  void read_master(int u, size_t lo, size_t n, float* out) const;
  // Runs fn(lo, len) over [0, n) / over unit u in pieces of at most the moments' file's chunk.
  template <typename Fn>
  void in_pieces(size_t n, Fn fn) const;
  template <typename Fn>
  void for_each_piece(int u, Fn fn) const;
  // Unit-sized buffers (gathered parameters, full gradients) are taken from and given back
  // to a pool: the memory stays counted (StateMemory sees no free), but a step does not
  // pay the kernel for fresh zeroed pages every time (~12% of a ZeRO-3 step on `small`
  // when they were freed to the OS). The pool holds at most what was live at once.
  StateVector take(size_t n);
  void give(StateVector& v);
  void gather(int u);  // stage 3: start gathering unit u
  float* gathered(int u);
  void release_gathered(int u);
  int use_order() const;  // the index of order_[] the current use belongs to
  int next_use(int u);
  template <typename Fn>
  void for_each_slice(int u, size_t lo, size_t hi, Fn fn) const;
  bool counted_here(const model::Tensor& t) const;  // in this rank's share of norms and files
  // The overlapped step (overlaps_step()): waits until unit u's parameters are final, and
  // zeroes its gradients where zero_grad() left them to the update; settle() waits for the
  // whole step and its moments' writes. Both rethrow the step's error.
  void await_unit(int u);
  void await_units();  // await_unit for every unit: before reading this step's gradients
  void settle() const;

  // The overlapped step's thread, and which units it has updated.
  struct Overlapped {
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<char> updated;  // per unit
    std::exception_ptr error;
  };
  mutable Overlapped overlapped_;
  std::vector<char> grads_stale_;  // per unit: zero_grad() ran during the overlapped step
  mutable double step_wait_s_ = 0;

  model::Gpt& model_;
  std::shared_ptr<comm::Communicator> dp_, tp_, shard_group_, replica_group_;
  DpOptions opt_;
  std::shared_ptr<const ShardingPolicy> policy_;
  int S_ = 1, r_ = 0;  // shard group size and this rank's index in it
  std::vector<Unit> units_;
  // The units' parameters and gradients, full (padded) or this rank's shards as the policy
  // says (ParamHome, GradHome).
  StateVector params_, grads_;
  // zero.offload_master: params_ is empty and the parameters are here, the weight matrices'
  // pages left out (their master is in the file, their bf16 copy in the model).
  SparseFloats sparse_params_;
  bool shared_gather_ = false;  // gathers into machine buffers (zero.shared_gather)
  std::multimap<size_t, comm::MachineBuffer> machine_pool_;  // free machine buffers by size
  std::multimap<size_t, StateVector> pool_;
  StateSource* source_ = nullptr;  // where params_, grads_ and pooled buffers live
  std::deque<Pending> pending_;
  Phase phase_ = Phase::kIdle;
  bool last_micro_ = true;
  // Stage 3 prefetch: the units in the order of their uses, recorded on the first time:
  // without a pipeline of a forward [0] and of a backward [1]; under a pipeline of a
  // forward_only step [0] and of a training step [1] (every action's uses in turn).
  std::vector<int> order_[2];
  bool recorded_[2] = {false, false};
  size_t cursor_ = 0;
  int pipeline_step_ = -1;  // under a pipeline: the order_[] of the step running, -1 between
  int64_t gathers_on_use_ = 0;
  double comm_wait_s_ = 0;
};

template <typename Fn>
void DataParallel::timed(Fn fn) {
  comm_wait_s_ += seconds_taken(fn);
}

}  // namespace loom::parallel
