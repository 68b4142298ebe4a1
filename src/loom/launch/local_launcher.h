// Spawns the ranks of a job on this machine and watches them (the single-node part of
// `loom run`; also used by `loom bench --np N` and the multi-process tests).
//
// The launcher hosts the rendezvous store itself (LOOM_STORE_EXTERNAL=1), generates the
// job token, and gives each rank LOOM_RANK / LOOM_WORLD_SIZE / LOOM_LOCAL_RANK /
// LOOM_LOCAL_WORLD_SIZE / LOOM_STORE / LOOM_JOB_TOKEN. When any rank exits non-zero or by
// a signal, the others get SIGTERM, then SIGKILL after a grace period: a job never hangs
// on a dead rank.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace loom::launch {

struct RankExit {
  int rank = -1;
  int pid = 0;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;
  bool killed_by_launcher = false;
  std::string describe() const;
};

struct LaunchOptions {
  int nprocs = 1;
  std::vector<std::string> argv;           // program and arguments, same for every rank
  std::map<std::string, std::string> env;  // extra variables for every rank
  std::string store_host = "127.0.0.1";
  double grace_seconds = 5;    // between SIGTERM and SIGKILL on teardown
  double timeout_seconds = 0;  // 0: none; else the whole job is killed after it
  bool fail_fast = true;       // tear the job down when a rank fails (tests of the ranks' own
                               // failure detection turn this off)
  std::string log_dir;         // if set, rank r's stdout+stderr go to <log_dir>/rank<r>.log
  // Also set RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and (unless set) MASTER_ADDR /
  // MASTER_PORT, so `dist.init_process_group("loom")` (env://) works in the ranks.
  bool torch_env = false;
  bool prefix_output = false;  // else: each line of rank r's output is printed as "[rank r] ..."
  // When the pointed-to value becomes non-zero (a signal number, set by the caller's signal
  // handler), that signal is sent to every rank once and the job is let finish; ranks still
  // running after `interrupt_grace_seconds` are killed.
  const std::atomic<int>* forward_signal = nullptr;
  double interrupt_grace_seconds = 120;
  // A rank that exits with code 2 (bad input) stops the job only after this long, so the
  // other ranks can report the same error themselves.
  double input_error_grace_seconds = 3;
  // Part of a job across machines (`loom run --rdzv`): this machine's ranks are the global
  // ranks rank_offset .. rank_offset + nprocs - 1 of world_size, the job's store is
  // store_url (hosted by node 0's launcher) and token / job_id are the job's; torch's
  // MASTER_ADDR:MASTER_PORT is torch_master. Empty store_url: a job of this machine alone,
  // around a store and token of its own.
  int rank_offset = 0, world_size = 0;
  std::string store_url, token, job_id, torch_master;
  // When the pointed-to value becomes true the job is torn down at once (SIGTERM, SIGKILL
  // after grace_seconds): a machine of the job was lost (result.stopped).
  const std::atomic<bool>* stop = nullptr;
};

struct LaunchResult {
  std::vector<RankExit> ranks;
  int first_failure = -1;  // rank that failed first, or -1
  bool timed_out = false;
  int forwarded_signal = 0;  // the signal forwarded to the ranks, if any
  bool stopped = false;      // torn down through LaunchOptions::stop
  bool ok() const { return first_failure < 0 && !timed_out && !stopped; }
};

// Runs the job to completion. Throws UserError if the program cannot be started. A program
// name without a slash is looked up in PATH.
LaunchResult run_local(const LaunchOptions& opts);

// A port on `host` that is free now (bound, read back, closed): for a server a child starts.
int free_port(const std::string& host);

// Path of the running executable (/proc/self/exe), for re-executing ourselves.
std::string self_exe();

}  // namespace loom::launch
