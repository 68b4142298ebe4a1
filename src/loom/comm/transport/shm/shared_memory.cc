#include "loom/comm/transport/shm/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <random>

#include "loom/core/error.h"

namespace loom::comm::shm {
namespace {

constexpr size_t kHeader = 4096;
constexpr uint64_t kMagic = 0x314248534d4f4f4cull;  // "LOOMSHB1"

struct Header {
  uint64_t magic;
  uint64_t id;
  uint64_t data;  // the owner's address of the data
  uint64_t bytes;
  uint32_t released;
};

struct Own {
  size_t bytes;
  uint64_t id;
  int fd;
};

std::mutex g_mu;
std::map<uintptr_t, Own> g_own;  // by the data's address (an allocator may hold thousands)
size_t g_held = 0;

uint64_t next_id() {  // unique in this process (a peer keys its mappings by it)
  static std::atomic<uint64_t> counter{(uint64_t{std::random_device{}()} << 32) + 1};
  return counter.fetch_add(1);
}

}  // namespace

void* shared_alloc(size_t bytes) {
  int fd = ::memfd_create("loom-shared", MFD_CLOEXEC);
  if (fd < 0) throw Error("memfd_create failed: " + errno_text(errno));
  const size_t size = kHeader + bytes;
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error("sizing shared memory to " + std::to_string(size) + " bytes failed: " +
                errno_text(err) + "; is memory (or the memfd limit) exhausted?");
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    throw Error("mapping " + std::to_string(size) +
                " bytes of shared memory failed: " + errno_text(err));
  }
  auto* h = static_cast<Header*>(base);
  auto* data = static_cast<std::byte*>(base) + kHeader;
  h->id = next_id();
  h->data = reinterpret_cast<uintptr_t>(data);
  h->bytes = bytes;
  std::atomic_ref<uint64_t>(h->magic).store(kMagic, std::memory_order_release);
  std::lock_guard<std::mutex> lock(g_mu);
  g_own.emplace(reinterpret_cast<uintptr_t>(data), Own{bytes, h->id, fd});
  g_held += bytes;
  return data;
}

void shared_free(void* data) {
  if (!data) return;
  Own o{};
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_own.find(reinterpret_cast<uintptr_t>(data));
    if (it == g_own.end()) return;
    o = it->second;
    g_own.erase(it);
    g_held -= o.bytes;
  }
  auto* base = static_cast<std::byte*>(data) - kHeader;
  std::atomic_ref<uint32_t>(reinterpret_cast<Header*>(base)->released)
      .store(1, std::memory_order_release);
  ::munmap(base, kHeader + o.bytes);
  ::close(o.fd);
}

bool shared_find(const void* p, size_t bytes, SharedRef* ref) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_own.upper_bound(a);  // the first buffer starting after p
  if (it == g_own.begin()) return false;
  --it;
  const Own& o = it->second;
  if (a - it->first > o.bytes || bytes > o.bytes - (a - it->first)) return false;
  *ref = {o.id, o.fd};
  return true;
}

size_t shared_bytes_held() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_held;
}

namespace {

// Opens and maps process `pid`'s buffer `ref` whole (header page and data), populated at
// once: a first touch per page later would trap (more so under a hypervisor that shadows
// page tables) in the middle of a transfer. Checks the header against `ref`.
void* map_whole(int pid, const SharedRef& ref, int prot, size_t* size, std::string* why) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(ref.fd);
  int fd = ::open(path.c_str(), ((prot & PROT_WRITE) ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    *why = "cannot open " + path + ": " + errno_text(errno);
    return nullptr;
  }
  struct stat st {};
  ::fstat(fd, &st);
  *size = static_cast<size_t>(st.st_size);
  void* base = *size >= kHeader ? ::mmap(nullptr, *size, prot, MAP_SHARED | MAP_POPULATE, fd, 0)
                                : MAP_FAILED;
  const int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    *why = "cannot map " + path + ": " + (*size < kHeader ? "too small" : errno_text(err));
    return nullptr;
  }
  auto* h = static_cast<Header*>(base);
  if (std::atomic_ref<uint64_t>(h->magic).load(std::memory_order_acquire) != kMagic ||
      h->id != ref.id || kHeader + h->bytes != *size) {
    ::munmap(base, *size);
    *why = path + " is not the shared buffer the message names";
    return nullptr;
  }
  return base;
}

}  // namespace

void* map_peer_buffer(int pid, const SharedRef& ref, size_t bytes, std::string* why) {
  size_t size = 0;
  void* base = map_whole(pid, ref, PROT_READ | PROT_WRITE, &size, why);
  if (!base) return nullptr;
  if (size != kHeader + bytes) {
    ::munmap(base, size);
    *why = "the shared buffer is " + std::to_string(size - kHeader) + " bytes, not " +
           std::to_string(bytes);
    return nullptr;
  }
  return static_cast<std::byte*>(base) + kHeader;
}

void unmap_peer_buffer(void* data, size_t bytes) {
  if (data) ::munmap(static_cast<std::byte*>(data) - kHeader, kHeader + bytes);
}

PeerMappings::~PeerMappings() {
  for (auto& [id, m] : maps_) ::munmap(m.base, m.size);
}

void PeerMappings::drop_released() {
  for (auto it = maps_.begin(); it != maps_.end();) {
    auto* h = static_cast<Header*>(it->second.base);
    if (std::atomic_ref<uint32_t>(h->released).load(std::memory_order_acquire)) {
      ::munmap(it->second.base, it->second.size);
      it = maps_.erase(it);
    } else {
      ++it;
    }
  }
}

std::byte* PeerMappings::translate(int pid, const SharedRef& ref, uint64_t remote, size_t bytes,
                                   std::string* why, bool writable) {
  auto it = maps_.find(ref.id);
  if (it != maps_.end() &&
      (std::atomic_ref<uint32_t>(static_cast<Header*>(it->second.base)->released)
           .load(std::memory_order_acquire) ||
       (writable && !it->second.writable))) {
    ::munmap(it->second.base, it->second.size);  // freed since (never read it again), or
    maps_.erase(it);                             // read only where a write is asked for
    it = maps_.end();
  }
  if (it == maps_.end()) {
    drop_released();
    size_t size = 0;
    void* base = map_whole(pid, ref, writable ? PROT_READ | PROT_WRITE : PROT_READ, &size, why);
    if (!base) return nullptr;
    auto* h = static_cast<const Header*>(base);
    it = maps_.emplace(ref.id, Map{base, size, h->data, h->bytes, writable}).first;
  }
  const Map& m = it->second;
  if (remote < m.data || remote - m.data > m.bytes || bytes > m.bytes - (remote - m.data)) {
    *why = "the message lies outside the shared buffer it names";
    return nullptr;
  }
  return static_cast<std::byte*>(m.base) + kHeader + (remote - m.data);
}

}  // namespace loom::comm::shm
