// A point in time by which a blocking call must return (DESIGN decision 3).
#pragma once

#include <chrono>
#include <cstdint>

namespace loom {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  static Deadline after(std::chrono::nanoseconds d) { return Deadline(Clock::now() + d); }
  static Deadline after_seconds(double s) {
    return after(std::chrono::nanoseconds(static_cast<int64_t>(s * 1e9)));
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
