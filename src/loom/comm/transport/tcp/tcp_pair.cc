#include "loom/comm/transport/tcp/tcp_pair.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "loom/core/error.h"
#include "loom/core/tunable.h"

namespace loom::comm {
namespace {
const BytesTunable kTcpStaging(
    "LOOM_TCP_STAGING", 256 << 10,
    "bytes of the per-stream staging buffer for reducing receives over TCP");
const BytesTunable kTcpSockBuf(
    "LOOM_TCP_SOCKBUF", 4 << 20,
    "SO_SNDBUF/SO_RCVBUF for transport sockets, bytes (0 = kernel default)");
const IntTunable kTcpStreams("LOOM_TCP_STREAMS", 2, "TCP connections per pair of ranks (1..8)");
const BytesTunable kTcpStripe("LOOM_TCP_STRIPE", 512 << 10,
                              "bytes of payload per stripe when a pair has several TCP streams");
// Off by default: on 2 cores, 2 ranks' allgather gained nothing with it (docs/perf.md).
const BytesTunable kTcpSendThread(
    "LOOM_TCP_SEND_THREAD", 0,
    "payload bytes from which a pair's send thread writes a message while the engine "
    "receives (0 = never)");

constexpr size_t kHdr = sizeof(FrameHeader);

std::atomic<uint64_t> g_thread_bytes{0};  // payload bytes written by send threads

bool would_block() {
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

net::Fd make_eventfd() {
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) throw Error("eventfd failed: " + errno_text(errno));
  return net::Fd(fd);
}

void signal_fd(const net::Fd& fd) {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(fd.get(), &one, sizeof one);
}

void drain_fd(const net::Fd& fd) {
  uint64_t v;
  [[maybe_unused]] ssize_t r = ::read(fd.get(), &v, sizeof v);
}
}  // namespace

// The send thread. The engine sets `busy` and hands it a message (`job`, under `m`); the
// thread takes it, writes it, stores `busy = false` (release) and signals `done_fd`, which
// the engine polls. A failure is kept in `error` for the engine to rethrow. `cancel` (with
// `wake_fd`) makes the thread give a message up; stop_io() waits until it has.
struct TcpPair::Sender {
  std::thread thread;
  std::mutex m;
  std::condition_variable cv;
  SendReq* job = nullptr;     // guarded by m
  bool stop = false;          // guarded by m
  SendReq* handed = nullptr;  // the engine's own note of the message the thread has
  std::atomic<bool> busy{false};
  std::atomic<bool> cancel{false};
  std::exception_ptr error;  // written by the thread before busy = false
  net::Fd done_fd = make_eventfd();
  net::Fd wake_fd = make_eventfd();
};

uint64_t TcpPair::bytes_sent_by_thread() {
  return g_thread_bytes.load(std::memory_order_relaxed);
}

int TcpPair::default_streams() {
  auto k = kTcpStreams.get();
  if (k < 1 || k > 8)
    throw UserError("LOOM_TCP_STREAMS=" + std::to_string(k) + " is out of range",
                    "use 1 to 8 connections per pair");
  return static_cast<int>(k);
}

TcpPair::TcpPair(int self, int peer, std::vector<net::Fd> fds) : Pair(self, peer) {
  const int64_t thread_min = kTcpSendThread.get();
  if (thread_min < 0)
    throw UserError("LOOM_TCP_SEND_THREAD=" + std::to_string(thread_min) + " is negative",
                    "give the payload bytes from which a send thread writes, or 0 for never");
  thread_min_ = static_cast<size_t>(thread_min);
  stripe_ = std::max<size_t>(4096, static_cast<size_t>(kTcpStripe.get()) & ~size_t{63});
  size_t staging = std::max<size_t>(4096, static_cast<size_t>(kTcpStaging.get()) & ~size_t{63});
  int sockbuf = static_cast<int>(kTcpSockBuf.get());
  for (auto& fd : fds) {
    net::set_nonblocking(fd.get(), true);
    net::set_nodelay(fd.get());
    if (sockbuf > 0) net::set_buffer_sizes(fd.get(), sockbuf);
    Stream& st = streams_.emplace_back();
    st.fd = std::move(fd);
    st.staging.resize(staging);
  }
}

TcpPair::~TcpPair() {
  if (sender_ && sender_->thread.joinable()) {
    {
      std::lock_guard<std::mutex> lk(sender_->m);
      sender_->stop = true;
    }
    sender_->cancel = true;
    signal_fd(sender_->wake_fd);
    sender_->cv.notify_one();
    sender_->thread.join();
  }
  for (auto& st : streams_)
    if (st.fd.valid()) ::shutdown(st.fd.get(), SHUT_WR);
}

void TcpPair::poll_fds(std::vector<pollfd>& out) const {
  const bool handed = sender_ && sender_->busy.load(std::memory_order_acquire);
  short events = static_cast<short>(POLLIN | (sending() && !handed ? POLLOUT : 0));
  for (const auto& st : streams_) out.push_back({st.fd.get(), events, 0});
  if (sender_) out.push_back({sender_->done_fd.get(), POLLIN, 0});
}

void TcpPair::fail(const std::string& what, int err) {
  throw PeerError(PeerError::Kind::kClosed,
                  "rank " + std::to_string(world_self_) + ": the TCP connection to rank " +
                      std::to_string(world_peer_) + " " + what +
                      (err ? " (" + errno_text(err) + ")" : std::string()) + "; did rank " +
                      std::to_string(world_peer_) + " exit?",
                  peer_);
}

size_t TcpPair::share(size_t bytes, int s) const {
  const size_t k = streams_.size();
  size_t full = bytes / stripe_, tail = bytes % stripe_;
  size_t n = full / k + (static_cast<size_t>(s) < full % k ? 1 : 0);
  size_t out = n * stripe_;
  if (tail && full % k == static_cast<size_t>(s)) out += tail;
  return out;
}

size_t TcpPair::outgoing(size_t bytes, int s) const {
  return (s == 0 ? kHdr : 0) + share(bytes, s);
}

size_t TcpPair::payload_offset(size_t o, int s, size_t bytes, size_t* run) const {
  const size_t k = streams_.size();
  size_t q = o / stripe_, within = o % stripe_;
  size_t start = (q * k + static_cast<size_t>(s)) * stripe_;
  size_t seg_len = std::min(stripe_, bytes - start);
  *run = seg_len - within;
  return start + within;
}

bool TcpPair::progress() {
  bool moved = false;
  if (!sends_.empty()) moved |= progress_send();
  if (!recvs_.empty()) moved |= progress_recv();
  return moved;
}

bool TcpPair::send_some(SendReq& r, bool* moved) {
  bool all_done = true;
  for (int s = 0; s < static_cast<int>(streams_.size()); ++s) {
    Stream& st = streams_[s];
    const size_t head = s == 0 ? kHdr : 0;
    const size_t total = outgoing(r.bytes, s);
    while (st.tx < total) {
      iovec iov[2];
      int n = 0;
      if (st.tx < head) iov[n++] = {reinterpret_cast<char*>(&r.header) + st.tx, head - st.tx};
      size_t o = st.tx < head ? 0 : st.tx - head;
      if (o < total - head) {
        size_t run;
        size_t at = payload_offset(o, s, r.bytes, &run);
        iov[n++] = {static_cast<char*>(const_cast<void*>(r.buf)) + at, run};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      ssize_t w = ::sendmsg(st.fd.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w < 0) {
        if (would_block()) break;
        fail("failed while sending", errno);
      }
      *moved = true;
      st.tx += static_cast<size_t>(w);
    }
    if (st.tx < total) all_done = false;
  }
  if (all_done)
    for (auto& st : streams_) st.tx = 0;
  return all_done;
}

bool TcpPair::progress_send() {
  bool moved = false;
  while (!sends_.empty()) {
    SendReq& r = *sends_.front();
    if (sender_ && sender_->busy.load(std::memory_order_acquire)) break;  // r is the thread's
    if (sender_ && sender_->handed == &r) {  // the thread has written r (or failed)
      drain_fd(sender_->done_fd);
      sender_->handed = nullptr;
      if (sender_->error) std::rethrow_exception(std::exchange(sender_->error, nullptr));
    } else if (thread_min_ > 0 && r.bytes >= thread_min_) {
      hand_over(r);
      break;
    } else if (!send_some(r, &moved)) {
      break;
    }
    moved = true;
    r.done = true;
    sends_.pop_front();
  }
  return moved;
}

void TcpPair::hand_over(SendReq& r) {
  if (!sender_) {
    sender_ = std::make_unique<Sender>();
    sender_->thread = std::thread([this] { send_loop(); });
  }
  Sender& t = *sender_;
  t.busy.store(true, std::memory_order_relaxed);
  t.handed = &r;
  {
    std::lock_guard<std::mutex> lk(t.m);
    t.job = &r;
  }
  t.cv.notify_one();
}

void TcpPair::send_loop() {
  Sender& t = *sender_;
  std::vector<pollfd> fds;
  for (;;) {
    SendReq* r;
    {
      std::unique_lock<std::mutex> lk(t.m);
      t.cv.wait(lk, [&] { return t.stop || t.job; });
      if (t.stop) return;
      r = std::exchange(t.job, nullptr);
    }
    try {
      bool moved = false;
      bool all = false;
      while (!t.cancel.load(std::memory_order_relaxed) && !(all = send_some(*r, &moved))) {
        fds.clear();  // the streams with bytes left (a finished one is always writable)
        for (int s = 0; s < static_cast<int>(streams_.size()); ++s)
          if (streams_[s].tx < outgoing(r->bytes, s))
            fds.push_back({streams_[s].fd.get(), POLLOUT, 0});
        fds.push_back({t.wake_fd.get(), POLLIN, 0});
        ::poll(fds.data(), fds.size(), 100);
        if (fds.back().revents & POLLIN) drain_fd(t.wake_fd);
      }
      if (all) g_thread_bytes.fetch_add(r->bytes, std::memory_order_relaxed);
    } catch (...) {
      t.error = std::current_exception();
    }
    t.busy.store(false, std::memory_order_release);
    signal_fd(t.done_fd);
  }
}

void TcpPair::stop_io() {
  if (!sender_ || !sender_->busy.load(std::memory_order_acquire)) return;
  sender_->cancel = true;
  signal_fd(sender_->wake_fd);
  while (sender_->busy.load(std::memory_order_acquire)) std::this_thread::yield();
  sender_->cancel = false;
  drain_fd(sender_->done_fd);
  sender_->handed = nullptr;
  sender_->error = nullptr;
}

bool TcpPair::peek(FrameHeader* h) {
  ssize_t n =
      ::recv(streams_[0].fd.get(), reinterpret_cast<char*>(h), kHdr, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) fail("was closed", 0);
  if (n < 0) {
    if (would_block()) return false;
    fail("failed while receiving", errno);
  }
  return static_cast<size_t>(n) == kHdr;
}

bool TcpPair::progress_recv() {
  bool moved = false;
  while (!recvs_.empty()) {
    RecvReq& r = *recvs_.front();
    if (r.after && !r.after->done) break;
    if (!r.header_seen) {
      ssize_t n =
          ::recv(streams_[0].fd.get(), reinterpret_cast<char*>(&rx_header_) + rx_header_got_,
                 kHdr - rx_header_got_, MSG_DONTWAIT);
      if (n == 0) fail("was closed", 0);
      if (n < 0) {
        if (would_block()) break;
        fail("failed while receiving", errno);
      }
      moved = true;
      rx_header_got_ += static_cast<size_t>(n);
      if (rx_header_got_ < kHdr) continue;
      rx_header_got_ = 0;
      check_header(r, rx_header_);
      r.header_seen = true;
    }
    const size_t es = dtype_size(r.dtype);
    for (int s = 0; s < static_cast<int>(streams_.size()); ++s) {
      Stream& st = streams_[s];
      const size_t total = share(r.bytes, s);
      while (st.rx < total) {
        size_t run;
        size_t at = payload_offset(st.rx, s, r.bytes, &run);
        ssize_t n;
        if (r.a == nullptr) {
          n = ::recv(st.fd.get(), static_cast<char*>(r.dst) + at, run, MSG_DONTWAIT);
        } else {
          // Stage at most the rest of this stripe, so staged bytes never span two stripes.
          size_t want = std::min(st.staging.size() - st.staged, run - st.staged);
          n = ::recv(st.fd.get(), st.staging.data() + st.staged, want, MSG_DONTWAIT);
        }
        if (n == 0) fail("was closed", 0);
        if (n < 0) {
          if (would_block()) break;
          fail("failed while receiving", errno);
        }
        moved = true;
        if (r.a == nullptr) {
          st.rx += static_cast<size_t>(n);
          r.got += static_cast<size_t>(n);
          continue;
        }
        st.staged += static_cast<size_t>(n);
        size_t whole = st.staged / es * es;
        if (whole) {
          deliver_at(r, at, st.staging.data(), whole);
          std::memmove(st.staging.data(), st.staging.data() + whole, st.staged - whole);
          st.staged -= whole;
          st.rx += whole;
        }
      }
    }
    if (r.got < r.bytes) break;
    for (auto& st : streams_) st.rx = 0;
    r.done = true;
    recvs_.pop_front();
  }
  return moved;
}

}  // namespace loom::comm
