// A point in time by which a blocking call must return (DESIGN decision 3).
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>

namespace loom {

using Clock = std::chrono::steady_clock;

// The same clock (CLOCK_MONOTONIC, which steady_clock reads) at the kernel tick's resolution
// (1-4 ms behind): a read of a few nanoseconds where the precise one costs tens under a
// hypervisor. For deadlines of seconds and records shown in seconds, on per-call paths.
inline Clock::time_point coarse_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

class Deadline {
 public:
  static Deadline after(std::chrono::nanoseconds d) { return Deadline(Clock::now() + d); }
  static Deadline after_seconds(double s) {
    return after(std::chrono::nanoseconds(static_cast<int64_t>(s * 1e9)));
  }
  // At most a tick early (coarse_now).
  static Deadline after_seconds_coarse(double s) {
    return Deadline(coarse_now() + std::chrono::nanoseconds(static_cast<int64_t>(s * 1e9)));
  }
  static Deadline never() { return Deadline(Clock::time_point::max()); }

  bool expired() const { return Clock::now() >= at_; }
  Clock::time_point at() const { return at_; }
  // Milliseconds left, clamped to [0, cap].
  int remaining_ms(int cap = 1 << 30) const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    if (left < 0) return 0;
    return left > cap ? cap : static_cast<int>(left);
  }
  double remaining_seconds() const {
    return std::chrono::duration<double>(at_ - Clock::now()).count();
  }
  Deadline earlier(Deadline other) const { return at_ < other.at_ ? *this : other; }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

}  // namespace loom
