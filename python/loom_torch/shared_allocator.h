// Torch's CPU tensors in loom's shared memory (issue 37 item 3): an at::Allocator that
// torch's CPU allocations go through once `use_shared_memory` has installed it. Storage of
// at least `min_bytes` comes from loom's shared buffers (memfds the machine's other ranks
// map on first use: comm/transport/shm/shared_memory.h), so a collective on such a tensor
// takes the single-copy paths and the fused `shared` allreduce instead of staging through
// the rings; smaller storage comes from the allocator that was in place before.
//
// Freed buffers are kept by size class (each rounded up to a quarter power of two) up to
// `cache_bytes`, and handed out again: a training step that frees and reallocates the
// same shapes maps nothing new here or in its peers. Beyond the cache a freed buffer is
// released (peers drop their mappings of it when they next map one).
//
// Opt-in (loom_torch.use_shared_memory(), or LOOM_TORCH_SHARED_MEMORY=1 at import): shared
// pages are shared with a fork()ed child too, so a child that wrote into a tensor it
// inherited would write into the parent's (with the default allocator it writes a copy).
// A forked child allocates from the previous allocator and forgets the parent's cache.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>

namespace loom_torch {

// Installs the allocator (the first time: it also raises the soft limit on open files to
// the hard one, each shared buffer holding a memfd) and turns shared storage on or off;
// tensors allocated before keep their storage.
void use_shared_memory(bool on, size_t min_bytes, size_t cache_bytes);

struct SharedMemoryStats {
  size_t live_bytes = 0;    // in shared storage that tensors hold now (size classes)
  size_t cached_bytes = 0;  // freed and kept for reuse
  uint64_t made = 0;        // shared buffers allocated
  uint64_t reused = 0;      // allocations served from the cache
  uint64_t released = 0;    // freed buffers released past the cache
  bool enabled = false;
};
SharedMemoryStats shared_memory_stats();

// The smallest storage that comes from shared memory now (at least 1); 0 while it is off.
// A process group created now tells its peers (CommConfig::shared_from).
size_t shared_storage_from();

// Whether [data, data + bytes) lies in a loom shared buffer of this process.
bool in_shared_memory(const void* data, size_t bytes);

}  // namespace loom_torch
