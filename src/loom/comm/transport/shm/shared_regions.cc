#include "loom/comm/transport/shm/shared_regions.h"

#include <algorithm>

namespace loom::comm::shm {

void SharedRegions::add_own(const void* data, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  own_.push_back({reinterpret_cast<uintptr_t>(data), bytes});
}

void SharedRegions::remove_own(const void* data) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto base = reinterpret_cast<uintptr_t>(data);
  std::erase_if(own_, [&](const Own& o) { return o.base == base; });
}

bool SharedRegions::owns(const void* p, size_t bytes) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  for (const Own& o : own_)
    if (a >= o.base && a - o.base <= o.bytes && bytes <= o.bytes - (a - o.base)) return true;
  return false;
}

void SharedRegions::add_peer(int peer, uint64_t remote, size_t bytes, Segment map) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_[peer].push_back({remote, bytes, std::make_shared<Segment>(std::move(map))});
}

const std::byte* SharedRegions::translate(int peer, uint64_t remote, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) return nullptr;
  for (const Peer& r : it->second)
    if (remote >= r.remote && remote - r.remote <= r.bytes &&
        bytes <= r.bytes - (remote - r.remote))
      return static_cast<const std::byte*>(r.map->data()) + kSharedHeader + (remote - r.remote);
  return nullptr;
}

int SharedRegions::drop_released() {
  std::lock_guard<std::mutex> lock(mu_);
  int dropped = 0;
  for (auto& [peer, list] : peers_)
    dropped += static_cast<int>(std::erase_if(list, [](const Peer& r) {
      auto* h = static_cast<SharedHeader*>(r.map->data());
      return std::atomic_ref<uint32_t>(h->released).load(std::memory_order_acquire) != 0;
    }));
  return dropped;
}

size_t SharedRegions::peer_regions() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [peer, list] : peers_) n += list.size();
  return n;
}

}  // namespace loom::comm::shm
