// Token shards: a 64-byte header followed by uint16 token ids (docs/formats.md).
//
//   0  "LOOMTOK1"        8 bytes
//   8  u32 version = 1   12 u32 vocab_size    16 u64 token_count   24 u64 checksum64(tokens)
//  32  u32 split (0 train, 1 val)   36 u32 shard index   40..63 zero
//
// Readers memory-map a shard and check magic, version, vocabulary, size and checksum,
// naming the file when any is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

struct ShardHeader {
  char magic[8];
  uint32_t version;
  uint32_t vocab_size;
  uint64_t token_count;
  uint64_t checksum;
  uint32_t split;
  uint32_t index;
  uint8_t reserved[24];
};
static_assert(sizeof(ShardHeader) == 64);

constexpr uint32_t kShardVersion = 1;

// Writes one shard: header, then the tokens; the header's count and checksum are filled in
// by finish(). Not atomic by itself: prep writes into a temporary folder and renames it.
void write_shard(const std::string& path, const std::vector<uint16_t>& tokens, uint32_t split,
                 uint32_t index, uint32_t vocab_size);

// A read-only mapping of a verified shard.
class ShardView {
 public:
  // Throws UserError naming `path` for a missing, truncated or corrupt shard.
  static ShardView open(const std::string& path, uint32_t vocab_size, bool verify_checksum = true);
  ShardView(ShardView&& o) noexcept;
  ShardView& operator=(ShardView&& o) noexcept;
  ShardView(const ShardView&) = delete;
  ShardView& operator=(const ShardView&) = delete;
  ~ShardView();

  const uint16_t* tokens() const { return tokens_; }
  uint64_t size() const { return count_; }
  const std::string& path() const { return path_; }

 private:
  ShardView() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  uint64_t count_ = 0;
};

}  // namespace loom::data
