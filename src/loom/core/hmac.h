// HMAC-SHA256 (OpenSSL) and the challenge-response used by every loom connection:
// store clients and transport pairs prove knowledge of the job token before any data.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

using Digest = std::array<uint8_t, 32>;
using Nonce = std::array<uint8_t, 32>;

Digest hmac_sha256(std::string_view key, const void* data, size_t len);
Nonce random_nonce();
// Constant-time comparison.
bool digest_equal(const Digest& a, const Digest& b);
// A fresh random job token (hex, 64 chars).
std::string generate_token();
// The proof that answers `nonce` for a connection of kind `purpose` ("store", "pair").
Digest auth_proof(std::string_view token, std::string_view purpose, const Nonce& nonce,
                  std::string_view role);

}  // namespace loom
