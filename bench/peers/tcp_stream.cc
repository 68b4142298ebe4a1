// The physical reference for loom's TCP transport: one process streams 1 MiB writes to
// another over loopback for a few seconds; prints {"peer":"socket","gbps":...}. With
// BIDIR=1 both directions stream at once (what a ring allgather does to each link). With
// SPAN=BYTES each direction's writes and reads walk a buffer of that many bytes (1 MiB at a
// time) instead of reusing one 1 MiB buffer, so a span larger than the caches streams from
// and into memory as a collective's message of that size does.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

static double stream(int fd, bool send_side, double seconds, size_t span) {
  constexpr size_t kCall = 1 << 20;
  std::vector<char> buf(span < kCall ? kCall : span, 7);
  size_t total = 0, at = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    ssize_t k =
        send_side ? send(fd, buf.data() + at, kCall, 0) : recv(fd, buf.data() + at, kCall, 0);
    if (k <= 0) break;
    total += static_cast<size_t>(k);
    at += static_cast<size_t>(k);
    if (at + kCall > buf.size()) at = 0;
  }
  if (send_side) shutdown(fd, SHUT_WR);  // the reader sees EOF and stops
  return total / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
}

int main() {
  bool bidir = std::getenv("BIDIR") && std::atoi(std::getenv("BIDIR"));
  const size_t span = std::getenv("SPAN") ? std::strtoull(std::getenv("SPAN"), nullptr, 10) : 0;
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len);
  listen(ls, 1);
  pid_t child = fork();
  if (child == 0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    std::thread t;
    if (bidir) t = std::thread([&] { stream(fd, false, 3.2, span); });
    stream(fd, true, 3.0, span);
    if (t.joinable()) t.join();
    _exit(0);
  }
  int fd = accept(ls, nullptr, nullptr);
  double back = 0;
  std::thread t;
  if (bidir) t = std::thread([&] { back = stream(fd, true, 3.0, span); });
  double gbps = stream(fd, false, 3.2, span);
  if (t.joinable()) t.join();
  waitpid(child, nullptr, 0);
  std::printf("{\"peer\":\"socket\",\"bidir\":%s,\"span\":%llu,\"gbps\":%.3f}\n",
              bidir ? "true" : "false", static_cast<unsigned long long>(span), gbps);
  return 0;
}
