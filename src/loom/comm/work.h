// The handle an asynchronous collective returns (c10d's Work, NCCL's event).
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "loom/core/deadline.h"

namespace loom::comm {

class Work {
 public:
  // True once the operation has finished, successfully or not.
  bool test() const { return done_.load(std::memory_order_acquire); }
  // Blocks until finished; rethrows the operation's error.
  void wait();
  // As wait(), but throws PeerError(kTimeout) if not finished by `deadline`. The operation
  // itself keeps its own deadline and goes on.
  void wait(Deadline deadline);
  // The error, or null when still running or successful.
  std::exception_ptr error() const;
  // Runs `fn` once when the operation finishes (at once if it already has); for futures.
  void on_done(std::function<void()> fn);

  void finish(std::exception_ptr err);  // called by the communicator

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  std::exception_ptr err_;
  std::vector<std::function<void()>> callbacks_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace loom::comm
