#include "loom/optim/moment_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "loom/core/error.h"

namespace loom::optim {

MomentFile::MomentFile(const std::string& dir, int rank) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  path_ = dir + "/adam-moments-rank" + std::to_string(rank) + ".bin";
  if (!ec) fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (ec || fd_ < 0)
    throw UserError("cannot create the optimizer-state file " + path_ + ": " +
                        (ec ? ec.message() : std::strerror(errno)),
                    "point zero.offload_dir at a writable folder with room for 8 bytes per "
                    "parameter of this rank (default: run.dir/offload), or set zero.offload = "
                    "\"none\"");
}

MomentFile::~MomentFile() {
  io_.reset();  // finishes queued reads and writes
  ::close(fd_);
  ::unlink(path_.c_str());
}

size_t MomentFile::allocate(size_t bytes) {
  const size_t at = end_;
  end_ += bytes;
  if (::ftruncate(fd_, static_cast<off_t>(end_)) != 0)  // a sparse file reads as zeros
    throw UserError(
        "cannot grow " + path_ + " to " + std::to_string(end_) + " bytes: " + std::strerror(errno),
        "free disk space in zero.offload_dir");
  return at;
}

void MomentFile::read(size_t offset, void* out, size_t bytes) const {
  char* c = static_cast<char*>(out);
  read_ += static_cast<double>(bytes);
  while (bytes > 0) {
    const ssize_t k = ::pread(fd_, c, bytes, static_cast<off_t>(offset));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      throw UserError("cannot read " + path_ + ": " + (k < 0 ? std::strerror(errno) : "short read"),
                      "the optimizer-state file was changed or its disk failed");
    c += k, bytes -= static_cast<size_t>(k), offset += static_cast<size_t>(k);
  }
}

void MomentFile::write(size_t offset, const void* in, size_t bytes) const {
  const char* c = static_cast<const char*>(in);
  written_ += static_cast<double>(bytes);
  while (bytes > 0) {
    const ssize_t k = ::pwrite(fd_, c, bytes, static_cast<off_t>(offset));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      throw UserError("cannot write " + path_ + ": " + std::strerror(errno),
                      "free disk space in zero.offload_dir");
    c += k, bytes -= static_cast<size_t>(k), offset += static_cast<size_t>(k);
  }
}

}  // namespace loom::optim
