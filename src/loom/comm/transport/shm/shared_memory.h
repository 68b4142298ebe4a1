// Memory the other processes of this machine can map (Communicator::alloc_shared): one
// memfd per buffer, which a peer opens through /proc/<pid>/fd/<fd> the first time a message
// names it. A collective's message sent from inside such a buffer is not copied through the
// ring: the receiver copies or reduces it straight from its own mapping of the sender's
// buffer (one copy, plain loads, no system call per message). Buffers have no name in
// /dev/shm, so nothing outlives the processes, even after kill -9.
//
// A buffer's first page is a header (its id, where its data lies in its owner, a
// `released` word the owner sets when it frees it); a peer drops its mappings of released
// buffers whenever it maps a new one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace loom::comm::shm {

// How a peer finds one of our buffers (carried in the in-place frame).
struct SharedRef {
  uint64_t id = 0;
  int32_t fd = -1;
};

// This process's shared buffers (thread-safe). Zero-filled, 4096-byte aligned.
void* shared_alloc(size_t bytes);
void shared_free(void* data);
// Whether [p, p + bytes) lies inside one of this process's shared buffers; its reference.
bool shared_find(const void* p, size_t bytes, SharedRef* ref);
// Bytes of shared buffers this process holds (tests).
size_t shared_bytes_held();

// Process `pid`'s buffer `ref` (`bytes` long) mapped here readable and writable, for the
// other ranks of a machine buffer (Communicator::alloc_machine_buffer); its data's address,
// or nullptr with the reason in *why. The mapping keeps the memory alive after its owner
// frees it or exits; unmap_peer_buffer() drops it.
void* map_peer_buffer(int pid, const SharedRef& ref, size_t bytes, std::string* why);
void unmap_peer_buffer(void* data, size_t bytes);

// The buffers of one peer process mapped here (one per pair; not thread-safe).
class PeerMappings {
 public:
  PeerMappings() = default;
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;
  ~PeerMappings();
  // Our address of [remote, remote + bytes) in process `pid`'s buffer `ref`, mapped on
  // first use (read only, or read and write: a read-only mapping is replaced by a writable
  // one when asked for); nullptr with the reason in *why when it cannot be.
  std::byte* translate(int pid, const SharedRef& ref, uint64_t remote, size_t bytes,
                       std::string* why, bool writable = false);
  size_t mapped() const { return maps_.size(); }

 private:
  struct Map {
    void* base;
    size_t size;
    uint64_t data;  // where the data starts in the owner
    uint64_t bytes;
    bool writable;
  };
  void drop_released();
  std::unordered_map<uint64_t, Map> maps_;  // by buffer id
};

}  // namespace loom::comm::shm
