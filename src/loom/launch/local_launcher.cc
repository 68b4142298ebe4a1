#include "loom/launch/local_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string_view>
#include <thread>

#include "loom/comm/net/socket.h"
#include "loom/comm/store/tcp_store.h"
#include "loom/comm/transport/shm/segment.h"
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

namespace {

struct OutputStream {
  int rank;
  int fd;  // -1 once closed
  FILE* to;
  std::string partial;  // a line not yet ended
};

void emit(OutputStream& s, std::string_view line) {
  std::string out = "[rank " + std::to_string(s.rank) + "] ";
  out.append(line);
  out += '\n';
  std::fwrite(out.data(), 1, out.size(), s.to);
  std::fflush(s.to);
}

// Waits up to timeout_ms for output, prints each complete line with its rank; returns
// whether any stream is still open.
bool pump_output(std::vector<OutputStream>& streams, int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<OutputStream*> of;
  for (auto& s : streams)
    if (s.fd >= 0) fds.push_back({s.fd, POLLIN, 0}), of.push_back(&s);
  if (fds.empty()) {
    if (timeout_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    return false;
  }
  if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return true;
  char buf[65536];
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    OutputStream& s = *of[i];
    const ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n <= 0) {
      if (!s.partial.empty()) emit(s, s.partial), s.partial.clear();
      ::close(s.fd);
      s.fd = -1;
      continue;
    }
    s.partial.append(buf, static_cast<size_t>(n));
    size_t start = 0, nl;
    while ((nl = s.partial.find('\n', start)) != std::string::npos) {
      emit(s, std::string_view(s.partial).substr(start, nl - start));
      start = nl + 1;
    }
    s.partial.erase(0, start);
  }
  return true;
}

}  // namespace

int free_port(const std::string& host) {
  comm::net::Fd fd = comm::net::listen_on(host, 0);
  return comm::net::local_address(fd.get()).port;  // closed on return, free until reused
}

LaunchResult run_local(const LaunchOptions& opts) {
  std::string token = opts.token, url = opts.store_url, job_id = opts.job_id;
  std::optional<comm::TcpStoreServer> store;
  if (url.empty()) {
    token = generate_token();
    store.emplace(opts.store_host, 0, token);
    url = "tcp://" + store->address().str();
    job_id = "local-" + std::to_string(::getpid()) + "-" + token.substr(0, 8);
  }
  const int world = opts.world_size > 0 ? opts.world_size : opts.nprocs;
  // torch's rank 0 hosts its own store: give it a port that is free now.
  std::string torch_master = opts.torch_master;
  if (opts.torch_env && torch_master.empty())
    torch_master = opts.store_host + ":" + std::to_string(free_port(opts.store_host));
  std::vector<pid_t> pids(opts.nprocs, 0);
  std::vector<OutputStream> streams;  // prefix_output: the read ends of the ranks' pipes
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
    const int rank = opts.rank_offset + r;
    vars["LOOM_RANK"] = std::to_string(rank);
    vars["LOOM_WORLD_SIZE"] = std::to_string(world);
    vars["LOOM_LOCAL_RANK"] = std::to_string(r);
    vars["LOOM_LOCAL_WORLD_SIZE"] = std::to_string(opts.nprocs);
    vars["LOOM_STORE"] = url;
    vars["LOOM_STORE_EXTERNAL"] = "1";
    vars["LOOM_JOB_TOKEN"] = token;
    vars["LOOM_JOB_ID"] = job_id;
    vars["LOOM_LAUNCHER_PID"] = std::to_string(::getpid());  // ranks die with it (bootstrap.cc)
    if (opts.torch_env) {  // what torch.distributed's env:// reads (torchrun's names)
      vars["RANK"] = std::to_string(rank);
      vars["LOCAL_RANK"] = std::to_string(r);
      vars["WORLD_SIZE"] = std::to_string(world);
      vars["LOCAL_WORLD_SIZE"] = std::to_string(opts.nprocs);
      const size_t colon = torch_master.rfind(':');
      vars.emplace("MASTER_ADDR", torch_master.substr(0, colon));
      vars.emplace("MASTER_PORT", torch_master.substr(colon + 1));
    }
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
    std::string log_path = opts.log_dir + "/rank" + std::to_string(rank) + ".log";
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (!opts.log_dir.empty()) {
      posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
      posix_spawn_file_actions_adddup2(&actions, 1, 2);
    } else if (opts.prefix_output) {
      if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0)
        throw Error(std::string("pipe: ") + std::strerror(errno));
      posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
      posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
    }
    int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (out_pipe[0] >= 0) {
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
      streams.push_back({rank, out_pipe[0], stdout, {}});
      streams.push_back({rank, err_pipe[0], stderr, {}});
    }
    if (rc != 0) {
      for (int q = 0; q < r; ++q) ::kill(pids[q], SIGKILL);
      for (int q = 0; q < r; ++q) ::waitpid(pids[q], nullptr, 0);
      throw UserError("cannot start '" + opts.argv[0] + "': " + std::strerror(rc),
                      "check the program path");
    }
    pids[r] = pid;
    result.ranks[r].rank = rank;
    result.ranks[r].pid = pid;
  }

  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  int alive = opts.nprocs;
  bool tearing_down = false;
  Clock::time_point term_sent;
  std::vector<bool> done(opts.nprocs, false);
  // When to stop the job: the earliest deadline any event asked for.
  std::optional<Clock::time_point> teardown_at;
  auto teardown_in = [&](double seconds) {
    const auto at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(seconds));
    if (!teardown_at || at < *teardown_at) teardown_at = at;
  };
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
          // Bad input (exit 2) is found by every rank on its own before any connects, and a
          // diverged step (exit 4) by every rank after it: let the others print their error
          // and exit before stopping them.
          const bool every_rank = e.exit_code == kExitBadInput || e.exit_code == kExitDiverged;
          if (opts.fail_fast) teardown_in(every_rank ? opts.input_error_grace_seconds : 0);
        }
      }
      continue;
    }
    if (teardown_at && !tearing_down && Clock::now() >= *teardown_at) teardown();
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
    if (opts.forward_signal && !result.forwarded_signal && !tearing_down) {
      if (int sig = opts.forward_signal->load()) {
        result.forwarded_signal = sig;
        teardown_in(opts.interrupt_grace_seconds);
        for (int q = 0; q < opts.nprocs; ++q)
          if (!done[q]) ::kill(pids[q], sig);
      }
    }
    if (opts.stop && opts.stop->load() && !tearing_down) {
      result.stopped = true;
      teardown();
    }
    pump_output(streams, 5);
  }
  while (pump_output(streams, 50)) {  // what the ranks wrote last
  }
  // A rank killed while its communicator was being set up can leave a segment name that no
  // peer opened (comm/transport/shm/segment.h); every rank is gone now: remove such names.
  if (!result.ok()) comm::shm::sweep_stale();
  return result;
}

}  // namespace loom::launch
