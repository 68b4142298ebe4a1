// A communicator: a group of ranks that run collectives together (NCCL's ncclComm, Gloo's
// Context). One object per rank; every rank calls the same collectives in the same order.
//
//   auto comm = Communicator::create(store, rank, size);      // or init_from_env()
//   comm->allreduce(grad.data(), grad.data(), n, DType::kF32, ReduceOp::kSum);
//   WorkPtr w = comm->allgather_async(shard, full, shard_count, DType::kBF16);
//   ... compute ...
//   w->wait();
//
// Execution: operations run in call order. A synchronous call with nothing queued runs on
// the caller's thread (no thread hand-off on the latency path); asynchronous calls are
// queued and run by the communicator's worker thread, so several may be in flight while
// the caller computes. Split communicators have their own pairs and worker, so their
// operations progress concurrently with the parent's.
//
// Buffers: `in` and `out` may be the same pointer (in place) for allreduce, reduce,
// broadcast and alltoall; allgather is in place when in == out + rank*count; reduce_scatter
// when out == in + rank*count. Buffers of an async call must stay valid until it finishes.
//
// Failure: every call has a deadline (LOOM_TIMEOUT_S, default 300 s, or OpOptions). A dead
// peer, a closed connection, a desync or a timeout fails the call with PeerError on every
// rank (the first rank to notice posts the reason to the store; the others pick it up within
// ~100 ms). After a failure the communicator is broken: later calls fail at once. Recover by
// creating a new communicator (a new `name`).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loom/comm/exec.h"
#include "loom/comm/store/store.h"
#include "loom/comm/topology.h"
#include "loom/comm/transport/pair.h"
#include "loom/comm/tuning.h"
#include "loom/comm/types.h"
#include "loom/comm/work.h"
#include "loom/core/dtype.h"
#include "loom/core/function_ref.h"
#include "loom/core/state_memory.h"

namespace loom::comm {

namespace algo {
struct Blocks;
struct CollArgs;
}  // namespace algo

struct CommConfig {
  std::string name = "world";      // distinguishes communicators (and generations) in the store
  double timeout_s = 300;          // LOOM_TIMEOUT_S
  std::string transport = "auto";  // LOOM_TRANSPORT: auto | tcp
  std::string host_id;             // LOOM_HOST_ID, else the machine's hostname + boot id
  std::string listen_host;         // LOOM_ADDR, else the address that reaches the store
  std::string token;               // LOOM_JOB_TOKEN (empty: no authentication possible)
  Algo algo = Algo::kAuto;         // LOOM_ALGO
  CostModel model = CostModel::from_env();
  // Bytes of each shared-memory ring, each direction (a power of two >= 256 KiB); 0: LOOM_SHM_RING
  // (4 MiB). A communicator that carries only small messages (a trainer's world and pipeline
  // groups: sums of losses and norms) needs no more than kControlRing: every pair of its ranks
  // on a machine holds two rings, touched from the start.
  size_t shm_ring_bytes = 0;
  // This rank's buffers of at least this many bytes are in shared memory (alloc_shared, or
  // the torch backend's allocator with loom_torch.use_shared_memory()); 0: not known. Where
  // every rank of the machine says so (Topology::shared_from), the shared allreduce and
  // reduce-scatter are chosen by the cost model from there instead of from their 1 MiB
  // minimum (LOOM_SHARED_ALLREDUCE_MIN), which is set for heap buffers. A buffer that is not
  // shared after all costs only speed: the op runs as ring after the buffers are named.
  size_t shared_from = 0;
  static constexpr size_t kControlRing = size_t{256} << 10;
  static CommConfig from_env();
};

struct OpOptions {
  Algo algo = Algo::kAuto;  // a per-call override; falls back to auto where not valid
  double timeout_s = 0;     // 0: the communicator's default
};

// Memory from Communicator::alloc_shared: zero-filled, page-aligned, readable by the other
// processes of this machine. Move-only; destroying it frees it (once no operation uses it).
class SharedBuffer {
 public:
  SharedBuffer() = default;
  explicit SharedBuffer(size_t bytes);
  SharedBuffer(SharedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  SharedBuffer& operator=(SharedBuffer&& o) noexcept;
  ~SharedBuffer();

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// One buffer per machine, mapped by every rank of the communicator on that machine (the
// same pages): allgather_shared's output (Communicator::alloc_machine_buffer). The
// machine's first rank owns the memory, the others map it; each rank's pages stay valid
// until its own MachineBuffer is destroyed, whatever the others do. Move-only.
class MachineBuffer {
 public:
  MachineBuffer() = default;
  MachineBuffer(MachineBuffer&& o) noexcept { *this = std::move(o); }
  MachineBuffer& operator=(MachineBuffer&& o) noexcept;
  ~MachineBuffer();

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  // The same on every rank of the machine for one buffer, different between buffers.
  uint64_t id() const { return id_; }
  // Ranks of this communicator that share it (this machine's), and each one's share of
  // its bytes (what a rank accounts for).
  int sharers() const { return sharers_; }

 private:
  friend class Communicator;
  SharedBuffer own_;      // the machine's first rank: the memory itself
  void* data_ = nullptr;  // own_.data(), or our mapping of the first rank's buffer
  size_t bytes_ = 0;
  uint64_t id_ = 0;
  int sharers_ = 1;
  bool mapped_ = false;  // data_ is a mapping to drop
};

// StateVectors in shared buffers (a StateMemory::SourceScope with this source): what
// DataParallel uses for its parameters and gradients when comm.shared_buffers is on.
StateSource* shared_state_source();

class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  // Collective over all `size` ranks: rendezvous through `store`, then connect pairs.
  static std::shared_ptr<Communicator> create(std::shared_ptr<Store> store, int rank, int size,
                                              CommConfig cfg);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Topology& topology() const { return topo_; }
  const CommConfig& config() const { return cfg_; }
  // Ranks with the same color form a new communicator, ordered by (key, rank), with this
  // one's settings but its shared-memory rings' size (CommConfig::shm_ring_bytes; 0: the
  // default, not this communicator's). Collective over this communicator; color < 0 returns
  // nullptr (not a member).
  std::shared_ptr<Communicator> split(int color, int key, size_t shm_ring_bytes = 0);
  // The algorithm `auto` picks for this op and size here (for reports and tests).
  Algo chosen_algo(OpKind op, size_t bytes, Algo requested = Algo::kAuto) const;
  // `bytes` of memory the other processes of this machine can map. A collective's message
  // sent from inside it (LOOM_SHM_SHARED_MIN bytes and up; allreduce's from
  // LOOM_SHM_SHARED_MIN_ALLREDUCE) to a rank on this machine is read in place by that rank
  // instead of going through the ring. Local (not collective), usable with any communicator.
  static SharedBuffer alloc_shared(size_t bytes) { return SharedBuffer(bytes); }
  // Collective: one buffer of `bytes` per machine that every rank of this communicator on
  // the machine maps (its first rank allocates, the others map it through the
  // communicator's pairs). Fails on every rank of the machine when one cannot map it.
  MachineBuffer alloc_machine_buffer(size_t bytes);
  // Collective: the allgather of `count` elements per rank into `out`, one buffer per
  // machine (from alloc_machine_buffer with at least size() * count elements): block r of
  // it = rank r's `in`. Each rank writes only its own block, each machine's first rank
  // receives the other machines' blocks, and every rank of the machine reads the result in
  // the same pages: one gathered copy per machine and 1/ranks-per-machine of the copying
  // per rank. It starts once every rank of the machine has called it, so a rank may read
  // `out` until it calls the next allgather_shared into it (and so `in` may not lie in
  // `out`). Every rank of a machine must name the same buffer (a named error otherwise).
  WorkPtr allgather_shared_async(const void* in, MachineBuffer& out, size_t count, DType t,
                                 OpOptions o = {});
  void allgather_shared(const void* in, MachineBuffer& out, size_t count, DType t,
                        OpOptions o = {});

  // Keeps an object (e.g. the store server) alive as long as this communicator.
  void hold(std::shared_ptr<void> keepalive) { keepalive_.push_back(std::move(keepalive)); }

  // ---- asynchronous forms (return at once) ----
  WorkPtr allreduce_async(const void* in, void* out, size_t count, DType t, ReduceOp op,
                          OpOptions o = {});
  WorkPtr allgather_async(const void* in, void* out, size_t count, DType t, OpOptions o = {});
  WorkPtr allgatherv_async(const void* in, void* out, std::vector<size_t> counts, DType t,
                           OpOptions o = {});
  WorkPtr reduce_scatter_async(const void* in, void* out, size_t count, DType t, ReduceOp op,
                               OpOptions o = {});
  WorkPtr broadcast_async(void* buf, size_t count, DType t, int root, OpOptions o = {});
  WorkPtr reduce_async(const void* in, void* out, size_t count, DType t, ReduceOp op, int root,
                       OpOptions o = {});
  WorkPtr gather_async(const void* in, void* out, size_t count, DType t, int root,
                       OpOptions o = {});
  WorkPtr scatter_async(const void* in, void* out, size_t count, DType t, int root,
                        OpOptions o = {});
  WorkPtr alltoall_async(const void* in, void* out, size_t count, DType t, OpOptions o = {});
  WorkPtr barrier_async(OpOptions o = {});
  WorkPtr send_async(const void* buf, size_t count, DType t, int peer, OpOptions o = {});
  WorkPtr recv_async(void* buf, size_t count, DType t, int peer, OpOptions o = {});
  // A receive from whichever rank's message arrives first (MPI_ANY_SOURCE); `*source` holds
  // the sender's rank once the work is done. Later receives wait until it is matched.
  WorkPtr recv_any_async(void* buf, size_t count, DType t, int* source, OpOptions o = {});

  // ---- blocking forms ----
  void allreduce(const void* in, void* out, size_t count, DType t, ReduceOp op, OpOptions o = {});
  void allgather(const void* in, void* out, size_t count, DType t, OpOptions o = {});
  void allgatherv(const void* in, void* out, std::vector<size_t> counts, DType t, OpOptions o = {});
  void reduce_scatter(const void* in, void* out, size_t count, DType t, ReduceOp op,
                      OpOptions o = {});
  void broadcast(void* buf, size_t count, DType t, int root, OpOptions o = {});
  void reduce(const void* in, void* out, size_t count, DType t, ReduceOp op, int root,
              OpOptions o = {});
  void gather(const void* in, void* out, size_t count, DType t, int root, OpOptions o = {});
  void scatter(const void* in, void* out, size_t count, DType t, int root, OpOptions o = {});
  void alltoall(const void* in, void* out, size_t count, DType t, OpOptions o = {});
  void barrier(OpOptions o = {});
  void send(const void* buf, size_t count, DType t, int peer, OpOptions o = {});
  void recv(void* buf, size_t count, DType t, int peer, OpOptions o = {});

 private:
  static constexpr int kNoPeer = -1, kAnyPeer = -2;
  struct Op {
    Fingerprint fp;
    double timeout_s = 0;
    // send/recv: the peer (kAnyPeer: a receive from any source, until matched); sequence
    // numbers are per peer and direction
    int p2p_peer = kNoPeer;
    bool p2p_send = false;
    std::byte* p2p_buf = nullptr;
    size_t p2p_bytes = 0;
    int* p2p_source = nullptr;      // any source: where the matched peer goes
    const SendReq* sreq = nullptr;  // while running (run_p2p)
    const RecvReq* rreq = nullptr;
    Deadline deadline = Deadline::never();
    uint64_t seq = 0;
    uint64_t record = 0;              // its flight-recorder entry (kNoRecord: not entered yet)
    std::function<void(Exec&)> body;  // collectives (send/recv are run by run_p2p)
    WorkPtr work;
  };

  Communicator(std::shared_ptr<Store> root_store, std::shared_ptr<Store> store, int rank, int size,
               CommConfig cfg);
  void connect(Deadline deadline);  // wiring.cc

  // The one path of every collective (algorithms/table.h): choose the algorithm for
  // `choice_bytes`, fingerprint (`fp_count` elements), launch its row; allgather and
  // allgather_shared run on equal blocks of `equal_block_bytes` per rank.
  WorkPtr collective(bool blocking, OpKind kind, DType t, ReduceOp redop, uint64_t fp_count,
                     size_t choice_bytes, algo::CollArgs args, OpOptions o,
                     size_t equal_block_bytes = 0);
  // One builder per collective; the public async and blocking forms both call it.
  WorkPtr allreduce_impl(bool blocking, const void* in, void* out, size_t count, DType t,
                         ReduceOp op, OpOptions o);
  WorkPtr allgather_impl(bool blocking, const void* in, void* out, size_t count, DType t,
                         OpOptions o);
  WorkPtr allgatherv_impl(bool blocking, const void* in, void* out, std::vector<size_t> counts,
                          DType t, OpOptions o);
  WorkPtr reduce_scatter_impl(bool blocking, const void* in, void* out, size_t count, DType t,
                              ReduceOp op, OpOptions o);
  WorkPtr broadcast_impl(bool blocking, void* buf, size_t count, DType t, int root, OpOptions o);
  WorkPtr reduce_impl(bool blocking, const void* in, void* out, size_t count, DType t, ReduceOp op,
                      int root, OpOptions o);
  WorkPtr gather_impl(bool blocking, const void* in, void* out, size_t count, DType t, int root,
                      OpOptions o);
  WorkPtr scatter_impl(bool blocking, const void* in, void* out, size_t count, DType t, int root,
                       OpOptions o);
  WorkPtr alltoall_impl(bool blocking, const void* in, void* out, size_t count, DType t,
                        OpOptions o);
  WorkPtr barrier_impl(bool blocking, OpOptions o);
  WorkPtr allgather_shared_impl(bool blocking, const void* in, MachineBuffer& out, size_t count,
                                DType t, OpOptions o);
  WorkPtr send_impl(bool blocking, const void* buf, size_t count, DType t, int peer, OpOptions o);
  WorkPtr recv_impl(bool blocking, void* buf, size_t count, DType t, int peer, OpOptions o,
                    int* source = nullptr);

  using Body = FunctionRef<void(Exec&)>;
  // Runs a collective: a blocking call with nothing queued or running goes straight to
  // run_inline (the latency path: no Work, no std::function, no queue); anything else is
  // handed to submit with the body stored in the op.
  template <class F>
  WorkPtr launch(Op&& op, bool blocking, F&& body) {
    if (blocking && run_inline(op, body)) return nullptr;
    op.body = std::forward<F>(body);
    return submit(std::move(op), blocking);
  }
  // Runs `op` on the caller's thread if the communicator is idle and not broken (false:
  // it did nothing). One lock at the start and one at the end; the flight record is
  // entered once, when the operation ends or has waited ~100 ms.
  bool run_inline(Op& op, Body body);
  // Queues the op (or runs it on the caller's thread when blocking and idle) with a Work.
  WorkPtr submit(Op op, bool blocking);
  // on_caller: its record is already "running", or not entered yet (kNoRecord)
  void run(Op& op, Body body, bool on_caller = false);
  // Blocks of `each` bytes per rank (allgather's), kept: touched only by the running op.
  const algo::Blocks& equal_blocks(size_t each);
  // Runs `first` and every send/receive queued behind it together, finishing each op's work
  // (p2p.cc).
  void run_p2p(Op first, bool on_caller);
  // The sends and receives run_p2p runs together, and its steps (p2p.cc).
  struct P2pBatch;
  void p2p_post(P2pBatch& b, Op& op);
  bool p2p_match_any_source(P2pBatch& b);
  bool p2p_take_queued(P2pBatch& b);
  bool p2p_retire_done(P2pBatch& b);
  void worker_loop();
  void check_abort();
  [[noreturn]] void fail(const Op& op, const std::exception& e);
  void validate(int root, const char* what) const;
  void validate_peer(int peer, const char* what) const;

  std::shared_ptr<Store> root_store_;   // the job's namespace: holds the abort record
  std::shared_ptr<Store> store_;        // this communicator's namespace
  std::unique_ptr<Store> watch_store_;  // a second connection, for abort checks while blocked
  int rank_, size_;
  CommConfig cfg_;
  std::shared_ptr<const std::string> name_;  // cfg_.name, shared with the flight recorder
  std::vector<int> world_ranks_;             // the world rank of each of our ranks
  Topology topo_;
  WaitPolicy wait_policy_;
  std::vector<std::unique_ptr<Pair>> pairs_;  // indexed by peer rank; null for self
  std::vector<std::byte> scratch_;
  std::unique_ptr<algo::Blocks> equal_blocks_;
  // chosen_algo's last answer per operation kind: (bytes << 16 | requested << 8 | 0x80 | algo)
  mutable std::array<std::atomic<uint64_t>, static_cast<size_t>(OpKind::kCount)> algo_cache_{};
  ExecQueues queues_;  // the running operation's requests (one runs at a time)
  std::vector<uint64_t> p2p_send_seq_, p2p_recv_seq_;
  int splits_ = 0;
  std::vector<std::shared_ptr<void>> keepalive_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool running_ = false;
  bool stop_ = false;
  uint64_t next_seq_ = 0;
  std::exception_ptr broken_;
  std::thread worker_;
};

// Counters of every communicator and transport of this process, since it started.
struct TransportStats {
  // read from a peer's buffer in place (shm): single-copy receives and the shared algorithms
  uint64_t bytes_read_in_place = 0;
};
TransportStats transport_stats();

}  // namespace loom::comm
