// libFuzzer target for the connection handshake (net/handshake.h), both sides, over a
// socketpair: the first byte picks the side, the rest is what the other side sends before
// closing. A server must refuse every input (no input can prove the job token without it)
// by returning false; a client must throw PeerError. Nothing else may happen: no other
// exception, no wait past the deadline, no read beyond what arrived.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include "fuzz_support.h"
#include "loom/comm/net/handshake.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("LOOM_LOG", "off", 1);  // every refusal is logged otherwise
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom::comm::net;
  if (size == 0 || size > 4096) return 0;  // the socketpair's buffer holds the whole input
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) abort();
  if (::write(sv[1], data + 1, size - 1) != static_cast<ssize_t>(size - 1)) abort();
  ::shutdown(sv[1], SHUT_WR);
  const loom::Deadline deadline = loom::Deadline::after_seconds(5);
  if (data[0] & 1) {
    if (server_handshake(sv[0], "job-token", "pair", deadline)) __builtin_trap();
  } else {
    bool refused = false;
    try {
      client_handshake(sv[0], "job-token", "store", deadline);
    } catch (const loom::PeerError&) {
      refused = true;
    }
    if (!refused) __builtin_trap();
  }
  ::close(sv[0]);
  ::close(sv[1]);
  return 0;
}
