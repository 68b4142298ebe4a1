#include "loom/core/scratch_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "loom/core/error.h"

namespace loom {

ScratchFile::ScratchFile(const std::string& dir, const std::string& name, const std::string& what,
                         std::string hint)
    : path_(dir + "/" + name), hint_(std::move(hint)) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!ec) fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (ec || fd_ < 0)
    throw UserError("cannot create the " + what + " " + path_ + ": " +
                        (ec ? ec.message() : std::strerror(errno)),
                    hint_);
}

ScratchFile::~ScratchFile() {
  ::close(fd_);
  ::unlink(path_.c_str());
}

void ScratchFile::read(size_t offset, void* out, size_t bytes) const {
  char* c = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t k = ::pread(fd_, c, bytes, static_cast<off_t>(offset));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      throw UserError("cannot read " + path_ + ": " + (k < 0 ? std::strerror(errno) : "short read"),
                      hint_);
    c += k, bytes -= static_cast<size_t>(k), offset += static_cast<size_t>(k);
  }
}

void ScratchFile::write(size_t offset, const void* in, size_t bytes) const {
  const char* c = static_cast<const char*>(in);
  while (bytes > 0) {
    const ssize_t k = ::pwrite(fd_, c, bytes, static_cast<off_t>(offset));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw UserError("cannot write " + path_ + ": " + std::strerror(errno), hint_);
    c += k, bytes -= static_cast<size_t>(k), offset += static_cast<size_t>(k);
  }
}

void ScratchFile::resize(size_t bytes) const {
  if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0)
    throw UserError(
        "cannot grow " + path_ + " to " + std::to_string(bytes) + " bytes: " + std::strerror(errno),
        hint_);
}

}  // namespace loom
