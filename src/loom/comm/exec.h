// What an algorithm sees while it runs one collective: its rank, the group, and the four
// primitives send / recv / recv_reduce / wait over the communicator's pairs. Requests live
// in deques (stable addresses) until the operation ends.
//
// Waiting (progress_until): poll every busy pair; when nothing moves, spin briefly (only
// when this host is not oversubscribed), then yield, then sleep or poll() the TCP sockets.
// Every ~100 ms while blocked it checks that peers are alive, asks the store whether
// another rank has aborted the job, and enforces the deadline.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "loom/comm/reduce.h"
#include "loom/comm/topology.h"
#include "loom/comm/transport/pair.h"
#include "loom/core/deadline.h"

namespace loom::comm {

struct WaitPolicy {
  double spin_us = 5;      // busy-poll this long before yielding (0 when oversubscribed)
  double yield_us = 1000;  // then sched_yield for this long, then sleep/poll
  // or, waiting on one peer whose pair can block us until it writes (can_sleep: a futex on
  // an oversubscribed host), sleep on it after this long
  double futex_after_us = 1000;
};

// The request queues of a communicator's one running operation, kept by the communicator:
// a std::deque allocates its map and a first block when constructed, so an Exec that owned
// them made six allocations per operation (a fifth of a small allreduce's time, perf.md).
struct ExecQueues {
  struct Copy {
    std::byte* dst;
    const std::byte* src;
    size_t left;
    bool streaming;  // non-temporal stores (a large operation's large copy)
  };
  std::deque<SendReq> sends;
  std::deque<RecvReq> recvs;
  std::deque<Copy> copies;
  // Operations of at least this many bytes (LOOM_STREAMING_COPY_MIN; an allgather's or
  // alltoall's whole output) write their large plain copies and out-of-place reductions with
  // non-temporal stores. Read when the communicator is built.
  size_t streaming_min = streaming_copy_min();
};

class Exec {
 public:
  Exec(int rank, int size, std::vector<std::unique_ptr<Pair>>& pairs, const Topology& topo,
       const Fingerprint& fp, uint64_t seq, Deadline deadline, WaitPolicy policy,
       std::function<void()> check_abort, std::vector<std::byte>& scratch, ExecQueues& queues);
  ~Exec();
  Exec(const Exec&) = delete;
  Exec& operator=(const Exec&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Topology& topo() const { return topo_; }
  // Whether `peer` is reached through a shared-memory pair (thread ranks, or this machine).
  bool is_shm(int peer) const {
    return peer != rank_ && pairs_[peer] && std::string_view(pairs_[peer]->kind()) == "shm";
  }
  const Fingerprint& fp() const { return fp_; }
  DType dtype() const { return fp_.dtype; }
  ReduceOp redop() const { return fp_.redop; }
  size_t esize() const { return esize_; }
  // Point-to-point operations use their own per-peer sequence numbers, and several run in
  // one Exec (Communicator::run_p2p): each request is posted under its own operation.
  void set_op(const Fingerprint& fp, uint64_t seq);
  void set_deadline(Deadline d) { deadline_ = d; }

  SendReq* send(int peer, const void* buf, size_t bytes);
  // A send whose payload also goes to `also` here (SendReq::also): the ring's writer places
  // it on the way instead of a separate copy reading `buf` again. place_rest() after the
  // send is done copies what the transport did not place.
  SendReq* send_and_place(int peer, const void* buf, size_t bytes, void* also);
  void place_rest(SendReq* s);
  RecvReq* recv(int peer, void* dst, size_t bytes, const RecvReq* after = nullptr);
  // dst = a (op) incoming; a may alias dst.
  RecvReq* recv_reduce(int peer, void* dst, const void* a, size_t bytes,
                       const RecvReq* after = nullptr);

  // A local copy done in 256 KiB pieces whenever the wait loop finds nothing to move, so it
  // overlaps the transfers instead of delaying them; wait_all() finishes it.
  void copy_in_background(void* dst, const void* src, size_t bytes);

  void wait(const RecvReq* r);
  void wait(const SendReq* s);
  void wait_all();
  // Progresses every busy pair until done() (called between rounds) returns true.
  void progress_until(const std::function<bool()>& done);

  // The peers (ranks of this communicator) with transfers still open.
  std::vector<int> busy_peers() const;

  // A reusable scratch buffer of at least `bytes` (grows; kept by the communicator).
  std::byte* scratch(size_t bytes);

  // `bytes` of peer `peer`'s memory `b` (as that rank named it, e.g. in a message), mapped here
  // readable and writable; throws PeerError naming both ranks when it cannot be reached.
  std::byte* peer_memory(int peer, const PeerBuffer& b, size_t bytes);
  // What peer_memory() needs of our buffer [p, p + bytes) to reach it from another rank.
  static PeerBuffer name_buffer(const void* p, size_t bytes);
  // Whether a copy (or out-of-place reduction) of `bytes` in this operation may use
  // non-temporal stores.
  bool streams(size_t bytes) const { return streaming_ && bytes >= kStreamingPieceMin; }

 private:
  bool copy_some();  // one piece of a background copy; false when none is pending
  [[noreturn]] void timed_out();

  int rank_, size_;
  std::vector<std::unique_ptr<Pair>>& pairs_;
  const Topology& topo_;
  Fingerprint fp_;
  uint64_t seq_;
  size_t esize_;
  Deadline deadline_;
  WaitPolicy policy_;
  std::function<void()> check_abort_;
  std::vector<std::byte>& scratch_;
  std::deque<SendReq>& sends_;  // in ExecQueues, emptied when this Exec ends
  std::deque<RecvReq>& recvs_;
  std::deque<ExecQueues::Copy>& copies_;
  bool streaming_;  // this operation is large enough to stream (ExecQueues::streaming_min)
  // Copies below this stay plain even in a streaming operation (small pieces, headers).
  static constexpr size_t kStreamingPieceMin = 64 << 10;
  // Receives into the scratch buffer are read right back by the algorithm: never streamed.
  bool in_scratch(const void* p) const {
    const auto* b = static_cast<const std::byte*>(p);
    return b >= scratch_.data() && b < scratch_.data() + scratch_.size();
  }
};

}  // namespace loom::comm
