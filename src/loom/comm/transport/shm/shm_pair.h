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
#pragma once

#include <cstdint>

#include "loom/comm/transport/pair.h"
#include "loom/comm/transport/shm/segment.h"

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

  bool progress() override;
  void check_peer() override;
  const char* kind() const override { return "shm"; }
  bool peek(FrameHeader* h) override;

 private:
  bool progress_send();
  bool progress_recv();

  shm::Segment seg_;
  int side_;
  size_t ring_bytes_;
  size_t mask_;
  size_t chunk_;
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
};

}  // namespace loom::comm
