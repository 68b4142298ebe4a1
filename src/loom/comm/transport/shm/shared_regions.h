// Buffers in shared memory that the ranks of one machine all map (Communicator::
// alloc_shared): a collective's message sent from one of them is not copied through the
// ring; the receiver copies or reduces it straight from its own mapping of the sender's
// buffer (one copy, plain loads, no system call).
//
// Each communicator keeps one SharedRegions, read by its shared-memory pairs: which of our
// buffers the peers have mapped (a send from inside one may go in place), and where each
// peer's buffers lie in our address space (to translate the address an in-place frame
// names). A region's first page holds a header whose `released` word its owner sets when
// it frees the buffer; peers drop their mappings of released regions at their next
// alloc_shared.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "loom/comm/transport/shm/segment.h"

namespace loom::comm::shm {

// Bytes before a shared buffer's data in its segment (the header page).
constexpr size_t kSharedHeader = 4096;

struct SharedHeader {
  uint64_t magic;
  uint32_t released;  // set by the owner when it frees the buffer
};
constexpr uint64_t kSharedMagic = 0x314248534d4f4f4cull;  // "LOOMSHB1"

class SharedRegions {
 public:
  void add_own(const void* data, size_t bytes);
  void remove_own(const void* data);
  // Whether [p, p + bytes) lies inside one of our buffers that every local peer has mapped.
  bool owns(const void* p, size_t bytes) const;

  // `map` is our mapping of a peer's whole segment; its data sits at `remote` in the peer.
  void add_peer(int peer, uint64_t remote, size_t bytes, Segment map);
  // Where [remote, remote + bytes) of `peer`'s memory is mapped here; nullptr if not ours.
  const std::byte* translate(int peer, uint64_t remote, size_t bytes) const;
  // Unmaps peers' buffers their owners have released. Returns how many.
  int drop_released();
  size_t peer_regions() const;

 private:
  struct Own {
    uintptr_t base;
    size_t bytes;
  };
  struct Peer {
    uint64_t remote;
    size_t bytes;
    std::shared_ptr<Segment> map;
  };
  mutable std::mutex mu_;
  std::vector<Own> own_;
  std::map<int, std::vector<Peer>> peers_;
};

}  // namespace loom::comm::shm
