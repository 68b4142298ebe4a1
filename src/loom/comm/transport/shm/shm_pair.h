// A pair through one shared-memory segment: two single-producer/single-consumer byte
// rings, one per direction. No system call on the data path.
//
// Each ring carries frames (a 64-byte header slot, then the payload padded to 64 bytes)
// at monotonically increasing byte offsets; tail (written by the producer) and head
// (written by the consumer) live in separate cache lines and never reset. Consecutive
// messages therefore land at consecutive addresses, so a producer does not rewrite the
// lines its peer has just read (PERF-NOTES: the 2-3x that mattered most). The producer
// publishes its tail after every chunk (LOOM_SHM_CHUNK), so the consumer copies or
// reduces chunk k while chunk k+1 is being written.
//
// Single copy (LOOM_SHM_SINGLE_COPY bytes and up, collectives only): the sender puts only a
// header slot naming its buffer's address into the ring; the receiver copies or reduces
// straight from that buffer (process_vm_readv between processes, plain loads between thread
// ranks) and then bumps an acknowledgement counter, which completes the send. One copy per
// byte instead of two. Each side probes once whether it may read its peer's memory and
// publishes the answer; a sender reads in place only toward a peer that can.
//
// Shared buffers (Communicator::alloc_shared, LOOM_SHM_SHARED_MIN bytes and up): a send
// from inside one goes the same way, naming the buffer, and the receiver reads it through
// its own mapping of it (made on first use): plain loads, no system call per message.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/comm/transport/pair.h"
#include "loom/comm/transport/shm/segment.h"
#include "loom/comm/transport/shm/shared_memory.h"

namespace loom::comm {

class ShmPair : public Pair {
 public:
  // side 0 created the segment (the lower rank), side 1 opened it.
  ShmPair(int self, int peer, shm::Segment seg, int side);
  ~ShmPair() override;

  // Segment size needed for rings of `ring_bytes` (a power of two, multiple of 64).
  static size_t segment_bytes(size_t ring_bytes);
  // Lays out a freshly created segment.
  static void format(shm::Segment& seg, size_t ring_bytes);
  static size_t default_ring_bytes();
  // Payload bytes this process has received by reading senders' buffers in place (tests).
  static uint64_t bytes_read_in_place();
  // Futex sleeps of this process's waiters, and wake-ups its ranks sent (LOOM_SHM_FUTEX).
  static uint64_t futex_sleeps();
  static uint64_t futex_wakes();

  bool progress() override;
  void check_peer() override;
  bool can_sleep() const override { return futex_; }
  // Sleep on the futex when waiting (the communicator's choice: this host is oversubscribed).
  void set_futex(bool on);
  void sleep_until_peer(int max_us) override;
  const char* kind() const override { return "shm"; }
  bool peek(FrameHeader* h) override;
  // A thread rank's buffer at its own address, another process's through our mapping of the
  // shared buffer it lies in (mapped writable on first use, kept like the read-only ones).
  std::byte* peer_memory(const PeerBuffer& b, size_t bytes, std::string* why) override;

 protected:
  void revoke() override;

 private:
  bool progress_send();
  void write_ring(uint64_t pos, const void* src, size_t n);
  bool progress_recv();
  bool reap_acks();
  uint64_t tail_seen() const;
  void probe_peer();
  bool peer_reads_in_place();
  // Copies or reduces the next piece of an in-place message into `r`.
  void read_in_place(RecvReq& r);
  const std::byte* map_shared(const shm::SharedRef& ref, size_t bytes);
  [[noreturn]] void read_failed(int err);

  shm::Segment seg_;
  int side_;
  size_t ring_bytes_;
  size_t mask_;
  size_t chunk_;
  uint64_t stamp_key_;  // header-slot stamps (shm_pair.cc)
  // Producer side of our outgoing ring.
  std::byte* tx_data_;
  uint64_t* tx_tail_;
  uint64_t* tx_head_;
  uint64_t tx_pos_ = 0;        // our tail, mirrored locally
  uint64_t tx_head_seen_ = 0;  // last head we read from the consumer
  // Consumer side of the incoming ring.
  std::byte* rx_data_;
  uint64_t* rx_tail_;
  uint64_t* rx_head_;
  uint64_t rx_pos_ = 0;
  uint64_t rx_tail_seen_ = 0;
  uint32_t stamp_misses_ = 0;  // polls of an unstamped boundary since the tail was last read
  // Single copy.
  size_t single_copy_min_;  // 0: off
  size_t read_piece_;       // bytes a single-copy receiver copies per step (LOOM_SHM_READ_PIECE)
  int peer_pid_ = 0;
  bool probed_ = false;
  int peer_reads_ = 0;  // 0 unknown, 1 the peer reads our buffers in place, 2 it cannot
  uint64_t* tx_ack_;    // in-place messages of our ring the peer has finished reading
  uint64_t* rx_ack_;
  uint64_t acked_ = 0;        // acknowledgements already applied to unacked_
  uint64_t rx_acks_ = 0;      // in-place messages we have finished reading
  bool rx_in_place_ = false;  // the front receive reads from rx_remote_ (or rx_local_)
  uint64_t rx_remote_ = 0;
  const std::byte* rx_local_ = nullptr;  // the message in our address space (thread rank, or our
                                         // mapping of a shared buffer); nullptr: process_vm_readv
  shm::PeerMappings peer_buffers_;
  size_t shared_min_, shared_min_allreduce_;
  size_t in_place_floor_;  // the smallest message this side's settings send in place
  // Futex doorbells (LOOM_SHM_FUTEX): a side about to sleep sets its `sleeping` word; the
  // other side, after each store that publishes (tail, head, ack), bumps that side's `bell`
  // and wakes it. Read-modify-writes on the flag make the hand-off exact where a side may
  // sleep (futex_); elsewhere a wake-up could be late by the sleep's bound (1 ms), no more.
  bool futex_ = false;
  uint32_t *my_bell_ = nullptr, *my_sleeping_ = nullptr;
  uint32_t *peer_bell_ = nullptr, *peer_sleeping_ = nullptr;
  void publish(uint64_t* word, uint64_t v);
  std::vector<std::byte> bounce_;  // a reduction's pieces read from another process
};

}  // namespace loom::comm
