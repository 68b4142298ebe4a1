// The transport interface algorithms are written against (DESIGN decision 2).
//
// A Pair is a connection to one peer. Algorithms post send and receive requests; the
// engine calls progress() on busy pairs until the requests they wait for are done.
// Messages between a pair are delivered in the order they were posted on each side.
//
// Every message starts with a FrameHeader carrying the operation's fingerprint and
// sequence number. The receiver compares it with what it expects before touching the
// payload, so ranks that call mismatched collectives fail with a desync error instead of
// corrupting memory (DESIGN decision 3).
//
// A receive either copies the payload into `dst` or reduces it: dst = a (op) payload,
// with `a` allowed to alias `dst`. Transports hand payload to deliver() in pieces whose
// lengths are multiples of the element size.
#pragma once

#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "loom/comm/types.h"
#include "loom/core/dtype.h"

namespace loom::comm {

constexpr uint32_t kFrameMagic = 0x4d4f4f4c;  // "LOOM"
constexpr uint32_t kFrameSingleCopy = 1;      // read with process_vm_readv (or plain loads)
constexpr uint32_t kFrameShared = 2;          // inside a buffer the receiver has mapped
constexpr uint32_t kFrameInline = 4;          // the payload rides in the header's slot (shm)
constexpr uint32_t kFrameWhole =
    8;  // the payload, in the slots after the header's, came first (shm)

// Identifies an operation; identical on every rank that takes part.
struct Fingerprint {
  OpKind op = OpKind::kBarrier;
  DType dtype = DType::kU8;
  ReduceOp redop = ReduceOp::kSum;
  Algo algo = Algo::kAuto;
  int32_t root = -1;
  uint64_t count = 0;
  bool operator==(const Fingerprint&) const = default;
  std::string str() const;
};

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t op = 0;
  uint8_t dtype = 0;
  uint8_t redop = 0;
  uint8_t algo = 0;
  uint64_t seq = 0;
  uint64_t count = 0;
  int32_t root = -1;
  uint32_t flags = 0;  // kFrameSingleCopy/kFrameShared: no payload follows; read in place
  uint64_t bytes = 0;  // payload bytes that follow (or that the receiver reads in place)

  static FrameHeader of(const Fingerprint& fp, uint64_t seq, uint64_t bytes);
  Fingerprint fingerprint() const;
};
static_assert(sizeof(FrameHeader) == 40);

struct SendReq {
  const void* buf = nullptr;
  size_t bytes = 0;
  FrameHeader header;
  // The receiver may read `buf` in place (a collective's send: its receive is posted in the
  // same step). Point-to-point sends stay eager: a send of up to a ring's bytes completes
  // before the receiver has posted its receive.
  bool in_place_ok = false;
  // A second destination of the payload (an allgather's own block in its output), or null: a
  // shared-memory pair copies each piece there as it writes it into its ring, reading the
  // source once while it is in cache, and counts the bytes placed in `also_got`; whatever
  // is not placed when the send completes, Exec::place_rest copies.
  void* also = nullptr;
  size_t also_got = 0;
  // transport state
  size_t progress = 0;  // bytes of header+payload already handed to the transport
  bool done = false;
};

struct RecvReq {
  void* dst = nullptr;
  const void* a = nullptr;  // reduce operand; nullptr = plain copy
  size_t bytes = 0;
  DType dtype = DType::kU8;
  ReduceOp redop = ReduceOp::kSum;
  Fingerprint expect;
  uint64_t seq = 0;
  // Optional ordering: delivery starts only after `after` is done (keeps reduction order
  // fixed when several peers feed one buffer).
  const RecvReq* after = nullptr;
  // A copy or out-of-place reduction into an output nobody reads back soon: written with
  // non-temporal stores (Exec::recv_reduce sets it, LOOM_STREAMING_COPY_MIN).
  bool streaming = false;
  // transport state
  bool header_seen = false;
  size_t got = 0;
  bool done = false;
};

// Where a buffer lies in the process of the rank that owns it, as that rank names it to a peer
// (Exec::peer_memory): its address there, and the shared buffer it lies in (buffer id, memfd
// number) if any; fd < 0 when it lies in no shared buffer.
struct PeerBuffer {
  uint64_t addr = 0;
  uint64_t id = 0;
  int32_t fd = -1;
  int32_t pid = 0;
};

class Pair {
 public:
  Pair(int self, int peer) : self_(self), peer_(peer), world_self_(self), world_peer_(peer) {}
  virtual ~Pair() = default;
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;

  int peer() const { return peer_; }
  // The world ranks of the two ends, which messages name (a split communicator numbers its
  // ranks from 0; people, `loom run` and the flight recorder name world ranks).
  void name_ends(int world_self, int world_peer) {
    world_self_ = world_self;
    world_peer_ = world_peer;
  }
  int world_peer() const { return world_peer_; }
  int world_self() const { return world_self_; }
  void post(SendReq* r) { sends_.push_back(r); }
  void post(RecvReq* r) { recvs_.push_back(r); }
  bool busy() const { return !sends_.empty() || !recvs_.empty() || !unacked_.empty(); }
  bool sending() const { return !sends_.empty() || !unacked_.empty(); }
  bool receiving() const { return !recvs_.empty(); }

  // Moves what it can without blocking; returns whether anything moved.
  // Throws PeerError on a closed connection, a dead peer or a mismatched header.
  virtual bool progress() = 0;
  // Descriptors to poll() for readiness (none for transports polled by spinning).
  virtual void poll_fds(std::vector<pollfd>& out) const { (void)out; }
  virtual bool polled() const { return false; }
  // Throws PeerError(kDead) when the peer process is gone. Cheap enough for every ~100 ms.
  virtual void check_peer() {}
  // Whether sleep_until_peer() can block this waiter until the peer writes (a futex).
  virtual bool can_sleep() const { return false; }
  // Blocks until the peer publishes anything to this pair, or at most `max_us`; returns at
  // once (having progressed) if something moved meanwhile.
  virtual void sleep_until_peer(int max_us) { (void)max_us; }
  virtual const char* kind() const = 0;
  // With no receive posted: the header of the next incoming message, if it has arrived,
  // without consuming it (how a receive from any source finds its sender).
  virtual bool peek(FrameHeader* h) = 0;
  // Our address of `bytes` of the peer's memory `b`, readable and writable (a collective that
  // reads and writes its peers' shared buffers itself, algorithms/allreduce.cc); nullptr with
  // the reason in *why when this transport cannot reach the peer's memory.
  virtual std::byte* peer_memory(const PeerBuffer& b, size_t bytes, std::string* why) {
    (void)b, (void)bytes;
    *why = std::string(kind()) + " cannot reach a peer's memory";
    return nullptr;
  }
  // Drops queued requests (after an error, before their buffers go away).
  void cancel_all() {
    stop_io();
    if (!unacked_.empty()) revoke();
    sends_.clear();
    recvs_.clear();
    unacked_.clear();
  }

 protected:
  // Copies or reduces `len` payload bytes at payload offset `off`; r.got counts them.
  void deliver_at(RecvReq& r, size_t off, const void* src, size_t len);
  // The same for in-order transports: at offset r.got.
  void deliver(RecvReq& r, const void* src, size_t len) { deliver_at(r, r.got, src, len); }
  // Throws PeerError(kDesync) naming both fingerprints when `h` is not what `r` expects.
  void check_header(const RecvReq& r, const FrameHeader& h) const;
  // Tells the peer that buffers it may be reading in place are about to be given back
  // (cancel_all with sends still unacknowledged).
  virtual void revoke() {}
  // Stops a transport's own threads from touching the queued requests' buffers.
  virtual void stop_io() {}

  int self_;
  int peer_;
  int world_self_, world_peer_;  // for messages only
  std::deque<SendReq*> sends_;
  std::deque<RecvReq*> recvs_;
  // Sends whose receiver reads them in place: done once it says it has read them.
  std::deque<SendReq*> unacked_;
};

}  // namespace loom::comm
