// Thin RAII wrappers over TCP sockets. Every blocking helper takes a Deadline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "loom/core/deadline.h"

namespace loom::comm::net {

// Owns a file descriptor; closes it once.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string str() const;
};

// Parses "tcp://host:port", "host:port" or "[v6]:port". Throws UserError naming `what`.
HostPort parse_host_port(const std::string& text, const std::string& what);

// Whether `host` resolves to an address here (a name in DNS or /etc/hosts, or a numeric
// address), as listen_on and connect_to resolve it.
bool resolves(const std::string& host);

// Listens on exactly `host` (never the wildcard unless asked for by "0.0.0.0"/"::").
// Port 0 picks a free port; read it back with local_address().
Fd listen_on(const std::string& host, uint16_t port, int backlog = 128);
HostPort local_address(int fd);
HostPort peer_address(int fd);

// Connects, retrying refused/unreachable attempts until the deadline (the peer may not be
// listening yet). Throws PeerError(kTimeout) naming `who` when the deadline passes.
Fd connect_to(const HostPort& addr, Deadline deadline, const std::string& who);

// Waits for one incoming connection; returns an invalid Fd when the deadline passes.
Fd accept_one(int listen_fd, Deadline deadline);

void set_nonblocking(int fd, bool on);
void set_nodelay(int fd);
void set_buffer_sizes(int fd, int bytes);

// Blocking full-buffer I/O over a (possibly non-blocking) socket, bounded by the deadline.
// Throw PeerError(kClosed) on EOF/reset and PeerError(kTimeout) at the deadline.
void send_all(int fd, const void* buf, size_t n, Deadline deadline, const std::string& who);
void recv_all(int fd, void* buf, size_t n, Deadline deadline, const std::string& who);

}  // namespace loom::comm::net
