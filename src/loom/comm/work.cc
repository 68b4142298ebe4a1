#include "loom/comm/work.h"

#include "loom/core/error.h"

namespace loom::comm {

void Work::wait() {
  wait(Deadline::never());
}

void Work::wait(Deadline deadline) {
  if (!test()) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline.at(), [this] { return test(); }))
      throw PeerError(PeerError::Kind::kTimeout,
                      "Work::wait: the operation did not finish before the caller's deadline");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (err_) std::rethrow_exception(err_);
}

std::exception_ptr Work::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return err_;
}

void Work::on_done(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!test()) {
      callbacks_.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

void Work::finish(std::exception_ptr err) {
  std::vector<std::function<void()>> cbs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    err_ = err;
    done_.store(true, std::memory_order_release);
    cbs.swap(callbacks_);
  }
  cv_.notify_all();
  for (auto& f : cbs) f();
}

}  // namespace loom::comm
