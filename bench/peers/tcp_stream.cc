// The physical reference for loom's TCP transport: one process streams 1 MiB writes to
// another over loopback for a few seconds; prints {"peer":"socket","gbps":...}. With
// BIDIR=1 both directions stream at once (what a ring allgather does to each link).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

static double stream(int fd, bool send_side, double seconds) {
  std::vector<char> buf(1 << 20, 7);
  size_t total = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    ssize_t k =
        send_side ? send(fd, buf.data(), buf.size(), 0) : recv(fd, buf.data(), buf.size(), 0);
    if (k <= 0) break;
    total += static_cast<size_t>(k);
  }
  if (send_side) shutdown(fd, SHUT_WR);  // the reader sees EOF and stops
  return total / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
}

int main() {
  bool bidir = std::getenv("BIDIR") && std::atoi(std::getenv("BIDIR"));
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
    if (bidir) t = std::thread([&] { stream(fd, false, 3.2); });
    stream(fd, true, 3.0);
    if (t.joinable()) t.join();
    _exit(0);
  }
  int fd = accept(ls, nullptr, nullptr);
  double back = 0;
  std::thread t;
  if (bidir) t = std::thread([&] { back = stream(fd, true, 3.0); });
  double gbps = stream(fd, false, 3.2);
  if (t.joinable()) t.join();
  waitpid(child, nullptr, 0);
  std::printf("{\"peer\":\"socket\",\"bidir\":%s,\"gbps\":%.3f}\n", bidir ? "true" : "false", gbps);
  return 0;
}
