// Hints for ThreadSanitizer where loom orders memory through something it cannot see: thread
// ranks map each shared-memory pair's segment twice (once per side), so a release on one
// address and the acquire on the other do not pair up by address. The caller names the buffer
// the ordering protects; outside a -fsanitize=thread build these are no code.
#pragma once

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace loom {

inline void tsan_release(const void* p) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(const_cast<void*>(p));
#else
  (void)p;
#endif
}

inline void tsan_acquire(const void* p) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(const_cast<void*>(p));
#else
  (void)p;
#endif
}

}  // namespace loom
