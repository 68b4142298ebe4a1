#include "loom/parallel/activation_offload.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "loom/core/check.h"
#include "loom/core/error.h"

namespace loom::parallel {

namespace {
void io_all(bool write, int fd, void* p, size_t n, size_t offset, const std::string& path) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = write ? ::pwrite(fd, c, n, static_cast<off_t>(offset))
                            : ::pread(fd, c, n, static_cast<off_t>(offset));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      throw Error(std::string("activation offload: cannot ") + (write ? "write" : "read") + " " +
                  path + ": " + (k < 0 ? std::strerror(errno) : "short read"));
    c += k, n -= static_cast<size_t>(k), offset += static_cast<size_t>(k);
  }
}
}  // namespace

ActivationOffload::ActivationOffload(const std::string& dir, int rank) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  path_ = dir + "/activations-rank" + std::to_string(rank) + ".spill";
  if (!ec) fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (ec || fd_ < 0)
    throw UserError("cannot create the activation spill file " + path_ + ": " +
                        (ec ? ec.message() : std::strerror(errno)),
                    "point train.offload_dir at a writable folder with free space (default: "
                    "run.dir/spill), or set train.offload_activations = false");
}

ActivationOffload::~ActivationOffload() {
  io_.reset();  // finishes the queued reads and writes
  ::close(fd_);
  ::unlink(path_.c_str());
}

void ActivationOffload::offload(int key, model::Activations& a, const float* keep) {
  LOOM_CHECK(!is_out(key));
  Slot& s = slots_[key];
  std::vector<std::vector<float>*> bufs = a.buffers();
  s.kept = 0;
  for (size_t i = 0; i < bufs.size(); ++i)
    if (keep && bufs[i]->data() == keep) s.kept = i + 1;
  s.sizes.clear();
  size_t bytes = 0;
  for (auto* b : bufs) s.sizes.push_back(b->size()), bytes += b->size() * sizeof(float);
  if (bytes > s.capacity) s.offset = end_, s.capacity = bytes, end_ += bytes;
  *s.resident = bytes;
  if (s.kept) bytes -= s.sizes[s.kept - 1] * sizeof(float);
  written_ += static_cast<double>(bytes);
  // The buffer a send still reads (the stage's output) stays in memory: waiting for the send
  // here would hold every later offload behind a slow neighbour.
  s.writing = io_->submit([this, bufs, &s] {
    for (size_t i = 0, at = s.offset; i < bufs.size(); at += s.sizes[i] * sizeof(float), ++i) {
      if (i + 1 == s.kept) continue;
      io_all(true, fd_, bufs[i]->data(), s.sizes[i] * sizeof(float), at, path_);
      std::vector<float>().swap(*bufs[i]);
      *s.resident -= s.sizes[i] * sizeof(float);
    }
  });
  state_[key] = false;
  backlog_.push_back(s.writing);
}

void ActivationOffload::limit_backlog(size_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!backlog_.empty() &&
         (backlog_.size() > n ||
          backlog_.front().wait_for(std::chrono::seconds(0)) == std::future_status::ready)) {
    backlog_.front().get();  // rethrows an I/O error
    backlog_.pop_front();
  }
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

size_t ActivationOffload::resident_bytes(int key) const {
  const auto it = slots_.find(key);
  return is_out(key) && it != slots_.end() ? it->second.resident->load() : 0;
}

void ActivationOffload::prefetch(int key, model::Activations& a) {
  auto it = state_.find(key);
  if (it == state_.end() || it->second) return;
  it->second = true;
  Slot& s = slots_[key];
  std::vector<std::vector<float>*> bufs = a.buffers();
  LOOM_CHECK_EQ(bufs.size(), s.sizes.size());
  for (size_t i = 0; i < s.sizes.size(); ++i)
    if (i + 1 != s.kept) read_ += static_cast<double>(s.sizes[i] * sizeof(float));
  s.reading = io_->submit([this, bufs, &s] {
    size_t at = s.offset;
    for (size_t i = 0; i < bufs.size(); at += s.sizes[i] * sizeof(float), ++i) {
      if (i + 1 == s.kept) continue;
      bufs[i]->resize(s.sizes[i]);
      *s.resident += s.sizes[i] * sizeof(float);
      io_all(false, fd_, bufs[i]->data(), s.sizes[i] * sizeof(float), at, path_);
    }
  });
}

void ActivationOffload::fetch(int key, model::Activations& a) {
  if (!is_out(key)) return;
  prefetch(key, a);
  const auto t0 = std::chrono::steady_clock::now();
  Slot& s = slots_[key];
  s.writing.get();  // rethrows an I/O error
  s.reading.get();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state_.erase(key);
}

}  // namespace loom::parallel
