#include "loom/comm/transport/tcp/tcp_pair.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "loom/core/error.h"
#include "loom/core/tunable.h"

namespace loom::comm {
namespace {
const IntTunable kTcpStaging("LOOM_TCP_STAGING", 256 << 10,
                             "bytes of the per-pair staging buffer for reducing receives over TCP");
const IntTunable kTcpSockBuf("LOOM_TCP_SOCKBUF", 4 << 20,
                             "SO_SNDBUF/SO_RCVBUF for transport sockets, bytes (0 = kernel default)");
}  // namespace

TcpPair::TcpPair(int self, int peer, net::Fd fd) : Pair(self, peer), fd_(std::move(fd)) {
  net::set_nonblocking(fd_.get(), true);
  net::set_nodelay(fd_.get());
  if (int b = static_cast<int>(kTcpSockBuf.get()); b > 0) net::set_buffer_sizes(fd_.get(), b);
  staging_.resize(static_cast<size_t>(kTcpStaging.get()));
}

TcpPair::~TcpPair() {
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_WR);
}

void TcpPair::fail(const std::string& what, int err) {
  throw PeerError(PeerError::Kind::kClosed,
                  "rank " + std::to_string(self_) + ": the TCP connection to rank " +
                      std::to_string(peer_) + " " + what +
                      (err ? " (" + errno_text(err) + ")" : std::string()) +
                      "; did rank " + std::to_string(peer_) + " exit?",
                  peer_);
}

bool TcpPair::progress() {
  bool moved = false;
  if (!sends_.empty()) moved |= progress_send();
  if (!recvs_.empty()) moved |= progress_recv();
  return moved;
}

bool TcpPair::progress_send() {
  bool moved = false;
  constexpr size_t kHdr = sizeof(FrameHeader);
  while (!sends_.empty()) {
    SendReq& r = *sends_.front();
    iovec iov[2];
    int n = 0;
    if (r.progress < kHdr) {
      iov[n++] = {reinterpret_cast<char*>(&r.header) + r.progress, kHdr - r.progress};
      if (r.bytes) iov[n++] = {const_cast<void*>(r.buf), r.bytes};
    } else {
      size_t off = r.progress - kHdr;
      iov[n++] = {static_cast<char*>(const_cast<void*>(r.buf)) + off, r.bytes - off};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t w = ::sendmsg(fd_.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
      fail("failed while sending", errno);
    }
    moved = true;
    r.progress += static_cast<size_t>(w);
    if (r.progress == kHdr + r.bytes) {
      r.done = true;
      sends_.pop_front();
    }
  }
  return moved;
}

bool TcpPair::progress_recv() {
  bool moved = false;
  constexpr size_t kHdr = sizeof(FrameHeader);
  while (!recvs_.empty()) {
    RecvReq& r = *recvs_.front();
    if (r.after && !r.after->done) break;
    if (!r.header_seen) {
      ssize_t n = ::recv(fd_.get(), reinterpret_cast<char*>(&rx_header_) + rx_header_got_,
                         kHdr - rx_header_got_, MSG_DONTWAIT);
      if (n == 0) fail("was closed", 0);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        fail("failed while receiving", errno);
      }
      moved = true;
      rx_header_got_ += static_cast<size_t>(n);
      if (rx_header_got_ < kHdr) continue;
      rx_header_got_ = 0;
      check_header(r, rx_header_);
      r.header_seen = true;
    }
    if (r.got < r.bytes) {
      ssize_t n;
      if (r.a == nullptr) {
        n = ::recv(fd_.get(), static_cast<char*>(r.dst) + r.got, r.bytes - r.got, MSG_DONTWAIT);
      } else {
        size_t want = std::min(staging_.size() - staged_, r.bytes - r.got - staged_);
        n = ::recv(fd_.get(), staging_.data() + staged_, want, MSG_DONTWAIT);
      }
      if (n == 0) fail("was closed", 0);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        fail("failed while receiving", errno);
      }
      moved = true;
      if (r.a == nullptr) {
        r.got += static_cast<size_t>(n);
      } else {
        staged_ += static_cast<size_t>(n);
        size_t es = dtype_size(r.dtype);
        size_t whole = staged_ / es * es;
        if (whole) {
          deliver(r, staging_.data(), whole);
          std::memmove(staging_.data(), staging_.data() + whole, staged_ - whole);
          staged_ -= whole;
        }
      }
    }
    if (r.got == r.bytes) {
      r.done = true;
      recvs_.pop_front();
    }
  }
  return moved;
}

}  // namespace loom::comm
