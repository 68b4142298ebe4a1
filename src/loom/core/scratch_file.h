// A per-rank scratch file that lives as long as its owner (activation spill files, Adam's
// moments on disk): created empty in a folder that is made if needed, read and written in
// place at offsets, removed when the owner goes.
#pragma once

#include <cstddef>
#include <string>

namespace loom {

class ScratchFile {
 public:
  // Creates `dir` and `dir/name`, truncated. On failure: UserError "cannot create the
  // <what> <path>: <reason>" with `hint`, which read and write errors repeat too.
  ScratchFile(const std::string& dir, const std::string& name, const std::string& what,
              std::string hint);
  ~ScratchFile();  // closes and removes the file
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  // Whole transfers at `offset` (retrying short and interrupted calls); UserError naming the
  // file otherwise. Safe from several threads (pread/pwrite).
  void read(size_t offset, void* out, size_t bytes) const;
  void write(size_t offset, const void* in, size_t bytes) const;
  // Sets the file's size (a sparse file reads as zeros).
  void resize(size_t bytes) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_, hint_;
  int fd_ = -1;
};

}  // namespace loom
