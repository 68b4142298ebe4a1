// The timeline (train.profile): spans recorded by every thread of a rank into one buffer,
// written as a Chrome trace / Perfetto JSON file ("traceEvents" of complete events, ph "X",
// microseconds). Off by default; when off a span costs one relaxed atomic load.
//
// Timestamps are CLOCK_MONOTONIC (steady_clock), shared by the processes of one machine;
// merging ranks of several machines subtracts each rank's offset to rank 0's clock,
// measured by ping-pong (train/trainer.cc, write_trace).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace loom {

class Trace {
 public:
  // Threads, as the trace shows them.
  enum Thread { kCompute = 0, kComm = 1, kIo = 2 };

  struct Event {
    std::string name;
    const char* cat;
    double ts_us, dur_us;
    int tid;
    std::string args;  // a JSON object, or empty
    char ph = 'X';     // 'X' a complete span, 'C' a counter sample (args: its values)
  };

  static Trace& get();
  static double now_us() {
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  static bool on() { return get().enabled_.load(std::memory_order_relaxed); }

  void enable(bool on) { enabled_ = on; }
  void add(std::string name, const char* cat, double t0_us, double t1_us, int tid,
           std::string args = "");
  void add_counter(std::string name, double t_us, std::string args);
  std::vector<Event> take();  // the events so far, oldest first; the buffer empties

 private:
  std::atomic<bool> enabled_{false};
  std::mutex mu_;
  std::vector<Event> events_;
};

// A span of the calling code: from construction to destruction (nothing when tracing is off).
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* cat, int tid = Trace::kCompute, std::string args = "")
      : on_(Trace::on()) {
    if (on_) name_ = name, cat_ = cat, tid_ = tid, args_ = std::move(args), t0_ = Trace::now_us();
  }
  TraceSpan(std::string name, const char* cat, int tid = Trace::kCompute) : on_(Trace::on()) {
    if (on_) name_ = std::move(name), cat_ = cat, tid_ = tid, t0_ = Trace::now_us();
  }
  ~TraceSpan() {
    if (on_) Trace::get().add(std::move(name_), cat_, t0_, Trace::now_us(), tid_, std::move(args_));
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  bool on_;
  std::string name_, args_;
  const char* cat_ = "";
  int tid_ = 0;
  double t0_ = 0;
};

}  // namespace loom
