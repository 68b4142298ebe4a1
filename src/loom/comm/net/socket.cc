#include "loom/comm/net/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "loom/core/error.h"

namespace loom::comm::net {

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string HostPort::str() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

HostPort parse_host_port(const std::string& text, const std::string& what) {
  std::string s = text;
  if (s.rfind("tcp://", 0) == 0) s = s.substr(6);
  auto bad = [&]() {
    return UserError(what + ": '" + text + "' is not host:port",
                     "write it as tcp://HOST:PORT, e.g. tcp://127.0.0.1:29500");
  };
  HostPort hp;
  size_t colon;
  if (!s.empty() && s[0] == '[') {
    auto close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') throw bad();
    hp.host = s.substr(1, close - 1);
    colon = close + 1;
  } else {
    colon = s.rfind(':');
    if (colon == std::string::npos || colon == 0) throw bad();
    hp.host = s.substr(0, colon);
  }
  std::string port = s.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    throw bad();
  unsigned long p = std::stoul(port);
  if (p > 65535) throw bad();
  hp.port = static_cast<uint16_t>(p);
  return hp;
}

namespace {

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

// getaddrinfo's code for hp (stream sockets, any family).
int lookup(const HostPort& hp, bool passive, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  std::string port = std::to_string(hp.port);
  return getaddrinfo(hp.host.c_str(), port.c_str(), &hints, &out.list);
}

void resolve(const HostPort& hp, bool passive, AddrInfo& out) {
  const int rc = lookup(hp, passive, out);
  if (rc != 0)
    throw UserError("cannot resolve '" + hp.host + "': " + gai_strerror(rc),
                    "check the host name or use a numeric address");
}

HostPort to_host_port(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  HostPort hp;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    hp.port = ntohs(a->sin_port);
  } else {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    hp.port = ntohs(a->sin6_port);
  }
  hp.host = buf;
  return hp;
}

}  // namespace

bool resolves(const std::string& host) {
  AddrInfo ai;
  return lookup({host, 0}, false, ai) == 0;
}

Fd listen_on(const std::string& host, uint16_t port, int backlog) {
  AddrInfo ai;
  resolve({host, port}, true, ai);
  int last_err = 0;
  for (addrinfo* p = ai.list; p; p = p->ai_next) {
    Fd fd(::socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol));
    if (!fd.valid()) continue;
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), p->ai_addr, p->ai_addrlen) == 0 && ::listen(fd.get(), backlog) == 0)
      return fd;
    last_err = errno;
  }
  throw UserError("cannot listen on " + HostPort{host, port}.str() + ": " + errno_text(last_err),
                  last_err == EADDRINUSE ? "another job uses this port; pick another one"
                                         : "check that the address belongs to this machine");
}

HostPort local_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return to_host_port(ss);
}

HostPort peer_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return to_host_port(ss);
}

Fd connect_to(const HostPort& addr, Deadline deadline, const std::string& who) {
  int backoff_ms = 1;
  std::string last;
  while (true) {
    AddrInfo ai;
    resolve(addr, false, ai);
    for (addrinfo* p = ai.list; p; p = p->ai_next) {
      Fd fd(::socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol));
      if (!fd.valid()) continue;
      if (::connect(fd.get(), p->ai_addr, p->ai_addrlen) == 0) {
        set_nodelay(fd.get());
        return fd;
      }
      last = errno_text(errno);
    }
    if (deadline.expired())
      throw PeerError(PeerError::Kind::kTimeout, "could not connect to " + who + " at " +
                                                     addr.str() + " before the deadline (" + last +
                                                     ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min(backoff_ms * 2, 100);
  }
}

Fd accept_one(int listen_fd, Deadline deadline) {
  while (true) {
    pollfd pfd{listen_fd, POLLIN, 0};
    int rc = ::poll(&pfd, 1, deadline.remaining_ms(100));
    if (rc > 0) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        set_nodelay(fd);
        return Fd(fd);
      }
    }
    if (deadline.expired()) return Fd();
  }
}

void set_nonblocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void set_buffer_sizes(int fd, int bytes) {
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

void send_all(int fd, const void* buf, size_t n, Deadline deadline, const std::string& who) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      throw PeerError(PeerError::Kind::kClosed, "send to " + who + " failed: " + errno_text(errno));
    pollfd pfd{fd, POLLOUT, 0};
    if (::poll(&pfd, 1, deadline.remaining_ms(100)) == 0 && deadline.expired())
      throw PeerError(PeerError::Kind::kTimeout, "send to " + who + " timed out");
  }
}

void recv_all(int fd, void* buf, size_t n, Deadline deadline, const std::string& who) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) throw PeerError(PeerError::Kind::kClosed, who + " closed the connection");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      throw PeerError(PeerError::Kind::kClosed,
                      "receive from " + who + " failed: " + errno_text(errno));
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, deadline.remaining_ms(100)) == 0 && deadline.expired())
      throw PeerError(PeerError::Kind::kTimeout, "receive from " + who + " timed out");
  }
}

}  // namespace loom::comm::net
