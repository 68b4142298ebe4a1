// Files that are either wholly written or not there at all: write to a temporary name in
// the same folder, fsync, rename over the target, fsync the folder. A crash at any point
// leaves the old content (or nothing) in place, never a half-written file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

// A file written in pieces that appears at `path` only on commit(): the bytes go to a
// temporary name beside it, commit() fsyncs and renames it into place; destroyed without
// commit() (an error on the way) it removes the temporary file. UserError naming the path
// on any failure.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  void write(const void* data, size_t n);
  uint64_t written() const { return written_; }
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

// Throws UserError naming the path when it cannot be written.
void write_file_atomic(const std::string& path, std::string_view content);
// Reads a whole file; UserError naming the path when it cannot be read.
std::string read_file(const std::string& path);
// fsync a folder so that renames inside it are durable.
void fsync_dir(const std::string& dir);
// fsync a file by path.
void fsync_file(const std::string& path);
// Whether `name`, read from a file loom wrote (a manifest), names a file directly inside its
// folder: not empty, not "." or "..", no '/' and no NUL. A damaged or hand-made manifest
// must not make loom open files elsewhere.
bool plain_file_name(std::string_view name);

}  // namespace loom
