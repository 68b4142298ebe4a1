#include "loom/launch/local_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "loom/comm/store/tcp_store.h"
#include "loom/core/error.h"
#include "loom/core/hmac.h"

extern char** environ;

namespace loom::launch {

std::string RankExit::describe() const {
  std::string s = "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ")";
  if (signal)
    return s + " was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return s + " exited with code " + std::to_string(exit_code);
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot read /proc/self/exe");
  buf[n] = '\0';
  return buf;
}

LaunchResult run_local(const LaunchOptions& opts) {
  std::string token = generate_token();
  comm::TcpStoreServer store(opts.store_host, 0, token);
  std::string url = "tcp://" + store.address().str();
  std::string job_id = "local-" + std::to_string(::getpid()) + "-" + token.substr(0, 8);

  std::vector<pid_t> pids(opts.nprocs, 0);
  LaunchResult result;
  result.ranks.resize(opts.nprocs);
  for (int r = 0; r < opts.nprocs; ++r) {
    std::map<std::string, std::string> vars;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      auto eq = kv.find('=');
      if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const auto& [k, v] : opts.env) vars[k] = v;
    vars["LOOM_RANK"] = std::to_string(r);
    vars["LOOM_WORLD_SIZE"] = std::to_string(opts.nprocs);
    vars["LOOM_LOCAL_RANK"] = std::to_string(r);
    vars["LOOM_LOCAL_WORLD_SIZE"] = std::to_string(opts.nprocs);
    vars["LOOM_STORE"] = url;
    vars["LOOM_STORE_EXTERNAL"] = "1";
    vars["LOOM_JOB_TOKEN"] = token;
    vars["LOOM_JOB_ID"] = job_id;
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : vars) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp, argv;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = opts.argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    pid_t pid;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    std::string log_path = opts.log_dir + "/rank" + std::to_string(r) + ".log";
    if (!opts.log_dir.empty()) {
      posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
      posix_spawn_file_actions_adddup2(&actions, 1, 2);
    }
    int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      for (int q = 0; q < r; ++q) ::kill(pids[q], SIGKILL);
      for (int q = 0; q < r; ++q) ::waitpid(pids[q], nullptr, 0);
      throw UserError("cannot start '" + opts.argv[0] + "': " + std::strerror(rc),
                      "check the program path");
    }
    pids[r] = pid;
    result.ranks[r].rank = r;
    result.ranks[r].pid = pid;
  }

  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  int alive = opts.nprocs;
  bool tearing_down = false;
  Clock::time_point term_sent;
  std::vector<bool> done(opts.nprocs, false);
  auto teardown = [&] {
    if (tearing_down) return;
    tearing_down = true;
    term_sent = Clock::now();
    for (int q = 0; q < opts.nprocs; ++q)
      if (!done[q]) {
        ::kill(pids[q], SIGTERM);
        result.ranks[q].killed_by_launcher = true;
      }
  };
  while (alive > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int q = 0; q < opts.nprocs; ++q) {
        if (pids[q] != pid || done[q]) continue;
        done[q] = true;
        --alive;
        RankExit& e = result.ranks[q];
        if (WIFSIGNALED(status))
          e.signal = WTERMSIG(status);
        else
          e.exit_code = WEXITSTATUS(status);
        bool failed = e.signal != 0 || e.exit_code != 0;
        if (failed && !e.killed_by_launcher && result.first_failure < 0) {
          result.first_failure = q;
          if (opts.fail_fast) teardown();
        }
      }
      continue;
    }
    if (opts.timeout_seconds > 0 && !tearing_down &&
        std::chrono::duration<double>(Clock::now() - start).count() > opts.timeout_seconds) {
      result.timed_out = true;
      teardown();
    }
    if (tearing_down &&
        std::chrono::duration<double>(Clock::now() - term_sent).count() > opts.grace_seconds) {
      for (int q = 0; q < opts.nprocs; ++q)
        if (!done[q]) ::kill(pids[q], SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return result;
}

}  // namespace loom::launch
