#include "loom/comm/transport/shm/shm_pair.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "loom/core/check.h"
#include "loom/core/error.h"
#include "loom/core/tunable.h"

namespace loom::comm {
namespace {

const IntTunable kShmRing("LOOM_SHM_RING", 4 << 20,
                          "bytes of each direction's shared-memory ring (power of two)");
const IntTunable kShmChunk("LOOM_SHM_CHUNK", 128 << 10,
                           "bytes a shared-memory sender writes before publishing them");

constexpr uint64_t kSegMagic = 0x314d48534d4f4f4cull;  // "LOOMSHM1"
constexpr size_t kSlot = 64;
constexpr size_t kCtlOffset = 4096;
constexpr size_t kDataOffset = 8192;

struct SegHeader {
  uint64_t magic;
  uint64_t ring_bytes;
  int32_t pid[2];
  uint32_t closed[2];
};

// Ring k's control block: tail and head each in their own cache line.
uint64_t* tail_of(void* base, int ring) {
  return reinterpret_cast<uint64_t*>(static_cast<std::byte*>(base) + kCtlOffset + ring * 256);
}
uint64_t* head_of(void* base, int ring) {
  return reinterpret_cast<uint64_t*>(static_cast<std::byte*>(base) + kCtlOffset + ring * 256 + 128);
}
std::byte* data_of(void* base, int ring, size_t ring_bytes) {
  return static_cast<std::byte*>(base) + kDataOffset + ring * ring_bytes;
}

inline uint64_t load_acquire(uint64_t* p) {
  return std::atomic_ref<uint64_t>(*p).load(std::memory_order_acquire);
}
inline void store_release(uint64_t* p, uint64_t v) {
  std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release);
}
inline uint64_t round_up(uint64_t v) {
  return (v + kSlot - 1) & ~(kSlot - 1);
}

}  // namespace

size_t ShmPair::default_ring_bytes() {
  auto v = static_cast<size_t>(kShmRing.get());
  if (v < 4096 || (v & (v - 1)) != 0)
    throw UserError("LOOM_SHM_RING=" + std::to_string(v) + " is not a power of two >= 4096",
                    "use e.g. 4194304 (4 MiB)");
  return v;
}

size_t ShmPair::segment_bytes(size_t ring_bytes) {
  return kDataOffset + 2 * ring_bytes;
}

void ShmPair::format(shm::Segment& seg, size_t ring_bytes) {
  auto* h = static_cast<SegHeader*>(seg.data());
  h->ring_bytes = ring_bytes;
  h->pid[0] = ::getpid();
  std::atomic_ref<uint64_t>(h->magic).store(kSegMagic, std::memory_order_release);
}

ShmPair::ShmPair(int self, int peer, shm::Segment seg, int side)
    : Pair(self, peer), seg_(std::move(seg)), side_(side) {
  auto* h = static_cast<SegHeader*>(seg_.data());
  LOOM_CHECK_EQ(std::atomic_ref<uint64_t>(h->magic).load(std::memory_order_acquire), kSegMagic);
  ring_bytes_ = h->ring_bytes;
  LOOM_CHECK_EQ(seg_.size(), segment_bytes(ring_bytes_));
  mask_ = ring_bytes_ - 1;
  chunk_ = std::max<size_t>(kSlot, static_cast<size_t>(kShmChunk.get()) & ~(kSlot - 1));
  if (side == 1) std::atomic_ref<int32_t>(h->pid[1]).store(::getpid(), std::memory_order_release);
  int tx = side, rx = 1 - side;
  tx_data_ = data_of(seg_.data(), tx, ring_bytes_);
  tx_tail_ = tail_of(seg_.data(), tx);
  tx_head_ = head_of(seg_.data(), tx);
  rx_data_ = data_of(seg_.data(), rx, ring_bytes_);
  rx_tail_ = tail_of(seg_.data(), rx);
  rx_head_ = head_of(seg_.data(), rx);
}

ShmPair::~ShmPair() {
  auto* h = static_cast<SegHeader*>(seg_.data());
  if (h) std::atomic_ref<uint32_t>(h->closed[side_]).store(1, std::memory_order_release);
  seg_.unlink();  // normally already gone; harmless if so
}

void ShmPair::check_peer() {
  auto* h = static_cast<SegHeader*>(seg_.data());
  int other = 1 - side_;
  int pid = std::atomic_ref<int32_t>(h->pid[other]).load(std::memory_order_acquire);
  bool dead = pid != 0 && pid != ::getpid() && !shm::pid_alive(pid);
  bool closed = std::atomic_ref<uint32_t>(h->closed[other]).load(std::memory_order_acquire);
  if (!dead && !closed) return;
  // A peer that wrote everything we need and then left is not a failure: everything it
  // wrote before leaving is visible now (its closed flag is a release store; a dead peer
  // writes nothing more), so drain the ring and fail only if we are still waiting.
  while (progress()) {
  }
  if (!busy()) return;
  if (dead)
    throw PeerError(PeerError::Kind::kDead,
                    "rank " + std::to_string(world_self_) + ": rank " +
                        std::to_string(world_peer_) + " (pid " + std::to_string(pid) + ") died",
                    peer_);
  throw PeerError(PeerError::Kind::kClosed,
                  "rank " + std::to_string(world_self_) + ": rank " + std::to_string(world_peer_) +
                      " closed its shared-memory connection (it left the communicator)",
                  peer_);
}

bool ShmPair::progress() {
  bool moved = false;
  if (!sends_.empty()) moved |= progress_send();
  if (!recvs_.empty()) moved |= progress_recv();
  return moved;
}

bool ShmPair::progress_send() {
  bool moved = false;
  while (!sends_.empty()) {
    SendReq& r = *sends_.front();
    uint64_t free = ring_bytes_ - (tx_pos_ - tx_head_seen_);
    size_t need = r.progress == 0
                      ? kSlot
                      : std::min<size_t>(chunk_, round_up(r.bytes - (r.progress - kSlot)));
    if (free < need) {
      tx_head_seen_ = load_acquire(tx_head_);
      free = ring_bytes_ - (tx_pos_ - tx_head_seen_);
    }
    if (r.progress == 0) {
      if (free < kSlot) break;
      std::memcpy(tx_data_ + (tx_pos_ & mask_), &r.header, sizeof(FrameHeader));
      tx_pos_ += kSlot;
      free -= kSlot;
      r.progress = kSlot;
      moved = true;
      if (r.bytes == 0) {
        store_release(tx_tail_, tx_pos_);
        r.done = true;
        sends_.pop_front();
        continue;
      }
    }
    size_t sent = r.progress - kSlot;
    size_t left = r.bytes - sent;
    size_t n = std::min<size_t>({left, static_cast<size_t>(free), chunk_});
    if (n < left) n &= ~(kSlot - 1);
    if (n == 0) {
      if (moved) store_release(tx_tail_, tx_pos_);  // publish the header alone
      break;
    }
    const auto* src = static_cast<const std::byte*>(r.buf) + sent;
    size_t off = tx_pos_ & mask_;
    size_t first = std::min(n, ring_bytes_ - off);
    std::memcpy(tx_data_ + off, src, first);
    if (first < n) std::memcpy(tx_data_, src + first, n - first);
    tx_pos_ += (n == left) ? round_up(n) : n;
    r.progress += n;
    store_release(tx_tail_, tx_pos_);
    moved = true;
    if (n == left) {
      r.done = true;
      sends_.pop_front();
    }
  }
  return moved;
}

bool ShmPair::peek(FrameHeader* h) {
  if (rx_tail_seen_ == rx_pos_) {
    rx_tail_seen_ = load_acquire(rx_tail_);
    if (rx_tail_seen_ == rx_pos_) return false;
  }
  std::memcpy(h, rx_data_ + (rx_pos_ & mask_), sizeof *h);  // a header slot never wraps
  return true;
}

bool ShmPair::progress_recv() {
  bool moved = false;
  while (!recvs_.empty()) {
    RecvReq& r = *recvs_.front();
    if (r.after && !r.after->done) break;
    if (rx_tail_seen_ == rx_pos_) {
      rx_tail_seen_ = load_acquire(rx_tail_);
      if (rx_tail_seen_ == rx_pos_) break;
    }
    if (!r.header_seen) {
      FrameHeader h;
      std::memcpy(&h, rx_data_ + (rx_pos_ & mask_), sizeof h);
      check_header(r, h);
      rx_pos_ += kSlot;
      r.header_seen = true;
      moved = true;
      if (r.bytes == 0) {
        store_release(rx_head_, rx_pos_);
        r.done = true;
        recvs_.pop_front();
        continue;
      }
      if (rx_tail_seen_ == rx_pos_) {
        store_release(rx_head_, rx_pos_);
        continue;
      }
    }
    size_t left = r.bytes - r.got;
    size_t n = std::min<size_t>(left, rx_tail_seen_ - rx_pos_);
    size_t off = rx_pos_ & mask_;
    size_t first = std::min(n, ring_bytes_ - off);
    deliver(r, rx_data_ + off, first);
    if (first < n) deliver(r, rx_data_, n - first);
    rx_pos_ += (n == left) ? round_up(n) : n;
    store_release(rx_head_, rx_pos_);
    moved = true;
    if (r.got == r.bytes) {
      r.done = true;
      recvs_.pop_front();
    }
  }
  return moved;
}

}  // namespace loom::comm
