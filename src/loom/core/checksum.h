// The checksum of loom's files (token shards, later checkpoints): 64-bit FNV-1a over
// little-endian 8-byte words, then the remaining bytes one at a time. Not cryptographic;
// it detects truncation and corruption. Streaming: feed pieces in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace loom {

class Checksum64 {
 public:
  void update(const void* data, size_t n);
  uint64_t value() const;

 private:
  uint64_t h_ = 1469598103934665603ull;
  uint8_t pending_[8] = {};
  size_t npending_ = 0;
};

uint64_t checksum64(const void* data, size_t n);

// 64-bit FNV-1a of a string, byte by byte (names, job ids: short keys, not file contents).
uint64_t fnv1a64(std::string_view s);

}  // namespace loom
