#include "loom/comm/transport/shm/shm_pair.h"

#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>

#include "loom/core/check.h"
#include "loom/core/error.h"
#include "loom/core/log.h"
#include "loom/core/tsan.h"
#include "loom/core/tunable.h"

namespace loom::comm {
namespace {

const BytesTunable kShmRing("LOOM_SHM_RING", 4 << 20,
                            "bytes of each direction's shared-memory ring (power of two)");
const BytesTunable kShmChunk("LOOM_SHM_CHUNK", 128 << 10,
                             "bytes a shared-memory sender writes before publishing them");
const BytesTunable kSingleCopy("LOOM_SHM_SINGLE_COPY", 0,
                               "a collective's shared-memory message of at least this many bytes "
                               "is read in place by its receiver (one copy); 0 = always the ring");
const BytesTunable kReadPiece("LOOM_SHM_READ_PIECE", 1 << 20,
                              "bytes a single-copy receiver copies per step");
const BytesTunable kSharedMin("LOOM_SHM_SHARED_MIN", 64 << 10,
                              "a collective's message of at least this many bytes sent from a "
                              "shared buffer (alloc_shared) is read in place by its receiver; "
                              "0 = always the ring");
const IntTunable kShmFutex("LOOM_SHM_FUTEX", 0,
                           "1: a rank of an oversubscribed host that has waited "
                           "LOOM_FUTEX_AFTER_US for one shared-memory peer sleeps on a futex "
                           "the peer wakes (0: yields, then naps; not shown faster here: perf.md)");
const BytesTunable kSharedMinAllreduce(
    "LOOM_SHM_SHARED_MIN_ALLREDUCE", 32 << 20,
    "the same for allreduce's messages (its reads in place lose to the ring below ~32 MiB "
    "messages on the development machine: docs/perf.md)");
constexpr size_t kBouncePiece = 128 << 10;  // a reduction's piece read from another process
std::atomic<uint64_t> g_read_in_place{0};
std::atomic<uint64_t> g_futex_sleeps{0}, g_futex_wakes{0};

constexpr uint64_t kSegMagic = 0x314d48534d4f4f4cull;  // "LOOMSHM1"
constexpr size_t kSlot = 64;
constexpr size_t kCtlOffset = 4096;
constexpr size_t kDataOffset = 8192;

struct SegHeader {
  uint64_t magic;
  uint64_t ring_bytes;
  int32_t pid[2];
  uint32_t closed[2];
  uint64_t probe_addr[2];  // where side k keeps kProbeWord (published before its pid)
  uint32_t can_read[2];    // side k may read side 1-k's memory: 0 not yet known, 1 yes, 2 no
  uint32_t revoked[2];     // side k gave back buffers its peer may still be reading
  uint64_t stamp_key;      // mixed into header-slot stamps (random per segment)
};

constexpr uint64_t kProbeMagic = 0x45424f52504d4f4full;  // "LOOMPROBE"
const volatile uint64_t kProbeWord = kProbeMagic;

// Under Yama's ptrace_scope 1 only a process's ancestors may read its memory; let the
// other ranks (same user) do it too, as other MPI libraries' single-copy paths do.
void allow_peer_reads() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
    int scope = 0;
    if (f >> scope && scope == 1) ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  });
}

// Ring k's control block: tail and head each in their own cache line.
uint64_t* tail_of(void* base, int ring) {
  return reinterpret_cast<uint64_t*>(static_cast<std::byte*>(base) + kCtlOffset + ring * 256);
}
uint64_t* head_of(void* base, int ring) {
  return reinterpret_cast<uint64_t*>(static_cast<std::byte*>(base) + kCtlOffset + ring * 256 + 128);
}
// Written by the consumer, like head (same 128-byte pair of lines, its own line).
uint64_t* ack_of(void* base, int ring) {
  return reinterpret_cast<uint64_t*>(static_cast<std::byte*>(base) + kCtlOffset + ring * 256 + 192);
}
// Side k's futex doorbell and sleeping flag, one line per side, after the rings' blocks.
uint32_t* bell_of(void* base, int side) {
  return reinterpret_cast<uint32_t*>(static_cast<std::byte*>(base) + kCtlOffset + 1024 + side * 64);
}
uint32_t* sleeping_of(void* base, int side) {
  return bell_of(base, side) + 1;
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
// A header slot's last word is its stamp: the sender stores it (release) after the rest of
// the slot, so a receiver waiting at a frame boundary polls the one line that also holds the
// header (and an inline payload) instead of the tail's line first and the slot's second —
// one cache-line transfer per small message instead of two or three. Positions never repeat,
// so a stamp never matches a stale slot of an earlier lap; the key makes old payload bytes
// at that word as unlikely to match as a random 64-bit value (and the header's magic and
// fingerprint checks would still name the mismatch). The top bit is always set: the word an
// in-place frame keeps there (its shared buffer's descriptor) never has it.
constexpr size_t kStampAt = kSlot - 8;
constexpr size_t kInlineMax = kStampAt - sizeof(FrameHeader);  // payload bytes inside a slot
static_assert(kInlineMax == 16);
// A small frame too large for its header's slot is written whole before the stamp: its
// payload first, in the slots that follow, then the header slot with the stamp. A receiver
// that sees the stamp has the payload too, without waiting for the tail (its own line):
// the payload's lines travel together instead of after the tail's.
constexpr size_t kWholeMax = 4096;
// The stamp's word of the header slot at `slot`.
inline uint64_t* stamp_word(const std::byte* slot) {
  return reinterpret_cast<uint64_t*>(const_cast<std::byte*>(slot) + kStampAt);
}
inline uint64_t stamp_of(uint64_t pos, uint64_t key) {
  return ((pos / kSlot) * 0x9E3779B97F4A7C15ull ^ key) | (1ull << 63);
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

uint64_t ShmPair::futex_sleeps() {
  return g_futex_sleeps.load();
}

uint64_t ShmPair::futex_wakes() {
  return g_futex_wakes.load();
}

uint64_t ShmPair::bytes_read_in_place() {
  return g_read_in_place.load(std::memory_order_relaxed);
}

size_t ShmPair::segment_bytes(size_t ring_bytes) {
  return kDataOffset + 2 * ring_bytes;
}

void ShmPair::format(shm::Segment& seg, size_t ring_bytes) {
  auto* h = static_cast<SegHeader*>(seg.data());
  h->ring_bytes = ring_bytes;
  if (kSingleCopy.get() > 0) allow_peer_reads();
  h->probe_addr[0] = reinterpret_cast<uintptr_t>(&kProbeWord);
  h->pid[0] = ::getpid();
  h->stamp_key = std::random_device{}() * 0x100000001b3ull ^ static_cast<uint64_t>(::getpid());
  std::atomic_ref<uint64_t>(h->magic).store(kSegMagic, std::memory_order_release);
}

ShmPair::ShmPair(int self, int peer, shm::Segment seg, int side)
    : Pair(self, peer), seg_(std::move(seg)), side_(side) {
  auto* h = static_cast<SegHeader*>(seg_.data());
  LOOM_CHECK_EQ(std::atomic_ref<uint64_t>(h->magic).load(std::memory_order_acquire), kSegMagic);
  ring_bytes_ = h->ring_bytes;
  stamp_key_ = h->stamp_key;
  LOOM_CHECK_EQ(seg_.size(), segment_bytes(ring_bytes_));
  mask_ = ring_bytes_ - 1;
  chunk_ = std::max<size_t>(kSlot, static_cast<size_t>(kShmChunk.get()) & ~(kSlot - 1));
  chunk_ = std::min(chunk_, ring_bytes_ / 2);  // a published piece always fits a ring
  single_copy_min_ = static_cast<size_t>(std::max<int64_t>(0, kSingleCopy.get()));
  read_piece_ = static_cast<size_t>(std::max<int64_t>(4096, kReadPiece.get())) & ~size_t{63};
  shared_min_ = static_cast<size_t>(std::max<int64_t>(0, kSharedMin.get()));
  shared_min_allreduce_ = static_cast<size_t>(std::max<int64_t>(0, kSharedMinAllreduce.get()));
  in_place_floor_ = SIZE_MAX;
  for (size_t m : {single_copy_min_, shared_min_, shared_min_allreduce_})
    if (m > 0) in_place_floor_ = std::min(in_place_floor_, m);
  if (side == 1) {
    if (single_copy_min_ > 0) allow_peer_reads();
    h->probe_addr[1] = reinterpret_cast<uintptr_t>(&kProbeWord);
    std::atomic_ref<int32_t>(h->pid[1]).store(::getpid(), std::memory_order_release);
  }
  int tx = side, rx = 1 - side;
  tx_data_ = data_of(seg_.data(), tx, ring_bytes_);
  tx_tail_ = tail_of(seg_.data(), tx);
  tx_head_ = head_of(seg_.data(), tx);
  rx_data_ = data_of(seg_.data(), rx, ring_bytes_);
  rx_tail_ = tail_of(seg_.data(), rx);
  rx_head_ = head_of(seg_.data(), rx);
  tx_ack_ = ack_of(seg_.data(), tx);
  rx_ack_ = ack_of(seg_.data(), rx);
  my_bell_ = bell_of(seg_.data(), side), my_sleeping_ = sleeping_of(seg_.data(), side);
  peer_bell_ = bell_of(seg_.data(), 1 - side), peer_sleeping_ = sleeping_of(seg_.data(), 1 - side);
  // Touch every page of both rings now, from this process: under a hypervisor that shadows
  // page tables (PVM here) a page's first touch by each process traps even when the mapping
  // is populated, which made a job's first few hundred operations 10-20x slower until the
  // messages had been once around the rings. Our ring's pages are written (nobody reads
  // them before our tail moves), the peer's read.
  for (size_t off = 0; off < ring_bytes_; off += 4096) {
    std::atomic_ref<std::byte>(tx_data_[off]).store(std::byte{0}, std::memory_order_relaxed);
    (void)std::atomic_ref<std::byte>(rx_data_[off]).load(std::memory_order_relaxed);
  }
}

ShmPair::~ShmPair() {
  auto* h = static_cast<SegHeader*>(seg_.data());
  if (h && !unacked_.empty()) revoke();
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
  if (!probed_) probe_peer();
  if (!unacked_.empty()) moved |= reap_acks();
  if (!sends_.empty()) moved |= progress_send();
  if (!recvs_.empty()) moved |= progress_recv();
  return moved;
}

// Once the peer has published its pid: can we read its memory? (Published for the peer's
// sends; a peer on this process needs no system call.)
void ShmPair::probe_peer() {
  auto* h = static_cast<SegHeader*>(seg_.data());
  const int other = 1 - side_;
  peer_pid_ = std::atomic_ref<int32_t>(h->pid[other]).load(std::memory_order_acquire);
  if (peer_pid_ == 0) return;
  probed_ = true;
  uint32_t verdict = 2;  // cannot (or, with single copy off, will not) read the peer
  if (single_copy_min_ == 0) {
  } else if (peer_pid_ == ::getpid()) {
    verdict = 1;
  } else {
    uint64_t word = 0;
    iovec local{&word, sizeof word};
    iovec remote{reinterpret_cast<void*>(h->probe_addr[other]), sizeof word};
    ssize_t got = ::process_vm_readv(peer_pid_, &local, 1, &remote, 1, 0);
    if (got == sizeof word && word == kProbeMagic) {
      verdict = 1;
    } else {
      static std::once_flag once;
      const int err = got < 0 ? errno : 0;
      std::call_once(
          once, [&] {
            LOOM_LOG(kWarn, "comm")
                << "single-copy shared memory is unavailable here (process_vm_readv of rank "
                << world_peer_ << ": " << (err ? std::strerror(err) : "wrong word")
                << "); large messages go through the ring. Hint: allow ptrace between the ranks "
                   "(kernel.yama.ptrace_scope <= 1, a container with CAP_SYS_PTRACE or a seccomp "
                   "profile allowing process_vm_readv), or set LOOM_SHM_SINGLE_COPY=0 to silence "
                   "this";
          });
    }
  }
  std::atomic_ref<uint32_t>(h->can_read[side_]).store(verdict, std::memory_order_release);
}

bool ShmPair::peer_reads_in_place() {
  if (peer_reads_ == 0) {
    auto* h = static_cast<SegHeader*>(seg_.data());
    peer_reads_ = static_cast<int>(
        std::atomic_ref<uint32_t>(h->can_read[1 - side_]).load(std::memory_order_acquire));
  }
  return peer_reads_ == 1;
}

void ShmPair::revoke() {
  auto* h = static_cast<SegHeader*>(seg_.data());
  std::atomic_ref<uint32_t>(h->revoked[side_]).store(1, std::memory_order_seq_cst);
}

void ShmPair::set_futex(bool on) {
  futex_ = on && kShmFutex.get() != 0;
}

void ShmPair::publish(uint64_t* word, uint64_t v) {
  store_release(word, v);
  // Where a side may sleep (futex_), the store above and the read of its flag are ordered
  // by a read-modify-write: the sleeper announces itself with one too (exchange), so either
  // it reads our store after its announcement or we read its flag set (a fence would do
  // on x86, but ThreadSanitizer cannot model fences).
  std::atomic_ref<uint32_t> sleeping(*peer_sleeping_);
  const uint32_t asleep = futex_ ? sleeping.fetch_add(0, std::memory_order_seq_cst)
                                 : sleeping.load(std::memory_order_relaxed);
  if (asleep != 0) {
    std::atomic_ref<uint32_t>(*peer_bell_).fetch_add(1, std::memory_order_release);
    ::syscall(SYS_futex, peer_bell_, FUTEX_WAKE, 1, nullptr, nullptr, 0);
    g_futex_wakes.fetch_add(1, std::memory_order_relaxed);
  }
}

void ShmPair::sleep_until_peer(int max_us) {
  std::atomic_ref<uint32_t> bell(*my_bell_), sleeping(*my_sleeping_);
  const uint32_t rung = bell.load(std::memory_order_acquire);
  sleeping.exchange(1, std::memory_order_seq_cst);
  struct Awake {
    std::atomic_ref<uint32_t>& s;
    ~Awake() { s.store(0, std::memory_order_relaxed); }
  } awake{sleeping};
  if (progress()) return;  // something came in before we announced ourselves
  timespec ts{max_us / 1000000, (max_us % 1000000) * 1000L};
  g_futex_sleeps.fetch_add(1, std::memory_order_relaxed);
  // Returns at once if the bell rang since `rung` (EAGAIN), on a wake, or at the bound.
  ::syscall(SYS_futex, my_bell_, FUTEX_WAIT, rung, &ts, nullptr, 0);
}

bool ShmPair::reap_acks() {
  uint64_t ack = load_acquire(tx_ack_);
  if (ack == acked_) return false;
  for (; acked_ < ack && !unacked_.empty(); ++acked_) {
    tsan_acquire(unacked_.front()->buf);
    unacked_.front()->done = true;
    unacked_.pop_front();
  }
  return true;
}

// Copies n bytes into our ring from position `pos` on, wrapping at its end.
void ShmPair::write_ring(uint64_t pos, const void* src, size_t n) {
  const size_t off = pos & mask_;
  const size_t first = std::min<size_t>(n, ring_bytes_ - off);
  std::memcpy(tx_data_ + off, src, first);
  if (first < n) std::memcpy(tx_data_, static_cast<const std::byte*>(src) + first, n - first);
}

namespace {
// SendReq::also: bytes [off, off + n) of the payload, just written into the ring (still in
// this core's cache), copied to the send's second destination too, in order.
void place(SendReq& r, size_t off, size_t n) {
  if (!r.also || r.also_got != off) return;
  std::memcpy(static_cast<std::byte*>(r.also) + off, static_cast<const std::byte*>(r.buf) + off, n);
  r.also_got += n;
}
}  // namespace

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
    uint32_t in_place = 0;
    shm::SharedRef ref;
    if (r.progress == 0 && r.in_place_ok && r.bytes > 0) {
      const size_t min = r.header.op == static_cast<uint8_t>(OpKind::kAllreduce)
                             ? shared_min_allreduce_
                             : shared_min_;
      if (min > 0 && r.bytes >= min && shm::shared_find(r.buf, r.bytes, &ref))
        in_place = kFrameShared;
      else if (single_copy_min_ > 0 && r.bytes >= single_copy_min_ && peer_reads_in_place())
        in_place = kFrameSingleCopy;
    }
    if (in_place) {
      if (free < kSlot) break;
      std::byte* slot = tx_data_ + (tx_pos_ & mask_);
      FrameHeader h = r.header;
      h.flags |= in_place;
      const uint64_t addr = reinterpret_cast<uintptr_t>(r.buf);
      std::memcpy(slot, &h, sizeof h);
      std::memcpy(slot + sizeof h, &addr, sizeof addr);
      std::memcpy(slot + sizeof h + 8, &ref.id, sizeof ref.id);
      // The descriptor sits in the stamp's word (no stamp: the receiver finds this frame by
      // the tail), written atomically since a receiver at this boundary polls that word.
      static_assert(sizeof(FrameHeader) + 16 == kStampAt);
      std::atomic_ref<uint64_t>(*stamp_word(slot))
          .store(static_cast<uint32_t>(ref.fd), std::memory_order_relaxed);
      tsan_release(r.buf);
      tx_pos_ += kSlot;
      publish(tx_tail_, tx_pos_);
      r.progress = kSlot;
      sends_.pop_front();
      unacked_.push_back(&r);
      place(r, 0, r.bytes);  // while the receiver reads the buffer in place
      moved = true;
      continue;
    }
    if (r.progress == 0) {
      if (free < kSlot) break;
      std::byte* slot = tx_data_ + (tx_pos_ & mask_);
      const bool inline_payload = r.bytes <= kInlineMax;  // the whole frame is this slot
      FrameHeader h = r.header;
      if (inline_payload && r.bytes > 0) h.flags |= kFrameInline;
      const bool small = !inline_payload && r.bytes <= kWholeMax;  // may be written whole
      const uint64_t whole = kSlot + round_up(r.bytes);
      if (small && free < whole) {
        tx_head_seen_ = load_acquire(tx_head_);
        free = ring_bytes_ - (tx_pos_ - tx_head_seen_);
      }
      if (small && free >= whole) {
        // Payload first, then the header's slot and its stamp (release): all published at once.
        write_ring(tx_pos_ + kSlot, r.buf, r.bytes);
        place(r, 0, r.bytes);
        h.flags |= kFrameWhole;
        std::memcpy(slot, &h, sizeof h);
        store_release(stamp_word(slot), stamp_of(tx_pos_, stamp_key_));
        tx_pos_ += whole;
        publish(tx_tail_, tx_pos_);
        r.progress = kSlot + r.bytes;
        r.done = true;
        sends_.pop_front();
        moved = true;
        continue;
      }
      std::memcpy(slot, &h, sizeof h);
      if (inline_payload && r.bytes > 0) std::memcpy(slot + sizeof h, r.buf, r.bytes);
      store_release(stamp_word(slot), stamp_of(tx_pos_, stamp_key_));
      tx_pos_ += kSlot;
      free -= kSlot;
      r.progress = kSlot;
      moved = true;
      if (inline_payload) {
        publish(tx_tail_, tx_pos_);
        r.progress += r.bytes;
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
      if (moved) publish(tx_tail_, tx_pos_);  // publish the header alone
      break;
    }
    write_ring(tx_pos_, static_cast<const std::byte*>(r.buf) + sent, n);
    place(r, sent, n);
    tx_pos_ += (n == left) ? round_up(n) : n;
    r.progress += n;
    publish(tx_tail_, tx_pos_);
    moved = true;
    if (n == left) {
      r.done = true;
      sends_.pop_front();
    }
  }
  return moved;
}

// The producer's tail, or where we are if that is further: a frame taken by its stamp is
// ours before the producer has published the tail past it.
uint64_t ShmPair::tail_seen() const {
  return std::max(rx_pos_, load_acquire(rx_tail_));
}

bool ShmPair::peek(FrameHeader* h) {
  if (rx_tail_seen_ == rx_pos_) {
    rx_tail_seen_ = tail_seen();
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
    if (rx_in_place_) {
      read_in_place(r);
      moved = true;
      if (r.got < r.bytes) break;  // one piece per call: the other pairs progress too
      // The sender gives its buffer back only after revoking (cancel_all); if it has not by
      // now, every byte we read was still its data.
      // (An acq_rel read-modify-write: our reads of the buffer cannot move after it.)
      auto* h = static_cast<SegHeader*>(seg_.data());
      if (std::atomic_ref<uint32_t>(h->revoked[1 - side_]).fetch_or(0, std::memory_order_acq_rel))
        throw PeerError(PeerError::Kind::kClosed,
                        "rank " + std::to_string(world_self_) + ": rank " +
                            std::to_string(world_peer_) +
                            " gave up the operation while its buffer was being read in place",
                        peer_);
      rx_in_place_ = false;
      g_read_in_place.fetch_add(r.bytes, std::memory_order_relaxed);
      tsan_release(reinterpret_cast<const void*>(rx_remote_));
      publish(rx_ack_, ++rx_acks_);
      r.done = true;
      recvs_.pop_front();
      continue;
    }
    if (rx_tail_seen_ == rx_pos_) {
      // At a frame boundary the slot's stamp says first whether a header is there.
      if (!r.header_seen &&
          load_acquire(stamp_word(rx_data_ + (rx_pos_ & mask_))) == stamp_of(rx_pos_, stamp_key_)) {
        rx_tail_seen_ = rx_pos_ + kSlot;  // the tail is at least there
        stamp_misses_ = 0;
      } else {
        // Only an in-place frame (no stamp) needs the tail here, and only a message of the
        // in-place sizes is sent so: below them the tail is read on every 16th miss (in case
        // the sender's settings differ), so that waiting for a small message polls the slot's
        // line alone (a line the sender stores to while we read it costs an invalidation).
        if (!r.header_seen && r.bytes < in_place_floor_ && (++stamp_misses_ & 15) != 0) break;
        rx_tail_seen_ = tail_seen();
        if (rx_tail_seen_ == rx_pos_) break;
      }
    }
    if (!r.header_seen) {
      FrameHeader h;
      const std::byte* slot = rx_data_ + (rx_pos_ & mask_);
      std::memcpy(&h, slot, sizeof h);
      check_header(r, h);
      const bool inline_payload = (h.flags & kFrameInline) != 0;
      const bool in_place = (h.flags & (kFrameSingleCopy | kFrameShared)) != 0;
      if (inline_payload) deliver(r, slot + sizeof h, r.bytes);
      // A whole frame's payload is here already (written before the stamp we saw).
      if (h.flags & kFrameWhole)
        rx_tail_seen_ = std::max(rx_tail_seen_, rx_pos_ + kSlot + round_up(r.bytes));
      shm::SharedRef ref;  // an in-place frame's shared buffer, if it names one
      if (in_place) {
        std::memcpy(&rx_remote_, slot + sizeof h, sizeof rx_remote_);
        std::memcpy(&ref.id, slot + sizeof h + 8, sizeof ref.id);
        ref.fd = static_cast<int32_t>(
            std::atomic_ref<uint64_t>(*stamp_word(slot)).load(std::memory_order_relaxed));
        tsan_acquire(reinterpret_cast<const void*>(rx_remote_));
      }
      // Everything the slot holds is read: from the head's release on, the sender may reuse it.
      rx_pos_ += kSlot;
      r.header_seen = true;
      moved = true;
      if (in_place) {
        publish(rx_head_, rx_pos_);
        // Where we read it: its own address on a thread rank of this process, our mapping
        // of a shared buffer, or (nullptr) through process_vm_readv.
        if (!probed_) probe_peer();  // a frame arrived, so the peer's pid is published
        rx_local_ = nullptr;
        if (peer_pid_ == ::getpid())
          rx_local_ = reinterpret_cast<const std::byte*>(rx_remote_);
        else if (h.flags & kFrameShared)
          rx_local_ = map_shared(ref, r.bytes);
        rx_in_place_ = true;
        continue;
      }
      if (r.bytes == 0 || inline_payload) {  // the frame was this slot
        publish(rx_head_, rx_pos_);
        r.done = true;
        recvs_.pop_front();
        continue;
      }
      if (rx_tail_seen_ == rx_pos_) {
        publish(rx_head_, rx_pos_);
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
    publish(rx_head_, rx_pos_);
    moved = true;
    if (r.got == r.bytes) {
      r.done = true;
      recvs_.pop_front();
    }
  }
  return moved;
}

std::byte* ShmPair::peer_memory(const PeerBuffer& b, size_t bytes, std::string* why) {
  if (b.pid == ::getpid()) return reinterpret_cast<std::byte*>(b.addr);  // a thread rank
  if (b.fd < 0) {
    *why = "the buffer lies in no shared buffer of its process";
    return nullptr;
  }
  return peer_buffers_.translate(b.pid, {b.id, b.fd}, b.addr, bytes, why, true);
}

// Our address of the shared buffer of another process that an in-place frame names.
const std::byte* ShmPair::map_shared(const shm::SharedRef& ref, size_t bytes) {
  std::string why;
  const std::byte* p = peer_buffers_.translate(peer_pid_, ref, rx_remote_, bytes, &why);
  if (!p)
    throw PeerError(PeerError::Kind::kProtocol,
                    "rank " + std::to_string(world_self_) + " cannot read rank " +
                        std::to_string(world_peer_) + "'s shared buffer: " + why +
                        " (set LOOM_SHM_SHARED_MIN=0 to send every message through the ring)",
                    peer_);
  return p;
}

void ShmPair::read_in_place(RecvReq& r) {
  const size_t piece = read_piece_;
  const size_t left = r.bytes - r.got;
  if (rx_local_) {  // in our address space: plain loads
    deliver(r, rx_local_ + r.got, std::min(left, piece));
    return;
  }
  const auto* remote = reinterpret_cast<const std::byte*>(rx_remote_) + r.got;
  const bool reduce = r.a != nullptr;
  size_t n = std::min(left, reduce ? kBouncePiece : piece);
  if (reduce && bounce_.size() < kBouncePiece) bounce_.resize(kBouncePiece);
  auto* dst = reduce ? bounce_.data() : static_cast<std::byte*>(r.dst) + r.got;
  size_t done = 0;
  while (done < n) {
    iovec local{dst + done, n - done};
    iovec from{const_cast<std::byte*>(remote + done), n - done};
    ssize_t got = ::process_vm_readv(peer_pid_, &local, 1, &from, 1, 0);
    if (got <= 0) read_failed(got < 0 ? errno : EFAULT);
    done += static_cast<size_t>(got);
  }
  if (reduce)
    deliver(r, dst, n);
  else
    r.got += n;
}

void ShmPair::read_failed(int err) {
  const std::string who = "rank " + std::to_string(world_self_) + ": reading rank " +
                          std::to_string(world_peer_) + "'s buffer in place (pid " +
                          std::to_string(peer_pid_) + ") failed: " + std::strerror(err);
  if (err == ESRCH || !shm::pid_alive(peer_pid_))
    throw PeerError(PeerError::Kind::kDead,
                    "rank " + std::to_string(world_self_) + ": rank " +
                        std::to_string(world_peer_) + " (pid " + std::to_string(peer_pid_) +
                        ") died while its buffer was being read in place",
                    peer_);
  throw PeerError(PeerError::Kind::kProtocol,
                  who + " (set LOOM_SHM_SINGLE_COPY=0 to send every message through the ring)",
                  peer_);
}

}  // namespace loom::comm
