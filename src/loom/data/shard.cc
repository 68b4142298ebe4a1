#include "loom/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "loom/core/checksum.h"
#include "loom/core/error.h"

namespace loom::data {

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens, uint32_t split,
                 uint32_t index, uint32_t vocab_size) {
  ShardHeader h{};
  std::memcpy(h.magic, "LOOMTOK1", 8);
  h.version = kShardVersion;
  h.vocab_size = vocab_size;
  h.token_count = tokens.size();
  h.checksum = checksum64(tokens.data(), tokens.size() * 2);
  h.split = split;
  h.index = index;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f)
    throw UserError("cannot write " + path + ": " + errno_text(errno), "check the output folder");
  bool ok = std::fwrite(&h, sizeof h, 1, f) == 1 &&
            (tokens.empty() || std::fwrite(tokens.data(), 2, tokens.size(), f) == tokens.size());
  ok = (std::fflush(f) == 0) && ok && ::fsync(fileno(f)) == 0;
  std::fclose(f);
  if (!ok)
    throw UserError("writing " + path + " failed: " + errno_text(errno), "is the disk full?");
}

ShardView ShardView::open(const std::string& path, uint32_t vocab_size, bool verify_checksum) {
  auto bad = [&](const std::string& why) {
    return UserError("token shard " + path + " is " + why,
                     "re-run `loom prep` for this corpus (the file is damaged or not a shard)");
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw UserError("cannot open token shard " + path + ": " + errno_text(errno),
                    "check data.path");
  struct stat st {};
  ::fstat(fd, &st);
  size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < sizeof(ShardHeader)) {
    ::close(fd);
    throw bad("truncated (" + std::to_string(bytes) + " bytes, shorter than its header)");
  }
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw UserError("cannot map " + path + ": " + errno_text(errno), "");
  ShardView v;
  v.path_ = path;
  v.map_ = m;
  v.map_bytes_ = bytes;
  ShardHeader h;
  std::memcpy(&h, m, sizeof h);
  if (std::memcmp(h.magic, "LOOMTOK1", 8) != 0) throw bad("not a loom token shard (bad magic)");
  if (h.version != kShardVersion)
    throw bad("version " + std::to_string(h.version) + ", this loom reads " +
              std::to_string(kShardVersion));
  if (h.vocab_size != vocab_size)
    throw bad("for a vocabulary of " + std::to_string(h.vocab_size) + ", not " +
              std::to_string(vocab_size));
  // (Compared as a count: a huge token_count must not wrap the byte size into agreement.)
  if ((bytes - sizeof h) % 2 != 0 || h.token_count != (bytes - sizeof h) / 2)
    throw bad("truncated or padded: " + std::to_string(bytes) + " bytes for " +
              std::to_string(h.token_count) + " tokens");
  v.tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(m) + sizeof h);
  v.count_ = h.token_count;
  // The model indexes its embedding table with these ids: one out of range would read
  // outside it, so a shard whose checksum agrees (or is not checked) is still refused. One
  // pass over the (up to ~1 GiB) mapping: each chunk is checksummed and scanned while hot.
  constexpr uint64_t kChunk = 1 << 16;  // tokens (128 KiB: whole checksum words)
  Checksum64 sum;
  uint16_t top = 0;
  for (uint64_t at = 0; at < v.count_; at += kChunk) {
    const uint64_t n = std::min(kChunk, v.count_ - at);
    if (verify_checksum) sum.update(v.tokens_ + at, n * 2);
    for (uint64_t i = at; i < at + n; ++i) top = std::max(top, v.tokens_[i]);
  }
  if (verify_checksum && sum.value() != h.checksum) throw bad("corrupt (checksum mismatch)");
  if (v.count_ > 0 && top >= vocab_size)
    throw bad("holding token id " + std::to_string(top) + ", outside the vocabulary of " +
              std::to_string(vocab_size));
  return v;
}

ShardView::ShardView(ShardView&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      map_bytes_(o.map_bytes_),
      tokens_(o.tokens_),
      count_(o.count_) {}

ShardView& ShardView::operator=(ShardView&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, map_bytes_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = o.map_bytes_;
    tokens_ = o.tokens_;
    count_ = o.count_;
  }
  return *this;
}

ShardView::~ShardView() {
  if (map_) ::munmap(map_, map_bytes_);
}

}  // namespace loom::data
