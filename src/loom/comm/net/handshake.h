// The challenge-response every loom connection runs before any data flows.
//
//   server -> client   "LOOM" version purpose-tag nonce_s            (40 bytes)
//   client -> server   "LOOM" version nonce_c HMAC(token, nonce_s)   (72 bytes)
//   server -> client   HMAC(token, nonce_c)                          (32 bytes)
//
// Both sides prove knowledge of the job token; proofs are domain-separated by purpose
// ("store", "pair") and direction, so one cannot be replayed as another. A server that
// receives a wrong proof or garbage closes the connection and logs it; the job goes on.
#pragma once

#include <string>

#include "loom/core/deadline.h"

namespace loom::comm::net {

// Throws PeerError(kProtocol) if the server cannot prove the token.
void client_handshake(int fd, const std::string& token, const std::string& purpose,
                      Deadline deadline);

// Returns false (after logging why) for a peer that fails to authenticate.
bool server_handshake(int fd, const std::string& token, const std::string& purpose,
                      Deadline deadline);

}  // namespace loom::comm::net
