// The flight recorder and the hang watchdog.
//
// FlightRecorder: the last LOOM_FLIGHT_RECORDS collective and point-to-point operations of
// this process, all communicators together: communicator, sequence number, operation,
// bytes, state (queued, running, done, failed), when each state began and, while an
// operation is blocked, the world ranks it waits for.
//
// Watchdog (one thread per process, started with the first communicator): when an
// operation has been open longer than LOOM_WATCHDOG_S, or on SIGUSR1, this rank posts its
// open operations to the job's store and asks every rank to do the same; the first rank to
// ask waits a few seconds for the answers and prints one report — which ranks are in the
// stuck operation, which wait for whom, and which are behind (in an earlier operation, not
// in one, or not answering: stopped, or hung outside loom) — well before LOOM_TIMEOUT_S ends
// the job. Any failed operation also prints this rank's last operations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm/transport/pair.h"

namespace loom::comm {

class Store;

enum class OpState { kQueued, kRunning, kDone, kFailed };
const char* op_state_name(OpState s);

struct FlightEntry {
  uint64_t id = 0;                          // per process, increasing
  std::shared_ptr<const std::string> comm;  // its name ("world", "world/split0/c1", ...)
  uint64_t seq = 0;  // the communicator's sequence number (per peer for send/recv)
  Fingerprint fp;    // the operation (formatted only when shown: recording stays cheap)
  size_t bytes = 0;
  int peer = -1;      // send/recv: the other side's world rank
  bool send = false;  // send/recv: this side sends
  OpState state = OpState::kQueued;
  double queued_s = 0, started_s = -1, ended_s = -1;  // process clock (FlightRecorder::now_s)
  std::vector<int> waiting_for;                       // world ranks, while blocked
};

class FlightRecorder {
 public:
  static FlightRecorder& get();
  static double now_s();  // seconds since this process started its recorder

  static constexpr uint64_t kNoRecord = ~uint64_t{0};  // an id no entry has

  // A new entry, queued (or already running: an operation run at once on the caller's
  // thread records one state change less), since `queued_s` (< 0: now). kNoRecord when
  // LOOM_FLIGHT_RECORDS is 0.
  uint64_t queued(const std::shared_ptr<const std::string>& comm, uint64_t seq,
                  const Fingerprint& fp, size_t bytes, bool running = false, int peer = -1,
                  bool send = false, double queued_s = -1);
  // A finished collective recorded in one step (the caller's fast path: an operation that
  // ends within ~100 ms is entered once it has, one lock instead of two; one that waits
  // longer is entered as running by its wait loop, with queued() and finished()).
  void record_done(const std::shared_ptr<const std::string>& comm, uint64_t seq,
                   const Fingerprint& fp, size_t bytes, double started_s, bool ok);
  void started(uint64_t id);
  // A receive's sequence number (and, from any source, its peer) once it is matched.
  void matched(uint64_t id, uint64_t seq, int peer);
  void finished(uint64_t id, bool ok);
  void waiting(uint64_t id, std::vector<int> world_ranks);

  std::vector<FlightEntry> last(size_t n) const;  // oldest first
  std::vector<FlightEntry> open() const;          // queued or running, oldest first
  // One line per entry: "#seq op on 'comm': state for 1.2 s, waiting for ranks 2".
  static std::string describe(const FlightEntry& e, double now);
  // The timeline's track (thread id) of each communicator that finished an operation while
  // tracing was on (loom/profile/trace.h), and of each direction and peer of its sends and
  // receives ("world send to 1").
  std::map<std::string, int> tracks() const;

 private:
  FlightRecorder();
  FlightEntry* find(uint64_t id);  // null once the ring dropped it
  FlightEntry& enter(const std::shared_ptr<const std::string>& comm, uint64_t seq,
                     const Fingerprint& fp, size_t bytes, int peer, bool send);
  void trace(const FlightEntry& e);

  mutable std::mutex mu_;
  size_t capacity_;
  std::vector<FlightEntry> ring_;  // entry `id` at id % capacity_, the last capacity_ kept
  uint64_t next_id_ = 0;
  std::map<std::string, int> tracks_;        // timeline track (thread id) of each
  std::map<std::string, double> track_end_;  // and when its last span ended
};

// Starts the process's watchdog once (later calls do nothing). `store` is a connection of
// its own to the job's namespace; `rank`/`size` the world's. It also posts this rank's
// heartbeat every second and watches the next ranks' (LOOM_HEARTBEAT_S).
void start_watchdog(std::unique_ptr<Store> store, int rank, int size);

// The watchdog saw the job's abort record (it looks every second): every operation checks
// this as it starts, so that ranks whose communicators never wait on a dead rank stop too.
bool job_abort_seen();
// The record was not this communicator's job's (a process that ran several jobs).
void forget_abort_seen();

}  // namespace loom::comm
