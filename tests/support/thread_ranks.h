// Runs ranks as threads of one process over an in-process store and the real transports
// (shared memory between threads maps segments like processes do; TCP uses real sockets).
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/comm/store/memory_store.h"

namespace loom::test {

enum class Layout { kShm, kTcp, kHier };

inline const char* layout_name(Layout l) {
  return l == Layout::kShm ? "shm" : l == Layout::kTcp ? "tcp" : "hier";
}

inline comm::CommConfig config_for(Layout l, int rank, const std::string& name) {
  comm::CommConfig c;
  c.name = name;
  c.timeout_s = 60;
  c.token = "thread-test-token";
  c.host_id = "hostA";
  if (l == Layout::kTcp) c.transport = "tcp";
  if (l == Layout::kHier) c.host_id = "host" + std::to_string(rank / 2);  // 2 ranks per host
  return c;
}

// Calls body(comm) on n threads; rethrows the first exception after all threads end.
inline void run_ranks(int n, Layout layout, const std::string& name,
                      const std::function<void(comm::Communicator&)>& body) {
  auto store = std::make_shared<comm::MemoryStore>();
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto c = comm::Communicator::create(store, r, n, config_for(layout, r, name));
        body(*c);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace loom::test
