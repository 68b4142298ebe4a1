// A pair over K TCP connections (LOOM_TCP_STREAMS; non-blocking, TCP_NODELAY).
//
// A message's header travels on stream 0; its payload is cut into stripes of
// LOOM_TCP_STRIPE bytes and stripe j travels on stream j mod K, so a message smaller than
// one stripe uses stream 0 alone. Each stream carries its stripes in order, and both sides
// work on one message at a time, so the layout needs no per-stripe headers. Receives of
// plain copies land straight in the destination; reducing receives go through a small
// staging buffer per stream whose whole elements are reduced as they arrive. Other streams
// are read only after stream 0's header has been checked, so a desynchronised sender
// cannot write into the buffer.
//
// With LOOM_TCP_SEND_THREAD=N (bytes; 0, the default, for never), payloads of at least N
// bytes are written by a send thread of the pair while the engine thread goes on receiving
// (and reducing), so both directions of a link move at once, as two threads streaming over
// a socket do. The engine hands the thread one message at a time and takes it back when the
// thread says it is written; only the engine touches the request queues. Off by default:
// on 2 cores it gained nothing over the one engine thread (docs/perf.md); it is for hosts
// with a spare core per rank, where it is not measured yet.
#pragma once

#include <memory>
#include <vector>

#include "loom/comm/net/socket.h"
#include "loom/comm/transport/pair.h"

namespace loom::comm {

class TcpPair : public Pair {
 public:
  TcpPair(int self, int peer, std::vector<net::Fd> fds);
  ~TcpPair() override;
  bool progress() override;
  void poll_fds(std::vector<pollfd>& out) const override;
  bool polled() const override { return true; }
  const char* kind() const override { return "tcp"; }
  bool peek(FrameHeader* h) override;

  static int default_streams();
  // Payload bytes the send threads of this process have written (for tests).
  static uint64_t bytes_sent_by_thread();

 private:
  struct Stream {
    net::Fd fd;
    size_t tx = 0;  // bytes of the current outgoing message's share sent on this stream
    size_t rx = 0;  // bytes of the current incoming message's share received
    std::vector<std::byte> staging;
    size_t staged = 0;
  };
  // Stream s's share of a `bytes`-byte payload, and where its byte `o` lies in the payload
  // (plus how many bytes from there stay on this stream contiguously).
  size_t share(size_t bytes, int s) const;
  // Bytes stream s carries for a message of that payload: its share, and the header on 0.
  size_t outgoing(size_t bytes, int s) const;
  size_t payload_offset(size_t o, int s, size_t bytes, size_t* run) const;
  bool progress_send();
  bool progress_recv();
  // Writes what the sockets take of r's header and stripes; returns whether all is written
  // (then the streams' counters are reset for the next message).
  bool send_some(SendReq& r, bool* moved);
  void hand_over(SendReq& r);  // to the send thread (started on first use)
  void send_loop();            // the send thread's body
  void stop_io() override;
  [[noreturn]] void fail(const std::string& what, int err);

  struct Sender;  // the send thread and its hand-over state
  std::unique_ptr<Sender> sender_;
  size_t thread_min_;  // payload bytes from which the send thread writes (0: never)

  std::vector<Stream> streams_;
  size_t stripe_;
  FrameHeader rx_header_;
  size_t rx_header_got_ = 0;
};

}  // namespace loom::comm
