#include "loom/comm/flight_recorder.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "loom/comm/store/store.h"
#include "loom/core/deadline.h"
#include "loom/core/log.h"
#include "loom/core/signals.h"
#include "loom/core/tunable.h"
#include "loom/profile/trace.h"

namespace loom::comm {
namespace {

const IntTunable kRecords("LOOM_FLIGHT_RECORDS", 256,
                          "operations the flight recorder keeps per process (the last ones; "
                          "0: record nothing, and the watchdog sees no hang)");
const DoubleTunable kWatchdog("LOOM_WATCHDOG_S", 60.0,
                              "seconds an operation may stay open before every rank reports "
                              "where it is and one hang report is printed (0: off)");
constexpr double kAnswerS = 3.0;  // how long the reporter waits for the other ranks
const DoubleTunable kHeartbeat(
    "LOOM_HEARTBEAT_S", 10.0,
    "seconds without a heartbeat (posted to the job's store every second by each rank's "
    "watchdog thread) after which a rank is declared dead, stopped or cut off and the job "
    "aborted, whatever its communicators are doing (0: off)");
constexpr int kWatchers = 2;  // each rank is watched by the next kWatchers ranks
std::atomic<bool> g_abort_seen{false};

const auto kStart = std::chrono::steady_clock::now();
std::atomic<bool> g_usr1{false};

void on_usr1(int) {
  g_usr1.store(true);
}

std::string ranks_text(const std::vector<int>& r) {
  std::string s;
  for (int q : r) s += (s.empty() ? "" : ", ") + std::to_string(q);
  return s;
}

nlohmann::json to_json(const FlightEntry& e, double now) {
  return {{"comm", e.comm ? *e.comm : "?"},
          {"seq", e.seq},
          {"op", e.fp.str()},
          {"bytes", e.bytes},
          {"state", op_state_name(e.state)},
          {"line", FlightRecorder::describe(e, now)},
          {"waiting_for", e.waiting_for}};
}

class Watchdog {
 public:
  Watchdog(std::unique_ptr<Store> store, int rank, int size)
      : store_(std::move(store)), rank_(rank), size_(size), after_s_(kWatchdog.get()) {
    struct sigaction sa = {};
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &sa, nullptr);
    on_signal(SIGUSR1, on_usr1);  // where the process routes it (core/signals.h)
    heartbeat();  // the first one before the job's first operation: it is watched from here
    thread_ = std::thread([this] { loop(); });
  }

  // Joined at exit (an atexit handler, before the statics it uses are destroyed); the
  // heartbeat says "done", so that the ranks still running do not take this one for dead.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    try {
      if (beat_ > 0) store_->set(hb_key(rank_), "done");
    } catch (const std::exception&) {  // the store is gone: nobody is left to watch
    }
  }

 private:
  void loop() {
    try {
      for (;;) {
        {
          std::unique_lock<std::mutex> lock(mu_);
          if (cv_.wait_for(lock, std::chrono::milliseconds(250), [&] { return stop_; })) return;
        }
        tick();
        heartbeat();
      }
    } catch (const std::exception& e) {
      // The store went away (the job is ending): nothing left to report to.
      LOOM_LOG(kDebug, "comm") << "watchdog stopped: " << e.what();
    }
  }

  void tick() {
    FlightRecorder& rec = FlightRecorder::get();
    const double now = FlightRecorder::now_s();
    bool trigger = false;
    if (g_usr1.exchange(false)) {
      std::string lines;
      for (const auto& e : rec.last(16)) lines += "\nloom:   " + FlightRecorder::describe(e, now);
      std::fprintf(stderr, "loom: rank %d's last operations (SIGUSR1):%s\n", rank_, lines.c_str());
      cause_ = "SIGUSR1";
      trigger = true;
    }
    if (!raised_ && after_s_ > 0) {
      const auto open = rec.open();
      if (!open.empty() && now - open.front().queued_s > after_s_) {
        cause_ = "rank " + std::to_string(rank_) + " has been in " +
                 FlightRecorder::describe(open.front(), now) +
                 " (LOOM_WATCHDOG_S = " + std::to_string(static_cast<int>(after_s_)) + ")";
        trigger = true;
      }
    }
    if (trigger && !raised_) {
      raised_ = true;
      const std::string me = std::to_string(rank_);
      if (store_->compare_set("hang/reporter", "", me) == me) {
        reporter_ = true;
        asked_at_ = now;
        store_->set("hang/cause", cause_);
      }
    }
    if (!posted_ && (raised_ || store_->check({"hang/reporter"}))) {
      post(now);
      posted_ = true;
    }
    if (reporter_ && !reported_) {
      bool all = true;
      for (int q = 0; q < size_ && all; ++q) all = store_->check({key(q)});
      if (all || now - asked_at_ > kAnswerS) {
        report();
        reported_ = true;
      }
    }
  }

  static std::string key(int q) { return "hang/rank" + std::to_string(q); }
  static std::string hb_key(int q) { return "hb/rank" + std::to_string(q); }

  // Every second: post this rank's heartbeat, watch the next kWatchers ranks' (so every
  // rank is watched, at a store cost linear in ranks), and look for the job's abort record.
  // A watched rank whose heartbeat stood still for LOOM_HEARTBEAT_S is dead, stopped or cut
  // off: the abort record names it, and every rank's operations fail with it — also where a
  // job's idle communicators would notice only at their next operation. A rank is watched
  // once its first heartbeat is seen (ranks that share a process post none of their own).
  void heartbeat() {
    const double now = FlightRecorder::now_s();
    if (heartbeat_s_ <= 0 || now - last_beat_ < 1.0) return;
    last_beat_ = now;
    store_->set(hb_key(rank_), std::to_string(++beat_));
    if (!g_abort_seen && store_->check({"abort"})) g_abort_seen = true;
    for (int k = 1; k <= kWatchers && k < size_ && !declared_; ++k) {
      const int q = (rank_ + k) % size_;
      if (!store_->check({hb_key(q)})) continue;
      const std::string v = store_->get(hb_key(q), Deadline::after_seconds(10));
      Heard& h = heard_[q];
      if (v == "done" || v != h.value) {
        h = {v, now};
        continue;
      }
      if (now - h.at < heartbeat_s_) continue;
      declared_ = true;
      const std::string why =
          "rank " + std::to_string(q) + " has not been heard from for " +
          std::to_string(static_cast<int>(now - h.at)) +
          " s (LOOM_HEARTBEAT_S = " + std::to_string(static_cast<int>(heartbeat_s_)) +
          "): dead, stopped (SIGSTOP) or cut off; noticed by rank " + std::to_string(rank_);
      LOOM_LOG(kWarn, "comm") << why;
      store_->compare_set("abort", "", why);
      g_abort_seen = true;
    }
  }

  void post(double now) {
    FlightRecorder& rec = FlightRecorder::get();
    nlohmann::json open = nlohmann::json::array(), last = nlohmann::json::array();
    for (const auto& e : rec.open()) open.push_back(to_json(e, now));
    for (const auto& e : rec.last(4))
      if (e.state == OpState::kDone || e.state == OpState::kFailed) last.push_back(to_json(e, now));
    nlohmann::json j = {{"rank", rank_}, {"pid", ::getpid()}, {"open", open}, {"last", last}};
    store_->set(key(rank_), j.dump());
  }

  // One report: every rank's place, then who is behind.
  void report() {
    std::vector<std::optional<nlohmann::json>> dumps(size_);
    for (int q = 0; q < size_; ++q)
      if (store_->check({key(q)}))
        dumps[q] = nlohmann::json::parse(store_->get(key(q), Deadline::after_seconds(10)));
    std::string out = "loom: hang report: " + cause_ + "\n";
    std::set<int> waited_for, in_op, silent;
    std::map<int, std::set<int>> waiters;
    for (int q = 0; q < size_; ++q) {
      out += "loom:   rank " + std::to_string(q);
      if (!dumps[q]) {
        silent.insert(q);
        out += ": no answer within " + std::to_string(static_cast<int>(kAnswerS)) +
               " s (stopped, hung outside loom, or dead)\n";
        continue;
      }
      const auto& d = *dumps[q];
      out += " (pid " + std::to_string(d["pid"].get<int>()) + "): ";
      if (d["open"].empty()) {
        out += "in no operation";
        if (!d["last"].empty()) out += "; last: " + d["last"].back()["line"].get<std::string>();
        out += "\n";
        continue;
      }
      in_op.insert(q);
      out += d["open"][0]["line"].get<std::string>();
      if (d["open"].size() > 1) out += " (+" + std::to_string(d["open"].size() - 1) + " queued)";
      out += "\n";
      for (const auto& e : d["open"])
        for (int w : e["waiting_for"]) waited_for.insert(w), waiters[w].insert(q);
    }
    // Behind: waited for, but not itself waiting in an operation (computing, stopped or
    // stuck outside loom), and every rank that did not answer.
    std::set<int> behind = silent;
    for (int w : waited_for)
      if (!in_op.count(w)) behind.insert(w);
    if (in_op.empty() && silent.empty()) {
      out += "loom:   behind: none (no rank is inside an operation)\n";
    } else if (behind.empty()) {
      out +=
          "loom:   behind: none found (every rank is inside an operation: a mismatch of "
          "operations or a lost peer; LOOM_TIMEOUT_S will name it)\n";
    } else {
      for (int b : behind) {
        out += "loom:   behind: rank " + std::to_string(b);
        if (waiters.count(b))
          out +=
              " (waited for by rank(s) " + ranks_text({waiters[b].begin(), waiters[b].end()}) + ")";
        out += "\n";
      }
    }
    std::fputs(out.c_str(), stderr);
    std::fflush(stderr);
  }

  std::unique_ptr<Store> store_;
  int rank_, size_;
  double after_s_;
  std::string cause_;
  bool raised_ = false, posted_ = false, reporter_ = false, reported_ = false;
  double asked_at_ = 0;
  struct Heard {
    std::string value;  // the rank's last heartbeat
    double at = 0;      // when it last changed (as this rank saw it)
  };
  const double heartbeat_s_ = kHeartbeat.get();
  double last_beat_ = -1;
  uint64_t beat_ = 0;
  std::map<int, Heard> heard_;
  bool declared_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

const char* op_state_name(OpState s) {
  switch (s) {
    case OpState::kQueued:
      return "queued";
    case OpState::kRunning:
      return "running";
    case OpState::kDone:
      return "done";
    case OpState::kFailed:
      return "failed";
  }
  return "?";
}

FlightRecorder& FlightRecorder::get() {
  static FlightRecorder* r = new FlightRecorder();  // never destroyed: threads may record late
  return *r;
}

FlightRecorder::FlightRecorder()
    : capacity_(static_cast<size_t>(std::max<int64_t>(0, kRecords.get()))), ring_(capacity_) {}

// Records are shown in seconds: the coarse clock, unless the timeline wants spans in µs.
double FlightRecorder::now_s() {
  const auto t = Trace::on() ? std::chrono::steady_clock::now() : coarse_now();
  return std::chrono::duration<double>(t - kStart).count();
}

// The next entry, overwritten in place (mu_ held): the name's reference count moves only
// when the communicator differs and the waiting list keeps its capacity (no allocation, no
// atomic per operation).
FlightEntry& FlightRecorder::enter(const std::shared_ptr<const std::string>& comm, uint64_t seq,
                                   const Fingerprint& fp, size_t bytes, int peer, bool send) {
  const uint64_t id = next_id_++;
  FlightEntry& e = ring_[id % capacity_];
  if (e.comm != comm) e.comm = comm;
  e.id = id, e.seq = seq, e.fp = fp, e.bytes = bytes, e.peer = peer, e.send = send;
  e.waiting_for.clear();
  return e;
}

uint64_t FlightRecorder::queued(const std::shared_ptr<const std::string>& comm, uint64_t seq,
                                const Fingerprint& fp, size_t bytes, bool running, int peer,
                                bool send, double queued_s) {
  if (capacity_ == 0) return kNoRecord;
  if (queued_s < 0) queued_s = now_s();
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry& e = enter(comm, seq, fp, bytes, peer, send);
  e.state = running ? OpState::kRunning : OpState::kQueued;
  e.queued_s = queued_s, e.started_s = running ? queued_s : -1, e.ended_s = -1;
  return e.id;
}

void FlightRecorder::record_done(const std::shared_ptr<const std::string>& comm, uint64_t seq,
                                 const Fingerprint& fp, size_t bytes, double started_s, bool ok) {
  if (capacity_ == 0) return;
  const double t = now_s();
  std::optional<FlightEntry> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    FlightEntry& e = enter(comm, seq, fp, bytes, -1, false);
    e.state = ok ? OpState::kDone : OpState::kFailed;
    e.queued_s = e.started_s = started_s, e.ended_s = t;
    if (Trace::on()) done = e;
  }
  if (done) trace(*done);
}

FlightEntry* FlightRecorder::find(uint64_t id) {
  if (id >= next_id_ || next_id_ - id > capacity_) return nullptr;
  return &ring_[id % capacity_];
}

void FlightRecorder::started(uint64_t id) {
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mu_);
  if (FlightEntry* e = find(id)) e->state = OpState::kRunning, e->started_s = t;
}

void FlightRecorder::matched(uint64_t id, uint64_t seq, int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (FlightEntry* e = find(id)) e->seq = seq, e->peer = peer;
}

void FlightRecorder::finished(uint64_t id, bool ok) {
  const double t = now_s();
  std::optional<FlightEntry> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (FlightEntry* e = find(id)) {
      e->state = ok ? OpState::kDone : OpState::kFailed, e->ended_s = t;
      e->waiting_for.clear();
      if (Trace::on()) done = *e;
    }
  }
  if (done) trace(*done);
}

// The timeline's span of a finished operation: one track per communicator (its operations
// run one at a time, so the spans nest), from start to end, with what waited before.
void FlightRecorder::trace(const FlightEntry& e) {
  const double epoch_us =
      std::chrono::duration<double, std::micro>(kStart.time_since_epoch()).count();
  const std::string op = e.fp.str(), comm = e.comm ? *e.comm : "?";
  // A communicator's collectives run one at a time: one track. Its sends and receives run
  // together (Communicator::run_p2p), but those of one direction with one peer go through
  // their pair in order: one track each, where a transfer starts when the one before it
  // ended (the wait counts as queued).
  std::string track = comm;
  if (e.peer >= 0) track += (e.send ? " send to " : " recv from ") + std::to_string(e.peer);
  int tid;
  double start_s = e.started_s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tracks_.find(track);
    if (it == tracks_.end())
      it = tracks_.emplace(track, 10 + static_cast<int>(tracks_.size())).first;
    tid = it->second;
    double& last = track_end_[track];
    start_s = std::min(std::max(start_s, last), e.ended_s);
    last = e.ended_s;
  }
  nlohmann::json args = {{"op", op},
                         {"bytes", e.bytes},
                         {"seq", e.seq},
                         {"comm", comm},
                         {"algo", algo_name(e.fp.algo)},
                         {"queued_us", (start_s - e.queued_s) * 1e6},
                         {"ok", e.state == OpState::kDone}};
  if (e.peer >= 0) args["peer"] = e.peer, args["direction"] = e.send ? "send" : "recv";
  Trace::get().add(op.substr(0, op.find('(')), "comm", epoch_us + start_s * 1e6,
                   epoch_us + e.ended_s * 1e6, tid, args.dump());
}

std::map<std::string, int> FlightRecorder::tracks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tracks_;
}

void FlightRecorder::waiting(uint64_t id, std::vector<int> world_ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  if (FlightEntry* e = find(id)) e->waiting_for = std::move(world_ranks);
}

std::vector<FlightEntry> FlightRecorder::last(size_t n) const {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t k = std::min<uint64_t>({n, capacity_, next_id_});
  std::vector<FlightEntry> v;
  for (uint64_t id = next_id_ - k; id < next_id_; ++id) v.push_back(ring_[id % capacity_]);
  return v;
}

std::vector<FlightEntry> FlightRecorder::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FlightEntry> v;
  for (uint64_t id = next_id_ - std::min<uint64_t>(capacity_, next_id_); id < next_id_; ++id) {
    const FlightEntry& e = ring_[id % capacity_];
    if (e.state == OpState::kQueued || e.state == OpState::kRunning) v.push_back(e);
  }
  return v;
}

std::string FlightRecorder::describe(const FlightEntry& e, double now) {
  char when[64];
  if (e.state == OpState::kQueued)
    std::snprintf(when, sizeof when, "queued for %.1f s", now - e.queued_s);
  else if (e.state == OpState::kRunning)
    std::snprintf(when, sizeof when, "running for %.1f s", now - e.started_s);
  else
    std::snprintf(when, sizeof when, "%s %.1f s ago", op_state_name(e.state), now - e.ended_s);
  std::string s = e.fp.str() + " #" + std::to_string(e.seq) + " on '" + (e.comm ? *e.comm : "?") +
                  "' (" + std::to_string(e.bytes) + " bytes): " + when;
  if (!e.waiting_for.empty()) s += ", waiting for rank(s) " + ranks_text(e.waiting_for);
  return s;
}

bool job_abort_seen() {
  return g_abort_seen.load(std::memory_order_relaxed);
}

void forget_abort_seen() {
  g_abort_seen = false;
}

void start_watchdog(std::unique_ptr<Store> store, int rank, int size) {
  static std::once_flag once;
  static Watchdog* watchdog = nullptr;  // never destroyed; its thread is joined at exit
  std::call_once(once, [&] {
    watchdog = new Watchdog(std::move(store), rank, size);
    std::atexit([] { watchdog->stop(); });
  });
}

}  // namespace loom::comm
