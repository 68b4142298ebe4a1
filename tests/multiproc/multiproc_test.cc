// Ranks as real processes, started by the local launcher that `loom run` and `loom bench`
// use: collectives over shm, TCP and two virtual hosts; async and split; 64 MiB buffers;
// a rank killed with SIGKILL; a collective desync; a rank with the wrong job token.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/launch/local_launcher.h"

namespace loom::test {
namespace {

namespace fs = std::filesystem;

struct Job {
  launch::LaunchResult result;
  std::vector<std::string> logs;
  double seconds = 0;
};

Job run_worker(int n, std::vector<std::string> args, std::map<std::string, std::string> env = {},
               bool fail_fast = false) {
  std::string dir = fs::temp_directory_path() /
                    ("loom-mp-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
  fs::create_directories(dir);
  launch::LaunchOptions o;
  o.nprocs = n;
  o.argv = {LOOM_TEST_WORKER};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env = std::move(env);
  if (!o.env.count("LOOM_TIMEOUT_S")) o.env["LOOM_TIMEOUT_S"] = "60";
  o.log_dir = dir;
  o.fail_fast = fail_fast;
  o.timeout_seconds = 240;
  auto t0 = std::chrono::steady_clock::now();
  Job job;
  job.result = launch::run_local(o);
  job.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < n; ++r) {
    std::ifstream f(dir + "/rank" + std::to_string(r) + ".log");
    std::stringstream ss;
    ss << f.rdbuf();
    job.logs.push_back(ss.str());
  }
  fs::remove_all(dir);
  return job;
}

std::string all_logs(const Job& j) {
  std::string s;
  for (size_t r = 0; r < j.logs.size(); ++r)
    s += "--- rank " + std::to_string(r) + "\n" + j.logs[r];
  return s;
}

void expect_ok(const Job& j) {
  EXPECT_FALSE(j.result.timed_out) << all_logs(j);
  for (const auto& e : j.result.ranks)
    EXPECT_EQ(e.exit_code, 0) << e.describe() << "\n" << all_logs(j);
}

// Heap buffers of separate processes: the shared allreduce finds some buffer no peer can
// map and runs ring on every rank (none runs fused).
TEST(Processes, SweepOverSharedMemory) {
  for (int n : {2, 3, 4}) expect_ok(run_worker(n, {"sweep"}, {{"LOOM_TEST_EXPECT_FUSED", "0"}}));
}

// Single copy: every collective message (LOOM_SHM_SINGLE_COPY=1 byte and up) is read in
// place from the sender's buffer with process_vm_readv; the workers fail unless some were.
TEST(Processes, SweepReadInPlace) {
  const std::map<std::string, std::string> env{{"LOOM_SHM_SINGLE_COPY", "1"},
                                               {"LOOM_TEST_EXPECT_IN_PLACE", "1"}};
  for (int n : {2, 3, 4}) expect_ok(run_worker(n, {"sweep"}, env));
  expect_ok(run_worker(2, {"big"}, env));
  auto hier = env;
  hier["LOOM_TEST_HOSTS"] = "2";
  expect_ok(run_worker(4, {"sweep"}, hier));
}

// Shared buffers: the sweep's buffers all lie in one alloc_shared buffer; every message of
// a byte and up between ranks of a (virtual) host is read through the receiver's mapping,
// and the shared allreduce runs fused through writable mappings of the peers' buffers (in
// pieces of 64 bytes, so that a block takes many).
TEST(Processes, SweepFromSharedBuffers) {
  std::map<std::string, std::string> env{{"LOOM_SHM_SHARED_MIN", "1"},
                                         {"LOOM_SHM_SHARED_MIN_ALLREDUCE", "1"},
                                         {"LOOM_TEST_EXPECT_IN_PLACE", "1"},
                                         {"LOOM_TEST_EXPECT_FUSED", "1"},
                                         {"LOOM_SHARED_ALLREDUCE_PIECE", "64"}};
  for (int n : {2, 3, 4}) expect_ok(run_worker(n, {"sweep_shared"}, env));
  env.erase("LOOM_TEST_EXPECT_FUSED");  // two virtual hosts: no shared allreduce
  env["LOOM_TEST_HOSTS"] = "2";
  expect_ok(run_worker(4, {"sweep_shared"}, env));  // hosts {0,1} and {2,3}
}

// allgather_shared: one buffer per (virtual) machine that its processes map, round after
// round; over shm, TCP between the processes of one machine, and two virtual hosts.
TEST(Processes, AllgatherShared) {
  for (int n : {2, 3, 4}) expect_ok(run_worker(n, {"gather_shared"}));
  expect_ok(run_worker(2, {"gather_shared"}, {{"LOOM_TRANSPORT", "tcp"}}));
  expect_ok(run_worker(4, {"gather_shared"}, {{"LOOM_TEST_HOSTS", "2"}}));
  expect_ok(run_worker(5, {"gather_shared"}, {{"LOOM_TEST_HOSTS", "2"}}));
}

TEST(Processes, SweepOverTcp) {
  for (int n : {2, 3}) expect_ok(run_worker(n, {"sweep"}, {{"LOOM_TRANSPORT", "tcp"}}));
}

TEST(Processes, SweepOverTwoVirtualHosts) {
  // Ranks {0,1} and {2,3} (and {4}) on two/three virtual hosts: shm inside, TCP across, hier.
  for (int n : {4, 5}) expect_ok(run_worker(n, {"sweep"}, {{"LOOM_TEST_HOSTS", "2"}}));
}

TEST(Processes, Big64MiB) {
  expect_ok(run_worker(2, {"big"}));
  expect_ok(run_worker(3, {"big"}, {{"LOOM_TRANSPORT", "tcp"}}));
}

TEST(Processes, AsyncAndSplit) {
  expect_ok(run_worker(4, {"async"}));
  expect_ok(run_worker(5, {"async"}, {{"LOOM_TEST_HOSTS", "2"}}));
}

// The soak's short form (the long one: docs/reliability.md): 4 ranks, 3000 mixed
// collectives on the world and sub-groups, sync and async, every result checked; RSS,
// descriptors and shared-memory segments flat after warm-up. Over shm (auto) and TCP.
TEST(Soak, MixedCollectivesKeepMemoryAndDescriptorsFlat) {
  for (const char* transport : {"auto", "tcp"}) {  // auto: shared memory on one machine
    Job j = run_worker(4, {"soak", "3000", fs::temp_directory_path().string()},
                       {{"LOOM_TRANSPORT", transport}});
    expect_ok(j);
    for (const auto& log : j.logs)
      EXPECT_NE(log.find("3000 operations, 0 wrong"), std::string::npos);
  }
}

// ... and the soak's detector catches a leak: one descriptor, or 1 MiB of memory, every 50
// operations (what a leaked socket or an unreleased buffer per call would look like).
TEST(Soak, ALeakIsCaught) {
  for (const char* kind : {"fd", "rss"}) {
    Job j = run_worker(4, {"soak", "3000", fs::temp_directory_path().string()},
                       {{"LOOM_TEST_SOAK_LEAK", kind}});
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(j.result.ranks[r].exit_code, 1) << kind << "\n" << all_logs(j);
      EXPECT_NE(j.logs[r].find(std::string(kind) == "fd" ? "LEAK: descriptors" : "GROWTH: RSS"),
                std::string::npos)
          << j.logs[r];
    }
  }
}

// A rank dies with SIGKILL mid-job: every other rank fails well within the deadline
// (60 s here) with an error naming the dead rank and the operation.
void kill_test(int n, int victim, std::map<std::string, std::string> env,
               const char* scenario = "kill", const char* op = "allreduce") {
  Job j = run_worker(n, {scenario, std::to_string(victim)}, env);
  EXPECT_LT(j.seconds, 20) << all_logs(j);
  EXPECT_EQ(j.result.ranks[victim].signal, SIGKILL);
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    EXPECT_EQ(j.result.ranks[r].exit_code, 3) << all_logs(j);
    EXPECT_NE(j.logs[r].find("PEER ERROR"), std::string::npos) << j.logs[r];
    EXPECT_NE(j.logs[r].find("rank " + std::to_string(victim)), std::string::npos) << j.logs[r];
    EXPECT_NE(j.logs[r].find(op), std::string::npos) << j.logs[r];
  }
}

TEST(Failures, KilledRankOverSharedMemory) {
  kill_test(4, 2, {});
}
// ... also while the others read its buffer in place (single copy): reported, never read
// from memory that is gone.
TEST(Failures, KilledRankWhileReadInPlace) {
  kill_test(3, 1, {{"LOOM_SHM_SINGLE_COPY", "1"}}, "kill_in_place", "allgather");
}
// ... or while the ranks of its machine gather into a machine buffer: the buffer's owner
// (rank 0) or another rank; the survivors keep their mapping and report the dead rank.
TEST(Failures, KilledRankDuringSharedGather) {
  kill_test(3, 0, {}, "kill_shared", "allgather_shared");
  kill_test(3, 2, {}, "kill_shared", "allgather_shared");
}
TEST(Failures, KilledRankOverTcp) {
  kill_test(3, 1, {{"LOOM_TRANSPORT", "tcp"}});
}
TEST(Failures, KilledRankAcrossVirtualHosts) {
  kill_test(4, 3, {{"LOOM_TEST_HOSTS", "2"}});
}

// A rank stops (SIGSTOP) while the others run operations that never wait on it (a
// communicator without it): its heartbeat stands still, and within LOOM_HEARTBEAT_S (2 s
// here) plus the 1 s of a watch the job fails naming it (the first survivor to fail names
// it; the launcher then stops the rest, which may not have printed it yet).
TEST(Failures, SilentRankIsNamedWhileNothingWaitsOnIt) {
  Job j = run_worker(3, {"silent", "2"}, {{"LOOM_HEARTBEAT_S", "2"}}, true);
  EXPECT_LT(j.seconds, 15) << all_logs(j);
  int named = 0;
  for (int r = 0; r < 2; ++r) {
    const auto& rank = j.result.ranks[r];
    if (rank.signal == 0) {
      EXPECT_EQ(rank.exit_code, 3) << all_logs(j);
      named += j.logs[r].find("the job was aborted: rank 2 has not been heard from for") !=
               std::string::npos;
    }
  }
  EXPECT_GE(named, 1) << all_logs(j);
}

// Rank 0 is killed during set-up, after creating a segment that no peer has opened (the
// opener unlinks a name, so a kill after set-up leaves nothing anyway): when the job ends,
// no name of its ranks is left in /dev/shm.
TEST(Failures, NoSharedMemoryLeftAfterKill) {
  Job j = run_worker(3, {"sweep"}, {{"LOOM_TEST_KILL_IN_SETUP", "0"}}, true);
  EXPECT_EQ(j.result.ranks[0].signal, SIGKILL) << all_logs(j);
  EXPECT_LT(j.seconds, 20) << all_logs(j);
  for (const auto& r : j.result.ranks) {
    const std::string prefix = "loom." + std::to_string(r.pid) + ".";
    for (auto& e : fs::directory_iterator("/dev/shm"))
      EXPECT_NE(e.path().filename().string().rfind(prefix, 0), 0u)
          << e.path() << " of rank " << r.rank << " outlived the job";
  }
}

TEST(Failures, DesyncFailsEveryRankNamingBothFingerprints) {
  Job j = run_worker(3, {"desync"});
  EXPECT_LT(j.seconds, 20) << all_logs(j);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(j.result.ranks[r].exit_code, 3) << all_logs(j);
    const std::string& log = j.logs[r];
    EXPECT_NE(log.find("desync"), std::string::npos) << log;
    EXPECT_NE(log.find("sequence number"), std::string::npos) << log;
    EXPECT_NE(log.find("count=999"), std::string::npos) << log;
    EXPECT_NE(log.find("count=1000"), std::string::npos) << log;
  }
}

// A process that does not know the job token is refused before any data flows (until now
// shown with thread ranks only); the others fail at their deadline instead of waiting for
// it forever, and every process exits.
TEST(Failures, WrongTokenProcessIsRefused) {
  Job j = run_worker(3, {"sweep"}, {{"LOOM_TEST_WRONG_TOKEN_RANK", "2"}, {"LOOM_TIMEOUT_S", "5"}});
  EXPECT_FALSE(j.result.timed_out) << all_logs(j);
  EXPECT_LT(j.seconds, 60) << all_logs(j);
  EXPECT_NE(j.result.ranks[2].exit_code, 0) << all_logs(j);
  EXPECT_NE(j.logs[2].find("token"), std::string::npos) << all_logs(j);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(j.result.ranks[r].exit_code, 0) << all_logs(j);
    EXPECT_NE(j.logs[r].find("ERROR"), std::string::npos) << all_logs(j);
  }
}

}  // namespace
}  // namespace loom::test
