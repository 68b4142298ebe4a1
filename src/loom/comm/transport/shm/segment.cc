#include "loom/comm/transport/shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <utility>

#include "loom/core/error.h"
#include "loom/core/hmac.h"
#include "loom/core/log.h"

namespace loom::comm::shm {

Segment Segment::create(size_t bytes) {
  std::string name = "/loom." + std::to_string(::getpid()) + "." + generate_token().substr(0, 16);
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    throw Error("shm_open(" + name + ") failed: " + errno_text(errno) +
                "; is /dev/shm mounted and writable?");
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw Error("ftruncate of shared memory " + name + " to " + std::to_string(bytes) +
                " bytes failed: " + errno_text(err) + "; is /dev/shm full?");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    throw Error("mmap of shared memory failed: " + errno_text(err));
  }
  return Segment(name, p, bytes);
}

Segment Segment::open(const std::string& name) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw Error("shm_open(" + name + ") failed: " + errno_text(errno));
  struct stat st {};
  ::fstat(fd, &st);
  size_t bytes = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw Error("mmap of shared memory " + name + " failed: " + errno_text(err));
  return Segment(name, p, bytes);
}

Segment::Segment(Segment&& o) noexcept
    : name_(std::move(o.name_)), base_(std::exchange(o.base_, nullptr)), size_(o.size_) {}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    if (base_) ::munmap(base_, size_);
    name_ = std::move(o.name_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = o.size_;
  }
  return *this;
}

Segment::~Segment() {
  if (base_) ::munmap(base_, size_);
}

void Segment::unlink() {
  if (!name_.empty()) ::shm_unlink(name_.c_str());
}

bool pid_alive(int pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A zombie still answers kill(); its state letter in /proc/<pid>/stat is Z or X.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no procfs: trust kill()
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

int sweep_stale() {
  int removed = 0;
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return 0;
  while (dirent* e = ::readdir(dir)) {
    std::string n = e->d_name;
    if (n.rfind("loom.", 0) != 0) continue;
    auto dot = n.find('.', 5);
    if (dot == std::string::npos) continue;
    int pid = std::atoi(n.substr(5, dot - 5).c_str());
    if (pid > 0 && !pid_alive(pid)) {
      if (::shm_unlink(("/" + n).c_str()) == 0) ++removed;
    }
  }
  ::closedir(dir);
  if (removed) {
    LOOM_LOG(kInfo, "shm") << "removed " << removed << " stale segment(s) of dead jobs";
  }
  return removed;
}

}  // namespace loom::comm::shm
