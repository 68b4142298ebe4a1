#include "loom/core/hmac.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <vector>

#include "loom/core/error.h"

namespace loom {

Digest hmac_sha256(std::string_view key, const void* data, size_t len) {
  Digest out{};
  unsigned int out_len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            static_cast<const unsigned char*>(data), len, out.data(), &out_len) ||
      out_len != out.size())
    throw InternalError("HMAC-SHA256 failed in OpenSSL");
  return out;
}

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    throw InternalError("RAND_bytes failed: no entropy for a nonce");
  return n;
}

bool digest_equal(const Digest& a, const Digest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string generate_token() {
  Nonce n = random_nonce();
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : n) {
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

Digest auth_proof(std::string_view token, std::string_view purpose, const Nonce& nonce,
                  std::string_view role) {
  // Domain-separate by protocol and by direction so a proof cannot be replayed
  // from one connection kind or side to another.
  std::vector<uint8_t> msg;
  msg.insert(msg.end(), purpose.begin(), purpose.end());
  msg.push_back(0);
  msg.insert(msg.end(), role.begin(), role.end());
  msg.push_back(0);
  msg.insert(msg.end(), nonce.begin(), nonce.end());
  return hmac_sha256(token, msg.data(), msg.size());
}

}  // namespace loom
