#include "loom/comm/exec.h"

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "loom/comm/reduce.h"
#include "loom/comm/transport/shm/shared_memory.h"
#include "loom/core/check.h"
#include "loom/core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define LOOM_PAUSE() _mm_pause()
#else
#define LOOM_PAUSE() ((void)0)
#endif

namespace loom::comm {

Exec::Exec(int rank, int size, std::vector<std::unique_ptr<Pair>>& pairs, const Topology& topo,
           const Fingerprint& fp, uint64_t seq, Deadline deadline, WaitPolicy policy,
           std::function<void()> check_abort, std::vector<std::byte>& scratch, ExecQueues& queues)
    : rank_(rank),
      size_(size),
      pairs_(pairs),
      topo_(topo),
      fp_(fp),
      seq_(seq),
      esize_(dtype_size(fp.dtype)),
      deadline_(deadline),
      policy_(policy),
      check_abort_(std::move(check_abort)),
      scratch_(scratch),
      sends_(queues.sends),
      recvs_(queues.recvs),
      copies_(queues.copies),
      streaming_(fp.count * dtype_size(fp.dtype) * (fp.op == OpKind::kAlltoall ? size : 1) >=
                 queues.streaming_min) {}

// Empty for the next operation (every Exec ends here, an operation that threw too);
// clear() keeps a deque's map and first block.
Exec::~Exec() {
  sends_.clear(), recvs_.clear(), copies_.clear();
}

void Exec::set_op(const Fingerprint& fp, uint64_t seq) {
  fp_ = fp;
  seq_ = seq;
  esize_ = dtype_size(fp.dtype);
}

SendReq* Exec::send(int peer, const void* buf, size_t bytes) {
  LOOM_CHECK(peer != rank_ && peer >= 0 && peer < size_);
  SendReq& r = sends_.emplace_back();
  r.buf = buf;
  r.bytes = bytes;
  r.header = FrameHeader::of(fp_, seq_, bytes);
  r.in_place_ok = fp_.op != OpKind::kSendRecv;
  pairs_[peer]->post(&r);
  return &r;
}

SendReq* Exec::send_and_place(int peer, const void* buf, size_t bytes, void* also) {
  SendReq* r = send(peer, buf, bytes);
  r->also = also;  // before the first progress(): post() only queues
  return r;
}

void Exec::place_rest(SendReq* s) {
  LOOM_CHECK(s->done);
  if (s->also && s->also_got < s->bytes)
    copy_bytes(static_cast<std::byte*>(s->also) + s->also_got,
               static_cast<const std::byte*>(s->buf) + s->also_got, s->bytes - s->also_got);
  s->also_got = s->bytes;
}

RecvReq* Exec::recv(int peer, void* dst, size_t bytes, const RecvReq* after) {
  return recv_reduce(peer, dst, nullptr, bytes, after);
}

RecvReq* Exec::recv_reduce(int peer, void* dst, const void* a, size_t bytes, const RecvReq* after) {
  LOOM_CHECK(peer != rank_ && peer >= 0 && peer < size_);
  RecvReq& r = recvs_.emplace_back();
  r.dst = dst;
  r.a = a;
  r.bytes = bytes;
  r.dtype = fp_.dtype;
  r.redop = fp_.redop;
  r.expect = fp_;
  r.seq = seq_;
  r.after = after;
  // A large operation's receives stream past the cache, except small ones, those into the
  // scratch buffer (the algorithm reads it right back) and reductions in place: reading the
  // operand has already brought dst's lines into the cache, and plain stores win there
  // (streaming measured 0.35-0.8x; out of place 1.2-1.4x, docs/perf.md).
  const auto* d = static_cast<const std::byte*>(dst);
  const auto* o = static_cast<const std::byte*>(a);
  const bool in_place = a != nullptr && d < o + bytes && o < d + bytes;
  r.streaming = streams(bytes) && !in_scratch(dst) && !in_place;
  pairs_[peer]->post(&r);
  return &r;
}

void Exec::copy_in_background(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes)
    copies_.push_back(
        {static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes, streams(bytes)});
}

bool Exec::copy_some() {
  if (copies_.empty()) return false;
  constexpr size_t kPiece = 256 << 10;
  ExecQueues::Copy& c = copies_.front();
  size_t n = std::min(kPiece, c.left);
  if (c.streaming)
    copy_streaming(c.dst, c.src, n);
  else
    std::memcpy(c.dst, c.src, n);
  c.dst += n;
  c.src += n;
  c.left -= n;
  if (c.left == 0) copies_.pop_front();
  return true;
}

void Exec::wait(const RecvReq* r) {
  progress_until([r] { return r->done; });
}

void Exec::wait(const SendReq* s) {
  progress_until([s] { return s->done; });
}

void Exec::wait_all() {
  progress_until([this] {
    for (auto& p : pairs_)
      if (p && p->busy()) return false;
    return true;
  });
  while (copy_some()) {
  }
  sends_.clear();
  recvs_.clear();
}

std::byte* Exec::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

std::byte* Exec::peer_memory(int peer, const PeerBuffer& b, size_t bytes) {
  LOOM_CHECK(peer != rank_ && peer >= 0 && peer < size_);
  Pair& p = *pairs_[peer];
  std::string why;
  std::byte* mine = p.peer_memory(b, bytes, &why);
  if (!mine)
    throw PeerError(PeerError::Kind::kProtocol,
                    "rank " + std::to_string(p.world_self()) + " cannot reach rank " +
                        std::to_string(p.world_peer()) + "'s buffer for " + fp_.str() + ": " + why +
                        " (LOOM_SHARED_ALLREDUCE_MIN=0 and LOOM_SHARED_REDUCE_SCATTER_MIN=0 turn "
                        "the shared algorithms off)",
                    peer);
  return mine;
}

PeerBuffer Exec::name_buffer(const void* p, size_t bytes) {
  PeerBuffer b;
  b.addr = reinterpret_cast<uintptr_t>(p);
  b.pid = static_cast<int32_t>(::getpid());
  shm::SharedRef ref;
  if (bytes > 0 && shm::shared_find(p, bytes, &ref)) b.id = ref.id, b.fd = ref.fd;
  return b;
}

std::vector<int> Exec::busy_peers() const {
  std::vector<int> v;
  for (auto& p : pairs_)
    if (p && p->busy()) v.push_back(p->peer());
  return v;
}

void Exec::timed_out() {
  std::string waiting;
  int me = rank_;  // messages name world ranks, which the pairs know
  for (auto& p : pairs_) {
    if (p) me = p->world_self();
    if (p && p->busy()) waiting += (waiting.empty() ? "" : ", ") + std::to_string(p->world_peer());
  }
  throw PeerError(PeerError::Kind::kTimeout,
                  "rank " + std::to_string(me) + " timed out in " + fp_.str() +
                      " at sequence number " + std::to_string(seq_) + " waiting for rank(s) " +
                      waiting +
                      " (the timeout comes from LOOM_TIMEOUT_S or the call's timeout option)");
}

void Exec::progress_until(const std::function<bool()>& done) {
  using namespace std::chrono;
  int idle = 0;
  bool blocked = false;
  Clock::time_point block_start, last_check;
  std::vector<pollfd> fds;
  while (!done()) {
    bool moved = false;
    for (auto& p : pairs_)
      if (p && p->busy()) moved |= p->progress();
    if (moved || copy_some()) {
      idle = 0;
      blocked = false;
      continue;
    }
    // Read the clock only every 32 idle rounds: spinning stays cheap, and bounded in time
    // (a peer descheduled on our core must not cost a long spin per message).
    if ((++idle & 31) != 0 && policy_.spin_us > 0) {
      LOOM_PAUSE();
      continue;
    }
    Clock::time_point now = Clock::now();
    if (!blocked) {
      blocked = true;
      block_start = last_check = now;
    }
    double waited_us = duration<double, std::micro>(now - block_start).count();
    if (waited_us < policy_.spin_us) continue;
    // Waiting on one shared-memory peer (an oversubscribed host): sleep until it writes,
    // leaving the core to the rank that has work, instead of yielding it back and forth.
    Pair* sleeper = nullptr;
    if (waited_us >= policy_.spin_us + policy_.futex_after_us) {
      int busy = 0;
      for (auto& p : pairs_)
        if (p && p->busy()) ++busy, sleeper = p.get();
      if (busy != 1 || !sleeper->can_sleep()) sleeper = nullptr;
    }
    if (sleeper) {
      sleeper->sleep_until_peer(1000);
    } else if (waited_us < policy_.spin_us + policy_.yield_us) {
      sched_yield();
    } else {
      fds.clear();
      bool any_spin_pair = false;
      for (auto& p : pairs_) {
        if (!p || !p->busy()) continue;
        if (p->polled())
          p->poll_fds(fds);
        else
          any_spin_pair = true;
      }
      if (!fds.empty() && !any_spin_pair) {
        ::poll(fds.data(), fds.size(), 5);
      } else {
        // Sleep longer the longer we have waited: 20 us .. 500 us.
        auto nap = std::clamp(waited_us / 50, 20.0, 500.0);
        std::this_thread::sleep_for(duration<double, std::micro>(nap));
      }
    }
    if (now - last_check > milliseconds(100)) {
      last_check = now;
      if (check_abort_) check_abort_();  // a recorded root cause first, then our own view
      for (auto& p : pairs_)
        if (p && p->busy()) p->check_peer();
      if (deadline_.expired()) timed_out();
    }
  }
}

}  // namespace loom::comm
