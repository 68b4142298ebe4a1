// A pair over one TCP connection (non-blocking socket, TCP_NODELAY).
// Sends go out as header + payload in one sendmsg; receives of plain copies land
// straight in the destination, reducing receives go through a small staging buffer
// whose whole elements are reduced as they arrive.
#pragma once

#include <vector>

#include "loom/comm/net/socket.h"
#include "loom/comm/transport/pair.h"

namespace loom::comm {

class TcpPair : public Pair {
 public:
  TcpPair(int self, int peer, net::Fd fd);
  ~TcpPair() override;
  bool progress() override;
  int fd() const override { return fd_.get(); }
  const char* kind() const override { return "tcp"; }

 private:
  bool progress_send();
  bool progress_recv();
  [[noreturn]] void fail(const std::string& what, int err);

  net::Fd fd_;
  FrameHeader rx_header_;
  size_t rx_header_got_ = 0;
  std::vector<std::byte> staging_;
  size_t staged_ = 0;
};

}  // namespace loom::comm
