#include "loom/core/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/core/error.h"

namespace loom {
namespace fs = std::filesystem;

namespace {
UserError io_error(const std::string& what, const std::string& path) {
  return UserError("cannot " + what + " " + path + ": " + std::strerror(errno),
                   "check the path, its permissions and the free disk space");
}
}  // namespace

void fsync_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw io_error("open", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw io_error("fsync", path);
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw io_error("open folder", dir);
  ::fsync(fd);  // some file systems refuse fsync on folders; the rename is still ordered
  ::close(fd);
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  const fs::path target(path_);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  tmp_ = (dir / ("." + target.filename().string() + ".tmp-" + std::to_string(::getpid()))).string();
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw io_error("write", tmp_);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw io_error("write", tmp_);
    p += w, n -= static_cast<size_t>(w), written_ += static_cast<uint64_t>(w);
  }
}

void AtomicFileWriter::commit() {
  if (::fsync(fd_) != 0) throw io_error("fsync", tmp_);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0 || ::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    errno = err;
    throw io_error("rename into place", path_);
  }
  const fs::path target(path_);
  fsync_dir(target.has_parent_path() ? target.parent_path().string() : ".");
}

void write_file_atomic(const std::string& path, std::string_view content) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp = (dir / ("." + target.filename().string() + ".tmp")).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw io_error("write", tmp);
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      throw io_error("write", tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw io_error("fsync", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw io_error("rename into place", path);
  }
  fsync_dir(dir.string());
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw io_error("read", path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

bool plain_file_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\0", 2)) == std::string_view::npos;
}

}  // namespace loom
