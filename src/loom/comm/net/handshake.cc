#include "loom/comm/net/handshake.h"

#include <cstring>

#include "loom/comm/net/socket.h"
#include "loom/core/error.h"
#include "loom/core/hmac.h"
#include "loom/core/log.h"

namespace loom::comm::net {
namespace {

constexpr char kMagic[4] = {'L', 'O', 'O', 'M'};
constexpr uint32_t kVersion = 1;

struct ServerHello {
  char magic[4];
  uint32_t version;
  Nonce nonce;
};
struct ClientHello {
  char magic[4];
  uint32_t version;
  Nonce nonce;
  Digest proof;
};
static_assert(sizeof(ServerHello) == 40);
static_assert(sizeof(ClientHello) == 72);

}  // namespace

void client_handshake(int fd, const std::string& token, const std::string& purpose,
                      Deadline deadline) {
  ServerHello sh{};
  recv_all(fd, &sh, sizeof sh, deadline, "server (handshake)");
  if (std::memcmp(sh.magic, kMagic, 4) != 0 || sh.version != kVersion)
    throw PeerError(PeerError::Kind::kProtocol, "handshake: the other side is not a loom " +
                                                    purpose + " endpoint (version " +
                                                    std::to_string(sh.version) + ")");
  ClientHello ch{};
  std::memcpy(ch.magic, kMagic, 4);
  ch.version = kVersion;
  ch.nonce = random_nonce();
  ch.proof = auth_proof(token, purpose, sh.nonce, "client");
  send_all(fd, &ch, sizeof ch, deadline, "server (handshake)");
  Digest server_proof{};
  try {
    recv_all(fd, &server_proof, sizeof server_proof, deadline, "server (handshake)");
  } catch (const PeerError& e) {
    throw PeerError(
        PeerError::Kind::kProtocol,
        "the " + purpose + " server refused this connection: wrong job token? (" + e.what() + ")");
  }
  if (!digest_equal(server_proof, auth_proof(token, purpose, ch.nonce, "server")))
    throw PeerError(PeerError::Kind::kProtocol,
                    "the " + purpose + " server could not prove the job token");
}

bool server_handshake(int fd, const std::string& token, const std::string& purpose,
                      Deadline deadline) {
  std::string who = peer_address(fd).str();
  try {
    ServerHello sh{};
    std::memcpy(sh.magic, kMagic, 4);
    sh.version = kVersion;
    sh.nonce = random_nonce();
    send_all(fd, &sh, sizeof sh, deadline, who);
    ClientHello ch{};
    recv_all(fd, &ch, sizeof ch, deadline, who);
    if (std::memcmp(ch.magic, kMagic, 4) != 0 || ch.version != kVersion) {
      LOOM_LOG(kWarn, "auth") << "refused " << purpose << " connection from " << who
                              << ": not a loom handshake";
      return false;
    }
    if (!digest_equal(ch.proof, auth_proof(token, purpose, sh.nonce, "client"))) {
      LOOM_LOG(kWarn, "auth") << "refused " << purpose << " connection from " << who
                              << ": wrong job token (HMAC mismatch)";
      return false;
    }
    Digest proof = auth_proof(token, purpose, ch.nonce, "server");
    send_all(fd, &proof, sizeof proof, deadline, who);
    return true;
  } catch (const PeerError& e) {
    LOOM_LOG(kWarn, "auth") << "refused " << purpose << " connection from " << who << ": "
                            << e.what();
    return false;
  }
}

}  // namespace loom::comm::net
