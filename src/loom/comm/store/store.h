// The rendezvous key-value store ranks use to find each other (the Gloo/c10d store idea).
// Implementations: TcpStore (a server hosted by rank 0 or a launcher, and its client),
// MemoryStore (threads in one process) and PrefixStore (a namespace for a sub-group).
// Every blocking call takes a deadline; when it passes the call throws PeerError(kTimeout).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/deadline.h"

namespace loom::comm {

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` exists, then returns its value.
  virtual std::string get(const std::string& key, Deadline deadline) = 0;
  // Atomically adds `delta` to the integer stored at `key` (missing = 0); returns the sum.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets `key` to `desired` if its value is `expected` ("" also matches a missing key).
  // Returns the value after the call.
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;
  // Returns whether the key existed.
  virtual bool remove(const std::string& key) = 0;
  // Waits until every key exists.
  virtual void wait(const std::vector<std::string>& keys, Deadline deadline) = 0;
  // Whether every key exists, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // An independent handle on the same data (a new connection for TcpStore), so another
  // thread can block on it without serialising behind this one.
  virtual std::unique_ptr<Store> clone() = 0;
  // The local address of this process's connection to the store ("" when in-process):
  // the interface that routes to the store host, which ranks advertise by default.
  virtual std::string local_host() const { return ""; }
};

}  // namespace loom::comm
