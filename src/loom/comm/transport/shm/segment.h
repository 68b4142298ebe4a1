// A POSIX shared-memory segment mapped into this process (RAII).
//
// Names are "/loom.<creator pid>.<random>". The opener unlinks the name as soon as it has
// mapped it, so a segment never outlives the processes that map it, even after kill -9.
// A creator that dies before its peer opened the segment leaves a name behind: the local
// launcher (`loom run`) removes it when the job ends, and the next loom process on the
// machine removes names whose creator pid is gone (sweep_stale()).
#pragma once

#include <cstddef>
#include <string>

namespace loom::comm::shm {

class Segment {
 public:
  static Segment create(size_t bytes);           // new name, zero-filled, pages populated
  static Segment open(const std::string& name);  // existing segment
  Segment(Segment&& o) noexcept;
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  void* data() const { return base_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  void unlink();  // idempotent; ENOENT is fine

 private:
  Segment(std::string name, void* base, size_t size)
      : name_(std::move(name)), base_(base), size_(size) {}
  std::string name_;
  void* base_ = nullptr;
  size_t size_ = 0;
};

// Removes /dev/shm/loom.<pid>.* whose creator is no longer running. Returns how many.
int sweep_stale();

// Whether a process is alive (not gone, not a zombie).
bool pid_alive(int pid);

}  // namespace loom::comm::shm
